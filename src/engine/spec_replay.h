/* spec_replay — a drafter of controlled acceptance, for benchmarks and tests: the drafts are
 * the target's own continuation recorded by an earlier run (the same prompt, the same sampling),
 * each draft token replaced by another token with probability pm / 1000.
 *
 *   recorded  [ o0 o1 o2 o3 o4 ... ]          the earlier run's output tokens
 *   at output position 2, k = 3:  drafts o2 o3' o4   (o3' = o3 +- 1: corrupted)
 *
 * The bench's speculative run also takes the recorded token at every position it has one
 * (engine_submit_opts.draft_replay_follow, engine_step.c:
 * where the backend's rows are not batch-invariant, a verify row's rounding could flip a near
 * tie of a random model and every later draft would miss), so an uncorrupted draft is always
 * accepted and a corrupted one always rejected: the acceptance is set by pm alone, as a real
 * drafter's would be by its quality, while the verify steps, the sampling, the rollback and
 * the step times are the real ones. Whether a draft is corrupted is a hash of the
 * request id and the output position: a run is reproducible and does not depend on the batch.
 * Not reachable from the HTTP API: `deltaserve bench --spec-replay P` and tests set it per
 * request (engine_submit_opts.draft_replay). */
#ifndef DS_SPEC_REPLAY_H
#define DS_SPEC_REPLAY_H
#include <stdint.h>

/* Drafts for the request `id` at output position `pos` (its next token's index in its output)
 * from replay[0, n_replay): replay[pos, pos + k) clipped at n_replay, each token corrupted
 * (moved by one id: never the recorded token) with probability pm / 1000 (0..1000), written to
 * out. Returns how many (0 when pos >= n_replay). Never allocates. */
int spec_replay_propose(const int32_t *replay, int n_replay, int64_t id, int pos, int pm, int k,
                        int32_t *out);

#endif
