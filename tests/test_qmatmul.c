/* QuantizedWeights semantics: MLX quantizer vectors dequantize to their source within half a step,
 * the bit layout is MLX's, and the fast kernels agree with the scalar reference on odd shapes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "base/error.h"
#include "engine/load/safetensors.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/qpack_avx2.h"
#include "kernels/cpu/qpack_avx512.h"
#include "kernels/cpu/quantize.h"

#define TOL_KERNEL_REL 1e-5 /* fast kernel vs scalar reference, relative to sum |w*x| */
#define TOL_INT8_REL 1e-2   /* int8-activation kernel vs reference, relative to sum |w*x| */
#define TOL_INT8X2_REL 1e-4 /* the same with the second int8 level (residual) */

static void test_vectors(const char *path) {
    struct tllm_st_file *f;
    int rc = tllm_st_open(path, &f);
    CHECK(rc == TLLM_OK, "%s", tllm_errmsg());
    if (rc) return;
    int cases = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name;
        size_t len = strlen(name);
        if (len < 7 || strcmp(name + len - 7, ".source") != 0) continue;
        char base[128], n2[160];
        snprintf(base, sizeof base, "%.*s", (int)(len - 7), name);
        int bits, gs;
        CHECK(sscanf(strchr(base, '_') + 1, "b%d_g%d", &bits, &gs) == 2, "case name %s", base);
        const struct tllm_tensor *src = &f->tensors[i], *tw, *ts, *tb;
        snprintf(n2, sizeof n2, "%s.weight", base);
        tw = tllm_st_find(f, n2);
        snprintf(n2, sizeof n2, "%s.scales", base);
        ts = tllm_st_find(f, n2);
        snprintf(n2, sizeof n2, "%s.biases", base);
        tb = tllm_st_find(f, n2);
        CHECK(tw && ts && tb, "case %s incomplete", base);
        if (!tw || !ts || !tb) continue;
        struct tllm_qweights w = {
            .name = base, .rows = (int)src->shape[0], .cols = (int)src->shape[1],
            .format = TLLM_WF_AFFINE, .dtype = ts->dtype, .bits = bits, .group_size = gs,
            .w = tw->data, .scales = ts->data, .biases = tb->data};
        CHECK(tw->shape[1] * 32 == src->shape[1] * bits, "%s: packed width", base);
        float *row = malloc((size_t)w.cols * sizeof(float)), *row2 = malloc((size_t)w.cols * sizeof(float));
        int bad = 0, layout_bad = 0;
        double worst_steps = 0;
        for (int r = 0; r < w.rows; r++) {
            tllm_qw_dequant_row_ref(&w, r, row);
            tllm_qw_dequant_row(&w, r, row2);
            for (int j = 0; j < w.cols; j++) {
                size_t g = (size_t)r * (w.cols / gs) + j / gs;
                float s = tllm_load_f32(w.scales, w.dtype, g), b = tllm_load_f32(w.biases, w.dtype, g);
                float x = tllm_load_f32(src->data, src->dtype, (size_t)r * w.cols + j);
                /* half a step, plus the rounding of scale/bias to their stored dtype */
                /* Half a step, widened by what storing scale and bias in their dtype (after the
                 * codes were chosen) can add: q*|ds| + |db|, with u the dtype's relative rounding. */
                double u = w.dtype == TLLM_DT_BF16 ? 0x1p-8 : w.dtype == TLLM_DT_F16 ? 0x1p-11 : 0x1p-22;
                uint32_t qc = tllm_qw_code(&w, r, j);
                double tol = 0.5 * fabs(s) * (1 + u) + qc * fabs(s) * u + fabs(b) * u + 1e-7 * fabs(x);
                /* codes that MLX clamped (the far end after its edge adjustment) may be off by one more step */
                double qu = rint(((double)x - b) / s);
                if (qu < 0 || qu > (1 << bits) - 1) tol += fabs(s);
                double steps = fabs((double)row[j] - x) / fabs((double)s);
                worst_steps = steps > worst_steps ? steps : worst_steps;
                if (fabs((double)row[j] - x) > tol) bad++;
                if (row2[j] != row[j]) bad++;
                /* the layout: the code MLX's quantizer would pick for x sits where MLX puts it */
                float qf = rintf((x - b) / s);
                qf = qf < 0 ? 0 : qf > (float)((1 << bits) - 1) ? (float)((1 << bits) - 1) : qf;
                uint32_t word = ((const uint32_t *)w.w)[(size_t)r * (w.cols * bits / 32) + j * bits / 32];
                uint32_t code = (word >> ((j % (32 / bits)) * bits)) & ((1u << bits) - 1);
                if (fabsf((float)code - qf) > 1.0f) layout_bad++;
            }
        }
        printf("%s: worst error %.3f steps\n", base, worst_steps);
        /* the quantizer reproduces MLX's output byte for byte */
        {
            size_t words = (size_t)w.rows * (w.cols * bits / 32), ng = (size_t)w.rows * (w.cols / gs);
            size_t esz = tllm_dtype_size(ts->dtype);
            uint32_t *q2 = calloc(words, 4);
            char *s2 = calloc(ng, esz), *b2 = calloc(ng, esz);
            float *src_row = malloc((size_t)w.cols * sizeof(float));
            for (int r = 0; r < w.rows; r++) {
                tllm_convert_to_f32((const char *)src->data + (size_t)r * w.cols * tllm_dtype_size(src->dtype),
                                    src->dtype, src_row, (size_t)w.cols);
                tllm_quantize_row_affine(src_row, w.cols, bits, gs, ts->dtype, q2 + (size_t)r * (w.cols * bits / 32),
                                         s2 + (size_t)r * (w.cols / gs) * esz, b2 + (size_t)r * (w.cols / gs) * esz);
            }
            CHECK(memcmp(q2, tw->data, words * 4) == 0, "%s: quantized codes differ from MLX", base);
            CHECK(memcmp(s2, ts->data, ng * esz) == 0, "%s: scales differ from MLX", base);
            CHECK(memcmp(b2, tb->data, ng * esz) == 0, "%s: biases differ from MLX", base);
            free(q2);
            free(s2);
            free(b2);
            free(src_row);
        }
        CHECK(bad == 0, "%s: %d elements off by more than half a step", base, bad);
        CHECK(layout_bad == 0, "%s: %d codes not where MLX's layout puts them", base, layout_bad);
        free(row);
        free(row2);
        cases++;
    }
    CHECK(cases == 6, "expected 6 quantizer cases, found %d", cases);
    tllm_st_close(f);
}

/* Explicit layout check: pack codes 0,1,2,... by the documented rule and read them back. */
static void test_layout(void) {
    for (int bits = 2; bits <= 8; bits *= 2) {
        int cols = 128, per_word = 32 / bits;
        uint32_t words[128] = {0};
        for (int j = 0; j < cols; j++)
            words[j / per_word] |= (uint32_t)(j % (1 << bits)) << ((j % per_word) * bits);
        uint16_t one = tllm_f32_to_bf16(1.0f), zero = 0;
        uint16_t scales[4] = {one, one, one, one}, biases[4] = {zero, zero, zero, zero};
        struct tllm_qweights w = {.rows = 1, .cols = cols, .format = TLLM_WF_AFFINE,
                                  .dtype = TLLM_DT_BF16, .bits = bits, .group_size = 32,
                                  .w = words, .scales = scales, .biases = biases};
        float out[128];
        tllm_qw_dequant_row_ref(&w, 0, out);
        int bad = 0;
        for (int j = 0; j < cols; j++) bad += out[j] != (float)(j % (1 << bits));
        CHECK(bad == 0, "bits %d: %d codes read back wrong", bits, bad);
    }
}

static uint32_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}
static float rndf(void) { return (float)(rnd() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }

/* Worst |y0 - y1| / sum_j |w_rj x_tj| over every output. */
static double worst_rel_err(const struct tllm_qweights *w, const float *x, int n, const float *y0, const float *y1) {
    double worst = 0;
    float *row = malloc((size_t)w->cols * 4);
    for (int r = 0; r < w->rows; r++) {
        tllm_qw_dequant_row_ref(w, r, row);
        for (int t = 0; t < n; t++) {
            double mag = 0;
            for (int j = 0; j < w->cols; j++) mag += fabs((double)row[j] * x[(size_t)t * w->cols + j]);
            double e = fabs((double)y0[(size_t)t * w->rows + r] - y1[(size_t)t * w->rows + r]) / (mag + 1e-30);
            worst = e > worst ? e : worst;
        }
    }
    free(row);
    return worst;
}

static int int8_cases; /* packed runs whose error shows they really took the integer path */

/* Batch invariance: a token's row is the same bits whether it is multiplied alone or among n tokens,
 * whatever tile it lands in, with its levels given by its role (the first n2 tokens have two). */
static void check_packed_invariance(const struct tllm_qpack *p, const float *x, int n) {
    int cols = p->cols, nb = cols / TLLM_XQ_BLOCK, n2 = n / 3;
    struct tllm_xq all = {n, cols, malloc((size_t)n * cols), malloc((size_t)n * cols), malloc((size_t)n * nb * 4),
                          malloc((size_t)n * nb * 4), n2, malloc((size_t)n * 2 * nb * 4)};
    float *y = malloc((size_t)n * p->rows * 4), *y1 = malloc((size_t)p->rows * 4);
    tllm_xq_quantize(&all, x, 0, n);
    tllm_qpack_matmul(p, &all, y, 0, p->n_blocks);
    for (int t = 0; t < n; t++) {
        struct tllm_xq one = {1, cols, all.q + (size_t)t * cols, all.q2 + (size_t)t * cols, all.d + (size_t)t * nb,
                              all.sum + (size_t)t * nb, t < n2, all.sum16 + (size_t)t * 2 * nb};
        tllm_qpack_matmul(p, &one, y1, 0, p->n_blocks);
        CHECK(memcmp(y1, y + (size_t)t * p->rows, (size_t)p->rows * 4) == 0,
              "packed bits %d rows %d cols %d: token %d of %d (%s) differs from the same token alone", p->bits,
              p->rows, cols, t, n, t < n2 ? "two levels" : "one level");
    }
    free(all.q), free(all.q2), free(all.d), free(all.sum), free(all.sum16), free(y), free(y1);
}

/* The int8-activation kernels: the portable one within TOL_INT8_REL of the float reference, and the
 * SIMD one identical to it (same float operations in the same order; the integer dots are exact). */
static void check_packed(const struct tllm_qweights *w, const float *x, int n, const float *y_ref) {
    struct tllm_qpack p;
    if (tllm_qpack_init(&p, w) != TLLM_OK) {
        CHECK(0, "pack: %s", tllm_errmsg());
        return;
    }
    int nb = w->cols / TLLM_XQ_BLOCK;
    for (int levels = 1; levels <= 2; levels++) {
    struct tllm_xq xq = {n, w->cols, malloc((size_t)n * w->cols), levels == 2 ? malloc((size_t)n * w->cols) : NULL,
                         malloc((size_t)n * nb * 4), malloc((size_t)n * nb * 4), levels == 2 ? n : 0, malloc((size_t)n * 2 * nb * 4)};
    tllm_xq_quantize(&xq, x, 0, n);
    float *y1 = malloc((size_t)n * w->rows * 4), *y2 = malloc((size_t)n * w->rows * 4);
    /* two calls over split block ranges, as two threads would */
    int split = p.n_blocks / 2;
    tllm_qpack_matmul_ref(&p, &xq, y1, 0, split);
    tllm_qpack_matmul_ref(&p, &xq, y1, split, p.n_blocks);
    double worst = worst_rel_err(w, x, n, y_ref, y1), tol = levels == 2 ? TOL_INT8X2_REL : TOL_INT8_REL;
    CHECK(worst <= tol, "packed bits %d gs %d %s rows %d cols %d n %d levels %d: rel err %.3g", w->bits, w->group_size,
          tllm_dtype_name(w->dtype), w->rows, w->cols, n, levels, worst);
    if (levels == 1 && worst > 1e-5) int8_cases++;
    if (tllm_cpu_has_avx512vnni()) {
        tllm_qpack_matmul_avx512(&p, &xq, y2, 0, split);
        tllm_qpack_matmul_avx512(&p, &xq, y2, split, p.n_blocks);
        CHECK(memcmp(y1, y2, (size_t)n * w->rows * 4) == 0, "packed bits %d gs %d %s rows %d cols %d n %d levels %d: AVX-512 != portable",
              w->bits, w->group_size, tllm_dtype_name(w->dtype), w->rows, w->cols, n, levels);
    }
    for (int vnni = 0; vnni < 2; vnni++) {
        if (!(vnni ? tllm_cpu_has_avxvnni() : tllm_cpu_has_avx2())) continue;
        void (*fn)(const struct tllm_qpack *, const struct tllm_xq *, float *, int, int) =
            vnni ? tllm_qpack_matmul_avxvnni : tllm_qpack_matmul_avx2;
        memset(y2, 0, (size_t)n * w->rows * 4);
        fn(&p, &xq, y2, 0, split);
        fn(&p, &xq, y2, split, p.n_blocks);
        CHECK(memcmp(y1, y2, (size_t)n * w->rows * 4) == 0, "packed bits %d gs %d %s rows %d cols %d n %d levels %d: %s != portable",
              w->bits, w->group_size, tllm_dtype_name(w->dtype), w->rows, w->cols, n, levels, vnni ? "AVX-VNNI" : "AVX2");
    }
    free(xq.q), free(xq.q2), free(xq.d), free(xq.sum), free(xq.sum16), free(y1), free(y2);
    }
    check_packed_invariance(&p, x, n);
    tllm_qpack_free(&p);
}

/* Random matrices of every format; fast kernel == reference within TOL_KERNEL_REL. */

/* The microscaling formats (random codes, scales of any exponent but NaN), and a GPTQ act-order
 * permutation on an affine matrix: the fast float kernel against the reference; mxfp4, nvfp4 packed too. */
static void test_microscaling_kernels(void) {
    static const enum tllm_wformat fmts[] = {TLLM_WF_MXFP4, TLLM_WF_NVFP4, TLLM_WF_MXFP8, TLLM_WF_AFFINE};
    static const int rows_list[] = {1, 7, 33}, ntok[] = {1, 5, 11};
    for (int fi = 0; fi < 4; fi++)
        for (int ri = 0; ri < 3; ri++)
            for (int ni = 0; ni < 3; ni++) {
                const enum tllm_wformat f = fmts[fi];
                const int bits = f == TLLM_WF_MXFP8 ? 8 : 4, gs = f == TLLM_WF_NVFP4 ? 16 : 32;
                const int rows = rows_list[ri], cols = 96 * (ri + 1), n = ntok[ni];
                size_t nw = (size_t)rows * cols * bits / 32, ng = (size_t)rows * cols / gs;
                uint32_t *q = malloc(nw * 4);
                uint8_t *sc = malloc(ng);
                float *sb = malloc(2 * ng * 4);
                int32_t *perm = malloc((size_t)cols * 4);
                for (size_t i = 0; i < nw; i++) q[i] = rnd();
                if (f == TLLM_WF_MXFP8) /* no NaN codes */
                    for (size_t i = 0; i < nw * 4; i++)
                        if ((((uint8_t *)q)[i] & 0x7f) == 0x7f) ((uint8_t *)q)[i] ^= 1;
                for (size_t i = 0; i < ng; i++)
                    sc[i] = f == TLLM_WF_NVFP4 ? (uint8_t)(rnd() % 0x7f) : (uint8_t)(115 + rnd() % 20);
                for (size_t i = 0; i < 2 * ng; i++) sb[i] = rndf() * 0.1f;
                for (int j = 0; j < cols; j++) perm[j] = j;
                for (int j = cols - 1; j > 0; j--) { /* a shuffle */
                    int k = (int)(rnd() % (uint32_t)(j + 1)), t = perm[j];
                    perm[j] = perm[k], perm[k] = t;
                }
                struct tllm_qweights w = {.name = tllm_wformat_name(f), .rows = rows, .cols = cols, .format = f,
                                          .dtype = f == TLLM_WF_AFFINE ? TLLM_DT_F32 : TLLM_DT_U8, .bits = bits,
                                          .group_size = gs, .w = q, .scales = f == TLLM_WF_AFFINE ? (void *)sb : (void *)sc,
                                          .biases = f == TLLM_WF_AFFINE ? sb + ng : NULL,
                                          .perm = f == TLLM_WF_AFFINE ? perm : NULL};
                float *x = malloc((size_t)n * cols * 4), *y0 = malloc((size_t)n * rows * 4), *y1 = malloc((size_t)n * rows * 4);
                for (int i = 0; i < n * cols; i++) x[i] = rndf();
                tllm_qmatmul_ref(&w, x, n, y0, 0, rows);
                tllm_qmatmul(&w, x, n, y1, 0, rows);
                /* the permuted reference against the unpermuted one on permuted x */
                float *xp = malloc((size_t)n * cols * 4);
                for (int t = 0; t < n; t++)
                    for (int j = 0; j < cols; j++) xp[(size_t)t * cols + j] = x[(size_t)t * cols + perm[j]];
                double worst = worst_rel_err(&w, w.perm ? xp : x, n, y0, y1);
                CHECK(worst <= TOL_KERNEL_REL, "%s%s rows %d cols %d n %d: rel err %.3g", w.name, w.perm ? " (permuted)" : "", rows,
                      cols, n, worst);
                tllm_qmatmul_tiled(&w, x, n, y1, 0, rows);
                worst = worst_rel_err(&w, w.perm ? xp : x, n, y0, y1);
                CHECK(worst <= TOL_KERNEL_REL, "%s tiled rows %d cols %d n %d: rel err %.3g", w.name, rows, cols, n, worst);
                if (f == TLLM_WF_MXFP4 || f == TLLM_WF_NVFP4) check_packed(&w, x, n, y0);
                if (w.perm) { /* packed, the permuted x given by the caller */
                    w.perm = NULL;
                    check_packed(&w, xp, n, y0);
                }
                free(q), free(sc), free(sb), free(perm), free(x), free(xp), free(y0), free(y1);
            }
}

static void test_kernels_vs_ref(void) {
    static const int bits_list[] = {2, 4, 8, 1, 3, 5, 6}, gs_list[] = {32, 64, 128};
    static const enum tllm_dtype dts[] = {TLLM_DT_BF16, TLLM_DT_F16, TLLM_DT_F32};
    static const int rows_list[] = {1, 7, 33}, cols_mult[] = {1, 3}, ntok[] = {1, 5, 11};
    for (int bi = 0; bi < 7; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int di = 0; di < 3; di++)
                for (int ri = 0; ri < 3; ri++)
                    for (int ci = 0; ci < 2; ci++)
                        for (int ni = 0; ni < 3; ni++) {
                            int bits = bits_list[bi], gs = gs_list[gi], rows = rows_list[ri];
                            int cols = gs * cols_mult[ci] * (ci ? 3 : 1), n = ntok[ni];
                            size_t nw = (size_t)rows * cols * bits / 32, ng = (size_t)rows * cols / gs;
                            uint32_t *q = malloc(nw * 4);
                            float *sb = malloc(ng * 2 * 4);
                            uint16_t *sb16 = malloc(ng * 2 * 2);
                            for (size_t i = 0; i < nw; i++) q[i] = rnd();
                            for (size_t i = 0; i < 2 * ng; i++) {
                                sb[i] = rndf() * 0.1f;
                                sb16[i] = dts[di] == TLLM_DT_BF16 ? tllm_f32_to_bf16(sb[i]) : tllm_f32_to_f16(sb[i]);
                            }
                            const void *s = dts[di] == TLLM_DT_F32 ? (void *)sb : (void *)sb16;
                            const void *b = dts[di] == TLLM_DT_F32 ? (void *)(sb + ng) : (void *)(sb16 + ng);
                            struct tllm_qweights w = {.rows = rows, .cols = cols, .format = TLLM_WF_AFFINE,
                                                      .dtype = dts[di], .bits = bits, .group_size = gs,
                                                      .w = q, .scales = s, .biases = b};
                            float *x = malloc((size_t)n * cols * 4), *y0 = malloc((size_t)n * rows * 4),
                                  *y1 = malloc((size_t)n * rows * 4);
                            for (int i = 0; i < n * cols; i++) x[i] = rndf();
                            tllm_qmatmul_ref(&w, x, n, y0, 0, rows);
                            tllm_qmatmul(&w, x, n, y1, 0, rows);
                            double worst = worst_rel_err(&w, x, n, y0, y1);
                            CHECK(worst <= TOL_KERNEL_REL, "bits %d gs %d %s rows %d cols %d n %d: rel err %.3g", bits,
                                  gs, tllm_dtype_name(dts[di]), rows, cols, n, worst);
                            if (tllm_qpack_supported(&w)) check_packed(&w, x, n, y0);
                            free(q); free(sb); free(sb16); free(x); free(y0); free(y1);
                        }
    test_microscaling_kernels();
    CHECK(int8_cases > 0, "no int8 case differed from the float path: the int8 kernel did not run");
    printf("packed int8 kernels: %d cases, compared bit for bit with the portable one: %s%s(kernel path: %s)\n", int8_cases,
           tllm_cpu_has_avx512vnni() ? "AVX-512 VNNI, " : "", tllm_cpu_has_avx2() ? "AVX2 " : "none ", tllm_cpu_path());
    /* dense matrices too */
    for (int di = 0; di < 3; di++) {
        int rows = 9, cols = 300, n = 3;
        float *wf = malloc((size_t)rows * cols * 4);
        uint16_t *w16 = malloc((size_t)rows * cols * 2);
        for (int i = 0; i < rows * cols; i++) {
            wf[i] = rndf();
            w16[i] = dts[di] == TLLM_DT_BF16 ? tllm_f32_to_bf16(wf[i]) : tllm_f32_to_f16(wf[i]);
        }
        struct tllm_qweights w = {.rows = rows, .cols = cols, .format = TLLM_WF_DENSE, .dtype = dts[di],
                                  .w = dts[di] == TLLM_DT_F32 ? (void *)wf : (void *)w16};
        float x[900], y0[27], y1[27];
        for (int i = 0; i < n * cols; i++) x[i] = rndf();
        tllm_qmatmul_ref(&w, x, n, y0, 0, rows);
        tllm_qmatmul(&w, x, n, y1, 0, rows);
        double worst = 0;
        for (int i = 0; i < n * rows; i++) worst = fmax(worst, fabs(y0[i] - y1[i]) / (fabs(y0[i]) + 1));
        CHECK(worst <= TOL_KERNEL_REL * 10, "dense %s: err %.3g", tllm_dtype_name(dts[di]), worst);
        free(wf);
        free(w16);
    }
}

/* f16 conversion round-trips every finite half exactly; bf16 rounds to nearest even. */
static void test_dtype(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
        if (tllm_f32_to_f16(tllm_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK(bad == 0, "%d halves do not round-trip", bad);
    CHECK(tllm_f16_to_f32(0x3c00) == 1.0f && tllm_f16_to_f32(0x0001) == ldexpf(1, -24), "f16 values");
    CHECK(tllm_f32_to_bf16(1.0f + ldexpf(1, -8)) == 0x3f80, "bf16 ties to even (down)");
    CHECK(tllm_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)) == 0x3f82, "bf16 ties to even (up)");
    CHECK(tllm_f32_to_f16(70000.0f) == 0x7c00, "f16 overflow to inf");
}

/* mlx.core.quantize's other modes and widths (tests/data/mlx-quantize-modes.safetensors): tllm reads
 * mlx.core.dequantize's values exactly, and quantizes every case to mlx's bytes. */
static void test_modes(const char *path) {
    struct tllm_st_file *f;
    if (tllm_st_open(path, &f) != TLLM_OK) {
        CHECK(0, "cannot open %s: %s", path, tllm_errmsg());
        return;
    }
    int cases = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name;
        size_t len = strlen(name);
        if (len < 7 || strcmp(name + len - 7, ".source") != 0) continue;
        char base[128], mode[16], n2[160];
        snprintf(base, sizeof base, "%.*s", (int)(len - 7), name);
        int bits, gs;
        CHECK(sscanf(base, "%15[a-z0-9]_b%d_g%d", mode, &bits, &gs) == 3, "case name %s", base);
        const struct tllm_tensor *src = &f->tensors[i], *tw, *ts, *tb, *td;
        snprintf(n2, sizeof n2, "%s.weight", base), tw = tllm_st_find(f, n2);
        snprintf(n2, sizeof n2, "%s.scales", base), ts = tllm_st_find(f, n2);
        snprintf(n2, sizeof n2, "%s.biases", base), tb = tllm_st_find(f, n2);
        snprintf(n2, sizeof n2, "%s.dequant", base), td = tllm_st_find(f, n2);
        enum tllm_wformat fmt = !strcmp(mode, "mxfp4") ? TLLM_WF_MXFP4 : !strcmp(mode, "nvfp4") ? TLLM_WF_NVFP4
                              : !strcmp(mode, "mxfp8") ? TLLM_WF_MXFP8 : TLLM_WF_AFFINE;
        CHECK(tw && ts && td && (tb || fmt != TLLM_WF_AFFINE), "case %s incomplete", base);
        if (!tw || !ts || !td || (!tb && fmt == TLLM_WF_AFFINE)) continue;
        struct tllm_qweights w = {.name = base, .rows = (int)src->shape[0], .cols = (int)src->shape[1], .format = fmt,
                                  .dtype = ts->dtype, .bits = bits, .group_size = gs, .w = tw->data, .scales = ts->data,
                                  .biases = tb ? tb->data : NULL};
        CHECK(tw->shape[1] * 32 == src->shape[1] * bits, "%s: packed width", base);
        float *row = malloc((size_t)w.cols * 4), *row2 = malloc((size_t)w.cols * 4);
        int bad = 0;
        for (int r = 0; r < w.rows; r++) {
            tllm_qw_dequant_row_ref(&w, r, row);
            tllm_qw_dequant_row(&w, r, row2);
            for (int j = 0; j < w.cols; j++) {
                float want = ((const float *)td->data)[(size_t)r * w.cols + j];
                bad += row[j] != want || row2[j] != want;
            }
        }
        CHECK(bad == 0, "%s: %d values differ from mlx.core.dequantize", base, bad);
        if (fmt == TLLM_WF_AFFINE) {
            size_t words = (size_t)w.rows * w.cols * bits / 32, ng = (size_t)w.rows * (w.cols / gs), esz = tllm_dtype_size(ts->dtype);
            uint32_t *q2 = calloc(words, 4);
            char *s2 = calloc(ng, esz), *b2 = calloc(ng, esz);
            for (int r = 0; r < w.rows; r++) {
                tllm_convert_to_f32((const char *)src->data + (size_t)r * w.cols * tllm_dtype_size(src->dtype), src->dtype, row,
                                    (size_t)w.cols);
                tllm_quantize_row_affine(row, w.cols, bits, gs, ts->dtype, q2 + (size_t)r * w.cols * bits / 32,
                                         s2 + (size_t)r * (w.cols / gs) * esz, b2 + (size_t)r * (w.cols / gs) * esz);
            }
            CHECK(!memcmp(q2, tw->data, words * 4) && !memcmp(s2, ts->data, ng * esz) && !memcmp(b2, tb->data, ng * esz),
                  "%s: tllm's quantizer differs from mlx's bytes", base);
            free(q2), free(s2), free(b2);
        } else {
            size_t words = (size_t)w.rows * w.cols * bits / 32, ng = (size_t)w.rows * (w.cols / gs);
            uint32_t *q2 = calloc(words, 4);
            uint8_t *s2 = calloc(ng, 1);
            for (int r = 0; r < w.rows; r++) {
                tllm_convert_to_f32((const char *)src->data + (size_t)r * w.cols * tllm_dtype_size(src->dtype), src->dtype, row,
                                    (size_t)w.cols);
                tllm_quantize_row_fp(row, w.cols, fmt, src->dtype, q2 + (size_t)r * w.cols * bits / 32, s2 + (size_t)r * (w.cols / gs));
            }
            int bad_codes = 0, bad_scales = 0;
            for (size_t k = 0; k < words; k++) bad_codes += q2[k] != ((const uint32_t *)tw->data)[k];
            for (size_t k = 0; k < ng; k++) bad_scales += s2[k] != ((const uint8_t *)ts->data)[k];
            CHECK(!bad_codes && !bad_scales, "%s: tllm's quantizer differs from mlx's bytes in %d code words, %d scales", base,
                  bad_codes, bad_scales);
            free(q2), free(s2);
        }
        free(row), free(row2);
        cases++;
    }
    printf("mlx modes: %d cases read as mlx.core.dequantize does\n", cases);
    CHECK(cases == 21, "expected 21 mode cases, found %d", cases);
    tllm_st_close(f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_qmatmul mlx-quantize-vectors.safetensors\n");
        return 2;
    }
    test_vectors(argv[1]);
    if (argc > 2) test_modes(argv[2]);
    test_layout();
    test_kernels_vs_ref();
    test_dtype();
    return check_done();
}
