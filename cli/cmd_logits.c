/* tllm logits: float32 logits of every position (or the last) for a list of token ids. */
#include <stdlib.h>
#include <string.h>

#include "engine/backend/registry.h"
#include "engine/run/context.h"
#include "engine/convert/convert.h"
#include "base/error.h"
#include "cli/cli.h"

static const char usage[] =
    "usage: tllm logits -m MODEL --ids 1,2,3 -o OUT.f32 [--last] [--quantize BITS [--group-size G]] [--int8]\n"
    "                   [--device cpu|opencl|opencl:N] [--prefill device|cpu]\n"
    "  Writes float32 little-endian logits, n_ids x vocab (row p = after ids[0..p]),\n"
    "  or only the last row with --last. Activations are float32 (the reference path, as --exact runs),\n"
    "  or with --int8 int8 as the CPU's default path runs them (prompt tokens' single level).\n"
    "  --device opencl: the ids run through the device's prompt kernels (--prefill cpu: the CPU's,\n"
    "  with --last the last id then as a device decode step).\n";

int cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *ids_s = NULL, *out = NULL, *device = "cpu";
    enum tllm_prefill prefill = TLLM_PREFILL_DEVICE;
    int last = 0, qbits = 0, qgroup = 64, int8 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--ids")) ids_s = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--last")) last = 1;
        else if (!strcmp(a, "--int8")) int8 = 1;
        else if (!strcmp(a, "--device")) device = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--prefill")) {
            if (tllm_prefill_parse(cli_value(argc, argv, &i), &prefill)) cli_die("--prefill: %s", tllm_errmsg());
        }
        else if (!strcmp(a, "--quantize")) qbits = (int)cli_int(a, cli_value(argc, argv, &i), 2, 8);
        else if (!strcmp(a, "--group-size")) qgroup = (int)cli_int(a, cli_value(argc, argv, &i), 32, 128);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else cli_die("logits: unknown option '%s' (see tllm logits --help)", a);
    }
    if (!ids_s || !out) cli_die("logits: --ids and -o are required (see tllm logits --help)");
    int index;
    if (tllm_device_index(device, &index) || index == -2) cli_die("--device: '%s' is not cpu, opencl or opencl:N", device);
    dir = cli_model_dir(dir);
    int n;
    int32_t *ids = cli_parse_ids("--ids", ids_s, &n);
    struct tllm_model *m;
    if (tllm_model_load(dir, &m)) cli_die_lib();
    if (qbits && tllm_model_quantize(m, qbits, qgroup)) cli_die_lib();
    if (int8 && tllm_model_pack(m)) cli_die_lib();
    struct tllm_ctx ctx;
    if (n > m->cfg.max_pos)
        cli_die("logits: %d ids exceed the model's context of %d", n, m->cfg.max_pos);
    if (tllm_ctx_init(&ctx, m, n, 0)) cli_die_lib();
    struct tllm_backend *dev = NULL;
    if (index != -3) {
        if (tllm_backend_device_init(&dev, m, ctx.n_ctx, index)) cli_die_lib();
        tllm_ctx_use_device(&ctx, dev);
        if (tllm_ctx_set_prefill(&ctx, prefill)) cli_die_lib();
    }
    size_t rows = last ? 1 : (size_t)n, vocab = (size_t)m->cfg.vocab_size;
    float *logits = malloc(rows * vocab * sizeof(float));
    if (!logits) cli_die("out of memory for %zu x %zu logits", rows, vocab);
    int rc;
    if (last && dev && !ctx.dev_prefill && n > 1) /* the prompt on the CPU, its last id a decode step on the device */
        rc = tllm_ctx_forward(&ctx, ids, n - 1, NULL, TLLM_LOGITS_NONE) || tllm_ctx_forward(&ctx, ids + n - 1, 1, logits, TLLM_LOGITS_LAST);
    else
        rc = tllm_ctx_forward(&ctx, ids, n, logits, last ? TLLM_LOGITS_LAST : TLLM_LOGITS_ALL);
    if (rc) cli_die_lib();
    cli_write_file_atomic(out, logits, rows * vocab * sizeof(float));
    free(logits);
    tllm_ctx_use_device(&ctx, NULL);
    tllm_backend_free(dev);
    tllm_ctx_free(&ctx);
    tllm_model_free(m);
    free(ids);
    return 0;
}
