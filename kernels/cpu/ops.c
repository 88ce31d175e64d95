#include "kernels/cpu/ops.h"

#include "base/dtype.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_avx512.h"
#include "kernels/cpu/ops_ref.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

TLLM_CLONES void tllm_rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
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

/* 16 floats: one 512-bit register (two 256-bit or four 128-bit ones in the other clones). Named vector
 * variables stay in registers where arrays of floats would be spilled. */
typedef float f32x16 __attribute__((vector_size(64)));

/* a macro, not a function: a vector-returning function would have a different ABI in each clone */
#define load16(p) ({ f32x16 v_; memcpy(&v_, (p), sizeof v_); v_; })

/* The portable attention: GCC vector extensions, compiled per x86-64 level by TLLM_CLONES. */
TLLM_CLONES void tllm_attention_portable(const float *q, size_t q_stride, int nq, int pos0, const float *kt,
                                           size_t kt_stride, const float *v, size_t v_stride, int hd,
                                           float *scores, float *out, size_t out_stride) {
    const int L = pos0 + nq;
    const float scale = 1.0f / sqrtf((float)hd);
    /* scores = q . K^T, 4 queries x 16 keys at a time, accumulated over the head dimension in registers
     * (keys are stored transposed, so there is no reduction across lanes) */
    for (int j0 = 0; j0 < nq; j0 += 4) {
        const int nj = nq - j0 < 4 ? nq - j0 : 4;
        const int len = pos0 + j0 + nj;
        const float *q0 = q + (size_t)j0 * q_stride;
        const float *q1 = nj > 1 ? q0 + q_stride : q0, *q2 = nj > 2 ? q0 + 2 * q_stride : q0, *q3 = nj > 3 ? q0 + 3 * q_stride : q0;
        int p0 = 0;
        for (; p0 + 16 <= len; p0 += 16) {
            f32x16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int i = 0; i < hd; i++) {
                f32x16 k = load16(kt + (size_t)i * kt_stride + p0);
                a0 += q0[i] * k, a1 += q1[i] * k, a2 += q2[i] * k, a3 += q3[i] * k;
            }
            f32x16 rows[4] = {a0 * scale, a1 * scale, a2 * scale, a3 * scale};
            for (int j = 0; j < nj; j++) memcpy(scores + (size_t)(j0 + j) * L + p0, &rows[j], sizeof rows[j]);
        }
        for (int p = p0; p < len; p++) /* scalar tail */
            for (int j = 0; j < nj; j++) {
                float dot = 0.0f;
                for (int i = 0; i < hd; i++) dot += q[(size_t)(j0 + j) * q_stride + i] * kt[(size_t)i * kt_stride + p];
                scores[(size_t)(j0 + j) * L + p] = dot * scale;
            }
    }
    for (int j = 0; j < nq; j++) {
        const int len = pos0 + j + 1;
        float *s = scores + (size_t)j * L, *o = out + (size_t)j * out_stride;
        tllm_softmax(s, len);
        /* out_j = sum_p s[p] v_p, 64 output lanes in registers at a time */
        int i0 = 0;
        for (; i0 + 64 <= hd; i0 += 64) {
            f32x16 o0 = {0}, o1 = {0}, o2 = {0}, o3 = {0};
            for (int p = 0; p < len; p++) {
                const float *vp = v + (size_t)p * v_stride + i0;
                o0 += s[p] * load16(vp), o1 += s[p] * load16(vp + 16), o2 += s[p] * load16(vp + 32), o3 += s[p] * load16(vp + 48);
            }
            memcpy(o + i0, &o0, 64), memcpy(o + i0 + 16, &o1, 64), memcpy(o + i0 + 32, &o2, 64), memcpy(o + i0 + 48, &o3, 64);
        }
        for (int i = i0; i < hd; i++) { /* scalar tail */
            float acc = 0.0f;
            for (int p = 0; p < len; p++) acc += s[p] * v[(size_t)p * v_stride + i];
            o[i] = acc;
        }
    }
}

void tllm_attention(const float *q, size_t q_stride, int nq, int pos0, const float *kt, size_t kt_stride,
                    const float *v, size_t v_stride, int hd, float *scores, float *out, size_t out_stride) {
    tllm_attention_portable(q, q_stride, nq, pos0, kt, kt_stride, v, v_stride, hd, scores, out, out_stride);
}

int tllm_attention_blocks_ok(int hd) { return tllm_attention_avx512_ok(hd); }

void tllm_attention_blocks(const float *q, size_t q_stride, int nq, int group, int pos0, const void *const *kb,
                           const void *const *vb, int f16, int hd, float *scores, float *out, size_t out_stride) {
    tllm_attention_blocks_avx512(q, q_stride, nq, group, pos0, kb, vb, f16, hd, scores, out, out_stride);
}

double tllm_logsumexp(const float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return mx + log(sum);
}

int tllm_argmax(const float *x, int n) {
    return tllm_cpu_has_avx512() ? tllm_argmax_avx512(x, n) : tllm_argmax_ref(x, n);
}

int tllm_argmax_allowed(const float *x, int n, const uint32_t *allow) {
    return tllm_cpu_has_avx512() ? tllm_argmax_allowed_avx512(x, n, allow) : tllm_argmax_allowed_ref(x, n, allow);
}

void tllm_f16_to_f32_row(const uint16_t *src, float *dst, int n) {
    if (tllm_cpu_has_avx512()) tllm_f16_to_f32_row_avx512(src, dst, n);
    else
        for (int i = 0; i < n; i++) dst[i] = tllm_f16_to_f32(src[i]);
}

void tllm_f32_to_f16_row(const float *src, uint16_t *dst, int n) {
    if (tllm_cpu_has_avx512()) tllm_f32_to_f16_row_avx512(src, dst, n);
    else
        for (int i = 0; i < n; i++) dst[i] = tllm_f32_to_f16(src[i]);
}

void tllm_swiglu(float *gate, const float *up, int n) {
    if (tllm_cpu_has_avx512()) tllm_swiglu_avx512(gate, up, n);
    else tllm_swiglu_ref(gate, up, n);
}

