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
