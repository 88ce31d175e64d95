/* Chat templates. Qwen checkpoints carry a Jinja ChatML template in tokenizer_config.json; we
 * recognize it and render it natively, taking the default system prompt from the template text. */
#ifndef TLLM_CHAT_H
#define TLLM_CHAT_H

#include "engine/base/buf.h"
#include "engine/tllm.h" /* struct tllm_chat_msg */

enum tllm_chat_kind {
    TLLM_CHAT_PLAIN,  /* no template: the contents joined by newlines */
    TLLM_CHAT_CHATML, /* <|im_start|>role\ncontent<|im_end|>\n */
};

struct tllm_chat_template {
    enum tllm_chat_kind kind;
    char *default_system; /* NULL: no system turn unless the messages have one */
};


/* Read the chat_template of tokenizer_config.json. A file without one gives TLLM_CHAT_PLAIN; a
 * template that is not ChatML is an error (callers may then choose the plain mode). */
int tllm_chat_template_load(const char *tokenizer_config, struct tllm_chat_template *t);
/* Recognize a template's text (exposed for tests and fuzzing). */
int tllm_chat_template_parse(const char *text, struct tllm_chat_template *t, const char *what);
void tllm_chat_template_free(struct tllm_chat_template *t);

/* Render messages, appending to out; add_generation_prompt opens the assistant's turn. */
int tllm_chat_render(const struct tllm_chat_template *t, const struct tllm_chat_msg *msgs, int n,
                     int add_generation_prompt, struct tllm_buf *out);

#endif
