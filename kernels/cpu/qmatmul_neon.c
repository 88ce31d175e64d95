/* NEON quantized matvec for affine 4-bit and 8-bit weights with float activations (--exact decode on
 * arm64), as qmatmul_avx2.c does it on x86: codes widened in registers in natural element order (low
 * nibble = even element), dotted with x by fused multiply-adds, each group scaled once:
 * sum_j (s q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j, the x sums computed once per call. */
#include "kernels/cpu/qmatmul_neon.h"

#if defined(__aarch64__)
#include <arm_neon.h>

/* 16 codes as bytes times x[0..16), into a0 (elements 0-3, 8-11) and a1 (4-7, 12-15) */
static inline void dot16(uint8x16_t e, const float *x, float32x4_t *a0, float32x4_t *a1) {
    uint16x8_t lo = vmovl_u8(vget_low_u8(e)), hi = vmovl_u8(vget_high_u8(e));
    *a0 = vfmaq_f32(*a0, vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), vld1q_f32(x));
    *a1 = vfmaq_f32(*a1, vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))), vld1q_f32(x + 4));
    *a0 = vfmaq_f32(*a0, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), vld1q_f32(x + 8));
    *a1 = vfmaq_f32(*a1, vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi))), vld1q_f32(x + 12));
}

/* 32 codes of 4 bits (16 bytes): even elements in the low nibbles */
static inline void dot32_q4(const uint8_t *q, const float *x, float32x4_t *a0, float32x4_t *a1) {
    uint8x16_t v = vld1q_u8(q), lo = vandq_u8(v, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(v, 4);
    dot16(vzip1q_u8(lo, hi), x, a0, a1);      /* elements 0-15 */
    dot16(vzip2q_u8(lo, hi), x + 16, a0, a1); /* 16-31 */
}

/* 32 codes of 8 bits */
static inline void dot32_q8(const uint8_t *q, const float *x, float32x4_t *a0, float32x4_t *a1) {
    dot16(vld1q_u8(q), x, a0, a1);
    dot16(vld1q_u8(q + 16), x + 16, a0, a1);
}

void tllm_qmatvec_affine_neon(const struct tllm_qweights *w, const float *x, const float *xsum, float *y, int r0,
                              int r1) {
    const int gs = w->group_size, ng = w->cols / gs, bits = w->bits;
    const size_t row_bytes = (size_t)w->cols * bits / 8, blk = 32 * (size_t)bits / 8;
    const uint8_t *base = (const uint8_t *)w->w;
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = base + (size_t)r * row_bytes;
        /* groups alternate between two chains of accumulators, so a group need not wait on the last */
        float32x4_t tot[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        float bias_part = 0.0f;
        for (int g = 0; g < ng; g++) {
            size_t gi = (size_t)r * ng + (size_t)g;
            float s = tllm_load_f32(w->scales, w->dtype, gi), b = tllm_load_f32(w->biases, w->dtype, gi);
            float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
            const float *xg = x + (size_t)g * gs;
            for (int k = 0; k < gs; k += 32, q += blk) {
                if (bits == 4) dot32_q4(q, xg + k, &a0, &a1);
                else dot32_q8(q, xg + k, &a0, &a1);
            }
            tot[g & 1] = vfmaq_n_f32(tot[g & 1], vaddq_f32(a0, a1), s);
            bias_part += b * xsum[g];
        }
        y[r] = vaddvq_f32(vaddq_f32(tot[0], tot[1])) + bias_part;
    }
}

#else
void tllm_qmatvec_affine_neon(const struct tllm_qweights *w, const float *x, const float *xsum, float *y, int r0,
                              int r1) {
    (void)w, (void)x, (void)xsum, (void)y, (void)r0, (void)r1;
}
#endif
