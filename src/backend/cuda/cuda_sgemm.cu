/* cuda_sgemm — skinny GEMMs on tensor cores: y[T, N] = x[T, K] . W[N, K]^T for the decode
 * steps of 5 .. 16 rows (between the GEMV path and cuBLAS), up to SG_MULTI products of one x in
 * one launch. These steps are bound by the weights' bytes; this kernel streams every weight
 * byte once from about four blocks per SM, where cuBLAS's kernels use few wide tiles, and wins
 * on the H200 at 8 rows. At 32 - 128 rows it loses to cuBLAS (so does a version staging x and W
 * through shared memory): cuBLAS takes those.
 *
 * Work split. A warp owns 16 output rows (one m16n8k16 row block) and all T rows of x (NT =
 * ceil(T / 8) column blocks, NT * 4 fp32 accumulators per lane); a block is SG_WARPS warps,
 * SG_ROWS = 64 output rows. The grid is (row tiles, S) where S splits K into slices of whole
 * SG_UNIT = 128 columns so that the grid has about SG_BLOCKS_PER_SM blocks per SM; S is a
 * function of (K,
 * the total N of the launch, the SM count) only. With S > 1 each block writes fp32 partial
 * sums to a workspace and a second kernel adds the S partials in slice order and writes y.
 * So a result depends on (T, K, total N) and nothing else: repeatable bits.
 *
 * Fragments without shuffles. The product sums over k, so any permutation of k applied to
 * both operands gives the same sum. Lane (g = lane / 4, t = lane % 4) loads 16 contiguous
 * bytes at column kb + 8t of W rows g and g + 8 and of x row g of each column block, for a
 * k block of 32 columns at kb: 8 values each. The first mma takes values 0-1 and 2-3 as its
 * k pairs (2t, 2t+1) and (2t+8, 2t+9), the second mma values 4-5 and 6-7: each of the 32
 * columns enters exactly once, paired the same way in A and B. Weights are read with
 * streaming loads (not kept in L1); x (T * K * 2 bytes, read by every warp) through L1/L2.
 * Rows past N (single product) and x rows past T read the last valid row and are not
 * written. */
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

CUDA_KTRACE_TU(cuda_sgemm_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

#define SG_WARPS 4
#define SG_ROWS (16 * SG_WARPS)
#define SG_UNIT 128
#define SG_MAXT 16
#define SG_BLOCKS_PER_SM 4 /* the grid's target size (K slices are added to reach it) */
#define SG_MAXN 32768      /* wider products (the logits) stay on cuBLAS, already at bandwidth */
#define SG_WS (4u << 20)   /* partial sums (~2.2 MB at most at 16 rows) */

typedef struct sg_set {
  const bf16 *W[SG_MULTI];
  void *y[SG_MULTI];
  int n0[SG_MULTI + 1]; /* first row of product i in the concatenated rows; n0[cnt] = total */
  int cnt;
} sg_set;

/* product index of concatenated row r (r < total) */
__device__ __forceinline__ int sg_seg(const sg_set &s, int r) {
  int i = 0;
  while (i + 1 < s.cnt && r >= s.n0[i + 1]) i++;
  return i;
}

__device__ __forceinline__ void sg_store(const sg_set &s, int y_f32, int r, int tok, float v) {
  int i = sg_seg(s, r), n = s.n0[i + 1] - s.n0[i];
  size_t o = (size_t)tok * n + (r - s.n0[i]);
  if (y_f32)
    ((float *)s.y[i])[o] = v;
  else
    ((bf16 *)s.y[i])[o] = f2bf(v);
}

template <int NT>
__global__ void __launch_bounds__(SG_WARPS * 32)
    k_sgemm(const bf16 *__restrict__ x, sg_set s, int T, int K, int S, int y_f32,
            float *__restrict__ ws) {
  pdl_enter();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int total = s.n0[s.cnt], rt = blockIdx.x, sl = blockIdx.y, nu = K / SG_UNIT;
  int u0 = (int)((long)sl * nu / S), u1 = (int)((long)(sl + 1) * nu / S);
  int r0 = rt * SG_ROWS + warp * 16;
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  if (r0 < total) {
    int seg = sg_seg(s, r0), nseg = s.n0[seg + 1] - s.n0[seg];
    int ra = r0 - s.n0[seg] + g, rb = ra + 8;
    ra = ra < nseg ? ra : nseg - 1;
    rb = rb < nseg ? rb : nseg - 1;
    const bf16 *wa = s.W[seg] + (size_t)ra * K + 8 * t, *wb = s.W[seg] + (size_t)rb * K + 8 * t;
    const bf16 *xg = x + 8 * t;
    uint4 A[4], B[4], An[4], Bn[4]; /* this unit's weights, the next unit's (in flight) */
    if (u0 < u1)
#pragma unroll
      for (int j = 0; j < 4; j++) {
        A[j] = ld_stream16(wa + u0 * SG_UNIT + 32 * j);
        B[j] = ld_stream16(wb + u0 * SG_UNIT + 32 * j);
      }
    for (int u = u0; u < u1; u++) {
      int kb = u * SG_UNIT;
      if (u + 1 < u1)
#pragma unroll
        for (int j = 0; j < 4; j++) {
          An[j] = ld_stream16(wa + kb + SG_UNIT + 32 * j);
          Bn[j] = ld_stream16(wb + kb + SG_UNIT + 32 * j);
        }
#pragma unroll
      for (int j = 0; j < 4; j++) {
        uint32_t a1[4] = {A[j].x, B[j].x, A[j].y, B[j].y};
        uint32_t a2[4] = {A[j].z, B[j].z, A[j].w, B[j].w};
#pragma unroll
        for (int i = 0; i < NT; i++) {
          int row = i * 8 + g < T ? i * 8 + g : T - 1;
          uint4 xv = __ldg((const uint4 *)xg + ((row * K + kb + 32 * j) >> 3));
          mma_bf16(acc[i], a1, xv.x, xv.y);
          mma_bf16(acc[i], a2, xv.z, xv.w);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; j++) {
        A[j] = An[j];
        B[j] = Bn[j];
      }
    }
  }
  /* accumulator (i, e): output row r0 + g (+ 8 for e >= 2), x row i * 8 + 2t + (e & 1) */
  if (S == 1) {
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int r = r0 + g + (e >= 2 ? 8 : 0), tok = i * 8 + 2 * t + (e & 1);
        if (r < total && tok < T) sg_store(s, y_f32, r, tok, acc[i][e]);
      }
    return;
  }
#pragma unroll
  for (int i = 0; i < NT; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int r = r0 + g + (e >= 2 ? 8 : 0), tok = i * 8 + 2 * t + (e & 1);
      if (r < total && tok < T) ws[((size_t)sl * T + tok) * total + r] = acc[i][e];
    }
}

/* y = the S slices' partial sums added in slice order, one thread per output element */
__global__ void k_sg_reduce(const float *__restrict__ ws, sg_set s, int T, int S, int y_f32) {
  pdl_enter();
  int total = s.n0[s.cnt];
  size_t n = (size_t)T * total;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
       e += (size_t)gridDim.x * blockDim.x) {
    float v = 0.f;
    for (int q = 0; q < S; q++) v += ws[(size_t)q * n + e];
    sg_store(s, y_f32, (int)(e % total), (int)(e / total), v);
  }
}

/* The S slices' sums (S > 1) */
static void sg_reduce(cuda_ctx *c, float *ws, const sg_set &s, int T, int total, int S, int y_f32) {
  if (S <= 1) return;
  k_sg_reduce<<<cuda_blocks((size_t)T * total, 256), 256, 0, c->st>>>(ws, s, T, S, y_f32);
  cuda_check_launch(c, "matmul (skinny GEMM sums)");
}

extern "C" int cuda_sgemm_init(cuda_ctx *c) {
  c->sg_ws = NULL;
  if (cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, c->device) != cudaSuccess)
    c->n_sm = 132;
  if (cudaMalloc(&c->sg_ws, SG_WS) != cudaSuccess) {
    cudaGetLastError();
    c->sg_ws = NULL;
    return -1;
  }
  return 0;
}

extern "C" void cuda_sgemm_release(cuda_ctx *c) {
  cudaFree(c->sg_ws);
  c->sg_ws = NULL;
}

int cuda_sgemm_fits(const cuda_ctx *c, int T, int K, int N, int multi) {
  return c->sg_ws && !c->batch_invariant && T > c->gemv_maxt && T <= SG_MAXT && K > 0 &&
         K % SG_UNIT == 0 && (size_t)T * K < (1u << 31) && N > 0 && N <= SG_MAXN &&
         (!multi || N % 16 == 0);
}

int cuda_sgemm(cuda_ctx *c, const bf16 *x, int T, int K, int m, const bf16 *const *W,
               void *const *y, const int *N, int y_f32) {
  if (m < 1 || m > SG_MULTI || ((uintptr_t)x & 15)) return 0;
  sg_set s;
  memset(&s, 0, sizeof s);
  int total = 0;
  for (int i = 0; i < m; i++) {
    if (!cuda_sgemm_fits(c, T, K, N[i], m > 1) || ((uintptr_t)W[i] & 15)) return 0;
    s.W[i] = W[i];
    s.y[i] = y[i];
    s.n0[i] = total;
    total += N[i];
  }
  if (total > SG_MAXN) return 0;
  for (int i = m; i <= SG_MULTI; i++) s.n0[i] = total;
  s.cnt = m;
  float *ws = (float *)c->sg_ws;
  int R = (total + SG_ROWS - 1) / SG_ROWS, nu = K / SG_UNIT;
  int S = (SG_BLOCKS_PER_SM * c->n_sm + R / 2) / R;
  if (S > nu) S = nu;
  if (S > 1 && (size_t)S * T * total * 4 > SG_WS) S = (int)(SG_WS / ((size_t)T * total * 4));
  if (S < 1) S = 1;
  dim3 grid(R, S);
  switch ((T + 7) / 8) {
// clang-format off
#define G(n)                                                                             \
  case n:                                                                                \
    k_sgemm<n><<<grid, SG_WARPS * 32, 0, c->st>>>(x, s, T, K, S, y_f32, ws);             \
    break;
    G(1) G(2)
#undef G
        // clang-format on
        default : return 0;
  }
  cuda_check_launch(c, "matmul (skinny GEMM)");
  sg_reduce(c, ws, s, T, total, S, y_f32);
  return 1;
}
