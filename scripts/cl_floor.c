/* What a decode step's launches and grid barriers cost on an OpenCL device, measured without the
 * model: back-to-back empty kernels (host enqueue time and device throughput, with and without a
 * flush per launch), kernels that each read a matrix-sized buffer once, and grid barriers inside one
 * launch, and what one work-group a compute unit reads with a given number of bytes in flight (in
 * registers, or cp.async copies into local memory on NVIDIA). The numbers bound what any arrangement of
 * the decode kernels can reach.
 *   cl_floor [DEVICE_INDEX]        (built as tllm-cl-floor) */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <CL/cl_ext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *src =
    "__kernel void empty(__global int *a) { if (get_global_id(0) == 0x7fffffff) a[0] = 1; }\n"
    "__kernel void many(__global float *a0, __global float *a1, __global float *a2, __global float *a3,\n"
    "                   __global float *a4, __global float *a5, __global float *a6, __global float *a7,\n"
    "                   __global float *a8, __global float *a9, __global float *a10, __global float *a11, int n) {\n"
    "  if (get_global_id(0) == n) a0[0] = a1[0] + a2[0] + a3[0] + a4[0] + a5[0] + a6[0] + a7[0] + a8[0] + a9[0] + a10[0] + a11[0];\n"
    "}\n"
    "__kernel void ints(__global float *a0, int i0, int i1, int i2, int i3, int i4, int i5, int i6, int i7,\n"
    "                   int i8, int i9, int i10, int i11) {\n"
    "  if (get_global_id(0) == i0) a0[0] = i1 + i2 + i3 + i4 + i5 + i6 + i7 + i8 + i9 + i10 + i11;\n"
    "}\n"
    "__kernel void longs(__global float *a0, ulong o0, ulong o1, ulong o2, ulong o3, ulong o4, ulong o5, ulong o6,\n"
    "                    ulong o7, ulong o8, ulong o9, ulong o10, ulong o11, ulong o12, int i0, int i1, int i2, int i3,\n"
    "                    int i4, int i5, int i6, int i7, int i8, int i9, int i10, int i11) {\n"
    "  if (get_global_id(0) == i0) a0[0] = o0 + o1 + o2 + o3 + o4 + o5 + o6 + o7 + o8 + o9 + o10 + o11 + o12 + i1 + i2 + i3\n"
    "    + i4 + i5 + i6 + i7 + i8 + i9 + i10 + i11;\n"
    "}\n"
    "__kernel void ints25(__global float *a0, int i0, int i1, int i2, int i3, int i4, int i5, int i6, int i7, int i8,\n"
    "                     int i9, int i10, int i11, int i12, int i13, int i14, int i15, int i16, int i17, int i18,\n"
    "                     int i19, int i20, int i21, int i22, int i23, int i24) {\n"
    "  if (get_global_id(0) == i0) a0[0] = i1 + i2 + i3 + i4 + i5 + i6 + i7 + i8 + i9 + i10 + i11 + i12 + i13 + i14 + i15\n"
    "    + i16 + i17 + i18 + i19 + i20 + i21 + i22 + i23 + i24;\n"
    "}\n"
    "__kernel void chain(__global int *a) { if (get_global_id(0) == 0) a[0] += 1; }\n"
    "__kernel void put(__global int *a, int i, int v) { if (get_global_id(0) == 0) a[i] = v; }\n"
    "__kernel void stream(__global const uint4 *w, int n, __global uint *out) {\n"
    "  uint s = 0;\n"
    "  for (int i = get_global_id(0); i < n; i += get_global_size(0)) { uint4 v = w[i]; s += v.x ^ v.y ^ v.z ^ v.w; }\n"
    "  if (s == 0x12345678u) out[0] = s;\n"
    "}\n"
    /* spin on an atomic read-modify-write (what kernels/opencl/token.cl's grid barrier does) */
    "__kernel void gsync_atomic(volatile __global int *bar, int rounds) {\n"
    "  int G = get_num_groups(0);\n"
    "  for (int r = 1; r <= rounds; r++) {\n"
    "    barrier(CLK_GLOBAL_MEM_FENCE);\n"
    "    if (get_local_id(0) == 0) {\n"
    "      mem_fence(CLK_GLOBAL_MEM_FENCE); atomic_inc(bar);\n"
    "      for (int s = 0; atomic_add(bar, 0) < r * G && s < (1 << 24); s++) ;\n"
    "    }\n"
    "    barrier(CLK_GLOBAL_MEM_FENCE);\n"
    "  }\n"
    "}\n"
    /* spin on a plain volatile load */
    "__kernel void gsync_load(volatile __global int *bar, int rounds) {\n"
    "  int G = get_num_groups(0);\n"
    "  for (int r = 1; r <= rounds; r++) {\n"
    "    barrier(CLK_GLOBAL_MEM_FENCE);\n"
    "    if (get_local_id(0) == 0) {\n"
    "      mem_fence(CLK_GLOBAL_MEM_FENCE); atomic_inc(bar);\n"
    "      for (int s = 0; bar[0] < r * G && s < (1 << 24); s++) ;\n"
    "    }\n"
    "    barrier(CLK_GLOBAL_MEM_FENCE);\n"
    "  }\n"
    "}\n";

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cl_int e_ = (x);                                                                           \
        if (e_) {                                                                                  \
            fprintf(stderr, "cl_floor: %s failed (%d)\n", #x, e_);                                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static cl_command_queue q;

/* n launches of k as a range of `dims` dimensions (the others 1); prints host enqueue time and wall time per launch */
static double launches_nd(const char *what, cl_kernel k, size_t groups, size_t lws, int n, int flush, cl_uint dims) {
    size_t g[3] = {groups * lws, 1, 1}, l[3] = {lws, 1, 1};
    CHECK(clEnqueueNDRangeKernel(q, k, dims, NULL, g, l, 0, NULL, NULL));
    CHECK(clFinish(q));
    double t0 = now();
    for (int i = 0; i < n; i++) {
        CHECK(clEnqueueNDRangeKernel(q, k, dims, NULL, g, l, 0, NULL, NULL));
        if (flush && i % flush == flush - 1) CHECK(clFlush(q));
    }
    double t1 = now();
    CHECK(clFinish(q));
    double t2 = now();
    printf("%-34s groups %5zu x %4zu%s: enqueue %6.2f us, wall %6.2f us per launch\n", what, groups, lws,
           flush ? (flush == 1 ? " flush/1" : " flush/8") : "        ", (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6);
    return (t2 - t0) / n;
}

static double launches(const char *what, cl_kernel k, size_t groups, size_t lws, int n, int flush) {
    return launches_nd(what, k, groups, lws, n, flush, 1);
}

/* n launches of kernel `name`: a buffer, then n_ints int arguments */
static void int_args(cl_program pr, const char *name, cl_mem a, cl_uint n_ints, const char *what, size_t groups, int n) {
    cl_int e;
    cl_kernel k = clCreateKernel(pr, name, &e);
    CHECK(e);
    CHECK(clSetKernelArg(k, 0, sizeof a, &a));
    cl_int big = 1 << 30; /* the first: a global id no work-item has */
    CHECK(clSetKernelArg(k, 1, sizeof big, &big));
    for (cl_uint i = 2; i <= n_ints; i++) CHECK(clSetKernelArg(k, i, sizeof i, &i));
    launches(what, k, groups, 256, n, 0);
    clReleaseKernel(k);
}

/* cl_khr_command_buffer: n one-thread increments recorded once, the buffer enqueued `reps` times: the
 * host's and the device's cost per recorded launch, and whether they ran in order (the count) */
static void command_buffer(cl_device_id dev, cl_mem a, cl_kernel k_chain, const char *ext) {
    if (!strstr(ext, "cl_khr_command_buffer")) {
        printf("cl_khr_command_buffer: not offered\n");
        return;
    }
    cl_platform_id pl;
    CHECK(clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof pl, &pl, NULL));
    clCreateCommandBufferKHR_fn create = (clCreateCommandBufferKHR_fn)clGetExtensionFunctionAddressForPlatform(pl, "clCreateCommandBufferKHR");
    clCommandNDRangeKernelKHR_fn record = (clCommandNDRangeKernelKHR_fn)clGetExtensionFunctionAddressForPlatform(pl, "clCommandNDRangeKernelKHR");
    clFinalizeCommandBufferKHR_fn finalize = (clFinalizeCommandBufferKHR_fn)clGetExtensionFunctionAddressForPlatform(pl, "clFinalizeCommandBufferKHR");
    clEnqueueCommandBufferKHR_fn enqueue = (clEnqueueCommandBufferKHR_fn)clGetExtensionFunctionAddressForPlatform(pl, "clEnqueueCommandBufferKHR");
    clReleaseCommandBufferKHR_fn release = (clReleaseCommandBufferKHR_fn)clGetExtensionFunctionAddressForPlatform(pl, "clReleaseCommandBufferKHR");
    if (!create || !record || !finalize || !enqueue || !release) {
        printf("cl_khr_command_buffer: offered, but its functions are missing\n");
        return;
    }
    cl_int e, zero = 0;
    CHECK(clEnqueueFillBuffer(q, a, &zero, sizeof zero, 0, 64, 0, NULL, NULL));
    CHECK(clFinish(q));
    const int n = 250, reps = 40;
    size_t g = 64, l = 64;
    double t0 = now();
    cl_command_buffer_khr cb = create(1, &q, NULL, &e);
    CHECK(e);
    for (int i = 0; i < n; i++) CHECK(record(cb, NULL, NULL, k_chain, 1, NULL, &g, &l, 0, NULL, NULL, NULL));
    CHECK(finalize(cb));
    double t1 = now();
    CHECK(enqueue(0, NULL, cb, 0, NULL, NULL));
    CHECK(clFinish(q));
    double t2 = now();
    for (int r = 1; r < reps; r++) {
        CHECK(enqueue(0, NULL, cb, 0, NULL, NULL));
        CHECK(clFinish(q));
    }
    double t3 = now();
    int got = 0;
    CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof got, &got, 0, NULL, NULL));
    printf("command buffer of %d increments: recorded in %.2f us a launch; first run %.2f, then %.2f us a launch%s\n", n,
           (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6, (t3 - t2) / (reps - 1) / n * 1e6,
           got == n * reps ? " (in order)" : " (COUNT WRONG: not run in order)");
    release(cb);
    /* one kernel object recorded twice with other arguments: each command must keep its own */
    cl_program pr;
    CHECK(clGetKernelInfo(k_chain, CL_KERNEL_PROGRAM, sizeof pr, &pr, NULL));
    cl_kernel k_put = clCreateKernel(pr, "put", &e);
    CHECK(e);
    CHECK(clEnqueueFillBuffer(q, a, &zero, sizeof zero, 0, 64, 0, NULL, NULL));
    cb = create(1, &q, NULL, &e);
    CHECK(e);
    for (cl_int i = 0; i < 2; i++) {
        cl_int v = 10 + i;
        CHECK(clSetKernelArg(k_put, 0, sizeof a, &a));
        CHECK(clSetKernelArg(k_put, 1, sizeof i, &i));
        CHECK(clSetKernelArg(k_put, 2, sizeof v, &v));
        CHECK(record(cb, NULL, NULL, k_put, 1, NULL, &g, &l, 0, NULL, NULL, NULL));
    }
    CHECK(finalize(cb));
    cl_int i9 = 9, v9 = 99; /* set after recording: must not reach the buffer */
    CHECK(clSetKernelArg(k_put, 1, sizeof i9, &i9));
    CHECK(clSetKernelArg(k_put, 2, sizeof v9, &v9));
    CHECK(enqueue(0, NULL, cb, 0, NULL, NULL));
    cl_int vals[16] = {0};
    CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof vals, vals, 0, NULL, NULL));
    printf("command buffer arguments: %s (a[0] %d, a[1] %d, a[9] %d)\n",
           vals[0] == 10 && vals[1] == 11 && vals[9] == 0 ? "each command keeps its own" : "NOT KEPT PER COMMAND", vals[0], vals[1], vals[9]);
    release(cb);
    clReleaseKernel(k_put);
}

/* What one work-group of 256 threads a compute unit can read (the `token` kernel's shape): each thread
 * loads U uint4s before it uses them (`reg`), or copies them into a ring of S stages of V uint4s a thread in
 * local memory with cp.async (`cpa`, NVIDIA's inline PTX: copies in flight without registers); SW = S - 1 */
static const char *src_flight =
    "#ifndef U\n#define U 4\n#endif\n#ifndef V\n#define V 4\n#endif\n#ifndef S\n#define S 2\n#define SW 1\n#endif\n"
    "__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void reg(__global const uint4 *w, int chunks, __global uint *out) {\n"
    "  uint s = 0;\n"
    "  for (int c = get_group_id(0); c < chunks; c += get_num_groups(0)) {\n"
    "    __global const uint4 *p = w + (size_t)c * 256 * U;\n"
    "    uint4 v[U];\n"
    "    for (int j = 0; j < U; j++) v[j] = p[get_local_id(0) + j * 256];\n"
    "    for (int j = 0; j < U; j++) s += v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;\n"
    "  }\n"
    "  if (s == 0x12345678u) out[0] = s;\n"
    "}\n"
    "#ifdef CPA\n"
    "#define COPY(dst, src) asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16;\" :: \"r\"((uint)(size_t)(dst)), \"l\"(src) : \"memory\")\n"
    "#define COMMIT() asm volatile(\"cp.async.commit_group;\" ::: \"memory\")\n"
    "#define WAIT_(n) asm volatile(\"cp.async.wait_group \" #n \";\" ::: \"memory\")\n"
    "#define WAIT(n) WAIT_(n)\n"
    "__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void cpa(__global const uint4 *w, int chunks, __global uint *out) {\n"
    "  __local uint4 ring[S][V * 256];\n"
    "  uint s = 0;\n"
    "  int lid = get_local_id(0), G = get_num_groups(0), c0 = get_group_id(0);\n"
    "  int mine = c0 < chunks ? (chunks - c0 + G - 1) / G : 0;\n"
    "  for (int i = 0; i < S - 1 + mine; i++) {\n"
    "    if (i < mine) { /* stage i's copies */\n"
    "      __global const uint4 *p = w + (size_t)(c0 + i * G) * 256 * V;\n"
    "      for (int j = 0; j < V; j++) COPY(&ring[i % S][lid + j * 256], p + lid + j * 256);\n"
    "    }\n"
    "    COMMIT();\n"
    "    if (i < S - 1) continue;\n"
    "    WAIT(SW); /* stage i - (S - 1) has landed (a thread reads only its own copies: no barrier) */\n"
    "    for (int j = 0; j < V; j++) { uint4 v = ring[(i - (S - 1)) % S][lid + j * 256]; s += v.x ^ v.y ^ v.z ^ v.w; }\n"
    "  }\n"
    "  if (s == 0x12345678u) out[0] = s;\n"
    "}\n"
    "#endif\n";

/* Read bandwidth of 1 GiB (or half the largest allocation) by one and two work-groups a compute unit, each
 * in-flight variant */
static void in_flight(cl_context cx, cl_device_id dev, cl_uint cus, int nvidia) {
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    size_t bytes = (size_t)1 << 30;
    while (bytes > max_alloc / 2 && bytes > (1u << 24)) bytes /= 2;
    cl_int e;
    cl_mem w = clCreateBuffer(cx, CL_MEM_READ_ONLY, bytes, NULL, &e);
    CHECK(e);
    cl_mem out = clCreateBuffer(cx, CL_MEM_READ_WRITE, 64, NULL, &e);
    CHECK(e);
    unsigned char pat = 1;
    CHECK(clEnqueueFillBuffer(q, w, &pat, 1, 0, bytes, 0, NULL, NULL));
    /* uint4s a thread a chunk (U, or V), and the cp.async ring's stages (0: `reg`) */
    const struct { int per, stages; } vs[] = {{4, 0}, {8, 0}, {16, 0}, {4, 2}, {4, 3}, {2, 5}, {1, 11}};
    for (int mult = 1; mult <= 2; mult++)
        for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) {
            if (!nvidia && vs[v].stages) continue;
            char opts[64];
            if (vs[v].stages) snprintf(opts, sizeof opts, "-DCPA -DV=%d -DS=%d -DSW=%d", vs[v].per, vs[v].stages, vs[v].stages - 1);
            else snprintf(opts, sizeof opts, "-DU=%d", vs[v].per);
            const char *kn = vs[v].stages ? "cpa" : "reg";
            cl_program pr = clCreateProgramWithSource(cx, 1, &src_flight, NULL, &e);
            CHECK(e);
            if (clBuildProgram(pr, 1, &dev, opts, NULL, NULL)) {
                printf("in flight: %s %s does not build here\n", kn, opts);
                clReleaseProgram(pr);
                continue;
            }
            cl_kernel k = clCreateKernel(pr, kn, &e);
            CHECK(e);
            cl_int chunks = (cl_int)(bytes / (256 * 16 * (size_t)vs[v].per));
            CHECK(clSetKernelArg(k, 0, sizeof w, &w));
            CHECK(clSetKernelArg(k, 1, sizeof chunks, &chunks));
            CHECK(clSetKernelArg(k, 2, sizeof out, &out));
            size_t l = 256, g = (size_t)cus * mult * l;
            double best = 1e30;
            for (int r = 0; r < 6; r++) { /* the first run warms up */
                double t0 = now();
                CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, &l, 0, NULL, NULL));
                CHECK(clFinish(q));
                double t = now() - t0;
                if (r && t < best) best = t;
            }
            printf("in flight: %d group(s) a CU, %-3s %-26s %7.0f GB/s\n", mult, kn, opts, bytes / best / 1e9);
            clReleaseKernel(k);
            clReleaseProgram(pr);
        }
    clReleaseMemObject(w);
    clReleaseMemObject(out);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int want = argc > 1 ? atoi(argv[1]) : -1; /* default: the first GPU, else the first device */
    cl_platform_id ps[8];
    cl_uint np = 0;
    CHECK(clGetPlatformIDs(8, ps, &np));
    cl_device_id dev = NULL;
    int seen = 0;
    for (cl_uint p = 0; p < np && !dev; p++) {
        cl_device_id ds[16];
        cl_uint nd = 0;
        if (clGetDeviceIDs(ps[p], CL_DEVICE_TYPE_ALL, 16, ds, &nd)) continue;
        for (cl_uint d = 0; d < nd && !dev; d++) {
            cl_device_type t = 0;
            clGetDeviceInfo(ds[d], CL_DEVICE_TYPE, sizeof t, &t, NULL);
            if (want >= 0 ? seen == want : (t & CL_DEVICE_TYPE_GPU) != 0) dev = ds[d];
            seen++;
        }
    }
    if (!dev && want < 0) { /* no GPU: the first device */
        cl_uint nd = 0;
        for (cl_uint p = 0; p < np && !dev; p++)
            if (!clGetDeviceIDs(ps[p], CL_DEVICE_TYPE_ALL, 1, &dev, &nd) && nd) break;
    }
    if (!dev) {
        fprintf(stderr, "cl_floor: no OpenCL device %d\n", want);
        return 1;
    }
    char name[256];
    cl_uint cus = 0;
    clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL);
    cl_device_type type = 0;
    clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    char version[256], driver[256], ext[8192];
    clGetDeviceInfo(dev, CL_DEVICE_VERSION, sizeof version, version, NULL);
    clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof driver, driver, NULL);
    if (clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL)) ext[0] = 0;
    printf("device: %s, %u compute units, %s, driver %s\nextensions: %s\n", name, cus, version, driver, ext);
    cl_int e;
    cl_context cx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
    CHECK(e);
    q = clCreateCommandQueue(cx, dev, 0, &e);
    CHECK(e);
    cl_program pr = clCreateProgramWithSource(cx, 1, &src, NULL, &e);
    CHECK(e);
    if (clBuildProgram(pr, 1, &dev, "", NULL, NULL)) {
        char log[8192];
        clGetProgramBuildInfo(pr, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        fprintf(stderr, "%s\n", log);
        return 1;
    }
    size_t wbytes = 64u << 20;
    cl_mem a = clCreateBuffer(cx, CL_MEM_READ_WRITE, 64, NULL, &e);
    CHECK(e);
    cl_mem w = clCreateBuffer(cx, CL_MEM_READ_WRITE, wbytes, NULL, &e);
    CHECK(e);
    unsigned char pat = 1;
    CHECK(clEnqueueFillBuffer(q, w, &pat, 1, 0, wbytes, 0, NULL, NULL));
    int zero = 0;
    CHECK(clEnqueueFillBuffer(q, a, &zero, sizeof zero, 0, 64, 0, NULL, NULL));
    cl_kernel k_empty = clCreateKernel(pr, "empty", &e);
    CHECK(e);
    cl_kernel k_chain = clCreateKernel(pr, "chain", &e);
    CHECK(e);
    cl_kernel k_stream = clCreateKernel(pr, "stream", &e);
    CHECK(e);
    CHECK(clSetKernelArg(k_empty, 0, sizeof a, &a));
    CHECK(clSetKernelArg(k_chain, 0, sizeof a, &a));
    const int n = 3000;
    size_t gs[] = {1, cus, (size_t)cus * 4, (size_t)cus * 16};
    for (int i = 0; i < 4; i++) launches("empty kernel", k_empty, gs[i], 256, n, 0);
    launches("empty kernel", k_empty, cus * 4, 256, n, 1);
    launches("empty kernel", k_empty, cus * 4, 256, n, 8);
    launches("one thread increments a counter", k_chain, 1, 64, n, 0);
    launches_nd("empty kernel, a 3-D range", k_empty, cus * 4, 256, n, 0, 3); /* as the prompt path launches (run3) */
    /* decode's kernels take a dozen buffers and a position that changes every step */
    cl_kernel k_many = clCreateKernel(pr, "many", &e);
    CHECK(e);
    for (cl_uint i = 0; i < 12; i++) CHECK(clSetKernelArg(k_many, i, sizeof a, &a));
    cl_int big = 1 << 30;
    CHECK(clSetKernelArg(k_many, 12, sizeof big, &big));
    launches("12 buffer arguments", k_many, cus * 4, 256, n, 0);
    {
        size_t l = 256, g = cus * 4 * l;
        double t0 = now();
        for (int i = 0; i < n; i++) {
            cl_int v = big + (i & 1);
            CHECK(clSetKernelArg(k_many, 12, sizeof v, &v));
            CHECK(clEnqueueNDRangeKernel(q, k_many, 1, NULL, &g, &l, 0, NULL, NULL));
        }
        double t1 = now();
        CHECK(clFinish(q));
        printf("%-34s groups %5zu x %4zu        : enqueue %6.2f us, wall %6.2f us per launch\n",
               "12 buffers, an int set per launch", g / l, l, (t1 - t0) / n * 1e6, (now() - t0) / n * 1e6);
    }
    clReleaseKernel(k_many);
    /* is it the buffers, or any argument? */
    int_args(pr, "ints", a, 12, "a buffer and 12 int arguments", cus * 4, n);
    int_args(pr, "ints25", a, 25, "a buffer and 25 int arguments", cus * 4, n);
    /* what a GEMM launch of the prompt path passes besides its buffers: 13 ulong offsets, 12 ints */
    cl_kernel k_longs = clCreateKernel(pr, "longs", &e);
    CHECK(e);
    CHECK(clSetKernelArg(k_longs, 0, sizeof a, &a));
    for (cl_uint i = 1; i < 14; i++) {
        cl_ulong v = i;
        CHECK(clSetKernelArg(k_longs, i, sizeof v, &v));
    }
    CHECK(clSetKernelArg(k_longs, 14, sizeof big, &big));
    for (cl_uint i = 15; i < 26; i++) CHECK(clSetKernelArg(k_longs, i, sizeof big, &i));
    launches("a buffer, 13 ulong and 12 int", k_longs, cus * 4, 256, n, 0);
    clReleaseKernel(k_longs);
    /* the buffers: 12 distinct ones; one buffer 12 times, small or as large as a weight matrix */
    {
        cl_kernel km = clCreateKernel(pr, "many", &e);
        CHECK(e);
        cl_mem bs[12];
        for (int i = 0; i < 12; i++) {
            bs[i] = clCreateBuffer(cx, CL_MEM_READ_WRITE, 4096, NULL, &e);
            CHECK(e);
            CHECK(clSetKernelArg(km, (cl_uint)i, sizeof bs[i], &bs[i]));
        }
        CHECK(clSetKernelArg(km, 12, sizeof big, &big));
        launches("12 distinct buffers", km, cus * 4, 256, n, 0);
        { /* as the prompt path launches: a kernel object serves every layer, its arguments set anew each time */
            size_t l = 256, g = cus * 4 * l;
            double t0 = now(), t_enq = 0;
            for (int i = 0; i < n; i++) {
                for (int j = 0; j < 12; j++) CHECK(clSetKernelArg(km, (cl_uint)j, sizeof bs[0], &bs[(i + j) % 12]));
                double t1 = now();
                CHECK(clEnqueueNDRangeKernel(q, km, 1, NULL, &g, &l, 0, NULL, NULL));
                t_enq += now() - t1;
            }
            double t2 = now();
            CHECK(clFinish(q));
            printf("%-34s groups %5zu x %4zu        : enqueue %6.2f us (set + enqueue %6.2f), wall %6.2f us per launch\n",
                   "12 distinct buffers, set each time", g / l, l, t_enq / n * 1e6, (t2 - t0) / n * 1e6, (now() - t0) / n * 1e6);
        }
        for (int i = 1; i < 12; i++) CHECK(clSetKernelArg(km, (cl_uint)i, sizeof bs[0], &bs[0]));
        launches("one 4 KiB buffer 12 times", km, cus * 4, 256, n, 0);
        for (int i = 0; i < 12; i++) CHECK(clSetKernelArg(km, (cl_uint)i, sizeof w, &w));
        launches("one 64 MiB buffer 12 times", km, cus * 4, 256, n, 0);
        for (int i = 0; i < 12; i++) clReleaseMemObject(bs[i]);
        clReleaseKernel(km);
    }
    command_buffer(dev, a, k_chain, ext);
    /* the decode matrices: 896x896 / 896x1152 (0.45-0.6 MB), gate+up 4.4 MB, lm_head 77 MB (here 64) */
    size_t sizes[] = {512u << 10, 4480u << 10, 64u << 20};
    for (int i = 0; i < 3; i++) {
        cl_int n16 = (cl_int)(sizes[i] / 16);
        CHECK(clSetKernelArg(k_stream, 0, sizeof w, &w));
        CHECK(clSetKernelArg(k_stream, 1, sizeof n16, &n16));
        CHECK(clSetKernelArg(k_stream, 2, sizeof a, &a));
        size_t groups = (size_t)(n16 + 255) / 256;
        if (groups > (size_t)cus * 16) groups = (size_t)cus * 16;
        char what[64];
        snprintf(what, sizeof what, "read %.2f MB once", sizes[i] / 1048576.0);
        double t = launches(what, k_stream, groups, 256, i == 2 ? 200 : n, 0);
        printf("%-34s %.0f GB/s\n", "", sizes[i] / t / 1e9);
    }
    const char *gk[] = {"gsync_atomic", "gsync_load"};
    /* CPU runtimes (PoCL) do not run work-groups concurrently: a grid barrier would spin forever */
    for (int v = 0; v < 2 && !(type & CL_DEVICE_TYPE_CPU); v++)
        for (int mult = 1; mult <= 2; mult++) {
            cl_kernel k = clCreateKernel(pr, gk[v], &e);
            CHECK(e);
            cl_int rounds = 2000;
            CHECK(clEnqueueFillBuffer(q, a, &zero, sizeof zero, 0, 64, 0, NULL, NULL));
            CHECK(clSetKernelArg(k, 0, sizeof a, &a));
            CHECK(clSetKernelArg(k, 1, sizeof rounds, &rounds));
            size_t l = 256, g = (size_t)cus * mult * l;
            CHECK(clFinish(q));
            double t0 = now();
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, &l, 0, NULL, NULL));
            CHECK(clFinish(q));
            double t = now() - t0;
            int got = 0;
            CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof got, &got, 0, NULL, NULL));
            printf("grid barrier %-21s groups %5zu x %4zu: %6.2f us per barrier%s\n", gk[v], g / l, l, t / rounds * 1e6,
                   got == rounds * (int)(g / l) ? "" : " (TIMED OUT: not all groups resident)");
            clReleaseKernel(k);
        }
    char vendor[256] = "";
    clGetDeviceInfo(dev, CL_DEVICE_VENDOR, sizeof vendor, vendor, NULL);
    in_flight(cx, dev, cus, strstr(vendor, "NVIDIA") != NULL);
    clReleaseKernel(k_empty);
    clReleaseKernel(k_chain);
    clReleaseKernel(k_stream);
    clReleaseMemObject(a);
    clReleaseMemObject(w);
    clReleaseProgram(pr);
    clReleaseCommandQueue(q);
    clReleaseContext(cx);
    return 0;
}
