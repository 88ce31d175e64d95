/* The NEON (arm64 dot-product) kernel of the integer-activation matmul (qpack_neon.c); tllm_qpack_matmul
 * chooses it where tllm_cpu_has_neon_dot() says it may run, and tllm_qpack_matmul_ref is its oracle (the
 * same bits). Elsewhere it is the portable kernel. */
#ifndef TLLM_QPACK_NEON_H
#define TLLM_QPACK_NEON_H

#include "kernels/cpu/qpack.h"

void tllm_qpack_matmul_neon(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1);

#endif
