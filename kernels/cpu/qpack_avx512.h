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
/* Group g of row block b's 16 scales (bias 0) or biases (1), two-level ones multiplied back, symmetric
 * codes' biases made from the scales (qpack.h) */
static inline __attribute__((always_inline, target("avx512f"))) __m512 tllm_qpack_params16_avx512(const struct tllm_qpack *p, int bias,
                                                                                                    int b, int g) {
    const int own = bias && !p->sym; /* the biases' own values */
    const void *src = own ? p->biases : p->scales;
    __m512 v;
    if (!p->super) {
        v = tllm_qpack_load16_avx512(src, p->dtype, tllm_qpack_param_off(p, b, g));
    } else {
        const __m128i q = _mm_loadu_si128((const __m128i *)((const int8_t *)src + tllm_qpack_param_off(p, b, g)));
        const __m256i d = _mm256_loadu_si256((const __m256i *)((own ? p->biases2 : p->scales2) + tllm_qpack_super_off(p, b, g)));
        v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_cvtph_ps(d));
    }
    return bias && p->sym ? _mm512_mul_ps(v, _mm512_set1_ps(p->sym)) : v;
}
#endif

#endif
