/* The scalar oracles of ops.h's kernels (ops_ref.c): double sums where it matters. The tests hold
 * every faster kernel to them, and the per-ISA files fall back to them where their ISA is not compiled. */
#ifndef TLLM_OPS_REF_H
#define TLLM_OPS_REF_H

#include <stddef.h>
#include <stdint.h>

/* As tllm_attention (ops.h) */
void tllm_attention_ref(const float *q, size_t q_stride, int nq, int pos0, const float *kt, size_t kt_stride,
                        const float *v, size_t v_stride, int head_dim, float *scores, float *out, size_t out_stride);

/* As tllm_argmax and tllm_argmax_allowed (ops.h) */
int tllm_argmax_ref(const float *x, int n);
int tllm_argmax_allowed_ref(const float *x, int n, const uint32_t *allow);

/* In-place softmax over n elements. */
void tllm_softmax(float *x, int n);

/* gate[i] = silu(gate[i]) * up[i] */
void tllm_swiglu_ref(float *gate, const float *up, int n);

#endif
