/* The generation loop shared by every front end: prompt prefill, sampling, streaming text that
 * never splits a UTF-8 character nor shows a stop string, and the reasons generation ends. */
#ifndef TLLM_GENERATE_H
#define TLLM_GENERATE_H

#include "engine/base/buf.h"
#include "engine/base/clock.h"
#include "engine/run/context.h"
#include "engine/run/sampler.h"
#include "engine/tllm.h" /* enum tllm_finish, tllm_gen_cb */

struct tllm_tok;

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
};

struct tllm_gen_result {
    struct tllm_ids ids;   /* generated ids (EOS excluded) */
    struct tllm_buf text;  /* generated text (stop string excluded) */
    enum tllm_finish finish;
    int n_prompt;
    double prompt_secs, gen_secs;
};


/* Feed `prompt` after what ctx already holds, then generate. tok may be NULL (ids only; the text
 * stays empty and stop strings are ignored). Fails (TLLM_ERR_LIMIT) if the prompt does not fit. */
int tllm_generate(struct tllm_ctx *ctx, struct tllm_tok *tok, struct tllm_sampler *s, const int32_t *prompt,
                  int n_prompt, const struct tllm_gen_params *p, tllm_gen_cb cb, void *user,
                  struct tllm_gen_result *r);
void tllm_gen_result_free(struct tllm_gen_result *r);

#endif
