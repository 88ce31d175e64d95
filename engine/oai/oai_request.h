/* An OpenAI request body (POST /v1/chat/completions, /v1/completions) read into what the engine
 * takes, every field checked: a wrong type or a value out of range is a message naming the field
 * (OpenAI's error "param"), never a crash. Fields the server does not use are ignored, as OpenAI's
 * own server ignores unknown ones; those it cannot honour (n > 1, several prompts, echo) are refused. */
#ifndef TLLM_OAI_REQUEST_H
#define TLLM_OAI_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

#include "engine/grammar/grammar.h"
#include "engine/tllm.h" /* struct tllm_sampler_params, struct tllm_chat_msg */

#define OAI_MAX_STOP 16
#define OAI_MAX_MESSAGES 4096
#define OAI_MAX_TOOLS 256

enum oai_kind { OAI_CHAT, OAI_COMPLETION };

/* which sampling fields the request set (the others keep the server's defaults) */
enum {
    OAI_SET_TEMP = 1, OAI_SET_TOPK = 2, OAI_SET_TOPP = 4, OAI_SET_MINP = 8, OAI_SET_REP = 16,
    OAI_SET_PRES = 32, OAI_SET_FREQ = 64, OAI_SET_SEED = 128
};

struct oai_request {
    enum oai_kind kind;
    struct tllm_chat_msg *msgs; /* chat: [n_msgs], role and content owned */
    int n_msgs;
    char *prompt;               /* completion: the text (NULL when given as token ids) */
    size_t prompt_len;
    int32_t *prompt_ids;        /* completion: token ids, [n_prompt_ids] */
    int n_prompt_ids;
    int max_tokens;             /* -1: not given (until the context is full) */
    struct tllm_sampler_params sp; /* the fields `set` names */
    unsigned set;
    char *stop[OAI_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    int ignore_eos;             /* go on past EOS (llama-server's and vLLM's field: benchmarks use it) */
    int logprobs;               /* token log probabilities asked for */
    int top_logprobs;           /* alternatives per token (chat's top_logprobs, completion's logprobs N) */
    char *model;                /* NULL: not given */
    /* chat: the messages as the template reads them (role, content as one text, tool_calls with their
     * arguments as JSON objects, tool_call_id, name) and the tools offered (NULL: none) */
    struct json_object *chat, *tools;
    enum oai_tool_choice { OAI_TOOLS_AUTO, OAI_TOOLS_NONE, OAI_TOOLS_REQUIRED, OAI_TOOLS_NAMED } tool_choice;
    char *tool_name;            /* OAI_TOOLS_NAMED: the function */
    int parallel_tool_calls;    /* 0: at most one call an answer */
    /* owned: what the answer must follow (response_format json_object / json_schema, or the tool calls
     * tool_choice required or named asks for), compiled here; NULL: free text */
    struct tllm_grammar *grammar;
    char *grammar_key;          /* what it was compiled from, as text: requests with equal keys may share one */
};

/* A request body as one strict JSON value (serde_json's rules: no single quotes, bare keys, trailing
 * commas or text after it), or NULL with the reason in err. */
struct json_object *oai_json_body(const char *body, size_t len, char *err, size_t cap);
/* Parse body[0..len). 0, or -1 with the message in err and the offending field in *param (NULL when
 * the body as a whole is wrong). r is freeable either way. */
int oai_request_parse(struct oai_request *r, enum oai_kind kind, const char *body, size_t len, char *err, size_t cap,
                      const char **param);
/* A chat's part of a body already parsed (root): messages, tools, tool_choice, parallel_tool_calls
 * and response_format, as oai_request_parse reads them; sampling and length are left to the caller
 * (batch files' JSONL lines take their own). 0, or -1 with err and *param as above. */
int oai_chat_parse(struct oai_request *r, struct json_object *root, char *err, size_t cap, const char **param);
/* The tools the answer may call (NULL: none offered, or tool_choice "none", which leaves them out of the
 * prompt too), and how many calls one answer keeps (0: any, with parallel_tool_calls; else 1) */
struct json_object *oai_callable_tools(const struct oai_request *r);
int oai_max_calls(const struct oai_request *r);
void oai_request_free(struct oai_request *r);

#endif
