/* The float-activation decode kernels (--exact: tllm_qmatmul for one and two tokens, which takes
 * qmatmul_avx2.c on x86 and qmatmul_neon.c on arm64) against the scalar oracle, with nothing but the
 * kernels linked, so that it also builds with a cross compiler and runs under qemu-user
 * (tests/cross_neon.sh). Affine 4- and 8-bit codes, groups of 32/64/128, every scale dtype.
 * usage: test_qmatvec_kernels [PATH]   (PATH given: fail unless that is the CPU path that runs) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qmatmul.h"
#include "tests/check.h"

/* |y - oracle| <= TOL x sum_j |w_j x_j|: float32 sums of a row in another order */
#define TOL_QMATVEC 1e-5

static uint64_t rng = 88172645463325252ull;
static uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}
static float uniform(void) { return (float)(next() >> 8) / (float)(1 << 24) * 2.0f - 1.0f; }

static void put(void *p, enum tllm_dtype dt, size_t i, float v) {
    if (dt == TLLM_DT_F32) ((float *)p)[i] = v;
    else if (dt == TLLM_DT_F16) ((uint16_t *)p)[i] = tllm_f32_to_f16(v);
    else ((uint16_t *)p)[i] = tllm_f32_to_bf16(v);
}

static int cases;

static void one(int bits, int gs, enum tllm_dtype dt, int rows, int cols) {
    size_t ng = (size_t)rows * (cols / gs), es = tllm_dtype_size(dt);
    uint8_t *codes = malloc((size_t)rows * cols * bits / 8);
    void *sc = malloc(ng * es), *bi = malloc(ng * es);
    for (size_t i = 0; i < (size_t)rows * cols * bits / 8; i++) codes[i] = (uint8_t)next();
    for (size_t g = 0; g < ng; g++) put(sc, dt, g, 0.01f + 0.04f * (uniform() * 0.5f + 0.5f)), put(bi, dt, g, 0.3f * uniform());
    struct tllm_qweights w = {.name = "test", .rows = rows, .cols = cols, .format = TLLM_WF_AFFINE, .dtype = dt, .bits = bits,
                              .group_size = gs, .w = codes, .scales = sc, .biases = bi};
    float *x = malloc(2 * (size_t)cols * 4), *y0 = malloc(2 * (size_t)rows * 4), *y1 = malloc(2 * (size_t)rows * 4);
    float *wr = malloc((size_t)cols * 4);
    for (int i = 0; i < 2 * cols; i++) x[i] = uniform() * (i % 13 == 0 ? 6.0f : 1.0f);
    for (int n = 1; n <= 2; n++) {
        tllm_qmatmul_ref(&w, x, n, y0, 0, rows);
        tllm_qmatmul(&w, x, n, y1, 0, rows / 2); /* two row ranges, as two threads take them */
        tllm_qmatmul(&w, x, n, y1, rows / 2, rows);
        double worst = 0;
        for (int r = 0; r < rows; r++) {
            tllm_qw_dequant_row_ref(&w, r, wr);
            for (int t = 0; t < n; t++) {
                double mag = 0;
                for (int j = 0; j < cols; j++) mag += fabs((double)wr[j] * x[(size_t)t * cols + j]);
                double err = fabs((double)y1[(size_t)t * rows + r] - y0[(size_t)t * rows + r]) / (mag > 0 ? mag : 1);
                worst = err > worst ? err : worst;
            }
        }
        CHECK(worst <= TOL_QMATVEC, "bits %d g%d %s %d x %d, %d tokens: error %.3g of sum |w x|", bits, gs, tllm_dtype_name(dt),
              rows, cols, n, worst);
        cases++;
    }
    free(codes), free(sc), free(bi), free(x), free(y0), free(y1), free(wr);
}

int main(int argc, char **argv) {
    const enum tllm_dtype dts[] = {TLLM_DT_BF16, TLLM_DT_F16, TLLM_DT_F32};
    for (int b = 4; b <= 8; b += 4)
        for (int gs = 32; gs <= 128; gs *= 2)
            for (int d = 0; d < 3; d++) one(b, gs, dts[d], 7 + 16 * d, gs * (2 + d));
    one(4, 64, TLLM_DT_BF16, 33, 896); /* a decode shape */
    printf("float decode kernels: %d comparisons with the scalar oracle; path %s\n", cases, tllm_cpu_path());
    if (argc > 1) CHECK(!strcmp(argv[1], tllm_cpu_path()), "the path that runs is %s, not %s", tllm_cpu_path(), argv[1]);
    return check_done();
}
