/* engine — the step loop and the threads' meeting points.
 *
 *   client threads                         engine thread
 *   engine_submit --> incoming queue ----> sched_add
 *                     (e->mu, e->cv)        loop: cancels -> sched_schedule -> batch build
 *                                                 -> qwen35_forward -> sample -> postprocess
 *   engine_next  <--- per-request channel <-- token / final events
 *                     (h->mu, h->cv; a ring of max_tokens + 1 events, never grows; a step's
 *                      wake-ups are run by the notifier thread, notifier.h)
 *   engine_cancel --> atomic flag, seen at the next step
 *
 * The engine thread alone touches the scheduler, pages, slots and the requests' token
 * arrays. A handle is owned jointly by the client (until engine_release) and the engine
 * (until the final event); whoever lets go last frees it. Nothing allocates inside a step:
 * the fwd_seq array and the logits buffer are sized at creation for max_num_seqs rows.
 *
 * Greedy steps: when every row a step samples is plain greedy (no penalties, no logprobs, no
 * logits callback, no JSON mask) and the backend has an argmax op, the tokens are picked on the
 * device and only the ids come back (qwen35_forward_greedy); the same tokens as sampling the
 * downloaded rows. Sampled steps: when every sampled row is sampler_device_ok (no
 * repetition_penalty, logprobs, JSON mask or callback; frequency / presence penalties,
 * logit_bias and the min_tokens ban travel as the row's edits), the engine draws each row's
 * random bits as its sampler would and the backend's sample op picks the tokens by
 * sample_rule.h (engine_device_words, qwen35_forward_sample): the host sampler's
 * tokens, n ids downloaded (on device backends; DS_ENGINE_DEVICE_SAMPLE=1 on any backend with
 * the op, =0 never). Other steps download the rows into page-locked memory (qwen35_host_alloc).
 * DS_ENGINE_HOST_SAMPLE=1 turns both device paths off (for before/after timings);
 * DS_ENGINE_PROFILE=1 logs where the engine thread's time went, per step, at destroy.
 *
 * Host sampling: the rows of a step are sampled in parallel by a small pool of sampler
 * threads made at creation (DS_SAMPLER_THREADS=N; default min(8, online CPUs - 1); 0 samples
 * inline on the engine thread) plus the engine thread itself. Each row's work touches only
 * its request's sampler (parameters, RNG) and the scratch of the thread that takes it, and
 * sampler_sample's result does not depend on the scratch used, so the tokens are the same
 * for any thread count. The logits callbacks run on the engine thread first, in row order;
 * the tokens are then pushed in row order, as before. A request with response_format
 * json_object or json_schema has its row masked (json_mask_apply) by the thread that samples it,
 * and its recognizer advanced by the engine thread when the token is pushed. On a device
 * backend the sampler threads prepare those masks (json_mask_prepare: the allowed set depends
 * only on the tokens so far) while the engine thread waits for the forward, so that applying
 * one after it costs a copy (DS_ENGINE_MASK_OVERLAP=0: computed when sampling, for timings; =1:
 * prepared on a CPU backend too, whose forward then shares the cores).
 *
 * Prefix cache (when enabled): created over the same page pool and state pool (the snapshot
 * slabs are the slots past max_num_seqs), its copies wired to qwen35's page and slot
 * operations; the scheduler carries out the lookups, restores and captures (sched.h), the
 * engine reports cached_tokens on the final event and the cache's counters in engine_stats. */
#include "engine/engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/fault.h"
#include "base/log.h"
#include "cache/kv_pages.h"
#include "cache/prefix_cache.h"
#include "cache/state_pool.h"
#include "engine/request.h"
#include "engine/notifier.h"
#include "engine/sched.h"
#include "sampler/sample_rule.h"

/* ---- options -------------------------------------------------------------------------------- */

void engine_opts_default(engine_opts *o) {
  memset(o, 0, sizeof *o);
  o->max_num_seqs = 64;
  o->max_num_batched_tokens = 8192;
  o->gpu_memory_utilization = 0.9f;
  o->enable_prefix_caching = 1;
  o->snapshot_interval = 2048;
  o->packed_weights = -1; /* auto (bench/NOTES.md, thirty-third session) */
}

static int engine_parse_int(const char *v, const char *flag, int lo, int *out, char *err,
                            size_t errlen) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > 1000000000)
    return errf(err, errlen, "%s: expected an integer >= %d, got '%s'", flag, lo, v);
  *out = (int)x;
  return 0;
}

static int engine_parse_double(const char *v, const char *flag, double lo, double hi, double *out,
                               char *err, size_t errlen) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x >= lo && x <= hi))
    return errf(err, errlen, "%s: expected a number in [%g, %g], got '%s'", flag, lo, hi, v);
  *out = x;
  return 0;
}

int engine_opts_parse_flag(engine_opts *o, int argc, char **argv, int *i, char *err,
                           size_t errlen) {
  const char *a = argv[*i];
  if (strncmp(a, "--", 2) != 0) return 0;
  char name[64];
  const char *eq = strchr(a, '=');
  size_t len = eq ? (size_t)(eq - a) : strlen(a);
  if (len >= sizeof name) return 0;
  memcpy(name, a, len);
  name[len] = 0;
  if (!strcmp(name, "--enable-prefix-caching") || !strcmp(name, "--no-enable-prefix-caching")) {
    if (eq) return errf(err, errlen, "%s takes no value", name);
    o->enable_prefix_caching = name[2] != 'n';
    return 1;
  }
  if (!strcmp(name, "--packed-weights")) {
    const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    if (!v) return errf(err, errlen, "%s needs a value (auto, on or off)", name);
    if (!strcmp(v, "auto"))
      o->packed_weights = -1;
    else if (!strcmp(v, "on"))
      o->packed_weights = 1;
    else if (!strcmp(v, "off"))
      o->packed_weights = 0;
    else
      return errf(err, errlen, "%s: expected auto, on or off, got '%s'", name, v);
    return 1;
  }
  static const char *const known[] = {"--max-num-seqs",           "--max-num-batched-tokens",
                                      "--max-model-len",          "--kv-cache-tokens",
                                      "--gpu-memory-utilization", "--max-waiting",
                                      "--snapshot-interval",      "--snapshot-slabs",
                                      "--prefix-cache-gib",       "--host-cache-gib"};
  int k = -1;
  for (int j = 0; j < (int)(sizeof known / sizeof *known); j++)
    if (!strcmp(name, known[j])) k = j;
  if (k < 0) return 0;
  const char *v;
  if (eq) {
    v = eq + 1;
  } else {
    if (*i + 1 >= argc) return errf(err, errlen, "%s needs a value", name);
    v = argv[++*i];
  }
  double d;
  int rc = 0;
  switch (k) {
    case 0:
      rc = engine_parse_int(v, name, 1, &o->max_num_seqs, err, errlen);
      break;
    case 1:
      rc = engine_parse_int(v, name, 1, &o->max_num_batched_tokens, err, errlen);
      break;
    case 2:
      rc = engine_parse_int(v, name, 1, &o->max_model_len, err, errlen);
      break;
    case 3:
      rc = engine_parse_int(v, name, 16, &o->kv_cache_tokens, err, errlen);
      break;
    case 4:
      rc = engine_parse_double(v, name, 0.01, 1.0, &d, err, errlen);
      o->gpu_memory_utilization = (float)d;
      break;
    case 5:
      rc = engine_parse_int(v, name, 1, &o->max_waiting, err, errlen);
      break;
    case 6:
      rc = engine_parse_int(v, name, 1, &o->snapshot_interval, err, errlen);
      break;
    case 7:
      rc = engine_parse_int(v, name, 0, &o->n_snapshot_slabs, err, errlen);
      break;
    case 8:
      rc = engine_parse_double(v, name, 0, 1e6, &o->prefix_cache_gib, err, errlen);
      break;
    case 9:
      rc = engine_parse_double(v, name, 0, 1e6, &o->host_cache_gib, err, errlen);
      break;
  }
  return rc < 0 ? -1 : 1;
}

#define ENGINE_DEFAULT_KV_TOKENS 32768
#define ENGINE_MIB ((size_t)1 << 20)

int engine_packed_choice(int opt, double weights, double packed, double total) {
  if (packed <= 0 || opt == 0) return 0;
  return opt == 1 || (total > 0 && weights + packed <= 0.5 * total);
}

int engine_default_slabs(int max_num_seqs) { return 2 * max_num_seqs > 16 ? 2 * max_num_seqs : 16; }

static int engine_n_slabs(const engine_opts *o) {
  if (!o->enable_prefix_caching) return 0;
  return o->n_snapshot_slabs > 0 ? o->n_snapshot_slabs : engine_default_slabs(o->max_num_seqs);
}

int engine_mem_split_plan(const engine_opts *o, const engine_mem_facts *f, engine_mem_split *sp,
                          char *err, size_t errlen) {
  memset(sp, 0, sizeof *sp);
  if (o->max_num_seqs < 1 || o->max_num_batched_tokens < 1)
    return errf(err, errlen, "--max-num-seqs and --max-num-batched-tokens must be >= 1");
  int fixed_kv = o->kv_cache_tokens > 0;
  int tokens = fixed_kv ? o->kv_cache_tokens : ENGINE_DEFAULT_KV_TOKENS;
  sp->n_pages = kv_pages_for_tokens(tokens);
  sp->n_slabs = engine_n_slabs(o);
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
                (double)f->total_bytes / ENGINE_MIB, o->gpu_memory_utilization,
                (double)f->weight_bytes / ENGINE_MIB, o->max_num_seqs,
                (double)f->scratch_bytes / ENGINE_MIB);
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
  return 0;
}

/* Device bytes of one uploaded weight [rows, cols], as the backends store them: the
 * activation type, plus an f32 copy where that type is narrower for 1-D weights, weights of
 * <= 16 columns and weights uploaded as exact (MoE routers) — the CUDA backend's rule. An
 * estimate made before the upload. */
static double engine_tensor_bytes_as(const tensor *t, size_t act, int exact) {
  if (!t->data) return 0;
  double n = (double)tensor_numel(t);
  int64_t rows = t->ndim > 1 ? t->shape[0] : 1;
  int64_t cols = rows > 0 ? tensor_numel(t) / rows : 0;
  int small = rows == 1 || cols <= 16 || exact;
  return n * (double)act + (act < 4 && small ? n * 4.0 : 0);
}

static double engine_tensor_bytes(const tensor *t, size_t act) {
  return engine_tensor_bytes_as(t, act, 0);
}

int engine_mem_facts_get(backend *be, const model_config *c, const model_weights *w,
                         const engine_opts *o, engine_mem_facts *f) {
  memset(f, 0, sizeof *f);
  if (!be->mem_info || be->mem_info(be, &f->free_bytes, &f->total_bytes) != 0) {
    f->free_bytes = f->total_bytes = 0;
    return -1;
  }
  size_t act = be->kind_size(be, BACKEND_KIND_ACT), kv = be->kind_size(be, BACKEND_KIND_KV);
  double wb = engine_tensor_bytes(&w->embed, act) + engine_tensor_bytes(&w->final_norm, act);
  if (!c->tie_word_embeddings && w->lm_head.data && w->lm_head.data != w->embed.data)
    wb += engine_tensor_bytes(&w->lm_head, act);
  for (int i = 0; i < c->n_layers; i++) {
    const layer_weights *L = &w->layers[i];
    const tensor *ts[] = {&L->input_norm,  &L->post_norm, &L->q_proj,      &L->k_proj,
                          &L->v_proj,      &L->o_proj,    &L->q_norm,      &L->k_norm,
                          &L->in_proj_qkv, &L->in_proj_z, &L->in_proj_b,   &L->in_proj_a,
                          &L->conv1d,      &L->dt_bias,   &L->A_log,       &L->lin_norm,
                          &L->out_proj,    &L->gate_proj, &L->up_proj,     &L->down_proj,
                          &L->shared_gate, &L->shared_up, &L->shared_down, &L->shared_expert_gate};
    for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) wb += engine_tensor_bytes(ts[k], act);
    wb += engine_tensor_bytes_as(&L->router, act, 1);
    if (L->experts && c->layer_is_moe[i])
      for (int e = 0; e < c->n_experts; e++)
        wb += engine_tensor_bytes(&L->experts[e].gate, act) +
              engine_tensor_bytes(&L->experts[e].up, act) +
              engine_tensor_bytes(&L->experts[e].down, act);
  }
  double pb = be->weight_pack ? qwen35_packed_bytes(c, w) : 0;
  if (engine_packed_choice(o->packed_weights, wb, pb, (double)f->total_bytes))
    f->packed_bytes = (size_t)pb;
  f->weight_bytes = (size_t)(wb + (double)f->packed_bytes);
  size_t nkv = (size_t)c->n_kv_heads * (size_t)c->head_dim;
  f->page_bytes = (size_t)config_n_full_layers(c) * 2 * KV_PAGES_TOKENS * nkv * kv;
  f->slot_bytes = (size_t)config_n_linear_layers(c) *
                  ((size_t)c->conv_dim * (size_t)(c->conv_kernel - 1) +
                   (size_t)c->lin_n_v_heads * c->lin_k_head_dim * c->lin_v_head_dim) *
                  4;
  /* the largest step's activations (qwen35's scratch, doubled for the backend's own
   * workspaces), the logits rows, and a fixed reserve for libraries and fragmentation */
  size_t H = (size_t)c->hidden_size, nhd = (size_t)c->n_heads * c->head_dim;
  size_t vd = (size_t)c->lin_n_v_heads * c->lin_v_head_dim, nv = (size_t)c->lin_n_v_heads;
  size_t I = (size_t)(c->intermediate_size > c->moe_intermediate_size * c->n_experts_per_tok
                          ? c->intermediate_size
                          : c->moe_intermediate_size * c->n_experts_per_tok);
  size_t per_tok =
      (3 * H + 5 * nhd + 2 * nkv + 2 * (size_t)c->conv_dim + 2 * vd + 2 * nv + 2 * I) * act +
      2 * nv * 4;
  f->scratch_bytes = 2 * per_tok * (size_t)o->max_num_batched_tokens +
                     (size_t)o->max_num_seqs * (size_t)c->vocab_size * 4 + 512 * ENGINE_MIB;
  return 0;
}

int engine_mem_plan_device(engine_opts *o, const model_config *c, const model_weights *w,
                           backend *be, qwen35_mem_opts *mo, char *err, size_t errlen) {
  engine_mem_facts f;
  if (engine_mem_facts_get(be, c, w, o, &f) != 0) return engine_mem_plan(o, c, mo, err, errlen);
  engine_mem_split sp;
  if (engine_mem_split_plan(o, &f, &sp, err, errlen) != 0) return -1;
  double mib = (double)ENGINE_MIB;
  log_info(
      "engine: memory plan: %.0f MiB total, %.0f MiB free, utilisation %.2f; weights "
      "~%.0f MiB (packed copies %.0f MiB), %d state slots %.0f MiB, step scratch %.0f MiB "
      "-> budget %.0f MiB = KV %d pages (%d tokens) %.0f MiB + %d snapshot slabs %.0f MiB",
      f.total_bytes / mib, f.free_bytes / mib, o->gpu_memory_utilization, f.weight_bytes / mib,
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
  mo->packed = f.packed_bytes > 0;
  return 0;
}

/* ---- sampler pool ---------------------------------------------------------------------------- */

/* One sampled row of a step: the request, its logits (masked first by its JSON mask, when it
 * has one), what sampler_sample gave. */
typedef struct engine_job {
  request *r;
  json_mask *jm;
  float *lg;
  int32_t t;
  sampler_result res;
} engine_job;

typedef struct engine_pool engine_pool;
typedef struct engine_worker {
  engine_pool *pool;
  sampler_scratch scratch;
  pthread_t thread;
  int started;
} engine_worker;

/* Workers sleep on go until gen moves; each then takes rows from next until none are left
 * and reports on done. All sized at creation: a step hands out jobs without allocating. */
struct engine_pool {
  int n; /* sampler threads (0: inline) */
  engine_worker *w;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  int inited;
  unsigned long gen;
  int stop;
  int n_active; /* workers not yet done with the current step */
  engine_job *jobs;
  int n_jobs, n_vocab;
  const int32_t *eos; /* the model's end tokens (engine_ban_ends) */
  int n_eos;
  atomic_int next;
  /* the other kind of work: JSON masks to prepare (json_mask_prepare) while the forward runs */
  int prep_mode; /* the current round is mask preparation (set with gen, under mu) */
  json_mask **prep;
  int n_prep;
};

/* min_tokens: while the request's output is shorter, its end tokens (what engine_is_stop_token
 * would end it on: stop_ids, and the model's eos unless ignore_eos) get no probability. Not
 * under a JSON mask, which may leave nothing but an end token (the server refuses the pair). */
#define ENGINE_MAX_BANS (SAMPLER_MAX_STOP_IDS + CONFIG_MAX_EOS)

/* The tokens min_tokens bans from request r's next row (out[], at most ENGINE_MAX_BANS; ids
 * outside the vocabulary are the caller's to skip). */
static int engine_ban_ids(const int32_t *eos, int n_eos, const request *r, int has_jm,
                          int32_t *out) {
  const sampling_params *sp = &r->smp.p;
  int n = 0;
  if (has_jm || request_n_output(r) >= sp->min_tokens) return 0;
  for (int i = 0; i < sp->n_stop_ids; i++) out[n++] = sp->stop_ids[i];
  if (!sp->ignore_eos)
    for (int i = 0; i < n_eos && i < CONFIG_MAX_EOS; i++) out[n++] = eos[i];
  return n;
}

static void engine_ban_ends(const engine_pool *p, const engine_job *jb) {
  int32_t ban[ENGINE_MAX_BANS];
  int n = engine_ban_ids(p->eos, p->n_eos, jb->r, jb->jm != NULL, ban);
  for (int i = 0; i < n; i++)
    if (ban[i] >= 0 && ban[i] < p->n_vocab) jb->lg[ban[i]] = -INFINITY;
}

static void engine_pool_run(engine_pool *p, sampler_scratch *w) {
  for (;;) {
    int j = atomic_fetch_add(&p->next, 1);
    if (j >= p->n_jobs) return;
    engine_job *jb = &p->jobs[j];
    request *r = jb->r;
    if (jb->jm) json_mask_apply(jb->jm, jb->lg, p->n_vocab);
    engine_ban_ends(p, jb);
    jb->t = sampler_sample(&r->smp, jb->lg, p->n_vocab, r->tokens, r->n_prompt,
                           r->tokens + r->n_prompt, request_n_output(r), w, &jb->res);
  }
}

static void engine_pool_run_prep(engine_pool *p) {
  for (;;) {
    int j = atomic_fetch_add(&p->next, 1);
    if (j >= p->n_prep) return;
    json_mask_prepare(p->prep[j], p->n_vocab);
  }
}

static void *engine_pool_main(void *arg) {
  engine_worker *wk = arg;
  engine_pool *p = wk->pool;
  unsigned long seen = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
    if (p->stop) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    seen = p->gen;
    int prep = p->prep_mode;
    pthread_mutex_unlock(&p->mu);
    if (prep)
      engine_pool_run_prep(p);
    else
      engine_pool_run(p, &wk->scratch);
    pthread_mutex_lock(&p->mu);
    if (--p->n_active == 0) pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
  }
}

/* The pool's size: DS_SAMPLER_THREADS when set (clamped to [0, 64]), else
 * min(8, online CPUs - 1). */
static int engine_pool_size(void) {
  const char *v = getenv("DS_SAMPLER_THREADS");
  if (v && *v) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*end == 0) return n < 0 ? 0 : n > 64 ? 64 : (int)n;
    log_warn("engine: DS_SAMPLER_THREADS=%s is not a number; using the default", v);
  }
  long c = sysconf(_SC_NPROCESSORS_ONLN) - 1;
  return c < 0 ? 0 : c > 8 ? 8 : (int)c;
}

static void engine_pool_free(engine_pool *p) {
  if (p->inited) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
  }
  for (int i = 0; p->w && i < p->n; i++) {
    if (p->w[i].started) pthread_join(p->w[i].thread, NULL);
    sampler_scratch_free(&p->w[i].scratch);
  }
  if (p->inited) {
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
  }
  free(p->w);
  free(p->jobs);
  free(p->prep);
  memset(p, 0, sizeof *p);
}

/* Returns 0, or -1 (out of memory, or a thread that cannot start). */
static int engine_pool_init(engine_pool *p, int n, int n_vocab, int max_rows) {
  memset(p, 0, sizeof *p);
  p->n_vocab = n_vocab;
  p->jobs = calloc((size_t)max_rows, sizeof *p->jobs);
  p->prep = calloc((size_t)max_rows, sizeof *p->prep);
  if (!p->jobs || !p->prep) return -1;
  if (n <= 0) return 0;
  p->w = calloc((size_t)n, sizeof *p->w);
  if (!p->w) return -1;
  p->n = n;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->done, NULL);
  p->inited = 1;
  for (int i = 0; i < n; i++) {
    p->w[i].pool = p;
    if (sampler_scratch_init(&p->w[i].scratch, n_vocab) != 0) return -1;
    if (pthread_create(&p->w[i].thread, NULL, engine_pool_main, &p->w[i]) != 0) return -1;
    p->w[i].started = 1;
  }
  return 0;
}

/* Wakes the workers for one round of sampling (prep 0) or mask preparation (prep 1). */
static void engine_pool_go(engine_pool *p, int prep) {
  pthread_mutex_lock(&p->mu);
  p->prep_mode = prep;
  p->gen++;
  p->n_active = p->n;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
}

/* Returns when every worker is done with the current round. */
static void engine_pool_wait(engine_pool *p) {
  pthread_mutex_lock(&p->mu);
  while (p->n_active > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

/* Samples jobs[0..n_jobs) on the pool and the calling thread (scratch w); returns when all
 * are done. Inline when the pool is empty or there is one row. */
static void engine_pool_sample(engine_pool *p, int n_jobs, sampler_scratch *w) {
  p->n_jobs = n_jobs;
  atomic_store(&p->next, 0);
  if (p->n == 0 || n_jobs < 2) {
    engine_pool_run(p, w);
    return;
  }
  engine_pool_go(p, 0);
  engine_pool_run(p, w);
  engine_pool_wait(p);
}

/* Mask preparation while the forward runs: engine_pool_prep_start hands prep[0..n_prep) to the
 * workers and returns at once; engine_pool_prep_finish (after the forward) takes what is left
 * on the calling thread and returns when every mask is prepared. Nothing is started without
 * workers: then json_mask_apply computes each mask as it samples, as before. Between the two
 * calls nothing else may touch the masks (the engine thread is in the forward). */
static void engine_pool_prep_start(engine_pool *p) {
  atomic_store(&p->next, 0);
  if (p->n == 0 || p->n_prep == 0) return;
  engine_pool_go(p, 1);
}

static void engine_pool_prep_finish(engine_pool *p) {
  if (p->n == 0 || p->n_prep == 0) return;
  engine_pool_run_prep(p);
  engine_pool_wait(p);
  p->n_prep = 0;
}

/* ---- handles and their output channels --------------------------------------------------- */

typedef struct engine_ev {
  int32_t token;
  int has_token;
  float logprob;
  int n_top;
  int finish;
} engine_ev;

struct engine_req {
  request r; /* the engine thread's; r.owner == this handle */
  engine *e;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  engine_ev *ring;  /* [cap] events in order (at most max_tokens tokens + 1 final) */
  int32_t *top_ids; /* [cap * top_logprobs] */
  float *top_lps;
  int cap, n_push, n_pop;
  int done; /* the final event was pushed */
  int refs; /* client + engine */
  atomic_int cancel;
  int prompt_tokens, completion_tokens, cached_tokens;
  char err[160];
  void (*on_logits)(void *, const float *, int);
  void *user;
  json_mask *jm; /* response_format json_object / json_schema (NULL: none); one thread at a time */
  json_schema *schema;      /* response_format json_schema: the schema jm follows (owned) */
  struct engine_req *qnext; /* the incoming queue */
};

/* A greedy or sampled step issued and not yet read (engine_flight_step). */
typedef struct engine_flight {
  request **reqs; /* its rows, in batch order (one of engine.fl_store) */
  int n;
  int sampled; /* by the sample op (qwen35_sample_start), else greedy (qwen35_greedy_start) */
  int ticket;  /* the start's */
  int buf;     /* its ids land in engine.ids_buf[buf] */
} engine_flight;

struct engine {
  qwen35 *m;
  const model_config *cfg;
  engine_opts o;
  int max_model_len, n_vocab;
  kv_pages *kp;
  state_pool *sp;
  prefix_cache *pc; /* NULL when --no-enable-prefix-caching */
  sched *s;
  fwd_seq *seqs; /* [max_num_seqs] */
  float *logits; /* [max_num_seqs, n_vocab] (qwen35_host_alloc) */
  int32_t *ids;  /* [max_num_seqs] the greedy steps' tokens */
  /* steps ahead (engine_flight_step): DS_ENGINE_AHEAD; the steps in flight (fl[0] the older);
   * each one's ids land in ids_buf[its buf] (ids_buf[0] == ids) */
  int ahead;
  engine_flight fl[2];
  int n_fl;
  int32_t *ids_buf[2];
  request **fl_store[2]; /* [max_num_seqs] each: the flights' rows */
  int device_greedy;     /* the model's backend has argmax and DS_ENGINE_HOST_SAMPLE is unset */
  /* steps whose sampled rows are all sampler_device_ok are sampled by the backend's sample op
   * (qwen35_forward_sample): the backend has it, DS_ENGINE_HOST_SAMPLE is unset, and the model
   * is on a device or DS_ENGINE_DEVICE_SAMPLE is set (not "0") */
  int device_sample;
  int32_t *words; /* such a step's words: [max_num_seqs, SAMPLE_RULE_WORDS], then the edits */
  sample_rule_edit *edits; /* [max_num_seqs * SAMPLE_RULE_EDITS_MAX] the rows' edits */
  int *edit_n;             /* [max_num_seqs] each sampled row's number of them */
  uint64_t (*rng_save)[4]; /* [max_num_seqs] a sampled flight's rows' RNG before its draws */
  int mask_overlap;        /* JSON masks prepared during the forward (DS_ENGINE_MASK_OVERLAP) */
  int profile;             /* DS_ENGINE_PROFILE */
  int trace;               /* DS_ENGINE_TRACE: one log line per step (who computes what) */
  long long steps;         /* forward steps run */
  long long steps_ahead;   /* of them, issued ahead (engine_flight_step) */
  long long steps_device_sampled; /* of them, qwen35_forward_sample */
  double prof[5];          /* seconds: schedule, forward (device greedy), forward (logits), sample,
                              postprocess + snapshot */
  long long prof_steps[2]; /* steps with device greedy / with logits */
  sampler_scratch scratch; /* the engine thread's */
  engine_pool pool;        /* sampler threads and the step's jobs [max_num_seqs] */
  notifier *nt; /* wakes the clients of a step's token events (NULL: the engine thread does) */
  pthread_t thread;
  pthread_mutex_t mu; /* incoming queue, stop, stats snapshot, check requests */
  pthread_cond_t cv;  /* wakes the engine thread */
  pthread_cond_t check_cv;
  engine_req *in_head, *in_tail;
  int n_in;
  int stop, drain;
  int check_pending, check_rc;
  char check_err[200];
  long long next_id;
  engine_stats st; /* the snapshot readers get (under mu) */
  long long prompt_total, gen_total, prefilled_total, finished, cancelled, failed;
  long long ck_n[3]; /* checkpoint copies timed (engine_time_copy) */
  double ck_ms[3], ck_max[3];
};

static void engine_req_unref(engine_req *h) {
  pthread_mutex_lock(&h->mu);
  int left = --h->refs;
  pthread_mutex_unlock(&h->mu);
  if (left > 0) return;
  request_free(&h->r);
  json_mask_free(h->jm);
  json_schema_free(h->schema);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  free(h->ring);
  free(h->top_ids);
  free(h->top_lps);
  free(h);
}

/* Wakes the client of a handle whose wake-up was handed to the notifier, and drops the
 * reference taken for it (notifier thread). */
static void engine_wake(void *item) {
  engine_req *h = item;
  pthread_mutex_lock(&h->mu);
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  engine_req_unref(h);
}

/* Pushes one event (engine thread). A final event (finish != 0) is the last. With nt, the
 * client's wake-up is queued there (a reference held until it runs) instead of done here;
 * returns 1 when it was. */
static int engine_push(engine_req *h, const sampler_result *res, int finish, notifier *nt) {
  pthread_mutex_lock(&h->mu);
  CHECK(!h->done && h->n_push < h->cap);
  engine_ev *ev = &h->ring[h->n_push];
  memset(ev, 0, sizeof *ev);
  if (res) {
    int k = h->r.smp.p.top_logprobs;
    ev->token = res->token;
    ev->has_token = 1;
    ev->logprob = res->logprob;
    ev->n_top = res->n_top < k ? res->n_top : k;
    for (int i = 0; i < ev->n_top; i++) {
      h->top_ids[(size_t)h->n_push * k + i] = res->top_ids[i];
      h->top_lps[(size_t)h->n_push * k + i] = res->top_logprobs[i];
    }
  }
  ev->finish = finish;
  h->n_push++;
  if (finish) {
    h->done = 1;
    h->prompt_tokens = h->r.n_prompt;
    h->completion_tokens = request_n_output(&h->r);
    h->cached_tokens = h->r.cached_tokens < h->r.n_prompt ? h->r.cached_tokens : h->r.n_prompt;
    snprintf(h->err, sizeof h->err, "%s", h->r.err);
  }
  if (nt) {
    h->refs++;
    pthread_mutex_unlock(&h->mu);
    if (notifier_post(nt, h) == 0) return 1;
    engine_wake(h); /* the queue is full: here after all */
    return 0;
  }
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  return 0;
}

/* Ends a request that is already out of the scheduler (engine thread). */
static void engine_end(engine *e, engine_req *h, int finish, int with_event) {
  h->r.finish = finish;
  if (finish == FINISH_CANCELLED)
    e->cancelled++;
  else if (finish == FINISH_ERROR)
    e->failed++;
  else
    e->finished++;
  if (with_event) engine_push(h, NULL, finish, NULL);
  engine_req_unref(h);
}

/* ---- the step ----------------------------------------------------------------------------- */

static double engine_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int engine_env_on(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

static int engine_is_stop_token(engine *e, const request *r, int32_t t) {
  const sampling_params *p = &r->smp.p;
  for (int i = 0; i < p->n_stop_ids; i++)
    if (p->stop_ids[i] == t) return 1;
  if (!p->ignore_eos)
    for (int i = 0; i < e->cfg->n_eos; i++)
      if (e->cfg->eos_token_ids[i] == t) return 1;
  return 0;
}

static void engine_cancel_scan(engine *e, int all) {
  request *lists[2] = {sched_first_waiting(e->s), sched_first_running(e->s)};
  for (int l = 0; l < 2; l++) {
    request *next;
    for (request *r = lists[l]; r; r = next) {
      next = r->next;
      engine_req *h = r->owner;
      if (!all && !atomic_load(&h->cancel)) continue;
      if (r->in_flight) continue; /* after its step (no step goes ahead meanwhile) */
      sched_remove(e->s, r);
      engine_end(e, h, FINISH_CANCELLED, 1);
    }
  }
}

static void engine_snapshot(engine *e) {
  engine_stats s;
  memset(&s, 0, sizeof s);
  s.num_running = sched_num_running(e->s);
  s.num_waiting = sched_num_waiting(e->s);
  s.prompt_tokens_total = e->prompt_total;
  s.generation_tokens_total = e->gen_total;
  s.prefilled_tokens_total = e->prefilled_total;
  s.steps = e->steps;
  s.steps_ahead = e->steps_ahead;
  s.steps_device_sampled = e->steps_device_sampled;
  s.requests_finished = e->finished;
  s.requests_cancelled = e->cancelled;
  s.requests_failed = e->failed;
  s.preemptions = sched_num_preemptions(e->s);
  s.kv_pages_total = kv_pages_total(e->kp);
  s.kv_pages_used = kv_pages_num_used(e->kp);
  s.kv_pages_cached = kv_pages_num_cached(e->kp);
  s.slots_total = state_pool_num_slots(e->sp);
  s.slots_used = s.slots_total - state_pool_num_slots_free(e->sp);
  s.snapshot_slabs_total = state_pool_num_slabs(e->sp);
  s.snapshot_slabs_used = s.snapshot_slabs_total - state_pool_num_slabs_free(e->sp);
  s.max_model_len = e->max_model_len;
  s.ckpt_captures_timed = e->ck_n[0];
  s.ckpt_restores_timed = e->ck_n[1];
  s.ckpt_restore_page_copies = e->ck_n[2];
  s.ckpt_capture_ms_sum = e->ck_ms[0];
  s.ckpt_restore_ms_sum = e->ck_ms[1] + e->ck_ms[2];
  s.ckpt_capture_ms_max = e->ck_max[0];
  s.ckpt_restore_ms_max = e->ck_max[1];
  if (e->pc) {
    prefix_cache_stats p;
    prefix_cache_get_stats(e->pc, &p);
    s.prefix_enabled = 1;
    s.prefix_queries = p.queries;
    s.prefix_hits = p.hits;
    s.prefix_hit_tokens = p.hit_tokens;
    s.prefix_captures = p.captures;
    s.prefix_capture_failures = p.capture_failures;
    s.prefix_evictions = p.evictions;
    s.prefix_restore_failures = p.restore_failures;
    s.prefix_demotions = p.demotions;
    s.prefix_rejected = p.rejected;
    s.prefix_checkpoints = p.n_checkpoints;
    s.prefix_pending = p.n_pending;
    s.prefix_host_checkpoints = p.n_host;
    s.prefix_device_slabs = p.device_slabs;
    s.prefix_device_slabs_max = p.device_slabs_max;
    s.prefix_device_pages = p.device_pages;
    s.prefix_device_slab_bytes = p.device_slab_bytes;
    s.prefix_device_page_bytes = p.device_page_bytes;
    s.prefix_host_bytes = p.host_bytes;
    s.prefix_host_budget_bytes = p.host_budget_bytes;
  }
  pthread_mutex_lock(&e->mu);
  s.num_waiting += e->n_in;
  e->st = s;
  pthread_mutex_unlock(&e->mu);
}

/* DS_ENGINE_TRACE=1: "step N (T tokens): r<id>[from,to)" per scheduled request; an
 * admission is marked "+" (cold) or "<-D" (restored D tokens), a sampling row "!". */
static void engine_trace(engine *e, const sched_batch *b) {
  char line[1024];
  int n = snprintf(line, sizeof line, "step %lld (%d tokens):", e->steps, b->n_tokens);
  for (int i = 0; i < b->n && n < (int)sizeof line - 64; i++) {
    const request *r = b->reqs[i];
    int fresh = r->n_computed == r->cached_tokens && r->n_computed < r->n_prompt;
    n += snprintf(line + n, sizeof line - (size_t)n, " r%lld[%d,%d)", (long long)r->id,
                  r->n_computed, r->n_computed + r->sched_tokens);
    if (fresh && r->cached_tokens)
      n += snprintf(line + n, sizeof line - (size_t)n, "<-%d", r->cached_tokens);
    else if (fresh)
      n += snprintf(line + n, sizeof line - (size_t)n, "+");
    if (r->sched_sample) n += snprintf(line + n, sizeof line - (size_t)n, "!");
  }
  log_info("engine: %s", line);
}

/* ---- steps ahead ------------------------------------------------------------------------
 * A plain-greedy decode step is issued with qwen35_greedy_start and read with
 * qwen35_greedy_finish — and so is a decode step whose rows the sample op picks with words that
 * do not depend on the tokens before them (engine_flight_sampled: no penalties, logit_bias or
 * min_tokens ban; each row's draw is taken when its step is issued, in the row's order of
 * steps, as the host would take it), issued with qwen35_sample_start; in between, the next
 * step of the same requests may be issued
 * "chained" (its tokens taken on the device from the step's ids), so that the host's work
 * between two steps (reading, posting, scheduling, launching) is off the device's critical
 * path. A step goes ahead only when it is the step the scheduler would make next anyway: every
 * running request is a row of the step in flight, nobody waits, no row can reach its length
 * limit with the token in flight, no row is cancelled or ends after the step in flight, the
 * engine is not asked to stop or check, and every row gets the pages for one position more. A
 * row that the token in flight ends (a stop token) has then been fed that token once more: its
 * finish is sent with the token and takes effect after the step ahead (finish_next), whose
 * output for it is dropped, so its state and the end-of-generation checkpoint cover the whole
 * output. DS_ENGINE_AHEAD=0: off (on by default on device backends that can chain). */

static int engine_ahead_ok(engine *e, const engine_flight *f) {
  if (!e->ahead || f->n != sched_num_running(e->s) || sched_num_waiting(e->s) != 0) return 0;
  pthread_mutex_lock(&e->mu);
  int busy = e->in_head || e->stop || e->check_pending;
  pthread_mutex_unlock(&e->mu);
  if (busy) return 0;
  for (int i = 0; i < f->n; i++) {
    request *r = f->reqs[i];
    engine_req *h = r->owner;
    if (r->finish_next || atomic_load(&h->cancel) ||
        request_n_output(r) + 1 >= r->smp.p.max_tokens || r->n_tokens + 1 >= e->max_model_len)
      return 0;
  }
  return 1;
}

/* 1 when the row's sample-op words never carry edits from now on (engine_device_words): the
 * sampler's edit-free parameters, past its min_tokens ban. */
static int engine_flight_sampled(const engine *e, const request *r) {
  engine_req *h = r->owner;
  return e->device_sample && !h->on_logits && !h->jm && sampler_device_edit_free(&r->smp.p) &&
         request_n_output(r) >= r->smp.p.min_tokens;
}

/* Issues the rows of reqs[0, n) as a greedy or sampled step into fl[e->n_fl] (chained: their
 * tokens are the ids of the step in flight, fl[0]). 0, or -1 with err. */
static int engine_flight_start(engine *e, request **reqs, int n, int chained, int sampled,
                               char *err, size_t errlen) {
  engine_flight *f = &e->fl[e->n_fl];
  int slot = e->n_fl == 0 ? 0 : e->fl[0].reqs == e->fl_store[0];
  int buf = e->n_fl == 0 ? 0 : 1 - e->fl[0].buf;
  for (int i = 0; i < n; i++) {
    request *r = reqs[i];
    fwd_seq *q = &e->seqs[i];
    q->tokens = chained ? NULL : r->tokens + r->n_computed;
    q->n_tokens = 1;
    q->pos = r->n_computed + chained; /* the step in flight holds n_computed */
    q->pages = r->pages.ids;
    q->n_pages = r->pages.n;
    q->slot = r->slot;
    q->logits = QWEN35_LOGITS_LAST;
  }
  int ticket;
  if (sampled) { /* each row's draw now: its steps are issued in its order */
    for (int i = 0; i < n; i++) {
      memcpy(e->rng_save[i], reqs[i]->smp.rng, sizeof e->rng_save[i]);
      sampler_device_row(&reqs[i]->smp, 0, 0, e->words + (size_t)i * SAMPLE_RULE_WORDS);
    }
    if (qwen35_sample_start(e->m, e->seqs, n, chained, e->words, n * SAMPLE_RULE_WORDS,
                            e->ids_buf[buf], &ticket, err, errlen)) {
      for (int i = 0; i < n; i++) /* the step did not happen: nor did its draws */
        memcpy(reqs[i]->smp.rng, e->rng_save[i], sizeof e->rng_save[i]);
      return -1;
    }
    e->steps_device_sampled++;
  } else if (qwen35_greedy_start(e->m, e->seqs, n, chained, e->ids_buf[buf], &ticket, err,
                                 errlen)) {
    return -1;
  }
  if (reqs != e->fl_store[slot]) memcpy(e->fl_store[slot], reqs, (size_t)n * sizeof *reqs);
  f->reqs = e->fl_store[slot];
  f->n = n;
  f->sampled = sampled;
  f->ticket = ticket;
  f->buf = buf;
  for (int i = 0; i < n; i++) reqs[i]->in_flight = 1;
  e->n_fl++;
  e->steps++;
  return 0;
}

/* Reads the oldest step in flight (issuing the next one ahead first when it may), posts its
 * tokens and postprocesses it. Returns its row count. */
static int engine_flight_step(engine *e) {
  engine_flight *f = &e->fl[0];
  char err[160];
  int ahead = 0;
  if (engine_ahead_ok(e, f) && sched_extend(e->s, f->reqs, f->n) == 0) {
    if (engine_flight_start(e, f->reqs, f->n, 1, f->sampled, err, sizeof err) == 0) {
      ahead = 1;
      e->steps_ahead++;
    } else {
      log_error("engine: a step ahead failed to start: %s", err);
    }
  }
  int n = f->n;
  if (qwen35_greedy_finish(e->m, f->ticket, err, sizeof err) != 0) {
    log_error("engine: forward step failed: %s", err);
    char why[160];
    snprintf(why, sizeof why, "forward step failed: %.130s", err);
    if (ahead) qwen35_greedy_finish(e->m, e->fl[1].ticket, err, sizeof err); /* same rows */
    sched_batch fb = {0};
    fb.reqs = f->reqs;
    fb.n = n;
    for (int i = 0; i < n; i++) f->reqs[i]->in_flight = 0;
    sched_fail_batch(e->s, &fb, why);
    for (int i = 0; i < n; i++) { /* a row with finish_next has sent its finish already */
      int fin = f->reqs[i]->finish_next;
      engine_end(e, f->reqs[i]->owner, fin ? fin : FINISH_ERROR, !fin);
    }
    e->n_fl = 0;
    return n;
  }
  const int32_t *ids = e->ids_buf[f->buf];
  int posted = 0;
  for (int i = 0; i < n; i++) {
    request *r = f->reqs[i];
    engine_req *h = r->owner;
    if (r->finish_next) { /* ended by the step before; this step fed its last token */
      r->finish = r->finish_next;
      r->finish_next = 0;
      continue;
    }
    sampler_result res;
    memset(&res, 0, sizeof res);
    int32_t t = res.token = ids[i];
    r->tokens[r->n_tokens++] = t;
    e->gen_total++;
    int fin = FINISH_NONE;
    if (engine_is_stop_token(e, r, t))
      fin = FINISH_STOP;
    else if (request_n_output(r) >= r->smp.p.max_tokens || r->n_tokens >= e->max_model_len)
      fin = FINISH_LENGTH;
    if (fin != FINISH_NONE && ahead)
      r->finish_next = fin;
    else
      r->finish = fin;
    posted += engine_push(h, &res, fin, e->nt);
  }
  if (posted) notifier_kick(e->nt);
  sched_batch pb = {0};
  pb.reqs = f->reqs;
  pb.n = n;
  sched_postprocess(e->s, &pb);
  for (int i = 0; i < n; i++) {
    request *r = f->reqs[i];
    if (!ahead) r->in_flight = 0;
    if (r->state == REQ_STATE_FINISHED) {
      r->in_flight = 0;
      engine_end(e, r->owner, r->finish, 0);
    }
  }
  if (ahead) {
    e->fl[0] = e->fl[1];
    sched_batch nb;
    sched_again(e->s, &nb, e->fl[0].reqs, e->fl[0].n);
    if (e->trace) engine_trace(e, &nb); /* the step ahead, logged once it is the step */
  }
  e->n_fl = ahead;
  return n;
}

/* Completes the steps in flight (none goes ahead while the engine is asked to check). */
static void engine_flight_drain(engine *e) {
  while (e->n_fl) engine_flight_step(e);
}

/* A forward step that failed (err): its requests end with an error. Returns its row count. */
static int engine_fail_step(engine *e, sched_batch *b, const char *err) {
  log_error("engine: forward step failed: %s", err);
  char why[160];
  snprintf(why, sizeof why, "forward step failed: %.130s", err);
  sched_fail_batch(e->s, b, why);
  for (int i = 0; i < b->n; i++) engine_end(e, b->reqs[i]->owner, FINISH_ERROR, 1);
  return b->n;
}

/* A device-sampled step's words (qwen35_forward_sample): every sampled row's parameters, then
 * their edits (frequency / presence penalties, logit_bias, the min_tokens ban). Returns the
 * number of words, or 0 when a row has more edits than SAMPLE_RULE_EDITS_MAX (then no RNG has
 * moved: the step samples on the host). */
static int engine_device_words(engine *e, const sched_batch *b, int n_rows) {
  int32_t ban[ENGINE_MAX_BANS];
  int n_ed = 0, row = 0;
  for (int i = 0; i < b->n; i++) {
    request *r = b->reqs[i];
    if (!r->sched_sample) continue;
    int nb = engine_ban_ids(e->pool.eos, e->pool.n_eos, r, 0, ban);
    int k = sampler_device_edits(&r->smp.p, r->tokens + r->n_prompt, request_n_output(r), ban, nb,
                                 e->n_vocab, e->edits + n_ed, SAMPLE_RULE_EDITS_MAX, &e->scratch);
    if (k < 0) return 0;
    e->edit_n[row++] = k;
    n_ed += k;
  }
  int32_t *ew = e->words + (size_t)n_rows * SAMPLE_RULE_WORDS;
  for (int k = 0; k < n_ed; k++)
    sample_rule_edit_pack(&e->edits[k], ew + (size_t)k * SAMPLE_RULE_EDIT_WORDS);
  row = 0;
  for (int i = 0, off = 0; i < b->n; i++) {
    request *r = b->reqs[i];
    if (!r->sched_sample) continue;
    sampler_device_row(&r->smp, off, e->edit_n[row], e->words + (size_t)row * SAMPLE_RULE_WORDS);
    off += e->edit_n[row++];
  }
  return n_rows * SAMPLE_RULE_WORDS + n_ed * SAMPLE_RULE_EDIT_WORDS;
}

static int engine_step(engine *e) {
  if (e->n_fl) return engine_flight_step(e);
  double t0 = e->profile ? engine_now() : 0;
  sched_batch b;
  sched_schedule(e->s, &b);
  for (int i = 0; i < b.n_failed; i++) engine_end(e, b.failed[i]->owner, FINISH_ERROR, 1);
  if (b.n == 0) return b.n_failed;

  int n_rows = 0;
  for (int i = 0; i < b.n; i++) {
    request *r = b.reqs[i];
    fwd_seq *q = &e->seqs[i];
    q->tokens = r->tokens + r->n_computed;
    q->n_tokens = r->sched_tokens;
    q->pos = r->n_computed;
    q->pages = r->pages.ids;
    q->n_pages = r->pages.n;
    q->slot = r->slot;
    q->logits = r->sched_sample ? QWEN35_LOGITS_LAST : QWEN35_LOGITS_NONE;
    n_rows += r->sched_sample;
    if (r->n_computed < r->n_prompt) e->prefilled_total += r->sched_tokens;
  }
  e->steps++;
  if (e->trace) engine_trace(e, &b);
  /* plain greedy everywhere: the device picks the tokens */
  int greedy = e->device_greedy && n_rows > 0;
  for (int i = 0; i < b.n && greedy; i++) {
    request *r = b.reqs[i];
    engine_req *h = r->owner;
    if (r->sched_sample && (h->on_logits || h->jm || !sampler_is_plain_greedy(&r->smp.p)))
      greedy = 0;
  }
  if (e->ahead && n_rows > 0 && b.n_tokens == b.n) {
    /* every row a decode row, plain greedy or sampled by the op without edits */
    int all_decode = 1, sampled = !greedy;
    for (int i = 0; i < b.n && all_decode; i++) {
      request *r = b.reqs[i];
      all_decode = r->sched_tokens == 1 && r->sched_sample && r->n_computed >= r->n_prompt &&
                   (greedy || engine_flight_sampled(e, r));
    }
    if (all_decode) {
      e->steps--; /* counted by engine_flight_start */
      char ferr[160];
      if (engine_flight_start(e, b.reqs, b.n, 0, sampled, ferr, sizeof ferr) != 0)
        return engine_fail_step(e, &b, ferr);
      return engine_flight_step(e);
    }
  }
  /* the backend's sample op when it picks every sampled row exactly as the host would */
  int dev_sample = !greedy && e->device_sample && n_rows > 0;
  for (int i = 0; i < b.n && dev_sample; i++) {
    request *r = b.reqs[i];
    engine_req *h = r->owner;
    if (r->sched_sample && (h->on_logits || h->jm || !sampler_device_ok(&r->smp.p))) dev_sample = 0;
  }
  int n_words = 0;
  if (dev_sample) /* the rows' edits (no RNG touched yet: a row with too many sends the step to
                     the host), then the draws in row order, as sampler_sample would */
    n_words = engine_device_words(e, &b, n_rows);
  dev_sample = n_words > 0;
  e->steps_device_sampled += dev_sample;
  /* the rows' JSON masks are prepared by the sampler threads while the device computes */
  e->pool.n_prep = 0;
  if (e->mask_overlap && !greedy)
    for (int i = 0; i < b.n; i++) {
      request *r = b.reqs[i];
      engine_req *h = r->owner;
      if (r->sched_sample && h->jm) e->pool.prep[e->pool.n_prep++] = h->jm;
    }
  engine_pool_prep_start(&e->pool);
  double t1 = e->profile ? engine_now() : 0;
  char err[160];
  int frc = greedy       ? qwen35_forward_greedy(e->m, e->seqs, b.n, e->ids, err, sizeof err)
            : dev_sample ? qwen35_forward_sample(e->m, e->seqs, b.n, e->words, n_words, e->ids, err,
                                                 sizeof err)
                         : qwen35_forward(e->m, e->seqs, b.n, e->logits, err, sizeof err);
  engine_pool_prep_finish(&e->pool);
  double t2 = e->profile ? engine_now() : 0;
  if (e->profile) {
    e->prof[0] += t1 - t0;
    e->prof[greedy || dev_sample ? 1 : 2] += t2 - t1;
    e->prof_steps[greedy || dev_sample ? 0 : 1]++;
  }
  if (frc != 0) return engine_fail_step(e, &b, err);

  int row = 0, n_jobs = 0;
  if (!greedy && !dev_sample) { /* logits callbacks in row order, then every row sampled */
    for (int i = 0; i < b.n; i++) {
      request *r = b.reqs[i];
      if (!r->sched_sample) continue;
      engine_req *h = r->owner;
      engine_job *jb = &e->pool.jobs[n_jobs++];
      jb->r = r;
      jb->jm = h->jm;
      jb->lg = e->logits + (size_t)row++ * e->n_vocab;
      if (h->on_logits) h->on_logits(h->user, jb->lg, e->n_vocab);
    }
    engine_pool_sample(&e->pool, n_jobs, &e->scratch);
  }
  row = 0;
  int posted = 0;
  for (int i = 0; i < b.n; i++) {
    request *r = b.reqs[i];
    if (!r->sched_sample) continue;
    engine_req *h = r->owner;
    sampler_result res;
    int32_t t;
    if (greedy || dev_sample) { /* what sampler_sample gives: the token, nothing else */
      memset(&res, 0, sizeof res);
      t = res.token = e->ids[row++];
    } else {
      engine_job *jb = &e->pool.jobs[row++];
      CHECK(jb->r == r);
      res = jb->res;
      t = jb->t;
    }
    r->tokens[r->n_tokens++] = t;
    if (h->jm) json_mask_advance(h->jm, t);
    e->gen_total++;
    if (engine_is_stop_token(e, r, t))
      r->finish = FINISH_STOP;
    else if (request_n_output(r) >= r->smp.p.max_tokens || r->n_tokens >= e->max_model_len)
      r->finish = FINISH_LENGTH;
    if (!r->smp.p.logprobs) res.n_top = 0;
    posted += engine_push(h, &res, r->finish, e->nt);
  }
  if (posted) notifier_kick(e->nt);
  double t3 = e->profile ? engine_now() : 0;
  sched_postprocess(e->s, &b);
  for (int i = 0; i < b.n; i++) {
    request *r = b.reqs[i];
    if (r->state == REQ_STATE_FINISHED) engine_end(e, r->owner, r->finish, 0);
  }
  if (e->profile) {
    e->prof[3] += t3 - t2;
    e->prof[4] += engine_now() - t3;
  }
  return b.n;
}

static void engine_run_check(engine *e) {
  char err[200] = "";
  int rc = kv_pages_check(e->kp, err, sizeof err);
  if (rc == 0) rc = state_pool_check(e->sp, err, sizeof err);
  if (rc == 0 && e->pc) rc = prefix_cache_check(e->pc, err, sizeof err);
  engine_snapshot(e); /* so that stats read right after engine_check are current */
  pthread_mutex_lock(&e->mu);
  e->check_rc = rc;
  snprintf(e->check_err, sizeof e->check_err, "%s", err);
  e->check_pending = 0;
  pthread_cond_broadcast(&e->check_cv);
  pthread_mutex_unlock(&e->mu);
}

static void *engine_main(void *arg) {
  engine *e = arg;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    while (!e->in_head && !e->stop && !e->check_pending && sched_num_running(e->s) == 0 &&
           sched_num_waiting(e->s) == 0)
      pthread_cond_wait(&e->cv, &e->mu);
    engine_req *in = e->in_head;
    e->in_head = e->in_tail = NULL;
    e->n_in = 0;
    int stop = e->stop, drain = e->drain, check = e->check_pending;
    pthread_mutex_unlock(&e->mu);
    for (engine_req *h = in, *next; h; h = next) {
      next = h->qnext;
      e->prompt_total += h->r.n_prompt;
      sched_add(e->s, &h->r);
    }
    engine_cancel_scan(e, stop && !drain);
    if (check) {
      engine_flight_drain(e);
      engine_run_check(e);
    }
    int idle = sched_num_running(e->s) == 0 && sched_num_waiting(e->s) == 0;
    if (stop && idle) break;
    int did = idle ? 1 : engine_step(e);
    engine_snapshot(e);
    if (!did) { /* nothing could run now (cannot happen without a prefix cache): back off */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_mutex_lock(&e->mu);
      if (!e->in_head && !e->stop) pthread_cond_timedwait(&e->cv, &e->mu, &ts);
      pthread_mutex_unlock(&e->mu);
    }
  }
  engine_snapshot(e);
  return NULL;
}

/* ---- public ------------------------------------------------------------------------------- */

/* Checkpoint copies (the state pool's and the prefix cache's device ops), timed: they are
 * synchronous (qwen35_slot_copy / qwen35_page_copy end with a backend sync) and run between two
 * steps, when the stream is idle, so the host clock around one is the pause it puts into every
 * running sequence's decode. ck[0]: captures (slot -> slab), ck[1]: restores (slab -> slot),
 * ck[2]: copy-on-write page copies of restores. */
static void engine_time_copy(engine *e, int kind, double t0) {
  double ms = (engine_now() - t0) * 1e3;
  e->ck_n[kind]++;
  e->ck_ms[kind] += ms;
  if (ms > e->ck_max[kind]) e->ck_max[kind] = ms;
}
static int engine_ops_copy(void *ctx, int dst, int src) {
  engine *e = ctx;
  double t0 = engine_now();
  int rc = qwen35_slot_copy(e->m, dst, src);
  if (rc == 0) engine_time_copy(e, dst >= e->o.max_num_seqs ? 0 : 1, t0);
  return rc;
}
static int engine_ops_page_copy(void *ctx, int dst, int src) {
  engine *e = ctx;
  double t0 = engine_now();
  int rc = qwen35_page_copy(e->m, dst, src);
  if (rc == 0) engine_time_copy(e, 2, t0);
  return rc;
}
static int engine_ops_page_read(void *ctx, int page, void *host) {
  return qwen35_page_read(((engine *)ctx)->m, page, host);
}
static int engine_ops_page_write(void *ctx, int page, const void *host) {
  return qwen35_page_write(((engine *)ctx)->m, page, host);
}
static int engine_ops_slot_read(void *ctx, int slot, void *host) {
  return qwen35_slot_read(((engine *)ctx)->m, slot, host);
}
static int engine_ops_slot_write(void *ctx, int slot, const void *host) {
  return qwen35_slot_write(((engine *)ctx)->m, slot, host);
}

#define ENGINE_GIB (1024.0 * 1024.0 * 1024.0)

/* The prefix cache over the engine's pools (start-up). Returns 0 or -1. */
static int engine_prefix_init(engine *e) {
  prefix_cache_opts po;
  memset(&po, 0, sizeof po);
  po.slab_bytes = qwen35_slot_bytes(e->m);
  po.page_bytes = qwen35_page_bytes(e->m);
  po.device_budget_bytes = (size_t)(e->o.prefix_cache_gib * ENGINE_GIB);
  po.host_budget_bytes = (size_t)(e->o.host_cache_gib * ENGINE_GIB);
  po.ops.ctx = e;
  po.ops.page_copy = engine_ops_page_copy;
  po.ops.page_read = engine_ops_page_read;
  po.ops.page_write = engine_ops_page_write;
  po.ops.slot_read = engine_ops_slot_read;
  po.ops.slot_write = engine_ops_slot_write;
  if (prefix_cache_init(&e->pc, e->kp, e->sp, &po) != 0) return -1;
  sched_set_prefix_cache(e->s, e->pc, e->o.snapshot_interval);
  prefix_cache_stats st;
  prefix_cache_get_stats(e->pc, &st);
  log_info(
      "engine: prefix cache on: %d snapshot slabs on the device (%.2f MiB each), host tier "
      "%.1f MiB, capture interval %d tokens",
      st.device_slabs_max, po.slab_bytes / (1024.0 * 1024.0),
      po.host_budget_bytes / (1024.0 * 1024.0), e->o.snapshot_interval);
  return 0;
}

/* engine_opts.startup_forward: the largest step once, before any request: one long piece on
 * slot 0 and pages from id 0, plus one-token pieces on the next slots (a page each), so that
 * the step has max_num_batched_tokens rows and max_num_seqs pieces -- the shapes the backend's
 * workspaces grow with (prefill attention, the decode attention over every row, logits). */
static int engine_startup_forward(engine *e, int n_pages, char *err, size_t errlen) {
  int n = e->o.max_num_batched_tokens, n_seq = e->o.max_num_seqs;
  if (n > n_pages * KV_PAGES_TOKENS) n = n_pages * KV_PAGES_TOKENS;
  if (n > e->max_model_len) n = e->max_model_len;
  if (n < 1) return 0;
  int singles = n_seq - 1 < n - 1 ? n_seq - 1 : n - 1, n_long = n - singles;
  int np_long = (n_long + KV_PAGES_TOKENS - 1) / KV_PAGES_TOKENS;
  while (singles > 0 && np_long + singles > n_pages) { /* a small pool: fewer singles */
    singles--;
    n_long++;
    np_long = (n_long + KV_PAGES_TOKENS - 1) / KV_PAGES_TOKENS;
  }
  if (np_long > n_pages) return 0; /* cannot happen: n <= n_pages * page tokens */
  int32_t *toks = calloc((size_t)n, sizeof *toks),
          *pages = malloc(sizeof *pages * (size_t)(np_long + singles));
  fwd_seq *seqs = calloc((size_t)singles + 1, sizeof *seqs);
  if (!toks || !pages || !seqs) {
    free(toks);
    free(pages);
    free(seqs);
    return errf(err, errlen, "out of memory for the start-up forward");
  }
  for (int i = 0; i < np_long + singles; i++) pages[i] = i;
  seqs[0] = (fwd_seq){toks, n_long, 0, pages, np_long, 0, QWEN35_LOGITS_LAST};
  for (int i = 1; i <= singles; i++)
    seqs[i] =
        (fwd_seq){toks + n_long + i - 1, 1, 0, pages + np_long + i - 1, 1, i, QWEN35_LOGITS_LAST};
  char ferr[256] = "";
  double t0 = engine_now();
  int rc = qwen35_forward(e->m, seqs, singles + 1, e->logits, ferr, sizeof ferr);
  free(toks);
  free(pages);
  free(seqs);
  if (rc)
    return errf(err, errlen,
                "the start-up forward of %d tokens failed (%s): lower --gpu-memory-utilization "
                "or --max-num-batched-tokens",
                n, ferr);
  log_info("engine: start-up forward of %d tokens in %d pieces: %.2f s", n, singles + 1,
           engine_now() - t0);
  return 0;
}

engine *engine_create(qwen35 *model, const engine_opts *o, char *err, size_t errlen) {
  const model_config *c = qwen35_config(model);
  qwen35_mem_opts mo;
  if (engine_mem_plan(o, c, &mo, err, errlen) != 0) return NULL;
  engine *e = calloc(1, sizeof *e);
  if (!e) return errf(err, errlen, "out of memory"), NULL;
  e->m = model;
  e->cfg = c;
  e->o = *o;
  if (e->o.max_waiting <= 0) e->o.max_waiting = 4096;
  e->n_vocab = c->vocab_size;
  e->max_model_len = o->max_model_len > 0 ? o->max_model_len : c->max_position_embeddings;
  int n_seq = o->max_num_seqs, n_slabs = mo.n_slots - n_seq;
  state_pool_ops ops = {e, NULL, engine_ops_copy}; /* the forward zeroes state at pos 0 */
  sched_opts so = {n_seq, o->max_num_batched_tokens, -1};
  e->seqs = calloc((size_t)n_seq, sizeof *e->seqs);
  e->logits = qwen35_host_alloc(model, (size_t)n_seq * (size_t)e->n_vocab * sizeof *e->logits);
  /* pinned on device backends: the step's ids come back by one copy queued behind the step */
  e->ids = qwen35_host_alloc(model, (size_t)n_seq * sizeof *e->ids);
  e->ids_buf[0] = e->ids;
  e->ids_buf[1] = qwen35_host_alloc(model, (size_t)n_seq * sizeof *e->ids);
  e->fl_store[0] = calloc((size_t)n_seq, sizeof *e->fl_store[0]);
  e->fl_store[1] = calloc((size_t)n_seq, sizeof *e->fl_store[1]);
  {
    /* unset: on device backends that can chain steps; "0": off; else on */
    const char *ah = getenv("DS_ENGINE_AHEAD");
    e->ahead =
        qwen35_can_chain(model) && (ah && *ah ? strcmp(ah, "0") != 0 : qwen35_on_device(model));
  }
  e->device_greedy = qwen35_has_argmax(model) && !engine_env_on("DS_ENGINE_HOST_SAMPLE");
  {
    const char *ds = getenv("DS_ENGINE_DEVICE_SAMPLE");
    e->device_sample = qwen35_has_sample(model) && !engine_env_on("DS_ENGINE_HOST_SAMPLE") &&
                       (ds && *ds ? strcmp(ds, "0") != 0 : qwen35_on_device(model));
  }
  e->words =
      malloc((size_t)n_seq * (SAMPLE_RULE_WORDS + SAMPLE_RULE_EDITS_MAX * SAMPLE_RULE_EDIT_WORDS) *
             sizeof *e->words);
  e->edits = malloc((size_t)n_seq * SAMPLE_RULE_EDITS_MAX * sizeof *e->edits);
  e->rng_save = malloc((size_t)n_seq * sizeof *e->rng_save);
  e->edit_n = malloc((size_t)n_seq * sizeof *e->edit_n);
  {
    /* unset: on device backends (a CPU forward needs the cores); "0": off; else on */
    const char *mo = getenv("DS_ENGINE_MASK_OVERLAP");
    e->mask_overlap = mo && *mo ? strcmp(mo, "0") != 0 : qwen35_on_device(model);
  }
  e->profile = engine_env_on("DS_ENGINE_PROFILE");
  e->trace = engine_env_on("DS_ENGINE_TRACE");
  if (!e->seqs || !e->logits || !e->ids || !e->ids_buf[1] || !e->fl_store[0] || !e->fl_store[1] ||
      !e->words || !e->edits || !e->edit_n || !e->rng_save || kv_pages_init(&e->kp, mo.n_pages) ||
      state_pool_init(&e->sp, n_seq, n_slabs, &ops) || sched_init(&e->s, &so, e->kp, e->sp) ||
      sampler_scratch_init(&e->scratch, e->n_vocab) ||
      engine_pool_init(&e->pool, engine_pool_size(), e->n_vocab, n_seq) != 0 ||
      (o->enable_prefix_caching && engine_prefix_init(e) != 0)) {
    engine_destroy(e, 0);
    return errf(err, errlen, "out of memory creating the engine"), NULL;
  }
  e->pool.eos = e->cfg->eos_token_ids;
  e->pool.n_eos = e->cfg->n_eos;
  if (o->startup_forward && engine_startup_forward(e, mo.n_pages, err, errlen) != 0) {
    engine_destroy(e, 0);
    return NULL;
  }
  /* token wake-ups off the engine thread (notifier.h); DS_ENGINE_NOTIFIER=0: on it, as before */
  const char *nv = getenv("DS_ENGINE_NOTIFIER");
  if (!(nv && strcmp(nv, "0") == 0)) e->nt = notifier_start(engine_wake, n_seq);
  if (!o->enable_prefix_caching) log_info("engine: prefix cache off");
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  pthread_cond_init(&e->check_cv, NULL);
  double mib = 1024.0 * 1024.0;
  size_t pb = qwen35_page_bytes(model), sb = qwen35_slot_bytes(model);
  log_info(
      "engine: memory: weights %.1f MiB, KV pages %d x %.3f MiB = %.1f MiB (%d tokens), "
      "state slots %d x %.2f MiB = %.1f MiB, snapshot slabs %d x %.2f MiB = %.1f MiB",
      qwen35_weight_bytes(model) / mib, mo.n_pages, pb / mib, mo.n_pages * (pb / mib),
      mo.n_pages * KV_PAGES_TOKENS, n_seq, sb / mib, n_seq * (sb / mib), n_slabs, sb / mib,
      n_slabs * (sb / mib));
  log_info(
      "engine: max_num_seqs %d, max_num_batched_tokens %d, max_model_len %d, "
      "sampler threads %d",
      n_seq, o->max_num_batched_tokens, e->max_model_len, e->pool.n);
  engine_snapshot(e);
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->check_cv);
    e->thread = 0;
    engine_destroy(e, 0);
    return errf(err, errlen, "cannot start the engine thread"), NULL;
  }
  return e;
}

void engine_destroy(engine *e, int drain) {
  if (!e) return;
  if (e->s && e->thread) {
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    e->drain = drain;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->check_cv);
  }
  notifier_stop(e->nt); /* the last wake-ups the engine thread queued */
  prefix_cache_free(e->pc);
  sched_free(e->s);
  state_pool_free(e->sp);
  kv_pages_free(e->kp);
  sampler_scratch_free(&e->scratch);
  engine_pool_free(&e->pool);
  if (e->profile) {
    long long n = e->prof_steps[0] + e->prof_steps[1];
    double d = n > 0 ? 1e3 / (double)n : 0;
    log_info(
        "engine: profile over %lld steps (%lld device ids): per step schedule %.3f ms, "
        "forward %.3f ms (device ids %.3f s, logits %.3f s in all), sample %.3f ms, "
        "postprocess %.3f ms",
        n, e->prof_steps[0], e->prof[0] * d, (e->prof[1] + e->prof[2]) * d, e->prof[1], e->prof[2],
        e->prof[3] * d, e->prof[4] * d);
  }
  free(e->seqs);
  if (e->logits) qwen35_host_free(e->m, e->logits);
  if (e->ids) qwen35_host_free(e->m, e->ids);
  if (e->ids_buf[1]) qwen35_host_free(e->m, e->ids_buf[1]);
  free(e->words);
  free(e->edits);
  free(e->edit_n);
  free(e->rng_save);
  free(e->fl_store[0]);
  free(e->fl_store[1]);
  free(e);
}

static engine_req *engine_submit_req(engine *e, const engine_submit_opts *o, engine_status *status,
                                     char *err, size_t errlen);

engine_req *engine_submit(engine *e, const engine_submit_opts *o, engine_status *status, char *err,
                          size_t errlen) {
  engine_req *h = engine_submit_req(e, o, status, err, errlen);
  if (!h) json_schema_free(o->schema); /* taken in every case (engine.h) */
  return h;
}

/* engine_submit's work; the handle it returns owns o->schema, NULL leaves it to the caller. */
static engine_req *engine_submit_req(engine *e, const engine_submit_opts *o, engine_status *status,
                                     char *err, size_t errlen) {
  engine_status dummy;
  if (!status) status = &dummy;
  *status = ENGINE_ERR_INVALID;
  if (!o->prompt || o->n_prompt < 1) return errf(err, errlen, "the prompt is empty"), NULL;
  for (int i = 0; i < o->n_prompt; i++)
    if (o->prompt[i] < 0 || o->prompt[i] >= e->n_vocab)
      return errf(err, errlen, "prompt token %d is out of range [0, %d)", o->prompt[i], e->n_vocab),
             NULL;
  if (sampling_params_validate(&o->sp, err, errlen) != 0) return NULL;
  long long total = (long long)o->n_prompt + o->sp.max_tokens;
  *status = ENGINE_ERR_TOO_LONG;
  if (total > e->max_model_len)
    return errf(err, errlen,
                "prompt (%d tokens) + max_tokens (%d) exceeds the maximum model length %d",
                o->n_prompt, o->sp.max_tokens, e->max_model_len),
           NULL;
  if (kv_pages_for_tokens((int)total - 1) > kv_pages_total(e->kp))
    return errf(err, errlen,
                "prompt (%d tokens) + max_tokens (%d) exceeds the KV cache (%d "
                "tokens)",
                o->n_prompt, o->sp.max_tokens, kv_pages_total(e->kp) * KV_PAGES_TOKENS),
           NULL;
  *status = ENGINE_ERR_NOMEM;
  if (fault_hit("engine_submit")) return errf(err, errlen, "out of memory"), NULL;
  engine_req *h = calloc(1, sizeof *h);
  if (!h) return errf(err, errlen, "out of memory"), NULL;
  h->cap = o->sp.max_tokens + 1;
  int k = o->sp.logprobs ? o->sp.top_logprobs : 0;
  h->ring = malloc((size_t)h->cap * sizeof *h->ring);
  h->top_ids = malloc((size_t)h->cap * (size_t)(k > 0 ? k : 1) * sizeof *h->top_ids);
  h->top_lps = malloc((size_t)h->cap * (size_t)(k > 0 ? k : 1) * sizeof *h->top_lps);
  if (o->json &&
      !(h->jm = o->schema ? json_mask_new_schema(o->json, o->schema) : json_mask_new(o->json))) {
    free(h->ring);
    free(h->top_ids);
    free(h->top_lps);
    free(h);
    return errf(err, errlen, "out of memory"), NULL;
  }
  pthread_mutex_lock(&e->mu);
  long long id = e->next_id++;
  pthread_mutex_unlock(&e->mu);
  /* split points: every chat boundary and the caller's extra points */
  int nb = o->boundaries ? o->n_boundaries : 0, ns = o->split_points ? o->n_split_points : 0;
  if (nb < 0) nb = 0;
  if (ns < 0) ns = 0;
  int32_t *forced = malloc((size_t)(nb + ns + 1) * sizeof *forced);
  if (forced) {
    if (nb) memcpy(forced, o->boundaries, (size_t)nb * sizeof *forced);
    if (ns) memcpy(forced + nb, o->split_points, (size_t)ns * sizeof *forced);
  }
  int rc = -1;
  if (h->ring && h->top_ids && h->top_lps && forced) {
    rc = request_init(&h->r, id, o->prompt, o->n_prompt, &o->sp, forced, nb + ns,
                      0x5eed0000ULL + (uint64_t)id);
    if (rc == 0 && e->pc &&
        request_init_prefix(
            &h->r, o->cache_salt, o->boundaries, nb,
            prefix_cache_capture_points_max(o->n_prompt, nb, e->o.snapshot_interval)) != 0) {
      request_free(&h->r);
      rc = -1;
    }
  }
  free(forced);
  if (rc != 0) {
    json_mask_free(h->jm);
    free(h->ring);
    free(h->top_ids);
    free(h->top_lps);
    free(h);
    return errf(err, errlen, "out of memory"), NULL;
  }
  if (!o->sp.logprobs) h->r.smp.p.top_logprobs = 0;
  h->r.owner = h;
  h->e = e;
  h->refs = 2;
  h->on_logits = o->on_logits;
  h->user = o->user;
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  pthread_mutex_lock(&e->mu);
  if (e->stop || e->st.num_waiting + e->n_in >= e->o.max_waiting) {
    engine_status st = e->stop ? ENGINE_ERR_SHUTDOWN : ENGINE_ERR_QUEUE_FULL;
    pthread_mutex_unlock(&e->mu);
    h->refs = 1;
    engine_req_unref(h);
    *status = st;
    return errf(err, errlen,
                st == ENGINE_ERR_SHUTDOWN ? "the engine is shutting down"
                                          : "too many requests waiting"),
           NULL;
  }
  h->schema = o->schema; /* from here the handle owns it */
  if (e->in_tail)
    e->in_tail->qnext = h;
  else
    e->in_head = h;
  e->in_tail = h;
  e->n_in++;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  *status = ENGINE_OK;
  return h;
}

int engine_next(engine_req *h, engine_event *ev, int timeout_ms) {
  struct timespec until;
  if (timeout_ms >= 0) {
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
  }
  pthread_mutex_lock(&h->mu);
  while (h->n_pop == h->n_push) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&h->cv, &h->mu);
    } else if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT &&
               h->n_pop == h->n_push) {
      pthread_mutex_unlock(&h->mu);
      return 0;
    }
  }
  memset(ev, 0, sizeof *ev);
  int i = h->n_pop++;
  const engine_ev *x = &h->ring[i];
  int k = h->r.smp.p.top_logprobs;
  ev->token = x->token;
  ev->has_token = x->has_token;
  ev->logprob = x->logprob;
  ev->n_top = x->n_top;
  for (int j = 0; j < x->n_top; j++) {
    ev->top_ids[j] = h->top_ids[(size_t)i * k + j];
    ev->top_logprobs[j] = h->top_lps[(size_t)i * k + j];
  }
  ev->finish = x->finish;
  if (x->finish) {
    ev->prompt_tokens = h->prompt_tokens;
    ev->completion_tokens = h->completion_tokens;
    ev->cached_tokens = h->cached_tokens;
    snprintf(ev->err, sizeof ev->err, "%s", h->err);
  }
  pthread_mutex_unlock(&h->mu);
  return 1;
}

void engine_cancel(engine_req *h) {
  pthread_mutex_lock(&h->mu);
  int done = h->done;
  pthread_mutex_unlock(&h->mu);
  if (done) return;
  atomic_store(&h->cancel, 1);
  engine *e = h->e;
  pthread_mutex_lock(&e->mu);
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

void engine_release(engine_req *h) {
  if (!h) return;
  engine_cancel(h);
  engine_req_unref(h);
}

void engine_get_stats(engine *e, engine_stats *s) {
  pthread_mutex_lock(&e->mu);
  *s = e->st;
  pthread_mutex_unlock(&e->mu);
}

int engine_check(engine *e, char *err, size_t errlen) {
  pthread_mutex_lock(&e->mu);
  e->check_pending = 1;
  pthread_cond_broadcast(&e->cv);
  while (e->check_pending) pthread_cond_wait(&e->check_cv, &e->mu);
  int rc = e->check_rc;
  if (rc) errf(err, errlen, "%s", e->check_err);
  pthread_mutex_unlock(&e->mu);
  return rc;
}

const char *finish_reason_name(finish_reason f) {
  switch (f) {
    case FINISH_NONE:
      return "none";
    case FINISH_STOP:
      return "stop";
    case FINISH_LENGTH:
      return "length";
    case FINISH_CANCELLED:
      return "cancelled";
    case FINISH_ERROR:
      return "error";
  }
  return "unknown";
}
