/* AVX2 kernel of the integer-activation matmul (layout: qpack.h), for CPUs without AVX-512 VNNI (most
 * laptops). A 64-byte chunk of codes is two 256-bit halves, rows 0-7 and rows 8-15, 4 codes of a row
 * in each 32-bit lane. vpmaddubsw multiplies the unsigned codes by the int8 activations (broadcast 4
 * at a time) and adds pairs into 16-bit lanes; a whole block of 32 activations adds up in 16 bits
 * without overflow (8 products of at most 2 x 15 x 127 each; 8-bit codes are split into two nibbles),
 * then one vpmaddwd widens it to 32 bits. The integer sums are exact and the float epilogue is the
 * _ref kernel's, fused multiply-add for fused multiply-add, so the results are the same bits.
 * With AVX-VNNI (qpack_avxvnni.c compiles this file again with TLLM_QPACK_AVXVNNI: Intel since Alder
 * Lake, AMD since Zen 5) one vpdpbusd multiplies and adds the 4 products of a lane straight into 32
 * bits: no 16-bit sums, no nibble split for 8-bit codes, no widening. Same integer sums, same bits.
 * Compiled for AVX2 via target attributes and chosen at run time. */
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/qpack_avx2.h"

#ifndef TLLM_QPACK_AVX2_TILE_TOKENS
#define TLLM_QPACK_AVX2_TILE_TOKENS 6 /* tokens per tile (pp512 on Zen 4 capped to AVX2: 4 ~290, 6 ~300, 8 ~300 t/s) */
#endif
#ifndef TLLM_QPACK_AVX2_TILE_TOKENS2
#define TLLM_QPACK_AVX2_TILE_TOKENS2 2 /* tokens per tile with two levels (twice the sums) */
#endif
#ifndef TLLM_QPACK_AVX2_TILE_BLOCKS
#define TLLM_QPACK_AVX2_TILE_BLOCKS 4 /* row blocks whose codes stay in L1/L2 while every token tile passes */
#endif
#ifndef TLLM_QPACK_AVX2_PREFETCH
#define TLLM_QPACK_AVX2_PREFETCH 2048 /* bytes ahead in the code stream to prefetch (0: none) */
#endif

#if defined(__x86_64__)
#include <immintrin.h>

#if TLLM_QPACK_AVXVNNI
#define TGT __attribute__((target("avx2,fma,f16c,avxvnni")))
#define VNNI 1
#define MATMUL tllm_qpack_matmul_avxvnni
#else
#define TGT __attribute__((target("avx2,fma,f16c")))
#define VNNI 0
#define MATMUL tllm_qpack_matmul_avx2
#endif
#define INLINE static inline __attribute__((always_inline))

TGT INLINE __m256 load8(const void *src, enum tllm_dtype dt, size_t off) {
    if (dt == TLLM_DT_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + off))), 16));
    if (dt == TLLM_DT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + off)));
    return _mm256_loadu_ps((const float *)src + off);
}

/* Rows 8h .. 8h + 7 of group g of row block b's scales (bias 0) or biases (1); two-level ones multiplied
 * back, symmetric codes' biases made from the scales */
TGT INLINE __m256 params8(const struct tllm_qpack *p, int bias, int b, int g, int h) {
    const int own = bias && !p->sym; /* the biases' own values */
    const void *src = own ? p->biases : p->scales;
    const size_t off = tllm_qpack_param_off(p, b, g) + 8 * (size_t)h;
    __m256 v;
    if (!p->super) {
        v = load8(src, p->dtype, off);
    } else {
        const __m128i q = _mm_loadl_epi64((const __m128i *)((const int8_t *)src + off));
        const __m128i d = _mm_loadu_si128((const __m128i *)((own ? p->biases2 : p->scales2) + tllm_qpack_super_off(p, b, g) + 8 * (size_t)h));
        v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtph_ps(d));
    }
    return bias && p->sym ? _mm256_mul_ps(v, _mm256_set1_ps(p->sym)) : v;
}

TGT INLINE __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

#if TLLM_QPACK_AVXVNNI
TGT INLINE __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) { return _mm256_dpbusd_avx_epi32(acc, u8, s8); }
#else
TGT INLINE __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) { return (void)u8, (void)s8, acc; } /* never called */
#endif

/* The block's 16-bit sums for the codes w (one half) against the activations at xo: 2- and 4-bit codes
 * directly; wider values (8-bit codes, and the E2M1 table's 0..24) as low and high nibble, the high
 * one's sums kept apart (sixteen times them would not fit 16 bits). With VNNI: 32-bit sums in s_lo. */
#define MAC(s_lo, s_hi, w, xb)                                                                   \
    do {                                                                                          \
        if (VNNI)                                                                                 \
            s_lo = dpbusd(s_lo, w, xb);                                                           \
        else if (WIDE) {                                                                          \
            s_lo = _mm256_add_epi16(s_lo, _mm256_maddubs_epi16(_mm256_and_si256(w, nib), xb));    \
            s_hi = _mm256_add_epi16(s_hi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), nib), xb)); \
        } else                                                                                    \
            s_lo = _mm256_add_epi16(s_lo, _mm256_maddubs_epi16(w, xb));                           \
    } while (0)

/* Rows of block b for tokens [t0, t0 + NT); NT, BITS and LEVELS are constants at every call site. */
TGT INLINE void tile(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const int NT,
                     const int BITS, const int LEVELS, const int LUT) {
    const int WIDE = BITS == 8 || LUT, per = 8 / BITS, ng = p->cols / p->group_size, bpg = tllm_qpack_subblocks(p);
    const int nb = p->cols / TLLM_XQ_BLOCK, chunks = tllm_qpack_subcols(p) / (4 * per);
    const __m256i mask = _mm256_set1_epi8((char)((1 << BITS) - 1)), nib = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tllm_e2m1_u8)); /* per 128-bit lane */
    const uint8_t *c = p->codes + (size_t)b * p->block_bytes;
    const int8_t *xq = x->q + (size_t)t0 * p->cols, *xq2 = LEVELS == 2 ? x->q2 + (size_t)t0 * p->cols : NULL;
    const float *xd = x->d + (size_t)t0 * nb, *xs = x->sum + (size_t)t0 * nb;
    __m256 acc[8][2];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m256 f[8][2];
        float ssum[8];
        for (int t = 0; t < NT; t++) f[t][0] = f[t][1] = _mm256_setzero_ps(), ssum[t] = 0.0f;
        for (int k = 0; k < bpg; k++) {
            const int col0 = g * p->group_size + k * TLLM_XQ_BLOCK, kb = col0 / TLLM_XQ_BLOCK;
            /* [token][half]: the low sums (all of 2/4-bit codes), the high nibbles' (8-bit), level two's */
            __m256i lo[8][2], hi[8][2], lo2[8][2], hi2[8][2];
            for (int t = 0; t < NT; t++)
                for (int h = 0; h < 2; h++) {
                    lo[t][h] = hi[t][h] = _mm256_setzero_si256();
                    if (LEVELS == 2) lo2[t][h] = hi2[t][h] = _mm256_setzero_si256();
                }
            for (int ch = 0; ch < chunks; ch++, c += 64) {
                if (TLLM_QPACK_AVX2_PREFETCH) _mm_prefetch((const char *)c + TLLM_QPACK_AVX2_PREFETCH, _MM_HINT_T0);
                __m256i v0 = _mm256_load_si256((const __m256i *)c), v1 = _mm256_load_si256((const __m256i *)(c + 32));
                for (int m = 0; m < per; m++) {
                    __m256i w0 = BITS == 8 ? v0 : _mm256_and_si256(m ? _mm256_srli_epi16(v0, BITS * m) : v0, mask);
                    __m256i w1 = BITS == 8 ? v1 : _mm256_and_si256(m ? _mm256_srli_epi16(v1, BITS * m) : v1, mask);
                    if (LUT) w0 = _mm256_shuffle_epi8(lut, w0), w1 = _mm256_shuffle_epi8(lut, w1);
                    const size_t off = (size_t)col0 + ch * 4 * per + 4 * m;
                    for (int t = 0; t < NT; t++) {
                        __m256i xb = bcast4(xq + (size_t)t * p->cols + off);
                        MAC(lo[t][0], hi[t][0], w0, xb);
                        MAC(lo[t][1], hi[t][1], w1, xb);
                        if (LEVELS == 2) {
                            __m256i xb2 = bcast4(xq2 + (size_t)t * p->cols + off);
                            MAC(lo2[t][0], hi2[t][0], w0, xb2);
                            MAC(lo2[t][1], hi2[t][1], w1, xb2);
                        }
                    }
                }
            }
            for (int t = 0; t < NT; t++) {
                __m256 dt = _mm256_set1_ps(xd[(size_t)t * nb + kb]);
                for (int h = 0; h < 2; h++) {
                    __m256i dot = VNNI ? lo[t][h] : _mm256_madd_epi16(lo[t][h], ones);
                    if (WIDE && !VNNI) dot = _mm256_add_epi32(dot, _mm256_slli_epi32(_mm256_madd_epi16(hi[t][h], ones), 4));
                    if (LEVELS == 2) {
                        __m256i dot2 = VNNI ? lo2[t][h] : _mm256_madd_epi16(lo2[t][h], ones);
                        if (WIDE && !VNNI) dot2 = _mm256_add_epi32(dot2, _mm256_slli_epi32(_mm256_madd_epi16(hi2[t][h], ones), 4));
                        dot = _mm256_add_epi32(_mm256_slli_epi32(dot, 7), dot2);
                    }
                    f[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), dt, f[t][h]);
                }
                ssum[t] += tllm_xq_group_sum(x, xs, t0, t, nb, kb, p->group_size, col0);
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 S = params8(p, 0, b, g, h);
            if (LUT) { /* w = s (u - offset): one scale, the offset times the x sum taken out first */
                for (int t = 0; t < NT; t++)
                    acc[t][h] = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(-(float)TLLM_E2M1_OFFSET), _mm256_set1_ps(ssum[t]), f[t][h]),
                                                S, acc[t][h]);
                continue;
            }
            __m256 B = params8(p, 1, b, g, h);
            for (int t = 0; t < NT; t++) {
                acc[t][h] = _mm256_fmadd_ps(f[t][h], S, acc[t][h]);
                acc[t][h] = _mm256_fmadd_ps(B, _mm256_set1_ps(ssum[t]), acc[t][h]);
            }
        }
    }
    int n_out = p->rows - b * TLLM_QPACK_ROWS < TLLM_QPACK_ROWS ? p->rows - b * TLLM_QPACK_ROWS : TLLM_QPACK_ROWS;
    for (int t = 0; t < NT; t++) {
        float *out = y + (size_t)(t0 + t) * p->rows + (size_t)b * TLLM_QPACK_ROWS;
        if (n_out == TLLM_QPACK_ROWS) {
            _mm256_storeu_ps(out, acc[t][0]);
            _mm256_storeu_ps(out + 8, acc[t][1]);
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, acc[t][0]);
            _mm256_storeu_ps(tmp + 8, acc[t][1]);
            memcpy(out, tmp, (size_t)n_out * sizeof *tmp);
        }
    }
}

#define TILE(BITS, NT, L)                                                                                     \
    TGT static void tile##L##_##BITS##_##NT(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, \
                                            int t0) {                                                          \
        tile(p, x, y, b, t0, NT, BITS == 41 ? 4 : BITS, L, BITS == 41);                                        \
    }
#define TILES(BITS, L) TILE(BITS, 1, L) TILE(BITS, 2, L) TILE(BITS, 3, L) TILE(BITS, 4, L) TILE(BITS, 5, L) TILE(BITS, 6, L) TILE(BITS, 7, L) TILE(BITS, 8, L)
TILES(2, 1)
TILES(4, 1)
TILES(8, 1)
TILES(41, 1) /* 4-bit codes through the E2M1 table */
TILES(2, 2)
TILES(4, 2)
TILES(8, 2)
TILES(41, 2)
#define ROW(BITS, L) {tile##L##_##BITS##_1, tile##L##_##BITS##_2, tile##L##_##BITS##_3, tile##L##_##BITS##_4, \
                     tile##L##_##BITS##_5, tile##L##_##BITS##_6, tile##L##_##BITS##_7, tile##L##_##BITS##_8}
static tllm_qpack_tile_fn *const tiles[2][4][8] = {{ROW(2, 1), ROW(4, 1), ROW(8, 1), ROW(41, 1)},
                                                   {ROW(2, 2), ROW(4, 2), ROW(8, 2), ROW(41, 2)}};

#if TLLM_QPACK_AVX2_TILE_TOKENS > 8 || TLLM_QPACK_AVX2_TILE_TOKENS < 1 || TLLM_QPACK_AVX2_TILE_TOKENS2 > 8 || TLLM_QPACK_AVX2_TILE_TOKENS2 < 1
#error "TLLM_QPACK_AVX2_TILE_TOKENS and TLLM_QPACK_AVX2_TILE_TOKENS2 must be 1..8"
#endif

void MATMUL(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    if (tllm_qpack_planes(p)) { /* not made where this kernel runs (tllm_qpack_forms_native: unpacking planes in AVX2 cost more
                                 * than the bytes saved, on a Xeon), but read right */
        tllm_qpack_matmul_ref(p, x, y, b0, b1);
        return;
    }
    const int bi = tllm_qpack_kind(p);
    const struct tllm_qpack_tiles t = {{tiles[0][bi], tiles[1][bi]}, {TLLM_QPACK_AVX2_TILE_TOKENS, TLLM_QPACK_AVX2_TILE_TOKENS2},
                                       TLLM_QPACK_AVX2_TILE_BLOCKS};
    tllm_qpack_run_tiles(p, x, y, b0, b1, &t);
}

#else
#if TLLM_QPACK_AVXVNNI
void tllm_qpack_matmul_avxvnni(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
#else
void tllm_qpack_matmul_avx2(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
#endif
    tllm_qpack_matmul_ref(p, x, y, b0, b1);
}
#endif
