/* The engine thread (engine_thread.h). */
#include "server/engine_thread.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"

struct srv_job *srv_job_new(void) {
    struct srv_job *j = calloc(1, sizeof *j);
    if (j) j->refs = 1;
    return j;
}

static void job_free(struct srv_job *j) {
    free(j->prompt);
    for (int i = 0; i < SRV_MAX_STOP; i++) free(j->stop[i]);
    tllm_grammar_free(j->grammar);
    tllm_buf_free(&j->text);
    free(j->lps);
    free(j);
}

/* under the lock */
static void job_unref(struct srv_job *j) {
    if (--j->refs == 0) job_free(j);
}

void srv_job_release(struct srv_engine *e, struct srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&e->lk);
    job_unref(j);
    pthread_mutex_unlock(&e->lk);
}

/* ---- the scheduler's callbacks, on the engine thread; they write the job under the lock ---- */

static int on_text(const char *text, size_t len, void *user) {
    struct srv_job *j = user;
    pthread_mutex_lock(&j->e->lk);
    int stop = tllm_buf_append(&j->text, text, len) || j->cancelled;
    pthread_mutex_unlock(&j->e->lk);
    return stop;
}

static void on_token(void *user, int32_t id, float lp, const int32_t *top_ids, const float *top_lps, int n_top) {
    struct srv_job *j = user;
    pthread_mutex_lock(&j->e->lk);
    if (j->n_lps == j->cap_lps) {
        size_t cap = j->cap_lps ? 2 * j->cap_lps : 64;
        struct srv_logprob *v = realloc(j->lps, cap * sizeof *v);
        if (v) j->lps = v, j->cap_lps = cap;
    }
    if (j->n_lps < j->cap_lps) { /* out of memory: the entry is missing, the answer is not */
        struct srv_logprob *o = &j->lps[j->n_lps++];
        o->id = id, o->logprob = lp, o->n_top = n_top;
        memcpy(o->top_ids, top_ids, (size_t)n_top * sizeof *top_ids);
        memcpy(o->top_lps, top_lps, (size_t)n_top * sizeof *top_lps);
    }
    pthread_mutex_unlock(&j->e->lk);
}

static void on_done(void *arg, void *user, int rc, const char *msg, struct tllm_gen_result *r) {
    struct srv_engine *e = arg;
    struct srv_job *j = user;
    pthread_mutex_lock(&e->lk);
    j->done = 1;
    j->t_done = tllm_now();
    if (rc) {
        j->rc = rc;
        snprintf(j->err, sizeof j->err, "%s", msg ? msg : "the request failed");
        e->st.requests_failed++;
    } else {
        j->finish = r->finish;
        j->n_prompt = r->n_prompt, j->n_reused = r->n_reused, j->n_generated = (int)r->ids.len;
        if (r->prompt_secs > 0) j->t_first = j->t_done - r->gen_secs;
        if (r->finish == TLLM_FINISH_INTERRUPTED && !j->cancelled) { /* dropped: the engine failed or stops */
            j->rc = TLLM_ERR_IO;
            if (e->stopping) j->stopped = 1, snprintf(j->err, sizeof j->err, "the server is stopping");
            else snprintf(j->err, sizeof j->err, "the engine failed: %s", tllm_errmsg()); /* inside a failed step */
            e->st.requests_failed++;
        } else if (r->finish == TLLM_FINISH_INTERRUPTED)
            e->st.requests_cancelled++;
        else
            e->st.requests_done++;
    }
    e->st.live--;
    job_unref(j);
    pthread_cond_broadcast(&e->changed);
    pthread_mutex_unlock(&e->lk);
}

static void *engine_main(void *arg) {
    struct srv_engine *e = arg;
    pthread_mutex_lock(&e->lk);
    for (;;) {
        struct srv_job *in = e->inbox, *cancels = e->cancels;
        e->inbox = e->inbox_tail = e->cancels = NULL;
        int hard = e->stopping == 2;
        for (struct srv_job *j = in; j; j = j->next) j->queued = 0;
        pthread_mutex_unlock(&e->lk);
        while (in) {
            struct srv_job *j = in;
            in = j->next;
            struct tllm_gen_result r = {.finish = TLLM_FINISH_INTERRUPTED, .n_prompt = j->rq.n_prompt};
            pthread_mutex_lock(&e->lk); /* an HTTP thread may cancel it now (it then also comes in `cancels`) */
            int cancelled = j->cancelled;
            pthread_mutex_unlock(&e->lk);
            if (hard || cancelled) on_done(e, j, TLLM_OK, NULL, &r);
            else if (e->fatal[0]) on_done(e, j, TLLM_ERR_IO, e->fatal, NULL);
            else if (tllm_sched_submit(e->sched, &j->rq)) on_done(e, j, TLLM_ERR_NOMEM, "out of memory", NULL);
        }
        while (cancels) {
            struct srv_job *j = cancels;
            cancels = j->cancel_next;
            tllm_sched_cancel(e->sched, j);
            srv_job_release(e, j); /* the cancel list's reference */
        }
        if (hard) tllm_sched_drop_all(e->sched);
        int work = tllm_sched_running(e->sched) || tllm_sched_waiting(e->sched);
        if (work && tllm_sched_step(e->sched)) { /* every request was dropped: they fail with the reason */
            char msg[300];
            snprintf(msg, sizeof msg, "the engine failed: %s", tllm_errmsg());
            pthread_mutex_lock(&e->lk);
            snprintf(e->fatal, sizeof e->fatal, "%s", msg);
            pthread_mutex_unlock(&e->lk);
            fprintf(stderr, "tllm serve: %s\n", msg);
        }
        pthread_mutex_lock(&e->lk);
        e->st.running = tllm_sched_running(e->sched);
        e->st.waiting = tllm_sched_waiting(e->sched);
        tllm_sched_stats(e->sched, &e->st.sched);
        tllm_sched_kv_blocks(e->sched, &e->st.kv_free, &e->st.kv_total);
        pthread_cond_broadcast(&e->changed);
        if (!e->st.running && !e->st.waiting && !e->inbox && !e->cancels) {
            if (e->stopping && e->st.live == 0) break;
            pthread_cond_wait(&e->wake, &e->lk);
        }
    }
    pthread_mutex_unlock(&e->lk);
    return NULL;
}

int srv_engine_init(struct srv_engine *e, const struct tllm_model *m, struct tllm_tok *tok,
                    const struct tllm_sched_params *p, int max_live) {
    memset(e, 0, sizeof *e);
    e->max_live = max_live;
    int rc = tllm_sched_init(&e->sched, m, tok, p, on_done, e);
    if (rc) return rc;
    pthread_mutex_init(&e->lk, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->changed, NULL);
    tllm_sched_kv_blocks(e->sched, &e->st.kv_free, &e->st.kv_total);
    if (pthread_create(&e->th, NULL, engine_main, e)) {
        srv_engine_free(e);
        return tllm_fail(TLLM_ERR_NOMEM, "cannot start the engine thread");
    }
    e->started = 1;
    return TLLM_OK;
}

void srv_engine_free(struct srv_engine *e) {
    if (!e->sched) return;
    if (e->started) {
        srv_engine_stop(e, 2);
        pthread_join(e->th, NULL);
    }
    tllm_sched_free(e->sched);
    pthread_mutex_destroy(&e->lk);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->changed);
    memset(e, 0, sizeof *e);
}

int srv_engine_submit(struct srv_engine *e, struct srv_job *j, const char **why) {
    pthread_mutex_lock(&e->lk);
    int refused = 1;
    if (e->stopping) *why = "stopping";
    else if (e->st.live >= e->max_live) *why = "busy";
    else {
        refused = 0;
        j->e = e;
        j->rq.user = j;
        j->rq.cb = on_text;
        j->rq.on_token = j->logprobs ? on_token : NULL;
        j->refs++;
        j->queued = 1;
        j->t_submit = tllm_now();
        j->next = NULL;
        if (e->inbox_tail) e->inbox_tail->next = j;
        else e->inbox = j;
        e->inbox_tail = j;
        e->st.live++;
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->lk);
    return refused;
}

void srv_engine_cancel(struct srv_engine *e, struct srv_job *j) {
    pthread_mutex_lock(&e->lk);
    if (!j->done && !j->cancelled) {
        j->cancelled = 1;
        if (!j->queued) { /* in the scheduler: the engine thread ends it (the inbox's are seen there) */
            j->refs++;
            j->cancel_next = e->cancels;
            e->cancels = j;
        }
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->lk);
}

void srv_engine_wait(struct srv_engine *e, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&e->changed, &e->lk, &ts);
}

void srv_engine_stop(struct srv_engine *e, int how) {
    pthread_mutex_lock(&e->lk);
    if (how > e->stopping) e->stopping = how;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lk);
}

void srv_engine_stats(struct srv_engine *e, struct srv_engine_stats *st) {
    pthread_mutex_lock(&e->lk);
    *st = e->st;
    st->stopping = e->stopping != 0, st->failed = e->fatal[0] != 0;
    pthread_mutex_unlock(&e->lk);
    /* the scheduler's counts are as of the last step, the jobs' as of now: a job that ended inside the
     * step being finished is no longer running */
    if (st->running > st->live) st->running = st->live;
    if (st->waiting > st->live - st->running) st->waiting = st->live - st->running;
}
