#include "ops.h"

#include <math.h>
#include <stddef.h>

void tllm_rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inv);
}

void tllm_rope_tables(int pos, int head_dim, float theta, float *cos_t, float *sin_t) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* inv_freq = 1 / theta^(2i/d) and angle = pos * inv_freq, both rounded to float32 as HF does */
        float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)head_dim));
        float angle = (float)pos * inv_freq;
        cos_t[i] = (float)cos((double)angle);
        sin_t[i] = (float)sin((double)angle);
    }
}

void tllm_rope(float *v, int n_heads, int head_dim, const float *cos_t, const float *sin_t) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float x0 = x[i], x1 = x[i + half];
            x[i] = x0 * cos_t[i] - x1 * sin_t[i];
            x[i + half] = x1 * cos_t[i] + x0 * sin_t[i];
        }
    }
}

void tllm_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void tllm_swiglu(float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
