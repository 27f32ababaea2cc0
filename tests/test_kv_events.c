/* test_kv_events — the KV-cache events: block names against an independent implementation
 * (docs/kv-events.md's Python), the --kv-events-config parser, and the prefix cache's events
 * received over a real ZeroMQ socket and decoded against vLLM's schema, checked after every
 * operation against the cache's own records, and the replay socket. */
#include <dirent.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "cache/block_hash.h"
#include "cache/disk_tier.h"
#include "cache/kv_events.h"
#include "cache/pc_events.h"
#include "prefix_cache_fake.h"
#include "test.h"

/* from docs/kv-events.md's block_hash in Python, tokens 1..40 */
TEST(block_hash_reference) {
  int32_t t[40];
  for (int i = 0; i < 40; i++) t[i] = i + 1;
  uint64_t h[2];
  EXPECT(block_hash_chain(t, 40, NULL, h) == 2);
  EXPECT(h[0] == 0x2f1c6cd26bfc9e65ull && h[1] == 0x417bb6245be30bcull);
  EXPECT(block_hash_chain(t, 40, "", h) == 2 && h[0] == 0x2f1c6cd26bfc9e65ull);
  EXPECT(block_hash_chain(t, 40, "tenant-a", h) == 2);
  EXPECT(h[0] == 0x4eb17aedf227f93ull && h[1] == 0xf0f6ce1f011cc960ull);
  block_hash_chain(t, 40, NULL, h);
  EXPECT(block_hash(h[1], t + 32, 8, NULL) == 0xf2c474581f61ecb4ull);
}

TEST(config_parse) {
  kv_events_config c;
  char err[256];
  EXPECT(kv_events_config_parse("{}", &c, err, sizeof err) == 0);
  EXPECT(!c.enable && !c.publisher_zmq && !strcmp(c.endpoint, "tcp://*:5557"));
  EXPECT(c.buffer_steps == 10000 && c.hwm == 100000 && c.max_queue_size == 100000);
  EXPECT(!c.replay_endpoint[0] && !c.topic[0]);
  EXPECT(kv_events_config_parse("{\"enable_kv_cache_events\": true, \"endpoint\": "
                                "\"tcp://*:6000\", \"replay_endpoint\": \"tcp://*:6001\", "
                                "\"buffer_steps\": 5, \"hwm\": 7, \"topic\": \"kv\"}",
                                &c, err, sizeof err) == 0);
  EXPECT(c.enable && c.publisher_zmq && !strcmp(c.endpoint, "tcp://*:6000"));
  EXPECT(!strcmp(c.replay_endpoint, "tcp://*:6001") && c.buffer_steps == 5 && c.hwm == 7);
  EXPECT(!strcmp(c.topic, "kv"));
  EXPECT(kv_events_config_parse("{\"enable_kv_cache_events\": true, \"publisher\": \"null\"}", &c,
                                err, sizeof err) == 0 &&
         !c.publisher_zmq);
  EXPECT(kv_events_config_parse("{\"enable_kv_cache_events\": true, \"publisher\": \"nats\"}", &c,
                                err, sizeof err) == -1 &&
         strstr(err, "publisher"));
  EXPECT(kv_events_config_parse("{\"enable_kv_cache_events\": true, \"colour\": 1}", &c, err,
                                sizeof err) == -1 &&
         strstr(err, "unknown key 'colour'"));
  EXPECT(kv_events_config_parse("{\"hwm\": \"big\"}", &c, err, sizeof err) == -1 &&
         strstr(err, "'hwm'"));
  EXPECT(kv_events_config_parse("{\"buffer_steps\": -1}", &c, err, sizeof err) == -1);
  EXPECT(kv_events_config_parse("[1]", &c, err, sizeof err) == -1);
  EXPECT(kv_events_config_parse("{", &c, err, sizeof err) == -1 && strstr(err, "not JSON"));
}

/* ---------------------------------------------------------------- a consumer in C */

typedef struct held {
  uint64_t h;
  int medium; /* 0 GPU, 1 CPU, 2 DISK */
} held;

typedef struct consumer {
  void *ctx, *sub, *req; /* req: a DEALER on the replay socket */
  held blocks[4096];
  int n_blocks;
  held states[1024];
  int n_states;
  long long events, next_seq;
  int cleared;
  char why[256];
} consumer;

static int medium_of(const msgpack_object *o) {
  if (o->type != MSGPACK_OBJECT_STR) return -1;
  if (o->via.str.size == 3 && !memcmp(o->via.str.ptr, "GPU", 3)) return 0;
  if (o->via.str.size == 3 && !memcmp(o->via.str.ptr, "CPU", 3)) return 1;
  if (o->via.str.size == 4 && !memcmp(o->via.str.ptr, "DISK", 4)) return 2;
  return -1;
}

static int tag_is(const msgpack_object *o, const char *t) {
  return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(t) &&
         !memcmp(o->via.str.ptr, t, strlen(t));
}

static int held_find(const held *a, int n, uint64_t h, int m) {
  for (int i = 0; i < n; i++)
    if (a[i].h == h && a[i].medium == m) return i;
  return -1;
}

#define BAD(...) (snprintf(c->why, sizeof c->why, __VA_ARGS__), -1)

/* One event against vLLM's array_like schema; updates the consumer's view. */
static int consume_event(consumer *c, const msgpack_object *e) {
  if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size < 1) return BAD("event not an array");
  const msgpack_object *f = e->via.array.ptr;
  uint32_t n = e->via.array.size;
  c->events++;
  if (tag_is(&f[0], "BlockStored")) {
    /* [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
     *  extra_keys?] */
    if (n != 8 && n != 9) return BAD("BlockStored of %u fields", n);
    if (f[1].type != MSGPACK_OBJECT_ARRAY || f[3].type != MSGPACK_OBJECT_ARRAY)
      return BAD("BlockStored lists");
    uint32_t nb = f[1].via.array.size;
    if (nb == 0 || f[3].via.array.size != nb * 16 || f[4].via.u64 != 16 ||
        f[5].type != MSGPACK_OBJECT_NIL || f[7].type != MSGPACK_OBJECT_NIL)
      return BAD("BlockStored fields");
    int m = medium_of(&f[6]);
    if (m < 0) return BAD("BlockStored medium");
    uint64_t parent = 0;
    if (f[2].type == MSGPACK_OBJECT_POSITIVE_INTEGER)
      parent = f[2].via.u64;
    else if (f[2].type != MSGPACK_OBJECT_NIL)
      return BAD("parent_block_hash type");
    char salt[64] = "";
    if (n == 9) { /* extra_keys: [[salt], nil...] */
      const msgpack_object *x = &f[8];
      if (x->type != MSGPACK_OBJECT_ARRAY || x->via.array.size != nb ||
          x->via.array.ptr[0].type != MSGPACK_OBJECT_ARRAY ||
          x->via.array.ptr[0].via.array.size != 1 || f[2].type != MSGPACK_OBJECT_NIL)
        return BAD("extra_keys");
      const msgpack_object *s = &x->via.array.ptr[0].via.array.ptr[0];
      if (s->type != MSGPACK_OBJECT_STR || s->via.str.size >= sizeof salt) return BAD("salt");
      memcpy(salt, s->via.str.ptr, s->via.str.size);
    }
    int32_t tok[16];
    for (uint32_t k = 0; k < nb; k++) {
      for (int j = 0; j < 16; j++) tok[j] = (int32_t)f[3].via.array.ptr[k * 16 + j].via.i64;
      uint64_t want =
          block_hash(parent, tok, 16, k == 0 && f[2].type == MSGPACK_OBJECT_NIL ? salt : NULL);
      uint64_t h = f[1].via.array.ptr[k].via.u64;
      if (h != want)
        return BAD("block %u: hash %llx, computed %llx", k, (unsigned long long)h,
                   (unsigned long long)want);
      if (held_find(c->blocks, c->n_blocks, h, m) >= 0) return BAD("block stored twice");
      if (c->n_blocks == 4096) return BAD("too many blocks");
      c->blocks[c->n_blocks++] = (held){h, m};
      parent = h;
    }
    return 0;
  }
  if (tag_is(&f[0], "BlockRemoved")) { /* [tag, block_hashes, medium] */
    int m = n == 3 ? medium_of(&f[2]) : -1;
    if (m < 0 || f[1].type != MSGPACK_OBJECT_ARRAY || f[1].via.array.size == 0)
      return BAD("BlockRemoved fields");
    for (uint32_t k = 0; k < f[1].via.array.size; k++) {
      int at = held_find(c->blocks, c->n_blocks, f[1].via.array.ptr[k].via.u64, m);
      if (at < 0) return BAD("removed a block never stored");
      c->blocks[at] = c->blocks[--c->n_blocks];
    }
    return 0;
  }
  if (tag_is(&f[0], "AllBlocksCleared")) {
    if (n != 1) return BAD("AllBlocksCleared fields");
    c->n_blocks = c->n_states = 0;
    c->cleared++;
    return 0;
  }
  int st = tag_is(&f[0], "DeltaServeStateStored"), sr = tag_is(&f[0], "DeltaServeStateRemoved");
  if (st || sr) { /* [tag, prefix_hash, position, cache_salt, medium] */
    int m = n == 5 ? medium_of(&f[4]) : -1;
    if (m < 0 || f[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        f[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      return BAD("state event fields");
    int at = held_find(c->states, c->n_states, f[1].via.u64, m);
    if (st) {
      if (at >= 0 || c->n_states == 1024) return BAD("state stored twice");
      c->states[c->n_states++] = (held){f[1].via.u64, m};
    } else {
      if (at < 0) return BAD("removed a state never stored");
      c->states[at] = c->states[--c->n_states];
    }
    return 0;
  }
  return BAD("unknown tag");
}

/* One batch [ts, events, dp_rank]; a state batch holds state events only. */
static int consume_batch(consumer *c, const char *data, size_t len) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  int rc = 0;
  if (msgpack_unpack_next(&u, data, len, NULL) != MSGPACK_UNPACK_SUCCESS) {
    rc = BAD("batch does not decode");
  } else {
    const msgpack_object *b = &u.data;
    if (b->type != MSGPACK_OBJECT_ARRAY || b->via.array.size != 3 ||
        b->via.array.ptr[0].type != MSGPACK_OBJECT_FLOAT64 ||
        b->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY ||
        b->via.array.ptr[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      rc = BAD("batch is not [ts, events, dp_rank]");
    int kinds = 0;
    for (uint32_t i = 0; !rc && i < b->via.array.ptr[1].via.array.size; i++) {
      const msgpack_object *e = &b->via.array.ptr[1].via.array.ptr[i];
      const msgpack_object *tag =
          e->type == MSGPACK_OBJECT_ARRAY && e->via.array.size > 0 ? &e->via.array.ptr[0] : NULL;
      kinds |= tag && tag->type == MSGPACK_OBJECT_STR && tag->via.str.size > 10 &&
                       !memcmp(tag->via.str.ptr, "DeltaServe", 10)
                   ? 2
                   : 1;
      rc = consume_event(c, e);
    }
    if (!rc && kinds == 3) rc = BAD("a batch mixes vLLM and state events");
  }
  msgpack_unpacked_destroy(&u);
  return rc;
}

static uint64_t be64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

/* Asks the replay socket for every batch from `from` on and consumes those before `upto`.
 * Returns 0 or -1. */
static int consume_replay(consumer *c, uint64_t from, uint64_t upto) {
  unsigned char start[8];
  for (int i = 0; i < 8; i++) start[i] = (unsigned char)(from >> (56 - 8 * i));
  zmq_send(c->req, "", 0, ZMQ_SNDMORE);
  zmq_send(c->req, start, 8, 0);
  static char payload[1 << 20];
  for (;;) {
    zmq_pollitem_t pi = {c->req, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&pi, 1, 10000) <= 0) return BAD("no answer from the replay socket");
    char empty[4], seq[8];
    int e = zmq_recv(c->req, empty, sizeof empty, 0);
    int s = zmq_recv(c->req, seq, sizeof seq, 0);
    int p = zmq_recv(c->req, payload, sizeof payload, 0);
    if (e != 0 || s != 8 || p < 0) return BAD("a replay answer is not [\"\", seq, payload]");
    uint64_t q = be64((unsigned char *)seq);
    if (q == UINT64_MAX) return p == 0 ? 0 : BAD("end marker with a payload");
    if (q >= upto) continue;
    if ((long long)q != c->next_seq)
      return BAD("replay seq %llu, expected %lld", (unsigned long long)q, c->next_seq);
    c->next_seq++;
    if (consume_batch(c, payload, (size_t)p)) return -1;
  }
}

/* Receives until the consumer has seen `want` events (10 s at most). Returns 0 or -1. */
static int consume_until(consumer *c, long long want) {
  for (int waited = 0; c->events < want;) {
    zmq_pollitem_t pi = {c->sub, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&pi, 1, 100) <= 0) { /* batches sent before the subscription took */
      if ((waited += 100) > 10000) return BAD("%lld of %lld events arrived", c->events, want);
      if (waited % 500 == 0 && consume_replay(c, (uint64_t)c->next_seq, UINT64_MAX)) return -1;
      continue;
    }
    char topic[16], seq[8];
    static char payload[1 << 20];
    int t = zmq_recv(c->sub, topic, sizeof topic, 0);
    int s = zmq_recv(c->sub, seq, sizeof seq, 0);
    int p = zmq_recv(c->sub, payload, sizeof payload, 0);
    if (t != 2 || memcmp(topic, "kv", 2) || s != 8 || p <= 0 || p > (int)sizeof payload)
      return BAD("a message is not [topic, seq, payload]");
    uint64_t q = be64((unsigned char *)seq);
    if ((long long)q < c->next_seq) continue; /* already had from the replay socket */
    if ((long long)q > c->next_seq && consume_replay(c, (uint64_t)c->next_seq, q)) return -1;
    if ((long long)q != c->next_seq)
      return BAD("replay left a gap before seq %llu", (unsigned long long)q);
    c->next_seq++;
    if (consume_batch(c, payload, (size_t)p)) return -1;
  }
  return 0;
}

/* The consumer's view equals the cache's table (pc_events_check ties the table to the
 * records): every (block, medium) the consumer holds is held, and as many. */
static int view_matches(consumer *c, fx *f) {
  size_t n = pc_events_held(f->pc);
  if ((size_t)c->n_blocks != n) return BAD("consumer holds %d blocks, cache %zu", c->n_blocks, n);
  for (int i = 0; i < c->n_blocks; i++)
    if (pc_events_holders(f->pc, c->blocks[i].h, c->blocks[i].medium) <= 0)
      return BAD("consumer holds a block the cache does not");
  prefix_cache_stats ps;
  prefix_cache_get_stats(f->pc, &ps);
  if (c->n_states != ps.n_checkpoints)
    return BAD("consumer holds %d states, cache %d checkpoints", c->n_states, ps.n_checkpoints);
  return 0;
}

/* A random workload over a prefix cache with events (and, with_disk, a disk tier under the host
 * tier), the subscriber's view checked after every operation. */
static void events_workload(int with_disk) {
  char ep[128], rep[128], dir[64] = "";
  snprintf(ep, sizeof ep, "ipc:///tmp/ds-kvev-%d-%d.pub", (int)getpid(), with_disk);
  snprintf(rep, sizeof rep, "ipc:///tmp/ds-kvev-%d-%d.replay", (int)getpid(), with_disk);
  kv_events_config cfg;
  kv_events_config_default(&cfg);
  cfg.enable = cfg.publisher_zmq = 1;
  snprintf(cfg.endpoint, sizeof cfg.endpoint, "%s", ep);
  snprintf(cfg.replay_endpoint, sizeof cfg.replay_endpoint, "%s", rep);
  snprintf(cfg.topic, sizeof cfg.topic, "kv");
  kv_events *ev;
  char err[256];
  REQUIRE(kv_events_init(&ev, &cfg, err, sizeof err) == 0);

  static consumer c;
  memset(&c, 0, sizeof c);
  c.ctx = zmq_ctx_new();
  c.sub = zmq_socket(c.ctx, ZMQ_SUB);
  REQUIRE(zmq_connect(c.sub, ep) == 0 && zmq_setsockopt(c.sub, ZMQ_SUBSCRIBE, "kv", 2) == 0);
  c.req = zmq_socket(c.ctx, ZMQ_DEALER);
  REQUIRE(zmq_connect(c.req, rep) == 0);

  fx f;
  size_t host = 3 * FK_SLOT_BYTES + 6 * FK_PAGE_BYTES;
  REQUIRE(fx_init(&f, 40, 2, 4, 2, host) == 0);
  prefix_cache_free(f.pc);
  prefix_cache_opts o = {0};
  o.slab_bytes = FK_SLOT_BYTES;
  o.page_bytes = FK_PAGE_BYTES;
  o.device_budget_bytes = 2 * FK_SLOT_BYTES;
  o.host_budget_bytes = host;
  o.ops = (prefix_cache_ops){&f.dev,        fk_page_copy, fk_page_read,
                             fk_page_write, fk_slot_read, fk_slot_write};
  o.events = ev;
  disk_tier *dt = NULL;
  if (with_disk) { /* room for a few files: the tier's LRU deletes some */
    snprintf(dir, sizeof dir, "/tmp/ds-kvev-disk-XXXXXX");
    REQUIRE(mkdtemp(dir) != NULL);
    disk_tier_opts dop = {
        dir,
        8192,
        77,
        FK_SLOT_BYTES,
        FK_PAGE_BYTES,
        (host_tier_ops){&f.dev, fk_page_read, fk_page_write, fk_slot_read, fk_slot_write}};
    REQUIRE(disk_tier_open(&dt, &dop, err, sizeof err) == 0);
    o.disk = dt;
  }
  REQUIRE(prefix_cache_init(&f.pc, f.kp, f.sp, &o) == 0);
  /* batches sent before the subscription arrived are fetched from the replay socket, as a
   * real consumer does on a gap */

  uint32_t rng = 777;
  int32_t toks[96];
  int checked = 0;
  for (int it = 0; it < 240 && !test_cur_failed; it++) {
    rng = rng * 1103515245u + 12345u;
    int k = (int)(rng >> 16) % 6, depth = 8 + (int)((rng >> 8) % 80);
    fk_tokens(toks, 96, k, (int)(rng >> 20) % 48);
    int op = (int)(rng >> 4) % 8;
    if (op < 5)
      fx_capture(&f, k % 3 == 1 ? "tenant" : NULL, toks, depth, k == 0 ? CHECKPOINT_PROTECT : 0);
    else if (op == 5)
      prefix_cache_evict_for_pages(f.pc, 1 + (int)(rng % 5));
    else if (op == 6)
      prefix_cache_evict_slabs(f.pc, 1);
    if (it == 100 || it == 200) prefix_cache_clear(f.pc);
    REQUIRE(fx_ok(&f)); /* includes pc_events_check: the table equals the records */
    kv_events_stats st;
    kv_events_get_stats(ev, &st);
    if (consume_until(&c, st.events) != 0) {
      EXPECT_MSG(0, "%s", c.why);
      break;
    }
    if (view_matches(&c, &f) != 0) {
      EXPECT_MSG(0, "after op %d (iteration %d): %s", op, it, c.why);
      break;
    }
    checked++;
  }
  prefix_cache_stats ps;
  prefix_cache_get_stats(f.pc, &ps);
  EXPECT_MSG(checked == 240 && ps.demotions > 0 && ps.evictions > 0 && c.cleared == 2,
             "checked %d, demotions %lld, evictions %lld, clears %d", checked, ps.demotions,
             ps.evictions, c.cleared);
  int on_disk = 0;
  for (int i = 0; i < c.n_states; i++) on_disk += c.states[i].medium == 2;
  EXPECT_MSG(!with_disk || (ps.spills > 0 && on_disk > 0), "spills %lld, DISK states %d", ps.spills,
             on_disk);

  /* the disk tier's listener: a file's blocks and state in DISK, then gone */
  int32_t d[40];
  fk_tokens(d, 40, 9, 0);
  int blocks0 = c.n_blocks, states0 = c.n_states;
  kv_events_stats st;
  pc_events_disk(f.pc, 1, "tenant", d, 40);
  kv_events_get_stats(ev, &st);
  EXPECT_MSG(consume_until(&c, st.events) == 0, "%s", c.why);
  uint64_t names[2];
  block_hash_chain(d, 40, "tenant", names);
  EXPECT(c.n_blocks == blocks0 + 2 && c.n_states == states0 + 1);
  EXPECT(held_find(c.blocks, c.n_blocks, names[1], 2) >= 0);
  EXPECT(pc_events_holders(f.pc, names[0], KV_EVENTS_MEDIUM_DISK) == 1);
  pc_events_disk(f.pc, 0, "tenant", d, 40);
  kv_events_get_stats(ev, &st);
  EXPECT_MSG(consume_until(&c, st.events) == 0, "%s", c.why);
  EXPECT(c.n_blocks == blocks0 && c.n_states == states0);
  EXPECT(pc_events_holders(f.pc, names[0], KV_EVENTS_MEDIUM_DISK) == 0);

  /* replay from 0: every batch again, in order, then the end marker */
  void *req = zmq_socket(c.ctx, ZMQ_DEALER);
  REQUIRE(zmq_connect(req, rep) == 0);
  unsigned char start[8] = {0};
  zmq_send(req, "", 0, ZMQ_SNDMORE);
  zmq_send(req, start, 8, 0);
  consumer r;
  memset(&r, 0, sizeof r);
  int done = 0;
  static char payload[1 << 20];
  while (!done) {
    zmq_pollitem_t pi = {req, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&pi, 1, 10000) <= 0) break;
    char empty[4], seq[8];
    int e = zmq_recv(req, empty, sizeof empty, 0);
    int s = zmq_recv(req, seq, sizeof seq, 0);
    int p = zmq_recv(req, payload, sizeof payload, 0);
    REQUIRE(e == 0 && s == 8 && p >= 0);
    if (be64((unsigned char *)seq) == UINT64_MAX) {
      done = p == 0;
      break;
    }
    EXPECT((long long)be64((unsigned char *)seq) == r.next_seq);
    r.next_seq++;
    if (consume_batch(&r, payload, (size_t)p)) {
      EXPECT_MSG(0, "replay: %s", r.why);
      break;
    }
  }
  EXPECT(done && r.next_seq == c.next_seq && r.events == c.events);
  EXPECT(r.n_blocks == c.n_blocks && r.n_states == c.n_states);
  zmq_close(req);
  zmq_close(c.req);
  zmq_close(c.sub);
  zmq_ctx_term(c.ctx);
  EXPECT(fx_free(&f));
  kv_events_free(ev);
  unlink(ep + 6); /* the ipc:// socket files */
  unlink(rep + 6);
  if (dt) {
    disk_tier_close(dt);
    DIR *dd = opendir(dir);
    for (struct dirent *de; dd && (de = readdir(dd));) {
      char path[400];
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
      if (de->d_name[0] != '.') unlink(path);
    }
    if (dd) closedir(dd);
    rmdir(dir);
  }
}

TEST(prefix_cache_events) { events_workload(0); }
TEST(prefix_cache_events_disk) { events_workload(1); }

/* An event that cannot be queued (out of memory: fault site "kv_events") replaces what is
 * queued with one AllBlocksCleared: the subscriber forgets the replica's blocks instead of
 * keeping a view that misses one. */
TEST(lost_event_clears) {
  char ep[128], rep[128];
  snprintf(ep, sizeof ep, "ipc:///tmp/ds-kvev-%d-f.pub", (int)getpid());
  snprintf(rep, sizeof rep, "ipc:///tmp/ds-kvev-%d-f.replay", (int)getpid());
  kv_events_config cfg;
  kv_events_config_default(&cfg);
  cfg.enable = cfg.publisher_zmq = 1;
  snprintf(cfg.endpoint, sizeof cfg.endpoint, "%s", ep);
  snprintf(cfg.replay_endpoint, sizeof cfg.replay_endpoint, "%s", rep);
  snprintf(cfg.topic, sizeof cfg.topic, "kv");
  kv_events *ev;
  char err[256];
  REQUIRE(kv_events_init(&ev, &cfg, err, sizeof err) == 0);
  static consumer c;
  memset(&c, 0, sizeof c);
  c.ctx = zmq_ctx_new();
  c.sub = zmq_socket(c.ctx, ZMQ_SUB);
  c.req = zmq_socket(c.ctx, ZMQ_DEALER);
  REQUIRE(zmq_connect(c.sub, ep) == 0 && zmq_setsockopt(c.sub, ZMQ_SUBSCRIBE, "kv", 2) == 0);
  REQUIRE(zmq_connect(c.req, rep) == 0);

  int32_t t[48];
  fk_tokens(t, 48, 3, 0);
  uint64_t h[3];
  block_hash_chain(t, 48, NULL, h);
  kv_events_stats st;
  kv_events_block_stored(ev, h, 1, 0, 0, t, NULL, KV_EVENTS_MEDIUM_GPU);
  kv_events_get_stats(ev, &st);
  EXPECT_MSG(consume_until(&c, st.events) == 0, "%s", c.why);
  EXPECT(c.n_blocks == 1);
  fault_arm(1, "kv_events", 0);
  kv_events_block_stored(ev, h + 1, 1, h[0], 1, t + 16, NULL, KV_EVENTS_MEDIUM_GPU); /* lost */
  EXPECT(fault_fired());
  fault_disarm();
  int32_t u[16];
  fk_tokens(u, 16, 4, 0);
  uint64_t g;
  block_hash_chain(u, 16, NULL, &g);
  kv_events_block_stored(ev, &g, 1, 0, 0, u, NULL, KV_EVENTS_MEDIUM_GPU);
  kv_events_get_stats(ev, &st);
  EXPECT_MSG(consume_until(&c, st.events) == 0, "%s", c.why);
  EXPECT(st.dropped == 1 && c.cleared == 1);
  EXPECT(c.n_blocks == 1 && held_find(c.blocks, c.n_blocks, g, 0) == 0);
  zmq_close(c.sub);
  zmq_close(c.req);
  zmq_ctx_term(c.ctx);
  kv_events_free(ev);
  unlink(ep + 6); /* the ipc:// socket files */
  unlink(rep + 6);
}

int main(void) {
  RUN(block_hash_reference);
  RUN(config_parse);
  RUN(prefix_cache_events);
  RUN(prefix_cache_events_disk);
  RUN(lost_event_clears);
  return test_failed_total ? 1 : 0;
}
