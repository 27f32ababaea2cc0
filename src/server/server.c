#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/anthropic_stream.h"
#include "server/http_gate.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/openai_stream.h"
#include "server/request_log.h"
#include "server/responses_request.h"
#include "server/responses_response.h"
#include "server/responses_stream.h"
#include "server/server_gen.h"
#include "server/stats_log.h"
#include "base/strbuf.h"
#include "base/version.h"
#include "tokenizer/chat_parse.h"
#include "sampler/tool_grammar.h"

/* ======================================================================================
 * State
 * ====================================================================================== */

/* Connections: one thread each (MHD's thread-per-connection mode) once http_gate has let their
 * first head through. A connection that sends or takes nothing for SERVER_IDLE_S is closed;
 * one address may hold at most SERVER_PER_ADDRESS connections; the total is bounded by
 * SERVER_MAX_CONNECTIONS and by the descriptors the process may open (server_start raises its
 * soft limit to the hard one). */
#define SERVER_IDLE_S 60
/* A stream or late body silent this long (a long prefill, a wait in the queue) sends a
 * keep-alive (an SSE comment, JSON whitespace): the idle timeout above, and a proxy's, would
 * close it. */
#define SERVER_KEEPALIVE_S 15.0
#define SERVER_PER_ADDRESS 1024
/* A request head (its first request on a connection, checked by http_gate before
 * libmicrohttpd sees it) must be complete this long after the connection opened. */
#define SERVER_HEAD_TIMEOUT_S 30.0
#define SERVER_MAX_CONNECTIONS 8192
#define SERVER_FD_RESERVE 256 /* descriptors left for model files, logs, the engine */
/* After the grace and the cancel, how long answers may still drain before every connection is
 * closed: a client that stopped reading cannot hold the shutdown. */
#define SERVER_DRAIN_S 2.0
/* A connection's kernel send buffer (the kernel doubles it): bounds what a client that stops
 * reading holds in kernel memory, instead of the send buffer growing to tcp_wmem's maximum. */
#define SERVER_SNDBUF (128 << 10)

typedef struct conn conn;

struct server {
  server_opts o; /* strings below are owned copies */
  char *host, *name, *path, *api_key;
  struct MHD_Daemon *d;
  http_gate *gate; /* the listener; hands well-framed connections to d */
  int port;
  atomic_int ready, stopping;
  server_model m; /* valid once ready */
  metrics *met;
  stats_log *stats;   /* the periodic engine line (NULL: off, or not ready) */
  pthread_mutex_t mu; /* guards the active list */
  conn *active;       /* connections with a live generation */
  int n_active;
  long long created;
};

enum { STREAM_FIRST, STREAM_RUNNING, STREAM_DONE };

/* One choice of a request: its generation, its sampling parameters (the request's, the seed
 * offset by the choice's index) and what of it a stream has sent. */
/* One encoded prompt of a request: its ids and, with echo, its text. */
typedef struct prompt_part {
  int32_t *ids;
  int n;
  char *echo;
  size_t echo_len;
} prompt_part;

typedef struct choice {
  server_gen g;
  int have_gen;
  sampling_params sp;
  openai_stream st; /* chat streams */
  int have_st;
  size_t sent_text; /* completions: bytes of g.text sent */
  int sent_toks;    /* tokens whose ids / logprobs were sent */
  int finished;     /* a stream sent its finish_reason */
} choice;

/* One HTTP request (MHD's per-request context). Owner: MHD, freed in on_completed. */
struct conn {
  server *s;
  struct MHD_Connection *mc;
  int fd;
  strbuf body;
  int too_large;
  /* generation: the request's choices (req.n of them, each its own engine request) */
  openai_request req;
  int have_req;
  choice *ch; /* [n_ch] */
  int n_ch;   /* choices submitted */
  int thinking_open;
  int32_t *prompt_ids; /* owned */
  int n_prompt;
  /* completions' second and later prompts, encoded (owned; prompt 0 is prompt_ids / echo) */
  struct prompt_part *more;
  int n_more;
  int32_t *bounds; /* owned */
  int n_bounds;
  char *echo;            /* completions echo text (owned) */
  responses_request *rr; /* /v1/responses: the request translated (owned; NULL otherwise) */
  responses_stream *rs;  /* /v1/responses streams (owned) */
  int anthropic;         /* /v1/messages*: Anthropic shapes (errors, answer, stream) */
  anthropic_stream *as;  /* /v1/messages streams (owned) */
  size_t echo_len;
  char id[64];
  long long created;
  /* streaming */
  strbuf out;        /* SSE bytes not yet handed to MHD */
  int phase;         /* STREAM_* */
  conn *next, *prev; /* in s->active */
  int registered;
  /* disconnect detection (see client_gone) */
  int http11;     /* the request is HTTP/1.1: a 1xx interim response may be sent */
  int peer_eof;   /* the client has shut down its sending side */
  int probe_due;  /* send a probe now (bytes that make a closed peer answer RST) */
  int late;       /* an HTTP/1.0 non-stream answer sent as a late body */
  char *captured; /* late: the answer's body, taken from send_body (owned) */
  size_t captured_len;
  int capture;                  /* send_body keeps the body in captured instead of queuing */
  double last_out;              /* a stream / late body: when its reader last gave bytes */
  double next_probe, probe_gap; /* when the next probe is due after peer_eof; the gap grows */
  /* the request's log line (request_log) */
  double t_start; /* the head arrived (server_gen_now) */
  int status;     /* the HTTP status queued (0: none) */
  char method[8];
  char route[128]; /* the URL path, cut */
};

/* ======================================================================================
 * Small helpers
 * ====================================================================================== */

static int ct_equal(const char *given, const char *key) {
  size_t lg = strlen(given), lk = strlen(key);
  volatile unsigned char d = (unsigned char)(lg != lk);
  for (size_t i = 0; i < lk; i++)
    d |= (unsigned char)((i < lg ? (unsigned char)given[i] : 0) ^ (unsigned char)key[i]);
  return d == 0;
}

/* Has the client gone away? Asked between engine events.
 *
 * A client that sent its request and then shut down its sending side (shutdown(SHUT_WR),
 * `nc -N`) still reads: the FIN it sent looks exactly like the one a closing client sends. The
 * two differ only once we send something: a closed socket answers data with RST, which shows
 * here as POLLERR / POLLHUP. So once the client's input has ended (POLLRDHUP) we probe: at
 * once, then at growing gaps (0.25 s doubling to 2 s), since a half-closed client may still
 * close later. The stream path sends an SSE comment line through MHD (": \n\n", which SSE
 * readers skip) when it has no data to send anyway; the non-stream path, still before its
 * response, writes an interim "HTTP/1.1 100 Continue" (RFC 9110 15.2: clients must skip
 * unexpected 1xx responses; never to HTTP/1.0 clients, whose FIN therefore cancels nothing:
 * their request runs to its end). A failed write ends a stream through MHD, and on_completed
 * cancels the generation. */
static int client_gone(conn *cx) {
  if (cx->fd < 0) return 0;
  struct pollfd pf = {.fd = cx->fd, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (poll(&pf, 1, 0) <= 0) return 0;
  if (pf.revents & (POLLERR | POLLHUP | POLLNVAL)) return 1;
  if (!(pf.revents & POLLRDHUP)) return 0;
  double now = server_gen_now();
  if (!cx->peer_eof) {
    cx->peer_eof = 1;
    cx->next_probe = now;
    cx->probe_gap = 0.25;
  }
  if (now >= cx->next_probe) {
    cx->probe_due = 1;
    cx->next_probe = now + cx->probe_gap;
    cx->probe_gap = cx->probe_gap * 2 > 2.0 ? 2.0 : cx->probe_gap * 2;
  }
  return 0;
}

/* The non-stream probe: an interim 100 response written straight to the socket (MHD writes
 * nothing on this connection while the handler runs). */
static void probe_interim(conn *cx) {
  if (!cx->probe_due) return;
  cx->probe_due = 0;
  if (!cx->http11 || cx->fd < 0) return;
  static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
  size_t off = 0;
  for (int tries = 0; off < sizeof msg - 1 && tries < 50; tries++) {
    ssize_t n = send(cx->fd, msg + off, sizeof msg - 1 - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      struct pollfd pf = {.fd = cx->fd, .events = POLLOUT, .revents = 0};
      poll(&pf, 1, 20);
    } else {
      return; /* the failure shows as POLLERR / POLLHUP at the next check */
    }
  }
}

static void active_add(server *s, conn *cx) {
  pthread_mutex_lock(&s->mu);
  cx->next = s->active;
  cx->prev = NULL;
  if (s->active) s->active->prev = cx;
  s->active = cx;
  s->n_active++;
  cx->registered = 1;
  pthread_mutex_unlock(&s->mu);
}

static void active_remove(server *s, conn *cx) {
  pthread_mutex_lock(&s->mu);
  if (cx->registered) {
    if (cx->prev)
      cx->prev->next = cx->next;
    else
      s->active = cx->next;
    if (cx->next) cx->next->prev = cx->prev;
    s->n_active--;
    cx->registered = 0;
  }
  pthread_mutex_unlock(&s->mu);
}

/* ---- CORS (server_opts.cors_*, as Starlette's CORSMiddleware answers for vLLM) ---- */

/* Is v in list[n] (case-insensitively when nocase), or is "*" there, or is there no list
 * (NULL: vLLM's default ["*"]; an empty list allows nothing)? */
static int cors_listed(const char *const *list, int n, const char *v, size_t vl, int nocase) {
  if (!list) return 1;
  for (int i = 0; i < n; i++) {
    if (!strcmp(list[i], "*")) return 1;
    if (strlen(list[i]) == vl && (nocase ? !strncasecmp(list[i], v, vl) : !strncmp(list[i], v, vl)))
      return 1;
  }
  return 0;
}

static int cors_all(const char *const *list, int n) { return cors_listed(list, n, "*", 1, 0); }

/* The Access-Control-Allow-Origin / -Credentials / Vary headers for a request from origin. */
static void cors_origin_headers(const server *s, struct MHD_Response *r, const char *origin) {
  int any = cors_all(s->o.cors_origins, s->o.n_cors_origins);
  /* a wildcard is not valid with credentials: the origin itself is echoed then */
  MHD_add_response_header(r, "Access-Control-Allow-Origin",
                          any && !s->o.cors_credentials ? "*" : origin);
  if (s->o.cors_credentials) MHD_add_response_header(r, "Access-Control-Allow-Credentials", "true");
  if (!any || s->o.cors_credentials) MHD_add_response_header(r, "Vary", "Origin");
}

/* Adds the CORS headers to a response when the request came from an allowed Origin. */
static void cors_add(conn *cx, struct MHD_Response *r) {
  const char *origin = MHD_lookup_connection_value(cx->mc, MHD_HEADER_KIND, "Origin");
  if (!origin) return;
  const server *s = cx->s;
  if (!cors_listed(s->o.cors_origins, s->o.n_cors_origins, origin, strlen(origin), 0)) return;
  cors_origin_headers(s, r, origin);
}

static enum MHD_Result send_body(conn *cx, unsigned status, const char *ctype, char *body,
                                 size_t len, const char *hname, const char *hval) {
  if (cx->capture) { /* a late body: its status line is already sent */
    free(cx->captured);
    cx->captured = body;
    cx->captured_len = body ? len : 0;
    return body ? MHD_YES : MHD_NO;
  }
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  cx->status = (int)status;
  MHD_add_response_header(r, "Content-Type", ctype);
  if (hname) MHD_add_response_header(r, hname, hval);
  cors_add(cx, r);
  enum MHD_Result ret = MHD_queue_response(cx->mc, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result send_json(conn *cx, unsigned status, json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!s) {
    s = strdup(
        "{\"error\":{\"message\":\"out of "
        "memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    if (!s) return MHD_NO;
    status = 500;
  }
  return send_body(cx, status, "application/json", s, strlen(s), NULL, NULL);
}

static enum MHD_Result send_error(conn *cx, const openai_error *e) {
  openai_error re; /* a /v1/responses error names the Responses field */
  if (cx->rr) re = *e, responses_request_error_param(&re), e = &re;
  metrics_request_rejected(cx->s->met, e->status);
  char *b = cx->anthropic ? anthropic_response_error_body(e) : openai_response_error_body(e);
  if (!b) return MHD_NO;
  const char *hn = NULL, *hv = NULL;
  if (e->status == 429)
    hn = "Retry-After", hv = "1";
  else if (e->status == 401)
    hn = "WWW-Authenticate", hv = "Bearer";
  return send_body(cx, (unsigned)e->status, "application/json", b, strlen(b), hn, hv);
}

static enum MHD_Result fail(conn *cx, int status, const char *type, const char *param,
                            const char *msg) {
  openai_error e;
  openai_error_set(&e, status, type, param, "%s", msg);
  return send_error(cx, &e);
}

/* Is name one of the served names (the first, or an alias)? */
static int model_served(const server *s, const char *name) {
  if (!strcmp(name, s->name)) return 1;
  for (int i = 0; i < s->o.n_model_aliases; i++)
    if (!strcmp(name, s->o.model_aliases[i])) return 1;
  return 0;
}

static int model_ok(server *s, const char *model, openai_error *e) {
  if (!model || model_served(s, model)) return 0;
  openai_error_set(e, 404, "NotFoundError", "model", "The model `%s` does not exist.", model);
  e->code = "model_not_found";
  return -1;
}

/* Decodes one token as raw bytes (for logprobs); "" without a tokenizer or for an id the
 * tokenizer has no text for (a model row beyond its vocabulary). */
static char *token_bytes(server *s, int32_t id, size_t *len) {
  char *out = NULL;
  long n = s->m.tok ? tokenizer_decode(s->m.tok, &id, 1, 0, &out) : -1;
  if (n < 0) {
    free(out);
    out = strdup("");
    n = 0;
  }
  *len = (size_t)n;
  return out;
}

/* ======================================================================================
 * Prompt preparation
 * ====================================================================================== */

/* Encodes each turn of a rendered chat separately (every turn starts with the special token
 * <|im_start|>, so the concatenation equals encoding the whole) and records where each turn
 * starts in tokens: the prefix cache's capture points. */
static int encode_turns(const tokenizer *tok, const chat_render *cr, int32_t **ids, int *n,
                        int32_t **bounds, int *nb, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  *bounds = NULL;
  *nb = 0;
  size_t nseg = (size_t)cr->n_msgs + 1;
  size_t *cut = malloc(sizeof *cut * (nseg + 1));
  int32_t *b = malloc(sizeof *b * (nseg + 1));
  if (!cut || !b) goto oom;
  size_t k = 0;
  cut[k++] = 0;
  int monotone = 1;
  for (int i = 0; i < cr->n_msgs; i++) {
    size_t off = cr->msg_offsets[i];
    if (off > cr->len || off < cut[k - 1])
      monotone = 0;
    else if (off > cut[k - 1])
      cut[k++] = off;
  }
  if (!monotone) k = 1;
  cut[k] = cr->len;
  strbuf acc;
  strbuf_init(&acc);
  int nbo = 0;
  for (size_t i = 0; i < k; i++) {
    if (cut[i + 1] <= cut[i]) continue;
    if (i > 0) b[nbo++] = (int32_t)(acc.len / sizeof(int32_t));
    int32_t *seg = NULL;
    int m = tokenizer_encode(tok, cr->text + cut[i], cut[i + 1] - cut[i], &seg, err, errlen);
    if (m < 0) {
      strbuf_free(&acc);
      free(cut);
      free(b);
      return m; /* -1 bad input, TOKENIZER_ENOMEM */
    }
    strbuf_append(&acc, seg, sizeof *seg * (size_t)m);
    free(seg);
  }
  free(cut);
  if (acc.oom) {
    strbuf_free(&acc);
    free(b);
    goto oom2;
  }
  *n = (int)(acc.len / sizeof(int32_t));
  *ids = (int32_t *)strbuf_take(&acc);
  *bounds = b;
  *nb = nbo;
  return 0;
oom:
  free(cut);
  free(b);
oom2:
  snprintf(err, errlen, "out of memory");
  return TOKENIZER_ENOMEM;
}

static int no_tokenizer(openai_error *e) {
  return openai_error_set(e, 400, "invalid_request_error", NULL,
                          "this model was loaded without a tokenizer: only /v1/completions with "
                          "token-id prompts is available");
}

/* truncate_prompt_tokens (vLLM's): the last k of n ids kept (-1: the model's length); the
 * count dropped from the front, 0 when none. */
static int truncate_drop(const conn *cx, int n) {
  int k = cx->req.truncate_prompt_tokens;
  if (k < 0) k = cx->s->m.max_model_len;
  return k > 0 && n > k ? n - k : 0;
}

static int prepare_chat(conn *cx, openai_error *e) {
  server *s = cx->s;
  if (!s->m.tok) return no_tokenizer(e);
  chat_render cr;
  memset(&cr, 0, sizeof cr);
  char err[300];
  err[0] = 0;
  if (chat_jinja_render(s->m.chat, s->m.tmpl, cx->req.render, cx->req.add_generation_prompt, &cr,
                        err, sizeof err))
    return openai_error_set(e, 400, "invalid_request_error", "messages", "%s",
                            err[0] ? err : "the messages could not be rendered");
  /* a json_object output is never reasoning: the mask admits no think tags (forced tool calls
   * may follow a think block the prompt left open: their grammar is told) */
  cx->thinking_open = (!cx->req.json_object || cx->req.tool_forced) &&
                      (cr.thinking_open || openai_stream_prompt_thinking_open(cr.text, cr.len));
  if (cx->req.tool_forced) {
    /* the format the rendered tools section asks for: Qwen3's JSON calls, Qwen3.5 / 3.6 and
     * Qwen3-Coder's XML calls, or else refused */
    int json =
        strstr(cr.text, "{\"name\": <function-name>, \"arguments\": <args-json-object>}") != NULL;
    int xml = !json && strstr(cr.text, "<tool_call>\n<function=example_function_name>") != NULL;
    const char *why = NULL;
    if (!json && !xml && cx->req.tool_choice != OPENAI_TOOL_CHOICE_AUTO) /* auto: any form */
      why =
          "tool_choice \"required\" / a named tool is enforced for the Qwen3 JSON and the "
          "Qwen3.5 / 3.6 XML tool-call formats; this model's template asks for neither: use "
          "tool_choice \"auto\"";
    else if (xml && tool_grammar_xml(cx->req.schema, cx->req.tools, cx->req.tool_choice_name, err,
                                     sizeof err))
      why = err;
    if (why) {
      chat_render_free(&cr);
      if (why == err && !strcmp(err, "out of memory"))
        return openai_error_set(e, 503, "server_error", NULL, "out of memory");
      return openai_error_set(e, 400, "invalid_request_error", "tool_choice", "%s", why);
    }
    tool_grammar_think(cx->req.schema, cx->thinking_open);
  }
  int rc = encode_turns(s->m.tok, &cr, &cx->prompt_ids, &cx->n_prompt, &cx->bounds, &cx->n_bounds,
                        err, sizeof err);
  chat_render_free(&cr);
  if (rc == TOKENIZER_ENOMEM) return openai_error_set(e, 503, "server_error", NULL, "%s", err);
  if (rc) return openai_error_set(e, 400, "invalid_request_error", "messages", "%s", err);
  int drop = truncate_drop(cx, cx->n_prompt);
  if (drop) { /* the rendered prompt's last tokens; the message starts shift with them */
    memmove(cx->prompt_ids, cx->prompt_ids + drop, sizeof(int32_t) * (size_t)(cx->n_prompt - drop));
    cx->n_prompt -= drop;
    int nb = 0;
    for (int i = 0; i < cx->n_bounds; i++)
      if (cx->bounds[i] > drop) cx->bounds[nb++] = cx->bounds[i] - drop;
    cx->n_bounds = nb;
  }
  return 0;
}

/* The echo of ids: their text (ids that are model rows beyond the tokenizer's vocabulary have
 * none: they echo as ""). */
static int echo_ids(server *s, const openai_request *r, const int32_t *ids, int n, prompt_part *p,
                    openai_error *e) {
  int tv = tokenizer_vocab_size(s->m.tok), m = 0;
  int32_t *known = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (!known) return openai_error_set(e, 500, "server_error", NULL, "out of memory");
  for (int i = 0; i < n; i++)
    if (ids[i] < tv) known[m++] = ids[i];
  long len = m ? tokenizer_decode(s->m.tok, known, m, r->skip_special_tokens, &p->echo) : 0;
  free(known);
  if (len < 0) {
    free(p->echo);
    p->echo = NULL;
    return openai_error_set(e, 400, "invalid_request_error", "prompt",
                            "the prompt ids cannot be decoded for echo");
  }
  if (!p->echo) p->echo = strdup("");
  if (!p->echo) return openai_error_set(e, 500, "server_error", NULL, "out of memory");
  p->echo_len = (size_t)len;
  return 0;
}

/* One completions prompt encoded into p (ids checked against the vocabulary, truncated by
 * truncate_prompt_tokens, the echo text kept when echo is on). */
static int prepare_prompt(conn *cx, const openai_prompt *q, prompt_part *p, openai_error *e) {
  server *s = cx->s;
  openai_request *r = &cx->req;
  char err[300];
  if (q->text) {
    if (!s->m.tok) return no_tokenizer(e);
    int n = tokenizer_encode(s->m.tok, q->text, q->len, &p->ids, err, sizeof err);
    if (n == TOKENIZER_ENOMEM) return openai_error_set(e, 503, "server_error", NULL, "%s", err);
    if (n < 0) return openai_error_set(e, 400, "invalid_request_error", "prompt", "%s", err);
    p->n = n;
    if (n == 0)
      return openai_error_set(e, 400, "invalid_request_error", "prompt",
                              "the prompt encodes to no tokens");
  } else {
    p->ids = malloc(sizeof(int32_t) * (size_t)q->n_ids);
    if (!p->ids) return openai_error_set(e, 500, "server_error", NULL, "out of memory");
    memcpy(p->ids, q->ids, sizeof(int32_t) * (size_t)q->n_ids);
    p->n = q->n_ids;
    for (int i = 0; i < p->n; i++)
      if (p->ids[i] >= s->m.vocab_size)
        return openai_error_set(e, 400, "invalid_request_error", "prompt",
                                "token id %d at position %d is out of vocabulary (size %d)",
                                p->ids[i], i, s->m.vocab_size);
  }
  int drop = truncate_drop(cx, p->n);
  if (drop) {
    memmove(p->ids, p->ids + drop, sizeof(int32_t) * (size_t)(p->n - drop));
    p->n -= drop;
  }
  if (!r->echo) return 0;
  if (q->text && !drop) { /* the text as sent */
    p->echo = malloc(q->len + 1);
    if (!p->echo) return openai_error_set(e, 500, "server_error", NULL, "out of memory");
    memcpy(p->echo, q->text, q->len + 1);
    p->echo_len = q->len;
    return 0;
  }
  return s->m.tok ? echo_ids(s, r, p->ids, p->n, p, e) : 0; /* the prompt as it was served */
}

static int prepare_completion(conn *cx, openai_error *e) {
  openai_request *r = &cx->req;
  openai_prompt q0 = {r->prompt, r->prompt_len, r->prompt_ids, r->n_prompt_ids};
  prompt_part p0;
  memset(&p0, 0, sizeof p0);
  int rc = prepare_prompt(cx, &q0, &p0, e);
  cx->prompt_ids = p0.ids;
  cx->n_prompt = p0.n;
  cx->echo = p0.echo;
  cx->echo_len = p0.echo_len;
  if (rc || r->n_more_prompts == 0) return rc;
  cx->more = calloc((size_t)r->n_more_prompts, sizeof *cx->more);
  if (!cx->more) return openai_error_set(e, 500, "server_error", NULL, "out of memory");
  cx->n_more = r->n_more_prompts;
  for (int k = 0; k < r->n_more_prompts; k++)
    if (prepare_prompt(cx, &r->more_prompts[k], &cx->more[k], e)) return -1;
  return 0;
}

/* The prompt of choice i: prompt i / n of the request (0 for chat). */
static prompt_part part_of(const conn *cx, int i) {
  int n = cx->req.n > 0 ? cx->req.n : 1, p = i / n;
  if (p > 0 && p <= cx->n_more) return cx->more[p - 1];
  prompt_part p0 = {cx->prompt_ids, cx->n_prompt, cx->echo, cx->echo_len};
  return p0;
}

/* The request field a sampler message is about (its messages start with the field's name). */
static const char *sampler_param_of(const char *msg) {
  static const char *const names[] = {"temperature",
                                      "top_p",
                                      "top_k",
                                      "min_p",
                                      "repetition_penalty",
                                      "presence_penalty",
                                      "frequency_penalty",
                                      "max_tokens",
                                      "min_tokens",
                                      "top_logprobs",
                                      "seed"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    size_t n = strlen(names[i]);
    if (!strncmp(msg, names[i], n) && (msg[n] == ' ' || msg[n] == ':' || msg[n] == 0))
      return names[i];
  }
  if (strstr(msg, "stop token ids")) return "stop_token_ids";
  return NULL;
}

/* Checks what needs the model and fills sp.max_tokens; the model's generation config fills
 * the sampling fields the request left out. */
static int check_limits(conn *cx, openai_error *e) {
  server *s = cx->s;
  openai_request *r = &cx->req;
  if (s->m.gen) generation_config_apply(s->m.gen, r->sp_set, &r->sp);
  int mml = s->m.max_model_len;
  int longest = cx->n_prompt; /* of several prompts, the longest decides (the default max_tokens
                                 is each prompt's own: handle_generate) */
  for (int k = 0; k < cx->n_more; k++)
    if (cx->more[k].n > longest) longest = cx->more[k].n;
  if (longest >= mml)
    return openai_error_set(
        e, 400, "invalid_request_error", r->kind == OPENAI_KIND_CHAT ? "messages" : "prompt",
        "This model's maximum context length is %d tokens. However, your request has %d "
        "input tokens. Please reduce the length of the input.",
        mml, longest);
  int avail = mml - longest;
  if (r->max_tokens > 0) {
    if (r->max_tokens > avail)
      return openai_error_set(
          e, 400, "invalid_request_error", "max_tokens",
          "This model's maximum context length is %d tokens. However, you requested %lld "
          "tokens (%d in the input, %d in the completion). Please reduce the length of the "
          "input or the completion.",
          mml, (long long)longest + r->max_tokens, longest, r->max_tokens);
    r->sp.max_tokens = r->max_tokens;
  } else {
    r->sp.max_tokens = s->m.gen ? generation_config_max_tokens(s->m.gen, avail) : avail;
  }
  if (openai_request_check_logprobs(r, r->sp.max_tokens, e)) return -1;
  for (int i = 0; i < r->sp.n_stop_ids; i++)
    if (r->sp.stop_ids[i] >= s->m.vocab_size)
      return openai_error_set(e, 400, "invalid_request_error", "stop_token_ids",
                              "stop token id %d is out of vocabulary (size %d)", r->sp.stop_ids[i],
                              s->m.vocab_size);
  for (int i = 0; i < r->sp.n_bias; i++)
    if (r->sp.bias_ids[i] >= s->m.vocab_size)
      return openai_error_set(e, 400, "invalid_request_error", "logit_bias",
                              "logit_bias token id %d is out of vocabulary (size %d)",
                              r->sp.bias_ids[i], s->m.vocab_size);
  if (r->n_stop > 0 && !s->m.tok)
    return openai_error_set(e, 400, "invalid_request_error", "stop",
                            "stop strings need a tokenizer; this model was loaded without one");
  char err[200] = "";
  if (sampling_params_validate(&r->sp, err, sizeof err))
    return openai_error_set(e, 400, "invalid_request_error", sampler_param_of(err), "%s",
                            err[0] ? err : "invalid sampling parameters");
  return 0;
}

/* ======================================================================================
 * Responses
 * ====================================================================================== */

/* The name logprobs give a token: its text, or "token_id:N" (as vLLM names tokens by id) when
 * it has no text. */
static json_t *token_name(int32_t id, const char *bytes, size_t len) {
  if (len > 0) return openai_response_string(bytes, len);
  char b[32];
  snprintf(b, sizeof b, "token_id:%d", (int)id);
  return json_string(b);
}

static json_t *chat_logprobs(server *s, const server_gen *g, int from, int to) {
  json_t *content = json_array();
  for (int i = from; content && i < to; i++) {
    const server_gen_token *t = &g->toks[i];
    size_t len;
    char *tok = token_bytes(s, t->id, &len);
    const char *tops[ENGINE_MAX_TOP_LOGPROBS];
    size_t lens[ENGINE_MAX_TOP_LOGPROBS];
    char *owned[ENGINE_MAX_TOP_LOGPROBS];
    for (int k = 0; k < t->n_top; k++)
      owned[k] = token_bytes(s, t->top_ids[k], &lens[k]), tops[k] = owned[k] ? owned[k] : "";
    json_t *e = openai_response_chat_logprob(tok ? tok : "", tok ? len : 0, t->logprob, tops, lens,
                                             t->top_lps, t->n_top);
    /* a token without text is named by its id ("bytes" stays the empty truth) */
    if (e && (!tok || len == 0)) json_object_set_new(e, "token", token_name(t->id, "", 0));
    json_t *te = json_object_get(e, "top_logprobs");
    for (int k = 0; e && te && k < t->n_top; k++)
      if (lens[k] == 0)
        json_object_set_new(json_array_get(te, (size_t)k), "token",
                            token_name(t->top_ids[k], "", 0));
    json_array_append_new(content, e);
    for (int k = 0; k < t->n_top; k++) free(owned[k]);
    free(tok);
  }
  return json_pack("{s:o}", "content", content ? content : json_array());
}

static json_t *completion_logprobs(server *s, const server_gen *g, int from, int to,
                                   size_t base_off) {
  json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
  for (int i = from; i < to; i++) {
    const server_gen_token *t = &g->toks[i];
    size_t len;
    char *tok = token_bytes(s, t->id, &len);
    json_array_append_new(tokens, token_name(t->id, tok ? tok : "", tok ? len : 0));
    free(tok);
    json_array_append_new(lps, json_real(t->logprob < -9999.0f ? -9999.0 : t->logprob));
    json_t *top = json_object();
    for (int k = 0; k < t->n_top; k++) {
      char *tt = token_bytes(s, t->top_ids[k], &len);
      json_t *key = token_name(t->top_ids[k], tt ? tt : "", tt ? len : 0);
      /* keys never collide: a second token with the same text (two partial UTF-8 pieces both
       * shown as U+FFFD, say) is named by its id */
      if (key && json_object_get(top, json_string_value(key))) {
        json_decref(key);
        key = token_name(t->top_ids[k], "", 0);
      }
      if (key)
        json_object_set_new(top, json_string_value(key),
                            json_real(t->top_lps[k] < -9999.0f ? -9999.0 : t->top_lps[k]));
      json_decref(key);
      free(tt);
    }
    json_array_append_new(tops, top);
    json_array_append_new(offs, json_integer((json_int_t)(base_off + t->text_off)));
  }
  return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                   tops, "text_offset", offs);
}

static json_t *ids_array(const int32_t *ids, int n) {
  json_t *a = json_array();
  for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
  return a;
}

/* Usage of the whole request: the prompt once (choice 0's count and cached share), the
 * completion tokens of every choice. */
/* Each prompt's tokens counted once (by its first choice), every choice's completion. */
static json_t *usage_of(const conn *cx) {
  int completion = 0, prompt = 0, cached = 0, n_per = cx->req.n > 0 ? cx->req.n : 1;
  for (int i = 0; i < cx->n_ch; i++) {
    completion += cx->ch[i].g.completion_tokens;
    if (i % n_per == 0) {
      prompt += cx->ch[i].g.prompt_tokens;
      cached += cx->ch[i].g.cached_tokens;
    }
  }
  return openai_response_usage(prompt, completion, cached);
}

/* stream_options.continuous_usage_stats: choice i's usage so far, on each of its chunks. */
static void chunk_usage(conn *cx, json_t *o, int i, int tokens) {
  if (!cx->req.include_usage || !cx->req.continuous_usage) return;
  const server_gen *g = &cx->ch[i].g;
  json_object_set_new(o, "usage", openai_response_usage(g->prompt_tokens, tokens, 0));
  json_object_del(json_object_get(o, "usage"), "prompt_tokens_details");
}

/* The final error of a generation that did not complete, or 0. */
static int gen_error_of(const conn *cx, const server_gen *g, openai_error *e) {
  if (g->finish == FINISH_ERROR)
    return openai_error_set(e, 500, "server_error", NULL, "generation failed: %s", g->err);
  if (g->finish == FINISH_CANCELLED)
    return openai_error_set(e, 503, "server_error", NULL,
                            atomic_load(&cx->s->stopping) ? "the server is shutting down"
                                                          : "the request was cancelled");
  return 0;
}

/* The first failed choice's error, or 0. */
static int gen_error(const conn *cx, openai_error *e) {
  for (int i = 0; i < cx->n_ch; i++)
    if (cx->ch[i].g.done && gen_error_of(cx, &cx->ch[i].g, e)) return -1;
  return 0;
}

static int all_done(const conn *cx) {
  for (int i = 0; i < cx->n_ch; i++)
    if (!cx->ch[i].g.done) return 0;
  return 1;
}

static void cancel_all(conn *cx) {
  for (int i = 0; i < cx->n_ch; i++)
    if (cx->ch[i].have_gen) server_gen_cancel(&cx->ch[i].g);
}

/* One engine event of any choice (server_gen_step's result): with one choice its step; with
 * several, every unfinished choice's events that are there, else a short wait on the first
 * unfinished one (so no choice waits long behind another). */
static int conn_step(conn *cx, int timeout_ms) {
  if (cx->n_ch == 1) return server_gen_step(&cx->ch[0].g, timeout_ms);
  int got = 0, first = -1;
  for (int i = 0; i < cx->n_ch; i++) {
    if (cx->ch[i].g.done) continue;
    if (first < 0) first = i;
    int r = server_gen_step(&cx->ch[i].g, 0);
    if (r < 0)
      got = -1;
    else if (r > 0 && got == 0)
      got = 1;
  }
  if (got || first < 0) return got;
  return server_gen_step(&cx->ch[first].g, timeout_ms < 5 ? timeout_ms : 5);
}

static json_t *chat_choice(conn *cx, int i) {
  const server_gen *g = &cx->ch[i].g;
  chat_parsed p;
  memset(&p, 0, sizeof p);
  if (chat_parse(g->text.data ? g->text.data : "", cx->thinking_open, cx->req.tools, &p))
    return NULL;
  int has_calls = p.tool_calls && json_array_size(p.tool_calls) > 0;
  json_t *msg = json_object();
  json_object_set_new(msg, "role", json_string("assistant"));
  if (p.content && (p.content[0] || !has_calls))
    json_object_set_new(msg, "content", openai_response_string(p.content, strlen(p.content)));
  else
    json_object_set_new(msg, "content", json_null());
  json_object_set_new(msg, "reasoning_content",
                      p.reasoning_content
                          ? openai_response_string(p.reasoning_content, strlen(p.reasoning_content))
                          : json_null());
  if (has_calls)
    json_object_set_new(msg, "tool_calls",
                        json_incref(p.tool_calls)); /* OpenAI omits it when none */
  const char *fr = server_gen_finish_name(g);
  if (has_calls && !strcmp(fr, "stop")) fr = "tool_calls";
  json_t *choice = json_object();
  json_object_set_new(choice, "index", json_integer(i));
  json_object_set_new(choice, "message", msg);
  json_object_set_new(choice, "finish_reason", json_string(fr));
  json_object_set_new(choice, "stop_reason", json_null());
  chat_parsed_free(&p);
  return choice;
}

/* The per-token fields of choice i ("logprobs", "token_ids"), written as text after the
 * fields of its tree, and the choice's closing brace. */
static void put_token_fields(conn *cx, int i, strbuf *b) {
  const server_gen *g = &cx->ch[i].g;
  strbuf_puts(b, ",\"logprobs\":");
  if (!cx->req.logprobs)
    strbuf_puts(b, "null");
  else if (cx->req.kind == OPENAI_KIND_CHAT)
    openai_response_put_chat_logprobs(b, cx->s->m.tok, g->toks, 0, g->n_ids);
  else
    openai_response_put_completion_logprobs(b, cx->s->m.tok, g->toks, 0, g->n_ids,
                                            part_of(cx, i).echo_len);
  if (cx->req.return_token_ids) {
    strbuf_puts(b, ",\"token_ids\":");
    openai_response_put_ids(b, g->ids, g->n_ids);
  }
  strbuf_puts(b, "}");
}

/* A non-streamed body, written as text choice by choice: only one choice's message is ever a
 * tree, the per-token fields never are (as trees they take many times the bytes sent). */
static enum MHD_Result respond_body(conn *cx, json_t *(*choice_of)(conn *, int)) {
  server *s = cx->s;
  openai_error e;
  if (gen_error(cx, &e)) return send_error(cx, &e);
  int chat = cx->req.kind == OPENAI_KIND_CHAT;
  strbuf b;
  strbuf_init(&b);
  json_t *o = openai_response_object(cx->id, chat ? "chat.completion" : "text_completion",
                                     cx->created, s->name);
  json_object_del(o, "choices");
  openai_response_put_open(&b, o);
  json_decref(o);
  strbuf_puts(&b, ",\"choices\":[");
  for (int i = 0; i < cx->n_ch && !b.oom; i++) {
    json_t *c = choice_of(cx, i);
    if (i) strbuf_puts(&b, ",");
    if (!c || openai_response_put_open(&b, c)) b.oom = 1;
    json_decref(c);
    put_token_fields(cx, i, &b);
  }
  strbuf_puts(&b, "],\"usage\":");
  json_t *u = usage_of(cx);
  openai_response_put_json(&b, u);
  json_decref(u);
  if (chat && cx->req.return_token_ids) {
    strbuf_puts(&b, ",\"prompt_token_ids\":");
    openai_response_put_ids(&b, cx->prompt_ids, cx->n_prompt);
  }
  strbuf_puts(&b, "}");
  if (b.oom) {
    strbuf_free(&b);
    return fail(cx, 500, "server_error", NULL, "out of memory");
  }
  size_t len = b.len;
  return send_body(cx, 200, "application/json", strbuf_take(&b), len, NULL, NULL);
}

static enum MHD_Result respond_chat(conn *cx) {
  if (cx->anthropic) { /* /v1/messages: one choice */
    openai_error e;
    if (gen_error(cx, &e)) return send_error(cx, &e);
    return send_json(cx, 200,
                     anthropic_response_message(cx->id, cx->s->name, &cx->ch[0].g,
                                                cx->thinking_open, cx->req.tools));
  }
  return respond_body(cx, chat_choice);
}

static json_t *completion_choice(conn *cx, int i) {
  const server_gen *g = &cx->ch[i].g;
  prompt_part pp = part_of(cx, i);
  strbuf text;
  strbuf_init(&text);
  if (pp.echo) strbuf_append(&text, pp.echo, pp.echo_len);
  if (g->text.len) strbuf_append(&text, g->text.data, g->text.len);
  json_t *choice = json_object();
  json_object_set_new(choice, "index", json_integer(i));
  json_object_set_new(choice, "text", openai_response_string(text.data ? text.data : "", text.len));
  strbuf_free(&text);
  json_object_set_new(choice, "finish_reason", json_string(server_gen_finish_name(g)));
  json_object_set_new(choice, "stop_reason", json_null());
  if (cx->req.return_token_ids)
    json_object_set_new(choice, "prompt_token_ids", ids_array(pp.ids, pp.n));
  return choice;
}

static enum MHD_Result respond_completion(conn *cx) { return respond_body(cx, completion_choice); }

/* ---- streaming ---- */

static void sse_json(conn *cx, json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!s) {
    cx->out.oom = 1;
    return;
  }
  strbuf_puts(&cx->out, "data: ");
  strbuf_puts(&cx->out, s);
  strbuf_puts(&cx->out, "\n\n");
  free(s);
}

static json_t *chunk_base(conn *cx) {
  return openai_response_object(
      cx->id, cx->req.kind == OPENAI_KIND_CHAT ? "chat.completion.chunk" : "text_completion",
      cx->created, cx->s->name);
}

static void chunk_chat(conn *cx, int i, json_t *delta, const char *finish, int tok_from,
                       int tok_to) {
  const server_gen *g = &cx->ch[i].g;
  json_t *o = chunk_base(cx);
  json_t *c = json_object();
  json_object_set_new(c, "index", json_integer(i));
  json_object_set_new(c, "delta", delta ? delta : json_object());
  json_object_set_new(c, "logprobs",
                      cx->req.logprobs && tok_to > tok_from
                          ? chat_logprobs(cx->s, g, tok_from, tok_to)
                          : json_null());
  json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
  if (cx->req.return_token_ids && tok_to > tok_from)
    json_object_set_new(c, "token_ids",
                        ids_array(g->ids ? g->ids + tok_from : NULL, tok_to - tok_from));
  json_array_append_new(json_object_get(o, "choices"), c);
  chunk_usage(cx, o, i, tok_to);
  sse_json(cx, o);
}

static void chunk_completion(conn *cx, int i, const char *text, size_t len, const char *finish,
                             int tok_from, int tok_to, int first) {
  const server_gen *g = &cx->ch[i].g;
  prompt_part pp = part_of(cx, i);
  json_t *o = chunk_base(cx);
  json_t *c = json_object();
  json_object_set_new(c, "index", json_integer(i));
  json_object_set_new(c, "text", openai_response_string(text, len));
  json_object_set_new(c, "logprobs",
                      cx->req.logprobs && tok_to > tok_from
                          ? completion_logprobs(cx->s, g, tok_from, tok_to, pp.echo_len)
                          : json_null());
  json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
  if (cx->req.return_token_ids) {
    json_object_set_new(c, "token_ids",
                        ids_array(g->ids ? g->ids + tok_from : NULL, tok_to - tok_from));
    if (first) json_object_set_new(c, "prompt_token_ids", ids_array(pp.ids, pp.n));
  }
  json_array_append_new(json_object_get(o, "choices"), c);
  chunk_usage(cx, o, i, tok_to);
  sse_json(cx, o);
}

static void stream_error(conn *cx, const openai_error *e) {
  sse_json(cx, openai_response_error_json(e));
  strbuf_puts(&cx->out, "data: [DONE]\n\n");
  cx->phase = STREAM_DONE;
}

/* Choice i's chunks for whatever its generation has now; its finish_reason once it is done. */
static void stream_emit_choice(conn *cx, int i) {
  choice *ch = &cx->ch[i];
  server_gen *g = &ch->g;
  int tok_to = g->n_ids;
  const char *finish = g->done ? server_gen_finish_name(g) : NULL;
  if (cx->req.kind == OPENAI_KIND_CHAT) {
    json_t *deltas = NULL;
    size_t vis = server_gen_visible(g);
    if (openai_stream_deltas(&ch->st, g->text.data ? g->text.data : "", vis, g->done, &deltas)) {
      cx->out.oom = 1;
      return;
    }
    if (g->done && ch->st.n_tool_calls > 0 && !strcmp(finish, "stop")) finish = "tool_calls";
    size_t nd = deltas ? json_array_size(deltas) : 0;
    if (nd == 0 && (finish || (cx->req.logprobs && tok_to > ch->sent_toks))) {
      chunk_chat(cx, i, NULL, finish, ch->sent_toks, tok_to);
      ch->sent_toks = tok_to;
    }
    /* one chunk per delta: the new tokens' logprobs / ids ride on the first, finish_reason
     * on the last */
    for (size_t k = 0; k < nd; k++) {
      chunk_chat(cx, i, json_incref(json_array_get(deltas, k)), k + 1 == nd ? finish : NULL,
                 ch->sent_toks, tok_to);
      ch->sent_toks = tok_to;
    }
    json_decref(deltas);
  } else {
    size_t vis = server_gen_visible(g);
    if (vis > ch->sent_text || finish ||
        (tok_to > ch->sent_toks && (cx->req.return_token_ids || cx->req.logprobs))) {
      chunk_completion(cx, i, g->text.data ? g->text.data + ch->sent_text : "", vis - ch->sent_text,
                       finish, ch->sent_toks, tok_to, 0);
      ch->sent_text = vis;
      ch->sent_toks = tok_to;
    }
  }
  if (g->done) ch->finished = 1;
}

/* ---- /v1/responses (the Responses shapes of the same generation) ---- */

/* The usage's reasoning_tokens: the reasoning text's encoding length. */
static int reasoning_tokens(const server *s, const char *text, size_t len) {
  if (!s->m.tok || !text || !len) return 0;
  int32_t *ids = NULL;
  char err[80];
  int n = tokenizer_encode(s->m.tok, text, len, &ids, err, sizeof err);
  free(ids);
  return n > 0 ? n : 0;
}

static responses_usage responses_usage_of(const conn *cx, const char *reasoning, size_t len) {
  const server_gen *g = &cx->ch[0].g;
  responses_usage u = {g->prompt_tokens, g->cached_tokens, g->completion_tokens,
                       reasoning_tokens(cx->s, reasoning, len)};
  return u;
}

static enum MHD_Result respond_responses(conn *cx) {
  openai_error e;
  if (gen_error(cx, &e)) return send_error(cx, &e);
  const server_gen *g = &cx->ch[0].g;
  chat_parsed p;
  memset(&p, 0, sizeof p);
  if (chat_parse(g->text.data ? g->text.data : "", cx->thinking_open, cx->req.tools, &p))
    return fail(cx, 500, "server_error", NULL, "out of memory");
  const char *r = p.reasoning_content;
  responses_usage u = responses_usage_of(cx, r, r ? strlen(r) : 0);
  json_t *out = responses_response_output(r, p.content, p.tool_calls, cx->rr->parallel_tool_calls,
                                          cx->rr->encrypted_reasoning);
  chat_parsed_free(&p);
  const char *status = responses_response_status(server_gen_finish_name(g));
  return send_json(cx, 200,
                   out ? responses_response_object(cx->rr->echo, cx->id, cx->created, cx->s->name,
                                                   status, out, &u)
                       : NULL);
}

/* The events for whatever the generation has now (after a step). */
static void responses_emit(conn *cx) {
  responses_stream *rs = cx->rs;
  const server_gen *g = &cx->ch[0].g;
  int rc = 0;
  if (cx->phase == STREAM_FIRST) {
    rc = responses_stream_start(rs, &cx->out);
    cx->phase = STREAM_RUNNING;
  }
  openai_error e;
  if (gen_error(cx, &e)) {
    responses_request_error_param(&e);
    responses_stream_error(rs, &e, &cx->out);
    cx->phase = STREAM_DONE;
    return;
  }
  if (!rc)
    rc = responses_stream_step(rs, g->text.data ? g->text.data : "", server_gen_visible(g), g->done,
                               &cx->out);
  if (!rc && g->done) {
    responses_usage u = responses_usage_of(cx, rs->reasoning_all.data, rs->reasoning_all.len);
    rc = responses_stream_finish(rs, server_gen_finish_name(g), &u, &cx->out);
    cx->phase = STREAM_DONE;
  }
  if (rc) cx->out.oom = 1;
}

/* Produces the chunks for whatever the generations have now (after a step). */
static void stream_emit(conn *cx) {
  if (cx->anthropic) { /* /v1/messages: one choice, Anthropic's events */
    openai_error e;
    server_gen *g = &cx->ch[0].g;
    if (!cx->as)
      cx->as = anthropic_stream_new(cx->id, cx->s->name, cx->thinking_open, cx->req.tools);
    if (gen_error(cx, &e)
            ? anthropic_stream_error(&cx->out, &e)
            : !cx->as || anthropic_stream_events(cx->as, g, server_gen_visible(g), &cx->out))
      cx->out.oom = 1;
    cx->phase = g->done ? STREAM_DONE : STREAM_RUNNING;
    return;
  }
  if (cx->rs) {
    responses_emit(cx);
    return;
  }
  if (cx->phase == STREAM_FIRST) {
    for (int i = 0; i < cx->n_ch; i++) {
      if (cx->req.kind == OPENAI_KIND_CHAT) {
        json_t *d = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
        chunk_chat(cx, i, d, NULL, 0, 0);
      } else {
        prompt_part pp = part_of(cx, i);
        if (pp.echo_len || cx->req.return_token_ids)
          chunk_completion(cx, i, pp.echo ? pp.echo : "", pp.echo_len, NULL, 0, 0, 1);
      }
    }
    cx->phase = STREAM_RUNNING;
  }
  openai_error e;
  if (gen_error(cx, &e)) {
    stream_error(cx, &e);
    return;
  }
  for (int i = 0; i < cx->n_ch; i++)
    if (!cx->ch[i].finished) stream_emit_choice(cx, i);
  if (all_done(cx)) {
    if (cx->req.include_usage) {
      json_t *o = chunk_base(cx);
      json_object_set_new(o, "usage", usage_of(cx));
      sse_json(cx, o);
    }
    strbuf_puts(&cx->out, "data: [DONE]\n\n");
    cx->phase = STREAM_DONE;
  }
}

/* The reader of a late body (see handle_generate): JSON whitespace as probes while the
 * choices run, then the answer (or its error JSON: the status line, 200, is already sent). */
static ssize_t late_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  conn *cx = cls;
  while (cx->out.len == 0) {
    if (cx->phase == STREAM_DONE) return MHD_CONTENT_READER_END_OF_STREAM;
    if (!all_done(cx)) conn_step(cx, 100);
    if (client_gone(cx)) {
      cancel_all(cx);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (all_done(cx)) {
      cx->capture = 1;
      if (cx->rr)
        respond_responses(cx);
      else if (cx->req.kind == OPENAI_KIND_CHAT)
        respond_chat(cx);
      else
        respond_completion(cx);
      cx->capture = 0;
      if (!cx->captured) return MHD_CONTENT_READER_END_WITH_ERROR;
      strbuf_append(&cx->out, cx->captured, cx->captured_len);
      free(cx->captured);
      cx->captured = NULL;
      cx->phase = STREAM_DONE;
    } else if (cx->probe_due || server_gen_now() - cx->last_out >= SERVER_KEEPALIVE_S) {
      cx->probe_due = 0;
      strbuf_puts(&cx->out, "\n");
    }
    if (cx->out.oom) {
      cancel_all(cx);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
  }
  size_t n = cx->out.len < max ? cx->out.len : max;
  memcpy(buf, cx->out.data, n);
  strbuf_consume(&cx->out, n);
  cx->last_out = server_gen_now();
  return (ssize_t)n;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  conn *cx = cls;
  while (cx->out.len == 0) {
    if (cx->phase == STREAM_DONE) return MHD_CONTENT_READER_END_OF_STREAM;
    if (cx->phase == STREAM_FIRST) {
      stream_emit(cx);
      continue;
    }
    int r = conn_step(cx, 100);
    if (client_gone(cx)) {
      cancel_all(cx);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (r != 0 || all_done(cx)) stream_emit(cx);
    if (cx->probe_due || server_gen_now() - cx->last_out >= SERVER_KEEPALIVE_S) {
      /* an SSE comment: a closed client answers it with RST; a silent stream stays open */
      cx->probe_due = 0;
      if (cx->out.len == 0 && cx->phase != STREAM_DONE) strbuf_puts(&cx->out, ": \n\n");
    }
    if (cx->out.oom) {
      cancel_all(cx);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
  }
  size_t n = cx->out.len < max ? cx->out.len : max;
  memcpy(buf, cx->out.data, n);
  strbuf_consume(&cx->out, n);
  cx->last_out = server_gen_now();
  return (ssize_t)n;
}

/* ======================================================================================
 * Routes
 * ====================================================================================== */

static enum MHD_Result handle_generate(conn *cx, openai_kind kind) {
  server *s = cx->s;
  openai_error e;
  int bad =
      openai_request_parse(kind, cx->body.data ? cx->body.data : "", cx->body.len, &cx->req, &e);
  openai_request_body_free(&cx->body); /* the request holds what it needs: not kept while it runs */
  if (bad) return send_error(cx, &e);
  cx->have_req = 1;
  if (model_ok(s, cx->req.model, &e)) return send_error(cx, &e);
  if (kind == OPENAI_KIND_CHAT ? prepare_chat(cx, &e) : prepare_completion(cx, &e))
    return send_error(cx, &e);
  if (check_limits(cx, &e)) return send_error(cx, &e);
  if (cx->req.json_object && !s->m.json)
    return fail(cx, 400, "invalid_request_error", "response_format",
                "response_format json_object / json_schema needs the model's tokenizer, which this "
                "server has not loaded");
  if (atomic_load(&s->stopping))
    return fail(cx, 503, "server_error", NULL, "the server is shutting down");

  int n_per = cx->req.n > 0 ? cx->req.n : 1, n = n_per * (1 + cx->n_more);
  cx->ch = calloc((size_t)n, sizeof *cx->ch);
  if (!cx->ch) return fail(cx, 503, "server_error", NULL, "out of memory");
  for (int p = 0; p <= cx->n_more; p++) /* vLLM's requests are one per prompt */
    metrics_observe(s->met, METRICS_PARAMS_N, n_per);
  for (int i = 0; i < n; i++) {
    choice *ch = &cx->ch[i];
    prompt_part pp = part_of(cx, i);
    ch->sp = cx->req.sp;
    /* the choices of one prompt differ, reproducibly */
    if (ch->sp.has_seed) ch->sp.seed += (uint64_t)(i % n_per);
    if (cx->req.max_tokens <= 0 && pp.n != cx->n_prompt) { /* this prompt's rest of the context */
      int avail = s->m.max_model_len - pp.n;
      ch->sp.max_tokens = s->m.gen ? generation_config_max_tokens(s->m.gen, avail) : avail;
    }
    server_gen_opts go;
    memset(&go, 0, sizeof go);
    go.eng = s->m.eng;
    go.tok = s->m.tok;
    go.met = s->met;
    go.prompt = pp.ids;
    go.n_prompt = pp.n;
    go.boundaries = cx->bounds;
    go.n_boundaries = cx->n_bounds;
    go.sp = &ch->sp;
    go.cache_salt = cx->req.cache_salt;
    go.stop = cx->req.stop;
    go.n_stop = cx->req.n_stop;
    go.include_stop_str = cx->req.include_stop_str_in_output;
    go.skip_special = cx->req.skip_special_tokens;
    go.eos_ids = s->m.eos_ids;
    go.n_eos = s->m.n_eos;
    go.json = cx->req.json_object ? s->m.json : NULL;
    go.schema = cx->req.schema; /* server_gen_start takes it (n is 1 with a schema) */
    cx->req.schema = NULL;
    engine_status st;
    char err[200] = "";
    if (server_gen_start(&ch->g, &go, &st, err, sizeof err)) {
      /* the choices already submitted are released by on_completed */
      switch (st) {
        case ENGINE_ERR_QUEUE_FULL:
          return fail(cx, 429, "rate_limit_error", NULL,
                      err[0] ? err : "too many requests are waiting; retry later");
        case ENGINE_ERR_SHUTDOWN:
          return fail(cx, 503, "server_error", NULL, "the server is shutting down");
        case ENGINE_ERR_NOMEM:
          return fail(cx, 503, "server_error", NULL, err[0] ? err : "out of memory");
        default: {
          openai_error_set(&e, 400, "invalid_request_error", sampler_param_of(err), "%s",
                           err[0] ? err : "invalid request");
          return send_error(cx, &e);
        }
      }
    }
    ch->have_gen = 1;
    cx->n_ch = i + 1;
  }
  active_add(s, cx);
  openai_response_new_id(cx->id, sizeof cx->id,
                         cx->anthropic              ? "msg_"
                         : cx->rr                   ? "resp_"
                         : kind == OPENAI_KIND_CHAT ? "chatcmpl-"
                                                    : "cmpl-");
  cx->created = (long long)time(NULL);

  if (cx->req.stream) {
    if (cx->rr) {
      cx->rs = calloc(1, sizeof *cx->rs);
      if (!cx->rs) return fail(cx, 503, "server_error", NULL, "out of memory");
      responses_stream_init(cx->rs, cx->rr->echo, cx->id, cx->created, s->name,
                            cx->rr->parallel_tool_calls, cx->thinking_open, cx->req.tools,
                            cx->rr->encrypted_reasoning);
    } else if (kind == OPENAI_KIND_CHAT)
      for (int i = 0; i < n; i++) {
        openai_stream_init(&cx->ch[i].st, cx->thinking_open, cx->req.tools);
        cx->ch[i].have_st = 1;
      }
    strbuf_init(&cx->out);
    cx->phase = STREAM_FIRST;
    cx->last_out = server_gen_now();
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, cx, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    cors_add(cx, r);
    cx->status = 200;
    enum MHD_Result ret = MHD_queue_response(cx->mc, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  while (!all_done(cx)) {
    conn_step(cx, 100);
    if (client_gone(cx)) {
      cancel_all(cx);
      return MHD_NO; /* MHD closes the connection; on_completed releases the requests */
    }
    if (cx->peer_eof && !cx->http11) {
      /* HTTP/1.0 has no interim response to probe with: the answer turns late, a 200 now
       * whose body (delimited by the close) starts with JSON whitespace sent as probes (a
       * gone client answers one with a reset, which cancels the choices), then the JSON */
      strbuf_init(&cx->out);
      cx->phase = STREAM_RUNNING;
      cx->late = 1;
      cx->last_out = server_gen_now();
      struct MHD_Response *r =
          MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, late_reader, cx, NULL);
      if (!r) return MHD_NO;
      MHD_add_response_header(r, "Content-Type", "application/json");
      cors_add(cx, r);
      cx->status = 200;
      enum MHD_Result ret = MHD_queue_response(cx->mc, 200, r);
      MHD_destroy_response(r);
      return ret;
    }
    probe_interim(cx);
  }
  if (cx->rr) return respond_responses(cx);
  return kind == OPENAI_KIND_CHAT ? respond_chat(cx) : respond_completion(cx);
}

/* Serves chat, a chat-completions body (taken), as cx's request: the routes of the APIs that
 * translate into the chat request they mean. */
static enum MHD_Result serve_chat_body(conn *cx, char *chat) {
  strbuf_init(&cx->body);
  strbuf_puts(&cx->body, chat);
  free(chat);
  if (cx->body.oom) return fail(cx, 503, "server_error", NULL, "out of memory");
  return handle_generate(cx, OPENAI_KIND_CHAT);
}

/* POST /v1/responses: the body becomes the chat request it means (responses_request), served
 * by handle_generate; the answer and the stream take the Responses shapes. */
static enum MHD_Result handle_responses(conn *cx) {
  openai_error e;
  responses_request rr;
  int bad = responses_request_parse(cx->body.data ? cx->body.data : "", cx->body.len, &rr, &e);
  openai_request_body_free(&cx->body);
  if (bad) return send_error(cx, &e);
  cx->rr = malloc(sizeof *cx->rr);
  char *chat = cx->rr ? json_dumps(rr.chat, JSON_COMPACT) : NULL;
  if (!chat) {
    responses_request_free(&rr);
    free(cx->rr);
    cx->rr = NULL;
    return fail(cx, 503, "server_error", NULL, "out of memory");
  }
  *cx->rr = rr;
  return serve_chat_body(cx, chat);
}

/* POST /v1/messages: the body becomes the chat request it means (anthropic_request), served by
 * handle_generate; errors, the answer and the stream take Anthropic's shapes (cx->anthropic,
 * set with the route). */
static enum MHD_Result handle_messages(conn *cx) {
  openai_error e;
  char *chat = anthropic_request_to_chat(ANTHROPIC_REQUEST_MESSAGES,
                                         cx->body.data ? cx->body.data : "", cx->body.len, &e);
  openai_request_body_free(&cx->body);
  if (!chat) return send_error(cx, &e);
  return serve_chat_body(cx, chat);
}

/* POST /v1/messages/count_tokens: the prompt /v1/messages would render, counted. */
static enum MHD_Result handle_count_tokens(conn *cx) {
  openai_error e;
  int bad = anthropic_request_parse(ANTHROPIC_REQUEST_COUNT_TOKENS,
                                    cx->body.data ? cx->body.data : "", cx->body.len, &cx->req, &e);
  openai_request_body_free(&cx->body);
  if (bad) return send_error(cx, &e);
  cx->have_req = 1;
  if (model_ok(cx->s, cx->req.model, &e) || prepare_chat(cx, &e)) return send_error(cx, &e);
  return send_json(cx, 200, json_pack("{s:i}", "input_tokens", cx->n_prompt));
}

/* The model object of one served name (vLLM lists every name, all of the same model). */
static json_t *model_object(server *s, const char *id) {
  return json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i, s:[]}", "id", id, "object", "model",
                   "created", (json_int_t)s->created, "owned_by", "deltaserve", "root",
                   s->path ? s->path : s->name, "parent", "max_model_len",
                   atomic_load(&s->ready) ? s->m.max_model_len : 0, "permission");
}

static enum MHD_Result handle_models(conn *cx) {
  server *s = cx->s;
  json_t *data = json_array();
  if (data) json_array_append_new(data, model_object(s, s->name));
  for (int i = 0; data && i < s->o.n_model_aliases; i++)
    json_array_append_new(data, model_object(s, s->o.model_aliases[i]));
  return send_json(cx, 200, data ? json_pack("{s:s, s:o}", "object", "list", "data", data) : NULL);
}

/* GET /v1/models/{id}: the model object, or 404 as OpenAI answers an unknown id. */
static enum MHD_Result handle_model(conn *cx, const char *id) {
  server *s = cx->s;
  openai_error e;
  if (model_ok(s, id, &e)) return send_error(cx, &e);
  return send_json(cx, 200, model_object(s, id));
}

static enum MHD_Result handle_tokenize(conn *cx) {
  server *s = cx->s;
  openai_error e;
  char *model = NULL, *prompt = NULL;
  size_t plen = 0;
  json_t *render = NULL;
  int agp = 1;
  if (openai_request_parse_tokenize(cx->body.data ? cx->body.data : "", cx->body.len, &model,
                                    &prompt, &plen, &render, &agp, &e))
    return send_error(cx, &e);
  int rc = model_ok(s, model, &e);
  free(model);
  if (!rc && !s->m.tok) rc = no_tokenizer(&e);
  char err[300] = "";
  int32_t *ids = NULL;
  int n = 0;
  if (!rc && render) {
    chat_render cr;
    memset(&cr, 0, sizeof cr);
    if (chat_jinja_render(s->m.chat, s->m.tmpl, render, agp, &cr, err, sizeof err)) {
      rc = openai_error_set(&e, 400, "invalid_request_error", "messages", "%s",
                            err[0] ? err : "render failed");
    } else {
      n = tokenizer_encode(s->m.tok, cr.text, cr.len, &ids, err, sizeof err);
      if (n == TOKENIZER_ENOMEM)
        rc = openai_error_set(&e, 503, "server_error", NULL, "%s", err);
      else if (n < 0)
        rc = openai_error_set(&e, 400, "invalid_request_error", "messages", "%s", err);
      chat_render_free(&cr);
    }
  } else if (!rc) {
    n = tokenizer_encode(s->m.tok, prompt, plen, &ids, err, sizeof err);
    if (n == TOKENIZER_ENOMEM)
      rc = openai_error_set(&e, 503, "server_error", NULL, "%s", err);
    else if (n < 0)
      rc = openai_error_set(&e, 400, "invalid_request_error", "prompt", "%s", err);
  }
  free(prompt);
  json_decref(render);
  if (rc) {
    free(ids);
    return send_error(cx, &e);
  }
  json_t *o = json_pack("{s:i, s:i, s:o, s:n}", "count", n, "max_model_len", s->m.max_model_len,
                        "tokens", ids_array(ids, n), "token_strs");
  free(ids);
  return send_json(cx, 200, o);
}

static enum MHD_Result handle_detokenize(conn *cx) {
  server *s = cx->s;
  openai_error e;
  char *model = NULL;
  int32_t *ids = NULL;
  int n = 0;
  if (openai_request_parse_detokenize(cx->body.data ? cx->body.data : "", cx->body.len, &model,
                                      &ids, &n, &e))
    return send_error(cx, &e);
  int rc = model_ok(s, model, &e);
  free(model);
  if (!rc && !s->m.tok) rc = no_tokenizer(&e);
  for (int i = 0; !rc && i < n; i++)
    if (ids[i] >= tokenizer_vocab_size(s->m.tok))
      rc = openai_error_set(&e, 400, "invalid_request_error", "tokens",
                            "token id %d is out of vocabulary (size %d)", ids[i],
                            tokenizer_vocab_size(s->m.tok));
  char *text = NULL;
  long len = 0;
  if (!rc) {
    len = tokenizer_decode(s->m.tok, ids, n, 0, &text);
    if (len < 0)
      rc = openai_error_set(&e, 400, "invalid_request_error", "tokens",
                            "a token id is out of range");
  }
  free(ids);
  if (rc) {
    free(text);
    return send_error(cx, &e);
  }
  json_t *o = json_pack("{s:o}", "prompt", openai_response_string(text, (size_t)len));
  free(text);
  return send_json(cx, 200, o);
}

static enum MHD_Result handle_metrics(conn *cx) {
  server *s = cx->s;
  engine_stats st;
  int ready = atomic_load(&s->ready);
  if (ready) engine_get_stats(s->m.eng, &st);
  char *txt = metrics_render(s->met, ready ? &st : NULL);
  if (!txt) return MHD_NO;
  return send_body(cx, 200, "text/plain; version=0.0.4; charset=utf-8", txt, strlen(txt), NULL,
                   NULL);
}

typedef enum {
  R_HEALTH,
  R_MODELS,
  R_MODEL,
  R_METRICS,
  R_CHAT,
  R_COMPLETIONS,
  R_TOKENIZE,
  R_DETOKENIZE,
  R_VERSION,
  R_RESPONSES,
  R_MESSAGES,
  R_COUNT_TOKENS
} route_id;

static const struct {
  const char *path;
  const char *method;
  route_id id;
  int auth; /* needs the API key */
  int needs_model;
} routes[] = {
    {"/health", "GET", R_HEALTH, 0, 0},
    {"/v1/models", "GET", R_MODELS, 1, 0},
    {"/v1/models/", "GET", R_MODEL, 1, 0},
    {"/metrics", "GET", R_METRICS, 0, 0},
    {"/version", "GET", R_VERSION, 0, 0},
    {"/v1/chat/completions", "POST", R_CHAT, 1, 1},
    {"/v1/completions", "POST", R_COMPLETIONS, 1, 1},
    {"/v1/responses", "POST", R_RESPONSES, 1, 1},
    {"/v1/messages", "POST", R_MESSAGES, 1, 1},
    {"/v1/messages/count_tokens", "POST", R_COUNT_TOKENS, 1, 1},
    {"/tokenize", "POST", R_TOKENIZE, 1, 1},
    {"/detokenize", "POST", R_DETOKENIZE, 1, 1},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

/* The route of a method and path: its index, or -1 (then *path_known says whether another
 * method has the path, and *allow names that method). */
static int route_find(const char *url, const char *method, int *path_known, const char **allow) {
  *path_known = 0;
  *allow = NULL;
  for (size_t i = 0; i < N_ROUTES; i++) {
    /* "/v1/models/" + an id: the model route (an id may hold '/', as "org/name" does) */
    if (routes[i].id == R_MODEL
            ? strncmp(url, routes[i].path, strlen(routes[i].path)) || !url[strlen(routes[i].path)]
            : strcmp(url, routes[i].path))
      continue;
    *path_known = 1;
    *allow = routes[i].method;
    if (!strcmp(method, routes[i].method) ||
        (!strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET")))
      return (int)i;
  }
  return -1;
}

/* Does route i need the API key? (/metrics when --metrics-require-api-key says so) */
static int route_needs_key(const server *s, int i) {
  return s->api_key &&
         (routes[i].auth || (routes[i].id == R_METRICS && s->o.metrics_require_api_key));
}

/* The answers decided by the request head alone: no route (404 / 405), a missing or wrong API
 * key (401), a Content-Length over --max-request-bytes (413). Called on the first access-handler
 * call, before any body byte is read: an answer queued then makes MHD skip the body (and send
 * no "100 Continue"), so an unauthenticated client cannot make the server read its body.
 * Returns 1 when it answered (*ret: the queue result), else 0. */
static int route_refused(conn *cx, const char *url, const char *method, enum MHD_Result *ret) {
  server *s = cx->s;
  int path_known;
  const char *allow;
  int found = route_find(url, method, &path_known, &allow);
  if (found < 0) {
    if (path_known) {
      openai_error e;
      openai_error_set(&e, 405, "invalid_request_error", NULL, "method %s is not allowed on %s",
                       method, url);
      metrics_request_rejected(s->met, 405);
      char *b = openai_response_error_body(&e);
      *ret = b ? send_body(cx, 405, "application/json", b, strlen(b), "Allow", allow) : MHD_NO;
      return 1;
    }
    char msg[300];
    snprintf(msg, sizeof msg, "no route %s %.200s", method, url);
    *ret = fail(cx, 404, "not_found_error", NULL, msg);
    return 1;
  }
  cx->anthropic = routes[found].id == R_MESSAGES || routes[found].id == R_COUNT_TOKENS;
  if (route_needs_key(s, found)) {
    const char *h = MHD_lookup_connection_value(cx->mc, MHD_HEADER_KIND, "Authorization");
    const char *tok = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) tok = h + 7;
    /* x-api-key is the Anthropic clients' header: taken on their routes only */
    if (!tok && cx->anthropic)
      tok = MHD_lookup_connection_value(cx->mc, MHD_HEADER_KIND, "x-api-key");
    if (!tok || !ct_equal(tok, s->api_key)) {
      openai_error e;
      openai_error_set(&e, 401, "authentication_error", NULL,
                       tok             ? "invalid API key"
                       : cx->anthropic ? "missing API key: send 'x-api-key: <key>' or "
                                         "'Authorization: Bearer <key>'"
                                       : "missing API key: send 'Authorization: Bearer <key>'");
      e.code = "invalid_api_key";
      *ret = send_error(cx, &e);
      return 1;
    }
  }
  if (cx->too_large) {
    char msg[200];
    snprintf(msg, sizeof msg, "the request body is larger than the limit of %zu bytes",
             s->o.max_request_bytes);
    *ret = fail(cx, 413, "invalid_request_error", NULL, msg);
    return 1;
  }
  return 0;
}

/* A browser's CORS preflight (OPTIONS with Origin and Access-Control-Request-Method): 200 with
 * what may be sent, or 400 naming what is not allowed, before any route or key check (the
 * browser sends no credentials on it). Returns 1 when it answered. */
static int cors_preflight(conn *cx, const char *method, enum MHD_Result *ret) {
  if (strcmp(method, "OPTIONS")) return 0;
  struct MHD_Connection *c = cx->mc;
  const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  const char *want =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method");
  if (!origin || !want) return 0;
  const char *hdrs =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
  const server *s = cx->s;
  const char *bad = NULL;
  if (!cors_listed(s->o.cors_origins, s->o.n_cors_origins, origin, strlen(origin), 0))
    bad = "origin";
  else if (!cors_listed(s->o.cors_methods, s->o.n_cors_methods, want, strlen(want), 1))
    bad = "method";
  else if (hdrs && !cors_all(s->o.cors_headers, s->o.n_cors_headers)) {
    /* the CORS-safelisted request headers need no listing */
    static const char *const safe[] = {"accept", "accept-language", "content-language",
                                       "content-type"};
    for (const char *p = hdrs; *p && !bad;) {
      while (*p == ' ' || *p == ',') p++;
      size_t l = strcspn(p, ", ");
      if (l && !cors_listed(safe, 4, p, l, 1) &&
          !cors_listed(s->o.cors_headers, s->o.n_cors_headers, p, l, 1))
        bad = "headers";
      p += l;
    }
  }
  char *body = strdup(bad ? (!strcmp(bad, "origin")   ? "Disallowed CORS origin"
                             : !strcmp(bad, "method") ? "Disallowed CORS method"
                                                      : "Disallowed CORS headers")
                          : "OK");
  struct MHD_Response *r =
      body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
  if (!r) {
    free(body);
    *ret = MHD_NO;
    return 1;
  }
  MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
  if (strcmp(bad ? bad : "", "origin")) cors_origin_headers(s, r, origin);
  if (!bad) {
    char buf[512] = "";
    if (cors_all(s->o.cors_methods, s->o.n_cors_methods)) {
      snprintf(buf, sizeof buf, "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
    } else {
      for (int i = 0; i < s->o.n_cors_methods; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "",
                 s->o.cors_methods[i]);
    }
    MHD_add_response_header(r, "Access-Control-Allow-Methods", buf);
    if (cors_all(s->o.cors_headers, s->o.n_cors_headers)) {
      if (hdrs) MHD_add_response_header(r, "Access-Control-Allow-Headers", hdrs);
    } else {
      snprintf(buf, sizeof buf, "Accept, Accept-Language, Content-Language, Content-Type");
      for (int i = 0; i < s->o.n_cors_headers; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), ", %s", s->o.cors_headers[i]);
      MHD_add_response_header(r, "Access-Control-Allow-Headers", buf);
    }
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
  }
  cx->status = bad ? 400 : 200;
  *ret = MHD_queue_response(c, (unsigned)cx->status, r);
  MHD_destroy_response(r);
  return 1;
}

/* Serves a request whose head route_refused accepted and whose body has been read. */
static enum MHD_Result dispatch(conn *cx, const char *url, const char *method) {
  server *s = cx->s;
  int path_known;
  const char *allow;
  int found = route_find(url, method, &path_known, &allow);
  enum MHD_Result ret;
  if (found < 0 || cx->too_large) { /* too_large: a chunked body grew past the limit */
    if (route_refused(cx, url, method, &ret)) return ret;
    return MHD_NO;
  }
  if (routes[found].needs_model && !atomic_load(&s->ready))
    return fail(cx, 503, "server_error", NULL, "the model is still loading");
  switch (routes[found].id) {
    case R_HEALTH:
      if (!atomic_load(&s->ready) || atomic_load(&s->stopping))
        return fail(cx, 503, "server_error", NULL,
                    atomic_load(&s->stopping) ? "the server is shutting down"
                                              : "the model is still loading");
      return send_body(cx, 200, "application/json", strdup("{}"), 2, NULL, NULL);
    case R_VERSION:
      return send_json(cx, 200, json_pack("{s:s}", "version", "deltaserve " VERSION_NUMBER));
    case R_MODELS:
      return handle_models(cx);
    case R_MODEL:
      return handle_model(cx, url + strlen("/v1/models/"));
    case R_METRICS:
      return handle_metrics(cx);
    case R_CHAT:
      return handle_generate(cx, OPENAI_KIND_CHAT);
    case R_COMPLETIONS:
      return handle_generate(cx, OPENAI_KIND_COMPLETION);
    case R_RESPONSES:
      return handle_responses(cx);
    case R_MESSAGES:
      return handle_messages(cx);
    case R_COUNT_TOKENS:
      return handle_count_tokens(cx);
    case R_TOKENIZE:
      return handle_tokenize(cx);
    case R_DETOKENIZE:
      return handle_detokenize(cx);
  }
  return MHD_NO;
}

/* ======================================================================================
 * MHD callbacks
 * ====================================================================================== */

/* Request-head limits checked here, so that the client gets an OpenAI error body. MHD's own
 * per-connection memory (SERVER_CONN_MEMORY) is set well above them; a head that does not fit
 * there still gets MHD's own (HTML) 414 / 431. */
#define SERVER_MAX_URL 8192
#define SERVER_MAX_HEADERS 200
#define SERVER_MAX_HEADER_BYTES 65536
#define SERVER_CONN_MEMORY (256u << 10)

typedef struct head_scan {
  int n;        /* header lines */
  size_t bytes; /* names + values */
  int n_host;
  const char *cl;  /* the first Content-Length */
  int cl_conflict; /* a second Content-Length with another value */
} head_scan;

static enum MHD_Result head_scan_one(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value) {
  (void)kind;
  head_scan *h = cls;
  h->n++;
  h->bytes += (key ? strlen(key) : 0) + (value ? strlen(value) : 0) + 4;
  if (key && !strcasecmp(key, "Host")) h->n_host++;
  if (key && !strcasecmp(key, "Content-Length")) {
    const char *v = value ? value : "";
    if (!h->cl)
      h->cl = v;
    else if (strcmp(h->cl, v))
      h->cl_conflict = 1;
  }
  return MHD_YES;
}

/* Checks the request head before any body is read: answers (and returns 1) when it is refused.
 * An answer queued now makes MHD skip the body and close the connection afterwards, which is
 * what a request whose framing is in doubt (two Content-Lengths) needs. */
static int head_refused(conn *cx, const char *url, const char *version, enum MHD_Result *ret) {
  head_scan h;
  memset(&h, 0, sizeof h);
  MHD_get_connection_values(cx->mc, MHD_HEADER_KIND, head_scan_one, &h);
  char msg[200];
  if (strlen(url) > SERVER_MAX_URL) {
    snprintf(msg, sizeof msg, "the request URL is longer than %d bytes", SERVER_MAX_URL);
    *ret = fail(cx, 414, "invalid_request_error", NULL, msg);
  } else if (h.n > SERVER_MAX_HEADERS || h.bytes > SERVER_MAX_HEADER_BYTES) {
    snprintf(msg, sizeof msg, "the request has more than %d headers or %d bytes of them",
             SERVER_MAX_HEADERS, SERVER_MAX_HEADER_BYTES);
    *ret = fail(cx, 431, "invalid_request_error", NULL, msg);
  } else if (h.cl_conflict) {
    *ret = fail(cx, 400, "invalid_request_error", NULL,
                "the request has Content-Length headers that disagree");
  } else if (h.n_host > 1) {
    *ret =
        fail(cx, 400, "invalid_request_error", NULL, "the request has more than one Host header");
  } else if (h.n_host == 0 && version && !strcmp(version, MHD_HTTP_VERSION_1_1)) {
    *ret =
        fail(cx, 400, "invalid_request_error", NULL, "an HTTP/1.1 request must have a Host header");
  } else {
    return 0;
  }
  return 1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  server *s = cls;
  conn *cx = *con_cls;
  if (!cx) {
    cx = calloc(1, sizeof *cx);
    if (!cx) return MHD_NO;
    cx->s = s;
    cx->mc = c;
    cx->fd = -1;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) cx->fd = ci->connect_fd;
    strbuf_init(&cx->body);
    cx->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
    cx->t_start = server_gen_now();
    snprintf(cx->method, sizeof cx->method, "%s", method ? method : "-");
    snprintf(cx->route, sizeof cx->route, "%s", url ? url : "-");
    *con_cls = cx;
    enum MHD_Result ret;
    if (head_refused(cx, url, version, &ret)) return ret;
    if (cors_preflight(cx, method, &ret)) return ret;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > s->o.max_request_bytes) cx->too_large = 1;
    if (route_refused(cx, url, method, &ret)) return ret;
    return MHD_YES;
  }
  if (*upload_data_size) {
    if (!cx->too_large) {
      if (cx->body.len + *upload_data_size > s->o.max_request_bytes) {
        cx->too_large = 1;
        strbuf_free(&cx->body);
      } else if (strbuf_append(&cx->body, upload_data, *upload_data_size)) {
        return MHD_NO;
      }
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  return dispatch(cx, url, method);
}

/* The request's line (request_log): its first choice's prompt, cached share, TTFT and finish,
 * the tokens of all its choices. /health and /metrics are left out: probes (every few
 * milliseconds while a model loads) and scrapes would drown the requests. */
static void log_request(conn *cx) {
  server *s = cx->s;
  if (s->o.disable_log_requests) return;
  if (!strcmp(cx->route, "/health") || !strcmp(cx->route, "/metrics")) return;
  request_log_entry e = {.id = cx->id,
                         .method = cx->method,
                         .route = cx->route,
                         .status = cx->status,
                         .ttft_s = -1.0,
                         .duration_s = server_gen_now() - cx->t_start};
  for (int i = 0; cx->ch && i < cx->n_ch; i++) {
    const server_gen *g = &cx->ch[i].g;
    if (!cx->ch[i].have_gen) continue;
    if (i == 0) {
      e.prompt_tokens = g->prompt_tokens;
      e.cached_tokens = g->cached_tokens;
      e.finish = g->done ? server_gen_finish_name(g) : "abort";
    }
    e.generated_tokens += g->n_ids;
    e.spec_drafts += g->spec_drafts;
    e.spec_draft_tokens += g->spec_draft_tokens;
    e.spec_accepted_tokens += g->spec_accepted;
    if (g->n_ids > 0 && (e.ttft_s < 0 || g->t_first - g->t_submit < e.ttft_s))
      e.ttft_s = g->t_first - g->t_submit;
  }
  request_log_write(&e);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)c;
  (void)toe;
  server *s = cls;
  conn *cx = *con_cls;
  if (!cx) return;
  active_remove(s, cx);
  log_request(cx);
  /* request_max_num_generation_tokens: each prompt whose choices all finished, their most */
  int n_per = cx->req.n > 0 ? cx->req.n : 1;
  for (int p = 0; cx->ch && (p + 1) * n_per <= cx->n_ch; p++) {
    int most = 0, done = 1;
    for (int j = p * n_per; j < (p + 1) * n_per; j++) {
      done &= cx->ch[j].have_gen && cx->ch[j].g.done;
      if (cx->ch[j].g.completion_tokens > most) most = cx->ch[j].g.completion_tokens;
    }
    if (done) metrics_observe(s->met, METRICS_MAX_GEN_TOKENS, most);
  }
  for (int i = 0; cx->ch && i < cx->n_ch; i++) {
    if (cx->ch[i].have_gen) server_gen_free(&cx->ch[i].g);
    if (cx->ch[i].have_st) openai_stream_free(&cx->ch[i].st);
  }
  free(cx->ch);
  if (cx->have_req) openai_request_free(&cx->req);
  if (cx->rr) responses_request_free(cx->rr);
  anthropic_stream_free(cx->as);
  if (cx->rs) responses_stream_free(cx->rs);
  free(cx->rr);
  free(cx->rs);
  openai_request_body_free(&cx->body);
  strbuf_free(&cx->out);
  free(cx->prompt_ids);
  for (int i = 0; i < cx->n_more; i++) {
    free(cx->more[i].ids);
    free(cx->more[i].echo);
  }
  free(cx->more);
  free(cx->bounds);
  free(cx->echo);
  free(cx->captured);
  free(cx);
  *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  (void)cls;
  (void)socket_context;
  if (code != MHD_CONNECTION_NOTIFY_STARTED) return;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  int sndbuf = SERVER_SNDBUF;
  if (ci) setsockopt(ci->connect_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
}

/* A connection whose first head http_gate let through: libmicrohttpd serves it from here (and
 * closes it when it cannot). */
static void on_gate_pass(void *user, int fd, const struct sockaddr *addr, socklen_t addrlen) {
  server *s = user;
  MHD_add_connection(s->d, fd, addr, addrlen);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n && line[n - 1] == '\n') line[--n] = 0;
  log_debug("http: %s", line);
}

/* ======================================================================================
 * Life cycle
 * ====================================================================================== */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int server_start(server **out, const server_opts *o, char *err, size_t errlen) {
  *out = NULL;
  server *s = calloc(1, sizeof *s);
  if (!s) return errf(err, errlen, "out of memory");
  s->o = *o;
  s->host = strdup(o->host ? o->host : "127.0.0.1");
  s->name = strdup(o->served_model_name ? o->served_model_name : "deltaserve");
  s->path = dup_or_null(o->model_path);
  s->api_key = o->api_key && o->api_key[0] ? strdup(o->api_key) : NULL;
  if (!s->o.max_request_bytes) s->o.max_request_bytes = 32u << 20;
  s->created = (long long)time(NULL);
  pthread_mutex_init(&s->mu, NULL);
  metrics_opts mo = {.prefix = o->metrics_prefix,
                     .model_name = s->name,
                     .gpu_memory_utilization = o->gpu_memory_utilization,
                     .cache_dtype = o->kv_cache_dtype};
  s->met = metrics_new(&mo);
  if (!s->host || !s->name || !s->met) {
    server_free(s);
    return errf(err, errlen, "out of memory");
  }
  /* an IPv4 or IPv6 address ("[::1]" as in a URL; "::" also takes IPv4 clients, as Linux
   * binds dual-stack by default) */
  struct sockaddr_storage addr;
  socklen_t addrlen;
  memset(&addr, 0, sizeof addr);
  char h[INET6_ADDRSTRLEN + 2];
  snprintf(h, sizeof h, "%s", !strcmp(s->host, "localhost") ? "127.0.0.1" : s->host);
  size_t hl = strlen(h);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    memmove(h, h + 1, hl - 2);
    h[hl - 2] = 0;
  }
  struct sockaddr_in *a4 = (struct sockaddr_in *)&addr;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&addr;
  if (strlen(s->host) < sizeof h && inet_pton(AF_INET, h, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)o->port);
    addrlen = sizeof *a4;
  } else if (strlen(s->host) < sizeof h && inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)o->port);
    addrlen = sizeof *a6;
  } else {
    errf(err, errlen, "--host '%s' is not an IPv4 or IPv6 address", s->host);
    server_free(s);
    return -1;
  }
  /* as many connections as descriptors allow, up to SERVER_MAX_CONNECTIONS */
  struct rlimit rl;
  unsigned max_conns = 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &rl)) getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur > 2 * SERVER_FD_RESERVE)
      max_conns = rl.rlim_cur - SERVER_FD_RESERVE > SERVER_MAX_CONNECTIONS
                      ? SERVER_MAX_CONNECTIONS
                      : (unsigned)(rl.rlim_cur - SERVER_FD_RESERVE);
  }
  /* the listener is http_gate's: libmicrohttpd gets the connections it lets through */
  /* SO_REUSEADDR only (a restart binds past TIME_WAIT); never SO_REUSEPORT, so that a second
   * server on a port in use fails here instead of taking a share of its connections */
  int lfd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(lfd, (struct sockaddr *)&addr, addrlen) || listen(lfd, 1024)) {
    int en = errno;
    if (en == EADDRINUSE)
      errf(err, errlen, "port %d on %s is in use (another server?): pick another with --port",
           o->port, s->host);
    else
      errf(err, errlen, "cannot listen on %s:%d (%s)", s->host, o->port, strerror(en));
    if (lfd >= 0) close(lfd);
    server_free(s);
    return -1;
  }
  struct sockaddr_storage bound;
  socklen_t bl = sizeof bound;
  s->port = o->port;
  if (getsockname(lfd, (struct sockaddr *)&bound, &bl) == 0)
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                   MHD_USE_ITC | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG;
  s->d = MHD_start_daemon(
      flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)SERVER_IDLE_S, MHD_OPTION_CONNECTION_LIMIT,
      max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)SERVER_PER_ADDRESS,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SERVER_CONN_MEMORY, MHD_OPTION_END);
  http_gate_opts go = {.listen_fd = lfd,
                       .head_timeout_s = SERVER_HEAD_TIMEOUT_S,
                       .max_pending = (int)max_conns,
                       .max_pending_per_addr = SERVER_PER_ADDRESS,
                       .pass = on_gate_pass,
                       .user = s};
  if (!s->d || http_gate_start(&s->gate, &go)) {
    errf(err, errlen, "cannot serve on %s:%d (%s)", s->host, o->port,
         !s->d ? "libmicrohttpd failed" : "out of memory");
    close(lfd);
    server_free(s);
    return -1;
  }
  *out = s;
  return 0;
}

int server_port(const server *s) { return s->port; }

void server_set_model(server *s, const server_model *m) {
  s->m = *m;
  metrics_set_max_model_len(s->met, m->max_model_len);
  if (s->o.log_stats_interval_s > 0 && m->eng) {
    s->stats = stats_log_new(m->eng, s->o.log_stats_interval_s);
    if (!s->stats) log_warn("the periodic stats line is off: its thread did not start");
  }
  atomic_store(&s->ready, 1);
}

static int n_active(server *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->n_active;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

void server_shutdown(server *s, double grace_s) {
  if (!s) return;
  stats_log_free(s->stats); /* it reads the engine, which the caller frees after this */
  s->stats = NULL;
  if (!s->d) return;
  atomic_store(&s->stopping, 1);
  http_gate_stop(s->gate); /* stop accepting */
  s->gate = NULL;
  double t0 = server_gen_now();
  while (n_active(s) > 0 && server_gen_now() - t0 < grace_s) sleep_ms(20);
  pthread_mutex_lock(&s->mu);
  int n = 0;
  for (conn *cx = s->active; cx; cx = cx->next) {
    cancel_all(cx);
    n++;
  }
  pthread_mutex_unlock(&s->mu);
  if (n) log_info("shutdown: cancelled %d in-flight request%s", n, n == 1 ? "" : "s");
  t0 = server_gen_now();
  while (n_active(s) > 0 && server_gen_now() - t0 < SERVER_DRAIN_S) sleep_ms(20);
  MHD_stop_daemon(s->d);
  s->d = NULL;
}

void server_free(server *s) {
  if (!s) return;
  http_gate_stop(s->gate);
  if (s->d) MHD_stop_daemon(s->d);
  stats_log_free(s->stats);
  metrics_free(s->met);
  pthread_mutex_destroy(&s->mu);
  free(s->host);
  free(s->name);
  free(s->path);
  free(s->api_key);
  free(s);
}
