/* cuda_elem — the row-wise and elementwise kernels: embed, rmsnorm (+ residual add), add,
 * sigmoid_mul, swiglu, qk_norm_rope, gdn_gates, gated_rmsnorm and the logits row gather+norm.
 * Activations are bf16; every reduction is fp32 in a fixed order that depends only on the row
 * (one block per row or head), so a row's result never depends on the batch. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

CUDA_KTRACE_TU(cuda_elem_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

static const float *wf32(cuda_ctx *c, backend_weight w, const char *op) {
  if (!w || !CW(w)->f32) {
    cuda_fail(c, op, "1-D weight missing or uploaded with rows != 1");
    return NULL;
  }
  return CW(w)->f32;
}

/* ---- embed ---- */

__global__ void k_embed(const int32_t *tokens, const bf16 *E, int64_t V, int H, bf16 *out) {
  pdl_enter();
  int t = blockIdx.x;
  int id = tokens[t];
  bf16 *o = out + (int64_t)t * H;
  if (id < 0 || id >= V) { /* out of range ids give zeros (the forward pass validates ids) */
    for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = f2bf(0.f);
    return;
  }
  const bf16 *e = E + (int64_t)id * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = e[i];
}

extern "C" void cuda_elem_embed(backend *be, backend_weight E, int H, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->b.n_tokens <= 0) return;
  k_embed<<<c->b.n_tokens, 256, 0, c->st>>>(c->b.tokens, CW(E)->bf, CW(E)->rows, H, (bf16 *)out);
  cuda_check_launch(c, "embed");
}

/* ---- rmsnorm ---- */

/* One block per row; the row is held in registers (up to 16 values per thread). */
#define RMS_THREADS 512
#define RMS_PER 16
__global__ void k_rmsnorm(bf16 *x, const bf16 *add, const float *w, int n, float eps, bf16 *y) {
  pdl_enter();
  __shared__ float red[33];
  int64_t t = blockIdx.x;
  bf16 *xr = x + t * n;
  float v[RMS_PER], wv[RMS_PER];
  float ss = 0.f;
#pragma unroll
  for (int r = 0; r < RMS_PER; r++) { /* the weights are loaded before the reduction waits */
    int i = threadIdx.x + r * RMS_THREADS;
    wv[r] = i < n ? w[i] : 0.f;
  }
#pragma unroll
  for (int r = 0; r < RMS_PER; r++) {
    int i = threadIdx.x + r * RMS_THREADS;
    v[r] = 0.f;
    if (i < n) {
      float xv = bf2f(xr[i]);
      if (add) {
        bf16 s = f2bf(xv + bf2f(add[t * n + i]));
        xr[i] = s;
        xv = bf2f(s);
      }
      v[r] = xv;
      ss += xv * xv;
    }
  }
  ss = block_sum(ss, red);
  float rs = rsqrtf(ss / (float)n + eps);
#pragma unroll
  for (int r = 0; r < RMS_PER; r++) {
    int i = threadIdx.x + r * RMS_THREADS;
    if (i < n) y[t * n + i] = f2bf(v[r] * rs * (1.f + wv[r]));
  }
}

/* The same row, 8 elements (16 bytes of x and add, 32 of w) per thread, every load issued
 * before the reduction: one block of n/8 threads (rounded up to a warp) per row, for n % 8 == 0,
 * n <= 8192 and 16-byte aligned operands (every model's rows), where the one-element kernel
 * above is far from bandwidth. INV: only the row's factor
 * rsqrt(mean + eps) into inv[t] (no add, no w, no y). */
template <bool INV>
__global__ void k_rmsnorm8(bf16 *x, const bf16 *add, const float *w, int n, float eps, bf16 *y,
                           float *inv) {
  pdl_enter();
  __shared__ float red[33];
  int64_t t = blockIdx.x;
  int i = threadIdx.x * 8;
  int on = i < n;
  float v[8], wv[8];
  float ss = 0.f;
  if (on) {
    uint4 ux = *(const uint4 *)(x + t * n + i);
    if (!INV) {
      float4 w0 = *(const float4 *)(w + i), w1 = *(const float4 *)(w + i + 4);
      wv[0] = w0.x, wv[1] = w0.y, wv[2] = w0.z, wv[3] = w0.w;
      wv[4] = w1.x, wv[5] = w1.y, wv[6] = w1.z, wv[7] = w1.w;
    }
    bf16x8_to_f32(ux, v);
    if (add) {
      uint4 ua = *(const uint4 *)(add + t * n + i), us;
      float a[8];
      bf16x8_to_f32(ua, a);
      bf16 *sb = (bf16 *)&us;
#pragma unroll
      for (int k = 0; k < 8; k++) {
        sb[k] = f2bf(v[k] + a[k]);
        v[k] = bf2f(sb[k]);
      }
      *(uint4 *)(x + t * n + i) = us;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) ss += v[k] * v[k];
  }
  ss = block_sum(ss, red);
  float rs = rsqrtf(ss / (float)n + eps);
  if (INV) { /* the factor alone (cuda_elem_rmsnorm_inv) */
    if (threadIdx.x == 0) inv[t] = rs;
    return;
  }
  if (on) {
    uint4 uo;
    bf16 *ob = (bf16 *)&uo;
#pragma unroll
    for (int k = 0; k < 8; k++) ob[k] = f2bf(v[k] * rs * (1.f + wv[k]));
    *(uint4 *)(y + t * n + i) = uo;
  }
}

/* inv[t] = rsqrt(mean(x[t, :]^2) + eps) for t < T, k_rmsnorm8's sums (the factor it applies);
 * the caller checks n % 8 == 0, n <= 8192 and 16-byte alignment. */
void cuda_elem_rmsnorm_inv(cuda_ctx *c, const bf16 *x, int T, int n, float eps, float *inv) {
  unsigned th = (unsigned)((n / 8 + 31) / 32 * 32);
  k_rmsnorm8<true><<<T, th, 0, c->st>>>((bf16 *)x, NULL, NULL, n, eps, NULL, inv);
  cuda_check_launch(c, "rmsnorm (factor)");
}

extern "C" void cuda_elem_rmsnorm(backend *be, backend_buf x, backend_buf add, backend_weight w,
                                  int T, int n, float eps, backend_buf y) {
  cuda_ctx *c = cuda_ctx_of(be);
  const float *wf = wf32(c, w, "rmsnorm");
  if (!wf || T <= 0) return;
  if (n > RMS_THREADS * RMS_PER) {
    cuda_fail(c, "rmsnorm", "row wider than 8192");
    return;
  }
  if (n % 8 == 0 && n / 8 <= 1024 &&
      !(((uintptr_t)x | (uintptr_t)add | (uintptr_t)y | (uintptr_t)wf) & 15)) {
    unsigned th = (unsigned)((n / 8 + 31) / 32 * 32);
    k_rmsnorm8<false>
        <<<T, th, 0, c->st>>>((bf16 *)x, (const bf16 *)add, wf, n, eps, (bf16 *)y, NULL);
  } else {
    k_rmsnorm<<<T, RMS_THREADS, 0, c->st>>>((bf16 *)x, (const bf16 *)add, wf, n, eps, (bf16 *)y);
  }
  cuda_check_launch(c, "rmsnorm");
}

/* ---- elementwise ---- */

__global__ void k_ew(bf16 *x, const bf16 *y, size_t n, int op, bf16 *out) {
  pdl_enter();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float a = bf2f(x[i]), b = bf2f(y[i]);
    if (op == 0)
      x[i] = f2bf(a + b);
    else if (op == 1)
      x[i] = f2bf(a * sigmoidf_dev(b));
    else
      out[i] = f2bf(siluf_dev(a) * b);
  }
}

/* The same per-element expressions, 8 elements (16 bytes) per thread and step: for n % 8 == 0
 * and 16-byte aligned operands (every activation buffer of the model). */
__global__ void k_ew8(bf16 *x, const bf16 *y, size_t n8, int op, bf16 *out) {
  pdl_enter();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
       i += (size_t)gridDim.x * blockDim.x) {
    uint4 ux = ((const uint4 *)x)[i], uy = ((const uint4 *)y)[i], uo;
    const bf16 *a = (const bf16 *)&ux, *b = (const bf16 *)&uy;
    bf16 *o = (bf16 *)&uo;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      float av = bf2f(a[k]), bv = bf2f(b[k]);
      o[k] = op == 0   ? f2bf(av + bv)
             : op == 1 ? f2bf(av * sigmoidf_dev(bv))
                       : f2bf(siluf_dev(av) * bv);
    }
    ((uint4 *)(op == 2 ? out : x))[i] = uo;
  }
}

static int ew_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

static void ew(backend *be, backend_buf x, backend_buf y, size_t n, int op, backend_buf out,
               const char *what) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (!n) return;
  if (n % 8 == 0 && ew_aligned(x) && ew_aligned(y) && (op != 2 || ew_aligned(out)))
    k_ew8<<<cuda_blocks(n / 8, 256), 256, 0, c->st>>>((bf16 *)x, (const bf16 *)y, n / 8, op,
                                                      (bf16 *)out);
  else
    k_ew<<<cuda_blocks(n, 256), 256, 0, c->st>>>((bf16 *)x, (const bf16 *)y, n, op, (bf16 *)out);
  cuda_check_launch(c, what);
}

extern "C" void cuda_elem_add(backend *be, backend_buf x, backend_buf y, size_t n) {
  ew(be, x, y, n, 0, NULL, "add");
}
extern "C" void cuda_elem_sigmoid_mul(backend *be, backend_buf x, backend_buf gate, size_t n) {
  ew(be, x, gate, n, 1, NULL, "sigmoid_mul");
}
extern "C" void cuda_elem_swiglu(backend *be, backend_buf gate, backend_buf up, size_t n,
                                 backend_buf out) {
  ew(be, gate, up, n, 2, out, "swiglu");
}

/* ---- qk_norm_rope ---- */

/* grid (T, nh + nkv), block = hd rounded up to 32 (hd <= 1024). Head h < nh is a query head
 * (from qg, writing q_out and gate_out), else key head h - nh (in place in k). */
/* The rotary frequency of pair j (the one expression for the kernel and its table). */
__device__ __forceinline__ float rope_inv(double theta, int j, int rot) {
  return (float)(1.0 / pow(theta, (double)(2 * j) / (double)rot));
}

/* tab[j] = rope_inv(theta, j, rot), j < rot / 2: built once per (theta, rot), so the kernel
 * below does not evaluate a double-precision pow per element (slow on the GPU). */
__global__ void k_rope_table(double theta, int rot, float *tab) {
  pdl_enter();
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < rot / 2) tab[j] = rope_inv(theta, j, rot);
}

__global__ void k_qk_norm_rope(const bf16 *qg, bf16 *k, const float *qn, const float *kn,
                               const int32_t *pos, int nh, int nkv, int hd, int rot, double theta,
                               float eps, const float *inv_tab, bf16 *q_out, bf16 *gate_out) {
  extern __shared__ float sh[]; /* [hd] */
  __shared__ float red[33];
  int64_t t = blockIdx.x;
  int h = blockIdx.y, i = threadIdx.x;
  int isq = h < nh;
  const bf16 *src;
  const float *w;
  bf16 *dst;
  if (isq) {
    src = qg + (t * nh + h) * 2 * hd;
    dst = q_out + (t * nh + h) * hd;
    w = qn;
  } else {
    src = k + (t * nkv + (h - nh)) * hd;
    dst = k + (t * nkv + (h - nh)) * hd;
    w = kn;
  }
  int half = rot / 2, j = i < half ? i : i - half;
  /* the norm's weight and the position (no kernel of the step writes them) before the wait,
   * the rotary frequency (k_rope_table may be the kernel before) right after it */
  float wi = i < hd ? 1.f + w[i] : 0.f, pt = (float)pos[t];
  pdl_enter();
  float inv = i < rot ? (inv_tab ? inv_tab[j] : rope_inv(theta, j, rot)) : 0.f;
  if (isq && i < hd) gate_out[(t * nh + h) * hd + i] = src[hd + i];
  float xv = i < hd ? bf2f(src[i]) : 0.f;
  float ss = block_sum(xv * xv, red);
  float r = rsqrtf(ss / (float)hd + eps);
  float y = xv * r * wi;
  if (i < hd) sh[i] = y;
  __syncthreads();
  float o = y;
  if (i < rot) {
    float a = pt * inv;
    float cs = cosf(a), sn = sinf(a);
    if (i < half)
      o = sh[i] * cs - sh[i + half] * sn;
    else
      o = sh[i] * cs + sh[i - half] * sn;
  }
  if (i < hd) dst[i] = f2bf(o);
}

extern "C" void cuda_elem_qk_norm_rope(backend *be, backend_buf qg, backend_buf k,
                                       backend_weight q_norm, backend_weight k_norm, int nh,
                                       int nkv, int hd, int rot, double theta, float eps,
                                       backend_buf q_out, backend_buf gate_out) {
  cuda_ctx *c = cuda_ctx_of(be);
  const float *qn = wf32(c, q_norm, "qk_norm_rope"), *kn = wf32(c, k_norm, "qk_norm_rope");
  if (!qn || !kn || c->b.n_tokens <= 0) return;
  if (hd > 1024 || rot > hd) {
    cuda_fail(c, "qk_norm_rope", "head dim over 1024 or rot > hd");
    return;
  }
  const float *tab = NULL;
  if (c->rope_tab && rot / 2 <= CUDA_ROPE_TAB) {
    if (c->rope_theta != theta || c->rope_rot != rot) {
      k_rope_table<<<(rot / 2 + 127) / 128 + (rot < 2), 128, 0, c->st>>>(theta, rot, c->rope_tab);
      c->rope_theta = theta;
      c->rope_rot = rot;
    }
    tab = c->rope_tab;
  }
  dim3 grid(c->b.n_tokens, nh + nkv);
  int th = (hd + 31) / 32 * 32;
  k_qk_norm_rope<<<grid, th, hd * sizeof(float), c->st>>>((const bf16 *)qg, (bf16 *)k, qn, kn,
                                                          c->b.pos, nh, nkv, hd, rot, theta, eps,
                                                          tab, (bf16 *)q_out, (bf16 *)gate_out);
  cuda_check_launch(c, "qk_norm_rope");
}

/* ---- gdn_gates ---- */

/* grid T, block 256: one warp per q/k head (L2 norm), then the gates. */
__global__ void k_gdn_gates(bf16 *qkv, const bf16 *b, const bf16 *a, const float *A_log,
                            const float *dt_bias, int nk, int nv, int dk, int dv, float *beta,
                            float *g) {
  pdl_enter();
  int64_t t = blockIdx.x;
  int64_t cd = 2 * (int64_t)nk * dk + (int64_t)nv * dv;
  bf16 *row = qkv + t * cd;
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float qs = 1.f / sqrtf((float)dk);
  for (int h = wp; h < 2 * nk; h += nw) {
    bf16 *x = row + (int64_t)h * dk;
    float ss = 0.f;
    for (int i = lane; i < dk; i += 32) {
      float v = bf2f(x[i]);
      ss += v * v;
    }
    ss = warp_sum(ss);
    float inv = 1.f / sqrtf(ss + 1e-6f);
    float sc = h < nk ? qs : 1.f;
    for (int i = lane; i < dk; i += 32) x[i] = f2bf(bf2f(x[i]) * inv * sc);
  }
  for (int h = threadIdx.x; h < nv; h += blockDim.x)
    gdn_gate_vals(bf2f(b[t * nv + h]), bf2f(a[t * nv + h]), A_log[h], dt_bias[h], &beta[t * nv + h],
                  &g[t * nv + h]);
}

extern "C" void cuda_elem_gdn_gates(backend *be, backend_buf qkv, backend_buf b, backend_buf a,
                                    backend_weight A_log, backend_weight dt_bias, int nk, int nv,
                                    int dk, int dv, backend_buf beta, backend_buf g) {
  cuda_ctx *c = cuda_ctx_of(be);
  const float *al = wf32(c, A_log, "gdn_gates"), *db = wf32(c, dt_bias, "gdn_gates");
  if (!al || !db || c->b.n_tokens <= 0) return;
  k_gdn_gates<<<c->b.n_tokens, 256, 0, c->st>>>((bf16 *)qkv, (const bf16 *)b, (const bf16 *)a, al,
                                                db, nk, nv, dk, dv, (float *)beta, (float *)g);
  cuda_check_launch(c, "gdn_gates");
}

/* ---- gated_rmsnorm ---- */

/* One warp per (row, value head). out may alias o: each lane reads its elements before the
 * reduction and writes the same elements after it. */
#define GN_PER 16
__global__ void k_gated_rmsnorm(const bf16 *o, const bf16 *z, const float *w, int64_t rows, int dv,
                                float eps, bf16 *out) {
  pdl_enter();
  int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const bf16 *orow = o + r * dv;
  float v[GN_PER];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < GN_PER; k++) {
    int i = lane + 32 * k;
    v[k] = i < dv ? bf2f(orow[i]) : 0.f;
    ss += v[k] * v[k];
  }
  ss = warp_sum(ss);
  float rs = rsqrtf(ss / (float)dv + eps);
#pragma unroll
  for (int k = 0; k < GN_PER; k++) {
    int i = lane + 32 * k;
    if (i < dv) out[r * dv + i] = f2bf(w[i] * (v[k] * rs) * siluf_dev(bf2f(z[r * dv + i])));
  }
}

/* The same, each lane holding VPL = dv / 32 consecutive elements of o and z (8- or 16-byte
 * loads, both issued before the reduction), for dv of 128 or 256 and aligned operands. */
template <int VPL>
__global__ void k_gated_rmsnorm_v(const bf16 *o, const bf16 *z, const float *w, int64_t rows,
                                  float eps, bf16 *out) {
  pdl_enter();
  constexpr int dv = 32 * VPL;
  int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (r >= rows) return;
  int i0 = lane * VPL;
  float v[VPL], zv[VPL];
  const bf16 *orow = o + r * dv + i0, *zrow = z + r * dv + i0;
  if (VPL == 8) {
    bf16x8_to_f32(*(const uint4 *)orow, v);
    bf16x8_to_f32(*(const uint4 *)zrow, zv);
  } else {
    uint2 uo = *(const uint2 *)orow, uz = *(const uint2 *)zrow;
    const __nv_bfloat162 *ho = (const __nv_bfloat162 *)&uo, *hz = (const __nv_bfloat162 *)&uz;
#pragma unroll
    for (int m = 0; m < 2; m++) {
      float2 a = __bfloat1622float2(ho[m]), b = __bfloat1622float2(hz[m]);
      v[2 * m] = a.x, v[2 * m + 1] = a.y, zv[2 * m] = b.x, zv[2 * m + 1] = b.y;
    }
  }
  union {
    uint4 u;
    bf16 b[8];
  } ob;
  gated_norm_lane<VPL>(v, zv, w + i0, eps, ob.b);
  if (VPL == 8)
    *(uint4 *)(out + r * dv + i0) = ob.u;
  else
    *(uint2 *)(out + r * dv + i0) = make_uint2(ob.u.x, ob.u.y);
}

extern "C" void cuda_elem_gated_rmsnorm(backend *be, backend_buf o, backend_buf z, backend_weight w,
                                        int T, int nv, int dv, float eps, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  const float *wf = wf32(c, w, "gated_rmsnorm");
  if (!wf || T <= 0) return;
  if (dv > 32 * GN_PER) {
    cuda_fail(c, "gated_rmsnorm", "value head dim over 512");
    return;
  }
  int64_t rows = (int64_t)T * nv;
  unsigned blocks = (unsigned)((rows + 7) / 8);
  int al = !(((uintptr_t)o | (uintptr_t)z | (uintptr_t)out) & 15);
  if (al && dv == 128)
    k_gated_rmsnorm_v<4>
        <<<blocks, 256, 0, c->st>>>((const bf16 *)o, (const bf16 *)z, wf, rows, eps, (bf16 *)out);
  else if (al && dv == 256)
    k_gated_rmsnorm_v<8>
        <<<blocks, 256, 0, c->st>>>((const bf16 *)o, (const bf16 *)z, wf, rows, eps, (bf16 *)out);
  else
    k_gated_rmsnorm<<<blocks, 256, 0, c->st>>>((const bf16 *)o, (const bf16 *)z, wf, rows, dv, eps,
                                               (bf16 *)out);
  cuda_check_launch(c, "gated_rmsnorm");
}

/* ---- logits rows ---- */

/* Q: also each row's int16 copy for cuda_greedy.cu (H <= 16 * blockDim.x): xq[i, j] =
 * rint(xn[i, j] / t), t = max_j |xn[i, j]| / 32767 (0 when the row is zero: xq = 0), and
 * xs[i, 0..2] = {t, sum |xn| rounded up past its summation error, 1 when the row is not finite
 * (the bounds then unusable)}. The max and the sum share one block reduction. */
template <bool Q>
__global__ void k_gather_norm(const bf16 *x, const int32_t *out_rows, const float *w, int H,
                              float eps, bf16 *xn, int16_t *xq, float *xs) {
  __shared__ float red[33];
  int i = blockIdx.x;
  if constexpr (!Q) {
    pdl_enter();
    const bf16 *xr = x + (int64_t)out_rows[i] * H;
    float ss = 0.f;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
      float v = bf2f(xr[j]);
      ss = __fmaf_rn(v, v, ss);
    }
    ss = block_sum(ss, red);
    float rs = rsqrtf(ss / (float)H + eps);
    for (int j = threadIdx.x; j < H; j += blockDim.x)
      xn[(int64_t)i * H + j] = f2bf(__fmul_rn(__fmul_rn(bf2f(xr[j]), rs), __fadd_rn(1.f, w[j])));
  } else {
    /* H <= 16 x blockDim: the row's values stay in registers. The step's out row (set before
     * the step) and the norm's weights are read before the wait for the product before. */
    float wv[16], xv[16], ss = 0.f, am = 0.f, as = 0.f;
    const bf16 *xr = x + (int64_t)out_rows[i] * H;
#pragma unroll
    for (int m = 0; m < 16; m++) {
      int j = threadIdx.x + m * blockDim.x;
      wv[m] = j < H ? w[j] : 0.f;
    }
    pdl_enter();
#pragma unroll
    for (int m = 0; m < 16; m++) {
      int j = threadIdx.x + m * blockDim.x;
      xv[m] = j < H ? bf2f(xr[j]) : 0.f;
    }
#pragma unroll
    for (int m = 0; m < 16; m++)
      if (threadIdx.x + m * blockDim.x < H) ss = __fmaf_rn(xv[m], xv[m], ss);
    ss = block_sum(ss, red);
    float rs = rsqrtf(ss / (float)H + eps);
#pragma unroll
    for (int m = 0; m < 16; m++) {
      int j = threadIdx.x + m * blockDim.x;
      if (j < H) {
        bf16 v = f2bf(__fmul_rn(__fmul_rn(xv[m], rs), __fadd_rn(1.f, wv[m])));
        xn[(int64_t)i * H + j] = v;
        xv[m] = bf2f(v);
        am = fmaxf(am, fabsf(xv[m]));
        as += fabsf(xv[m]); /* a NaN or infinity stays in the sum: the flag below */
      } else {
        xv[m] = 0.f;
      }
    }
    __shared__ float rm[32], rsum[32];
    int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
    am = warp_max(am);
    as = warp_sum(as);
    if (lane == 0) rm[wi] = am, rsum[wi] = as;
    __syncthreads();
    am = lane < nw ? rm[lane] : 0.f;
    as = lane < nw ? rsum[lane] : 0.f;
    am = warp_max(am);
    as = warp_sum(as);
    float t = am / 32767.f;
#pragma unroll
    for (int m = 0; m < 16; m++) {
      int j = threadIdx.x + m * blockDim.x;
      if (j < H) {
        float r = t > 0.f ? rintf(xv[m] / t) : 0.f;
        xq[(int64_t)i * H + j] = (int16_t)fminf(fmaxf(r, -32767.f), 32767.f);
      }
    }
    if (threadIdx.x == 0) {
      xs[4 * i] = t;
      xs[4 * i + 1] = __fmul_ru(as, 1.f + (float)H * 1.2e-7f);
      xs[4 * i + 2] = isfinite(as) ? 0.f : 1.f;
    }
  }
}

extern "C" void cuda_elem_gather_norm(backend *be, backend_buf x, backend_weight norm, float eps,
                                      int H, void *xn) {
  cuda_ctx *c = cuda_ctx_of(be);
  const float *wf = wf32(c, norm, "logits");
  if (!wf || c->b.n_out <= 0) return;
  k_gather_norm<false><<<c->b.n_out, 256, 0, c->st>>>((const bf16 *)x, c->b.out_rows, wf, H, eps,
                                                      (bf16 *)xn, NULL, NULL);
  cuda_check_launch(c, "logits");
}

void cuda_elem_gather_norm_q(backend *be, backend_buf x, backend_weight norm, float eps, int H,
                             void *xn, int16_t *xq, float *xs) {
  cuda_ctx *c = cuda_ctx_of(be);
  const float *wf = wf32(c, norm, "logits");
  if (!wf || H > 16 * 256 || c->b.n_out <= 0) return;
  k_gather_norm<true><<<c->b.n_out, 256, 0, c->st>>>((const bf16 *)x, c->b.out_rows, wf, H, eps,
                                                     (bf16 *)xn, xq, xs);
  cuda_check_launch(c, "logits (greedy norm)");
}
