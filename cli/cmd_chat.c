/* tllm chat: an interactive REPL on GNU readline. The KV cache keeps the conversation: each turn
 * re-renders the chat, and only the tokens after the longest prefix already cached are prefilled. */
#include <errno.h>
#include <json-c/json.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "base/error.h"
#include "base/json_util.h"
#include "cli/session.h"

static const char usage[] =
    "usage: tllm chat [-m MODEL] [--system S] [-n MAX_REPLY_TOKENS] [options]\n"
    "  An interactive chat. End a line with \\ to continue it. Ctrl-C stops a reply, Ctrl-D leaves.\n"
    "  With standard input not a terminal, the whole input is one user turn: the reply is printed.\n";

static const char help_text[] =
    "/help            this text\n"
    "/reset           start a new conversation (keeps the system prompt)\n"
    "/system TEXT     set the system prompt and start a new conversation\n"
    "/save FILE       save the conversation as JSON\n"
    "/load FILE       load a conversation saved with /save\n"
    "/stats           statistics of the last reply\n"
    "/quit            leave (or Ctrl-D)\n";

#define CHAT_MAX_MSGS 4096

struct chat {
    struct cli_session s;
    struct tllm_sampler_params sp;
    const char *const *stop;
    int n_stop, max_new;
    char *system;                      /* NULL: the template's default */
    char *role[CHAT_MAX_MSGS], *content[CHAT_MAX_MSGS];
    int n;                             /* messages after the system prompt */
    struct tllm_stats last;            /* of the last reply */
    int have_last;
};

static volatile sig_atomic_t stop_reply, generating;

static void on_sigint(int sig) {
    (void)sig;
    if (generating) {
        stop_reply = 1;
        return;
    }
    /* at the prompt: abandon the line being typed */
    write(STDOUT_FILENO, "\n", 1);
    rl_on_new_line();
    rl_replace_line("", 0);
    rl_redisplay();
}

static void add_msg(struct chat *c, const char *role, const char *content) {
    if (c->n == CHAT_MAX_MSGS) cli_die("chat: more than %d messages", CHAT_MAX_MSGS);
    c->role[c->n] = strdup(role);
    c->content[c->n] = strdup(content);
    c->n++;
}

static void drop_msgs(struct chat *c, int k) { /* drop the k oldest messages */
    for (int i = 0; i < k; i++) {
        free(c->role[i]);
        free(c->content[i]);
    }
    memmove(c->role, c->role + k, (size_t)(c->n - k) * sizeof *c->role);
    memmove(c->content, c->content + k, (size_t)(c->n - k) * sizeof *c->content);
    c->n -= k;
}

static void drop_last(struct chat *c) { /* the user message whose turn could not run */
    c->n--;
    free(c->role[c->n]);
    free(c->content[c->n]);
}

static void reset(struct chat *c) {
    drop_msgs(c, c->n);
    tllm_session_reset(c->s.ss);
}

static int encode_conversation(struct chat *c, struct tllm_ids *out) {
    struct tllm_chat_msg *m = calloc((size_t)c->n + 1, sizeof *m);
    int k = 0;
    if (c->system) m[k++] = (struct tllm_chat_msg){"system", c->system};
    for (int i = 0; i < c->n; i++) m[k++] = (struct tllm_chat_msg){c->role[i], c->content[i]};
    out->len = 0;
    int rc = cli_encode_chat(&c->s, m, k, out);
    free(m);
    return rc;
}

static int print_piece(const char *text, size_t len, void *user) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return stop_reply;
}

/* Tokens kept free for the reply when old turns must go: -n, or 256, but never more than a quarter
 * of the context (a reserve of the whole context would drop the history every turn) */
static int reply_reserve(const struct chat *c) {
    int want = c->max_new > 0 ? c->max_new : 256, quarter = c->s.ctx->n_ctx / 4;
    return want < quarter ? want : quarter;
}

/* One user turn: append it, make room in the context, prefill what is new, stream the reply.
 * Returns 0, or -1 when the turn could not run (said on stderr; the history is kept). */
static int turn(struct chat *c, const char *user_text) {
    struct tllm_ids ids = {0};
    /* the message alone (with the system prompt) must fit, or nothing of the history is touched */
    struct tllm_chat_msg alone[2];
    int k = 0;
    if (c->system) alone[k++] = (struct tllm_chat_msg){"system", c->system};
    alone[k++] = (struct tllm_chat_msg){"user", user_text};
    if (cli_encode_chat(&c->s, alone, k, &ids)) {
        fprintf(stderr, "tllm: %s\n", tllm_errmsg());
        tllm_ids_free(&ids);
        return -1;
    }
    if ((int)ids.len >= c->s.ctx->n_ctx) {
        fprintf(stderr, "tllm: this message alone (%zu tokens) does not fit in the context (%d); use -c\n", ids.len,
                c->s.ctx->n_ctx);
        tllm_ids_free(&ids);
        return -1;
    }
    add_msg(c, "user", user_text);
    int reserve = reply_reserve(c), dropped = 0;
    for (;;) {
        if (encode_conversation(c, &ids)) {
            fprintf(stderr, "tllm: %s\n", tllm_errmsg());
            drop_last(c);
            tllm_ids_free(&ids);
            return -1;
        }
        if ((int)ids.len + reserve <= c->s.ctx->n_ctx || c->n <= 1) break;
        drop_msgs(c, c->n >= 3 ? 2 : 1); /* the oldest exchange; the system prompt stays */
        dropped++;
    }
    if (dropped)
        fprintf(stderr, "[context full: dropped the %d oldest message%s]\n", dropped * 2, dropped > 1 ? "s" : "");
    /* the session computes only what follows the longest prefix its cache holds */
    struct tllm_generate_params gp = {.sampling = c->sp, .max_tokens = c->max_new, .stop = c->stop, .n_stop = c->n_stop,
                                      .skip_special = 1};
    char *reply = NULL;
    stop_reply = 0;
    generating = 1;
    int rc = tllm_session_complete_ids(c->s.ss, ids.data, ids.len, &gp, print_piece, NULL, &reply, NULL, NULL, &c->last);
    generating = 0;
    putchar('\n');
    if (rc) {
        fprintf(stderr, "tllm: %s\n", tllm_errmsg());
        drop_last(c);
        reset(c);
    } else {
        c->have_last = 1;
        if (c->last.finish == TLLM_FINISH_INTERRUPTED) fprintf(stderr, "[stopped]\n");
        if (c->last.finish == TLLM_FINISH_CONTEXT) fprintf(stderr, "[context full: reply cut short]\n");
        add_msg(c, "assistant", reply);
    }
    tllm_free(reply);
    tllm_ids_free(&ids);
    return rc ? -1 : 0;
}

static void save(struct chat *c, const char *path) {
    struct json_object *o = json_object_new_object(), *msgs = json_object_new_array();
    if (c->system) json_object_object_add(o, "system", json_object_new_string(c->system));
    for (int i = 0; i < c->n; i++) {
        struct json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string(c->role[i]));
        json_object_object_add(m, "content", json_object_new_string(c->content[i]));
        json_object_array_add(msgs, m);
    }
    json_object_object_add(o, "messages", msgs);
    const char *text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY);
    char err[PATH_MAX + 256];
    if (cli_write_file(path, text, strlen(text), err, sizeof err)) /* the old save stays whole if this fails */
        fprintf(stderr, "tllm: %s\n", err);
    else
        fprintf(stderr, "saved %d messages to %s\n", c->n, path);
    json_object_put(o);
}

static void load(struct chat *c, const char *path) {
    struct json_object *o, *msgs, *sys;
    if (tllm_json_load_file(path, 64u << 20, &o)) {
        fprintf(stderr, "tllm: %s\n", tllm_errmsg());
        return;
    }
    if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "messages", &msgs) ||
        !json_object_is_type(msgs, json_type_array)) {
        fprintf(stderr, "tllm: %s: expected {\"messages\": [...]} as /save writes\n", path);
        json_object_put(o);
        return;
    }
    for (size_t i = 0; i < json_object_array_length(msgs); i++) {
        struct json_object *m = json_object_array_get_idx(msgs, i), *r, *ct;
        if (!json_object_object_get_ex(m, "role", &r) || !json_object_object_get_ex(m, "content", &ct) ||
            !json_object_is_type(r, json_type_string) || !json_object_is_type(ct, json_type_string) ||
            (strcmp(json_object_get_string(r), "user") && strcmp(json_object_get_string(r), "assistant"))) {
            fprintf(stderr, "tllm: %s: message %zu needs role user/assistant and string content\n", path, i);
            json_object_put(o);
            return;
        }
    }
    reset(c);
    if (json_object_object_get_ex(o, "system", &sys) && json_object_is_type(sys, json_type_string)) {
        free(c->system);
        c->system = strdup(json_object_get_string(sys));
    }
    for (size_t i = 0; i < json_object_array_length(msgs); i++) {
        struct json_object *m = json_object_array_get_idx(msgs, i), *r, *ct;
        json_object_object_get_ex(m, "role", &r);
        json_object_object_get_ex(m, "content", &ct);
        add_msg(c, json_object_get_string(r), json_object_get_string(ct));
    }
    fprintf(stderr, "loaded %d messages from %s\n", c->n, path);
    json_object_put(o);
}

static void stats(const struct chat *c) {
    if (!c->have_last) {
        fprintf(stderr, "no reply yet\n");
        return;
    }
    const struct tllm_stats *r = &c->last;
    int n_new = r->n_prompt - r->n_reused;
    fprintf(stderr, "last reply: prompt %d new tokens (%.1f tok/s), %d generated (%.1f tok/s), %s; context %d/%d tokens; "
            "peak memory %.0f MiB\n",
            n_new, r->prompt_secs > 0 ? n_new / r->prompt_secs : 0, r->n_generated,
            r->gen_secs > 0 ? r->n_generated / r->gen_secs : 0, tllm_finish_name(r->finish), c->s.ctx->pos,
            c->s.ctx->n_ctx, (double)tllm_peak_rss() / (1 << 20));
}

/* Read one (possibly multi-line) message; NULL on EOF. */
static char *read_message(void) {
    struct tllm_buf b = {0};
    const char *prompt = "> ";
    for (;;) {
        char *line = readline(prompt);
        if (!line) {
            if (b.len) break;
            tllm_buf_free(&b);
            return NULL;
        }
        size_t n = strlen(line);
        int more = n > 0 && line[n - 1] == '\\';
        tllm_buf_append(&b, line, more ? n - 1 : n);
        free(line);
        if (!more) break;
        tllm_buf_append(&b, "\n", 1);
        prompt = "... ";
    }
    if (!b.data) tllm_buf_append(&b, "", 0);
    return b.data;
}

static char *history_path(void) {
    const char *state = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char buf[4096];
    if (state && *state) snprintf(buf, sizeof buf, "%s/tllm_history", state);
    else if (home && *home) snprintf(buf, sizeof buf, "%s/.tllm_history", home);
    else return NULL;
    return strdup(buf);
}

int cmd_chat(int argc, char **argv) {
    struct cli_model_opts mo = {0};
    struct cli_sampling cs = {0};
    struct chat c;
    memset(&c, 0, sizeof c);
    c.max_new = -1;
    const char *system = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_model_opt(argc, argv, &i, &mo) || cli_sampling_opt(argc, argv, &i, &cs)) continue;
        if (!strcmp(a, "--system")) system = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) c.max_new = (int)cli_int(a, cli_value(argc, argv, &i), -1, 1 << 24);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n%s\n%s", usage, cli_model_opts_help, cli_sampling_help);
            return 0;
        } else cli_die("chat: unknown option '%s' (see tllm chat --help)", a);
    }
    cli_session_open(&c.s, &mo, 1);
    c.sp = cli_sampling_resolve(&c.s, &cs);
    c.stop = cs.stop;
    c.n_stop = cs.n_stop;
    if (system) c.system = strdup(system);
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);

    int failed = 0;
    if (!isatty(STDIN_FILENO)) { /* piped: the whole input is one user turn */
        struct tllm_buf in = {0};
        char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) tllm_buf_append(&in, chunk, n);
        while (in.len && (in.data[in.len - 1] == '\n' || in.data[in.len - 1] == '\r')) in.data[--in.len] = '\0';
        if (!in.len) cli_die("chat: no input on standard input");
        sigaction(SIGINT, &sa, NULL);
        failed = turn(&c, in.data) != 0;
        tllm_buf_free(&in);
    } else {
        char *hist = history_path();
        if (hist && read_history(hist) != 0) write_history(hist); /* append_history needs the file to exist */
        rl_catch_signals = 0;
        sigaction(SIGINT, &sa, NULL);
        fprintf(stderr, "tllm chat: %s (%d layers, context %d). /help for commands, Ctrl-C stops a reply, Ctrl-D leaves.\n",
                mo.dir, c.s.m->cfg.n_layers, c.s.ctx->n_ctx);
        char *msg;
        while ((msg = read_message())) {
            char *p = msg;
            while (*p == ' ') p++;
            if (*p) {
                add_history(msg);
                if (hist) append_history(1, hist);
            }
            if (!*p) {
            } else if (!strcmp(p, "/help")) fputs(help_text, stderr);
            else if (!strcmp(p, "/quit") || !strcmp(p, "/exit")) {
                free(msg);
                break;
            } else if (!strcmp(p, "/reset")) {
                reset(&c);
                fprintf(stderr, "new conversation\n");
            } else if (!strncmp(p, "/system ", 8)) {
                free(c.system);
                c.system = strdup(p + 8);
                reset(&c);
                fprintf(stderr, "system prompt set; new conversation\n");
            } else if (!strncmp(p, "/save ", 6)) save(&c, p + 6);
            else if (!strncmp(p, "/load ", 6)) load(&c, p + 6);
            else if (!strcmp(p, "/stats")) stats(&c);
            else if (p[0] == '/' && p[1] != '/' && !strchr(p, ' ') && strlen(p) < 20)
                fprintf(stderr, "unknown command %s (/help lists them)\n", p);
            else turn(&c, p);
            free(msg);
        }
        if (hist) history_truncate_file(hist, 1000);
        free(hist);
        fputc('\n', stderr);
    }
    reset(&c);
    free(c.system);
    cli_session_close(&c.s);
    return failed; /* piped: the turn's failure is the exit status */
}
