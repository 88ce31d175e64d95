/* AVX-512 VNNI kernel of the integer-activation matmul (layout: qpack.h). One vpdpbusd multiplies
 * 64 unsigned codes (4 of each of 16 rows) by 4 int8 activations broadcast to every lane, so a
 * 16-row block's dot products accumulate in one register per token with no horizontal sums.
 * A tile is one row block x up to TILE_TOKENS tokens: each chunk of codes is loaded and unpacked once
 * for all the tile's tokens (prefill), and decode is the same code with one token.
 * Compiled for AVX-512 via target attributes and chosen at run time, so the binary runs anywhere. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qpack.h" /* the layout, and the _ref kernel where AVX-512 is not compiled */
#include "kernels/cpu/qpack_avx512.h"

#ifndef TLLM_QPACK_TILE_TOKENS
#define TLLM_QPACK_TILE_TOKENS 8 /* tokens per tile: 2 x 8 accumulators fit the 32 vector registers */
#endif
#ifndef TLLM_QPACK_TILE_TOKENS2
#define TLLM_QPACK_TILE_TOKENS2 4 /* tokens per tile with two levels (twice the accumulators) */
#endif
#ifndef TLLM_QPACK_TILE_BLOCKS
#define TLLM_QPACK_TILE_BLOCKS 4 /* row blocks whose codes stay in L1/L2 while every token tile passes */
#endif

#ifndef TLLM_QPACK_PREFETCH
#define TLLM_QPACK_PREFETCH 2048 /* bytes ahead in the code stream to prefetch (0: none) */
#endif

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define INLINE static inline __attribute__((always_inline))

/* acc += w . (the 4 int8 at p, broadcast to every lane), the broadcast embedded in vpdpbusd's memory
 * operand: GCC 12 emits a separate vpbroadcastd instead, which on Zen 4 takes a vector pipe (a loop of
 * broadcast + vpdpbusd pairs runs at 2.6 G/s a core, the embedded form at vpdpbusd's 3.7) */
TGT INLINE __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
    return acc;
}

/* Rows of block b for tokens [t0, t0 + NT). NT and BITS are constants at every call site, so the
 * token loops unroll and the accumulators live in registers. PL: planes of higher bits after each
 * sub-block's CH chunks of 4-bit codes (5- and 6-bit packs), each added to its vector by a masked byte add. */
TGT INLINE void tile(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const int NT,
                     const int BITS, const int LEVELS, const int LUT, const int CH, const int PL) {
    const int per = 8 / BITS, ng = p->cols / p->group_size, bpg = tllm_qpack_subblocks(p);
    const int nb = p->cols / TLLM_XQ_BLOCK;
    const __m512i mask = _mm512_set1_epi8((char)((1 << BITS) - 1));
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)tllm_e2m1_u8)); /* per 128-bit lane */
    const uint8_t *c = p->codes + (size_t)b * p->block_bytes;
    const int8_t *xq = x->q + (size_t)t0 * p->cols, *xq2 = LEVELS == 2 ? x->q2 + (size_t)t0 * p->cols : NULL;
    const float *xd = x->d + (size_t)t0 * nb, *xs = x->sum + (size_t)t0 * nb;
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512 f[8];    /* the group's sum of dot * d, per token */
        float ssum[8];  /* and of its blocks' x sums: scale and bias are applied once a group */
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) f[t] = _mm512_setzero_ps(), ssum[t] = 0.0f;
        for (int k = 0; k < bpg; k++) {
            const int col0 = g * p->group_size + k * TLLM_XQ_BLOCK, kb = col0 / TLLM_XQ_BLOCK;
            /* SPLIT independent sums per token and level: one chain of dependent vpdpbusd would make a
             * few-token tile latency-bound */
            const int SPLIT = NT * LEVELS == 1 ? 4 : NT * LEVELS <= 3 ? 2 : 1;
            __m512i dot[8][4], dot2[8][4];
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                #pragma GCC unroll 8
                for (int h = 0; h < SPLIT; h++) dot[t][h] = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int t = 0; t < NT && LEVELS == 2; t++)
                #pragma GCC unroll 8
                for (int h = 0; h < SPLIT; h++) dot2[t][h] = _mm512_setzero_si512();
            const uint8_t *pl = c + 64 * CH; /* PL: the sub-block's planes, 2 CH words each */
            #pragma GCC unroll 8
            for (int ch = 0; ch < CH; ch++, c += 64) {
                if (TLLM_QPACK_PREFETCH) _mm_prefetch((const char *)c + TLLM_QPACK_PREFETCH, _MM_HINT_T0);
                __m512i v = _mm512_load_si512((const void *)c);
                #pragma GCC unroll 8
                for (int m = 0; m < per; m++) {
                    __m512i w = BITS == 8 ? v : _mm512_and_si512(m ? _mm512_srli_epi16(v, BITS * m) : v, mask);
                    if (LUT) w = _mm512_shuffle_epi8(lut, w);
                    #pragma GCC unroll 2
                    for (int e = 0; e < PL; e++) {
                        uint64_t word;
                        memcpy(&word, pl + 8 * (e * 2 * CH + ch * per + m), 8);
                        w = _mm512_mask_add_epi8(w, _cvtu64_mask64(word), w, _mm512_set1_epi8((char)(16 << e)));
                    }
                    const int h = (ch * per + m) % SPLIT;
                    const size_t off = (size_t)col0 + ch * 4 * per + 4 * m;
                    #pragma GCC unroll 8
                    for (int t = 0; t < NT; t++) {
                        dot[t][h] = dpbusd_bcast(dot[t][h], w, xq + (size_t)t * p->cols + off);
                        if (LEVELS == 2)
                            dot2[t][h] = dpbusd_bcast(dot2[t][h], w, xq2 + (size_t)t * p->cols + off);
                    }
                }
            }
            c += 8 * PL * 2 * CH;
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                #pragma GCC unroll 8
                for (int h = 1; h < SPLIT; h++) dot[t][0] = _mm512_add_epi32(dot[t][0], dot[t][h]);
                if (LEVELS == 2) {
                    #pragma GCC unroll 8
                    for (int h = 1; h < SPLIT; h++) dot2[t][0] = _mm512_add_epi32(dot2[t][0], dot2[t][h]);
                    dot[t][0] = _mm512_add_epi32(_mm512_slli_epi32(dot[t][0], 7), dot2[t][0]);
                }
            }
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                __m512 dt = _mm512_set1_ps(xd[(size_t)t * nb + kb]);
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t][0]), dt, f[t]);
                ssum[t] += tllm_xq_group_sum(x, xs, t0, t, nb, kb, p->group_size, col0);
            }
        }
        __m512 S = tllm_qpack_params16_avx512(p, 0, b, g);
        if (LUT) { /* w = s (u - offset): one scale, the offset times the x sum taken out first */
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                acc[t] = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(-(float)TLLM_E2M1_OFFSET), _mm512_set1_ps(ssum[t]), f[t]), S, acc[t]);
        } else {
            __m512 B = tllm_qpack_params16_avx512(p, 1, b, g);
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                acc[t] = _mm512_fmadd_ps(f[t], S, acc[t]);
                acc[t] = _mm512_fmadd_ps(B, _mm512_set1_ps(ssum[t]), acc[t]);
            }
        }
    }
    int n_out = p->rows - b * TLLM_QPACK_ROWS;
    __mmask16 keep = n_out >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n_out) - 1);
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
        _mm512_mask_storeu_ps(y + (size_t)(t0 + t) * p->rows + (size_t)b * TLLM_QPACK_ROWS, keep, acc[t]);
}

/* The chunks of codes a sub-block has (BITS of them for a block of 32 columns, half as many for nvfp4's
 * 16) as a constant, so that their loop unrolls: with a counted loop GCC 12 peeled it and spilled
 * accumulators */
TGT INLINE void tile_chunks(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const int NT,
                            const int BITS, const int LEVELS, const int LUT, const int PL) {
    if (tllm_qpack_subcols(p) == TLLM_XQ_BLOCK) tile(p, x, y, b, t0, NT, BITS, LEVELS, LUT, BITS, PL);
    else tile(p, x, y, b, t0, NT, BITS, LEVELS, LUT, BITS / 2, PL);
}

/* BITS: 2, 4, 8; 41 for E2M1 codes; 5 and 6 for plane packs (4-bit codes and 1 or 2 planes) */
#define LOW_BITS(BITS) (BITS == 41 || BITS == 5 || BITS == 6 ? 4 : BITS)
#define PLANES(BITS) (BITS == 5 ? 1 : BITS == 6 ? 2 : 0)
#define TILE(BITS, NT)                                                                                     \
    TGT static void tile_##BITS##_##NT(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, \
                                       int t0) {                                                           \
        tile_chunks(p, x, y, b, t0, NT, LOW_BITS(BITS), 1, BITS == 41, PLANES(BITS));                      \
    }
#define TILE2(BITS, NT)                                                                                     \
    TGT static void tile2_##BITS##_##NT(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, \
                                        int t0) {                                                           \
        tile_chunks(p, x, y, b, t0, NT, LOW_BITS(BITS), 2, BITS == 41, PLANES(BITS));                       \
    }
#define TILES(BITS) TILE(BITS, 1) TILE(BITS, 2) TILE(BITS, 3) TILE(BITS, 4) TILE(BITS, 5) TILE(BITS, 6) TILE(BITS, 7) TILE(BITS, 8)
TILES(2)
TILES(4)
TILES(8)
TILES(41) /* 4-bit codes through the E2M1 table */
TILES(5)
TILES(6)
#define TILES2(BITS) TILE2(BITS, 1) TILE2(BITS, 2) TILE2(BITS, 3) TILE2(BITS, 4) TILE2(BITS, 5) TILE2(BITS, 6) TILE2(BITS, 7) TILE2(BITS, 8)
TILES2(2)
TILES2(4)
TILES2(8)
TILES2(41)
TILES2(5)
TILES2(6)
#define ROW(BITS) {tile_##BITS##_1, tile_##BITS##_2, tile_##BITS##_3, tile_##BITS##_4, tile_##BITS##_5, tile_##BITS##_6, tile_##BITS##_7, tile_##BITS##_8}
static tllm_qpack_tile_fn *const tiles[TLLM_QPACK_KINDS][8] = {ROW(2), ROW(4), ROW(8), ROW(41), ROW(5), ROW(6)};
#define ROW2(BITS) {tile2_##BITS##_1, tile2_##BITS##_2, tile2_##BITS##_3, tile2_##BITS##_4, tile2_##BITS##_5, tile2_##BITS##_6, tile2_##BITS##_7, tile2_##BITS##_8}
static tllm_qpack_tile_fn *const tiles2[TLLM_QPACK_KINDS][8] = {ROW2(2), ROW2(4), ROW2(8), ROW2(41), ROW2(5), ROW2(6)};

#if TLLM_QPACK_TILE_TOKENS > 8 || TLLM_QPACK_TILE_TOKENS < 1 || TLLM_QPACK_TILE_TOKENS2 > 8 || TLLM_QPACK_TILE_TOKENS2 < 1
#error "TLLM_QPACK_TILE_TOKENS and TLLM_QPACK_TILE_TOKENS2 must be 1..8"
#endif

/* The quantizer of qpack.c on two vectors a block, operation for operation (no contraction either: an
 * FMA would round x / d once where the portable loop rounds it twice). The amax keeps the scalar loop's
 * NaN rule: vmaxps returns its second operand when the first is NaN, as `a > amax ? a : amax` does. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) TLLM_NO_CONTRACT void tllm_xq_quantize_avx512(struct tllm_xq *xq, const float *x, int t0, int t1) {
    const int nb = xq->cols / TLLM_XQ_BLOCK;
    const __m512 magic = _mm512_set1_ps(0x1.8p23f), zero = _mm512_setzero_ps(), k128 = _mm512_set1_ps(128.0f);
    for (int t = t0; t < t1; t++)
        for (int b = 0; b < nb; b++) {
            const size_t o = (size_t)t * xq->cols + (size_t)b * TLLM_XQ_BLOCK;
            const __m512 x0 = _mm512_loadu_ps(x + o), x1 = _mm512_loadu_ps(x + o + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x1), _mm512_max_ps(_mm512_abs_ps(x0), zero)));
            float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            const __m512 vid = _mm512_set1_ps(id);
            const __m512 v0 = _mm512_mul_ps(x0, vid), v1 = _mm512_mul_ps(x1, vid);
            const __m512 r0 = _mm512_sub_ps(_mm512_add_ps(v0, magic), magic), r1 = _mm512_sub_ps(_mm512_add_ps(v1, magic), magic);
            /* whole numbers, converted exactly, then narrowed as the scalar cast does; the sums take the
             * narrowed codes back (they differ from the wide ones only for a NaN) */
            const __m128i c0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r0)), c1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r1));
            _mm_storeu_si128((__m128i *)(xq->q + o), c0);
            _mm_storeu_si128((__m128i *)(xq->q + o + 16), c1);
            __m512i s0 = _mm512_cvtepi8_epi32(c0), s1 = _mm512_cvtepi8_epi32(c1);
            if (t < xq->n2) {
                const __m512 w0 = _mm512_mul_ps(_mm512_sub_ps(v0, r0), k128), w1 = _mm512_mul_ps(_mm512_sub_ps(v1, r1), k128);
                const __m128i e0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_sub_ps(_mm512_add_ps(w0, magic), magic)));
                const __m128i e1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_sub_ps(_mm512_add_ps(w1, magic), magic)));
                _mm_storeu_si128((__m128i *)(xq->q2 + o), e0);
                _mm_storeu_si128((__m128i *)(xq->q2 + o + 16), e1);
                s0 = _mm512_add_epi32(_mm512_slli_epi32(s0, 7), _mm512_cvtepi8_epi32(e0));
                s1 = _mm512_add_epi32(_mm512_slli_epi32(s1, 7), _mm512_cvtepi8_epi32(e1));
                d *= 1.0f / 128.0f;
            }
            const int lo = _mm512_reduce_add_epi32(s0), isum = lo + _mm512_reduce_add_epi32(s1);
            xq->d[(size_t)t * nb + b] = d;
            xq->sum[(size_t)t * nb + b] = d * (float)isum;
            if (xq->sum16) {
                xq->sum16[(size_t)t * 2 * nb + 2 * (size_t)b] = d * (float)lo;
                xq->sum16[(size_t)t * 2 * nb + 2 * (size_t)b + 1] = d * (float)(isum - lo);
            }
        }
}

/* Row block b of a plane pack (5- or 6-bit codes) as 8-bit codes, in the 8-bit pack's layout, at out:
 * each vector the plane tile would make, stored once */
TGT static void unplane_block(const struct tllm_qpack *p, int b, uint8_t *out) {
    const int ng = p->cols / p->group_size, bpg = tllm_qpack_subblocks(p), PL = p->bits == 5 ? 1 : 2;
    const int CH = tllm_qpack_subcols(p) == TLLM_XQ_BLOCK ? 4 : 2; /* chunks of 4-bit codes a sub-block */
    const __m512i mask = _mm512_set1_epi8(15);
    const uint8_t *c = p->codes + (size_t)b * p->block_bytes;
    for (int s = 0; s < ng * bpg; s++) {
        const uint8_t *pl = c + 64 * CH;
        for (int ch = 0; ch < CH; ch++, c += 64) {
            __m512i v = _mm512_load_si512((const void *)c);
            for (int m = 0; m < 2; m++) {
                __m512i w = _mm512_and_si512(m ? _mm512_srli_epi16(v, 4) : v, mask);
                for (int e = 0; e < PL; e++) {
                    uint64_t word;
                    memcpy(&word, pl + 8 * (e * 2 * CH + ch * 2 + m), 8);
                    w = _mm512_mask_add_epi8(w, _cvtu64_mask64(word), w, _mm512_set1_epi8((char)(16 << e)));
                }
                _mm512_store_si512((void *)(out + 64 * (ch * 2 + m)), w);
            }
        }
        c += 8 * PL * 2 * CH;
        out += 64 * 2 * CH;
    }
}

#ifndef TLLM_QPACK_UNPLANE_TOKENS
#define TLLM_QPACK_UNPLANE_TOKENS 32 /* steps of this many tokens or more unpack plane blocks once (prefill) */
#endif
#ifndef TLLM_QPACK_UNPLANE_BYTES
#define TLLM_QPACK_UNPLANE_BYTES (512 << 10) /* the unpacked blocks a thread keeps at once (in L2) */
#endif

void tllm_qpack_matmul_avx512(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    const int bi = tllm_qpack_kind(p);
    const struct tllm_qpack_tiles t = {{tiles[bi], tiles2[bi]}, {TLLM_QPACK_TILE_TOKENS, TLLM_QPACK_TILE_TOKENS2}, TLLM_QPACK_TILE_BLOCKS};
    /* A plane pack in a step of many tokens: its masked adds once a block, not once a tile of tokens
     * (Zen 4 runs 512-bit byte adds on both of its vector pipes, beside vpdpbusd), then the 8-bit tiles
     * over the unpacked blocks. The same codes, so the same sums to the bit. */
    size_t bb8 = (size_t)TLLM_QPACK_ROWS * (size_t)p->cols;
    int per = (int)(TLLM_QPACK_UNPLANE_BYTES / bb8);
    per = per < 1 ? 1 : per;
    uint8_t *buf = tllm_qpack_planes(p) && x->n >= TLLM_QPACK_UNPLANE_TOKENS ? aligned_alloc(64, (size_t)per * bb8) : NULL;
    if (!buf) {
        tllm_qpack_run_tiles(p, x, y, b0, b1, &t);
        return;
    }
    struct tllm_qpack q8 = *p;
    q8.bits = 8, q8.block_bytes = bb8;
    const struct tllm_qpack_tiles t8 = {{tiles[2], tiles2[2]}, {TLLM_QPACK_TILE_TOKENS, TLLM_QPACK_TILE_TOKENS2}, TLLM_QPACK_TILE_BLOCKS};
    for (int bb = b0; bb < b1; bb += per) {
        int be = bb + per < b1 ? bb + per : b1;
        for (int b = bb; b < be; b++) unplane_block(p, b, buf + (size_t)(b - bb) * bb8);
        q8.codes = (uint8_t *)((uintptr_t)buf - (uintptr_t)bb * bb8); /* block b at buf + (b - bb) * bb8 */
        tllm_qpack_run_tiles(&q8, x, y, bb, be, &t8);
    }
    free(buf);
}

#else
void tllm_qpack_matmul_avx512(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    tllm_qpack_matmul_ref(p, x, y, b0, b1);
}
void tllm_xq_quantize_avx512(struct tllm_xq *xq, const float *x, int t0, int t1) { tllm_xq_quantize_ref(xq, x, t0, t1); }
#endif
