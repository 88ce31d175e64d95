/* Tool calls in a model's answer (tool_calls.h). */
#include "engine/oai/tool_calls.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "engine/oai/oai_request.h" /* oai_json_body */

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";
#define OPEN_LEN (sizeof OPEN - 1)
#define CLOSE_LEN (sizeof CLOSE - 1)

static const char *find(const char *s, size_t n, const char *pat, size_t m) {
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(s + i, pat, m)) return s + i;
    return NULL;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t oai_tool_calls_safe(const char *text, size_t len, size_t from) {
    if (!from) {
        size_t b = 0;
        while (b < len && is_space(text[b])) b++;
        if (b == len || text[b] == '{') return 0;
    } else if (from > len) {
        from = len;
    }
    /* no "<tool_call>" begins before from: it is at most the first one's start, and any earlier tail
     * that began one was held back */
    const char *o = find(text + from, len - from, OPEN, OPEN_LEN);
    if (o) return (size_t)(o - text);
    for (size_t k = OPEN_LEN - 1; k > 0; k--) /* the longest tail that begins "<tool_call>" */
        if (k <= len && !memcmp(text + len - k, OPEN, k)) return len - k;
    return len;
}

static void call_id(char out[32]) {
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char r[24] = {0};
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)rand();
    memcpy(out, "call_", 5);
    for (size_t i = 0; i < sizeof r; i++) out[5 + i] = abc[r[i] % (sizeof abc - 1)];
    out[5 + sizeof r] = '\0';
}

/* {"name": "...", "arguments": {...}} (arguments may also be a JSON text, as some models write them) */
static struct json_object *one_call(const char *s, size_t n, struct json_object *tools) {
    char err[8];
    struct json_object *o = oai_json_body(s, n, err, sizeof err), *name, *args;
    if (!o || !json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "name", &name) ||
        !json_object_is_type(name, json_type_string) || !json_object_get_string_len(name)) {
        json_object_put(o);
        return NULL;
    }
    if (tools) { /* a bare call: only one naming a tool that was offered */
        int known = 0;
        for (size_t i = 0; i < json_object_array_length(tools) && !known; i++) {
            struct json_object *fn, *nm;
            known = json_object_object_get_ex(json_object_array_get_idx(tools, i), "function", &fn) &&
                    json_object_object_get_ex(fn, "name", &nm) && !strcmp(json_object_get_string(nm), json_object_get_string(name));
        }
        if (!known) {
            json_object_put(o);
            return NULL;
        }
    }
    const char *atext = "{}";
    if (json_object_object_get_ex(o, "arguments", &args) && args) {
        if (json_object_is_type(args, json_type_object)) atext = json_object_to_json_string_ext(args, JSON_C_TO_STRING_PLAIN);
        else if (json_object_is_type(args, json_type_string)) atext = json_object_get_string(args);
        else atext = NULL;
    }
    struct json_object *c = NULL;
    if (atext) {
        char id[32];
        call_id(id);
        struct json_object *f = json_object_new_object();
        c = json_object_new_object();
        json_object_object_add(c, "id", json_object_new_string(id));
        json_object_object_add(c, "type", json_object_new_string("function"));
        json_object_object_add(f, "name", json_object_get(name));
        json_object_object_add(f, "arguments", json_object_new_string(atext));
        json_object_object_add(c, "function", f);
    }
    json_object_put(o);
    return c;
}

int oai_tool_calls_parse(const char *text, size_t len, struct json_object *tools, int max_calls,
                         struct json_object **calls, char **content) {
    *calls = NULL, *content = NULL;
    if (!find(text, len, OPEN, OPEN_LEN)) {
        struct json_object *c = one_call(text, len, tools);
        if (!c) return 0;
        *calls = json_object_new_array();
        json_object_array_add(*calls, c);
        return 1;
    }
    struct json_object *arr = json_object_new_array();
    char *rest = malloc(len + 1);
    size_t nrest = 0, i = 0;
    if (!arr || !rest) goto as_text;
    while (i < len) {
        const char *o = find(text + i, len - i, OPEN, OPEN_LEN);
        if (!o) {
            memcpy(rest + nrest, text + i, len - i), nrest += len - i;
            break;
        }
        size_t at = (size_t)(o - text);
        memcpy(rest + nrest, text + i, at - i), nrest += at - i;
        const char *b = o + OPEN_LEN, *e = find(b, len - (size_t)(b - text), CLOSE, CLOSE_LEN);
        if (!e) goto as_text; /* an unclosed call: the answer stopped inside it */
        struct json_object *c = one_call(b, (size_t)(e - b), NULL);
        if (!c) goto as_text;
        if (max_calls <= 0 || (int)json_object_array_length(arr) < max_calls) json_object_array_add(arr, c);
        else json_object_put(c);
        i = (size_t)(e - text) + CLOSE_LEN;
    }
    size_t b = 0;
    while (b < nrest && is_space(rest[b])) b++;
    while (nrest > b && is_space(rest[nrest - 1])) nrest--;
    if (nrest > b) {
        memmove(rest, rest + b, nrest - b);
        rest[nrest - b] = '\0';
        *content = rest;
    } else {
        free(rest);
    }
    *calls = arr;
    return 1;
as_text:
    json_object_put(arr);
    free(rest);
    return 0;
}
