/* MLX's affine quantizer (mlx.core.quantize, mode "affine"), bit for bit. */
#ifndef TLLM_QUANTIZE_H
#define TLLM_QUANTIZE_H

#include <stdint.h>

#include "base/dtype.h"
#include "kernels/cpu/qweights.h"

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

/* float32 -> E4M3 (fn), round half to even, saturating at 448 (NaN too), as mlx's to_fp8. */
uint8_t tllm_f32_to_e4m3(float f);

/* mlx.core.quantize's float modes (format TLLM_WF_MXFP4, NVFP4, MXFP8), byte for byte, for a row whose
 * values came from src_dtype (mlx rounds s, w' and the mx modes' distances to that dtype): per group of
 * 32 (nvfp4: 16),
 *   s = max|w| / maxval  (maxval 6 for E2M1, 448 for E4M3)
 *   mx modes: e = s == 0 ? 0 : ceil(log2(s)); scale byte e + 127; w' = w / 2^e
 *             (the released mlx 0.32 wheel rounds up, so no w' exceeds maxval; the mlx source snapshot
 *             at 846d176 writes round(); the vectors in tests/data pin the wheel's bytes)
 *   nvfp4:    scale byte = E4M3(s); w' = w / decoded scale
 *   codes: E4M3(w') (mxfp8), or the E2M1 value nearest w', the lowest code at a tie.
 * q: [cols * bits / 32] packed lowest bits first; scales: [cols / group]. */
void tllm_quantize_row_fp(const float *w, int cols, enum tllm_wformat format, enum tllm_dtype src_dtype, uint32_t *q,
                          uint8_t *scales);

#endif
