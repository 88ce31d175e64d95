/* Many sequences at once on the OpenCL device (engine/backend/opencl/cl_paged.c; PoCL in CI), on every
 * fixture given, float and int8 activations, f16 and f32 caches: a sequence's logits are the same bits
 * alone and among others (prompt chunks of some beside decode tokens of others, steps of any size,
 * split-K forced too); they match the transformers reference and the CPU's batched steps; greedy ids
 * agree with the CPU's; the device's argmaxes are the host's; a shared block written after a
 * truncation is copied on the device (copy on write); per-row outputs (logits of some rows, masked
 * argmaxes of others) are those of a step of logits; malformed steps get messages. Attention split into
 * spans of positions is checked with spans short enough for the fixtures, and o_proj's input left by
 * flash_combine against pf_norm's, bit for bit, and gemm_few_norm's norms against pf_norm's launches. */
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "engine/backend/registry.h"
#include "base/error.h"
#include "engine/load/model.h"
#include "engine/run/kv_cache.h"
#include "tests/reference.h"

/* The device's batched steps against the reference as decode's (float activations, or int8 in two levels
 * as every token of a device step is quantized by default), and with one level (--fast-decode, batch
 * generation's default; on the CPU as there) or against the CPU's one-level int8 steps by one-level
 * int8 noise (tests/test_opencl.c says why) */
#define TOL_BATCH_REL_RMS 1e-3
#define TOL_BATCH_INT8_REL_RMS 4e-2
#define MIN_BATCH_INT8_ARGMAX_AGREEMENT 0.9
#define MARGIN_MIN_BATCH 1e-2
#define N_SEQ 5
#define N_GEN 6
#define BUDGET 11 /* prompt tokens a step at most, beside the decode tokens (odd: chunks end mid-block) */

struct plan {
    int n;                          /* sequences */
    const int32_t *prompt[N_SEQ];
    int n_prompt[N_SEQ];
    int budget;                     /* prompt tokens a step (0: all of one sequence's at once) */
};

struct outcome {
    float *logits[N_SEQ];   /* [1 + N_GEN][vocab]: the last prompt token's, then each generated token's */
    int32_t ids[N_SEQ][N_GEN + 1];
    float *all0;            /* [n_prompt[0]][vocab]: every prompt position of sequence 0 (want_all) */
};

static void outcome_free(struct outcome *o) {
    for (int i = 0; i < N_SEQ; i++) free(o->logits[i]);
    free(o->all0);
    memset(o, 0, sizeof *o);
}

/* Sequences `only` (or all, only < 0) of the plan through b bound to a fresh cache of kv_type, in the
 * scheduler's order: each step the decoding sequences' tokens, then prompt chunks within the budget;
 * greedy picks from the logits (use_argmax: the step's argmaxes, the logits asked too for checking) */
static int run_plan(struct tllm_backend *b, const struct tllm_model *m, enum tllm_dtype kv_type, const struct plan *pl, int only,
                    int want_all, int use_argmax, struct outcome *o) {
    const struct tllm_config *c = &m->cfg;
    size_t vocab = (size_t)c->vocab_size;
    struct tllm_kv *kv;
    int total = 0;
    memset(o, 0, sizeof *o);
    for (int i = 0; i < pl->n; i++) total += pl->n_prompt[i] + N_GEN;
    if (tllm_kv_init(&kv, c->n_layers, c->n_kv_heads, c->head_dim, total + 64, kv_type, N_SEQ)) return -1;
    struct tllm_backend *cpu = NULL, *run = b;
    if (!b) {
        if (tllm_backend_cpu_init(&cpu, m, kv, 512)) return -1;
        run = cpu;
    } else if (b->ops->use_kv(b, kv)) {
        tllm_kv_free(kv);
        return -1;
    }
    int seq[N_SEQ], done[N_SEQ] = {0}, gen[N_SEQ] = {0}, rc = 0;
    int32_t ids[512], pos[512], sq[512], amax[512];
    int8_t out[512];
    int row_of[512];
    float *lg = malloc(512 * vocab * sizeof(float));
    for (int i = 0; i < pl->n; i++) {
        if (only >= 0 && i != only) continue;
        o->logits[i] = calloc((N_GEN + 1) * vocab, sizeof(float));
        if (tllm_kv_seq_open(kv, &seq[i]) || tllm_kv_seq_reserve(kv, seq[i], pl->n_prompt[i] + N_GEN)) rc = -1;
    }
    if (want_all) o->all0 = calloc((size_t)pl->n_prompt[0] * vocab, sizeof(float));
    while (!rc) {
        int n = 0, n_out = 0;
        for (int i = 0; i < pl->n; i++) /* decode tokens first */
            if ((only < 0 || i == only) && done[i] == pl->n_prompt[i] && gen[i] < N_GEN) {
                ids[n] = o->ids[i][gen[i]], pos[n] = done[i] + gen[i], sq[n] = seq[i], out[n] = 1, row_of[n] = i;
                n++;
            }
        int budget = pl->budget ? pl->budget : 512 - n;
        for (int i = 0; i < pl->n && budget > 0; i++) {
            if ((only >= 0 && i != only) || done[i] == pl->n_prompt[i]) continue;
            int k = pl->n_prompt[i] - done[i] < budget ? pl->n_prompt[i] - done[i] : budget;
            for (int j = 0; j < k; j++, n++) {
                ids[n] = pl->prompt[i][done[i] + j], pos[n] = done[i] + j, sq[n] = seq[i], row_of[n] = i;
                out[n] = done[i] + j == pl->n_prompt[i] - 1 || (want_all && i == 0);
            }
            budget -= k;
        }
        if (n == 0) break;
        for (int t = 0; t < n; t++) n_out += out[t];
        struct tllm_batch bt = {.n = n, .id = ids, .pos = pos, .seq = sq, .out = out, .n_gen = 0};
        if ((rc = run->ops->step(run, &bt, lg, use_argmax ? amax : NULL))) break;
        int r = 0;
        for (int t = 0; t < n; t++) {
            int i = row_of[t];
            if (!out[t]) continue;
            const float *row = lg + (size_t)r * vocab;
            if (want_all && i == 0 && pos[t] < pl->n_prompt[0]) memcpy(o->all0 + (size_t)pos[t] * vocab, row, vocab * sizeof(float));
            if (pos[t] >= pl->n_prompt[i] - 1) { /* the last prompt token, or a generated one */
                int g = pos[t] - (pl->n_prompt[i] - 1);
                memcpy(o->logits[i] + (size_t)g * vocab, row, vocab * sizeof(float));
                int32_t pick = argmax_f32(row, m->n_sample < c->vocab_size ? m->n_sample : c->vocab_size);
                if (use_argmax) CHECK(amax[r] == pick, "the device's argmax %d, the host's %d", amax[r], pick);
                o->ids[i][g] = pick;
            }
            r++;
        }
        for (int t = 0; t < n;) { /* commit each sequence's run */
            int t1 = t;
            while (t1 < n && sq[t1] == sq[t]) t1++;
            if ((rc = tllm_kv_seq_commit(kv, sq[t], ids + t, t1 - t))) break;
            int i = row_of[t];
            if (done[i] < pl->n_prompt[i]) done[i] += t1 - t;
            else gen[i]++;
            t = t1;
        }
    }
    free(lg);
    tllm_backend_free(cpu);
    if (b) b->ops->use_kv(b, NULL);
    tllm_kv_free(kv);
    return rc;
}

static double worst_rms(const float *a, const float *b, int rows, int vocab) {
    double worst = 0;
    for (int j = 0; j < rows; j++) {
        double rms, mx;
        ref_compare_row(a + (size_t)j * vocab, b + (size_t)j * vocab, vocab, &rms, &mx);
        worst = rms > worst ? rms : worst;
    }
    return worst;
}

/* A block shared by two sequences, kept in part by one after a truncation and then written there: the
 * device copies it first, so the other's logits do not change and the writer's equal a fresh run's */
static void test_copy_on_write(struct tllm_backend *cl, const struct tllm_model *m, const struct ref_fixture *r) {
    const struct tllm_config *c = &m->cfg;
    size_t vocab = (size_t)c->vocab_size;
    int n = r->n_seq < 40 ? r->n_seq : 40, keep = 20;
    if (n < 34) return; /* needs two full blocks and a bit */
    struct tllm_kv *kv;
    CHECK(tllm_kv_init(&kv, c->n_layers, c->n_kv_heads, c->head_dim, 256, TLLM_DT_F16, 3) == TLLM_OK, "kv");
    CHECK(cl->ops->use_kv(cl, kv) == TLLM_OK, "use_kv: %s", tllm_errmsg());
    int a, b, f;
    int32_t pos[64], sq[64], amax[64];
    int8_t out[64];
    float *la = malloc(2 * vocab * sizeof(float)), *lb = malloc(2 * vocab * sizeof(float)), *lf = malloc(2 * vocab * sizeof(float));
    /* a: n tokens; b reuses a's two full blocks, then keeps 20 positions and takes other tokens there */
    tllm_kv_seq_open(kv, &a);
    tllm_kv_seq_reserve(kv, a, n + 1);
    for (int t = 0; t < n; t++) pos[t] = t, sq[t] = a, out[t] = t == n - 1;
    struct tllm_batch ba = {.n = n, .id = r->sequence, .pos = pos, .seq = sq, .out = out, .n_gen = 0};
    CHECK(cl->ops->step(cl, &ba, la, NULL) == TLLM_OK, "a: %s", tllm_errmsg());
    tllm_kv_seq_commit(kv, a, r->sequence, n);
    tllm_kv_seq_open(kv, &b);
    CHECK(tllm_kv_seq_reuse(kv, b, r->sequence, n) == 32, "b reuses a's two blocks");
    tllm_kv_seq_truncate(kv, b, keep);
    CHECK(tllm_kv_seq_reserve(kv, b, keep + 4) == TLLM_OK && kv->n_copies == 1, "b's kept block is copied on write (%d)",
          kv->n_copies);
    int32_t other[4];
    for (int t = 0; t < 4; t++) other[t] = (r->sequence[t] + 7) % c->vocab_size, pos[t] = keep + t, sq[t] = b, out[t] = t == 3;
    struct tllm_batch bb = {.n = 4, .id = other, .pos = pos, .seq = sq, .out = out, .n_gen = 0};
    CHECK(cl->ops->step(cl, &bb, lb, amax) == TLLM_OK, "b: %s", tllm_errmsg());
    CHECK(kv->n_copies == 0, "the device took the copy");
    tllm_kv_seq_commit(kv, b, other, 4);
    /* f: b's tokens from scratch */
    int32_t fresh[64];
    memcpy(fresh, r->sequence, (size_t)keep * sizeof *fresh);
    memcpy(fresh + keep, other, sizeof other);
    tllm_kv_seq_open(kv, &f);
    tllm_kv_seq_reserve(kv, f, keep + 4);
    for (int t = 0; t < keep + 4; t++) pos[t] = t, sq[t] = f, out[t] = t == keep + 3;
    struct tllm_batch bf = {.n = keep + 4, .id = fresh, .pos = pos, .seq = sq, .out = out, .n_gen = 0};
    CHECK(cl->ops->step(cl, &bf, lf, NULL) == TLLM_OK, "f: %s", tllm_errmsg());
    CHECK(!memcmp(lb, lf, vocab * sizeof(float)), "after copy on write: the writer's logits are not a fresh run's");
    /* a's next token still sees its own block */
    int32_t nx = r->sequence[0];
    pos[0] = n, sq[0] = a, out[0] = 1;
    struct tllm_batch ba2 = {.n = 1, .id = &nx, .pos = pos, .seq = sq, .out = out, .n_gen = 0};
    CHECK(cl->ops->step(cl, &ba2, la + vocab, NULL) == TLLM_OK, "a again: %s", tllm_errmsg());
    tllm_kv_seq_commit(kv, a, &nx, 1);
    /* malformed steps: messages, no crash */
    pos[0] = 3, sq[0] = a;
    CHECK(cl->ops->step(cl, &ba2, la, NULL) != TLLM_OK && strstr(tllm_errmsg(), "does not follow"), "a position out of order: %s",
          tllm_errmsg());
    pos[0] = 0, sq[0] = 2 + N_SEQ;
    CHECK(cl->ops->step(cl, &ba2, la, NULL) != TLLM_OK && strstr(tllm_errmsg(), "not open"), "a closed sequence: %s", tllm_errmsg());
    printf("  copy on write: the writer's logits are a fresh run's, bit for bit\n");
    free(la), free(lb), free(lf);
    cl->ops->use_kv(cl, NULL);
    tllm_kv_free(kv);
}

/* Masks given late, through a batch's fill_masks (as the scheduler gives a grammar's): these, or a failure */
struct late_masks {
    const int32_t *mask;
    const uint32_t *allow;
    int fail, calls;
};
static int give_masks(void *user, const int32_t **mask, const uint32_t **allow) {
    struct late_masks *lm = user;
    lm->calls++;
    if (lm->fail) return tllm_fail(TLLM_ERR_NOMEM, "test: no masks this time");
    *mask = lm->mask, *allow = lm->allow;
    return TLLM_OK;
}

/* One step of N_ROWS sequences' prompts on a fresh cache through b (NULL: the CPU backend); late:
 * the masks come through fill_masks instead of mask and allow */
#define N_ROWS 6
static int one_step(struct tllm_backend *b, const struct tllm_model *m, const struct ref_fixture *r, const int8_t *want,
                    const int32_t *mask, const uint32_t *allow, struct late_masks *late, float *lg, int32_t *amax) {
    const struct tllm_config *c = &m->cfg;
    struct tllm_kv *kv;
    struct tllm_backend *cpu = NULL, *run;
    int32_t ids[64], pos[64], sq[64];
    int8_t out[64];
    int n = 0, rc = tllm_kv_init(&kv, c->n_layers, c->n_kv_heads, c->head_dim, 256, TLLM_DT_F16, N_ROWS);
    if (rc) return rc;
    rc = b ? b->ops->use_kv(b, kv) : tllm_backend_cpu_init(&cpu, m, kv, 64);
    run = b ? b : cpu;
    for (int i = 0; i < N_ROWS && !rc; i++) {
        int s, len = 2 + i;
        if ((rc = tllm_kv_seq_open(kv, &s)) || (rc = tllm_kv_seq_reserve(kv, s, len))) break;
        for (int t = 0; t < len; t++, n++)
            ids[n] = r->sequence[(i + t) % r->n_seq], pos[n] = t, sq[n] = s, out[n] = t == len - 1;
    }
    struct tllm_batch bt = {.n = n, .id = ids, .pos = pos, .seq = sq, .out = out, .want_logits = want, .mask = mask, .allow = allow,
                            .fill_masks = late ? give_masks : NULL, .user = late};
    if (!rc) rc = run->ops->step(run, &bt, lg, amax);
    if (b) b->ops->use_kv(b, NULL);
    tllm_backend_free(cpu);
    tllm_kv_free(kv);
    return rc;
}

/* The oracle of a masked argmax: the first largest allowed logit (-1: none allowed) */
static int32_t allowed_argmax(const float *x, int n, const uint32_t *bits) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if ((bits[i / 32] >> (i % 32) & 1) && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

/* Per-row outputs of a step (the scheduler's: greedy rows bring back their argmax, under a grammar's
 * mask, sampling rows their logits): the wanted rows' logits are those of a step that brings back
 * every row's, bit for bit; each argmax is the oracle's on those logits; a row with nothing allowed
 * gets an id outside the vocabulary */
static void test_row_outputs(struct tllm_backend *b, struct tllm_model *m, const struct ref_fixture *r) {
    int vocab = m->cfg.vocab_size, n_cand = m->n_sample < vocab ? m->n_sample : vocab, words = TLLM_MASK_WORDS(vocab);
    float *all = malloc((size_t)N_ROWS * vocab * sizeof(float)), *lg = malloc((size_t)N_ROWS * vocab * sizeof(float));
    uint32_t *allow = calloc(4 * (size_t)words, sizeof *allow);
    int32_t amax[N_ROWS];
    CHECK(one_step(b, m, r, NULL, NULL, NULL, NULL, all, NULL) == TLLM_OK, "every row's logits: %s", tllm_errmsg());
    /* row 3: every third id but the row's own argmax; row 4: none; row 5: id 5 alone; row 1: all but its
     * own argmax (whole words) */
    int32_t top3 = argmax_f32(all + 3 * (size_t)vocab, n_cand), top1 = argmax_f32(all + (size_t)vocab, n_cand);
    for (int i = 1; i < vocab; i += 3)
        if (i != top3) allow[i / 32] |= 1u << (i % 32);
    allow[2 * words + 5 / 32] |= 1u << (5 % 32);
    for (int i = 0; i < vocab; i++)
        if (i != top1) allow[3 * words + i / 32] |= 1u << (i % 32);
    int8_t want[N_ROWS] = {1, 0, 1, 0, 0, 0};
    int32_t mask[N_ROWS] = {-1, 3, -1, 0, 1, 2};
    for (size_t i = 0; i < (size_t)N_ROWS * vocab; i++) lg[i] = -1.0f;
    CHECK(one_step(b, m, r, want, mask, allow, NULL, lg, amax) == TLLM_OK, "per-row outputs: %s", tllm_errmsg());
    for (int j = 0; j < N_ROWS; j++) {
        const float *row = all + (size_t)j * vocab;
        if (want[j]) CHECK(!memcmp(lg + (size_t)j * vocab, row, vocab * sizeof(float)), "row %d's logits differ from a step of all rows'", j);
        int32_t expect = mask[j] < 0 ? argmax_f32(row, n_cand) : allowed_argmax(row, n_cand, allow + (size_t)mask[j] * words);
        if (expect < 0) CHECK(amax[j] < 0 || amax[j] >= vocab, "row %d allows nothing, yet its argmax is %d", j, amax[j]);
        else CHECK(amax[j] == expect, "row %d: argmax %d, the oracle's %d", j, amax[j], expect);
    }
    CHECK(amax[1] != top1 && amax[3] != top3 && amax[5] == 5, "the masks were not applied (%d, %d, %d)", amax[1], amax[3], amax[5]);
    /* the same masks given once the layers are queued: the same picks; a failure there fails the step
     * with its message, and the next step runs */
    struct late_masks late = {mask, allow, 0, 0};
    int32_t amax2[N_ROWS];
    CHECK(one_step(b, m, r, want, NULL, NULL, &late, lg, amax2) == TLLM_OK && late.calls == 1, "late masks: %s (%d calls)",
          tllm_errmsg(), late.calls);
    CHECK(!memcmp(amax, amax2, sizeof amax), "masks given late pick other ids than the same masks given with the step");
    late.fail = 1;
    CHECK(one_step(b, m, r, want, NULL, NULL, &late, lg, amax2) != TLLM_OK && strstr(tllm_errmsg(), "no masks this time"),
          "a failing fill_masks: %s", tllm_errmsg());
    CHECK(one_step(b, m, r, NULL, NULL, NULL, NULL, lg, NULL) == TLLM_OK && !memcmp(lg, all, (size_t)N_ROWS * vocab * sizeof(float)),
          "the step after a failed one: %s", tllm_errmsg());
    /* candidates not a multiple of 4 (the device reads float4s, the last n % 4 ids one each): row 0 free,
     * row 3 allowed ids 4 and 5 past the last float4 (n4 = the ids the float4s cover) and one past n_sample */
    int n_sample = m->n_sample, cut = n_cand - 3, n4 = cut / 4 * 4;
    m->n_sample = cut;
    memset(allow, 0, 4 * (size_t)words * sizeof *allow);
    for (int i = n4 - 8; i <= cut && i < vocab; i++)
        if (i < n4 - 4 || i >= n4) allow[i / 32] |= 1u << (i % 32);
    for (size_t i = 0; i < (size_t)N_ROWS * vocab; i++) lg[i] = -1.0f;
    CHECK(one_step(b, m, r, want, mask, allow, NULL, lg, amax) == TLLM_OK, "per-row outputs of %d candidates: %s", cut, tllm_errmsg());
    CHECK(amax[0] == argmax_f32(all, cut), "%d candidates, row 0: argmax %d, the oracle's %d", cut, amax[0], argmax_f32(all, cut));
    CHECK(amax[3] == allowed_argmax(all + 3 * (size_t)vocab, cut, allow), "%d candidates, row 3: argmax %d, the oracle's %d", cut,
          amax[3], allowed_argmax(all + 3 * (size_t)vocab, cut, allow));
    m->n_sample = n_sample;
    printf("  per-row outputs (%s): wanted logits bit for bit, masked argmaxes the oracle's\n", b ? "device" : "CPU");
    free(all), free(lg), free(allow);
}

static void test_fixture(const char *dir, int device, int packed, int levels) {
    struct ref_fixture r;
    struct tllm_model *m;
    printf("%s%s\n", dir, !packed ? "" : levels == 2 ? " (packed)" : " (packed, one int8 level)");
    if (ref_load_model(dir, packed, &r, &m) != 0) {
        CHECK(0, "%s: cannot load", dir);
        return;
    }
    m->decode_levels = levels; /* the device's every token, the CPU's generated ones */
    struct tllm_backend *cl = NULL;
    if (tllm_backend_device_init(&cl, m, 16, device) != TLLM_OK) {
        printf("  no device form of this model (%s): skipped\n", tllm_errmsg());
        goto out;
    }
    int vocab = m->cfg.vocab_size, n = r.n_seq;
    struct plan pl = {N_SEQ, {r.sequence, r.prompt_ids, r.sequence + 3, r.sequence + 1, r.sequence}, {n, r.n_prompt, 1, n - 4, 7},
                      BUDGET};
    for (int i = 0; i < N_SEQ; i++) pl.n_prompt[i] = pl.n_prompt[i] < 1 ? 1 : pl.n_prompt[i];
    int int8 = packed && m->layers[0].wq.pack; /* the CPU's steps take one-level int8 activations */
    int one_level = int8 && levels == 1;
    double tol = one_level ? TOL_BATCH_INT8_REL_RMS : TOL_BATCH_REL_RMS, tol_cpu = int8 ? TOL_BATCH_INT8_REL_RMS : TOL_BATCH_REL_RMS;
    for (int f32 = 0; f32 < 2; f32++) {
        enum tllm_dtype kt = f32 ? TLLM_DT_F32 : TLLM_DT_F16;
        struct outcome all, alone, cpu;
        CHECK(run_plan(cl, m, kt, &pl, -1, 1, 1, &all) == TLLM_OK, "%s: together: %s", dir, tllm_errmsg());
        int same_bits = 1;
        for (int i = 0; i < N_SEQ; i++) { /* each sequence alone, its prompt in one step */
            struct plan one = pl;
            one.budget = 0;
            CHECK(run_plan(cl, m, kt, &one, i, 0, 0, &alone) == TLLM_OK, "%s: alone: %s", dir, tllm_errmsg());
            same_bits &= !memcmp(alone.logits[i], all.logits[i], (size_t)(N_GEN + 1) * vocab * sizeof(float));
            CHECK(!memcmp(alone.ids[i], all.ids[i], sizeof alone.ids[i]), "%s: sequence %d's ids alone differ", dir, i);
            outcome_free(&alone);
        }
        CHECK(same_bits, "%s (%s cache): a sequence's logits among others are not those it has alone", dir, f32 ? "f32" : "f16");
        /* split-K (the same slices whatever the step's size): alone = together again */
        setenv("TLLM_CL_SPLIT", "3", 1);
        struct outcome split_all, split_one;
        struct plan one = pl;
        one.budget = 0;
        CHECK(run_plan(cl, m, kt, &pl, -1, 0, 0, &split_all) == TLLM_OK && run_plan(cl, m, kt, &one, 3, 0, 0, &split_one) == TLLM_OK,
              "%s: split-K: %s", dir, tllm_errmsg());
        unsetenv("TLLM_CL_SPLIT");
        CHECK(!memcmp(split_all.logits[3], split_one.logits[3], (size_t)(N_GEN + 1) * vocab * sizeof(float)),
              "%s: split-K: a sequence among others is not itself alone", dir);
        double split_rms = worst_rms(split_all.logits[3], all.logits[3], N_GEN + 1, vocab);
        CHECK(split_rms <= tol, "%s: split-K moved the logits by %.3g", dir, split_rms);
        outcome_free(&split_all), outcome_free(&split_one);
        /* the transformers reference (sequence 0's every position) and the CPU's batched steps */
        double ref = 0;
        for (int j = 0; j < r.n_logits_rows; j++) {
            double rms, mx;
            ref_compare_row(r.logits + (size_t)j * vocab, all.all0 + (size_t)r.logits_rows[j] * vocab, vocab, &rms, &mx);
            ref = rms > ref ? rms : ref;
        }
        CHECK(ref <= tol, "%s: batched steps against the reference: relative RMS %.3g > %.3g", dir, ref, tol);
        int agree = 0, compared = 0;
        for (int p = 0; p < n - 1; p++) {
            if (r.margins[p] <= MARGIN_MIN_BATCH) continue;
            compared++;
            agree += argmax_f32(all.all0 + (size_t)p * vocab, vocab) == r.top1[p];
        }
        CHECK(agree >= (one_level ? MIN_BATCH_INT8_ARGMAX_AGREEMENT : 1.0) * compared, "%s: batched argmax %d/%d", dir, agree,
              compared);
        CHECK(run_plan(NULL, m, kt, &pl, -1, 0, 0, &cpu) == TLLM_OK, "%s: CPU: %s", dir, tllm_errmsg());
        double worst_cpu = 0;
        int ids_same = 1;
        for (int i = 0; i < N_SEQ; i++) {
            double w = worst_rms(cpu.logits[i], all.logits[i], 1, vocab); /* the prompt's: greedy ids may part later */
            worst_cpu = w > worst_cpu ? w : worst_cpu;
            ids_same &= !memcmp(cpu.ids[i], all.ids[i], sizeof cpu.ids[i]);
        }
        CHECK(worst_cpu <= tol_cpu, "%s: against the CPU's batched steps: relative RMS %.3g", dir, worst_cpu);
        if (!int8) CHECK(ids_same, "%s: greedy ids differ from the CPU's", dir);
        printf("  %s cache: alone = together bit for bit; reference rel RMS %.2e, argmax %d/%d; CPU %.2e, greedy ids %s\n",
               f32 ? "f32" : "f16", ref, agree, compared, worst_cpu, ids_same ? "the same" : "part (int8 near-ties)");
        outcome_free(&all), outcome_free(&cpu);
    }
    test_copy_on_write(cl, m, &r);
    test_row_outputs(cl, m, &r);
    test_row_outputs(NULL, m, &r);
    tllm_backend_free(cl);
out:
    tllm_model_free(m);
    ref_free(&r);
}

/* A step's kernels as the default fuses them against the launches they save: the same bits, float and
 * int8 in one and two levels, f16 cache, the plan's steps and sequence 2 alone (steps of one token). The
 * second run compiles with opts and extra (-DFL_EMIT=0: o_proj's input from a pf_norm of its own rather
 * than flash_combine), or has env set: TLLM_CL_NO_FEW_NORM (a pf_norm launch after o_proj's and
 * down_proj's gemm_few in one-token steps, not gemm_few_norm's epilogue) or TLLM_CL_NO_FEW_ROPE (a
 * paged_rope launch after q, k, v's gemm_few in steps of 1-2 tokens, not gemm_few_rope's epilogue).
 * int8_only: gemm_few takes int8 inputs only, so float has nothing to compare. */
static void test_fused(const char *dir, int device, const char *opts, const char *extra, const char *env, int int8_only,
                       const char *what) {
    char o0[600];
    snprintf(o0, sizeof o0, "%s %s", opts, extra);
    for (int packed = int8_only; packed < 2; packed++)
        for (int levels = 2; levels >= 2 - packed; levels--) {
            struct ref_fixture r;
            struct tllm_model *m;
            if (ref_load_model(dir, packed, &r, &m) != 0) {
                CHECK(0, "%s: cannot load", dir);
                return;
            }
            m->decode_levels = levels;
            struct plan pl = {N_SEQ, {r.sequence, r.prompt_ids, r.sequence + 3, r.sequence + 1, r.sequence},
                              {r.n_seq, r.n_prompt, 1, r.n_seq - 4, 7}, BUDGET};
            for (int i = 0; i < N_SEQ; i++) pl.n_prompt[i] = pl.n_prompt[i] < 1 ? 1 : pl.n_prompt[i];
            struct outcome out[2];
            memset(out, 0, sizeof out);
            int ok = 1;
            struct plan one = pl;
            one.budget = 0;
            struct outcome alone[2];
            memset(alone, 0, sizeof alone);
            for (int k = 0; k < 2; k++) {
                setenv("TLLM_CL_OPTS", k && extra ? o0 : opts, 1);
                if (k && env) setenv(env, "1", 1);
                struct tllm_backend *cl = NULL;
                ok &= tllm_backend_device_init(&cl, m, 16, device) == TLLM_OK &&
                      run_plan(cl, m, TLLM_DT_F16, &pl, -1, 1, 1, &out[k]) == TLLM_OK &&
                      run_plan(cl, m, TLLM_DT_F16, &one, 2, 0, 0, &alone[k]) == TLLM_OK;
                tllm_backend_free(cl);
                if (env) unsetenv(env);
            }
            CHECK(ok, "%s: %s, fused and not: %s", dir, what, tllm_errmsg());
            int same = ok && !memcmp(out[0].all0, out[1].all0, (size_t)pl.n_prompt[0] * m->cfg.vocab_size * sizeof(float));
            for (int i = 0; ok && i < N_SEQ; i++)
                same &= !memcmp(out[0].logits[i], out[1].logits[i], (size_t)(N_GEN + 1) * m->cfg.vocab_size * sizeof(float));
            same &= ok && !memcmp(alone[0].logits[2], alone[1].logits[2], (size_t)(N_GEN + 1) * m->cfg.vocab_size * sizeof(float));
            CHECK(same, "%s (%s, %d level(s)): %s: the fused kernel's bits differ", dir, packed ? "int8" : "float", levels, what);
            if (same)
                printf("  %s, bit for bit (%s%s)\n", what, packed ? "int8, levels " : "float", packed ? (levels == 2 ? "2" : "1") : "");
            outcome_free(&out[0]), outcome_free(&out[1]), outcome_free(&alone[0]), outcome_free(&alone[1]);
            tllm_model_free(m);
            ref_free(&r);
        }
    setenv("TLLM_CL_OPTS", opts, 1);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_cl_batch MODEL_DIR...\n");
        return 2;
    }
    if (tllm_backend_list_devices(stdout) == 0) {
        printf("no OpenCL device: skipped\n");
        return 77;
    }
    const char *dev = getenv("TLLM_TEST_CL_DEVICE");
    for (int i = 1; i < argc; i++)
        for (int packed = 0; packed < 2; packed++)
            for (int levels = 2; levels >= 2 - packed; levels--) test_fixture(argv[i], dev ? atoi(dev) : -1, packed, levels);
    /* attention split into spans (flash_prefill, flash_combine): the fixtures' sequences (~40 tokens) are
     * shorter than a span (FL_SPAN, 64), so again with spans of 16 positions (staged 16 at a time) */
    const char *opts = getenv("TLLM_CL_OPTS");
    char o16[512];
    snprintf(o16, sizeof o16, "%s -DFL_KB=16 -DFL_SPAN=16", opts ? opts : "");
    char *saved = opts ? strdup(opts) : NULL;
    setenv("TLLM_CL_OPTS", o16, 1);
    printf("spans of 16 positions:\n");
    test_fixture(argv[1], dev ? atoi(dev) : -1, 0, 2);
    setenv("TLLM_CL_SPAN_FLOATS", "1000", 1); /* a launch for each run (its spans' sums take more) */
    printf("spans of 16 positions, a launch a run:\n");
    test_fixture(argv[1], dev ? atoi(dev) : -1, 1, 2);
    unsetenv("TLLM_CL_SPAN_FLOATS");
    printf("spans of 16 positions, the attention output as o_proj's input:\n");
    test_fused(argv[1], dev ? atoi(dev) : -1, o16, "-DFL_EMIT=0", NULL, 0, "o_proj's input from flash_combine = pf_norm's");
    printf("the norms after o_proj and down_proj in their GEMM's last work-group (steps of one token):\n");
    test_fused(argv[1], dev ? atoi(dev) : -1, opts ? opts : "", NULL, "TLLM_CL_NO_FEW_NORM", 1, "gemm_few_norm = gemm_few + pf_norm");
    printf("RoPE and the cache's stores in the q, k, v GEMM, a head by the work-group that finishes it (steps of 1-2 "
           "tokens):\n");
    test_fused(argv[1], dev ? atoi(dev) : -1, opts ? opts : "", NULL, "TLLM_CL_NO_FEW_ROPE", 1, "gemm_few_rope = gemm_few + paged_rope");
    setenv("TLLM_CL_SPLIT", "2", 1); /* every GEMM with the inputs for it in two split-K slices */
    printf("the same with two split-K slices:\n");
    test_fused(argv[1], dev ? atoi(dev) : -1, opts ? opts : "", NULL, "TLLM_CL_NO_FEW_ROPE", 1,
               "gemm_few_rope = gemm_few + paged_rope, two slices");
    unsetenv("TLLM_CL_SPLIT");
    if (saved) setenv("TLLM_CL_OPTS", saved, 1), free(saved);
    else unsetenv("TLLM_CL_OPTS");
    return check_done();
}
