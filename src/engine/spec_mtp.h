/* spec_mtp — MTP drafts: the checkpoint's MTP head (model/qwen35_mtp.h) run after each target
 * step over the step's sequences at once, as vLLM's MTP proposer does:
 *
 *   target rows p0 .. p0+n-1 (accepted)  ->  MTP rows (h_p, x_{p+1}) at p = p0 .. p0+n-1
 *   draft 1 = argmax(MTP logits of the last row); draft j+1 = argmax of the MTP on
 *   (y_j, draft j) at the next position (y_j: the MTP's own output hidden state)
 *
 * The MTP's K/V rows live in its own pages, indexed by the target's page table (an MTP pool of
 * as many pages: position p of a sequence sits in the same page id). Rows written for drafts are
 * written again with the accepted values by the next call before any row reads them (each call
 * starts at the first position not yet fed, and attention writes a step's rows before reading),
 * so the MTP state is exactly that of feeding the accepted sequence. Greedy drafts; the verify
 * step keeps the output exact whatever they are. */
#ifndef DS_SPEC_MTP_H
#define DS_SPEC_MTP_H
#include <stddef.h>
#include <stdint.h>

#include "model/qwen35_mtp.h"

typedef struct spec_mtp spec_mtp;

/* The drafter over target's model with w's MTP head and n_pages K/V pages. Returns 0, or -1
 * with one line in err (no MTP head in the checkpoint, out of memory). */
int spec_mtp_init(spec_mtp **out, qwen35 *target, const model_weights *w, backend *be, int n_pages,
                  char *err, size_t errlen);
void spec_mtp_free(spec_mtp *sm);

/* One sequence's part of a drafting round (spec_mtp_steps): positions [pos, pos + n) fed,
 * hidden [n, H] the target's final hidden rows there (qwen35_forward_hidden), next[i] the token
 * at pos + i + 1 (the last: the token the target just chose); pages the sequence's MTP page
 * table, covering pos + n + k - 1 positions, its rows past the sequence's own pages in pages no
 * other item of the round uses; k drafts wanted (0: none) into drafts. */
typedef struct spec_mtp_item {
  const int32_t *pages;
  int n_pages, pos, n;
  const int32_t *next;
  const float *hidden;
  int k;
  int32_t *drafts;
} spec_mtp_item;

/* Every item fed in one MTP step, then the drafts in rounds, each one MTP step over the items
 * still drafting: k - 1 steps after the first for the largest k, whatever the item count.
 * Returns 0, or -1 with err (no item gets drafts then). */
int spec_mtp_steps(spec_mtp *sm, spec_mtp_item *it, int n, char *err, size_t errlen);

/* Feeds positions [pos, pos + n) of one sequence: hidden [n, H] the target's final hidden rows
 * there (qwen35_forward_hidden), next[i] the token at pos + i + 1 (the last: the token the
 * target just chose); pages the sequence's page table, covering pos + n + k - 1 positions.
 * Then writes k greedy drafts into drafts (k = 0: none). Returns 0, or -1 with err. */
int spec_mtp_step(spec_mtp *sm, const int32_t *pages, int n_pages, int pos, int n,
                  const int32_t *next, const float *hidden, int k, int32_t *drafts, char *err,
                  size_t errlen);

#endif
