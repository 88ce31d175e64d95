/* The microscaling float codes of mlx.core.quantize's mxfp4 / nvfp4 / mxfp8 modes (OCP MX v1.0 and
 * NVIDIA's NVFP4): E2M1 and E4M3 element codes, E8M0 and E4M3 group scales. Every code decodes exactly
 * to float32. */
#ifndef TLLM_MXFP_H
#define TLLM_MXFP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* E2M1 codes times two: small integers, so fp4 weights meet int8 activations in integer dot products.
 * Bit 3 is the sign. */
static const int8_t tllm_e2m1_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float tllm_e2m1_to_f32(uint32_t code) { return 0.5f * (float)tllm_e2m1_x2[code & 15]; }

/* E8M0: 2^(e - 127), e = 255 is NaN */
static inline float tllm_e8m0_to_f32(uint8_t e) {
    if (e == 255) return NAN;
    uint32_t u = e ? (uint32_t)e << 23 : 0x00400000u; /* 2^-127 is a float32 subnormal */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* E4M3 (the "fn" variant: no infinities, S.1111.111 is NaN), bias 7, subnormals below 2^-6 */
static inline float tllm_e4m3_to_f32(uint8_t c) {
    uint32_t e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15 && m == 7) return NAN;
    float v;
    if (e == 0) {
        v = (float)m * (1.0f / 512.0f);
    } else {
        uint32_t u = ((e + 120u) << 23) | (m << 20); /* rebias 7 -> 127 */
        memcpy(&v, &u, 4);
    }
    return c & 0x80 ? -v : v;
}

#endif
