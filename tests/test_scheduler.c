/* The scheduler's calls that the server relies on: cancelling a request that waits and one that runs
 * (each done callback once, as interrupted, every block back), per-token log probabilities (the
 * greedy token is the best alternative; alternatives sorted, at most one in total probability), and
 * the count of prompt tokens found cached; grammars' automata kept past their sequences (a request on a
 * schema whose sequences have ended walks no mask again; the oldest of more schemas than are kept is
 * let go).
 * usage: test_scheduler MODEL_DIR [TOKENIZER_JSON] (a checkpoint; the grammar part needs a tokenizer) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/api.h"
#include "base/error.h"
#include "engine/grammar/json_schema.h"
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

/* Run r (user o) alone to its end */
static void run_alone(struct tllm_sched *s, struct tllm_sched_req *r, struct outcome *o) {
    r->user = o;
    CHECK(tllm_sched_submit(s, r) == TLLM_OK, "submit");
    while (tllm_sched_running(s) || tllm_sched_waiting(s)) CHECK(tllm_sched_step(s) == TLLM_OK, "%s", tllm_errmsg());
    CHECK(o->calls == 1 && o->rc == TLLM_OK && o->n_gen > 0, "a grammar's request ran: %d calls, rc %d, %d tokens", o->calls, o->rc,
          o->n_gen);
}

static long long walks(const struct tllm_sched *s) {
    struct tllm_sched_stats st;
    tllm_sched_stats(s, &st);
    return st.grammar_walks;
}

static void test_kept_grammars(struct tllm_engine *e, const char *tok_json) {
    struct tllm_tok *tok;
    CHECK(tllm_tok_load(tok_json, &tok) == TLLM_OK, "%s", tllm_errmsg());
    struct tllm_sched_params p = {.n_parallel = 2, .kv_tokens = 1024, .kv_type = TLLM_DT_F32, .n_ctx = 512};
    struct tllm_sched *s;
    CHECK(tllm_sched_init(&s, e->m, tok, &p, on_done, NULL) == TLLM_OK, "%s", tllm_errmsg());
    enum { N_G = 6 }; /* more than are kept */
    struct tllm_grammar *g[N_G];
    for (int i = 0; i < N_G; i++) {
        char schema[200];
        snprintf(schema, sizeof schema, "{\"type\": \"object\", \"properties\": {\"k%d\": {\"type\": \"string\"}}, \"required\": [\"k%d\"]}", i, i);
        CHECK(tllm_schema_grammar_text(schema, "schema", &g[i]) == TLLM_OK, "%s", tllm_errmsg());
    }
    int32_t prompt[8], eos = 4095;
    for (int i = 0; i < 8; i++) prompt[i] = (i * 53 + 5) % 4000;
    struct tllm_sched_req rq = {.prompt = prompt, .n_prompt = 8, .sampling = tllm_sampler_defaults(), .max_new = 24, .eos = &eos,
                                .n_eos = 1, .grammar = g[0]};
    struct outcome o[N_G + 3] = {0};
    run_alone(s, &rq, &o[0]);
    long long w0 = walks(s);
    CHECK(w0 > 0, "the first request on a schema walks its masks (%lld)", w0);
    run_alone(s, &rq, &o[1]); /* its sequences have all ended: the kept automaton serves */
    CHECK(walks(s) == w0, "a request on a kept schema walked %lld masks again", walks(s) - w0);
    CHECK(o[1].n_gen == o[0].n_gen && !memcmp(o[1].ids, o[0].ids, (size_t)o[0].n_gen * sizeof(int32_t)), "the same tokens again");
    for (int i = 1; i < N_G; i++) { /* five other schemas: the first is let go */
        rq.grammar = g[i];
        run_alone(s, &rq, &o[1 + i]);
    }
    long long w1 = walks(s);
    rq.grammar = g[0];
    run_alone(s, &rq, &o[N_G + 1]);
    CHECK(walks(s) > w1, "the oldest of %d schemas is still kept", N_G);
    CHECK(o[N_G + 1].n_gen == o[0].n_gen && !memcmp(o[N_G + 1].ids, o[0].ids, (size_t)o[0].n_gen * sizeof(int32_t)),
          "the same tokens after its automaton was made anew");
    rq.grammar = g[N_G - 1];
    long long w2 = walks(s);
    run_alone(s, &rq, &o[N_G + 2]);
    CHECK(walks(s) == w2, "the newest schema is kept");
    tllm_sched_free(s);
    for (int i = 0; i < N_G; i++) tllm_grammar_free(g[i]);
    tllm_tok_free(tok);
    printf("  grammars: a kept schema walks no mask again (%lld walks the first time)\n", w0);
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
    if (argc > 2) test_kept_grammars(e, argv[2]);
    tllm_engine_free(e);
    return check_done();
}
