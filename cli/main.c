/* tllm: one binary, one subcommand per front end. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"chat", cmd_chat, "chat with a model (interactive, readline)"},
    {"generate", cmd_generate, "generate text from a prompt, or from a file of prompts to JSONL"},
#ifdef TLLM_HAVE_SERVER
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (chat/completions, completions, models)"},
#endif
    {"perplexity", cmd_perplexity, "the perplexity of a text file (llama-perplexity's chunks, or --stride)"},
    {"bench", cmd_bench, "prefill and decode speed, llama-bench style"},
    {"bench-matvec", cmd_bench_matvec, "the decode matvec alone at real shapes, in GB/s"},
    {"bench-gemm", cmd_bench_gemm, "prefill's GEMM alone on an OpenCL device, in TFLOPS"},
    {"devices", cmd_devices, "list OpenCL devices for --device opencl:N"},
    {"info", cmd_info, "describe a checkpoint: shapes, quantization, bytes per token"},
    {"template", cmd_template, "show a conversation rendered by the model's chat template"},
    {"tokenize", cmd_tokenize, "encode text (or a chat) to token ids, or decode ids to text"},
    {"logits", cmd_logits, "write the float32 logits of a list of token ids"},
    {"quantize", cmd_quantize, "quantize a Hugging Face checkpoint to MLX's 2/4/8-bit layout"},
    {"synth", cmd_synth, "write a random checkpoint at a real model's shapes (for benchmarks)"},
};

static void usage(FILE *fp) {
    fputs("usage: tllm COMMAND [options]   (tllm COMMAND --help for its options)\n\ncommands:\n", fp);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(fp, "  %-10s %s\n", commands[i].name, commands[i].help);
}

/* Output that did not reach standard output (a full disk, a closed pipe) is a failure, not a success */
static int finish(int rc) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "tllm: writing standard output: %s\n", errno ? strerror(errno) : "write error");
        return 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return finish(0);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return finish(commands[i].run(argc - 1, argv + 1));
    fprintf(stderr, "tllm: unknown command '%s' (tllm --help lists them)\n", argv[1]);
    return 1;
}
