/* SIMD kernels behind tllm_qmatmul, one file per instruction set (an ARM NEON file slots in beside). */
#ifndef TLLM_QMATMUL_SIMD_H
#define TLLM_QMATMUL_SIMD_H

#include "qweights.h"

/* 1 if this CPU runs the AVX2+FMA kernels (checked once, with CPUID). */
int tllm_cpu_has_avx2(void);

/* y[r] for rows [r0, r1) of one token: affine 4- or 8-bit weights, group size a multiple of 32.
 * xsum[g] = sum of x over group g. */
void tllm_qmatvec_affine_avx2(const struct tllm_qweights *w, const float *x, const float *xsum, float *y, int r0,
                              int r1);

#endif
