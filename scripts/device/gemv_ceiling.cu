/* gemv_ceiling — how fast can a decode step's weight products go when each is its own kernel?
 *
 * A one-sequence decode step of the 4B shape streams ~7.2 GB of weights through 128 products
 * (per layer: the input projections, the output projection, gate+up, down), each a kernel that
 * waits for the one before (programmatic dependent launch, as the backend's captured steps).
 * This program times exactly that sequence in one CUDA graph, with zeroed bf16 weights at the
 * real shapes (random bits: never time on zeros), for a few GEMV designs and for a plain streaming
 * read of the same bytes (no arithmetic: the ceiling of a kernel-per-product step on this GPU). It
 * prints one line per design: ms per step of products, TB/s, and the fixed cost per product implied
 * at 4.0 TB/s streaming. Build and run on the GPU machine with scripts/device/gemv_ceiling.sh.
 *
 * The first table (layouts) times the step's products and each class of them alone (input, out,
 * gate+up, down: that class's products back to back) in alternating rounds, for: the backend's
 * rows (4-warp blocks, the single products in one-warp blocks), the same loads without
 * arithmetic, the weights laid out turn-major ([K/256][N][256]: every row's 256-column turn side
 * by side, the grid-stride read's sweep) or in 4-row block tiles, rows on the tensor cores
 * (gc_mma_row, checked against the FMA row first), the singles' blocks capped per SM by unused
 * shared memory, and the grid-stride read.
 *
 * The persistent-kernel table asks whether one persistent kernel per step would do better: the same
 * products in one launch of resident blocks that meet at a grid barrier after each product
 * (the dependency a launch boundary gives now), optionally with each warp's first row of the
 * next product copied into shared memory before the barrier (weights do not depend on the
 * step, so their reads may cross it); and both designs again with a stand-in for the small
 * kernels of a layer (a spin of --phase-us µs on 32 blocks after each layer's input product,
 * where the DeltaNet chain or attention runs), which the persistent design's copies can hide.
 *
 * Layers: 32, every fourth an attention layer (input products 10,240 x 2,560: q and its gate,
 * k, v) and the rest DeltaNet layers (12,352 x 2,560: qkv, z, b, a); output 2,560 x 4,096;
 * gate+up 18,432 x 2,560 (one product of both halves' rows); down 2,560 x 9,216. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "gemv_ceiling: %s (line %d)\n", cudaGetErrorString(e_), __LINE__); \
      exit(2);                                                                           \
    }                                                                                    \
  } while (0)

/* One warp's dot product of a K-row with x: 16-byte pieces per lane, UNR in flight. */
template <int UNR>
__device__ __forceinline__ float gc_row(const bf16 *x, const bf16 *w, int K, int lane) {
  float acc = 0.f;
#pragma unroll UNR
  for (int k = lane * 8; k < K; k += 256) {
    float wf[8], xf[8];
    bf16x8_to_f32(ld_stream16(w + k), wf);
    bf16x8_to_f32(*(const uint4 *)(x + k), xf);
#pragma unroll
    for (int i = 0; i < 8; i++) acc += wf[i] * xf[i];
  }
  return warp_sum(acc);
}

/* A warp per row, WARPS rows per block (the backend's GEMV: 4 warps, 4 pieces in flight). */
template <int WARPS, int UNR>
__global__ void __launch_bounds__(WARPS * 32)
    gc_warp_row(const bf16 *x, const bf16 *W, int K, int N, bf16 *y) {
  int n = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  pdl_enter();
  if (n >= N) return;
  float a = gc_row<UNR>(x, W + (size_t)n * K, K, lane);
  if (lane == 0) y[n] = f2bf(a);
}

/* The same rows over a grid of resident blocks only (each warp loops over rows). */
template <int WARPS, int UNR>
__global__ void __launch_bounds__(WARPS * 32)
    gc_resident(const bf16 *x, const bf16 *W, int K, int N, bf16 *y) {
  int lane = threadIdx.x & 31, nw = gridDim.x * WARPS;
  pdl_enter();
  for (int n = blockIdx.x * WARPS + (threadIdx.x >> 5); n < N; n += nw) {
    float a = gc_row<UNR>(x, W + (size_t)n * K, K, lane);
    if (lane == 0) y[n] = f2bf(a);
  }
}

/* The product's bytes read and folded into one word: no arithmetic per weight. */
__global__ void __launch_bounds__(256)
    gc_read(const bf16 *x, const bf16 *W, int K, int N, bf16 *y) {
  pdl_enter();
  size_t n16 = (size_t)N * K / 8;
  const uint4 *p = (const uint4 *)W;
  unsigned acc = 0;
  for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < n16; i += (size_t)gridDim.x * 256) {
    uint4 u = ld_stream16(p + i);
    acc ^= u.x ^ u.y ^ u.z ^ u.w;
  }
  if (acc == 0x9e3779b9u) y[0] = x[0]; /* never: keeps the loads */
}

/* Random finite bf16 (sign and mantissa random, |w| in [2^-8, 2^-7)): never time on zeros. */
__global__ void gc_fill(unsigned short *w, size_t n, unsigned seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed * 0x9e3779b9u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    w[i] = (unsigned short)(0x3b80u | (h & 0x807fu));
  }
}

/* ---- weight layouts (the products' DRAM pattern) ----
 * Row-major: warp n's lane l reads W[n][l*8 + 256 t] at turn t (the backend). Turn-major,
 * [K/256][N][256]: at turn t every warp's 512 bytes lie side by side, so the grid sweeps the
 * matrix front to back as the grid-stride read does. Block-tiled, [N/WARPS][K/256][WARPS][256]:
 * a block's warps read one contiguous 512 x WARPS bytes per turn. The same sums in every layout. */
template <int LAYOUT, int WARPS>
__device__ __forceinline__ const bf16 *gc_piece(const bf16 *W, int n, int N, int K, int t) {
  if (LAYOUT == 0) return W + (size_t)n * K + (size_t)t * 256;
  if (LAYOUT == 1) return W + ((size_t)t * N + n) * 256;
  int b = n / WARPS, w = n % WARPS;
  return W + (((size_t)b * (K / 256) + t) * WARPS + w) * 256;
}

/* A warp per row over a layout; READ: the loads only, folded into one word (no arithmetic). */
template <int WARPS, int UNR, int LAYOUT, int READ>
__global__ void __launch_bounds__(WARPS * 32)
    gc_layout_row(const bf16 *x, const bf16 *W, int K, int N, bf16 *y) {
  int n = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  pdl_enter();
  if (n >= N) return;
  float acc = 0.f;
  unsigned fold = 0;
#pragma unroll UNR
  for (int t = 0; t < K / 256; t++) {
    uint4 u = ld_stream16(gc_piece<LAYOUT, WARPS>(W, n, N, K, t) + lane * 8);
    if (READ) {
      fold ^= u.x ^ u.y ^ u.z ^ u.w;
    } else {
      float wf[8], xf[8];
      bf16x8_to_f32(u, wf);
      bf16x8_to_f32(*(const uint4 *)(x + t * 256 + lane * 8), xf);
#pragma unroll
      for (int i = 0; i < 8; i++) acc += wf[i] * xf[i];
    }
  }
  if (READ) {
    if (fold == 0x9e3779b9u) y[n] = x[0];
    return;
  }
  acc = warp_sum(acc);
  if (lane == 0) y[n] = f2bf(acc);
}

/* A warp per row on the tensor cores: lane L's 16-byte piece of W (8 values at 8 L + 256 t) and
 * the same 8 values of x form two m16n8k16 products whose B column g = L / 4 is "segment g" of
 * the turn and whose A row g is x over the same segment, so D[g][g] accumulates segment g's dot
 * product (the other entries are cross terms, unused): one load of W, one of x and two mma per
 * piece, no conversions. The diagonal sits in lane 4 g + g / 2 (d0 or d1); a butterfly over
 * those 8 values ends the row. */
template <int WARPS, int UNR>
__global__ void __launch_bounds__(WARPS * 32)
    gc_mma_row(const bf16 *x, const bf16 *W, int K, int N, bf16 *y) {
  int n = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  pdl_enter();
  if (n >= N) return;
  const bf16 *w = W + (size_t)n * K;
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll UNR
  for (int k = lane * 8; k < K; k += 256) {
    uint4 u = ld_stream16(w + k);
    uint4 v = *(const uint4 *)(x + k);
    uint32_t a0[4] = {v.x, 0u, v.y, 0u}, a1[4] = {v.z, 0u, v.w, 0u};
    mma_bf16(d, a0, u.x, u.y);
    mma_bf16(d, a1, u.z, u.w);
  }
  int g = lane >> 2, t = lane & 3;
  float s = (t == (g >> 1)) ? ((g & 1) ? d[1] : d[0]) : 0.f;
  s = warp_sum(s);
  if (lane == 0) y[n] = f2bf(s);
}

/* ---- one kernel per step ---- */

__device__ __forceinline__ unsigned long long gc_now_ns(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned gc_ld_acquire(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* Grid barrier of resident blocks: arrive on a counter, the last one resets it and bumps the
 * generation the others wait on. *want is this block's generation count (thread 0's copy). */
__device__ __forceinline__ void gc_grid_sync(unsigned *count, unsigned *gen, unsigned *want) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned w = ++*want;
    __threadfence();
    if (atomicAdd(count, 1) == gridDim.x - 1) {
      atomicExch(count, 0);
      __threadfence();
      atomicExch(gen, w);
    } else {
      while ((int)(gc_ld_acquire(gen) - w) < 0) {
      }
    }
  }
  __syncthreads();
}

/* A stand-in for a layer's small kernels: the first 32 blocks (threads 0) spin for ns. */
__device__ __forceinline__ void gc_spin_ns(unsigned ns) {
  if (blockIdx.x < 32 && threadIdx.x == 0) {
    unsigned long long t0 = gc_now_ns();
    while (gc_now_ns() - t0 < ns) {
    }
  }
}

__global__ void gc_spin(unsigned ns) {
  pdl_enter();
  gc_spin_ns(ns);
}

struct gc_prod_dev {
  const bf16 *W;
  int N, K;
  int phase; /* 1: a small phase follows this product */
};

/* Copies the first PF 16-byte pieces per lane of row n of p into the warp's slab. */
template <int PF>
__device__ __forceinline__ void gc_pf_issue(const gc_prod_dev &p, int n, uint4 *slab, int lane) {
  if (n < p.N) {
    const bf16 *w = p.W + (size_t)n * p.K + lane * 8;
#pragma unroll
    for (int i = 0; i < PF; i++)
      if (lane * 8 + 256 * i < p.K) cp_async16(&slab[i * 32 + lane], w + 256 * i);
  }
  cp_async_commit();
}

/* The step's products in one launch: warp gw of nw takes rows gw, gw + nw, ...; a grid barrier
 * after each product (and around its small phase). PF > 0: before the barrier each warp copies
 * the start of its first row of the next product into shared memory, read from there after it.
 * K is a multiple of 256 (every lane has the same pieces). */
template <int WARPS, int UNR, int PF>
__global__ void __launch_bounds__(WARPS * 32)
    gc_persist(const gc_prod_dev *ps, int np, const bf16 *x, bf16 *y, unsigned *bar,
               unsigned phase_ns) {
  extern __shared__ uint4 gc_slabs[]; /* [WARPS][PF][32] */
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  int gw = blockIdx.x * WARPS + wp, nw = gridDim.x * WARPS;
  uint4 *slab = gc_slabs + (size_t)wp * (PF > 0 ? PF : 1) * 32;
  unsigned want = 0;
  if (threadIdx.x == 0) want = gc_ld_acquire(bar + 1);
  if (PF > 0) gc_pf_issue<PF>(ps[0], gw, slab, lane);
  for (int i = 0; i < np; i++) {
    gc_prod_dev p = ps[i];
    for (int n = gw; n < p.N; n += nw) {
      const bf16 *w = p.W + (size_t)n * p.K;
      float acc = 0.f;
      int k0 = lane * 8;
      if (PF > 0 && n == gw) {
        cp_async_wait<0>();
        __syncwarp();
#pragma unroll
        for (int j = 0; j < PF; j++)
          if (k0 < p.K) {
            float wf[8], xf[8];
            bf16x8_to_f32(slab[j * 32 + lane], wf);
            bf16x8_to_f32(*(const uint4 *)(x + k0), xf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc += wf[e] * xf[e];
            k0 += 256;
          }
        __syncwarp();
      }
#pragma unroll UNR
      for (int k = k0; k < p.K; k += 256) {
        float wf[8], xf[8];
        bf16x8_to_f32(ld_stream16(w + k), wf);
        bf16x8_to_f32(*(const uint4 *)(x + k), xf);
#pragma unroll
        for (int e = 0; e < 8; e++) acc += wf[e] * xf[e];
      }
      acc = warp_sum(acc);
      if (lane == 0) y[n] = f2bf(acc);
    }
    if (PF > 0 && i + 1 < np) gc_pf_issue<PF>(ps[i + 1], gw, slab, lane);
    gc_grid_sync(bar, bar + 1, &want);
    if (p.phase && phase_ns) {
      gc_spin_ns(phase_ns);
      gc_grid_sync(bar, bar + 1, &want);
    }
  }
  if (PF > 0) cp_async_wait<0>();
}

/* Barriers alone: np of them (the persistent design's fixed cost per product). */
__global__ void __launch_bounds__(512) gc_barriers(int np, unsigned *bar) {
  unsigned want = 0;
  if (threadIdx.x == 0) want = gc_ld_acquire(bar + 1);
  for (int i = 0; i < np; i++) gc_grid_sync(bar, bar + 1, &want);
}

typedef void (*gc_kernel)(const bf16 *, const bf16 *, int, int, bf16 *);

struct gc_design {
  const char *name;
  gc_kernel f;
  int warps;
  int resident; /* 1: grid of resident blocks only */
};

struct gc_product {
  int N, K;
  bf16 *W;
};

/* A launch of grid x block on st with programmatic dependent launch allowed (at: its one
 * attribute, owned by the caller). */
static cudaLaunchConfig_t gc_pdl_config(unsigned grid, unsigned block, cudaStream_t st,
                                        cudaLaunchAttribute *at) {
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.stream = st;
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cfg;
}

static void gc_launch(const gc_design &d, int occ, int nsm, cudaStream_t st, const bf16 *x,
                      const gc_product &p, bf16 *y) {
  int rows_grid = (p.N + d.warps - 1) / d.warps, grid = d.resident ? nsm * occ : rows_grid;
  if (d.resident && d.f != gc_read && grid > rows_grid) grid = rows_grid;
  cudaLaunchAttribute at[1];
  cudaLaunchConfig_t cfg = gc_pdl_config((unsigned)grid, (unsigned)(d.warps * 32), st, at);
  CK(cudaLaunchKernelEx(&cfg, d.f, x, (const bf16 *)p.W, p.K, p.N, y));
}

/* Times `step` (enqueues one step on st): 3 warm-up steps, then the mean of 20 (ms). */
template <typename F>
static double gc_time(cudaStream_t st, F step) {
  for (int r = 0; r < 3; r++) step();
  CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int R = 20;
  CK(cudaEventRecord(a, st));
  for (int r = 0; r < R; r++) step();
  CK(cudaEventRecord(b, st));
  CK(cudaStreamSynchronize(st));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms / R;
}

/* A kernel-per-product step as one graph: every product with `d`, and a spin kernel of
 * phase_ns after each layer's input product when phase_ns > 0. */
static cudaGraphExec_t gc_graph(const gc_design &d, int occ, int nsm, cudaStream_t st,
                                const bf16 *x, const std::vector<gc_product> &ps, bf16 *y,
                                unsigned phase_ns) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (size_t i = 0; i < ps.size(); i++) {
    gc_launch(d, occ, nsm, st, x, ps[i], y);
    if (phase_ns && i % 4 == 0) {
      cudaLaunchAttribute at[1];
      cudaLaunchConfig_t cfg = gc_pdl_config(32, 32, st, at);
      CK(cudaLaunchKernelEx(&cfg, gc_spin, phase_ns));
    }
  }
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

typedef void (*gc_pkernel)(const gc_prod_dev *, int, const bf16 *, bf16 *, unsigned *, unsigned);

struct gc_pdesign {
  const char *name;
  gc_pkernel f;
  int warps, pf;
};

/* One layout design: `big` for products of more than 4,096 rows (WB warps per block), `small`
 * for the others (WS warps: the backend's single products run one-warp blocks); resident: the
 * grid-stride read over nsm * occ blocks instead. */
struct gc_ldesign {
  const char *name;
  gc_kernel big, small;
  int wb, ws, resident;
  int small_smem; /* dynamic shared memory per block of the small products (caps blocks per SM) */
};

/* A graph of the products whose shape index (0 input, 1 out, 2 gate+up, 3 down) is in mask. */
static cudaGraphExec_t gc_lgraph(const gc_ldesign &d, int nsm, cudaStream_t st, const bf16 *x,
                                 const std::vector<gc_product> &ps, bf16 *y, unsigned mask) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (size_t i = 0; i < ps.size(); i++) {
    if (!(mask >> (i % 4) & 1)) continue;
    const gc_product &p = ps[i];
    int small = p.N <= 4096, warps = small ? d.ws : d.wb;
    gc_kernel f = small ? d.small : d.big;
    unsigned grid = (unsigned)((p.N + warps - 1) / warps);
    int smem = small ? d.small_smem : 0;
    if (smem) {
      CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    }
    if (d.resident) {
      int occ;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, f, warps * 32, 0));
      grid = (unsigned)(nsm * occ);
    }
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = gc_pdl_config(grid, (unsigned)(warps * 32), st, at);
    cfg.dynamicSmemBytes = (size_t)smem;
    CK(cudaLaunchKernelEx(&cfg, f, x, (const bf16 *)p.W, p.K, p.N, y));
  }
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

/* The mma row against the FMA row on one product: the largest difference over the largest |y|. */
static void gc_check_mma(cudaStream_t st, const bf16 *x, const gc_product &p) {
  bf16 *ya, *yb;
  CK(cudaMalloc(&ya, (size_t)p.N * 2));
  CK(cudaMalloc(&yb, (size_t)p.N * 2));
  gc_layout_row<4, 4, 0, 0><<<(p.N + 3) / 4, 128, 0, st>>>(x, p.W, p.K, p.N, ya);
  gc_mma_row<4, 4><<<(p.N + 3) / 4, 128, 0, st>>>(x, p.W, p.K, p.N, yb);
  CK(cudaStreamSynchronize(st));
  std::vector<unsigned short> ha(p.N), hb(p.N);
  CK(cudaMemcpy(ha.data(), ya, (size_t)p.N * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), yb, (size_t)p.N * 2, cudaMemcpyDeviceToHost));
  double mx = 0, md = 0;
  int same = 0;
  for (int i = 0; i < p.N; i++) {
    unsigned ua = (unsigned)ha[i] << 16, ub = (unsigned)hb[i] << 16;
    float fa, fb;
    memcpy(&fa, &ua, 4);
    memcpy(&fb, &ub, 4);
    mx = fmax(mx, fabs(fa));
    md = fmax(md, fabs(fa - fb));
    same += ha[i] == hb[i];
  }
  printf("mma row check (%d x %d): max |fma - mma| / max |y| = %.3e, %d of %d outputs equal\n", p.N,
         p.K, md / mx, same, p.N);
  CK(cudaFree(ya));
  CK(cudaFree(yb));
}

/* The layout table: each design over the whole step and over each product class, µs per product
 * and TB/s; every design timed in R alternating rounds (the medians printed). */
static void gc_layouts(int nsm, cudaStream_t st, const bf16 *x, const std::vector<gc_product> &ps,
                       bf16 *y, FILE *jf) {
  const gc_ldesign ds[] = {
      {"row-major GEMV (backend: 4 warps, singles 1)", gc_layout_row<4, 4, 0, 0>,
       gc_layout_row<1, 4, 0, 0>, 4, 1, 0},
      {"row-major loads only", gc_layout_row<4, 4, 0, 1>, gc_layout_row<1, 4, 0, 1>, 4, 1, 0},
      {"turn-major GEMV [K/256][N][256]", gc_layout_row<4, 4, 1, 0>, gc_layout_row<1, 4, 1, 0>, 4,
       1, 0},
      {"turn-major loads only", gc_layout_row<4, 4, 1, 1>, gc_layout_row<1, 4, 1, 1>, 4, 1, 0},
      {"block-tiled GEMV, 4 warps everywhere", gc_layout_row<4, 4, 2, 0>, gc_layout_row<4, 4, 2, 0>,
       4, 4, 0},
      {"row-major GEMV, 4 warps everywhere", gc_layout_row<4, 4, 0, 0>, gc_layout_row<4, 4, 0, 0>,
       4, 4, 0},
      {"turn-major GEMV, 4 warps everywhere", gc_layout_row<4, 4, 1, 0>, gc_layout_row<4, 4, 1, 0>,
       4, 4, 0},
      {"mma GEMV (4 warps, singles 1)", gc_mma_row<4, 4>, gc_mma_row<1, 4>, 4, 1, 0},
      {"mma GEMV, 4 warps everywhere", gc_mma_row<4, 4>, gc_mma_row<4, 4>, 4, 4, 0},
      {"mma GEMV, 8 in flight (4 warps, singles 1)", gc_mma_row<4, 8>, gc_mma_row<1, 8>, 4, 1, 0},
      {"grid-stride read (ceiling)", gc_read, gc_read, 8, 8, 1},
      {"backend, singles capped at 24 blocks/SM (8 KB smem)", gc_layout_row<4, 4, 0, 0>,
       gc_layout_row<1, 4, 0, 0>, 4, 1, 0, 8192},
      {"backend, singles capped at 20 blocks/SM (10 KB smem)", gc_layout_row<4, 4, 0, 0>,
       gc_layout_row<1, 4, 0, 0>, 4, 1, 0, 10240},
      {"backend, singles capped at 16 blocks/SM (13 KB smem)", gc_layout_row<4, 4, 0, 0>,
       gc_layout_row<1, 4, 0, 0>, 4, 1, 0, 13312},
  };
  const int ND = sizeof ds / sizeof ds[0], NM = 5, R = 5;
  const unsigned masks[NM] = {15u, 1u, 2u, 4u, 8u};
  const char *mname[NM] = {"step", "input", "out", "gate+up", "down"};
  double mbytes[NM] = {0}, mcount[NM] = {0};
  for (size_t i = 0; i < ps.size(); i++)
    for (int m = 0; m < NM; m++)
      if (masks[m] >> (i % 4) & 1) {
        mbytes[m] += 2.0 * ps[i].N * ps[i].K;
        mcount[m] += 1;
      }
  std::vector<cudaGraphExec_t> ge(ND * NM);
  for (int d = 0; d < ND; d++)
    for (int m = 0; m < NM; m++) ge[d * NM + m] = gc_lgraph(ds[d], nsm, st, x, ps, y, masks[m]);
  std::vector<double> ms(ND * NM * R);
  for (int r = 0; r < R; r++)
    for (int m = 0; m < NM; m++)
      for (int d = 0; d < ND; d++) {
        cudaGraphExec_t g = ge[d * NM + m];
        ms[(d * NM + m) * R + r] = gc_time(st, [&] { CK(cudaGraphLaunch(g, st)); });
      }
  printf("layouts (random weights; median of %d alternating rounds; us per product, TB/s):\n", R);
  printf("  %-46s", "");
  for (int m = 0; m < NM; m++) printf(" %16s", mname[m]);
  printf("\n");
  if (jf) fprintf(jf, ", \"layouts\": [");
  for (int d = 0; d < ND; d++) {
    printf("  %-46s", ds[d].name);
    if (jf) fprintf(jf, "%s{\"design\": \"%s\"", d ? ", " : "", ds[d].name);
    for (int m = 0; m < NM; m++) {
      double *v = &ms[(d * NM + m) * R];
      std::vector<double> s(v, v + R);
      std::sort(s.begin(), s.end());
      double med = s[R / 2], us = med * 1e3 / mcount[m], tbs = mbytes[m] / (med * 1e-3) / 1e12;
      if (m == 0)
        printf(" %7.3f ms %4.2f", med, tbs);
      else
        printf(" %7.2f us %4.2f", us, tbs);
      if (jf) fprintf(jf, ", \"%s_ms\": %.4f, \"%s_tb_s\": %.3f", mname[m], med, mname[m], tbs);
    }
    printf("\n");
    if (jf) fprintf(jf, "}");
  }
  if (jf) fprintf(jf, "]");
  for (cudaGraphExec_t g : ge) CK(cudaGraphExecDestroy(g));
}

int main(int argc, char **argv) {
  const char *json = NULL;
  double phase_us = 8.0;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--json"))
      json = argv[a + 1];
    else if (!strcmp(argv[a], "--phase-us"))
      phase_us = atof(argv[a + 1]);
  }
  unsigned phase_ns = (unsigned)(phase_us * 1000.0);
  int nsm;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::vector<gc_product> ps;
  double bytes = 0;
  for (int l = 0; l < 32; l++) {
    int in_rows = l % 4 == 3 ? 10240 : 12352;
    int shapes[4][2] = {{in_rows, 2560}, {2560, 4096}, {18432, 2560}, {2560, 9216}};
    for (int s = 0; s < 4; s++) {
      gc_product p = {shapes[s][0], shapes[s][1], NULL};
      size_t b = (size_t)p.N * p.K * 2;
      CK(cudaMalloc(&p.W, b));
      gc_fill<<<2048, 256>>>((unsigned short *)p.W, b / 2, (unsigned)(l * 4 + s));
      CK(cudaGetLastError());
      bytes += (double)b;
      ps.push_back(p);
    }
  }
  bf16 *x, *y;
  CK(cudaMalloc(&x, 1 << 20));
  gc_fill<<<256, 256>>>((unsigned short *)x, (1 << 20) / 2, 977u);
  CK(cudaGetLastError());
  CK(cudaMalloc(&y, 1 << 20));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const gc_design ds[] = {
      {"warp per row, 4 warps, 4 in flight (backend)", gc_warp_row<4, 4>, 4, 0},
      {"warp per row, 8 warps, 4 in flight", gc_warp_row<8, 4>, 8, 0},
      {"warp per row, 16 warps, 4 in flight", gc_warp_row<16, 4>, 16, 0},
      {"warp per row, 8 warps, 2 in flight", gc_warp_row<8, 2>, 8, 0},
      {"warp per row, 8 warps, 8 in flight", gc_warp_row<8, 8>, 8, 0},
      {"resident blocks, 8 warps, 4 in flight", gc_resident<8, 4>, 8, 1},
      {"streaming read only (ceiling)", gc_read, 8, 1},
  };
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (jf)
    fprintf(jf, "{\"gpu\": \"%s\", \"products\": %zu, \"bytes\": %.0f, ", prop.name, ps.size(),
            bytes);
  printf("gemv_ceiling: %s, %zu products, %.2f GB per step\n", prop.name, ps.size(), bytes / 1e9);
  if (jf) fprintf(jf, "\"layout_table\": 1");
  gc_check_mma(st, x, ps[1]);
  gc_check_mma(st, x, ps[3]);
  gc_layouts(nsm, st, x, ps, y, jf);
  if (jf) fprintf(jf, ", \"designs\": [");
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    const gc_design &d = ds[i];
    int occ;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, d.f, d.warps * 32, 0));
    cudaGraphExec_t ge = gc_graph(d, occ, nsm, st, x, ps, y, 0);
    double per = gc_time(st, [&] { CK(cudaGraphLaunch(ge, st)); });
    double tbs = bytes / (per * 1e-3) / 1e12;
    double fixed_us = (per - bytes / 4.0e12 * 1e3) * 1e3 / (double)ps.size();
    printf("  %-46s %2d blocks/SM  %.3f ms  %.2f TB/s  fixed %.2f us/product at 4.0 TB/s\n", d.name,
           occ, per, tbs, fixed_us);
    if (jf)
      fprintf(jf,
              "%s{\"design\": \"%s\", \"blocks_per_sm\": %d, \"ms\": %.4f, \"tb_s\": %.3f, "
              "\"fixed_us_per_product\": %.3f}",
              i ? ", " : "", d.name, occ, per, tbs, fixed_us);
    CK(cudaGraphExecDestroy(ge));
  }
  if (jf) fprintf(jf, "], \"phase_us\": %.1f, \"one_kernel\": [", phase_us);

  /* ---- one kernel per step ---- */
  std::vector<gc_prod_dev> hp;
  for (size_t i = 0; i < ps.size(); i++) hp.push_back({ps[i].W, ps[i].N, ps[i].K, i % 4 == 0});
  gc_prod_dev *dp;
  CK(cudaMalloc(&dp, hp.size() * sizeof *dp));
  CK(cudaMemcpy(dp, hp.data(), hp.size() * sizeof *dp, cudaMemcpyHostToDevice));
  unsigned *bar;
  CK(cudaMalloc(&bar, 2 * sizeof *bar));
  CK(cudaMemset(bar, 0, 2 * sizeof *bar));
  int np = (int)ps.size(), first = 1;
  printf(
      "one kernel per step (grid barrier after each product; phase: %.1f us spin on 32 blocks "
      "after each layer's input product)\n",
      phase_us);
  for (int bps = 1; bps <= 4; bps *= 2) {
    int grid = nsm * bps;
    void *args[] = {&np, &bar};
    double per = gc_time(st, [&] {
      CK(cudaLaunchCooperativeKernel((void *)gc_barriers, dim3(grid), dim3(512), args, 0, st));
    });
    printf("  %-46s %2d blocks/SM  %.2f us per barrier\n", "grid barriers alone", bps,
           per * 1e3 / np);
    if (jf)
      fprintf(jf,
              "%s{\"design\": \"grid barriers alone\", \"blocks_per_sm\": %d, "
              "\"us_per_barrier\": %.3f}",
              first ? "" : ", ", bps, per * 1e3 / np);
    first = 0;
  }
  for (int ph = 0; ph < 2; ph++) {
    unsigned pns = ph ? phase_ns : 0;
    {
      const gc_design &d = ds[0];
      int occ;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, d.f, d.warps * 32, 0));
      cudaGraphExec_t ge = gc_graph(d, occ, nsm, st, x, ps, y, pns);
      double per = gc_time(st, [&] { CK(cudaGraphLaunch(ge, st)); });
      printf("  %-46s phase %4.1f us  %.3f ms  %.2f TB/s\n", "kernel per product (backend design)",
             pns / 1e3, per, bytes / (per * 1e-3) / 1e12);
      if (jf)
        fprintf(jf,
                ", {\"design\": \"kernel per product (backend design)\", \"phase_us\": %.1f, "
                "\"ms\": %.4f}",
                pns / 1e3, per);
      CK(cudaGraphExecDestroy(ge));
    }
    const gc_pdesign pds[] = {
        {"one kernel, 16 warps, barrier per product", gc_persist<16, 4, 0>, 16, 0},
        {"one kernel, 8 warps, barrier per product", gc_persist<8, 4, 0>, 8, 0},
        {"one kernel, 16 warps, next 2 KB/warp copied", gc_persist<16, 4, 4>, 16, 4},
        {"one kernel, 16 warps, next 4 KB/warp copied", gc_persist<16, 4, 8>, 16, 8},
        {"one kernel, 8 warps, next 4 KB/warp copied", gc_persist<8, 4, 8>, 8, 8},
        {"one kernel, 8 warps, next 8 KB/warp copied", gc_persist<8, 4, 16>, 8, 16},
    };
    for (const gc_pdesign &d : pds) {
      size_t smem = (size_t)d.warps * (d.pf > 0 ? d.pf : 1) * 32 * 16;
      CK(cudaFuncSetAttribute(d.f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      int occ;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, d.f, d.warps * 32, smem));
      int grid = nsm * occ;
      const bf16 *xc = x;
      void *args[] = {&dp, &np, &xc, &y, &bar, &pns};
      double per = gc_time(st, [&] {
        CK(cudaLaunchCooperativeKernel((void *)d.f, dim3(grid), dim3(d.warps * 32), args, smem,
                                       st));
      });
      printf("  %-46s phase %4.1f us  %.3f ms  %.2f TB/s  (%d blocks/SM)\n", d.name, pns / 1e3, per,
             bytes / (per * 1e-3) / 1e12, occ);
      if (jf)
        fprintf(jf,
                ", {\"design\": \"%s\", \"phase_us\": %.1f, \"blocks_per_sm\": %d, "
                "\"ms\": %.4f, \"tb_s\": %.3f}",
                d.name, pns / 1e3, occ, per, bytes / (per * 1e-3) / 1e12);
    }
  }
  CK(cudaFree(dp));
  CK(cudaFree(bar));
  if (jf) {
    fprintf(jf, "]}\n");
    fclose(jf);
  }
  return 0;
}
