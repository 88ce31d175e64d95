/* One line of a batch prompt file (text or JSONL, chosen by the first byte), then its messages and
 * tools rendered with the ChatML template as `tllm generate --prompts` does. */
#include <stdlib.h>
#include <string.h>

#include "cli/prompt_line.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int jsonl = data[0] & 1;
    char *line = malloc(size);
    memcpy(line, data + 1, size - 1);
    struct tllm_sampler_params base = {.temperature = 0, .top_p = 1, .repeat_penalty = 1};
    static const char *const stop[] = {"END"};
    struct cli_prompt_line pl;
    cli_prompt_line_parse(&pl, line, size - 1, jsonl, 7, &base, stop, 1, 256);
    /* every line keeps an id for its output record: its own, or its number; NULL only for "id": null (an error
     * record says so, cmd_generate.c's check_id) */
    struct json_object *given;
    if (!pl.id && !(pl.obj && json_object_object_get_ex(pl.obj, "id", &given) && !given)) abort();
    if (!pl.err[0]) {
        /* a line runs as messages, token ids or text, and has one of them */
        if (!pl.chat.n_msgs && !pl.n_ids && (!pl.text || !pl.text_len)) abort();
        if (pl.n_ids && !pl.ids) abort();
        if ((pl.chat.tools && !pl.chat.n_msgs) || (pl.grammar_key && !pl.grammar)) abort(); /* tools come with a chat */
        if (pl.chat.n_msgs) { /* as batch files render a chat line: its JSON form, with the tools offered */
            struct tllm_chat_template t = {.kind = TLLM_CHAT_CHATML};
            struct tllm_buf out = {0};
            if (!pl.chat.chat) abort();
            tllm_chat_render_json(&t, pl.chat.chat, oai_callable_tools(&pl.chat), NULL, 1, &out);
            tllm_buf_free(&out);
        }
        if (pl.sp.top_p < 0 || pl.sp.top_p > 1 || pl.max_new < -1 || pl.n_stop > CLI_MAX_STOP) abort();
    }
    cli_prompt_line_free(&pl);
    free(line);
    return 0;
}
