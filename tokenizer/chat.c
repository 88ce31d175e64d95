#include "tokenizer/chat.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/json_util.h"
#include "tokenizer/jinja/jinja.h"

#define CHAT_CONFIG_MAX_BYTES (16u << 20)

/* Undo Jinja string-literal escapes (\n, \t, \', \", \\) in s[0..n). */
static char *unescape(const char *s, size_t n) {
    char *o = malloc(n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[++i];
            o[k++] = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
        } else {
            o[k++] = s[i];
        }
    }
    o[k] = '\0';
    return o;
}

/* The ChatML fallback for a template the interpreter refuses. */
static int parse_chatml(const char *text, struct tllm_chat_template *t, const char *what, const char *why) {
    if (!strstr(text, "<|im_start|>") || !strstr(text, "<|im_end|>"))
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: the chat template cannot be run: %s; use --no-template or --chat-template FILE",
                         what, why);
    t->kind = TLLM_CHAT_CHATML;
    if (!(t->parse_error = strdup(why))) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    /* The default system prompt is the literal after "<|im_start|>system\n" that is not followed by a
     * quote (that one is the message's own content: '...system\n' + messages[0]['content']). */
    static const char marker[] = "<|im_start|>system\\n";
    for (const char *p = strstr(text, marker); p; p = strstr(p + 1, marker)) {
        const char *b = p + sizeof marker - 1;
        if (*b == '\'' || *b == '"') continue;
        const char *e = strstr(b, "<|im_end|>");
        if (!e) break;
        if (!(t->default_system = unescape(b, (size_t)(e - b))))
            return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        break;
    }
    return TLLM_OK;
}

/* t's kind and contents from a template's text; t's special tokens are kept */
static int set_text(const char *text, struct tllm_chat_template *t, const char *what) {
    struct json_object *specials = t->specials;
    t->specials = NULL;
    tllm_chat_template_free(t);
    t->specials = specials;
    int rc = tllm_jinja_parse(text, strlen(text), what, &t->jinja);
    if (!rc) {
        t->kind = TLLM_CHAT_JINJA;
        return TLLM_OK;
    }
    if (rc == TLLM_ERR_NOMEM) return rc;
    char why[600];
    snprintf(why, sizeof why, "%s", tllm_errmsg());
    return parse_chatml(text, t, what, why);
}

int tllm_chat_template_parse(const char *text, struct tllm_chat_template *t, const char *what) {
    memset(t, 0, sizeof *t);
    return set_text(text, t, what);
}

int tllm_chat_template_parse_keep(const char *text, struct tllm_chat_template *t, const char *what) {
    return set_text(text, t, what);
}

int tllm_chat_template_file(const char *path, struct tllm_chat_template *t) {
    char *text;
    size_t len;
    int rc = tllm_read_file(path, CHAT_CONFIG_MAX_BYTES, &text, &len);
    if (rc) return rc;
    if (memchr(text, 0, len)) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: a chat template holds no NUL bytes", path);
    else rc = set_text(text, t, path);
    free(text);
    return rc;
}

int tllm_chat_template_set_token(struct tllm_chat_template *t, const char *name, const char *value) {
    if (!t->specials && !(t->specials = json_object_new_object())) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    struct json_object *v = json_object_new_string(value);
    if (!v || json_object_object_add(t->specials, name, v)) {
        json_object_put(v);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    return TLLM_OK;
}

/* tokenizer_config.json's "eos_token": "<|im_end|>" or {"content": "<|im_end|>", ...} */
static int config_tokens(struct json_object *root, struct tllm_chat_template *t) {
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct json_object *v, *c;
        if (!json_object_object_get_ex(root, names[i], &v)) continue;
        if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "content", &c)) v = c;
        if (!json_object_is_type(v, json_type_string)) continue;
        int rc = tllm_chat_template_set_token(t, names[i], json_object_get_string(v));
        if (rc) return rc;
    }
    return TLLM_OK;
}

int tllm_chat_template_load(const char *path, struct tllm_chat_template *t) {
    memset(t, 0, sizeof *t);
    struct json_object *root, *ct;
    int rc = tllm_json_load_file(path, CHAT_CONFIG_MAX_BYTES, &root);
    if (rc) return rc;
    if (!json_object_is_type(root, json_type_object) || !json_object_object_get_ex(root, "chat_template", &ct) ||
        json_object_is_type(ct, json_type_null)) {
        json_object_put(root);
        return TLLM_OK; /* plain */
    }
    if ((rc = config_tokens(root, t))) {
        json_object_put(root);
        tllm_chat_template_free(t);
        return rc;
    }
    const char *text = NULL;
    if (json_object_is_type(ct, json_type_string)) {
        text = json_object_get_string(ct);
    } else if (json_object_is_type(ct, json_type_array)) { /* [{"name": "default", "template": ...}, ...] */
        for (size_t i = 0; i < json_object_array_length(ct); i++) {
            struct json_object *e = json_object_array_get_idx(ct, i), *nm, *tp;
            if (json_object_object_get_ex(e, "name", &nm) && json_object_object_get_ex(e, "template", &tp) &&
                !strcmp(json_object_get_string(nm), "default") && json_object_is_type(tp, json_type_string))
                text = json_object_get_string(tp);
        }
    }
    rc = text ? set_text(text, t, path)
              : tllm_fail(TLLM_ERR_FORMAT, "%s: chat_template is neither a string nor a list with a default", path);
    json_object_put(root);
    if (rc) tllm_chat_template_free(t);
    return rc;
}

void tllm_chat_template_free(struct tllm_chat_template *t) {
    free(t->default_system);
    free(t->parse_error);
    tllm_jinja_free(t->jinja);
    json_object_put(t->specials);
    memset(t, 0, sizeof *t);
}

static int turn(struct tllm_buf *out, const char *role, const char *content) {
    if (tllm_buf_puts(out, "<|im_start|>") || tllm_buf_puts(out, role) || tllm_buf_puts(out, "\n") ||
        tllm_buf_puts(out, content) || tllm_buf_puts(out, "<|im_end|>\n"))
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    return TLLM_OK;
}

int tllm_chat_render_json(const struct tllm_chat_template *t, struct json_object *messages, struct json_object *tools,
                          struct json_object *extra, int add_generation_prompt, struct tllm_buf *out) {
    if (t->kind != TLLM_CHAT_JINJA) {
        /* the plain and ChatML renderings take role and content strings only */
        size_t n = json_object_array_length(messages);
        if (tools && json_object_array_length(tools))
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "tools need the checkpoint's chat template, which %s",
                             t->kind == TLLM_CHAT_PLAIN ? "this model does not have" : "could not be run");
        struct tllm_chat_msg *m = calloc(n + 1, sizeof *m);
        if (!m) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        int rc = TLLM_OK;
        for (size_t i = 0; i < n && !rc; i++) {
            struct json_object *e = json_object_array_get_idx(messages, i), *r, *c;
            if (!json_object_object_get_ex(e, "role", &r) || !json_object_is_type(r, json_type_string))
                rc = tllm_fail(TLLM_ERR_ARG, "message %zu has no string role", i);
            else if (!json_object_object_get_ex(e, "content", &c) || !json_object_is_type(c, json_type_string))
                rc = tllm_fail(TLLM_ERR_ARG, "message %zu has no string content", i);
            else
                m[i] = (struct tllm_chat_msg){json_object_get_string(r), json_object_get_string(c)};
        }
        if (!rc) rc = tllm_chat_render(t, m, (int)n, add_generation_prompt, out);
        free(m);
        return rc;
    }
    struct json_object *vars = json_object_new_object();
    int nomem = !vars;
    /* copies, not references: a server renders one template from many threads, and json-c's reference
     * counts are not atomic (shared references lost counts: leaks, double frees) */
    if (t->specials) {
        json_object_object_foreach(t->specials, k, v) {
            struct json_object *copy = json_object_new_string_len(json_object_get_string(v), json_object_get_string_len(v));
            if (!copy || json_object_object_add(vars, k, copy)) nomem = 1, json_object_put(copy);
        }
    }
    if (extra) {
        json_object_object_foreach(extra, k, v) nomem |= json_object_object_add(vars, k, json_object_get(v)) != 0;
    }
    nomem |= json_object_object_add(vars, "messages", json_object_get(messages)) != 0;
    if (tools) nomem |= json_object_object_add(vars, "tools", json_object_get(tools)) != 0;
    nomem |= json_object_object_add(vars, "add_generation_prompt", json_object_new_boolean(add_generation_prompt)) != 0;
    int rc = nomem ? tllm_fail(TLLM_ERR_NOMEM, "out of memory") : tllm_jinja_render(t->jinja, vars, out);
    json_object_put(vars);
    return rc;
}

int tllm_chat_render(const struct tllm_chat_template *t, const struct tllm_chat_msg *msgs, int n,
                     int add_generation_prompt, struct tllm_buf *out) {
    int jinja = t->kind == TLLM_CHAT_JINJA;
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant") &&
            (!jinja || strcmp(msgs[i].role, "tool")))
            return tllm_fail(TLLM_ERR_ARG, "message %d: role '%s' is not system, user, assistant%s", i, msgs[i].role,
                             jinja ? " or tool" : " (tool results need the checkpoint's chat template)");
    if (jinja) {
        struct json_object *arr = json_object_new_array();
        int nomem = !arr;
        for (int i = 0; i < n && !nomem; i++) {
            struct json_object *m = json_object_new_object();
            nomem = !m || json_object_array_add(arr, m) ||
                    json_object_object_add(m, "role", json_object_new_string(msgs[i].role)) ||
                    json_object_object_add(m, "content", json_object_new_string(msgs[i].content));
        }
        int rc = nomem ? tllm_fail(TLLM_ERR_NOMEM, "out of memory")
                       : tllm_chat_render_json(t, arr, NULL, NULL, add_generation_prompt, out);
        json_object_put(arr);
        return rc;
    }
    if (t->kind == TLLM_CHAT_PLAIN) {
        for (int i = 0; i < n; i++)
            if (tllm_buf_puts(out, msgs[i].content) || (i + 1 < n && tllm_buf_puts(out, "\n")))
                return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        return out->data ? TLLM_OK : tllm_buf_append(out, "", 0);
    }
    int rc = TLLM_OK;
    if (n == 0 || strcmp(msgs[0].role, "system") != 0) {
        if (t->default_system) rc = turn(out, "system", t->default_system);
    }
    for (int i = 0; i < n && !rc; i++) rc = turn(out, msgs[i].role, msgs[i].content);
    if (!rc && add_generation_prompt && tllm_buf_puts(out, "<|im_start|>assistant\n"))
        rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    if (!rc && !out->data) rc = tllm_buf_append(out, "", 0);
    return rc;
}
