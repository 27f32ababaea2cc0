/* detok_stream — incremental detokenizer. The bytes of each pushed token go
 * into a pending buffer; everything up to the last complete UTF-8 sequence is
 * converted (invalid parts become U+FFFD exactly as a whole decode would) and
 * handed out, and only a trailing valid-but-unfinished sequence (at most 3
 * bytes) stays pending for the next token. So the concatenation of all pushes
 * and the final flush equals tokenizer_decode of all ids. */
#ifndef DS_DETOK_STREAM_H
#define DS_DETOK_STREAM_H
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Feeds ids one at a time and gives back only complete UTF-8 text. Returns NULL when out of
 * memory. t must outlive the stream; skip_special as in tokenizer_decode. Owner: the caller,
 * through detok_stream_free. */
typedef struct detok_stream detok_stream;
detok_stream *detok_stream_new(const tokenizer *t, int skip_special);
/* Appends the text that became complete with this id to *out (malloc'd, caller frees; may be
 * empty). Returns its length, or -1 (id out of range, out of memory). */
long detok_stream_push(detok_stream *s, int32_t id, char **out);
/* Whatever is left (an incomplete sequence at the end becomes U+FFFD, as HF decodes). */
long detok_stream_flush(detok_stream *s, char **out);
void detok_stream_free(detok_stream *s); /* NULL is a no-op */

#endif
