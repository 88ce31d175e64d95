/* Which instruction sets this CPU runs (CPUID, asked once), and the per-level clones of the
 * auto-vectorized loops. Every per-ISA kernel file and every dispatcher asks here. */
#ifndef TLLM_CPU_FEATURES_H
#define TLLM_CPU_FEATURES_H

/* Hot loops written for the auto-vectorizer, compiled once per x86-64 level (AVX-512, AVX2+FMA,
 * baseline) and chosen by the loader (GCC target_clones), since the binary is built without -march. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(TLLM_NO_CLONES)
#define TLLM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TLLM_CLONES
#endif

/* Floating-point steps that must round one at a time (GCC's default contracts a * b + c into an FMA in
 * the clones that have FMA, and not in the others, so the results would depend on the machine) */
#if defined(__GNUC__) && !defined(__clang__)
#define TLLM_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define TLLM_NO_CONTRACT /* clang contracts within one expression only */
#endif

/* Each answers for this CPU as TLLM_CPU=ref|avx2|avxvnni|avx512|amx (neon on arm64) caps it (unset or auto: the best it runs), so
 * that every path can be run and tested on a machine that has a better one. The auto-vectorized
 * TLLM_CLONES loops are chosen by the loader and do not follow it. */
/* 1 if this CPU runs the AVX2+FMA kernels */
int tllm_cpu_has_avx2(void);
/* 1 if it runs AVX-VNNI (256-bit vpdpbusd without AVX-512: the packed kernel's AVX2 form with it) */
int tllm_cpu_has_avxvnni(void);
/* 1 if it has AVX-512 F/BW/VL/DQ */
int tllm_cpu_has_avx512(void);
/* 1 if it also has AVX-512 VNNI (the packed int8 kernels) */
int tllm_cpu_has_avx512vnni(void);
/* 1 if it has AMX-INT8 tiles (and AVX-512 VNNI), and Linux granted the tile state: the prompt kernel */
int tllm_cpu_has_amx(void);
/* 1 if it is arm64 with the dot-product extension (sdot: the NEON packed kernel) */
int tllm_cpu_has_neon_dot(void);
/* The packed kernels' path as it runs: "amx", "avx512-vnni", "avx512", "avx2-vnni", "avx2", "neon" or "ref" */
const char *tllm_cpu_path(void);
/* TLLM_OK, or TLLM_ERR_ARG (with tllm_errmsg) when TLLM_CPU names no path or one this CPU cannot run */
int tllm_cpu_select(void);

#endif
