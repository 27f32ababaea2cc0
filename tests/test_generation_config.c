/* Unit tests of generation_config: reading a model folder's generation_config.json (values,
 * the fields that are no defaults, errors) and applying it to the fields a request left out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/generation_config.h"
#include "server/openai_request.h"
#include "test.h"

/* A fresh folder holding generation_config.json = text (NULL: no file). */
static const char *folder_with(const char *text) {
  static char dir[64];
  snprintf(dir, sizeof dir, "/tmp/ds-gencfg-XXXXXX");
  if (!mkdtemp(dir)) return NULL;
  if (text) {
    char path[128];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
  }
  return dir;
}

static void folder_rm(const char *dir) {
  char path[128];
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  unlink(path);
  rmdir(dir);
}

/* Loads text; returns the load's result, *gc and err filled. */
static int load_text(const char *text, generation_config *gc, char *err, size_t n) {
  const char *dir = folder_with(text);
  if (!dir) return -2;
  err[0] = 0;
  int rc = generation_config_load(dir, gc, err, n);
  folder_rm(dir);
  return rc;
}

TEST(qwen3_file) {
  /* the shape of the Qwen3 checkpoints' file */
  generation_config gc;
  char err[256];
  REQUIRE(load_text(
              "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643],"
              " \"pad_token_id\": 151643, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95,"
              " \"transformers_version\": \"4.51.0\"}",
              &gc, err, sizeof err) == 0);
  EXPECT_EQ_INT(gc.has, SAMPLING_SET_TEMPERATURE | SAMPLING_SET_TOP_P | SAMPLING_SET_TOP_K);
  EXPECT(gc.temperature == 0.6f);
  EXPECT(gc.top_p == 0.95f);
  EXPECT_EQ_INT(gc.top_k, 20);
  char d[128];
  generation_config_describe(&gc, d, sizeof d);
  EXPECT_STR(d, "temperature=0.6 top_p=0.95 top_k=20");
}

TEST(every_field) {
  generation_config gc;
  char err[256];
  REQUIRE(load_text("{\"temperature\": 0, \"top_p\": 1, \"top_k\": -1, \"min_p\": 0.05,"
                    " \"repetition_penalty\": 1.05, \"max_new_tokens\": 300}",
                    &gc, err, sizeof err) == 0);
  EXPECT_EQ_INT(gc.has, SAMPLING_SET_TEMPERATURE | SAMPLING_SET_TOP_P | SAMPLING_SET_TOP_K |
                            SAMPLING_SET_MIN_P | SAMPLING_SET_REPETITION_PENALTY |
                            SAMPLING_SET_MAX_TOKENS);
  EXPECT(gc.temperature == 0.f);
  EXPECT_EQ_INT(gc.top_k, 0); /* -1: off */
  EXPECT(gc.min_p == 0.05f);
  EXPECT(gc.repetition_penalty == 1.05f);
  EXPECT_EQ_INT(gc.max_new_tokens, 300);
  EXPECT_EQ_INT(generation_config_max_tokens(&gc, 1000), 300);
  EXPECT_EQ_INT(generation_config_max_tokens(&gc, 100), 100); /* the context leaves less */
  char d[32];                                                 /* truncated, terminated */
  generation_config_describe(&gc, d, sizeof d);
  EXPECT_EQ_INT(strlen(d), sizeof d - 1);
}

TEST(no_defaults) {
  generation_config gc;
  char err[256];
  const char *dir = folder_with(NULL); /* no file */
  REQUIRE(dir != NULL);
  memset(&gc, 0xff, sizeof gc);
  EXPECT_EQ_INT(generation_config_load(dir, &gc, err, sizeof err), 0);
  EXPECT_EQ_INT(gc.has, 0);
  folder_rm(dir);
  /* nulls, top_k 50 (transformers' default, not taken by vLLM) and other keys: nothing */
  REQUIRE(
      load_text("{\"temperature\": null, \"top_k\": 50, \"do_sample\": false, \"num_beams\": 4}",
                &gc, err, sizeof err) == 0);
  EXPECT_EQ_INT(gc.has, 0);
  EXPECT_EQ_INT(generation_config_max_tokens(&gc, 77), 77);
  char d[16];
  generation_config_describe(&gc, d, sizeof d);
  EXPECT_STR(d, "");
}

TEST(errors) {
  static const struct {
    const char *text, *says;
  } bad[] = {
      {"{\"temperature\": ", "line"},
      {"[1, 2]", "not a JSON object"},
      {"{\"temperature\": -0.5}", "'temperature'"},
      {"{\"temperature\": \"0.7\"}", "must be a number"},
      {"{\"top_p\": 0}", "'top_p'"},
      {"{\"top_p\": 1.5}", "'top_p'"},
      {"{\"top_p\": 1e-300}", "0 as a float"},
      {"{\"top_k\": 2.5}", "must be an integer"},
      {"{\"top_k\": -2}", "'top_k'"},
      {"{\"min_p\": 2}", "'min_p'"},
      {"{\"repetition_penalty\": 0}", "'repetition_penalty'"},
      {"{\"max_new_tokens\": 0}", "'max_new_tokens'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    generation_config gc;
    char err[256];
    int rc = load_text(bad[i].text, &gc, err, sizeof err);
    EXPECT_MSG(rc == -1, "%s: loaded (rc %d)", bad[i].text, rc);
    EXPECT_MSG(strstr(err, bad[i].says) && strstr(err, "generation_config.json"), "%s: error '%s'",
               bad[i].text, err);
    EXPECT_MSG(gc.has == 0, "%s: has %u after an error", bad[i].text, gc.has);
  }
}

/* What a request sets wins; the rest comes from the file (through the request parser's bits). */
TEST(apply_to_requests) {
  generation_config gc;
  char err[256];
  REQUIRE(load_text("{\"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, \"min_p\": 0.1,"
                    " \"repetition_penalty\": 1.1, \"max_new_tokens\": 9}",
                    &gc, err, sizeof err) == 0);
  openai_request r;
  openai_error e;
  const char *none = "{\"prompt\":\"x\",\"temperature\":null}";
  REQUIRE(openai_request_parse(OPENAI_KIND_COMPLETION, none, strlen(none), &r, &e) == 0);
  EXPECT_EQ_INT(r.sp_set, 0);
  generation_config_apply(&gc, r.sp_set, &r.sp);
  EXPECT(r.sp.temperature == 0.6f && r.sp.top_k == 20 && r.sp.top_p == 0.95f &&
         r.sp.min_p == 0.1f && r.sp.repetition_penalty == 1.1f);
  openai_request_free(&r);
  const char *some =
      "{\"prompt\":\"x\",\"temperature\":1.0,\"top_k\":-1,\"repetition_penalty\":1,\"max_tokens\":"
      "4}";
  REQUIRE(openai_request_parse(OPENAI_KIND_COMPLETION, some, strlen(some), &r, &e) == 0);
  EXPECT_EQ_INT(r.sp_set, SAMPLING_SET_TEMPERATURE | SAMPLING_SET_TOP_K |
                              SAMPLING_SET_REPETITION_PENALTY | SAMPLING_SET_MAX_TOKENS);
  generation_config_apply(&gc, r.sp_set, &r.sp);
  EXPECT(r.sp.temperature == 1.0f); /* the request's */
  EXPECT_EQ_INT(r.sp.top_k, 0);     /* the request's -1: off */
  EXPECT(r.sp.repetition_penalty == 1.0f);
  EXPECT(r.sp.top_p == 0.95f && r.sp.min_p == 0.1f); /* the file's */
  EXPECT_EQ_INT(r.max_tokens, 4);
  openai_request_free(&r);
  /* chat: max_completion_tokens counts as a max_tokens */
  const char *chat =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":3,\"top_"
      "p\":0.5}";
  REQUIRE(openai_request_parse(OPENAI_KIND_CHAT, chat, strlen(chat), &r, &e) == 0);
  EXPECT_EQ_INT(r.sp_set, SAMPLING_SET_MAX_TOKENS | SAMPLING_SET_TOP_P);
  openai_request_free(&r);
}

int main(void) {
  RUN(qwen3_file);
  RUN(every_field);
  RUN(no_defaults);
  RUN(errors);
  RUN(apply_to_requests);
  TEST_MAIN_END();
}
