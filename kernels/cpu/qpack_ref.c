/* The portable integer-activation matmul (layout: qpack.h): the oracle of the SIMD kernels, and what a
 * CPU without AVX-512 VNNI runs (a NEON kernel would slot in beside it). */
#include "kernels/cpu/qpack.h"

#include <math.h>

#include "base/dtype.h"

/* Group g of row block b's 16 scales (bias 0) or biases (1) as floats; two-level ones multiplied back
 * (exact: at most 19 significant bits) */
static void params16(const struct tllm_qpack *p, int bias, int b, int g, float *out) {
    if (bias && p->sym) { /* sym x the scale: exact, a power of two */
        params16(p, 0, b, g, out);
        for (int i = 0; i < TLLM_QPACK_ROWS; i++) out[i] *= p->sym;
        return;
    }
    const void *src = bias ? p->biases : p->scales;
    const size_t off = tllm_qpack_param_off(p, b, g);
    if (!p->super) {
        for (int i = 0; i < TLLM_QPACK_ROWS; i++) out[i] = tllm_load_f32(src, p->dtype, off + (size_t)i);
        return;
    }
    const uint16_t *d = (bias ? p->biases2 : p->scales2) + tllm_qpack_super_off(p, b, g);
    for (int i = 0; i < TLLM_QPACK_ROWS; i++) out[i] = (float)((const int8_t *)src)[off + (size_t)i] * tllm_f16_to_f32(d[i]);
}

/* Per block of 32 activations and each row: acc = fma(dot, s*d, acc); acc = fma(b, sum, acc). */
void tllm_qpack_matmul_ref(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1) {
    /* plane packs: the low four bits as 4-bit codes, then bits - 4 planes of V words a sub-block */
    const int planes = tllm_qpack_planes(p) ? p->bits - 4 : 0, lbits = planes ? 4 : p->bits, V = tllm_qpack_subcols(p) / 4;
    const int R = TLLM_QPACK_ROWS, per = 8 / lbits, ng = p->cols / p->group_size;
    const int bpg = tllm_qpack_subblocks(p), nb = p->cols / TLLM_XQ_BLOCK;
    const int chunks = tllm_qpack_subcols(p) / (4 * per); /* 64-byte chunks of (low) codes per activation sub-block */
    const unsigned mask = (1u << lbits) - 1;
    for (int b = b0; b < b1; b++)
        for (int t = 0; t < x->n; t++) {
            const uint8_t *c = p->codes + (size_t)b * p->block_bytes;
            float acc[16] = {0}, sc[16], bi[16];
            for (int g = 0; g < ng; g++) {
                params16(p, 0, b, g, sc);
                if (!p->lut) params16(p, 1, b, g, bi);
                float f[16] = {0}, ssum = 0.0f; /* the group's sum of dot * d, and of the blocks' x sums */
                for (int k = 0; k < bpg; k++) {
                    const int col0 = g * p->group_size + k * TLLM_XQ_BLOCK, kb = col0 / TLLM_XQ_BLOCK;
                    const int8_t *xq = x->q + (size_t)t * p->cols + col0;
                    const int8_t *xq2 = t < x->n2 ? x->q2 + (xq - x->q) : NULL;
                    int32_t dot[16] = {0}, dot2[16] = {0};
                    const uint8_t *pl = c + 64 * (size_t)chunks; /* the sub-block's planes */
                    for (int ch = 0; ch < chunks; ch++, c += 64)
                        for (int m = 0; m < per; m++)
                            for (int i = 0; i < R; i++)
                                for (int j = 0; j < 4; j++) {
                                    int32_t code = (int32_t)((c[4 * i + j] >> (lbits * m)) & mask);
                                    for (int h = 0; h < planes; h++) {
                                        const uint8_t *word = pl + 8 * ((size_t)h * V + (size_t)(ch * per + m));
                                        code |= (word[i / 2] >> (4 * (i % 2) + j) & 1) << (4 + h);
                                    }
                                    if (p->lut) code = tllm_e2m1_u8[code];
                                    dot[i] += code * xq[ch * 4 * per + 4 * m + j];
                                    if (xq2) dot2[i] += code * xq2[ch * 4 * per + 4 * m + j];
                                }
                    c += 8 * (size_t)planes * V;
                    if (xq2)
                        for (int i = 0; i < R; i++) dot[i] = dot[i] * 128 + dot2[i];
                    float d = x->d[(size_t)t * nb + kb], s = tllm_xq_group_sum(x, x->sum, 0, t, nb, kb, p->group_size, col0);
                    for (int i = 0; i < R; i++) f[i] = fmaf((float)dot[i], d, f[i]);
                    ssum += s;
                }
                /* scale and bias once a group: sum_j (s q_j + b) x_j = s sum_k d_k dot_k + b sum_k sum_k(x) */
                for (int i = 0; i < R; i++) {
                    if (p->lut) { /* w = s (u - offset): the offset times the x sum taken out first */
                        acc[i] = fmaf(fmaf(-(float)TLLM_E2M1_OFFSET, ssum, f[i]), sc[i], acc[i]);
                        continue;
                    }
                    acc[i] = fmaf(f[i], sc[i], acc[i]);
                    acc[i] = fmaf(bi[i], ssum, acc[i]);
                }
            }
            int n_out = p->rows - b * R < R ? p->rows - b * R : R;
            memcpy(y + (size_t)t * p->rows + (size_t)b * R, acc, (size_t)n_out * sizeof(float));
        }
}
