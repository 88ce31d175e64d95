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
static void kernels(const struct tllm_qweights *w, int forms);

/* fmt: affine (scales and biases of dt), or mxfp4 / nvfp4 (E8M0 / E4M3 scale bytes, dt ignored); forms:
 * the pack's compact forms (qpack.h), where the weights allow them */
static void one_fmt(enum tllm_wformat fmt, int bits, int gs, enum tllm_dtype dt, int rows, int cols, int forms) {
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
    kernels(&w, forms);
    free(q), free(sc), free(bi);
}

/* w packed (forms: the compact forms, where they apply), every kernel this CPU runs against the portable one */
static void kernels(const struct tllm_qweights *wp, int forms) {
    const struct tllm_qweights w = *wp;
    const int rows = w.rows, cols = w.cols, bits = w.bits, gs = w.group_size;
    const enum tllm_dtype dt = w.dtype;
    struct tllm_qpack p;
    if (tllm_qpack_init_as(&p, &w, forms) != TLLM_OK) {
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
                CHECK(memcmp(y0, y1, (size_t)nt * rows * 4) == 0, "%s: bits %d (pack %d%s) g%d %s rows %d cols %d tokens %d levels %d: != portable",
                      k[j].name, bits, p.bits, p.super ? ", two-level" : "", gs, tllm_dtype_name(dt), rows, cols, nt, levels);
                cases++;
            }
            free(xq.q), free(xq.q2), free(xq.d), free(xq.sum), free(xq.sum16);
        }
    tllm_qpack_free(&p);
    free(x), free(y0), free(y1);
}

static void one(int bits, int gs, enum tllm_dtype dt, int rows, int cols) { one_fmt(TLLM_WF_AFFINE, bits, gs, dt, rows, cols, 0); }

/* w packed plain (p0) and in the compact forms (p1), and the portable kernel's products of both for n
 * random tokens (the first n2 with two levels): x [n x cols], y0 and y1 [n x rows] (free() them); 0 when
 * a pack failed (checked) */
struct two_packs {
    struct tllm_qpack p0, p1;
    float *x, *y0, *y1;
};
static int two_packs(const struct tllm_qweights *w, int n, int n2, struct two_packs *t) {
    memset(t, 0, sizeof *t);
    if (tllm_qpack_init_as(&t->p0, w, 0) || tllm_qpack_init_as(&t->p1, w, TLLM_QPACK_PLANES | TLLM_QPACK_SCALES)) {
        CHECK(0, "pack: %s", tllm_errmsg());
        tllm_qpack_free(&t->p0);
        return 0;
    }
    const int cols = w->cols, rows = w->rows, nb = cols / TLLM_XQ_BLOCK;
    t->x = malloc((size_t)n * cols * 4), t->y0 = malloc((size_t)n * rows * 4), t->y1 = malloc((size_t)n * rows * 4);
    for (size_t i = 0; i < (size_t)n * cols; i++) t->x[i] = uniform();
    struct tllm_xq xq = {n, cols, malloc((size_t)n * cols), malloc((size_t)n * cols), malloc((size_t)n * nb * 4),
                         malloc((size_t)n * nb * 4), n2, malloc((size_t)n * 2 * nb * 4)};
    tllm_xq_quantize(&xq, t->x, 0, n);
    tllm_qpack_matmul_ref(&t->p0, &xq, t->y0, 0, t->p0.n_blocks);
    tllm_qpack_matmul_ref(&t->p1, &xq, t->y1, 0, t->p1.n_blocks);
    free(xq.q), free(xq.q2), free(xq.d), free(xq.sum), free(xq.sum16);
    cases++;
    return 1;
}
static void two_packs_free(struct two_packs *t) {
    tllm_qpack_free(&t->p0), tllm_qpack_free(&t->p1);
    free(t->x), free(t->y0), free(t->y1);
}

/* 5- and 6-bit codes as planes and as 8-bit codes: the same products. Against a float sum of the
 * dequantized weights too, so that a plane layout the portable kernel misreads the same way as the SIMD
 * ones cannot pass: the two packs must agree with each other, and the 8-bit pack is the tested old form. */
static void planes(int bits, int gs, enum tllm_dtype dt, int rows, int cols) {
    size_t words = (size_t)rows * cols * bits / 32 + 1, ng = (size_t)rows * (cols / gs);
    uint32_t *q = malloc(words * 4);
    void *sc = malloc(ng * 4), *bi = malloc(ng * 4);
    for (size_t i = 0; i < words; i++) q[i] = next();
    fill(sc, dt, ng, 0.001f, 0.02f);
    fill(bi, dt, ng, -0.05f, 0.05f);
    struct tllm_qweights w = {"w", rows, cols, TLLM_WF_AFFINE, dt, bits, gs, q, sc, bi, NULL, NULL};
    struct two_packs t;
    const int n = 3;
    if (!two_packs(&w, n, 2, &t)) return;
    const float *x = t.x, *y0 = t.y0;
    CHECK(t.p0.bits == 8 && t.p1.bits == (bits == 5 && gs < 32 ? 8 : bits), "bits %d g%d: packs of %d and %d bits", bits, gs, t.p0.bits,
          t.p1.bits);
    CHECK(t.p1.block_bytes * 8 == t.p0.block_bytes * (size_t)t.p1.bits, "bits %d g%d: plane pack of %zu bytes a block", bits, gs,
          t.p1.block_bytes);
    CHECK(!memcmp(t.y0, t.y1, (size_t)n * rows * 4), "bits %d g%d %s: the plane pack's products != the 8-bit pack's", bits, gs,
          tllm_dtype_name(dt));
    double err = 0, ref = 0; /* and the 8-bit pack against the float weights (int8 activations: ~1e-2 one level, 1e-4 two) */
    for (int tk = 0; tk < n; tk++)
        for (int r = 0; r < rows; r++) {
            double sum = 0;
            for (int j = 0; j < cols; j++) {
                size_t gi = (size_t)r * (size_t)(cols / gs) + (size_t)(j / gs);
                double wv = (double)tllm_load_f32(sc, dt, gi) * tllm_qw_code(&w, r, j) + tllm_load_f32(bi, dt, gi);
                sum += wv * x[(size_t)tk * cols + j];
            }
            err += (sum - y0[(size_t)tk * rows + r]) * (sum - y0[(size_t)tk * rows + r]), ref += sum * sum;
        }
    CHECK(sqrt(err / ref) < 2e-2, "bits %d g%d: 8-bit pack vs float weights, relative error %.3g", bits, gs, sqrt(err / ref));
    two_packs_free(&t);
    free(q), free(sc), free(bi);
    for (int pl = 0; pl <= 1; pl++) one_fmt(TLLM_WF_AFFINE, bits, gs, dt, rows, cols, pl ? TLLM_QPACK_PLANES | TLLM_QPACK_SCALES : 0);
}

/* k-quant-like float32 scales and biases (a float16 a superblock of 256 columns times a small integer a
 * group: Q4_K's d * sc and -dmin * m with sym 0, Q6_K's d * sc and -32 d * sc, -2^(bits-1) scales, with sym 1) become two
 * levels where planes are asked for; the products equal the plain float32 pack's bit for bit, on every
 * kernel. A scale that does not factor keeps the whole matrix plain. */
static void kquant(int bits, int gs, int sym, int rows, int cols, int spoil) {
    size_t words = (size_t)rows * cols * bits / 32 + 1, ng = (size_t)rows * (cols / gs);
    uint32_t *q = malloc(words * 4);
    float *sc = malloc(ng * 4), *bi = malloc(ng * 4);
    for (size_t i = 0; i < words; i++) q[i] = next();
    const int G = 256 / gs;
    for (size_t i = 0; i < ng; i += (size_t)G) {
        float d = tllm_f16_to_f32(tllm_f32_to_f16(0.0005f + 0.001f * (uniform() + 1.0f)));
        float dmin = tllm_f16_to_f32(tllm_f32_to_f16(0.001f * (uniform() + 1.0f)));
        for (int g = 0; g < G; g++) {
            int a = sym ? (int)(next() % 256) - 128 : (int)(next() % 64), m = (int)(next() % 64);
            sc[i + g] = d * (float)a;
            bi[i + g] = sym ? -(float)(1 << (bits - 1)) * sc[i + g] : -dmin * (float)m;
        }
    }
    if (spoil) sc[ng / 2] = 0.0123456789f; /* not a float16 times an integer with the others */
    struct tllm_qweights w = {"w", rows, cols, TLLM_WF_AFFINE, TLLM_DT_F32, bits, gs, q, sc, bi, NULL, NULL};
    struct two_packs t;
    const int n = 5;
    if (!two_packs(&w, n, 3, &t)) return;
    CHECK(t.p0.super == 0 && t.p1.super == (spoil ? 0 : G) && (t.p1.sym != 0) == sym, "bits %d g%d%s: superblocks of %d groups, symmetric %g",
          bits, gs, spoil ? " (spoiled)" : "", t.p1.super, (double)t.p1.sym);
    if (!spoil) CHECK(tllm_qpack_nbytes(&t.p1) < tllm_qpack_nbytes(&t.p0), "two-level scales take no fewer bytes");
    CHECK(!memcmp(t.y0, t.y1, (size_t)n * rows * 4), "bits %d g%d: two-level scales' products != float32 scales'", bits, gs);
    two_packs_free(&t);
    kernels(&w, TLLM_QPACK_PLANES | TLLM_QPACK_SCALES); /* every kernel on the two-level pack */
    kernels(&w, TLLM_QPACK_SCALES);                     /* and without planes (AVX2's form) */
    free(q), free(sc), free(bi);
}

/* Symmetric codes (bias = -2^(bits-1) x scale, as GGUF's Q4_0, Q5_0, Q8_0 map): the biases are dropped
 * where the compact forms are asked for, with the same products; one bias off by an ulp keeps them. */
static void symm(int bits, int gs, enum tllm_dtype dt, int rows, int cols, int spoil) {
    size_t words = (size_t)rows * cols * bits / 32 + 1, ng = (size_t)rows * (cols / gs), esz = tllm_dtype_size(dt);
    uint32_t *q = malloc(words * 4);
    void *sc = malloc(ng * 4), *bi = malloc(ng * 4);
    for (size_t i = 0; i < words; i++) q[i] = next();
    fill(sc, dt, ng, -0.02f, 0.02f);
    for (size_t i = 0; i < ng; i++) { /* -2^(bits-1) x the scale, exact in every dtype */
        float v = -(float)(1 << (bits - 1)) * tllm_load_f32(sc, dt, i);
        if (dt == TLLM_DT_F32) ((float *)bi)[i] = v;
        else if (dt == TLLM_DT_F16) ((uint16_t *)bi)[i] = tllm_f32_to_f16(v);
        else memcpy((char *)bi + i * esz, (const char *)&v + 2, 2);
    }
    if (spoil) ((uint8_t *)bi)[(ng / 3) * esz] ^= 1;
    struct tllm_qweights w = {"w", rows, cols, TLLM_WF_AFFINE, dt, bits, gs, q, sc, bi, NULL, NULL};
    struct two_packs t;
    const int n = 4;
    if (!two_packs(&w, n, 2, &t)) return;
    CHECK(!t.p0.sym && (t.p1.sym != 0) == !spoil && (t.p1.biases == NULL) == !spoil, "bits %d g%d %s%s: symmetric %g", bits, gs,
          tllm_dtype_name(dt), spoil ? " (spoiled)" : "", (double)t.p1.sym);
    CHECK(!memcmp(t.y0, t.y1, (size_t)n * rows * 4), "bits %d g%d %s: symmetric pack's products != the biases'", bits, gs,
          tllm_dtype_name(dt));
    two_packs_free(&t);
    kernels(&w, TLLM_QPACK_PLANES | TLLM_QPACK_SCALES);
    kernels(&w, TLLM_QPACK_SCALES);
    free(q), free(sc), free(bi);
}

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

/* tllm_f16_i8_factor finds a factoring wherever one exists: values made as a float16 (normal or
 * subnormal, either sign) times int8s (all equal, with -128, zeros, one nonzero), 8 or 16 of them */
static void factor_cases(void) {
    int fails = 0;
    for (int t = 0; t < 20000; t++) {
        int n = t % 2 ? 16 : 8, kind = t % 5;
        uint16_t h = (uint16_t)(next() & 0x7bff) | (uint16_t)(t % 3 == 0 ? 0x8000 : 0); /* finite */
        if (kind == 4) h &= 0x83ff;                                                      /* subnormal */
        float d = tllm_f16_to_f32(h), v[16], got[16];
        int8_t q[16], q2[16];
        for (int i = 0; i < n; i++) {
            int a = (int)(next() % 256) - 128;
            q[i] = (int8_t)(kind == 0 ? 37 : kind == 1 && i == 3 ? -128 : kind == 2 && i % 3 ? 0 : kind == 3 && i ? 0 : a);
            v[i] = d * (float)q[i];
        }
        uint16_t D;
        int ok = tllm_f16_i8_factor(v, 1, n, &D, q2);
        for (int i = 0; ok && i < n; i++) got[i] = tllm_f16_to_f32(D) * (float)q2[i], ok = got[i] == v[i];
        fails += !ok;
    }
    CHECK(fails == 0, "tllm_f16_i8_factor missed %d of 20000 factorable groups", fails);
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
    one_fmt(TLLM_WF_MXFP4, 4, 32, TLLM_DT_U8, 21, 96, 0); /* E2M1 codes in the 8-bit pack */
    one_fmt(TLLM_WF_NVFP4, 4, 16, TLLM_DT_U8, 37, 160, 0); /* groups of half an activation block */
    one_fmt(TLLM_WF_NVFP4, 4, 16, TLLM_DT_U8, 16, 32, 0);
    /* 5- and 6-bit codes (GGUF's Q5_*, Q6_K; mlx's 5/6-bit modes): planes, groups of 16 to 128 */
    planes(5, 32, TLLM_DT_F16, 37, 96);
    planes(5, 64, TLLM_DT_BF16, 16, 128);
    planes(5, 128, TLLM_DT_F32, 21, 256);
    planes(5, 16, TLLM_DT_F32, 19, 64); /* no planes: 8-bit codes */
    planes(6, 16, TLLM_DT_F32, 35, 96);
    planes(6, 32, TLLM_DT_F16, 16, 64);
    planes(6, 64, TLLM_DT_BF16, 40, 192);
    /* k-quants' float32 scales as two levels: Q4_K-like (4-bit g32), Q5_K (5-bit g32), Q6_K (6-bit g16),
     * Q2_K / Q3_K-like (2- and 3-bit g16), and one whose scales do not factor */
    kquant(4, 32, 0, 37, 512, 0);
    kquant(5, 32, 0, 16, 256, 0);
    kquant(6, 16, 1, 21, 512, 0);
    kquant(2, 16, 0, 19, 256, 0);
    kquant(3, 16, 1, 16, 256, 0);
    kquant(4, 32, 0, 16, 256, 1);
    /* symmetric codes: Q5_0 (5-bit planes), Q8_0, Q4_0 with float16 scales; bf16 and f32; one spoiled */
    symm(5, 32, TLLM_DT_F16, 37, 128, 0);
    symm(8, 32, TLLM_DT_F16, 21, 96, 0);
    symm(4, 32, TLLM_DT_BF16, 16, 64, 0);
    symm(6, 64, TLLM_DT_F32, 19, 128, 0);
    symm(5, 32, TLLM_DT_F16, 16, 64, 1);
    quantizer();
    factor_cases();
    printf("packed kernels: %d comparisons with the portable kernel, bit for bit; path %s\n", cases, tllm_cpu_path());
    if (argc > 1) CHECK(!strcmp(argv[1], tllm_cpu_path()), "the path that runs is %s, not %s", tllm_cpu_path(), argv[1]);
    return check_done();
}
