/* weights — every tensor of the text model, as read-only views into mmapped safetensors
 * files (one model.safetensors, or shards listed by model.safetensors.index.json).
 *
 * All checkpoint layouts are mapped onto one canonical layout (the Qwen3.5 one):
 *   - names `model.*` and `model.language_model.*`; `model.visual.*` is skipped; `mtp.*` is
 *     read when asked (weights_opts.mtp), the config has mtp layers and the files have
 *     mtp.fc.weight (mtp_weights);
 *   - Qwen3-Next's fused in_proj_qkvz / in_proj_ba are regrouped into in_proj_qkv, in_proj_z,
 *     in_proj_b, in_proj_a (owned copies, value head index g*r + j);
 *   - MoE experts, fused (gate_up_proj / down_proj) or per expert, become per-expert views;
 *   - tied embeddings: lm_head is a view of embed_tokens.
 * Shapes below are [rows, cols] of the row-major matrix as stored (PyTorch [out, in]). */
#ifndef DS_WEIGHTS_H
#define DS_WEIGHTS_H
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tensor {
  const void *data; /* into an mmap, or into `owned` storage of model_weights; NULL if absent */
  dtype dt;
  int ndim;
  int64_t shape[4];
  /* DTYPE_F8_E4M3 only (model/fp8.h): the F32 block scales (weight_scale_inv, little-endian,
   * maybe unaligned) of the stored matrix this view lies in, [ceil(rows/block_n), scale_cols]
   * row-major; row0 is the view's first row in that matrix (a fused expert's up rows). */
  const void *scale;
  int64_t scale_cols, row0;
  int block_n, block_k;
} tensor;

int64_t tensor_numel(const tensor *t);
/* Element i of t converted to float (any dtype; an F8_E4M3 view, 2-D, times its block's
 * scale, as fp8_dequantize does). */
float tensor_get_f32(const tensor *t, int64_t i);

typedef struct expert_weights {
  tensor gate; /* [moe_I, H] */
  tensor up;   /* [moe_I, H] */
  tensor down; /* [H, moe_I] */
} expert_weights;

typedef struct layer_weights {
  tensor input_norm; /* [H]   zero-centred: y = x_hat * (1 + w) */
  tensor post_norm;  /* [H]   zero-centred */

  /* full attention (layer_types[i] == LAYER_KIND_FULL) */
  tensor q_proj; /* [nh*2*hd, H]  per head: hd query rows then hd gate rows */
  tensor k_proj; /* [nkv*hd, H] */
  tensor v_proj; /* [nkv*hd, H] */
  tensor o_proj; /* [H, nh*hd] */
  tensor q_norm; /* [hd]  zero-centred */
  tensor k_norm; /* [hd]  zero-centred */

  /* Gated DeltaNet (layer_types[i] == LAYER_KIND_LINEAR) */
  tensor in_proj_qkv; /* [conv_dim, H]  rows: q (nk*dk) | k (nk*dk) | v (nv*dv) */
  tensor in_proj_z;   /* [nv*dv, H] */
  tensor in_proj_b;   /* [nv, H] */
  tensor in_proj_a;   /* [nv, H] */
  tensor conv1d;      /* [conv_dim, K]  (checkpoint [conv_dim, 1, K]) */
  tensor dt_bias;     /* [nv] */
  tensor A_log;       /* [nv] */
  tensor lin_norm;    /* [dv]  plain weight (not zero-centred) */
  tensor out_proj;    /* [H, nv*dv] */

  /* dense FFN (layer_is_moe[i] == 0) */
  tensor gate_proj; /* [I, H] */
  tensor up_proj;   /* [I, H] */
  tensor down_proj; /* [H, I] */

  /* MoE FFN (layer_is_moe[i] == 1) */
  tensor router;             /* [E, H]  mlp.gate.weight */
  expert_weights *experts;   /* [E] views */
  tensor shared_gate;        /* [Is, H]  absent when shared_expert_intermediate_size == 0 */
  tensor shared_up;          /* [Is, H] */
  tensor shared_down;        /* [H, Is] */
  tensor shared_expert_gate; /* [1, H] */
} layer_weights;

/* The multi-token-prediction head (`mtp.*`, vLLM's Qwen3NextMultiTokenPredictor): for a token
 * t at position p+1 and the target's final hidden state h_p (after its final norm),
 *   x = fc . concat(Norm_e(embed[t]), Norm_h(h_p))          (embedding half first)
 * then layers[0], a full-attention decoder layer (FFN as the model's layer 0), then norm; the
 * logits through the shared lm_head. Every norm zero-centred. */
typedef struct mtp_weights {
  int n_layers;                 /* 0: the checkpoint has no MTP tensors */
  tensor fc;                    /* [H, 2H]  mtp.fc.weight */
  tensor pre_fc_norm_embedding; /* [H] */
  tensor pre_fc_norm_hidden;    /* [H] */
  tensor norm;                  /* [H]  mtp.norm.weight */
  layer_weights *layers;        /* [n_layers]  mtp.layers.N.* */
} mtp_weights;

typedef struct model_weights {
  tensor embed;          /* [V, H] */
  tensor final_norm;     /* [H] zero-centred */
  tensor lm_head;        /* [V, H]  == embed when tied */
  layer_weights *layers; /* [n_layers] */
  mtp_weights mtp; /* with weights_opts.mtp, when the config has mtp layers and the file mtp.* */
  struct weights_store *store; /* mmaps and owned buffers; private */
} model_weights;

typedef struct weights_opts {
  /* vLLM's --quantization fp8: every product weight stored BF16 / F16 / F32 is quantized at
   * load to F8_E4M3 in 128 x 128 blocks (the config's weight_block_size when it is an fp8
   * one; model/fp8.h), owned by the store; FP8 ones stay. */
  int quantize_fp8;
  /* vLLM's --load-format dummy: no weight file is read; gen_random's tensors for the config
   * (BF16, its values for `seed`) are made in host memory. When the weights end up FP8
   * (quantize_fp8, or an fp8 config) the product weights are made F8_E4M3 with their scales
   * directly, the bytes quantization at load would give, and no BF16 copy of them exists. */
  int dummy;
  uint64_t seed;
  /* 1: the MTP head too (model_weights.mtp), for MTP drafts; 0: mtp.* is not read, so that a
   * checkpoint's MTP tensors can never fail a load that does not use them */
  int mtp;
} weights_opts;

/* Loads every tensor the config needs from the folder `dir`, checking names, dtypes and
 * shapes. FP8 tensors (F8_E4M3 + their weight_scale_inv, model/fp8.h) become F8_E4M3 views;
 * which tensors are FP8 is read from the file, modules_to_not_convert is only cross-checked.
 * Logs the bytes read by dtype. o may be NULL (no options). Returns 0, or -1 with one line in
 * err naming the file and tensor at fault (missing or truncated file, invalid header JSON,
 * missing tensor, wrong shape, unknown dtype, an FP8 tensor without or with wrong scales or
 * listed as not converted). On failure nothing is left allocated. */
int weights_load_with(const char *dir, const model_config *c, const weights_opts *o,
                      model_weights *w, char *err, size_t errlen);
/* weights_load_with without options. */
int weights_load(const char *dir, const model_config *c, model_weights *w, char *err,
                 size_t errlen);
void weights_free(model_weights *w);

/* The bytes of the checkpoint tensor called `name` exactly as stored (any dtype, before any
 * regrouping), or NULL when no file of w has it; *nbytes gets their count when non-NULL.
 * Points into w's mappings; valid until weights_free. For tools and tests. */
const void *weights_raw(const model_weights *w, const char *name, uint64_t *nbytes);

/* -1 with one line in err when path is a file (a GGUF file named as such), 0 otherwise (a
 * folder, or nothing: reading dir/config.json then names what is missing). */
int model_check_path(const char *path, char *err, size_t errlen);

/* Convenience: model_check_path + config_load(dir/config.json) + weights_load_with(dir, o). */
int model_load_with(const char *dir, const weights_opts *o, model_config *c, model_weights *w,
                    char *err, size_t errlen);
int model_load(const char *dir, model_config *c, model_weights *w, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
