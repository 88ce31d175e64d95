/* Element types found in checkpoints, and the scalar conversions to float32. */
#ifndef TLLM_DTYPE_H
#define TLLM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum tllm_dtype {
    TLLM_DT_INVALID = 0,
    TLLM_DT_U32,
    TLLM_DT_BF16,
    TLLM_DT_F16,
    TLLM_DT_F32,
    TLLM_DT_U8,  /* microscaling scales (E8M0 / E4M3 bytes) */
    TLLM_DT_I32, /* GPTQ / AWQ packed codes and group indices */
    TLLM_DT_COUNT_
};

/* Bytes per element; 0 for TLLM_DT_INVALID. */
size_t tllm_dtype_size(enum tllm_dtype t);
/* "U32", "BF16", ... as safetensors spells them. */
const char *tllm_dtype_name(enum tllm_dtype t);
/* 1 for BF16, F16, F32. */
static inline int tllm_dtype_is_float(enum tllm_dtype t) {
    return t == TLLM_DT_BF16 || t == TLLM_DT_F16 || t == TLLM_DT_F32;
}
/* Parse a safetensors dtype string; TLLM_DT_INVALID if not one we support. */
enum tllm_dtype tllm_dtype_parse(const char *s);

static inline float tllm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE binary16 -> binary32, exact for every input including subnormals, inf, NaN. */
static inline float tllm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: renormalize */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* v[0 .. n) (float32, at stride `stride`) as D * q[i] exactly, D a float16 and q int8 (the
 * two-level scales of k-quants: d * sc); 1 if found (none is missed). Used by the CPU packs and the
 * device's forms. */
int tllm_f16_i8_factor(const float *v, size_t stride, int n, uint16_t *D, int8_t *q);

/* float32 -> bf16, round to nearest even (NaN stays NaN). */
static inline uint16_t tllm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* float32 -> binary16, round to nearest even, overflow to inf. */
uint16_t tllm_f32_to_f16(float f);

/* Element i of a BF16/F16/F32 array as float. */
static inline float tllm_load_f32(const void *p, enum tllm_dtype t, size_t i) {
    switch (t) {
    case TLLM_DT_BF16: return tllm_bf16_to_f32(((const uint16_t *)p)[i]);
    case TLLM_DT_F16: return tllm_f16_to_f32(((const uint16_t *)p)[i]);
    case TLLM_DT_F32: return ((const float *)p)[i];
    default: return 0.0f;
    }
}

/* Convert n elements of a BF16/F16/F32 array to float32. */
void tllm_convert_to_f32(const void *src, enum tllm_dtype t, float *dst, size_t n);

#endif
