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
    int t = (int)(i / C), c = (int)(i % C);
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

__global__ void k_conv_state(const bf16 *x, float *state, const int32_t *seq_start,
                             const int32_t *seq_len, const int32_t *seq_pos,
                             const int32_t *seq_slot, int S, int C, int K) {
  size_t n = (size_t)S * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int s = (int)(i / C), c = (int)(i % C);
    float *st = state + (size_t)seq_slot[s] * C * (K - 1);
    int len = seq_len[s], start = seq_start[s], hs = seq_pos[s] > 0;
    float nw[CONV_MAXK];
    for (int j = 0; j < K - 1; j++) nw[j] = conv_in(x, st, C, K, c, start, len - (K - 1) + j, hs);
    for (int j = 0; j < K - 1; j++) st[(size_t)c * (K - 1) + j] = nw[j];
  }
}

extern "C" void cuda_gdn_conv1d(backend *be, backend_buf conv_state, backend_buf x,
                                backend_weight w, int C, int K, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  int T = c->b.n_tokens;
  if (T <= 0) return;
  if (!CW(w)->f32 || CW(w)->rows * CW(w)->cols != (int64_t)C * K || K < 1 || K > CONV_MAXK) {
    cuda_fail(c, "conv1d", "weight is not [C, K] with K <= 16");
    return;
  }
  k_conv1d<<<cuda_blocks((size_t)T * C, 256), 256, 0, c->st>>>(
      (const bf16 *)x, CW(w)->f32, (const float *)conv_state, c->b.seq, c->b.seq_start,
      c->b.seq_pos, c->b.seq_slot, T, C, K, (bf16 *)out);
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

extern "C" void cuda_gdn_decode(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                                backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->b.n_decode <= 0) return;
  if (nk <= 0 || nv % nk) {
    cuda_fail(c, "gdn_decode", "nv not a multiple of nk");
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

extern "C" void cuda_gdn_prefill(backend *be, backend_buf ssm, backend_buf qkv,
                                 backend_buf beta, backend_buf g, int nk, int nv, int dk, int dv,
                                 backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->b.n_prefill <= 0) return;
  if (nk <= 0 || nv % nk) {
    cuda_fail(c, "gdn_prefill", "nv not a multiple of nk");
    return;
  }
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
