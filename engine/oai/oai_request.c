/* OpenAI request bodies (oai_request.h). */
#include "engine/oai/oai_request.h"

#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/json_schema.h"
#include "tokenizer/tokenizer.h" /* tllm_utf8_valid_len */

struct parse {
    char *err;
    size_t cap;
    const char **param;
};

static int fail(struct parse *p, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct parse *p, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, p->cap, fmt, ap);
    va_end(ap);
    *p->param = param;
    return -1;
}

/* The field, or NULL when absent or null (null means "not given", as OpenAI's clients send it) */
static struct json_object *field(struct json_object *o, const char *key) {
    struct json_object *v;
    return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

static int is_number(struct json_object *v) {
    return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double);
}

static int get_double(struct parse *p, struct json_object *o, const char *key, double lo, double hi, double *out) {
    struct json_object *v = field(o, key);
    if (!v) return 0;
    if (!is_number(v)) return fail(p, key, "'%s' must be a number", key);
    double d = json_object_get_double(v);
    if (!(d >= lo && d <= hi)) return fail(p, key, "'%s' must be between %g and %g", key, lo, hi);
    *out = d;
    return 1;
}

static int get_int(struct parse *p, struct json_object *o, const char *key, long long lo, long long hi, long long *out) {
    struct json_object *v = field(o, key);
    if (!v) return 0;
    double d = is_number(v) ? json_object_get_double(v) : NAN;
    if (!is_number(v) || d != floor(d)) return fail(p, key, "'%s' must be an integer", key);
    long long i = json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : (long long)fmax(fmin(d, 9e18), -9e18);
    if (i < lo || i > hi) return fail(p, key, "'%s' must be between %lld and %lld", key, lo, hi);
    *out = i;
    return 1;
}

static int get_bool(struct parse *p, struct json_object *o, const char *key, int *out) {
    struct json_object *v = field(o, key);
    if (!v) return 0;
    if (!json_object_is_type(v, json_type_boolean)) return fail(p, key, "'%s' must be true or false", key);
    *out = json_object_get_boolean(v);
    return 1;
}

/* A copy of a JSON string that is valid UTF-8 without NUL (the tokenizer's and the template's input) */
static int text_copy(struct parse *p, struct json_object *v, const char *param, char **out, size_t *len) {
    const char *s = json_object_get_string(v);
    size_t n = (size_t)json_object_get_string_len(v);
    if (memchr(s, 0, n)) return fail(p, param, "'%s' contains a NUL character", param);
    if (!tllm_utf8_valid_len((const unsigned char *)s, n)) return fail(p, param, "'%s' is not valid UTF-8", param);
    if (!(*out = malloc(n + 1))) return fail(p, NULL, "out of memory");
    memcpy(*out, s, n);
    (*out)[n] = 0;
    if (len) *len = n;
    return 0;
}

/* A message's content: a string, or a list of parts of which only text ones are understood */
static int content_text(struct parse *p, struct json_object *v, char **out) {
    if (!v) return (*out = strdup("")) ? 0 : fail(p, NULL, "out of memory");
    if (json_object_is_type(v, json_type_string)) return text_copy(p, v, "messages", out, NULL);
    if (!json_object_is_type(v, json_type_array))
        return fail(p, "messages", "a message's 'content' must be a string or a list of text parts");
    size_t n = json_object_array_length(v), total = 0;
    char **parts = calloc(n + 1, sizeof *parts);
    size_t *lens = calloc(n + 1, sizeof *lens);
    int rc = parts && lens ? 0 : fail(p, NULL, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        struct json_object *part = json_object_array_get_idx(v, i), *type = NULL, *text = NULL;
        if (!json_object_is_type(part, json_type_object) || !(type = field(part, "type")) ||
            !json_object_is_type(type, json_type_string))
            rc = fail(p, "messages", "a content part must be an object with a 'type'");
        else if (strcmp(json_object_get_string(type), "text"))
            rc = fail(p, "messages", "content parts of type '%.40s' are not supported (text only)", json_object_get_string(type));
        else if (!(text = field(part, "text")) || !json_object_is_type(text, json_type_string))
            rc = fail(p, "messages", "a text part must have a string 'text'");
        else {
            rc = text_copy(p, text, "messages", &parts[i], &lens[i]);
            total += lens[i];
        }
    }
    if (!rc && !(*out = malloc(total + 1))) rc = fail(p, NULL, "out of memory");
    if (!rc) { /* the parts are one text, as OpenAI joins them */
        size_t at = 0;
        for (size_t i = 0; i < n; i++) memcpy(*out + at, parts[i], lens[i]), at += lens[i];
        (*out)[at] = 0;
    }
    for (size_t i = 0; parts && i < n; i++) free(parts[i]);
    free(parts);
    free(lens);
    return rc;
}

static int chat_message(struct parse *p, struct oai_request *r, struct json_object *m, size_t i);

static int parse_messages(struct parse *p, struct oai_request *r, struct json_object *root) {
    struct json_object *v = field(root, "messages");
    if (!v) return fail(p, "messages", "'messages' is required");
    if (!json_object_is_type(v, json_type_array)) return fail(p, "messages", "'messages' must be a list");
    size_t n = json_object_array_length(v);
    if (n == 0) return fail(p, "messages", "'messages' is empty");
    if (n > OAI_MAX_MESSAGES) return fail(p, "messages", "more than %d messages", OAI_MAX_MESSAGES);
    if (!(r->msgs = calloc(n, sizeof *r->msgs))) return fail(p, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        struct json_object *m = json_object_array_get_idx(v, i), *role;
        if (!json_object_is_type(m, json_type_object)) return fail(p, "messages", "message %zu is not an object", i);
        if (!(role = field(m, "role")) || !json_object_is_type(role, json_type_string))
            return fail(p, "messages", "message %zu has no 'role' string", i);
        const char *rs = json_object_get_string(role);
        /* "developer" is what OpenAI's newer clients call the system turn */
        const char *known = !strcmp(rs, "developer") ? "system" : rs;
        if (strcmp(known, "system") && strcmp(known, "user") && strcmp(known, "assistant") && strcmp(known, "tool"))
            return fail(p, "messages", "message %zu: role '%.40s' is not system, user, assistant or tool", i, rs);
        char *content = NULL;
        if (content_text(p, field(m, "content"), &content)) return -1;
        r->msgs[i].content = content;
        r->n_msgs = (int)i + 1;
        if (!(r->msgs[i].role = strdup(known))) return fail(p, NULL, "out of memory");
        if (chat_message(p, r, m, i)) return -1;
    }
    return 0;
}

/* OpenAI sends a tool call's arguments as a JSON text; chat templates write them with tojson, so they
 * get the object (as transformers' and llama.cpp's servers pass them) */
static int tool_call(struct parse *p, struct json_object *c, size_t i, size_t k, struct json_object *out) {
    struct json_object *fn = json_object_is_type(c, json_type_object) ? field(c, "function") : NULL, *name, *args, *id;
    if (!fn || !json_object_is_type(fn, json_type_object) || !(name = field(fn, "name")) ||
        !json_object_is_type(name, json_type_string))
        return fail(p, "messages", "message %zu: tool call %zu needs a 'function' with a string 'name'", i, k);
    struct json_object *f = json_object_new_object(), *a = NULL;
    json_object_object_add(out, "id", (id = field(c, "id")) && json_object_is_type(id, json_type_string)
                                          ? json_object_get(id) : json_object_new_string(""));
    json_object_object_add(out, "type", json_object_new_string("function"));
    json_object_object_add(out, "function", f);
    json_object_object_add(f, "name", json_object_get(name));
    args = field(fn, "arguments");
    if (!args) a = json_object_new_object();
    else if (json_object_is_type(args, json_type_object)) a = json_object_get(args);
    else if (json_object_is_type(args, json_type_string)) {
        char err[8];
        a = oai_json_body(json_object_get_string(args), (size_t)json_object_get_string_len(args), err, sizeof err);
        if (!a) return fail(p, "messages", "message %zu: tool call %zu's arguments are not JSON", i, k);
    } else {
        return fail(p, "messages", "message %zu: tool call %zu's arguments must be a JSON string", i, k);
    }
    json_object_object_add(f, "arguments", a);
    return 0;
}

static int chat_message(struct parse *p, struct oai_request *r, struct json_object *m, size_t i) {
    struct json_object *o = json_object_new_object(), *v;
    if (!o || (!r->chat && !(r->chat = json_object_new_array()))) {
        json_object_put(o);
        return fail(p, NULL, "out of memory");
    }
    json_object_array_add(r->chat, o);
    json_object_object_add(o, "role", json_object_new_string(r->msgs[i].role));
    json_object_object_add(o, "content", json_object_new_string(r->msgs[i].content));
    if ((v = field(m, "tool_calls"))) {
        if (!json_object_is_type(v, json_type_array)) return fail(p, "messages", "message %zu: 'tool_calls' must be a list", i);
        if (strcmp(r->msgs[i].role, "assistant")) return fail(p, "messages", "message %zu: only the assistant makes tool calls", i);
        struct json_object *calls = json_object_new_array();
        json_object_object_add(o, "tool_calls", calls);
        for (size_t k = 0; k < json_object_array_length(v); k++) {
            struct json_object *c = json_object_new_object();
            json_object_array_add(calls, c);
            if (tool_call(p, json_object_array_get_idx(v, k), i, k, c)) return -1;
        }
    }
    static const char *const strs[] = {"tool_call_id", "name"};
    for (size_t k = 0; k < 2; k++)
        if ((v = field(m, strs[k]))) {
            if (!json_object_is_type(v, json_type_string)) return fail(p, "messages", "message %zu: '%s' must be a string", i, strs[k]);
            json_object_object_add(o, strs[k], json_object_get(v));
        }
    return 0;
}

/* tools: [{"type": "function", "function": {"name", "description", "parameters"}}], tool_choice,
 * parallel_tool_calls */
static int parse_tools(struct parse *p, struct oai_request *r, struct json_object *root) {
    struct json_object *v = field(root, "tools"), *tc = field(root, "tool_choice");
    r->parallel_tool_calls = 1;
    if (get_bool(p, root, "parallel_tool_calls", &r->parallel_tool_calls) < 0) return -1;
    if (v) {
        if (!json_object_is_type(v, json_type_array)) return fail(p, "tools", "'tools' must be a list");
        size_t n = json_object_array_length(v);
        if (n > OAI_MAX_TOOLS) return fail(p, "tools", "more than %d tools", OAI_MAX_TOOLS);
        for (size_t i = 0; i < n; i++) {
            struct json_object *t = json_object_array_get_idx(v, i), *type, *fn, *name, *x;
            if (!json_object_is_type(t, json_type_object) || !(type = field(t, "type")) ||
                !json_object_is_type(type, json_type_string) || strcmp(json_object_get_string(type), "function"))
                return fail(p, "tools", "tool %zu: 'type' must be \"function\"", i);
            if (!(fn = field(t, "function")) || !json_object_is_type(fn, json_type_object) || !(name = field(fn, "name")) ||
                !json_object_is_type(name, json_type_string) || !json_object_get_string_len(name))
                return fail(p, "tools", "tool %zu: 'function' needs a non-empty string 'name'", i);
            if ((x = field(fn, "parameters")) && !json_object_is_type(x, json_type_object))
                return fail(p, "tools", "tool %zu: 'parameters' must be a JSON schema object", i);
            if ((x = field(fn, "description")) && !json_object_is_type(x, json_type_string))
                return fail(p, "tools", "tool %zu: 'description' must be a string", i);
        }
        if (n) r->tools = json_object_get(v);
    }
    if (tc) {
        const char *c = json_object_is_type(tc, json_type_string) ? json_object_get_string(tc) : NULL;
        if (c && !strcmp(c, "none")) r->tool_choice = OAI_TOOLS_NONE;
        else if (c && !strcmp(c, "auto")) r->tool_choice = OAI_TOOLS_AUTO;
        else if (c && !strcmp(c, "required")) r->tool_choice = OAI_TOOLS_REQUIRED;
        else if (json_object_is_type(tc, json_type_object)) { /* {"type": "function", "function": {"name": ...}} */
            struct json_object *fn = field(tc, "function"), *name = fn ? field(fn, "name") : NULL;
            if (!name || !json_object_is_type(name, json_type_string))
                return fail(p, "tool_choice", "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
            if (!(r->tool_name = strdup(json_object_get_string(name)))) return fail(p, NULL, "out of memory");
            r->tool_choice = OAI_TOOLS_NAMED;
        }
        else return fail(p, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or a function");
    }
    return 0;
}

/* A completion's prompt: a string, a list of token ids, or a list holding one of those */
static int parse_prompt(struct parse *p, struct oai_request *r, struct json_object *root) {
    struct json_object *v = field(root, "prompt");
    if (!v) return fail(p, "prompt", "'prompt' is required");
    if (json_object_is_type(v, json_type_array) && json_object_array_length(v) == 1) {
        struct json_object *e = json_object_array_get_idx(v, 0);
        if (json_object_is_type(e, json_type_string) || json_object_is_type(e, json_type_array)) v = e;
    }
    if (json_object_is_type(v, json_type_string)) return text_copy(p, v, "prompt", &r->prompt, &r->prompt_len);
    if (!json_object_is_type(v, json_type_array)) return fail(p, "prompt", "'prompt' must be a string or a list of token ids");
    size_t n = json_object_array_length(v);
    if (n == 0) return fail(p, "prompt", "'prompt' is empty");
    if (n > (1u << 24)) return fail(p, "prompt", "'prompt' has too many tokens");
    if (!(r->prompt_ids = malloc(n * sizeof *r->prompt_ids))) return fail(p, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        struct json_object *e = json_object_array_get_idx(v, i);
        if (json_object_is_type(e, json_type_string) || json_object_is_type(e, json_type_array))
            return fail(p, "prompt", "one prompt per request (this server answers a list of prompts as separate requests)");
        if (!json_object_is_type(e, json_type_int) || json_object_get_int64(e) < 0 || json_object_get_int64(e) > INT32_MAX)
            return fail(p, "prompt", "prompt token %zu is not a token id", i);
        r->prompt_ids[i] = (int32_t)json_object_get_int64(e);
    }
    r->n_prompt_ids = (int)n;
    return 0;
}

static int parse_stop(struct parse *p, struct oai_request *r, struct json_object *root) {
    struct json_object *v = field(root, "stop");
    if (!v) return 0;
    int single = json_object_is_type(v, json_type_string);
    if (!single && !json_object_is_type(v, json_type_array)) return fail(p, "stop", "'stop' must be a string or a list of strings");
    size_t n = single ? 1 : json_object_array_length(v);
    if (n > OAI_MAX_STOP) return fail(p, "stop", "at most %d stop strings", OAI_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        struct json_object *e = single ? v : json_object_array_get_idx(v, i);
        if (!json_object_is_type(e, json_type_string)) return fail(p, "stop", "'stop' must be a string or a list of strings");
        if (json_object_get_string_len(e) == 0) return fail(p, "stop", "a stop string is empty");
        if (text_copy(p, e, "stop", &r->stop[i], NULL)) return -1;
        r->n_stop = (int)i + 1;
    }
    return 0;
}

static int parse_sampling(struct parse *p, struct oai_request *r, struct json_object *o) {
    double d;
    long long i;
    int rc;
    struct tllm_sampler_params *sp = &r->sp;
    if ((rc = get_double(p, o, "temperature", 0, 2, &d)) < 0) return -1;
    if (rc) sp->temperature = (float)d, r->set |= OAI_SET_TEMP;
    if ((rc = get_double(p, o, "top_p", 0, 1, &d)) < 0) return -1;
    if (rc && d <= 0) return fail(p, "top_p", "'top_p' must be above 0");
    if (rc) sp->top_p = (float)d, r->set |= OAI_SET_TOPP;
    if ((rc = get_int(p, o, "top_k", -1, 1 << 24, &i)) < 0) return -1; /* -1 and 0: off (llama.cpp's and vLLM's spellings) */
    if (rc) sp->top_k = i < 0 ? 0 : (int)i, r->set |= OAI_SET_TOPK;
    if ((rc = get_double(p, o, "min_p", 0, 1, &d)) < 0) return -1;
    if (rc) sp->min_p = (float)d, r->set |= OAI_SET_MINP;
    const char *rep = field(o, "repetition_penalty") ? "repetition_penalty" : "repeat_penalty";
    if ((rc = get_double(p, o, rep, 0.01, 100, &d)) < 0) return -1;
    if (rc) sp->repeat_penalty = (float)d, r->set |= OAI_SET_REP;
    if ((rc = get_double(p, o, "presence_penalty", -2, 2, &d)) < 0) return -1;
    if (rc) sp->presence_penalty = (float)d, r->set |= OAI_SET_PRES;
    if ((rc = get_double(p, o, "frequency_penalty", -2, 2, &d)) < 0) return -1;
    if (rc) sp->frequency_penalty = (float)d, r->set |= OAI_SET_FREQ;
    if ((rc = get_int(p, o, "seed", INT64_MIN, INT64_MAX, &i)) < 0) return -1;
    if (rc) sp->seed = (uint64_t)i, r->set |= OAI_SET_SEED;
    return 0;
}

/* What the answer must follow: the calls tool_choice asks for, else response_format's JSON */
static int parse_format(struct parse *p, struct oai_request *r, struct json_object *root) {
    struct json_object *rf = field(root, "response_format");
    int rc = 0;
    const char *param = "response_format";
    if (r->tool_choice == OAI_TOOLS_REQUIRED || r->tool_choice == OAI_TOOLS_NAMED) {
        if (!r->tools) return fail(p, "tool_choice", "tool_choice '%s' needs 'tools'", r->tool_name ? r->tool_name : "required");
        param = "tools";
        rc = tllm_schema_tool_grammar(r->tools, r->tool_name, r->parallel_tool_calls, NULL, "tools", &r->grammar);
    } else if (rf && r->tools && r->tool_choice == OAI_TOOLS_AUTO) { /* a call, or an answer in the format */
        struct json_object *t = field(rf, "type");
        if (t && json_object_is_type(t, json_type_string) && !strcmp(json_object_get_string(t), "text")) return 0;
        rc = tllm_schema_tool_grammar(r->tools, NULL, r->parallel_tool_calls, rf, "tools", &r->grammar);
        if (rc) param = !strncmp(tllm_errmsg(), "tools", 5) ? "tools" : "response_format";
    } else if (rf) {
        rc = tllm_response_format_grammar(rf, "response_format", &r->grammar);
    }
    if (rc) return fail(p, param, "%s", tllm_errmsg());
    if (r->grammar) {
        struct json_object *k = json_object_new_array();
        if (r->tools && r->tool_choice != OAI_TOOLS_NONE) {
            json_object_array_add(k, json_object_get(r->tools));
            json_object_array_add(k, r->tool_name ? json_object_new_string(r->tool_name) : NULL);
            json_object_array_add(k, json_object_new_boolean(r->parallel_tool_calls));
            if (r->tool_choice == OAI_TOOLS_AUTO) json_object_array_add(k, json_object_get(rf));
        } else {
            json_object_array_add(k, json_object_get(rf));
        }
        r->grammar_key = strdup(json_object_to_json_string_ext(k, JSON_C_TO_STRING_PLAIN));
        json_object_put(k);
        if (!r->grammar_key) return fail(p, NULL, "out of memory");
    }
    if (r->grammar && r->ignore_eos)
        return fail(p, "ignore_eos", "'ignore_eos' cannot be used with %s: the answer ends where it is complete", param);
    return 0;
}

static int parse_body(struct parse *p, struct oai_request *r, struct json_object *root) {
    long long i;
    int rc, b = 0;
    if (!json_object_is_type(root, json_type_object)) return fail(p, NULL, "the request body must be a JSON object");
    struct json_object *model = field(root, "model");
    if (model && !json_object_is_type(model, json_type_string)) return fail(p, "model", "'model' must be a string");
    if (model && !(r->model = strdup(json_object_get_string(model)))) return fail(p, NULL, "out of memory");
    if (r->kind == OAI_CHAT ? parse_messages(p, r, root) || parse_tools(p, r, root) : parse_prompt(p, r, root)) return -1;
    r->max_tokens = -1;
    const char *mt = r->kind == OAI_CHAT && field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((rc = get_int(p, root, mt, 1, 1 << 24, &i)) < 0) return -1;
    if (rc) r->max_tokens = (int)i;
    if ((rc = get_int(p, root, "n", 1, 1 << 20, &i)) < 0) return -1;
    if (rc && i != 1) return fail(p, "n", "one choice per request ('n' must be 1)");
    if (parse_sampling(p, r, root) || parse_stop(p, r, root)) return -1;
    if (get_bool(p, root, "stream", &r->stream) < 0 || get_bool(p, root, "ignore_eos", &r->ignore_eos) < 0) return -1;
    struct json_object *so = field(root, "stream_options");
    if (so && !json_object_is_type(so, json_type_object)) return fail(p, "stream_options", "'stream_options' must be an object");
    if (so && get_bool(p, so, "include_usage", &r->include_usage) < 0) return -1;
    if (r->kind == OAI_CHAT) {
        if (get_bool(p, root, "logprobs", &r->logprobs) < 0) return -1;
        if ((rc = get_int(p, root, "top_logprobs", 0, 20, &i)) < 0) return -1;
        if (rc && !r->logprobs) return fail(p, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (rc) r->top_logprobs = (int)i;
    } else { /* the legacy endpoint's logprobs is the number of alternatives */
        if ((rc = get_int(p, root, "logprobs", 0, 5, &i)) < 0) return -1;
        if (rc) r->logprobs = 1, r->top_logprobs = (int)i;
        if ((rc = get_bool(p, root, "echo", &b)) < 0) return -1;
        if (rc && b) return fail(p, "echo", "'echo' is not supported");
        struct json_object *suffix = field(root, "suffix");
        if (suffix && !(json_object_is_type(suffix, json_type_string) && json_object_get_string_len(suffix) == 0))
            return fail(p, "suffix", "'suffix' is not supported");
    }
    return parse_format(p, r, root);
}

struct json_object *oai_json_body(const char *body, size_t len, char *err, size_t cap) {
    if (len > INT32_MAX) return snprintf(err, cap, "the request body is too large"), NULL;
    struct json_tokener *tk = json_tokener_new_ex(64);
    if (!tk) return snprintf(err, cap, "out of memory"), NULL;
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT);
    struct json_object *root = json_tokener_parse_ex(tk, body, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tk);
    size_t end = json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    if (!root || je != json_tokener_success) {
        snprintf(err, cap, "the request body is not valid JSON (%s)", je == json_tokener_continue ? "it ends early" : json_tokener_error_desc(je));
        json_object_put(root);
        return NULL;
    }
    while (end < len && strchr(" \t\r\n", body[end])) end++;
    if (end < len) {
        snprintf(err, cap, "the request body has text after its JSON value");
        json_object_put(root);
        return NULL;
    }
    return root;
}

int oai_request_parse(struct oai_request *r, enum oai_kind kind, const char *body, size_t len, char *err, size_t cap,
                      const char **param) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    struct parse p = {err, cap, param};
    *param = NULL;
    struct json_object *root = oai_json_body(body, len, err, cap);
    if (!root) return -1;
    int rc = parse_body(&p, r, root);
    json_object_put(root);
    return rc;
}

int oai_chat_parse(struct oai_request *r, struct json_object *root, char *err, size_t cap, const char **param) {
    memset(r, 0, sizeof *r);
    r->kind = OAI_CHAT;
    r->max_tokens = -1;
    struct parse p = {err, cap, param};
    *param = NULL;
    if (!json_object_is_type(root, json_type_object)) return fail(&p, NULL, "the request body must be a JSON object");
    return parse_messages(&p, r, root) || parse_tools(&p, r, root) || parse_format(&p, r, root) ? -1 : 0;
}

struct json_object *oai_callable_tools(const struct oai_request *r) {
    return r->tools && r->tool_choice != OAI_TOOLS_NONE ? r->tools : NULL;
}

int oai_max_calls(const struct oai_request *r) { return r->parallel_tool_calls ? 0 : 1; }

void oai_request_free(struct oai_request *r) {
    for (int i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
    }
    free(r->msgs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->model);
    json_object_put(r->chat);
    json_object_put(r->tools);
    free(r->tool_name);
    tllm_grammar_free(r->grammar);
    free(r->grammar_key);
    memset(r, 0, sizeof *r);
}
