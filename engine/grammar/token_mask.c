/* Token masks under a grammar (token_mask.h). */
#include "engine/grammar/token_mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/error.h"

struct tllm_vocab_index {
    const struct tllm_tok *tok;
    int n;                        /* tokens indexed */
    int n_ids;                    /* mask width: ids below this */
    int max_len;
    int32_t *id;                  /* [n] in byte order */
    const unsigned char **bytes;  /* [n] */
    uint32_t *len;                /* [n] */
    uint32_t *lcp;                /* [n] bytes in common with the token before */
};

static const struct tllm_tok *sort_tok;

static int cmp_tokens(const void *a, const void *b) {
    size_t la, lb;
    const char *x = tllm_tok_bytes(sort_tok, *(const int32_t *)a, &la), *y = tllm_tok_bytes(sort_tok, *(const int32_t *)b, &lb);
    int c = memcmp(x, y, la < lb ? la : lb);
    return c ? c : la < lb ? -1 : la > lb ? 1 : *(const int32_t *)a - *(const int32_t *)b;
}

void tllm_vocab_index_free(struct tllm_vocab_index *v) {
    if (!v) return;
    free(v->id);
    free(v->bytes);
    free(v->len);
    free(v->lcp);
    free(v);
}

int tllm_vocab_index_init(const struct tllm_tok *tok, int n_ids, struct tllm_vocab_index **out) {
    *out = NULL;
    int nv = tllm_tok_n_vocab(tok);
    if (n_ids <= 0 || n_ids > nv) n_ids = nv;
    struct tllm_vocab_index *v = calloc(1, sizeof *v);
    if (!v) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    v->n_ids = n_ids, v->tok = tok;
    v->id = malloc((size_t)n_ids * sizeof *v->id);
    v->bytes = malloc((size_t)n_ids * sizeof *v->bytes);
    v->len = malloc((size_t)n_ids * sizeof *v->len);
    v->lcp = malloc((size_t)n_ids * sizeof *v->lcp);
    if (!v->id || !v->bytes || !v->len || !v->lcp) {
        tllm_vocab_index_free(v);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < n_ids; i++) {
        size_t len;
        if (!tllm_tok_is_special(tok, i) && tllm_tok_bytes(tok, i, &len) && len > 0) v->id[v->n++] = i;
    }
    sort_tok = tok; /* qsort has no context argument; loading is not concurrent with itself here */
    qsort(v->id, (size_t)v->n, sizeof *v->id, cmp_tokens);
    for (int i = 0; i < v->n; i++) {
        size_t len;
        v->bytes[i] = (const unsigned char *)tllm_tok_bytes(tok, v->id[i], &len);
        v->len[i] = (uint32_t)len;
        if ((int)len > v->max_len) v->max_len = (int)len;
        uint32_t l = 0;
        if (i)
            while (l < v->len[i] && l < v->len[i - 1] && v->bytes[i][l] == v->bytes[i - 1][l]) l++;
        v->lcp[i] = l;
    }
    *out = v;
    return TLLM_OK;
}

struct centry {
    uint64_t hash;
    uint32_t *key; /* the state's words */
    int key_n;
    uint64_t *bits;
};

struct tllm_gmatch {
    const struct tllm_grammar *g;
    const struct tllm_vocab_index *v;
    int32_t *eos;
    int n_eos;
    struct tllm_gram_state st;
    struct tllm_gram_state *lv;     /* [max_len + 1] a state per byte of depth, for the walk */
    struct centry cache[TLLM_GMATCH_CACHE];
    int n_cache;
    const uint64_t *cur;            /* the mask of st, once looked up */
    long computed, cached;
};

void tllm_gmatch_free(struct tllm_gmatch *m) {
    if (!m) return;
    for (int i = 0; i < m->n_cache; i++) free(m->cache[i].key), free(m->cache[i].bits);
    for (int i = 0; m->lv && i <= m->v->max_len; i++) tllm_gram_state_free(&m->lv[i]);
    free(m->lv);
    tllm_gram_state_free(&m->st);
    free(m->eos);
    free(m);
}

int tllm_gmatch_init(struct tllm_gmatch **out, const struct tllm_grammar *g, const struct tllm_vocab_index *v,
                     const int32_t *eos, int n_eos) {
    *out = NULL;
    struct tllm_gmatch *m = calloc(1, sizeof *m);
    if (!m) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    m->g = g, m->v = v, m->n_eos = n_eos;
    m->lv = calloc((size_t)v->max_len + 1, sizeof *m->lv);
    m->eos = malloc((size_t)(n_eos > 0 ? n_eos : 1) * sizeof *m->eos);
    if (!m->lv || !m->eos) {
        tllm_gmatch_free(m);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    if (n_eos > 0) memcpy(m->eos, eos, (size_t)n_eos * sizeof *eos);
    int rc = tllm_gram_start(g, &m->st);
    if (rc) {
        tllm_gmatch_free(m);
        return rc;
    }
    *out = m;
    return TLLM_OK;
}

static uint64_t hash_words(const uint32_t *w, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) h = (h ^ w[i]) * 0x100000001b3ull;
    return h;
}

/* The walk over the sorted vocabulary from state st */
static int compute(struct tllm_gmatch *m, uint64_t *bits) {
    const struct tllm_vocab_index *v = m->v;
    int ok = 0;
    for (int i = 0; i < v->n; i++) {
        int k = (int)v->lcp[i];
        if (k > ok) continue; /* it begins with the bytes the token before was refused at */
        int len = (int)v->len[i];
        while (k < len) {
            const struct tllm_gram_state *from = k ? &m->lv[k] : &m->st;
            int rc = tllm_gram_advance(m->g, from, v->bytes[i][k], &m->lv[k + 1]);
            if (rc) return rc;
            if (!m->lv[k + 1].n_stacks) break;
            k++;
        }
        ok = k;
        if (k == len) bits[v->id[i] >> 6] |= 1ull << (v->id[i] & 63);
    }
    if (tllm_gram_accepting(&m->st))
        for (int i = 0; i < m->n_eos; i++)
            if (m->eos[i] >= 0 && m->eos[i] < v->n_ids) bits[m->eos[i] >> 6] |= 1ull << (m->eos[i] & 63);
    return TLLM_OK;
}

static int lookup(struct tllm_gmatch *m) {
    if (m->cur) return TLLM_OK;
    uint64_t h = hash_words(m->st.w, m->st.n_words);
    for (int i = 0; i < m->n_cache; i++) {
        struct centry *e = &m->cache[i];
        if (e->hash == h && e->key_n == m->st.n_words && !memcmp(e->key, m->st.w, (size_t)e->key_n * sizeof *e->key)) {
            m->cur = e->bits;
            m->cached++;
            return TLLM_OK;
        }
    }
    if (m->n_cache == TLLM_GMATCH_CACHE) { /* full: start over */
        for (int i = 0; i < m->n_cache; i++) free(m->cache[i].key), free(m->cache[i].bits);
        m->n_cache = 0;
    }
    size_t words = ((size_t)m->v->n_ids + 63) / 64;
    struct centry e = {h, malloc((size_t)(m->st.n_words ? m->st.n_words : 1) * sizeof *e.key), m->st.n_words,
                       calloc(words, sizeof *e.bits)};
    if (!e.key || !e.bits) {
        free(e.key), free(e.bits);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    if (m->st.n_words) memcpy(e.key, m->st.w, (size_t)m->st.n_words * sizeof *e.key);
    int rc = compute(m, e.bits);
    if (rc) {
        free(e.key), free(e.bits);
        return rc;
    }
    m->cache[m->n_cache++] = e;
    m->cur = e.bits;
    m->computed++;
    return TLLM_OK;
}

int tllm_gmatch_mask(struct tllm_gmatch *m, float *logits, int n) {
    int rc = lookup(m);
    if (rc) return rc < 0 ? rc : -rc;
    int allowed = 0;
    for (int i = 0; i < n; i++) {
        if (i < m->v->n_ids && m->cur[i >> 6] >> (i & 63) & 1) allowed++;
        else logits[i] = -INFINITY;
    }
    return allowed;
}

int tllm_gmatch_allows(struct tllm_gmatch *m, int32_t id) {
    if (lookup(m) || id < 0 || id >= m->v->n_ids) return 0;
    return (int)(m->cur[id >> 6] >> (id & 63) & 1);
}

int tllm_gmatch_accept(struct tllm_gmatch *m, int32_t id) {
    for (int i = 0; i < m->n_eos; i++)
        if (id == m->eos[i]) return TLLM_OK;
    size_t len;
    const unsigned char *b = (const unsigned char *)tllm_tok_bytes(m->v->tok, id, &len);
    if (!b || tllm_tok_is_special(m->v->tok, id) || !len) return tllm_fail(TLLM_ERR_ARG, "token %d cannot come here under the grammar", id);
    if (id >= m->v->n_ids || (int)len > m->v->max_len) return tllm_fail(TLLM_ERR_ARG, "token %d cannot come here under the grammar", id);
    const struct tllm_gram_state *from = &m->st;
    for (size_t k = 0; k < len; k++) { /* through the walk's buffers: st stays as it was if the token is refused */
        int rc = tllm_gram_advance(m->g, from, b[k], &m->lv[k + 1]);
        if (rc) return rc;
        if (!m->lv[k + 1].n_stacks) return tllm_fail(TLLM_ERR_ARG, "token %d cannot come here under the grammar", id);
        from = &m->lv[k + 1];
    }
    if (tllm_gram_state_copy(&m->st, from)) return TLLM_ERR_NOMEM;
    m->cur = NULL;
    return TLLM_OK;
}

int32_t tllm_gmatch_eos(const struct tllm_gmatch *m) { return m->n_eos > 0 ? m->eos[0] : -1; }

void tllm_gmatch_counts(const struct tllm_gmatch *m, long *computed, long *cached) {
    *computed = m->computed;
    *cached = m->cached;
}
