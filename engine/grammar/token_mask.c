/* Token masks under a grammar (token_mask.h). */
#define _GNU_SOURCE /* qsort_r */
#include "engine/grammar/token_mask.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include <stdio.h>

struct tllm_vocab_index {
    const struct tllm_tok *tok;
    int n;                        /* tokens indexed */
    int n_ids;                    /* mask width: ids below this */
    int max_len;
    int32_t *id;                  /* [n] in byte order */
    unsigned char *bytes;         /* every token's bytes, in that order, one after another: a walk reads
                                   * them as one stream, not 151k scattered allocations */
    uint32_t *off;                /* [n + 1] token i is bytes[off[i] .. off[i+1]) */
    uint32_t *lcp;                /* [n] bytes in common with the token before */
    int32_t *skip;                /* [n] the first token after i with fewer bytes in common than lcp[i] (n: none):
                                   * tokens i .. skip[i] - 1 all begin with token i's first lcp[i] bytes */
};

static int cmp_tokens(const void *a, const void *b, void *tok) {
    size_t la, lb;
    const char *x = tllm_tok_bytes(tok, *(const int32_t *)a, &la), *y = tllm_tok_bytes(tok, *(const int32_t *)b, &lb);
    int c = memcmp(x, y, la < lb ? la : lb);
    return c ? c : la < lb ? -1 : la > lb ? 1 : *(const int32_t *)a - *(const int32_t *)b;
}

/* id[0..n) in byte order (cmp_tokens'): a radix sort on each token's first 8 bytes (most tokens differ
 * there), then each run of equal leading bytes by comparison. qsort over the whole vocabulary took
 * 50-100 ms, most of a short batch's grammar work. */
static int sort_tokens(const struct tllm_tok *tok, int32_t *id, int n) {
    if (n < 2) return 0;
    uint64_t *key = malloc(2 * (size_t)n * sizeof *key);
    int32_t *tid = malloc((size_t)n * sizeof *tid);
    if (!key || !tid) {
        free(key), free(tid);
        return -1;
    }
    uint64_t *tkey = key + n;
    for (int i = 0; i < n; i++) {
        size_t len;
        const unsigned char *b = (const unsigned char *)tllm_tok_bytes(tok, id[i], &len);
        uint64_t k = 0;
        for (size_t j = 0; j < 8; j++) k = k << 8 | (j < len ? b[j] : 0);
        key[i] = k;
    }
    for (int shift = 0; shift < 64; shift += 8) { /* least significant byte first, each pass stable */
        size_t count[257] = {0};
        for (int i = 0; i < n; i++) count[(key[i] >> shift & 255) + 1]++;
        if (count[(key[0] >> shift & 255) + 1] == (size_t)n) continue; /* every key has this byte */
        for (int c = 0; c < 256; c++) count[c + 1] += count[c];
        for (int i = 0; i < n; i++) {
            size_t at = count[key[i] >> shift & 255]++;
            tkey[at] = key[i], tid[at] = id[i];
        }
        memcpy(key, tkey, (size_t)n * sizeof *key);
        memcpy(id, tid, (size_t)n * sizeof *id);
    }
    for (int i = 0, j; i < n; i = j) { /* ties: longer tokens, or a shorter one beside one with zero bytes */
        for (j = i + 1; j < n && key[j] == key[i]; j++) {}
        if (j - i > 1) qsort_r(id + i, (size_t)(j - i), sizeof *id, cmp_tokens, (void *)tok);
    }
    free(key), free(tid);
    return 0;
}

void tllm_vocab_index_free(struct tllm_vocab_index *v) {
    if (!v) return;
    free(v->id);
    free(v->bytes);
    free(v->off);
    free(v->lcp);
    free(v->skip);
    free(v);
}

int tllm_vocab_index_init(const struct tllm_tok *tok, int n_ids, struct tllm_vocab_index **out) {
    *out = NULL;
    double t0 = tllm_now();
    int nv = tllm_tok_n_vocab(tok);
    if (n_ids <= 0 || n_ids > nv) n_ids = nv;
    struct tllm_vocab_index *v = calloc(1, sizeof *v);
    if (!v) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    v->n_ids = n_ids, v->tok = tok;
    v->id = malloc((size_t)n_ids * sizeof *v->id);
    v->off = malloc(((size_t)n_ids + 1) * sizeof *v->off);
    v->lcp = malloc((size_t)n_ids * sizeof *v->lcp);
    v->skip = malloc((size_t)n_ids * sizeof *v->skip);
    size_t total = 0;
    for (int32_t i = 0; v->id && i < n_ids; i++) {
        size_t len;
        if (!tllm_tok_is_special(tok, i) && tllm_tok_bytes(tok, i, &len) && len > 0 && len < (1u << 16)) {
            v->id[v->n++] = i;
            total += len;
        }
    }
    v->bytes = malloc(total ? total : 1);
    if (!v->id || !v->off || !v->lcp || !v->skip || !v->bytes || total >= UINT32_MAX) {
        tllm_vocab_index_free(v);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    if (sort_tokens(tok, v->id, v->n)) {
        tllm_vocab_index_free(v);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    uint32_t at = 0;
    for (int i = 0; i < v->n; i++) {
        size_t len;
        const char *b = tllm_tok_bytes(tok, v->id[i], &len);
        v->off[i] = at;
        memcpy(v->bytes + at, b, len);
        at += (uint32_t)len;
        if ((int)len > v->max_len) v->max_len = (int)len;
        uint32_t l = 0;
        if (i) {
            const unsigned char *prev = v->bytes + v->off[i - 1], *cur = v->bytes + v->off[i];
            uint32_t plen = v->off[i] - v->off[i - 1];
            while (l < len && l < plen && cur[l] == prev[l]) l++;
        }
        v->lcp[i] = l;
    }
    v->off[v->n] = at;
    /* skip: the next smaller lcp, from the end, following the skips already made (amortized linear) */
    for (int i = v->n - 1; i >= 0; i--) {
        int j = i + 1;
        while (j < v->n && v->lcp[j] >= v->lcp[i]) j = v->skip[j];
        v->skip[i] = j;
    }
    *out = v;
    if (getenv("TLLM_GRAMMAR_STATS")) fprintf(stderr, "grammar index: %d tokens in byte order in %.1f ms\n", v->n, (tllm_now() - t0) * 1e3);
    return TLLM_OK;
}

/* A grammar state met, interned: its stacks, the states each byte leads to (found as the walks need
 * them: a lazily built automaton, so a token whose bytes were seen from here costs lookups, not
 * parsing), and its mask once a sequence has stood here */
struct dstate {
    uint32_t *w;
    int n_words, n_stacks;
    int32_t *next;     /* [n_classes] by the byte's class: NEXT_UNKNOWN, NEXT_DEAD or a state */
    int32_t *list;     /* its mask once made (else NULL): the ids allowed (list_allows) or refused, whichever
                        * are fewer, ascending */
    int n_list, list_allows;
    int32_t mask_at;   /* the state whose mask is this one's (tllm_gram_mask_key: deep in a counted string,
                        * one state stands for every count), or -1 not looked up yet */
};
#define NEXT_UNKNOWN (-2)
#define NEXT_DEAD (-1)

/* The automaton of one grammar over one vocabulary, shared by the sequences that follow it */
struct gdfa {
    const struct tllm_grammar *g;
    uint8_t cls[256];   /* each byte's class (tllm_gram_byte_classes) */
    int n_classes;
    const struct tllm_vocab_index *v;
    int32_t *eos;
    int n_eos;
    struct dstate *ds;
    int n_ds, cap_ds;
    int32_t *ht;        /* [ht_size] open addressing over ds by their words; -1 empty */
    int ht_size;
    int n_masks;
    size_t list_bytes;  /* of the n_masks lists */
    uint64_t *bits;     /* [ceil(n_ids / 64)] a walk's mask, before it becomes a state's list */
    int32_t *lv;        /* [max_len + 1] the walk's state per byte of depth */
    struct tllm_gram_state tmp;
    struct tllm_gmatch *users; /* the sequences on it (their states are re-interned when it starts over) */
    long computed, cached, restarts;
    double secs;
    struct gdfa **walkers; /* [n_walkers] automata of their own for walks on other threads (tllm_gmatch_prepare) */
    int n_walkers;
    int walker; /* this is one of them: no sequence is on it, its counts are its owner's */
};

struct tllm_gmatch {
    struct gdfa *d;
    int cur; /* where the text is */
    struct tllm_gmatch *next_user;
};

static uint64_t hash_words(const uint32_t *w, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) h = (h ^ w[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static void states_clear(struct gdfa *d) {
    for (int i = 0; i < d->n_ds; i++) free(d->ds[i].w), free(d->ds[i].list), free(d->ds[i].next);
    d->n_ds = d->n_masks = 0;
    d->list_bytes = 0;
    for (int i = 0; i < d->ht_size; i++) d->ht[i] = -1;
}

static void gdfa_free(struct gdfa *d) {
    if (!d) return;
    if (!d->walker && getenv("TLLM_GRAMMAR_STATS"))
        fprintf(stderr, "grammar: %ld masks computed in %.1f ms, %ld from the cache, %d states, %.1f MB of lists kept, %ld restarts\n",
                d->computed, d->secs * 1e3, d->cached, d->n_ds, d->list_bytes / 1e6, d->restarts);
    states_clear(d);
    for (int i = 0; i < d->n_walkers; i++) gdfa_free(d->walkers[i]);
    free(d->walkers);
    free(d->ds);
    free(d->ht);
    free(d->lv);
    free(d->bits);
    tllm_gram_state_free(&d->tmp);
    free(d->eos);
    free(d);
}

void tllm_gmatch_free(struct tllm_gmatch *m) {
    if (!m) return;
    struct gdfa *d = m->d;
    for (struct tllm_gmatch **pp = &d->users; *pp; pp = &(*pp)->next_user)
        if (*pp == m) {
            *pp = m->next_user;
            break;
        }
    if (!d->users) gdfa_free(d);
    free(m);
}

/* The id of the state with these stacks, added when new; -1 out of memory */
static int intern(struct gdfa *d, const struct tllm_gram_state *st) {
    if (d->n_ds * 2 >= d->ht_size) { /* grow the table (and rehash) before it is half full */
        int size = d->ht_size ? d->ht_size * 2 : 1024;
        int32_t *ht = malloc((size_t)size * sizeof *ht);
        if (!ht) return -1;
        for (int i = 0; i < size; i++) ht[i] = -1;
        for (int id = 0; id < d->n_ds; id++) {
            int k = (int)(hash_words(d->ds[id].w, d->ds[id].n_words) & (uint64_t)(size - 1));
            while (ht[k] >= 0) k = (k + 1) & (size - 1);
            ht[k] = id;
        }
        free(d->ht);
        d->ht = ht, d->ht_size = size;
    }
    int mask = d->ht_size - 1, slot = (int)(hash_words(st->w, st->n_words) & (uint64_t)mask);
    for (;; slot = (slot + 1) & mask) {
        int32_t id = d->ht[slot];
        if (id < 0) break;
        if (d->ds[id].n_words == st->n_words && !memcmp(d->ds[id].w, st->w, (size_t)st->n_words * sizeof *st->w)) return id;
    }
    if (d->n_ds == d->cap_ds) {
        int cap = d->cap_ds ? d->cap_ds * 2 : 64;
        struct dstate *ds = realloc(d->ds, (size_t)cap * sizeof *ds);
        if (!ds) return -1;
        d->ds = ds, d->cap_ds = cap;
    }
    struct dstate *x = &d->ds[d->n_ds];
    x->w = malloc((size_t)(st->n_words ? st->n_words : 1) * sizeof *x->w);
    x->next = malloc((size_t)d->n_classes * sizeof *x->next);
    if (!x->w || !x->next) {
        free(x->w), free(x->next);
        return -1;
    }
    if (st->n_words) memcpy(x->w, st->w, (size_t)st->n_words * sizeof *x->w);
    x->n_words = st->n_words, x->n_stacks = st->n_stacks, x->list = NULL, x->mask_at = -1;
    for (int c = 0; c < d->n_classes; c++) x->next[c] = NEXT_UNKNOWN;
    d->ht[slot] = d->n_ds;
    return d->n_ds++;
}

static struct tllm_gram_state view(const struct dstate *x) {
    return (struct tllm_gram_state){.w = x->w, .n_words = x->n_words, .cap = x->n_words, .n_stacks = x->n_stacks};
}

/* The state byte c leads to from state id: NEXT_DEAD when c cannot come; < NEXT_DEAD on an error */
static int32_t step(struct gdfa *d, int id, unsigned char c) {
    int32_t n = d->ds[id].next[d->cls[c]];
    if (n != NEXT_UNKNOWN) return n;
    struct tllm_gram_state from = view(&d->ds[id]);
    if (tllm_gram_advance(d->g, &from, c, &d->tmp)) return -3;
    n = NEXT_DEAD;
    if (d->tmp.n_stacks && (n = intern(d, &d->tmp)) < 0) return -3;
    d->ds[id].next[d->cls[c]] = n; /* ds may have moved; every byte of c's class goes where c goes */
    return n;
}

/* Too many states or masks kept (with `more` masks to come): start over from the states the sequences are at */
static int bound_states(struct gdfa *d, int more) {
    /* the masks to come taken as large as the average kept so far */
    size_t bytes = d->list_bytes + (d->n_masks ? d->list_bytes / (size_t)d->n_masks * (size_t)more : 0);
    if (d->n_ds < TLLM_GMATCH_STATES && d->n_masks + more < TLLM_GMATCH_CACHE && bytes < (size_t)TLLM_GMATCH_CACHE_BYTES)
        return TLLM_OK;
    d->restarts++;
    int n = 0, rc = TLLM_OK;
    for (struct tllm_gmatch *u = d->users; u; u = u->next_user) n++;
    struct tllm_gram_state *keep = calloc((size_t)n, sizeof *keep);
    if (!keep) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    int i = 0;
    for (struct tllm_gmatch *u = d->users; u; u = u->next_user, i++) {
        struct tllm_gram_state v = view(&d->ds[u->cur]);
        if (!rc) rc = tllm_gram_state_copy(&keep[i], &v);
    }
    if (!rc) {
        states_clear(d);
        i = 0;
        for (struct tllm_gmatch *u = d->users; u; u = u->next_user, i++)
            if ((u->cur = intern(d, &keep[i])) < 0) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    for (i = 0; i < n; i++) tllm_gram_state_free(&keep[i]);
    free(keep);
    return rc;
}

/* An automaton with no states yet; NULL out of memory */
static struct gdfa *gdfa_new(const struct tllm_grammar *g, const struct tllm_vocab_index *v, const int32_t *eos, int n_eos) {
    struct gdfa *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->g = g, d->v = v, d->n_eos = n_eos;
    d->n_classes = tllm_gram_byte_classes(g, d->cls);
    d->lv = malloc(((size_t)v->max_len + 1) * sizeof *d->lv);
    d->eos = malloc((size_t)(n_eos > 0 ? n_eos : 1) * sizeof *d->eos);
    if (!d->lv || !d->eos) {
        gdfa_free(d);
        return NULL;
    }
    if (n_eos > 0) memcpy(d->eos, eos, (size_t)n_eos * sizeof *eos);
    return d;
}

int tllm_gmatch_init(struct tllm_gmatch **out, const struct tllm_grammar *g, const struct tllm_vocab_index *v,
                     const int32_t *eos, int n_eos, struct tllm_gmatch *share) {
    *out = NULL;
    struct tllm_gmatch *m = calloc(1, sizeof *m);
    if (!m) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    struct gdfa *d = share && share->d->g == g && share->d->v == v && share->d->n_eos == n_eos &&
                             (!n_eos || !memcmp(share->d->eos, eos, (size_t)n_eos * sizeof *eos))
                         ? share->d
                         : NULL;
    int rc = TLLM_OK;
    if (!d && !(d = gdfa_new(g, v, eos, n_eos))) {
        free(m);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    m->d = d;
    m->next_user = d->users, d->users = m;
    struct tllm_gram_state st = {0};
    if (!rc) rc = tllm_gram_start(g, &st);
    if (!rc && (m->cur = intern(d, &st)) < 0) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    tllm_gram_state_free(&st);
    if (rc) {
        tllm_gmatch_free(m);
        return rc;
    }
    *out = m;
    return TLLM_OK;
}

/* The walk over the sorted vocabulary from state `from` */
static int compute(struct gdfa *d, int from, uint64_t *bits) {
    const struct tllm_vocab_index *v = d->v;
    int ok = 0;
    int32_t *lv = d->lv;
    const uint32_t *lcp = v->lcp, *off = v->off;
    const uint8_t *cls = d->cls;
    lv[0] = from;
    for (int i = 0; i < v->n; i++) {
        int k = (int)lcp[i];
        if (k > ok) continue; /* it begins with the bytes the token before was refused at */
        const unsigned char *b = v->bytes + off[i];
        int len = (int)(off[i + 1] - off[i]);
        int32_t at = lv[k];
        while (k < len) {
            int32_t n = d->ds[at].next[cls[b[k]]]; /* the transition as known; found the first time it is needed */
            if (n == NEXT_UNKNOWN && (n = step(d, at, b[k])) < NEXT_DEAD) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
            if (n == NEXT_DEAD) break;
            lv[++k] = at = n;
        }
        ok = k;
        if (k == len) {
            bits[v->id[i] >> 6] |= 1ull << (v->id[i] & 63);
        } else { /* refused at byte k: past every token that begins with the same k + 1 bytes */
            int j = i + 1;
            while (j < v->n && (int)lcp[j] > k) j = v->skip[j];
            i = j - 1;
        }
    }
    struct tllm_gram_state st = view(&d->ds[from]);
    if (tllm_gram_accepting(&st))
        for (int i = 0; i < d->n_eos; i++)
            if (d->eos[i] >= 0 && d->eos[i] < v->n_ids) bits[d->eos[i] >> 6] |= 1ull << (d->eos[i] & 63);
    return TLLM_OK;
}

/* A walk's bits as state at's mask: the shorter list (a word at a time; no bit at or past n_ids is set) */
static int keep_mask(struct gdfa *d, int at, const uint64_t *bits) {
    int n_ids = d->v->n_ids, n_words = (n_ids + 63) / 64, n_allowed = 0;
    for (int i = 0; i < n_words; i++) n_allowed += __builtin_popcountll(bits[i]);
    int allows = n_allowed <= n_ids / 2, n = allows ? n_allowed : n_ids - n_allowed, k = 0;
    int32_t *list = malloc((size_t)(n ? n : 1) * sizeof *list);
    if (!list) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_words; i++) {
        uint64_t w = allows ? bits[i] : ~bits[i];
        if (!allows && i == n_words - 1 && n_ids % 64) w &= (1ull << (n_ids % 64)) - 1; /* ids past the last are not refused */
        for (; w; w &= w - 1) list[k++] = 64 * i + __builtin_ctzll(w);
    }
    struct dstate *x = &d->ds[at];
    x->list = list, x->n_list = n, x->list_allows = allows;
    d->n_masks++;
    d->list_bytes += (size_t)(n ? n : 1) * sizeof *list;
    d->computed++;
    return TLLM_OK;
}

/* The state whose mask is state id's (itself, or its key: tllm_gram_mask_key); -1 out of memory */
static int mask_state(struct gdfa *d, int id) {
    if (d->ds[id].mask_at >= 0) return d->ds[id].mask_at;
    struct tllm_gram_state st = view(&d->ds[id]);
    int moved = tllm_gram_mask_key(d->g, &st, d->v->max_len, &d->tmp), at = id;
    if (moved < 0 || (moved && (at = intern(d, &d->tmp)) < 0)) return -1;
    d->ds[id].mask_at = at, d->ds[at].mask_at = at; /* a key is its own key */
    return at;
}

/* The mask of m's state, computed when no sequence has stood there (or at a state of the same key) yet */
static const struct dstate *lookup(struct tllm_gmatch *m) {
    struct gdfa *d = m->d;
    int at = d->ds[m->cur].mask_at;
    if (at >= 0 && d->ds[at].list) {
        d->cached++;
        return &d->ds[at];
    }
    if (bound_states(d, 0)) return NULL; /* (may number the states anew) */
    if ((at = mask_state(d, m->cur)) < 0) return tllm_fail(TLLM_ERR_NOMEM, "out of memory"), NULL;
    if (d->ds[at].list) {
        d->cached++;
        return &d->ds[at];
    }
    size_t words = ((size_t)d->v->n_ids + 63) / 64;
    if (!d->bits && !(d->bits = malloc(words * sizeof *d->bits))) return tllm_fail(TLLM_ERR_NOMEM, "out of memory"), NULL;
    memset(d->bits, 0, words * sizeof *d->bits);
    double t0 = tllm_now();
    if (compute(d, at, d->bits) || keep_mask(d, at, d->bits)) return NULL;
    d->secs += tllm_now() - t0;
    return &d->ds[at];
}

/* States a walker keeps (about 1 KB each) before it starts over: a server keeps the automata of its
 * last schemas, each with a walker a thread */
#ifndef TLLM_GMATCH_WALKER_STATES
#define TLLM_GMATCH_WALKER_STATES 1024
#endif

/* tllm_gmatch_prepare's walks: job j walks from state at[j] of automaton d[j] into bits[j] */
struct walks {
    struct gdfa **d;
    int32_t *at;
    uint64_t *bits;
    size_t words;
    int n, next, rc;
    pthread_mutex_t lock;
};

struct walk_thread {
    struct walks *w;
    int idx; /* its walker in each automaton */
    pthread_t t;
};

/* Jobs taken in turn: the state interned into the thread's own automaton, and walked there (the shared
 * ones are only read while the threads run) */
static void *walk_run(void *arg) {
    struct walk_thread *wt = arg;
    struct walks *w = wt->w;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        int j = w->rc ? w->n : w->next++;
        pthread_mutex_unlock(&w->lock);
        if (j >= w->n) return NULL;
        struct gdfa *d = w->d[j], *own = d->walkers[wt->idx];
        if (own->n_ds >= TLLM_GMATCH_WALKER_STATES) states_clear(own);
        struct tllm_gram_state st = view(&d->ds[w->at[j]]);
        int from = intern(own, &st), rc = from < 0 ? TLLM_ERR_NOMEM : compute(own, from, w->bits + (size_t)j * w->words);
        if (rc) {
            pthread_mutex_lock(&w->lock);
            w->rc = rc;
            pthread_mutex_unlock(&w->lock);
        }
    }
}

int tllm_gmatch_prepare(struct tllm_gmatch *const *ms, int n, int n_threads, int *walked) {
    *walked = 0;
    int fresh = 0; /* rows whose state has no mask yet, as far as is known without interning a key */
    for (int i = 0; i < n && fresh < 2; i++) {
        const struct gdfa *d = ms[i]->d;
        int at = d->ds[ms[i]->cur].mask_at;
        fresh += at < 0 || !d->ds[at].list;
    }
    if (fresh < 2 || n_threads < 2) return TLLM_OK; /* (the lookups walk one, as before) */
    struct walks w = {.d = malloc((size_t)n * sizeof *w.d), .at = malloc((size_t)n * sizeof *w.at)};
    int rc = w.d && w.at ? TLLM_OK : tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    /* each automaton first makes room for the masks to come (so none is dropped before it is used) */
    for (int i = 0; i < n && !rc; i++) {
        struct gdfa *d = ms[i]->d;
        int first = 1, more = 0;
        for (int k = 0; k < i && first; k++) first = ms[k]->d != d;
        if (!first) continue;
        for (int k = i; k < n; k++) {
            int at = ms[k]->d == d ? d->ds[ms[k]->cur].mask_at : 0;
            more += ms[k]->d == d && (at < 0 || !d->ds[at].list);
        }
        rc = bound_states(d, more);
    }
    for (int i = 0; i < n && !rc; i++) { /* the distinct states with no mask yet */
        struct gdfa *d = ms[i]->d;
        int at = mask_state(d, ms[i]->cur), k = 0;
        if (at < 0) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        if (rc || d->ds[at].list) continue;
        while (k < w.n && (w.d[k] != d || w.at[k] != at)) k++;
        if (k == w.n) w.d[w.n] = d, w.at[w.n++] = at;
    }
    int nt = n_threads < w.n ? n_threads : w.n;
    for (int j = 0; j < w.n && !rc; j++) { /* each automaton's walkers, one a thread */
        struct gdfa *d = w.d[j];
        if (d->n_walkers >= nt) continue;
        struct gdfa **a = realloc(d->walkers, (size_t)nt * sizeof *a);
        if (!a) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        else d->walkers = a;
        while (!rc && d->n_walkers < nt) {
            struct gdfa *own = gdfa_new(d->g, d->v, d->eos, d->n_eos);
            if (!own) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
            else own->walker = 1, d->walkers[d->n_walkers++] = own;
        }
    }
    w.words = ((size_t)ms[0]->d->v->n_ids + 63) / 64;
    if (!rc && nt >= 2) {
        double t0 = tllm_now();
        w.bits = calloc((size_t)w.n * w.words, sizeof *w.bits);
        struct walk_thread *th = calloc((size_t)nt, sizeof *th);
        if (!w.bits || !th || pthread_mutex_init(&w.lock, NULL)) {
            rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        } else {
            int started = 0;
            for (; started < nt; started++) {
                th[started] = (struct walk_thread){&w, started, 0};
                if (started && pthread_create(&th[started].t, NULL, walk_run, &th[started])) break;
            }
            walk_run(&th[0]); /* this thread is walker 0 (and walks alone when no thread could start) */
            for (int i = 1; i < started; i++) pthread_join(th[i].t, NULL);
            pthread_mutex_destroy(&w.lock);
            rc = w.rc ? tllm_fail(TLLM_ERR_NOMEM, "out of memory") : TLLM_OK;
            for (int j = 0; j < w.n && !rc; j++) rc = keep_mask(w.d[j], w.at[j], w.bits + (size_t)j * w.words);
            if (!rc) *walked = w.n;
            double secs = (tllm_now() - t0) / (w.n ? w.n : 1); /* the wall time, shared out */
            for (int j = 0; j < w.n; j++) w.d[j]->secs += secs;
        }
        free(th);
        free(w.bits);
    }
    free(w.d);
    free(w.at);
    return rc;
}

const int32_t *tllm_gmatch_list(struct tllm_gmatch *m, int *n, int *allows) {
    const struct dstate *x = lookup(m);
    if (!x) return NULL;
    *n = x->n_list, *allows = x->list_allows;
    return x->list;
}

int tllm_gmatch_mask(struct tllm_gmatch *m, float *logits, int n) {
    int k, allows;
    const int32_t *list = tllm_gmatch_list(m, &k, &allows);
    if (!list) return -1;
    int allowed = 0, n_ids = m->d->v->n_ids, j = 0;
    for (int i = 0; i < n; i++) { /* list is ascending: walk it beside the ids */
        int listed = j < k && list[j] == i;
        j += listed;
        if (i < n_ids && listed == allows) allowed++;
        else logits[i] = -INFINITY;
    }
    return allowed;
}

int tllm_gmatch_accept(struct tllm_gmatch *m, int32_t id) {
    struct gdfa *d = m->d;
    for (int i = 0; i < d->n_eos; i++)
        if (id == d->eos[i]) return TLLM_OK;
    size_t len;
    const unsigned char *b = (const unsigned char *)tllm_tok_bytes(d->v->tok, id, &len);
    if (!b || !len || tllm_tok_is_special(d->v->tok, id) || id >= d->v->n_ids)
        return tllm_fail(TLLM_ERR_ARG, "token %d cannot come here under the grammar", id);
    int at = m->cur;
    for (size_t k = 0; k < len; k++) { /* cur moves only once the whole token is through */
        int32_t n = step(d, at, b[k]);
        if (n < NEXT_DEAD) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        if (n == NEXT_DEAD) return tllm_fail(TLLM_ERR_ARG, "token %d cannot come here under the grammar", id);
        at = n;
    }
    m->cur = at;
    return TLLM_OK;
}

int32_t tllm_gmatch_eos(const struct tllm_gmatch *m) { return m->d->n_eos > 0 ? m->d->eos[0] : -1; }

const struct tllm_grammar *tllm_gmatch_grammar(const struct tllm_gmatch *m) { return m->d->g; }

int tllm_gmatch_shares(const struct tllm_gmatch *a, const struct tllm_gmatch *b) { return a->d == b->d; }

void tllm_gmatch_counts(const struct tllm_gmatch *m, long *computed, long *cached) {
    *computed = m->d->computed;
    *cached = m->d->cached;
}
