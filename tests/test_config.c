/* test_config — config.json parsing: flat vs text_config, layer_types vs interval,
 * rope_parameters vs top-level keys, MoE fields, transformers defaults, and bad input. */
#include <unistd.h>

#include "model/config.h"
#include "test.h"

static char cfg_path[256];

/* Writes text to a fresh temp config.json; returns its path. */
static const char *write_cfg(const char *text) {
  snprintf(cfg_path, sizeof cfg_path, "/tmp/ds_test_config_%d.json", (int)getpid());
  FILE *f = fopen(cfg_path, "w");
  if (!f) return cfg_path;
  fputs(text, f);
  fclose(f);
  return cfg_path;
}

static model_config c;
static char err[512];

TEST(flat_qwen35_text) {
  const char *p = write_cfg(
      "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":1000,\"hidden_size\":64,\"intermediate_"
      "size\":96,"
      "\"num_hidden_layers\":5,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"
      "\"linear_num_key_heads\":2,\"linear_num_value_heads\":6,\"linear_key_head_dim\":16,"
      "\"linear_value_head_dim\":8,\"linear_conv_kernel_dim\":3,"
      "\"layer_types\":[\"full_attention\",\"linear_attention\",\"linear_attention\",\"full_"
      "attention\",\"linear_attention\"],"
      "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5000000.0,\"partial_rotary_"
      "factor\":0.5},"
      "\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":true,\"eos_token_id\":[7,9],\"bos_token_id\":"
      "3,"
      "\"max_position_embeddings\":4096}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.arch, MODEL_ARCH_QWEN35);
  EXPECT_STR(c.model_type, "qwen3_5_text");
  EXPECT_EQ_INT(c.vocab_size, 1000);
  EXPECT_EQ_INT(c.hidden_size, 64);
  EXPECT_EQ_INT(c.intermediate_size, 96);
  EXPECT_EQ_INT(c.n_layers, 5);
  EXPECT_EQ_INT(c.head_dim, 32);
  EXPECT_EQ_INT(c.rot_dim, 16);
  EXPECT(fabs(c.rope_theta - 5e6) < 1e-3);
  EXPECT(fabsf(c.rms_norm_eps - 1e-5f) < 1e-9f);
  EXPECT_EQ_INT(c.conv_dim, 2 * 2 * 16 + 6 * 8);
  EXPECT_EQ_INT(c.conv_kernel, 3);
  EXPECT_EQ_INT(c.tie_word_embeddings, 1);
  EXPECT_EQ_INT(c.layer_types[0], LAYER_KIND_FULL);
  EXPECT_EQ_INT(c.layer_types[1], LAYER_KIND_LINEAR);
  EXPECT_EQ_INT(c.layer_types[3], LAYER_KIND_FULL);
  EXPECT_EQ_INT(config_n_full_layers(&c), 2);
  EXPECT_EQ_INT(config_n_linear_layers(&c), 3);
  EXPECT_EQ_INT(c.n_eos, 2);
  EXPECT_EQ_INT(c.eos_token_ids[0], 7);
  EXPECT_EQ_INT(c.eos_token_ids[1], 9);
  EXPECT_EQ_INT(c.bos_token_id, 3);
  EXPECT_EQ_INT(c.n_experts, 0);
  for (int i = 0; i < 5; i++) EXPECT_EQ_INT(c.layer_is_moe[i], 0);
  EXPECT_EQ_INT(c.max_position_embeddings, 4096);
}

TEST(vlm_text_config) {
  /* the released layout: sizes under text_config, eos and tie at the top level */
  const char *p = write_cfg(
      "{\"architectures\":[\"Qwen3_5ForConditionalGeneration\"],\"model_type\":\"qwen3_5\","
      "\"tie_word_embeddings\":true,\"eos_token_id\":248046,"
      "\"vision_config\":{\"hidden_size\":1152,\"depth\":27},"
      "\"text_config\":{\"model_type\":\"qwen3_5_text\",\"vocab_size\":248320,\"hidden_size\":2560,"
      "\"intermediate_size\":9216,\"num_hidden_layers\":8,\"num_attention_heads\":16,"
      "\"num_key_value_heads\":4,\"head_dim\":256,\"linear_num_key_heads\":16,"
      "\"linear_num_value_heads\":32,\"rope_parameters\":{\"rope_theta\":10000000,"
      "\"partial_rotary_factor\":0.25,\"mrope_section\":[11,11,10]}}}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.arch, MODEL_ARCH_QWEN35);
  EXPECT_STR(c.model_type, "qwen3_5");
  EXPECT_EQ_INT(c.hidden_size, 2560);
  EXPECT_EQ_INT(c.n_layers, 8);
  EXPECT_EQ_INT(c.vocab_size, 248320);
  EXPECT_EQ_INT(c.tie_word_embeddings, 1);
  EXPECT_EQ_INT(c.n_eos, 1);
  EXPECT_EQ_INT(c.eos_token_ids[0], 248046);
  EXPECT_EQ_INT(c.rot_dim, 64);
  EXPECT(fabs(c.rope_theta - 1e7) < 1e-3);
  EXPECT_EQ_INT(c.conv_dim, 2 * 16 * 128 + 32 * 128);
  /* no layer_types: interval 4 => layers 3 and 7 are full */
  for (int i = 0; i < 8; i++)
    EXPECT_EQ_INT(c.layer_types[i], (i == 3 || i == 7) ? LAYER_KIND_FULL : LAYER_KIND_LINEAR);
  EXPECT_EQ_INT(c.bos_token_id, -1);
  /* text_config serialised with its default false, the wrapper tied: tied */
  p = write_cfg(
      "{\"model_type\":\"qwen3_5\",\"tie_word_embeddings\":true,"
      "\"text_config\":{\"tie_word_embeddings\":false,\"num_hidden_layers\":4}}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.tie_word_embeddings, 1);
  p = write_cfg(
      "{\"model_type\":\"qwen3_5\",\"tie_word_embeddings\":false,"
      "\"text_config\":{\"tie_word_embeddings\":false,\"num_hidden_layers\":4}}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.tie_word_embeddings, 0);
}

TEST(interval_and_top_level_rope) {
  const char *p = write_cfg(
      "{\"model_type\":\"qwen3_5_text\",\"num_hidden_layers\":6,\"full_attention_interval\":2,"
      "\"rope_theta\":1000000.0,\"partial_rotary_factor\":0.5,\"head_dim\":64}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  for (int i = 0; i < 6; i++)
    EXPECT_EQ_INT(c.layer_types[i], (i % 2 == 1) ? LAYER_KIND_FULL : LAYER_KIND_LINEAR);
  EXPECT(fabs(c.rope_theta - 1e6) < 1e-3);
  EXPECT_EQ_INT(c.rot_dim, 32);
}

TEST(defaults_qwen35) {
  const char *p = write_cfg("{\"model_type\":\"qwen3_5_text\"}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.vocab_size, 248320);
  EXPECT_EQ_INT(c.hidden_size, 4096);
  EXPECT_EQ_INT(c.intermediate_size, 12288);
  EXPECT_EQ_INT(c.n_layers, 32);
  EXPECT_EQ_INT(c.n_heads, 16);
  EXPECT_EQ_INT(c.n_kv_heads, 4);
  EXPECT_EQ_INT(c.head_dim, 256);
  EXPECT_EQ_INT(c.lin_n_k_heads, 16);
  EXPECT_EQ_INT(c.lin_n_v_heads, 32);
  EXPECT_EQ_INT(c.lin_k_head_dim, 128);
  EXPECT_EQ_INT(c.lin_v_head_dim, 128);
  EXPECT_EQ_INT(c.conv_kernel, 4);
  EXPECT_EQ_INT(c.max_position_embeddings, 32768);
  EXPECT_EQ_INT(c.tie_word_embeddings, 0);
  EXPECT(fabsf(c.partial_rotary_factor - 0.25f) < 1e-7f);
  EXPECT(fabs(c.rope_theta - 10000.0) < 1e-6);
  EXPECT_EQ_INT(c.rot_dim, 64);
  EXPECT_EQ_INT(c.n_eos, 0);
  EXPECT_EQ_INT(config_n_full_layers(&c), 8);
}

TEST(moe_qwen35) {
  const char *p = write_cfg(
      "{\"model_type\":\"qwen3_5_moe_text\",\"num_hidden_layers\":4,\"num_experts\":8,"
      "\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,\"shared_expert_intermediate_size\":"
      "48,"
      "\"norm_topk_prob\":false}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.arch, MODEL_ARCH_QWEN35_MOE);
  EXPECT_EQ_INT(c.n_experts, 8);
  EXPECT_EQ_INT(c.n_experts_per_tok, 2);
  EXPECT_EQ_INT(c.moe_intermediate_size, 32);
  EXPECT_EQ_INT(c.shared_expert_intermediate_size, 48);
  EXPECT_EQ_INT(c.norm_topk_prob, 1); /* Qwen3.5-MoE always renormalises */
  for (int i = 0; i < 4; i++) EXPECT_EQ_INT(c.layer_is_moe[i], 1);
  EXPECT_EQ_INT(c.hidden_size, 2048);
  EXPECT_EQ_INT(c.n_kv_heads, 2);
  /* defaults of the MoE class */
  p = write_cfg("{\"model_type\":\"qwen3_5_moe_text\"}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.n_experts, 256);
  EXPECT_EQ_INT(c.n_experts_per_tok, 8);
  EXPECT_EQ_INT(c.moe_intermediate_size, 512);
  EXPECT_EQ_INT(c.shared_expert_intermediate_size, 512);
  EXPECT_EQ_INT(c.n_layers, 40);
  EXPECT_EQ_INT(c.vocab_size, 248320);
  /* VLM wrapper of the MoE model */
  p = write_cfg(
      "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"num_hidden_layers\":2,\"num_experts\":4,"
      "\"num_experts_per_tok\":2}}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.arch, MODEL_ARCH_QWEN35_MOE);
  EXPECT_EQ_INT(c.n_experts, 4);
  EXPECT_EQ_INT(c.layer_is_moe[1], 1);
}

TEST(qwen3_next) {
  const char *p = write_cfg(
      "{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":8,\"num_experts\":16,\"num_experts_per_"
      "tok\":4,"
      "\"decoder_sparse_step\":2,\"mlp_only_layers\":[3],\"norm_topk_prob\":false,\"rope_theta\":"
      "5000000,"
      "\"partial_rotary_factor\":0.25,\"intermediate_size\":100,\"eos_token_id\":151645}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.arch, MODEL_ARCH_QWEN3_NEXT);
  EXPECT_EQ_INT(c.norm_topk_prob, 0);
  EXPECT(fabs(c.rope_theta - 5e6) < 1e-3);
  /* sparse iff (i+1) % 2 == 0 and i not in mlp_only_layers */
  const int want[8] = {0, 1, 0, 0, 0, 1, 0, 1};
  for (int i = 0; i < 8; i++)
    EXPECT_MSG(c.layer_is_moe[i] == want[i], "layer %d moe %d", i, c.layer_is_moe[i]);
  EXPECT_EQ_INT(c.n_eos, 1);
  EXPECT_EQ_INT(c.eos_token_ids[0], 151645);
  p = write_cfg("{\"model_type\":\"qwen3_next\"}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.vocab_size, 151936);
  EXPECT_EQ_INT(c.n_experts, 512);
  EXPECT_EQ_INT(c.n_experts_per_tok, 10);
  EXPECT_EQ_INT(c.norm_topk_prob, 1);
  EXPECT_EQ_INT(c.n_layers, 48);
  EXPECT_EQ_INT(c.intermediate_size, 5632);
  for (int i = 0; i < 48; i++) EXPECT_EQ_INT(c.layer_is_moe[i], 1);
}

TEST(architecture_without_model_type) {
  const char *p =
      write_cfg("{\"architectures\":[\"Qwen3NextForCausalLM\"],\"num_hidden_layers\":4}");
  REQUIRE(config_load(p, &c, err, sizeof err) == 0);
  EXPECT_EQ_INT(c.arch, MODEL_ARCH_QWEN3_NEXT);
}

/* config_load must fail with one line naming the file and `what`. */
static void expect_error(const char *text, const char *what) {
  const char *p = write_cfg(text);
  err[0] = 0;
  int rc = config_load(p, &c, err, sizeof err);
  EXPECT_MSG(rc == -1, "config %s loaded", text);
  EXPECT_MSG(strstr(err, p) != NULL, "error '%s' does not name the file", err);
  EXPECT_MSG(strstr(err, what) != NULL, "error '%s' does not mention '%s'", err, what);
  EXPECT_MSG(strchr(err, '\n') == NULL, "error '%s' is not one line", err);
}

TEST(bad_configs) {
  expect_error("{\"model_type\":\"llama\"}", "llama");
  expect_error("{\"hidden_size\":64}", "model_type");
  expect_error("{\"model_type\":\"qwen3_5_text\",\"hidden_size\":\"big\"}", "hidden_size");
  expect_error("{\"model_type\":\"qwen3_5_text\",\"hidden_size\":0}", "hidden_size");
  expect_error(
      "{\"model_type\":\"qwen3_5_text\",\"num_hidden_layers\":2,\"layer_types\":[\"full_"
      "attention\"]}",
      "layer_types");
  expect_error(
      "{\"model_type\":\"qwen3_5_text\",\"num_hidden_layers\":1,\"layer_types\":[\"sliding\"]}",
      "layer_types[0]");
  expect_error(
      "{\"model_type\":\"qwen3_5_text\",\"linear_num_key_heads\":3,\"linear_num_value_heads\":4}",
      "linear_num_value_heads");
  expect_error("{\"model_type\":\"qwen3_5_text\",\"eos_token_id\":\"</s>\"}", "eos_token_id");
  expect_error("{\"model_type\":\"qwen3_5_text\",\"eos_token_id\":[1,\"x\"]}", "eos_token_id");
  expect_error("{\"model_type\":\"qwen3_5\"}", "text_config");
  expect_error("{\"model_type\":\"qwen3_5\",\"text_config\":3}", "text_config");
  expect_error("{\"model_type\":\"qwen3_5_text\",\"num_hidden_layers\":300}", "num_hidden_layers");
  expect_error("{\"model_type\":\"qwen3_5_text\",\"rope_parameters\":{\"rope_theta\":\"x\"}}",
               "rope_theta");
  /* rotary scaling types are refused at load, in either key, naming the type */
  expect_error(
      "{\"model_type\":\"qwen3_5_text\",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
      "\"original_max_position_embeddings\":32768}}",
      "rope_scaling type 'yarn' (factor 4) is not implemented");
  expect_error(
      "{\"model_type\":\"qwen3_5_text\",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":2,"
      "\"rope_theta\":10000000}}",
      "rope_parameters type 'yarn' (factor 2)");
  expect_error(
      "{\"model_type\":\"qwen3_next\",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}",
      "type 'linear'");
  const char *types[] = {"dynamic", "longrope", "llama3", "ntk"};
  for (int i = 0; i < 4; i++) {
    char body[200], want[40];
    snprintf(body, sizeof body,
             "{\"model_type\":\"qwen3_5_text\",\"rope_scaling\":{\"rope_type\":\"%s\"}}", types[i]);
    snprintf(want, sizeof want, "type '%s' is not", types[i]);
    expect_error(body, want);
  }
  expect_error("{\"model_type\":\"qwen3_5_text\",\"rope_scaling\":3}", "rope_scaling");
  expect_error("{\"model_type\":\"qwen3_5_moe_text\",\"num_experts\":4,\"num_experts_per_tok\":5}",
               "num_experts_per_tok");
  expect_error("{\"model_type\":\"qwen3_5_text\",\"tie_word_embeddings\":\"yes\"}",
               "tie_word_embeddings");
  expect_error("{\"model_type\":\"qwen3_5_text\",", "invalid JSON");
  expect_error("[1,2]", "not a JSON object");
  /* a file that does not exist */
  err[0] = 0;
  EXPECT(config_load("/tmp/ds_no_such_dir/config.json", &c, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "/tmp/ds_no_such_dir/config.json") != NULL, "error '%s'", err);
}

/* default and mrope (with sections) and a null rope_scaling load as the plain rotation */
TEST(rope_plain_types) {
  const char *ok[] = {
      "{\"model_type\":\"qwen3_5_text\",\"rope_scaling\":null}",
      "{\"model_type\":\"qwen3_5_text\",\"rope_scaling\":{\"rope_type\":\"default\"}}",
      "{\"model_type\":\"qwen3_5_text\",\"rope_scaling\":{\"type\":\"mrope\",\"mrope_section\":[11,"
      "11,10]}}",
      "{\"model_type\":\"qwen3_5_text\",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_"
      "theta\":10000000,\"mrope_interleaved\":true,\"mrope_section\":[11,11,10]}}",
  };
  for (int i = 0; i < 4; i++) {
    err[0] = 0;
    EXPECT_MSG(config_load(write_cfg(ok[i]), &c, err, sizeof err) == 0, "config %d: %s", i, err);
  }
}

int main(void) {
  RUN(flat_qwen35_text);
  RUN(vlm_text_config);
  RUN(interval_and_top_level_rope);
  RUN(rope_plain_types);
  RUN(defaults_qwen35);
  RUN(moe_qwen35);
  RUN(qwen3_next);
  RUN(architecture_without_model_type);
  RUN(bad_configs);
  unlink(cfg_path);
  TEST_MAIN_END();
}
