/* The sampler: greedy, seeded reproducibility, the distribution it draws from, and each filter. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "engine/run/sampler.h"

#define V 1000
#define DRAWS 200000
#define TOL_FREQ 0.01 /* |observed - expected| frequency, ~4 sigma at DRAWS */

static void fill_logits(float *l) {
    for (int i = 0; i < V; i++) l[i] = (float)(-0.01 * i + 0.5 * sin(i)); /* descending-ish, no ties */
    l[700] = 5.0f;                                                   /* a clear maximum, not at 0 */
}

static int32_t draw(struct tllm_sampler *s, const float *base) {
    float l[V];
    memcpy(l, base, sizeof l);
    return tllm_sampler_sample(s, l);
}

int main(void) {
    float base[V];
    fill_logits(base);
    struct tllm_sampler s;
    struct tllm_sampler_params p = tllm_sampler_defaults();

    /* greedy, and top-k 1 equals greedy at any temperature */
    tllm_sampler_init(&s, &p, V);
    CHECK(draw(&s, base) == 700, "greedy");
    tllm_sampler_free(&s);
    p.temperature = 1.5f;
    p.top_k = 1;
    tllm_sampler_init(&s, &p, V);
    int all = 1;
    for (int i = 0; i < 100; i++) all &= draw(&s, base) == 700;
    CHECK(all, "top-k 1 is not greedy");
    tllm_sampler_free(&s);

    /* temperature 1, no filters: frequencies follow softmax */
    p = tllm_sampler_defaults();
    p.temperature = 1.0f;
    p.seed = 1;
    float flat[V];
    for (int i = 0; i < V; i++) flat[i] = i < 4 ? logf((float)(i + 1)) : -1e9f; /* probs 0.1 0.2 0.3 0.4 */
    tllm_sampler_init(&s, &p, V);
    int count[4] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = draw(&s, flat);
        if (t < 4) count[t]++;
    }
    for (int k = 0; k < 4; k++)
        CHECK(fabs(count[k] / (double)DRAWS - (k + 1) / 10.0) < TOL_FREQ, "token %d frequency %.4f, expected %.1f", k,
              count[k] / (double)DRAWS, (k + 1) / 10.0);
    tllm_sampler_free(&s);

    /* top-p 0.65 keeps {3, 2} (0.4 + 0.3 >= 0.65): renormalized 4/7, 3/7 */
    p.top_p = 0.65f;
    tllm_sampler_init(&s, &p, V);
    memset(count, 0, sizeof count);
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = draw(&s, flat);
        if (t < 4) count[t]++;
    }
    CHECK(count[0] == 0 && count[1] == 0, "top-p let through tokens outside the nucleus (%d, %d)", count[0], count[1]);
    CHECK(fabs(count[3] / (double)DRAWS - 4.0 / 7) < TOL_FREQ, "top-p frequency %.4f", count[3] / (double)DRAWS);
    tllm_sampler_free(&s);

    /* min-p 0.6: keep p >= 0.6 * 0.4 = 0.24, i.e. tokens 2 and 3 */
    p.top_p = 1.0f;
    p.min_p = 0.6f;
    tllm_sampler_init(&s, &p, V);
    memset(count, 0, sizeof count);
    for (int i = 0; i < DRAWS / 10; i++) {
        int32_t t = draw(&s, flat);
        if (t < 4) count[t]++;
    }
    CHECK(count[0] == 0 && count[1] == 0 && count[2] > 0 && count[3] > 0, "min-p: %d %d %d %d", count[0], count[1],
          count[2], count[3]);
    tllm_sampler_free(&s);

    /* top-k 2 with temperature: only the two best */
    p = tllm_sampler_defaults();
    p.temperature = 2.0f;
    p.top_k = 2;
    tllm_sampler_init(&s, &p, V);
    memset(count, 0, sizeof count);
    for (int i = 0; i < 10000; i++) {
        int32_t t = draw(&s, flat);
        if (t < 4) count[t]++;
    }
    CHECK(count[0] + count[1] == 0 && count[2] + count[3] == 10000, "top-k 2");
    tllm_sampler_free(&s);

    /* the same seed gives the same sequence; another seed another one */
    p = tllm_sampler_defaults();
    p.temperature = 1.0f;
    p.top_p = 0.95f;
    int32_t a[64], b[64], c[64];
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 99 : 7;
        tllm_sampler_init(&s, &p, V);
        for (int i = 0; i < 64; i++) (run == 0 ? a : run == 1 ? b : c)[i] = draw(&s, base);
        tllm_sampler_free(&s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed, different tokens");
    CHECK(memcmp(a, c, sizeof a) != 0, "different seeds, same 64 tokens");

    /* repetition penalty (HF): positive logits divided, negative multiplied; presence/frequency subtract */
    p = tllm_sampler_defaults();
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    tllm_sampler_init(&s, &p, V);
    tllm_sampler_accept(&s, 700);
    tllm_sampler_accept(&s, 5);
    tllm_sampler_accept(&s, 700);
    float l[V];
    memcpy(l, base, sizeof l);
    tllm_sampler_sample(&s, l);
    CHECK(fabsf(l[700] - (5.0f / 2 - 0.5f - 0.25f * 2)) < 1e-6f, "penalized positive logit %f", l[700]);
    float expect5 = (base[5] > 0 ? base[5] / 2 : base[5] * 2) - 0.5f - 0.25f;
    CHECK(fabsf(l[5] - expect5) < 1e-6f, "penalized logit %f, expected %f", l[5], expect5);
    CHECK(l[6] == base[6], "an unseen token was penalized");
    tllm_sampler_free(&s);

    /* the window: only the last repeat_last_n tokens count */
    p = tllm_sampler_defaults();
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    tllm_sampler_init(&s, &p, V);
    tllm_sampler_accept(&s, 700);
    tllm_sampler_accept(&s, 1);
    tllm_sampler_accept(&s, 2);
    memcpy(l, base, sizeof l);
    tllm_sampler_sample(&s, l);
    CHECK(l[700] == base[700], "a token outside the window was penalized");
    tllm_sampler_free(&s);
    return check_done();
}
