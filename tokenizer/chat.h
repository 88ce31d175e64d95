/* Chat templates: the checkpoint's Jinja template (tokenizer_config.json's chat_template, a GGUF's
 * tokenizer.chat_template, or a file given with --chat-template), run by the interpreter in
 * tokenizer/jinja/ as transformers' apply_chat_template runs it. A ChatML template the interpreter
 * cannot parse is still rendered as ChatML (its default system prompt taken from the text). */
#ifndef TLLM_CHAT_H
#define TLLM_CHAT_H

#include "base/buf.h"
#include "engine/tllm.h" /* struct tllm_chat_msg */

enum tllm_chat_kind {
    TLLM_CHAT_PLAIN,  /* no template: the contents joined by newlines */
    TLLM_CHAT_CHATML, /* <|im_start|>role\ncontent<|im_end|>\n */
    TLLM_CHAT_JINJA,  /* the template itself, run */
};

struct tllm_jinja;
struct json_object;

struct tllm_chat_template {
    enum tllm_chat_kind kind;
    char *default_system; /* CHATML: NULL, no system turn unless the messages have one */
    struct tllm_jinja *jinja;     /* JINJA */
    struct json_object *specials; /* bos_token, eos_token, ... as the template sees them (may be NULL) */
    char *parse_error;            /* CHATML: why the interpreter refused the text (for tllm info) */
};


/* Read the chat_template of tokenizer_config.json (and its bos/eos/pad/unk tokens). A file without
 * one gives TLLM_CHAT_PLAIN. */
int tllm_chat_template_load(const char *tokenizer_config, struct tllm_chat_template *t);
/* A template's text; what names it in messages. Neither Jinja the interpreter runs nor ChatML: an error
 * naming the line and column (callers may then choose the plain mode). */
int tllm_chat_template_parse(const char *text, struct tllm_chat_template *t, const char *what);
/* The same, keeping the special tokens t already has. */
int tllm_chat_template_parse_keep(const char *text, struct tllm_chat_template *t, const char *what);
/* A template file's text (--chat-template FILE), keeping t's special tokens. */
int tllm_chat_template_file(const char *path, struct tllm_chat_template *t);
/* Set a variable the template sees beside the messages ("bos_token", "eos_token" ...). */
int tllm_chat_template_set_token(struct tllm_chat_template *t, const char *name, const char *value);
void tllm_chat_template_free(struct tllm_chat_template *t);

/* Render messages, appending to out; add_generation_prompt opens the assistant's turn. */
int tllm_chat_render(const struct tllm_chat_template *t, const struct tllm_chat_msg *msgs, int n,
                     int add_generation_prompt, struct tllm_buf *out);
/* The same from JSON, as OpenAI requests carry it: messages (an array of objects: role, content,
 * tool_calls, ...), tools (an array or NULL), and further variables (an object or NULL, e.g.
 * {"enable_thinking": false}); add_generation_prompt as above. */
int tllm_chat_render_json(const struct tllm_chat_template *t, struct json_object *messages, struct json_object *tools,
                          struct json_object *extra, int add_generation_prompt, struct tllm_buf *out);

#endif
