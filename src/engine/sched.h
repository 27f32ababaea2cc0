/* sched — the scheduling policy: which requests run this step, with how many tokens, and
 * who is admitted, preempted or failed. It decides; kv_pages and state_pool carry out.
 *
 * One step (sched_schedule), token budget B = --max-num-batched-tokens:
 *   1. decode rows: every running request past its prompt feeds 1 token (oldest first);
 *   2. prefill pieces of running requests still in their prompt (oldest first);
 *   3. admission from the waiting queue, FCFS: a state slot, the pages of the first piece, a
 *      page watermark (waived when nothing runs); the head waits rather than being skipped.
 * When pages run out for a running request, the youngest running request not yet scheduled
 * this step is preempted by recompute (pages and slot freed, back to the front of the
 * waiting queue); it may be the request itself. No admission in a step that preempted.
 *
 * Prefill split rule (what keeps outputs bit-identical whatever the batch): with unit
 * u = 64, or for B < 64 the largest power of two <= B, a prompt is cut into segments ending
 * at multiples of u, at forced points (per request) and at the prompt end:
 *
 *     prompt  |-------- 64 --------|---- 36 ----|  forced point at 100, length 130
 *             0                   64          100          128  130
 *     pieces  [0,64) [64,100) [100,128) [128,130)   or merged runs of them
 *
 * A piece is one or more whole consecutive segments. Merging is allowed only for u = 64 (the
 * forward pass chunks at absolute multiples of 64 anyway), never across a forced point (the
 * chunked recurrence splits there, and a capture needs the piece to end there) and never with
 * a 1-token segment (a 1-token piece runs the recurrent step, a 1-token chunk of a longer
 * piece does not). So every piece boundary is a function of the request's split points
 * alone. A segment that does not fit in the budget left waits for the next step; a whole
 * segment always fits in a fresh budget.
 *
 * With a prefix cache (sched_set_prefix_cache), admission of a waiting request r:
 *   1. if r waits for an in-flight capture (wait_ticket) still pending: skip r this step
 *      (others may be admitted; shared-prefix coalescing);
 *   2. lookup over r's tokens (deepest checkpoint d0). First admission only: if a running
 *      request R shares a prefix with r deeper than d0 + 64 and deeper than any capture in
 *      flight on r's path, and R has not computed (nor planned this step) that far, r DEMANDS
 *      a capture from R at D = min(common prefix, n_prompt - 1 of both): a ticket on R's
 *      path, D added to R's split points (request_add_point), and r waits for it. Else, a
 *      capture in flight on r's path deeper than d0: r waits for it;
 *   3. split points (first admission only): boundaries, capture points but the interval
 *      ones, the restored depth;
 *   4. pages for the first piece (evicting cached pages when short), a state slot, the
 *      restore (a failure admits cold: the table is empty again, the slot is taken anew);
 *   5. a capture ticket for each capture point deeper than the restored depth.
 * Once admission stops in a step (budget, slots, a blocked head), the next max_num_seqs
 * waiting requests still go through step 2 (look-ahead): a wave of requests sharing a prefix
 * that one of them computes alone asks it for the divergence point before it plans past it.
 *
 *   8 x (1,250 shared + 50), budget 512:  r0 [0,512) [512,1024) [1024,1250)  (r1..r7 demand
 *   1,250 from r0 in step 1 and wait);  r0..r7 [1250,1299), r1..r7 restored at 1,250;
 *   r0..r7 [1299,1300) and the first tokens: 5 steps, 1,650 tokens prefilled.
 *
 * After each step a request whose n_computed reached a ticket's depth captures and commits
 * it. Interval checkpoints are not split points (they would cut a long prefill into
 * interval-sized steps): after a prefill piece that ended at a multiple of the unit (where a
 * split changes no bit) at or past a multiple of --snapshot-interval, a LOW-class checkpoint
 * is taken there. A finished generation (stop or length) captures at its computed depth
 * (LOW class) so that the next turn of a chat hits. Every way out (retirement, cancellation,
 * failure, preemption) cancels the request's tickets (requests waiting for one look again).
 * A re-admission after preemption keeps its split points and restores only from a depth that
 * was already a split point or a multiple of the unit (bit-identical continuation). */
#ifndef DS_SCHED_H
#define DS_SCHED_H
#include "cache/kv_pages.h"
#include "cache/prefix_cache.h"
#include "cache/state_pool.h"
#include "engine/request.h"
#include "engine/spec_config.h"

typedef struct sched_opts {
  int max_num_seqs;
  int max_num_batched_tokens;
  int watermark_pages; /* free pages kept back at admission (-1: 1% of the pool) */
} sched_opts;

typedef struct sched sched;

/* The outcome of one sched_schedule; arrays sized max_num_seqs, owned by the sched. */
typedef struct sched_batch {
  request **reqs; /* scheduled this step, in batch order (decodes, then prefills) */
  int n;
  int n_tokens;
  request **failed; /* failed this step (an allocation fault): removed, resources freed,
                       finish = FINISH_ERROR with err set; the caller ends their streams */
  int n_failed;
  int n_preempted;
} sched_batch;

/* Creates the scheduler over the pools (borrowed). Returns 0 or -1 (out of memory). */
int sched_init(sched **out, const sched_opts *o, kv_pages *kp, state_pool *sp);
void sched_free(sched *s);
/* Attaches the prefix cache (borrowed; NULL detaches) and its capture interval
 * (--snapshot-interval). Requests then need request_init_prefix. */
void sched_set_prefix_cache(sched *s, prefix_cache *pc, int snapshot_interval);

/* Speculative decoding (spec NULL or method NONE: off): in step 1 a decode row at its sampling
 * point gets up to spec->k drafts (n-gram: spec_ngram; MTP: the request's mtp_draft, made by
 * the engine after the step that led there) as a verify piece of 1 + drafts rows
 * (request.sched_draft), the drafts cut to the budget the later decode rows leave (a draft never
 * displaces a decode row), to the free pages, to max_tokens - output - 1 and to
 * max_model_len; sched_postprocess advances n_computed by the rows the engine kept
 * (sched_tokens, set by the engine after verifying) and gives back the pages past them. At most
 * `lanes` decode rows draft in one step (the model's keep lanes), each verify piece with a lane
 * of its own (request.sched_lane). */
void sched_set_spec(sched *s, const spec_config *spec, int max_model_len, int lanes);
/* Whether the next steps draft at all (the engine's per-step choice, spec_policy; on after
 * sched_set_spec). */
void sched_set_spec_on(sched *s, int on);
/* The engine's measured prefill rate (tokens per second, 0: none yet). A request whose deepest
 * checkpoint lives only on disk is admitted cold when reading the file at the disk tier's
 * measured rate would take longer than prefilling its positions at this rate (counted in
 * sched_num_disk_declined). */
void sched_set_prefill_rate(sched *s, double tokens_per_s);
long long sched_num_disk_declined(const sched *s);
/* The rule: reading `bytes` at read_rate takes longer than prefilling `depth` positions at
 * prefill_tps (an unmeasured rate, 0, never declines: the read measures it). */
int sched_read_slower(double bytes, double read_rate, int depth, double prefill_tps);

/* The split unit u for a budget. */
int sched_unit(int max_num_batched_tokens);
/* End of the segment that starts at position c (< n_prompt) of r. */
int sched_segment_end(const request *r, int c, int u);
/* Tokens of the next prefill piece of r from r->n_computed within `budget` (0: wait). */
int sched_piece(const request *r, int u, int budget);

/* Queues a new request at the tail of the waiting queue. */
void sched_add(sched *s, request *r);
/* Removes r (waiting or running) and frees its pages and slot; state becomes FINISHED. */
void sched_remove(sched *s, request *r);

/* Plans one step (see the top of this file) and reserves its pages and slots. */
void sched_schedule(sched *s, sched_batch *b);
/* After the step ran: advances each scheduled request's n_computed; with a prefix cache,
 * captures and commits the tickets a request just reached (a failure aborts the ticket and
 * never fails the request) and, for a generation that finished (stop or length), captures a
 * checkpoint at its computed depth; then removes the requests whose finish was set
 * (sched_remove, which cancels their remaining tickets). */
void sched_postprocess(sched *s, sched_batch *b);
/* Steps ahead (engine.c): the next decode step of the requests of a decode step still in
 * flight is issued before that step's results are read. sched_extend gives each of
 * reqs[0, n) (n_computed not yet advanced past the step in flight) the pages for one position
 * more, evicting only pages the prefix cache alone holds (never preempting): 0 when all have
 * them, -1 when pages are short (those grown stay: the next step needs them anyway).
 * sched_again, after sched_postprocess of the step in flight, makes b that next step: the
 * same requests in the same order, one token each, sampled. */
int sched_extend(sched *s, request **reqs, int n);
void sched_again(sched *s, sched_batch *b, request **reqs, int n);
/* The step failed as a whole: each scheduled request is removed with FINISH_ERROR. */
void sched_fail_batch(sched *s, sched_batch *b, const char *why);

int sched_num_running(const sched *s);
int sched_num_waiting(const sched *s);
long long sched_num_preemptions(const sched *s);
request *sched_first_waiting(sched *s);
request *sched_first_running(sched *s);

#endif
