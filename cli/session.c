#include "cli/session.h"

#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/backend/registry.h"
#include "base/error.h"
#include "engine/run/kv_cache.h"

const char cli_model_opts_help[] =
    "model options:\n"
    "  -m, --model MODEL      a model directory (config.json + safetensors [+ tokenizer.json]), a GGUF file\n"
    "                         (llama.cpp's), or a Hugging Face repo id (owner/name[@rev]) in the local cache\n"
    "                         ($HF_HOME, ~/.cache/huggingface);\n"
    "                         default: $TLLM_MODEL, else the bundled demo model (models/tllm-man-demo)\n"
    "  -t, --threads N        CPU threads (default: physical cores)\n"
    "  -c, --ctx-size N       context length in tokens (default: min(model maximum, 4096)); with\n"
    "                         --parallel, the KV cache's positions shared by all sequences (--kv-size)\n"
    "  --kv-type T            the KV cache's elements: f16 (default; half the memory) or f32 (exact)\n"
    "  --quantize BITS        quantize a bf16/f16 checkpoint on load (2, 4, 8) [--group-size 64]\n"
    "  --no-template          plain prompts even where the checkpoint has a chat template\n"
    "  --chat-template FILE   a Jinja chat template to use instead of the checkpoint's\n"
    "  --exact                float32 activations in every matmul (default: int8 activations against packed\n"
    "                         quantized weights, as llama.cpp does; see README: Performance)\n"
    "  --precise-decode, --fast-decode   generated tokens' int8 activations (on an OpenCL device every\n"
    "                         token's, prompts' too) in two levels (as good as float32: free for one sequence,\n"
    "                         1.4x the time of a CPU step of many; the default but for batch files, bench -np\n"
    "                         and serve) or in one, as the CPU's prompt tokens' (llama.cpp's precision)\n"
    "  --device D             cpu, opencl (first GPU, else first device), opencl:N (tllm devices), or\n"
    "                         auto (default: OpenCL when a GPU is there); decode runs there\n"
    "  --prefill P            where prompts run with a device: auto (default: on a GPU, not on a CPU device,\n"
    "                         whose OpenCL is slower than tllm's own CPU kernels), device, or cpu\n"
    "  --deterministic        a GPU's sums in a fixed order: the same logits every run, bit for bit (the default\n"
    "                         folds some with float atomics, whose order varies): H100 decode 17% slower\n";

const char cli_sampling_help[] =
    "sampling options (defaults: the checkpoint's generation_config.json, else greedy):\n"
    "  --temp T               temperature; 0 = greedy\n"
    "  --top-k K              keep the K most likely tokens (0 = off)\n"
    "  --top-p P              keep the smallest set holding probability P (1 = off)\n"
    "  --min-p P              drop tokens less likely than P x the most likely (0 = off)\n"
    "  --repeat-penalty R     penalize tokens of the last --repeat-last-n (64) tokens (1 = off)\n"
    "  --presence-penalty X, --frequency-penalty X   OpenAI-style penalties (0 = off)\n"
    "  --seed N               random seed (same seed + same input = same output)\n"
    "  --stop S               stop before S (repeatable; S is not printed)\n";

enum { SET_TEMP = 1, SET_TOPK = 2, SET_TOPP = 4, SET_MINP = 8, SET_REP = 16, SET_REPN = 32, SET_PRES = 64,
       SET_FREQ = 128, SET_SEED = 256 };

int cli_model_opt(int argc, char **argv, int *i, struct cli_model_opts *o) {
    const char *a = argv[*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->dir = cli_value(argc, argv, i);
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) o->threads = (int)cli_int(a, cli_value(argc, argv, i), 1, 1024);
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size") || !strcmp(a, "--kv-size")) o->n_ctx = (int)cli_int(a, cli_value(argc, argv, i), 1, 1 << 24);
    else if (!strcmp(a, "--quantize")) o->quantize_bits = (int)cli_int(a, cli_value(argc, argv, i), 2, 8);
    else if (!strcmp(a, "--group-size")) o->quantize_group = (int)cli_int(a, cli_value(argc, argv, i), 32, 128);
    else if (!strcmp(a, "--no-template")) o->no_template = 1;
    else if (!strcmp(a, "--chat-template")) o->chat_template = cli_value(argc, argv, i);
    else if (!strcmp(a, "--exact")) o->exact = 1;
    else if (!strcmp(a, "--precise-decode")) o->decode_levels = 2;
    else if (!strcmp(a, "--fast-decode")) o->decode_levels = 1;
    else if (!strcmp(a, "--kv-type")) {
        enum tllm_dtype t;
        o->kv_type = cli_value(argc, argv, i);
        if (tllm_kv_type_parse(o->kv_type, &t)) cli_die("--kv-type: %s", tllm_errmsg());
    }
    else if (!strcmp(a, "--device")) o->device = cli_value(argc, argv, i);
    else if (!strcmp(a, "--deterministic")) o->deterministic = 1;
    else if (!strcmp(a, "--prefill")) {
        enum tllm_prefill p;
        o->prefill = cli_value(argc, argv, i);
        if (tllm_prefill_parse(o->prefill, &p)) cli_die("--prefill: %s", tllm_errmsg());
    }
    else return 0;
    return 1;
}

int cli_sampling_opt(int argc, char **argv, int *i, struct cli_sampling *s) {
    const char *a = argv[*i];
    struct tllm_sampler_params *p = &s->p;
    if (!strcmp(a, "--temp")) p->temperature = (float)cli_double(a, cli_value(argc, argv, i), 0, 100), s->set |= SET_TEMP;
    else if (!strcmp(a, "--top-k")) p->top_k = (int)cli_int(a, cli_value(argc, argv, i), 0, 1 << 24), s->set |= SET_TOPK;
    else if (!strcmp(a, "--top-p")) p->top_p = (float)cli_double(a, cli_value(argc, argv, i), 0, 1), s->set |= SET_TOPP;
    else if (!strcmp(a, "--min-p")) p->min_p = (float)cli_double(a, cli_value(argc, argv, i), 0, 1), s->set |= SET_MINP;
    else if (!strcmp(a, "--repeat-penalty")) p->repeat_penalty = (float)cli_double(a, cli_value(argc, argv, i), 0.01, 100), s->set |= SET_REP;
    else if (!strcmp(a, "--repeat-last-n")) p->repeat_last_n = (int)cli_int(a, cli_value(argc, argv, i), 0, 1 << 20), s->set |= SET_REPN;
    else if (!strcmp(a, "--presence-penalty")) p->presence_penalty = (float)cli_double(a, cli_value(argc, argv, i), -10, 10), s->set |= SET_PRES;
    else if (!strcmp(a, "--frequency-penalty")) p->frequency_penalty = (float)cli_double(a, cli_value(argc, argv, i), -10, 10), s->set |= SET_FREQ;
    else if (!strcmp(a, "--seed")) p->seed = (uint64_t)cli_int(a, cli_value(argc, argv, i), 0, 1L << 62), s->set |= SET_SEED;
    else if (!strcmp(a, "--stop")) {
        const char *v = cli_value(argc, argv, i);
        if (!*v) cli_die("--stop: the stop string is empty");
        if (s->n_stop == CLI_MAX_STOP) cli_die("--stop: at most %d stop strings", CLI_MAX_STOP);
        s->stop[s->n_stop++] = v;
    } else return 0;
    return 1;
}

struct tllm_sampler_params cli_sampling_resolve(const struct cli_session *s, const struct cli_sampling *c) {
    struct tllm_sampler_params p = s->gd->sampler;
    if (c->set & SET_TEMP) p.temperature = c->p.temperature;
    if (c->set & SET_TOPK) p.top_k = c->p.top_k;
    if (c->set & SET_TOPP) p.top_p = c->p.top_p;
    if (c->set & SET_MINP) p.min_p = c->p.min_p;
    if (c->set & SET_REP) p.repeat_penalty = c->p.repeat_penalty;
    if (c->set & SET_REPN) p.repeat_last_n = c->p.repeat_last_n;
    if (c->set & SET_PRES) p.presence_penalty = c->p.presence_penalty;
    if (c->set & SET_FREQ) p.frequency_penalty = c->p.frequency_penalty;
    if (c->set & SET_SEED) p.seed = c->p.seed;
    return p;
}

/* --device: a failure to start OpenCL is reported and the CPU takes over (auto stays quiet when
 * there is simply no GPU). */
static void open_device(struct cli_session *s, const char *dev) {
    int index, fell_back;
    if (tllm_device_index(dev, &index)) cli_die("--device: '%s' is not cpu, opencl, opencl:N or auto", dev);
    if (tllm_session_use_device(s->ss, index, &fell_back)) cli_die_lib();
    if (fell_back) fprintf(stderr, "tllm: %s; running on the CPU\n", tllm_errmsg());
    s->dev = s->ss->dev;
}

void cli_session_open(struct cli_session *s, struct cli_model_opts *o, int need_tok) {
    o->dir = cli_model_dir(o->dir);
    memset(s, 0, sizeof *s);
    double t0 = tllm_now();
    struct tllm_engine_params ep = {.threads = o->threads ? cli_threads(o->threads) : 0, .quantize_bits = o->quantize_bits,
                                    .group_size = o->quantize_group, .exact = o->exact, .fast_decode = o->decode_levels == 1, .no_template = o->no_template,
                                    .deterministic = o->deterministic, .chat_template = o->chat_template};
    struct tllm_engine *e = calloc(1, sizeof *e);
    if (!e || !(e->dir = strdup(o->dir))) cli_die("out of memory");
    if (tllm_engine_load(e, o->dir, &ep)) cli_die_lib();
    if (!e->tok && need_tok) cli_die("%s: no tokenizer.json (use --prompt-ids with checkpoints that have no tokenizer)", o->dir);
    if (o->n_ctx > e->m->cfg.max_pos)
        cli_die("-c %d: longer than the model's %s (%d)", o->n_ctx,
                e->m->cfg.sliding_window ? "sliding window, which tllm does not run past" : "max_position_embeddings",
                e->m->cfg.max_pos);
    struct tllm_session_params sp = {.n_ctx = o->n_ctx, .device = "cpu", .kv_type = o->kv_type};
    if (tllm_session_open(e, &sp, &s->ss)) cli_die_lib();
    s->e = e;
    s->m = e->m;
    s->tok = e->tok;
    s->tpl = &e->tpl;
    s->gd = &e->gd;
    s->ctx = &s->ss->ctx;
    open_device(s, o->device ? o->device : "auto");
    if (o->prefill) tllm_prefill_parse(o->prefill, &s->prefill); /* checked when the option was read */
    if (tllm_ctx_set_prefill(s->ctx, s->prefill)) cli_die_lib();
    s->load_secs = tllm_now() - t0;
}

void cli_session_attach_device(struct cli_session *s) {
    if (!s->dev) return;
    tllm_ctx_use_device(s->ctx, s->dev);
    tllm_ctx_set_prefill(s->ctx, s->prefill); /* as it was when the session opened, so it succeeds */
}

const char *cli_session_backend(const struct cli_session *s) { return tllm_session_device(s->ss); }

struct tllm_backend *cli_session_batch_device(const struct cli_session *s) {
    if (!s->dev) return NULL;
    struct tllm_backend_info info;
    tllm_backend_describe(s->dev, &info);
    if (!s->dev->ops->use_kv || info.prefill < 0) {
        fprintf(stderr, "tllm: %s takes one token at a time for this model: many sequences run on the CPU\n", info.name);
        return NULL;
    }
    return s->dev;
}

enum tllm_dtype cli_kv_dtype(const struct cli_model_opts *o) {
    enum tllm_dtype t = TLLM_DT_F16;
    if (o->kv_type) tllm_kv_type_parse(o->kv_type, &t); /* checked when the option was read */
    return t;
}

void cli_session_close(struct cli_session *s) {
    tllm_session_free(s->ss);
    tllm_engine_free(s->e);
    memset(s, 0, sizeof *s);
}

int cli_encode_chat(struct cli_session *s, const struct tllm_chat_msg *msgs, int n, struct tllm_ids *out) {
    struct tllm_buf text = {0};
    int rc = tllm_chat_render(s->tpl, msgs, n, 1, &text);
    if (!rc) rc = tllm_tok_encode(s->tok, text.data, text.len, 1, out);
    tllm_buf_free(&text);
    return rc;
}
