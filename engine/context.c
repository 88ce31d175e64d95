/* The Qwen2 forward pass. Prefill and decode are the same code: a step processes n tokens at
 * once (n = 1 for decode), so every weight is read once per step whatever n is. */
#include "context.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops.h"
#include "../kernels/qmatmul.h"
#include "../kernels/qpack.h"
#include "cl.h"
#include "error.h"
#include "threadpool.h"

#define ATT_QUERY_BLOCK 16     /* queries per attention task: heads x query blocks are shared out */
#define LINEAR_PREFILL_CHUNK 4 /* row blocks per grab in multi-token steps */
#define LINEAR_DECODE_SPLIT 1  /* runs per thread in one-token steps: long runs keep the prefetcher streaming */

int tllm_ctx_init(struct tllm_ctx *ctx, const struct tllm_model *m, int n_ctx, int n_batch) {
    memset(ctx, 0, sizeof *ctx);
    const struct tllm_config *c = &m->cfg;
    if (n_ctx <= 0) n_ctx = c->max_pos;
    if (n_batch <= 0) n_batch = 512;
    if (n_batch > n_ctx) n_batch = n_ctx;
    ctx->m = m;
    ctx->n_ctx = n_ctx;
    ctx->n_batch = n_batch;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t nb = (size_t)n_batch, half = (size_t)c->head_dim / 2;
    size_t cache = (size_t)c->n_layers * (size_t)n_ctx * kv_dim;
    ctx->key_cache = malloc(cache * sizeof(float));
    ctx->value_cache = malloc(cache * sizeof(float));
    ctx->x = malloc(nb * c->dim * sizeof(float));
    ctx->xb = malloc(nb * c->dim * sizeof(float));
    ctx->q = malloc(nb * q_dim * sizeof(float));
    ctx->k = malloc(nb * kv_dim * sizeof(float));
    ctx->v = malloc(nb * kv_dim * sizeof(float));
    ctx->att_out = malloc(nb * q_dim * sizeof(float));
    ctx->proj = malloc(nb * c->dim * sizeof(float));
    ctx->hb = malloc(nb * c->ffn_dim * sizeof(float));
    ctx->hb2 = malloc(nb * c->ffn_dim * sizeof(float));
    ctx->n_scratch = tllm_threadpool_size();
    ctx->scores = malloc((size_t)ctx->n_scratch * ATT_QUERY_BLOCK * n_ctx * sizeof(float));
    ctx->rope_cos = malloc(nb * half * sizeof(float));
    ctx->rope_sin = malloc(nb * half * sizeof(float));
    size_t max_cols = (size_t)c->dim;
    if (q_dim > max_cols) max_cols = q_dim;
    if ((size_t)c->ffn_dim > max_cols) max_cols = (size_t)c->ffn_dim;
    ctx->xq = malloc(nb * max_cols);
    ctx->xq2 = malloc(TLLM_XQ_L2_MAX_TOKENS * max_cols);
    ctx->xq_d = malloc(nb * (max_cols / TLLM_XQ_BLOCK + 1) * sizeof(float));
    ctx->xq_sum = malloc(nb * (max_cols / TLLM_XQ_BLOCK + 1) * sizeof(float));
    if (!ctx->key_cache || !ctx->value_cache || !ctx->x || !ctx->xb || !ctx->q || !ctx->k ||
        !ctx->v || !ctx->att_out || !ctx->proj || !ctx->hb || !ctx->hb2 || !ctx->scores ||
        !ctx->rope_cos || !ctx->rope_sin || !ctx->xq || !ctx->xq2 || !ctx->xq_d || !ctx->xq_sum) {
        tllm_ctx_free(ctx);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory for a context of %d tokens (KV cache %zu MiB)",
                         n_ctx, 2 * cache * sizeof(float) >> 20);
    }
    return TLLM_OK;
}

void tllm_ctx_free(struct tllm_ctx *ctx) {
    free(ctx->key_cache);
    free(ctx->value_cache);
    free(ctx->x);
    free(ctx->xb);
    free(ctx->q);
    free(ctx->k);
    free(ctx->v);
    free(ctx->att_out);
    free(ctx->proj);
    free(ctx->hb);
    free(ctx->hb2);
    free(ctx->scores);
    free(ctx->rope_cos);
    free(ctx->rope_sin);
    free(ctx->xq);
    free(ctx->xq2);
    free(ctx->xq_d);
    free(ctx->xq_sum);
    free(ctx->logits_buf);
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
    ctx->pos = ctx->host_valid = ctx->dev_valid = 0;
}

void tllm_ctx_truncate(struct tllm_ctx *ctx, int pos) {
    drop_ahead(ctx);
    if (pos < 0 || pos >= ctx->pos) return;
    ctx->pos = pos;
    if (ctx->host_valid > pos) ctx->host_valid = pos;
    if (ctx->dev_valid > pos) ctx->dev_valid = pos;
}

void tllm_ctx_use_cl(struct tllm_ctx *ctx, struct tllm_cl *cl) {
    drop_ahead(ctx);
    ctx->cl = cl;
    ctx->dev_valid = 0;
}

/* One token on the device: first bring the device cache up to date with what the CPU computed. */
static int cl_decode(struct tllm_ctx *ctx, int32_t id, float *logits) {
    int rc;
    if (ctx->dev_valid < ctx->pos) {
        if ((rc = tllm_cl_kv_upload(ctx->cl, ctx->key_cache, ctx->value_cache, ctx->dev_valid, ctx->pos))) return rc;
        ctx->dev_valid = ctx->pos;
    }
    rc = tllm_cl_step(ctx->cl, id, ctx->pos, logits, NULL);
    if (rc) return rc;
    ctx->dev_valid = ++ctx->pos;
    return TLLM_OK;
}

/* The input of one or more matmuls (q/k/v share one, gate/up another): n rows of cols floats, and
 * their int8 form once a packed weight has asked for it. */
struct act {
    const float *x; /* [n x cols] */
    int n, cols;
    struct tllm_xq q;
    int quantized;
};

static struct act act_of(struct tllm_ctx *ctx, const float *x, int n, int cols) {
    int8_t *q2 = n <= TLLM_XQ_L2_MAX_TOKENS ? ctx->xq2 : NULL;
    struct act a = {x, n, cols, {n, cols, ctx->xq, q2, ctx->xq_d, ctx->xq_sum}, 0};
    return a;
}

struct linear_args {
    const struct tllm_qweights *w;
    struct act *a;
    float *y;
    int chunk;       /* row blocks per grab */
    atomic_int next; /* the next chunk not yet taken */
};

/* Threads take chunks of 16-row blocks from a shared counter rather than a fixed share: on a shared
 * or hybrid machine cores run at different speeds, and a fixed split waits for the slowest. Each
 * row's result does not depend on who computes it, so any thread count gives the same bits. */
static void linear_task(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    struct linear_args *la = arg;
    const int rows = la->w->rows, n_blocks = (rows + TLLM_QPACK_ROWS - 1) / TLLM_QPACK_ROWS;
    for (;;) {
        int b0 = atomic_fetch_add_explicit(&la->next, 1, memory_order_relaxed) * la->chunk;
        if (b0 >= n_blocks) return;
        int b1 = b0 + la->chunk < n_blocks ? b0 + la->chunk : n_blocks;
        if (la->w->pack)
            tllm_qpack_matmul(la->w->pack, &la->a->q, la->y, b0, b1);
        else
            tllm_qmatmul(la->w, la->a->x, la->a->n, la->y, b0 * TLLM_QPACK_ROWS,
                         b1 * TLLM_QPACK_ROWS < rows ? b1 * TLLM_QPACK_ROWS : rows);
    }
}

static void quantize_task(void *arg, int ith, int nth) {
    struct act *a = arg;
    int per = (a->n + nth - 1) / nth, t0 = ith * per, t1 = t0 + per < a->n ? t0 + per : a->n;
    if (t0 < t1) tllm_xq_quantize(&a->q, a->x, t0, t1);
}

/* y[n x rows] = x[n x cols] . W^T, rows split over the thread pool. */
static void linear(const struct tllm_qweights *w, struct act *a, float *y) {
    if (w->pack && !a->quantized) {
        if (a->n >= 4) tllm_parallel(quantize_task, a);
        else tllm_xq_quantize(&a->q, a->x, 0, a->n);
        a->quantized = 1;
    }
    int n_blocks = (w->rows + TLLM_QPACK_ROWS - 1) / TLLM_QPACK_ROWS, nth = tllm_threadpool_size();
    int chunk = a->n > 1 ? LINEAR_PREFILL_CHUNK : (n_blocks + nth * LINEAR_DECODE_SPLIT - 1) / (nth * LINEAR_DECODE_SPLIT);
    struct linear_args la = {w, a, y, chunk > 0 ? chunk : 1, 0};
    tllm_parallel(linear_task, &la);
}

static void add_bias(float *y, const float *b, int n, int dim) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
}

struct swiglu_args {
    float *gate;
    const float *up;
    size_t n;
};

static void swiglu_task(void *arg, int ith, int nth) {
    const struct swiglu_args *a = arg;
    size_t per = (a->n + (size_t)nth - 1) / (size_t)nth;
    per = (per + 15) / 16 * 16; /* whole vectors, and whole cache lines of each thread's range */
    size_t i0 = (size_t)ith * per, i1 = i0 + per < a->n ? i0 + per : a->n;
    if (i0 < i1) tllm_swiglu(a->gate + i0, a->up + i0, (int)(i1 - i0));
}

struct attn_args {
    struct tllm_ctx *ctx;
    int l, pos0, n;
};

/* Causal GQA attention for n new tokens at positions pos0.., whose K/V are already in the cache.
 * Tasks are (head, block of queries), dealt round-robin so the causal triangle's cost evens out. */
static void attention_task(void *arg, int ith, int nth) {
    const struct attn_args *a = arg;
    struct tllm_ctx *ctx = a->ctx;
    if (ith >= ctx->n_scratch) return;
    if (nth > ctx->n_scratch) nth = ctx->n_scratch;
    const struct tllm_config *c = &ctx->m->cfg;
    int hd = c->head_dim, kv_dim = c->n_kv_heads * hd, q_dim = c->n_heads * hd;
    int group = c->n_heads / c->n_kv_heads, blocks = (a->n + ATT_QUERY_BLOCK - 1) / ATT_QUERY_BLOCK;
    float *s = ctx->scores + (size_t)ith * ATT_QUERY_BLOCK * ctx->n_ctx;
    for (int task = ith; task < c->n_heads * blocks; task += nth) {
        int h = task % c->n_heads, t0 = task / c->n_heads * ATT_QUERY_BLOCK;
        int nq = a->n - t0 < ATT_QUERY_BLOCK ? a->n - t0 : ATT_QUERY_BLOCK;
        const float *kt = ctx->key_cache + ((size_t)a->l * c->n_kv_heads + (size_t)(h / group)) * hd * ctx->n_ctx;
        const float *vc = ctx->value_cache + (size_t)a->l * ctx->n_ctx * kv_dim + (size_t)(h / group) * hd;
        tllm_attention(ctx->q + (size_t)t0 * q_dim + (size_t)h * hd, (size_t)q_dim, nq, a->pos0 + t0, kt,
                       (size_t)ctx->n_ctx, vc, (size_t)kv_dim, hd, s, ctx->att_out + (size_t)t0 * q_dim + (size_t)h * hd,
                       (size_t)q_dim);
    }
}

static void attention(struct tllm_ctx *ctx, int l, int pos0, int n) {
    struct attn_args a = {ctx, l, pos0, n};
    tllm_parallel(attention_task, &a);
}

/* One step of n <= n_batch tokens. */
static void forward_step(struct tllm_ctx *ctx, const int32_t *ids, int n, float *logits,
                         enum tllm_logits_mode mode) {
    const struct tllm_model *m = ctx->m;
    const struct tllm_config *c = &m->cfg;
    int dim = c->dim, hd = c->head_dim, half = hd / 2;
    int q_dim = c->n_heads * hd, kv_dim = c->n_kv_heads * hd;
    int pos0 = ctx->pos;

    for (int t = 0; t < n; t++) {
        tllm_qw_dequant_row(&m->embed, ids[t], ctx->x + (size_t)t * dim);
        tllm_rope_tables(pos0 + t, hd, c->rope_theta, ctx->rope_cos + (size_t)t * half,
                         ctx->rope_sin + (size_t)t * half);
    }

    for (int l = 0; l < c->n_layers; l++) {
        const struct tllm_layer *L = &m->layers[l];
        /* attention block */
        for (int t = 0; t < n; t++)
            tllm_rmsnorm(ctx->xb + (size_t)t * dim, ctx->x + (size_t)t * dim, L->attn_norm, dim,
                         c->norm_eps);
        struct act a = act_of(ctx, ctx->xb, n, dim);
        linear(&L->wq, &a, ctx->q);
        linear(&L->wk, &a, ctx->k);
        linear(&L->wv, &a, ctx->v);
        add_bias(ctx->q, L->bq, n, q_dim);
        add_bias(ctx->k, L->bk, n, kv_dim);
        add_bias(ctx->v, L->bv, n, kv_dim);
        float *kt = ctx->key_cache + (size_t)l * ctx->n_ctx * kv_dim;
        float *vc = ctx->value_cache + ((size_t)l * ctx->n_ctx + pos0) * kv_dim;
        for (int t = 0; t < n; t++) {
            const float *ct = ctx->rope_cos + (size_t)t * half, *st = ctx->rope_sin + (size_t)t * half;
            tllm_rope(ctx->q + (size_t)t * q_dim, c->n_heads, hd, ct, st);
            tllm_rope(ctx->k + (size_t)t * kv_dim, c->n_kv_heads, hd, ct, st);
        }
        for (int t = 0; t < n; t++) /* keys go in transposed: [kv_head][head_dim][position] */
            for (int j = 0; j < kv_dim; j++) kt[(size_t)j * ctx->n_ctx + pos0 + t] = ctx->k[(size_t)t * kv_dim + j];
        memcpy(vc, ctx->v, (size_t)n * kv_dim * sizeof(float));
        attention(ctx, l, pos0, n);
        a = act_of(ctx, ctx->att_out, n, q_dim);
        linear(&L->wo, &a, ctx->proj);
        for (size_t i = 0; i < (size_t)n * dim; i++) ctx->x[i] += ctx->proj[i];

        /* MLP block */
        for (int t = 0; t < n; t++)
            tllm_rmsnorm(ctx->xb + (size_t)t * dim, ctx->x + (size_t)t * dim, L->ffn_norm, dim,
                         c->norm_eps);
        a = act_of(ctx, ctx->xb, n, dim);
        linear(&L->w_gate, &a, ctx->hb);
        linear(&L->w_up, &a, ctx->hb2);
        struct swiglu_args sw = {ctx->hb, ctx->hb2, (size_t)n * c->ffn_dim};
        if (n > 1) tllm_parallel(swiglu_task, &sw);
        else swiglu_task(&sw, 0, 1);
        a = act_of(ctx, ctx->hb, n, c->ffn_dim);
        linear(&L->w_down, &a, ctx->proj);
        for (size_t i = 0; i < (size_t)n * dim; i++) ctx->x[i] += ctx->proj[i];
    }
    ctx->pos += n;

    if (mode == TLLM_LOGITS_NONE) return;
    int first = mode == TLLM_LOGITS_LAST ? n - 1 : 0;
    for (int t = first; t < n; t++)
        tllm_rmsnorm(ctx->xb + (size_t)t * dim, ctx->x + (size_t)t * dim, m->final_norm, dim,
                     c->norm_eps);
    struct act a = act_of(ctx, ctx->xb + (size_t)first * dim, n - first, dim);
    linear(&m->lm_head, &a, logits);
}

static int forward_ids(struct tllm_ctx *ctx, const int32_t *ids, int n, float *logits, enum tllm_logits_mode mode);

int tllm_ctx_forward(struct tllm_ctx *ctx, const int32_t *ids, int n, float *logits,
                     enum tllm_logits_mode mode) {
    if (ctx->n_ahead) return tllm_fail(TLLM_ERR_ARG, "%d greedy steps are still pushed (pop them first)", ctx->n_ahead);
    return forward_ids(ctx, ids, n, logits, mode);
}

/* tllm_ctx_forward, which CPU greedy steps also use while earlier ones wait to be popped */
static int forward_ids(struct tllm_ctx *ctx, const int32_t *ids, int n, float *logits, enum tllm_logits_mode mode) {
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
    if (ctx->cl && n == 1 && mode != TLLM_LOGITS_ALL)
        return cl_decode(ctx, ids[0], mode == TLLM_LOGITS_LAST ? logits : NULL);
    if (ctx->cl && ctx->host_valid < ctx->pos) { /* positions the device decoded: the CPU needs them now */
        int rc = tllm_cl_kv_download(ctx->cl, ctx->key_cache, ctx->value_cache, ctx->host_valid, ctx->pos);
        if (rc) return rc;
        ctx->host_valid = ctx->pos;
    }
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
        forward_step(ctx, ids + done, step, out, smode);
        done += step;
    }
    ctx->host_valid = ctx->pos;
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
    if (ctx->cl) {
        if (ctx->dev_valid < ctx->pos &&
            (rc = tllm_cl_kv_upload(ctx->cl, ctx->key_cache, ctx->value_cache, ctx->dev_valid, ctx->pos)))
            return rc;
        if ((rc = tllm_cl_step_enqueue(ctx->cl, id, ctx->pos))) return rc;
        ctx->dev_valid = ++ctx->pos;
        ctx->n_ahead++;
        ctx->chained = 1;
        return TLLM_OK;
    }
    if (id < 0) id = ctx->last_argmax;
    if (!ctx->logits_buf && !(ctx->logits_buf = malloc((size_t)c->vocab_size * sizeof(float))))
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    if ((rc = forward_ids(ctx, &id, 1, ctx->logits_buf, TLLM_LOGITS_LAST))) return rc;
    int best = 0;
    for (int i = 1; i < c->vocab_size; i++)
        if (ctx->logits_buf[i] > ctx->logits_buf[best]) best = i;
    ctx->ahead[(ctx->ahead_head + ctx->n_ahead++) % TLLM_GREEDY_AHEAD] = ctx->last_argmax = best;
    ctx->chained = 1;
    return TLLM_OK;
}

int tllm_ctx_greedy_pop(struct tllm_ctx *ctx, int32_t *next) {
    if (!ctx->n_ahead) return tllm_fail(TLLM_ERR_ARG, "no greedy step pushed");
    ctx->n_ahead--;
    if (ctx->cl) {
        int rc = tllm_cl_step_wait(ctx->cl, next);
        ctx->n_ahead = tllm_cl_pending(ctx->cl); /* after a failure the device forgets the rest */
        return rc;
    }
    *next = ctx->ahead[ctx->ahead_head];
    ctx->ahead_head = (ctx->ahead_head + 1) % TLLM_GREEDY_AHEAD;
    return TLLM_OK;
}
