#include "base/dtype.h"

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
