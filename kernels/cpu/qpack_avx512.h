/* The AVX-512 VNNI kernel of the integer-activation matmul (qpack_avx512.c); qpack.c chooses it where
 * tllm_cpu_has_avx512vnni() says it may run, and tllm_qpack_matmul_ref is its oracle. */
#ifndef TLLM_QPACK_AVX512_H
#define TLLM_QPACK_AVX512_H

#include "kernels/cpu/qpack.h"

void tllm_qpack_matmul_avx512(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1);

#endif
