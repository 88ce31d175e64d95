/* The scalar reference quantized_matmul: obviously correct, never fast. */
#include "kernels/cpu/qmatmul.h"

size_t tllm_qw_nbytes(const struct tllm_qweights *w) {
    size_t n = (size_t)w->rows * (size_t)w->cols;
    if (w->format == TLLM_WF_DENSE) return n * tllm_dtype_size(w->dtype);
    return n * (size_t)w->bits / 8 +
           2 * (size_t)w->rows * (size_t)(w->cols / w->group_size) * tllm_dtype_size(w->dtype);
}

static inline float weight_at(const struct tllm_qweights *w, int r, int j) {
    if (w->format == TLLM_WF_DENSE) return tllm_load_f32(w->w, w->dtype, (size_t)r * w->cols + j);
    size_t g = (size_t)r * (size_t)(w->cols / w->group_size) + (size_t)(j / w->group_size);
    float s = tllm_load_f32(w->scales, w->dtype, g);
    float b = tllm_load_f32(w->biases, w->dtype, g);
    return s * (float)tllm_qw_code(w, r, j) + b;
}

void tllm_qw_dequant_row_ref(const struct tllm_qweights *w, int r, float *out) {
    for (int j = 0; j < w->cols; j++) out[j] = weight_at(w, r, j);
}

void tllm_qmatmul_ref(const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * w->cols;
        for (int r = r0; r < r1; r++) {
            float acc = 0.0f;
            for (int j = 0; j < w->cols; j++) acc += weight_at(w, r, j) * xt[j];
            y[(size_t)t * w->rows + r] = acc;
        }
    }
}
