/* MLX's affine quantizer (mlx.core.quantize, mode "affine"), bit for bit. */
#ifndef TLLM_QUANTIZE_H
#define TLLM_QUANTIZE_H

#include <stdint.h>

#include "engine/base/dtype.h"

/* Quantize one row of `cols` float32 values (cols % group_size == 0) to codes of `bits` packed
 * MLX-style into q[cols*bits/32], with one scale and bias per group written in `sb_dtype`
 * (BF16/F16/F32) to scales[] / biases[]. Per group, in float32:
 *   scale = max((max - min) / (2^B - 1), 1e-7), negated unless |min| > |max|
 *   edge  = |min| > |max| ? min : max;  q0 = rint(edge / scale)
 *   if q0 != 0: scale = edge / q0, bias = edge; else bias = 0
 *   q = clamp(rint((w - bias) / scale), 0, 2^B - 1)
 * (one bit: scale = max - min, bias = min, as mlx). The codes use the float32 scale; scale and bias
 * are rounded to sb_dtype only when stored. 3-, 5- and 6-bit codes continue across words. */
void tllm_quantize_row_affine(const float *w, int cols, int bits, int group_size, enum tllm_dtype sb_dtype,
                              uint32_t *q, void *scales, void *biases);

#endif
