/* safetensors — mmapped reader and header writer; see safetensors.h for the file layout. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

/* A header larger than this is not a model file we can trust. */
#define ST_MAX_HEADER (256u << 20)

struct st_file {
  char *path;
  void *map;
  size_t map_len;
  st_tensor *tensors; /* [n], sorted by name */
  int n;
};

static const struct {
  const char *s;
  size_t size;
} st_dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
    {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

size_t st_dtype_str_size(const char *s) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (!strcmp(s, st_dtypes[i].s)) return st_dtypes[i].size;
  return 0;
}

const char *st_dtype_str(dtype t) {
  switch (t) {
    case DTYPE_F32:
      return "F32";
    case DTYPE_F16:
      return "F16";
    case DTYPE_BF16:
      return "BF16";
    case DTYPE_F8_E4M3:
      return "F8_E4M3";
  }
  return "?";
}

static int st_cmp_name(const void *a, const void *b) {
  return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

void st_close(st_file *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
  free(f->tensors);
  if (f->map && f->map != MAP_FAILED) munmap(f->map, f->map_len);
  free(f->path);
  free(f);
}

/* Parses one header entry into t. Returns 0, or -1 with err. */
static int st_parse_entry(const char *path, const char *name, json_t *v, uint64_t data_len,
                          const uint8_t *data, st_tensor *t, char *err, size_t errlen) {
  if (!json_is_object(v))
    return errf(err, errlen, "%s: tensor %s: header entry is not an object", path, name);
  json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
         *jo = json_object_get(v, "data_offsets");
  if (!json_is_string(jd)) return errf(err, errlen, "%s: tensor %s: missing \"dtype\"", path, name);
  if (!json_is_array(js)) return errf(err, errlen, "%s: tensor %s: missing \"shape\"", path, name);
  if (!json_is_array(jo) || json_array_size(jo) != 2)
    return errf(err, errlen, "%s: tensor %s: missing \"data_offsets\"", path, name);
  const char *ds = json_string_value(jd);
  if (strlen(ds) >= sizeof t->dtype_str)
    return errf(err, errlen, "%s: tensor %s: unknown dtype \"%.20s\"", path, name, ds);
  strcpy(t->dtype_str, ds);
  t->is_float = 1;
  if (!strcmp(ds, "F32"))
    t->dt = DTYPE_F32;
  else if (!strcmp(ds, "F16"))
    t->dt = DTYPE_F16;
  else if (!strcmp(ds, "BF16"))
    t->dt = DTYPE_BF16;
  else if (!strcmp(ds, "F8_E4M3"))
    t->dt = DTYPE_F8_E4M3;
  else
    t->is_float = 0;
  size_t nd = json_array_size(js);
  if (nd > ST_MAX_DIMS)
    return errf(err, errlen, "%s: tensor %s: %zu dimensions (at most %d)", path, name, nd,
                ST_MAX_DIMS);
  t->ndim = (int)nd;
  uint64_t numel = 1;
  int overflow = 0;
  for (size_t i = 0; i < nd; i++) {
    json_t *d = json_array_get(js, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
      return errf(err, errlen, "%s: tensor %s: bad shape entry", path, name);
    t->shape[i] = json_integer_value(d);
    if (t->shape[i] && numel > UINT64_MAX / (uint64_t)t->shape[i]) overflow = 1;
    numel *= (uint64_t)t->shape[i];
  }
  json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
  if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
      json_integer_value(je) < json_integer_value(jb))
    return errf(err, errlen, "%s: tensor %s: bad data_offsets", path, name);
  uint64_t b = (uint64_t)json_integer_value(jb), e = (uint64_t)json_integer_value(je);
  if (e > data_len)
    return errf(err, errlen,
                "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                "] run past the end of the file (data section is %" PRIu64
                " bytes; truncated file?)",
                path, name, b, e, data_len);
  size_t es = st_dtype_str_size(ds);
  if (es && (overflow || numel > UINT64_MAX / es || numel * es != e - b))
    return errf(err, errlen,
                "%s: tensor %s: data_offsets span %" PRIu64
                " bytes but dtype %s and shape need %" PRIu64,
                path, name, e - b, ds, overflow ? 0 : numel * es);
  t->data = data + b;
  t->nbytes = e - b;
  return 0;
}

int st_open(const char *path, st_file **out, char *err, size_t errlen) {
  *out = NULL;
  st_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    return errf(err, errlen, "%s: out of memory", path);
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    st_close(f);
    return -1;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    errf(err, errlen, "%s: not a regular file", path);
    close(fd);
    st_close(f);
    return -1;
  }
  if (sb.st_size < 8) {
    errf(err, errlen, "%s: truncated: %lld bytes, shorter than the 8-byte header length", path,
         (long long)sb.st_size);
    close(fd);
    st_close(f);
    return -1;
  }
  f->map_len = (size_t)sb.st_size;
  f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    errf(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
    st_close(f);
    return -1;
  }
  const uint8_t *p = f->map;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
  if (hlen > f->map_len - 8 || hlen > ST_MAX_HEADER) {
    errf(err, errlen,
         "%s: truncated or not a safetensors file: header length %" PRIu64
         " but file has %zu bytes",
         path, hlen, f->map_len);
    st_close(f);
    return -1;
  }
  json_error_t je;
  json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
  if (!root || !json_is_object(root)) {
    errf(err, errlen, "%s: invalid header JSON: %s", path, root ? "not an object" : je.text);
    json_decref(root);
    st_close(f);
    return -1;
  }
  uint64_t data_len = f->map_len - 8 - hlen;
  const uint8_t *data = p + 8 + hlen;
  size_t cap = json_object_size(root);
  f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
  if (!f->tensors) {
    errf(err, errlen, "%s: out of memory", path);
    json_decref(root);
    st_close(f);
    return -1;
  }
  const char *name;
  json_t *v;
  json_object_foreach(root, name, v) {
    if (!strcmp(name, "__metadata__")) continue;
    st_tensor *t = &f->tensors[f->n];
    if (st_parse_entry(path, name, v, data_len, data, t, err, errlen) != 0) {
      json_decref(root);
      st_close(f);
      return -1;
    }
    if (!(t->name = strdup(name))) {
      errf(err, errlen, "%s: out of memory", path);
      json_decref(root);
      st_close(f);
      return -1;
    }
    f->n++;
  }
  json_decref(root);
  qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, st_cmp_name);
  *out = f;
  return 0;
}

const char *st_path(const st_file *f) { return f->path; }
int st_n_tensors(const st_file *f) { return f->n; }
const st_tensor *st_tensor_at(const st_file *f, int i) {
  CHECK(i >= 0 && i < f->n);
  return &f->tensors[i];
}

const st_tensor *st_find(const st_file *f, const char *name) {
  st_tensor key = {.name = (char *)name};
  return bsearch(&key, f->tensors, (size_t)f->n, sizeof *f->tensors, st_cmp_name);
}

/* ---- writer ---------------------------------------------------------------------------- */

typedef struct st_wentry {
  char *name;
  dtype dt;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  uint64_t begin, nbytes;
} st_wentry;

struct st_writer {
  char *path;
  int fd;
  st_wentry *e;
  int n, cap;
  uint64_t data_start; /* 8 + header length */
  uint64_t data_len;
};

int st_writer_open(st_writer **out, const char *path, char *err, size_t errlen) {
  *out = NULL;
  st_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->path = strdup(path))) {
    free(w);
    return errf(err, errlen, "%s: out of memory", path);
  }
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    errf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    free(w->path);
    free(w);
    return -1;
  }
  *out = w;
  return 0;
}

int st_writer_add(st_writer *w, const char *name, dtype dt, int ndim, const int64_t *shape) {
  CHECK(ndim >= 0 && ndim <= ST_MAX_DIMS);
  if (w->n == w->cap) {
    int nc = w->cap ? 2 * w->cap : 64;
    st_wentry *ne = realloc(w->e, (size_t)nc * sizeof *ne);
    if (!ne) return -1;
    w->e = ne;
    w->cap = nc;
  }
  st_wentry *e = &w->e[w->n];
  memset(e, 0, sizeof *e);
  if (!(e->name = strdup(name))) return -1;
  e->dt = dt;
  e->ndim = ndim;
  uint64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    e->shape[i] = shape[i];
    numel *= (uint64_t)shape[i];
  }
  e->nbytes = numel * dtype_size(dt);
  e->begin = w->data_len;
  w->data_len += e->nbytes;
  return w->n++;
}

/* Appends formatted text to a growing buffer. Returns 0, or -1 when out of memory. */
static int st_buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int st_buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return -1;
    if (*buf && *len + (size_t)k < *cap) {
      *len += (size_t)k;
      return 0;
    }
    size_t nc = (*cap ? *cap * 2 : 4096) + (size_t)k;
    char *nb = realloc(*buf, nc);
    if (!nb) return -1;
    *buf = nb;
    *cap = nc;
  }
}

int st_writer_begin(st_writer *w, char *err, size_t errlen) {
  char *h = NULL;
  size_t len = 0, cap = 0;
  int rc = st_buf_printf(&h, &len, &cap, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int i = 0; i < w->n && rc == 0; i++) {
    st_wentry *e = &w->e[i];
    json_t *js = json_string(e->name);
    char *quoted = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
    json_decref(js);
    if (!quoted) {
      rc = -1;
      break;
    }
    rc |= st_buf_printf(&h, &len, &cap, ",%s:{\"dtype\":\"%s\",\"shape\":[", quoted,
                        st_dtype_str(e->dt));
    free(quoted);
    for (int d = 0; d < e->ndim && rc == 0; d++)
      rc |= st_buf_printf(&h, &len, &cap, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    rc |= st_buf_printf(&h, &len, &cap, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", e->begin,
                        e->begin + e->nbytes);
  }
  rc |= st_buf_printf(&h, &len, &cap, "}");
  while (rc == 0 && (8 + len) % 8) rc |= st_buf_printf(&h, &len, &cap, " ");
  if (rc != 0) {
    free(h);
    return errf(err, errlen, "%s: out of memory writing the header", w->path);
  }
  uint8_t lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)len >> (8 * i));
  w->data_start = 8 + len;
  int ok = pwrite(w->fd, lenb, 8, 0) == 8 && pwrite(w->fd, h, len, 8) == (ssize_t)len &&
           ftruncate(w->fd, (off_t)(w->data_start + w->data_len)) == 0;
  free(h);
  if (!ok) return errf(err, errlen, "%s: write failed: %s", w->path, strerror(errno));
  return 0;
}

uint64_t st_writer_nbytes(const st_writer *w, int idx) {
  CHECK(idx >= 0 && idx < w->n);
  return w->e[idx].nbytes;
}

int st_writer_pwrite(st_writer *w, int idx, uint64_t off, const void *buf, size_t n, char *err,
                     size_t errlen) {
  CHECK(idx >= 0 && idx < w->n && off + n <= w->e[idx].nbytes && w->data_start > 0);
  const char *p = buf;
  uint64_t pos = w->data_start + w->e[idx].begin + off;
  while (n > 0) {
    ssize_t k = pwrite(w->fd, p, n, (off_t)pos);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return errf(err, errlen, "%s: write failed: %s", w->path,
                  k < 0 ? strerror(errno) : "no progress");
    p += k;
    pos += (uint64_t)k;
    n -= (size_t)k;
  }
  return 0;
}

int st_writer_put(st_writer *w, int idx, const void *buf, char *err, size_t errlen) {
  return st_writer_pwrite(w, idx, 0, buf, (size_t)st_writer_nbytes(w, idx), err, errlen);
}

int st_writer_close(st_writer *w, char *err, size_t errlen) {
  if (!w) return 0;
  int rc = 0;
  if (w->fd >= 0 && close(w->fd) != 0)
    rc = errf(err, errlen, "%s: close failed: %s", w->path, strerror(errno));
  for (int i = 0; i < w->n; i++) free(w->e[i].name);
  free(w->e);
  free(w->path);
  free(w);
  return rc;
}
