/* AVX2 + FMA quantized matvec for MLX affine 4-bit and 8-bit weights, used for decode-sized steps.
 * Codes are unpacked in registers in natural element order (low nibble = even element), dotted
 * with x, and each group is scaled once: sum_j (s q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j,
 * with the per-group sums of x computed once per call. Compiled for AVX2 via target attributes
 * and chosen at run time (CPUID), so one binary runs on any x86-64. */
#include "qmatmul_simd.h"

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
        __m256 total = _mm256_setzero_ps();
        float bias_part = 0.0f;
        for (int g = 0; g < ng; g++) {
            size_t gi = (size_t)r * ng + (size_t)g;
            float s = tllm_load_f32(w->scales, w->dtype, gi), b = tllm_load_f32(w->biases, w->dtype, gi);
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            const float *xg = x + (size_t)g * gs;
            for (int k = 0; k < gs; k += 32, q += blk) {
                if (bits == 4) dot32_q4(q, xg + k, &a0, &a1);
                else dot32_q8(q, xg + k, &a0, &a1);
            }
            total = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_add_ps(a0, a1), total);
            bias_part += b * xsum[g];
        }
        y[r] = hsum8(total) + bias_part;
    }
}

/* One pair of blocks (64 weights, 32 bytes of codes): the int32 dot per block, times each block's dx. */
TGT static inline __m256 pair_dot_q4_int8(const uint8_t *q, const int8_t *xq, const float *dx8) {
    const __m256i m = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256i v = _mm256_loadu_si256((const __m256i *)q);
    __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    __m256i xe = _mm256_loadu_si256((const __m256i *)xq), xo = _mm256_loadu_si256((const __m256i *)(xq + 32));
    __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones)), _mm256_loadu_ps(dx8));
}

/* The scales of pair p as 4 + 4 lanes (one group spans the pair when gs >= 64). */
TGT static inline __m256 pair_scales(const uint16_t *scales, size_t g0, int p, int gs) {
    if (gs >= 64) return _mm256_set1_ps(tllm_bf16_to_f32(scales[g0 + (size_t)(p * 64 / gs)]));
    float s0 = tllm_bf16_to_f32(scales[g0 + 2 * (size_t)p]), s1 = tllm_bf16_to_f32(scales[g0 + 2 * (size_t)p + 1]);
    return _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
}

/* Integer activations, 4-bit weights: x is int8 per block of 32 and stored per pair of blocks as 32
 * bytes of even elements then 32 bytes of odd ones, matching the low and high nibbles of 32 bytes of
 * codes, so maddubs(codes, x) needs no unpacking. cols % 64 == 0, BF16 scales. */
TGT void tllm_qmatvec_q4_int8_avx2(const struct tllm_qweights *w, const int8_t *xq, const float *dx8, const float *xsum,
                                   float *y, int r0, int r1) {
    const int gs = w->group_size, ng = w->cols / gs, pairs = w->cols / 64;
    const size_t row_bytes = (size_t)w->cols / 2;
    const uint8_t *base = (const uint8_t *)w->w;
    const uint16_t *scales = w->scales, *biases = w->biases;
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = base + (size_t)r * row_bytes;
        const size_t g0 = (size_t)r * ng;
        /* two accumulators: a single chain of dependent FMAs would bound the loop at 4 cycles a step */
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int p = 0;
        for (; p + 1 < pairs; p += 2) {
            acc0 = _mm256_fmadd_ps(pair_dot_q4_int8(q + (size_t)p * 32, xq + (size_t)p * 64, dx8 + p * 8),
                                   pair_scales(scales, g0, p, gs), acc0);
            acc1 = _mm256_fmadd_ps(pair_dot_q4_int8(q + (size_t)(p + 1) * 32, xq + (size_t)(p + 1) * 64, dx8 + (p + 1) * 8),
                                   pair_scales(scales, g0, p + 1, gs), acc1);
        }
        if (p < pairs)
            acc0 = _mm256_fmadd_ps(pair_dot_q4_int8(q + (size_t)p * 32, xq + (size_t)p * 64, dx8 + p * 8),
                                   pair_scales(scales, g0, p, gs), acc0);
        float b0 = 0.0f, b1 = 0.0f;
        int g = 0;
        for (; g + 1 < ng; g += 2) {
            b0 += tllm_bf16_to_f32(biases[g0 + g]) * xsum[g];
            b1 += tllm_bf16_to_f32(biases[g0 + g + 1]) * xsum[g + 1];
        }
        if (g < ng) b0 += tllm_bf16_to_f32(biases[g0 + g]) * xsum[g];
        y[r] = hsum8(_mm256_add_ps(acc0, acc1)) + (b0 + b1);
    }
}

int tllm_cpu_has_avx2(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return has;
}
#else
int tllm_cpu_has_avx2(void) { return 0; }
void tllm_qmatvec_q4_int8_avx2(const struct tllm_qweights *w, const int8_t *xq, const float *dx8, const float *xsum,
                               float *y, int r0, int r1) {
    (void)w, (void)xq, (void)dx8, (void)xsum, (void)y, (void)r0, (void)r1;
}
void tllm_qmatvec_affine_avx2(const struct tllm_qweights *w, const float *x, const float *xsum, float *y, int r0,
                              int r1) {
    (void)w, (void)x, (void)xsum, (void)y, (void)r0, (void)r1;
}
#endif
