/* The tokenizer's tables, shared by its source files. */
#ifndef TLLM_TOK_INTERNAL_H
#define TLLM_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/strmap.h"
#include "tokenizer/tokenizer.h"

struct tllm_added_token {
    char *content;
    size_t len;
    int32_t id;
    int special;
};

/* One BPE merge: the pair (left, right) becomes `merged`; lower rank merges first. */
struct tllm_merge_entry {
    uint64_t key; /* (left << 32) | right, or UINT64_MAX when the slot is empty */
    int32_t rank;
    int32_t merged;
};

struct tllm_bpe_cache_entry {
    char *word;       /* byte-level piece (raw bytes) */
    size_t len;
    int32_t *ids;
    int n_ids;
};

struct tllm_tok {
    int n_vocab;                /* every id < n_vocab */
    char **token_bytes;         /* [n_vocab] raw bytes of each id (NULL for gaps) */
    uint32_t *token_len;        /* [n_vocab] */
    uint8_t *is_special;        /* [n_vocab] */
    struct tllm_strmap vocab;   /* byte-level token string -> id (as written in tokenizer.json) */
    int32_t byte_id[256];       /* id of each single byte */
    struct tllm_merge_entry *merges; /* open addressing, capacity merge_cap (power of two) */
    size_t merge_cap;
    struct tllm_added_token *added; /* sorted longest first */
    int n_added;
    uint8_t added_first[256];   /* 1 if some added token starts with this byte */
    int nfc;                    /* normalizer is NFC */
    int ignore_merges;          /* BPE option: a piece found whole in the vocab is one token */
    pcre2_code *split_re;       /* the pre-tokenizer's Split regex (NULL: no split) */
    int split_invert;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    struct tllm_bpe_cache_entry *cache; /* direct-mapped cache of BPE results per piece */
    size_t cache_cap;
    char *path;                 /* tokenizer.json, for messages */
    double deadline;            /* of the encode running: the regex's time budget (encode.c) */
    size_t max_ids;             /* of the encode running: ids the output may hold at most (SIZE_MAX: any) */
    int over_budget;            /* the encode running stopped at max_ids */
    uint32_t max_token_len;     /* the longest token's bytes: a piece of n bytes is n / this tokens at least */
};

/* Byte-level mapping (GPT-2): byte -> code point, and code point -> byte (-1 if none). */
uint32_t tllm_bytelevel_char(uint8_t b);
int tllm_bytelevel_byte(uint32_t cp);

/* BPE of one pre-tokenized piece (raw bytes), appending ids to out. */
int tllm_bpe_word(struct tllm_tok *t, const unsigned char *piece, size_t len, struct tllm_ids *out);

#endif
