/* tllm perplexity: the perplexity of a text file, chunked as llama.cpp's llama-perplexity does (or in
 * Hugging Face's sliding windows with --stride), with the running estimate per chunk and the final
 * value with its standard error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/session.h"
#include "base/error.h"
#include "base/json_util.h"
#include "kernels/cpu/ops.h"

static const char usage[] =
    "usage: tllm perplexity [-m MODEL] -f TEXT [-c 512] [--stride S] [--chunks N] [model options]\n"
    "  -f, --file TEXT        the text (UTF-8), tokenized whole\n"
    "  -c, --ctx-size N       tokens a window holds (default 512)\n"
    "  (default) llama-perplexity's chunks: windows of N tokens side by side, each scoring the tokens after\n"
    "                         its middle one (every token predicted with more than N/2 tokens before it)\n"
    "  --stride S             Hugging Face's sliding windows instead: windows of N tokens S apart, each\n"
    "                         scoring the tokens no earlier window scored (the first scores all but its first)\n"
    "  --chunks N             stop after N windows\n"
    "  Prints the running estimate after each window, then `Final estimate: PPL = X +/- E` (E: the standard\n"
    "  error from the spread of the tokens' log-likelihoods, as llama-perplexity computes it). On the CPU\n"
    "  by default; with --device opencl each window's unscored tokens are a CPU prefill and every scored\n"
    "  prediction is a decode step on the device.\n";

/* The negative log-likelihood of `next` under one row of logits */
static double nll(const float *row, int n, int32_t next) { return tllm_logsumexp(row, n) - row[next]; }

int cmd_perplexity(int argc, char **argv) {
    struct cli_model_opts mo = {0};
    const char *file = NULL;
    int n_ctx = 512, stride = 0, max_chunks = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) n_ctx = (int)cli_int(a, cli_value(argc, argv, &i), 2, 1 << 20);
        else if (cli_model_opt(argc, argv, &i, &mo)) continue;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--stride")) stride = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--chunks")) max_chunks = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 30);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n%s", usage, cli_model_opts_help);
            return 0;
        } else cli_die("perplexity: unknown option '%s' (see tllm perplexity --help)", a);
    }
    if (!file) cli_die("perplexity: -f TEXT is required (see tllm perplexity --help)");
    if (stride > n_ctx) cli_die("--stride %d: longer than the window (-c %d)", stride, n_ctx);
    if (!stride && n_ctx < 3) /* window [0, n) scores tokens n/2 + 1 .. n - 1 */
        cli_die("-c %d: a window of fewer than 3 tokens scores none (each window scores the tokens after its middle one; "
                "--stride S scores from the second)", n_ctx);
    size_t len;
    char *text, bad[300];
    if (tllm_read_file(file, (size_t)1 << 30, &text, &len)) cli_die_lib();
    if (cli_check_utf8(file, text, len, bad, sizeof bad)) cli_die("%s", bad);
    mo.n_ctx = n_ctx;
    if (!mo.device) mo.device = "cpu"; /* the CPU's batched steps score a window fastest; a device when asked */
    struct cli_session s;
    cli_session_open(&s, &mo, 1);
    struct tllm_ids ids = {0};
    if (tllm_tok_encode(s.tok, text, len, 0, &ids)) cli_die("%s: %s", file, tllm_errmsg());
    free(text);
    int n = (int)ids.len, vocab = s.m->cfg.vocab_size, nb = s.ctx->n_batch;
    if (n < n_ctx && !stride) cli_die("%s: %d tokens, fewer than one window of %d (-c)", file, n, n_ctx);
    if (n < 2) cli_die("%s: %d token%s: nothing to predict", file, n, n == 1 ? "" : "s");
    float *logits = malloc((size_t)nb * vocab * sizeof *logits);
    if (!logits) cli_die("out of memory for %d x %d logits", nb, vocab);
    /* windows: [start, start + n_ctx), scoring the predictions of tokens [score0, end) */
    int n_windows = stride ? (n <= n_ctx ? 1 : (n - n_ctx + stride - 1) / stride + 1) : n / n_ctx;
    if (max_chunks && n_windows > max_chunks) n_windows = max_chunks;
    if (stride) fprintf(stderr, "perplexity: %d tokens, %d windows of %d, stride %d\n", n, n_windows, n_ctx, stride);
    else fprintf(stderr, "perplexity: %d tokens, %d windows of %d (scoring each after its middle token)\n", n, n_windows, n_ctx);
    double sum = 0, sum2 = 0, t0 = tllm_now();
    long count = 0, evaluated = 0;
    int scored_to = 1; /* sliding windows: the next token no window has scored yet */
    for (int w = 0; w < n_windows; w++) {
        int start = stride ? w * stride : w * n_ctx;
        int end = start + n_ctx < n ? start + n_ctx : n;
        /* llama-perplexity scores the tokens after the window's middle one: n_ctx/2 - 1 of them */
        int score0 = stride ? (scored_to > start + 1 ? scored_to : start + 1) : start + n_ctx / 2 + 1;
        tllm_ctx_reset(s.ctx);
        evaluated += end - start;
        if (s.dev) { /* the device decodes one token a step: a prediction a step from the first scored one */
            int pre = score0 - 1 - start;
            if (pre > 0 && tllm_ctx_forward(s.ctx, ids.data + start, pre, NULL, TLLM_LOGITS_NONE)) cli_die_lib();
            for (int p = score0 - 1; p < end - 1; p++) {
                if (tllm_ctx_forward(s.ctx, ids.data + p, 1, logits, TLLM_LOGITS_LAST)) cli_die_lib();
                double v = nll(logits, vocab, ids.data[p + 1]);
                sum += v, sum2 += v * v, count++;
            }
        }
        for (int p = start; p < end && !s.dev; p += nb) { /* a batch at a time, so the logits stay nb rows */
            int k = end - p < nb ? end - p : nb;
            if (tllm_ctx_forward(s.ctx, ids.data + p, k, logits, TLLM_LOGITS_ALL)) cli_die_lib();
            for (int j = 0; j < k; j++) {
                int next = p + j + 1; /* row j predicts token p + j + 1 */
                if (next < score0 || next >= end) continue;
                double v = nll(logits + (size_t)j * vocab, vocab, ids.data[next]);
                sum += v, sum2 += v * v, count++;
            }
        }
        if (stride) scored_to = end;
        printf("[%d]%.4f,", w + 1, exp(sum / (double)count));
        fflush(stdout);
    }
    if (count == 0) cli_die("%s: no token was scored", file); /* unreachable by the checks above: no NaN printed */
    double mean = sum / (double)count, var = sum2 / (double)count - mean * mean;
    double err = count > 1 && var > 0 ? sqrt(var / (double)(count - 1)) : 0, ppl = exp(mean);
    printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * err);
    double secs = tllm_now() - t0;
    fprintf(stderr, "perplexity: %ld tokens scored in %.1f s (%ld evaluated, %.1f tok/s)\n", count, secs, evaluated,
            secs > 0 ? (double)evaluated / secs : 0);
    free(logits);
    tllm_ids_free(&ids);
    cli_session_close(&s);
    return 0;
}
