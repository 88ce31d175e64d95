/* tllm bench-gemm: prefill's GEMM alone on an OpenCL device (kernels/opencl/gemm.cl), in TFLOPS: M
 * tokens x K inputs x N outputs of random affine weights, the counterpart of llama.cpp's
 * `test-backend-ops perf -o MUL_MAT`. The device is set up for a model (-m), whose kernels it uses. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/backend/registry.h"
#include "engine/load/model.h"
#include "base/dtype.h"
#include "base/error.h"

static const char usage[] =
    "usage: tllm bench-gemm -m MODEL [--device opencl[:N]] [-M 512] [-K 4096] [-N 4096] [--bits 4] [--group-size 64]\n"
    "                       [--levels 2 | --float] [-r 20]\n"
    "  Times Y[M x N] = X[M x K] W^T on the device with int8 inputs in --levels 1 or 2 (2: as prompts are by\n"
    "  default, 1: as with --fast-decode; --float: float32 inputs), W random codes\n"
    "  with bf16 scales and biases in MODEL's format where all its matrices share one (the kernels then\n"
    "  have it compiled in); reports ms per GEMM and TFLOPS (2 M N K flops).\n";

int cmd_bench_gemm(int argc, char **argv) {
    const char *dir = NULL, *device = "opencl";
    int M = 512, K = 4096, N = 4096, bits = 4, gs = 64, int8 = 2, reps = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--device")) device = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-M")) M = (int)cli_int(a, cli_value(argc, argv, &i), 1, 65536);
        else if (!strcmp(a, "-K")) K = (int)cli_int(a, cli_value(argc, argv, &i), 32, 65536);
        else if (!strcmp(a, "-N")) N = (int)cli_int(a, cli_value(argc, argv, &i), 1, 262144);
        else if (!strcmp(a, "--bits")) bits = (int)cli_int(a, cli_value(argc, argv, &i), 2, 8);
        else if (!strcmp(a, "--group-size")) gs = (int)cli_int(a, cli_value(argc, argv, &i), 32, 1024);
        else if (!strcmp(a, "--float")) int8 = 0;
        else if (!strcmp(a, "--levels")) int8 = (int)cli_int(a, cli_value(argc, argv, &i), 1, 2);
        else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) reps = (int)cli_int(a, cli_value(argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else cli_die("bench-gemm: unknown option '%s' (see tllm bench-gemm --help)", a);
    }
    int index;
    if (tllm_device_index(device, &index) || index < -1) cli_die("bench-gemm: --device '%s' is not opencl or opencl:N", device);
    if (K % gs || K % 32 || (bits != 2 && bits != 4 && bits != 8)) cli_die("bench-gemm: -K must be a multiple of 32 and of --group-size; --bits 2, 4 or 8");
    struct tllm_model *m;
    struct tllm_backend *cl = NULL;
    struct tllm_backend_info info;
    if (tllm_model_load(cli_model_dir(dir), &m)) cli_die_lib();
    if (tllm_backend_device_init(&cl, m, 16, index)) cli_die_lib();
    tllm_backend_describe(cl, &info);
    size_t ng = (size_t)N * (size_t)(K / gs), nw = (size_t)N * (size_t)K / 32 * (size_t)bits;
    uint32_t *codes = malloc(nw * 4);
    uint16_t *sc = malloc(ng * 2), *bi = malloc(ng * 2);
    float *x = malloc((size_t)M * (size_t)K * sizeof(float));
    if (!codes || !sc || !bi || !x) cli_die("out of memory");
    uint64_t r = 42;
    for (size_t i = 0; i < nw; i++) r = r * 6364136223846793005ull + 1442695040888963407ull, codes[i] = (uint32_t)(r >> 32);
    for (size_t g = 0; g < ng; g++) sc[g] = tllm_f32_to_bf16(0.01f), bi[g] = tllm_f32_to_bf16(-0.08f);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)((int)(i % 17) - 8) * 0.125f;
    struct tllm_qweights w = {.name = "bench", .rows = N, .cols = K, .format = TLLM_WF_AFFINE, .dtype = TLLM_DT_BF16,
                              .bits = bits, .group_size = gs, .w = codes, .scales = sc, .biases = bi};
    double secs = 0;
    if (cl->ops->matmul(cl, &w, x, M, int8, NULL, reps, &secs)) cli_die_lib();
    double ms = secs / reps * 1e3, tflops = 2.0 * M * (double)N * K / (secs / reps) / 1e12;
    printf("%s: M=%d K=%d N=%d, %d-bit g%d, %s inputs: %.4f ms per GEMM, %.2f TFLOPS (%d repetitions)\n",
           info.name, M, K, N, bits, gs, int8 == 2 ? "two-level int8" : int8 ? "int8" : "float32", ms, tflops, reps);
    free(codes), free(sc), free(bi), free(x);
    tllm_backend_free(cl);
    tllm_model_free(m);
    return 0;
}
