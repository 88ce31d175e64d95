#include "kernels/cpu/quantize.h"

#include <math.h>
#include <string.h>

static void store(void *dst, enum tllm_dtype t, int i, float v) {
    switch (t) {
    case TLLM_DT_BF16: ((uint16_t *)dst)[i] = tllm_f32_to_bf16(v); break;
    case TLLM_DT_F16: ((uint16_t *)dst)[i] = tllm_f32_to_f16(v); break;
    default: ((float *)dst)[i] = v; break;
    }
}

void tllm_quantize_row_affine(const float *w, int cols, int bits, int group_size, enum tllm_dtype sb_dtype,
                              uint32_t *q, void *scales, void *biases) {
    const float n_bins = (float)((1 << bits) - 1);
    memset(q, 0, (size_t)cols * (size_t)bits / 32 * sizeof *q);
    for (int g = 0; g * group_size < cols; g++) {
        const float *x = w + (size_t)g * group_size;
        float mx = x[0], mn = x[0];
        for (int j = 1; j < group_size; j++) {
            mx = x[j] > mx ? x[j] : mx;
            mn = x[j] < mn ? x[j] : mn;
        }
        int min_is_edge = fabsf(mn) > fabsf(mx);
        float scale = fmaxf((mx - mn) / n_bins, 1e-7f), bias = mn;
        if (bits > 1) { /* mlx moves the grid so the larger end is exact; one bit keeps min and max */
            if (!min_is_edge) scale = -scale;
            float edge = min_is_edge ? mn : mx;
            float q0 = rintf(edge / scale);
            bias = 0.0f;
            if (q0 != 0.0f) {
                scale = edge / q0;
                bias = edge;
            }
        }
        for (int j = 0; j < group_size; j++) {
            float v = rintf((x[j] - bias) / scale);
            v = v < 0.0f ? 0.0f : v > n_bins ? n_bins : v;
            /* one bit stream a row: a 3-, 5- or 6-bit code may continue in the next word */
            size_t bit = (size_t)(g * group_size + j) * (size_t)bits;
            unsigned sh = (unsigned)(bit & 31);
            q[bit >> 5] |= (uint32_t)v << sh;
            if (sh + (unsigned)bits > 32) q[(bit >> 5) + 1] |= (uint32_t)v >> (32 - sh);
        }
        store(scales, sb_dtype, g, scale);
        store(biases, sb_dtype, g, bias);
    }
}

/* v rounded to dtype t and back: each step of mlx's float-mode quantizer runs in the source's dtype */
static float in_dtype(enum tllm_dtype t, float v) {
    if (t == TLLM_DT_BF16) return tllm_bf16_to_f32(tllm_f32_to_bf16(v));
    if (t == TLLM_DT_F16) return tllm_f16_to_f32(tllm_f32_to_f16(v));
    return v;
}

uint8_t tllm_f32_to_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u, a = u ^ sign;
    uint8_t r;
    if (a >= 0x43F00000u) { /* >= 480 (halfway past 448), infinity or NaN: saturate to 448 */
        r = 0x7E;
    } else if (a < 0x3C800000u) { /* below 2^-6: a subnormal code, 2^-9 steps, round half to even */
        float v;
        memcpy(&v, &a, 4);
        r = (uint8_t)(int)rintf(v * 512.0f);
    } else { /* normal: drop 20 mantissa bits, round half to even, rebias 127 -> 7 */
        uint32_t odd = (a >> 20) & 1u;
        r = (uint8_t)((a + ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + odd) >> 20);
    }
    return (uint8_t)(r | (sign >> 24));
}

void tllm_quantize_row_fp(const float *w, int cols, enum tllm_wformat mode, enum tllm_dtype src_dtype, uint32_t *q,
                          uint8_t *scales) {
    const int gs = mode == TLLM_WF_NVFP4 ? 16 : 32, fp4 = mode != TLLM_WF_MXFP8;
    const float maxval = fp4 ? 6.0f : 448.0f;
    memset(q, 0, (size_t)cols * (fp4 ? 4 : 8) / 32 * sizeof *q);
    for (int g = 0; g * gs < cols; g++) {
        const float *x = w + (size_t)g * gs;
        float amax = 0.0f;
        for (int j = 0; j < gs; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float s = in_dtype(src_dtype, amax / maxval), div;
        if (mode == TLLM_WF_NVFP4) {
            scales[g] = tllm_f32_to_e4m3(s);
            div = in_dtype(src_dtype, tllm_e4m3_to_f32(scales[g]));
        } else {
            int e = s == 0.0f ? 0 : (int)ceilf(log2f(s));
            scales[g] = (uint8_t)(e + 127);
            div = in_dtype(src_dtype, exp2f((float)e));
        }
        for (int j = 0; j < gs; j++) {
            float v = in_dtype(src_dtype, x[j] / div);
            uint32_t code;
            if (!fp4) {
                code = tllm_f32_to_e4m3(v);
            } else { /* the nearest E2M1 value, the first in code order at a tie (mlx's argmin); nvfp4 compares
                      * in float32, the mx modes in the source dtype */
                float best = INFINITY;
                code = 0;
                for (uint32_t k = 0; k < 16; k++) {
                    float d = fabsf(v - tllm_e2m1_to_f32(k));
                    if (mode == TLLM_WF_MXFP4) d = in_dtype(src_dtype, d);
                    if (d < best) best = d, code = k;
                }
            }
            int col = g * gs + j, per = fp4 ? 8 : 4;
            q[col / per] |= code << ((col % per) * (fp4 ? 4 : 8));
        }
    }
}
