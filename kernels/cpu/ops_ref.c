/* The scalar oracles of ops.h (double sums where it matters): what the tests hold every faster
 * kernel to, and what a CPU without a faster one runs. */
#include <math.h>
#include <stddef.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_ref.h"

void tllm_attention_ref(const float *q, size_t q_stride, int nq, int pos0, const float *kt, size_t kt_stride,
                        const float *v, size_t v_stride, int hd, float *scores, float *out, size_t out_stride) {
    const int L = pos0 + nq;
    for (int j = 0; j < nq; j++) {
        const int len = pos0 + j + 1;
        float *s = scores + (size_t)j * L;
        for (int p = 0; p < len; p++) {
            double dot = 0.0;
            for (int i = 0; i < hd; i++) dot += (double)q[(size_t)j * q_stride + i] * kt[(size_t)i * kt_stride + p];
            s[p] = (float)(dot / sqrt((double)hd));
        }
        tllm_softmax(s, len);
        for (int i = 0; i < hd; i++) {
            double acc = 0.0;
            for (int p = 0; p < len; p++) acc += (double)s[p] * v[(size_t)p * v_stride + i];
            out[(size_t)j * out_stride + i] = (float)acc;
        }
    }
}

int tllm_argmax_ref(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int tllm_argmax_allowed_ref(const float *x, int n, const uint32_t *allow) {
    int best = -1;
    float bv = -INFINITY;
    for (int w = 0; w < (n + 31) / 32; w++) {
        int i0 = w * 32;
        if (allow[w] == 0xffffffffu && i0 + 32 <= n) { /* a whole word allowed (most of a grammar's words, or none) */
            float m = -INFINITY;
            for (int i = i0; i < i0 + 32; i++) m = x[i] > m ? x[i] : m;
            if (m > bv || (best < 0 && m == bv))
                for (int i = i0; i < i0 + 32; i++)
                    if (x[i] == m) {
                        bv = m, best = i;
                        break;
                    }
            continue;
        }
        for (uint32_t bits = allow[w]; bits; bits &= bits - 1) {
            int i = i0 + __builtin_ctz(bits);
            if (i >= n) break;
            if (x[i] > bv || (best < 0 && x[i] == bv)) bv = x[i], best = i;
        }
    }
    return best;
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

TLLM_CLONES void tllm_swiglu_ref(float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
