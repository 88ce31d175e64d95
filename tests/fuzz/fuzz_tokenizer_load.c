/* tokenizer.json: any bytes as the file; a tokenizer that loads must then encode and decode. */
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tllm_tok *t;
    if (tllm_tok_load(fuzz_scratch("tokenizer.json", data, size), &t) != 0) return 0;
    static const char text[] = "Hello world <|im_start|>héllo 123\n\n  x";
    struct tllm_ids ids = {0};
    struct tllm_buf out = {0};
    if (tllm_tok_encode(t, text, sizeof text - 1, 1, &ids) == 0) tllm_tok_decode(t, ids.data, ids.len, 0, &out);
    tllm_ids_free(&ids);
    tllm_buf_free(&out);
    tllm_tok_free(t);
    return 0;
}
