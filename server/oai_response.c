/* OpenAI response bodies (oai_response.h). */
#include "server/oai_response.h"

#include <stdio.h>
#include <string.h>

/* bytes as a JSON string: where they are not UTF-8 (a token may hold part of a character, a message
 * may quote a client's bytes), U+FFFD for each maximal run that is not (tllm_tok_decode's rule) */
static struct json_object *lossy_string(const char *b, size_t n) {
    struct tllm_buf s = {0};
    tllm_utf8_lossy_append(&s, (const unsigned char *)b, n);
    struct json_object *o = json_object_new_string_len(s.data ? s.data : "", (int)s.len);
    tllm_buf_free(&s);
    return o;
}

struct json_object *oai_error(const char *message, const char *type, const char *param) {
    struct json_object *e = json_object_new_object(), *o = json_object_new_object();
    json_object_object_add(e, "message", lossy_string(message, strlen(message)));
    json_object_object_add(e, "type", json_object_new_string(type));
    json_object_object_add(e, "param", param ? json_object_new_string(param) : NULL);
    json_object_object_add(e, "code", NULL);
    json_object_object_add(o, "error", e);
    return o;
}

const char *oai_finish(enum tllm_finish f) { return f == TLLM_FINISH_STOP ? "stop" : "length"; }

/* A token's text as a JSON string; `bytes` keeps its bytes exactly, as OpenAI's does */
static struct json_object *token_string(const struct tllm_tok *tok, int32_t id, struct json_object **bytes) {
    size_t n = 0;
    const char *b = tok ? tllm_tok_bytes(tok, id, &n) : NULL;
    char idtext[24];
    if (!b) n = (size_t)snprintf(idtext, sizeof idtext, "<%d>", id), b = idtext;
    if (bytes) {
        *bytes = json_object_new_array();
        for (size_t i = 0; i < n; i++) json_object_array_add(*bytes, json_object_new_int((unsigned char)b[i]));
    }
    return lossy_string(b, n);
}

static struct json_object *chat_logprobs(const struct oai_answer *a, const struct srv_logprob *lps, size_t n) {
    struct json_object *content = json_object_new_array();
    for (size_t i = 0; i < n; i++) {
        struct json_object *e = json_object_new_object(), *bytes, *top = json_object_new_array();
        json_object_object_add(e, "token", token_string(a->tok, lps[i].id, &bytes));
        json_object_object_add(e, "logprob", json_object_new_double(lps[i].logprob));
        json_object_object_add(e, "bytes", bytes);
        for (int k = 0; k < lps[i].n_top; k++) {
            struct json_object *t = json_object_new_object(), *tb;
            json_object_object_add(t, "token", token_string(a->tok, lps[i].top_ids[k], &tb));
            json_object_object_add(t, "logprob", json_object_new_double(lps[i].top_lps[k]));
            json_object_object_add(t, "bytes", tb);
            json_object_array_add(top, t);
        }
        json_object_object_add(e, "top_logprobs", top);
        json_object_array_add(content, e);
    }
    struct json_object *o = json_object_new_object();
    json_object_object_add(o, "content", content);
    return o;
}

/* The legacy endpoint's shape: parallel lists, alternatives as {token: logprob} */
static struct json_object *completion_logprobs(struct oai_answer *a, const struct srv_logprob *lps, size_t n) {
    struct json_object *tokens = json_object_new_array(), *lp = json_object_new_array(), *top = json_object_new_array(),
                       *off = json_object_new_array();
    for (size_t i = 0; i < n; i++) {
        struct json_object *t = token_string(a->tok, lps[i].id, NULL);
        json_object_array_add(off, json_object_new_int64((int64_t)a->text_offset));
        a->text_offset += (size_t)json_object_get_string_len(t);
        json_object_array_add(tokens, t);
        json_object_array_add(lp, json_object_new_double(lps[i].logprob));
        struct json_object *alt = json_object_new_object();
        for (int k = 0; k < lps[i].n_top; k++) {
            struct json_object *ts = token_string(a->tok, lps[i].top_ids[k], NULL);
            json_object_object_add(alt, json_object_get_string(ts), json_object_new_double(lps[i].top_lps[k]));
            json_object_put(ts);
        }
        json_object_array_add(top, alt);
    }
    struct json_object *o = json_object_new_object();
    json_object_object_add(o, "tokens", tokens);
    json_object_object_add(o, "token_logprobs", lp);
    json_object_object_add(o, "top_logprobs", top);
    json_object_object_add(o, "text_offset", off);
    return o;
}

static struct json_object *logprobs(struct oai_answer *a, const struct srv_logprob *lps, size_t n) {
    if (!a->logprobs) return NULL;
    return a->kind == OAI_CHAT ? chat_logprobs(a, lps, n) : completion_logprobs(a, lps, n);
}

static struct json_object *answer(const struct oai_answer *a, const char *object) {
    struct json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(a->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(a->created));
    json_object_object_add(o, "model", json_object_new_string(a->model));
    json_object_object_add(o, "system_fingerprint", json_object_new_string("tllm-" TLLM_VERSION));
    return o;
}

static struct json_object *usage(const struct srv_job *j) {
    struct json_object *u = json_object_new_object(), *d = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int(j->n_prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int(j->n_generated));
    json_object_object_add(u, "total_tokens", json_object_new_int(j->n_prompt + j->n_generated));
    json_object_object_add(d, "cached_tokens", json_object_new_int(j->n_reused));
    json_object_object_add(u, "prompt_tokens_details", d);
    return u;
}

struct json_object *oai_completion(struct oai_answer *a, const char *text, size_t len, const struct srv_logprob *lps,
                                   size_t n_lps, const struct srv_job *j) {
    struct json_object *o = answer(a, a->kind == OAI_CHAT ? "chat.completion" : "text_completion");
    struct json_object *choice = json_object_new_object(), *choices = json_object_new_array();
    json_object_object_add(choice, "index", json_object_new_int(0));
    struct json_object *t = json_object_new_string_len(text ? text : "", (int)len);
    if (a->kind == OAI_CHAT) {
        struct json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string("assistant"));
        json_object_object_add(m, "content", t);
        json_object_object_add(choice, "message", m);
    } else
        json_object_object_add(choice, "text", t);
    json_object_object_add(choice, "logprobs", logprobs(a, lps, n_lps));
    json_object_object_add(choice, "finish_reason", json_object_new_string(oai_finish(j->finish)));
    json_object_array_add(choices, choice);
    json_object_object_add(o, "choices", choices);
    json_object_object_add(o, "usage", usage(j));
    return o;
}

struct json_object *oai_chunk(struct oai_answer *a, int role, const char *text, size_t len, const struct srv_logprob *lps,
                              size_t n_lps, const char *finish, int with_usage) {
    struct json_object *o = answer(a, a->kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    struct json_object *choice = json_object_new_object(), *choices = json_object_new_array();
    json_object_object_add(choice, "index", json_object_new_int(0));
    if (a->kind == OAI_CHAT) {
        struct json_object *d = json_object_new_object();
        if (role) json_object_object_add(d, "role", json_object_new_string("assistant"));
        if (len || role) json_object_object_add(d, "content", json_object_new_string_len(text ? text : "", (int)len));
        json_object_object_add(choice, "delta", d);
    } else
        json_object_object_add(choice, "text", json_object_new_string_len(text ? text : "", (int)len));
    json_object_object_add(choice, "logprobs", n_lps ? logprobs(a, lps, n_lps) : NULL);
    json_object_object_add(choice, "finish_reason", finish ? json_object_new_string(finish) : NULL);
    json_object_array_add(choices, choice);
    json_object_object_add(o, "choices", choices);
    if (with_usage) json_object_object_add(o, "usage", NULL);
    return o;
}

struct json_object *oai_tool_chunk(struct oai_answer *a, int index, struct json_object *call, int header, int with_usage) {
    struct json_object *o = answer(a, "chat.completion.chunk");
    struct json_object *choice = json_object_new_object(), *choices = json_object_new_array();
    struct json_object *d = json_object_new_object(), *calls = json_object_new_array(), *c = json_object_new_object();
    struct json_object *f = json_object_new_object(), *fn, *v;
    json_object_object_get_ex(call, "function", &fn);
    json_object_object_add(c, "index", json_object_new_int(index));
    if (header) {
        if (json_object_object_get_ex(call, "id", &v)) json_object_object_add(c, "id", json_object_get(v));
        json_object_object_add(c, "type", json_object_new_string("function"));
        if (json_object_object_get_ex(fn, "name", &v)) json_object_object_add(f, "name", json_object_get(v));
        json_object_object_add(f, "arguments", json_object_new_string(""));
    } else if (json_object_object_get_ex(fn, "arguments", &v)) {
        json_object_object_add(f, "arguments", json_object_get(v));
    }
    json_object_object_add(c, "function", f);
    json_object_array_add(calls, c);
    json_object_object_add(d, "tool_calls", calls);
    json_object_object_add(choice, "index", json_object_new_int(0));
    json_object_object_add(choice, "delta", d);
    json_object_object_add(choice, "logprobs", NULL);
    json_object_object_add(choice, "finish_reason", NULL);
    json_object_array_add(choices, choice);
    json_object_object_add(o, "choices", choices);
    if (with_usage) json_object_object_add(o, "usage", NULL);
    return o;
}

void oai_completion_tool_calls(struct json_object *answer, const char *content, struct json_object *calls) {
    struct json_object *choices, *choice, *m;
    if (!json_object_object_get_ex(answer, "choices", &choices) || !(choice = json_object_array_get_idx(choices, 0)) ||
        !json_object_object_get_ex(choice, "message", &m))
        return;
    json_object_object_add(m, "content", content ? json_object_new_string(content) : NULL);
    json_object_object_add(m, "tool_calls", json_object_get(calls));
    json_object_object_add(choice, "finish_reason", json_object_new_string("tool_calls"));
}

struct json_object *oai_usage_chunk(struct oai_answer *a, const struct srv_job *j) {
    struct json_object *o = answer(a, a->kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_object_add(o, "choices", json_object_new_array());
    json_object_object_add(o, "usage", usage(j));
    return o;
}

int oai_sse(struct tllm_buf *out, struct json_object *o) {
    size_t n;
    const char *s = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN, &n);
    int rc = tllm_buf_append(out, "data: ", 6) || tllm_buf_append(out, s, n) || tllm_buf_append(out, "\n\n", 2);
    json_object_put(o);
    return rc;
}
