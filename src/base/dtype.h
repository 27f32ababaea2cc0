/* dtype — the element types a model's tensors are stored in, and exact conversions between
 * them and float.
 *
 * It lives in base/ because three layers name element types without needing each other: the
 * safetensors reader and writer (header spellings), the weights loader (tensor views), and
 * the backends (weight uploads convert from the stored type). */
#ifndef DS_DTYPE_H
#define DS_DTYPE_H
#include <stddef.h>
#include <stdint.h>

/* DTYPE_F8_E4M3: OCP FP8 e4m3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no
 * infinities, 0x7f / 0xff NaN, largest finite 448, subnormals m * 2^-9. A tensor of it carries
 * block scales (model/fp8.h); alone it is not a weight. */
typedef enum { DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F8_E4M3 } dtype;

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one element (4, 2 or 1); 0 for a value outside the enum. */
size_t dtype_size(dtype t);
/* Lower-case name as the CLI spells it ("f32", "f16", "bf16", "f8_e4m3"); "?" outside the
 * enum. */
const char *dtype_name(dtype t);

/* Exact conversions of one stored element to float (every backend's upload uses them, so
 * that all backends start from the same bits). */
float dtype_bf16_to_f32(uint16_t h);
float dtype_f16_to_f32(uint16_t h);
/* Round-to-nearest-even conversions of a float to a stored element (writers of weight
 * files); overflow gives infinity, a NaN stays a NaN. */
uint16_t dtype_f32_to_bf16(float f);
uint16_t dtype_f32_to_f16(float f);
/* e4m3: every one of the 256 codes decoded exactly (0x7f / 0xff give a NaN); the encoder
 * rounds to nearest even, subnormals included, and gives NaN (0x7f with the sign) for a NaN,
 * an infinity, or a value whose rounding passes 448, as PyTorch's float8_e4m3fn cast does
 * (callers that must not overflow clamp to +-448 first). */
float dtype_e4m3_to_f32(uint8_t b);
uint8_t dtype_f32_to_e4m3(float f);

#ifdef __cplusplus
}
#endif

#endif
