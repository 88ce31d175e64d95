/* AVX-512 versions of ops.h's hot loops (ops_avx512.c), used where the CPU has AVX-512 (F/BW/VL/DQ);
 * ops.c chooses. Their oracles are ops_ref.h's. */
#ifndef TLLM_OPS_AVX512_H
#define TLLM_OPS_AVX512_H

#include <stddef.h>
#include <stdint.h>

/* attention needs head_dim % 16 == 0 (tllm_attention_avx512_ok says). */
int tllm_attention_avx512_ok(int head_dim);
/* Causal attention of a GQA group's queries (nq tokens at positions pos0.., group heads each: token j's
 * head h at q + j q_stride + h head_dim, its output likewise at out) straight from the KV cache's
 * blocks of 16 positions: kb[i] = block i's keys of the KV head ([head_dim][16]), vb[i] its values
 * ([16][head_dim]), f16 if f16 else float32. scores: scratch of 8 x (pos0 + nq). A query's result does
 * not depend on the other queries. Needs tllm_attention_avx512_ok. */
void tllm_attention_blocks_avx512(const float *q, size_t q_stride, int nq, int group, int pos0, const void *const *kb,
                                  const void *const *vb, int f16, int head_dim, float *scores, float *out, size_t out_stride);
void tllm_swiglu_avx512(float *gate, const float *up, int n);
void tllm_exp_avx512(float *x, int n); /* x[i] = e^x[i] (the tests check its accuracy) */
int tllm_argmax_avx512(const float *x, int n);
int tllm_argmax_allowed_avx512(const float *x, int n, const uint32_t *allow);
void tllm_f16_to_f32_row_avx512(const uint16_t *src, float *dst, int n);
/* tllm_f32_to_f16's bits, 16 lanes at once (F16C's rounding, NaN lanes set as the scalar one sets them) */
void tllm_f32_to_f16_row_avx512(const float *src, uint16_t *dst, int n);

#endif
