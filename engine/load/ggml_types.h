/* llama.cpp's (ggml's) tensor types: their block sizes, and the quantized ones mapped exactly onto
 * tllm's weight layouts (kernels/cpu/qweights.h), with no requantization:
 *   Q4_0 Q5_0 Q8_0 (w = d (q - 8 | 16 | 0), q signed for Q8_0) and Q4_1 Q5_1 (w = d q + m), blocks of 32:
 *     affine, one group a block, scale d, bias -8d / -16d / -128d (Q8_0's codes offset by 128) or m;
 *   Q4_K Q5_K (super-blocks of 256 in 8 sub-blocks of 32, 6-bit scales and mins): affine groups of 32,
 *     scale d * sc, bias -dmin * m;
 *   Q2_K Q3_K Q6_K (16 sub-blocks of 16): affine groups of 16; Q2_K scale d * sc, bias -dmin * m;
 *     Q3_K scale d * (sc - 32), codes low2 | high << 2, bias -4 scale; Q6_K scale d * sc, bias -32 scale;
 *   MXFP4 (E8M0 + 32 E2M1 codes) onto mxfp4, NVFP4 (4 x (UE4M3 + 16 E2M1)) onto nvfp4;
 *   F32 F16 BF16 dense, read in place.
 * Scales and biases are float16 where every one of a matrix is exactly a float16, else float32 (a K-quant's
 * d * sc has up to 17 significant bits), so s q + b is the value ggml dequantizes, bit for bit. */
#ifndef TLLM_GGML_TYPES_H
#define TLLM_GGML_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/qweights.h"

enum tllm_ggml_type_id {
    TLLM_GGML_F32 = 0, TLLM_GGML_F16 = 1, TLLM_GGML_Q4_0 = 2, TLLM_GGML_Q4_1 = 3, TLLM_GGML_Q5_0 = 6,
    TLLM_GGML_Q5_1 = 7, TLLM_GGML_Q8_0 = 8, TLLM_GGML_Q8_1 = 9, TLLM_GGML_Q2_K = 10, TLLM_GGML_Q3_K = 11,
    TLLM_GGML_Q4_K = 12, TLLM_GGML_Q5_K = 13, TLLM_GGML_Q6_K = 14, TLLM_GGML_Q8_K = 15, TLLM_GGML_BF16 = 30,
    TLLM_GGML_MXFP4 = 39, TLLM_GGML_NVFP4 = 40,
};

struct tllm_ggml_type {
    const char *name;
    int block;  /* elements a block */
    int bytes;  /* bytes a block */
    int runs;   /* 1 if tllm maps it onto its layouts (tllm_ggml_bind) */
};

/* The type's description; NULL for a number ggml does not define */
const struct tllm_ggml_type *tllm_ggml_type(uint32_t type);
/* F32, F16, BF16 as tllm's dtype; TLLM_DT_INVALID for every other type */
enum tllm_dtype tllm_ggml_dense_dtype(uint32_t type);

/* Bind a [rows x cols] matrix of ggml type `type` at data (a GGUF tensor's ne[1] x ne[0]) as w (w->name =
 * name): dense types in place, quantized ones converted into up to two new buffers that the caller frees
 * (owned[0], owned[1]; NULL when unused). Types tllm does not run (IQ*, TQ*, Q8_1, Q8_K, integers, F64)
 * are refused naming the tensor and its type. `file` names the file in messages. */
int tllm_ggml_bind(const char *name, uint32_t type, int64_t rows, int64_t cols, const void *data, const char *file,
                   struct tllm_qweights *w, void *owned[2]);

#endif
