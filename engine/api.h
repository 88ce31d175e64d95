/* What is behind the public API's handles (engine/tllm.h), for the API's implementation and for the
 * CLI, which reaches the parts the API does not cover (raw logits, benchmarks, the batch writer). */
#ifndef TLLM_API_H
#define TLLM_API_H

#include "engine/backend/backend.h"
#include "base/buf.h"
#include "engine/load/model.h"
#include "engine/run/context.h"
#include "engine/run/generate.h"
#include "engine/tllm.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

struct json_object;

struct tllm_engine {
    char *dir;                     /* the model directory */
    struct tllm_model *m;
    struct tllm_tok *tok;          /* NULL when the directory has no tokenizer.json */
    struct tllm_chat_template tpl; /* plain when there is none (or no_template) */
    struct tllm_gen_defaults gd;   /* generation_config.json */
    int pool;                      /* this engine holds a share of the thread pool */
};

struct tllm_session {
    struct tllm_engine *e;
    struct tllm_ctx ctx;           /* the sequence's place in its KV cache */
    struct tllm_backend *dev;      /* the device decoding, or NULL (the CPU) */
    struct tllm_ids cached;        /* the tokens in the KV cache, in order (a prefix of them may be short) */
    struct tllm_backend_info info; /* the device's, made with it: tllm_session_device's name */
    enum tllm_dtype kv_type;       /* of the cache, and of a batch's (tllm_session_generate_batch) */
};

/* tllm_engine_open's work once the directory is known (e->dir is not touched) */
int tllm_engine_load(struct tllm_engine *e, const char *dir, const struct tllm_engine_params *p);

/* Decode on device `index` (as tllm_backend_device_init's; -3: the CPU). With fell_back != NULL a
 * device that cannot start leaves the CPU in charge with *fell_back = 1 and the reason in tllm_errmsg();
 * auto (-2) without a GPU is the CPU quietly. */
int tllm_session_use_device(struct tllm_session *s, int index, int *fell_back);

/* tllm_session_complete_ids with a grammar compiled already (borrowed; NULL: p->json_schema's, if any) */
int tllm_api_complete(struct tllm_session *s, const int32_t *prompt, size_t n_prompt, const struct tllm_generate_params *p,
                      const struct tllm_grammar *grammar, tllm_gen_cb cb, void *user, char **text, int32_t **ids,
                      size_t *n_ids, struct tllm_stats *stats);

/* A chat given as OpenAI's request (engine/api_chat.c): its prompt, what constrains the answer, the
 * tools it may call */
struct tllm_api_chat {
    struct tllm_ids prompt;         /* the messages and tools rendered with the template, as ids */
    struct tllm_grammar *grammar;   /* response_format's or tool_choice's, or NULL */
    char *grammar_key;              /* what grammar was compiled from (requests with equal keys may share it) */
    struct json_object *tools;      /* the tools the answer may call, or NULL */
    int max_calls;                  /* calls one answer keeps (0: any) */
};
/* The request read, rendered and tokenized; p (may be NULL) only to refuse a json_schema beside the
 * request's own constraint. c is freeable either way. */
int tllm_api_chat_prepare(const struct tllm_engine *e, const char *request, const struct tllm_generate_params *p,
                          struct tllm_api_chat *c);
/* The calls in an answer: 1 with *calls (OpenAI's tool_calls, JSON text) and *content (the text around
 * them, "" when none), 0 when it made none, -1 out of memory; free() both. */
int tllm_api_chat_calls(const struct tllm_api_chat *c, const char *text, size_t len, char **calls, char **content);
void tllm_api_chat_free(struct tllm_api_chat *c);

#endif
