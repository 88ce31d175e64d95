/* QuantizedWeights: the one description of a weight matrix that every linear layer (and the
 * embedding lookup) goes through. A matrix is [rows x cols] = [out_features x in_features],
 * stored either dense (F32/F16/BF16) or MLX affine-quantized (w = scale * q + bias per group). */
#ifndef TLLM_QWEIGHTS_H
#define TLLM_QWEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/base/dtype.h"

struct tllm_qpack;

enum tllm_wformat {
    TLLM_WF_DENSE,  /* w: [rows x cols] of `dtype` */
    TLLM_WF_AFFINE, /* q: uint32 [rows x cols*bits/32]; scales, biases: [rows x cols/group_size] of `dtype` */
};

struct tllm_qweights {
    const char *name;       /* module name, for messages */
    int rows, cols;
    enum tllm_wformat format;
    enum tllm_dtype dtype;  /* dense element type, or scale/bias type */
    int bits;               /* affine: 2, 4 or 8 */
    int group_size;         /* affine: 32, 64 or 128 */
    const void *w;          /* dense values or packed codes (lowest bits first within a word) */
    const void *scales;     /* affine only */
    const void *biases;     /* affine only */
    const struct tllm_qpack *pack; /* the same weights packed for int8 activations, or NULL (qpack.h) */
};

/* Bytes of weights (plus scales and biases) that one full pass over the matrix reads. */
size_t tllm_qw_nbytes(const struct tllm_qweights *w);

/* Code j of row r of an affine matrix (bits 2/4/8: codes never straddle a word). */
static inline uint32_t tllm_qw_code(const struct tllm_qweights *w, int r, int j) {
    const uint32_t *row = (const uint32_t *)w->w + (size_t)r * (size_t)(w->cols * w->bits / 32);
    int per_word = 32 / w->bits;
    return (row[j / per_word] >> ((j % per_word) * w->bits)) & ((1u << w->bits) - 1);
}

#endif
