#include "base/dtype.h"

#include <math.h>

static const struct {
    const char *name;
    size_t size;
} dtype_traits[] = {
    [TLLM_DT_INVALID] = {"INVALID", 0},
    [TLLM_DT_U32] = {"U32", 4},
    [TLLM_DT_BF16] = {"BF16", 2},
    [TLLM_DT_F16] = {"F16", 2},
    [TLLM_DT_F32] = {"F32", 4},
    [TLLM_DT_U8] = {"U8", 1},
    [TLLM_DT_I32] = {"I32", 4},
};

size_t tllm_dtype_size(enum tllm_dtype t) {
    return (unsigned)t < TLLM_DT_COUNT_ ? dtype_traits[t].size : 0;
}

const char *tllm_dtype_name(enum tllm_dtype t) {
    return (unsigned)t < TLLM_DT_COUNT_ ? dtype_traits[t].name : "INVALID";
}

enum tllm_dtype tllm_dtype_parse(const char *s) {
    for (int t = TLLM_DT_U32; t < TLLM_DT_COUNT_; t++)
        if (strcmp(s, dtype_traits[t].name) == 0) return (enum tllm_dtype)t;
    return TLLM_DT_INVALID;
}

uint16_t tllm_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (absu < 0x38800000u) { /* result is subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t man = (absu & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(absu >> 23); /* 14..24 */
        uint32_t r = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = absu - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t h = r >> 13, rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

void tllm_convert_to_f32(const void *src, enum tllm_dtype t, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tllm_load_f32(src, t, i);
}

/* v (n values at stride `stride`) as big / k times int8s exactly: 1 if big / k is a float16 and each
 * value that float16 times an int8 */
static int factor_by(const float *v, size_t stride, int n, float big, float k, uint16_t *D, int8_t *q) {
    float d = big / k;
    uint16_t h = tllm_f32_to_f16(d);
    if (tllm_f16_to_f32(h) != d || d == 0.0f) return 0;
    for (int i = 0; i < n; i++) {
        float r = rintf(v[i * stride] / d);
        if (!(r >= -128.0f && r <= 127.0f && r * d == v[i * stride])) return 0;
        q[i] = (int8_t)r;
    }
    *D = h;
    return 1;
}

/* The largest |v| is q = k or -k for some k <= 128, so D is that value / k: tried first with k = 63
 * (the largest of k-quants' 6-bit scales, what their quantizers give the largest group), then only the k
 * that are m |big / small| for an integer m (small: the smallest nonzero |v|, whose q is m or -m). */
int tllm_f16_i8_factor(const float *v, size_t stride, int n, uint16_t *D, int8_t *q) {
    float big = 0.0f, small = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = v[i * stride];
        big = fabsf(a) > fabsf(big) ? a : big;
        small = a != 0.0f && (small == 0.0f || fabsf(a) < fabsf(small)) ? a : small;
    }
    if (!(fabsf(big) <= 65504.0f * 128.0f)) return 0; /* NaN or out of range */
    if (big == 0.0f) {
        *D = 0;
        for (int i = 0; i < n; i++) q[i] = 0;
        return 1;
    }
    if (factor_by(v, stride, n, big, 63.0f, D, q) || factor_by(v, stride, n, big, -63.0f, D, q)) return 1;
    float rho = fabsf(big / small);
    for (int m = 1; m <= 128; m++) {
        float km = (float)m * rho, k = rintf(km);
        if (km > 128.5f) break;
        if (k < 1.0f || fabsf(km - k) > 1e-3f * k) continue; /* not an integer: m is not |q| of small */
        if (factor_by(v, stride, n, big, k, D, q) || factor_by(v, stride, n, big, -k, D, q)) return 1;
    }
    return 0;
}
