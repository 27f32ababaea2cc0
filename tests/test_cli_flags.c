/* Unit tests of the command line's parsers: sizes as vLLM's human_readable_int reads them,
 * "--flag=value" split for every command, the engine flags with sizes and auto, vLLM's flags
 * accepted or refused (cli_vllm), and the version string. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/version.h"
#include "cli/cli_flags.h"
#include "cli/cli_vllm.h"
#include "test.h"

/* cli_flags_size(v) in [-2^62, 2^62]: the count, or LLONG_MIN when refused */
static long long size_of(const char *v) {
  long long x = 0;
  char err[256];
  return cli_flags_size(v, "--n", -(1LL << 62), 1LL << 62, &x, err, sizeof err) ? LLONG_MIN : x;
}

/* The values are Python's: vllm.engine.arg_utils.human_readable_int(v). */
TEST(size_as_vllm) {
  static const struct {
    const char *v;
    long long want;
  } ok[] = {{"32768", 32768},
            {"32k", 32000},
            {"32K", 32768},
            {"1m", 1000000},
            {"1M", 1048576},
            {"1g", 1000000000},
            {"2G", 2147483648LL},
            {"1t", 1000000000000LL},
            {"1T", 1099511627776LL},
            {"25.6k", 25600},
            {"1.5m", 1500000},
            {"0.5k", 500},
            {"0.0015k", 1}, /* int(1.5): truncated */
            {" 64k\n", 64000},
            {"1_000", 1000},
            {"+5", 5},
            {"-5", -5},
            {"007", 7},
            {"007k", 7000}};
  for (size_t k = 0; k < sizeof ok / sizeof *ok; k++)
    EXPECT_MSG(size_of(ok[k].v) == ok[k].want, "'%s' -> %lld, expected %lld", ok[k].v,
               size_of(ok[k].v), ok[k].want);
  static const char *const bad[] = {"",     "k",        "1kk",     "1 k", "1e3",
                                    "1.5",  ".5k",      "1.k",     "-1k", "+1k",
                                    "1_0k", "1__0",     "_1",      "1_",  "0x10",
                                    "1.5K", "1.0M",     "1kb",     "32x", "99999999999999999999",
                                    "9t9",  "9999999T", "1e30000k"};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
    EXPECT_MSG(size_of(bad[k]) == LLONG_MIN, "'%s' accepted as %lld", bad[k], size_of(bad[k]));
}

TEST(size_errors) {
  long long x = 7;
  char err[256];
  EXPECT(cli_flags_size("1.5K", "--max-model-len", 1, 1000000, &x, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "--max-model-len") && strstr(err, "decimals") && strstr(err, "1.5k"), "%s",
             err);
  EXPECT(cli_flags_size("2M", "--max-model-len", 1, 1000000, &x, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "[1, 1000000]") && strstr(err, "'2M'"), "%s", err);
  EXPECT_EQ_INT(x, 7);
  EXPECT(cli_flags_size("1m", "--max-model-len", 1, 1000000, &x, err, sizeof err) == 0);
  EXPECT_EQ_INT(x, 1000000);
}

/* argv as one string of the entries, '|' between */
static void joined(int argc, char **argv, char *out, size_t n) {
  out[0] = 0;
  for (int i = 0; i < argc; i++)
    snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? "|" : "", argv[i]);
}

TEST(split_flag_equals_value) {
  char *in[] = {
      "deltaserve", "serve", "MODEL",   "--port=8000",     "--model", "x=y", "--a=b=c", "-x=1",
      "--=v",       "--y=",  "--p.q=1", "--max-model-len", "32k",     "--",  "--k=v"};
  int argc = (int)(sizeof in / sizeof *in);
  char **av = cli_flags_split(&argc, in);
  REQUIRE(av != NULL);
  char got[512];
  joined(argc, av, got, sizeof got);
  EXPECT_STR(got,
             "deltaserve|serve|MODEL|--port|8000|--model|x=y|--a|b=c|-x=1|--=v|--y||--p.q=1|"
             "--max-model-len|32k|--|--k=v");
  EXPECT(av[argc] == NULL);
  EXPECT_STR(in[3], "--port=8000"); /* the input is not changed */
  free(av);
  char *one[] = {"deltaserve"};
  argc = 1;
  av = cli_flags_split(&argc, one);
  REQUIRE(av != NULL);
  EXPECT_EQ_INT(argc, 1);
  EXPECT_STR(av[0], "deltaserve");
  free(av);
}

/* cli_flags_engine over argv[1..]; the status of the last flag (all others must be 1) */
static int engine_parse(engine_opts *o, int argc, char **argv, char *err, size_t n) {
  int rc = 0;
  for (int i = 1; i < argc; i++)
    if ((rc = cli_flags_engine(o, argc, argv, &i, err, n)) != 1) return rc;
  return rc;
}

TEST(engine_sizes_and_auto) {
  engine_opts o;
  engine_opts_default(&o);
  char err[256];
  char *a[] = {
      "x",  "--max-model-len",     "32k", "--max-num-batched-tokens=16K", "--kv-cache-tokens",
      "1M", "--snapshot-interval", "2k"};
  EXPECT_EQ_INT(engine_parse(&o, 8, a, err, sizeof err), 1);
  EXPECT_EQ_INT(o.max_model_len, 32000);
  EXPECT_EQ_INT(o.max_num_batched_tokens, 16384);
  EXPECT_EQ_INT(o.kv_cache_tokens, 1048576);
  EXPECT_EQ_INT(o.snapshot_interval, 2000);
  char *b[] = {"x", "--max-model-len", "auto"};
  EXPECT_EQ_INT(engine_parse(&o, 3, b, err, sizeof err), 1);
  EXPECT_EQ_INT(o.max_model_len, 0);
  o.max_model_len = 5;
  char *c[] = {"x", "--max-model-len=-1"};
  EXPECT_EQ_INT(engine_parse(&o, 2, c, err, sizeof err), 1);
  EXPECT_EQ_INT(o.max_model_len, 0);
  /* vLLM reads --max-num-seqs as a plain int */
  char *d[] = {"x", "--max-num-seqs", "1k"};
  EXPECT_EQ_INT(engine_parse(&o, 3, d, err, sizeof err), -1);
  char *e[] = {"x", "--max-model-len", "2g"};
  EXPECT_EQ_INT(engine_parse(&o, 3, e, err, sizeof err), -1);
  EXPECT_MSG(strstr(err, "--max-model-len") != NULL, "%s", err);
}

/* cli_vllm_flag on {flag, value}: its status; *used: the entries it took */
static int vllm(const char *flag, const char *value, int *used, char *err, size_t n) {
  char *argv[] = {"serve", (char *)flag, (char *)value, NULL};
  int argc = value ? 3 : 2, i = 1;
  err[0] = 0;
  int rc = cli_vllm_flag(argc, argv, &i, err, n);
  *used = i;
  return rc;
}

TEST(vllm_flags_accepted) {
  static const char *const ok[][2] = {{"--trust-remote-code", NULL},
                                      {"--trust-request-chat-template", NULL},
                                      {"--dtype", "auto"},
                                      {"--dtype", "bfloat16"},
                                      {"--pipeline-parallel-size", "1"},
                                      {"--data-parallel-size", "1"},
                                      {"--enable-auto-tool-choice", NULL},
                                      {"--tool-call-parser", "hermes"},
                                      {"--tool-call-parser", "qwen3_coder"},
                                      {"--tool-call-parser", "qwen3_xml"},
                                      {"--reasoning-parser", "qwen3"},
                                      {"--reasoning-parser", "deepseek_r1"},
                                      {"--uvicorn-log-level", "warning"},
                                      {"--enforce-eager", NULL},
                                      {"--enable-chunked-prefill", NULL},
                                      {"--swap-space", "4"},
                                      {"--mamba-ssm-cache-dtype", "float32"},
                                      {"--task", "generate"}};
  char err[256];
  for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) {
    int used;
    int rc = vllm(ok[k][0], ok[k][1], &used, err, sizeof err);
    EXPECT_MSG(rc == 1 && used == (ok[k][1] ? 2 : 1), "%s %s: %d, took %d (%s)", ok[k][0],
               ok[k][1] ? ok[k][1] : "", rc, used, err);
  }
}

/* --kv-cache-dtype: vLLM's values, fp8 as e4m3 pages with scales; e5m2 refused by name */
TEST(kv_cache_dtype) {
  static const struct {
    const char *v;
    int rc;
    backend_kv_dtype want;
    const char *why;
  } cases[] = {{"auto", 0, BACKEND_KV_AUTO, NULL},
               {"bfloat16", 0, BACKEND_KV_AUTO, NULL},
               {"fp8", 0, BACKEND_KV_FP8_E4M3, NULL},
               {"fp8_e4m3", 0, BACKEND_KV_FP8_E4M3, NULL},
               {"fp8_e5m2", -1, BACKEND_KV_AUTO, "the FP8 KV cache is e4m3"},
               {"fp8_inc", -1, BACKEND_KV_AUTO, "accepted: auto, bfloat16, fp8, fp8_e4m3"},
               {"", -1, BACKEND_KV_AUTO, "not supported"}};
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    char err[256] = "";
    backend_kv_dtype d = BACKEND_KV_AUTO;
    int rc = cli_vllm_kv_cache_dtype(cases[k].v, &d, err, sizeof err);
    EXPECT_MSG(rc == cases[k].rc && d == cases[k].want, "'%s': %d, %d (%s)", cases[k].v, rc, (int)d,
               err);
    if (cases[k].why)
      EXPECT_MSG(strstr(err, cases[k].why) && strstr(err, "--kv-cache-dtype"), "'%s': '%s'",
                 cases[k].v, err);
  }
}

TEST(vllm_flags_refused) {
  static const char *const no[][3] = {{"--dtype", "float16", "change the results"},
                                      {"--dtype", "float32", "change the results"},
                                      {"--pipeline-parallel-size", "2", "pipeline parallelism"},
                                      {"--data-parallel-size", "2", "data parallelism"},
                                      {"--tool-call-parser", "mistral", "<tool_call>"},
                                      {"--reasoning-parser", "granite", "<think>"},
                                      {"--mamba-ssm-cache-dtype", "float16", "change the results"},
                                      {"--task", "embed", "generates text only"},
                                      {"--seed", "0", "'seed' field"},
                                      {"--tokenizer", "x", "model folder"},
                                      {"--enable-lora", NULL, "LoRA"},
                                      {"--hf-overrides", "{}", "config.json"},
                                      {"--ssl-keyfile", "k", "TLS"},
                                      {"--dtype", NULL, "needs a value"}};
  char err[256];
  for (size_t k = 0; k < sizeof no / sizeof *no; k++) {
    int used;
    int rc = vllm(no[k][0], no[k][1], &used, err, sizeof err);
    EXPECT_MSG(rc == -1 && strstr(err, no[k][0]) && strstr(err, no[k][2]) && !strchr(err, '\n'),
               "%s %s: %d, '%s'", no[k][0], no[k][1] ? no[k][1] : "", rc, err);
  }
  int used;
  EXPECT_EQ_INT(vllm("--port", "1", &used, err, sizeof err), 0); /* not one of them */
  EXPECT_EQ_INT(used, 1);
  EXPECT_EQ_INT(vllm("--chat-template", "t.jinja", &used, err, sizeof err), 0); /* serve's own */
  /* --enable-expert-parallel: accepted with one rank, refused with ranks that split experts */
  char *ep[] = {"serve", "m", "--enable-expert-parallel", "-tp", "2"};
  EXPECT_EQ_INT(vllm("--enable-expert-parallel", NULL, &used, err, sizeof err), 1);
  EXPECT_EQ_INT(cli_vllm_check_tp(5, ep, 1, err, sizeof err), 0);
  EXPECT_EQ_INT(cli_vllm_check_tp(3, ep, 2, err, sizeof err), -1);
  EXPECT_MSG(strstr(err, "--enable-expert-parallel: not supported with --tensor-parallel-size 2") &&
                 !strchr(err, '\n'),
             "%s", err);
  EXPECT_EQ_INT(cli_vllm_check_tp(2, ep, 2, err, sizeof err), 0); /* not given */
}

TEST(version) {
  const char *v = version_string();
  EXPECT_MSG(!strncmp(v, VERSION_NUMBER, strlen(VERSION_NUMBER)), "%s", v);
  EXPECT(!strchr(v, '\n'));
}

/* --allowed-origins and its kin: a JSON list of strings, as vLLM's json.loads takes them */
TEST(json_list) {
  char **l = NULL;
  int n = -1;
  char err[200];
  REQUIRE(cli_flags_json_list("[\"http://a.example\", \"*\"]", "--allowed-origins", &l, &n, err,
                              sizeof err) == 0);
  EXPECT_EQ_INT(n, 2);
  EXPECT_STR(l[0], "http://a.example");
  EXPECT_STR(l[1], "*");
  cli_flags_list_free(l, n);
  REQUIRE(cli_flags_json_list("[]", "--allowed-headers", &l, &n, err, sizeof err) == 0);
  EXPECT_EQ_INT(n, 0);
  cli_flags_list_free(l, n);
  const char *bad[] = {"*", "\"*\"", "[1]", "[\"a\", 2]", "{\"a\":1}", "[\"a\""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    EXPECT_MSG(cli_flags_json_list(bad[i], "--allowed-origins", &l, &n, err, sizeof err) == -1,
               "'%s' taken", bad[i]);
    EXPECT_MSG(strstr(err, "--allowed-origins: expected a JSON list of strings") != NULL,
               "error '%s'", err);
  }
}

int main(void) {
  RUN(size_as_vllm);
  RUN(size_errors);
  RUN(split_flag_equals_value);
  RUN(engine_sizes_and_auto);
  RUN(vllm_flags_accepted);
  RUN(vllm_flags_refused);
  RUN(kv_cache_dtype);
  RUN(version);
  RUN(json_list);
  TEST_MAIN_END();
}
