/* safetensors — read-only mmapped views of .safetensors files, and a writer for them.
 *
 * File layout (all little-endian):
 *
 *   +----------+---------------------------+------------------------------------+
 *   | u64 N    | N bytes of JSON header    | data section                       |
 *   +----------+---------------------------+------------------------------------+
 *              {"__metadata__": {...},      tensor bytes at [8+N+begin, 8+N+end)
 *               "name": {"dtype": "BF16",
 *                        "shape": [r, c],
 *                        "data_offsets": [begin, end]}, ...}
 *
 * The reader maps the whole file once (PROT_READ, MAP_PRIVATE) and checks every header entry
 * against the file: offsets inside the data section, end - begin == numel * element size for
 * the dtypes it knows. Tensor data pointers point into the mapping; nothing is copied.
 * Dtypes other than F32 / F16 / BF16 / F8_E4M3 are kept (their bytes stay reachable) but
 * have `is_float == 0`; a caller that needs a float tensor rejects them.
 *
 * The writer declares every tensor first (st_writer_add), then writes the header and sizes
 * the file (st_writer_begin); after that tensor bytes may be written in any order and from
 * any number of threads (st_writer_pwrite), and st_writer_close finishes. */
#ifndef DS_SAFETENSORS_H
#define DS_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#define ST_MAX_DIMS 8

typedef struct st_tensor {
  char *name;         /* owned by the st_file */
  char dtype_str[16]; /* as written in the header, e.g. "BF16" */
  int is_float;       /* 1: dt below is valid (F32, F16, BF16, F8_E4M3) */
  dtype dt;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  const void *data; /* into the mapping */
  uint64_t nbytes;
} st_tensor;

typedef struct st_file st_file;

/* Maps and parses `path`. Returns 0, or -1 with one line in err naming the file (missing,
 * unreadable, truncated, invalid header JSON, bad entry naming the tensor). */
int st_open(const char *path, st_file **out, char *err, size_t errlen);
void st_close(st_file *f);
const char *st_path(const st_file *f);
int st_n_tensors(const st_file *f);
const st_tensor *st_tensor_at(const st_file *f, int i); /* sorted by name */
/* The tensor called `name`, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);

/* Element size of a header dtype string ("BF16" -> 2), 0 when unknown. */
size_t st_dtype_str_size(const char *s);
/* Header spelling of t ("BF16", "F16", "F32", "F8_E4M3"). */
const char *st_dtype_str(dtype t);

typedef struct st_writer st_writer;

/* Creates (truncates) `path`. Returns 0, or -1 with err. */
int st_writer_open(st_writer **out, const char *path, char *err, size_t errlen);
/* Declares the next tensor; returns its index (0, 1, ...) or -1 when out of memory. */
int st_writer_add(st_writer *w, const char *name, dtype dt, int ndim, const int64_t *shape);
/* Writes the header and sizes the file. Returns 0, or -1 with err. */
int st_writer_begin(st_writer *w, char *err, size_t errlen);
/* Bytes of tensor idx. */
uint64_t st_writer_nbytes(const st_writer *w, int idx);
/* Writes n bytes at byte offset `off` inside tensor idx; thread-safe after st_writer_begin.
 * Returns 0, or -1 with err. */
int st_writer_pwrite(st_writer *w, int idx, uint64_t off, const void *buf, size_t n, char *err,
                     size_t errlen);
/* Writes the whole tensor idx from buf (st_writer_nbytes bytes). */
int st_writer_put(st_writer *w, int idx, const void *buf, char *err, size_t errlen);
/* Closes the file and frees w (also after a failure; w may be NULL). Returns 0, or -1. */
int st_writer_close(st_writer *w, char *err, size_t errlen);

#endif
