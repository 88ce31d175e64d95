/* The generation loop shared by every front end: prompt prefill, sampling, streaming text that
 * never splits a UTF-8 character nor shows a stop string, and the reasons generation ends. */
#ifndef TLLM_GENERATE_H
#define TLLM_GENERATE_H

#include "base/buf.h"
#include "base/clock.h"
#include "engine/run/context.h"
#include "engine/run/sampler.h"
#include "engine/tllm.h" /* enum tllm_finish, tllm_gen_cb */
#include "tokenizer/tokenizer.h"

#define TLLM_MAX_EOS 8

/* Defaults a checkpoint's generation_config.json gives (absent file: greedy). */
struct tllm_gen_defaults {
    struct tllm_sampler_params sampler;
    int32_t eos[TLLM_MAX_EOS]; /* eos_token_id (int or list) */
    int n_eos;
};

/* Read DIR/generation_config.json if present; eos falls back to config.json's eos_token_id. */
int tllm_gen_defaults_load(const char *dir, const struct tllm_model *m, struct tllm_gen_defaults *d);

struct tllm_gen_params {
    int max_new;               /* < 0: until the context is full */
    const int32_t *eos;
    int n_eos;
    const char *const *stop;   /* stop strings: not printed; generation ends where one appears */
    int n_stop;
    int skip_special;          /* leave special tokens out of the text */
    const struct tllm_grammar *grammar; /* the text follows it (constrained sampling), or NULL; it ends
                                         * with an EOS id once the grammar is satisfied and nothing may follow */
};

struct tllm_gen_result {
    struct tllm_ids ids;   /* generated ids (EOS excluded) */
    struct tllm_buf text;  /* generated text (stop string excluded) */
    enum tllm_finish finish;
    int n_prompt;
    int n_reused;          /* of the prompt's tokens, found in the KV cache (the scheduler's runs) */
    double prompt_secs, gen_secs;
};


/* The end of one sequence's generation, token by token (tllm_generate's, and the scheduler's for each
 * of its sequences): EOS, stop strings, the text streamed through the callback without splitting a
 * UTF-8 character or showing a stop string, and the finish reason. */
struct tllm_gen_stream {
    struct tllm_tok *tok;   /* NULL: ids only */
    struct tllm_sampler *s; /* told each token taken (penalties) */
    const struct tllm_gen_params *p;
    tllm_gen_cb cb;
    void *user;
    struct tllm_gen_result *r;
    struct tllm_tok_stream ts;
    size_t emitted;         /* bytes of r->text given to the callback */
    int stopped;            /* a stop string was found */
};

/* r->finish starts as TLLM_FINISH_LENGTH. */
void tllm_gen_stream_init(struct tllm_gen_stream *g, struct tllm_tok *tok, struct tllm_sampler *s,
                          const struct tllm_gen_params *p, tllm_gen_cb cb, void *user, struct tllm_gen_result *r);
/* Take a generated id: *done (with r->finish) when generation ends at it (EOS, a stop string, the
 * callback asking to stop). The max_new limit and the context are the caller's. */
int tllm_gen_stream_take(struct tllm_gen_stream *g, int32_t id, int *done);
/* Generation ended: the text held back is final (and given to the callback). */
int tllm_gen_stream_end(struct tllm_gen_stream *g);

/* Feed `prompt` after what ctx already holds, then generate. tok may be NULL (ids only; the text
 * stays empty and stop strings are ignored). Fails (TLLM_ERR_LIMIT) if the prompt does not fit. */
int tllm_generate(struct tllm_ctx *ctx, struct tllm_tok *tok, struct tllm_sampler *s, const int32_t *prompt,
                  int n_prompt, const struct tllm_gen_params *p, tllm_gen_cb cb, void *user,
                  struct tllm_gen_result *r);
void tllm_gen_result_free(struct tllm_gen_result *r);
/* Put s under p->grammar (after the prompt's tokens were accepted), with *vi the vocabulary's index
 * (made here when NULL; the caller frees it after the sampler lets go of the grammar); share: another
 * live sequence's matcher on the same grammar, whose masks it may reuse, or NULL. */
int tllm_gen_constrain(struct tllm_sampler *s, const struct tllm_tok *tok, const struct tllm_gen_params *p,
                       struct tllm_vocab_index **vi, struct tllm_gmatch *share);

#endif
