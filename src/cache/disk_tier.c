/* disk_tier — checkpoint files (see disk_tier.h for the format and the threads). */
#include "cache/disk_tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fault.h"
#include "base/log.h"

/* ---------------------------------------------------------------- format */

#define DT_MAGIC "DSCKPT01"
#define DT_END "DSCKEND"
#define DT_HEADER 96
#define DT_FOOTER 16

typedef struct dt_header {
  char magic[8];
  uint32_t version, header_bytes;
  uint64_t model_id, slot_bytes, page_bytes;
  uint32_t has_slot, n_pages, depth, salt_len;
  uint64_t payload_bytes, key;
  uint64_t pad[2];
  uint64_t header_hash; /* over the 88 bytes above, the salt and the tokens */
} dt_header;
_Static_assert(sizeof(dt_header) == DT_HEADER, "disk_tier header layout");

uint64_t disk_tier_hash(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = p;
  uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (n + 1));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  memcpy(&w, b + i, n - i);
  h = (h ^ w ^ ((uint64_t)(n - i) << 56)) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 29;
  return h;
}

static uint64_t dt_key(const char *salt, const int32_t *tokens, int depth) {
  uint64_t h = disk_tier_hash(salt, strlen(salt), 0x6b6579ull);
  h = disk_tier_hash(&depth, sizeof depth, h);
  return disk_tier_hash(tokens, (size_t)depth * sizeof *tokens, h);
}

static size_t dt_key_bytes(size_t salt_len, int depth) {
  size_t k = salt_len + (size_t)depth * sizeof(int32_t);
  return (k + 7) / 8 * 8;
}

/* ---------------------------------------------------------------- state */

enum { DT_JOB_WRITE, DT_JOB_UNLINK, DT_JOB_TOUCH, DT_JOB_READ };

/* An entry's read ahead by the reader thread (disk_tier_prefetch). */
enum { DT_LOAD_NONE, DT_LOAD_BUSY, DT_LOAD_OK, DT_LOAD_BAD };
/* Reads in flight or done and not yet consumed: each holds a whole file in memory. */
#define DT_MAX_LOADS 2
/* Bytes of images waiting for the writer beyond which a put is refused (one image is always
 * taken): spills never hold more host memory than this while the disk is slower than them. */
#define DT_MAX_QUEUED ((size_t)1 << 30)

typedef struct dt_job {
  int kind;
  uint64_t name;      /* the file's key hash */
  unsigned char *img; /* WRITE: the whole file (owned by the job) */
  size_t bytes;
  int entry;
  uint64_t seq;
  struct dt_job *next;
} dt_job;

typedef struct dt_entry {
  int live;
  uint64_t name;
  char *salt;
  int32_t *tokens; /* [depth] */
  int depth, has_slot, n_pages;
  size_t bytes; /* the file */
  uint64_t tick;
  /* under mu: the queued image (the job's) until its write is done, and the write's result */
  const unsigned char *img;
  uint64_t seq;
  int write_failed;
  /* under mu: the reader's copy of the file, its payload hash checked (DT_LOAD_OK) */
  int load;
  uint64_t load_seq;
  unsigned char *loaded;
  /* between put_begin and put_commit: the image being filled (owned here) */
  unsigned char *building;
  int next_free;
} dt_entry;

struct disk_tier {
  char *dir;
  int lock_fd, dir_fd;
  size_t budget, used, slot_bytes, page_bytes;
  uint64_t model_id;
  host_tier_ops ops;
  dt_entry *e; /* [cap] */
  int n, cap, free_head, live;
  uint64_t tick;
  disk_tier_listener listener;
  void *listener_ctx;
  /* the writer */
  pthread_t th;
  int started, rstarted;
  pthread_t rth; /* the reader */
  pthread_cond_t rcv, load_cv;
  dt_job *rhead, *rtail;
  int loads;           /* entries with load BUSY or OK */
  size_t queued_bytes; /* images waiting for the writer (under mu) */
  int64_t stamp;       /* the writer's last file time (ns): strictly increasing, so that the
                          LRU order survives a restart even with coarse file clocks */
  pthread_mutex_t mu;
  pthread_cond_t cv, idle_cv;
  dt_job *head, *tail;
  int busy, stop;
  uint64_t seq;
  disk_tier_stats st; /* under mu */
};

static double dt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void dt_path(const disk_tier *dt, uint64_t name, const char *suffix, char *out, size_t n) {
  snprintf(out, n, "%s/%016llx.ckpt%s", dt->dir, (unsigned long long)name, suffix);
}

/* ---------------------------------------------------------------- the writer thread */

static int dt_write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* temporary file + fsync + rename + fsync of the directory */
/* The next file time (writer thread): now, or just after the last one. */
static struct timespec dt_stamp(disk_tier *dt) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  if (ns <= dt->stamp) ns = dt->stamp + 1000;
  dt->stamp = ns;
  ts.tv_sec = (time_t)(ns / 1000000000);
  ts.tv_nsec = (long)(ns % 1000000000);
  return ts;
}

static int dt_write_file(disk_tier *dt, const dt_job *j) {
  /* the footer: the payload's hash, here so that the engine thread never hashes a payload;
   * readers of the queued image copy everything but these 16 bytes */
  dt_header h;
  memcpy(&h, j->img, sizeof h);
  size_t off = DT_HEADER + dt_key_bytes(h.salt_len, (int)h.depth);
  uint64_t ph = disk_tier_hash(j->img + off, (size_t)h.payload_bytes, 0x7061796cull);
  memcpy(j->img + off + h.payload_bytes, &ph, 8);
  memcpy(j->img + off + h.payload_bytes + 8, DT_END, 8);
  char tmp[4200], fin[4200];
  dt_path(dt, j->name, ".tmp", tmp, sizeof tmp);
  dt_path(dt, j->name, "", fin, sizeof fin);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  int rc = dt_write_all(fd, j->img, j->bytes);
  struct timespec t[2];
  t[0] = t[1] = dt_stamp(dt);
  if (rc == 0) futimens(fd, t);
  if (rc == 0 && fsync(fd) != 0) rc = -1;
  if (close(fd) != 0) rc = -1;
  if (rc == 0 && rename(tmp, fin) != 0) rc = -1;
  if (rc != 0) {
    unlink(tmp);
    return -1;
  }
  fsync(dt->dir_fd);
  return 0;
}

static void *dt_writer(void *arg) {
  disk_tier *dt = arg;
  pthread_mutex_lock(&dt->mu);
  for (;;) {
    while (!dt->head && !dt->stop) pthread_cond_wait(&dt->cv, &dt->mu);
    if (!dt->head) break; /* stop, and nothing left */
    dt_job *j = dt->head;
    dt->head = j->next;
    if (!dt->head) dt->tail = NULL;
    dt->busy = 1;
    pthread_mutex_unlock(&dt->mu);
    char path[4200];
    int rc = 0;
    double t0 = dt_now();
    if (j->kind == DT_JOB_WRITE) {
      rc = dt_write_file(dt, j);
    } else if (j->kind == DT_JOB_UNLINK) {
      dt_path(dt, j->name, "", path, sizeof path);
      unlink(path);
    } else {
      dt_path(dt, j->name, "", path, sizeof path);
      struct timespec t[2];
      t[0] = t[1] = dt_stamp(dt);
      utimensat(AT_FDCWD, path, t, 0);
    }
    double s = dt_now() - t0;
    pthread_mutex_lock(&dt->mu);
    if (j->kind == DT_JOB_WRITE) {
      if (rc == 0) {
        dt->st.writes++;
        dt->st.write_bytes += (double)j->bytes;
        dt->st.write_s += s;
      } else {
        dt->st.write_failures++;
      }
      dt_entry *e = j->entry < dt->n ? &dt->e[j->entry] : NULL;
      if (e && e->live && e->seq == j->seq) {
        e->img = NULL;
        e->write_failed = rc != 0;
      }
      dt->st.queued--;
      dt->queued_bytes -= j->bytes;
      free(j->img);
    }
    free(j);
    dt->busy = 0;
    pthread_cond_broadcast(&dt->idle_cv); /* flush and disk_tier_wait_room wait on it */
  }
  pthread_mutex_unlock(&dt->mu);
  return NULL;
}

/* Queues a job (the caller's thread). Returns 0 or -1 (out of memory: nothing queued). */
static int dt_queue(disk_tier *dt, int kind, uint64_t name, unsigned char *img, size_t bytes,
                    int entry, uint64_t seq) {
  dt_job *j = calloc(1, sizeof *j);
  if (!j) return -1;
  j->kind = kind;
  j->name = name;
  j->img = img;
  j->bytes = bytes;
  j->entry = entry;
  j->seq = seq;
  pthread_mutex_lock(&dt->mu);
  if (dt->tail)
    dt->tail->next = j;
  else
    dt->head = j;
  dt->tail = j;
  if (kind == DT_JOB_WRITE) {
    dt->st.queued++;
    dt->queued_bytes += bytes;
  }
  pthread_cond_signal(&dt->cv);
  pthread_mutex_unlock(&dt->mu);
  return 0;
}

void disk_tier_wait_room(disk_tier *dt, size_t bytes) {
  pthread_mutex_lock(&dt->mu);
  while (dt->queued_bytes > 0 && dt->queued_bytes + bytes > DT_MAX_QUEUED)
    pthread_cond_wait(&dt->idle_cv, &dt->mu);
  pthread_mutex_unlock(&dt->mu);
}

void disk_tier_flush(disk_tier *dt) {
  pthread_mutex_lock(&dt->mu);
  while (dt->head || dt->busy) pthread_cond_wait(&dt->idle_cv, &dt->mu);
  pthread_mutex_unlock(&dt->mu);
}

/* ---------------------------------------------------------------- entries */

static int dt_take_handle(disk_tier *dt) {
  if (dt->free_head >= 0) {
    int i = dt->free_head;
    dt->free_head = dt->e[i].next_free;
    return i;
  }
  pthread_mutex_lock(&dt->mu); /* the writer looks entries up under mu */
  int i = -1;
  if (dt->n == dt->cap) {
    int cap = dt->cap ? dt->cap * 2 : 16;
    dt_entry *e = fault_hit("disk_tier_alloc") ? NULL : realloc(dt->e, (size_t)cap * sizeof *e);
    if (e) {
      dt->e = e;
      dt->cap = cap;
    }
  }
  if (dt->n < dt->cap) {
    memset(&dt->e[dt->n], 0, sizeof dt->e[0]);
    i = dt->n++;
  }
  pthread_mutex_unlock(&dt->mu);
  return i;
}

static void dt_put_handle(disk_tier *dt, int i) {
  dt_entry *e = &dt->e[i];
  free(e->salt);
  free(e->tokens);
  free(e->building);
  pthread_mutex_lock(&dt->mu);
  if (e->load == DT_LOAD_OK) { /* read ahead, never used; a BUSY one: the reader lets go */
    free(e->loaded);
    dt->loads--;
  }
  memset(e, 0, sizeof *e);
  pthread_mutex_unlock(&dt->mu);
  e->next_free = dt->free_head;
  dt->free_head = i;
}

static void dt_notify(disk_tier *dt, int i, int stored) {
  const dt_entry *e = &dt->e[i];
  if (dt->listener) dt->listener(dt->listener_ctx, stored, e->salt, e->tokens, e->depth);
}

/* A new live entry with its key copied (salt, tokens). Returns the handle or -1. */
static int dt_entry_new(disk_tier *dt, uint64_t name, const char *salt, size_t salt_len,
                        const int32_t *tokens, int depth, int has_slot, int n_pages) {
  int i = dt_take_handle(dt);
  if (i < 0) return -1;
  dt_entry *e = &dt->e[i];
  e->salt = malloc(salt_len + 1);
  e->tokens = malloc((size_t)(depth > 0 ? depth : 1) * sizeof *tokens);
  if (!e->salt || !e->tokens) {
    dt_put_handle(dt, i);
    return -1;
  }
  memcpy(e->salt, salt, salt_len);
  e->salt[salt_len] = 0;
  memcpy(e->tokens, tokens, (size_t)depth * sizeof *tokens);
  e->name = name;
  e->depth = depth;
  e->has_slot = has_slot;
  e->n_pages = n_pages;
  e->bytes = disk_tier_file_size(dt, salt_len, depth, has_slot, n_pages);
  e->tick = ++dt->tick;
  e->next_free = -1;
  pthread_mutex_lock(&dt->mu);
  e->live = 1;
  pthread_mutex_unlock(&dt->mu);
  return i;
}

size_t disk_tier_budget(const disk_tier *dt) { return dt->budget; }
size_t disk_tier_bytes(const disk_tier *dt) { return dt->used; }
int disk_tier_count(const disk_tier *dt) { return dt->live; }
int disk_tier_handles(const disk_tier *dt) { return dt->n; }

size_t disk_tier_file_size(const disk_tier *dt, size_t salt_len, int depth, int has_slot,
                           int n_pages) {
  return DT_HEADER + dt_key_bytes(salt_len, depth) + (has_slot ? dt->slot_bytes : 0) +
         (size_t)n_pages * dt->page_bytes + DT_FOOTER;
}

int disk_tier_live(const disk_tier *dt, int entry) {
  return entry >= 0 && entry < dt->n && dt->e[entry].live && !dt->e[entry].building;
}
int disk_tier_entry_depth(const disk_tier *dt, int entry) {
  return disk_tier_live(dt, entry) ? dt->e[entry].depth : 0;
}
int disk_tier_entry_pages(const disk_tier *dt, int entry) {
  return disk_tier_live(dt, entry) ? dt->e[entry].n_pages : 0;
}
int disk_tier_entry_has_slot(const disk_tier *dt, int entry) {
  return disk_tier_live(dt, entry) ? dt->e[entry].has_slot : 0;
}
const char *disk_tier_entry_salt(const disk_tier *dt, int entry) {
  return disk_tier_live(dt, entry) ? dt->e[entry].salt : NULL;
}
const int32_t *disk_tier_entry_tokens(const disk_tier *dt, int entry) {
  return disk_tier_live(dt, entry) ? dt->e[entry].tokens : NULL;
}
uint64_t disk_tier_tick(const disk_tier *dt, int entry) {
  return disk_tier_live(dt, entry) ? dt->e[entry].tick : 0;
}

int disk_tier_oldest(const disk_tier *dt) {
  int best = -1;
  for (int i = 0; i < dt->n; i++)
    if (disk_tier_live(dt, i) && (best < 0 || dt->e[i].tick < dt->e[best].tick)) best = i;
  return best;
}

void disk_tier_set_listener(disk_tier *dt, disk_tier_listener fn, void *ctx) {
  dt->listener = fn;
  dt->listener_ctx = ctx;
  for (int i = 0; fn && i < dt->n; i++)
    if (disk_tier_live(dt, i)) dt_notify(dt, i, 1);
}

/* ---------------------------------------------------------------- put */

/* Fills the header and key of an image of e (payload hashed by the caller). */
static void dt_image_header(const disk_tier *dt, const dt_entry *e, unsigned char *img) {
  dt_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, DT_MAGIC, 8);
  h.version = DISK_TIER_FORMAT;
  h.header_bytes = DT_HEADER;
  h.model_id = dt->model_id;
  h.slot_bytes = dt->slot_bytes;
  h.page_bytes = dt->page_bytes;
  h.has_slot = (uint32_t)e->has_slot;
  h.n_pages = (uint32_t)e->n_pages;
  h.depth = (uint32_t)e->depth;
  h.salt_len = (uint32_t)strlen(e->salt);
  h.payload_bytes =
      (e->has_slot ? dt->slot_bytes : 0) + (uint64_t)e->n_pages * (uint64_t)dt->page_bytes;
  h.key = e->name;
  unsigned char *k = img + DT_HEADER;
  size_t kb = dt_key_bytes(h.salt_len, e->depth);
  memset(k, 0, kb);
  memcpy(k, e->salt, h.salt_len);
  memcpy(k + h.salt_len, e->tokens, (size_t)e->depth * sizeof(int32_t));
  memcpy(img, &h, sizeof h);
  uint64_t hh = disk_tier_hash(img, offsetof(dt_header, header_hash), 0x68647275ull);
  hh = disk_tier_hash(k, kb, hh);
  memcpy(img + offsetof(dt_header, header_hash), &hh, sizeof hh);
}

int disk_tier_put_begin(disk_tier *dt, const char *salt, const int32_t *tokens, int depth,
                        int has_slot, int n_pages, int *entry, void **slab, void **pages) {
  if (!salt) salt = "";
  if (depth < 1 || n_pages < 0 || (!has_slot && n_pages == 0)) return -1;
  size_t salt_len = strlen(salt);
  size_t bytes = disk_tier_file_size(dt, salt_len, depth, has_slot, n_pages);
  if (bytes > dt->budget - dt->used) return -1;
  uint64_t name = dt_key(salt, tokens, depth);
  for (int i = 0; i < dt->n; i++)
    if (dt->e[i].live && dt->e[i].name == name) return -1;
  pthread_mutex_lock(&dt->mu);
  int full = dt->queued_bytes > 0 && dt->queued_bytes + bytes > DT_MAX_QUEUED;
  if (full) dt->st.write_skips++;
  pthread_mutex_unlock(&dt->mu);
  if (full) return -1;
  if (fault_hit("disk_tier_alloc")) return -1;
  int i = dt_entry_new(dt, name, salt, salt_len, tokens, depth, has_slot, n_pages);
  if (i < 0) return -1;
  dt_entry *e = &dt->e[i];
  e->building = malloc(bytes);
  if (!e->building) {
    dt_put_handle(dt, i);
    return -1;
  }
  unsigned char *pay = e->building + DT_HEADER + dt_key_bytes(salt_len, depth);
  *slab = has_slot ? pay : NULL;
  *pages = pay + (has_slot ? dt->slot_bytes : 0);
  dt->used += bytes;
  dt->live++;
  *entry = i;
  return 0;
}

void disk_tier_put_commit(disk_tier *dt, int entry) {
  CHECK(entry >= 0 && entry < dt->n && dt->e[entry].live && dt->e[entry].building);
  dt_entry *e = &dt->e[entry];
  unsigned char *img = e->building;
  dt_image_header(dt, e, img); /* the footer (payload hash) is the writer thread's */
  e->building = NULL;
  pthread_mutex_lock(&dt->mu);
  e->img = img;
  e->seq = ++dt->seq;
  e->write_failed = 0;
  uint64_t seq = e->seq;
  pthread_mutex_unlock(&dt->mu);
  if (dt_queue(dt, DT_JOB_WRITE, e->name, img, e->bytes, entry, seq) != 0) {
    pthread_mutex_lock(&dt->mu); /* out of memory for the job: the entry's read will fail */
    e->img = NULL;
    e->write_failed = 1;
    dt->st.write_failures++;
    pthread_mutex_unlock(&dt->mu);
    free(img);
  }
  dt_notify(dt, entry, 1);
}

void disk_tier_put_abort(disk_tier *dt, int entry) {
  CHECK(entry >= 0 && entry < dt->n && dt->e[entry].live && dt->e[entry].building);
  dt->used -= dt->e[entry].bytes;
  dt->live--;
  dt_put_handle(dt, entry);
}

/* ---------------------------------------------------------------- drop, touch */

void disk_tier_drop(disk_tier *dt, int entry) {
  CHECK(disk_tier_live(dt, entry));
  dt_entry *e = &dt->e[entry];
  dt_notify(dt, entry, 0);
  dt_queue(dt, DT_JOB_UNLINK, e->name, NULL, 0, entry, 0); /* out of memory: the file stays */
  dt->used -= e->bytes;
  dt->live--;
  dt_put_handle(dt, entry);
}

void disk_tier_touch(disk_tier *dt, int entry) {
  CHECK(disk_tier_live(dt, entry));
  dt->e[entry].tick = ++dt->tick;
  dt_queue(dt, DT_JOB_TOUCH, dt->e[entry].name, NULL, 0, entry, 0);
}

/* ---------------------------------------------------------------- read */

static int dt_read_all(int fd, unsigned char *p, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = pread(fd, p + off, n - off, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    off += (size_t)r;
  }
  return 0;
}

/* 1 when the header of img (n bytes) is one of this tier's, with a valid header hash. Fills
 * *h. Does not look at the payload. */
static int dt_header_ok(const disk_tier *dt, const unsigned char *img, size_t n, dt_header *h) {
  if (n < DT_HEADER) return 0;
  memcpy(h, img, sizeof *h);
  if (memcmp(h->magic, DT_MAGIC, 8) || h->version != DISK_TIER_FORMAT ||
      h->header_bytes != DT_HEADER || h->model_id != dt->model_id ||
      h->slot_bytes != dt->slot_bytes || h->page_bytes != dt->page_bytes || h->has_slot > 1 ||
      h->depth < 1 || h->depth > (1u << 28) || h->salt_len > 4096 || h->n_pages > (1u << 26))
    return 0;
  size_t kb = dt_key_bytes(h->salt_len, (int)h->depth);
  if (n < DT_HEADER + kb) return 0;
  uint64_t hh = disk_tier_hash(img, offsetof(dt_header, header_hash), 0x68647275ull);
  hh = disk_tier_hash(img + DT_HEADER, kb, hh);
  if (hh != h->header_hash) return 0;
  uint64_t pay = (h->has_slot ? dt->slot_bytes : 0) + (uint64_t)h->n_pages * dt->page_bytes;
  return pay == h->payload_bytes;
}

/* 1 when img (n bytes) is a whole file named `name` of this tier: header, length, and (when
 * hash) the end magic and the payload hash. */
static int dt_image_ok(const disk_tier *dt, const unsigned char *img, size_t n, uint64_t name,
                       int hash) {
  dt_header h;
  if (!dt_header_ok(dt, img, n, &h) || h.key != name) return 0;
  size_t off = DT_HEADER + dt_key_bytes(h.salt_len, (int)h.depth);
  if (off + h.payload_bytes + DT_FOOTER != n) return 0;
  if (!hash) return 1;
  if (memcmp(img + n - 8, DT_END, 8)) return 0;
  uint64_t ph, want = disk_tier_hash(img + off, (size_t)h.payload_bytes, 0x7061796cull);
  memcpy(&ph, img + off + h.payload_bytes, 8);
  return ph == want;
}

/* Reads file `name` of `bytes` bytes into a new buffer; NULL when missing, short or out of
 * memory. */
static unsigned char *dt_read_file(const disk_tier *dt, uint64_t name, size_t bytes) {
  char path[4200];
  dt_path(dt, name, "", path, sizeof path);
  unsigned char *buf = malloc(bytes ? bytes : 1);
  int fd = buf ? open(path, O_RDONLY | O_CLOEXEC) : -1;
  struct stat sb;
  int ok = fd >= 0 && fstat(fd, &sb) == 0 && (size_t)sb.st_size == bytes &&
           dt_read_all(fd, buf, bytes) == 0;
  if (fd >= 0) close(fd);
  if (!ok) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* The reader thread: reads a file ahead of its restore and checks its payload hash, so that
 * the engine thread only copies it (disk_tier_prefetch). */
static void *dt_reader(void *arg) {
  disk_tier *dt = arg;
  pthread_mutex_lock(&dt->mu);
  for (;;) {
    while (!dt->rhead && !dt->stop) pthread_cond_wait(&dt->rcv, &dt->mu);
    if (dt->stop) break; /* reads not started are freed by close */
    dt_job *j = dt->rhead;
    dt->rhead = j->next;
    if (!dt->rhead) dt->rtail = NULL;
    pthread_mutex_unlock(&dt->mu);
    double t0 = dt_now();
    unsigned char *buf = dt_read_file(dt, j->name, j->bytes);
    int ok = buf && dt_image_ok(dt, buf, j->bytes, j->name, 1);
    double s = dt_now() - t0;
    pthread_mutex_lock(&dt->mu);
    dt_entry *e = j->entry < dt->n ? &dt->e[j->entry] : NULL;
    if (e && e->live && e->load == DT_LOAD_BUSY && e->load_seq == j->seq) {
      e->load = ok ? DT_LOAD_OK : DT_LOAD_BAD;
      if (ok) {
        e->loaded = buf;
        buf = NULL;
      } else {
        dt->loads--;
      }
      dt->st.read_s += s;
    } else {
      dt->loads--; /* dropped meanwhile */
    }
    free(buf);
    free(j);
    pthread_cond_broadcast(&dt->load_cv);
  }
  pthread_mutex_unlock(&dt->mu);
  return NULL;
}

int disk_tier_prefetch(disk_tier *dt, int entry) {
  CHECK(disk_tier_live(dt, entry));
  dt_entry *e = &dt->e[entry];
  int ready = 1;
  pthread_mutex_lock(&dt->mu);
  if (!dt->rstarted || e->img || e->write_failed || e->load == DT_LOAD_OK ||
      e->load == DT_LOAD_BAD) {
    ready = 1;
  } else if (e->load == DT_LOAD_BUSY || dt->loads >= DT_MAX_LOADS) {
    ready = 0;
  } else {
    dt_job *j = calloc(1, sizeof *j);
    if (j) { /* out of memory: ready, disk_tier_read reads it itself */
      j->kind = DT_JOB_READ;
      j->name = e->name;
      j->bytes = e->bytes;
      j->entry = entry;
      j->seq = e->load_seq = ++dt->seq;
      e->load = DT_LOAD_BUSY;
      dt->loads++;
      if (dt->rtail)
        dt->rtail->next = j;
      else
        dt->rhead = j;
      dt->rtail = j;
      pthread_cond_signal(&dt->rcv);
      ready = 0;
    }
  }
  pthread_mutex_unlock(&dt->mu);
  return ready;
}

int disk_tier_read(disk_tier *dt, int entry, int slot, const int32_t *pages, int n_pages) {
  CHECK(disk_tier_live(dt, entry) && dt->e[entry].n_pages == n_pages);
  dt_entry *e = &dt->e[entry];
  double t0 = dt_now();
  unsigned char *buf = NULL;
  int ok = !fault_hit("disk_tier_read"), hashed = 0;
  pthread_mutex_lock(&dt->mu);
  while (e->load == DT_LOAD_BUSY) pthread_cond_wait(&dt->load_cv, &dt->mu);
  if (e->load == DT_LOAD_OK) { /* read ahead: its payload hash was checked */
    buf = e->loaded;
    e->loaded = NULL;
    dt->loads--;
    hashed = 1;
  } else if (e->load == DT_LOAD_BAD || e->write_failed) {
    ok = 0;
  } else if (e->img) { /* still queued: the image in memory (never on disk: no hash to check;
                        * the writer may be writing its footer) */
    buf = malloc(e->bytes);
    if (buf) memcpy(buf, e->img, e->bytes - DT_FOOTER);
    hashed = 1;
  }
  e->load = DT_LOAD_NONE;
  pthread_mutex_unlock(&dt->mu);
  if (ok && !buf) buf = dt_read_file(dt, e->name, e->bytes);
  size_t salt_len = strlen(e->salt), off = DT_HEADER + dt_key_bytes(salt_len, e->depth);
  dt_header h;
  ok = ok && buf && dt_image_ok(dt, buf, e->bytes, e->name, !hashed) &&
       dt_header_ok(dt, buf, e->bytes, &h) && (int)h.depth == e->depth &&
       (int)h.n_pages == e->n_pages && (int)h.has_slot == e->has_slot && h.salt_len == salt_len &&
       !memcmp(buf + DT_HEADER, e->salt, salt_len) &&
       !memcmp(buf + DT_HEADER + salt_len, e->tokens, (size_t)e->depth * sizeof(int32_t));
  if (!ok) {
    free(buf);
    pthread_mutex_lock(&dt->mu);
    dt->st.read_failures++;
    pthread_mutex_unlock(&dt->mu);
    log_warn("disk cache: %016llx.ckpt is missing or corrupt: dropped, not restored",
             (unsigned long long)e->name);
    return -1;
  }
  double t1 = dt_now();
  const unsigned char *p = buf + off;
  int rc = 0;
  if (e->has_slot) {
    if (slot >= 0 && dt->ops.slot_write && dt->ops.slot_write(dt->ops.ctx, slot, p)) rc = -1;
    p += dt->slot_bytes;
  }
  for (int k = 0; k < n_pages && rc == 0; k++, p += dt->page_bytes)
    if (dt->ops.page_write && dt->ops.page_write(dt->ops.ctx, pages[k], p)) rc = -1;
  free(buf);
  pthread_mutex_lock(&dt->mu);
  if (rc == 0) {
    dt->st.hits++;
    dt->st.read_bytes += (double)e->bytes;
    if (!hashed) dt->st.read_s += t1 - t0;
  } else {
    dt->st.read_failures++;
  }
  pthread_mutex_unlock(&dt->mu);
  return rc;
}

/* ---------------------------------------------------------------- open, close */

typedef struct dt_found {
  int entry;
  struct timespec mtime;
} dt_found;

static int dt_found_cmp(const void *a, const void *b) {
  const dt_found *x = a, *y = b;
  if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
  if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
  return x->entry - y->entry;
}

/* 1 when name is "<16 hex>.ckpt" (*key set), 2 when "<16 hex>.ckpt.tmp", else 0. */
static int dt_name_kind(const char *name, uint64_t *key) {
  size_t n = strlen(name);
  if (n < 21 || memcmp(name + 16, ".ckpt", 5) != 0) return 0;
  uint64_t k = 0;
  for (int i = 0; i < 16; i++) {
    char c = name[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return 0;
    k = k << 4 | (uint64_t)v;
  }
  *key = k;
  if (n == 21) return 1;
  return strcmp(name + 21, ".tmp") == 0 ? 2 : 0;
}

/* Indexes one file; a file that does not belong is deleted and counted. Returns the entry,
 * -1 when dropped, -2 on out of memory. */
static int dt_scan_file(disk_tier *dt, int dfd, const char *name, uint64_t key,
                        struct timespec *mtime) {
  int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  unsigned char head[DT_HEADER];
  dt_header h;
  int ok = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
           dt_read_all(fd, head, DT_HEADER) == 0;
  unsigned char *img = NULL;
  if (ok) {
    memcpy(&h, head, sizeof h);
    size_t kb =
        h.salt_len <= 4096 && h.depth <= (1u << 28) ? dt_key_bytes(h.salt_len, (int)h.depth) : 0;
    ok = kb > 0 && (size_t)sb.st_size >= DT_HEADER + kb;
    if (ok) {
      img = malloc(DT_HEADER + kb);
      if (!img) {
        close(fd);
        return -2;
      }
      ok = dt_read_all(fd, img, DT_HEADER + kb) == 0 && dt_header_ok(dt, img, DT_HEADER + kb, &h) &&
           h.key == key && (size_t)sb.st_size == DT_HEADER + kb + h.payload_bytes + DT_FOOTER;
    }
  }
  if (fd >= 0) close(fd);
  int i = -1;
  if (ok) {
    const unsigned char *tok = img + DT_HEADER + h.salt_len;  /* not aligned */
    int32_t *tcopy = malloc((size_t)h.depth * sizeof *tcopy); /* the key may be unaligned */
    if (tcopy) {
      memcpy(tcopy, tok, (size_t)h.depth * sizeof *tcopy);
      char *salt = malloc(h.salt_len + 1);
      if (salt) {
        memcpy(salt, img + DT_HEADER, h.salt_len);
        salt[h.salt_len] = 0;
        if (dt_key(salt, tcopy, (int)h.depth) == key)
          i = dt_entry_new(dt, key, salt, h.salt_len, tcopy, (int)h.depth, (int)h.has_slot,
                           (int)h.n_pages);
        else
          i = -3; /* the name is not the key's */
        free(salt);
      }
      free(tcopy);
    }
    free(img);
    if (i >= 0) {
      dt->e[i].bytes = (size_t)sb.st_size;
      *mtime = sb.st_mtim;
      return i;
    }
    if (i != -3) return -2;
  }
  free(img);
  unlinkat(dfd, name, 0);
  dt->st.files_dropped++;
  log_warn(
      "disk cache: %s/%s is not a checkpoint of this model and format (or is damaged): "
      "deleted",
      dt->dir, name);
  return -1;
}

static int dt_scan(disk_tier *dt, char *err, size_t errlen) {
  DIR *d = opendir(dt->dir);
  if (!d) return errf(err, errlen, "--disk-cache-dir %s: %s", dt->dir, strerror(errno));
  dt_found *found = NULL;
  int n_found = 0, cap = 0, rc = 0;
  struct dirent *de;
  while (rc == 0 && (de = readdir(d)) != NULL) {
    uint64_t key;
    int kind = dt_name_kind(de->d_name, &key);
    if (kind == 2) {
      unlinkat(dirfd(d), de->d_name, 0); /* a write a crash interrupted */
      continue;
    }
    if (kind != 1) continue;
    struct timespec mt;
    int i = dt_scan_file(dt, dirfd(d), de->d_name, key, &mt);
    if (i == -2) rc = errf(err, errlen, "out of memory indexing --disk-cache-dir %s", dt->dir);
    if (i < 0) continue;
    if (n_found == cap) {
      cap = cap ? cap * 2 : 64;
      dt_found *f = realloc(found, (size_t)cap * sizeof *f);
      if (!f) {
        rc = errf(err, errlen, "out of memory indexing --disk-cache-dir %s", dt->dir);
        break;
      }
      found = f;
    }
    found[n_found++] = (dt_found){i, mt};
    dt->used += dt->e[i].bytes;
    int64_t ns = (int64_t)mt.tv_sec * 1000000000 + mt.tv_nsec;
    if (ns > dt->stamp) dt->stamp = ns;
    dt->live++;
  }
  closedir(d);
  if (rc == 0 && n_found > 0) {
    qsort(found, (size_t)n_found, sizeof *found, dt_found_cmp);
    for (int k = 0; k < n_found; k++) dt->e[found[k].entry].tick = ++dt->tick;
  }
  free(found);
  while (rc == 0 && dt->used > dt->budget) { /* a smaller budget than last time */
    disk_tier_drop(dt, disk_tier_oldest(dt));
    dt->st.evictions++;
  }
  return rc;
}

int disk_tier_open(disk_tier **out, const disk_tier_opts *o, char *err, size_t errlen) {
  *out = NULL;
  if (!o->dir || !o->dir[0] || strlen(o->dir) > 4000)
    return errf(err, errlen, "--disk-cache-dir: a directory is needed");
  if (o->budget == 0) return errf(err, errlen, "--disk-cache-gib must be > 0");
  if (mkdir(o->dir, 0755) != 0 && errno != EEXIST)
    return errf(err, errlen, "--disk-cache-dir %s: %s", o->dir, strerror(errno));
  disk_tier *dt = calloc(1, sizeof *dt);
  if (!dt || !(dt->dir = strdup(o->dir))) {
    free(dt);
    return errf(err, errlen, "out of memory");
  }
  dt->lock_fd = dt->dir_fd = -1;
  dt->free_head = -1;
  dt->budget = o->budget;
  dt->model_id = o->model_id;
  dt->slot_bytes = o->slot_bytes;
  dt->page_bytes = o->page_bytes;
  dt->ops = o->ops;
  pthread_mutex_init(&dt->mu, NULL);
  pthread_cond_init(&dt->cv, NULL);
  pthread_cond_init(&dt->idle_cv, NULL);
  pthread_cond_init(&dt->rcv, NULL);
  pthread_cond_init(&dt->load_cv, NULL);
  char path[4200];
  snprintf(path, sizeof path, "%s/lock", dt->dir);
  dt->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  dt->dir_fd = open(dt->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = 0;
  if (dt->lock_fd < 0 || dt->dir_fd < 0) {
    rc = errf(err, errlen, "--disk-cache-dir %s: %s", dt->dir, strerror(errno));
  } else if (flock(dt->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = "";
    ssize_t r = pread(dt->lock_fd, pid, sizeof pid - 1, 0);
    if (r > 0) pid[r] = 0;
    pid[strcspn(pid, "\n")] = 0;
    rc = errf(err, errlen,
              "--disk-cache-dir %s is in use by another deltaserve process%s%s%s (lock %s): give "
              "each server its own directory",
              dt->dir, pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "", path);
    close(dt->lock_fd);
    dt->lock_fd = -1;
  } else {
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(dt->lock_fd, 0) != 0 || pwrite(dt->lock_fd, pid, (size_t)n, 0) != n)
      log_warn("disk cache: cannot write the pid into %s", path);
    rc = dt_scan(dt, err, errlen);
  }
  if (rc == 0 && pthread_create(&dt->th, NULL, dt_writer, dt) != 0)
    rc = errf(err, errlen, "cannot start the disk cache writer thread");
  if (rc == 0) dt->started = 1;
  if (rc == 0 && pthread_create(&dt->rth, NULL, dt_reader, dt) != 0)
    rc = errf(err, errlen, "cannot start the disk cache reader thread");
  if (rc == 0) dt->rstarted = 1;
  if (rc != 0) {
    disk_tier_close(dt);
    return -1;
  }
  dt->st.budget = dt->budget;
  *out = dt;
  return 0;
}

void disk_tier_close(disk_tier *dt) {
  if (!dt) return;
  pthread_mutex_lock(&dt->mu);
  dt->stop = 1;
  pthread_cond_signal(&dt->cv);
  pthread_cond_signal(&dt->rcv);
  pthread_mutex_unlock(&dt->mu);
  if (dt->started) pthread_join(dt->th, NULL);
  if (dt->rstarted) pthread_join(dt->rth, NULL);
  for (dt_job *j = dt->head, *next; j; j = next) { /* a writer that never started */
    next = j->next;
    free(j->img);
    free(j);
  }
  for (dt_job *j = dt->rhead, *next; j; j = next) { /* reads never started */
    next = j->next;
    free(j);
  }
  for (int i = 0; i < dt->n; i++) {
    free(dt->e[i].salt);
    free(dt->e[i].tokens);
    free(dt->e[i].building);
    free(dt->e[i].loaded);
  }
  free(dt->e);
  if (dt->dir_fd >= 0) close(dt->dir_fd);
  if (dt->lock_fd >= 0) close(dt->lock_fd); /* releases the flock */
  pthread_mutex_destroy(&dt->mu);
  pthread_cond_destroy(&dt->cv);
  pthread_cond_destroy(&dt->idle_cv);
  pthread_cond_destroy(&dt->rcv);
  pthread_cond_destroy(&dt->load_cv);
  free(dt->dir);
  free(dt);
}

/* ---------------------------------------------------------------- stats, check */

void disk_tier_get_stats(disk_tier *dt, disk_tier_stats *s) {
  pthread_mutex_lock(&dt->mu);
  *s = dt->st;
  pthread_mutex_unlock(&dt->mu);
}

int disk_tier_check(const disk_tier *dt, char *err, size_t errlen) {
  size_t used = 0;
  int live = 0, n_free = 0;
  for (int i = 0; i < dt->n; i++) {
    const dt_entry *e = &dt->e[i];
    if (!e->live) continue;
    live++;
    if (e->bytes != disk_tier_file_size(dt, strlen(e->salt), e->depth, e->has_slot, e->n_pages))
      return errf(err, errlen, "disk_tier: entry %d holds %zu bytes", i, e->bytes);
    for (int j = 0; j < i; j++)
      if (dt->e[j].live && dt->e[j].name == e->name)
        return errf(err, errlen, "disk_tier: entries %d and %d share a file", j, i);
    used += e->bytes;
  }
  for (int i = dt->free_head; i >= 0; i = dt->e[i].next_free)
    if (i >= dt->n || dt->e[i].live || ++n_free > dt->n)
      return errf(err, errlen, "disk_tier: broken free list at %d", i);
  if (live != dt->live || used != dt->used)
    return errf(err, errlen, "disk_tier: counted %d entries %zu bytes, recorded %d %zu", live, used,
                dt->live, dt->used);
  if (live + n_free != dt->n)
    return errf(err, errlen, "disk_tier: %d live + %d free != %d handles", live, n_free, dt->n);
  if (dt->used > dt->budget)
    return errf(err, errlen, "disk_tier: %zu bytes over the budget of %zu", dt->used, dt->budget);
  return 0;
}

/* ---------------------------------------------------------------- model identity */

static int dt_name_sort(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

static int dt_is_safetensors(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 12 && strcmp(d->d_name + n - 12, ".safetensors") == 0;
}

/* Mixes the whole file (at most cap bytes from offset 0) into h. */
static uint64_t dt_hash_file(const char *path, size_t cap, uint64_t h) {
  FILE *f = fopen(path, "rb");
  if (!f) return disk_tier_hash("absent", 6, h);
  unsigned char buf[65536];
  size_t n, total = 0;
  while (total < cap && (n = fread(buf, 1, sizeof buf, f)) > 0) {
    if (n > cap - total) n = cap - total;
    h = disk_tier_hash(buf, n, h);
    total += n;
  }
  fclose(f);
  return h;
}

uint64_t disk_tier_identity(const char *model_dir, const char *extra) {
  uint64_t h = disk_tier_hash("deltaserve-model", 16, DISK_TIER_FORMAT);
  if (extra) h = disk_tier_hash(extra, strlen(extra), h);
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", model_dir);
  h = dt_hash_file(path, (size_t)1 << 24, h);
  struct dirent **names = NULL;
  int n = scandir(model_dir, &names, dt_is_safetensors, dt_name_sort);
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", model_dir, names[i]->d_name);
    h = disk_tier_hash(names[i]->d_name, strlen(names[i]->d_name), h);
    struct stat sb;
    uint64_t size = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    h = disk_tier_hash(&size, sizeof size, h);
    /* the header: 8 bytes of length, then the JSON of names, dtypes, shapes, offsets */
    FILE *f = fopen(path, "rb");
    uint64_t hl = 0;
    if (f && fread(&hl, 8, 1, f) == 1 && hl < ((uint64_t)1 << 27))
      h = dt_hash_file(path, (size_t)hl + 8, h);
    if (f) fclose(f);
    free(names[i]);
  }
  free(names);
  return h;
}
