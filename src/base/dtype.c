/* dtype — element sizes, names and float conversions; see dtype.h. */
#include "base/dtype.h"

#include <string.h>

static const struct {
  size_t size;
  const char *name;
} dtype_info[] = {[DTYPE_F32] = {4, "f32"},
                  [DTYPE_F16] = {2, "f16"},
                  [DTYPE_BF16] = {2, "bf16"},
                  [DTYPE_F8_E4M3] = {1, "f8_e4m3"}};

#define DTYPE_COUNT (sizeof dtype_info / sizeof dtype_info[0])

size_t dtype_size(dtype t) { return (size_t)t < DTYPE_COUNT ? dtype_info[t].size : 0; }

const char *dtype_name(dtype t) { return (size_t)t < DTYPE_COUNT ? dtype_info[t].name : "?"; }

float dtype_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

float dtype_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: renormalise */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t dtype_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  /* a NaN keeps a mantissa bit set: rounding could carry it into the exponent (infinity) */
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

uint16_t dtype_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, man = x & 0x7fffffu;
  int32_t fexp = (int32_t)((x >> 23) & 0xff), exp = fexp - 127 + 15;
  if (fexp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) { /* a subnormal half, or zero below half the smallest one */
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000u;
    int shift = 14 - exp;
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

float dtype_e4m3_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80) << 24, exp = (b >> 3) & 0xf, man = b & 7, bits;
  if (exp == 15 && man == 7) {
    bits = sign | 0x7fc00000u;
  } else if (exp == 0) { /* zero or subnormal: man * 2^-9, exact in float */
    float f = (float)man * (1.0f / 512.0f);
    return sign ? -f : f;
  } else {
    bits = sign | ((exp - 7 + 127) << 23) | (man << 20);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint8_t dtype_f32_to_e4m3(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | 0x7f; /* NaN, infinity */
  if (a < 0x3c800000u) {                    /* below 2^-6: a subnormal, rounded on m * 2^-9 */
    float q;
    memcpy(&q, &a, 4);
    q *= 512.0f; /* exact: a power of two */
    uint32_t n = (uint32_t)q;
    float frac = q - (float)n;
    if (frac > 0.5f || (frac == 0.5f && (n & 1))) n++;
    return sign | (uint8_t)n; /* n == 8 is the smallest normal, code 0x08 */
  }
  int32_t e = (int32_t)(a >> 23) - 127 + 7;
  if (e > 15) return sign | 0x7f;
  uint32_t code = ((uint32_t)e << 3) | ((a >> 20) & 7), rem = a & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (code & 1))) code++; /* may carry into the exponent */
  if (code > 0x7e) return sign | 0x7f;
  return sign | (uint8_t)code;
}
