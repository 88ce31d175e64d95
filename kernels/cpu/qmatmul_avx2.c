/* AVX2 + FMA quantized matvec for MLX affine 4-bit and 8-bit weights, used for decode-sized steps.
 * Codes are unpacked in registers in natural element order (low nibble = even element), dotted
 * with x, and each group is scaled once: sum_j (s q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j,
 * with the per-group sums of x computed once per call. Compiled for AVX2 via target attributes
 * and chosen at run time (CPUID), so one binary runs on any x86-64. */
#include "kernels/cpu/qmatmul_avx2.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma")))

TGT static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 codes of 4 bits (16 bytes) times x[0..32), accumulated into two vectors. */
TGT static inline void dot32_q4(const uint8_t *q, const float *x, __m256 *a0, __m256 *a1) {
    const __m128i m = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi); /* elements 0-15, 16-31 */
    __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e0));
    __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e0, 8)));
    __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e1));
    __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e1, 8)));
    *a0 = _mm256_fmadd_ps(f0, _mm256_loadu_ps(x), *a0);
    *a1 = _mm256_fmadd_ps(f1, _mm256_loadu_ps(x + 8), *a1);
    *a0 = _mm256_fmadd_ps(f2, _mm256_loadu_ps(x + 16), *a0);
    *a1 = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x + 24), *a1);
}

/* 32 codes of 8 bits (32 bytes) times x[0..32). */
TGT static inline void dot32_q8(const uint8_t *q, const float *x, __m256 *a0, __m256 *a1) {
    __m128i v0 = _mm_loadu_si128((const __m128i *)q), v1 = _mm_loadu_si128((const __m128i *)(q + 16));
    *a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v0)), _mm256_loadu_ps(x), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v0, 8))), _mm256_loadu_ps(x + 8), *a1);
    *a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v1)), _mm256_loadu_ps(x + 16), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v1, 8))), _mm256_loadu_ps(x + 24), *a1);
}

TGT void tllm_qmatvec_affine_avx2(const struct tllm_qweights *w, const float *x, const float *xsum, float *y, int r0,
                                  int r1) {
    const int gs = w->group_size, ng = w->cols / gs, bits = w->bits;
    const size_t row_bytes = (size_t)w->cols * bits / 8, blk = 32 * (size_t)bits / 8;
    const uint8_t *base = (const uint8_t *)w->w;
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = base + (size_t)r * row_bytes;
        if (r + 1 < r1) _mm_prefetch((const char *)(q + row_bytes), _MM_HINT_T0);
        /* Groups alternate between two chains of accumulators: with one, each group would wait on the
         * previous group's FMAs (latency-bound). */
        __m256 tot[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        float bias_part = 0.0f;
        for (int g = 0; g < ng; g++) {
            size_t gi = (size_t)r * ng + (size_t)g;
            float s = tllm_load_f32(w->scales, w->dtype, gi), b = tllm_load_f32(w->biases, w->dtype, gi);
            const int h = g & 1;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            const float *xg = x + (size_t)g * gs;
            for (int k = 0; k < gs; k += 32, q += blk) {
                if (bits == 4) dot32_q4(q, xg + k, &a0, &a1);
                else dot32_q8(q, xg + k, &a0, &a1);
            }
            tot[h] = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_add_ps(a0, a1), tot[h]);
            bias_part += b * xsum[g];
        }
        y[r] = hsum8(_mm256_add_ps(tot[0], tot[1])) + bias_part;
    }
}

/* 16 E2M1 codes (8 bytes, low nibble first) as 2 x value, times the group's scale s and x[0..16) */
TGT static inline void dot16_e2m1(const uint8_t *q, const float *x, __m128i lut, __m256 s, __m256 *a0, __m256 *a1) {
    const __m128i m = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadl_epi64((const __m128i *)q);
    __m128i e = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m)));
    *a0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e)), s), _mm256_loadu_ps(x), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e, 8))), s), _mm256_loadu_ps(x + 8), *a1);
}

/* 8 E4M3 codes times s and x[0..8): magnitude bits at the top of a float's, times 2^120 (folded into s;
 * tllm_e4m3_to_f32) */
TGT static inline void dot8_e4m3(const uint8_t *q, const float *x, __m256 s, __m256 *a) {
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256i bits = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20),
                                   _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24));
    *a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_castsi256_ps(bits), s), _mm256_loadu_ps(x), *a);
}

TGT void tllm_qmatvec_mx_avx2(const struct tllm_qweights *w, const float *x, float *y, int r0, int r1) {
    const int gs = w->group_size, ng = w->cols / gs, fp8 = w->format == TLLM_WF_MXFP8;
    const size_t row_bytes = (size_t)w->cols * w->bits / 8, gbytes = (size_t)gs * w->bits / 8;
    const __m128i lut = _mm_loadu_si128((const __m128i *)tllm_e2m1_x2);
    /* the E2M1 table holds twice the values; E4M3's bit placement leaves a factor 2^-120 */
    const float unit = fp8 ? 0x1p120f : 0.5f;
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->w + (size_t)r * row_bytes;
        if (r + 1 < r1) _mm_prefetch((const char *)(q + row_bytes), _MM_HINT_T0);
        /* the scale multiplies the decoded codes, so groups do not wait on each other (groups of 16 are
         * too short to sum apart and scale once) */
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int g = 0; g < ng; g++, q += gbytes) {
            const float *xg = x + (size_t)g * gs;
            const __m256 sg = _mm256_set1_ps(unit * tllm_qw_scale(w, r, g));
            if (fp8)
                for (int k = 0; k < gs; k += 16) dot8_e4m3(q + k, xg + k, sg, &a0), dot8_e4m3(q + k + 8, xg + k + 8, sg, &a1);
            else
                for (int k = 0; k < gs; k += 16) dot16_e2m1(q + k / 2, xg + k, lut, sg, &a0, &a1);
        }
        y[r] = hsum8(_mm256_add_ps(a0, a1));
    }
}

#else
void tllm_qmatvec_mx_avx2(const struct tllm_qweights *w, const float *x, float *y, int r0, int r1) {
    (void)w, (void)x, (void)y, (void)r0, (void)r1;
}
void tllm_qmatvec_affine_avx2(const struct tllm_qweights *w, const float *x, const float *xsum, float *y, int r0,
                              int r1) {
    (void)w, (void)x, (void)xsum, (void)y, (void)r0, (void)r1;
}
#endif
