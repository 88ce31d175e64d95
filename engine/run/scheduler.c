/* Continuous batching over the paged KV cache (scheduler.h). */
#include "engine/run/scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/registry.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "engine/run/kv_cache.h"
#include "kernels/cpu/ops.h"

/* Grammars whose automata (and masks) stay made after their last sequence ends. An automaton keeps at
 * most TLLM_GMATCH_CACHE masks (each the shorter of a state's allowed or refused ids) in
 * TLLM_GMATCH_CACHE_BYTES of lists and TLLM_GMATCH_STATES states; typical schemas hold a few megabytes. */
#ifndef TLLM_SCHED_KEPT_GRAMMARS
#define TLLM_SCHED_KEPT_GRAMMARS 4
#endif

/* A request as queued: its own copies of everything it points to */
struct req {
    int32_t *prompt;
    int n_prompt;
    struct tllm_sampler_params sampling;
    struct tllm_gen_params gp; /* eos and stop point into the copies below */
    int32_t *eos;
    char **stop;
    tllm_gen_cb cb;
    void *user;
    void (*on_token)(void *user, int32_t id, float logprob, const int32_t *top_ids, const float *top_lps, int n_top);
    int top_logprobs;
    struct req *next;
};

/* A running request */
struct seq {
    struct req *rq;
    int active;
    long serial;       /* admission order */
    int kv;            /* its sequence in the KV cache */
    int n_done;        /* positions in the cache */
    int decoding;      /* the prompt is in: `next` goes in as a generated token */
    int32_t next;
    struct tllm_sampler smp;
    struct tllm_gen_result r;
    struct tllm_gen_stream g;
    int lead;          /* a slot prefilling the same first `common` tokens, admitted before: wait for its blocks */
    long lead_serial;
    int common;
    double t_admit, t_first;
};

struct tllm_sched {
    const struct tllm_model *m;
    struct tllm_tok *tok;
    struct tllm_sched_params p;
    int n_ctx;                 /* positions one sequence may reach */
    tllm_sched_done_fn done;
    void *arg;
    struct tllm_kv *kv;
    struct tllm_backend *cpu;  /* the CPU's, or NULL when p.dev runs the steps */
    struct tllm_backend *run;  /* the one that does: cpu or p.dev */
    struct seq *seqs;          /* [n_parallel] slots */
    int *order;                /* [n_parallel] the active slots, in admission order */
    int n_running;
    long serial;
    struct req *head, *tail;
    int n_waiting;
    /* one step */
    int32_t *ids, *pos, *sq;   /* [n_batch] */
    int8_t *out;               /* [n_batch] */
    int *row_slot;             /* [n_parallel] the slot of each logits row */
    int *tok_slot;             /* [n_batch] the slot of each token */
    float *logits;             /* [n_parallel x vocab] */
    int32_t *next;             /* [n_parallel] each row's argmax (rows whose pick it is) */
    int8_t *want;              /* [n_parallel] 1 where a row's logits come back (it samples, or logprobs are asked) */
    int32_t *mask;             /* [n_parallel] a greedy row's bitset in allow (under a grammar), else -1 */
    struct tllm_gmatch **gms;  /* [n_parallel] the step's rows' grammars, for tllm_gmatch_prepare */
    uint32_t *allow;           /* [cap_allow][TLLM_MASK_WORDS(vocab)] the step's distinct grammar masks */
    int cap_allow;
    struct mask_key { size_t off; int n, allows; } *keys; /* [cap_keys] the step's distinct grammar lists, copied into lists */
    int cap_keys;
    int n_rows; /* the step's rows, for fill_masks */
    /* The automata (states, masks) of the last grammars admitted, kept past their sequences: a request
     * on a schema whose sequences have all ended (a server's next request, the next prompts of a batch
     * after a lull) finds its masks made. Each holds a reference to its grammar. */
    struct tllm_gmatch *kept[TLLM_SCHED_KEPT_GRAMMARS];
    struct tllm_grammar *kept_g[TLLM_SCHED_KEPT_GRAMMARS];
    int kept_next;
    int32_t *lists;
    size_t cap_lists;
    float *raw;                /* [vocab] a row before sampling changes it (logprobs), made when first asked */
    struct tllm_sched_stats st;
    int bound;                 /* p.dev holds the cache (use_kv): let go of it at the end */
    struct tllm_vocab_index *vi; /* the vocabulary in byte order, made for the first request with a grammar */
};

static void req_free(struct req *q) {
    if (!q) return;
    free(q->prompt);
    free(q->eos);
    for (int i = 0; q->stop && i < q->gp.n_stop; i++) free(q->stop[i]);
    free(q->stop);
    free(q);
}

int tllm_sched_init(struct tllm_sched **out, const struct tllm_model *m, struct tllm_tok *tok,
                    const struct tllm_sched_params *p, tllm_sched_done_fn done, void *arg) {
    *out = NULL;
    if (p->n_parallel < 1 || p->n_parallel > 4096) return tllm_fail(TLLM_ERR_ARG, "%d sequences at once (1 to 4096)", p->n_parallel);
    struct tllm_sched *s = calloc(1, sizeof *s);
    if (!s) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    const struct tllm_config *c = &m->cfg;
    s->m = m, s->tok = tok, s->p = *p, s->done = done, s->arg = arg;
    if (s->p.n_batch <= 0) s->p.n_batch = 512;
    if (s->p.n_batch < s->p.n_parallel) s->p.n_batch = s->p.n_parallel; /* every decoding sequence fits a step */
    if (s->p.kv_tokens <= 0) s->p.kv_tokens = s->p.n_parallel * 1024 > 4096 ? s->p.n_parallel * 1024 : 4096;
    s->n_ctx = s->p.n_ctx > 0 ? s->p.n_ctx : c->max_pos;
    int rc = tllm_kv_init(&s->kv, c->n_layers, c->n_kv_heads, c->head_dim, s->p.kv_tokens, s->p.kv_type, s->p.n_parallel);
    if (!rc) {
        if (s->n_ctx > s->kv->n_blocks * TLLM_KV_BLOCK) s->n_ctx = s->kv->n_blocks * TLLM_KV_BLOCK;
        if (!p->dev) rc = tllm_backend_cpu_init(&s->cpu, m, s->kv, s->p.n_batch);
        else if (!p->dev->ops->use_kv) rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "this device runs one sequence at a time");
        else if (!(rc = p->dev->ops->use_kv(p->dev, s->kv))) s->bound = 1;
        s->run = p->dev ? p->dev : s->cpu;
    }
    size_t nb = (size_t)s->p.n_batch, np = (size_t)s->p.n_parallel;
    if (!rc) {
        s->seqs = calloc(np, sizeof *s->seqs);
        s->order = malloc(np * sizeof *s->order);
        s->ids = malloc(nb * sizeof *s->ids);
        s->pos = malloc(nb * sizeof *s->pos);
        s->sq = malloc(nb * sizeof *s->sq);
        s->out = malloc(nb);
        s->row_slot = malloc(np * sizeof *s->row_slot);
        s->tok_slot = malloc(nb * sizeof *s->tok_slot);
        s->logits = malloc(np * (size_t)c->vocab_size * sizeof *s->logits);
        s->next = malloc(np * sizeof *s->next);
        s->want = malloc(np);
        s->mask = malloc(np * sizeof *s->mask);
        s->gms = malloc(np * sizeof *s->gms);
        if (!s->seqs || !s->order || !s->ids || !s->pos || !s->sq || !s->out || !s->row_slot || !s->tok_slot || !s->logits || !s->next ||
            !s->want || !s->mask || !s->gms)
            rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    if (rc) {
        tllm_sched_free(s);
        return rc;
    }
    *out = s;
    return TLLM_OK;
}

/* A running request ends: its blocks go back (the full ones stay findable), then its done callback
 * (dropped: as interrupted). */
static void retire(struct tllm_sched *s, int slot, int rc, const char *msg, int dropped) {
    struct seq *q = &s->seqs[slot];
    tllm_kv_seq_close(s->kv, q->kv);
    if (dropped) q->r.finish = TLLM_FINISH_INTERRUPTED;
    else if (!rc && (rc = tllm_gen_stream_end(&q->g)))
        msg = tllm_errmsg();
    if (q->t_first > 0) q->r.gen_secs = tllm_now() - q->t_first;
    tllm_sampler_free(&q->smp); /* before done: the caller may free the grammar there */
    s->done(s->arg, q->rq->user, rc, msg, rc ? NULL : &q->r);
    tllm_gen_result_free(&q->r);
    req_free(q->rq);
    memset(q, 0, sizeof *q);
    int j = 0;
    for (int i = 0; i < s->n_running; i++)
        if (s->order[i] != slot) s->order[j++] = s->order[i];
    s->n_running = j;
}

int tllm_sched_cancel(struct tllm_sched *s, void *user) {
    for (int i = 0; i < s->n_running; i++)
        if (s->seqs[s->order[i]].rq->user == user) {
            retire(s, s->order[i], TLLM_OK, NULL, 1);
            return 1;
        }
    for (struct req **pp = &s->head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
        struct req *q = *pp;
        if (q->user != user) continue;
        *pp = q->next;
        if (s->tail == q) s->tail = prev;
        s->n_waiting--;
        struct tllm_gen_result r = {.finish = TLLM_FINISH_INTERRUPTED, .n_prompt = q->n_prompt};
        s->done(s->arg, q->user, TLLM_OK, NULL, &r);
        req_free(q);
        return 1;
    }
    return 0;
}

void tllm_sched_drop_all(struct tllm_sched *s) {
    while (s->n_running) retire(s, s->order[0], TLLM_OK, NULL, 1);
    while (s->head) {
        struct req *q = s->head;
        struct tllm_gen_result r = {.finish = TLLM_FINISH_INTERRUPTED, .n_prompt = q->n_prompt};
        s->head = q->next;
        s->done(s->arg, q->user, TLLM_OK, NULL, &r);
        req_free(q);
    }
    s->tail = NULL;
    s->n_waiting = 0;
}

void tllm_sched_free(struct tllm_sched *s) {
    if (!s) return;
    if (s->seqs) tllm_sched_drop_all(s);
    tllm_backend_free(s->cpu);
    if (s->bound) s->p.dev->ops->use_kv(s->p.dev, NULL);
    tllm_kv_free(s->kv);
    free(s->seqs);
    free(s->order);
    free(s->ids);
    free(s->pos);
    free(s->sq);
    free(s->out);
    free(s->row_slot);
    free(s->tok_slot);
    free(s->logits);
    free(s->next);
    free(s->want);
    free(s->mask);
    free(s->gms);
    free(s->allow);
    free(s->keys);
    free(s->lists);
    for (int i = 0; i < TLLM_SCHED_KEPT_GRAMMARS; i++) tllm_gmatch_free(s->kept[i]), tllm_grammar_free(s->kept_g[i]);
    tllm_vocab_index_free(s->vi); /* after the automata, which walk it */
    free(s->raw);
    free(s);
}

int tllm_sched_submit(struct tllm_sched *s, const struct tllm_sched_req *r) {
    struct req *q = calloc(1, sizeof *q);
    if (!q) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    q->n_prompt = r->n_prompt > 0 ? r->n_prompt : 0;
    q->prompt = malloc((size_t)q->n_prompt * sizeof *q->prompt + 1);
    q->eos = malloc((size_t)r->n_eos * sizeof *q->eos + 1);
    q->stop = calloc((size_t)r->n_stop + 1, sizeof *q->stop);
    int ok = q->prompt && q->eos && q->stop;
    for (int i = 0; ok && i < r->n_stop; i++) ok = (q->stop[i] = strdup(r->stop[i])) != NULL;
    q->gp.n_stop = r->n_stop;
    if (!ok) {
        req_free(q);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    if (q->n_prompt) memcpy(q->prompt, r->prompt, (size_t)q->n_prompt * sizeof *q->prompt);
    if (r->n_eos) memcpy(q->eos, r->eos, (size_t)r->n_eos * sizeof *q->eos);
    q->sampling = r->sampling;
    q->gp.max_new = r->max_new;
    q->gp.eos = q->eos, q->gp.n_eos = r->n_eos;
    q->gp.stop = (const char *const *)q->stop;
    q->gp.skip_special = r->skip_special;
    q->gp.grammar = r->grammar;
    q->cb = r->cb, q->user = r->user;
    q->on_token = r->on_token;
    q->top_logprobs = r->top_logprobs < 0 ? 0 : r->top_logprobs > TLLM_SCHED_MAX_TOP ? TLLM_SCHED_MAX_TOP : r->top_logprobs;
    if (s->tail) s->tail->next = q;
    else s->head = q;
    s->tail = q;
    s->n_waiting++;
    return TLLM_OK;
}

/* Positions a request can take: its prompt and every generated token but the last (never fed) */
static int positions_for(const struct tllm_sched *s, const struct req *q) {
    if (q->gp.max_new < 0) return s->n_ctx;
    long n = (long)q->n_prompt + (q->gp.max_new > 1 ? q->gp.max_new - 1 : 0);
    return n < s->n_ctx ? (int)n : s->n_ctx;
}

/* The earlier-admitted sequence still prefilling whose prompt begins like q's for the most whole
 * blocks beyond what q found cached: q waits for those blocks instead of computing them too. */
static void find_lead(struct tllm_sched *s, int slot) {
    struct seq *q = &s->seqs[slot];
    q->lead = -1;
    for (int i = 0; i < s->n_running; i++) {
        const struct seq *o = &s->seqs[s->order[i]];
        if (o->decoding || s->order[i] == slot) continue;
        int n = o->rq->n_prompt < q->rq->n_prompt - 1 ? o->rq->n_prompt : q->rq->n_prompt - 1, c = 0;
        while (c < n && o->rq->prompt[c] == q->rq->prompt[c]) c++;
        c = c / TLLM_KV_BLOCK * TLLM_KV_BLOCK;
        if (c > q->n_done && c > q->common) q->lead = s->order[i], q->lead_serial = o->serial, q->common = c;
    }
}

/* A running sequence under grammar g, or a kept automaton of g (its masks serve a new sequence on g
 * too), or NULL */
static struct tllm_gmatch *same_grammar(struct tllm_sched *s, const struct tllm_grammar *g) {
    for (int i = 0; i < s->n_running; i++) {
        struct tllm_gmatch *gm = s->seqs[s->order[i]].smp.gm;
        if (gm && tllm_gmatch_grammar(gm) == g) return gm;
    }
    for (int i = 0; i < TLLM_SCHED_KEPT_GRAMMARS; i++)
        if (s->kept[i] && tllm_gmatch_grammar(s->kept[i]) == g) return s->kept[i];
    return NULL;
}

/* Keep gm's automaton (a sequence of its own at the grammar's start, which never moves), in place of
 * the one kept longest. Only a cache: when it cannot be made, nothing is lost but its masks. */
static void keep_grammar(struct tllm_sched *s, const struct req *rq, struct tllm_gmatch *gm) {
    for (int i = 0; i < TLLM_SCHED_KEPT_GRAMMARS; i++)
        if (s->kept[i] && tllm_gmatch_shares(s->kept[i], gm)) return;
    struct tllm_gmatch *k;
    if (tllm_gmatch_init(&k, rq->gp.grammar, s->vi, rq->gp.eos, rq->gp.n_eos, gm)) return;
    int i = s->kept_next;
    s->kept_next = (i + 1) % TLLM_SCHED_KEPT_GRAMMARS;
    tllm_gmatch_free(s->kept[i]);
    tllm_grammar_free(s->kept_g[i]);
    s->kept[i] = k;
    s->kept_g[i] = tllm_grammar_ref((struct tllm_grammar *)rq->gp.grammar); /* grammars are shared by count */
}

/* Masks walked so far by q's automaton (0 without a grammar): the difference across a call is the
 * walks it made (an automaton's sequences are used from this one thread) */
static long walks_of(const struct seq *q) {
    long computed = 0, cached;
    if (q->smp.gm) tllm_gmatch_counts(q->smp.gm, &computed, &cached);
    return computed;
}

/* tllm_sampler_allowed, counting the walks it made */
static int row_list(struct tllm_sched *s, struct seq *q, const int32_t **list, int *n, int *allows) {
    long w0 = walks_of(q);
    int r = tllm_sampler_allowed(&q->smp, list, n, allows);
    s->st.grammar_walks += walks_of(q) - w0;
    return r;
}

static void admit(struct tllm_sched *s) {
    const struct tllm_config *c = &s->m->cfg;
    while (s->head && s->n_running < s->p.n_parallel) {
        struct req *rq = s->head;
        char msg[300] = "";
        int erc = TLLM_ERR_LIMIT;
        for (int i = 0; i < rq->n_prompt && !msg[0]; i++)
            if (rq->prompt[i] < 0 || rq->prompt[i] >= c->vocab_size)
                snprintf(msg, sizeof msg, "token id %d is out of range [0, %d)", rq->prompt[i], c->vocab_size), erc = TLLM_ERR_ARG;
        if (msg[0]) {
        } else if (!rq->n_prompt)
            snprintf(msg, sizeof msg, "the prompt is empty"), erc = TLLM_ERR_ARG;
        else if (rq->n_prompt > s->n_ctx)
            snprintf(msg, sizeof msg, "the prompt (%d tokens) does not fit in a sequence's context (%d tokens)", rq->n_prompt, s->n_ctx);
        int slot = 0, kvs = -1, need = positions_for(s, rq);
        if (!msg[0] && tllm_kv_blocks_for(need) > s->kv->n_blocks)
            snprintf(msg, sizeof msg, "the request needs %d KV positions; the cache has %d", need, s->kv->n_blocks * TLLM_KV_BLOCK);
        if (!msg[0]) {
            while (s->seqs[slot].active) slot++;
            if (tllm_kv_seq_open(s->kv, &kvs)) snprintf(msg, sizeof msg, "%s", tllm_errmsg());
        }
        if (!msg[0]) {
            int reused = tllm_kv_seq_reuse(s->kv, kvs, rq->prompt, rq->n_prompt);
            if (tllm_kv_seq_blocks_needed(s->kv, kvs, need) > tllm_kv_n_free(s->kv)) {
                tllm_kv_seq_close(s->kv, kvs); /* waits for blocks: requests are admitted in order */
                return;
            }
            if (tllm_kv_seq_reserve(s->kv, kvs, need)) snprintf(msg, sizeof msg, "%s", tllm_errmsg());
            struct seq *q = &s->seqs[slot];
            memset(q, 0, sizeof *q);
            if (!msg[0] && tllm_sampler_init(&q->smp, &rq->sampling, c->vocab_size))
                snprintf(msg, sizeof msg, "%s", tllm_errmsg()), erc = TLLM_ERR_ARG;
            if (!msg[0]) {
                tllm_sampler_limit(&q->smp, s->m->n_sample);
                for (int i = 0; i < rq->n_prompt; i++) tllm_sampler_accept(&q->smp, rq->prompt[i]);
                if (rq->gp.grammar && tllm_gen_constrain(&q->smp, s->tok, &rq->gp, &s->vi, same_grammar(s, rq->gp.grammar))) {
                    snprintf(msg, sizeof msg, "%s", tllm_errmsg()), erc = TLLM_ERR_ARG;
                    tllm_sampler_free(&q->smp);
                } else if (rq->gp.grammar)
                    keep_grammar(s, rq, q->smp.gm);
            }
            if (msg[0]) tllm_kv_seq_close(s->kv, kvs);
            else {
                q->rq = rq, q->active = 1, q->serial = ++s->serial, q->kv = kvs, q->n_done = reused;
                q->r.n_prompt = rq->n_prompt;
                q->r.n_reused = reused;
                tllm_gen_stream_init(&q->g, s->tok, &q->smp, &rq->gp, rq->cb, rq->user, &q->r);
                q->t_admit = tllm_now();
                s->st.reused_tokens += reused;
                s->order[s->n_running++] = slot;
                find_lead(s, slot);
            }
        }
        s->head = rq->next;
        if (!s->head) s->tail = NULL;
        s->n_waiting--;
        if (msg[0]) {
            s->done(s->arg, rq->user, erc, msg, NULL);
            req_free(rq);
        }
    }
}

/* A prefilling sequence sits this step out while the sequence it shares a prefix with has not yet
 * written the next block it would compute. */
static int waits_for_lead(struct tllm_sched *s, struct seq *q) {
    if (q->lead < 0) return 0;
    const struct seq *o = &s->seqs[q->lead];
    if (!o->active || o->serial != q->lead_serial || q->n_done + TLLM_KV_BLOCK > q->common) {
        q->lead = -1;
        return 0;
    }
    return o->n_done < q->n_done + TLLM_KV_BLOCK;
}

/* The log-softmax of a row's first n logits at `id`, and its `k` best ids and values (best first) */
static float log_probs(const float *x, int n, int32_t id, int k, int32_t *top_ids, float *top_lps) {
    float lse = (float)tllm_logsumexp(x, n);
    int m = 0; /* insertion into a sorted list of at most k: k is small */
    for (int i = 0; i < n && k > 0; i++) {
        if (m == k && x[i] <= top_lps[m - 1]) continue;
        int j = m < k ? m++ : m - 1;
        while (j > 0 && top_lps[j - 1] < x[i]) top_lps[j] = top_lps[j - 1], top_ids[j] = top_ids[j - 1], j--;
        top_lps[j] = x[i], top_ids[j] = i;
    }
    for (int j = 0; j < m; j++) top_lps[j] -= lse;
    return x[id] - lse;
}

/* After a sequence's logits (or, NULL, its greedy pick `best`): sample, take the token, and end it or
 * queue the token for the next step */
static void advance(struct tllm_sched *s, int slot, float *logits, int32_t best) {
    struct seq *q = &s->seqs[slot];
    if (!q->decoding) {
        q->decoding = 1;
        q->t_first = tllm_now();
        q->r.prompt_secs = q->t_first - q->t_admit;
    }
    if (q->rq->gp.max_new >= 0 && (int)q->r.ids.len >= q->rq->gp.max_new) {
        retire(s, slot, TLLM_OK, NULL, 0);
        return;
    }
    int n_vocab = s->m->cfg.vocab_size;
    if (q->rq->on_token) { /* sampling changes the row (penalties): logprobs come from it as it was */
        if (!s->raw && !(s->raw = malloc((size_t)n_vocab * sizeof *s->raw))) {
            retire(s, slot, TLLM_ERR_NOMEM, "out of memory", 0);
            return;
        }
        memcpy(s->raw, logits, (size_t)n_vocab * sizeof *s->raw);
    }
    long w0 = walks_of(q);
    int32_t id = logits ? tllm_sampler_sample(&q->smp, logits) : tllm_sampler_take(&q->smp, best);
    s->st.grammar_walks += walks_of(q) - w0;
    size_t kept = q->r.ids.len;
    int done, rc = tllm_gen_stream_take(&q->g, id, &done);
    s->st.gen_tokens++;
    if (!rc && q->rq->on_token && q->r.ids.len > kept) {
        int32_t top_ids[TLLM_SCHED_MAX_TOP];
        float top_lps[TLLM_SCHED_MAX_TOP];
        int k = q->rq->top_logprobs, n = s->m->n_sample < n_vocab ? s->m->n_sample : n_vocab;
        float lp = log_probs(s->raw, n, id, k, top_ids, top_lps);
        q->rq->on_token(q->rq->user, id, lp, top_ids, top_lps, k < n ? k : n);
    }
    if (rc) retire(s, slot, rc, tllm_errmsg(), 0);
    else if (done || (q->rq->gp.max_new >= 0 && (int)q->r.ids.len >= q->rq->gp.max_new)) /* the last token is never fed */
        retire(s, slot, TLLM_OK, NULL, 0);
    else if (q->n_done >= s->n_ctx) {
        q->r.finish = TLLM_FINISH_CONTEXT;
        retire(s, slot, TLLM_OK, NULL, 0);
    } else
        q->next = id;
}

/* The key of a grammar's list of ids (tllm_sampler_allowed's) among the *n_keys of this step: lists
 * equal to one met before share its key; a new one is copied (the grammar's own list is valid only until
 * another sequence on its automaton moves). Sets *fresh when it is new; -1: out of memory. */
static int list_key(struct tllm_sched *s, int *n_keys, size_t *used, const int32_t *list, int n, int allows, int *fresh) {
    int k = 0;
    while (k < *n_keys && (s->keys[k].n != n || s->keys[k].allows != allows || memcmp(s->lists + s->keys[k].off, list, (size_t)n * sizeof *list)))
        k++;
    *fresh = k == *n_keys;
    if (!*fresh) return k;
    if (k == s->cap_keys) {
        int cap = 2 * k + 4;
        struct mask_key *ks = realloc(s->keys, (size_t)cap * sizeof *ks);
        if (!ks) return -1;
        s->keys = ks, s->cap_keys = cap;
    }
    if (*used + (size_t)n > s->cap_lists) {
        size_t cap = 2 * (*used + (size_t)n);
        int32_t *l = realloc(s->lists, cap * sizeof *l);
        if (!l) return -1;
        s->lists = l, s->cap_lists = cap;
    }
    memcpy(s->lists + *used, list, (size_t)n * sizeof *list);
    s->keys[k] = (struct mask_key){*used, n, allows};
    *used += (size_t)n;
    (*n_keys)++;
    return k;
}

/* The masks of the step's greedy rows under a grammar (struct tllm_batch's fill_masks: called by the
 * backend once the step's layers are queued, so a device computes while the grammars' lists are found
 * or walked here). Rows in one grammar state (all of a batch inside a JSON string) share one bitset. */
static int fill_masks(void *user, const int32_t **mask, const uint32_t **allow) {
    struct tllm_sched *s = user;
    double t0 = tllm_now();
    int n_words = TLLM_MASK_WORDS(s->m->cfg.vocab_size), n_masks = 0, n_gm = 0, walked = 0;
    size_t used = 0;
    /* the states first met in this step are walked on the pool's number of threads at once */
    for (int j = 0; j < s->n_rows; j++)
        if (s->seqs[s->row_slot[j]].smp.gm) s->gms[n_gm++] = s->seqs[s->row_slot[j]].smp.gm;
    int rc = tllm_gmatch_prepare(s->gms, n_gm, tllm_threadpool_size(), &walked);
    if (rc) return rc;
    s->st.grammar_walks += walked;
    for (int j = 0; j < s->n_rows; j++) {
        struct seq *q = &s->seqs[s->row_slot[j]];
        s->mask[j] = -1;
        const int32_t *list;
        int n, allows, fresh;
        if (s->want[j] || !row_list(s, q, &list, &n, &allows)) continue;
        int k = list_key(s, &n_masks, &used, list, n, allows, &fresh);
        if (k < 0) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        if (fresh) {
            if (n_masks > s->cap_allow) {
                uint32_t *a = realloc(s->allow, (size_t)s->cap_keys * n_words * sizeof *a);
                if (!a) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
                s->allow = a, s->cap_allow = s->cap_keys;
            }
            uint32_t *w = s->allow + (size_t)k * n_words;
            memset(w, allows ? 0 : 0xff, (size_t)n_words * sizeof *w);
            for (int i = 0; i < n && list[i] < 32 * n_words; i++) {
                if (allows) w[list[i] >> 5] |= 1u << (list[i] & 31);
                else w[list[i] >> 5] &= ~(1u << (list[i] & 31));
            }
        }
        s->mask[j] = k;
    }
    *mask = n_masks ? s->mask : NULL;
    *allow = n_masks ? s->allow : NULL;
    s->st.mask_secs += tllm_now() - t0;
    return TLLM_OK;
}

/* What the step brings back for each row: a row whose pick is the argmax of its logits (greedy, under
 * its grammar's mask if it has one) only its argmax (from a device, 4 bytes, not the row's 600 KB),
 * the others their logits. Each row's choice is its own: what comes back for a row never depends on
 * its neighbours. Sets b's per-row outputs (the masks come from fill_masks) and which of logits and
 * argmax the step fills. */
static void pick_outputs(struct tllm_sched *s, int n_rows, struct tllm_batch *b, float **logits, int32_t **argmax) {
    int n_logits = 0, n_masked = 0;
    for (int j = 0; j < n_rows; j++) {
        struct seq *q = &s->seqs[s->row_slot[j]];
        s->want[j] = !tllm_sampler_is_masked_greedy(&q->smp) || q->rq->on_token;
        n_logits += s->want[j];
        n_masked += !s->want[j] && q->smp.gm;
    }
    s->n_rows = n_rows;
    b->want_logits = n_logits > 0 && n_logits < n_rows ? s->want : NULL;
    b->fill_masks = n_masked ? fill_masks : NULL;
    b->user = s;
    *logits = n_logits > 0 ? s->logits : NULL;
    *argmax = n_logits < n_rows ? s->next : NULL;
}

struct sample_args {
    struct tllm_sched *s;
    int n_rows;
};

/* The rows that sample from their logits, shared out: temperature sampling over Qwen's vocabulary is
 * ~1.7 ms a row, 64 rows a step are 30x a device's forward step. Each row's sampler is its own (its rng,
 * its history): the same picks in any order on any thread. A row under a grammar picks among its list
 * as copied by sample_rows (mask[j]); its grammar moves later, on the scheduler's thread (take). A row
 * sampled here becomes a row with its pick in next. */
static void sample_task(void *arg, int ith, int nth) {
    struct sample_args *a = arg;
    struct tllm_sched *s = a->s;
    for (int j = ith; j < a->n_rows; j += nth) {
        struct seq *q = &s->seqs[s->row_slot[j]];
        if (!s->want[j] || q->rq->on_token) continue;
        float *row = s->logits + (size_t)j * s->m->cfg.vocab_size;
        if (q->smp.gm) {
            const struct mask_key *k = &s->keys[s->mask[j]];
            s->next[j] = tllm_sampler_sample_allowed(&q->smp, row, s->lists + k->off, k->n, k->allows);
        } else
            s->next[j] = tllm_sampler_sample(&q->smp, row);
        s->want[j] = 0;
    }
}

/* Sample the rows that brought back logits on the thread pool (where it has threads and two rows or
 * more would use them): their grammars' lists are fetched here first, one thread at a time. */
static int sample_rows(struct tllm_sched *s, int n_rows) {
    int n_sampled = 0, n_keys = 0, fresh;
    size_t used = 0;
    for (int j = 0; j < n_rows; j++) {
        struct seq *q = &s->seqs[s->row_slot[j]];
        n_sampled += s->want[j] && !q->rq->on_token;
    }
    if (n_sampled < 2 || tllm_threadpool_size() < 2) return TLLM_OK;
    for (int j = 0; j < n_rows; j++) {
        struct seq *q = &s->seqs[s->row_slot[j]];
        const int32_t *list;
        int n, allows;
        if (!s->want[j] || q->rq->on_token || !row_list(s, q, &list, &n, &allows)) continue;
        if ((s->mask[j] = list_key(s, &n_keys, &used, list, n, allows, &fresh)) < 0) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    struct sample_args sa = {s, n_rows};
    tllm_parallel(sample_task, &sa);
    return TLLM_OK;
}

int tllm_sched_step(struct tllm_sched *s) {
    admit(s);
    int n = 0, n_rows = 0;
    /* generated tokens first (the batch's n_gen), then prompt chunks within the budget */
    for (int i = 0; i < s->n_running; i++) {
        struct seq *q = &s->seqs[s->order[i]];
        if (!q->decoding) continue;
        s->ids[n] = q->next, s->pos[n] = q->n_done, s->sq[n] = q->kv, s->out[n] = 1, s->tok_slot[n] = s->order[i];
        s->row_slot[n_rows++] = s->order[i];
        n++;
    }
    int n_gen = n;
    for (int i = 0; i < s->n_running && n < s->p.n_batch; i++) {
        struct seq *q = &s->seqs[s->order[i]];
        if (q->decoding) continue;
        int before = q->n_done;
        q->n_done = tllm_kv_seq_reuse(s->kv, q->kv, q->rq->prompt, q->rq->n_prompt);
        s->st.reused_tokens += q->n_done - before;
        q->r.n_reused += q->n_done - before;
        if (waits_for_lead(s, q)) continue;
        int k = q->rq->n_prompt - q->n_done;
        if (k > s->p.n_batch - n) k = s->p.n_batch - n;
        for (int j = 0; j < k; j++, n++) {
            s->ids[n] = q->rq->prompt[q->n_done + j], s->pos[n] = q->n_done + j, s->sq[n] = q->kv;
            s->out[n] = 0, s->tok_slot[n] = s->order[i];
        }
        if (q->n_done + k == q->rq->n_prompt) {
            s->out[n - 1] = 1;
            s->row_slot[n_rows++] = s->order[i];
        }
    }
    if (n == 0) return TLLM_OK;
    struct tllm_batch b = {.n = n, .id = s->ids, .pos = s->pos, .seq = s->sq, .out = s->out, .n_gen = n_gen};
    float *logits = NULL;
    int32_t *argmax = NULL;
    pick_outputs(s, n_rows, &b, &logits, &argmax);
    double t0 = tllm_now();
    int rc = s->run->ops->step(s->run, &b, logits, argmax);
    s->st.step_secs += tllm_now() - t0;
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", tllm_errmsg());
        tllm_sched_drop_all(s); /* their callbacks may call into the engine: the message is kept */
        return tllm_fail(rc, "%s", msg);
    }
    s->st.steps++;
    s->st.prompt_tokens += n - n_gen;
    for (int t = 0; t < n;) { /* each sequence's tokens are written: commit them */
        int t1 = t;
        while (t1 < n && s->sq[t1] == s->sq[t]) t1++;
        struct seq *q = &s->seqs[s->tok_slot[t]];
        if ((rc = tllm_kv_seq_commit(s->kv, q->kv, s->ids + t, t1 - t))) {
            tllm_sched_drop_all(s);
            return tllm_fail(rc, "out of memory");
        }
        q->n_done += t1 - t;
        t = t1;
    }
    if ((rc = sample_rows(s, n_rows))) {
        tllm_sched_drop_all(s);
        return rc;
    }
    for (int j = 0; j < n_rows; j++)
        advance(s, s->row_slot[j], s->want[j] ? s->logits + (size_t)j * s->m->cfg.vocab_size : NULL, s->want[j] ? 0 : s->next[j]);
    return TLLM_OK;
}

int tllm_sched_waiting(const struct tllm_sched *s) { return s->n_waiting; }
int tllm_sched_running(const struct tllm_sched *s) { return s->n_running; }
void tllm_sched_stats(const struct tllm_sched *s, struct tllm_sched_stats *st) { *st = s->st; }

void tllm_sched_kv_blocks(const struct tllm_sched *s, int *n_free, int *n_total) {
    *n_free = tllm_kv_n_free(s->kv);
    *n_total = s->kv->n_blocks;
}
