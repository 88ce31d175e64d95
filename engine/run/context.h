/* An inference context: one sequence in a paged KV cache of its own (engine/run/kv_cache.h), the CPU
 * backend that computes prefill over it, and the device (if any) that decodes, with their caches kept
 * in step. Many sequences at once are the scheduler's (engine/run/scheduler.h). */
#ifndef TLLM_CONTEXT_H
#define TLLM_CONTEXT_H

#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/load/model.h"
#include "engine/run/kv_cache.h"

enum tllm_logits_mode {
    TLLM_LOGITS_NONE, /* only fill the KV cache (e.g. all but the last prompt chunk) */
    TLLM_LOGITS_LAST, /* logits of the last token: [vocab] */
    TLLM_LOGITS_ALL,  /* logits of every token fed: [n x vocab] */
};

/* Where prompt chunks run when a device decodes (--prefill) */
enum tllm_prefill {
    TLLM_PREFILL_AUTO,   /* on the device where it is faster than the CPU threads (a GPU), else the CPU */
    TLLM_PREFILL_CPU,    /* on the CPU threads (the reference) */
    TLLM_PREFILL_DEVICE, /* on the device (an error where it cannot) */
};
/* "auto", "cpu", "device" -> mode; TLLM_ERR_ARG with a message otherwise */
int tllm_prefill_parse(const char *s, enum tllm_prefill *out);

#define TLLM_GREEDY_AHEAD 2 /* greedy steps a context keeps pushed at most */

struct tllm_ctx {
    const struct tllm_model *m;
    int n_ctx;          /* KV cache capacity in tokens */
    int n_batch;        /* most tokens one internal forward step handles */
    int pos;            /* tokens in the cache so far */
    struct tllm_kv *kv; /* the host's cache: one sequence, id 0 (its n_tokens: the positions current there) */
    struct tllm_backend *cpu;  /* the host's backend: prefill, and every step when no device decodes */
    /* a device decoding single tokens (tllm_ctx_use_device): its own KV cache, synced by position ranges */
    struct tllm_backend *dev;
    int dev_valid;      /* positions [0, dev_valid) of the device cache are current */
    enum tllm_prefill prefill; /* where prompt chunks run while a device decodes (default auto) */
    int dev_prefill;    /* they run on the device now (prefill and what the device says of itself) */
    float *stage;       /* [n_stage floats] a range of positions on its way between the two caches */
    size_t n_stage;
    int32_t *step_pos;  /* [n_batch] the positions of a step's tokens */
    int32_t *step_seq;  /* [n_batch] their sequence (0: one sequence runs) */
    int8_t *step_out;   /* [n_batch] which of them want logits */
    /* greedy steps pushed and not yet popped (tllm_ctx_greedy_push); on the CPU their argmaxes */
    int n_ahead, ahead_head;
    int32_t ahead[TLLM_GREEDY_AHEAD];
    int32_t last_argmax; /* of the latest CPU greedy step: what an id < 0 stands for there */
    int chained;         /* the last step was a greedy push, so an id < 0 may follow */
};

/* n_ctx <= 0: the model's max_position_embeddings. n_batch <= 0: 512. The cache holds float32 (exact). */
int tllm_ctx_init(struct tllm_ctx *ctx, const struct tllm_model *m, int n_ctx, int n_batch);
/* The same with the cache's type: TLLM_DT_F16 (what the front ends default to) or TLLM_DT_F32. */
int tllm_ctx_init_kv(struct tllm_ctx *ctx, const struct tllm_model *m, int n_ctx, int n_batch, enum tllm_dtype kv_type);
void tllm_ctx_free(struct tllm_ctx *ctx);
/* Forget the sequence (keep the buffers). */
void tllm_ctx_reset(struct tllm_ctx *ctx);
/* Drop cached tokens past `pos` (so a new turn can reuse a shared prefix). */
void tllm_ctx_truncate(struct tllm_ctx *ctx, int pos);

/* Feed n prompt token ids at positions pos..pos+n-1 (on a device, one token with LAST or NONE is a
 * decode step there). `logits` receives [vocab] (LAST) or [n x vocab] (ALL).
 * Fails with TLLM_ERR_LIMIT (cache untouched) when the tokens would not fit, TLLM_ERR_ARG on a bad id. */
int tllm_ctx_forward(struct tllm_ctx *ctx, const int32_t *ids, int n, float *logits,
                     enum tllm_logits_mode mode);

/* Run single-token steps on a device backend from now on (NULL: back to the CPU). The device's
 * cache must have been made for this context's n_ctx. Prompt chunks run where ctx->prefill says. */
void tllm_ctx_use_device(struct tllm_ctx *ctx, struct tllm_backend *dev);
/* Where prompt chunks run from now on. TLLM_PREFILL_DEVICE without a device, or with one that cannot
 * take them, fails with the reason (and changes nothing). */
int tllm_ctx_set_prefill(struct tllm_ctx *ctx, enum tllm_prefill mode);

/* Feed one generated token (the decode role: kernels/cpu/qpack.h) and get its logits. */
int tllm_ctx_decode(struct tllm_ctx *ctx, int32_t id, float *logits);

/* Feed one generated token and return the argmax of its logits (on the device when one is in use:
 * only the id crosses the bus). */
int tllm_ctx_decode_argmax(struct tllm_ctx *ctx, int32_t id, int32_t *next);

/* Greedy decoding a step ahead (what tllm_generate does for a greedy sampler): push feeds token id at
 * the next position, or with id < 0 the argmax of the previous push (only right after one), which the
 * caller need not have popped (on a device, push only queues the step, so the device runs the next
 * step while the host handles the last token); pop returns the argmax of the oldest push. At most TLLM_GREEDY_AHEAD
 * pushes outstanding; tllm_ctx_forward refuses to run while any is, truncate and reset drop them. */
int tllm_ctx_greedy_push(struct tllm_ctx *ctx, int32_t id);
/* 1 when a push returns before its step has run (a device that queues steps): then pushing ahead pays */
int tllm_ctx_queues_ahead(const struct tllm_ctx *ctx);
int tllm_ctx_greedy_pop(struct tllm_ctx *ctx, int32_t *next);

#endif
