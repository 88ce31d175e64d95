/* The packed int8 kernels against their portable oracle, bit for bit, with nothing but the kernels
 * linked (no checkpoint, no json-c), so that it also builds with a cross compiler and runs under
 * qemu-user (tests/cross_neon.sh: the NEON kernel). Every bits / group / scale dtype (and mxfp4, nvfp4), a partial last
 * row block, 1 to 55 tokens (every tile size, three AMX tiles and a remainder), one and two activation levels, and the
 * dispatcher's choice (tllm_qpack_matmul) as well as each kernel this CPU runs called directly.
 * usage: test_qpack_kernels [PATH]   (PATH given: fail unless that is the path that runs) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/qpack_amx.h"
#include "kernels/cpu/qpack_avx2.h"
#include "kernels/cpu/qpack_avx512.h"
#include "kernels/cpu/qpack_neon.h"
#include "tests/check.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}
static float uniform(void) { return (float)(next() >> 8) / (float)(1 << 24) * 2.0f - 1.0f; }

/* scale and bias values of a dtype, stored as that dtype */
static void fill(void *dst, enum tllm_dtype dt, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        float v = lo + (hi - lo) * (uniform() * 0.5f + 0.5f);
        if (dt == TLLM_DT_F32) ((float *)dst)[i] = v;
        else if (dt == TLLM_DT_BF16) {
            uint32_t u;
            memcpy(&u, &v, 4);
            ((uint16_t *)dst)[i] = (uint16_t)(u >> 16);
        } else
            ((uint16_t *)dst)[i] = tllm_f32_to_f16(v);
    }
}

typedef void kernel_fn(const struct tllm_qpack *, const struct tllm_xq *, float *, int, int);

static int cases;

/* fmt: affine (scales and biases of dt), or mxfp4 / nvfp4 (E8M0 / E4M3 scale bytes, dt ignored) */
static void one_fmt(enum tllm_wformat fmt, int bits, int gs, enum tllm_dtype dt, int rows, int cols) {
    size_t words = (size_t)rows * cols * bits / 32, ng = (size_t)rows * (cols / gs);
    uint32_t *q = malloc(words * 4);
    void *sc = malloc(ng * 4), *bi = malloc(ng * 4);
    for (size_t i = 0; i < words; i++) q[i] = next();
    if (fmt == TLLM_WF_AFFINE) {
        fill(sc, dt, ng, 0.001f, 0.02f);
        fill(bi, dt, ng, -0.05f, 0.05f);
    } else {
        dt = TLLM_DT_U8;
        for (size_t i = 0; i < ng; i++) /* no NaN: E8M0 around 2^-8, E4M3 any positive but S.1111.111 */
            ((uint8_t *)sc)[i] = (uint8_t)(fmt == TLLM_WF_NVFP4 ? next() % 0x7f : 115 + next() % 10);
    }
    struct tllm_qweights w = {"w", rows, cols, fmt, dt, bits, gs, q, sc, fmt == TLLM_WF_AFFINE ? bi : NULL, NULL, NULL};
    struct tllm_qpack p;
    if (tllm_qpack_init(&p, &w) != TLLM_OK) {
        CHECK(0, "pack: %s", tllm_errmsg());
        return;
    }
    const int n = 55, nb = cols / TLLM_XQ_BLOCK; /* past three of the AMX kernel's tiles of 16 */
    float *x = malloc((size_t)n * cols * 4), *y0 = malloc((size_t)n * rows * 4), *y1 = malloc((size_t)n * rows * 4);
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = uniform() * (i % 97 == 0 ? 8.0f : 1.0f);
    struct {
        const char *name;
        kernel_fn *fn;
        int runs;
    } k[] = {{"dispatched", tllm_qpack_matmul, 1},
             {"amx", tllm_qpack_matmul_amx, tllm_cpu_has_amx()},
             {"avx512", tllm_qpack_matmul_avx512, tllm_cpu_has_avx512vnni()},
             {"avx2", tllm_qpack_matmul_avx2, tllm_cpu_has_avx2()},
             {"avxvnni", tllm_qpack_matmul_avxvnni, tllm_cpu_has_avxvnni()},
             {"neon", tllm_qpack_matmul_neon, tllm_cpu_has_neon_dot()}};
    for (int levels = 1; levels <= 2; levels++)
        for (int nt = 1; nt <= n; nt += nt < 4 ? 1 : 3) {
            struct tllm_xq xq = {nt, cols, malloc((size_t)nt * cols), malloc((size_t)nt * cols), malloc((size_t)nt * nb * 4),
                                 malloc((size_t)nt * nb * 4), levels == 2 ? nt / 2 + 1 : 0, malloc((size_t)nt * 2 * nb * 4)};
            tllm_xq_quantize(&xq, x, 0, nt);
            tllm_qpack_matmul_ref(&p, &xq, y0, 0, p.n_blocks);
            for (size_t i = 0; i < (size_t)nt * rows; i++)
                if (!isfinite(y0[i])) {
                    CHECK(0, "the portable kernel's output is not finite");
                    break;
                }
            for (size_t j = 0; j < sizeof k / sizeof k[0]; j++) {
                if (!k[j].runs) continue;
                memset(y1, 0xff, (size_t)nt * rows * 4);
                int split = p.n_blocks / 2; /* two calls over split block ranges, as two threads would */
                k[j].fn(&p, &xq, y1, 0, split);
                k[j].fn(&p, &xq, y1, split, p.n_blocks);
                CHECK(memcmp(y0, y1, (size_t)nt * rows * 4) == 0, "%s: bits %d g%d %s rows %d cols %d tokens %d levels %d: != portable",
                      k[j].name, bits, gs, tllm_dtype_name(dt), rows, cols, nt, levels);
                cases++;
            }
            free(xq.q), free(xq.q2), free(xq.d), free(xq.sum), free(xq.sum16);
        }
    tllm_qpack_free(&p);
    free(q), free(sc), free(bi), free(x), free(y0), free(y1);
}

static void one(int bits, int gs, enum tllm_dtype dt, int rows, int cols) { one_fmt(TLLM_WF_AFFINE, bits, gs, dt, rows, cols); }

/* The activation quantizer the dispatcher picks (AVX-512 here where the CPU has it) against the
 * portable one, bit for bit: codes of both levels, scales and (half-)block sums. Blocks of every scale,
 * one of zeros, one with a NaN and an infinity-free huge value, and values on the codes' rounding ties. */
static void quantizer(void) {
    enum { N = 7, COLS = 256, NB = COLS / 32 };
    static float x[N * COLS];
    for (int i = 0; i < N * COLS; i++) x[i] = uniform() * powf(2.0f, (float)(i / 32 % 24) - 12.0f);
    for (int j = 0; j < 32; j++) x[32 + j] = 0.0f;                    /* token 0, block 1: zeros */
    x[2 * 32 + 5] = NAN;                                             /* block 2: a NaN the max skips */
    x[3 * 32 + 7] = 3e38f;
    for (int j = 0; j < 32; j++) x[4 * 32 + j] = (float)(j - 16) + 0.5f; /* ties after scaling by 127 / 15.5 */
    x[4 * 32] = 127.0f;                                              /* ... and by 1: codes exactly k + 0.5 */
    /* d = 3, so x / d is x times 1/3 rounded up: k + 0.5 rounded to float is a tie (to even), where one
     * fused multiply-add would see the exact product just above it and round up */
    for (int j = 0; j < 32; j++) x[5 * 32 + j] = 3.0f * ((float)(j - 16) + 0.5f);
    x[5 * 32] = 381.0f;
    for (int levels = 1; levels <= 2; levels++) {
        static int8_t q[2][N * COLS], q2[2][N * COLS];
        static float d[2][N * NB], sum[2][N * NB], sum16[2][N * NB * 2];
        for (int k = 0; k < 2; k++) {
            struct tllm_xq xq = {N, COLS, q[k], levels == 2 ? q2[k] : NULL, d[k], sum[k], levels == 2 ? N - 2 : 0, sum16[k]};
            memset(q2[k], 0, sizeof q2[k]);
            (k ? tllm_xq_quantize : tllm_xq_quantize_ref)(&xq, x, 0, N);
        }
        CHECK(!memcmp(q[0], q[1], sizeof q[0]) && !memcmp(q2[0], q2[1], sizeof q2[0]), "quantizer (%d levels, path %s): codes != portable",
              levels, tllm_cpu_path());
        CHECK(!memcmp(d[0], d[1], sizeof d[0]) && !memcmp(sum[0], sum[1], sizeof sum[0]) && !memcmp(sum16[0], sum16[1], sizeof sum16[0]),
              "quantizer (%d levels, path %s): scales or sums != portable", levels, tllm_cpu_path());
        cases += 2;
    }
}

int main(int argc, char **argv) {
    const int bits[] = {2, 4, 8}, gss[] = {32, 64, 128};
    const enum tllm_dtype dts[] = {TLLM_DT_BF16, TLLM_DT_F16, TLLM_DT_F32};
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < 3; g++)
            for (int d = 0; d < 3; d++) one(bits[b], gss[g], dts[d], 16 * (1 + (b + g) % 3) + (d ? 5 : 0), gss[g] * (1 + d));
    for (int b = 0; b < 3; b++) /* groups of 16 (GGUF's Q2_K, Q3_K, Q6_K): half an activation block each */
        for (int d = 0; d < 3; d++) one(bits[b], 16, dts[d], 16 * (1 + (b + d) % 3) + 7, 32 * (1 + d));
    one(4, 64, TLLM_DT_BF16, 3, 64);  /* a single partial row block, one group */
    one(8, 32, TLLM_DT_F16, 40, 896); /* the decode shapes' group count */
    one_fmt(TLLM_WF_MXFP4, 4, 32, TLLM_DT_U8, 21, 96); /* E2M1 codes in the 8-bit pack */
    one_fmt(TLLM_WF_NVFP4, 4, 16, TLLM_DT_U8, 37, 160); /* groups of half an activation block */
    one_fmt(TLLM_WF_NVFP4, 4, 16, TLLM_DT_U8, 16, 32);
    quantizer();
    printf("packed kernels: %d comparisons with the portable kernel, bit for bit; path %s\n", cases, tllm_cpu_path());
    if (argc > 1) CHECK(!strcmp(argv[1], tllm_cpu_path()), "the path that runs is %s, not %s", tllm_cpu_path(), argv[1]);
    return check_done();
}
