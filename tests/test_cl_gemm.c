/* Prefill's GEMM kernels (kernels/opencl/gemm.cl) against a scalar oracle in double precision, on
 * shapes that do not fill their tiles: rows and tokens past a multiple of 64, K of one group or with
 * a half-filled staging step, every code width (2, 4, 8 bits), group size (16, 32, 64, 128), scale type
 * (bf16, f16, f32) and dense weights; int8 inputs in one and two levels (gemm_q8, and gemm_q8_mma on NVIDIA) and float
 * ones (gemm_f); unsplit and split along K. Steps of a few tokens (gemm_few: FEW_TN, 2 by default, and
 * 8 compiled in with TLLM_CL_OPTS) must equal the tiled GEMM's outputs to the bit: a sequence's logits
 * may not depend on the size of its step. PoCL runs it in CI. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "engine/backend/registry.h"
#include "engine/load/model.h"
#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cpu/qmatmul.h"

/* |y - oracle| <= TOL x sum_k |w_k x_k|: float32 sums of at most a few hundred products in another
 * order. The int8 oracle multiplies the inputs as the device quantizes them (the same float
 * operations, so the same codes but where a code sits at a tie: quantize_like_device's slack). */
#define TOL_GEMM 2e-6

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float uniform(float a, float b) { return a + (b - a) * (float)(next_u32() & 0xffffff) / 16777216.0f; }

static void put(void *p, enum tllm_dtype dt, size_t i, float v) {
    if (dt == TLLM_DT_F32) ((float *)p)[i] = v;
    else if (dt == TLLM_DT_F16) ((uint16_t *)p)[i] = tllm_f32_to_f16(v);
    else ((uint16_t *)p)[i] = tllm_f32_to_bf16(v);
}

/* Whether a (a code times 1 / d) lies so near a rounding boundary that a device's divisions, which
 * OpenCL lets be 2.5 ulp off (NVIDIA's are), may round it the other way: d = max|x| / 127 and 1 / d
 * each 3e-7 off relative. Level one's a = x / d (|a| <= 127) moves by at most 127 x 6e-7 < 1e-4;
 * level two's a2 = (x - q d) 128 / d mostly through q d: by up to 128 x 127 x 3e-7 + 64 x 6e-7 < 5e-3. */
#define TIE_1 1e-4f
#define TIE_2 5e-3f
static int near_tie(float a, float eps) { return fabsf(fabsf(a - truncf(a)) - 0.5f) < eps; }

/* x as the device's int8 inputs take it (emit_lane in kernels/opencl/prefill.cl): per block of 32,
 * d = max|x| / 127, q = rint(x / d), and with two levels q2 = rint(fma(-q, d, x) 128 / d): x ~ d q (+ d q2 / 128).
 * slack: how far the device's value may be from xq where a code sits at a tie (near_tie): one step of
 * the last level (either way it rounds, the value stays within half a step of x) */
static void quantize_like_device(const float *x, float *xq, float *slack, size_t n, int levels) {
    for (size_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b + j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            float a = x[b + j] * id, q = rintf(a), a2 = fmaf(-q, d, x[b + j]) * id * 128.0f;
            float q2 = levels == 2 ? fminf(fmaxf(rintf(a2), -127.0f), 127.0f) : 0.0f;
            xq[b + j] = (float)((double)d * q + (double)d * q2 / 128.0);
            slack[b + j] = near_tie(a, TIE_1) || (levels == 2 && near_tie(a2, TIE_2)) ? (levels == 2 ? d / 128.0f : d) : 0.0f;
        }
    }
}

static void one_case(struct tllm_backend *cl, int bits, int gs, enum tllm_dtype dt, int rows, int cols, int n, int int8, const char *split) {
    struct tllm_qweights w = {.name = "test", .rows = rows, .cols = cols, .dtype = dt, .bits = bits, .group_size = gs};
    size_t es = tllm_dtype_size(dt), ng = bits ? (size_t)rows * (size_t)(cols / gs) : 0;
    void *codes = malloc(bits ? (size_t)rows * cols / 8 * bits : (size_t)rows * cols * es);
    void *sc = malloc(ng * es + 1), *bi = malloc(ng * es + 1);
    if (bits) {
        w.format = TLLM_WF_AFFINE;
        for (size_t i = 0; i < (size_t)rows * cols / 32 * bits; i++) ((uint32_t *)codes)[i] = next_u32();
        for (size_t g = 0; g < ng; g++) put(sc, dt, g, uniform(0.002f, 0.05f)), put(bi, dt, g, uniform(-0.4f, 0.1f));
    } else {
        w.format = TLLM_WF_DENSE;
        for (size_t i = 0; i < (size_t)rows * cols; i++) put(codes, dt, i, uniform(-0.3f, 0.3f));
    }
    w.w = codes, w.scales = sc, w.biases = bi;
    float *x = malloc((size_t)n * cols * sizeof(float)), *xo = malloc((size_t)n * cols * sizeof(float));
    float *slack = calloc((size_t)n * cols, sizeof(float));
    float *y = malloc((size_t)n * rows * sizeof(float)), *wr = malloc((size_t)cols * sizeof(float));
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = uniform(-2.0f, 2.0f) * (i % 7 == 0 ? 4.0f : 1.0f);
    if (int8) quantize_like_device(x, xo, slack, (size_t)n * cols, int8);
    else memcpy(xo, x, (size_t)n * cols * sizeof(float));
    if (split) setenv("TLLM_CL_SPLIT", split, 1);
    int rc = cl->ops->matmul(cl, &w, x, n, int8, y, 0, NULL);
    if (split) unsetenv("TLLM_CL_SPLIT");
    char what[160];
    snprintf(what, sizeof what, "%s %d-bit g%d %s, %d x %d, %d tokens, %s inputs%s%s", bits ? "affine" : "dense", bits, gs,
             tllm_dtype_name(dt), rows, cols, n, int8 == 2 ? "two-level int8" : int8 ? "int8" : "float", split ? ", split " : "", split ? split : "");
    CHECK(rc == TLLM_OK, "%s: %s", what, tllm_errmsg());
    double worst = 0;
    for (int r = 0; r < rows && rc == TLLM_OK; r++) {
        tllm_qw_dequant_row_ref(&w, r, wr);
        for (int t = 0; t < n; t++) {
            double s = 0, mag = 0, tie = 0;
            for (int k = 0; k < cols; k++) {
                double p = (double)wr[k] * xo[(size_t)t * cols + k];
                s += p, mag += fabs(p), tie += fabs((double)wr[k]) * slack[(size_t)t * cols + k];
            }
            double err = fmax(0.0, fabs(y[(size_t)t * rows + r] - s) - tie) / (mag > 0 ? mag : 1);
            worst = err > worst ? err : worst;
        }
    }
    CHECK(worst <= TOL_GEMM, "%s: error %.3g of sum |w x| (tolerance %.0e)", what, worst, TOL_GEMM);
    if (int8 && n <= 32 && rc == TLLM_OK) { /* gemm_few (n <= FEW_TN) or gemm_q8_mma's tiles of 16 or 32 tokens
                                              * took it: the bits of the tiles of 64 */
        float *yg = malloc((size_t)n * rows * sizeof(float));
        setenv("TLLM_CL_NO_FEW", "1", 1), setenv("TLLM_CL_NO_MMA_S", "1", 1);
        if (split) setenv("TLLM_CL_SPLIT", split, 1);
        rc = cl->ops->matmul(cl, &w, x, n, int8, yg, 0, NULL);
        unsetenv("TLLM_CL_SPLIT"), unsetenv("TLLM_CL_NO_FEW"), unsetenv("TLLM_CL_NO_MMA_S");
        CHECK(rc == TLLM_OK, "%s, tiled: %s", what, tllm_errmsg());
        size_t diff = 0;
        for (size_t i = 0; rc == TLLM_OK && i < (size_t)n * rows; i++) diff += memcmp(&y[i], &yg[i], sizeof *y) != 0;
        CHECK(diff == 0, "%s: %zu of %zu outputs differ from the 64-token tiles'", what, diff, (size_t)n * rows);
        free(yg);
    }
    free(codes), free(sc), free(bi), free(x), free(xo), free(slack), free(y), free(wr);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_cl_gemm MODEL_DIR (a model of more than one weight format)\n");
        return 2;
    }
    struct tllm_model *m;
    struct tllm_backend *cl = NULL;
    if (tllm_model_load(argv[1], &m) != TLLM_OK) {
        fprintf(stderr, "%s\n", tllm_errmsg());
        return 1;
    }
    /* The cases come in every format: the program must read any, so no copy of the reads per format of
     * the model's (Q_COPIES, a GPU's default for a model of a few formats) */
    const char *user = getenv("TLLM_CL_OPTS");
    char any[512];
    snprintf(any, sizeof any, "%s -DMIX_COPIES=0", user ? user : "");
    setenv("TLLM_CL_OPTS", any, 1);
    const char *dev = getenv("TLLM_TEST_CL_DEVICE");
    int rc = tllm_backend_device_init(&cl, m, 16, dev ? atoi(dev) : -1);
    if (rc == TLLM_ERR_UNSUPPORTED) {
        printf("no OpenCL device: skipped (%s)\n", tllm_errmsg());
        tllm_backend_free(cl);
        tllm_model_free(m);
        return 77;
    }
    CHECK(rc == TLLM_OK, "opencl: %s", tllm_errmsg());
    if (rc == TLLM_OK) {
        struct tllm_backend_info info;
        tllm_backend_describe(cl, &info);
        printf("%s\n", info.name);
        const enum tllm_dtype dts[3] = {TLLM_DT_BF16, TLLM_DT_F16, TLLM_DT_F32};
        int bits[3] = {2, 4, 8}, gss[3] = {32, 64, 128}, i = 0;
        for (int b = 0; b < 3; b++)
            for (int g = 0; g < 3; g++, i++) {
                enum tllm_dtype dt = dts[i % 3];
                /* K: one group (rows of whole 16 bytes: the decode kernels' condition) */
                int k1 = gss[g] * bits[b] % 128 ? 128 / bits[b] : gss[g];
                for (int int8 = 0; int8 <= 2; int8++) {
                    one_case(cl, bits[b], gss[g], dt, 67, k1, 5, int8, NULL);
                    one_case(cl, bits[b], gss[g], dt, 130, 384, 70, int8, NULL); /* rows and tokens past the tiles */
                    one_case(cl, bits[b], gss[g], dt, 130, 384, 70, int8, "3");  /* split along K */
                }
                for (int lv = 1; lv <= 2; lv++) { /* steps of a few tokens (gemm_few): K of odd steps, split or not */
                    one_case(cl, bits[b], gss[g], dt, 75, 640, 1, lv, NULL);
                    one_case(cl, bits[b], gss[g], dt, 75, 640, 2, lv, "3");
                    one_case(cl, bits[b], gss[g], dt, 33, 2304, 2, lv, NULL); /* more units than a work-group's threads */
                }
                if (gss[g] == 32 && bits[b] > 2) /* half a staging step */
                    for (int lv = 1; lv <= 2; lv++) one_case(cl, bits[b], 32, dt, 67, 96, 3, lv, NULL);
                for (int lv = 1; lv <= 2; lv++) { /* steps of 3-32 tokens (NVIDIA: gemm_q8_mma's tiles of 16, 32) */
                    one_case(cl, bits[b], gss[g], dt, 130, 384, 16, lv, "3");
                    one_case(cl, bits[b], gss[g], dt, 75, 640, 11, lv, NULL);
                    one_case(cl, bits[b], gss[g], dt, 130, 384, 32, lv, "3");
                    one_case(cl, bits[b], gss[g], dt, 75, 640, 21, lv, NULL);
                }
            }
        for (int b = 0; b < 3; b++) { /* groups of 16 (GGUF's K-quants, nvfp4): a term a half block */
            int k1 = 128 / bits[b] > 32 ? 128 / bits[b] : 32;
            for (int int8 = 0; int8 <= 2; int8++) {
                one_case(cl, bits[b], 16, dts[b], 67, k1, 5, int8, NULL);
                one_case(cl, bits[b], 16, dts[b], 130, 384, 70, int8, NULL);
                one_case(cl, bits[b], 16, dts[b], 130, 384, 70, int8, "3");
            }
            for (int lv = 1; lv <= 2; lv++) {
                one_case(cl, bits[b], 16, dts[(b + 1) % 3], 75, 640, 1, lv, NULL);
                one_case(cl, bits[b], 16, dts[(b + 1) % 3], 75, 640, 2, lv, "3");
                one_case(cl, bits[b], 16, dts[(b + 2) % 3], 33, 2304, 2, lv, NULL);
            }
        }
        for (int d = 0; d < 3; d++) {
            one_case(cl, 0, 0, dts[d], 67, 96, 70, 0, NULL);
            one_case(cl, 0, 0, dts[d], 130, 384, 9, 0, "2");
        }
        /* gemm_few compiled for steps of up to 8 tokens (-DFEW_TN=8), each thread reading 3 units at once
         * (-DFEW_U=3; 1 above): the same bits as the tiled GEMM */
        struct tllm_backend *cl8 = NULL;
        const char *opts = getenv("TLLM_CL_OPTS");
        char *saved = opts ? strdup(opts) : NULL, o8[512];
        snprintf(o8, sizeof o8, "%s -DFEW_TN=8 -DFEW_U=3", opts ? opts : "");
        setenv("TLLM_CL_OPTS", o8, 1);
        rc = tllm_backend_device_init(&cl8, m, 16, dev ? atoi(dev) : -1);
        CHECK(rc == TLLM_OK, "opencl, FEW_TN=8, FEW_U=3: %s", tllm_errmsg());
        for (int b = 0; b < 3 && rc == TLLM_OK; b++)
            for (int lv = 1; lv <= 2; lv++) {
                one_case(cl8, bits[b], 64, dts[b], 75, 640, 5, lv, NULL);
                one_case(cl8, bits[b], 32, dts[b], 33, 2304, 8, lv, "3");
                one_case(cl8, bits[b], 16, dts[b], 75, 640, 6, lv, "2");
            }
        tllm_backend_free(cl8);
        if (saved) setenv("TLLM_CL_OPTS", saved, 1), free(saved);
        else unsetenv("TLLM_CL_OPTS");
        /* a format the kernels do not read: refused, with that said */
        struct tllm_qweights w = {.name = "x", .rows = 1, .cols = 32, .format = TLLM_WF_AFFINE, .bits = 3, .group_size = 32};
        float x[32] = {0}, y[1];
        CHECK(cl->ops->matmul(cl, &w, x, 1, 0, y, 0, NULL) != TLLM_OK && strstr(tllm_errmsg(), "not dense or 2/4/8-bit"), "3-bit: %s",
              tllm_errmsg());
    }
    tllm_backend_free(cl);
    tllm_model_free(m);
    return check_done();
}
