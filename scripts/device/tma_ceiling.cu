/* tma_ceiling — how fast can the tensor memory accelerator (TMA) stream a decode step's weights?
 *
 * A wgmma GEMM for the decode steps of 17-128 rows is fed by TMA: each stage copies a box of
 * the weights [N, K] (bf16, row-major) into shared memory. wgmma's operands want a 128-byte
 * swizzle, and that swizzle allows boxes of at most 64 columns (128 bytes of a row). This
 * program measures what such copies can stream with no arithmetic at all: one block per SM,
 * each a contiguous run of whole row tiles, a producer thread filling a ring of stages and a
 * consumer warp releasing them, for several box shapes (64 x 64/128/256 swizzled; 2 or 4
 * swizzled boxes per stage along K, so a row's 256 / 512 contiguous bytes are requested
 * together; unswizzled boxes 128 and 256 columns wide) and ring depths, on three products of
 * the 4B shape (gate+up 18,432 x 2,560, down 2,560 x 9,216, qkv+z 12,288 x 2,560; zeroed
 * weights, four copies rotated so none is still in L2). It prints µs per product and TB/s, and
 * with --json PATH writes the same rows. bench/NOTES.md (eleventh session) has what it showed:
 * the bytes of a row one request covers decide the DRAM rate, and 64-column boxes stop near
 * 2.9 TB/s. Build and run on the GPU machine with scripts/device/tma_ceiling.sh. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "tma_ceiling: %s (line %d)\n", cudaGetErrorString(e_), __LINE__); \
      exit(2);                                                                          \
    }                                                                                   \
  } while (0)

#define TC_MAXST 32

__device__ __forceinline__ uint32_t tc_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void tc_bar_init(uint64_t *b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(tc_u32(b)), "r"(count) : "memory");
}

__device__ __forceinline__ void tc_bar_expect(uint64_t *b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(tc_u32(b)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void tc_bar_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(tc_u32(b)) : "memory");
}

/* waits until the barrier's phase of this parity has completed */
__device__ __forceinline__ void tc_bar_wait(uint64_t *b, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(tc_u32(b)), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void tc_tma(void *dst, const CUtensorMap *m, int c0, int c1,
                                       uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(tc_u32(dst)),
      "l"((uint64_t)m), "r"(c0), "r"(c1), "r"(tc_u32(bar))
      : "memory");
}

/* Block p streams row tiles [p tiles / P, (p+1) tiles / P) of the weights, each as K / (bc nb)
 * stages of nb boxes of bc columns x br rows. Warp 1's first thread copies, warp 0 waits for
 * each stage and releases it (reading one word of it, so the copy is used). */
__global__ void k_stream(const __grid_constant__ CUtensorMap m, int N, int K, int bc, int br,
                         int st_n, int nb, float *sink) {
  extern __shared__ uint8_t raw[];
  __shared__ __align__(8) uint64_t full[TC_MAXST], empty[TC_MAXST];
  uint8_t *ring = raw + ((1024u - (tc_u32(raw) & 1023u)) & 1023u);
  int box = bc * br * 2, sb = box * nb, tiles = N / br, P = gridDim.x, p = blockIdx.x;
  int t0 = (int)((long)p * tiles / P), t1 = (int)((long)(p + 1) * tiles / P);
  int ks = K / (bc * nb), total = (t1 - t0) * ks;
  if (threadIdx.x == 0) {
    for (int i = 0; i < st_n; i++) {
      tc_bar_init(&full[i], 1);
      tc_bar_init(&empty[i], 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 32) {
    for (int n = 0; n < total; n++) {
      int st = n % st_n, t = t0 + n / ks, kb = n % ks;
      tc_bar_wait(&empty[st], ((n / st_n) & 1) ^ 1);
      tc_bar_expect(&full[st], sb);
      for (int q = 0; q < nb; q++)
        tc_tma(ring + st * sb + q * box, &m, (kb * nb + q) * bc, t * br, &full[st]);
    }
  } else if (threadIdx.x < 32) {
    float acc = 0.f;
    for (int n = 0; n < total; n++) {
      int st = n % st_n;
      tc_bar_wait(&full[st], (n / st_n) & 1);
      acc += ((const float *)(ring + st * sb))[threadIdx.x];
      tc_bar_arrive(&empty[st]);
    }
    if (acc == 12345.f) sink[0] = acc; /* never: keeps the reads */
  }
}

typedef struct shape {
  const char *name;
  int N, K;
} shape;

typedef struct variant {
  int bc, br, swizzle, nb, ring_kb;
} variant;

int main(int argc, char **argv) {
  const char *json = NULL;
  for (int a = 1; a + 1 < argc; a++)
    if (!strcmp(argv[a], "--json")) json = argv[a + 1];
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || !fn) {
    fprintf(stderr, "tma_ceiling: no cuTensorMapEncodeTiled in this driver\n");
    return 2;
  }
  PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int nsm = prop.multiProcessorCount;
  const shape shapes[] = {{"gate+up", 18432, 2560}, {"down", 2560, 9216}, {"qkv+z", 12288, 2560}};
  const variant vs[] = {
      {64, 128, 1, 1, 64},  {64, 128, 1, 1, 128}, {64, 128, 1, 1, 200},  {64, 64, 1, 1, 200},
      {64, 256, 1, 1, 200}, {64, 128, 1, 2, 200}, {64, 128, 1, 4, 200},  {128, 64, 0, 1, 200},
      {256, 32, 0, 1, 200}, {256, 16, 0, 1, 200}, {128, 128, 0, 1, 200}, {256, 64, 0, 1, 200},
  };
  const int copies = 4, reps = 20;
  float *sink;
  CK(cudaMalloc(&sink, sizeof(float)));
  CK(cudaFuncSetAttribute(k_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (jf) fprintf(jf, "{\"gpu\": \"%s\", \"sms\": %d, \"rows\": [", prop.name, nsm);
  int first = 1;
  printf("%-8s %6s %5s %9s %7s %6s %6s %8s %4s %9s %7s\n", "product", "N", "K", "box", "swizzle",
         "boxes", "stages", "ring KB", "P", "us", "TB/s");
  for (const shape &sh : shapes) {
    size_t bytes = (size_t)sh.N * sh.K * 2;
    std::vector<void *> W(copies);
    for (void *&w : W) {
      CK(cudaMalloc(&w, bytes));
      CK(cudaMemset(w, 0, bytes));
    }
    for (const variant &v : vs) {
      int sb = v.bc * v.br * 2 * v.nb, st_n = v.ring_kb * 1024 / sb;
      if (st_n > TC_MAXST) st_n = TC_MAXST;
      if (st_n < 2 || sh.K % (v.bc * v.nb) || sh.N % v.br) continue;
      std::vector<CUtensorMap> maps(copies);
      int ok = 1;
      for (int c = 0; c < copies; c++) {
        cuuint64_t dims[2] = {(cuuint64_t)sh.K, (cuuint64_t)sh.N}, str[1] = {(cuuint64_t)sh.K * 2};
        cuuint32_t box[2] = {(cuuint32_t)v.bc, (cuuint32_t)v.br}, es[2] = {1, 1};
        ok &= encode(&maps[c], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, W[c], dims, str, box, es,
                     CU_TENSOR_MAP_INTERLEAVE_NONE,
                     v.swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
      }
      if (!ok) {
        fprintf(stderr, "tma_ceiling: box %dx%d not encodable\n", v.bc, v.br);
        continue;
      }
      size_t smem = (size_t)st_n * sb + 1024;
      int P = nsm < sh.N / v.br ? nsm : sh.N / v.br;
      for (int it = 0; it < 3; it++)
        k_stream<<<P, 64, smem>>>(maps[it % copies], sh.N, sh.K, v.bc, v.br, st_n, v.nb, sink);
      CK(cudaDeviceSynchronize());
      CK(cudaEventRecord(e0));
      for (int it = 0; it < reps; it++)
        k_stream<<<P, 64, smem>>>(maps[it % copies], sh.N, sh.K, v.bc, v.br, st_n, v.nb, sink);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      double us = ms * 1000.0 / reps, tbs = bytes / us * 1e-6;
      printf("%-8s %6d %5d %4dx%-4d %7s %6d %6d %8d %4d %9.2f %7.2f\n", sh.name, sh.N, sh.K, v.bc,
             v.br, v.swizzle ? "128B" : "none", v.nb, st_n, st_n * sb / 1024, P, us, tbs);
      if (jf)
        fprintf(jf,
                "%s{\"product\": \"%s\", \"N\": %d, \"K\": %d, \"box_cols\": %d, \"box_rows\": %d, "
                "\"swizzle_128b\": %d, \"boxes_per_stage\": %d, \"stages\": %d, \"blocks\": %d, "
                "\"us\": %.3f, \"tb_s\": %.3f}",
                first ? "" : ", ", sh.name, sh.N, sh.K, v.bc, v.br, v.swizzle, v.nb, st_n, P, us,
                tbs);
      first = 0;
    }
    for (void *w : W) CK(cudaFree(w));
  }
  if (jf) {
    fprintf(jf, "]}\n");
    fclose(jf);
  }
  return 0;
}
