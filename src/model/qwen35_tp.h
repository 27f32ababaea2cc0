/* qwen35_tp — tensor parallelism for the Qwen3.5 / Qwen3-Next model (vLLM's
 * --tensor-parallel-size N): which weight is split how over N ranks, the shard of the config and
 * of the weights that rank r loads, and the runner that issues one step on every rank at once.
 * Megatron-style: a column-parallel product splits its output rows (each rank computes whole
 * heads or a slice of the FFN's intermediate width), the row-parallel product after it splits
 * its input columns the same way and leaves each rank a partial sum, which one all-reduce adds
 * (qwen35.c, backend.h all_reduce_sum):
 *
 *   weight                          rank r holds                                 kind
 *   q_proj (q and gate rows)        q heads [r nh/N, (r+1) nh/N)                 column
 *   k_proj, v_proj                  kv heads [r nkv/N, ...), or kv head          column
 *                                   r / (N/nkv) when nkv < N (replicated)
 *   o_proj                          the columns of its q heads                   row + all-reduce
 *   in_proj_qkv, conv1d             q and k rows of key heads [r nk/N, ...),     column
 *                                   v rows of value heads [r nv/N, ...)
 *   in_proj_z, in_proj_b,           its value heads                              column
 *   in_proj_a, A_log, dt_bias
 *   out_proj (DeltaNet)             the columns of its value heads               row + all-reduce
 *   gate_proj, up_proj              intermediate rows [r I/N, (r+1) I/N)         column
 *   down_proj                       those columns                                row + all-reduce
 *   experts' gate/up/down, shared   the same slice of every expert's (and the    column / row,
 *   expert's                        shared expert's) intermediate width          one all-reduce
 *   router, shared_expert_gate,     replicated                                   -
 *   norms
 *   embedding                       vocab rows [r W, r W + n_r), W = ceil(V/N),  vocab, then
 *                                   and zero rows up to W + 1 (another rank's    all-reduce
 *                                   token is looked up as row W)
 *   lm-head                         the same vocab rows, zero rows up to W       vocab, then
 *                                   (tied: the embedding itself)                 all-gather
 *
 * So a rank owns whole attention heads, whole DeltaNet heads with their conv channels,
 * recurrent state and conv window, and its K/V heads' pages: per rank a config with N times
 * fewer heads and narrower FFNs (qwen35_tp_config), run by qwen35.c's forward unchanged but for
 * the all-reduce after each row-parallel product and after the embedding (the one rank that holds
 * a token's row adds it to zeros: the same bits as the whole table), and the all-gather of each
 * rank's W logit columns, which rank 0 puts in place before its greedy or sampling op (a logit
 * is one whole dot product on one rank: the same bits as TP = 1's for the same hidden row). Page
 * tables and state slots are the same ids on every rank; each rank's pools hold its own heads. */
#ifndef DS_QWEN35_TP_H
#define DS_QWEN35_TP_H
#include <stddef.h>

#include "model/config.h"
#include "model/weights.h"

/* 0 when the model splits over n ranks; -1 with one line in err naming the size that n does not
 * divide (attention heads, KV heads, DeltaNet key or value heads, the FFN's, the experts' or the
 * shared expert's intermediate size). */
int qwen35_tp_check(const model_config *c, int n, char *err, size_t errlen);

/* Rank r's config: c with the rank's head counts and widths (qwen35_tp_check(c, n) passed). */
void qwen35_tp_config(const model_config *c, int n, int r, model_config *out);

/* Rank r's vocabulary: rows [*first, *first + *count) of the embedding and the lm-head, of
 * *width = ceil(V / n) on every rank (the last rank's count may be smaller, or 0). */
void qwen35_tp_vocab(const model_config *c, int n, int r, int *first, int *count, int *width);

/* Rank r's weights (w): views into the full weights for replicated tensors and contiguous row
 * ranges, owned copies for the rest (a column slice, the q/k/v row ranges of in_proj_qkv; an FP8
 * slice stays FP8 with its blocks' scales where it keeps the blocks whole, else it is dequantized
 * to F32 exactly as an upload dequantizes it); no MTP head. The embedding has
 * width + 1 rows and an untied lm-head width rows (qwen35_tp_vocab), zeros past the rank's count;
 * a tied lm-head is the embedding itself. */
typedef struct qwen35_tp_shard {
  model_weights w;
  void **owned; /* the copies and arrays w points into */
  int n_owned, cap_owned;
} qwen35_tp_shard;

/* Makes rank r's shard of w (qwen35_tp_check(c, n) passed). Returns 0, or -1 with err when out
 * of memory (nothing left allocated). Free with qwen35_tp_shard_free; w must outlive the shard. */
int qwen35_tp_shard_init(qwen35_tp_shard *s, const model_config *c, const model_weights *w, int n,
                         int r, char *err, size_t errlen);
void qwen35_tp_shard_free(qwen35_tp_shard *s);

/* The ranks' threads: ranks 1 .. n-1 each wait on a thread of their own for the next step, so a
 * step starts no thread. qwen35_tp_runner_init returns 0, or -1 with err when a thread cannot
 * start (nothing left running). */
typedef struct qwen35_tp_runner qwen35_tp_runner;
int qwen35_tp_runner_init(qwen35_tp_runner **out, int n, char *err, size_t errlen);
void qwen35_tp_runner_free(qwen35_tp_runner *r); /* NULL is a no-op; stops and joins the threads */

/* Calls fn(arg, r) for every rank r at once: rank 0 on the calling thread, the others on their
 * threads (their collectives meet inside fn), and returns when all have returned. One call at a
 * time per runner. */
void qwen35_tp_run(qwen35_tp_runner *r, void (*fn)(void *arg, int rank), void *arg);

#endif
