/* ggml's block layouts decoded into tllm's (the mapping: ggml_types.h). Each decoder turns one block
 * into its codes (one byte each, in element order) and the scale and bias of each of its groups. */
#include "engine/load/ggml_types.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/dtype.h"
#include "engine/base/error.h"

#define QK_K 256

static const struct tllm_ggml_type types[] = {
    [0] = {"F32", 1, 4, 1},        [1] = {"F16", 1, 2, 1},         [2] = {"Q4_0", 32, 18, 1},
    [3] = {"Q4_1", 32, 20, 1},     [6] = {"Q5_0", 32, 22, 1},      [7] = {"Q5_1", 32, 24, 1},
    [8] = {"Q8_0", 32, 34, 1},     [9] = {"Q8_1", 32, 40, 0},      [10] = {"Q2_K", 256, 84, 1},
    [11] = {"Q3_K", 256, 110, 1},  [12] = {"Q4_K", 256, 144, 1},   [13] = {"Q5_K", 256, 176, 1},
    [14] = {"Q6_K", 256, 210, 1},  [15] = {"Q8_K", 256, 292, 0},   [16] = {"IQ2_XXS", 256, 66, 0},
    [17] = {"IQ2_XS", 256, 74, 0}, [18] = {"IQ3_XXS", 256, 98, 0}, [19] = {"IQ1_S", 256, 50, 0},
    [20] = {"IQ4_NL", 32, 18, 0},  [21] = {"IQ3_S", 256, 110, 0},  [22] = {"IQ2_S", 256, 82, 0},
    [23] = {"IQ4_XS", 256, 136, 0}, [24] = {"I8", 1, 1, 0},        [25] = {"I16", 1, 2, 0},
    [26] = {"I32", 1, 4, 0},       [27] = {"I64", 1, 8, 0},        [28] = {"F64", 1, 8, 0},
    [29] = {"IQ1_M", 256, 56, 0},  [30] = {"BF16", 1, 2, 1},       [34] = {"TQ1_0", 256, 54, 0},
    [35] = {"TQ2_0", 256, 66, 0},  [39] = {"MXFP4", 32, 17, 1},    [40] = {"NVFP4", 64, 36, 1},
    [41] = {"Q1_0", 128, 18, 0},
};

const struct tllm_ggml_type *tllm_ggml_type(uint32_t type) {
    if (type >= sizeof types / sizeof *types || !types[type].name) return NULL;
    return &types[type];
}

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return tllm_f16_to_f32(h);
}

/* How an affine type decodes: code width, group size, and the block decoder */
typedef void decode_fn(const uint8_t *blk, uint8_t *q, float *s, float *b);

static void dec_q4_0(const uint8_t *x, uint8_t *q, float *s, float *b) {
    float d = f16_at(x);
    for (int j = 0; j < 16; j++) q[j] = x[2 + j] & 15, q[j + 16] = x[2 + j] >> 4;
    s[0] = d, b[0] = -8.0f * d;
}

static void dec_q4_1(const uint8_t *x, uint8_t *q, float *s, float *b) {
    for (int j = 0; j < 16; j++) q[j] = x[4 + j] & 15, q[j + 16] = x[4 + j] >> 4;
    s[0] = f16_at(x), b[0] = f16_at(x + 2);
}

/* Q5: the fifth bit of element j is bit j of qh */
static void q5_codes(const uint8_t *qh4, const uint8_t *qs, uint8_t *q) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
        q[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
}

static void dec_q5_0(const uint8_t *x, uint8_t *q, float *s, float *b) {
    float d = f16_at(x);
    q5_codes(x + 2, x + 6, q);
    s[0] = d, b[0] = -16.0f * d;
}

static void dec_q5_1(const uint8_t *x, uint8_t *q, float *s, float *b) {
    q5_codes(x + 4, x + 8, q);
    s[0] = f16_at(x), b[0] = f16_at(x + 2);
}

static void dec_q8_0(const uint8_t *x, uint8_t *q, float *s, float *b) {
    float d = f16_at(x);
    for (int j = 0; j < 32; j++) q[j] = (uint8_t)((int)(int8_t)x[2 + j] + 128);
    s[0] = d, b[0] = -128.0f * d;
}

/* block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin */
static void dec_q2_k(const uint8_t *x, uint8_t *q, float *s, float *b) {
    const uint8_t *sc = x, *qs = x + 16;
    float d = f16_at(x + 80), dmin = f16_at(x + 82);
    for (int i = 0; i < 16; i++) s[i] = d * (float)(sc[i] & 15), b[i] = -(dmin * (float)(sc[i] >> 4));
    /* each half of 128: 4 shifts x (16 from qs[0..16), 16 from qs[16..32)) */
    for (int h = 0, o = 0; h < 2; h++)
        for (int sh = 0; sh < 8; sh += 2)
            for (int k = 0; k < 32; k++) q[o++] = (qs[32 * h + k] >> sh) & 3;
}

/* The 16 six-bit scales of a Q3_K block (12 bytes: low nibbles in bytes 0-7, high pairs in 8-11) */
static void q3_k_scales(const uint8_t *p, int *sc) {
    for (int i = 0; i < 16; i++) {
        int lo = (p[i % 8] >> (4 * (i / 8))) & 15, hi = (p[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (lo | hi << 4) - 32;
    }
}

/* block_q3_K: hmask[32], qs[64], scales[12], d; value = low2 - (high bit clear ? 4 : 0) = code - 4 */
static void dec_q3_k(const uint8_t *x, uint8_t *q, float *s, float *b) {
    const uint8_t *hm = x, *qs = x + 32;
    float d = f16_at(x + 108);
    int sc[16];
    q3_k_scales(x + 96, sc);
    for (int i = 0; i < 16; i++) s[i] = d * (float)sc[i], b[i] = -4.0f * s[i];
    for (int h = 0, o = 0, bit = 0; h < 2; h++)
        for (int sh = 0; sh < 8; sh += 2, bit++)
            for (int k = 0; k < 32; k++, o++) q[o] = (uint8_t)(((qs[32 * h + k] >> sh) & 3) | (((hm[k] >> bit) & 1) << 2));
}

/* The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block (get_scale_min_k4's packing) */
static void k4_scale_min(int j, const uint8_t *p, int *sc, int *m) {
    if (j < 4) {
        *sc = p[j] & 63, *m = p[j + 4] & 63;
    } else {
     
