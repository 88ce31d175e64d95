/* The Jinja interpreter: input = a template, then optionally a NUL and the variables as JSON (else a
 * small conversation with a tool). Parsing and rendering must fail cleanly or succeed; never crash,
 * leak, hang or outgrow the limits (the output is checked against TLLM_JINJA_MAX_OUTPUT). */
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/jinja/jinja.h"

static const char default_vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi {{x}}\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>a</think>b\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"r\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
    " \"parameters\": {\"type\": \"object\"}}}], \"add_generation_prompt\": true, \"eos_token\": \"<|im_end|>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    struct tllm_jinja *t;
    if (tllm_jinja_parse((const char *)data, tlen, "fuzz", &t)) return 0;
    struct json_object *vars = NULL;
    if (nul) {
        struct json_tokener *tok = json_tokener_new_ex(64);
        if (tok) {
            vars = json_tokener_parse_ex(tok, (const char *)nul + 1, (int)(size - tlen - 1));
            json_tokener_free(tok);
        }
    }
    if (!vars) vars = json_tokener_parse(default_vars);
    struct tllm_buf out = {0};
    tllm_jinja_render(t, vars, &out);
    if (out.len > TLLM_JINJA_MAX_OUTPUT) abort();
    tllm_buf_free(&out);
    json_object_put(vars);
    tllm_jinja_free(t);
    return 0;
}
