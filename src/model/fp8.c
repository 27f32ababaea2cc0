/* fp8 — block-scaled e4m3 dequantization and quantization; see fp8.h. */
#include "model/fp8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t fp8_scale_rows(int64_t rows, int bn) { return (rows + bn - 1) / bn; }
int64_t fp8_scale_cols(int64_t cols, int bk) { return (cols + bk - 1) / bk; }

static float fp8_scale_at(const tensor *t, int64_t srow, int64_t scol) {
  float s;
  memcpy(&s, (const char *)t->scale + ((size_t)(srow * t->scale_cols + scol)) * 4, 4);
  return s;
}

void fp8_dequantize(const tensor *t, int64_t r0, int64_t nr, float *out) {
  const int64_t cols = t->shape[t->ndim - 1];
  const uint8_t *q = t->data;
  float lut[256];
  for (int i = 0; i < 256; i++) lut[i] = dtype_e4m3_to_f32((uint8_t)i);
  for (int64_t r = r0; r < r0 + nr; r++) {
    const int64_t srow = (t->row0 + r) / t->block_n;
    const uint8_t *qr = q + (size_t)(r * cols);
    float *o = out + (size_t)((r - r0) * cols);
    for (int64_t k0 = 0; k0 < cols; k0 += t->block_k) {
      float s = fp8_scale_at(t, srow, k0 / t->block_k);
      int64_t k1 = k0 + t->block_k < cols ? k0 + t->block_k : cols;
      for (int64_t k = k0; k < k1; k++) o[k] = lut[qr[k]] * s;
    }
  }
}

/* Row r of a 2-D F32 / F16 / BF16 view as floats. */
static void fp8_row_f32(const tensor *src, int64_t r, float *out) {
  const int64_t cols = src->shape[1];
  const char *p = (const char *)src->data + (size_t)(r * cols) * dtype_size(src->dt);
  if (src->dt == DTYPE_F32) {
    memcpy(out, p, (size_t)cols * 4);
  } else {
    for (int64_t k = 0; k < cols; k++) {
      uint16_t h;
      memcpy(&h, p + 2 * k, 2);
      out[k] = src->dt == DTYPE_BF16 ? dtype_bf16_to_f32(h) : dtype_f16_to_f32(h);
    }
  }
}

int fp8_quantize(const tensor *src, int bn, int bk, uint8_t *q, float *scale_inv) {
  const int64_t rows = src->shape[0], cols = src->shape[1];
  const int64_t sc = fp8_scale_cols(cols, bk);
  float *buf = malloc((size_t)bn * (size_t)cols * sizeof *buf), *s = malloc((size_t)sc * 4);
  if (!buf || !s) {
    free(buf);
    free(s);
    return -1;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += bn) { /* one row of blocks at a time */
    int64_t nr = r0 + bn < rows ? bn : rows - r0;
    for (int64_t r = 0; r < nr; r++) fp8_row_f32(src, r0 + r, buf + (size_t)(r * cols));
    for (int64_t j = 0; j < sc; j++) {
      int64_t c0 = j * bk, c1 = c0 + bk < cols ? c0 + bk : cols;
      float amax = 0.0f;
      for (int64_t r = 0; r < nr; r++)
        for (int64_t k = c0; k < c1; k++) {
          float a = fabsf(buf[r * cols + k]);
          if (a > amax) amax = a;
        }
      s[j] = amax > 0.0f ? 1.0f / (FP8_E4M3_MAX / amax) : 1.0f;
      scale_inv[(r0 / bn) * sc + j] = s[j];
    }
    for (int64_t r = 0; r < nr; r++)
      for (int64_t k = 0; k < cols; k++) {
        float v = buf[r * cols + k] / s[k / bk];
        v = v < -FP8_E4M3_MAX ? -FP8_E4M3_MAX : v > FP8_E4M3_MAX ? FP8_E4M3_MAX : v;
        q[(r0 + r) * cols + k] = dtype_f32_to_e4m3(v);
      }
  }
  free(buf);
  free(s);
  return 0;
}

tensor fp8_view(const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols, int bn,
                int bk) {
  return (tensor){.data = q,
                  .dt = DTYPE_F8_E4M3,
                  .ndim = 2,
                  .shape = {rows, cols},
                  .scale = scale_inv,
                  .scale_cols = fp8_scale_cols(cols, bk),
                  .block_n = bn,
                  .block_k = bk};
}
