/* request_log — the line logged (info level) for each finished HTTP request, as vLLM users
 * read their request and access logs:
 *
 *   request id=chatcmpl-1a2b method=POST route=/v1/chat/completions status=200
 *     prompt_tokens=12 cached_tokens=0 generated_tokens=16 ttft_ms=4.2 duration_ms=35.1
 *     finish=stop
 *
 * (one line). A field without a value (no id before a request is admitted, no token yet, no
 * finish) is "-"; status 499 is a client that went away before any answer was sent. The
 * server logs every route but /health and /metrics. A request that verified drafts
 * (--speculative-config) has four fields more at the end:
 *
 *     spec_drafts=6 spec_draft_tokens=18 spec_accepted_tokens=9 acceptance_length=2.50
 *
 * its verify steps, the drafts they fed, those accepted, and vLLM's acceptance length: the
 * tokens a verify step gave on average, 1 + accepted / verify steps. */
#ifndef DS_REQUEST_LOG_H
#define DS_REQUEST_LOG_H

typedef struct request_log_entry {
  const char *id;     /* NULL: "-" */
  const char *method; /* NULL: "-" */
  const char *route;  /* the URL path (client input: bytes outside printable ASCII become '?') */
  int status;         /* the HTTP status sent; 0: none sent, logged as 499 */
  int prompt_tokens, cached_tokens, generated_tokens;
  /* speculative decoding, summed over the choices: verify steps, drafts fed, drafts accepted
   * (engine_event's); spec_drafts 0: the request verified no drafts, no spec fields logged */
  int spec_drafts, spec_draft_tokens, spec_accepted_tokens;
  double ttft_s;      /* submit -> first token; < 0: no token */
  double duration_s;  /* request head -> end of the answer */
  const char *finish; /* "stop", "length", "abort", "error"; NULL: "-" */
} request_log_entry;

/* Logs e's line at info level (nothing when the log level is above info). */
void request_log_write(const request_log_entry *e);

#endif
