/* cuda_moe — the sparse MoE FFN: router logits from the fp32 router copy (cuBLAS on the bf16
 * copy for routers over 1024 experts), routing (fp32 softmax, top-k
 * with ties to the lower expert id, optional renormalisation, shared-expert gate), then
 * per-row kernels: the routed experts and the shared expert (as one more slot of each row) as
 * warp-per-output dot products over bf16 weights, one launch for gate/up and one for down and
 * the weighted sum. Each output's sums run in a fixed order that depends only on its row.
 * Steps of >= 64 rows (not under --batch-invariant) send the routed experts through per-expert
 * cuBLAS GEMMs over the rows grouped by expert ("grouped path" below; the shared expert as
 * dense cuBLAS GEMMs): each expert's weights
 * read once per chunk of rows instead of once per routed row (Qwen3.5-35B-A3B layer shape,
 * H200: several times faster at prefill).
 * Grouped steps of at most moe_dev_max (512) rows (decode steps of many sequences) run the
 * experts' products in two launches of our own over the grouped rows instead ("device-grouped"
 * below): the per-expert GEMMs need the group sizes on the host (a sync in mid-step, so no CUDA
 * graph) and hundreds of tiny launches per layer. Steps of moe_dev_min (8) to 63 rows take it
 * too (faster than the per-row kernels there). The per-row and device-grouped paths never wait
 * for the host, so a decode step's MoE ops are recorded into its CUDA graph (cuda_moe_records).
 *
 * FP8 experts (weight_upload_fp8, all of a layer's with one block shape; docs/fp8.md) stay FP8:
 * the per-row and device-grouped kernels have FP8 forms that read e4m3 rows with their block
 * scales as the dense FP8 GEMV rows do (cuda_fp8.cuh); the per-expert cuBLAS path dequantizes
 * each expert with rows into scratch first (cuda_fp8_dequant), as it does an FP8 shared expert.
 *
 * Expert weight pointers reach the kernels through per-layer device tables, built on first use
 * of a layer (keyed by its host array of gate weights), checked against the weights on every
 * call that is not a graph replay (rebuilt when they changed; freeing a weight drops every
 * graph) and freed with the backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fp8.cuh"
#include "backend/cuda/cuda_ops.h"

CUDA_KTRACE_TU(cuda_moe_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

#define MOE_MAX_LAYERS 256
#define MOE_MAX_K 32

/* One layer's expert pointer table: the host copy decides whether the device copy is still
 * right (the same host array may describe other weights later, e.g. after a reload). The
 * experts of a layer are all bf16 or all FP8 (weight_upload_fp8) with one block shape; an FP8
 * table's second half holds the scale matrices. */
typedef struct moe_table {
  const backend_weight *key;
  int n;
  const void **h; /* host [6, E] */
  const void **d; /* device [6, E]: gate, up, down (bf16 or e4m3), then their scales (FP8) */
  int f8, bn, bk; /* FP8 experts and their block shape */
} moe_table;

/* The matrix the expert kernels read: the e4m3 bytes of an FP8 weight, else its bf16 */
static const void *moe_wptr(backend_weight w) {
  return CW(w)->q8 ? (const void *)CW(w)->q8 : (const void *)CW(w)->bf;
}

static const void **moe_table_get(cuda_ctx *c, const backend_moe *m, const void *const **host,
                                  const moe_table **info) {
  int E = m->n_experts;
  moe_table *t = NULL;
  for (int i = 0; i < c->n_moe_tables && !t; i++)
    if (c->moe_tables[i].key == m->gate && c->moe_tables[i].n == E) t = &c->moe_tables[i];
  if (t) {
    int same = 1;
    for (int e = 0; e < E && same; e++)
      same = t->h[e] == moe_wptr(m->gate[e]) && t->h[E + e] == moe_wptr(m->up[e]) &&
             t->h[2 * E + e] == moe_wptr(m->down[e]) && t->h[3 * E + e] == CW(m->gate[e])->s8 &&
             t->h[4 * E + e] == CW(m->up[e])->s8 && t->h[5 * E + e] == CW(m->down[e])->s8;
    if (same) {
      if (host) *host = t->h;
      *info = t;
      return t->d;
    }
  }
  /* one format and block shape for every expert of the layer (the kernels take one) */
  const cuda_weight *w0 = CW(m->gate[0]);
  for (int e = 0; e < 3 * E; e++) {
    const cuda_weight *w = CW(e < E ? m->gate[e] : e < 2 * E ? m->up[e - E] : m->down[e - 2 * E]);
    if (!w->q8 != !w0->q8 || (w->q8 && (w->bn != w0->bn || w->bk != w0->bk)) ||
        (!w->q8 && !w->bf)) {
      cuda_fail(c, "moe", "the experts of a layer mix bf16 and FP8 weights or FP8 block shapes");
      return NULL;
    }
  }
  if (c->capturing) { /* no allocation or copy inside a capture: the step runs as issued instead */
    c->capture_broken = 1;
    return NULL;
  }
  int stale = t != NULL; /* an existing table whose weights changed */
  if (!t) {
    if (c->n_moe_tables == MOE_MAX_LAYERS) {
      cuda_fail(c, "moe", "too many MoE layers");
      return NULL;
    }
    t = &c->moe_tables[c->n_moe_tables];
    memset(t, 0, sizeof *t);
    t->h = (const void **)calloc(6 * (size_t)E, sizeof *t->h);
    if (!t->h || cudaMalloc((void **)&t->d, 6 * (size_t)E * sizeof *t->d) != cudaSuccess) {
      cudaGetLastError();
      free(t->h);
      cuda_fail(c, "moe", "out of memory for the expert table");
      return NULL;
    }
    t->key = m->gate;
    t->n = E;
    c->n_moe_tables++;
  }
  if (stale) cudaStreamSynchronize(c->st); /* earlier launches may still read the old table */
  for (int e = 0; e < E; e++) {
    t->h[e] = moe_wptr(m->gate[e]);
    t->h[E + e] = moe_wptr(m->up[e]);
    t->h[2 * E + e] = moe_wptr(m->down[e]);
    t->h[3 * E + e] = CW(m->gate[e])->s8;
    t->h[4 * E + e] = CW(m->up[e])->s8;
    t->h[5 * E + e] = CW(m->down[e])->s8;
  }
  t->f8 = w0->q8 != NULL;
  t->bn = w0->bn;
  t->bk = w0->bk;
  if (cudaMemcpy(t->d, t->h, 6 * (size_t)E * sizeof *t->d, cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaGetLastError();
    cuda_fail(c, "moe", "cannot upload the expert table");
    return NULL;
  }
  if (host) *host = t->h;
  *info = t;
  return t->d;
}

/* The router kernel's arrival counters (k_moe_router's LAST form), zeroed; 0 on success. */
int cuda_moe_init(cuda_ctx *c) {
  c->moe_tables = (moe_table *)calloc(MOE_MAX_LAYERS, sizeof *c->moe_tables);
  return !c->moe_tables || cuda_zeroed_ints(&c->moe_cnt, MOE_CNT);
}

/* Frees the expert tables of one backend (called by its destroy). */
void cuda_moe_release(cuda_ctx *c) {
  cudaFree(c->moe_cnt);
  c->moe_cnt = NULL;
  for (int i = 0; i < c->n_moe_tables; i++) {
    cudaFree(c->moe_tables[i].d);
    free(c->moe_tables[i].h);
  }
  free(c->moe_tables);
  c->moe_tables = NULL;
  c->n_moe_tables = 0;
}

/* Per-row kernels (steps of fewer than moe_dev_min rows, every step under --batch-invariant):
 * the routed experts of each row and its shared expert as one more slot, every input read
 * straight from global memory (no shared-memory copies: the rows are L1/L2-resident), each
 * lane's weight loads issued together. Dot products: per-lane partial sums over 16-byte pieces
 * (lane l takes values 8 l + 256 j) in piece order, then the xor tree; rows whose width is no
 * multiple of 8 (or unaligned) fall back to value-strided lanes. */

/* w . x over n values, one warp (bf16 w and x) */
__device__ __forceinline__ float moe_dot_bb(const bf16 *w, const bf16 *x, int n) {
  int lane = threadIdx.x & 31;
  float acc = 0.f;
  if ((n & 7) == 0 && (((uintptr_t)w | (uintptr_t)x) & 15) == 0) {
#pragma unroll 4
    for (int i = lane * 8; i < n; i += 256) {
      float wf[8], xf[8];
      bf16x8_to_f32(ld_stream16(w + i), wf);
      bf16x8_to_f32(__ldg((const uint4 *)(x + i)), xf);
#pragma unroll
      for (int k = 0; k < 4; k++) acc += wf[2 * k] * xf[2 * k] + wf[2 * k + 1] * xf[2 * k + 1];
    }
  } else {
    for (int i = lane; i < n; i += 32) acc += bf2f(w[i]) * bf2f(x[i]);
  }
  return warp_sum(acc);
}

/* Two products over the same x (gate and up rows), their loads interleaved. */
__device__ __forceinline__ void moe_dot2_bb(const bf16 *wg, const bf16 *wu, const bf16 *x, int n,
                                            float *g, float *u) {
  int lane = threadIdx.x & 31;
  if ((n & 7) == 0 && (((uintptr_t)wg | (uintptr_t)wu | (uintptr_t)x) & 15) == 0) {
    float ag = 0.f, au = 0.f;
#pragma unroll 4
    for (int i = lane * 8; i < n; i += 256) {
      float gf[8], uf[8], xf[8];
      bf16x8_to_f32(ld_stream16(wg + i), gf);
      bf16x8_to_f32(ld_stream16(wu + i), uf);
      bf16x8_to_f32(__ldg((const uint4 *)(x + i)), xf);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        ag += gf[2 * k] * xf[2 * k] + gf[2 * k + 1] * xf[2 * k + 1];
        au += uf[2 * k] * xf[2 * k] + uf[2 * k + 1] * xf[2 * k + 1];
      }
    }
    *g = warp_sum(ag);
    *u = warp_sum(au);
  } else {
    *g = moe_dot_bb(wg, x, n);
    *u = moe_dot_bb(wu, x, n);
  }
}

/* What routing reads and writes (k_moe_route, k_moe_router's LAST form). */
struct moe_route_args {
  const float *lg;  /* [T, E] router logits */
  const bf16 *x;    /* [T, H] (the shared gate's logit when sgl is NULL) */
  const float *seg; /* [H] shared expert gate row, or NULL */
  const float *sgl; /* [T] the shared gate's logit from the router kernel, or NULL */
  int T, E, k, norm, H;
  const void *const *tab; /* expert tables, or NULL (grouped steps) */
  const void **wsel;      /* [T, k, nw] */
  int nw;                 /* 3 (bf16 experts: gate, up, down) or 6 (FP8: and their scales) */
  int32_t *ids;
  float *wts, *sg;
};

/* a float another block of this kernel wrote (LDCG: through L2, past a stale L1 line) */
template <int LDCG>
__device__ __forceinline__ float moe_ldf(const float *p) {
  return LDCG ? __ldcg(p) : *p;
}

/* a float as an unsigned key in its order (-0 as +0, so equal floats give equal keys); NaN 0,
 * below every float (-inf is 0x007fffff) */
__device__ __forceinline__ unsigned moe_order_key(float f) {
  if (f != f) return 0u;
  unsigned u = __float_as_uint(f == 0.f ? 0.f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* One warp routes row t: softmax over E logits, top-k (ties to the lower expert id; a round
 * with no ordered candidate left, i.e. NaN logits, takes the lowest untaken id, as the CPU
 * backend does), weights, shared gate (sigmoid of sgl[t] when the router kernel computed its
 * logit, else of x_t . seg here). V > 0: the row's logits held in registers, V per lane
 * (E <= 32 V), also as ordered keys (moe_order_key), the taken experts as bits, a round two
 * warp reductions (the largest key, then the lowest expert holding it); V == 0: any E, the
 * logits read again each round, (value, expert) pairs through five shuffle steps.
 * With tab, the chosen experts' gate, up and down bases (and, FP8, their scales) also go to
 * wsel[t, r, 0..nw) (one dependent load fewer for the per-row kernels). LDCG: the logits and sgl
 * were written by other blocks of the same kernel (k_moe_router's last block), read through L2. */
template <int V, int LDCG>
__device__ __forceinline__ void moe_route_row(const moe_route_args &a, int t) {
  int lane = threadIdx.x & 31;
  const int E = a.E, k = a.k;
  const float *l = a.lg + (size_t)t * E;
  float v[V > 0 ? V : 1];
  float mx = -INFINITY, sum = 0.f;
  if (V > 0) {
#pragma unroll
    for (int q = 0; q < V; q++) {
      v[q] = lane + 32 * q < E ? moe_ldf<LDCG>(l + lane + 32 * q) : -INFINITY;
      if (lane + 32 * q < E) mx = fmaxf(mx, v[q]);
    }
    mx = warp_max(mx);
#pragma unroll
    for (int q = 0; q < V; q++)
      if (lane + 32 * q < E) sum += expf(v[q] - mx);
  } else {
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, moe_ldf<LDCG>(l + e));
    mx = warp_max(mx);
    for (int e = lane; e < E; e += 32) sum += expf(moe_ldf<LDCG>(l + e) - mx);
  }
  sum = warp_sum(sum);
  unsigned tk = 0; /* V > 0: bit q set when expert lane + 32 q is taken */
  int chosen[V > 0 ? 1 : MOE_MAX_K];
  int my_id = 0;
  float my_w = 0.f, s = 0.f;
  unsigned kq[V > 0 ? V : 1]; /* V > 0: the logits as ordered keys, 0 past E */
  if (V > 0) {
#pragma unroll
    for (int q = 0; q < V; q++) kq[q] = lane + 32 * q < E ? moe_order_key(v[q]) : 0u;
  }
  for (int r = 0; r < k; r++) {
    float bv = -INFINITY;
    int bi = 0x7fffffff, fu = 0x7fffffff;
    if (V > 0) {
      /* the lane's largest untaken key (its lowest expert among equal ones), then the warp's
       * largest and, among lanes holding it, the lowest expert: two warp reductions a round */
      unsigned kb = 0;
      int li = 0x7fffffff;
      float lv = -INFINITY;
#pragma unroll
      for (int q = 0; q < V; q++) {
        int e = lane + 32 * q;
        if (e >= E || ((tk >> q) & 1u)) continue;
        fu = min(fu, e);
        if (kq[q] > kb) {
          kb = kq[q];
          li = e;
          lv = v[q];
        }
      }
      unsigned m = __reduce_max_sync(0xffffffffu, kb);
      if (m == 0) { /* only NaNs left */
        bi = (int)__reduce_min_sync(0xffffffffu, (unsigned)fu);
        bv = moe_ldf<LDCG>(l + bi);
      } else {
        bi = (int)__reduce_min_sync(0xffffffffu, kb == m ? (unsigned)li : 0xffffffffu);
        bv = __shfl_sync(0xffffffffu, lv, bi & 31);
      }
    } else {
      for (int e = lane; e < E; e += 32) {
        int taken = 0;
        for (int q = 0; q < r; q++) taken |= chosen[q] == e;
        if (taken) continue;
        fu = min(fu, e);
        float lv = moe_ldf<LDCG>(l + e);
        if (lv > bv || (lv == bv && e < bi)) {
          bv = lv;
          bi = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        fu = min(fu, __shfl_xor_sync(0xffffffffu, fu, o));
        if (ov > bv || (ov == bv && oi < bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if (bi == 0x7fffffff) { /* only NaNs left */
        bi = fu;
        bv = moe_ldf<LDCG>(l + bi);
      }
    }
    if (V > 0) {
      if ((bi & 31) == lane) tk |= 1u << (bi >> 5);
    } else {
      chosen[r] = bi;
    }
    float w = expf(bv - mx) / sum;
    s += w;
    if (lane == r) my_id = bi, my_w = w;
  }
  if (lane < k) {
    size_t o = (size_t)t * k + lane;
    a.ids[o] = my_id;
    a.wts[o] = a.norm ? my_w / s : my_w;
    if (a.tab)
      for (int j = 0; j < a.nw; j++) a.wsel[a.nw * o + j] = a.tab[j * E + my_id];
  }
  if (a.sgl) {
    if (lane == 0) a.sg[t] = sigmoidf_dev(moe_ldf<LDCG>(a.sgl + t));
  } else if (a.seg) {
    const bf16 *xr = a.x + (size_t)t * a.H;
    float d = 0.f;
    for (int i = lane; i < a.H; i += 32) d += bf2f(xr[i]) * a.seg[i];
    d = warp_sum(d);
    if (lane == 0) a.sg[t] = sigmoidf_dev(d);
  }
}

/* One warp per row (moe_route_row). */
template <int V>
__global__ void k_moe_route(moe_route_args a) {
  pdl_enter();
  int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= a.T) return;
  moe_route_row<V, 0>(a, t);
}

/* k_moe_route for E experts: logits in registers up to 1024 */
static void moe_route_launch(cuda_ctx *c, const moe_route_args &a) {
  dim3 g((a.T + 7) / 8);
  if (a.E <= 256)
    k_moe_route<8><<<g, 256, 0, c->st>>>(a);
  else if (a.E <= 512)
    k_moe_route<16><<<g, 256, 0, c->st>>>(a);
  else if (a.E <= 1024)
    k_moe_route<32><<<g, 256, 0, c->st>>>(a);
  else
    k_moe_route<0><<<g, 256, 0, c->st>>>(a);
  cuda_check_launch(c, "moe (route)");
}

#define MOE_RW 2 /* router rows (warps) per block: ~E / 2 blocks spread the router's read */

/* grid (T, ceil((E + S) / MOE_RW)), MOE_RW warps; S = 1 with a shared expert: lg[t, e] =
 * R_e . x_t with the fp32 router copy for e < E, sgl[t] = seg . x_t for row E.
 * LAST (where the arrival counters cover the step; it saves the route launch at decode):
 * the last of a row's blocks to finish (a counter per row, fenced, reset by that block) routes
 * the row with warp 0 (moe_route_row, the route kernel's arithmetic: the same bits), so the
 * route launch goes. Both sum each logit in the same order. */

/* acc += r[i .. i+4) . x[i .. i+4) (fp32 router piece a, bf16 x) */
__device__ __forceinline__ void moe_router_piece(float &acc, float4 a, const bf16 *xr, int i) {
  uint2 xb = __ldg((const uint2 *)(xr + i));
  float2 x0 = __bfloat1622float2(*(const __nv_bfloat162 *)&xb.x),
         x1 = __bfloat1622float2(*(const __nv_bfloat162 *)&xb.y);
  acc += a.x * x0.x + a.y * x0.y + a.z * x1.x + a.w * x1.y;
}

template <int LAST, int V>
__global__ void k_moe_router(const bf16 *x, const float *R, const float *seg, int E, int H,
                             float *lg, float *sgl, int *cnt, moe_route_args ra) {
  int t = blockIdx.x, e = blockIdx.y * MOE_RW + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  int valid = !(e > E || (e == E && !seg));
  const float *r = valid ? (e < E ? R + (size_t)e * H : seg) : R;
  const bf16 *xr = x + (size_t)t * H;
  int vec = (H & 127) == 0 && (((uintptr_t)r & 15) | ((uintptr_t)xr & 7)) == 0;
  pdl_enter();
  if (!LAST && !valid) return;
  if (valid) {
    float acc = 0.f;
    if (vec) {
      int i = lane * 4;
#pragma unroll 16
      for (; i < H; i += 128) moe_router_piece(acc, __ldg((const float4 *)(r + i)), xr, i);
    } else {
      for (int i = lane; i < H; i += 32) acc += r[i] * bf2f(xr[i]);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      if (e < E)
        lg[(size_t)t * E + e] = acc;
      else
        sgl[t] = acc;
      if (LAST) __threadfence(); /* before the block's arrival */
    }
  }
  if (LAST) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomicAdd(cnt + t, 1) == (int)gridDim.y - 1;
      if (last) {
        cnt[t] = 0;
        __threadfence(); /* the other blocks' logits, seen through L2 below */
      }
    }
    __syncthreads();
    if (last && threadIdx.x < 32) moe_route_row<V, 1>(ra, t);
  }
}

/* hid[t, r I + i] = silu(wg . x_t) * (wu . x_t): one output of k_moe_hidden (a warp) */
__device__ __forceinline__ void moe_hidden_out(const bf16 *x, const bf16 *wg, const bf16 *wu, int t,
                                               int r, int i, int k, int H, int I, int Is,
                                               float *hid) {
  float gv, uv;
  moe_dot2_bb(wg, wu, x + (size_t)t * H, H, &gv, &uv);
  if ((threadIdx.x & 31) == 0)
    hid[(size_t)t * ((size_t)k * I + Is) + (size_t)r * I + i] = siluf_dev(gv) * uv;
}

/* grid (T (k + S), ceil(max(I, Is) / 8)), 8 warps, a warp per output i of slot r of row t:
 * r < k the routed expert of wsel[t, r] (width I), r == k the shared expert (S = 1, width Is):
 * hid[t, r I + i] = silu(gate[i] . x_t) * (up[i] . x_t), rows of hid k I + Is wide.
 * The shared expert's blocks compute their outputs before the wait: x is the MoE input's norm, done
 * before the router (the kernel two back) began, their weights are weights, and the kernel before
 * (route, or the router's last blocks) neither reads nor writes hid; only the routed slots need the
 * route's wsel. */
__global__ void k_moe_hidden(const bf16 *x, const void *const *wsel, int k, int S, int H, int I,
                             int Is, const bf16 *sgw, const bf16 *suw, float *hid) {
  int ks = k + S, t = blockIdx.x / ks, r = blockIdx.x % ks;
  int i = blockIdx.y * 8 + (threadIdx.x >> 5);
  if (r == k) {
    if (i < Is)
      moe_hidden_out(x, sgw + (size_t)i * H, suw + (size_t)i * H, t, r, i, k, H, I, Is, hid);
    pdl_enter(); /* every block still waits before it exits */
    return;
  }
  pdl_enter();
  if (i >= (r < k ? I : Is)) return;
  const bf16 *wg, *wu;
  if (r < k) {
    const void *const *p = wsel + 3 * ((size_t)t * k + r);
    wg = (const bf16 *)p[0] + (size_t)i * H;
    wu = (const bf16 *)p[1] + (size_t)i * H;
  } else {
    wg = sgw + (size_t)i * H;
    wu = suw + (size_t)i * H;
  }
  moe_hidden_out(x, wg, wu, t, r, i, k, H, I, Is, hid);
}

#define MOE_DQ 8 /* slots whose down rows a warp requests at once */

/* The weights of two pieces (from value i0) of every slot q < nq, rows n wide. */
__device__ __forceinline__ void moe_down_load(uint4 (&wv)[MOE_DQ][2], const bf16 *const *wp, int nq,
                                              int j, int n, int i0) {
#pragma unroll
  for (int q = 0; q < MOE_DQ; q++)
#pragma unroll
    for (int u = 0; u < 2; u++)
      if (q < nq && i0 + 256 * u < n) wv[q][u] = ld_stream16(wp[q] + (size_t)j * n + i0 + 256 * u);
}

/* p[q] += wv[q][u] . h[q n + i0 + 256 u ...] for the pieces inside the row (q < nq) */
__device__ __forceinline__ void moe_down_use(float (&p)[MOE_DQ], const uint4 (&wv)[MOE_DQ][2],
                                             int nq, const float *h, int n, int i0) {
#pragma unroll
  for (int q = 0; q < MOE_DQ; q++)
#pragma unroll
    for (int u = 0; u < 2; u++) {
      int i = i0 + 256 * u;
      if (q >= nq || i >= n) continue;
      float wf[8];
      bf16x8_to_f32(wv[q][u], wf);
      const float4 *hp = (const float4 *)(h + (size_t)q * n + i);
      float4 a = __ldg(hp), b = __ldg(hp + 1);
      p[q] += wf[0] * a.x + wf[1] * a.y;
      p[q] += wf[2] * a.z + wf[3] * a.w;
      p[q] += wf[4] * b.x + wf[5] * b.y;
      p[q] += wf[6] * b.z + wf[7] * b.w;
    }
}

/* acc + sum over q < nq (slot order) of ww[q] (wp[q][j] . h[q n ...]), rows n wide; the
 * weights of two pieces of every slot are requested before any is used (PRE: the first two
 * pieces' are in pre already, moe_down_load) */
template <int PRE>
__device__ __forceinline__ float moe_down_slots(float acc, const bf16 *const *wp, const float *ww,
                                                int nq, int j, const float *h, int n, int vec,
                                                const uint4 (&pre)[MOE_DQ][2]) {
  int lane = threadIdx.x & 31;
  float p[MOE_DQ];
#pragma unroll
  for (int q = 0; q < MOE_DQ; q++) p[q] = 0.f;
  if (vec) {
    int i0 = lane * 8;
    if (PRE) {
      moe_down_use(p, pre, nq, h, n, i0);
      i0 += 512;
    }
    for (; i0 < n; i0 += 512) {
      uint4 wv[MOE_DQ][2];
      moe_down_load(wv, wp, nq, j, n, i0);
      moe_down_use(p, wv, nq, h, n, i0);
    }
  } else {
    for (int q = 0; q < nq; q++)
      for (int i = lane; i < n; i += 32)
        p[q] += bf2f(wp[q][(size_t)j * n + i]) * h[(size_t)q * n + i];
  }
#pragma unroll
  for (int q = 0; q < MOE_DQ; q++) {
    if (q >= nq) break;
    acc += ww[q] * warp_sum(p[q]);
  }
  return acc;
}

/* grid (T, ceil(H / 8)), 8 warps, a warp per output j: out[t, j] = sum_r w_r down_r[j] .
 * hid[t, r] (slot order; down_r = wsel[t, r, 2]) + sg[t] sdown[j] . hid[t, shared] (sdw: the
 * shared expert). The slots, their weights and the first pieces of the first slots' down rows
 * are read before the wait — wsel, wts and sg come from the route kernel, two
 * launches back, done before this one may start; only hid is the previous kernel's. */
__global__ void __launch_bounds__(256, 2)
    k_moe_down(const float *hid, const void *const *wsel, const float *wts, int k, int H, int I,
               int Is, const float *sg, const bf16 *sdw, bf16 *out) {
  __shared__ const bf16 *wp[MOE_MAX_K + 1];
  __shared__ float ww[MOE_MAX_K + 1];
  int t = blockIdx.x;
  size_t hw = (size_t)k * I + (sdw ? Is : 0);
  if (threadIdx.x < k) {
    wp[threadIdx.x] = (const bf16 *)wsel[3 * ((size_t)t * k + threadIdx.x) + 2];
    ww[threadIdx.x] = wts[(size_t)t * k + threadIdx.x];
  } else if (sdw && threadIdx.x == k) {
    wp[k] = sdw;
    ww[k] = sg[t];
  }
  __syncthreads();
  int j = blockIdx.y * 8 + (threadIdx.x >> 5);
  int vec = (I & 7) == 0 && (!sdw || (Is & 7) == 0) && (hw & 3) == 0 && ((uintptr_t)hid & 15) == 0;
  uint4 pre[MOE_DQ][2];
  if (vec && j < H) moe_down_load(pre, wp, min(MOE_DQ, k), j, I, (threadIdx.x & 31) * 8);
  pdl_enter();
  if (j >= H) return;
  const float *h = hid + (size_t)t * hw;
  float acc = 0.f;
  int r0 = 0;
  if (vec) {
    acc = moe_down_slots<1>(acc, wp, ww, min(MOE_DQ, k), j, h, I, vec, pre);
    r0 = MOE_DQ;
  }
  for (; r0 < k; r0 += MOE_DQ)
    acc = moe_down_slots<0>(acc, wp + r0, ww + r0, min(MOE_DQ, k - r0), j, h + (size_t)r0 * I, I,
                            vec, pre);
  if (sdw) acc = moe_down_slots<0>(acc, wp + k, ww + k, 1, j, h + (size_t)k * I, Is, vec, pre);
  if ((threadIdx.x & 31) == 0) out[(size_t)t * H + j] = f2bf(acc);
}

/* ---- FP8 experts (weight_upload_fp8): the per-row kernels ----
 * k_moe_hidden8 / k_moe_down8 have k_moe_hidden / k_moe_down's grids, slots and order of sums;
 * wsel[t, r] holds the expert's gate, up and down e4m3 matrices, then their scale matrices.
 * A weight row is read as the dense FP8 GEMV rows read theirs (cuda_fp8.cuh f8_rows): 16 e4m3
 * per 16-byte lane load, each byte's bits placed in a float (exactly the value times 2^-120),
 * the 16 products summed in fp32 and the sum scaled once by the block's scale (times 2^120);
 * rows whose width or block shape the pieces do not fit take value-strided lanes, each value
 * scaled. The shared expert is bf16 (the bf16 kernels' dot products) or FP8 with a block shape
 * of its own. */

/* The shared expert as the FP8 kernels take it: bf16 (g, u, d) or FP8 (q*, s*, bn x bk). */
struct moe_sh {
  const bf16 *g, *u, *d;
  const uint8_t *qg, *qu, *qd;
  const float *sg, *su, *sd;
  int bn, bk;
};

/* an e4m3 byte as a float times 2^-120 (cuda_fp8.cuh f8x4_f32 for one byte) */
__device__ __forceinline__ float moe_f8_one(uint8_t b) {
  uint32_t v = b;
  return __uint_as_float(((v & 0x80u) << 24) | ((v & 0x7fu) << 20));
}

/* w . x over n values, one warp: an FP8 row q (sr: its block row's scales, blocks bk wide)
 * and bf16 x, value-strided */
__device__ __forceinline__ float moe_dot_f8(const uint8_t *q, const float *sr, int bk,
                                            const bf16 *x, int n) {
  float acc = 0.f;
  for (int i = threadIdx.x & 31; i < n; i += 32)
    acc += moe_f8_one(q[i]) * (__ldg(sr + i / bk) * F8_UNBIAS) * bf2f(x[i]);
  return warp_sum(acc);
}

/* Gate and up rows over the same x (FP8, one block shape), every lane ends with both sums. */
__device__ __forceinline__ void moe_dot2_f8(const uint8_t *qg, const float *sg, const uint8_t *qu,
                                            const float *su, int bk, const bf16 *x, int n, float *g,
                                            float *u) {
  if (f8_fits(n, bk) && (((uintptr_t)qg | (uintptr_t)qu | (uintptr_t)x) & 15) == 0) {
    const uint8_t *w[2] = {qg, qu};
    const float *sr[2] = {sg, su};
    float a[2][1];
    f8_rows<1, 2>(x, w, sr, __ffs(bk) - 1, n, threadIdx.x & 31, a);
    *g = a[0][0];
    *u = a[1][0];
  } else {
    *g = moe_dot_f8(qg, sg, bk, x, n);
    *u = moe_dot_f8(qu, su, bk, x, n);
  }
}

/* w . h over n values, one warp: an FP8 row (as moe_dot_f8) and fp32 h; vec: 16-byte pieces
 * (f8_fits(n, bk), q and h 16-byte aligned) */
__device__ __forceinline__ float moe_dot_f8h(const uint8_t *q, const float *sr, int bk,
                                             const float *h, int n, int vec) {
  int lane = threadIdx.x & 31;
  float acc = 0.f;
  if (vec) {
    int bks = __ffs(bk) - 1;
    for (int i = lane * F8_PIECE; i < n; i += F8_TURN) {
      float wf[16], d = 0.f;
      f8x16_f32(ld_stream16(q + i), wf);
      const float4 *hp = (const float4 *)(h + i);
#pragma unroll
      for (int v = 0; v < 4; v++) {
        float4 a = __ldg(hp + v);
        d += wf[4 * v] * a.x + wf[4 * v + 1] * a.y + wf[4 * v + 2] * a.z + wf[4 * v + 3] * a.w;
      }
      acc += d * (__ldg(sr + (i >> bks)) * F8_UNBIAS);
    }
  } else {
    for (int i = lane; i < n; i += 32)
      acc += moe_f8_one(q[i]) * (__ldg(sr + i / bk) * F8_UNBIAS) * h[i];
  }
  return warp_sum(acc);
}

/* w . h over n values, one warp: a bf16 row and fp32 h, value-strided */
__device__ __forceinline__ float moe_dot_bh(const bf16 *w, const float *h, int n) {
  float acc = 0.f;
  for (int i = threadIdx.x & 31; i < n; i += 32) acc += bf2f(w[i]) * h[i];
  return warp_sum(acc);
}

/* k_moe_hidden for FP8 experts (bn x bk blocks); the shared expert's blocks compute their
 * outputs before the wait, as there. */
__global__ void k_moe_hidden8(const bf16 *x, const void *const *wsel, int k, int S, int H, int I,
                              int Is, int bn, int bk, moe_sh sh, float *hid) {
  int ks = k + S, t = blockIdx.x / ks, r = blockIdx.x % ks;
  int i = blockIdx.y * 8 + (threadIdx.x >> 5);
  const bf16 *xt = x + (size_t)t * H;
  float *ht = hid + (size_t)t * ((size_t)k * I + Is);
  float gv, uv;
  if (r == k) {
    if (i < Is) {
      if (sh.qg) {
        size_t so = (size_t)(i / sh.bn) * (size_t)((H + sh.bk - 1) / sh.bk);
        moe_dot2_f8(sh.qg + (size_t)i * H, sh.sg + so, sh.qu + (size_t)i * H, sh.su + so, sh.bk, xt,
                    H, &gv, &uv);
      } else {
        moe_dot2_bb(sh.g + (size_t)i * H, sh.u + (size_t)i * H, xt, H, &gv, &uv);
      }
      if ((threadIdx.x & 31) == 0) ht[(size_t)k * I + i] = siluf_dev(gv) * uv;
    }
    pdl_enter(); /* every block still waits before it exits */
    return;
  }
  pdl_enter();
  if (i >= I) return;
  const void *const *p = wsel + 6 * ((size_t)t * k + r);
  size_t so = (size_t)(i / bn) * (size_t)((H + bk - 1) / bk);
  moe_dot2_f8((const uint8_t *)p[0] + (size_t)i * H, (const float *)p[3] + so,
              (const uint8_t *)p[1] + (size_t)i * H, (const float *)p[4] + so, bk, xt, H, &gv, &uv);
  if ((threadIdx.x & 31) == 0) ht[(size_t)r * I + i] = siluf_dev(gv) * uv;
}

/* k_moe_down for FP8 experts: out[t, j] = sum_r w_r down_r[j] . hid[t, r] (slot order) +
 * sg[t] sdown[j] . hid[t, shared]; a warp requests row j of up to MOE_DQ slots at once. The
 * slots and their weights are read before the wait, as there. */
__global__ void __launch_bounds__(256, 2)
    k_moe_down8(const float *hid, const void *const *wsel, const float *wts, int k, int H, int I,
                int Is, int bn, int bk, const float *sg, moe_sh sh, bf16 *out) {
  __shared__ const uint8_t *wq[MOE_MAX_K];
  __shared__ const float *wsc[MOE_MAX_K];
  __shared__ float ww[MOE_MAX_K + 1];
  int t = blockIdx.x, lane = threadIdx.x & 31, S = sh.qd || sh.d;
  size_t hw = (size_t)k * I + (S ? Is : 0);
  if (threadIdx.x < k) {
    const void *const *p = wsel + 6 * ((size_t)t * k + threadIdx.x);
    wq[threadIdx.x] = (const uint8_t *)p[2];
    wsc[threadIdx.x] = (const float *)p[5];
    ww[threadIdx.x] = wts[(size_t)t * k + threadIdx.x];
  } else if (S && threadIdx.x == k) {
    ww[k] = sg[t];
  }
  __syncthreads();
  int j = blockIdx.y * 8 + (threadIdx.x >> 5);
  size_t so = (size_t)(j / bn) * (size_t)((I + bk - 1) / bk);
  int hal = (hw & 3) == 0 && ((uintptr_t)hid & 15) == 0, vec = hal && f8_fits(I, bk);
  int bks = __ffs(bk) - 1, i00 = lane * F8_PIECE;
  /* the first piece of the first MOE_DQ slots' rows, requested before the wait (weights) */
  uint4 pw[MOE_DQ];
  float ps[MOE_DQ];
#pragma unroll
  for (int q = 0; q < MOE_DQ; q++) {
    pw[q] = make_uint4(0, 0, 0, 0);
    ps[q] = 0.f;
    if (vec && j < H && i00 < I && q < k) {
      pw[q] = ld_stream16(wq[q] + (size_t)j * I + i00);
      ps[q] = __ldg(wsc[q] + so + (i00 >> bks)) * F8_UNBIAS;
    }
  }
  pdl_enter();
  if (j >= H) return;
  const float *h = hid + (size_t)t * hw;
  float acc = 0.f;
  for (int r0 = 0; r0 < k; r0 += MOE_DQ) {
    int nq = min(MOE_DQ, k - r0);
    float p[MOE_DQ];
#pragma unroll
    for (int q = 0; q < MOE_DQ; q++) p[q] = 0.f;
    if (vec) {
      for (int i0 = i00; i0 < I; i0 += F8_TURN) {
        uint4 wv[MOE_DQ];
        float sv[MOE_DQ];
#pragma unroll
        for (int q = 0; q < MOE_DQ; q++) {
          wv[q] = pw[q]; /* r0 == 0, i0 == i00: the pieces requested before the wait */
          sv[q] = ps[q];
          if (q < nq && (r0 > 0 || i0 > i00)) {
            wv[q] = ld_stream16(wq[r0 + q] + (size_t)j * I + i0);
            sv[q] = __ldg(wsc[r0 + q] + so + (i0 >> bks)) * F8_UNBIAS;
          }
        }
#pragma unroll
        for (int q = 0; q < MOE_DQ; q++) {
          if (q >= nq) break;
          float wf[16], d = 0.f;
          f8x16_f32(wv[q], wf);
          const float4 *hp = (const float4 *)(h + (size_t)(r0 + q) * I + i0);
#pragma unroll
          for (int v = 0; v < 4; v++) {
            float4 a = __ldg(hp + v);
            d += wf[4 * v] * a.x + wf[4 * v + 1] * a.y + wf[4 * v + 2] * a.z + wf[4 * v + 3] * a.w;
          }
          p[q] += d * sv[q];
        }
      }
    } else {
      for (int q = 0; q < nq; q++) {
        const uint8_t *w = wq[r0 + q] + (size_t)j * I;
        const float *sr = wsc[r0 + q] + so, *hq = h + (size_t)(r0 + q) * I;
        for (int i = lane; i < I; i += 32)
          p[q] += moe_f8_one(w[i]) * (__ldg(sr + i / bk) * F8_UNBIAS) * hq[i];
      }
    }
#pragma unroll
    for (int q = 0; q < MOE_DQ; q++) {
      if (q >= nq) break;
      acc += ww[r0 + q] * warp_sum(p[q]);
    }
  }
  if (S) {
    const float *hs = h + (size_t)k * I;
    float d;
    if (sh.qd) {
      size_t ss = (size_t)(j / sh.bn) * (size_t)((Is + sh.bk - 1) / sh.bk);
      d = moe_dot_f8h(sh.qd + (size_t)j * Is, sh.sd + ss, sh.bk, hs, Is,
                      hal && ((size_t)k * I & 3) == 0 && f8_fits(Is, sh.bk));
    } else {
      d = moe_dot_bh(sh.d + (size_t)j * Is, hs, Is);
    }
    acc += ww[k] * d;
  }
  if (lane == 0) out[(size_t)t * H + j] = f2bf(acc);
}

__global__ void k_swiglu_bf16(bf16 *g, const bf16 *u, size_t n) {
  pdl_enter();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    g[i] = f2bf(siluf_dev(bf2f(g[i])) * bf2f(u[i]));
}

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* ---- grouped path (steps of >= MOE_GROUPED_MIN rows, not under --batch-invariant) ----
 * Per chunk of <= MOE_GROUPED_CHUNK rows: the (row, slot) pairs are ordered by expert (stable:
 * within an expert in slot order), their x rows gathered, then per expert with rows one cuBLAS
 * GEMM each for gate, up (bf16 out), SwiGLU, and down (fp32 out), and each row sums its k slots'
 * outputs in slot order with the routing weights (+ the shared expert). Every expert's weights
 * are read once per chunk instead of once per routed row. */
#define MOE_GROUPED_MIN 64
#define MOE_DEQ_BYTES ((size_t)32 << 20) /* FP8 experts dequantized at once, at most */
#define MOE_GROUPED_CHUNK 2048

/* grid E, block 256: lpos[s] = rank of slot s among the slots routed to expert e (slot order);
 * cnt[e] = their number. */
__global__ void k_moe_rank(const int32_t *ids, int n, int32_t *lpos, int32_t *cnt) {
  pdl_enter();
  __shared__ int wsum[8];
  int e = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, base = 0;
  for (int c0 = 0; c0 < n; c0 += 256) {
    int s = c0 + threadIdx.x;
    int f = s < n && ids[s] == e;
    unsigned m = __ballot_sync(0xffffffffu, f);
    if (lane == 0) wsum[w] = __popc(m);
    __syncthreads();
    int before = 0, total = 0;
    for (int i = 0; i < 8; i++) {
      before += i < w ? wsum[i] : 0;
      total += wsum[i];
    }
    if (f) lpos[s] = base + before + __popc(m & ((1u << lane) - 1u));
    base += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) cnt[e] = base;
}

/* one thread: off[e] = sum of cnt[0..e-1], off[E] = n */
__global__ void k_moe_offsets(const int32_t *cnt, int E, int32_t *off) {
  pdl_enter();
  if (blockIdx.x || threadIdx.x) return;
  int a = 0;
  for (int e = 0; e < E; e++) {
    off[e] = a;
    a += cnt[e];
  }
  off[E] = a;
}

/* grid-stride over slots: row g = off[e] + lpos[s] holds slot s; xg[g] = x[s / k]. */
__global__ void k_moe_place(const int32_t *ids, const int32_t *lpos, const int32_t *off, int n,
                            int k, int H, const bf16 *x, int32_t *row_of, bf16 *xg) {
  pdl_enter();
  int h8 = H / 8;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)n * h8;
       i += (size_t)gridDim.x * blockDim.x) {
    int s = (int)(i / h8), c = (int)(i % h8) * 8;
    int g = off[ids[s]] + lpos[s];
    if (c == 0) row_of[s] = g;
    *(uint4 *)(xg + (size_t)g * H + c) = *(const uint4 *)(x + (size_t)(s / k) * H + c);
  }
}

/* grid-stride over T*H: out[t, j] = sum_r wts[t, r] od[row_of[t k + r], j] (+ sg[t] sd[t, j]). */
__global__ void k_moe_combine(const float *od, const int32_t *row_of, const float *wts, int T,
                              int k, int H, const float *sg, const float *sd, bf16 *out) {
  pdl_enter();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)T * H;
       i += (size_t)gridDim.x * blockDim.x) {
    int t = (int)(i / H), j = (int)(i % H);
    float acc = 0.f;
    for (int r = 0; r < k; r++)
      acc += wts[(size_t)t * k + r] * od[(size_t)row_of[(size_t)t * k + r] * H + j];
    if (sd) acc += sg[t] * sd[i];
    out[i] = f2bf(acc);
  }
}

/* y[n, N] = x[n, K] . W[N, K]^T on cuBLAS (bf16 in, fp32 accumulate). */
static int moe_gemm(cuda_ctx *c, const bf16 *x, const bf16 *W, int n, int K, int N, void *y,
                    int y_f32) {
  const float one = 1.f, zero = 0.f;
  cublasStatus_t st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, W, CUDA_R_16BF,
                                   K, x, CUDA_R_16BF, K, &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF,
                                   N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cuda_fail(c, "moe", "cuBLAS expert GEMM failed");
    return -1;
  }
  return 0;
}

__global__ void k_moe_gu_dev(const bf16 *xg, const int32_t *off, const void *const *tab, int E,
                             int H, int I, float *h);
__global__ void k_moe_down_dev(const float *h, const int32_t *off, const void *const *tab, int E,
                               int H, int I, float *od);
__global__ void k_moe_gu_dev8(const bf16 *xg, const int32_t *off, const void *const *tab, int E,
                              int H, int I, int bn, int bks, float *h);
__global__ void k_moe_down_dev8(const float *h, const int32_t *off, const void *const *tab, int E,
                                int H, int I, int bn, int bks, float *od);
#define MOE_DEV_DJ 4 /* down outputs per warp (k_moe_down_dev) */

/* The experts from *e on that have rows (hoff: the expert offsets), at most ng of them, into
 * list; *e moves past the last one taken. Returns how many. */
static int moe_next_group(const int32_t *hoff, int E, int *e, int ng, int *list) {
  int n = 0;
  for (; *e < E && n < ng; (*e)++)
    if (hoff[*e + 1] > hoff[*e]) list[n++] = *e;
  return n;
}

/* The routed experts of rows [0, T) (ids/wts already routed), grouped; out as k_moe_down.
 * dev: through the device-grouped kernels (moe_dev_takes), else per-expert cuBLAS GEMMs (FP8
 * experts: ng experts with rows at a time dequantized into wa / wb first, one launch each,
 * cuda_fp8_dequant_many). */
static void moe_grouped(cuda_ctx *c, const backend_moe *m, const bf16 *x, const int32_t *ids,
                        const float *wts, const void *const *htab, const void *const *htab_d,
                        const moe_table *ti, int dev, int E, int k, int H, int I, int T,
                        const float *sg, const float *sd, bf16 *out, char *sc, bf16 *wa, bf16 *wb,
                        int ng) {
  size_t nmax = (size_t)MOE_GROUPED_CHUNK * k;
  size_t o_lpos = 0, o_cnt = o_lpos + al256(nmax * 4), o_off = o_cnt + al256((size_t)E * 4),
         o_row = o_off + al256((size_t)(E + 1) * 4), o_xg = o_row + al256(nmax * 4),
         o_hg = o_xg + al256(nmax * H * 2), o_hu = o_hg + al256(nmax * I * 2),
         o_od = o_hu + al256(nmax * I * 2);
  int32_t *lpos = (int32_t *)(sc + o_lpos), *cnt = (int32_t *)(sc + o_cnt),
          *off = (int32_t *)(sc + o_off), *row_of = (int32_t *)(sc + o_row);
  bf16 *xg = (bf16 *)(sc + o_xg), *hg = (bf16 *)(sc + o_hg), *hu = (bf16 *)(sc + o_hu);
  float *od = (float *)(sc + o_od);
  int32_t *hoff = dev ? NULL : (int32_t *)malloc(sizeof(int32_t) * (size_t)(E + 1));
  if (!dev && !hoff) {
    cuda_fail(c, "moe", "out of memory");
    return;
  }
  for (int t0 = 0; t0 < T && !c->failed; t0 += MOE_GROUPED_CHUNK) {
    int Tc = T - t0 < MOE_GROUPED_CHUNK ? T - t0 : MOE_GROUPED_CHUNK, n = Tc * k;
    const int32_t *ids_c = ids + (size_t)t0 * k;
    k_moe_rank<<<E, 256, 0, c->st>>>(ids_c, n, lpos, cnt);
    cuda_check_launch(c, "moe (rank)");
    k_moe_offsets<<<1, 32, 0, c->st>>>(cnt, E, off);
    cuda_check_launch(c, "moe (offsets)");
    k_moe_place<<<cuda_blocks((size_t)n * (H / 8), 256), 256, 0, c->st>>>(
        ids_c, lpos, off, n, k, H, x + (size_t)t0 * H, row_of, xg);
    cuda_check_launch(c, "moe (grouping)");
    if (dev) { /* T <= one chunk (moe_dev_takes) */
      c->moe_dev_runs++;
      float *hd = (float *)hg; /* hg and hu: n x I x 4 bytes, h in fp32 */
      dim3 ggu(E, (I + 7) / 8), gdn(E, (H + 8 * MOE_DEV_DJ - 1) / (8 * MOE_DEV_DJ));
      if (ti->f8) {
        int bks = f8_log2(ti->bk);
        k_moe_gu_dev8<<<ggu, 256, 0, c->st>>>(xg, off, htab_d, E, H, I, ti->bn, bks, hd);
        cuda_check_launch(c, "moe (device-grouped gate/up, fp8)");
        k_moe_down_dev8<<<gdn, 256, 0, c->st>>>(hd, off, htab_d, E, H, I, ti->bn, bks, od);
        cuda_check_launch(c, "moe (device-grouped down, fp8)");
      } else {
        k_moe_gu_dev<<<ggu, 256, 0, c->st>>>(xg, off, htab_d, E, H, I, hd);
        cuda_check_launch(c, "moe (device-grouped gate/up)");
        k_moe_down_dev<<<gdn, 256, 0, c->st>>>(hd, off, htab_d, E, H, I, od);
        cuda_check_launch(c, "moe (device-grouped down)");
      }
      k_moe_combine<<<cuda_blocks((size_t)Tc * H, 256), 256, 0, c->st>>>(od, row_of, wts, Tc, k, H,
                                                                         sg, sd, out);
      cuda_check_launch(c, "moe (combine)");
      break;
    }
    if (cudaMemcpyAsync(hoff, off, sizeof(int32_t) * (size_t)(E + 1), cudaMemcpyDeviceToHost,
                        c->st) != cudaSuccess ||
        cudaStreamSynchronize(c->st) != cudaSuccess) {
      cudaGetLastError();
      cuda_fail(c, "moe", "cannot read the expert offsets");
      break;
    }
    /* experts with rows in groups of ng (FP8: each group's matrices dequantized in one launch,
     * expert g of the group at wa / wb + g I H) */
    int list[CUDA_FP8_DQ_MANY];
    const cuda_weight *dw[2][CUDA_FP8_DQ_MANY];
    for (int e = 0, ng_ = 0; !c->failed && (ng_ = moe_next_group(hoff, E, &e, ng, list)) > 0;) {
      if (ti->f8) {
        for (int g = 0; g < ng_; g++)
          dw[0][g] = CW(m->gate[list[g]]), dw[1][g] = CW(m->up[list[g]]);
        cuda_fp8_dequant_many(c, dw[0], ng_, wa);
        cuda_fp8_dequant_many(c, dw[1], ng_, wb);
      }
      for (int g = 0; g < ng_ && !c->failed; g++) {
        int ex = list[g], ne = hoff[ex + 1] - hoff[ex];
        size_t g0 = (size_t)hoff[ex], wo = (size_t)g * I * H;
        const bf16 *wg = ti->f8 ? wa + wo : (const bf16 *)htab[ex],
                   *wu = ti->f8 ? wb + wo : (const bf16 *)htab[E + ex];
        if (moe_gemm(c, xg + g0 * H, wg, ne, H, I, hg + g0 * I, 0)) break;
        moe_gemm(c, xg + g0 * H, wu, ne, H, I, hu + g0 * I, 0);
      }
    }
    k_swiglu_bf16<<<cuda_blocks((size_t)n * I, 256), 256, 0, c->st>>>(hg, hu, (size_t)n * I);
    for (int e = 0, ng_ = 0; !c->failed && (ng_ = moe_next_group(hoff, E, &e, ng, list)) > 0;) {
      if (ti->f8) {
        for (int g = 0; g < ng_; g++) dw[0][g] = CW(m->down[list[g]]);
        cuda_fp8_dequant_many(c, dw[0], ng_, wa);
      }
      for (int g = 0; g < ng_ && !c->failed; g++) {
        int ex = list[g], ne = hoff[ex + 1] - hoff[ex];
        size_t g0 = (size_t)hoff[ex];
        const bf16 *wd = ti->f8 ? wa + (size_t)g * H * I : (const bf16 *)htab[2 * E + ex];
        moe_gemm(c, hg + g0 * I, wd, ne, I, H, od + g0 * H, 1);
      }
    }
    k_moe_combine<<<cuda_blocks((size_t)Tc * H, 256), 256, 0, c->st>>>(
        od, row_of, wts + (size_t)t0 * k, Tc, k, H, sg ? sg + t0 : NULL,
        sd ? sd + (size_t)t0 * H : NULL, out + (size_t)t0 * H);
    cuda_check_launch(c, "moe (grouped)");
  }
  free(hoff);
}

/* ---- device-grouped path (grouped steps of <= moe_dev_max rows) ----
 * After k_moe_rank / k_moe_offsets / k_moe_place (the rows grouped by expert, as above): block
 * (e, y) of k_moe_gu_dev takes outputs of expert e for the off[e+1] - off[e] rows routed to it
 * (none: it returns), a warp per output i: h[g, i] = silu(gate_e[i].x_g) * (up_e[i].x_g) in
 * fp32 for the expert's rows g in chunks of MOE_DEV_R; k_moe_down_dev likewise, a warp per
 * MOE_DEV_DJ outputs j: od[g, j] = down_e[j].h[g]. Each expert's weights are read once (the
 * chunks after the first from L1/L2), every sum in a fixed order (lane partials over 16-byte
 * pieces, then the xor tree) that depends on the row's values alone; k_moe_combine then adds
 * each row's slots as in the cuBLAS path. */
#define MOE_DEV_R 8 /* rows per pass over a weight row */

/* acc[r] += w . x[r] over one 16-byte piece of 8 values, rows r < nr */
__device__ __forceinline__ void moe_dev_piece(const uint4 wu, const bf16 *x, size_t ld, int nr,
                                              float *acc) {
  float wf[8];
  bf16x8_to_f32(wu, wf);
#pragma unroll
  for (int r = 0; r < MOE_DEV_R; r++) {
    if (r >= nr) break;
    float xf[8];
    bf16x8_to_f32(*(const uint4 *)(x + (size_t)r * ld), xf);
#pragma unroll
    for (int i = 0; i < 8; i++) acc[r] += wf[i] * xf[i];
  }
}

/* grid (E, ceil(I / 8)), 8 warps; H % 256 == 0 */
__global__ void __launch_bounds__(256)
    k_moe_gu_dev(const bf16 *xg, const int32_t *off, const void *const *tab, int E, int H, int I,
                 float *h) {
  pdl_enter();
  int e = blockIdx.x, i = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  int g0 = off[e], ne = off[e + 1] - g0;
  if (ne <= 0 || i >= I) return;
  const bf16 *wg = (const bf16 *)tab[e] + (size_t)i * H,
             *wu = (const bf16 *)tab[E + e] + (size_t)i * H;
  for (int r0 = 0; r0 < ne; r0 += MOE_DEV_R) {
    int nr = min(MOE_DEV_R, ne - r0);
    const bf16 *x = xg + (size_t)(g0 + r0) * H;
    float ag[MOE_DEV_R], au[MOE_DEV_R];
#pragma unroll
    for (int r = 0; r < MOE_DEV_R; r++) ag[r] = au[r] = 0.f;
#pragma unroll 2
    for (int k = lane * 8; k < H; k += 256) {
      uint4 a = ld_stream16(wg + k), b = ld_stream16(wu + k);
      moe_dev_piece(a, x + k, H, nr, ag);
      moe_dev_piece(b, x + k, H, nr, au);
    }
#pragma unroll
    for (int r = 0; r < MOE_DEV_R; r++) {
      if (r >= nr) break;
      float gv = warp_sum(ag[r]), uv = warp_sum(au[r]);
      if (lane == 0) h[(size_t)(g0 + r0 + r) * I + i] = siluf_dev(gv) * uv;
    }
  }
}

/* acc[r] += w . h[r] over 8 fp32 values of h, rows r < nr */
__device__ __forceinline__ void moe_dev_piece_f(const uint4 wu, const float *hr, size_t ld, int nr,
                                                float *acc) {
  float wf[8];
  bf16x8_to_f32(wu, wf);
#pragma unroll
  for (int r = 0; r < MOE_DEV_R; r++) {
    if (r >= nr) break;
    const float4 *p = (const float4 *)(hr + (size_t)r * ld);
    float4 a = p[0], b = p[1];
    acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
              wf[6] * b.z + wf[7] * b.w;
  }
}

/* grid (E, ceil(H / (8 MOE_DEV_DJ))), 8 warps; I % 256 == 0 */
__global__ void __launch_bounds__(256)
    k_moe_down_dev(const float *h, const int32_t *off, const void *const *tab, int E, int H, int I,
                   float *od) {
  pdl_enter();
  int e = blockIdx.x, lane = threadIdx.x & 31;
  int j0 = (blockIdx.y * 8 + (threadIdx.x >> 5)) * MOE_DEV_DJ;
  int g0 = off[e], ne = off[e + 1] - g0;
  if (ne <= 0 || j0 >= H) return;
  const bf16 *wd = (const bf16 *)tab[2 * E + e];
  for (int r0 = 0; r0 < ne; r0 += MOE_DEV_R) {
    int nr = min(MOE_DEV_R, ne - r0);
    const float *hr = h + (size_t)(g0 + r0) * I;
#pragma unroll
    for (int d = 0; d < MOE_DEV_DJ; d++) {
      int j = j0 + d;
      if (j >= H) break;
      const bf16 *w = wd + (size_t)j * I;
      float acc[MOE_DEV_R];
#pragma unroll
      for (int r = 0; r < MOE_DEV_R; r++) acc[r] = 0.f;
      for (int k = lane * 8; k < I; k += 256)
        moe_dev_piece_f(ld_stream16(w + k), hr + k, I, nr, acc);
#pragma unroll
      for (int r = 0; r < MOE_DEV_R; r++) {
        if (r >= nr) break;
        float v = warp_sum(acc[r]);
        if (lane == 0) od[(size_t)(g0 + r0 + r) * H + j] = v;
      }
    }
  }
}

/* ---- device-grouped kernels for FP8 experts ----
 * k_moe_gu_dev / k_moe_down_dev with each weight row read in 16-byte pieces of 16 e4m3 (lane l
 * takes values 16 l + 512 j), a piece's 16 products summed in fp32 and scaled once by its
 * block's scale (cuda_fp8.cuh); H and I fit f8_fits with the experts' bk (moe_path). */

/* acc[r] += s (w . x[r]) over one piece (s: the block's scale times 2^120), rows r < nr */
__device__ __forceinline__ void moe_dev_piece8(const uint4 wu, float s, const bf16 *x, size_t ld,
                                               int nr, float *acc) {
  float wf[16];
  f8x16_f32(wu, wf);
#pragma unroll
  for (int r = 0; r < MOE_DEV_R; r++) {
    if (r >= nr) break;
    const uint4 *xp = (const uint4 *)(x + (size_t)r * ld);
    float xf[16], p = 0.f;
    bf16x8_to_f32(xp[0], xf);
    bf16x8_to_f32(xp[1], xf + 8);
#pragma unroll
    for (int i = 0; i < 16; i++) p += wf[i] * xf[i];
    acc[r] += p * s;
  }
}

/* acc[r] += s (w . h[r]) over one piece, fp32 h */
__device__ __forceinline__ void moe_dev_piece8_f(const uint4 wu, float s, const float *hr,
                                                 size_t ld, int nr, float *acc) {
  float wf[16];
  f8x16_f32(wu, wf);
#pragma unroll
  for (int r = 0; r < MOE_DEV_R; r++) {
    if (r >= nr) break;
    const float4 *hp = (const float4 *)(hr + (size_t)r * ld);
    float p = 0.f;
#pragma unroll
    for (int v = 0; v < 4; v++) {
      float4 a = hp[v];
      p += wf[4 * v] * a.x + wf[4 * v + 1] * a.y + wf[4 * v + 2] * a.z + wf[4 * v + 3] * a.w;
    }
    acc[r] += p * s;
  }
}

/* grid (E, ceil(I / 8)), 8 warps (k_moe_gu_dev); bk = 1 << bks */
__global__ void __launch_bounds__(256)
    k_moe_gu_dev8(const bf16 *xg, const int32_t *off, const void *const *tab, int E, int H, int I,
                  int bn, int bks, float *h) {
  pdl_enter();
  int e = blockIdx.x, i = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  int g0 = off[e], ne = off[e + 1] - g0;
  if (ne <= 0 || i >= I) return;
  size_t so = (size_t)(i / bn) * (size_t)((H + (1 << bks) - 1) >> bks);
  const uint8_t *wg = (const uint8_t *)tab[e] + (size_t)i * H,
                *wu = (const uint8_t *)tab[E + e] + (size_t)i * H;
  const float *sg = (const float *)tab[3 * E + e] + so, *su = (const float *)tab[4 * E + e] + so;
  for (int r0 = 0; r0 < ne; r0 += MOE_DEV_R) {
    int nr = min(MOE_DEV_R, ne - r0);
    const bf16 *x = xg + (size_t)(g0 + r0) * H;
    float ag[MOE_DEV_R], au[MOE_DEV_R];
#pragma unroll
    for (int r = 0; r < MOE_DEV_R; r++) ag[r] = au[r] = 0.f;
#pragma unroll 2
    for (int k = lane * F8_PIECE; k < H; k += F8_TURN) {
      uint4 a = ld_stream16(wg + k), b = ld_stream16(wu + k);
      float sa = __ldg(sg + (k >> bks)) * F8_UNBIAS, sb = __ldg(su + (k >> bks)) * F8_UNBIAS;
      moe_dev_piece8(a, sa, x + k, H, nr, ag);
      moe_dev_piece8(b, sb, x + k, H, nr, au);
    }
#pragma unroll
    for (int r = 0; r < MOE_DEV_R; r++) {
      if (r >= nr) break;
      float gv = warp_sum(ag[r]), uv = warp_sum(au[r]);
      if (lane == 0) h[(size_t)(g0 + r0 + r) * I + i] = siluf_dev(gv) * uv;
    }
  }
}

/* grid (E, ceil(H / (8 MOE_DEV_DJ))), 8 warps (k_moe_down_dev); bk = 1 << bks */
__global__ void __launch_bounds__(256)
    k_moe_down_dev8(const float *h, const int32_t *off, const void *const *tab, int E, int H, int I,
                    int bn, int bks, float *od) {
  pdl_enter();
  int e = blockIdx.x, lane = threadIdx.x & 31;
  int j0 = (blockIdx.y * 8 + (threadIdx.x >> 5)) * MOE_DEV_DJ;
  int g0 = off[e], ne = off[e + 1] - g0;
  if (ne <= 0 || j0 >= H) return;
  const uint8_t *wd = (const uint8_t *)tab[2 * E + e];
  const float *sd = (const float *)tab[5 * E + e];
  size_t sc = (size_t)((I + (1 << bks) - 1) >> bks);
  for (int r0 = 0; r0 < ne; r0 += MOE_DEV_R) {
    int nr = min(MOE_DEV_R, ne - r0);
    const float *hr = h + (size_t)(g0 + r0) * I;
#pragma unroll
    for (int d = 0; d < MOE_DEV_DJ; d++) {
      int j = j0 + d;
      if (j >= H) break;
      const uint8_t *w = wd + (size_t)j * I;
      const float *sr = sd + (size_t)(j / bn) * sc;
      float acc[MOE_DEV_R];
#pragma unroll
      for (int r = 0; r < MOE_DEV_R; r++) acc[r] = 0.f;
      for (int k = lane * F8_PIECE; k < I; k += F8_TURN)
        moe_dev_piece8_f(ld_stream16(w + k), __ldg(sr + (k >> bks)) * F8_UNBIAS, hr + k, I, nr,
                         acc);
#pragma unroll
      for (int r = 0; r < MOE_DEV_R; r++) {
        if (r >= nr) break;
        float v = warp_sum(acc[r]);
        if (lane == 0) od[(size_t)(g0 + r0 + r) * H + j] = v;
      }
    }
  }
}

/* 1 when a grouped step of T rows takes the device-grouped path */
static int moe_dev_takes(const cuda_ctx *c, int T, int H, int I) {
  return T <= c->moe_dev_max && T <= MOE_GROUPED_CHUNK && H % 256 == 0 && I % 256 == 0;
}

/* Scratch bytes the grouped path needs beyond the op's own. */
static size_t moe_grouped_bytes(int E, int k, int H, int I) {
  size_t nmax = (size_t)MOE_GROUPED_CHUNK * k;
  return al256(nmax * 4) + al256((size_t)E * 4) + al256((size_t)(E + 1) * 4) + al256(nmax * 4) +
         al256(nmax * H * 2) + 2 * al256(nmax * I * 2) + al256(nmax * H * 4);
}

/* The path a step of T rows takes: 1 grouped (dev: on the device-grouped kernels), 0 the
 * per-row kernels. */
static int moe_path(const cuda_ctx *c, const backend_moe *m, int T, int H, int *dev) {
  int I = m->inter;
  /* FP8 experts: the device-grouped kernels' 16-byte pieces must fit the blocks */
  const cuda_weight *w0 = m->n_experts > 0 ? CW(m->gate[0]) : NULL;
  int f8ok = !w0 || !w0->q8 || (f8_fits(H, w0->bk) && f8_fits(I, w0->bk));
  *dev = c->moe_grouped && !c->batch_invariant && T >= c->moe_dev_min && H % 8 == 0 &&
         moe_dev_takes(c, T, H, I) && f8ok;
  return c->moe_grouped && !c->batch_invariant && (T >= MOE_GROUPED_MIN || *dev) && H % 8 == 0;
}

extern "C" int cuda_moe_records(cuda_ctx *c, const backend_moe *m, int T, int H) {
  int dev, grouped = moe_path(c, m, T, H, &dev);
  return !grouped || dev;
}

extern "C" void cuda_moe_moe(backend *be, backend_buf x, const backend_moe *m, int T, int H,
                             backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (T <= 0) return;
  int E = m->n_experts, k = m->top_k, I = m->inter, Is = m->shared_inter;
  if (!m->shared_gate || !m->shared_up || !m->shared_down || !m->shared_expert_gate) Is = 0;
  if (k < 1 || k > MOE_MAX_K || k > E) {
    cuda_fail(c, "moe", "top_k out of range (1..32, <= n_experts)");
    return;
  }
  if (Is > 0 && !CW(m->shared_expert_gate)->f32) {
    cuda_fail(c, "moe", "shared_expert_gate must be uploaded as [1, H]");
    return;
  }
  const void *const *htab = NULL;
  const moe_table *ti = NULL;
  const void *const *tab = moe_table_get(c, m, &htab, &ti);
  if (!tab) return;
  /* an FP8 shared expert (weight_upload_fp8: no bf16 matrix) is read as FP8 by the per-row
   * kernels, dequantized for the grouped path's GEMMs */
  int sh8 = Is > 0 && (!CW(m->shared_gate)->bf || !CW(m->shared_up)->bf || !CW(m->shared_down)->bf);
  if (sh8 && (!CW(m->shared_gate)->q8 || !CW(m->shared_up)->q8 || !CW(m->shared_down)->q8 ||
              CW(m->shared_gate)->bn != CW(m->shared_up)->bn ||
              CW(m->shared_gate)->bk != CW(m->shared_up)->bk)) {
    cuda_fail(c, "moe", "the shared expert mixes bf16 and FP8 weights or FP8 block shapes");
    return;
  }
  if (sh8 && !ti->f8) {
    cuda_fail(c, "moe", "an FP8 shared expert needs FP8 routed experts");
    return;
  }
  int dev, grouped = moe_path(c, m, T, H, &dev);
  int nw = ti->f8 ? 6 : 3; /* wsel pointers per slot */
  /* grouped steps that dequantize: the cuBLAS path's FP8 experts (ng at a time, at most
   * MOE_DEQ_BYTES of them), an FP8 shared expert */
  int ng = CUDA_FP8_DQ_MANY;
  if (ti->f8) {
    size_t fit = MOE_DEQ_BYTES / ((size_t)I * H * 2);
    ng = fit < 1 ? 1 : fit < CUDA_FP8_DQ_MANY ? (int)fit : CUDA_FP8_DQ_MANY;
  }
  size_t ni = ti->f8 && grouped && !dev ? (size_t)ng * I : 0;
  size_t wmat = (ni > (size_t)Is ? ni : (size_t)Is) * H * 2;
  int deq = grouped && ((ti->f8 && !dev) || sh8);
  /* per-row steps: wsel [T, k, nw] (the chosen experts' weights), hid [T, k I + Is] (the
   * shared expert its last slot); grouped steps: the shared expert through cuBLAS (gs, us, sd),
   * the grouping scratch, and wa / wb (one dequantized matrix each) where deq */
  size_t hw = (size_t)k * I + Is;
  size_t o_lg = 0, o_ids = o_lg + al256((size_t)T * E * 4), o_w = o_ids + al256((size_t)T * k * 4),
         o_sg = o_w + al256((size_t)T * k * 4), o_sgl = o_sg + al256((size_t)T * 4),
         o_sel = o_sgl + al256((size_t)T * 4),
         o_hid = o_sel + (grouped ? 0 : al256((size_t)T * k * nw * sizeof(void *))),
         o_g = o_hid + (grouped ? 0 : al256((size_t)T * hw * 4)),
         o_u = o_g + (grouped ? al256((size_t)T * Is * 2) : 0),
         o_sd = o_u + (grouped ? al256((size_t)T * Is * 2) : 0),
         o_grp = o_sd + (grouped ? al256((size_t)T * H * 4) : 0),
         o_wa = o_grp + (grouped ? moe_grouped_bytes(E, k, H, I) : 0),
         o_wb = o_wa + (deq ? al256(wmat) : 0), total = o_wb + (deq ? al256(wmat) : 0);
  char *sc = (char *)cuda_scratch(c, total);
  if (!sc) return;
  float *lg = (float *)(sc + o_lg), *wts = (float *)(sc + o_w), *sg = (float *)(sc + o_sg);
  float *sgl = (float *)(sc + o_sgl), *hid = (float *)(sc + o_hid), *sd = (float *)(sc + o_sd);
  int32_t *ids = (int32_t *)(sc + o_ids);
  const void **wsel = (const void **)(sc + o_sel);
  bf16 *wa = (bf16 *)(sc + o_wa), *wb = (bf16 *)(sc + o_wb);
  bf16 *gs = (bf16 *)(sc + o_g), *us = (bf16 *)(sc + o_u);
  const bf16 *xb = (const bf16 *)x;
  const float *seg = Is > 0 ? CW(m->shared_expert_gate)->f32 : NULL;
  int router_sg = 0; /* the router kernel computes the shared gate's logit */
  moe_route_args ra = {lg,   xb, seg, NULL, T, E, k, m->norm_topk_prob, H, grouped ? NULL : tab,
                       wsel, nw, ids, wts,  sg};
  int routed = 0; /* the router kernel's last blocks routed the rows */
  if (CW(m->router)->f32) {
    router_sg = seg != NULL;
    ra.sgl = router_sg ? sgl : NULL;
    dim3 gr(T, (E + router_sg + MOE_RW - 1) / MOE_RW);
    /* the routing in the router's last blocks where the counters cover the step */
    int last = c->moe_cnt && T <= MOE_CNT && E <= 1024;
    const float *R = CW(m->router)->f32;
#define RT(LA, V) \
  k_moe_router<LA, V><<<gr, MOE_RW * 32, 0, c->st>>>(xb, R, seg, E, H, lg, sgl, c->moe_cnt, ra)
    if (!last)
      RT(0, 0);
    else if (E <= 256)
      RT(1, 8);
    else if (E <= 512)
      RT(1, 16);
    else
      RT(1, 32);
#undef RT
    cuda_check_launch(c, last ? "moe (router + route)" : "moe (router)");
    routed = last;
  } else {
    cuda_gemm(c, xb, CW(m->router)->bf, T, H, E, lg, 1);
  }
  if (!routed) moe_route_launch(c, ra);
  if (grouped) {
    if (Is > 0) {
      const bf16 *wg = CW(m->shared_gate)->bf, *wu = CW(m->shared_up)->bf,
                 *wd = CW(m->shared_down)->bf;
      if (sh8) {
        cuda_fp8_dequant(c, CW(m->shared_gate), wa);
        cuda_fp8_dequant(c, CW(m->shared_up), wb);
        wg = wa;
        wu = wb;
      }
      cuda_gemm(c, xb, wg, T, H, Is, gs, 0);
      cuda_gemm(c, xb, wu, T, H, Is, us, 0);
      k_swiglu_bf16<<<cuda_blocks((size_t)T * Is, 256), 256, 0, c->st>>>(gs, us, (size_t)T * Is);
      if (sh8) {
        cuda_fp8_dequant(c, CW(m->shared_down), wa);
        wd = wa;
      }
      cuda_gemm(c, gs, wd, T, Is, H, sd, 1);
    }
    moe_grouped(c, m, xb, ids, wts, htab, tab, ti, dev, E, k, H, I, T, sg, Is > 0 ? sd : NULL,
                (bf16 *)out, sc + o_grp, wa, wb, ng);
    return;
  }
  int S = Is > 0, wmax = I > Is ? I : Is;
  dim3 gh(T * (k + S), (wmax + 7) / 8), gd(T, (H + 7) / 8);
  if (ti->f8) {
    moe_sh sh;
    memset(&sh, 0, sizeof sh);
    if (sh8) {
      const cuda_weight *g = CW(m->shared_gate), *u = CW(m->shared_up), *d = CW(m->shared_down);
      sh.qg = g->q8, sh.qu = u->q8, sh.qd = d->q8, sh.sg = g->s8, sh.su = u->s8, sh.sd = d->s8;
      sh.bn = g->bn, sh.bk = g->bk;
      if (d->bn != g->bn || d->bk != g->bk) { /* one block shape for the shared expert */
        cuda_fail(c, "moe", "the shared expert's FP8 matrices differ in block shape");
        return;
      }
    } else if (S) {
      sh.g = CW(m->shared_gate)->bf, sh.u = CW(m->shared_up)->bf, sh.d = CW(m->shared_down)->bf;
    }
    k_moe_hidden8<<<gh, 256, 0, c->st>>>(xb, wsel, k, S, H, I, Is, ti->bn, ti->bk, sh, hid);
    cuda_check_launch(c, "moe (experts, fp8)");
    k_moe_down8<<<gd, 256, 0, c->st>>>(hid, wsel, wts, k, H, I, Is, ti->bn, ti->bk, sg, sh,
                                       (bf16 *)out);
    cuda_check_launch(c, "moe (down, fp8)");
    return;
  }
  const bf16 *sgw = S ? CW(m->shared_gate)->bf : NULL, *suw = S ? CW(m->shared_up)->bf : NULL;
  k_moe_hidden<<<gh, 256, 0, c->st>>>(xb, wsel, k, S, H, I, Is, sgw, suw, hid);
  cuda_check_launch(c, "moe (experts)");
  const bf16 *sdw = S ? CW(m->shared_down)->bf : NULL;
  k_moe_down<<<gd, 256, 0, c->st>>>(hid, wsel, wts, k, H, I, Is, sg, sdw, (bf16 *)out);
  cuda_check_launch(c, "moe (down)");
}
