/* cuda_common — what the CUDA backend's kernel files share: the private context (stream,
 * cuBLAS handle, the step's batch metadata on the device, preallocated scratch), the weight
 * record, and small device helpers (bf16 conversion, warp/block reductions).
 *
 * Batch metadata lives twice: host copies (for launch sizes and piece lists) and one device
 * array uploaded once per step from pinned staging. Its layout is a function of (n_tokens,
 * n_seqs, padded max_pages, n_out, chunks) only, so a CUDA graph captured for one decode step
 * reads the next step's metadata from the same addresses. Scratch is one device buffer grown only
 * when a step needs more than any step before (cuda_scratch). Launch failures are recorded in
 * ctx->err and reported by the next sync or read (the op table's ops return nothing). */
#ifndef DS_CUDA_COMMON_CUH
#define DS_CUDA_COMMON_CUH
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/backend.h"

typedef __nv_bfloat16 bf16;

/* The small kernels of a decode step (the DeltaNet chain, qk-norm + rotary, the split attention
 * and its merge, the greedy lm-head's norm and screen) issue every load their results depend on
 * as early as it may go: what no kernel of the step writes (weights, the step's metadata, the KV
 * pages of earlier positions in a decode step) before waiting for the kernel before them, what
 * that kernel writes right after the wait instead of after their first reductions. A load no
 * longer waits for the dependent round trips before it; the arithmetic is unchanged. */
#define CUDA_ROPE_TAB 512 /* rotary pairs the frequency table holds (rot <= 1024) */

typedef struct cuda_weight {
  bf16 *bf;   /* [rows, cols] bf16 (always) */
  float *f32; /* [rows, cols] fp32 copy for small weights (1-D, conv), else NULL */
  int64_t rows, cols;
  /* the packed copy the GEMV path streams (cuda_packed.cuh; weight_pack), else NULL: the
   * 12-bit rows and their headers */
  uint8_t *pk;
  uint32_t *pkh;
  /* an FP8 weight (weight_upload_fp8; bf NULL, matmul only, cuda_fp8.cu): the e4m3 matrix
   * [rows, cols] and its scales [ceil(rows/bn), ceil(cols/bk)] fp32 */
  uint8_t *q8;
  float *s8;
  int bn, bk;
} cuda_weight;

/* Device views of the step's metadata (pointers into ctx->d_meta). */
typedef struct cuda_batch {
  int n_tokens, n_seqs, max_pages, n_out;
  int n_prefill, n_decode; /* pieces with len > 1 (verify pieces aside), == 1 */
  int n_verify;            /* verify pieces of more than one row (set_keep) */
  int max_len;             /* longest piece */
  int max_pos_end;         /* max seq_pos + seq_len */
  const int32_t *tokens, *pos, *seq, *seq_start, *seq_len, *seq_pos, *seq_slot, *page_table,
      *out_rows;
  const int32_t *prefill_ids; /* [n_prefill] piece indices */
  const int32_t *decode_ids;  /* [n_decode] */
  const int32_t *verify_ids;  /* [n_verify] */
  const int32_t *seq_keep;    /* [n_seqs] a piece's first keep slot (-1: none); NULL: no set_keep */
  /* DeltaNet chunks of the prefill pieces (absolute multiples of BACKEND_CHUNK), in piece
   * order: chunk c covers rows ch_row[c] .. ch_row[c]+ch_len[c]-1; prefill piece i (in
   * prefill_ids order) owns chunks pre_ch0[i] .. pre_ch0[i+1]-1. */
  int n_chunks;
  const int32_t *ch_row, *ch_len, *pre_ch0;
  /* decode rows that read the same KV pages (kv_share.h; cuda_attn.cu "shared prefix"):
   * sh_on when the step has a group (a graph layout of its own); sh_start [T] a row's shared
   * positions (0: none), sh_ns [T] its group's shared ranges, sh_members [T] the groups'
   * rows, sh_groups: the group count, then CUDA_SH_GROUP_WORDS per group (leader piece,
   * member offset, members, shared length, ranges, positions per range) */
  int sh_on;
  const int32_t *sh_start, *sh_ns, *sh_members, *sh_groups;
} cuda_batch;
/* pieces shorter than this take attention's split path (cuda_attn.cu ATT_GEMM_MIN) */
#define CUDA_ATT_SPLIT_LEN 32
#define CUDA_SH_GROUPS 4 /* groups per step at most (the ones that save the most) */
#define CUDA_SH_GROUP_WORDS 6
#define CUDA_SH_MAXS 16   /* shared ranges per group at most */
#define CUDA_SH_SPLIT 512 /* positions per shared range before the cap (a multiple of 64) */

struct cuda_graphs; /* the decode-step recorder and graph cache (cuda_graph.cu) */
struct moe_table;   /* one MoE layer's expert pointer table (cuda_moe.cu) */

typedef struct cuda_ctx {
  int device;
  cudaStream_t st;
  cublasHandle_t blas;
  void *blas_ws;
  size_t blas_ws_bytes;
  /* metadata */
  int32_t *h_meta, *d_meta;         /* pinned staging / device copy */
  size_t meta_cap;                  /* int32 elements */
  cudaEvent_t meta_done;            /* the last upload finished reading h_meta */
  cudaEvent_t rd_ev[BACKEND_READS]; /* read_start's copies, by ticket */
  int rd_next;
  int meta_pending;
  cuda_batch b;     /* device pointers */
  backend_batch hb; /* host copies (pointers into h_host) */
  int32_t *h_host;  /* host copy of the metadata (plain memory) */
  int32_t *h_prefill, *h_decode;
  /* scratch */
  void *scratch;
  size_t scratch_bytes;
  /* --batch-invariant: every GEMM through one kernel whose row results do not depend on the
   * row count (cuda_gemm.cu, "batch-invariant GEMM") */
  int batch_invariant;
  /* --kv-cache-dtype fp8: K/V pages of e4m3 bytes and per-(token, kv head) scales
   * (cuda_attn.cu "FP8 K/V") */
  int kv_fp8;
  /* test-only caps (backend_cuda_test): the GEMM attention path's query rows per block (0: the
   * budget's), the long pieces kept off the fused kernel */
  int attn_gemm_rows, attn_flash;
  /* decode rows sharing KV pages read them once per group (cuda_attn.cu "shared prefix") */
  int attn_shared;
  /* split launches that took a kv head's q heads in sub-groups (backend_cuda_attn_launches) */
  long attn_sub_launches;
  int64_t *sh_scratch; /* kv_share_plan's scratch, [2 * sh_cap] */
  size_t sh_cap;
  /* GEMV path: the largest step (rows) it takes (cuda_gemm.cu GEMV_MAXT_DEFAULT, or GEMV_MAXT
   * under --batch-invariant) */
  int gemv_maxt;
  /* the skinny GEMMs' workspace (cuda_sgemm.cu, partial sums); the SM count */
  void *sg_ws;
  int n_sm;
  /* rotary frequencies of the last (theta, rot) seen by qk_norm_rope (cuda_elem.cu):
   * CUDA_ROPE_TAB floats, filled on the stream when (theta, rot) changes */
  float *rope_tab;
  double rope_theta;
  int rope_rot;
  /* argmax over rows of few: each row's scan split over blocks (cuda_greedy.cu k_argmax_split):
   * ARGMAX_PARTS partial (value, id) pairs and one arrival counter per row */
  float *am_v;
  int *am_i, *am_cnt;
  /* decode steps: rmsnorms folded into the products around them (cuda_graph.cu norm_fold_at;
   * off under --batch-invariant and for tests), the factors of the folded norm's rows */
  int norm_fold;
  float *fold_inv;
  /* GEMV products of up to this many rows stream the weights' packed copies where they have
   * one (cuda_packed.cuh; PACKED_ROWS, a test may raise it) */
  int packed;
  /* the DeltaNet decode chain's counters (cuda_gdn.cu "decode chain") */
  int *chain_cnt;
  /* routed experts of large steps grouped by expert (cuda_moe.cu; a test may turn it off) */
  int moe_grouped;
  /* grouped steps of moe_dev_min .. moe_dev_max rows: the experts' products by our kernels
   * over the grouped rows, no host round trip (cuda_moe.cu MOE_DEV_MIN / MOE_DEV_MAX) */
  int moe_dev_min, moe_dev_max;
  long moe_dev_runs; /* MoE ops issued through it (backend_cuda_moe_dev_runs) */
  int *moe_cnt;      /* the router's arrival counters [MOE_CNT] (cuda_moe.cu k_moe_router) */
  /* the expert tables of the MoE layers run on it, per backend because the ranks of a
   * tensor-parallel model run their layers on threads of their own */
  struct moe_table *moe_tables;
  int n_moe_tables;
  /* the lm-head's int8 copy and bounds for one-row greedy steps (cuda_greedy.cu; NULL: none) */
  struct cuda_greedy *greedy;
  long greedy_runs; /* steps issued through it */
  /* decode steps: ops recorded, fused and replayed as CUDA graphs (NULL: off) */
  struct cuda_graphs *gr;
  /* the kernel-release trace of replayed steps (cuda_ktrace.cu; builds with -DDS_KTRACE) */
  struct cuda_ktrace *kt;
  /* tensor parallelism: this rank's communicator and its rank in it (cuda_comm.cu; NULL: one
   * rank alone, no all_reduce_sum) */
  struct cuda_comm *comm;
  int comm_rank;
  int capturing;      /* a stream capture is open: nothing may synchronise or allocate */
  int capture_broken; /* something needed to (cuda_scratch growth): the capture is dropped */
  /* sticky failure */
  int failed;
  char err[256];
} cuda_ctx;

static inline cuda_ctx *cuda_ctx_of(backend *be) { return (cuda_ctx *)be->ctx; }

/* *p = n device ints, zeroed (the arrival counters of the kernels whose last block does a
 * row's remaining work); 0 on success, else -1 with *p NULL and the error cleared */
static inline int cuda_zeroed_ints(int **p, size_t n) {
  if (cudaMalloc(p, n * sizeof(int)) != cudaSuccess ||
      cudaMemset(*p, 0, n * sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(*p);
    *p = NULL;
    return -1;
  }
  return 0;
}
#define CW(w) ((cuda_weight *)(w))

/* Records the first failure (launch or library error) for the next sync/read. */
void cuda_fail(cuda_ctx *c, const char *what, const char *detail);
/* Checks the last launch; records a failure under `what`. */
void cuda_check_launch(cuda_ctx *c, const char *what);

/* Kernel-release trace (cuda_ktrace.cu). In a build with -DDS_KTRACE, every replayed decode
 * graph's kernels of ours stamp the global timer as they pass their wait (their predecessor
 * has finished); the interval to the next stamp is what the kernel cost inside the pipelined
 * step, attributed to the name it was launched under. Reported per graph on stderr at destroy.
 * Without the flag every call is a no-op. */
int cuda_ktrace_init(cuda_ctx *c);                           /* -1: out of memory */
void cuda_ktrace_capture_begin(cuda_ctx *c);                 /* a capture opens */
void cuda_ktrace_launch(cuda_ctx *c, const char *what);      /* a kernel of ours captured */
void cuda_ktrace_capture_end(cuda_ctx *c, const void *exec); /* instantiated as exec */
void cuda_ktrace_replay(cuda_ctx *c, const void *exec); /* exec about to launch (stream idle) */
void cuda_ktrace_release(cuda_ctx *c);                  /* report, free */
/* The decode-step recorder (cuda_graph.cu). cuda_graph_init: recording on (-1: out of memory),
 * step_repeat taken when `repeat`; cuda_graph_release: its graphs and state freed. cuda_graph_ops
 * puts the recording op-table entries into be (they launch as issued while c->gr is NULL).
 * cuda_graph_begin (end of set_batch) starts recording a decode step; cuda_graph_flush runs what
 * was recorded (every call that must see results first); cuda_graph_clear drops the graphs (their
 * addresses moved); cuda_graph_note_launch marks the kernel just captured as ours. */
int cuda_graph_init(cuda_ctx *c, backend *be, int repeat);
void cuda_graph_release(cuda_ctx *c);
void cuda_graph_ops(backend *be);
void cuda_graph_begin(cuda_ctx *c);
void cuda_graph_flush(cuda_ctx *c);
void cuda_graph_clear(cuda_ctx *c);
void cuda_graph_note_launch(cuda_ctx *c);
/* An op that cannot be recorded (it synchronises with other ranks or reads back): what was
 * recorded runs now, launch by launch, and the rest of the step runs as issued. */
void cuda_graph_stop(cuda_ctx *c);
/* Records collective `fn(be, x, n, out)` of the NCCL kind (cuda_comm.cu; id names it in the
 * step's signature) when the step is being recorded: 1, else 0 (the caller issues it). */
int cuda_graph_rec_collective(cuda_ctx *c, int id,
                              void (*fn)(backend *, backend_buf, size_t, backend_buf),
                              backend_buf x, size_t n, backend_buf out);
/* 1 when c's recorded steps may hold its collectives (an NCCL communicator): the ranks then
 * agree on how each such step runs (cuda_comm_agree). */
int cuda_comm_records(const cuda_ctx *c);
/* Every rank of c's communicator calls it with its value v at the same point (on its own
 * thread): returns the smallest of the values, *hi the largest. One rank: v. */
long long cuda_comm_agree(cuda_ctx *c, long long v, long long *hi);
/* Drops this rank's reference to its communicator (cuda_comm.cu; no-op without one); the
 * stream must be idle. */
void cuda_comm_release(cuda_ctx *c);
/* Device scratch of at least `bytes` (grown rarely; growing waits for the stream). NULL and a
 * recorded failure when out of memory. */
void *cuda_scratch(cuda_ctx *c, size_t bytes);
/* y[T, N] = x[T, K] . W[N, K]^T with fp32 accumulation; y bf16 (y_f32 = 0) or fp32. */
void cuda_gemm(cuda_ctx *c, const bf16 *x, const bf16 *W, int T, int K, int N, void *y, int y_f32);

/* Skinny GEMMs (cuda_sgemm.cu): y_i[T, N_i] = x[T, K] . W_i[N_i, K]^T for m <= SG_MULTI
 * products of one x, in one launch; y bf16 or (y_f32) fp32. Returns 0 when the shape is not
 * covered (nothing launched; see cuda_sgemm_fits). cuda_sgemm_init allocates the workspace
 * (-1: out of memory, the path stays off), cuda_sgemm_release frees it. */
#define SG_MULTI 4
int cuda_sgemm_fits(const cuda_ctx *c, int T, int K, int N, int multi);
int cuda_sgemm(cuda_ctx *c, const bf16 *x, int T, int K, int m, const bf16 *const *W,
               void *const *y, const int *N, int y_f32);
extern "C" int cuda_sgemm_init(cuda_ctx *c);
extern "C" void cuda_sgemm_release(cuda_ctx *c);

/* Fused causal attention of the step's long prefill pieces (cuda_flash.cu): the rows of the
 * pieces the GEMM path would take (cuda_attn.cu); returns how many, 0 when the shape is not
 * covered (nothing launched). kp, vp: bf16 pages, or FP8 pages when c->kv_fp8. */
int cuda_attn_flash(cuda_ctx *c, const void *kp, const void *vp, const bf16 *q, int nh, int nkv,
                    int hd, float scale, bf16 *out);
/* The shared positions of the step's groups of decode rows (c->b.sh_*, the step has
 * sh_on) on tensor cores: per group, range and kv head one block over up to 64 (member, q head)
 * query rows, writing each member's (m, l, acc[hd]) softmax partial of range z into
 * part / ml slot ATT_MAXS + z (slots per (row, q head)), m in the split kernel's units (natural
 * log of scale * q.k). Returns 0, or -1 when the shape is not covered (hd not 64, 128 or 256,
 * nh / nkv over 64; nothing launched). */
int cuda_attn_flash_shared(cuda_ctx *c, const bf16 *kp, const bf16 *vp, const bf16 *q, int nh,
                           int nkv, int hd, float scale, int att_maxs, int slots, float *part,
                           float *ml);

/* One layer's DeltaNet decode chain, conv1d -> gdn_gates -> gdn_decode -> gated_rmsnorm, as
 * the four ops' arguments (backend/backend.h): the decode-step recorder (backend_cuda.cu)
 * collects it, cuda_gdn_chain (cuda_gdn.cu) launches it as one kernel when it covers the step
 * and shapes (returns 1; else 0, nothing launched). Every output — conv state and output (q, k
 * normalised), beta, g, DeltaNet state, o and out — gets the bits the four ops give. */
typedef struct cuda_gdn_chain_args {
  backend_buf conv_state, x, conv_out; /* conv1d (conv_out: the gates' and decode's qkv) */
  backend_weight conv_w;
  int C, K;
  backend_buf b, a, beta, g; /* gdn_gates */
  backend_weight A_log, dt_bias;
  backend_buf ssm, o; /* gdn_decode (o: the gated norm's input) */
  int nk, nv, dk, dv;
  backend_buf z, out; /* gated_rmsnorm */
  backend_weight norm;
  int T;
  float eps;
} cuda_gdn_chain_args;
int cuda_gdn_chain(cuda_ctx *c, const cuda_gdn_chain_args *a);
/* inv[t] = rsqrt(mean(x[t, :]^2) + eps) for t < T with the rmsnorm op's sums (n % 8 == 0,
 * n <= 8192, x 16-byte aligned): the decode recorder's norm fold (backend_cuda.cu). */
void cuda_elem_rmsnorm_inv(cuda_ctx *c, const bf16 *x, int T, int n, float eps, float *inv);
/* cuda_elem_gather_norm, also writing each normed row's int16 copy xq [n_out, H] and xs [n_out,
 * 4] = {its scale t, sum |xn| rounded up, 1 when not finite, -} (cuda_greedy.cu). */
void cuda_elem_gather_norm_q(backend *be, backend_buf x, backend_weight norm, float eps, int H,
                             void *xn, int16_t *xq, float *xs);

/* cuda_greedy.cu: greedy ids of a step of <= 4 rows without the full lm-head product (the
 * logits_argmax op's fast path; backend_cuda.cu falls back to logits + argmax).
 * cuda_greedy_prepare makes W's int8 copy; cuda_greedy_run returns
 * 1 when it issued the step's ids, 0 when it does not apply (then nothing was issued);
 * cuda_greedy_forget drops the copy when W (its bf16 rows) is freed or the context goes. */
int cuda_greedy_prepare(backend *be, backend_weight W, int H, int V, char *err, size_t errlen);
int cuda_greedy_run(backend *be, backend_buf x, backend_weight norm, float eps, backend_weight W,
                    int H, int V, backend_buf ids);
void cuda_greedy_forget(cuda_ctx *c, const void *W_bf);
/* The chain's first two ops (conv1d and gdn_gates of a decode step: the args' conv and gates
 * fields) as one launch, for the steps the chain does not cover; 1 when launched, else 0.
 * Conv state and output (q, k normalised), beta and g get the two ops' bits. */
int cuda_gdn_conv_gates(cuda_ctx *c, const cuda_gdn_chain_args *a);
/* Its per-step counters (zeroed device memory); -1 when out of memory (the chain stays off). */
extern "C" int cuda_gdn_chain_init(cuda_ctx *c);
extern "C" void cuda_gdn_chain_release(cuda_ctx *c);

/* Frees the MoE expert tables and counters of this context (cuda_moe.cu). */
void cuda_moe_release(cuda_ctx *c);
#define ARGMAX_PARTS \
  4096               /* argmax partial pairs (rows x blocks per row) at most (cuda_greedy.cu) */
#define MOE_CNT 4096 /* rows of one step the router's last blocks can route */
int cuda_moe_init(cuda_ctx *c);
/* 1 when the MoE op of a step of T rows may be recorded into a graph: it neither
 * synchronises nor reads anything back (cuda_moe.cu). */
extern "C" int cuda_moe_records(cuda_ctx *c, const backend_moe *m, int T, int H);

/* ---- device helpers ---- */

/* Programmatic dependent launch (backend_cuda.cu, graph_pdl): in a captured decode step a kernel
 * of ours may be launched while the kernel before it still runs. Every kernel of ours therefore
 * begins with pdl_enter(): wait until the previous kernel has finished and its writes are
 * visible (a no-op when launched the ordinary way), then let the next kernel be launched. */
#ifdef DS_KTRACE
/* Kernel-release trace (cuda_ktrace.cu): block (0,0,0) of every kernel of ours appends the
 * global timer, right after its wait, to a device ring that each kernel file binds. */
#define KTRACE_CAP 8192
static __device__ unsigned long long *ktrace_ring; /* [0]: count, [1..KTRACE_CAP]: stamps */
__device__ __forceinline__ void ktrace_stamp(void) {
  if (ktrace_ring && threadIdx.x == 0 && (blockIdx.x | blockIdx.y | blockIdx.z) == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    unsigned long long i = atomicAdd(ktrace_ring, 1ull);
    if (i < KTRACE_CAP) ktrace_ring[1 + i] = t;
  }
}
#define CUDA_KTRACE_TU(fn) \
  extern "C" void fn(void *ring) { cudaMemcpyToSymbol(ktrace_ring, &ring, sizeof ring); }
#else
#define CUDA_KTRACE_TU(fn)
#endif

/* The two halves of pdl_enter, also used apart by a kernel that needs the previous kernel's
 * results only late (backend_cuda.cu, the norm fold): pdl_launch_next lets the next kernel
 * launch now, pdl_wait waits for the previous one. What such a kernel reads before pdl_wait
 * must come from kernels before the previous one (done before this one was launched). */
__device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_next(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef DS_KTRACE
  ktrace_stamp();
#endif
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_enter(void) {
  pdl_wait();
  pdl_launch_next();
}

__device__ __forceinline__ float bf2f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 f2bf(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float sigmoidf_dev(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float siluf_dev(float x) { return x / (1.f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Sum (MAX = false) or max (MAX = true) over the block (blockDim.x a multiple of 32, <= 1024);
 * every thread gets the result. `red` is __shared__ float[33]. */
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float *red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = MAX ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    float s = lane < nw ? red[lane] : (MAX ? -INFINITY : 0.f);
    s = MAX ? warp_max(s) : warp_sum(s);
    if (lane == 0) red[32] = s;
  }
  __syncthreads();
  return red[32];
}
__device__ __forceinline__ float block_sum(float v, float *red) {
  return block_reduce<false>(v, red);
}
__device__ __forceinline__ float block_max(float v, float *red) {
  return block_reduce<true>(v, red);
}

/* 16 bytes of read-only data (weights) streamed past L1: read once, not kept */
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

/* 8 bf16 (one 16-byte word) to 8 floats */
__device__ __forceinline__ void bf16x8_to_f32(uint4 u, float *f) {
  const __nv_bfloat162 *h2 = (const __nv_bfloat162 *)&u;
#pragma unroll
  for (int m = 0; m < 4; m++) {
    float2 v = __bfloat1622float2(h2[m]);
    f[2 * m] = v.x;
    f[2 * m + 1] = v.y;
  }
}

/* Asynchronous 16-byte copies global -> shared (sm_80+): issue, close a group, wait until at
 * most N groups are still in flight. */
__device__ __forceinline__ void cp_async16(void *dst_shared, const void *src) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst_shared);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait(void) {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* d += a . b, one m16n8k16 bf16 tensor-core product with fp32 accumulation; fragment layout
 * as in the PTX ISA (groupID = lane / 4, t = lane % 4): a0 = A[g][2t..], a1 = A[g+8][2t..],
 * a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; b0 = B[2t..][g], b1 = B[2t+8..][g];
 * d0,d1 = D[g][2t..], d2,d3 = D[g+8][2t..] (pairs: lower index in the low half). */
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The DeltaNet gates of one (row, value head): beta = sigmoid(b), g = -e^A_log softplus(a +
 * dt_bias) (qwen35-model.md §3.1). Shared by k_gdn_gates and the decode chain. */
__device__ __forceinline__ void gdn_gate_vals(float b, float a, float A_log, float dt_bias,
                                              float *beta, float *g) {
  *beta = sigmoidf_dev(b);
  float xx = a + dt_bias;
  float sp = xx > 20.f ? xx : log1pf(expf(xx));
  *g = -expf(A_log) * sp;
}

/* The gated RMSNorm of one value head of dv = 32 VPL values, a lane holding VPL consecutive
 * ones (v, with z and the weights w of the same columns): w (v / rms(v)) silu(z) in bf16. Shared
 * by the gated-norm kernel and the decode chain (one arithmetic). */
template <int VPL>
__device__ __forceinline__ void gated_norm_lane(const float *v, const float *zv, const float *w,
                                                float eps, bf16 *ob) {
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < VPL; k++) ss += v[k] * v[k];
  ss = warp_sum(ss);
  float rs = rsqrtf(ss / (float)(32 * VPL) + eps);
#pragma unroll
  for (int k = 0; k < VPL; k++) ob[k] = f2bf(w[k] * (v[k] * rs) * siluf_dev(zv[k]));
}

/* ---- the GEMV row (cuda_gemm.cu's GEMV kernels, cuda_greedy.cu's exact rows) ---- */

/* One warp's dot products of W's row w (K values) with the T activation rows: lane partials
 * over 16-byte pieces, then a butterfly; every lane ends with the T sums. Shared by every GEMV
 * kernel, so a fused launch gives the same bits as the single one. */
/* GEMV_LATE rows wait for the previous kernel after their first GEMV_LATE_K values (4 pieces
 * per lane): 512 is slower at decode 2 and 4, the same at 1 (a multiple of 256; the same bits at
 * every value). */
#define GEMV_LATE_K 1024

/* acc[t] += w . x[t] over one 8-value piece at column k (wf: its weights as floats): the
 * GEMV's one expression, shared by gemv_row and the packed rows (cuda_packed.cuh). */
template <int T>
__device__ __forceinline__ void gemv_fma8(const float *wf, const bf16 *__restrict__ x, int K, int k,
                                          float *acc) {
#pragma unroll
  for (int t = 0; t < T; t++) {
    float xf[8];
    bf16x8_to_f32(*(const uint4 *)(x + (size_t)t * K + k), xf);
#pragma unroll
    for (int i = 0; i < 8; i++) acc[t] += wf[i] * xf[i];
  }
}

template <int T, bool STREAM = true, bool LATE = false>
__device__ __forceinline__ void gemv_row(const bf16 *__restrict__ x, const bf16 *__restrict__ w,
                                         int K, int lane, float *acc, const float *inv = nullptr,
                                         float *iv = nullptr) {
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = 0.f;
  auto piece = [&](int k) {
    float wf[8];
    bf16x8_to_f32(STREAM ? ld_stream16(w + k) : __ldg((const uint4 *)(w + k)), wf);
    gemv_fma8<T>(wf, x, K, k, acc);
  };
  if constexpr (!LATE) {
#pragma unroll 4
    for (int k = lane * 8; k < K; k += 256) piece(k);
  } else { /* GEMV_LATE: the first pieces, then the previous kernel's results */
    int k = lane * 8, k1 = min(K, GEMV_LATE_K);
#pragma unroll 4
    for (; k < k1; k += 256) piece(k);
    pdl_wait();
#pragma unroll
    for (int t = 0; t < T; t++) iv[t] = __ldcg(inv + t);
#pragma unroll 4
    for (; k < K; k += 256) piece(k);
  }
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = warp_sum(acc[t]);
}

/* gemv_row for two rows wa, wb of one x at once (the glu's gate and up rows): each 16-byte
 * piece of both rows in one loop, so twice the loads are in flight and the warp's two rows end
 * together; every row's sums in gemv_row's order and expressions (the same bits). LATE: both
 * rows' first GEMV_LATE_K values before the wait, inv after it. */
#define GEMV_ROW2_UNROLL 4 /* pieces of each row per loop turn: 8 loads in flight per lane */
template <int T, bool LATE = false, int U = GEMV_ROW2_UNROLL>
__device__ __forceinline__ void gemv_row2(const bf16 *__restrict__ x, const bf16 *__restrict__ wa,
                                          const bf16 *__restrict__ wb, int K, int lane, float *aa,
                                          float *ab, const float *inv = nullptr,
                                          float *iv = nullptr) {
#pragma unroll
  for (int t = 0; t < T; t++) aa[t] = ab[t] = 0.f;
  auto piece = [&](int k) {
    float fa[8], fb[8];
    bf16x8_to_f32(ld_stream16(wa + k), fa);
    bf16x8_to_f32(ld_stream16(wb + k), fb);
#pragma unroll
    for (int t = 0; t < T; t++) {
      float xf[8];
      bf16x8_to_f32(*(const uint4 *)(x + (size_t)t * K + k), xf);
#pragma unroll
      for (int i = 0; i < 8; i++) aa[t] += fa[i] * xf[i];
#pragma unroll
      for (int i = 0; i < 8; i++) ab[t] += fb[i] * xf[i];
    }
  };
  int k = lane * 8;
  if constexpr (LATE) {
    int k1 = min(K, GEMV_LATE_K);
#pragma unroll U
    for (; k < k1; k += 256) piece(k);
    pdl_wait();
#pragma unroll
    for (int t = 0; t < T; t++) iv[t] = __ldcg(inv + t);
  }
#pragma unroll U
  for (; k < K; k += 256) piece(k);
#pragma unroll
  for (int t = 0; t < T; t++) {
    aa[t] = warp_sum(aa[t]);
    ab[t] = warp_sum(ab[t]);
  }
}

/* acc[lane] with a compile-time index (lane < T). */
template <int T>
__device__ __forceinline__ float gemv_pick(const float *acc, int lane) {
  float v = acc[0];
#pragma unroll
  for (int t = 1; t < T; t++)
    if (lane == t) v = acc[t];
  return v;
}

/* ---- argmax reductions (backend_cuda.cu's argmax, cuda_greedy.cu) ---- */

/* (v, i) beats (w, k) when v > w, or v == w with the lower id; NaN never beats anything and
 * is beaten by nothing (a thread that saw only NaN keeps i = INT32_MAX). */
__device__ __forceinline__ void am_take(float &v, int &i, float w, int k) {
  if (w > v || (w == v && k < i)) {
    v = w;
    i = k;
  }
}

/* (v, i) over entries 4 q0 .. 4 q1 - 1 of a 16-byte aligned row, strided over the block */
__device__ __forceinline__ void am_scan4(const float4 *r4, int q0, int q1, float &v, int &i) {
  for (int q = q0 + (int)threadIdx.x; q < q1; q += blockDim.x) {
    float4 f = r4[q];
    am_take(v, i, f.x, 4 * q);
    am_take(v, i, f.y, 4 * q + 1);
    am_take(v, i, f.z, 4 * q + 2);
    am_take(v, i, f.w, 4 * q + 3);
  }
}

__device__ __forceinline__ void am_warp(float &v, int &i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    int k = __shfl_xor_sync(0xffffffffu, i, o);
    am_take(v, i, w, k);
  }
}

/* (v, i) over a block of NT threads, valid in thread 0 */
template <int NT>
__device__ __forceinline__ void am_block(float &v, int &i) {
  __shared__ float sv[NT / 32];
  __shared__ int si[NT / 32];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  am_warp(v, i);
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < NT / 32 ? sv[lane] : -INFINITY;
    i = lane < NT / 32 ? si[lane] : INT32_MAX;
    am_warp(v, i);
  }
}

static inline unsigned cuda_blocks(size_t n, unsigned threads) {
  size_t b = (n + threads - 1) / threads;
  if (b > 65535u * 16) b = 65535u * 16;
  return (unsigned)(b ? b : 1);
}

#endif
