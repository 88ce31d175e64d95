/* AMX kernel of the integer-activation matmul (layout: qpack.h), for prompts and steps of many
 * sequences on CPUs with Intel's tile unit (Sapphire Rapids and later). The pack's unpacked 64-byte
 * vectors (4 codes of each of a row block's 16 rows) are exactly the B operand of TDPBSUD in its VNNI
 * form: the 8 of an activation block (32 columns) are one 8 x 64-byte B tile, read from a row block's
 * codes unpacked once to bytes. The A operand is 16 tokens' int8 activations of that block, loaded in
 * place (stride: the row). One TDPBSUD gives the block's 16 x 16 int32 sums.
 *
 * Each activation block has its own scale, so every block's sums leave the tiles (TILESTORED) for a
 * float epilogue, which is the _ref kernel's, fused multiply-add for fused multiply-add: the same bits.
 * Read right after the tile store, the sums would stall on it (no store forwarding from tiles), so the
 * epilogue runs one weight group behind the tile work, from the other half of a double buffer; two
 * token tiles times two row blocks give four independent products a block (tiles are not renamed).
 * That epilogue (a store, a conversion and a multiply-add per 16 sums) is what bounds the kernel: about
 * 1.2-1.6x the AVX-512 kernel on prompts (docs/performance.md), where tiles with one scale over many
 * blocks would be several times that.
 *
 * Tokens in whole tiles of 16 with one activation level go through the tiles when there are at least
 * TLLM_AMX_MIN_TOKENS of them; the rest (the last tokens, tokens with two levels, which are generated
 * ones, steps of few tokens) and the packs it does not take (E2M1 tables, groups of 16 or of more than
 * TLLM_AMX_MAX_GROUP_BLOCKS blocks) through the AVX-512 kernel. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/qpack_amx.h"
#include "kernels/cpu/qpack_avx512.h"

#define AMX_TOKENS 16 /* A tile rows: tokens a tile */
#ifndef TLLM_AMX_MAX_UNPACKED
#define TLLM_AMX_MAX_UNPACKED (1 << 20) /* bytes of unpacked codes a call holds at most (row blocks at a time) */
#endif
#ifndef TLLM_AMX_MIN_TOKENS
#define TLLM_AMX_MIN_TOKENS 32 /* one-level tokens a call needs for the tiles (two A tiles) */
#endif
#ifndef TLLM_AMX_MAX_GROUP_BLOCKS
#define TLLM_AMX_MAX_GROUP_BLOCKS 8 /* activation blocks a weight group at most: groups up to 256 */
#endif

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <stdint.h>

#define TGT __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq")))
#define INLINE static inline __attribute__((always_inline))

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Tiles: A (16 tokens x 32 bytes) of two token tiles in 0 and 1, B (8 rows of 64 bytes) of two row blocks
 * in 2 and 3, and their four products C (16 x 16 int32) in 4 to 7: four independent TDPBSUDs between a
 * product's tile store and its next use, so the unit is not left waiting on one chain. In static
 * memory: GCC 12 drops the stores of a local configuration before ldtilecfg as dead (seen on the lent Xeon). */
static const struct tile_config config = {
    .palette = 1,
    .colsb = {TLLM_XQ_BLOCK, TLLM_XQ_BLOCK, 64, 64, 64, 64, 64, 64},
    .rows = {AMX_TOKENS, AMX_TOKENS, TLLM_XQ_BLOCK / 4, TLLM_XQ_BLOCK / 4, AMX_TOKENS, AMX_TOKENS, AMX_TOKENS, AMX_TOKENS},
};

/* Each thread loads the configuration once */
TGT static void configure(void) {
    static __thread int done;
    if (done) return;
    _tile_loadconfig(&config);
    done = 1;
}

/* Row block b's codes as bytes: 64-byte vector q holds columns 4q .. 4q + 3 of each of the 16 rows */
TGT static void unpack(const struct tllm_qpack *p, int b, uint8_t *out) {
    if (tllm_qpack_planes(p)) { /* each sub-block's 4-bit codes, each vector's planes added by masked byte adds */
        const int S = tllm_qpack_subcols(p), V = S / 4, PL = p->bits - 4;
        const __m512i nib = _mm512_set1_epi8(0x0F);
        const uint8_t *c = p->codes + (size_t)b * p->block_bytes;
        for (int s0 = 0; s0 < p->cols; s0 += S) {
            const uint8_t *pl = c + 64 * (size_t)(S / 8);
            for (int ch = 0; ch < S / 8; ch++, c += 64) {
                __m512i v = _mm512_load_si512((const void *)c);
                for (int m = 0; m < 2; m++) {
                    __m512i w = _mm512_and_si512(m ? _mm512_srli_epi16(v, 4) : v, nib);
                    for (int e = 0; e < PL; e++) {
                        uint64_t word;
                        memcpy(&word, pl + 8 * (e * V + 2 * ch + m), 8);
                        w = _mm512_mask_add_epi8(w, _cvtu64_mask64(word), w, _mm512_set1_epi8((char)(16 << e)));
                    }
                    _mm512_store_si512((void *)(out + 64 * ((size_t)s0 / 4 + 2 * (size_t)ch + (size_t)m)), w);
                }
            }
            c += 8 * (size_t)PL * V;
        }
        return;
    }
    const int per = 8 / p->bits, n = (int)(p->block_bytes / 64);
    const __m512i mask = _mm512_set1_epi8((char)((1 << p->bits) - 1));
    const uint8_t *c = p->codes + (size_t)b * p->block_bytes;
    for (int ch = 0; ch < n; ch++) {
        __m512i v = _mm512_load_si512((const void *)(c + 64 * (size_t)ch));
        for (int m = 0; m < per; m++)
            _mm512_store_si512((void *)(out + 64 * ((size_t)ch * per + m)),
                               p->bits == 8 ? v : _mm512_and_si512(m ? _mm512_srli_epi16(v, p->bits * m) : v, mask));
    }
}

/* Group g's block sums of the MB row blocks from b and the 16 tokens from t0 (dots[k][c + n][token][row])
 * into acc[c + n]: per token and row, f = the blocks' dot * d summed by fused multiply-adds from 0, then
 * acc = fma(f, s, acc) and acc = fma(b, the blocks' x sums, acc). MB is a constant at every call site. */
TGT INLINE void epilogue(const struct tllm_qpack *p, const struct tllm_xq *x, float (*acc)[AMX_TOKENS][16],
                         int32_t (*dots)[4][AMX_TOKENS][16], int c, int b, int t0, int g, int bpg, const int MB) {
    const int nb = p->cols / TLLM_XQ_BLOCK;
    const __m512 S0 = tllm_qpack_params16_avx512(p, 0, b, g), B0 = tllm_qpack_params16_avx512(p, 1, b, g);
    const __m512 S1 = MB > 1 ? tllm_qpack_params16_avx512(p, 0, b + 1, g) : S0;
    const __m512 B1 = MB > 1 ? tllm_qpack_params16_avx512(p, 1, b + 1, g) : B0;
    for (int t = 0; t < AMX_TOKENS; t++) {
        const size_t o = (size_t)(t0 + t) * nb + (size_t)g * bpg;
        __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps();
        float ssum = 0.0f;
        for (int k = 0; k < bpg; k++) {
            const __m512 d = _mm512_set1_ps(x->d[o + k]);
            f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)dots[k][c][t])), d, f0);
            if (MB > 1) f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)dots[k][c + 1][t])), d, f1);
            ssum += x->sum[o + k];
        }
        const __m512 s = _mm512_set1_ps(ssum);
        _mm512_store_ps(acc[c][t], _mm512_fmadd_ps(B0, s, _mm512_fmadd_ps(f0, S0, _mm512_load_ps(acc[c][t]))));
        if (MB > 1) _mm512_store_ps(acc[c + 1][t], _mm512_fmadd_ps(B1, s, _mm512_fmadd_ps(f1, S1, _mm512_load_ps(acc[c + 1][t]))));
    }
}

/* Rows of MB row blocks from b (codes unpacked in w, one block after another) for MT x 16 tokens from t0,
 * one level. MT and MB (1 or 2) are constants at every call site. */
struct scratch { /* a call's buffers (on the heap: a caller's thread may have a small stack) */
    int32_t dots[2][TLLM_AMX_MAX_GROUP_BLOCKS][4][AMX_TOKENS][16]; /* [half][block of the group][product] */
    float acc[4][AMX_TOKENS][16];                                     /* [product][token][row] */
    uint8_t codes[];                                                  /* row blocks' codes unpacked */
};

TGT INLINE void tiles(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const uint8_t *w,
                      struct scratch *sc, const int MT, const int MB) {
    const int ng = p->cols / p->group_size, bpg = p->group_size / TLLM_XQ_BLOCK;
    const size_t stride = (size_t)p->cols, wb = (size_t)p->cols * TLLM_QPACK_ROWS;
    int32_t(*dots)[TLLM_AMX_MAX_GROUP_BLOCKS][4][AMX_TOKENS][16] = sc->dots;
    float(*acc)[AMX_TOKENS][16] = sc->acc;
    memset(sc->acc, 0, sizeof sc->acc);
    const int8_t *xq = x->q + (size_t)t0 * p->cols;
    /* The epilogue runs a group behind, from the other half of dots, its products spread over the
     * group's blocks so that the next tile instructions are never far behind in the instruction stream */
    for (int g = 0; g <= ng; g++) {
        for (int k = 0; k < (g < ng ? bpg : 1); k++) {
            if (g < ng) {
                const size_t col0 = ((size_t)g * bpg + k) * TLLM_XQ_BLOCK;
                int32_t(*d)[AMX_TOKENS][16] = dots[g & 1][k];
                _tile_loadd(0, xq + col0, stride);
                if (MT > 1) _tile_loadd(1, xq + AMX_TOKENS * stride + col0, stride);
                _tile_loadd(2, w + col0 * TLLM_QPACK_ROWS, 64);
                if (MB > 1) _tile_loadd(3, w + wb + col0 * TLLM_QPACK_ROWS, 64);
                _tile_zero(4);
                if (MB > 1) _tile_zero(5);
                if (MT > 1) _tile_zero(6);
                if (MT > 1 && MB > 1) _tile_zero(7);
                _tile_dpbsud(4, 0, 2);
                if (MB > 1) _tile_dpbsud(5, 0, 3);
                if (MT > 1) _tile_dpbsud(6, 1, 2);
                if (MT > 1 && MB > 1) _tile_dpbsud(7, 1, 3);
                _tile_stored(4, d[0], 64);
                if (MB > 1) _tile_stored(5, d[1], 64);
                if (MT > 1) _tile_stored(6, d[2], 64);
                if (MT > 1 && MB > 1) _tile_stored(7, d[3], 64);
            }
            if (g == 0) continue;
            const int steps = g < ng ? bpg : 1, m0 = k * MT / steps, m1 = (k + 1) * MT / steps;
            for (int m = m0; m < m1; m++) epilogue(p, x, acc, dots[(g - 1) & 1], 2 * m, b, t0 + AMX_TOKENS * m, g - 1, bpg, MB);
        }
    }
    for (int n = 0; n < MB; n++) {
        int n_out = p->rows - (b + n) * TLLM_QPACK_ROWS;
        __mmask16 keep = n_out >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n_out) - 1);
        for (int m = 0; m < MT; m++)
            for (int t = 0; t < AMX_TOKENS; t++)
                _mm512_mask_storeu_ps(y + (size_t)(t0 + AMX_TOKENS * m + t) * p->rows + (size_t)(b + n) * TLLM_QPACK_ROWS, keep,
                                      _mm512_load_ps(acc[2 * m + n][t]));
    }
}

TGT static void tiles_2x2(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const uint8_t *w, struct scratch *sc) {
    tiles(p, x, y, b, t0, w, sc, 2, 2);
}
TGT static void tiles_2x1(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const uint8_t *w, struct scratch *sc) {
    tiles(p, x, y, b, t0, w, sc, 2, 1);
}
TGT static void tiles_1x2(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const uint8_t *w, struct scratch *sc) {
    tiles(p, x, y, b, t0, w, sc, 1, 2);
}
TGT static void tiles_1x1(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0, const uint8_t *w, struct scratch *sc) {
    tiles(p, x, y, b, t0, w, sc, 1, 1);
}

void tllm_qpack_matmul_amx(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    const int n2 = x->n2 < x->n ? x->n2 : x->n, full = (x->n - n2) / AMX_TOKENS * AMX_TOKENS;
    const size_t unpacked = (size_t)p->cols * TLLM_QPACK_ROWS; /* bytes a row block */
    /* fewer tokens than TLLM_AMX_MIN_TOKENS, or a pack the tiles do not take: the AVX-512 kernel (the same bits) */
    if (p->lut || p->group_size < TLLM_XQ_BLOCK || p->group_size / TLLM_XQ_BLOCK > TLLM_AMX_MAX_GROUP_BLOCKS || full < TLLM_AMX_MIN_TOKENS ||
        unpacked > TLLM_AMX_MAX_UNPACKED) {
        tllm_qpack_matmul_avx512(p, x, y, b0, b1);
        return;
    }
    if (n2 > 0) {
        struct tllm_xq v = tllm_xq_view(x, 0, n2);
        tllm_qpack_matmul_avx512(p, &v, y, b0, b1);
    }
    if (n2 + full < x->n) {
        struct tllm_xq v = tllm_xq_view(x, n2 + full, x->n);
        tllm_qpack_matmul_avx512(p, &v, y + (size_t)(n2 + full) * p->rows, b0, b1);
    }
    configure();
    const int per_pass = (int)(TLLM_AMX_MAX_UNPACKED / unpacked); /* row blocks unpacked at a time */
    const int nblk = b1 - b0 < per_pass ? b1 - b0 : per_pass;
    struct scratch *sc = aligned_alloc(64, (sizeof(struct scratch) + (size_t)nblk * unpacked + 63) / 64 * 64);
    if (!sc) { /* no room: the AVX-512 kernel, which needs none, gives the same bits */
        struct tllm_xq v = tllm_xq_view(x, n2, n2 + full);
        tllm_qpack_matmul_avx512(p, &v, y + (size_t)n2 * p->rows, b0, b1);
        return;
    }
    uint8_t *w = sc->codes;
    for (int bb = b0; bb < b1; bb += nblk) {
        const int be = bb + nblk < b1 ? bb + nblk : b1;
        for (int b = bb; b < be; b++) unpack(p, b, w + (size_t)(b - bb) * unpacked);
        for (int t0 = n2; t0 < n2 + full; t0 += 2 * AMX_TOKENS) {
            const int two = t0 + 2 * AMX_TOKENS <= n2 + full;
            for (int b = bb; b < be; b += 2) {
                const uint8_t *wb = w + (size_t)(b - bb) * unpacked;
                if (b + 1 < be) (two ? tiles_2x2 : tiles_1x2)(p, x, y, b, t0, wb, sc);
                else (two ? tiles_2x1 : tiles_1x1)(p, x, y, b, t0, wb, sc);
            }
        }
    }
    free(sc);
}

#else
void tllm_qpack_matmul_amx(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    tllm_qpack_matmul_avx512(p, x, y, b0, b1);
}
#endif
