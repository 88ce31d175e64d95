#include "kernels/cpu/cpu_features.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* A flag computed on first use and then read by any thread (the kernels ask from the pool's workers):
 * atomic, so that two first uses at once are not a data race (both compute the same value) */
static int flag_get(const int *f) { return __atomic_load_n(f, __ATOMIC_RELAXED); }
static int flag_set(int *f, int v) { return __atomic_store_n(f, v, __ATOMIC_RELAXED), v; }

/* The most TLLM_CPU lets the kernels use: 0 ref, 1 avx2, 2 avxvnni, 3 avx512, 4 amx (unset, "auto" or a
 * value that is not a path: no cap; tllm_cpu_select refuses the last) */
static int cap(void) {
    static int c = -1;
    if (flag_get(&c) >= 0) return flag_get(&c);
    const char *e = getenv("TLLM_CPU");
    return flag_set(&c, !e ? 4 : !strcmp(e, "ref") ? 0 : !strcmp(e, "avx2") || !strcmp(e, "neon") ? 1 : !strcmp(e, "avxvnni") ? 2
                        : !strcmp(e, "avx512") ? 3 : 4);
}

#if defined(__x86_64__)
#include <cpuid.h>

static int cpu_avx2(void) {
    static int has = -1;
    if (flag_get(&has) >= 0) return flag_get(&has);
    __builtin_cpu_init();
    return flag_set(&has, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

static int cpu_avx512(void) {
    static int has = -1;
    if (flag_get(&has) >= 0) return flag_get(&has);
    __builtin_cpu_init();
    return flag_set(&has, __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"));
}

static int cpu_avx512vnni(void) { return cpu_avx512() && __builtin_cpu_supports("avx512vnni"); }
/* CPUID leaf 7, subleaf 1, EAX bit 4 (clang's __builtin_cpu_supports has no name for it) */
static int cpu_avxvnni(void) {
    static int has = -1;
    if (flag_get(&has) >= 0) return flag_get(&has);
    unsigned a = 0, b = 0, c = 0, d = 0;
    return flag_set(&has, cpu_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1));
}
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
/* AMX-TILE and AMX-INT8 (CPUID leaf 7 EDX bits 24, 25; named by neither compiler's builtin in the
 * versions at hand) beside AVX-512 VNNI, whose kernel takes what the tiles do not; Linux gives a
 * process the tile state only when asked */
static int cpu_amx(void) {
    static int has = -1;
    if (flag_get(&has) >= 0) return flag_get(&has);
    unsigned a = 0, b = 0, c = 0, d = 0;
    return flag_set(&has, cpu_avx512vnni() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 3) == 3 &&
                              syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0);
}
#else
static int cpu_amx(void) { return 0; }
#endif
static int cpu_neon_dot(void) { return 0; }
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
static int cpu_avx2(void) { return 0; }
static int cpu_avx512(void) { return 0; }
static int cpu_avx512vnni(void) { return 0; }
static int cpu_avxvnni(void) { return 0; }
static int cpu_amx(void) { return 0; }
static int cpu_neon_dot(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
#else
static int cpu_avx2(void) { return 0; }
static int cpu_avx512(void) { return 0; }
static int cpu_avx512vnni(void) { return 0; }
static int cpu_avxvnni(void) { return 0; }
static int cpu_amx(void) { return 0; }
static int cpu_neon_dot(void) { return 0; }
#endif

int tllm_cpu_has_avx2(void) { return cap() >= 1 && cpu_avx2(); }
int tllm_cpu_has_avxvnni(void) { return cap() >= 2 && cpu_avxvnni(); }
int tllm_cpu_has_avx512(void) { return cap() >= 3 && cpu_avx512(); }
int tllm_cpu_has_avx512vnni(void) { return cap() >= 3 && cpu_avx512vnni(); }
int tllm_cpu_has_amx(void) { return cap() >= 4 && cpu_amx(); }
int tllm_cpu_has_neon_dot(void) { return cap() >= 1 && cpu_neon_dot(); }

const char *tllm_cpu_path(void) {
    return tllm_cpu_has_amx() ? "amx" : tllm_cpu_has_avx512vnni() ? "avx512-vnni" : tllm_cpu_has_avx512() ? "avx512" : tllm_cpu_has_avxvnni() ? "avx2-vnni"
           : tllm_cpu_has_avx2() ? "avx2" : tllm_cpu_has_neon_dot() ? "neon" : "ref";
}

/* The paths TLLM_CPU may name: whether this build has kernels for them, and whether this CPU runs
 * them (a build's own paths from the least to the most capable) */
static const struct {
    const char *name;
    int (*runs)(void); /* NULL: no kernels for it in this build */
} paths[] = {
#if defined(__aarch64__)
    {"neon", cpu_neon_dot}, {"avx2", NULL}, {"avxvnni", NULL}, {"avx512", NULL}, {"amx", NULL},
#else
    {"avx2", cpu_avx2}, {"avxvnni", cpu_avxvnni}, {"avx512", cpu_avx512}, {"amx", cpu_amx}, {"neon", NULL},
#endif
};

int tllm_cpu_select(void) {
    const char *e = getenv("TLLM_CPU");
    if (!e || !strcmp(e, "auto") || !strcmp(e, "ref")) return TLLM_OK;
    char list[64] = "auto, ref";
    const char *best = "ref";
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (paths[i].runs) {
            snprintf(list + strlen(list), sizeof list - strlen(list), ", %s", paths[i].name);
            if (paths[i].runs()) best = paths[i].name;
        }
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (strcmp(e, paths[i].name)) continue;
        if (!paths[i].runs) return tllm_fail(TLLM_ERR_ARG, "TLLM_CPU=%s: this build has no %s kernels (%s)", e, e, list);
        return paths[i].runs() ? TLLM_OK : tllm_fail(TLLM_ERR_ARG, "TLLM_CPU=%s: this CPU cannot run it (its best: %s)", e, best);
    }
    return tllm_fail(TLLM_ERR_ARG, "TLLM_CPU=%.40s: not a kernel path (%s)", e, list);
}
