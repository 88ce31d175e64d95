#include "engine/run/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/ops.h"

struct tllm_sampler_params tllm_sampler_defaults(void) {
    return (struct tllm_sampler_params){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                        .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0};
}

int tllm_sampler_init(struct tllm_sampler *s, const struct tllm_sampler_params *p, int vocab) {
    memset(s, 0, sizeof *s);
    s->p = *p;
    if (s->p.repeat_last_n < 0) s->p.repeat_last_n = 0;
    s->vocab = vocab;
    s->cands = malloc((size_t)vocab * sizeof *s->cands);
    s->w = malloc((size_t)vocab * sizeof *s->w);
    s->recent = malloc((size_t)(s->p.repeat_last_n + 1) * sizeof *s->recent);
    if (!s->cands || !s->w || !s->recent) {
        tllm_sampler_free(s);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    tllm_sampler_reset(s);
    return TLLM_OK;
}

void tllm_sampler_free(struct tllm_sampler *s) {
    tllm_gmatch_free(s->gm);
    free(s->cands);
    free(s->w);
    free(s->recent);
    memset(s, 0, sizeof *s);
}

void tllm_sampler_reset(struct tllm_sampler *s) {
    s->n_recent = s->recent_pos = 0;
    s->rng = s->p.seed * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull;
}

void tllm_sampler_accept(struct tllm_sampler *s, int32_t id) {
    if (s->p.repeat_last_n == 0) return;
    s->recent[s->recent_pos] = id;
    s->recent_pos = (s->recent_pos + 1) % s->p.repeat_last_n;
    if (s->n_recent < s->p.repeat_last_n) s->n_recent++;
}

static double next_uniform(struct tllm_sampler *s) { /* [0, 1), splitmix64 */
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static void apply_penalties(struct tllm_sampler *s, float *logits) {
    const struct tllm_sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    for (int i = 0; i < s->n_recent; i++) {
        int32_t id = s->recent[i];
        int seen = 0, count = 0;
        for (int j = 0; j < s->n_recent; j++) {
            if (s->recent[j] != id) continue;
            if (j < i) seen = 1;
            count++;
        }
        if (seen || id < 0 || id >= s->vocab) continue; /* each distinct token once */
        float *l = &logits[id];
        if (p->repeat_penalty != 1.0f) *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        *l -= p->presence_penalty + p->frequency_penalty * (float)count;
    }
}

/* Min-heap on logit: the k largest of a[0..n) end up in a[0..k), then sorted descending. */
static void sift_down(struct tllm_sampler_cand *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < k && h[l].logit < h[m].logit) m = l;
        if (r < k && h[r].logit < h[m].logit) m = r;
        if (m == i) return;
        struct tllm_sampler_cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int cmp_desc(const void *a, const void *b) {
    float x = ((const struct tllm_sampler_cand *)a)->logit, y = ((const struct tllm_sampler_cand *)b)->logit;
    return x < y ? 1 : x > y ? -1 : ((const struct tllm_sampler_cand *)a)->id - ((const struct tllm_sampler_cand *)b)->id;
}

static void select_top(struct tllm_sampler_cand *c, int n, int k) {
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int i = k; i < n; i++)
        if (c[i].logit > c[0].logit) {
            struct tllm_sampler_cand t = c[0];
            c[0] = c[i];
            c[i] = t;
            sift_down(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, cmp_desc);
}

void tllm_sampler_limit(struct tllm_sampler *s, int n) {
    if (n > 0 && n < s->vocab) s->vocab = n;
}

void tllm_sampler_constrain(struct tllm_sampler *s, struct tllm_gmatch *gm) {
    tllm_gmatch_free(s->gm);
    s->gm = gm;
}

int tllm_sampler_is_masked_greedy(const struct tllm_sampler *s) {
    const struct tllm_sampler_params *p = &s->p;
    return (p->temperature <= 0.0f || p->top_k == 1) && p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f;
}

int tllm_sampler_is_greedy(const struct tllm_sampler *s) { return !s->gm && tllm_sampler_is_masked_greedy(s); }

int tllm_sampler_allowed(struct tllm_sampler *s, const int32_t **list, int *n, int *allows) {
    if (!s->gm) return 0;
    *list = tllm_gmatch_list(s->gm, n, allows);
    static const int32_t none[1];
    if (!*list) *list = none, *n = 0, *allows = 1;
    return 1;
}

int32_t tllm_sampler_take(struct tllm_sampler *s, int32_t id) {
    if (!s->gm) return id;
    if (id < 0 || id >= s->vocab || tllm_gmatch_accept(s->gm, id)) return tllm_gmatch_eos(s->gm);
    return id;
}

static int32_t pick(struct tllm_sampler *s, float *logits, const int32_t *only, int n_only);

int32_t tllm_sampler_sample(struct tllm_sampler *s, float *logits) {
    if (!s->gm) {
        apply_penalties(s, logits);
        return pick(s, logits, NULL, 0);
    }
    /* under a grammar: among the tokens it allows (a short list), or all but those it refuses */
    int n, allows;
    const int32_t *list = tllm_gmatch_list(s->gm, &n, &allows);
    if (!list) return tllm_gmatch_eos(s->gm);
    return tllm_sampler_take(s, tllm_sampler_sample_allowed(s, logits, list, n, allows));
}

int32_t tllm_sampler_sample_allowed(struct tllm_sampler *s, float *logits, const int32_t *list, int n, int allows) {
    apply_penalties(s, logits);
    if (allows && n == 0) return -1;
    if (!allows)
        for (int i = 0; i < n && list[i] < s->vocab; i++) logits[list[i]] = -INFINITY;
    return allows ? pick(s, logits, list, n) : pick(s, logits, NULL, 0);
}

/* The sample from logits, over ids only[0..n_only) (ascending) when given, else every id */
static int32_t pick(struct tllm_sampler *s, float *logits, const int32_t *only, int n_only) {
    const struct tllm_sampler_params *p = &s->p;
    int V = s->vocab;
    if (only)
        while (n_only > 0 && only[n_only - 1] >= V) n_only--;
    if (p->temperature <= 0.0f || p->top_k == 1) { /* greedy: the first maximum */
        if (!only) return tllm_argmax(logits, V);
        int32_t best = only[0];
        for (int i = 1; i < n_only; i++)
            if (logits[only[i]] > logits[best]) best = only[i];
        return best;
    }
    struct tllm_sampler_cand *c = s->cands;
    float inv_t = 1.0f / p->temperature;
    int n = only ? n_only : V;
    for (int i = 0; i < n; i++) {
        int32_t id = only ? only[i] : i;
        c[i] = (struct tllm_sampler_cand){id, logits[id] * inv_t};
    }
    int sorted = p->top_k > 0 && p->top_k < n;
    if (sorted) {
        select_top(c, n, p->top_k);
        n = p->top_k;
    }
    /* softmax weights over the n candidates (not normalized yet) */
    float mx = c[0].logit;
    for (int i = 1; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    if (p->top_p < 1.0f) {
        double total = 0;
        for (int i = 0; i < n; i++) total += expf(c[i].logit - mx);
        /* widen a sorted prefix until it holds top_p of the mass */
        int k = sorted ? n : (n < 64 ? n : 64);
        for (;;) {
            if (!sorted || k > n) select_top(c, n, k < n ? k : n);
            double cum = 0;
            int cut = -1;
            for (int i = 0; i < k && i < n; i++) {
                cum += expf(c[i].logit - mx);
                if (cum >= p->top_p * total) {
                    cut = i + 1;
                    break;
                }
            }
            if (cut > 0 || k >= n) {
                n = cut > 0 ? cut : n;
                sorted = 1;
                break;
            }
            k = k * 4 < n ? k * 4 : n;
        }
    }
    if (p->min_p > 0.0f) { /* keep tokens with prob >= min_p * max prob */
        float floor_logit = mx + logf(p->min_p);
        int k = 0;
        for (int i = 0; i < n; i++)
            if (c[i].logit >= floor_logit) c[k++] = c[i];
        n = k > 0 ? k : 1;
    }
    /* each weight computed once, in float (a vocabulary of weights in double, three times over, was
     * most of a sampled token's time: 3.9 ms at 152k, more than a 0.5B forward step per token) */
    float *w = s->w;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (w[i] = expf(c[i].logit - mx));
    double r = next_uniform(s) * sum;
    int32_t last = c[0].id; /* rounding left r >= 0: the last candidate with any weight (never a masked one) */
    for (int i = 0; i < n; i++) {
        r -= w[i];
        if (r < 0) return c[i].id;
        if (w[i] > 0) last = c[i].id;
    }
    return last;
}
