/* config — the text-model hyper-parameters of a Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoint,
 * read from a Hugging Face config.json (flat, or nested under "text_config" for the released
 * Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration checkpoints). */
#ifndef DS_CONFIG_H
#define DS_CONFIG_H
#include <stddef.h>
#include <stdint.h>

#define CONFIG_MAX_LAYERS 256
#define CONFIG_MAX_EOS 8

typedef enum {
  MODEL_ARCH_QWEN35,     /* qwen3_5_text / qwen3_5 (dense) */
  MODEL_ARCH_QWEN35_MOE, /* qwen3_5_moe_text / qwen3_5_moe */
  MODEL_ARCH_QWEN3_NEXT, /* qwen3_next (fused in_proj_qkvz / in_proj_ba in the checkpoint) */
} model_arch;

typedef enum { LAYER_KIND_LINEAR, LAYER_KIND_FULL } layer_kind;

typedef struct model_config {
  model_arch arch;
  char model_type[64]; /* as written in the file, e.g. "qwen3_5_text" */
  int vocab_size;      /* rows of embed_tokens / lm_head (padded vocabulary) */
  int hidden_size;     /* H */
  int n_layers;
  int mtp_layers;        /* mtp_num_hidden_layers (Qwen3-Next: num_nextn_predict_layers), 0: none */
  int intermediate_size; /* dense FFN width */
  float rms_norm_eps;
  int tie_word_embeddings;
  int max_position_embeddings;

  /* full attention */
  int n_heads, n_kv_heads, head_dim;
  double rope_theta;
  float partial_rotary_factor;
  int rot_dim; /* = head_dim * partial_rotary_factor, rounded down to even */

  /* Gated DeltaNet */
  int lin_n_k_heads, lin_n_v_heads;   /* nk, nv */
  int lin_k_head_dim, lin_v_head_dim; /* dk, dv */
  int conv_kernel;                    /* K */
  int conv_dim;                       /* 2*nk*dk + nv*dv */

  /* MoE (n_experts == 0: dense everywhere) */
  int n_experts, n_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
  int norm_topk_prob;

  layer_kind layer_types[CONFIG_MAX_LAYERS];
  uint8_t layer_is_moe[CONFIG_MAX_LAYERS]; /* 1: sparse MoE FFN, 0: dense SwiGLU */

  /* weight quantization (config.json "quantization_config"): a "fp8" checkpoint's e4m3
   * blocks are fp8_block_n rows x fp8_block_k columns (weight_block_size); both 0 when the
   * checkpoint has no quantization_config. Every other quant_method is refused by config_load.
   * Which tensors are FP8 is up to the file (model/fp8.h). */
  int fp8_block_n, fp8_block_k;

  int eos_token_ids[CONFIG_MAX_EOS];
  int n_eos;
  int bos_token_id; /* -1 when absent */
} model_config;

/* Reads `path` (a config.json). Returns 0, or -1 with one line in err naming the file and the
 * key at fault (missing key, wrong type, unknown model_type/architecture, bad sizes, a
 * quantization format other than block-wise FP8 e4m3 with dynamic activations, named). */
int config_load(const char *path, model_config *c, char *err, size_t errlen);

/* Counts of each layer kind. */
int config_n_full_layers(const model_config *c);
int config_n_linear_layers(const model_config *c);

#endif
