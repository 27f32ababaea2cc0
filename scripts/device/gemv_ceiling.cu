/* gemv_ceiling — how fast can a decode step's weight products go when each is its own kernel?
 *
 * A one-sequence decode step of the 4B shape streams ~7.2 GB of weights through 128 products
 * (per layer: the input projections, the output projection, gate+up, down), each a kernel that
 * waits for the one before (programmatic dependent launch, as the backend's captured steps).
 * This program times exactly that sequence in one CUDA graph, with zeroed bf16 weights at the
 * real shapes (the time does not depend on the values), for a few GEMV designs and for a plain streaming read of the same
 * bytes (no arithmetic: the ceiling of a kernel-per-product step on this GPU). It prints one
 * line per design: ms per step of products, TB/s, and the fixed cost per product implied at
 * 4.0 TB/s streaming. Build and run on the GPU machine with scripts/device/gemv_ceiling.sh.
 *
 * Layers: 32, every fourth an attention layer (input products 10,240 x 2,560: q and its gate,
 * k, v) and the rest DeltaNet layers (12,352 x 2,560: qkv, z, b, a); output 2,560 x 4,096;
 * gate+up 18,432 x 2,560 (one product of both halves' rows); down 2,560 x 9,216. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_common.cuh"

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      fprintf(stderr, "gemv_ceiling: %s (line %d)\n", cudaGetErrorString(e_), __LINE__); \
      exit(2);                                                                   \
    }                                                                            \
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

/* A warp per row, WARPS rows per block (the backend's GEMV: 8 warps, 4 pieces in flight). */
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
__global__ void __launch_bounds__(256) gc_read(const bf16 *x, const bf16 *W, int K, int N, bf16 *y) {
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

static void gc_launch(const gc_design &d, int occ, int nsm, cudaStream_t st, const bf16 *x,
                      const gc_product &p, bf16 *y) {
  int rows_grid = (p.N + d.warps - 1) / d.warps, grid = d.resident ? nsm * occ : rows_grid;
  if (d.resident && d.f != gc_read && grid > rows_grid) grid = rows_grid;
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3((unsigned)(d.warps * 32));
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, d.f, x, (const bf16 *)p.W, p.K, p.N, y));
}

int main(int argc, char **argv) {
  const char *json = argc > 2 && !strcmp(argv[1], "--json") ? argv[2] : NULL;
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
      CK(cudaMemset(p.W, 0, b));
      bytes += (double)b;
      ps.push_back(p);
    }
  }
  bf16 *x, *y;
  CK(cudaMalloc(&x, 1 << 20));
  CK(cudaMemset(x, 0, 1 << 20));
  CK(cudaMalloc(&y, 1 << 20));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const gc_design ds[] = {
      {"warp per row, 8 warps, 4 in flight (backend)", gc_warp_row<8, 4>, 8, 0},
      {"warp per row, 4 warps, 4 in flight", gc_warp_row<4, 4>, 4, 0},
      {"warp per row, 16 warps, 4 in flight", gc_warp_row<16, 4>, 16, 0},
      {"warp per row, 8 warps, 2 in flight", gc_warp_row<8, 2>, 8, 0},
      {"warp per row, 8 warps, 8 in flight", gc_warp_row<8, 8>, 8, 0},
      {"resident blocks, 8 warps, 4 in flight", gc_resident<8, 4>, 8, 1},
      {"streaming read only (ceiling)", gc_read, 8, 1},
  };
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (jf)
    fprintf(jf, "{\"gpu\": \"%s\", \"products\": %zu, \"bytes\": %.0f, \"designs\": [", prop.name,
            ps.size(), bytes);
  printf("gemv_ceiling: %s, %zu products, %.2f GB per step\n", prop.name, ps.size(), bytes / 1e9);
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    const gc_design &d = ds[i];
    int occ;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, d.f, d.warps * 32, 0));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (const gc_product &p : ps) gc_launch(d, occ, nsm, st, x, p, y);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int R = 20;
    CK(cudaEventRecord(a, st));
    for (int r = 0; r < R; r++) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaStreamSynchronize(st));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    double per = ms / R, tbs = bytes / (per * 1e-3) / 1e12;
    double fixed_us = (per - bytes / 4.0e12 * 1e3) * 1e3 / (double)ps.size();
    printf("  %-46s %2d blocks/SM  %.3f ms  %.2f TB/s  fixed %.2f us/product at 4.0 TB/s\n",
           d.name, occ, per, tbs, fixed_us);
    if (jf)
      fprintf(jf, "%s{\"design\": \"%s\", \"blocks_per_sm\": %d, \"ms\": %.4f, \"tb_s\": %.3f, "
                  "\"fixed_us_per_product\": %.3f}",
              i ? ", " : "", d.name, occ, per, tbs, fixed_us);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
  }
  if (jf) {
    fprintf(jf, "]}\n");
    fclose(jf);
  }
  return 0;
}
