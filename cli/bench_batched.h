/* tllm bench -np: many sequences at once, as llama-batched-bench measures them (bench_batched.c). */
#ifndef TLLM_CLI_BENCH_BATCHED_H
#define TLLM_CLI_BENCH_BATCHED_H

#include "engine/backend/backend.h"
#include "base/dtype.h"
#include "engine/load/model.h"

/* Every (PP, TG, B, threads) of the lists, reps runs after a warm-up each, on dev (which must offer
 * use_kv) or, NULL, the CPU threads; prints a table (fmt md or csv) or llama-bench-style JSON
 * (n_prompt, n_gen, n_parallel, avg_ts = aggregate decode tokens/s). */
void bench_batched(const struct tllm_model *m, struct tllm_backend *dev, const char *model_name, enum tllm_dtype kv_type,
                   const int *pp, int n_pp, const int *tg, int n_tg, const int *np, int n_np, const int *th, int n_th, int reps,
                   const char *fmt);

#endif
