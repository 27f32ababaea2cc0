/* backend — the op table the forward pass (model/qwen35.c) is written against.
 *
 * A backend is a struct of function pointers plus a private context (ggml style). The forward
 * pass never touches activations on the host: it allocates opaque buffers through the table,
 * issues ops in order, and reads results back only through `read`. Two backends exist:
 *
 *   cpu/   the reference: fp32 activations, fp32 math from bf16/f16/f32 weights, a small
 *          pthread pool; bit-exact batch invariance (see "Numerics" below).
 *   cuda/  the fast one: bf16 activations with fp32 accumulation, bf16 KV, fp32 DeltaNet state.
 *
 * Memory kinds. A buffer is allocated with a kind and an element count; the element type of a
 * kind is the backend's business (kind_size says how many bytes one element takes):
 *
 *   BACKEND_KIND_ACT  activations between ops            cpu: f32   cuda: bf16
 *   BACKEND_KIND_KV   the paged K/V pools                cpu: f32   cuda: bf16
 *                     (--kv-cache-dtype fp8: e4m3 bytes on both, with scales; see "Paged K/V")
 *   BACKEND_KIND_F32  recurrent state, gates, logits     f32 everywhere
 *   BACKEND_KIND_I32  integer scratch (router ids, ...)  i32 everywhere
 *
 * Offsets and sizes given to read/write/copy/zero are in BYTES.
 *
 * Ordering. Ops are issued in program order and behave as if executed in that order (the CUDA
 * backend enqueues them on one stream). `read` waits for everything issued before it. Ops
 * return nothing: a device failure is sticky and reported by the next `sync` or `read`.
 *
 * Batch metadata. Once per step the forward pass hands the step's metadata to `set_batch`
 * (the backend copies it: the caller's arrays need not outlive the call). Ops documented as
 * "uses the batch" read the rows' tokens, positions, sequences, pieces, page tables and slots
 * from the last set_batch. Rows of the step are grouped by sequence: piece s is rows
 * [seq_start[s], seq_start[s] + seq_len[s]), at positions seq_pos[s] .. seq_pos[s]+seq_len[s]-1.
 *
 * Paged K/V. One pool per full-attention layer for K and one for V, each
 * [n_pages, P, nkv, hd] of KIND_KV (P = BACKEND_PAGE_TOKENS, 16). Position p of sequence s
 * lives in page page_table[s*max_pages + p/P], row p%P. A page of one pool takes
 * backend_kv_page_bytes(be, nkv, hd) bytes, a multiple of kind_size(KV); pools are allocated
 * as n_pages times that many bytes, and page copies (prefix cache, host tier, checkpoints) move
 * those bytes, which hold everything the page is.
 *
 * FP8 K/V (backend_options.kv_dtype = BACKEND_KV_FP8_E4M3, docs/fp8.md): kind_size(KV) is 1
 * and a page of one pool is [P, nkv, hd] e4m3 bytes followed by [P, nkv] f32 scales, one per
 * (token, kv head). attention writes a row's head h as s = amax / 448 (amax of its hd values;
 * s = 0 for an all-zero row), q_i = e4m3(clamp(x_i * (448 / amax), -448, 448)) rounded to
 * nearest even, and reads it back as e4m3(q_i) * s (one fp32 product), the attention math
 * then as for a K/V of those values.
 *
 * Recurrent state. Per DeltaNet layer one conv pool F32 [n_slots, conv_dim, K-1] (per channel
 * the last K-1 pre-conv inputs, oldest first) and one SSM pool F32 [n_slots, nv, dk, dv]
 * (S[h][i][j]: key dim i, value dim j). Sequence s reads and updates slot seq_slot[s]; a
 * piece with seq_pos == 0 starts from a zero state whatever the slot holds.
 *
 * Verify pieces (speculative decoding; backends with the optional set_keep op only). After
 * set_batch, set_keep(seq_keep) may mark pieces: a piece s with seq_keep[s] = k >= 0 is computed
 * exactly as seq_len[s] one-token pieces of the same sequence in consecutive steps would be: conv1d
 * row by row, and the DeltaNet recurrent step of gdn_decode row by row (gdn_prefill leaves the
 * piece to gdn_decode) — so its rows' outputs are the plain decode rows' bits. Besides, the state
 * after row r < seq_len[s] - 1 is written to slot k + r (conv1d writes the conv window there,
 * gdn_decode the SSM state); the state after the last row goes to seq_slot[s] as for any piece. The
 * slots k .. k + seq_len[s] - 2 must differ from every slot the step reads. The caller that keeps
 * only the first a rows of the piece copies slot k + a - 1 into seq_slot[s]: no row is computed
 * again.
 *
 * Numerics (both backends must honour the first point; the CPU backend all of them):
 *   - batch invariance: a row's outputs depend only on that row (and, for attention, conv and
 *     DeltaNet, its own sequence's earlier tokens and state), never on what else is in the
 *     batch. The CPU backend computes each output element with one loop of fixed order; work is
 *     split across threads only over independent outputs, never inside a reduction;
 *   - DeltaNet: a piece of 1 token runs the recurrent step (gdn_decode); a longer piece runs the
 *     chunked algorithm (gdn_prefill, C = 64) with chunk boundaries at absolute positions that
 *     are multiples of 64, so splitting a sequence at multiples of 64 changes no bit.
 *
 * Shapes below: [rows, cols] row-major; T = n_tokens of the step. Weights are [N, K] as in
 * the checkpoint (PyTorch [out, in]); a 1-D weight is uploaded as rows = 1. */
#ifndef DS_BACKEND_H
#define DS_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/kv_page.h"

typedef struct backend backend;

/* The element type of the paged K/V pools (--kv-cache-dtype). */
typedef enum {
  BACKEND_KV_AUTO = 0,     /* the backend's own: cpu f32, cuda bf16 (auto, bfloat16) */
  BACKEND_KV_FP8_E4M3 = 1, /* e4m3 with a scale per (token, kv head) (fp8, fp8_e4m3) */
} backend_kv_dtype;

/* The choices a user makes about a backend (CLI flags --device, --threads, --batch-invariant,
 * --kv-cache-dtype). */
typedef struct backend_options {
  const char *device;        /* "cpu", "cuda" or "auto" (NULL: auto) */
  int n_threads;             /* CPU backend threads (0: all cores) */
  int batch_invariant;       /* CUDA: a row's bits never depend on the rest of the batch */
  backend_kv_dtype kv_dtype; /* the K/V pools' element type (see "Paged K/V") */
  /* --tensor-parallel-size: ranks, each a backend of its own (backend_create_ranks); 0 or 1:
   * one, the plain backend */
  int tensor_parallel_size;
} backend_options;
typedef void *backend_buf;    /* opaque device buffer (device memory on CUDA) */
typedef void *backend_weight; /* opaque uploaded weight */

typedef enum {
  BACKEND_KIND_ACT = 0,
  BACKEND_KIND_KV = 1,
  BACKEND_KIND_F32 = 2,
  BACKEND_KIND_I32 = 3,
} backend_kind;

#define BACKEND_PAGE_TOKENS KV_PAGE_TOKENS /* base/kv_page.h */
#define BACKEND_KV_FP8_MAX 448.0f          /* the largest finite e4m3 (FP8 K/V scales) */
#define BACKEND_READS 4                    /* read_start tickets outstanding at most */
#define BACKEND_CHUNK 64 /* DeltaNet prefill chunk, aligned to absolute positions */

/* One step's metadata. All arrays are host memory; set_batch copies them. */
typedef struct backend_batch {
  int n_tokens;              /* T: rows of the step */
  int n_seqs;                /* pieces (one per sequence) */
  const int32_t *tokens;     /* [T] token ids */
  const int32_t *pos;        /* [T] absolute position of each row */
  const int32_t *seq;        /* [T] piece index of each row */
  const int32_t *seq_start;  /* [n_seqs] first row; pieces are contiguous and in order */
  const int32_t *seq_len;    /* [n_seqs] >= 1 */
  const int32_t *seq_pos;    /* [n_seqs] position of the piece's first row (tokens cached) */
  const int32_t *seq_slot;   /* [n_seqs] recurrent-state slot */
  const int32_t *page_table; /* [n_seqs, max_pages] page ids; entries past a piece's need unused */
  int max_pages;             /* columns of page_table (>= 1) */
  int n_out;                 /* rows whose logits are wanted */
  const int32_t *out_rows;   /* [n_out] row indices, in output order */
  /* NULL, or an I32 buffer whose first T elements, as the ops issued before this set_batch
   * leave them (a greedy step's ids), are the rows' tokens; `tokens` is then not read */
  backend_buf tokens_dev;
} backend_batch;

/* MoE FFN weights of one layer (see op moe). */
typedef struct backend_moe {
  int n_experts, top_k, norm_topk_prob;
  int inter;                         /* I: expert width */
  int shared_inter;                  /* Is: shared expert width, 0 when absent */
  backend_weight router;             /* [E, H] */
  const backend_weight *gate;        /* [E] of [I, H] */
  const backend_weight *up;          /* [E] of [I, H] */
  const backend_weight *down;        /* [E] of [H, I] */
  backend_weight shared_gate;        /* [Is, H] or NULL */
  backend_weight shared_up;          /* [Is, H] or NULL */
  backend_weight shared_down;        /* [H, Is] or NULL */
  backend_weight shared_expert_gate; /* [1, H] or NULL */
} backend_moe;

struct backend {
  const char *name; /* "cpu", "cuda" */
  void *ctx;        /* private */

  /* ---- lifetime and memory ---- */

  /* Frees everything the backend allocated, then the backend itself. */
  void (*destroy)(backend *be);
  /* Bytes per element of a kind. */
  size_t (*kind_size)(backend *be, backend_kind kind);
  /* Optional (NULL: BACKEND_PAGE_TOKENS * nkv * hd * kind_size(KV)). Bytes of one page of one
   * K or V pool of nkv heads of hd values, scales included (use backend_kv_page_bytes). */
  size_t (*kv_page_bytes)(backend *be, int nkv, int hd);
  /* n elements of `kind`, contents undefined. Returns NULL when out of memory. */
  backend_buf (*alloc)(backend *be, backend_kind kind, size_t n);
  void (*free)(backend *be, backend_buf buf); /* NULL is a no-op */
  /* Host <-> device copies of raw bytes (the buffer's own element type). Both wait for the ops
   * issued before them. Return 0, or -1 on a device failure. */
  int (*write)(backend *be, backend_buf dst, size_t off, const void *src, size_t nbytes);
  int (*read)(backend *be, backend_buf src, size_t off, void *dst, size_t nbytes);
  /* A read that does not wait: queues the copy behind the ops issued so far (and starts them)
   * and returns a ticket >= 0, or -1 on a device failure; dst (host_alloc memory where the
   * backend has host_alloc) holds the bytes once read_wait(ticket) returned 0, which waits for
   * that copy only (ops issued after read_start may still run). At most BACKEND_READS tickets
   * outstanding. Both NULL: not supported. */
  int (*read_start)(backend *be, backend_buf src, size_t off, void *dst, size_t nbytes);
  int (*read_wait)(backend *be, int ticket, char *err, size_t errlen);
  /* A write that does not wait: queues the copy behind the ops issued so far; src (host_alloc
   * memory where the backend has host_alloc) must stay unchanged until a read_wait of a read
   * started after it, or a sync, returned. Returns 0, or -1 on a device failure. NULL: not
   * supported (write). */
  int (*write_start)(backend *be, backend_buf dst, size_t off, const void *src, size_t nbytes);
  /* Device-to-device copy and zero fill of raw bytes (slot and page copies). Regions of one
   * copy do not overlap. */
  void (*copy)(backend *be, backend_buf dst, size_t dst_off, backend_buf src, size_t src_off,
               size_t nbytes);
  void (*zero)(backend *be, backend_buf buf, size_t off, size_t nbytes);

  /* Uploads a row-major weight [rows, cols] of dtype dt (converted as the backend likes: the
   * CPU backend converts bf16/f16 exactly to f32). The host data may be unmapped afterwards.
   * Returns NULL when out of memory. */
  backend_weight (*weight_upload)(backend *be, const void *data, dtype dt, int64_t rows,
                                  int64_t cols);
  /* Optional (NULL: weight_upload). A weight whose products must be exact, such as an MoE
   * router (routing is a discrete choice): the backend also keeps it at full precision. */
  backend_weight (*weight_upload_exact)(backend *be, const void *data, dtype dt, int64_t rows,
                                        int64_t cols);
  /* Optional (NULL: the caller dequantizes the weight and calls weight_upload). A block-scaled
   * FP8 weight kept as FP8, for matmul only: q [rows, cols] e4m3 bytes, scale_inv
   * [ceil(rows/bn), ceil(cols/bk)] F32; element (n, k) is e4m3(q[n, k]) * scale_inv[n/bn][k/bk]
   * (model/fp8.h). The host data may be freed afterwards. Returns NULL when out of memory. */
  backend_weight (*weight_upload_fp8)(backend *be, const uint8_t *q, const float *scale_inv,
                                      int64_t rows, int64_t cols, int bn, int bk);
  void (*weight_free)(backend *be, backend_weight w);    /* NULL is a no-op */
  size_t (*weight_bytes)(backend *be, backend_weight w); /* device bytes it takes */
  /* Optional (NULL: rows * cols * kind_size(ACT)). The device bytes weight_upload (exact:
   * weight_upload_exact) would take for a weight [rows, cols], without uploading it: the
   * engine's memory plan, made before the upload. */
  size_t (*weight_size)(backend *be, int64_t rows, int64_t cols, int exact);
  /* Optional (NULL: no such copy). Lets the backend keep a second copy of a product weight
   * that some products run faster from: the CUDA backend's 12-bit packed copy of a bf16 weight
   * (cuda/cuda_packed.cuh), ~0.75 of the bf16 bytes, that products of few rows (decode steps)
   * stream, with exactly the bf16 weight's bits; of an FP8 weight (weight_upload_fp8), its
   * dequantized bf16 copy, for products of more rows than the FP8 kernels are fastest at.
   * Called after the upload, before the first step. Returns the copy's device bytes, 0 when
   * the weight has no such copy, -1 when out of device memory (nothing kept). */
  long long (*weight_pack)(backend *be, backend_weight w);

  /* Hands over the step's metadata (copied). Returns 0, or -1 on a device failure. */
  int (*set_batch)(backend *be, const backend_batch *b);
  /* Waits for all issued ops. Returns 0, or -1 with one line in err if any failed. */
  int (*sync)(backend *be, char *err, size_t errlen);
  /* Called right after set_batch by a caller that would now issue exactly the ops, with the
   * same arguments, that it issued after the previous set_batch: 1 when the backend runs
   * those ops again against the new batch itself (the caller then issues none of this step's
   * ops), 0 when the caller must issue them. NULL: always 0. */
  int (*step_repeat)(backend *be);

  /* ---- ops ---- */

  /* out[t, :] = E[tokens[t], :].  E [V, H]; out ACT [T, H]. Uses the batch. */
  void (*embed)(backend *be, backend_weight E, int H, backend_buf out);

  /* Zero-centred RMSNorm with optional residual add, over rows of width n:
   *   if add: x[t,:] += add[t,:]                 (x is the residual stream, updated in place)
   *   y[t,i] = x[t,i] * rsqrt(mean_i(x[t,:]^2) + eps) * (1 + w[i])
   * x, add, y ACT [T, n]; w [1, n]. y may not alias x. */
  void (*rmsnorm)(backend *be, backend_buf x, backend_buf add, backend_weight w, int T, int n,
                  float eps, backend_buf y);

  /* x[i] += y[i] for i < n.  ACT. */
  void (*add)(backend *be, backend_buf x, backend_buf y, size_t n);

  /* y[t, j] = sum_k x[t, k] * W[j, k].  x ACT [T, K]; W [N, K]; y ACT [T, N]. */
  void (*matmul)(backend *be, backend_buf x, backend_weight W, int T, int K, int N, backend_buf y);

  /* Gated attention input prep. qg ACT [T, nh*2*hd]: per head hd query values then hd gate
   * values. k ACT [T, nkv*hd] (normalised and rotated in place).
   *   q_out[t, h*hd + i]   = rope(Norm_q(q_h))[i]   with Norm_q zero-centred over hd (q_norm w)
   *   gate_out[t, h*hd + i] = gate_h[i]
   *   k[t, h*hd + i]       = rope(Norm_k(k_h))[i]
   * rope: partial NeoX on the first rot dims at the row's position p (uses the batch):
   *   inv_f_i = theta^(-2i/rot), a = p*inv_f_i, i < rot/2, half = rot/2;
   *   x'[i] = x[i]cos a - x[i+half] sin a,  x'[i+half] = x[i+half]cos a + x[i] sin a;
   *   dims >= rot unchanged.  q_out, gate_out ACT [T, nh*hd]. */
  void (*qk_norm_rope)(backend *be, backend_buf qg, backend_buf k, backend_weight q_norm,
                       backend_weight k_norm, int nh, int nkv, int hd, int rot, double theta,
                       float eps, backend_buf q_out, backend_buf gate_out);

  /* Paged causal GQA attention (uses the batch). First writes every row's k, v into its
   * sequence's pages (k_pool/v_pool KV [n_pages, 16, nkv, hd]), then for each row t of piece s
   * at position p and q head h (kv head h / (nh/nkv)):
   *   out[t, h*hd:] = sum_{j<=p} softmax_j(scale * q.K_j) V_j
   * over the sequence's positions 0..p in position order, softmax in fp32.
   * q ACT [T, nh*hd]; k, v ACT [T, nkv*hd]; out ACT [T, nh*hd]. */
  void (*attention)(backend *be, backend_buf k_pool, backend_buf v_pool, backend_buf q,
                    backend_buf k, backend_buf v, int nh, int nkv, int hd, float scale,
                    backend_buf out);

  /* x[i] *= sigmoid(gate[i]) for i < n.  ACT. */
  void (*sigmoid_mul)(backend *be, backend_buf x, backend_buf gate, size_t n);

  /* out[i] = silu(gate[i]) * up[i] for i < n.  ACT (out may alias gate). */
  void (*swiglu)(backend *be, backend_buf gate, backend_buf up, size_t n, backend_buf out);

  /* Sparse MoE FFN. Per row t:
   *   p = softmax_fp32(router . x_t) over E; top-k of p (ties: lower expert id first), in
   *   descending order; w = p_top / sum(p_top) if norm_topk_prob else p_top;
   *   out_t = sum_k w_k * down_e(silu(gate_e x_t) * up_e x_t)        (k in that order)
   *         + [Is > 0] sigmoid(shared_expert_gate . x_t) * shared_down(silu(..) * ..)
   * x, out ACT [T, H]. */
  void (*moe)(backend *be, backend_buf x, const backend_moe *m, int T, int H, backend_buf out);

  /* Causal depthwise conv + SiLU with conv state (uses the batch). x ACT [T, C] (C = conv_dim,
   * the in_proj_qkv output), w [C, K], conv_state F32 [n_slots, C, K-1]. For row t of piece s:
   *   window = (state of slot seq_slot[s], then rows of the piece before t, then x_t) last K
   *   out[t, c] = silu(sum_j w[c, j] * window[j][c])
   * then the slot's state becomes the last K-1 inputs (state then the piece's rows). Pieces of
   * one token are the decode step. out ACT [T, C]. */
  void (*conv1d)(backend *be, backend_buf conv_state, backend_buf x, backend_weight w, int C, int K,
                 backend_buf out);

  /* DeltaNet gates and q/k normalisation. qkv ACT [T, 2*nk*dk + nv*dv] (the conv output,
   * q | k | v head-major): each q and k head is L2-normalised in place, x/sqrt(sum x^2 + 1e-6),
   * then q *= dk^-1/2. b, a ACT [T, nv]; A_log, dt_bias [1, nv].
   *   beta[t, h] = sigmoid(b[t,h])
   *   g[t, h]    = -exp(A_log[h]) * softplus(a[t,h] + dt_bias[h])   (softplus(x) = x, x > 20)
   * beta, g F32 [T, nv]. */
  void (*gdn_gates)(backend *be, backend_buf qkv, backend_buf b, backend_buf a,
                    backend_weight A_log, backend_weight dt_bias, int nk, int nv, int dk, int dv,
                    backend_buf beta, backend_buf g);

  /* Gated delta rule over the pieces with seq_len > 1 (gdn_prefill) or == 1 (gdn_decode); rows
   * of other pieces are left untouched (uses the batch). Value head h uses key head
   * h / (nv/nk). ssm F32 [n_slots, nv, dk, dv], state of slot seq_slot[s] updated in place.
   * Per token (the recurrence; gdn_decode computes exactly this):
   *   S <- exp(g) S;  d = beta (v - S^T k);  S <- S + k d^T;  o = S^T q
   * gdn_prefill computes the same with the chunked algorithm (qwen35-model.md §3.1, C = 64),
   * chunks aligned to absolute positions (the first chunk of a piece at p ends at the next
   * multiple of 64); within a chunk row i depends only on rows <= i.
   * qkv ACT [T, conv_dim] (normalised by gdn_gates); beta, g F32 [T, nv]; out ACT [T, nv*dv]. */
  void (*gdn_prefill)(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                      backend_buf g, int nk, int nv, int dk, int dv, backend_buf out);
  void (*gdn_decode)(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta, backend_buf g,
                     int nk, int nv, int dk, int dv, backend_buf out);

  /* Gated RMSNorm per value head: o, z ACT [T, nv*dv]; w [1, dv] (plain weight);
   *   out[t, h*dv + i] = w[i] * o_i * rsqrt(mean(o_h^2) + eps) * silu(z[t, h*dv + i])
   * out ACT [T, nv*dv] (may alias o). */
  void (*gated_rmsnorm)(backend *be, backend_buf o, backend_buf z, backend_weight w, int T, int nv,
                        int dv, float eps, backend_buf out);

  /* Logits of the rows out_rows (uses the batch): for i < n_out, t = out_rows[i]:
   *   out[i, :] = W . rmsnorm_zero_centred(x[t, :], norm)
   * x ACT [T, H]; norm [1, H]; W [V, H]; out F32 [n_out, V]. */
  void (*logits)(backend *be, backend_buf x, backend_weight norm, float eps, backend_weight W,
                 int H, int V, backend_buf out);

  /* ---- optional ops (NULL: unsupported; callers fall back) ---- */

  /* Marks the verify pieces of the batch set last (see "Verify pieces" above): seq_keep
   * [n_seqs] host memory, copied: -1 for a plain piece, else the first keep slot k of piece s.
   * Holds until the next set_batch (which clears it). Returns 0, or -1 on a device failure.
   * NULL: no verify pieces (the engine then refuses speculative decoding). */
  int (*set_keep)(backend *be, const int32_t *seq_keep);

  /* Greedy choice over n rows of logits, the sampler's argmax (sampler_argmax): for i < n,
   * ids[i] is the result of the scan  tok = 0; for j in 1..V-1: if x[i, j] > x[i, tok]: tok = j
   * (the first maximum: ties go to the lowest id; NaN never wins; a NaN at j = 0 gives 0).
   * maxv[i] = x[i, ids[i]] when maxv is not NULL.
   * x F32 [n, V]; ids I32 [n]; maxv F32 [n] or NULL. Only ids (and maxv) need cross to the host:
   * the greedy decode step's download shrinks from n * V * 4 bytes to n * 4. */
  void (*argmax)(backend *be, backend_buf x, int n, int V, backend_buf ids, backend_buf maxv);

  /* The greedy step's ids straight from the final hidden rows: ids[i] (i < n_out, the batch's)
   * is exactly what argmax(logits(x, norm, eps, W, H, V)) gives, the logits themselves perhaps
   * never formed (a backend may bound them from a cheaper copy of W and compute only the rows
   * that can win). logits F32 [n_out, V] is scratch the op may use; its contents afterwards are
   * unspecified. NULL: logits, then argmax. */
  void (*logits_argmax)(backend *be, backend_buf x, backend_weight norm, float eps,
                        backend_weight W, int H, int V, backend_buf logits, backend_buf ids);
  /* Sampled ids over n rows of logits by sample_rule.h's rule: for i < n, ids[i] is the token
   * the rule gives for row i of x, edited by its edits, with the parameters of row i of params
   * (SAMPLE_RULE_WORDS int32 each, sample_rule_pack: temperature, top_k, top_p, min_p, the
   * draw's 53 bits, the place of its edits among the SAMPLE_RULE_EDIT_WORDS-word edits that
   * follow the n rows' words; a temperature below SAMPLE_RULE_GREEDY_T is the argmax rule) —
   * exactly the host sampler's token for those logits and that draw (sampler_device_ok
   * requests). x F32 [n, V] is scratch afterwards (its contents unspecified); params I32;
   * ids I32 [n]. */
  void (*sample)(backend *be, backend_buf x, int n, int V, backend_buf params, backend_buf ids);
  /* Lets logits_argmax prepare for W [V, H] once, after its upload (it may keep a derived copy
   * of W in device memory until W is freed). Declining is not a failure (logits_argmax still
   * gives the same ids); -1 with err only when the device failed. NULL: nothing to prepare. */
  int (*logits_argmax_prepare)(backend *be, backend_weight W, int H, int V, char *err,
                               size_t errlen);

  /* Device memory now: *free_bytes available to allocations, *total_bytes of the device.
   * Returns 0, or -1 when unknown. NULL (the CPU backend): no device figure; the engine then
   * sizes its pools from --kv-cache-tokens and its defaults (engine_mem_plan). */
  int (*mem_info)(backend *be, size_t *free_bytes, size_t *total_bytes);

  /* Host memory the backend's `read` and `write` move fastest (page-locked on CUDA); NULL when
   * out of memory. host_free(NULL) is a no-op. Both NULL: use malloc / free. */
  void *(*host_alloc)(backend *be, size_t bytes);
  void (*host_free)(backend *be, void *p);

  /* ---- tensor parallelism (optional; NULL: the backend is one rank alone) ---- */

  /* This rank's part of a sum over the ranks of its communicator (backend_create_ranks,
   * backend/comm.h): every rank issues it with its own x ACT [n] at the same point of the same
   * op sequence; afterwards every rank's x holds x_0 + x_1 + ... + x_{N-1}, added in rank order
   * (the same bits on every rank, whatever the timing). */
  void (*all_reduce_sum)(backend *be, backend_buf x, size_t n);
  /* Makes the calling thread's next calls to be reach be's device (CUDA: cudaSetDevice), for a
   * thread that calls the ranks of a tensor-parallel model in turn. NULL: any thread may call. */
  void (*bind)(backend *be);
  /* This rank's part of a gather over the ranks, issued as all_reduce_sum is: x F32 [n] on every
   * rank; afterwards every rank's out F32 [N * n] holds rank r's x at [r n, (r + 1) n), the same
   * bytes. out may not overlap x. */
  void (*all_gather)(backend *be, backend_buf x, size_t n, backend_buf out);
  /* Every op of the step is issued (a rank of a tensor-parallel model calls it on its own
   * thread): what the backend holds back of the step starts now, without waiting for the
   * device (CUDA: the recorded decode step, whose collectives the ranks run together). NULL:
   * nothing is held back. */
  void (*step_end)(backend *be);
};

/* Bytes of one page of one K or V pool (see "Paged K/V"). */
static inline size_t backend_kv_page_bytes(backend *be, int nkv, int hd) {
  if (be->kv_page_bytes) return be->kv_page_bytes(be, nkv, hd);
  return (size_t)BACKEND_PAGE_TOKENS * (size_t)nkv * (size_t)hd *
         be->kind_size(be, BACKEND_KIND_KV);
}

#endif
