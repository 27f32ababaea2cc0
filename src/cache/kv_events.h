/* kv_events — vLLM's KV-cache events over ZeroMQ, for cache-aware routers.
 *
 * The prefix cache reports blocks (16-token KV pages named by block_hash.h) and recurrent-state
 * checkpoints entering and leaving a tier; this module encodes each report at once (msgpack,
 * vLLM's array_like tagged structs) into a queue under its own mutex, and a publisher thread
 * does every socket operation, so that the engine never waits on the network:
 *
 *   engine thread                      publisher thread
 *   kv_events_block_stored ...  --->   queue --> batches [ts, [event...], 0]
 *   (encode, append, wake)             PUB:    [topic, seq (u64 BE), batch]
 *                                      ring:   the last buffer_steps (seq, batch)
 *                                      ROUTER: [id, "", start (u64 BE)] ->
 *                                              [id, "", seq, batch]... [id, "", -1, ""]
 *
 * One batch holds the events the thread finds queued when it wakes (vLLM: one per scheduler
 * step); state events (DeltaServeStateStored / ...Removed) go in batches of their own, so that a
 * strict vLLM decoder that refuses an unknown tag loses no block event. When more than
 * max_queue_size events wait, the queue is dropped and replaced by one AllBlocksCleared: a
 * router then under-estimates this replica, never over-estimates it. docs/kv-events.md has the
 * wire format. */
#ifndef DS_KV_EVENTS_H
#define DS_KV_EVENTS_H
#include <stddef.h>
#include <stdint.h>

/* --kv-events-config, vLLM's KVEventsConfig keys. */
typedef struct kv_events_config {
  int enable;                /* enable_kv_cache_events */
  int publisher_zmq;         /* publisher: "zmq" (1) or "null" (0: nothing is published) */
  char endpoint[256];        /* PUB address; bound when it has '*', '::', ipc:// or inproc://,
                                else connected (vLLM's rule) */
  char replay_endpoint[256]; /* ROUTER address ("": no replay socket) */
  int buffer_steps;          /* batches kept for replay */
  int hwm;                   /* the PUB socket's send high-water mark (messages) */
  int max_queue_size;        /* events waiting for the publisher thread */
  char topic[256];           /* first frame of every message */
} kv_events_config;

/* Fills vLLM's defaults: disabled, endpoint port 5557 on every interface, no replay, buffer_steps
 * 10000, hwm 100000, max_queue_size 100000, topic "". */
void kv_events_config_default(kv_events_config *c);
/* Parses the JSON object of --kv-events-config into c (defaults first). An unknown key, a
 * wrong type, a publisher other than "zmq" / "null" or a value out of range is refused.
 * Returns 0, or -1 with one line in err. */
int kv_events_config_parse(const char *json, kv_events_config *c, char *err, size_t errlen);

/* Where a block or a checkpoint lives: vLLM's medium strings "GPU" (the device tier, also on
 * the CPU backend), "CPU" (the host tier), "DISK". */
typedef enum {
  KV_EVENTS_MEDIUM_GPU = 0,
  KV_EVENTS_MEDIUM_CPU = 1,
  KV_EVENTS_MEDIUM_DISK = 2
} kv_events_medium;
#define KV_EVENTS_N_MEDIUM 3
const char *kv_events_medium_name(kv_events_medium m);

typedef struct kv_events kv_events;

/* Opens the sockets and starts the publisher thread. Returns 0, or -1 with one line in err
 * (a bad endpoint, an address in use; start-up only). The config is copied. */
int kv_events_init(kv_events **out, const kv_events_config *c, char *err, size_t errlen);
/* Publishes what is still queued, stops the thread, closes the sockets (linger 1 s) and
 * frees. NULL is a no-op. */
void kv_events_free(kv_events *ev);

/* The reports; each is encoded and queued at once and never blocks on the network. On out of
 * memory the queue is replaced by an AllBlocksCleared (as on overflow). ev may be NULL (no-op).
 *
 * BlockStored: n blocks named hashes[0..n) that follow the block named parent (has_parent 0:
 * the first block of a prompt), tokens[16 * n] their token ids; salt (NULL: none) is sent as
 * the first block's extra key when has_parent is 0. */
void kv_events_block_stored(kv_events *ev, const uint64_t *hashes, int n, uint64_t parent,
                            int has_parent, const int32_t *tokens, const char *salt,
                            kv_events_medium m);
void kv_events_block_removed(kv_events *ev, const uint64_t *hashes, int n, kv_events_medium m);
void kv_events_all_cleared(kv_events *ev);
/* A recurrent-state checkpoint after `position` tokens of the prefix named prefix_hash
 * (block_hash of the tokens after the last full block chained to it, or the last full block's
 * name when position is a multiple of 16), in salt's namespace (NULL: shared). */
void kv_events_state_stored(kv_events *ev, uint64_t prefix_hash, int position, const char *salt,
                            kv_events_medium m);
void kv_events_state_removed(kv_events *ev, uint64_t prefix_hash, int position, const char *salt,
                             kv_events_medium m);

typedef struct kv_events_stats {
  long long events, batches; /* events queued to be published (not the dropped); batches */
  long long dropped;         /* events dropped by an overflow or an out of memory */
  long long replays;         /* replay requests served */
} kv_events_stats;
void kv_events_get_stats(kv_events *ev, kv_events_stats *s);

#endif
