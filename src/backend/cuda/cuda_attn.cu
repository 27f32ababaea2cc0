/* cuda_attn — paged causal GQA attention over bf16 K/V pages.
 *
 * First every row's k and v are written into its sequence's pages (in a decode step the split
 * kernel does it). Then, when hd is 32, 64, 128 or 256, the split path ("flash decoding"):
 * grid (row, kv head x sub-group, split); the row's positions 0..p are cut into contiguous
 * ranges, a function of p and the step's row count (at most ATT_MAXS ranges of ATT_SPLIT
 * positions, ATT_SPLIT_SMALL / ATT_SPLIT_TINY in steps of few rows; of p alone under
 * --batch-invariant). A block of ATT_SW warps handles one range for all q heads of its kv head
 * (or a sub-group of them where the group's accumulators would not fit the registers: 6 heads
 * as two blocks of 3, 8 at hd 256 as two of 4): a warp takes one position at a time, its K and
 * V rows arriving by cp.async into the warp's slots in shared memory ATT_STAGES - 1 positions
 * ahead, each lane using hd/32 contiguous K and V values (16 bytes at hd = 256) for the whole
 * group, keeping an online softmax per q head; the warps merge in a fixed order and the block
 * writes (m, l, acc[hd]) per q head to scratch. A second kernel merges a row's ranges in order
 * (and applies the output gate when the decode recorder fused the sigmoid_mul after it).
 * Decode rows that share their
 * first KV pages with other rows of the step (kv_share.h: a prefix restored from the cache)
 * leave those positions to the shared-prefix kernel (cuda_flash.cu k_flash_shared: once per
 * group on tensor cores), and the merge takes its partials too. Other shapes take the
 * one-block-per-(row, q head) kernel below. The GEMM path's pieces go through the fused flash
 * kernel of cuda_flash.cu instead where it covers the shape. */
#include <cuda_fp8.h>
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

CUDA_KTRACE_TU(cuda_attn_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

#define ATT_WARPS 8
#define ATT_MAXR 8 /* hd <= 256 */

__global__ void k_kv_write(const bf16 *k, const bf16 *v, const int32_t *seq, const int32_t *pos,
                           const int32_t *page_table, int max_pages, int T, int w, bf16 *kp,
                           bf16 *vp) {
  pdl_enter();
  size_t n = (size_t)T * w;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned ii = (unsigned)i; /* n < 2^32 (checked at launch): 32-bit division */
    int t = (int)(ii / (unsigned)w), e = (int)(ii % (unsigned)w);
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
                int hd, float scale, const int32_t *seq_len, int gemm_min, bf16 *out) {
  pdl_enter();
  __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
  extern __shared__ float sm_acc[]; /* [ATT_WARPS, hd] */
  int t = blockIdx.x, h = blockIdx.y;
  if (gemm_min > 0 && seq_len[seq[t]] >= gemm_min) return; /* the GEMM path's row */
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

/* ---- GEMM path: prefill pieces of >= ATT_GEMM_MIN rows on tensor cores ----
 *
 * Per piece: its keys and values for positions 0 .. pos0+len-1 are gathered from the pages
 * into contiguous [ctx, nkv*hd] rows; then per block of R query rows and per kv head, for the
 * G q heads of that kv head at once (strided-batched cuBLAS, bf16 in, fp32 accumulate):
 *   S = Q K^T (fp32) -> causal softmax of scale*S per row into P (bf16, 0 past the row's
 *   position) -> O = P V (bf16), written straight into the rows' output.
 * R is a function of the piece's context length only (S and P of one block fit
 * ATT_GEMM_BUDGET), so a piece's result never depends on what else is in the step. The rows
 * of shorter pieces (decode rows, short resumes) stay on the split path, which skips these. */
#define ATT_GEMM_MIN 32 /* rows of a piece for the GEMM path (= FLASH_MIN) */
static_assert(ATT_GEMM_MIN == CUDA_ATT_SPLIT_LEN, "the recorder keeps shorter verify pieces");
#define ATT_GEMM_BUDGET (256u << 20) /* bytes of S + P per block */

/* The GEMM path's piece length threshold for this shape; 0: the path is off. */
static int att_gemm_min(const cuda_ctx *c, int nkv, int hd) {
  return (nkv * hd) % 8 ? 0 : ATT_GEMM_MIN;
}

/* Query rows per block for a piece of `len` rows and context ctx (a function of these only; a
 * test may cap it: backend_cuda_test attn_gemm_rows, several blocks per piece). */
static size_t att_gemm_rows(const cuda_ctx *c, int G, size_t ctx, int len) {
  size_t R = ATT_GEMM_BUDGET / ((size_t)G * ctx * 6);
  if (R < 16) R = 16;
  if (c->attn_gemm_rows > 0 && R > (size_t)c->attn_gemm_rows) R = (size_t)c->attn_gemm_rows;
  if (R > (size_t)len) R = (size_t)len;
  return R;
}

/* grid-stride over ctx * w / 8 16-byte units: K/V rows of positions 0..ctx-1 of one piece */
__global__ void k_kv_gather(const bf16 *kp, const bf16 *vp, const int32_t *pt, int ctx, int w,
                            bf16 *kc, bf16 *vc) {
  pdl_enter();
  int w8 = w / 8;
  size_t n = (size_t)ctx * w8;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int j = (int)(i / w8), e = (int)(i % w8) * 8;
    size_t src = ((size_t)pt[j / BACKEND_PAGE_TOKENS] * BACKEND_PAGE_TOKENS +
                  (size_t)(j % BACKEND_PAGE_TOKENS)) *
                     w +
                 e;
    *(uint4 *)(kc + (size_t)j * w + e) = *(const uint4 *)(kp + src);
    *(uint4 *)(vc + (size_t)j * w + e) = *(const uint4 *)(vp + src);
  }
}

/* grid (R, G), block 256: row r of head g: p_r = p0 + r attends to 0..p_r. */
__global__ void k_att_softmax(const float *S, int ctx, int R, int p0, float scale, bf16 *P) {
  pdl_enter();
  __shared__ float red[33];
  int r = blockIdx.x, g = blockIdx.y;
  const float *s = S + ((size_t)g * R + r) * ctx;
  bf16 *o = P + ((size_t)g * R + r) * ctx;
  int n = p0 + r + 1;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, s[j] * scale);
  m = block_max(m, red);
  float sum = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sum += expf(s[j] * scale - m);
  sum = block_sum(sum, red);
  float inv = 1.f / sum;
  for (int j = threadIdx.x; j < ctx; j += blockDim.x)
    o[j] = f2bf(j < n ? expf(s[j] * scale - m) * inv : 0.f);
}

/* ---- FP8 K/V (--kv-cache-dtype fp8) ----
 *
 * A page of one pool is [P, nkv, hd] e4m3 bytes, then [P, nkv] f32 scales, one per (token, kv
 * head) (backend.h "Paged K/V"):
 *
 *   page: | row 0: h0 hd B | h1 hd B | ... | row 15 ... | s[0][0] s[0][1] ... s[15][nkv-1] |
 *
 * k_kv_write8 quantizes each (row, kv head) with one warp (amax / 448, round to nearest even,
 * exactly as the CPU backend). The long pieces go to the fused kernel, which dequantizes each
 * K/V tile into shared memory (cuda_flash.cu k_flash<HD, true>), or, at head sizes it does not
 * cover, have their context dequantized into contiguous bf16 by k_kv_gather8 for the GEMM path;
 * decode rows and short pieces take k_attn_split8 (below), other head sizes k_attention8, the
 * one-block-per-(row, q head) kernel. A value is e4m3(q) * s in fp32, as on the CPU, so the two
 * backends read the same K/V. */

/* An e4m3 byte as a float: its sign, exponent and mantissa bits moved into a float's (the
 * value times 2^-120, subnormals included), then the 2^120 back (exact). */
__device__ __forceinline__ float kv8_f32(uint8_t b) {
  return __uint_as_float(((uint32_t)(b & 0x80) << 24) | ((uint32_t)(b & 0x7f) << 20)) * 0x1p120f;
}

/* Row r (0..P-1) of page `page`, kv head h: its hd bytes; *s its scale. */
__device__ __forceinline__ uint8_t *kv8_at(uint8_t *pool, int page, int r, int h, int nkv, int hd,
                                           float **s) {
  size_t rows = (size_t)BACKEND_PAGE_TOKENS * nkv, i = (size_t)r * nkv + h;
  uint8_t *pg = pool + (size_t)page * rows * ((size_t)hd + 4);
  *s = (float *)(pg + rows * hd) + i;
  return pg + i * hd;
}

/* grid-stride over warps, one per (row, kv head, k or v) */
__global__ void k_kv_write8(const bf16 *k, const bf16 *v, const int32_t *seq, const int32_t *pos,
                            const int32_t *page_table, int max_pages, int T, int nkv, int hd,
                            uint8_t *kp, uint8_t *vp) {
  pdl_enter();
  int lane = threadIdx.x & 31;
  size_t n = (size_t)T * nkv * 2, step = ((size_t)gridDim.x * blockDim.x) >> 5;
  for (size_t u = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; u < n; u += step) {
    int isv = (int)(u & 1), t = (int)((u >> 1) / nkv), h = (int)((u >> 1) % nkv);
    const bf16 *x = (isv ? v : k) + ((size_t)t * nkv + h) * hd;
    float xv[ATT_MAXR], amax = 0.f;
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
      int i = lane + 32 * r;
      xv[r] = i < hd ? bf2f(x[i]) : 0.f;
      amax = fmaxf(amax, fabsf(xv[r]));
    }
    amax = warp_max(amax);
    int p = pos[t];
    int page = page_table[(size_t)seq[t] * max_pages + p / BACKEND_PAGE_TOKENS];
    float *s;
    uint8_t *q = kv8_at(isv ? vp : kp, page, p % BACKEND_PAGE_TOKENS, h, nkv, hd, &s);
    float inv = amax > 0.f ? BACKEND_KV_FP8_MAX / amax : 0.f;
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
      int i = lane + 32 * r;
      if (i >= hd) continue;
      float y = fminf(fmaxf(xv[r] * inv, -BACKEND_KV_FP8_MAX), BACKEND_KV_FP8_MAX);
      q[i] = amax > 0.f ? (uint8_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3) : 0;
    }
    if (lane == 0) *s = amax > 0.f ? amax / BACKEND_KV_FP8_MAX : 0.f;
  }
}

/* grid-stride over ctx * nkv * hd values: positions 0..ctx-1 of one piece, dequantized */
__global__ void k_kv_gather8(const uint8_t *kp, const uint8_t *vp, const int32_t *pt, int ctx,
                             int nkv, int hd, bf16 *kc, bf16 *vc) {
  pdl_enter();
  size_t w = (size_t)nkv * hd, n = (size_t)ctx * w;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int j = (int)(i / w), h = (int)(i % w / hd), e = (int)(i % hd);
    int page = pt[j / BACKEND_PAGE_TOKENS], r = j % BACKEND_PAGE_TOKENS;
    float *ks, *vs;
    const uint8_t *kr = kv8_at((uint8_t *)kp, page, r, h, nkv, hd, &ks);
    const uint8_t *vr = kv8_at((uint8_t *)vp, page, r, h, nkv, hd, &vs);
    kc[i] = f2bf(kv8_f32(kr[e]) * *ks);
    vc[i] = f2bf(kv8_f32(vr[e]) * *vs);
  }
}

/* k_attention over FP8 pages (same grid, same math on the dequantized values) */
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention8(const uint8_t *kp, const uint8_t *vp, const bf16 *q, const int32_t *seq,
                 const int32_t *pos, const int32_t *page_table, int max_pages, int nh, int nkv,
                 int hd, float scale, const int32_t *seq_len, int gemm_min, bf16 *out) {
  pdl_enter();
  __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
  extern __shared__ float sm_acc[]; /* [ATT_WARPS, hd] */
  int t = blockIdx.x, h = blockIdx.y;
  if (gemm_min > 0 && seq_len[seq[t]] >= gemm_min) return; /* the GEMM path's row */
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
  for (int j = wp; j <= p; j += ATT_WARPS) {
    int page = pt[j / BACKEND_PAGE_TOKENS];
    float *ks, *vs;
    const uint8_t *kr = kv8_at((uint8_t *)kp, page, j % BACKEND_PAGE_TOKENS, kvh, nkv, hd, &ks);
    const uint8_t *vr = kv8_at((uint8_t *)vp, page, j % BACKEND_PAGE_TOKENS, kvh, nkv, hd, &vs);
    float ksc = *ks, vsc = *vs, d = 0.f;
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
      int i = lane + 32 * r;
      if (i < hd) d += qr[r] * (kv8_f32(kr[i]) * ksc);
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
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
      int i = lane + 32 * r;
      if (i < hd) acc[r] += e * (kv8_f32(vr[i]) * vsc);
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

/* The GEMM path over the step's long pieces; returns how many rows it took (0 on failure:
 * recorded, the caller's split path then covers nothing new -- the step fails at sync).
 * kp, vp: bf16 pages, or FP8 pages (c->kv_fp8) that the gather dequantizes. */
static int att_gemm(cuda_ctx *c, const void *kp, const void *vp, const bf16 *q, int nh, int nkv,
                    int hd, float scale, bf16 *out) {
  const backend_batch *hb = &c->hb;
  int G = nh / nkv, w = nkv * hd, min = att_gemm_min(c, nkv, hd), rows = 0;
  if (!min) return 0;
  size_t need = 0;
  for (int i = 0; i < hb->n_seqs; i++) {
    if (hb->seq_len[i] < min) continue;
    size_t ctx = (size_t)hb->seq_pos[i] + hb->seq_len[i];
    size_t R = att_gemm_rows(c, G, ctx, hb->seq_len[i]);
    size_t b = 2 * ctx * w * 2 + G * R * ctx * 6 + 1024;
    if (b > need) need = b;
  }
  if (!need) return 0;
  char *sc = (char *)cuda_scratch(c, need);
  if (!sc) return 0;
  for (int i = 0; i < hb->n_seqs; i++) {
    int L = hb->seq_len[i];
    if (L < min) continue;
    int pos0 = hb->seq_pos[i], s0 = hb->seq_start[i], ctx = pos0 + L;
    int R = (int)att_gemm_rows(c, G, (size_t)ctx, L);
    bf16 *kc = (bf16 *)sc, *vc = kc + (size_t)ctx * w;
    float *S = (float *)(((uintptr_t)(vc + (size_t)ctx * w) + 255) & ~(uintptr_t)255);
    bf16 *P = (bf16 *)(S + (size_t)G * R * ctx);
    if (c->kv_fp8)
      k_kv_gather8<<<cuda_blocks((size_t)ctx * w, 256), 256, 0, c->st>>>(
          (const uint8_t *)kp, (const uint8_t *)vp, c->b.page_table + (size_t)i * c->b.max_pages,
          ctx, nkv, hd, kc, vc);
    else
      k_kv_gather<<<cuda_blocks((size_t)ctx * w / 8, 256), 256, 0, c->st>>>(
          (const bf16 *)kp, (const bf16 *)vp, c->b.page_table + (size_t)i * c->b.max_pages, ctx, w,
          kc, vc);
    cuda_check_launch(c, "attention (gather)");
    for (int r0 = 0; r0 < L; r0 += R) {
      int Rb = L - r0 < R ? L - r0 : R, cb = pos0 + r0 + Rb; /* keys this block needs */
      for (int kvh = 0; kvh < nkv; kvh++) {
        const float one = 1.f, zero = 0.f;
        const bf16 *qb = q + ((size_t)(s0 + r0) * nh + (size_t)kvh * G) * hd;
        cublasStatus_t st = cublasGemmStridedBatchedEx(
            c->blas, CUBLAS_OP_T, CUBLAS_OP_N, cb, Rb, hd, &one, kc + (size_t)kvh * hd, CUDA_R_16BF,
            w, 0, qb, CUDA_R_16BF, nh * hd, hd, &zero, S, CUDA_R_32F, cb, (long long)Rb * cb, G,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
          cuda_fail(c, "attention", "cuBLAS QK^T failed");
          return 0;
        }
        dim3 g2(Rb, G);
        k_att_softmax<<<g2, 256, 0, c->st>>>(S, cb, Rb, pos0 + r0, scale, P);
        cuda_check_launch(c, "attention (softmax)");
        bf16 *ob = out + ((size_t)(s0 + r0) * nh + (size_t)kvh * G) * hd;
        st = cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, Rb, cb, &one,
                                        vc + (size_t)kvh * hd, CUDA_R_16BF, w, 0, P, CUDA_R_16BF,
                                        cb, (long long)Rb * cb, &zero, ob, CUDA_R_16BF, nh * hd, hd,
                                        G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
          cuda_fail(c, "attention", "cuBLAS PV failed");
          return 0;
        }
      }
    }
    rows += L;
  }
  return rows;
}

/* ---- split path ---- */

#define ATT_SPLIT 128 /* positions per range, before the cap on ranges */
/* Steps of at most ATT_SMALL_T rows cut ranges of ATT_SPLIT_SMALL positions: a one-sequence
 * step has too few blocks to keep the SMs busy at 128 (for every step it loses at 64+ rows). A
 * row's ranges then depend on its step's row count as well as its position, as a row's GEMM
 * bits do (cuBLAS); under --batch-invariant every step uses ATT_SPLIT. */
#define ATT_SPLIT_SMALL 64
#define ATT_SMALL_T 8
/* ... and steps of at most ATT_TINY_T rows ranges of ATT_SPLIT_TINY (up to the cap on ranges;
 * for every step of <= 8 rows it loses at 8) */
#define ATT_SPLIT_TINY 32
#define ATT_TINY_T 2
#define ATT_MAXS 16 /* ranges per row at most: the merge's loads stay one unrolled batch */
#define ATT_SW 8    /* warps per block */
#define ATT_MAXG 8  /* q heads per kv head */
#define ATT_STAGES \
  4 /* positions per warp in flight (cp.async into shared memory): the latency hidden */

/* Number of ranges and positions per range for a row's n positions (p + 1, less its shared
 * ones), ranges of `split` positions before the cap (att_split_of: a function of the step's
 * row count alone). */
__device__ __forceinline__ int att_nsplit(int n, int split, int *per) {
  int ns = (n + split - 1) / split;
  if (ns > ATT_MAXS) ns = ATT_MAXS;
  int q = (n + ns - 1) / ns;
  *per = q;
  return (n + q - 1) / q;
}

/* VPL consecutive bf16 values (global or shared memory) as floats, in one load where VPL is
 * 8 or 4. */
template <int VPL>
__device__ __forceinline__ void att_unpack(const bf16 *src, float *dst) {
  if constexpr (VPL == 8) {
    bf16x8_to_f32(*(const uint4 *)src, dst);
  } else if constexpr (VPL == 4) {
    uint2 u = *(const uint2 *)src;
    const __nv_bfloat162 *b2 = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 2; i++) {
      float2 f = __bfloat1622float2(b2[i]);
      dst[2 * i] = f.x;
      dst[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VPL; i++) dst[i] = bf2f(src[i]);
  }
}

/* The split kernel's shared memory: first each warp's ATT_STAGES position slots (K row, then
 * V row, hd bf16 each, filled by cp.async), then, after the positions, the warps' (m, l, acc)
 * for the block's merge (the same bytes). */
template <int HD, int G>
struct att_smem {
  static constexpr size_t slots = (size_t)ATT_SW * ATT_STAGES * 2 * HD * sizeof(bf16);
  static constexpr size_t accs = (size_t)ATT_SW * G * HD * sizeof(float);
  static constexpr size_t bytes = slots > accs ? slots : accs;
};

/* grid (T, nkv * G / GB, ATT_MAXS), block ATT_SW*32: block (t, y, z) takes the GB q heads
 * kvh * G + sub * GB .. of kv head kvh = y / (G / GB), sub = y % (G / GB) (att_heads_per_block:
 * GB = G where the group's accumulators fit the registers, else a divisor of G, the kv head's
 * positions then read once per sub-group). part: [T, nh, slots, hd] accumulators,
 * ml: [T, nh, slots, 2] (running max, sum), this kernel's ranges in slots 0 .. ATT_MAXS-1.
 * sh_start (NULL: none): a row's first sh_start[t] positions are its group's shared prefix,
 * read by k_flash_shared (cuda_flash.cu); its ranges here cut positions sh_start[t] .. p.
 * A warp takes positions j0 + wp, j0 + wp + ATT_SW, ... in order; each position's K and V rows
 * (hd * 4 bytes) are copied into one of the warp's ATT_STAGES slots by cp.async in 16-byte
 * pieces, ATT_STAGES - 1 positions ahead of the one being used, so the loads in flight live in
 * shared memory, not registers (holding them in registers capped the positions in flight at
 * two). Each lane then reads its hd/32 values of the slot. */
/* The split kernels' shared arithmetic (bf16 and FP8 pages). att_q_init: a lane's VPL values
 * of the block's G q heads of row t (times scale), the accumulators cleared. */
template <int VPL, int G>
__device__ __forceinline__ void att_q_init(const bf16 *q, int t, int nh, int h0, int lane,
                                           float scale, float (*qr)[VPL], float (*acc)[VPL],
                                           float *m, float *l) {
  constexpr int HD = VPL * 32;
#pragma unroll
  for (int g = 0; g < G; g++) {
    att_unpack<VPL>(q + ((size_t)t * nh + h0 + g) * HD + lane * VPL, qr[g]);
#pragma unroll
    for (int i = 0; i < VPL; i++) {
      qr[g][i] *= scale;
      acc[g][i] = 0.f;
    }
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
}

/* One position into the warp's online softmax: scores ks * (q . k) over the warp, V rows
 * added as (e * vs) * v (ks = vs = 1 for bf16 pages: the products are exact). */
template <int VPL, int G>
__device__ __forceinline__ void att_position(const float (*qr)[VPL], const float *kr,
                                             const float *vr, float ks, float vs, float (*acc)[VPL],
                                             float *m, float *l) {
  float d[G];
#pragma unroll
  for (int g = 0; g < G; g++) {
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < VPL; e++) s += qr[g][e] * kr[e];
    d[g] = s;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int g = 0; g < G; g++) d[g] += __shfl_xor_sync(0xffffffffu, d[g], o);
#pragma unroll
  for (int g = 0; g < G; g++) {
    float sc = d[g] * ks;
    float mn = fmaxf(m[g], sc);
    float cr = __expf(m[g] - mn), e = __expf(sc - mn);
    l[g] = l[g] * cr + e;
    float ev = e * vs;
#pragma unroll
    for (int k = 0; k < VPL; k++) acc[g][k] = acc[g][k] * cr + ev * vr[k];
    m[g] = mn;
  }
}

/* The block's warps merged in warp order into range z's partial of each of its G heads
 * (part [rows, HD], ml [rows, 2] at row (t * nh + h0 + g) * slots + z). s_acc: ATT_SW x G x HD
 * floats of shared memory, free for it. */
template <int VPL, int G>
__device__ __forceinline__ void att_block_out(const float (*acc)[VPL], const float *m,
                                              const float *l, float (*s_acc)[G][VPL * 32],
                                              float (*s_m)[G], float (*s_l)[G], int t, int nh,
                                              int h0, int z, int slots, float *part, float *ml) {
  constexpr int HD = VPL * 32;
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (lane == 0) {
      s_m[wp][g] = m[g];
      s_l[wp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < VPL; i++) s_acc[wp][g][lane * VPL + i] = acc[g][i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
    int g = idx / HD, i = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATT_SW; w++) M = fmaxf(M, s_m[w][g]);
    float L = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < ATT_SW; w++) {
      if (s_l[w][g] > 0.f) {
        float f = __expf(s_m[w][g] - M);
        L += s_l[w][g] * f;
        o += s_acc[w][g][i] * f;
      }
    }
    size_t r = ((size_t)t * nh + h0 + g) * slots + z;
    part[r * HD + i] = o;
    if (i == 0) {
      ml[2 * r] = M;
      ml[2 * r + 1] = L;
    }
  }
}

template <int VPL, int GB>
__global__ void __launch_bounds__(ATT_SW * 32)
    k_attn_split(bf16 *kp, bf16 *vp, const bf16 *q, const int32_t *seq, const int32_t *pos,
                 const int32_t *page_table, int max_pages, int nh, int nkv, int nsub, float scale,
                 const int32_t *seq_len, int gemm_min, int split, const bf16 *kcur,
                 const bf16 *vcur, const int32_t *sh_start, int slots, float *part, float *ml) {
  /* a decode step (kcur): the metadata, and the first positions' K and V (pages
   * written by earlier steps; position p, from kcur / vcur, excepted), are requested before the
   * wait for the kernel before (which writes q and kcur) */
  const int early = kcur != NULL;
  if (!early) pdl_enter();
  constexpr int HD = VPL * 32, PIECES = HD * 2 * 2 / 16; /* 16-byte pieces of a K + V row */
  constexpr int G = GB;                                  /* the block's q heads */
  __shared__ __align__(16) unsigned char s_raw[att_smem<HD, G>::bytes];
  __shared__ float s_m[ATT_SW][G], s_l[ATT_SW][G];
  int t = blockIdx.x, kvh = blockIdx.y / nsub, sub = blockIdx.y % nsub, z = blockIdx.z;
  int h0 = kvh * nsub * G + sub * G; /* the block's first q head */
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  int p = pos[t], per;
  int s0 = sh_start ? sh_start[t] : 0; /* positions before s0: the shared kernel's */
  int ns = att_nsplit(p + 1 - s0, split, &per);
  if ((gemm_min > 0 && seq_len[seq[t]] >= gemm_min) || z >= ns) { /* the GEMM path's row, */
    if (early) pdl_enter(); /* or no range: every block waits before it exits */
    return;
  }
  int j0 = s0 + z * per, j1 = min(p + 1, j0 + per);
  const int32_t *pt = page_table + (size_t)seq[t] * max_pages;
  bf16(*slot)[2][HD] = (bf16(*)[2][HD])s_raw + (size_t)wp * ATT_STAGES;
  size_t row_w = (size_t)nkv * HD;
  /* kcur: the step's k and v rows have not been written to the pages (a decode step: the
   * kv write is this kernel's); the last range's block writes this head's slice and reads
   * position p from kcur / vcur (the same values), so nothing here reads it back */
  const bf16 *kc = kcur ? kcur + (size_t)t * row_w + (size_t)kvh * HD : NULL;
  const bf16 *vc = kcur ? vcur + (size_t)t * row_w + (size_t)kvh * HD : NULL;
  int nj = j1 - j0 - wp > 0 ? (j1 - j0 - wp + ATT_SW - 1) / ATT_SW : 0; /* this warp's count */
  /* position i of this warp (i < nj) into slot i % ATT_STAGES; one group per position, empty
   * past the end, so the wait below always counts ATT_STAGES - 1 younger groups */
  auto issue = [&](int i) {
    if (i < nj) {
      int j = j0 + wp + i * ATT_SW;
      bf16 *dst = &slot[i % ATT_STAGES][0][0];
      if (kc && j == p) {
        for (int c = lane; c < PIECES; c += 32) {
          int kv = c >= PIECES / 2, e = (c - kv * PIECES / 2) * 8;
          cp_async16(dst + kv * HD + e, (kv ? vc : kc) + e);
        }
      } else {
        int page = pt[j / BACKEND_PAGE_TOKENS];
        size_t off =
            ((size_t)page * BACKEND_PAGE_TOKENS + (size_t)(j % BACKEND_PAGE_TOKENS)) * row_w +
            (size_t)kvh * HD;
        for (int c = lane; c < PIECES; c += 32) {
          int kv = c >= PIECES / 2, e = (c - kv * PIECES / 2) * 8;
          cp_async16(dst + kv * HD + e, (kv ? vp : kp) + off + e);
        }
      }
    }
    cp_async_commit();
  };
  int s = 0; /* positions issued */
  if (early) {
    /* the positions before p's (its index in this warp's list, if the warp holds it) */
    int ip = (p - j0 - wp) % ATT_SW == 0 && p >= j0 + wp ? (p - j0 - wp) / ATT_SW : nj;
    for (; s < ATT_STAGES - 1 && s < ip; s++) issue(s);
    pdl_enter();
  }
  if (kcur && z == ns - 1 && sub == 0) {
    int page = pt[p / BACKEND_PAGE_TOKENS];
    size_t off = ((size_t)page * BACKEND_PAGE_TOKENS + (size_t)(p % BACKEND_PAGE_TOKENS)) * row_w +
                 (size_t)kvh * HD;
    for (int c = threadIdx.x; c < PIECES; c += blockDim.x) {
      int kv = c >= PIECES / 2, e = (c - kv * PIECES / 2) * 8;
      *(uint4 *)((kv ? vp : kp) + off + e) = *(const uint4 *)((kv ? vc : kc) + e);
    }
  }
  float qr[G][VPL], acc[G][VPL], m[G], l[G];
  for (; s < ATT_STAGES - 1; s++) issue(s);
  att_q_init<VPL, G>(q, t, nh, h0, lane, scale, qr, acc, m, l);
  for (int i = 0; i < nj; i++) {
    issue(i + ATT_STAGES - 1);
    cp_async_wait<ATT_STAGES - 1>(); /* position i's pieces (this lane's) have landed */
    __syncwarp();                    /* ... and every lane's */
    float kr[VPL], vr[VPL];
    att_unpack<VPL>(&slot[i % ATT_STAGES][0][lane * VPL], kr);
    att_unpack<VPL>(&slot[i % ATT_STAGES][1][lane * VPL], vr);
    __syncwarp(); /* every lane has read the slot before a later issue refills it */
    att_position<VPL, G>(qr, kr, vr, 1.f, 1.f, acc, m, l);
  }
  cp_async_wait<0>();
  __syncthreads(); /* every warp is done with its slots: the bytes become the accumulators */
  att_block_out<VPL, G>(acc, m, l, (float(*)[G][HD])s_raw, s_m, s_l, t, nh, h0, z, slots, part, ml);
}

/* grid (T, nh), block hd: merges a row's ranges in order. gate (the attention output gate,
 * [T, nh * hd]) or NULL: out = out * sigmoid(gate) with the sigmoid_mul op's expression on the
 * bf16 output (cuda_elem.cu k_ew8), the two ops' bits in one launch. SH: the step has groups
 * sharing a prefix (c->b.sh_on): a row's own ranges start at sh_start[t], and its group's
 * sh_ns[t] shared ranges (k_flash_shared) follow in slots ATT_MAXS .. (slots per (row, head)). */
template <bool SH>
__global__ void k_attn_merge(const float *part, const float *ml, const int32_t *pos,
                             const int32_t *seq, const int32_t *seq_len, int gemm_min, int split,
                             int nh, int hd, const int32_t *sh_start, const int32_t *sh_ns,
                             int slots, const bf16 *gate, bf16 *out) {
  int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  /* the step's metadata, and the gate (written before the attention's first kernel, so done
   * once the split kernel before this one has passed its own wait), before the wait */
  int gemm_row = gemm_min > 0 && seq_len[seq[t]] >= gemm_min;
  int per;
  int ns = att_nsplit(pos[t] + 1 - (SH ? sh_start[t] : 0), split, &per);
  int nsh = SH ? sh_ns[t] : 0;
  size_t oi = ((size_t)t * nh + h) * hd + i;
  float gv = gate && i < hd && !gemm_row ? bf2f(gate[oi]) : 0.f;
  pdl_enter();
  if (gemm_row) return; /* the GEMM path's row */
  size_t r0 = ((size_t)t * nh + h) * slots;
  float M = -INFINITY, L = 0.f, o = 0.f;
  constexpr int NZ = ATT_MAXS + (SH ? CUDA_SH_MAXS : 0);
  /* every range's values requested at once (a loop over ns would wait for each load in turn:
   * ~16 dependent L2 round trips), then the same max and the same sums in the same order */
  float mz[NZ], lz[NZ], pz[NZ];
#pragma unroll
  for (int z = 0; z < NZ; z++) {
    mz[z] = -INFINITY, lz[z] = 0.f, pz[z] = 0.f;
    if (z < ATT_MAXS ? z < ns : z - ATT_MAXS < nsh) {
      mz[z] = ml[2 * (r0 + z)];
      lz[z] = ml[2 * (r0 + z) + 1];
      if (i < hd) pz[z] = part[(r0 + z) * hd + i];
    }
  }
#pragma unroll
  for (int z = 0; z < NZ; z++)
    if (z < ATT_MAXS ? z < ns : z - ATT_MAXS < nsh) M = fmaxf(M, mz[z]);
#pragma unroll
  for (int z = 0; z < NZ; z++)
    if (z < ATT_MAXS ? z < ns : z - ATT_MAXS < nsh) {
      float f = __expf(mz[z] - M);
      L += lz[z] * f;
      o += pz[z] * f;
    }
  if (i < hd) {
    bf16 ob = f2bf(o / L);
    out[oi] = gate ? f2bf(bf2f(ob) * sigmoidf_dev(gv)) : ob;
  }
}

/* The split path's launch arguments. */
struct att_args {
  bf16 *kp, *vp;
  const bf16 *q;
  int nh, nkv;
  float scale;
  int split;               /* positions per range (att_split_of) */
  const bf16 *kcur, *vcur; /* the step's k, v when the split kernel writes them (else NULL) */
  const int32_t *sh_start; /* the rows' shared positions (c->b.sh_start), NULL: none shared */
  int slots;               /* partials per (row, q head): ATT_MAXS (+ CUDA_SH_MAXS shared) */
  float *part, *ml;
};

template <int VPL, int GB>
static void att_launch(cuda_ctx *c, int G, const att_args &a) {
  int nsub = G / GB;
  if (nsub > 1) c->attn_sub_launches++;
  dim3 grid(c->b.n_tokens, a.nkv * nsub, ATT_MAXS);
  k_attn_split<VPL, GB><<<grid, ATT_SW * 32, 0, c->st>>>(
      a.kp, a.vp, a.q, c->b.seq, c->b.pos, c->b.page_table, c->b.max_pages, a.nh, a.nkv, nsub,
      a.scale, c->b.seq_len, att_gemm_min(c, a.nkv, VPL * 32), a.split, a.kcur, a.vcur, a.sh_start,
      a.slots, a.part, a.ml);
}

/* The q heads one split block takes for G q heads per kv head and VPL values per lane: all G
 * when G is 1, 2, 4 or 8 and the accumulators fit (GB * VPL <= 32 words), else the largest of
 * 8, 4, 3, 2 that divides G and fits, else 1 (every G is covered: 27B's 6 take 3, the MoE
 * shapes' 8 at hd 256 take 4, 16 take 8 or 4). */
static int att_heads_per_block(int G, int VPL) {
  static const int gb[] = {8, 4, 3, 2};
  for (int i = 0; i < 4; i++)
    if (G % gb[i] == 0 && gb[i] * VPL <= 32) return gb[i];
  return 1;
}

template <int VPL>
static void att_launch_g(cuda_ctx *c, int G, const att_args &a) {
  switch (att_heads_per_block(G, VPL)) {
    case 1:
      att_launch<VPL, 1>(c, G, a);
      break;
    case 2:
      att_launch<VPL, 2>(c, G, a);
      break;
    case 3:
      att_launch<VPL, 3>(c, G, a);
      break;
    case 4:
      att_launch<VPL, 4>(c, G, a);
      break;
    case 8:
      if constexpr (VPL <= 4) att_launch<VPL, 8>(c, G, a);
      break;
  }
}

/* Positions per range for this step (see ATT_SPLIT_SMALL). */
static int att_split_of(const cuda_ctx *c) {
  if (c->batch_invariant) return ATT_SPLIT;
  return c->b.n_tokens <= ATT_TINY_T    ? ATT_SPLIT_TINY
         : c->b.n_tokens <= ATT_SMALL_T ? ATT_SPLIT_SMALL
                                        : ATT_SPLIT;
}

/* 1 when the split path covers this head shape: hd 32, 64, 128 or 256, any q heads per kv head
 * (att_heads_per_block). */
static int att_split_fits(int nh, int nkv, int hd) {
  int VPL = hd / 32;
  if (nkv <= 0 || nh % nkv || hd % 32) return 0;
  return VPL == 1 || VPL == 2 || VPL == 4 || VPL == 8;
}

/* 1 when the step's shared groups (c->b.sh_on) take the shared-prefix kernel for this head
 * shape: hd 64, 128 or 256 and at most FLASH_BQ q heads per kv head (cuda_attn_flash_shared),
 * the split path covering the shape. The host's plan (set_batch) is made for every shape; a
 * shape outside these reads its rows' positions all by itself (sh_start is then not passed). */
static int att_shared_fits(const cuda_ctx *c, int nh, int nkv, int hd) {
  return c->b.sh_on && (hd == 64 || hd == 128 || hd == 256) && nh / nkv <= 64 &&
         att_split_fits(nh, nkv, hd);
}

/* The split path (att_split_fits), merging with the output gate when gate is not NULL; kcur /
 * vcur: the step's k, v rows for the split kernel to write into the pages (a decode step), or
 * NULL when they are already there. */
static void att_split(cuda_ctx *c, bf16 *kp, bf16 *vp, const bf16 *q, int nh, int nkv, int hd,
                      float scale, const bf16 *kcur, const bf16 *vcur, const bf16 *gate,
                      bf16 *out) {
  int G = nh / nkv;
  /* groups of rows sharing a prefix: their shared positions once per group (cuda_flash.cu),
   * each row's own after them here; the merge takes both (att_shared_fits) */
  int sh = att_shared_fits(c, nh, nkv, hd);
  int slots = ATT_MAXS + (sh ? CUDA_SH_MAXS : 0);
  size_t rows = (size_t)c->b.n_tokens * nh * slots;
  float *part = (float *)cuda_scratch(c, rows * ((size_t)hd + 2) * sizeof(float));
  if (!part) return;
  att_args a = {kp,
                vp,
                q,
                nh,
                nkv,
                scale,
                att_split_of(c),
                kcur,
                vcur,
                sh ? c->b.sh_start : NULL,
                slots,
                part,
                part + rows * hd};
  if (sh &&
      cuda_attn_flash_shared(c, kp, vp, q, nh, nkv, hd, scale, ATT_MAXS, slots, a.part, a.ml)) {
    cuda_fail(c, "attention", "shared-prefix kernel refused a covered shape");
    return;
  }
  switch (hd / 32) {
    case 1:
      att_launch_g<1>(c, G, a);
      break;
    case 2:
      att_launch_g<2>(c, G, a);
      break;
    case 4:
      att_launch_g<4>(c, G, a);
      break;
    case 8:
      att_launch_g<8>(c, G, a);
      break;
  }
  cuda_check_launch(c, "attention (split)");
  dim3 g2(c->b.n_tokens, nh);
  if (sh)
    k_attn_merge<true><<<g2, (hd + 31) / 32 * 32, 0, c->st>>>(
        part, a.ml, c->b.pos, c->b.seq, c->b.seq_len, att_gemm_min(c, nkv, hd), a.split, nh, hd,
        c->b.sh_start, c->b.sh_ns, slots, gate, out);
  else
    k_attn_merge<false><<<g2, (hd + 31) / 32 * 32, 0, c->st>>>(
        part, a.ml, c->b.pos, c->b.seq, c->b.seq_len, att_gemm_min(c, nkv, hd), a.split, nh, hd,
        NULL, NULL, slots, gate, out);
  cuda_check_launch(c, gate ? "attention (merge + output gate)" : "attention (merge)");
}

/* VPL e4m3 bytes of one lane, loaded at once */
template <int VPL>
struct kv8_raw;
template <>
struct kv8_raw<8> {
  typedef uint2 t;
};
template <>
struct kv8_raw<4> {
  typedef uint32_t t;
};
template <>
struct kv8_raw<2> {
  typedef uint16_t t;
};
template <>
struct kv8_raw<1> {
  typedef uint8_t t;
};

template <int VPL>
__device__ __forceinline__ void kv8_unpack(typename kv8_raw<VPL>::t r, float *dst) {
  const uint8_t *b = (const uint8_t *)&r;
#pragma unroll
  for (int i = 0; i < VPL; i++) dst[i] = kv8_f32(b[i]);
}

#define KV8_DEPTH 4 /* positions per warp whose loads are in flight together */

/* k_attn_split over FP8 pages: the same grid, ranges, partials and merge (no shared-prefix
 * kernel: sh_start is never passed). Each lane loads its VPL bytes of a position's K and V rows
 * and the two scales straight from the pages, KV8_DEPTH of the warp's positions at a time (the
 * pages are half the bf16 bytes: registers hold the loads in flight, no cp.async slots); a
 * score is ks * (q . e4m3(k)) and a V row adds (e * vs) * e4m3(v), the scales taken out of the
 * sums. */
template <int VPL, int GB>
__global__ void __launch_bounds__(ATT_SW * 32)
    k_attn_split8(const uint8_t *kp, const uint8_t *vp, const bf16 *q, const int32_t *seq,
                  const int32_t *pos, const int32_t *page_table, int max_pages, int nh, int nkv,
                  int nsub, float scale, const int32_t *seq_len, int gemm_min, int split, int slots,
                  float *part, float *ml) {
  pdl_enter();
  constexpr int HD = VPL * 32, G = GB;
  typedef typename kv8_raw<VPL>::t raw;
  __shared__ __align__(16) float s_acc[ATT_SW][G][HD];
  __shared__ float s_m[ATT_SW][G], s_l[ATT_SW][G];
  int t = blockIdx.x, kvh = blockIdx.y / nsub, sub = blockIdx.y % nsub, z = blockIdx.z;
  int h0 = kvh * nsub * G + sub * G; /* the block's first q head */
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  int p = pos[t], per;
  int ns = att_nsplit(p + 1, split, &per);
  if ((gemm_min > 0 && seq_len[seq[t]] >= gemm_min) || z >= ns) return;
  int j0 = z * per, j1 = min(p + 1, j0 + per);
  const int32_t *pt = page_table + (size_t)seq[t] * max_pages;
  float qr[G][VPL], acc[G][VPL], m[G], l[G];
  att_q_init<VPL, G>(q, t, nh, h0, lane, scale, qr, acc, m, l);
  /* KV8_DEPTH of the warp's positions loaded at once (their page ids, bytes and scales all in
   * flight), then used in position order */
  for (int j00 = j0 + wp; j00 < j1; j00 += ATT_SW * KV8_DEPTH) {
    raw kb[KV8_DEPTH], vb[KV8_DEPTH];
    float ks[KV8_DEPTH], vs[KV8_DEPTH];
#pragma unroll
    for (int u = 0; u < KV8_DEPTH; u++) {
      int j = min(j00 + u * ATT_SW, j1 - 1); /* past the range: a valid row, not used */
      int page = pt[j / BACKEND_PAGE_TOKENS];
      float *ksp, *vsp;
      const uint8_t *kr = kv8_at((uint8_t *)kp, page, j % BACKEND_PAGE_TOKENS, kvh, nkv, HD, &ksp);
      const uint8_t *vr = kv8_at((uint8_t *)vp, page, j % BACKEND_PAGE_TOKENS, kvh, nkv, HD, &vsp);
      kb[u] = *(const raw *)(kr + lane * VPL);
      vb[u] = *(const raw *)(vr + lane * VPL);
      ks[u] = *ksp;
      vs[u] = *vsp;
    }
#pragma unroll
    for (int u = 0; u < KV8_DEPTH; u++) {
      if (j00 + u * ATT_SW >= j1) break;
      float kr[VPL], vr[VPL];
      kv8_unpack<VPL>(kb[u], kr);
      kv8_unpack<VPL>(vb[u], vr);
      att_position<VPL, G>(qr, kr, vr, ks[u], vs[u], acc, m, l);
    }
  }
  att_block_out<VPL, G>(acc, m, l, s_acc, s_m, s_l, t, nh, h0, z, slots, part, ml);
}

template <int VPL, int GB>
static void att8_launch(cuda_ctx *c, const uint8_t *kp, const uint8_t *vp, const bf16 *q, int nh,
                        int nkv, float scale, int split, float *part, float *ml) {
  int nsub = nh / nkv / GB;
  dim3 grid(c->b.n_tokens, nkv * nsub, ATT_MAXS);
  k_attn_split8<VPL, GB><<<grid, ATT_SW * 32, 0, c->st>>>(
      kp, vp, q, c->b.seq, c->b.pos, c->b.page_table, c->b.max_pages, nh, nkv, nsub, scale,
      c->b.seq_len, att_gemm_min(c, nkv, VPL * 32), split, ATT_MAXS, part, ml);
}

template <int VPL>
static void att8_launch_g(cuda_ctx *c, const uint8_t *kp, const uint8_t *vp, const bf16 *q, int nh,
                          int nkv, float scale, int split, float *part, float *ml) {
  switch (att_heads_per_block(nh / nkv, VPL)) {
    case 1:
      att8_launch<VPL, 1>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
    case 2:
      att8_launch<VPL, 2>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
    case 3:
      att8_launch<VPL, 3>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
    case 4:
      att8_launch<VPL, 4>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
    case 8:
      if constexpr (VPL <= 4) att8_launch<VPL, 8>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
  }
}

/* The split path over FP8 pages (att_split_fits shapes), the merge applying gate unless NULL. */
static void att_split8(cuda_ctx *c, const uint8_t *kp, const uint8_t *vp, const bf16 *q, int nh,
                       int nkv, int hd, float scale, const bf16 *gate, bf16 *out) {
  size_t rows = (size_t)c->b.n_tokens * nh * ATT_MAXS;
  float *part = (float *)cuda_scratch(c, rows * ((size_t)hd + 2) * sizeof(float));
  if (!part) return;
  float *ml = part + rows * hd;
  int split = att_split_of(c);
  switch (hd / 32) {
    case 1:
      att8_launch_g<1>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
    case 2:
      att8_launch_g<2>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
    case 4:
      att8_launch_g<4>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
    case 8:
      att8_launch_g<8>(c, kp, vp, q, nh, nkv, scale, split, part, ml);
      break;
  }
  cuda_check_launch(c, "attention (fp8 split)");
  dim3 g2(c->b.n_tokens, nh);
  k_attn_merge<false><<<g2, (hd + 31) / 32 * 32, 0, c->st>>>(
      part, ml, c->b.pos, c->b.seq, c->b.seq_len, att_gemm_min(c, nkv, hd), split, nh, hd, NULL,
      NULL, ATT_MAXS, gate, out);
  cuda_check_launch(c, gate ? "attention (fp8 merge + output gate)" : "attention (fp8 merge)");
}

/* Attention over FP8 pages ("FP8 K/V" above): the rows' k, v quantized into the pages, the
 * long pieces by the fused kernel (cuda_flash.cu k_flash<HD, true>; the GEMM path for the head
 * sizes it does not cover), the other rows on the FP8 split path (k_attention8 for shapes
 * it does not cover); the output gate (NULL: none) in the merge when no row took the GEMM
 * path, else over every row after it. */
static void att_fp8(cuda_ctx *c, backend *be, backend_buf k_pool, backend_buf v_pool, backend_buf q,
                    backend_buf k, backend_buf v, int nh, int nkv, int hd, float scale,
                    backend_buf gate, backend_buf out) {
  int T = c->b.n_tokens;
  const uint8_t *kp = (const uint8_t *)k_pool, *vp = (const uint8_t *)v_pool;
  k_kv_write8<<<cuda_blocks((size_t)T * nkv * 2 * 32, 256), 256, 0, c->st>>>(
      (const bf16 *)k, (const bf16 *)v, c->b.seq, c->b.pos, c->b.page_table, c->b.max_pages, T, nkv,
      hd, (uint8_t *)k_pool, (uint8_t *)v_pool);
  cuda_check_launch(c, "attention (fp8 kv write)");
  int gmin = att_gemm_min(c, nkv, hd), took = 0;
  if (gmin > 0 && c->attn_flash) {
    took = cuda_attn_flash(c, kp, vp, (const bf16 *)q, nh, nkv, hd, scale, (bf16 *)out);
    int want = 0; /* the rows the split path skips */
    for (int i = 0; i < c->hb.n_seqs; i++)
      if (c->hb.seq_len[i] >= gmin) want += c->hb.seq_len[i];
    if (took && took != want) cuda_fail(c, "attention", "flash path took other rows");
  }
  if (gmin > 0 && !took)
    took = att_gemm(c, kp, vp, (const bf16 *)q, nh, nkv, hd, scale, (bf16 *)out);
  if (took < T) {
    if (att_split_fits(nh, nkv, hd)) {
      att_split8(c, kp, vp, (const bf16 *)q, nh, nkv, hd, scale, took ? NULL : (const bf16 *)gate,
                 (bf16 *)out);
      if (!took) return;
    } else {
      dim3 grid(T, nh);
      k_attention8<<<grid, ATT_WARPS * 32, ATT_WARPS * hd * sizeof(float), c->st>>>(
          kp, vp, (const bf16 *)q, c->b.seq, c->b.pos, c->b.page_table, c->b.max_pages, nh, nkv, hd,
          scale, c->b.seq_len, gmin, (bf16 *)out);
      cuda_check_launch(c, "attention (fp8)");
    }
  }
  if (gate) cuda_elem_sigmoid_mul(be, out, gate, (size_t)T * nh * hd);
}

extern "C" void cuda_attn_attention(backend *be, backend_buf k_pool, backend_buf v_pool,
                                    backend_buf q, backend_buf k, backend_buf v, int nh, int nkv,
                                    int hd, float scale, backend_buf out) {
  cuda_attn_attention_gated(be, k_pool, v_pool, q, k, v, nh, nkv, hd, scale, NULL, out);
}

extern "C" void cuda_attn_attention_gated(backend *be, backend_buf k_pool, backend_buf v_pool,
                                          backend_buf q, backend_buf k, backend_buf v, int nh,
                                          int nkv, int hd, float scale, backend_buf gate,
                                          backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  int T = c->b.n_tokens;
  if (T <= 0) return;
  if (hd > 32 * ATT_MAXR || nkv <= 0 || nh % nkv) {
    cuda_fail(c, "attention", "head dim over 256 or nh not a multiple of nkv");
    return;
  }
  int w = nkv * hd;
  if ((size_t)T * w >= (1ull << 32)) {
    cuda_fail(c, "attention", "step too large (T * nkv * hd >= 2^32)");
    return;
  }
  if (c->kv_fp8) {
    att_fp8(c, be, k_pool, v_pool, q, k, v, nh, nkv, hd, scale, gate, out);
    return;
  }
  int use_split = att_split_fits(nh, nkv, hd);
  /* every piece one row (a decode step; no piece reaches ATT_GEMM_MIN): the split kernel
   * writes the rows' k, v itself, one launch fewer per attention layer */
  static_assert(ATT_GEMM_MIN > 1, "a one-row piece never takes the GEMM path");
  int own_kv = use_split && c->b.max_len == 1 &&
               !(((uintptr_t)k | (uintptr_t)v | (uintptr_t)k_pool | (uintptr_t)v_pool) & 15);
  if (!own_kv) {
    k_kv_write<<<cuda_blocks((size_t)T * w, 256), 256, 0, c->st>>>(
        (const bf16 *)k, (const bf16 *)v, c->b.seq, c->b.pos, c->b.page_table, c->b.max_pages, T, w,
        (bf16 *)k_pool, (bf16 *)v_pool);
    cuda_check_launch(c, "attention (kv write)");
  }
  int gmin = att_gemm_min(c, nkv, hd);
  if (gmin >
      0) { /* the long pieces: the fused kernel, else (shapes it does not cover) the GEMM path */
    int took = 0;
    if (c->attn_flash) {
      took = cuda_attn_flash(c, (const bf16 *)k_pool, (const bf16 *)v_pool, (const bf16 *)q, nh,
                             nkv, hd, scale, (bf16 *)out);
      int want = 0; /* the rows the split path skips */
      for (int i = 0; i < c->hb.n_seqs; i++)
        if (c->hb.seq_len[i] >= gmin) want += c->hb.seq_len[i];
      if (took && took != want) cuda_fail(c, "attention", "flash path took other rows");
    }
    if (!took)
      took = att_gemm(c, (const bf16 *)k_pool, (const bf16 *)v_pool, (const bf16 *)q, nh, nkv, hd,
                      scale, (bf16 *)out);
    if (took == T) { /* every row was a long piece's */
      if (gate) cuda_elem_sigmoid_mul(be, out, gate, (size_t)T * nh * hd);
      return;
    }
  }
  if (use_split) {
    att_split(c, (bf16 *)k_pool, (bf16 *)v_pool, (const bf16 *)q, nh, nkv, hd, scale,
              own_kv ? (const bf16 *)k : NULL, own_kv ? (const bf16 *)v : NULL, (const bf16 *)gate,
              (bf16 *)out);
    return;
  }
  dim3 grid(T, nh);
  k_attention<<<grid, ATT_WARPS * 32, ATT_WARPS * hd * sizeof(float), c->st>>>(
      (const bf16 *)k_pool, (const bf16 *)v_pool, (const bf16 *)q, c->b.seq, c->b.pos,
      c->b.page_table, c->b.max_pages, nh, nkv, hd, scale, c->b.seq_len, att_gemm_min(c, nkv, hd),
      (bf16 *)out);
  cuda_check_launch(c, "attention");
  if (gate) cuda_elem_sigmoid_mul(be, out, gate, (size_t)T * nh * hd);
}
