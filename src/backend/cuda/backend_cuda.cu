/* backend_cuda — lifetime, memory, weights and batch metadata of the CUDA backend, and its op
 * table. The products live in cuda_gemm.cu, the decode-step recorder (which owns the op table's
 * entries) in cuda_graph.cu, the op kernels in cuda_elem.cu, cuda_attn.cu, cuda_flash.cu,
 * cuda_gdn.cu, cuda_moe.cu, cuda_greedy.cu and cuda_sample.cu (cuda_ops.h).
 *
 * Everything is enqueued on one stream. Buffers are plain cudaMalloc allocations made by the
 * caller at start-up; the only allocations during steps are the metadata arrays and the
 * scratch buffer, which grow (rarely) when a step is larger than every step before. Weights
 * are kept as bf16 (GEMM operands) plus an fp32 copy of the weights the model uploads as
 * exact (weight_upload_exact: 1-D and conv weights, MoE routers), which the elementwise and
 * routing kernels read. */
#include "backend/cuda/backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_packed.cuh"
#include "backend/cuda/cuda_ops.h"
extern "C" {
#include "backend/kv_share.h"
}

CUDA_KTRACE_TU(cuda_backend_ktrace_bind) /* the kernel-release trace, cuda_ktrace.cu */

/* the packed copies are read by products of one row: at 2 rows they gain nothing, at 4 they
 * lose to the bf16 rows */
#define PACKED_ROWS 1
/* decode rows sharing at least this many positions of KV pages read them once per group */
#define ATTN_SHARED_MIN 256
/* grouped MoE steps of MOE_DEV_MIN .. MOE_DEV_MAX rows on the device-grouped kernels: faster
 * than the per-row kernels from 8 rows, than the per-expert cuBLAS GEMMs up to 512 */
#define MOE_DEV_MIN 8
#define MOE_DEV_MAX 512

/* ---- failures ---- */

void cuda_fail(cuda_ctx *c, const char *what, const char *detail) {
  if (c->failed) return;
  c->failed = 1;
  snprintf(c->err, sizeof c->err, "cuda: %s: %s", what, detail ? detail : "failed");
}

void cuda_check_launch(cuda_ctx *c, const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) cuda_fail(c, what, cudaGetErrorString(e));
  if (c->capturing) {
    cuda_graph_note_launch(c);
    cuda_ktrace_launch(c, what);
  }
}

static int ck(cuda_ctx *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  cuda_fail(c, what, cudaGetErrorString(e));
  return -1;
}

void *cuda_scratch(cuda_ctx *c, size_t bytes) {
  if (bytes <= c->scratch_bytes) return c->scratch;
  if (c->capturing) { /* cannot grow inside a capture: the step runs eagerly instead */
    c->capture_broken = 1;
    return NULL;
  }
  size_t want = bytes + bytes / 4 + (1u << 20);
  cudaStreamSynchronize(c->st);
  cudaFree(c->scratch);
  c->scratch = NULL;
  c->scratch_bytes = 0;
  if (cudaMalloc(&c->scratch, want) != cudaSuccess) {
    cudaGetLastError();
    cuda_fail(c, "scratch", "out of device memory");
    return NULL;
  }
  c->scratch_bytes = want;
  return c->scratch;
}

/* ---- memory ---- */

static size_t cu_kind_size(backend *be, backend_kind kind) {
  if (kind == BACKEND_KIND_KV) return cuda_ctx_of(be)->kv_fp8 ? 1 : 2;
  return kind == BACKEND_KIND_ACT ? 2 : 4;
}

/* FP8 pages: [P, nkv, hd] e4m3 bytes, then [P, nkv] f32 scales (backend.h "Paged K/V") */
static size_t cu_kv_page_bytes(backend *be, int nkv, int hd) {
  size_t rows = (size_t)BACKEND_PAGE_TOKENS * (size_t)nkv;
  return cuda_ctx_of(be)->kv_fp8 ? rows * ((size_t)hd + 4) : rows * (size_t)hd * 2;
}

static backend_buf cu_alloc(backend *be, backend_kind kind, size_t n) {
  void *p = NULL;
  size_t bytes = n * cu_kind_size(be, kind);
  bytes = (bytes + 255) & ~(size_t)255;
  if (!bytes) bytes = 256;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

static void cu_free(backend *be, backend_buf buf) {
  (void)be;
  if (buf) cudaFree(buf);
}

static int cu_write(backend *be, backend_buf dst, size_t off, const void *src, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graph_flush(c);
  if (c->failed || !n) return c->failed ? -1 : 0;
  if (ck(c, cudaMemcpyAsync((char *)dst + off, src, n, cudaMemcpyHostToDevice, c->st), "write"))
    return -1;
  /* the source is the caller's (pageable) memory: wait so it may change after we return */
  return ck(c, cudaStreamSynchronize(c->st), "write");
}

static int cu_read(backend *be, backend_buf src, size_t off, void *dst, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graph_flush(c);
  if (c->failed) return -1;
  if (n && ck(c, cudaMemcpyAsync(dst, (const char *)src + off, n, cudaMemcpyDeviceToHost, c->st),
              "read"))
    return -1;
  if (ck(c, cudaStreamSynchronize(c->st), "read")) return -1;
  return c->failed ? -1 : 0;
}

/* write_start (backend.h): the copy on the stream, from the caller's page-locked memory. */
static int cu_write_start(backend *be, backend_buf dst, size_t off, const void *src, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graph_flush(c);
  if (c->failed || !n) return c->failed ? -1 : 0;
  return ck(c, cudaMemcpyAsync((char *)dst + off, src, n, cudaMemcpyHostToDevice, c->st), "write");
}

/* read_start / read_wait (backend.h): the copy and an event behind it on the stream. */
static int cu_read_start(backend *be, backend_buf src, size_t off, void *dst, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graph_flush(c);
  if (c->failed) return -1;
  int k = c->rd_next;
  c->rd_next = (k + 1) % BACKEND_READS;
  if (n && ck(c, cudaMemcpyAsync(dst, (const char *)src + off, n, cudaMemcpyDeviceToHost, c->st),
              "read"))
    return -1;
  if (ck(c, cudaEventRecord(c->rd_ev[k], c->st), "read")) return -1;
  return k;
}

static int cu_read_wait(backend *be, int ticket, char *err, size_t errlen) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (ticket < 0 || ticket >= BACKEND_READS)
    cuda_fail(c, "read", "bad ticket");
  else {
    cudaError_t e = cudaEventSynchronize(c->rd_ev[ticket]);
    if (e != cudaSuccess) cuda_fail(c, "read", cudaGetErrorString(e));
  }
  if (c->failed) {
    if (err && errlen) snprintf(err, errlen, "%s", c->err);
    return -1;
  }
  return 0;
}

static void cu_copy(backend *be, backend_buf dst, size_t doff, backend_buf src, size_t soff,
                    size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graph_flush(c);
  if (!n) return;
  ck(c,
     cudaMemcpyAsync((char *)dst + doff, (const char *)src + soff, n, cudaMemcpyDeviceToDevice,
                     c->st),
     "copy");
}

static void cu_zero(backend *be, backend_buf buf, size_t off, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graph_flush(c);
  if (!n) return;
  ck(c, cudaMemsetAsync((char *)buf + off, 0, n, c->st), "zero");
}

/* ---- weights ---- */

static uint16_t h_to_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static float h_get(const void *data, dtype dt, size_t i) {
  if (dt == DTYPE_F32) return ((const float *)data)[i];
  uint16_t h = ((const uint16_t *)data)[i];
  return dt == DTYPE_BF16 ? dtype_bf16_to_f32(h) : dtype_f16_to_f32(h);
}

static void cu_weight_free(backend *be, backend_weight w) {
  if (!w) return;
  /* graphs hold this weight's device addresses */
  cuda_graph_flush(cuda_ctx_of(be));
  cuda_graph_clear(cuda_ctx_of(be));
  if (CW(w)->bf) cuda_greedy_forget(cuda_ctx_of(be), CW(w)->bf);
  cudaFree(CW(w)->bf);
  cudaFree(CW(w)->q8);
  cudaFree(CW(w)->s8);
  cudaFree(CW(w)->f32);
  cudaFree(CW(w)->pk);
  cudaFree(CW(w)->pkh);
  free(w);
}

static long long cu_weight_pack(backend *be, backend_weight wh) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_weight *w = CW(wh);
  if (w && w->q8) return cuda_fp8_bf16_copy(c, w);
  if (!w || !w->bf || w->pk || w->f32 || !pk_fits(w->rows, w->cols) || w->rows > INT32_MAX / 2)
    return 0;
  int N = (int)w->rows, K = (int)w->cols;
  size_t pb = pk_bytes(N, K), hb = (size_t)N * 4;
  if (cudaMalloc((void **)&w->pk, pb) != cudaSuccess ||
      cudaMalloc((void **)&w->pkh, hb) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(w->pk);
    w->pk = NULL;
    w->pkh = NULL;
    return -1;
  }
  k_pk_base<<<(unsigned)((N + 7) / 8), 256, 0, c->st>>>(w->bf, N, K, w->pkh);
  size_t pieces = (size_t)N * K / 8;
  k_pk_encode<<<(unsigned)((pieces + 255) / 256), 256, 0, c->st>>>(w->bf, N, K, w->pkh, w->pk);
  if (cudaGetLastError() != cudaSuccess || cudaStreamSynchronize(c->st) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(w->pk);
    cudaFree(w->pkh);
    w->pk = NULL;
    w->pkh = NULL;
    return -1;
  }
  return (long long)(pb + hb);
}

/* fp32 copies: 1-D weights, conv weights, and weights uploaded as exact (MoE routers [E, H]:
 * routing is a discrete choice, its logits are computed from the exact weights) */
static int cu_weight_has_f32(int64_t rows, int64_t cols, int exact) {
  return rows == 1 || cols <= 16 || exact;
}

static size_t cu_weight_size(backend *be, int64_t rows, int64_t cols, int exact) {
  (void)be;
  size_t n = (size_t)(rows * cols);
  return n * 2 + (cu_weight_has_f32(rows, cols, exact) ? n * 4 : 0);
}

static backend_weight cu_weight_upload_as(backend *be, const void *data, dtype dt, int64_t rows,
                                          int64_t cols, int exact) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_weight *w = (cuda_weight *)calloc(1, sizeof *w);
  if (!w) return NULL;
  w->rows = rows;
  w->cols = cols;
  size_t n = (size_t)(rows * cols);
  int small = cu_weight_has_f32(rows, cols, exact);
  if (cudaMalloc((void **)&w->bf, (n ? n : 1) * 2) != cudaSuccess ||
      (small && cudaMalloc((void **)&w->f32, (n ? n : 1) * 4) != cudaSuccess)) {
    cudaGetLastError();
    cu_weight_free(be, w);
    return NULL;
  }
  int rc = 0;
  if (dt == DTYPE_BF16) {
    rc |= cudaMemcpy(w->bf, data, n * 2, cudaMemcpyHostToDevice) != cudaSuccess;
  } else {
    const size_t CH = 1u << 20;
    uint16_t *tmp = (uint16_t *)malloc(CH * 2);
    if (!tmp) rc = 1;
    for (size_t i0 = 0; !rc && i0 < n; i0 += CH) {
      size_t m = n - i0 < CH ? n - i0 : CH;
      for (size_t i = 0; i < m; i++) tmp[i] = h_to_bf16(h_get(data, dt, i0 + i));
      rc |= cudaMemcpy(w->bf + i0, tmp, m * 2, cudaMemcpyHostToDevice) != cudaSuccess;
    }
    free(tmp);
  }
  if (!rc && small) {
    float *tmp = (float *)malloc((n ? n : 1) * 4);
    if (!tmp) rc = 1;
    for (size_t i = 0; !rc && i < n; i++) tmp[i] = h_get(data, dt, i);
    if (!rc) rc |= cudaMemcpy(w->f32, tmp, n * 4, cudaMemcpyHostToDevice) != cudaSuccess;
    free(tmp);
  }
  if (rc) {
    cudaGetLastError();
    cu_weight_free(be, w);
    return NULL;
  }
  (void)c;
  return w;
}

static backend_weight cu_weight_upload(backend *be, const void *data, dtype dt, int64_t rows,
                                       int64_t cols) {
  return cu_weight_upload_as(be, data, dt, rows, cols, 0);
}

static backend_weight cu_weight_upload_exact(backend *be, const void *data, dtype dt, int64_t rows,
                                             int64_t cols) {
  return cu_weight_upload_as(be, data, dt, rows, cols, 1);
}

/* The FP8 weight's bytes as they stay (cuda_fp8.cu streams them in products of few rows). The
 * shared scratch is grown here to the bf16 size of the weight: products of more rows dequantize
 * it there, and a recorded step cannot grow it. */
static backend_weight cu_weight_upload_fp8(backend *be, const uint8_t *q, const float *scale_inv,
                                           int64_t rows, int64_t cols, int bn, int bk) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (bn < 1 || bk < 1 || rows < 1 || cols < 1 || rows > INT32_MAX || cols > INT32_MAX) return NULL;
  cuda_weight *w = (cuda_weight *)calloc(1, sizeof *w);
  if (!w) return NULL;
  w->rows = rows;
  w->cols = cols;
  w->bn = bn;
  w->bk = bk;
  size_t n = (size_t)(rows * cols), ns = (size_t)((rows + bn - 1) / bn * ((cols + bk - 1) / bk));
  if (cudaMalloc((void **)&w->q8, n) != cudaSuccess ||
      cudaMalloc((void **)&w->s8, ns * 4) != cudaSuccess ||
      cudaMemcpy(w->q8, q, n, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(w->s8, scale_inv, ns * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
      !cuda_scratch(c, n * 2)) {
    cudaGetLastError();
    cu_weight_free(be, w);
    return NULL;
  }
  return w;
}

static size_t cu_weight_bytes(backend *be, backend_weight w) {
  (void)be;
  size_t n = (size_t)(CW(w)->rows * CW(w)->cols);
  if (CW(w)->q8)
    return n + (size_t)((CW(w)->rows + CW(w)->bn - 1) / CW(w)->bn *
                        ((CW(w)->cols + CW(w)->bk - 1) / CW(w)->bk)) *
                   4;
  return n * 2 + (CW(w)->f32 ? n * 4 : 0) +
         (CW(w)->pk ? pk_bytes(CW(w)->rows, CW(w)->cols) + (size_t)CW(w)->rows * 4 : 0);
}

/* ---- batch ---- */

/* The step's metadata to the device; keep (set_keep, else NULL): the verify pieces' first keep
 * slots, which take those pieces off the chunked DeltaNet lists. */
static int batch_upload(cuda_ctx *c, const backend_batch *b, const int32_t *keep) {
  cuda_graph_flush(c);
  if (c->failed) return -1;
  size_t T = (size_t)b->n_tokens, S = (size_t)b->n_seqs;
  size_t nch = 0; /* DeltaNet chunks of the prefill pieces, at most */
  for (size_t s = 0; s < S; s++)
    if (b->seq_len[s] > 1) nch += (size_t)b->seq_len[s] / BACKEND_CHUNK + 2;
  /* the page table's row stride is padded to a multiple of 64 pages (1,024 positions), so the
   * layout, and a graph captured against it, stays the same while sequences grow */
  int mpp = (b->max_pages + 63) / 64 * 64;
  /* + the shared-prefix plan: sh_start, sh_ns, sh_members [T] and the groups */
  size_t need = 3 * T + 10 * S + S * (size_t)mpp + (size_t)b->n_out + 2 * nch + 16 + 3 * T + 1 +
                CUDA_SH_GROUPS * CUDA_SH_GROUP_WORDS;
  if (c->meta_pending) {
    cudaEventSynchronize(c->meta_done);
    c->meta_pending = 0;
  }
  if (need > c->meta_cap) {
    size_t cap = need * 2;
    cudaFreeHost(c->h_meta);
    cudaFree(c->d_meta);
    free(c->h_host);
    c->h_meta = c->d_meta = c->h_host = NULL;
    c->meta_cap = 0;
    cuda_graph_clear(c); /* graphs read the old metadata array */
    if (cudaMallocHost((void **)&c->h_meta, cap * 4) != cudaSuccess ||
        cudaMalloc((void **)&c->d_meta, cap * 4) != cudaSuccess ||
        !(c->h_host = (int32_t *)malloc(cap * 4))) {
      cudaGetLastError();
      cuda_fail(c, "set_batch", "out of memory for the batch metadata");
      return -1;
    }
    c->meta_cap = cap;
  }
  int32_t *p = c->h_meta;
  size_t o = 0;
  c->hb = *b;
  cuda_batch *db = &c->b;
  memset(db, 0, sizeof *db);
  db->n_tokens = b->n_tokens;
  db->n_seqs = b->n_seqs;
  db->max_pages = mpp;
  db->n_out = b->n_out;
#define TAKE(field, n)                          \
  do {                                          \
    if ((n) > 0 && b->field)                    \
      memcpy(p + o, b->field, (n) * sizeof *p); \
    else if ((n) > 0)                           \
      memset(p + o, 0, (n) * sizeof *p);        \
    c->hb.field = c->h_host + o;                \
    db->field = c->d_meta + o;                  \
    o += (n);                                   \
  } while (0)
  TAKE(tokens, T);
  TAKE(pos, T);
  TAKE(seq, T);
  TAKE(seq_start, S);
  TAKE(seq_len, S);
  TAKE(seq_pos, S);
  TAKE(seq_slot, S);
  for (size_t s = 0; s < S; s++) {
    int32_t *row = p + o + s * (size_t)mpp;
    if (b->page_table)
      memcpy(row, b->page_table + s * (size_t)b->max_pages, (size_t)b->max_pages * 4);
    else
      memset(row, 0, (size_t)b->max_pages * 4);
    for (int j = b->max_pages; j < mpp; j++) row[j] = -1; /* never read */
  }
  c->hb.page_table = c->h_host + o;
  c->hb.max_pages = mpp;
  db->page_table = c->d_meta + o;
  o += S * (size_t)mpp;
  TAKE(out_rows, (size_t)b->n_out);
#undef TAKE
  /* piece lists */
  int np = 0, nd = 0, nv = 0, maxlen = 0, maxend = 0;
  int32_t *pre = p + o, *dec = p + o + S, *ver = p + o + 2 * S;
  for (size_t s = 0; s < S; s++) {
    int len = b->seq_len[s];
    if (len > 1 && keep && keep[s] >= 0)
      ver[nv++] = (int32_t)s;
    else if (len > 1)
      pre[np++] = (int32_t)s;
    else
      dec[nd++] = (int32_t)s;
    if (len > maxlen) maxlen = len;
    if (b->seq_pos[s] + len > maxend) maxend = b->seq_pos[s] + len;
  }
  db->prefill_ids = c->d_meta + o;
  db->decode_ids = c->d_meta + o + S;
  c->h_prefill = c->h_host + o;
  c->h_decode = c->h_host + o + S;
  db->verify_ids = c->d_meta + o + 2 * S;
  o += 3 * S;
  if (keep) {
    memcpy(p + o, keep, S * sizeof *p);
    db->seq_keep = c->d_meta + o;
    o += S;
  }
  /* chunk lists */
  int32_t *chr = p + o, *chl = p + o + nch, *pc0 = p + o + 2 * nch;
  int nc = 0;
  for (int i = 0; i < np; i++) {
    int s = pre[i], len = b->seq_len[s], p0 = b->seq_pos[s], r0 = b->seq_start[s];
    pc0[i] = nc;
    for (int t0 = 0; t0 < len;) {
      int L = BACKEND_CHUNK - (p0 + t0) % BACKEND_CHUNK;
      if (L > len - t0) L = len - t0;
      chr[nc] = r0 + t0;
      chl[nc] = L;
      nc++;
      t0 += L;
    }
  }
  pc0[np] = nc;
  db->n_chunks = nc;
  db->ch_row = c->d_meta + o;
  db->ch_len = c->d_meta + o + nch;
  db->pre_ch0 = c->d_meta + o + 2 * nch;
  o += 2 * nch + (size_t)np + 1;
  db->n_prefill = np;
  db->n_decode = nd;
  db->n_verify = nv;
  db->max_len = maxlen;
  db->max_pos_end = maxend;
  /* the shared-prefix plan (kv_share.h), last: its arrays travel only when the step has a
   * group, and a step with one is a graph layout of its own (graph_begin) */
  if (c->attn_shared && S > c->sh_cap) {
    int64_t *ns_ = (int64_t *)realloc(c->sh_scratch, 2 * S * sizeof *ns_);
    if (ns_) {
      c->sh_scratch = ns_;
      c->sh_cap = S;
    }
  }
  if (c->attn_shared && !c->batch_invariant && nd >= 2 && S <= c->sh_cap) {
    kv_share_group gs[CUDA_SH_GROUPS];
    int32_t *st = p + o, *sn = st + T, *sm = sn + T, *sg = sm + T;
    int ng = kv_share_plan(b, ATTN_SHARED_MIN, CUDA_SH_GROUPS, gs, sm, st, c->sh_scratch);
    if (ng > 0) {
      for (size_t t = 0; t < T; t++) sn[t] = 0;
      sg[0] = ng;
      for (int g = 0; g < ng; g++) {
        int L = gs[g].len;
        int ns = (L + CUDA_SH_SPLIT - 1) / CUDA_SH_SPLIT;
        if (ns > CUDA_SH_MAXS) ns = CUDA_SH_MAXS;
        int per = ((L + ns - 1) / ns + 63) / 64 * 64; /* whole K/V tiles per range */
        ns = (L + per - 1) / per;
        int32_t *w = sg + 1 + g * CUDA_SH_GROUP_WORDS;
        w[0] = gs[g].leader;
        w[1] = gs[g].member_off;
        w[2] = gs[g].n_members;
        w[3] = L;
        w[4] = ns;
        w[5] = per;
        for (int m = 0; m < gs[g].n_members; m++) sn[sm[gs[g].member_off + m]] = ns;
      }
      db->sh_on = 1;
      db->sh_start = c->d_meta + o;
      db->sh_ns = c->d_meta + o + T;
      db->sh_members = c->d_meta + o + 2 * T;
      db->sh_groups = c->d_meta + o + 3 * T;
      o += 3 * T + 1 + (size_t)ng * CUDA_SH_GROUP_WORDS;
    }
  }
  memcpy(c->h_host, p, o * 4);
  if (o && ck(c, cudaMemcpyAsync(c->d_meta, p, o * 4, cudaMemcpyHostToDevice, c->st), "set_batch"))
    return -1;
  cudaEventRecord(c->meta_done, c->st);
  /* the rows' tokens from a device buffer: the embedding reads them there (only it reads the
   * tokens; a graph captured so is another layout: the signature holds db->tokens) */
  if (b->tokens_dev) db->tokens = (const int32_t *)b->tokens_dev;
  c->meta_pending = 1;
  cuda_graph_begin(c);
  return 0;
}

static int cu_set_batch(backend *be, const backend_batch *b) {
  return batch_upload(cuda_ctx_of(be), b, NULL);
}

/* The batch again with its verify pieces marked: a speculating step waits on the previous
 * step's tokens before it is issued, so the second upload finds the stream idle. */
static int cu_set_keep(backend *be, const int32_t *seq_keep) {
  cuda_ctx *c = cuda_ctx_of(be);
  if (c->failed) return -1;
  backend_batch b = c->hb;
  return batch_upload(c, &b, seq_keep);
}

static int cu_sync(backend *be, char *err, size_t errlen) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_graph_flush(c);
  cudaError_t e = cudaStreamSynchronize(c->st);
  if (e != cudaSuccess) cuda_fail(c, "sync", cudaGetErrorString(e));
  if (c->failed) {
    if (err && errlen) snprintf(err, errlen, "%s", c->err);
    return -1;
  }
  return 0;
}

/* Page-locked host memory: `read` into it is one DMA, no staging through a bounce buffer. */
static void *cu_host_alloc(backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

static void cu_host_free(backend *be, void *p) {
  (void)be;
  if (p) cudaFreeHost(p);
}

extern "C" long backend_cuda_moe_dev_runs(backend *be) { return cuda_ctx_of(be)->moe_dev_runs; }

extern "C" void backend_cuda_attn_launches(backend *be, long out[2]) {
  out[0] = cuda_ctx_of(be)->attn_sub_launches;
  out[1] = 0;
}

static void cu_bind(backend *be) { cudaSetDevice(cuda_ctx_of(be)->device); }
static void cu_step_end(backend *be) { cuda_graph_flush(cuda_ctx_of(be)); }

/* Device memory now (the engine's pool sizing, engine_mem_plan_device). */
static int cu_mem_info(backend *be, size_t *free_bytes, size_t *total_bytes) {
  cudaSetDevice(cuda_ctx_of(be)->device);
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}

/* ---- lifetime ---- */

static void cu_destroy(backend *be) {
  if (!be) return;
  cuda_ctx *c = cuda_ctx_of(be);
  if (c) {
    cuda_graph_flush(c);
    if (c->st) cudaStreamSynchronize(c->st);
    cuda_comm_release(c);
    cuda_ktrace_release(c);
    cuda_graph_release(c);
    cuda_moe_release(c);
    cuda_sgemm_release(c);
    cuda_gdn_chain_release(c);
    cuda_greedy_forget(c, NULL);
    cudaFree(c->am_v);
    cudaFree(c->am_i);
    cudaFree(c->am_cnt);
    cudaFree(c->fold_inv);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->scratch);
    cudaFree(c->rope_tab);
    cudaFreeHost(c->h_meta);
    cudaFree(c->d_meta);
    free(c->h_host);
    if (c->meta_done) cudaEventDestroy(c->meta_done);
    free(c->sh_scratch);
    for (int i = 0; i < BACKEND_READS; i++)
      if (c->rd_ev[i]) cudaEventDestroy(c->rd_ev[i]);
    if (c->st) cudaStreamDestroy(c->st);
    free(c);
  }
  free(be);
}

extern "C" int backend_cuda_available(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n > 0;
}

extern "C" backend *backend_cuda_create(int device, const backend_options *opt, char *err,
                                        size_t errlen) {
  return backend_cuda_create_test(device, opt, NULL, err, errlen);
}

extern "C" backend *backend_cuda_create_test(int device, const backend_options *opt,
                                             const backend_cuda_test *t, char *err, size_t errlen) {
  backend_cuda_test none;
  memset(&none, 0, sizeof none);
  if (!t) t = &none;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    if (err && errlen)
      snprintf(err, errlen, "--device cuda: no CUDA device (%s)",
               e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    cudaGetLastError();
    return NULL;
  }
  if (device < 0 || device >= n) {
    if (err && errlen)
      snprintf(err, errlen, "--device cuda: no CUDA device %d (%d present)", device, n);
    return NULL;
  }
  backend *be = (backend *)calloc(1, sizeof *be);
  cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
  if (!be || !c) {
    free(be);
    free(c);
    if (err && errlen) snprintf(err, errlen, "cannot create the CUDA backend (out of memory)");
    return NULL;
  }
  be->ctx = c;
  c->device = device;
  const char *why = NULL;
  if (cudaSetDevice(device) != cudaSuccess)
    why = "cudaSetDevice failed";
  else if (cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking) != cudaSuccess)
    why = "cannot create a stream";
  else if (cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming) != cudaSuccess)
    why = "cannot create an event";
  for (int i = 0; i < BACKEND_READS && !why; i++)
    if (cudaEventCreateWithFlags(&c->rd_ev[i], cudaEventDisableTiming) != cudaSuccess)
      why = "cannot create an event";
  if (why) {
  } else if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS)
    why = "cuBLAS initialisation failed";
  else if (cublasSetStream(c->blas, c->st) != CUBLAS_STATUS_SUCCESS)
    why = "cuBLAS stream";
  else {
    c->blas_ws_bytes = 32u << 20;
    if (cudaMalloc(&c->blas_ws, c->blas_ws_bytes) != cudaSuccess ||
        cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes) != CUBLAS_STATUS_SUCCESS)
      why = "cuBLAS workspace";
  }
  if (!why && !cuda_scratch(c, 64u << 20)) why = "out of device memory for scratch";
  if (!why && cudaMalloc(&c->rope_tab, CUDA_ROPE_TAB * sizeof(float)) != cudaSuccess)
    why = "out of device memory for the rotary table";
  c->rope_rot = -1;
  if (!why && cuda_sgemm_init(c)) why = "out of device memory for the GEMM workspace";
  if (!why && cuda_gdn_chain_init(c)) why = "out of device memory for the decode-chain counters";
  if (!why && cuda_moe_init(c)) why = "out of memory for the MoE expert tables and router counters";
  if (!why && (cudaMalloc(&c->am_v, ARGMAX_PARTS * sizeof(float)) != cudaSuccess ||
               cudaMalloc(&c->am_i, ARGMAX_PARTS * sizeof(int)) != cudaSuccess ||
               cuda_zeroed_ints(&c->am_cnt, ARGMAX_PARTS)))
    why = "out of device memory for the argmax partials";
  if (!why && cudaMalloc(&c->fold_inv, NORM_FOLD_MAXT * sizeof(float)) != cudaSuccess)
    why = "out of device memory for the norm factors";
  if (!why && cuda_ktrace_init(c)) why = "out of device memory for the kernel trace";
  if (why) {
    cudaGetLastError();
    if (err && errlen) snprintf(err, errlen, "cannot create the CUDA backend: %s", why);
    cu_destroy(be);
    return NULL;
  }
  cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
  c->batch_invariant = opt && opt->batch_invariant;
  c->kv_fp8 = opt && opt->kv_dtype == BACKEND_KV_FP8_E4M3;
  c->gemv_maxt = c->batch_invariant ? GEMV_MAXT : GEMV_MAXT_DEFAULT;
  c->attn_flash = !t->no_attn_flash;
  c->attn_gemm_rows = t->attn_gemm_rows;
  c->attn_shared = !t->no_attn_shared;
  c->packed = t->packed_rows > 0 ? std::min(t->packed_rows, PK_MAXT) : PACKED_ROWS;
  c->norm_fold = !t->no_norm_fold;
  c->moe_grouped = !t->no_moe_grouped;
  c->moe_dev_min = t->moe_dev_all ? 1 : MOE_DEV_MIN;
  c->moe_dev_max = t->moe_cublas ? 0 : MOE_DEV_MAX;
  if (!t->no_graphs && cuda_graph_init(c, be, !t->no_repeat)) {
    if (err && errlen) snprintf(err, errlen, "cannot create the CUDA backend (out of memory)");
    cu_destroy(be);
    return NULL;
  }
  be->name = "cuda";
  be->destroy = cu_destroy;
  be->kind_size = cu_kind_size;
  be->kv_page_bytes = cu_kv_page_bytes;
  be->alloc = cu_alloc;
  be->free = cu_free;
  be->write = cu_write;
  be->read = cu_read;
  be->copy = cu_copy;
  be->zero = cu_zero;
  be->weight_upload = cu_weight_upload;
  be->weight_upload_fp8 = cu_weight_upload_fp8;
  be->weight_upload_exact = cu_weight_upload_exact;
  be->weight_free = cu_weight_free;
  be->weight_bytes = cu_weight_bytes;
  be->weight_size = cu_weight_size;
  be->set_batch = cu_set_batch;
  be->set_keep = cu_set_keep;
  be->read_start = cu_read_start;
  be->write_start = cu_write_start;
  be->read_wait = cu_read_wait;
  be->sync = cu_sync;
  cuda_graph_ops(be); /* the ops, recorded in decode steps */
  be->host_alloc = cu_host_alloc;
  be->host_free = cu_host_free;
  be->mem_info = cu_mem_info;
  be->bind = cu_bind;
  be->step_end = cu_step_end;
  be->weight_pack = cu_weight_pack;
  return be;
}
