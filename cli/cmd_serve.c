/* tllm serve: an OpenAI-compatible HTTP server (server/) on the many-sequence scheduler. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/session.h"
#include "base/error.h"
#include "engine/load/model.h"
#include "server/engine_thread.h"
#include "server/http_server.h"

static const char usage[] =
    "usage: tllm serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [-np 8] [--api-key KEY] [options]\n"
    "  POST /v1/chat/completions, /v1/completions (OpenAI's fields; \"stream\": true for server-sent events),\n"
    "  GET /v1/models, /health, /metrics (Prometheus), POST /tokenize, /detokenize\n"
    "  --host ADDR            the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 or ::\n"
    "                         for every interface, with --api-key)\n"
    "  --port N               the port (default 8080; 0: any free one, said on stderr)\n"
    "  --api-key KEY          ask every request but GET /health for \"Authorization: Bearer KEY\" (401 else);\n"
    "                         --api-key-file FILE reads it from a file; $TLLM_API_KEY also sets it\n"
    "  -np, --parallel N      sequences decoded at once (default 8); more requests wait in a queue\n"
    "  --max-queue N          requests waiting at most beyond those (default 64; more get 503)\n"
    "  -c, --ctx-size N       positions one request may take, prompt and answer (default min(model, 4096))\n"
    "  --kv-size N            positions of the KV cache all requests share (default: parallel x ctx-size);\n"
    "                         prefixes that requests share (a system prompt, a conversation's history)\n"
    "                         are computed once and stay cached while the space allows\n"
    "  -b, --batch-size N     tokens per step at most, prompt chunks included (default 512)\n"
    "  --alias NAME           the model's name in answers and /v1/models (default: the directory's name)\n"
    "  --max-body BYTES       a request body's size at most (default 4194304; more get 413)\n"
    "  --timeout S            close a connection whose answer its client has not read for S seconds\n"
    "                         (default 600)\n"
    "  --request-timeout S    a connection has S seconds from its opening (or its previous answer) to send\n"
    "                         a complete request, head and body, however slowly it sends; then it is\n"
    "                         closed (default 30). Idle keep-alive connections are closed after S too\n"
    "  --max-waiting N        connections without a complete request at most (default 1024); at the bound\n"
    "                         the longest-waiting is closed to make room for a new one, so slow or idle\n"
    "                         connections never lock others out\n"
    "  --max-waiting-per-ip N the same bound for one client address (default 128)\n"
    "  --shutdown-timeout S   on SIGINT/SIGTERM: stop accepting, let running requests finish for up to S\n"
    "                         seconds (default 30), then cancel the rest; a second signal cancels at once\n"
    "  --quiet                no line per request on stderr\n"
    "  Sampling options set the defaults of what requests leave out; generated tokens' activations are\n"
    "  int8 in one level (--fast-decode) unless --precise-decode.\n";

_Static_assert(CLI_MAX_STOP <= SRV_MAX_STOP, "the command line's stop strings fit a job");

static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t n_signals;

static void on_signal(int sig) {
    (void)sig;
    n_signals++;
    int e = errno;
    ssize_t w = write(sig_pipe[1], "x", 1);
    (void)w;
    errno = e;
}

/* Wait for a signal for at most ms (-1: forever): 1 when one came */
static int wait_signal(int ms) {
    struct pollfd pf = {.fd = sig_pipe[0], .events = POLLIN};
    int r = poll(&pf, 1, ms);
    if (r > 0) {
        char b[16];
        ssize_t n = read(sig_pipe[0], b, sizeof b);
        (void)n;
        return 1;
    }
    return 0;
}

static char *read_key_file(const char *path) {
    FILE *fp = fopen(path, "r");
    if (!fp) cli_die("--api-key-file %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, fp);
    fclose(fp);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = 0;
    if (n <= 0) cli_die("--api-key-file %s: the file holds no key", path);
    return line;
}

int cmd_serve(int argc, char **argv) {
    struct cli_model_opts mo = {0};
    struct cli_sampling cs = {0};
    const char *host = "127.0.0.1", *api_key = getenv("TLLM_API_KEY"), *key_file = NULL, *alias = NULL;
    int port = 8080, parallel = 8, max_queue = 64, kv_size = 0, n_batch = 0, timeout = 600, shutdown_s = 30, quiet = 0;
    int request_timeout = 30, max_waiting = 1024, max_waiting_ip = 128;
    long long max_body = 4 << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--kv-size")) kv_size = (int)cli_int(a, cli_value(argc, argv, &i), 16, 1 << 26);
        else if (cli_model_opt(argc, argv, &i, &mo) || cli_sampling_opt(argc, argv, &i, &cs)) continue;
        else if (!strcmp(a, "--host")) host = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--port")) port = (int)cli_int(a, cli_value(argc, argv, &i), 0, 65535);
        else if (!strcmp(a, "--api-key")) api_key = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--api-key-file")) key_file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) parallel = (int)cli_int(a, cli_value(argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--max-queue")) max_queue = (int)cli_int(a, cli_value(argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) n_batch = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "--alias")) alias = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--max-body")) max_body = cli_int(a, cli_value(argc, argv, &i), 1024, 1LL << 32);
        else if (!strcmp(a, "--timeout")) timeout = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "--request-timeout")) request_timeout = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "--max-waiting")) max_waiting = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "--max-waiting-per-ip")) max_waiting_ip = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "--shutdown-timeout")) shutdown_s = (int)cli_int(a, cli_value(argc, argv, &i), 0, 1 << 24);
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n%s\n%s", usage, cli_model_opts_help, cli_sampling_help);
            return 0;
        } else cli_die("serve: unknown option '%s' (see tllm serve --help)", a);
    }
    char *key_buf = key_file ? read_key_file(key_file) : NULL;
    if (key_buf) api_key = key_buf;
    if (api_key && !*api_key) cli_die("serve: the API key is empty");
    struct cli_session s;
    cli_session_open(&s, &mo, 0);
    if (!mo.decode_levels) s.m->decode_levels = 1; /* many clients at once: --fast-decode unless told otherwise */
    int n_ctx = mo.n_ctx ? mo.n_ctx : s.ctx->n_ctx;
    const char *name = alias;
    if (!name) {
        name = strrchr(mo.dir, '/');
        name = name && name[1] ? name + 1 : mo.dir;
    }
    struct tllm_sched_params sp = {.n_parallel = parallel, .n_batch = n_batch,
                                   .kv_tokens = kv_size ? kv_size : parallel * n_ctx, .kv_type = cli_kv_dtype(&mo), .n_ctx = n_ctx,
                                   .dev = cli_session_batch_device(&s)};
    struct srv_engine engine;
    if (srv_engine_init(&engine, s.m, s.tok, &sp, parallel + max_queue)) cli_die_lib();
    struct srv_params p = {.host = host, .port = port, .api_key = api_key, .model_name = name, .max_body = (size_t)max_body,
                           .timeout_s = timeout, .request_timeout = request_timeout, .max_waiting = max_waiting,
                           .max_waiting_per_ip = max_waiting_ip < max_waiting ? max_waiting_ip : max_waiting,
                           /* room beyond the waiting ones for every request being answered, refused ones included */
                           .max_connections = max_waiting + 2 * (parallel + max_queue) + 64, .n_ctx = n_ctx,
                           .m = s.m, .tok = s.tok, .tpl = s.tpl, .gd = s.gd, .sampling = cli_sampling_resolve(&s, &cs),
                           .stop = cs.stop, .n_stop = cs.n_stop, .quiet = quiet, .engine = &engine};
    if (pipe(sig_pipe)) cli_die("pipe: %s", strerror(errno));
    fcntl(sig_pipe[1], F_SETFL, O_NONBLOCK);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that leaves mid-answer is seen by the write, not a signal */
    struct srv_server *srv;
    if (srv_server_start(&srv, &p)) {
        srv_engine_free(&engine);
        cli_die_lib();
    }
    int bound = srv_server_port(srv);
    fprintf(stderr, "tllm serve: %s (%s), %d sequences at once on %s, %d positions each, KV cache %d positions\n", name, mo.dir,
            parallel, sp.dev ? cli_session_backend(&s) : "the CPU", n_ctx, sp.kv_tokens);
    fprintf(stderr, "tllm serve: listening on http://%s%s%s:%d%s\n", strchr(host, ':') ? "[" : "", host,
            strchr(host, ':') ? "]" : "", bound, api_key ? " (API key required)" : "");
    if (!api_key && strcmp(host, "127.0.0.1") && strcmp(host, "::1"))
        fprintf(stderr, "tllm serve: warning: listening beyond this machine without --api-key: anyone who reaches it can use it\n");
    while (!wait_signal(-1)) {
    }
    struct srv_engine_stats st;
    srv_engine_stats(&engine, &st);
    srv_server_drain(srv); /* new requests get 503 and their connections close: a balancer moves on */
    srv_engine_stop(&engine, 1);
    if (st.live) fprintf(stderr, "tllm serve: stopping: %d requests to finish (a second signal cancels them)\n", st.live);
    for (int waited = 0; st.live && waited < shutdown_s * 10; waited++) {
        if (n_signals > 1 || wait_signal(100)) break;
        srv_engine_stats(&engine, &st);
    }
    srv_engine_stats(&engine, &st);
    if (st.live) fprintf(stderr, "tllm serve: cancelling %d requests\n", st.live);
    srv_engine_stop(&engine, 2);
    srv_server_stop(srv, 5); /* each request still open gets its answer (503, or a stream's error event and [DONE]) */
    srv_engine_free(&engine);
    cli_session_close(&s);
    free(key_buf);
    fprintf(stderr, "tllm serve: stopped\n");
    return 0;
}
