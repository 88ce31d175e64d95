/* Packing for the integer-activation matmul, and activation quantization (the kernels: qpack_ref.c,
 * qpack_avx512.c, chosen in qpack_matmul.c). */
#include "kernels/cpu/qpack.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/cpu_features.h"

int tllm_qpack_supported(const struct tllm_qweights *w) {
    if (w->cols % TLLM_XQ_BLOCK) return 0;
    if (w->format == TLLM_WF_NVFP4) return w->group_size == 16;
    if (w->format == TLLM_WF_AFFINE && w->group_size == 16) return 1; /* GGUF's Q2_K, Q3_K, Q6_K */
    return (w->format == TLLM_WF_AFFINE || w->format == TLLM_WF_MXFP4) && w->group_size % TLLM_XQ_BLOCK == 0;
}

static int is_fp4(const struct tllm_qweights *w) { return w->format == TLLM_WF_MXFP4 || w->format == TLLM_WF_NVFP4; }

/* The pack's code width: affine codes in the next of 2/4/8 bits (1 -> 2, 3 -> 4, 5 and 6 -> 8), or 5 and 6
 * as planes (qpack.h); E2M1 codes (mxfp4, nvfp4) as they are, read through tllm_e2m1_u8 */
static int pack_bits(const struct tllm_qweights *w, int planes) {
    if (is_fp4(w)) return 4;
    /* planes come in whole 64-byte chunks a sub-block: not 5-bit codes in groups of 16 */
    if (planes && (w->bits == 6 || (w->bits == 5 && w->group_size >= TLLM_XQ_BLOCK))) return w->bits;
    return w->bits <= 2 ? 2 : w->bits <= 4 ? 4 : 8;
}

static void *alloc64(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 64) ? NULL : p;
}

/* Codes of row r as one byte each, as the pack holds them. */
static void unpack_row(const struct tllm_qweights *w, int r, uint8_t *out) {
    if (32 % w->bits || is_fp4(w)) {
        for (int j = 0; j < w->cols; j++) out[j] = (uint8_t)tllm_qw_code(w, r, j);
        return;
    }
    const int bits = w->bits, per_word = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    const uint32_t *row = (const uint32_t *)w->w + (size_t)r * (size_t)(w->cols / per_word);
    for (int k = 0; k < w->cols / per_word; k++)
        for (int e = 0; e < per_word; e++) out[k * per_word + e] = (uint8_t)((row[k] >> (e * bits)) & mask);
}

static uint16_t bf16_bits(float f) { /* exact for the values it is given (at most 8 significant bits) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* Scale and bias of group g of row r into the pack's dtype: copied, or (fp4) the E8M0 / E4M3 scale halved
 * for the doubled codes (exact in bf16: at most 4 significant bits), and no bias (the table's offset) */
static void group_params(const struct tllm_qweights *w, int r, int g, enum tllm_dtype pdt, void *s, void *b) {
    if (is_fp4(w)) {
        uint16_t sv = bf16_bits(0.5f * tllm_qw_scale(w, r, g));
        memcpy(s, &sv, 2);
        return;
    }
    size_t esz = tllm_dtype_size(pdt), i = ((size_t)r * (size_t)(w->cols / w->group_size) + (size_t)g) * esz;
    memcpy(s, (const char *)w->scales + i, esz);
    memcpy(b, (const char *)w->biases + i, esz);
}

/* Row block b's codes (tmp: [16][cols] bytes) as a plane pack's sub-blocks (qpack.h) */
static void pack_planes(const struct tllm_qpack *p, const uint8_t *tmp, uint8_t *dst) {
    const int R = TLLM_QPACK_ROWS, S = tllm_qpack_subcols(p), V = S / 4, cols = p->cols;
    for (int s0 = 0; s0 < cols; s0 += S) {
        for (int c = 0; c < S / 8; c++, dst += 64) /* the low four bits, in the 4-bit layout */
            for (int i = 0; i < R; i++)
                for (int j = 0; j < 4; j++)
                    dst[4 * i + j] = (uint8_t)((tmp[(size_t)i * cols + s0 + 8 * c + j] & 15) |
                                               (tmp[(size_t)i * cols + s0 + 8 * c + 4 + j] & 15) << 4);
        for (int h = 0; h < p->bits - 4; h++)
            for (int v = 0; v < V; v++, dst += 8) {
                uint64_t word = 0;
                for (int i = 0; i < R; i++)
                    for (int j = 0; j < 4; j++)
                        word |= (uint64_t)(tmp[(size_t)i * cols + s0 + 4 * v + j] >> (4 + h) & 1) << (4 * i + j);
                for (int e = 0; e < 8; e++) dst[e] = (uint8_t)(word >> (8 * e));
            }
    }
}

/* p's biases dropped if each is exactly -2^(bits - 1) times its scale (qpack.h: sym); bits, the codes' width */
static void symmetric(struct tllm_qpack *p, int bits) {
    const size_t n = (size_t)p->n_blocks * (size_t)(p->cols / p->group_size) * TLLM_QPACK_ROWS;
    const float sym = -(float)(1 << (bits - 1));
    if (p->lut || !p->biases) return;
    for (size_t i = 0; i < n; i++)
        if (tllm_load_f32(p->biases, p->dtype, i) != sym * tllm_load_f32(p->scales, p->dtype, i)) return;
    free(p->biases);
    p->biases = NULL, p->sym = sym;
}

/* p's float32 scales and biases (or only scales, sym) as two levels (qpack.h), if every superblock of 256
 * columns factors */
static int two_level(struct tllm_qpack *p) {
    const int R = TLLM_QPACK_ROWS, G = 256 / p->group_size, ng = p->cols / p->group_size;
    if (p->dtype != TLLM_DT_F32 || p->lut || 256 % p->group_size || p->cols % 256) return 0;
    const size_t n = (size_t)p->n_blocks * ng * R, n2 = n / G;
    int8_t *qs = alloc64(n), *qb = p->sym ? NULL : alloc64(n);
    uint16_t *ds = alloc64(n2 * 2), *db = p->sym ? NULL : alloc64(n2 * 2);
    int ok = qs && ds && (p->sym || (qb && db));
    for (int b = 0; b < p->n_blocks && ok; b++)
        for (int j = 0; j < ng / G && ok; j++)
            for (int i = 0; i < R && ok; i++) {
                size_t o = ((size_t)b * ng + (size_t)j * G) * R + i, o2 = ((size_t)b * (ng / G) + j) * R + i;
                int8_t tq[256], tb[256];
                ok = tllm_f16_i8_factor((const float *)p->scales + o, R, G, ds + o2, tq) &&
                     (p->sym || tllm_f16_i8_factor((const float *)p->biases + o, R, G, db + o2, tb));
                for (int g = 0; g < G && ok; g++) {
                    qs[o + (size_t)g * R] = tq[g];
                    if (qb) qb[o + (size_t)g * R] = tb[g];
                }
            }
    if (!ok) {
        free(qs), free(qb), free(ds), free(db);
        return 0;
    }
    free(p->scales), free(p->biases);
    p->scales = qs, p->biases = qb, p->scales2 = ds, p->biases2 = db, p->super = G;
    return 1;
}

int tllm_qpack_init(struct tllm_qpack *p, const struct tllm_qweights *w) { return tllm_qpack_init_as(p, w, tllm_qpack_forms_native()); }

int tllm_qpack_init_as(struct tllm_qpack *p, const struct tllm_qweights *w, int forms) {
    memset(p, 0, sizeof *p);
    if (!tllm_qpack_supported(w)) return tllm_fail(TLLM_ERR_ARG, "%s: cannot be packed for int8 activations", w->name);
    const int R = TLLM_QPACK_ROWS, bits = pack_bits(w, forms & TLLM_QPACK_PLANES), per = 8 / bits, ng = w->cols / w->group_size;
    const enum tllm_dtype pdt = is_fp4(w) ? TLLM_DT_BF16 : w->dtype;
    const size_t esz = tllm_dtype_size(pdt);
    p->rows = w->rows, p->cols = w->cols, p->bits = bits, p->group_size = w->group_size, p->dtype = pdt, p->lut = is_fp4(w);
    p->n_blocks = (w->rows + R - 1) / R;
    p->block_bytes = (size_t)R * w->cols * bits / 8;
    p->codes = alloc64((size_t)p->n_blocks * p->block_bytes);
    p->scales = alloc64((size_t)p->n_blocks * ng * R * esz);
    p->biases = p->lut ? NULL : alloc64((size_t)p->n_blocks * ng * R * esz);
    uint8_t *tmp = malloc((size_t)R * w->cols);
    if (!p->codes || !p->scales || (!p->lut && !p->biases) || !tmp) {
        free(tmp);
        tllm_qpack_free(p);
        return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory packing %d x %d weights", w->name, w->rows, w->cols);
    }
    const int chunk_cols = 4 * per;
    for (int b = 0; b < p->n_blocks; b++) {
        for (int i = 0; i < R; i++) {
            int r = b * R + i;
            if (r < w->rows) unpack_row(w, r, tmp + (size_t)i * w->cols);
            else memset(tmp + (size_t)i * w->cols, 0, (size_t)w->cols);
        }
        uint8_t *dst = p->codes + (size_t)b * p->block_bytes;
        if (tllm_qpack_planes(p)) {
            pack_planes(p, tmp, dst);
        } else {
            for (int c = 0; c < w->cols / chunk_cols; c++, dst += 64)
                for (int i = 0; i < R; i++)
                    for (int j = 0; j < 4; j++) {
                        unsigned byte = 0;
                        for (int m = 0; m < per; m++) byte |= (unsigned)tmp[(size_t)i * w->cols + c * chunk_cols + 4 * m + j] << (bits * m);
                        dst[4 * i + j] = (uint8_t)byte;
                    }
        }
        for (int g = 0; g < ng; g++)
            for (int i = 0; i < R; i++) {
                int r = b * R + i;
                size_t d = (((size_t)b * ng + g) * R + i) * esz;
                if (r < w->rows) {
                    group_params(w, r, g, pdt, (char *)p->scales + d, p->biases ? (char *)p->biases + d : NULL);
                } else {
                    memset((char *)p->scales + d, 0, esz);
                    if (p->biases) memset((char *)p->biases + d, 0, esz);
                }
            }
    }
    free(tmp);
    if (forms & TLLM_QPACK_SCALES) {
        symmetric(p, w->bits);
        two_level(p);
    }
    return TLLM_OK;
}

void tllm_qpack_free(struct tllm_qpack *p) {
    free(p->codes);
    free(p->scales);
    free(p->biases);
    free(p->scales2);
    free(p->biases2);
    memset(p, 0, sizeof *p);
}

size_t tllm_qpack_nbytes(const struct tllm_qpack *p) {
    const size_t ng = (size_t)(p->cols / p->group_size), R = TLLM_QPACK_ROWS;
    const size_t params = p->lut || p->sym ? 1 : 2; /* scales, and biases where kept */
    if (p->super) return (size_t)p->n_blocks * (p->block_bytes + params * (ng * R + (ng / (size_t)p->super) * R * 2));
    return (size_t)p->n_blocks * (p->block_bytes + params * ng * R * tllm_dtype_size(p->dtype));
}

/* Written out as v = x / d rounded to float, then to the nearest integer (ties to even) by the
 * 1.5 * 2^23 trick, with contraction off: GCC fused x * (1/d) + 1.5 * 2^23 into one FMA in its AVX2
 * and AVX-512 clones and not in the baseline one, so machines with and without FMA quantized ties
 * differently. Now every clone, clang's builds and tllm_xq_quantize_avx512 give the same codes. */
TLLM_CLONES TLLM_NO_CONTRACT void tllm_xq_quantize_ref(struct tllm_xq *xq, const float *x, int t0, int t1) {
    const int nb = xq->cols / TLLM_XQ_BLOCK;
    for (int t = t0; t < t1; t++)
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)t * xq->cols + b * TLLM_XQ_BLOCK;
            size_t o = (size_t)t * xq->cols + (size_t)b * TLLM_XQ_BLOCK;
            int8_t *q = xq->q + o, *q2 = t < xq->n2 ? xq->q2 + o : NULL;
            float amax = 0.0f;
            for (int j = 0; j < TLLM_XQ_BLOCK; j++) {
                float a = fabsf(xb[j]);
                amax = a > amax ? a : amax;
            }
            float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            int isum = 0;
            for (int j = 0; j < TLLM_XQ_BLOCK; j++) {
                /* round half to even by the 1.5 * 2^23 trick (|v| <= 127), which vectorizes */
                float v = xb[j] * id, r = (v + 0x1.8p23f) - 0x1.8p23f;
                q[j] = (int8_t)(int)r;
                if (q2) {
                    float v2 = (v - r) * 128.0f; /* |v - r| <= 0.5, so |q2| <= 64 */
                    q2[j] = (int8_t)(int)((v2 + 0x1.8p23f) - 0x1.8p23f);
                    isum += 128 * q[j] + q2[j];
                } else {
                    isum += q[j];
                }
            }
            if (q2) d *= 1.0f / 128.0f;
            /* the sum of the quantized x, not of x: then the block computes exactly sum_j w_j xq_j, and the
             * bias (about -2^(bits-1) scales) does not multiply the rounding errors' sum */
            xq->d[(size_t)t * nb + b] = d;
            xq->sum[(size_t)t * nb + b] = d * (float)isum;
            if (xq->sum16) { /* groups of 16 take half a block's sum (outside the loop above, which vectorizes) */
                int isum_lo = 0;
                for (int j = 0; j < TLLM_XQ_BLOCK / 2; j++) isum_lo += q2 ? 128 * q[j] + q2[j] : q[j];
                xq->sum16[(size_t)t * 2 * nb + 2 * (size_t)b] = d * (float)isum_lo;
                xq->sum16[(size_t)t * 2 * nb + 2 * (size_t)b + 1] = d * (float)(isum - isum_lo);
            }
        }
}

/* Tokens [t_begin, t_end) in tiles of up to `per`, over row blocks a few at a time */
static void run_level(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1,
                      tllm_qpack_tile_fn *const *fns, int per, int blocks, int t_begin, int t_end) {
    for (int bb = b0; bb < b1; bb += blocks) {
        int be = bb + blocks < b1 ? bb + blocks : b1;
        for (int t0 = t_begin; t0 < t_end; t0 += per) {
            int nt = t_end - t0 < per ? t_end - t0 : per;
            for (int b = bb; b < be; b++) fns[nt - 1](p, x, y, b, t0);
        }
    }
}

void tllm_qpack_run_tiles(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1,
                          const struct tllm_qpack_tiles *t) {
    int n2 = x->n2 < x->n ? x->n2 : x->n;
    if (n2 > 0) run_level(p, x, y, b0, b1, t->fns[1], t->per[1], t->blocks, 0, n2);
    if (n2 < x->n) run_level(p, x, y, b0, b1, t->fns[0], t->per[0], t->blocks, n2, x->n);
}
