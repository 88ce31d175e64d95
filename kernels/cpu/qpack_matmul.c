/* tllm_qpack_matmul and tllm_xq_quantize: the fastest integer-activation kernel and activation quantizer
 * this CPU runs (a file of its own, so the per-ISA kernels can depend on qpack.h's layout without qpack
 * depending on them). */
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/qpack_amx.h"
#include "kernels/cpu/qpack_avx2.h"
#include "kernels/cpu/qpack_avx512.h"
#include "kernels/cpu/qpack_neon.h"

void tllm_qpack_matmul(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    if (tllm_cpu_has_amx()) tllm_qpack_matmul_amx(p, x, y, b0, b1);
    else if (tllm_cpu_has_avx512vnni()) tllm_qpack_matmul_avx512(p, x, y, b0, b1);
    else if (tllm_cpu_has_avxvnni()) tllm_qpack_matmul_avxvnni(p, x, y, b0, b1);
    else if (tllm_cpu_has_avx2()) tllm_qpack_matmul_avx2(p, x, y, b0, b1);
    else if (tllm_cpu_has_neon_dot()) tllm_qpack_matmul_neon(p, x, y, b0, b1);
    else tllm_qpack_matmul_ref(p, x, y, b0, b1);
}

/* The compact forms the kernel tllm_qpack_matmul runs reads itself (qpack.h; NEON's would hand them all to the
 * portable kernel, AVX2's the planes) */
int tllm_qpack_forms_native(void) {
    if (tllm_cpu_has_amx() || tllm_cpu_has_avx512vnni()) return TLLM_QPACK_PLANES | TLLM_QPACK_SCALES;
    return tllm_cpu_has_avxvnni() || tllm_cpu_has_avx2() ? TLLM_QPACK_SCALES : 0;
}

void tllm_xq_quantize(struct tllm_xq *xq, const float *x, int t0, int t1) {
    if (tllm_cpu_has_avx512()) tllm_xq_quantize_avx512(xq, x, t0, t1);
    else tllm_xq_quantize_ref(xq, x, t0, t1);
}
