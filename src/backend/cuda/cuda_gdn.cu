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
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

CUDA_KTRACE_TU(cuda_gdn_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

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
                         const int32_t *seq_start, const int32_t *seq_pos, const int32_t *seq_slot,
                         int T, int C, int K, bf16 *out) {
  pdl_enter();
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
__device__ __forceinline__ void conv_run_ch(const bf16 *x, const float *w, const float *state,
                                            const int32_t *seq, const int32_t *seq_start,
                                            const int32_t *seq_pos, const int32_t *seq_slot, int C,
                                            int c, int t0, int t1, bf16 *out) {
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
      for (int j = 0; j < K - 1; j++)
        win[j] = conv_in(x, st, C, K, c, start, t - start - (K - 1) + j, hs);
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

template <int K>
__global__ void k_conv1d_run(const bf16 *x, const float *w, const float *state, const int32_t *seq,
                             const int32_t *seq_start, const int32_t *seq_pos,
                             const int32_t *seq_slot, int T, int C, bf16 *out) {
  pdl_enter();
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  int t0 = blockIdx.y * CONV_ROWS, t1 = t0 + CONV_ROWS < T ? t0 + CONV_ROWS : T;
  conv_run_ch<K>(x, w, state, seq, seq_start, seq_pos, seq_slot, C, c, t0, t1, out);
}

/* The same for even C, two channels per thread: where one piece covers the whole run of
 * CONV_ROWS rows (almost every run), the run's inputs are loaded first (4-byte pairs, all
 * loads in flight together) and then summed exactly as above; other runs take the per-row
 * loop per channel (the one-channel kernel is far from bandwidth). */
template <int K>
__global__ void k_conv1d_run2(const bf16 *x, const float *w, const float *state, const int32_t *seq,
                              const int32_t *seq_start, const int32_t *seq_pos,
                              const int32_t *seq_slot, int T, int C, bf16 *out) {
  pdl_enter();
  int c = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  int t0 = blockIdx.y * CONV_ROWS, t1 = t0 + CONV_ROWS < T ? t0 + CONV_ROWS : T;
  int s = seq[t0];
  if (t1 - t0 != CONV_ROWS || seq[t1 - 1] != s) {
    conv_run_ch<K>(x, w, state, seq, seq_start, seq_pos, seq_slot, C, c, t0, t1, out);
    conv_run_ch<K>(x, w, state, seq, seq_start, seq_pos, seq_slot, C, c + 1, t0, t1, out);
    return;
  }
  __nv_bfloat162 xr[CONV_ROWS];
#pragma unroll
  for (int r = 0; r < CONV_ROWS; r++)
    xr[r] = *(const __nv_bfloat162 *)(x + (size_t)(t0 + r) * C + c);
  float wa[K], wb[K], wina[K - 1], winb[K - 1];
#pragma unroll
  for (int j = 0; j < K; j++) {
    wa[j] = w[(size_t)c * K + j];
    wb[j] = w[(size_t)(c + 1) * K + j];
  }
  int start = seq_start[s], hs = seq_pos[s] > 0;
  const float *st = state + (size_t)seq_slot[s] * C * (K - 1);
#pragma unroll
  for (int j = 0; j < K - 1; j++) {
    wina[j] = conv_in(x, st, C, K, c, start, t0 - start - (K - 1) + j, hs);
    winb[j] = conv_in(x, st, C, K, c + 1, start, t0 - start - (K - 1) + j, hs);
  }
#pragma unroll
  for (int r = 0; r < CONV_ROWS; r++) {
    float2 xv = __bfloat1622float2(xr[r]);
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int j = 0; j < K - 1; j++) {
      a += wa[j] * wina[j];
      b += wb[j] * winb[j];
    }
    a += wa[K - 1] * xv.x;
    b += wb[K - 1] * xv.y;
    __nv_bfloat162 o;
    o.x = f2bf(siluf_dev(a));
    o.y = f2bf(siluf_dev(b));
    *(__nv_bfloat162 *)(out + (size_t)(t0 + r) * C + c) = o;
#pragma unroll
    for (int j = 0; j + 1 < K - 1; j++) {
      wina[j] = wina[j + 1];
      winb[j] = winb[j + 1];
    }
    wina[K - 2] = xv.x;
    winb[K - 2] = xv.y;
  }
}

__global__ void k_conv_state(const bf16 *x, float *state, const int32_t *seq_start,
                             const int32_t *seq_len, const int32_t *seq_pos,
                             const int32_t *seq_slot, int S, int C, int K) {
  pdl_enter();
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

/* Verify pieces (backend.h): the conv window after each row r < len-1 into keep slot
 * keep[s] + r; run before k_conv_state, which overwrites the window these read. */
__global__ void k_conv_keep(const bf16 *x, float *state, const int32_t *ids, const int32_t *keep,
                            const int32_t *seq_start, const int32_t *seq_len,
                            const int32_t *seq_pos, const int32_t *seq_slot, int n, int C, int K) {
  pdl_enter();
  size_t nn = (size_t)n * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nn;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned ii = (unsigned)i;
    int v = (int)(ii / (unsigned)C), c = (int)(ii % (unsigned)C);
    int s = ids[v];
    const float *st = state + (size_t)seq_slot[s] * C * (K - 1);
    int len = seq_len[s], start = seq_start[s], hs = seq_pos[s] > 0;
    for (int r = 0; r + 1 < len; r++) {
      float *kst = state + (size_t)(keep[s] + r) * C * (K - 1) + (size_t)c * (K - 1);
      for (int j = 0; j < K - 1; j++)
        kst[j] = conv_in(x, st, C, K, c, start, r + 1 - (K - 1) + j, hs);
    }
  }
}

/* Decode steps (every piece one row): one thread per (row, channel) computes the output as
 * k_conv1d does (same sum order) and then shifts that channel's state itself: one launch
 * instead of two. Row t is the whole piece, so no other thread reads its (slot, channel). */
__global__ void k_conv1d_dec(const bf16 *x, const float *w, float *state, const int32_t *seq,
                             const int32_t *seq_pos, const int32_t *seq_slot, int T, int C, int K,
                             bf16 *out) {
  pdl_enter();
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
  if (K > 1 && c->b.n_prefill == 0 && c->b.n_decode == c->b.n_tokens) {
    k_conv1d_dec<<<cuda_blocks((size_t)T * C, 256), 256, 0, c->st>>>(
        (const bf16 *)x, CW(w)->f32, (float *)conv_state, c->b.seq, c->b.seq_pos, c->b.seq_slot, T,
        C, K, (bf16 *)out);
    cuda_check_launch(c, "conv1d (decode)");
    return;
  }
  if (K == 4 && C % 2 == 0 && !(((uintptr_t)x | (uintptr_t)out) & 3)) {
    dim3 grid((C / 2 + 127) / 128, (T + CONV_ROWS - 1) / CONV_ROWS);
    k_conv1d_run2<4><<<grid, 128, 0, c->st>>>((const bf16 *)x, CW(w)->f32,
                                              (const float *)conv_state, c->b.seq, c->b.seq_start,
                                              c->b.seq_pos, c->b.seq_slot, T, C, (bf16 *)out);
  } else if (K == 4) {
    dim3 grid((C + 127) / 128, (T + CONV_ROWS - 1) / CONV_ROWS);
    k_conv1d_run<4><<<grid, 128, 0, c->st>>>((const bf16 *)x, CW(w)->f32, (const float *)conv_state,
                                             c->b.seq, c->b.seq_start, c->b.seq_pos, c->b.seq_slot,
                                             T, C, (bf16 *)out);
  } else {
    k_conv1d<<<cuda_blocks((size_t)T * C, 256), 256, 0, c->st>>>(
        (const bf16 *)x, CW(w)->f32, (const float *)conv_state, c->b.seq, c->b.seq_start,
        c->b.seq_pos, c->b.seq_slot, T, C, K, (bf16 *)out);
  }
  cuda_check_launch(c, "conv1d");
  if (K > 1 && c->b.n_verify > 0) {
    k_conv_keep<<<cuda_blocks((size_t)c->b.n_verify * C, 256), 256, 0, c->st>>>(
        (const bf16 *)x, (float *)conv_state, c->b.verify_ids, c->b.seq_keep, c->b.seq_start,
        c->b.seq_len, c->b.seq_pos, c->b.seq_slot, c->b.n_verify, C, K);
    cuda_check_launch(c, "conv1d (kept windows)");
  }
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

/* grid (pieces, nv). Thread (grp, cx) covers columns c = cx + k*CW and key rows
 * a = grp + r*DEC_G; partial sums over rows are merged through shared memory in group
 * order. VER: the pieces are verify pieces (backend.h "Verify pieces"): their rows run the same
 * step one after another, the state after row r < len-1 going to keep slot keep[s] + r and the
 * last to the piece's slot; a thread reads back only the state elements it wrote itself. */
template <bool VER>
__global__ void __launch_bounds__(DEC_THREADS)
    k_gdn_decode(float *ssm, const bf16 *qkv, const float *beta, const float *g, const int32_t *ids,
                 const int32_t *seq_start, const int32_t *seq_len, const int32_t *seq_pos,
                 const int32_t *seq_slot, const int32_t *keep, int nk, int nv, int dk, int dv,
                 bf16 *out) {
  pdl_enter();
  extern __shared__ float sh[]; /* q[dk] k[dk] red[DEC_G*dv] d[dv] */
  float *qs = sh, *ks = sh + dk, *red = ks + dk, *dd = red + DEC_G * dv;
  int s = ids[blockIdx.x], h = blockIdx.y;
  int kh = h / (nv / nk);
  int n = VER ? seq_len[s] : 1;
  size_t cd = 2 * (size_t)nk * dk + (size_t)nv * dv, hs = (size_t)dk * dv;
  float *S0 = ssm + ((size_t)seq_slot[s] * nv + h) * hs, *S = S0;
  int zero = seq_pos[s] == 0;
  int CWc = blockDim.x / DEC_G, grp = threadIdx.x / CWc, cx = threadIdx.x % CWc;
  for (int r = 0; r < n; r++) {
    int t = seq_start[s] + r;
    const bf16 *row = qkv + (size_t)t * cd;
    float *So = VER && r < n - 1 ? ssm + ((size_t)(keep[s] + r) * nv + h) * hs : S0;
    float eg = expf(g[(size_t)t * nv + h]), bt = beta[(size_t)t * nv + h];
    if (r > 0) __syncthreads(); /* the previous row's q, k, red and d are consumed */
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      qs[i] = bf2f(row[(size_t)kh * dk + i]);
      ks[i] = bf2f(row[(size_t)(nk + kh) * dk + i]);
    }
    __syncthreads();
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
        So[(size_t)a * dv + c] = sv;
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
    S = So;
    zero = 0;
  }
}

/* The state a thread of gdn_step4 holds: rows a0 .. a0+R-1 of columns j .. j+3 of the head's
 * state S (row stride dv), zeros for a sequence starting at position 0 (zero). */
template <int R>
__device__ __forceinline__ void gdn_load4(const float *S, int dv, int j, int a0, int zero,
                                          float4 *sv) {
#pragma unroll
  for (int r = 0; r < R; r++)
    sv[r] =
        zero ? make_float4(0.f, 0.f, 0.f, 0.f) : *(const float4 *)(S + (size_t)(a0 + r) * dv + j);
}

/* The recurrent step of one (row, value head) on 128 state columns, shared by k_gdn_decode4 and
 * k_gdn_chain (one arithmetic, so the chain gives the step's bits): thread (grp, lane) holds
 * rows a0 .. a0+R-1 of columns j .. j+3 in sv (loaded by the caller), S points at the head's
 * state (row stride dv) for the write-back; qs/ks the normalised q and k, eg = e^g, v (used by
 * group 0) the four v values of its columns. Returns the four outputs (valid in group 0). */
template <int R>
__device__ __forceinline__ float4 gdn_step4(float4 *sv, float *S, int dv, int j, int a0, int grp,
                                            int lane, const float *qs, const float *ks, float eg,
                                            float bt, float4 v, float (*red)[128], float *dsh) {
  float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int r = 0; r < R; r++) {
    float kk = ks[a0 + r];
    sv[r].x *= eg;
    sv[r].y *= eg;
    sv[r].z *= eg;
    sv[r].w *= eg;
    p.x += sv[r].x * kk;
    p.y += sv[r].y * kk;
    p.z += sv[r].z * kk;
    p.w += sv[r].w * kk;
  }
  *(float4 *)&red[grp][4 * lane] = p;
  __syncthreads();
  if (grp == 0) {
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int q = 0; q < 8; q++) {
      float4 w = *(const float4 *)&red[q][4 * lane];
      kv.x += w.x;
      kv.y += w.y;
      kv.z += w.z;
      kv.w += w.w;
    }
    float4 d;
    d.x = bt * (v.x - kv.x);
    d.y = bt * (v.y - kv.y);
    d.z = bt * (v.z - kv.z);
    d.w = bt * (v.w - kv.w);
    *(float4 *)&dsh[4 * lane] = d;
  }
  __syncthreads();
  float4 d = *(const float4 *)&dsh[4 * lane];
  p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int r = 0; r < R; r++) {
    float kk = ks[a0 + r], qq = qs[a0 + r];
    float4 w = sv[r];
    w.x += kk * d.x;
    w.y += kk * d.y;
    w.z += kk * d.z;
    w.w += kk * d.w;
    *(float4 *)(S + (size_t)(a0 + r) * dv + j) = w;
    sv[r] = w; /* a verify piece's next row starts from it */
    p.x += w.x * qq;
    p.y += w.y * qq;
    p.z += w.z * qq;
    p.w += w.w * qq;
  }
  *(float4 *)&red[grp][4 * lane] = p;
  __syncthreads();
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  if (grp == 0) {
#pragma unroll
    for (int q = 0; q < 8; q++) {
      float4 w = *(const float4 *)&red[q][4 * lane];
      o.x += w.x;
      o.y += w.y;
      o.z += w.z;
      o.w += w.w;
    }
  }
  return o;
}

/* The column-split step: grid (pieces, nv, dv/128), block 256 = 8 row groups x 32 lanes,
 * each lane owning 4 adjacent columns (16-byte accesses, a warp covers a 512-byte state row).
 * Column j of the state depends only on itself (d_j = beta (v_j - sum_a S[a][j] k_a)), so the
 * state is read once and written once, held in registers (R = dk/8 rows x 4 columns per
 * thread, R a compile-time constant so every load is issued before the first use). The 8
 * groups' partial sums are merged in group order. Needs dk in {64, 128, 256}, dv % 128 == 0.
 * VER: verify pieces, row after row from the registers, as k_gdn_decode<true>. */
template <int R, bool VER>
__global__ void __launch_bounds__(256)
    k_gdn_decode4(float *ssm, const bf16 *qkv, const float *beta, const float *g,
                  const int32_t *ids, const int32_t *seq_start, const int32_t *seq_len,
                  const int32_t *seq_pos, const int32_t *seq_slot, const int32_t *keep, int nk,
                  int nv, int dv, bf16 *out) {
  pdl_enter();
  constexpr int DK = 8 * R;
  __shared__ float qs[DK], ks[DK];
  __shared__ __align__(16) float red[8][128];
  __shared__ __align__(16) float dsh[128];
  int s = ids[blockIdx.x], h = blockIdx.y;
  int kh = h / (nv / nk);
  int n = VER ? seq_len[s] : 1;
  int lane = threadIdx.x & 31, grp = threadIdx.x >> 5;
  int j = blockIdx.z * 128 + 4 * lane;
  size_t cd = 2 * (size_t)nk * DK + (size_t)nv * dv, hs = (size_t)DK * dv;
  float *S = ssm + ((size_t)seq_slot[s] * nv + h) * hs;
  int zero = seq_pos[s] == 0;
  int a0 = grp * R;
  float4 sv[R];
  gdn_load4<R>(S, dv, j, a0, zero, sv);
  for (int r = 0; r < n; r++) {
    int t = seq_start[s] + r;
    const bf16 *row = qkv + (size_t)t * cd;
    float *So = VER && r < n - 1 ? ssm + ((size_t)(keep[s] + r) * nv + h) * hs : S;
    float eg = expf(g[(size_t)t * nv + h]), bt = beta[(size_t)t * nv + h];
    if (r > 0) __syncthreads(); /* the previous row's q and k are consumed */
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      qs[i] = bf2f(row[(size_t)kh * DK + i]);
      ks[i] = bf2f(row[(size_t)(nk + kh) * DK + i]);
    }
    __syncthreads();
    const bf16 *vr = row + 2 * (size_t)nk * DK + (size_t)h * dv + j;
    float4 v = grp == 0 ? make_float4(bf2f(vr[0]), bf2f(vr[1]), bf2f(vr[2]), bf2f(vr[3]))
                        : make_float4(0.f, 0.f, 0.f, 0.f); /* used by group 0 only */
    float4 o = gdn_step4<R>(sv, So, dv, j, a0, grp, lane, qs, ks, eg, bt, v, red, dsh);
    if (grp == 0) {
      bf16 *orow = out + (size_t)t * nv * dv + (size_t)h * dv + j;
      orow[0] = f2bf(o.x);
      orow[1] = f2bf(o.y);
      orow[2] = f2bf(o.z);
      orow[3] = f2bf(o.w);
    }
  }
}

/* Launches the recurrent step over n pieces ids (verify pieces when keep is not NULL). */
template <bool VER>
static void gdn_decode_launch(cuda_ctx *c, int n, const int32_t *ids, const int32_t *keep,
                              float *ssm, const bf16 *qkv, const float *beta, const float *g,
                              int nk, int nv, int dk, int dv, bf16 *out) {
  if ((dk == 64 || dk == 128 || dk == 256) && dv % 128 == 0) {
    dim3 g2(n, nv, dv / 128);
    void (*k)(float *, const bf16 *, const float *, const float *, const int32_t *, const int32_t *,
              const int32_t *, const int32_t *, const int32_t *, const int32_t *, int, int, int,
              bf16 *) = dk == 64    ? k_gdn_decode4<8, VER>
                        : dk == 128 ? k_gdn_decode4<16, VER>
                                    : k_gdn_decode4<32, VER>;
    k<<<g2, 256, 0, c->st>>>(ssm, qkv, beta, g, ids, c->b.seq_start, c->b.seq_len, c->b.seq_pos,
                             c->b.seq_slot, keep, nk, nv, dv, out);
  } else {
    dim3 grid(n, nv);
    size_t smem = (2 * (size_t)dk + (DEC_G + 1) * (size_t)dv) * sizeof(float);
    k_gdn_decode<VER><<<grid, DEC_THREADS, smem, c->st>>>(ssm, qkv, beta, g, ids, c->b.seq_start,
                                                          c->b.seq_len, c->b.seq_pos, c->b.seq_slot,
                                                          keep, nk, nv, dk, dv, out);
  }
  cuda_check_launch(c, VER ? "gdn_decode (verify pieces)" : "gdn_decode");
}

extern "C" void cuda_gdn_decode(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                                backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->b.n_decode <= 0 && c->b.n_verify <= 0) return;
  if (nk <= 0 || nv % nk) {
    cuda_fail(c, "gdn_decode", "nv not a multiple of nk");
    return;
  }
  if (c->b.n_decode > 0)
    gdn_decode_launch<false>(c, c->b.n_decode, c->b.decode_ids, NULL, (float *)ssm,
                             (const bf16 *)qkv, (const float *)beta, (const float *)g, nk, nv, dk,
                             dv, (bf16 *)out);
  if (c->b.n_verify > 0)
    gdn_decode_launch<true>(c, c->b.n_verify, c->b.verify_ids, c->b.seq_keep, (float *)ssm,
                            (const bf16 *)qkv, (const float *)beta, (const float *)g, nk, nv, dk,
                            dv, (bf16 *)out);
}

/* ---- the decode chain ----
 * A decode step's DeltaNet layer is four small launches (conv1d, gates, recurrent step, gated
 * norm), each a round trip to memory for a few KB per row: at one sequence they cost as much
 * as the layer's recurrent step itself. Here one block per (row, value head
 * h), laid out as k_gdn_decode4 (256 threads, the state in registers), does all four:
 *   1. the recurrent state's loads are issued first;
 *   2. conv1d of the q and k channels of h's key head kh and of h's v channels, with
 *      k_conv1d_dec's expression; the G = nv / nk blocks of kh all compute kh's q and k;
 *   3. warp 0 / 1 L2-normalise q / k as k_gdn_gates does (same lane order), thread 64
 *      computes h's beta and g;
 *   4. the recurrent step, k_gdn_decode4's arithmetic;
 *   5. warp 0 rounds o to bf16, writes it, and applies the gated norm as k_gated_rmsnorm_v<4>
 *      (a lane's four columns are that kernel's four).
 * Every value is the four kernels' expression in their order: the same bits. Writes: h's own
 * v channels (conv output and state), beta, g, state, o and out; kh's q/k conv output by the
 * first block of the group; kh's q/k conv state by the last of the G blocks to have read it,
 * found by a counter per (row, kh) that each block bumps after its reads (fenced) and the last
 * one resets to 0 — no block waits for another. dv = 128, dk = 8 R (64 or 128), K = 4.
 * grid (n_decode, nv), block 256. */
#define CHAIN_CNT 65536 /* counters: rows x key heads of one step, at most */
/* steps of at most this many rows: above it the four kernels are faster on the H200 */
#define CHAIN_MAXT 32

template <int R>
__global__ void __launch_bounds__(256)
    k_gdn_chain(const bf16 *x, const float *cw, float *cst, bf16 *co, const bf16 *bb,
                const bf16 *aa, const float *A_log, const float *dt_bias, float *beta, float *g,
                float *ssm, bf16 *o, const bf16 *z, const float *nw, float eps, bf16 *out,
                const int32_t *seq_pos, const int32_t *seq_slot, int nk, int nv, int *cnt) {
  pdl_enter();
  constexpr int DK = 8 * R, DV = 128, K = 4, NCH = 2 * DK + DV, PER = (NCH + 255) / 256;
  __shared__ float qs[DK], ks[DK], vs[DV], gb[2];
  __shared__ __align__(16) float red[8][DV];
  __shared__ __align__(16) float dsh[DV];
  __shared__ int last;
  /* every piece is one row (cuda_gdn_chain's condition) and pieces are contiguous and in
   * order: piece s is row s, no lookup before the loads that depend on it */
  int s = blockIdx.x, h = blockIdx.y, G = nv / nk, kh = h / G, t = s;
  int lane = threadIdx.x & 31, grp = threadIdx.x >> 5;
  int j = 4 * lane, a0 = grp * R;
  size_t C = 2 * (size_t)nk * DK + (size_t)nv * DV;
  int slot = seq_slot[s], zero = seq_pos[s] == 0;
  float *S = ssm + ((size_t)slot * nv + h) * (size_t)DK * DV;
  float4 sv[R];
  gdn_load4<R>(S, DV, j, a0, zero, sv);
  size_t gi = (size_t)t * nv + h, off = (size_t)t * nv * DV + (size_t)h * DV + j;
  /* what steps 3 and 5 read, requested now (SMALL_EARLY): not a round trip after a barrier */
  float gin[4] = {0.f, 0.f, 0.f, 0.f}, zf[4] = {0.f, 0.f, 0.f, 0.f}, nwv[4] = {0.f, 0.f, 0.f, 0.f};
  if (threadIdx.x == 64) {
    gin[0] = bf2f(bb[gi]);
    gin[1] = bf2f(aa[gi]);
    gin[2] = A_log[h];
    gin[3] = dt_bias[h];
  }
  if (grp == 0) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      zf[k] = bf2f(z[off + k]);
      nwv[k] = nw[j + k];
    }
  }
  float keep[PER][K - 1]; /* new q/k conv state of this thread's channels */
#pragma unroll
  for (int u = 0; u < PER; u++) {
    int i = threadIdx.x + 256 * u;
    if (i >= NCH) break;
    size_t c = i < DK       ? (size_t)kh * DK + i
               : i < 2 * DK ? (size_t)(nk + kh) * DK + (i - DK)
                            : 2 * (size_t)nk * DK + (size_t)h * DV + (i - 2 * DK);
    float *st = cst + (size_t)slot * C * (K - 1) + c * (K - 1);
    const float *w = cw + c * K;
    float win[K - 1];
#pragma unroll
    for (int q = 0; q < K - 1; q++) win[q] = zero ? 0.f : st[q];
    float xv = bf2f(x[(size_t)t * C + c]);
    float acc = 0.f;
#pragma unroll
    for (int q = 0; q < K - 1; q++) acc += w[q] * win[q];
    acc += w[K - 1] * xv;
    bf16 r = f2bf(siluf_dev(acc));
#pragma unroll
    for (int q = 0; q + 1 < K - 1; q++) keep[u][q] = win[q + 1];
    keep[u][K - 2] = xv;
    if (i < DK) {
      qs[i] = bf2f(r);
    } else if (i < 2 * DK) {
      ks[i - DK] = bf2f(r);
    } else {
      vs[i - 2 * DK] = bf2f(r);
      co[(size_t)t * C + c] = r;
#pragma unroll
      for (int q = 0; q < K - 1; q++) st[q] = keep[u][q];
    }
  }
  __syncthreads();
  if (threadIdx.x < 64) { /* warp 0: q, warp 1: k */
    int wk = threadIdx.x >> 5;
    float *xs = wk ? ks : qs;
    float ss = 0.f;
    for (int i = lane; i < DK; i += 32) {
      float v = xs[i];
      ss += v * v;
    }
    ss = warp_sum(ss);
    float inv = 1.f / sqrtf(ss + 1e-6f);
    float sc = wk ? 1.f : 1.f / sqrtf((float)DK);
    bf16 *dst = co + (size_t)t * C + (size_t)(wk ? nk + kh : kh) * DK;
    for (int i = lane; i < DK; i += 32) {
      bf16 r = f2bf(xs[i] * inv * sc);
      xs[i] = bf2f(r);
      if (h % G == 0) dst[i] = r;
    }
  } else if (threadIdx.x == 64) {
    float bt, gg;
    gdn_gate_vals(gin[0], gin[1], gin[2], gin[3], &bt, &gg);
    beta[gi] = bt;
    g[gi] = gg;
    gb[0] = expf(gg);
    gb[1] = bt;
  } else if (threadIdx.x == 96) { /* this block's reads of kh's q/k conv state are done */
    int l = 1;                    /* G = 1: no other block reads them */
    if (G > 1) {
      int *c1 = cnt + (size_t)blockIdx.x * nk + kh;
      __threadfence();
      l = atomicAdd(c1, 1) == G - 1;
      if (l) *c1 = 0;
      __threadfence();
    }
    last = l;
  }
  __syncthreads();
  if (last) {
#pragma unroll
    for (int u = 0; u < PER; u++) {
      int i = threadIdx.x + 256 * u;
      if (i >= 2 * DK) break;
      size_t c = i < DK ? (size_t)kh * DK + i : (size_t)(nk + kh) * DK + (i - DK);
      float *st = cst + (size_t)slot * C * (K - 1) + c * (K - 1);
#pragma unroll
      for (int q = 0; q < K - 1; q++) st[q] = keep[u][q];
    }
  }
  float4 v = grp == 0 ? make_float4(vs[j], vs[j + 1], vs[j + 2], vs[j + 3])
                      : make_float4(0.f, 0.f, 0.f, 0.f); /* used by group 0 only */
  float4 oo = gdn_step4<R>(sv, S, DV, j, a0, grp, lane, qs, ks, gb[0], gb[1], v, red, dsh);
  if (grp == 0) {
    bf16 ob[4] = {f2bf(oo.x), f2bf(oo.y), f2bf(oo.z), f2bf(oo.w)}, nb[4];
    float of[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      o[off + k] = ob[k];
      of[k] = bf2f(ob[k]);
    }
    gated_norm_lane<4>(of, zf, nwv, eps, nb);
#pragma unroll
    for (int k = 0; k < 4; k++) out[off + k] = nb[k];
  }
}

extern "C" int cuda_gdn_chain_init(cuda_ctx *c) {
  return cuda_zeroed_ints(&c->chain_cnt, CHAIN_CNT);
}

extern "C" void cuda_gdn_chain_release(cuda_ctx *c) {
  cudaFree(c->chain_cnt);
  c->chain_cnt = NULL;
}

int cuda_gdn_chain(cuda_ctx *c, const cuda_gdn_chain_args *a) {
  const cuda_weight *cw = CW(a->conv_w), *al = CW(a->A_log), *db = CW(a->dt_bias),
                    *nw = CW(a->norm);
  int T = c->b.n_tokens, nk = a->nk, nv = a->nv, dk = a->dk;
  if (!c->chain_cnt || T <= 0 || T > CHAIN_MAXT || c->b.n_prefill != 0 || c->b.n_decode != T ||
      a->T != T || a->K != 4 || a->dv != 128 || (dk != 64 && dk != 128) || nk <= 0 || nv % nk ||
      (size_t)T * nk > CHAIN_CNT || a->C != 2 * nk * dk + nv * a->dv || !cw->f32 ||
      cw->rows * cw->cols != (int64_t)a->C * 4 || !al->f32 || !db->f32 || !nw->f32 ||
      al->rows * al->cols < nv || db->rows * db->cols < nv || nw->rows * nw->cols < a->dv ||
      (size_t)T * a->C >= (1ull << 31))
    return 0;
  dim3 grid((unsigned)T, (unsigned)nv);
#define CH(R_)                                                                                   \
  k_gdn_chain<R_><<<grid, 256, 0, c->st>>>(                                                      \
      (const bf16 *)a->x, cw->f32, (float *)a->conv_state, (bf16 *)a->conv_out,                  \
      (const bf16 *)a->b, (const bf16 *)a->a, al->f32, db->f32, (float *)a->beta, (float *)a->g, \
      (float *)a->ssm, (bf16 *)a->o, (const bf16 *)a->z, nw->f32, a->eps, (bf16 *)a->out,        \
      c->b.seq_pos, c->b.seq_slot, nk, nv, c->chain_cnt)
  if (dk == 64)
    CH(8);
  else
    CH(16);
#undef CH
  cuda_check_launch(c, "gdn decode chain");
  return 1;
}

/* ---- conv1d + gates of a decode step ----
 * Above CHAIN_MAXT rows the chain is not used and a DeltaNet layer's decode step runs its
 * four kernels; there conv1d (one thread per (row, channel), 1.1 TB/s: 11.4 µs of a 64-row
 * step at the 4B shape) and the gates (one block per row: 6 µs) cost as much as the layer's
 * attention share. Here one launch does both: warp u of row t takes a unit of
 * dk channels (the 2 nk q/k heads, then the v channels in dk-wide pieces), lane l the channels
 * base + l + 32 r as k_gdn_gates' lanes take them, each with k_conv1d_dec's expression (window
 * from the state, output, state shift); a q/k unit then L2-normalises its head in k_gdn_gates'
 * order (lane sums over r, butterfly) before writing, and unit 0 also computes the row's beta
 * and g. Same bits as the two kernels. K = 4, dk = 32 R (R <= 8). grid (T, ceil(units / 8)),
 * block 256. */
template <int R>
__global__ void __launch_bounds__(256)
    k_conv_gates_dec(const bf16 *x, const float *cw, float *cst, bf16 *co, const bf16 *bb,
                     const bf16 *aa, const float *A_log, const float *dt_bias, float *beta,
                     float *g, const int32_t *seq, const int32_t *seq_pos, const int32_t *seq_slot,
                     int C, int nk, int nv) {
  pdl_enter();
  constexpr int dk = 32 * R;
  int t = blockIdx.x, lane = threadIdx.x & 31, u = blockIdx.y * 8 + (threadIdx.x >> 5);
  int base = u * dk;
  if (base >= C) return;
  int s = seq[t], hs = seq_pos[s] > 0;
  float *st = cst + (size_t)seq_slot[s] * C * 3;
  const bf16 *xr = x + (size_t)t * C;
  bf16 *orow = co + (size_t)t * C;
  float win[R][3], xv[R], w[R][4];
#pragma unroll
  for (int r = 0; r < R; r++) { /* every load first */
    int c = base + lane + 32 * r;
    if (c < C) {
#pragma unroll
      for (int j = 0; j < 3; j++) win[r][j] = hs ? st[(size_t)c * 3 + j] : 0.f;
      xv[r] = bf2f(xr[c]);
      float4 wv = *(const float4 *)(cw + (size_t)c * 4);
      w[r][0] = wv.x, w[r][1] = wv.y, w[r][2] = wv.z, w[r][3] = wv.w;
    }
  }
  float v[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    int c = base + lane + 32 * r;
    if (c < C) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < 3; j++) acc += w[r][j] * win[r][j];
      acc += w[r][3] * xv[r];
      v[r] = bf2f(f2bf(siluf_dev(acc)));
      float *sc = st + (size_t)c * 3;
      sc[0] = win[r][1];
      sc[1] = win[r][2];
      sc[2] = xv[r];
    }
  }
  if (u < 2 * nk) { /* a q or k head: normalised as k_gdn_gates does */
    float ss = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) ss += v[r] * v[r];
    ss = warp_sum(ss);
    float inv = 1.f / sqrtf(ss + 1e-6f);
    float sc = u < nk ? 1.f / sqrtf((float)dk) : 1.f;
#pragma unroll
    for (int r = 0; r < R; r++) orow[base + lane + 32 * r] = f2bf(v[r] * inv * sc);
  } else {
#pragma unroll
    for (int r = 0; r < R; r++) {
      int c = base + lane + 32 * r;
      if (c < C) orow[c] = f2bf(v[r]);
    }
  }
  if (u == 0)
    for (int h = lane; h < nv; h += 32)
      gdn_gate_vals(bf2f(bb[(size_t)t * nv + h]), bf2f(aa[(size_t)t * nv + h]), A_log[h],
                    dt_bias[h], &beta[(size_t)t * nv + h], &g[(size_t)t * nv + h]);
}

int cuda_gdn_conv_gates(cuda_ctx *c, const cuda_gdn_chain_args *a) {
  const cuda_weight *cw = CW(a->conv_w), *al = CW(a->A_log), *db = CW(a->dt_bias);
  int T = c->b.n_tokens, nk = a->nk, nv = a->nv, dk = a->dk;
  if (T <= 0 || c->b.n_prefill != 0 || c->b.n_decode != T || a->K != 4 || dk % 32 || dk > 256 ||
      nk <= 0 || nv <= 0 || a->C != 2 * nk * dk + nv * a->dv || !cw->f32 ||
      cw->rows * cw->cols != (int64_t)a->C * 4 || !al->f32 || !db->f32 ||
      al->rows * al->cols < nv || db->rows * db->cols < nv || (size_t)T * a->C >= (1ull << 31))
    return 0;
  int units = (a->C + dk - 1) / dk;
  dim3 grid((unsigned)T, (unsigned)((units + 7) / 8));
#define CG(R_)                                                                                     \
  case R_:                                                                                         \
    k_conv_gates_dec<R_><<<grid, 256, 0, c->st>>>(                                                 \
        (const bf16 *)a->x, cw->f32, (float *)a->conv_state, (bf16 *)a->conv_out,                  \
        (const bf16 *)a->b, (const bf16 *)a->a, al->f32, db->f32, (float *)a->beta, (float *)a->g, \
        c->b.seq, c->b.seq_pos, c->b.seq_slot, a->C, nk, nv);                                      \
    break;
  switch (dk / 32) { CG(1) CG(2) CG(3) CG(4) CG(5) CG(6) CG(7) CG(8) }
#undef CG
  cuda_check_launch(c, "conv1d + gdn_gates (decode)");
  return 1;
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
  pdl_enter();
  extern __shared__ float dyn[];
  float *base =
      gscratch ? gscratch + (blockIdx.x * (size_t)gridDim.y + blockIdx.y) * per_block : dyn;
  const int C = GDN_C;
  float *Sm = base;                 /* [dk, dv] */
  float *Kc = Sm + (size_t)dk * dv; /* [C, dk] */
  float *Qc = Kc + (size_t)C * dk;  /* [C, dk] */
  float *U = Qc + (size_t)C * dk;   /* [C, dv] U, then V' */
  float *Wm = U + (size_t)C * dv;   /* [C, dk] */
  float *A = Wm + (size_t)C * dk;   /* [C, C] A, then P */
  float *G = A + (size_t)C * C;     /* [C] */
  float *Bt = G + C;                /* [C] */
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
 * Every sum runs in the same order as the one-block kernel above and the CPU reference.
 *
 * Phases 1 and 2 run on tensor cores (k_gdn_p1m, k_gdn_p2m below: faster than FMA versions;
 * phase 3 on tensor cores moved the MoE-shape parity check past its bound, so it stays on FMA,
 * k_gdn_p3) with mma.sync m16n8k16 bf16 and fp32 accumulation. Phase 1's Q K^T and K K^T take
 * q and k as they are: they are bf16 values, so the products are exact and only the summation
 * order changes. Phase 2's fp32 operands (W, S for V' = U - W S; Kd, V' for the state update)
 * each enter as a pair x_hi = bf16(x), x_lo = bf16(x - x_hi) (about 16 mantissa bits together):
 * A B ~ A_hi B_hi + A_hi B_lo + A_lo B_hi (the dropped lo x lo term is ~2^-16 relative), i.e.
 * relative errors ~1e-5, far below the bf16 rounding of the output. Tiles sit in shared memory
 * as bf16 with rows padded to 4 (mod 32) words, so fragment loads hit 32 distinct banks; B
 * operands are stored transposed so each fragment register is one 32-bit load. Tile order is
 * fixed, so results still depend only on the piece. Phase 2 keeps its state slice in registers
 * as mma accumulators across the piece's chunks. */
#define P1_THREADS 256
#define P2_THREADS 256
#define P3_THREADS 256
#define P3_COLS 64 /* output columns per phase-3 block */
#define GK 128     /* dk of this path */
#define GKP (GK + 1)
#define GKQ (GK + 4) /* row stride of the cp.async targets: 16-byte rows, no bank conflicts */

static size_t p3_smem(void) {
  return ((size_t)GK * P3_COLS + GK * GDN_C + GDN_C * GDN_C + GDN_C * P3_COLS + GDN_C) *
         sizeof(float);
}
/* Scratch per (chunk, head), in floats: U/V' [C][dv], W [C][GK], P [C][C], G [C], Kd [C][GK],
 * S (the state before the chunk) [GK][dv]; every offset a multiple of 4 floats. When phase 2
 * runs on tensor cores, W's and Kd's places hold bf16 hi / lo halves instead (same bytes):
 * W hi [C][GK] then W lo, Kd^T hi [GK][C] then Kd^T lo (p1_tail<true>). */
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

/* x = hi + lo with hi = bf16(x), lo = bf16(x - hi): the pair carries ~16 mantissa bits */
__device__ __forceinline__ void split_bf16(float x, bf16 &hi, bf16 &lo) {
  hi = f2bf(x);
  lo = f2bf(x - bf2f(hi));
}

/* 8 bf16 (one 16-byte load) to 8 floats at dst (any alignment); zeros when !ok */
__device__ __forceinline__ void ld8_bf16(float *dst, const bf16 *src, bool ok) {
  uint4 u = make_uint4(0u, 0u, 0u, 0u);
  if (ok) u = *(const uint4 *)src;
  bf16x8_to_f32(u, dst);
}

/* Phase 1's gates of one chunk (every thread of the block calls it; it syncs): beta, the
 * cumulative log-decays G (zeros past L), e^G, and G to scratch. */
__device__ __forceinline__ static void p1_gates(const float *beta, const float *g, int r0, int L,
                                                int nv, int h, int tid, float *Bt, float *G,
                                                float *eG, float *Gout) {
  const int C = GDN_C;
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
    Gout[tid] = G[tid];
  }
}

/* The end of phase 1, after A is in shared memory: forward substitution (one thread per
 * column of U or W, the column in registers) and the decayed keys Kd. kat(r, a) is entry a of
 * the chunk's key row r (each caller's own copy of k). SPLIT (phase 2 on tensor cores next):
 * W and Kd go to scratch as the bf16 hi / lo halves that k_gdn_p2m multiplies (split_bf16 of
 * the same fp32 values), W row-major and Kd transposed (gdn_scr). */
template <bool SPLIT, typename KAT>
__device__ __forceinline__ static void p1_tail(const gdn_scr &o, KAT kat, const float *Vc,
                                               const float *A, const float *G, const float *Bt,
                                               const float *eG, int L, int dv, int tid) {
  const int C = GDN_C;
  for (int col = tid; col < dv + GK; col += P1_THREADS) {
    float u[GDN_C];
#pragma unroll
    for (int i = 0; i < GDN_C; i++) {
      float x = 0.f;
      if (i < L) {
        x = col < dv ? Bt[i] * Vc[(size_t)i * dv + col] : Bt[i] * eG[i] * kat(i, col - dv);
#pragma unroll
        for (int j = 0; j < i; j++) x -= A[i * (C + 1) + j] * u[j];
      }
      u[i] = x;
    }
    if (col < dv) {
#pragma unroll
      for (int i = 0; i < GDN_C; i++) o.U[(size_t)i * dv + col] = u[i];
    } else if (SPLIT) {
      bf16 *wh = (bf16 *)o.W, *wl = wh + GDN_C * GK;
#pragma unroll
      for (int i = 0; i < GDN_C; i++) {
        bf16 hi, lo;
        split_bf16(u[i], hi, lo);
        wh[i * GK + col - dv] = hi;
        wl[i * GK + col - dv] = lo;
      }
    } else {
#pragma unroll
      for (int i = 0; i < GDN_C; i++) o.W[(size_t)i * GK + col - dv] = u[i];
    }
  }
  float gl = G[L - 1];
  if (SPLIT) { /* transposed: consecutive threads take consecutive rows r */
    bf16 *kh = (bf16 *)o.Kd, *kl = kh + GK * GDN_C;
    for (int idx = tid; idx < C * GK; idx += P1_THREADS) {
      int r = idx % C, a = idx / C;
      bf16 hi, lo;
      split_bf16(kat(r, a) * expf(gl - G[r]), hi, lo);
      kh[idx] = hi;
      kl[idx] = lo;
    }
  } else {
    for (int idx = tid; idx < C * GK; idx += P1_THREADS) {
      int r = idx / GK, a = idx % GK;
      o.Kd[idx] = kat(r, a) * expf(gl - G[r]);
    }
  }
}

/* The end of a phase-2 chunk copy: the block's 32 U columns and G, then the commit. */
__device__ static void p2_fetch_ug(const gdn_scr &q, int dv, int cs, float *Ub, float *Gb,
                                   int tid) {
  for (int idx = tid; idx < GDN_C * 8; idx += P2_THREADS) {
    int r = idx >> 3, c = 4 * (idx & 7);
    cp_async16(Ub + r * 32 + c, q.U + (size_t)r * dv + cs + c);
  }
  if (tid < GDN_C / 4) cp_async16(Gb + 4 * tid, q.G + 4 * tid);
  cp_async_commit();
}

/* Phase 3 (FMA): thread (ti, tc) owns rows 4ti..4ti+3 and columns 4tc..4tc+3 of the block's
 * 64 x P3_COLS output tile. Q and P sit transposed in shared memory (QT [GK][C], PT [C][C]), so
 * every step of both products is two 16-byte loads for 16 FMAs; each output's sums run in the
 * order of the reference (a ascending for Q S, then the e^G scale, then j ascending up to its
 * row for P V'). The transposing stores take one row per lane (no bank conflicts). */
__global__ void __launch_bounds__(P3_THREADS)
    k_gdn_p3(const bf16 *qkv, const int32_t *ch_row, const int32_t *ch_len, int nk, int nv, int dv,
             float *scr, bf16 *out) {
  pdl_enter();
  extern __shared__ __align__(16) float sm3[];
  const int C = GDN_C;
  float *Ss = sm3;               /* [GK][P3_COLS] */
  float *QT = Ss + GK * P3_COLS; /* [GK][C]: QT[a][i] = q_i[a] */
  float *PT = QT + GK * C;       /* [C][C]: PT[j][i] = P[i][j] */
  float *Vs = PT + C * C;        /* [C][P3_COLS] */
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
#pragma unroll 2
  for (int idx = tid; idx < C * (GK / 8); idx += P3_THREADS) {
    int i = idx % C, a = 8 * (idx / C);
    float x[8];
    ld8_bf16(x, qkv + (size_t)(r0 + i) * cd + (size_t)kh * GK + a, i < L);
#pragma unroll
    for (int k = 0; k < 8; k++) QT[(a + k) * C + i] = x[k];
  }
#pragma unroll 2
  for (int idx = tid; idx < C * (C / 4); idx += P3_THREADS) {
    int i = idx % C, j = 4 * (idx / C);
    float4 v = *(const float4 *)(q.P + i * C + j);
    PT[j * C + i] = v.x;
    PT[(j + 1) * C + i] = v.y;
    PT[(j + 2) * C + i] = v.z;
    PT[(j + 3) * C + i] = v.w;
  }
  if (tid < C) Es[tid] = expf(q.G[tid]);
  __syncthreads();
  int tc = tid & (P3_COLS / 4 - 1), ti = tid / (P3_COLS / 4), i0 = 4 * ti, c0 = 4 * tc;
  float acc[4][4];
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int k = 0; k < 4; k++) acc[r][k] = 0.f;
#pragma unroll 4
  for (int a = 0; a < GK; a++) {
    float4 s4 = *(const float4 *)(Ss + a * P3_COLS + c0), q4 = *(const float4 *)(QT + a * C + i0);
    float sv[4] = {s4.x, s4.y, s4.z, s4.w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int k = 0; k < 4; k++) acc[r][k] += qv[r] * sv[k];
  }
#pragma unroll
  for (int r = 0; r < 4; r++) {
    float e = Es[i0 + r];
#pragma unroll
    for (int k = 0; k < 4; k++) acc[r][k] *= e;
  }
  /* P V': j <= i0 is in every row's range, j = i0 + 1 .. i0 + 3 only in the later rows' */
  for (int j = 0; j <= i0 + 3; j++) {
    float4 p4 = *(const float4 *)(PT + j * C + i0), v4 = *(const float4 *)(Vs + j * P3_COLS + c0);
    float pv[4] = {p4.x, p4.y, p4.z, p4.w}, vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int r = 0; r < 4; r++)
      if (j <= i0 + r) {
#pragma unroll
        for (int k = 0; k < 4; k++) acc[r][k] += pv[r] * vv[k];
      }
  }
#pragma unroll
  for (int r = 0; r < 4; r++) {
    int i = i0 + r;
    if (i < L) {
      bf16 *o = out + (size_t)(r0 + i) * ow + (size_t)h * dv + cs + c0;
#pragma unroll
      for (int k = 0; k < 4; k++) o[k] = f2bf(acc[r][k]);
    }
  }
}

/* ---- chunk-parallel prefill: phases 1 and 2 on tensor cores ---- */

#define GKB                                                                                        \
  (GK + 8)             /* bf16 row stride of 128-wide tiles: 68 words, fragment loads hit 32 banks \
                        */
#define CB (GDN_C + 8) /* bf16 row stride of 64-wide tiles: 36 words, likewise */

/* two adjacent bf16 (the lower index in the low half) as one register */
__device__ __forceinline__ uint32_t ld_b2(const bf16 *p) { return *(const uint32_t *)p; }
/* the A fragment of the 16x16 tile at p (row-major, row stride `ld` bf16) */
__device__ __forceinline__ void ld_afrag(uint32_t a[4], const bf16 *p, int ld, int gq, int tq) {
  const bf16 *r = p + gq * ld + 2 * tq;
  a[0] = ld_b2(r);
  a[1] = ld_b2(r + 8 * ld);
  a[2] = ld_b2(r + 8);
  a[3] = ld_b2(r + 8 * ld + 8);
}
__device__ __forceinline__ uint32_t pack_b2(bf16 lo_idx, bf16 hi_idx) {
  return (uint32_t)__bfloat16_as_ushort(lo_idx) | ((uint32_t)__bfloat16_as_ushort(hi_idx) << 16);
}

static size_t p1m_smem(int dv) {
  return (size_t)2 * GDN_C * GKB * sizeof(bf16) +
         ((size_t)GDN_C * dv + GDN_C * (GDN_C + 1) + 3 * GDN_C) * sizeof(float);
}
/* Value widths up to P1M_PAIR_DV run k_gdn_p1m two blocks per SM: 128 registers per thread
 * (the forward substitution's column then spills ~460 bytes) and 84 KB of shared memory at
 * dv = 128: faster at prefill on the H200 than one block per SM (222 registers). Wider values
 * keep one block (their shared memory allows no second one). The same arithmetic either way. */
#define P1M_PAIR_DV 128

/* Phase 1 with P = Q K^T and K K^T on tensor cores: q and k are bf16 values, so the products
 * are exact and only the summation order differs from an FMA loop. Warp w computes row tile
 * mi = w/2 (rows 16mi..16mi+15) of Q K^T (w even) or K K^T (w odd), column tiles of 8 up to
 * the diagonal, then applies the decays and masks and writes the whole row tile (zeros above
 * the diagonal and for rows >= L). The rest (gates, forward substitution) is p1_tail. */
template <int MINB, bool SPLIT>
__global__ void __launch_bounds__(P1_THREADS, MINB)
    k_gdn_p1m(const bf16 *qkv, const float *beta, const float *g, const int32_t *ch_row,
              const int32_t *ch_len, int nk, int nv, int dv, float *scr) {
  pdl_enter();
  extern __shared__ __align__(16) float sm1m[];
  const int C = GDN_C;
  bf16 *Qb = (bf16 *)sm1m, *Kb = Qb + C * GKB; /* [C][GKB] */
  float *Vc = (float *)(Kb + C * GKB), *A = Vc + (size_t)C * dv, *G = A + C * (C + 1), *Bt = G + C,
        *eG = Bt + C;
  int ch = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  int kh = h / (nv / nk);
  int r0 = ch_row[ch], L = ch_len[ch];
  size_t cd = 2 * (size_t)nk * GK + (size_t)nv * dv;
  gdn_scr o = scr_at(scr, ch, nv, h, dv);
#pragma unroll 4
  for (int idx = tid; idx < C * (GK / 8); idx += P1_THREADS) {
    int r = idx / (GK / 8), a = 8 * (idx % (GK / 8));
    const bf16 *row = qkv + (size_t)(r0 + r) * cd;
    uint4 ku = make_uint4(0u, 0u, 0u, 0u), qu = ku;
    if (r < L) {
      ku = *(const uint4 *)(row + (size_t)(nk + kh) * GK + a);
      qu = *(const uint4 *)(row + (size_t)kh * GK + a);
    }
    *(uint4 *)(Kb + r * GKB + a) = ku;
    *(uint4 *)(Qb + r * GKB + a) = qu;
  }
  for (int idx = tid; idx < C * (dv / 8); idx += P1_THREADS) {
    int r = idx / (dv / 8), a = 8 * (idx % (dv / 8));
    ld8_bf16(Vc + (size_t)r * dv + a,
             qkv + (size_t)(r0 + r) * cd + 2 * (size_t)nk * GK + (size_t)h * dv + a, r < L);
  }
  p1_gates(beta, g, r0, L, nv, h, tid, Bt, G, eG, o.G);
  {
    int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    int mi = warp >> 1, isA = warp & 1, nt = 2 * mi + 2;
    const bf16 *Ab = isA ? Kb : Qb;
    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[n][e] = 0.f;
    if (16 * mi < L) {
#pragma unroll 2
      for (int k0 = 0; k0 < GK; k0 += 16) {
        uint32_t a[4];
        ld_afrag(a, Ab + 16 * mi * GKB + k0, GKB, gq, tq);
#pragma unroll
        for (int n = 0; n < 8; n++)
          if (n < nt) {
            const bf16 *br = Kb + (8 * n + gq) * GKB + k0 + 2 * tq;
            mma_bf16(acc[n], a, ld_b2(br), ld_b2(br + 8));
          }
      }
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        int i = 16 * mi + gq + 8 * hh, j = 8 * n + 2 * tq;
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
          int jj = j + e;
          float x = 0.f;
          if (i < L && jj <= i && !(isA && jj == i)) {
            float ex = expf(G[i] - G[jj]);
            x = isA ? Bt[i] * acc[n][2 * hh + e] * ex : acc[n][2 * hh + e] * ex;
          }
          v[e] = x;
        }
        if (isA) {
          A[i * (C + 1) + j] = v[0];
          A[i * (C + 1) + j + 1] = v[1];
        } else {
          *(float2 *)(o.P + i * C + j) = make_float2(v[0], v[1]);
        }
      }
  }
  __syncthreads();
  /* k as read (bf16 values, exact in fp32): no fp32 copy needed */
  p1_tail<SPLIT>(
      o, [&](int r, int a) { return bf2f(Kb[r * GKB + a]); }, Vc, A, G, Bt, eG, L, dv, tid);
}

static size_t p2m_smem(void) {
  return ((size_t)4 * GDN_C * GKB + 4 * GK * CB + 2 * 32 * GKB + 2 * 32 * CB) * sizeof(bf16) +
         ((size_t)2 * GDN_C * 32 + 2 * GDN_C) * sizeof(float);
}

/* k_gdn_p2m's copies of one chunk into buffer set b: W's hi / lo halves [2][C][GKB], Kd^T's
 * [2][GK][CB] (phase 1 wrote them split, gdn_scr), the block's U columns and G. */
__device__ static void p2m_fetch(const gdn_scr &q, int dv, int cs, bf16 *Wb, bf16 *Kb, float *Ub,
                                 float *Gb, int tid) {
  const bf16 *w = (const bf16 *)q.W, *k = (const bf16 *)q.Kd;
  for (int idx = tid; idx < 2 * GDN_C * (GK / 8); idx += P2_THREADS) {
    int r = idx / (GK / 8), a = 8 * (idx % (GK / 8));
    cp_async16(Wb + r * GKB + a, w + (size_t)r * GK + a);
  }
  for (int idx = tid; idx < 2 * GK * (GDN_C / 8); idx += P2_THREADS) {
    int r = idx / (GDN_C / 8), j = 8 * (idx % (GDN_C / 8));
    cp_async16(Kb + r * CB + j, k + (size_t)r * GDN_C + j);
  }
  p2_fetch_ug(q, dv, cs, Ub, Gb, tid);
}

/* Phase 2 on tensor cores, grid (prefill piece, value head, dv/32), cp.async double buffering
 * of W, Kd, U, G. The block's state slice S [128][32] lives in
 * registers as mma accumulators: warp w owns rows 16w..16w+15 (4 tiles of 16x8). Per chunk:
 *   the state goes to scratch (phase 3) and, split into hi/lo, transposed to shared memory;
 *   V' = U - W S: warp w computes rows 16(w%4).., columns 16(w/4).. (W's fragments loaded as
 *   phase 1 split them); V' goes to scratch and, split, transposed to shared;
 *   S <- e^(G_last) S + Kd^T V' in the accumulators (Kd^T's fragments likewise).
 * Every product is the 3-term hi/lo one. W and Kd arrive split (p1_tail<true>): the split
 * was the larger part of this kernel's instructions, done again by each of the dv/32 blocks. */
__global__ void __launch_bounds__(P2_THREADS)
    k_gdn_p2m(float *ssm, const int32_t *ids, const int32_t *seq_pos, const int32_t *seq_slot,
              const int32_t *pre_ch0, const int32_t *ch_len, int nv, int dv, float *scr) {
  pdl_enter();
  extern __shared__ __align__(16) float sm2m[];
  const int C = GDN_C;
  bf16 *W0 = (bf16 *)sm2m;                              /* W hi, lo [2][C][GKB] x 2 */
  bf16 *K0 = W0 + 4 * C * GKB;                          /* Kd^T hi, lo [2][GK][CB] x 2 */
  float *U0 = (float *)(K0 + 4 * GK * CB);              /* U [C][32] x 2 */
  float *G0 = U0 + 2 * C * 32;                          /* G [C] x 2 */
  bf16 *Sh = (bf16 *)(G0 + 2 * C), *Sl = Sh + 32 * GKB; /* S^T [32][GKB] */
  bf16 *Vh = Sl + 32 * GKB, *Vl = Vh + 32 * CB;         /* V'^T [32][CB] */
  int bx = blockIdx.x, h = blockIdx.y, cs = blockIdx.z * 32, tid = threadIdx.x;
  int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  int s = ids[bx];
  float *S = ssm + ((size_t)seq_slot[s] * nv + h) * (size_t)GK * dv;
  int zero = seq_pos[s] == 0;
  int c0 = pre_ch0[bx], c1 = pre_ch0[bx + 1];
  p2m_fetch(scr_at(scr, c0, nv, h, dv), dv, cs, W0, K0, U0, G0, tid);
  /* st[n][2hh+e] = S[16 warp + gq + 8hh][8n + 2tq + e] */
  float st[4][4];
#pragma unroll
  for (int n = 0; n < 4; n++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float2 v = make_float2(0.f, 0.f);
      if (!zero)
        v = *(const float2 *)(S + (size_t)(16 * warp + gq + 8 * hh) * dv + cs + 8 * n + 2 * tq);
      st[n][2 * hh] = v.x;
      st[n][2 * hh + 1] = v.y;
    }
  int mi = warp & 3, nb = 2 * (warp >> 2); /* (a): rows 16mi.., column tiles nb, nb+1 */
  for (int ch = c0; ch < c1; ch++) {
    int b = (ch - c0) & 1, L = ch_len[ch];
    gdn_scr q = scr_at(scr, ch, nv, h, dv);
    if (ch + 1 < c1) {
      int n = b ^ 1;
      p2m_fetch(scr_at(scr, ch + 1, nv, h, dv), dv, cs, W0 + n * 2 * C * GKB, K0 + n * 2 * GK * CB,
                U0 + n * C * 32, G0 + n * C, tid);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    const bf16 *Wh = W0 + b * 2 * C * GKB, *Wl = Wh + C * GKB;
    const bf16 *Kh = K0 + b * 2 * GK * CB, *Kl = Kh + GK * CB;
    const float *Us = U0 + b * C * 32;
    /* the state before this chunk: to scratch for phase 3, and split into S^T */
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        int a = 16 * warp + gq + 8 * hh, c = 8 * n + 2 * tq;
        *(float2 *)(q.S + (size_t)a * dv + cs + c) = make_float2(st[n][2 * hh], st[n][2 * hh + 1]);
#pragma unroll
        for (int e = 0; e < 2; e++) {
          bf16 hi, lo;
          split_bf16(st[n][2 * hh + e], hi, lo);
          Sh[(c + e) * GKB + a] = hi;
          Sl[(c + e) * GKB + a] = lo;
        }
      }
    __syncthreads();
    /* (a) V' = U - W S */
    {
      float acc[2][4];
#pragma unroll
      for (int nn = 0; nn < 2; nn++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nn][e] = 0.f;
#pragma unroll 2
      for (int k0 = 0; k0 < GK; k0 += 16) {
        uint32_t wh[4], wl[4];
        ld_afrag(wh, Wh + 16 * mi * GKB + k0, GKB, gq, tq);
        ld_afrag(wl, Wl + 16 * mi * GKB + k0, GKB, gq, tq);
#pragma unroll
        for (int nn = 0; nn < 2; nn++) {
          int off = (8 * (nb + nn) + gq) * GKB + k0 + 2 * tq;
          uint32_t sh0 = ld_b2(Sh + off), sh1 = ld_b2(Sh + off + 8);
          mma_bf16(acc[nn], wh, sh0, sh1);
          mma_bf16(acc[nn], wh, ld_b2(Sl + off), ld_b2(Sl + off + 8));
          mma_bf16(acc[nn], wl, sh0, sh1);
        }
      }
#pragma unroll
      for (int nn = 0; nn < 2; nn++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          int j = 16 * mi + gq + 8 * hh, c = 8 * (nb + nn) + 2 * tq;
          float v0 = Us[j * 32 + c] - acc[nn][2 * hh],
                v1 = Us[j * 32 + c + 1] - acc[nn][2 * hh + 1];
          *(float2 *)(q.U + (size_t)j * dv + cs + c) = make_float2(v0, v1); /* V' for phase 3 */
          bf16 hi, lo;
          split_bf16(v0, hi, lo);
          Vh[c * CB + j] = hi;
          Vl[c * CB + j] = lo;
          split_bf16(v1, hi, lo);
          Vh[(c + 1) * CB + j] = hi;
          Vl[(c + 1) * CB + j] = lo;
        }
    }
    __syncthreads();
    /* (c) S <- e^(G_last) S + Kd^T V' */
    {
      float egl = expf(G0[b * C + L - 1]);
#pragma unroll
      for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[n][e] *= egl;
#pragma unroll
      for (int k0 = 0; k0 < C; k0 += 16) {
        /* A = Kd^T, rows 16 warp.. (a), columns k0.. (j) */
        uint32_t kh[4], kl[4];
        ld_afrag(kh, Kh + 16 * warp * CB + k0, CB, gq, tq);
        ld_afrag(kl, Kl + 16 * warp * CB + k0, CB, gq, tq);
#pragma unroll
        for (int n = 0; n < 4; n++) {
          int off = (8 * n + gq) * CB + k0 + 2 * tq;
          uint32_t vh0 = ld_b2(Vh + off), vh1 = ld_b2(Vh + off + 8);
          mma_bf16(st[n], kh, vh0, vh1);
          mma_bf16(st[n], kh, ld_b2(Vl + off), ld_b2(Vl + off + 8));
          mma_bf16(st[n], kl, vh0, vh1);
        }
      }
    }
    __syncthreads(); /* buffer set b and the S^T / V'^T tiles are rewritten next */
  }
#pragma unroll
  for (int n = 0; n < 4; n++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
      *(float2 *)(S + (size_t)(16 * warp + gq + 8 * hh) * dv + cs + 8 * n + 2 * tq) =
          make_float2(st[n][2 * hh], st[n][2 * hh + 1]);
}

/* The chunk-parallel path; returns 0 when the shape is not covered. */
static int gdn_prefill2(cuda_ctx *c, float *ssm, const bf16 *qkv, const float *beta, const float *g,
                        int nk, int nv, int dk, int dv, bf16 *out) {
  if (dk != GK || dv % P3_COLS || dv > 256 || c->b.n_chunks <= 0) return 0;
  /* on every call: an attribute holds for the current device only, and ranks use several */
  cudaFuncSetAttribute(k_gdn_p3, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p3_smem());
  cudaFuncSetAttribute(k_gdn_p1m<1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       (int)p1m_smem(256));
  cudaFuncSetAttribute(k_gdn_p1m<2, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       (int)p1m_smem(P1M_PAIR_DV));
  cudaFuncSetAttribute(k_gdn_p2m, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p2m_smem());
  float *scr = (float *)cuda_scratch(c, (size_t)c->b.n_chunks * nv * p1_per(dv) * sizeof(float));
  if (!scr) return 1;
  dim3 g1(c->b.n_chunks, nv);
  /* phase 1 writes W and Kd split (bf16 hi / lo) for phase 2; two blocks per SM up to
   * P1M_PAIR_DV */
  if (dv <= P1M_PAIR_DV)
    k_gdn_p1m<2, true><<<g1, P1_THREADS, p1m_smem(dv), c->st>>>(qkv, beta, g, c->b.ch_row,
                                                                c->b.ch_len, nk, nv, dv, scr);
  else
    k_gdn_p1m<1, true><<<g1, P1_THREADS, p1m_smem(dv), c->st>>>(qkv, beta, g, c->b.ch_row,
                                                                c->b.ch_len, nk, nv, dv, scr);
  cuda_check_launch(c, "gdn_prefill (chunks)");
  dim3 g2(c->b.n_prefill, nv, dv / 32);
  k_gdn_p2m<<<g2, P2_THREADS, p2m_smem(), c->st>>>(
      ssm, c->b.prefill_ids, c->b.seq_pos, c->b.seq_slot, c->b.pre_ch0, c->b.ch_len, nv, dv, scr);
  cuda_check_launch(c, "gdn_prefill (scan)");
  dim3 g3(c->b.n_chunks, nv, dv / P3_COLS);
  k_gdn_p3<<<g3, P3_THREADS, p3_smem(), c->st>>>(qkv, c->b.ch_row, c->b.ch_len, nk, nv, dv, scr,
                                                 out);
  cuda_check_launch(c, "gdn_prefill (outputs)");
  return 1;
}

extern "C" void cuda_gdn_prefill(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                                 backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
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
  cudaFuncSetAttribute(k_gdn_prefill, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
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
