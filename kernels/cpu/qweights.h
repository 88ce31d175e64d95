/* QuantizedWeights: the one description of a weight matrix that every linear layer (and the
 * embedding lookup) goes through. A matrix is [rows x cols] = [out_features x in_features],
 * stored dense (F32/F16/BF16), affine-quantized (w = scale * q + bias per group: mlx-lm's affine mode, and
 * GPTQ / AWQ converted on load), or in mlx's microscaling float modes (w = scale * fp(q), no bias). */
#ifndef TLLM_QWEIGHTS_H
#define TLLM_QWEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "kernels/cpu/mxfp.h"

struct tllm_qpack;

enum tllm_wformat {
    TLLM_WF_DENSE,  /* w: [rows x cols] of `dtype` */
    TLLM_WF_AFFINE, /* q: uint32 [rows x cols*bits/32]; scales, biases: [rows x cols/group_size] of `dtype` */
    TLLM_WF_MXFP4,  /* q: E2M1 codes, uint32 [rows x cols/8]; scales: E8M0 bytes [rows x cols/32] */
    TLLM_WF_NVFP4,  /* q: E2M1 codes, uint32 [rows x cols/8]; scales: E4M3 bytes [rows x cols/16] */
    TLLM_WF_MXFP8,  /* q: E4M3 codes, uint32 [rows x cols/4]; scales: E8M0 bytes [rows x cols/32] */
};

struct tllm_qweights {
    const char *name;       /* module name, for messages */
    int rows, cols;
    enum tllm_wformat format;
    enum tllm_dtype dtype;  /* dense element type, or scale/bias type (U8 for the microscaling formats) */
    int bits;               /* code width: affine 1-6 or 8; 4 for the fp4 formats, 8 for mxfp8 */
    int group_size;         /* affine: 32, 64 or 128 (any multiple of 32 from GPTQ/AWQ); mx: 32; nvfp4: 16 */
    const void *w;          /* dense values or packed codes: one little-endian bit stream a row, lowest
                             * bits first, so a 3-, 5- or 6-bit code can straddle two words */
    const void *scales;     /* quantized formats */
    const void *biases;     /* affine only */
    const int32_t *perm;    /* [cols] or NULL: stored column j multiplies input element perm[j] (GPTQ
                             * act-order, whose groups are contiguous only in that order) */
    const struct tllm_qpack *pack; /* the same weights packed for int8 activations, or NULL (qpack.h) */
};

/* Bytes of weights (plus scales and biases) that one full pass over the matrix reads. */
size_t tllm_qw_nbytes(const struct tllm_qweights *w);

/* Code j of row r of a quantized matrix (rows hold cols*bits/32 whole words). */
static inline uint32_t tllm_qw_code(const struct tllm_qweights *w, int r, int j) {
    const uint32_t *row = (const uint32_t *)w->w + (size_t)r * (size_t)w->cols * (size_t)w->bits / 32;
    size_t bit = (size_t)j * (size_t)w->bits;
    unsigned sh = (unsigned)(bit & 31);
    uint32_t v = row[bit >> 5] >> sh;
    if (sh + (unsigned)w->bits > 32) v |= row[(bit >> 5) + 1] << (32 - sh);
    return v & ((1u << w->bits) - 1);
}

/* The scale of group g of row r, as float32 (the microscaling formats' E8M0 / E4M3 bytes decoded). */
static inline float tllm_qw_scale(const struct tllm_qweights *w, int r, int g) {
    size_t i = (size_t)r * (size_t)(w->cols / w->group_size) + (size_t)g;
    switch (w->format) {
    case TLLM_WF_MXFP4:
    case TLLM_WF_MXFP8: return tllm_e8m0_to_f32(((const uint8_t *)w->scales)[i]);
    case TLLM_WF_NVFP4: return tllm_e4m3_to_f32(((const uint8_t *)w->scales)[i]);
    default: return tllm_load_f32(w->scales, w->dtype, i);
    }
}

/* A code's value before the group scale: affine's integer, or the float code */
static inline float tllm_qw_code_value(enum tllm_wformat f, uint32_t code) {
    if (f == TLLM_WF_MXFP4 || f == TLLM_WF_NVFP4) return tllm_e2m1_to_f32(code);
    if (f == TLLM_WF_MXFP8) return tllm_e4m3_to_f32((uint8_t)code);
    return (float)code;
}

/* The format's name as config.json spells its mode ("affine", "mxfp4", ...; "dense") */
const char *tllm_wformat_name(enum tllm_wformat f);

#endif
