/* ggml's block layouts decoded into tllm's (the mapping: ggml_types.h). Each decoder turns one block
 * into its codes (one byte each, in element order) and the scale and bias of each of its groups. */
#include "engine/load/ggml_types.h"

#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"

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

enum tllm_dtype tllm_ggml_dense_dtype(uint32_t type) {
    return type == TLLM_GGML_F32 ? TLLM_DT_F32 : type == TLLM_GGML_F16 ? TLLM_DT_F16 : type == TLLM_GGML_BF16 ? TLLM_DT_BF16 : TLLM_DT_INVALID;
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
        *sc = (p[j + 4] & 15) | ((p[j - 4] >> 6) << 4);
        *m = (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
    }
}

static void k4_params(const uint8_t *x, float *s, float *b) {
    float d = f16_at(x), dmin = f16_at(x + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        k4_scale_min(j, x + 4, &sc, &m);
        s[j] = d * (float)sc, b[j] = -(dmin * (float)m);
    }
}

/* block_q4_K: d, dmin, scales[12], qs[128]; each 32 bytes hold sub-blocks 2i (low) and 2i+1 (high nibbles) */
static void dec_q4_k(const uint8_t *x, uint8_t *q, float *s, float *b) {
    const uint8_t *qs = x + 16;
    k4_params(x, s, b);
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 32; l++) q[64 * i + l] = qs[32 * i + l] & 15, q[64 * i + 32 + l] = qs[32 * i + l] >> 4;
}

/* block_q5_K: d, dmin, scales[12], qh[32], qs[128]; the fifth bit of sub-block j is bit j of qh[l] */
static void dec_q5_k(const uint8_t *x, uint8_t *q, float *s, float *b) {
    const uint8_t *qh = x + 16, *qs = x + 48;
    k4_params(x, s, b);
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 32; l++) {
            q[64 * i + l] = (uint8_t)((qs[32 * i + l] & 15) | (((qh[l] >> (2 * i)) & 1) << 4));
            q[64 * i + 32 + l] = (uint8_t)((qs[32 * i + l] >> 4) | (((qh[l] >> (2 * i + 1)) & 1) << 4));
        }
}

/* block_q6_K: ql[128], qh[64], scales[16] (int8), d; value = code - 32 */
static void dec_q6_k(const uint8_t *x, uint8_t *q, float *s, float *b) {
    const uint8_t *ql = x, *qh = x + 128;
    const int8_t *sc = (const int8_t *)(x + 192);
    float d = f16_at(x + 208);
    for (int i = 0; i < 16; i++) s[i] = d * (float)sc[i], b[i] = -32.0f * s[i];
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
            uint8_t *o = q + 128 * h;
            o[l] = (uint8_t)((L[l] & 15) | ((H[l] & 3) << 4));
            o[l + 32] = (uint8_t)((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4));
            o[l + 64] = (uint8_t)((L[l] >> 4) | (((H[l] >> 4) & 3) << 4));
            o[l + 96] = (uint8_t)((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4));
        }
}

struct affine_type {
    uint32_t type;
    int bits, group;
    decode_fn *decode;
};

static const struct affine_type affine_types[] = {
    {TLLM_GGML_Q4_0, 4, 32, dec_q4_0}, {TLLM_GGML_Q4_1, 4, 32, dec_q4_1}, {TLLM_GGML_Q5_0, 5, 32, dec_q5_0},
    {TLLM_GGML_Q5_1, 5, 32, dec_q5_1}, {TLLM_GGML_Q8_0, 8, 32, dec_q8_0}, {TLLM_GGML_Q2_K, 2, 16, dec_q2_k},
    {TLLM_GGML_Q3_K, 3, 16, dec_q3_k}, {TLLM_GGML_Q4_K, 4, 32, dec_q4_k}, {TLLM_GGML_Q5_K, 5, 32, dec_q5_k},
    {TLLM_GGML_Q6_K, 6, 16, dec_q6_k},
};

/* code j of a row's little-endian bit stream */
static inline void put_code(uint32_t *row, size_t j, int bits, uint32_t c) {
    size_t bit = j * (size_t)bits;
    unsigned sh = (unsigned)(bit & 31);
    row[bit >> 5] |= c << sh;
    if (sh + (unsigned)bits > 32) row[(bit >> 5) + 1] |= c >> (32 - sh);
}

static int f16_exact(float v) { return tllm_f16_to_f32(tllm_f32_to_f16(v)) == v; }

/* the matrix being bound */
struct mat {
    const char *name;
    uint32_t type;
    const void *data;
};

static int bind_affine(const struct mat *t, const char *file, const struct affine_type *a, struct tllm_qweights *w,
                       void *owned[2]) {
    const struct tllm_ggml_type *ty = tllm_ggml_type(t->type);
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols, bpr = cols / (size_t)ty->block;
    const size_t gpb = (size_t)(ty->block / a->group), ng = cols / (size_t)a->group, words = cols * (size_t)a->bits / 32;
    uint32_t *codes = calloc(rows * words + 1, 4);
    float *sb = malloc(2 * rows * ng * sizeof *sb + 4); /* scales [rows x ng], then biases */
    if (!codes || !sb) {
        free(codes);
        free(sb);
        return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory converting tensor '%s'", file, t->name);
    }
    uint8_t q[QK_K];
    const uint8_t *src = t->data;
    int f16 = 1;
    for (size_t r = 0; r < rows; r++)
        for (size_t k = 0; k < bpr; k++) {
            float *s = sb + r * ng + k * gpb, *b = sb + rows * ng + r * ng + k * gpb;
            a->decode(src + (r * bpr + k) * (size_t)ty->bytes, q, s, b);
            for (int j = 0; j < ty->block; j++) put_code(codes + r * words, k * (size_t)ty->block + (size_t)j, a->bits, q[j]);
            for (size_t g = 0; g < gpb; g++) f16 &= f16_exact(s[g]) & f16_exact(b[g]);
        }
    for (size_t i = 0; i < 2 * rows * ng; i++)
        if (!(sb[i] - sb[i] == 0.0f)) { /* inf or NaN */
            free(codes);
            free(sb);
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' (%s) has a non-finite %s in row %zu", file, t->name, ty->name,
                             i < rows * ng ? "scale" : "bias", (i % (rows * ng)) / ng);
        }
    if (f16) { /* the same values in half the bytes */
        uint16_t *h = (uint16_t *)sb;
        for (size_t i = 0; i < 2 * rows * ng; i++) h[i] = tllm_f32_to_f16(sb[i]);
    }
    w->format = TLLM_WF_AFFINE;
    w->dtype = f16 ? TLLM_DT_F16 : TLLM_DT_F32;
    w->bits = a->bits;
    w->group_size = a->group;
    w->w = codes;
    w->scales = sb;
    w->biases = f16 ? (const void *)((uint16_t *)sb + rows * ng) : (const void *)(sb + rows * ng);
    owned[0] = codes, owned[1] = sb;
    return TLLM_OK;
}

/* MXFP4 (e, qs[16]: element j low nibble of qs[j], j + 16 high) and NVFP4 (d[4] UE4M3, qs[32]: sub-block i's
 * element j low nibble of qs[8i + j], j + 8 high): ggml's kvalues index is the E2M1 code itself, and its
 * halved scale times doubled values is the format's scale times the E2M1 value */
static int bind_fp4(const struct mat *t, const char *file, struct tllm_qweights *w, void *owned[2]) {
    const int nv = t->type == TLLM_GGML_NVFP4, gs = nv ? 16 : 32;
    const struct tllm_ggml_type *ty = tllm_ggml_type(t->type);
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols, bpr = cols / (size_t)ty->block, ng = cols / (size_t)gs;
    uint32_t *codes = calloc(rows * cols / 8 + 1, 4);
    uint8_t *sc = malloc(rows * ng + 1);
    if (!codes || !sc) {
        free(codes);
        free(sc);
        return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory converting tensor '%s'", file, t->name);
    }
    const uint8_t *src = t->data;
    for (size_t r = 0; r < rows; r++) {
        uint32_t *row = codes + r * (cols / 8);
        for (size_t k = 0; k < bpr; k++) {
            const uint8_t *x = src + (r * bpr + k) * (size_t)ty->bytes;
            for (int i = 0; i < (nv ? 4 : 1); i++) {
                const uint8_t *qs = nv ? x + 4 + 8 * i : x + 1;
                uint8_t e = x[i];
                size_t g = r * ng + k * (size_t)(ty->block / gs) + (size_t)i, j0 = (k * (size_t)(ty->block / gs) + (size_t)i) * (size_t)gs;
                if (!nv && e == 255) {
                    free(codes);
                    free(sc);
                    return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: tensor '%s' (MXFP4) has the scale byte 255 (2^128) in row %zu, "
                                     "which E8M0 reads as NaN", file, t->name, r);
                }
                if (nv) e = e == 0x7f ? 0 : (e & 0x7f); /* ggml reads UE4M3 unsigned (bit 7 ignored), 0x7f as 0 */
                sc[g] = e;
                for (int j = 0; j < gs / 2; j++) {
                    put_code(row, j0 + (size_t)j, 4, qs[j] & 15);
                    put_code(row, j0 + (size_t)(gs / 2 + j), 4, qs[j] >> 4);
                }
            }
        }
    }
    w->format = nv ? TLLM_WF_NVFP4 : TLLM_WF_MXFP4;
    w->dtype = TLLM_DT_U8;
    w->bits = 4;
    w->group_size = gs;
    w->w = codes;
    w->scales = sc;
    w->biases = NULL;
    owned[0] = codes, owned[1] = sc;
    return TLLM_OK;
}

int tllm_ggml_bind(const char *name, uint32_t type, int64_t rows, int64_t cols, const void *data, const char *file,
                   struct tllm_qweights *w, void *owned[2]) {
    const struct tllm_ggml_type *ty = tllm_ggml_type(type);
    const struct mat t = {name, type, data};
    owned[0] = owned[1] = NULL;
    memset(w, 0, sizeof *w);
    w->name = name;
    if (rows < 1 || cols < 1 || rows > INT32_MAX || cols > INT32_MAX || (ty && cols % ty->block))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' is not a matrix tllm can hold", file, name);
    w->rows = (int)rows, w->cols = (int)cols;
    if (!ty || !ty->runs)
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: tensor '%s' has type %s, which tllm does not run (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                         "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, NVFP4 are)", file, name, ty ? ty->name : "?");
    if (tllm_ggml_dense_dtype(type) != TLLM_DT_INVALID) {
        w->format = TLLM_WF_DENSE;
        w->dtype = tllm_ggml_dense_dtype(type);
        w->w = data;
        return TLLM_OK;
    }
    if (type == TLLM_GGML_MXFP4 || type == TLLM_GGML_NVFP4) return bind_fp4(&t, file, w, owned);
    for (size_t i = 0; i < sizeof affine_types / sizeof *affine_types; i++)
        if (affine_types[i].type == type) return bind_affine(&t, file, &affine_types[i], w, owned);
    return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: tensor '%s': type %s has no mapping", file, name, ty->name);
}
