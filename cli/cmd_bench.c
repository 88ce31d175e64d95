/* tllm bench: llama-bench style prefill (pp) and decode (tg) speed, mean +- stddev over repetitions. */
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/backend/registry.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "kernels/cpu/cpu_features.h"
#include "cli/session.h"
#include "cli/bench_batched.h"

static const char usage[] =
    "usage: tllm bench [-m MODEL] [-p 512] [-n 128] [-d 0] [-r 5] [-t 1,2] [-o md|json|csv] [--step-sync] [--quantize BITS]\n"
    "       tllm bench -np 1,4,16 [-p 128] [-n 128] [-r 5] [-t LIST] [-o md|json|csv] [--kv-type f16|f32]\n"
    "  -p LIST   prompt lengths to prefill (pp tests; 0 skips)\n"
    "  -n LIST   tokens to decode (tg tests; 0 skips)\n"
    "  -d LIST   depths: tokens already in the context (prefilled, not timed) before each test\n"
    "  -r N      repetitions of each test after one warm-up (default 5)\n"
    "  -t LIST   thread counts (default: physical cores)\n"
    "  -o FMT    md (default), json (llama-bench's field names) or csv\n"
    "  -np LIST  sequences at once (as llama-batched-bench): B prompts of -p tokens prefilled together,\n"
    "            then -n greedy tokens for each; columns PP, TG, B, S_PP, S_TG (aggregate decode t/s), S\n"
    "            (on the device when one is in use, else the CPU threads; --fast-decode unless\n"
    "            --precise-decode, as batch generation; times are the mean of -r runs after a warm-up)\n"
    "  --step-sync  tg: wait for each token before the next step (what a sampler on the host needs;\n"
    "            by default the device runs a step ahead, as greedy generation does)\n"
    "Tokenization and sampling are not timed: pp tests feed random token ids, tg tests greedy ones.\n";

struct result {
    const char *test_kind; /* "pp" or "tg" */
    int n_prompt, n_gen, depth, threads, reps;
    double samples_ts[64];
    double avg_ts, stddev_ts;
};

static void parse_list(const char *flag, const char *s, int *out, int *n, int lo) {
    int k;
    int32_t *v = cli_parse_ids(flag, s, &k);
    if (k > 16) cli_die("%s: at most 16 values", flag);
    for (int i = 0; i < k; i++) {
        if (v[i] < lo) cli_die("%s: %d is below %d", flag, v[i], lo);
        out[i] = v[i];
    }
    *n = k;
    free(v);
}

static double run_test(struct cli_session *s, int depth, int n_prompt, int n_gen, int32_t *ids, float *logits, int sync) {
    tllm_ctx_reset(s->ctx);
    if (depth > 0 && tllm_ctx_forward(s->ctx, ids, depth, NULL, TLLM_LOGITS_NONE)) cli_die_lib();
    double t0 = tllm_now();
    if (n_prompt > 0) {
        if (tllm_ctx_forward(s->ctx, ids + depth, n_prompt, logits, TLLM_LOGITS_LAST)) cli_die_lib();
        return (double)n_prompt / (tllm_now() - t0);
    }
    /* decode as greedy generation does (tllm_generate): each token the argmax of the last one's logits
     * (on the device when one is in use), the step for the next token queued before the last is read
     * back; or with sync, one step at a time */
    int32_t next = ids[depth];
    if (sync) {
        for (int i = 0; i < n_gen; i++)
            if (tllm_ctx_decode_argmax(s->ctx, next, &next)) cli_die_lib();
    } else if (n_gen > 0) {
        if (tllm_ctx_greedy_push(s->ctx, next)) cli_die_lib();
        for (int i = 1; i < n_gen; i++)
            if (tllm_ctx_greedy_push(s->ctx, -1) || tllm_ctx_greedy_pop(s->ctx, &next)) cli_die_lib();
        if (tllm_ctx_greedy_pop(s->ctx, &next)) cli_die_lib();
    }
    (void)logits;
    return (double)n_gen / (tllm_now() - t0);
}

static const char *quant_name(const struct tllm_model *m, char *buf, size_t n) {
    const struct tllm_qweights *w = &m->layers[0].wq;
    if (m->cfg.quant.bits == 0 && w->format == TLLM_WF_DENSE) return tllm_dtype_name(w->dtype);
    char kind[32];
    if (w->format != TLLM_WF_AFFINE && w->format != TLLM_WF_DENSE) snprintf(kind, sizeof kind, "%s", tllm_wformat_name(w->format));
    else snprintf(kind, sizeof kind, "Q%d g%d", w->bits ? w->bits : m->cfg.quant.bits, w->bits ? w->group_size : m->cfg.quant.group_size);
    snprintf(buf, n, "%s%s %.2f bpw", kind, m->cfg.n_overrides ? " mixed" : "", tllm_model_bits_per_weight(m, 0));
    return buf;
}

int cmd_bench(int argc, char **argv) {
    struct cli_model_opts mo = {0};
    int pp[16] = {512}, n_pp = 1, tg[16] = {128}, n_tg = 1, th[16] = {0}, n_th = 1, dp[16] = {0}, n_dp = 1, reps = 5, sync = 0;
    int par[16], n_par = 0, pp_set = 0;
    const char *fmt = "md";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) parse_list(a, cli_value(argc, argv, &i), pp, &n_pp, 0), pp_set = 1;
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) parse_list(a, cli_value(argc, argv, &i), par, &n_par, 1);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) parse_list(a, cli_value(argc, argv, &i), tg, &n_tg, 0);
        else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth")) parse_list(a, cli_value(argc, argv, &i), dp, &n_dp, 0);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) parse_list(a, cli_value(argc, argv, &i), th, &n_th, 1);
        else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) reps = (int)cli_int(a, cli_value(argc, argv, &i), 1, 64);
        else if (!strcmp(a, "--step-sync")) sync = 1;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            fmt = cli_value(argc, argv, &i);
            if (strcmp(fmt, "md") && strcmp(fmt, "json") && strcmp(fmt, "csv")) cli_die("-o: '%s' is not md, json or csv", fmt);
        } else if (cli_model_opt(argc, argv, &i, &mo)) {
            continue;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n%s", usage, cli_model_opts_help);
            return 0;
        } else cli_die("bench: unknown option '%s' (see tllm bench --help)", a);
    }
    if (th[0] == 0) th[0] = tllm_physical_cores();
    for (int i = 0; i < n_th; i++) th[i] = cli_threads(th[i]);
    if (n_par) {
        if (!pp_set) pp[0] = 128; /* llama-batched-bench's usual prompt */
        mo.threads = th[0];
        mo.n_ctx = 1;
        struct cli_session s;
        cli_session_open(&s, &mo, 0);
        if (!mo.decode_levels) s.m->decode_levels = 1; /* as batch generation's default */
        struct tllm_backend *dev = cli_session_batch_device(&s);
        const char *name = strrchr(mo.dir, '/') && strrchr(mo.dir, '/')[1] ? strrchr(mo.dir, '/') + 1 : mo.dir;
        bench_batched(s.m, dev, name, cli_kv_dtype(&mo), pp, n_pp, tg, n_tg, par, n_par, th, n_th, reps, fmt);
        cli_session_close(&s);
        return 0;
    }
    int max_len = 1, max_depth = 0;
    for (int i = 0; i < n_pp; i++) max_len = pp[i] > max_len ? pp[i] : max_len;
    for (int i = 0; i < n_tg; i++) max_len = tg[i] > max_len ? tg[i] : max_len;
    for (int i = 0; i < n_dp; i++) max_depth = dp[i] > max_depth ? dp[i] : max_depth;
    max_len += max_depth;
    if (!mo.n_ctx) mo.n_ctx = max_len;
    struct cli_session s;
    mo.threads = th[0];
    cli_session_open(&s, &mo, 0);
    if (s.dev) {
        struct tllm_backend_info info;
        tllm_backend_describe(s.dev, &info);
        int n = info.launches_per_token, g = info.groups;
        char grid[48] = "";
        if (g) snprintf(grid, sizeof grid, " (%d work-groups)", g);
        char pf[48];
        if (s.ctx->dev_prefill) snprintf(pf, sizeof pf, "the device");
        else snprintf(pf, sizeof pf, "%d CPU threads", th[0]);
        char wb[64] = ""; /* what a step reads there: the device's forms of the weights */
        if (info.weights)
            snprintf(wb, sizeof wb, ", %.1f MiB of weights a token (%.2f bits a weight)", (double)info.weight_bytes / (1 << 20),
                     8.0 * (double)info.weight_bytes / (double)info.weights);
        fprintf(stderr, "decode on %s, %d kernel launch%s per token%s%s, %s activations; prefill on %s\n",
                cli_session_backend(&s), n, n == 1 ? "" : "es", grid, wb, info.int8 ? "int8" : "float32", pf);
    }
    if (max_len > s.ctx->n_ctx) cli_die("bench: a test of %d tokens does not fit the context of %d (-c)", max_len, s.ctx->n_ctx);
    int32_t *ids = malloc((size_t)max_len * sizeof *ids);
    float *logits = malloc((size_t)s.m->cfg.vocab_size * sizeof(float));
    uint64_t rng = 42;
    for (int i = 0; i < max_len; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((rng >> 33) % (uint64_t)s.m->cfg.vocab_size);
    }
    struct result *res = calloc((size_t)n_th * (size_t)n_dp * (size_t)(n_pp + n_tg), sizeof *res); /* tests x depths x threads */
    if (!res) cli_die("out of memory");
    int n_res = 0;
    for (int ti = 0; ti < n_th; ti++) {
        if (tllm_threadpool_size() != th[ti]) { /* the context's scratch depends on the pool size */
            tllm_ctx_free(s.ctx);
            if (tllm_threadpool_start(th[ti]) || tllm_ctx_init(s.ctx, s.m, mo.n_ctx, 0)) cli_die_lib();
            cli_session_attach_device(&s);
        }
        for (int kind = 0; kind < 2; kind++)
            for (int k = 0; k < (kind ? n_tg : n_pp); k++)
            for (int di = 0; di < n_dp; di++) {
                int np = kind ? 0 : pp[k], ng = kind ? tg[k] : 0, d = dp[di];
                if (np == 0 && ng == 0) continue;
                struct result *r = &res[n_res++];
                memset(r, 0, sizeof *r);
                *r = (struct result){.test_kind = kind ? "tg" : "pp", .n_prompt = np, .n_gen = ng, .depth = d, .threads = th[ti], .reps = reps};
                run_test(&s, d, np, ng, ids, logits, sync); /* warm-up */
                double sum = 0, sq = 0;
                for (int i = 0; i < reps; i++) {
                    r->samples_ts[i] = run_test(&s, d, np, ng, ids, logits, sync);
                    sum += r->samples_ts[i];
                }
                r->avg_ts = sum / reps;
                for (int i = 0; i < reps; i++) sq += (r->samples_ts[i] - r->avg_ts) * (r->samples_ts[i] - r->avg_ts);
                r->stddev_ts = reps > 1 ? sqrt(sq / (reps - 1)) : 0;
            }
    }
    const char *name = strrchr(mo.dir, '/') && strrchr(mo.dir, '/')[1] ? strrchr(mo.dir, '/') + 1 : mo.dir;
    size_t size = tllm_model_file_bytes(s.m), bpt = tllm_model_bytes_per_token(s.m, 0), params = tllm_model_n_params(s.m);
    char qbuf[64];
    const char *quant = quant_name(s.m, qbuf, sizeof qbuf);
    if (!strcmp(fmt, "json")) {
        struct json_object *arr = json_object_new_array();
        for (int i = 0; i < n_res; i++) {
            struct result *r = &res[i];
            struct json_object *o = json_object_new_object(), *ns = json_object_new_array(), *ts = json_object_new_array();
            json_object_object_add(o, "model_filename", json_object_new_string(mo.dir));
            json_object_object_add(o, "model_type", json_object_new_string(quant));
            json_object_object_add(o, "model_size", json_object_new_int64((int64_t)size));
            json_object_object_add(o, "model_n_params", json_object_new_int64((int64_t)params));
            json_object_object_add(o, "model_bpw", json_object_new_double(tllm_model_bits_per_weight(s.m, 0)));
            json_object_object_add(o, "backend", json_object_new_string(s.dev ? "OpenCL" : "CPU"));
            json_object_object_add(o, "backends", json_object_new_string(cli_session_backend(&s)));
            json_object_object_add(o, "cpu_kernels", json_object_new_string(tllm_cpu_path()));
            json_object_object_add(o, "n_threads", json_object_new_int(r->threads));
            json_object_object_add(o, "n_batch", json_object_new_int(s.ctx->n_batch));
            json_object_object_add(o, "n_prompt", json_object_new_int(r->n_prompt));
            json_object_object_add(o, "n_gen", json_object_new_int(r->n_gen));
            json_object_object_add(o, "n_depth", json_object_new_int(r->depth));
            double avg_ns = 0, sd_ns = 0;
            int n_tok = r->n_prompt + r->n_gen;
            for (int k = 0; k < r->reps; k++) {
                double t_ns = 1e9 * n_tok / r->samples_ts[k];
                avg_ns += t_ns / r->reps;
                json_object_array_add(ns, json_object_new_int64((int64_t)t_ns));
                json_object_array_add(ts, json_object_new_double(r->samples_ts[k]));
            }
            for (int k = 0; k < r->reps; k++) {
                double d = 1e9 * n_tok / r->samples_ts[k] - avg_ns;
                sd_ns += d * d;
            }
            sd_ns = r->reps > 1 ? sqrt(sd_ns / (r->reps - 1)) : 0;
            json_object_object_add(o, "avg_ns", json_object_new_int64((int64_t)avg_ns));
            json_object_object_add(o, "stddev_ns", json_object_new_int64((int64_t)sd_ns));
            json_object_object_add(o, "avg_ts", json_object_new_double(r->avg_ts));
            json_object_object_add(o, "stddev_ts", json_object_new_double(r->stddev_ts));
            json_object_object_add(o, "samples_ns", ns);
            json_object_object_add(o, "samples_ts", ts);
            json_object_object_add(o, "weight_bytes_per_token", json_object_new_int64((int64_t)bpt));
            if (r->n_gen)
                json_object_object_add(o, "effective_bandwidth_gbs", json_object_new_double((double)bpt * r->avg_ts / 1e9));
            json_object_array_add(arr, o);
        }
        puts(json_object_to_json_string_ext(arr, JSON_C_TO_STRING_PRETTY));
        json_object_put(arr);
    } else if (!strcmp(fmt, "csv")) {
        puts("model,model_type,model_size,model_n_params,backend,n_threads,n_prompt,n_gen,n_depth,avg_ts,stddev_ts,effective_bandwidth_gbs");
        for (int i = 0; i < n_res; i++)
            printf("%s,%s,%zu,%zu,%s,%d,%d,%d,%d,%.3f,%.3f,%.3f\n", name, quant, size, params, s.dev ? "OpenCL" : "CPU", res[i].threads,
                   res[i].n_prompt, res[i].n_gen, res[i].depth, res[i].avg_ts, res[i].stddev_ts,
                   res[i].n_gen ? (double)bpt * res[i].avg_ts / 1e9 : 0);
    } else {
        printf("| model | quant | size | params | backend | threads | test | t/s | weights GB/s |\n");
        printf("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
        char cpu_name[32]; /* the kernel path: TLLM_CPU can pick a slower one than the CPU's best */
        snprintf(cpu_name, sizeof cpu_name, "CPU %s", tllm_cpu_path());
        for (int i = 0; i < n_res; i++) {
            char bw[32] = "";
            if (res[i].n_gen) snprintf(bw, sizeof bw, "%.1f", (double)bpt * res[i].avg_ts / 1e9);
            char depth[32] = "";
            if (res[i].depth) snprintf(depth, sizeof depth, " @ d%d", res[i].depth);
            printf("| %s | %s | %.1f MiB | %.1f M | %s | %d | %s%d%s | %.2f ± %.2f | %s |\n", name, quant,
                   (double)size / (1 << 20), (double)params / 1e6, s.dev ? "OpenCL" : cpu_name, res[i].threads, res[i].test_kind,
                   res[i].n_prompt + res[i].n_gen, depth, res[i].avg_ts, res[i].stddev_ts, bw);
        }
    }
    free(res);
    free(ids);
    free(logits);
    cli_session_close(&s);
    return 0;
}
