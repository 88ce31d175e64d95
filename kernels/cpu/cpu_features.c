#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__)
int tllm_cpu_has_avx2(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return has;
}

int tllm_cpu_has_avx512(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    }
    return has;
}

int tllm_cpu_has_avx512vnni(void) {
    static int has = -1;
    if (has < 0) has = tllm_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni"); /* it ran cpu_init */
    return has;
}
#else
int tllm_cpu_has_avx2(void) { return 0; }
int tllm_cpu_has_avx512(void) { return 0; }
int tllm_cpu_has_avx512vnni(void) { return 0; }
#endif
