/* The paged, shared KV cache (kv_cache.h): block allocation, reference counts, the prefix index. */
#include "engine/run/kv_cache.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/error.h"

/* Large and mostly never touched: mapped, so that pages cost memory only once written. */
static void *map_zero(size_t bytes) {
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int tllm_kv_type_parse(const char *name, enum tllm_dtype *out) {
    if (!strcmp(name, "f16")) *out = TLLM_DT_F16;
    else if (!strcmp(name, "f32")) *out = TLLM_DT_F32;
    else return tllm_fail(TLLM_ERR_ARG, "KV cache type '%s': f16 or f32", name);
    return TLLM_OK;
}

int tllm_kv_init(struct tllm_kv **out, int n_layers, int n_kv_heads, int head_dim, int n_tokens,
                 enum tllm_dtype dtype, int max_seqs) {
    *out = NULL;
    if (dtype != TLLM_DT_F16 && dtype != TLLM_DT_F32) return tllm_fail(TLLM_ERR_ARG, "KV cache type must be f16 or f32");
    if (n_tokens < 1 || max_seqs < 1) return tllm_fail(TLLM_ERR_ARG, "KV cache of %d positions for %d sequences", n_tokens, max_seqs);
    struct tllm_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    kv->n_layers = n_layers, kv->n_kv_heads = n_kv_heads, kv->head_dim = head_dim;
    kv->dtype = dtype;
    kv->esize = dtype == TLLM_DT_F16 ? 2 : 4;
    kv->n_blocks = tllm_kv_blocks_for(n_tokens);
    kv->block_elems = (size_t)n_kv_heads * head_dim * TLLM_KV_BLOCK;
    size_t bytes = (size_t)n_layers * kv->n_blocks * kv->block_elems * kv->esize;
    kv->k = map_zero(bytes);
    kv->v = map_zero(bytes);
    kv->meta = calloc((size_t)kv->n_blocks, sizeof *kv->meta);
    kv->free_stack = malloc((size_t)kv->n_blocks * sizeof *kv->free_stack);
    for (kv->n_buckets = 64; kv->n_buckets < kv->n_blocks; kv->n_buckets *= 2) {}
    kv->buckets = malloc((size_t)kv->n_buckets * sizeof *kv->buckets);
    kv->seqs = calloc((size_t)max_seqs, sizeof *kv->seqs);
    kv->max_seqs = max_seqs;
    if (!kv->k || !kv->v || !kv->meta || !kv->free_stack || !kv->buckets || !kv->seqs) {
        tllm_kv_free(kv);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory for a KV cache of %d positions (%zu MiB)", n_tokens,
                         2 * bytes >> 20);
    }
    for (int b = 0; b < kv->n_blocks; b++) kv->free_stack[b] = kv->n_blocks - 1 - b; /* block 0 first */
    kv->n_free_clean = kv->n_blocks;
    kv->lru_head = kv->lru_tail = -1;
    for (int i = 0; i < kv->n_buckets; i++) kv->buckets[i] = -1;
    *out = kv;
    return TLLM_OK;
}

void tllm_kv_free(struct tllm_kv *kv) {
    if (!kv) return;
    size_t bytes = (size_t)kv->n_layers * kv->n_blocks * kv->block_elems * kv->esize;
    if (kv->k) munmap(kv->k, bytes ? bytes : 1);
    if (kv->v) munmap(kv->v, bytes ? bytes : 1);
    for (int s = 0; kv->seqs && s < kv->max_seqs; s++) {
        free(kv->seqs[s].blocks);
        free(kv->seqs[s].tokens);
    }
    free(kv->seqs);
    free(kv->copies);
    free(kv->meta);
    free(kv->free_stack);
    free(kv->buckets);
    free(kv);
}

int tllm_kv_n_free(const struct tllm_kv *kv) { return kv->n_free_clean + kv->n_free_cached; }

static uint32_t block_hash(int parent, uint32_t parent_gen, const int32_t *tokens) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uint32_t)parent ^ ((uint64_t)parent_gen << 32);
    for (int i = 0; i < TLLM_KV_BLOCK; i++) h = (h ^ (uint32_t)tokens[i]) * 1099511628211ull;
    return (uint32_t)(h ^ (h >> 29));
}

static void lru_unlink(struct tllm_kv *kv, int b) {
    struct tllm_kv_block *m = &kv->meta[b];
    if (m->lru_prev >= 0) kv->meta[m->lru_prev].lru_next = m->lru_next;
    else kv->lru_head = m->lru_next;
    if (m->lru_next >= 0) kv->meta[m->lru_next].lru_prev = m->lru_prev;
    else kv->lru_tail = m->lru_prev;
    kv->n_free_cached--;
}

static void unhash(struct tllm_kv *kv, int b) {
    struct tllm_kv_block *m = &kv->meta[b];
    int *p = &kv->buckets[block_hash(m->parent, m->parent_gen, m->tokens) & (uint32_t)(kv->n_buckets - 1)];
    while (*p != b) p = &kv->meta[*p].hash_next;
    *p = m->hash_next;
    m->hashed = 0;
}

static int find_block(const struct tllm_kv *kv, int parent, uint32_t parent_gen, const int32_t *tokens) {
    int b = kv->buckets[block_hash(parent, parent_gen, tokens) & (uint32_t)(kv->n_buckets - 1)];
    for (; b >= 0; b = kv->meta[b].hash_next) {
        const struct tllm_kv_block *m = &kv->meta[b];
        if (m->parent == parent && m->parent_gen == parent_gen && !memcmp(m->tokens, tokens, sizeof m->tokens)) return b;
    }
    return -1;
}

/* A block for one holder: a clean one, else the cached one released longest ago (forgotten now). */
static int alloc_block(struct tllm_kv *kv) {
    int b;
    if (kv->n_free_clean) b = kv->free_stack[--kv->n_free_clean];
    else if (kv->lru_head >= 0) {
        b = kv->lru_head;
        lru_unlink(kv, b);
        unhash(kv, b);
    } else
        return -1;
    struct tllm_kv_block *m = &kv->meta[b];
    m->ref = 1;
    m->gen++;
    m->parent = -1;
    return b;
}

static void release_block(struct tllm_kv *kv, int b) {
    struct tllm_kv_block *m = &kv->meta[b];
    if (--m->ref > 0) return;
    if (!m->hashed) {
        kv->free_stack[kv->n_free_clean++] = b;
        return;
    }
    m->lru_next = -1, m->lru_prev = kv->lru_tail; /* findable until its memory is needed */
    if (kv->lru_tail >= 0) kv->meta[kv->lru_tail].lru_next = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_free_cached++;
}

static void hold_block(struct tllm_kv *kv, int b) {
    if (kv->meta[b].ref++ == 0) lru_unlink(kv, b); /* a cached block held again */
}

int tllm_kv_seq_open(struct tllm_kv *kv, int *seq) {
    for (int s = 0; s < kv->max_seqs; s++)
        if (!kv->seqs[s].open) {
            kv->seqs[s].open = 1;
            kv->seqs[s].n_blocks = kv->seqs[s].n_tokens = 0;
            *seq = s;
            return TLLM_OK;
        }
    return tllm_fail(TLLM_ERR_LIMIT, "the KV cache holds %d sequences already", kv->max_seqs);
}

void tllm_kv_seq_truncate(struct tllm_kv *kv, int seq, int n) {
    struct tllm_kv_seq *s = &kv->seqs[seq];
    if (n < 0) n = 0;
    if (n < s->n_tokens) s->n_tokens = n;
    int keep = tllm_kv_blocks_for(n);
    while (s->n_blocks > keep) release_block(kv, s->blocks[--s->n_blocks]);
}

void tllm_kv_seq_close(struct tllm_kv *kv, int seq) {
    tllm_kv_seq_truncate(kv, seq, 0);
    kv->seqs[seq].open = 0;
}

int tllm_kv_check_step(struct tllm_kv *kv, int n, const int32_t *ids, const int32_t *pos, const int32_t *seq, int vocab) {
    if (++kv->step_stamp == 0) { /* wrapped: no sequence may keep a mark equal to a future stamp */
        for (int s = 0; s < kv->max_seqs; s++) kv->seqs[s].step_mark = 0;
        kv->step_stamp = 1;
    }
    for (int t = 0; t < n; t++) {
        int sq = seq[t];
        if (sq < 0 || sq >= kv->max_seqs || !kv->seqs[sq].open)
            return tllm_fail(TLLM_ERR_ARG, "token %d of the step names sequence %d, which is not open in the KV cache", t, sq);
        struct tllm_kv_seq *s = &kv->seqs[sq];
        if (t > 0 && seq[t - 1] == sq) {
            if (pos[t] != pos[t - 1] + 1)
                return tllm_fail(TLLM_ERR_ARG, "sequence %d: position %d does not follow %d in the step", sq, pos[t], pos[t - 1]);
        } else {
            if (s->step_mark == kv->step_stamp)
                return tllm_fail(TLLM_ERR_ARG, "sequence %d: its tokens are not together in the step", sq);
            s->step_mark = kv->step_stamp;
            if (pos[t] != s->n_tokens)
                return tllm_fail(TLLM_ERR_ARG, "sequence %d: a step at position %d does not follow its cache (%d positions)", sq,
                                 pos[t], s->n_tokens);
        }
        if (pos[t] >= s->n_blocks * TLLM_KV_BLOCK)
            return tllm_fail(TLLM_ERR_LIMIT, "sequence %d: position %d has no KV block reserved", sq, pos[t]);
        if (ids[t] < 0 || ids[t] >= vocab) return tllm_fail(TLLM_ERR_ARG, "token id %d is out of range [0, %d)", ids[t], vocab);
    }
    return TLLM_OK;
}

static int grow(int32_t **p, int *cap, int need) {
    if (need <= *cap) return TLLM_OK;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    int32_t *np = realloc(*p, (size_t)c * sizeof *np);
    if (!np) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    *p = np, *cap = c;
    return TLLM_OK;
}

int tllm_kv_seq_reuse(struct tllm_kv *kv, int seq, const int32_t *ids, int n) {
    struct tllm_kv_seq *s = &kv->seqs[seq];
    int max_blocks = (n - 1) / TLLM_KV_BLOCK, i = s->n_tokens / TLLM_KV_BLOCK;
    if (s->n_tokens % TLLM_KV_BLOCK || i >= max_blocks || grow(&s->blocks, &s->cap_blocks, max_blocks) ||
        grow(&s->tokens, &s->cap_tokens, max_blocks * TLLM_KV_BLOCK))
        return s->n_tokens; /* nothing (more) reused: the rest is computed */
    int parent = i ? s->blocks[i - 1] : -1, start = s->n_tokens;
    uint32_t parent_gen = i ? kv->meta[parent].gen : 0;
    for (; i < max_blocks; i++) {
        int b = find_block(kv, parent, parent_gen, ids + (size_t)i * TLLM_KV_BLOCK);
        if (b < 0) break;
        hold_block(kv, b);
        if (i < s->n_blocks) release_block(kv, s->blocks[i]); /* reserved and never written */
        else s->n_blocks++;
        s->blocks[i] = b;
        parent = b, parent_gen = kv->meta[b].gen;
    }
    s->n_tokens = i * TLLM_KV_BLOCK;
    memcpy(s->tokens + start, ids + start, (size_t)(s->n_tokens - start) * sizeof *ids);
    return s->n_tokens;
}

int tllm_kv_seq_blocks_needed(const struct tllm_kv *kv, int seq, int n) {
    const struct tllm_kv_seq *s = &kv->seqs[seq];
    int need = tllm_kv_blocks_for(n) - s->n_blocks;
    if (s->n_tokens % TLLM_KV_BLOCK && s->n_tokens < n) { /* the partly written block, if shared, is copied */
        const struct tllm_kv_block *m = &kv->meta[s->blocks[s->n_tokens / TLLM_KV_BLOCK]];
        if (m->ref > 1) need++;
    }
    return need > 0 ? need : 0;
}

int tllm_kv_seq_reserve(struct tllm_kv *kv, int seq, int n) {
    struct tllm_kv_seq *s = &kv->seqs[seq];
    int need = tllm_kv_seq_blocks_needed(kv, seq, n);
    if (need > tllm_kv_n_free(kv))
        return tllm_fail(TLLM_ERR_LIMIT, "the KV cache is full: %d more blocks of %d positions wanted, %d free",
                         need, TLLM_KV_BLOCK, tllm_kv_n_free(kv));
    int rc = grow(&s->blocks, &s->cap_blocks, tllm_kv_blocks_for(n));
    if (rc) return rc;
    if (s->n_tokens % TLLM_KV_BLOCK && s->n_tokens < n) { /* the next write lands in a kept block */
        int i = s->n_tokens / TLLM_KV_BLOCK, old = s->blocks[i];
        struct tllm_kv_block *m = &kv->meta[old];
        if (m->ref > 1) { /* shared: copy on write */
            if (kv->remote && (rc = grow(&kv->copies, &kv->cap_copies, 2 * kv->n_copies + 2))) return rc;
            int b = alloc_block(kv);
            if (kv->remote) kv->copies[2 * kv->n_copies] = old, kv->copies[2 * kv->n_copies + 1] = b, kv->n_copies++;
            for (int l = 0; l < kv->n_layers && !kv->remote; l++) {
                memcpy(tllm_kv_k(kv, l, b), tllm_kv_k(kv, l, old), kv->block_elems * kv->esize);
                memcpy(tllm_kv_v(kv, l, b), tllm_kv_v(kv, l, old), kv->block_elems * kv->esize);
            }
            release_block(kv, old);
            s->blocks[i] = b;
        } else if (m->hashed) /* ours alone, but findable as the full block it no longer is */
            unhash(kv, old);
    }
    while (s->n_blocks < tllm_kv_blocks_for(n)) s->blocks[s->n_blocks++] = alloc_block(kv);
    return TLLM_OK;
}

int tllm_kv_seq_commit(struct tllm_kv *kv, int seq, const int32_t *ids, int n) {
    struct tllm_kv_seq *s = &kv->seqs[seq];
    int rc = grow(&s->tokens, &s->cap_tokens, s->n_tokens + n);
    if (rc) return rc;
    for (int i = 0; i < n; i++) s->tokens[s->n_tokens + i] = ids ? ids[i] : -1;
    int first = s->n_tokens / TLLM_KV_BLOCK;
    s->n_tokens += n;
    for (int i = first; i < s->n_tokens / TLLM_KV_BLOCK; i++) { /* blocks filled by this commit */
        int b = s->blocks[i];
        struct tllm_kv_block *m = &kv->meta[b];
        const int32_t *t = s->tokens + (size_t)i * TLLM_KV_BLOCK;
        int unknown = 0;
        for (int j = 0; j < TLLM_KV_BLOCK; j++) unknown |= t[j] < 0;
        if (m->hashed || unknown) continue; /* already findable, or written without its ids */
        int parent = i ? s->blocks[i - 1] : -1;
        uint32_t parent_gen = i ? kv->meta[parent].gen : 0;
        if (find_block(kv, parent, parent_gen, t) >= 0) continue; /* computed twice at once: one is findable */
        m->parent = parent, m->parent_gen = parent_gen;
        memcpy(m->tokens, t, sizeof m->tokens);
        uint32_t h = block_hash(parent, parent_gen, t) & (uint32_t)(kv->n_buckets - 1);
        m->hash_next = kv->buckets[h];
        kv->buckets[h] = b;
        m->hashed = 1;
    }
    return TLLM_OK;
}

static float get(const struct tllm_kv *kv, const void *base, size_t i) {
    return kv->dtype == TLLM_DT_F16 ? tllm_f16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static void put(const struct tllm_kv *kv, void *base, size_t i, float x) {
    if (kv->dtype == TLLM_DT_F16) ((uint16_t *)base)[i] = tllm_f32_to_f16(x);
    else ((float *)base)[i] = x;
}

/* Copies positions [p0, p1) between the blocks and a device's float32 layout (kv_cache.h). */
static void seq_copy(struct tllm_kv *kv, int seq, int p0, int p1, float *kt, float *v, int to_blocks) {
    const struct tllm_kv_seq *s = &kv->seqs[seq];
    const int hd = kv->head_dim, kv_dim = kv->n_kv_heads * hd, n = p1 - p0;
    for (int l = 0; l < kv->n_layers; l++)
        for (int p = p0; p < p1; p++) {
            int b = s->blocks[p / TLLM_KV_BLOCK], o = p % TLLM_KV_BLOCK;
            void *kb = tllm_kv_k(kv, l, b), *vb = tllm_kv_v(kv, l, b);
            for (int h = 0; h < kv->n_kv_heads; h++)
                for (int d = 0; d < hd; d++) {
                    size_t ki = ((size_t)h * hd + d) * TLLM_KV_BLOCK + o, vi = ((size_t)h * TLLM_KV_BLOCK + o) * hd + d;
                    float *kd = &kt[((size_t)l * kv_dim + (size_t)h * hd + d) * n + (p - p0)];
                    float *vd = &v[((size_t)l * n + (p - p0)) * kv_dim + (size_t)h * hd + d];
                    if (to_blocks) put(kv, kb, ki, *kd), put(kv, vb, vi, *vd);
                    else *kd = get(kv, kb, ki), *vd = get(kv, vb, vi);
                }
        }
}

void tllm_kv_seq_read(const struct tllm_kv *kv, int seq, int p0, int p1, float *kt, float *v) {
    seq_copy((struct tllm_kv *)kv, seq, p0, p1, kt, v, 0);
}

void tllm_kv_seq_write(struct tllm_kv *kv, int seq, int p0, int p1, const float *kt, const float *v) {
    seq_copy(kv, seq, p0, p1, (float *)kt, (float *)v, 1);
}

void tllm_kv_set_remote(struct tllm_kv *kv, int on) {
    kv->remote = on;
    kv->n_copies = 0;
}
