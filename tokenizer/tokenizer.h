/* Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen2 / Qwen2.5 style). */
#ifndef TLLM_TOKENIZER_H
#define TLLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* tokenizer.json larger than this is refused (Qwen2.5's is 7 MB). */
#define TLLM_TOK_MAX_FILE (256u << 20)

struct tllm_tok;
struct json_object;

int tllm_tok_load(const char *tokenizer_json, struct tllm_tok **out);
/* The same from a tokenizer.json already parsed (`what` names its source in messages): how a GGUF
 * file's vocabulary, written out in tokenizer.json's terms, is loaded (engine/load/gguf_vocab.c) */
int tllm_tok_from_json(struct json_object *root, const char *what, struct tllm_tok **out);
void tllm_tok_free(struct tllm_tok *t);

/* Encode `len` bytes of text, appending ids to `out`. parse_special: special tokens written in the
 * text (e.g. "<|im_start|>") become their ids, as HF does by default; otherwise they are encoded as
 * plain text (non-special added tokens are still matched, as HF's split_special_tokens does).
 * Invalid UTF-8 never fails: each byte of an invalid sequence is encoded as its own byte-level
 * token, so decoding gives the original bytes back. */
int tllm_tok_encode(struct tllm_tok *t, const char *text, size_t len, int parse_special,
                    struct tllm_ids *out);
/* As tllm_tok_encode, but gives up (TLLM_ERR_LIMIT, "... more than max_ids tokens", *too_long set; `out`
 * holds max_ids ids at most) as soon as it would hold more than max_ids ids, before merging a piece that is longer than the ids left can hold:
 * the work done is bounded by max_ids tokens' worth of text, whatever the text's size (a server's
 * prompt is refused for its length without encoding megabytes of it). */
int tllm_tok_encode_max(struct tllm_tok *t, const char *text, size_t len, int parse_special, size_t max_ids,
                        struct tllm_ids *out, int *too_long);

/* ids -> UTF-8 text appended to out; byte sequences that are not valid UTF-8 become U+FFFD (as HF's
 * decode does). skip_special drops special tokens. An id outside the vocabulary is an error. */
int tllm_tok_decode(const struct tllm_tok *t, const int32_t *ids, size_t n, int skip_special,
                    struct tllm_buf *out);

/* Number of ids (base vocabulary + added tokens): every id is < this. */
int tllm_tok_n_vocab(const struct tllm_tok *t);
/* The id of a token by its exact content (vocab entry or added token), or -1. */
int32_t tllm_tok_find(const struct tllm_tok *t, const char *content);
/* 1 if id is a special added token. */
int tllm_tok_is_special(const struct tllm_tok *t, int32_t id);
/* The raw bytes of one token (NULL for an unknown id). */
const char *tllm_tok_bytes(const struct tllm_tok *t, int32_t id, size_t *len);

/* Streaming decode: push ids one at a time; only complete UTF-8 characters are emitted, a
 * character split across tokens is held back until its last byte arrives. */
struct tllm_tok_stream {
    const struct tllm_tok *tok;
    int skip_special;
    unsigned char pending[4];
    int n_pending;
};
void tllm_tok_stream_init(struct tllm_tok_stream *s, const struct tllm_tok *t, int skip_special);
/* Append the text this id completes to out (none for an id the tokenizer lacks). */
int tllm_tok_stream_push(struct tllm_tok_stream *s, int32_t id, struct tllm_buf *out);
/* Emit whatever is held back (as U+FFFD: it can no longer complete). */
int tllm_tok_stream_flush(struct tllm_tok_stream *s, struct tllm_buf *out);

/* Append bytes to out as UTF-8, replacing each maximal invalid subsequence with U+FFFD. */
int tllm_utf8_lossy_append(struct tllm_buf *out, const unsigned char *s, size_t n);

/* Length of the valid UTF-8 character at s (1-4), or 0 if s[0..n) does not start with one. */
int tllm_utf8_valid_len(const unsigned char *s, size_t n);
/* Length of the longest valid UTF-8 prefix of s[0..n): n when all of it is valid, else the offset of
 * the first byte that does not start a valid character. */
size_t tllm_utf8_valid_prefix(const void *s, size_t n);

#endif
