/* responses_stream — the server-sent events of a streamed Responses API answer.
 *
 * The chat path's incremental parser (openai_stream: chat_parse_stream fed each new piece of
 * the text) says what became certain: reasoning bytes, content bytes, finished tool calls.
 * This file turns those into the Responses event sequence, each event an
 * "event: <type>\ndata: <json>\n\n" block with a growing sequence_number:
 *
 *   response.created, response.in_progress                          (responses_stream_start)
 *   reasoning: output_item.added, content_part.added, reasoning_text.delta*,
 *              reasoning_text.done, content_part.done, output_item.done
 *   message:   output_item.added, content_part.added, output_text.delta*,
 *              output_text.done, content_part.done, output_item.done
 *   call:      output_item.added, function_call_arguments.delta,
 *              function_call_arguments.done, output_item.done
 *   response.completed | response.incomplete                      (responses_stream_finish)
 *
 * An item stays open while its kind of bytes keeps coming; another kind closes it. The final
 * response object carries the very items the events built, so a client's accumulated stream
 * equals it; for text without tool calls it also equals the non-streamed answer
 * (responses_response_output of chat_parse's parts), ids aside.
 *
 * Owner of everything inside: the responses_stream (echo and model are borrowed). */
#ifndef DS_RESPONSES_STREAM_H
#define DS_RESPONSES_STREAM_H
#include <jansson.h>
#include <stddef.h>

#include "base/strbuf.h"
#include "server/openai_request.h"
#include "server/openai_stream.h"
#include "server/responses_response.h"

typedef struct responses_stream {
  openai_stream chat; /* the reasoning / content / tool-call deltas */
  const json_t *echo; /* borrowed: responses_request.echo */
  const char *model;  /* borrowed */
  char id[64];        /* "resp_..." */
  long long created;
  int parallel;         /* 0: calls after the first are dropped */
  int encrypted;        /* reasoning items carry encrypted_content */
  long long seq;        /* the next sequence_number */
  json_t *output;       /* the items so far, in their latest shape (owned) */
  int open;             /* index in output of the open reasoning / message item, or -1 */
  int open_message;     /* the open item is a message (else reasoning) */
  strbuf text;          /* the open item's text so far */
  int have_message;     /* a message item was sent */
  int n_calls;          /* function calls sent */
  int ended;            /* finish or error sent */
  strbuf reasoning_all; /* every reasoning byte (usage counts its tokens) */
} responses_stream;

void responses_stream_init(responses_stream *s, const json_t *echo, const char *id,
                           long long created, const char *model, int parallel, int thinking_open,
                           const json_t *tools, int encrypted);
void responses_stream_free(responses_stream *s);

/* response.created and response.in_progress. Returns 0, or -1 on out of memory. */
int responses_stream_start(responses_stream *s, strbuf *out);
/* The events for text[0, len), a text that only grows (as openai_stream_deltas); final: the
 * generation is over (closes the open item). Returns 0, or -1 on out of memory. */
int responses_stream_step(responses_stream *s, const char *text, size_t len, int final,
                          strbuf *out);
/* response.completed (finish "stop") or response.incomplete ("length") with the usage; after
 * the final step. Returns 0, or -1 on out of memory. */
int responses_stream_finish(responses_stream *s, const char *finish, const responses_usage *u,
                            strbuf *out);
/* An "error" event ({"type":"error","code","message","param"}); nothing follows it. */
int responses_stream_error(responses_stream *s, const openai_error *e, strbuf *out);

#endif
