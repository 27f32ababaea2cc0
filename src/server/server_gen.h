/* server_gen — one generation seen from an HTTP handler: submits the prompt to the engine,
 * turns token events into text (detok_stream: never half a UTF-8 character), applies stop
 * strings on the text (a match cancels the engine request and finishes with "stop"; the bytes
 * that could still start a stop string are held back from streaming), keeps the ids and
 * logprobs, and times TTFT / inter-token / end-to-end latency into metrics.
 *
 *   server_gen g;                     // owner: the handler
 *   server_gen_start(&g, &opts, ...)  // submit
 *   while (!g.done) server_gen_step(&g, 100);   // one event (or a timeout) at a time
 *   ... g.text, g.ids, g.toks, g.finish, usage counts ...
 *   server_gen_free(&g);              // releases the engine request (cancels if running)
 *
 * Without a tokenizer (tok == NULL) the text stays empty and stop strings are not allowed. */
#ifndef DS_SERVER_GEN_H
#define DS_SERVER_GEN_H
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/stop_match.h"
#include "base/strbuf.h"
#include "tokenizer/detok_stream.h"
#include "tokenizer/tokenizer.h"

typedef struct server_gen_opts {
  engine *eng;
  const tokenizer *tok; /* NULL: ids only */
  metrics *met;         /* may be NULL */
  const int32_t *prompt;
  int n_prompt;
  const int32_t *boundaries;
  int n_boundaries;
  const sampling_params *sp;
  const char *cache_salt;
  char *const *stop; /* stop strings (borrowed for the life of the gen) */
  int n_stop;
  int include_stop_str;
  int skip_special;
  const int32_t *eos_ids; /* the model's end tokens: their text is never shown */
  int n_eos;
  const json_vocab *json; /* response_format json_object: the engine's JSON mask (NULL: none) */
  json_schema *schema;    /* with json, response_format json_schema: taken by server_gen_start in
                             every case (handed to the engine, or freed) */
} server_gen_opts;

/* One generated token's logprob record (kept when sp.logprobs). */
typedef struct server_gen_token {
  int32_t id;
  float logprob;
  int n_top;
  int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
  float top_lps[ENGINE_MAX_TOP_LOGPROBS];
  size_t text_off; /* byte offset in text where this token's text starts */
} server_gen_token;

typedef struct server_gen {
  server_gen_opts o;
  engine_req *req;
  detok_stream *ds;
  strbuf text;       /* generated text, cut at a matched stop string */
  size_t scanned;    /* bytes of text fed to stops */
  stop_match *stops; /* the stop strings' matcher (NULL: none); owned */
  int32_t *ids;      /* generated ids [n_ids] */
  int n_ids, cap_ids;
  server_gen_token *toks; /* [n_ids] when sp.logprobs */
  int done;
  finish_reason finish;
  int stop_string_hit;
  const char *stop_hit; /* the stop string that matched (borrowed from o.stop), or NULL */
  int draining;         /* cancelled after a stop-string match; waiting for the final event */
  char err[160];
  int prompt_tokens, cached_tokens, completion_tokens;
  int spec_drafts, spec_draft_tokens, spec_accepted; /* engine_event's, from the final event */
  double t_submit, t_last;
  double t_first; /* the first token's event (valid when n_ids > 0) */
  int n_events;
} server_gen;

/* Submits. Returns 0, or -1 with *status (ENGINE_ERR_*) and err; nothing to free then. */
int server_gen_start(server_gen *g, const server_gen_opts *o, engine_status *status, char *err,
                     size_t errlen);
/* Waits up to timeout_ms for one engine event and applies it. Returns 1 when an event was
 * applied, 0 on timeout, -1 on out of memory (the request is then cancelled and finishes as
 * an error). Once g->done, returns 0 at once. */
int server_gen_step(server_gen *g, int timeout_ms);
/* How many bytes of text may be sent now (all of it once done). */
size_t server_gen_visible(const server_gen *g);
/* "stop", "length", "abort" or "error": the OpenAI finish_reason of a done generation. */
const char *server_gen_finish_name(const server_gen *g);
void server_gen_cancel(server_gen *g);
void server_gen_free(server_gen *g);

/* Seconds on a monotonic clock. */
double server_gen_now(void);

#endif
