/* tokenizer — byte-level BPE as Hugging Face `tokenizers` runs it, read from
 * tokenizer.json.
 *
 * Encoding, in the order HF applies it:
 *
 *   text ──► added tokens (normalized:false) ──► text pieces ──► normaliser
 * (NFC…) ──► added tokens (normalized:true)  ──► text pieces ──► Split
 * regex(es), "Isolated" ──► pre-tokens ──► ByteLevel (bytes) ──► BPE merges by
 * rank ──► ids
 *
 * Everything is kept as raw bytes: the ByteLevel alphabet (byte b <-> one code
 * point) is undone once at load, so vocab keys, merge keys and decode strings
 * are plain byte strings.
 *
 *   arena:  [tok bytes][tok bytes]...          all strings, addressed by
 * (off,len) spans enc[id]  span of the base-vocab key        vmap: open
 * addressing, bytes -> id dec[id]  span of what id decodes to         (added
 * tokens: their content, ByteLevel-decoded when every char is in the alphabet,
 * as HF) mmap:   open addressing, (left id, right id) -> (rank, merged id)
 *
 * BPE on one pre-token always merges the lowest-ranked adjacent pair, leftmost
 * first. Short pre-tokens use an array with cached pair ranks (O(n^2) worst,
 * tiny n); long ones (over BPE_LINEAR_MAX bytes) a linked list with a binary
 * heap of candidate pairs (O(n log n)), so a 100 KB word without spaces stays
 * linear-ish. Results of short pre-tokens are remembered in a small sharded
 * cache (mutex per shard), the only mutable state; everything else is immutable
 * after load, so one tokenizer serves many threads.
 *
 * Loading: tokenizer.json is ~11 MB, mostly vocab and merges. A small scanner
 * walks the top level, parses vocab and merges itself (no JSON tree), and hands
 * the small sections (added_tokens, normalizer, pre_tokenizer, decoder) to
 * jansson. */
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/file_read.h"
#include "base/fault.h"
#include "base/log.h"
#include "tokenizer/utf8.h"

#define BPE_LINEAR_MAX 256 /* above this many bytes the O(n^2) pair scan gives way to the heap */
#define MAX_REGEX 4        /* Split steps of a pre-tokenizer (the Qwen files have one) */
#define MAX_NORM 4         /* normalizers in sequence (the Qwen files have NFC alone) */
#define CACHE_SHARDS 16    /* one mutex each, so that server threads seldom wait on one */
#define CACHE_SLOTS 4096   /* per shard, power of two */
#define CACHE_KEY_MAX 24   /* pre-tokens up to this many bytes are cached */
#define CACHE_IDS_MAX 8    /* pre-tokens that encode to more ids are not cached (rare, long) */

typedef struct {
  uint32_t off, len;
} span;

typedef struct {
  uint64_t key; /* left << 32 | right */
  int32_t rank; /* -1: empty slot */
  int32_t id;
} merge_slot;

typedef struct {
  uint32_t off, len; /* content bytes in the arena */
  int32_t id;
  uint8_t lstrip, rstrip, single_word;
} added_tok;

typedef struct {
  added_tok *a; /* sorted by first byte, then longest first */
  int n;
  int start[257]; /* a[start[b] .. start[b+1]) begin with byte b */
} added_set;

typedef struct {
  uint8_t klen, nids;
  uint8_t key[CACHE_KEY_MAX];
  int32_t ids[CACHE_IDS_MAX];
} cache_slot;

typedef struct {
  pthread_mutex_t mu;
  cache_slot *slot; /* [CACHE_SLOTS] */
} cache_shard;

struct tokenizer {
  uint8_t *arena;
  size_t arena_len, arena_cap;
  int n_ids;      /* ids 0..n_ids-1 may decode */
  span *enc;      /* [n_ids] base vocab key bytes (len 0, off UINT32_MAX: not in
                     vocab) */
  span *dec;      /* [n_ids] decode bytes */
  uint8_t *flags; /* [n_ids] TF_* */
  int32_t *vmap;  /* [vmask+1] ids, -1 empty */
  uint32_t vmask;
  merge_slot *mmap; /* [mmask+1] */
  uint32_t mmask;
  int32_t byte_id[256];
  int ignore_merges;
  int n_norm;
  int norm_opts[MAX_NORM]; /* utf8proc options, applied in order */
  int n_re;
  pcre2_code *re[MAX_REGEX];
  added_set added_raw, added_norm;
  char *chat_template, *eos_token;
  cache_shard cache[CACHE_SHARDS];
};

enum { TF_EXISTS = 1, TF_ADDED = 2, TF_SPECIAL = 4, TF_IN_VOCAB = 8 };

/* ----------------------------------------------------------------------------------------
 */
/* ByteLevel alphabet: byte <-> code point (the GPT-2 table) */

static uint16_t bl_byte_to_cp[256];
static int16_t bl_cp_to_byte[512]; /* -1: not in the alphabet */
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;

static void bl_init(void) {
  for (int i = 0; i < 512; i++) bl_cp_to_byte[i] = -1;
  int n = 0;
  for (int b = 0; b < 256; b++) {
    int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = keep ? b : 256 + n++;
    bl_byte_to_cp[b] = (uint16_t)cp;
    bl_cp_to_byte[cp] = (int16_t)b;
  }
}

/* Maps a ByteLevel string to bytes in out (capacity >= n). Returns the byte
 * count, or -1 when a char is outside the alphabet (or s is not UTF-8). */
static long bl_decode(const uint8_t *s, size_t n, uint8_t *out) {
  size_t i = 0, o = 0;
  while (i < n) {
    size_t len;
    uint32_t cp;
    if (utf8_step(s + i, n - i, &len, &cp) != UTF8_STEP_VALID) return -1;
    if (cp >= 512 || bl_cp_to_byte[cp] < 0) return -1;
    out[o++] = (uint8_t)bl_cp_to_byte[cp];
    i += len;
  }
  return (long)o;
}

/* ----------------------------------------------------------------------------------------
 */
/* small helpers */

typedef struct {
  char *p;
  size_t n, cap;
} sbuf;

static int sbuf_reserve(sbuf *b, size_t extra) {
  if (b->n + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->n + extra + 1) cap *= 2;
  char *np = realloc(b->p, cap);
  if (!np) return -1;
  b->p = np;
  b->cap = cap;
  return 0;
}

static int sbuf_put(sbuf *b, const void *s, size_t n) {
  if (sbuf_reserve(b, n)) return -1;
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

typedef struct {
  int32_t *v;
  size_t n, cap;
} ivec;

static int ivec_push(ivec *v, int32_t x) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 256;
    if (fault_hit("tokenizer_encode")) return -1;
    int32_t *nv = realloc(v->v, cap * sizeof *nv);
    if (!nv) return -1;
    v->v = nv;
    v->cap = cap;
  }
  v->v[v->n++] = x;
  return 0;
}

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

static uint32_t hash_pair(uint64_t key) { return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32); }

static long arena_put(tokenizer *t, const void *s, size_t n) {
  if (t->arena_len + n > t->arena_cap) {
    size_t cap = t->arena_cap ? t->arena_cap : 1 << 20;
    while (cap < t->arena_len + n) cap *= 2;
    if (cap > UINT32_MAX) return -1;
    uint8_t *na = realloc(t->arena, cap);
    if (!na) return -1;
    t->arena = na;
    t->arena_cap = cap;
  }
  memcpy(t->arena + t->arena_len, s, n);
  long off = (long)t->arena_len;
  t->arena_len += n;
  return off;
}

static int32_t vocab_find(const tokenizer *t, const uint8_t *s, size_t n) {
  if (!t->vmap) return -1;
  uint32_t h = (uint32_t)hash_bytes(s, n) & t->vmask;
  for (;;) {
    int32_t id = t->vmap[h];
    if (id < 0) return -1;
    span e = t->enc[id];
    if (e.len == n && memcmp(t->arena + e.off, s, n) == 0) return id;
    h = (h + 1) & t->vmask;
  }
}

static inline const merge_slot *merge_find(const tokenizer *t, int32_t a, int32_t b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  uint32_t h = hash_pair(key) & t->mmask;
  for (;;) {
    const merge_slot *m = &t->mmap[h];
    if (m->rank < 0) return NULL;
    if (m->key == key) return m;
    h = (h + 1) & t->mmask;
  }
}

static uint32_t pow2_at_least(size_t n) {
  uint32_t c = 16;
  while (c < n) c *= 2;
  return c;
}

/* Unicode White_Space (Rust's char::is_whitespace). */
static int is_space_cp(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

/* Rust's char::is_alphanumeric || '_' (approximated by the L and N categories).
 */
static int is_word_cp(uint32_t c) {
  if (c == '_') return 1;
  if (c < 128) return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z');
  utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
         (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* The code point that ends at s[n) (s valid UTF-8, n > 0); *len its byte
 * length. */
static uint32_t cp_before(const uint8_t *s, size_t n, size_t *len) {
  size_t i = n - 1;
  while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
  uint32_t cp = 0;
  size_t l;
  utf8_step(s + i, n - i, &l, &cp);
  *len = n - i;
  return cp;
}

/* ----------------------------------------------------------------------------------------
 */
/* JSON scanner for the big sections */

typedef struct {
  const char *p, *e;
} js;

static void js_ws(js *s) {
  while (s->p < s->e && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int js_skip_string(js *s) {
  s->p++;
  while (s->p < s->e) {
    char c = *s->p++;
    if (c == '\\') {
      if (s->p >= s->e) return -1;
      s->p++;
    } else if (c == '"') {
      return 0;
    }
  }
  return -1;
}

static int js_skip(js *s) {
  js_ws(s);
  if (s->p >= s->e) return -1;
  char c = *s->p;
  if (c == '"') return js_skip_string(s);
  if (c == '{' || c == '[') {
    int depth = 0;
    while (s->p < s->e) {
      c = *s->p;
      if (c == '"') {
        if (js_skip_string(s)) return -1;
        continue;
      }
      if (c == '{' || c == '[')
        depth++;
      else if (c == '}' || c == ']') {
        if (--depth == 0) {
          s->p++;
          return 0;
        }
      }
      s->p++;
    }
    return -1;
  }
  const char *st = s->p;
  while (s->p < s->e && !memchr(",}] \n\r\t", *s->p, 7)) s->p++;
  return s->p > st ? 0 : -1;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if ((c | 32) >= 'a' && (c | 32) <= 'f') return (c | 32) - 'a' + 10;
  return -1;
}

static int js_hex4(js *s, uint32_t *v) {
  if (s->e - s->p < 4) return -1;
  uint32_t x = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(s->p[i]);
    if (h < 0) return -1;
    x = x << 4 | (uint32_t)h;
  }
  s->p += 4;
  *v = x;
  return 0;
}

static void put_utf8(sbuf *b, uint32_t c) {
  uint8_t u[4];
  size_t n;
  if (c < 0x80) {
    u[0] = (uint8_t)c;
    n = 1;
  } else if (c < 0x800) {
    u[0] = (uint8_t)(0xC0 | c >> 6);
    u[1] = (uint8_t)(0x80 | (c & 63));
    n = 2;
  } else if (c < 0x10000) {
    u[0] = (uint8_t)(0xE0 | c >> 12);
    u[1] = (uint8_t)(0x80 | (c >> 6 & 63));
    u[2] = (uint8_t)(0x80 | (c & 63));
    n = 3;
  } else {
    u[0] = (uint8_t)(0xF0 | c >> 18);
    u[1] = (uint8_t)(0x80 | (c >> 12 & 63));
    u[2] = (uint8_t)(0x80 | (c >> 6 & 63));
    u[3] = (uint8_t)(0x80 | (c & 63));
    n = 4;
  }
  sbuf_put(b, u, n);
}

/* Reads a JSON string (s at its opening quote) into b (reset first). */
static int js_string(js *s, sbuf *b) {
  js_ws(s);
  b->n = 0;
  if (sbuf_reserve(b, 16)) return -1;
  b->p[0] = 0;
  if (s->p >= s->e || *s->p != '"') return -1;
  s->p++;
  for (;;) {
    const char *st = s->p;
    while (s->p < s->e && *s->p != '"' && *s->p != '\\') s->p++;
    if (s->p >= s->e) return -1;
    if (s->p > st && sbuf_put(b, st, (size_t)(s->p - st))) return -1;
    if (*s->p == '"') {
      s->p++;
      return 0;
    }
    s->p++; /* backslash */
    if (s->p >= s->e) return -1;
    char c = *s->p++, o;
    switch (c) {
      case '"':
        o = '"';
        break;
      case '\\':
        o = '\\';
        break;
      case '/':
        o = '/';
        break;
      case 'b':
        o = '\b';
        break;
      case 'f':
        o = '\f';
        break;
      case 'n':
        o = '\n';
        break;
      case 'r':
        o = '\r';
        break;
      case 't':
        o = '\t';
        break;
      case 'u': {
        uint32_t v, w;
        if (js_hex4(s, &v)) return -1;
        if (v >= 0xD800 && v <= 0xDBFF) {
          if (s->e - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u') return -1;
          s->p += 2;
          if (js_hex4(s, &w) || w < 0xDC00 || w > 0xDFFF) return -1;
          v = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
        } else if (v >= 0xDC00 && v <= 0xDFFF) {
          return -1;
        }
        put_utf8(b, v);
        continue;
      }
      default:
        return -1;
    }
    if (sbuf_put(b, &o, 1)) return -1;
  }
}

static int js_expect(js *s, char c) {
  js_ws(s);
  if (s->p >= s->e || *s->p != c) return -1;
  s->p++;
  return 0;
}

/* Iterates an object: call with *first = 1 after js_expect('{'). Returns 1 with
 * the key in key and s at the value, 0 at the closing brace, -1 on a syntax
 * error. */
static int js_obj_next(js *s, int *first, sbuf *key) {
  js_ws(s);
  if (s->p >= s->e) return -1;
  if (*s->p == '}') {
    s->p++;
    return 0;
  }
  if (!*first) {
    if (*s->p != ',') return -1;
    s->p++;
  }
  *first = 0;
  if (js_string(s, key)) return -1;
  if (js_expect(s, ':')) return -1;
  js_ws(s);
  return 1;
}

static int js_int(js *s, long *v) {
  js_ws(s);
  char *end;
  errno = 0;
  long x = strtol(s->p, &end, 10);
  if (end == s->p || errno) return -1;
  s->p = end;
  *v = x;
  return 0;
}

/* ----------------------------------------------------------------------------------------
 */
/* loading */

typedef struct {
  const char *p;
  size_t n;
} jspan;

/* A key of an object whose value the loader keeps as a raw span, parsed later or not at all. */
typedef struct {
  const char *key;
  jspan *dst;
} jspan_field;
#define JSPAN_N(fields) (int)(sizeof(fields) / sizeof(fields)[0])

/* Skips the value at s; when key is one of the n fields', that field gets the value's span.
 * Returns 0, or -1 on malformed JSON. */
static int jspan_keep(js *s, const char *key, const jspan_field *f, int n) {
  const char *st = s->p;
  if (js_skip(s)) return -1;
  for (int i = 0; i < n; i++)
    if (!strcmp(key, f[i].key)) *f[i].dst = (jspan){st, (size_t)(s->p - st)};
  return 0;
}

static int ensure_ids(tokenizer *t, long id) {
  if (id < t->n_ids) return 0;
  if (id >= INT32_MAX / 2) return -1;
  int n = t->n_ids ? t->n_ids : 1024;
  while (n <= id) n *= 2;
  span *e = realloc(t->enc, (size_t)n * sizeof *e);
  if (!e) return -1;
  t->enc = e;
  span *d = realloc(t->dec, (size_t)n * sizeof *d);
  if (!d) return -1;
  t->dec = d;
  uint8_t *f = realloc(t->flags, (size_t)n);
  if (!f) return -1;
  t->flags = f;
  for (int i = t->n_ids; i < n; i++) {
    t->enc[i] = (span){UINT32_MAX, 0};
    t->dec[i] = (span){0, 0};
    t->flags[i] = 0;
  }
  t->n_ids = n;
  return 0;
}

static int load_vocab(tokenizer *t, jspan v, long *max_id, char *err, size_t errlen) {
  js s = {v.p, v.p + v.n};
  sbuf key = {0};
  uint8_t *tmp = NULL;
  size_t tmpcap = 0;
  long count = 0, maxid = -1;
  int first = 1, r, rc = -1;
  if (js_expect(&s, '{')) goto bad;
  while ((r = js_obj_next(&s, &first, &key)) == 1) {
    long id;
    if (js_int(&s, &id) || id < 0) goto bad;
    if (key.n > tmpcap) {
      tmpcap = key.n * 2 + 16;
      uint8_t *nt = realloc(tmp, tmpcap);
      if (!nt) goto oom;
      tmp = nt;
    }
    long nb = bl_decode((const uint8_t *)key.p, key.n, tmp);
    const uint8_t *kb = nb >= 0 ? tmp : (const uint8_t *)key.p;
    size_t kn = nb >= 0 ? (size_t)nb : key.n;
    long off = arena_put(t, kb, kn);
    if (off < 0 || ensure_ids(t, id)) goto oom;
    t->enc[id] = (span){(uint32_t)off, (uint32_t)kn};
    t->dec[id] = t->enc[id];
    t->flags[id] |= TF_EXISTS | TF_IN_VOCAB;
    if (id > maxid) maxid = id;
    count++;
  }
  if (r < 0) goto bad;
  /* the hash map, built once all keys are in */
  size_t cap = pow2_at_least((size_t)count * 2 + 1);
  t->vmap = malloc(cap * sizeof *t->vmap);
  if (!t->vmap) goto oom;
  memset(t->vmap, 0xff, cap * sizeof *t->vmap);
  t->vmask = (uint32_t)cap - 1;
  for (long id = 0; id <= maxid; id++) {
    if (!(t->flags[id] & TF_IN_VOCAB)) continue;
    span e = t->enc[id];
    if (vocab_find(t, t->arena + e.off, e.len) >= 0) continue; /* duplicate key: first wins */
    uint32_t h = (uint32_t)hash_bytes(t->arena + e.off, e.len) & t->vmask;
    while (t->vmap[h] >= 0) h = (h + 1) & t->vmask;
    t->vmap[h] = (int32_t)id;
  }
  *max_id = maxid;
  rc = 0;
  goto done;
bad:
  errf(err, errlen, "tokenizer.json: malformed model.vocab");
  goto done;
oom:
  errf(err, errlen, "tokenizer.json: out of memory reading the vocabulary");
done:
  free(key.p);
  free(tmp);
  return rc;
}

static int32_t lookup_bl(const tokenizer *t, const char *s, size_t n, uint8_t *tmp) {
  long nb = bl_decode((const uint8_t *)s, n, tmp);
  if (nb >= 0) return vocab_find(t, tmp, (size_t)nb);
  return vocab_find(t, (const uint8_t *)s, n);
}

static int merge_insert(tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  uint32_t h = hash_pair(key) & t->mmask;
  while (t->mmap[h].rank >= 0 && t->mmap[h].key != key) h = (h + 1) & t->mmask;
  t->mmap[h] = (merge_slot){key, rank, id}; /* a later duplicate replaces, as HF's map */
  return 0;
}

static int load_merges(tokenizer *t, jspan m, char *err, size_t errlen) {
  js s = {m.p, m.p + m.n};
  sbuf a = {0}, b = {0};
  uint8_t *ta = NULL, *tb = NULL, *tab = NULL;
  size_t tcap = 0;
  int rc = -1;
  /* count elements first to size the table: top-level commas at depth 1 */
  long count = 0;
  {
    js c = s;
    js_ws(&c);
    if (c.p >= c.e || *c.p != '[') goto bad;
    c.p++;
    js_ws(&c);
    while (c.p < c.e && *c.p != ']') {
      if (js_skip(&c)) goto bad;
      count++;
      js_ws(&c);
      if (c.p < c.e && *c.p == ',') c.p++;
      js_ws(&c);
    }
  }
  size_t cap = pow2_at_least((size_t)count * 2 + 1);
  t->mmap = malloc(cap * sizeof *t->mmap);
  if (!t->mmap) goto oom;
  for (size_t i = 0; i < cap; i++) t->mmap[i].rank = -1;
  t->mmask = (uint32_t)cap - 1;
  if (js_expect(&s, '[')) goto bad;
  for (long rank = 0; rank < count; rank++) {
    if (rank > 0 && js_expect(&s, ',')) goto bad;
    js_ws(&s);
    if (s.p < s.e && *s.p == '[') {
      s.p++;
      if (js_string(&s, &a) || js_expect(&s, ',') || js_string(&s, &b) || js_expect(&s, ']'))
        goto bad;
    } else {
      if (js_string(&s, &a)) goto bad;
      char *sp = memchr(a.p, ' ', a.n);
      if (!sp) goto bad;
      b.n = 0;
      if (sbuf_put(&b, sp + 1, a.n - (size_t)(sp + 1 - a.p))) goto oom;
      a.n = (size_t)(sp - a.p);
    }
    if (a.n + b.n + 16 > tcap) {
      tcap = (a.n + b.n) * 2 + 64;
      free(ta);
      free(tb);
      free(tab);
      ta = malloc(tcap);
      tb = malloc(tcap);
      tab = malloc(tcap);
      if (!ta || !tb || !tab) goto oom;
    }
    int32_t ia = lookup_bl(t, a.p, a.n, ta), ib = lookup_bl(t, b.p, b.n, tb);
    /* the merged token: concatenate the decoded bytes of both halves */
    long na = bl_decode((const uint8_t *)a.p, a.n, ta),
         nb2 = bl_decode((const uint8_t *)b.p, b.n, tb);
    int32_t iab = -1;
    if (na >= 0 && nb2 >= 0) {
      memcpy(tab, ta, (size_t)na);
      memcpy(tab + na, tb, (size_t)nb2);
      iab = vocab_find(t, tab, (size_t)(na + nb2));
    } else {
      memcpy(tab, a.p, a.n);
      memcpy(tab + a.n, b.p, b.n);
      iab = vocab_find(t, tab, a.n + b.n);
    }
    if (ia < 0 || ib < 0 || iab < 0) {
      errf(err, errlen,
           "tokenizer.json: merge %ld ('%.40s' '%.40s') uses a token not in "
           "the vocab",
           rank, a.p, b.p);
      goto done;
    }
    merge_insert(t, ia, ib, (int32_t)rank, iab);
  }
  if (js_expect(&s, ']')) goto bad;
  rc = 0;
  goto done;
bad:
  errf(err, errlen, "tokenizer.json: malformed model.merges");
  goto done;
oom:
  errf(err, errlen, "tokenizer.json: out of memory reading the merges");
done:
  free(a.p);
  free(b.p);
  free(ta);
  free(tb);
  free(tab);
  return rc;
}

static json_t *parse_span(jspan sp) {
  if (!sp.p) return NULL;
  json_error_t je;
  return json_loadb(sp.p, sp.n, JSON_DECODE_ANY, &je);
}

static int norm_from_json(tokenizer *t, json_t *n, char *err, size_t errlen) {
  if (!n || json_is_null(n)) return 0;
  const char *type = json_string_value(json_object_get(n, "type"));
  if (!type) return errf(err, errlen, "tokenizer.json: normalizer without a type");
  if (!strcmp(type, "Sequence")) {
    json_t *list = json_object_get(n, "normalizers");
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x) if (norm_from_json(t, x, err, errlen)) return -1;
    return 0;
  }
  int opts;
  if (!strcmp(type, "NFC"))
    opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  else if (!strcmp(type, "NFD"))
    opts = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
  else if (!strcmp(type, "NFKC"))
    opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  else if (!strcmp(type, "NFKD"))
    opts = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  else
    return errf(err, errlen, "tokenizer.json: normalizer '%s' is not supported", type);
  if (t->n_norm >= MAX_NORM) return errf(err, errlen, "tokenizer.json: too many normalizers");
  t->norm_opts[t->n_norm++] = opts;
  return 0;
}

/* Oniguruma's \s is Unicode White_Space; PCRE2's (with UCP) lacks U+0085. Spell
 * it out. */
#define WS_CLASS_BODY "\\t-\\r \\x{85}\\p{Z}"

static char *regex_to_pcre2(const char *pat) {
  sbuf o = {0};
  int in_class = 0;
  for (const char *p = pat; *p; p++) {
    if (*p == '\\' && p[1]) {
      char c = p[1];
      if (c == 's')
        sbuf_put(&o, in_class ? WS_CLASS_BODY : "[" WS_CLASS_BODY "]",
                 strlen(in_class ? WS_CLASS_BODY : "[" WS_CLASS_BODY "]"));
      else if (c == 'S' && !in_class)
        sbuf_put(&o, "[^" WS_CLASS_BODY "]", strlen("[^" WS_CLASS_BODY "]"));
      else
        sbuf_put(&o, p, 2);
      p++;
      continue;
    }
    if (!in_class && *p == '[') {
      in_class = 1;
      sbuf_put(&o, p, 1);
      if (p[1] == '^') sbuf_put(&o, ++p, 1);
      if (p[1] == ']') sbuf_put(&o, ++p, 1); /* a leading ] is literal */
      continue;
    }
    if (in_class && *p == ']') in_class = 0;
    sbuf_put(&o, p, 1);
  }
  if (!o.p) sbuf_put(&o, "", 0);
  return o.p;
}

static int add_regex(tokenizer *t, const char *pat, int literal, char *err, size_t errlen) {
  if (t->n_re >= MAX_REGEX) return errf(err, errlen, "tokenizer.json: too many Split steps");
  char *conv = literal ? strdup(pat) : regex_to_pcre2(pat);
  if (!conv) return errf(err, errlen, "out of memory");
  int ec;
  PCRE2_SIZE eo;
  pcre2_code *re =
      pcre2_compile((PCRE2_SPTR)conv, PCRE2_ZERO_TERMINATED,
                    PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &ec, &eo, NULL);
  free(conv);
  if (!re) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(ec, msg, sizeof msg);
    return errf(err, errlen, "tokenizer.json: Split regex does not compile at %zu: %s", (size_t)eo,
                (const char *)msg);
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT it still works, slower */
  t->re[t->n_re++] = re;
  return 0;
}

static const char *GPT2_REGEX =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
    "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int pretok_from_json(tokenizer *t, json_t *p, int *bytelevel, char *err, size_t errlen) {
  if (!p || json_is_null(p)) return 0;
  const char *type = json_string_value(json_object_get(p, "type"));
  if (!type) return errf(err, errlen, "tokenizer.json: pre_tokenizer without a type");
  if (!strcmp(type, "Sequence")) {
    json_t *list = json_object_get(p, "pretokenizers");
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x) if (pretok_from_json(t, x, bytelevel, err, errlen)) return -1;
    return 0;
  }
  if (!strcmp(type, "ByteLevel")) {
    if (json_is_true(json_object_get(p, "add_prefix_space")))
      return errf(err, errlen, "tokenizer.json: ByteLevel add_prefix_space is not supported");
    *bytelevel = 1;
    json_t *ur = json_object_get(p, "use_regex");
    if (!ur || json_is_true(ur)) return add_regex(t, GPT2_REGEX, 0, err, errlen);
    return 0;
  }
  if (!strcmp(type, "Split")) {
    const char *beh = json_string_value(json_object_get(p, "behavior"));
    if (!beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(p, "invert")))
      return errf(err, errlen, "tokenizer.json: only Split with behavior Isolated is supported");
    json_t *pat = json_object_get(p, "pattern");
    const char *rx = json_string_value(json_object_get(pat, "Regex"));
    const char *lit = json_string_value(json_object_get(pat, "String"));
    if (rx) return add_regex(t, rx, 0, err, errlen);
    if (lit) return add_regex(t, lit, 1, err, errlen);
    return errf(err, errlen, "tokenizer.json: Split without a pattern");
  }
  return errf(err, errlen, "tokenizer.json: pre_tokenizer '%s' is not supported", type);
}

static uint8_t *normalize_alloc(const tokenizer *t, const uint8_t *s, size_t n, size_t *out_n);

static int added_cmp(const void *x, const void *y, void *ctx) {
  const tokenizer *t = ctx;
  const added_tok *a = x, *b = y;
  uint8_t fa = t->arena[a->off], fb = t->arena[b->off];
  if (fa != fb) return fa < fb ? -1 : 1;
  if (a->len != b->len) return a->len > b->len ? -1 : 1;
  return a->id < b->id ? -1 : a->id > b->id;
}

static const tokenizer *sort_ctx;
static int added_cmp_q(const void *x, const void *y) { return added_cmp(x, y, (void *)sort_ctx); }
static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;

static void added_set_finish(tokenizer *t, added_set *s) {
  pthread_mutex_lock(&sort_mu);
  sort_ctx = t;
  qsort(s->a, (size_t)s->n, sizeof *s->a, added_cmp_q);
  pthread_mutex_unlock(&sort_mu);
  int k = 0;
  for (int b = 0; b <= 256; b++) {
    while (k < s->n && t->arena[s->a[k].off] < b) k++;
    s->start[b] = k;
  }
}

static int added_from_json(tokenizer *t, json_t *arr, char *err, size_t errlen) {
  if (!arr || json_is_null(arr)) return 0;
  if (!json_is_array(arr)) return errf(err, errlen, "tokenizer.json: added_tokens is not a list");
  size_t n = json_array_size(arr), i;
  json_t *x;
  t->added_raw.a = calloc(n + 1, sizeof(added_tok));
  t->added_norm.a = calloc(n + 1, sizeof(added_tok));
  if (!t->added_raw.a || !t->added_norm.a) return errf(err, errlen, "out of memory");
  uint8_t *tmp = NULL;
  json_array_foreach(arr, i, x) {
    json_t *jid = json_object_get(x, "id");
    const char *content = json_string_value(json_object_get(x, "content"));
    if (!json_is_integer(jid) || json_integer_value(jid) < 0 || !content || !*content) {
      free(tmp);
      return errf(err, errlen, "tokenizer.json: added token %zu lacks an id or content", i);
    }
    long id = (long)json_integer_value(jid);
    size_t clen = json_string_length(json_object_get(x, "content"));
    if (ensure_ids(t, id)) return errf(err, errlen, "out of memory");
    int special = json_is_true(json_object_get(x, "special"));
    json_t *jn = json_object_get(x, "normalized");
    int normalized = jn ? json_is_true(jn) : !special; /* HF's default when absent */
    /* decode form: ByteLevel-decoded when every char is in the alphabet, else
     * raw (HF) */
    free(tmp);
    tmp = malloc(clen + 1);
    if (!tmp) return errf(err, errlen, "out of memory");
    long nb = bl_decode((const uint8_t *)content, clen, tmp);
    long doff = nb >= 0 ? arena_put(t, tmp, (size_t)nb) : arena_put(t, content, clen);
    if (doff < 0) {
      free(tmp);
      return errf(err, errlen, "out of memory");
    }
    t->dec[id] = (span){(uint32_t)doff, (uint32_t)(nb >= 0 ? (size_t)nb : clen)};
    t->flags[id] |= TF_EXISTS | TF_ADDED | (special ? TF_SPECIAL : 0);
    /* match form: the content, normalised when the token says so */
    const uint8_t *m = (const uint8_t *)content;
    size_t mlen = clen;
    uint8_t *nm = NULL;
    if (normalized && t->n_norm) {
      nm = normalize_alloc(t, m, mlen, &mlen);
      if (!nm) {
        free(tmp);
        return errf(err, errlen, "tokenizer.json: added token %zu does not normalise", i);
      }
      m = nm;
    }
    long moff = mlen ? arena_put(t, m, mlen) : -1;
    free(nm);
    if (mlen == 0) continue;
    if (moff < 0) {
      free(tmp);
      return errf(err, errlen, "out of memory");
    }
    added_set *set = normalized ? &t->added_norm : &t->added_raw;
    set->a[set->n++] = (added_tok){(uint32_t)moff,
                                   (uint32_t)mlen,
                                   (int32_t)id,
                                   (uint8_t)json_is_true(json_object_get(x, "lstrip")),
                                   (uint8_t)json_is_true(json_object_get(x, "rstrip")),
                                   (uint8_t)json_is_true(json_object_get(x, "single_word"))};
  }
  free(tmp);
  added_set_finish(t, &t->added_raw);
  added_set_finish(t, &t->added_norm);
  return 0;
}

static void load_config(tokenizer *t, const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  json_error_t je;
  json_t *c = json_load_file(path, 0, &je);
  if (!c) return;
  json_t *ct = json_object_get(c, "chat_template");
  if (json_is_string(ct)) {
    t->chat_template = strdup(json_string_value(ct));
  } else if (json_is_array(ct)) { /* [{name, template}]: take "default" */
    size_t i;
    json_t *x;
    json_array_foreach(ct, i, x) {
      const char *name = json_string_value(json_object_get(x, "name"));
      const char *tpl = json_string_value(json_object_get(x, "template"));
      if (tpl && (!t->chat_template || (name && !strcmp(name, "default")))) {
        free(t->chat_template);
        t->chat_template = strdup(tpl);
      }
    }
  }
  json_t *eos = json_object_get(c, "eos_token");
  if (json_is_object(eos)) eos = json_object_get(eos, "content");
  if (json_is_string(eos)) t->eos_token = strdup(json_string_value(eos));
  json_decref(c);
}

tokenizer *tokenizer_load(const char *dir, char *err, size_t errlen) {
  pthread_once(&bl_once, bl_init);
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  size_t flen = 0;
  char *file = file_read(path, &flen);
  if (!file) {
    errf(err, errlen, "cannot read %s: %s", path, strerror(errno ? errno : ENOENT));
    return NULL;
  }
  tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    free(file);
    errf(err, errlen, "out of memory");
    return NULL;
  }
  for (int i = 0; i < CACHE_SHARDS; i++) pthread_mutex_init(&t->cache[i].mu, NULL);
  jspan vocab = {0}, merges = {0}, added = {0}, norm = {0}, pre = {0}, dec = {0}, mtype = {0},
        ign = {0}, bfb = {0}, cont = {0}, eow = {0};
  sbuf key = {0};
  json_t *jadded = NULL, *jnorm = NULL, *jpre = NULL, *jdec = NULL, *jx = NULL;
  const jspan_field model_fields[] = {
      {"vocab", &vocab},           {"merges", &merges},     {"type", &mtype},
      {"ignore_merges", &ign},     {"byte_fallback", &bfb}, {"continuing_subword_prefix", &cont},
      {"end_of_word_suffix", &eow}};
  const jspan_field top_fields[] = {
      {"added_tokens", &added}, {"normalizer", &norm}, {"pre_tokenizer", &pre}, {"decoder", &dec}};
  js s = {file, file + flen};
  int first = 1, r;
  if (js_expect(&s, '{')) goto bad;
  while ((r = js_obj_next(&s, &first, &key)) == 1) {
    if (!strcmp(key.p, "model")) {
      int mf = 1, mr;
      if (js_expect(&s, '{')) goto bad;
      while ((mr = js_obj_next(&s, &mf, &key)) == 1)
        if (jspan_keep(&s, key.p, model_fields, JSPAN_N(model_fields))) goto bad;
      if (mr < 0) goto bad;
      continue;
    }
    if (jspan_keep(&s, key.p, top_fields, JSPAN_N(top_fields))) goto bad;
  }
  if (r < 0) goto bad;
  if (!vocab.p || !merges.p) {
    errf(err, errlen, "%s: no BPE model (model.vocab / model.merges)", path);
    goto fail;
  }
  if (mtype.p) {
    jx = parse_span(mtype);
    if (!json_is_string(jx) || strcmp(json_string_value(jx), "BPE")) {
      errf(err, errlen, "%s: model type %s is not supported (BPE only)", path,
           json_is_string(jx) ? json_string_value(jx) : "?");
      goto fail;
    }
    json_decref(jx);
    jx = NULL;
  }
  {
    jspan strs[2] = {cont, eow};
    for (int i = 0; i < 2; i++) {
      if (!strs[i].p) continue;
      jx = parse_span(strs[i]);
      if (json_is_string(jx) && json_string_length(jx) > 0) {
        errf(err, errlen, "%s: BPE subword prefix/suffix is not supported", path);
        goto fail;
      }
      json_decref(jx);
      jx = NULL;
    }
    if (bfb.p) {
      jx = parse_span(bfb);
      if (json_is_true(jx)) {
        errf(err, errlen, "%s: BPE byte_fallback is not supported", path);
        goto fail;
      }
      json_decref(jx);
      jx = NULL;
    }
    if (ign.p) {
      jx = parse_span(ign);
      t->ignore_merges = json_is_true(jx);
      json_decref(jx);
      jx = NULL;
    }
  }
  long max_vocab;
  if (load_vocab(t, vocab, &max_vocab, err, errlen)) goto fail;
  if (load_merges(t, merges, err, errlen)) goto fail;
  for (int b = 0; b < 256; b++) {
    uint8_t c = (uint8_t)b;
    t->byte_id[b] = vocab_find(t, &c, 1);
  }
  jnorm = parse_span(norm);
  if (norm.p && !jnorm) goto bad;
  if (norm_from_json(t, jnorm, err, errlen)) goto fail;
  jpre = parse_span(pre);
  if (pre.p && !jpre) goto bad;
  int bytelevel = 0;
  if (pretok_from_json(t, jpre, &bytelevel, err, errlen)) goto fail;
  if (!bytelevel) {
    errf(err, errlen,
         "%s: only byte-level BPE tokenizers are supported (no ByteLevel "
         "pre_tokenizer)",
         path);
    goto fail;
  }
  jdec = parse_span(dec);
  {
    const char *dt = json_string_value(json_object_get(jdec, "type"));
    if (!dt || strcmp(dt, "ByteLevel")) {
      errf(err, errlen, "%s: decoder %s is not supported (ByteLevel only)", path, dt ? dt : "null");
      goto fail;
    }
  }
  jadded = parse_span(added);
  if (added.p && !jadded) goto bad;
  if (added_from_json(t, jadded, err, errlen)) goto fail;
  /* n_ids: one past the highest id that exists */
  {
    int n = 0;
    for (int i = 0; i < t->n_ids; i++)
      if (t->flags[i] & TF_EXISTS) n = i + 1;
    t->n_ids = n;
  }
  for (int i = 0; i < CACHE_SHARDS; i++) {
    t->cache[i].slot = calloc(CACHE_SLOTS, sizeof(cache_slot));
    if (!t->cache[i].slot) {
      errf(err, errlen, "out of memory");
      goto fail;
    }
  }
  load_config(t, dir);
  free(key.p);
  free(file);
  json_decref(jadded);
  json_decref(jnorm);
  json_decref(jpre);
  json_decref(jdec);
  return t;
bad:
  errf(err, errlen, "%s: malformed JSON", path);
fail:
  free(key.p);
  free(file);
  json_decref(jadded);
  json_decref(jnorm);
  json_decref(jpre);
  json_decref(jdec);
  json_decref(jx);
  tokenizer_free(t);
  return NULL;
}

void tokenizer_free(tokenizer *t) {
  if (!t) return;
  free(t->arena);
  free(t->enc);
  free(t->dec);
  free(t->flags);
  free(t->vmap);
  free(t->mmap);
  for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
  free(t->added_raw.a);
  free(t->added_norm.a);
  free(t->chat_template);
  free(t->eos_token);
  for (int i = 0; i < CACHE_SHARDS; i++) {
    free(t->cache[i].slot);
    pthread_mutex_destroy(&t->cache[i].mu);
  }
  free(t);
}

/* ----------------------------------------------------------------------------------------
 */
/* encoding */

typedef struct {
  int32_t rank, pos;
} heap_ent;

typedef struct {
  const tokenizer *t;
  ivec out;
  pcre2_match_data *md;
  int32_t *sym, *rank, *nid, *prev, *next; /* BPE scratch, [cap] */
  size_t cap;
  heap_ent *heap;
  size_t heap_cap;
} enc_ctx;

static int ctx_reserve(enc_ctx *c, size_t n) {
  if (n <= c->cap) return 0;
  size_t cap = c->cap ? c->cap : 256;
  while (cap < n) cap *= 2;
  int32_t **arrs[5] = {&c->sym, &c->rank, &c->nid, &c->prev, &c->next};
  for (int i = 0; i < 5; i++) {
    int32_t *p = realloc(*arrs[i], cap * sizeof(int32_t));
    if (!p) return -1;
    *arrs[i] = p;
  }
  c->cap = cap;
  return 0;
}

static void pair_rank(const tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *nid) {
  const merge_slot *m = merge_find(t, a, b);
  *rank = m ? m->rank : INT32_MAX;
  *nid = m ? m->id : -1;
}

/* Short words: an array of symbols with the rank of each adjacent pair cached.
 */
static int bpe_linear(enc_ctx *c, int32_t *sym, size_t m) {
  const tokenizer *t = c->t;
  int32_t *rank = c->rank, *nid = c->nid;
  for (size_t i = 0; i + 1 < m; i++) pair_rank(t, sym[i], sym[i + 1], &rank[i], &nid[i]);
  while (m > 1) {
    size_t best = 0;
    int32_t br = INT32_MAX;
    for (size_t i = 0; i + 1 < m; i++)
      if (rank[i] < br) {
        br = rank[i];
        best = i;
      }
    if (br == INT32_MAX) break;
    sym[best] = nid[best];
    /* drop symbol best+1 and pair best+1; pairs after it shift down */
    memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
    if (m >= best + 3) {
      memmove(rank + best + 1, rank + best + 2, (m - best - 3) * sizeof *rank);
      memmove(nid + best + 1, nid + best + 2, (m - best - 3) * sizeof *nid);
    }
    m--;
    if (best + 1 < m) pair_rank(t, sym[best], sym[best + 1], &rank[best], &nid[best]);
    if (best > 0) pair_rank(t, sym[best - 1], sym[best], &rank[best - 1], &nid[best - 1]);
  }
  for (size_t i = 0; i < m; i++)
    if (ivec_push(&c->out, sym[i])) return -1;
  return 0;
}

static int heap_less(heap_ent a, heap_ent b) {
  return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static int heap_push(enc_ctx *c, size_t *n, heap_ent e) {
  if (*n == c->heap_cap) {
    size_t cap = c->heap_cap ? c->heap_cap * 2 : 1024;
    heap_ent *h = realloc(c->heap, cap * sizeof *h);
    if (!h) return -1;
    c->heap = h;
    c->heap_cap = cap;
  }
  heap_ent *h = c->heap;
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(e, h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = e;
  return 0;
}

static heap_ent heap_pop(enc_ctx *c, size_t *n) {
  heap_ent *h = c->heap, top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    heap_ent mv = last;
    if (l < *n && heap_less(h[l], mv)) {
      m = l;
      mv = h[l];
    }
    if (r < *n && heap_less(h[r], mv)) m = r;
    if (m == i) break;
    h[i] = h[m];
    i = m;
  }
  if (*n) h[i] = last;
  return top;
}

/* Long words: a linked list of symbols and a heap of (rank, position)
 * candidates; a popped candidate is used only if the pair it names is still
 * there. */
static int bpe_heap(enc_ctx *c, int32_t *sym, size_t m) {
  const tokenizer *t = c->t;
  int32_t *prev = c->prev, *next = c->next, *nid = c->nid;
  size_t hn = 0;
  for (size_t i = 0; i < m; i++) {
    prev[i] = (int32_t)i - 1;
    next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < m; i++) {
    int32_t r, id;
    pair_rank(t, sym[i], sym[i + 1], &r, &id);
    if (r != INT32_MAX && heap_push(c, &hn, (heap_ent){r, (int32_t)i})) return -1;
  }
  /* nid[i] < 0 marks a symbol merged away */
  for (size_t i = 0; i < m; i++) nid[i] = 0;
  while (hn) {
    heap_ent e = heap_pop(c, &hn);
    int32_t p = e.pos;
    if (nid[p] < 0 || next[p] < 0) continue;
    int32_t q = next[p];
    const merge_slot *ms = merge_find(t, sym[p], sym[q]);
    if (!ms || ms->rank != e.rank) continue;
    sym[p] = ms->id;
    nid[q] = -1;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    int32_t r, id;
    if (prev[p] >= 0) {
      pair_rank(t, sym[prev[p]], sym[p], &r, &id);
      if (r != INT32_MAX && heap_push(c, &hn, (heap_ent){r, prev[p]})) return -1;
    }
    if (next[p] >= 0) {
      pair_rank(t, sym[p], sym[next[p]], &r, &id);
      if (r != INT32_MAX && heap_push(c, &hn, (heap_ent){r, p})) return -1;
    }
  }
  for (int32_t i = 0; i >= 0; i = next[i])
    if (ivec_push(&c->out, sym[i])) return -1;
  return 0;
}

static int cache_get(const tokenizer *t, const uint8_t *s, size_t n, uint64_t h, ivec *out) {
  cache_shard *sh = (cache_shard *)&t->cache[h % CACHE_SHARDS];
  int hit = 0;
  pthread_mutex_lock(&sh->mu);
  cache_slot *e = &sh->slot[(h >> 8) & (CACHE_SLOTS - 1)];
  int32_t ids[CACHE_IDS_MAX];
  uint8_t k = 0;
  if (e->klen == n && e->nids && memcmp(e->key, s, n) == 0) {
    hit = 1;
    k = e->nids;
    memcpy(ids, e->ids, k * sizeof *ids);
  }
  pthread_mutex_unlock(&sh->mu);
  if (!hit) return 0;
  for (uint8_t i = 0; i < k; i++)
    if (ivec_push(out, ids[i])) return -1;
  return 1;
}

static void cache_put(const tokenizer *t, const uint8_t *s, size_t n, uint64_t h,
                      const int32_t *ids, size_t k) {
  if (k > CACHE_IDS_MAX) return;
  cache_shard *sh = (cache_shard *)&t->cache[h % CACHE_SHARDS];
  pthread_mutex_lock(&sh->mu);
  cache_slot *e = &sh->slot[(h >> 8) & (CACHE_SLOTS - 1)];
  e->klen = (uint8_t)n;
  e->nids = (uint8_t)k;
  memcpy(e->key, s, n);
  memcpy(e->ids, ids, k * sizeof *ids);
  pthread_mutex_unlock(&sh->mu);
}

/* BPE of one pre-token (its raw bytes). */
static int bpe_word(enc_ctx *c, const uint8_t *s, size_t n) {
  const tokenizer *t = c->t;
  if (n == 0) return 0;
  if (n == 1) return t->byte_id[s[0]] >= 0 ? ivec_push(&c->out, t->byte_id[s[0]]) : 0;
  if (t->ignore_merges) {
    int32_t id = vocab_find(t, s, n);
    if (id >= 0) return ivec_push(&c->out, id);
  }
  uint64_t h = 0;
  if (n <= CACHE_KEY_MAX) {
    h = hash_bytes(s, n);
    int r = cache_get(t, s, n, h, &c->out);
    if (r) return r < 0 ? -1 : 0;
  }
  if (ctx_reserve(c, n)) return -1;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) /* bytes missing from the vocab are dropped, as HF */
    if (t->byte_id[s[i]] >= 0) c->sym[m++] = t->byte_id[s[i]];
  size_t before = c->out.n;
  int rc = m <= BPE_LINEAR_MAX ? bpe_linear(c, c->sym, m) : bpe_heap(c, c->sym, m);
  if (rc == 0 && n <= CACHE_KEY_MAX) cache_put(t, s, n, h, c->out.v + before, c->out.n - before);
  return rc;
}

/* Split regex number `level` over s[0..n): matches and the gaps between them
 * are pieces. */
static int pretok(enc_ctx *c, int level, const uint8_t *s, size_t n) {
  const tokenizer *t = c->t;
  if (level >= t->n_re) return bpe_word(c, s, n);
  size_t off = 0, last = 0;
  while (off < n) {
    int rc = pcre2_match(t->re[level], s, n, off, PCRE2_NO_UTF_CHECK, c->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0 && rc != 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    size_t ms = ov[0], me = ov[1];
    if (ms > last && pretok(c, level + 1, s + last, ms - last)) return -1;
    if (me > ms) {
      if (pretok(c, level + 1, s + ms, me - ms)) return -1;
      last = off = me;
    } else { /* empty match: step over one char */
      size_t len;
      if (ms >= n) break;
      utf8_step(s + ms, n - ms, &len, NULL);
      off = ms + len;
      last = ms;
    }
  }
  if (last < n && pretok(c, level + 1, s + last, n - last)) return -1;
  return 0;
}

/* NFC/NFD touch only text near "inert" code points' neighbours. A code point is
 * inert when it is a starter (ccc 0), has no canonical decomposition and is
 * never a non-first part of one (so nothing composes with it as the second
 * char). Normalisation then splits before every inert char: NF(XY) = NF(X)
 * NF(Y) when Y starts with one. Only the regions between inert chars that hold
 * a non-inert char go through utf8proc. Table: cp < INERT_MAX. */
#define INERT_MAX 0x30000
static uint8_t inert_bits[INERT_MAX / 8];
static pthread_once_t inert_once = PTHREAD_ONCE_INIT;

static void inert_init(void) {
  memset(inert_bits, 0xff, sizeof inert_bits);
  for (utf8proc_int32_t cp = 0; cp < INERT_MAX; cp++) {
    utf8proc_int32_t d[32];
    int bc = 0;
    utf8proc_ssize_t k = utf8proc_decompose_char(cp, d, 32, UTF8PROC_DECOMPOSE, &bc);
    if (utf8proc_get_property(cp)->combining_class != 0 || k != 1 || d[0] != cp)
      inert_bits[cp >> 3] &= (uint8_t) ~(1u << (cp & 7));
    for (utf8proc_ssize_t j = 1; j < k && j < 32; j++)
      if (d[j] >= 0 && d[j] < INERT_MAX) inert_bits[d[j] >> 3] &= (uint8_t) ~(1u << (d[j] & 7));
  }
}

static int is_inert(uint32_t cp) { return cp < INERT_MAX && (inert_bits[cp >> 3] >> (cp & 7) & 1); }

/* One canonical normalisation (NFC or NFD) of s, region by region. */
static uint8_t *normalize_canon(const uint8_t *s, size_t n, int opts, size_t *out_n) {
  sbuf o = {0};
  size_t i = 0, copied = 0, last_inert = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      last_inert = i++;
      continue;
    }
    size_t len;
    uint32_t cp = 0;
    utf8_step(s + i, n - i, &len, &cp);
    if (is_inert(cp)) {
      last_inert = i;
      i += len;
      continue;
    }
    /* region [last_inert, next inert char) goes through utf8proc */
    size_t rs = last_inert >= copied ? last_inert : copied, re = i + len;
    while (re < n) {
      uint32_t c2 = s[re];
      size_t l2 = 1;
      if (c2 >= 0x80) utf8_step(s + re, n - re, &l2, &c2);
      if (is_inert(c2)) break;
      re += l2;
    }
    if (rs > copied && sbuf_put(&o, s + copied, rs - copied)) goto oom;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r =
        utf8proc_map(s + rs, (utf8proc_ssize_t)(re - rs), &dst, (utf8proc_option_t)opts);
    if (r < 0) goto oom;
    int bad = sbuf_put(&o, dst, (size_t)r);
    free(dst);
    if (bad) goto oom;
    copied = i = last_inert = re;
  }
  if (n > copied && sbuf_put(&o, s + copied, n - copied)) goto oom;
  if (!o.p && sbuf_put(&o, "", 0)) goto oom;
  *out_n = o.n;
  return (uint8_t *)o.p;
oom:
  free(o.p);
  return NULL;
}

/* Applies the normaliser chain; returns a malloc'd copy (NULL on failure). */
static uint8_t *normalize_alloc(const tokenizer *t, const uint8_t *s, size_t n, size_t *out_n) {
  uint8_t *cur = malloc(n + 1);
  if (!cur) return NULL;
  memcpy(cur, s, n);
  cur[n] = 0;
  size_t cn = n;
  for (int i = 0; i < t->n_norm; i++) {
    int opts = t->norm_opts[i];
    int need = 0;
    for (size_t k = 0; k < cn && !need; k++) need = cur[k] >= 0x80;
    if (!need) continue; /* ASCII is left alone by every form */
    uint8_t *next;
    size_t nn;
    if (!(opts & UTF8PROC_COMPAT)) {
      pthread_once(&inert_once, inert_init);
      next = normalize_canon(cur, cn, opts, &nn);
    } else {
      utf8proc_uint8_t *dst = NULL;
      utf8proc_ssize_t r = utf8proc_map(cur, (utf8proc_ssize_t)cn, &dst, (utf8proc_option_t)opts);
      next = r < 0 ? NULL : dst;
      nn = r < 0 ? 0 : (size_t)r;
    }
    free(cur);
    if (!next) return NULL;
    cur = next;
    cn = nn;
  }
  *out_n = cn;
  return cur;
}

static int encode_normalized(enc_ctx *c, const uint8_t *s, size_t n);

/* Finds the added tokens of set in s[0..n); the text between goes to next(). */
static int split_added(enc_ctx *c, const added_set *set, const uint8_t *s, size_t n,
                       int (*next)(enc_ctx *, const uint8_t *, size_t)) {
  const tokenizer *t = c->t;
  if (set->n == 0) return n ? next(c, s, n) : 0;
  size_t pos = 0, i = 0, prev_stop = 0;
  while (i < n) {
    int b0 = set->start[s[i]], b1 = set->start[s[i] + 1];
    const added_tok *hit = NULL;
    for (int k = b0; k < b1; k++) {
      const added_tok *a = &set->a[k];
      if (a->len <= n - i && memcmp(t->arena + a->off, s + i, a->len) == 0) {
        hit = a;
        break;
      }
    }
    if (!hit) {
      i++;
      continue;
    }
    size_t ms = i, me = i + hit->len, l;
    if (hit->single_word) {
      int ok = (ms == 0 || !is_word_cp(cp_before(s, ms, &l)));
      if (ok && me < n) {
        uint32_t cp = 0;
        utf8_step(s + me, n - me, &l, &cp);
        ok = !is_word_cp(cp);
      }
      if (!ok) {
        i = me;
        continue;
      }
    }
    if (hit->lstrip)
      while (ms > prev_stop && is_space_cp(cp_before(s, ms, &l))) ms -= l;
    if (hit->rstrip)
      while (me < n) {
        uint32_t cp = 0;
        utf8_step(s + me, n - me, &l, &cp);
        if (!is_space_cp(cp)) break;
        me += l;
      }
    if (ms > pos && next(c, s + pos, ms - pos)) return -1;
    if (ivec_push(&c->out, hit->id)) return -1;
    pos = prev_stop = i = me;
  }
  if (pos < n && next(c, s + pos, n - pos)) return -1;
  return 0;
}

static int encode_pretok(enc_ctx *c, const uint8_t *s, size_t n) { return pretok(c, 0, s, n); }

static int encode_normalized(enc_ctx *c, const uint8_t *s, size_t n) {
  return split_added(c, &c->t->added_norm, s, n, encode_pretok);
}

static int encode_raw_piece(enc_ctx *c, const uint8_t *s, size_t n) {
  if (!c->t->n_norm) return encode_normalized(c, s, n);
  size_t nn;
  uint8_t *ns = normalize_alloc(c->t, s, n, &nn);
  if (!ns) return -1;
  int rc = encode_normalized(c, ns, nn);
  free(ns);
  return rc;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, char *err,
                     size_t errlen) {
  *ids = NULL;
  const uint8_t *s = (const uint8_t *)text;
  size_t bad = utf8_valid_prefix(s, len);
  if (bad < len) return errf(err, errlen, "input is not valid UTF-8 (byte %zu)", bad);
  enc_ctx c = {.t = t};
  int rc = -1;
  c.md = pcre2_match_data_create(1, NULL);
  if (!c.md || fault_hit("tokenizer_encode")) goto done;
  if (split_added(&c, &t->added_raw, s, len, encode_raw_piece)) goto done;
  rc = 0;
done:
  pcre2_match_data_free(c.md);
  free(c.sym);
  free(c.rank);
  free(c.nid);
  free(c.prev);
  free(c.next);
  free(c.heap);
  if (rc) {
    free(c.out.v);
    errf(err, errlen, "tokenizer: out of memory while encoding");
    return TOKENIZER_ENOMEM;
  }
  if (!c.out.v) c.out.v = malloc(sizeof(int32_t)); /* a valid pointer even for no ids */
  if (!c.out.v) {
    errf(err, errlen, "tokenizer: out of memory while encoding");
    return TOKENIZER_ENOMEM;
  }
  *ids = c.out.v;
  return (int)c.out.n;
}

/* ----------------------------------------------------------------------------------------
 */
/* decoding and queries */

long tokenizer_decode(const tokenizer *t, const int32_t *ids, int n, int skip_special, char **out) {
  *out = NULL;
  sbuf raw = {0};
  for (int i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->n_ids) {
      free(raw.p);
      return -1;
    }
    if (skip_special && (t->flags[id] & TF_SPECIAL)) continue;
    span d = t->dec[id];
    if (d.len && sbuf_put(&raw, t->arena + d.off, d.len)) {
      free(raw.p);
      return -1;
    }
  }
  char *buf = NULL;
  size_t blen = 0, bcap = 0;
  long r = utf8_lossy_append((const uint8_t *)(raw.p ? raw.p : ""), raw.n, 0, &buf, &blen, &bcap);
  free(raw.p);
  if (r < 0) {
    free(buf);
    return -1;
  }
  *out = buf;
  return (long)blen;
}

int tokenizer_vocab_size(const tokenizer *t) { return t->n_ids; }

int tokenizer_token_id(const tokenizer *t, const char *token) {
  size_t n = strlen(token);
  const added_set *sets[2] = {&t->added_raw, &t->added_norm};
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < sets[k]->n; i++) {
      const added_tok *a = &sets[k]->a[i];
      if (a->len == n && memcmp(t->arena + a->off, token, n) == 0) return a->id;
    }
  uint8_t *tmp = malloc(n + 1);
  if (!tmp) return -1;
  long nb = bl_decode((const uint8_t *)token, n, tmp);
  int32_t id = nb >= 0 ? vocab_find(t, tmp, (size_t)nb) : vocab_find(t, (const uint8_t *)token, n);
  free(tmp);
  return id;
}

const char *tokenizer_config_chat_template(const tokenizer *t) { return t->chat_template; }
const char *tokenizer_eos_token(const tokenizer *t) { return t->eos_token; }

int tokenizer_is_special(const tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_ids && (t->flags[id] & TF_SPECIAL) != 0;
}

int tokenizer_is_added(const tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_ids && (t->flags[id] & TF_ADDED) != 0;
}

int tokenizer_token_bytes(const tokenizer *t, int32_t id, const char **bytes, size_t *len) {
  if (id < 0 || id >= t->n_ids) return -1;
  *bytes = (const char *)t->arena + t->dec[id].off;
  *len = t->dec[id].len;
  return 0;
}
