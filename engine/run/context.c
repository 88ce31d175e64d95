/* A sequence's context: where it stands in its KV cache, which backend runs each step (the CPU's
 * for prompts and multi-token steps, a device's for single tokens when one decodes), the two caches
 * kept in step by position ranges, and greedy steps queued ahead. The forward pass itself is the
 * backends' (engine/backend/); the host's cache is a paged one with a single sequence, 0. */
#include "engine/run/context.h"

#include <stdlib.h>
#include <string.h>

#include "engine/backend/registry.h"
#include "base/error.h"

int tllm_ctx_init(struct tllm_ctx *ctx, const struct tllm_model *m, int n_ctx, int n_batch) {
    return tllm_ctx_init_kv(ctx, m, n_ctx, n_batch, TLLM_DT_F32);
}

int tllm_ctx_init_kv(struct tllm_ctx *ctx, const struct tllm_model *m, int n_ctx, int n_batch, enum tllm_dtype kv_type) {
    memset(ctx, 0, sizeof *ctx);
    const struct tllm_config *c = &m->cfg;
    if (n_ctx <= 0) n_ctx = c->max_pos;
    if (n_batch <= 0) n_batch = 512;
    if (n_batch > n_ctx) n_batch = n_ctx;
    ctx->m = m;
    ctx->n_ctx = n_ctx;
    ctx->n_batch = n_batch;
    int seq, rc = tllm_kv_init(&ctx->kv, c->n_layers, c->n_kv_heads, c->head_dim, n_ctx, kv_type, 1);
    if (!rc) rc = tllm_kv_seq_open(ctx->kv, &seq);
    if (!rc) rc = tllm_backend_cpu_init(&ctx->cpu, m, ctx->kv, n_batch);
    if (rc) {
        tllm_ctx_free(ctx);
        return rc;
    }
    ctx->step_pos = malloc((size_t)n_batch * sizeof *ctx->step_pos);
    ctx->step_seq = calloc((size_t)n_batch, sizeof *ctx->step_seq);
    ctx->step_out = malloc((size_t)n_batch);
    if (!ctx->step_pos || !ctx->step_seq || !ctx->step_out) {
        tllm_ctx_free(ctx);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    return TLLM_OK;
}

void tllm_ctx_free(struct tllm_ctx *ctx) {
    tllm_backend_free(ctx->cpu);
    tllm_kv_free(ctx->kv);
    free(ctx->stage);
    free(ctx->step_pos);
    free(ctx->step_seq);
    free(ctx->step_out);
    memset(ctx, 0, sizeof *ctx);
}

/* Forget the greedy steps pushed and not popped (a device finishes them first: they write its cache) */
static void drop_ahead(struct tllm_ctx *ctx) {
    int32_t id;
    ctx->chained = 0;
    while (ctx->n_ahead)
        if (tllm_ctx_greedy_pop(ctx, &id)) ctx->n_ahead = 0; /* a failed step: the device dropped the rest */
}

void tllm_ctx_reset(struct tllm_ctx *ctx) {
    drop_ahead(ctx);
    ctx->pos = ctx->dev_valid = 0;
    tllm_kv_seq_truncate(ctx->kv, 0, 0);
}

void tllm_ctx_truncate(struct tllm_ctx *ctx, int pos) {
    drop_ahead(ctx);
    if (pos < 0 || pos >= ctx->pos) return;
    ctx->pos = pos;
    if (ctx->kv->seqs[0].n_tokens > pos) tllm_kv_seq_truncate(ctx->kv, 0, pos);
    if (ctx->dev_valid > pos) ctx->dev_valid = pos;
}

/* Room for positions [p0, p1) in the staging buffer (keys and values) */
static int stage_for(struct tllm_ctx *ctx, int p0, int p1, float **kt, float **v) {
    const struct tllm_config *c = &ctx->m->cfg;
    size_t half = (size_t)c->n_layers * c->n_kv_heads * c->head_dim * (size_t)(p1 - p0), need = 2 * half;
    if (need > ctx->n_stage) {
        float *s = realloc(ctx->stage, need * sizeof *s);
        if (!s) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        ctx->stage = s, ctx->n_stage = need;
    }
    *kt = ctx->stage, *v = ctx->stage + half;
    return TLLM_OK;
}

/* Positions the device decoded, brought to the host's cache: the CPU needs them now */
static int host_sync(struct tllm_ctx *ctx) {
    int p0 = ctx->kv->seqs[0].n_tokens, p1 = ctx->pos, rc;
    float *kt = NULL, *v = NULL;
    if (!ctx->dev || p0 >= p1) return TLLM_OK;
    if ((rc = stage_for(ctx, p0, p1, &kt, &v)) || (rc = tllm_kv_seq_reserve(ctx->kv, 0, p1)) ||
        (rc = ctx->dev->ops->kv_download(ctx->dev, kt, v, p0, p1)))
        return rc;
    tllm_kv_seq_write(ctx->kv, 0, p0, p1, kt, v);
    return tllm_kv_seq_commit(ctx->kv, 0, NULL, p1 - p0); /* ids unknown here: those blocks are never shared */
}

int tllm_prefill_parse(const char *s, enum tllm_prefill *out) {
    static const char *const names[] = {"auto", "cpu", "device"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) return *out = (enum tllm_prefill)i, TLLM_OK;
    return tllm_fail(TLLM_ERR_ARG, "'%s' is not auto, cpu or device", s);
}

/* Whether prompt chunks go to the device: as the mode says, and (auto) where the device says it is
 * faster than the CPU threads */
static int pick_prefill(struct tllm_ctx *ctx, enum tllm_prefill mode, int *on_dev) {
    *on_dev = 0;
    if (!ctx->dev || mode == TLLM_PREFILL_CPU) return TLLM_OK;
    struct tllm_backend_info info;
    tllm_backend_describe(ctx->dev, &info);
    if (mode == TLLM_PREFILL_DEVICE && info.prefill < 0)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "--prefill device: %s takes single tokens only (this model's shapes)", info.name);
    *on_dev = mode == TLLM_PREFILL_DEVICE || info.prefill > 0;
    return TLLM_OK;
}

int tllm_ctx_set_prefill(struct tllm_ctx *ctx, enum tllm_prefill mode) {
    if (mode == TLLM_PREFILL_DEVICE && !ctx->dev) return tllm_fail(TLLM_ERR_ARG, "--prefill device: no device is in use (--device opencl)");
    int on_dev, rc = pick_prefill(ctx, mode, &on_dev);
    if (rc) return rc;
    ctx->prefill = mode, ctx->dev_prefill = on_dev;
    return TLLM_OK;
}

void tllm_ctx_use_device(struct tllm_ctx *ctx, struct tllm_backend *dev) {
    drop_ahead(ctx);
    /* what the old device decoded comes home first; if it cannot, the sequence ends where the host's
     * cache does (a shorter context, never a stale one) */
    if (ctx->dev && ctx->dev != dev && host_sync(ctx)) ctx->pos = ctx->kv->seqs[0].n_tokens;
    ctx->dev = dev;
    ctx->dev_valid = 0;
    if (pick_prefill(ctx, ctx->prefill, &ctx->dev_prefill)) ctx->dev_prefill = 0; /* the CPU's, as auto would */
}

/* The device's cache brought up to date with what the CPU computed */
static int dev_sync(struct tllm_ctx *ctx) {
    if (ctx->dev_valid < ctx->pos) {
        float *kt = NULL, *v = NULL;
        int rc = stage_for(ctx, ctx->dev_valid, ctx->pos, &kt, &v);
        if (rc) return rc;
        tllm_kv_seq_read(ctx->kv, 0, ctx->dev_valid, ctx->pos, kt, v);
        if ((rc = ctx->dev->ops->kv_upload(ctx->dev, kt, v, ctx->dev_valid, ctx->pos))) return rc;
        ctx->dev_valid = ctx->pos;
    }
    return TLLM_OK;
}

/* A step of n tokens of the context's sequence from ctx->pos on (n_gen of them generated); out:
 * which want logits */
static struct tllm_batch batch_of(struct tllm_ctx *ctx, const int32_t *ids, int n, int n_gen) {
    for (int t = 0; t < n; t++) ctx->step_pos[t] = ctx->pos + t;
    struct tllm_batch b = {.n = n, .id = ids, .pos = ctx->step_pos, .seq = ctx->step_seq, .out = ctx->step_out, .n_gen = n_gen};
    return b;
}

/* A step on the CPU: positions reserved, then committed once written */
static int cpu_step(struct tllm_ctx *ctx, const struct tllm_batch *b, float *logits, int32_t *argmax) {
    int rc = tllm_kv_seq_reserve(ctx->kv, 0, ctx->pos + b->n);
    if (!rc) rc = ctx->cpu->ops->step(ctx->cpu, b, logits, argmax);
    if (!rc) rc = tllm_kv_seq_commit(ctx->kv, 0, b->id, b->n);
    return rc;
}

/* One generated token on the device when one decodes (its cache first brought up to date with what
 * the CPU computed), else on the CPU: its logits and/or its argmax, as asked. */
static int one_token(struct tllm_ctx *ctx, int32_t id, float *logits, int32_t *argmax) {
    int rc;
    ctx->chained = 0;
    if (ctx->dev && (rc = dev_sync(ctx))) return rc;
    struct tllm_batch bt = batch_of(ctx, &id, 1, 1);
    ctx->step_out[0] = logits || argmax;
    if (ctx->dev) rc = ctx->dev->ops->step(ctx->dev, &bt, logits, argmax);
    else rc = cpu_step(ctx, &bt, logits, argmax);
    if (rc) return rc;
    ctx->pos++;
    if (ctx->dev) ctx->dev_valid = ctx->pos;
    return TLLM_OK;
}

int tllm_ctx_decode(struct tllm_ctx *ctx, int32_t id, float *logits) {
    if (ctx->n_ahead) return tllm_fail(TLLM_ERR_ARG, "%d greedy steps are still pushed (pop them first)", ctx->n_ahead);
    if (id < 0 || id >= ctx->m->cfg.vocab_size) return tllm_fail(TLLM_ERR_ARG, "token id %d is out of range [0, %d)", id, ctx->m->cfg.vocab_size);
    if (ctx->pos >= ctx->n_ctx) return tllm_fail(TLLM_ERR_LIMIT, "context full: %d tokens", ctx->pos);
    return one_token(ctx, id, logits, NULL);
}

int tllm_ctx_forward(struct tllm_ctx *ctx, const int32_t *ids, int n, float *logits,
                     enum tllm_logits_mode mode) {
    if (ctx->n_ahead) return tllm_fail(TLLM_ERR_ARG, "%d greedy steps are still pushed (pop them first)", ctx->n_ahead);
    const struct tllm_config *c = &ctx->m->cfg;
    ctx->chained = 0;
    if (n <= 0) return tllm_fail(TLLM_ERR_ARG, "no tokens to process");
    if (n > ctx->n_ctx - ctx->pos)
        return tllm_fail(TLLM_ERR_LIMIT, "context full: %d tokens in the cache + %d new > %d",
                         ctx->pos, n, ctx->n_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return tllm_fail(TLLM_ERR_ARG, "token id %d is out of range [0, %d)", ids[i],
                             c->vocab_size);
    if (ctx->dev && n == 1 && mode != TLLM_LOGITS_ALL) /* a decode step */
        return one_token(ctx, ids[0], mode == TLLM_LOGITS_LAST ? logits : NULL, NULL);
    int on_dev = ctx->dev && ctx->dev_prefill;
    int rc = on_dev ? dev_sync(ctx) : host_sync(ctx);
    if (rc) return rc;
    for (int done = 0; done < n;) {
        int step = n - done < ctx->n_batch ? n - done : ctx->n_batch;
        int last_step = done + step == n;
        float *out = NULL;
        enum tllm_logits_mode smode = TLLM_LOGITS_NONE;
        if (mode == TLLM_LOGITS_ALL) {
            smode = TLLM_LOGITS_ALL;
            out = logits + (size_t)done * c->vocab_size;
        } else if (mode == TLLM_LOGITS_LAST && last_step) {
            smode = TLLM_LOGITS_LAST;
            out = logits;
        }
        struct tllm_batch b = batch_of(ctx, ids + done, step, 0);
        for (int t = 0; t < step; t++)
            ctx->step_out[t] = smode == TLLM_LOGITS_ALL || (smode == TLLM_LOGITS_LAST && t == step - 1);
        if (on_dev) rc = ctx->dev->ops->step(ctx->dev, &b, out, NULL); /* the host's cache catches up in host_sync */
        else rc = cpu_step(ctx, &b, out, NULL);
        if (rc) return rc;
        ctx->pos += step;
        if (on_dev) ctx->dev_valid = ctx->pos;
        done += step;
    }
    return TLLM_OK;
}

int tllm_ctx_decode_argmax(struct tllm_ctx *ctx, int32_t id, int32_t *next) {
    if (id < 0) return tllm_fail(TLLM_ERR_ARG, "token id %d is out of range [0, %d)", id, ctx->m->cfg.vocab_size);
    if (ctx->n_ahead) return tllm_fail(TLLM_ERR_ARG, "%d greedy steps are still pushed (pop them first)", ctx->n_ahead);
    int rc = tllm_ctx_greedy_push(ctx, id);
    return rc ? rc : tllm_ctx_greedy_pop(ctx, next);
}

int tllm_ctx_greedy_push(struct tllm_ctx *ctx, int32_t id) {
    const struct tllm_config *c = &ctx->m->cfg;
    if (id >= c->vocab_size) return tllm_fail(TLLM_ERR_ARG, "token id %d is out of range [0, %d)", id, c->vocab_size);
    if (id < 0 && !ctx->chained) return tllm_fail(TLLM_ERR_ARG, "no greedy step just before this one to take the token from");
    if (ctx->pos >= ctx->n_ctx) return tllm_fail(TLLM_ERR_LIMIT, "context full: %d tokens", ctx->pos);
    if (ctx->n_ahead == TLLM_GREEDY_AHEAD) return tllm_fail(TLLM_ERR_LIMIT, "%d greedy steps pushed already", ctx->n_ahead);
    int rc;
    if (ctx->dev && ctx->dev->ops->step_enqueue) {
        if ((rc = dev_sync(ctx))) return rc;
        struct tllm_batch b = batch_of(ctx, &id, 1, 1);
        ctx->step_out[0] = 1;
        if ((rc = ctx->dev->ops->step_enqueue(ctx->dev, &b))) return rc;
        ctx->dev_valid = ++ctx->pos;
        ctx->n_ahead++;
        ctx->chained = 1;
        return TLLM_OK;
    }
    if (id < 0) id = ctx->last_argmax;
    int32_t best;
    if ((rc = one_token(ctx, id, NULL, &best))) return rc;
    ctx->ahead[(ctx->ahead_head + ctx->n_ahead++) % TLLM_GREEDY_AHEAD] = ctx->last_argmax = best;
    ctx->chained = 1;
    return TLLM_OK;
}

int tllm_ctx_queues_ahead(const struct tllm_ctx *ctx) { return ctx->dev && ctx->dev->ops->step_enqueue; }

int tllm_ctx_greedy_pop(struct tllm_ctx *ctx, int32_t *next) {
    if (!ctx->n_ahead) return tllm_fail(TLLM_ERR_ARG, "no greedy step pushed");
    ctx->n_ahead--;
    if (ctx->dev && ctx->dev->ops->step_enqueue) {
        int rc = ctx->dev->ops->step_wait(ctx->dev, next);
        ctx->n_ahead = ctx->dev->ops->pending(ctx->dev); /* after a failure the device forgets the rest */
        return rc;
    }
    *next = ctx->ahead[ctx->ahead_head];
    ctx->ahead_head = (ctx->ahead_head + 1) % TLLM_GREEDY_AHEAD;
    return TLLM_OK;
}
