/* engine_mem — the memory plan: how many KV pages and snapshot slabs the engine gets.
 *
 * The pools are n_pages KV pages and max_num_seqs sequence slots + n_slabs
 * snapshot slabs (qwen35_mem_opts.n_slots).
 *
 * With a device figure (the backend's mem_info; the CUDA backend), the budget is
 *     B = min(util x total, free) - weights - max_num_seqs slots - step scratch
 * (util = --gpu-memory-utilization; weights estimated from the checkpoint before upload;
 * scratch = twice the largest step's activations + the logits rows + 512 MiB); with speculative
 * decoding (k drafts) the keep slots, k a lane, come off B first: a lane for each sequence that
 * may verify drafts in one step (max_num_seqs, or disable_by_batch_size when smaller), cut to
 * the lanes that fit in half of B (none fitting: an error); then
 *   - --kv-cache-tokens not given: the slabs take --snapshot-slabs x slab, else
 *     --prefix-cache-gib, else 25% of B capped at max(16, 4 x max_num_seqs) slabs; never more
 *     than half of B; the KV pages take the rest;
 *   - --kv-cache-tokens given: KV as asked; the slabs (--snapshot-slabs, else
 *     --prefix-cache-gib, else the default count below) cut to what fits in B beside it.
 * Tensor parallelism (N ranks, a GPU each): every rank makes this plan for its share of the
 * model against its own device, and the pools take the fewest pages and slabs of any rank.
 * Without a device figure (the CPU backend): KV from --kv-cache-tokens (0: 32768 tokens), the
 * keep lanes uncut, and
 * --snapshot-slabs or the default count max(16, 2 x max_num_seqs) slabs. (--prefix-cache-gib
 * then only caps how many of them the cache holds.) */
#ifndef DS_ENGINE_MEM_H
#define DS_ENGINE_MEM_H
#include <stddef.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/qwen35.h"
#include "model/weights.h"

typedef struct engine_mem_facts {
  size_t total_bytes, free_bytes; /* device memory (total 0: unknown) */
  size_t weight_bytes;            /* the weights on the device (with their packed copies) */
  size_t page_bytes, slot_bytes;  /* one KV page (every attention layer), one state slot */
  size_t scratch_bytes;           /* the step scratch reserve */
  size_t packed_bytes;            /* of weight_bytes the packed copies (0: none will be made) */
} engine_mem_facts;

typedef struct engine_mem_split {
  int n_pages, n_slabs;
  int keep_lanes;              /* speculative decoding's keep lanes (qwen35_mem_opts) */
  size_t budget_bytes;         /* B (0: no device figure) */
  size_t kv_bytes, slab_bytes; /* what the pages and slabs take (0 without a device figure) */
} engine_mem_split;

/* Whether the packed weight copies are made (--packed-weights; opt -1 auto, 0 off, 1 on):
 * on when asked and the backend makes them (packed > 0: the copies' bytes, fp8 of them the bf16
 * copies of FP8 weights), or (auto) when the weights with the copies take at most half of a
 * known device memory total, counting an FP8 weight and its bf16 copy as the bf16 weight alone
 * (an FP8 model keeps its bf16 copies where the bf16 model would have fitted the bound). */
int engine_mem_packed_choice(int opt, double weights, double packed, double fp8, double total);

/* The default snapshot slab count without a memory budget: max(16, 2 x max_num_seqs). */
int engine_mem_default_slabs(int max_num_seqs);
/* The rule above as a pure function of the flags and the facts (f NULL or total 0: no device
 * figure). Returns 0, or -1 with err (flags out of range, or not enough device memory). */
int engine_mem_split_plan(const engine_opts *o, const engine_mem_facts *f, engine_mem_split *sp,
                          char *err, size_t errlen);
/* The facts for a backend and a loaded checkpoint, before the upload: the bytes come from the
 * model (qwen35_plan, which asks the backend how it stores each weight). Returns 0, or -1 when
 * the backend has no memory figure (f then says total 0). */
int engine_mem_facts_get(backend *be, const model_config *c, const model_weights *w,
                         const engine_opts *o, int n_ranks, engine_mem_facts *f);
/* The pool sizes for qwen35_init without a device figure (see above). The model given to
 * engine_create must have been initialised with exactly these sizes for the same opts.
 * Returns 0, or -1 with err (a value out of range). */
int engine_mem_plan(const engine_opts *o, const model_config *c, qwen35_mem_opts *mo, char *err,
                    size_t errlen);
/* Tensor parallelism: the ranks' pools have the same page and slot ids, so the ranks' plans
 * sp[0..n-1] (each its share against its device) give one: the pages of the rank with the
 * fewest (returned), the fewest slabs of any rank. */
int engine_mem_plan_ranks(engine_mem_split *const *sp, int n, engine_mem_split *out);

#define ENGINE_MEM_MAX_RANKS 64

/* The pool sizes from the device's memory (engine_mem_facts_get + engine_mem_split_plan for
 * each of the n ranks, on a device each, then engine_mem_plan_ranks; no figure:
 * engine_mem_plan), logged at start-up. Writes the result back into o (kv_cache_tokens,
 * n_snapshot_slabs; prefix caching off when no slab fits) so that engine_create(model, o)
 * agrees with it. Returns 0, or -1 with err. */
int engine_mem_plan_device(engine_opts *o, const model_config *c, const model_weights *w,
                           backend *const *ranks, int n, qwen35_mem_opts *mo, char *err,
                           size_t errlen);

#endif
