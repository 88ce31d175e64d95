/* BPE of one pre-tokenized piece. Like HF tokenizers: start from one symbol per byte, and
 * repeatedly apply the lowest-ranked merge among adjacent pairs (leftmost first on ties), using a
 * binary heap of candidate merges so a piece of n bytes costs O(n log n). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/tok_internal.h"

#define BPE_CACHE_MAX_PIECE 256 /* longer pieces are rare and not cached */
#define BPE_STACK_SYMBOLS 128   /* pieces up to this many bytes need no allocation */
#ifndef BPE_MAX_PIECE
/* Longer pieces (a "word" the split regex keeps whole, of over a MiB) are merged a MiB at a time, cut
 * at a character boundary, so one encode needs about 56 bytes of scratch per byte of at most this:
 * a 64 MiB word took 2.5 GB before. Hugging Face merges across the cuts; real text has no such words. */
#define BPE_MAX_PIECE (1u << 20)
#endif

struct symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t alive;
};

struct cand {
    int32_t rank, pos, merged;
    int32_t left_id, right_id; /* the pair when pushed: if either changed, the candidate is stale */
};

static int cand_less(const struct cand *a, const struct cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct cand *h, int *n, struct cand c) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, int *n) {
    struct cand top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        const struct cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) m = l, best = &h[l];
        if (r < *n && cand_less(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static const struct tllm_merge_entry *find_merge(const struct tllm_tok *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = tllm_hash_bytes(&key, 8) & (t->merge_cap - 1);
    while (t->merges[i].key != UINT64_MAX) {
        if (t->merges[i].key == key) return &t->merges[i];
        i = (i + 1) & (t->merge_cap - 1);
    }
    return NULL;
}

static void consider(const struct tllm_tok *t, const struct symbol *s, int pos, struct cand *h, int *n) {
    if (pos < 0 || s[pos].next < 0) return;
    const struct tllm_merge_entry *m = find_merge(t, s[pos].id, s[s[pos].next].id);
    if (m) heap_push(h, n, (struct cand){m->rank, pos, m->merged, s[pos].id, s[s[pos].next].id});
}

static int bpe_uncached(struct tllm_tok *t, const unsigned char *piece, size_t len, struct tllm_ids *out) {
    if (len > INT32_MAX / 4) return tllm_fail(TLLM_ERR_LIMIT, "a piece of %zu bytes is too long", len);
    struct symbol stack_sym[BPE_STACK_SYMBOLS];
    struct cand stack_heap[BPE_STACK_SYMBOLS * 2];
    struct symbol *s = stack_sym;
    struct cand *h = stack_heap;
    /* every merge adds at most 2 candidates, and there are fewer than len merges */
    size_t heap_cap = 2 * len + 1;
    if (len > BPE_STACK_SYMBOLS) {
        s = malloc(len * sizeof *s);
        h = malloc(heap_cap * sizeof *h);
        if (!s || !h) {
            free(s);
            free(h);
            return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        }
    }
    int n = (int)len, nh = 0;
    for (int i = 0; i < n; i++) s[i] = (struct symbol){t->byte_id[piece[i]], i - 1, i + 1 < n ? i + 1 : -1, 1};
    for (int i = 0; i + 1 < n; i++) consider(t, s, i, h, &nh);
    while (nh > 0) {
        struct cand c = heap_pop(h, &nh);
        struct symbol *L = &s[c.pos];
        if (!L->alive || L->id != c.left_id || L->next < 0 || s[L->next].id != c.right_id) continue;
        struct symbol *R = &s[L->next];
        L->id = c.merged;
        R->alive = 0;
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = c.pos;
        consider(t, s, L->prev, h, &nh);
        consider(t, s, c.pos, h, &nh);
    }
    int rc = TLLM_OK;
    for (int i = 0; i >= 0 && !rc; i = s[i].next) rc = tllm_ids_push(out, s[i].id);
    if (s != stack_sym) {
        free(s);
        free(h);
    }
    return rc;
}

int tllm_bpe_word(struct tllm_tok *t, const unsigned char *piece, size_t len, struct tllm_ids *out) {
    if (len == 0) return TLLM_OK;
    while (len > BPE_MAX_PIECE) {
        size_t cut = BPE_MAX_PIECE;
        while (cut > BPE_MAX_PIECE - 4 && (piece[cut] & 0xC0) == 0x80) cut--; /* not inside a character */
        int rc = tllm_bpe_word(t, piece, cut, out);
        if (rc) return rc;
        piece += cut, len -= cut;
    }
    if (len == 1) return tllm_ids_push(out, t->byte_id[piece[0]]);
    if (t->ignore_merges) { /* HF's option: a piece that is a whole token is not merged */
        int32_t whole = tllm_strmap_get(&t->vocab, (const char *)piece, len);
        if (whole >= 0) return tllm_ids_push(out, whole);
    }
    if (len > BPE_CACHE_MAX_PIECE) return bpe_uncached(t, piece, len, out);
    struct tllm_bpe_cache_entry *e = &t->cache[tllm_hash_bytes(piece, len) & (t->cache_cap - 1)];
    if (e->word && e->len == len && memcmp(e->word, piece, len) == 0)
        return tllm_ids_append(out, e->ids, (size_t)e->n_ids);
    size_t start = out->len;
    int rc = bpe_uncached(t, piece, len, out);
    if (rc) return rc;
    char *w = malloc(len);
    int32_t *ids = malloc((out->len - start) * sizeof *ids);
    if (!w || !ids) { /* caching is optional */
        free(w);
        free(ids);
        return TLLM_OK;
    }
    free(e->word);
    free(e->ids);
    memcpy(w, piece, len);
    memcpy(ids, out->data + start, (out->len - start) * sizeof *ids);
    *e = (struct tllm_bpe_cache_entry){w, len, ids, (int)(out->len - start)};
    return TLLM_OK;
}
