/* config — reads a Hugging Face config.json into model_config.
 *
 * Three shapes of file are accepted:
 *   flat             {"model_type": "qwen3_5_text" | "qwen3_5_moe_text" | "qwen3_next", ...}
 *   VLM wrapper      {"model_type": "qwen3_5" | "qwen3_5_moe", "text_config": {...}, ...}
 *                    (the released Qwen3.5 / Qwen3.6 checkpoints); values come from
 *                    text_config, falling back to the top level for eos/bos keys; tied
 *                    when either level sets tie_word_embeddings.
 *   no model_type    the architecture name decides (Qwen3_5ForCausalLM, ...).
 * A key that is absent takes the default of the transformers configuration class of that
 * model type (Qwen3_5TextConfig, Qwen3_5MoeTextConfig, Qwen3NextConfig). */
#include "model/config.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

typedef struct cfg_ctx {
  const char *path;
  json_t *t;     /* the object holding the text-model keys */
  json_t *outer; /* the top-level object (== t when flat) */
  char *err;
  size_t errlen;
} cfg_ctx;

/* Reads an integer key (absent: def). Returns 0, or -1 with err on a wrong type. */
static int cfg_int(cfg_ctx *x, json_t *o, const char *key, int def, int *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (json_is_integer(v)) {
    json_int_t k = json_integer_value(v);
    if (k < -2147483647LL || k > 2147483647LL)
      return errf(x->err, x->errlen, "%s: key \"%s\" is out of range", x->path, key);
    *out = (int)k;
    return 0;
  }
  if (json_is_real(v)) {
    double d = json_real_value(v);
    if (!(d >= -2147483647.0 && d <= 2147483647.0))
      return errf(x->err, x->errlen, "%s: key \"%s\" is out of range", x->path, key);
    if (d == (double)(int)d) {
      *out = (int)d;
      return 0;
    }
  }
  return errf(x->err, x->errlen, "%s: key \"%s\" must be an integer", x->path, key);
}

static int cfg_num(cfg_ctx *x, json_t *o, const char *key, double def, double *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (json_is_number(v)) {
    *out = json_number_value(v);
    return 0;
  }
  return errf(x->err, x->errlen, "%s: key \"%s\" must be a number", x->path, key);
}

static int cfg_bool(cfg_ctx *x, json_t *o, const char *key, int def, int *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (json_is_boolean(v)) {
    *out = json_is_true(v);
    return 0;
  }
  if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
    *out = (int)json_integer_value(v);
    return 0;
  }
  return errf(x->err, x->errlen, "%s: key \"%s\" must be true or false", x->path, key);
}

/* The key from the text object, else from the top level (NULL when in neither). */
static json_t *cfg_get2(cfg_ctx *x, const char *key) {
  json_t *v = json_object_get(x->t, key);
  if ((!v || json_is_null(v)) && x->outer != x->t) v = json_object_get(x->outer, key);
  return v && !json_is_null(v) ? v : NULL;
}

static int cfg_arch_of(const char *mt, model_arch *a) {
  if (!strcmp(mt, "qwen3_5_text") || !strcmp(mt, "qwen3_5"))
    *a = MODEL_ARCH_QWEN35;
  else if (!strcmp(mt, "qwen3_5_moe_text") || !strcmp(mt, "qwen3_5_moe"))
    *a = MODEL_ARCH_QWEN35_MOE;
  else if (!strcmp(mt, "qwen3_next"))
    *a = MODEL_ARCH_QWEN3_NEXT;
  else
    return -1;
  return 0;
}

static const char *cfg_type_of_architecture(const char *an) {
  static const struct {
    const char *arch, *type;
  } m[] = {
      {"Qwen3_5ForCausalLM", "qwen3_5_text"},
      {"Qwen3_5ForConditionalGeneration", "qwen3_5"},
      {"Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"},
      {"Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"},
      {"Qwen3NextForCausalLM", "qwen3_next"},
  };
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    if (!strcmp(an, m[i].arch)) return m[i].type;
  return NULL;
}

/* quantization_config: block-wise FP8 is read, every other format refused by name (a
 * checkpoint is never loaded as if it were bf16). */
static int cfg_quant(cfg_ctx *x, model_config *c) {
  static const struct {
    const char *method, *format;
  } refused[] = {
      {"awq", "AWQ"},
      {"gptq", "GPTQ"},
      {"compressed-tensors", "compressed-tensors"},
      {"compressed_tensors", "compressed-tensors"},
      {"bitsandbytes", "bitsandbytes"},
      {"gguf", "GGUF"},
      {"mxfp4", "MXFP4"},
      {"modelopt", "ModelOpt"},
      {"fbgemm_fp8", "FBGEMM FP8"},
  };
  const char *supported =
      "deltaserve loads bf16, f16, f32 and block-wise FP8 (\"fp8\") checkpoints";
  if (cfg_get2(x, "compression_config"))
    return errf(x->err, x->errlen,
                "%s: compressed-tensors checkpoint (\"compression_config\") is not supported: %s",
                x->path, supported);
  json_t *q = cfg_get2(x, "quantization_config");
  if (!q) return 0;
  if (!json_is_object(q))
    return errf(x->err, x->errlen, "%s: key \"quantization_config\" must be an object", x->path);
  json_t *jm = json_object_get(q, "quant_method");
  if (!json_is_string(jm))
    return errf(x->err, x->errlen, "%s: quantization_config has no \"quant_method\" string",
                x->path);
  const char *m = json_string_value(jm);
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    if (!strcmp(m, refused[i].method))
      return errf(x->err, x->errlen, "%s: %s checkpoint (quant_method \"%s\") is not supported: %s",
                  x->path, refused[i].format, m, supported);
  if (strcmp(m, "fp8"))
    return errf(x->err, x->errlen, "%s: unknown quant_method \"%.40s\": %s", x->path, m, supported);
  json_t *jf = json_object_get(q, "fmt"), *ja = json_object_get(q, "activation_scheme");
  if (jf && !json_is_null(jf) && !(json_is_string(jf) && !strcmp(json_string_value(jf), "e4m3")))
    return errf(x->err, x->errlen,
                "%s: fp8 checkpoint with fmt %s is not supported: only \"e4m3\" weights", x->path,
                json_is_string(jf) ? json_string_value(jf) : "(not a string)");
  if (ja && !json_is_null(ja) && !(json_is_string(ja) && !strcmp(json_string_value(ja), "dynamic")))
    return errf(x->err, x->errlen,
                "%s: fp8 checkpoint with activation_scheme %s is not supported: only \"dynamic\" "
                "(no stored activation scales)",
                x->path, json_is_string(ja) ? json_string_value(ja) : "(not a string)");
  json_t *jb = json_object_get(q, "weight_block_size");
  if (!jb || json_is_null(jb))
    return errf(x->err, x->errlen,
                "%s: fp8 checkpoint without weight_block_size (per-tensor FP8 scales) is not "
                "supported: only block-wise FP8",
                x->path);
  if (!json_is_array(jb) || json_array_size(jb) != 2 || !json_is_integer(json_array_get(jb, 0)) ||
      !json_is_integer(json_array_get(jb, 1)) || json_integer_value(json_array_get(jb, 0)) < 1 ||
      json_integer_value(json_array_get(jb, 1)) < 1 ||
      json_integer_value(json_array_get(jb, 0)) > 65536 ||
      json_integer_value(json_array_get(jb, 1)) > 65536)
    return errf(x->err, x->errlen,
                "%s: quantization_config.weight_block_size must be two positive integers", x->path);
  c->fp8_block_n = (int)json_integer_value(json_array_get(jb, 0));
  c->fp8_block_k = (int)json_integer_value(json_array_get(jb, 1));
  return 0;
}

static int cfg_parse(cfg_ctx *x, model_config *c) {
  json_t *root = x->outer;
  /* --- architecture --- */
  const char *mt = NULL;
  json_t *jmt = json_object_get(root, "model_type");
  if (jmt && !json_is_string(jmt))
    return errf(x->err, x->errlen, "%s: key \"model_type\" must be a string", x->path);
  if (jmt) mt = json_string_value(jmt);
  if (!mt) {
    json_t *ja = json_object_get(root, "architectures");
    if (json_is_array(ja) && json_array_size(ja) > 0 && json_is_string(json_array_get(ja, 0)))
      mt = cfg_type_of_architecture(json_string_value(json_array_get(ja, 0)));
    if (!mt)
      return errf(x->err, x->errlen,
                  "%s: missing key \"model_type\" (and no known \"architectures\" entry)", x->path);
  }
  if (cfg_arch_of(mt, &c->arch) != 0)
    return errf(x->err, x->errlen,
                "%s: unsupported model_type \"%.60s\" (expected qwen3_5, qwen3_5_text, "
                "qwen3_5_moe, qwen3_5_moe_text or qwen3_next)",
                x->path, mt);
  snprintf(c->model_type, sizeof c->model_type, "%s", mt);
  json_t *tc = json_object_get(root, "text_config");
  if (tc && !json_is_null(tc)) {
    if (!json_is_object(tc))
      return errf(x->err, x->errlen, "%s: key \"text_config\" must be an object", x->path);
    x->t = tc;
    json_t *tmt = json_object_get(tc, "model_type");
    model_arch ta;
    if (json_is_string(tmt) && cfg_arch_of(json_string_value(tmt), &ta) == 0 && ta != c->arch)
      return errf(x->err, x->errlen,
                  "%s: text_config.model_type \"%s\" does not match model_type \"%s\"", x->path,
                  json_string_value(tmt), mt);
  } else if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_moe")) {
    return errf(x->err, x->errlen, "%s: model_type \"%s\" needs a \"text_config\" object", x->path,
                mt);
  }
  json_t *t = x->t;
  int next = c->arch == MODEL_ARCH_QWEN3_NEXT, moe = c->arch == MODEL_ARCH_QWEN35_MOE;

  /* --- sizes (defaults: the transformers configuration classes) --- */
  int rc = 0;
  rc |= cfg_int(x, t, "vocab_size", next ? 151936 : 248320, &c->vocab_size);
  if (!rc) rc |= cfg_int(x, t, "hidden_size", (next || moe) ? 2048 : 4096, &c->hidden_size);
  if (!rc) rc |= cfg_int(x, t, "num_hidden_layers", next ? 48 : moe ? 40 : 32, &c->n_layers);
  if (!rc)
    rc |= cfg_int(x, t, next ? "num_nextn_predict_layers" : "mtp_num_hidden_layers", 0,
                  &c->mtp_layers);
  if (!rc)
    rc |= cfg_int(x, t, "intermediate_size", next ? 5632 : moe ? 0 : 12288, &c->intermediate_size);
  double eps = 1e-6;
  if (!rc) rc |= cfg_num(x, t, "rms_norm_eps", 1e-6, &eps);
  c->rms_norm_eps = (float)eps;
  if (!rc) rc |= cfg_int(x, t, "max_position_embeddings", 32768, &c->max_position_embeddings);
  if (!rc) rc |= cfg_int(x, t, "num_attention_heads", 16, &c->n_heads);
  if (!rc) rc |= cfg_int(x, t, "num_key_value_heads", (next || moe) ? 2 : 4, &c->n_kv_heads);
  if (!rc) rc |= cfg_int(x, t, "head_dim", 256, &c->head_dim);
  if (!rc) rc |= cfg_int(x, t, "linear_num_key_heads", 16, &c->lin_n_k_heads);
  if (!rc) rc |= cfg_int(x, t, "linear_num_value_heads", 32, &c->lin_n_v_heads);
  if (!rc) rc |= cfg_int(x, t, "linear_key_head_dim", 128, &c->lin_k_head_dim);
  if (!rc) rc |= cfg_int(x, t, "linear_value_head_dim", 128, &c->lin_v_head_dim);
  if (!rc) rc |= cfg_int(x, t, "linear_conv_kernel_dim", 4, &c->conv_kernel);
  if (rc) return -1;

  /* tie_word_embeddings: flat files read their own key; a wrapper ties when either its top
   * level (read by the ForConditionalGeneration class) or its text_config says so */
  c->tie_word_embeddings = 0;
  if (cfg_bool(x, t, "tie_word_embeddings", 0, &c->tie_word_embeddings)) return -1;
  if (x->outer != t) {
    int outer_tie;
    if (cfg_bool(x, root, "tie_word_embeddings", 0, &outer_tie)) return -1;
    c->tie_word_embeddings |= outer_tie;
  }

  /* --- RoPE: rope_parameters (transformers 5), else top-level keys (older files) --- */
  double theta = 10000.0, prf = 0.25;
  json_t *rp = json_object_get(t, "rope_parameters");
  if (rp && !json_is_null(rp) && !json_is_object(rp))
    return errf(x->err, x->errlen, "%s: key \"rope_parameters\" must be an object", x->path);
  if (cfg_num(x, t, "rope_theta", theta, &theta) ||
      cfg_num(x, t, "partial_rotary_factor", prf, &prf))
    return -1;
  if (json_is_object(rp)) {
    if (cfg_num(x, rp, "rope_theta", theta, &theta) ||
        cfg_num(x, rp, "partial_rotary_factor", prf, &prf))
      return -1;
  }
  /* the scaling types (yarn, linear, dynamic, longrope, llama3, ...) change every rotary
   * frequency: not implemented, so refused rather than served with other logits; default and
   * mrope (Qwen3.5's sections are one position for text) are the plain rotation */
  json_t *scal[] = {json_object_get(t, "rope_scaling"), rp};
  const char *scal_key[] = {"rope_scaling", "rope_parameters"};
  for (int k = 0; k < 2; k++) {
    json_t *o = scal[k];
    if (!o || json_is_null(o)) continue;
    if (!json_is_object(o))
      return errf(x->err, x->errlen, "%s: key \"%s\" must be an object or null", x->path,
                  scal_key[k]);
    json_t *ty = json_object_get(o, "rope_type");
    if (!ty || json_is_null(ty)) ty = json_object_get(o, "type");
    const char *tn = json_is_string(ty) ? json_string_value(ty) : NULL;
    if (ty && !json_is_null(ty) && !tn)
      return errf(x->err, x->errlen, "%s: %s.rope_type must be a string", x->path, scal_key[k]);
    if (!tn || !strcmp(tn, "default") || !strcmp(tn, "mrope")) continue;
    json_t *f = json_object_get(o, "factor");
    char fs[48] = "";
    if (json_is_number(f)) snprintf(fs, sizeof fs, " (factor %g)", json_number_value(f));
    return errf(x->err, x->errlen,
                "%s: %s type '%s'%s is not implemented (only default and mrope rotary "
                "embeddings); remove it to serve contexts up to max_position_embeddings",
                x->path, scal_key[k], tn, fs);
  }
  c->rope_theta = theta;
  c->partial_rotary_factor = (float)prf;
  if (!(theta > 0)) return errf(x->err, x->errlen, "%s: rope_theta must be positive", x->path);
  if (!(prf > 0 && prf <= 1))
    return errf(x->err, x->errlen, "%s: partial_rotary_factor must be in (0, 1]", x->path);
  c->rot_dim = ((int)(c->head_dim * prf)) & ~1;

  /* --- checks --- */
  struct {
    const char *key;
    int v;
  } pos[] = {
      {"vocab_size", c->vocab_size},
      {"hidden_size", c->hidden_size},
      {"num_hidden_layers", c->n_layers},
      {"num_attention_heads", c->n_heads},
      {"num_key_value_heads", c->n_kv_heads},
      {"head_dim", c->head_dim},
      {"linear_num_key_heads", c->lin_n_k_heads},
      {"linear_num_value_heads", c->lin_n_v_heads},
      {"linear_key_head_dim", c->lin_k_head_dim},
      {"linear_value_head_dim", c->lin_v_head_dim},
      {"linear_conv_kernel_dim", c->conv_kernel},
      {"max_position_embeddings", c->max_position_embeddings},
  };
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v <= 0)
      return errf(x->err, x->errlen, "%s: key \"%s\" must be positive (got %d)", x->path,
                  pos[i].key, pos[i].v);
  if (c->n_layers > CONFIG_MAX_LAYERS)
    return errf(x->err, x->errlen, "%s: num_hidden_layers %d exceeds the supported %d", x->path,
                c->n_layers, CONFIG_MAX_LAYERS);
  if (c->n_heads % c->n_kv_heads)
    return errf(x->err, x->errlen,
                "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", x->path,
                c->n_heads, c->n_kv_heads);
  if (c->lin_n_v_heads % c->lin_n_k_heads)
    return errf(x->err, x->errlen,
                "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                x->path, c->lin_n_v_heads, c->lin_n_k_heads);
  if (c->rms_norm_eps <= 0)
    return errf(x->err, x->errlen, "%s: rms_norm_eps must be positive", x->path);
  /* sizes beyond any real model are refused, so that every product of two of them fits */
  const struct {
    const char *key;
    int v, max;
  } lim[] = {
      {"hidden_size", c->hidden_size, 1 << 18},
      {"vocab_size", c->vocab_size, 1 << 22},
      {"intermediate_size", c->intermediate_size, 1 << 20},
      {"num_attention_heads", c->n_heads, 4096},
      {"num_key_value_heads", c->n_kv_heads, 4096},
      {"head_dim", c->head_dim, 4096},
      {"linear_num_key_heads", c->lin_n_k_heads, 4096},
      {"linear_num_value_heads", c->lin_n_v_heads, 4096},
      {"linear_key_head_dim", c->lin_k_head_dim, 4096},
      {"linear_value_head_dim", c->lin_v_head_dim, 4096},
      {"linear_conv_kernel_dim", c->conv_kernel, 64},
  };
  for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
    if (lim[i].v > lim[i].max)
      return errf(x->err, x->errlen, "%s: key \"%s\" is %d, larger than any supported model (%d)",
                  x->path, lim[i].key, lim[i].v, lim[i].max);
  int64_t conv_dim =
      2LL * c->lin_n_k_heads * c->lin_k_head_dim + (int64_t)c->lin_n_v_heads * c->lin_v_head_dim;
  if (conv_dim > (1 << 24))
    return errf(x->err, x->errlen, "%s: linear-attention sizes are too large", x->path);
  c->conv_dim = (int)conv_dim;

  /* --- layer types --- */
  json_t *lt = json_object_get(t, "layer_types");
  if (lt && !json_is_null(lt)) {
    if (!json_is_array(lt))
      return errf(x->err, x->errlen, "%s: key \"layer_types\" must be a list", x->path);
    if ((int)json_array_size(lt) != c->n_layers)
      return errf(x->err, x->errlen, "%s: layer_types has %zu entries but num_hidden_layers is %d",
                  x->path, json_array_size(lt), c->n_layers);
    for (int i = 0; i < c->n_layers; i++) {
      const char *s = json_string_value(json_array_get(lt, (size_t)i));
      if (s && !strcmp(s, "linear_attention"))
        c->layer_types[i] = LAYER_KIND_LINEAR;
      else if (s && !strcmp(s, "full_attention"))
        c->layer_types[i] = LAYER_KIND_FULL;
      else
        return errf(
            x->err, x->errlen,
            "%s: layer_types[%d] is \"%.40s\" (expected linear_attention or full_attention)",
            x->path, i, s ? s : "(not a string)");
    }
  } else {
    int interval;
    if (cfg_int(x, t, "full_attention_interval", 4, &interval)) return -1;
    if (interval <= 0)
      return errf(x->err, x->errlen, "%s: key \"full_attention_interval\" must be positive",
                  x->path);
    for (int i = 0; i < c->n_layers; i++)
      c->layer_types[i] = (i + 1) % interval ? LAYER_KIND_LINEAR : LAYER_KIND_FULL;
  }

  /* --- MoE --- */
  memset(c->layer_is_moe, 0, sizeof c->layer_is_moe);
  c->n_experts = c->n_experts_per_tok = c->moe_intermediate_size =
      c->shared_expert_intermediate_size = 0;
  c->norm_topk_prob = 0;
  if (moe || next) {
    rc = cfg_int(x, t, "num_experts", moe ? 256 : 512, &c->n_experts);
    if (!rc) rc = cfg_int(x, t, "num_experts_per_tok", moe ? 8 : 10, &c->n_experts_per_tok);
    if (!rc) rc = cfg_int(x, t, "moe_intermediate_size", 512, &c->moe_intermediate_size);
    if (!rc)
      rc = cfg_int(x, t, "shared_expert_intermediate_size", 512,
                   &c->shared_expert_intermediate_size);
    /* Qwen3.5-MoE's router always renormalises the top-k weights; Qwen3-Next reads the key */
    if (!rc)
      rc = moe ? (c->norm_topk_prob = 1, 0)
               : cfg_bool(x, t, "norm_topk_prob", 1, &c->norm_topk_prob);
    if (rc) return -1;
    if (c->n_experts < 0 || c->shared_expert_intermediate_size < 0)
      return errf(x->err, x->errlen,
                  "%s: num_experts and shared_expert_intermediate_size must not be negative",
                  x->path);
    if (c->n_experts > 0) {
      if (c->n_experts_per_tok <= 0 || c->n_experts_per_tok > c->n_experts)
        return errf(x->err, x->errlen, "%s: num_experts_per_tok %d must be in 1..num_experts (%d)",
                    x->path, c->n_experts_per_tok, c->n_experts);
      if (c->moe_intermediate_size <= 0)
        return errf(x->err, x->errlen, "%s: key \"moe_intermediate_size\" must be positive",
                    x->path);
    }
    if (moe) {
      for (int i = 0; i < c->n_layers; i++) c->layer_is_moe[i] = c->n_experts > 0;
    } else {
      int step;
      if (cfg_int(x, t, "decoder_sparse_step", 1, &step)) return -1;
      if (step <= 0)
        return errf(x->err, x->errlen, "%s: key \"decoder_sparse_step\" must be positive", x->path);
      for (int i = 0; i < c->n_layers; i++)
        c->layer_is_moe[i] = c->n_experts > 0 && (i + 1) % step == 0;
      json_t *mo = json_object_get(t, "mlp_only_layers");
      if (mo && !json_is_null(mo)) {
        if (!json_is_array(mo))
          return errf(x->err, x->errlen, "%s: key \"mlp_only_layers\" must be a list", x->path);
        for (size_t k = 0; k < json_array_size(mo); k++) {
          json_t *e = json_array_get(mo, k);
          if (!json_is_integer(e))
            return errf(x->err, x->errlen, "%s: mlp_only_layers[%zu] must be an integer", x->path,
                        k);
          json_int_t li = json_integer_value(e);
          if (li >= 0 && li < c->n_layers) c->layer_is_moe[li] = 0;
        }
      }
    }
  }
  for (int i = 0; i < c->n_layers; i++)
    if (!c->layer_is_moe[i] && c->intermediate_size <= 0)
      return errf(x->err, x->errlen, "%s: layer %d has a dense MLP but intermediate_size is %d",
                  x->path, i, c->intermediate_size);

  /* --- special tokens (text object first, then the top level) --- */
  c->n_eos = 0;
  json_t *eos = cfg_get2(x, "eos_token_id");
  if (eos) {
    if (json_is_integer(eos)) {
      c->eos_token_ids[c->n_eos++] = (int)json_integer_value(eos);
    } else if (json_is_array(eos)) {
      if (json_array_size(eos) > CONFIG_MAX_EOS)
        return errf(x->err, x->errlen, "%s: eos_token_id lists %zu ids (at most %d)", x->path,
                    json_array_size(eos), CONFIG_MAX_EOS);
      for (size_t k = 0; k < json_array_size(eos); k++) {
        json_t *e = json_array_get(eos, k);
        if (!json_is_integer(e))
          return errf(x->err, x->errlen, "%s: eos_token_id[%zu] must be an integer", x->path, k);
        c->eos_token_ids[c->n_eos++] = (int)json_integer_value(e);
      }
    } else {
      return errf(x->err, x->errlen,
                  "%s: key \"eos_token_id\" must be an integer or a list of integers", x->path);
    }
  }
  json_t *bos = cfg_get2(x, "bos_token_id");
  if (bos && !json_is_integer(bos))
    return errf(x->err, x->errlen, "%s: key \"bos_token_id\" must be an integer", x->path);
  c->bos_token_id = bos ? (int)json_integer_value(bos) : -1;
  return cfg_quant(x, c);
}

int config_load(const char *path, model_config *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    if (je.line < 0 || je.position == 0)
      return errf(err, errlen, "%s: cannot read: %s", path, je.text);
    return errf(err, errlen, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
  }
  if (!json_is_object(root)) {
    json_decref(root);
    return errf(err, errlen, "%s: not a JSON object", path);
  }
  cfg_ctx x = {.path = path, .t = root, .outer = root, .err = err, .errlen = errlen};
  int rc = cfg_parse(&x, c);
  json_decref(root);
  if (rc) {
    model_config z;
    memset(&z, 0, sizeof z);
    *c = z;
  }
  return rc;
}

int config_n_full_layers(const model_config *c) {
  int n = 0;
  for (int i = 0; i < c->n_layers; i++) n += c->layer_types[i] == LAYER_KIND_FULL;
  return n;
}

int config_n_linear_layers(const model_config *c) { return c->n_layers - config_n_full_layers(c); }
