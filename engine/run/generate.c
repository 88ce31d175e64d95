#define _GNU_SOURCE /* memmem */
#include "engine/run/generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "engine/load/checkpoint.h"
#include "base/error.h"
#include "base/json_util.h"

const char *tllm_finish_name(enum tllm_finish f) {
    switch (f) {
    case TLLM_FINISH_STOP: return "stop";
    case TLLM_FINISH_INTERRUPTED: return "interrupted";
    case TLLM_FINISH_TOOL_CALLS: return "tool_calls";
    default: return "length";
    }
}

int tllm_gen_defaults_load(const char *dir, const struct tllm_model *m, struct tllm_gen_defaults *d) {
    memset(d, 0, sizeof *d);
    d->sampler = tllm_sampler_defaults();
    if (m && m->cfg.eos_id >= 0) d->eos[d->n_eos++] = m->cfg.eos_id;
    if (!dir) return TLLM_OK; /* a GGUF file: no generation_config.json */
    char *path = tllm_path_join(dir, "generation_config.json");
    if (!path) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    struct json_object *g = NULL;
    if (!tllm_path_present(path)) { /* no generation_config.json: the defaults stand */
        free(path);
        return TLLM_OK;
    }
    int rc = tllm_json_load_file(path, 1u << 20, &g);
    if (!rc && !json_object_is_type(g, json_type_object)) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: not a JSON object", path);
    double v;
    int64_t k;
    int do_sample = 1;
    if (!rc) rc = tllm_json_bool(g, "do_sample", 1, 1, &do_sample, path);
    if (!rc && !(rc = tllm_json_num(g, "temperature", 0, 100, 1, 1.0, &v, path)))
        d->sampler.temperature = do_sample ? (float)v : 0.0f;
    if (!rc && !(rc = tllm_json_int(g, "top_k", 0, 1 << 24, 1, 0, &k, path))) d->sampler.top_k = (int)k;
    if (!rc && !(rc = tllm_json_num(g, "top_p", 0, 1, 1, 1.0, &v, path))) d->sampler.top_p = (float)v;
    if (!rc && !(rc = tllm_json_num(g, "min_p", 0, 1, 1, 0.0, &v, path))) d->sampler.min_p = (float)v;
    if (!rc && !(rc = tllm_json_num(g, "repetition_penalty", 0.01, 100, 1, 1.0, &v, path)))
        d->sampler.repeat_penalty = (float)v;
    struct json_object *e;
    if (!rc && json_object_object_get_ex(g, "eos_token_id", &e)) {
        if (json_object_is_type(e, json_type_int)) {
            d->n_eos = 0;
            d->eos[d->n_eos++] = json_object_get_int(e);
        } else if (json_object_is_type(e, json_type_array)) {
            d->n_eos = 0;
            for (size_t i = 0; i < json_object_array_length(e) && d->n_eos < TLLM_MAX_EOS; i++)
                d->eos[d->n_eos++] = json_object_get_int(json_object_array_get_idx(e, i));
        }
    }
    json_object_put(g);
    free(path);
    return rc;
}

void tllm_gen_result_free(struct tllm_gen_result *r) {
    tllm_ids_free(&r->ids);
    tllm_buf_free(&r->text);
}

/* How many bytes at the end of text could be the start of a stop string (and must be held back). */
static size_t stop_holdback(const char *text, size_t len, const char *const *stop, int n_stop) {
    size_t hold = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        for (size_t k = sl - 1 < len ? sl - 1 : len; k > hold; k--)
            if (memcmp(text + len - k, stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

void tllm_gen_stream_init(struct tllm_gen_stream *g, struct tllm_tok *tok, struct tllm_sampler *s,
                          const struct tllm_gen_params *p, tllm_gen_cb cb, void *user, struct tllm_gen_result *r) {
    memset(g, 0, sizeof *g);
    g->tok = tok, g->s = s, g->p = p, g->cb = cb, g->user = user, g->r = r;
    r->finish = TLLM_FINISH_LENGTH;
    if (tok) tllm_tok_stream_init(&g->ts, tok, p->skip_special);
}

int tllm_gen_stream_take(struct tllm_gen_stream *g, int32_t id, int *done) {
    const struct tllm_gen_params *p = g->p;
    struct tllm_gen_result *r = g->r;
    int rc, n_stop = g->tok ? p->n_stop : 0;
    *done = 1;
    if (id < 0) { /* a grammar is complete and the model has no EOS id to say so: the text ends */
        r->finish = TLLM_FINISH_STOP;
        return TLLM_OK;
    }
    for (int i = 0; i < p->n_eos; i++)
        if (id == p->eos[i]) {
            r->finish = TLLM_FINISH_STOP;
            return TLLM_OK;
        }
    if ((rc = tllm_ids_push(&r->ids, id))) return rc;
    tllm_sampler_accept(g->s, id);
    if (!g->tok) {
        if (g->cb && g->cb("", 0, g->user)) r->finish = TLLM_FINISH_INTERRUPTED;
        else *done = 0;
        return TLLM_OK;
    }
    if ((rc = tllm_tok_stream_push(&g->ts, id, &r->text))) return rc;
    /* a stop string may have been completed by this token */
    for (int i = 0; i < n_stop && !g->stopped; i++) {
        size_t sl = strlen(p->stop[i]), from = g->emitted > sl ? g->emitted - sl : 0;
        char *hit = sl ? memmem(r->text.data + from, r->text.len - from, p->stop[i], sl) : NULL;
        if (hit) {
            r->text.len = (size_t)(hit - r->text.data);
            r->text.data[r->text.len] = '\0';
            g->stopped = 1;
        }
    }
    size_t safe = g->stopped ? r->text.len : r->text.len - stop_holdback(r->text.data, r->text.len, p->stop, n_stop);
    if (safe > g->emitted && g->cb && g->cb(r->text.data + g->emitted, safe - g->emitted, g->user)) {
        g->emitted = safe;
        r->finish = TLLM_FINISH_INTERRUPTED;
        return TLLM_OK;
    }
    if (safe > g->emitted) g->emitted = safe;
    if (g->stopped) r->finish = TLLM_FINISH_STOP;
    else *done = 0;
    return TLLM_OK;
}

/* Greedy on a device, a step ahead: the step that feeds token k + 1 is queued before the host has
 * read token k + 1 back (its argmax stays on the device), so the device never waits for the host's
 * round trip, detokenizing or callback. Feeds exactly the tokens the one-step loop would: a step
 * queued for a token that ends generation (EOS, a stop string, an interruption) is dropped. */
static int generate_ahead(struct tllm_ctx *ctx, struct tllm_gen_stream *g, int32_t id) {
    const struct tllm_gen_params *p = g->p;
    int rc = TLLM_OK, done = 0, ahead = 0; /* ahead: the step feeding id is queued already */
    while (!rc) {
        if (p->max_new >= 0 && (int)g->r->ids.len >= p->max_new) break;
        if ((rc = tllm_gen_stream_take(g, id, &done)) || done) break;
        if (p->max_new >= 0 && (int)g->r->ids.len >= p->max_new) break; /* the last token is never fed */
        if (!ahead) {
            if (ctx->pos >= ctx->n_ctx) {
                g->r->finish = TLLM_FINISH_CONTEXT;
                break;
            }
            if ((rc = tllm_ctx_greedy_push(ctx, id))) break;
        }
        /* the step feeding the next token, queued before that token is read: needed unless the
         * token ends generation, which the next take finds out */
        ahead = (p->max_new < 0 || (int)g->r->ids.len + 1 < p->max_new) && ctx->pos < ctx->n_ctx;
        if (ahead && (rc = tllm_ctx_greedy_push(ctx, -1))) break;
        rc = tllm_ctx_greedy_pop(ctx, &id);
    }
    if (ctx->n_ahead) tllm_ctx_truncate(ctx, ctx->pos - ctx->n_ahead); /* a queued step for a token not taken */
    return rc;
}

int tllm_generate(struct tllm_ctx *ctx, struct tllm_tok *tok, struct tllm_sampler *s, const int32_t *prompt,
                  int n_prompt, const struct tllm_gen_params *p, tllm_gen_cb cb, void *user,
                  struct tllm_gen_result *r) {
    memset(r, 0, sizeof *r);
    r->n_prompt = n_prompt;
    if (n_prompt <= 0) return tllm_fail(TLLM_ERR_ARG, "the prompt is empty");
    if (n_prompt >= ctx->n_ctx - ctx->pos + 1)
        return tllm_fail(TLLM_ERR_LIMIT, "the prompt (%d tokens) does not fit in the context (%d tokens, %d free)",
                         n_prompt, ctx->n_ctx, ctx->n_ctx - ctx->pos);
    int vocab = ctx->m->cfg.vocab_size;
    float *logits = malloc((size_t)vocab * sizeof(float));
    if (!logits) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    tllm_sampler_limit(s, ctx->m->n_sample); /* never a padding row of the lm_head */
    for (int i = 0; i < n_prompt; i++) tllm_sampler_accept(s, prompt[i]);
    struct tllm_vocab_index *vi = NULL;
    int rc = p->grammar ? tllm_gen_constrain(s, tok, p, &vi, NULL) : TLLM_OK;
    if (rc) {
        free(logits);
        return rc;
    }
    double t0 = tllm_now();
    rc = tllm_ctx_forward(ctx, prompt, n_prompt, logits, TLLM_LOGITS_LAST);
    r->prompt_secs = tllm_now() - t0;
    struct tllm_gen_stream g;
    tllm_gen_stream_init(&g, tok, s, p, cb, user, r);
    t0 = tllm_now();
    if (!rc && tllm_ctx_queues_ahead(ctx) && tllm_sampler_is_greedy(s)) rc = generate_ahead(ctx, &g, tllm_sampler_sample(s, logits));
    else
        while (!rc) {
            if (p->max_new >= 0 && (int)r->ids.len >= p->max_new) break;
            int32_t id = tllm_sampler_sample(s, logits);
            int done;
            if ((rc = tllm_gen_stream_take(&g, id, &done)) || done) break;
            if (p->max_new >= 0 && (int)r->ids.len >= p->max_new) break; /* the last token is never fed */
            if (ctx->pos >= ctx->n_ctx) {
                r->finish = TLLM_FINISH_CONTEXT;
                break;
            }
            rc = tllm_ctx_decode(ctx, id, logits);
        }
    r->gen_secs = tllm_now() - t0;
    if (!rc) rc = tllm_gen_stream_end(&g);
    if (vi) tllm_sampler_constrain(s, NULL);
    tllm_vocab_index_free(vi);
    free(logits);
    return rc;
}

int tllm_gen_constrain(struct tllm_sampler *s, const struct tllm_tok *tok, const struct tllm_gen_params *p,
                       struct tllm_vocab_index **vi, struct tllm_gmatch *share) {
    if (!tok) return tllm_fail(TLLM_ERR_ARG, "a grammar needs the tokenizer");
    int rc = TLLM_OK;
    if (!*vi) rc = tllm_vocab_index_init(tok, s->vocab, vi);
    struct tllm_gmatch *gm = NULL;
    if (!rc && !(rc = tllm_gmatch_init(&gm, p->grammar, *vi, p->eos, p->n_eos, share))) tllm_sampler_constrain(s, gm);
    return rc;
}

int tllm_gen_stream_end(struct tllm_gen_stream *g) {
    struct tllm_gen_result *r = g->r;
    int rc = TLLM_OK;
    if (g->tok && !g->stopped) { /* what was held back is final now */
        rc = tllm_tok_stream_flush(&g->ts, &r->text);
        if (!rc && r->text.len > g->emitted && g->cb) g->cb(r->text.data + g->emitted, r->text.len - g->emitted, g->user);
    }
    if (!rc && !r->text.data) rc = tllm_buf_append(&r->text, "", 0);
    return rc;
}
