/* tllm generate: one prompt (streamed), or a whole prompt file to JSONL (batch mode). */
#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "base/error.h"
#include "base/json_util.h"
#include "cli/batch_io.h"
#include "cli/session.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/grammar/json_schema.h"
#include "engine/oai/tool_calls.h"
#include "engine/run/scheduler.h"

static const char usage[] =
    "usage: tllm generate [-m MODEL] -p TEXT [-n 256] [--chat] [--system S] [--json] [options]\n"
    "       tllm generate [-m MODEL] --prompt-ids 1,2,3 [-n 256] [options]\n"
    "       tllm generate [-m MODEL] --prompts FILE [-o OUT.jsonl] [options]\n"
    "  -p, --prompt TEXT      a raw completion prompt (with --chat: the user's message)\n"
    "  --prompt-ids LIST      prompt token ids (checkpoints without a tokenizer)\n"
    "  -n, --n-predict N      tokens to generate at most (-1: until the context is full; default 256)\n"
    "  --chat                 wrap the prompt with the chat template; --system S sets the system prompt\n"
    "  --json                 print one JSON object: ids, text, finish_reason and statistics\n"
    "  --ignore-eos           go on past the end-of-text token (benchmarks: every answer runs -n tokens)\n"
    "  --json-schema SCHEMA   the answer is JSON that follows SCHEMA (a JSON Schema, inline or a file;\n"
    "                         '{}' for any JSON value): sampling is constrained to it. In batch mode each\n"
    "                         line without its own \"response_format\" (OpenAI's object) follows it\n"
    "  --prompts FILE         batch: plain text (a prompt per line) or JSONL ({\"id\", \"prompt\"} with text\n"
    "                         or a list of token ids, or {\"id\", \"messages\"}; optional max_tokens,\n"
    "                         temperature, top_p, top_k, min_p, seed, stop, response_format); one JSON line per input line,\n"
    "                         flushed as it is done (with \"ids\" where the model has no tokenizer). A re-run\n"
    "                         with the same -o skips the ids already there. FILE - is standard input.\n"
    "  -o, --output OUT       the records (default: standard output); one writer at a time; a file with\n"
    "                         lines that are not tllm records is refused unless --force\n"
    "  -np, --parallel N      batch: answer up to N prompts at once (default 16 on the CPU, 64 on a device),\n"
    "                         each record written as it finishes (so not in input order; each keeps its id);\n"
    "                         -c sizes the KV cache they share (default: 1024 positions a prompt, at least\n"
    "                         4096); on the device when one is in use, its blocks there\n"
    "  -b, --batch-size N     batch: tokens per step at most, prompt chunks included (default 512)\n";

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

/* A JSONL line's messages (with their tool calls and results) and the tools offered, as the template
 * renders them: the server's rendering of the same chat */
static int encode_chat_json(struct cli_session *s, struct json_object *chat, struct json_object *tools, struct tllm_ids *out) {
    struct tllm_buf text = {0};
    int rc = tllm_chat_render_json(s->tpl, chat, tools, NULL, 1, &text);
    if (!rc) rc = tllm_tok_encode(s->tok, text.data, text.len, 1, out);
    tllm_buf_free(&text);
    return rc;
}

/* --json-schema's argument: inline JSON, else a file holding it */
static struct tllm_grammar *load_schema(const char *arg) {
    const char *p = arg;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    struct tllm_grammar *g = NULL;
    if (*p == '{' || !strcmp(p, "true")) {
        if (tllm_schema_grammar_text(arg, "--json-schema", &g)) cli_die_lib();
        return g;
    }
    struct json_object *o = NULL;
    int rc = tllm_json_load_file(arg, 64u << 20, &o);
    if (!rc) rc = tllm_schema_grammar(o, arg, &g);
    json_object_put(o);
    if (rc) cli_die_lib();
    return g;
}

/* Run one generation from a fresh context. */
static int run_one(struct cli_session *s, const struct tllm_sampler_params *sp, const struct tllm_ids *prompt,
                   int max_new, const char *const *stop, int n_stop, const struct tllm_grammar *grammar, int ignore_eos,
                   tllm_gen_cb cb, struct tllm_gen_result *r) {
    struct tllm_sampler smp;
    memset(r, 0, sizeof *r); /* freeable even when we fail before generating */
    if (tllm_sampler_init(&smp, sp, s->m->cfg.vocab_size)) return -1;
    tllm_ctx_reset(s->ctx);
    struct tllm_gen_params gp = {.max_new = max_new, .eos = s->gd->eos, .n_eos = ignore_eos ? 0 : s->gd->n_eos, .stop = stop,
                                 .n_stop = n_stop, .skip_special = 1, .grammar = grammar};
    int rc = tllm_generate(s->ctx, s->tok, &smp, prompt->data, (int)prompt->len, &gp, cb, NULL, r);
    tllm_sampler_free(&smp);
    return rc;
}

/* ---- batch mode ---- */

/* dup_of: the line whose id this line repeats (0: none). Such a record says "line" too, so that a resumed
 * run knows this line was answered while its id's first line may not have been */
static void error_record(struct batch_out *out, struct json_object *id, const char *msg, const char *file, long lineno,
                         long dup_of) {
    struct json_object *rec = json_object_new_object();
    json_object_object_add(rec, "id", json_object_get(id));
    json_object_object_add(rec, "error", json_object_new_string(msg));
    if (dup_of) {
        json_object_object_add(rec, "line", json_object_new_int64(lineno));
        json_object_object_add(rec, "duplicate_of", json_object_new_int64(dup_of));
    }
    batch_out_emit(out, rec);
    json_object_put(rec);
    fprintf(stderr, "\rtllm: %s:%ld: %s\n", file, lineno, msg);
}

/* An id names one line of the file: a string or a number, and no other line's (*dup_of: that line) */
static int check_id(struct json_object *id, const char *key, struct json_object *seen, long lineno, char *err, size_t cap,
                    long *dup_of) {
    struct json_object *first;
    *dup_of = 0;
    if (!json_object_is_type(id, json_type_string) && !json_object_is_type(id, json_type_int) &&
        !json_object_is_type(id, json_type_double))
        return snprintf(err, cap, "\"id\" must be a string or a number, not %s", key), 1;
    if (json_object_object_get_ex(seen, key, &first))
        return *dup_of = (long)json_object_get_int64(first),
               snprintf(err, cap, "id %.200s is also line %ld's (ids must be unique in a prompt file)", key, *dup_of), 1;
    json_object_object_add(seen, key, json_object_new_int64(lineno));
    return 0;
}

/* What a batch run carries: the files, the counters, and (parallel) the scheduler */
struct batch {
    struct cli_session *s;
    struct batch_in in;
    struct batch_out out;
    struct tllm_sched *sched; /* on the CPU threads, or on the device when one is in use */
    const struct tllm_grammar *grammar; /* --json-schema's, for lines without their own */
    struct tllm_grammar_cache grams;    /* recent lines' grammars by what they were compiled from, as text */
    int ignore_eos;
    long answered, skipped, errors;
    size_t gen_tokens;
    double t_start, gen_time;
};

/* A line whose "response_format" (or tools and tool_choice) is a recent line's takes that line's grammar:
 * the scheduler pairs sequences by grammar, so lines on one schema share its token masks. */
static void share_schema(struct batch *b, struct cli_prompt_line *bl) {
    if (bl->grammar && bl->grammar_key) bl->grammar = tllm_grammar_cache_share(&b->grams, bl->grammar_key, bl->grammar);
}

/* The line a request came from, until its record is written */
struct job {
    struct json_object *id;
    long lineno;
    struct tllm_grammar *grammar; /* the line's own response_format or tool calls, or NULL */
    struct json_object *tools;    /* the tools the answer may call, or NULL */
    int max_calls;
};

static void record_result(struct batch *b, const struct job *j, struct tllm_gen_result *r) {
    if (r->finish == TLLM_FINISH_INTERRUPTED) return; /* an interrupted line is redone on resume */
    struct json_object *rec = result_json(r, j->id, !b->s->tok); /* no tokenizer: the ids are the answer */
    struct json_object *calls;
    char *content;
    /* the calls in the answer, as the server returns them: "text" keeps what is around them */
    if (j->tools && oai_tool_calls_parse(r->text.data ? r->text.data : "", r->text.len, j->tools, j->max_calls, &calls, &content)) {
        json_object_object_add(rec, "text", json_object_new_string(content ? content : ""));
        json_object_object_add(rec, "tool_calls", calls);
        json_object_object_add(rec, "finish_reason", json_object_new_string("tool_calls"));
        free(content);
    }
    batch_out_emit(&b->out, rec);
    json_object_put(rec);
    b->answered++;
    b->gen_tokens += r->ids.len;
    b->gen_time += r->gen_secs;
}

/* The scheduler's done callback: the record is written as the request finishes */
static void on_done(void *arg, void *user, int rc, const char *msg, struct tllm_gen_result *r) {
    struct batch *b = arg;
    struct job *j = user;
    if (rc) {
        error_record(&b->out, j->id, msg ? msg : tllm_errmsg(), b->in.name, j->lineno, 0);
        b->errors++;
    } else
        record_result(b, j, r);
    json_object_put(j->id);
    json_object_put(j->tools);
    tllm_grammar_free(j->grammar);
    free(j);
}

static int batch_cb(const char *text, size_t len, void *user) {
    (void)text, (void)len, (void)user;
    return interrupted;
}

/* One prompt, queued to the scheduler */
static void run_prompt(struct batch *b, struct cli_prompt_line *bl, struct tllm_ids *prompt, long lineno) {
    struct cli_session *s = b->s;
    struct job *j = malloc(sizeof *j);
    if (!j) cli_die("out of memory");
    j->id = json_object_get(bl->id), j->lineno = lineno;
    j->tools = json_object_get(oai_callable_tools(&bl->chat)), j->max_calls = oai_max_calls(&bl->chat);
    j->grammar = bl->grammar; /* the job's now */
    bl->grammar = NULL;
    struct tllm_sched_req rq = {.prompt = prompt->data, .n_prompt = (int)prompt->len, .sampling = bl->sp,
                                .max_new = bl->max_new, .stop = bl->stop, .n_stop = bl->n_stop, .eos = s->gd->eos,
                                .n_eos = b->ignore_eos ? 0 : s->gd->n_eos, .skip_special = 1, .cb = batch_cb, .user = j,
                                .grammar = j->grammar ? j->grammar : b->grammar};
    if (tllm_sched_submit(b->sched, &rq)) cli_die_lib();
}

/* What is done, and the tokens of all per second of wall time */
static void show_progress(struct batch *b) {
    double el = tllm_now() - b->t_start;
    long done = b->answered + b->errors;
    struct tllm_sched_stats st;
    tllm_sched_stats(b->sched, &st);
    long total = b->in.total ? b->in.total - b->skipped : 0;
    if (total) fprintf(stderr, "\r[%ld/%ld] %.1f tok/s, %d running   ", done, total, el > 0 ? (double)st.gen_tokens / el : 0,
                       tllm_sched_running(b->sched));
    else fprintf(stderr, "\r[%ld] %.1f tok/s, %d running   ", done, el > 0 ? (double)st.gen_tokens / el : 0,
                 tllm_sched_running(b->sched));
}

static int run_batch(struct cli_session *s, const char *file, const char *out_path, int force, const struct cli_sampling *cs,
                     int max_new, int chat, const char *system, const struct tllm_grammar *grammar, int ignore_eos,
                     const struct tllm_sched_params *sp) {
    struct batch b = {.s = s, .grammar = grammar, .ignore_eos = ignore_eos};
    batch_in_open(&b.in, file);
    if (b.in.regular && b.in.total == 0) cli_die("%s: the prompt file is empty", file);
    batch_out_open(&b.out, out_path, &b.in, force);
    if (tllm_sched_init(&b.sched, s->m, s->tok, sp, on_done, &b)) cli_die_lib();
    struct json_object *seen = json_object_new_object(); /* id -> the line that has it */
    int progress = isatty(STDERR_FILENO), eof = 0;
    long lineno = 0;
    b.t_start = tllm_now();
    struct tllm_sampler_params base = cli_sampling_resolve(s, cs);
    while (!interrupted) {
        /* read while the scheduler's queue is short (a file of any length costs a few lines' memory) */
        while (!eof && !interrupted && tllm_sched_waiting(b.sched) < sp->n_parallel) {
            int too_long;
            ssize_t n = batch_in_next(&b.in, &too_long);
            if (n == -1) {
                eof = 1;
                break;
            }
            lineno++;
            struct cli_prompt_line bl;
            cli_prompt_line_parse(&bl, b.in.line, (size_t)n, b.in.jsonl == 1, lineno, &base, cs->stop, cs->n_stop, max_new);
            if (too_long) snprintf(bl.err, sizeof bl.err, "the line is longer than %u bytes", CLI_MAX_PROMPT_LINE);
            share_schema(&b, &bl);
            struct tllm_ids prompt = {0};
            const char *key = json_object_to_json_string_ext(bl.id, JSON_C_TO_STRING_PLAIN);
            char id_err[320] = "", line_key[24];
            long dup_of = 0;
            snprintf(line_key, sizeof line_key, "%ld", lineno);
            /* ids already answered, and repeated ids already refused, are skipped before any work on them */
            if (json_object_object_get_ex(b.out.done, key, NULL) || json_object_object_get_ex(b.out.dups, line_key, NULL)) {
                b.skipped++;
                if (!json_object_object_get_ex(seen, key, NULL)) json_object_object_add(seen, key, json_object_new_int64(lineno));
            } else {
                if (check_id(bl.id, key, seen, lineno, id_err, sizeof id_err, &dup_of)) {
                } else if (bl.err[0]) {
                } else if (bl.n_ids) {
                    if (tllm_ids_append(&prompt, bl.ids, (size_t)bl.n_ids)) cli_die("out of memory");
                } else if (!s->tok) {
                    snprintf(bl.err, sizeof bl.err, "the checkpoint has no tokenizer.json: give \"prompt\" as a list of token ids");
                } else if (bl.chat.n_msgs) {
                    if (encode_chat_json(s, bl.chat.chat, oai_callable_tools(&bl.chat), &prompt))
                        snprintf(bl.err, sizeof bl.err, "%s", tllm_errmsg());
                } else if (encode_user_prompt(s, bl.text, bl.text_len, chat, system, &prompt)) {
                    snprintf(bl.err, sizeof bl.err, "%s", tllm_errmsg());
                }
                if (!bl.err[0] && b.ignore_eos && (bl.grammar || b.grammar))
                    snprintf(bl.err, sizeof bl.err, "--ignore-eos cannot be used with a response_format: the answer ends where it is complete");
                if (id_err[0] || bl.err[0]) {
                    error_record(&b.out, bl.id, id_err[0] ? id_err : bl.err, b.in.name, lineno, dup_of);
                    b.errors++;
                } else
                    run_prompt(&b, &bl, &prompt, lineno);
            }
            tllm_ids_free(&prompt);
            cli_prompt_line_free(&bl);
        }
        if (eof && !tllm_sched_waiting(b.sched) && !tllm_sched_running(b.sched)) break;
        if (tllm_sched_step(b.sched)) cli_die_lib(); /* the records written so far stand; a re-run resumes */
        if (progress) show_progress(&b);
    }
    char work[320] = "";
    {
        struct tllm_sched_stats st;
        tllm_sched_stats(b.sched, &st);
        double el = tllm_now() - b.t_start;
        int n = snprintf(work, sizeof work, "; prompt tokens computed %lld, reused %lld (cached prefixes), generated %lld (%.1f tok/s)"
                         "; %.2f s of %.2f s in forward steps",
                         st.prompt_tokens, st.reused_tokens, st.gen_tokens, el > 0 ? (double)st.gen_tokens / el : 0, st.step_secs, el);
        if (st.mask_secs > 0 && n > 0 && (size_t)n < sizeof work)
            snprintf(work + n, sizeof work - (size_t)n, " (%.3f s of them making the grammars' masks)", st.mask_secs);
        tllm_sched_drop_all(b.sched); /* interrupted: the requests in flight are redone on resume */
        int n_free, n_total; /* every block is back, whatever ended the run (tests rely on this check) */
        tllm_sched_kv_blocks(b.sched, &n_free, &n_total);
        if (n_free != n_total) cli_die("internal error: %d KV blocks still held after the run", n_total - n_free);
        tllm_sched_free(b.sched);
    }
    tllm_grammar_cache_free(&b.grams);
    int stopped = b.in.stopped;
    batch_in_close(&b.in);
    batch_out_close(&b.out);
    json_object_put(seen);
    if (lineno == 0 && !interrupted) cli_die("%s: the prompt file is empty", file);
    fprintf(stderr, "%stllm: %ld answered, %ld already done, %ld errors%s%s\n", progress ? "\n" : "", b.answered, b.skipped,
            b.errors, work, interrupted ? " (interrupted: run again with the same -o to resume)" : "");
    if (stopped) cli_die("%s: line %ld is longer than %u bytes and has no end in sight: the rest is not read", file, lineno,
                         CLI_MAX_PROMPT_LINE);
    return interrupted ? 130 : 0;
}

int cmd_generate(int argc, char **argv) {
    struct cli_model_opts mo = {0};
    struct cli_sampling cs = {0};
    const char *prompt = NULL, *ids_s = NULL, *prompts = NULL, *out = NULL, *system = NULL, *schema = NULL;
    int max_new = 256, chat = 0, json = 0, force = 0, parallel = 0, n_batch = 0, ignore_eos = 0;
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
        else if (!strcmp(a, "--json-schema")) schema = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) parallel = (int)cli_int(a, cli_value(argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) n_batch = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n%s\n%s", usage, cli_model_opts_help, cli_sampling_help);
            return 0;
        } else cli_die("generate: unknown option '%s' (see tllm generate --help)", a);
    }
    if (!!prompt + !!ids_s + !!prompts != 1) cli_die("generate: give one of -p TEXT, --prompt-ids LIST, --prompts FILE");
    if (out && !prompts) cli_die("generate: -o is for batch mode (--prompts FILE)");
    if (parallel && !prompts) cli_die("generate: --parallel is for batch mode (--prompts FILE)");
    if (schema && ignore_eos) cli_die("generate: --ignore-eos cannot be used with --json-schema: the answer ends where it is complete");
    struct tllm_grammar *grammar = schema ? load_schema(schema) : NULL; /* before the model: a bad schema fails fast */
    struct cli_session s;
    int kv_size = mo.n_ctx; /* with many sequences -c sizes the shared cache, which may pass one sequence's maximum */
    if (prompts) mo.n_ctx = 0;
    cli_session_open(&s, &mo, !ids_s && !prompts);
    signal(SIGINT, on_sigint);
    if (prompts) {
        if (!mo.decode_levels) s.m->decode_levels = 1; /* a throughput job: --fast-decode unless told otherwise */
        struct tllm_backend *dev = cli_session_batch_device(&s);
        if (!parallel) parallel = dev ? TLLM_SCHED_DEFAULT_PARALLEL_DEVICE : TLLM_SCHED_DEFAULT_PARALLEL;
        struct tllm_sched_params sp = {.n_parallel = parallel, .n_batch = n_batch, .kv_tokens = kv_size,
                                       .kv_type = cli_kv_dtype(&mo), .dev = dev};
        int rc = run_batch(&s, prompts, out, force, &cs, max_new, chat, system, grammar, ignore_eos, &sp);
        cli_session_close(&s);
        tllm_grammar_free(grammar);
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
    if (grammar && !s.tok) cli_die("generate: --json-schema needs the model's tokenizer");
    if (run_one(&s, &sp, &ids, max_new, cs.stop, cs.n_stop, grammar, ignore_eos, json ? stop_if_interrupted : stream_out, &r))
        cli_die_lib();
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
    tllm_grammar_free(grammar);
    cli_session_close(&s);
    return r.finish == TLLM_FINISH_INTERRUPTED ? 130 : 0;
}
