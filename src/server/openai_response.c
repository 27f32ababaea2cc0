#include "server/openai_response.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

json_t *openai_response_error_json(const openai_error *e) {
  json_t *inner = json_object();
  if (!inner) return NULL;
  json_object_set_new(inner, "message", openai_response_string(e->message, strlen(e->message)));
  json_object_set_new(inner, "type", json_string(e->type ? e->type : "invalid_request_error"));
  json_object_set_new(inner, "param", e->param[0] ? json_string(e->param) : json_null());
  /* a short string code or null, as OpenAI sends it (the openai clients type it string | null) */
  json_object_set_new(inner, "code", e->code ? json_string(e->code) : json_null());
  json_t *o = json_object();
  if (!o) {
    json_decref(inner);
    return NULL;
  }
  json_object_set_new(o, "error", inner);
  return o;
}

char *openai_response_error_body(const openai_error *e) {
  json_t *o = openai_response_error_json(e);
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!s)
    s = strdup(
        "{\"error\":{\"message\":\"out of "
        "memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
  return s;
}

json_t *openai_response_usage(int prompt_tokens, int completion_tokens, int cached_tokens) {
  return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", prompt_tokens, "completion_tokens",
                   completion_tokens, "total_tokens", prompt_tokens + completion_tokens,
                   "prompt_tokens_details", "cached_tokens", cached_tokens);
}

void openai_response_new_id(char *buf, size_t n, const char *prefix) {
  static atomic_ullong counter;
  unsigned long long c = atomic_fetch_add(&counter, 1) + 1;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long x = ((unsigned long long)ts.tv_sec << 20) ^ (unsigned long long)ts.tv_nsec ^
                         ((unsigned long long)getpid() << 40);
  snprintf(buf, n, "%s%016llx%08llx", prefix, x, c & 0xffffffffULL);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static int utf8_seq(const unsigned char *s, size_t len) {
  unsigned char c = s[0];
  int n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4, cp = c & 0x07;
  else
    return 0;
  if ((size_t)n > len) return 0;
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

json_t *openai_response_string(const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  int clean = 1;
  while (i < len) {
    int n = utf8_seq(u + i, len - i);
    if (n == 0 || (n == 1 && u[i] == 0)) {
      clean = 0;
      break;
    }
    i += (size_t)n;
  }
  if (clean) return json_stringn(s, len);
  char *out = malloc(len * 3 + 1);
  if (!out) return NULL;
  size_t o = 0;
  i = 0;
  while (i < len) {
    int n = utf8_seq(u + i, len - i);
    if (n == 0 || (n == 1 && u[i] == 0)) {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      i++;
    } else {
      memcpy(out + o, s + i, (size_t)n);
      o += (size_t)n;
      i += (size_t)n;
    }
  }
  json_t *j = json_stringn(out, o);
  free(out);
  return j;
}

json_t *openai_response_object(const char *id, const char *object, long long created,
                               const char *model) {
  return json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", id, "object", object, "created",
                   (json_int_t)created, "model", model, "choices");
}

static json_t *byte_array(const char *s, size_t len) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < len; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
  return a;
}

json_t *openai_response_chat_logprob(const char *tok, size_t tok_len, float logprob,
                                     const char *const *top_toks, const size_t *top_lens,
                                     const float *top_lps, int n_top) {
  json_t *e = json_object();
  if (!e) return NULL;
  json_object_set_new(e, "token", openai_response_string(tok, tok_len));
  json_object_set_new(e, "logprob", json_real(logprob < -9999.0f ? -9999.0 : logprob));
  json_object_set_new(e, "bytes", byte_array(tok, tok_len));
  json_t *top = json_array();
  for (int i = 0; top && i < n_top; i++) {
    json_t *t = json_object();
    json_object_set_new(t, "token", openai_response_string(top_toks[i], top_lens[i]));
    json_object_set_new(t, "logprob", json_real(top_lps[i] < -9999.0f ? -9999.0 : top_lps[i]));
    json_object_set_new(t, "bytes", byte_array(top_toks[i], top_lens[i]));
    json_array_append_new(top, t);
  }
  json_object_set_new(e, "top_logprobs", top);
  return e;
}

size_t openai_response_utf8_complete(const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  /* walk back over at most 3 continuation bytes to the last lead byte */
  size_t i = len;
  int back = 0;
  while (i > 0 && back < 4 && (u[i - 1] & 0xc0) == 0x80) i--, back++;
  if (i == 0) return back ? 0 : len;
  unsigned char c = u[i - 1];
  int need = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
  if (back + 1 >= need) return len;
  return i - 1;
}
