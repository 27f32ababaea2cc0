/* request_log — the line logged (info level) for each finished HTTP request, as vLLM users
 * read their request and access logs:
 *
 *   request id=chatcmpl-1a2b method=POST route=/v1/chat/completions status=200
 *     prompt_tokens=12 cached_tokens=0 generated_tokens=16 ttft_ms=4.2 duration_ms=35.1
 *     finish=stop
 *
 * (one line). A field without a value (no id before a request is admitted, no token yet, no
 * finish) is "-"; status 499 is a client that went away before any answer was sent. The
 * server logs every route but /health and /metrics. */
#ifndef DS_REQUEST_LOG_H
#define DS_REQUEST_LOG_H

typedef struct request_log_entry {
  const char *id;     /* NULL: "-" */
  const char *method; /* NULL: "-" */
  const char *route;  /* the URL path (client input: bytes outside printable ASCII become '?') */
  int status;         /* the HTTP status sent; 0: none sent, logged as 499 */
  int prompt_tokens, cached_tokens, generated_tokens;
  double ttft_s;      /* submit -> first token; < 0: no token */
  double duration_s;  /* request head -> end of the answer */
  const char *finish; /* "stop", "length", "abort", "error"; NULL: "-" */
} request_log_entry;

/* Logs e's line at info level (nothing when the log level is above info). */
void request_log_write(const request_log_entry *e);

#endif
