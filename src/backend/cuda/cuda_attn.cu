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
 * one-block-per-(row, q head) kernel below. By default the GEMM path's pieces go through the
 * fused flash kernel of cuda_flash.cu instead, where it covers the shape (DS_ATTN_FLASH=0:
 * the GEMM path). */
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
#define ATT_GEMM_MIN 32              /* rows of a piece for the GEMM path (= FLASH_MIN) */
#define ATT_GEMM_BUDGET (256u << 20) /* bytes of S + P per block */

/* The GEMM path's piece length threshold for this shape; 0: the path is off. */
static int att_gemm_min(const cuda_ctx *c, int nkv, int hd) {
  return (c->legacy || c->attn_gemm_off || (nkv * hd) % 8) ? 0 : ATT_GEMM_MIN;
}

/* Query rows per block for a piece of `len` rows and context ctx (a function of these and
 * the knob only). DS_ATTN_GEMM_ROWS caps it (tests: several blocks per piece). */
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

/* The GEMM path over the step's long pieces; returns how many rows it took (0 on failure:
 * recorded, the caller's split path then covers nothing new -- the step fails at sync). */
static int att_gemm(cuda_ctx *c, const bf16 *kp, const bf16 *vp, const bf16 *q, int nh, int nkv,
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
    k_kv_gather<<<cuda_blocks((size_t)ctx * w / 8, 256), 256, 0, c->st>>>(
        kp, vp, c->b.page_table + (size_t)i * c->b.max_pages, ctx, w, kc, vc);
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

#ifndef ATT_SPLIT
#define ATT_SPLIT 128 /* positions per range, before the cap on ranges */
#endif
/* Steps of at most ATT_SMALL_T rows (default mode) cut ranges of ATT_SPLIT_SMALL positions:
 * a one-sequence step has too few blocks to keep the SMs busy at 128 (64: decode 1 +1.3 %,
 * 8 / 32 +0.5 / +0.9 %, 64 / 128 -2.6 / -3.3 % when used for every step, bench/NOTES.md twelfth
 * session). A row's ranges then depend on its step's row count as well as its position, as a
 * row's GEMM bits do (cuBLAS); under --batch-invariant every step uses ATT_SPLIT. */
#ifndef ATT_SPLIT_SMALL
#define ATT_SPLIT_SMALL 64
#endif
#define ATT_SMALL_T 8
/* ... and steps of at most ATT_TINY_T rows ranges of ATT_SPLIT_TINY (up to the cap on ranges:
 * decode 1 +0.3 %, 4 of 4 paired rounds; 32 for every step of <= 8 rows cost decode 8 1.0 %,
 * bench/NOTES.md eighteenth session) */
#ifndef ATT_SPLIT_TINY
#define ATT_SPLIT_TINY 32
#endif
#define ATT_TINY_T 2
#ifndef ATT_MAXS
#define ATT_MAXS 16 /* ranges per row at most */
#endif
#ifndef ATT_MERGE_UNROLL
#define ATT_MERGE_UNROLL 1 /* k_attn_merge's loads all at once (0: in a loop, for A/B builds) */
#endif
#define ATT_SW 8   /* warps per block */
#define ATT_MAXG 8 /* q heads per kv head */
#ifndef ATT_STAGES
#define ATT_STAGES 4 /* positions per warp in flight (cp.async into shared memory) */
#endif

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
 * two: bench/NOTES.md). Each lane then reads its hd/32 values of the slot. */
template <int VPL, int GB>
__global__ void __launch_bounds__(ATT_SW * 32)
    k_attn_split(bf16 *kp, bf16 *vp, const bf16 *q, const int32_t *seq, const int32_t *pos,
                 const int32_t *page_table, int max_pages, int nh, int nkv, int nsub, float scale,
                 const int32_t *seq_len, int gemm_min, int split, const bf16 *kcur,
                 const bf16 *vcur, const int32_t *sh_start, int slots, float *part, float *ml) {
  /* SMALL_EARLY, a decode step (kcur): the metadata, and the first positions' K and V (pages
   * written by earlier steps; position p, from kcur / vcur, excepted), are requested before the
   * wait for the kernel before (which writes q and kcur) */
  const int early = SMALL_EARLY && kcur != NULL;
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
  for (int i = 0; i < nj; i++) {
    issue(i + ATT_STAGES - 1);
    cp_async_wait<ATT_STAGES - 1>(); /* position i's pieces (this lane's) have landed */
    __syncwarp();                    /* ... and every lane's */
    float kr[VPL], vr[VPL];
    att_unpack<VPL>(&slot[i % ATT_STAGES][0][lane * VPL], kr);
    att_unpack<VPL>(&slot[i % ATT_STAGES][1][lane * VPL], vr);
    __syncwarp(); /* every lane has read the slot before a later issue refills it */
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
      float sc = d[g];
      float mn = fmaxf(m[g], sc);
      float cr = __expf(m[g] - mn), e = __expf(sc - mn);
      l[g] = l[g] * cr + e;
#pragma unroll
      for (int k = 0; k < VPL; k++) acc[g][k] = acc[g][k] * cr + e * vr[k];
      m[g] = mn;
    }
  }
  cp_async_wait<0>();
  __syncthreads(); /* every warp is done with its slots: the bytes become the accumulators */
  float(*s_acc)[G][HD] = (float(*)[G][HD])s_raw;
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
#if SMALL_EARLY
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
#else
  pdl_enter();
  if (gemm_min > 0 && seq_len[seq[t]] >= gemm_min) return; /* the GEMM path's row */
  int per;
  int ns = att_nsplit(pos[t] + 1 - (SH ? sh_start[t] : 0), split, &per);
  int nsh = SH ? sh_ns[t] : 0;
#endif
  size_t r0 = ((size_t)t * nh + h) * slots;
  float M = -INFINITY, L = 0.f, o = 0.f;
  constexpr int NZ = ATT_MAXS + (SH ? CUDA_SH_MAXS : 0);
#if ATT_MERGE_UNROLL
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
#else
  for (int z = 0; z < NZ; z++)
    if (z < ATT_MAXS ? z < ns : z - ATT_MAXS < nsh) M = fmaxf(M, ml[2 * (r0 + z)]);
  for (int z = 0; z < NZ; z++) {
    if (!(z < ATT_MAXS ? z < ns : z - ATT_MAXS < nsh)) continue;
    float f = __expf(ml[2 * (r0 + z)] - M);
    L += ml[2 * (r0 + z) + 1] * f;
    if (i < hd) o += part[(r0 + z) * hd + i] * f;
  }
#endif
  if (i < hd) {
#if SMALL_EARLY
    bf16 ob = f2bf(o / L);
    out[oi] = gate ? f2bf(bf2f(ob) * sigmoidf_dev(gv)) : ob;
#else
    size_t oi = ((size_t)t * nh + h) * hd + i;
    bf16 ob = f2bf(o / L);
    out[oi] = gate ? f2bf(bf2f(ob) * sigmoidf_dev(bf2f(gate[oi]))) : ob;
#endif
  }
}

/* ---- the split kernel on tensor cores (k_attn_split_tc) ----
 *
 * The same blocks, ranges and partials as k_attn_split, for steps of many rows (att_tc_takes):
 * block (t, kv head x sub-group, z) with ATT_TC_W warps; a warp takes 16-position slabs of the
 * range (slab w, w + ATT_TC_W, ...), their K and V rows arriving by cp.async into the warp's
 * ATT_TC_STAGES slab buffers in shared memory. Per slab, with the block's GB <= 8 q heads as the
 * 8 columns of the products (heads past GB: zero queries, never written):
 *   S^T [16 positions x 8 heads] = K Q^T        (m16n8k16: A = K rows by ldmatrix, B = Q)
 *   x = S^T scale log2(e), -inf past the range; per head (column) m' = max(m, max x),
 *   P = 2^(x - m'), l = l 2^(m - m') + sum P, O^T = O^T 2^(m - m') + V^T P
 *                                               (A = V^T by ldmatrix.trans, B = P through
 *                                                movmatrix.trans of its bf16 C fragments)
 * so a position costs a few tensor-core instructions instead of k_attn_split's lane products
 * and shuffle reductions (which bound that kernel at ~2 TB/s on long rows of many-row steps).
 * P is rounded to bf16 for its product (as in cuda_flash.cu). The warps' (m, l, O) merge in
 * warp order through shared memory; the block writes slot z of part / ml in k_attn_split's
 * units (m: natural log of scale q.k), and k_attn_merge reads them unchanged. */
#ifndef ATT_TC_STAGES
#define ATT_TC_STAGES 3 /* slabs per warp in flight or in use */
#endif
#define ATT_TC_W 4   /* warps per block */
#define ATT_TC_PAD 8 /* bf16 of padding per shared row: conflict-free ldmatrix */

template <int HD>
struct att_tc_shape {
  static constexpr int ROW = HD + ATT_TC_PAD;              /* bf16 per shared row */
  static constexpr size_t SLAB = (size_t)2 * 16 * ROW * 2; /* bytes of a K + V slab */
  static constexpr size_t MERGE = (size_t)ATT_TC_W * 8 * (HD + 2) * sizeof(float);
  static constexpr size_t PIPE = (size_t)ATT_TC_W * ATT_TC_STAGES * SLAB;
  static constexpr size_t SMEM = PIPE > MERGE ? PIPE : MERGE;
};

__device__ __forceinline__ void att_ldsm4(uint32_t *r, const bf16 *p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void att_ldsm4_t(uint32_t *r, const bf16 *p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
/* the transpose of an 8x8 bf16 matrix held one row pair per lane (row g, cols 2t..2t+1) */
__device__ __forceinline__ uint32_t att_movt(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ uint32_t att_pack(float lo, float hi) {
  __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *(uint32_t *)&b;
}

/* grid (T, nkv * nsub, ATT_MAXS), block ATT_TC_W * 32, dynamic shared att_tc_shape<HD>::SMEM;
 * GB = G / nsub <= 8 q heads per block; the other arguments as k_attn_split's (sl2: scale *
 * log2(e)). */
template <int HD>
__global__ void __launch_bounds__(ATT_TC_W * 32)
    k_attn_split_tc(bf16 *kp, bf16 *vp, const bf16 *q, const int32_t *seq, const int32_t *pos,
                    const int32_t *page_table, int max_pages, int nh, int nkv, int nsub, int GB,
                    float sl2, const int32_t *seq_len, int gemm_min, int split, const bf16 *kcur,
                    const bf16 *vcur, const int32_t *sh_start, int slots, float *part, float *ml) {
  pdl_enter();
  typedef att_tc_shape<HD> S_;
  constexpr int ROW = S_::ROW, KS = HD / 16, PIECES = HD / 8; /* 16-byte pieces of a row */
  extern __shared__ __align__(16) unsigned char tc_smem[];
  int t = blockIdx.x, kvh = blockIdx.y / nsub, sub = blockIdx.y % nsub, z = blockIdx.z;
  if (gemm_min > 0 && seq_len[seq[t]] >= gemm_min) return; /* the GEMM path's row */
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  int h0 = kvh * nsub * GB + sub * GB; /* the block's first q head */
  int p = pos[t], per;
  int s0 = sh_start ? sh_start[t] : 0;
  int ns = att_nsplit(p + 1 - s0, split, &per);
  if (z >= ns) return;
  int j0 = s0 + z * per, j1 = min(p + 1, j0 + per);
  const int32_t *pt = page_table + (size_t)seq[t] * max_pages;
  size_t row_w = (size_t)nkv * HD;
  const bf16 *kc = kcur ? kcur + (size_t)t * row_w + (size_t)kvh * HD : NULL;
  const bf16 *vc = kcur ? vcur + (size_t)t * row_w + (size_t)kvh * HD : NULL;
  if (kcur && z == ns - 1 && sub == 0) { /* the step's k, v into the pages (k_attn_split's) */
    int page = pt[p / BACKEND_PAGE_TOKENS];
    size_t off = ((size_t)page * BACKEND_PAGE_TOKENS + (size_t)(p % BACKEND_PAGE_TOKENS)) * row_w +
                 (size_t)kvh * HD;
    for (int c = threadIdx.x; c < 2 * PIECES; c += blockDim.x) {
      int kv = c >= PIECES, e = (c - kv * PIECES) * 8;
      *(uint4 *)((kv ? vp : kp) + off + e) = *(const uint4 *)((kv ? vc : kc) + e);
    }
  }
  /* the warp's slabs: slab i of the warp starts at position j0 + 16 (wp + i ATT_TC_W) */
  int nslab = (j1 - j0 + 15) / 16;
  int nj = nslab > wp ? (nslab - wp + ATT_TC_W - 1) / ATT_TC_W : 0;
  bf16 *buf = (bf16 *)tc_smem + (size_t)wp * ATT_TC_STAGES * 2 * 16 * ROW;
  auto issue = [&](int i) {
    if (i < nj) {
      int jb = j0 + 16 * (wp + i * ATT_TC_W);
      bf16 *dk = buf + (size_t)(i % ATT_TC_STAGES) * 2 * 16 * ROW, *dv = dk + 16 * ROW;
      for (int c = lane; c < 16 * PIECES; c += 32) {
        int r = c / PIECES, e = (c % PIECES) * 8, j = jb + r;
        bf16 *a = dk + r * ROW + e, *b = dv + r * ROW + e;
        if (j >= j1) {
          *(uint4 *)a = make_uint4(0u, 0u, 0u, 0u);
          *(uint4 *)b = make_uint4(0u, 0u, 0u, 0u);
        } else if (kc && j == p) {
          cp_async16(a, kc + e);
          cp_async16(b, vc + e);
        } else {
          size_t off = ((size_t)pt[j / BACKEND_PAGE_TOKENS] * BACKEND_PAGE_TOKENS +
                        (size_t)(j % BACKEND_PAGE_TOKENS)) *
                           row_w +
                       (size_t)kvh * HD + e;
          cp_async16(a, kp + off);
          cp_async16(b, vp + off);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < ATT_TC_STAGES - 1; s++) issue(s);
  /* Q^T as B fragments: b0 = Q[head g][16k + 2t..], b1 = Q[g][16k + 8 + 2t..] */
  uint32_t qb[KS][2];
  {
    bool live = g < GB;
    const bf16 *qr = q + ((size_t)t * nh + h0 + (live ? g : 0)) * HD + 2 * t4;
#pragma unroll
    for (int k = 0; k < KS; k++) {
      qb[k][0] = live ? *(const uint32_t *)(qr + 16 * k) : 0u;
      qb[k][1] = live ? *(const uint32_t *)(qr + 16 * k + 8) : 0u;
    }
  }
  /* O^T accumulators: o[m] = rows hd 16m + g (0, 1) and + 8 (2, 3), heads 2t, 2t + 1 */
  float o[KS][4];
#pragma unroll
  for (int m = 0; m < KS; m++) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f; /* heads 2t, 2t + 1 (base 2) */
  int mi = lane >> 3, mr = lane & 7;
  for (int i = 0; i < nj; i++) {
    issue(i + ATT_TC_STAGES - 1);
    cp_async_wait<ATT_TC_STAGES - 1>();
    __syncwarp();
    const bf16 *Ks = buf + (size_t)(i % ATT_TC_STAGES) * 2 * 16 * ROW, *Vs = Ks + 16 * ROW;
    int jb = j0 + 16 * (wp + i * ATT_TC_W);
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < KS; k++) {
      uint32_t a[4]; /* K rows: matrices (pos 0-7 | 8-15) x (cols 16k | 16k + 8) */
      att_ldsm4(a, Ks + ((mi & 1) * 8 + mr) * ROW + 16 * k + (mi >> 1) * 8);
      mma_bf16(s, a, qb[k][0], qb[k][1]);
    }
    /* s: [pos g][head 2t], [g][2t + 1], [g + 8][2t], [g + 8][2t + 1] */
    bool va = jb + g < j1, vb = jb + g + 8 < j1;
    float x0 = va ? s[0] * sl2 : -INFINITY, x1 = va ? s[1] * sl2 : -INFINITY;
    float x2 = vb ? s[2] * sl2 : -INFINITY, x3 = vb ? s[3] * sl2 : -INFINITY;
    float c0 = fmaxf(x0, x2), c1 = fmaxf(x1, x3);
#pragma unroll
    for (int d = 4; d < 32; d <<= 1) {
      c0 = fmaxf(c0, __shfl_xor_sync(0xffffffffu, c0, d));
      c1 = fmaxf(c1, __shfl_xor_sync(0xffffffffu, c1, d));
    }
    float n0 = fmaxf(m0, c0), n1 = fmaxf(m1, c1);   /* slab 0 of a warp has position jb real */
    float r0 = exp2f(m0 - n0), r1 = exp2f(m1 - n1); /* 0 while m = -inf */
    m0 = n0;
    m1 = n1;
    float e0 = exp2f(x0 - n0), e1 = exp2f(x1 - n1), e2 = exp2f(x2 - n0), e3 = exp2f(x3 - n1);
    l0 = l0 * r0 + e0 + e2;
    l1 = l1 * r1 + e1 + e3;
#pragma unroll
    for (int m = 0; m < KS; m++) {
      o[m][0] *= r0;
      o[m][1] *= r1;
      o[m][2] *= r0;
      o[m][3] *= r1;
    }
    /* P [pos x head] as B fragments: the transposes of its two 8x8 halves */
    uint32_t pb0 = att_movt(att_pack(e0, e1)), pb1 = att_movt(att_pack(e2, e3));
#pragma unroll
    for (int m = 0; m < KS; m++) {
      uint32_t a[4]; /* V^T: matrices (hd 16m | 16m + 8) x (pos 0-7 | 8-15), transposed */
      att_ldsm4_t(a, Vs + ((mi >> 1) * 8 + mr) * ROW + 16 * m + (mi & 1) * 8);
      mma_bf16(o[m], a, pb0, pb1);
    }
    __syncwarp(); /* every lane has read the slab before a later issue refills it */
  }
  cp_async_wait<0>();
  /* each head's sum over the warp's positions: lanes of one t */
#pragma unroll
  for (int d = 4; d < 32; d <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, d);
    l1 += __shfl_xor_sync(0xffffffffu, l1, d);
  }
  __syncthreads();                               /* the slabs' bytes become the merge's */
  float *s_o = (float *)tc_smem;                 /* [ATT_TC_W][8][HD] */
  float *s_ml = s_o + (size_t)ATT_TC_W * 8 * HD; /* [ATT_TC_W][8][2] */
  float *wo = s_o + (size_t)wp * 8 * HD;
#pragma unroll
  for (int m = 0; m < KS; m++) {
    wo[(2 * t4) * HD + 16 * m + g] = o[m][0];
    wo[(2 * t4 + 1) * HD + 16 * m + g] = o[m][1];
    wo[(2 * t4) * HD + 16 * m + g + 8] = o[m][2];
    wo[(2 * t4 + 1) * HD + 16 * m + g + 8] = o[m][3];
  }
  if (g == 0) {
    float *w = s_ml + (size_t)wp * 16;
    w[4 * t4] = m0;
    w[4 * t4 + 1] = l0;
    w[4 * t4 + 2] = m1;
    w[4 * t4 + 3] = l1;
  }
  __syncthreads();
  const float ln2 = 0.6931471805599453f;
  for (int idx = threadIdx.x; idx < GB * HD; idx += blockDim.x) {
    int hh = idx / HD, e = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATT_TC_W; w++) M = fmaxf(M, s_ml[w * 16 + 2 * hh]);
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < ATT_TC_W; w++) {
      float lw = s_ml[w * 16 + 2 * hh + 1];
      if (lw > 0.f) {
        float f = exp2f(s_ml[w * 16 + 2 * hh] - M);
        L += lw * f;
        acc += s_o[((size_t)w * 8 + hh) * HD + e] * f;
      }
    }
    size_t r = ((size_t)t * nh + h0 + hh) * slots + z;
    part[r * HD + e] = acc;
    if (e == 0) {
      ml[2 * r] = M * ln2;
      ml[2 * r + 1] = L;
    }
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

/* 1 when the split path's ranges go to the tensor-core kernel in this step: hd 64, 128 or 256,
 * at least attn_tc_min_t rows (DS_ATTN_TC_MIN_T; fewer rows have few blocks, where the lane
 * kernel's finer ranges win), not under --batch-invariant (whose rows' results must not depend
 * on the step's row count) and DS_ATTN_TC=1 (off by default: slower than the lane kernel at
 * 8-128 rows on the H200, bench/NOTES.md twenty-fourth session). */
static int att_tc_takes(const cuda_ctx *c, int hd) {
  return c->attn_tc && !c->batch_invariant && (hd == 64 || hd == 128 || hd == 256) &&
         c->b.n_tokens >= c->attn_tc_min_t;
}

/* The tensor-core kernel's q heads per block: G when G <= 8 (its products' 8 columns), else
 * the largest divisor of G up to 8. */
static int att_tc_heads_per_block(int G) {
  for (int gb = 8; gb > 1; gb--)
    if (G % gb == 0 && gb <= G) return gb;
  return 1;
}

template <int HD>
static void att_tc_launch(cuda_ctx *c, int G, const att_args &a) {
  typedef att_tc_shape<HD> S_;
  int gb = G <= 8 ? G : att_tc_heads_per_block(G), nsub = G / gb;
  cudaFuncSetAttribute(k_attn_split_tc<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       (int)S_::SMEM);
  c->attn_tc_launches++;
  dim3 grid(c->b.n_tokens, a.nkv * nsub, ATT_MAXS);
  k_attn_split_tc<HD><<<grid, ATT_TC_W * 32, S_::SMEM, c->st>>>(
      a.kp, a.vp, a.q, c->b.seq, c->b.pos, c->b.page_table, c->b.max_pages, a.nh, a.nkv, nsub, gb,
      a.scale * 1.4426950408889634f, c->b.seq_len, att_gemm_min(c, a.nkv, HD), a.split, a.kcur,
      a.vcur, a.sh_start, a.slots, a.part, a.ml);
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
 * (att_heads_per_block; with DS_ATTN_SUBGROUPS=0 only 1, 2, 4 or 8 that one block takes). */
static int att_split_fits(const cuda_ctx *c, int nh, int nkv, int hd) {
  int VPL = hd / 32;
  if (c->legacy || nkv <= 0 || nh % nkv || hd % 32) return 0;
  if (!(VPL == 1 || VPL == 2 || VPL == 4 || VPL == 8)) return 0;
  int G = nh / nkv; /* DS_ATTN_SUBGROUPS=0: the shapes the path took before sub-groups */
  return c->attn_subgroups || ((G == 1 || G == 2 || G == 4 || G == 8) && G * VPL <= 32);
}

/* 1 when the step's shared groups (c->b.sh_on) take the shared-prefix kernel for this head
 * shape: hd 64, 128 or 256 and at most FLASH_BQ q heads per kv head (cuda_attn_flash_shared),
 * the split path covering the shape. The host's plan (set_batch) is made for every shape; a
 * shape outside these reads its rows' positions all by itself (sh_start is then not passed). */
static int att_shared_fits(const cuda_ctx *c, int nh, int nkv, int hd) {
  return c->b.sh_on && (hd == 64 || hd == 128 || hd == 256) && nh / nkv <= 64 &&
         att_split_fits(c, nh, nkv, hd);
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
  if (att_tc_takes(c, hd)) {
    switch (hd) {
      case 64:
        att_tc_launch<64>(c, G, a);
        break;
      case 128:
        att_tc_launch<128>(c, G, a);
        break;
      case 256:
        att_tc_launch<256>(c, G, a);
        break;
    }
  } else {
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
  int use_split = att_split_fits(c, nh, nkv, hd);
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
  if (gmin > 0) { /* the long pieces: fused kernel (unless DS_ATTN_FLASH=0) or GEMM path */
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
