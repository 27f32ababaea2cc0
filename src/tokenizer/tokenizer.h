/* tokenizer — byte-level BPE read from a Hugging Face tokenizer.json (+
 * tokenizer_config.json): merge ranks, NFC normaliser (utf8proc) when the file
 * asks, the pre-tokenizer Split regex (PCRE2, UTF + UCP, JIT) then ByteLevel,
 * added tokens matched before BPE, the ByteLevel decoder. Nothing about a
 * particular vocabulary is hard-coded. A tokenizer is immutable after load and
 * safe to use from many threads. */
#ifndef DS_TOKENIZER_H
#define DS_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* Loads dir/tokenizer.json (and dir/tokenizer_config.json when present).
 * Returns NULL with one line in err when the folder has no usable tokenizer. */
tokenizer *tokenizer_load(const char *dir, char *err, size_t errlen);
void tokenizer_free(tokenizer *t);

/* Encodes UTF-8 text (len bytes). Added/special tokens in the text are matched
 * (as HF does by default). Returns the number of ids written to *ids (malloc'd,
 * caller frees), or with err: -1 on invalid UTF-8 (the input's fault), TOKENIZER_ENOMEM on
 * out of memory (the server's: a client may retry). */
#define TOKENIZER_ENOMEM (-2)
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, char *err,
                     size_t errlen);
/* Decodes ids to text (malloc'd, NUL-terminated, caller frees), as HF's decode
 * does: the tokens' bytes joined, then each invalid or unfinished UTF-8 part
 * replaced by U+FFFD, so the result is always valid UTF-8. skip_special drops
 * special added tokens (not <think> and other added tokens marked
 * special:false). Returns length, or -1 when an id is out of range or on out of
 * memory. */
long tokenizer_decode(const tokenizer *t, const int32_t *ids, int n, int skip_special, char **out);

int tokenizer_vocab_size(const tokenizer *t);                   /* ids that decode (base + added) */
int tokenizer_token_id(const tokenizer *t, const char *token);  /* -1 when unknown */
const char *tokenizer_config_chat_template(const tokenizer *t); /* NULL when none */
const char *tokenizer_eos_token(const tokenizer *t);            /* from tokenizer_config */
int tokenizer_is_special(const tokenizer *t, int32_t id);
/* 1 for every added token (tokenizer.json "added_tokens": the special ones and the others, such
 * as <think> or <tool_call>), else 0. */
int tokenizer_is_added(const tokenizer *t, int32_t id);

/* The bytes id decodes to (its ByteLevel-decoded form; may be an incomplete
 * UTF-8 sequence). Borrowed from t, valid while t lives. Returns 0, or -1 when
 * id is out of range. */
int tokenizer_token_bytes(const tokenizer *t, int32_t id, const char **bytes, size_t *len);

#endif
