#include "engine/grammar/grammar_cache.h"

#include <stdlib.h>
#include <string.h>

#include "engine/grammar/grammar.h"

struct tllm_grammar *tllm_grammar_cache_find(struct tllm_grammar_cache *c, const char *key) {
    for (int i = 0; i < TLLM_GRAMMAR_CACHE_SIZE; i++)
        if (c->e[i].key && !strcmp(c->e[i].key, key)) return tllm_grammar_ref(c->e[i].g);
    return NULL;
}

void tllm_grammar_cache_put(struct tllm_grammar_cache *c, const char *key, struct tllm_grammar *g) {
    char *k = strdup(key);
    if (!k) return;
    unsigned i = c->next++ % TLLM_GRAMMAR_CACHE_SIZE;
    free(c->e[i].key);
    tllm_grammar_free(c->e[i].g);
    c->e[i].key = k, c->e[i].g = tllm_grammar_ref(g);
}

struct tllm_grammar *tllm_grammar_cache_share(struct tllm_grammar_cache *c, const char *key, struct tllm_grammar *g) {
    struct tllm_grammar *kept = tllm_grammar_cache_find(c, key);
    if (kept) {
        tllm_grammar_free(g);
        return kept;
    }
    tllm_grammar_cache_put(c, key, g);
    return g;
}

void tllm_grammar_cache_free(struct tllm_grammar_cache *c) {
    for (int i = 0; i < TLLM_GRAMMAR_CACHE_SIZE; i++) free(c->e[i].key), tllm_grammar_free(c->e[i].g);
    memset(c, 0, sizeof *c);
}
