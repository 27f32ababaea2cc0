/* json_mask — response_format {"type": "json_object"}: which tokens a request may sample next
 * so that its output stays a prefix of one JSON object (RFC 8259 text whose top-level value is an
 * object), and the recognizer that follows the sampled tokens. response_format {"type":
 * "json_schema"}: the same for one JSON object valid under a compiled schema
 * (json_mask_new_schema below; json_schema.h has the subset).
 *
 * Before each sampled token the engine calls json_mask_apply, which sets the logit of every token
 * that would break the object to -INFINITY; after sampling it calls json_mask_advance with the
 * chosen token. The allowed set may be computed ahead, while the logits are being computed
 * (json_mask_prepare), so that apply then only copies it into the logits. Tokens are byte
 * strings (byte-level BPE: a token may hold part of a UTF-8 sequence, the rest coming in the next
 * token).
 *
 * The language (a byte-level recognizer, json_state):
 *  - top level: optional whitespace, then one object; nothing may follow its closing brace, not
 *    even whitespace (the model must stop with an eos token);
 *  - values: object, array, string, number, true, false, null; at most JSON_MASK_MAX_DEPTH open
 *    containers (a deeper opening bracket is rejected); keys are strings; no trailing commas;
 *  - numbers: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? ending at the next structural
 *    byte or whitespace (so "1." or "1e+" cannot be followed by , } ] or whitespace, and a
 *    leading 0 cannot be followed by a digit); true / false / null byte by byte;
 *  - strings: bytes >= 0x20 other than '"' and '\'; the escapes \" \\ \/ \b \f \n \r \t and
 *    \uXXXX (any case); well-formed UTF-8 only (no overlongs C0 C1 E0 80..9F F0 80..8F, no
 *    surrogates ED A0..BF, nothing above U+10FFFF, no stray continuation bytes), checked across
 *    token boundaries; bytes >= 0x80 outside strings are rejected;
 *  - whitespace (space, \t, \n, \r) outside strings: at most JSON_MASK_MAX_WS bytes in a row
 *    (so a model cannot pad forever); any other byte starts a new run.
 *
 * Speed: json_vocab_new precomputes per token what json_mask_apply needs to reject most tokens
 * without reading their bytes (the first byte after leading whitespace, and how the token runs
 * through a string from the plain in-string state), so apply costs one small record per token
 * plus a byte-by-byte check of the few tokens that pass that filter. apply and advance never
 * allocate. */
#ifndef DS_JSON_MASK_H
#define DS_JSON_MASK_H
#include <stddef.h>
#include <stdint.h>

#define JSON_MASK_MAX_DEPTH 64 /* open containers (objects + arrays), the top level's included */
#define JSON_MASK_MAX_WS 16    /* consecutive whitespace bytes outside strings */

/* ---- the byte-level recognizer ---------------------------------------------------------- */

/* Where the text read so far stands. A plain value type: copy it to try bytes without changing
 * the original. The stack of open containers is a bit set (bit d: container d, 0 = the
 * top-level object, is an object (1) or an array (0)), so the whole state is 16 bytes. */
typedef struct json_state {
  uint64_t stack; /* bit d set: open container d is an object; clear: an array */
  uint8_t depth;  /* open containers, 0..JSON_MASK_MAX_DEPTH */
  uint8_t mode;   /* lexical state (json_mask.c's JS_* values) */
  uint8_t aux;    /* the mode's detail: \u hex digits left, UTF-8 bytes left, literal position */
  uint8_t ws;     /* whitespace bytes in a row outside strings, 0..JSON_MASK_MAX_WS */
  uint8_t key;    /* 1 while the string being read is an object key */
  uint8_t pad[3];
} json_state;

/* The state before any byte: expects optional whitespace then '{'. */
void json_state_init(json_state *s);
/* Feeds n bytes (b may be NULL when n == 0). Returns 0 when the text so far is still a prefix of
 * one JSON object (within the limits above), -1 otherwise (s is then unspecified: feed a copy
 * when the original must survive a rejection). */
int json_state_feed(json_state *s, const char *b, size_t n);
/* 1 when the text so far is one complete JSON object (its closing brace read), else 0. */
int json_state_complete(const json_state *s);

/* ---- the vocabulary --------------------------------------------------------------------- */

/* Immutable after json_vocab_new; shared by many requests and threads. */
typedef struct json_vocab json_vocab;

/* n_vocab ids (the model's logits width); bytes[i]/lens[i] the bytes id i decodes to (copied);
 * special[i] != 0 for special/added control tokens (never allowed except as eos; special may be
 * NULL: none); eos ids [n_eos] the tokens that end generation (ids outside [0, n_vocab) are
 * ignored). ids with lens[i] == 0 are never allowed (except as eos). bytes may be NULL for an id
 * (treated as length 0). Returns NULL on out of memory or when n_vocab < 0. */
json_vocab *json_vocab_new(int n_vocab, const char *const *bytes, const size_t *lens,
                           const unsigned char *special, const int32_t *eos, int n_eos);
void json_vocab_free(json_vocab *v);      /* NULL is fine */
int json_vocab_size(const json_vocab *v); /* its n_vocab */

/* ---- one request's mask ----------------------------------------------------------------- */

/* One request's recognizer; used by one thread at a time. Holds a pointer to v, which must
 * outlive it. */
typedef struct json_mask json_mask;

json_mask *json_mask_new(const json_vocab *v); /* NULL on out of memory */
void json_mask_free(json_mask *m);             /* NULL is fine */

/* logits[n_vocab]: sets logits[i] = -INFINITY for every token i the output may not continue
 * with: a non-eos token is allowed iff appending its bytes keeps the output a prefix of one
 * JSON object (within the whitespace and depth limits); eos ids are allowed iff the object is
 * complete, and once it is complete only eos ids are allowed. If no token at all would be
 * allowed (a vocabulary without the needed bytes, a dead recognizer), only the eos ids are left.
 * ids >= the vocab's n_vocab are forbidden; n_vocab may differ from the vocab's. Allowed logits
 * are left as they were. Never allocates; reads m and its vocabulary only (and, when
 * json_mask_prepare ran for this n_vocab since the state last changed, only m's prepared set). */
void json_mask_apply(const json_mask *m, float *logits, int n_vocab);

/* Computes now, into m's own bitset, the set of ids json_mask_apply(m, logits, n_vocab) would
 * leave allowed in m's current state (by the same rules: eos only when complete, the "nothing
 * allowed -> only eos" fallback, ids >= the vocab's size forbidden), so that the next
 * json_mask_apply with the same n_vocab only copies the set into the logits (a word of 64 ids at
 * a time: -INFINITY where a bit is clear), with bit-for-bit the logits it would have written
 * without it. Anything that changes the state (json_mask_advance, json_mask_feed, being the dst
 * of json_mask_copy) drops the prepared set; apply without one (or with another n_vocab)
 * computes the set as before. Costs what an apply without it costs; n_vocab <= 0 only drops
 * the prepared set. Never allocates: the bitset (one bit per vocabulary id) is allocated by
 * json_mask_new / json_mask_new_schema. One thread at a time per mask, as for the other calls:
 * prepare and apply may run on different threads one after the other when the caller orders
 * them (a mutex / condition variable handoff). */
void json_mask_prepare(json_mask *m, int n_vocab);

/* The token that was sampled: the recognizer advances over its bytes. A token the mask would
 * have forbidden (an out-of-range id, a special or empty token, bytes that break the object, an
 * eos before the object is complete) leaves the recognizer dead (then only eos is allowed). An
 * eos after the object is complete changes nothing. Never allocates. */
void json_mask_advance(json_mask *m, int32_t token);

/* 1 when the output so far is one complete JSON object (and the recognizer is not dead). */
int json_mask_complete(const json_mask *m);
/* 1 when a forbidden token was advanced over: only eos can follow. */
int json_mask_dead(const json_mask *m);

/* ---- schema-guided masks (response_format json_schema; json_schema.h has the subset) ----- */

typedef struct json_schema json_schema;

/* A mask whose output must be one JSON object valid under s (which must outlive the mask);
 * otherwise as json_mask_new (apply / advance / complete / dead / free unchanged). Its
 * recognizer follows json_schema.h's rules (and, unlike the free mask's, never lets a \u escape
 * of a surrogate stand alone). NULL on out of memory or when s is NULL.
 *
 * Speed: the state is a stack of (node, count) frames plus a 12-byte lexical state; a token is
 * tried on a copy of the lexical state and of only the frames it changes, over the mask's stack
 * read-only, so its cost is its length. json_mask_apply judges tokens as for the free mask: by
 * the byte after their leading whitespace (outside strings), by their first byte (inside keys,
 * enum values, escapes and UTF-8 sequences), and in the plain in-string state by a precomputed
 * run (stays in the string with k code points, breaks it, or closes it at byte q after k code
 * points), checked against the string's minLength / maxLength. In a string under a pattern or
 * format the tokens that pass the first-byte filter run through its automaton (only tokens with
 * an escape are walked); in a key that may be an additional property, only tokens that may
 * still spell a property's name, or hold an escape, are walked.
 *
 * s may be a tool-call grammar (tool_grammar.h: literals around objects under the tools'
 * schemas, one or more calls, in the JSON or the XML call form; in the XML form the parameter
 * blocks are read as the JSON object they stand for): complete (eos allowed) after a whole call;
 * apply walks every token through it from the current state (no precomputed filter), and special
 * tokens are allowed only where their bytes spell the grammar's literals. tool_grammar_single's
 * grammar allows every token (eos too) until its call block has closed, then only eos. */
json_mask *json_mask_new_schema(const json_vocab *v, const json_schema *s);

/* ---- byte-level access (tests, tools); both kinds of mask ------------------------------ */

/* Feeds raw bytes, as advance feeds a token's: 0 when the output is still a prefix of a valid
 * text, -1 otherwise (the mask is then dead). Never allocates. */
int json_mask_feed(json_mask *m, const char *b, size_t n);
/* dst becomes a copy of src (same vocabulary and schema; no allocation): its state, not src's
 * prepared set (dst's is dropped: its next apply computes, unless it is prepared again). dst must
 * have been made over src's vocabulary, or one at least as large, for json_mask_prepare to work
 * on it (else its prepare does nothing and apply computes). */
void json_mask_copy(json_mask *dst, const json_mask *src);

#endif
