/* json_schema — compiles a JSON schema (json_schema.h has the subset) into the node table that
 * json_mask.c follows.
 *
 * Compilation: the root is compiled first, then each $ref target once (a worklist, so a long
 * chain of definitions does not deepen the C stack), each $ref first a placeholder node that is
 * resolved afterwards; then enum / const values are filtered by the schema beside them (a small
 * validator over the nodes) and put in a byte trie of their canonical encodings, the union
 * (anyOf / oneOf / type list) tables are built (byte -> branch, ambiguity rejected), and every
 * node's md (the nesting depth its smallest instance needs) is found by a fixpoint, so that the
 * mask only opens what it can close within JSON_MASK_MAX_DEPTH. Nothing of the json_t is kept. */
#define DS_JSON_SCHEMA_INTERNAL
#include "sampler/json_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/json_mask.h"

#define JS_MAX_ENUM 256        /* values of one enum */
#define JS_MAX_LEVEL 128       /* nesting of the schema document */
#define JS_MAX_NODES (1 << 17) /* compiled nodes */
#define JS_MAX_PROPS (1 << 18) /* properties, all objects together */
#define JS_MAX_BR (1 << 18)    /* anyOf / oneOf / type branches, all together */
#define JS_MAX_TRIE (1 << 20)  /* trie nodes */
#define JS_MAX_BITS (1 << 20)  /* 64-bit words of the key tries' property sets */
#define JS_MAX_COUNT 2147483647LL
#define JS_MAX_DFA_STATES (1 << 16) /* states of one string's automaton */
#define JS_MAX_DFA_TOTAL (1 << 18)  /* all automata's states together */
#define JS_MAX_ALLOF 256            /* schemas merged into one by allOf ($ref targets included) */

/* compile-time detail of a node */
typedef struct caux {
  int br0, nbr;    /* SN_UNION: its branches in cc.br */
  json_t *vals;    /* SN_ENUM: its values (a new array) */
  int base;        /* SN_ENUM: the node its values must also be valid under */
  char *path;      /* SN_UNION, SN_ENUM: where it is, for messages */
  const char *kw;  /* SN_UNION: "anyOf", "oneOf" or "type" */
  int all_objects; /* SN_ENUM: every kept value is an object */
} caux;

typedef struct work {
  const json_t *sch;
  int ph;
  char *path;
} work;

typedef struct cc {
  json_schema *s;
  const json_t *root;
  char *err;
  size_t errlen;
  int failed;
  size_t cap_nodes, n_props, cap_props, n_freq, cap_freq, n_first, cap_first, n_tn, cap_tn, n_e,
      cap_e, cap_ech, n_bits, cap_bits, n_br, cap_br, n_wl, cap_wl, cap_pname;
  caux *aux;
  int *br;
  char **pname; /* [n_props] property names */
  size_t *pnamelen;
  int *psort;            /* [n_props] each object's property indices (from its first) by name */
  const json_t **memo_k; /* $ref targets (open addressing on the pointer) -> memo_v */
  int *memo_v;
  size_t memo_cap, memo_n;
  work *wl;
  size_t n_pitems, cap_pitems, n_nums, cap_nums, cap_dfa, dfa_total;
  json_t **keep; /* schemas made by merging (allOf), alive until the end */
  size_t n_keep, cap_keep;
  char path[512];
  size_t plen;
} cc;

/* ---- errors and memory ------------------------------------------------------------------ */

static int fail(cc *c, const char *fmt, ...) {
  if (c->failed) return -1;
  c->failed = 1;
  if (!c->errlen) return -1;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(c->err, c->errlen, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < c->errlen)
    snprintf(c->err + n, c->errlen - (size_t)n, " (at %s)", c->path);
  return -1;
}

static int oom(cc *c) {
  if (!c->failed && c->errlen) snprintf(c->err, c->errlen, "out of memory");
  c->failed = 1;
  return -1;
}

static int grow(cc *c, void *pp, size_t *cap, size_t need, size_t sz) {
  void **p = (void **)pp;
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 16;
  while (nc < need) nc *= 2;
  void *q = realloc(*p, nc * sz);
  if (!q) return oom(c);
  *p = q;
  *cap = nc;
  return 0;
}

/* appends "/" seg (JSON-pointer escaped, at most 60 bytes of it) to the path; returns the old
 * length for path_pop */
static size_t path_push(cc *c, const char *seg, size_t n) {
  size_t old = c->plen;
  char buf[200];
  size_t k = 0;
  buf[k++] = '/';
  for (size_t i = 0; i < n && k < 190; i++) {
    if (i == 60) {
      memcpy(buf + k, "...", 3);
      k += 3;
      break;
    }
    if (seg[i] == '~' || seg[i] == '/') {
      buf[k++] = '~';
      buf[k++] = seg[i] == '~' ? '0' : '1';
    } else {
      buf[k++] = seg[i] ? seg[i] : '?';
    }
  }
  if (c->plen + k < sizeof c->path) {
    memcpy(c->path + c->plen, buf, k);
    c->plen += k;
    c->path[c->plen] = 0;
  }
  return old;
}

static size_t path_push2(cc *c, const char *kw, const char *seg, size_t n) {
  size_t old = path_push(c, kw, strlen(kw));
  path_push(c, seg, n);
  return old;
}

static size_t path_push_i(cc *c, const char *kw, size_t i) {
  char b[32];
  int n = snprintf(b, sizeof b, "%zu", i);
  return path_push2(c, kw, b, (size_t)n);
}

static void path_pop(cc *c, size_t old) {
  c->plen = old;
  c->path[old] = 0;
}

static char *path_dup(cc *c) {
  char *p = strdup(c->path);
  if (!p) oom(c);
  return p;
}

static int new_node(cc *c, int kind) {
  json_schema *s = c->s;
  if (s->nn >= JS_MAX_NODES) return fail(c, "the schema is too large");
  size_t cap = c->cap_nodes;
  if (grow(c, &s->nodes, &c->cap_nodes, (size_t)s->nn + 1, sizeof *s->nodes)) return -1;
  if (c->cap_nodes != cap) {
    caux *a = realloc(c->aux, c->cap_nodes * sizeof *a);
    if (!a) return oom(c);
    c->aux = a;
  }
  int i = s->nn++;
  memset(&s->nodes[i], 0, sizeof s->nodes[i]);
  memset(&c->aux[i], 0, sizeof c->aux[i]);
  s->nodes[i].kind = (uint8_t)kind;
  s->nodes[i].md = SN_MD_NONE;
  s->nodes[i].sub = -1;
  s->nodes[i].ap = -1;
  c->aux[i].base = -1;
  c->aux[i].br0 = -1;
  return i;
}

static int new_tnode(cc *c, int nw) {
  json_schema *s = c->s;
  if (c->n_tn >= JS_MAX_TRIE || c->n_bits + (size_t)nw > JS_MAX_BITS)
    return fail(c, "the schema is too large");
  if (grow(c, &s->tn, &c->cap_tn, c->n_tn + 1, sizeof *s->tn)) return -1;
  if (grow(c, &s->bits, &c->cap_bits, c->n_bits + (size_t)nw + 1, sizeof *s->bits)) return -1;
  int i = (int)c->n_tn++;
  s->tn[i].e0 = 0;
  s->tn[i].ne = 0;
  s->tn[i].term = -1;
  s->tn[i].bits = (int32_t)c->n_bits;
  memset(s->bits + c->n_bits, 0, (size_t)nw * sizeof *s->bits);
  c->n_bits += (size_t)nw;
  return i;
}

/* ---- tries of literals ------------------------------------------------------------------ */

typedef struct lit {
  const unsigned char *b;
  size_t n;
  int term;
} lit;

static int lit_cmp(const void *pa, const void *pb) {
  const lit *a = pa, *b = pb;
  size_t n = a->n < b->n ? a->n : b->n;
  int r = memcmp(a->b, b->b, n);
  if (r) return r;
  return a->n < b->n ? -1 : a->n > b->n;
}

typedef struct tq {
  int lo, hi, node;
  size_t d;
} tq;

/* A trie of the literals L[n] (sorted and deduplicated here); nw > 0: each node's set of the
 * terms below it (terms < 64 * nw). Returns the root, -1 on failure. */
static int trie_build(cc *c, lit *L, int n, int nw) {
  json_schema *s = c->s;
  qsort(L, (size_t)n, sizeof *L, lit_cmp);
  int m = 0;
  for (int i = 0; i < n; i++)
    if (!m || lit_cmp(&L[m - 1], &L[i])) L[m++] = L[i];
  tq *q = malloc(sizeof *q * 16);
  size_t nq = 0, cap = 16;
  int root = new_tnode(c, nw);
  if (!q || root < 0) {
    free(q);
    return q ? -1 : oom(c);
  }
  q[nq++] = (tq){0, m, root, 0};
  for (size_t qi = 0; qi < nq; qi++) {
    tq t = q[qi];
    int lo = t.lo;
    if (nw)
      for (int i = lo; i < t.hi; i++)
        s->bits[s->tn[t.node].bits + L[i].term / 64] |= (uint64_t)1 << (L[i].term % 64);
    if (lo < t.hi && L[lo].n == t.d) s->tn[t.node].term = L[lo++].term;
    int g = 0;
    for (int i = lo; i < t.hi;) {
      unsigned char b = L[i].b[t.d];
      while (i < t.hi && L[i].b[t.d] == b) i++;
      g++;
    }
    if (!g) continue;
    size_t e0 = c->n_e;
    if (grow(c, &s->ec, &c->cap_e, e0 + (size_t)g, 1) ||
        grow(c, &s->ech, &c->cap_ech, e0 + (size_t)g, sizeof *s->ech) ||
        (nq + (size_t)g > cap && grow(c, &q, &cap, nq + (size_t)g, sizeof *q))) {
      free(q);
      return -1;
    }
    c->n_e += (size_t)g;
    s->tn[t.node].e0 = (int32_t)e0;
    s->tn[t.node].ne = g;
    int k = 0;
    for (int i = lo; i < t.hi;) {
      int j = i;
      unsigned char b = L[i].b[t.d];
      while (j < t.hi && L[j].b[t.d] == b) j++;
      int ch = new_tnode(c, nw);
      if (ch < 0) {
        free(q);
        return -1;
      }
      s->ec[e0 + (size_t)k] = b;
      s->ech[e0 + (size_t)k] = ch;
      k++;
      q[nq++] = (tq){i, j, ch, t.d + 1};
      i = j;
    }
  }
  free(q);
  return root;
}

/* ---- canonical encodings ---------------------------------------------------------------- */

/* the fewest significant digits (1..17) that read back to d */
static int real_digits(double d) {
  char b[40];
  for (int p = 1; p < 17; p++) {
    snprintf(b, sizeof b, "%.*g", p, d);
    if (strtod(b, NULL) == d) return p;
  }
  return 17;
}

/* the most digits any real in v needs; its nesting depth in *depth */
static int value_scan(const json_t *v, int *depth) {
  int p = 0, d = 0;
  if (json_is_real(v)) {
    p = real_digits(json_real_value(v));
  } else if (json_is_object(v)) {
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
      int dd = 0, pp = value_scan(x, &dd);
      if (pp > p) p = pp;
      if (dd > d) d = dd;
    }
    d++;
  } else if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++) {
      int dd = 0, pp = value_scan(json_array_get(v, i), &dd);
      if (pp > p) p = pp;
      if (dd > d) d = dd;
    }
    d++;
  }
  *depth = d;
  return p;
}

static char *canon(const json_t *v, int *depth) {
  int p = value_scan(v, depth);
  size_t flags = JSON_ENCODE_ANY | JSON_COMPACT;
  if (p) flags |= JSON_REAL_PRECISION(p);
  return json_dumps(v, flags);
}

/* ---- keywords --------------------------------------------------------------------------- */

static const char *const annotations[] = {
    "title",      "description", "default",   "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly",    "writeOnly", "strict",   "name",    NULL};
static const char *const supported[] = {"type",
                                        "properties",
                                        "required",
                                        "additionalProperties",
                                        "items",
                                        "minItems",
                                        "maxItems",
                                        "minLength",
                                        "maxLength",
                                        "enum",
                                        "const",
                                        "anyOf",
                                        "oneOf",
                                        "$ref",
                                        "$defs",
                                        "definitions",
                                        "minimum",
                                        "maximum",
                                        "exclusiveMinimum",
                                        "exclusiveMaximum",
                                        "multipleOf",
                                        "pattern",
                                        "format",
                                        "allOf",
                                        "prefixItems",
                                        "additionalItems",
                                        NULL};

static int in_list(const char *const *l, const char *k) {
  for (; *l; l++)
    if (!strcmp(*l, k)) return 1;
  return 0;
}

/* a count keyword (an integer 0..2^31-1, an integral real accepted); absent leaves *out */
static int get_count(cc *c, const json_t *sch, const char *kw, uint32_t *out) {
  const json_t *v = json_object_get(sch, kw);
  if (!v) return 0;
  double d = json_is_integer(v) ? (double)json_integer_value(v)
             : json_is_real(v)  ? json_real_value(v)
                                : -1;
  if (!(d >= 0 && d <= (double)JS_MAX_COUNT && d == (double)(long long)d))
    return fail(c, "'%s' must be a non-negative integer (at most %lld)", kw, JS_MAX_COUNT);
  *out = (uint32_t)d;
  return 0;
}

static int cnode(cc *c, const json_t *sch, int level);

/* ---- $ref ------------------------------------------------------------------------------- */

static size_t memo_slot(const cc *c, const json_t *k) {
  uintptr_t h = (uintptr_t)k;
  h ^= h >> 17;
  h *= (uintptr_t)0x9E3779B97F4A7C15ULL;
  return (size_t)(h >> 7) & (c->memo_cap - 1);
}

/* the placeholder of $ref target k, -1 when none yet */
static int memo_get(const cc *c, const json_t *k) {
  if (!c->memo_cap) return -1;
  for (size_t i = memo_slot(c, k);; i = (i + 1) & (c->memo_cap - 1)) {
    if (!c->memo_k[i]) return -1;
    if (c->memo_k[i] == k) return c->memo_v[i];
  }
}

static int memo_put(cc *c, const json_t *k, int v) {
  if (2 * (c->memo_n + 1) > c->memo_cap) {
    size_t ncap = c->memo_cap ? 2 * c->memo_cap : 64;
    const json_t **ok = c->memo_k;
    int *ov = c->memo_v;
    size_t ocap = c->memo_cap;
    c->memo_k = calloc(ncap, sizeof *c->memo_k);
    c->memo_v = calloc(ncap, sizeof *c->memo_v);
    if (!c->memo_k || !c->memo_v) {
      free(c->memo_k);
      free(c->memo_v);
      c->memo_k = ok;
      c->memo_v = ov;
      return oom(c);
    }
    c->memo_cap = ncap;
    c->memo_n = 0;
    for (size_t i = 0; i < ocap; i++)
      if (ok[i]) {
        size_t j = memo_slot(c, ok[i]);
        while (c->memo_k[j]) j = (j + 1) & (ncap - 1);
        c->memo_k[j] = ok[i];
        c->memo_v[j] = ov[i];
        c->memo_n++;
      }
    free(ok);
    free(ov);
  }
  size_t j = memo_slot(c, k);
  while (c->memo_k[j]) j = (j + 1) & (c->memo_cap - 1);
  c->memo_k[j] = k;
  c->memo_v[j] = v;
  c->memo_n++;
  return 0;
}

/* the schema $ref ref names, NULL with an error */
static const json_t *ref_lookup(cc *c, const json_t *ref) {
  if (!json_is_string(ref)) {
    fail(c, "'$ref' must be a string");
    return NULL;
  }
  const char *r = json_string_value(ref);
  const json_t *target = NULL;
  const char *defs_kw = NULL, *name = NULL;
  if (!strcmp(r, "#")) {
    target = c->root;
  } else if (!strncmp(r, "#/$defs/", 8)) {
    defs_kw = "$defs";
    name = r + 8;
  } else if (!strncmp(r, "#/definitions/", 14)) {
    defs_kw = "definitions";
    name = r + 14;
  }
  if (!target && (!name || !*name || strchr(name, '/'))) {
    fail(c,
         "'$ref' \"%.80s\" is not supported: only \"#\", \"#/$defs/NAME\" and "
         "\"#/definitions/NAME\"",
         r);
    return NULL;
  }
  if (!target) {
    size_t n = strlen(name), k = 0;
    char *un = malloc(n + 1);
    if (!un) {
      oom(c);
      return NULL;
    }
    for (size_t i = 0; i < n; i++) {
      if (name[i] == '~' && (name[i + 1] == '0' || name[i + 1] == '1')) {
        un[k++] = name[i + 1] == '0' ? '~' : '/';
        i++;
      } else {
        un[k++] = name[i];
      }
    }
    const json_t *defs = json_object_get(c->root, defs_kw);
    target = json_is_object(defs) ? json_object_getn(defs, un, k) : NULL;
    free(un);
    if (!target) fail(c, "'$ref' target \"%.80s\" is not found", r);
  }
  return target;
}

static int cref(cc *c, const json_t *ref) {
  const json_t *target = ref_lookup(c, ref);
  if (!target) return -1;
  const char *r = json_string_value(ref);
  int ph = memo_get(c, target);
  if (ph >= 0) return ph;
  ph = new_node(c, SN_REF);
  if (ph < 0 || grow(c, &c->wl, &c->cap_wl, c->n_wl + 1, sizeof *c->wl) || memo_put(c, target, ph))
    return -1;
  char *p = strdup(r);
  if (!p) return oom(c);
  c->wl[c->n_wl++] = (work){target, ph, p};
  return ph;
}

/* ---- objects, arrays, strings ----------------------------------------------------------- */

static int name_cmp2(const char *a, size_t an, const char *b, size_t bn) {
  int r = memcmp(a, b, an < bn ? an : bn);
  return r ? r : an < bn ? -1 : an > bn;
}

typedef struct pname_ix {
  const char *name;
  size_t len;
  int ix;
} pname_ix;

static int name_cmp(const void *pa, const void *pb) {
  const pname_ix *a = pa, *b = pb;
  return name_cmp2(a->name, a->len, b->name, b->len);
}

/* the index (from p0) of the property named nm[nl] among props[p0 .. p0 + np), -1 if none */
static int prop_find(const cc *c, size_t p0, size_t np, const char *nm, size_t nl) {
  size_t lo = 0, hi = np;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    size_t k = p0 + (size_t)c->psort[p0 + mid];
    int r = name_cmp2(c->pname[k], c->pnamelen[k], nm, nl);
    if (r < 0)
      lo = mid + 1;
    else if (r > 0)
      hi = mid;
    else
      return c->psort[p0 + mid];
  }
  return -1;
}

static int cobject(cc *c, const json_t *sch, int level) {
  json_schema *s = c->s;
  const json_t *props = json_object_get(sch, "properties");
  const json_t *req = json_object_get(sch, "required");
  const json_t *ap = json_object_get(sch, "additionalProperties");
  if (props && !json_is_object(props)) return fail(c, "'properties' must be an object");
  if (req && !json_is_array(req)) return fail(c, "'required' must be an array of names");
  /* additionalProperties true or a schema: keys other than the properties, each value valid
   * under that schema (the mask writes such keys without escapes and never as a property's
   * name, see json_mask.c) */
  int apn = -1;
  if (ap && !json_is_false(ap)) {
    size_t o = path_push(c, "additionalProperties", 20);
    apn = cnode(c, ap, level + 1);
    path_pop(c, o);
    if (apn < 0) return -1;
  }
  if (!props && (!ap || apn == SN_ANY)) {
    if (json_array_size(req)) {
      const json_t *r0 = json_array_get(req, 0);
      return fail(c, "required property \"%.64s\" is not in 'properties'",
                  json_is_string(r0) ? json_string_value(r0) : "?");
    }
    return SN_ANY_OBJ;
  }
  size_t np = props ? json_object_size(props) : 0;
  if (np + c->n_props > (size_t)JS_MAX_PROPS) return fail(c, "the schema is too large");
  int node = new_node(c, SN_OBJECT);
  if (node < 0) return -1;
  size_t p0 = c->n_props;
  if (grow(c, &s->props, &c->cap_props, p0 + np, sizeof *s->props) ||
      grow(c, &c->pname, &c->cap_pname, p0 + np, sizeof *c->pname))
    return -1;
  {
    size_t cap = c->cap_pname;
    size_t *pl = realloc(c->pnamelen, (cap ? cap : 1) * sizeof *pl);
    if (!pl) return oom(c);
    c->pnamelen = pl;
    int *ps = realloc(c->psort, (cap ? cap : 1) * sizeof *ps);
    if (!ps) return oom(c);
    c->psort = ps;
  }
  for (size_t i = 0; i < np; i++) {
    s->props[p0 + i] = (ss_prop){-1, 0};
    c->pname[p0 + i] = NULL;
    c->pnamelen[p0 + i] = 0;
  }
  c->n_props = p0 + np;
  s->nodes[node].sub = (int32_t)p0;
  s->nodes[node].np = (int32_t)np;
  size_t i = 0;
  const char *key;
  size_t klen;
  json_t *val;
  if (props) json_object_keylen_foreach((json_t *)props, key, klen, val) {
      char *nm = malloc(klen + 1);
      if (!nm) return oom(c);
      memcpy(nm, key, klen);
      nm[klen] = 0;
      c->pname[p0 + i] = nm;
      c->pnamelen[p0 + i] = klen;
      size_t o = path_push2(c, "properties", key, klen);
      int ch = cnode(c, val, level + 1);
      path_pop(c, o);
      if (ch < 0) return -1;
      s->props[p0 + i].node = ch;
      i++;
    }
  {
    pname_ix *t = malloc((np ? np : 1) * sizeof *t);
    if (!t) return oom(c);
    for (size_t k = 0; k < np; k++)
      t[k] = (pname_ix){c->pname[p0 + k], c->pnamelen[p0 + k], (int)k};
    qsort(t, np, sizeof *t, name_cmp);
    for (size_t k = 0; k < np; k++) c->psort[p0 + k] = t[k].ix;
    free(t);
  }
  for (size_t r = 0; r < json_array_size(req); r++) {
    const json_t *rn = json_array_get(req, r);
    if (!json_is_string(rn)) return fail(c, "'required' must be an array of names");
    const char *nm = json_string_value(rn);
    size_t nl = json_string_length(rn);
    int jj = prop_find(c, p0, np, nm, nl);
    if (jj < 0) return fail(c, "required property \"%.64s\" is not in 'properties'", nm);
    size_t j = (size_t)jj;
    if (s->props[p0 + j].required) return fail(c, "'required' lists \"%.64s\" twice", nm);
    s->props[p0 + j].required = 1;
  }
  size_t f0 = c->n_freq;
  if (grow(c, &s->freq, &c->cap_freq, f0 + np + 1, sizeof *s->freq)) return -1;
  c->n_freq = f0 + np + 1;
  s->freq[f0 + np] = (uint32_t)np;
  for (size_t k = np; k-- > 0;)
    s->freq[f0 + k] = s->props[p0 + k].required ? (uint32_t)k : s->freq[f0 + k + 1];
  s->nodes[node].req = (int32_t)f0;
  /* the keys' trie */
  lit *L = calloc(np ? np : 1, sizeof *L);
  char **enc = calloc(np ? np : 1, sizeof *enc);
  int rc = 0;
  if (!L || !enc) rc = oom(c);
  for (size_t k = 0; k < np && !rc; k++) {
    json_t *js = json_stringn(c->pname[p0 + k], c->pnamelen[p0 + k]);
    if (!js) {
      size_t o = path_push2(c, "properties", c->pname[p0 + k], c->pnamelen[p0 + k]);
      rc = fail(c, "property name is not valid UTF-8");
      path_pop(c, o);
      break;
    }
    enc[k] = json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(js);
    if (!enc[k])
      rc = oom(c);
    else
      L[k] = (lit){(const unsigned char *)enc[k], strlen(enc[k]), (int)k};
  }
  int nw = (int)((np + 63) / 64);
  int root = rc ? -1 : trie_build(c, L, (int)np, nw);
  for (size_t k = 0; enc && k < np; k++) free(enc[k]);
  free(enc);
  free(L);
  if (root < 0) return -1;
  s->nodes[node].trie = root;
  s->nodes[node].nw = nw;
  s->nodes[node].ap = apn;
  return node;
}

/* the nodes of the schemas of array l (keyword kw), in a new array; NULL on failure */
static int *cnode_list(cc *c, const json_t *l, const char *kw, int level) {
  size_t n = json_array_size(l);
  int *r = malloc((n ? n : 1) * sizeof *r);
  if (!r) {
    oom(c);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    size_t o = path_push_i(c, kw, i);
    r[i] = cnode(c, json_array_get(l, i), level + 1);
    path_pop(c, o);
    if (r[i] < 0) {
      free(r);
      return NULL;
    }
  }
  return r;
}

/* Arrays. Tuples: prefixItems (2020-12) then items for the rest, or items as an array (draft
 * 7) then additionalItems; the rest false: at most the prefix's length. */
static int carray(cc *c, const json_t *sch, int level) {
  const json_t *items = json_object_get(sch, "items");
  const json_t *pre = json_object_get(sch, "prefixItems");
  const json_t *rest = items;
  const char *pkw = "prefixItems", *rkw = "items";
  if (pre && !json_is_array(pre)) return fail(c, "'prefixItems' must be an array of schemas");
  if (json_is_array(items)) {
    if (pre) return fail(c, "'items' as an array beside 'prefixItems' is not supported");
    pre = items;
    pkw = "items";
    rest = json_object_get(sch, "additionalItems");
    rkw = "additionalItems";
  } else if (json_object_get(sch, "additionalItems")) {
    return fail(c, "'additionalItems' without 'items' as an array is not supported");
  }
  uint32_t a = 0, b = SN_UNLIMITED;
  if (get_count(c, sch, "minItems", &a) || get_count(c, sch, "maxItems", &b)) return -1;
  size_t np = json_array_size(pre);
  if (np > 4096) return fail(c, "'%s' has more than 4096 schemas", pkw);
  if (a > b) return fail(c, "'minItems' is greater than 'maxItems'");
  if (json_is_false(rest)) {
    if (!pre) return fail(c, "'items': false without 'prefixItems' is not supported");
    if (b > np) b = (uint32_t)np;
    rest = NULL;
  }
  if (a > b) return fail(c, "'minItems' is greater than the tuple's length");
  int ch = SN_ANY;
  if (rest) {
    size_t o = path_push(c, rkw, strlen(rkw));
    ch = cnode(c, rest, level + 1);
    path_pop(c, o);
    if (ch < 0) return -1;
  }
  if (ch == SN_ANY && a == 0 && b == SN_UNLIMITED && !np) return SN_ANY_ARR;
  int *pn = NULL;
  if (np && !(pn = cnode_list(c, pre, pkw, level))) return -1;
  size_t p0 = c->n_pitems;
  int node = new_node(c, SN_ARRAY);
  if (node < 0 || grow(c, &c->s->pitems, &c->cap_pitems, p0 + np + 1, sizeof *c->s->pitems)) {
    free(pn);
    return -1;
  }
  for (size_t i = 0; i < np; i++) c->s->pitems[p0 + i] = pn[i];
  free(pn);
  c->n_pitems = p0 + np;
  c->s->nodes[node].sub = ch;
  c->s->nodes[node].a = a;
  c->s->nodes[node].b = b;
  c->s->nodes[node].np = (int32_t)np;
  c->s->nodes[node].req = (int32_t)p0;
  return node;
}

/* the node of item i of array node nd */
static int item_node(const json_schema *s, const ss_node *nd, uint32_t i) {
  return i < (uint32_t)nd->np ? s->pitems[nd->req + (int32_t)i] : nd->sub;
}

/* The formats, each a pattern of regex_dfa's subset matching only what the common checkers
 * accept (Python's datetime / ipaddress / uuid, jsonschema's RFC 3339 checks, RFC 3986 and the
 * WHATWG URL parser, email-validator's dot-atom form). */
#define F_YEAR "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
#define F_LEAP "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
#define F_MD "((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
#define F_DATE "(" F_YEAR "-" F_MD "|" F_LEAP "-02-29)"
#define F_TIME                                                                         \
  "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):" \
  "[0-5][0-9])"
#define F_H "[0-9a-fA-F]{1,4}"
#define F_OCT "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
#define F_PCT "%[0-9A-Fa-f]{2}"
#define F_PCHAR "([A-Za-z0-9._~!$&'()*+,;=:@-]|" F_PCT ")"
#define F_QCHAR "([A-Za-z0-9._~!$&'()*+,;=:@/?-]|" F_PCT ")"
#define F_ATOM "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
static const char *const formats[][2] = {
    {"date", "^" F_DATE "$"},
    {"time", "^" F_TIME "$"},
    {"date-time", "^" F_DATE "T" F_TIME "$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^" F_ATOM "(\\." F_ATOM ")*@([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)+"
              "[A-Za-z]{2,24}$"},
    {"ipv4", "^" F_OCT "(\\." F_OCT "){3}$"},
    {"ipv6", "^((" F_H ":){7}" F_H "|(" F_H ":){1,7}:|(" F_H ":){1,6}:" F_H "|(" F_H ":){1,5}(:" F_H
             "){1,2}|(" F_H ":){1,4}(:" F_H "){1,3}|(" F_H ":){1,3}(:" F_H "){1,4}|(" F_H
             ":){1,2}(:" F_H "){1,5}|" F_H ":(:" F_H "){1,6}|:((:" F_H "){1,7}|:))$"},
    /* with an authority and a host name whose last label starts with a letter: what RFC 3986
     * and the WHATWG parser (Pydantic's, browsers') both take (no empty host, no host read as
     * a bad IPv4 address, a port of at most 4 digits) */
    {"uri", "^[A-Za-z][A-Za-z0-9+.-]*://(([A-Za-z0-9._~!$&'()*+,;=:-]|" F_PCT
            ")*@)?([A-Za-z0-9-]+\\.)*[A-Za-z][A-Za-z0-9-]*(:[0-9]{1,4})?(/" F_PCHAR
            "*)*(\\?" F_QCHAR "*)?(#" F_QCHAR "*)?$"},
};

/* the bytes a string under an automaton may carry: all but the control bytes without a
 * one-character escape (\u escapes are not generated in such strings, so each byte the automaton
 * reads is one the text carries, raw or as \" \\ \/ \b \f \n \r \t) */
static void str_bytes(uint8_t ok[256]) {
  for (int i = 0; i < 256; i++)
    ok[i] = i >= 0x20 || i == '\b' || i == '\f' || i == '\n' || i == '\r' || i == '\t';
}

/* A string's automaton: the pattern's and the format's, over the bytes a JSON string can carry
 * without a \u escape, cut to minLength..maxLength code points; its index, -1 with an error. */
static int string_dfa(cc *c, const json_t *pat, const json_t *fmt, uint32_t a, uint32_t b) {
  char e[200];
  regex_dfa d[2];
  int nd = 0;
  memset(d, 0, sizeof d);
  if (pat) {
    size_t o = path_push(c, "pattern", 7);
    if (!json_is_string(pat)) {
      path_pop(c, o);
      return fail(c, "'pattern' must be a string");
    }
    if (regex_dfa_compile(json_string_value(pat), json_string_length(pat), JS_MAX_DFA_STATES,
                          &d[nd], e, sizeof e)) {
      fail(c, "'pattern' \"%.80s\": %s", json_string_value(pat), e);
      path_pop(c, o);
      return -1;
    }
    nd++;
    path_pop(c, o);
  }
  if (fmt) {
    const char *f = json_is_string(fmt) ? json_string_value(fmt) : NULL;
    size_t k = 0, nf = sizeof formats / sizeof *formats;
    while (f && k < nf && strcmp(formats[k][0], f)) k++;
    if (!f || k == nf) {
      for (int i = 0; i < nd; i++) regex_dfa_free(&d[i]);
      return fail(c,
                  "'format' \"%.40s\" is not supported (only date, time, date-time, uuid, "
                  "email, ipv4, ipv6, uri)",
                  f ? f : "?");
    }
    if (regex_dfa_compile(formats[k][1], strlen(formats[k][1]), JS_MAX_DFA_STATES, &d[nd], e,
                          sizeof e)) {
      for (int i = 0; i < nd; i++) regex_dfa_free(&d[i]);
      return fail(c, "'format' \"%s\": %s", f, e);
    }
    nd++;
  }
  int rc = 0;
  if (nd == 2) {
    regex_dfa x;
    rc = regex_dfa_intersect(&d[0], &d[1], JS_MAX_DFA_STATES, &x, e, sizeof e);
    regex_dfa_free(&d[0]);
    regex_dfa_free(&d[1]);
    d[0] = x;
  }
  uint8_t ok[256];
  str_bytes(ok);
  regex_dfa r;
  memset(&r, 0, sizeof r);
  /* the minimum in the automaton's states, the maximum left to its dist (the mask checks code
   * points so far + dist <= maxLength), so that a large maxLength costs no states */
  if (!rc) rc = regex_dfa_restrict(&d[0], ok, a, UINT32_MAX, JS_MAX_DFA_STATES, &r, e, sizeof e);
  regex_dfa_free(&d[0]);
  if (rc) return fail(c, "%s", e);
  if (!r.n || r.dist[0] > b) {
    regex_dfa_free(&r);
    return fail(c, "no string satisfies 'pattern' / 'format' with 'minLength' / 'maxLength'");
  }
  if (c->dfa_total + (size_t)r.n > JS_MAX_DFA_TOTAL) {
    regex_dfa_free(&r);
    return fail(c, "the schema's patterns need more than %d automaton states", JS_MAX_DFA_TOTAL);
  }
  if (grow(c, &c->s->dfa, &c->cap_dfa, (size_t)c->s->ndfa + 1, sizeof *c->s->dfa)) {
    regex_dfa_free(&r);
    return -1;
  }
  c->dfa_total += (size_t)r.n;
  c->s->dfa[c->s->ndfa] = r;
  return c->s->ndfa++;
}

static int cstring(cc *c, const json_t *sch) {
  uint32_t a = 0, b = SN_UNLIMITED;
  if (get_count(c, sch, "minLength", &a) || get_count(c, sch, "maxLength", &b)) return -1;
  if (a > b) return fail(c, "'minLength' is greater than 'maxLength'");
  const json_t *pat = json_object_get(sch, "pattern"), *fmt = json_object_get(sch, "format");
  if (a == 0 && b == SN_UNLIMITED && !pat && !fmt) return SN_ANY_STR;
  int d = -1;
  if ((pat || fmt) && (d = string_dfa(c, pat, fmt, a, b)) < 0) return -1;
  int node = new_node(c, SN_STRING);
  if (node < 0) return -1;
  c->s->nodes[node].a = a;
  c->s->nodes[node].b = b;
  c->s->nodes[node].sub = d;
  return node;
}

/* ---- numbers ---------------------------------------------------------------------------- */

/* floor(D * 10^k) of D, d's shortest decimal form (what a validator's double compares equal
 * to); *exact: no digits were dropped. |d| * 10^k must be below 10^17. */
static int64_t dec_floor(double d, int k, int *exact) {
  char b[64];
  int p = real_digits(d);
  snprintf(b, sizeof b, "%.*e", p - 1, fabs(d));
  int64_t digits = 0;
  int nd = 0;
  const char *e = b;
  for (; *e && *e != 'e'; e++)
    if (*e >= '0' && *e <= '9') digits = digits * 10 + (*e - '0'), nd++;
  int ex = atoi(e + 1), sh = ex - (nd - 1) + k;
  int64_t v = digits, rem = 0;
  for (; sh > 0; sh--) v *= 10;
  for (; sh < 0; sh++) rem |= v % 10, v /= 10;
  *exact = rem == 0;
  if (d < 0) return rem ? -v - 1 : -v;
  return v;
}

/* a numeric keyword's value; absent: 0 */
static int get_num(cc *c, const json_t *sch, const char *kw, double *out) {
  const json_t *v = json_object_get(sch, kw);
  if (!v) return 0;
  if (!json_is_number(v)) return fail(c, "'%s' must be a number", kw);
  *out = json_number_value(v);
  if (!isfinite(*out)) return fail(c, "'%s' must be a finite number", kw);
  return 1;
}

/* Numbers and integers with bounds or multipleOf. Integers: exact, up to 19 digits. Numbers:
 * written without an exponent, with at most 9 integer and 6 fraction digits (15 significant
 * digits at most: such a decimal and a bound's shortest form compare as their doubles do), and
 * then exact; numbers with multipleOf are written as integers. */
static int cnum(cc *c, const json_t *sch, int is_int) {
  double mn = 0, mx = 0, emn = 0, emx = 0, mul = 0;
  int hmn = get_num(c, sch, "minimum", &mn), hmx = get_num(c, sch, "maximum", &mx);
  const json_t *xmn = json_object_get(sch, "exclusiveMinimum");
  const json_t *xmx = json_object_get(sch, "exclusiveMaximum");
  int bmn = json_is_boolean(xmn), bmx = json_is_boolean(xmx); /* draft 4's form */
  int hemn = bmn ? 0 : get_num(c, sch, "exclusiveMinimum", &emn);
  int hemx = bmx ? 0 : get_num(c, sch, "exclusiveMaximum", &emx);
  int hmul = get_num(c, sch, "multipleOf", &mul);
  if (c->failed) return -1;
  if ((bmn && !hmn) || (bmx && !hmx))
    return fail(c, "a boolean 'exclusiveMinimum' / 'exclusiveMaximum' needs its bound");
  if (bmn && json_is_true(xmn)) hemn = 1, emn = mn, hmn = 0;
  if (bmx && json_is_true(xmx)) hemx = 1, emx = mx, hmx = 0;
  if (!hmn && !hmx && !hemn && !hemx && !hmul) return is_int ? SN_ANY_INT : SN_ANY_NUM;
  json_num q;
  memset(&q, 0, sizeof q);
  /* the tightest bound of each side, as the schema says it */
  if (hmn && hemn) {
    if (emn >= mn)
      hmn = 0;
    else
      hemn = 0;
  }
  if (hmx && hemx) {
    if (emx <= mx)
      hmx = 0;
    else
      hemx = 0;
  }
  q.dhas_lo = (uint8_t)(hmn || hemn);
  q.dhas_hi = (uint8_t)(hmx || hemx);
  q.dlo = hmn ? mn : emn;
  q.dhi = hmx ? mx : emx;
  q.dlo_ex = (uint8_t)hemn;
  q.dhi_ex = (uint8_t)hemx;
  if (hmul) {
    if (!(mul >= 1 && mul <= 2147483647.0 && mul == floor(mul)))
      return fail(c,
                  "'multipleOf' %g is not supported: only whole numbers 1..2^31-1 (a fraction "
                  "like 0.01 is judged differently by validators)",
                  mul);
    q.mult = (uint32_t)mul;
    q.dmult = mul;
    is_int = 1;
  }
  q.k = is_int ? 0 : 6;
  q.int_digits = is_int ? 19 : 9;
  double lim = is_int ? 9007199254740992.0 : 999999999.0;
  const char *what = is_int ? "2^53" : "999999999 for a 'number' (use 'integer')";
  if ((q.dhas_lo && fabs(q.dlo) > lim) || (q.dhas_hi && fabs(q.dhi) > lim))
    return fail(c, "bounds beyond +-%s are not supported", what);
  if (q.dhas_lo) {
    int ex;
    int64_t f = dec_floor(q.dlo, q.k, &ex);
    q.lo = ex ? f + (q.dlo_ex ? 1 : 0) : f + 1; /* the least scaled value above or at it */
    q.has_lo = 1;
  }
  if (q.dhas_hi) {
    int ex;
    int64_t f = dec_floor(q.dhi, q.k, &ex);
    q.hi = ex && q.dhi_ex ? f - 1 : f;
    q.has_hi = 1;
  }
  if (grow(c, &c->s->nums, &c->cap_nums, c->n_nums + 1, sizeof *c->s->nums)) return -1;
  c->s->nums[c->n_nums] = q;
  int node = new_node(c, is_int ? SN_INTEGER : SN_NUMBER);
  if (node < 0) return -1;
  c->s->nodes[node].sub = (int32_t)c->n_nums++;
  if (!json_num_any(&c->s->nums[c->n_nums - 1]))
    return fail(c, "no %s satisfies the bounds and 'multipleOf'", is_int ? "integer" : "number");
  return node;
}

/* a union of the nodes br[n] (n >= 2) */
static int cunion(cc *c, const int *br, int n, const char *kw) {
  int node = new_node(c, SN_UNION);
  if (node < 0) return -1;
  if (c->n_br + (size_t)n > JS_MAX_BR) return fail(c, "the schema is too large");
  if (grow(c, &c->br, &c->cap_br, c->n_br + (size_t)n, sizeof *c->br)) return -1;
  c->aux[node].br0 = (int)c->n_br;
  c->aux[node].nbr = n;
  c->aux[node].kw = kw;
  memcpy(c->br + c->n_br, br, (size_t)n * sizeof *br);
  c->n_br += (size_t)n;
  if (!(c->aux[node].path = path_dup(c))) return -1;
  return node;
}

/* ---- one schema ------------------------------------------------------------------------- */

enum {
  T_OBJECT = 1,
  T_ARRAY = 2,
  T_STRING = 4,
  T_NUMBER = 8,
  T_INTEGER = 16,
  T_BOOLEAN = 32,
  T_NULL = 64
};
static const char *const type_names[] = {"object",  "array",   "string", "number",
                                         "integer", "boolean", "null"};

static int type_bit(const json_t *t) {
  if (!json_is_string(t)) return -1;
  for (int i = 0; i < 7; i++)
    if (!strcmp(json_string_value(t), type_names[i])) return 1 << i;
  return -1;
}

/* ---- allOf: merging schemas ------------------------------------------------------------- */

/* allOf (and $ref or anyOf / oneOf beside other keywords) is compiled as one schema: the
 * schemas' keywords merged into a new one (json level, before compiling): bounds take the
 * tighter value, required lists and enums intersect or join as their meaning says, types
 * intersect, properties valid under both schemas become allOf's of their own, and each side's
 * additionalProperties applies to the other side's extra properties. A keyword both schemas
 * give that cannot be merged exactly (two different patterns or formats, two tuples, two
 * unknown keywords) is refused. anyOf / oneOf beside other keywords is distributed: anyOf [a,
 * b] with rest is anyOf [allOf [a, rest], allOf [b, rest]]. */

static int keep(cc *c, json_t *j) {
  if (!j) return oom(c);
  if (grow(c, &c->keep, &c->cap_keep, c->n_keep + 1, sizeof *c->keep)) {
    json_decref(j);
    return -1;
  }
  c->keep[c->n_keep++] = j;
  return 0;
}

/* sch's only non-annotation keyword (beside $defs / definitions) is kw */
static int only(const json_t *sch, const char *kw) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)sch, k, v) {
    if (!strcmp(k, kw) || in_list(annotations, k) || !strcmp(k, "$defs") ||
        !strcmp(k, "definitions"))
      continue;
    return 0;
  }
  return 1;
}

/* {"allOf": [a, b]} (new), NULL on out of memory */
static json_t *all2(const json_t *a, const json_t *b) {
  return json_pack("{s:[OO]}", "allOf", (json_t *)a, (json_t *)b);
}

static int type_bits(cc *c, const json_t *t) {
  int tm = 0;
  if (json_is_string(t)) {
    tm = type_bit(t);
  } else if (json_is_array(t)) {
    for (size_t i = 0; i < json_array_size(t) && tm >= 0; i++) {
      int b = type_bit(json_array_get(t, i));
      tm = b < 0 ? -1 : tm | b;
    }
  } else {
    tm = -1;
  }
  if (tm < 0)
    return fail(c,
                "'type' must be one of object, array, string, number, integer, boolean, null, or "
                "an array of them");
  if (tm & T_NUMBER) tm |= T_INTEGER; /* number covers integer */
  return tm;
}

static json_t *type_json(int tm) {
  if (tm & T_NUMBER) tm &= ~T_INTEGER;
  json_t *a = json_array();
  for (int i = 0; a && i < 7; i++)
    if (tm & (1 << i)) json_array_append_new(a, json_string(type_names[i]));
  return a;
}

/* *acc's additionalProperties meet the other side's: absent / true neutral, false wins */
static json_t *ap_meet(const json_t *x, const json_t *y) {
  if (!x || json_is_true(x)) return y ? json_incref((json_t *)y) : NULL;
  if (!y || json_is_true(y)) return json_incref((json_t *)x);
  if (json_is_false(x) || json_is_false(y)) return json_false();
  return all2(x, y);
}

/* value schema of an extra property p under the other side's additionalProperties ap: NULL
 * when ap forbids it (*forbid), a new reference otherwise */
static json_t *extra_prop(const json_t *p, const json_t *ap, int *forbid) {
  *forbid = 0;
  if (!ap || json_is_true(ap)) return json_incref((json_t *)p);
  if (json_is_false(ap)) {
    *forbid = 1;
    return NULL;
  }
  return all2(p, ap);
}

/* properties + additionalProperties of acc and of x together */
static int merge_object(cc *c, json_t *acc, const json_t *x) {
  const json_t *pa = json_object_get(acc, "properties"), *pb = json_object_get(x, "properties");
  const json_t *aa = json_object_get(acc, "additionalProperties");
  const json_t *ab = json_object_get(x, "additionalProperties");
  if ((pa && !json_is_object(pa)) || (pb && !json_is_object(pb)))
    return fail(c, "'properties' must be an object");
  if (!pb && !ab) return 0;
  json_t *np = json_object();
  if (!np) return oom(c);
  const char *k;
  json_t *v;
  int forbid = 0, rc = 0;
  if (pa) json_object_foreach((json_t *)pa, k, v) {
      const json_t *w = pb ? json_object_get(pb, k) : NULL;
      json_t *m = w ? all2(v, w) : extra_prop(v, ab, &forbid);
      if (m ? json_object_set_new(np, k, m) : !forbid) rc = oom(c);
    }
  if (pb) json_object_foreach((json_t *)pb, k, v) {
      if (pa && json_object_get(pa, k)) continue;
      json_t *m = extra_prop(v, aa, &forbid);
      if (m ? json_object_set_new(np, k, m) : !forbid) rc = oom(c);
    }
  json_t *ap = ap_meet(aa, ab);
  if (rc || json_object_set_new(acc, "properties", np)) {
    json_decref(ap);
    return rc ? rc : oom(c);
  }
  if (ap && json_object_set_new(acc, "additionalProperties", ap)) return oom(c);
  return 0;
}

static int merge_kw(cc *c, json_t *acc, const char *k, const json_t *v) {
  static const char *const lower[] = {"minimum", "exclusiveMinimum", "minLength", "minItems", NULL};
  static const char *const upper[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", NULL};
  if (!strcmp(k, "properties") || !strcmp(k, "additionalProperties") || !strcmp(k, "$defs") ||
      !strcmp(k, "definitions") || !strcmp(k, "allOf") || !strcmp(k, "$ref"))
    return 0; /* merge_object's, the root's, or merge_in's */
  json_t *old = json_object_get(acc, k);
  if (!old) {
    json_t *n = json_is_array(v) ? json_copy((json_t *)v) : json_incref((json_t *)v);
    if (!n || json_object_set_new(acc, k, n)) return oom(c);
    return 0;
  }
  if (in_list(annotations, k)) return 0; /* the first one's */
  if (in_list(lower, k) || in_list(upper, k)) {
    if (!json_is_number(v) || !json_is_number(old)) return fail(c, "'%s' must be a number", k);
    double a = json_number_value(old), b = json_number_value(v);
    if (in_list(lower, k) ? b > a : b < a) json_object_set(acc, k, (json_t *)v);
    return 0;
  }
  if (!strcmp(k, "type")) {
    int a = type_bits(c, old), b = type_bits(c, v);
    if (a < 0 || b < 0) return -1;
    if (!(a & b)) return fail(c, "the 'allOf' schemas' types have nothing in common");
    json_t *t = type_json(a & b);
    if (!t || json_object_set_new(acc, k, t)) return oom(c);
    return 0;
  }
  if (!strcmp(k, "required")) {
    if (!json_is_array(v) || !json_is_array(old))
      return fail(c, "'required' must be an array of names");
    for (size_t i = 0; i < json_array_size(v); i++) {
      json_t *r = json_array_get(v, i);
      size_t j = 0;
      while (j < json_array_size(old) && !json_equal(json_array_get(old, j), r)) j++;
      if (j == json_array_size(old) && json_array_append(old, r)) return oom(c);
    }
    return 0;
  }
  if (!strcmp(k, "enum")) {
    if (!json_is_array(v) || !json_is_array(old)) return fail(c, "'enum' must be an array");
    json_t *n = json_array();
    if (!n) return oom(c);
    for (size_t i = 0; i < json_array_size(old); i++)
      for (size_t j = 0; j < json_array_size(v); j++)
        if (json_equal(json_array_get(old, i), json_array_get(v, j))) {
          json_array_append(n, json_array_get(old, i));
          break;
        }
    if (!json_array_size(n)) {
      json_decref(n);
      return fail(c, "no 'enum' value is in every 'allOf' schema");
    }
    json_object_set_new(acc, k, n);
    return 0;
  }
  if (!strcmp(k, "items") && json_is_object(v) && json_is_object(old)) {
    json_t *m = all2(old, v);
    if (!m || json_object_set_new(acc, k, m)) return oom(c);
    return 0;
  }
  if (!strcmp(k, "multipleOf") && json_is_number(v) && json_is_number(old)) {
    double a = json_number_value(old), b = json_number_value(v);
    if (a == floor(a) && b == floor(b) && a >= 1 && b >= 1 && a < 2147483648.0 &&
        b < 2147483648.0) {
      long long x = (long long)a, y = (long long)b, g = x, h = y;
      while (h) {
        long long t = g % h;
        g = h;
        h = t;
      }
      json_object_set_new(acc, k, json_integer(x / g * y));
      return 0;
    }
  }
  if (json_equal(old, (json_t *)v)) return 0;
  if (!strcmp(k, "const")) return fail(c, "the 'allOf' schemas have different 'const' values");
  return fail(c, "'%.64s' in two 'allOf' schemas is not supported (unless equal)", k);
}

/* merges schema x (its $ref target and allOf members first) into acc */
static int merge_in(cc *c, json_t *acc, const json_t *x, int *budget) {
  if (--*budget < 0)
    return fail(c, "'allOf' merges more than %d schemas (or refers to itself)", JS_MAX_ALLOF);
  if (json_is_true(x)) return 0;
  if (json_is_false(x)) return fail(c, "a false schema is not supported");
  if (!json_is_object(x)) return fail(c, "a schema must be an object or true");
  const json_t *ref = json_object_get(x, "$ref"), *all = json_object_get(x, "allOf");
  if (ref) {
    const json_t *t = ref_lookup(c, ref);
    if (!t || merge_in(c, acc, t, budget)) return -1;
  }
  if (all) {
    if (!json_is_array(all) || !json_array_size(all))
      return fail(c, "'allOf' must be a non-empty array of schemas");
    for (size_t i = 0; i < json_array_size(all); i++)
      if (merge_in(c, acc, json_array_get(all, i), budget)) return -1;
  }
  const json_t *xb = json_object_get(x, "exclusiveMinimum"),
               *xt = json_object_get(x, "exclusiveMaximum");
  if ((json_is_boolean(xb) || json_is_boolean(xt)) && json_object_size(acc))
    return fail(c, "a boolean 'exclusiveMinimum' / 'exclusiveMaximum' in 'allOf' is not supported");
  const char *k;
  json_t *v;
  if (merge_object(c, acc, x)) return -1;
  json_object_foreach((json_t *)x, k, v) {
    if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf")) {
      if (json_object_get(acc, "anyOf") || json_object_get(acc, "oneOf"))
        return fail(c, "'anyOf' / 'oneOf' in two 'allOf' schemas is not supported");
    }
    if (merge_kw(c, acc, k, v)) return -1;
  }
  return 0;
}

/* anyOf / oneOf in acc beside other keywords: distributed over its branches */
static json_t *distribute(cc *c, json_t *acc) {
  const char *kw = json_object_get(acc, "anyOf") ? "anyOf" : "oneOf";
  const json_t *l = json_object_get(acc, kw);
  if (!l || only(acc, kw)) return acc;
  if (!json_is_array(l) || !json_array_size(l)) {
    fail(c, "'%s' must be a non-empty array of schemas", kw);
    json_decref(acc);
    return NULL;
  }
  json_t *rest = json_copy(acc), *br = json_array();
  if (rest) json_object_del(rest, kw);
  for (size_t i = 0; rest && br && i < json_array_size(l); i++)
    if (json_array_append_new(br, all2(json_array_get(l, i), rest))) {
      json_decref(br);
      br = NULL;
    }
  json_t *r = rest && br ? json_pack("{s:O}", kw, br) : NULL;
  json_decref(rest);
  json_decref(br);
  json_decref(acc);
  if (!r) oom(c);
  return r;
}

/* the schema sch means, merged (a new one kept until the end), NULL with an error */
static const json_t *merged(cc *c, const json_t *sch) {
  json_t *acc = json_object();
  int budget = JS_MAX_ALLOF;
  if (!acc) {
    oom(c);
    return NULL;
  }
  if (merge_in(c, acc, sch, &budget)) {
    json_decref(acc);
    return NULL;
  }
  acc = distribute(c, acc);
  if (!acc || keep(c, acc)) return NULL;
  return acc;
}

static int cnode(cc *c, const json_t *sch, int level) {
  if (json_is_true(sch)) return SN_ANY;
  if (json_is_false(sch)) return fail(c, "a false schema is not supported");
  if (!json_is_object(sch)) return fail(c, "a schema must be an object or true");
  if (level > JS_MAX_LEVEL)
    return fail(c, "the schema is nested too deeply (more than %d levels)", JS_MAX_LEVEL);
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)sch, k, v) {
    if (in_list(annotations, k) || in_list(supported, k)) continue;
    return fail(c, "'%.64s' is not supported", k);
  }
  static const char *const defkw[] = {"$defs", "definitions"};
  for (int i = 0; i < 2; i++) {
    const json_t *d = json_object_get(sch, defkw[i]);
    if (d && !json_is_object(d)) return fail(c, "'%s' must be an object", defkw[i]);
  }
  const json_t *ref = json_object_get(sch, "$ref");
  const json_t *any = json_object_get(sch, "anyOf"), *one = json_object_get(sch, "oneOf");
  if (json_object_get(sch, "allOf") || (ref && !only(sch, "$ref")) ||
      (any && !only(sch, "anyOf")) || (one && !only(sch, "oneOf"))) {
    if (any && one) return fail(c, "'anyOf' beside 'oneOf' is not supported");
    const json_t *m = merged(c, sch);
    return m ? cnode(c, m, level + 1) : -1;
  }
  if (ref) return cref(c, ref);
  if (any || one) {
    const char *kw = any ? "anyOf" : "oneOf";
    const json_t *l = any ? any : one;
    size_t n = json_array_size(l);
    if (!json_is_array(l) || n == 0)
      return fail(c, "'%s' must be a non-empty array of schemas", kw);
    if (n > 1024) return fail(c, "'%s' has more than 1024 schemas", kw);
    int *br = cnode_list(c, l, kw, level);
    if (!br) return -1;
    int node = n == 1 ? br[0] : cunion(c, br, (int)n, kw);
    free(br);
    return node;
  }
  /* the types */
  int tm = 0;
  const json_t *ty = json_object_get(sch, "type");
  if (ty) {
    if (json_is_array(ty)) {
      if (!json_array_size(ty)) return fail(c, "'type' must not be an empty array");
      for (size_t i = 0; i < json_array_size(ty); i++) {
        int b = type_bit(json_array_get(ty, i));
        if (b < 0)
          return fail(c,
                      "'type' must be one of object, array, string, number, "
                      "integer, boolean, null, or an array of them");
        if (tm & b)
          return fail(c, "'type' lists \"%s\" twice", json_string_value(json_array_get(ty, i)));
        tm |= b;
      }
    } else {
      tm = type_bit(ty);
      if (tm < 0)
        return fail(c,
                    "'type' must be one of object, array, string, number, integer, "
                    "boolean, null, or an array of them");
    }
  } else {
    static const char *const fam[4][6] = {
        {"properties", "required", "additionalProperties", NULL},
        {"items", "minItems", "maxItems", "prefixItems", "additionalItems", NULL},
        {"minLength", "maxLength", "pattern", "format", NULL},
        {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", NULL}};
    const char *seen[4] = {NULL, NULL, NULL, NULL};
    int nf = 0;
    for (int f = 0; f < 4; f++)
      for (int i = 0; fam[f][i] && !seen[f]; i++)
        if (json_object_get(sch, fam[f][i])) seen[f] = fam[f][i];
    const char *first = NULL;
    for (int f = 0; f < 4; f++) {
      if (!seen[f]) continue;
      if (first) return fail(c, "'%s' and '%s' without 'type' are ambiguous", first, seen[f]);
      first = seen[f];
      nf++;
      tm = f == 0 ? T_OBJECT : f == 1 ? T_ARRAY : f == 2 ? T_STRING : T_NUMBER;
    }
    (void)nf;
  }
  if (tm & T_NUMBER) tm &= ~T_INTEGER;
  int br[7], n = 0;
  for (int i = 0; i < 7; i++) {
    if (!(tm & (1 << i))) continue;
    int node;
    switch (1 << i) {
      case T_OBJECT:
        node = cobject(c, sch, level);
        break;
      case T_ARRAY:
        node = carray(c, sch, level);
        break;
      case T_STRING:
        node = cstring(c, sch);
        break;
      case T_NUMBER:
        node = cnum(c, sch, 0);
        break;
      case T_INTEGER:
        node = cnum(c, sch, 1);
        break;
      case T_BOOLEAN:
        node = SN_ANY_BOOL;
        break;
      default:
        node = SN_ANY_NULL;
        break;
    }
    if (node < 0) return -1;
    br[n++] = node;
  }
  int base = n == 0 ? SN_ANY : n == 1 ? br[0] : cunion(c, br, n, "type");
  if (base < 0) return -1;
  /* enum / const */
  const json_t *en = json_object_get(sch, "enum"), *cn = json_object_get(sch, "const");
  if (!en && !cn) return base;
  if (en && (!json_is_array(en) || !json_array_size(en) || json_array_size(en) > JS_MAX_ENUM))
    return fail(c, "'enum' must be an array of 1 to %d values", JS_MAX_ENUM);
  json_t *vals = json_array();
  if (!vals) return oom(c);
  if (en) {
    for (size_t i = 0; i < json_array_size(en); i++) {
      json_t *x = json_array_get(en, i);
      if (cn && !json_equal(x, (json_t *)cn)) continue;
      if (json_array_append(vals, x)) {
        json_decref(vals);
        return oom(c);
      }
    }
    if (!json_array_size(vals)) {
      json_decref(vals);
      return fail(c, "'const' is not one of the 'enum' values");
    }
  } else if (json_array_append(vals, (json_t *)cn)) {
    json_decref(vals);
    return oom(c);
  }
  int node = new_node(c, SN_ENUM);
  if (node < 0) {
    json_decref(vals);
    return -1;
  }
  c->aux[node].vals = vals;
  c->aux[node].base = base;
  if (!(c->aux[node].path = path_dup(c))) return -1;
  return node;
}

/* ---- after compilation ------------------------------------------------------------------ */

static int resolve(cc *c, int i) {
  const json_schema *s = c->s;
  for (int steps = 0; i >= 0 && s->nodes[i].kind == SN_REF; steps++) {
    if (steps > s->nn) return fail(c, "a '$ref' cycle never reaches a schema");
    i = s->nodes[i].sub;
  }
  return i;
}

static size_t utf8_cps(const char *b, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += ((unsigned char)b[i] & 0xC0) != 0x80;
  return k;
}

/* v is valid under node n (refs resolved) */
static int validate(cc *c, int n, const json_t *v, int level) {
  const json_schema *s = c->s;
  if (level > 4 * JS_MAX_LEVEL + 64) return 0;
  const ss_node *nd = &s->nodes[n];
  switch (nd->kind) {
    case SN_UNION:
      if (n == SN_ANY) return 1;
      for (int i = 0; i < c->aux[n].nbr; i++)
        if (validate(c, c->br[c->aux[n].br0 + i], v, level + 1)) return 1;
      return 0;
    case SN_OBJECT: {
      if (!json_is_object(v)) return 0;
      const char *key;
      size_t klen;
      json_t *x;
      json_object_keylen_foreach((json_t *)v, key, klen, x) {
        int j = prop_find(c, (size_t)nd->sub, (size_t)nd->np, key, klen);
        int vn = j >= 0 ? s->props[nd->sub + j].node : nd->ap;
        if (vn < 0 || !validate(c, vn, x, level + 1)) return 0;
      }
      for (int j = 0; j < nd->np; j++)
        if (s->props[nd->sub + j].required &&
            !json_object_getn(v, c->pname[nd->sub + j], c->pnamelen[nd->sub + j]))
          return 0;
      return 1;
    }
    case SN_FREEOBJ:
      return json_is_object(v);
    case SN_ARRAY: {
      if (!json_is_array(v)) return 0;
      size_t na = json_array_size(v);
      if (na < nd->a || na > nd->b) return 0;
      for (size_t i = 0; i < na; i++)
        if (!validate(c, item_node(s, nd, (uint32_t)i), json_array_get(v, i), level + 1)) return 0;
      return 1;
    }
    case SN_STRING: {
      if (!json_is_string(v)) return 0;
      size_t k = utf8_cps(json_string_value(v), json_string_length(v));
      if (nd->sub >= 0 &&
          !regex_dfa_match(&s->dfa[nd->sub], (const unsigned char *)json_string_value(v),
                           json_string_length(v)))
        return 0;
      return k >= nd->a && k <= nd->b;
    }
    case SN_NUMBER:
      return json_is_number(v) &&
             (nd->sub < 0 ||
              json_num_valid(&s->nums[nd->sub], json_number_value(v), json_is_integer(v),
                             json_is_integer(v) ? json_integer_value(v) : 0));
    case SN_INTEGER:
      return json_is_integer(v) &&
             (nd->sub < 0 || json_num_valid(&s->nums[nd->sub], 0, 1, json_integer_value(v)));
    case SN_BOOL:
      return json_is_boolean(v);
    case SN_NULL:
      return json_is_null(v);
    case SN_ENUM: {
      const json_t *vals = c->aux[n].vals;
      for (size_t i = 0; i < json_array_size(vals); i++)
        if (json_equal((json_t *)v, json_array_get(vals, i)))
          return validate(c, c->aux[n].base, v, level + 1);
      return 0;
    }
    default:
      return 0;
  }
}

/* the enum's values valid under its base, in a trie */
static int build_enum(cc *c, int n) {
  caux *a = &c->aux[n];
  size_t nv = json_array_size(a->vals);
  lit *L = calloc(nv, sizeof *L);
  char **enc = calloc(nv, sizeof *enc);
  int rc = 0, m = 0, md = 0, all_obj = 1;
  if (!L || !enc) rc = oom(c);
  for (size_t i = 0; i < nv && !rc; i++) {
    const json_t *x = json_array_get(a->vals, i);
    if (a->base != SN_ANY && !validate(c, a->base, x, 0)) continue;
    int d = 0;
    enc[m] = canon(x, &d);
    if (!enc[m]) {
      rc = oom(c);
      break;
    }
    if (d > md) md = d;
    all_obj &= json_is_object(x) != 0;
    L[m] = (lit){(const unsigned char *)enc[m], strlen(enc[m]), 0};
    m++;
  }
  if (!rc && !m) {
    size_t o = c->plen;
    snprintf(c->path, sizeof c->path, "%s", a->path);
    c->plen = strlen(c->path);
    rc = fail(c, "no 'enum' / 'const' value is valid under the rest of the schema");
    path_pop(c, o);
  }
  int root = rc ? -1 : trie_build(c, L, m, 0);
  for (int i = 0; i < m; i++) free(enc[i]);
  free(enc);
  free(L);
  if (root < 0) return -1;
  c->s->nodes[n].sub = root;
  c->s->nodes[n].md = (uint8_t)(md > SN_MD_NONE ? SN_MD_NONE : md);
  a->all_objects = all_obj;
  return 0;
}

static void byte_name(char *b, size_t n, int ch) {
  if (ch > 0x20 && ch < 0x7f)
    snprintf(b, n, "'%c'", ch);
  else
    snprintf(b, n, "byte 0x%02x", ch);
}

/* ---- unions of strings ------------------------------------------------------------------ */

/* Branches of anyOf / oneOf / a type list that are all strings (patterns, formats, lengths,
 * string enums) would all start with '"': they become one string node whose automaton accepts
 * what any of them does (each branch's lengths folded into its own automaton first). */

static int string_like(const cc *c, int n) {
  const ss_node *nd = &c->s->nodes[n];
  if (nd->kind == SN_STRING) return 1;
  if (nd->kind != SN_ENUM) return 0;
  const json_t *vals = c->aux[n].vals;
  for (size_t i = 0; i < json_array_size(vals); i++)
    if (!json_is_string(json_array_get(vals, i))) return 0;
  return 1;
}

/* the strings node n (string_like) takes, as an automaton in *out; 0, or -1 with an error */
static int branch_dfa(cc *c, int n, regex_dfa *out) {
  const ss_node *nd = &c->s->nodes[n];
  char e[200];
  uint8_t ok[256];
  str_bytes(ok);
  regex_dfa base;
  memset(&base, 0, sizeof base);
  uint32_t a = 0, b = SN_UNLIMITED;
  int rc;
  if (nd->kind == SN_STRING && nd->sub >= 0) {
    rc = regex_dfa_restrict(&c->s->dfa[nd->sub], ok, nd->a, nd->b, JS_MAX_DFA_STATES, out, e,
                            sizeof e);
    return rc ? fail(c, "%s", e) : 0;
  }
  if (nd->kind == SN_STRING) {
    a = nd->a;
    b = nd->b;
    rc = regex_dfa_compile("", 0, 64, &base, e, sizeof e); /* any string */
  } else { /* the enum's strings, valid under its base, as ^(?:l1|l2|...)$ with literals escaped */
    const caux *x = &c->aux[n];
    size_t cap = 16, len = 0;
    char *p = malloc(cap);
    for (size_t i = 0; p && i < json_array_size(x->vals); i++) {
      const json_t *v = json_array_get(x->vals, i);
      if (x->base != SN_ANY && !validate(c, x->base, v, 0)) continue;
      const unsigned char *t = (const unsigned char *)json_string_value(v);
      size_t tl = json_string_length(v);
      if (len + 4 * tl + 8 > cap) {
        while (len + 4 * tl + 8 > cap) cap *= 2;
        char *q = realloc(p, cap);
        if (!q) {
          free(p);
          p = NULL;
          break;
        }
        p = q;
      }
      if (len)
        p[len++] = '|';
      else
        len += (size_t)snprintf(p, cap, "^(?:");
      for (size_t k = 0; k < tl; k++) {
        unsigned ch = t[k];
        if (ch < 0x20)
          len += (size_t)snprintf(p + len, cap - len, "\\x%02X", ch);
        else if (ch < 0x80 && !((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') &&
                 !(ch >= '0' && ch <= '9'))
          p[len++] = '\\', p[len++] = (char)ch;
        else
          p[len++] = (char)ch;
      }
    }
    if (!p) return oom(c);
    if (cap - len < 4) {
      char *q = realloc(p, len + 4);
      if (!q) {
        free(p);
        return oom(c);
      }
      p = q;
    }
    memcpy(p + len, ")$", 3);
    len += 2;
    rc = regex_dfa_compile(p, len, JS_MAX_DFA_STATES, &base, e, sizeof e);
    free(p);
  }
  if (!rc) rc = regex_dfa_restrict(&base, ok, a, b, JS_MAX_DFA_STATES, out, e, sizeof e);
  regex_dfa_free(&base);
  return rc ? fail(c, "%s", e) : 0;
}

/* one string node taking what x or y takes; -1 with an error */
static int string_union(cc *c, int x, int y) {
  regex_dfa dx, dy, u, r;
  char e[200];
  memset(&dx, 0, sizeof dx);
  memset(&dy, 0, sizeof dy);
  if (branch_dfa(c, x, &dx) || branch_dfa(c, y, &dy)) {
    regex_dfa_free(&dx);
    return -1;
  }
  int rc = regex_dfa_union(&dx, &dy, JS_MAX_DFA_STATES, &u, e, sizeof e);
  regex_dfa_free(&dx);
  regex_dfa_free(&dy);
  if (rc) return fail(c, "a union of strings: %s", e);
  uint8_t ok[256];
  str_bytes(ok);
  rc = regex_dfa_restrict(&u, ok, 0, UINT32_MAX, JS_MAX_DFA_STATES, &r, e, sizeof e);
  regex_dfa_free(&u);
  if (rc) return fail(c, "a union of strings: %s", e);
  if (c->dfa_total + (size_t)r.n > JS_MAX_DFA_TOTAL ||
      grow(c, &c->s->dfa, &c->cap_dfa, (size_t)c->s->ndfa + 1, sizeof *c->s->dfa)) {
    regex_dfa_free(&r);
    return c->failed ? -1
                     : fail(c, "the schema's patterns need more than %d automaton states",
                            JS_MAX_DFA_TOTAL);
  }
  int node = new_node(c, SN_STRING);
  if (node < 0) {
    regex_dfa_free(&r);
    return -1;
  }
  c->dfa_total += (size_t)r.n;
  c->s->dfa[c->s->ndfa] = r;
  c->s->nodes[node].sub = c->s->ndfa++;
  c->s->nodes[node].a = 0;
  c->s->nodes[node].b = SN_UNLIMITED;
  c->s->nodes[node].md = 0;
  return node;
}

/* fills node n's table (state: 0 not done, 1 in progress, 2 done) */
static int build_union(cc *c, int n, uint8_t *state) {
  json_schema *s = c->s;
  if (state[n] == 2) return 0;
  if (state[n] == 1) {
    size_t o = c->plen;
    snprintf(c->path, sizeof c->path, "%s", c->aux[n].path);
    c->plen = strlen(c->path);
    fail(c, "'%s' contains itself", c->aux[n].kw);
    path_pop(c, o);
    return -1;
  }
  state[n] = 1;
  int32_t t[256];
  int from[256];
  for (int i = 0; i < 256; i++) t[i] = -1, from[i] = -1;
  for (int bi = 0; bi < c->aux[n].nbr; bi++) {
    int b = c->br[c->aux[n].br0 + bi];
    int32_t bt[256];
    for (int i = 0; i < 256; i++) bt[i] = -1;
    const ss_node *nd = &s->nodes[b];
    switch (nd->kind) {
      case SN_UNION:
        if (build_union(c, b, state)) return -1;
        memcpy(bt, s->first + s->nodes[b].sub, sizeof bt);
        break;
      case SN_OBJECT:
      case SN_FREEOBJ:
        bt['{'] = b;
        break;
      case SN_ARRAY:
        bt['['] = b;
        break;
      case SN_STRING:
        bt['"'] = b;
        break;
      case SN_NUMBER:
      case SN_INTEGER:
        bt['-'] = b;
        for (int d = '0'; d <= '9'; d++) bt[d] = b;
        break;
      case SN_BOOL:
        bt['t'] = bt['f'] = b;
        break;
      case SN_NULL:
        bt['n'] = b;
        break;
      case SN_ENUM: {
        const ss_tnode *r = &s->tn[nd->sub];
        for (int e = 0; e < r->ne; e++) bt[s->ec[r->e0 + e]] = b;
        break;
      }
      default:
        break;
    }
    for (int i = 0; i < 256; i++) {
      if (bt[i] < 0) continue;
      if (t[i] >= 0 && i == '"' && string_like(c, t[i]) && string_like(c, bt[i])) {
        size_t o = c->plen;
        snprintf(c->path, sizeof c->path, "%s", c->aux[n].path);
        c->plen = strlen(c->path);
        int m = string_union(c, t[i], bt[i]);
        path_pop(c, o);
        if (m < 0) return -1;
        t[i] = m;
        continue;
      }
      if (t[i] >= 0) {
        char bn[32];
        byte_name(bn, sizeof bn, i);
        size_t o = c->plen;
        snprintf(c->path, sizeof c->path, "%s", c->aux[n].path);
        c->plen = strlen(c->path);
        if (!strcmp(c->aux[n].kw, "type"))
          fail(c, "the types of 'type' can both start with %s (not supported)", bn);
        else
          fail(c,
               "'%s' schemas %d and %d can both start with %s: the branches must start with "
               "different bytes (e.g. an object, a string, null)",
               c->aux[n].kw, from[i], bi, bn);
        path_pop(c, o);
        return -1;
      }
      t[i] = bt[i];
      from[i] = bi;
    }
  }
  size_t f0 = c->n_first;
  if (grow(c, &s->first, &c->cap_first, f0 + 256, sizeof *s->first)) return -1;
  memcpy(s->first + f0, t, sizeof t);
  c->n_first = f0 + 256;
  s->nodes[n].sub = (int32_t)f0;
  state[n] = 2;
  return 0;
}

static int finish(cc *c, int root_ph) {
  json_schema *s = c->s;
  int nn = s->nn;
  if (nn < SN_N_BUILTIN) return oom(c);
  /* refs */
  for (int i = 0; i < nn; i++) {
    ss_node *nd = &s->nodes[i];
    if (nd->kind == SN_ARRAY && (nd->sub = resolve(c, nd->sub)) < 0) return -1;
    if (nd->kind == SN_OBJECT && nd->ap >= 0 && (nd->ap = resolve(c, nd->ap)) < 0) return -1;
    if (nd->kind == SN_ENUM && (c->aux[i].base = resolve(c, c->aux[i].base)) < 0) return -1;
  }
  for (size_t i = 0; i < c->n_props; i++)
    if ((s->props[i].node = resolve(c, s->props[i].node)) < 0) return -1;
  for (size_t i = 0; i < c->n_pitems; i++)
    if ((s->pitems[i] = resolve(c, s->pitems[i])) < 0) return -1;
  for (size_t i = 0; i < c->n_br; i++)
    if ((c->br[i] = resolve(c, c->br[i])) < 0) return -1;
  if ((s->root = resolve(c, root_ph)) < 0) return -1;
  /* enums */
  for (int i = 0; i < nn; i++)
    if (s->nodes[i].kind == SN_ENUM && build_enum(c, i)) return -1;
  /* unions */
  uint8_t *state = calloc((size_t)(unsigned)nn, 1);
  if (!state) return oom(c);
  state[SN_ANY] = 2;
  for (int i = 0; i < nn; i++)
    if (s->nodes[i].kind == SN_UNION && build_union(c, i, state)) {
      free(state);
      return -1;
    }
  free(state);
  nn = s->nn; /* with the unions of strings */
  /* md, level by level: at level L every node whose smallest instance needs L nested
   * containers is found (containers from their children of lower levels, unions - flattened, so
   * their entries are never unions - from entries of this level); what no level up to
   * JSON_MASK_MAX_DEPTH finds keeps SN_MD_NONE */
  uint8_t *md = malloc((size_t)(unsigned)nn);
  int *ut0 = calloc((size_t)(unsigned)nn, sizeof *ut0);
  int *utn = calloc((size_t)(unsigned)nn, sizeof *utn);
  int *ut = NULL;
  size_t n_ut = 0, cap_ut = 0;
  if (!md || !ut0 || !utn) {
    free(md);
    free(ut0);
    free(utn);
    return oom(c);
  }
  for (int i = 0; i < nn; i++) md[i] = SN_MD_NONE;
  /* each union's distinct entries */
  for (int i = 0; i < nn; i++) {
    if (s->nodes[i].kind != SN_UNION) continue;
    ut0[i] = (int)n_ut;
    for (int ch = 0; ch < 256; ch++) {
      int b = s->first[s->nodes[i].sub + ch], k = 0;
      if (b < 0) continue;
      while (k < utn[i] && ut[ut0[i] + k] != b) k++;
      if (k < utn[i]) continue;
      if (grow(c, &ut, &cap_ut, n_ut + 1, sizeof *ut)) {
        free(md);
        free(ut0);
        free(utn);
        free(ut);
        return -1;
      }
      ut[n_ut++] = b;
      utn[i]++;
    }
  }
  for (int L = 0; L <= JSON_MASK_MAX_DEPTH; L++) {
    for (int changed = 1; changed;) {
      changed = 0;
      for (int i = 0; i < nn; i++) {
        if (md[i] != SN_MD_NONE) continue;
        const ss_node *nd = &s->nodes[i];
        int m = SN_MD_NONE;
        switch (nd->kind) {
          case SN_STRING:
          case SN_NUMBER:
          case SN_INTEGER:
          case SN_BOOL:
          case SN_NULL:
            m = 0;
            break;
          case SN_FREEOBJ:
            m = 1;
            break;
          case SN_ENUM:
            m = nd->md;
            break;
          case SN_ARRAY:
            m = 1;
            for (uint32_t j = 0; j < nd->a && j <= (uint32_t)nd->np; j++) {
              int d = md[item_node(s, nd, j)];
              if (1 + d > m) m = 1 + d;
            }
            break;
          case SN_OBJECT:
            m = 1;
            for (int j = 0; j < nd->np; j++)
              if (s->props[nd->sub + j].required && 1 + md[s->props[nd->sub + j].node] > m)
                m = 1 + md[s->props[nd->sub + j].node];
            break;
          case SN_UNION:
            for (int k = 0; k < utn[i]; k++)
              if (md[ut[ut0[i] + k]] < m) m = md[ut[ut0[i] + k]];
            break;
          default:
            break; /* refs: unused */
        }
        if (m <= L) {
          md[i] = (uint8_t)m;
          changed = 1;
        }
      }
    }
  }
  for (int i = 0; i < nn; i++) s->nodes[i].md = md[i];
  free(md);
  free(ut0);
  free(utn);
  free(ut);
  for (int i = 0; i < nn; i++) {
    ss_node *nd = &s->nodes[i];
    if (nd->kind != SN_OBJECT) continue;
    int m = 0;
    for (int j = 0; j < nd->np; j++)
      if (s->nodes[s->props[nd->sub + j].node].md > m) m = s->nodes[s->props[nd->sub + j].node].md;
    nd->mdmax = (uint8_t)m;
  }
  const ss_node *r = &s->nodes[s->root];
  snprintf(c->path, sizeof c->path, "#");
  c->plen = 1;
  if (!(r->kind == SN_OBJECT || r->kind == SN_FREEOBJ ||
        (r->kind == SN_ENUM && c->aux[s->root].all_objects)))
    return fail(c, "the root must be an object schema");
  if (r->md > JSON_MASK_MAX_DEPTH)
    return fail(c, "the schema has no instance within %d levels of nesting", JSON_MASK_MAX_DEPTH);
  return 0;
}

/* ---- the API ---------------------------------------------------------------------------- */

void json_schema_free(json_schema *s) {
  if (!s) return;
  free(s->nodes);
  free(s->props);
  free(s->freq);
  free(s->first);
  free(s->tn);
  free(s->ec);
  free(s->ech);
  free(s->bits);
  free(s->pitems);
  free(s->nums);
  for (int i = 0; i < s->ndfa; i++) regex_dfa_free(&s->dfa[i]);
  free(s->dfa);
  for (int k = 0; k < s->ntools; k++) {
    if (s->tpre) free(s->tpre[k]);
    if (s->targs) json_schema_free(s->targs[k]);
    for (int j = 0; s->tparams && s->tparams[k] && j < s->tnp[k]; j++) {
      free(s->tparams[k][j].lit);
      free(s->tparams[k][j].key);
    }
    if (s->tparams) free(s->tparams[k]);
  }
  free(s->tparams);
  free(s->tnp);
  free(s->tpre);
  free(s->tprelen);
  free(s->targs);
  free(s->tsuf);
  free(s);
}

/* the built-in nodes: SN_ANY (a union of the others but the integer) and the free kinds */
static int builtins(cc *c) {
  static const int kinds[SN_N_BUILTIN] = {SN_UNION,  SN_FREEOBJ, SN_ARRAY, SN_STRING,
                                          SN_NUMBER, SN_BOOL,    SN_NULL,  SN_INTEGER};
  static const uint8_t mds[SN_N_BUILTIN] = {0, 1, 1, 0, 0, 0, 0, 0};
  json_schema *s = c->s;
  for (int i = 0; i < SN_N_BUILTIN; i++) {
    if (new_node(c, kinds[i]) != i) return -1;
    s->nodes[i].md = mds[i];
    s->nodes[i].a = 0;
    s->nodes[i].b = SN_UNLIMITED;
  }
  s->nodes[SN_ANY_ARR].sub = SN_ANY;
  if (grow(c, &s->first, &c->cap_first, 256, sizeof *s->first)) return -1;
  for (int i = 0; i < 256; i++) s->first[i] = -1;
  s->first['{'] = SN_ANY_OBJ;
  s->first['['] = SN_ANY_ARR;
  s->first['"'] = SN_ANY_STR;
  s->first['-'] = SN_ANY_NUM;
  for (int d = '0'; d <= '9'; d++) s->first[d] = SN_ANY_NUM;
  s->first['t'] = s->first['f'] = SN_ANY_BOOL;
  s->first['n'] = SN_ANY_NULL;
  s->nodes[SN_ANY].sub = 0;
  c->n_first = 256;
  return 0;
}

json_schema *json_schema_compile(const json_t *schema, char *err, size_t errlen) {
  if (errlen) err[0] = 0;
  cc c;
  memset(&c, 0, sizeof c);
  c.err = err;
  c.errlen = errlen;
  c.root = schema;
  c.path[0] = '#';
  c.plen = 1;
  c.s = calloc(1, sizeof *c.s);
  if (!c.s) {
    oom(&c);
    return NULL;
  }
  int ok = 0;
  if (!schema) {
    fail(&c, "no schema");
  } else if (!builtins(&c)) {
    int ph = new_node(&c, SN_REF);
    if (ph >= 0 && !grow(&c, &c.wl, &c.cap_wl, 1, sizeof *c.wl) && !memo_put(&c, schema, ph)) {
      char *p = strdup("#");
      if (!p)
        oom(&c);
      else
        c.wl[c.n_wl++] = (work){schema, ph, p};
      /* the root, then each $ref target once */
      for (size_t i = 0; i < c.n_wl && !c.failed; i++) {
        snprintf(c.path, sizeof c.path, "%.400s", c.wl[i].path);
        c.plen = strlen(c.path);
        int t = cnode(&c, c.wl[i].sch, 0);
        if (t >= 0) c.s->nodes[c.wl[i].ph].sub = t;
      }
      if (!c.failed) ok = finish(&c, ph) == 0;
      /* every table non-NULL (the mask offsets into them) */
      if (ok && (grow(&c, &c.s->ec, &c.cap_e, 1, 1) ||
                 grow(&c, &c.s->ech, &c.cap_ech, 1, sizeof *c.s->ech) ||
                 grow(&c, &c.s->tn, &c.cap_tn, 1, sizeof *c.s->tn) ||
                 grow(&c, &c.s->bits, &c.cap_bits, 1, sizeof *c.s->bits) ||
                 grow(&c, &c.s->props, &c.cap_props, 1, sizeof *c.s->props) ||
                 grow(&c, &c.s->pitems, &c.cap_pitems, 1, sizeof *c.s->pitems) ||
                 grow(&c, &c.s->freq, &c.cap_freq, 1, sizeof *c.s->freq)))
        ok = 0;
    }
  }
  for (int i = 0; i < c.s->nn; i++) {
    json_decref(c.aux[i].vals);
    free(c.aux[i].path);
  }
  for (size_t i = 0; i < c.n_props; i++) free(c.pname[i]);
  for (size_t i = 0; i < c.n_wl; i++) free(c.wl[i].path);
  free(c.aux);
  free(c.br);
  free(c.pname);
  free(c.pnamelen);
  free(c.psort);
  free(c.memo_k);
  free(c.memo_v);
  free(c.wl);
  for (size_t i = 0; i < c.n_keep; i++) json_decref(c.keep[i]);
  free(c.keep);
  if (!ok) {
    if (!c.failed) oom(&c);
    json_schema_free(c.s);
    return NULL;
  }
  return c.s;
}
