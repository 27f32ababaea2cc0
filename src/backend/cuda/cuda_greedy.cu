/* cuda_greedy — the greedy ids of a step of 1-4 rows without reading the whole lm-head in bf16.
 *
 * At one sequence the lm-head product (151,936 x 2,560 bf16 at the 4B shape: 0.78 GB) is ~8 %
 * of a decode step, and a greedy step needs only the first maximum of its logits. So the
 * lm-head is also kept as int8 rows with one scale per row (half the bytes), and a step, per
 * hidden row (the screen reads the int8 rows once for all of them):
 *
 *   1. normalises the row as the logits op does (xn, bf16) and makes an int16 copy of it
 *      (cuda_elem_gather_norm_q: xq = rint(xn / t), t = max |xn| / 32767);
 *   2. screens every vocabulary row r: a_r = s_r t sum_j q_rj xq_j (exact integer dot products,
 *      __dp2a), and a bound B_r with |a_r - z_r| <= B_r, where z_r is the logit the logits op
 *      computes (the GEMV's fp32 sums, gemv_row). hi_r = a_r + B_r is kept per row, and
 *      L = max_r (a_r - B_r) over the vocabulary (an atomic max of ordered ints);
 *   3. computes z_r exactly (gemv_row on the bf16 row, the logits op's bits) for the rows with
 *      hi_r >= L, and row 0, and takes the first maximum among them (argmax's rule).
 *
 * Every row that reaches the maximum has z_r >= z_{r*} >= L for the row r* that gives L, so
 * hi_r >= L: the rows left out cannot win, and ties are all computed. The id is therefore
 * argmax(logits) exactly, however loose B is; B's looseness only sets how many rows step 3
 * computes (~10-20 of 151,936 per hidden row on random weights).
 *
 * The bound, per row (constants from the int8 copy's making, k_greedy_quant):
 *   |w_j - q_j s| <= E (measured in double)           -> E * sum |xn|
 *   |xn_j - t xq_j| <= 0.51 t                          -> 0.51 t s sum |q_j|
 *   the float sum of the 32 exact int32 lane partials  -> 2 H t s (<= 1.5 H units of t s)
 *   the logits op's own rounding, (H/32 + 5) fp32 steps over sum |w_j xn_j| <= 127.01 s sum |xn|
 *                                                      -> (H/32 + 5) 8e-6 s sum |xn|
 *   the products forming a_r                           -> 2e-6 |a_r|
 * with the sums rounded up and a_r -+ B rounded outward. A row that is not finite makes the
 * screen decline at preparation; a hidden row that is not finite makes every row a candidate
 * (step 3 is then the full product, with argmax's NaN rules).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

CUDA_KTRACE_TU(cuda_greedy_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

#define PICK_WARPS 8 /* warps per pick block */
#define PICK_BLOCKS_MAX 1024

#define GREEDY_MAXT 4 /* hidden rows a step may have for the screen */

typedef void (*screen_fn)(const int8_t *, const float4 *, const int16_t *, const float *, int, int,
                          float *, int *);

struct cuda_greedy {
  const bf16 *W; /* the lm-head's bf16 rows (the weight's, not owned) */
  int H, V;
  int8_t *q;      /* [V, H] */
  float4 *rc;     /* [V] {s, E + rounding per |xn|, bound per t, 0} */
  float *hi;      /* [GREEDY_MAXT, V] the step's upper bounds */
  int *lmax;      /* [GREEDY_MAXT] the step's max lower bounds, ordered ints (reset by the pick) */
  int16_t *xq;    /* [GREEDY_MAXT, H] */
  float *xs;      /* [GREEDY_MAXT, 4] t, sum |xn|, not-finite flag */
  float *pv, *z0; /* [GREEDY_MAXT, PICK_BLOCKS_MAX] pick partials, [GREEDY_MAXT] z of row 0 */
  int *pi, *cnt;  /* [GREEDY_MAXT, PICK_BLOCKS_MAX], [GREEDY_MAXT] */
  unsigned long long *ncand;     /* rows computed exactly, summed over the steps */
  screen_fn sk[GREEDY_MAXT + 1]; /* the screen kernel for T hidden rows (NULL: not taken) */
  int scr_warps, scr_blocks[GREEDY_MAXT + 1], pick_blocks;
};

/* floats ordered as ints (atomicMax), and back */
__device__ __forceinline__ int gr_key(float f) {
  int k = __float_as_int(f);
  return k >= 0 ? k : k ^ 0x7fffffff;
}
__device__ __forceinline__ float gr_unkey(int k) {
  return __int_as_float(k >= 0 ? k : k ^ 0x7fffffff);
}
static int host_key_neg_inf(void) {
  float f = -INFINITY;
  int k;
  memcpy(&k, &f, sizeof k);
  return k >= 0 ? k : k ^ 0x7fffffff;
}

/* One warp per row: s = max |w| / 127, q = rint(w / s) in [-127, 127], E = max |w - q s| in
 * double; rc = {s, E (rounded up) + the logits op's rounding per |xn|, s (0.51 sum|q| + 2H)}. */
__global__ void k_greedy_quant(const bf16 *__restrict__ W, int H, int V, int8_t *q, float4 *rc,
                               int *bad) {
  int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= V) return;
  const bf16 *w = W + (size_t)r * H;
  float m = 0.f;
  int fin = 1;
  for (int j = lane; j < H; j += 32) {
    float v = bf2f(w[j]);
    fin &= isfinite(v) ? 1 : 0;
    m = fmaxf(m, fabsf(v));
  }
  m = warp_max(m);
  if (!__all_sync(0xffffffffu, fin)) {
    if (lane == 0) atomicExch(bad, 1);
    return;
  }
  float s = m / 127.f;
  double e = 0.0;
  int Q = 0;
  for (int j = lane; j < H; j += 32) {
    float v = bf2f(w[j]);
    int qq = s > 0.f ? (int)rintf(v / s) : 0;
    qq = max(-127, min(127, qq));
    q[(size_t)r * H + j] = (int8_t)qq;
    e = fmax(e, fabs((double)v - (double)qq * (double)s));
    Q += abs(qq);
  }
  for (int o = 16; o > 0; o >>= 1) {
    e = fmax(e, __shfl_xor_sync(0xffffffffu, e, o));
    Q += __shfl_xor_sync(0xffffffffu, Q, o);
  }
  if (lane == 0) {
    float eg = (float)(H / 32 + 5) * 8e-6f;
    float E = (float)(e * (1.0 + 1e-6)) + eg * s;
    rc[r] = make_float4(s, E, s * (0.51f * (float)Q + 2.f * (float)H), 0.f);
  }
}

/* Step 2. Each warp a run of rpw rows, R per iteration (the rows of all warps interleaved
 * instead read the same). Lane l holds xq's columns p 512 + 16 l .. + 15
 * (p < NP = H / 512) as int16 pairs. The next rows' weights are requested before this
 * iteration's sums are reduced. */
/* Which of M sums (a power of two) lane ends with after scr_tree. */
template <int M>
__device__ __forceinline__ int scr_lane_ix(int lane) {
  int ix = 0;
#pragma unroll
  for (int o = 16, n = M; n > 1; o >>= 1, n >>= 1)
    if (lane & o) ix += n / 2;
  return ix;
}

/* The M sums of 32 lane partials each in one tree: the sums halved between lane halves at
 * each of the first log2 M steps, then the butterfly; lane ends with sum scr_lane_ix<M>(lane)
 * (every group of 32 / M lanes with one). */
template <int M>
__device__ __forceinline__ float scr_tree(float (&v)[M], int lane) {
  int o = 16;
#pragma unroll
  for (int n = M; n > 1; n >>= 1, o >>= 1) {
#pragma unroll
    for (int j = 0; j < n / 2; j++) {
      float keep = (lane & o) ? v[j + n / 2] : v[j], give = (lane & o) ? v[j] : v[j + n / 2];
      v[j] = keep + __shfl_xor_sync(0xffffffffu, give, o);
    }
  }
  for (; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  return v[0];
}

/* A row's bounds from its integer sum S (as float), its constants kc and the hidden row's
 * scale t and sum |xn| x1 (the header's bound; every row a candidate when all). */
__device__ __forceinline__ void scr_bound(float S, float4 kc, float t, float x1, bool all, float &h,
                                          float &l) {
  float a = S * (kc.x * t);
  float B = __fmaf_ru(kc.y, x1, __fmaf_ru(kc.z, t, 2e-6f * fabsf(a)));
  h = all ? INFINITY : __fadd_ru(a, B);
  l = all ? -INFINITY : __fsub_rd(a, B);
}

/* Rows r .. min(r + R, r1) - 1 of q into w (zeros past r1), and row r + ri's constants (the
 * row this lane reports) into k. */
template <int NP, int R>
__device__ __forceinline__ void scr_load(uint4 (&w)[R][NP], float4 &k, const int8_t *q,
                                         const float4 *rc, int r, int r1, int lane, int ri) {
  const int H = NP * 512;
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int p = 0; p < NP; p++)
      w[i][p] = r + i < r1 ? ld_stream16(q + (size_t)(r + i) * H + p * 512 + lane * 16)
                           : make_uint4(0, 0, 0, 0);
  k = __ldg(rc + min(r + ri, r1 - 1));
}

template <int NP, int R>
__global__ void __launch_bounds__(256)
    k_greedy_screen(const int8_t *__restrict__ q, const float4 *__restrict__ rc, const int16_t *xq,
                    const float *xs, int V, int rpw, float *hi, int *lmax) {
  int lane = threadIdx.x & 31, gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int r = gw * rpw, rend = min(V, r + rpw);
  uint4 w[R][NP];
  float4 k;
  int rl = scr_lane_ix<R>(lane); /* this lane's row in each iteration */
  if (r < rend) scr_load<NP, R>(w, k, q, rc, r, min(rend, r + R), lane, rl);
  pdl_enter();
  int xr[NP][8];
#pragma unroll
  for (int p = 0; p < NP; p++) {
    const int4 *src = (const int4 *)(xq + p * 512 + lane * 16);
    int4 u = __ldcg(src), v = __ldcg(src + 1);
    xr[p][0] = u.x, xr[p][1] = u.y, xr[p][2] = u.z, xr[p][3] = u.w;
    xr[p][4] = v.x, xr[p][5] = v.y, xr[p][6] = v.z, xr[p][7] = v.w;
  }
  float t = __ldcg(xs), x1 = __ldcg(xs + 1);
  bool all = __ldcg(xs + 2) != 0.f;
  bool writer = (lane & (32 / R - 1)) == 0;
  float lo_max = -INFINITY;
  for (; r < rend; r += R) {
    int r1 = min(rend, r + R);
    int sacc[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
      sacc[i] = 0;
#pragma unroll
      for (int p = 0; p < NP; p++) {
        const unsigned a4[4] = {w[i][p].x, w[i][p].y, w[i][p].z, w[i][p].w};
#pragma unroll
        for (int m = 0; m < 4; m++) {
          sacc[i] = __dp2a_lo(xr[p][2 * m], (int)a4[m], sacc[i]);
          sacc[i] = __dp2a_hi(xr[p][2 * m + 1], (int)a4[m], sacc[i]);
        }
      }
    }
    float4 kc = k;
    if (r + R < rend) scr_load<NP, R>(w, k, q, rc, r + R, min(rend, r + 2 * R), lane, rl);
    float v[R];
#pragma unroll
    for (int i = 0; i < R; i++) v[i] = (float)sacc[i];
    float S = scr_tree<R>(v, lane); /* row r + rl's */
    int row = r + rl;
    if (row < r1) {
      float h, l;
      scr_bound(S, kc, t, x1, all, h, l);
      if (writer) hi[row] = h;
      lo_max = fmaxf(lo_max, l);
    }
  }
  __shared__ float red[33];
  float m = block_max(lo_max, red);
  if (threadIdx.x == 0) atomicMax(lmax, gr_key(m));
}

/* Step 2 for steps of T = 2..4 rows: the same per (hidden row, vocabulary row), the hidden
 * rows' int16 copies in shared memory (T H int16), each lane reading its 16 columns of piece p
 * of each hidden row once per iteration for its R vocabulary rows. The T R sums of an iteration
 * share one tree (padded to M, a power of two); lane groups of 32 / M end with one (t, row). */
template <int NP, int R, int T>
__global__ void __launch_bounds__(256)
    k_greedy_screen_m(const int8_t *__restrict__ q, const float4 *__restrict__ rc,
                      const int16_t *xq, const float *xs, int V, int rpw, float *hi, int *lmax) {
  constexpr int H = NP * 512, TR = T * R, M = TR <= 2 ? 2 : TR <= 4 ? 4 : 8;
  extern __shared__ int4 sx[]; /* [T][H / 8] */
  __shared__ float st[T][3];
  __shared__ int sl[T];
  int lane = threadIdx.x & 31, gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int r = gw * rpw, rend = min(V, r + rpw);
  uint4 w[R][NP];
  pdl_enter();
  for (int k = threadIdx.x; k < T * H / 8; k += blockDim.x) sx[k] = __ldcg((const int4 *)xq + k);
  if (threadIdx.x < T) {
    st[threadIdx.x][0] = __ldcg(xs + 4 * threadIdx.x);
    st[threadIdx.x][1] = __ldcg(xs + 4 * threadIdx.x + 1);
    st[threadIdx.x][2] = __ldcg(xs + 4 * threadIdx.x + 2);
    sl[threadIdx.x] = gr_key(-INFINITY);
  }
  int ix = scr_lane_ix<M>(lane); /* the (t, i) this lane reports: ix = t R + i */
  int my_t = ix / R, my_i = ix % R;
  bool valid_ix = ix < TR, writer = (lane & (32 / M - 1)) == 0;
  float4 k = make_float4(0.f, 0.f, 0.f, 0.f);
  if (r < rend) scr_load<NP, R>(w, k, q, rc, r, min(rend, r + R), lane, my_i);
  __syncthreads();
  float t_t = valid_ix ? st[my_t][0] : 0.f, x1_t = valid_ix ? st[my_t][1] : 0.f;
  bool all = valid_ix && st[my_t][2] != 0.f;
  float lo_max = -INFINITY;
  for (; r < rend; r += R) {
    int sacc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
      for (int i = 0; i < R; i++) sacc[t][i] = 0;
#pragma unroll
    for (int p = 0; p < NP; p++) {
#pragma unroll
      for (int t = 0; t < T; t++) {
        int4 u = sx[t * (H / 8) + p * 64 + lane * 2], u2 = sx[t * (H / 8) + p * 64 + lane * 2 + 1];
        const int xr[8] = {u.x, u.y, u.z, u.w, u2.x, u2.y, u2.z, u2.w};
#pragma unroll
        for (int i = 0; i < R; i++) {
          const unsigned a4[4] = {w[i][p].x, w[i][p].y, w[i][p].z, w[i][p].w};
#pragma unroll
          for (int m = 0; m < 4; m++) {
            sacc[t][i] = __dp2a_lo(xr[2 * m], (int)a4[m], sacc[t][i]);
            sacc[t][i] = __dp2a_hi(xr[2 * m + 1], (int)a4[m], sacc[t][i]);
          }
        }
      }
    }
    float4 kc = k;
    if (r + R < rend) scr_load<NP, R>(w, k, q, rc, r + R, min(rend, r + 2 * R), lane, my_i);
    float v[M];
#pragma unroll
    for (int j = 0; j < M; j++) v[j] = j < TR ? (float)sacc[j / R][j % R] : 0.f;
    float S = scr_tree<M>(v, lane);
    int row = r + my_i;
    if (valid_ix && row < rend) {
      float h, l;
      scr_bound(S, kc, t_t, x1_t, all, h, l);
      if (writer) hi[(size_t)my_t * V + row] = h;
      lo_max = fmaxf(lo_max, l);
    }
  }
  if (valid_ix) atomicMax(&sl[my_t], gr_key(lo_max));
  __syncthreads();
  if (threadIdx.x < T) atomicMax(lmax + threadIdx.x, sl[threadIdx.x]);
}

/* Step 3, for hidden row t = blockIdx.y: warps take groups of 32 rows; a row whose hi reaches L
 * (and row 0) is computed by the warp with gemv_row (the logits op's bits). Then argmax_split's
 * last-block reduction (per t). */
__global__ void __launch_bounds__(PICK_WARPS * 32)
    k_greedy_pick(const bf16 *__restrict__ xn, const bf16 *__restrict__ W, int H, int V,
                  const float *hi, int *lmax, float *pv, int *pi, int *cnt, float *z0,
                  unsigned long long *ncand, int32_t *ids) {
  pdl_enter();
  int t = blockIdx.y;
  xn += (size_t)t * H, hi += (size_t)t * V, lmax += t, cnt += t, z0 += t, ids += t;
  pv += (size_t)t * gridDim.x, pi += (size_t)t * gridDim.x;
  float L = gr_unkey(__ldcg(lmax));
  int lane = threadIdx.x & 31;
  int gw = blockIdx.x * PICK_WARPS + (threadIdx.x >> 5), nw = gridDim.x * PICK_WARPS;
  int ng = (V + 31) / 32;
  float v = -INFINITY;
  int i = INT32_MAX;
  for (int g = gw; g < ng; g += nw) {
    int r = g * 32 + lane;
    bool cand = r < V && (r == 0 || __ldcg(hi + r) >= L);
    unsigned m = __ballot_sync(0xffffffffu, cand);
    if (lane == 0 && m) atomicAdd(ncand, (unsigned long long)__popc(m));
    while (m) {
      int rr = g * 32 + __ffs(m) - 1;
      m &= m - 1;
      float acc[1];
      gemv_row<1, false>(xn, W + (size_t)rr * H, H, lane, acc);
      am_take(v, i, acc[0], rr);
      if (rr == 0 && lane == 0) *z0 = acc[0];
    }
  }
  am_block<PICK_WARPS * 32>(v, i);
  __shared__ int last;
  if (threadIdx.x == 0) {
    pv[blockIdx.x] = v;
    pi[blockIdx.x] = i;
    __threadfence();
    last = atomicAdd(cnt, 1) == (int)gridDim.x - 1;
    __threadfence();
  }
  __syncthreads();
  if (!last) return;
  v = -INFINITY;
  i = INT32_MAX;
  for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x)
    am_take(v, i, __ldcg(pv + b), __ldcg(pi + b));
  am_block<PICK_WARPS * 32>(v, i);
  if (threadIdx.x == 0) {
    if (i == INT32_MAX || isnan(__ldcg(z0))) i = 0;
    ids[0] = i;
    *cnt = 0;
    *lmax = gr_key(-INFINITY);
  }
}

static void greedy_free(cuda_greedy *g) {
  if (!g) return;
  cudaFree(g->q);
  cudaFree(g->rc);
  cudaFree(g->hi);
  cudaFree(g->lmax);
  cudaFree(g->xq);
  cudaFree(g->xs);
  cudaFree(g->pv);
  cudaFree(g->z0);
  cudaFree(g->pi);
  cudaFree(g->cnt);
  cudaFree(g->ncand);
  free(g);
}

void cuda_greedy_forget(cuda_ctx *c, const void *W_bf) {
  if (!c->greedy || (W_bf && c->greedy->W != W_bf)) return;
  greedy_free(c->greedy);
  c->greedy = NULL;
}

/* The screen's launch shape: SCREEN_ROWS vocabulary rows per iteration, SCREEN_WARPS warps per
 * block (1 or 2 rows and 4 or 8 warps read the same; these are the smaller code). */
#define SCREEN_ROWS 2
#define SCREEN_WARPS 4

/* The screen kernel for H = 512 NP (NP in 2, 4, 5, 6, 8) and T hidden rows (1..GREEDY_MAXT), or
 * NULL. */
template <int NP, int R>
static screen_fn screen_kernel_r(int T) {
  switch (T) {
    case 1:
      return k_greedy_screen<NP, R>;
    case 2:
      return k_greedy_screen_m<NP, R, 2>;
    case 3:
      return k_greedy_screen_m<NP, R, 3>;
    case 4:
      return k_greedy_screen_m<NP, R, 4>;
    default:
      return NULL;
  }
}
static screen_fn screen_kernel(int H, int T) {
  if (H % 512) return NULL;
  switch (H / 512) {
    case 2:
      return screen_kernel_r<2, SCREEN_ROWS>(T);
    case 4:
      return screen_kernel_r<4, SCREEN_ROWS>(T);
    case 5:
      return screen_kernel_r<5, SCREEN_ROWS>(T);
    case 6:
      return screen_kernel_r<6, SCREEN_ROWS>(T);
    case 8:
      return screen_kernel_r<8, SCREEN_ROWS>(T);
    default:
      return NULL;
  }
}

int cuda_greedy_prepare(backend *be, backend_weight W, int H, int V, char *err, size_t errlen) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (!screen_kernel(H, 1) || V < 2 || CW(W)->rows != V || CW(W)->cols != H) return 0;
  cuda_greedy_forget(c, NULL);
  cuda_greedy *g = (cuda_greedy *)calloc(1, sizeof *g);
  if (!g) return 0;
  g->W = CW(W)->bf;
  g->H = H;
  g->V = V;
  g->scr_warps = SCREEN_WARPS;
  for (int T = 1; T <= GREEDY_MAXT; T++) {
    int bps = 0;
    g->sk[T] = screen_kernel(H, T);
    if (g->sk[T] && T > 1 &&
        cudaFuncSetAttribute(g->sk[T], cudaFuncAttributeMaxDynamicSharedMemorySize, T * H * 2) !=
            cudaSuccess)
      g->sk[T] = NULL;
    if (g->sk[T] && cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                        &bps, g->sk[T], SCREEN_WARPS * 32, T > 1 ? T * H * 2 : 0) != cudaSuccess)
      g->sk[T] = NULL;
    cudaGetLastError();
    g->scr_blocks[T] = (bps > 0 ? bps : 1) * c->n_sm;
  }
  g->pick_blocks = std::min(PICK_BLOCKS_MAX, 2 * c->n_sm);
  int bad = 0, *d_bad = NULL;
  int neg[GREEDY_MAXT];
  for (int t = 0; t < GREEDY_MAXT; t++) neg[t] = host_key_neg_inf();
  const size_t TM = GREEDY_MAXT;
  if (cudaMalloc(&g->q, (size_t)V * H) != cudaSuccess ||
      cudaMalloc(&g->rc, (size_t)V * sizeof(float4)) != cudaSuccess ||
      cudaMalloc(&g->hi, TM * V * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&g->lmax, TM * sizeof(int)) != cudaSuccess ||
      cudaMalloc(&g->xq, TM * H * sizeof(int16_t)) != cudaSuccess ||
      cudaMalloc(&g->xs, TM * 4 * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&g->pv, TM * PICK_BLOCKS_MAX * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&g->z0, TM * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&g->pi, TM * PICK_BLOCKS_MAX * sizeof(int)) != cudaSuccess ||
      cudaMalloc(&g->cnt, TM * sizeof(int)) != cudaSuccess ||
      cudaMalloc(&g->ncand, sizeof(unsigned long long)) != cudaSuccess ||
      cudaMalloc(&d_bad, sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(d_bad);
    greedy_free(g);
    fprintf(stderr,
            "cuda: no device memory for the lm-head's int8 copy (%.0f MB): greedy steps "
            "read the bf16 lm-head\n",
            (double)V * H / 1e6);
    return 0;
  }
  cudaMemsetAsync(d_bad, 0, sizeof(int), c->st);
  cudaMemsetAsync(g->cnt, 0, TM * sizeof(int), c->st);
  cudaMemsetAsync(g->ncand, 0, sizeof(unsigned long long), c->st);
  cudaMemcpyAsync(g->lmax, neg, sizeof neg, cudaMemcpyHostToDevice, c->st);
  k_greedy_quant<<<(V + 7) / 8, 256, 0, c->st>>>(g->W, H, V, g->q, g->rc, d_bad);
  cudaMemcpyAsync(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost, c->st);
  cudaError_t e = cudaStreamSynchronize(c->st);
  cudaFree(d_bad);
  if (e != cudaSuccess) {
    greedy_free(g);
    cuda_fail(c, "greedy screen preparation", cudaGetErrorString(e));
    if (err && errlen) snprintf(err, errlen, "%s", c->err);
    return -1;
  }
  if (bad) { /* a row that is not finite: no bound holds */
    greedy_free(g);
    fprintf(stderr,
            "cuda: the lm-head has values that are not finite: greedy steps read it in "
            "bf16\n");
    return 0;
  }
  c->greedy = g;
  return 0;
}

int cuda_greedy_run(backend *be, backend_buf x, backend_weight norm, float eps, backend_weight W,
                    int H, int V, backend_buf ids) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_greedy *g = c->greedy;
  int T = c->b.n_out;
  if (!g || T < 1 || T > GREEDY_MAXT || !g->sk[T] || g->W != CW(W)->bf || g->H != H || g->V != V)
    return 0;
  void *xn = cuda_scratch(c, (size_t)T * H * 2);
  if (!xn) return 0;
  cuda_elem_gather_norm_q(be, x, norm, eps, H, xn, g->xq, g->xs);
  int warps = g->scr_blocks[T] * g->scr_warps;
  int rpw = (V + warps - 1) / warps;
  screen_fn screen = g->sk[T];
  size_t smem = T > 1 ? (size_t)T * H * 2 : 0;
  screen<<<g->scr_blocks[T], g->scr_warps * 32, smem, c->st>>>(g->q, g->rc, g->xq, g->xs, V, rpw,
                                                               g->hi, g->lmax);
  cuda_check_launch(c, "logits (greedy screen)");
  k_greedy_pick<<<dim3((unsigned)g->pick_blocks, (unsigned)T), PICK_WARPS * 32, 0, c->st>>>(
      (const bf16 *)xn, g->W, H, V, g->hi, g->lmax, g->pv, g->pi, g->cnt, g->z0, g->ncand,
      (int32_t *)ids);
  cuda_check_launch(c, "logits (greedy pick)");
  c->greedy_runs++;
  return 1;
}

extern "C" double backend_cuda_greedy_step_bytes(backend *be, int rows) {
  cuda_greedy *g = cuda_ctx_of(be)->greedy;
  if (!g || rows < 1 || rows > GREEDY_MAXT || !g->sk[rows]) return 0;
  /* the int8 rows and their float4 terms, each row's upper bound written and read, the
   * normed rows' int16 copies; the rows computed exactly (~10-60 of 5 KB) left out */
  return (double)g->V * g->H + (double)g->V * sizeof(float4) + 2.0 * rows * g->V * sizeof(float) +
         (double)rows * g->H * sizeof(int16_t);
}

extern "C" long backend_cuda_greedy_screened(backend *be, int *prepared, long long *rows) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (prepared) *prepared = c->greedy != NULL;
  if (rows) {
    unsigned long long n = 0;
    if (c->greedy && cudaStreamSynchronize(c->st) == cudaSuccess &&
        cudaMemcpy(&n, c->greedy->ncand, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess)
      *rows = (long long)n;
    else
      *rows = -1;
  }
  return c->greedy_runs;
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
  if (!c->am_cnt || (V & 3) || (((uintptr_t)x) & 15)) return 1;
  int nb = 64 / n; /* ~64 blocks in all: a row's chunks of >= 256 float4 at Qwen's vocabulary */
  while (nb > 1 && (size_t)n * nb > ARGMAX_PARTS) nb--;
  return nb;
}

extern "C" void cuda_greedy_argmax(backend *be, backend_buf x, int n, int V, backend_buf ids,
                                   backend_buf maxv) {
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
extern "C" void cuda_greedy_logits_argmax(backend *be, backend_buf x, backend_weight norm,
                                          float eps, backend_weight W, int H, int V,
                                          backend_buf logits, backend_buf ids) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->b.n_out <= 0 || cuda_greedy_run(be, x, norm, eps, W, H, V, ids)) return;
  cuda_gemm_logits(be, x, norm, eps, W, H, V, logits);
  cuda_greedy_argmax(be, logits, c->b.n_out, V, ids, NULL);
}
