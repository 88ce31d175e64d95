/* quantized_matmul: y[n x rows] = x[n x cols] . W^T, with W described by tllm_qweights.
 * The scalar _ref kernels are the oracle every faster kernel is tested against. */
#ifndef TLLM_QMATMUL_H
#define TLLM_QMATMUL_H

#include "kernels/cpu/qweights.h"

/* Scalar reference: rows [r0, r1) of y for all n tokens. Dequantizes w = scale*q + bias and
 * accumulates w*x in float32, in column order. */
void tllm_qmatmul_ref(const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1);

/* Row r of W as float32 (the embedding lookup). */
void tllm_qw_dequant_row_ref(const struct tllm_qweights *w, int r, float *out);

/* The fastest kernel for this machine; same contract as the reference. */
void tllm_qmatmul(const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1);
void tllm_qw_dequant_row(const struct tllm_qweights *w, int r, float *out);
/* The multi-token kernel alone (tllm_qmatmul takes one or two tokens through a matrix-vector kernel,
 * summing in another order): each token's row is the same bits for any n. */
void tllm_qmatmul_tiled(const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1);

#endif
