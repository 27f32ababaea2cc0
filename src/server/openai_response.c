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

/* ---------------------------------------------------------------- JSON written as text
 *
 * A non-streamed response with logprobs carries several entries per token; as a jansson tree
 * each entry is a dozen allocations (a 20-entry top list is ~25 KiB per token), many times
 * the bytes sent. These write the same JSON straight into the body. */

int openai_response_put_string(strbuf *b, const char *s, size_t len) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *u = (const unsigned char *)s;
  strbuf_append(b, "\"", 1);
  size_t i = 0, run = 0; /* bytes [run, i) go out as they are */
  while (i < len) {
    unsigned char c = u[i];
    int n = c >= 0x80 ? utf8_seq(u + i, len - i) : 1;
    const char *esc = NULL;
    char ub[6];
    if (n == 0 || c == 0) {
      esc = "\xef\xbf\xbd"; /* an invalid byte or NUL: U+FFFD, as openai_response_string */
      n = 1;
    } else if (c == '"') {
      esc = "\\\"";
    } else if (c == '\\') {
      esc = "\\\\";
    } else if (c < 0x20) {
      switch (c) {
        case '\n':
          esc = "\\n";
          break;
        case '\t':
          esc = "\\t";
          break;
        case '\r':
          esc = "\\r";
          break;
        case '\b':
          esc = "\\b";
          break;
        case '\f':
          esc = "\\f";
          break;
        default:
          memcpy(ub, "\\u00", 4);
          ub[4] = hex[c >> 4];
          ub[5] = hex[c & 15];
          strbuf_append(b, s + run, i - run);
          strbuf_append(b, ub, 6);
          run = i + 1;
          i++;
          continue;
      }
    }
    if (esc) {
      strbuf_append(b, s + run, i - run);
      strbuf_puts(b, esc);
      run = i + (size_t)n;
    }
    i += (size_t)n;
  }
  strbuf_append(b, s + run, len - run);
  return strbuf_append(b, "\"", 1);
}

int openai_response_put_json(strbuf *b, const json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  if (!s) {
    b->oom = 1;
    return -1;
  }
  int rc = strbuf_puts(b, s);
  free(s);
  return rc;
}

int openai_response_put_open(strbuf *b, const json_t *obj) {
  size_t at = b->len;
  if (openai_response_put_json(b, obj)) return -1;
  if (b->len - at < 2 || b->data[b->len - 1] != '}') {
    b->oom = 1;
    return -1;
  }
  b->data[--b->len] = 0;
  return 0;
}

int openai_response_put_ids(strbuf *b, const int32_t *ids, int n) {
  strbuf_append(b, "[", 1);
  for (int i = 0; i < n; i++) strbuf_printf(b, i ? ",%d" : "%d", (int)ids[i]);
  return strbuf_append(b, "]", 1);
}

/* A logprob as jansson writes a real (17 significant digits, always a '.' or an exponent). */
static void put_real(strbuf *b, float lp) {
  double v = lp < -9999.0f ? -9999.0 : (double)lp;
  char t[40];
  int n = snprintf(t, sizeof t, "%.17g", v);
  if (n > 0 && !strpbrk(t, ".eEni")) memcpy(t + n, ".0", 3);
  strbuf_puts(b, t);
}

/* The token's bytes (malloc'd; "" without a tokenizer or for an id it has no text for). */
static char *token_text(const tokenizer *tok, int32_t id, size_t *len) {
  char *out = NULL;
  long n = tok ? tokenizer_decode(tok, &id, 1, 0, &out) : -1;
  if (n < 0) {
    free(out);
    out = strdup("");
    n = 0;
  }
  *len = out ? (size_t)n : 0;
  return out;
}

/* The name logprobs give a token: its text, or "token_id:N" (as vLLM names tokens by id)
 * when it has none. */
static void put_token_name(strbuf *b, int32_t id, const char *s, size_t len) {
  if (len > 0)
    openai_response_put_string(b, s, len);
  else
    strbuf_printf(b, "\"token_id:%d\"", (int)id);
}

static void put_bytes(strbuf *b, const char *s, size_t len) {
  strbuf_append(b, "[", 1);
  for (size_t i = 0; i < len; i++) strbuf_printf(b, i ? ",%u" : "%u", (unsigned char)s[i]);
  strbuf_append(b, "]", 1);
}

/* {"token","logprob","bytes"} without the closing brace. */
static int put_chat_entry(strbuf *b, const tokenizer *tok, int32_t id, float lp) {
  size_t len;
  char *t = token_text(tok, id, &len);
  if (!t) return -1;
  strbuf_puts(b, "{\"token\":");
  put_token_name(b, id, t, len);
  strbuf_puts(b, ",\"logprob\":");
  put_real(b, lp);
  strbuf_puts(b, ",\"bytes\":");
  put_bytes(b, t, len);
  free(t);
  return 0;
}

int openai_response_put_chat_logprobs(strbuf *b, const tokenizer *tok, const server_gen_token *toks,
                                      int from, int to) {
  strbuf_puts(b, "{\"content\":[");
  for (int i = from; i < to && !b->oom; i++) {
    const server_gen_token *t = &toks[i];
    if (i > from) strbuf_append(b, ",", 1);
    if (put_chat_entry(b, tok, t->id, t->logprob)) return -1;
    strbuf_puts(b, ",\"top_logprobs\":[");
    for (int k = 0; k < t->n_top; k++) {
      if (k) strbuf_append(b, ",", 1);
      if (put_chat_entry(b, tok, t->top_ids[k], t->top_lps[k])) return -1;
      strbuf_append(b, "}", 1);
    }
    strbuf_puts(b, "]}");
  }
  return strbuf_puts(b, "]}");
}

int openai_response_put_completion_logprobs(strbuf *b, const tokenizer *tok,
                                            const server_gen_token *toks, int from, int to,
                                            size_t base_off) {
  strbuf_puts(b, "{\"tokens\":[");
  for (int i = from; i < to && !b->oom; i++) {
    size_t len;
    char *t = token_text(tok, toks[i].id, &len);
    if (!t) return -1;
    if (i > from) strbuf_append(b, ",", 1);
    put_token_name(b, toks[i].id, t, len);
    free(t);
  }
  strbuf_puts(b, "],\"token_logprobs\":[");
  for (int i = from; i < to; i++) {
    if (i > from) strbuf_append(b, ",", 1);
    put_real(b, toks[i].logprob);
  }
  strbuf_puts(b, "],\"top_logprobs\":[");
  strbuf key;
  strbuf_init(&key);
  for (int i = from; i < to && !b->oom; i++) {
    const server_gen_token *t = &toks[i];
    size_t offs[ENGINE_MAX_TOP_LOGPROBS + 1];
    int n_keys = 0;
    key.len = 0;
    strbuf_append(b, i > from ? ",{" : "{", i > from ? 2 : 1);
    for (int k = 0; k < t->n_top; k++) {
      size_t len, at = key.len;
      char *tt = token_text(tok, t->top_ids[k], &len);
      if (!tt) {
        strbuf_free(&key);
        return -1;
      }
      put_token_name(&key, t->top_ids[k], tt, len);
      free(tt);
      /* keys never collide: a second token with the same text (two partial UTF-8 pieces both
       * shown as U+FFFD, say) is named by its id */
      for (int q = 0; q < n_keys; q++)
        if (offs[q + 1] - offs[q] == key.len - at &&
            !memcmp(key.data + offs[q], key.data + at, key.len - at)) {
          key.len = at;
          strbuf_printf(&key, "\"token_id:%d\"", (int)t->top_ids[k]);
          break;
        }
      if (key.oom) break;
      offs[n_keys] = at;
      offs[++n_keys] = key.len;
      if (k) strbuf_append(b, ",", 1);
      strbuf_append(b, key.data + at, key.len - at);
      strbuf_append(b, ":", 1);
      put_real(b, t->top_lps[k]);
    }
    strbuf_append(b, "}", 1);
  }
  int oom = key.oom;
  strbuf_free(&key);
  if (oom) b->oom = 1;
  strbuf_puts(b, "],\"text_offset\":[");
  for (int i = from; i < to; i++)
    strbuf_printf(b, i > from ? ",%zu" : "%zu", base_off + toks[i].text_off);
  return strbuf_puts(b, "]}");
}
