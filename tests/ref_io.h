/* ref_io.h — small helpers the parity tests share: reading a reference's raw float32 file,
 * argmax of a logits row (lowest id on ties), and bf16 rounding (round to nearest even, NaN
 * kept quiet) as the GPU stores activations. */
#ifndef DS_TEST_REF_IO_H
#define DS_TEST_REF_IO_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Exactly n little-endian float32 values from path (the file must hold no more), or NULL. */
static inline float *read_f32(const char *path, size_t n) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  float *x = malloc((n ? n : 1) * sizeof *x);
  size_t got = x ? fread(x, sizeof *x, n, fp) : 0;
  int extra = fgetc(fp);
  fclose(fp);
  if (got != n || extra != EOF) {
    free(x);
    return NULL;
  }
  return x;
}

static inline int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

static inline uint16_t f2b(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static inline float b2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
