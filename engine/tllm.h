/* tllm: the C API of a small inference engine for Qwen2 / Qwen2.5 models.
 *
 *     struct tllm_engine *e;                 // weights, tokenizer, chat template
 *     struct tllm_session *s;                // one sequence: its KV cache, on the CPU or a GPU
 *     if (tllm_engine_open("DIR or owner/name", NULL, &e) ||
 *         tllm_session_open(e, NULL, &s)) { fprintf(stderr, "%s\n", tllm_errmsg()); return 1; }
 *     struct tllm_generate_params p;
 *     tllm_generate_params_default(e, &p);
 *     struct tllm_chat_msg msg = {"user", "What does tar do?"};
 *     tllm_session_chat(s, &msg, 1, &p, print_piece, NULL, NULL, NULL);
 *     tllm_session_free(s);
 *     tllm_engine_free(e);
 *
 * Build with `pkg-config --cflags --libs tllm`. Every function that can fail returns a status
 * (TLLM_OK = 0) and leaves a one-line message for tllm_errmsg(); none exits the process. Strings and
 * arrays the library hands out are freed with tllm_free(). The engines of a process share its CPU thread
 * pool (the first one opened sizes it), so they and their sessions are used from one thread at a time. */
#ifndef TLLM_H
#define TLLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TLLM_VERSION "0.5.1"

/* The library's version (TLLM_VERSION of the header it was built from) */
const char *tllm_version(void);

/* ---- errors ---- */

enum tllm_status {
    TLLM_OK = 0,
    TLLM_ERR_IO,          /* a file could not be opened, read or mapped */
    TLLM_ERR_FORMAT,      /* a file's contents are malformed or inconsistent */
    TLLM_ERR_UNSUPPORTED, /* well-formed, but something this engine does not do */
    TLLM_ERR_ARG,         /* a bad argument from the caller / command line */
    TLLM_ERR_NOMEM,       /* an allocation failed or a size is past our limits */
    TLLM_ERR_LIMIT,       /* context full, or another run-time limit reached */
};

/* The last failure's message on this thread ("" if none), e.g. "DIR/config.json: no such file". */
const char *tllm_errmsg(void);

/* What tllm hands out (token arrays, text) */
void tllm_free(void *p);

/* ---- sampling ---- */

struct tllm_sampler_params {
    float temperature;       /* <= 0: greedy */
    int top_k;               /* 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off (HF: divide positive logits, multiply negative ones) */
    int repeat_last_n;       /* window of recent tokens the penalties look at */
    float presence_penalty;  /* 0: off (OpenAI: minus this for every token present in the window) */
    float frequency_penalty; /* 0: off (minus this times the token's count in the window) */
    uint64_t seed;
};

/* temperature 0 (greedy), no penalties, window 64. */
struct tllm_sampler_params tllm_sampler_defaults(void);

/* ---- a model ---- */

struct tllm_engine;

struct tllm_engine_params {
    int threads;        /* CPU threads; 0: the physical cores, or the pool of the engines already open */
    int quantize_bits;  /* quantize a bf16/f16 checkpoint as it loads: 2, 4 or 8; 0: as stored */
    int group_size;     /* of that quantization; 0: 64 */
    int exact;          /* float32 activations in every matmul (transformers' numbers; slower) */
    int fast_decode;    /* generated tokens' int8 activations in one level, as prompt tokens' (llama.cpp's
                         * precision): steps of many sequences take about 0.7x the time. Default: two
                         * levels, as good as float32 and free for one sequence (decode waits on memory) */
    int no_template;    /* ignore the checkpoint's chat template (plain prompts) */
    int deterministic;  /* a GPU's decode sums in a fixed order: the same logits, bit for bit, every run
                         * (default: o_proj and down_proj folded into the phases before them with float
                         * atomic adds, whose order varies in the last bits; an H100 decodes 17% slower without) */
    const char *chat_template; /* a Jinja chat template file to use instead of the checkpoint's (NULL: none) */
};

/* model: a checkpoint directory (config.json + safetensors [+ tokenizer.json]), a Hugging Face repo id
 * "owner/name[@revision]" found in the local hub cache (nothing is downloaded), or NULL for
 * $TLLM_MODEL, else the bundled demo model. params NULL: all defaults (zeros). */
int tllm_engine_open(const char *model, const struct tllm_engine_params *params, struct tllm_engine **out);
void tllm_engine_free(struct tllm_engine *e);
const char *tllm_engine_dir(const struct tllm_engine *e); /* the directory loaded */
int tllm_engine_vocab_size(const struct tllm_engine *e);
int tllm_engine_max_context(const struct tllm_engine *e); /* max_position_embeddings */
int tllm_engine_has_tokenizer(const struct tllm_engine *e);

/* ---- text ---- */

/* Token ids of text (special tokens such as <|im_start|> parsed when parse_special). *ids: tllm_free. */
int tllm_tokenize(const struct tllm_engine *e, const char *text, size_t len, int parse_special, int32_t **ids,
                  size_t *n_ids);
/* The text of ids (NUL-terminated; special tokens left out when skip_special). *text: tllm_free. */
int tllm_detokenize(const struct tllm_engine *e, const int32_t *ids, size_t n_ids, int skip_special, char **text,
                    size_t *len);

struct tllm_chat_msg {
    const char *role; /* "system", "user" or "assistant" */
    const char *content;
};

/* The messages rendered with the checkpoint's chat template (a plain join without one), ending with
 * the assistant's turn when add_generation_prompt. *text: tllm_free. */
int tllm_chat_apply(const struct tllm_engine *e, const struct tllm_chat_msg *msgs, int n, int add_generation_prompt,
                    char **text);

/* ---- a session: one sequence ---- */

struct tllm_session;

struct tllm_session_params {
    int n_ctx;          /* context length in tokens; 0: min(max_position_embeddings, 4096) */
    const char *device; /* "cpu", "opencl", "opencl:N" or "auto" (NULL: auto: a GPU when there is one
                         * and it starts, else the CPU; a device named must start or the open fails);
                         * the prompt is processed on the CPU threads either way */
    const char *kv_type; /* the KV cache's element type: "f16" (NULL: the default) or "f32" (exact) */
};

int tllm_session_open(struct tllm_engine *e, const struct tllm_session_params *params, struct tllm_session **out);
void tllm_session_free(struct tllm_session *s);
/* Forget what the session holds. */
void tllm_session_reset(struct tllm_session *s);
/* "CPU" or "OpenCL <device>" */
const char *tllm_session_device(const struct tllm_session *s);
int tllm_session_n_ctx(const struct tllm_session *s);
/* Tokens in the session's KV cache */
int tllm_session_n_cached(const struct tllm_session *s);

struct tllm_generate_params {
    struct tllm_sampler_params sampling;
    int max_tokens;          /* < 0: until the context is full */
    const char *const *stop; /* stop strings: generation ends where one appears; it is not returned */
    int n_stop;
    int skip_special;        /* leave special tokens out of the text */
    const char *json_schema; /* the answer is JSON that follows this JSON Schema (its text; "{}": any JSON
                              * value), sampling constrained to it; NULL: free text. An unsupported
                              * keyword fails the call with TLLM_ERR_UNSUPPORTED, naming it */
};

/* The checkpoint's generation_config.json sampling (else greedy), 256 tokens, no stop strings,
 * special tokens left out, no schema. */
void tllm_generate_params_default(const struct tllm_engine *e, struct tllm_generate_params *p);

enum tllm_finish {
    TLLM_FINISH_STOP,        /* an EOS token or a stop string */
    TLLM_FINISH_LENGTH,      /* max_tokens */
    TLLM_FINISH_CONTEXT,     /* the KV cache is full */
    TLLM_FINISH_INTERRUPTED, /* the callback asked to stop */
    TLLM_FINISH_TOOL_CALLS,  /* the answer called tools (a chat given as OpenAI's request, with tools) */
};
/* "stop", "length", "length", "interrupted", "tool_calls" (as OpenAI's finish_reason) */
const char *tllm_finish_name(enum tllm_finish f);

struct tllm_stats {
    int n_prompt;       /* prompt tokens */
    int n_reused;       /* of them, found in the cache and not computed again */
    int n_generated;    /* tokens generated (EOS not counted) */
    double prompt_secs; /* prompt processing */
    double gen_secs;    /* generation */
    enum tllm_finish finish;
};

/* Called with each piece of text as it becomes final (never half a UTF-8 character, never part of a
 * stop string); return non-zero to stop generating. */
typedef int (*tllm_gen_cb)(const char *text, size_t len, void *user);

/* Generate after `prompt`, the whole text of the sequence (special tokens parsed): the longest prefix
 * of its tokens that the session's cache holds from earlier calls is reused, the rest is computed,
 * then tokens are sampled until an EOS, a stop string, max_tokens, a full context or the callback.
 * cb may be NULL; text (tllm_free) and stats may be NULL. */
int tllm_session_complete(struct tllm_session *s, const char *prompt, const struct tllm_generate_params *p,
                          tllm_gen_cb cb, void *user, char **text, struct tllm_stats *stats);
/* The same with the prompt as token ids; ids (tllm_free) receives the generated ids. */
int tllm_session_complete_ids(struct tllm_session *s, const int32_t *prompt, size_t n_prompt,
                              const struct tllm_generate_params *p, tllm_gen_cb cb, void *user, char **text,
                              int32_t **ids, size_t *n_ids, struct tllm_stats *stats);
/* A chat turn: the messages rendered with the template (tllm_chat_apply with the generation prompt)
 * and completed; a conversation that resends its history computes only the new turn. */
int tllm_session_chat(struct tllm_session *s, const struct tllm_chat_msg *msgs, int n,
                      const struct tllm_generate_params *p, tllm_gen_cb cb, void *user, char **text,
                      struct tllm_stats *stats);

/* A chat turn given as OpenAI's /v1/chat/completions request body (JSON text), read as `tllm serve`
 * reads it: "messages" (assistant tool_calls and "tool" results included), "tools", "tool_choice",
 * "parallel_tool_calls" and "response_format"; its other fields are ignored (sampling and length are
 * p's). The messages and the tools offered are rendered with the chat template; response_format and
 * tool_choice "required" or a named function constrain the answer (p->json_schema must then be NULL).
 * *text receives the answer; when it called tools, *tool_calls receives the calls as OpenAI's
 * message.tool_calls (a JSON array's text: ids, names, arguments as JSON text), *text what was around
 * them ("" when nothing) and stats->finish is TLLM_FINISH_TOOL_CALLS; else *tool_calls is NULL. cb sees
 * the text as it is generated; with tools offered, only the answer's content, as `tllm serve` streams it:
 * text that may begin a call is held back until the answer ends, then given if it was no call (a call's
 * markup never reaches cb; the text after the calls does). ids receives the generated ids. text,
 * tool_calls, ids (tllm_free) and stats may be NULL. A bad request fails with TLLM_ERR_ARG and a message
 * naming the field. */
int tllm_session_chat_json(struct tllm_session *s, const char *request, const struct tllm_generate_params *p,
                           tllm_gen_cb cb, void *user, char **text, char **tool_calls, int32_t **ids, size_t *n_ids,
                           struct tllm_stats *stats);

/* ---- raw logits ---- */

/* The logits after each of ids: row p (vocab floats) is the next token's distribution after ids[0..p],
 * so out holds n_ids x tllm_engine_vocab_size floats, or with last_only only the last row. The session's
 * cache is emptied first and holds ids afterwards. */
int tllm_session_logits(struct tllm_session *s, const int32_t *ids, size_t n_ids, int last_only, float *out);

/* ---- many prompts at once ---- */

/* One prompt of a batch: the whole text (special tokens parsed), or its ids, or a conversation rendered
 * with the template (and the assistant's turn begun), or one given as OpenAI's chat request (with tools:
 * tllm_session_chat_json's), whichever is given, in that order. */
struct tllm_batch_item {
    const char *prompt;
    const int32_t *prompt_ids;
    size_t n_prompt_ids;
    const struct tllm_chat_msg *msgs;
    int n_msgs;
    const struct tllm_generate_params *params; /* NULL: tllm_generate_params_default's */
    const char *chat_json; /* OpenAI's chat request body, as tllm_session_chat_json takes it */
};
/* What became of one item; it lasts until the callback returns. */
struct tllm_batch_result {
    int status;             /* TLLM_OK, or why this item could not run (the others do): */
    const char *error;      /* its message ("" when TLLM_OK) */
    const char *text;       /* the generated text (NUL-terminated) */
    size_t len;
    const int32_t *ids;     /* the generated ids */
    size_t n_ids;
    struct tllm_stats stats; /* finish TLLM_FINISH_INTERRUPTED: the run was stopped before it ended */
    const char *tool_calls;  /* a chat_json item's calls (tllm_session_chat_json's *tool_calls; text is then
                              * what was around them), else NULL */
};
/* Called once for every item, as each finishes (not in order); non-zero stops the run: the items not
 * finished are then reported as interrupted, with what they had generated. */
typedef int (*tllm_batch_cb)(size_t index, const struct tllm_batch_result *r, void *user);
struct tllm_batch_params {
    int n_parallel; /* sequences at once; 0: 16 on the CPU, 64 on a GPU (as tllm generate --prompts) */
    int n_batch;    /* tokens in one forward step at most (generated tokens plus prompt chunks); 0: 512 */
    int kv_tokens;  /* positions of the paged KV cache the sequences share; 0: 1024 a sequence, >= 4096 */
};
/* Generate for n items at once through the continuous batcher (a paged KV cache shared by up to
 * n_parallel sequences, prompts' common beginnings computed once), on the session's device when it runs
 * many sequences (else the CPU threads). A sequence's tokens do not depend on what runs beside it. Each
 * sequence may reach the session's n_ctx; the session's own cache is emptied. Fails only when the engine
 * does (or bp is bad); each item's own failure (an empty prompt, a bad schema) is its result's status. */
int tllm_session_generate_batch(struct tllm_session *s, const struct tllm_batch_item *items, size_t n,
                                const struct tllm_batch_params *bp, tllm_batch_cb cb, void *user);

#ifdef __cplusplus
}
#endif

#endif
