/* The tokenizer a GGUF file carries (tokenizer.ggml.*), loaded as tllm's tokenizer. */
#ifndef TLLM_GGUF_VOCAB_H
#define TLLM_GGUF_VOCAB_H

#include "engine/load/gguf.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

/* TLLM_OK with *out = NULL when the file has no vocabulary; an error naming the file and key for a
 * tokenizer tllm cannot reproduce exactly (not byte-level BPE, or another pre-tokenizer than qwen2's). */
int tllm_gguf_tokenizer(const struct tllm_gguf *g, struct tllm_tok **out);

/* tokenizer.chat_template (plain when absent), with the file's bos/eos/unk/pad tokens as its variables */
int tllm_gguf_chat_template(const struct tllm_gguf *g, struct tllm_chat_template *tpl);

/* The tokenizer (when tok is not NULL; an error when it has none) and the chat template (when tpl is not
 * NULL; plain when it has none) of the GGUF file at path, without loading its weights: for the tokenize
 * command */
int tllm_gguf_file_tokenizer(const char *path, struct tllm_tok **tok, struct tllm_chat_template *tpl);

#endif
