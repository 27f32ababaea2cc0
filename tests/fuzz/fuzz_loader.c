/* fuzz_loader — the model loader (config_load, st_open, weights_load) on files made from the
 * fuzz input, written into a private temp folder.
 *
 * The first input byte picks the mode (byte % 4), the rest is the payload:
 *   0  config.json = payload; when config_load accepts it, weights_load runs on that config
 *      against the real tests/fixtures/models/dense_bf16/model.safetensors (linked in), so
 *      hostile sizes reach the shape arithmetic of the weight mapping;
 *   1  model.safetensors = payload (raw file: length word, header, data), loaded with the
 *      dense_bf16 config: st_open, then weights_load;
 *   2  payload = the JSON header only; the harness writes the length word and a zero data
 *      section as long as the dense_bf16 one, so mutations reach the per-entry checks and the
 *      whole weight mapping instead of dying at the length word;
 *   3  model.safetensors.index.json = payload, next to the real dense_bf16 weights as
 *      model.safetensors and model-00001-of-00001.safetensors.
 * Contract checks: success or -1 with a one-line message; on success the config's counts are
 * in range and every tensor view lies inside its file; the safetensors views lie inside the
 * mapping. */
#include <jansson.h>

#include "fuzz/fuzz_common.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

static int fuzz_loader_ready;
static char fuzz_loader_d[4][PATH_MAX];
static model_config fuzz_loader_cfg; /* dense_bf16 */
static uint64_t fuzz_loader_datalen; /* bytes of the dense_bf16 data section */

static void fuzz_loader_init(void) {
  char rel[PATH_MAX], abs_st[PATH_MAX], p[PATH_MAX + 64], err[512];
  fuzz_path(rel, sizeof rel, "tests/fixtures/models/dense_bf16/config.json");
  if (config_load(rel, &fuzz_loader_cfg, err, sizeof err)) fuzz_die("%s", err);
  fuzz_path(rel, sizeof rel, "tests/fixtures/models/dense_bf16/model.safetensors");
  if (!realpath(rel, abs_st)) fuzz_die("%s: %s", rel, strerror(errno));
  size_t n = 0;
  char *st = fuzz_read_file(abs_st, &n);
  if (!st || n < 8) fuzz_die("cannot read %s", abs_st);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = (hl << 8) | (uint8_t)st[i];
  if (hl > n - 8) fuzz_die("%s: bad header length", abs_st);
  fuzz_loader_datalen = n - 8 - hl;
  free(st);
  const char *root = fuzz_tmp_dir();
  for (int m = 0; m < 4; m++) {
    snprintf(fuzz_loader_d[m], sizeof fuzz_loader_d[m], "%.3000s/m%d", root, m);
    if (mkdir(fuzz_loader_d[m], 0700)) fuzz_die("mkdir %s: %s", fuzz_loader_d[m], strerror(errno));
  }
  snprintf(p, sizeof p, "%s/model.safetensors", fuzz_loader_d[0]);
  if (symlink(abs_st, p)) fuzz_die("symlink %s: %s", p, strerror(errno));
  snprintf(p, sizeof p, "%s/model.safetensors", fuzz_loader_d[3]);
  if (symlink(abs_st, p)) fuzz_die("symlink %s: %s", p, strerror(errno));
  snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", fuzz_loader_d[3]);
  if (symlink(abs_st, p)) fuzz_die("symlink %s: %s", p, strerror(errno));
  fuzz_loader_ready = 1;
}

/* one tensor view: absent, or a sane rank and shape */
static int fuzz_loader_view_ok(const tensor *t) {
  if (!t->data) return 1;
  if (t->ndim < 0 || t->ndim > 4) return 0;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] < 0) return 0;
  return 1;
}

static int fuzz_loader_check_weights(const model_config *c, const model_weights *w) {
  FUZZ_CHECK(w->layers != NULL, "weights_load succeeded without layers");
  FUZZ_CHECK(w->embed.data && w->lm_head.data && w->final_norm.data,
             "weights_load succeeded without embed/lm_head/norm");
  FUZZ_CHECK(w->embed.ndim == 2 && w->embed.shape[0] == c->vocab_size &&
                 w->embed.shape[1] == c->hidden_size,
             "embed shape [%lld,%lld] does not match the config", (long long)w->embed.shape[0],
             (long long)w->embed.shape[1]);
  for (int i = 0; i < c->n_layers; i++) {
    const layer_weights *L = &w->layers[i];
    const tensor *all[] = {&L->input_norm,  &L->post_norm, &L->q_proj,    &L->k_proj,
                           &L->v_proj,      &L->o_proj,    &L->q_norm,    &L->k_norm,
                           &L->in_proj_qkv, &L->in_proj_z, &L->in_proj_b, &L->in_proj_a,
                           &L->conv1d,      &L->dt_bias,   &L->A_log,     &L->lin_norm,
                           &L->out_proj,    &L->gate_proj, &L->up_proj,   &L->down_proj};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
      FUZZ_CHECK(fuzz_loader_view_ok(all[k]), "layer %d tensor %zu has a bad view", i, k);
    FUZZ_CHECK(L->input_norm.data && L->post_norm.data, "layer %d lacks its norms", i);
    if (c->layer_types[i] == LAYER_KIND_FULL)
      FUZZ_CHECK(L->q_proj.data && L->o_proj.data, "full layer %d lacks q/o_proj", i);
    else
      FUZZ_CHECK(L->in_proj_qkv.data && L->out_proj.data, "linear layer %d lacks in/out_proj", i);
  }
  /* touch the first and last element of the big views: ASan/SEGV if a view is outside */
  volatile float s = 0;
  int64_t ne = tensor_numel(&w->embed);
  if (ne > 0) s += tensor_get_f32(&w->embed, 0) + tensor_get_f32(&w->embed, ne - 1);
  int64_t nl = tensor_numel(&w->lm_head);
  if (nl > 0) s += tensor_get_f32(&w->lm_head, nl - 1);
  (void)s;
  return 0;
}

static int fuzz_loader_check_config(const model_config *c) {
  FUZZ_CHECK(c->n_layers >= 1 && c->n_layers <= CONFIG_MAX_LAYERS, "n_layers %d", c->n_layers);
  FUZZ_CHECK(c->n_eos >= 0 && c->n_eos <= CONFIG_MAX_EOS, "n_eos %d", c->n_eos);
  FUZZ_CHECK(c->vocab_size > 0 && c->hidden_size > 0 && c->head_dim > 0,
             "non-positive size accepted");
  FUZZ_CHECK(c->rot_dim >= 0 && c->rot_dim <= c->head_dim && c->rot_dim % 2 == 0,
             "rot_dim %d (head_dim %d)", c->rot_dim, c->head_dim);
  FUZZ_CHECK(c->n_heads > 0 && c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0, "heads %d/%d",
             c->n_heads, c->n_kv_heads);
  FUZZ_CHECK(
      c->conv_dim > 0 && (int64_t)c->conv_dim == 2 * (int64_t)c->lin_n_k_heads * c->lin_k_head_dim +
                                                     (int64_t)c->lin_n_v_heads * c->lin_v_head_dim,
      "conv_dim %d does not equal 2*nk*dk + nv*dv", c->conv_dim);
  FUZZ_CHECK(config_n_full_layers(c) + config_n_linear_layers(c) == c->n_layers,
             "layer kinds do not add up");
  FUZZ_CHECK(memchr(c->model_type, 0, sizeof c->model_type) != NULL, "model_type not terminated");
  return 0;
}

static int fuzz_loader_weights(const char *dir, const model_config *c) {
  model_weights w;
  char err[512];
  memset(&w, 0, sizeof w);
  err[0] = 0;
  int rc = weights_load(dir, c, &w, err, sizeof err);
  if (rc == 0) {
    int bad = fuzz_loader_check_weights(c, &w);
    weights_free(&w);
    return bad;
  }
  FUZZ_CHECK(rc == -1, "weights_load returned %d", rc);
  FUZZ_CHECK_MSG(err, "weights_load");
  return 0;
}

static int fuzz_loader_st(const char *path) {
  st_file *f = NULL;
  char err[512];
  err[0] = 0;
  if (st_open(path, &f, err, sizeof err)) {
    FUZZ_CHECK_MSG(err, "st_open");
    return 0;
  }
  int n = st_n_tensors(f);
  FUZZ_CHECK(n >= 0, "st_n_tensors %d", n);
  for (int i = 0; i < n; i++) {
    const st_tensor *t = st_tensor_at(f, i);
    FUZZ_CHECK(t && t->name, "tensor %d missing", i);
    FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "tensor %s ndim %d", t->name, t->ndim);
    FUZZ_CHECK(st_find(f, t->name) != NULL, "st_find(\"%s\") misses a listed tensor", t->name);
    if (t->is_float) {
      uint64_t ne = 1;
      int ovf = 0;
      for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
          ovf = 1;
        else if (t->shape[d] && ne > UINT64_MAX / (uint64_t)t->shape[d])
          ovf = 1;
        else
          ne *= (uint64_t)t->shape[d];
      }
      FUZZ_CHECK(!ovf && ne <= UINT64_MAX / 4 && t->nbytes == ne * dtype_size(t->dt),
                 "tensor %s: nbytes %llu does not match its shape", t->name,
                 (unsigned long long)t->nbytes);
    }
    /* read the first and last byte: ASan/SEGV when the view leaves the mapping */
    if (t->nbytes > 0) {
      volatile uint8_t b = ((const uint8_t *)t->data)[0];
      b ^= ((const uint8_t *)t->data)[t->nbytes - 1];
      (void)b;
    }
  }
  st_close(f);
  return 0;
}

static int fuzz_loader_one(const uint8_t *data, size_t size) {
  if (!fuzz_loader_ready) fuzz_loader_init();
  if (size < 1) return 0;
  int mode = data[0] % 4;
  const uint8_t *p = data + 1;
  size_t n = size - 1;
  char path[PATH_MAX + 64], err[512];
  const char *dir = fuzz_loader_d[mode];
  if (mode == 0) {
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (fuzz_write_file(path, p, n)) fuzz_die("write %s: %s", path, strerror(errno));
    model_config c;
    err[0] = 0;
    int rc = config_load(path, &c, err, sizeof err);
    if (rc != 0) {
      FUZZ_CHECK(rc == -1, "config_load returned %d", rc);
      FUZZ_CHECK_MSG(err, "config_load");
      return 0;
    }
    if (fuzz_loader_check_config(&c)) return 1;
    return fuzz_loader_weights(dir, &c);
  }
  if (mode == 3) {
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (fuzz_write_file(path, p, n)) fuzz_die("write %s: %s", path, strerror(errno));
    return fuzz_loader_weights(dir, &fuzz_loader_cfg);
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (mode == 1) {
    if (fuzz_write_file(path, p, n)) fuzz_die("write %s: %s", path, strerror(errno));
  } else {
    /* length word + header + zero data section (sparse) */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fuzz_die("open %s: %s", path, strerror(errno));
    uint8_t lw[8];
    for (int i = 0; i < 8; i++) lw[i] = (uint8_t)((uint64_t)n >> (8 * i));
    int bad = write(fd, lw, 8) != 8 || (n && write(fd, p, n) != (ssize_t)n) ||
              ftruncate(fd, (off_t)(8 + n + fuzz_loader_datalen)) != 0;
    close(fd);
    if (bad) fuzz_die("write %s: %s", path, strerror(errno));
  }
  if (fuzz_loader_st(path)) return 1;
  return fuzz_loader_weights(dir, &fuzz_loader_cfg);
}

#ifndef FUZZ_REGRESSION
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_loader_one(data, size);
  return 0;
}
#endif
