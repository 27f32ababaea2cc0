/* qwen35_mtp — the checkpoint's multi-token-prediction head (mtp.*, weights.h mtp_weights) as a
 * forward pass over the backend op table, with its own K/V pages. vLLM's Qwen3-Next / Qwen3.5
 * MTP definition: for a row at position p with the target's final (normed) hidden state h_p and
 * the next token t = x_{p+1},
 *
 *   x = fc_e . Norm_e(embed[t]) + fc_h . Norm_h(h_p)      (fc [H, 2H] over concat(e, h), split)
 *   x = decoder layer (full attention at position p over the MTP's own K/V, then MLP or MoE)
 *   y = Norm(x)            the draft's hidden state: the next draft's h (recursive drafts)
 *   logits = lm_head . y   (the target's embedding and lm-head, shared)
 *
 * Positions follow vLLM: the MTP row pairing h_p with x_{p+1} runs at position p, so the MTP's
 * K/V row p belongs to that pair, and draft j of a step runs at p + j. */
#ifndef DS_QWEN35_MTP_H
#define DS_QWEN35_MTP_H
#include <stddef.h>

#include "backend/backend.h"
#include "model/qwen35.h"

typedef struct qwen35_mtp qwen35_mtp;

/* Uploads w->mtp (which must have n_layers >= 1) to target's backend and allocates n_pages
 * K/V pages of QWEN35_PAGE_TOKENS tokens for its attention; embedding and lm-head are target's.
 * Returns 0, or -1 with one line in err (no MTP weights, out of device memory). */
int qwen35_mtp_init(qwen35_mtp **out, qwen35 *target, const model_weights *w, backend *be,
                    int n_pages, char *err, size_t errlen);
void qwen35_mtp_free(qwen35_mtp *m);

/* One MTP step over n_seqs pieces (fwd_seq: tokens are the next tokens t, pos the position of
 * the first row, pages the MTP's own page table covering [0, pos + n_tokens); slot and logits
 * are not read). hidden [T, H] host f32: row r's h (T = the pieces' rows, in order). Runs layer
 * `step % n_layers` (vLLM's spec_step_idx). Writes logits [T, V] and, when not NULL,
 * hidden_out [T, H] (y above). Returns 0, or -1 with err. */
int qwen35_mtp_forward(qwen35_mtp *m, const fwd_seq *seqs, int n_seqs, int step,
                       const float *hidden, float *logits, float *hidden_out, char *err,
                       size_t errlen);

/* The same step for drafting: only each piece's last row goes through the lm-head; ids [n_seqs]
 * its greedy token (the sampler's first maximum; on the device where the backend has argmax, so
 * only the ids cross) and, when not NULL, hidden_out [n_seqs, H] its y. */
int qwen35_mtp_draft(qwen35_mtp *m, const fwd_seq *seqs, int n_seqs, int step, const float *hidden,
                     int32_t *ids, float *hidden_out, char *err, size_t errlen);

#endif
