/* The public API (engine/tllm.h) over the engine's modules: an engine is a loaded model with its
 * tokenizer, chat template and generation defaults; a session is a context (KV cache) with the device
 * that decodes for it and the tokens its cache holds, so a prompt that repeats an earlier one's
 * beginning computes only the rest. */
#include "engine/api.h"

#include "kernels/cpu/cpu_features.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/registry.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "engine/convert/convert.h"
#include "engine/grammar/json_schema.h"
#include "engine/load/checkpoint.h"
#include "engine/load/gguf_vocab.h"
#include "engine/load/model_path.h"

#define DEFAULT_MAX_TOKENS 256
#define DEFAULT_N_CTX 4096

void tllm_free(void *p) { free(p); }

const char *tllm_version(void) { return TLLM_VERSION; }

int tllm_engine_open(const char *model, const struct tllm_engine_params *params, struct tllm_engine **out) {
    static const struct tllm_engine_params defaults = {0};
    const struct tllm_engine_params *p = params ? params : &defaults;
    *out = NULL;
    if (p->quantize_bits && p->quantize_bits != 2 && p->quantize_bits != 4 && p->quantize_bits != 8)
        return tllm_fail(TLLM_ERR_ARG, "quantize_bits %d: 2, 4 or 8", p->quantize_bits);
    struct tllm_engine *e = calloc(1, sizeof *e);
    if (!e) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    enum tllm_model_origin origin;
    int rc = tllm_model_locate(model, &e->dir, &origin);
    if (!rc) rc = tllm_engine_load(e, e->dir, p);
    if (rc) {
        tllm_engine_free(e);
        return rc;
    }
    *out = e;
    return TLLM_OK;
}

static void add_eos(struct tllm_gen_defaults *d, int64_t id) {
    for (int i = 0; i < d->n_eos; i++)
        if (d->eos[i] == id) return;
    if (id >= 0 && d->n_eos < TLLM_MAX_EOS) d->eos[d->n_eos++] = (int32_t)id;
}

/* Where generation stops for a GGUF file (which has no generation_config.json), as llama.cpp decides it:
 * the eos, eot and eom ids the file names, and the end-of-text and end-of-turn control tokens of the
 * vocabulary (Qwen's <|endoftext|> and <|im_end|>) */
static int gguf_stop_ids(struct tllm_engine *e) {
    static const char *const keys[] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    for (int i = 0; i < 2; i++) {
        int64_t id;
        int rc = tllm_gguf_get_int(e->m->gguf, keys[i], 0, e->m->cfg.vocab_size - 1, -1, &id, NULL);
        if (rc) return rc;
        add_eos(&e->gd, id);
    }
    static const char *const texts[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>"};
    for (int i = 0; e->tok && i < 4; i++) {
        int32_t id = tllm_tok_find(e->tok, texts[i]);
        if (id >= 0 && tllm_tok_is_special(e->tok, id)) add_eos(&e->gd, id);
    }
    return TLLM_OK;
}

/* The CPU thread pool is the process's, shared by its engines: the first starts it, the last stops it
 * (a context's scratch is sized for the pool, so it is never restarted under an open engine) */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static int pool_engines;

static int pool_join(int threads) {
    int rc = TLLM_OK;
    pthread_mutex_lock(&pool_lock);
    if (pool_engines == 0) rc = tllm_threadpool_start(threads);
    else if (threads > 0 && threads != tllm_threadpool_size())
        rc = tllm_fail(TLLM_ERR_ARG, "threads %d: another engine of this process runs on %d (the CPU thread pool is the "
                                     "process's; give 0 to share it)", threads, tllm_threadpool_size());
    if (!rc) pool_engines++;
    pthread_mutex_unlock(&pool_lock);
    return rc;
}

static void pool_leave(void) {
    pthread_mutex_lock(&pool_lock);
    if (--pool_engines == 0) tllm_threadpool_stop();
    pthread_mutex_unlock(&pool_lock);
}

int tllm_engine_load(struct tllm_engine *e, const char *dir, const struct tllm_engine_params *p) {
    int rc;
    if ((rc = tllm_cpu_select())) return rc; /* TLLM_CPU names a kernel path this CPU runs */
    if ((rc = pool_join(p->threads))) return rc;
    e->pool = 1;
    if ((rc = tllm_model_load(dir, &e->m))) return rc;
    if (p->quantize_bits && (rc = tllm_model_quantize(e->m, p->quantize_bits, p->group_size ? p->group_size : 64))) return rc;
    if (!p->exact && (rc = tllm_model_pack(e->m))) return rc;
    e->m->decode_levels = p->fast_decode ? 1 : 2;
    e->m->deterministic = p->deterministic;
    /* the tokenizer and chat template: a GGUF file's own, else tokenizer.json and tokenizer_config.json */
    const char *tok_src = e->m->dir;
    char *tj = NULL, *tc = NULL;
    if (e->m->gguf) {
        rc = tllm_gguf_tokenizer(e->m->gguf, &e->tok);
    } else if (!(tj = tllm_path_join(dir, "tokenizer.json")) || !(tc = tllm_path_join(dir, "tokenizer_config.json"))) {
        rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    } else if (tllm_path_present(tj)) {
        tok_src = tj;
        rc = tllm_tok_load(tj, &e->tok);
    }
    if (!rc && e->tok && tllm_tok_n_vocab(e->tok) > e->m->cfg.vocab_size)
        rc = tllm_fail(TLLM_ERR_FORMAT, "%s: the tokenizer has %d ids but the model's vocabulary is %d", tok_src,
                       tllm_tok_n_vocab(e->tok), e->m->cfg.vocab_size);
    if (!rc && e->tok && !p->no_template) {
        if (e->m->gguf) rc = tllm_gguf_chat_template(e->m->gguf, &e->tpl);
        else if (tc && tllm_path_present(tc)) rc = tllm_chat_template_load(tc, &e->tpl);
    }
    if (!rc && e->tok && !p->no_template && p->chat_template) rc = tllm_chat_template_file(p->chat_template, &e->tpl);
    if (!rc) rc = tllm_gen_defaults_load(e->m->gguf ? NULL : dir, e->m, &e->gd);
    if (!rc && e->m->gguf) rc = gguf_stop_ids(e);
    free(tj);
    free(tc);
    if (!rc && e->tok) e->m->n_sample = tllm_tok_n_vocab(e->tok); /* before any backend is made */
    return rc;
}

void tllm_engine_free(struct tllm_engine *e) {
    if (!e) return;
    tllm_chat_template_free(&e->tpl);
    tllm_tok_free(e->tok);
    tllm_model_free(e->m);
    if (e->pool) pool_leave();
    free(e->dir);
    free(e);
}

const char *tllm_engine_dir(const struct tllm_engine *e) { return e->dir; }
int tllm_engine_vocab_size(const struct tllm_engine *e) { return e->m->cfg.vocab_size; }
int tllm_engine_max_context(const struct tllm_engine *e) { return e->m->cfg.max_pos; }
int tllm_engine_has_tokenizer(const struct tllm_engine *e) { return e->tok != NULL; }

static int need_tokenizer(const struct tllm_engine *e) {
    return e->tok ? TLLM_OK : tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: no tokenizer.json", e->dir);
}

/* A buffer's bytes handed over to the caller (NUL-terminated, "" when empty) */
static char *take_text(struct tllm_buf *b) {
    if (!b->data && tllm_buf_append(b, "", 0)) return NULL;
    char *t = b->data;
    memset(b, 0, sizeof *b);
    return t;
}

int tllm_tokenize(const struct tllm_engine *e, const char *text, size_t len, int parse_special, int32_t **ids,
                  size_t *n_ids) {
    *ids = NULL, *n_ids = 0;
    int rc = need_tokenizer(e);
    struct tllm_ids a = {0};
    if (!rc) rc = tllm_tok_encode(e->tok, text, len, parse_special, &a);
    if (rc) {
        tllm_ids_free(&a);
        return rc;
    }
    *ids = a.data, *n_ids = a.len;
    return TLLM_OK;
}

int tllm_detokenize(const struct tllm_engine *e, const int32_t *ids, size_t n_ids, int skip_special, char **text,
                    size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    int rc = need_tokenizer(e);
    struct tllm_buf b = {0};
    if (!rc) rc = tllm_tok_decode(e->tok, ids, n_ids, skip_special, &b);
    size_t n = b.len;
    if (!rc && !(*text = take_text(&b))) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    tllm_buf_free(&b);
    if (!rc && len) *len = n;
    return rc;
}

int tllm_chat_apply(const struct tllm_engine *e, const struct tllm_chat_msg *msgs, int n, int add_generation_prompt,
                    char **text) {
    *text = NULL;
    struct tllm_buf b = {0};
    int rc = n < 0 ? tllm_fail(TLLM_ERR_ARG, "%d messages", n) : tllm_chat_render(&e->tpl, msgs, n, add_generation_prompt, &b);
    if (!rc && !(*text = take_text(&b))) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    tllm_buf_free(&b);
    return rc;
}

int tllm_session_open(struct tllm_engine *e, const struct tllm_session_params *params, struct tllm_session **out) {
    static const struct tllm_session_params defaults = {0};
    const struct tllm_session_params *p = params ? params : &defaults;
    *out = NULL;
    int index = -2, rc = tllm_device_index(p->device, &index);
    if (rc) return rc;
    int max = e->m->cfg.max_pos;
    if (p->n_ctx < 0) return tllm_fail(TLLM_ERR_ARG, "n_ctx %d: negative", p->n_ctx);
    if (p->n_ctx > max)
        return tllm_fail(TLLM_ERR_ARG, "n_ctx %d: longer than the model's %s (%d)", p->n_ctx,
                         e->m->cfg.sliding_window ? "sliding window, which tllm does not run past" : "max_position_embeddings",
                         max);
    struct tllm_session *s = calloc(1, sizeof *s);
    if (!s) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    s->e = e;
    int n_ctx = p->n_ctx ? p->n_ctx : (max < DEFAULT_N_CTX ? max : DEFAULT_N_CTX);
    enum tllm_dtype kv_type = TLLM_DT_F16;
    if (p->kv_type && (rc = tllm_kv_type_parse(p->kv_type, &kv_type))) {
        free(s);
        return rc;
    }
    s->kv_type = kv_type;
    if ((rc = tllm_ctx_init_kv(&s->ctx, e->m, n_ctx, 0, kv_type))) {
        free(s);
        return rc;
    }
    int fell_back; /* auto takes the CPU when a device cannot start; a device named must start */
    if ((rc = tllm_session_use_device(s, index, index == -2 ? &fell_back : NULL))) {
        tllm_session_free(s);
        return rc;
    }
    *out = s;
    return TLLM_OK;
}

int tllm_session_use_device(struct tllm_session *s, int index, int *fell_back) {
    if (fell_back) *fell_back = 0;
    tllm_ctx_use_device(&s->ctx, NULL);
    tllm_backend_free(s->dev);
    s->dev = NULL;
    if (index == -3) return TLLM_OK;
    int rc = tllm_backend_device_init(&s->dev, s->e->m, s->ctx.n_ctx, index);
    if (rc == TLLM_ERR_UNSUPPORTED && index == -2) return TLLM_OK; /* auto, and no GPU: the CPU */
    if (rc && fell_back) { /* the caller runs on the CPU after saying why */
        *fell_back = 1;
        return TLLM_OK;
    }
    if (rc) return rc;
    tllm_backend_describe(s->dev, &s->info);
    tllm_ctx_use_device(&s->ctx, s->dev);
    return TLLM_OK;
}

void tllm_session_free(struct tllm_session *s) {
    if (!s) return;
    tllm_ctx_free(&s->ctx);
    tllm_backend_free(s->dev);
    tllm_ids_free(&s->cached);
    free(s);
}

void tllm_session_reset(struct tllm_session *s) {
    tllm_ctx_reset(&s->ctx);
    s->cached.len = 0;
}

const char *tllm_session_device(const struct tllm_session *s) { return s->dev ? s->info.name : "CPU"; }

int tllm_session_n_ctx(const struct tllm_session *s) { return s->ctx.n_ctx; }
int tllm_session_n_cached(const struct tllm_session *s) { return s->ctx.pos; }

void tllm_generate_params_default(const struct tllm_engine *e, struct tllm_generate_params *p) {
    memset(p, 0, sizeof *p);
    p->sampling = e->gd.sampler;
    p->max_tokens = DEFAULT_MAX_TOKENS;
    p->skip_special = 1;
}

/* How many of the prompt's first tokens the cache holds already (at least one token is left to
 * compute: its logits start the generation) */
static size_t reusable(const struct tllm_session *s, const int32_t *prompt, size_t n) {
    size_t common = 0, held = s->cached.len < (size_t)s->ctx.pos ? s->cached.len : (size_t)s->ctx.pos;
    while (common < held && common < n && s->cached.data[common] == prompt[common]) common++;
    return common == n ? n - 1 : common;
}

int tllm_api_complete(struct tllm_session *s, const int32_t *prompt, size_t n_prompt, const struct tllm_generate_params *p,
                      const struct tllm_grammar *given, tllm_gen_cb cb, void *user, char **text, int32_t **ids,
                      size_t *n_ids, struct tllm_stats *stats) {
    if (text) *text = NULL;
    if (ids) *ids = NULL, *n_ids = 0;
    if (stats) memset(stats, 0, sizeof *stats);
    if (n_prompt == 0) return tllm_fail(TLLM_ERR_ARG, "the prompt is empty");
    if (n_prompt > (size_t)s->ctx.n_ctx)
        return tllm_fail(TLLM_ERR_LIMIT, "the prompt (%zu tokens) does not fit in the context (%d tokens)", n_prompt,
                         s->ctx.n_ctx);
    struct tllm_grammar *grammar = NULL; /* p->json_schema's, owned here */
    int rc = !given && p->json_schema ? tllm_schema_grammar_text(p->json_schema, "json_schema", &grammar) : TLLM_OK;
    if (rc) return rc;
    struct tllm_sampler smp;
    if ((rc = tllm_sampler_init(&smp, &p->sampling, s->e->m->cfg.vocab_size))) {
        tllm_grammar_free(grammar);
        return rc;
    }
    size_t common = reusable(s, prompt, n_prompt);
    tllm_ctx_truncate(&s->ctx, (int)common);
    s->cached.len = common;
    for (size_t i = 0; i < common; i++) tllm_sampler_accept(&smp, prompt[i]); /* the penalties see them */
    struct tllm_gen_params gp = {.max_new = p->max_tokens, .eos = s->e->gd.eos, .n_eos = s->e->gd.n_eos,
                                 .stop = p->stop, .n_stop = p->n_stop, .skip_special = p->skip_special,
                                 .grammar = given ? given : grammar};
    struct tllm_gen_result r;
    rc = tllm_generate(&s->ctx, s->e->tok, &smp, prompt + common, (int)(n_prompt - common), &gp, cb, user, &r);
    tllm_sampler_free(&smp);
    tllm_grammar_free(grammar);
    /* the cache holds the prompt and then the generated ids it was fed, in order */
    if (!rc) rc = tllm_ids_append(&s->cached, prompt + common, n_prompt - common);
    if (!rc) rc = tllm_ids_append(&s->cached, r.ids.data, r.ids.len);
    if ((int)s->cached.len > s->ctx.pos) s->cached.len = (size_t)s->ctx.pos;
    if (!rc && stats) {
        stats->n_prompt = (int)n_prompt;
        stats->n_reused = (int)common;
        stats->n_generated = (int)r.ids.len;
        stats->prompt_secs = r.prompt_secs;
        stats->gen_secs = r.gen_secs;
        stats->finish = r.finish;
    }
    if (!rc && text && !(*text = take_text(&r.text))) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    if (!rc && ids) {
        *n_ids = r.ids.len;
        *ids = r.ids.data;
        memset(&r.ids, 0, sizeof r.ids);
    }
    tllm_gen_result_free(&r);
    if (rc && text) free(*text), *text = NULL;
    return rc;
}

int tllm_session_complete_ids(struct tllm_session *s, const int32_t *prompt, size_t n_prompt,
                              const struct tllm_generate_params *p, tllm_gen_cb cb, void *user, char **text,
                              int32_t **ids, size_t *n_ids, struct tllm_stats *stats) {
    return tllm_api_complete(s, prompt, n_prompt, p, NULL, cb, user, text, ids, n_ids, stats);
}

int tllm_session_complete(struct tllm_session *s, const char *prompt, const struct tllm_generate_params *p,
                          tllm_gen_cb cb, void *user, char **text, struct tllm_stats *stats) {
    int32_t *ids;
    size_t n;
    int rc = tllm_tokenize(s->e, prompt, strlen(prompt), 1, &ids, &n);
    if (rc) return rc;
    rc = tllm_session_complete_ids(s, ids, n, p, cb, user, text, NULL, NULL, stats);
    free(ids);
    return rc;
}

int tllm_session_chat(struct tllm_session *s, const struct tllm_chat_msg *msgs, int n,
                      const struct tllm_generate_params *p, tllm_gen_cb cb, void *user, char **text,
                      struct tllm_stats *stats) {
    char *prompt;
    int rc = need_tokenizer(s->e);
    if (rc || (rc = tllm_chat_apply(s->e, msgs, n, 1, &prompt))) return rc;
    rc = tllm_session_complete(s, prompt, p, cb, user, text, stats);
    free(prompt);
    return rc;
}
