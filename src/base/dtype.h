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

typedef enum { DTYPE_F32, DTYPE_F16, DTYPE_BF16 } dtype;

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one element (4 or 2); 0 for a value outside the enum. */
size_t dtype_size(dtype t);
/* Lower-case name as the CLI spells it ("f32", "f16", "bf16"); "?" outside the enum. */
const char *dtype_name(dtype t);

/* Exact conversions of one stored element to float (every backend's upload uses them, so
 * that all backends start from the same bits). */
float dtype_bf16_to_f32(uint16_t h);
float dtype_f16_to_f32(uint16_t h);
/* Round-to-nearest-even conversions of a float to a stored element (writers of weight
 * files); overflow gives infinity, a NaN stays a NaN. */
uint16_t dtype_f32_to_bf16(float f);
uint16_t dtype_f32_to_f16(float f);

#ifdef __cplusplus
}
#endif

#endif
