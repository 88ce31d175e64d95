/* Tool calls in a model's answer: Qwen2.5's (and Hermes') <tool_call>{"name": ..., "arguments": ...}
 * </tool_call> blocks, taken out of the text into OpenAI's message.tool_calls. */
#ifndef TLLM_TOOL_CALLS_H
#define TLLM_TOOL_CALLS_H

#include <stddef.h>

struct json_object;

/* The calls in text[0..len): 1 with *calls an OpenAI tool_calls array (ids made fresh, arguments as
 * JSON text) and *content the text around the blocks, trimmed (NULL when none is left); 0 when the text
 * has no call, or a block that is not a complete call (the answer is then returned as text, as
 * written). An answer that is nothing but {"name": ..., "arguments": ...} naming one of the tools
 * offered is a call too: small models often leave the tags out. max_calls > 0 keeps only the first so
 * many. */
int oai_tool_calls_parse(const char *text, size_t len, struct json_object *tools, int max_calls,
                         struct json_object **calls, char **content);

/* How much of text[0..len) can be streamed as content now: up to the first "<tool_call>", or all but
 * a tail that may be the start of one; nothing while the answer may be a bare JSON call. from: this
 * function's answer for a prefix of the same text (0 the first time): the text before it is not read
 * again, so a streamed answer costs its length, not its length squared. */
size_t oai_tool_calls_safe(const char *text, size_t len, size_t from);

#endif
