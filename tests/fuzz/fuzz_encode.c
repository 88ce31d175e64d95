/* Encoding arbitrary bytes with the real Qwen2.5 tokenizer: never fails, and decoding the ids with
 * special tokens kept must give the input back byte for byte when it is valid UTF-8 and the
 * special-token parsing is on or off (the invariant HF's byte-level BPE has). With a token budget
 * (a server's context) the ids are the same when they fit, and a refusal holding no more than the
 * budget when they do not. */
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static struct tllm_tok *tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok && tllm_tok_load(TLLM_FUZZ_TOKENIZER, &tok) != 0) abort();
    if (size == 0) return 0;
    int special = data[0] & 1;
    data++, size--;
    struct tllm_ids ids = {0};
    if (tllm_tok_encode(tok, (const char *)data, size, special, &ids) != 0) abort(); /* never fails */
    for (size_t i = 0; i < ids.len; i++)
        if (ids.data[i] < 0 || ids.data[i] >= tllm_tok_n_vocab(tok)) abort();
    struct tllm_buf out = {0};
    if (tllm_tok_decode(tok, ids.data, ids.len, 0, &out) != 0) abort();
    /* NFC normalization may change valid text; round trip holds for text NFC leaves alone, which
     * includes all ASCII */
    int ascii = 1;
    for (size_t i = 0; i < size && ascii; i++) ascii = data[i] < 0x80;
    if (ascii && tllm_utf8_valid_prefix(data, size) == size && (out.len != size || memcmp(out.data, data, size) != 0)) abort();
    size_t max = ids.len ? (size_t)data[0] % (ids.len + 2) : 1; /* below, at and past the length */
    struct tllm_ids b = {0};
    int over = 0, rc = tllm_tok_encode_max(tok, (const char *)data, size, special, max, &b, &over);
    if (max >= ids.len ? rc || over || b.len != ids.len || (b.len && memcmp(b.data, ids.data, b.len * sizeof *b.data))
                       : !rc || !over || b.len > max)
        abort();
    tllm_ids_free(&b);
    tllm_buf_free(&out);
    tllm_ids_free(&ids);
    return 0;
}
