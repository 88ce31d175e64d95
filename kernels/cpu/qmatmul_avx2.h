/* The AVX2 + FMA kernel behind tllm_qmatmul (qmatmul_avx2.c); qmatmul.c chooses it where
 * tllm_cpu_has_avx2() says it may run, and tllm_qmatmul_ref is its oracle. */
#ifndef TLLM_QMATMUL_AVX2_H
#define TLLM_QMATMUL_AVX2_H

#include "kernels/cpu/qweights.h"

/* y[r] for rows [r0, r1) of one token: affine 4- or 8-bit weights, group size a multiple of 32.
 * xsum[g] = sum of x over group g. */
void tllm_qmatvec_affine_avx2(const struct tllm_qweights *w, const float *x, const float *xsum, float *y, int r0,
                              int r1);

/* y[r] for rows [r0, r1) of one token: the microscaling formats (mxfp4, nvfp4, mxfp8). Codes decode
 * in registers to their values (E2M1 through a byte shuffle, E4M3 by placing its bits in a float), are
 * dotted with x, and each group is scaled once. */
void tllm_qmatvec_mx_avx2(const struct tllm_qweights *w, const float *x, float *y, int r0, int r1);

#endif
