/* pc_events — the prefix cache's side of the KV-cache events: which named blocks and which
 * checkpoints each tier holds, and the reports (kv_events.h) when that changes.
 *
 * A committed checkpoint at depth d holds the depth / 16 full blocks of its path in one medium
 * (GPU while its pages are on the device, CPU once they moved to the host tier) and its
 * recurrent state in one medium (slab or host copy). Checkpoints on one path share blocks, so
 * the table counts holders per (block name, medium):
 *
 *   count 0 -> 1   BlockStored      (consecutive new blocks of one path in one event)
 *   count 1 -> 0   BlockRemoved
 *   state          DeltaServeStateStored / ...Removed, one per checkpoint and medium
 *   clear          AllBlocksCleared, then BlockStored again for the pinned survivors
 *
 * Only COMMITTED records count (reservations and captures in flight are not restorable, a
 * zombie has left its node). The cache calls the hooks at every change of that:
 * pc_events_enter when a record becomes committed, pc_events_leave before it stops being
 * committed, and pc_events_kv / pc_events_state (+1 new medium, then -1 old medium) when its
 * pages or its state move between the device and the host tier. The disk tier reports its
 * own entries (a checkpoint's pages and state in one file) through pc_events_disk; a record
 * that lives only on disk holds nothing in GPU / CPU (pc_events_kv_medium is -1).
 * All hooks are no-ops while the cache has no events. Owner: the engine thread. */
#ifndef DS_PC_EVENTS_H
#define DS_PC_EVENTS_H
#include <stddef.h>
#include <stdint.h>

#include "cache/kv_events.h"
#include "cache/prefix_cache_int.h"

typedef struct pc_events pc_events;

/* The table over a publisher (borrowed: it outlives the cache). Returns 0 or -1 (out of
 * memory, start-up only). */
int pc_events_init(pc_events **out, kv_events *ev);
void pc_events_free(pc_events *pe);

/* The medium of a committed record's pages / state, -1 when it has none. */
int pc_events_kv_medium(const pc_rec *r);
int pc_events_state_medium(const pc_rec *r);

/* Record i counts from now on (its blocks and state in their current media). */
void pc_events_enter(prefix_cache *pc, int i);
/* Record i stops counting; call while it is still bound to its node. */
void pc_events_leave(prefix_cache *pc, int i);
/* Record i's blocks gain (+1) or lose (-1) a holder in medium m. */
void pc_events_kv(prefix_cache *pc, int i, kv_events_medium m, int delta);
/* Record i's state enters (+1) or leaves (-1) medium m. */
void pc_events_state(prefix_cache *pc, int i, kv_events_medium m, int delta);
/* The disk tier's listener (disk_tier.h's disk_tier_listener, ctx: the prefix cache): an
 * entry's blocks and state enter (stored 1) or leave (0) the DISK medium. Set it with
 * disk_tier_set_listener(dt, pc_events_disk, pc) once the cache has its events; that call
 * replays the entries found at open, so a restarted server announces its disk cache. */
void pc_events_disk(void *ctx, int stored, const char *salt, const int32_t *tokens, int depth);
/* Around prefix_cache_clear: the per-record removals are not reported; the end reports
 * AllBlocksCleared and then every checkpoint still committed (pinned ones survive a clear). */
void pc_events_clear_begin(prefix_cache *pc);
void pc_events_clear_end(prefix_cache *pc);

/* The (block, medium) pairs held, and the holders of one (tests). */
size_t pc_events_held(const prefix_cache *pc);
int pc_events_holders(const prefix_cache *pc, uint64_t h, int medium);

/* Verifies that the table equals what the committed records hold in GPU / CPU and the disk
 * tier's files in DISK. Returns 0, or -1 with one line in err. Out of memory is reported as a
 * failure. */
int pc_events_check(const prefix_cache *pc, char *err, size_t errlen);

#endif
