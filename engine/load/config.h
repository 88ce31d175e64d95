/* The parts of a Hugging Face / MLX Qwen2 config.json that the engine uses. */
#ifndef TLLM_CONFIG_H
#define TLLM_CONFIG_H

#include <stddef.h>

#define TLLM_CONFIG_MAX_BYTES (4u << 20)

/* mlx.core.quantize's modes: affine codes with a scale and bias per group, or the microscaling float
 * codes (E2M1 / E4M3) with one shared scale per group (E8M0 / E4M3) and no bias. */
enum tllm_qmode { TLLM_QM_AFFINE = 0, TLLM_QM_MXFP4, TLLM_QM_NVFP4, TLLM_QM_MXFP8 };

/* Who wrote the quantized tensors: mlx-lm (`M.weight` codes, `M.scales`, `M.biases`), or GPTQ / AWQ
 * (`M.qweight`, `M.qzeros`, `M.scales`, GPTQ's `M.g_idx`), converted to the affine layout on load. */
enum tllm_qmethod { TLLM_QMETHOD_MLX = 0, TLLM_QMETHOD_GPTQ, TLLM_QMETHOD_AWQ };

/* How one module's weights are stored: bits = 0 means not quantized. */
struct tllm_quant_spec {
    int bits;
    int group_size; /* GPTQ's -1 (one group a row) is stored as 0 and read as the row length */
    enum tllm_qmode mode;
};

struct tllm_quant_override {
    char *module; /* e.g. "model.layers.0.mlp.down_proj" */
    struct tllm_quant_spec spec;
};

struct tllm_config {
    int dim;          /* hidden_size */
    int n_layers;     /* num_hidden_layers */
    int n_heads;      /* num_attention_heads */
    int n_kv_heads;   /* num_key_value_heads */
    int head_dim;     /* head_dim, or hidden_size / num_attention_heads */
    int ffn_dim;      /* intermediate_size */
    int vocab_size;
    int max_pos;      /* max_position_embeddings, or the sliding window where smaller (sliding_window) */
    int sliding_window; /* the attention window of some layers (use_sliding_window, max_window_layers or
                           layer_types), 0 if none: tllm attends to every position, which equals the
                           window's attention only within it, so the context is capped at it */
    float norm_eps;   /* rms_norm_eps */
    float rope_theta;
    int tie_embeddings;
    int bos_id, eos_id; /* -1 when absent */
    struct tllm_quant_spec quant; /* default for every module; bits 0 = unquantized checkpoint */
    struct tllm_quant_override *overrides;
    int n_overrides;
    enum tllm_qmethod qmethod;
    int gptq_desc_act;    /* GPTQ act-order: columns grouped by g_idx, not by position */
    int gptq_zero_offset; /* 1: the original GPTQ format, zero points stored minus one ("gptq", not "gptq_v2") */
};

/* Parse and validate config.json. On error, tllm_errmsg() names the file and the key. */
int tllm_config_load(const char *path, struct tllm_config *cfg);
void tllm_config_free(struct tllm_config *cfg);

/* The storage of `module` (without ".weight"): its override, else the default. */
struct tllm_quant_spec tllm_config_quant_for(const struct tllm_config *cfg, const char *module);

/* 1 if affine bits/group_size is a layout the kernels implement. */
int tllm_quant_supported(int bits, int group_size);
/* 1 if (mode, bits, group_size) is one mlx.core.quantize writes and the kernels implement. */
int tllm_quant_mode_supported(enum tllm_qmode mode, int bits, int group_size);
/* "affine", "mxfp4", "nvfp4", "mxfp8"; and back (-1 when unknown). */
const char *tllm_qmode_name(enum tllm_qmode mode);
int tllm_qmode_parse(const char *s);
/* mlx.core.quantize's bits and group size for a mode when they are not given. */
void tllm_qmode_defaults(enum tllm_qmode mode, int *bits, int *group_size);

#endif
