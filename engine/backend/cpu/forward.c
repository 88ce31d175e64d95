/* The CPU backend: the Qwen2 forward pass on the thread pool, over the shared paged KV cache
 * (engine/run/kv_cache.h). Prefill and decode are the same code: a step processes n tokens of any
 * sequences at once (prefill chunks and generated tokens mixed), so every weight is read once per step
 * whatever n is; attention runs per sequence over that sequence's blocks. */
#include "engine/backend/backend.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "engine/load/model.h"
#include "engine/run/kv_cache.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qpack.h"

#define ATT_QUERY_BLOCK 16     /* queries per attention task: (sequence, KV head, query block) tasks are shared out */
#define LINEAR_PREFILL_CHUNK 4 /* row blocks per grab in multi-token steps, at least */
#define LINEAR_MANY_SPLIT 4    /* grabs per thread, where a weight's tokens are split too */
#define LINEAR_GUIDED 2        /* in multi-token steps a grab takes 1 / (LINEAR_GUIDED x threads) of the row
                                * blocks left: long runs first keep the hardware prefetcher streaming (the
                                * weights come from memory every step; grabs of 4 blocks taken in turn cost a
                                * 16-sequence decode step 1.2x in its lm_head), short ones at the end even
                                * the threads out at the barrier (fixed grabs of an eighth of a weight left
                                * one thread waiting 1.6% of a 16-sequence decode step, VM) */
#define LINEAR_PART_TOKENS 32  /* tokens a range at least, where a long step's matmul splits its tokens
                                * (two AMX token tiles; 4 AVX-512 ones) */
#define TOKEN_TASK_MIN 8       /* tokens a step needs before its per-token work goes to the pool */
#define LINEAR_DECODE_SPLIT 1  /* runs per thread in one-token steps: long runs keep the prefetcher streaming */

/* A stretch of a step's tokens that belong to one sequence, at consecutive positions */
struct run {
    int seq, t0, n, pos0;
};

/* Attention work: queries [q0, q0 + nq) of a run, for the query heads of one KV head */
struct att_task {
    int run, kvh, q0, nq;
};

struct tllm_cpu {
    struct tllm_backend base;
    const struct tllm_model *m;
    struct tllm_kv *kv; /* the paged cache every sequence of a step is in (not owned) */
    int max_len;        /* positions one sequence can have: the cache's capacity */
    int n_batch;        /* most tokens one step handles */
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
    int n_scratch;      /* threads in the pool when the backend was made */
    float *scores;      /* [n_scratch x 16 x max_len] attention scores, a block of query rows per thread */
    float *gather;      /* [n_scratch x 2 x head_dim x max_len] a KV head's keys (transposed) and values, float32 and
                         * contiguous, for the portable attention kernel (NULL where the AVX-512 one reads the blocks) */
    const void **kv_blocks; /* [n_scratch x 2 x max_len/16 + 1] a sequence's blocks of one KV head, keys then values, for
                             * the AVX-512 kernel that reads them in place (NULL without it) */
    float *rope_cos;    /* [n_batch x head_dim/2] */
    float *rope_sin;    /* [n_batch x head_dim/2] */
    /* int8 copy of the current matmul input, for packed weights (kernels/cpu/qpack.h) */
    int8_t *xq;         /* [n_batch x max_cols] */
    int8_t *xq2;        /* [n_batch x max_cols] second level, for generated tokens */
    float *xq_d;        /* [n_batch x max_cols/32] */
    float *xq_sum;      /* [n_batch x max_cols/32] */
    float *xq_sum16;    /* [n_batch x max_cols/16] half-block sums, for nvfp4's packs (groups of 16), or NULL */
    float *xperm;       /* [n_batch x max_cols] a matmul input in a weight's column order (GPTQ act-order), or NULL */
    float *logits;      /* [n_logits x vocab], for steps that ask for argmax ids */
    int n_logits;
    /* the current step */
    const struct tllm_batch *bt;
    struct run *runs;   /* [n_batch] */
    int n_runs;
    struct att_task *tasks; /* [n_batch x n_kv_heads] */
    int n_tasks;
};

/* The input of one or more matmuls (q/k/v share one, gate/up another): n rows of cols floats, and
 * their int8 form once a packed weight has asked for it. */
struct act {
    const float *x; /* [n x cols] */
    int n, cols;
    int n_gen;      /* the first n_gen tokens are generated ones (tllm_batch.n_gen) */
    struct tllm_xq q;
    int quantized;
    float *perm_buf; /* room for x in a permuted column order (tllm_qweights.perm) */
};

static struct act act_of(struct tllm_cpu *cpu, const float *x, int n, int cols, int n_gen) {
    int n2 = cpu->m->decode_levels == 1 ? 0 : n_gen;
    struct act a = {x, n, cols, n_gen, {n, cols, cpu->xq, cpu->xq2, cpu->xq_d, cpu->xq_sum, n2, cpu->xq_sum16}, 0, cpu->xperm};
    return a;
}

#define LINEAR_MAX_W 3 /* weights that share one input and one dispatch (q/k/v; gate/up) */

struct linear_args {
    int nw;
    const struct tllm_qweights *w[LINEAR_MAX_W];
    float *y[LINEAR_MAX_W];
    int chunk[LINEAR_MAX_W];   /* row blocks per unit of work, per weight */
    int parts[LINEAR_MAX_W];   /* token ranges per row chunk, per weight (packed weights, long steps) */
    int part_tokens[LINEAR_MAX_W]; /* tokens a range */
    int first[LINEAR_MAX_W + 1]; /* the weights' units, numbered one after another */
    struct act *a;
    atomic_int next;           /* the next unit not yet taken */
};

/* Threads take chunks of 16-row blocks from a shared counter rather than a fixed share: on a shared
 * or hybrid machine cores run at different speeds, and a fixed split waits for the slowest. Each
 * row's result does not depend on who computes it, so any thread count gives the same bits. */
static void linear_task(void *arg, int ith, int nth) {
    (void)ith;
    struct linear_args *la = arg;
    const int total = la->first[la->nw];
    for (;;) {
        /* units [c, e) of weight i: one unit, or (a step of many tokens, a weight not split by tokens) a
         * share of those left (LINEAR_GUIDED) */
        int c = atomic_load_explicit(&la->next, memory_order_relaxed), e, i;
        do {
            if (c >= total) return;
            for (i = 0; c >= la->first[i + 1]; i++) continue;
            e = c + 1;
            if (la->a->n > 1 && la->parts[i] == 1) {
                int share = (total - c) / (LINEAR_GUIDED * nth);
                e = share > 1 ? c + share : c + 1;
                e = e < la->first[i + 1] ? e : la->first[i + 1];
            }
        } while (!atomic_compare_exchange_weak_explicit(&la->next, &c, e, memory_order_relaxed, memory_order_relaxed));
        const struct tllm_qweights *w = la->w[i];
        const int rows = w->rows, n_blocks = (rows + TLLM_QPACK_ROWS - 1) / TLLM_QPACK_ROWS;
        const int k = c - la->first[i], part = k % la->parts[i], units = e - c;
        int b0 = k / la->parts[i] * la->chunk[i], b1 = b0 + units * la->chunk[i] < n_blocks ? b0 + units * la->chunk[i] : n_blocks;
        if (w->pack) { /* its token range (all the step's where the weight is not split by tokens) */
            int t0 = part * la->part_tokens[i], t1 = t0 + la->part_tokens[i] < la->a->n ? t0 + la->part_tokens[i] : la->a->n;
            struct tllm_xq v = tllm_xq_view(&la->a->q, t0, t1);
            tllm_qpack_matmul(w->pack, &v, la->y[i] + (size_t)t0 * rows, b0, b1);
            continue;
        }
        /* float activations: a generated token through the one-token kernel, prompt tokens through the
         * multi-token one, whatever the step's size (each sums in its own order) */
        const struct act *a = la->a;
        int r0 = b0 * TLLM_QPACK_ROWS, r1 = b1 * TLLM_QPACK_ROWS < rows ? b1 * TLLM_QPACK_ROWS : rows;
        for (int t = 0; t < a->n_gen; t++)
            tllm_qmatmul(w, a->x + (size_t)t * a->cols, 1, la->y[i] + (size_t)t * rows, r0, r1);
        if (a->n > a->n_gen)
            tllm_qmatmul_tiled(w, a->x + (size_t)a->n_gen * a->cols, a->n - a->n_gen,
                               la->y[i] + (size_t)a->n_gen * rows, r0, r1);
    }
}

static int packed_all(int nw, const struct tllm_qweights *const *w) {
    for (int i = 0; i < nw; i++)
        if (!w[i]->pack) return 0;
    return 1;
}

static void quantize_task(void *arg, int ith, int nth) {
    struct act *a = arg;
    int per = (a->n + nth - 1) / nth, t0 = ith * per, t1 = t0 + per < a->n ? t0 + per : a->n;
    if (t0 < t1) tllm_xq_quantize(&a->q, a->x, t0, t1);
}

/* y_i[n x rows_i] = x[n x cols] . W_i^T for nw weights of one input, their rows split over the thread
 * pool in one dispatch (each dispatch ends in a barrier, which a decode step pays per matmul). */
static void linears_plain(struct act *a, int nw, const struct tllm_qweights *const *w, float *const *y) {
    int packed = 0;
    for (int i = 0; i < nw; i++) packed |= w[i]->pack != NULL;
    if (packed && !a->quantized) {
        if (a->n >= 4) tllm_parallel(quantize_task, a);
        else tllm_xq_quantize(&a->q, a->x, 0, a->n);
        a->quantized = 1;
    }
    struct linear_args la = {.nw = nw, .a = a};
    const int nth = tllm_threadpool_size(), split = packed_all(nw, w) && a->n >= 2 * LINEAR_PART_TOKENS;
    for (int i = 0; i < nw; i++) {
        const int n_blocks = (w[i]->rows + TLLM_QPACK_ROWS - 1) / TLLM_QPACK_ROWS;
        la.w[i] = w[i], la.y[i] = y[i], la.part_tokens[i] = a->n, la.parts[i] = 1;
        if (a->n == 1) { /* one run a thread */
            int chunk = (n_blocks + nth * LINEAR_DECODE_SPLIT - 1) / (nth * LINEAR_DECODE_SPLIT);
            la.chunk[i] = chunk > 0 ? chunk : 1;
        } else { /* guided grabs of units of the least chunk (linear_task), unless split by tokens */
            la.chunk[i] = LINEAR_PREFILL_CHUNK;
            int many = (n_blocks + nth * LINEAR_MANY_SPLIT - 1) / (nth * LINEAR_MANY_SPLIT);
            int chunk = many > LINEAR_PREFILL_CHUNK ? many : LINEAR_PREFILL_CHUNK, grabs = (n_blocks + chunk - 1) / chunk;
            /* A long step's weight with fewer row chunks than two a thread (k and v of a prompt: 8 row blocks
             * each; q and o on many cores) splits its tokens too, in ranges of whole AMX tile pairs, so that
             * no thread waits at the barrier with nothing to take */
            if (split && grabs < 2 * nth) {
                int parts = (nth * LINEAR_MANY_SPLIT + grabs - 1) / grabs, most = a->n / LINEAR_PART_TOKENS;
                parts = parts < most ? parts : most;
                int pt = (a->n + parts - 1) / parts;
                la.part_tokens[i] = (pt + LINEAR_PART_TOKENS - 1) / LINEAR_PART_TOKENS * LINEAR_PART_TOKENS;
                la.parts[i] = (a->n + la.part_tokens[i] - 1) / la.part_tokens[i];
                if (la.parts[i] > 1) la.chunk[i] = chunk;
            }
        }
        la.first[i + 1] = la.first[i] + (n_blocks + la.chunk[i] - 1) / la.chunk[i] * la.parts[i];
    }
    atomic_init(&la.next, 0);
    tllm_parallel(linear_task, &la);
}

static int same_perm(const struct tllm_qweights *a, const struct tllm_qweights *b) {
    return a->perm == b->perm || (a->perm && b->perm && a->cols == b->cols && !memcmp(a->perm, b->perm, (size_t)a->cols * sizeof *a->perm));
}

/* The same, where some weights read their inputs in another order (GPTQ act-order): the input is
 * permuted once for each order (q, k and v share theirs), and those weights run as plain ones on it. */
static void linears(struct act *a, int nw, const struct tllm_qweights *const *w, float *const *y) {
    int done[LINEAR_MAX_W] = {0}, n_plain = 0;
    const struct tllm_qweights *ws[LINEAR_MAX_W];
    float *ys[LINEAR_MAX_W];
    for (int i = 0; i < nw; i++)
        if (!w[i]->perm) ws[n_plain] = w[i], ys[n_plain++] = y[i], done[i] = 1;
    if (n_plain) linears_plain(a, n_plain, ws, ys);
    struct tllm_qweights plain[LINEAR_MAX_W];
    for (int i = 0; i < nw; i++) {
        if (done[i]) continue;
        const int32_t *perm = w[i]->perm;
        for (int t = 0; t < a->n; t++)
            for (int j = 0; j < a->cols; j++) a->perm_buf[(size_t)t * a->cols + j] = a->x[(size_t)t * a->cols + perm[j]];
        struct act pa = *a;
        pa.x = a->perm_buf, pa.quantized = 0;
        int k = 0;
        for (int j = i; j < nw; j++)
            if (!done[j] && same_perm(w[i], w[j])) {
                plain[k] = *w[j], plain[k].perm = NULL;
                ws[k] = &plain[k], ys[k++] = y[j], done[j] = 1;
            }
        linears_plain(&pa, k, ws, ys);
        a->quantized = 0; /* the int8 buffers now hold the permuted input */
    }
}

static void linear(const struct tllm_qweights *w, struct act *a, float *y) { linears(a, 1, &w, &y); }

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

/* A KV head's keys (transposed, rows `stride` apart) and values of positions [0, len) of a sequence,
 * from its blocks into float32 rows, so the attention kernel reads them contiguously; with f16 this is
 * where they widen. Done once for the query heads that share the KV head. */
static void gather_kv(const struct tllm_kv *kv, const struct tllm_kv_seq *s, int l, int kvh, int len, float *kt,
                      size_t stride, float *v) {
    const int hd = kv->head_dim, B = TLLM_KV_BLOCK;
    for (int i = 0; i * B < len; i++) {
        const char *kb = (const char *)tllm_kv_k(kv, l, s->blocks[i]) + (size_t)kvh * hd * B * kv->esize;
        const char *vb = (const char *)tllm_kv_v(kv, l, s->blocks[i]) + (size_t)kvh * hd * B * kv->esize;
        int np = len - i * B < B ? len - i * B : B;
        if (kv->dtype == TLLM_DT_F16) {
            for (int d = 0; d < hd; d++) tllm_f16_to_f32_row((const uint16_t *)kb + (size_t)d * B, kt + (size_t)d * stride + (size_t)i * B, np);
            tllm_f16_to_f32_row((const uint16_t *)vb, v + (size_t)i * B * hd, np * hd);
        } else {
            for (int d = 0; d < hd; d++) memcpy(kt + (size_t)d * stride + (size_t)i * B, (const float *)kb + (size_t)d * B, (size_t)np * 4);
            memcpy(v + (size_t)i * B * hd, vb, (size_t)np * hd * 4);
        }
    }
}

struct attn_args {
    struct tllm_cpu *cpu;
    int l;
    atomic_int taken; /* tasks taken so far, from the last */
};

/* Causal GQA attention of every token of the step over its own sequence's cache (its K/V already
 * written). A query's result depends on its sequence alone: the kernel sums each query's row in the
 * same order whatever block it is computed in. Threads take tasks (run, KV head, query block) from a
 * shared counter, a run's last query blocks first: the causal triangle makes them the longest, and
 * taking the longest first evens the threads out (dealt round-robin, the thread with the last blocks of
 * a 512-token prompt on 16 threads had 1.24x the mean's work). */
static void attention_task(void *arg, int ith, int nth) {
    (void)nth;
    struct attn_args *a = arg;
    struct tllm_cpu *cpu = a->cpu;
    if (ith >= cpu->n_scratch) return; /* a scratch row per thread the pool had when the backend was made */
    const struct tllm_config *c = &cpu->m->cfg;
    const int hd = c->head_dim, q_dim = c->n_heads * hd, group = c->n_heads / c->n_kv_heads;
    float *s = cpu->scores + (size_t)ith * ATT_QUERY_BLOCK * cpu->max_len;
    const struct tllm_kv *kv = cpu->kv;
    const int max_blocks = cpu->max_len / TLLM_KV_BLOCK + 1;
    float *kt = cpu->gather ? cpu->gather + (size_t)ith * 2 * hd * cpu->max_len : NULL, *v = kt ? kt + (size_t)hd * cpu->max_len : NULL;
    const void **kb = cpu->kv_blocks ? cpu->kv_blocks + (size_t)ith * 2 * max_blocks : NULL, **vb = kb ? kb + max_blocks : NULL;
    for (;;) {
        int task = cpu->n_tasks - 1 - atomic_fetch_add_explicit(&a->taken, 1, memory_order_relaxed);
        if (task < 0) break;
        const struct att_task *at = &cpu->tasks[task];
        const struct run *r = &cpu->runs[at->run];
        int pos0 = r->pos0 + at->q0, len = pos0 + at->nq;
        if (kb) {
            /* every query head of the KV head in the same tiles, reading the blocks where they are: a
             * generated token's 7 heads are one tile (3.1x the copy with a pass a head at 200 positions,
             * VM, both kernels unrolled), 16 tokens' 1.0-1.2x; and no copy's memory (threads x 2 x
             * head_dim x the cache) */
            const struct tllm_kv_seq *sq = &kv->seqs[r->seq];
            const size_t head = (size_t)at->kvh * hd * TLLM_KV_BLOCK * kv->esize;
            for (int i = 0; i * TLLM_KV_BLOCK < len; i++) {
                kb[i] = (const char *)tllm_kv_k(kv, a->l, sq->blocks[i]) + head;
                vb[i] = (const char *)tllm_kv_v(kv, a->l, sq->blocks[i]) + head;
            }
            size_t row = (size_t)(r->t0 + at->q0) * q_dim + (size_t)at->kvh * group * hd;
            tllm_attention_blocks(cpu->q + row, (size_t)q_dim, at->nq, group, pos0, kb, vb, kv->dtype == TLLM_DT_F16, hd, s,
                                  cpu->att_out + row, (size_t)q_dim);
            continue;
        }
        size_t stride = (size_t)(len + 15) / 16 * 16;
        gather_kv(cpu->kv, &cpu->kv->seqs[r->seq], a->l, at->kvh, len, kt, stride, v);
        for (int h = at->kvh * group; h < (at->kvh + 1) * group; h++) {
            size_t row = (size_t)(r->t0 + at->q0) * q_dim + (size_t)h * hd;
            tllm_attention(cpu->q + row, (size_t)q_dim, at->nq, pos0, kt, stride, v, (size_t)hd, hd, s,
                           cpu->att_out + row, (size_t)q_dim);
        }
    }
}

static void attention(struct tllm_cpu *cpu, int l) {
    struct attn_args a = {cpu, l, 0};
    atomic_init(&a.taken, 0);
    if (cpu->n_tasks == 1) attention_task(&a, 0, 1);
    else tllm_parallel(attention_task, &a);
}

/* Tokens [t0, t1)'s K/V (after RoPE) into each token's block and slot */
static void write_kv(struct tllm_cpu *cpu, int l, int t0, int t1) {
    const struct tllm_kv *kv = cpu->kv;
    const struct tllm_batch *bt = cpu->bt;
    const int hd = kv->head_dim, kv_dim = kv->n_kv_heads * hd, B = TLLM_KV_BLOCK;
    uint16_t kh16[64]; /* a key row's part in f16, before it goes down its block's column */
    for (int t = t0; t < t1; t++) {
        const struct tllm_kv_seq *s = &kv->seqs[bt->seq[t]];
        int b = s->blocks[bt->pos[t] / B], o = bt->pos[t] % B;
        const float *k = cpu->k + (size_t)t * kv_dim, *v = cpu->v + (size_t)t * kv_dim;
        void *kb = tllm_kv_k(kv, l, b), *vb = tllm_kv_v(kv, l, b);
        for (int h = 0; h < kv->n_kv_heads; h++) {
            size_t k0 = (size_t)h * hd * B + o, v0 = ((size_t)h * B + o) * hd; /* key d at k0 + d * B, value d at v0 + d */
            const float *kh = k + h * hd, *vh = v + h * hd;
            if (kv->dtype == TLLM_DT_F16) {
                /* converted a row at a time (the scalar conversion, element by element, was most of this task) */
                tllm_f32_to_f16_row(vh, (uint16_t *)vb + v0, hd);
                for (int d0 = 0; d0 < hd; d0 += 64) {
                    int nd = hd - d0 < 64 ? hd - d0 : 64;
                    tllm_f32_to_f16_row(kh + d0, kh16, nd);
                    for (int d = 0; d < nd; d++) ((uint16_t *)kb)[k0 + (size_t)(d0 + d) * B] = kh16[d];
                }
            } else {
                for (int d = 0; d < hd; d++) ((float *)kb)[k0 + (size_t)d * B] = kh[d], ((float *)vb)[v0 + d] = vh[d];
            }
        }
    }
}

/* The per-token work between the matmuls (norms, biases, RoPE, the cache writes, residual adds): each
 * token's on its own, so a step of many tokens shares its tokens out (a 512-token prompt on 16 cores
 * spent a tenth of its time here on one thread) and any split gives the same bits. */
struct token_args {
    struct tllm_cpu *cpu;
    int l;           /* the layer */
    const float *norm; /* residual_norm: the RMSNorm weight of the next sublayer, or NULL (add only) */
    const float *add;  /* residual_norm: what is added to the residual stream first, or NULL */
};

static void token_range(int n, int ith, int nth, int *t0, int *t1) {
    int per = (n + nth - 1) / nth;
    *t0 = ith * per < n ? ith * per : n, *t1 = *t0 + per < n ? *t0 + per : n;
}

/* x[t] = embedding of token t; its RoPE tables */
static void embed_task(void *arg, int ith, int nth) {
    const struct token_args *a = arg;
    struct tllm_cpu *cpu = a->cpu;
    const struct tllm_config *c = &cpu->m->cfg;
    const int half = c->head_dim / 2;
    int t0, t1;
    token_range(cpu->bt->n, ith, nth, &t0, &t1);
    for (int t = t0; t < t1; t++) {
        tllm_qw_dequant_row(&cpu->m->embed, cpu->bt->id[t], cpu->x + (size_t)t * c->dim);
        tllm_rope_tables(cpu->bt->pos[t], c->head_dim, c->rope_theta, cpu->rope_cos + (size_t)t * half, cpu->rope_sin + (size_t)t * half);
    }
}

/* x[t] += add[t] (if add); xb[t] = rmsnorm(x[t]) * norm (if norm) */
static void residual_norm_task(void *arg, int ith, int nth) {
    const struct token_args *a = arg;
    struct tllm_cpu *cpu = a->cpu;
    const struct tllm_config *c = &cpu->m->cfg;
    const size_t dim = (size_t)c->dim;
    int t0, t1;
    token_range(cpu->bt->n, ith, nth, &t0, &t1);
    for (int t = t0; t < t1; t++) {
        float *x = cpu->x + (size_t)t * dim;
        if (a->add)
            for (size_t i = 0; i < dim; i++) x[i] += a->add[(size_t)t * dim + i];
        if (a->norm) tllm_rmsnorm(cpu->xb + (size_t)t * dim, x, a->norm, c->dim, c->norm_eps);
    }
}

/* q, k, v of layer l: biases, RoPE, and k, v into the cache */
static void qkv_post_task(void *arg, int ith, int nth) {
    const struct token_args *a = arg;
    struct tllm_cpu *cpu = a->cpu;
    const struct tllm_config *c = &cpu->m->cfg;
    const struct tllm_layer *L = &cpu->m->layers[a->l];
    const int hd = c->head_dim, half = hd / 2, q_dim = c->n_heads * hd, kv_dim = c->n_kv_heads * hd;
    int t0, t1;
    token_range(cpu->bt->n, ith, nth, &t0, &t1);
    if (t0 >= t1) return;
    add_bias(cpu->q + (size_t)t0 * q_dim, L->bq, t1 - t0, q_dim);
    add_bias(cpu->k + (size_t)t0 * kv_dim, L->bk, t1 - t0, kv_dim);
    add_bias(cpu->v + (size_t)t0 * kv_dim, L->bv, t1 - t0, kv_dim);
    for (int t = t0; t < t1; t++) {
        const float *ct = cpu->rope_cos + (size_t)t * half, *st = cpu->rope_sin + (size_t)t * half;
        tllm_rope(cpu->q + (size_t)t * q_dim, c->n_heads, hd, ct, st);
        tllm_rope(cpu->k + (size_t)t * kv_dim, c->n_kv_heads, hd, ct, st);
    }
    write_kv(cpu, a->l, t0, t1);
}

/* fn over the step's tokens: on the pool where there are enough of them to pay for a dispatch */
static void per_token(struct tllm_cpu *cpu, tllm_task_fn fn, struct token_args *a) {
    if (cpu->bt->n >= TOKEN_TASK_MIN) tllm_parallel(fn, a);
    else fn(a, 0, 1);
}

/* One step: the batch's n tokens through every layer, their K/V into the cache; the final norm and
 * the lm_head for the n_out tokens that `out` marks, their logits in order into `logits`. */
static void forward_step(struct tllm_cpu *cpu, int n_out, float *logits) {
    const struct tllm_model *m = cpu->m;
    const struct tllm_config *c = &m->cfg;
    const struct tllm_batch *bt = cpu->bt;
    const int n = bt->n, n_gen = bt->n_gen;
    const int dim = c->dim, q_dim = c->n_heads * c->head_dim;

    struct token_args ta = {cpu, 0, m->layers[0].attn_norm, NULL};
    per_token(cpu, embed_task, &ta);
    per_token(cpu, residual_norm_task, &ta); /* the first layer's attention norm */
    for (int l = 0; l < c->n_layers; l++) {
        const struct tllm_layer *L = &m->layers[l];
        /* attention block (xb: its normed input) */
        struct act a = act_of(cpu, cpu->xb, n, dim, n_gen);
        linears(&a, 3, (const struct tllm_qweights *const[]){&L->wq, &L->wk, &L->wv}, (float *const[]){cpu->q, cpu->k, cpu->v});
        ta.l = l;
        per_token(cpu, qkv_post_task, &ta);
        attention(cpu, l);
        a = act_of(cpu, cpu->att_out, n, q_dim, n_gen);
        linear(&L->wo, &a, cpu->proj);
        ta.add = cpu->proj, ta.norm = L->ffn_norm;
        per_token(cpu, residual_norm_task, &ta);

        /* MLP block */
        a = act_of(cpu, cpu->xb, n, dim, n_gen);
        linears(&a, 2, (const struct tllm_qweights *const[]){&L->w_gate, &L->w_up}, (float *const[]){cpu->hb, cpu->hb2});
        struct swiglu_args sw = {cpu->hb, cpu->hb2, (size_t)n * c->ffn_dim};
        if (n > 1) tllm_parallel(swiglu_task, &sw);
        else swiglu_task(&sw, 0, 1);
        a = act_of(cpu, cpu->hb, n, c->ffn_dim, n_gen);
        linear(&L->w_down, &a, cpu->proj);
        ta.add = cpu->proj, ta.norm = l + 1 < c->n_layers ? m->layers[l + 1].attn_norm : NULL; /* and the next layer's norm */
        per_token(cpu, residual_norm_task, &ta);
    }

    if (n_out == 0) return;
    int out_gen = 0; /* wanted rows that are generated tokens: they come first */
    for (int t = 0, j = 0; t < n; t++) /* the wanted tokens' rows, packed */
        if (bt->out[t]) {
            out_gen += t < n_gen;
            tllm_rmsnorm(cpu->xb + (size_t)j++ * dim, cpu->x + (size_t)t * dim, m->final_norm, dim, c->norm_eps);
        }
    struct act a = act_of(cpu, cpu->xb, n_out, dim, out_gen);
    linear(&m->lm_head, &a, logits);
}

/* A step's tokens checked by the cache (tllm_kv_check_step), then split into runs (a sequence's tokens)
 * and attention tasks. */
static int plan_batch(struct tllm_cpu *cpu, const struct tllm_batch *bt, int *n_out) {
    const struct tllm_kv *kv = cpu->kv;
    if (bt->n <= 0 || bt->n > cpu->n_batch)
        return tllm_fail(TLLM_ERR_ARG, "a CPU step of %d tokens (1 to %d)", bt->n, cpu->n_batch);
    if (bt->n_gen < 0 || bt->n_gen > bt->n) return tllm_fail(TLLM_ERR_ARG, "a step of %d tokens with %d generated", bt->n, bt->n_gen);
    int rc = tllm_kv_check_step(cpu->kv, bt->n, bt->id, bt->pos, bt->seq, cpu->m->cfg.vocab_size);
    if (rc) return rc;
    *n_out = 0;
    cpu->n_runs = 0;
    for (int t = 0; t < bt->n; t++) { /* each sequence's tokens: one run (checked together and consecutive) */
        if (t > 0 && bt->seq[t - 1] == bt->seq[t])
            cpu->runs[cpu->n_runs - 1].n++;
        else
            cpu->runs[cpu->n_runs++] = (struct run){bt->seq[t], t, 1, bt->pos[t]};
        *n_out += bt->out && bt->out[t];
    }
    cpu->n_tasks = 0;
    for (int i = 0; i < cpu->n_runs; i++)
        for (int q0 = 0; q0 < cpu->runs[i].n; q0 += ATT_QUERY_BLOCK)
            for (int g = 0; g < kv->n_kv_heads; g++) {
                int nq = cpu->runs[i].n - q0 < ATT_QUERY_BLOCK ? cpu->runs[i].n - q0 : ATT_QUERY_BLOCK;
                cpu->tasks[cpu->n_tasks++] = (struct att_task){i, g, q0, nq};
            }
    return TLLM_OK;
}

struct argmax_args {
    const float *logits; /* [n x vocab] */
    int32_t *ids;
    int n, vocab, n_sample;
    const int32_t *mask;   /* [n] or NULL: the batch's */
    const uint32_t *allow;
};

/* Greedy ids of a step's rows, rows shared out: 16 rows of a 151,936-word vocabulary are 9.7 MB to read */
static void argmax_task(void *arg, int ith, int nth) {
    const struct argmax_args *a = arg;
    int t0, t1;
    token_range(a->n, ith, nth, &t0, &t1);
    for (int j = t0; j < t1; j++) {
        const float *row = a->logits + (size_t)j * a->vocab;
        int m = a->mask ? a->mask[j] : -1;
        a->ids[j] = m < 0 ? tllm_argmax(row, a->n_sample)
                          : tllm_argmax_allowed(row, a->n_sample, a->allow + (size_t)m * TLLM_MASK_WORDS(a->vocab));
    }
}

static int cpu_step(struct tllm_backend *b, const struct tllm_batch *bt, float *logits, int32_t *argmax) {
    struct tllm_cpu *cpu = (struct tllm_cpu *)b;
    int n_out = 0, rc = plan_batch(cpu, bt, &n_out);
    if (rc) return rc;
    if (!logits && !argmax) n_out = 0;
    int vocab = cpu->m->cfg.vocab_size;
    if (argmax && !logits && n_out > cpu->n_logits) {
        float *l = realloc(cpu->logits, (size_t)n_out * vocab * sizeof(float));
        if (!l) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        cpu->logits = l;
        cpu->n_logits = n_out;
    }
    float *out = logits ? logits : cpu->logits;
    cpu->bt = bt;
    forward_step(cpu, n_out, out);
    cpu->bt = NULL;
    if (argmax) {
        struct argmax_args aa = {out, argmax, n_out, vocab, cpu->m->n_sample, bt->mask, bt->allow};
        if (bt->fill_masks && (rc = bt->fill_masks(bt->user, &aa.mask, &aa.allow))) return rc;
        if (n_out > 1) tllm_parallel(argmax_task, &aa);
        else argmax_task(&aa, 0, 1);
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
    float *bufs[] = {cpu->x, cpu->xb, cpu->q, cpu->k, cpu->v, cpu->att_out, cpu->proj, cpu->hb, cpu->hb2,
                     cpu->scores, cpu->gather, cpu->rope_cos, cpu->rope_sin, cpu->xq_d, cpu->xq_sum, cpu->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free((void *)cpu->kv_blocks);
    free(cpu->xq);
    free(cpu->xq2);
    free(cpu->xperm);
    free(cpu->xq_sum16);
    free(cpu->runs);
    free(cpu->tasks);
    free(cpu);
}

static const struct tllm_backend_ops cpu_ops = {
    .step = cpu_step,
    .describe = cpu_describe,
    .free = cpu_free,
};

int tllm_backend_cpu_init(struct tllm_backend **out, const struct tllm_model *m, struct tllm_kv *kv, int n_batch) {
    *out = NULL;
    struct tllm_cpu *cpu = calloc(1, sizeof *cpu);
    if (!cpu) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    const struct tllm_config *c = &m->cfg;
    if (kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads || kv->head_dim != c->head_dim) {
        free(cpu);
        return tllm_fail(TLLM_ERR_ARG, "the KV cache was made for another model's shapes");
    }
    cpu->base.ops = &cpu_ops;
    cpu->m = m;
    cpu->kv = kv;
    cpu->max_len = kv->n_blocks * TLLM_KV_BLOCK;
    cpu->n_batch = n_batch;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t nb = (size_t)n_batch, half = (size_t)c->head_dim / 2, ml = (size_t)cpu->max_len;
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
    cpu->scores = malloc((size_t)cpu->n_scratch * ATT_QUERY_BLOCK * ml * sizeof(float));
    const int in_place = tllm_attention_blocks_ok(c->head_dim); /* attention reads the blocks (else copies them) */
    if (in_place) cpu->kv_blocks = malloc((size_t)cpu->n_scratch * 2 * (ml / TLLM_KV_BLOCK + 1) * sizeof *cpu->kv_blocks);
    else cpu->gather = malloc((size_t)cpu->n_scratch * 2 * c->head_dim * ml * sizeof(float));
    cpu->rope_cos = malloc(nb * half * sizeof(float));
    cpu->rope_sin = malloc(nb * half * sizeof(float));
    size_t max_cols = (size_t)c->dim;
    if (q_dim > max_cols) max_cols = q_dim;
    if ((size_t)c->ffn_dim > max_cols) max_cols = (size_t)c->ffn_dim;
    cpu->xq = malloc(nb * max_cols);
    cpu->xq2 = malloc(nb * max_cols);
    cpu->xq_d = malloc(nb * (max_cols / TLLM_XQ_BLOCK + 1) * sizeof(float));
    cpu->xq_sum = malloc(nb * (max_cols / TLLM_XQ_BLOCK + 1) * sizeof(float));
    /* (by format, not by pack: the model may be packed after this is made) */
    int permuted = 0, halves = m->lm_head.format == TLLM_WF_NVFP4 || m->lm_head.group_size == 16;
    for (int l = 0; l < c->n_layers; l++) {
        const struct tllm_layer *L = &m->layers[l];
        const struct tllm_qweights *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            permuted |= ws[i]->perm != NULL;
            halves |= ws[i]->format == TLLM_WF_NVFP4 || ws[i]->group_size == 16;
        }
    }
    if ((permuted && !(cpu->xperm = malloc(nb * max_cols * sizeof(float)))) ||
        (halves && !(cpu->xq_sum16 = malloc(nb * (max_cols / 16 + 1) * sizeof(float))))) {
        cpu_free(&cpu->base);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    cpu->runs = malloc(nb * sizeof *cpu->runs);
    cpu->tasks = malloc(nb * (size_t)c->n_kv_heads * sizeof *cpu->tasks);
    if (!cpu->x || !cpu->xb || !cpu->q || !cpu->k || !cpu->v || !cpu->att_out || !cpu->proj || !cpu->hb ||
        !cpu->hb2 || !cpu->scores || (in_place ? !cpu->kv_blocks : !cpu->gather) || !cpu->rope_cos || !cpu->rope_sin || !cpu->xq || !cpu->xq2 ||
        !cpu->xq_d || !cpu->xq_sum || !cpu->runs || !cpu->tasks) {
        cpu_free(&cpu->base);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory for steps of %d tokens over a cache of %d positions", n_batch,
                         cpu->max_len);
    }
    *out = &cpu->base;
    return TLLM_OK;
}
