/* The parts of a Hugging Face / MLX Qwen2 config.json that the engine uses. */
#ifndef TLLM_CONFIG_H
#define TLLM_CONFIG_H

#include <stddef.h>

#define TLLM_CONFIG_MAX_BYTES (4u << 20)

/* How one module's weights are stored: bits = 0 means not quantized. */
struct tllm_quant_spec {
    int bits;
    int group_size;
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
    int max_pos;      /* max_position_embeddings */
    float norm_eps;   /* rms_norm_eps */
    float rope_theta;
    int tie_embeddings;
    int bos_id, eos_id; /* -1 when absent */
    struct tllm_quant_spec quant; /* default for every module; bits 0 = unquantized checkpoint */
    struct tllm_quant_override *overrides;
    int n_overrides;
};

/* Parse and validate config.json. On error, tllm_errmsg() names the file and the key. */
int tllm_config_load(const char *path, struct tllm_config *cfg);
void tllm_config_free(struct tllm_config *cfg);

/* The storage of `module` (without ".weight"): its override, else the default. */
struct tllm_quant_spec tllm_config_quant_for(const struct tllm_config *cfg, const char *module);

/* 1 if bits/group_size is a layout the kernels implement. */
int tllm_quant_supported(int bits, int group_size);

#endif
