/* Sampling the next token from logits. Order as Hugging Face applies it: repetition/presence/
 * frequency penalties, temperature, top-k, top-p, min-p. No full sort of the vocabulary: top-k is a
 * heap selection, top-p widens a partial selection until it holds the requested mass. */
#ifndef TLLM_SAMPLER_H
#define TLLM_SAMPLER_H

#include <stdint.h>

#include "engine/grammar/token_mask.h"
#include "engine/tllm.h" /* struct tllm_sampler_params, tllm_sampler_defaults */

struct tllm_sampler_cand {
    int32_t id;
    float logit;
};

struct tllm_sampler {
    struct tllm_sampler_params p;
    int vocab;
    uint64_t rng;
    struct tllm_sampler_cand *cands; /* [vocab] scratch */
    float *w;                        /* [vocab] the candidates' weights */
    int32_t *recent;                 /* ring of the last repeat_last_n tokens */
    int n_recent, recent_pos;
    struct tllm_gmatch *gm;          /* owned: a grammar the tokens must follow, or NULL */
};

int tllm_sampler_init(struct tllm_sampler *s, const struct tllm_sampler_params *p, int vocab);
void tllm_sampler_free(struct tllm_sampler *s);
/* Sample only ids below n from now on: the ids the tokenizer has (Qwen's lm_head has 151,936 rows but
 * its tokenizer 151,665 ids; the rows past them are padding no text can come from). */
void tllm_sampler_limit(struct tllm_sampler *s, int n);
/* Forget the history and reseed. */
void tllm_sampler_reset(struct tllm_sampler *s);
/* Record a token (prompt or generated) for the penalties. */
void tllm_sampler_accept(struct tllm_sampler *s, int32_t id);
/* 1 when sample() is the argmax of the logits as they come (greedy, no penalties): a device may pick it */
int tllm_sampler_is_greedy(const struct tllm_sampler *s);
/* 1 when sample() is the argmax of the logits over the ids the grammar allows, or all when there is
 * none (greedy, no penalties): a backend may pick it given tllm_sampler_allowed's bits, and take() it. */
int tllm_sampler_is_masked_greedy(const struct tllm_sampler *s);
/* Under a grammar: the ids that may come next as tllm_gmatch_list gives them (*allows 1: only
 * (*list)[0..*n); 0: every id but those), valid until the grammar moves; none when the grammar failed
 * (take() then ends the text as sample() does). Returns 0 when there is no grammar (every id may). */
int tllm_sampler_allowed(struct tllm_sampler *s, const int32_t **list, int *n, int *allows);
/* What sample() returns when the argmax over the allowed ids is id: under a grammar, it moves past id,
 * and an id outside the vocabulary (none allowed) gives the grammar's EOS id as sample() does. */
int32_t tllm_sampler_take(struct tllm_sampler *s, int32_t id);
/* sample()'s pick among the ids tllm_sampler_allowed gave (-1 when none may come), without moving
 * the grammar (take() does): it touches only s and logits, so rows sharing a grammar's automaton can
 * pick on several threads once their lists are copied. */
int32_t tllm_sampler_sample_allowed(struct tllm_sampler *s, float *logits, const int32_t *list, int n, int allows);
/* From the next sample on, only tokens the grammar allows (gm: taken, freed with the sampler; NULL
 * drops the one set). Each sampled token moves it on, so set it after the prompt, before sampling. */
void tllm_sampler_constrain(struct tllm_sampler *s, struct tllm_gmatch *gm);
/* Pick the next token. Penalties (and a grammar's mask) modify `logits` in place. Under a grammar
 * that allows no token at all, the grammar's first EOS id (-1 when it has none: the text ends). */
int32_t tllm_sampler_sample(struct tllm_sampler *s, float *logits);

#endif
