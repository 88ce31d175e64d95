/* tllm template: a conversation rendered by the chat template, as the model will read it. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "base/error.h"
#include "base/json_util.h"
#include "engine/load/checkpoint.h"
#include "engine/load/gguf_vocab.h"
#include "engine/load/model.h"
#include "tokenizer/chat.h"

static const char usage[] =
    "usage: tllm template [-m MODEL] [--chat-template FILE] [--no-generation-prompt] [--var NAME=JSON]... CONV\n"
    "Print CONV rendered by the chat template (the model's, or FILE's), as the model will read it.\n"
    "CONV: a JSON file (- for standard input): an array of messages ({\"role\": ..., \"content\": ...,\n"
    "\"tool_calls\": ...}), or an object {\"messages\": [...], \"tools\": [...], ...} whose other keys are\n"
    "variables of the template (\"add_generation_prompt\", \"enable_thinking\", ...).\n"
    "  --var NAME=JSON        one more variable (e.g. --var enable_thinking=false)\n"
    "  --no-generation-prompt do not open the assistant's turn at the end\n";

#define CONV_MAX_BYTES (64u << 20)

void cli_load_template(const char *dir, const char *file, int no_template, struct tllm_chat_template *tpl) {
    memset(tpl, 0, sizeof *tpl);
    if (dir && !no_template) {
        char *gguf;
        if (tllm_model_gguf_path(dir, &gguf)) cli_die_lib();
        if (gguf) {
            if (tllm_gguf_file_tokenizer(gguf, NULL, tpl)) cli_die_lib(); /* the template only */
            free(gguf);
        } else {
            char *cfg = tllm_path_join(dir, "tokenizer_config.json");
            if (!cfg) cli_die("out of memory");
            if (access(cfg, R_OK) == 0 && tllm_chat_template_load(cfg, tpl)) cli_die_lib();
            free(cfg);
        }
    }
    if (file && tllm_chat_template_file(file, tpl)) cli_die_lib();
}

void cli_read_conversation(const char *path, struct json_object **root, struct json_object **messages,
                           struct json_object **tools, struct json_object **extra) {
    char *text;
    size_t len;
    if (!strcmp(path, "-")) {
        struct tllm_buf b = {0};
        char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0)
            if (b.len + n > CONV_MAX_BYTES || tllm_buf_append(&b, chunk, n)) cli_die("-: the conversation is too long");
        text = b.data ? b.data : strdup(""), len = b.len;
    } else if (tllm_read_file(path, CONV_MAX_BYTES, &text, &len)) {
        cli_die_lib();
    }
    if (tllm_json_parse(text, len, root, path)) cli_die_lib();
    free(text);
    *tools = *extra = NULL;
    if (json_object_is_type(*root, json_type_array)) {
        *messages = *root;
        return;
    }
    if (!json_object_is_type(*root, json_type_object) || !json_object_object_get_ex(*root, "messages", messages) ||
        !json_object_is_type(*messages, json_type_array))
        cli_die("%s: expected an array of messages or an object with an array \"messages\"", path);
    if (json_object_object_get_ex(*root, "tools", tools) && !json_object_is_type(*tools, json_type_null) &&
        !json_object_is_type(*tools, json_type_array))
        cli_die("%s: \"tools\" is not an array", path);
    if (*tools && json_object_is_type(*tools, json_type_null)) *tools = NULL;
    *extra = json_object_new_object();
    if (!*extra) cli_die("out of memory");
    json_object_object_foreach(*root, k, v) {
        if (strcmp(k, "messages") && strcmp(k, "tools")) json_object_object_add(*extra, k, json_object_get(v));
    }
    for (size_t i = 0; i < json_object_array_length(*messages); i++)
        if (!json_object_is_type(json_object_array_get_idx(*messages, i), json_type_object))
            cli_die("%s: message %zu is not an object", path, i);
}

int cmd_template(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *conv = NULL;
    int gen_prompt = 1;
    struct json_object *vars = json_object_new_object();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--chat-template")) file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--no-generation-prompt")) gen_prompt = 0;
        else if (!strcmp(a, "--var")) {
            const char *v = cli_value(argc, argv, &i), *eq = strchr(v, '=');
            struct json_object *o;
            if (!eq || eq == v) cli_die("--var %s: expected NAME=JSON", v);
            if (tllm_json_parse(eq + 1, strlen(eq + 1), &o, "--var")) cli_die("--var %s: the value is not JSON", v);
            char *name = strndup(v, (size_t)(eq - v));
            json_object_object_add(vars, name, o);
            free(name);
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') cli_die("template: unknown option '%s' (see tllm template --help)", a);
        else if (conv) cli_die("template: more than one conversation file");
        else conv = a;
    }
    if (!conv) cli_die("template: give a conversation file (see tllm template --help)");
    if (!file || dir) dir = cli_model_dir(dir);
    struct tllm_chat_template tpl;
    cli_load_template(dir, file, 0, &tpl);
    struct json_object *root, *messages, *tools, *extra;
    cli_read_conversation(conv, &root, &messages, &tools, &extra);
    if (extra) {
        json_object_object_foreach(extra, k, v) {
            if (!strcmp(k, "add_generation_prompt")) gen_prompt = json_object_get_boolean(v);
            else if (!json_object_object_get_ex(vars, k, NULL)) json_object_object_add(vars, k, json_object_get(v));
        }
    }
    struct tllm_buf out = {0};
    if (tllm_chat_render_json(&tpl, messages, tools, vars, gen_prompt, &out)) cli_die("%s: %s", conv, tllm_errmsg());
    fwrite(out.data, 1, out.len, stdout);
    tllm_buf_free(&out);
    json_object_put(extra);
    json_object_put(root);
    json_object_put(vars);
    tllm_chat_template_free(&tpl);
    return 0;
}
