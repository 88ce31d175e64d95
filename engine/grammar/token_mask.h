/* Which tokens may come next under a grammar: constrained sampling's masks.
 *
 * The vocabulary is sorted as byte strings once (tllm_vocab_index); a mask walks it in that order
 * with one grammar state per byte of depth, so a prefix shared by many tokens is advanced once and a
 * prefix the grammar refuses skips every token that begins with it. The states met are interned with
 * their byte transitions (an automaton built as the walks need it: inside a string nearly every byte
 * leads back to the same state, so a walk is mostly table lookups), and each state's mask is kept (a
 * sequence inside a long string meets the same state at every token). A sequence's mask depends only
 * on its own text: batch-invariant. With TLLM_GRAMMAR_STATS set in the environment, an automaton prints
 * its counts (masks computed, their time, masks found in the cache, states) to stderr when it is freed:
 * a measuring aid (scripts/bench_structured.sh). */
#ifndef TLLM_TOKEN_MASK_H
#define TLLM_TOKEN_MASK_H

#include <stdint.h>

#include "engine/grammar/grammar.h"
#include "tokenizer/tokenizer.h"

/* Masks an automaton keeps (each the shorter of its allowed or refused ids), the bytes of their lists,
 * and grammar states with their byte transitions (1 KB each and their stacks); past any, it starts
 * over from the states its sequences are at. A small object schema (64 prompts of 96 tokens) meets
 * ~190 masked states in 0.2 MB of lists: with room for 128 masks it started over and computed 506 */
#ifndef TLLM_GMATCH_CACHE
#define TLLM_GMATCH_CACHE 4096
#endif
#ifndef TLLM_GMATCH_CACHE_BYTES
#define TLLM_GMATCH_CACHE_BYTES (16 << 20)
#endif
#ifndef TLLM_GMATCH_STATES
#define TLLM_GMATCH_STATES 8192
#endif

struct tllm_vocab_index;

/* The tokens below n_ids (the ids sampling may pick), special ones left out. tok must outlive it. */
int tllm_vocab_index_init(const struct tllm_tok *tok, int n_ids, struct tllm_vocab_index **out);
void tllm_vocab_index_free(struct tllm_vocab_index *v);

struct tllm_gmatch;

/* One sequence at the grammar's start. g and v must outlive it; eos: the ids that end the text (they
 * may come exactly when the text is a whole sentence of the grammar). share: a live sequence on the
 * same grammar, vocabulary and eos ids, or NULL: the two then share the automaton and the masks (a
 * batch of answers to one schema computes each mask once); sequences that share are used from one
 * thread. */
int tllm_gmatch_init(struct tllm_gmatch **out, const struct tllm_grammar *g, const struct tllm_vocab_index *v,
                     const int32_t *eos, int n_eos, struct tllm_gmatch *share);
const struct tllm_grammar *tllm_gmatch_grammar(const struct tllm_gmatch *m);
void tllm_gmatch_free(struct tllm_gmatch *m);
/* logits[0..n) of tokens that cannot come next become -inf. Returns how many may come (0: none; the
 * grammar cannot go on with this vocabulary), or < 0 on an error. */
int tllm_gmatch_mask(struct tllm_gmatch *m, float *logits, int n);
/* Makes the masks that the sequences ms[0..n) stand at and none has yet (the first walk of each
 * distinct state), up to n_threads walks at once: each thread walks in an automaton of its own over
 * the same grammar and vocabulary (kept for the next call), and the masks then join the shared cache,
 * where tllm_gmatch_list finds them. The same masks as one walk at a time. Called from the thread that
 * uses these sequences; *walked: the walks made. (A batch whose sequences reach new states together,
 * as 64 answers to one schema do in their first steps, otherwise walks them one after another while
 * a GPU waits.) */
int tllm_gmatch_prepare(struct tllm_gmatch *const *ms, int n, int n_threads, int *walked);
/* Which tokens may come next as the shorter list, ascending: *allows 1: ids[0..*n) are the only ones
 * that may; 0: every id below the index's n_ids may but ids[0..*n). Valid until m (or a sequence
 * sharing its automaton) moves. NULL on an error. */
const int32_t *tllm_gmatch_list(struct tllm_gmatch *m, int *n, int *allows);
/* Move past a token (an EOS id: nothing to do). TLLM_ERR_ARG when the grammar does not allow it. */
int tllm_gmatch_accept(struct tllm_gmatch *m, int32_t id);
/* The first EOS id given (-1: none): what a sampler ends with when nothing may come */
int32_t tllm_gmatch_eos(const struct tllm_gmatch *m);
/* 1 when a and b share an automaton (and so their masks) */
int tllm_gmatch_shares(const struct tllm_gmatch *a, const struct tllm_gmatch *b);
/* Masks computed and found in the cache so far (by every sequence sharing m's automaton) */
void tllm_gmatch_counts(const struct tllm_gmatch *m, long *computed, long *cached);

#endif
