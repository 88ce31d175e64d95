/* A Jinja interpreter for chat templates: the subset the checkpoints' templates use (Qwen2, Qwen2.5,
 * Qwen2.5-Coder, QwQ, Qwen2.5-Math, and the like), rendered as transformers' apply_chat_template renders
 * them with jinja2 (trim_blocks, lstrip_blocks, loop controls, tojson without ASCII escapes,
 * raise_exception, strftime_now). No Debian library runs Jinja from C, hence this one.
 *
 * A parsed template is immutable: any number of threads may render it at once. Rendering is bounded
 * (output bytes, memory, steps, macro depth), so a hostile template fails with a message, never hangs. */
#ifndef TLLM_JINJA_H
#define TLLM_JINJA_H

#include <stddef.h>

#include "base/buf.h"

struct json_object;
struct tllm_jinja;

#ifndef TLLM_JINJA_MAX_OUTPUT
#define TLLM_JINJA_MAX_OUTPUT (32u << 20) /* bytes a rendering may write */
#endif
#ifndef TLLM_JINJA_MAX_MEMORY
#define TLLM_JINJA_MAX_MEMORY (256u << 20) /* bytes a parse or a rendering may allocate */
#endif
#ifndef TLLM_JINJA_MAX_STEPS
#define TLLM_JINJA_MAX_STEPS 20000000L /* nodes a rendering may evaluate */
#endif
#ifndef TLLM_JINJA_MAX_DEPTH
#define TLLM_JINJA_MAX_DEPTH 200 /* nesting of the parse and of macro calls */
#endif

/* Parse text[0..len). name labels error messages ("NAME:LINE:COL: ..."). */
int tllm_jinja_parse(const char *text, size_t len, const char *name, struct tllm_jinja **out);
/* Render with the variables of a JSON object (messages, tools, add_generation_prompt, bos_token ...),
 * appending to out. On error out may hold a partial rendering. */
int tllm_jinja_render(const struct tllm_jinja *t, struct json_object *vars, struct tllm_buf *out);
void tllm_jinja_free(struct tllm_jinja *t);

#endif
