/* A loaded Qwen2 model: config, mapped checkpoint, and every weight bound with its shape checked. */
#ifndef TLLM_MODEL_H
#define TLLM_MODEL_H

#include "kernels/cpu/qweights.h"
#include "engine/load/checkpoint.h"
#include "engine/load/config.h"

struct tllm_layer {
    float *attn_norm;            /* [dim] input_layernorm */
    float *ffn_norm;             /* [dim] post_attention_layernorm */
    struct tllm_qweights wq;     /* [n_heads*head_dim x dim] */
    struct tllm_qweights wk;     /* [n_kv_heads*head_dim x dim] */
    struct tllm_qweights wv;     /* [n_kv_heads*head_dim x dim] */
    struct tllm_qweights wo;     /* [dim x n_heads*head_dim] */
    float *bq;                   /* [n_heads*head_dim] */
    float *bk;                   /* [n_kv_heads*head_dim] */
    float *bv;                   /* [n_kv_heads*head_dim] */
    struct tllm_qweights w_gate; /* [ffn_dim x dim] */
    struct tllm_qweights w_up;   /* [ffn_dim x dim] */
    struct tllm_qweights w_down; /* [dim x ffn_dim] */
};

struct tllm_model {
    char *dir;
    struct tllm_config cfg;
    struct tllm_ckpt *ckpt;
    struct tllm_qweights embed;   /* [vocab x dim] */
    struct tllm_layer *layers;    /* [n_layers] */
    float *final_norm;            /* [dim] */
    struct tllm_qweights lm_head; /* [vocab x dim]; a copy of `embed` when tied */
    float *vectors;               /* one allocation behind every norm and bias above (float32) */
    void **owned;                 /* weights quantized on load (tllm_model_quantize) */
    int n_owned;
    struct tllm_qpack *packs;     /* [n_packs] int8-activation copies of the linears (tllm_model_pack) */
    int n_packs;
    int n_sample;                 /* the lm_head rows that are tokens: vocab, or the tokenizer's ids when the
                                   * lm_head has padding rows past them (Qwen: 151,665 of 151,936); greedy
                                   * argmaxes and samplers never pick a row past it */
    int decode_levels;            /* int8 levels of generated tokens' activations: 2 (as float32; free for
                                   * one sequence) or 1 (as prompt tokens: faster steps of many) */
};

/* Load DIR/config.json and DIR's safetensors. Errors name the file and the tensor. */
int tllm_model_load(const char *dir, struct tllm_model **out);
void tllm_model_free(struct tllm_model *m);

/* Re-pack every affine linear (and the lm_head) for the integer-activation kernels (kernels/cpu/qpack.h):
 * faster, within ~1e-2 of the float path. Unpacked weights keep the exact float kernels. */
int tllm_model_pack(struct tllm_model *m);

/* Bytes of weights read to decode one token (every linear once, the lm_head, one embedding row). */
size_t tllm_model_bytes_per_token(const struct tllm_model *m);
/* Number of parameters (unquantized count). */
size_t tllm_model_n_params(const struct tllm_model *m);

#endif
