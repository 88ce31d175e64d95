/* One line of a batch prompt file (`tllm generate --prompts`): a plain text line, or a JSONL object
 * with "prompt" or "messages" and per-line options. Parsing needs no model, so it is fuzzed alone. */
#ifndef TLLM_CLI_PROMPT_LINE_H
#define TLLM_CLI_PROMPT_LINE_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/run/sampler.h"
#include "engine/oai/oai_request.h"
#include "tokenizer/chat.h"

#define CLI_MAX_STOP 16
/* A prompt-file line longer than this is refused where it is read (cli_getline), before parsing; the
 * context could not hold it anyway. */
#define CLI_MAX_PROMPT_LINE (16u << 20)

struct cli_prompt_line {
    struct json_object *id;      /* the line's "id", else its number; owned */
    struct tllm_sampler_params sp;
    const char *stop[CLI_MAX_STOP];
    int n_stop, max_new;
    const char *text;            /* a plain prompt: the text line, or "prompt" */
    size_t text_len;
    /* or "messages" (chat.n_msgs > 0), read as the server reads a chat (tool calls, tool results, content
     * parts) with the line's "tools", "tool_choice", "parallel_tool_calls" and "response_format"; owned
     * (oai_callable_tools and oai_max_calls say what the answer may call) */
    struct oai_request chat;
    int32_t *ids;                /* or "prompt" as token ids (n_ids > 0); owned */
    int n_ids;
    struct json_object *obj;     /* the parsed JSONL line that the strings point into; owned */
    struct tllm_grammar *grammar; /* what the answer must follow: its "response_format" (OpenAI's object), or
                                   * the calls "tool_choice" asks for, compiled; NULL: free text; owned */
    char *grammar_key;           /* what that was compiled from, as text (lines with equal keys may share it) */
    char err[256];               /* why the line cannot run ("" when it can) */
};

/* Parse `line` (n bytes, no newline; it must outlive the result) as line number `lineno` of a
 * text (jsonl = 0) or JSONL (jsonl = 1) prompt file, over the defaults `base`, the command line's stop
 * strings and max_new. Never fails as a whole: a bad line gets pl->err and keeps its id. */
void cli_prompt_line_parse(struct cli_prompt_line *pl, const char *line, size_t n, int jsonl, long lineno,
                           const struct tllm_sampler_params *base, const char *const *stop, int n_stop,
                           int max_new);
void cli_prompt_line_free(struct cli_prompt_line *pl);

/* 0 if s[0..n) is valid UTF-8, else writes "... not valid UTF-8 at byte N ..." into err. */
int cli_check_utf8(const char *what, const char *s, size_t n, char *err, size_t cap);

#endif
