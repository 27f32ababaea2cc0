/* engine_mem — the memory plan (engine_mem.h): the rule as a pure function of the flags and
 * a few byte counts, and those counts taken from the model (qwen35_plan) and the backend. */
#include "engine/engine_mem.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "cache/kv_pages.h"

/* the KV cache without a device figure or --kv-cache-tokens: a few long requests' worth, small
 * next to a host's memory */
#define ENGINE_MEM_DEFAULT_KV_TOKENS 32768
#define ENGINE_MEM_MIB ((size_t)1 << 20)

/* auto keeps the copies only while weights and copies take at most half the device, so that
 * they never crowd the KV cache of a large model */
int engine_mem_packed_choice(int opt, double weights, double packed, double fp8, double total) {
  if (packed <= 0 || opt == 0) return 0;
  return opt == 1 || (total > 0 && weights + (packed - fp8) + fp8 / 2 <= 0.5 * total);
}

int engine_mem_default_slabs(int max_num_seqs) {
  return 2 * max_num_seqs > 16 ? 2 * max_num_seqs : 16;
}

static int engine_mem_n_slabs(const engine_opts *o) {
  if (!o->enable_prefix_caching) return 0;
  return o->n_snapshot_slabs > 0 ? o->n_snapshot_slabs : engine_mem_default_slabs(o->max_num_seqs);
}

/* Speculative decoding's drafted tokens a step verifies per sequence (0: none). */
static int engine_mem_spec_k(const engine_opts *o) {
  return o->spec.method != SPEC_METHOD_NONE ? o->spec.k : 0;
}

/* Keep lanes before the device is counted: one per sequence that may verify drafts in a step,
 * i.e. every sequence, or disable_by_batch_size's count when it is smaller (no step above it
 * drafts). */
static int engine_mem_spec_lanes(const engine_opts *o) {
  if (!engine_mem_spec_k(o)) return 0;
  int n = o->max_num_seqs, d = o->spec.disable_by_batch_size;
  return d > 0 && d < n ? d : n;
}

int engine_mem_split_plan(const engine_opts *o, const engine_mem_facts *f, engine_mem_split *sp,
                          char *err, size_t errlen) {
  memset(sp, 0, sizeof *sp);
  if (o->max_num_seqs < 1 || o->max_num_batched_tokens < 1)
    return errf(err, errlen, "--max-num-seqs and --max-num-batched-tokens must be >= 1");
  int fixed_kv = o->kv_cache_tokens > 0;
  int tokens = fixed_kv ? o->kv_cache_tokens : ENGINE_MEM_DEFAULT_KV_TOKENS;
  sp->n_pages = kv_pages_for_tokens(tokens);
  sp->n_slabs = engine_mem_n_slabs(o);
  if (!f || f->total_bytes == 0 || f->page_bytes == 0) return 0; /* no device figure */
  /* the budget: what --gpu-memory-utilization allows, and never more than is free */
  double util = floor((double)o->gpu_memory_utilization * 1e6 + 0.5) / 1e6; /* 0.9f -> 0.9 */
  double want = util * (double)f->total_bytes;
  double fixed = (double)f->weight_bytes + (double)o->max_num_seqs * (double)f->slot_bytes +
                 (double)f->scratch_bytes;
  double b = want - fixed;
  if (f->free_bytes > 0 && (double)f->free_bytes - fixed < b) b = (double)f->free_bytes - fixed;
  if (b < (double)f->page_bytes)
    return errf(err, errlen,
                "not enough device memory: %.0f MiB x %.2f utilisation leaves nothing for the KV "
                "cache after the weights (%.0f MiB), %d state slots and the step scratch "
                "(%.0f MiB)",
                (double)f->total_bytes / ENGINE_MEM_MIB, o->gpu_memory_utilization,
                (double)f->weight_bytes / ENGINE_MEM_MIB, o->max_num_seqs,
                (double)f->scratch_bytes / ENGINE_MEM_MIB);
  /* speculative decoding's keep slots (k a lane) take at most half of the rest, as the slabs:
   * fewer lanes only bound how many sequences verify drafts in one step */
  int k = engine_mem_spec_k(o);
  double lane = (double)k * (double)f->slot_bytes;
  sp->keep_lanes = engine_mem_spec_lanes(o);
  if (k && lane > 0 && sp->keep_lanes * lane > 0.5 * b) sp->keep_lanes = (int)(0.5 * b / lane);
  if (k && sp->keep_lanes < 1)
    return errf(err, errlen,
                "not enough device memory for speculative decoding: %d keep slots (%.0f MiB) "
                "would take more than half of the %.0f MiB left for the KV cache",
                k, lane / ENGINE_MEM_MIB, b / ENGINE_MEM_MIB);
  b -= sp->keep_lanes * lane;
  sp->budget_bytes = (size_t)b;
  double slab = (double)(f->slot_bytes ? f->slot_bytes : 1);
  int cap = 4 * o->max_num_seqs > 16 ? 4 * o->max_num_seqs : 16;
  if (fixed_kv) { /* KV as asked; the slabs (as asked or the default) where they fit */
    double left = b - (double)sp->n_pages * (double)f->page_bytes;
    if (o->enable_prefix_caching && o->n_snapshot_slabs == 0 && o->prefix_cache_gib > 0)
      sp->n_slabs = (int)(o->prefix_cache_gib * 1073741824.0 / slab);
    if (sp->n_slabs > 0 && left < (double)sp->n_slabs * slab)
      sp->n_slabs = left > 0 ? (int)(left / slab) : 0;
  } else if (o->enable_prefix_caching) {
    double sb;
    if (o->n_snapshot_slabs > 0)
      sb = (double)o->n_snapshot_slabs * slab;
    else if (o->prefix_cache_gib > 0)
      sb = o->prefix_cache_gib * 1073741824.0;
    else
      sb = 0.25 * b;
    if (sb > 0.5 * b) sb = 0.5 * b; /* the KV cache keeps at least half */
    int n = (int)(sb / slab);
    if (o->n_snapshot_slabs == 0 && o->prefix_cache_gib <= 0 && n > cap) n = cap;
    sp->n_slabs = n;
  }
  if (!fixed_kv) {
    double kv = b - (double)sp->n_slabs * slab;
    double pages = kv / (double)f->page_bytes;
    sp->n_pages = pages > 1e9 ? 1000000000 : (int)pages;
    if (sp->n_pages < kv_pages_for_tokens(o->max_num_batched_tokens) && sp->n_pages < 64)
      return errf(err, errlen, "not enough device memory for the KV cache (%d pages)", sp->n_pages);
  }
  sp->kv_bytes = (size_t)sp->n_pages * f->page_bytes;
  sp->slab_bytes = (size_t)sp->n_slabs * f->slot_bytes;
  return 0;
}

int engine_mem_plan(const engine_opts *o, const model_config *c, qwen35_mem_opts *mo, char *err,
                    size_t errlen) {
  (void)c;
  engine_mem_split sp;
  if (engine_mem_split_plan(o, NULL, &sp, err, errlen) != 0) return -1;
  mo->n_pages = sp.n_pages;
  mo->n_slots = o->max_num_seqs + sp.n_slabs;
  mo->packed = o->packed_weights == 1; /* no device figure: only when asked */
  mo->keep_k = engine_mem_spec_k(o);
  mo->keep_lanes = engine_mem_spec_lanes(o);
  return 0;
}

int engine_mem_facts_get(backend *be, const model_config *c, const model_weights *w,
                         const engine_opts *o, int n_ranks, engine_mem_facts *f) {
  memset(f, 0, sizeof *f);
  if (!be->mem_info || be->mem_info(be, &f->free_bytes, &f->total_bytes) != 0) {
    f->free_bytes = f->total_bytes = 0;
    return -1;
  }
  qwen35_plan_bytes pb;
  qwen35_plan_ranks(c, w, be, n_ranks, &pb);
  double fp8 = 0, packed = be->weight_pack ? qwen35_packed_bytes(c, w, &fp8) / n_ranks : 0;
  fp8 /= n_ranks;
  if (engine_mem_packed_choice(o->packed_weights, (double)pb.weights, packed, fp8,
                               (double)f->total_bytes))
    f->packed_bytes = (size_t)packed;
  f->weight_bytes = pb.weights + f->packed_bytes;
  f->page_bytes = pb.page;
  f->slot_bytes = pb.slot;
  /* the largest step's activations, doubled for the backend's own workspaces, the logits rows
   * (tensor-parallel rank 0: its columns and the gathered ones too), and a fixed reserve for
   * libraries and fragmentation */
  f->scratch_bytes = 2 * pb.token * (size_t)o->max_num_batched_tokens +
                     (size_t)o->max_num_seqs * (size_t)c->vocab_size * 4 * (n_ranks > 1 ? 3 : 1) +
                     512 * ENGINE_MEM_MIB;
  return 0;
}

int engine_mem_plan_ranks(engine_mem_split *const *sp, int n, engine_mem_split *out) {
  int k = 0;
  for (int r = 1; r < n; r++)
    if (sp[r]->n_pages < sp[k]->n_pages) k = r;
  *out = *sp[k];
  for (int r = 0; r < n; r++) {
    if (sp[r]->n_slabs < out->n_slabs) out->n_slabs = sp[r]->n_slabs;
    if (sp[r]->keep_lanes < out->keep_lanes) out->keep_lanes = sp[r]->keep_lanes;
  }
  return k;
}

int engine_mem_plan_device(engine_opts *o, const model_config *c, const model_weights *w,
                           backend *const *ranks, int n, qwen35_mem_opts *mo, char *err,
                           size_t errlen) {
  if (n < 1 || n > ENGINE_MEM_MAX_RANKS)
    return errf(err, errlen, "%d ranks: 1 to %d", n, ENGINE_MEM_MAX_RANKS);
  engine_mem_facts fs[ENGINE_MEM_MAX_RANKS];
  engine_mem_split sps[ENGINE_MEM_MAX_RANKS], *spp[ENGINE_MEM_MAX_RANKS], sp;
  for (int r = 0; r < n; r++) {
    /* every rank on a device of its own, each rank's share against its device */
    if (engine_mem_facts_get(ranks[r], c, w, o, n, &fs[r]) != 0)
      return engine_mem_plan(o, c, mo, err, errlen);
    if (engine_mem_split_plan(o, &fs[r], &sps[r], err, errlen) != 0) return -1;
    spp[r] = &sps[r];
  }
  int k = engine_mem_plan_ranks(spp, n, &sp); /* the rank with the least room */
  const engine_mem_facts f = fs[k];
  double mib = (double)ENGINE_MEM_MIB;
  char rk[40] = "";
  if (n > 1) snprintf(rk, sizeof rk, " (rank %d of %d, the least room)", k, n);
  log_info(
      "engine: memory plan%s: %.0f MiB total, %.0f MiB free, utilisation %.2f; weights "
      "~%.0f MiB (packed copies %.0f MiB), %d state slots %.0f MiB, step scratch %.0f MiB "
      "-> budget %.0f MiB = KV %d pages (%d tokens) %.0f MiB + %d snapshot slabs %.0f MiB",
      rk, f.total_bytes / mib, f.free_bytes / mib, o->gpu_memory_utilization, f.weight_bytes / mib,
      f.packed_bytes / mib, o->max_num_seqs, o->max_num_seqs * (f.slot_bytes / mib),
      f.scratch_bytes / mib, sp.budget_bytes / mib, sp.n_pages, sp.n_pages * KV_PAGES_TOKENS,
      sp.kv_bytes / mib, sp.n_slabs, sp.slab_bytes / mib);
  /* resolved into the flags, so that engine_create (engine_mem_plan) agrees */
  o->kv_cache_tokens = sp.n_pages * KV_PAGES_TOKENS;
  if (o->enable_prefix_caching && sp.n_slabs == 0) {
    log_warn("engine: no device memory left for snapshot slabs: prefix caching off");
    o->enable_prefix_caching = 0;
  }
  if (o->enable_prefix_caching) o->n_snapshot_slabs = sp.n_slabs;
  mo->n_pages = sp.n_pages;
  mo->n_slots = o->max_num_seqs + (o->enable_prefix_caching ? sp.n_slabs : 0);
  mo->packed = fs[0].packed_bytes > 0;
  mo->keep_k = engine_mem_spec_k(o);
  mo->keep_lanes = sp.keep_lanes;
  return 0;
}
