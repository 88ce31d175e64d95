/* Steps of many sequences on the device (continuous batching, engine/run/scheduler.c): the host's
 * paged cache (engine/run/kv_cache.h) keeps the block tables, the reference counts and the prefix
 * index; the blocks' contents live here, in a pool laid out as the host's, so a block table means the
 * same on both sides and a prefix computed once serves every sequence that shares it. A step's tokens
 * go through tllm_cl_tokens (cl_prefill.c) with their positions, slots, attention runs and block
 * tables in one upload; the host's copies on write become device copies before the step. */
#include "engine/backend/opencl/cl_internal.h"
#include "engine/backend/backend.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/run/kv_cache.h"

#ifndef PG_SPLIT_TOKENS
#define PG_SPLIT_TOKENS 64 /* split-K as for a step of this many tokens, whatever its size (batch invariance) */
#endif

struct cl_paged {
    struct tllm_kv *kv;   /* the host's cache: tables and counts (its own blocks stay unwritten) */
    struct cl_pages pages;
    size_t block_bytes;   /* one layer's keys (or values) of one block */
    int32_t *meta;        /* the step's tables (struct cl_tokens) */
    size_t cap_meta;
};

void tllm_cl_paged_free(struct tllm_cl *cl) {
    struct cl_paged *g = cl->pg;
    if (!g) return;
    if (g->pages.kp) clReleaseMemObject(g->pages.kp);
    if (g->pages.vp) clReleaseMemObject(g->pages.vp);
    tllm_kv_set_remote(g->kv, 0);
    free(g->meta);
    free(g);
    cl->pg = NULL;
}

int tllm_cl_use_kv(struct tllm_cl *cl, struct tllm_kv *kv) {
    tllm_cl_paged_free(cl);
    if (!kv) return TLLM_OK;
    const struct tllm_config *c = &cl->m->cfg;
    const char *why = tllm_cl_prefill_refusal(cl);
    if (why) return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: many sequences cannot run on %s: %s", cl->name, why);
    if (kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads || kv->head_dim != c->head_dim)
        return tllm_fail(TLLM_ERR_ARG, "opencl: the KV cache's shape is not the model's");
    int rows = tllm_cl_flash_rows(cl);
    if (rows <= 0) return TLLM_ERR_UNSUPPORTED; /* its message is kept */
    if (c->n_heads / c->n_kv_heads > rows)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: %d query heads share a KV head (at most %d)", c->n_heads / c->n_kv_heads, rows);
    struct cl_paged *g = calloc(1, sizeof *g);
    if (!g) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    cl->pg = g;
    g->kv = kv;
    g->block_bytes = kv->block_elems * kv->esize;
    size_t bytes = (size_t)kv->n_layers * kv->n_blocks * g->block_bytes;
    g->pages = (struct cl_pages){.n_blocks = kv->n_blocks, .kv_half = kv->dtype == TLLM_DT_F16, .fixed_n = PG_SPLIT_TOKENS};
    int rc = tllm_cl_device_buffer(cl, &g->pages.kp, bytes, "the KV cache's keys");
    if (!rc) rc = tllm_cl_device_buffer(cl, &g->pages.vp, bytes, "the KV cache's values");
    if (rc) {
        tllm_cl_paged_free(cl);
        return rc;
    }
    tllm_kv_set_remote(kv, 1);
    return TLLM_OK;
}

/* The host's logged copies on write, done on the pool (in order: a block may be copied twice) */
static int copy_blocks(struct tllm_cl *cl) {
    struct cl_paged *g = cl->pg;
    struct tllm_kv *kv = g->kv;
    for (int i = 0; i < kv->n_copies; i++)
        for (int l = 0; l < kv->n_layers; l++) {
            size_t from = ((size_t)l * kv->n_blocks + kv->copies[2 * i]) * g->block_bytes;
            size_t to = ((size_t)l * kv->n_blocks + kv->copies[2 * i + 1]) * g->block_bytes;
            CL_TRY(clEnqueueCopyBuffer(cl->q, g->pages.kp, g->pages.kp, from, to, g->block_bytes, 0, NULL, NULL));
            CL_TRY(clEnqueueCopyBuffer(cl->q, g->pages.vp, g->pages.vp, from, to, g->block_bytes, 0, NULL, NULL));
        }
    kv->n_copies = 0;
    return TLLM_OK;
}

static int meta_room(struct cl_paged *g, size_t n) {
    if (n <= g->cap_meta) return TLLM_OK;
    size_t cap = n + n / 2 + 1024;
    int32_t *m = realloc(g->meta, cap * sizeof *m);
    if (!m) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    g->meta = m, g->cap_meta = cap;
    return TLLM_OK;
}

int tllm_cl_batch(struct tllm_cl *cl, const struct tllm_batch *bt, float *logits, int32_t *argmax) {
    int n = bt->n;
    const int32_t *ids = bt->id, *pos = bt->pos, *seq = bt->seq;
    const int8_t *out = bt->out;
    struct cl_paged *g = cl->pg;
    if (!g) return tllm_fail(TLLM_ERR_ARG, "opencl: a step of many sequences with no KV cache bound");
    if (n < 1) return tllm_fail(TLLM_ERR_ARG, "opencl: an empty step");
    int rc = tllm_kv_check_step(g->kv, n, ids, pos, seq, cl->m->cfg.vocab_size);
    if (rc) return rc;
    const struct tllm_config *c = &cl->m->cfg;
    const struct tllm_kv *kv = g->kv;
    int per = tllm_cl_flash_rows(cl) / (c->n_heads / c->n_kv_heads); /* tokens of an attention run */
    int span = tllm_cl_flash_span(cl);
    int t1, n_grp = 0;
    size_t n_tab = 0;
    for (int t = 0; t < n; t = t1) { /* each sequence's run: its attention runs, its table */
        for (t1 = t; t1 < n && seq[t1] == seq[t]; t1++) {}
        n_grp += (t1 - t + per - 1) / per;
        n_tab += (size_t)pos[t1 - 1] / TLLM_KV_BLOCK + 1;
    }
    if ((rc = meta_room(g, 5 * (size_t)n + 1 + 4 * (size_t)n_grp + n_tab))) return rc;
    int32_t *m = g->meta;
    struct cl_pages pg = g->pages;
    pg.pos_off = n, pg.slot_off = 2 * n, pg.grp_off = 3 * n, pg.n_grp = 0;
    memcpy(m, ids, (size_t)n * sizeof *m);
    memcpy(m + n, pos, (size_t)n * sizeof *m);
    for (int t = 0; t < n; t++)
        m[2 * n + t] = kv->seqs[seq[t]].blocks[pos[t] / TLLM_KV_BLOCK] * TLLM_KV_BLOCK + pos[t] % TLLM_KV_BLOCK;
    /* the block tables last, so a step's offsets do not move as its tables grow (the same launch
     * arguments step after step) */
    pg.spo_off = pg.grp_off + 4 * n_grp, pg.max_pos = 0;
    for (int t = 0, sum = 0; t <= n; t++) { /* the rows flash_prefill splits into spans, and their spans */
        m[pg.spo_off + t] = sum;
        if (t == n) break;
        sum += pos[t] >= span ? pos[t] / span + 1 : 0;
        pg.max_pos = pos[t] > pg.max_pos ? pos[t] : pg.max_pos;
    }
    int rows_off = pg.spo_off + n + 1, n_out = 0;
    for (int t = 0; out && (logits || argmax) && t < n; t++)
        if (out[t]) m[rows_off + n_out++] = t;
    size_t tab = (size_t)rows_off + (size_t)n_out;
    for (int t = 0; t < n; t = t1) {
        for (t1 = t; t1 < n && seq[t1] == seq[t]; t1++) {}
        const struct tllm_kv_seq *s = &kv->seqs[seq[t]];
        int nb = pos[t1 - 1] / TLLM_KV_BLOCK + 1;
        for (int r = t; r < t1; r += per) {
            int32_t *grp = m + pg.grp_off + 4 * pg.n_grp++;
            grp[0] = r, grp[1] = t1 - r < per ? t1 - r : per, grp[2] = pos[r], grp[3] = (int32_t)tab;
        }
        memcpy(m + tab, s->blocks, (size_t)nb * sizeof *m);
        tab += (size_t)nb;
    }
    if ((rc = copy_blocks(cl))) return rc;
    struct cl_tokens tk = {.n = n, .n_meta = (int)tab, .meta = m, .pages = &pg, .rows_off = rows_off, .n_out = n_out,
                           .logits = logits, .argmax = argmax, .want_logits = logits && argmax ? bt->want_logits : NULL,
                           .mask = argmax ? bt->mask : NULL, .allow = bt->allow, .fill_masks = argmax ? bt->fill_masks : NULL,
                           .user = bt->user};
    return tllm_cl_tokens(cl, &tk);
}
