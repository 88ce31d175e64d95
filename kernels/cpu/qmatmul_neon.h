/* The NEON kernel behind tllm_qmatmul's float (--exact) decode path on arm64 (qmatmul_neon.c);
 * qmatmul.c chooses it where tllm_cpu_has_neon_dot() says the NEON path may run, and tllm_qmatmul_ref
 * is its oracle. */
#ifndef TLLM_QMATMUL_NEON_H
#define TLLM_QMATMUL_NEON_H

#include "kernels/cpu/qweights.h"

/* y[r] for rows [r0, r1) of one token: affine 4- or 8-bit weights, group size a multiple of 32.
 * xsum[g] = sum of x over group g. (Off arm64: never called.) */
void tllm_qmatvec_affine_neon(const struct tllm_qweights *w, const float *x, const float *xsum, float *y, int r0,
                              int r1);

#endif
