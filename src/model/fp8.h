/* fp8 — block-scaled e4m3 weights, as the released FP8 checkpoints (and transformers'
 * FineGrainedFP8) store them, and the same quantization made at load (--quantization fp8).
 *
 *   X.weight           F8_E4M3 [N, K]          X.weight_scale_inv  F32 [ceil(N/bn), ceil(K/bk)]
 *
 *        k: 0 ........ bk ....... 2bk ... K         the real weight of element (n, k) is
 *   n: 0 +-----------+-----------+-----+            e4m3(X[n, k]) * s[n / bn][k / bk]
 *        |  s[0][0]  |  s[0][1]  | s02 |            (an fp32 product: the CPU backend's exact
 *     bn +-----------+-----------+-----+             dequantization)
 *        |  s[1][0]  |  s[1][1]  | s12 |
 *      N +-----------+-----------+-----+  <- edge blocks (N or K not a multiple) by ceiling
 *
 * bn x bk is the config's weight_block_size (128 x 128 in the released checkpoints; any size
 * is read). Fused experts [E, N, K] have scales [E, ceil(N/bn), ceil(K/bk)]. A scale tensor
 * stored with other dimensions (squeezed) is accepted when its element count matches.
 *
 * Quantization, as transformers 5.17's FineGrainedFP8 writes it: per block
 * scale_inv = 1 / (448 / amax) (1 for an all-zero block; within an ulp of amax / 448), q =
 * e4m3(clamp(w / scale_inv, -448, 448)) rounded to nearest even, all in fp32. (Its
 * quantize-on-load also rounds the weights to e4m3 unscaled first, losing the small ones:
 * deltaserve quantizes the weights themselves.) */
#ifndef DS_FP8_H
#define DS_FP8_H
#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

#define FP8_E4M3_MAX 448.0f

/* Scale rows and columns of a [rows, cols] matrix in bn x bk blocks (the ceiling). */
int64_t fp8_scale_rows(int64_t rows, int bn);
int64_t fp8_scale_cols(int64_t cols, int bk);

/* Rows [r0, r0 + nr) of the 2-D F8_E4M3 view t, dequantized into out [nr, cols] (fp32,
 * exact: each element's e4m3 value times its block's scale, one fp32 rounding). */
void fp8_dequantize(const tensor *t, int64_t r0, int64_t nr, float *out);

/* Quantizes the 2-D F32 / F16 / BF16 view src [rows, cols] in bn x bk blocks (edge blocks by
 * ceiling): q [rows, cols] e4m3 bytes and scale_inv [fp8_scale_rows, fp8_scale_cols] F32,
 * both caller-owned. Returns 0, or -1 when out of memory (for a bn x cols work buffer). */
int fp8_quantize(const tensor *src, int bn, int bk, uint8_t *q, float *scale_inv);

/* One row of blocks: x [nr, cols] fp32 (nr <= the block height) quantized in blocks of bk
 * columns into q [nr, cols] e4m3 bytes and scale_inv [fp8_scale_cols(cols, bk)], the rule
 * fp8_quantize applies to each of its rows of blocks (gen_random's FP8 tensors use it too, so
 * that both give the same bytes). */
void fp8_quantize_rows(const float *x, int64_t nr, int64_t cols, int bk, uint8_t *q,
                       float *scale_inv);

/* A 2-D F8_E4M3 view of q / scale_inv as fp8_quantize made them. */
tensor fp8_view(const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols, int bn,
                int bk);

#endif
