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

/* ---- quantization, four lanes at a time (GCC / clang vector extensions, SSE2 wide) ------- */

typedef float fp8_v4f __attribute__((vector_size(16)));
typedef int32_t fp8_v4i __attribute__((vector_size(16)));
typedef uint32_t fp8_v4u __attribute__((vector_size(16)));
typedef uint64_t fp8_v2u __attribute__((vector_size(16)));

/* |x| on the bits, 0 for a NaN: ordered as the magnitudes, so the block's amax is their
 * largest (a NaN skipped, as fp8.h's rule compares it false). */
static inline int32_t fp8_abs_bits(float f) {
  int32_t b;
  memcpy(&b, &f, 4);
  b &= 0x7fffffff;
  return b > 0x7f800000 ? 0 : b;
}

/* q[i] = dtype_f32_to_e4m3(clamp(v[i], -448, 448)) for four lanes, the same code for every
 * float (NaN included): a normal value rounds its mantissa to nearest even at bit 20, the carry
 * running into the exponent; one below 2^-6 is a subnormal m * 2^-9, m rounded to even by
 * adding 2^23 to |v| * 512 (exact). */
static inline void fp8_encode4(const fp8_v4f *v, uint8_t *q) {
  fp8_v4u u, sub; /* unsigned: the rounding add wraps for a NaN instead of overflowing */
  memcpy(&u, v, sizeof u);
  const fp8_v4u a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
  const fp8_v4u normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  fp8_v4f af;
  memcpy(&af, &a, sizeof af);
  af = af * 512.0f + 8388608.0f;
  memcpy(&sub, &af, sizeof sub);
  fp8_v4u m = (fp8_v4u)(a < 0x3c800000u), code = (sub & 0xfu & m) | (normal & ~m); /* <= 8 */
  m = (fp8_v4u)(a > 0x43e00000u); /* clamped to 448 */
  code = (0x7eu & m) | (code & ~m);
  m = (fp8_v4u)(a > 0x7f800000u); /* NaN */
  code = (0x7fu & m) | (code & ~m);
  code |= sign;
  /* each lane's low byte into one little-endian word: each 64-bit half gathers its two */
  fp8_v2u w;
  memcpy(&w, &code, sizeof w);
  w |= w >> 24;
  const uint32_t out = (uint32_t)(w[0] & 0xffff) | (uint32_t)(w[1] & 0xffff) << 16;
  memcpy(q, &out, 4);
}

void fp8_quantize_rows(const float *x, int64_t nr, int64_t cols, int bk, uint8_t *q,
                       float *scale_inv) {
  for (int64_t c0 = 0, j = 0; c0 < cols; c0 += bk, j++) {
    const int64_t c1 = c0 + bk < cols ? c0 + bk : cols;
    fp8_v4i m4 = {0};
    int32_t m = 0;
    for (int64_t r = 0; r < nr; r++) {
      const float *xr = x + r * cols;
      int64_t k = c0;
      for (; k + 4 <= c1; k += 4) {
        fp8_v4i b;
        memcpy(&b, xr + k, sizeof b);
        b &= 0x7fffffff;
        b &= b <= 0x7f800000;
        fp8_v4i gt = b > m4;
        m4 = (b & gt) | (m4 & ~gt);
      }
      for (; k < c1; k++) m = fp8_abs_bits(xr[k]) > m ? fp8_abs_bits(xr[k]) : m;
    }
    for (int t = 0; t < 4; t++) m = m4[t] > m ? m4[t] : m;
    float amax;
    memcpy(&amax, &m, 4);
    const float s = amax > 0.0f ? 1.0f / (FP8_E4M3_MAX / amax) : 1.0f;
    scale_inv[j] = s;
    for (int64_t r = 0; r < nr; r++) {
      const float *xr = x + r * cols;
      uint8_t *qr = q + r * cols;
      int64_t k = c0;
      for (; k + 4 <= c1; k += 4) {
        fp8_v4f v;
        memcpy(&v, xr + k, sizeof v);
        v = v / s;
        fp8_encode4(&v, qr + k);
      }
      if (k < c1) { /* the tail, in lanes of its own */
        fp8_v4f v = {0};
        uint8_t b[4];
        for (int64_t t = 0; t < c1 - k; t++) v[t] = xr[k + t] / s;
        fp8_encode4(&v, b);
        memcpy(qr + k, b, (size_t)(c1 - k));
      }
    }
  }
}

int fp8_quantize(const tensor *src, int bn, int bk, uint8_t *q, float *scale_inv) {
  const int64_t rows = src->shape[0], cols = src->shape[1];
  const int64_t sc = fp8_scale_cols(cols, bk);
  float *buf = malloc((size_t)bn * (size_t)cols * sizeof *buf);
  if (!buf) return -1;
  for (int64_t r0 = 0; r0 < rows; r0 += bn) { /* one row of blocks at a time */
    int64_t nr = r0 + bn < rows ? bn : rows - r0;
    for (int64_t r = 0; r < nr; r++) fp8_row_f32(src, r0 + r, buf + (size_t)(r * cols));
    fp8_quantize_rows(buf, nr, cols, bk, q + (size_t)(r0 * cols), scale_inv + (r0 / bn) * sc);
  }
  free(buf);
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
