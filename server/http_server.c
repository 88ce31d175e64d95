/* tllm serve's HTTP side (http_server.h). */
#define _GNU_SOURCE /* POLLRDHUP: the peer closed its end */
#include "server/http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <json-c/json.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/load/model.h"
#include "server/conn_guard.h"
#include "engine/oai/oai_request.h"
#include "server/oai_response.h"
#include "engine/oai/tool_calls.h"

/* How often a waiting connection looks whether its client is still there */
#ifndef SRV_POLL_MS
#define SRV_POLL_MS 100
#endif

struct srv_server {
    struct srv_params p;
    struct MHD_Daemon *d;
    pthread_mutex_t tok_lk;    /* the tokenizer's encoder keeps a cache: one encode at a time (each stops
                                  past the context's tokens: tllm_tok_encode_max) */
    struct srv_guard *guard;   /* deadlines and bounds of connections without a complete request */
    int draining;              /* stopping: every answer closes its connection (atomic) */
    unsigned long long serial; /* answer ids */
    pthread_mutex_t serial_lk;
    /* grammars of recent requests by what they were compiled from: requests that repeat a schema run
     * under one grammar, so the scheduler's sequences on it share their masks */
    struct tllm_grammar_cache grams;
    pthread_mutex_t gram_lk;
};

/* One request on a connection, from its headers to its answer */
struct conn {
    struct tllm_buf body;
    int too_large;
    double t0;
    char who[64];              /* the client's address, for the log */
};

/* ---- small helpers ---- */

/* rq's grammar: an equal one kept from a recent request, else its own (kept from now on) */
static void share_grammar(struct srv_server *s, struct oai_request *rq) {
    if (!rq->grammar || !rq->grammar_key) return;
    pthread_mutex_lock(&s->gram_lk);
    rq->grammar = tllm_grammar_cache_share(&s->grams, rq->grammar_key, rq->grammar);
    pthread_mutex_unlock(&s->gram_lk);
}

/* Queue r; while the server drains (or where the request's framing cannot be trusted) the connection
 * closes after it */
static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r, int close) {
    if (close) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static int draining(struct srv_server *s) { return __atomic_load_n(&s->draining, __ATOMIC_RELAXED); }

static enum MHD_Result send_body(struct srv_server *s, struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *text, size_t n, int close) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    return queue(c, status, r, close || draining(s));
}

static enum MHD_Result send_json_close(struct srv_server *s, struct MHD_Connection *c, unsigned status,
                                       struct json_object *o, int close) {
    size_t n;
    const char *t = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN, &n);
    enum MHD_Result rc = send_body(s, c, status, "application/json", t, n, close);
    json_object_put(o);
    return rc;
}

static enum MHD_Result send_json(struct srv_server *s, struct MHD_Connection *c, unsigned status, struct json_object *o) {
    return send_json_close(s, c, status, o, 0);
}

static const char *error_type(unsigned status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: case 503: return "server_busy";
    case 500: return "server_error";
    default: return "invalid_request_error";
    }
}

static enum MHD_Result send_error(struct srv_server *s, struct MHD_Connection *c, unsigned status, const char *param,
                                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error_v(struct srv_server *s, struct MHD_Connection *c, unsigned status, int close,
                                    const char *param, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return send_json_close(s, c, status, oai_error(msg, error_type(status), param), close);
}

static enum MHD_Result send_error(struct srv_server *s, struct MHD_Connection *c, unsigned status, const char *param,
                                  const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result rc = send_error_v(s, c, status, 0, param, fmt, ap);
    va_end(ap);
    return rc;
}

/* The key compared in time that does not depend on where the given one differs */
static int key_matches(const char *given, const char *key) {
    size_t n = strlen(key), m = given ? strlen(given) : 0;
    unsigned char d = n != m;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)key[i] ^ (unsigned char)(i < m ? given[i] : 0);
    return d == 0;
}

static int authorized(const struct srv_server *s, struct MHD_Connection *c) {
    if (!s->p.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return key_matches(h, s->p.api_key);
}

/* 1 when the client closed its end: a hang-up, or a read that finds the end of the stream */
static int client_gone(int fd) {
    struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return 1;
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static void answer_id(struct srv_server *s, const char *prefix, char *out, size_t cap) {
    pthread_mutex_lock(&s->serial_lk);
    unsigned long long n = ++s->serial;
    pthread_mutex_unlock(&s->serial_lk);
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != sizeof r) r = (uint32_t)tllm_now();
    snprintf(out, cap, "%s-%08x%08llx", prefix, r, n);
}

static void client_address(struct MHD_Connection *c, char *who, size_t cap) {
    snprintf(who, cap, "?");
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr)
        getnameinfo(ci->client_addr, ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in),
                    who, (socklen_t)cap, NULL, 0, NI_NUMERICHOST);
}

static void log_request(const struct srv_server *s, const char *who, const char *method, const char *url, unsigned status,
                        const struct srv_job *j, double t0) {
    if (s->p.quiet) return;
    if (j)
        fprintf(stderr, "tllm serve: %s %s %s %u: %d prompt tokens (%d cached), %d generated, %s, %.2f s\n", who, method, url,
                status, j->n_prompt, j->n_reused, j->n_generated, j->cancelled ? "cancelled" : tllm_finish_name(j->finish),
                tllm_now() - t0);
    else
        fprintf(stderr, "tllm serve: %s %s %s %u\n", who, method, url, status);
}

/* An error answer with its line in the request log; close: the connection ends after it (a request
 * refused before its body was read, or whose framing cannot be trusted) */
static enum MHD_Result refuse(struct srv_server *s, struct MHD_Connection *c, const struct conn *k, const char *method,
                              const char *url, unsigned status, int close, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
static enum MHD_Result refuse(struct srv_server *s, struct MHD_Connection *c, const struct conn *k, const char *method,
                              const char *url, unsigned status, int close, const char *param, const char *fmt, ...) {
    log_request(s, k->who, method, url, status, NULL, k->t0);
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result rc = send_error_v(s, c, status, close, param, fmt, ap);
    va_end(ap);
    return rc;
}

/* Why a request's framing is ambiguous (RFC 9112 6.3: a proxy in front may have read it otherwise, and
 * what follows the body it saw would be taken for another request here), or NULL */
struct framing {
    int n_length, n_encoding;
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind, (void)value;
    struct framing *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) f->n_length++;
    else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) f->n_encoding++;
    return MHD_YES;
}

static const char *framing_problem(struct MHD_Connection *c) {
    struct framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (f.n_length > 1) return "the request has more than one Content-Length header";
    if (f.n_length && f.n_encoding) return "the request has both Content-Length and Transfer-Encoding headers";
    if (f.n_encoding > 1) return "the request has more than one Transfer-Encoding header";
    return NULL;
}

/* ---- GET endpoints ---- */

static enum MHD_Result get_models(struct srv_server *s, struct MHD_Connection *c) {
    struct json_object *o = json_object_new_object(), *data = json_object_new_array(), *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(s->p.model_name));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64((int64_t)time(NULL)));
    json_object_object_add(m, "owned_by", json_object_new_string("tllm"));
    struct json_object *meta = json_object_new_object();
    json_object_object_add(meta, "n_ctx", json_object_new_int(s->p.n_ctx));
    json_object_object_add(meta, "n_vocab", json_object_new_int(s->p.m->cfg.vocab_size));
    json_object_object_add(m, "meta", meta);
    json_object_array_add(data, m);
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    return send_json(s, c, 200, o);
}

static enum MHD_Result get_health(struct srv_server *s, struct MHD_Connection *c) {
    struct srv_engine_stats st;
    srv_engine_stats(s->p.engine, &st);
    struct json_object *o = json_object_new_object();
    json_object_object_add(o, "status", json_object_new_string(st.failed ? "error" : st.stopping ? "stopping" : "ok"));
    json_object_object_add(o, "requests_processing", json_object_new_int(st.running));
    json_object_object_add(o, "requests_waiting", json_object_new_int(st.live - st.running));
    json_object_object_add(o, "kv_blocks_free", json_object_new_int(st.kv_free));
    json_object_object_add(o, "kv_blocks_total", json_object_new_int(st.kv_total));
    return send_json(s, c, st.failed || st.stopping ? 503 : 200, o);
}

/* Prometheus' text format, as llama-server's and vLLM's /metrics */
static enum MHD_Result get_metrics(struct srv_server *s, struct MHD_Connection *c) {
    struct srv_engine_stats st;
    srv_engine_stats(s->p.engine, &st);
    char t[4096];
    double kv_used = st.kv_total ? (double)(st.kv_total - st.kv_free) / st.kv_total : 0;
    int waiting = st.live - st.running;
    int n = snprintf(t, sizeof t,
             "# HELP tllm_prompt_tokens_total Prompt tokens computed.\n# TYPE tllm_prompt_tokens_total counter\n"
             "tllm_prompt_tokens_total %lld\n"
             "# HELP tllm_prompt_tokens_cached_total Prompt tokens found in the KV cache, not computed.\n"
             "# TYPE tllm_prompt_tokens_cached_total counter\ntllm_prompt_tokens_cached_total %lld\n"
             "# HELP tllm_generated_tokens_total Tokens generated.\n# TYPE tllm_generated_tokens_total counter\n"
             "tllm_generated_tokens_total %lld\n"
             "# HELP tllm_steps_total Forward steps.\n# TYPE tllm_steps_total counter\ntllm_steps_total %lld\n"
             "# HELP tllm_step_seconds_total Time inside forward steps.\n# TYPE tllm_step_seconds_total counter\n"
             "tllm_step_seconds_total %.6f\n"
             "# HELP tllm_requests_total Requests ended, by how.\n# TYPE tllm_requests_total counter\n"
             "tllm_requests_total{result=\"done\"} %lld\ntllm_requests_total{result=\"cancelled\"} %lld\n"
             "tllm_requests_total{result=\"failed\"} %lld\n"
             "# HELP tllm_requests_processing Sequences decoding or prefilling.\n# TYPE tllm_requests_processing gauge\n"
             "tllm_requests_processing %d\n"
             "# HELP tllm_requests_waiting Requests waiting for a sequence slot or KV blocks.\n"
             "# TYPE tllm_requests_waiting gauge\ntllm_requests_waiting %d\n"
             "# HELP tllm_kv_blocks_free KV cache blocks no sequence holds.\n# TYPE tllm_kv_blocks_free gauge\n"
             "tllm_kv_blocks_free %d\n"
             "# HELP tllm_kv_blocks_total KV cache blocks.\n# TYPE tllm_kv_blocks_total gauge\ntllm_kv_blocks_total %d\n",
             st.sched.prompt_tokens, st.sched.reused_tokens, st.sched.gen_tokens, st.sched.steps, st.sched.step_secs,
             st.requests_done, st.requests_cancelled, st.requests_failed, st.running, waiting, st.kv_free,
             st.kv_total);
    /* the load gauges again under the names LLM-aware routers and autoscalers read: vLLM's (the Gateway API
     * inference extension, llm-d, KServe) and llama-server's; vLLM's *_perc are ratios (0-1) despite the name */
    snprintf(t + n, sizeof t - (size_t)n,
             "# HELP tllm_kv_cache_usage_ratio KV cache blocks held by sequences, of all (0-1).\n"
             "# TYPE tllm_kv_cache_usage_ratio gauge\ntllm_kv_cache_usage_ratio %.6f\n"
             "# HELP vllm:num_requests_running tllm_requests_processing under vLLM's name.\n"
             "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %d\n"
             "# HELP vllm:num_requests_waiting tllm_requests_waiting under vLLM's name.\n"
             "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting %d\n"
             "# HELP vllm:gpu_cache_usage_perc tllm_kv_cache_usage_ratio under vLLM's (older) name.\n"
             "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc %.6f\n"
             "# HELP vllm:kv_cache_usage_perc tllm_kv_cache_usage_ratio under vLLM's name.\n"
             "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc %.6f\n"
             "# HELP llamacpp:requests_processing tllm_requests_processing under llama-server's name.\n"
             "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing %d\n"
             "# HELP llamacpp:requests_deferred tllm_requests_waiting under llama-server's name.\n"
             "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred %d\n"
             "# HELP llamacpp:kv_cache_usage_ratio tllm_kv_cache_usage_ratio under llama-server's name.\n"
             "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio %.6f\n",
             kv_used, st.running, waiting, kv_used, kv_used, st.running, waiting, kv_used);
    return send_body(s, c, 200, "text/plain; version=0.0.4", t, strlen(t), 0);
}

/* ---- /tokenize, /detokenize (llama-server's shapes) ---- */

/* The JSON object of a /tokenize or /detokenize request, or NULL with the 400 sent (*rc) */
static struct json_object *tokenizer_body(struct srv_server *s, struct MHD_Connection *c, const struct conn *k,
                                          enum MHD_Result *rc, unsigned *status) {
    char err[200];
    struct json_object *o = oai_json_body(k->body.data ? k->body.data : "", k->body.len, err, sizeof err);
    if (o && !json_object_is_type(o, json_type_object)) snprintf(err, sizeof err, "the request body must be a JSON object");
    else if (o && !s->p.tok) snprintf(err, sizeof err, "the model has no tokenizer");
    else if (o) return o;
    json_object_put(o);
    *status = 400;
    *rc = send_error(s, c, 400, NULL, "%s", err);
    return NULL;
}

static enum MHD_Result post_tokenize(struct srv_server *s, struct MHD_Connection *c, struct conn *k, unsigned *status) {
    enum MHD_Result rc;
    struct json_object *o = tokenizer_body(s, c, k, &rc, status), *content, *pieces;
    if (!o) return rc;
    *status = 400;
    if (!json_object_object_get_ex(o, "content", &content) || !json_object_is_type(content, json_type_string))
        rc = send_error(s, c, 400, "content", "'content' must be a string");
    else {
        const char *t = json_object_get_string(content);
        size_t n = (size_t)json_object_get_string_len(content);
        int with_pieces = json_object_object_get_ex(o, "with_pieces", &pieces) && json_object_get_boolean(pieces);
        struct tllm_ids ids = {0};
        pthread_mutex_lock(&s->tok_lk);
        int over = 0, e = !tllm_utf8_valid_len((const unsigned char *)t, n)
                              ? -1 : tllm_tok_encode_max(s->p.tok, t, n, 1, (size_t)s->p.n_ctx, &ids, &over);
        pthread_mutex_unlock(&s->tok_lk);
        if (over)
            rc = send_error(s, c, 400, "content", "'content' is more than %d tokens (the context size, -c)", s->p.n_ctx);
        else if (e) rc = send_error(s, c, 400, "content", "'content': %s", e < 0 ? "not valid UTF-8 text" : tllm_errmsg());
        else {
            struct json_object *r = json_object_new_object(), *a = json_object_new_array();
            for (size_t i = 0; i < ids.len; i++) {
                if (!with_pieces) {
                    json_object_array_add(a, json_object_new_int(ids.data[i]));
                    continue;
                }
                size_t pl;
                const char *pb = tllm_tok_bytes(s->p.tok, ids.data[i], &pl);
                struct json_object *pc = json_object_new_object();
                json_object_object_add(pc, "id", json_object_new_int(ids.data[i]));
                json_object_object_add(pc, "piece", tllm_utf8_valid_len((const unsigned char *)pb, pl)
                                                        ? json_object_new_string_len(pb, (int)pl) : NULL);
                json_object_array_add(a, pc);
            }
            json_object_object_add(r, "tokens", a);
            *status = 200;
            rc = send_json(s, c, 200, r);
        }
        tllm_ids_free(&ids);
    }
    json_object_put(o);
    return rc;
}

static enum MHD_Result post_detokenize(struct srv_server *s, struct MHD_Connection *c, struct conn *k, unsigned *status) {
    enum MHD_Result rc;
    struct json_object *o = tokenizer_body(s, c, k, &rc, status), *toks;
    if (!o) return rc;
    *status = 400;
    if (!json_object_object_get_ex(o, "tokens", &toks) || !json_object_is_type(toks, json_type_array))
        rc = send_error(s, c, 400, "tokens", "'tokens' must be a list of token ids");
    else {
        size_t n = json_object_array_length(toks);
        int32_t *ids = malloc(n * sizeof *ids + 1);
        int bad = !ids, nv = tllm_tok_n_vocab(s->p.tok);
        for (size_t i = 0; !bad && i < n; i++) {
            struct json_object *e = json_object_array_get_idx(toks, i);
            int64_t v = json_object_get_int64(e);
            bad = !json_object_is_type(e, json_type_int) || v < 0 || v >= nv;
            if (!bad) ids[i] = (int32_t)v;
        }
        struct tllm_buf text = {0};
        if (bad || tllm_tok_decode(s->p.tok, ids, n, 0, &text))
            rc = send_error(s, c, 400, "tokens", "'tokens' must be a list of token ids below %d", nv);
        else {
            struct json_object *r = json_object_new_object();
            json_object_object_add(r, "content", json_object_new_string_len(text.data ? text.data : "", (int)text.len));
            *status = 200;
            rc = send_json(s, c, 200, r);
        }
        tllm_buf_free(&text);
        free(ids);
    }
    json_object_put(o);
    return rc;
}

/* ---- completions ---- */

/* The request's prompt as ids: the chat rendered with the template, or the text, or the ids as given */
static int prompt_ids(struct srv_server *s, const struct oai_request *rq, struct tllm_ids *ids, char *err, size_t cap,
                      const char **param) {
    *param = rq->kind == OAI_CHAT ? "messages" : "prompt";
    if (rq->prompt_ids) {
        for (int i = 0; i < rq->n_prompt_ids; i++)
            if (rq->prompt_ids[i] >= s->p.m->cfg.vocab_size)
                return snprintf(err, cap, "prompt token %d is %d, not below the vocabulary's %d", i, rq->prompt_ids[i],
                                s->p.m->cfg.vocab_size), -1;
        return tllm_ids_append(ids, rq->prompt_ids, (size_t)rq->n_prompt_ids) ? (snprintf(err, cap, "out of memory"), -1) : 0;
    }
    if (!s->p.tok) return snprintf(err, cap, "the model has no tokenizer: give the prompt as token ids"), -1;
    struct tllm_buf text = {0};
    int rc = 0, over = 0;
    if (rq->kind == OAI_CHAT)
        rc = tllm_chat_render_json(s->p.tpl, rq->chat, oai_callable_tools(rq), NULL, 1, &text);
    else rc = tllm_buf_append(&text, rq->prompt, rq->prompt_len);
    if (!rc) { /* encoded no further than the context: a longer prompt is refused for what was read of it */
        pthread_mutex_lock(&s->tok_lk);
        rc = tllm_tok_encode_max(s->p.tok, text.data ? text.data : "", text.len, 1, (size_t)s->p.n_ctx, ids, &over);
        pthread_mutex_unlock(&s->tok_lk);
    }
    tllm_buf_free(&text);
    if (over)
        return snprintf(err, cap, "the prompt is more than %d tokens, longer than the context (%d tokens)", s->p.n_ctx,
                        s->p.n_ctx), -1;
    if (rc) return snprintf(err, cap, "%s", tllm_errmsg()), -1;
    return 0;
}

_Static_assert(OAI_MAX_STOP <= SRV_MAX_STOP, "a request's stop strings fit a job");

/* The job of a request: its prompt, the server's sampling defaults under the request's fields */
static struct srv_job *make_job(struct srv_server *s, struct oai_request *rq, struct tllm_ids *ids) {
    struct srv_job *j = srv_job_new();
    if (!j) return NULL;
    struct tllm_sampler_params sp = s->p.sampling;
    const struct tllm_sampler_params *r = &rq->sp;
    if (rq->set & OAI_SET_TEMP) sp.temperature = r->temperature;
    if (rq->set & OAI_SET_TOPK) sp.top_k = r->top_k;
    if (rq->set & OAI_SET_TOPP) sp.top_p = r->top_p;
    if (rq->set & OAI_SET_MINP) sp.min_p = r->min_p;
    if (rq->set & OAI_SET_REP) sp.repeat_penalty = r->repeat_penalty;
    if (rq->set & OAI_SET_PRES) sp.presence_penalty = r->presence_penalty;
    if (rq->set & OAI_SET_FREQ) sp.frequency_penalty = r->frequency_penalty;
    if (rq->set & OAI_SET_SEED) sp.seed = r->seed;
    else if (getrandom(&sp.seed, sizeof sp.seed, GRND_NONBLOCK) != sizeof sp.seed) /* each request its own draw */
        sp.seed ^= (uint64_t)(tllm_now() * 1e9);
    int n_prompt = (int)ids->len;
    j->prompt = ids->data; /* the job owns the ids from now on */
    *ids = (struct tllm_ids){0};
    /* the request's stop strings, else the server's */
    int n_stop = rq->n_stop ? rq->n_stop : s->p.n_stop;
    for (int i = 0; i < n_stop; i++) j->stop[i] = strdup(rq->n_stop ? rq->stop[i] : s->p.stop[i]);
    j->rq = (struct tllm_sched_req){.prompt = j->prompt, .n_prompt = n_prompt, .sampling = sp, .max_new = rq->max_tokens,
                                    .stop = (const char *const *)j->stop, .n_stop = n_stop, .eos = s->p.gd->eos,
                                    .n_eos = rq->ignore_eos ? 0 : s->p.gd->n_eos, .skip_special = 1, .top_logprobs = rq->top_logprobs};
    j->logprobs = rq->logprobs;
    j->grammar = rq->grammar, j->rq.grammar = rq->grammar; /* the job's now */
    rq->grammar = NULL;
    for (int i = 0; i < n_stop; i++)
        if (!j->stop[i]) {
            srv_job_release(s->p.engine, j);
            return NULL;
        }
    return j;
}

/* Wait for the job to end, watching the client: 1 when it went away (the job is cancelled) */
static int wait_done(struct srv_server *s, struct srv_job *j, int fd) {
    struct srv_engine *e = s->p.engine;
    pthread_mutex_lock(&e->lk);
    while (!j->done) {
        srv_engine_wait(e, SRV_POLL_MS);
        if (j->done) break;
        pthread_mutex_unlock(&e->lk);
        int gone = fd >= 0 && client_gone(fd);
        if (gone) srv_engine_cancel(e, j);
        pthread_mutex_lock(&e->lk);
        if (gone) {
            pthread_mutex_unlock(&e->lk);
            return 1;
        }
    }
    pthread_mutex_unlock(&e->lk);
    return 0;
}

static unsigned job_status(const struct srv_job *j) {
    return j->rc == TLLM_ERR_ARG || j->rc == TLLM_ERR_LIMIT ? 400 : j->cancelled || j->stopped ? 503 : 500;
}

/* A streamed answer: the job, what was sent of it, and the bytes not yet taken by the connection */
struct stream {
    struct srv_server *s;
    struct srv_job *j;
    struct oai_answer a;
    char id[48];
    int fd, include_usage, role_sent, ended;
    int tools, max_calls; /* tools were offered: tool calls are held back, parsed and sent as such */
    struct json_object *tools_json;
    size_t text_sent, lps_sent;
    size_t text_seen;     /* of the job's text, what stream_events has looked at (text_sent or more) */
    struct tllm_buf out;
    size_t out_at;
    char url[64];
    double t0;
    char who[64];
};

/* Under the engine's lock: the events for what the job produced since the last call */
static void stream_events(struct stream *st) {
    struct srv_job *j = st->j;
    size_t nt = j->text.len - st->text_sent, nl = j->n_lps - st->lps_sent;
    if (!st->role_sent && st->a.kind == OAI_CHAT) {
        oai_sse(&st->out, oai_chunk(&st->a, 1, "", 0, NULL, 0, NULL, st->include_usage));
        st->role_sent = 1;
    }
    if (j->done && j->rc) {
        oai_sse(&st->out, oai_error(j->err, error_type(job_status(j)), NULL));
    } else {
        const char *finish = oai_finish(j->finish);
        if (st->tools) { /* text that may be a tool call waits for the answer's end */
            size_t safe = oai_tool_calls_safe(j->text.data ? j->text.data : "", j->text.len, st->text_sent);
            nt = safe > st->text_sent ? safe - st->text_sent : 0;
            if (j->done) {
                struct json_object *calls;
                char *content;
                const char *rest = j->text.data ? j->text.data + st->text_sent + nt : "";
                size_t nrest = j->text.len - st->text_sent - nt;
                if (oai_tool_calls_parse(rest, nrest, st->tools_json, st->max_calls, &calls, &content)) {
                    if (nt || nl || content) {
                        oai_sse(&st->out, oai_chunk(&st->a, 0, j->text.data + st->text_sent, nt, j->lps + st->lps_sent, nl,
                                                    NULL, st->include_usage));
                        nt = nl = 0;
                        if (content) oai_sse(&st->out, oai_chunk(&st->a, 0, content, strlen(content), NULL, 0, NULL, st->include_usage));
                    }
                    for (size_t i = 0; i < json_object_array_length(calls); i++)
                        for (int h = 1; h >= 0; h--)
                            oai_sse(&st->out, oai_tool_chunk(&st->a, (int)i, json_object_array_get_idx(calls, i), h,
                                                             st->include_usage));
                    json_object_put(calls);
                    free(content);
                    finish = "tool_calls";
                } else {
                    nt += nrest; /* not a call: the rest is text */
                }
            }
        }
        if (nt || nl)
            oai_sse(&st->out, oai_chunk(&st->a, 0, j->text.data + st->text_sent, nt, j->lps + st->lps_sent, nl, NULL,
                                        st->include_usage));
        st->text_sent += nt;
        if (j->done) {
            oai_sse(&st->out, oai_chunk(&st->a, 0, "", 0, NULL, 0, finish, st->include_usage));
            if (st->include_usage) oai_sse(&st->out, oai_usage_chunk(&st->a, j));
        }
    }
    if (!st->tools) st->text_sent = j->text.len;
    st->lps_sent = j->n_lps;
    if (j->done) {
        tllm_buf_append(&st->out, "data: [DONE]\n\n", 14);
        st->ended = 1;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream *st = cls;
    struct srv_engine *e = st->s->p.engine;
    for (;;) {
        if (st->out_at < st->out.len) {
            size_t n = st->out.len - st->out_at < max ? st->out.len - st->out_at : max;
            memcpy(buf, st->out.data + st->out_at, n);
            st->out_at += n;
            if (st->out_at == st->out.len) st->out.len = st->out_at = 0;
            return (ssize_t)n;
        }
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&e->lk);
        struct srv_job *j = st->j;
        if (!j->done && j->text.len == st->text_seen && j->n_lps == st->lps_sent && (st->role_sent || st->a.kind != OAI_CHAT))
            srv_engine_wait(e, SRV_POLL_MS);
        int news = j->done || j->text.len > st->text_seen || j->n_lps > st->lps_sent || (!st->role_sent && st->a.kind == OAI_CHAT);
        if (news) stream_events(st), st->text_seen = j->text.len;
        pthread_mutex_unlock(&e->lk);
        if (!news && client_gone(st->fd)) {
            srv_engine_cancel(e, j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    struct stream *st = cls;
    struct srv_engine *e = st->s->p.engine;
    srv_engine_cancel(e, st->j); /* a stream that ended early (the client left) ends its job */
    pthread_mutex_lock(&e->lk);
    while (!st->j->done) srv_engine_wait(e, SRV_POLL_MS); /* for the log line's counts */
    pthread_mutex_unlock(&e->lk);
    log_request(st->s, st->who, "POST", st->url, st->ended ? 200 : 499, st->j, st->t0); /* 499: the client left */
    srv_job_release(e, st->j);
    tllm_buf_free(&st->out);
    json_object_put(st->tools_json);
    free(st);
}

static enum MHD_Result post_completion(struct srv_server *s, struct MHD_Connection *c, struct conn *k, enum oai_kind kind,
                                       const char *url) {
    struct oai_request rq;
    char err[512];
    const char *param = NULL;
    if (oai_request_parse(&rq, kind, k->body.data ? k->body.data : "", k->body.len, err, sizeof err, &param)) {
        oai_request_free(&rq);
        return refuse(s, c, k, "POST", url, 400, 0, param, "%s", err);
    }
    share_grammar(s, &rq);
    struct tllm_ids ids = {0};
    enum MHD_Result rc;
    if (prompt_ids(s, &rq, &ids, err, sizeof err, &param)) {
        rc = refuse(s, c, k, "POST", url, 400, 0, param, "%s", err);
    } else if (ids.len == 0) {
        rc = refuse(s, c, k, "POST", url, 400, 0, param, "the prompt is empty");
    } else if ((long)ids.len > s->p.n_ctx) {
        rc = refuse(s, c, k, "POST", url, 400, 0, param, "the prompt is %zu tokens, longer than the context (%d tokens)", ids.len,
                    s->p.n_ctx);
    } else {
        struct srv_job *j = make_job(s, &rq, &ids);
        const char *why = NULL;
        if (!j) rc = refuse(s, c, k, "POST", url, 500, 0, NULL, "out of memory");
        else {
            if (srv_engine_submit(s->p.engine, j, &why)) {
                rc = !strcmp(why, "busy")
                         ? refuse(s, c, k, "POST", url, 503, 0, NULL,
                                  "the server is busy: %d requests at once at most; try again later", s->p.engine->max_live)
                         : refuse(s, c, k, "POST", url, 503, 1, NULL, "the server is stopping");
                srv_job_release(s->p.engine, j);
            } else if (rq.stream) {
                struct stream *st = calloc(1, sizeof *st);
                struct MHD_Response *r = st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free) : NULL;
                if (!r) {
                    srv_engine_cancel(s->p.engine, j);
                    srv_job_release(s->p.engine, j);
                    free(st);
                    rc = MHD_NO;
                } else {
                    st->s = s, st->j = j, st->fd = conn_fd(c), st->include_usage = rq.include_usage, st->t0 = k->t0;
                    st->tools_json = json_object_get(oai_callable_tools(&rq));
                    st->tools = st->tools_json != NULL;
                    st->max_calls = oai_max_calls(&rq);
                    snprintf(st->who, sizeof st->who, "%s", k->who);
                    snprintf(st->url, sizeof st->url, "%s", url);
                    answer_id(s, kind == OAI_CHAT ? "chatcmpl" : "cmpl", st->id, sizeof st->id);
                    st->a = (struct oai_answer){kind, st->id, (long long)time(NULL), s->p.model_name, s->p.tok, rq.logprobs, 0};
                    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
                    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
                    rc = MHD_queue_response(c, 200, r);
                    MHD_destroy_response(r);
                }
                oai_request_free(&rq);
                return rc; /* stream_free logs it */
            } else if (wait_done(s, j, conn_fd(c))) {
                log_request(s, k->who, "POST", url, 499, j, k->t0);
                srv_job_release(s->p.engine, j);
                oai_request_free(&rq);
                return MHD_NO; /* the client is gone: close */
            } else {
                struct srv_engine *e = s->p.engine;
                char id[48];
                answer_id(s, kind == OAI_CHAT ? "chatcmpl" : "cmpl", id, sizeof id);
                struct oai_answer a = {kind, id, (long long)time(NULL), s->p.model_name, s->p.tok, rq.logprobs, 0};
                pthread_mutex_lock(&e->lk); /* done: the job no longer changes, but its fields are read under the lock */
                unsigned status = j->rc ? job_status(j) : 200;
                struct json_object *o = j->rc ? oai_error(j->err, error_type(status), NULL)
                                              : oai_completion(&a, j->text.data, j->text.len, j->lps, j->n_lps, j);
                struct json_object *calls;
                char *content;
                if (!j->rc && oai_callable_tools(&rq) &&
                    oai_tool_calls_parse(j->text.data ? j->text.data : "", j->text.len, rq.tools, oai_max_calls(&rq), &calls,
                                         &content)) {
                    oai_completion_tool_calls(o, content, calls);
                    json_object_put(calls);
                    free(content);
                }
                pthread_mutex_unlock(&e->lk);
                rc = send_json(s, c, status, o);
                log_request(s, k->who, "POST", url, status, j, k->t0);
                srv_job_release(e, j);
            }
        }
    }
    tllm_ids_free(&ids);
    oai_request_free(&rq);
    return rc;
}

/* ---- the access handler ---- */

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                              const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    struct srv_server *s = cls;
    struct conn *k = *con_cls;
    if (!k) { /* the head is in: its framing, the key and the body's size are checked before the body is read */
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        k->t0 = tllm_now();
        client_address(c, k->who, sizeof k->who);
        *con_cls = k;
        const char *bad = framing_problem(c);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        int denied = strcmp(url, "/health") && !authorized(s, c), too_large = cl && strtoull(cl, NULL, 10) > s->p.max_body;
        if (!bad && !denied && !too_large) return MHD_YES; /* the body comes within the request's deadline (conn_guard.h) */
        srv_guard_working(s->guard, c, 1); /* refused: answered (and closed) at once */
        if (bad) return refuse(s, c, k, method, url, 400, 1, NULL, "%s", bad);
        if (denied) return refuse(s, c, k, method, url, 401, 1, NULL, "a valid API key is required (Authorization: Bearer KEY)");
        return refuse(s, c, k, method, url, 413, 1, NULL, "the request body is %s bytes, more than the %zu this server takes", cl,
                      s->p.max_body);
    }
    if (*upload_size) {
        if (k->body.len + *upload_size > s->p.max_body) k->too_large = 1;
        else if (tllm_buf_append(&k->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    srv_guard_working(s->guard, c, 1); /* the request is complete: it is answered with no deadline */
    if (k->too_large)
        return refuse(s, c, k, method, url, 413, 1, NULL, "the request body is more than the %zu bytes this server takes",
                      s->p.max_body);
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const char *path = !strncmp(url, "/v1/", 4) ? url + 3 : url; /* /v1/models and /models alike */
    enum MHD_Result rc;
    if (!strcmp(path, "/chat/completions") && post) return post_completion(s, c, k, OAI_CHAT, url);
    if (!strcmp(path, "/completions") && post) return post_completion(s, c, k, OAI_COMPLETION, url);
    unsigned status = 200;
    if (!strcmp(path, "/models") && get) rc = get_models(s, c);
    else if (!strcmp(url, "/health") && get) rc = get_health(s, c);
    else if (!strcmp(url, "/metrics") && get) rc = get_metrics(s, c);
    else if (!strcmp(path, "/tokenize") && post) rc = post_tokenize(s, c, k, &status);
    else if (!strcmp(path, "/detokenize") && post) rc = post_detokenize(s, c, k, &status);
    else if (!strcmp(path, "/chat/completions") || !strcmp(path, "/completions") || !strcmp(path, "/tokenize") ||
             !strcmp(path, "/detokenize"))
        status = 405, rc = send_error(s, c, 405, NULL, "%s takes POST", url);
    else if (!strcmp(path, "/models") || !strcmp(url, "/health") || !strcmp(url, "/metrics"))
        status = 405, rc = send_error(s, c, 405, NULL, "%s takes GET", url);
    else
        status = 404, rc = send_error(s, c, 404, NULL, "no such endpoint: %s %s", method, url);
    if (strcmp(url, "/health") && strcmp(url, "/metrics")) log_request(s, k->who, method, url, status, NULL, k->t0);
    return rc;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)why;
    struct srv_server *s = cls;
    srv_guard_working(s->guard, c, 0); /* waiting for its next request, with a new deadline */
    struct conn *k = *con_cls;
    if (!k) return;
    tllm_buf_free(&k->body);
    free(k);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* a client that leaves (or is closed by the connection guard, which counts them) before its request
     * is complete is routine: a line each would let anyone fill the log */
    if (strstr(msg, "closed when reading request") || strstr(msg, "disconnected when reading request") ||
        strstr(msg, "closed by remote side with incomplete request"))
        return;
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    fprintf(stderr, "tllm serve: http: %s\n", msg);
}

int srv_server_start(struct srv_server **out, const struct srv_params *p) {
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    int gai = getaddrinfo(p->host, port, &hints, &ai);
    if (gai) return tllm_fail(TLLM_ERR_ARG, "--host %s: not an IP address (%s)", p->host, gai_strerror(gai));
    struct srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    s->p = *p;
    pthread_mutex_init(&s->tok_lk, NULL);
    pthread_mutex_init(&s->serial_lk, NULL);
    pthread_mutex_init(&s->gram_lk, NULL);
    struct srv_guard_params gp = {.max_waiting = p->max_waiting, .max_waiting_per_ip = p->max_waiting_per_ip,
                                  .request_timeout = p->request_timeout, .quiet = p->quiet};
    int grc = srv_guard_init(&s->guard, &gp);
    if (grc) {
        freeaddrinfo(ai);
        srv_server_stop(s, 0);
        return grc;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ERROR_LOG |
                     MHD_USE_ITC | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    errno = 0;
    s->d = MHD_start_daemon(flags, 0, srv_guard_accept, s->guard, handle, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, srv_guard_notify, s->guard, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)p->timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        int err = errno;
        srv_server_stop(s, 0);
        return tllm_fail(TLLM_ERR_IO, "cannot listen on %s:%d%s%s", p->host, p->port, err ? ": " : "", err ? strerror(err) : "");
    }
    *out = s;
    return TLLM_OK;
}

int srv_server_port(const struct srv_server *s) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : s->p.port;
}

void srv_server_drain(struct srv_server *s) { __atomic_store_n(&s->draining, 1, __ATOMIC_RELAXED); }

void srv_server_stop(struct srv_server *s, double wait_s) {
    if (!s) return;
    /* the daemon's stop closes every socket at once: answers still being written would be cut off, and
     * a request still waiting for its job would take that for its client leaving */
    for (double end = tllm_now() + wait_s; s->guard && srv_guard_n_working(s->guard) > 0 && tllm_now() < end;)
        usleep(10000);
    if (s->d) MHD_stop_daemon(s->d);
    srv_guard_free(s->guard);
    pthread_mutex_destroy(&s->tok_lk);
    pthread_mutex_destroy(&s->serial_lk);
    pthread_mutex_destroy(&s->gram_lk);
    tllm_grammar_cache_free(&s->grams);
    free(s);
}
