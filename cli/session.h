/* What the generating front ends share: model/tokenizer loading from common flags, sampling flags
 * layered over the checkpoint's generation_config.json, and rendering prompts. */
#ifndef TLLM_CLI_SESSION_H
#define TLLM_CLI_SESSION_H

#include "engine/api.h"
#include "cli/prompt_line.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

struct cli_model_opts {
    const char *dir;
    int threads;        /* -t; 0 = physical cores */
    int n_ctx;          /* -c; 0 = min(max_position_embeddings, 4096) */
    int quantize_bits;  /* --quantize */
    int quantize_group; /* --group-size */
    int no_template;    /* --no-template */
    const char *chat_template; /* --chat-template FILE */
    int exact;          /* --exact: float32 activations everywhere (no packed int8 kernels) */
    int decode_levels;  /* --precise-decode 2, --fast-decode 1, 0: the command's default */
    const char *device; /* --device cpu|opencl|opencl:N|auto (NULL = auto) */
    const char *kv_type; /* --kv-type f16|f32 (NULL = f16) */
    const char *prefill; /* --prefill auto|cpu|device (NULL = auto) */
    int deterministic;   /* --deterministic */
};

/* Sampling flags given on the command line (each overrides generation_config.json). */
struct cli_sampling {
    struct tllm_sampler_params p;
    unsigned set; /* bit per field given */
    const char *stop[CLI_MAX_STOP];
    int n_stop;
};

/* Consume argv[*i] (and its value) if it is a model or sampling option; returns 1 if consumed. */
int cli_model_opt(int argc, char **argv, int *i, struct cli_model_opts *o);
int cli_sampling_opt(int argc, char **argv, int *i, struct cli_sampling *s);
extern const char cli_model_opts_help[];
extern const char cli_sampling_help[];

/* An engine and a session of the public API (engine/tllm.h), with shortcuts to what is behind them
 * for the parts the API does not cover (raw logits, benchmarks, batch files). */
struct cli_session {
    struct tllm_engine *e;
    struct tllm_session *ss;
    struct tllm_model *m;
    struct tllm_tok *tok;            /* NULL when the directory has no tokenizer.json */
    struct tllm_chat_template *tpl;
    struct tllm_gen_defaults *gd;
    struct tllm_ctx *ctx;
    struct tllm_backend *dev;        /* the device decoding, or NULL (CPU) */
    enum tllm_prefill prefill;       /* --prefill */
    double load_secs;
};

/* Load model (+ tokenizer if present; required if need_tok) and a context; dies on error. */
/* o->dir becomes the resolved model directory (see cli_model_dir). */
void cli_session_open(struct cli_session *s, struct cli_model_opts *o, int need_tok);
void cli_session_close(struct cli_session *s);
/* (Re)attach the session's device to s->ctx, e.g. after the context was made anew. */
void cli_session_attach_device(struct cli_session *s);
/* "CPU" or "OpenCL <device name>" */
const char *cli_session_backend(const struct cli_session *s);
/* The device for many sequences at once (the scheduler, tllm bench -np), or NULL: the CPU threads (no
 * device, or one that takes single tokens only for this model: said on stderr). Dies when the options
 * ask what it cannot do (--precise-decode). */
struct tllm_backend *cli_session_batch_device(const struct cli_session *s);

/* --kv-type as the KV cache's element type (TLLM_DT_F16 when not given) */
enum tllm_dtype cli_kv_dtype(const struct cli_model_opts *o);

/* generation_config.json defaults with the command line's overrides applied. */
struct tllm_sampler_params cli_sampling_resolve(const struct cli_session *s, const struct cli_sampling *c);

/* Render messages with the chat template and encode (special tokens parsed). */
int cli_encode_chat(struct cli_session *s, const struct tllm_chat_msg *msgs, int n, struct tllm_ids *out);

#endif
