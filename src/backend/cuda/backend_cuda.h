/* backend_cuda — the CUDA implementation of the op table (backend/backend.h) for one NVIDIA
 * GPU (built for sm_90a): bf16 activations and K/V pages with fp32 accumulation, fp32
 * DeltaNet state, cuBLAS bf16 GEMMs, every op enqueued on one stream. Includable from C. */
#ifndef DS_BACKEND_CUDA_H
#define DS_BACKEND_CUDA_H
#include <stddef.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when at least one CUDA device is usable, else 0 (never fails loudly). */
int backend_cuda_available(void);

/* The backend on device `device` with opt's choices (opt->device and n_threads unused), or NULL
 * with one line in err (no device, out of memory, library initialisation failure). */
backend *backend_cuda_create(int device, const backend_options *opt, char *err, size_t errlen);

/* Test-only: paths a test forces where the product's choice would hide them. A zeroed struct
 * is the product's choice; backend_cuda_create is backend_cuda_create_test with NULL. */
typedef struct backend_cuda_test {
  int no_graphs;      /* ops launched as issued: no recording, rewrites or graphs (the reference
                       * the decode graphs are compared with, bit for bit) */
  int no_norm_fold;   /* the recorder keeps every rmsnorm (the fold changes the bits) */
  int no_repeat;      /* step_repeat always declines (the recorded path instead) */
  int no_attn_flash;  /* long prefill pieces through the GEMM attention path (the fallback of
                       * the shapes the fused kernel does not cover) */
  int attn_gemm_rows; /* > 0: the GEMM attention path's query rows per block capped */
  int no_attn_shared; /* decode rows sharing KV pages each read them by itself */
  int packed_rows;    /* > 0: products of up to this many rows (<= 4) read the packed copies */
  int no_moe_grouped; /* every MoE step through the per-row kernels */
  int moe_dev_all;    /* every grouped MoE step (any row count) on the device-grouped kernels */
  int moe_cublas;     /* every grouped MoE step through the per-expert cuBLAS GEMMs */
} backend_cuda_test;
backend *backend_cuda_create_test(int device, const backend_options *opt,
                                  const backend_cuda_test *t, char *err, size_t errlen);

/* Counters of the decode-step recorder: out[0] graphs captured, out[1] graph replays,
 * out[2] recorded steps run launch by launch, out[3] launches saved by fusing ops, out[4]
 * programmatic edges (kernels launched before the previous one finished) in the graphs captured,
 * out[5] steps that ran the step before's graph again without recording (step_repeat; they
 * count among the replays). All 0 when recording is off (backend_cuda_test no_graphs).
 * For tests and benchmarks. */
void backend_cuda_graph_stats(backend *be, long out[6]);

/* Split-attention launches (replays of a captured step not counted): [0] the ones that took a
 * kv head's q heads in sub-groups (cuda_attn.cu att_heads_per_block), [1] always 0 (kept for
 * the callers' layout). For tests. */
void backend_cuda_attn_launches(backend *be, long out[2]);
/* MoE ops that took the device-grouped path (cuda_moe.cu). For tests. */
long backend_cuda_moe_dev_runs(backend *be);

/* rmsnorms the decode-step recorder took off the products' critical path (cuda_graph.cu
 * norm_fold_at). For tests and benchmarks. */
long backend_cuda_norm_folds(backend *be);

/* One-row greedy steps issued through the lm-head screen (cuda_greedy.cu; replays of a
 * captured step not counted), whether W's int8 copy exists, and the vocabulary rows the screen
 * left to compute exactly, summed over every step since the copy was made (replays included;
 * waits for the stream; -1 when unknown). For tests and benchmarks. */
long backend_cuda_greedy_screened(backend *be, int *prepared, long long *rows);

/* Bytes a greedy step of `rows` hidden rows reads for its ids when the lm-head screen takes it
 * (the int8 copy and its per-row terms, the bounds, the rows' int16 copies), in place of the
 * bf16 lm-head's V x H x 2; 0 when the screen would not take it. For the benchmark's roofline. */
double backend_cuda_greedy_step_bytes(backend *be, int rows);

/* 1 when the products of a step of `rows` rows stream the weights' packed copies where they have
 * one (cuda_packed.cuh: the GEMV path, one row by default), else 0. For the benchmark. */
int backend_cuda_packed_rows(backend *be, int rows);

/* The benchmark's two ceilings measured on this backend's device (cuda_ceiling.cu): a device-to-
 * device copy in bytes read + written per second, a bf16 8,192^3 cuBLAS GEMM in FLOP/s (best of
 * three batches each; ~2.4 GiB of device memory while it runs, freed after). 0, or -1 with err
 * set (and what was measured left in place, the rest 0). */
int backend_cuda_ceilings(backend *be, double *copy_bytes_s, double *gemm_flops_s, char *err,
                          size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
