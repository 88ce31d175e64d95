/* The non-matmul pieces of the forward pass, on float32 rows. */
#ifndef TLLM_OPS_H
#define TLLM_OPS_H

/* out = x / rms(x) * weight, over n elements (out may alias x). */
void tllm_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);

/* Rotate-half (NeoX) RoPE on n_heads heads of head_dim, with cos/sin tables of head_dim/2. */
void tllm_rope(float *v, int n_heads, int head_dim, const float *cos_t, const float *sin_t);

/* cos/sin tables for one position, computed in float32 as Hugging Face's Qwen2 rotary embedding does. */
void tllm_rope_tables(int pos, int head_dim, float theta, float *cos_t, float *sin_t);

/* In-place softmax over n elements. */
void tllm_softmax(float *x, int n);

/* gate[i] = silu(gate[i]) * up[i] */
void tllm_swiglu(float *gate, const float *up, int n);

#endif
