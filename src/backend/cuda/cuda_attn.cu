/* cuda_attn — paged causal GQA attention over bf16 K/V pages.
 *
 * First every row's k and v are written into its sequence's pages; then one block per
 * (row, q head) walks the sequence's positions 0..p: its ATT_WARPS warps take positions
 * round-robin, each keeping an online softmax (running max, sum, fp32 accumulator over hd,
 * hd/32 values per lane), and the warps' partial results are merged at the end. The order of
 * every sum depends only on the row's position, never on the batch. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define ATT_WARPS 8
#define ATT_MAXR 8 /* hd <= 256 */

__global__ void k_kv_write(const bf16 *k, const bf16 *v, const int32_t *seq, const int32_t *pos,
                           const int32_t *page_table, int max_pages, int T, int w, bf16 *kp,
                           bf16 *vp) {
  size_t n = (size_t)T * w;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int t = (int)(i / w), e = (int)(i % w);
    int p = pos[t];
    int page = page_table[(size_t)seq[t] * max_pages + p / BACKEND_PAGE_TOKENS];
    size_t off = ((size_t)page * BACKEND_PAGE_TOKENS + (size_t)(p % BACKEND_PAGE_TOKENS)) * w + e;
    kp[off] = k[i];
    vp[off] = v[i];
  }
}

__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention(const bf16 *kp, const bf16 *vp, const bf16 *q, const int32_t *seq,
                const int32_t *pos, const int32_t *page_table, int max_pages, int nh, int nkv,
                int hd, float scale, bf16 *out) {
  __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
  extern __shared__ float sm_acc[]; /* [ATT_WARPS, hd] */
  int t = blockIdx.x, h = blockIdx.y;
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  int kvh = h / (nh / nkv);
  int s = seq[t], p = pos[t];
  const int32_t *pt = page_table + (size_t)s * max_pages;
  float qr[ATT_MAXR], acc[ATT_MAXR];
  const bf16 *qrow = q + ((size_t)t * nh + h) * hd;
#pragma unroll
  for (int r = 0; r < ATT_MAXR; r++) {
    int i = lane + 32 * r;
    qr[r] = i < hd ? bf2f(qrow[i]) : 0.f;
    acc[r] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  size_t row_w = (size_t)nkv * hd;
  for (int j = wp; j <= p; j += ATT_WARPS) {
    int page = pt[j / BACKEND_PAGE_TOKENS];
    size_t off = ((size_t)page * BACKEND_PAGE_TOKENS + (size_t)(j % BACKEND_PAGE_TOKENS)) * row_w +
                 (size_t)kvh * hd;
    const bf16 *kr = kp + off;
    float d = 0.f;
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
      int i = lane + 32 * r;
      if (i < hd) d += qr[r] * bf2f(kr[i]);
    }
    float sc = warp_sum(d) * scale;
    if (sc > m) {
      float cr = expf(m - sc);
      l *= cr;
#pragma unroll
      for (int r = 0; r < ATT_MAXR; r++) acc[r] *= cr;
      m = sc;
    }
    float e = expf(sc - m);
    l += e;
    const bf16 *vr = vp + off;
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
      int i = lane + 32 * r;
      if (i < hd) acc[r] += e * bf2f(vr[i]);
    }
  }
  if (lane == 0) {
    sm_m[wp] = m;
    sm_l[wp] = l;
  }
#pragma unroll
  for (int r = 0; r < ATT_MAXR; r++) {
    int i = lane + 32 * r;
    if (i < hd) sm_acc[wp * hd + i] = acc[r];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w]);
  float L = 0.f;
  for (int w = 0; w < ATT_WARPS; w++)
    if (sm_l[w] > 0.f) L += sm_l[w] * expf(sm_m[w] - M);
  float invL = 1.f / L;
  bf16 *orow = out + ((size_t)t * nh + h) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < ATT_WARPS; w++)
      if (sm_l[w] > 0.f) o += sm_acc[w * hd + i] * expf(sm_m[w] - M);
    orow[i] = f2bf(o * invL);
  }
}

extern "C" void cuda_attn_attention(backend *be, backend_buf k_pool, backend_buf v_pool,
                                    backend_buf q, backend_buf k, backend_buf v, int nh, int nkv,
                                    int hd, float scale, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  int T = c->b.n_tokens;
  if (T <= 0) return;
  if (hd > 32 * ATT_MAXR || nkv <= 0 || nh % nkv) {
    cuda_fail(c, "attention", "head dim over 256 or nh not a multiple of nkv");
    return;
  }
  int w = nkv * hd;
  k_kv_write<<<cuda_blocks((size_t)T * w, 256), 256, 0, c->st>>>(
      (const bf16 *)k, (const bf16 *)v, c->b.seq, c->b.pos, c->b.page_table, c->b.max_pages, T, w,
      (bf16 *)k_pool, (bf16 *)v_pool);
  cuda_check_launch(c, "attention (kv write)");
  dim3 grid(T, nh);
  k_attention<<<grid, ATT_WARPS * 32, ATT_WARPS * hd * sizeof(float), c->st>>>(
      (const bf16 *)k_pool, (const bf16 *)v_pool, (const bf16 *)q, c->b.seq, c->b.pos,
      c->b.page_table, c->b.max_pages, nh, nkv, hd, scale, (bf16 *)out);
  cuda_check_launch(c, "attention");
}
