/* cuda_sample — sampled token ids on the device (the backend's sample op), by sample_rule.h's
 * rule, so a sampled decode step downloads n ids instead of n rows of logits and no host thread
 * sorts a vocabulary (on the host path a sampled step of 64 rows spends milliseconds in the
 * download and the sampler).
 *
 * One cluster of SMP_CLUSTER blocks per row, block b owning the b-th slice of the row; what the
 * rule sums over the whole row the blocks exchange through distributed shared memory:
 *   0. the row's edits (sample_rule_edit_apply: frequency / presence penalties, logit_bias, the
 *      min_tokens ban), each block those in its slice;
 *   1. the argmax rule's id (am_take / am_block, as the argmax op; am_take is a total order, so
 *      the slices' results reduce to the row's) and m, the largest value; a greedy row
 *      (temperature < SAMPLE_RULE_GREEDY_T) ends here;
 *   2. every entry's key (sample_rule_key: q's bits, 0 for a non-candidate) written over the
 *      row; no candidate: the argmax id;
 *   3. top_k and top_p cuts, each the first candidate in the rule's order (key descending, id
 *      ascending) at which a running count or mass reaches a target: a radix descent over the
 *      rebased key's five six-bit digits (each block's histogram of count or mass per digit
 *      among the entries that match the digits chosen so far, the cluster's sum of them, the
 *      digit where the sum from the top reaches the target), then among the entries of that
 *      exact key the target's one in id order (smp_ordered);
 *   4. the draw: r = sample_rule_draw_target(u53, kept mass), the first kept entry in id order
 *      whose running mass exceeds r (smp_ordered over the whole row).
 * When at most SMP_SMALL entries are kept after top_k (top_k 20, or few candidates), steps 3's
 * top_p and 4 run in block 0 alone over a list of them (smp_small): every block adds its kept
 * entries to block 0's list, and each of block 0's threads takes one entry and sums the masses
 * of the entries before it in the rule's order (top_p) and in id order (the draw) — a few
 * microseconds instead of a descent and two passes over the row with cluster barriers.
 * Every sum is of integers (counts, masses trunc(q 2^40)), so the order in which threads and
 * blocks add does not matter: the ids are those of the host sampler (sampler.c) and of the CPU
 * backend's op, bit for bit (op test `sample`). A block's histograms: one copy per four lanes
 * (an address takes at most four adds of one instruction), 32-bit adds (a mass as two halves),
 * summed per digit after. */
#include <cooperative_groups.h>
#include <stdint.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
extern "C" {
#include "base/log.h"
}
#include "sampler/sample_rule.h"

namespace cg = cooperative_groups;

CUDA_KTRACE_TU(cuda_sample_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

#define SMP_CLUSTER 8 /* blocks per row (the portable cluster size) */
#define SMP_THREADS 512
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_COPIES (SMP_THREADS / 4) /* histogram copies: one per four lanes */
/* A copy's words: 64 digits of low halves, 64 of high halves, one more against bank conflicts.
 * A mass (< 2^41) adds its low 20 bits and the rest: a copy takes at most 4 ceil(V / (8 x
 * 512)) entries of a pass, so with V < 2^20 each half stays < 2^30. */
#define SMP_BSTRIDE 129
#define SMP_SMALL SMP_THREADS /* kept entries that smp_small takes (one per thread of block 0) */
#define SMP_SMEM (SMP_COPIES * SMP_BSTRIDE * 4)

typedef unsigned long long u64;

struct smp_state { /* one block's scalars, in shared memory (the cluster reads some) */
  u64 part[SMP_WARPS];
  u64 red[SMP_THREADS / 64][64]; /* a pass's copies summed in parts */
  u64 fin[2][64]; /* this block's histogram of the pass (parity), read by the cluster */
  u64 xv[2];      /* this block's value of an exchange (parity), read by the cluster */
  float pv;       /* this block's argmax pair, read by the cluster */
  int pi;
  u64 target;
  uint32_t prefix;
  int id;
  float m;
  int first;
  unsigned cnt; /* smp_small's list's length (block 0's) */
};

/* smp_small's list, in block 0's histogram memory (free once the cuts' descents are done) */
struct smp_list {
  uint32_t ck[SMP_SMALL]; /* the entries' keys */
  int ci[SMP_SMALL];      /* their ids */
  u64 cm[SMP_SMALL];      /* their masses once kept by top_p, else 0 */
};
static_assert(sizeof(smp_list) <= SMP_SMEM, "smp_small's list does not fit the histograms");

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

/* A block's slice [lo, hi) of the row and its place in the cluster. */
struct smp_slice {
  int lo, hi, rank;
};

/* The block's sum of v, then the cluster's (every thread gets it); *before: the sum over the
 * lower ranks. xp: the exchange's parity, toggled (the same in every thread). */
__device__ u64 smp_sum(u64 v, smp_state *s, const smp_slice &sl, cg::cluster_group &cl, int &xp,
                       u64 *before) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) s->part[w] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 t = 0;
    for (int k = 0; k < SMP_WARPS; k++) t += s->part[k];
    s->xv[xp] = t;
  }
  cl.sync();
  u64 tot = 0, bef = 0;
  for (int r = 0; r < SMP_CLUSTER; r++) {
    u64 x = *cl.map_shared_rank(&s->xv[xp], r);
    tot += x;
    bef += r < sl.rank ? x : 0;
  }
  xp ^= 1;
  if (before) *before = bef;
  return tot;
}

/* Calls f(i, key[i]) for every i of the block's slice this thread takes, four loads in flight. */
template <typename F>
__device__ __forceinline__ void smp_each(const uint32_t *key, const smp_slice &sl, F f) {
  for (int i0 = sl.lo + threadIdx.x; i0 < sl.hi; i0 += 4 * SMP_THREADS) {
    uint32_t k[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      int i = i0 + u * SMP_THREADS;
      k[u] = i < sl.hi ? key[i] : 0u;
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      int i = i0 + u * SMP_THREADS;
      if (i < sl.hi) f(i, k[u]);
    }
  }
}

/* The first entry in id order at which the running measure of the entries that are kept (and,
 * with exact, whose key is kc) reaches target (>= 1, <= their sum over the row). Each thread
 * takes one contiguous run of its block's slice: the runs' sums scanned over the block, the
 * blocks' sums over the cluster; the thread whose run holds the target walks it and writes the
 * id into every block. */
__device__ int smp_ordered(const uint32_t *key, const smp_slice &sl, bool mass, u64 target,
                           uint32_t ka, int ia, bool exact, uint32_t kc, smp_state *s,
                           cg::cluster_group &cl, int &xp) {
  int per = (sl.hi - sl.lo + SMP_THREADS - 1) / SMP_THREADS, lo = sl.lo + threadIdx.x * per,
      hi = min(sl.hi, lo + per);
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
  u64 wbefore = 0, block = 0;
  for (int k = 0; k < SMP_WARPS; k++) {
    wbefore += k < w ? s->part[k] : 0;
    block += s->part[k];
  }
  u64 excl = wbefore + incl - mine, bbefore;
  smp_sum(threadIdx.x == 0 ? block : 0, s, sl, cl, xp, &bbefore); /* the blocks' sums */
  excl += bbefore;
  if (mine && excl < target && excl + mine >= target) {
    u64 acc = excl;
    for (int i = lo; i < hi; i++) {
      uint32_t k = key[i];
      if (smp_kept(k, i, ka, ia) && (!exact || k == kc) &&
          (acc += smp_measure(k, mass)) >= target) {
        for (int r = 0; r < SMP_CLUSTER; r++) *cl.map_shared_rank(&s->id, r) = i;
        break;
      }
    }
  }
  cl.sync();
  return s->id;
}

/* A candidate's key rebased for the descent: q in [2^-40, 1] has exponent 87..127, so
 * (key - 87 << 23) << 1 < 41 << 24: five digits of six bits (shifts 24, 18, 12, 6, 0), the top
 * one 0..40. The order of rebased keys is the keys' order. */
__device__ __forceinline__ uint32_t smp_rebase(uint32_t k) { return (k - (87u << 23)) << 1; }

/* The first kept entry in the rule's order at which the running count (mass false) or mass
 * reaches target: its key in *kc, its id returned. Each pass: every block's histogram of its
 * kept entries whose higher digits are the ones chosen so far, the cluster's sum per digit,
 * then the digit, from the top, at which the sum reaches the target (every block finds the
 * same). */
__device__ int smp_find(const uint32_t *key, const smp_slice &sl, bool mass, u64 target,
                        uint32_t ka, int ia, uint32_t *hist, smp_state *s, cg::cluster_group &cl,
                        int &xp, uint32_t *kc) {
  uint32_t *mine = hist + (threadIdx.x >> 2) * SMP_BSTRIDE;
  uint32_t prefix = 0;
  __syncthreads();
  if (threadIdx.x == 0) s->target = target;
  for (int pass = 0; pass < 5; pass++) {
    int shift = 24 - 6 * pass, par = pass & 1;
    for (int k = threadIdx.x; k < SMP_COPIES * SMP_BSTRIDE; k += SMP_THREADS) hist[k] = 0;
    __syncthreads();
    smp_each(key, sl, [&](int i, uint32_t k) {
      if (!smp_kept(k, i, ka, ia)) return;
      uint32_t r = smp_rebase(k);
      if (pass > 0 && (r >> (shift + 6)) != prefix) return;
      int d = (r >> shift) & 63;
      u64 v = smp_measure(k, mass);
      atomicAdd(&mine[d], (uint32_t)(v & 0xfffffu));
      if (v >> 20) atomicAdd(&mine[64 + d], (uint32_t)(v >> 20));
    });
    __syncthreads();
    { /* the copies summed per digit: in parts of 16 copies, then the parts */
      int d = threadIdx.x & 63, part = threadIdx.x >> 6;
      u64 lo = 0, hi = 0;
#pragma unroll 4
      for (int c = part * 16; c < part * 16 + 16; c++) {
        lo += hist[c * SMP_BSTRIDE + d];
        hi += hist[c * SMP_BSTRIDE + 64 + d];
      }
      s->red[part][d] = (hi << 20) + lo;
    }
    __syncthreads();
    if (threadIdx.x < 64) {
      u64 t = 0;
#pragma unroll
      for (int part = 0; part < SMP_THREADS / 64; part++) t += s->red[part][threadIdx.x];
      s->fin[par][threadIdx.x] = t;
    }
    cl.sync();
    if (threadIdx.x < 32) { /* lane l holds digits 63 - 2 l and 62 - 2 l, highest first */
      int lane = threadIdx.x;
      u64 h0 = 0, h1 = 0;
      for (int r = 0; r < SMP_CLUSTER; r++) {
        const u64 *f = cl.map_shared_rank(s->fin[par], r);
        h0 += f[63 - 2 * lane];
        h1 += f[62 - 2 * lane];
      }
      u64 sum = h0 + h1, incl = sum;
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
  return smp_ordered(key, sl, mass, t, ka, ia, true, *kc, s, cl, xp);
}

/* The kept entries' mass over the row. */
__device__ u64 smp_kept_mass(const uint32_t *key, const smp_slice &sl, uint32_t ka, int ia,
                             smp_state *s, cg::cluster_group &cl, int &xp) {
  u64 mass = 0;
  smp_each(key, sl, [&](int j, uint32_t k) {
    if (smp_kept(k, j, ka, ia)) mass += smp_measure(k, true);
  });
  return smp_sum(mass, s, sl, cl, xp, NULL);
}

/* The block's sum of v (every thread gets it). */
__device__ u64 smp_block_sum(u64 v, smp_state *s) {
  v = warp_sum_u64(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s->part[threadIdx.x >> 5] = v;
  __syncthreads();
  u64 t = 0;
  for (int k = 0; k < SMP_WARPS; k++) t += s->part[k];
  return t;
}

/* Steps 3 (top_p) and 4 over the kept entries (at most SMP_SMALL of them, after the top_k cut
 * (ka, ia)), in block 0: the token there, -1 in the other blocks. The list's order is whatever
 * the adds gave; every sum below is of integers over a set, so it does not matter. */
__device__ int smp_small(const uint32_t *key, const smp_slice &sl, uint32_t ka, int ia,
                         const sample_rule_row &p, uint32_t *hist, smp_state *s,
                         cg::cluster_group &cl) {
  smp_list *L = (smp_list *)hist, *L0 = cl.map_shared_rank(L, 0);
  unsigned *cnt0 = cl.map_shared_rank(&s->cnt, 0);
  smp_each(key, sl, [&](int j, uint32_t k) {
    if (!smp_kept(k, j, ka, ia)) return;
    unsigned at = atomicAdd(cnt0, 1u);
    L0->ck[at] = k;
    L0->ci[at] = j;
  });
  cl.sync();
  if (sl.rank != 0) return -1;
  int nk = (int)s->cnt, j = threadIdx.x;
  bool mine = j < nk;
  uint32_t kj = mine ? L->ck[j] : 0u;
  int ij = mine ? L->ci[j] : INT32_MAX;
  u64 mj = mine ? smp_measure(kj, true) : 0;
  bool kept = mine;
  if (threadIdx.x == 0) s->id = -1;
  if (p.top_p < 1.0f) { /* kept: the entries whose mass before them in the rule's order is
                            below the target (the shortest prefix that reaches it) */
    u64 t = sample_rule_top_p_target(p.top_p, smp_block_sum(mj, s)), before = 0;
    for (int i = 0; i < nk && mine; i++) {
      uint32_t k = L->ck[i];
      if (sample_rule_before(k, L->ci[i], kj, ij)) before += smp_measure(k, true);
    }
    kept = mine && before < t;
  }
  L->cm[j] = kept ? mj : 0;
  u64 r = sample_rule_draw_target(p.u53, smp_block_sum(kept ? mj : 0, s)); /* (its barriers
                                                                               publish cm) */
  if (kept) { /* the entry whose running mass in id order first exceeds r */
    u64 below = 0;
    for (int i = 0; i < nk; i++) below += L->ci[i] < ij ? L->cm[i] : 0;
    if (below <= r && r < below + mj) s->id = ij;
  }
  __syncthreads();
  return s->id;
}

__global__ void __cluster_dims__(SMP_CLUSTER, 1, 1) __launch_bounds__(SMP_THREADS)
    k_sample(float *x, int V, const int32_t *__restrict__ params, int32_t *ids) {
  pdl_enter();
  extern __shared__ __align__(16) uint32_t hist[];
  __shared__ smp_state s;
  cg::cluster_group cl = cg::this_cluster();
  int row_i = blockIdx.x / SMP_CLUSTER, xp = 0;
  smp_slice sl;
  sl.rank = (int)cl.block_rank();
  int per = ((V + SMP_CLUSTER - 1) / SMP_CLUSTER + 3) & ~3;
  sl.lo = min(V, sl.rank * per);
  sl.hi = min(V, sl.lo + per);
  float *row = x + (size_t)row_i * V;
  uint32_t *key = (uint32_t *)row;
  sample_rule_row p;
  sample_rule_unpack(params + (size_t)row_i * SAMPLE_RULE_WORDS, &p);
  if (threadIdx.x == 0) s.cnt = 0; /* before the cluster barriers below: smp_small's adds */

  /* 0. the row's edits (penalties, logit_bias, a ban), each block those of its slice */
  const int32_t *ew = params + (size_t)(gridDim.x / SMP_CLUSTER) * SAMPLE_RULE_WORDS +
                      (size_t)p.edit_off * SAMPLE_RULE_EDIT_WORDS;
  for (int k = threadIdx.x; k < p.n_edits; k += SMP_THREADS) {
    sample_rule_edit e;
    sample_rule_edit_unpack(ew + (size_t)k * SAMPLE_RULE_EDIT_WORDS, &e);
    if (e.id >= sl.lo && e.id < sl.hi) row[e.id] = sample_rule_edit_apply(row[e.id], &e);
  }
  __syncthreads();

  /* 1. the argmax rule (k_argmax's scan and reduction, then over the blocks) and m */
  float v = -INFINITY;
  int i = INT32_MAX;
  smp_each(key, sl, [&](int j, uint32_t b) { am_take(v, i, __uint_as_float(b), j); });
  am_block<SMP_THREADS>(v, i);
  if (threadIdx.x == 0) {
    s.pv = v;
    s.pi = i;
  }
  cl.sync();
  if (threadIdx.x == 0) {
    v = -INFINITY;
    i = INT32_MAX;
    for (int r = 0; r < SMP_CLUSTER; r++)
      am_take(v, i, *cl.map_shared_rank(&s.pv, r), *cl.map_shared_rank(&s.pi, r));
    s.first = i == INT32_MAX || isnan(row[0]) ? 0 : i;
    s.m = v;
  }
  cl.sync(); /* every block has read the others' pairs (and row[0]) before keys overwrite them */
  int tok = s.first;
  if (p.temperature >= SAMPLE_RULE_GREEDY_T) {
    /* 2. the keys over the row */
    float m = s.m, inv_t = __fdiv_rn(1.0f, p.temperature);
    u64 n = 0;
    smp_each(key, sl, [&](int j, uint32_t b) {
      uint32_t k = sample_rule_key(sample_rule_prob(__uint_as_float(b), m, inv_t), p.min_p);
      key[j] = k;
      n += k != 0;
    });
    n = smp_sum(n, &s, sl, cl, xp, NULL); /* its barriers also make the keys visible */
    if (n > 0) {
      /* 3. the cuts */
      uint32_t ka = 0;
      int ia = -1;
      u64 nk = n; /* kept so far */
      if (p.top_k > 0 && (u64)p.top_k < n) {
        ia = smp_find(key, sl, false, (u64)p.top_k, 0, -1, hist, &s, cl, xp, &ka);
        nk = (u64)p.top_k;
      }
      if (nk <= SMP_SMALL) {
        tok = smp_small(key, sl, ka, ia, p, hist, &s, cl);
      } else {
        if (p.top_p < 1.0f) {
          u64 t = sample_rule_top_p_target(p.top_p, smp_kept_mass(key, sl, ka, ia, &s, cl, xp));
          uint32_t kb;
          ia = smp_find(key, sl, true, t, ka, ia, hist, &s, cl, xp, &kb);
          ka = kb;
        }
        /* 4. the draw in id order */
        u64 r = sample_rule_draw_target(p.u53, smp_kept_mass(key, sl, ka, ia, &s, cl, xp));
        tok = smp_ordered(key, sl, true, r + 1, ka, ia, false, 0, &s, cl, xp);
      }
    }
  }
  if (sl.rank == 0 && threadIdx.x == 0) ids[row_i] = tok;
  cl.sync(); /* no block leaves while another may still read its shared memory */
}

extern "C" void cuda_sample_sample(backend *be, backend_buf x, int n, int V, backend_buf params,
                                   backend_buf ids) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (n <= 0 || V <= 0) return;
  CHECK(V < (1 << 20)); /* the histogram halves' bound (SMP_BSTRIDE) */
  /* on every call: an attribute holds for the current device only, and ranks use several */
  cudaFuncSetAttribute(k_sample, cudaFuncAttributeMaxDynamicSharedMemorySize, SMP_SMEM);
  k_sample<<<n * SMP_CLUSTER, SMP_THREADS, SMP_SMEM, c->st>>>(
      (float *)x, V, (const int32_t *)params, (int32_t *)ids);
  cuda_check_launch(c, "sample");
}
