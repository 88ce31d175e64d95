/* Compiled grammars kept by a text key (a schema's JSON text): requests on one schema share one grammar,
 * and with it the automaton of allowed tokens the scheduler keeps for each grammar (its masks are walked
 * once, not once a request). The server, batch files and the C API's batches each keep one. The newest
 * TLLM_GRAMMAR_CACHE_SIZE keys stay; a zeroed cache is empty. Not locked: callers that share one lock it. */
#ifndef TLLM_GRAMMAR_CACHE_H
#define TLLM_GRAMMAR_CACHE_H

#ifndef TLLM_GRAMMAR_CACHE_SIZE
#define TLLM_GRAMMAR_CACHE_SIZE 16
#endif

struct tllm_grammar;

struct tllm_grammar_cache {
    struct {
        char *key;               /* NULL: a free entry */
        struct tllm_grammar *g;  /* a reference the cache holds */
    } e[TLLM_GRAMMAR_CACHE_SIZE];
    unsigned next;               /* the entry the next new key takes (the oldest) */
};

/* A new reference to the grammar kept under key, or NULL */
struct tllm_grammar *tllm_grammar_cache_find(struct tllm_grammar_cache *c, const char *key);
/* Keep a reference to g under key, letting go of the oldest key when full. Only a cache: out of memory
 * keeps nothing. */
void tllm_grammar_cache_put(struct tllm_grammar_cache *c, const char *key, struct tllm_grammar *g);
/* g, or the grammar kept under an equal key (the caller's reference to g is then let go and one to the
 * kept grammar returned); g is kept from now on when none was */
struct tllm_grammar *tllm_grammar_cache_share(struct tllm_grammar_cache *c, const char *key, struct tllm_grammar *g);
/* Let go of every grammar kept; c is empty after */
void tllm_grammar_cache_free(struct tllm_grammar_cache *c);

#endif
