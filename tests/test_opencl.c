/* The OpenCL decode path on every fixture (PoCL on the CPU in CI): token-by-token logits match the
 * transformers reference, greedy ids match the CPU path, and CPU prefill / device decode alternate
 * with the KV cache synced both ways. A missing device is a clean error. */
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "engine/run/context.h"
#include "engine/backend/registry.h"
#include "base/error.h"
#include "engine/run/generate.h"
#include "tests/reference.h"

#define TOL_CL_REL_RMS 1e-3 /* relative RMS of a logits row (issue 7) */
#define MARGIN_MIN_CL 1e-2  /* compare argmax where top1 - top2 exceeds this */
/* Prompts on the device (kernels/opencl/gemm.cl, prefill.cl), float activations or int8 ones in two
 * levels (about 15 bits a block of 32), against the reference as decode's (TOL_CL_REL_RMS: the issue's
 * 1e-3; measured 1.4-2.0e-4 in int8), argmax everywhere the margin is clear. Against the CPU's
 * prefill, where its prompt path takes one-level int8 activations, by the CPU's int8 noise: one
 * activation of one token rounds the other way, and then that token and the later ones (through its
 * K and V) differ (2-3e-2 on these random-weight fixtures). */
#define TOL_CL_CPU_INT8_PREFILL_REL_RMS 4e-2

static int stop_after_3(const char *text, size_t len, void *user) {
    (void)text, (void)len;
    return ++*(int *)user >= 3;
}

/* tllm_generate with a greedy sampler runs the device a step ahead (the next step is queued before
 * the host reads the token back): it must feed and return exactly what the one-step loop on the CPU
 * does when generation ends by length, at an EOS token, by the callback and at a full context. */
static void test_generate_ahead(const char *dir, struct tllm_ctx *ctx, struct tllm_backend *cl, const struct ref_fixture *r) {
    struct tllm_sampler s;
    struct tllm_sampler_params sp = tllm_sampler_defaults();
    CHECK(tllm_sampler_init(&s, &sp, r->vocab) == TLLM_OK, "sampler");
    int32_t eos = r->greedy_ids[r->n_greedy / 2];
    const char *why[4] = {"length", "eos", "callback", "context"};
    for (int k = 0; k < 4; k++) {
        struct tllm_gen_params p = {.max_new = k == 3 ? -1 : r->n_greedy, .eos = &eos, .n_eos = k == 1};
        struct tllm_gen_result res[2];
        int pos[2], rc[2];
        for (int dev = 0; dev < 2; dev++) { /* the CPU, then the device */
            int calls = 0;
            tllm_ctx_use_device(ctx, dev ? cl : NULL);
            tllm_ctx_reset(ctx);
            tllm_sampler_reset(&s);
            rc[dev] = tllm_generate(ctx, NULL, &s, r->prompt_ids, r->n_prompt, &p, k == 2 ? stop_after_3 : NULL, &calls,
                                    &res[dev]);
            pos[dev] = ctx->pos;
        }
        CHECK(rc[0] == TLLM_OK && rc[1] == TLLM_OK, "%s: generate (%s): %s", dir, why[k], tllm_errmsg());
        /* (no ids at all when the first is the eos: memcmp may not see their NULL data) */
        int same = res[0].ids.len == res[1].ids.len &&
                   (!res[0].ids.len || !memcmp(res[0].ids.data, res[1].ids.data, res[0].ids.len * sizeof(int32_t)));
        CHECK(same && res[0].finish == res[1].finish && pos[0] == pos[1],
              "%s: greedy a step ahead on the device, ending by %s: %zu ids (finish %s, cache %d) against the CPU's %zu "
              "(finish %s, cache %d)", dir, why[k], res[1].ids.len, tllm_finish_name(res[1].finish), pos[1], res[0].ids.len,
              tllm_finish_name(res[0].finish), pos[0]);
        if (k == 0)
            CHECK(res[1].ids.len == (size_t)r->n_greedy && !memcmp(res[1].ids.data, r->greedy_ids, res[1].ids.len * sizeof(int32_t)),
                  "%s: generate on the device: not the reference's greedy ids", dir);
        tllm_gen_result_free(&res[0]);
        tllm_gen_result_free(&res[1]);
    }
    printf("  generate a step ahead on the device: as on the CPU when ending by length, eos, callback, context\n");
    tllm_sampler_free(&s);
    /* the same pushes on either side: an id < 0 only right after a push */
    for (int dev = 0; dev < 2; dev++) {
        int32_t a = -1, b = -1;
        tllm_ctx_use_device(ctx, dev ? cl : NULL);
        tllm_ctx_reset(ctx);
        CHECK(tllm_ctx_forward(ctx, r->prompt_ids, r->n_prompt - 1, NULL, TLLM_LOGITS_NONE) == TLLM_OK, "prefill");
        CHECK(tllm_ctx_greedy_push(ctx, -1) != TLLM_OK, "%s: a push of id -1 after a prefill must fail", dir);
        CHECK(tllm_ctx_greedy_push(ctx, r->prompt_ids[r->n_prompt - 1]) == TLLM_OK && tllm_ctx_greedy_push(ctx, -1) == TLLM_OK &&
                  tllm_ctx_forward(ctx, r->prompt_ids, 1, NULL, TLLM_LOGITS_NONE) != TLLM_OK && tllm_ctx_greedy_pop(ctx, &a) == TLLM_OK &&
                  tllm_ctx_greedy_pop(ctx, &b) == TLLM_OK && tllm_ctx_greedy_pop(ctx, &b) != TLLM_OK,
              "%s: greedy push/pop (%s): %s", dir, dev ? "device" : "CPU", tllm_errmsg());
        CHECK(a == r->greedy_ids[0] && b == r->greedy_ids[1] && ctx->pos == r->n_prompt + 1,
              "%s: greedy push/pop (%s): ids %d %d, reference %d %d", dir, dev ? "device" : "CPU", a, b, r->greedy_ids[0],
              r->greedy_ids[1]);
    }
    tllm_ctx_use_device(ctx, cl);
}

/* Prompt processing on the device (--prefill device), in chunks of the context's n_batch: every
 * position's logits (tllm logits) against the reference and the CPU's prefill; the last token's
 * (the lm_head matvec) equal to its row of all; the device's cache then serves greedy decode. */
static void test_device_prefill(const char *dir, struct tllm_ctx *ctx, struct tllm_backend *cl, const struct ref_fixture *r,
                                int packed, float *logits) {
    size_t vocab = (size_t)r->vocab;
    float *cpu = malloc((size_t)r->n_seq * vocab * sizeof(float)), *last = malloc(vocab * sizeof(float));
    tllm_ctx_use_device(ctx, cl);
    CHECK(tllm_ctx_set_prefill(ctx, TLLM_PREFILL_CPU) == TLLM_OK, "--prefill cpu");
    tllm_ctx_reset(ctx);
    CHECK(tllm_ctx_forward(ctx, r->sequence, r->n_seq, cpu, TLLM_LOGITS_ALL) == TLLM_OK, "cpu prefill: %s", tllm_errmsg());
    CHECK(tllm_ctx_set_prefill(ctx, TLLM_PREFILL_DEVICE) == TLLM_OK, "%s: --prefill device: %s", dir, tllm_errmsg());
    tllm_ctx_reset(ctx);
    CHECK(tllm_ctx_forward(ctx, r->sequence, r->n_seq, logits, TLLM_LOGITS_ALL) == TLLM_OK, "%s: device prefill: %s", dir,
          tllm_errmsg());
    int int8 = packed && ctx->m->layers[0].wq.pack; /* the CPU's prompt path took int8 activations */
    double worst = 0, worst_cpu = 0, tol = TOL_CL_REL_RMS, tol_cpu = int8 ? TOL_CL_CPU_INT8_PREFILL_REL_RMS : TOL_CL_REL_RMS;
    for (int j = 0; j < r->n_logits_rows; j++) {
        double rms, mx;
        ref_compare_row(r->logits + (size_t)j * vocab, logits + (size_t)r->logits_rows[j] * vocab, r->vocab, &rms, &mx);
        CHECK(rms <= tol, "%s device prefill: position %d relative RMS %.3g > %.3g", dir, r->logits_rows[j], rms, tol);
        worst = rms > worst ? rms : worst;
    }
    for (int p = 0; p < r->n_seq; p++) {
        double rms, mx;
        ref_compare_row(cpu + (size_t)p * vocab, logits + (size_t)p * vocab, r->vocab, &rms, &mx);
        worst_cpu = rms > worst_cpu ? rms : worst_cpu;
    }
    CHECK(worst_cpu <= tol_cpu, "%s device prefill against the CPU's: relative RMS %.3g", dir, worst_cpu);
    int agree = 0, compared = 0;
    for (int p = 0; p < r->n_seq - 1; p++) {
        if (r->margins[p] <= MARGIN_MIN_CL) continue;
        compared++;
        agree += argmax_f32(logits + (size_t)p * vocab, r->vocab) == r->top1[p];
    }
    CHECK(agree == compared, "%s device prefill: argmax %d/%d", dir, agree, compared);
    /* split-K (each GEMM's inputs in slices summed by gemm_reduce; on a small device only where
     * TLLM_CL_SPLIT asks): the same logits but for the order of the sums */
    setenv("TLLM_CL_SPLIT", "3", 1);
    tllm_ctx_reset(ctx);
    CHECK(tllm_ctx_forward(ctx, r->sequence, r->n_seq, cpu, TLLM_LOGITS_ALL) == TLLM_OK, "split-K prefill: %s", tllm_errmsg());
    unsetenv("TLLM_CL_SPLIT");
    double worst_split = 0;
    for (int p = 0; p < r->n_seq; p++) {
        double rms, mx;
        ref_compare_row(logits + (size_t)p * vocab, cpu + (size_t)p * vocab, r->vocab, &rms, &mx);
        worst_split = rms > worst_split ? rms : worst_split;
    }
    CHECK(worst_split <= tol, "%s device prefill split in 3: relative RMS %.3g from unsplit", dir, worst_split);
    /* the last token's logits alone (the decode path's lm_head) */
    tllm_ctx_reset(ctx);
    CHECK(tllm_ctx_forward(ctx, r->sequence, r->n_seq, last, TLLM_LOGITS_LAST) == TLLM_OK, "device prefill, last: %s", tllm_errmsg());
    double rms_last, mx_last;
    ref_compare_row(logits + (size_t)(r->n_seq - 1) * vocab, last, r->vocab, &rms_last, &mx_last);
    CHECK(rms_last <= tol, "%s device prefill: the last token's logits alone differ from its row (%.3g)", dir, rms_last);
    printf("  opencl prefill (the CPU's prompts in %s): worst rel RMS %.2e (against the CPU's %.2e, split-K %.2e), argmax %d/%d\n",
           int8 ? "int8" : "float32", worst, worst_cpu, worst_split, agree, compared);
    if (!packed) { /* prompt on the device, greedy there: the reference's ids */
        int32_t next, id = r->prompt_ids[r->n_prompt - 1];
        int same = 0;
        tllm_ctx_reset(ctx);
        CHECK(tllm_ctx_forward(ctx, r->prompt_ids, r->n_prompt - 1, NULL, TLLM_LOGITS_NONE) == TLLM_OK, "prefill: %s", tllm_errmsg());
        for (int i = 0; i < r->n_greedy; i++) {
            CHECK(tllm_ctx_decode_argmax(ctx, id, &next) == TLLM_OK, "argmax step: %s", tllm_errmsg());
            same += next == r->greedy_ids[i];
            id = next;
        }
        CHECK(same == r->n_greedy, "%s: %d of %d greedy ids after a device prefill", dir, same, r->n_greedy);
    }
    CHECK(tllm_ctx_set_prefill(ctx, TLLM_PREFILL_AUTO) == TLLM_OK, "--prefill auto");
    tllm_ctx_reset(ctx);
    free(cpu);
    free(last);
}

/* packed: the model as the CLI loads it without --exact, so 4-bit models get the int8-activation
 * matvecs on the device (the CPU's prefill then takes int8 activations too: the CPU/device greedy
 * comparison is left to the float run). */
static void test_fixture(const char *dir, int device, int packed) {
    struct ref_fixture r;
    struct tllm_model *m;
    printf("%s%s\n", dir, packed ? " (packed)" : "");
    if (ref_load_model(dir, packed, &r, &m) != 0) {
        CHECK(0, "%s: cannot load", dir);
        return;
    }
    size_t vocab = (size_t)r.vocab;
    float *logits = malloc((size_t)r.n_seq * vocab * sizeof(float));
    struct tllm_ctx ctx;
    struct tllm_backend *cl;
    struct tllm_backend_info info;
    CHECK(tllm_ctx_init(&ctx, m, r.n_seq + 4, 16) == TLLM_OK, "ctx");
    if (tllm_backend_device_init(&cl, m, ctx.n_ctx, device) != TLLM_OK) {
        /* the device takes every format (converted where its kernels read another) but GPTQ act-order, which it
         * must refuse with that said, and only that */
        int device_formats = 1;
        for (int l = 0; l < m->cfg.n_layers; l++) {
            const struct tllm_layer *L = &m->layers[l];
            const struct tllm_qweights *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int i = 0; i < 7; i++) device_formats &= !ws[i]->perm;
        }
        if (!device_formats && strstr(tllm_errmsg(), "not supported by the device kernels")) {
            printf("  refused, as it should be: %s\n", tllm_errmsg());
            tllm_backend_free(cl);
            goto out;
        }
        CHECK(0, "%s: opencl init: %s", dir, tllm_errmsg());
        tllm_backend_free(cl);
        goto out;
    }
    tllm_backend_describe(cl, &info);
    test_device_prefill(dir, &ctx, cl, &r, packed, logits);
    tllm_ctx_use_device(&ctx, cl);
    if (packed && !info.int8) { /* no int8 form for this format: the float run covered it */
        printf("  (float32 activations: as above)\n");
        goto done;
    }
    /* every token through the device */
    for (int p = 0; p < r.n_seq; p++)
        CHECK(tllm_ctx_forward(&ctx, &r.sequence[p], 1, logits + (size_t)p * vocab, TLLM_LOGITS_LAST) == TLLM_OK,
              "decode %d: %s", p, tllm_errmsg());
    double worst = 0;
    for (int j = 0; j < r.n_logits_rows; j++) {
        double rms, mx;
        ref_compare_row(r.logits + (size_t)j * vocab, logits + (size_t)r.logits_rows[j] * vocab, r.vocab, &rms, &mx);
        CHECK(rms <= TOL_CL_REL_RMS, "%s opencl: position %d relative RMS %.3g", dir, r.logits_rows[j], rms);
        worst = rms > worst ? rms : worst;
    }
    int agree = 0, compared = 0;
    for (int p = 0; p < r.n_seq - 1; p++) {
        if (r.margins[p] <= MARGIN_MIN_CL) continue;
        int a = argmax_f32(logits + (size_t)p * vocab, r.vocab);
        compared++;
        agree += a == r.top1[p];
        CHECK(a == r.top1[p], "%s opencl: argmax at %d is %d, reference %d", dir, p, a, r.top1[p]);
    }
    printf("  opencl decode (%s activations): worst rel RMS %.2e, argmax %d/%d\n", info.int8 ? "int8" : "float32",
           worst, agree, compared);
    if (packed) goto done;

    /* CPU prefill of the prompt, then greedy on the device (argmax there), then a CPU step that needs
     * the device's K/V, then the device again: the greedy ids must be the reference's */
    tllm_ctx_reset(&ctx);
    CHECK(tllm_ctx_forward(&ctx, r.prompt_ids, r.n_prompt, NULL, TLLM_LOGITS_NONE) == TLLM_OK, "prefill");
    int32_t next = 0, id = r.prompt_ids[r.n_prompt - 1];
    tllm_ctx_truncate(&ctx, r.n_prompt - 1); /* re-feed the last prompt token to get its argmax */
    int half = r.n_greedy / 2, same = 0;
    for (int i = 0; i < r.n_greedy; i++) {
        if (i == half && i > 0) {
            /* two tokens through the CPU (a multi-token step), whose attention reads device-made K/V */
            int32_t two[2] = {id, r.greedy_ids[i]};
            float *l2 = malloc(2 * vocab * sizeof(float));
            CHECK(tllm_ctx_forward(&ctx, two, 2, l2, TLLM_LOGITS_ALL) == TLLM_OK, "cpu step: %s", tllm_errmsg());
            same += argmax_f32(l2, r.vocab) == r.greedy_ids[i];
            next = argmax_f32(l2 + vocab, r.vocab);
            free(l2);
            if (++i >= r.n_greedy) break;
            same += next == r.greedy_ids[i];
            id = next;
            continue;
        }
        CHECK(tllm_ctx_decode_argmax(&ctx, id, &next) == TLLM_OK, "argmax step: %s", tllm_errmsg());
        same += next == r.greedy_ids[i];
        id = next;
    }
    CHECK(same == r.n_greedy, "%s: %d of %d greedy ids match with CPU/device alternating", dir, same, r.n_greedy);
    printf("  greedy, CPU prefill + device decode + CPU step: %d/%d ids\n", same, r.n_greedy);
    test_generate_ahead(dir, &ctx, cl, &r);
done:
    tllm_ctx_use_device(&ctx, NULL);
    tllm_backend_free(cl);
out:
    tllm_ctx_free(&ctx);
    free(logits);
    tllm_model_free(m);
    ref_free(&r);
}

/* model->deterministic (--deterministic): the device's sums in a fixed order, so the same steps give
 * the same logits bit for bit, prompt on the device and decode (on NVIDIA the default folds phases
 * together with float atomic adds; elsewhere every path is in a fixed order anyway) */
static void test_deterministic(const char *dir, int device) {
    struct ref_fixture r;
    struct tllm_model *m;
    if (ref_load_model(dir, 1, &r, &m) != 0) {
        CHECK(0, "%s: cannot load", dir);
        return;
    }
    m->deterministic = 1;
    size_t vocab = (size_t)r.vocab, n_dec = (size_t)r.n_seq - (size_t)r.n_seq / 2;
    float *out[2] = {malloc((n_dec + 1) * vocab * sizeof(float)), malloc((n_dec + 1) * vocab * sizeof(float))};
    struct tllm_ctx ctx;
    struct tllm_backend *cl = NULL;
    CHECK(tllm_ctx_init(&ctx, m, r.n_seq + 4, 16) == TLLM_OK && tllm_backend_device_init(&cl, m, ctx.n_ctx, device) == TLLM_OK,
          "%s: deterministic device: %s", dir, tllm_errmsg());
    tllm_ctx_use_device(&ctx, cl);
    CHECK(tllm_ctx_set_prefill(&ctx, TLLM_PREFILL_DEVICE) == TLLM_OK, "--prefill device: %s", tllm_errmsg());
    for (int run = 0; run < 2; run++) {
        tllm_ctx_reset(&ctx);
        CHECK(tllm_ctx_forward(&ctx, r.sequence, r.n_seq / 2, out[run], TLLM_LOGITS_LAST) == TLLM_OK, "prefill: %s", tllm_errmsg());
        for (size_t p = 0; p < n_dec; p++)
            CHECK(tllm_ctx_decode(&ctx, r.sequence[r.n_seq / 2 + p], out[run] + (p + 1) * vocab) == TLLM_OK, "decode: %s", tllm_errmsg());
    }
    CHECK(!memcmp(out[0], out[1], (n_dec + 1) * vocab * sizeof(float)), "%s: --deterministic: two runs differ", dir);
    printf("%s: deterministic: a device prefill and %zu decode steps twice, the same bits\n", dir, n_dec);
    tllm_ctx_use_device(&ctx, NULL);
    tllm_backend_free(cl);
    tllm_ctx_free(&ctx);
    free(out[0]);
    free(out[1]);
    tllm_model_free(m);
    ref_free(&r);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_opencl MODEL_DIR...\n");
        return 2;
    }
    int n = tllm_backend_list_devices(stdout);
    if (n == 0) {
        /* setup.sh installs PoCL; without any platform there is nothing to run on */
        printf("no OpenCL device: skipped\n");
        return 77;
    }
    /* a device that is not there: a message, no crash */
    struct tllm_model *m;
    if (tllm_model_load(argv[1], &m) == TLLM_OK) {
        struct tllm_backend *cl;
        CHECK(tllm_backend_device_init(&cl, m, 16, 999) != TLLM_OK && strstr(tllm_errmsg(), "opencl:999"), "bad index: %s",
              tllm_errmsg());
        tllm_backend_free(cl);
        tllm_model_free(m);
    }
    const char *dev = getenv("TLLM_TEST_CL_DEVICE"); /* default: the first GPU, else the first device */
    for (int i = 1; i < argc; i++)
        for (int packed = 0; packed < 2; packed++) test_fixture(argv[i], dev ? atoi(dev) : -1, packed);
    test_deterministic(argv[1], dev ? atoi(dev) : -1);
    return check_done();
}
