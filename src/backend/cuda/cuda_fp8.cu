/* cuda_fp8 — the products y[T, N] = x[T, K] . W[N, K]^T of a weight kept as FP8
 * (weight_upload_fp8: e4m3 bytes and one fp32 scale per bn x bk block, model/fp8.h).
 *
 *   rows of the step        path                                         kernel
 *   2 .. gemv_maxt (4)      tensor cores in the GEMV families' launches  k_gemv_f8s
 *                           (cuda_gemm.cu: several products of one x,
 *                           gate/up/swiglu, the norm fold's epilogues),
 *                           as the decode recorder fuses bf16 rows
 *   .. FP8_MMA_MAXT (64)    tensor cores: 16 weight rows a block, e4m3    k_fp8_mma
 *                           and the activations as f16 (cuda_fp8.cuh
 *                           f8s_block)
 *   1, and 1 .. 4 under     the GEMV kernels with FP8 rows (cuda_fp8.cuh k_gemv, ...
 *    --batch-invariant,     f8_row: the batch-invariant GEMV's order)
 *    or a shape f8s_block
 *    does not take
 *   more, every step under  the weight dequantized to bf16 into the      k_fp8_dequant, then
 *    --batch-invariant,     shared scratch, then the bf16 GEMM paths     cuda_gemm
 *    and shapes the above
 *    do not take
 *
 * Every kernel begins with pdl_enter (cuda_common.cuh). */
#include <cuda_fp16.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fp8.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_ops.h"

CUDA_KTRACE_TU(cuda_fp8_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

/* the most rows the tensor-core kernel takes when the weight has its bf16 copy (above, cuBLAS on
 * the copy is faster), and when it has none (above, dequantizing into the scratch and the bf16
 * GEMM is faster) */
#define FP8_MMA_MAXT 16
#define FP8_MMA_MAXT_ALONE 64

/* two e4m3 (the low byte first) to two floats, exactly */
__device__ __forceinline__ float2 fp8x2_to_f32(uint32_t v) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)(v & 0xffffu)));
  __half2_raw r;
  r.x = (unsigned short)(h & 0xffffu);
  r.y = (unsigned short)(h >> 16);
  return __half22float2(__half2(r));
}

__device__ __forceinline__ float fp8_to_f32(uint8_t b) { return fp8x2_to_f32(b).x; }

/* out[n, k] = bf16(e4m3(W[n, k]) * s[n/bn][k/bk]) (one fp32 product, rounded to nearest even:
 * the bits the host's dequantize-then-convert upload gives) for the 8 elements from e0. */
__device__ __forceinline__ void fp8_dequant8(const uint8_t *__restrict__ W,
                                             const float *__restrict__ s, int N, int K, int bn,
                                             int bk, int scols, size_t e0, bf16 *__restrict__ out) {
  size_t total = (size_t)N * K;
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

/* fp8_dequant8, 8 elements per thread */
__global__ void k_fp8_dequant(const uint8_t *__restrict__ W, const float *__restrict__ s, int N,
                              int K, int bn, int bk, int scols, bf16 *__restrict__ out) {
  pdl_enter();
  fp8_dequant8(W, s, N, K, bn, bk, scols, ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8, out);
}

/* Weights of one shape for k_fp8_dequant_many. */
struct fp8_dq_list {
  const uint8_t *q[CUDA_FP8_DQ_MANY];
  const float *s[CUDA_FP8_DQ_MANY];
};

/* grid (ceil(N K / 2048), n): out [n, N, K], weight blockIdx.y into its N x K, as k_fp8_dequant */
__global__ void k_fp8_dequant_many(fp8_dq_list l, int N, int K, int bn, int bk, int scols,
                                   bf16 *__restrict__ out) {
  pdl_enter();
  int i = blockIdx.y;
  fp8_dequant8(l.q[i], l.s[i], N, K, bn, bk, scols,
               ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8, out + (size_t)i * N * K);
}

/* y[t, n] for the step's T rows (1 .. 8 NT), a block per F8M_ROWS weight rows
 * (cuda_fp8.cuh f8s_block). */
template <int NT>
__global__ void __launch_bounds__(F8M_KW * 32)
    k_fp8_mma(const bf16 *__restrict__ x, int T, f8_view v, int N, int K, bf16 *__restrict__ y) {
  pdl_enter();
  int r0 = blockIdx.x * F8M_ROWS;
  float o[1][NT][4];
  f8s_block<NT, 1, 2>(x, T, &v, N, K, r0, o);
  f8m_store<NT>(o[0], T, N, r0, y);
}

extern "C" void cuda_fp8_matmul(backend *be, backend_buf xb, backend_weight W, int T, int K, int N,
                                backend_buf yb) {
  cuda_ctx *c = cuda_ctx_of(be);
  const cuda_weight *w = CW(W);
  const bf16 *x = (const bf16 *)xb;
  bf16 *y = (bf16 *)yb;
  if (T <= 0 || N <= 0) return;
  int scols = (K + w->bk - 1) / w->bk, aligned = !((uintptr_t)x & 15);
  if (!c->batch_invariant && aligned && T <= c->gemv_maxt && f8_fits(K, w->bk)) {
    gemv_nf nf = {NULL, NULL, NULL, NULL};
    cuda_gemm_gemv(c, GEMV_PLAIN, x, w, T, K, N, y, nf);
    return;
  }
  if (!c->batch_invariant && aligned && T <= (w->bf ? FP8_MMA_MAXT : FP8_MMA_MAXT_ALONE) &&
      f8m_fits(N, K, w->bn, w->bk)) {
    f8_view v = {w->q8, w->s8, w->bn, f8_log2(w->bk), scols};
    unsigned grid = (unsigned)((N + F8M_ROWS - 1) / F8M_ROWS);
    void (*k)(const bf16 *, int, f8_view, int, int, bf16 *);
    switch ((T + 7) / 8) {
      case 1:
        k = k_fp8_mma<1>;
        break;
      case 2:
        k = k_fp8_mma<2>;
        break;
      case 3:
        k = k_fp8_mma<3>;
        break;
      case 4:
        k = k_fp8_mma<4>;
        break;
      case 5:
        k = k_fp8_mma<5>;
        break;
      case 6:
        k = k_fp8_mma<6>;
        break;
      case 7:
        k = k_fp8_mma<7>;
        break;
      default:
        k = k_fp8_mma<8>;
        break;
    }
    k<<<grid, F8M_KW * 32, 0, c->st>>>(x, T, v, N, K, y);
    cuda_check_launch(c, "matmul (fp8 mma)");
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

void cuda_fp8_dequant(cuda_ctx *c, const cuda_weight *w, bf16 *out) {
  int N = (int)w->rows, K = (int)w->cols;
  size_t groups = ((size_t)N * K + 7) / 8;
  k_fp8_dequant<<<(unsigned)((groups + 255) / 256), 256, 0, c->st>>>(
      w->q8, w->s8, N, K, w->bn, w->bk, (K + w->bk - 1) / w->bk, out);
  cuda_check_launch(c, "fp8 dequantize");
}

void cuda_fp8_dequant_many(cuda_ctx *c, const cuda_weight *const *ws, int n, bf16 *out) {
  if (n < 1 || n > CUDA_FP8_DQ_MANY) return;
  const cuda_weight *w = ws[0];
  int N = (int)w->rows, K = (int)w->cols;
  fp8_dq_list l;
  memset(&l, 0, sizeof l);
  for (int i = 0; i < n; i++) {
    l.q[i] = ws[i]->q8;
    l.s[i] = ws[i]->s8;
  }
  size_t groups = ((size_t)N * K + 7) / 8;
  dim3 g((unsigned)((groups + 255) / 256), (unsigned)n);
  k_fp8_dequant_many<<<g, 256, 0, c->st>>>(l, N, K, w->bn, w->bk, (K + w->bk - 1) / w->bk, out);
  cuda_check_launch(c, "fp8 dequantize (several)");
}

int cuda_fp8_use_bf16(const cuda_ctx *c, const cuda_weight *w, int T) {
  return !w->q8 || (w->bf && (c->batch_invariant || T > FP8_MMA_MAXT));
}

long long cuda_fp8_bf16_copy(cuda_ctx *c, cuda_weight *w) {
  if (w->bf || w->rows > INT32_MAX || w->cols > INT32_MAX) return 0;
  int N = (int)w->rows, K = (int)w->cols;
  size_t n = (size_t)N * K;
  if (cudaMalloc((void **)&w->bf, n * 2) != cudaSuccess) {
    cudaGetLastError();
    w->bf = NULL;
    return -1;
  }
  size_t groups = (n + 7) / 8;
  k_fp8_dequant<<<(unsigned)((groups + 255) / 256), 256, 0, c->st>>>(
      w->q8, w->s8, N, K, w->bn, w->bk, (K + w->bk - 1) / w->bk, w->bf);
  if (cudaGetLastError() != cudaSuccess || cudaStreamSynchronize(c->st) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(w->bf);
    w->bf = NULL;
    return -1;
  }
  return (long long)(n * 2);
}
