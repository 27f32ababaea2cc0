/* json_schema — response_format {"type": "json_schema"}: a JSON Schema (a subset) compiled to a
 * small immutable node table that json_mask (json_mask_new_schema) follows byte by byte, so that
 * the sampled output is one JSON object valid under the schema.
 *
 * The supported subset (json_schema_compile rejects everything else with one line naming the
 * keyword and where it is, e.g. "'not' is not supported (at #/properties/x)"):
 *  - true or {} (only annotations): any JSON value (the free json_object grammar for it);
 *  - type: "object", "array", "string", "number", "integer", "boolean", "null", or an array of
 *    distinct such names (a union, see anyOf; "number" covers "integer" when both appear).
 *    Without type, the keywords say it: properties / required / additionalProperties: an
 *    object; items / minItems / maxItems / prefixItems: an array; minLength / maxLength /
 *    pattern / format: a string; minimum / maximum / exclusive* / multipleOf: a number
 *    (keywords of two of these families without type are rejected as ambiguous); enum / const
 *    alone: the values' own types. Keywords of another type than the given one(s) are ignored (JSON
 *    Schema: they do not apply);
 *  - object: properties (generated in the schema's key order, each at most once; optional ones
 *    may be skipped), required (distinct names, each in properties), additionalProperties absent
 *    or false: keys other than the properties are never generated; true or a schema: other keys
 *    may come between them (any number, in any place), each value valid under that schema;
 *    such a key is written without escapes, and never spells a property's name (a key that
 *    ends as one is that property, in its turn). An object schema without properties (and
 *    with additionalProperties absent or true) is any JSON object (free keys and values); with
 *    additionalProperties: false and no properties it is only {}. Each property's key is
 *    written exactly in its canonical encoding (json_dumps JSON_ENCODE_ANY | JSON_COMPACT of the
 *    string: raw UTF-8, \" \\ and \b \f \n \r \t, other control bytes as \u00XX);
 *  - array: items (one schema; absent: any values), minItems, maxItems (integers 0..2^31-1,
 *    min <= max); tuples: prefixItems then items for the rest (false: none), or items as an
 *    array (draft 7) then additionalItems;
 *  - string: minLength, maxLength (0..2^31-1, min <= max), counted in Unicode code points: a raw
 *    UTF-8 character is one, an escape (\n, \u00e9) is one, and a surrogate pair \uD83D\uDE00 is
 *    one (in schema-guided output a \u escape of a surrogate must be a high one directly followed
 *    by a low one: lone surrogates, which jansson and others refuse, are never generated);
 *    pattern (regex_dfa.h's ECMA subset, searched as JSON Schema says: unanchored unless ^ /
 *    $) and format (date, time, date-time, uuid, email, ipv4, ipv6, uri: fixed patterns of the
 *    same subset, as strict as Python's and RFC 3339's checkers), compiled with the length
 *    bounds into one byte automaton; such strings carry no \u escapes (the automaton reads the
 *    string's own bytes, a one-character escape as the byte it stands for). Other formats are
 *    rejected;
 *  - number: JSON numbers; integer: -?(0|[1-9][0-9]*) (no fraction, no exponent); minimum,
 *    maximum, exclusiveMinimum, exclusiveMaximum (draft 4's boolean form too), multipleOf
 *    (whole numbers 1..2^31-1; a number with it is written as an integer), enforced exactly
 *    (json_num.h): integers within +-2^53 bounds, up to 19 digits; numbers with bounds within
 *    +-999999999, written without an exponent with at most 9 integer and 6 fraction digits
 *    (so that they compare with a bound as their doubles do);
 *  - enum (1..256 values) and const: the value is written byte for byte as one of the values'
 *    canonical compact encodings: json_dumps JSON_ENCODE_ANY | JSON_COMPACT, object keys in
 *    their insertion order (not sorted), reals with the fewest significant digits (1..17) that
 *    read back to the same double (so 0.1, not 0.10000000000000001). With type or other
 *    keywords beside them, only the values valid under those are kept; none left is an error;
 *  - anyOf / oneOf: schemas whose first bytes are disjoint (a string,
 *    null, an object, ...): the value's first byte picks the branch, so exactly one branch can
 *    match and anyOf means oneOf. Branches that are all strings (patterns, formats, lengths,
 *    string enums) are one string whose automaton takes what any of them takes; other branches
 *    that can start with the same byte (two objects, number and integer) are rejected; a
 *    one-branch list is that branch; beside other keywords, they are distributed (anyOf [a, b] with
 * rest: anyOf [allOf [a, rest], allOf [b, rest]]);
 *  - $ref: "#" (the root), "#/$defs/NAME" or "#/definitions/NAME" (the root's $defs /
 *    definitions; NAME with ~0 ~1 escapes), recursion allowed; beside other keywords it is
 *    merged with them as allOf. A definition is compiled when referenced; a $ref cycle that never
 *    reaches a value is rejected, and so is a schema with no instance within JSON_MASK_MAX_DEPTH
 *    nesting;
 *  - allOf: its schemas (and $ref targets in them) merged into one before compiling: bounds
 *    take the tighter value, types and enums intersect, required lists join, shared properties
 *    become allOf's of their own, and each side's additionalProperties applies to the other
 *    side's extra properties; a keyword two schemas give that cannot be merged exactly (two
 *    different patterns, formats, tuples, or const values) is rejected;
 *  - annotations, accepted without effect: title, description, default, examples, $schema, $id,
 *    $comment, deprecated, readOnly, writeOnly, strict, name;
 *  - the root must be an object schema (an object, or an enum/const of objects).
 * Everything else is rejected by name (patternProperties, propertyNames, minProperties,
 * maxProperties, dependentRequired, dependentSchemas, if / then / else, not, uniqueItems,
 * contains, unevaluatedProperties, any unknown keyword, false schemas), so that no constraint is
 * ever silently ignored. Schema documents nested more than 128 levels are
 * rejected.
 *
 * Generation follows json_mask.h's rules outside strings (whitespace between tokens, at most
 * JSON_MASK_MAX_WS bytes in a row, none after the root's closing brace; no whitespace inside an
 * enum / const value) and at most JSON_MASK_MAX_DEPTH open containers (a container is only
 * opened, and an optional key only written, when what it still requires fits under the limit,
 * so the output never runs into a dead end; an enum / const value counts its own nesting, and is
 * only started where its deepest value fits). Objects reached through "any value" (true, {}, an
 * object schema without properties) are free JSON objects and, as in json_object mode, may
 * repeat a key. Numbers are not range-limited (a long integer may exceed what a parser's
 * integer type holds). */
#ifndef DS_JSON_SCHEMA_H
#define DS_JSON_SCHEMA_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sampler/json_num.h"
#include "sampler/regex_dfa.h"

typedef struct json_schema json_schema; /* compiled, immutable, shared by requests and threads */

/* Compiles a JSON schema (the subset above). Returns NULL with one line in err naming the
 * unsupported or invalid part (e.g. "'pattern' is not supported (at #/properties/x)") or "out of
 * memory". The result does not reference schema. */
json_schema *json_schema_compile(const json_t *schema, char *err, size_t errlen);
void json_schema_free(json_schema *s); /* NULL is fine */

/* ---- the compiled form: read by json_mask.c only ---------------------------------------- */
#ifdef DS_JSON_SCHEMA_INTERNAL

enum {
  SN_UNION,   /* first[sub + c]: the node a value starting with byte c follows (-1: none) */
  SN_OBJECT,  /* props[sub .. sub + np), key trie at trie, freq[req .. req + np] */
  SN_FREEOBJ, /* any object: free string keys, any values */
  SN_ARRAY,   /* items: np prefix items (pitems[req..]), then sub; a..b items */
  SN_STRING,  /* a..b code points; sub >= 0: dfa[sub] (pattern / format) accepts its bytes */
  SN_NUMBER,
  SN_INTEGER,
  SN_BOOL,
  SN_NULL,
  SN_ENUM, /* one of the literals of the trie at sub */
  SN_REF,  /* compile time only */
};

/* built-in nodes */
enum {
  SN_ANY = 0,
  SN_ANY_OBJ,
  SN_ANY_ARR,
  SN_ANY_STR,
  SN_ANY_NUM,
  SN_ANY_BOOL,
  SN_ANY_NULL,
  SN_ANY_INT,
  SN_N_BUILTIN
};

#define SN_UNLIMITED UINT32_MAX /* b of a string or an array without a maximum */
#define SN_MD_NONE 255          /* md of a node with no finite instance */

typedef struct ss_node {
  uint8_t kind;
  uint8_t md;    /* containers (objects + arrays) the smallest instance opens, nested (an enum:
                  * its deepest value's); SN_MD_NONE: none */
  uint8_t mdmax; /* SN_OBJECT: the largest md of its properties' nodes */
  uint8_t pad;
  uint32_t a, b; /* SN_STRING: code points a..b; SN_ARRAY: items a..b */
  int32_t sub;   /* SN_ARRAY: the items' node; SN_OBJECT: its first entry in props; SN_UNION:
                  * its table in first; SN_ENUM: its trie's root */
  int32_t np;    /* SN_OBJECT: properties */
  int32_t trie;  /* SN_OBJECT: the root of the trie of its keys' encodings (quotes included) */
  int32_t nw;    /* SN_OBJECT: 64-bit words in each of its trie nodes' property sets */
  int32_t req;   /* SN_OBJECT: freq[req + k], k = 0..np: the first required property >= k (np:
                  * none); SN_ARRAY: its np prefix items' nodes at pitems[req] */
  int32_t ap;    /* SN_OBJECT: the node of additional properties' values, -1: none */
} ss_node;

/* SN_NUMBER, SN_INTEGER with sub >= 0: their bounds are nums[sub] (json_num.h) */

typedef struct ss_prop {
  int32_t node;
  int32_t required;
} ss_prop;

/* A trie node: edges ec/ech[e0 .. e0 + ne) sorted by byte; term: the literal that ends here (a
 * key trie: the property's index; an enum trie: 0), -1 when none; bits: a key trie's set of the
 * properties below (nw words at bits[bits]). */
typedef struct ss_tnode {
  int32_t e0, ne, term, bits;
} ss_tnode;

/* A parameter of a tool whose calls are in the XML form. */
typedef struct ss_xparam {
  char *lit;   /* NAME ">\n", the rest of its <parameter= tag (owned) */
  size_t len;  /* strlen(lit) */
  char *key;   /* its key's canonical JSON encoding and ':' (owned) */
  int32_t raw; /* 1: a string parameter, its value raw text; 0: its value is JSON text */
} ss_xparam;

struct json_schema {
  int32_t root;
  int32_t nn;
  ss_node *nodes;
  ss_prop *props;
  uint32_t *freq;
  int32_t *first;
  ss_tnode *tn;
  uint8_t *ec;
  int32_t *ech;
  uint64_t *bits;
  int32_t *pitems;
  json_num *nums;
  regex_dfa *dfa;
  int32_t ndfa;
  /* A tool-call grammar (tool_grammar.h) when ntools > 0; the fields above are then unused: an
   * optional think block (tthink: the text opens inside one and must close it with "</think>"),
   * then calls separated by whitespace, call k being tpre[k] (literal), one object under
   * targs[k], then tsuf (literal); at most tmax calls (0: any number), at least one. */
  int32_t ntools, tmax;
  int32_t tthink;
  char **tpre;         /* [ntools] NUL-terminated (owned) */
  size_t *tprelen;     /* [ntools] */
  json_schema **targs; /* [ntools] (owned) */
  char *tsuf;          /* (owned) */
  /* txml: the calls are in the XML form (tool_grammar_xml): tpre[k] ends at "<function=NAME>",
   * then tool k's parameters as <parameter=NAME> blocks, read as the JSON object they stand
   * for under targs[k]; tsuf closes the call after "</function>". */
  int32_t txml;
  /* tfree: tool_choice auto with at most one call (tool_grammar_single): any text, but after the
   * first "</tool_call>" that follows a "<tool_call>" outside the think block, only eos; the
   * other tool fields are unused */
  int32_t tfree;
  int32_t *tnp;        /* [ntools] tool k's parameters */
  ss_xparam **tparams; /* [ntools][tnp[k]] (owned) */
};

#endif /* DS_JSON_SCHEMA_INTERNAL */
#endif
