/* cuda_sample — sampled token ids on the device (the backend's sample op), by sample_rule.h's
 * rule, so a sampled decode step downloads n ids instead of n rows of logits and no host thread
 * sorts a vocabulary (bench/NOTES.md, twentieth session: on the host path a sampled step of 64
 * rows spent ~8 ms in the download and the sampler).
 *
 * One block of 1,024 threads per row:
 *   1. the argmax rule's id (am_take / am_block, as the argmax op) and m, the largest value;
 *      a greedy row (temperature < SAMPLE_RULE_GREEDY_T) ends here;
 *   2. every entry's key (sample_rule_key: q's bits, 0 for a non-candidate) written over the
 *      row; no candidate: the argmax id;
 *   3. top_k and top_p cuts, each the first candidate in the rule's order (key descending, id
 *      ascending) at which a running count or mass reaches a target: a radix descent over the
 *      key's four bytes (a histogram of count or mass per digit among the entries that match
 *      the digits chosen so far; the digit where the sum from the top reaches the target), then
 *      among the entries of that exact key the target's one in id order (smp_ordered);
 *   4. the draw: r = sample_rule_draw_target(u53, kept mass), the first kept entry in id order
 *      whose running mass exceeds r (smp_ordered over the whole row).
 * Every sum is of integers (counts, masses trunc(q 2^40)), so the order in which threads add
 * does not matter: the ids are those of the host sampler (sampler.c) and of the CPU backend's
 * op, bit for bit (op test `sample`). The histograms: one copy per lane (no two lanes of a warp
 * add to one address), strided by 257 words against bank conflicts, summed per digit after. */
#include <stdint.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
extern "C" {
#include "base/log.h"
}
#include "sampler/sample_rule.h"

CUDA_KTRACE_TU(cuda_sample_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

#define SMP_THREADS 1024
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_COPIES 256 /* histogram copies: one per four lanes */
/* A copy's words: 64 digits, one more against bank conflicts. -DSMP_ATOM64=1: one 64-bit add
 * per entry; the default: 32-bit adds, a mass (< 2^41) as its low 20 bits and the rest in two
 * halves of the copy (a copy takes at most 4 x 149 entries of a pass: each half < 2^30). */
#ifndef SMP_ATOM64
#define SMP_ATOM64 0
#endif
#if SMP_ATOM64
typedef unsigned long long smp_word;
#define SMP_BSTRIDE 65
#else
typedef uint32_t smp_word;
#define SMP_BSTRIDE 129
#endif
#define SMP_HIST_BYTES (SMP_COPIES * SMP_BSTRIDE * sizeof(smp_word))
#define SMP_SMEM (SMP_HIST_BYTES + (16 * 64 + 64) * 8)

typedef unsigned long long u64;

struct smp_state { /* one block's scalars, in shared memory */
  u64 part[SMP_WARPS];
  u64 target;
  uint32_t prefix;
  int id;
  float m;
  int first;
};

__device__ __forceinline__ u64 smp_measure(uint32_t k, bool mass) {
  return mass ? (u64)__fmul_rn(__uint_as_float(k), SAMPLE_RULE_MASS_SCALE) : 1ull;
}

/* the candidates up to the cut (ka, ia) in the rule's order; ka == 0: every candidate */
__device__ __forceinline__ bool smp_kept(uint32_t k, int i, uint32_t ka, int ia) {
  return k != 0 && (ka == 0 || sample_rule_before(k, i, ka, ia) || (k == ka && i == ia));
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* The block's sum of v (every thread gets it). */
__device__ u64 smp_block_sum(u64 v, smp_state *s) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) s->part[w] = v;
  __syncthreads();
  u64 t = 0;
#pragma unroll 8
  for (int k = 0; k < SMP_WARPS; k++) t += s->part[k];
  return t;
}

/* The first entry in id order at which the running measure of the entries that are kept (and,
 * with exact, whose key is kc) reaches target (>= 1, <= their sum). Each thread takes one
 * contiguous run of ids: its sum, an exclusive scan of the sums over the block, then the thread
 * whose run holds the target walks it. */
__device__ int smp_ordered(const uint32_t *key, int V, bool mass, u64 target, uint32_t ka, int ia,
                           bool exact, uint32_t kc, smp_state *s) {
  int per = (V + SMP_THREADS - 1) / SMP_THREADS, lo = threadIdx.x * per, hi = min(V, lo + per);
  u64 mine = 0;
#pragma unroll 4
  for (int i = lo; i < hi; i++) {
    uint32_t k = key[i];
    if (smp_kept(k, i, ka, ia) && (!exact || k == kc)) mine += smp_measure(k, mass);
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  u64 incl = mine; /* inclusive scan within the warp */
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    u64 y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();
  if (lane == 31) s->part[w] = incl;
  if (threadIdx.x == 0) s->id = -1;
  __syncthreads();
  u64 before = 0;
  for (int k = 0; k < w; k++) before += s->part[k];
  u64 excl = before + incl - mine;
  if (mine && excl < target && excl + mine >= target) {
    u64 acc = excl;
    for (int i = lo; i < hi; i++) {
      uint32_t k = key[i];
      if (smp_kept(k, i, ka, ia) && (!exact || k == kc) && (acc += smp_measure(k, mass)) >= target) {
        s->id = i;
        break;
      }
    }
  }
  __syncthreads();
  return s->id;
}

/* Calls f(i, key[i]) for every i < V this thread takes (strided over the block), four loads
 * in flight at a time. */
template <typename F>
__device__ __forceinline__ void smp_each(const uint32_t *key, int V, F f) {
  for (int i0 = threadIdx.x; i0 < V; i0 += 4 * SMP_THREADS) {
    uint32_t k[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      int i = i0 + u * SMP_THREADS;
      k[u] = i < V ? key[i] : 0u;
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      int i = i0 + u * SMP_THREADS;
      if (i < V) f(i, k[u]);
    }
  }
}

/* A candidate's key rebased for the descent: q in [2^-40, 1] has exponent 87..127, so
 * (key - 87 << 23) << 1 < 41 << 24: five digits of six bits (shifts 24, 18, 12, 6, 0), the top
 * one 0..40. The order of rebased keys is the keys' order. */
__device__ __forceinline__ uint32_t smp_rebase(uint32_t k) { return (k - (87u << 23)) << 1; }

/* The first kept entry in the rule's order at which the running count (mass false) or mass
 * reaches target: its key in *kc, its id returned. Each pass: a histogram of the kept entries
 * whose higher digits are the ones chosen so far, in SMP_COPIES copies (one per four lanes of a
 * warp: an address takes at most four adds of one instruction), summed per digit; then the
 * digit, from the top, at which the sum reaches the target. */
__device__ __forceinline__ void smp_hist_add(smp_word *c, int d, u64 v) {
#if SMP_ATOM64
  atomicAdd(&c[d], v);
#else
  atomicAdd(&c[d], (uint32_t)(v & 0xfffffu));
  if (v >> 20) atomicAdd(&c[64 + d], (uint32_t)(v >> 20));
#endif
}
__device__ __forceinline__ u64 smp_hist_get(const smp_word *c, int d) {
#if SMP_ATOM64
  return c[d];
#else
  return ((u64)c[64 + d] << 20) + c[d];
#endif
}

__device__ int smp_find(const uint32_t *key, int V, bool mass, u64 target, uint32_t ka, int ia,
                        smp_word *hist, smp_state *s, uint32_t *kc) {
  u64 *red = (u64 *)(hist + SMP_COPIES * SMP_BSTRIDE), *fin = red + 16 * 64;
  smp_word *mine = hist + (threadIdx.x >> 2) * SMP_BSTRIDE;
  uint32_t prefix = 0;
  __syncthreads();
  if (threadIdx.x == 0) s->target = target;
  for (int pass = 0; pass < 5; pass++) {
    int shift = 24 - 6 * pass;
    for (int k = threadIdx.x; k < SMP_COPIES * SMP_BSTRIDE; k += SMP_THREADS) hist[k] = 0;
    __syncthreads();
    smp_each(key, V, [&](int i, uint32_t k) {
      if (!smp_kept(k, i, ka, ia)) return;
      uint32_t r = smp_rebase(k);
      if (pass > 0 && (r >> (shift + 6)) != prefix) return;
      smp_hist_add(mine, (r >> shift) & 63, smp_measure(k, mass));
    });
    __syncthreads();
    { /* the copies summed: 16 parts of 16 copies per digit, then the parts */
      int d = threadIdx.x & 63, part = threadIdx.x >> 6;
      u64 t = 0;
#pragma unroll 4
      for (int c = 0; c < SMP_COPIES / 16; c++)
        t += smp_hist_get(hist + (part * (SMP_COPIES / 16) + c) * SMP_BSTRIDE, d);
      red[part * 64 + d] = t;
    }
    __syncthreads();
    if (threadIdx.x < 64) {
      u64 t = 0;
#pragma unroll
      for (int part = 0; part < 16; part++) t += red[part * 64 + threadIdx.x];
      fin[threadIdx.x] = t;
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* lane l holds digits 63 - 2 l and 62 - 2 l, highest first */
      int lane = threadIdx.x;
      u64 h0 = fin[63 - 2 * lane], h1 = fin[62 - 2 * lane], sum = h0 + h1, incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      u64 t = s->target;
      unsigned hit = __ballot_sync(0xffffffffu, incl >= t);
      int l = hit ? __ffs(hit) - 1 : 31;
      if (lane == l) {
        u64 acc = incl - sum;
        int d = 63 - 2 * lane;
        if (acc + h0 < t) { /* not the higher digit: the lower one */
          acc += h0;
          d--;
        }
        s->target = t - acc;
        s->prefix = prefix << 6 | (uint32_t)d;
      }
    }
    __syncthreads();
    prefix = s->prefix;
  }
  *kc = (prefix >> 1) + (87u << 23);
  u64 t = s->target;
  return smp_ordered(key, V, mass, t, ka, ia, true, *kc, s);
}

__global__ void __launch_bounds__(SMP_THREADS)
    k_sample(float *x, int V, const int32_t *__restrict__ params, int32_t *ids) {
  pdl_enter();
  extern __shared__ u64 smem[];
  smp_word *hist = (smp_word *)smem;
  __shared__ smp_state s;
  float *row = x + (size_t)blockIdx.x * V;
  uint32_t *key = (uint32_t *)row;
  sample_rule_row p;
  sample_rule_unpack(params + (size_t)blockIdx.x * SAMPLE_RULE_WORDS, &p);

  /* 1. the argmax rule (k_argmax's scan and reduction) and m */
  float v = -INFINITY;
  int i = INT32_MAX;
  smp_each(key, V, [&](int j, uint32_t b) { am_take(v, i, __uint_as_float(b), j); });
  am_block<SMP_THREADS>(v, i);
  if (threadIdx.x == 0) {
    s.first = i == INT32_MAX || isnan(row[0]) ? 0 : i;
    s.m = v;
  }
  __syncthreads();
  if (p.temperature < SAMPLE_RULE_GREEDY_T) {
    if (threadIdx.x == 0) ids[blockIdx.x] = s.first;
    return;
  }

  /* 2. the keys over the row */
  float m = s.m, inv_t = __fdiv_rn(1.0f, p.temperature);
  u64 n = 0;
  smp_each(key, V, [&](int j, uint32_t b) {
    uint32_t k = sample_rule_key(sample_rule_prob(__uint_as_float(b), m, inv_t), p.min_p);
    key[j] = k;
    n += k != 0;
  });
  n = smp_block_sum(n, &s); /* its barriers also make the keys visible */
  if (n == 0) {
    if (threadIdx.x == 0) ids[blockIdx.x] = s.first;
    return;
  }

  /* 3. the cuts */
  uint32_t ka = 0;
  int ia = -1;
  if (p.top_k > 0 && (u64)p.top_k < n) {
    ia = smp_find(key, V, false, (u64)p.top_k, 0, -1, hist, &s, &ka);
  }
  if (p.top_p < 1.0f) {
    u64 mass = 0;
    smp_each(key, V, [&](int j, uint32_t k) {
      if (smp_kept(k, j, ka, ia)) mass += smp_measure(k, true);
    });
    u64 total = smp_block_sum(mass, &s);
    u64 t = sample_rule_top_p_target(p.top_p, total);
    uint32_t kb;
    ia = smp_find(key, V, true, t, ka, ia, hist, &s, &kb);
    ka = kb;
  }

  /* 4. the draw in id order */
  u64 mass = 0;
  smp_each(key, V, [&](int j, uint32_t k) {
    if (smp_kept(k, j, ka, ia)) mass += smp_measure(k, true);
  });
  u64 total = smp_block_sum(mass, &s);
  u64 r = sample_rule_draw_target(p.u53, total);
  int tok = smp_ordered(key, V, true, r + 1, ka, ia, false, 0, &s);
  if (threadIdx.x == 0) ids[blockIdx.x] = tok;
}

extern "C" void cuda_sample_sample(backend *be, backend_buf x, int n, int V, backend_buf params,
                                   backend_buf ids) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (n <= 0 || V <= 0) return;
  CHECK(V < (1 << 20)); /* the 32-bit histogram halves' bound (SMP_ATOM64) */
  static int attr_set;
  if (!attr_set) {
    cudaFuncSetAttribute(k_sample, cudaFuncAttributeMaxDynamicSharedMemorySize, SMP_SMEM);
    attr_set = 1;
  }
  k_sample<<<n, SMP_THREADS, SMP_SMEM, c->st>>>((float *)x, V, (const int32_t *)params,
                                                 (int32_t *)ids);
  cuda_check_launch(c, "sample");
}
