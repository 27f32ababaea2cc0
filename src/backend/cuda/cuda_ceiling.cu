/* cuda_ceiling — the two ceilings the benchmark's roofline divides by, measured on the device of
 * the benchmark's own run: a device-to-device copy (bytes read plus bytes written per second)
 * and a bf16 GEMM of 8,192^3 on cuBLAS with fp32 accumulation (FLOP/s). The roofline keeps its
 * fixed H200 figures (4.24 TB/s, 780 TFLOP/s, design/anchors.md) as the denominators so that
 * runs stay comparable; these say how far this machine, this run, is from them. Each figure is
 * the best of three timed batches after two untimed launches; the buffers are freed after. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_common.cuh"

#define CEIL_COPY_BYTES ((size_t)1 << 30) /* each of source and destination */
#define CEIL_COPY_REPS 8
#define CEIL_GEMM_N 8192
#define CEIL_GEMM_REPS 5
#define CEIL_BATCHES 3

/* ms of the work `run` issues on stream st, best of CEIL_BATCHES batches, or -1 on an error */
template <typename F>
static float ceiling_time(cudaStream_t st, F run, int reps) {
  cudaEvent_t a, b;
  if (cudaEventCreate(&a) != cudaSuccess) return -1.f;
  if (cudaEventCreate(&b) != cudaSuccess) {
    cudaEventDestroy(a);
    return -1.f;
  }
  float best = -1.f;
  int ok = run() && run(); /* untimed: clocks up, the library's kernels loaded */
  for (int i = 0; ok && i < CEIL_BATCHES; i++) {
    ok = cudaEventRecord(a, st) == cudaSuccess;
    for (int r = 0; ok && r < reps; r++) ok = run();
    float ms = 0.f;
    ok = ok && cudaEventRecord(b, st) == cudaSuccess && cudaEventSynchronize(b) == cudaSuccess &&
         cudaEventElapsedTime(&ms, a, b) == cudaSuccess;
    if (ok && ms > 0.f && (best < 0.f || ms < best)) best = ms;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ok ? best : -1.f;
}

/* n bf16 values of a fixed pseudo-random sequence in [-1, 1) into device memory */
static int ceiling_fill(bf16 *d, size_t n, uint32_t seed) {
  uint16_t *h = (uint16_t *)malloc(n * sizeof *h);
  if (!h) return 0;
  uint32_t s = seed;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    float f = (float)(s >> 8) / 8388608.f - 1.f;
    uint32_t u;
    memcpy(&u, &f, 4);
    h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  int ok = cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) == cudaSuccess;
  free(h);
  return ok;
}

extern "C" int backend_cuda_ceilings(backend *be, double *copy_bytes_s, double *gemm_flops_s,
                                     char *err, size_t errlen) {
  cuda_ctx *c = cuda_ctx_of(be);
  *copy_bytes_s = 0;
  *gemm_flops_s = 0;
  if (be->sync(be, err, errlen)) return -1;
  const char *what = NULL;
  void *src = NULL, *dst = NULL;
  bf16 *A = NULL, *B = NULL, *C = NULL;
  size_t n = CEIL_COPY_BYTES, g = (size_t)CEIL_GEMM_N * CEIL_GEMM_N;
  if (cudaMalloc(&src, n) != cudaSuccess || cudaMalloc(&dst, n) != cudaSuccess ||
      cudaMemset(src, 1, n) != cudaSuccess) {
    what = "copy buffers (2 GiB)";
  } else {
    float ms = ceiling_time(
        c->st,
        [&] {
          return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->st) == cudaSuccess;
        },
        CEIL_COPY_REPS);
    if (ms > 0.f)
      *copy_bytes_s = 2.0 * (double)n * CEIL_COPY_REPS / (ms * 1e-3);
    else
      what = "timed copies";
  }
  cudaFree(src);
  cudaFree(dst);
  if (!what) {
    if (cudaMalloc(&A, g * 2) != cudaSuccess || cudaMalloc(&B, g * 2) != cudaSuccess ||
        cudaMalloc(&C, g * 2) != cudaSuccess || !ceiling_fill(A, g, 1) || !ceiling_fill(B, g, 2)) {
      what = "GEMM operands (384 MiB)";
    } else {
      const float alpha = 1.f, beta = 0.f;
      const int N = CEIL_GEMM_N;
      float ms = ceiling_time(
          c->st,
          [&] {
            return cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &alpha, A, CUDA_R_16BF,
                                N, B, CUDA_R_16BF, N, &beta, C, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
          },
          CEIL_GEMM_REPS);
      if (ms > 0.f)
        *gemm_flops_s = 2.0 * N * (double)N * N * CEIL_GEMM_REPS / (ms * 1e-3);
      else
        what = "timed GEMMs";
    }
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
  }
  cudaGetLastError(); /* a failed allocation leaves nothing sticky behind */
  if (what) {
    if (err && errlen) snprintf(err, errlen, "ceilings: %s failed", what);
    return -1;
  }
  return 0;
}
