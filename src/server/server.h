/* server — the OpenAI-compatible HTTP server (libmicrohttpd, one thread per connection).
 *
 * Connections: up to 8192 (fewer when the descriptor limit, raised to its hard limit, is
 * lower), at most 1024 from one address, each closed after 60 s without a byte either way,
 * each with 256 KiB of kernel send buffer. A stream silent for 15 s (a long prefill, a wait
 * in the queue) sends an SSE comment, a late body a newline, so that neither that timeout nor
 * a proxy's closes it. A connection costs a thread only once its first request head is
 * complete: until then http_gate holds it on one epoll thread, for 30 s at most. Thousands of
 * slow connections (a head sent a byte a second) leave /health and requests served.
 *
 *   POST /v1/chat/completions   POST /v1/completions   GET /v1/models
 *   POST /tokenize   POST /detokenize   GET /health   GET /metrics
 *
 * Life cycle:
 *   server_start       listener up at once; /health answers 503 while the model loads
 *   server_set_model   the engine and tokenizer are ready: /health 200, requests served
 *   server_shutdown    stop accepting; in-flight requests get `grace_s` to finish, then are
 *                      cancelled (streams end with an error event) and their answers get 2 s
 *                      more to go out; then every connection is closed, whatever the
 *                      clients do (one that stopped reading holds nothing)
 *   server_free
 * A handler talks to the engine only through server_gen (submit / next / cancel). A client
 * that disconnects is noticed between engine events and its request is cancelled: a reset
 * socket (POLLERR / POLLHUP) or a failed write. A client that only shut down its sending side
 * after the request (half-close, `nc -N`) still gets its answer: its FIN triggers probes (an
 * SSE comment line in a stream, an interim "HTTP/1.1 100 Continue" before a non-stream
 * response) that a fully closed client answers with a reset. HTTP/1.0 has no interim
 * response: after such a client's FIN its non-stream answer turns late, a 200 sent at once
 * whose body (ended by the close) starts with JSON whitespace sent as the probes, then the
 * JSON (a generation that fails after that puts its error JSON in that body).
 *
 * Errors: every error the server produces is the OpenAI JSON {"error": {"message", "type",
 * "param", "code"}} (code: a short string or null). The first request head of a connection
 * is checked by http_gate before libmicrohttpd reads it (a malformed request line or header
 * line, a Content-Length that is not a number or over 2^63 - 1, Content-Length with
 * Transfer-Encoding, a transfer coding other than chunked, an HTTP version other than 1.0 /
 * 1.1 (505), over 200 headers or 64 KiB of them (431)); then the head is checked before the
 * body: URL over 8 KiB (414), over 200 headers or 64 KiB of them (431), Content-Length
 * headers that disagree (400, connection closed: the framing is in doubt), more than one Host
 * or an HTTP/1.1 request without Host (400). What libmicrohttpd still refuses itself keeps its
 * own HTML body, since it offers no hook for it: bad chunked framing in a body (a chunk size
 * that is not hex or is negative), a head over 256 KiB, and framing errors in the second and
 * later requests of a kept-alive connection (the gate sees only the first). */
#ifndef DS_SERVER_H
#define DS_SERVER_H
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/generation_config.h"
#include "tokenizer/chat_jinja.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

typedef struct server server;

typedef struct server_opts {
  const char *host;                 /* "127.0.0.1" */
  int port;                         /* 0: any free port (see server_port) */
  const char *served_model_name;    /* the `model` clients must send (or leave out); the name
                                       responses report */
  const char *const *model_aliases; /* more names clients may send (--served-model-name's
                                       second and later values; borrowed) */
  int n_model_aliases;
  const char *model_path;      /* shown in /v1/models */
  const char *api_key;         /* NULL: no authentication */
  size_t max_request_bytes;    /* larger bodies get 413 */
  int metrics_require_api_key; /* with api_key: /metrics needs it too (default open, as vLLM) */
  int disable_log_requests;    /* no line per finished request (request_log) */
  double log_stats_interval_s; /* the periodic engine line's interval (stats_log); 0: off */
  const char *metrics_prefix;  /* --metrics-prefix: "deltaserve" (NULL) or "vllm" (metrics.h) */
  /* CORS, as vLLM's --allowed-origins / --allowed-methods / --allowed-headers /
   * --allow-credentials (borrowed; NULL: ["*"], vLLM's default). A browser's preflight
   * (OPTIONS with Origin and Access-Control-Request-Method) is answered before the API key
   * is asked for; a response to an allowed Origin carries Access-Control-Allow-Origin. */
  const char *const *cors_origins;
  int n_cors_origins;
  const char *const *cors_methods;
  int n_cors_methods;
  const char *const *cors_headers;
  int n_cors_headers;
  int cors_credentials;
  double gpu_memory_utilization; /* shown in /metrics cache_config_info */
  const char *kv_cache_dtype;    /* --kv-cache-dtype as given, the same (NULL: auto) */
} server_opts;

/* What serving needs from the loaded model; all borrowed, outliving the server's use. */
typedef struct server_model {
  engine *eng;
  const tokenizer *tok; /* NULL: token-id prompts only */
  chat_template_kind tmpl;
  const chat_jinja *chat; /* the model's chat template (NULL: tmpl, the built-in one) */
  int vocab_size;         /* rows of the model's embedding: prompt ids must be below */
  int max_model_len;
  const int32_t *eos_ids;
  int n_eos;
  const json_vocab *json;       /* response_format json_object's vocabulary (NULL: refused) */
  const generation_config *gen; /* defaults of the sampling fields a request leaves out
                                   (generation_config.json; NULL: none) */
} server_model;

/* Binds and starts the listener. Returns 0, or -1 with one line in err. */
int server_start(server **out, const server_opts *o, char *err, size_t errlen);
int server_port(const server *s);
void server_set_model(server *s, const server_model *m);
void server_shutdown(server *s, double grace_s);
void server_free(server *s);

#endif
