/* The public API's chats given as OpenAI's request (engine/tllm.h: tllm_session_chat_json, a batch item's
 * chat_json): the request read by the server's parser (engine/oai/), its messages and tools rendered with
 * the chat template, its response_format or tool_choice as a grammar, and the calls taken out of the
 * answer, as `tllm serve` and batch files do. */
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "engine/api.h"
#include "base/error.h"
#include "engine/grammar/json_schema.h"
#include "engine/oai/oai_request.h"
#include "engine/oai/tool_calls.h"

int tllm_api_chat_prepare(const struct tllm_engine *e, const char *request, const struct tllm_generate_params *p,
                          struct tllm_api_chat *c) {
    memset(c, 0, sizeof *c);
    if (!request) return tllm_fail(TLLM_ERR_ARG, "chat request: NULL");
    if (!e->tok) return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: no tokenizer.json: a chat needs one", e->dir);
    char err[512] = "";
    const char *param = NULL;
    struct json_object *root = oai_json_body(request, strlen(request), err, sizeof err);
    if (!root) return tllm_fail(TLLM_ERR_ARG, "chat request: %s", err);
    struct oai_request r;
    int bad = oai_chat_parse(&r, root, err, sizeof err, &param);
    json_object_put(root);
    if (bad) {
        oai_request_free(&r);
        return tllm_fail(TLLM_ERR_ARG, "chat request: %s", err);
    }
    if (r.grammar && p && p->json_schema) {
        oai_request_free(&r);
        return tllm_fail(TLLM_ERR_ARG, "chat request: response_format or tool_choice constrains the answer: "
                                       "give no json_schema beside it");
    }
    struct tllm_buf text = {0};
    int rc = tllm_chat_render_json(&e->tpl, r.chat, oai_callable_tools(&r), NULL, 1, &text);
    if (!rc) rc = tllm_tok_encode(e->tok, text.data ? text.data : "", text.len, 1, &c->prompt);
    tllm_buf_free(&text);
    if (!rc && c->prompt.len == 0) rc = tllm_fail(TLLM_ERR_ARG, "the prompt is empty");
    if (!rc) {
        c->grammar = r.grammar, r.grammar = NULL;
        c->grammar_key = r.grammar_key, r.grammar_key = NULL;
        c->tools = json_object_get(oai_callable_tools(&r));
        c->max_calls = oai_max_calls(&r);
    }
    oai_request_free(&r);
    if (rc) tllm_api_chat_free(c);
    return rc;
}

int tllm_api_chat_calls(const struct tllm_api_chat *c, const char *text, size_t len, char **calls, char **content) {
    struct json_object *arr = NULL;
    *calls = *content = NULL;
    if (!c->tools || !oai_tool_calls_parse(text ? text : "", len, c->tools, c->max_calls, &arr, content)) return 0;
    *calls = strdup(json_object_to_json_string_ext(arr, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(arr);
    if (!*content) *content = strdup("");
    if (!*calls || !*content) {
        free(*calls), free(*content);
        *calls = *content = NULL;
        tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        return -1;
    }
    return 1;
}

void tllm_api_chat_free(struct tllm_api_chat *c) {
    tllm_ids_free(&c->prompt);
    tllm_grammar_free(c->grammar);
    free(c->grammar_key);
    json_object_put(c->tools);
    memset(c, 0, sizeof *c);
}

/* With tools offered, the caller's callback sees the answer's content only, as `tllm serve` streams it:
 * text that may begin a call (oai_tool_calls_safe) waits for the answer's end; then the rest goes too
 * when it made no call, else only the text around its calls (which come in *tool_calls). */
struct held_text {
    tllm_gen_cb cb;
    void *user;
    struct tllm_buf text; /* the answer so far */
    size_t sent;          /* bytes of it the callback has seen */
    int nomem;
};

static int held_piece(const char *piece, size_t n, void *u) {
    struct held_text *h = u;
    if (tllm_buf_append(&h->text, piece, n)) return h->nomem = 1; /* stops the answer; reported after */
    size_t safe = oai_tool_calls_safe(h->text.data, h->text.len, h->sent);
    if (safe <= h->sent) return 0;
    int stop = h->cb(h->text.data + h->sent, safe - h->sent, h->user);
    h->sent = safe;
    return stop;
}

/* The held-back end of the answer, once it is complete */
static void held_flush(struct held_text *h, const struct tllm_api_chat *c, int called) {
    const char *rest = h->text.data ? h->text.data + h->sent : "";
    size_t n = h->text.len - h->sent;
    struct json_object *arr = NULL;
    char *content = NULL;
    if (!called) {
        if (n) h->cb(rest, n, h->user);
    } else if (oai_tool_calls_parse(rest, n, c->tools, c->max_calls, &arr, &content) && content && *content) {
        h->cb(content, strlen(content), h->user);
    }
    json_object_put(arr);
    free(content);
}

int tllm_session_chat_json(struct tllm_session *s, const char *request, const struct tllm_generate_params *p,
                           tllm_gen_cb cb, void *user, char **text, char **tool_calls, int32_t **ids, size_t *n_ids,
                           struct tllm_stats *stats) {
    if (text) *text = NULL;
    if (tool_calls) *tool_calls = NULL;
    if (ids) *ids = NULL, *n_ids = 0;
    if (stats) memset(stats, 0, sizeof *stats);
    struct tllm_api_chat c;
    int rc = tllm_api_chat_prepare(s->e, request, p, &c);
    if (rc) return rc;
    char *answer = NULL;
    struct tllm_stats st;
    struct held_text held = {cb, user, {0}, 0, 0};
    int hold = cb && c.tools;
    rc = tllm_api_complete(s, c.prompt.data, c.prompt.len, p, c.grammar, hold ? held_piece : cb, hold ? &held : user, &answer,
                           ids, n_ids, &st);
    if (!rc && held.nomem) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    char *calls = NULL, *content = NULL;
    int called = rc ? 0 : tllm_api_chat_calls(&c, answer, strlen(answer), &calls, &content);
    if (!rc && hold && called >= 0) held_flush(&held, &c, called);
    tllm_buf_free(&held.text);
    tllm_api_chat_free(&c);
    if (called < 0) rc = TLLM_ERR_NOMEM;
    if (called > 0) {
        free(answer);
        answer = content;
        st.finish = TLLM_FINISH_TOOL_CALLS;
    }
    if (!rc && stats) *stats = st;
    if (!rc && tool_calls) *tool_calls = calls;
    else free(calls);
    if (!rc && text) *text = answer;
    else free(answer);
    if (rc && ids) free(*ids), *ids = NULL, *n_ids = 0;
    return rc;
}
