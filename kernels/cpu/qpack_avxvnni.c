/* The AVX2 kernel of qpack_avx2.c with vpdpbusd (AVX-VNNI, 256-bit; CPUs with it but without
 * AVX-512 VNNI: Intel's since Alder Lake, AMD's since Zen 5): the same source, compiled again. */
#define TLLM_QPACK_AVXVNNI 1
#include "kernels/cpu/qpack_avx2.c"
