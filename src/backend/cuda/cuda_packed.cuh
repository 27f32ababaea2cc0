/* cuda_packed — a lossless 12-bit copy of a bf16 weight matrix for the GEMV path.
 *
 * A decode step of one sequence streams every weight once, so its time is the weights' bytes
 * over the memory bandwidth. A bf16 value is a sign, 8 exponent bits and 7 mantissa bits; the
 * sign and mantissa are close to random, but the exponents of one row take few values (random
 * and trained weights alike: a row spans a few binades below its largest value). The copy keeps
 * each value's low byte as it is (the exponent's last bit and the mantissa) and replaces the high
 * byte (the sign and the exponent's first 7 bits, E') by a 4-bit code: the sign and E' - base,
 * base = the row's largest E' - 7. A value whose E' lies below the window is an escape: the
 * 1,024-column turn that holds it is read from the bf16 matrix instead (a bit per turn in the
 * row's header), so every value the products use is exactly the bf16 value: the copy changes
 * bytes, never numbers.
 *
 * Layout of row n (K % 512 == 0, K / 1024 <= PK_MAX_TURNS): K * 3 / 2 bytes at n * K * 3 / 2;
 * turn t (columns 1024 t ..) at 1536 t: lane L's low bytes of its pieces 0, 1 (columns 1024 t +
 * 256 p + 8 L + i, i < 8) at 16 L, of pieces 2, 3 at 512 + 16 L, and its four code words at
 * 1024 + 16 L (word p: byte j holds the code of value j in its low nibble and of value j + 4 in
 * its high nibble). A last half turn (K % 1024 == 512): low bytes of pieces 0, 1 at 16 L, code
 * words at 512 + 8 L. So a warp reads each part of a turn as one contiguous 512-byte run, and
 * a lane's values are exactly the columns gemv_row gives it, in gemv_row's order: a packed
 * row's sums are gemv_row's bits. Header hd[n]: bits 0-7 the base, bit 8 + t: turn t escapes. */
#ifndef DS_CUDA_PACKED_CUH
#define DS_CUDA_PACKED_CUH
#include "backend/cuda/cuda_common.cuh"

#define PK_TURN 1024
#define PK_TURN_BYTES 1536
#define PK_MAX_TURNS 24

/* 1 when a [N, K] matrix has a packed layout (bytes: its size). */
__host__ __device__ static inline int pk_fits(long long N, long long K) {
  return N > 0 && K > 0 && K % 512 == 0 && K / PK_TURN <= PK_MAX_TURNS;
}
__host__ __device__ static inline size_t pk_bytes(long long N, long long K) {
  return (size_t)N * (size_t)K * 3 / 2;
}

/* The high bytes of one code word's 8 values: h0 byte j = value j's, h1 byte j = value j + 4's
 * (code = sign << 3 | E' - base, high byte = sign << 7 | E'). */
__device__ __forceinline__ void pk_hi(uint32_t n, uint32_t base4, uint32_t &h0, uint32_t &h1) {
  uint32_t b0 = n & 0x0F0F0F0Fu, s0 = n & 0x08080808u;
  h0 = s0 * 15u + b0 + base4;
  uint32_t n4 = n >> 4;
  uint32_t b1 = n4 & 0x0F0F0F0Fu, s1 = n4 & 0x08080808u;
  h1 = s1 * 15u + b1 + base4;
}

/* The 8 values of a piece as floats (bf16x8_to_f32's order) from their low bytes l0 (values
 * 0-3), l1 (4-7) and a code word. */
__device__ __forceinline__ void pk_f32x8(uint32_t l0, uint32_t l1, uint32_t n, uint32_t base4,
                                         float *f) {
  uint32_t h0, h1;
  pk_hi(n, base4, h0, h1);
  uint32_t p[4] = {__byte_perm(l0, h0, 0x5140), __byte_perm(l0, h0, 0x7362),
                   __byte_perm(l1, h1, 0x5140), __byte_perm(l1, h1, 0x7362)};
#pragma unroll
  for (int m = 0; m < 4; m++) {
    f[2 * m] = __uint_as_float(p[m] << 16);
    f[2 * m + 1] = __uint_as_float(p[m] & 0xFFFF0000u);
  }
}

/* A turn from the bf16 row (an escaping turn): gemv_row's pieces. */
template <int T>
__device__ __forceinline__ void pk_turn_bf(const bf16 *__restrict__ x, const bf16 *__restrict__ w,
                                           int K, int k0, int np, float *acc) {
  uint4 u[4];
#pragma unroll
  for (int p = 0; p < 4; p++)
    if (p < np) u[p] = ld_stream16(w + k0 + 256 * p);
#pragma unroll
  for (int p = 0; p < 4; p++)
    if (p < np) {
      float wf[8];
      bf16x8_to_f32(u[p], wf);
      gemv_fma8<T>(wf, x, K, k0 + 256 * p, acc);
    }
}

/* A packed full turn from its three 16-byte words (k0 = 1024 t + 8 lane). */
template <int T>
__device__ __forceinline__ void pk_turn(const bf16 *__restrict__ x, uint4 a, uint4 b, uint4 c,
                                        int K, int k0, uint32_t base4, float *acc) {
  float wf[8];
  pk_f32x8(a.x, a.y, c.x, base4, wf);
  gemv_fma8<T>(wf, x, K, k0, acc);
  pk_f32x8(a.z, a.w, c.y, base4, wf);
  gemv_fma8<T>(wf, x, K, k0 + 256, acc);
  pk_f32x8(b.x, b.y, c.z, base4, wf);
  gemv_fma8<T>(wf, x, K, k0 + 512, acc);
  pk_f32x8(b.z, b.w, c.w, base4, wf);
  gemv_fma8<T>(wf, x, K, k0 + 768, acc);
}

/* A packed half turn (the last 512 columns of a row of K % 1024 == 512) from its words. */
template <int T>
__device__ __forceinline__ void pk_half(const bf16 *__restrict__ x, uint4 a, uint2 c, int K, int k0,
                                        uint32_t hd, float *acc) {
  uint32_t base4 = (hd & 0xFFu) * 0x01010101u;
  float wf[8];
  pk_f32x8(a.x, a.y, c.x, base4, wf);
  gemv_fma8<T>(wf, x, K, k0, acc);
  pk_f32x8(a.z, a.w, c.y, base4, wf);
  gemv_fma8<T>(wf, x, K, k0 + 256, acc);
}

/* A turn's three words for lane L (tp: the row's turn). */
struct pk_words {
  uint4 a, b, c;
};
__device__ __forceinline__ pk_words pk_load(const uint8_t *tp, int lane) {
  pk_words r;
  r.a = ld_stream16(tp + 16 * lane);
  r.b = ld_stream16(tp + 512 + 16 * lane);
  r.c = ld_stream16(tp + 1024 + 16 * lane);
  return r;
}

/* gemv_row over a packed row (wp, header hd) with its bf16 row w for the escaping turns: the
 * same sums, the same bits. LATE: the first turn, then the wait and inv. */
#define PK_UT 1 /* packed turns in flight per warp (1 or 2: 1 is the faster) */
template <int T, bool LATE = false, int UT = PK_UT>
__device__ __forceinline__ void pk_row(const bf16 *__restrict__ x, const bf16 *__restrict__ w,
                                       const uint8_t *__restrict__ wp, const uint32_t *hdp, int K,
                                       int lane, float *acc, const float *inv = nullptr,
                                       float *iv = nullptr) {
#pragma unroll
  for (int t = 0; t < T; t++) acc[t] = 0.f;
  /* the first turn's packed words are requested before the header is back (dropped when the
   * turn escapes): no dependent round trip before a warp's first loads; later turns read only
   * the copy their header bit names */
  uint32_t hd = *hdp;
  int nt = K / PK_TURN, t = 0;
  auto run = [&](const pk_words &q, int t) {
    int k0 = t * PK_TURN + 8 * lane;
    if (hd >> (8 + t) & 1u)
      pk_turn_bf<T>(x, w, K, k0, 4, acc);
    else
      pk_turn<T>(x, q.a, q.b, q.c, K, k0, (hd & 0xFFu) * 0x01010101u, acc);
  };
  auto turn = [&](int t) {
    int k0 = t * PK_TURN + 8 * lane;
    if (hd >> (8 + t) & 1u) {
      pk_turn_bf<T>(x, w, K, k0, 4, acc);
    } else {
      pk_words q = pk_load(wp + (size_t)t * PK_TURN_BYTES, lane);
      pk_turn<T>(x, q.a, q.b, q.c, K, k0, (hd & 0xFFu) * 0x01010101u, acc);
    }
  };
  if (nt > 0) {
    run(pk_load(wp, lane), 0);
    t = 1;
  }
  if constexpr (LATE) {
    pdl_wait();
#pragma unroll
    for (int r = 0; r < T; r++) iv[r] = __ldcg(inv + r);
  }
  if constexpr (UT == 2) {
    for (; t + 1 < nt; t += 2) {
      if (hd >> (8 + t) & 3u) {
        turn(t);
        turn(t + 1);
      } else {
        pk_words q0 = pk_load(wp + (size_t)t * PK_TURN_BYTES, lane),
                 q1 = pk_load(wp + (size_t)(t + 1) * PK_TURN_BYTES, lane);
        run(q0, t);
        run(q1, t + 1);
      }
    }
  }
  for (; t < nt; t++) turn(t);
  if (K % PK_TURN) {
    const uint8_t *tp = wp + (size_t)nt * PK_TURN_BYTES;
    int k0 = nt * PK_TURN + 8 * lane;
    if (hd >> (8 + nt) & 1u) {
      pk_turn_bf<T>(x, w, K, k0, 2, acc);
    } else {
      uint4 a = ld_stream16(tp + 16 * lane);
      uint2 c = *(const uint2 *)(tp + 512 + 8 * lane);
      pk_half<T>(x, a, c, K, k0, hd, acc);
    }
  }
#pragma unroll
  for (int r = 0; r < T; r++) acc[r] = warp_sum(acc[r]);
}

/* gemv_row2 (two rows of one x: the glu's gate and up) over packed rows, gemv_row2's bits: one
 * row after the other (pk_row twice), a turn of words in flight per warp as in the single
 * products (both rows' words of a turn requested together, gemv_row2's design, is slower
 * here: scripts/device/packed_gemv.cu). */
template <int T, bool LATE = false>
__device__ __forceinline__ void pk_row2(const bf16 *__restrict__ x, const bf16 *__restrict__ wa,
                                        const uint8_t *__restrict__ pa, const uint32_t *ha,
                                        const bf16 *__restrict__ wb, const uint8_t *__restrict__ pb,
                                        const uint32_t *hb, int K, int lane, float *aa, float *ab,
                                        const float *inv = nullptr, float *iv = nullptr) {
  pk_row<T, LATE>(x, wa, pa, ha, K, lane, aa, inv, iv);
  pk_row<T, false>(x, wb, pb, hb, K, lane, ab);
}

/* One matrix as the GEMV kernels read it: its bf16 rows and, when it has one, its packed copy
 * (pk, headers hd; NULL: bf16 only). */
struct pk_view {
  const bf16 *bf;
  const uint8_t *pk;
  const uint32_t *hd;
};

/* The most rows a GEMV product that reads packed copies has (the kernels' PK instantiations). */
#define PK_MAXT 4

/* Row n's sums from the packed copy when there is one, else gemv_row (the same bits). PK: the
 * kernel is the one instantiated for packed copies; without it only gemv_row is compiled (a
 * kernel holding both paths needs more registers, which slows its bf16 rows). */
template <int T, bool LATE = false, bool PK = true>
__device__ __forceinline__ void pk_gemv_row(const bf16 *__restrict__ x, const pk_view &w, int n,
                                            int K, int lane, float *acc, const float *inv = nullptr,
                                            float *iv = nullptr) {
  if (PK && w.pk)
    pk_row<T, LATE>(x, w.bf + (size_t)n * K, w.pk + pk_bytes(n, K), w.hd + n, K, lane, acc, inv,
                    iv);
  else
    gemv_row<T, true, LATE>(x, w.bf + (size_t)n * K, K, lane, acc, inv, iv);
}

/* The same for two rows of one x (gemv_row2 when either matrix has no packed copy). */
template <int T, bool LATE = false, bool PK = true>
__device__ __forceinline__ void pk_gemv_row2(const bf16 *__restrict__ x, const pk_view &a,
                                             const pk_view &b, int n, int K, int lane, float *aa,
                                             float *ab, const float *inv = nullptr,
                                             float *iv = nullptr) {
  if (PK && a.pk && b.pk)
    pk_row2<T, LATE>(x, a.bf + (size_t)n * K, a.pk + pk_bytes(n, K), a.hd + n, b.bf + (size_t)n * K,
                     b.pk + pk_bytes(n, K), b.hd + n, K, lane, aa, ab, inv, iv);
  else
    gemv_row2<T, LATE>(x, a.bf + (size_t)n * K, b.bf + (size_t)n * K, K, lane, aa, ab, inv, iv);
}

/* ---- making the copy (once, after upload) ---- */

/* hd[n] = the row's base (its largest E' - 7, at least 0), no escapes yet: a warp per row. */
static __global__ void k_pk_base(const bf16 *__restrict__ W, int N, int K, uint32_t *hd) {
  int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (n >= N) return;
  const unsigned short *w = (const unsigned short *)W + (size_t)n * K;
  unsigned m = 0;
  for (int k = lane; k < K; k += 32) m = max(m, (unsigned)(w[k] >> 8) & 0x7Fu);
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) hd[n] = m >= 7 ? m - 7 : 0;
}

/* One thread per 8-value piece (row n, columns 8 q ..): its low bytes and code word into the
 * layout; a piece with an escape marks its turn in hd[n]. */
static __global__ void k_pk_encode(const bf16 *__restrict__ W, int N, int K, uint32_t *hd,
                                   uint8_t *pk) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, pr = (size_t)K / 8;
  if (i >= (size_t)N * pr) return;
  int n = (int)(i / pr), c0 = (int)(i % pr) * 8;
  uint4 u = *(const uint4 *)(W + (size_t)n * K + c0);
  const unsigned short *v = (const unsigned short *)&u;
  unsigned base = hd[n] & 0xFFu, word = 0, lo0 = 0, lo1 = 0;
  int esc = 0;
  for (int j = 0; j < 8; j++) {
    unsigned hi = v[j] >> 8, e = hi & 0x7Fu, code = 0;
    if (e < base)
      esc = 1;
    else
      code = (hi >> 7) << 3 | (e - base);
    word |= code << (j < 4 ? 8 * j : 8 * (j - 4) + 4);
    if (j < 4)
      lo0 |= (unsigned)(v[j] & 0xFFu) << (8 * j);
    else
      lo1 |= (unsigned)(v[j] & 0xFFu) << (8 * (j - 4));
  }
  int t = c0 / PK_TURN, cc = c0 % PK_TURN, p = cc / 256, L = (cc % 256) / 8;
  uint8_t *tp = pk + pk_bytes(n, K) + (size_t)t * PK_TURN_BYTES;
  uint2 lo = make_uint2(lo0, lo1);
  if (t < K / PK_TURN) {
    *(uint2 *)(tp + (p >> 1) * 512 + 16 * L + 8 * (p & 1)) = lo;
    *(uint32_t *)(tp + 1024 + 16 * L + 4 * p) = word;
  } else {
    *(uint2 *)(tp + 16 * L + 8 * p) = lo;
    *(uint32_t *)(tp + 512 + 8 * L + 4 * p) = word;
  }
  if (esc) atomicOr(hd + n, 1u << (8 + t));
}

#endif
