/* Model tools: quantize a Hugging Face checkpoint MLX-style, quantize weights on load, and write
 * full-size synthetic checkpoints for benchmarks. */
#ifndef TLLM_CONVERT_H
#define TLLM_CONVERT_H

#include <stdint.h>

#include "engine/load/model.h"

struct tllm_quantize_opts {
    enum tllm_qmode mode;      /* mlx.core.quantize's mode */
    int bits;                  /* affine: 1-6 or 8; mxfp4, nvfp4: 4; mxfp8: 8 */
    int group_size;            /* affine: 32, 64 or 128; nvfp4: 16; mx modes: 32 */
    enum tllm_dtype sb_dtype;  /* affine scales/biases dtype; TLLM_DT_INVALID = the source's dtype */
    const char *mixed;         /* NULL, or a recipe "mixed_LOW_HIGH", each side affine bits or a mode
                                * (e.g. mixed_2_4, mixed_4_8, mixed_mxfp4_mxfp8) */
    int force;                 /* allow writing into an existing non-empty OUT_DIR */
    int progress;              /* draw a progress bar on stderr */
};

/* IN_DIR (bf16/f16/f32 safetensors, single or sharded) -> OUT_DIR in MLX's quantized layout (any mode), with
 * config.json's "quantization" (and "quantization_config") and the tokenizer/generation files. */
int tllm_quantize_checkpoint(const char *in_dir, const char *out_dir, const struct tllm_quantize_opts *o);

/* Quantize every dense linear of a loaded model in memory (--quantize BITS on the commands). */
int tllm_model_quantize(struct tllm_model *m, int bits, int group_size);

struct tllm_synth_opts {
    int bits;               /* 2, 4, 8, or 0 for dense bf16 */
    int group_size;
    uint64_t seed;
    const char *tokenizer_dir; /* copy tokenizer/generation files from here (NULL: none) */
    int force;
};

/* Random weights at the shapes of CONFIG (a config.json), written straight in the quantized layout. */
int tllm_synth_checkpoint(const char *config_path, const char *out_dir, const struct tllm_synth_opts *o);

/* The quantization spec a mixed recipe gives `module` (layer index parsed from its name). */
int tllm_mixed_recipe_spec(const char *recipe, const char *module, int n_layers, int group_size,
                           struct tllm_quant_spec *spec);

#endif
