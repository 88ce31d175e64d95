/* NEON kernel of the integer-activation matmul (layout: qpack.h) for arm64 CPUs with the dot-product
 * extension (ARMv8.2 `sdot`: Cortex-A55/A76 and later, Graviton 2+, Ampere, Apple silicon). A 64-byte
 * chunk of codes is four 128-bit vectors of 4 rows each, 4 codes of a row in each 32-bit lane, which is
 * exactly what `sdot` against 4 int8 activations broadcast to every lane sums. Codes are unsigned; 2-
 * and 4-bit ones are below 128 and go in as they are, 8-bit ones as two nibbles (low + 16 x high).
 * The integer sums are exact and the float epilogue is the _ref kernel's (fused multiply-adds in the
 * same order), so the results are the same bits. Checked under qemu-user in CI (tests/cross_neon.sh);
 * no speed figures without an ARM machine. */
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/qpack_neon.h"

#ifndef TLLM_QPACK_NEON_TILE_TOKENS
#define TLLM_QPACK_NEON_TILE_TOKENS 4 /* tokens per tile: 4 x 4 accumulators of 32 vector registers */
#endif

#if defined(__aarch64__)
#include <arm_neon.h>

#define TGT __attribute__((target("arch=armv8.2-a+dotprod")))
#define INLINE static inline __attribute__((always_inline))

TGT INLINE float32x4_t load4(const void *src, enum tllm_dtype dt, size_t off) {
    if (dt == TLLM_DT_BF16) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)src + off), 16));
    if (dt == TLLM_DT_F16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)src + off)));
    return vld1q_f32((const float *)src + off);
}

TGT INLINE int8x16_t bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

/* Rows of block b for tokens [t0, t0 + NT); NT, BITS and LEVELS are constants at every call site. */
TGT INLINE void tile(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const int NT,
                     const int BITS, const int LEVELS, const int LUT) {
    const int per = 8 / BITS, ng = p->cols / p->group_size, bpg = tllm_qpack_subblocks(p);
    const int nb = p->cols / TLLM_XQ_BLOCK, chunks = tllm_qpack_subcols(p) / (4 * per);
    const uint8x16_t mask = vdupq_n_u8((uint8_t)((1 << BITS) - 1)), nib = vdupq_n_u8(0x0F), lut = vld1q_u8(tllm_e2m1_u8);
    const uint8_t *c = p->codes + (size_t)b * p->block_bytes;
    const int8_t *xq = x->q + (size_t)t0 * p->cols, *xq2 = LEVELS == 2 ? x->q2 + (size_t)t0 * p->cols : NULL;
    const float *xd = x->d + (size_t)t0 * nb, *xs = x->sum + (size_t)t0 * nb;
    float32x4_t acc[4][4];
    for (int t = 0; t < NT; t++)
        for (int q = 0; q < 4; q++) acc[t][q] = vdupq_n_f32(0);
    for (int g = 0; g < ng; g++) {
        size_t so = ((size_t)b * ng + g) * TLLM_QPACK_ROWS;
        float32x4_t f[4][4];
        float ssum[4];
        for (int t = 0; t < NT; t++) {
            for (int q = 0; q < 4; q++) f[t][q] = vdupq_n_f32(0);
            ssum[t] = 0.0f;
        }
        for (int k = 0; k < bpg; k++) {
            const int col0 = g * p->group_size + k * TLLM_XQ_BLOCK, kb = col0 / TLLM_XQ_BLOCK;
            int32x4_t dot[4][4], hi[4][4], dot2[4][4], hi2[4][4];
            for (int t = 0; t < NT; t++)
                for (int q = 0; q < 4; q++) dot[t][q] = hi[t][q] = dot2[t][q] = hi2[t][q] = vdupq_n_s32(0);
            for (int ch = 0; ch < chunks; ch++, c += 64) {
                uint8x16_t v[4] = {vld1q_u8(c), vld1q_u8(c + 16), vld1q_u8(c + 32), vld1q_u8(c + 48)};
                for (int m = 0; m < per; m++) {
                    int8x16_t w[4], wh[4];
                    for (int q = 0; q < 4; q++) {
                        uint8x16_t u = BITS == 8 ? v[q] : vandq_u8(m ? vshlq_u8(v[q], vdupq_n_s8((int8_t)(-BITS * m))) : v[q], mask);
                        if (LUT) u = vqtbl1q_u8(lut, u); /* 0..24: a signed byte as it is */
                        w[q] = vreinterpretq_s8_u8(BITS == 8 ? vandq_u8(u, nib) : u);
                        wh[q] = vreinterpretq_s8_u8(vshrq_n_u8(v[q], 4));
                    }
                    const size_t off = (size_t)col0 + ch * 4 * per + 4 * m;
                    for (int t = 0; t < NT; t++) {
                        int8x16_t xb = bcast4(xq + (size_t)t * p->cols + off);
                        for (int q = 0; q < 4; q++) {
                            dot[t][q] = vdotq_s32(dot[t][q], w[q], xb);
                            if (BITS == 8) hi[t][q] = vdotq_s32(hi[t][q], wh[q], xb);
                        }
                        if (LEVELS == 2) {
                            int8x16_t xb2 = bcast4(xq2 + (size_t)t * p->cols + off);
                            for (int q = 0; q < 4; q++) {
                                dot2[t][q] = vdotq_s32(dot2[t][q], w[q], xb2);
                                if (BITS == 8) hi2[t][q] = vdotq_s32(hi2[t][q], wh[q], xb2);
                            }
                        }
                    }
                }
            }
            for (int t = 0; t < NT; t++) {
                float32x4_t dt = vdupq_n_f32(xd[(size_t)t * nb + kb]);
                for (int q = 0; q < 4; q++) {
                    int32x4_t d = BITS == 8 ? vaddq_s32(dot[t][q], vshlq_n_s32(hi[t][q], 4)) : dot[t][q];
                    if (LEVELS == 2) {
                        int32x4_t d2 = BITS == 8 ? vaddq_s32(dot2[t][q], vshlq_n_s32(hi2[t][q], 4)) : dot2[t][q];
                        d = vaddq_s32(vshlq_n_s32(d, 7), d2);
                    }
                    f[t][q] = vfmaq_f32(f[t][q], vcvtq_f32_s32(d), dt);
                }
                ssum[t] += tllm_xq_group_sum(x, xs, t0, t, nb, kb, p->group_size, col0);
            }
        }
        for (int q = 0; q < 4; q++) {
            float32x4_t S = load4(p->scales, p->dtype, so + 4 * q);
            if (LUT) { /* w = s (u - offset): one scale, the offset times the x sum taken out first */
                for (int t = 0; t < NT; t++)
                    acc[t][q] = vfmaq_f32(acc[t][q], vfmaq_f32(f[t][q], vdupq_n_f32(-(float)TLLM_E2M1_OFFSET), vdupq_n_f32(ssum[t])), S);
                continue;
            }
            float32x4_t B = load4(p->biases, p->dtype, so + 4 * q);
            for (int t = 0; t < NT; t++) {
                acc[t][q] = vfmaq_f32(acc[t][q], f[t][q], S);
                acc[t][q] = vfmaq_f32(acc[t][q], B, vdupq_n_f32(ssum[t]));
            }
        }
    }
    int n_out = p->rows - b * TLLM_QPACK_ROWS < TLLM_QPACK_ROWS ? p->rows - b * TLLM_QPACK_ROWS : TLLM_QPACK_ROWS;
    for (int t = 0; t < NT; t++) {
        float tmp[16];
        for (int q = 0; q < 4; q++) vst1q_f32(tmp + 4 * q, acc[t][q]);
        memcpy(y + (size_t)(t0 + t) * p->rows + (size_t)b * TLLM_QPACK_ROWS, tmp, (size_t)n_out * sizeof *tmp);
    }
}

#define TILE(BITS, NT, L)                                                                                     \
    TGT static void tile##L##_##BITS##_##NT(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, \
                                            int t0) {                                                          \
        tile(p, x, y, b, t0, NT, BITS == 41 ? 4 : BITS, L, BITS == 41);                                        \
    }
#define TILES(BITS, L) TILE(BITS, 1, L) TILE(BITS, 2, L) TILE(BITS, 3, L) TILE(BITS, 4, L)
TILES(2, 1)
TILES(4, 1)
TILES(8, 1)
TILES(41, 1) /* 4-bit codes through the E2M1 table */
TILES(2, 2)
TILES(4, 2)
TILES(8, 2)
TILES(41, 2)
#define ROW(BITS, L) {tile##L##_##BITS##_1, tile##L##_##BITS##_2, tile##L##_##BITS##_3, tile##L##_##BITS##_4}
static tllm_qpack_tile_fn *const tiles[2][4][4] = {{ROW(2, 1), ROW(4, 1), ROW(8, 1), ROW(41, 1)},
                                                   {ROW(2, 2), ROW(4, 2), ROW(8, 2), ROW(41, 2)}};

#if TLLM_QPACK_NEON_TILE_TOKENS > 4 || TLLM_QPACK_NEON_TILE_TOKENS < 1
#error "TLLM_QPACK_NEON_TILE_TOKENS must be 1..4"
#endif

void tllm_qpack_matmul_neon(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    if (tllm_qpack_planes(p) || p->super || p->sym) { /* not made where this kernel runs (tllm_qpack_forms_native), but read right */
        tllm_qpack_matmul_ref(p, x, y, b0, b1);
        return;
    }
    const int bi = tllm_qpack_kind(p);
    const struct tllm_qpack_tiles t = {{tiles[0][bi], tiles[1][bi]}, {TLLM_QPACK_NEON_TILE_TOKENS, TLLM_QPACK_NEON_TILE_TOKENS}, 1};
    tllm_qpack_run_tiles(p, x, y, b0, b1, &t);
}

#else
void tllm_qpack_matmul_neon(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    tllm_qpack_matmul_ref(p, x, y, b0, b1);
}
#endif
