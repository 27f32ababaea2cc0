/* cuda_flash — fused causal attention for the step's long prefill pieces (flash attention on
 * tensor cores), taken before cuda_attn.cu's GEMM path where it covers the shape: same pieces
 * (seq_len >= FLASH_MIN, = ATT_GEMM_MIN), same contract, S never leaves the chip.
 *
 * Grid (query tile, q head). A query tile is FLASH_BQ = 64 consecutive rows of one piece,
 * counted from the piece's first row (the last tile may be short; its padding rows compute
 * on zero queries and write nothing). The tiles of all long pieces are numbered in piece
 * order; a block finds its piece by walking seq_len on the device. Its rows are split into
 * four groups of 16, one m16n8k16 row block each. With hd <= 128 one warp owns a group and all
 * of hd; with hd = 256 two warps share a group, each owning half of hd: both compute a partial
 * S over their half of hd, exchange it through shared memory and add (lo + hi, the same bits
 * in both), so both hold the whole S and run the same online softmax, then each accumulates
 * its half of O. Per thread: Q fragments and the O accumulator (fp32) in registers, <= 32 and
 * <= 64 words.
 *
 * The block walks K/V tiles of FLASH_BK = 64 positions at absolute offsets 0, 64, 128, ... up
 * to its last row's position, reading the rows straight from the pages (cp.async into padded
 * shared rows; positions past the tile's last row are zero-filled, never read). Per tile:
 *   S = Q K^T (mma, fp32) -> x = scale*log2(e)*S, -inf past each row's position ->
 *   m' = max(m, max x); P = 2^(x - m'), l = l 2^(m - m') + sum P; O = O 2^(m - m') + P V
 * with P rounded to bf16 for the mma (V fragments through ldmatrix.trans). A tile entirely
 * past a row's position changes nothing for it (m' = m, P = 0), and a warp whose rows all end
 * before a tile skips it. At the end O / l is written as bf16. Every sum runs in an order
 * fixed by the piece (the tile walk, the mma, the 4-lane row reductions), so a row's result
 * never depends on the other pieces of the step. K and V loads overlap the compute: the next
 * K tile is in flight during softmax and P V, V during S = Q K^T.
 *
 * FP8 pages (--kv-cache-dtype fp8): k_flash<HD, true> loads each tile's e4m3 rows and scales and
 * stores the dequantized values as bf16 into the same shared rows (fl_load8); the rest is the
 * same kernel. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"

CUDA_KTRACE_TU(cuda_flash_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

#define FLASH_MIN 32 /* = ATT_GEMM_MIN (cuda_attn.cu): the split path skips exactly these rows */
#define FLASH_BQ 64  /* query rows per block */
#define FLASH_BK 64  /* positions per K/V tile */
#define FLASH_PAD 8  /* bf16 of padding per shared K/V row: conflict-free fragment loads */

/* ---- PTX helpers ---- */

/* Four transposed 8x8 bf16 matrices from shared memory; lane l gives row l % 8 of matrix
 * l / 8. */
__device__ __forceinline__ void fl_ldsm_t4(uint32_t *r, const bf16 *p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

/* ---- kernel ---- */

__device__ __forceinline__ uint32_t fl_pack(float lo, float hi) {
  __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi); /* .x: the lower column */
  return *(uint32_t *)&b;
}

/* Rows j0 .. j0+FLASH_BK-1 of one kv head (hoff) from the pages into dst [FLASH_BK, HD+PAD];
 * rows past jmax are zero-filled. All NT threads of the block take part. */
template <int HD, int NT>
__device__ __forceinline__ void fl_load(bf16 *dst, const bf16 *pool, const int32_t *pt, int j0,
                                        int jmax, size_t w, int hoff, int tid) {
  constexpr int C8 = HD / 8;
  for (int idx = tid; idx < FLASH_BK * C8; idx += NT) {
    int r = idx / C8, c = (idx % C8) * 8, j = j0 + r;
    bf16 *d = dst + r * (HD + FLASH_PAD) + c;
    if (j <= jmax) {
      size_t row = (size_t)pt[j / BACKEND_PAGE_TOKENS] * BACKEND_PAGE_TOKENS +
                   (size_t)(j % BACKEND_PAGE_TOKENS);
      cp_async16(d, pool + row * w + hoff + c);
    } else {
      *(uint4 *)d = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

/* FP8 pages (--kv-cache-dtype fp8, cuda_attn.cu "FP8 K/V"): rows j0 .. j0+FLASH_BK-1 of kv
 * head kvh dequantized (e4m3 value times the row's scale, rounded to bf16) into dst as fl_load
 * leaves them. Plain loads and stores, no cp.async (the values are converted on the way); the
 * walk's barriers order them as they order the copies. */
__device__ __forceinline__ float fl8_f32(uint32_t b) { /* e4m3 byte b (low 8 bits) */
  return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 0x1p120f;
}
template <int HD, int NT>
__device__ __forceinline__ void fl_load8(bf16 *dst, const uint8_t *pool, const int32_t *pt, int j0,
                                         int jmax, int nkv, int kvh, int tid) {
  constexpr int C8 = HD / 8;
  size_t rows = (size_t)BACKEND_PAGE_TOKENS * nkv, pb = rows * (HD + 4);
  for (int idx = tid; idx < FLASH_BK * C8; idx += NT) {
    int r = idx / C8, c = (idx % C8) * 8, j = j0 + r;
    uint4 o = make_uint4(0u, 0u, 0u, 0u);
    if (j <= jmax) {
      const uint8_t *pg = pool + (size_t)pt[j / BACKEND_PAGE_TOKENS] * pb;
      size_t i = (size_t)(j % BACKEND_PAGE_TOKENS) * nkv + kvh;
      uint2 u = *(const uint2 *)(pg + i * HD + c);
      float s = *((const float *)(pg + rows * HD) + i);
      uint32_t *ow = (uint32_t *)&o;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        uint32_t wd = k < 2 ? u.x : u.y, sh = (k & 1) * 16;
        __nv_bfloat162 b2 =
            __floats2bfloat162_rn(fl8_f32(wd >> sh) * s, fl8_f32(wd >> (sh + 8)) * s);
        ow[k] = *(uint32_t *)&b2;
      }
    }
    *(uint4 *)(dst + r * (HD + FLASH_PAD) + c) = o;
  }
}

/* A K/V tile into shared memory from bf16 pages (fl_load) or FP8 pages (fl_load8). */
template <int HD, int NT, bool F8>
__device__ __forceinline__ void fl_load_kv(bf16 *dst, const void *pool, const int32_t *pt, int j0,
                                           int jmax, size_t w, int hoff, int tid) {
  if constexpr (F8)
    fl_load8<HD, NT>(dst, (const uint8_t *)pool, pt, j0, jmax, (int)(w / HD), hoff / HD, tid);
  else
    fl_load<HD, NT>(dst, (const bf16 *)pool, pt, j0, jmax, w, hoff, tid);
}

/* Warps per 16-row group: hd split in halves at 256. */
template <int HD>
struct fl_shape {
  static constexpr int DW = HD > 128 ? 2 : 1;
  static constexpr int HDW = HD / DW; /* hd columns per warp */
  static constexpr int NW = 4 * DW;   /* warps per block */
  static constexpr int NT = NW * 32;
  static constexpr int KS = HDW / 16; /* k steps of S = Q K^T */
  static constexpr int ON = HDW / 8;  /* 8-column tiles of O */
  static constexpr size_t KV_BYTES = (size_t)FLASH_BK * (HD + FLASH_PAD) * sizeof(bf16);
  static constexpr size_t SMEM = 2 * KV_BYTES + (DW > 1 ? (size_t)NW * 32 * 32 * sizeof(float) : 0);
};

/* A thread's Q fragments (A, row major) from its two query rows qa / qb (already offset to the
 * thread's columns; a row that is not real gives zeros): regs {row g, cols 2t..}, {row g+8},
 * {row g, cols 8+2t..}, {row g+8, cols 8+2t..} of each 16-column step. */
template <int HD>
__device__ __forceinline__ void fl_load_q(uint32_t (&qf)[fl_shape<HD>::KS][4], const bf16 *qa,
                                          const bf16 *qb, bool va, bool vb) {
#pragma unroll
  for (int k = 0; k < fl_shape<HD>::KS; k++) {
    qf[k][0] = va ? *(const uint32_t *)(qa + 16 * k) : 0u;
    qf[k][1] = vb ? *(const uint32_t *)(qb + 16 * k) : 0u;
    qf[k][2] = va ? *(const uint32_t *)(qa + 16 * k + 8) : 0u;
    qf[k][3] = vb ? *(const uint32_t *)(qb + 16 * k + 8) : 0u;
  }
}

/* The K/V tile walk of one block (k_flash, k_flash_shared): tiles of FLASH_BK positions from jb
 * (a multiple of FLASH_BK apart) up to jmax, read from the pages of table pt (kv head at hoff);
 * each thread's rows a / b see the positions up to pa / pb; live: the warp has real rows, wlast:
 * the last position any of its rows sees. Leaves each thread's O accumulators, running maxima
 * (base 2) and partial sums (this thread's columns only) in o, ma / mb, la / lb. */
template <int HD, bool F8>
__device__ __forceinline__ void fl_walk(bf16 *Ks, bf16 *Vs, float *Sx, const void *kp,
                                        const void *vp, const int32_t *pt, size_t w, int hoff,
                                        int jb, int jmax, float sl2,
                                        const uint32_t (&qf)[fl_shape<HD>::KS][4], int pa, int pb,
                                        bool live, int wlast, float (&o)[fl_shape<HD>::ON][4],
                                        float &ma, float &mb, float &la, float &lb) {
  typedef fl_shape<HD> S_;
  int tid = threadIdx.x, wp = tid >> 5, lane = tid & 31;
  int rg = wp & 3, dh = wp >> 2;
  int g = lane >> 2, t4 = lane & 3;
  int dbase = dh * S_::HDW;
  int ntiles = (jmax - jb) / FLASH_BK + 1;
  fl_load_kv<HD, S_::NT, F8>(Ks, kp, pt, jb, jmax, w, hoff, tid);
  cp_async_commit();
  for (int kt = 0; kt < ntiles; kt++) {
    int j0 = jb + kt * FLASH_BK;
    fl_load_kv<HD, S_::NT, F8>(Vs, vp, pt, j0, jmax, w, hoff, tid);
    cp_async_commit();
    cp_async_wait<1>(); /* K(kt) landed; V(kt) may be in flight */
    __syncthreads();
    bool act = live && j0 <= wlast;
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    if (act) {
      /* B fragments (K^T, col major = K rows): {key g, cols 2t..}, {key g, cols 8+2t..} */
#pragma unroll
      for (int k = 0; k < S_::KS; k++) {
#pragma unroll
        for (int n = 0; n < 8; n++) {
          const bf16 *kr = Ks + (n * 8 + g) * (HD + FLASH_PAD) + dbase + 16 * k + 2 * t4;
          mma_bf16(s[n], qf[k], *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
        }
      }
    }
    if (S_::DW > 1) { /* add the two halves of hd: lo + hi in both warps */
      if (act) {
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
          for (int c = 0; c < 4; c++) Sx[(wp * 32 + n * 4 + c) * 32 + lane] = s[n][c];
      }
      __syncthreads();
      if (act) {
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
          for (int c = 0; c < 4; c++)
            s[n][c] =
                Sx[(rg * 32 + n * 4 + c) * 32 + lane] + Sx[((rg + 4) * 32 + n * 4 + c) * 32 + lane];
      }
    }
    __syncthreads(); /* the K buffer (and Sx) is free */
    if (kt + 1 < ntiles) {
      fl_load_kv<HD, S_::NT, F8>(Ks, kp, pt, j0 + FLASH_BK, jmax, w, hoff, tid);
      cp_async_commit();
    }
    uint32_t pf[4][4]; /* P as A fragments, one per 16 positions */
    if (act) {
      /* C fragments: s[n][0..1] row g, keys n*8 + 2t + {0,1}; s[n][2..3] row g+8 */
      float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; n++) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
          int j = j0 + n * 8 + 2 * t4 + (c & 1);
          int p = c < 2 ? pa : pb;
          float x = j <= p ? s[n][c] * sl2 : -INFINITY;
          s[n][c] = x;
          if (c < 2)
            xa = fmaxf(xa, x);
          else
            xb = fmaxf(xb, x);
        }
      }
      xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
      xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
      xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
      xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
      float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
      float ua = na == -INFINITY ? 0.f : na, ub = nb == -INFINITY ? 0.f : nb;
      float ca = exp2f(ma - ua), cb = exp2f(mb - ub); /* 0 while m = -inf */
      ma = na;
      mb = nb;
      float sa = 0.f, sb = 0.f;
#pragma unroll
      for (int n = 0; n < 8; n++) {
        s[n][0] = exp2f(s[n][0] - ua);
        s[n][1] = exp2f(s[n][1] - ua);
        s[n][2] = exp2f(s[n][2] - ub);
        s[n][3] = exp2f(s[n][3] - ub);
        sa += s[n][0] + s[n][1];
        sb += s[n][2] + s[n][3];
      }
      la = la * ca + sa;
      lb = lb * cb + sb;
#pragma unroll
      for (int n = 0; n < S_::ON; n++) {
        o[n][0] *= ca;
        o[n][1] *= ca;
        o[n][2] *= cb;
        o[n][3] *= cb;
      }
      /* A fragment of keys 16k..16k+15: C tiles 2k (cols 2t..) and 2k+1 (cols 8+2t..) */
#pragma unroll
      for (int k = 0; k < 4; k++) {
        pf[k][0] = fl_pack(s[2 * k][0], s[2 * k][1]);
        pf[k][1] = fl_pack(s[2 * k][2], s[2 * k][3]);
        pf[k][2] = fl_pack(s[2 * k + 1][0], s[2 * k + 1][1]);
        pf[k][3] = fl_pack(s[2 * k + 1][2], s[2 * k + 1][3]);
      }
    }
    if (kt + 1 < ntiles)
      cp_async_wait<1>(); /* V(kt) landed; K(kt+1) may be in flight */
    else
      cp_async_wait<0>();
    __syncthreads();
    if (act) {
      /* B fragments of V (keys x hd, col major) via ldmatrix.trans: matrix i of a call is
       * keys 16k + (i&1)*8 .. +7, columns c0 + (i>>1)*8 .. +7 -> {b0 b1} of column tile c0/8
       * from matrices 0, 1 and of c0/8 + 1 from matrices 2, 3 */
      int mi = lane >> 3, mr = lane & 7;
#pragma unroll
      for (int k = 0; k < 4; k++) {
#pragma unroll
        for (int n = 0; n < S_::ON; n += 2) {
          uint32_t vb[4];
          fl_ldsm_t4(vb, Vs + (16 * k + (mi & 1) * 8 + mr) * (HD + FLASH_PAD) + dbase + n * 8 +
                             (mi >> 1) * 8);
          mma_bf16(o[n], pf[k], vb[0], vb[1]);
          mma_bf16(o[n + 1], pf[k], vb[2], vb[3]);
        }
      }
    }
    __syncthreads(); /* the V buffer is free */
  }
}

/* grid (query tiles of the long pieces, nh), block fl_shape<HD>::NT. */
template <int HD, bool F8>
__global__ void __launch_bounds__(fl_shape<HD>::NT)
    k_flash(const void *kp, const void *vp, const bf16 *q, const int32_t *seq_len,
            const int32_t *seq_pos, const int32_t *seq_start, const int32_t *page_table,
            int max_pages, int n_seqs, int nh, int nkv, float sl2, bf16 *out) {
  pdl_enter();
  typedef fl_shape<HD> S_;
  extern __shared__ __align__(16) unsigned char fl_smem[];
  bf16 *Ks = (bf16 *)fl_smem, *Vs = Ks + FLASH_BK * (HD + FLASH_PAD);
  float *Sx = (float *)(fl_smem + 2 * S_::KV_BYTES); /* [NW][32][32], DW = 2 only */

  /* the block's piece and first row (tiles numbered backwards: long tiles start first) */
  int b = (int)gridDim.x - 1 - (int)blockIdx.x, piece = -1;
  for (int i = 0; i < n_seqs; i++) {
    int L = seq_len[i];
    if (L < FLASH_MIN) continue;
    int n = (L + FLASH_BQ - 1) / FLASH_BQ;
    if (b < n) {
      piece = i;
      break;
    }
    b -= n;
  }
  if (piece < 0) return; /* cannot happen: the grid counts these tiles */
  int L = seq_len[piece], pos0 = seq_pos[piece], r0 = b * FLASH_BQ;
  int nrows = min(FLASH_BQ, L - r0);
  int p0 = pos0 + r0;                        /* position of the tile's first row */
  int jmax = p0 + nrows - 1;                 /* last position the tile needs */
  size_t t0 = (size_t)seq_start[piece] + r0; /* the tile's first row in the step */
  const int32_t *pt = page_table + (size_t)piece * max_pages;
  int h = blockIdx.y, kvh = h / (nh / nkv);
  size_t w = (size_t)nkv * HD;

  int tid = threadIdx.x, wp = tid >> 5, lane = tid & 31;
  int rg = wp & 3, dh = wp >> 2; /* row group, hd half */
  int g = lane >> 2, t4 = lane & 3;
  int ra = rg * 16 + g, rb = ra + 8; /* the thread's two rows in the tile */
  int pa = p0 + ra, pb = p0 + rb;
  int dbase = dh * S_::HDW;      /* the warp's first hd column */
  bool live = rg * 16 < nrows;   /* the warp has real rows */
  int wlast = p0 + rg * 16 + 15; /* the warp's last row position */

  /* Q fragments (A, row major): regs {row g, cols 2t..}, {row g+8}, {row g, cols 8+2t..},
   * {row g+8, cols 8+2t..} of each 16-column step */
  uint32_t qf[S_::KS][4];
  {
    const bf16 *qa = q + ((t0 + ra) * nh + h) * HD + dbase + 2 * t4;
    const bf16 *qb = q + ((t0 + rb) * nh + h) * HD + dbase + 2 * t4;
    bool va = ra < nrows, vb = rb < nrows;
    fl_load_q<HD>(qf, qa, qb, va, vb);
  }
  float o[S_::ON][4];
#pragma unroll
  for (int n = 0; n < S_::ON; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;

  fl_walk<HD, F8>(Ks, Vs, Sx, kp, vp, pt, w, kvh * HD, 0, jmax, sl2, qf, pa, pb, live, wlast, o, ma,
                  mb, la, lb);

  if (!live) return;
  la += __shfl_xor_sync(0xffffffffu, la, 1);
  la += __shfl_xor_sync(0xffffffffu, la, 2);
  lb += __shfl_xor_sync(0xffffffffu, lb, 1);
  lb += __shfl_xor_sync(0xffffffffu, lb, 2);
  float ia = 1.f / la, ib = 1.f / lb;
  if (ra < nrows) {
    bf16 *oa = out + ((t0 + ra) * nh + h) * HD + dbase + 2 * t4;
#pragma unroll
    for (int n = 0; n < S_::ON; n++)
      *(__nv_bfloat162 *)(oa + n * 8) = __floats2bfloat162_rn(o[n][0] * ia, o[n][1] * ia);
  }
  if (rb < nrows) {
    bf16 *ob = out + ((t0 + rb) * nh + h) * HD + dbase + 2 * t4;
#pragma unroll
    for (int n = 0; n < S_::ON; n++)
      *(__nv_bfloat162 *)(ob + n * 8) = __floats2bfloat162_rn(o[n][2] * ib, o[n][3] * ib);
  }
}

/* The shared positions of a step's groups of decode rows (kv_share.h, c->b.sh_*): grid
 * (group ranges, member tiles, nkv), block fl_shape<HD>::NT. Block (x, y, kvh) takes range z
 * of the group that x falls in (the groups' ranges numbered in group order), members
 * y * R .. of it (R = 64 / G members, G <= 64 q heads per kv head), and as its query rows
 * (R * G <= 64) every (member, q head of kvh) pair, member major; the keys are the range's
 * positions [z per, min(L, (z + 1) per)), the same for every row (no mask inside the range), read
 * from the group's first piece's pages. The walk is k_flash's; each row's unnormalised O, its
 * maximum (in natural-log units of scale q.k, the split kernel's) and its sum go to part / ml slot
 * att_maxs + z of (row, q head). Blocks past the groups' ranges or members return at once (the grid
 * is a bound of the step's layout). */
template <int HD>
__global__ void __launch_bounds__(fl_shape<HD>::NT)
    k_flash_shared(const bf16 *kp, const bf16 *vp, const bf16 *q, const int32_t *page_table,
                   int max_pages, const int32_t *groups, const int32_t *members, int nh, int nkv,
                   float sl2, int att_maxs, int slots, float *part, float *ml) {
  pdl_enter();
  typedef fl_shape<HD> S_;
  int G = nh / nkv, R = FLASH_BQ / G; /* q heads per kv head, members per block */
  extern __shared__ __align__(16) unsigned char fl_smem[];
  bf16 *Ks = (bf16 *)fl_smem, *Vs = Ks + FLASH_BK * (HD + FLASH_PAD);
  float *Sx = (float *)(fl_smem + 2 * S_::KV_BYTES);

  int z = blockIdx.x, n_groups = groups[0];
  const int32_t *gr = NULL;
  for (int i = 0; i < n_groups; i++) {
    const int32_t *gi = groups + 1 + i * CUDA_SH_GROUP_WORDS;
    if (z < gi[4]) {
      gr = gi;
      break;
    }
    z -= gi[4];
  }
  if (!gr) return;
  int m0 = blockIdx.y * R, nm = gr[2] - m0;
  if (nm <= 0) return;
  if (nm > R) nm = R;
  int L = gr[3], per = gr[5];
  int j0 = z * per, j1 = min(L, j0 + per); /* j0 < L: the host counts the ranges so */
  int nrows = nm * G;
  const int32_t *mem = members + gr[1] + m0;
  const int32_t *pt = page_table + (size_t)gr[0] * max_pages;
  int kvh = blockIdx.z;
  size_t w = (size_t)nkv * HD;

  int tid = threadIdx.x, wp = tid >> 5, lane = tid & 31;
  int rg = wp & 3, dh = wp >> 2;
  int g = lane >> 2, t4 = lane & 3;
  int ra = rg * 16 + g, rb = ra + 8;
  int dbase = dh * S_::HDW;
  bool live = rg * 16 < nrows;
  bool va = ra < nrows, vb = rb < nrows;
  /* a query row's (row of the step, q head) */
  int ta = va ? mem[ra / G] : 0, ha = kvh * G + ra % G;
  int tb = vb ? mem[rb / G] : 0, hb = kvh * G + rb % G;

  uint32_t qf[S_::KS][4];
  {
    const bf16 *qa = q + ((size_t)ta * nh + ha) * HD + dbase + 2 * t4;
    const bf16 *qb = q + ((size_t)tb * nh + hb) * HD + dbase + 2 * t4;
    fl_load_q<HD>(qf, qa, qb, va, vb);
  }
  float o[S_::ON][4];
#pragma unroll
  for (int n = 0; n < S_::ON; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;
  fl_walk<HD, false>(Ks, Vs, Sx, kp, vp, pt, w, kvh * HD, j0, j1 - 1, sl2, qf, j1 - 1, j1 - 1, live,
                     j1 - 1, o, ma, mb, la, lb);
  if (!live) return;
  la += __shfl_xor_sync(0xffffffffu, la, 1);
  la += __shfl_xor_sync(0xffffffffu, la, 2);
  lb += __shfl_xor_sync(0xffffffffu, lb, 1);
  lb += __shfl_xor_sync(0xffffffffu, lb, 2);
  const float ln2 = 0.6931471805599453f;
  if (va) {
    size_t r = ((size_t)ta * nh + ha) * slots + att_maxs + z;
    float *pa = part + r * HD + dbase + 2 * t4;
#pragma unroll
    for (int n = 0; n < S_::ON; n++) *(float2 *)(pa + n * 8) = make_float2(o[n][0], o[n][1]);
    if (dh == 0 && t4 == 0) *(float2 *)(ml + 2 * r) = make_float2(ma * ln2, la);
  }
  if (vb) {
    size_t r = ((size_t)tb * nh + hb) * slots + att_maxs + z;
    float *pb = part + r * HD + dbase + 2 * t4;
#pragma unroll
    for (int n = 0; n < S_::ON; n++) *(float2 *)(pb + n * 8) = make_float2(o[n][2], o[n][3]);
    if (dh == 0 && t4 == 0) *(float2 *)(ml + 2 * r) = make_float2(mb * ln2, lb);
  }
}

/* ---- launcher ---- */

template <int HD, bool F8>
static void fl_launch(cuda_ctx *c, unsigned tiles, const void *kp, const void *vp, const bf16 *q,
                      int nh, int nkv, float scale, bf16 *out) {
  typedef fl_shape<HD> S_;
  cudaFuncSetAttribute(k_flash<HD, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S_::SMEM);
  dim3 grid(tiles, nh);
  k_flash<HD, F8><<<grid, S_::NT, S_::SMEM, c->st>>>(
      kp, vp, q, c->b.seq_len, c->b.seq_pos, c->b.seq_start, c->b.page_table, c->b.max_pages,
      c->b.n_seqs, nh, nkv, scale * 1.4426950408889634f, out);
}

/* Fused attention of every piece of the step with seq_len >= FLASH_MIN (the GEMM path's
 * pieces, cuda_attn.cu), K/V read from the pages; returns the number of rows it took, 0 when
 * the shape is not covered (hd not 64, 128 or 256, the GEMM path off) or no piece is long. */
int cuda_attn_flash(cuda_ctx *c, const void *kp, const void *vp, const bf16 *q, int nh, int nkv,
                    int hd, float scale, bf16 *out) {
  if (nkv <= 0 || nh % nkv) return 0;
  if (hd != 64 && hd != 128 && hd != 256) return 0;
  const backend_batch *hb = &c->hb;
  size_t tiles = 0;
  int rows = 0;
  for (int i = 0; i < hb->n_seqs; i++) {
    int L = hb->seq_len[i];
    if (L < FLASH_MIN) continue;
    tiles += (size_t)(L + FLASH_BQ - 1) / FLASH_BQ;
    rows += L;
  }
  if (!tiles || nh > 65535 || tiles > 0x7fffffffu) return 0;
  void (*launch)(cuda_ctx *, unsigned, const void *, const void *, const bf16 *, int, int, float,
                 bf16 *) = hd == 64    ? (c->kv_fp8 ? fl_launch<64, true> : fl_launch<64, false>)
                           : hd == 128 ? (c->kv_fp8 ? fl_launch<128, true> : fl_launch<128, false>)
                                       : (c->kv_fp8 ? fl_launch<256, true> : fl_launch<256, false>);
  launch(c, (unsigned)tiles, kp, vp, q, nh, nkv, scale, out);
  cuda_check_launch(c, "attention (flash)");
  return rows;
}

template <int HD>
static void fl_shared_launch(cuda_ctx *c, const bf16 *kp, const bf16 *vp, const bf16 *q, int nh,
                             int nkv, float scale, int att_maxs, int slots, float *part,
                             float *ml) {
  typedef fl_shape<HD> S_;
  cudaFuncSetAttribute(k_flash_shared<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       (int)S_::SMEM);
  int R = FLASH_BQ / (nh / nkv);
  /* a bound of the layout (rows, CUDA_SH_GROUPS): every group's ranges, the most member tiles
   * any group can need */
  dim3 grid(CUDA_SH_GROUPS * CUDA_SH_MAXS, (c->b.n_tokens + R - 1) / R, nkv);
  k_flash_shared<HD><<<grid, S_::NT, S_::SMEM, c->st>>>(
      kp, vp, q, c->b.page_table, c->b.max_pages, c->b.sh_groups, c->b.sh_members, nh, nkv,
      scale * 1.4426950408889634f, att_maxs, slots, part, ml);
}

int cuda_attn_flash_shared(cuda_ctx *c, const bf16 *kp, const bf16 *vp, const bf16 *q, int nh,
                           int nkv, int hd, float scale, int att_maxs, int slots, float *part,
                           float *ml) {
  if (nkv <= 0 || nh % nkv || nh / nkv > FLASH_BQ || !c->b.sh_on) return -1;
  switch (hd) {
    case 64:
      fl_shared_launch<64>(c, kp, vp, q, nh, nkv, scale, att_maxs, slots, part, ml);
      break;
    case 128:
      fl_shared_launch<128>(c, kp, vp, q, nh, nkv, scale, att_maxs, slots, part, ml);
      break;
    case 256:
      fl_shared_launch<256>(c, kp, vp, q, nh, nkv, scale, att_maxs, slots, part, ml);
      break;
    default:
      return -1;
  }
  cuda_check_launch(c, "attention (shared prefix)");
  return 0;
}
