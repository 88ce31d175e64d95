/* tllm tokenize: the tokenizer from the command line (needs only the model's tokenizer files). */
#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/load/checkpoint.h"
#include "engine/load/gguf_vocab.h"
#include "engine/load/model.h"
#include "base/error.h"
#include "base/json_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

static const char usage[] =
    "usage: tllm tokenize -m DIR [--no-special] [--json] TEXT\n"
    "       tllm tokenize -m DIR --file F          encode a file's bytes verbatim\n"
    "       tllm tokenize -m DIR --jsonl F         each line {\"text\": ...} -> one line {\"ids\": [...]}\n"
    "       tllm tokenize -m DIR --chat F [--json] [--no-template | --chat-template T]\n"
    "                                              F: a conversation as tllm template reads it; renders\n"
    "                                              the chat template with the generation prompt, then encodes\n"
    "       tllm tokenize -m DIR --decode 1,2,3 [--skip-special]\n"
    "       tllm tokenize -m DIR --bench F...      encoding speed (MB/s, one thread) per file\n"
    "Ids are printed as a JSON array; --json prints {\"text\": ..., \"ids\": [...]}.\n"
    "Special tokens written in the text (<|im_start|>) are parsed unless --no-special.\n";

#define TOKENIZE_MAX_INPUT (1u << 30)

static void print_ids_json(const struct tllm_ids *ids, FILE *fp) {
    fputc('[', fp);
    for (size_t i = 0; i < ids->len; i++) fprintf(fp, i ? ", %d" : "%d", ids->data[i]);
    fputc(']', fp);
}

static void print_text_and_ids(const char *text, size_t len, const struct tllm_ids *ids) {
    struct json_object *s = json_object_new_string_len(text, (int)len);
    printf("{\"text\": %s, \"ids\": ", json_object_to_json_string_ext(s, JSON_C_TO_STRING_PLAIN));
    json_object_put(s);
    print_ids_json(ids, stdout);
    puts("}");
}

struct tllm_tok *cli_load_tokenizer(const char *dir) {
    char *gguf;
    struct tllm_tok *t;
    if (tllm_model_gguf_path(dir, &gguf)) cli_die_lib();
    if (gguf) {
        if (tllm_gguf_file_tokenizer(gguf, &t, NULL)) cli_die_lib();
        free(gguf);
        return t;
    }
    char *path = tllm_path_join(dir, "tokenizer.json");
    if (!path) cli_die("out of memory");
    if (tllm_model_dir_check(dir) || tllm_tok_load(path, &t)) cli_die_lib();
    free(path);
    return t;
}

static void encode_or_die(struct tllm_tok *t, const char *text, size_t len, int special, struct tllm_ids *ids) {
    ids->len = 0;
    if (tllm_tok_encode(t, text, len, special, ids)) cli_die_lib();
}

static int run_jsonl(struct tllm_tok *t, const char *path, int special) {
    FILE *fp = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!fp) cli_die("%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int errors = 0;
    struct tllm_ids ids = {0};
    int too_long;
    while ((n = cli_getline(&line, &cap, fp, TOKENIZE_MAX_INPUT, 0, &too_long, NULL)) != -1) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        struct json_object *o = NULL, *jt;
        const char *err = NULL;
        if (too_long) err = "the line is longer than the limit (1 GiB)";
        else if (tllm_json_parse(line, (size_t)n, &o, "line")) err = "invalid JSON";
        else if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "text", &jt) ||
                 !json_object_is_type(jt, json_type_string))
            err = "expected an object with a string \"text\"";
        if (err) {
            printf("{\"line\": %ld, \"error\": \"%s\"}\n", lineno, err);
            fprintf(stderr, "tllm: %s:%ld: %s\n", path, lineno, err);
            errors++;
        } else {
            encode_or_die(t, json_object_get_string(jt), (size_t)json_object_get_string_len(jt), special, &ids);
            fputs("{\"ids\": ", stdout);
            print_ids_json(&ids, stdout);
            puts("}");
        }
        json_object_put(o);
    }
    free(line);
    tllm_ids_free(&ids);
    if (fp != stdin) fclose(fp);
    return errors ? 1 : 0;
}

static int run_chat(struct tllm_tok *t, const char *dir, const char *path, int json, int no_template,
                    const char *tpl_file) {
    struct tllm_chat_template tpl;
    struct json_object *root, *messages, *tools, *extra;
    cli_load_template(dir, tpl_file, no_template, &tpl);
    cli_read_conversation(path, &root, &messages, &tools, &extra);
    int gen_prompt = 1;
    struct json_object *g;
    if (extra && json_object_object_get_ex(extra, "add_generation_prompt", &g)) gen_prompt = json_object_get_boolean(g);
    struct tllm_buf text = {0};
    struct tllm_ids ids = {0};
    if (tllm_chat_render_json(&tpl, messages, tools, extra, gen_prompt, &text)) cli_die("%s: %s", path, tllm_errmsg());
    encode_or_die(t, text.data, text.len, 1, &ids);
    if (json) print_text_and_ids(text.data, text.len, &ids);
    else {
        print_ids_json(&ids, stdout);
        putchar('\n');
    }
    tllm_buf_free(&text);
    tllm_ids_free(&ids);
    tllm_chat_template_free(&tpl);
    json_object_put(extra);
    json_object_put(root);
    return 0;
}

static int run_bench(struct tllm_tok *t, char **files, int n) {
    printf("| file | MB | tokens | MB/s | bytes/token |\n| --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < n; i++) {
        char *text;
        size_t len;
        if (tllm_read_file(files[i], TOKENIZE_MAX_INPUT, &text, &len)) cli_die_lib();
        struct tllm_ids ids = {0};
        encode_or_die(t, text, len, 0, &ids); /* warm-up: fills the BPE cache as a long run would */
        struct timespec a, b;
        double secs = 0;
        int reps = 0;
        clock_gettime(CLOCK_MONOTONIC, &a);
        do {
            encode_or_die(t, text, len, 0, &ids);
            reps++;
            clock_gettime(CLOCK_MONOTONIC, &b);
            secs = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        } while (secs < 1.0);
        double mb = (double)len / 1e6;
        printf("| %s | %.2f | %zu | %.1f | %.2f |\n", files[i], mb, ids.len, mb * reps / secs,
               ids.len ? (double)len / (double)ids.len : 0);
        tllm_ids_free(&ids);
        free(text);
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *jsonl = NULL, *chat = NULL, *decode = NULL, *text = NULL, *tpl_file = NULL;
    int special = 1, json = 0, skip_special = 0, no_template = 0, bench = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--file")) file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--jsonl")) jsonl = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--chat")) chat = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--decode")) decode = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--no-special")) special = 0;
        else if (!strcmp(a, "--skip-special")) skip_special = 1;
        else if (!strcmp(a, "--no-template")) no_template = 1;
        else if (!strcmp(a, "--chat-template")) tpl_file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--bench")) bench = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') cli_die("tokenize: unknown option '%s' (see tllm tokenize --help)", a);
        else if (bench) { argv[bench++] = argv[i]; }
        else if (text) cli_die("tokenize: more than one TEXT argument (quote the text)");
        else text = a;
    }
    dir = cli_model_dir(dir);
    int modes = !!file + !!jsonl + !!chat + !!decode + !!text + !!bench;
    if (modes != 1) cli_die("tokenize: give exactly one of TEXT, --file, --jsonl, --chat, --decode, --bench");
    struct tllm_tok *t = cli_load_tokenizer(dir);
    int rc = 0;
    if (bench) {
        if (bench == 1) cli_die("tokenize: --bench needs files");
        rc = run_bench(t, argv + 1, bench - 1);
    } else if (jsonl) {
        rc = run_jsonl(t, jsonl, special);
    } else if (chat) {
        rc = run_chat(t, dir, chat, json, no_template, tpl_file);
    } else if (decode) {
        int n;
        int32_t *ids = cli_parse_ids("--decode", decode, &n);
        struct tllm_buf out = {0};
        if (tllm_tok_decode(t, ids, (size_t)n, skip_special, &out)) cli_die_lib();
        fwrite(out.data, 1, out.len, stdout);
        if (isatty(STDOUT_FILENO)) putchar('\n');
        tllm_buf_free(&out);
        free(ids);
    } else {
        char *buf = NULL;
        size_t len;
        if (file) {
            if (tllm_read_file(file, TOKENIZE_MAX_INPUT, &buf, &len)) cli_die_lib();
        } else {
            len = strlen(text);
        }
        struct tllm_ids ids = {0};
        encode_or_die(t, file ? buf : text, len, special, &ids);
        if (json) print_text_and_ids(file ? buf : text, len, &ids);
        else {
            print_ids_json(&ids, stdout);
            putchar('\n');
        }
        tllm_ids_free(&ids);
        free(buf);
    }
    tllm_tok_free(t);
    return rc;
}
