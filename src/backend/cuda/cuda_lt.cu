/* cuda_lt — the backend's GEMMs through cuBLASLt with the algorithm chosen per shape by timing.
 *
 * cublasGemmEx picks one algorithm per call from its heuristics. For the decode steps of 17..128
 * rows (and prefill pieces) the weights are read once per product and the choice of tile and
 * split-K decides how many bytes are in flight: the profile of a 64-sequence decode step showed
 * cuBLAS's choices at 2.5 TB/s on average, with the 32-column projections at 7 µs each of
 * pure latency (bench/NOTES.md). Here, in the LT_SEEN-th step with a product of a shape (rows bucket, K, N,
 * output type) outside a graph capture, cublasGemmEx and up to LT_CANDIDATES of cuBLASLt's
 * heuristic answers are each run LT_REPS times on the call's own operands, with L2 flushed
 * (by reading) before every run (a decode step's weights come from HBM, never from L2); the
 * fastest is kept for the process (cublasGemmEx unless a candidate beats it by 2 %). Every
 * later product of that shape uses it, so a row's bits depend on the shape only, as they do
 * with cublasGemmEx alone (only DS_BATCH_INVARIANT=1 promises more).
 *
 * Rows are bucketed (exact up to 32, then quarter-octaves: 40, 48, 56, 64, 80, ...); the first
 * row count seen in a bucket is timed and its winner is used, after cublasLtMatmulAlgoCheck,
 * for every row count of the bucket. Above DS_GEMM_TUNE_MAXT rows (1024) and for operands that
 * are not 16-byte aligned the product stays with cublasGemmEx (cuda_lt_gemm returns 0).
 * DS_GEMM_TUNE=0 turns the path off; DS_GEMM_TUNE=always (for tests) times every shape on its
 * first product and takes the best cuBLASLt candidate even when cublasGemmEx is faster;
 * DS_GEMM_TUNE_LOG=1 prints each timing's outcome. Timing stalls the stream once per shape (a few ms for a
 * decode shape, ~10 ms for a 512-row one); inside a capture nothing is timed and a shape not
 * yet known goes to cublasGemmEx. Decode steps replayed as CUDA graphs issue no products: the
 * recorder asks cuda_lt_due for each recorded product, runs a step with a due shape directly
 * (which times it) and drops its captured graphs when cuda_lt_generation moved. */
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unordered_map>

#include "backend/cuda/cuda_common.cuh"

#define LT_CANDIDATES 16
#define LT_REPS 3
#define LT_FLUSH_BYTES (64u << 20) /* larger than the H200's 50 MB L2 */
#define LT_MAX_SHAPES 4096
#define LT_SEEN 8 /* steps with a shape before it is timed */

/* Descriptors of one exact shape and the algorithm it runs. */
struct lt_plan {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
  size_t ws;
  int ok; /* 0: the shape goes to cublasGemmEx */
  int T, K, N, f32;
};

struct lt_choice { /* a bucket's winner */
  cublasLtMatmulAlgo_t algo;
  int ok;
};

struct cuda_lt {
  cublasLtHandle_t h;
  int maxt, log;
  int seen_min; /* LT_SEEN, or 1 with DS_GEMM_TUNE=always */
  int always;   /* DS_GEMM_TUNE=always: the best cuBLASLt candidate even when cublasGemmEx wins */
  void *flush;
  cudaEvent_t e0, e1;
  std::unordered_map<uint64_t, lt_plan> plans;     /* exact (T, K, N, f32) */
  std::unordered_map<uint64_t, lt_choice> choices; /* (bucket, K, N, f32) */
  /* shapes not yet planned: steps that had a product of them, the last such step */
  std::unordered_map<uint64_t, std::pair<int, long>> seen;
  long tuned, runs, fallbacks;
  long generation; /* plans that run a cuBLASLt algorithm so far (captured graphs go stale) */
};

/* T < 2^20, K < 2^20, N < 2^23 (cuda_lt_gemm checks) */
static uint64_t lt_key(int T, int K, int N, int f32) {
  return ((uint64_t)T << 44) | ((uint64_t)K << 24) | ((uint64_t)N << 1) | (uint64_t)(f32 != 0);
}

/* The bucket a row count is timed in: exact to 32, then 4 buckets per octave (upper ends). */
static int lt_bucket(int T) {
  if (T <= 32) return T;
  int p = 32;
  while (p * 2 < T) p *= 2;
  int step = p / 4;
  return p + ((T - p + step - 1) / step) * step;
}

extern "C" int cuda_lt_init(cuda_ctx *c) {
  c->lt = NULL;
  const char *t = getenv("DS_GEMM_TUNE"), *mt = getenv("DS_GEMM_TUNE_MAXT");
  if (t && strcmp(t, "0") == 0) return 0;
  cuda_lt *lt = new cuda_lt();
  lt->maxt = mt ? atoi(mt) : 1024;
  lt->always = t && strcmp(t, "always") == 0; /* for tests of this path */
  lt->seen_min = lt->always ? 1 : LT_SEEN;
  const char *lg = getenv("DS_GEMM_TUNE_LOG"); /* one stderr line per timed shape */
  lt->log = lg && strcmp(lg, "0") != 0;
  lt->tuned = lt->runs = lt->fallbacks = lt->generation = 0;
  if (cublasLtCreate(&lt->h) != CUBLAS_STATUS_SUCCESS) {
    delete lt;
    return -1;
  }
  if (cudaMalloc(&lt->flush, LT_FLUSH_BYTES) != cudaSuccess ||
      cudaEventCreate(&lt->e0) != cudaSuccess || cudaEventCreate(&lt->e1) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(lt->flush);
    cublasLtDestroy(lt->h);
    delete lt;
    return -1;
  }
  c->lt = lt;
  return 0;
}

static void plan_free(lt_plan &p) {
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
}

extern "C" void cuda_lt_release(cuda_ctx *c) {
  cuda_lt *lt = c->lt;
  if (!lt) return;
  for (auto &kv : lt->plans) plan_free(kv.second);
  cudaFree(lt->flush);
  cudaEventDestroy(lt->e0);
  cudaEventDestroy(lt->e1);
  cublasLtDestroy(lt->h);
  delete lt;
  c->lt = NULL;
}

extern "C" void cuda_lt_stats(const cuda_ctx *c, long out[3]) {
  const cuda_lt *lt = c->lt;
  out[0] = lt ? lt->tuned : 0;
  out[1] = lt ? lt->runs : 0;
  out[2] = lt ? lt->fallbacks : 0;
}

/* Column-major view (as cuda_gemm's cublasGemmEx call): D^T [N, T] = op(W as [K, N])^T . X^T. */
static int plan_make(cuda_ctx *c, lt_plan &p, int T, int K, int N, int f32) {
  memset(&p, 0, sizeof p);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  if (cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
      cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K) ||
      cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, T, K) ||
      cublasLtMatrixLayoutCreate(&p.d, f32 ? CUDA_R_32F : CUDA_R_16BF, N, T, N)) {
    plan_free(p);
    memset(&p, 0, sizeof p);
    (void)c;
    return -1;
  }
  p.T = T;
  p.K = K;
  p.N = N;
  p.f32 = f32;
  return 0;
}

static cublasStatus_t plan_run(cuda_ctx *c, const lt_plan &p, const cublasLtMatmulAlgo_t *algo,
                               const bf16 *x, const bf16 *W, void *y) {
  const float alpha = 1.f, beta = 0.f;
  return cublasLtMatmul(c->lt->h, p.op, &alpha, W, p.a, x, p.b, &beta, y, p.d, y, p.d, algo,
                        c->blas_ws, c->blas_ws_bytes, c->st);
}

/* Reads the flush buffer (clean lines: the timed run's loads do not wait on write-backs). */
__global__ void k_lt_flush(const uint4 *__restrict__ p, size_t n, int *sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = 1; /* keeps the loads; (almost) never taken */
}

/* GPU time of LT_REPS runs of candidate `algo` (NULL: cublasGemmEx), each after an L2 flush;
 * -1 when a run fails. */
static float lt_time(cuda_ctx *c, const lt_plan &p, const cublasLtMatmulAlgo_t *algo,
                     const bf16 *x, const bf16 *W, void *y) {
  cuda_lt *lt = c->lt;
  float total = 0.f;
  for (int r = -1; r < LT_REPS; r++) { /* r = -1: warm-up */
    k_lt_flush<<<4 * c->n_sm, 512, 0, c->st>>>((const uint4 *)lt->flush, LT_FLUSH_BYTES / 16,
                                                (int *)lt->flush);
    cudaEventRecord(lt->e0, c->st);
    int good = algo ? plan_run(c, p, algo, x, W, y) == CUBLAS_STATUS_SUCCESS
                    : cuda_gemm_cublas(c, x, W, p.T, p.K, p.N, y, p.f32) == CUBLAS_STATUS_SUCCESS;
    cudaEventRecord(lt->e1, c->st);
    float ms = 0.f;
    if (!good || cudaEventSynchronize(lt->e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, lt->e0, lt->e1) != cudaSuccess) {
      cudaGetLastError();
      return -1.f;
    }
    if (r >= 0) total += ms;
  }
  return total * 1e3f / LT_REPS; /* microseconds */
}

/* Times cublasGemmEx and the heuristic's candidates on the call's operands; the winner
 * (ok = 0 when cublasGemmEx wins or nothing ran). */
static lt_choice lt_tune(cuda_ctx *c, const lt_plan &p, const bf16 *x, const bf16 *W, void *y) {
  cuda_lt *lt = c->lt;
  lt_choice best;
  memset(&best, 0, sizeof best);
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
  int n = 0;
  size_t ws = c->blas_ws_bytes;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return best;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  if (cublasLtMatmulAlgoGetHeuristic(lt->h, p.op, p.a, p.b, p.d, p.d, pref, LT_CANDIDATES, res,
                                     &n) != CUBLAS_STATUS_SUCCESS)
    n = 0;
  cublasLtMatmulPreferenceDestroy(pref);
  float ex_us = lt_time(c, p, NULL, x, W, y), best_us = lt->always ? -1.f : ex_us, first_us = -1.f;
  int best_i = -1;
  for (int i = 0; i < n; i++) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    float us = lt_time(c, p, &res[i].algo, x, W, y);
    if (i == 0) first_us = us;
    /* a candidate must beat cublasGemmEx by more than the timing's noise (2 %) */
    if (us >= 0.f && (best_us < 0.f || us < best_us * (best_i < 0 ? 0.98f : 1.f))) {
      best.algo = res[i].algo;
      best.ok = 1;
      best_us = us;
      best_i = i;
    }
  }
  if (lt->log)
    fprintf(stderr, "gemm tune: T=%d K=%d N=%d %s: cublasGemmEx %.2f us, %d candidates, "
            "heuristic's first %.2f us, chosen %s%d %.2f us\n", p.T, p.K, p.N,
            p.f32 ? "f32" : "bf16", ex_us, n, first_us, best_i < 0 ? "GemmEx " : "#",
            best_i, best_us);
  return best;
}

static int lt_covered(const cuda_ctx *c, const void *x, const void *W, int T, int K, int N,
                      const void *y) {
  const cuda_lt *lt = c->lt;
  return lt && !c->legacy && !c->batch_invariant && T > 0 && T <= lt->maxt && T < (1 << 19) &&
         K < (1 << 20) && N < (1 << 23) && K % 8 == 0 && N % 8 == 0 &&
         !(((uintptr_t)x | (uintptr_t)W | (uintptr_t)y) & 15);
}

/* Counts this step's sighting of a shape not yet planned; 1 when it is due for timing. */
static int lt_sight(cuda_ctx *c, uint64_t k) {
  auto &sn = c->lt->seen[k];
  if (sn.first == 0 || sn.second != c->step_no) {
    sn.first++;
    sn.second = c->step_no;
  }
  return sn.first >= c->lt->seen_min;
}

int cuda_lt_due(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, void *y,
                int y_f32) {
  if (!lt_covered(c, x, W, T, K, N, y)) return 0;
  uint64_t k = lt_key(T, K, N, y_f32);
  if (c->lt->plans.count(k)) return 0;
  return lt_sight(c, k);
}

long cuda_lt_generation(const cuda_ctx *c) { return c->lt ? c->lt->generation : 0; }

int cuda_lt_gemm(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, void *y,
                 int y_f32) {
  cuda_lt *lt = c->lt;
  if (!lt_covered(c, x, W, T, K, N, y)) return 0;
  uint64_t k = lt_key(T, K, N, y_f32);
  auto it = lt->plans.find(k);
  if (it == lt->plans.end()) {
    /* a shape is timed in the LT_SEEN-th step that has it, outside a capture, not before:
     * one-off row counts (a batch shrinking as sequences finish) never pay for a timing */
    if (!lt_sight(c, k) || c->capturing || lt->plans.size() >= LT_MAX_SHAPES) return 0;
    lt_plan p;
    if (plan_make(c, p, T, K, N, y_f32)) return 0;
    uint64_t bk = lt_key(lt_bucket(T), K, N, y_f32);
    auto ch = lt->choices.find(bk);
    if (ch == lt->choices.end()) {
      lt_choice w = lt_tune(c, p, x, W, y);
      lt->tuned++;
      ch = lt->choices.emplace(bk, w).first;
    }
    p.ok = ch->second.ok;
    if (p.ok) {
      p.algo = ch->second.algo;
      cublasLtMatmulHeuristicResult_t chk;
      memset(&chk, 0, sizeof chk);
      p.ok = cublasLtMatmulAlgoCheck(lt->h, p.op, p.a, p.b, p.d, p.d, &p.algo, &chk) ==
                 CUBLAS_STATUS_SUCCESS &&
             chk.workspaceSize <= c->blas_ws_bytes;
    }
    if (!p.ok) {
      plan_free(p);
      memset(&p, 0, sizeof p);
    } else {
      lt->generation++;
    }
    it = lt->plans.emplace(k, p).first;
    lt->seen.erase(k);
  }
  if (!it->second.ok) {
    lt->fallbacks++;
    return 0;
  }
  cublasStatus_t s = plan_run(c, it->second, &it->second.algo, x, W, y);
  if (s != CUBLAS_STATUS_SUCCESS) {
    char d[96];
    snprintf(d, sizeof d, "cublasLtMatmul status %d (T=%d K=%d N=%d)", (int)s, T, K, N);
    cuda_fail(c, "matmul", d);
  }
  lt->runs++;
  return 1;
}
