/* Unit tests of metrics: the /metrics exposition under both prefixes — bucket placement,
 * vLLM's names, labels and buckets, the token units of the prefix-cache counters, the text
 * format's rules (checked here, and by `promtool check metrics` where it is installed). */
#include "server/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static engine_stats sample_stats(void) {
  engine_stats st;
  memset(&st, 0, sizeof st);
  st.num_running = 3;
  st.kv_pages_total = 100;
  st.kv_pages_used = 25;
  st.prefix_enabled = 1;
  st.prefix_queries = 2;       /* lookups */
  st.prefix_query_tokens = 90; /* their prompt tokens */
  st.prefix_hits = 1;
  st.prefix_hit_tokens = 64;
  st.prompt_tokens_total = 90;
  st.step_tokens_bucket[0] = 5;  /* 5 steps of 1 token */
  st.step_tokens_bucket[4] = 1;  /* one of 33..64 */
  st.step_tokens_bucket[13] = 1; /* one over 16384 */
  st.step_tokens_sum = 5 + 40 + 20000;
  st.max_model_len = 1000;
  return st;
}

static char *render(const char *prefix, const char *name) {
  metrics_opts o = {
      .prefix = prefix, .model_name = name, .max_model_len = 1000, .gpu_memory_utilization = 0.9};
  metrics *m = metrics_new(&o);
  if (!m) return NULL;
  metrics_observe(m, METRICS_TTFT, 0.003);
  metrics_observe(m, METRICS_TTFT, 100.0);
  metrics_observe(m, METRICS_TTFT, 1e9);
  metrics_request r = {.finish = "length",
                       .e2e = 2.0,
                       .queue = 0.25,
                       .prefill = 0.5,
                       .decode = 1.0,
                       .inference = 1.5,
                       .prompt_tokens = 90,
                       .generation_tokens = 11,
                       .max_tokens = 11};
  metrics_request_done(m, &r);
  metrics_request_finished(m, "abort");
  metrics_request_rejected(m, 404);
  engine_stats st = sample_stats();
  char *t = metrics_render(m, &st);
  metrics_free(m);
  return t;
}

#define HAS(t, s) EXPECT_MSG(strstr((t), (s)) != NULL, "missing: %s", (s))

TEST(format_le) {
  char b[40];
  metrics_format_le(b, sizeof b, 0.001);
  EXPECT_STR(b, "0.001");
  metrics_format_le(b, sizeof b, 1.0);
  EXPECT_STR(b, "1.0");
  metrics_format_le(b, sizeof b, 2560.0);
  EXPECT_STR(b, "2560.0");
  metrics_format_le(b, sizeof b, 0.075);
  EXPECT_STR(b, "0.075");
  metrics_format_le(b, sizeof b, INFINITY);
  EXPECT_STR(b, "+Inf");
}

TEST(deltaserve_prefix) {
  char *t = render(NULL, "my\"model");
  REQUIRE(t != NULL);
  HAS(t, "deltaserve:num_requests_running{model_name=\"my\\\"model\"} 3\n");
  HAS(t, "deltaserve:kv_cache_usage_perc{model_name=\"my\\\"model\"} 0.25\n");
  /* the prefix-cache counters in tokens, as vLLM counts them; the lookups under their own name */
  HAS(t, "deltaserve:prefix_cache_queries_total{model_name=\"my\\\"model\"} 90\n");
  HAS(t, "deltaserve:prefix_cache_hits_total{model_name=\"my\\\"model\"} 64\n");
  HAS(t, "deltaserve:prefix_cache_lookups_total{model_name=\"my\\\"model\"} 2\n");
  HAS(t, "deltaserve:prefix_cache_restores_total{model_name=\"my\\\"model\"} 1\n");
  HAS(t, "# TYPE deltaserve:prefix_cache_queries_total counter\n");
  /* the pool sizes are gauges without _total */
  HAS(t, "deltaserve:kv_pages_capacity{model_name=\"my\\\"model\"} 100\n");
  EXPECT(strstr(t, "kv_pages_total") == NULL);
  EXPECT(strstr(t, "state_slots_total") == NULL);
  EXPECT(strstr(t, "snapshot_slabs_total") == NULL);
  HAS(t, "# TYPE deltaserve:time_to_first_token_seconds histogram\n");
  /* 0.003 falls in le=0.005; 100 in le=160; 1e9 only in +Inf */
  HAS(t, "time_to_first_token_seconds_bucket{le=\"0.001\",model_name=\"my\\\"model\"} 0\n");
  HAS(t, "time_to_first_token_seconds_bucket{le=\"0.005\",model_name=\"my\\\"model\"} 1\n");
  HAS(t, "time_to_first_token_seconds_bucket{le=\"80.0\",model_name=\"my\\\"model\"} 1\n");
  HAS(t, "time_to_first_token_seconds_bucket{le=\"160.0\",model_name=\"my\\\"model\"} 2\n");
  HAS(t, "time_to_first_token_seconds_bucket{le=\"2560.0\",model_name=\"my\\\"model\"} 2\n");
  HAS(t, "time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"my\\\"model\"} 3\n");
  HAS(t, "time_to_first_token_seconds_count{model_name=\"my\\\"model\"} 3\n");
  HAS(t, "request_success_total{finished_reason=\"length\",model_name=\"my\\\"model\"} 1\n");
  HAS(t, "request_success_total{finished_reason=\"abort\",model_name=\"my\\\"model\"} 1\n");
  HAS(t, "request_rejected_total{model_name=\"my\\\"model\",status=\"404\"} 1\n");
  free(t);
}

TEST(vllm_prefix) {
  char *t = render("vllm", "qwen");
  REQUIRE(t != NULL);
  EXPECT(strstr(t, "deltaserve:") == NULL);
  HAS(t, "vllm:num_requests_running{engine=\"0\",model_name=\"qwen\"} 3\n");
  HAS(t, "vllm:num_requests_waiting{engine=\"0\",model_name=\"qwen\"} 0\n");
  HAS(t, "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"qwen\"} 90\n");
  HAS(t, "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"qwen\"} 64\n");
  HAS(t, "vllm:prompt_tokens_total{engine=\"0\",model_name=\"qwen\"} 90\n");
  HAS(t, "vllm:generation_tokens_total{engine=\"0\",model_name=\"qwen\"} 0\n");
  HAS(t, "vllm:num_preemptions_total{engine=\"0\",model_name=\"qwen\"} 0\n");
  HAS(t,
      "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"qwen\"} "
      "1\n");
  HAS(t,
      "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching="
      "\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"100\"} 1.0\n");
  /* request phases in vLLM's request-latency buckets (0.3 .. 7680) */
  HAS(t, "vllm:request_queue_time_seconds_bucket{engine=\"0\",le=\"0.3\",model_name=\"qwen\"} 1\n");
  HAS(t,
      "vllm:request_prefill_time_seconds_bucket{engine=\"0\",le=\"0.3\",model_name=\"qwen\"} 0\n");
  HAS(t,
      "vllm:request_prefill_time_seconds_bucket{engine=\"0\",le=\"0.5\",model_name=\"qwen\"} 1\n");
  HAS(t, "vllm:request_decode_time_seconds_sum{engine=\"0\",model_name=\"qwen\"} 1\n");
  HAS(t, "vllm:request_inference_time_seconds_sum{engine=\"0\",model_name=\"qwen\"} 1.5\n");
  HAS(t,
      "vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"7680.0\",model_name=\"qwen\"} "
      "1\n");
  /* decode 1.0 s over 10 intervals */
  HAS(t, "vllm:request_time_per_output_token_seconds_sum{engine=\"0\",model_name=\"qwen\"} 0.1\n");
  /* token histograms: 1-2-5 up to max_model_len 1000, which is the last bound (vLLM's
   * build_1_2_5_buckets keeps a bound equal to the maximum) */
  HAS(t, "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"50.0\",model_name=\"qwen\"} 0\n");
  HAS(t, "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"100.0\",model_name=\"qwen\"} 1\n");
  HAS(t, "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"500.0\",model_name=\"qwen\"} 1\n");
  HAS(t, "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"1000.0\",model_name=\"qwen\"} 1\n");
  EXPECT(strstr(t, "request_prompt_tokens_bucket{engine=\"0\",le=\"2000.0\"") == NULL);
  HAS(t, "vllm:request_generation_tokens_bucket{engine=\"0\",le=\"20.0\",model_name=\"qwen\"} 1\n");
  HAS(t, "vllm:request_params_max_tokens_count{engine=\"0\",model_name=\"qwen\"} 1\n");
  /* iteration tokens: the engine's step histogram on vLLM's bounds */
  HAS(t, "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"1.0\",model_name=\"qwen\"} 5\n");
  HAS(t, "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"32.0\",model_name=\"qwen\"} 5\n");
  HAS(t, "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"64.0\",model_name=\"qwen\"} 6\n");
  HAS(t, "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"16384.0\",model_name=\"qwen\"} 6\n");
  HAS(t, "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"+Inf\",model_name=\"qwen\"} 7\n");
  HAS(t, "vllm:iteration_tokens_total_sum{engine=\"0\",model_name=\"qwen\"} 20045\n");
  /* vLLM's inter-token buckets start at 10 ms */
  HAS(t,
      "vllm:inter_token_latency_seconds_bucket{engine=\"0\",le=\"0.01\",model_name=\"qwen\"} 0\n");
  HAS(t, "# TYPE vllm:time_per_output_token_seconds histogram\n");
  /* deltaserve's own series keep their names under the vllm prefix */
  HAS(t, "vllm:prefix_cache_lookups_total{engine=\"0\",model_name=\"qwen\"} 2\n");
  free(t);
}

/* The text format's rules: every sample's family has HELP and TYPE lines before it; counters'
 * samples end in _total, gauges' do not (iteration_tokens_total is vLLM's histogram name);
 * histogram buckets ascend in le, counts never drop, +Inf is last and equals _count. */
static void check_format(const char *t) {
  char fam[128] = "", type[16] = "";
  int have_help = 0, n_bucket = 0;
  double last_le = -1, inf_count = -1;
  unsigned long long last_cum = 0;
  const char *p = t;
  int lines = 0;
  while (*p) {
    const char *nl = strchr(p, '\n');
    REQUIRE(nl != NULL); /* every line ends with a newline */
    char line[512];
    size_t n = (size_t)(nl - p);
    REQUIRE(n < sizeof line);
    memcpy(line, p, n);
    line[n] = 0;
    p = nl + 1;
    lines++;
    char name[128], rest[400];
    if (sscanf(line, "# HELP %127s %399[^\n]", name, rest) == 2) {
      snprintf(fam, sizeof fam, "%s", name);
      have_help = 1;
      type[0] = 0;
      continue;
    }
    if (sscanf(line, "# TYPE %127s %15s", name, rest) == 2) {
      EXPECT_MSG(have_help && !strcmp(name, fam), "TYPE %s without its HELP", name);
      snprintf(type, sizeof type, "%.15s", rest);
      EXPECT_MSG(!strcmp(type, "counter") || !strcmp(type, "gauge") || !strcmp(type, "histogram") ||
                     !strcmp(type, "summary"),
                 "type %s", type);
      size_t fl = strlen(fam);
      int ends_total = fl > 6 && !strcmp(fam + fl - 6, "_total");
      if (!strcmp(type, "counter")) EXPECT_MSG(ends_total, "counter %s without _total", fam);
      if (!strcmp(type, "gauge")) EXPECT_MSG(!ends_total, "gauge %s ends in _total", fam);
      n_bucket = 0;
      last_le = -1;
      last_cum = 0;
      inf_count = -1;
      continue;
    }
    REQUIRE(line[0] != '#');
    /* a sample: name{labels} value */
    const char *brace = strchr(line, '{');
    const char *sp = strrchr(line, ' ');
    REQUIRE(brace && sp && sp > brace);
    size_t nl2 = (size_t)(brace - line);
    REQUIRE(nl2 < sizeof name);
    memcpy(name, line, nl2);
    name[nl2] = 0;
    size_t fl = strlen(fam);
    EXPECT_MSG(type[0] && !strncmp(name, fam, fl), "sample %s outside its family %s", name, fam);
    const char *suffix = name + fl;
    if (!strcmp(type, "histogram")) {
      EXPECT_MSG(!strcmp(suffix, "_bucket") || !strcmp(suffix, "_sum") || !strcmp(suffix, "_count"),
                 "histogram sample %s", name);
      if (!strcmp(suffix, "_bucket")) {
        const char *le = strstr(line, "le=\"");
        REQUIRE(le != NULL);
        double v = !strncmp(le + 4, "+Inf\"", 5) ? INFINITY : strtod(le + 4, NULL);
        unsigned long long c = strtoull(sp + 1, NULL, 10);
        EXPECT_MSG(v > last_le, "%s: le %g after %g", fam, v, last_le);
        EXPECT_MSG(c >= last_cum, "%s: bucket counts drop", fam);
        last_le = v;
        last_cum = c;
        n_bucket++;
        if (isinf(v)) inf_count = (double)c;
      } else if (!strcmp(suffix, "_count")) {
        EXPECT_MSG(inf_count >= 0 && strtod(sp + 1, NULL) == inf_count,
                   "%s: +Inf bucket missing or not the count", fam);
      }
    } else if (!strcmp(type, "summary")) {
      EXPECT_MSG(!strcmp(suffix, "_sum") || !strcmp(suffix, "_count"), "summary sample %s", name);
    } else {
      EXPECT_MSG(!suffix[0], "sample %s of family %s", name, fam);
    }
  }
  EXPECT(lines > 100);
}

TEST(format_rules) {
  const char *prefixes[] = {NULL, "vllm"};
  for (int i = 0; i < 2; i++) {
    char *t = render(prefixes[i], "m");
    REQUIRE(t != NULL);
    check_format(t);
    free(t);
  }
}

/* promtool's own check, where the prometheus package is installed (scripts/setup.sh): nothing
 * but the ':' lint every recording-rule-style name gets (vLLM's too), and iteration_tokens_total,
 * a histogram under vLLM's name. */
TEST(promtool_check) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    printf("NOTE promtool_check: promtool not installed; the format rules above still ran\n");
    return;
  }
  const char *prefixes[] = {NULL, "vllm"};
  for (int i = 0; i < 2; i++) {
    char *t = render(prefixes[i], "m");
    REQUIRE(t != NULL);
    char in[] = "/tmp/ds_metrics_XXXXXX";
    int fd = mkstemp(in);
    REQUIRE(fd >= 0);
    size_t len = strlen(t);
    EXPECT(write(fd, t, len) == (ssize_t)len);
    close(fd);
    free(t);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", in);
    FILE *f = popen(cmd, "r");
    REQUIRE(f != NULL);
    char line[512];
    int bad = 0, colon = 0;
    while (fgets(line, sizeof line, f)) {
      if (strstr(line, "metric names should not contain ':'")) {
        colon++;
        continue;
      }
      if (strstr(line, "iteration_tokens_total non-counter metrics should not have \"_total\""))
        continue;
      printf("promtool: %s", line);
      bad++;
    }
    int rc = pclose(f);
    unlink(in);
    EXPECT_EQ_INT(bad, 0);
    EXPECT(colon > 10); /* promtool did read the families */
    /* 0: clean; 3: lint findings only (all of them the accepted ones above) */
    EXPECT_MSG(rc == 0 || WEXITSTATUS(rc) == 3, "promtool exit %d", rc);
  }
}

int main(void) {
  RUN(format_le);
  RUN(deltaserve_prefix);
  RUN(vllm_prefix);
  RUN(format_rules);
  RUN(promtool_check);
  TEST_MAIN_END();
}
