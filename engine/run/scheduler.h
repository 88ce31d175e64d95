/* Continuous batching: many requests through one model and one paged KV cache (engine/run/kv_cache.h).
 * Requests wait in a queue; each step admits new ones while there are sequence slots and KV blocks,
 * feeds every decoding sequence's next token plus chunks of prompts up to a token budget (chunked
 * prefill, so running sequences keep decoding), samples each sequence with its own sampler, and
 * retires the finished ones. A prompt whose beginning is cached (another request's system prompt,
 * few-shot examples) starts after it; a request that shares a prefix with one being prefilled waits
 * for that prefix and reuses it rather than computing it again.
 *
 * A sequence's tokens do not depend on what runs beside it: every token's arithmetic follows its
 * role (engine/backend/backend.h), and a request is admitted only with the KV blocks its prompt and
 * its max_new tokens can take, so it is never preempted and recomputed. */
#ifndef TLLM_SCHEDULER_H
#define TLLM_SCHEDULER_H

#include <stdint.h>

#include "base/dtype.h"
#include "engine/run/generate.h"

#define TLLM_SCHED_MAX_TOP 20 /* top_logprobs at most (OpenAI's limit) */
/* Sequences at once for a batch job (tllm generate --prompts, tllm_session_generate_batch) when not told:
 * on 2 to 16 cores, 16 sequences read each weight once for 16 tokens (docs/performance.md measures it)
 * and their caches stay small; on a device, a step of 64 costs about what one of 16 does (H100: 4.1
 * against 3.8 ms) */
#define TLLM_SCHED_DEFAULT_PARALLEL 16        /* on the CPU threads */
#define TLLM_SCHED_DEFAULT_PARALLEL_DEVICE 64 /* on a device */

struct tllm_sched_params {
    int n_parallel;    /* sequences at once (>= 1) */
    int n_batch;       /* tokens per step at most: generated tokens plus prompt chunks (0: 512) */
    int kv_tokens;     /* positions of the shared KV cache (0: 1024 per sequence, at least 4096) */
    enum tllm_dtype kv_type; /* TLLM_DT_F16 or TLLM_DT_F32 */
    int n_ctx;         /* positions one sequence may reach (0: the model's max_position_embeddings) */
    struct tllm_backend *dev; /* steps on this device (bound to the scheduler's cache until it is freed;
                               * it must offer use_kv), or NULL: on the CPU threads */
};

struct tllm_sched_req {
    const int32_t *prompt;  /* copied */
    int n_prompt;
    struct tllm_sampler_params sampling;
    int max_new;            /* < 0: until the sequence's context is full */
    const char *const *stop; /* copied */
    int n_stop;
    const int32_t *eos;     /* copied */
    int n_eos;
    int skip_special;
    tllm_gen_cb cb;         /* optional: the text as it comes; nonzero stops the request (interrupted) */
    void *user;             /* given back to cb, on_token and the done callback; also names it to cancel */
    /* optional: each generated token that is kept (EOS is not) with its log probability under the
     * model's own distribution (log-softmax of the logits, before penalties and temperature, as OpenAI's
     * and vLLM's logprobs) and, when top_logprobs > 0, the most likely alternatives (at most 20) */
    void (*on_token)(void *user, int32_t id, float logprob, const int32_t *top_ids, const float *top_lps, int n_top);
    int top_logprobs;
    const struct tllm_grammar *grammar; /* the text follows it (constrained sampling), or NULL; not
                                         * copied: it must last until the done callback */
};

/* A request ended, called exactly once for every request submitted: rc TLLM_OK and its result (freed
 * after the call; finish TLLM_FINISH_INTERRUPTED when it was dropped or its stream callback stopped
 * it), or an error and its message (it could not run: a prompt too long for the cache, a bad sampler
 * setting). */
typedef void (*tllm_sched_done_fn)(void *arg, void *user, int rc, const char *msg, struct tllm_gen_result *r);

struct tllm_sched_stats {
    long long steps;
    long long prompt_tokens;   /* prompt positions computed */
    long long reused_tokens;   /* prompt positions found in the cache instead */
    long long gen_tokens;      /* tokens generated */
    double step_secs;          /* time inside forward steps */
    long long grammar_walks;   /* token masks walked over the vocabulary (the others came from an
                                * automaton's cache) */
    double mask_secs;          /* inside fill_masks: the greedy rows' grammar bitsets of the steps (on a
                                * device, made while the step's layers are queued and run) */
};

struct tllm_sched;

int tllm_sched_init(struct tllm_sched **out, const struct tllm_model *m, struct tllm_tok *tok,
                    const struct tllm_sched_params *p, tllm_sched_done_fn done, void *arg);
void tllm_sched_free(struct tllm_sched *s);
/* Queue a request (only TLLM_ERR_NOMEM fails here; bad requests are reported through done). */
int tllm_sched_submit(struct tllm_sched *s, const struct tllm_sched_req *req);
/* One step: admissions, one forward pass, sampling, retirements (done callbacks run inside). Fails
 * only when the engine does (then every request, running or waiting, is dropped). */
int tllm_sched_step(struct tllm_sched *s);
int tllm_sched_waiting(const struct tllm_sched *s);
int tllm_sched_running(const struct tllm_sched *s);
/* End the request submitted with `user` (waiting or running) now, as interrupted, its blocks given
 * back; 0 when there is none (it has ended already). */
int tllm_sched_cancel(struct tllm_sched *s, void *user);
/* Drop every request, waiting and running: each done callback says interrupted. */
void tllm_sched_drop_all(struct tllm_sched *s);
void tllm_sched_stats(const struct tllm_sched *s, struct tllm_sched_stats *st);
/* KV blocks that no sequence holds, of all the cache has */
void tllm_sched_kv_blocks(const struct tllm_sched *s, int *n_free, int *n_total);

#endif
