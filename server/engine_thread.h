/* The server's one engine thread: it owns the scheduler (engine/run/scheduler.h, not thread-safe)
 * and steps it while there is work; HTTP threads hand it jobs and read what the jobs produced. A job
 * is shared by both sides and freed when both let go of it (reference counted under the lock). */
#ifndef TLLM_SRV_ENGINE_THREAD_H
#define TLLM_SRV_ENGINE_THREAD_H

#include <pthread.h>

#include "base/buf.h"
#include "engine/run/scheduler.h"

#define SRV_MAX_STOP 16 /* stop strings a job holds (a request's, or the server's defaults) */

/* One generated token's log probability and its alternatives */
struct srv_logprob {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[TLLM_SCHED_MAX_TOP];
    float top_lps[TLLM_SCHED_MAX_TOP];
};

struct srv_job {
    /* the request, set before srv_engine_submit and not changed after */
    struct tllm_sched_req rq;   /* rq.user and the callbacks are the engine's to set */
    int32_t *prompt;            /* owned: rq.prompt */
    char *stop[SRV_MAX_STOP];   /* owned: rq.stop */
    struct tllm_grammar *grammar; /* owned: rq.grammar */
    int logprobs;               /* collect each token's log probability (rq.top_logprobs alternatives) */
    /* what it produced: read and written under the engine's lock */
    struct tllm_buf text;       /* the text so far (never half a character, never a stop string) */
    struct srv_logprob *lps;    /* [n_lps] when rq.on_token asked for them */
    size_t n_lps, cap_lps;
    int done;                   /* ended: rc, err, finish and the counts are final */
    int rc;                     /* an error: 400 for the request's own fault, 503 when the server stopped, else 500 */
    char err[300];
    enum tllm_finish finish;
    int n_prompt, n_reused, n_generated;
    double t_submit, t_first, t_done;
    int cancelled;              /* the client went away or the server is stopping */
    int stopped;                /* ended unfinished because the server is stopping */
    /* the engine's */
    struct srv_engine *e;
    int refs;
    struct srv_job *next;       /* in the inbox (the engine thread walks it after taking it, unlocked) */
    struct srv_job *cancel_next; /* in the cancel list: a link of its own, since a job taken from the inbox
                                    may be cancelled while the engine thread still walks the inbox's links */
    int queued;                 /* in the inbox, not yet given to the scheduler */
};

/* As of the engine's last step (the KV blocks, the scheduler's counters), the jobs as of now */
struct srv_engine_stats {
    int running, waiting;      /* in the scheduler */
    int live;                  /* jobs submitted and not ended */
    int kv_free, kv_total;     /* KV blocks */
    struct tllm_sched_stats sched;
    long long requests_done, requests_cancelled, requests_failed;
    int stopping;              /* no new jobs are taken */
    int failed;                /* the engine failed: every job fails */
};

struct srv_engine {
    pthread_mutex_t lk;
    pthread_cond_t wake;       /* the engine thread waits on it for work */
    pthread_cond_t changed;    /* HTTP threads wait on it for their jobs */
    pthread_t th;
    int started;
    struct tllm_sched *sched;
    struct srv_job *inbox, *inbox_tail, *cancels;
    int max_live;              /* jobs at once, running and waiting; more are refused */
    int stopping;              /* 1: refuse new jobs, finish the live ones; 2: cancel them too */
    char fatal[300];           /* the engine failed: every later job fails with this */
    struct srv_engine_stats st;
};

/* The scheduler is the engine's from now on (freed by srv_engine_free). */
int srv_engine_init(struct srv_engine *e, const struct tllm_model *m, struct tllm_tok *tok,
                    const struct tllm_sched_params *p, int max_live);
/* Stop the thread (cancelling what is left) and free everything. */
void srv_engine_free(struct srv_engine *e);

/* A new job holding one reference (the caller's); NULL when out of memory. */
struct srv_job *srv_job_new(void);
void srv_job_release(struct srv_engine *e, struct srv_job *j);

/* Give a job to the engine: 0, or 1 when the server is full (max_live) or stopping, with the reason
 * in *why ("busy" or "stopping"). The engine takes its own reference. */
int srv_engine_submit(struct srv_engine *e, struct srv_job *j, const char **why);
/* The job's client is gone: end it now (its blocks go back). */
void srv_engine_cancel(struct srv_engine *e, struct srv_job *j);
/* Wait under the lock (held by the caller) until something changed or `ms` passed. */
void srv_engine_wait(struct srv_engine *e, int ms);
/* 1: stop taking jobs and let the live ones finish; 2: cancel them too. */
void srv_engine_stop(struct srv_engine *e, int how);
void srv_engine_stats(struct srv_engine *e, struct srv_engine_stats *st);

#endif
