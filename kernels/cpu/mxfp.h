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

/* The same plus an offset, 0..24: unsigned, as the int8 kernels take their weight operand */
#define TLLM_E2M1_OFFSET 12
static const uint8_t tllm_e2m1_u8[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

static inline float tllm_e2m1_to_f32(uint32_t code) { return 0.5f * (float)tllm_e2m1_x2[code & 15]; }

/* E8M0: 2^(e - 127), e = 255 is NaN */
static inline float tllm_e8m0_to_f32(uint8_t e) {
    if (e == 255) return NAN;
    uint32_t u = e ? (uint32_t)e << 23 : 0x00400000u; /* 2^-127 is a float32 subnormal */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* E4M3 (the "fn" variant, bias 7, subnormals below 2^-6), branch-free so that loops over codes vectorize:
 * the 7 magnitude bits placed at the top of a float32's exponent and mantissa give the value times
 * 2^-120, subnormals included (they land on float32 subnormals). S.1111.111 (NaN in the format) reads
 * as 480, as mlx's from_fp8 reads it; the loader refuses it where it is a scale. */
static inline float tllm_e4m3_to_f32(uint8_t c) {
    uint32_t u = (uint32_t)(c & 0x7f) << 20;
    float v;
    memcpy(&v, &u, 4);
    v *= 0x1p120f;
    return c & 0x80 ? -v : v;
}

#endif
