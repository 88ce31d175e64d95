/* The CPU backend: the Qwen2 forward pass on the thread pool, and the host's KV cache. Prefill and
 * decode are the same code: a step processes n tokens at once (n = 1 for decode), so every weight is
 * read once per step whatever n is. */
#include "engine/backend/backend.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/error.h"
#include "engine/base/threadpool.h"
#include "engine/load/model.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qpack.h"

#define ATT_QUERY_BLOCK 16     /* queries per attention task: heads x query blocks are shared out */
#define LINEAR_PREFILL_CHUNK 4 /* row blocks per grab in multi-token steps */
#define LINEAR_DECODE_SPLIT 1  /* runs per thread in one-token steps: long runs keep the prefetcher streaming */

struct tllm_cpu {
    struct tllm_backend base;
    const struct tllm_model *m;
    int n_ctx;          /* KV cache capacity in tokens */
    int n_batch;        /* most tokens one step handles */
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
    int n_scratch;      /* threads in the pool when the backend was made */
    float *rope_cos;    /* [n_batch x head_dim/2] */
    float *rope_sin;    /* [n_batch x head_dim/2] */
    /* int8 copy of the current matmul input, for packed weights (kernels/cpu/qpack.h) */
    int8_t *xq;         /* [n_batch x max_cols] */
    int8_t *xq2;        /* [TLLM_XQ_L2_MAX_TOKENS x max_cols] second level for decode steps */
    float *xq_d;        /* [n_batch x max_cols/32] */
    float *xq_sum;      /* [n_batch x max_cols/32] */
    float *logits;      /* [n_logits x vocab], for steps that ask for argmax ids */
    int n_logits;
};

/* The input of one or more matmuls (q/k/v share one, gate/up another): n rows of cols floats, and
 * their int8 form once a packed weight has asked for it. */
struct act {
    const float *x; /* [n x cols] */
    int n, cols;
    struct tllm_xq q;
    int quantized;
};

static struct act act_of(struct tllm_cpu *cpu, const float *x, int n, int cols) {
    int8_t *q2 = n <= TLLM_XQ_L2_MAX_TOKENS ? cpu->xq2 : NULL;
    struct act a = {x, n, cols, {n, cols, cpu->xq, q2, cpu->xq_d, cpu->xq_sum}, 0};
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
    struct tllm_cpu *cpu;
    int l, pos0, n;
};

/* Causal GQA attention for n new tokens at positions pos0.., whose K/V are already in the cache.
 * Tasks are (head, block of queries), dealt round-robin so the causal triangle's cost evens out. */
static void attention_task(void *arg, int ith, int nth) {
    const struct attn_args *a = arg;
    struct tllm_cpu *cpu = a->cpu;
    if (ith >= cpu->n_scratch) return;
    if (nth > cpu->n_scratch) nth = cpu->n_scratch;
    const struct tllm_config *c = &cpu->m->cfg;
    int hd = c->head_dim, kv_dim = c->n_kv_heads * hd, q_dim = c->n_heads * hd;
    int group = c->n_heads / c->n_kv_heads, blocks = (a->n + ATT_QUERY_BLOCK - 1) / ATT_QUERY_BLOCK;
    float *s = cpu->scores + (size_t)ith * ATT_QUERY_BLOCK * cpu->n_ctx;
    for (int task = ith; task < c->n_heads * blocks; task += nth) {
        int h = task % c->n_heads, t0 = task / c->n_heads * ATT_QUERY_BLOCK;
        int nq = a->n - t0 < ATT_QUERY_BLOCK ? a->n - t0 : ATT_QUERY_BLOCK;
        const float *kt = cpu->key_cache + ((size_t)a->l * c->n_kv_heads + (size_t)(h / group)) * hd * cpu->n_ctx;
        const float *vc = cpu->value_cache + (size_t)a->l * cpu->n_ctx * kv_dim + (size_t)(h / group) * hd;
        tllm_attention(cpu->q + (size_t)t0 * q_dim + (size_t)h * hd, (size_t)q_dim, nq, a->pos0 + t0, kt,
                       (size_t)cpu->n_ctx, vc, (size_t)kv_dim, hd, s, cpu->att_out + (size_t)t0 * q_dim + (size_t)h * hd,
                       (size_t)q_dim);
    }
}

static void attention(struct tllm_cpu *cpu, int l, int pos0, int n) {
    struct attn_args a = {cpu, l, pos0, n};
    tllm_parallel(attention_task, &a);
}

/* One step of n <= n_batch tokens of one sequence at positions pos0 .. pos0 + n - 1; the final norm
 * and the lm_head for the n_out tokens that `out` marks, their logits in order into `logits`. */
static void forward_step(struct tllm_cpu *cpu, const int32_t *ids, int n, int pos0, const int8_t *out, int n_out,
                         float *logits) {
    const struct tllm_model *m = cpu->m;
    const struct tllm_config *c = &m->cfg;
    int dim = c->dim, hd = c->head_dim, half = hd / 2;
    int q_dim = c->n_heads * hd, kv_dim = c->n_kv_heads * hd;

    for (int t = 0; t < n; t++) {
        tllm_qw_dequant_row(&m->embed, ids[t], cpu->x + (size_t)t * dim);
        tllm_rope_tables(pos0 + t, hd, c->rope_theta, cpu->rope_cos + (size_t)t * half,
                         cpu->rope_sin + (size_t)t * half);
    }

    for (int l = 0; l < c->n_layers; l++) {
        const struct tllm_layer *L = &m->layers[l];
        /* attention block */
        for (int t = 0; t < n; t++)
            tllm_rmsnorm(cpu->xb + (size_t)t * dim, cpu->x + (size_t)t * dim, L->attn_norm, dim,
                         c->norm_eps);
        struct act a = act_of(cpu, cpu->xb, n, dim);
        linear(&L->wq, &a, cpu->q);
        linear(&L->wk, &a, cpu->k);
        linear(&L->wv, &a, cpu->v);
        add_bias(cpu->q, L->bq, n, q_dim);
        add_bias(cpu->k, L->bk, n, kv_dim);
        add_bias(cpu->v, L->bv, n, kv_dim);
        float *kt = cpu->key_cache + (size_t)l * cpu->n_ctx * kv_dim;
        float *vc = cpu->value_cache + ((size_t)l * cpu->n_ctx + pos0) * kv_dim;
        for (int t = 0; t < n; t++) {
            const float *ct = cpu->rope_cos + (size_t)t * half, *st = cpu->rope_sin + (size_t)t * half;
            tllm_rope(cpu->q + (size_t)t * q_dim, c->n_heads, hd, ct, st);
            tllm_rope(cpu->k + (size_t)t * kv_dim, c->n_kv_heads, hd, ct, st);
        }
        for (int t = 0; t < n; t++) /* keys go in transposed: [kv_head][head_dim][position] */
            for (int j = 0; j < kv_dim; j++) kt[(size_t)j * cpu->n_ctx + pos0 + t] = cpu->k[(size_t)t * kv_dim + j];
        memcpy(vc, cpu->v, (size_t)n * kv_dim * sizeof(float));
        attention(cpu, l, pos0, n);
        a = act_of(cpu, cpu->att_out, n, q_dim);
        linear(&L->wo, &a, cpu->proj);
        for (size_t i = 0; i < (size_t)n * dim; i++) cpu->x[i] += cpu->proj[i];

        /* MLP block */
        for (int t = 0; t < n; t++)
            tllm_rmsnorm(cpu->xb + (size_t)t * dim, cpu->x + (size_t)t * dim, L->ffn_norm, dim,
                         c->norm_eps);
        a = act_of(cpu, cpu->xb, n, dim);
        linear(&L->w_gate, &a, cpu->hb);
        linear(&L->w_up, &a, cpu->hb2);
        struct swiglu_args sw = {cpu->hb, cpu->hb2, (size_t)n * c->ffn_dim};
        if (n > 1) tllm_parallel(swiglu_task, &sw);
        else swiglu_task(&sw, 0, 1);
        a = act_of(cpu, cpu->hb, n, c->ffn_dim);
        linear(&L->w_down, &a, cpu->proj);
        for (size_t i = 0; i < (size_t)n * dim; i++) cpu->x[i] += cpu->proj[i];
    }

    if (n_out == 0) return;
    for (int t = 0, j = 0; t < n; t++) /* the wanted tokens' rows, packed */
        if (out[t]) tllm_rmsnorm(cpu->xb + (size_t)j++ * dim, cpu->x + (size_t)t * dim, m->final_norm, dim, c->norm_eps);
    struct act a = act_of(cpu, cpu->xb, n_out, dim);
    linear(&m->lm_head, &a, logits);
}


/* Today one sequence at consecutive positions a step (the batch's shape is ready for more). */
static int check_batch(const struct tllm_cpu *cpu, const struct tllm_batch *bt, int *n_out) {
    if (bt->n <= 0 || bt->n > cpu->n_batch)
        return tllm_fail(TLLM_ERR_ARG, "a CPU step of %d tokens (1 to %d)", bt->n, cpu->n_batch);
    if (bt->pos[0] < 0 || bt->pos[0] + bt->n > cpu->n_ctx)
        return tllm_fail(TLLM_ERR_LIMIT, "context full: positions %d to %d past %d", bt->pos[0], bt->pos[0] + bt->n - 1, cpu->n_ctx);
    *n_out = 0;
    for (int t = 0; t < bt->n; t++) {
        if (bt->pos[t] != bt->pos[0] + t || bt->seq[t] != bt->seq[0])
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "a CPU step takes one sequence at consecutive positions");
        if (bt->id[t] < 0 || bt->id[t] >= cpu->m->cfg.vocab_size)
            return tllm_fail(TLLM_ERR_ARG, "token id %d is out of range [0, %d)", bt->id[t], cpu->m->cfg.vocab_size);
        *n_out += bt->out && bt->out[t];
    }
    return TLLM_OK;
}

static int cpu_step(struct tllm_backend *b, const struct tllm_batch *bt, float *logits, int32_t *argmax) {
    struct tllm_cpu *cpu = (struct tllm_cpu *)b;
    int n_out, rc = check_batch(cpu, bt, &n_out);
    if (rc) return rc;
    int vocab = cpu->m->cfg.vocab_size;
    if (argmax && !logits && n_out > cpu->n_logits) {
        float *l = realloc(cpu->logits, (size_t)n_out * vocab * sizeof(float));
        if (!l) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        cpu->logits = l;
        cpu->n_logits = n_out;
    }
    float *out = logits ? logits : cpu->logits;
    forward_step(cpu, bt->id, bt->n, bt->pos[0], bt->out, n_out, out);
    if (argmax)
        for (int j = 0; j < n_out; j++) {
            const float *row = out + (size_t)j * vocab;
            int best = 0;
            for (int i = 1; i < cpu->m->n_sample; i++)
                if (row[i] > row[best]) best = i;
            argmax[j] = best;
        }
    return TLLM_OK;
}

static void cpu_describe(const struct tllm_backend *b, struct tllm_backend_info *info) {
    const struct tllm_cpu *cpu = (const struct tllm_cpu *)b;
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "CPU");
    info->int8 = cpu->m->n_packs > 0;
}

static void cpu_free(struct tllm_backend *b) {
    struct tllm_cpu *cpu = (struct tllm_cpu *)b;
    free(cpu->key_cache);
    free(cpu->value_cache);
    free(cpu->x);
    free(cpu->xb);
    free(cpu->q);
    free(cpu->k);
    free(cpu->v);
    free(cpu->att_out);
    free(cpu->proj);
    free(cpu->hb);
    free(cpu->hb2);
    free(cpu->scores);
    free(cpu->rope_cos);
    free(cpu->rope_sin);
    free(cpu->xq);
    free(cpu->xq2);
    free(cpu->xq_d);
    free(cpu->xq_sum);
    free(cpu->logits);
    free(cpu);
}

static const struct tllm_backend_ops cpu_ops = {
    .step = cpu_step,
    .describe = cpu_describe,
    .free = cpu_free,
};

int tllm_backend_cpu_init(struct tllm_backend **out, const struct tllm_model *m, int n_ctx, int n_batch,
                          struct tllm_kv_host *kv) {
    *out = NULL;
    struct tllm_cpu *cpu = calloc(1, sizeof *cpu);
    if (!cpu) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    const struct tllm_config *c = &m->cfg;
    cpu->base.ops = &cpu_ops;
    cpu->m = m;
    cpu->n_ctx = n_ctx;
    cpu->n_batch = n_batch;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t nb = (size_t)n_batch, half = (size_t)c->head_dim / 2;
    size_t cache = (size_t)c->n_layers * (size_t)n_ctx * kv_dim;
    cpu->key_cache = malloc(cache * sizeof(float));
    cpu->value_cache = malloc(cache * sizeof(float));
    cpu->x = malloc(nb * c->dim * sizeof(float));
    cpu->xb = malloc(nb * c->dim * sizeof(float));
    cpu->q = malloc(nb * q_dim * sizeof(float));
    cpu->k = malloc(nb * kv_dim * sizeof(float));
    cpu->v = malloc(nb * kv_dim * sizeof(float));
    cpu->att_out = malloc(nb * q_dim * sizeof(float));
    cpu->proj = malloc(nb * c->dim * sizeof(float));
    cpu->hb = malloc(nb * c->ffn_dim * sizeof(float));
    cpu->hb2 = malloc(nb * c->ffn_dim * sizeof(float));
    cpu->n_scratch = tllm_threadpool_size();
    cpu->scores = malloc((size_t)cpu->n_scratch * ATT_QUERY_BLOCK * n_ctx * sizeof(float));
    cpu->rope_cos = malloc(nb * half * sizeof(float));
    cpu->rope_sin = malloc(nb * half * sizeof(float));
    size_t max_cols = (size_t)c->dim;
    if (q_dim > max_cols) max_cols = q_dim;
    if ((size_t)c->ffn_dim > max_cols) max_cols = (size_t)c->ffn_dim;
    cpu->xq = malloc(nb * max_cols);
    cpu->xq2 = malloc(TLLM_XQ_L2_MAX_TOKENS * max_cols);
    cpu->xq_d = malloc(nb * (max_cols / TLLM_XQ_BLOCK + 1) * sizeof(float));
    cpu->xq_sum = malloc(nb * (max_cols / TLLM_XQ_BLOCK + 1) * sizeof(float));
    if (!cpu->key_cache || !cpu->value_cache || !cpu->x || !cpu->xb || !cpu->q || !cpu->k ||
        !cpu->v || !cpu->att_out || !cpu->proj || !cpu->hb || !cpu->hb2 || !cpu->scores ||
        !cpu->rope_cos || !cpu->rope_sin || !cpu->xq || !cpu->xq2 || !cpu->xq_d || !cpu->xq_sum) {
        cpu_free(&cpu->base);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory for a context of %d tokens (KV cache %zu MiB)",
                         n_ctx, 2 * cache * sizeof(float) >> 20);
    }
    kv->key = cpu->key_cache;
    kv->value = cpu->value_cache;
    kv->n_ctx = n_ctx;
    *out = &cpu->base;
    return TLLM_OK;
}
