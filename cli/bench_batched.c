/* tllm bench -np LIST: aggregate throughput of many sequences at once, measured as llama.cpp's
 * llama-batched-bench does: B sequences, each with its own prompt of PP tokens, prefilled together in
 * steps of up to n_batch tokens; then TG steps that decode one greedy token for each of the B. */
#include "cli/bench_batched.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/backend/registry.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "engine/run/kv_cache.h"

struct bb_result {
    int pp, tg, b, threads;
    double t_pp, t_tg; /* seconds: the mean of the repetitions */
};

/* One run: prefill every sequence's prompt, then decode tg tokens for all at once (on dev, bound to the
 * run's cache, or on the CPU threads). */
static void run_once(const struct tllm_model *m, struct tllm_backend *dev, enum tllm_dtype kv_type, int pp, int tg, int b,
                     int n_batch, double *t_pp, double *t_tg) {
    struct tllm_kv *kv;
    struct tllm_backend *cpu = NULL;
    int per_seq = tllm_kv_blocks_for(pp + tg) * TLLM_KV_BLOCK; /* each sequence's blocks */
    if (tllm_kv_init(&kv, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim, b * per_seq, kv_type, b) ||
        (dev ? dev->ops->use_kv(dev, kv) : tllm_backend_cpu_init(&cpu, m, kv, n_batch)))
        cli_die_lib();
    struct tllm_backend *run = dev ? dev : cpu;
    int32_t *ids = malloc((size_t)n_batch * sizeof *ids), *pos = malloc((size_t)n_batch * sizeof *pos);
    int32_t *sq = malloc((size_t)n_batch * sizeof *sq), *next = malloc((size_t)b * sizeof *next);
    int8_t *out = malloc((size_t)n_batch);
    if (!ids || !pos || !sq || !next || !out) cli_die("out of memory");
    uint64_t rng = 42;
    for (int s = 0; s < b; s++) {
        int seq;
        if (tllm_kv_seq_open(kv, &seq) || tllm_kv_seq_reserve(kv, seq, pp + tg)) cli_die_lib();
        next[s] = (int32_t)(s % m->cfg.vocab_size);
    }
    /* prefill: the prompts back to back, a step holding the ends of some and the starts of others */
    double t0 = tllm_now();
    int n = 0, n_out = 0, s0 = 0;
    for (int s = 0; s < b && pp > 0; s++)
        for (int p = 0; p < pp; p++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ids[n] = (int32_t)((rng >> 33) % (uint64_t)m->n_sample), pos[n] = p, sq[n] = s, out[n] = p == pp - 1;
            n_out += out[n];
            n++;
            if (n == n_batch || (s == b - 1 && p == pp - 1)) {
                struct tllm_batch bt = {.n = n, .id = ids, .pos = pos, .seq = sq, .out = out, .n_gen = 0};
                if (run->ops->step(run, &bt, NULL, next + s0)) cli_die_lib();
                for (int t = 0; t < n;) { /* commit each sequence's run */
                    int t1 = t;
                    while (t1 < n && sq[t1] == sq[t]) t1++;
                    if (tllm_kv_seq_commit(kv, sq[t], ids + t, t1 - t)) cli_die_lib();
                    t = t1;
                }
                s0 += n_out;
                n = n_out = 0;
            }
        }
    *t_pp = tllm_now() - t0;
    /* decode: each step one generated token per sequence, the argmax of its last */
    t0 = tllm_now();
    for (int k = 0; k < tg; k++) {
        for (int s = 0; s < b; s++) ids[s] = next[s], pos[s] = pp + k, sq[s] = s, out[s] = 1;
        struct tllm_batch bt = {.n = b, .id = ids, .pos = pos, .seq = sq, .out = out, .n_gen = b};
        if (run->ops->step(run, &bt, NULL, next)) cli_die_lib();
        for (int s = 0; s < b; s++)
            if (tllm_kv_seq_commit(kv, s, ids + s, 1)) cli_die_lib();
    }
    *t_tg = tllm_now() - t0;
    free(ids), free(pos), free(sq), free(next), free(out);
    tllm_backend_free(cpu);
    if (dev && dev->ops->use_kv(dev, NULL)) cli_die_lib();
    tllm_kv_free(kv);
}

void bench_batched(const struct tllm_model *m, struct tllm_backend *dev, const char *model_name, enum tllm_dtype kv_type,
                   const int *pp, int n_pp, const int *tg, int n_tg, const int *np, int n_np, const int *th, int n_th, int reps,
                   const char *fmt) {
    struct bb_result *res = calloc((size_t)n_pp * n_tg * n_np * n_th, sizeof *res);
    if (!res) cli_die("out of memory");
    int n_res = 0;
    for (int ti = 0; ti < n_th; ti++) {
        if (tllm_threadpool_size() != th[ti] && tllm_threadpool_start(th[ti])) cli_die_lib();
        for (int i = 0; i < n_pp; i++)
            for (int j = 0; j < n_tg; j++)
                for (int k = 0; k < n_np; k++) {
                    struct bb_result *r = &res[n_res++];
                    *r = (struct bb_result){pp[i], tg[j], np[k], th[ti], 0, 0};
                    int n_batch = np[k] > 512 ? np[k] : 512;
                    double a, b;
                    run_once(m, dev, kv_type, r->pp, r->tg, r->b, n_batch, &a, &b); /* warm-up */
                    for (int rep = 0; rep < reps; rep++) {
                        run_once(m, dev, kv_type, r->pp, r->tg, r->b, n_batch, &a, &b);
                        r->t_pp += a / reps;
                        r->t_tg += b / reps;
                    }
                }
    }
    if (!strcmp(fmt, "json")) {
        struct json_object *arr = json_object_new_array();
        for (int i = 0; i < n_res; i++) {
            const struct bb_result *r = &res[i];
            struct json_object *o = json_object_new_object();
            json_object_object_add(o, "model_filename", json_object_new_string(model_name));
            json_object_object_add(o, "backend", json_object_new_string(dev ? "OpenCL" : "CPU"));
            json_object_object_add(o, "n_threads", json_object_new_int(r->threads));
            json_object_object_add(o, "n_prompt", json_object_new_int(r->pp));
            json_object_object_add(o, "n_gen", json_object_new_int(r->tg));
            json_object_object_add(o, "n_parallel", json_object_new_int(r->b));
            json_object_object_add(o, "n_kv", json_object_new_int(r->b * (r->pp + r->tg)));
            json_object_object_add(o, "kv_type", json_object_new_string(kv_type == TLLM_DT_F16 ? "f16" : "f32"));
            json_object_object_add(o, "t_pp", json_object_new_double(r->t_pp));
            json_object_object_add(o, "speed_pp", json_object_new_double(r->t_pp > 0 ? r->b * r->pp / r->t_pp : 0));
            json_object_object_add(o, "t_tg", json_object_new_double(r->t_tg));
            json_object_object_add(o, "speed_tg", json_object_new_double(r->t_tg > 0 ? r->b * r->tg / r->t_tg : 0));
            json_object_object_add(o, "avg_ts", json_object_new_double(r->t_tg > 0 ? r->b * r->tg / r->t_tg : 0));
            json_object_object_add(o, "speed", json_object_new_double(r->b * (r->pp + r->tg) / (r->t_pp + r->t_tg)));
            json_object_array_add(arr, o);
        }
        puts(json_object_to_json_string_ext(arr, JSON_C_TO_STRING_PRETTY));
        json_object_put(arr);
    } else {
        int csv = !strcmp(fmt, "csv");
        puts(csv ? "PP,TG,B,N_KV,threads,T_PP,S_PP,T_TG,S_TG,T,S"
                 : "|    PP |     TG |    B |   N_KV | threads |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n"
                   "|-------|--------|------|--------|---------|----------|----------|----------|----------|----------|----------|");
        for (int i = 0; i < n_res; i++) {
            const struct bb_result *r = &res[i];
            double t = r->t_pp + r->t_tg, spp = r->t_pp > 0 ? r->b * r->pp / r->t_pp : 0, stg = r->t_tg > 0 ? r->b * r->tg / r->t_tg : 0;
            printf(csv ? "%d,%d,%d,%d,%d,%.3f,%.2f,%.3f,%.2f,%.3f,%.2f\n"
                       : "| %5d | %6d | %4d | %6d | %7d | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n",
                   r->pp, r->tg, r->b, r->b * (r->pp + r->tg), r->threads, r->t_pp, spp, r->t_tg, stg, t,
                   r->b * (r->pp + r->tg) / t);
        }
    }
    free(res);
}
