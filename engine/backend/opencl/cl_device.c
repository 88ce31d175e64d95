/* The OpenCL device and program: listing platforms and devices, building the kernels (embedded or
 * from TLLM_CL_DIR) with the model's shapes and the device's options, and reading back their tunables. */
#include "engine/backend/opencl/cl_internal.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"

/* kernels/opencl/'s files in the order they are joined, embedded at build time (cmake/embed_cl.cmake) */
extern const char *const tllm_cl_sources[], *const tllm_cl_source_names[];
extern const int tllm_cl_n_sources;

const char *tllm_cl_err_name(cl_int e) {
    switch (e) {
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_ARG_INDEX: return "CL_INVALID_ARG_INDEX";
    case CL_INVALID_ARG_VALUE: return "CL_INVALID_ARG_VALUE";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_WORK_ITEM_SIZE: return "CL_INVALID_WORK_ITEM_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case -1001: return "no OpenCL platform (CL_PLATFORM_NOT_FOUND_KHR)";
    default: return "OpenCL error";
    }
}

/* All devices of all platforms, in listing order. */
int tllm_cl_all_devices(cl_device_id *devs, cl_platform_id *plats_of, int max) {
    cl_platform_id plats[MAX_PLATFORMS];
    cl_uint np = 0;
    if (clGetPlatformIDs(MAX_PLATFORMS, plats, &np) != CL_SUCCESS) return 0;
    int n = 0;
    for (cl_uint p = 0; p < np && p < MAX_PLATFORMS; p++) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, (cl_uint)(max - n), devs + n, &nd) != CL_SUCCESS) continue;
        for (cl_uint d = 0; d < nd; d++) plats_of[n + (int)d] = plats[p];
        n += (int)nd;
        if (n >= max) break;
    }
    return n;
}

int tllm_cl_list(FILE *out) {
    cl_device_id devs[MAX_DEVICES];
    cl_platform_id plats[MAX_DEVICES];
    int n = tllm_cl_all_devices(devs, plats, MAX_DEVICES);
    for (int i = 0; i < n; i++) {
        char pname[128] = "", dname[128] = "", ver[64] = "";
        cl_device_type type = 0;
        cl_ulong mem = 0;
        cl_uint cus = 0;
        clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof pname, pname, NULL);
        clGetDeviceInfo(devs[i], CL_DEVICE_NAME, sizeof dname, dname, NULL);
        clGetDeviceInfo(devs[i], CL_DEVICE_VERSION, sizeof ver, ver, NULL);
        clGetDeviceInfo(devs[i], CL_DEVICE_TYPE, sizeof type, &type, NULL);
        clGetDeviceInfo(devs[i], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
        clGetDeviceInfo(devs[i], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL);
        fprintf(out, "opencl:%d  %s  [%s, %s, %u compute units, %.1f GiB]  %s\n", i, dname,
                type & CL_DEVICE_TYPE_GPU ? "GPU" : type & CL_DEVICE_TYPE_CPU ? "CPU" : "other", pname, cus,
                (double)mem / (1 << 30), ver);
    }
    return n;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* The most local memory one work-group of any kernel of the program takes (0 if none says). */
static cl_ulong program_local_mem(struct tllm_cl *cl) {
    static const char *const names[] = {"matvec", "attn_out", "gate_up", "qkv", "attention", "token"};
    cl_ulong worst = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        cl_int e;
        cl_kernel k = clCreateKernel(cl->prog, names[i], &e);
        if (e != CL_SUCCESS) continue; /* `token` is absent where ATT_LWS != MV_LWS */
        cl_ulong n = 0;
        clGetKernelWorkGroupInfo(k, cl->dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof n, &n, NULL);
        worst = n > worst ? n : worst;
        clReleaseKernel(k);
    }
    return worst;
}

/* The compiler's messages, if any, to stderr */
static void print_build_log(const struct tllm_cl *cl) {
    size_t n = 0;
    clGetProgramBuildInfo(cl->prog, cl->dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    char *log = n > 1 ? malloc(n + 1) : NULL;
    if (log && clGetProgramBuildInfo(cl->prog, cl->dev, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS) {
        log[n] = 0;
        fprintf(stderr, "opencl build log for %s:\n%s\n", cl->name, log);
    }
    free(log);
}

/* clBuildProgram with standard error closed: PoCL's compiler writes its warnings there itself ("1
 * warning generated."), which the build log repeats; the log is printed when the build fails, and
 * everything is kept with TLLM_CL_PROFILE or TLLM_CL_VERBOSE. */
static cl_int quiet_build(struct tllm_cl *cl, const char *opts) {
    int keep = cl->profile || cl->phases || getenv("TLLM_CL_VERBOSE"), saved = -1, null = -1;
    fflush(stderr);
    if (!keep && (saved = dup(STDERR_FILENO)) >= 0 && (null = open("/dev/null", O_WRONLY | O_CLOEXEC)) >= 0)
        dup2(null, STDERR_FILENO);
    cl_int e = clBuildProgram(cl->prog, 1, &cl->dev, opts, NULL, NULL);
    if (saved >= 0) {
        dup2(saved, STDERR_FILENO);
        close(saved);
    }
    if (null >= 0) close(null);
    return e;
}

/* MV_LOCAL_X: the inputs a matvec stages in local memory at once (longer ones go in chunks of it,
 * chunked_times_x in kernels/opencl/matvec.cl, each chunk a pass over the rows). No more than the model's longest input; with 4-bit int8 activations at most
 * the kernels' default (8192), less on devices with little local memory (32 KiB); with float ones, or
 * int8 with halves' sums, the longest input wherever it fits beside the `token` kernel's other arrays
 * (NVIDIA's 48 KiB hold Qwen2.5-1.5B's 8960-wide down_proj input, float or int8, and 3B's 11008 as int8).
 * xq: the kernels take int8 activations (XQ); halves: with each half block's sum (XQ_HALVES). */
static int stage_size(const struct tllm_config *c, cl_ulong local_mem, int xq, int halves) {
    int longest = c->dim > c->ffn_dim ? c->dim : c->ffn_dim, local_x = CL_MV_LOCAL_X;
    longest = c->n_heads * c->head_dim > longest ? c->n_heads * c->head_dim : longest;
    longest = (longest + 255) / 256 * 256;
    /* bytes of local memory a staged input takes (float and padding, block sums: XS_ALLOC, xsum in
     * kernels/opencl/weights.cl; int8 with halves' sums: XQ_FUSED, XSUM_LEN) and token's other arrays at
     * MV_LWS = ATT_LWS = 256, with a margin. Not for 4-bit int8 inputs without halves: there (NVIDIA)
     * down_proj is fused into gate_up's phase, and needs no whole staged input */
    const double per = xq ? 2.5 : 4.375;
    const cl_ulong other = 12 * 256 + 20 * 256 + 4 + 256;
    if ((!xq || halves) && local_mem > other && longest > local_x && (double)longest * per <= (double)(local_mem - other))
        return longest;
    if (longest < local_x) local_x = longest;
    int room = local_mem && local_mem < 48 * 1024 ? (int)((local_mem - 8 * 1024) / 4 / 256 * 256) : local_x;
    return room < local_x ? room : local_x;
}

/* int8_ok: int8 activations may be compiled in (retried without them when they do not fit) */
int tllm_cl_build_program(struct tllm_cl *cl, int int8_ok) {
    /* TLLM_CL_DIR: load the kernel files from disk (while developing); TLLM_CL_OPTS: extra -D options */
    const char *dir = getenv("TLLM_CL_DIR"), *extra = getenv("TLLM_CL_OPTS");
    enum { MAX_SOURCES = 16 };
    char *disk[MAX_SOURCES] = {0};
    const char *src[MAX_SOURCES];
    int n_src = tllm_cl_n_sources < MAX_SOURCES ? tllm_cl_n_sources : MAX_SOURCES;
    for (int i = 0; i < n_src; i++) {
        src[i] = tllm_cl_sources[i];
        if (!dir) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, tllm_cl_source_names[i]);
        if (!(disk[i] = read_file(path))) {
            for (int j = 0; j < i; j++) free(disk[j]);
            return tllm_fail(TLLM_ERR_IO, "%s: cannot read (TLLM_CL_DIR)", path);
        }
        src[i] = disk[i];
    }
    cl_int e;
    cl_ulong local_mem = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local_mem, &local_mem, NULL);
    char opts[1024], fit[64] = "", lws[48] = "";
    const struct tllm_config *c = &cl->m->cfg;
    /* CPU devices get 64-thread matvec groups: PoCL 3.1 (Debian 12, what CI runs) miscompiles the matvec kernels
     * at 128 and 256 (a vectorized store with a wild trip count; correct with -cl-opt-disable) */
    cl_device_type type = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if ((type & CL_DEVICE_TYPE_CPU) && !(extra && strstr(extra, "MV_LWS"))) snprintf(lws, sizeof lws, "-DMV_LWS=64");
    /* and so do prefill's row-wise kernels at 256, and at 64 when part of a group is past the row's end
     * (a garbled quantization of a row; right with -cl-opt-disable): 32, one block of 32 a group */
    if ((type & CL_DEVICE_TYPE_CPU) && !(extra && strstr(extra, "PF_LWS"))) strncat(lws, " -DPF_LWS=32", sizeof lws - strlen(lws) - 1);
    /* gemm_few's the same, so that gemm_few_norm's epilogue (pf_norm's work) has no work-items past the row */
    if ((type & CL_DEVICE_TYPE_CPU) && !(extra && strstr(extra, "FEW_LWS"))) strncat(lws, " -DFEW_LWS=32", sizeof lws - strlen(lws) - 1);
    /* one format for every matrix (the usual mlx-lm checkpoint): compile it in (Q_FIX in kernels/opencl/common.cl) */
    /* and whether every matrix holds 4- or 8-bit codes (codes48), some with each half block's sum (halves):
     * the int8 activations' formats, below */
    /* and, for several formats, each one's weight bytes (mix: most first) */
    enum { MIX_MAX = 4 };
    int fmt[3] = {-1, -1, -1}, uniform = 1, codes48 = 1, halves = 0, mix[MIX_MAX + 1][3], n_mix = 0;
    size_t mix_bytes[MIX_MAX + 1] = {0};
    for (int i = 0; i < tllm_cl_n_mats(cl->m); i++) {
        const struct tllm_qweights *w = &cl->mats[i];
        int dense = w->format == TLLM_WF_DENSE, f[3] = {dense ? 0 : w->bits, dense ? 1 : w->group_size, cl->forms[i].dt};
        if (i == 0) memcpy(fmt, f, sizeof f);
        uniform = uniform && !memcmp(fmt, f, sizeof f);
        int k = 0;
        while (k < n_mix && memcmp(mix[k], f, sizeof f)) k++;
        if (k == n_mix && n_mix <= MIX_MAX) memcpy(mix[n_mix++], f, sizeof f);
        if (k <= MIX_MAX) mix_bytes[k] += tllm_qw_nbytes(w);
        int bits = w->format == TLLM_WF_AFFINE ? w->bits : 0;
        codes48 = codes48 && (bits == 4 || bits == 8) && w->group_size % 16 == 0;
        halves = halves || bits == 8 || w->group_size < 32;
    }
    /* and the head size, so attention's loops and branches fold (H200: the `token` kernel's attention
     * then has one form, not three, and the other phases run faster for the smaller program) */
    char fixed[256] = "";
    int n_fixed = extra && strstr(extra, "HEAD_DIM") ? 0 : snprintf(fixed, sizeof fixed, "-DHEAD_DIM=%d", c->head_dim);
    /* and the hidden size, for the fused FFN's rows (ROW_TAIL in kernels/opencl/common.cl) */
    if (!(extra && strstr(extra, "MODEL_DIM"))) n_fixed += snprintf(fixed + n_fixed, sizeof fixed - (size_t)n_fixed, " -DMODEL_DIM=%d", c->dim);
    int cpu_dev = (type & CL_DEVICE_TYPE_CPU) != 0;
    cl->fixed_formats = uniform;
    if (uniform) {
        snprintf(fixed + n_fixed, sizeof fixed - (size_t)n_fixed, " -DQ_BITS=%d -DQ_GS=%d -DQ_DT=%d", fmt[0], fmt[1], fmt[2]);
    } else if (n_mix <= MIX_MAX && (cpu_dev ? extra && strstr(extra, "MIX_COPIES=1") : !(extra && strstr(extra, "MIX_COPIES=0")))) {
        /* a copy of the weight reads per format (Q_COPIES in kernels/opencl/common.cl). Not on CPU devices
         * unless asked (-DMIX_COPIES=1): PoCL's code ran the real 0.5B Q4_K_M 12% slower with them */
        for (int a = 0; a < n_mix; a++) /* most bytes first: the first test a read makes is the likeliest */
            for (int b = a + 1; b < n_mix; b++)
                if (mix_bytes[b] > mix_bytes[a]) {
                    int t[3];
                    size_t tb = mix_bytes[a];
                    memcpy(t, mix[a], sizeof t), memcpy(mix[a], mix[b], sizeof t), memcpy(mix[b], t, sizeof t);
                    mix_bytes[a] = mix_bytes[b], mix_bytes[b] = tb;
                }
        n_fixed += snprintf(fixed + n_fixed, sizeof fixed - (size_t)n_fixed, " -DQ_NF=%d", n_mix);
        cl->fixed_formats = 1;
        for (int a = 0; a < n_mix; a++)
            n_fixed += snprintf(fixed + n_fixed, sizeof fixed - (size_t)n_fixed, " -DQ_B%d=%d -DQ_G%d=%d -DQ_D%d=%d", a, mix[a][0], a,
                                mix[a][1], a, mix[a][2]);
    }
    /* int8 activations (XQ in kernels/opencl/common.cl) where the CPU path takes them too (a packed model, i.e. not
     * --exact), for models of 4- and 8-bit codes (as the device holds them: GGUF's 5- and 6-bit ones, E2M1 too,
     * come as 8-bit) whose inputs split into blocks of 32; 8-bit codes and groups of 16 also need each half
     * block's sum (XQ_HALVES). NVIDIA gets dp4a and warp shuffles through inline PTX (its OpenCL has neither
     * the integer dot product extension nor subgroups) */
    /* On a CPU device only with the format compiled in: PoCL (LLVM 15) took over ten minutes to compile the
     * run-time-format int8 kernels for Qwen2.5-0.5B's mixed GGUF, and had not finished (a small model's
     * compile in seconds: tests/gguf_device.py asks for them with -DQ_INT8=1) */
    int xq = int8_ok && codes48 && (uniform || !cpu_dev) && cl->mats[2].pack && c->dim % 32 == 0 && c->ffn_dim % 32 == 0 &&
             (c->n_heads * c->head_dim) % 32 == 0 && !(extra && strstr(extra, "Q_INT8"));
    cl->int8 = xq || (extra && strstr(extra, "Q_INT8=1") && codes48);
    if (cl->int8 && halves && !(extra && strstr(extra, "XQ_HALVES")))
        strncat(fixed, " -DXQ_HALVES=1", sizeof fixed - strlen(fixed) - 1);
    int local_x = stage_size(c, local_mem, cl->int8, halves);
    if (local_x != CL_MV_LOCAL_X && !(extra && strstr(extra, "MV_LOCAL_X")))
        snprintf(fit, sizeof fit, "-DMV_LOCAL_X=%d", local_x);
    int nvidia = strstr(cl->name, "(NVIDIA CUDA)") != NULL; /* the platform, so inline PTX compiles */
    /* and int8 tensor cores for the prompt GEMMs (mma.sync m16n8k32: sm_80 and later) */
    cl_uint cc_major = 0;
    if (nvidia) clGetDeviceInfo(cl->dev, 0x4000 /* CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV */, sizeof cc_major, &cc_major, NULL);
    int mma = cc_major >= 8 && !(extra && strstr(extra, "MMA_PTX"));
    /* and `token` fuses gate_up with down_proj, attention with o_proj (PTX's float atomic add;
     * FFN_FUSED, ATT_FUSED in kernels/opencl/common.cl), unless the sums must come in a fixed order
     * (--deterministic: every other reduction of decode and prefill has one) */
    int fuse_ffn = nvidia && xq && !cl->m->deterministic && c->ffn_dim % 32 == 0 && c->dim + 256 <= local_x && !(extra && strstr(extra, "FUSE_FFN"));
    int fuse_att = nvidia && xq && !cl->m->deterministic && !(extra && strstr(extra, "FUSE_ATT")); /* the kernel checks the head size */
    char rows[32] = ""; /* padding rows of the lm_head: never an argmax */
    if (cl->m->n_sample < c->vocab_size) snprintf(rows, sizeof rows, "-DARGMAX_ROWS=%d", cl->m->n_sample);
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 %s %s %s %s %s %s%s %s %s %s %s", rows, fit, lws, fixed, xq ? "-DQ_INT8=1" : "",
             nvidia ? "-DDP4A_PTX -DSHFL_PTX" : "", mma ? " -DMMA_PTX" : "", fuse_ffn ? "-DFUSE_FFN=1" : "", fuse_att ? "-DFUSE_ATT=1" : "",
             cl->phases ? "-DPHASE_TIMES" : "", extra ? extra : "");
    /* a GPU's program is kept as its binary; a CPU device's is not (PoCL builds the kernels it runs as
     * they are first launched and keeps them in its own cache; asking it for the binary would compile
     * every kernel, doubling the first run), only a mark that it was built, so the note comes once */
    char cache[1200];
    int cpu = (type & CL_DEVICE_TYPE_CPU) != 0, cached = tllm_cl_cache_path(cl, src, n_src, opts, cache, sizeof cache);
    if (cached && !cpu && tllm_cl_cache_load(cl, cache, opts)) {
        e = CL_SUCCESS;
    } else {
        cl->prog = clCreateProgramWithSource(cl->cx, (cl_uint)n_src, src, NULL, &e);
        if (e != CL_SUCCESS) {
            for (int i = 0; i < n_src; i++) free(disk[i]);
            return tllm_fail(TLLM_ERR_IO, "opencl: clCreateProgramWithSource: %s", tllm_cl_err_name(e));
        }
        int first = cached && !tllm_cl_cache_seen(cache);
        if (first)
            fprintf(stderr, "tllm: opencl: compiling the kernels for %s (the first run on this device%s)\n", cl->name,
                    cpu ? "; its driver keeps them for the next" : ", kept for the next");
        e = quiet_build(cl, opts);
        if (e == CL_SUCCESS && cached) tllm_cl_cache_store(cl, cache, !cpu);
    }
    for (int i = 0; i < n_src; i++) free(disk[i]);
    if (e != CL_SUCCESS) {
        print_build_log(cl);
        return tllm_fail(TLLM_ERR_IO, "opencl: kernels/opencl/ does not build on %s: %s (log above)", cl->name,
                         tllm_cl_err_name(e));
    }
    if (xq && local_mem && program_local_mem(cl) > local_mem) { /* the int8 form does not fit: float inputs */
        clReleaseProgram(cl->prog);
        cl->prog = NULL;
        return tllm_cl_build_program(cl, 0);
    }
    if (cl->profile || cl->phases) print_build_log(cl); /* e.g. registers, with -cl-nv-verbose */
    const char *dump = getenv("TLLM_CL_DUMP"); /* the compiled program (PTX on NVIDIA), for inspection */
    if (dump) {
        size_t n = 0;
        clGetProgramInfo(cl->prog, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL);
        unsigned char *bin = n ? malloc(n) : NULL;
        FILE *f = bin ? fopen(dump, "wb") : NULL;
        if (f && clGetProgramInfo(cl->prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS) fwrite(bin, 1, n, f);
        if (f) fclose(f);
        free(bin);
    }
    return TLLM_OK;
}

int tllm_cl_make_kernel(struct tllm_cl *cl, cl_kernel *k, const char *name) {
    cl_int e;
    *k = clCreateKernel(cl->prog, name, &e);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: kernel %s: %s", name, tllm_cl_err_name(e));
    return TLLM_OK;
}

/* For the profile: what a kernel that does nothing costs on this device, and the gap between two. */
void tllm_cl_measure_floor(struct tllm_cl *cl) {
    enum { N = 64 };
    cl_kernel k;
    if (tllm_cl_make_kernel(cl, &k, "tunables")) return;
    cl_int e;
    cl_mem buf = clCreateBuffer(cl->cx, CL_MEM_WRITE_ONLY, sizeof(cl_int) * N_TUNABLES, NULL, &e);
    cl_event ev[N];
    size_t one = 1;
    int n = 0;
    if (e == CL_SUCCESS && clSetKernelArg(k, 0, sizeof buf, &buf) == CL_SUCCESS)
        for (; n < N; n++)
            if (clEnqueueNDRangeKernel(cl->q, k, 1, NULL, &one, &one, 0, NULL, &ev[n]) != CL_SUCCESS) break;
    clFinish(cl->q);
    cl_ulong prev_end = 0;
    for (int i = 0; i < n; i++) {
        cl_ulong t0 = 0, t1 = 0;
        clGetEventProfilingInfo(ev[i], CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
        clGetEventProfilingInfo(ev[i], CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
        clReleaseEvent(ev[i]);
        if (i >= 8) { /* after a warm-up */
            cl->floor_ns += (double)(t1 - t0) / (n - 8);
            cl->floor_gap_ns += (double)(t0 - prev_end) / (n - 8);
        }
        prev_end = t1;
    }
    if (buf) clReleaseMemObject(buf);
    clReleaseKernel(k);
}

/* The kernels' compile-time tunables (after any -D), so the host's launch shapes always match them. */
int tllm_cl_ints_of(struct tllm_cl *cl, const char *kernel, cl_int *v, int n) {
    cl_kernel k;
    int rc = tllm_cl_make_kernel(cl, &k, kernel);
    if (rc) return rc;
    cl_int e;
    cl_mem buf = clCreateBuffer(cl->cx, CL_MEM_WRITE_ONLY, sizeof(cl_int) * (size_t)n, NULL, &e);
    size_t one = 1;
    if (e == CL_SUCCESS) e = clSetKernelArg(k, 0, sizeof buf, &buf);
    if (e == CL_SUCCESS) e = clEnqueueNDRangeKernel(cl->q, k, 1, NULL, &one, &one, 0, NULL, NULL);
    if (e == CL_SUCCESS) e = clEnqueueReadBuffer(cl->q, buf, CL_TRUE, 0, sizeof(cl_int) * (size_t)n, v, 0, NULL, NULL);
    if (buf) clReleaseMemObject(buf);
    clReleaseKernel(k);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: reading what %s reports: %s", kernel, tllm_cl_err_name(e));
    return TLLM_OK;
}

int tllm_cl_read_tunables(struct tllm_cl *cl) {
    cl_int v[N_TUNABLES] = {0};
    int rc = tllm_cl_ints_of(cl, "tunables", v, N_TUNABLES);
    if (rc) return rc;
    cl->t = (struct cl_tunables){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
    int pow2 = !(v[0] & (v[0] - 1)) && !(v[4] & (v[4] - 1));
    if (v[0] < 16 || v[4] < 16 || !pow2 || v[1] < 1 || v[2] < 1 || v[3] < 256 || v[5] < 1 || v[7] < 1 || v[8] < 1 || v[9] < 0)
        return tllm_fail(TLLM_ERR_ARG, "TLLM_CL_OPTS: MV_LWS and ATT_LWS must be powers of two >= 16, MV_TAIL >= 0, the rest positive");
    const struct tllm_config *c = &cl->m->cfg;
    if (cl->t.ffn_fused && (c->ffn_dim % 32 || c->dim + 256 > cl->t.mv_local_x))
        return tllm_fail(TLLM_ERR_ARG, "TLLM_CL_OPTS: FUSE_FFN needs an intermediate size that is a multiple of 32 and a "
                                       "hidden size at least 256 below MV_LOCAL_X");
    return TLLM_OK;
}
