/* cuda_fp8 — the products y[T, N] = x[T, K] . W[N, K]^T of a weight kept as FP8
 * (weight_upload_fp8: e4m3 bytes and one fp32 scale per bn x bk block, model/fp8.h).
 *
 *   rows of the step        path                                          kernel
 *   1 .. FP8_GEMV_MAXT (4)  GEMV: one warp per output row, the e4m3 row    k_fp8_gemv
 *                           streamed past L1 in 16-byte loads (half the
 *                           bytes of bf16), fp32 sums per 16 elements
 *                           times their block's scale
 *   more, and every step    the weight dequantized to bf16 into the       k_fp8_dequant, then
 *    under --batch-invariant  shared scratch, then the bf16 GEMM paths     cuda_gemm
 *
 *   W row n:  | 16 B | 16 B | 16 B | ... |      lane l reads the 16-byte pieces l, l + 32, ...;
 *             k: 0    16     32              each piece lies in one k-block (bk % 16 == 0), so
 *                                            its sum is scaled once by scale_inv[n/bn][k/bk]
 *
 * e4m3 converts exactly to fp16 (cvt.rn.f16x2.e4m3x2, sm_89+), fp16 exactly to fp32. Shapes the
 * 16-byte path does not cover (K or bk not a multiple of 16, unaligned operands) take a scalar
 * loop. The decode-step recorder never fuses these products (cuda_graph.cu: the fits rules refuse
 * an FP8 weight), so each runs by itself. Both kernels begin with pdl_enter (cuda_common.cuh). */
#include <cuda_fp16.h>
#include <stdio.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

CUDA_KTRACE_TU(cuda_fp8_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

#define FP8_GEMV_MAXT 4 /* rows the GEMV path takes (GEMV_MAXT_DEFAULT's reason) */
#define FP8_WARPS 4     /* output rows (warps) per GEMV block */
#define FP8_UNROLL 4    /* 16-byte weight loads in flight per lane */

/* two e4m3 (the low byte first) to two floats, exactly */
__device__ __forceinline__ float2 fp8x2_to_f32(uint32_t v) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)(v & 0xffffu)));
  __half2_raw r;
  r.x = (unsigned short)(h & 0xffffu);
  r.y = (unsigned short)(h >> 16);
  return __half22float2(__half2(r));
}

/* 16 e4m3 (one 16-byte word, lowest address first) to 16 floats */
__device__ __forceinline__ void fp8x16_to_f32(uint4 u, float *f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int m = 0; m < 4; m++) {
    float2 lo = fp8x2_to_f32(w[m]), hi = fp8x2_to_f32(w[m] >> 16);
    f[4 * m] = lo.x;
    f[4 * m + 1] = lo.y;
    f[4 * m + 2] = hi.x;
    f[4 * m + 3] = hi.y;
  }
}

__device__ __forceinline__ float fp8_to_f32(uint8_t b) { return fp8x2_to_f32(b).x; }

/* Lane's next FP8_UNROLL 16-byte pieces of a row from k0 on (zeros past K) and their scales. */
__device__ __forceinline__ void fp8_load(const uint8_t *w, const float *sr, int k0, int K, int bk,
                                         int bks, uint4 *q, float *sc) {
#pragma unroll
  for (int u = 0; u < FP8_UNROLL; u++) {
    int k = k0 + u * 32 * 16;
    q[u] = k < K ? ld_stream16(w + k) : make_uint4(0, 0, 0, 0);
    sc[u] = k < K ? __ldg(sr + (bks >= 0 ? k >> bks : k / bk)) : 0.f;
  }
}

/* y[t, n] = sum_k x[t, k] * W[n, k] * s[n/bn][k/bk], one warp per n. vec: the 16-byte path
 * (K % 16 == 0, bk % 16 == 0, x and W 16-byte aligned). bks: log2(bk) when bk is a power of two
 * (a shift in place of the division), else -1. The first pieces of the row are loaded before
 * the wait for the kernel before: no kernel of a step writes weights. */
template <int T>
__global__ void __launch_bounds__(FP8_WARPS * 32)
    k_fp8_gemv(const bf16 *__restrict__ x, const uint8_t *__restrict__ W,
               const float *__restrict__ s, int K, int N, int bn, int bk, int bks, int scols,
               int vec, bf16 *__restrict__ y) {
  int n = blockIdx.x * FP8_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  const uint8_t *w = W + (size_t)(n < N ? n : 0) * K;
  const float *sr = s + (size_t)((n < N ? n : 0) / bn) * scols;
  uint4 q[FP8_UNROLL];
  float sc[FP8_UNROLL];
  if (vec && n < N) fp8_load(w, sr, lane * 16, K, bk, bks, q, sc);
  pdl_enter();
  if (n >= N) return;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = 0.f;
  if (vec) {
    for (int k0 = lane * 16; k0 < K; k0 += 32 * 16 * FP8_UNROLL) {
      if (k0 != lane * 16) fp8_load(w, sr, k0, K, bk, bks, q, sc);
#pragma unroll
      for (int u = 0; u < FP8_UNROLL; u++) {
        int k = k0 + u * 32 * 16;
        if (k >= K) break;
        float wf[16];
        fp8x16_to_f32(q[u], wf);
#pragma unroll
        for (int t = 0; t < T; t++) {
          const uint4 *xp = (const uint4 *)(x + (size_t)t * K + k);
          float xf[16];
          bf16x8_to_f32(xp[0], xf);
          bf16x8_to_f32(xp[1], xf + 8);
          float p = 0.f;
#pragma unroll
          for (int i = 0; i < 16; i++) p = fmaf(wf[i], xf[i], p);
          acc[t] = fmaf(p, sc[u], acc[t]);
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
      float wk = fp8_to_f32(w[k]) * __ldg(sr + k / bk);
#pragma unroll
      for (int t = 0; t < T; t++) acc[t] = fmaf(bf2f(x[(size_t)t * K + k]), wk, acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < T; t++) {
    float v = warp_sum(acc[t]);
    if (lane == 0) y[(size_t)t * N + n] = f2bf(v);
  }
}

/* out[n, k] = bf16(e4m3(W[n, k]) * s[n/bn][k/bk]) (one fp32 product, rounded to nearest even:
 * the bits the host's dequantize-then-convert upload gives), 8 elements per thread. */
__global__ void k_fp8_dequant(const uint8_t *__restrict__ W, const float *__restrict__ s, int N,
                              int K, int bn, int bk, int scols, bf16 *__restrict__ out) {
  pdl_enter();
  size_t total = (size_t)N * K, e0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (e0 >= total) return;
  if (K % 8 == 0) { /* the 8 elements lie in one row, 8- and 16-byte aligned */
    int n = (int)(e0 / (size_t)K), k = (int)(e0 % (size_t)K);
    const float *sr = s + (size_t)(n / bn) * scols;
    uint2 q = *(const uint2 *)(W + e0);
    float f[8];
    float2 a = fp8x2_to_f32(q.x), b = fp8x2_to_f32(q.x >> 16), c = fp8x2_to_f32(q.y),
           d = fp8x2_to_f32(q.y >> 16);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
    __align__(16) bf16 o[8];
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = f2bf(f[i] * __ldg(sr + (k + i) / bk));
    *(uint4 *)(out + e0) = *(const uint4 *)o;
  } else {
    for (size_t e = e0; e < e0 + 8 && e < total; e++) {
      int n = (int)(e / (size_t)K), k = (int)(e % (size_t)K);
      out[e] = f2bf(fp8_to_f32(W[e]) * __ldg(s + (size_t)(n / bn) * scols + k / bk));
    }
  }
}

template <int T>
static void fp8_gemv_launch(cuda_ctx *c, const bf16 *x, const cuda_weight *w, int K, int N,
                            int scols, int vec, bf16 *y) {
  void (*k)(const bf16 *, const uint8_t *, const float *, int, int, int, int, int, int, int,
            bf16 *) = k_fp8_gemv<T>;
  int bks = -1;
  for (int b = 0; b < 31; b++)
    if (w->bk == 1 << b) bks = b;
  k<<<(unsigned)((N + FP8_WARPS - 1) / FP8_WARPS), FP8_WARPS * 32, 0, c->st>>>(
      x, w->q8, w->s8, K, N, w->bn, w->bk, bks, scols, vec, y);
}

extern "C" void cuda_fp8_matmul(backend *be, backend_buf xb, backend_weight W, int T, int K, int N,
                                backend_buf yb) {
  cuda_ctx *c = cuda_ctx_of(be);
  const cuda_weight *w = CW(W);
  const bf16 *x = (const bf16 *)xb;
  bf16 *y = (bf16 *)yb;
  if (T <= 0 || N <= 0) return;
  int scols = (K + w->bk - 1) / w->bk;
  if (T <= FP8_GEMV_MAXT && !c->batch_invariant) {
    int vec = K % 16 == 0 && w->bk % 16 == 0 && !(((uintptr_t)x | (uintptr_t)w->q8) & 15);
    switch (T) {
      case 1:
        fp8_gemv_launch<1>(c, x, w, K, N, scols, vec, y);
        break;
      case 2:
        fp8_gemv_launch<2>(c, x, w, K, N, scols, vec, y);
        break;
      case 3:
        fp8_gemv_launch<3>(c, x, w, K, N, scols, vec, y);
        break;
      default:
        fp8_gemv_launch<4>(c, x, w, K, N, scols, vec, y);
        break;
    }
    cuda_check_launch(c, "matmul (fp8 gemv)");
    return;
  }
  /* the scratch was grown to the weight's bf16 size at its upload */
  bf16 *wb = (bf16 *)cuda_scratch(c, (size_t)N * K * 2);
  if (!wb) return;
  size_t groups = ((size_t)N * K + 7) / 8;
  k_fp8_dequant<<<(unsigned)((groups + 255) / 256), 256, 0, c->st>>>(w->q8, w->s8, N, K, w->bn,
                                                                     w->bk, scols, wb);
  cuda_check_launch(c, "matmul (fp8 dequantize)");
  cuda_gemm(c, x, wb, T, K, N, y, 0);
}
