/* notifier — a thread that runs a callback on items handed to it, off the caller's thread.
 *
 * The engine hands each step's token wake-ups to it: waking a client blocked on its channel is
 * a system call per client, time the engine thread would spend between two steps while the
 * device waits. With a notifier the engine thread queues the channels (no system call), kicks
 * the notifier once per step and goes on to the next step.
 * Items run in the order they were posted. */
#ifndef DS_NOTIFIER_H
#define DS_NOTIFIER_H

typedef struct notifier notifier;

/* A notifier whose thread runs fire(item) for each posted item, holding up to cap items between
 * two kicks (allocated here: posting never allocates); NULL when out of memory or the thread
 * cannot start. */
notifier *notifier_start(void (*fire)(void *item), int cap);
/* Queues an item (any thread); it runs after the next notifier_kick. Returns 0, or -1 when cap
 * items are already queued (the caller fires it itself). */
int notifier_post(notifier *n, void *item);
/* Wakes the thread for what was posted since the last kick. */
void notifier_kick(notifier *n);
/* Runs what is still queued, stops the thread and frees the notifier (NULL: nothing). */
void notifier_stop(notifier *n);

#endif
