/* The tokenizer a GGUF file carries (tokenizer.ggml.*), loaded as tllm's tokenizer. */
#ifndef TLLM_GGUF_VOCAB_H
#define TLLM_GGUF_VOCAB_H

#include "engine/load/gguf.h"
#include "tokenizer/tokenizer.h"

/* TLLM_OK with *out = NULL when the file has no vocabulary; an error naming the file and key for a
 * tokenizer tllm cannot reproduce exactly (not byte-level BPE, or another pre-tokenizer than qwen2's). */
int tllm_gguf_tokenizer(const struct tllm_gguf *g, struct tllm_tok **out);

#endif
