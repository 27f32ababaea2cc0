/* kv_share — which decode rows of a step read the same KV pages: the plan for attention over a
 * shared prefix (cascade attention). Rows whose sequences restored one prefix from the prefix
 * cache hold the same page ids at the start of their page tables (the pages are shared by
 * reference), so their keys and values at those positions are the same bytes. A backend may
 * then read those positions once for all of the group's rows (one tensor-core product of every
 * member's queries against the shared keys) and keep only each row's own positions per row,
 * merging the two parts' softmax partials.
 *
 * The plan looks only at one-row pieces (decode rows). Rows are grouped by their first page;
 * within a group the shared length L is a number of positions that every member holds in the
 * same pages and has already computed (L <= each member's position: the row's own token is
 * never shared), chosen to save the most reads ((members - 1) x L); members whose common
 * prefix with the group's first row is shorter than L stay outside. Groups with fewer than two
 * rows or L < min_len are dropped, and of the rest the max_groups that save the most are kept
 * (in the order of their first row). Pure host code, deterministic in the batch. */
#ifndef DS_KV_SHARE_H
#define DS_KV_SHARE_H
#include <stdint.h>

#include "backend/backend.h"

typedef struct kv_share_group {
  int32_t leader;     /* piece whose page table the group's shared positions are read from */
  int32_t member_off; /* first entry of the group in the members array */
  int32_t n_members;  /* rows in the group (>= 2), the leader's included */
  int32_t len;        /* L: positions 0 .. L-1 are shared */
} kv_share_group;

/* The plan for batch b. members [b->n_tokens]: the groups' rows (row indices, ascending within
 * a group); row_len [b->n_tokens]: each row's shared length (0: the row is in no group).
 * scratch [2 * b->n_seqs]. Returns the number of groups (0 .. max_groups, max_groups <=
 * KV_SHARE_MAX_GROUPS). */
#define KV_SHARE_MAX_GROUPS 16 /* the plan keeps its candidates on the stack */
int kv_share_plan(const backend_batch *b, int min_len, int max_groups, kv_share_group *groups,
                  int32_t *members, int32_t *row_len, int64_t *scratch);

#endif
