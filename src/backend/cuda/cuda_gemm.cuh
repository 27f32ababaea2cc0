/* cuda_gemm.cuh — the product paths of cuda_gemm.cu as the decode-step recorder (cuda_graph.cu)
 * launches them: plain, several products of one x, gate/up/swiglu, narrow, each optionally with
 * the norm fold's epilogue (cuda_graph.cu norm_fold_at). */
#ifndef DS_CUDA_GEMM_CUH
#define DS_CUDA_GEMM_CUH
#include "backend/cuda/cuda_common.cuh"

/* What a GEMV launch does around its products. GEMV_PLAIN: y = x.W^T. GEMV_RES (the product
 * before a folded norm): also res[t, n] += y[t, n] (k_rmsnorm8's residual expression) and
 * xg[t, n] = res[t, n] * (1 + g[n]) in bf16 (the norm's input scaled by its weight, the factor
 * left out). GEMV_LATE (the products after it, x = xg): the next kernel is let launch at once,
 * the products run while the norm's factor kernel before them still runs, and only then is it
 * waited for and each row's sums scaled by inv[t]. */
/* The GEMV path's largest step: GEMV_MAXT under --batch-invariant (its bits equal the
 * batch-invariant kernel's up to 8 rows), else GEMV_MAXT_DEFAULT (above 4 rows the GEMMs are
 * faster on the H200). */
#define GEMV_MAXT 8
#define GEMV_MAXT_DEFAULT 4
enum { GEMV_PLAIN = 0, GEMV_RES = 1, GEMV_LATE = 2 };
#define NORM_FOLD_MAXT GEMV_MAXT_DEFAULT /* steps of more rows keep the norm */
#define GEMV_MULTI 4 /* products of one x per fused launch (q, k, v and a gate at most) */
struct gemv_nf {
  const float *g;   /* GEMV_RES: the norm's weight (zero-centred) */
  bf16 *res, *xg;   /* GEMV_RES: the residual stream and the scaled copy [T, N] */
  const float *inv; /* GEMV_LATE: [T] */
};

/* The GEMV path (T <= c->gemv_maxt, K % 8 == 0, x and W 16-byte aligned: the caller checked)
 * with `mode`'s epilogue (GEMV_RES / GEMV_LATE only for T <= NORM_FOLD_MAXT). */
void cuda_gemm_gemv(cuda_ctx *c, int mode, const bf16 *x, const cuda_weight *W, int T, int K, int N,
                    bf16 *y, gemv_nf nf);
/* m <= GEMV_MULTI such products of one x in one launch (mode GEMV_PLAIN or GEMV_LATE). */
void cuda_gemm_gemv_multi(cuda_ctx *c, int mode, const bf16 *x, int T, int K, int m,
                          const cuda_weight *const *W, bf16 *const *y, const int *N, gemv_nf nf);
/* yg = x.Wg^T, yu = x.Wu^T, out = silu(yg) * yu in one launch (out may alias yg or yu). */
void cuda_gemm_glu(cuda_ctx *c, int mode, const bf16 *x, const cuda_weight *Wg,
                   const cuda_weight *Wu, int T, int K, int N, bf16 *yg, bf16 *yu, bf16 *out,
                   gemv_nf nf);
/* 1 when a product of this shape takes the narrow kernel (N <= 64, decode-sized T above the
 * GEMV path, K % 8 == 0, aligned operands, not --batch-invariant). */
int cuda_gemm_narrow_fits(const cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N,
                          const void *y);
/* m <= GEMV_MULTI narrow products of one x in one launch. */
void cuda_gemm_narrow(cuda_ctx *c, const bf16 *x, int T, int K, int m, const bf16 *const *W,
                      bf16 *const *y, const int *N);

/* cuda_fp8.cu: gives an FP8 weight its dequantized bf16 copy (w->bf; weight_pack): its bytes, 0
 * when it has one, -1 when out of device memory */
long long cuda_fp8_bf16_copy(cuda_ctx *c, cuda_weight *w);
/* 1 when a product of T rows of W takes the bf16 paths (a bf16 weight, or an FP8 one with its
 * bf16 copy at rows the FP8 kernels are not the faster at, or under --batch-invariant) */
int cuda_fp8_use_bf16(const cuda_ctx *c, const cuda_weight *w, int T);

#endif
