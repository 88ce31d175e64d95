/* The scalar reference quantized_matmul: obviously correct, never fast. */
#include "kernels/cpu/qmatmul.h"

const char *tllm_wformat_name(enum tllm_wformat f) {
    static const char *const names[] = {"dense", "affine", "mxfp4", "nvfp4", "mxfp8"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

size_t tllm_qw_nbytes(const struct tllm_qweights *w) {
    size_t n = (size_t)w->rows * (size_t)w->cols;
    if (w->format == TLLM_WF_DENSE) return n * tllm_dtype_size(w->dtype);
    size_t groups = (size_t)w->rows * (size_t)(w->cols / w->group_size);
    return n * (size_t)w->bits / 8 + groups * tllm_dtype_size(w->dtype) * (w->format == TLLM_WF_AFFINE ? 2 : 1);
}

static inline float weight_at(const struct tllm_qweights *w, int r, int j) {
    if (w->format == TLLM_WF_DENSE) return tllm_load_f32(w->w, w->dtype, (size_t)r * w->cols + j);
    int g = j / w->group_size;
    float s = tllm_qw_scale(w, r, g), q = tllm_qw_code_value(w->format, tllm_qw_code(w, r, j));
    if (w->format != TLLM_WF_AFFINE) return s * q;
    return s * q + tllm_load_f32(w->biases, w->dtype, (size_t)r * (size_t)(w->cols / w->group_size) + (size_t)g);
}

/* Row r as stored (columns in stored order: permuted when w->perm is set) */
void tllm_qw_dequant_row_ref(const struct tllm_qweights *w, int r, float *out) {
    for (int j = 0; j < w->cols; j++) out[j] = weight_at(w, r, j);
}

void tllm_qmatmul_ref(const struct tllm_qweights *w, const float *x, int n, float *y, int r0, int r1) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * w->cols;
        for (int r = r0; r < r1; r++) {
            float acc = 0.0f;
            for (int j = 0; j < w->cols; j++) acc += weight_at(w, r, j) * xt[w->perm ? w->perm[j] : j];
            y[(size_t)t * w->rows + r] = acc;
        }
    }
}
