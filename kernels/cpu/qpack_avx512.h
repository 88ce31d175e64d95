/* The AVX-512 VNNI kernel of the integer-activation matmul (qpack_avx512.c); qpack.c chooses it where
 * tllm_cpu_has_avx512vnni() says it may run, and tllm_qpack_matmul_ref is its oracle. */
#ifndef TLLM_QPACK_AVX512_H
#define TLLM_QPACK_AVX512_H

#include "kernels/cpu/qpack.h"

void tllm_qpack_matmul_avx512(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1);
/* tllm_xq_quantize_ref's codes, scales and sums on 16 lanes (needs AVX-512 F/BW/VL/DQ: tllm_cpu_has_avx512) */
void tllm_xq_quantize_avx512(struct tllm_xq *xq, const float *x, int t0, int t1);

#if defined(__x86_64__)
#include <immintrin.h>
/* 16 scales or biases of a pack (bf16, f16 or f32) from element off, as floats: for the kernels that
 * apply them 16 rows at a time (this one and the AMX one) */
static inline __attribute__((always_inline, target("avx512f"))) __m512 tllm_qpack_load16_avx512(const void *src, enum tllm_dtype dt,
                                                                                                  size_t off) {
    if (dt == TLLM_DT_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + off))), 16));
    if (dt == TLLM_DT_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + off)));
    return _mm512_loadu_ps((const float *)src + off);
}
#endif

#endif
