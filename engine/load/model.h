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

struct tllm_gguf;

struct tllm_model {
    char *dir;                    /* the model directory, or the GGUF file */
    struct tllm_config cfg;
    struct tllm_ckpt *ckpt;       /* safetensors checkpoints (NULL for a GGUF file) */
    struct tllm_gguf *gguf;       /* a GGUF file (engine/load/gguf.h), or NULL */
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
    int deterministic;            /* a device's sums in a fixed order (no float atomics): the same bits every run */
};

/* Load DIR/config.json and DIR's safetensors; or a GGUF file (PATH, or the one .gguf file of a directory
 * without config.json). Errors name the file and the tensor. */
int tllm_model_load(const char *path, struct tllm_model **out);
/* The GGUF file at path (gguf_model.c) */
int tllm_model_load_gguf(const char *path, struct tllm_model **out);
/* The GGUF file that path stands for: path itself when it is one, or the one *.gguf file in a directory
 * that has no config.json (a fresh string in *file); *file = NULL when path is not a GGUF model, and an
 * error when a directory without config.json holds several. */
int tllm_model_gguf_path(const char *path, char **file);
void tllm_model_free(struct tllm_model *m);

/* For the loaders: m->layers and the one allocation behind every norm and bias (m->vectors), each
 * layer's vector fields and final_norm pointing into it, sized by m->cfg. */
int tllm_model_alloc(struct tllm_model *m);
/* For the loaders: find `name`, requiring a float dtype (when float_only) and the 1-D or 2-D shape
 * [d0(, d1)]; errors name the file, the tensor and both shapes. */
int tllm_model_tensor(const struct tllm_model *m, const char *name, int float_only, int ndim, int64_t d0, int64_t d1,
                      const struct tllm_tensor **out);
/* TLLM_ERR_FORMAT naming the tensor and [row, col] of its first NaN or infinity (float dtypes, as
 * [rows x cols]): a non-finite scale or bias would silently turn whole rows of logits into NaN. */
int tllm_tensor_check_finite(const struct tllm_tensor *t, int rows, int cols);
/* Free p with the model (p is freed at once when that fails). */
int tllm_model_own(struct tllm_model *m, void *p);

/* GPTQ and AWQ checkpoints (Qwen's -GPTQ-Int4/-Int8 and -AWQ releases), in gptq_awq.c: their integer
 * codes, zero points and scales converted on load into the affine layout every kernel reads.
 * Bind `module` (w->rows x w->cols set by the caller) from M.qweight, M.qzeros, M.scales (and GPTQ's
 * M.g_idx) as config.json's quantization_config describes them. GPTQ:
 *   qweight int32 [cols*bits/32, rows], codes packed along the input, lowest bits first;
 *   qzeros int32 [groups, rows*bits/32], packed along the output, stored minus one in the original
 *   "gptq" checkpoint format; scales [groups, rows]; g_idx int32 [cols], each input's group;
 *   w[r][i] = scales[g][r] * (q - zero[g][r]) with g = g_idx[i].
 * AWQ (GEMM): qweight int32 [cols, rows/8] and qzeros [groups, rows/8], packed along the output with
 * the 8 nibbles of a word holding outputs 0 2 4 6 1 3 5 7; w = scales * (q - zero).
 * The result is affine (scale s, bias -s*zero, float32), codes in mlx's order; GPTQ act-order columns
 * are stored sorted by group with w->perm giving each one's input. */
int tllm_bind_gptq_awq(struct tllm_model *m, const char *module, struct tllm_qweights *w);

/* Re-pack every affine linear (and the lm_head) for the integer-activation kernels (kernels/cpu/qpack.h):
 * faster, within ~1e-2 of the float path. Unpacked weights keep the exact float kernels. */
int tllm_model_pack(struct tllm_model *m);

/* Bytes of the tensors in the checkpoint's files (as stored, before any conversion) */
size_t tllm_model_file_bytes(const struct tllm_model *m);
/* Bytes of weights read to decode one token (every linear once, the lm_head, one embedding row); packed:
 * the linears as tllm_model_pack packed them for the CPU's int8 path (those it packed), else as stored. */
size_t tllm_model_bytes_per_token(const struct tllm_model *m, int packed);
/* Bits per weight of the matrices a decoded token reads (the linears and the lm_head; scales and
 * biases included), as stored or (packed) as tllm_model_bytes_per_token counts them. */
double tllm_model_bits_per_weight(const struct tllm_model *m, int packed);
/* Number of parameters (unquantized count). */
size_t tllm_model_n_params(const struct tllm_model *m);

#endif
