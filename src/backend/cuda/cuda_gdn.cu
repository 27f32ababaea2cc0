/* cuda_gdn — the Gated DeltaNet kernels: causal depthwise conv1d with conv state, the
 * recurrent step for 1-token pieces and the chunked gated delta rule for longer pieces
 * (qwen35-model.md §3.1, C = 64, chunks aligned to absolute multiples of 64).
 *
 * gdn_prefill runs one block per (piece, value head). The block keeps the fp32 state S [dk, dv]
 * and the chunk's working set (k, q in fp32, U/V', W, A, cumulative gates) in shared memory
 * (global scratch when they do not fit) and walks the piece's chunks in order; per chunk:
 *   G = cumsum(g); A_ij = beta_i (k_i.k_j) e^(G_i-G_j) (j < i);
 *   U = beta V - A U, W = beta e^G K - A W (forward substitution, one thread per column);
 *   V' = U - W S; O_i = e^(G_i) q_i S + sum_{j<=i} (q_i.k_j) e^(G_i-G_j) V'_j;
 *   S <- e^(G_last) S + sum_j e^(G_last-G_j) k_j V'_j^T.
 * Every sum runs in a fixed order that depends only on the piece, so results never depend on
 * the batch; the sums follow the CPU reference's order. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define GDN_C BACKEND_CHUNK
#define CONV_MAXK 16

/* ---- conv1d ---- */

__device__ __forceinline__ float conv_in(const bf16 *x, const float *st, int C, int K, int c,
                                         int start, int idx, int has_state) {
  /* idx: row relative to the piece start; negative rows come from the state */
  if (idx >= 0) return bf2f(x[(size_t)(start + idx) * C + c]);
  if (!has_state) return 0.f;
  return st[(size_t)c * (K - 1) + (K - 1) + idx];
}

__global__ void k_conv1d(const bf16 *x, const float *w, const float *state, const int32_t *seq,
                         const int32_t *seq_start, const int32_t *seq_pos,
                         const int32_t *seq_slot, int T, int C, int K, bf16 *out) {
  size_t n = (size_t)T * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned ii = (unsigned)i; /* n < 2^32 (checked at launch): 32-bit division */
    int t = (int)(ii / (unsigned)C), c = (int)(ii % (unsigned)C);
    int s = seq[t], start = seq_start[s], r = t - start;
    const float *st = state + (size_t)seq_slot[s] * C * (K - 1);
    int hs = seq_pos[s] > 0;
    float acc = 0.f;
    for (int j = 0; j < K - 1; j++)
      acc += w[(size_t)c * K + j] * conv_in(x, st, C, K, c, start, r - (K - 1) + j, hs);
    acc += w[(size_t)c * K + K - 1] * bf2f(x[i]);
    out[i] = f2bf(siluf_dev(acc));
  }
}

/* Prefill steps with K == 4: one thread per (channel, run of CONV_ROWS rows) keeps the window
 * of the last K-1 inputs in registers, so each input is read once (the window is reloaded
 * where a new piece starts inside the run); same sums in the same order as k_conv1d. */
#define CONV_ROWS 16
template <int K>
__global__ void k_conv1d_run(const bf16 *x, const float *w, const float *state, const int32_t *seq,
                             const int32_t *seq_start, const int32_t *seq_pos,
                             const int32_t *seq_slot, int T, int C, bf16 *out) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  int t0 = blockIdx.y * CONV_ROWS, t1 = t0 + CONV_ROWS < T ? t0 + CONV_ROWS : T;
  float wk[K], win[K - 1];
#pragma unroll
  for (int j = 0; j < K; j++) wk[j] = w[(size_t)c * K + j];
  int cur = -1;
  for (int t = t0; t < t1; t++) {
    int s = seq[t];
    if (s != cur) {
      int start = seq_start[s];
      const float *st = state + (size_t)seq_slot[s] * C * (K - 1);
      int hs = seq_pos[s] > 0;
#pragma unroll
      for (int j = 0; j < K - 1; j++) win[j] = conv_in(x, st, C, K, c, start, t - start - (K - 1) + j, hs);
      cur = s;
    }
    float xv = bf2f(x[(size_t)t * C + c]);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < K - 1; j++) acc += wk[j] * win[j];
    acc += wk[K - 1] * xv;
    out[(size_t)t * C + c] = f2bf(siluf_dev(acc));
#pragma unroll
    for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
    win[K - 2] = xv;
  }
}

__global__ void k_conv_state(const bf16 *x, float *state, const int32_t *seq_start,
                             const int32_t *seq_len, const int32_t *seq_pos,
                             const int32_t *seq_slot, int S, int C, int K) {
  size_t n = (size_t)S * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned ii = (unsigned)i;
    int s = (int)(ii / (unsigned)C), c = (int)(ii % (unsigned)C);
    float *st = state + (size_t)seq_slot[s] * C * (K - 1);
    int len = seq_len[s], start = seq_start[s], hs = seq_pos[s] > 0;
    float nw[CONV_MAXK];
    for (int j = 0; j < K - 1; j++) nw[j] = conv_in(x, st, C, K, c, start, len - (K - 1) + j, hs);
    for (int j = 0; j < K - 1; j++) st[(size_t)c * (K - 1) + j] = nw[j];
  }
}

/* Decode steps (every piece one row): one thread per (row, channel) computes the output as
 * k_conv1d does (same sum order) and then shifts that channel's state itself: one launch
 * instead of two. Row t is the whole piece, so no other thread reads its (slot, channel). */
__global__ void k_conv1d_dec(const bf16 *x, const float *w, float *state, const int32_t *seq,
                             const int32_t *seq_pos, const int32_t *seq_slot, int T, int C,
                             int K, bf16 *out) {
  size_t n = (size_t)T * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned ii = (unsigned)i;
    int t = (int)(ii / (unsigned)C), c = (int)(ii % (unsigned)C);
    int s = seq[t];
    float *st = state + (size_t)seq_slot[s] * C * (K - 1) + (size_t)c * (K - 1);
    int hs = seq_pos[s] > 0;
    float win[CONV_MAXK];
    for (int j = 0; j < K - 1; j++) win[j] = hs ? st[j] : 0.f;
    float xv = bf2f(x[i]);
    float acc = 0.f;
    for (int j = 0; j < K - 1; j++) acc += w[(size_t)c * K + j] * win[j];
    acc += w[(size_t)c * K + K - 1] * xv;
    out[i] = f2bf(siluf_dev(acc));
    for (int j = 0; j + 1 < K - 1; j++) st[j] = win[j + 1];
    st[K - 2] = xv;
  }
}

extern "C" void cuda_gdn_conv1d(backend *be, backend_buf conv_state, backend_buf x,
                                backend_weight w, int C, int K, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  int T = c->b.n_tokens;
  if (T <= 0) return;
  if ((size_t)T * C >= (1ull << 32)) {
    cuda_fail(c, "conv1d", "step too large (T * C >= 2^32)");
    return;
  }
  if (!CW(w)->f32 || CW(w)->rows * CW(w)->cols != (int64_t)C * K || K < 1 || K > CONV_MAXK) {
    cuda_fail(c, "conv1d", "weight is not [C, K] with K <= 16");
    return;
  }
  if (!c->legacy && K > 1 && c->b.n_prefill == 0 && c->b.n_decode == c->b.n_tokens) {
    k_conv1d_dec<<<cuda_blocks((size_t)T * C, 256), 256, 0, c->st>>>(
        (const bf16 *)x, CW(w)->f32, (float *)conv_state, c->b.seq, c->b.seq_pos, c->b.seq_slot,
        T, C, K, (bf16 *)out);
    cuda_check_launch(c, "conv1d (decode)");
    return;
  }
  if (!c->legacy && K == 4) {
    dim3 grid((C + 127) / 128, (T + CONV_ROWS - 1) / CONV_ROWS);
    k_conv1d_run<4><<<grid, 128, 0, c->st>>>((const bf16 *)x, CW(w)->f32,
                                             (const float *)conv_state, c->b.seq, c->b.seq_start,
                                             c->b.seq_pos, c->b.seq_slot, T, C, (bf16 *)out);
  } else {
    k_conv1d<<<cuda_blocks((size_t)T * C, 256), 256, 0, c->st>>>(
        (const bf16 *)x, CW(w)->f32, (const float *)conv_state, c->b.seq, c->b.seq_start,
        c->b.seq_pos, c->b.seq_slot, T, C, K, (bf16 *)out);
  }
  cuda_check_launch(c, "conv1d");
  if (K > 1) {
    k_conv_state<<<cuda_blocks((size_t)c->b.n_seqs * C, 256), 256, 0, c->st>>>(
        (const bf16 *)x, (float *)conv_state, c->b.seq_start, c->b.seq_len, c->b.seq_pos,
        c->b.seq_slot, c->b.n_seqs, C, K);
    cuda_check_launch(c, "conv1d (state)");
  }
}

/* ---- recurrent step ---- */

#define DEC_G 4
#define DEC_THREADS 512

/* grid (n_decode, nv). Thread (grp, cx) covers columns c = cx + k*CW and key rows
 * a = grp + r*DEC_G; partial sums over rows are merged through shared memory in group
 * order. */
__global__ void __launch_bounds__(DEC_THREADS)
    k_gdn_decode(float *ssm, const bf16 *qkv, const float *beta, const float *g,
                 const int32_t *ids, const int32_t *seq_start, const int32_t *seq_pos,
                 const int32_t *seq_slot, int nk, int nv, int dk, int dv, bf16 *out) {
  extern __shared__ float sh[]; /* q[dk] k[dk] red[DEC_G*dv] d[dv] */
  float *qs = sh, *ks = sh + dk, *red = ks + dk, *dd = red + DEC_G * dv;
  int s = ids[blockIdx.x], h = blockIdx.y;
  int kh = h / (nv / nk);
  int t = seq_start[s];
  size_t cd = 2 * (size_t)nk * dk + (size_t)nv * dv;
  const bf16 *row = qkv + (size_t)t * cd;
  float *S = ssm + ((size_t)seq_slot[s] * nv + h) * (size_t)dk * dv;
  int zero = seq_pos[s] == 0;
  float eg = expf(g[(size_t)t * nv + h]), bt = beta[(size_t)t * nv + h];
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    qs[i] = bf2f(row[(size_t)kh * dk + i]);
    ks[i] = bf2f(row[(size_t)(nk + kh) * dk + i]);
  }
  __syncthreads();
  int CWc = blockDim.x / DEC_G, grp = threadIdx.x / CWc, cx = threadIdx.x % CWc;
  for (int c = cx; c < dv; c += CWc) {
    float part = 0.f;
    for (int a = grp; a < dk; a += DEC_G) {
      float sv = zero ? 0.f : S[(size_t)a * dv + c] * eg;
      part += sv * ks[a];
    }
    red[grp * dv + c] = part;
  }
  __syncthreads();
  const bf16 *vrow = row + 2 * (size_t)nk * dk + (size_t)h * dv;
  for (int c = threadIdx.x; c < dv; c += blockDim.x) {
    float kv = 0.f;
    for (int q = 0; q < DEC_G; q++) kv += red[q * dv + c];
    dd[c] = bt * (bf2f(vrow[c]) - kv);
  }
  __syncthreads();
  for (int c = cx; c < dv; c += CWc) {
    float part = 0.f, d = dd[c];
    for (int a = grp; a < dk; a += DEC_G) {
      float sv = zero ? 0.f : S[(size_t)a * dv + c] * eg;
      sv += ks[a] * d;
      S[(size_t)a * dv + c] = sv;
      part += sv * qs[a];
    }
    red[grp * dv + c] = part;
  }
  __syncthreads();
  bf16 *orow = out + (size_t)t * nv * dv + (size_t)h * dv;
  for (int c = threadIdx.x; c < dv; c += blockDim.x) {
    float o = 0.f;
    for (int q = 0; q < DEC_G; q++) o += red[q * dv + c];
    orow[c] = f2bf(o);
  }
}

/* The column-split step: grid (n_decode, nv, dv/128), block 256 = 8 row groups x 32 lanes,
 * each lane owning 4 adjacent columns (16-byte accesses, a warp covers a 512-byte state row).
 * Column j of the state depends only on itself (d_j = beta (v_j - sum_a S[a][j] k_a)), so the
 * state is read once and written once, held in registers (R = dk/8 rows x 4 columns per
 * thread, R a compile-time constant so every load is issued before the first use). The 8
 * groups' partial sums are merged in group order. Needs dk in {64, 128, 256}, dv % 128 == 0. */
template <int R>
__global__ void __launch_bounds__(256)
    k_gdn_decode4(float *ssm, const bf16 *qkv, const float *beta, const float *g,
                  const int32_t *ids, const int32_t *seq_start, const int32_t *seq_pos,
                  const int32_t *seq_slot, int nk, int nv, int dv, bf16 *out) {
  constexpr int DK = 8 * R;
  __shared__ float qs[DK], ks[DK];
  __shared__ __align__(16) float red[8][128];
  __shared__ __align__(16) float dsh[128];
  int s = ids[blockIdx.x], h = blockIdx.y;
  int kh = h / (nv / nk);
  int t = seq_start[s];
  int lane = threadIdx.x & 31, grp = threadIdx.x >> 5;
  int j = blockIdx.z * 128 + 4 * lane;
  size_t cd = 2 * (size_t)nk * DK + (size_t)nv * dv;
  const bf16 *row = qkv + (size_t)t * cd;
  float *S = ssm + ((size_t)seq_slot[s] * nv + h) * (size_t)DK * dv;
  int zero = seq_pos[s] == 0;
  float eg = expf(g[(size_t)t * nv + h]), bt = beta[(size_t)t * nv + h];
  int a0 = grp * R;
  float4 sv[R];
  if (!zero) {
#pragma unroll
    for (int r = 0; r < R; r++) sv[r] = *(const float4 *)(S + (size_t)(a0 + r) * dv + j);
  } else {
#pragma unroll
    for (int r = 0; r < R; r++) sv[r] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int i = threadIdx.x; i < DK; i += blockDim.x) {
    qs[i] = bf2f(row[(size_t)kh * DK + i]);
    ks[i] = bf2f(row[(size_t)(nk + kh) * DK + i]);
  }
  __syncthreads();
  float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int r = 0; r < R; r++) {
    float kk = ks[a0 + r];
    sv[r].x *= eg; sv[r].y *= eg; sv[r].z *= eg; sv[r].w *= eg;
    p.x += sv[r].x * kk; p.y += sv[r].y * kk; p.z += sv[r].z * kk; p.w += sv[r].w * kk;
  }
  *(float4 *)&red[grp][4 * lane] = p;
  __syncthreads();
  if (grp == 0) {
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int q = 0; q < 8; q++) {
      float4 v = *(const float4 *)&red[q][4 * lane];
      kv.x += v.x; kv.y += v.y; kv.z += v.z; kv.w += v.w;
    }
    const bf16 *vr = row + 2 * (size_t)nk * DK + (size_t)h * dv + j;
    float4 d;
    d.x = bt * (bf2f(vr[0]) - kv.x);
    d.y = bt * (bf2f(vr[1]) - kv.y);
    d.z = bt * (bf2f(vr[2]) - kv.z);
    d.w = bt * (bf2f(vr[3]) - kv.w);
    *(float4 *)&dsh[4 * lane] = d;
  }
  __syncthreads();
  float4 d = *(const float4 *)&dsh[4 * lane];
  p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int r = 0; r < R; r++) {
    float kk = ks[a0 + r], qq = qs[a0 + r];
    float4 v = sv[r];
    v.x += kk * d.x; v.y += kk * d.y; v.z += kk * d.z; v.w += kk * d.w;
    *(float4 *)(S + (size_t)(a0 + r) * dv + j) = v;
    p.x += v.x * qq; p.y += v.y * qq; p.z += v.z * qq; p.w += v.w * qq;
  }
  *(float4 *)&red[grp][4 * lane] = p;
  __syncthreads();
  if (grp == 0) {
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int q = 0; q < 8; q++) {
      float4 v = *(const float4 *)&red[q][4 * lane];
      o.x += v.x; o.y += v.y; o.z += v.z; o.w += v.w;
    }
    bf16 *orow = out + (size_t)t * nv * dv + (size_t)h * dv + j;
    orow[0] = f2bf(o.x);
    orow[1] = f2bf(o.y);
    orow[2] = f2bf(o.z);
    orow[3] = f2bf(o.w);
  }
}

extern "C" void cuda_gdn_decode(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                                backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->b.n_decode <= 0) return;
  if (nk <= 0 || nv % nk) {
    cuda_fail(c, "gdn_decode", "nv not a multiple of nk");
    return;
  }
  if (!c->legacy && (dk == 64 || dk == 128 || dk == 256) && dv % 128 == 0) {
    dim3 g2(c->b.n_decode, nv, dv / 128);
#define D4(R)                                                                                  \
  k_gdn_decode4<R><<<g2, 256, 0, c->st>>>((float *)ssm, (const bf16 *)qkv, (const float *)beta, \
                                           (const float *)g, c->b.decode_ids, c->b.seq_start,   \
                                           c->b.seq_pos, c->b.seq_slot, nk, nv, dv, (bf16 *)out)
    if (dk == 64) D4(8);
    else if (dk == 128) D4(16);
    else D4(32);
#undef D4
    cuda_check_launch(c, "gdn_decode");
    return;
  }
  dim3 grid(c->b.n_decode, nv);
  size_t smem = (2 * (size_t)dk + (DEC_G + 1) * (size_t)dv) * sizeof(float);
  k_gdn_decode<<<grid, DEC_THREADS, smem, c->st>>>(
      (float *)ssm, (const bf16 *)qkv, (const float *)beta, (const float *)g, c->b.decode_ids,
      c->b.seq_start, c->b.seq_pos, c->b.seq_slot, nk, nv, dk, dv, (bf16 *)out);
  cuda_check_launch(c, "gdn_decode");
}

/* ---- chunked prefill ---- */

#define PRE_THREADS 512

static size_t gdn_block_floats(int dk, int dv) {
  const size_t C = GDN_C;
  return (size_t)dk * dv + 2 * C * dk /* k, q */ + C * dv /* U */ + C * dk /* W */ + C * C +
         2 * C /* G, beta */;
}

__global__ void __launch_bounds__(PRE_THREADS)
    k_gdn_prefill(float *ssm, const bf16 *qkv, const float *beta, const float *g,
                  const int32_t *ids, const int32_t *seq_start, const int32_t *seq_len,
                  const int32_t *seq_pos, const int32_t *seq_slot, int nk, int nv, int dk, int dv,
                  bf16 *out, float *gscratch, size_t per_block) {
  extern __shared__ float dyn[];
  float *base = gscratch ? gscratch + (blockIdx.x * (size_t)gridDim.y + blockIdx.y) * per_block : dyn;
  const int C = GDN_C;
  float *Sm = base;                        /* [dk, dv] */
  float *Kc = Sm + (size_t)dk * dv;        /* [C, dk] */
  float *Qc = Kc + (size_t)C * dk;         /* [C, dk] */
  float *U = Qc + (size_t)C * dk;          /* [C, dv] U, then V' */
  float *Wm = U + (size_t)C * dv;          /* [C, dk] */
  float *A = Wm + (size_t)C * dk;          /* [C, C] A, then P */
  float *G = A + (size_t)C * C;            /* [C] */
  float *Bt = G + C;                       /* [C] */
  int s = ids[blockIdx.x], h = blockIdx.y;
  int kh = h / (nv / nk);
  int n = seq_len[s], pos0 = seq_pos[s], start = seq_start[s];
  size_t cd = 2 * (size_t)nk * dk + (size_t)nv * dv, ow = (size_t)nv * dv;
  float *S = ssm + ((size_t)seq_slot[s] * nv + h) * (size_t)dk * dv;
  int tid = threadIdx.x, nt = blockDim.x;
  size_t nS = (size_t)dk * dv;
  for (size_t i = tid; i < nS; i += nt) Sm[i] = pos0 == 0 ? 0.f : S[i];
  for (int t0 = 0; t0 < n;) {
    int L = C - (pos0 + t0) % C;
    if (L > n - t0) L = n - t0;
    const bf16 *rows = qkv + (size_t)(start + t0) * cd;
    __syncthreads();
    /* 1. load k, q, beta, g */
    for (int i = tid; i < L * dk; i += nt) {
      int r = i / dk, a = i % dk;
      Kc[r * dk + a] = bf2f(rows[(size_t)r * cd + (size_t)(nk + kh) * dk + a]);
      Qc[r * dk + a] = bf2f(rows[(size_t)r * cd + (size_t)kh * dk + a]);
    }
    for (int i = tid; i < L; i += nt) {
      Bt[i] = beta[(size_t)(start + t0 + i) * nv + h];
      G[i] = g[(size_t)(start + t0 + i) * nv + h];
    }
    __syncthreads();
    if (tid == 0) {
      float run = 0.f;
      for (int i = 0; i < L; i++) {
        run += G[i];
        G[i] = run;
      }
    }
    __syncthreads();
    /* 2. A (strictly lower) */
    for (int idx = tid; idx < L * L; idx += nt) {
      int i = idx / L, j = idx % L;
      if (j >= i) continue;
      const float *ki = Kc + i * dk, *kj = Kc + j * dk;
      float d = 0.f;
      for (int a = 0; a < dk; a++) d += ki[a] * kj[a];
      A[i * C + j] = Bt[i] * d * expf(G[i] - G[j]);
    }
    __syncthreads();
    /* 3. forward substitution, one thread per column of U (dv) or W (dk) */
    for (int col = tid; col < dv + dk; col += nt) {
      if (col < dv) {
        int cc = col;
        for (int i = 0; i < L; i++) {
          float u = Bt[i] * bf2f(rows[(size_t)i * cd + 2 * (size_t)nk * dk + (size_t)h * dv + cc]);
          for (int j = 0; j < i; j++) u -= A[i * C + j] * U[j * dv + cc];
          U[i * dv + cc] = u;
        }
      } else {
        int a = col - dv;
        for (int i = 0; i < L; i++) {
          float w = Bt[i] * expf(G[i]) * Kc[i * dk + a];
          for (int j = 0; j < i; j++) w -= A[i * C + j] * Wm[j * dk + a];
          Wm[i * dk + a] = w;
        }
      }
    }
    __syncthreads();
    /* 4. V' = U - W S (in place) */
    for (int idx = tid; idx < L * dv; idx += nt) {
      int i = idx / dv, cc = idx % dv;
      float u = U[idx];
      const float *wi = Wm + i * dk;
      for (int a = 0; a < dk; a++) u -= wi[a] * Sm[(size_t)a * dv + cc];
      U[idx] = u;
    }
    /* 5. P_ij = (q_i.k_j) e^(G_i-G_j), j <= i (into A: A is no longer read) */
    __syncthreads();
    for (int idx = tid; idx < L * L; idx += nt) {
      int i = idx / L, j = idx % L;
      if (j > i) continue;
      const float *qi = Qc + i * dk, *kj = Kc + j * dk;
      float d = 0.f;
      for (int a = 0; a < dk; a++) d += qi[a] * kj[a];
      A[i * C + j] = d * expf(G[i] - G[j]);
    }
    __syncthreads();
    /* 6. outputs */
    for (int idx = tid; idx < L * dv; idx += nt) {
      int i = idx / dv, cc = idx % dv;
      const float *qi = Qc + i * dk;
      float ac = 0.f;
      for (int a = 0; a < dk; a++) ac += qi[a] * Sm[(size_t)a * dv + cc];
      ac *= expf(G[i]);
      for (int j = 0; j <= i; j++) ac += A[i * C + j] * U[j * dv + cc];
      out[(size_t)(start + t0 + i) * ow + (size_t)h * dv + cc] = f2bf(ac);
    }
    __syncthreads();
    /* 7. state (Bt now holds the decays e^(G_last-G_j)) */
    float gl = G[L - 1], egl = expf(gl);
    for (int j = tid; j < L; j += nt) Bt[j] = expf(gl - G[j]);
    __syncthreads();
    for (size_t idx = tid; idx < nS; idx += nt) {
      int a = (int)(idx / dv), cc = (int)(idx % dv);
      float sv = Sm[idx] * egl;
      for (int j = 0; j < L; j++) sv += (Kc[j * dk + a] * Bt[j]) * U[j * dv + cc];
      Sm[idx] = sv;
    }
    t0 += L;
  }
  __syncthreads();
  for (size_t i = tid; i < nS; i += nt) S[i] = Sm[i];
}

/* ---- chunk-parallel prefill (dk == 128, dv % 64 == 0, dv <= 256) ----
 *
 * Phase 1, grid (chunk, value head), every chunk of every piece at once (no state needed):
 *   G = cumsum(g); P_ij = (q_i.k_j) e^(G_i-G_j) (j <= i); A_ij = beta_i (k_i.k_j) e^(G_i-G_j)
 *   (j < i), each thread a 4x4 tile of both; forward substitution U = beta V - A U,
 *   W = beta e^G K - A W, one thread per column with the column in registers; the decayed keys
 *   Kd_j = e^(G_last-G_j) k_j. U, W, P, G, Kd go to scratch.
 * Phase 2, grid (prefill piece, value head, dv/32), the only sequential part: a block owns 32
 * state columns (columns of S are independent) and walks its piece's chunks, the next chunk's
 * W, Kd, U slice arriving by cp.async while it works on this one:
 *   keep S (the state before the chunk) for phase 3;  V' = U - W S (kept in U's place);
 *   S <- e^(G_last) S + Kd^T V'
 * with 2x4 / 4x4 register tiles over padded shared-memory rows (no bank conflicts).
 * Phase 3, grid (chunk, value head, dv/64), every chunk at once again:
 *   O = e^G (Q S) + P V'.
 * Every sum runs in the same order as the one-block kernel above and the CPU reference. */
#define P1_THREADS 256
#define P2_THREADS 256
#define P3_THREADS 256
#define P3_COLS 64 /* output columns per phase-3 block */
#define GK 128 /* dk of this path */
#define GKP (GK + 1)
#define GKQ (GK + 4) /* row stride of the cp.async targets: 16-byte rows, no bank conflicts */

static size_t p1_smem(int dv) {
  return ((size_t)2 * GDN_C * GKP + (size_t)GDN_C * dv + GDN_C * (GDN_C + 1) + 3 * GDN_C) *
         sizeof(float);
}
static size_t p2_smem(void) {
  return ((size_t)GK * 32 + 4 * GDN_C * GKQ + 3 * GDN_C * 32 + 2 * GDN_C) * sizeof(float);
}
static size_t p3_smem(void) {
  return ((size_t)GK * P3_COLS + GDN_C * GKP + GDN_C * (GDN_C + 1) + GDN_C * P3_COLS + GDN_C) *
         sizeof(float);
}
/* Scratch per (chunk, head), in floats: U/V' [C][dv], W [C][GK], P [C][C], G [C], Kd [C][GK],
 * S (the state before the chunk) [GK][dv]; every offset a multiple of 4 floats. */
struct gdn_scr {
  float *U, *W, *P, *G, *Kd, *S;
};
__host__ __device__ static size_t p1_per(int dv) {
  return (size_t)GDN_C * dv + 2 * (size_t)GDN_C * GK + GDN_C * GDN_C + GDN_C + (size_t)GK * dv;
}
__device__ static gdn_scr scr_at(float *scr, int ch, int nv, int h, int dv) {
  gdn_scr r;
  r.U = scr + ((size_t)ch * nv + h) * p1_per(dv);
  r.W = r.U + (size_t)GDN_C * dv;
  r.P = r.W + (size_t)GDN_C * GK;
  r.G = r.P + GDN_C * GDN_C;
  r.Kd = r.G + GDN_C;
  r.S = r.Kd + (size_t)GDN_C * GK;
  return r;
}

__device__ __forceinline__ void cp_async16(float *dst, const float *src) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait(void) {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* 8 bf16 (one 16-byte load) to 8 floats at dst (any alignment); zeros when !ok */
__device__ __forceinline__ void ld8_bf16(float *dst, const bf16 *src, bool ok) {
  uint4 u = make_uint4(0u, 0u, 0u, 0u);
  if (ok) u = *(const uint4 *)src;
  const __nv_bfloat162 *h2 = (const __nv_bfloat162 *)&u;
#pragma unroll
  for (int m = 0; m < 4; m++) {
    float2 f = __bfloat1622float2(h2[m]);
    dst[2 * m] = f.x;
    dst[2 * m + 1] = f.y;
  }
}

__global__ void __launch_bounds__(P1_THREADS)
    k_gdn_p1(const bf16 *qkv, const float *beta, const float *g, const int32_t *ch_row,
             const int32_t *ch_len, int nk, int nv, int dv, float *scr) {
  extern __shared__ float sm1[];
  const int C = GDN_C;
  float *Kc = sm1, *Qc = Kc + C * GKP, *Vc = Qc + C * GKP, *A = Vc + (size_t)C * dv,
        *G = A + C * (C + 1), *Bt = G + C, *eG = Bt + C;
  int ch = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  int kh = h / (nv / nk);
  int r0 = ch_row[ch], L = ch_len[ch];
  size_t cd = 2 * (size_t)nk * GK + (size_t)nv * dv;
  gdn_scr o = scr_at(scr, ch, nv, h, dv);
  /* k, q, v rows of the chunk: 16-byte loads, all issued before any is used */
#pragma unroll 4
  for (int idx = tid; idx < C * (GK / 8); idx += P1_THREADS) {
    int r = idx / (GK / 8), a = 8 * (idx % (GK / 8));
    const bf16 *row = qkv + (size_t)(r0 + r) * cd;
    ld8_bf16(Kc + r * GKP + a, row + (size_t)(nk + kh) * GK + a, r < L);
    ld8_bf16(Qc + r * GKP + a, row + (size_t)kh * GK + a, r < L);
  }
  for (int idx = tid; idx < C * (dv / 8); idx += P1_THREADS) {
    int r = idx / (dv / 8), a = 8 * (idx % (dv / 8));
    ld8_bf16(Vc + (size_t)r * dv + a,
             qkv + (size_t)(r0 + r) * cd + 2 * (size_t)nk * GK + (size_t)h * dv + a, r < L);
  }
  if (tid < C) {
    Bt[tid] = tid < L ? beta[(size_t)(r0 + tid) * nv + h] : 0.f;
    G[tid] = tid < L ? g[(size_t)(r0 + tid) * nv + h] : 0.f;
  }
  __syncthreads();
  if (tid == 0) {
    float run = 0.f;
    for (int i = 0; i < C; i++) {
      run += G[i];
      G[i] = run;
    }
  }
  __syncthreads();
  if (tid < C) {
    eG[tid] = expf(G[tid]);
    o.G[tid] = G[tid];
  }
  {
    /* P and A: thread (ti, tj) owns rows 4ti.., columns 4tj.. of both */
    int i0 = 4 * (tid >> 4), j0 = 4 * (tid & 15);
    float dq[4][4], dd[4][4];
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int k = 0; k < 4; k++) dq[r][k] = dd[r][k] = 0.f;
    if (j0 <= i0 + 3 && i0 < L) {
      for (int a = 0; a < GK; a++) {
        float qi[4], ki[4], kj[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
          qi[r] = Qc[(i0 + r) * GKP + a];
          ki[r] = Kc[(i0 + r) * GKP + a];
          kj[r] = Kc[(j0 + r) * GKP + a];
        }
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
          for (int k = 0; k < 4; k++) {
            dq[r][k] += qi[r] * kj[k];
            dd[r][k] += ki[r] * kj[k];
          }
      }
    }
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int k = 0; k < 4; k++) {
        int i = i0 + r, j = j0 + k;
        float pv = 0.f, av = 0.f;
        if (i < L && j <= i) {
          float e = expf(G[i] - G[j]);
          pv = dq[r][k] * e;
          if (j < i) av = Bt[i] * dd[r][k] * e;
        }
        o.P[i * C + j] = pv;
        A[i * (C + 1) + j] = av;
      }
  }
  __syncthreads();
  for (int col = tid; col < dv + GK; col += P1_THREADS) {
    float u[GDN_C];
#pragma unroll
    for (int i = 0; i < GDN_C; i++) {
      float x = 0.f;
      if (i < L) {
        x = col < dv ? Bt[i] * Vc[(size_t)i * dv + col] : Bt[i] * eG[i] * Kc[i * GKP + col - dv];
#pragma unroll
        for (int j = 0; j < i; j++) x -= A[i * (C + 1) + j] * u[j];
      }
      u[i] = x;
    }
    if (col < dv) {
#pragma unroll
      for (int i = 0; i < GDN_C; i++) o.U[(size_t)i * dv + col] = u[i];
    } else {
#pragma unroll
      for (int i = 0; i < GDN_C; i++) o.W[(size_t)i * GK + col - dv] = u[i];
    }
  }
  float gl = G[L - 1];
  for (int idx = tid; idx < C * GK; idx += P1_THREADS) {
    int r = idx / GK, a = idx % GK;
    o.Kd[idx] = Kc[r * GKP + a] * expf(gl - G[r]);
  }
}

/* phase 2's copies of one chunk (W, Kd, the block's U columns, G) into buffer set b */
__device__ static void p2_fetch(const gdn_scr &q, int dv, int cs, float *Wb, float *Kb, float *Ub,
                                float *Gb, int tid) {
  for (int idx = tid; idx < GDN_C * (GK / 4); idx += P2_THREADS) {
    int r = idx / (GK / 4), a = 4 * (idx % (GK / 4));
    cp_async16(Wb + r * GKQ + a, q.W + (size_t)r * GK + a);
    cp_async16(Kb + r * GKQ + a, q.Kd + (size_t)r * GK + a);
  }
  for (int idx = tid; idx < GDN_C * 8; idx += P2_THREADS) {
    int r = idx >> 3, c = 4 * (idx & 7);
    cp_async16(Ub + r * 32 + c, q.U + (size_t)r * dv + cs + c);
  }
  if (tid < GDN_C / 4) cp_async16(Gb + 4 * tid, q.G + 4 * tid);
  cp_async_commit();
}

__global__ void __launch_bounds__(P2_THREADS)
    k_gdn_p2(float *ssm, const int32_t *ids, const int32_t *seq_pos, const int32_t *seq_slot,
             const int32_t *pre_ch0, const int32_t *ch_len, int nv, int dv, float *scr) {
  extern __shared__ __align__(16) float sm2[];
  const int C = GDN_C;
  float *Ss = sm2;                   /* [GK][32] */
  float *W0 = Ss + GK * 32;          /* two buffer sets: W [C][GKQ] x 2, Kd x 2, U [C][32] x 2 */
  float *K0 = W0 + 2 * C * GKQ;
  float *U0 = K0 + 2 * C * GKQ;
  float *G0 = U0 + 2 * C * 32;       /* G [C] x 2 */
  float *Vs = G0 + 2 * C;            /* [C][32] */
  int bx = blockIdx.x, h = blockIdx.y, cs = blockIdx.z * 32, tid = threadIdx.x;
  int s = ids[bx];
  float *S = ssm + ((size_t)seq_slot[s] * nv + h) * (size_t)GK * dv;
  int zero = seq_pos[s] == 0;
  int c0 = pre_ch0[bx], c1 = pre_ch0[bx + 1];
  p2_fetch(scr_at(scr, c0, nv, h, dv), dv, cs, W0, K0, U0, G0, tid);
  for (int idx = tid; idx < GK * 32; idx += P2_THREADS) {
    int a = idx >> 5, cc = idx & 31;
    Ss[idx] = zero ? 0.f : S[(size_t)a * dv + cs + cc];
  }
  int tc = tid & 7, ti = tid >> 3; /* cols 4tc..4tc+3; rows 2ti, 2ti+1 (a) or 4ti.. (c) */
  for (int ch = c0; ch < c1; ch++) {
    int b = (ch - c0) & 1, L = ch_len[ch];
    gdn_scr q = scr_at(scr, ch, nv, h, dv);
    if (ch + 1 < c1) {
      int n = b ^ 1;
      p2_fetch(scr_at(scr, ch + 1, nv, h, dv), dv, cs, W0 + n * C * GKQ, K0 + n * C * GKQ,
               U0 + n * C * 32, G0 + n * C, tid);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float *Ws = W0 + b * C * GKQ, *Ks = K0 + b * C * GKQ, *Us = U0 + b * C * 32;
    /* the state before this chunk, for phase 3 */
    for (int idx = tid; idx < GK * 8; idx += P2_THREADS) {
      int a = idx >> 3, c = 4 * (idx & 7);
      *(float4 *)(q.S + (size_t)a * dv + cs + c) = *(const float4 *)(Ss + a * 32 + c);
    }
    /* (a) V' = U - W S */
    {
      float acc[2][4];
#pragma unroll
      for (int r = 0; r < 2; r++)
#pragma unroll
        for (int k = 0; k < 4; k++) acc[r][k] = Us[(2 * ti + r) * 32 + 4 * tc + k];
#pragma unroll 4
      for (int a = 0; a < GK; a++) {
        float4 s4 = *(const float4 *)(Ss + a * 32 + 4 * tc);
        float w0 = Ws[(2 * ti) * GKQ + a], w1 = Ws[(2 * ti + 1) * GKQ + a];
        acc[0][0] -= w0 * s4.x; acc[0][1] -= w0 * s4.y; acc[0][2] -= w0 * s4.z; acc[0][3] -= w0 * s4.w;
        acc[1][0] -= w1 * s4.x; acc[1][1] -= w1 * s4.y; acc[1][2] -= w1 * s4.z; acc[1][3] -= w1 * s4.w;
      }
#pragma unroll
      for (int r = 0; r < 2; r++) {
        float4 v = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        *(float4 *)(Vs + (2 * ti + r) * 32 + 4 * tc) = v;
        *(float4 *)(q.U + (size_t)(2 * ti + r) * dv + cs + 4 * tc) = v; /* V' for phase 3 */
      }
    }
    __syncthreads();
    /* (c) S <- e^(G_last) S + Kd^T V' (each thread reads and writes its own 4x4 of S) */
    {
      float egl = expf(G0[b * C + L - 1]);
      float acc[4][4];
#pragma unroll
      for (int r = 0; r < 4; r++) {
        float4 s4 = *(const float4 *)(Ss + (4 * ti + r) * 32 + 4 * tc);
        acc[r][0] = s4.x * egl; acc[r][1] = s4.y * egl; acc[r][2] = s4.z * egl; acc[r][3] = s4.w * egl;
      }
      for (int j = 0; j < L; j++) {
        float4 v4 = *(const float4 *)(Vs + j * 32 + 4 * tc);
        float4 k4 = *(const float4 *)(Ks + j * GKQ + 4 * ti);
        float kd[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
        for (int r = 0; r < 4; r++) {
          acc[r][0] += kd[r] * v4.x; acc[r][1] += kd[r] * v4.y; acc[r][2] += kd[r] * v4.z; acc[r][3] += kd[r] * v4.w;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; r++)
        *(float4 *)(Ss + (4 * ti + r) * 32 + 4 * tc) =
            make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    }
    __syncthreads(); /* buffer set b is refilled by the next iteration's fetch */
  }
  for (int idx = tid; idx < GK * 32; idx += P2_THREADS) {
    int a = idx >> 5, cc = idx & 31;
    S[(size_t)a * dv + cs + cc] = Ss[idx];
  }
}

__global__ void __launch_bounds__(P3_THREADS)
    k_gdn_p3(const bf16 *qkv, const int32_t *ch_row, const int32_t *ch_len, int nk, int nv,
             int dv, float *scr, bf16 *out) {
  extern __shared__ __align__(16) float sm3[];
  const int C = GDN_C;
  float *Ss = sm3;               /* [GK][P3_COLS] */
  float *Qs = Ss + GK * P3_COLS; /* [C][GKP] */
  float *Ps = Qs + C * GKP;      /* [C][C+1] */
  float *Vs = Ps + C * (C + 1);  /* [C][P3_COLS] */
  float *Es = Vs + C * P3_COLS;  /* [C] e^G */
  int ch = blockIdx.x, h = blockIdx.y, cs = blockIdx.z * P3_COLS, tid = threadIdx.x;
  int kh = h / (nv / nk), r0 = ch_row[ch], L = ch_len[ch];
  size_t cd = 2 * (size_t)nk * GK + (size_t)nv * dv, ow = (size_t)nv * dv;
  gdn_scr q = scr_at(scr, ch, nv, h, dv);
  const int Q4 = P3_COLS / 4;
#pragma unroll 4
  for (int idx = tid; idx < GK * Q4; idx += P3_THREADS) {
    int a = idx / Q4, c = 4 * (idx % Q4);
    *(float4 *)(Ss + a * P3_COLS + c) = *(const float4 *)(q.S + (size_t)a * dv + cs + c);
  }
#pragma unroll 4
  for (int idx = tid; idx < C * Q4; idx += P3_THREADS) {
    int r = idx / Q4, c = 4 * (idx % Q4);
    *(float4 *)(Vs + r * P3_COLS + c) = *(const float4 *)(q.U + (size_t)r * dv + cs + c);
  }
#pragma unroll 4
  for (int idx = tid; idx < C * (GK / 8); idx += P3_THREADS) {
    int r = idx / (GK / 8), a = 8 * (idx % (GK / 8));
    ld8_bf16(Qs + r * GKP + a, qkv + (size_t)(r0 + r) * cd + (size_t)kh * GK + a, r < L);
  }
#pragma unroll 4
  for (int idx = tid; idx < C * C / 4; idx += P3_THREADS) {
    int i = (4 * idx) / C, j = (4 * idx) % C;
    float4 v = *(const float4 *)(q.P + 4 * idx);
    float *d = Ps + i * (C + 1) + j;
    d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
  }
  if (tid < C) Es[tid] = expf(q.G[tid]);
  __syncthreads();
  /* thread: rows 2ti, 2ti+1; columns 4tc.. and 32+4tc.. of the slice */
  int tc = tid & 7, ti = tid >> 3;
  float acc[2][8];
#pragma unroll
  for (int r = 0; r < 2; r++)
#pragma unroll
    for (int k = 0; k < 8; k++) acc[r][k] = 0.f;
#pragma unroll 4
  for (int a = 0; a < GK; a++) {
    float4 s0 = *(const float4 *)(Ss + a * P3_COLS + 4 * tc);
    float4 s1 = *(const float4 *)(Ss + a * P3_COLS + 32 + 4 * tc);
    float sv[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    float q0 = Qs[(2 * ti) * GKP + a], q1 = Qs[(2 * ti + 1) * GKP + a];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      acc[0][k] += q0 * sv[k];
      acc[1][k] += q1 * sv[k];
    }
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int i = 2 * ti + r;
    float e = Es[i];
#pragma unroll
    for (int k = 0; k < 8; k++) acc[r][k] *= e;
    for (int j = 0; j <= i; j++) {
      float pj = Ps[i * (C + 1) + j];
      float4 v0 = *(const float4 *)(Vs + j * P3_COLS + 4 * tc);
      float4 v1 = *(const float4 *)(Vs + j * P3_COLS + 32 + 4 * tc);
      acc[r][0] += pj * v0.x; acc[r][1] += pj * v0.y; acc[r][2] += pj * v0.z; acc[r][3] += pj * v0.w;
      acc[r][4] += pj * v1.x; acc[r][5] += pj * v1.y; acc[r][6] += pj * v1.z; acc[r][7] += pj * v1.w;
    }
    if (i < L) {
      bf16 *o = out + (size_t)(r0 + i) * ow + (size_t)h * dv + cs + 4 * tc;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        o[k] = f2bf(acc[r][k]);
        o[32 + k] = f2bf(acc[r][4 + k]);
      }
    }
  }
}

/* The chunk-parallel path; returns 0 when the shape is not covered. */
static int gdn_prefill2(cuda_ctx *c, float *ssm, const bf16 *qkv, const float *beta,
                        const float *g, int nk, int nv, int dk, int dv, bf16 *out) {
  if (c->legacy || dk != GK || dv % P3_COLS || dv > 256 || c->b.n_chunks <= 0) return 0;
  static int attr = 0;
  if (!attr) {
    cudaFuncSetAttribute(k_gdn_p1, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p1_smem(256));
    cudaFuncSetAttribute(k_gdn_p2, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p2_smem());
    cudaFuncSetAttribute(k_gdn_p3, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p3_smem());
    attr = 1;
  }
  float *scr = (float *)cuda_scratch(c, (size_t)c->b.n_chunks * nv * p1_per(dv) * sizeof(float));
  if (!scr) return 1;
  dim3 g1(c->b.n_chunks, nv);
  k_gdn_p1<<<g1, P1_THREADS, p1_smem(dv), c->st>>>(qkv, beta, g, c->b.ch_row, c->b.ch_len, nk, nv,
                                                  dv, scr);
  cuda_check_launch(c, "gdn_prefill (chunks)");
  dim3 g2(c->b.n_prefill, nv, dv / 32);
  k_gdn_p2<<<g2, P2_THREADS, p2_smem(), c->st>>>(ssm, c->b.prefill_ids, c->b.seq_pos,
                                                  c->b.seq_slot, c->b.pre_ch0, c->b.ch_len, nv,
                                                  dv, scr);
  cuda_check_launch(c, "gdn_prefill (scan)");
  dim3 g3(c->b.n_chunks, nv, dv / P3_COLS);
  k_gdn_p3<<<g3, P3_THREADS, p3_smem(), c->st>>>(qkv, c->b.ch_row, c->b.ch_len, nk, nv, dv, scr,
                                                  out);
  cuda_check_launch(c, "gdn_prefill (outputs)");
  return 1;
}

extern "C" void cuda_gdn_prefill(backend *be, backend_buf ssm, backend_buf qkv,
                                 backend_buf beta, backend_buf g, int nk, int nv, int dk, int dv,
                                 backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->b.n_prefill <= 0) return;
  if (nk <= 0 || nv % nk) {
    cuda_fail(c, "gdn_prefill", "nv not a multiple of nk");
    return;
  }
  if (gdn_prefill2(c, (float *)ssm, (const bf16 *)qkv, (const float *)beta, (const float *)g, nk,
                   nv, dk, dv, (bf16 *)out))
    return;
  size_t per = gdn_block_floats(dk, dv);
  size_t smem = per * sizeof(float);
  static int attr_set = 0;
  if (!attr_set) {
    cudaFuncSetAttribute(k_gdn_prefill, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
    attr_set = 1;
  }
  float *gs = NULL;
  if (smem > 227 * 1024) {
    gs = (float *)cuda_scratch(c, smem * (size_t)c->b.n_prefill * nv);
    if (!gs) return;
    smem = 0;
  }
  dim3 grid(c->b.n_prefill, nv);
  k_gdn_prefill<<<grid, PRE_THREADS, smem, c->st>>>(
      (float *)ssm, (const bf16 *)qkv, (const float *)beta, (const float *)g, c->b.prefill_ids,
      c->b.seq_start, c->b.seq_len, c->b.seq_pos, c->b.seq_slot, nk, nv, dk, dv, (bf16 *)out, gs,
      per);
  cuda_check_launch(c, "gdn_prefill");
}
