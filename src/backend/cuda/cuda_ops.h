/* cuda_ops — the CUDA backend's op launchers, one kernel family per .cu file, each with the
 * signature of its op-table entry (backend/backend.h documents the semantics). backend_cuda.cu
 * puts them into the table. */
#ifndef DS_CUDA_OPS_H
#define DS_CUDA_OPS_H
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuda_elem.cu */
void cuda_elem_embed(backend *be, backend_weight E, int H, backend_buf out);
void cuda_elem_rmsnorm(backend *be, backend_buf x, backend_buf add, backend_weight w, int T, int n,
                       float eps, backend_buf y);
void cuda_elem_add(backend *be, backend_buf x, backend_buf y, size_t n);
void cuda_elem_sigmoid_mul(backend *be, backend_buf x, backend_buf gate, size_t n);
void cuda_elem_swiglu(backend *be, backend_buf gate, backend_buf up, size_t n, backend_buf out);
void cuda_elem_qk_norm_rope(backend *be, backend_buf qg, backend_buf k, backend_weight q_norm,
                            backend_weight k_norm, int nh, int nkv, int hd, int rot, double theta,
                            float eps, backend_buf q_out, backend_buf gate_out);
void cuda_elem_gdn_gates(backend *be, backend_buf qkv, backend_buf b, backend_buf a,
                         backend_weight A_log, backend_weight dt_bias, int nk, int nv, int dk,
                         int dv, backend_buf beta, backend_buf g);
void cuda_elem_gated_rmsnorm(backend *be, backend_buf o, backend_buf z, backend_weight w, int T,
                             int nv, int dv, float eps, backend_buf out);
/* xn[i, :] = rmsnorm_zero_centred(x[out_rows[i], :]) (bf16) for i < n_out. */
void cuda_elem_gather_norm(backend *be, backend_buf x, backend_weight norm, float eps, int H,
                           void *xn);

/* cuda_gemm.cu: the matmul op; the logits op (the gathered rows normed, then fp32 logits) */
void cuda_gemm_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                      backend_buf y);
void cuda_gemm_logits(backend *be, backend_buf x, backend_weight norm, float eps, backend_weight W,
                      int H, int V, backend_buf out);

/* cuda_fp8.cu: the matmul op for a weight uploaded by weight_upload_fp8 (cuda_gemm_matmul hands
 * such weights over) */
void cuda_fp8_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                     backend_buf y);

/* cuda_greedy.cu: the argmax op; logits_argmax (the screen for steps of few rows, else logits
 * and argmax) */
void cuda_greedy_argmax(backend *be, backend_buf x, int n, int V, backend_buf ids,
                        backend_buf maxv);
void cuda_greedy_logits_argmax(backend *be, backend_buf x, backend_weight norm, float eps,
                               backend_weight W, int H, int V, backend_buf logits, backend_buf ids);

/* cuda_attn.cu */
void cuda_attn_attention(backend *be, backend_buf k_pool, backend_buf v_pool, backend_buf q,
                         backend_buf k, backend_buf v, int nh, int nkv, int hd, float scale,
                         backend_buf out);
/* The same, then out *= sigmoid(gate) (the sigmoid_mul op's bits; in the merge kernel on the
 * split path). gate ACT [T, nh * hd] or NULL. */
void cuda_attn_attention_gated(backend *be, backend_buf k_pool, backend_buf v_pool, backend_buf q,
                               backend_buf k, backend_buf v, int nh, int nkv, int hd, float scale,
                               backend_buf gate, backend_buf out);

/* cuda_gdn.cu */
void cuda_gdn_conv1d(backend *be, backend_buf conv_state, backend_buf x, backend_weight w, int C,
                     int K, backend_buf out);
void cuda_gdn_prefill(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                      backend_buf g, int nk, int nv, int dk, int dv, backend_buf out);
void cuda_gdn_decode(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta, backend_buf g,
                     int nk, int nv, int dk, int dv, backend_buf out);

/* cuda_sample.cu */
void cuda_sample_sample(backend *be, backend_buf x, int n, int V, backend_buf params,
                        backend_buf ids);

/* cuda_moe.cu */
void cuda_moe_moe(backend *be, backend_buf x, const backend_moe *m, int T, int H, backend_buf out);

#ifdef __cplusplus
}
#endif

#endif
