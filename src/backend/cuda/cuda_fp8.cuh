/* cuda_fp8 — the GEMV rows of a weight kept as FP8 (weight_upload_fp8: e4m3 bytes and one fp32
 * scale per bn x bk block, model/fp8.h), for the GEMV kernels of cuda_gemm.cu.
 *
 *   W row n:  | 16 B | 16 B | 16 B | ... |      lane l reads the 16-byte pieces l, l + 32, ...;
 *             k: 0    16     32              each piece lies in one k-block (bk a power of two,
 *                                            16 <= bk <= 512), so its 16 products are summed in
 *                                            fp32 and the sum scaled once by s[n / bn][k / bk]
 *
 * An e4m3 byte (sign, 4 exponent bits of bias 7, 3 mantissa bits) becomes a float by placing its
 * bits in a float's sign, low exponent and high mantissa bits: integer shifts and masks, no
 * conversion instruction, exactly the value times 2^-120 (subnormals included: they land on
 * float subnormals), and the 2^120 is folded into the block's scale. */
#ifndef DS_CUDA_FP8_CUH
#define DS_CUDA_FP8_CUH
#include "backend/cuda/cuda_common.cuh"

#define F8_PIECE 16                     /* e4m3 values per 16-byte load */
#define F8_TURN (32 * F8_PIECE)         /* columns a warp covers per load round */
#define F8_UNROLL 4                     /* 16-byte loads in flight per lane */
#define F8_LATE_K (F8_UNROLL * F8_TURN) /* GEMV_LATE: columns read before the wait */
#define F8_UNBIAS 0x1p120f              /* the value of the bits' exponent offset */

/* One matrix as the FP8 GEMV rows read it. */
struct f8_view {
  const uint8_t *q;   /* [N, K] e4m3 */
  const float *s;     /* [ceil(N / bn), scols] */
  int bn, bks, scols; /* bks = log2(bk) */
};

/* out [rows, cols] bf16: w's FP8 matrix dequantized on c's stream (cuda_fp8.cu k_fp8_dequant:
 * each element one fp32 product rounded to bf16, the bits of the host's dequantize-then-convert
 * upload). The MoE op's grouped GEMMs read the experts this way (cuda_moe.cu). */
void cuda_fp8_dequant(cuda_ctx *c, const cuda_weight *w, bf16 *out);
/* The same for n (1 .. CUDA_FP8_DQ_MANY) weights of one shape and block shape in one launch:
 * out [n, rows, cols], weight i at out + i * rows * cols. */
#define CUDA_FP8_DQ_MANY 16
void cuda_fp8_dequant_many(cuda_ctx *c, const cuda_weight *const *ws, int n, bf16 *out);

/* 1 when a [N, K] FP8 weight with bn x bk blocks and its operands fit the FP8 GEMV rows. */
__host__ __device__ static inline int f8_fits(long long K, int bk) {
  return K > 0 && K % F8_PIECE == 0 && bk >= F8_PIECE && bk <= F8_TURN && !(bk & (bk - 1));
}
static inline int f8_log2(int bk) {
  int b = 0;
  while ((1 << b) < bk) b++;
  return b;
}

/* 4 e4m3 (a word, the lowest address in the low byte) as floats times 2^-120: bytes 1 and 3 as a
 * bf16 pair (o), bytes 0 and 2 (e), then each half as a float. */
__device__ __forceinline__ void f8x4_f32(uint32_t w, float *f) {
  uint32_t o = (w & 0x80008000u) | ((w >> 4) & 0x07f007f0u);
  uint32_t e = ((w << 8) & 0x80008000u) | ((w << 4) & 0x07f007f0u);
  f[0] = __uint_as_float(e << 16);
  f[1] = __uint_as_float(o << 16);
  f[2] = __uint_as_float(e & 0xffff0000u);
  f[3] = __uint_as_float(o & 0xffff0000u);
}

__device__ __forceinline__ void f8x16_f32(uint4 u, float *f) {
  f8x4_f32(u.x, f);
  f8x4_f32(u.y, f + 4);
  f8x4_f32(u.z, f + 8);
  f8x4_f32(u.w, f + 12);
}

/* acc[t] += s * (w . x[t]) over one 16-value piece at column k (wf: its values times 2^-120,
 * s: the block's scale times 2^120). */
template <int T>
__device__ __forceinline__ void f8_fma16(const float *wf, float s, const bf16 *__restrict__ x,
                                         int K, int k, float *acc) {
#pragma unroll
  for (int t = 0; t < T; t++) {
    const uint4 *xp = (const uint4 *)(x + (size_t)t * K + k);
    float xf[16], p = 0.f;
    bf16x8_to_f32(xp[0], xf);
    bf16x8_to_f32(xp[1], xf + 8);
#pragma unroll
    for (int i = 0; i < 16; i++) p += wf[i] * xf[i];
    acc[t] += p * s;
  }
}

/* gemv_row for an FP8 row w (scales sr: its block row): lane partials, then a butterfly; every
 * lane ends with the T sums. R rows of one x (1 or 2: the glu's gate and up) in one loop. LATE:
 * the first F8_LATE_K columns, then the wait and inv (cuda_gemm.cuh GEMV_LATE). */
template <int T, int R, bool LATE = false>
__device__ __forceinline__ void f8_rows(const bf16 *__restrict__ x, const uint8_t *const *w,
                                        const float *const *sr, int bks, int K, int lane,
                                        float (*acc)[T], const float *inv = nullptr,
                                        float *iv = nullptr) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < T; t++) acc[r][t] = 0.f;
  auto round = [&](int k) { /* F8_UNROLL pieces per row from column k on, in flight together */
                            uint4 q[R][F8_UNROLL];
                            float s[R][F8_UNROLL];
#pragma unroll
                            for (int u = 0; u < F8_UNROLL; u++)
#pragma unroll
                              for (int r = 0; r < R; r++) {
                                int kk = k + u * F8_TURN;
                                q[r][u] = kk < K ? ld_stream16(w[r] + kk) : make_uint4(0, 0, 0, 0);
                                s[r][u] = kk < K ? __ldg(sr[r] + (kk >> bks)) * F8_UNBIAS : 0.f;
                              }
#pragma unroll
                            for (int u = 0; u < F8_UNROLL; u++) {
                              int kk = k + u * F8_TURN;
                              if (kk >= K) break;
#pragma unroll
                              for (int r = 0; r < R; r++) {
                                float wf[16];
                                f8x16_f32(q[r][u], wf);
                                f8_fma16<T>(wf, s[r][u], x, K, kk, acc[r]);
                              }
                            }
  };
  int k = lane * F8_PIECE;
  if constexpr (LATE) {
    round(k);
    k += F8_LATE_K;
    pdl_wait();
#pragma unroll
    for (int t = 0; t < T; t++) iv[t] = __ldcg(inv + t);
  }
  for (; k < K; k += F8_LATE_K) round(k);
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < T; t++) acc[r][t] = warp_sum(acc[r][t]);
}

/* Row n of v (one row). */
template <int T, bool LATE = false>
__device__ __forceinline__ void f8_row(const bf16 *__restrict__ x, const f8_view &v, int n, int K,
                                       int lane, float *acc, const float *inv = nullptr,
                                       float *iv = nullptr) {
  const uint8_t *w[1] = {v.q + (size_t)n * K};
  const float *sr[1] = {v.s + (size_t)(n / v.bn) * v.scols};
  float a[1][T];
  f8_rows<T, 1, LATE>(x, w, sr, v.bks, K, lane, a, inv, iv);
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = a[0][t];
}

/* Row n of a and of b (same K and block width). */
template <int T, bool LATE = false>
__device__ __forceinline__ void f8_row2(const bf16 *__restrict__ x, const f8_view &a,
                                        const f8_view &b, int n, int K, int lane, float *aa,
                                        float *ab, const float *inv = nullptr,
                                        float *iv = nullptr) {
  const uint8_t *w[2] = {a.q + (size_t)n * K, b.q + (size_t)n * K};
  const float *sr[2] = {a.s + (size_t)(n / a.bn) * a.scols, b.s + (size_t)(n / b.bn) * b.scols};
  float r[2][T];
  f8_rows<T, 2, LATE>(x, w, sr, a.bks, K, lane, r, inv, iv);
#pragma unroll
  for (int t = 0; t < T; t++) {
    aa[t] = r[0][t];
    ab[t] = r[1][t];
  }
}

/* ---- FP8 rows on tensor cores: products of a few rows (1 .. 8 * NT) ----
 * A block takes F8M_ROWS (16) output columns (weight rows r0 ..) and all the step's rows; its
 * F8M_KW warps split K in 64-column rounds (warp w: rounds w, w + F8M_KW, ...). In a round, lane
 * (g = lane / 4, t = lane % 4) loads 16 e4m3 of weight rows r0 + g and r0 + g + 8 at columns
 * c0 + 16 t .. and takes the same 16 columns of activation rows 8 j + g (staged in shared
 * memory, f8s_block), and feeds four m16n8k16 f16
 * products: a product's k-slots 2t, 2t+1, 2t+8, 2t+9 are the lane's columns 4 m .. 4 m + 3 (a
 * dot product does not care which slot holds which column, as long as both operands agree).
 * e4m3 converts exactly to f16 (cvt.rn.f16x2.e4m3x2); an activation is scaled by 2^-8 before
 * its f16 conversion so that values up to 2^24 stay finite (the few below 2^-6 lose low bits,
 * far below the bf16 activation's own rounding), and the 2^8 is folded into the scale. A round
 * lies in one k-block and the block's rows in one n-block (bk >= 64, bn % 16 == 0), so each
 * round's sums are scaled once. The warps' partial sums are added through shared memory in warp
 * order: the bits do not depend on the number of rows of the step. */
#define F8M_ROWS 16
#define F8M_KW 8    /* warps per block, splitting K */
#define F8M_COLS 64 /* columns per round */
#define F8M_XSCALE 0x1p-8f

__host__ __device__ static inline int f8m_fits(long long N, long long K, int bn, int bk) {
  return N > 0 && K > 0 && K % F8M_COLS == 0 && bk >= F8M_COLS && !(bk & (bk - 1)) &&
         bn % F8M_ROWS == 0;
}

__device__ __forceinline__ uint32_t f8m_cvt2(uint32_t two) { /* 2 e4m3 (low 16 bits) -> f16x2 */
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((unsigned short)(two & 0xffffu)));
  return r;
}
__device__ __forceinline__ uint32_t f8m_x2(uint32_t bf2) { /* a bf16 pair -> f16x2, times 2^-8 */
  float lo = __uint_as_float(bf2 << 16) * F8M_XSCALE,
        hi = __uint_as_float(bf2 & 0xffff0000u) * F8M_XSCALE;
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ void mma_f16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The block's sums. With one group of 8 activation rows (NT 1: verify pieces) the warp stages
 * each 64-column round's columns once (two columns a lane, one coalesced 4-byte load each) as
 * f16 pairs in shared memory, and every lane takes its B fragment from there (a lane converting
 * the 16 columns of its own row instead converts zeros for the rows past T). With more groups
 * each lane loads its own row's 16 columns: the staging's warp barriers kept a round's groups'
 * loads from overlapping, a 3.7x slower 64-row product. R matrices (1, or 2:
 * gate and up) share the staged columns; U rounds' weight loads are in flight per warp.
 * out[r][j][i]: matrix r's sum for activation row 8 j + 2 t + (i & 1), weight row r0 + g +
 * 8 (i >> 1), as lane (g, t) of warp 0 holds them after the reduction (other warps: undefined).
 * A sum's bits do not depend on T: an mma's output column is its own row's. */
template <int NT, int R, int U>
__device__ __forceinline__ void f8s_block(const bf16 *__restrict__ x, int T, const f8_view *v,
                                          int N, int K, int r0, float (*out)[NT][4]) {
  __shared__ __align__(16) uint32_t xs[F8M_KW][8][F8M_COLS / 2];
  __shared__ float red[F8M_KW][R][NT][4][32];
  int wp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float acc[R][NT][4];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[r][j][i] = 0.f;
  const uint8_t *wa[R], *wb[R];
  const float *sr[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    wa[r] = v[r].q + (size_t)min(r0 + g, N - 1) * K;
    wb[r] = v[r].q + (size_t)min(r0 + g + 8, N - 1) * K;
    sr[r] = v[r].s + (size_t)(r0 / v[r].bn) * v[r].scols;
  }
  int rounds = K / F8M_COLS, bks = v[0].bks;
  for (int rd = wp; rd < rounds; rd += F8M_KW * U) {
    uint4 qa[R][U], qb[R][U];
    float sc[R][U];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int r = 0; r < R; r++) {
        int rr = rd + u * F8M_KW, c = rr * F8M_COLS + 16 * t;
        bool in = rr < rounds;
        qa[r][u] = in ? ld_stream16(wa[r] + c) : make_uint4(0, 0, 0, 0);
        qb[r][u] = in ? ld_stream16(wb[r] + c) : make_uint4(0, 0, 0, 0);
        sc[r][u] = in ? __ldg(sr[r] + ((rr * F8M_COLS) >> bks)) * (1.f / F8M_XSCALE) : 0.f;
      }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int rr = rd + u * F8M_KW, c0 = rr * F8M_COLS;
      if (rr >= rounds) break;
      uint32_t A[R][4][4];
#pragma unroll
      for (int r = 0; r < R; r++) {
        const uint32_t wa4[4] = {qa[r][u].x, qa[r][u].y, qa[r][u].z, qa[r][u].w},
                       wb4[4] = {qb[r][u].x, qb[r][u].y, qb[r][u].z, qb[r][u].w};
#pragma unroll
        for (int m = 0; m < 4; m++) {
          A[r][m][0] = f8m_cvt2(wa4[m]);
          A[r][m][1] = f8m_cvt2(wb4[m]);
          A[r][m][2] = f8m_cvt2(wa4[m] >> 16);
          A[r][m][3] = f8m_cvt2(wb4[m] >> 16);
        }
      }
#pragma unroll
      for (int j = 0; j < NT; j++) {
        uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
        if constexpr (NT == 1) {
          __syncwarp();
#pragma unroll
          for (int q = 0; q < 8; q++)
            if (q < T)
              xs[wp][q][lane] = f8m_x2(__ldg((const uint32_t *)(x + (size_t)q * K + c0) + lane));
          __syncwarp();
          if (g < T) {
            const uint4 *xp = (const uint4 *)&xs[wp][g][8 * t];
            x0 = xp[0];
            x1 = xp[1];
          }
        } else if (8 * j + g < T) {
          const uint4 *xp = (const uint4 *)(x + (size_t)(8 * j + g) * K + c0 + 16 * t);
          x0 = xp[0];
          x1 = xp[1];
        }
        uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        if constexpr (NT > 1) {
#pragma unroll
          for (int i = 0; i < 8; i++) xw[i] = f8m_x2(xw[i]);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
          float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int m = 0; m < 4; m++)
            mma_f16(d, A[r][m][0], A[r][m][1], A[r][m][2], A[r][m][3], xw[2 * m], xw[2 * m + 1]);
#pragma unroll
          for (int i = 0; i < 4; i++) acc[r][j][i] += d[i] * sc[r][u];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) red[wp][r][j][i][lane] = acc[r][j][i];
  __syncthreads();
  if (wp == 0) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          float s = red[0][r][j][i][lane];
#pragma unroll
          for (int w = 1; w < F8M_KW; w++) s += red[w][r][j][i][lane];
          out[r][j][i] = s;
        }
  }
}

/* Warp 0's sums of a block of F8M_ROWS weight rows from r0 (f8s_block's out[r]) into y [T, N]
 * (float, or bf16 rounded). */
__device__ __forceinline__ void f8m_put(float *y, float v) { *y = v; }
__device__ __forceinline__ void f8m_put(bf16 *y, float v) { *y = f2bf(v); }
template <int NT, typename Y>
__device__ __forceinline__ void f8m_store(const float (*o)[4], int T, int N, int r0, Y *y) {
  if (threadIdx.x >= 32) return;
  int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int tok = 8 * j + 2 * t + (i & 1), row = r0 + g + 8 * (i >> 1);
      if (tok < T && row < N) f8m_put(y + (size_t)tok * N + row, o[j][i]);
    }
}

#endif
