/* backend_cuda — lifetime, memory, weights, batch metadata and GEMMs of the CUDA backend; the
 * op kernels live in cuda_elem.cu, cuda_attn.cu, cuda_gdn.cu and cuda_moe.cu (cuda_ops.h).
 *
 * Everything is enqueued on one stream. Buffers are plain cudaMalloc allocations made by the
 * caller at start-up; the only allocations during steps are the metadata arrays and the
 * scratch buffer, which grow (rarely) when a step is larger than every step before. Weights
 * are kept as bf16 (GEMM operands) plus an fp32 copy of 1-D and conv weights (norm weights,
 * gates, A_log, dt_bias) and of matrices of at most 1024 rows (MoE routers), which the
 * elementwise and routing kernels read. */
#include "backend/cuda/backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

/* ---- failures ---- */

void cuda_fail(cuda_ctx *c, const char *what, const char *detail) {
  if (c->failed) return;
  c->failed = 1;
  snprintf(c->err, sizeof c->err, "cuda: %s: %s", what, detail ? detail : "failed");
}

void cuda_check_launch(cuda_ctx *c, const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) cuda_fail(c, what, cudaGetErrorString(e));
}

static int ck(cuda_ctx *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  cuda_fail(c, what, cudaGetErrorString(e));
  return -1;
}

void *cuda_scratch(cuda_ctx *c, size_t bytes) {
  if (bytes <= c->scratch_bytes) return c->scratch;
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

void cuda_gemm(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, void *y,
               int y_f32) {
  if (T <= 0 || N <= 0) return;
  const float alpha = 1.f, beta = 0.f;
  /* column-major view: Y^T [N, T] = W^T(as [K, N] col-major)^T . X^T [K, T] */
  cublasStatus_t s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W,
                                  CUDA_R_16BF, K, x, CUDA_R_16BF, K, &beta, y,
                                  y_f32 ? CUDA_R_32F : CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT);
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
  if (c->failed || !n) return c->failed ? -1 : 0;
  if (ck(c, cudaMemcpyAsync((char *)dst + off, src, n, cudaMemcpyHostToDevice, c->st), "write"))
    return -1;
  /* the source is the caller's (pageable) memory: wait so it may change after we return */
  return ck(c, cudaStreamSynchronize(c->st), "write");
}

static int cu_read(backend *be, backend_buf src, size_t off, void *dst, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->failed) return -1;
  if (n && ck(c, cudaMemcpyAsync(dst, (const char *)src + off, n, cudaMemcpyDeviceToHost, c->st),
              "read"))
    return -1;
  if (ck(c, cudaStreamSynchronize(c->st), "read")) return -1;
  return c->failed ? -1 : 0;
}

static void cu_copy(backend *be, backend_buf dst, size_t doff, backend_buf src, size_t soff,
                    size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (!n) return;
  ck(c, cudaMemcpyAsync((char *)dst + doff, (const char *)src + soff, n, cudaMemcpyDeviceToDevice,
                        c->st),
     "copy");
}

static void cu_zero(backend *be, backend_buf buf, size_t off, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
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
  (void)be;
  if (!w) return;
  cudaFree(CW(w)->bf);
  cudaFree(CW(w)->f32);
  free(w);
}

static backend_weight cu_weight_upload(backend *be, const void *data, dtype dt, int64_t rows,
                                       int64_t cols) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_weight *w = (cuda_weight *)calloc(1, sizeof *w);
  if (!w) return NULL;
  w->rows = rows;
  w->cols = cols;
  size_t n = (size_t)(rows * cols);
  /* fp32 copies: 1-D weights, conv weights, and short matrices such as MoE routers [E, H]
   * (routing is a discrete choice: its logits are computed from the exact weights) */
  int small = rows == 1 || cols <= 16 || rows <= 1024;
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

static size_t cu_weight_bytes(backend *be, backend_weight w) {
  (void)be;
  size_t n = (size_t)(CW(w)->rows * CW(w)->cols);
  return n * 2 + (CW(w)->f32 ? n * 4 : 0);
}

/* ---- batch ---- */

static int cu_set_batch(backend *be, const backend_batch *b) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->failed) return -1;
  size_t T = (size_t)b->n_tokens, S = (size_t)b->n_seqs;
  size_t nch = 0; /* DeltaNet chunks of the prefill pieces, at most */
  for (size_t s = 0; s < S; s++)
    if (b->seq_len[s] > 1) nch += (size_t)b->seq_len[s] / BACKEND_CHUNK + 2;
  size_t need = 3 * T + 8 * S + S * (size_t)b->max_pages + (size_t)b->n_out + 2 * nch + 16;
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
  db->max_pages = b->max_pages;
  db->n_out = b->n_out;
#define TAKE(field, n)                                                     \
  do {                                                                     \
    if ((n) > 0 && b->field) memcpy(p + o, b->field, (n) * sizeof *p);      \
    else if ((n) > 0) memset(p + o, 0, (n) * sizeof *p);                    \
    c->hb.field = c->h_host + o;                                           \
    db->field = c->d_meta + o;                                             \
    o += (n);                                                              \
  } while (0)
  TAKE(tokens, T);
  TAKE(pos, T);
  TAKE(seq, T);
  TAKE(seq_start, S);
  TAKE(seq_len, S);
  TAKE(seq_pos, S);
  TAKE(seq_slot, S);
  TAKE(page_table, S * (size_t)b->max_pages);
  TAKE(out_rows, (size_t)b->n_out);
#undef TAKE
  /* piece lists */
  int np = 0, nd = 0, maxlen = 0, maxend = 0;
  int32_t *pre = p + o, *dec = p + o + S;
  for (size_t s = 0; s < S; s++) {
    int len = b->seq_len[s];
    if (len > 1) pre[np++] = (int32_t)s;
    else dec[nd++] = (int32_t)s;
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
  memcpy(c->h_host, p, o * 4);
  if (o && ck(c, cudaMemcpyAsync(c->d_meta, p, o * 4, cudaMemcpyHostToDevice, c->st), "set_batch"))
    return -1;
  cudaEventRecord(c->meta_done, c->st);
  c->meta_pending = 1;
  return 0;
}

static int cu_sync(backend *be, char *err, size_t errlen) {
  cuda_ctx *c = cuda_ctx_of(be);
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
#define GEMV_WARPS 8

__device__ __forceinline__ uint4 ld_stream16(const void *p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ void bf8_to_f(uint4 u, float *f) {
  const __nv_bfloat162 *b2 = (const __nv_bfloat162 *)&u;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 v = __bfloat1622float2(b2[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(const bf16 *__restrict__ x, const bf16 *__restrict__ W, int K, int N, bf16 *y) {
  int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (n >= N) return;
  const bf16 *w = W + (size_t)n * K;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = 0.f;
#pragma unroll 4
  for (int k = lane * 8; k < K; k += 256) {
    float wf[8];
    bf8_to_f(ld_stream16(w + k), wf);
#pragma unroll
    for (int t = 0; t < T; t++) {
      float xf[8];
      bf8_to_f(*(const uint4 *)(x + (size_t)t * K + k), xf);
#pragma unroll
      for (int i = 0; i < 8; i++) acc[t] += wf[i] * xf[i];
    }
  }
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = warp_sum(acc[t]);
  if (lane < T) {
    float v = acc[0];
#pragma unroll
    for (int t = 1; t < T; t++)
      if (lane == t) v = acc[t];
    y[(size_t)lane * N + n] = f2bf(v);
  }
}

/* 1 when the GEMV path took the product. */
static int gemv(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, bf16 *y) {
  if (c->legacy || T < 1 || T > GEMV_MAXT || K % 8 || (((uintptr_t)x | (uintptr_t)W) & 15))
    return 0;
  unsigned blocks = (unsigned)((N + GEMV_WARPS - 1) / GEMV_WARPS);
  switch (T) {
#define G(n) case n: k_gemv<n><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(x, W, K, N, y); break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
  }
  cuda_check_launch(c, "matmul (gemv)");
  return 1;
}

static void cu_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                      backend_buf y) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (CW(W)->cols != K || CW(W)->rows != N) {
    cuda_fail(c, "matmul", "weight shape does not match K, N");
    return;
  }
  if (gemv(c, (const bf16 *)x, CW(W)->bf, T, K, N, (bf16 *)y)) return;
  cuda_gemm(c, (const bf16 *)x, CW(W)->bf, T, K, N, y, 0);
}

static void cu_logits(backend *be, backend_buf x, backend_weight norm, float eps,
                      backend_weight W, int H, int V, backend_buf out) {
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
  cuda_gemm(c, (const bf16 *)xn, CW(W)->bf, n, H, V, out, 1);
}

/* ---- argmax (optional op): the greedy step's token ids on the device ---- */

#define ARGMAX_THREADS 1024

/* (v, i) beats (w, k) when v > w, or v == w with the lower id; NaN never beats anything and
 * is beaten by nothing (a thread that saw only NaN keeps i = INT32_MAX). */
__device__ __forceinline__ void am_take(float &v, int &i, float w, int k) {
  if (w > v || (w == v && k < i)) {
    v = w;
    i = k;
  }
}

/* One block per row: each thread scans a strided set of entries, then a warp and a block
 * reduction under the same rule. The result is the first maximum, as the sampler's scan
 * gives; a NaN at entry 0 gives 0 (that scan never leaves 0 then). */
__global__ void __launch_bounds__(ARGMAX_THREADS)
    k_argmax(const float *__restrict__ x, int V, int32_t *ids, float *maxv) {
  const float *row = x + (size_t)blockIdx.x * V;
  float v = -INFINITY;
  int i = INT32_MAX;
  if ((V & 3) == 0 && (((uintptr_t)row) & 15) == 0) {
    const float4 *r4 = (const float4 *)row;
    for (int q = threadIdx.x; q < V / 4; q += blockDim.x) {
      float4 f = r4[q];
      am_take(v, i, f.x, 4 * q);
      am_take(v, i, f.y, 4 * q + 1);
      am_take(v, i, f.z, 4 * q + 2);
      am_take(v, i, f.w, 4 * q + 3);
    }
  } else {
    for (int j = threadIdx.x; j < V; j += blockDim.x) am_take(v, i, row[j], j);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    int k = __shfl_xor_sync(0xffffffffu, i, o);
    am_take(v, i, w, k);
  }
  __shared__ float sv[ARGMAX_THREADS / 32];
  __shared__ int si[ARGMAX_THREADS / 32];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < nw ? sv[lane] : -INFINITY;
    i = lane < nw ? si[lane] : INT32_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float w = __shfl_xor_sync(0xffffffffu, v, o);
      int k = __shfl_xor_sync(0xffffffffu, i, o);
      am_take(v, i, w, k);
    }
    if (lane == 0) {
      if (i == INT32_MAX || isnan(row[0])) i = 0; /* all NaN, or the scan stuck at a NaN 0 */
      ids[blockIdx.x] = i;
      if (maxv) maxv[blockIdx.x] = row[i];
    }
  }
}

static void cu_argmax(backend *be, backend_buf x, int n, int V, backend_buf ids,
                      backend_buf maxv) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (n <= 0 || V <= 0) return;
  k_argmax<<<n, ARGMAX_THREADS, 0, c->st>>>((const float *)x, V, (int32_t *)ids, (float *)maxv);
  cuda_check_launch(c, "argmax");
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

/* ---- lifetime ---- */

static void cu_destroy(backend *be) {
  if (!be) return;
  cuda_ctx *c = cuda_ctx_of(be);
  if (c) {
    if (c->st) cudaStreamSynchronize(c->st);
    cuda_moe_release(c);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->scratch);
    cudaFreeHost(c->h_meta);
    cudaFree(c->d_meta);
    free(c->h_host);
    if (c->meta_done) cudaEventDestroy(c->meta_done);
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

extern "C" backend *backend_cuda_create(int device, char *err, size_t errlen) {
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
    if (err && errlen) snprintf(err, errlen, "--device cuda: no CUDA device %d (%d present)", device, n);
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
  if (cudaSetDevice(device) != cudaSuccess) why = "cudaSetDevice failed";
  else if (cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking) != cudaSuccess) why = "cannot create a stream";
  else if (cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming) != cudaSuccess) why = "cannot create an event";
  else if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) why = "cuBLAS initialisation failed";
  else if (cublasSetStream(c->blas, c->st) != CUBLAS_STATUS_SUCCESS) why = "cuBLAS stream";
  else {
    c->blas_ws_bytes = 32u << 20;
    if (cudaMalloc(&c->blas_ws, c->blas_ws_bytes) != cudaSuccess ||
        cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes) != CUBLAS_STATUS_SUCCESS)
      why = "cuBLAS workspace";
  }
  if (!why && !cuda_scratch(c, 64u << 20)) why = "out of device memory for scratch";
  if (why) {
    cudaGetLastError();
    if (err && errlen) snprintf(err, errlen, "cannot create the CUDA backend: %s", why);
    cu_destroy(be);
    return NULL;
  }
  cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
  {
    const char *lg = getenv("DS_CUDA_LEGACY");
    c->legacy = lg && *lg && strcmp(lg, "0") != 0;
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
  be->weight_free = cu_weight_free;
  be->weight_bytes = cu_weight_bytes;
  be->set_batch = cu_set_batch;
  be->sync = cu_sync;
  be->embed = cuda_elem_embed;
  be->rmsnorm = cuda_elem_rmsnorm;
  be->add = cuda_elem_add;
  be->matmul = cu_matmul;
  be->qk_norm_rope = cuda_elem_qk_norm_rope;
  be->attention = cuda_attn_attention;
  be->sigmoid_mul = cuda_elem_sigmoid_mul;
  be->swiglu = cuda_elem_swiglu;
  be->moe = cuda_moe_moe;
  be->conv1d = cuda_gdn_conv1d;
  be->gdn_gates = cuda_elem_gdn_gates;
  be->gdn_prefill = cuda_gdn_prefill;
  be->gdn_decode = cuda_gdn_decode;
  be->gated_rmsnorm = cuda_elem_gated_rmsnorm;
  be->logits = cu_logits;
  be->argmax = cu_argmax;
  be->host_alloc = cu_host_alloc;
  be->host_free = cu_host_free;
  return be;
}
