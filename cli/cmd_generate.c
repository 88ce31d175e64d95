/* tllm generate: one prompt (streamed), or a whole prompt file to JSONL (batch mode). */
#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/base/error.h"
#include "engine/base/json_util.h"
#include "cli/session.h"

static const char usage[] =
    "usage: tllm generate [-m MODEL] -p TEXT [-n 256] [--chat] [--system S] [--json] [options]\n"
    "       tllm generate [-m MODEL] --prompt-ids 1,2,3 [-n 256] [options]\n"
    "       tllm generate [-m MODEL] --prompts FILE [-o OUT.jsonl] [options]\n"
    "  -p, --prompt TEXT      a raw completion prompt (with --chat: the user's message)\n"
    "  --prompt-ids LIST      prompt token ids (checkpoints without a tokenizer)\n"
    "  -n, --n-predict N      tokens to generate at most (-1: until the context is full; default 256)\n"
    "  --chat                 wrap the prompt with the chat template; --system S sets the system prompt\n"
    "  --json                 print one JSON object: ids, text, finish_reason and statistics\n"
    "  --prompts FILE         batch: plain text (a prompt per line) or JSONL ({\"id\", \"prompt\"} or\n"
    "                         {\"id\", \"messages\"}, optional max_tokens, temperature, top_p, top_k, min_p,\n"
    "                         seed, stop); one JSON line per input line, flushed as it is done. A re-run\n"
    "                         with the same -o skips the ids already there.\n";

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static int stream_out(const char *text, size_t len, void *user) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return interrupted;
}

static int stop_if_interrupted(const char *text, size_t len, void *user) {
    (void)text, (void)len, (void)user;
    return interrupted;
}

static void print_stats(const struct cli_session *s, const struct tllm_gen_result *r) {
    double pt = r->prompt_secs > 0 ? r->n_prompt / r->prompt_secs : 0;
    double gt = r->gen_secs > 0 ? (double)r->ids.len / r->gen_secs : 0;
    fprintf(stderr, "\nprompt: %d tokens, %.1f tok/s | generated: %zu tokens, %.1f tok/s | load %.2f s | peak memory %.0f MiB | %s\n",
            r->n_prompt, pt, r->ids.len, gt, s->load_secs, (double)tllm_peak_rss() / (1 << 20),
            tllm_finish_name(r->finish));
}

/* The JSON record of a result; `id` (may be NULL) comes first, as batch output lines start with it. */
static struct json_object *result_json(const struct tllm_gen_result *r, struct json_object *id, int with_ids) {
    struct json_object *o = json_object_new_object();
    if (id) json_object_object_add(o, "id", json_object_get(id));
    if (with_ids) {
        struct json_object *ids = json_object_new_array();
        for (size_t i = 0; i < r->ids.len; i++) json_object_array_add(ids, json_object_new_int(r->ids.data[i]));
        json_object_object_add(o, "ids", ids);
    }
    json_object_object_add(o, "text", json_object_new_string_len(r->text.data ? r->text.data : "", (int)r->text.len));
    json_object_object_add(o, "prompt_tokens", json_object_new_int(r->n_prompt));
    json_object_object_add(o, "completion_tokens", json_object_new_int((int)r->ids.len));
    json_object_object_add(o, "finish_reason", json_object_new_string(tllm_finish_name(r->finish)));
    json_object_object_add(o, "prompt_secs", json_object_new_double(r->prompt_secs));
    json_object_object_add(o, "gen_secs", json_object_new_double(r->gen_secs));
    json_object_object_add(o, "prompt_tps", json_object_new_double(r->prompt_secs > 0 ? r->n_prompt / r->prompt_secs : 0));
    json_object_object_add(o, "gen_tps", json_object_new_double(r->gen_secs > 0 ? (double)r->ids.len / r->gen_secs : 0));
    return o;
}

/* A user prompt as ids: raw text, or (chat) wrapped in the chat template with an optional system prompt. */
static int encode_user_prompt(struct cli_session *s, const char *text, size_t len, int chat, const char *system,
                              struct tllm_ids *out) {
    if (!chat) return tllm_tok_encode(s->tok, text, len, 1, out);
    struct tllm_chat_msg m[2] = {{"system", system}, {"user", text}};
    return cli_encode_chat(s, system ? m : m + 1, system ? 2 : 1, out);
}

/* Run one generation from a fresh context. */
static int run_one(struct cli_session *s, const struct tllm_sampler_params *sp, const struct tllm_ids *prompt,
                   int max_new, const char *const *stop, int n_stop, tllm_gen_cb cb, struct tllm_gen_result *r) {
    struct tllm_sampler smp;
    memset(r, 0, sizeof *r); /* freeable even when we fail before generating */
    if (tllm_sampler_init(&smp, sp, s->m->cfg.vocab_size)) return -1;
    tllm_ctx_reset(s->ctx);
    struct tllm_gen_params gp = {.max_new = max_new, .eos = s->gd->eos, .n_eos = s->gd->n_eos, .stop = stop,
                                 .n_stop = n_stop, .skip_special = 1};
    int rc = tllm_generate(s->ctx, s->tok, &smp, prompt->data, (int)prompt->len, &gp, cb, NULL, r);
    tllm_sampler_free(&smp);
    return rc;
}

/* ---- batch mode ---- */

/* The ids already answered in OUT (one canonical JSON string per id); trims a torn last line. */
static struct json_object *load_done_ids(const char *out) {
    struct json_object *done = json_object_new_object();
    FILE *fp = fopen(out, "r+b");
    if (!fp) return done;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long good_end = 0;
    int too_long;
    /* our own records are short; a longer line is not one of them */
    while ((n = cli_getline(&line, &cap, fp, CLI_MAX_PROMPT_LINE, &too_long)) != -1) {
        if (too_long || n == 0 || line[n - 1] != '\n') break; /* a torn last line from an interrupted run */
        struct json_object *o = NULL, *id;
        if (tllm_json_parse(line, (size_t)n, &o, out) == TLLM_OK && json_object_object_get_ex(o, "id", &id))
            json_object_object_add(done, json_object_to_json_string_ext(id, JSON_C_TO_STRING_PLAIN), NULL);
        json_object_put(o);
        good_end = ftell(fp);
    }
    free(line);
    if (ftruncate(fileno(fp), good_end) != 0) cli_die("%s: cannot trim the torn last line: %s", out, strerror(errno));
    fclose(fp);
    return done;
}

static int emit(FILE *out, struct json_object *rec) {
    fputs(json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PLAIN), out);
    fputc('\n', out);
    return fflush(out);
}

static void error_record(FILE *out, struct json_object *id, const char *fmt, const char *detail, const char *file,
                         long lineno) {
    struct json_object *rec = json_object_new_object();
    char msg[600];
    snprintf(msg, sizeof msg, fmt, detail);
    json_object_object_add(rec, "id", json_object_get(id));
    json_object_object_add(rec, "error", json_object_new_string(msg));
    emit(out, rec);
    json_object_put(rec);
    fprintf(stderr, "\rtllm: %s:%ld: %s\n", file, lineno, msg);
}

static int run_batch(struct cli_session *s, const char *file, const char *out_path, const struct cli_sampling *cs,
                     int max_new, int chat, const char *system) {
    FILE *in = fopen(file, "rb");
    if (!in) cli_die("%s: cannot open: %s", file, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long total = 0;
    int jsonl = -1;
    int too_long;
    while ((n = cli_getline(&line, &cap, in, CLI_MAX_PROMPT_LINE, &too_long)) != -1) { /* count lines, and decide the format from the first */
        total++;
        if (jsonl < 0) {
            char *p = line;
            while (*p == ' ' || *p == '\t') p++;
            if (*p != '\n' && *p != '\r' && *p) jsonl = *p == '{';
        }
    }
    if (total == 0) cli_die("%s: the prompt file is empty", file);
    rewind(in);
    struct json_object *done = out_path ? load_done_ids(out_path) : json_object_new_object();
    FILE *out = out_path ? fopen(out_path, "ab") : stdout;
    if (!out) cli_die("%s: cannot open for writing: %s", out_path, strerror(errno));
    int progress = isatty(STDERR_FILENO);
    long lineno = 0, answered = 0, skipped = 0, errors = 0;
    size_t gen_tokens = 0;
    double t_start = tllm_now(), gen_time = 0;
    struct tllm_sampler_params base = cli_sampling_resolve(s, cs);
    while (!interrupted && (n = cli_getline(&line, &cap, in, CLI_MAX_PROMPT_LINE, &too_long)) != -1) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        struct cli_prompt_line bl;
        cli_prompt_line_parse(&bl, line, (size_t)n, jsonl == 1, lineno, &base, cs->stop, cs->n_stop, max_new);
        if (too_long) snprintf(bl.err, sizeof bl.err, "the line is longer than %u bytes", CLI_MAX_PROMPT_LINE);
        struct tllm_ids prompt = {0};
        /* ids already answered are skipped before any work on them */
        if (json_object_object_get_ex(done, json_object_to_json_string_ext(bl.id, JSON_C_TO_STRING_PLAIN), NULL)) {
            skipped++;
        } else {
            if (bl.err[0]) {
            } else if (bl.n_msgs) {
                if (cli_encode_chat(s, bl.msgs, bl.n_msgs, &prompt)) snprintf(bl.err, sizeof bl.err, "%s", tllm_errmsg());
            } else if (encode_user_prompt(s, bl.text, bl.text_len, chat, system, &prompt)) {
                snprintf(bl.err, sizeof bl.err, "%s", tllm_errmsg());
            }
            struct tllm_gen_result r;
            if (bl.err[0]) {
                error_record(out, bl.id, "%s", bl.err, file, lineno);
                errors++;
            } else if (run_one(s, &bl.sp, &prompt, bl.max_new, bl.stop, bl.n_stop, stop_if_interrupted, &r)) {
                error_record(out, bl.id, "%s", tllm_errmsg(), file, lineno);
                errors++;
                tllm_gen_result_free(&r);
            } else {
                if (r.finish != TLLM_FINISH_INTERRUPTED) { /* an interrupted line is redone on resume */
                    struct json_object *rec = result_json(&r, bl.id, 0);
                    if (emit(out, rec) != 0) cli_die("%s: write failed: %s", out_path ? out_path : "stdout", strerror(errno));
                    json_object_put(rec);
                    answered++;
                    gen_tokens += r.ids.len;
                    gen_time += r.gen_secs;
                }
                tllm_gen_result_free(&r);
            }
        }
        if (progress) {
            double el = tllm_now() - t_start, per = lineno > skipped ? el / (double)(lineno - skipped) : 0;
            fprintf(stderr, "\r[%ld/%ld] %.1f tok/s, ETA %.0f s   ", lineno, total,
                    gen_time > 0 ? (double)gen_tokens / gen_time : 0, per * (double)(total - lineno));
        }
        tllm_ids_free(&prompt);
        cli_prompt_line_free(&bl);
    }
    free(line);
    fclose(in);
    json_object_put(done);
    if (out != stdout) fclose(out);
    fprintf(stderr, "%stllm: %ld answered, %ld already done, %ld errors%s\n", progress ? "\n" : "", answered, skipped,
            errors, interrupted ? " (interrupted: run again with the same -o to resume)" : "");
    return interrupted ? 130 : 0;
}

int cmd_generate(int argc, char **argv) {
    struct cli_model_opts mo = {0};
    struct cli_sampling cs = {0};
    const char *prompt = NULL, *ids_s = NULL, *prompts = NULL, *out = NULL, *system = NULL;
    int max_new = 256, chat = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_model_opt(argc, argv, &i, &mo) || cli_sampling_opt(argc, argv, &i, &cs)) continue;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--prompt-ids")) ids_s = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--prompts")) prompts = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) max_new = (int)cli_int(a, cli_value(argc, argv, &i), -1, 1 << 24);
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--system")) system = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n%s\n%s", usage, cli_model_opts_help, cli_sampling_help);
            return 0;
        } else cli_die("generate: unknown option '%s' (see tllm generate --help)", a);
    }
    if (!!prompt + !!ids_s + !!prompts != 1) cli_die("generate: give one of -p TEXT, --prompt-ids LIST, --prompts FILE");
    if (out && !prompts) cli_die("generate: -o is for batch mode (--prompts FILE)");
    struct cli_session s;
    cli_session_open(&s, &mo, !ids_s);
    signal(SIGINT, on_sigint);
    if (prompts) {
        int rc = run_batch(&s, prompts, out, &cs, max_new, chat, system);
        cli_session_close(&s);
        return rc;
    }
    struct tllm_ids ids = {0};
    if (ids_s) {
        int n;
        int32_t *v = cli_parse_ids("--prompt-ids", ids_s, &n);
        tllm_ids_append(&ids, v, (size_t)n);
        free(v);
    } else {
        if (!*prompt) cli_die("generate: the prompt is empty");
        char err[256];
        if (cli_check_utf8("-p: the prompt", prompt, strlen(prompt), err, sizeof err)) cli_die("%s", err);
        if (encode_user_prompt(&s, prompt, strlen(prompt), chat, system, &ids)) cli_die_lib();
    }
    struct tllm_sampler_params sp = cli_sampling_resolve(&s, &cs);
    struct tllm_gen_result r;
    if (run_one(&s, &sp, &ids, max_new, cs.stop, cs.n_stop, json ? stop_if_interrupted : stream_out, &r)) cli_die_lib();
    if (json) {
        struct json_object *o = result_json(&r, NULL, 1);
        json_object_object_add(o, "load_secs", json_object_new_double(s.load_secs));
        json_object_object_add(o, "peak_rss_bytes", json_object_new_int64((int64_t)tllm_peak_rss()));
        puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
        json_object_put(o);
    } else {
        if (!s.tok) { /* no tokenizer: print the ids */
            for (size_t i = 0; i < r.ids.len; i++) printf(i ? ",%d" : "%d", r.ids.data[i]);
        }
        putchar('\n');
        if (r.finish == TLLM_FINISH_CONTEXT) fprintf(stderr, "tllm: the context is full (%d tokens); use -c to enlarge it\n", s.ctx->n_ctx);
        print_stats(&s, &r);
    }
    tllm_gen_result_free(&r);
    tllm_ids_free(&ids);
    cli_session_close(&s);
    return r.finish == TLLM_FINISH_INTERRUPTED ? 130 : 0;
}
