/* The public API's batch generation and raw logits (engine/tllm.h): a session's items through the
 * continuous batcher (engine/run/scheduler.h), each reported to the caller once, whatever ends it. */
#include <stdlib.h>
#include <string.h>

#include "engine/api.h"
#include "base/error.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/grammar/json_schema.h"
#include "engine/run/scheduler.h"

/* Ids from the caller, each inside the model's vocabulary ("WHAT: id 9 at 0 is outside ...") */
static int check_ids(const struct tllm_session *s, const int32_t *ids, size_t n, const char *what) {
    int vocab = s->e->m->cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return tllm_fail(TLLM_ERR_ARG, "%s: id %d at %zu is outside the vocabulary (%d)", what, ids[i], i, vocab);
    return TLLM_OK;
}

int tllm_session_logits(struct tllm_session *s, const int32_t *ids, size_t n_ids, int last_only, float *out) {
    if (n_ids == 0) return tllm_fail(TLLM_ERR_ARG, "logits: no ids");
    if (n_ids > (size_t)s->ctx.n_ctx)
        return tllm_fail(TLLM_ERR_LIMIT, "logits: %zu ids do not fit in the context (%d tokens)", n_ids, s->ctx.n_ctx);
    int rc = check_ids(s, ids, n_ids, "logits");
    if (rc) return rc;
    tllm_session_reset(s);
    rc = tllm_ctx_forward(&s->ctx, ids, (int)n_ids, out, last_only ? TLLM_LOGITS_LAST : TLLM_LOGITS_ALL);
    if (!rc) rc = tllm_ids_append(&s->cached, ids, n_ids);
    if (rc) tllm_session_reset(s);
    return rc;
}

/* One call's run: the items, the scheduler, and who has been told what */
struct batch_run {
    struct tllm_session *s;
    const struct tllm_batch_item *items;
    tllm_batch_cb cb;
    void *user;
    struct tllm_generate_params defaults; /* for items without params */
    int stopped;          /* the callback asked to stop: the rest are reported interrupted */
};

/* The item a request came from, until it is reported */
struct batch_job {
    struct batch_run *run;
    size_t index;
    struct tllm_grammar *grammar; /* the item's json_schema's (or its chat request's), or NULL */
    struct tllm_api_chat chat;    /* a chat_json item's tools (its prompt gone to the scheduler) */
};

/* Report one item; a chat_json item's answer (job != NULL) with its tool calls taken out */
static void report(struct batch_run *b, size_t index, int status, const char *error, const struct tllm_gen_result *r,
                   const struct batch_job *job) {
    struct tllm_batch_result res = {.status = status, .error = error ? error : "", .text = ""};
    char *calls = NULL, *content = NULL;
    if (r && job && tllm_api_chat_calls(&job->chat, r->text.data, r->text.len, &calls, &content) < 0)
        status = res.status = TLLM_ERR_NOMEM, res.error = "out of memory", r = NULL;
    if (r) {
        res.text = r->text.data ? r->text.data : "";
        res.len = r->text.len;
        if (calls) res.text = content, res.len = strlen(content), res.tool_calls = calls;
        res.ids = r->ids.data, res.n_ids = r->ids.len;
        res.stats = (struct tllm_stats){.n_prompt = r->n_prompt, .n_reused = r->n_reused, .n_generated = (int)r->ids.len,
                                        .prompt_secs = r->prompt_secs, .gen_secs = r->gen_secs, .finish = r->finish};
    }
    if (calls && res.stats.finish != TLLM_FINISH_INTERRUPTED) res.stats.finish = TLLM_FINISH_TOOL_CALLS;
    if (status) res.stats.finish = TLLM_FINISH_STOP;
    if (b->cb(index, &res, b->user)) b->stopped = 1;
    free(calls);
    free(content);
}

static void on_done(void *arg, void *user, int rc, const char *msg, struct tllm_gen_result *r) {
    struct batch_run *b = arg;
    struct batch_job *j = user;
    report(b, j->index, rc, rc ? (msg ? msg : tllm_errmsg()) : "", rc ? NULL : r, j);
    tllm_grammar_free(j->grammar);
    tllm_api_chat_free(&j->chat);
    free(j);
}

static int stream_cb(const char *text, size_t len, void *user) {
    (void)text, (void)len;
    struct batch_job *j = user;
    return j->run->stopped; /* stopped inside a step: the sequences after the one that asked end too */
}

/* The item's prompt as ids (*ids owned by the caller) */
static int item_prompt(const struct tllm_session *s, const struct tllm_batch_item *it, struct tllm_ids *ids) {
    const struct tllm_engine *e = s->e;
    if (it->prompt || it->msgs) {
        if (!e->tok) return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: no tokenizer.json: give the prompt as ids", e->dir);
        char *text = NULL;
        int rc = it->prompt ? TLLM_OK : tllm_chat_apply(e, it->msgs, it->n_msgs, 1, &text);
        const char *t = it->prompt ? it->prompt : text;
        if (!rc) rc = tllm_tok_encode(e->tok, t, strlen(t), 1, ids);
        free(text);
        if (rc) return rc;
    } else if (it->prompt_ids) {
        int rc = check_ids(s, it->prompt_ids, it->n_prompt_ids, "prompt");
        if (rc) return rc;
        if (tllm_ids_append(ids, it->prompt_ids, it->n_prompt_ids)) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    if (ids->len == 0) return tllm_fail(TLLM_ERR_ARG, "the prompt is empty");
    return TLLM_OK;
}

/* Queue item i, or report why it cannot run. A schema repeated from a recent item shares its grammar
 * (and with it the automaton of allowed tokens the scheduler keeps for sequences on one grammar). */
static int submit(struct batch_run *b, struct tllm_sched *sched, size_t i, struct tllm_grammar_cache *grams) {
    struct tllm_session *s = b->s;
    const struct tllm_batch_item *it = &b->items[i];
    const struct tllm_generate_params *p = it->params ? it->params : &b->defaults;
    struct tllm_ids prompt = {0};
    struct tllm_grammar *g = NULL;
    struct tllm_api_chat chat = {0};
    int as_chat = it->chat_json && !it->prompt && !it->prompt_ids && !it->msgs;
    int rc = as_chat ? tllm_api_chat_prepare(s->e, it->chat_json, p, &chat) : item_prompt(s, it, &prompt);
    if (!rc && as_chat) {
        prompt = chat.prompt, memset(&chat.prompt, 0, sizeof chat.prompt);
        if (chat.grammar) g = tllm_grammar_cache_share(grams, chat.grammar_key, chat.grammar), chat.grammar = NULL;
    }
    if (!rc && !g && p->json_schema) {
        if (!(g = tllm_grammar_cache_find(grams, p->json_schema)) &&
            !(rc = tllm_schema_grammar_text(p->json_schema, "json_schema", &g)))
            tllm_grammar_cache_put(grams, p->json_schema, g);
    }
    if (!rc && p->json_schema && !s->e->tok) rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "json_schema: the model has no tokenizer");
    struct batch_job *j = rc ? NULL : malloc(sizeof *j);
    if (!j) {
        tllm_grammar_free(g);
        tllm_ids_free(&prompt);
        tllm_api_chat_free(&chat);
        if (rc) {
            report(b, i, rc, tllm_errmsg(), NULL, NULL);
            return TLLM_OK;
        }
        report(b, i, TLLM_ERR_NOMEM, "out of memory", NULL, NULL);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    *j = (struct batch_job){.run = b, .index = i, .grammar = g, .chat = chat};
    struct tllm_sched_req rq = {.prompt = prompt.data, .n_prompt = (int)prompt.len, .sampling = p->sampling,
                                .max_new = p->max_tokens, .stop = p->stop, .n_stop = p->n_stop, .eos = s->e->gd.eos,
                                .n_eos = s->e->gd.n_eos, .skip_special = p->skip_special, .cb = stream_cb, .user = j,
                                .grammar = g};
    rc = tllm_sched_submit(sched, &rq);
    tllm_ids_free(&prompt);
    if (rc) { /* not queued: no done callback comes, so it is reported here */
        tllm_grammar_free(g);
        tllm_api_chat_free(&j->chat);
        free(j);
        report(b, i, rc, tllm_errmsg(), NULL, NULL);
    }
    return rc;
}

int tllm_session_generate_batch(struct tllm_session *s, const struct tllm_batch_item *items, size_t n,
                                const struct tllm_batch_params *bp, tllm_batch_cb cb, void *user) {
    static const struct tllm_batch_params defaults = {0};
    if (!bp) bp = &defaults;
    if (!cb) return tllm_fail(TLLM_ERR_ARG, "generate_batch: no callback");
    if (n && !items) return tllm_fail(TLLM_ERR_ARG, "generate_batch: no items");
    if (bp->n_parallel < 0 || bp->n_batch < 0 || bp->kv_tokens < 0)
        return tllm_fail(TLLM_ERR_ARG, "generate_batch: n_parallel %d, n_batch %d, kv_tokens %d: negative", bp->n_parallel,
                         bp->n_batch, bp->kv_tokens);
    /* the session's device runs the batch when it takes many sequences (and prompt steps) */
    struct tllm_backend *dev = s->dev;
    if (dev && (!dev->ops->use_kv || s->info.prefill < 0)) dev = NULL;
    tllm_session_reset(s); /* the device's cache of one sequence is the batch's to overwrite */
    struct tllm_sched_params sp = {.n_parallel = bp->n_parallel ? bp->n_parallel : dev ? TLLM_SCHED_DEFAULT_PARALLEL_DEVICE : TLLM_SCHED_DEFAULT_PARALLEL,
                                   .n_batch = bp->n_batch, .kv_tokens = bp->kv_tokens, .kv_type = s->kv_type,
                                   .n_ctx = s->ctx.n_ctx, .dev = dev};
    struct batch_run b = {.s = s, .items = items, .cb = cb, .user = user};
    tllm_generate_params_default(s->e, &b.defaults);
    struct tllm_sched *sched;
    int rc = tllm_sched_init(&sched, s->e->m, s->e->tok, &sp, on_done, &b);
    if (rc) return rc;
    struct tllm_grammar_cache grams = {0};
    size_t next = 0;
    while (!rc) {
        /* a few items ahead of the running ones: the batcher fills freed slots at once, and a long
         * list of items costs no memory before its turn */
        while (!rc && !b.stopped && next < n && tllm_sched_waiting(sched) < sp.n_parallel)
            rc = submit(&b, sched, next++, &grams);
        if (rc || b.stopped || (!tllm_sched_waiting(sched) && !tllm_sched_running(sched) && next == n)) break;
        rc = tllm_sched_step(sched);
    }
    tllm_grammar_cache_free(&grams);
    tllm_sched_drop_all(sched); /* after a stop or an error: each in flight reported interrupted */
    tllm_sched_free(sched);
    int failed = rc;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", failed ? tllm_errmsg() : "");
    struct tllm_gen_result none = {.finish = TLLM_FINISH_INTERRUPTED};
    tllm_buf_append(&none.text, "", 0);
    for (; next < n; next++) report(&b, next, TLLM_OK, NULL, &none, NULL); /* never queued: nothing lost unsaid */
    tllm_gen_result_free(&none);
    return failed ? tllm_fail(failed, "%s", msg) : TLLM_OK;
}
