/* tllm quantize and tllm synth: writing checkpoints. */
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/convert/convert.h"
#include "base/error.h"

static const char quantize_usage[] =
    "usage: tllm quantize IN_DIR OUT_DIR [--mode affine|mxfp4|nvfp4|mxfp8] [--bits B] [--group-size G]\n"
    "                     [--scale-dtype bf16|f16|f32] [--mixed mixed_LOW_HIGH] [--force]\n"
    "  Quantizes a Hugging Face checkpoint (bf16/f16/f32 safetensors) into MLX's layout, bit-identical\n"
    "  to mlx.core.quantize. Bits and group size default to mlx's for the mode (affine 4/64, mxfp4\n"
    "  4/32, nvfp4 4/16, mxfp8 8/32). --mixed gives v_proj/down_proj in some layers and the lm_head\n"
    "  HIGH and the rest LOW (as mlx-lm's mixed recipes), each side affine bits or a mode: mixed_2_6,\n"
    "  mixed_4_8, mixed_mxfp4_mxfp8, mixed_nvfp4_8. OUT_DIR is never overwritten without --force.\n";

int cmd_quantize(int argc, char **argv) {
    struct tllm_quantize_opts o = {.sb_dtype = TLLM_DT_INVALID, .progress = isatty(STDERR_FILENO)};
    int bits = 0, gs = 0;
    const char *in = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--bits")) bits = (int)cli_int(a, cli_value(argc, argv, &i), 1, 16);
        else if (!strcmp(a, "--group-size")) gs = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--mode")) {
            const char *v = cli_value(argc, argv, &i);
            int m = tllm_qmode_parse(v);
            if (m < 0) cli_die("--mode: '%s' is not affine, mxfp4, nvfp4 or mxfp8", v);
            o.mode = (enum tllm_qmode)m;
        }
        else if (!strcmp(a, "--scale-dtype")) {
            const char *v = cli_value(argc, argv, &i);
            o.sb_dtype = !strcmp(v, "bf16") ? TLLM_DT_BF16 : !strcmp(v, "f16") ? TLLM_DT_F16
                       : !strcmp(v, "f32") ? TLLM_DT_F32 : TLLM_DT_INVALID;
            if (o.sb_dtype == TLLM_DT_INVALID) cli_die("--scale-dtype: '%s' is not bf16, f16 or f32", v);
        } else if (!strcmp(a, "--mixed")) o.mixed = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--force")) o.force = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(quantize_usage, stdout);
            return 0;
        } else if (a[0] == '-') cli_die("quantize: unknown option '%s' (see tllm quantize --help)", a);
        else if (!in) in = a;
        else if (!out) out = a;
        else cli_die("quantize: unexpected argument '%s'", a);
    }
    if (!in || !out) cli_die("quantize: IN_DIR and OUT_DIR are required (see tllm quantize --help)");
    tllm_qmode_defaults(o.mode, &o.bits, &o.group_size);
    if (bits) o.bits = bits;
    if (gs) o.group_size = gs;
    if (tllm_quantize_checkpoint(in, out, &o)) cli_die_lib();
    if (o.mixed) fprintf(stderr, "tllm: wrote %s (%s)\n", out, o.mixed);
    else fprintf(stderr, "tllm: wrote %s (%s %d-bit, group %d)\n", out, tllm_qmode_name(o.mode), o.bits, o.group_size);
    return 0;
}

static const char synth_usage[] =
    "usage: tllm synth --config CONFIG.json --out DIR [--bits 4] [--group-size 64] [--seed N]\n"
    "                  [--tokenizer DIR] [--force]\n"
    "  Writes random weights at the shapes of CONFIG (e.g. configs/qwen2.5-0.5b-instruct.json) directly\n"
    "  in the quantized layout, for benchmarks. --bits 0 writes dense bf16. --tokenizer copies the\n"
    "  tokenizer and generation files of a model directory.\n";

int cmd_synth(int argc, char **argv) {
    struct tllm_synth_opts o = {.bits = 4, .group_size = 64, .seed = 0};
    const char *cfg = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) cfg = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--out")) out = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--bits")) o.bits = (int)cli_int(a, cli_value(argc, argv, &i), 0, 16);
        else if (!strcmp(a, "--group-size")) o.group_size = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--seed")) o.seed = (uint64_t)cli_int(a, cli_value(argc, argv, &i), 0, 1L << 62);
        else if (!strcmp(a, "--tokenizer")) o.tokenizer_dir = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--force")) o.force = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(synth_usage, stdout);
            return 0;
        } else cli_die("synth: unknown option '%s' (see tllm synth --help)", a);
    }
    if (!cfg || !out) cli_die("synth: --config and --out are required (see tllm synth --help)");
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (tllm_synth_checkpoint(cfg, out, &o)) cli_die_lib();
    clock_gettime(CLOCK_MONOTONIC, &b);
    fprintf(stderr, "tllm: wrote %s in %.1f s\n", out, (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec));
    return 0;
}
