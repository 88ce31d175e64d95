/* The AMX kernel of the integer-activation matmul (qpack_amx.c); tllm_qpack_matmul chooses it where
 * tllm_cpu_has_amx() says it may run (which also asked Linux for the tile state), and
 * tllm_qpack_matmul_ref is its oracle (the same bits). */
#ifndef TLLM_QPACK_AMX_H
#define TLLM_QPACK_AMX_H

#include "kernels/cpu/qpack.h"

void tllm_qpack_matmul_amx(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1);

#endif
