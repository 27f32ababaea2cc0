/* backend_cuda — lifetime, memory, weights, batch metadata and GEMMs of the CUDA backend; the
 * op kernels live in cuda_elem.cu, cuda_attn.cu, cuda_gdn.cu and cuda_moe.cu (cuda_ops.h).
 *
 * Everything is enqueued on one stream. Buffers are plain cudaMalloc allocations made by the
 * caller at start-up; the only allocations during steps are the metadata arrays and the
 * scratch buffer, which grow (rarely) when a step is larger than every step before. Weights
 * are kept as bf16 (GEMM operands) plus an fp32 copy of the weights the model uploads as
 * exact (weight_upload_exact: 1-D and conv weights, MoE routers), which the elementwise and
 * routing kernels read. DS_BATCH_INVARIANT=1 sends every GEMM through one kernel whose rows'
 * bits do not depend on the row count ("batch-invariant GEMM" below).
 *
 * Decode steps (every piece one row) are recorded rather than launched, then run at the next
 * boundary with adjacent GEMVs fused and, from the second identical step on, as a replayed
 * CUDA graph (section "decode steps" below; DS_CUDA_GRAPHS=0 / DS_CUDA_FUSE=0 turn it off). */
#include "backend/cuda/backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_packed.cuh"
#include "backend/cuda/cuda_ops.h"
extern "C" {
#include "backend/kv_share.h"
}

CUDA_KTRACE_TU(cuda_backend_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

static void graph_flush(cuda_ctx *c);
static void graph_clear(cuda_ctx *c);
static void graph_begin(cuda_ctx *c);
static void graph_note_ready(cuda_ctx *c);
static void gemv_all(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, void *y,
                     int y_f32);

/* ---- failures ---- */

void cuda_fail(cuda_ctx *c, const char *what, const char *detail) {
  if (c->failed) return;
  c->failed = 1;
  snprintf(c->err, sizeof c->err, "cuda: %s: %s", what, detail ? detail : "failed");
}

static void graph_note_launch(cuda_ctx *c);

void cuda_check_launch(cuda_ctx *c, const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) cuda_fail(c, what, cudaGetErrorString(e));
  if (c->capturing) {
    graph_note_launch(c);
    cuda_ktrace_launch(c, what);
  }
}

static int ck(cuda_ctx *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  cuda_fail(c, what, cudaGetErrorString(e));
  return -1;
}

void *cuda_scratch(cuda_ctx *c, size_t bytes) {
  if (bytes <= c->scratch_bytes) return c->scratch;
  if (c->capturing) { /* cannot grow inside a capture: the step runs eagerly instead */
    c->capture_broken = 1;
    return NULL;
  }
  size_t want = bytes + bytes / 4 + (1u << 20);
  cudaStreamSynchronize(c->st);
  cudaFree(c->scratch);
  c->scratch = NULL;
  c->scratch_bytes = 0;
  if (cudaMalloc(&c->scratch, want) != cudaSuccess) {
    cudaGetLastError();
    cuda_fail(c, "scratch", "out of device memory");
    return NULL;
  }
  c->scratch_bytes = want;
  return c->scratch;
}

/* ---- GEMM ---- */

void cuda_gemm(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, void *y, int y_f32) {
  if (T <= 0 || N <= 0) return;
  if (c->batch_invariant) {
    gemv_all(c, x, W, T, K, N, y, y_f32);
    return;
  }
  if (cuda_sgemm(c, x, T, K, 1, &W, &y, &N, y_f32)) return;
  const float alpha = 1.f, beta = 0.f;
  /* column-major view: Y^T [N, T] = W^T(as [K, N] col-major)^T . X^T [K, T] */
  cublasStatus_t s = cublasGemmEx(
      c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, CUDA_R_16BF, K, x, CUDA_R_16BF, K,
      &beta, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) {
    char d[64];
    snprintf(d, sizeof d, "cublasGemmEx status %d (T=%d K=%d N=%d)", (int)s, T, K, N);
    cuda_fail(c, "matmul", d);
  }
}

/* ---- memory ---- */

static size_t cu_kind_size(backend *be, backend_kind kind) {
  (void)be;
  return (kind == BACKEND_KIND_ACT || kind == BACKEND_KIND_KV) ? 2 : 4;
}

static backend_buf cu_alloc(backend *be, backend_kind kind, size_t n) {
  void *p = NULL;
  size_t bytes = n * cu_kind_size(be, kind);
  bytes = (bytes + 255) & ~(size_t)255;
  if (!bytes) bytes = 256;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

static void cu_free(backend *be, backend_buf buf) {
  (void)be;
  if (buf) cudaFree(buf);
}

static int cu_write(backend *be, backend_buf dst, size_t off, const void *src, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  if (c->failed || !n) return c->failed ? -1 : 0;
  if (ck(c, cudaMemcpyAsync((char *)dst + off, src, n, cudaMemcpyHostToDevice, c->st), "write"))
    return -1;
  /* the source is the caller's (pageable) memory: wait so it may change after we return */
  return ck(c, cudaStreamSynchronize(c->st), "write");
}

static int cu_read(backend *be, backend_buf src, size_t off, void *dst, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  if (c->failed) return -1;
  if (n && ck(c, cudaMemcpyAsync(dst, (const char *)src + off, n, cudaMemcpyDeviceToHost, c->st),
              "read"))
    return -1;
  if (ck(c, cudaStreamSynchronize(c->st), "read")) return -1;
  graph_note_ready(c);
  return c->failed ? -1 : 0;
}

/* write_start (backend.h): the copy on the stream, from the caller's page-locked memory. */
static int cu_write_start(backend *be, backend_buf dst, size_t off, const void *src, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  if (c->failed || !n) return c->failed ? -1 : 0;
  return ck(c, cudaMemcpyAsync((char *)dst + off, src, n, cudaMemcpyHostToDevice, c->st), "write");
}

/* read_start / read_wait (backend.h): the copy and an event behind it on the stream. */
static int cu_read_start(backend *be, backend_buf src, size_t off, void *dst, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  if (c->failed) return -1;
  int k = c->rd_next;
  c->rd_next = (k + 1) % BACKEND_READS;
  if (n && ck(c, cudaMemcpyAsync(dst, (const char *)src + off, n, cudaMemcpyDeviceToHost, c->st),
              "read"))
    return -1;
  if (ck(c, cudaEventRecord(c->rd_ev[k], c->st), "read")) return -1;
  return k;
}

static int cu_read_wait(backend *be, int ticket, char *err, size_t errlen) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (ticket < 0 || ticket >= BACKEND_READS)
    cuda_fail(c, "read", "bad ticket");
  else {
    cudaError_t e = cudaEventSynchronize(c->rd_ev[ticket]);
    if (e != cudaSuccess) cuda_fail(c, "read", cudaGetErrorString(e));
    graph_note_ready(c);
  }
  if (c->failed) {
    if (err && errlen) snprintf(err, errlen, "%s", c->err);
    return -1;
  }
  return 0;
}

static void cu_copy(backend *be, backend_buf dst, size_t doff, backend_buf src, size_t soff,
                    size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  if (!n) return;
  ck(c,
     cudaMemcpyAsync((char *)dst + doff, (const char *)src + soff, n, cudaMemcpyDeviceToDevice,
                     c->st),
     "copy");
}

static void cu_zero(backend *be, backend_buf buf, size_t off, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  if (!n) return;
  ck(c, cudaMemsetAsync((char *)buf + off, 0, n, c->st), "zero");
}

/* ---- weights ---- */

static uint16_t h_to_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static float h_get(const void *data, dtype dt, size_t i) {
  if (dt == DTYPE_F32) return ((const float *)data)[i];
  uint16_t h = ((const uint16_t *)data)[i];
  return dt == DTYPE_BF16 ? dtype_bf16_to_f32(h) : dtype_f16_to_f32(h);
}

static void cu_weight_free(backend *be, backend_weight w) {
  if (!w) return;
  /* graphs hold this weight's device addresses */
  graph_flush(cuda_ctx_of(be));
  graph_clear(cuda_ctx_of(be));
  cuda_greedy_forget(cuda_ctx_of(be), CW(w)->bf);
  cudaFree(CW(w)->bf);
  cudaFree(CW(w)->f32);
  cudaFree(CW(w)->pk);
  cudaFree(CW(w)->pkh);
  free(w);
}

/* The packed copy of a weight (cuda_packed.cuh), made on the device from its bf16 rows. */
extern "C" int backend_cuda_packed_rows(backend *be, int rows) {
  cuda_ctx *c = cuda_ctx_of(be);
  return !c->legacy && rows >= 1 && rows <= c->packed && rows <= c->gemv_maxt;
}

static long long cu_weight_pack(backend *be, backend_weight wh) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_weight *w = CW(wh);
  if (!w || w->pk || w->f32 || !pk_fits(w->rows, w->cols) || w->rows > INT32_MAX / 2) return 0;
  int N = (int)w->rows, K = (int)w->cols;
  size_t pb = pk_bytes(N, K), hb = (size_t)N * 4;
  if (cudaMalloc((void **)&w->pk, pb) != cudaSuccess ||
      cudaMalloc((void **)&w->pkh, hb) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(w->pk);
    w->pk = NULL;
    w->pkh = NULL;
    return -1;
  }
  k_pk_base<<<(unsigned)((N + 7) / 8), 256, 0, c->st>>>(w->bf, N, K, w->pkh);
  size_t pieces = (size_t)N * K / 8;
  k_pk_encode<<<(unsigned)((pieces + 255) / 256), 256, 0, c->st>>>(w->bf, N, K, w->pkh, w->pk);
  if (cudaGetLastError() != cudaSuccess || cudaStreamSynchronize(c->st) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(w->pk);
    cudaFree(w->pkh);
    w->pk = NULL;
    w->pkh = NULL;
    return -1;
  }
  return (long long)(pb + hb);
}

/* A weight as the GEMV kernels read it in a product of T rows: its packed copy too when it has
 * one and products of T rows use them (T <= c->packed). */
static pk_view gemv_view(const cuda_ctx *c, const cuda_weight *w, int T) {
  pk_view v = {w->bf, NULL, NULL};
  if (T <= c->packed && w->pk) {
    v.pk = w->pk;
    v.hd = w->pkh;
  }
  return v;
}

/* fp32 copies: 1-D weights, conv weights, and weights uploaded as exact (MoE routers [E, H]:
 * routing is a discrete choice, its logits are computed from the exact weights) */
static int cu_weight_has_f32(int64_t rows, int64_t cols, int exact) {
  return rows == 1 || cols <= 16 || exact;
}

static size_t cu_weight_size(backend *be, int64_t rows, int64_t cols, int exact) {
  (void)be;
  size_t n = (size_t)(rows * cols);
  return n * 2 + (cu_weight_has_f32(rows, cols, exact) ? n * 4 : 0);
}

static backend_weight cu_weight_upload_as(backend *be, const void *data, dtype dt, int64_t rows,
                                          int64_t cols, int exact) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_weight *w = (cuda_weight *)calloc(1, sizeof *w);
  if (!w) return NULL;
  w->rows = rows;
  w->cols = cols;
  size_t n = (size_t)(rows * cols);
  int small = cu_weight_has_f32(rows, cols, exact);
  if (cudaMalloc((void **)&w->bf, (n ? n : 1) * 2) != cudaSuccess ||
      (small && cudaMalloc((void **)&w->f32, (n ? n : 1) * 4) != cudaSuccess)) {
    cudaGetLastError();
    cu_weight_free(be, w);
    return NULL;
  }
  int rc = 0;
  if (dt == DTYPE_BF16) {
    rc |= cudaMemcpy(w->bf, data, n * 2, cudaMemcpyHostToDevice) != cudaSuccess;
  } else {
    const size_t CH = 1u << 20;
    uint16_t *tmp = (uint16_t *)malloc(CH * 2);
    if (!tmp) rc = 1;
    for (size_t i0 = 0; !rc && i0 < n; i0 += CH) {
      size_t m = n - i0 < CH ? n - i0 : CH;
      for (size_t i = 0; i < m; i++) tmp[i] = h_to_bf16(h_get(data, dt, i0 + i));
      rc |= cudaMemcpy(w->bf + i0, tmp, m * 2, cudaMemcpyHostToDevice) != cudaSuccess;
    }
    free(tmp);
  }
  if (!rc && small) {
    float *tmp = (float *)malloc((n ? n : 1) * 4);
    if (!tmp) rc = 1;
    for (size_t i = 0; !rc && i < n; i++) tmp[i] = h_get(data, dt, i);
    if (!rc) rc |= cudaMemcpy(w->f32, tmp, n * 4, cudaMemcpyHostToDevice) != cudaSuccess;
    free(tmp);
  }
  if (rc) {
    cudaGetLastError();
    cu_weight_free(be, w);
    return NULL;
  }
  (void)c;
  return w;
}

static backend_weight cu_weight_upload(backend *be, const void *data, dtype dt, int64_t rows,
                                       int64_t cols) {
  return cu_weight_upload_as(be, data, dt, rows, cols, 0);
}

static backend_weight cu_weight_upload_exact(backend *be, const void *data, dtype dt, int64_t rows,
                                             int64_t cols) {
  return cu_weight_upload_as(be, data, dt, rows, cols, 1);
}

static size_t cu_weight_bytes(backend *be, backend_weight w) {
  (void)be;
  size_t n = (size_t)(CW(w)->rows * CW(w)->cols);
  return n * 2 + (CW(w)->f32 ? n * 4 : 0) +
         (CW(w)->pk ? pk_bytes(CW(w)->rows, CW(w)->cols) + (size_t)CW(w)->rows * 4 : 0);
}

/* ---- batch ---- */

static int cu_set_batch(backend *be, const backend_batch *b) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  if (c->failed) return -1;
  size_t T = (size_t)b->n_tokens, S = (size_t)b->n_seqs;
  size_t nch = 0; /* DeltaNet chunks of the prefill pieces, at most */
  for (size_t s = 0; s < S; s++)
    if (b->seq_len[s] > 1) nch += (size_t)b->seq_len[s] / BACKEND_CHUNK + 2;
  /* the page table's row stride is padded to a multiple of 64 pages (1,024 positions), so the
   * layout, and a graph captured against it, stays the same while sequences grow */
  int mpp = (b->max_pages + 63) / 64 * 64;
  /* + the shared-prefix plan: sh_start, sh_ns, sh_members [T] and the groups */
  size_t need = 3 * T + 8 * S + S * (size_t)mpp + (size_t)b->n_out + 2 * nch + 16 + 3 * T + 1 +
                CUDA_SH_GROUPS * CUDA_SH_GROUP_WORDS;
  if (c->meta_pending) {
    cudaEventSynchronize(c->meta_done);
    c->meta_pending = 0;
  }
  if (need > c->meta_cap) {
    size_t cap = need * 2;
    cudaFreeHost(c->h_meta);
    cudaFree(c->d_meta);
    free(c->h_host);
    c->h_meta = c->d_meta = c->h_host = NULL;
    c->meta_cap = 0;
    graph_clear(c); /* graphs read the old metadata array */
    if (cudaMallocHost((void **)&c->h_meta, cap * 4) != cudaSuccess ||
        cudaMalloc((void **)&c->d_meta, cap * 4) != cudaSuccess ||
        !(c->h_host = (int32_t *)malloc(cap * 4))) {
      cudaGetLastError();
      cuda_fail(c, "set_batch", "out of memory for the batch metadata");
      return -1;
    }
    c->meta_cap = cap;
  }
  int32_t *p = c->h_meta;
  size_t o = 0;
  c->hb = *b;
  cuda_batch *db = &c->b;
  memset(db, 0, sizeof *db);
  db->n_tokens = b->n_tokens;
  db->n_seqs = b->n_seqs;
  db->max_pages = mpp;
  db->n_out = b->n_out;
#define TAKE(field, n)                          \
  do {                                          \
    if ((n) > 0 && b->field)                    \
      memcpy(p + o, b->field, (n) * sizeof *p); \
    else if ((n) > 0)                           \
      memset(p + o, 0, (n) * sizeof *p);        \
    c->hb.field = c->h_host + o;                \
    db->field = c->d_meta + o;                  \
    o += (n);                                   \
  } while (0)
  TAKE(tokens, T);
  TAKE(pos, T);
  TAKE(seq, T);
  TAKE(seq_start, S);
  TAKE(seq_len, S);
  TAKE(seq_pos, S);
  TAKE(seq_slot, S);
  for (size_t s = 0; s < S; s++) {
    int32_t *row = p + o + s * (size_t)mpp;
    if (b->page_table)
      memcpy(row, b->page_table + s * (size_t)b->max_pages, (size_t)b->max_pages * 4);
    else
      memset(row, 0, (size_t)b->max_pages * 4);
    for (int j = b->max_pages; j < mpp; j++) row[j] = -1; /* never read */
  }
  c->hb.page_table = c->h_host + o;
  c->hb.max_pages = mpp;
  db->page_table = c->d_meta + o;
  o += S * (size_t)mpp;
  TAKE(out_rows, (size_t)b->n_out);
#undef TAKE
  /* piece lists */
  int np = 0, nd = 0, maxlen = 0, maxend = 0;
  int32_t *pre = p + o, *dec = p + o + S;
  for (size_t s = 0; s < S; s++) {
    int len = b->seq_len[s];
    if (len > 1)
      pre[np++] = (int32_t)s;
    else
      dec[nd++] = (int32_t)s;
    if (len > maxlen) maxlen = len;
    if (b->seq_pos[s] + len > maxend) maxend = b->seq_pos[s] + len;
  }
  db->prefill_ids = c->d_meta + o;
  db->decode_ids = c->d_meta + o + S;
  c->h_prefill = c->h_host + o;
  c->h_decode = c->h_host + o + S;
  o += 2 * S;
  /* chunk lists */
  int32_t *chr = p + o, *chl = p + o + nch, *pc0 = p + o + 2 * nch;
  int nc = 0;
  for (int i = 0; i < np; i++) {
    int s = pre[i], len = b->seq_len[s], p0 = b->seq_pos[s], r0 = b->seq_start[s];
    pc0[i] = nc;
    for (int t0 = 0; t0 < len;) {
      int L = BACKEND_CHUNK - (p0 + t0) % BACKEND_CHUNK;
      if (L > len - t0) L = len - t0;
      chr[nc] = r0 + t0;
      chl[nc] = L;
      nc++;
      t0 += L;
    }
  }
  pc0[np] = nc;
  db->n_chunks = nc;
  db->ch_row = c->d_meta + o;
  db->ch_len = c->d_meta + o + nch;
  db->pre_ch0 = c->d_meta + o + 2 * nch;
  o += 2 * nch + (size_t)np + 1;
  db->n_prefill = np;
  db->n_decode = nd;
  db->max_len = maxlen;
  db->max_pos_end = maxend;
  /* the shared-prefix plan (kv_share.h), last: its arrays travel only when the step has a
   * group, and a step with one is a graph layout of its own (graph_begin) */
  if (c->attn_shared && S > c->sh_cap) {
    int64_t *ns_ = (int64_t *)realloc(c->sh_scratch, 2 * S * sizeof *ns_);
    if (ns_) {
      c->sh_scratch = ns_;
      c->sh_cap = S;
    }
  }
  if (c->attn_shared && !c->legacy && !c->batch_invariant && nd >= 2 && S <= c->sh_cap) {
    kv_share_group gs[CUDA_SH_GROUPS];
    int32_t *st = p + o, *sn = st + T, *sm = sn + T, *sg = sm + T;
    int ng = kv_share_plan(b, c->attn_shared_min, CUDA_SH_GROUPS, gs, sm, st, c->sh_scratch);
    if (ng > 0) {
      for (size_t t = 0; t < T; t++) sn[t] = 0;
      sg[0] = ng;
      for (int g = 0; g < ng; g++) {
        int L = gs[g].len;
        int ns = (L + CUDA_SH_SPLIT - 1) / CUDA_SH_SPLIT;
        if (ns > CUDA_SH_MAXS) ns = CUDA_SH_MAXS;
        int per = ((L + ns - 1) / ns + 63) / 64 * 64; /* whole K/V tiles per range */
        ns = (L + per - 1) / per;
        int32_t *w = sg + 1 + g * CUDA_SH_GROUP_WORDS;
        w[0] = gs[g].leader;
        w[1] = gs[g].member_off;
        w[2] = gs[g].n_members;
        w[3] = L;
        w[4] = ns;
        w[5] = per;
        for (int m = 0; m < gs[g].n_members; m++) sn[sm[gs[g].member_off + m]] = ns;
      }
      db->sh_on = 1;
      db->sh_start = c->d_meta + o;
      db->sh_ns = c->d_meta + o + T;
      db->sh_members = c->d_meta + o + 2 * T;
      db->sh_groups = c->d_meta + o + 3 * T;
      o += 3 * T + 1 + (size_t)ng * CUDA_SH_GROUP_WORDS;
    }
  }
  memcpy(c->h_host, p, o * 4);
  if (o && ck(c, cudaMemcpyAsync(c->d_meta, p, o * 4, cudaMemcpyHostToDevice, c->st), "set_batch"))
    return -1;
  cudaEventRecord(c->meta_done, c->st);
  /* the rows' tokens from a device buffer: the embedding reads them there (only it reads the
   * tokens; a graph captured so is another layout: the signature holds db->tokens) */
  if (b->tokens_dev) db->tokens = (const int32_t *)b->tokens_dev;
  c->meta_pending = 1;
  graph_begin(c);
  return 0;
}

static int cu_sync(backend *be, char *err, size_t errlen) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  cudaError_t e = cudaStreamSynchronize(c->st);
  if (e != cudaSuccess) cuda_fail(c, "sync", cudaGetErrorString(e));
  if (c->failed) {
    if (err && errlen) snprintf(err, errlen, "%s", c->err);
    return -1;
  }
  return 0;
}

/* ---- GEMM ops ---- */

/* Small-batch GEMV (T <= GEMV_MAXT rows, the decode steps): one warp per output column n,
 * each lane streaming 16-byte pieces of W's row n (read once, not kept in L1) against the T
 * activation rows (L1/L2 resident), fp32 sums per row in a fixed order (lane partials, then a
 * butterfly), so a row's result is the same for every T of this path. cuBLAS's small-N
 * kernels reached ~2.4 TB/s on these shapes; this path is the decode floor's main term. */
#define GEMV_MAXT 8
/* default for c->gemv_maxt: above 4 rows cuBLAS won at decode batch 8 on the H200
 * (1,275 -> 1,767 tok/s, bench/NOTES.md) */
#define GEMV_MAXT_DEFAULT 4
/* warps (rows) per block: 4 read a step's products 0.8-0.9 % faster than 8 in
 * scripts/device/gemv_ceiling.sh, decode 1 +1.9 % (bench/NOTES.md); -DGEMV_WARPS=8 for A/B
 * builds (a row's sums do not depend on it: the same bits) */
#ifndef GEMV_WARPS
#define GEMV_WARPS 4
#endif

/* Single products of at most GEMV_SMALL_N rows (a decode step's out, o and down products: 2,560
 * rows at the 4B shape) in blocks of one warp: in blocks of 4 rows there are 4 or 5 per SM and
 * the SMs holding 5 finish last; one-warp blocks spread ~19-20 rows on every SM. Decode 1
 * +2.8 % (5 of 5 paired rounds; 2 warps: +0.2 %, bench/NOTES.md twelfth session). The same
 * bits: a row's sums do not depend on the block. -DGEMV_SMALL_WARPS=N for A/B builds. */
#ifndef GEMV_SMALL_WARPS
#define GEMV_SMALL_WARPS 1
#endif
#define GEMV_SMALL_N 4096

/* What a GEMV launch does around its products (the decode recorder's norm fold, see
 * norm_fold_at). GEMV_PLAIN: y = x.W^T. GEMV_RES (the product before a folded norm): also
 * res[t, n] += y[t, n] (k_rmsnorm8's residual expression) and xg[t, n] = res[t, n] * (1 +
 * g[n]) in bf16 (the norm's input scaled by its weight, the factor left out). GEMV_LATE (the
 * products after it, x = xg): the next kernel is let launch at once, the products run while the
 * norm's factor kernel before them still runs, and only then is it waited for and each row's
 * sums scaled by inv[t]. */
enum { GEMV_PLAIN = 0, GEMV_RES = 1, GEMV_LATE = 2 };
#define NORM_FOLD_MAXT 4 /* steps of more rows keep the norm (GEMV_MAXT_DEFAULT) */
struct gemv_nf {
  const float *g;   /* GEMV_RES: the norm's weight (zero-centred) */
  bf16 *res, *xg;   /* GEMV_RES: the residual stream and the scaled copy [T, N] */
  const float *inv; /* GEMV_LATE: [T] */
};

template <int MODE>
__device__ __forceinline__ void gemv_enter(void) {
  if (MODE == GEMV_LATE)
    pdl_launch_next();
  else
    pdl_enter();
}

/* GEMV_LATE: the sums scaled by the norm's factors iv (loaded by gemv_row after its wait). */
template <int T, int MODE>
__device__ __forceinline__ void gemv_late(float *acc, const float *iv) {
  if constexpr (MODE == GEMV_LATE) {
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] *= iv[t];
  }
}

/* PK (here and in the fused kernels): the instantiation that reads packed copies (launched when
 * the product has one, T <= PK_MAXT); the other compiles only the bf16 rows. */
template <int T, int WB, int MODE, bool PK>
__global__ void __launch_bounds__(WB * 32)
    k_gemv(const bf16 *__restrict__ x, pk_view W, int K, int N, bf16 *y, gemv_nf nf) {
  int n = blockIdx.x * WB + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  gemv_enter<MODE>();
  if (n >= N) return;
  float acc[T], iv[T], r0 = 0.f, g0 = 0.f;
  if (MODE == GEMV_RES && lane < T) { /* loaded now: not a dependent load after the sums */
    r0 = bf2f(nf.res[(size_t)lane * N + n]);
    g0 = nf.g[n];
  }
  pk_gemv_row<T, MODE == GEMV_LATE, PK>(x, W, n, K, lane, acc, nf.inv, iv);
  gemv_late<T, MODE>(acc, iv);
  if (lane < T) {
    size_t o = (size_t)lane * N + n;
    bf16 yb = f2bf(gemv_pick<T>(acc, lane));
    y[o] = yb;
    if (MODE == GEMV_RES) {
      bf16 rb = f2bf(r0 + bf2f(yb));
      nf.res[o] = rb;
      nf.xg[o] = f2bf(bf2f(rb) * (1.f + g0));
    }
  }
}

/* Up to GEMV_MULTI products of one x in one launch (the decode step's q/k/v and DeltaNet input
 * projections): warp n takes row n - n0[m] of matrix m. */
#define GEMV_MULTI 4
struct gemv_set {
  const bf16 *W[GEMV_MULTI];
  bf16 *y[GEMV_MULTI];
  int n0[GEMV_MULTI + 1];
  int cnt;
  /* the packed copies (gemv_view; NULL: bf16 rows) */
  const uint8_t *pk[GEMV_MULTI];
  const uint32_t *hd[GEMV_MULTI];
};

/* Appends a product to a zeroed set (at most GEMV_MULTI); n0[cnt..GEMV_MULTI] hold the total. */
static void gemv_set_add(gemv_set &s, const bf16 *W, bf16 *y, int N) {
  int tot = s.n0[s.cnt];
  s.W[s.cnt] = W;
  s.y[s.cnt] = y;
  s.cnt++;
  for (int i = s.cnt; i <= GEMV_MULTI; i++) s.n0[i] = tot + N;
}

/* The product that column n of a gemv_set falls in: its matrix, output, width and n's row in it. */
__device__ __forceinline__ void gemv_set_pick(const gemv_set &s, int n, const bf16 *&W, bf16 *&y,
                                              int &N, int &r) {
  int base = s.n0[0];
  W = s.W[0];
  y = s.y[0];
  N = s.n0[1] - s.n0[0];
#pragma unroll
  for (int i = 1; i < GEMV_MULTI; i++)
    if (i < s.cnt && n >= s.n0[i]) {
      W = s.W[i];
      y = s.y[i];
      base = s.n0[i];
      N = s.n0[i + 1] - s.n0[i];
    }
  r = n - base;
}

template <int T, int MODE, bool PK>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_multi(const bf16 *__restrict__ x, gemv_set s, int K, gemv_nf nf) {
  gemv_enter<MODE>();
  int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (n >= s.n0[GEMV_MULTI]) return;
  const bf16 *W;
  bf16 *y;
  int N, r, m = 0;
  gemv_set_pick(s, n, W, y, N, r);
#pragma unroll
  for (int i = 1; i < GEMV_MULTI; i++)
    if (i < s.cnt && n >= s.n0[i]) m = i;
  pk_view v = {W, s.pk[m], s.hd[m]};
  float acc[T], iv[T];
  pk_gemv_row<T, MODE == GEMV_LATE, PK>(x, v, r, K, lane, acc, nf.inv, iv);
  gemv_late<T, MODE>(acc, iv);
  if (lane < T) y[(size_t)lane * N + r] = f2bf(gemv_pick<T>(acc, lane));
}

/* gate = x.Wg^T, up = x.Wu^T, out = silu(gate) * up (the swiglu op's expression on the bf16
 * values) in one launch; gate and up are still written (out may alias gate). From bf16 rows the
 * warp streams its gate and up rows in one loop (gemv_row2: +1.9 % at decode 1 against the gate
 * row, then the up row; bench/NOTES.md twenty-ninth session); from packed copies one row after
 * the other (pk_gemv_row2). */
template <int T, int MODE, bool PK>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_glu(const bf16 *__restrict__ x, pk_view Wg, pk_view Wu, int K, int N, bf16 *yg, bf16 *yu,
               bf16 *out, gemv_nf nf) {
  int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  gemv_enter<MODE>();
  if (n >= N) return;
  float ag[T], au[T], iv[T];
  pk_gemv_row2<T, MODE == GEMV_LATE, PK>(x, Wg, Wu, n, K, lane, ag, au, nf.inv, iv);
  gemv_late<T, MODE>(ag, iv);
  gemv_late<T, MODE>(au, iv);
  if (lane < T) {
    bf16 gb = f2bf(gemv_pick<T>(ag, lane)), ub = f2bf(gemv_pick<T>(au, lane));
    size_t o = (size_t)lane * N + n;
    yg[o] = gb;
    yu[o] = ub;
    out[o] = f2bf(siluf_dev(bf2f(gb)) * bf2f(ub));
  }
}

/* ---- batch-invariant GEMM (DS_BATCH_INVARIANT=1) ----
 * Every product, whatever its row count, through the GEMV arithmetic above: rows in groups of
 * 8, each row's sums in exactly the order of a GEMV of <= 8 rows, so a row's bits depend on
 * its own values and never on how many rows share the step (cuBLAS picks tiles and split-K by
 * the row count). Products of <= 8 rows give the same bits as the default mode's GEMV path.
 * grid (ceil(N / GEMV_WARPS), ceil(T / GEMV_ALL_ROWS)); W rows are re-read per group from
 * L1/L2 (normal loads). Slower than cuBLAS for large T (CUDA cores): a correctness mode. */
#define GEMV_ALL_ROWS 64

/* Same order as gemv_row, one element per lane step: for K % 8 or unaligned operands. */
template <int T>
__device__ __forceinline__ void gemv_row_scalar(const bf16 *__restrict__ x,
                                                const bf16 *__restrict__ w, int K, int lane,
                                                float *acc) {
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = 0.f;
  for (int k = lane; k < K; k += 32) {
    float wf = bf2f(w[k]);
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] += wf * bf2f(x[(size_t)t * K + k]);
  }
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = warp_sum(acc[t]);
}

template <int R, int F32, int VEC>
__device__ __forceinline__ void gemv_all_group(const bf16 *x, const bf16 *w, int K, int N, int n,
                                               int lane, int t0, void *y) {
  float acc[R];
  if (VEC)
    gemv_row<R, false>(x + (size_t)t0 * K, w, K, lane, acc);
  else
    gemv_row_scalar<R>(x + (size_t)t0 * K, w, K, lane, acc);
  if (lane < R) {
    float v = gemv_pick<R>(acc, lane);
    size_t o = (size_t)(t0 + lane) * N + n;
    if (F32)
      ((float *)y)[o] = v;
    else
      ((bf16 *)y)[o] = f2bf(v);
  }
}

template <int F32, int VEC>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_all(const bf16 *__restrict__ x, const bf16 *__restrict__ W, int T, int K, int N,
               void *y) {
  pdl_enter();
  int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (n >= N) return;
  const bf16 *w = W + (size_t)n * K;
  int t0 = blockIdx.y * GEMV_ALL_ROWS, t1 = min(T, t0 + GEMV_ALL_ROWS);
  for (; t0 + 8 <= t1; t0 += 8) gemv_all_group<8, F32, VEC>(x, w, K, N, n, lane, t0, y);
  switch (t1 - t0) {
// clang-format off
#define G(r) case r: gemv_all_group<r, F32, VEC>(x, w, K, N, n, lane, t0, y); break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7)
#undef G
        // clang-format on
        default : break;
  }
}

static void gemv_all(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, void *y,
                     int y_f32) {
  int vec = K % 8 == 0 && ((((uintptr_t)x | (uintptr_t)W) & 15) == 0);
  dim3 grid((unsigned)((N + GEMV_WARPS - 1) / GEMV_WARPS),
            (unsigned)((T + GEMV_ALL_ROWS - 1) / GEMV_ALL_ROWS));
  if (y_f32 && vec)
    k_gemv_all<1, 1><<<grid, GEMV_WARPS * 32, 0, c->st>>>(x, W, T, K, N, y);
  else if (y_f32)
    k_gemv_all<1, 0><<<grid, GEMV_WARPS * 32, 0, c->st>>>(x, W, T, K, N, y);
  else if (vec)
    k_gemv_all<0, 1><<<grid, GEMV_WARPS * 32, 0, c->st>>>(x, W, T, K, N, y);
  else
    k_gemv_all<0, 0><<<grid, GEMV_WARPS * 32, 0, c->st>>>(x, W, T, K, N, y);
  cuda_check_launch(c, "matmul (batch-invariant)");
}

/* ---- narrow products (N <= NARROW_MAXN columns, e.g. the DeltaNet b and a projections) ----
 * cuBLAS spends 7-9 µs of pure latency on a 32-column product at 32-128 rows, and one warp per
 * (column, 8 rows) walking all of K took 17.8 µs for b and a at 64 rows (bench/NOTES.md): too
 * few warps, each a chain of dependent loads. Here a block takes NARROW_COLS columns x 8 rows
 * and its NARROW_KW warps split K (warp w: the 256-element pieces w, w + NARROW_KW, ...); a
 * lane keeps the columns' W piece and reuses it for the 8 x rows (x from L2/L1), partials in
 * fp32: lane order, then a butterfly, then the warps in order through shared memory — a fixed
 * order that depends only on K, never on T. Up to GEMV_MULTI products of one x in one launch
 * (the decode recorder fuses b and a). grid (ceil(total columns / NARROW_COLS), ceil(T / 8)). */
#define NARROW_MAXN 64
/* decode steps only: at 512-row prefill steps cuBLAS was faster (bench/NOTES.md) */
#define NARROW_MAXT 128
#define NARROW_COLS 4
#define NARROW_KW 8

template <int R>
__device__ __forceinline__ void narrow_tile(const bf16 *__restrict__ x, const bf16 *const *w, int K,
                                            int t0, int wp, int lane,
                                            float (*red)[NARROW_COLS][8]) {
  float acc[NARROW_COLS][R];
#pragma unroll
  for (int c = 0; c < NARROW_COLS; c++)
#pragma unroll
    for (int t = 0; t < R; t++) acc[c][t] = 0.f;
  for (int k = (wp * 32 + lane) * 8; k < K; k += NARROW_KW * 256) {
    float wf[NARROW_COLS][8];
#pragma unroll
    for (int c = 0; c < NARROW_COLS; c++) bf16x8_to_f32(__ldg((const uint4 *)(w[c] + k)), wf[c]);
#pragma unroll
    for (int t = 0; t < R; t++) {
      float xf[8];
      bf16x8_to_f32(*(const uint4 *)(x + (size_t)(t0 + t) * K + k), xf);
#pragma unroll
      for (int c = 0; c < NARROW_COLS; c++)
#pragma unroll
        for (int i = 0; i < 8; i++) acc[c][t] += wf[c][i] * xf[i];
    }
  }
#pragma unroll
  for (int c = 0; c < NARROW_COLS; c++)
#pragma unroll
    for (int t = 0; t < R; t++) {
      float v = warp_sum(acc[c][t]);
      if (lane == 0) red[wp][c][t] = v;
    }
}

__global__ void __launch_bounds__(NARROW_KW * 32)
    k_gemv_narrow(const bf16 *__restrict__ x, gemv_set s, int T, int K) {
  pdl_enter();
  __shared__ float red[NARROW_KW][NARROW_COLS][8];
  int wp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n0 = blockIdx.x * NARROW_COLS, t0 = blockIdx.y * 8, tot = s.n0[GEMV_MULTI];
  const bf16 *w[NARROW_COLS];
#pragma unroll
  for (int c = 0; c < NARROW_COLS; c++) {
    const bf16 *Wm;
    bf16 *y;
    int N, r;
    gemv_set_pick(s, min(n0 + c, tot - 1), Wm, y, N, r); /* past the end: a real row, unused */
    w[c] = Wm + (size_t)r * K;
  }
  switch (min(T - t0, 8)) {
// clang-format off
#define G(R) case R: narrow_tile<R>(x, w, K, t0, wp, lane, red); break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
        // clang-format on
        default : break;
  }
  __syncthreads();
  int c = threadIdx.x >> 3, t = threadIdx.x & 7, n = n0 + c;
  if (threadIdx.x < NARROW_COLS * 8 && n < tot && t0 + t < T) {
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < NARROW_KW; q++) v += red[q][c][t];
    const bf16 *Wm;
    bf16 *y;
    int N, r;
    gemv_set_pick(s, n, Wm, y, N, r);
    y[(size_t)(t0 + t) * N + r] = f2bf(v);
  }
}

static int narrow_fits_shape(const cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N,
                             const void *y) {
  return c->narrow && !c->legacy && !c->batch_invariant && T > c->gemv_maxt && T <= NARROW_MAXT &&
         N >= 1 && N <= NARROW_MAXN && K % 8 == 0 && !(((uintptr_t)x | (uintptr_t)W) & 15) && y;
}

/* m products of one x (each narrow_fits_shape) in one launch. */
static void launch_narrow(cuda_ctx *c, const bf16 *x, int T, int K, int m, const bf16 *const *W,
                          bf16 *const *y, const int *N) {
  gemv_set s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < m; i++) gemv_set_add(s, W[i], y[i], N[i]);
  int tot = s.n0[GEMV_MULTI];
  dim3 grid((unsigned)((tot + NARROW_COLS - 1) / NARROW_COLS), (unsigned)((T + 7) / 8));
  k_gemv_narrow<<<grid, NARROW_KW * 32, 0, c->st>>>(x, s, T, K);
  cuda_check_launch(c, "matmul (narrow)");
}

/* k_gemv in blocks of WB warps (rows). */
template <int WB, int MODE>
static void gemv_launch(cuda_ctx *c, const bf16 *x, pk_view W, int T, int K, int N, bf16 *y,
                        gemv_nf nf) {
  unsigned blocks = (unsigned)((N + WB - 1) / WB);
  switch (T) {
// clang-format off
#define G(n)                                                                          \
  case n:                                                                             \
    if constexpr (MODE == GEMV_PLAIN || n <= NORM_FOLD_MAXT) {                        \
      if (n <= PK_MAXT && W.pk)                                                       \
        k_gemv<n, WB, MODE, n <= PK_MAXT><<<blocks, WB * 32, 0, c->st>>>(x, W, K, N, y, nf); \
      else                                                                            \
        k_gemv<n, WB, MODE, false><<<blocks, WB * 32, 0, c->st>>>(x, W, K, N, y, nf); \
    }                                                                                 \
    break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
    // clang-format on
  }
}

template <int MODE>
static void gemv_mode(cuda_ctx *c, const bf16 *x, pk_view W, int T, int K, int N, bf16 *y,
                      gemv_nf nf) {
  if (N <= GEMV_SMALL_N)
    gemv_launch<GEMV_SMALL_WARPS, MODE>(c, x, W, T, K, N, y, nf);
  else
    gemv_launch<GEMV_WARPS, MODE>(c, x, W, T, K, N, y, nf);
  cuda_check_launch(c, MODE == GEMV_PLAIN ? "matmul (gemv)"
                       : MODE == GEMV_RES ? "matmul (gemv + residual)"
                                          : "matmul (gemv, norm factor late)");
}

/* 1 when the GEMV path took the product. */
static int gemv(cuda_ctx *c, const bf16 *x, const cuda_weight *W, int T, int K, int N, bf16 *y) {
  if (c->legacy || T < 1 || T > c->gemv_maxt || K % 8 || (((uintptr_t)x | (uintptr_t)W->bf) & 15))
    return 0;
  gemv_nf nf = {NULL, NULL, NULL, NULL};
  gemv_mode<GEMV_PLAIN>(c, x, gemv_view(c, W, T), T, K, N, y, nf);
  return 1;
}

static void cu_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                      backend_buf y) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (CW(W)->cols != K || CW(W)->rows != N) {
    cuda_fail(c, "matmul", "weight shape does not match K, N");
    return;
  }
  if (gemv(c, (const bf16 *)x, CW(W), T, K, N, (bf16 *)y)) return;
  if (!cuda_sgemm_fits(c, T, K, N, 0) &&
      narrow_fits_shape(c, (const bf16 *)x, CW(W)->bf, T, K, N, y)) {
    const bf16 *w1 = CW(W)->bf;
    bf16 *y1 = (bf16 *)y;
    launch_narrow(c, (const bf16 *)x, T, K, 1, &w1, &y1, &N);
    return;
  }
  cuda_gemm(c, (const bf16 *)x, CW(W)->bf, T, K, N, y, 0);
}

/* The lm-head of steps the GEMV path takes, fp32 out: the row sums of gemv_row, which
 * cuda_greedy.cu's exact rows repeat (so its ids are argmax of these logits). */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_f32(const bf16 *__restrict__ x, const bf16 *__restrict__ W, int K, int N, float *y) {
  pdl_enter();
  int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (n >= N) return;
  float acc[T];
  gemv_row<T>(x, W + (size_t)n * K, K, lane, acc);
  if (lane < T) y[(size_t)lane * N + n] = gemv_pick<T>(acc, lane);
}

/* 1 when the GEMV path took the product (fp32 out). */
static int gemv_f32(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, float *y) {
  if (c->legacy || c->batch_invariant || T < 1 || T > c->gemv_maxt || K % 8 ||
      (((uintptr_t)x | (uintptr_t)W) & 15))
    return 0;
  unsigned blocks = (unsigned)((N + GEMV_WARPS - 1) / GEMV_WARPS);
  switch (T) {
// clang-format off
#define G(t) case t: k_gemv_f32<t><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(x, W, K, N, y); break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
        // clang-format on
        default : return 0;
  }
  cuda_check_launch(c, "logits (gemv)");
  return 1;
}

static void cu_logits(backend *be, backend_buf x, backend_weight norm, float eps, backend_weight W,
                      int H, int V, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  int n = c->b.n_out;
  if (n <= 0) return;
  if (CW(W)->cols != H || CW(W)->rows != V) {
    cuda_fail(c, "logits", "weight shape does not match H, V");
    return;
  }
  void *xn = cuda_scratch(c, (size_t)n * H * 2);
  if (!xn) return;
  cuda_elem_gather_norm(be, x, norm, eps, H, xn);
  if (!gemv_f32(c, (const bf16 *)xn, CW(W)->bf, n, H, V, (float *)out))
    cuda_gemm(c, (const bf16 *)xn, CW(W)->bf, n, H, V, out, 1);
}

/* ---- argmax (optional op): the greedy step's token ids on the device ---- */

#define ARGMAX_THREADS 1024

/* Row r's result from its reduced (·, i): the first maximum, as the sampler's scan gives; all
 * NaN, or a NaN at entry 0 (that scan never leaves 0 then), gives 0. */
__device__ __forceinline__ void am_store(const float *row, int i, int r, int32_t *ids,
                                         float *maxv) {
  if (i == INT32_MAX || isnan(row[0])) i = 0;
  ids[r] = i;
  if (maxv) maxv[r] = row[i];
}

/* One block per row: each thread scans a strided set of entries, then a warp and a block
 * reduction under the same rule. */
__global__ void __launch_bounds__(ARGMAX_THREADS)
    k_argmax(const float *__restrict__ x, int V, int32_t *ids, float *maxv) {
  pdl_enter();
  const float *row = x + (size_t)blockIdx.x * V;
  float v = -INFINITY;
  int i = INT32_MAX;
  if ((V & 3) == 0 && (((uintptr_t)row) & 15) == 0)
    am_scan4((const float4 *)row, 0, V / 4, v, i);
  else
    for (int j = threadIdx.x; j < V; j += blockDim.x) am_take(v, i, row[j], j);
  am_block<ARGMAX_THREADS>(v, i);
  if (threadIdx.x == 0) am_store(row, i, blockIdx.x, ids, maxv);
}

/* The same scan for steps of few rows, where one block per row leaves the GPU idle (one
 * 1024-thread block read a 151,936-entry row in ~15 µs of a one-sequence step): grid (nb, n),
 * block b of row r takes the b-th of nb contiguous float4-aligned chunks, writes its (value,
 * id) to the partials and bumps the row's counter; the last block to arrive (fenced) reduces
 * the nb partials in block order and resets the counter. am_take is a total order (value, then
 * the lower id; NaN ignored), so the result is the one-block kernel's for any nb. */
#define ARGMAX_PARTS 4096 /* partial pairs (rows x blocks per row) at most */
#define ARGMAX_SPLIT_THREADS 256

__global__ void __launch_bounds__(ARGMAX_SPLIT_THREADS)
    k_argmax_split(const float *__restrict__ x, int V, float *pv, int *pi, int *cnt, int32_t *ids,
                   float *maxv) {
  pdl_enter();
  int r = blockIdx.y, b = blockIdx.x, nb = gridDim.x;
  const float *row = x + (size_t)r * V;
  int n4 = V / 4, per = (n4 + nb - 1) / nb, q0 = b * per;
  float v = -INFINITY;
  int i = INT32_MAX;
  am_scan4((const float4 *)row, q0, min(n4, q0 + per), v, i);
  am_block<ARGMAX_SPLIT_THREADS>(v, i);
  __shared__ int last;
  if (threadIdx.x == 0) {
    pv[(size_t)r * nb + b] = v;
    pi[(size_t)r * nb + b] = i;
    __threadfence();
    last = atomicAdd(&cnt[r], 1) == nb - 1;
    __threadfence();
  }
  __syncthreads();
  if (!last) return;
  v = -INFINITY;
  i = INT32_MAX;
  for (int k = threadIdx.x; k < nb; k += blockDim.x)
    am_take(v, i, __ldcg(&pv[(size_t)r * nb + k]), __ldcg(&pi[(size_t)r * nb + k]));
  am_block<ARGMAX_SPLIT_THREADS>(v, i);
  if (threadIdx.x == 0) {
    cnt[r] = 0;
    am_store(row, i, r, ids, maxv);
  }
}

/* blocks per row for k_argmax_split (1: the one-block kernel) */
static int argmax_blocks(const cuda_ctx *c, int n, int V, const void *x) {
  if (!c->am_cnt || c->legacy || (V & 3) || (((uintptr_t)x) & 15)) return 1;
  int nb = 64 / n; /* ~64 blocks in all: a row's chunks of >= 256 float4 at Qwen's vocabulary */
  while (nb > 1 && (size_t)n * nb > ARGMAX_PARTS) nb--;
  return nb;
}

static void cu_argmax(backend *be, backend_buf x, int n, int V, backend_buf ids, backend_buf maxv) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (n <= 0 || V <= 0) return;
  int nb = argmax_blocks(c, n, V, x);
  if (nb > 1)
    k_argmax_split<<<dim3((unsigned)nb, (unsigned)n), ARGMAX_SPLIT_THREADS, 0, c->st>>>(
        (const float *)x, V, c->am_v, c->am_i, c->am_cnt, (int32_t *)ids, (float *)maxv);
  else
    k_argmax<<<n, ARGMAX_THREADS, 0, c->st>>>((const float *)x, V, (int32_t *)ids, (float *)maxv);
  cuda_check_launch(c, "argmax");
}

/* The greedy ids of the step: cuda_greedy.cu's screen for one row (the same ids as below,
 * without reading the bf16 lm-head), else the logits and argmax. */
static void cu_logits_argmax(backend *be, backend_buf x, backend_weight norm, float eps,
                             backend_weight W, int H, int V, backend_buf logits, backend_buf ids) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->b.n_out <= 0 || cuda_greedy_run(be, x, norm, eps, W, H, V, ids)) return;
  cu_logits(be, x, norm, eps, W, H, V, logits);
  cu_argmax(be, logits, c->b.n_out, V, ids, NULL);
}

/* Page-locked host memory: `read` into it is one DMA, no staging through a bounce buffer. */
static void *cu_host_alloc(backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

static void cu_host_free(backend *be, void *p) {
  (void)be;
  if (p) cudaFreeHost(p);
}

/* ---- decode steps: record, fuse, replay as CUDA graphs ----
 *
 * A decode step (every piece one row) is ~500 small launches, and at batch 1 the launch gaps
 * cost as much as the weights' bytes. From set_batch of such a step to the next call that
 * must see its results (sync, read, write, copy, zero, the next set_batch) the ops are not
 * launched but recorded: each as a closure over its arguments, plus the arguments' bytes in a
 * signature. At that boundary the list runs, in order, with these rewrites (a peephole):
 *   matmuls of one x on the GEMV path, one after another    -> one k_gemv_multi launch
 *   matmul gate, matmul up, swiglu(gate, up)                  -> one k_gemv_glu launch
 *   conv1d, gdn_gates, gdn_decode, gated_rmsnorm of one layer -> one k_gdn_chain launch
 *   attention, sigmoid_mul(its output, gate)                  -> the gate in the merge kernel
 *   product, rmsnorm, products of its output                  -> the norm off the products'
 *                                                                critical path (norm_fold_at)
 * (each output element computed by the same code as unfused: the same bits). How it runs:
 *   - a graph captured for the same signature and scratch address exists: relaunch it;
 *   - the signature equals the previous step's: capture the run into a graph, keep it;
 *   - else run the launches directly (first sight of a shape; it also grows the scratch, so
 *     nothing grows during a later capture).
 * The signature starts with the metadata layout key and the metadata array's address; every
 * host value a launch depends on is either an op argument or a function of that key, so a
 * replay issues exactly the kernels a direct run would, reading the new step's metadata from
 * the same addresses. DS_CUDA_GRAPHS=0 turns all of this off (ops launch as issued);
 * DS_CUDA_FUSE=0 keeps graphs but not the rewrites. */

#define GRAPH_CACHE 24

enum {
  GOP_OTHER = 0,
  GOP_MATMUL = 1,
  GOP_SWIGLU = 2,
  /* the DeltaNet decode chain's ops (their arguments in gop.ch) */
  GOP_CONV,
  GOP_GATES,
  GOP_GDN_DEC,
  GOP_GNORM,
  GOP_ATTN,   /* attention (arguments in gop.at) */
  GOP_SIGMUL, /* sigmoid_mul(out, gate, n) */
  GOP_RMSNORM /* rmsnorm (arguments in gop.nm) */
};

/* GOP_RMSNORM's arguments (the rmsnorm op: x += add; y = norm(x; w, eps)) */
struct gop_norm {
  bf16 *x;
  const bf16 *add;
  const float *w; /* fp32 */
  int T, n;
  float eps;
  bf16 *y;
};

/* GOP_ATTN's arguments */
struct gop_attn {
  backend_buf k_pool, v_pool, q, k, v;
  int nh, nkv, hd;
  float scale;
  backend_buf out;
};

struct gop {
  int kind;
  /* the op: call(be, the arguments at offset arg of cuda_graphs::args), see rec_call */
  void (*call)(backend *, const uint8_t *);
  uint32_t arg;
  /* GOP_MATMUL */
  const bf16 *x;
  const cuda_weight *W;
  int T, K, N;
  bf16 *y;
  /* GOP_SWIGLU (GOP_SIGMUL: out, gate, n) */
  const bf16 *gate, *up;
  size_t n;
  bf16 *out;
  /* GOP_CONV .. GOP_GNORM: each fills its own op's fields */
  cuda_gdn_chain_args ch;
  gop_attn at; /* GOP_ATTN */
  gop_norm nm; /* GOP_RMSNORM */
};

struct graph_entry {
  std::vector<uint8_t> sig;
  uint64_t h;
  void *scratch;
  cudaGraphExec_t exec;
  uint64_t used;
  uint64_t uid; /* never reused: what step_repeat names */
};

struct cuda_graphs {
  int rec;        /* recording the current step */
  int use_graphs; /* capture and replay (else only the rewrites) */
  int fuse;       /* the peephole rewrites */
  int pdl;        /* programmatic edges in captured graphs (graph_pdl; DS_PDL=0: off) */
  backend *be;
  std::vector<gop> ops;
  std::vector<uint8_t> args; /* the recorded ops' arguments (rec_call) */
  std::vector<uint8_t> sig, last_sig, bad_sig;
  std::vector<graph_entry> cache;
  uint64_t tick, uids;
  long captures, replays, direct, fused, pdl_edges, norm_folds, repeats;
  /* step_repeat (DS_CUDA_REPEAT=0: off): the last recorded step ran as graph rep_uid (0:
   * it did not run as one graph), its signature beginning with rep_layout (the metadata
   * layout entry, layout_len bytes); rep_pending: this step is that graph again */
  int repeat, rep_pending;
  uint64_t rep_uid;
  size_t layout_len;
  std::vector<uint8_t> rep_layout;
  /* the graph nodes of the capture in progress that are kernels of ours (graph_note_launch) */
  std::unordered_set<cudaGraphNode_t> ours;
  /* DS_CUDA_STEP_TIMING=1: each replay between two events, for the GPU's share of a step
   * (graph_time); reported at destroy */
  int timing, timed_pending;
  cudaEvent_t ev[2];
  double t_last, t_ready, t_begin;
  std::vector<float> gpu_ms, wall_ms; /* per replay */
  /* host intervals before each replay: the last read's return to set_batch (the engine), then
   * to the launch (set_batch, recording, lookup), and cudaGraphLaunch itself */
  std::vector<float> engine_ms, record_ms, launch_ms;
};

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static float median(std::vector<float> v) {
  if (v.empty()) return 0.f;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/* One line on stderr: the replays' median GPU time and wall time from one replay's launch to
 * the next's (the difference is the host's share of a step: reading the result, scheduling,
 * recording the next step, launching it). */
static void graph_time_report(cuda_graphs *g) {
  if (!g || !g->timing) return;
  if (!g->gpu_ms.empty())
    fprintf(stderr,
            "cuda: %zu timed decode-step replays: median GPU %.3f ms, launch to launch %.3f ms; "
            "host before a replay: result read to set_batch %.3f ms, to the launch %.3f ms, "
            "cudaGraphLaunch %.3f ms\n",
            g->gpu_ms.size(), median(g->gpu_ms), median(g->wall_ms), median(g->engine_ms),
            median(g->record_ms), median(g->launch_ms));
  cudaEventDestroy(g->ev[0]);
  cudaEventDestroy(g->ev[1]);
}

/* Replay timing (DS_CUDA_STEP_TIMING): before a replay, the previous one's GPU time and the
 * wall time since its launch. It waits for the previous replay's end, so with steps ahead
 * (engine.c) the timed run issues its steps one after the other instead. */
static void graph_time(cuda_graphs *g) {
  if (!g->timing) return;
  double t = now_ms();
  if (g->timed_pending) {
    float ms = 0.f;
    if (cudaEventSynchronize(g->ev[1]) == cudaSuccess &&
        cudaEventElapsedTime(&ms, g->ev[0], g->ev[1]) == cudaSuccess) {
      g->gpu_ms.push_back(ms);
      g->wall_ms.push_back((float)(t - g->t_last));
    }
    cudaGetLastError();
  }
  g->t_last = t;
}

/* Called by cuda_check_launch, which follows every launch of ours: while a capture is open,
 * the node the stream now ends in is the kernel just launched (cuBLAS calls are never followed
 * by it). */
static void graph_note_launch(cuda_ctx *c) {
  cudaStreamCaptureStatus st;
  const cudaGraphNode_t *deps = NULL;
  size_t nd = 0;
  if (!c->gr) return;
  if (cudaStreamGetCaptureInfo(c->st, &st, NULL, NULL, &deps, NULL, &nd) == cudaSuccess &&
      st == cudaStreamCaptureStatusActive && nd == 1)
    c->gr->ours.insert(deps[0]);
}

/* Appends id and the arguments' bytes to a signature (one resize per op: recording runs on
 * every decode step while the GPU waits). */
template <typename... A>
static void sig_put(std::vector<uint8_t> &s, int id, const A &...a) {
  size_t off = s.size();
  s.resize(off + sizeof id + (sizeof a + ... + 0));
  uint8_t *p = s.data() + off;
  memcpy(p, &id, sizeof id);
  p += sizeof id;
  ((memcpy(p, &a, sizeof a), p += sizeof a), ...);
}

/* The signature's hash for the graph cache (a hit also compares the whole signature): FNV-1a
 * over 8-byte words, the tail by bytes. Runs on every decode step while the GPU waits; per byte
 * it took ~21 µs for a 19 KB signature on this project's CI machine, per word ~4 µs. */
static uint64_t sig_hash(const std::vector<uint8_t> &s) {
  uint64_t h = 1469598103934665603ull;
  size_t n = s.size(), i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 1099511628211ull;
    h ^= h >> 29;
  }
  for (; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

/* A new recorded op that runs fn(be, a...): fn and the arguments are kept as one tuple in the
 * step's argument arena (no allocation per op: the arena keeps its capacity from step to step;
 * recording is host time the GPU waits for at one sequence, bench/NOTES.md). */
template <typename... A>
static gop &rec_call(cuda_graphs *g, void (*fn)(backend *, A...), A... a) {
  typedef std::tuple<void (*)(backend *, A...), A...> tup;
  size_t off = (g->args.size() + 15) & ~(size_t)15;
  g->args.resize(off + sizeof(tup));
  new (&g->args[off]) tup(fn, a...);
  g->ops.emplace_back();
  gop &o = g->ops.back();
  o.arg = (uint32_t)off;
  o.call = [](backend *be, const uint8_t *p) {
    std::apply([be](auto f, auto... x) { f(be, x...); }, *(const tup *)p);
  };
  return o;
}

static void rec_run(cuda_graphs *g, const gop &o) { o.call(g->be, g->args.data() + o.arg); }

/* Records op `fn(be, a...)` when the step is being recorded; 0 when the caller runs it. */
template <typename... A>
static int rec_op(backend *be, int id, void (*fn)(backend *, A...), A... a) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) return 0;
  sig_put(g->sig, id, a...);
  rec_call(g, fn, a...).kind = GOP_OTHER;
  return 1;
}

static void graph_clear(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (!g) return;
  for (auto &e : g->cache) cudaGraphExecDestroy(e.exec);
  g->cache.clear();
  g->last_sig.clear();
  g->bad_sig.clear();
  g->rep_uid = 0;
}

/* Called when a read has its result (DS_CUDA_STEP_TIMING: the host's interval starts). */
static void graph_note_ready(cuda_ctx *c) {
  if (c->gr && c->gr->timing) c->gr->t_ready = now_ms();
}

/* Called at the end of set_batch: record the step when it is a decode step. */
static void graph_begin(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (!g || c->failed) return;
  if (g->timing) g->t_begin = now_ms();
  g->ops.clear();
  g->args.clear();
  g->sig.clear();
  g->rep_pending = 0;
  g->rec = c->b.n_tokens > 0 && c->b.n_prefill == 0 && c->b.n_decode == c->b.n_tokens;
  if (g->rec)
    sig_put(g->sig, 0, c->b.n_tokens, c->b.n_seqs, c->b.max_pages, c->b.n_out, c->d_meta,
            c->b.tokens, c->b.page_table, c->b.out_rows, c->b.decode_ids, c->b.sh_on);
  else
    g->rep_uid = 0;
  g->layout_len = g->sig.size();
}

/* The caller would issue the previous step's ops again (backend.h step_repeat): when that
 * step ran as one captured graph, this step's metadata has its layout and the scratch has
 * not moved, the graph is this step too (its signature would be the same: the ops' arguments
 * are the caller's, the metadata layout is checked here), and no op is recorded. */
static int cu_step_repeat(backend *be) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graphs *g = c->gr;
  if (!g || !g->rec || !g->repeat || !g->use_graphs || c->failed || !g->rep_uid ||
      !g->ops.empty() || g->sig != g->rep_layout)
    return 0;
  for (auto &e : g->cache)
    if (e.uid == g->rep_uid) {
      if (e.scratch != c->scratch) return 0;
      g->rep_pending = 1;
      return 1;
    }
  return 0;
}

static int gemv_fits(cuda_ctx *c, const gop &o) {
  return o.kind == GOP_MATMUL && !c->legacy && o.T >= 1 && o.T <= c->gemv_maxt && o.K % 8 == 0 &&
         o.W->cols == o.K && o.W->rows == o.N && !(((uintptr_t)o.x | (uintptr_t)o.W->bf) & 15);
}

static int sgemm_fits(cuda_ctx *c, const gop &o) {
  return o.kind == GOP_MATMUL && o.W->cols == o.K && o.W->rows == o.N &&
         cuda_sgemm_fits(c, o.T, o.K, o.N, 1);
}

static int narrow_fits(cuda_ctx *c, const gop &o) {
  return o.kind == GOP_MATMUL && o.W->cols == o.K && o.W->rows == o.N &&
         !cuda_sgemm_fits(c, o.T, o.K, o.N, 0) &&
         narrow_fits_shape(c, o.x, o.W->bf, o.T, o.K, o.N, o.y);
}

static int overlap(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* How many ops from i on (at most maxm) are products of ops[i]'s x (same T, K) that `fits`
 * takes, into outputs that overlap neither x nor each other. */
static int same_x_run(cuda_ctx *c, const std::vector<gop> &ops, size_t i, int maxm,
                      int (*fits)(cuda_ctx *, const gop &)) {
  const gop &o = ops[i];
  size_t xb = (size_t)o.T * o.K * 2, n = ops.size();
  int m = 1;
  if (overlap(o.y, (size_t)o.T * o.N * 2, o.x, xb)) return 1;
  while (m < maxm && i + m < n) {
    const gop &q = ops[i + m];
    if (!fits(c, q) || q.x != o.x || q.T != o.T || q.K != o.K) break;
    size_t qb = (size_t)q.T * q.N * 2;
    int bad = overlap(q.y, qb, o.x, xb);
    for (int j = 0; j < m && !bad; j++)
      bad = overlap(q.y, qb, ops[i + j].y, (size_t)ops[i + j].T * ops[i + j].N * 2);
    if (bad) break;
    m++;
  }
  return m;
}

template <int MODE>
static void launch_multi(cuda_ctx *c, const gop *ops, int m, gemv_nf nf) {
  gemv_set s;
  memset(&s, 0, sizeof s);
  bool pk = false;
  for (int i = 0; i < m; i++) {
    pk_view v = gemv_view(c, ops[i].W, ops[i].T);
    s.pk[i] = v.pk;
    s.hd[i] = v.hd;
    pk |= v.pk != NULL;
    gemv_set_add(s, ops[i].W->bf, ops[i].y, ops[i].N);
  }
  int tot = s.n0[GEMV_MULTI];
  unsigned blocks = (unsigned)((tot + GEMV_WARPS - 1) / GEMV_WARPS);
  const bf16 *x = ops[0].x;
  int K = ops[0].K;
  switch (ops[0].T) {
// clang-format off
#define G(n)                                                                                \
  case n:                                                                                   \
    if constexpr (MODE == GEMV_PLAIN || n <= NORM_FOLD_MAXT) {                              \
      if (n <= PK_MAXT && pk)                                                               \
        k_gemv_multi<n, MODE, n <= PK_MAXT><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(x, s, K, nf); \
      else                                                                                  \
        k_gemv_multi<n, MODE, false><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(x, s, K, nf);   \
    }                                                                                       \
    break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
    // clang-format on
  }
  cuda_check_launch(
      c, MODE == GEMV_LATE ? "matmul (fused gemv, norm factor late)" : "matmul (fused gemv)");
}

/* ops[i..i+1] are conv1d and gdn_gates of one layer (the gates' qkv = the conv output): their
 * arguments in *ch (cuda_gdn_conv_gates). */
static int conv_gates_of(const std::vector<gop> &ops, size_t i, cuda_gdn_chain_args *ch) {
  if (i + 1 >= ops.size() || ops[i].kind != GOP_CONV || ops[i + 1].kind != GOP_GATES ||
      ops[i + 1].ch.conv_out != ops[i].ch.conv_out)
    return 0;
  const cuda_gdn_chain_args &gt = ops[i + 1].ch;
  *ch = ops[i].ch;
  ch->b = gt.b;
  ch->a = gt.a;
  ch->beta = gt.beta;
  ch->g = gt.g;
  ch->A_log = gt.A_log;
  ch->dt_bias = gt.dt_bias;
  ch->nk = gt.nk;
  ch->nv = gt.nv;
  ch->dk = gt.dk;
  ch->dv = gt.dv;
  return 1;
}

/* ops[i..i+3] are conv1d, gdn_gates, gdn_decode and gated_rmsnorm of one layer, chained
 * through their buffers (conv output = the gates' and the step's qkv, the gates' beta and g =
 * the step's, the step's output = the norm's input) and of one shape: their arguments in *ch. */
static int gdn_chain_of(const std::vector<gop> &ops, size_t i, cuda_gdn_chain_args *ch) {
  if (i + 3 >= ops.size() || ops[i + 2].kind != GOP_GDN_DEC || ops[i + 3].kind != GOP_GNORM ||
      !conv_gates_of(ops, i, ch))
    return 0;
  const cuda_gdn_chain_args &dc = ops[i + 2].ch, &gn = ops[i + 3].ch;
  if (dc.conv_out != ch->conv_out || dc.beta != ch->beta || dc.g != ch->g || gn.o != dc.o ||
      ch->nk != dc.nk || ch->nv != dc.nv || ch->dk != dc.dk || ch->dv != dc.dv || gn.nv != dc.nv ||
      gn.dv != dc.dv)
    return 0;
  ch->ssm = dc.ssm;
  ch->o = dc.o;
  ch->z = gn.z;
  ch->out = gn.out;
  ch->norm = gn.norm;
  ch->T = gn.T;
  ch->eps = gn.eps;
  return 1;
}

template <int MODE>
static void launch_glu(cuda_ctx *c, const gop &g, const gop &u, const gop &sw, gemv_nf nf) {
  unsigned blocks = (unsigned)((g.N + GEMV_WARPS - 1) / GEMV_WARPS);
  pk_view vg = gemv_view(c, g.W, g.T), vu = gemv_view(c, u.W, g.T);
  switch (g.T) {
// clang-format off
#define G(n)                                                                                   \
  case n:                                                                                      \
    if constexpr (MODE == GEMV_PLAIN || n <= NORM_FOLD_MAXT) {                                 \
      if (n <= PK_MAXT && vg.pk && vu.pk)                                                      \
        k_gemv_glu<n, MODE, n <= PK_MAXT><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(              \
            g.x, vg, vu, g.K, g.N, g.y, u.y, sw.out, nf);                                      \
      else                                                                                     \
        k_gemv_glu<n, MODE, false><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(                     \
            g.x, vg, vu, g.K, g.N, g.y, u.y, sw.out, nf);                                      \
    }                                                                                          \
    break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
    // clang-format on
  }
  cuda_check_launch(c, MODE == GEMV_LATE ? "matmul (fused gate/up/swiglu, norm factor late)"
                                         : "matmul (fused gate/up/swiglu)");
}

/* 1 when ops[i..i+2] are gate and up products of one x on the GEMV path and swiglu(gate, up)
 * into outputs launch_glu may write (none over x; out may alias gate or up). */
static int glu_at(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  if (i + 2 >= ops.size()) return 0;
  const gop &o = ops[i], &u = ops[i + 1], &sw = ops[i + 2];
  if (!gemv_fits(c, o) || !gemv_fits(c, u) || sw.kind != GOP_SWIGLU || u.x != o.x || u.T != o.T ||
      u.K != o.K || u.N != o.N || sw.gate != o.y || sw.up != u.y || sw.n != (size_t)o.T * o.N)
    return 0;
  size_t xb = (size_t)o.T * o.K * 2, yb = (size_t)o.T * o.N * 2;
  return !overlap(o.y, yb, o.x, xb) && !overlap(u.y, yb, o.x, xb) && !overlap(o.y, yb, u.y, yb) &&
         !overlap(sw.out, yb, o.x, xb) &&
         (sw.out == o.y || sw.out == u.y ||
          (!overlap(sw.out, yb, o.y, yb) && !overlap(sw.out, yb, u.y, yb)));
}

/* ---- the rmsnorm off the products' critical path ----
 * In a recorded step of <= NORM_FOLD_MAXT rows on the GEMV path,
 *   [product P -> mix] [rmsnorm(x += mix; w) -> xn] [products of xn: gate/up/swiglu, or up to
 *   GEMV_MULTI products]
 * runs as
 *   [P, whose epilogue also does x += its output (k_rmsnorm8's expression) and writes
 *    xn = x * (1 + w) in bf16, the norm without its factor]
 *   [the factor kernel: inv[t] = rsqrt(mean(x[t]^2) + eps), k_rmsnorm8's sums]
 *   [the products of xn, GEMV_LATE: launched as the factor kernel starts, streaming their
 *    weights while it runs, waiting for it only before scaling their sums by inv[t]]
 * so a norm no longer stands between two products (~2 µs each of a one-sequence step inside
 * the pipelined graph, bench/NOTES.md thirteenth session). Not bit-identical to the ops as
 * issued (the factor is applied to the sums, not to xn before its bf16 rounding), so off under
 * --batch-invariant (a row's bits would depend on its step taking this path) and with
 * DS_NORM_FOLD=0. xn holds the unscaled values afterwards: the fold needs no later op to name
 * an address inside xn before the next norm writes it (checked on the recorded arguments). The
 * products read xn, written by P, before their wait: P finished before the factor kernel's wait
 * returned, and they are launched only after that. */
struct norm_fold {
  int glu; /* the products after the norm are gate, up, swiglu */
  int m;   /* ops after the norm taken by the fold */
};

/* 1 when the recorded arguments of ops[k] hold a pointer into [p, p + nb). */
static int op_names(const cuda_graphs *g, const std::vector<gop> &ops, size_t k, const void *p,
                    size_t nb) {
  size_t a = ops[k].arg, e = k + 1 < ops.size() ? ops[k + 1].arg : g->args.size();
  for (; a + 8 <= e; a += 8) { /* the argument tuple starts 16-aligned; pointers are 8-aligned */
    uintptr_t v;
    memcpy(&v, g->args.data() + a, 8);
    if (v >= (uintptr_t)p && v < (uintptr_t)p + nb) return 1;
  }
  return 0;
}

/* 1 when the norm ops[j] folds (see above), with its products in *nf; asked at the product
 * before it, which then takes the residual add and writes xn. */
static int norm_fold_at(cuda_ctx *c, const std::vector<gop> &ops, size_t j, norm_fold *nf) {
  const cuda_graphs *g = c->gr;
  size_t n = ops.size();
  if (!g->fuse || !c->norm_fold || !c->fold_inv || c->batch_invariant || j == 0 || j + 1 >= n ||
      ops[j].kind != GOP_RMSNORM)
    return 0;
  const gop_norm &r = ops[j].nm;
  size_t xb = (size_t)r.T * r.n * 2;
  if (!r.w || !r.add || r.T < 1 || r.T > NORM_FOLD_MAXT || r.n % 8 || r.n > 8192 ||
      (((uintptr_t)r.x | (uintptr_t)r.y | (uintptr_t)r.w) & 15) || overlap(r.x, xb, r.y, xb) ||
      overlap(r.add, xb, r.y, xb))
    return 0;
  const gop &p = ops[j - 1]; /* the product before takes x += add and writes xn */
  if (!gemv_fits(c, p) || p.y != r.add || p.T != r.T || p.N != r.n ||
      overlap(p.x, (size_t)p.T * p.K * 2, r.x, xb) ||
      overlap(p.x, (size_t)p.T * p.K * 2, r.y, xb) || overlap(p.y, xb, r.x, xb))
    return 0;
  const gop &q = ops[j + 1];
  if (!gemv_fits(c, q) || q.x != r.y || q.T != r.T || q.K != r.n) return 0;
  if (glu_at(c, ops, j + 1)) {
    nf->glu = 1;
    nf->m = 3;
  } else {
    nf->glu = 0;
    nf->m = same_x_run(c, ops, j + 1, GEMV_MULTI, gemv_fits);
  }
  for (int k = 0; k < nf->m; k++) { /* nothing the factor kernel reads is written meanwhile */
    const gop &o = ops[j + 1 + k];
    if (o.kind == GOP_MATMUL && overlap(o.y, (size_t)o.T * o.N * 2, r.x, xb)) return 0;
    if (o.kind == GOP_SWIGLU && overlap(o.out, o.n * 2, r.x, xb)) return 0;
  }
  for (size_t k = j + 1 + nf->m; k < n; k++) { /* xn's readers, up to its next writer */
    const gop &o = ops[k];
    if (o.kind == GOP_RMSNORM && o.nm.y == r.y && o.nm.T == r.T && o.nm.n == r.n &&
        !overlap(o.nm.x, xb, r.y, xb) && !(o.nm.add && overlap(o.nm.add, xb, r.y, xb)))
      break;
    if (op_names(g, ops, k, r.y, xb)) return 0;
  }
  return 1;
}

/* Runs the recorded list in order, with the rewrites. */
static void graph_run_ops(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  std::vector<gop> &ops = g->ops;
  size_t n = ops.size();
  size_t folded = SIZE_MAX; /* the norm whose product before took its residual add */
  norm_fold nf;             /* ... and its products (norm_fold_at) */
  for (size_t i = 0; i < n;) {
    const gop &o = ops[i];
    cuda_gdn_chain_args ch;
    if (o.kind == GOP_MATMUL && i + 1 < n && ops[i + 1].kind == GOP_RMSNORM &&
        norm_fold_at(c, ops, i + 1, &nf)) { /* the product before a folded norm */
      const gop_norm &r = ops[i + 1].nm;
      gemv_nf p = {r.w, r.x, r.y, NULL};
      gemv_mode<GEMV_RES>(c, o.x, gemv_view(c, o.W, o.T), o.T, o.K, o.N, o.y, p);
      folded = i + 1;
      i++;
      continue;
    }
    if (i == folded) { /* the folded norm: its factor kernel, then its products */
      const gop_norm &r = o.nm;
      cuda_elem_rmsnorm_inv(c, r.x, r.T, r.n, r.eps, c->fold_inv);
      gemv_nf p = {NULL, NULL, NULL, c->fold_inv};
      const gop *q = &ops[i + 1];
      if (nf.glu)
        launch_glu<GEMV_LATE>(c, q[0], q[1], q[2], p);
      else if (nf.m > 1)
        launch_multi<GEMV_LATE>(c, q, nf.m, p);
      else
        gemv_mode<GEMV_LATE>(c, q[0].x, gemv_view(c, q[0].W, q[0].T), q[0].T, q[0].K, q[0].N,
                             q[0].y, p);
      g->fused += nf.glu ? 2 : nf.m - 1;
      g->norm_folds++;
      i += 1 + nf.m;
      continue;
    }
    if (g->fuse && o.kind == GOP_CONV && gdn_chain_of(ops, i, &ch) && cuda_gdn_chain(c, &ch)) {
      g->fused += 3;
      i += 4;
      continue;
    }
    if (g->fuse && o.kind == GOP_CONV && conv_gates_of(ops, i, &ch) &&
        cuda_gdn_conv_gates(c, &ch)) {
      g->fused += 1;
      i += 2;
      continue;
    }
    if (g->fuse && o.kind == GOP_ATTN && i + 1 < n && ops[i + 1].kind == GOP_SIGMUL) {
      /* attention, then its output gate: the gate in the merge kernel */
      const gop_attn &a = o.at;
      const gop &sm = ops[i + 1];
      size_t on = (size_t)c->b.n_tokens * a.nh * a.hd;
      if (sm.out == a.out && sm.n == on && !overlap(sm.gate, on * 2, a.out, on * 2)) {
        cuda_attn_attention_gated(g->be, a.k_pool, a.v_pool, a.q, a.k, a.v, a.nh, a.nkv, a.hd,
                                  a.scale, (backend_buf)sm.gate, a.out);
        g->fused += 1;
        i += 2;
        continue;
      }
    }
    if (g->fuse && gemv_fits(c, o)) {
      gemv_nf plain = {NULL, NULL, NULL, NULL};
      if (glu_at(c, ops, i)) { /* gate, up, swiglu(gate, up) */
        launch_glu<GEMV_PLAIN>(c, o, ops[i + 1], ops[i + 2], plain);
        g->fused += 2;
        i += 3;
        continue;
      }
      /* consecutive products of one x into distinct outputs */
      int m = same_x_run(c, ops, i, GEMV_MULTI, gemv_fits);
      if (m > 1) {
        launch_multi<GEMV_PLAIN>(c, &ops[i], m, plain);
        g->fused += m - 1;
        i += m;
        continue;
      }
    }
    if (g->fuse && sgemm_fits(c, o)) { /* the same on the skinny-GEMM path */
      int m = same_x_run(c, ops, i, SG_MULTI, sgemm_fits);
      const bf16 *W[SG_MULTI];
      void *y[SG_MULTI];
      int N[SG_MULTI];
      for (int j = 0; j < m; j++) {
        W[j] = ops[i + j].W->bf;
        y[j] = ops[i + j].y;
        N[j] = ops[i + j].N;
      }
      if (m > 1 && cuda_sgemm(c, o.x, o.T, o.K, m, W, y, N, 0)) {
        g->fused += m - 1;
        i += m;
        continue;
      }
    }
    if (g->fuse && narrow_fits(c, o)) { /* narrow products of one x (b, a) */
      int m = same_x_run(c, ops, i, GEMV_MULTI, narrow_fits);
      if (m > 1) {
        const bf16 *W[GEMV_MULTI];
        bf16 *y[GEMV_MULTI];
        int N[GEMV_MULTI];
        for (int j = 0; j < m; j++) {
          W[j] = ops[i + j].W->bf;
          y[j] = ops[i + j].y;
          N[j] = ops[i + j].N;
        }
        launch_narrow(c, o.x, o.T, o.K, m, W, y, N);
        g->fused += m - 1;
        i += m;
        continue;
      }
    }
    rec_run(g, o);
    i++;
  }
}

/* 1 when graph node `nd` is a kernel of ours (noted at its launch; every one begins with
 * pdl_enter, see cuda_common.cuh); library kernels (cuBLAS) and other nodes are not. */
static int pdl_node_ours(const cuda_graphs *g, cudaGraphNode_t nd) {
  cudaGraphNodeType t;
  return g->ours.count(nd) && cudaGraphNodeGetType(nd, &t) == cudaSuccess &&
         t == cudaGraphNodeTypeKernel;
}

/* Programmatic dependent launch. A decode step is ~300 kernels in a row, most of them a few
 * microseconds long, and each waits for the one before to drain before it is even launched.
 * Here every edge from a kernel into a kernel of ours becomes a programmatic edge: the next
 * kernel is launched as soon as every block of the previous one has passed its pdl_enter, and
 * its own blocks wait in their pdl_enter until the previous kernel has finished and its writes
 * are visible — the same order and the same bits, without the launch gap. Since every block of
 * ours waits before it exits, a kernel of ours never completes before the one before it, so
 * ordinary edges further on keep their meaning. Returns the edges changed (0: none or the
 * graph's API failed, the graph unchanged or fully ordered either way). */
static long graph_pdl(const cuda_graphs *g, cudaGraph_t graph) {
  size_t n = 0;
  if (cudaGraphGetEdges(graph, NULL, NULL, NULL, &n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return 0;
  }
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> ed(n);
  if (cudaGraphGetEdges(graph, from.data(), to.data(), ed.data(), &n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  long changed = 0;
  for (size_t i = 0; i < n; i++) {
    if (ed[i].type != cudaGraphDependencyTypeDefault || ed[i].from_port != 0) continue;
    cudaGraphNodeType ft;
    if (!pdl_node_ours(g, to[i]) || cudaGraphNodeGetType(from[i], &ft) != cudaSuccess ||
        ft != cudaGraphNodeTypeKernel)
      continue;
    cudaGraphEdgeData pe;
    memset(&pe, 0, sizeof pe);
    pe.from_port = cudaGraphKernelNodePortProgrammatic;
    pe.type = cudaGraphDependencyTypeProgrammatic;
    if (cudaGraphRemoveDependencies(graph, &from[i], &to[i], &ed[i], 1) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (cudaGraphAddDependencies(graph, &from[i], &to[i], &pe, 1) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphAddDependencies(graph, &from[i], &to[i], &ed[i], 1); /* as it was */
      continue;
    }
    changed++;
  }
  return changed;
}

/* Captures the recorded run into a graph and launches it; 0 when capture is not possible (the
 * caller then runs the list directly). */
static int graph_capture(cuda_ctx *c, uint64_t h) {
  cuda_graphs *g = c->gr;
  if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    g->bad_sig = g->sig;
    return 0;
  }
  c->capturing = 1;
  c->capture_broken = 0;
  g->ours.clear();
  cuda_ktrace_capture_begin(c);
  graph_run_ops(c);
  c->capturing = 0;
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(c->st, &graph);
  if (e != cudaSuccess || c->failed || c->capture_broken || !graph) {
    /* a failure inside the capture is the capture's, not the step's: the direct run that
     * follows reports real ones */
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    c->failed = 0;
    c->err[0] = 0;
    c->capture_broken = 0;
    g->bad_sig = g->sig;
    return 0;
  }
  long pdl = g->pdl ? graph_pdl(g, graph) : 0;
  g->ours.clear();
  cudaGraphExec_t exec = NULL;
  e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (pdl)
      g->pdl = 0; /* the next capture goes without the programmatic edges */
    else
      g->bad_sig = g->sig;
    return 0;
  }
  g->pdl_edges += pdl;
  cuda_ktrace_capture_end(c, exec);
  if (cudaGraphLaunch(exec, c->st) != cudaSuccess) {
    cudaGetLastError();
    cudaGraphExecDestroy(exec);
    g->bad_sig = g->sig;
    return 0;
  }
  if (g->cache.size() >= GRAPH_CACHE) {
    size_t lru = 0;
    for (size_t i = 1; i < g->cache.size(); i++)
      if (g->cache[i].used < g->cache[lru].used) lru = i;
    cudaGraphExecDestroy(g->cache[lru].exec);
    g->cache.erase(g->cache.begin() + (long)lru);
  }
  graph_entry en;
  en.sig = g->sig;
  en.h = h;
  en.scratch = c->scratch;
  en.exec = exec;
  en.used = ++g->tick;
  en.uid = ++g->uids;
  g->rep_uid = en.uid;
  g->rep_layout.assign(g->sig.begin(), g->sig.begin() + (long)g->layout_len);
  g->cache.push_back(std::move(en));
  g->captures++;
  return 1;
}

/* Launches a cached graph for the recorded step (its replay); 0 when the launch failed. */
static int graph_replay(cuda_ctx *c, graph_entry &e) {
  cuda_graphs *g = c->gr;
  cuda_ktrace_replay(c, e.exec);
  graph_time(g);
  double tl = g->timing ? now_ms() : 0;
  if (g->timing) cudaEventRecord(g->ev[0], c->st);
  if (cudaGraphLaunch(e.exec, c->st) != cudaSuccess) {
    cudaGetLastError();
    g->timed_pending = 0;
    return 0;
  }
  e.used = ++g->tick;
  g->replays++;
  if (g->timing) {
    g->timed_pending = cudaEventRecord(g->ev[1], c->st) == cudaSuccess;
    if (g->t_ready > 0 && g->t_begin >= g->t_ready) {
      g->engine_ms.push_back((float)(g->t_begin - g->t_ready));
      g->record_ms.push_back((float)(tl - g->t_begin));
      g->launch_ms.push_back((float)(now_ms() - tl));
    }
  }
  return 1;
}

/* A step_repeat step: the graph of the step before, launched again. Its ops were never
 * issued, so a failed launch fails the step. */
static void graph_repeat(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  g->rep_pending = 0;
  if (!g->ops.empty()) {
    cuda_fail(c, "step_repeat", "ops issued in a step the backend repeats");
    return;
  }
  for (auto &e : g->cache)
    if (e.uid == g->rep_uid) {
      if (graph_replay(c, e))
        g->repeats++;
      else
        cuda_fail(c, "step_repeat", "graph launch failed");
      return;
    }
  cuda_fail(c, "step_repeat", "the step's graph is gone");
}

/* Runs what was recorded (see above). */
static void graph_flush(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (!g || !g->rec) return;
  g->rec = 0;
  if (g->rep_pending && !c->failed) {
    graph_repeat(c);
    g->ops.clear();
    g->args.clear();
    g->sig.clear();
    return;
  }
  g->rep_pending = 0;
  g->rep_uid = 0;
  if (g->ops.empty() || c->failed) {
    g->ops.clear();
    g->args.clear();
    return;
  }
  uint64_t h = sig_hash(g->sig);
  int done = 0;
  if (g->use_graphs) {
    for (auto &e : g->cache) {
      if (e.h != h || e.scratch != c->scratch || e.sig != g->sig) continue;
      done = graph_replay(c, e);
      if (done) {
        g->rep_uid = e.uid;
        g->rep_layout.assign(g->sig.begin(), g->sig.begin() + (long)g->layout_len);
      }
      break;
    }
    if (!done && g->sig == g->last_sig && g->sig != g->bad_sig) done = graph_capture(c, h);
  }
  if (!done) {
    graph_run_ops(c);
    g->direct++;
    g->last_sig.swap(g->sig);
  }
  g->ops.clear();
  g->args.clear();
  g->sig.clear();
}

/* An op that cannot be recorded (it synchronises or allocates): what was recorded runs now
 * and the rest of the step runs as issued. */
static void graph_stop(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (!g || !g->rec) return;
  int saved_use = g->use_graphs;
  g->use_graphs = 0;
  graph_flush(c);
  g->use_graphs = saved_use;
}

/* ---- the op table's entries (recorded in decode steps, else launched as issued) ---- */

static void w_embed(backend *be, backend_weight E, int H, backend_buf out) {
  if (!rec_op(be, 1, cuda_elem_embed, E, H, out)) cuda_elem_embed(be, E, H, out);
}
static void w_rmsnorm(backend *be, backend_buf x, backend_buf add, backend_weight w, int T, int n,
                      float eps, backend_buf y) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_elem_rmsnorm(be, x, add, w, T, n, eps, y);
    return;
  }
  sig_put(g->sig, 2, x, add, w, T, n, eps, y);
  gop &o = rec_call(g, cuda_elem_rmsnorm, x, add, w, T, n, eps, y);
  o.kind = GOP_RMSNORM;
  o.nm = {(bf16 *)x, (const bf16 *)add, CW(w)->f32, T, n, eps, (bf16 *)y};
}
static void w_add(backend *be, backend_buf x, backend_buf y, size_t n) {
  if (!rec_op(be, 3, cuda_elem_add, x, y, n)) cuda_elem_add(be, x, y, n);
}
static void w_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                     backend_buf y) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cu_matmul(be, x, W, T, K, N, y);
    return;
  }
  sig_put(g->sig, 4, x, W, T, K, N, y);
  gop &o = rec_call(g, cu_matmul, x, W, T, K, N, y);
  o.kind = GOP_MATMUL;
  o.x = (const bf16 *)x;
  o.W = CW(W);
  o.T = T;
  o.K = K;
  o.N = N;
  o.y = (bf16 *)y;
}
static void w_qk_norm_rope(backend *be, backend_buf qg, backend_buf k, backend_weight q_norm,
                           backend_weight k_norm, int nh, int nkv, int hd, int rot, double theta,
                           float eps, backend_buf q_out, backend_buf gate_out) {
  if (!rec_op(be, 5, cuda_elem_qk_norm_rope, qg, k, q_norm, k_norm, nh, nkv, hd, rot, theta, eps,
              q_out, gate_out))
    cuda_elem_qk_norm_rope(be, qg, k, q_norm, k_norm, nh, nkv, hd, rot, theta, eps, q_out,
                           gate_out);
}
static void w_attention(backend *be, backend_buf k_pool, backend_buf v_pool, backend_buf q,
                        backend_buf k, backend_buf v, int nh, int nkv, int hd, float scale,
                        backend_buf out) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_attn_attention(be, k_pool, v_pool, q, k, v, nh, nkv, hd, scale, out);
    return;
  }
  sig_put(g->sig, 6, k_pool, v_pool, q, k, v, nh, nkv, hd, scale, out);
  gop &o = rec_call(g, cuda_attn_attention, k_pool, v_pool, q, k, v, nh, nkv, hd, scale, out);
  o.kind = GOP_ATTN;
  o.at = {k_pool, v_pool, q, k, v, nh, nkv, hd, scale, out};
}
static void w_sigmoid_mul(backend *be, backend_buf x, backend_buf gate, size_t n) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_elem_sigmoid_mul(be, x, gate, n);
    return;
  }
  sig_put(g->sig, 7, x, gate, n);
  gop &o = rec_call(g, cuda_elem_sigmoid_mul, x, gate, n);
  o.kind = GOP_SIGMUL;
  o.out = (bf16 *)x;
  o.gate = (const bf16 *)gate;
  o.n = n;
}
static void w_swiglu(backend *be, backend_buf gate, backend_buf up, size_t n, backend_buf out) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_elem_swiglu(be, gate, up, n, out);
    return;
  }
  sig_put(g->sig, 8, gate, up, n, out);
  gop &o = rec_call(g, cuda_elem_swiglu, gate, up, n, out);
  o.kind = GOP_SWIGLU;
  o.gate = (const bf16 *)gate;
  o.up = (const bf16 *)up;
  o.n = n;
  o.out = (bf16 *)out;
}
static void w_moe(backend *be, backend_buf x, const backend_moe *m, int T, int H, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  /* the per-row and device-grouped paths are plain launches; the cuBLAS-grouped one reads the
   * group sizes back (the recorded ops run first, the rest of the step as issued) */
  if (cuda_moe_records(c, m, T, H) && rec_op(be, 18, cuda_moe_moe, x, m, T, H, out)) return;
  graph_stop(c);
  cuda_moe_moe(be, x, m, T, H, out);
}
static void w_conv1d(backend *be, backend_buf conv_state, backend_buf x, backend_weight w, int C,
                     int K, backend_buf out) {
  if (!rec_op(be, 9, cuda_gdn_conv1d, conv_state, x, w, C, K, out)) {
    cuda_gdn_conv1d(be, conv_state, x, w, C, K, out);
    return;
  }
  gop &o = cuda_ctx_of(be)->gr->ops.back();
  o.kind = GOP_CONV;
  o.ch.conv_state = conv_state;
  o.ch.x = x;
  o.ch.conv_w = w;
  o.ch.C = C;
  o.ch.K = K;
  o.ch.conv_out = out;
}
static void w_gdn_gates(backend *be, backend_buf qkv, backend_buf b, backend_buf a,
                        backend_weight A_log, backend_weight dt_bias, int nk, int nv, int dk,
                        int dv, backend_buf beta, backend_buf g) {
  if (!rec_op(be, 10, cuda_elem_gdn_gates, qkv, b, a, A_log, dt_bias, nk, nv, dk, dv, beta, g)) {
    cuda_elem_gdn_gates(be, qkv, b, a, A_log, dt_bias, nk, nv, dk, dv, beta, g);
    return;
  }
  gop &o = cuda_ctx_of(be)->gr->ops.back();
  o.kind = GOP_GATES;
  o.ch.conv_out = qkv;
  o.ch.b = b;
  o.ch.a = a;
  o.ch.A_log = A_log;
  o.ch.dt_bias = dt_bias;
  o.ch.nk = nk;
  o.ch.nv = nv;
  o.ch.dk = dk;
  o.ch.dv = dv;
  o.ch.beta = beta;
  o.ch.g = g;
}
static void w_gdn_prefill(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                          backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  if (!rec_op(be, 11, cuda_gdn_prefill, ssm, qkv, beta, g, nk, nv, dk, dv, out))
    cuda_gdn_prefill(be, ssm, qkv, beta, g, nk, nv, dk, dv, out);
}
static void w_gdn_decode(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                         backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  if (!rec_op(be, 12, cuda_gdn_decode, ssm, qkv, beta, g, nk, nv, dk, dv, out)) {
    cuda_gdn_decode(be, ssm, qkv, beta, g, nk, nv, dk, dv, out);
    return;
  }
  gop &o = cuda_ctx_of(be)->gr->ops.back();
  o.kind = GOP_GDN_DEC;
  o.ch.ssm = ssm;
  o.ch.conv_out = qkv;
  o.ch.beta = beta;
  o.ch.g = g;
  o.ch.nk = nk;
  o.ch.nv = nv;
  o.ch.dk = dk;
  o.ch.dv = dv;
  o.ch.o = out;
}
static void w_gated_rmsnorm(backend *be, backend_buf o, backend_buf z, backend_weight w, int T,
                            int nv, int dv, float eps, backend_buf out) {
  if (!rec_op(be, 13, cuda_elem_gated_rmsnorm, o, z, w, T, nv, dv, eps, out)) {
    cuda_elem_gated_rmsnorm(be, o, z, w, T, nv, dv, eps, out);
    return;
  }
  gop &r = cuda_ctx_of(be)->gr->ops.back();
  r.kind = GOP_GNORM;
  r.ch.o = o;
  r.ch.z = z;
  r.ch.norm = w;
  r.ch.T = T;
  r.ch.nv = nv;
  r.ch.dv = dv;
  r.ch.eps = eps;
  r.ch.out = out;
}
static void w_logits(backend *be, backend_buf x, backend_weight norm, float eps, backend_weight W,
                     int H, int V, backend_buf out) {
  if (!rec_op(be, 14, cu_logits, x, norm, eps, W, H, V, out))
    cu_logits(be, x, norm, eps, W, H, V, out);
}
static void w_argmax(backend *be, backend_buf x, int n, int V, backend_buf ids, backend_buf maxv) {
  if (!rec_op(be, 15, cu_argmax, x, n, V, ids, maxv)) cu_argmax(be, x, n, V, ids, maxv);
}
static void w_logits_argmax(backend *be, backend_buf x, backend_weight norm, float eps,
                            backend_weight W, int H, int V, backend_buf logits, backend_buf ids) {
  if (!rec_op(be, 16, cu_logits_argmax, x, norm, eps, W, H, V, logits, ids))
    cu_logits_argmax(be, x, norm, eps, W, H, V, logits, ids);
}
static void w_sample(backend *be, backend_buf x, int n, int V, backend_buf params,
                     backend_buf ids) {
  if (!rec_op(be, 17, cuda_sample_sample, x, n, V, params, ids))
    cuda_sample_sample(be, x, n, V, params, ids);
}
static int cu_logits_argmax_prepare(backend *be, backend_weight W, int H, int V, char *err,
                                    size_t errlen) {
  cuda_ctx *c = cuda_ctx_of(be);
  graph_flush(c);
  return cuda_greedy_prepare(be, W, H, V, err, errlen);
}

/* Counters of the decode-step recorder (see backend_cuda.h). */
extern "C" long backend_cuda_norm_folds(backend *be) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  return g ? g->norm_folds : 0;
}

extern "C" void backend_cuda_graph_stats(backend *be, long out[6]) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  out[5] = g ? g->repeats : 0;
  out[4] = g ? g->pdl_edges : 0;
  out[0] = g ? g->captures : 0;
  out[1] = g ? g->replays : 0;
  out[2] = g ? g->direct : 0;
  out[3] = g ? g->fused : 0;
}

extern "C" long backend_cuda_moe_dev_runs(backend *be) { return cuda_ctx_of(be)->moe_dev_runs; }

extern "C" void backend_cuda_attn_launches(backend *be, long out[2]) {
  out[0] = cuda_ctx_of(be)->attn_sub_launches;
  out[1] = cuda_ctx_of(be)->attn_tc_launches;
}

/* Device memory now (the engine's pool sizing, engine_mem_plan_device). */
static int cu_mem_info(backend *be, size_t *free_bytes, size_t *total_bytes) {
  cudaSetDevice(cuda_ctx_of(be)->device);
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}

/* ---- lifetime ---- */

static void cu_destroy(backend *be) {
  if (!be) return;
  cuda_ctx *c = cuda_ctx_of(be);
  if (c) {
    graph_flush(c);
    if (c->st) cudaStreamSynchronize(c->st);
    cuda_ktrace_release(c);
    graph_clear(c);
    graph_time_report(c->gr);
    delete c->gr;
    c->gr = NULL;
    cuda_moe_release(c);
    cuda_sgemm_release(c);
    cuda_gdn_chain_release(c);
    cuda_greedy_forget(c, NULL);
    cudaFree(c->am_v);
    cudaFree(c->am_i);
    cudaFree(c->am_cnt);
    cudaFree(c->fold_inv);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->scratch);
    cudaFree(c->rope_tab);
    cudaFreeHost(c->h_meta);
    cudaFree(c->d_meta);
    free(c->h_host);
    if (c->meta_done) cudaEventDestroy(c->meta_done);
    free(c->sh_scratch);
    for (int i = 0; i < BACKEND_READS; i++)
      if (c->rd_ev[i]) cudaEventDestroy(c->rd_ev[i]);
    if (c->st) cudaStreamDestroy(c->st);
    free(c);
  }
  free(be);
}

extern "C" int backend_cuda_available(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n > 0;
}

extern "C" backend *backend_cuda_create(int device, const backend_options *opt, char *err,
                                        size_t errlen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    if (err && errlen)
      snprintf(err, errlen, "--device cuda: no CUDA device (%s)",
               e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    cudaGetLastError();
    return NULL;
  }
  if (device < 0 || device >= n) {
    if (err && errlen)
      snprintf(err, errlen, "--device cuda: no CUDA device %d (%d present)", device, n);
    return NULL;
  }
  backend *be = (backend *)calloc(1, sizeof *be);
  cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
  if (!be || !c) {
    free(be);
    free(c);
    if (err && errlen) snprintf(err, errlen, "cannot create the CUDA backend (out of memory)");
    return NULL;
  }
  be->ctx = c;
  c->device = device;
  const char *why = NULL;
  if (cudaSetDevice(device) != cudaSuccess)
    why = "cudaSetDevice failed";
  else if (cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking) != cudaSuccess)
    why = "cannot create a stream";
  else if (cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming) != cudaSuccess)
    why = "cannot create an event";
  for (int i = 0; i < BACKEND_READS && !why; i++)
    if (cudaEventCreateWithFlags(&c->rd_ev[i], cudaEventDisableTiming) != cudaSuccess)
      why = "cannot create an event";
  if (why) {
  } else if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS)
    why = "cuBLAS initialisation failed";
  else if (cublasSetStream(c->blas, c->st) != CUBLAS_STATUS_SUCCESS)
    why = "cuBLAS stream";
  else {
    c->blas_ws_bytes = 32u << 20;
    if (cudaMalloc(&c->blas_ws, c->blas_ws_bytes) != cudaSuccess ||
        cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes) != CUBLAS_STATUS_SUCCESS)
      why = "cuBLAS workspace";
  }
  if (!why && !cuda_scratch(c, 64u << 20)) why = "out of device memory for scratch";
  if (!why && cudaMalloc(&c->rope_tab, CUDA_ROPE_TAB * sizeof(float)) != cudaSuccess)
    why = "out of device memory for the rotary table";
  c->rope_rot = -1;
  if (!why && cuda_sgemm_init(c)) why = "out of device memory for the GEMM workspace";
  if (!why && cuda_gdn_chain_init(c)) why = "out of device memory for the decode-chain counters";
  if (!why && cuda_moe_init(c)) why = "out of device memory for the MoE router counters";
  if (!why && (cudaMalloc(&c->am_v, ARGMAX_PARTS * sizeof(float)) != cudaSuccess ||
               cudaMalloc(&c->am_i, ARGMAX_PARTS * sizeof(int)) != cudaSuccess ||
               cuda_zeroed_ints(&c->am_cnt, ARGMAX_PARTS)))
    why = "out of device memory for the argmax partials";
  if (!why && cudaMalloc(&c->fold_inv, NORM_FOLD_MAXT * sizeof(float)) != cudaSuccess)
    why = "out of device memory for the norm factors";
  if (!why && cuda_ktrace_init(c)) why = "out of device memory for the kernel trace";
  if (why) {
    cudaGetLastError();
    if (err && errlen) snprintf(err, errlen, "cannot create the CUDA backend: %s", why);
    cu_destroy(be);
    return NULL;
  }
  cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
  {
    const char *lg = getenv("DS_CUDA_LEGACY");
    c->batch_invariant = opt && opt->batch_invariant;
    const char *ag = getenv("DS_ATTN_GEMM"), *ar = getenv("DS_ATTN_GEMM_ROWS");
    c->attn_gemm_off = ag && strcmp(ag, "0") == 0;
    c->attn_gemm_rows = ar ? atoi(ar) : 0;
    const char *af = getenv("DS_ATTN_FLASH"); /* on unless "0" (bench/NOTES.md) */
    c->attn_flash = !(af && strcmp(af, "0") == 0);
    /* decode rows sharing KV pages: on unless "0"; groups sharing at least this many
     * positions (bench/NOTES.md twenty-second session) */
    const char *ash = getenv("DS_ATTN_SHARED"), *asm_ = getenv("DS_ATTN_SHARED_MIN");
    c->attn_shared = !(ash && strcmp(ash, "0") == 0);
    c->attn_shared_min = asm_ ? atoi(asm_) : 256;
    if (c->attn_shared_min < 1) c->attn_shared_min = 1;
    const char *asg = getenv("DS_ATTN_SUBGROUPS"); /* on unless "0" */
    c->attn_subgroups = !(asg && strcmp(asg, "0") == 0);
    const char *atc = getenv("DS_ATTN_TC"), *atm = getenv("DS_ATTN_TC_MIN_T");
    /* off unless "1": it lost to the lane kernel at 8-128 rows (bench/NOTES.md,
     * twenty-fourth session) */
    c->attn_tc = atc && strcmp(atc, "1") == 0;
    c->attn_tc_min_t = atm ? atoi(atm) : 3;
    if (c->attn_tc_min_t < 1) c->attn_tc_min_t = 1;
    /* GEMV path tuning knob (timed in bench/NOTES.md): rows of the step up to which the GEMV
     * path is taken (1..8) */
    const char *gm = getenv("DS_GEMV_MAXT");
    /* batch-invariant: cuBLAS never runs, and the GEMV path (fused, streaming loads) gives
     * the same bits as the batch-invariant kernel up to 8 rows */
    c->gemv_maxt = gm ? atoi(gm) : c->batch_invariant ? GEMV_MAXT : GEMV_MAXT_DEFAULT;
    if (c->gemv_maxt < 0 || c->gemv_maxt > GEMV_MAXT) c->gemv_maxt = GEMV_MAXT;
    /* skinny GEMMs up to this many rows (cuda_sgemm.cu, at most 16, where they beat cuBLAS
     * on the H200; 0: cuBLAS above the GEMV path) */
    const char *sm = getenv("DS_SGEMM_MAXT");
    c->sgemm_maxt = sm ? atoi(sm) : 16;
    /* the packed copies are read by products of up to this many rows (DS_PACKED=N, at most
     * PK_MAXT; 0: never; 1 by default: at 2 rows they gain nothing, at 4 they lose 3.7 %,
     * bench/NOTES.md thirty-third session) */
    const char *pku = getenv("DS_PACKED");
    c->packed = pku ? atoi(pku) : 1;
    if (c->packed < 0 || c->packed > PK_MAXT) c->packed = PK_MAXT;
    const char *nw = getenv("DS_NARROW"); /* narrow-product kernel, on unless "0" */
    c->narrow = !(nw && strcmp(nw, "0") == 0);
    const char *nfo = getenv("DS_NORM_FOLD"); /* on unless "0" (bench/NOTES.md) */
    c->norm_fold = !(nfo && strcmp(nfo, "0") == 0);
    const char *gc = getenv("DS_GDN_CHAIN"); /* the DeltaNet decode chain kernel, on unless "0" */
    c->gdn_chain = !(gc && strcmp(gc, "0") == 0);
    const char *mg = getenv("DS_MOE_GROUPED"); /* on unless "0" */
    c->moe_grouped = !(mg && strcmp(mg, "0") == 0);
    /* the device-side grouped path for decode-sized steps (bench/NOTES.md twenty-fourth
     * session); DS_MOE_DEV_MAX=0: every grouped step through the per-expert cuBLAS GEMMs */
    const char *mdn = getenv("DS_MOE_DEV_MIN"), *mdx = getenv("DS_MOE_DEV_MAX");
    c->moe_dev_min = mdn ? atoi(mdn) : 8;
    c->moe_dev_max = mdx ? atoi(mdx) : 512;
    const char *mgr = getenv("DS_MOE_GRAPHS"); /* on unless "0" */
    c->moe_graphs = !(mgr && strcmp(mgr, "0") == 0);
    const char *mde = getenv("DS_MOE_DOWN_EARLY"); /* on unless "0" */
    c->moe_down_early = !(mde && strcmp(mde, "0") == 0);
    /* the router's weights before its wait in steps of up to this many rows (0 unless set:
     * never), the routing in the router's last blocks (on unless "0"), the shared expert's
     * products before the experts kernel's wait (on unless "0"): bench/NOTES.md, twenty-sixth
     * to twenty-eighth sessions */
    const char *mre = getenv("DS_MOE_ROUTER_EARLY"), *mrl = getenv("DS_MOE_ROUTE_LAST");
    c->moe_router_early = mre ? atoi(mre) : 0;
    c->moe_route_last = !(mrl && strcmp(mrl, "0") == 0);
    const char *mse = getenv("DS_MOE_SHARED_EARLY");
    c->moe_shared_early = !(mse && strcmp(mse, "0") == 0);
    c->legacy = !c->batch_invariant && lg && *lg && strcmp(lg, "0") != 0;
    const char *gs = getenv("DS_CUDA_GRAPHS"), *fs = getenv("DS_CUDA_FUSE");
    if (!c->legacy && !(gs && strcmp(gs, "0") == 0)) {
      c->gr = new cuda_graphs();
      c->gr->be = be;
      c->gr->use_graphs = 1;
      c->gr->fuse = !(fs && strcmp(fs, "0") == 0);
      const char *pd = getenv("DS_PDL"); /* programmatic edges in the graphs, on unless "0" */
      c->gr->pdl = !(pd && strcmp(pd, "0") == 0);
      const char *rp = getenv("DS_CUDA_REPEAT"); /* step_repeat, on unless "0" */
      c->gr->repeat = !(rp && strcmp(rp, "0") == 0);
      const char *tm = getenv("DS_CUDA_STEP_TIMING"); /* replay timing, off unless "1" */
      c->gr->timing = tm && strcmp(tm, "1") == 0 && cudaEventCreate(&c->gr->ev[0]) == cudaSuccess &&
                      cudaEventCreate(&c->gr->ev[1]) == cudaSuccess;
    }
  }
  be->name = "cuda";
  be->destroy = cu_destroy;
  be->kind_size = cu_kind_size;
  be->alloc = cu_alloc;
  be->free = cu_free;
  be->write = cu_write;
  be->read = cu_read;
  be->copy = cu_copy;
  be->zero = cu_zero;
  be->weight_upload = cu_weight_upload;
  be->weight_upload_exact = cu_weight_upload_exact;
  be->weight_free = cu_weight_free;
  be->weight_bytes = cu_weight_bytes;
  be->weight_size = cu_weight_size;
  be->set_batch = cu_set_batch;
  be->read_start = cu_read_start;
  be->write_start = cu_write_start;
  be->read_wait = cu_read_wait;
  be->step_repeat = cu_step_repeat;
  be->sync = cu_sync;
  be->embed = w_embed;
  be->rmsnorm = w_rmsnorm;
  be->add = w_add;
  be->matmul = w_matmul;
  be->qk_norm_rope = w_qk_norm_rope;
  be->attention = w_attention;
  be->sigmoid_mul = w_sigmoid_mul;
  be->swiglu = w_swiglu;
  be->moe = w_moe;
  be->conv1d = w_conv1d;
  be->gdn_gates = w_gdn_gates;
  be->gdn_prefill = w_gdn_prefill;
  be->gdn_decode = w_gdn_decode;
  be->gated_rmsnorm = w_gated_rmsnorm;
  be->logits = w_logits;
  be->argmax = w_argmax;
  be->logits_argmax = w_logits_argmax;
  be->sample = w_sample;
  be->logits_argmax_prepare = cu_logits_argmax_prepare;
  be->host_alloc = cu_host_alloc;
  be->host_free = cu_host_free;
  be->mem_info = cu_mem_info;
  be->weight_pack = cu_weight_pack;
  return be;
}
