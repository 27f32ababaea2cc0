/* disk_tier: round trips through files, the index rebuilt at open (restart, LRU order), files
 * that must never be restored (corrupt payload, damaged header, truncated, another model,
 * another format version), the byte budget, the directory lock and crash leftovers; then the
 * tier under the engine on the CPU fixture: a checkpoint spilled to disk restores bit-identical
 * to the cold run and to the host-tier restore, a restarted engine hits the files the last one
 * wrote (cached tokens reported), corrupt / foreign files are dropped and counted and the
 * request runs cold, and the disk budget holds under LRU eviction. */
#include "cache/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/backend_cpu.h"
#include "cache/kv_events.h"
#include "base/fault.h"
#include "base/log.h"
#include "model/weights.h"
#include "test.h"

#define MODEL_DIR "tests/fixtures/models/dense_bf16"
#define MAXTOK 6
#define MAXP 400
#include "engine_rig.h"

/* ---- a fake device ----------------------------------------------------------------------- */

#define PB 64 /* page bytes */
#define SB 40 /* slot bytes */
static unsigned char dev_page[16][PB], dev_slot[4][SB];

static int rd_page(void *c, int p, void *h) {
  (void)c;
  memcpy(h, dev_page[p], PB);
  return 0;
}
static int wr_page(void *c, int p, const void *h) {
  (void)c;
  memcpy(dev_page[p], h, PB);
  return 0;
}
static int rd_slot(void *c, int s, void *h) {
  (void)c;
  memcpy(h, dev_slot[s], SB);
  return 0;
}
static int wr_slot(void *c, int s, const void *h) {
  (void)c;
  memcpy(dev_slot[s], h, SB);
  return 0;
}

static char DIRNAME[64];

static void dir_clean(const char *d) {
  DIR *dd = opendir(d);
  if (!dd) return;
  struct dirent *de;
  char p[512];
  while ((de = readdir(dd)))
    if (de->d_name[0] != '.') {
      snprintf(p, sizeof p, "%s/%s", d, de->d_name);
      unlink(p);
    }
  closedir(dd);
}

/* the .ckpt files of d: their count, and the path of the first into first (when given) */
static int dir_ckpts(const char *d, char *first, size_t n, long long *bytes) {
  DIR *dd = opendir(d);
  int c = 0;
  if (bytes) *bytes = 0;
  if (!dd) return 0;
  struct dirent *de;
  while ((de = readdir(dd))) {
    size_t l = strlen(de->d_name);
    if (l < 5 || strcmp(de->d_name + l - 5, ".ckpt")) continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", d, de->d_name);
    if (first && c == 0) snprintf(first, n, "%s", p);
    struct stat sb;
    if (bytes && stat(p, &sb) == 0) *bytes += sb.st_size;
    c++;
  }
  closedir(dd);
  return c;
}

static disk_tier_opts unit_opts(size_t budget, uint64_t id) {
  disk_tier_opts o;
  memset(&o, 0, sizeof o);
  o.dir = DIRNAME;
  o.budget = budget;
  o.model_id = id;
  o.slot_bytes = SB;
  o.page_bytes = PB;
  o.ops = (host_tier_ops){NULL, rd_page, wr_page, rd_slot, wr_slot};
  return o;
}

static int tier_ok(const disk_tier *dt) {
  char err[200];
  if (disk_tier_check(dt, err, sizeof err)) {
    printf("check: %s\n", err);
    return 0;
  }
  return 1;
}

/* puts a checkpoint of depth d (tokens seeded) with the slot image of slot s and pages
 * pages[0, np) of the fake device */
static int put(disk_tier *dt, const char *salt, int d, uint32_t seed, int s, const int32_t *pages,
               int np) {
  int32_t tok[64];
  toks(tok, d, seed);
  void *sl, *pg;
  int e;
  if (disk_tier_put_begin(dt, salt, tok, d, 1, np, &e, &sl, &pg) != 0) return -1;
  rd_slot(NULL, s, sl);
  for (int k = 0; k < np; k++) rd_page(NULL, pages[k], (unsigned char *)pg + k * PB);
  disk_tier_put_commit(dt, e);
  return e;
}

static void dev_fill(void) {
  for (int p = 0; p < 16; p++) memset(dev_page[p], 0x10 + p, PB);
  for (int s = 0; s < 4; s++) memset(dev_slot[s], 0xa0 + s, SB);
}

/* the entry whose depth is d, or -1 */
static int find_depth(const disk_tier *dt, int d) {
  for (int i = 0; i < disk_tier_handles(dt); i++)
    if (disk_tier_live(dt, i) && disk_tier_entry_depth(dt, i) == d) return i;
  return -1;
}

/* ---- unit tests ---------------------------------------------------------------------------- */

TEST(round_trip_and_restart) {
  dir_clean(DIRNAME);
  dev_fill();
  disk_tier_opts o = unit_opts(1 << 20, 77);
  disk_tier *dt;
  char err[300];
  REQUIRE(disk_tier_open(&dt, &o, err, sizeof err) == 0);
  int32_t src[3] = {1, 2, 3}, dst[3] = {10, 11, 12};
  int e = put(dt, "", 40, 5, 1, src, 3);
  REQUIRE(e >= 0);
  int e2 = put(dt, "tenant", 20, 6, 2, src, 2);
  REQUIRE(e2 >= 0);
  EXPECT(put(dt, "", 40, 5, 1, src, 3) < 0); /* the same key twice */
  /* read at once: from the queued image or the file, whichever is there */
  EXPECT(disk_tier_read(dt, e, 3, dst, 3) == 0);
  for (int k = 0; k < 3; k++) EXPECT(!memcmp(dev_page[dst[k]], dev_page[src[k]], PB));
  EXPECT(!memcmp(dev_slot[3], dev_slot[1], SB));
  disk_tier_flush(dt);
  EXPECT_EQ_INT(dir_ckpts(DIRNAME, NULL, 0, NULL), 2);
  disk_tier_touch(dt, e); /* e is now newer than e2 */
  EXPECT(tier_ok(dt));
  disk_tier_stats st;
  disk_tier_get_stats(dt, &st);
  EXPECT_EQ_INT(st.writes, 2);
  EXPECT_EQ_INT(st.hits, 1);
  size_t bytes = disk_tier_bytes(dt);
  disk_tier_close(dt);

  /* restart: the index comes back from the files, in the same LRU order */
  dev_fill();
  REQUIRE(disk_tier_open(&dt, &o, err, sizeof err) == 0);
  EXPECT_EQ_INT(disk_tier_count(dt), 2);
  EXPECT(disk_tier_bytes(dt) == bytes);
  int a = find_depth(dt, 40), b = find_depth(dt, 20);
  REQUIRE(a >= 0 && b >= 0);
  EXPECT_EQ_INT(disk_tier_oldest(dt), b);
  EXPECT_STR(disk_tier_entry_salt(dt, b), "tenant");
  int32_t want[40];
  toks(want, 40, 5);
  EXPECT(!memcmp(disk_tier_entry_tokens(dt, a), want, sizeof want));
  memset(dev_page[10], 0, PB);
  memset(dev_slot[3], 0, SB);
  EXPECT(disk_tier_read(dt, a, 3, dst, 3) == 0);
  EXPECT(!memcmp(dev_page[10], dev_page[1], PB));
  EXPECT(!memcmp(dev_slot[3], dev_slot[1], SB));
  disk_tier_drop(dt, b);
  disk_tier_flush(dt);
  EXPECT_EQ_INT(dir_ckpts(DIRNAME, NULL, 0, NULL), 1);
  EXPECT(tier_ok(dt));
  disk_tier_close(dt);
}

/* flips one byte of a file at offset off (negative: from the end) */
static void flip(const char *path, long off) {
  int fd = open(path, O_RDWR);
  REQUIRE(fd >= 0);
  struct stat sb;
  fstat(fd, &sb);
  off_t at = off < 0 ? sb.st_size + off : off;
  unsigned char c;
  REQUIRE(pread(fd, &c, 1, at) == 1);
  c ^= 0x40;
  REQUIRE(pwrite(fd, &c, 1, at) == 1);
  close(fd);
}

/* one checkpoint file written under model 77 and flushed; its path into path */
static void one_file(char *path, size_t n) {
  dir_clean(DIRNAME);
  dev_fill();
  disk_tier_opts o = unit_opts(1 << 20, 77);
  disk_tier *dt;
  char err[300];
  REQUIRE(disk_tier_open(&dt, &o, err, sizeof err) == 0);
  int32_t src[3] = {1, 2, 3};
  REQUIRE(put(dt, "", 40, 5, 1, src, 3) >= 0);
  disk_tier_close(dt); /* flushes */
  REQUIRE(dir_ckpts(DIRNAME, path, n, NULL) == 1);
}

/* opens under model id, expecting `files` entries and `dropped` files dropped */
static disk_tier *reopen(uint64_t id, int files, int dropped) {
  disk_tier_opts o = unit_opts(1 << 20, id);
  disk_tier *dt;
  char err[300];
  if (disk_tier_open(&dt, &o, err, sizeof err) != 0) {
    printf("open: %s\n", err);
    return NULL;
  }
  disk_tier_stats st;
  disk_tier_get_stats(dt, &st);
  EXPECT_EQ_INT(disk_tier_count(dt), files);
  EXPECT_EQ_INT(st.files_dropped, dropped);
  EXPECT_EQ_INT(dir_ckpts(DIRNAME, NULL, 0, NULL), files);
  return dt;
}

TEST(corrupt_payload_never_restored) {
  char path[512];
  one_file(path, sizeof path);
  flip(path, -40);                  /* a byte of the last page image */
  disk_tier *dt = reopen(77, 1, 0); /* the header is sound: indexed, checked on read */
  REQUIRE(dt);
  dev_fill();
  int32_t dst[3] = {10, 11, 12};
  unsigned char before[PB], slot_before[SB];
  memcpy(before, dev_page[10], PB);
  memcpy(slot_before, dev_slot[3], SB);
  EXPECT(disk_tier_read(dt, find_depth(dt, 40), 3, dst, 3) == -1);
  EXPECT(!memcmp(dev_page[10], before, PB)); /* nothing reached the device */
  EXPECT(!memcmp(dev_slot[3], slot_before, SB));
  disk_tier_stats st;
  disk_tier_get_stats(dt, &st);
  EXPECT_EQ_INT(st.read_failures, 1);
  EXPECT_EQ_INT(st.hits, 0);
  disk_tier_close(dt);
}

TEST(damaged_header_truncated_foreign_dropped) {
  char path[512];
  one_file(path, sizeof path);
  flip(path, 100); /* a token of the key: the header hash fails */
  disk_tier *dt = reopen(77, 0, 1);
  disk_tier_close(dt);

  one_file(path, sizeof path);
  REQUIRE(truncate(path, 300) == 0);
  dt = reopen(77, 0, 1);
  disk_tier_close(dt);

  one_file(path, sizeof path);
  dt = reopen(78, 0, 1); /* another model's identity */
  disk_tier_close(dt);

  /* another format version, in an otherwise well-formed header (its hash recomputed) */
  one_file(path, sizeof path);
  int fd = open(path, O_RDWR);
  REQUIRE(fd >= 0);
  unsigned char h[96 + 160];
  REQUIRE(pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h);
  uint32_t v = DISK_TIER_FORMAT + 1;
  memcpy(h + 8, &v, 4);
  uint64_t hh = disk_tier_hash(h, 88, 0x68647275ull);
  hh = disk_tier_hash(h + 96, 160, hh); /* the key: 40 tokens, no salt */
  memcpy(h + 88, &hh, 8);
  REQUIRE(pwrite(fd, h, 96, 0) == 96);
  close(fd);
  dt = reopen(77, 0, 1);
  disk_tier_close(dt);

  /* the untouched file under its own model: kept (the test above can fail) */
  one_file(path, sizeof path);
  dt = reopen(77, 1, 0);
  disk_tier_close(dt);
}

/* polls disk_tier_prefetch until the read ahead is done (a generous ceiling, never a timing
 * assertion); returns its last answer */
static int prefetch_wait(disk_tier *dt, int e) {
  for (int k = 0; k < 60000; k++) {
    if (disk_tier_prefetch(dt, e)) return 1;
    usleep(1000);
  }
  return 0;
}

/* the reader thread reads a file ahead: the read then only copies; a corrupt file read ahead
 * fails the read with nothing written; an entry dropped while read ahead leaks nothing */
TEST(read_ahead) {
  dir_clean(DIRNAME);
  dev_fill();
  disk_tier_opts o = unit_opts(1 << 20, 77);
  disk_tier *dt;
  char err[300];
  REQUIRE(disk_tier_open(&dt, &o, err, sizeof err) == 0);
  int32_t src[3] = {1, 2, 3}, dst[3] = {10, 11, 12};
  int a = put(dt, "", 40, 5, 1, src, 3), b = put(dt, "", 30, 6, 2, src, 2),
      c = put(dt, "", 20, 7, 0, src, 2);
  REQUIRE(a >= 0 && b >= 0 && c >= 0);
  disk_tier_flush(dt); /* on disk now: a prefetch must read */
  EXPECT_EQ_INT(disk_tier_prefetch(dt, a), 0);
  EXPECT(prefetch_wait(dt, a));
  EXPECT(disk_tier_read(dt, a, 3, dst, 3) == 0);
  for (int k = 0; k < 3; k++) EXPECT(!memcmp(dev_page[dst[k]], dev_page[src[k]], PB));
  EXPECT(!memcmp(dev_slot[3], dev_slot[1], SB));
  disk_tier_prefetch(dt, c);
  disk_tier_drop(dt, c); /* dropped while (or after) read ahead */
  disk_tier_stats st;
  disk_tier_get_stats(dt, &st);
  EXPECT_EQ_INT(st.hits, 1);
  disk_tier_close(dt);

  char path[512];
  one_file(path, sizeof path);
  flip(path, -40);
  dt = reopen(77, 1, 0);
  REQUIRE(dt);
  int e = find_depth(dt, 40);
  dev_fill();
  unsigned char before[PB];
  memcpy(before, dev_page[10], PB);
  EXPECT(prefetch_wait(dt, e));
  EXPECT(disk_tier_read(dt, e, 3, dst, 3) == -1);
  EXPECT(!memcmp(dev_page[10], before, PB));
  disk_tier_close(dt);
  (void)b;
}

TEST(budget_lru_and_shrink) {
  dir_clean(DIRNAME);
  dev_fill();
  disk_tier_opts o = unit_opts(1 << 20, 77);
  disk_tier *dt;
  char err[300];
  REQUIRE(disk_tier_open(&dt, &o, err, sizeof err) == 0);
  size_t one = disk_tier_file_size(dt, 0, 40, 1, 3);
  disk_tier_close(dt);
  o.budget = 3 * one; /* three files of depth 40 */
  REQUIRE(disk_tier_open(&dt, &o, err, sizeof err) == 0);
  int32_t src[3] = {1, 2, 3};
  int e[3];
  for (int k = 0; k < 3; k++) REQUIRE((e[k] = put(dt, "", 40, 100 + k, 1, src, 3)) >= 0);
  EXPECT(put(dt, "", 40, 200, 1, src, 3) < 0); /* full: refused, the caller evicts */
  EXPECT(disk_tier_bytes(dt) <= disk_tier_budget(dt));
  EXPECT_EQ_INT(disk_tier_oldest(dt), e[0]);
  disk_tier_touch(dt, e[0]);
  EXPECT_EQ_INT(disk_tier_oldest(dt), e[1]);
  disk_tier_drop(dt, disk_tier_oldest(dt));
  EXPECT(put(dt, "", 40, 200, 1, src, 3) >= 0);
  EXPECT(tier_ok(dt));
  disk_tier_close(dt);
  EXPECT_EQ_INT(dir_ckpts(DIRNAME, NULL, 0, NULL), 3);
  /* a smaller budget at the next start: the least recently used files go */
  o.budget = 2 * one;
  REQUIRE(disk_tier_open(&dt, &o, err, sizeof err) == 0);
  EXPECT_EQ_INT(disk_tier_count(dt), 2);
  disk_tier_flush(dt);
  EXPECT_EQ_INT(dir_ckpts(DIRNAME, NULL, 0, NULL), 2);
  int32_t t0[40];
  toks(t0, 40, 100); /* e[0], touched, survives; e[2] (seed 102) was older */
  int kept0 = 0;
  for (int i = 0; i < disk_tier_handles(dt); i++)
    kept0 |= disk_tier_live(dt, i) && !memcmp(disk_tier_entry_tokens(dt, i), t0, sizeof t0);
  EXPECT(kept0);
  disk_tier_close(dt);
}

TEST(lock_refuses_second_and_tmp_cleaned) {
  dir_clean(DIRNAME);
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s/0123456789abcdef.ckpt.tmp", DIRNAME);
  FILE *f = fopen(tmp, "w");
  REQUIRE(f);
  fputs("half a file", f);
  fclose(f);
  disk_tier_opts o = unit_opts(1 << 20, 77);
  disk_tier *a, *b;
  char err[300] = "";
  REQUIRE(disk_tier_open(&a, &o, err, sizeof err) == 0);
  EXPECT(access(tmp, F_OK) != 0); /* a crash's temporary file is gone */
  EXPECT(disk_tier_open(&b, &o, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "in use by another deltaserve process") != NULL, "err: %s", err);
  disk_tier_close(a);
  EXPECT(disk_tier_open(&b, &o, err, sizeof err) == 0); /* free again */
  disk_tier_close(b);
}

/* ---- under the engine ---------------------------------------------------------------------- */

static int req_same(const req *a, const req *b) {
  return a->finish == b->finish && a->n_tok == b->n_tok && a->n_lg == b->n_lg &&
         memcmp(a->tok, b->tok, (size_t)a->n_tok * sizeof(int32_t)) == 0 &&
         memcmp(a->lg, b->lg, (size_t)(a->n_lg < MAXTOK ? a->n_lg : MAXTOK) * V * sizeof(float)) ==
             0;
}

static kv_events *EV; /* the engines' KV-events publisher (NULL: none) */

/* rig_up with a disk tier in DIRNAME (gib 0: none) under identity id */
static int disk_up(rig *g, const rig_opts *ro, double gib, uint64_t id) {
  engine_opts o;
  engine_opts_default(&o);
  o.max_num_batched_tokens = 8192;
  o.kv_cache_tokens = ro->kv_tokens;
  o.max_num_seqs = ro->seqs ? ro->seqs : 8;
  o.enable_prefix_caching = 1;
  o.n_snapshot_slabs = ro->slabs;
  o.prefix_cache_gib = ro->dev_gib;
  o.host_cache_gib = ro->host_gib;
  o.disk_cache_dir = gib > 0 ? DIRNAME : NULL;
  o.disk_cache_gib = gib;
  o.model_identity = id;
  o.kv_events = EV;
  qwen35_mem_opts mo;
  char err[300];
  g->e = NULL;
  g->m = NULL;
  if (engine_mem_plan(&o, &C, &mo, err, sizeof err) ||
      qwen35_init(&g->m, &C, &W, BE, &mo, err, sizeof err)) {
    printf("rig: %s\n", err);
    return -1;
  }
  g->e = engine_create(g->m, &o, err, sizeof err);
  if (!g->e) printf("rig: %s\n", err);
  return g->e ? 0 : -1;
}

static int32_t S[MAXP], PA[MAXP], PB_[MAXP], PF[MAXP];
static req A, B, F, REF, HB;
static const int32_t BND[2] = {0, 80};

/* One device slab's budget (1.5 slabs), 12 KV pages: A's checkpoint at 80 leaves the device
 * (its slab for A's next capture, its pages for F); B (sharing 80 tokens) restores it.
 * host_gib 0: it goes straight to disk; with host_gib it goes to the host tier (and on, when
 * the disk tier is also on and the host tier is full). Returns the engine's stats after B. */
static void spill_scenario(double host_slabs, double disk_gib, req *b_out, engine_stats *s) {
  toks(S, 80, 41);
  prompt_make(PA, S, 80, 110, 42, 7);
  prompt_make(PB_, S, 80, 105, 43, 8);
  toks(PF, 150, 44);
  PF[0] = S[0] == 200 ? 201 : 200;
  rig g;
  rig_opts ro = {.cache = 1, .kv_tokens = 16 * 12, .seqs = 2, .slabs = 4};
  double gib = 1024.0 * 1024.0 * 1024.0;
  {
    rig t;
    rig_opts r0 = {0};
    REQUIRE(rig_up(&t, &r0) == 0);
    ro.dev_gib = 1.5 * (double)qwen35_slot_bytes(t.m) / gib;
    if (host_slabs > 0)
      ro.host_gib = (host_slabs * (double)qwen35_slot_bytes(t.m) +
                     host_slabs * 16.0 * (double)qwen35_page_bytes(t.m)) /
                    gib;
    rig_down(&t);
  }
  REQUIRE(disk_up(&g, &ro, disk_gib, 1) == 0);
  req_set(&A, PA, 110, BND, 2, NULL, 0);
  req_run(&g, &A);
  req_set(&F, PF, 150, NULL, 0, NULL, 0);
  req_run(&g, &F);
  EXPECT_EQ_INT(F.finish, FINISH_LENGTH);
  req_set(b_out, PB_, 105, BND, 2, NULL, 0);
  req_run(&g, b_out);
  engine_get_stats(g.e, s);
  EXPECT(rig_down(&g));
}

TEST(spill_restore_parity_vs_cold_and_host) {
  dir_clean(DIRNAME);
  engine_stats s;
  spill_scenario(4, 0, &HB, &s); /* the host tier alone */
  EXPECT_EQ_INT(HB.cached, 80);
  EXPECT_MSG(s.prefix_host_checkpoints >= 1 || s.prefix_demotions >= 1, "no host demotion");
  spill_scenario(0, 0.01, &B, &s); /* the disk tier alone */
  EXPECT_EQ_INT(B.cached, 80);
  EXPECT_MSG(s.disk_spills >= 1 && s.disk_hits == 1, "spills %lld, disk hits %lld", s.disk_spills,
             s.disk_hits);
  EXPECT_EQ_INT(s.prefix_restore_failures, 0);
  int32_t sp[1] = {104};
  REQUIRE(cold(&REF, &B, sp, 1) == 0);
  EXPECT_MSG(req_same(&B, &REF), "restore from the disk tier differs from cold");
  EXPECT_MSG(req_same(&B, &HB), "restore from the disk tier differs from the host tier's");
  printf("  disk: %lld spills, %lld files written (%.1f KiB), %lld restored\n", s.disk_spills,
         s.disk_writes, s.disk_write_bytes / 1024.0, s.disk_hits);
  dir_clean(DIRNAME);
  spill_scenario(1, 0.01, &B, &s); /* host tier of one checkpoint, then the disk */
  EXPECT_EQ_INT(B.cached, 80);
  EXPECT_MSG(req_same(&B, &REF), "host + disk restore differs from cold");
}

/* A then a restart: B and A again hit the files the first engine wrote at shutdown */
TEST(restart_warm_dir_hits) {
  dir_clean(DIRNAME);
  toks(S, 80, 61);
  prompt_make(PA, S, 80, 110, 62, 7);
  prompt_make(PB_, S, 80, 105, 63, 8);
  rig g;
  rig_opts ro = {.cache = 1, .seqs = 2};
  REQUIRE(disk_up(&g, &ro, 0.01, 5) == 0);
  req_set(&A, PA, 110, BND, 2, NULL, 0);
  req_run(&g, &A);
  EXPECT_EQ_INT(A.cached, 0);
  EXPECT(rig_down(&g)); /* writes its checkpoints */
  int files = dir_ckpts(DIRNAME, NULL, 0, NULL);
  EXPECT_MSG(files >= 2, "%d files after shutdown", files);

  REQUIRE(disk_up(&g, &ro, 0.01, 5) == 0);
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.disk_checkpoints, files);
  req_set(&B, PB_, 105, BND, 2, NULL, 0);
  req_run(&g, &B);
  EXPECT_EQ_INT(B.cached, 80);
  static req A2;
  req_set(&A2, PA, 110, BND, 2, NULL, 0);
  req_run(&g, &A2);
  EXPECT_EQ_INT(A2.cached, 109); /* END of A: an exact repeat recomputes one token */
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.disk_hits, 2);
  /* the checkpoint at 80 came back to the device with B's restore: C's hit reads no file */
  static int32_t PC[MAXP];
  static req Cr, CREF;
  prompt_make(PC, S, 80, 100, 64, 9);
  req_set(&Cr, PC, 100, BND, 2, NULL, 0);
  req_run(&g, &Cr);
  EXPECT_EQ_INT(Cr.cached, 80);
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.disk_hits, 2);
  EXPECT(rig_down(&g));
  int32_t sp[1] = {104}, spc[1] = {99};
  REQUIRE(cold(&REF, &B, sp, 1) == 0);
  EXPECT_MSG(req_same(&B, &REF), "restore after a restart differs from cold");
  REQUIRE(cold(&CREF, &Cr, spc, 1) == 0);
  EXPECT_MSG(req_same(&Cr, &CREF), "restore of the promoted checkpoint differs from cold");
  EXPECT_MSG(req_same(&A2, &A), "A after a restart differs from A");
}

/* every file corrupt (payload), or written under another model: B runs cold, nothing is
 * restored, the failures are counted and the engine checks clean */
TEST(corrupt_or_foreign_files_run_cold) {
  for (int mode = 0; mode < 2; mode++) {
    dir_clean(DIRNAME);
    toks(S, 80, 71);
    prompt_make(PA, S, 80, 110, 72, 7);
    prompt_make(PB_, S, 80, 105, 73, 8);
    rig g;
    rig_opts ro = {.cache = 1, .seqs = 2};
    REQUIRE(disk_up(&g, &ro, 0.01, 5) == 0);
    req_set(&A, PA, 110, BND, 2, NULL, 0);
    req_run(&g, &A);
    EXPECT(rig_down(&g));
    int files = dir_ckpts(DIRNAME, NULL, 0, NULL);
    REQUIRE(files >= 1);
    if (mode == 0) {
      DIR *dd = opendir(DIRNAME);
      struct dirent *de;
      while ((de = readdir(dd))) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 5, ".ckpt")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", DIRNAME, de->d_name);
        flip(p, -100);
      }
      closedir(dd);
    }
    REQUIRE(disk_up(&g, &ro, 0.01, mode == 0 ? 5 : 6) == 0);
    req_set(&B, PB_, 105, BND, 2, NULL, 0);
    req_run(&g, &B);
    EXPECT_EQ_INT(B.cached, 0);
    engine_stats s;
    engine_get_stats(g.e, &s);
    EXPECT_EQ_INT(s.disk_hits, 0);
    if (mode == 0)
      EXPECT_MSG(s.disk_read_failures >= 1, "read failures %lld", s.disk_read_failures);
    else
      EXPECT_EQ_INT(s.disk_files_dropped, files);
    EXPECT(rig_down(&g));
    int32_t sp[1] = {104};
    REQUIRE(cold(&REF, &B, sp, 1) == 0);
    EXPECT_MSG(req_same(&B, &REF), "mode %d: B differs from cold", mode);
  }
}

/* a disk budget of about two checkpoints under a stream of distinct prompts: the files never
 * exceed it, the oldest go first */
TEST(engine_disk_budget_lru) {
  dir_clean(DIRNAME);
  rig g;
  rig_opts ro = {.cache = 1, .kv_tokens = 16 * 12, .seqs = 2, .slabs = 4};
  double gib = 1024.0 * 1024.0 * 1024.0, one;
  {
    rig t;
    rig_opts r0 = {0};
    REQUIRE(rig_up(&t, &r0) == 0);
    ro.dev_gib = 1.5 * (double)qwen35_slot_bytes(t.m) / gib;
    one = (double)qwen35_slot_bytes(t.m) + 7 * (double)qwen35_page_bytes(t.m) + 1024;
    rig_down(&t);
  }
  double budget = 2.5 * one;
  REQUIRE(disk_up(&g, &ro, budget / gib, 9) == 0);
  engine_stats s;
  for (int k = 0; k < 6; k++) {
    toks(S, 80, 300 + (uint32_t)k);
    S[0] = 10 + k; /* distinct first tokens: nothing shared */
    prompt_make(PA, S, 80, 100, 400 + (uint32_t)k, 7);
    req_set(&A, PA, 100, BND, 2, NULL, 0);
    req_run(&g, &A);
    engine_get_stats(g.e, &s);
    EXPECT_MSG(s.disk_bytes <= s.disk_budget_bytes, "%zu bytes over %zu", s.disk_bytes,
               s.disk_budget_bytes);
  }
  EXPECT_MSG(s.disk_evictions >= 1 && s.disk_spills >= 3, "evictions %lld spills %lld",
             s.disk_evictions, s.disk_spills);
  EXPECT(rig_down(&g));
  long long bytes;
  int files = dir_ckpts(DIRNAME, NULL, 0, &bytes);
  EXPECT_MSG(bytes <= (long long)budget && files >= 1, "%d files, %lld bytes, budget %.0f", files,
             bytes, budget);
}

/* the disk tier's fault sites, sticky: no file is written (alloc) or none is read (read); the
 * request after the restart runs cold, and every check stays clean */
TEST(faults_at_disk_sites) {
  static const char *sites[] = {"disk_tier_alloc", "disk_tier_read"};
  for (int k = 0; k < 2; k++) {
    dir_clean(DIRNAME);
    toks(S, 80, 81);
    prompt_make(PA, S, 80, 110, 82, 7);
    prompt_make(PB_, S, 80, 105, 83, 8);
    rig g;
    rig_opts ro = {.cache = 1, .seqs = 2};
    REQUIRE(disk_up(&g, &ro, 0.01, 5) == 0);
    if (k == 0) fault_arm(1, sites[k], 1);
    req_set(&A, PA, 110, BND, 2, NULL, 0);
    req_run(&g, &A);
    EXPECT(rig_down(&g));
    fault_disarm();
    int files = dir_ckpts(DIRNAME, NULL, 0, NULL);
    EXPECT_MSG(k == 0 ? files == 0 : files >= 1, "site %s: %d files", sites[k], files);
    REQUIRE(disk_up(&g, &ro, 0.01, 5) == 0);
    if (k == 1) fault_arm(1, sites[k], 1);
    req_set(&B, PB_, 105, BND, 2, NULL, 0);
    req_run(&g, &B);
    fault_disarm();
    EXPECT_EQ_INT(B.cached, 0);
    EXPECT(rig_down(&g));
    int32_t sp[1] = {104};
    REQUIRE(cold(&REF, &B, sp, 1) == 0);
    EXPECT_MSG(req_same(&B, &REF), "site %s: B differs from cold", sites[k]);
  }
}

/* with KV-cache events on, spills, restores and a restart keep the events' table equal to
 * what the tiers hold (prefix_cache_check runs pc_events_check at every rig_down) */
TEST(spill_and_restart_with_events) {
  kv_events_config cfg;
  kv_events_config_default(&cfg);
  cfg.enable = cfg.publisher_zmq = 1;
  snprintf(cfg.endpoint, sizeof cfg.endpoint, "inproc://ds-disk-tier-test");
  char err[300];
  REQUIRE(kv_events_init(&EV, &cfg, err, sizeof err) == 0);
  dir_clean(DIRNAME);
  engine_stats s;
  spill_scenario(0, 0.01, &B, &s);
  EXPECT_EQ_INT(B.cached, 80);
  EXPECT(s.disk_spills >= 1 && s.disk_hits == 1);
  rig g;
  rig_opts ro = {.cache = 1, .seqs = 2};
  REQUIRE(disk_up(&g, &ro, 0.01, 1) == 0); /* the files of the scenario, announced at start */
  static req B2;
  req_set(&B2, PB_, 105, BND, 2, NULL, 0);
  req_run(&g, &B2);
  EXPECT_MSG(B2.cached > 0, "cached %d", B2.cached);
  EXPECT(rig_down(&g));
  kv_events_free(EV);
  EV = NULL;
}

int main(void) {
  char err[256];
  log_set_level(LOG_LEVEL_ERROR);
  snprintf(DIRNAME, sizeof DIRNAME, "/tmp/ds_disk_tier_XXXXXX");
  if (!mkdtemp(DIRNAME)) {
    printf("FAIL mkdtemp\n");
    return 1;
  }
  RUN(round_trip_and_restart);
  RUN(corrupt_payload_never_restored);
  RUN(damaged_header_truncated_foreign_dropped);
  RUN(read_ahead);
  RUN(budget_lru_and_shrink);
  RUN(lock_refuses_second_and_tmp_cleaned);
  if (model_load(MODEL_DIR, &C, &W, err, sizeof err) != 0) {
    printf("FAIL load: %s\n", err);
    return 1;
  }
  BE = backend_cpu_create(2);
  if (!BE) {
    printf("FAIL backend\n");
    return 1;
  }
  V = (size_t)C.vocab_size;
  RUN(spill_restore_parity_vs_cold_and_host);
  RUN(restart_warm_dir_hits);
  RUN(corrupt_or_foreign_files_run_cold);
  RUN(engine_disk_budget_lru);
  RUN(faults_at_disk_sites);
  RUN(spill_and_restart_with_events);
  BE->destroy(BE);
  weights_free(&W);
  dir_clean(DIRNAME);
  char lock[96];
  snprintf(lock, sizeof lock, "%s/lock", DIRNAME);
  unlink(lock);
  rmdir(DIRNAME);
  TEST_MAIN_END();
}
