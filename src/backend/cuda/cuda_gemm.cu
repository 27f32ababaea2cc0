/* cuda_gemm — the products y[T, N] = x[T, K] . W[N, K]^T and which path takes each.
 *
 *   rows of the step        path                                         kernel
 *   1 .. gemv_maxt (4)      GEMV: one warp per output row, W streamed     k_gemv (packed copies
 *                           past L1 (packed copies at 1 row)              at 1 row), k_gemv_f32
 *   gemv_maxt+1 .. 16,      skinny GEMM (cuda_sgemm.cu)                   k_sgemm
 *    K % 128 == 0
 *   N <= 64, T <= 128,      narrow products (e.g. DeltaNet b and a)       k_gemv_narrow
 *    no skinny GEMM
 *   larger                  cuBLAS bf16 GEMM, fp32 accumulation           cublasGemmEx
 *   --batch-invariant       GEMV up to 8 rows, else the GEMV arithmetic   k_gemv, k_gemv_all
 *                           in groups of 8 rows
 *   an FP8 weight           cuda_fp8.cu's table: tensor cores (at the      k_gemv_f8s,
 *                           GEMV path's rows in the families' launches     k_fp8_mma,
 *                           here), or dequantized into scratch and the     k_fp8_dequant
 *                           paths above
 *
 * The decode-step recorder (cuda_graph.cu) also launches the fused forms through cuda_gemm.cuh:
 * several products of one x (k_gemv_multi), gate/up/swiglu (k_gemv_glu) and the norm fold's
 * GEMV_RES / GEMV_LATE epilogues. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_fp8.cuh"
#include "backend/cuda/cuda_packed.cuh"

CUDA_KTRACE_TU(cuda_gemm_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

static void gemv_all(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, void *y,
                     int y_f32);

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

extern "C" int backend_cuda_packed_rows(backend *be, int rows) {
  cuda_ctx *c = cuda_ctx_of(be);
  return rows >= 1 && rows <= c->packed && rows <= c->gemv_maxt;
}

/* The weight formats a GEMV kernel is instantiated for: bf16 rows, packed copies
 * (cuda_packed.cuh), FP8 rows (cuda_fp8.cuh); a kernel compiles one of them (a kernel holding
 * several needs more registers, which slows its bf16 rows). */
enum { WF_BF = 0, WF_PK = 1, WF_F8 = 2 };

/* One matrix as the GEMV kernels read it: bf16 rows with their packed copy (p), or FP8 rows
 * (f.q not NULL; p.bf NULL). */
struct gemv_w {
  pk_view p;
  f8_view f;
};

/* The FP8 view of an FP8 weight (cuda_weight q8). */
static f8_view f8_of(const cuda_weight *w) {
  f8_view f = {w->q8, w->s8, w->bn, f8_log2(w->bk), (int)((w->cols + w->bk - 1) / w->bk)};
  return f;
}

/* A weight as the GEMV kernels read it in a product of T rows: its packed copy too when it has
 * one and products of T rows use them (T <= c->packed); an FP8 weight's e4m3 rows. */
static gemv_w gemv_view(const cuda_ctx *c, const cuda_weight *w, int T) {
  gemv_w v;
  memset(&v, 0, sizeof v);
  v.p.bf = w->bf;
  if (w->q8) {
    v.f = f8_of(w);
  } else if (T <= c->packed && w->pk) {
    v.p.pk = w->pk;
    v.p.hd = w->pkh;
  }
  return v;
}

/* Row n's sums in format WF (gemv_row's contract). */
template <int T, bool LATE, int WF>
__device__ __forceinline__ void gemv_w_row(const bf16 *__restrict__ x, const gemv_w &w, int n,
                                           int K, int lane, float *acc, const float *inv,
                                           float *iv) {
  if constexpr (WF == WF_F8)
    f8_row<T, LATE>(x, w.f, n, K, lane, acc, inv, iv);
  else
    pk_gemv_row<T, LATE, WF == WF_PK>(x, w.p, n, K, lane, acc, inv, iv);
}

/* ---- GEMM ops ---- */

/* Small-batch GEMV (T <= GEMV_MAXT rows, the decode steps): one warp per output column n,
 * each lane streaming 16-byte pieces of W's row n (read once, not kept in L1) against the T
 * activation rows (L1/L2 resident), fp32 sums per row in a fixed order (lane partials, then a
 * butterfly), so a row's result is the same for every T of this path. cuBLAS's small-N
 * kernels reached ~2.4 TB/s on these shapes; this path is the decode floor's main term. */
/* warps (rows) per block: 4 read a step's products faster than 8 (a row's sums do not depend
 * on it: the same bits) */
#define GEMV_WARPS 4

/* Single products of at most GEMV_SMALL_N rows (a decode step's out, o and down products: 2,560
 * rows at the 4B shape) in blocks of one warp: in blocks of 4 rows there are 4 or 5 per SM and
 * the SMs holding 5 finish last; one-warp blocks spread ~19-20 rows on every SM (the same bits:
 * a row's sums do not depend on the block). */
#define GEMV_SMALL_WARPS 1
#define GEMV_SMALL_N 4096

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
template <int T, int WB, int MODE, int WF>
__global__ void __launch_bounds__(WB * 32)
    k_gemv(const bf16 *__restrict__ x, gemv_w W, int K, int N, bf16 *y, gemv_nf nf) {
  int n = blockIdx.x * WB + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  gemv_enter<MODE>();
  if (n >= N) return;
  float acc[T], iv[T], r0 = 0.f, g0 = 0.f;
  if (MODE == GEMV_RES && lane < T) { /* loaded now: not a dependent load after the sums */
    r0 = bf2f(nf.res[(size_t)lane * N + n]);
    g0 = nf.g[n];
  }
  gemv_w_row<T, MODE == GEMV_LATE, WF>(x, W, n, K, lane, acc, nf.inv, iv);
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
struct gemv_set {
  const bf16 *W[GEMV_MULTI];
  bf16 *y[GEMV_MULTI];
  int n0[GEMV_MULTI + 1];
  int cnt;
  /* the packed copies (gemv_view; NULL: bf16 rows) */
  const uint8_t *pk[GEMV_MULTI];
  const uint32_t *hd[GEMV_MULTI];
  f8_view f8[GEMV_MULTI]; /* FP8 rows (every matrix of the set, or none) */
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

template <int T, int MODE, int WF>
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
  gemv_w v;
  v.p.bf = W;
  v.p.pk = s.pk[m];
  v.p.hd = s.hd[m];
  v.f = s.f8[m];
  float acc[T], iv[T];
  gemv_w_row<T, MODE == GEMV_LATE, WF>(x, v, r, K, lane, acc, nf.inv, iv);
  gemv_late<T, MODE>(acc, iv);
  if (lane < T) y[(size_t)lane * N + r] = f2bf(gemv_pick<T>(acc, lane));
}

/* gate = x.Wg^T, up = x.Wu^T, out = silu(gate) * up (the swiglu op's expression on the bf16
 * values) in one launch; gate and up are still written (out may alias gate). From bf16 rows the
 * warp streams its gate and up rows in one loop (gemv_row2: faster at decode 1 than the gate
 * row, then the up row); from packed copies one row after the other (pk_gemv_row2). */
template <int T, int MODE, int WF>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_glu(const bf16 *__restrict__ x, gemv_w Wg, gemv_w Wu, int K, int N, bf16 *yg, bf16 *yu,
               bf16 *out, gemv_nf nf) {
  int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  gemv_enter<MODE>();
  if (n >= N) return;
  float ag[T], au[T], iv[T];
  if constexpr (WF == WF_F8)
    f8_row2<T, MODE == GEMV_LATE>(x, Wg.f, Wu.f, n, K, lane, ag, au, nf.inv, iv);
  else
    pk_gemv_row2<T, MODE == GEMV_LATE, WF == WF_PK>(x, Wg.p, Wu.p, n, K, lane, ag, au, nf.inv, iv);
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

/* ---- batch-invariant GEMM (--batch-invariant) ----
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
 * cuBLAS spends microseconds of pure latency on a 32-column product at 32-128 rows, and one warp
 * per (column, 8 rows) walking all of K is slower still: too few warps, each a chain of
 * dependent loads. Here a block takes NARROW_COLS columns x 8 rows
 * and its NARROW_KW warps split K (warp w: the 256-element pieces w, w + NARROW_KW, ...); a
 * lane keeps the columns' W piece and reuses it for the 8 x rows (x from L2/L1), partials in
 * fp32: lane order, then a butterfly, then the warps in order through shared memory — a fixed
 * order that depends only on K, never on T. Up to GEMV_MULTI products of one x in one launch
 * (the decode recorder fuses b and a). grid (ceil(total columns / NARROW_COLS), ceil(T / 8)). */
#define NARROW_MAXN 64
/* decode-sized steps only: at prefill sizes cuBLAS is faster */
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

int cuda_gemm_narrow_fits(const cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N,
                          const void *y) {
  return !c->batch_invariant && T > c->gemv_maxt && T <= NARROW_MAXT && N >= 1 &&
         N <= NARROW_MAXN && K % 8 == 0 && !(((uintptr_t)x | (uintptr_t)W) & 15) && y;
}

void cuda_gemm_narrow(cuda_ctx *c, const bf16 *x, int T, int K, int m, const bf16 *const *W,
                      bf16 *const *y, const int *N) {
  gemv_set s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < m; i++) gemv_set_add(s, W[i], y[i], N[i]);
  int tot = s.n0[GEMV_MULTI];
  dim3 grid((unsigned)((tot + NARROW_COLS - 1) / NARROW_COLS), (unsigned)((T + 7) / 8));
  k_gemv_narrow<<<grid, NARROW_KW * 32, 0, c->st>>>(x, s, T, K);
  cuda_check_launch(c, "matmul (narrow)");
}

/* ---- FP8 weights: the tensor-core rows (cuda_fp8.cuh f8s_block) ----
 * The GEMV families' products of FP8 weights, as blocks of F8M_ROWS weight rows whose warps
 * split K, with the families' epilogues: several matrices of one x (a block's rows lie in one),
 * gate/up/swiglu (R = 2), GEMV_RES and GEMV_LATE. Taken when every matrix has N % F8M_ROWS == 0
 * and f8m_fits (f8s_fits), not under --batch-invariant (whose GEMV bits are the FP8 rows'). */
struct f8s_job {
  f8_view f[GEMV_MULTI];  /* R = 2: gate, up */
  bf16 *y[GEMV_MULTI];    /* R = 2: gate, up, out */
  int n0[GEMV_MULTI + 1]; /* matrix m's rows are n0[m] .. n0[m + 1] (multiples of F8M_ROWS) */
  int cnt;
};

template <int T, int MODE, int R, int U>
__global__ void __launch_bounds__(F8M_KW * 32)
    k_gemv_f8s(const bf16 *__restrict__ x, f8s_job jb, int K, gemv_nf nf) {
  constexpr int NT = (T + 7) / 8;
  gemv_enter<MODE>();
  int rg = blockIdx.x * F8M_ROWS, m = 0;
#pragma unroll
  for (int i = 1; i < GEMV_MULTI; i++)
    if (i < jb.cnt && rg >= jb.n0[i]) m = i;
  int N = jb.n0[m + 1] - jb.n0[m], r0 = rg - jb.n0[m];
  f8_view v[R];
  v[0] = jb.f[R == 1 ? m : 0];
  if constexpr (R == 2) v[1] = jb.f[1];
  float out[R][NT][4];
  f8s_block<NT, R, U>(x, T, v, N, K, r0, out);
  if (threadIdx.x >= 32) return;
  if constexpr (MODE == GEMV_LATE) pdl_wait(); /* the norm's factors come from the kernel before */
  int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int tok = 8 * j + 2 * t + (i & 1), row = r0 + g + 8 * (i >> 1);
      if (tok >= T || row >= N) continue;
      float iv = MODE == GEMV_LATE ? __ldcg(nf.inv + tok) : 1.f;
      size_t o = (size_t)tok * N + row;
      if constexpr (R == 2) {
        bf16 gb = f2bf(out[0][j][i] * iv), ub = f2bf(out[1][j][i] * iv);
        jb.y[0][o] = gb;
        jb.y[1][o] = ub;
        jb.y[2][o] = f2bf(siluf_dev(bf2f(gb)) * bf2f(ub));
      } else {
        bf16 yb = f2bf(out[0][j][i] * iv);
        jb.y[m][o] = yb;
        if (MODE == GEMV_RES) {
          bf16 rb = f2bf(bf2f(nf.res[o]) + bf2f(yb));
          nf.res[o] = rb;
          nf.xg[o] = f2bf(bf2f(rb) * (1.f + nf.g[row]));
        }
      }
    }
}

/* 1 when the FP8 views v[0 .. m) of products of T rows (N[i] rows each) take k_gemv_f8s: 2 to
 * 4 rows (verify pieces); one row streams faster through the FP8 GEMV rows. */
static int f8s_fits(const cuda_ctx *c, const f8_view *v, const int *N, int m, int T, int K) {
  if (c->batch_invariant || T < 2 || T > GEMV_MAXT_DEFAULT) return 0;
  for (int i = 0; i < m; i++)
    if (!v[i].q || N[i] % F8M_ROWS || !f8m_fits(N[i], K, v[i].bn, 1 << v[i].bks)) return 0;
  return 1;
}

/* k_gemv_f8s over jb (m matrices; R = 2: gate and up of N rows). */
template <int MODE, int R>
static void f8s_launch(cuda_ctx *c, const bf16 *x, f8s_job &jb, int m, int T, int K, gemv_nf nf) {
  jb.cnt = R == 2 ? 1 : m;
  for (int i = jb.cnt + 1; i <= GEMV_MULTI; i++) jb.n0[i] = jb.n0[jb.cnt];
  unsigned blocks = (unsigned)(jb.n0[GEMV_MULTI] / F8M_ROWS);
  constexpr int U = R == 2 ? 2 : 4; /* the same bytes in flight per warp */
  switch (T) {
// clang-format off
#define G(n) case n: k_gemv_f8s<n, MODE, R, U><<<blocks, F8M_KW * 32, 0, c->st>>>(x, jb, K, nf); break;
    G(2) G(3) G(4)
#undef G
    // clang-format on
  }
}

/* k_gemv in blocks of WB warps (rows). */
template <int WB, int MODE>
static void gemv_launch(cuda_ctx *c, const bf16 *x, const gemv_w &W, int T, int K, int N, bf16 *y,
                        gemv_nf nf) {
  unsigned blocks = (unsigned)((N + WB - 1) / WB);
  switch (T) {
// clang-format off
#define G(n)                                                                          \
  case n:                                                                             \
    if constexpr (MODE == GEMV_PLAIN || n <= NORM_FOLD_MAXT) {                        \
      if (n <= PK_MAXT && W.f.q)                                                      \
        k_gemv<n, WB, MODE, (n <= PK_MAXT ? WF_F8 : WF_BF)><<<blocks, WB * 32, 0, c->st>>>(x, W, K, N, y, nf); \
      else if (n <= PK_MAXT && W.p.pk)                                                \
        k_gemv<n, WB, MODE, (n <= PK_MAXT ? WF_PK : WF_BF)><<<blocks, WB * 32, 0, c->st>>>(x, W, K, N, y, nf); \
      else                                                                            \
        k_gemv<n, WB, MODE, WF_BF><<<blocks, WB * 32, 0, c->st>>>(x, W, K, N, y, nf); \
    }                                                                                 \
    break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
    // clang-format on
  }
}

template <int MODE>
static void gemv_mode(cuda_ctx *c, const bf16 *x, const gemv_w &W, int T, int K, int N, bf16 *y,
                      const gemv_nf &nf) {
  if (f8s_fits(c, &W.f, &N, 1, T, K)) {
    f8s_job jb;
    memset(&jb, 0, sizeof jb);
    jb.f[0] = W.f;
    jb.y[0] = y;
    jb.n0[1] = N;
    f8s_launch<MODE, 1>(c, x, jb, 1, T, K, nf);
  } else if (N <= GEMV_SMALL_N)
    gemv_launch<GEMV_SMALL_WARPS, MODE>(c, x, W, T, K, N, y, nf);
  else
    gemv_launch<GEMV_WARPS, MODE>(c, x, W, T, K, N, y, nf);
  cuda_check_launch(c, MODE == GEMV_PLAIN ? "matmul (gemv)"
                       : MODE == GEMV_RES ? "matmul (gemv + residual)"
                                          : "matmul (gemv, norm factor late)");
}

/* 1 when the GEMV path took the product. */
static int gemv(cuda_ctx *c, const bf16 *x, const cuda_weight *W, int T, int K, int N, bf16 *y) {
  if (T < 1 || T > c->gemv_maxt || K % 8 || (((uintptr_t)x | (uintptr_t)W->bf) & 15)) return 0;
  gemv_nf nf = {NULL, NULL, NULL, NULL};
  gemv_mode<GEMV_PLAIN>(c, x, gemv_view(c, W, T), T, K, N, y, nf);
  return 1;
}

extern "C" void cuda_gemm_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                                 backend_buf y) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (CW(W)->cols != K || CW(W)->rows != N) {
    cuda_fail(c, "matmul", "weight shape does not match K, N");
    return;
  }
  if (!cuda_fp8_use_bf16(c, CW(W), T)) {
    cuda_fp8_matmul(be, x, W, T, K, N, y);
    return;
  }
  if (gemv(c, (const bf16 *)x, CW(W), T, K, N, (bf16 *)y)) return;
  if (!cuda_sgemm_fits(c, T, K, N, 0) &&
      cuda_gemm_narrow_fits(c, (const bf16 *)x, CW(W)->bf, T, K, N, y)) {
    const bf16 *w1 = CW(W)->bf;
    bf16 *y1 = (bf16 *)y;
    cuda_gemm_narrow(c, (const bf16 *)x, T, K, 1, &w1, &y1, &N);
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
  if (c->batch_invariant || T < 1 || T > c->gemv_maxt || K % 8 ||
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

extern "C" void cuda_gemm_logits(backend *be, backend_buf x, backend_weight norm, float eps,
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
  if (!gemv_f32(c, (const bf16 *)xn, CW(W)->bf, n, H, V, (float *)out))
    cuda_gemm(c, (const bf16 *)xn, CW(W)->bf, n, H, V, out, 1);
}

/* ---- the decode-step recorder's fused launches (cuda_gemm.cuh) ---- */

void cuda_gemm_gemv(cuda_ctx *c, int mode, const bf16 *x, const cuda_weight *W, int T, int K, int N,
                    bf16 *y, gemv_nf nf) {
  gemv_w v = gemv_view(c, W, T);
  if (mode == GEMV_RES)
    gemv_mode<GEMV_RES>(c, x, v, T, K, N, y, nf);
  else if (mode == GEMV_LATE)
    gemv_mode<GEMV_LATE>(c, x, v, T, K, N, y, nf);
  else
    gemv_mode<GEMV_PLAIN>(c, x, v, T, K, N, y, nf);
}

template <int MODE>
static void launch_multi(cuda_ctx *c, const bf16 *x, int T, int K, int m,
                         const cuda_weight *const *W, bf16 *const *y, const int *N, gemv_nf nf) {
  gemv_set s;
  memset(&s, 0, sizeof s);
  bool pk = false, f8 = false;
  for (int i = 0; i < m; i++) {
    gemv_w v = gemv_view(c, W[i], T);
    s.pk[i] = v.p.pk;
    s.hd[i] = v.p.hd;
    s.f8[i] = v.f;
    pk |= v.p.pk != NULL;
    f8 |= v.f.q != NULL;
    gemv_set_add(s, W[i]->bf, y[i], N[i]);
  }
  if (f8s_fits(c, s.f8, N, m, T, K)) {
    f8s_job jb;
    memset(&jb, 0, sizeof jb);
    for (int i = 0; i < m; i++) {
      jb.f[i] = s.f8[i];
      jb.y[i] = y[i];
      jb.n0[i + 1] = jb.n0[i] + N[i];
    }
    f8s_launch<MODE, 1>(c, x, jb, m, T, K, nf);
    cuda_check_launch(c, MODE == GEMV_LATE ? "matmul (fused fp8 mma, norm factor late)"
                                           : "matmul (fused fp8 mma)");
    return;
  }
  int tot = s.n0[GEMV_MULTI];
  unsigned blocks = (unsigned)((tot + GEMV_WARPS - 1) / GEMV_WARPS);
  switch (T) {
// clang-format off
#define G(n)                                                                                \
  case n:                                                                                   \
    if constexpr (MODE == GEMV_PLAIN || n <= NORM_FOLD_MAXT) {                              \
      if (n <= PK_MAXT && f8)                                                               \
        k_gemv_multi<n, MODE, (n <= PK_MAXT ? WF_F8 : WF_BF)><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(x, s, K, nf); \
      else if (n <= PK_MAXT && pk)                                                          \
        k_gemv_multi<n, MODE, (n <= PK_MAXT ? WF_PK : WF_BF)><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(x, s, K, nf); \
      else                                                                                  \
        k_gemv_multi<n, MODE, WF_BF><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(x, s, K, nf);   \
    }                                                                                       \
    break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
    // clang-format on
  }
  cuda_check_launch(
      c, MODE == GEMV_LATE ? "matmul (fused gemv, norm factor late)" : "matmul (fused gemv)");
}

void cuda_gemm_gemv_multi(cuda_ctx *c, int mode, const bf16 *x, int T, int K, int m,
                          const cuda_weight *const *W, bf16 *const *y, const int *N, gemv_nf nf) {
  if (mode == GEMV_LATE)
    launch_multi<GEMV_LATE>(c, x, T, K, m, W, y, N, nf);
  else
    launch_multi<GEMV_PLAIN>(c, x, T, K, m, W, y, N, nf);
}

template <int MODE>
static void launch_glu(cuda_ctx *c, const bf16 *x, const cuda_weight *Wg, const cuda_weight *Wu,
                       int T, int K, int N, bf16 *yg, bf16 *yu, bf16 *out, gemv_nf nf) {
  unsigned blocks = (unsigned)((N + GEMV_WARPS - 1) / GEMV_WARPS);
  gemv_w vg = gemv_view(c, Wg, T), vu = gemv_view(c, Wu, T);
  const f8_view gu[2] = {vg.f, vu.f};
  const int NN[2] = {N, N};
  if (f8s_fits(c, gu, NN, 2, T, K) && vg.f.bks == vu.f.bks) {
    f8s_job jb;
    memset(&jb, 0, sizeof jb);
    jb.f[0] = vg.f;
    jb.f[1] = vu.f;
    jb.y[0] = yg;
    jb.y[1] = yu;
    jb.y[2] = out;
    jb.n0[1] = N;
    f8s_launch<MODE, 2>(c, x, jb, 1, T, K, nf);
    cuda_check_launch(c, MODE == GEMV_LATE
                             ? "matmul (fused fp8 mma gate/up/swiglu, norm factor late)"
                             : "matmul (fused fp8 mma gate/up/swiglu)");
    return;
  }
  switch (T) {
// clang-format off
#define G(n)                                                                                   \
  case n:                                                                                      \
    if constexpr (MODE == GEMV_PLAIN || n <= NORM_FOLD_MAXT) {                                 \
      if (n <= PK_MAXT && vg.f.q && vu.f.q)                                                    \
        k_gemv_glu<n, MODE, (n <= PK_MAXT ? WF_F8 : WF_BF)><<<blocks, GEMV_WARPS * 32, 0, c->st>>>( \
            x, vg, vu, K, N, yg, yu, out, nf);                                                 \
      else if (n <= PK_MAXT && vg.p.pk && vu.p.pk)                                             \
        k_gemv_glu<n, MODE, (n <= PK_MAXT ? WF_PK : WF_BF)><<<blocks, GEMV_WARPS * 32, 0, c->st>>>( \
            x, vg, vu, K, N, yg, yu, out, nf);                                                 \
      else                                                                                     \
        k_gemv_glu<n, MODE, WF_BF><<<blocks, GEMV_WARPS * 32, 0, c->st>>>(                     \
            x, vg, vu, K, N, yg, yu, out, nf);                                                 \
    }                                                                                          \
    break;
    G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
    // clang-format on
  }
  cuda_check_launch(c, MODE == GEMV_LATE ? "matmul (fused gate/up/swiglu, norm factor late)"
                                         : "matmul (fused gate/up/swiglu)");
}

void cuda_gemm_glu(cuda_ctx *c, int mode, const bf16 *x, const cuda_weight *Wg,
                   const cuda_weight *Wu, int T, int K, int N, bf16 *yg, bf16 *yu, bf16 *out,
                   gemv_nf nf) {
  if (mode == GEMV_LATE)
    launch_glu<GEMV_LATE>(c, x, Wg, Wu, T, K, N, yg, yu, out, nf);
  else
    launch_glu<GEMV_PLAIN>(c, x, Wg, Wu, T, K, N, yg, yu, out, nf);
}
