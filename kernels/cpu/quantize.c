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
    const int per_word = 32 / bits;
    memset(q, 0, (size_t)cols / (size_t)per_word * sizeof *q);
    for (int g = 0; g * group_size < cols; g++) {
        const float *x = w + (size_t)g * group_size;
        float mx = x[0], mn = x[0];
        for (int j = 1; j < group_size; j++) {
            mx = x[j] > mx ? x[j] : mx;
            mn = x[j] < mn ? x[j] : mn;
        }
        int min_is_edge = fabsf(mn) > fabsf(mx);
        float scale = fmaxf((mx - mn) / n_bins, 1e-7f);
        if (!min_is_edge) scale = -scale;
        float edge = min_is_edge ? mn : mx;
        float q0 = rintf(edge / scale), bias = 0.0f;
        if (q0 != 0.0f) {
            scale = edge / q0;
            bias = edge;
        }
        for (int j = 0; j < group_size; j++) {
            float v = rintf((x[j] - bias) / scale);
            v = v < 0.0f ? 0.0f : v > n_bins ? n_bins : v;
            int col = g * group_size + j;
            q[col / per_word] |= (uint32_t)v << ((col % per_word) * bits);
        }
        store(scales, sb_dtype, g, scale);
        store(biases, sb_dtype, g, bias);
    }
}
