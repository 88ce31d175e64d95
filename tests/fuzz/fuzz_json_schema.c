/* JSON Schema -> grammar (engine/grammar/): input = a schema, then optionally a NUL and a text to match
 * against the grammar (else the schema's own text). Compiling must fail with a message or succeed,
 * and matching must end; never crash, leak or outgrow TLLM_GRAMMAR_MAX_ELEMS. */
#include <json-c/json.h>
#include <string.h>

#include "engine/grammar/json_schema.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    struct json_tokener *tok = json_tokener_new_ex(64);
    if (!tok) return 0;
    struct json_object *schema = json_tokener_parse_ex(tok, (const char *)data, (int)slen);
    json_tokener_free(tok);
    if (!schema) return 0;
    struct tllm_grammar *g = NULL;
    if (!tllm_schema_grammar(schema, "fuzz", &g)) {
        const char *text = nul ? (const char *)nul + 1 : (const char *)data;
        size_t n = nul ? size - slen - 1 : slen;
        tllm_gram_match(g, text, n > 4096 ? 4096 : n);
        tllm_grammar_free(g);
    }
    struct json_object *rf = json_object_new_object(); /* the same schema as a response_format */
    json_object_object_add(rf, "type", json_object_new_string("json_schema"));
    struct json_object *js = json_object_new_object();
    json_object_object_add(js, "schema", json_object_get(schema));
    json_object_object_add(rf, "json_schema", js);
    if (!tllm_response_format_grammar(rf, "response_format", &g)) tllm_grammar_free(g);
    json_object_put(rf);
    json_object_put(schema);
    return 0;
}
