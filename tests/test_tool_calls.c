/* Tool calls taken out of a model's answer (engine/oai/tool_calls.c): tagged blocks, bare calls naming an
 * offered tool, what stays text, and how much of a growing answer may be streamed as content. */
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "engine/oai/tool_calls.h"
#include "tests/check.h"

static struct json_object *tools;

/* the calls of text as "name(arguments);..." (NULL when the text is not calls), its content in *content */
static char *calls_of(const char *text, int max_calls, char **content) {
    struct json_object *calls;
    static char buf[4096];
    *content = NULL;
    if (!oai_tool_calls_parse(text, strlen(text), tools, max_calls, &calls, content)) return NULL;
    buf[0] = '\0';
    for (size_t i = 0; i < json_object_array_length(calls); i++) {
        struct json_object *c = json_object_array_get_idx(calls, i), *f, *n, *a, *id;
        json_object_object_get_ex(c, "function", &f);
        json_object_object_get_ex(f, "name", &n);
        json_object_object_get_ex(f, "arguments", &a);
        json_object_object_get_ex(c, "id", &id);
        CHECK(!strncmp(json_object_get_string(id), "call_", 5) && strlen(json_object_get_string(id)) == 29, "id %s",
              json_object_get_string(id));
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s(%s);", json_object_get_string(n), json_object_get_string(a));
    }
    json_object_put(calls);
    return buf;
}

#define CALLS(text, max, want_calls, want_content)                                                                  \
    do {                                                                                                           \
        char *content, *got = calls_of(text, max, &content);                                                       \
        CHECK(want_calls ? got && !strcmp(got, want_calls ? want_calls : "") : !got, "%s: calls %s", text,         \
              got ? got : "(text)");                                                                               \
        CHECK(want_content ? content && !strcmp(content, want_content ? want_content : "") : !content,              \
              "%s: content %s", text, content ? content : "(null)");                                               \
        free(content);                                                                                             \
    } while (0)

int main(void) {
    tools = json_tokener_parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]");
    CALLS("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 0,
          "get_weather({\"city\":\"Paris\"});", NULL);
    CALLS("Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
          "{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>", 0,
          "a({});b({\"x\": 1});", "Let me look.");
    CALLS("<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>", 1, "a({});", NULL);
    /* not calls: returned as text */
    CALLS("<tool_call>\n{\"name\": \"a\", \"arguments\": {}}", 0, NULL, NULL);             /* unclosed */
    CALLS("<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call>", 0, NULL, NULL);     /* bad JSON */
    CALLS("<tool_call>{\"arguments\": {}}</tool_call>", 0, NULL, NULL);                    /* no name */
    CALLS("<tool_call>{\"name\": \"a\", \"arguments\": 3}</tool_call>", 0, NULL, NULL);    /* bad arguments */
    CALLS("just text", 0, NULL, NULL);
    /* bare: only the whole answer, only an offered tool */
    CALLS("  {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n", 0, "get_weather({\"city\":\"Oslo\"});", NULL);
    CALLS("{\"name\": \"rm_rf\", \"arguments\": {}}", 0, NULL, NULL);
    CALLS("{\"name\": \"get_weather\", \"arguments\": {}} and more", 0, NULL, NULL);
    /* streaming: what may go out as content now */
    static const struct { const char *text; size_t safe; } S[] = {
        {"hello", 5}, {"abc<tool", 3}, {"abc<tool_call>{\"na", 3}, {"abc <", 4}, {"  {\"name", 0}, {"   ", 0},
        {"", 0}, {"a<tool_cal", 1}, {"a<b", 3},
    };
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        size_t got = oai_tool_calls_safe(S[i].text, strlen(S[i].text), 0);
        CHECK(got == S[i].safe, "safe(%s) = %zu, want %zu", S[i].text, got, S[i].safe);
    }
    /* streamed a byte at a time, each call starting from the last answer: the same as reading it all */
    static const char *const grow[] = {"Let me <tool_call>{\"name\": 1}</tool_call> then <tool_call>", "a <tool_ca <tool_call>x",
                                       "<<tool_call", "x<tool_cal<tool_call>", "  {\"name\": \"a\"}", " x {"};
    for (size_t i = 0; i < sizeof grow / sizeof grow[0]; i++)
        for (size_t n = 0, from = 0; n <= strlen(grow[i]); n++) {
            size_t all = oai_tool_calls_safe(grow[i], n, 0), got = oai_tool_calls_safe(grow[i], n, from);
            CHECK(got == all, "safe(%.*s) from %zu = %zu, want %zu", (int)n, grow[i], from, got, all);
            from = got > from ? got : from;
        }
    json_object_put(tools);
    return check_done();
}
