#include "tokenizer/chat.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/error.h"
#include "engine/base/json_util.h"

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

int tllm_chat_template_parse(const char *text, struct tllm_chat_template *t, const char *what) {
    memset(t, 0, sizeof *t);
    if (!strstr(text, "<|im_start|>") || !strstr(text, "<|im_end|>"))
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: the chat template is not ChatML (no <|im_start|>/<|im_end|>); use the plain "
                         "mode (--no-template)",
                         what);
    t->kind = TLLM_CHAT_CHATML;
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
    rc = text ? tllm_chat_template_parse(text, t, path)
              : tllm_fail(TLLM_ERR_FORMAT, "%s: chat_template is neither a string nor a list with a default", path);
    json_object_put(root);
    return rc;
}

void tllm_chat_template_free(struct tllm_chat_template *t) {
    free(t->default_system);
    memset(t, 0, sizeof *t);
}

static int turn(struct tllm_buf *out, const char *role, const char *content) {
    if (tllm_buf_puts(out, "<|im_start|>") || tllm_buf_puts(out, role) || tllm_buf_puts(out, "\n") ||
        tllm_buf_puts(out, content) || tllm_buf_puts(out, "<|im_end|>\n"))
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    return TLLM_OK;
}

int tllm_chat_render(const struct tllm_chat_template *t, const struct tllm_chat_msg *msgs, int n,
                     int add_generation_prompt, struct tllm_buf *out) {
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant"))
            return tllm_fail(TLLM_ERR_ARG, "message %d: role '%s' is not system, user or assistant", i, msgs[i].role);
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
