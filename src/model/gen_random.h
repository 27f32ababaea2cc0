/* gen_random — writes a model folder with random weights for a config.json: a copy of the
 * config and one model.safetensors with every tensor the config needs, under the canonical
 * Qwen3.5 text names (model.layers.N...). Used by `deltaserve gen-random`, the demo model
 * and the tests.
 *
 * Values (deterministic for a seed, whatever the thread count): matrices and embeddings
 * uniform with std 0.02; zero-centred norm weights U(-0.1, 0.1); linear_attn.norm.weight
 * 1 + U(-0.1, 0.1); A_log = log(U(1, 16)); dt_bias 1 + U(-0.1, 0.1); conv1d uniform with
 * std 0.2. As in the released checkpoints, A_log and linear_attn.norm.weight are F32 whatever
 * the chosen dtype. Each tensor is cut into chunks of GEN_RANDOM_CHUNK elements; chunk j of
 * tensor i (its index in the file as written without FP8) draws from its own xoshiro256**
 * stream seeded from (seed, i, j), and worker threads fill and pwrite chunks in any order. An
 * F8_E4M3 tensor (fp8_block_n) is cut instead into jobs of whole row blocks that start on a
 * chunk, each quantized as it is made: no copy of the tensor in `dt` is ever held. */
#ifndef DS_GEN_RANDOM_H
#define DS_GEN_RANDOM_H
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "model/config.h"

#define GEN_RANDOM_CHUNK (1 << 20)

typedef enum {
  GEN_RANDOM_EXPERTS_FUSED,      /* mlp.experts.gate_up_proj [E, 2I, H] + down_proj [E, H, I] */
  GEN_RANDOM_EXPERTS_PER_EXPERT, /* mlp.experts.N.{gate,up,down}_proj.weight */
} gen_random_experts;

typedef struct gen_random_opts {
  uint64_t seed;
  dtype dt;
  int threads;                /* 0: one per online CPU */
  gen_random_experts experts; /* MoE layout */
  int next_fused;             /* 1: Qwen3-Next fused in_proj_qkvz / in_proj_ba instead */
  int vlm_prefix;             /* 1: names under model.language_model. */
  int quiet;                  /* 1: no summary line on stdout */
  /* > 0: the decoder layers' product weights (those weights.c quantizes for --quantization
   * fp8: attention, DeltaNet in_proj_qkv / in_proj_z / out_proj, dense FFN, experts and shared
   * expert projections) are written F8_E4M3 with their F32 `<name>_scale_inv`
   * [ceil(N/bn), ceil(K/bk)], the values being the `dt` tensor's quantized as fp8_quantize does
   * (the same bytes as writing `dt` and quantizing); a fused expert or in_proj_qkvz / in_proj_ba
   * tensor, the MTP head and every other tensor stay `dt` */
  int fp8_block_n, fp8_block_k;
} gen_random_opts;

/* Writes out_dir/config.json (a byte copy of config_path) and out_dir/model.safetensors,
 * creating out_dir (and its parents) when missing. Returns 0, or -1 with one line in err
 * (bad config, unwritable folder, disk full). */
int gen_random_write(const char *config_path, const char *out_dir, const gen_random_opts *o,
                     char *err, size_t errlen);

/* Writes only the weights file `path` (model.safetensors) for the loaded config c. Returns 0,
 * or -1 with one line in err (unwritable path, disk or memory full). */
int gen_random_write_weights(const model_config *c, const char *path, const gen_random_opts *o,
                             char *err, size_t errlen);

/* Dtype named by a config.json's "dtype" / "torch_dtype" ("bfloat16", "float16", "float32")
 * or by a flag ("bf16", "f16", "f32"). Returns 0, or -1 when unknown. */
int gen_random_parse_dtype(const char *s, dtype *out);

#endif
