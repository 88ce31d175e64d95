/* An inference context: KV cache and activation buffers for one sequence, allocated once. */
#ifndef TLLM_CONTEXT_H
#define TLLM_CONTEXT_H

#include <stdint.h>

#include "model.h"

enum tllm_logits_mode {
    TLLM_LOGITS_NONE, /* only fill the KV cache (e.g. all but the last prompt chunk) */
    TLLM_LOGITS_LAST, /* logits of the last token: [vocab] */
    TLLM_LOGITS_ALL,  /* logits of every token fed: [n x vocab] */
};

#define TLLM_GREEDY_AHEAD 2 /* greedy steps a context keeps pushed at most */

struct tllm_ctx {
    const struct tllm_model *m;
    int n_ctx;          /* KV cache capacity in tokens */
    int n_batch;        /* most tokens one internal forward step handles */
    int pos;            /* tokens in the cache so far */
    float *key_cache;   /* [n_layers x n_kv_heads x head_dim x n_ctx]: transposed, so q.K^T vectorizes over positions */
    float *value_cache; /* [n_layers x n_ctx x kv_dim] */
    /* activations for up to n_batch tokens */
    float *x;           /* [n_batch x dim] residual stream */
    float *xb;          /* [n_batch x dim] normed input of a sublayer */
    float *q;           /* [n_batch x q_dim] */
    float *k;           /* [n_batch x kv_dim] */
    float *v;           /* [n_batch x kv_dim] */
    float *att_out;     /* [n_batch x q_dim] attention output before o_proj */
    float *proj;        /* [n_batch x dim] o_proj / down_proj output */
    float *hb;          /* [n_batch x ffn_dim] gate, then silu(gate)*up */
    float *hb2;         /* [n_batch x ffn_dim] up */
    float *scores;      /* [n_scratch x 16 x n_ctx] attention scores, a block of query rows per thread */
    int n_scratch;      /* threads in the pool when the context was made */
    float *rope_cos;    /* [n_batch x head_dim/2] */
    float *rope_sin;    /* [n_batch x head_dim/2] */
    /* int8 copy of the current matmul input, for packed weights (kernels/qpack.h) */
    int8_t *xq;         /* [n_batch x max_cols] */
    int8_t *xq2;        /* [TLLM_XQ_L2_MAX_TOKENS x max_cols] second level for decode steps */
    float *xq_d;        /* [n_batch x max_cols/32] */
    float *xq_sum;      /* [n_batch x max_cols/32] */
    /* decode on an OpenCL device (tllm_ctx_use_cl): its own KV cache, synced by position ranges */
    struct tllm_cl *cl;
    int host_valid;     /* positions [0, host_valid) of the host cache are current */
    int dev_valid;      /* positions [0, dev_valid) of the device cache are current */
    float *logits_buf;  /* [vocab], for tllm_ctx_decode_argmax on the CPU */
    /* greedy steps pushed and not yet popped (tllm_ctx_greedy_push); on the CPU their argmaxes */
    int n_ahead, ahead_head;
    int32_t ahead[TLLM_GREEDY_AHEAD];
    int32_t last_argmax; /* of the latest CPU greedy step: what an id < 0 stands for there */
    int chained;         /* the last step was a greedy push, so an id < 0 may follow */
};

/* n_ctx <= 0: the model's max_position_embeddings. n_batch <= 0: 512. */
int tllm_ctx_init(struct tllm_ctx *ctx, const struct tllm_model *m, int n_ctx, int n_batch);
void tllm_ctx_free(struct tllm_ctx *ctx);
/* Forget the sequence (keep the buffers). */
void tllm_ctx_reset(struct tllm_ctx *ctx);
/* Drop cached tokens past `pos` (so a new turn can reuse a shared prefix). */
void tllm_ctx_truncate(struct tllm_ctx *ctx, int pos);

/* Feed n token ids at positions pos..pos+n-1. `logits` receives [vocab] (LAST) or [n x vocab] (ALL).
 * Fails with TLLM_ERR_LIMIT (cache untouched) when the tokens would not fit, TLLM_ERR_ARG on a bad id. */
int tllm_ctx_forward(struct tllm_ctx *ctx, const int32_t *ids, int n, float *logits,
                     enum tllm_logits_mode mode);

struct tllm_cl;
/* Run single-token steps on an OpenCL device from now on (NULL: back to the CPU). The device's
 * cache must have been made for this context's n_ctx. Multi-token steps stay on the CPU threads. */
void tllm_ctx_use_cl(struct tllm_ctx *ctx, struct tllm_cl *cl);

/* Feed one token and return the argmax of its logits (on the device when one is in use: only the id
 * crosses the bus). */
int tllm_ctx_decode_argmax(struct tllm_ctx *ctx, int32_t id, int32_t *next);

/* Greedy decoding a step ahead (what tllm_generate does for a greedy sampler): push feeds token id at
 * the next position, or with id < 0 the argmax of the previous push (only right after one), which the
 * caller need not have popped (on a device, push only queues the step, so the device runs the next
 * step while the host handles the last token); pop returns the argmax of the oldest push. At most TLLM_GREEDY_AHEAD
 * pushes outstanding; tllm_ctx_forward refuses to run while any is, truncate and reset drop them. */
int tllm_ctx_greedy_push(struct tllm_ctx *ctx, int32_t id);
int tllm_ctx_greedy_pop(struct tllm_ctx *ctx, int32_t *next);

#endif
