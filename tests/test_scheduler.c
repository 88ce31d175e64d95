/* The scheduler's calls that the server relies on: cancelling a request that waits and one that runs
 * (each done callback once, as interrupted, every block back), per-token log probabilities (the
 * greedy token is the best alternative; alternatives sorted, at most one in total probability), and
 * the count of prompt tokens found cached.
 * usage: test_scheduler MODEL_DIR (a checkpoint; no tokenizer needed) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/api.h"
#include "engine/base/error.h"
#include "engine/run/scheduler.h"
#include "tests/check.h"

struct outcome {
    int calls, rc;
    enum tllm_finish finish;
    int n_gen, n_reused;
    int n_tokens;        /* on_token calls */
    int lp_ok;           /* every on_token call was consistent */
    int32_t ids[64];
};

static void on_done(void *arg, void *user, int rc, const char *msg, struct tllm_gen_result *r) {
    (void)arg, (void)msg;
    struct outcome *o = user;
    o->calls++;
    o->rc = rc;
    if (r) {
        o->finish = r->finish, o->n_gen = (int)r->ids.len, o->n_reused = r->n_reused;
        for (size_t i = 0; i < r->ids.len && i < 64; i++) o->ids[i] = r->ids.data[i];
    }
}

static void on_token(void *user, int32_t id, float lp, const int32_t *top_ids, const float *top_lps, int n_top) {
    struct outcome *o = user;
    double mass = 0;
    int ok = n_top == 3 && top_ids[0] == id && fabsf(top_lps[0] - lp) < 1e-6f && lp <= 0;
    for (int k = 0; k < n_top; k++) {
        mass += exp(top_lps[k]);
        if (k && top_lps[k] > top_lps[k - 1]) ok = 0;
    }
    if (mass > 1.0001) ok = 0;
    if (o->n_tokens++ == 0) o->lp_ok = 1;
    o->lp_ok &= ok;
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: test_scheduler MODEL_DIR\n"), 2;
    struct tllm_engine *e;
    if (tllm_engine_open(argv[1], NULL, &e)) return fprintf(stderr, "%s\n", tllm_errmsg()), 1;
    struct tllm_sched_params p = {.n_parallel = 1, .kv_tokens = 1024, .kv_type = TLLM_DT_F32, .n_ctx = 512};
    struct tllm_sched *s;
    CHECK(tllm_sched_init(&s, e->m, NULL, &p, on_done, NULL) == TLLM_OK, "%s", tllm_errmsg());
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (i * 37 + 11) % 200;
    struct outcome o[4] = {0};
    struct tllm_sched_req rq = {.prompt = prompt, .n_prompt = 40, .sampling = tllm_sampler_defaults(), .max_new = 30};
    for (int i = 0; i < 3; i++) {
        rq.user = &o[i];
        rq.on_token = i == 2 ? on_token : NULL;
        rq.top_logprobs = 3;
        CHECK(tllm_sched_submit(s, &rq) == TLLM_OK, "submit");
    }
    /* one slot: o[0] runs, o[1] and o[2] wait; cancel o[1] while it waits and o[0] once it decodes */
    for (int i = 0; i < 3; i++) CHECK(tllm_sched_step(s) == TLLM_OK, "%s", tllm_errmsg());
    CHECK(tllm_sched_running(s) == 1 && tllm_sched_waiting(s) == 2, "%d running, %d waiting", tllm_sched_running(s),
          tllm_sched_waiting(s));
    CHECK(tllm_sched_cancel(s, &o[1]) == 1 && o[1].calls == 1 && o[1].finish == TLLM_FINISH_INTERRUPTED, "cancel waiting");
    CHECK(tllm_sched_cancel(s, &o[0]) == 1 && o[0].calls == 1 && o[0].finish == TLLM_FINISH_INTERRUPTED && o[0].n_gen > 0,
          "cancel running: %d calls, %d generated", o[0].calls, o[0].n_gen);
    CHECK(tllm_sched_cancel(s, &o[0]) == 0 && tllm_sched_cancel(s, &o[3]) == 0, "cancel what has ended, or never was");
    while (tllm_sched_running(s) || tllm_sched_waiting(s)) CHECK(tllm_sched_step(s) == TLLM_OK, "%s", tllm_errmsg());
    CHECK(o[2].calls == 1 && o[2].rc == TLLM_OK && o[2].n_gen == 30 && o[2].finish == TLLM_FINISH_LENGTH, "o[2] ran: %d %d",
          o[2].calls, o[2].n_gen);
    CHECK(o[2].n_reused == 32, "o[2] found o[0]'s two full prompt blocks: %d", o[2].n_reused);
    CHECK(o[2].n_tokens == 30 && o[2].lp_ok, "a consistent logprob per token: %d calls", o[2].n_tokens);
    int n_free, n_total;
    tllm_sched_kv_blocks(s, &n_free, &n_total);
    CHECK(n_free == n_total, "every block back: %d of %d", n_free, n_total);
    /* the same request alone gives the same tokens: cancelling the others changed nothing of it */
    rq.user = &o[3], rq.on_token = NULL;
    CHECK(tllm_sched_submit(s, &rq) == TLLM_OK, "submit");
    while (tllm_sched_running(s) || tllm_sched_waiting(s)) CHECK(tllm_sched_step(s) == TLLM_OK, "%s", tllm_errmsg());
    CHECK(o[3].n_gen == 30 && !memcmp(o[3].ids, o[2].ids, 30 * sizeof(int32_t)), "the same tokens alone");
    tllm_sched_free(s);
    tllm_engine_free(e);
    return check_done();
}
