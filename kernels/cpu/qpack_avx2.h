/* The AVX2 kernel of the integer-activation matmul (qpack_avx2.c), for CPUs without AVX-512 VNNI;
 * tllm_qpack_matmul chooses it where tllm_cpu_has_avx2() says it may run, and tllm_qpack_matmul_ref
 * is its oracle (the same bits). */
#ifndef TLLM_QPACK_AVX2_H
#define TLLM_QPACK_AVX2_H

#include "kernels/cpu/qpack.h"

void tllm_qpack_matmul_avx2(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1);
/* The same with AVX-VNNI's vpdpbusd (qpack_avxvnni.c), where tllm_cpu_has_avxvnni() says it may run */
void tllm_qpack_matmul_avxvnni(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1);

#endif
