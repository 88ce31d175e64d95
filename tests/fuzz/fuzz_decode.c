/* Streaming decode of arbitrary id sequences (out-of-range ids included): the stream must emit only
 * valid UTF-8 and, flushed, the same text as the one-shot decode. */
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static struct tllm_tok *tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok && tllm_tok_load(TLLM_FUZZ_TOKENIZER, &tok) != 0) abort();
    if (size == 0) return 0;
    int skip = data[0] & 1;
    data++, size--;
    size_t n = size / 3;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int any_bad = 0;
    for (size_t i = 0; i < n; i++) { /* 3 bytes: ids up to 2^24, past the vocabulary (151665) too */
        ids[i] = (int32_t)(data[3 * i] | data[3 * i + 1] << 8 | (data[3 * i + 2] & 0x03) << 16);
        any_bad |= ids[i] >= tllm_tok_n_vocab(tok);
    }
    struct tllm_buf whole = {0}, streamed = {0};
    int rc = tllm_tok_decode(tok, ids, n, skip, &whole);
    if (rc == 0 && any_bad) abort(); /* an unknown id must be an error */
    struct tllm_tok_stream s;
    tllm_tok_stream_init(&s, tok, skip);
    int src = 0;
    for (size_t i = 0; i < n && !src; i++) {
        size_t before = streamed.len;
        src = tllm_tok_stream_push(&s, ids[i], &streamed);
        if (streamed.len > before &&
            tllm_utf8_valid_prefix(streamed.data + before, streamed.len - before) != streamed.len - before)
            abort(); /* every piece is whole characters */
    }
    if (!src) src = tllm_tok_stream_flush(&s, &streamed);
    if (!rc && !src && (whole.len != streamed.len || (whole.len && memcmp(whole.data, streamed.data, whole.len))))
        abort();
    tllm_buf_free(&whole);
    tllm_buf_free(&streamed);
    free(ids);
    return 0;
}
