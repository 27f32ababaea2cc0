/* qwen35 — the Qwen3.5 / Qwen3.6 / Qwen3-Next forward pass over a batch of sequences, written
 * once against the backend op table (backend/backend.h), plus the device memory it runs over:
 *
 *   KV pages   one pool of n_pages pages of QWEN35_PAGE_TOKENS tokens; a page id names the
 *              same rows in every full-attention layer (K and V, [nkv, hd] per token).
 *   slots      n_slots recurrent-state slots; per DeltaNet layer a conv state [conv_dim, K-1]
 *              (the last K-1 pre-conv inputs) and an fp32 SSM state [nv, dk, dv]. Running
 *              sequences and prefix-cache snapshot slabs are both slots; which is which is the
 *              caller's business (cache/state_pool).
 *
 * Numerics contract (what batch invariance and restore parity rest on):
 *   - every token row is computed with the same operation order whatever else is in the
 *     batch (reductions never split across rows or threads differently);
 *   - a 1-token piece of a sequence runs the DeltaNet recurrent step; a longer piece runs the
 *     chunked algorithm with chunks aligned to absolute positions (multiples of 64), so
 *     splitting a sequence's prefill at multiples of 64 never changes a bit.
 * The mechanism never decides: which pages and slots a sequence uses is the scheduler's. */
#ifndef DS_QWEN35_H
#define DS_QWEN35_H
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

/* The backend's page size and DeltaNet chunk, under the model's prefix for its callers. */
#define QWEN35_PAGE_TOKENS BACKEND_PAGE_TOKENS
#define QWEN35_CHUNK BACKEND_CHUNK

typedef struct qwen35 qwen35;

typedef struct qwen35_mem_opts {
  int n_pages; /* KV pages in the pool */
  int n_slots; /* recurrent-state slots (running sequences + snapshot slabs) */
  int packed;  /* 1: the backend's packed copies of the dense layers' products (weight_pack) */
  /* keep slots (speculative decoding; 0: none): keep_k state slots for each of keep_lanes
   * lanes, after the n_slots: a verify piece (QWEN35_LOGITS_VERIFY) in lane l leaves its state
   * after row r in slot n_slots + l * keep_k + r (qwen35_keep_slot); a step's verify pieces
   * take distinct lanes, so the lanes bound the sequences that verify drafts in one step */
  int keep_k, keep_lanes;
} qwen35_mem_opts;

/* Device bytes the packed copies of the dense layers' product weights (q, k, v, o, the
 * DeltaNet input and output projections, gate, up, down) would take: for a bf16 weight 1.5
 * bytes a value and 4 a row when its width is a multiple of 512 and at most 24,576 (the CUDA
 * layout, cuda/cuda_packed.cuh), for an FP8 one its bf16 copy, 2 bytes a value (*fp8: those
 * copies' part). An estimate from the checkpoint, made before the upload. */
double qwen35_packed_bytes(const model_config *c, const model_weights *w, double *fp8);

/* What qwen35_init and its steps would take on be, in device bytes, known from the config and
 * the checkpoint before the upload (the engine's memory plan). */
typedef struct qwen35_plan_bytes {
  size_t weights; /* the uploaded weights as be stores them (be->weight_size), no packed copy */
  size_t page;    /* one KV page over every full-attention layer (and the MTP head's, loaded) */
  size_t slot;    /* one recurrent-state slot */
  size_t token;   /* one token's activations in a step (qwen35's scratch) */
} qwen35_plan_bytes;
void qwen35_plan(const model_config *c, const model_weights *w, backend *be, qwen35_plan_bytes *b);
/* The same for rank 0 of n tensor-parallel ranks (qwen35_init_ranks), the largest rank (the MTP
 * head is its, and the first vocabulary rows): each split weight's 1/n share (qwen35_tp.h),
 * the vocabulary rows of a rank, the replicated weights whole, the pools and the scratch of the
 * rank's heads and widths. n = 1: qwen35_plan. An FP8 slice that cuts a block is counted as
 * staying FP8. */
void qwen35_plan_ranks(const model_config *c, const model_weights *w, backend *be, int n,
                       qwen35_plan_bytes *b);

/* One sequence's part of a step. */
typedef struct fwd_seq {
  const int32_t *tokens; /* [n_tokens] the new tokens of this step */
  int n_tokens;          /* >= 1 */
  int pos;               /* tokens already in this sequence's cache = position of tokens[0] */
  const int32_t *pages;  /* page table covering positions [0, pos + n_tokens) */
  int n_pages;
  int slot;   /* state slot holding the recurrent state after `pos` tokens (zeroed at pos 0) */
  int logits; /* QWEN35_LOGITS_* */
  int keep;   /* a verify piece's keep lane (qwen35_mem_opts.keep_lanes), unread otherwise */
} fwd_seq;

/* QWEN35_LOGITS_VERIFY: the logits of every row, and a verify piece (backend.h "Verify
 * pieces"; speculative decoding): its rows computed exactly as n_tokens one-token steps would
 * compute them, the state after row r < n_tokens - 1 left in qwen35_keep_slot(keep, r), the
 * state after the last row in `slot`. n_tokens - 1 <= keep_k, keep < keep_lanes; needs
 * qwen35_can_verify. */
enum {
  QWEN35_LOGITS_NONE = 0,
  QWEN35_LOGITS_LAST = 1,
  QWEN35_LOGITS_ALL = 2,
  QWEN35_LOGITS_VERIFY = 3
};

/* Uploads the weights to the backend and allocates the pools. Returns 0, or -1 with err
 * (out of device memory, unsupported config). Owns nothing of c or w; both must outlive m. */
int qwen35_init(qwen35 **out, const model_config *c, const model_weights *w, backend *be,
                const qwen35_mem_opts *o, char *err, size_t errlen);
/* qwen35_init over n tensor-parallel ranks (backend_create_ranks; n == 1: qwen35_init on
 * ranks[0]): each rank a model over its shard of the weights (qwen35_tp.h) on its own backend,
 * with its own K/V and state pools holding its heads, the same page and slot ids. The model
 * returned is rank 0's and stands for all of them: every function below runs on every rank
 * (a step's ranks at once, on threads of their own) and answers for the whole model
 * (qwen35_config: c; the byte counts: the ranks' sum; host copies of a slot or page: rank 0's
 * bytes, then rank 1's, ...); qwen35_backend and qwen35_packed are rank 0's, the one that
 * issues the steps and holds the logits.
 * Returns 0, or -1 with one line in err (also when n does not divide a head count or width:
 * qwen35_tp_check). The caller keeps the backends, destroyed after qwen35_free. */
int qwen35_init_ranks(qwen35 **out, const model_config *c, const model_weights *w,
                      backend *const *ranks, int n, const qwen35_mem_opts *o, char *err,
                      size_t errlen);
void qwen35_free(qwen35 *m);
/* Product weights with a packed copy, the copies' device bytes (in qwen35_weight_bytes too)
 * and the weights' own bytes they stand in for in a decode step (all 0: none). */
void qwen35_packed(const qwen35 *m, int *n, size_t *bytes, size_t *replaced);
const model_config *qwen35_config(const qwen35 *m);
/* The uploaded embedding and lm-head (the same weight when tied), owned by m: the MTP head
 * (qwen35_mtp) shares them. Returns 0, or -1 when m is tensor-parallel (each rank holds a slice
 * of the vocabulary: the caller uploads its own whole copies). */
int qwen35_vocab_weights(const qwen35 *m, backend_weight *embed, backend_weight *lm_head);

/* Runs one forward step over n_seqs sequences. Writes float32 logits [n_rows, vocab_size],
 * row-major, for the rows asked for, in the order of seqs (all rows of a LOGITS_ALL sequence
 * in position order). Returns 0, or -1 with err when the backend fails (the caller fails the
 * affected requests; pools stay consistent). */
int qwen35_forward(qwen35 *m, const fwd_seq *seqs, int n_seqs, float *logits, char *err,
                   size_t errlen);

backend *qwen35_backend(const qwen35 *m); /* the backend the model runs on */

/* qwen35_forward, and hidden [T, H] (T = the step's rows, in order): every row's final hidden
 * state after the final norm, the input of the MTP head (qwen35_mtp). */
int qwen35_forward_hidden(qwen35 *m, const fwd_seq *seqs, int n_seqs, float *logits, float *hidden,
                          char *err, size_t errlen);
/* The same with the greedy ids instead of logits (qwen35_forward_greedy). */
int qwen35_forward_greedy_hidden(qwen35 *m, const fwd_seq *seqs, int n_seqs, int32_t *ids,
                                 float *hidden, char *err, size_t errlen);

/* State and page operations, ordered with forward steps. Each returns 0 or -1 on a backend
 * failure. */
int qwen35_slot_zero(qwen35 *m, int slot);
/* dst and src: slots or keep slots (a verify piece's kept state into its sequence's slot). */
int qwen35_slot_copy(qwen35 *m, int dst, int src);
/* Drafts a verify piece may carry: qwen35_mem_opts.keep_k when the backend keeps per-row states
 * (backend set_keep), else 0 (no verify pieces). qwen35_keep_slot: the keep slot holding the
 * state after row r of the verify piece in keep lane `lane` (for qwen35_slot_copy). */
int qwen35_can_verify(const qwen35 *m);
int qwen35_keep_slot(const qwen35 *m, int lane, int r);
/* The keep lanes the model holds (qwen35_mem_opts.keep_lanes; 0 without verify pieces). */
int qwen35_keep_lanes(const qwen35 *m);
int qwen35_page_copy(qwen35 *m, int dst, int src); /* all rows, every full-attention layer */
/* Host-side copies for the host tier: bytes are qwen35_slot_bytes / qwen35_page_bytes. */
int qwen35_slot_read(qwen35 *m, int slot, void *host);
int qwen35_slot_write(qwen35 *m, int slot, const void *host);
int qwen35_page_read(qwen35 *m, int page, void *host);
int qwen35_page_write(qwen35 *m, int page, const void *host);
size_t qwen35_slot_bytes(const qwen35 *m);
size_t qwen35_page_bytes(const qwen35 *m);
size_t qwen35_weight_bytes(const qwen35 *m);
/* Device bytes of the vocabulary matrices within qwen35_weight_bytes: *embed the embedding when
 * the lm-head is a separate matrix (else 0: the one matrix is counted as the lm-head), *lm_head
 * the lm-head. */
void qwen35_vocab_bytes(const qwen35 *m, size_t *embed, size_t *lm_head);

/* Greedy fast path: when every row a step samples is plain greedy (sampler_is_plain_greedy),
 * the backend's optional argmax op picks the tokens where the logits are, so only n_rows int32
 * ids come back to the host instead of n_rows * vocab_size floats (78 MB per step at 128 rows
 * of a 151,936-token vocabulary). qwen35_has_argmax: 1 when the backend has the op.
 * qwen35_forward_greedy: qwen35_forward, but writes ids[n_rows] = the first maximum of each row
 * (the token the sampler's greedy path picks). Returns 0, or -1 with err (backend failure, or
 * no argmax op). */
int qwen35_has_argmax(const qwen35 *m);
/* 1 when the model runs on a device backend (one with device memory: its forward leaves the
 * host's cores free for other work while it runs). */
int qwen35_on_device(const qwen35 *m);
int qwen35_forward_greedy(qwen35 *m, const fwd_seq *seqs, int n_seqs, int32_t *ids, char *err,
                          size_t errlen);
/* The greedy step in two halves, so that the next step can be issued before this one's ids are
 * read: qwen35_greedy_start issues the step (as qwen35_forward_greedy) and queues the read of
 * its ids into ids (qwen35_host_alloc memory), returning at once with a ticket;
 * qwen35_greedy_finish(ticket) waits for those ids only. chained: every piece is one row whose
 * token is the previous greedy step's id of the same row (that step's rows are the same
 * sequences in the same order; seqs[i].tokens is not read) — the token never visits the host
 * before the step. At most two steps in flight. qwen35_can_chain: 1 when the backend can do
 * this (read_start). Return 0, or -1 with err. */
int qwen35_can_chain(const qwen35 *m);
/* Sampled steps on the device: qwen35_forward, but the backend's sample op picks every row's
 * token from its logits with the step's n_words words (sample_rule.h: each row's
 * SAMPLE_RULE_WORDS, sampler_device_row, then the rows' edits, sampler_device_edits; at most
 * QWEN35_SAMPLE_ROW_WORDS per row in all) and only the ids come back: ids[n_rows] are the host
 * sampler's tokens for the same logits and draws (sampler_device_ok rows; a temperature below
 * SAMPLE_RULE_GREEDY_T is the argmax rule). qwen35_has_sample: 1 when the backend has the op.
 * Returns 0, or -1 with err. */
#define QWEN35_SAMPLE_ROW_WORDS (8 + 4 * 4096) /* SAMPLE_RULE_WORDS + EDIT_WORDS x EDITS_MAX */
int qwen35_has_sample(const qwen35 *m);
int qwen35_forward_sample(qwen35 *m, const fwd_seq *seqs, int n_seqs, const int32_t *words,
                          int n_words, int32_t *ids, char *err, size_t errlen);
int qwen35_greedy_start(qwen35 *m, const fwd_seq *seqs, int n_seqs, int chained, int32_t *ids,
                        int *ticket, char *err, size_t errlen);
/* qwen35_greedy_start for a sampled step (as qwen35_forward_sample: the words are copied before
 * it returns); chained: as there, the previous step (greedy or sampled) of the same rows gives
 * the tokens. Its ids are read with qwen35_greedy_finish. Needs qwen35_can_chain and
 * qwen35_has_sample. */
int qwen35_sample_start(qwen35 *m, const fwd_seq *seqs, int n_seqs, int chained,
                        const int32_t *words, int n_words, int32_t *ids, int *ticket, char *err,
                        size_t errlen);
int qwen35_greedy_finish(qwen35 *m, int ticket, char *err, size_t errlen);

/* Host memory for logits rows (page-locked where the backend offers it, else malloc); NULL
 * when out of memory. Free with qwen35_host_free before the model's backend is destroyed. */
void *qwen35_host_alloc(qwen35 *m, size_t bytes);
void qwen35_host_free(qwen35 *m, void *p);

#endif
