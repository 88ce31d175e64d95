/* OpenAI response bodies: a whole completion, the chunks of a streamed one (server-sent events),
 * log probabilities in the chat and the legacy completion shapes, and error objects. */
#ifndef TLLM_OAI_RESPONSE_H
#define TLLM_OAI_RESPONSE_H

#include <json-c/json.h>

#include "server/engine_thread.h"
#include "engine/oai/oai_request.h"
#include "tokenizer/tokenizer.h"

/* What every object of one answer repeats */
struct oai_answer {
    enum oai_kind kind;
    const char *id;          /* "chatcmpl-..." / "cmpl-..." */
    long long created;       /* Unix seconds */
    const char *model;
    const struct tllm_tok *tok; /* token text of log probabilities (NULL: ids as text) */
    int logprobs;            /* the request asked for them */
    size_t text_offset;      /* legacy logprobs: the bytes of text before the next token */
};

/* {"error": {"message", "type", "param", "code"}} */
struct json_object *oai_error(const char *message, const char *type, const char *param);

/* The finished answer (non-streamed): text, the log probabilities lps[0..n_lps), usage and finish */
struct json_object *oai_completion(struct oai_answer *a, const char *text, size_t len, const struct srv_logprob *lps,
                                   size_t n_lps, const struct srv_job *j);

/* A streamed chunk of text (role: the chat's first chunk, which names the assistant), its tokens'
 * log probabilities, and (finish non-NULL) the finish reason; usage: a field "usage": null, as
 * OpenAI's chunks carry when the client asked for usage */
struct json_object *oai_chunk(struct oai_answer *a, int role, const char *text, size_t len, const struct srv_logprob *lps,
                              size_t n_lps, const char *finish, int usage);
/* A streamed tool call, as OpenAI streams one: first its id, type and name with empty arguments
 * (header 1), then its arguments (header 0); index: the call's place in the answer */
struct json_object *oai_tool_chunk(struct oai_answer *a, int index, struct json_object *call, int header, int with_usage);
/* A finished chat answer's message made a tool-calling one: content (NULL: null), the calls, finish
 * "tool_calls" */
void oai_completion_tool_calls(struct json_object *answer, const char *content, struct json_object *calls);
/* The last chunk when the client asked for usage: no choices, the usage */
struct json_object *oai_usage_chunk(struct oai_answer *a, const struct srv_job *j);

/* "stop" or "length" */
const char *oai_finish(enum tllm_finish f);

/* Append "data: <json>\n\n" (and drop the object) */
int oai_sse(struct tllm_buf *out, struct json_object *o);

#endif
