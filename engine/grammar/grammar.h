/* A context-free grammar over bytes, and the sets of parse stacks that say how far a text has gone
 * through it (the shape of llama.cpp's GBNF matcher: a rule is alternatives of sequences of byte
 * sets and rule references; a state is every stack of positions still alive). Built by the JSON
 * schema compiler (json_schema.h) and read by the token masks (token_mask.h).
 *
 * Bytes, not code points: tokens are byte strings (a byte-level BPE token may hold half a character),
 * so a grammar that spells UTF-8 byte by byte lets a token be checked byte by byte. Rules must not be
 * left-recursive (the schema compiler writes repetition as right recursion). */
#ifndef TLLM_GRAMMAR_H
#define TLLM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

/* Bounds on a state: stacks alive at once and positions in one stack (a JSON nesting depth of about
 * a third of it). A stack that would pass them is dropped, so a text that deep is refused. */
#ifndef TLLM_GRAMMAR_MAX_STACKS
#define TLLM_GRAMMAR_MAX_STACKS 128
#endif
#ifndef TLLM_GRAMMAR_MAX_DEPTH
#define TLLM_GRAMMAR_MAX_DEPTH 192
#endif
/* Rule elements a grammar may have (a schema's size bound) */
#ifndef TLLM_GRAMMAR_MAX_ELEMS
#define TLLM_GRAMMAR_MAX_ELEMS (1 << 20)
#endif

/* ---- building ---- */

struct tllm_gram_builder;

int tllm_gram_builder_init(struct tllm_gram_builder **out);
void tllm_gram_builder_free(struct tllm_gram_builder *b);
/* A new rule with no alternative yet: its id. -1 when the grammar is too large (see tllm_gram_build). */
int tllm_gram_rule(struct tllm_gram_builder *b);
/* Append to the last alternative of rule r (the first alternative is open from the start): */
void tllm_gram_set(struct tllm_gram_builder *b, int r, const uint8_t set[32]); /* one byte of a set */
void tllm_gram_byte(struct tllm_gram_builder *b, int r, unsigned char c);
void tllm_gram_range(struct tllm_gram_builder *b, int r, unsigned char lo, unsigned char hi);
void tllm_gram_lit(struct tllm_gram_builder *b, int r, const char *s, size_t n); /* these bytes in order */
void tllm_gram_ref(struct tllm_gram_builder *b, int r, int rule);
/* Close rule r's current alternative and open the next. */
void tllm_gram_alt(struct tllm_gram_builder *b, int r);
/* A rule for x{min,max} (max < 0: unbounded), x a rule; -1 when too large. */
int tllm_gram_repeat(struct tllm_gram_builder *b, int x, int min, int max);

/* A rule for one UTF-8 character of two to four bytes, well formed */
int tllm_gram_utf8_multibyte(struct tllm_gram_builder *b);

static inline void tllm_gram_set_add(uint8_t set[32], unsigned c) { set[c >> 3] |= (uint8_t)(1u << (c & 7)); }
static inline int tllm_gram_set_has(const uint8_t set[32], unsigned c) { return set[c >> 3] >> (c & 7) & 1; }

struct tllm_grammar;

/* The grammar starting at rule root; the builder is spent either way. Fails when a rule was too
 * large or a rule references itself before reading a byte (left recursion). */
int tllm_gram_build(struct tllm_gram_builder *b, int root, struct tllm_grammar **out);
/* One more holder (a grammar is never changed once built: any thread may read it); free drops one */
struct tllm_grammar *tllm_grammar_ref(struct tllm_grammar *g);
void tllm_grammar_free(struct tllm_grammar *g);

/* ---- matching ---- */

/* A set of stacks as words: for each stack its length then its positions, bottom first. An empty
 * stack is a finished parse. */
struct tllm_gram_state {
    uint32_t *w;
    int n_words, cap;
    int n_stacks;
    void *seen; /* scratch of the steps that write this state (grammar.c); not part of its value */
};

/* The start (every alternative of the root expanded). */
int tllm_gram_start(const struct tllm_grammar *g, struct tllm_gram_state *st);
/* out = st after byte c (out may not be st); out->n_stacks 0: c cannot come here. */
int tllm_gram_advance(const struct tllm_grammar *g, const struct tllm_gram_state *st, unsigned char c,
                      struct tllm_gram_state *out);
/* 1 when the text so far is a whole sentence of the grammar */
int tllm_gram_accepting(const struct tllm_gram_state *st);
int tllm_gram_state_copy(struct tllm_gram_state *dst, const struct tllm_gram_state *src);
/* What st looks like to texts of at most max_len bytes (a token's longest): deep in a counted string
 * (x{n} with n over max_len left to read: minLength; or x{0,n}: maxLength) where it stands in the count
 * makes no difference to them, so the positions are moved to where max_len + 1 copies remain. 1 with
 * that state in out; 0 when st is its own key (out untouched); -1 out of memory. st and out then accept
 * the same texts of up to max_len bytes (and either both or neither is accepting): the same token mask. */
int tllm_gram_mask_key(const struct tllm_grammar *g, const struct tllm_gram_state *st, int max_len,
                       struct tllm_gram_state *out);
void tllm_gram_state_free(struct tllm_gram_state *st);
/* Bytes no byte set of g tells apart share a class: cls[byte] in [0, n), n returned (a JSON schema's
 * grammar has a few dozen; an automaton's transition rows need only that many entries) */
int tllm_gram_byte_classes(const struct tllm_grammar *g, uint8_t cls[256]);
/* 1 when the whole text is a sentence of the grammar (tests; the reference the masks are checked by) */
int tllm_gram_match(const struct tllm_grammar *g, const char *text, size_t n);

#endif
