/* disk_tier — prefix-cache checkpoints in files, below the host tier, kept across restarts.
 *
 * One file per checkpoint, named by a 64-bit hash of its key (salt, depth, token ids):
 *
 *   DIR/lock                   flock'ed for the life of the process (a second process on DIR
 *                              is refused at start with one line: it never shares)
 *   DIR/<16 hex>.ckpt          a checkpoint
 *   DIR/<16 hex>.ckpt.tmp      a write in progress (deleted at start: a crash mid-write)
 *
 *   file = [ header 96 B | salt | tokens (depth x i32) | pad to 8 | payload | footer 16 B ]
 *   header  magic "DSCKPT01", format version, the model identity (disk_tier_identity mixed
 *           with the slot and page sizes), slot_bytes, page_bytes, has_slot, n_pages, depth,
 *           salt length, payload bytes, the key hash, and a hash over header + salt + tokens
 *   payload [ slab image (slot_bytes) | page 0 | ... | page n-1 ]  (the host tier's layout)
 *   footer  a hash over the payload, magic "DSCKEND\0"
 *
 * At open the directory is scanned: a file whose header, identity, version, sizes or length
 * do not match is deleted and counted (files_dropped), so a directory belongs to one model;
 * the rest become entries (key -> file), least recently used by their mtime. A payload's hash
 * is checked when it is read (disk_tier_read), before anything reaches the device: a corrupt
 * file is never restored (the read fails, the caller drops the entry, the file goes).
 *
 * Writes never block the caller: disk_tier_put_begin/commit build the file image in memory
 * and queue it to the writer thread, which writes DIR/x.ckpt.tmp, fsyncs it, renames it to
 * DIR/x.ckpt and fsyncs DIR (a crash leaves the old state or the new one, never half a
 * file). Deletes (disk_tier_drop) and LRU touches go through the same FIFO queue, so they
 * land after the write they follow. Until its write is done an entry is read from the image
 * in memory. A reader thread reads a file ahead of its restore and checks its payload hash
 * (disk_tier_prefetch: the engine asks again on a later step, never waiting); disk_tier_read
 * then only copies it to the device (and reads the file itself when nothing was read ahead).
 *
 * Budget: the bytes of every entry (written or queued) never exceed the budget; a put that
 * does not fit is refused (the prefix cache makes room by dropping its least recently used
 * disk checkpoints, disk_tier_oldest order).
 *
 * Owner: one thread (the engine's) calls everything but disk_tier_get_stats (any thread).
 * Entries are small integer handles >= 0; the prefix cache owns each entry it puts or finds
 * at open. */
#ifndef DS_DISK_TIER_H
#define DS_DISK_TIER_H
#include <stddef.h>
#include <stdint.h>

#include "cache/host_tier.h"

/* The file format's version: a file of another version is dropped at open. */
#define DISK_TIER_FORMAT 1

typedef struct disk_tier disk_tier;

typedef struct disk_tier_opts {
  const char *dir;   /* created (one level) when missing */
  size_t budget;     /* bytes of files, > 0 */
  uint64_t model_id; /* disk_tier_identity of the model and backend */
  size_t slot_bytes; /* one slab image */
  size_t page_bytes; /* one page image */
  host_tier_ops ops; /* how images reach the device (NULL members: nothing is copied) */
} disk_tier_opts;

/* Opens DIR: takes the lock, deletes temporary files and files that do not belong (counted),
 * indexes the rest and starts the writer thread. Returns 0, or -1 with one line in err (DIR
 * cannot be created or read, another process holds the lock, out of memory). */
int disk_tier_open(disk_tier **out, const disk_tier_opts *o, char *err, size_t errlen);
/* Finishes the queued writes, stops the writer, releases the lock and frees everything.
 * Files stay. NULL is a no-op. */
void disk_tier_close(disk_tier *dt);
/* Waits until every queued write, delete and touch is done (tests, shutdown). */
void disk_tier_flush(disk_tier *dt);
/* Waits until a put of `bytes` is not refused for the images waiting for the writer (1 GiB
 * of them at most; shutdown, where waiting is fine). */
void disk_tier_wait_room(disk_tier *dt, size_t bytes);

size_t disk_tier_budget(const disk_tier *dt);
size_t disk_tier_bytes(const disk_tier *dt);
int disk_tier_count(const disk_tier *dt);
/* Bytes of the file of a checkpoint of this shape. */
size_t disk_tier_file_size(const disk_tier *dt, size_t salt_len, int depth, int has_slot,
                           int n_pages);

/* A write in two halves: begin reserves the budget and returns where the slab image (NULL
 * when !has_slot) and the n_pages page images go; the caller fills them, then commit writes
 * the header and queues the image (the writer hashes the payload) (the entry is readable at once),
 * or abort forgets it. Returns 0 with *entry, or -1 when it does not fit the budget, a live entry
 * has the same key hash, or out of memory (fault site "disk_tier_alloc"), or while 1 GiB of images
 * already wait for the writer (counted in write_skips: a spill then drops the checkpoint as without
 * a disk tier). */
int disk_tier_put_begin(disk_tier *dt, const char *salt, const int32_t *tokens, int depth,
                        int has_slot, int n_pages, int *entry, void **slab, void **pages);
void disk_tier_put_commit(disk_tier *dt, int entry);
void disk_tier_put_abort(disk_tier *dt, int entry);

/* 1 when disk_tier_read of the entry will not touch the disk (its image is queued or was read
 * ahead, or the read ahead failed: the read then fails at once); else 0, and a read ahead by
 * the reader thread is under way (or waits for a turn: at most 2 files are held read ahead).
 * Call it again on a later step. */
int disk_tier_prefetch(disk_tier *dt, int entry);
/* Reads the entry (the file, or its image while queued), checks the header against the entry
 * and the payload hash, then writes the slab image into slot (when slot >= 0 and the entry
 * has one) and the page images into pages[0, n_pages) (n_pages = the entry's) through the
 * ops. Returns 0, or -1 (fault site "disk_tier_read"; missing, short or corrupt file: counted
 * as a read failure, nothing was written to the device; a copy failure: the device is
 * partly written). The caller drops the entry after a failure. */
int disk_tier_read(disk_tier *dt, int entry, int slot, const int32_t *pages, int n_pages);
/* Forgets the entry and deletes its file (queued). */
void disk_tier_drop(disk_tier *dt, int entry);
/* Marks the entry most recently used (its mtime too, queued, so a restart keeps the order). */
void disk_tier_touch(disk_tier *dt, int entry);
/* The least recently used live entry, or -1 when empty; an entry's use tick. */
int disk_tier_oldest(const disk_tier *dt);
uint64_t disk_tier_tick(const disk_tier *dt, int entry);

/* Entry facts (0 / NULL when not live). Handles are < disk_tier_handles(dt). */
int disk_tier_handles(const disk_tier *dt);
int disk_tier_live(const disk_tier *dt, int entry);
int disk_tier_entry_depth(const disk_tier *dt, int entry);
int disk_tier_entry_pages(const disk_tier *dt, int entry);
int disk_tier_entry_has_slot(const disk_tier *dt, int entry);
const char *disk_tier_entry_salt(const disk_tier *dt, int entry);
const int32_t *disk_tier_entry_tokens(const disk_tier *dt, int entry); /* [depth] */

/* Listener for KV-cache events of medium "DISK": called on the caller's thread with
 * stored = 1 when an entry is committed (or found at open, replayed by set_listener) and
 * stored = 0 when it is dropped (evicted, failed, deleted). The key is borrowed for the call.
 * NULL removes it. */
typedef void (*disk_tier_listener)(void *ctx, int stored, const char *salt, const int32_t *tokens,
                                   int depth);
void disk_tier_set_listener(disk_tier *dt, disk_tier_listener fn, void *ctx);

typedef struct disk_tier_stats {
  size_t bytes, budget;
  int files, queued;
  long long hits;           /* reads that restored */
  long long read_failures;  /* reads refused: missing, short, corrupt */
  long long writes;         /* files written */
  long long write_failures; /* writes that failed (the entry's next read fails) */
  long long write_skips;    /* puts refused while the writer was 1 GiB behind */
  long long files_dropped;  /* files deleted at open: foreign, other version, corrupt header */
  long long evictions;      /* entries dropped for room or after a failure */
  double read_bytes, write_bytes, read_s, write_s;
} disk_tier_stats;
/* A consistent copy of the counters (any thread). */
void disk_tier_get_stats(disk_tier *dt, disk_tier_stats *s);

/* Verifies the entries against the byte count and the budget. Returns 0 or -1 with err. */
int disk_tier_check(const disk_tier *dt, char *err, size_t errlen);

/* The 64-bit hash the files use (word-wise multiply-xor; any one changed word changes it). */
uint64_t disk_tier_hash(const void *p, size_t n, uint64_t seed);
/* The identity of a model directory: config.json's bytes, and each *.safetensors file's name,
 * size and header (tensor names, dtypes, shapes), mixed with `extra` (backend, quantization,
 * load format). Unreadable files count as absent. */
uint64_t disk_tier_identity(const char *model_dir, const char *extra);

#endif
