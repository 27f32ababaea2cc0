/* test_json_schema — response_format json_schema: json_schema_compile on a realistic set of
 * schemas and on each unsupported or invalid part (the message names it); the schema-guided
 * recognizer (json_mask_feed) against tables of valid instances (each proper prefix accepted and
 * incomplete) and invalid texts (each rejected at the expected byte); the token mask against a
 * brute-force reference (every token tried on a copy of a mask fed the text so far) on
 * synthetic vocabularies over random walks, every completed walk parsed by jansson and checked
 * by a small validator written here (independent of the recognizer); and the real Qwen3
 * vocabulary when node_modules has it (checks in the states of a realistic schema, and the times
 * of json_mask_apply, of json_mask_prepare and of an apply after it, printed). Wherever the mask
 * is compared with the reference, json_mask_prepare + apply is compared with apply alone too
 * (the same logits).
 *
 * Schemas and texts are written with ' for " (q() swaps them back). In texts, '|' marks the byte
 * that must be rejected. The helpers shared with test_json_mask (test vocabularies, the
 * reference's rules, the real vocabulary) are in json_vocab_util.h. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema_util.h"
#include "json_vocab_util.h"
#include "sampler/json_mask.h"
#include "sampler/json_schema.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static json_t *parse(const char *text) {
  json_error_t e;
  json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
  if (!j) fprintf(stderr, "bad test JSON: %s: %s\n", e.text, text);
  return j;
}

/* compiles q(text); NULL with err filled */
static json_schema *compile_q(const char *text, char *err, size_t errlen) {
  json_t *j = parse(q(text));
  if (!j) {
    snprintf(err, errlen, "test schema does not parse");
    return NULL;
  }
  json_schema *s = json_schema_compile(j, err, errlen);
  json_decref(j); /* the compiled schema must not need it */
  return s;
}

/* a vocabulary of two tokens (the byte-level checks feed bytes, not tokens) */
static json_vocab *tiny_vocab(void) {
  const char *b[] = {"{", "<eos>"};
  size_t l[] = {1, 5};
  unsigned char sp[] = {0, 1};
  int32_t eos[] = {1};
  return json_vocab_new(2, b, l, sp, eos, 1);
}

/* ---- the schemas ------------------------------------------------------------------------ */

/* a person: bounded strings, an integer, a nullable string, an array of enum strings, an enum
 * of mixed values (numbers that prefix each other, an object), a number, a free object, any */
static const char S_PERSON[] =
    "{'type':'object','properties':{"
    "'name':{'type':'string','minLength':1,'maxLength':8},"
    "'age':{'type':'integer'},"
    "'email':{'type':['string','null']},"
    "'tags':{'type':'array','items':{'type':'string','enum':['a','b','ab']},'minItems':1,"
    "'maxItems':3},"
    "'kind':{'enum':['cat','dog',1,12,1.5,null,true,{'x':[1]}]},"
    "'score':{'type':'number'},"
    "'meta':{'type':'object'},"
    "'any':{}},"
    "'required':['name','tags'],'additionalProperties':false}";

/* recursion through $defs, anyOf of a bounded string, null and an array of booleans */
static const char S_TREE[] =
    "{'$defs':{'node':{'type':'object','properties':{'v':{'type':'integer'},"
    "'kids':{'type':'array','items':{'$ref':'#/$defs/node'},'maxItems':2}},"
    "'required':['v'],'additionalProperties':false}},"
    "'type':'object','properties':{'root':{'$ref':'#/$defs/node'},"
    "'note':{'anyOf':[{'type':'string','maxLength':3},{'type':'null'},"
    "{'type':'array','items':{'type':'boolean'}}]}},"
    "'required':['root'],'additionalProperties':false}";

/* keys that need escapes or are not ASCII, a const with an escape, a nested required string */
static const char S_KEYS[] =
    "{'type':'object','properties':{"
    "'a\\'b':{'const':'x\\ny'},"
    "'\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87':{'type':'boolean'},"
    "'\\u0001':{'type':'null'},"
    "'n':{'type':'object','properties':{'p':{'type':'number'},"
    "'q':{'type':'string','minLength':2}},'required':['q']}},"
    "'required':['n']}";

/* the root an enum of objects */
static const char S_ENUM_ROOT[] = "{'enum':[{'a':1},{'b':[true,'s']},{}]}";

/* an optional property whose value is the root again ("#") */
static const char S_SELF[] = "{'type':'object','properties':{'c':{'$ref':'#'},'d':{}}}";

/* arrays: bounded items, nested arrays of integers, a union of number and string */
static const char S_ARRAYS[] =
    "{'type':'object','properties':{"
    "'m':{'type':'array','items':{'type':'array','items':{'type':'integer'},'maxItems':2},"
    "'minItems':2},"
    "'u':{'type':'array','items':{'type':['number','string','integer']}},"
    "'e':{'type':'array','maxItems':0}},"
    "'required':['m'],'additionalProperties':false}";

/* keys and enum values with whitespace inside (literals the mask judges by their first byte) */
static const char S_SPACES[] =
    "{'type':'object','properties':{"
    "'first name':{'enum':['a b','a  c',' x','\\t',1]},"
    "' k':{'type':'string','maxLength':2},"
    "'  ':{'type':'integer'}},"
    "'required':['first name']}";

/* a form: a key with a space, an enum of phrases, a fixed-length code, a number */
static const char S_TASK[] =
    "{'type':'object','properties':{'first name':{'type':'string'},"
    "'state':{'type':'string','enum':['in progress','not started','done','on hold']},"
    "'code':{'type':'string','minLength':3,'maxLength':3},'ratio':{'type':'number'}},"
    "'required':['first name','state'],'additionalProperties':false}";

/* an OpenAI-style strict schema */
static const char S_STRICT[] =
    "{'type':'object','properties':{"
    "'name':{'type':'string','description':'full name'},"
    "'age':{'type':'integer'},"
    "'email':{'type':['string','null']},"
    "'address':{'type':'object','properties':{'street':{'type':'string'},"
    "'city':{'type':'string','maxLength':40},"
    "'zip':{'type':'string','minLength':5,'maxLength':10}},"
    "'required':['street','city','zip'],'additionalProperties':false},"
    "'status':{'type':'string','enum':['active','inactive','pending']},"
    "'items':{'type':'array','items':{'$ref':'#/$defs/item'},'maxItems':10},"
    "'notes':{'anyOf':[{'type':'string'},{'type':'null'}]}},"
    "'required':['name','age','email','address','status','items','notes'],"
    "'additionalProperties':false,"
    "'$defs':{'item':{'type':'object','properties':{'sku':{'type':'string'},"
    "'qty':{'type':'integer'},'price':{'type':'number'}},"
    "'required':['sku','qty','price'],'additionalProperties':false}}}";

/* ---- compile ---------------------------------------------------------------------------- */

TEST(compile_accepts) {
  static const char *const ok[] = {
      S_PERSON,
      S_TREE,
      S_KEYS,
      S_ENUM_ROOT,
      S_SELF,
      S_ARRAYS,
      S_SPACES,
      S_TASK,
      S_STRICT,
      "{'type':'object'}",
      "{'type':'object','properties':{}}",
      "{'properties':{'a':{'type':'string'}}}",
      "{'type':'object','properties':{'x':{'type':['number','integer']}}}",
      "{'$schema':'https://json-schema.org/draft/2020-12/schema','$id':'x','title':'t',"
      "'description':'d','type':'object','strict':true,'name':'n','$comment':'c',"
      "'properties':{'a':{'type':'string','description':'x','default':'y','examples':['z'],"
      "'deprecated':false,'readOnly':true,'writeOnly':false}}}",
      "{'definitions':{'d':{'type':'string'}},'type':'object',"
      "'properties':{'a':{'$ref':'#/definitions/d'}}}",
      "{'type':'object','properties':{'o':{'oneOf':[{'type':'string'},{'type':'null'},"
      "{'type':'object','properties':{'k':{'type':'boolean'}}},{'type':'array'},"
      "{'type':'number'},{'type':'boolean'}]}}}",
      "{'type':'object','properties':{'s':{'type':'string','enum':['a','b',3]},"
      "'c':{'const':{'k':[1,2.5,'x']}},'i':{'items':{'type':'integer'}},"
      "'l':{'minLength':1},'z':true}}",
      "{'type':'object','properties':{'a':{'$ref':'#/$defs/a~1b'}},"
      "'$defs':{'a/b':{'type':'null'}}}",
      "{'type':'object','additionalProperties':false}",
      "{'const':{'k':1}}",
      "{'type':'object','properties':{'x':{'type':'number','enum':[0.1,1e300,-0.0,2]}}}",
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    char err[256] = "";
    json_schema *s = compile_q(ok[i], err, sizeof err);
    EXPECT_MSG(s, "schema %zu refused: %s", i, err);
    json_schema_free(s);
  }
  json_schema_free(NULL);
  char err[128];
  EXPECT(json_schema_compile(NULL, err, sizeof err) == NULL);
}

typedef struct bad_schema {
  const char *schema;
  const char *msg; /* a part of the message */
} bad_schema;

TEST(compile_rejects) {
  /* each unsupported keyword, inside a property: named, with where */
  static const char *const kws[][2] = {
      {"patternProperties", "{}"},
      {"propertyNames", "{}"},
      {"minProperties", "1"},
      {"maxProperties", "1"},
      {"dependentRequired", "{}"},
      {"dependentSchemas", "{}"},
      {"if", "{}"},
      {"then", "{}"},
      {"else", "{}"},
      {"not", "{}"},
      {"uniqueItems", "true"},
      {"contains", "{}"},
      {"unevaluatedProperties", "false"},
      {"nullable", "true"},
      {"foo", "1"},
      {"dependencies", "{}"},
  };
  for (size_t i = 0; i < sizeof kws / sizeof *kws; i++) {
    char schema[256], want[128], err[256] = "";
    snprintf(schema, sizeof schema,
             "{'type':'object','properties':{'x':{'type':'string','%s':%s}}}", kws[i][0],
             kws[i][1]);
    snprintf(want, sizeof want, "'%s' is not supported (at #/properties/x)", kws[i][0]);
    json_schema *s = compile_q(schema, err, sizeof err);
    EXPECT_MSG(!s && !strcmp(err, want), "%s: \"%s\", expected \"%s\"", kws[i][0], err, want);
    json_schema_free(s);
  }
  static const bad_schema bad[] = {
      /* the root */
      {"{'type':'string'}", "the root must be an object schema (at #)"},
      {"{'type':'array'}", "the root must be an object schema"},
      {"true", "the root must be an object schema"},
      {"{}", "the root must be an object schema"},
      {"{'title':'x'}", "the root must be an object schema"},
      {"{'type':['object','null']}", "the root must be an object schema"},
      {"{'enum':[1,{'a':1}]}", "the root must be an object schema"},
      {"{'anyOf':[{'type':'object'},{'type':'null'}]}", "the root must be an object schema"},
      {"false", "a false schema is not supported"},
      {"[1]", "a schema must be an object or true"},
      /* objects */
      {"{'type':'object','properties':{'a':{}},'required':['b']}",
       "required property \"b\" is not in 'properties' (at #)"},
      {"{'type':'object','required':['b']}", "required property \"b\" is not in 'properties'"},
      {"{'type':'object','properties':{'a':{}},'required':['a','a']}",
       "'required' lists \"a\" twice"},
      {"{'type':'object','properties':{'a':{}},'required':'a'}", "'required' must be an array"},
      {"{'type':'object','properties':{'a':{}},'additionalProperties':{'minimum':'x'}}",
       "'minimum' must be a number (at #/additionalProperties)"},
      {"{'type':'object','properties':[]}", "'properties' must be an object"},
      /* arrays */
      {"{'type':'object','properties':{'a':{'type':'array','minItems':-1}}}",
       "'minItems' must be a non-negative integer (at most 2147483647) (at #/properties/a)"},
      {"{'type':'object','properties':{'a':{'type':'array','minItems':1.5}}}",
       "'minItems' must be a non-negative integer"},
      {"{'type':'object','properties':{'a':{'type':'array','minItems':'2'}}}",
       "'minItems' must be a non-negative integer"},
      {"{'type':'object','properties':{'a':{'type':'array','maxItems':3000000000}}}",
       "'maxItems' must be a non-negative integer"},
      {"{'type':'object','properties':{'a':{'type':'array','minItems':3,'maxItems':2}}}",
       "'minItems' is greater than 'maxItems' (at #/properties/a)"},
      {"{'type':'object','properties':{'a':{'type':'array','items':[{}],'prefixItems':[{}]}}}",
       "'items' as an array beside 'prefixItems' is not supported (at #/properties/a)"},
      {"{'type':'object','properties':{'a':{'type':'string','minLength':3,'maxLength':2}}}",
       "'minLength' is greater than 'maxLength'"},
      /* unions */
      {"{'type':'object','properties':{'a':{'anyOf':[{'type':'object'},"
       "{'type':'object','properties':{}}]}}}",
       "'anyOf' schemas 0 and 1 can both start with '{'"},
      {"{'type':'object','properties':{'a':{'anyOf':[{'type':'number'},{'type':'integer'}]}}}",
       "'anyOf' schemas 0 and 1 can both start with '-'"},
      {"{'type':'object','properties':{'a':{'oneOf':[{'type':'array'},{'type':'null'},"
       "{'type':'array','minItems':1}]}}}",
       "'oneOf' schemas 0 and 2 can both start with '[': the branches must start with "
       "different bytes (e.g. an object, a string, null) (at #/properties/a)"},
      {"{'type':'object','properties':{'a':{'anyOf':[{},{'type':'null'}]}}}",
       "'anyOf' schemas 0 and 1 can both start with 'n'"},
      {"{'type':'object','properties':{'a':{'anyOf':[{'type':'null'},{'enum':[1,null]}]}}}",
       "can both start with 'n'"},
      {"{'type':'object','properties':{'a':{'anyOf':[]}}}", "'anyOf' must be a non-empty array"},
      {"{'type':'object','properties':{'a':{'anyOf':[{'type':'null'}],'type':'string'}}}",
       "the 'allOf' schemas' types have nothing in common"},
      {"{'type':'object','properties':{'a':{'anyOf':[{'type':'null'}],'oneOf':[{}]}}}", "beside"},
      /* types */
      {"{'type':'object','properties':{'a':{'type':'str'}}}", "'type' must be one of"},
      {"{'type':'object','properties':{'a':{'type':['null','null']}}}",
       "'type' lists \"null\" twice"},
      {"{'type':'object','properties':{'a':{'type':[]}}}", "'type' must not be an empty array"},
      {"{'type':'object','properties':{'a':{'properties':{},'items':{}}}}",
       "'properties' and 'items' without 'type' are ambiguous (at #/properties/a)"},
      {"{'type':'object','properties':{'a':{'maxItems':1,'minLength':1}}}",
       "'maxItems' and 'minLength' without 'type' are ambiguous"},
      /* enum / const */
      {"{'type':'object','properties':{'a':{'type':'string','enum':[1,2]}}}",
       "no 'enum' / 'const' value is valid under the rest of the schema (at #/properties/a)"},
      {"{'type':'object','properties':{'a':{'enum':[]}}}", "'enum' must be an array of 1 to 256"},
      {"{'type':'object','properties':{'a':{'enum':1}}}", "'enum' must be an array"},
      {"{'type':'object','properties':{'a':{'enum':[1,2],'const':3}}}",
       "'const' is not one of the 'enum' values"},
      {"{'type':'object','properties':{'a':{'type':'string','maxLength':1,'const':'ab'}}}",
       "no 'enum' / 'const' value is valid"},
      /* $ref */
      {"{'type':'object','properties':{'a':{'$ref':'http://x/y.json'}}}",
       "'$ref' \"http://x/y.json\" is not supported: only \"#\", \"#/$defs/NAME\" and "
       "\"#/definitions/NAME\" (at #/properties/a)"},
      {"{'type':'object','properties':{'a':{'$ref':'#/$defs/a/b'}},'$defs':{'a':{'b':{}}}}",
       "is not supported: only"},
      {"{'type':'object','properties':{'a':{'$ref':'#/$defs/zz'}}}",
       "'$ref' target \"#/$defs/zz\" is not found"},
      {"{'type':'object','properties':{'a':{'$ref':'#/$defs/s','type':'string'}},"
       "'$defs':{'s':{'type':'null'}}}",
       "the 'allOf' schemas' types have nothing in common"},
      {"{'type':'object','properties':{'a':{'$ref':1}}}", "'$ref' must be a string"},
      {"{'type':'object','properties':{'x':{'$ref':'#/$defs/a'}},"
       "'$defs':{'a':{'$ref':'#/$defs/b'},'b':{'$ref':'#/$defs/a'}}}",
       "a '$ref' cycle never reaches a schema"},
      {"{'type':'object','properties':{'x':{'$ref':'#/$defs/u'}},"
       "'$defs':{'u':{'anyOf':[{'$ref':'#/$defs/u'},{'type':'null'}]}}}",
       "'anyOf' contains itself (at #/$defs/u)"},
      {"{'type':'object','properties':{'x':{'$ref':'#/$defs/s'}},"
       "'$defs':{'s':{'type':'string','pattern':'(?=a)'}}}",
       "'pattern' \"(?=a)\": lookahead '(?=' is not supported (at #/$defs/s/pattern)"},
      {"{'type':'object','properties':{'self':{'$ref':'#'}},'required':['self']}",
       "the schema has no instance within 64 levels of nesting"},
      {"{'type':'object','properties':{'x':{'type':'object','$defs':[]}}}",
       "'$defs' must be an object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char err[512] = "";
    json_schema *s = compile_q(bad[i].schema, err, sizeof err);
    EXPECT_MSG(!s && strstr(err, bad[i].msg), "schema %zu: \"%s\", expected \"%s\"", i, err,
               bad[i].msg);
    json_schema_free(s);
  }
  /* more than 256 enum values */
  char big[4096] = "{'type':'object','properties':{'a':{'enum':[";
  for (int i = 0; i < 257; i++)
    snprintf(big + strlen(big), sizeof big - strlen(big), "%s%d", i ? "," : "", i);
  strcat(big, "]}}}");
  char err[256] = "";
  json_schema *s = compile_q(big, err, sizeof err);
  EXPECT_MSG(!s && strstr(err, "'enum' must be an array of 1 to 256 values"), "%s", err);
  /* a schema document nested too deeply */
  size_t cap = 200 * 48 + 64;
  char *deep = malloc(cap);
  REQUIRE(deep);
  deep[0] = 0;
  for (int i = 0; i < 200; i++) strcat(deep, "{\"type\":\"object\",\"properties\":{\"a\":");
  strcat(deep, "{}");
  for (int i = 0; i < 200; i++) strcat(deep, "}}");
  json_t *j = parse(deep);
  REQUIRE(j);
  s = json_schema_compile(j, err, sizeof err);
  EXPECT_MSG(!s && strstr(err, "nested too deeply"), "%s", err);
  json_decref(j);
  free(deep);
  /* a short err buffer is filled, cut, and terminated */
  char small[12];
  s = compile_q("{'type':'string'}", small, sizeof small);
  EXPECT(!s && strlen(small) == sizeof small - 1);
  json_schema_free(s);
}

/* ---- the recognizer --------------------------------------------------------------------- */

typedef struct case_t {
  const char *schema;
  const char *text; /* with q()'s quotes; '|' before the byte that must be rejected */
} case_t;

static const case_t valid_cases[] = {
    {S_PERSON, "{'name':'a','tags':['a']}"},
    {S_PERSON,
     "{'name':'h\xc3\xa9llo','age':-12,'email':null,'tags':['a','ab','b'],'kind':12,"
     "'score':1.5e3,'meta':{'x':[1,{'y':null}]},'any':'s'}"},
    {S_PERSON, " { 'name' : 'x' , 'tags' : [ 'b' ] , 'kind' : 1 }"},
    {S_PERSON, "{'name':'12345678','tags':['a'],'kind':{'x':[1]}}"},
    {S_PERSON, "{'name':'\\u00e9\\uD83D\\uDE00\\n\xf0\x9f\x98\x80\\\\\\/\\'','tags':['a']}"},
    {S_PERSON, "{'name':'a','email':'e','tags':['a'],'kind':true,'any':[1,'x',{'k':false}]}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':1.5}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':null,'meta':{}}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':1\n}"},
    {S_PERSON, "{'name':'a','tags':['a'],'any':-0.5e-3}"},
    {S_PERSON, "{'name':'a','age':0,'tags':['ab'],'kind':'dog','any':{'a':{'b':[[]]}}}"},
    {S_TREE, "{'root':{'v':1}}"},
    {S_TREE, "{'root':{'v':0,'kids':[{'v':1,'kids':[]},{'v':2,'kids':[{'v':3}]}]},'note':null}"},
    {S_TREE, "{'root':{'v':-5},'note':'abc'}"},
    {S_TREE, "{'root':{'v':1},'note':[true,false]}"},
    {S_TREE, "{'root':{'v':1},'note':[]}"},
    {S_KEYS, "{'n':{'q':'ab'}}"},
    {S_KEYS,
     "{'a\\'b':'x\\ny','\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87':true,'\\u0001':null,"
     "'n':{'p':1,'q':'\\u00e9\\u00e9'}}"},
    {S_KEYS, "{'\\u0001':null,'n':{'q':'\xf0\x9f\x98\x80\xf0\x9f\x98\x80'}}"},
    {S_ENUM_ROOT, "{'a':1}"},
    {S_ENUM_ROOT, "  {'b':[true,'s']}"},
    {S_ENUM_ROOT, "{}"},
    {S_SELF, "{}"},
    {S_SELF, "{'c':{'c':{}},'d':[1]}"},
    {S_SELF, "{'d':{'c':1}}"},
    {S_ARRAYS, "{'m':[[],[1,-2]]}"},
    {S_ARRAYS, "{'m':[[0],[]],'u':[1.5,'x',-3,0e1],'e':[]}"},
    {S_SPACES, "{'first name':'a b'}"},
    {S_SPACES, "{ 'first name' : 1 , ' k' : 'xy' , '  ' : -3 }"},
    {S_SPACES, "{'first name':' x','  ':0}"},
    {S_SPACES, "{'first name':'a  c',' k':''}"},
    {S_SPACES, "{'first name':'\\t',' k':'\\t\\u00e9'}"},
};

static const case_t invalid_cases[] = {
    {S_PERSON, "{'|tags':['a']}"},                       /* a required key skipped */
    {S_PERSON, "{'name':'a'|}"},                         /* a required key missing */
    {S_PERSON, "{'name':'a','tags':['a'],'a|ge':1}"},    /* out of order ('any' starts with a) */
    {S_PERSON, "{'name':'a','tags':['a'],'|zzz':1}"},    /* not a property */
    {S_PERSON, "{'name':'a','|name':'b','tags':['a']}"}, /* twice */
    {S_PERSON, "{'name':|1,'tags':['a']}"},              /* wrong types */
    {S_PERSON, "{'name':'a','age':|'1','tags':['a']}"},
    {S_PERSON, "{'name':'a','age':1|.5,'tags':['a']}"},
    {S_PERSON, "{'name':'a','age':1|e5,'tags':['a']}"},
    {S_PERSON, "{'name':'a','email':|1,'tags':['a']}"},
    {S_PERSON, "{'name':'a','tags':|'a'}"},
    {S_PERSON, "{'name':'a','tags':['a'],'meta':|[]}"},
    {S_PERSON, "{'name':'a','tags':['a'],'score':|true}"},
    {S_PERSON, "{'name':'a','tags':['|c']}"}, /* enum mismatches */
    {S_PERSON, "{'name':'a','tags':['a|c']}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':'c|o'}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':12|3}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':1.|6}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':{'x':[1|,2]}}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':{'x':[1]|,'y':1}}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':|false}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':1|0}"},
    {S_PERSON, "{'name':'a','tags':[|]}"},                /* too few items */
    {S_PERSON, "{'name':'a','tags':['a','a','a'|,'a']}"}, /* too many */
    {S_PERSON, "{'name':'12345678|9','tags':['a']}"},     /* too long */
    {S_PERSON, "{'name':'1234567\xc3\xa9|\xc3\xa9','tags':['a']}"},
    {S_PERSON, "{'name':'1234567\\n|\\n','tags':['a']}"},
    {S_PERSON, "{'name':'1234567\\uD83D\\uDE00|x','tags':['a']}"},
    {S_PERSON, "{'name':'|','tags':['a']}"},         /* too short */
    {S_PERSON, "{'name':'\\uD83D|x','tags':['a']}"}, /* lone surrogates */
    {S_PERSON, "{'name':'\\uD83D\\|n','tags':['a']}"},
    {S_PERSON, "{'name':'\\uD83D\\uD|83D','tags':['a']}"},
    {S_PERSON, "{'name':'\\uD|E00','tags':['a']}"},
    {S_PERSON, "{'name':'\\ud|c00','tags':['a']}"},
    {S_PERSON, "{'name':'a','tags':['a']}| "}, /* nothing after the root */
    {S_PERSON, "{'name':'a','tags':['a'],|}"},
    {S_PERSON, "{'name':'a','tags':['a'],'kind':1                |  }"}, /* 17 spaces */
    {S_PERSON, "|['a']"},
    {S_TREE, "{'root':{'v':1,'kids':[{'v':1},{'v':2}|,{'v':3}]}}"}, /* maxItems 2 */
    {S_TREE, "{'root':{'|kids':[]}}"},
    {S_TREE, "{'|note':null}"},
    {S_TREE, "{'root':{'v':1},'note':'abc|d'}"},
    {S_TREE, "{'root':{'v':1},'note':|1}"},
    {S_TREE, "{'root':{'v':1},'note':[|1]}"},
    {S_TREE, "{'root':{'v':1,'kids':[{'v':|true}]}}"},
    {S_TREE, "{'root':{'v':1,'kids':[{'v':1,'|w':1}]}}"},
    {S_KEYS, "{'a\\'b':'x|y','n':{'q':'ab'}}"},
    {S_KEYS, "{'a\\'b':'x\\ny'|}"},
    {S_KEYS, "{'n':{'q':'a|'}}"},
    {S_KEYS, "{'n':{'p':1|}}"},
    {S_KEYS, "{'\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87':true|}"},
    {S_KEYS, "{'\\u000|2':null,'n':{'q':'ab'}}"}, /* the key's one encoding: \u0001 */
    {S_KEYS, "{'a|\"b':'x\\ny','n':{'q':'ab'}}"},
    {S_ENUM_ROOT, "{'a':|2}"},
    {S_ENUM_ROOT, "{| 'a':1}"},
    {S_ENUM_ROOT, "{'b':[true,'s'|,1]}"},
    {S_ARRAYS, "{'m':[[]|]}"},
    {S_ARRAYS, "{'m':[[1,2|,3],[]]}"},
    {S_ARRAYS, "{'m':[[1|.5],[]]}"},
    {S_ARRAYS, "{'m':[[],[]],'e':[|1]}"},
    {S_ARRAYS, "{'m':[[],[]],'u':[|true]}"},
    {S_SPACES, "{'first name':'a |c'}"},
    {S_SPACES, "{'first name':'a  |b'}"},
    {S_SPACES, "{'first | name':1}"},
    {S_SPACES, "{'first name':' x',' k':'ab|c'}"},
    {S_SPACES, "{'first name':1|2}"},
    {S_SPACES, "{'first name':'\\t','  | ':1}"},
};

/* a schema mask fed the first n bytes of s: 0 ok (*complete set), -1 rejected */
static int feed_text(const json_schema *sc, const json_vocab *v, const char *s, size_t n,
                     int *complete) {
  json_mask *m = json_mask_new_schema(v, sc);
  if (!m) return -2;
  int r = json_mask_feed(m, s, n);
  if (complete) *complete = r == 0 && json_mask_complete(m);
  json_mask_free(m);
  return r;
}

TEST(recognizer_valid) {
  json_vocab *v = tiny_vocab();
  REQUIRE(v);
  for (size_t i = 0; i < sizeof valid_cases / sizeof *valid_cases; i++) {
    char err[256];
    json_schema *sc = compile_q(valid_cases[i].schema, err, sizeof err);
    EXPECT_MSG(sc, "case %zu: %s", i, err);
    if (!sc) continue;
    const char *s = q(valid_cases[i].text);
    size_t n = strlen(s);
    for (size_t k = 0; k <= n; k++) {
      int complete;
      int r = feed_text(sc, v, s, k, &complete);
      EXPECT_MSG(r == 0, "case %zu: prefix %zu of \"%s\" rejected", i, k, s);
      EXPECT_MSG(r != 0 || complete == (k == n), "case %zu: prefix %zu of \"%s\": complete %d", i,
                 k, s, complete);
    }
    /* byte by byte on one mask, and in two pieces */
    json_mask *m = json_mask_new_schema(v, sc);
    REQUIRE(m);
    int ok = 1;
    for (size_t k = 0; k < n && ok; k++) ok = json_mask_feed(m, s + k, 1) == 0;
    EXPECT_MSG(ok && json_mask_complete(m), "case %zu byte by byte", i);
    json_mask_free(m);
    for (size_t p = 0; p <= n; p++) {
      m = json_mask_new_schema(v, sc);
      REQUIRE(m);
      ok = json_mask_feed(m, s, p) == 0 && json_mask_feed(m, s + p, n - p) == 0;
      EXPECT_MSG(ok && json_mask_complete(m), "case %zu split at %zu", i, p);
      json_mask_free(m);
    }
    /* and it is valid JSON */
    json_error_t e;
    json_t *j = json_loads(s, JSON_REJECT_DUPLICATES, &e);
    EXPECT_MSG(j, "case %zu: jansson: %s", i, e.text);
    json_decref(j);
    json_schema_free(sc);
  }
  json_vocab_free(v);
}

TEST(recognizer_invalid) {
  json_vocab *v = tiny_vocab();
  REQUIRE(v);
  for (size_t i = 0; i < sizeof invalid_cases / sizeof *invalid_cases; i++) {
    char err[256];
    json_schema *sc = compile_q(invalid_cases[i].schema, err, sizeof err);
    EXPECT_MSG(sc, "case %zu: %s", i, err);
    if (!sc) continue;
    const char *raw = q(invalid_cases[i].text);
    const char *bar = strchr(raw, '|');
    EXPECT_MSG(bar, "case %zu has no |", i);
    if (!bar) {
      json_schema_free(sc);
      continue;
    }
    size_t bad = (size_t)(bar - raw);
    char s[512];
    snprintf(s, sizeof s, "%.*s%s", (int)bad, raw, bar + 1);
    size_t n = strlen(s);
    for (size_t k = 0; k <= bad; k++) {
      int complete;
      EXPECT_MSG(feed_text(sc, v, s, k, &complete) == 0 && (k == bad || !complete),
                 "case %zu: prefix %zu of \"%s\" (bad at %zu) rejected or complete", i, k, s, bad);
    }
    EXPECT_MSG(feed_text(sc, v, s, bad + 1, NULL) == -1, "case %zu: \"%s\" not rejected at %zu", i,
               s, bad);
    EXPECT_MSG(feed_text(sc, v, s, n, NULL) == -1, "case %zu: whole \"%s\" accepted", i, s);
    /* a rejected mask stays dead */
    json_mask *m = json_mask_new_schema(v, sc);
    REQUIRE(m);
    EXPECT(json_mask_feed(m, s, n) == -1 && json_mask_dead(m));
    EXPECT(json_mask_feed(m, "}", 1) == -1 && !json_mask_complete(m));
    json_mask_free(m);
    json_schema_free(sc);
  }
  json_vocab_free(v);
}

TEST(recognizer_depth) {
  json_vocab *v = tiny_vocab();
  REQUIRE(v);
  char err[256];
  /* any value: 64 open containers at most, as the free mask */
  json_schema *sc = compile_q("{'type':'object','properties':{'a':{}}}", err, sizeof err);
  REQUIRE(sc);
  char text[1024];
  strcpy(text, "{\"a\":");
  for (int i = 0; i < 63; i++) strcat(text, "[");
  int complete;
  EXPECT(feed_text(sc, v, text, strlen(text), &complete) == 0);
  strcat(text, "{");
  EXPECT(feed_text(sc, v, text, strlen(text), &complete) == -1);
  text[strlen(text) - 1] = 0;
  for (int i = 0; i < 63; i++) strcat(text, "]");
  strcat(text, "}");
  EXPECT(feed_text(sc, v, text, strlen(text), &complete) == 0 && complete);
  json_schema_free(sc);
  /* a recursive optional property: at depth 64 its key is refused (its value would need 65),
   * the other one ("d", any value: a scalar fits) is not */
  sc = compile_q(S_SELF, err, sizeof err);
  REQUIRE(sc);
  text[0] = 0;
  for (int i = 0; i < 63; i++) strcat(text, "{\"c\":");
  strcat(text, "{");
  EXPECT(feed_text(sc, v, text, strlen(text), NULL) == 0);
  strcat(text, "\"c");
  EXPECT(feed_text(sc, v, text, strlen(text), NULL) == -1);
  text[strlen(text) - 1] = 0;
  EXPECT(feed_text(sc, v, text, strlen(text), NULL) == 0);
  strcat(text, "d\":[");
  EXPECT(feed_text(sc, v, text, strlen(text), NULL) == -1);
  text[strlen(text) - 1] = 0;
  strcat(text, "1");
  for (int i = 0; i < 64; i++) strcat(text, "}");
  EXPECT(feed_text(sc, v, text, strlen(text), &complete) == 0 && complete);
  json_schema_free(sc);
  /* a required chain 3 deep under an optional array of depth 62: the array item fits only
   * while the chain does */
  sc = compile_q(
      "{'type':'object','properties':{'a':{'$ref':'#/$defs/x'}},"
      "'$defs':{'x':{'type':'array','items':{'$ref':'#/$defs/x'}}}}",
      err, sizeof err);
  REQUIRE(sc);
  strcpy(text, "{\"a\":");
  for (int i = 0; i < 63; i++) strcat(text, "[");
  EXPECT(feed_text(sc, v, text, strlen(text), NULL) == 0);
  strcat(text, "[");
  EXPECT(feed_text(sc, v, text, strlen(text), NULL) == -1);
  json_schema_free(sc);
  json_vocab_free(v);
}

TEST(mask_api) {
  json_vocab *v = tiny_vocab();
  REQUIRE(v);
  EXPECT(json_mask_new_schema(v, NULL) == NULL);
  char err[256];
  json_schema *sc =
      compile_q("{'type':'object','properties':{'a':{'type':'null'}}}", err, sizeof err);
  REQUIRE(sc);
  json_mask *m = json_mask_new_schema(v, sc), *c = json_mask_new_schema(v, sc);
  REQUIRE(m && c);
  json_mask_prepare(m, 2);
  json_mask_prepare(c, 2); /* dropped by the feed and the copy below */
  EXPECT(json_mask_feed(m, "{\"a\"", 4) == 0);
  json_mask_copy(c, m);
  float lg[2] = {1.0f, 2.0f};
  json_mask_apply(c, lg, 2); /* after a key: not '{' (c's prepared set allowed it), so only eos */
  EXPECT(isinf(lg[0]) && lg[1] == 2.0f);
  EXPECT(json_mask_feed(c, ":null}", 6) == 0 && json_mask_complete(c));
  EXPECT(!json_mask_complete(m) && json_mask_feed(m, ":1", 2) == -1 && json_mask_dead(m));
  EXPECT(json_mask_feed(c, "", 0) == 0);
  /* the free mask has the byte-level calls too */
  json_mask *f = json_mask_new(v);
  REQUIRE(f);
  EXPECT(json_mask_feed(f, "{\"x\":[1]}", 9) == 0 && json_mask_complete(f));
  EXPECT(json_mask_feed(f, " ", 1) == -1 && json_mask_dead(f));
  json_mask_free(f);
  json_mask_free(m);
  json_mask_free(c);
  json_schema_free(sc);
  json_vocab_free(v);
}

/* ---- an independent validator (the subset's meaning, over jansson values) --------------- */

static size_t cps(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
  return k;
}

static int is_type(const json_t *x, const char *t) {
  if (!strcmp(t, "object")) return json_is_object(x);
  if (!strcmp(t, "array")) return json_is_array(x);
  if (!strcmp(t, "string")) return json_is_string(x);
  if (!strcmp(t, "number")) return json_is_number(x);
  if (!strcmp(t, "integer"))
    return json_is_integer(x) ||
           (json_is_real(x) && json_real_value(x) == floor(json_real_value(x)));
  if (!strcmp(t, "boolean")) return json_is_boolean(x);
  if (!strcmp(t, "null")) return json_is_null(x);
  return 0;
}

/* x is valid under schema sch (root for $ref); keys of a schema object with properties must
 * also come in their order there (the generator's promise) */
static int tvalid(const json_t *root, const json_t *sch, const json_t *x, int depth) {
  if (depth > 300) return 0;
  if (json_is_true(sch)) return 1;
  if (!json_is_object(sch)) return 0;
  const json_t *ref = json_object_get(sch, "$ref");
  if (ref) {
    const char *r = json_string_value(ref);
    const json_t *t = NULL;
    if (!strcmp(r, "#"))
      t = root;
    else if (!strncmp(r, "#/$defs/", 8))
      t = json_object_get(json_object_get(root, "$defs"), r + 8);
    else if (!strncmp(r, "#/definitions/", 14))
      t = json_object_get(json_object_get(root, "definitions"), r + 14);
    return t && tvalid(root, t, x, depth + 1);
  }
  const json_t *l;
  if ((l = json_object_get(sch, "anyOf"))) {
    for (size_t i = 0; i < json_array_size(l); i++)
      if (tvalid(root, json_array_get(l, i), x, depth + 1)) return 1;
    return 0;
  }
  if ((l = json_object_get(sch, "oneOf"))) {
    int k = 0;
    for (size_t i = 0; i < json_array_size(l); i++)
      k += tvalid(root, json_array_get(l, i), x, depth + 1);
    return k == 1;
  }
  const json_t *ty = json_object_get(sch, "type");
  if (json_is_string(ty) && !is_type(x, json_string_value(ty))) return 0;
  if (json_is_array(ty)) {
    int any = 0;
    for (size_t i = 0; i < json_array_size(ty); i++)
      any |= is_type(x, json_string_value(json_array_get(ty, i)));
    if (!any) return 0;
  }
  if ((l = json_object_get(sch, "enum"))) {
    int any = 0;
    for (size_t i = 0; i < json_array_size(l); i++)
      any |= json_equal((json_t *)x, json_array_get(l, i));
    if (!any) return 0;
  }
  if ((l = json_object_get(sch, "const")) && !json_equal((json_t *)x, (json_t *)l)) return 0;
  if (json_is_object(x)) {
    const json_t *props = json_object_get(sch, "properties");
    const json_t *ap = json_object_get(sch, "additionalProperties");
    const char *k;
    json_t *val;
    long last = -1;
    json_object_foreach((json_t *)x, k, val) {
      const json_t *ps = props ? json_object_get(props, k) : NULL;
      if (!ps) {
        if (props || json_is_false(ap)) return 0;
        continue;
      }
      long idx = 0;
      const char *pk;
      json_t *pv;
      json_object_foreach((json_t *)props, pk, pv) {
        if (!strcmp(pk, k)) break;
        idx++;
      }
      if (idx <= last) return 0;
      last = idx;
      if (!tvalid(root, ps, val, depth + 1)) return 0;
    }
    const json_t *req = json_object_get(sch, "required");
    for (size_t i = 0; i < json_array_size(req); i++)
      if (!json_object_get(x, json_string_value(json_array_get(req, i)))) return 0;
  }
  if (json_is_array(x)) {
    const json_t *it = json_object_get(sch, "items");
    const json_t *mn = json_object_get(sch, "minItems"), *mx = json_object_get(sch, "maxItems");
    if (mn && (json_int_t)json_array_size(x) < json_integer_value(mn)) return 0;
    if (mx && (json_int_t)json_array_size(x) > json_integer_value(mx)) return 0;
    for (size_t i = 0; it && i < json_array_size(x); i++)
      if (!tvalid(root, it, json_array_get(x, i), depth + 1)) return 0;
  }
  if (json_is_string(x)) {
    size_t n = cps(json_string_value(x), json_string_length(x));
    const json_t *mn = json_object_get(sch, "minLength"), *mx = json_object_get(sch, "maxLength");
    if (mn && (json_int_t)n < json_integer_value(mn)) return 0;
    if (mx && (json_int_t)n > json_integer_value(mx)) return 0;
  }
  return 1;
}

TEST(validator_self_check) {
  /* the test's validator agrees with the tables */
  for (size_t i = 0; i < sizeof valid_cases / sizeof *valid_cases; i++) {
    json_t *sch = parse(q(valid_cases[i].schema)), *x = parse(q(valid_cases[i].text));
    REQUIRE(sch && x);
    EXPECT_MSG(tvalid(sch, sch, x, 0), "valid case %zu refused by the test validator", i);
    json_decref(sch);
    json_decref(x);
  }
  static const case_t wrong[] = {
      {S_PERSON, "{'tags':['a']}"},
      {S_PERSON, "{'name':'a','tags':['a'],'age':1}"},
      {S_PERSON, "{'name':'123456789','tags':['a']}"},
      {S_PERSON, "{'name':'a','tags':['a','a','a','a']}"},
      {S_PERSON, "{'name':'a','tags':['a'],'kind':2}"},
      {S_TREE, "{'root':{'v':1.5}}"},
      {S_KEYS, "{'n':{'q':'a'}}"},
  };
  for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
    json_t *sch = parse(q(wrong[i].schema)), *x = parse(q(wrong[i].text));
    REQUIRE(sch && x);
    EXPECT_MSG(!tvalid(sch, sch, x, 0), "wrong case %zu accepted by the test validator", i);
    json_decref(sch);
    json_decref(x);
  }
}

/* ---- the brute-force reference --------------------------------------------------------- */

/* ---- random walks over synthetic vocabularies ------------------------------------------- */

/* the vocabulary of a walk: the special and eos tokens, pieces of valid instances cut at random
 * (so every schema literal can be written), single bytes of the alphabet, and random strings */
typedef struct wvocab {
  tvocab tv;
  char *pool;
} wvocab;

enum { W_SPECIAL, W_EOS, W_EOS2, W_EMPTY, W_FIRST };

static int wv_build(wvocab *w, const case_t *seeds, int n_seeds, uint64_t *x) {
  static const char alphabet[] =
      "{}[]\":,  \n\t0123456789-+.eEtrufalsn\\u/abxyzQ{\"\"}:\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98"
      "\x80\xed\xa0\x01\xff\xc0"
      "DdEe";
  static const char *const extra[] = {"\\uD83D", "\\uDE00", "\\ud800", "\\udc00", "\\u00e9",
                                      "\\u0001", "\\n",     "\\\"",    "\":",     "\",\"",
                                      "\":\"",   "\"}",     "\"]",     "},",      "}}",
                                      "]}",      "null",    "true",    "false",   " \""};
  const int n_alpha = (int)sizeof alphabet - 1;
  int cap = 4000;
  w->tv.bytes = calloc((size_t)cap, sizeof *w->tv.bytes);
  w->tv.lens = calloc((size_t)cap, sizeof *w->tv.lens);
  w->tv.special = calloc((size_t)cap, 1);
  w->pool = malloc((size_t)cap * 16);
  if (!w->tv.bytes || !w->tv.lens || !w->tv.special || !w->pool) return -1;
  int n = 0;
  char *p = w->pool;
#define ADD(b, l)                  \
  do {                             \
    if (n < cap) {                 \
      memcpy(p, (b), (size_t)(l)); \
      w->tv.bytes[n] = p;          \
      w->tv.lens[n] = (size_t)(l); \
      p += 16;                     \
      n++;                         \
    }                              \
  } while (0)
  ADD("<|sp|>", 6);
  w->tv.special[W_SPECIAL] = 1;
  ADD("<|eos|>", 7);
  w->tv.special[W_EOS] = 1;
  ADD("", 0);
  ADD("", 0);
  for (int c = 0; c < n_alpha; c++) ADD(alphabet + c, 1);
  for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) ADD(extra[i], strlen(extra[i]));
  for (int s = 0; s < n_seeds; s++) {
    const char *t = q(seeds[s].text);
    size_t len = strlen(t);
    for (int rep = 0; rep < 3; rep++)
      for (size_t at = 0; at < len;) {
        size_t l = 1 + rng_next(x) % 8;
        if (at + l > len) l = len - at;
        ADD(t + at, l);
        at += l;
      }
  }
  for (int i = 0; i < 300; i++) {
    char b[8];
    int l = 1 + (int)(rng_next(x) % 6);
    for (int k = 0; k < l; k++) b[k] = alphabet[rng_next(x) % (uint64_t)n_alpha];
    ADD(b, l);
  }
#undef ADD
  w->tv.n = n;
  w->tv.eos[0] = W_EOS;
  w->tv.eos[1] = W_EOS2;
  w->tv.n_eos = 2;
  return 0;
}

static void wv_free(wvocab *w) {
  free(w->tv.bytes);
  free(w->tv.lens);
  free(w->tv.special);
  free(w->pool);
}

/* random walks under one schema: at every step the mask equals the reference; a walk that
 * completes is parsed by jansson and accepted by the test's validator */
static void walks(const char *schema, int n_walks, uint64_t seed, int *n_complete_out) {
  char err[256];
  json_schema *sc = compile_q(schema, err, sizeof err);
  EXPECT_MSG(sc, "%s", err);
  if (!sc) return;
  json_t *sch = parse(q(schema));
  REQUIRE(sch);
  const case_t *seeds = NULL;
  int n_seeds = 0;
  for (size_t i = 0; i < sizeof valid_cases / sizeof *valid_cases; i++)
    if (valid_cases[i].schema == schema) {
      if (!seeds) seeds = &valid_cases[i];
      n_seeds++;
    }
  uint64_t x = seed;
  wvocab w;
  memset(&w, 0, sizeof w);
  REQUIRE(wv_build(&w, seeds, n_seeds, &x) == 0);
  json_vocab *v = tv_build(&w.tv);
  REQUIRE(v);
  const int n_logits = w.tv.n + 2;
  float *logits = malloc((size_t)n_logits * sizeof *logits);
  unsigned char *ok = malloc((size_t)n_logits);
  int *cand = malloc((size_t)n_logits * sizeof *cand);
  char *text = malloc(1 << 16);
  REQUIRE(logits && ok && cand && text);
  char why[512];
  int n_complete = 0, n_steps = 0, n_bad = 0, n_big = 0, n_dup = 0;
  for (int walk = 0; walk < n_walks && !n_bad; walk++) {
    json_mask *m = json_mask_new_schema(v, sc);
    REQUIRE(m);
    size_t len = 0;
    for (int step = 0; step < 600; step++) {
      if (compare(&w.tv, v, sc, m, text, len, n_logits, why, sizeof why)) {
        EXPECT_MSG(0, "walk %d step %d: %.400s", walk, step, why);
        n_bad++;
        break;
      }
      int nc = mask_allowed_ids(m, n_logits, logits, ok, cand);
      REQUIRE(nc > 0);
      if (json_mask_complete(m)) {
        EXPECT_MSG(nc == 2 && cand[0] == W_EOS && cand[1] == W_EOS2, "complete: %d allowed", nc);
        json_error_t e;
        json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
        if (!j && strstr(e.text, "duplicate object key")) {
          /* a free object (any value) may repeat a key, as in json_object mode; the schema's
           * objects never do (the tables check it), the validator sees the last value */
          n_dup++;
          j = json_loadb(text, len, JSON_ALLOW_NUL, &e);
        }
        if (!j && (strstr(e.text, "too big") || strstr(e.text, "overflow"))) {
          n_big++; /* a number past jansson's ranges: valid JSON all the same */
        } else {
          EXPECT_MSG(j, "walk %d: jansson refused \"%.*s\": %s", walk, (int)len, text, e.text);
          EXPECT_MSG(!j || tvalid(sch, sch, j, 0), "walk %d: \"%.*s\" invalid under the schema",
                     walk, (int)len, text);
        }
        json_decref(j);
        n_complete++;
        break;
      }
      /* after a while, most of the time take a token that closes the most */
      int pick = cand[rng_next(&x) % (uint64_t)nc];
      if (step > 40 + 40 * (walk % 4) && rng_next(&x) % 4) {
        int best = 1 << 30, nbest = 0;
        for (int c = 0; c < nc; c++) {
          int id = cand[c];
          if (tv_is_eos(&w.tv, id)) continue;
          memcpy(text + len, w.tv.bytes[id], w.tv.lens[id]);
          int d = open_count(text, len + w.tv.lens[id]);
          if (d < best) best = d, nbest = 0;
          if (d == best) cand[nbest++] = id;
        }
        if (nbest) pick = cand[rng_next(&x) % (uint64_t)nbest];
      }
      if (tv_is_eos(&w.tv, pick)) break; /* stuck: the vocabulary lacks what is needed */
      json_mask_advance(m, pick);
      REQUIRE(!json_mask_dead(m));
      memcpy(text + len, w.tv.bytes[pick], w.tv.lens[pick]);
      len += w.tv.lens[pick];
      n_steps++;
    }
    json_mask_free(m);
  }
  printf(
      "  %d walks: %d steps checked, %d complete (%d with numbers past jansson's range, %d "
      "repeating a key of a free object)\n",
      n_walks, n_steps, n_complete, n_big, n_dup);
  *n_complete_out = n_complete;
  free(logits);
  free(ok);
  free(cand);
  free(text);
  json_vocab_free(v);
  wv_free(&w);
  json_decref(sch);
  json_schema_free(sc);
}

TEST(mask_random_walks) {
  static const char *const schemas[] = {S_PERSON, S_TREE,   S_KEYS,  S_ENUM_ROOT,
                                        S_SELF,   S_ARRAYS, S_SPACES};
  for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
    int done = 0;
    walks(schemas[i], 200, 1234567 + i, &done);
    EXPECT_MSG(done >= 100, "schema %zu: only %d walks completed", i, done);
  }
}

TEST(mask_small_cases) {
  /* hand-picked: the eos rules, a dead mask, logits wider and narrower than the vocabulary */
  const char *b[] = {"{\"", "a\"", ":", "1", "}", "<e>", "\"a\":1}", "x", " ", "{", ""};
  size_t l[11];
  for (int i = 0; i < 11; i++) l[i] = strlen(b[i]);
  int32_t eos[] = {5};
  unsigned char sp[11] = {0};
  sp[5] = 1;
  json_vocab *v = json_vocab_new(11, b, l, sp, eos, 1);
  REQUIRE(v);
  char err[256];
  json_schema *sc = compile_q(
      "{'type':'object','properties':{'a':{'type':'integer'}},"
      "'required':['a']}",
      err, sizeof err);
  REQUIRE(sc);
  json_mask *m = json_mask_new_schema(v, sc);
  REQUIRE(m);
  float lg[16];
  unsigned char ok[16];
  char why[256];
  mask_allowed(m, 16, lg, ok);
  EXPECT(ok[0] && ok[8] && ok[9] && !ok[4] && !ok[5] && !ok[10] && !ok[11] && !ok[15]);
  EXPECT_MSG(!prep_compare(m, 11, 16, why, sizeof why), "start: %s", why);
  json_mask_advance(m, 0);
  mask_allowed(m, 16, lg, ok);
  EXPECT(ok[1] && !ok[6] && !ok[3] && !ok[4] && !ok[5]);
  json_mask_advance(m, 1);
  json_mask_advance(m, 2);
  json_mask_advance(m, 3);
  mask_allowed(m, 16, lg, ok);
  EXPECT(ok[3] && ok[4] && ok[8] && !ok[2] && !ok[5] && !ok[6]);
  EXPECT_MSG(!prep_compare(m, 11, 16, why, sizeof why), "in a number: %s", why);
  json_mask_advance(m, 4); /* the set prepared in the number is dropped */
  EXPECT(json_mask_complete(m));
  mask_allowed(m, 16, lg, ok);
  for (int i = 0; i < 16; i++) EXPECT_MSG(ok[i] == (i == 5), "complete: id %d", i);
  EXPECT_MSG(!prep_compare(m, 11, 16, why, sizeof why), "complete: %s", why);
  json_mask_advance(m, 5);
  EXPECT(json_mask_complete(m) && !json_mask_dead(m));
  json_mask_advance(m, 8);
  EXPECT(json_mask_dead(m) && !json_mask_complete(m));
  mask_allowed(m, 16, lg, ok);
  for (int i = 0; i < 16; i++) EXPECT_MSG(ok[i] == (i == 5), "dead: id %d", i);
  EXPECT_MSG(!prep_compare(m, 11, 16, why, sizeof why), "dead: %s", why);
  json_mask_free(m);
  /* an early eos, a special, an empty token, an out-of-range id: dead */
  const int killers[] = {5, 10, -1, 11, 1 << 30, 4};
  for (size_t k = 0; k < sizeof killers / sizeof *killers; k++) {
    m = json_mask_new_schema(v, sc);
    REQUIRE(m);
    json_mask_advance(m, 0);
    json_mask_advance(m, killers[k]);
    EXPECT_MSG(json_mask_dead(m), "token %d did not kill", killers[k]);
    json_mask_free(m);
  }
  /* narrower logits: nothing past n written (ASan checks) */
  m = json_mask_new_schema(v, sc);
  REQUIRE(m);
  float *narrow = malloc(3 * sizeof *narrow);
  REQUIRE(narrow);
  for (int i = 0; i < 3; i++) narrow[i] = 1.0f;
  json_mask_apply(m, narrow, 3);
  EXPECT(narrow[0] == 1.0f && isinf(narrow[1]) && isinf(narrow[2]));
  free(narrow);
  json_mask_apply(m, lg, 0);
  json_mask_free(m);
  /* nothing usable in the vocabulary: only eos */
  const char *few[] = {"x", "<e>"};
  size_t few_l[] = {1, 3};
  int32_t few_eos[] = {1};
  json_vocab *v2 = json_vocab_new(2, few, few_l, NULL, few_eos, 1);
  REQUIRE(v2);
  m = json_mask_new_schema(v2, sc);
  REQUIRE(m);
  mask_allowed(m, 2, lg, ok);
  EXPECT(!ok[0] && ok[1]);
  EXPECT_MSG(!prep_compare(m, 2, 2, why, sizeof why), "nothing usable: %s", why);
  json_mask_free(m);
  json_vocab_free(v2);
  json_schema_free(sc);
  json_vocab_free(v);
}

/* ---- the real vocabulary ---------------------------------------------------------------- */

TEST(mask_real_vocab) {
  char err[256];
  const int n_logits = 151936;
  real_vocab rv;
  int loaded = rv_load(&rv, n_logits, 1, err, sizeof err);
  if (loaded == 0) return;
  EXPECT_MSG(loaded == 1, "real vocabulary: %s", err);
  if (loaded != 1) return;
  tokenizer *tok = rv.tok;
  float *logits = rv.logits;
  unsigned char *ok = rv.ok;
  tvocab tv = rv.tv;
  int im_end = tokenizer_token_id(tok, "<|im_end|>");
  REQUIRE(im_end >= 0);
  tv.eos[tv.n_eos++] = im_end;
  json_vocab *v = tv_build(&tv);
  REQUIRE(v);
  json_schema *strict = compile_q(S_STRICT, err, sizeof err);
  EXPECT_MSG(strict, "%s", err);
  json_schema *task = compile_q(S_TASK, err, sizeof err);
  EXPECT_MSG(task, "%s", err);
  if (!strict || !task) goto out;
    /* instances cut at the states timed */
#define ADA \
  "{\"name\": \"Ada\", \"age\": 36, \"email\": null, \"address\": {\"street\": \"1 Main\", "
#define ADA2 ADA "\"city\": \"London\", \"zip\": \"12345\"}, \"status\": \""
  static const struct {
    int task;
    const char *text, *label;
  } states[] = {
      {0, "", "start"},
      {0, "{", "after {"},
      {0, "{\"", "in the first key"},
      {0, "{\"name\": \"", "in a free string"},
      {0, "{\"name\": \"Ada Lovelace", "in a free string (later)"},
      {0, "{\"name\": \"Ada\", \"age\": ", "an integer value"},
      {0, "{\"name\": \"Ada\", \"age\": 3", "in an integer"},
      {0, "{\"name\": \"Ada\", \"age\": 36, \"email\": ", "string|null value"},
      {0, ADA "\"city\": \"London", "in a maxLength-40 string"},
      {0, ADA "\"city\": \"London\", \"zip\": \"12", "in a 5..10 string"},
      {0, ADA2, "in an enum value"},
      {0, ADA2 "inac", "in an enum value (later)"},
      {0, ADA2 "active\", \"items\": [", "an array of objects"},
      {0, ADA2 "active\", \"items\": [{\"sku\": \"A1\", \"qty\": 2, \"price\": 9.5}",
       "after an array item"},
      {0, ADA2 "active\", \"items\": [], \"notes\": \"ok\\u00", "in \\u"},
      {0, ADA2 "active\", \"items\": [], \"notes\": null}", "complete"},
      {1, "{\"first", "in a key with a space next"},
      {1, "{\"first name\": \"Ada\", \"state\": \"in", "in an enum with a space next"},
      {1, "{\"first name\": \"Ada\", \"state\": \"not st", "in an enum (later)"},
      {1, "{\"first name\": \"Ada\", \"state\": \"done\", \"code\": \"AB", "in a 3..3 string"},
      {1, "{\"first name\": \"Ada\", \"state\": \"done\", \"code\": \"ABC\", \"ratio\": 0.",
       "in a number"},
  };
#undef ADA
#undef ADA2
  const int n_states = (int)(sizeof states / sizeof *states);
  char why[512];
  for (int s = 0; s < n_states; s++) {
    const char *text = states[s].text;
    const json_schema *sc = states[s].task ? task : strict;
    json_mask *m = json_mask_new_schema(v, sc);
    REQUIRE(m);
    int32_t *ids = NULL;
    int n = tokenizer_encode(tok, text, strlen(text), &ids, err, sizeof err);
    REQUIRE(n >= 0);
    for (int i = 0; i < n; i++) json_mask_advance(m, ids[i]);
    free(ids);
    EXPECT_MSG(!json_mask_dead(m), "could not advance over \"%s\"", text);
    if (json_mask_dead(m)) {
      json_mask_free(m);
      continue;
    }
    if (compare(&tv, v, sc, m, text, strlen(text), n_logits, why, sizeof why))
      EXPECT_MSG(0, "state %d: %.400s", s, why);
    mask_allowed(m, n_logits, logits, ok);
    int n_ok = 0;
    for (int i = 0; i < n_logits; i++) n_ok += ok[i];
    if (!strcmp(states[s].label, "complete"))
      EXPECT_MSG(json_mask_complete(m) && n_ok == 1 && ok[im_end], "end");
    double ms[3]; /* apply alone, prepare, apply after prepare */
    apply_times(m, logits, n_logits, ms);
    printf(
        "  json_mask_apply (schema) %-29s %6.3f ms/call (%6d allowed); prepare %6.3f, "
        "prepared apply %6.3f\n",
        states[s].label, ms[0], n_ok, ms[1], ms[2]);
    json_mask_free(m);
  }
out:
  json_schema_free(strict);
  json_schema_free(task);
  json_vocab_free(v);
  rv_free(&rv);
}

int main(void) {
  RUN(compile_accepts);
  RUN(compile_rejects);
  RUN(recognizer_valid);
  RUN(recognizer_invalid);
  RUN(recognizer_depth);
  RUN(mask_api);
  RUN(validator_self_check);
  RUN(mask_small_cases);
  RUN(mask_random_walks);
  RUN(mask_real_vocab);
  TEST_MAIN_END();
}
