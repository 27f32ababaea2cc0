/* cuda_graph — the decode-step recorder: decode steps recorded, rewritten and replayed as CUDA
 * graphs; the op table's entries (recorded in decode steps, else launched as issued).
 *
 * The kernels a decode step runs (rows = the step's sequences; a range in parentheses is the
 * rows that take that cell; every kernel of ours a programmatic edge after the one before it):
 *
 *   op                      dense and MoE models, by rows of the step
 *   embed                   k_embed
 *   rmsnorm                 folded (1-4): GEMV_RES product, k_rmsnorm8<true>, GEMV_LATE products
 *                           | k_rmsnorm8 (5+)
 *   q/k/v, DeltaNet qkv, z  k_gemv_multi (1-4; packed copies at 1) | k_sgemm, fused per x (5-16)
 *                           | cuBLAS (17+)
 *   DeltaNet b, a           k_gemv_multi (1-4) | k_sgemm (5-16) | k_gemv_narrow, both in one
 *                           (17-128) | cuBLAS
 *   conv1d, gates, decode,  k_gdn_chain (1-32) | k_conv_gates_dec, k_gdn_decode4,
 *    gated rmsnorm          k_gated_rmsnorm_v (33+)
 *   qk-norm + rotary        k_qk_norm_rope
 *   attention + out gate    k_attn_split (writes the step's k, v), k_attn_merge with the gate;
 *                           rows sharing >= 256 KV positions: k_flash_shared for those first
 *   out, o, down products   k_gemv (one-warp blocks; packed at 1) | k_sgemm (5-16) | cuBLAS
 *   gate/up/swiglu (dense)  k_gemv_glu (1-4) | k_sgemm + k_ew8 (5-16) | cuBLAS + k_ew8 (17+)
 *   MoE block (MoE)         k_moe_router (routes in its last blocks), k_moe_hidden, k_moe_down
 *                           (1-7) | the device-grouped kernels (8-512) | per-expert cuBLAS
 *                           (513+; it reads group sizes back, so it ends the recording)
 *   lm-head, greedy ids     int8 screen: k_gather_norm, k_greedy_screen, pick (1-4)
 *                           | cuBLAS + k_argmax_split (5-32) | cuBLAS + k_argmax (33+)
 *   lm-head, sampled ids    k_gemv_f32 (1-4) | cuBLAS (5+); then the sample clusters
 *   product of an FP8       the GEMV families with FP8 rows (1-4), fused as above | k_fp8_mma
 *    weight                 (5-16; to 64 without a bf16 copy) | the bf16 paths on its bf16 copy
 *                           (weight_pack), else k_fp8_dequant + the bf16 paths
 *
 * Under --batch-invariant: no fold, GEMV up to 8 rows then k_gemv_all, no shared ranges, MoE
 * per row. Steps whose other pieces are verify pieces (set_keep; each shorter than
 * CUDA_ATT_SPLIT_LEN) are recorded as decode steps are: their DeltaNet layers run conv1d's run
 * kernels with k_conv_keep and k_conv_state, the gates, and k_gdn_decode4 over the one-row and
 * the verify pieces (the chain needs one-row pieces); their attention takes the split path.
 * Prefill steps are not recorded: their ops launch as issued (cuda_gemm.cu,
 * cuda_attn.cu, cuda_flash.cu, cuda_gdn.cu).
 *
 * A decode step (every piece one row) is ~500 small launches, and at batch 1 the launch gaps
 * cost as much as the weights' bytes. From set_batch of such a step to the next call that
 * must see its results (sync, read, write, copy, zero, the next set_batch) the ops are not
 * launched but recorded: each as a closure over its arguments, plus the arguments' bytes in a
 * signature. At that boundary the list runs, in order, with the rewrites of FUSE_RULES below (a
 * peephole; each output element computed by the same code as unfused, the same bits, except
 * the norm fold). How it runs:
 *   - a graph captured for the same signature and scratch address exists: relaunch it;
 *   - the signature equals the previous step's: capture the run into a graph, keep it;
 *   - else run the launches directly (first sight of a shape; it also grows the scratch, so
 *     nothing grows during a later capture).
 * The signature starts with the metadata layout key and the metadata array's address; every
 * host value a launch depends on is either an op argument or a function of that key, so a
 * replay issues exactly the kernels a direct run would, reading the new step's metadata from
 * the same addresses. */
#include <stdio.h>
#include <string.h>

#include <tuple>
#include <unordered_set>
#include <vector>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fp8.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_ops.h"

#define GRAPH_CACHE 24 /* graphs kept (LRU): the step shapes a server cycles through */

enum {
  GOP_OTHER = 0,
  GOP_MATMUL = 1,
  GOP_SWIGLU = 2,
  /* the DeltaNet decode chain's ops (their arguments in gop.ch) */
  GOP_CONV,
  GOP_GATES,
  GOP_GDN_DEC,
  GOP_GNORM,
  GOP_ATTN,    /* attention (arguments in gop.at) */
  GOP_SIGMUL,  /* sigmoid_mul(out, gate, n) */
  GOP_RMSNORM, /* rmsnorm (arguments in gop.nm) */
  GOP_COLL     /* a collective over the ranks (cuda_graph_rec_collective) */
};

/* GOP_RMSNORM's arguments (the rmsnorm op: x += add; y = norm(x; w, eps)) */
struct gop_norm {
  bf16 *x;
  const bf16 *add;
  const float *w; /* fp32 */
  int T, n;
  float eps;
  bf16 *y;
};

/* GOP_ATTN's arguments */
struct gop_attn {
  backend_buf k_pool, v_pool, q, k, v;
  int nh, nkv, hd;
  float scale;
  backend_buf out;
};

struct gop {
  int kind;
  /* the op: call(be, the arguments at offset arg of cuda_graphs::args), see rec_call */
  void (*call)(backend *, const uint8_t *);
  uint32_t arg;
  /* GOP_MATMUL */
  const bf16 *x;
  const cuda_weight *W;
  int T, K, N;
  bf16 *y;
  /* GOP_SWIGLU (GOP_SIGMUL: out, gate, n) */
  const bf16 *gate, *up;
  size_t n;
  bf16 *out;
  /* GOP_CONV .. GOP_GNORM: each fills its own op's fields */
  cuda_gdn_chain_args ch;
  gop_attn at; /* GOP_ATTN */
  gop_norm nm; /* GOP_RMSNORM */
};

struct graph_entry {
  std::vector<uint8_t> sig;
  uint64_t h;
  void *scratch;
  cudaGraphExec_t exec;
  uint64_t used;
  uint64_t uid; /* never reused: what step_repeat names */
  uint64_t gen; /* holding collectives: the ranks' joint capture it came from (flush_ranks) */
};

struct cuda_graphs {
  int rec;        /* recording the current step */
  int use_graphs; /* capture and replay (off while graph_stop runs a step's head) */
  int pdl;        /* programmatic edges in captured graphs (graph_pdl; off after a failure) */
  backend *be;
  std::vector<gop> ops;
  std::vector<uint8_t> args; /* the recorded ops' arguments (rec_call) */
  std::vector<uint8_t> sig, last_sig, bad_sig;
  std::vector<graph_entry> cache;
  uint64_t tick, uids;
  long captures, replays, direct, fused, pdl_edges, norm_folds, repeats;
  int coll;          /* collectives recorded in this step */
  uint64_t coll_gen; /* joint captures so far (the same count on every rank: flush_ranks) */
  /* step_repeat (off for a test): the last recorded step ran as graph rep_uid (0:
   * it did not run as one graph), its signature beginning with rep_layout (the metadata
   * layout entry, layout_len bytes); rep_pending: this step is that graph again */
  int repeat, rep_pending;
  uint64_t rep_uid;
  size_t layout_len;
  std::vector<uint8_t> rep_layout;
  /* the graph nodes of the capture in progress that are kernels of ours (graph_note_launch) */
  std::unordered_set<cudaGraphNode_t> ours;
};

/* Called by cuda_check_launch, which follows every launch of ours: while a capture is open,
 * the node the stream now ends in is the kernel just launched (cuBLAS calls are never followed
 * by it). */
void cuda_graph_note_launch(cuda_ctx *c) {
  cudaStreamCaptureStatus st;
  const cudaGraphNode_t *deps = NULL;
  size_t nd = 0;
  if (!c->gr) return;
  if (cudaStreamGetCaptureInfo(c->st, &st, NULL, NULL, &deps, NULL, &nd) == cudaSuccess &&
      st == cudaStreamCaptureStatusActive && nd == 1)
    c->gr->ours.insert(deps[0]);
}

/* Appends id and the arguments' bytes to a signature (one resize per op: recording runs on
 * every decode step while the GPU waits). */
template <typename... A>
static void sig_put(std::vector<uint8_t> &s, int id, const A &...a) {
  size_t off = s.size();
  s.resize(off + sizeof id + (sizeof a + ... + 0));
  uint8_t *p = s.data() + off;
  memcpy(p, &id, sizeof id);
  p += sizeof id;
  ((memcpy(p, &a, sizeof a), p += sizeof a), ...);
}

/* The signature's hash for the graph cache (a hit also compares the whole signature): FNV-1a
 * over 8-byte words, the tail by bytes. Runs on every decode step while the GPU waits; per byte
 * it took ~21 µs for a 19 KB signature on this project's CI machine, per word ~4 µs. */
static uint64_t sig_hash(const std::vector<uint8_t> &s) {
  uint64_t h = 1469598103934665603ull;
  size_t n = s.size(), i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 1099511628211ull;
    h ^= h >> 29;
  }
  for (; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

/* A new recorded op that runs fn(be, a...): fn and the arguments are kept as one tuple in the
 * step's argument arena (no allocation per op: the arena keeps its capacity from step to step;
 * recording is host time the GPU waits for at one sequence). */
template <typename... A>
static gop &rec_call(cuda_graphs *g, void (*fn)(backend *, A...), A... a) {
  typedef std::tuple<void (*)(backend *, A...), A...> tup;
  size_t off = (g->args.size() + 15) & ~(size_t)15;
  g->args.resize(off + sizeof(tup));
  new (&g->args[off]) tup(fn, a...);
  g->ops.emplace_back();
  gop &o = g->ops.back();
  o.arg = (uint32_t)off;
  o.call = [](backend *be, const uint8_t *p) {
    std::apply([be](auto f, auto... x) { f(be, x...); }, *(const tup *)p);
  };
  return o;
}

static void rec_run(cuda_graphs *g, const gop &o) { o.call(g->be, g->args.data() + o.arg); }

/* Records op `fn(be, a...)` when the step is being recorded; 0 when the caller runs it. */
template <typename... A>
static int rec_op(backend *be, int id, void (*fn)(backend *, A...), A... a) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) return 0;
  sig_put(g->sig, id, a...);
  rec_call(g, fn, a...).kind = GOP_OTHER;
  return 1;
}

void cuda_graph_clear(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (!g) return;
  for (auto &e : g->cache) cudaGraphExecDestroy(e.exec);
  g->cache.clear();
  g->last_sig.clear();
  g->bad_sig.clear();
  g->rep_uid = 0;
}

/* Called at the end of set_batch (and set_keep): record the step when it is a decode step. */
void cuda_graph_begin(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (!g || c->failed) return;
  g->ops.clear();
  g->args.clear();
  g->sig.clear();
  g->rep_pending = 0;
  g->coll = 0;
  /* verify pieces (set_keep) are recorded too: their launches depend on the piece count only,
   * and they are short enough for attention's split path, which reads lengths on the device */
  g->rec =
      c->b.n_tokens > 0 && c->b.n_prefill == 0 &&
      (c->b.n_verify == 0 ? c->b.n_decode == c->b.n_tokens : c->b.max_len < CUDA_ATT_SPLIT_LEN);
  if (g->rec)
    sig_put(g->sig, 0, c->b.n_tokens, c->b.n_seqs, c->b.max_pages, c->b.n_out, c->d_meta,
            c->b.tokens, c->b.page_table, c->b.out_rows, c->b.decode_ids, c->b.sh_on, c->b.n_verify,
            c->b.verify_ids, c->b.seq_keep);
  else
    g->rep_uid = 0;
  g->layout_len = g->sig.size();
}

/* The caller would issue the previous step's ops again (backend.h step_repeat): when that
 * step ran as one captured graph, this step's metadata has its layout and the scratch has
 * not moved, the graph is this step too (its signature would be the same: the ops' arguments
 * are the caller's, the metadata layout is checked here), and no op is recorded. */
static int cu_step_repeat(backend *be) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graphs *g = c->gr;
  if (!g || !g->rec || !g->repeat || !g->use_graphs || c->failed || !g->rep_uid ||
      !g->ops.empty() || g->sig != g->rep_layout)
    return 0;
  for (auto &e : g->cache)
    if (e.uid == g->rep_uid) {
      if (e.scratch != c->scratch) return 0;
      g->rep_pending = 1;
      return 1;
    }
  return 0;
}

static int gemv_fits(cuda_ctx *c, const gop &o) {
  if (o.kind != GOP_MATMUL || o.T < 1 || o.T > c->gemv_maxt || o.W->cols != o.K || o.W->rows != o.N)
    return 0;
  if (o.W->q8) /* FP8 rows (cuda_fp8.cuh) */
    return !c->batch_invariant && f8_fits(o.K, o.W->bk) && !((uintptr_t)o.x & 15);
  return o.K % 8 == 0 && !(((uintptr_t)o.x | (uintptr_t)o.W->bf) & 15);
}

static int sgemm_fits(cuda_ctx *c, const gop &o) {
  return o.kind == GOP_MATMUL && cuda_fp8_use_bf16(c, o.W, o.T) && o.W->cols == o.K &&
         o.W->rows == o.N && cuda_sgemm_fits(c, o.T, o.K, o.N, 1);
}

static int narrow_fits(cuda_ctx *c, const gop &o) {
  return o.kind == GOP_MATMUL && cuda_fp8_use_bf16(c, o.W, o.T) && o.W->cols == o.K &&
         o.W->rows == o.N && !cuda_sgemm_fits(c, o.T, o.K, o.N, 0) &&
         cuda_gemm_narrow_fits(c, o.x, o.W->bf, o.T, o.K, o.N, o.y);
}

static int overlap(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* How many ops from i on (at most maxm) are products of ops[i]'s x (same T, K) that `fits`
 * takes, into outputs that overlap neither x nor each other. */
static int same_x_run(cuda_ctx *c, const std::vector<gop> &ops, size_t i, int maxm,
                      int (*fits)(cuda_ctx *, const gop &)) {
  const gop &o = ops[i];
  size_t xb = (size_t)o.T * o.K * 2, n = ops.size();
  int m = 1;
  if (overlap(o.y, (size_t)o.T * o.N * 2, o.x, xb)) return 1;
  while (m < maxm && i + m < n) {
    const gop &q = ops[i + m];
    if (!fits(c, q) || q.x != o.x || q.T != o.T || q.K != o.K || !q.W->q8 != !o.W->q8) break;
    size_t qb = (size_t)q.T * q.N * 2;
    int bad = overlap(q.y, qb, o.x, xb);
    for (int j = 0; j < m && !bad; j++)
      bad = overlap(q.y, qb, ops[i + j].y, (size_t)ops[i + j].T * ops[i + j].N * 2);
    if (bad) break;
    m++;
  }
  return m;
}

/* m consecutive products ops[0..m-1] of one x in one launch with `mode`'s epilogue. */
static void launch_multi(cuda_ctx *c, int mode, const gop *ops, int m, gemv_nf nf) {
  const cuda_weight *W[GEMV_MULTI];
  bf16 *y[GEMV_MULTI];
  int N[GEMV_MULTI];
  for (int j = 0; j < m; j++) {
    W[j] = ops[j].W;
    y[j] = ops[j].y;
    N[j] = ops[j].N;
  }
  cuda_gemm_gemv_multi(c, mode, ops[0].x, ops[0].T, ops[0].K, m, W, y, N, nf);
}

/* ops[i..i+1] are conv1d and gdn_gates of one layer (the gates' qkv = the conv output): their
 * arguments in *ch (cuda_gdn_conv_gates). */
static int conv_gates_of(const std::vector<gop> &ops, size_t i, cuda_gdn_chain_args *ch) {
  if (i + 1 >= ops.size() || ops[i].kind != GOP_CONV || ops[i + 1].kind != GOP_GATES ||
      ops[i + 1].ch.conv_out != ops[i].ch.conv_out)
    return 0;
  const cuda_gdn_chain_args &gt = ops[i + 1].ch;
  *ch = ops[i].ch;
  ch->b = gt.b;
  ch->a = gt.a;
  ch->beta = gt.beta;
  ch->g = gt.g;
  ch->A_log = gt.A_log;
  ch->dt_bias = gt.dt_bias;
  ch->nk = gt.nk;
  ch->nv = gt.nv;
  ch->dk = gt.dk;
  ch->dv = gt.dv;
  return 1;
}

/* ops[i..i+3] are conv1d, gdn_gates, gdn_decode and gated_rmsnorm of one layer, chained
 * through their buffers (conv output = the gates' and the step's qkv, the gates' beta and g =
 * the step's, the step's output = the norm's input) and of one shape: their arguments in *ch. */
static int gdn_chain_of(const std::vector<gop> &ops, size_t i, cuda_gdn_chain_args *ch) {
  if (i + 3 >= ops.size() || ops[i + 2].kind != GOP_GDN_DEC || ops[i + 3].kind != GOP_GNORM ||
      !conv_gates_of(ops, i, ch))
    return 0;
  const cuda_gdn_chain_args &dc = ops[i + 2].ch, &gn = ops[i + 3].ch;
  if (dc.conv_out != ch->conv_out || dc.beta != ch->beta || dc.g != ch->g || gn.o != dc.o ||
      ch->nk != dc.nk || ch->nv != dc.nv || ch->dk != dc.dk || ch->dv != dc.dv || gn.nv != dc.nv ||
      gn.dv != dc.dv)
    return 0;
  ch->ssm = dc.ssm;
  ch->o = dc.o;
  ch->z = gn.z;
  ch->out = gn.out;
  ch->norm = gn.norm;
  ch->T = gn.T;
  ch->eps = gn.eps;
  return 1;
}

/* gate g, up u and swiglu sw (glu_at) in one launch with `mode`'s epilogue. */
static void launch_glu(cuda_ctx *c, int mode, const gop &g, const gop &u, const gop &sw,
                       gemv_nf nf) {
  cuda_gemm_glu(c, mode, g.x, g.W, u.W, g.T, g.K, g.N, g.y, u.y, sw.out, nf);
}

/* 1 when ops[i..i+2] are gate and up products of one x on the GEMV path and swiglu(gate, up)
 * into outputs launch_glu may write (none over x; out may alias gate or up). */
static int glu_at(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  if (i + 2 >= ops.size()) return 0;
  const gop &o = ops[i], &u = ops[i + 1], &sw = ops[i + 2];
  if (!gemv_fits(c, o) || !gemv_fits(c, u) || sw.kind != GOP_SWIGLU || u.x != o.x || u.T != o.T ||
      u.K != o.K || u.N != o.N || sw.gate != o.y || sw.up != u.y || sw.n != (size_t)o.T * o.N ||
      !o.W->q8 != !u.W->q8 || (o.W->q8 && (o.W->bk != u.W->bk)))
    return 0;
  size_t xb = (size_t)o.T * o.K * 2, yb = (size_t)o.T * o.N * 2;
  return !overlap(o.y, yb, o.x, xb) && !overlap(u.y, yb, o.x, xb) && !overlap(o.y, yb, u.y, yb) &&
         !overlap(sw.out, yb, o.x, xb) &&
         (sw.out == o.y || sw.out == u.y ||
          (!overlap(sw.out, yb, o.y, yb) && !overlap(sw.out, yb, u.y, yb)));
}

/* ---- the rmsnorm off the products' critical path ----
 * In a recorded step of <= NORM_FOLD_MAXT rows on the GEMV path,
 *   [product P -> mix] [rmsnorm(x += mix; w) -> xn] [products of xn: gate/up/swiglu, or up to
 *   GEMV_MULTI products]
 * runs as
 *   [P, whose epilogue also does x += its output (k_rmsnorm8's expression) and writes
 *    xn = x * (1 + w) in bf16, the norm without its factor]
 *   [the factor kernel: inv[t] = rsqrt(mean(x[t]^2) + eps), k_rmsnorm8's sums]
 *   [the products of xn, GEMV_LATE: launched as the factor kernel starts, streaming their
 *    weights while it runs, waiting for it only before scaling their sums by inv[t]]
 * so a norm no longer stands between two products (microseconds of a one-sequence step inside
 * the pipelined graph). Not bit-identical to the ops as issued (the factor is applied to the
 * sums, not to xn before its bf16 rounding), so off under --batch-invariant (a row's bits would
 * depend on its step taking this path) and for the tests that compare bits. xn holds the unscaled
 * values afterwards: the fold needs no later op to name an address inside xn before the next norm
 * writes it (checked on the recorded arguments). The products read xn, written by P, before their
 * wait: P finished before the factor kernel's wait returned, and they are launched only after that.
 */
struct norm_fold {
  int glu; /* the products after the norm are gate, up, swiglu */
  int m;   /* ops after the norm taken by the fold */
};

/* 1 when the recorded arguments of ops[k] hold a pointer into [p, p + nb). */
static int op_names(const cuda_graphs *g, const std::vector<gop> &ops, size_t k, const void *p,
                    size_t nb) {
  size_t a = ops[k].arg, e = k + 1 < ops.size() ? ops[k + 1].arg : g->args.size();
  for (; a + 8 <= e; a += 8) { /* the argument tuple starts 16-aligned; pointers are 8-aligned */
    uintptr_t v;
    memcpy(&v, g->args.data() + a, 8);
    if (v >= (uintptr_t)p && v < (uintptr_t)p + nb) return 1;
  }
  return 0;
}

/* 1 when the norm ops[j] folds (see above), with its products in *nf; asked at the product
 * before it, which then takes the residual add and writes xn. */
static int norm_fold_at(cuda_ctx *c, const std::vector<gop> &ops, size_t j, norm_fold *nf) {
  const cuda_graphs *g = c->gr;
  size_t n = ops.size();
  if (!c->norm_fold || !c->fold_inv || c->batch_invariant || j == 0 || j + 1 >= n ||
      ops[j].kind != GOP_RMSNORM)
    return 0;
  const gop_norm &r = ops[j].nm;
  size_t xb = (size_t)r.T * r.n * 2;
  if (!r.w || !r.add || r.T < 1 || r.T > NORM_FOLD_MAXT || r.n % 8 || r.n > 8192 ||
      (((uintptr_t)r.x | (uintptr_t)r.y | (uintptr_t)r.w) & 15) || overlap(r.x, xb, r.y, xb) ||
      overlap(r.add, xb, r.y, xb))
    return 0;
  const gop &p = ops[j - 1]; /* the product before takes x += add and writes xn */
  if (!gemv_fits(c, p) || p.y != r.add || p.T != r.T || p.N != r.n ||
      overlap(p.x, (size_t)p.T * p.K * 2, r.x, xb) ||
      overlap(p.x, (size_t)p.T * p.K * 2, r.y, xb) || overlap(p.y, xb, r.x, xb))
    return 0;
  const gop &q = ops[j + 1];
  if (!gemv_fits(c, q) || q.x != r.y || q.T != r.T || q.K != r.n) return 0;
  if (glu_at(c, ops, j + 1)) {
    nf->glu = 1;
    nf->m = 3;
  } else {
    nf->glu = 0;
    nf->m = same_x_run(c, ops, j + 1, GEMV_MULTI, gemv_fits);
  }
  for (int k = 0; k < nf->m; k++) { /* nothing the factor kernel reads is written meanwhile */
    const gop &o = ops[j + 1 + k];
    if (o.kind == GOP_MATMUL && overlap(o.y, (size_t)o.T * o.N * 2, r.x, xb)) return 0;
    if (o.kind == GOP_SWIGLU && overlap(o.out, o.n * 2, r.x, xb)) return 0;
  }
  for (size_t k = j + 1 + nf->m; k < n; k++) { /* xn's readers, up to its next writer */
    const gop &o = ops[k];
    if (o.kind == GOP_RMSNORM && o.nm.y == r.y && o.nm.T == r.T && o.nm.n == r.n &&
        !overlap(o.nm.x, xb, r.y, xb) && !(o.nm.add && overlap(o.nm.add, xb, r.y, xb)))
      break;
    if (op_names(g, ops, k, r.y, xb)) return 0;
  }
  return 1;
}

/* ---- the rewrites ----
 * Each rule looks at ops[i] (and what follows): when it applies it launches the fused form,
 * counts the launches saved in g->fused and returns how many ops it took; else 0, nothing
 * launched. graph_run_ops tries them in FUSE_RULES order at every op. */

/* product, rmsnorm, products of its output -> the norm off the critical path (norm_fold_at) */
static int fuse_norm_fold(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  norm_fold nf;
  if (ops[i].kind != GOP_MATMUL || i + 1 >= ops.size() || ops[i + 1].kind != GOP_RMSNORM ||
      !norm_fold_at(c, ops, i + 1, &nf))
    return 0;
  const gop &o = ops[i];
  const gop_norm &r = ops[i + 1].nm;
  gemv_nf res = {r.w, r.x, r.y, NULL};
  cuda_gemm_gemv(c, GEMV_RES, o.x, o.W, o.T, o.K, o.N, o.y, res);
  cuda_elem_rmsnorm_inv(c, r.x, r.T, r.n, r.eps, c->fold_inv);
  gemv_nf late = {NULL, NULL, NULL, c->fold_inv};
  const gop *q = &ops[i + 2];
  if (nf.glu)
    launch_glu(c, GEMV_LATE, q[0], q[1], q[2], late);
  else if (nf.m > 1)
    launch_multi(c, GEMV_LATE, q, nf.m, late);
  else
    cuda_gemm_gemv(c, GEMV_LATE, q[0].x, q[0].W, q[0].T, q[0].K, q[0].N, q[0].y, late);
  c->gr->fused += nf.glu ? 2 : nf.m - 1;
  c->gr->norm_folds++;
  return 2 + nf.m;
}

/* conv1d, gdn_gates, gdn_decode, gated_rmsnorm of one layer -> k_gdn_chain */
static int fuse_gdn_chain(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  cuda_gdn_chain_args ch;
  if (ops[i].kind != GOP_CONV || !gdn_chain_of(ops, i, &ch) || !cuda_gdn_chain(c, &ch)) return 0;
  c->gr->fused += 3;
  return 4;
}

/* conv1d, gdn_gates (steps the chain does not cover) -> one launch */
static int fuse_conv_gates(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  cuda_gdn_chain_args ch;
  if (ops[i].kind != GOP_CONV || !conv_gates_of(ops, i, &ch) || !cuda_gdn_conv_gates(c, &ch))
    return 0;
  c->gr->fused += 1;
  return 2;
}

/* attention, sigmoid_mul(its output, gate) -> the gate in the merge kernel */
static int fuse_attn_gate(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  if (ops[i].kind != GOP_ATTN || i + 1 >= ops.size() || ops[i + 1].kind != GOP_SIGMUL) return 0;
  const gop_attn &a = ops[i].at;
  const gop &sm = ops[i + 1];
  size_t on = (size_t)c->b.n_tokens * a.nh * a.hd;
  if (sm.out != a.out || sm.n != on || overlap(sm.gate, on * 2, a.out, on * 2)) return 0;
  cuda_attn_attention_gated(c->gr->be, a.k_pool, a.v_pool, a.q, a.k, a.v, a.nh, a.nkv, a.hd,
                            a.scale, (backend_buf)sm.gate, a.out);
  c->gr->fused += 1;
  return 2;
}

/* matmul gate, matmul up, swiglu(gate, up) on the GEMV path -> k_gemv_glu */
static int fuse_glu(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  if (!gemv_fits(c, ops[i]) || !glu_at(c, ops, i)) return 0;
  gemv_nf plain = {NULL, NULL, NULL, NULL};
  launch_glu(c, GEMV_PLAIN, ops[i], ops[i + 1], ops[i + 2], plain);
  c->gr->fused += 2;
  return 3;
}

/* matmuls of one x on the GEMV path into distinct outputs -> k_gemv_multi */
static int fuse_gemv_multi(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  if (!gemv_fits(c, ops[i])) return 0;
  int m = same_x_run(c, ops, i, GEMV_MULTI, gemv_fits);
  if (m < 2) return 0;
  gemv_nf plain = {NULL, NULL, NULL, NULL};
  launch_multi(c, GEMV_PLAIN, &ops[i], m, plain);
  c->gr->fused += m - 1;
  return m;
}

/* matmuls of one x on the skinny-GEMM path -> one k_sgemm launch */
static int fuse_sgemm_multi(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  if (!sgemm_fits(c, ops[i])) return 0;
  int m = same_x_run(c, ops, i, SG_MULTI, sgemm_fits);
  const bf16 *W[SG_MULTI];
  void *y[SG_MULTI];
  int N[SG_MULTI];
  for (int j = 0; j < m; j++) {
    W[j] = ops[i + j].W->bf;
    y[j] = ops[i + j].y;
    N[j] = ops[i + j].N;
  }
  if (m < 2 || !cuda_sgemm(c, ops[i].x, ops[i].T, ops[i].K, m, W, y, N, 0)) return 0;
  c->gr->fused += m - 1;
  return m;
}

/* narrow matmuls of one x (DeltaNet b, a) -> one k_gemv_narrow launch */
static int fuse_narrow_multi(cuda_ctx *c, const std::vector<gop> &ops, size_t i) {
  if (!narrow_fits(c, ops[i])) return 0;
  int m = same_x_run(c, ops, i, GEMV_MULTI, narrow_fits);
  if (m < 2) return 0;
  const bf16 *W[GEMV_MULTI];
  bf16 *y[GEMV_MULTI];
  int N[GEMV_MULTI];
  for (int j = 0; j < m; j++) {
    W[j] = ops[i + j].W->bf;
    y[j] = ops[i + j].y;
    N[j] = ops[i + j].N;
  }
  cuda_gemm_narrow(c, ops[i].x, ops[i].T, ops[i].K, m, W, y, N);
  c->gr->fused += m - 1;
  return m;
}

/* The rewrites, tried in this order at each op; each output element is computed by the same code
 * as unfused (the same bits), except the norm fold (see above). Products of FP8 weights fuse
 * only with FP8 ones (same_x_run, glu_at); sgemm_fits and narrow_fits refuse them. */
static int (*const FUSE_RULES[])(cuda_ctx *, const std::vector<gop> &, size_t) = {
    fuse_norm_fold,   /* product, rmsnorm, its products -> GEMV_RES, k_rmsnorm8<true>, GEMV_LATE */
    fuse_gdn_chain,   /* conv1d, gdn_gates, gdn_decode, gated_rmsnorm -> k_gdn_chain */
    fuse_conv_gates,  /* conv1d, gdn_gates -> k_conv_gates_dec */
    fuse_attn_gate,   /* attention, sigmoid_mul -> the gate in k_attn_merge */
    fuse_glu,         /* gate, up, swiglu (GEMV path) -> k_gemv_glu */
    fuse_gemv_multi,  /* products of one x (GEMV path) -> k_gemv_multi */
    fuse_sgemm_multi, /* products of one x (skinny GEMMs) -> one k_sgemm */
    fuse_narrow_multi /* narrow products of one x -> one k_gemv_narrow */
};

/* Runs the recorded list in order, with the rewrites. */
static void graph_run_ops(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  const std::vector<gop> &ops = g->ops;
  for (size_t i = 0, n = ops.size(); i < n;) {
    int took = 0;
    for (auto rule : FUSE_RULES)
      if ((took = rule(c, ops, i)) > 0) break;
    if (took > 0) {
      i += (size_t)took;
      continue;
    }
    rec_run(g, ops[i]);
    i++;
  }
}

/* 1 when graph node `nd` is a kernel of ours (noted at its launch; every one begins with
 * pdl_enter, see cuda_common.cuh); library kernels (cuBLAS) and other nodes are not. */
static int pdl_node_ours(const cuda_graphs *g, cudaGraphNode_t nd) {
  cudaGraphNodeType t;
  return g->ours.count(nd) && cudaGraphNodeGetType(nd, &t) == cudaSuccess &&
         t == cudaGraphNodeTypeKernel;
}

/* Programmatic dependent launch. A decode step is ~300 kernels in a row, most of them a few
 * microseconds long, and each waits for the one before to drain before it is even launched.
 * Here every edge from a kernel into a kernel of ours becomes a programmatic edge: the next
 * kernel is launched as soon as every block of the previous one has passed its pdl_enter, and
 * its own blocks wait in their pdl_enter until the previous kernel has finished and its writes
 * are visible — the same order and the same bits, without the launch gap. Since every block of
 * ours waits before it exits, a kernel of ours never completes before the one before it, so
 * ordinary edges further on keep their meaning. Returns the edges changed (0: none or the
 * graph's API failed, the graph unchanged or fully ordered either way). */
static long graph_pdl(const cuda_graphs *g, cudaGraph_t graph) {
  size_t n = 0;
  if (cudaGraphGetEdges(graph, NULL, NULL, NULL, &n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return 0;
  }
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> ed(n);
  if (cudaGraphGetEdges(graph, from.data(), to.data(), ed.data(), &n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  long changed = 0;
  for (size_t i = 0; i < n; i++) {
    if (ed[i].type != cudaGraphDependencyTypeDefault || ed[i].from_port != 0) continue;
    cudaGraphNodeType ft;
    if (!pdl_node_ours(g, to[i]) || cudaGraphNodeGetType(from[i], &ft) != cudaSuccess ||
        ft != cudaGraphNodeTypeKernel)
      continue;
    cudaGraphEdgeData pe;
    memset(&pe, 0, sizeof pe);
    pe.from_port = cudaGraphKernelNodePortProgrammatic;
    pe.type = cudaGraphDependencyTypeProgrammatic;
    if (cudaGraphRemoveDependencies(graph, &from[i], &to[i], &ed[i], 1) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (cudaGraphAddDependencies(graph, &from[i], &to[i], &pe, 1) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphAddDependencies(graph, &from[i], &to[i], &ed[i], 1); /* as it was */
      continue;
    }
    changed++;
  }
  return changed;
}

/* Captures the recorded run into an instantiated graph, not launched; NULL when capture is not
 * possible. Thread-local capture mode: the ranks of a tensor-parallel model capture at once,
 * each on its own thread. */
static cudaGraphExec_t graph_build(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    g->bad_sig = g->sig;
    return NULL;
  }
  c->capturing = 1;
  c->capture_broken = 0;
  g->ours.clear();
  cuda_ktrace_capture_begin(c);
  graph_run_ops(c);
  c->capturing = 0;
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(c->st, &graph);
  if (e != cudaSuccess || c->failed || c->capture_broken || !graph) {
    /* a failure inside the capture is the capture's, not the step's: the direct run that
     * follows reports real ones */
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    c->failed = 0;
    c->err[0] = 0;
    c->capture_broken = 0;
    g->bad_sig = g->sig;
    return NULL;
  }
  long pdl = g->pdl ? graph_pdl(g, graph) : 0;
  g->ours.clear();
  cudaGraphExec_t exec = NULL;
  e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (pdl)
      g->pdl = 0; /* the next capture goes without the programmatic edges */
    else
      g->bad_sig = g->sig;
    return NULL;
  }
  g->pdl_edges += pdl;
  cuda_ktrace_capture_end(c, exec);
  return exec;
}

/* Launches graph_build's exec for the recorded step and keeps it in the cache (replacing one of
 * the same signature); 0 when the launch failed (exec destroyed). */
static int graph_keep(cuda_ctx *c, uint64_t h, cudaGraphExec_t exec, uint64_t gen) {
  cuda_graphs *g = c->gr;
  if (cudaGraphLaunch(exec, c->st) != cudaSuccess) {
    cudaGetLastError();
    cudaGraphExecDestroy(exec);
    g->bad_sig = g->sig;
    return 0;
  }
  for (size_t i = 0; i < g->cache.size(); i++)
    if (g->cache[i].h == h && g->cache[i].scratch == c->scratch && g->cache[i].sig == g->sig) {
      cudaGraphExecDestroy(g->cache[i].exec);
      g->cache.erase(g->cache.begin() + (long)i);
      break;
    }
  if (g->cache.size() >= GRAPH_CACHE) {
    size_t lru = 0;
    for (size_t i = 1; i < g->cache.size(); i++)
      if (g->cache[i].used < g->cache[lru].used) lru = i;
    cudaGraphExecDestroy(g->cache[lru].exec);
    g->cache.erase(g->cache.begin() + (long)lru);
  }
  graph_entry en;
  en.sig = g->sig;
  en.h = h;
  en.scratch = c->scratch;
  en.exec = exec;
  en.used = ++g->tick;
  en.uid = ++g->uids;
  en.gen = gen;
  g->rep_uid = en.uid;
  g->rep_layout.assign(g->sig.begin(), g->sig.begin() + (long)g->layout_len);
  g->cache.push_back(std::move(en));
  g->captures++;
  return 1;
}

/* Captures the recorded run into a graph and launches it; 0 when capture is not possible (the
 * caller then runs the list directly). */
static int graph_capture(cuda_ctx *c, uint64_t h) {
  cudaGraphExec_t exec = graph_build(c);
  return exec && graph_keep(c, h, exec, 0);
}

/* Launches a cached graph for the recorded step (its replay); 0 when the launch failed. */
static int graph_replay(cuda_ctx *c, graph_entry &e) {
  cuda_graphs *g = c->gr;
  cuda_ktrace_replay(c, e.exec);
  if (cudaGraphLaunch(e.exec, c->st) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  e.used = ++g->tick;
  g->replays++;
  return 1;
}

/* A step_repeat step: the graph of the step before, launched again. Its ops were never
 * issued, so a failed launch fails the step. */
static void graph_repeat(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  g->rep_pending = 0;
  if (!g->ops.empty()) {
    cuda_fail(c, "step_repeat", "ops issued in a step the backend repeats");
    return;
  }
  for (auto &e : g->cache)
    if (e.uid == g->rep_uid) {
      if (graph_replay(c, e))
        g->repeats++;
      else
        cuda_fail(c, "step_repeat", "graph launch failed");
      return;
    }
  cuda_fail(c, "step_repeat", "the step's graph is gone");
}

/* The cached graph of the recorded step (signature hash h), or NULL. */
static graph_entry *graph_find(cuda_ctx *c, uint64_t h) {
  for (auto &e : c->gr->cache)
    if (e.h == h && e.scratch == c->scratch && e.sig == c->gr->sig) return &e;
  return NULL;
}

/* Ends a flushed step: runs its ops as issued unless a graph ran them (done), then drops them. */
static void step_finish(cuda_ctx *c, int done) {
  cuda_graphs *g = c->gr;
  if (!done) {
    graph_run_ops(c);
    g->direct++;
    g->last_sig.swap(g->sig);
  }
  g->ops.clear();
  g->args.clear();
  g->sig.clear();
}

/* The recorded step's collectives alone, as issued: a rank that failed still takes part in
 * them, so that no other rank waits forever. */
static void run_collectives(cuda_graphs *g) {
  for (const gop &o : g->ops)
    if (o.kind == GOP_COLL) rec_run(g, o);
}

/* Runs a recorded step that holds NCCL collectives. NCCL asks that a collective be captured on
 * every rank or on none, and that a graph holding one be launched by every rank of its capture
 * from that same capture, so the ranks agree (cuda_comm_agree) on one way for the step: each
 * offers -1 (failed), 0 (direct), 1 (may capture: it ran this signature directly last time) or
 * 2 + gen (holds the graph of joint capture gen); all replay when every offer is the same
 * graph, all capture when every offer is >= 1 (and launch only when every capture succeeded),
 * else all run directly. Every rank flushes such a step on its own thread (backend.h step_end);
 * each agreement is a host barrier of the ranks' threads. */
static void flush_ranks(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  uint64_t h = sig_hash(g->sig);
  graph_entry *hit = NULL;
  long long mine = -1, hi;
  if (!c->failed && !g->use_graphs)
    mine = 0;
  else if (!c->failed && (hit = graph_find(c, h)))
    mine = 2 + (long long)hit->gen;
  else if (!c->failed)
    mine = g->sig == g->last_sig && g->sig != g->bad_sig;
  long long lo = cuda_comm_agree(c, mine, &hi);
  int done = 0;
  if (lo == hi && lo >= 2) {
    done = graph_replay(c, *hit);
    if (!done) cuda_fail(c, "decode step", "graph launch failed"); /* the others launched theirs */
  } else if (lo >= 1) {
    uint64_t gen = ++g->coll_gen;
    cudaGraphExec_t exec = graph_build(c);
    if (cuda_comm_agree(c, exec != NULL, &hi) == 1) {
      done = graph_keep(c, h, exec, gen);
      if (!done) cuda_fail(c, "decode step", "graph launch failed");
    } else if (exec) {
      cudaGraphExecDestroy(exec);
    }
  }
  if (c->failed) {
    run_collectives(g);
    done = 1;
  }
  step_finish(c, done);
}

/* Runs what was recorded (see above). */
void cuda_graph_flush(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (!g || !g->rec) return;
  g->rec = 0;
  if (g->rep_pending && !c->failed) {
    graph_repeat(c);
    step_finish(c, 1);
    return;
  }
  g->rep_pending = 0;
  g->rep_uid = 0;
  if (g->coll && cuda_comm_records(c)) {
    flush_ranks(c);
    return;
  }
  if (g->ops.empty() || c->failed) {
    g->ops.clear();
    g->args.clear();
    return;
  }
  uint64_t h = sig_hash(g->sig);
  int done = 0;
  if (g->use_graphs) {
    graph_entry *e = graph_find(c, h);
    if (e && (done = graph_replay(c, *e))) {
      g->rep_uid = e->uid;
      g->rep_layout.assign(g->sig.begin(), g->sig.begin() + (long)g->layout_len);
    }
    if (!done && g->sig == g->last_sig && g->sig != g->bad_sig) done = graph_capture(c, h);
  }
  step_finish(c, done);
}

/* An op that cannot be recorded (it synchronises or allocates): what was recorded runs now
 * and the rest of the step runs as issued. */
static void graph_stop(cuda_ctx *c) {
  cuda_graphs *g = c->gr;
  if (!g || !g->rec) return;
  int saved_use = g->use_graphs;
  g->use_graphs = 0;
  cuda_graph_flush(c);
  g->use_graphs = saved_use;
}

void cuda_graph_stop(cuda_ctx *c) { graph_stop(c); }

int cuda_graph_rec_collective(cuda_ctx *c, int id,
                              void (*fn)(backend *, backend_buf, size_t, backend_buf),
                              backend_buf x, size_t n, backend_buf out) {
  cuda_graphs *g = c->gr;
  if (!g || !g->rec) return 0;
  sig_put(g->sig, id, x, n, out);
  rec_call(g, fn, x, n, out).kind = GOP_COLL;
  g->coll++;
  return 1;
}

/* ---- the op table's entries (recorded in decode steps, else launched as issued) ---- */

static void w_embed(backend *be, backend_weight E, int H, backend_buf out) {
  if (!rec_op(be, 1, cuda_elem_embed, E, H, out)) cuda_elem_embed(be, E, H, out);
}
static void w_rmsnorm(backend *be, backend_buf x, backend_buf add, backend_weight w, int T, int n,
                      float eps, backend_buf y) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_elem_rmsnorm(be, x, add, w, T, n, eps, y);
    return;
  }
  sig_put(g->sig, 2, x, add, w, T, n, eps, y);
  gop &o = rec_call(g, cuda_elem_rmsnorm, x, add, w, T, n, eps, y);
  o.kind = GOP_RMSNORM;
  o.nm = {(bf16 *)x, (const bf16 *)add, CW(w)->f32, T, n, eps, (bf16 *)y};
}
static void w_add(backend *be, backend_buf x, backend_buf y, size_t n) {
  if (!rec_op(be, 3, cuda_elem_add, x, y, n)) cuda_elem_add(be, x, y, n);
}
static void w_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                     backend_buf y) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_gemm_matmul(be, x, W, T, K, N, y);
    return;
  }
  sig_put(g->sig, 4, x, W, T, K, N, y);
  gop &o = rec_call(g, cuda_gemm_matmul, x, W, T, K, N, y);
  o.kind = GOP_MATMUL;
  o.x = (const bf16 *)x;
  o.W = CW(W);
  o.T = T;
  o.K = K;
  o.N = N;
  o.y = (bf16 *)y;
}
static void w_qk_norm_rope(backend *be, backend_buf qg, backend_buf k, backend_weight q_norm,
                           backend_weight k_norm, int nh, int nkv, int hd, int rot, double theta,
                           float eps, backend_buf q_out, backend_buf gate_out) {
  if (!rec_op(be, 5, cuda_elem_qk_norm_rope, qg, k, q_norm, k_norm, nh, nkv, hd, rot, theta, eps,
              q_out, gate_out))
    cuda_elem_qk_norm_rope(be, qg, k, q_norm, k_norm, nh, nkv, hd, rot, theta, eps, q_out,
                           gate_out);
}
static void w_attention(backend *be, backend_buf k_pool, backend_buf v_pool, backend_buf q,
                        backend_buf k, backend_buf v, int nh, int nkv, int hd, float scale,
                        backend_buf out) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_attn_attention(be, k_pool, v_pool, q, k, v, nh, nkv, hd, scale, out);
    return;
  }
  sig_put(g->sig, 6, k_pool, v_pool, q, k, v, nh, nkv, hd, scale, out);
  gop &o = rec_call(g, cuda_attn_attention, k_pool, v_pool, q, k, v, nh, nkv, hd, scale, out);
  o.kind = GOP_ATTN;
  o.at = {k_pool, v_pool, q, k, v, nh, nkv, hd, scale, out};
}
static void w_sigmoid_mul(backend *be, backend_buf x, backend_buf gate, size_t n) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_elem_sigmoid_mul(be, x, gate, n);
    return;
  }
  sig_put(g->sig, 7, x, gate, n);
  gop &o = rec_call(g, cuda_elem_sigmoid_mul, x, gate, n);
  o.kind = GOP_SIGMUL;
  o.out = (bf16 *)x;
  o.gate = (const bf16 *)gate;
  o.n = n;
}
static void w_swiglu(backend *be, backend_buf gate, backend_buf up, size_t n, backend_buf out) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  if (!g || !g->rec) {
    cuda_elem_swiglu(be, gate, up, n, out);
    return;
  }
  sig_put(g->sig, 8, gate, up, n, out);
  gop &o = rec_call(g, cuda_elem_swiglu, gate, up, n, out);
  o.kind = GOP_SWIGLU;
  o.gate = (const bf16 *)gate;
  o.up = (const bf16 *)up;
  o.n = n;
  o.out = (bf16 *)out;
}
static void w_moe(backend *be, backend_buf x, const backend_moe *m, int T, int H, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  /* the per-row and device-grouped paths are plain launches; the cuBLAS-grouped one reads the
   * group sizes back (the recorded ops run first, the rest of the step as issued) */
  if (cuda_moe_records(c, m, T, H) && rec_op(be, 18, cuda_moe_moe, x, m, T, H, out)) return;
  graph_stop(c);
  cuda_moe_moe(be, x, m, T, H, out);
}
static void w_conv1d(backend *be, backend_buf conv_state, backend_buf x, backend_weight w, int C,
                     int K, backend_buf out) {
  if (!rec_op(be, 9, cuda_gdn_conv1d, conv_state, x, w, C, K, out)) {
    cuda_gdn_conv1d(be, conv_state, x, w, C, K, out);
    return;
  }
  gop &o = cuda_ctx_of(be)->gr->ops.back();
  o.kind = GOP_CONV;
  o.ch.conv_state = conv_state;
  o.ch.x = x;
  o.ch.conv_w = w;
  o.ch.C = C;
  o.ch.K = K;
  o.ch.conv_out = out;
}
static void w_gdn_gates(backend *be, backend_buf qkv, backend_buf b, backend_buf a,
                        backend_weight A_log, backend_weight dt_bias, int nk, int nv, int dk,
                        int dv, backend_buf beta, backend_buf g) {
  if (!rec_op(be, 10, cuda_elem_gdn_gates, qkv, b, a, A_log, dt_bias, nk, nv, dk, dv, beta, g)) {
    cuda_elem_gdn_gates(be, qkv, b, a, A_log, dt_bias, nk, nv, dk, dv, beta, g);
    return;
  }
  gop &o = cuda_ctx_of(be)->gr->ops.back();
  o.kind = GOP_GATES;
  o.ch.conv_out = qkv;
  o.ch.b = b;
  o.ch.a = a;
  o.ch.A_log = A_log;
  o.ch.dt_bias = dt_bias;
  o.ch.nk = nk;
  o.ch.nv = nv;
  o.ch.dk = dk;
  o.ch.dv = dv;
  o.ch.beta = beta;
  o.ch.g = g;
}
static void w_gdn_prefill(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                          backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  if (!rec_op(be, 11, cuda_gdn_prefill, ssm, qkv, beta, g, nk, nv, dk, dv, out))
    cuda_gdn_prefill(be, ssm, qkv, beta, g, nk, nv, dk, dv, out);
}
static void w_gdn_decode(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                         backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  if (!rec_op(be, 12, cuda_gdn_decode, ssm, qkv, beta, g, nk, nv, dk, dv, out)) {
    cuda_gdn_decode(be, ssm, qkv, beta, g, nk, nv, dk, dv, out);
    return;
  }
  gop &o = cuda_ctx_of(be)->gr->ops.back();
  o.kind = GOP_GDN_DEC;
  o.ch.ssm = ssm;
  o.ch.conv_out = qkv;
  o.ch.beta = beta;
  o.ch.g = g;
  o.ch.nk = nk;
  o.ch.nv = nv;
  o.ch.dk = dk;
  o.ch.dv = dv;
  o.ch.o = out;
}
static void w_gated_rmsnorm(backend *be, backend_buf o, backend_buf z, backend_weight w, int T,
                            int nv, int dv, float eps, backend_buf out) {
  if (!rec_op(be, 13, cuda_elem_gated_rmsnorm, o, z, w, T, nv, dv, eps, out)) {
    cuda_elem_gated_rmsnorm(be, o, z, w, T, nv, dv, eps, out);
    return;
  }
  gop &r = cuda_ctx_of(be)->gr->ops.back();
  r.kind = GOP_GNORM;
  r.ch.o = o;
  r.ch.z = z;
  r.ch.norm = w;
  r.ch.T = T;
  r.ch.nv = nv;
  r.ch.dv = dv;
  r.ch.eps = eps;
  r.ch.out = out;
}
static void w_logits(backend *be, backend_buf x, backend_weight norm, float eps, backend_weight W,
                     int H, int V, backend_buf out) {
  if (!rec_op(be, 14, cuda_gemm_logits, x, norm, eps, W, H, V, out))
    cuda_gemm_logits(be, x, norm, eps, W, H, V, out);
}
static void w_argmax(backend *be, backend_buf x, int n, int V, backend_buf ids, backend_buf maxv) {
  if (!rec_op(be, 15, cuda_greedy_argmax, x, n, V, ids, maxv))
    cuda_greedy_argmax(be, x, n, V, ids, maxv);
}
static void w_logits_argmax(backend *be, backend_buf x, backend_weight norm, float eps,
                            backend_weight W, int H, int V, backend_buf logits, backend_buf ids) {
  if (!rec_op(be, 16, cuda_greedy_logits_argmax, x, norm, eps, W, H, V, logits, ids))
    cuda_greedy_logits_argmax(be, x, norm, eps, W, H, V, logits, ids);
}
static void w_sample(backend *be, backend_buf x, int n, int V, backend_buf params,
                     backend_buf ids) {
  if (!rec_op(be, 17, cuda_sample_sample, x, n, V, params, ids))
    cuda_sample_sample(be, x, n, V, params, ids);
}
static int cu_logits_argmax_prepare(backend *be, backend_weight W, int H, int V, char *err,
                                    size_t errlen) {
  cuda_graph_flush(cuda_ctx_of(be));
  return cuda_greedy_prepare(be, W, H, V, err, errlen);
}

/* Counters of the decode-step recorder (see backend_cuda.h). */
extern "C" long backend_cuda_norm_folds(backend *be) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  return g ? g->norm_folds : 0;
}

extern "C" void backend_cuda_graph_stats(backend *be, long out[6]) {
  cuda_graphs *g = cuda_ctx_of(be)->gr;
  out[5] = g ? g->repeats : 0;
  out[4] = g ? g->pdl_edges : 0;
  out[0] = g ? g->captures : 0;
  out[1] = g ? g->replays : 0;
  out[2] = g ? g->direct : 0;
  out[3] = g ? g->fused : 0;
}

/* ---- lifetime ---- */

int cuda_graph_init(cuda_ctx *c, backend *be, int repeat) {
  cuda_graphs *g = new (std::nothrow) cuda_graphs();
  if (!g) return -1;
  g->be = be;
  g->use_graphs = 1;
  g->pdl = 1;
  g->repeat = repeat;
  c->gr = g;
  return 0;
}

void cuda_graph_release(cuda_ctx *c) {
  cuda_graph_clear(c);
  delete c->gr;
  c->gr = NULL;
}

void cuda_graph_ops(backend *be) {
  be->step_repeat = cu_step_repeat;
  be->embed = w_embed;
  be->rmsnorm = w_rmsnorm;
  be->add = w_add;
  be->matmul = w_matmul;
  be->qk_norm_rope = w_qk_norm_rope;
  be->attention = w_attention;
  be->sigmoid_mul = w_sigmoid_mul;
  be->swiglu = w_swiglu;
  be->moe = w_moe;
  be->conv1d = w_conv1d;
  be->gdn_gates = w_gdn_gates;
  be->gdn_prefill = w_gdn_prefill;
  be->gdn_decode = w_gdn_decode;
  be->gated_rmsnorm = w_gated_rmsnorm;
  be->logits = w_logits;
  be->argmax = w_argmax;
  be->logits_argmax = w_logits_argmax;
  be->sample = w_sample;
  be->logits_argmax_prepare = cu_logits_argmax_prepare;
}
