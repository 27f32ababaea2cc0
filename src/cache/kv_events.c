#include "cache/kv_events.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "base/kv_page.h"
#include "base/fault.h"
#include "base/log.h"

/* ---------------------------------------------------------------- config */

void kv_events_config_default(kv_events_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->endpoint, sizeof c->endpoint, "tcp://*:5557");
  c->buffer_steps = 10000;
  c->hwm = 100000;
  c->max_queue_size = 100000;
}

static int kv_events_cfg_str(const char *key, json_t *v, char *dst, size_t cap, int empty_ok,
                             char *err, size_t errlen) {
  if (!json_is_string(v))
    return errf(err, errlen, "--kv-events-config: '%s' must be a string", key);
  const char *s = json_string_value(v);
  if (strlen(s) >= cap)
    return errf(err, errlen, "--kv-events-config: '%s' is longer than %zu bytes", key, cap - 1);
  if (!empty_ok && !s[0]) return errf(err, errlen, "--kv-events-config: '%s' is empty", key);
  memcpy(dst, s, strlen(s) + 1);
  return 0;
}

static int kv_events_cfg_int(const char *key, json_t *v, long long lo, long long hi, int *dst,
                             char *err, size_t errlen) {
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return errf(err, errlen, "--kv-events-config: '%s' must be an integer in [%lld, %lld]", key, lo,
                hi);
  *dst = (int)json_integer_value(v);
  return 0;
}

int kv_events_config_parse(const char *text, kv_events_config *c, char *err, size_t errlen) {
  kv_events_config_default(c);
  json_error_t je;
  json_t *o = json_loads(text, 0, &je);
  if (!o) return errf(err, errlen, "--kv-events-config: not JSON: %s", je.text);
  int rc = 0, publisher = -1;
  if (!json_is_object(o)) rc = errf(err, errlen, "--kv-events-config: must be a JSON object");
  const char *key;
  json_t *v;
  json_object_foreach(o, key, v) {
    if (rc) break;
    if (!strcmp(key, "enable_kv_cache_events")) {
      if (!json_is_boolean(v))
        rc = errf(err, errlen, "--kv-events-config: 'enable_kv_cache_events' must be a boolean");
      c->enable = json_is_true(v);
    } else if (!strcmp(key, "publisher")) {
      if (!json_is_string(v) ||
          (strcmp(json_string_value(v), "zmq") && strcmp(json_string_value(v), "null")))
        rc = errf(err, errlen,
                  "--kv-events-config: publisher must be \"zmq\" or \"null\" (the publishers "
                  "there are here)");
      else
        publisher = !strcmp(json_string_value(v), "zmq");
    } else if (!strcmp(key, "endpoint")) {
      rc = kv_events_cfg_str(key, v, c->endpoint, sizeof c->endpoint, 0, err, errlen);
    } else if (!strcmp(key, "replay_endpoint")) {
      if (!json_is_null(v))
        rc = kv_events_cfg_str(key, v, c->replay_endpoint, sizeof c->replay_endpoint, 1, err,
                               errlen);
    } else if (!strcmp(key, "buffer_steps")) {
      rc = kv_events_cfg_int(key, v, 0, 10000000, &c->buffer_steps, err, errlen);
    } else if (!strcmp(key, "hwm")) {
      rc = kv_events_cfg_int(key, v, 0, 1000000000, &c->hwm, err, errlen);
    } else if (!strcmp(key, "max_queue_size")) {
      rc = kv_events_cfg_int(key, v, 1, 100000000, &c->max_queue_size, err, errlen);
    } else if (!strcmp(key, "topic")) {
      rc = kv_events_cfg_str(key, v, c->topic, sizeof c->topic, 1, err, errlen);
    } else {
      rc = errf(err, errlen,
                "--kv-events-config: unknown key '%.60s' (known: enable_kv_cache_events, "
                "publisher, endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic)",
                key);
    }
  }
  json_decref(o);
  /* vLLM's rule: without a publisher, "zmq" when enabled, else "null" */
  c->publisher_zmq = publisher >= 0 ? publisher : c->enable;
  return rc;
}

const char *kv_events_medium_name(kv_events_medium m) {
  static const char *const names[KV_EVENTS_N_MEDIUM] = {"GPU", "CPU", "DISK"};
  return (unsigned)m < KV_EVENTS_N_MEDIUM ? names[m] : "GPU";
}

/* ---------------------------------------------------------------- the queue */

typedef struct kv_events_item {
  int state; /* 1: a DeltaServe state event (batched apart) */
  double ts; /* wall clock at the report, seconds */
  char *data;
  size_t len;
} kv_events_item;

typedef struct kv_events_sent {
  uint64_t seq;
  char *data; /* the encoded batch */
  size_t len;
} kv_events_sent;

struct kv_events {
  kv_events_config c;
  pthread_mutex_t mu;
  kv_events_item *q; /* [cap_q] pending, n_q used (under mu) */
  int n_q, cap_q;
  int stop; /* under mu */
  int wake_rd, wake_wr;
  kv_events_stats st; /* under mu */
  /* publisher thread only */
  pthread_t thread;
  void *ctx, *pub, *replay;
  uint64_t seq;
  kv_events_sent *ring; /* [buffer_steps], the last batches for replay */
  int ring_head, ring_n;
};

static double kv_events_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* An encoding buffer that remembers a failed write (out of memory), so that a truncated event
 * or batch is never sent. */
typedef struct kv_events_buf {
  msgpack_sbuffer sb;
  int failed;
} kv_events_buf;

static int kv_events_write(void *data, const char *buf, size_t len) {
  kv_events_buf *b = data;
  if (!b->failed && msgpack_sbuffer_write(&b->sb, buf, len) != 0) b->failed = 1;
  return b->failed ? -1 : 0;
}

static void kv_events_buf_init(kv_events_buf *b, msgpack_packer *pk) {
  msgpack_sbuffer_init(&b->sb);
  b->failed = 0;
  msgpack_packer_init(pk, b, kv_events_write);
}

static void kv_events_pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

static void kv_events_pack_salt(msgpack_packer *pk, const char *salt) {
  if (salt && salt[0])
    kv_events_pack_str(pk, salt);
  else
    msgpack_pack_nil(pk);
}

static void kv_events_clear_queue(kv_events *ev) {
  for (int i = 0; i < ev->n_q; i++) free(ev->q[i].data);
  ev->n_q = 0;
}

/* Appends b's bytes (taken over) to the queue, or, on overflow or out of memory (fault site
 * "kv_events"), replaces the queue with one AllBlocksCleared. Wakes the thread when the queue
 * was empty. */
static void kv_events_push(kv_events *ev, int state, kv_events_buf *b) {
  msgpack_sbuffer *sb = &b->sb;
  static const char cleared[] = {(char)0x91, (char)0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c',
                                 'k',        's',        'C', 'l', 'e', 'a', 'r', 'e', 'd'};
  pthread_mutex_lock(&ev->mu);
  int was_empty = ev->n_q == 0;
  int ok =
      !b->failed && sb->data != NULL && !fault_hit("kv_events") && ev->n_q < ev->c.max_queue_size;
  if (ok && ev->n_q == ev->cap_q) {
    int cap = ev->cap_q ? ev->cap_q * 2 : 64;
    kv_events_item *q = realloc(ev->q, (size_t)cap * sizeof *q);
    if (q) {
      ev->q = q;
      ev->cap_q = cap;
    } else {
      ok = 0;
    }
  }
  if (ok) {
    ev->q[ev->n_q++] = (kv_events_item){state, kv_events_now(), sb->data, sb->size};
    ev->st.events++;
  } else {
    free(sb->data);
    ev->st.dropped += ev->n_q + 1;
    ev->st.events -= ev->n_q;
    kv_events_clear_queue(ev);
    char *d = malloc(sizeof cleared);
    if (d && ev->cap_q > 0) {
      memcpy(d, cleared, sizeof cleared);
      ev->q[ev->n_q++] = (kv_events_item){0, kv_events_now(), d, sizeof cleared};
      ev->st.events++;
    } else {
      free(d);
    }
  }
  pthread_mutex_unlock(&ev->mu);
  sb->data = NULL;
  if (was_empty) {
    char wake = 1;
    ssize_t w = write(ev->wake_wr, &wake, 1); /* a full pipe already wakes the thread */
    (void)w;
  }
}

void kv_events_block_stored(kv_events *ev, const uint64_t *hashes, int n, uint64_t parent,
                            int has_parent, const int32_t *tokens, const char *salt,
                            kv_events_medium m) {
  if (!ev || n <= 0) return;
  kv_events_buf b;
  msgpack_packer pk;
  kv_events_buf_init(&b, &pk);
  int extra = !has_parent && salt && salt[0];
  /* [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
   *  (extra_keys)] */
  msgpack_pack_array(&pk, extra ? 9 : 8);
  kv_events_pack_str(&pk, "BlockStored");
  msgpack_pack_array(&pk, (size_t)n);
  for (int i = 0; i < n; i++) msgpack_pack_uint64(&pk, hashes[i]);
  if (has_parent)
    msgpack_pack_uint64(&pk, parent);
  else
    msgpack_pack_nil(&pk);
  msgpack_pack_array(&pk, (size_t)n * KV_PAGE_TOKENS);
  for (int i = 0; i < n * KV_PAGE_TOKENS; i++) msgpack_pack_int32(&pk, tokens[i]);
  msgpack_pack_int(&pk, KV_PAGE_TOKENS);
  msgpack_pack_nil(&pk);
  kv_events_pack_str(&pk, kv_events_medium_name(m));
  msgpack_pack_nil(&pk);
  if (extra) { /* one entry per block: the salt is the first block's extra key */
    msgpack_pack_array(&pk, (size_t)n);
    msgpack_pack_array(&pk, 1);
    kv_events_pack_str(&pk, salt);
    for (int i = 1; i < n; i++) msgpack_pack_nil(&pk);
  }
  kv_events_push(ev, 0, &b);
}

void kv_events_block_removed(kv_events *ev, const uint64_t *hashes, int n, kv_events_medium m) {
  if (!ev || n <= 0) return;
  kv_events_buf b;
  msgpack_packer pk;
  kv_events_buf_init(&b, &pk);
  msgpack_pack_array(&pk, 3); /* [tag, block_hashes, medium] */
  kv_events_pack_str(&pk, "BlockRemoved");
  msgpack_pack_array(&pk, (size_t)n);
  for (int i = 0; i < n; i++) msgpack_pack_uint64(&pk, hashes[i]);
  kv_events_pack_str(&pk, kv_events_medium_name(m));
  kv_events_push(ev, 0, &b);
}

void kv_events_all_cleared(kv_events *ev) {
  if (!ev) return;
  kv_events_buf b;
  msgpack_packer pk;
  kv_events_buf_init(&b, &pk);
  msgpack_pack_array(&pk, 1);
  kv_events_pack_str(&pk, "AllBlocksCleared");
  kv_events_push(ev, 0, &b);
}

static void kv_events_state(kv_events *ev, const char *tag, uint64_t prefix_hash, int position,
                            const char *salt, kv_events_medium m) {
  if (!ev) return;
  kv_events_buf b;
  msgpack_packer pk;
  kv_events_buf_init(&b, &pk);
  msgpack_pack_array(&pk, 5); /* [tag, prefix_hash, position, cache_salt, medium] */
  kv_events_pack_str(&pk, tag);
  msgpack_pack_uint64(&pk, prefix_hash);
  msgpack_pack_int(&pk, position);
  kv_events_pack_salt(&pk, salt);
  kv_events_pack_str(&pk, kv_events_medium_name(m));
  kv_events_push(ev, 1, &b);
}

void kv_events_state_stored(kv_events *ev, uint64_t prefix_hash, int position, const char *salt,
                            kv_events_medium m) {
  kv_events_state(ev, "DeltaServeStateStored", prefix_hash, position, salt, m);
}

void kv_events_state_removed(kv_events *ev, uint64_t prefix_hash, int position, const char *salt,
                             kv_events_medium m) {
  kv_events_state(ev, "DeltaServeStateRemoved", prefix_hash, position, salt, m);
}

void kv_events_get_stats(kv_events *ev, kv_events_stats *s) {
  memset(s, 0, sizeof *s);
  if (!ev) return;
  pthread_mutex_lock(&ev->mu);
  *s = ev->st;
  pthread_mutex_unlock(&ev->mu);
}

/* ---------------------------------------------------------------- the publisher thread */

static void kv_events_be64(unsigned char b[8], uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (56 - 8 * i));
}

/* Keeps (seq, batch) for replay; takes data over. */
static void kv_events_ring_put(kv_events *ev, uint64_t seq, char *data, size_t len) {
  int cap = ev->c.buffer_steps;
  if (cap <= 0 || !ev->ring) {
    free(data);
    return;
  }
  int at = (ev->ring_head + ev->ring_n) % cap;
  if (ev->ring_n == cap) {
    free(ev->ring[ev->ring_head].data);
    ev->ring_head = (ev->ring_head + 1) % cap;
    at = (ev->ring_head + ev->ring_n - 1) % cap;
  } else {
    ev->ring_n++;
  }
  ev->ring[at] = (kv_events_sent){seq, data, len};
}

/* Encodes items [a, b) as one batch [ts, [events], data_parallel_rank 0] and publishes it. */
static void kv_events_publish(kv_events *ev, const kv_events_item *items, int a, int b) {
  kv_events_buf buf;
  msgpack_packer pk;
  kv_events_buf_init(&buf, &pk);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_double(&pk, items[a].ts);
  msgpack_pack_array(&pk, (size_t)(b - a));
  for (int i = a; i < b; i++) kv_events_write(&buf, items[i].data, items[i].len);
  msgpack_pack_int(&pk, 0);
  msgpack_sbuffer sb = buf.sb;
  if (buf.failed || !sb.data) { /* out of memory: the batch is lost, the sequence goes on */
    free(sb.data);
    log_warn("kv events: out of memory encoding a batch of %d events", b - a);
    return;
  }
  uint64_t seq = ev->seq++;
  unsigned char sq[8];
  kv_events_be64(sq, seq);
  /* PUB drops at the high-water mark and never blocks */
  zmq_send(ev->pub, ev->c.topic, strlen(ev->c.topic), ZMQ_SNDMORE);
  zmq_send(ev->pub, sq, 8, ZMQ_SNDMORE);
  zmq_send(ev->pub, sb.data, sb.size, 0);
  pthread_mutex_lock(&ev->mu);
  ev->st.batches++;
  pthread_mutex_unlock(&ev->mu);
  kv_events_ring_put(ev, seq, sb.data, sb.size);
}

/* One replay request: [identity, "", start (big-endian)] -> every kept batch with
 * seq >= start as [identity, "", seq, batch], then [identity, "", -1, ""]. */
static void kv_events_replay_one(kv_events *ev) {
  zmq_msg_t f[4];
  int n = 0, more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, ev->replay, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      break;
    }
    more = zmq_msg_more(&m);
    if (n < 4)
      f[n++] = m;
    else
      zmq_msg_close(&m);
  }
  if (n == 3 && zmq_msg_size(&f[2]) >= 1 && zmq_msg_size(&f[2]) <= 8) {
    uint64_t start = 0;
    const unsigned char *p = zmq_msg_data(&f[2]);
    for (size_t i = 0; i < zmq_msg_size(&f[2]); i++) start = start << 8 | p[i];
    const void *id = zmq_msg_data(&f[0]);
    size_t idn = zmq_msg_size(&f[0]);
    unsigned char sq[8];
    int cap = ev->c.buffer_steps;
    for (int k = 0; k < ev->ring_n; k++) {
      const kv_events_sent *s = &ev->ring[(ev->ring_head + k) % cap];
      if (s->seq < start) continue;
      kv_events_be64(sq, s->seq);
      zmq_send(ev->replay, id, idn, ZMQ_SNDMORE);
      zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
      zmq_send(ev->replay, sq, 8, ZMQ_SNDMORE);
      zmq_send(ev->replay, s->data, s->len, 0);
    }
    memset(sq, 0xff, 8); /* -1: the end */
    zmq_send(ev->replay, id, idn, ZMQ_SNDMORE);
    zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
    zmq_send(ev->replay, sq, 8, ZMQ_SNDMORE);
    zmq_send(ev->replay, "", 0, 0);
    pthread_mutex_lock(&ev->mu);
    ev->st.replays++;
    pthread_mutex_unlock(&ev->mu);
  } else if (n > 0) {
    log_warn("kv events: a replay request of %d frames ignored (expected 3)", n);
  }
  for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static void *kv_events_main(void *arg) {
  kv_events *ev = arg;
  kv_events_item *items = NULL;
  int cap_items = 0;
  for (;;) {
    zmq_pollitem_t pi[2] = {{NULL, ev->wake_rd, ZMQ_POLLIN, 0}, {ev->replay, 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(pi, ev->replay ? 2 : 1, -1) < 0 && zmq_errno() != EINTR) break;
    if (pi[0].revents & ZMQ_POLLIN) {
      char b[64];
      while (read(ev->wake_rd, b, sizeof b) > 0) {
      }
    }
    if (ev->replay) {
      int evs = 0;
      size_t sz = sizeof evs;
      while (zmq_getsockopt(ev->replay, ZMQ_EVENTS, &evs, &sz) == 0 && (evs & ZMQ_POLLIN))
        kv_events_replay_one(ev);
    }
    /* take the queue: the engine appends to an empty one meanwhile */
    pthread_mutex_lock(&ev->mu);
    kv_events_item *q = ev->q;
    int n = ev->n_q, cap = ev->cap_q, stop = ev->stop;
    ev->q = items;
    ev->cap_q = cap_items;
    ev->n_q = 0;
    pthread_mutex_unlock(&ev->mu);
    items = q;
    cap_items = cap;
    for (int a = 0; a < n;) {
      int b = a + 1;
      while (b < n && items[b].state == items[a].state) b++;
      kv_events_publish(ev, items, a, b);
      a = b;
    }
    for (int i = 0; i < n; i++) free(items[i].data);
    if (stop) break;
  }
  free(items);
  return NULL;
}

/* ---------------------------------------------------------------- init / free */

/* vLLM's rule: bind a wildcard, ipc:// or inproc:// address, connect to any other. */
static int kv_events_attach(void *sock, const char *ep, int bind_always, char *err, size_t errlen) {
  int bind = bind_always || strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) ||
             !strncmp(ep, "inproc://", 9);
  if ((bind ? zmq_bind(sock, ep) : zmq_connect(sock, ep)) != 0)
    return errf(err, errlen, "--kv-events-config: cannot %s %s: %s", bind ? "bind" : "connect to",
                ep, zmq_strerror(zmq_errno()));
  return 0;
}

void kv_events_free(kv_events *ev) {
  if (!ev) return;
  if (ev->thread) {
    pthread_mutex_lock(&ev->mu);
    ev->stop = 1;
    pthread_mutex_unlock(&ev->mu);
    char b = 1;
    ssize_t w = write(ev->wake_wr, &b, 1);
    (void)w;
    pthread_join(ev->thread, NULL);
  }
  int linger = 1000; /* the last batches get a second to leave */
  if (ev->pub) {
    zmq_setsockopt(ev->pub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(ev->pub);
  }
  if (ev->replay) {
    linger = 0;
    zmq_setsockopt(ev->replay, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(ev->replay);
  }
  if (ev->ctx) zmq_ctx_term(ev->ctx);
  for (int k = 0; k < ev->ring_n; k++)
    free(ev->ring[(ev->ring_head + k) % ev->c.buffer_steps].data);
  free(ev->ring);
  kv_events_clear_queue(ev);
  free(ev->q);
  if (ev->wake_rd >= 0) close(ev->wake_rd);
  if (ev->wake_wr >= 0) close(ev->wake_wr);
  pthread_mutex_destroy(&ev->mu);
  free(ev);
}

int kv_events_init(kv_events **out, const kv_events_config *c, char *err, size_t errlen) {
  *out = NULL;
  kv_events *ev = calloc(1, sizeof *ev);
  if (!ev) return errf(err, errlen, "kv events: out of memory");
  ev->c = *c;
  ev->wake_rd = ev->wake_wr = -1;
  pthread_mutex_init(&ev->mu, NULL);
  int fds[2];
  if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    kv_events_free(ev);
    return errf(err, errlen, "kv events: pipe: %s", strerror(errno));
  }
  ev->wake_rd = fds[0];
  ev->wake_wr = fds[1];
  if (c->buffer_steps > 0 && !(ev->ring = calloc((size_t)c->buffer_steps, sizeof *ev->ring))) {
    kv_events_free(ev);
    return errf(err, errlen, "kv events: out of memory");
  }
  int hwm = c->hwm;
  if (!(ev->ctx = zmq_ctx_new()) || !(ev->pub = zmq_socket(ev->ctx, ZMQ_PUB)) ||
      zmq_setsockopt(ev->pub, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0) {
    errf(err, errlen, "kv events: zmq: %s", zmq_strerror(zmq_errno()));
    kv_events_free(ev);
    return -1;
  }
  if (kv_events_attach(ev->pub, c->endpoint, 0, err, errlen) != 0) {
    kv_events_free(ev);
    return -1;
  }
  if (c->replay_endpoint[0]) {
    if (!(ev->replay = zmq_socket(ev->ctx, ZMQ_ROUTER)) ||
        kv_events_attach(ev->replay, c->replay_endpoint, 1, err, errlen) != 0) {
      if (!ev->replay) errf(err, errlen, "kv events: zmq: %s", zmq_strerror(zmq_errno()));
      kv_events_free(ev);
      return -1;
    }
  }
  if (pthread_create(&ev->thread, NULL, kv_events_main, ev) != 0) {
    ev->thread = 0;
    kv_events_free(ev);
    return errf(err, errlen, "kv events: cannot start the publisher thread");
  }
  *out = ev;
  return 0;
}
