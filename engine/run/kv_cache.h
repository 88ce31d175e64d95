/* The KV cache every sequence of a context shares, in blocks of TLLM_KV_BLOCK positions (vLLM's
 * PagedAttention): each sequence has a block table; blocks are reference-counted, so sequences whose
 * token ids begin alike share the blocks of that prefix, which is computed once. A full block is
 * known by its tokens and its parent block (the one before it in the table), so a lookup finds
 * exactly the blocks a prefix's tokens would have filled; a block nobody holds any more stays findable
 * until its memory is needed (least recently released first). Memory is bounded by n_blocks, whatever
 * the number of sequences.
 *
 * Storage, per layer and block, per KV head: keys transposed, [head_dim][TLLM_KV_BLOCK] (so a query's
 * dot products with 16 keys are one vector of 16 lanes), values [TLLM_KV_BLOCK][head_dim]; f16 or f32. */
#ifndef TLLM_KV_CACHE_H
#define TLLM_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#define TLLM_KV_BLOCK 16 /* positions per block */

struct tllm_kv_seq {
    int32_t *blocks;  /* [n_blocks] the block table: block i holds positions [16 i, 16 i + 16) */
    int n_blocks, cap_blocks;
    int n_tokens;     /* positions written (committed) */
    int32_t *tokens;  /* [n_tokens] their ids: what a full block is known by */
    int cap_tokens;
    int open;
    unsigned step_mark; /* the last tllm_kv_check_step that saw it (its tokens must be together) */
};

struct tllm_kv_block {
    int ref;          /* sequences holding it */
    int parent;       /* a full block: the block before it in the table that filled it (-1: first) */
    uint32_t parent_gen, gen; /* gen: bumped each time the block is reused, so stale children never match */
    int hashed;       /* full, and findable by (parent, tokens) */
    int hash_next;    /* chain in its hash bucket */
    int lru_prev, lru_next; /* ref == 0 and hashed: the release order (eviction takes the oldest) */
    int32_t tokens[TLLM_KV_BLOCK];
};

struct tllm_kv {
    int n_layers, n_kv_heads, head_dim;
    enum tllm_dtype dtype; /* TLLM_DT_F16 or TLLM_DT_F32 */
    int n_blocks;
    size_t esize;          /* bytes per element */
    size_t block_elems;    /* elements of one block of one layer: n_kv_heads x head_dim x 16 (keys, and again values) */
    void *k, *v;           /* [n_layers x n_blocks x block_elems] */
    struct tllm_kv_block *meta;   /* [n_blocks] */
    int *free_stack, n_free_clean; /* blocks with ref == 0 that nobody can find: taken first */
    int lru_head, lru_tail, n_free_cached; /* ref == 0 but findable: taken oldest first */
    int *buckets, n_buckets;       /* hash of (parent, tokens) -> chain of blocks */
    struct tllm_kv_seq *seqs;      /* [max_seqs] */
    int max_seqs;
    /* The blocks' contents live on a device (tllm_kv_set_remote): a shared block that reserve must
     * write is not copied here; the (from, to) pair is logged for the device to copy before its next
     * step, which then empties the log */
    int remote;
    int32_t *copies; /* [2 n_copies] */
    int n_copies, cap_copies;
    unsigned step_stamp;
};

/* "f16" or "f32" (the front ends' --kv-type) */
int tllm_kv_type_parse(const char *name, enum tllm_dtype *out);

/* A cache of n_tokens positions (rounded up to whole blocks) for up to max_seqs sequences. dtype:
 * TLLM_DT_F16 (the default of the front ends) or TLLM_DT_F32 (exact). Pages are committed as they
 * are first written, so an unused capacity costs address space only. */
int tllm_kv_init(struct tllm_kv **out, int n_layers, int n_kv_heads, int head_dim, int n_tokens,
                 enum tllm_dtype dtype, int max_seqs);
void tllm_kv_free(struct tllm_kv *kv);
/* Blocks nobody holds (free, or cached and evictable) */
int tllm_kv_n_free(const struct tllm_kv *kv);
static inline int tllm_kv_blocks_for(int n_tokens) { return (n_tokens + TLLM_KV_BLOCK - 1) / TLLM_KV_BLOCK; }

/* A new, empty sequence: its id in *seq. TLLM_ERR_LIMIT when max_seqs are open. */
int tllm_kv_seq_open(struct tllm_kv *kv, int *seq);
/* Give back every block of the sequence and close it. */
void tllm_kv_seq_close(struct tllm_kv *kv, int seq);
/* Attach the cached blocks that hold ids further on, from where the sequence stands (whose positions
 * so far hold the first of ids, and end at a block's end): whole blocks, and never the last token (its
 * logits must be computed); a block reserved there and not yet written is given back. Returns the
 * positions now cached: compute from there. */
int tllm_kv_seq_reuse(struct tllm_kv *kv, int seq, const int32_t *ids, int n);
/* Make positions [0, n) of the sequence writable: blocks allocated, and a partly kept block that
 * another sequence shares copied first. TLLM_ERR_LIMIT (nothing changed) when blocks run out. */
int tllm_kv_seq_reserve(struct tllm_kv *kv, int seq, int n);
/* The next n positions were written with these ids: blocks that are now full become findable (ids
 * NULL: written with ids unknown here, as a device's were; their blocks never become findable). */
int tllm_kv_seq_commit(struct tllm_kv *kv, int seq, const int32_t *ids, int n);
/* Drop positions [n, n_tokens) (a new turn reuses the rest). */
void tllm_kv_seq_truncate(struct tllm_kv *kv, int seq, int n);
/* Blocks a sequence needs beyond those it holds to reach n positions */
int tllm_kv_seq_blocks_needed(const struct tllm_kv *kv, int seq, int n);

/* Block b of layer l: its first element (keys or values) */
static inline void *tllm_kv_k(const struct tllm_kv *kv, int l, int b) {
    return (char *)kv->k + ((size_t)l * kv->n_blocks + (size_t)b) * kv->block_elems * kv->esize;
}
static inline void *tllm_kv_v(const struct tllm_kv *kv, int l, int b) {
    return (char *)kv->v + ((size_t)l * kv->n_blocks + (size_t)b) * kv->block_elems * kv->esize;
}

/* A step's tokens checked before a backend runs them (ids[t], pos[t], seq[t] for t < n): each names an
 * open sequence; a sequence's tokens are together in the step, the first at the position where its
 * cache ends, the rest consecutive, each with a block reserved; ids in [0, vocab). */
int tllm_kv_check_step(struct tllm_kv *kv, int n, const int32_t *ids, const int32_t *pos, const int32_t *seq, int vocab);

/* From now on (on = 1) the blocks' contents are a device's: copies on write are logged, not made */
void tllm_kv_set_remote(struct tllm_kv *kv, int on);

/* Positions [p0, p1) of a sequence as float32 in a device's layout: kt [n_layers x kv_dim x (p1-p0)]
 * (keys transposed), v [n_layers x (p1-p0) x kv_dim]; and back (positions must be reserved). */
void tllm_kv_seq_read(const struct tllm_kv *kv, int seq, int p0, int p1, float *kt, float *v);
void tllm_kv_seq_write(struct tllm_kv *kv, int seq, int p0, int p1, const float *kt, const float *v);

#endif
