/* Portable fast path: each row is dequantized one chunk at a time and the chunk is reused for
 * every token, so the unpacking cost is paid once per row rather than once per token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qmatmul_avx2.h"
#include "kernels/cpu/qmatmul_neon.h"

#define QM_CHUNK 256 /* a multiple of every group size */

/* Dequantize columns [c0, c0+len) of row r into out (c0 and len multiples of 32, or of the group size
 * when it is smaller, for quantized formats; groups larger than the chunk are dequantized in pieces). */
static void dequant_chunk(const struct tllm_qweights *w, int r, int c0, int len, float *out) {
    if (w->format == TLLM_WF_DENSE) {
        tllm_convert_to_f32((const char *)w->w + ((size_t)r * w->cols + c0) * tllm_dtype_size(w->dtype),
                            w->dtype, out, (size_t)len);
        return;
    }
    const int ng = w->cols / w->group_size, bits = w->bits, per_word = 32 / bits;
    const uint32_t *row = (const uint32_t *)w->w + (size_t)r * (size_t)w->cols * (size_t)bits / 32;
    for (int g0 = c0, g1; g0 < c0 + len; g0 = g1) {
        const int g = g0 / w->group_size, gs = (g1 = (g + 1) * w->group_size < c0 + len ? (g + 1) * w->group_size : c0 + len) - g0;
        size_t gi = (size_t)r * ng + (size_t)g;
        float s = tllm_qw_scale(w, r, g);
        float *o = out + (g0 - c0);
        if (w->format == TLLM_WF_MXFP4 || w->format == TLLM_WF_NVFP4) {
            const uint32_t *wp = row + g0 / 8;
            float v[16];
            for (int i = 0; i < 16; i++) v[i] = s * tllm_e2m1_to_f32((uint32_t)i);
            for (int k = 0; k < gs / 8; k++)
                for (int e = 0; e < 8; e++) o[k * 8 + e] = v[(wp[k] >> (e * 4)) & 15u];
            continue;
        }
        if (w->format == TLLM_WF_MXFP8) {
            const uint8_t *wp = (const uint8_t *)(row + g0 / 4); /* little-endian words: bytes in column order */
            for (int j = 0; j < gs; j++) o[j] = s * tllm_e4m3_to_f32(wp[j]);
            continue;
        }
        float b = tllm_load_f32(w->biases, w->dtype, gi);
        if (32 % bits) { /* 3, 5, 6 bits: codes straddle words */
            for (int j = 0; j < gs; j++) o[j] = s * (float)tllm_qw_code(w, r, g0 + j) + b;
            continue;
        }
        const uint32_t *wp = row + g0 / per_word;
        const uint32_t mask = (1u << bits) - 1;
        int words = gs / per_word;
        switch (bits) { /* constant shifts per case, so each loop vectorizes */
        case 4:
            for (int k = 0; k < words; k++)
                for (int e = 0; e < 8; e++) o[k * 8 + e] = s * (float)((wp[k] >> (e * 4)) & 15u) + b;
            break;
        case 8:
            for (int k = 0; k < words; k++)
                for (int e = 0; e < 4; e++) o[k * 4 + e] = s * (float)((wp[k] >> (e * 8)) & 255u) + b;
            break;
        case 2:
            for (int k = 0; k < words; k++)
                for (int e = 0; e < 16; e++) o[k * 16 + e] = s * (float)((wp[k] >> (e * 2)) & 3u) + b;
            break;
        default:
            for (int k = 0; k < words; k++)
                for (int e = 0; e < per_word; e++) o[k * per_word + e] = s * (float)((wp[k] >> (e * bits)) & mask) + b;
        }
    }
}

void tllm_qw_dequant_row(const struct tllm_qweights *w, int r, float *out) {
    for (int c0 = 0; c0 < w->cols; c0 += QM_CHUNK) {
        int len = w->cols - c0 < QM_CHUNK ? w->cols - c0 : QM_CHUNK;
        dequant_chunk(w, r, c0, len, out + c0);
    }
}

#define QM_MATVEC_MAX_TOKENS 2 /* up to this many tokens, unpack in registers per token (decode) */
#define QM_MAX_GROUPS 4096     /* per-group x sums live on the stack */

typedef void qmatmul_fn(const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1);

/* A permuted weight (GPTQ act-order) through kernel k: x gathered into w's stored column order, then w
 * without its permutation (the reference kernel, which reads x through it, when out of memory). The
 * forward pass permutes its inputs itself, once a step; this serves the other callers. */
static void permuted(qmatmul_fn *k, const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1) {
    float *xp = malloc((size_t)n * (size_t)w->cols * sizeof *xp);
    if (!xp) {
        tllm_qmatmul_ref(w, x, n, y, r0, r1);
        return;
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < w->cols; j++) xp[(size_t)t * w->cols + j] = x[(size_t)t * w->cols + w->perm[j]];
    struct tllm_qweights plain = *w;
    plain.perm = NULL;
    k(&plain, xp, n, y, r0, r1);
    free(xp);
}

void tllm_qmatmul(const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1) {
    if (w->perm) {
        permuted(tllm_qmatmul, w, x, n, y, r0, r1);
        return;
    }
    int avx2 = tllm_cpu_has_avx2(), neon = !avx2 && tllm_cpu_has_neon_dot();
    if (w->format == TLLM_WF_AFFINE && (w->bits == 4 || w->bits == 8) && n <= QM_MATVEC_MAX_TOKENS &&
        w->cols / w->group_size <= QM_MAX_GROUPS && (avx2 || neon)) {
        float xsum[QM_MAX_GROUPS];
        int ng = w->cols / w->group_size;
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * w->cols;
            for (int g = 0; g < ng; g++) {
                float sum = 0.0f;
                for (int j = 0; j < w->group_size; j++) sum += xt[g * w->group_size + j];
                xsum[g] = sum;
            }
            if (avx2) tllm_qmatvec_affine_avx2(w, xt, xsum, y + (size_t)t * w->rows, r0, r1);
            else tllm_qmatvec_affine_neon(w, xt, xsum, y + (size_t)t * w->rows, r0, r1);
        }
        return;
    }
    if ((w->format == TLLM_WF_MXFP4 || w->format == TLLM_WF_NVFP4 || w->format == TLLM_WF_MXFP8) && n <= QM_MATVEC_MAX_TOKENS &&
        avx2) {
        for (int t = 0; t < n; t++) tllm_qmatvec_mx_avx2(w, x + (size_t)t * w->cols, y + (size_t)t * w->rows, r0, r1);
        return;
    }
    tllm_qmatmul_tiled(w, x, n, y, r0, r1);
}

void tllm_qmatmul_tiled(const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1) {
    if (w->perm) {
        permuted(tllm_qmatmul_tiled, w, x, n, y, r0, r1);
        return;
    }
    float buf[QM_CHUNK];
    for (int r = r0; r < r1; r++) {
        for (int t = 0; t < n; t++) y[(size_t)t * w->rows + r] = 0.0f;
        for (int c0 = 0; c0 < w->cols; c0 += QM_CHUNK) {
            int len = w->cols - c0 < QM_CHUNK ? w->cols - c0 : QM_CHUNK;
            dequant_chunk(w, r, c0, len, buf);
            for (int t = 0; t < n; t++) {
                const float *xt = x + (size_t)t * w->cols + c0;
                /* independent partial sums, so the compiler can vectorize without reassociating */
                float acc[8] = {0};
                int j = 0;
                for (; j + 8 <= len; j += 8)
                    for (int k = 0; k < 8; k++) acc[k] += buf[j + k] * xt[j + k];
                float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
                for (; j < len; j++) sum += buf[j] * xt[j]; /* scalar tail */
                y[(size_t)t * w->rows + r] += sum;
            }
        }
    }
}
