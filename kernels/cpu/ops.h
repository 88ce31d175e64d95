/* The non-matmul pieces of the forward pass, on float32 rows. */
#ifndef TLLM_OPS_H
#define TLLM_OPS_H

#include <stddef.h>
#include <stdint.h>

/* out = x / rms(x) * weight, over n elements (out may alias x). */
void tllm_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);

/* Rotate-half (NeoX) RoPE on n_heads heads of head_dim, with cos/sin tables of head_dim/2. */
void tllm_rope(float *v, int n_heads, int head_dim, const float *cos_t, const float *sin_t);

/* cos/sin tables for one position, computed in float32 as Hugging Face's Qwen2 rotary embedding does. */
void tllm_rope_tables(int pos, int head_dim, float theta, float *cos_t, float *sin_t);


/* Causal attention of nq consecutive queries of one head, the j-th at position pos0 + j, over a float
 * copy of its keys and values (the CPU backend's path where tllm_attention_blocks is not available).
 * q: [nq rows, q_stride apart]; kt: the head's keys transposed, kt[i * kt_stride + p] (head_dim x
 * positions); v: value rows v_stride apart; scores: scratch of nq x (pos0 + nq); out: [nq rows,
 * out_stride apart] of head_dim. */
void tllm_attention(const float *q, size_t q_stride, int nq, int pos0, const float *kt, size_t kt_stride,
                    const float *v, size_t v_stride, int head_dim, float *scores, float *out, size_t out_stride);
/* What tllm_attention runs: the portable kernel (GCC vector extensions); the scalar oracle is in ops_ref.h. */
void tllm_attention_portable(const float *q, size_t q_stride, int nq, int pos0, const float *kt, size_t kt_stride,
                             const float *v, size_t v_stride, int head_dim, float *scores, float *out,
                             size_t out_stride);

/* The same for a GQA group's queries straight from the KV cache's blocks of 16 positions (no float
 * copy; AVX-512): nq tokens at positions pos0.., group query heads each (token j's head h at q + j
 * q_stride + h head_dim, its output likewise at out); kb[i] = block i's keys of the KV head
 * ([head_dim][16]), vb[i] its values ([16][head_dim]), f16 if f16 else float32; scores: scratch of
 * 8 x (pos0 + nq). A query's result does not depend on the others. Only where tllm_attention_blocks_ok. */
int tllm_attention_blocks_ok(int head_dim);
void tllm_attention_blocks(const float *q, size_t q_stride, int nq, int group, int pos0, const void *const *kb,
                           const void *const *vb, int f16, int head_dim, float *scores, float *out, size_t out_stride);

/* gate[i] = silu(gate[i]) * up[i] */
void tllm_swiglu(float *gate, const float *up, int n);

/* The index of the first maximum of x[0..n) (NaN never wins; n >= 1): greedy sampling of a logits row. */
int tllm_argmax(const float *x, int n);
/* tllm_argmax over the ids whose bit is set in allow (bit i of word i / 32), as a device's
 * rows_argmax_allowed picks (an allowed -inf counts, NaN never wins); -1 when none is. */
int tllm_argmax_allowed(const float *x, int n, const uint32_t *allow);

/* log(sum_i exp(x[i])) in double, the max taken out first (n >= 1): log-softmax's normalizer, for
 * log probabilities and perplexity. */
double tllm_logsumexp(const float *x, int n);

/* dst[i] = src[i] widened from IEEE half (the KV cache's f16 rows); exact. */
void tllm_f16_to_f32_row(const uint16_t *src, float *dst, int n);
/* dst[i] = src[i] rounded to IEEE half as tllm_f32_to_f16 rounds it (nearest even; NaN -> sign | 0x7e00) */
void tllm_f32_to_f16_row(const float *src, uint16_t *dst, int n);

#endif
