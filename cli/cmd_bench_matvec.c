/* tllm bench-matvec: the decode matvec alone at given shapes, in GB/s of weight bytes read.
 * Each shape gets enough copies of random weights to overflow the caches (a model reads each weight
 * once per token, so cache-resident numbers would flatter), and copies are visited in turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "base/error.h"
#include "engine/run/generate.h"
#include "base/threadpool.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qpack.h"
#include "engine/load/config.h"

static const char usage[] =
    "usage: tllm bench-matvec [-t LIST] [--bits 4] [--group-size 64] [--shapes 896x896,...] [--mb 256]\n"
    "  --shapes LIST   in->out pairs as INxOUT (default: Qwen2.5-0.5B's 896x896,896x128,896x4864,4864x896,896x151936)\n"
    "  --mb N          weight bytes per shape, in MiB, cycled through (default 256: larger than any cache)\n"
    "Reports GB/s of weight bytes (codes + scales + biases) for the int8-activation and the exact float kernels.\n";

struct shape_set {
    int rows, cols, copies;
    struct tllm_qweights *w;   /* [copies] */
    struct tllm_qpack *p;      /* [copies] */
    float *x, *y;
    struct tllm_xq xq;
    int cur, packed;
};

static void mv_task(void *arg, int ith, int nth) {
    struct shape_set *s = arg;
    int blocks = (s->rows + TLLM_QPACK_ROWS - 1) / TLLM_QPACK_ROWS;
    int per = (blocks + nth - 1) / nth, b0 = ith * per, b1 = b0 + per < blocks ? b0 + per : blocks;
    if (b0 >= b1) return;
    int r1 = b1 * TLLM_QPACK_ROWS < s->rows ? b1 * TLLM_QPACK_ROWS : s->rows;
    if (s->packed) tllm_qpack_matmul(&s->p[s->cur], &s->xq, s->y, b0, b1);
    else tllm_qmatmul(&s->w[s->cur], s->x, 1, s->y, b0 * TLLM_QPACK_ROWS, r1);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static void shape_init(struct shape_set *s, int cols, int rows, int bits, int gs, size_t bytes) {
    memset(s, 0, sizeof *s);
    s->rows = rows, s->cols = cols;
    size_t words = (size_t)rows * cols * bits / 32, ng = (size_t)rows * cols / gs;
    size_t one = words * 4 + ng * 4;
    s->copies = (int)(bytes / one) + 1;
    s->w = calloc((size_t)s->copies, sizeof *s->w);
    s->p = calloc((size_t)s->copies, sizeof *s->p);
    s->x = malloc((size_t)cols * 4);
    s->y = malloc((size_t)rows * 4);
    int nb = cols / TLLM_XQ_BLOCK;
    s->xq = (struct tllm_xq){1, cols, malloc((size_t)cols), malloc((size_t)cols), malloc((size_t)nb * 4), malloc((size_t)nb * 4), 1, NULL}; /* affine packs: no half-block sums */
    if (!s->w || !s->p || !s->x || !s->y || !s->xq.q || !s->xq.q2 || !s->xq.d || !s->xq.sum) cli_die("out of memory");
    for (int i = 0; i < cols; i++) s->x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    tllm_xq_quantize(&s->xq, s->x, 0, 1);
    for (int c = 0; c < s->copies; c++) {
        uint32_t *q = malloc(words * 4);
        uint16_t *sc = malloc(ng * 2), *bi = malloc(ng * 2);
        if (!q || !sc || !bi) cli_die("out of memory: lower --mb");
        for (size_t i = 0; i < words; i++) q[i] = rnd();
        for (size_t i = 0; i < ng; i++) sc[i] = tllm_f32_to_bf16(0.01f), bi[i] = tllm_f32_to_bf16(-0.08f);
        s->w[c] = (struct tllm_qweights){.name = "bench", .rows = rows, .cols = cols, .format = TLLM_WF_AFFINE,
                                         .dtype = TLLM_DT_BF16, .bits = bits, .group_size = gs, .w = q,
                                         .scales = sc, .biases = bi};
        if (tllm_qpack_init(&s->p[c], &s->w[c])) cli_die_lib();
    }
}

static void shape_free(struct shape_set *s) {
    for (int c = 0; c < s->copies; c++) {
        free((void *)s->w[c].w), free((void *)s->w[c].scales), free((void *)s->w[c].biases);
        tllm_qpack_free(&s->p[c]);
    }
    free(s->w), free(s->p), free(s->x), free(s->y), free(s->xq.q), free(s->xq.q2), free(s->xq.d), free(s->xq.sum);
}

/* GB/s over enough passes to read at least 2 GB. */
static double measure(struct shape_set *s, int packed) {
    s->packed = packed;
    size_t per = tllm_qw_nbytes(&s->w[0]);
    int passes = (int)(2e9 / (double)per) + s->copies;
    for (s->cur = 0; s->cur < s->copies; s->cur++) tllm_parallel(mv_task, s); /* warm-up: page in */
    double t0 = tllm_now();
    for (int i = 0; i < passes; i++) {
        s->cur = i % s->copies;
        tllm_parallel(mv_task, s);
    }
    return (double)per * passes / (tllm_now() - t0) / 1e9;
}

int cmd_bench_matvec(int argc, char **argv) {
    const char *tlist = NULL, *shapes = "896x896,896x128,896x4864,4864x896,896x151936";
    int bits = 4, gs = 64, mb = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "-t")) tlist = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--bits")) bits = cli_int(a, cli_value(argc, argv, &i), 2, 8);
        else if (!strcmp(a, "--group-size")) gs = cli_int(a, cli_value(argc, argv, &i), 32, 128);
        else if (!strcmp(a, "--shapes")) shapes = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--mb")) mb = cli_int(a, cli_value(argc, argv, &i), 1, 65536);
        else cli_die("bench-matvec: unknown option '%s' (see tllm bench-matvec --help)", a);
    }
    int threads[16], nt = 0;
    if (tlist) {
        int32_t *v = cli_parse_ids("-t", tlist, &nt);
        if (nt > 16) cli_die("-t: at most 16 values");
        for (int i = 0; i < nt; i++) {
            if (v[i] < 1) cli_die("-t: %d is below 1", v[i]);
            threads[i] = v[i];
        }
        free(v);
    } else {
        threads[nt++] = tllm_physical_cores();
    }
    struct tllm_qweights probe = {.format = TLLM_WF_AFFINE, .bits = bits, .group_size = gs, .cols = gs};
    if (!tllm_quant_supported(bits, gs) || !tllm_qpack_supported(&probe))
        cli_die("--bits %d --group-size %d: not a supported format (bits 1-6 or 8; groups 32, 64, 128)", bits, gs);
    printf("| shape (in x out) | threads | int8 GB/s | float GB/s |\n| --- | ---: | ---: | ---: |\n");
    for (const char *p = shapes; *p;) {
        int in, out, len;
        if (sscanf(p, "%dx%d%n", &in, &out, &len) != 2 || in <= 0 || out <= 0 || in % gs)
            cli_die("--shapes: '%s' is not INxOUT with IN a multiple of the group size", p);
        p += len;
        if (*p == ',') p++;
        else if (*p) cli_die("--shapes: expected ',' at '%s'", p);
        struct shape_set s;
        shape_init(&s, in, out, bits, gs, (size_t)mb << 20);
        for (int i = 0; i < nt; i++) {
            if (tllm_threadpool_start(threads[i])) cli_die_lib();
            double g8 = measure(&s, 1);
            double gf = bits == 2 ? 0 : measure(&s, 0);
            printf("| %dx%d | %d | %.1f | %.1f |\n", in, out, threads[i], g8, gf);
            fflush(stdout);
        }
        shape_free(&s);
    }
    tllm_threadpool_stop();
    return 0;
}
