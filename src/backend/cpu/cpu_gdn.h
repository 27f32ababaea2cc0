/* cpu_gdn — the gated delta rule on one value head, in fp32: the recurrent step (decode) and
 * the chunked algorithm (prefill, qwen35-model.md §3.1) with chunks aligned to absolute
 * positions. Shared by the CPU backend and tests/test_deltanet.c.
 *
 * State S is [dk, dv] row-major (S[a][c]: key dim a, value dim c). q must already be
 * L2-normalised and scaled by dk^-1/2, k L2-normalised. */
#ifndef DS_CPU_GDN_H
#define DS_CPU_GDN_H
#include <stddef.h>

#include "backend/backend.h"

#define CPU_GDN_CHUNK BACKEND_CHUNK /* backend.h fixes where chunks start */

/* One token: S <- exp(g) S; d = beta (v - S^T k); S <- S + k d^T; o = S^T q.
 * q, k [dk]; v, o [dv]. */
void cpu_gdn_step(const float *q, const float *k, const float *v, float beta, float g, int dk,
                  int dv, float *S, float *o);

/* n tokens at absolute positions pos0 .. pos0+n-1, chunked at multiples of CPU_GDN_CHUNK.
 * Token t's q/k at q + t*qk_stride, k + t*qk_stride, v at v + t*v_stride, beta/g at
 * beta[t*bg_stride], g[t*bg_stride]; output row t at out + t*out_stride [dv]. Row i of a chunk
 * depends only on rows <= i of it and the state entering it; each sum has a fixed order.
 * Returns 0, or -1 when scratch memory cannot be allocated (nothing is written then). */
int cpu_gdn_chunked(int n, int pos0, const float *q, const float *k, size_t qk_stride,
                    const float *v, size_t v_stride, const float *beta, const float *g,
                    size_t bg_stride, int dk, int dv, float *S, float *out, size_t out_stride);

#endif
