/* OpenCL host side of the decode backend. Every call is checked and failures name the call and the
 * OpenCL error; the program's build log goes to stderr when it does not compile. */
#define CL_TARGET_OPENCL_VERSION 120
#include "cl.h"

#include <CL/cl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "generate.h" /* tllm_now */

extern const char tllm_cl_source_decode[]; /* kernels/decode.cl, embedded at build time */

#define CL_MV_LOCAL_X 8192 /* kernels/decode.cl's default MV_LOCAL_X */
#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

struct cl_weights {
    cl_mem w, s, b; /* codes (or dense values), scales, biases: sub-buffers of the arena, or own buffers */
    int rows, cols, bits, gs, dt;
    size_t off[3], len[3]; /* where w, s, b lie in the arena (s and b alias w when dense) */
};

/* A kernel object with its arguments bound once at init; `dyn` is the index of the first argument
 * that changes per step (token id, position, attention split). */
struct cl_launch {
    cl_kernel k;
    cl_uint dyn;
    size_t global[2], local[2];
    int dims, kind; /* kind: index into kind_names, for profiling */
};

enum { K_EMBED, K_QKV, K_ATTN, K_ATTN_OUT, K_GATE_UP, K_DOWN, K_TOKEN, K_LM_HEAD, K_ARGMAX, K_COUNT };
static const char *const kind_names[K_COUNT] = {"embed", "qkv", "attention", "attn_out", "gate_up", "down", "token", "lm_head", "argmax"};

struct cl_layer {
    struct cl_weights wq, wk, wv, wo, gate, up, down;
    struct cl_launch qkv, attn, attn_out, gate_up, down_l;
};

/* Compile-time tunables of kernels/decode.cl, read back from the device with the `tunables` kernel
 * (N_TUNABLES ints, in this order). */
enum { N_TUNABLES = 12 };
struct cl_tunables {
    int mv_lws, mv_iters, mv_groups_per_cu, mv_local_x, att_lws, att_max_split, max_head_dim, persist_groups_per_cu;
    int qrow_n;  /* uint4s of a row one thread keeps in flight (QROW_N) */
    int mv_tail; /* and how many more it may read one after another (MV_TAIL) */
    int ffn_fused; /* `token` runs gate_up and down_proj as one phase (FFN_FUSED) */
    int att_fused; /* ... and attention and o_proj (ATT_FUSED) */
};

struct tllm_cl {
    const struct tllm_model *m;
    char name[256];
    cl_device_id dev;
    cl_context cx;
    cl_command_queue q;
    cl_program prog;
    struct cl_tunables t;
    int n_cu;
    struct cl_weights embed, lm_head;
    struct cl_launch l_embed, l_lm_head, l_argmax;
    struct cl_layer *layers;
    cl_mem vecs;       /* every norm weight and bias (the model's `vectors`) */
    cl_mem inv_freq;   /* [head_dim/2] RoPE frequencies */
    cl_mem x, x2, qb, hb, logits, part, best, next; /* part: [n_heads][ATT_MAX_SPLIT][head_dim + 2] */
    /* All weights in one buffer: the token kernel finds them through `desc` (offsets and formats) */
    cl_mem arena, desc;
    size_t arena_size, arena_align;
    /* Persistent mode: the whole step is one launch (`token`) whose work-groups meet at grid barriers;
     * bar holds the barrier's running count and a flag raised when the groups did not all run at once.
     * act holds each layer's activations apart ([layers + 1] x (2 dim + q_dim + ffn)). */
    int persistent, persist_groups;
    cl_mem bar, act;
    cl_mem by_blocks; /* FFN_FUSED, ATT_FUSED: every layer's o_proj and down_proj again, by blocks of inputs */
    cl_mem done;      /* ATT_FUSED: [layer][head] counts of attention partials left (zero between steps) */
    long bar_count;
    struct cl_launch l_token;
    cl_mem kt, vc;     /* [layers x kv_dim x ctx_stride], [layers x ctx_stride x kv_dim] */
    int n_ctx;
    /* positions a key row holds: n_ctx rounded up to whole 128-byte lines, so no line holds two rows
     * (the caches of the compute units are not coherent: see LINE_PAD in decode.cl) */
    int ctx_stride;
    /* TLLM_CL_PROFILE: per-kernel device times, summed over steps and printed by tllm_cl_free */
    int profile, n_events, prof_steps;
    cl_event *events;
    int *event_kind;
    double prof_ns[K_COUNT], prof_span_ns, prof_wall_s;
    double prof_first_ns[K_COUNT], prof_last_ns[K_COUNT]; /* phases: the first and the last group's arrival */
    double floor_ns, floor_gap_ns; /* a trivial kernel's duration and the gap between two, back to back */
    long prof_count[K_COUNT];
    /* TLLM_CL_PROFILE=host: the host's time per step enqueueing and waiting, no device events */
    int host_times, host_steps;
    /* TLLM_CL_PROFILE=phases (NVIDIA, persistent): the GPU's timer at each grid barrier of `token` */
    int phases;
    cl_mem times;
    cl_ulong *times_host; /* TLLM_CL_PROFILE=phases: the step's `times`, read back (phase_times_len) */
    int int8; /* the matvecs take int8 activations (XQ in decode.cl) */
    double host_enqueue_s, host_wait_s;
    /* greedy steps enqueued and not yet read back (tllm_cl_step_enqueue), oldest at pend_head */
    struct cl_pending {
        cl_int *res; /* read back: the argmax, and whether a grid barrier gave up (in res_host) */
        cl_event ev; /* when res is there (NULL: it already is) */
        int32_t id;  /* the step's token (< 0: the previous step's argmax) */
        int pos;
    } pend[TLLM_CL_AHEAD];
    int pend_head, pend_n;
    /* where the pending steps' results land: pinned memory (a mapped ALLOC_HOST_PTR buffer), so an
     * asynchronous read is a copy the device does on its own (NVIDIA's OpenCL reads into ordinary
     * memory only when the host waits for it); res_own when the mapping fails */
    cl_mem res_buf;
    cl_int *res_host, res_own[2 * TLLM_CL_AHEAD];
    int32_t last_next; /* the latest argmax the host has: what an id < 0 stands for when a step is redone */
};

static const char *cl_err_name(cl_int e) {
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

#define CL_TRY(call)                                                                                            \
    do {                                                                                                        \
        cl_int e_ = (call);                                                                                     \
        if (e_ != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: %s failed: %s (%d)", #call, cl_err_name(e_), e_); \
    } while (0)

/* All devices of all platforms, in listing order. */
static int all_devices(cl_device_id *devs, cl_platform_id *plats_of, int max) {
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
    int n = all_devices(devs, plats, MAX_DEVICES);
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

static int dt_code(enum tllm_dtype d) { return d == TLLM_DT_BF16 ? 2 : d == TLLM_DT_F16 ? 1 : 0; }

/* Every matrix of the model, in the descriptor table's order: embed, lm_head, then q k v o gate up
 * down of each layer. */
static int n_mats(const struct tllm_model *m) { return 2 + 7 * m->cfg.n_layers; }
static const struct tllm_qweights *model_mat(const struct tllm_model *m, int i) {
    if (i < 2) return i ? &m->lm_head : &m->embed;
    const struct tllm_layer *L = &m->layers[(i - 2) / 7];
    const struct tllm_qweights *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return ws[(i - 2) % 7];
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

/* int8_ok: int8 activations may be compiled in (retried without them when they do not fit) */
static int build_program(struct tllm_cl *cl, int int8_ok) {
    /* TLLM_CL_DIR: load kernels/decode.cl from disk (while developing); TLLM_CL_OPTS: extra -D options */
    const char *dir = getenv("TLLM_CL_DIR"), *extra = getenv("TLLM_CL_OPTS");
    char *disk = NULL;
    if (dir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/decode.cl", dir);
        if (!(disk = read_file(path))) return tllm_fail(TLLM_ERR_IO, "%s: cannot read (TLLM_CL_DIR)", path);
    }
    const char *src = disk ? disk : tllm_cl_source_decode;
    cl_int e;
    cl->prog = clCreateProgramWithSource(cl->cx, 1, &src, NULL, &e);
    free(disk);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: clCreateProgramWithSource: %s", cl_err_name(e));
    /* stage no more than the model's longest input (NVIDIA gives a work-group 48 KiB; the int8 form
     * needs room beside the floats), and less on devices with little local memory (32 KiB), unless the
     * options say otherwise */
    cl_ulong local_mem = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local_mem, &local_mem, NULL);
    char opts[768], fit[64] = "", lws[32] = "";
    const struct tllm_config *c = &cl->m->cfg;
    int longest = c->dim > c->ffn_dim ? c->dim : c->ffn_dim, local_x = CL_MV_LOCAL_X;
    longest = c->n_heads * c->head_dim > longest ? c->n_heads * c->head_dim : longest;
    if (longest < local_x) local_x = (longest + 255) / 256 * 256;
    int room = local_mem && local_mem < 48 * 1024 ? (int)((local_mem - 8 * 1024) / 4 / 256 * 256) : local_x;
    if (room < local_x) local_x = room;
    if (local_x != CL_MV_LOCAL_X && !(extra && strstr(extra, "MV_LOCAL_X")))
        snprintf(fit, sizeof fit, "-DMV_LOCAL_X=%d", local_x);
    /* CPU devices get 64-thread matvec groups: PoCL 3.1 (Debian 12, what CI runs) miscompiles the matvec kernels
     * at 128 and 256 (a vectorized store with a wild trip count; correct with -cl-opt-disable) */
    cl_device_type type = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if ((type & CL_DEVICE_TYPE_CPU) && !(extra && strstr(extra, "MV_LWS"))) snprintf(lws, sizeof lws, "-DMV_LWS=64");
    /* one format for every matrix (the usual mlx-lm checkpoint): compile it in (Q_FIX in decode.cl) */
    int fmt[3] = {-1, -1, -1}, uniform = 1;
    for (int i = 0; i < n_mats(cl->m) && uniform; i++) {
        const struct tllm_qweights *w = model_mat(cl->m, i);
        int dense = w->format == TLLM_WF_DENSE, f[3] = {dense ? 0 : w->bits, dense ? 1 : w->group_size, dt_code(w->dtype)};
        if (i == 0) memcpy(fmt, f, sizeof f);
        uniform = !memcmp(fmt, f, sizeof f);
    }
    /* and the head size, so attention's loops and branches fold (H200: the `token` kernel's attention
     * then has one form, not three, and the other phases run faster for the smaller program) */
    char fixed[96] = "";
    int n_fixed = extra && strstr(extra, "HEAD_DIM") ? 0 : snprintf(fixed, sizeof fixed, "-DHEAD_DIM=%d", c->head_dim);
    if (uniform) snprintf(fixed + n_fixed, sizeof fixed - (size_t)n_fixed, " -DQ_BITS=%d -DQ_GS=%d -DQ_DT=%d", fmt[0], fmt[1], fmt[2]);
    /* int8 activations (XQ in decode.cl) where the CPU path takes them too (a packed model, i.e. not
     * --exact), for 4-bit models whose inputs split into blocks of 32. NVIDIA gets dp4a and warp
     * shuffles through inline PTX (its OpenCL has neither the integer dot product extension nor subgroups) */
    int xq = int8_ok && uniform && fmt[0] == 4 && model_mat(cl->m, 2)->pack && c->dim % 32 == 0 && c->ffn_dim % 32 == 0 &&
             (c->n_heads * c->head_dim) % 32 == 0 && !(extra && strstr(extra, "Q_INT8"));
    cl->int8 = xq || (extra && strstr(extra, "Q_INT8=1") && uniform && fmt[0] == 4);
    int nvidia = strstr(cl->name, "(NVIDIA CUDA)") != NULL; /* the platform, so inline PTX compiles */
    /* and `token` fuses gate_up with down_proj, attention with o_proj (PTX's float atomic add;
     * FFN_FUSED, ATT_FUSED in decode.cl) */
    int fuse_ffn = nvidia && xq && c->ffn_dim % 32 == 0 && c->dim + 256 <= local_x && !(extra && strstr(extra, "FUSE_FFN"));
    int fuse_att = nvidia && xq && !(extra && strstr(extra, "FUSE_ATT")); /* the kernel checks the head size */
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 %s %s %s %s %s %s %s %s %s", fit, lws, fixed, xq ? "-DQ_INT8=1" : "",
             nvidia ? "-DDP4A_PTX -DSHFL_PTX" : "", fuse_ffn ? "-DFUSE_FFN=1" : "", fuse_att ? "-DFUSE_ATT=1" : "",
             cl->phases ? "-DPHASE_TIMES" : "", extra ? extra : "");
    e = clBuildProgram(cl->prog, 1, &cl->dev, opts, NULL, NULL);
    if (e != CL_SUCCESS) {
        print_build_log(cl);
        return tllm_fail(TLLM_ERR_IO, "opencl: kernels/decode.cl does not build on %s: %s (log above)", cl->name,
                         cl_err_name(e));
    }
    if (xq && local_mem && program_local_mem(cl) > local_mem) { /* the int8 form does not fit: float inputs */
        clReleaseProgram(cl->prog);
        cl->prog = NULL;
        return build_program(cl, 0);
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

static int make_kernel(struct tllm_cl *cl, cl_kernel *k, const char *name) {
    cl_int e;
    *k = clCreateKernel(cl->prog, name, &e);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: kernel %s: %s", name, cl_err_name(e));
    return TLLM_OK;
}

/* For the profile: what a kernel that does nothing costs on this device, and the gap between two. */
static void measure_floor(struct tllm_cl *cl) {
    enum { N = 64 };
    cl_kernel k;
    if (make_kernel(cl, &k, "tunables")) return;
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
static int read_tunables(struct tllm_cl *cl) {
    cl_kernel k;
    int rc = make_kernel(cl, &k, "tunables");
    if (rc) return rc;
    cl_int e;
    cl_mem buf = clCreateBuffer(cl->cx, CL_MEM_WRITE_ONLY, sizeof(cl_int) * N_TUNABLES, NULL, &e);
    cl_int v[N_TUNABLES] = {0};
    size_t one = 1;
    if (e == CL_SUCCESS) e = clSetKernelArg(k, 0, sizeof buf, &buf);
    if (e == CL_SUCCESS) e = clEnqueueNDRangeKernel(cl->q, k, 1, NULL, &one, &one, 0, NULL, NULL);
    if (e == CL_SUCCESS) e = clEnqueueReadBuffer(cl->q, buf, CL_TRUE, 0, sizeof v, v, 0, NULL, NULL);
    if (buf) clReleaseMemObject(buf);
    clReleaseKernel(k);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: reading the kernels' tunables: %s", cl_err_name(e));
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


static int upload(struct tllm_cl *cl, cl_mem *out, const void *p, size_t n, const char *what) {
    cl_int e;
    *out = clCreateBuffer(cl->cx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n ? n : 4, (void *)p, &e);
    if (e != CL_SUCCESS)
        return tllm_fail(TLLM_ERR_NOMEM, "opencl: uploading %s (%zu bytes) to %s: %s", what, n, cl->name, cl_err_name(e));
    return TLLM_OK;
}

/* The 16-byte row check, format and shape of w; its pieces placed in the arena (tied matrices share). */
static int plan_weights(struct tllm_cl *cl, const struct tllm_qweights *w, struct cl_weights *cw, const struct tllm_qweights *same,
                        const struct cl_weights *same_cw) {
    cw->rows = w->rows, cw->cols = w->cols, cw->dt = dt_code(w->dtype);
    if (w->format == TLLM_WF_DENSE) {
        cw->bits = 0, cw->gs = 0;
        cw->len[0] = (size_t)w->rows * w->cols * tllm_dtype_size(w->dtype), cw->len[1] = cw->len[2] = 4;
    } else {
        if ((size_t)w->cols * (size_t)w->bits % 128) /* the kernels read rows 16 bytes at a time */
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: %s: rows of %d %d-bit codes are not a whole number of 16 bytes",
                             w->name, w->cols, w->bits);
        cw->bits = w->bits, cw->gs = w->group_size;
        size_t ng = (size_t)w->rows * (size_t)(w->cols / w->group_size);
        cw->len[0] = (size_t)w->rows * w->cols / 8 * w->bits;
        cw->len[1] = cw->len[2] = ng * tllm_dtype_size(w->dtype);
    }
    if (same && same->w == w->w && same->scales == w->scales && same->biases == w->biases) { /* tied: one copy */
        memcpy(cw->off, same_cw->off, sizeof cw->off);
        return TLLM_OK;
    }
    for (int i = 0; i < 3; i++) {
        if (w->format == TLLM_WF_DENSE && i) {
            cw->off[i] = cw->off[0];
            continue;
        }
        cw->off[i] = (cl->arena_size + cl->arena_align - 1) / cl->arena_align * cl->arena_align;
        cl->arena_size = cw->off[i] + cw->len[i];
    }
    return TLLM_OK;
}

static int arena_write(struct tllm_cl *cl, const struct tllm_qweights *w, const struct cl_weights *cw) {
    const void *src[3] = {w->w, w->scales, w->biases};
    for (int i = 0; i < (cw->bits ? 3 : 1); i++) {
        cl_int e = clEnqueueWriteBuffer(cl->q, cl->arena, CL_FALSE, cw->off[i], cw->len[i], src[i], 0, NULL, NULL);
        if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: uploading %s to %s: %s", w->name, cl->name, cl_err_name(e));
    }
    return TLLM_OK;
}

/* The kernels' view of cw: sub-buffers of the arena, or (no arena) buffers of their own. */
static int weight_buffers(struct tllm_cl *cl, const struct tllm_qweights *w, struct cl_weights *cw) {
    if (!cl->arena) {
        int rc = upload(cl, &cw->w, w->w, cw->len[0], w->name);
        if (!rc) rc = upload(cl, &cw->s, cw->bits ? w->scales : w->w, cw->len[1], w->name); /* dense: placeholders */
        if (!rc) rc = upload(cl, &cw->b, cw->bits ? w->biases : w->w, cw->len[2], w->name);
        return rc;
    }
    cl_mem *out[3] = {&cw->w, &cw->s, &cw->b};
    for (int i = 0; i < 3; i++) {
        cl_buffer_region r = {cw->off[i], cw->len[i]};
        cl_int e;
        *out[i] = clCreateSubBuffer(cl->arena, CL_MEM_READ_ONLY, CL_BUFFER_CREATE_TYPE_REGION, &r, &e);
        if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: a view of %s on %s: %s", w->name, cl->name, cl_err_name(e));
    }
    return TLLM_OK;
}

/* Matrix i of the model, and its device copy, in the descriptor table's order. */
static void mat(struct tllm_cl *cl, int i, const struct tllm_qweights **w, struct cl_weights **cw) {
    *w = model_mat(cl->m, i);
    if (i < 2) {
        *cw = i ? &cl->lm_head : &cl->embed;
        return;
    }
    struct cl_layer *D = &cl->layers[(i - 2) / 7];
    struct cl_weights *cws[7] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->gate, &D->up, &D->down};
    *cw = cws[(i - 2) % 7];
}

/* Uploads every weight once: into one arena buffer where the device allows a buffer that large (and
 * offsets fit the table's 16-byte units), else one buffer per piece (no persistent kernel then). */
static int upload_all_weights(struct tllm_cl *cl) {
    cl_uint align_bits = 0;
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    clGetDeviceInfo(cl->dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    cl->arena_align = align_bits / 8 > 16 ? align_bits / 8 : 16; /* sub-buffers must start on this */
    int n = n_mats(cl->m);
    for (int i = 0; i < n; i++) {
        const struct tllm_qweights *w;
        struct cl_weights *cw;
        mat(cl, i, &w, &cw);
        int rc = plan_weights(cl, w, cw, i == 1 ? &cl->m->embed : NULL, &cl->embed);
        if (rc) return rc;
    }
    if (cl->arena_size <= max_alloc && cl->arena_size / 16 < 0x7fffffff) {
        cl_int e;
        cl->arena = clCreateBuffer(cl->cx, CL_MEM_READ_ONLY, cl->arena_size, NULL, &e);
        if (e != CL_SUCCESS) cl->arena = NULL; /* too large at once after all: a buffer per piece */
    }
    for (int i = 0; i < n; i++) {
        const struct tllm_qweights *w;
        struct cl_weights *cw;
        mat(cl, i, &w, &cw);
        int rc = cl->arena ? arena_write(cl, w, cw) : TLLM_OK;
        if (!rc) rc = weight_buffers(cl, w, cw);
        if (rc) return rc;
    }
    CL_TRY(clFinish(cl->q)); /* the writes read the model's mapped memory */
    return TLLM_OK;
}

static void release_weights(struct cl_weights *cw) {
    if (cw->w) clReleaseMemObject(cw->w);
    if (cw->s) clReleaseMemObject(cw->s);
    if (cw->b) clReleaseMemObject(cw->b);
}

static int device_buffer(struct tllm_cl *cl, cl_mem *out, size_t n, const char *what) {
    cl_int e;
    *out = clCreateBuffer(cl->cx, CL_MEM_READ_WRITE, n, NULL, &e);
    if (e != CL_SUCCESS)
        return tllm_fail(TLLM_ERR_NOMEM, "opencl: %s (%zu bytes) on %s: %s", what, n, cl->name, cl_err_name(e));
    return TLLM_OK;
}

/* Kernel arguments in order; a weight takes 6 (W, S, B, bits, gs, dt). */
struct args {
    cl_kernel k;
    cl_uint i;
    cl_int err;
};
static void arg(struct args *a, size_t size, const void *v) {
    cl_int e = clSetKernelArg(a->k, a->i++, size, v);
    if (e != CL_SUCCESS && a->err == CL_SUCCESS) a->err = e;
}
#define ARG_MEM(a, m) arg(a, sizeof(cl_mem), &(m))
#define ARG_INT(a, v) do { cl_int v_ = (v); arg(a, sizeof v_, &v_); } while (0)
#define ARG_F32(a, v) do { cl_float v_ = (v); arg(a, sizeof v_, &v_); } while (0)
static void arg_weights(struct args *a, const struct cl_weights *w) {
    ARG_MEM(a, w->w);
    ARG_MEM(a, w->s);
    ARG_MEM(a, w->b);
    ARG_INT(a, w->bits);
    ARG_INT(a, w->gs);
    ARG_INT(a, w->dt);
}

/* Sweeps that `groups` work-groups of MV_LWS threads take over `rows` row slots of tpr threads */
static size_t sweeps(const struct tllm_cl *cl, int rows, int tpr, size_t groups) {
    size_t rpg = (size_t)(cl->t.mv_lws / tpr), slots = ((size_t)rows + rpg - 1) / rpg;
    return (slots + groups - 1) / groups;
}

/* Threads per row of a matvec over w (a power of two): enough that each reads about MV_ITERS uint4,
 * or fewer (down to QROW_N + MV_TAIL uint4 each) where that lets `groups` work-groups cover the
 * `rows` row slots in fewer sweeps: a phase takes as long as its slowest group, so one sweep too
 * many is a second round of memory latency (H200, 132 groups: gate_up's 4864 rows of 16 threads are
 * 304 slots, of 8 threads 152; down_proj's 896 rows of 64 threads 224 slots, of 32 threads 112). */
static int pick_tpr(const struct tllm_cl *cl, const struct cl_weights *w, int rows, size_t groups) {
    int units = w->bits ? w->cols * w->bits / 128 : (w->cols + 3) / 4;
    int want = (units + cl->t.mv_iters - 1) / cl->t.mv_iters, tpr = 1;
    while (tpr < want && tpr < cl->t.mv_lws) tpr <<= 1;
    while (w->bits && tpr > 1 && (units + tpr / 2 - 1) / (tpr / 2) <= cl->t.qrow_n + cl->t.mv_tail &&
           sweeps(cl, rows, tpr / 2, groups) < sweeps(cl, rows, tpr, groups))
        tpr >>= 1;
    return tpr;
}

/* The row slots of qkv: each computes a RoPE pair of rows of one head of [q | k | v] */
static int qkv_slots(const struct tllm_config *c) { return (c->n_heads + 2 * c->n_kv_heads) * (c->head_dim / 2); }

/* The groups of a per-kernel matvec launch at most (shape_rows) */
static size_t max_groups(const struct tllm_cl *cl) { return (size_t)cl->n_cu * (size_t)cl->t.mv_groups_per_cu; }

/* A 1-D matvec launch over `rows` row slots of tpr threads, capped at MV_GROUPS_PER_CU per compute
 * unit (the kernels loop over the rest). */
static void shape_rows(const struct tllm_cl *cl, struct cl_launch *L, int rows, int tpr, int kind) {
    size_t rpg = (size_t)(cl->t.mv_lws / tpr), groups = ((size_t)rows + rpg - 1) / rpg, cap = max_groups(cl);
    if (groups > cap) groups = cap;
    L->dims = 1, L->kind = kind;
    L->local[0] = (size_t)cl->t.mv_lws;
    L->global[0] = groups * L->local[0];
}

/* Starts binding the arguments of L's kernel (made here, once). */
static int begin(struct tllm_cl *cl, struct cl_launch *L, const char *name, struct args *a) {
    int rc = make_kernel(cl, &L->k, name);
    *a = (struct args){L->k, 0, CL_SUCCESS};
    return rc;
}
static int end(struct args *a, const char *name) {
    if (a->err != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: arguments of %s: %s", name, cl_err_name(a->err));
    return TLLM_OK;
}

static int bind_matvec(struct tllm_cl *cl, struct cl_launch *L, const struct cl_weights *w, cl_mem x, int norm_off,
                       cl_mem y, cl_mem res, int add, int track, int kind) {
    struct args a;
    int rc = begin(cl, L, "matvec", &a), tpr = pick_tpr(cl, w, w->rows, max_groups(cl));
    if (rc) return rc;
    arg_weights(&a, w);
    ARG_INT(&a, w->rows);
    ARG_INT(&a, w->cols);
    ARG_INT(&a, tpr);
    ARG_MEM(&a, x);
    ARG_MEM(&a, cl->vecs);
    ARG_INT(&a, norm_off);
    ARG_F32(&a, cl->m->cfg.norm_eps);
    ARG_MEM(&a, y);
    ARG_MEM(&a, res);
    ARG_INT(&a, add);
    ARG_MEM(&a, cl->best);
    ARG_INT(&a, track);
    shape_rows(cl, L, w->rows, tpr, kind);
    return end(&a, "matvec");
}

/* The arguments of the qkv kernel before the position (QKV_ARGS in decode.cl). */
static void qkv_args(struct tllm_cl *cl, struct args *a, int l, int tpr) {
    const struct tllm_model *m = cl->m;
    const struct tllm_config *c = &m->cfg;
    const struct tllm_layer *Lm = &m->layers[l];
    struct cl_layer *D = &cl->layers[l];
    arg_weights(a, &D->wq);
    arg_weights(a, &D->wk);
    arg_weights(a, &D->wv);
    ARG_INT(a, c->n_heads);
    ARG_INT(a, c->n_kv_heads);
    ARG_INT(a, c->head_dim);
    ARG_INT(a, c->dim);
    ARG_INT(a, tpr);
    ARG_MEM(a, cl->x);
    ARG_MEM(a, cl->vecs);
    ARG_INT(a, (int)(Lm->attn_norm - m->vectors));
    ARG_INT(a, (int)(Lm->bq - m->vectors));
    ARG_INT(a, (int)(Lm->bk - m->vectors));
    ARG_INT(a, (int)(Lm->bv - m->vectors));
    ARG_F32(a, c->norm_eps);
    ARG_MEM(a, cl->inv_freq);
    ARG_INT(a, cl->ctx_stride);
    ARG_MEM(a, cl->qb);
    ARG_MEM(a, cl->kt);
    ARG_MEM(a, cl->vc);
    ARG_INT(a, l);
}

/* The whole-step kernel: buffers and shapes bound once; the barrier count, token, position and
 * attention split per step. */
static int bind_token(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    const struct tllm_config *c = &m->cfg;
    struct args a;
    int rc = begin(cl, &cl->l_token, "token", &a);
    if (rc) return rc;
    cl_mem unused = cl->bar; /* in place of the fused phases' buffers when there are none */
    cl_mem bufs[] = {cl->arena,  cl->desc, cl->vecs, cl->inv_freq, cl->act, cl->part, cl->kt, cl->vc, cl->logits, cl->best,
                     cl->next,   cl->bar,  cl->by_blocks ? cl->by_blocks : unused, cl->done ? cl->done : unused};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ARG_MEM(&a, bufs[i]);
    int ints[] = {c->n_layers, c->dim, c->ffn_dim, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, cl->ctx_stride,
                  (int)(m->final_norm - m->vectors)};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) ARG_INT(&a, ints[i]);
    ARG_F32(&a, c->norm_eps);
    ARG_MEM(&a, cl->times);
    cl->l_token.dyn = a.i;
    for (int i = 0; i < 5; i++) ARG_INT(&a, 0); /* bar_base, id, pos, span, n_split */
    cl->l_token.dims = 1, cl->l_token.kind = K_TOKEN;
    cl->l_token.local[0] = (size_t)cl->t.mv_lws;
    cl->l_token.global[0] = (size_t)cl->persist_groups * cl->l_token.local[0];
    return end(&a, "token");
}

/* Every kernel of a step, made once with its static arguments. */
static int bind_all(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    const struct tllm_config *c = &m->cfg;
    struct args a;
    int rc = begin(cl, &cl->l_embed, "embed", &a);
    if (rc) return rc;
    arg_weights(&a, &cl->embed);
    ARG_INT(&a, c->dim);
    ARG_MEM(&a, cl->x);
    ARG_MEM(&a, cl->next);
    ARG_INT(&a, c->vocab_size);
    cl->l_embed.dyn = a.i;
    cl->l_embed.dims = 1, cl->l_embed.kind = K_EMBED, cl->l_embed.local[0] = 64;
    cl->l_embed.global[0] = ((size_t)c->dim + 63) / 64 * 64;
    if ((rc = end(&a, "embed"))) return rc;
    int tpr_qkv = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const struct tllm_layer *Lm = &m->layers[l];
        struct cl_layer *D = &cl->layers[l];
        int ffn_norm = (int)(Lm->ffn_norm - m->vectors);
        if ((rc = begin(cl, &D->qkv, "qkv", &a))) return rc;
        tpr_qkv = pick_tpr(cl, &D->wq, qkv_slots(c), max_groups(cl));
        qkv_args(cl, &a, l, tpr_qkv);
        D->qkv.dyn = a.i;
        ARG_INT(&a, 0); /* pos */
        shape_rows(cl, &D->qkv, qkv_slots(c), tpr_qkv, K_QKV);
        if ((rc = end(&a, "qkv"))) return rc;

        if ((rc = begin(cl, &D->attn, "attention", &a))) return rc;
        ARG_MEM(&a, cl->qb);
        ARG_MEM(&a, cl->kt);
        ARG_MEM(&a, cl->vc);
        ARG_MEM(&a, cl->part);
        ARG_INT(&a, cl->ctx_stride);
        ARG_INT(&a, c->head_dim);
        ARG_INT(&a, c->n_heads);
        ARG_INT(&a, c->n_kv_heads);
        ARG_INT(&a, l);
        D->attn.dyn = a.i;
        ARG_INT(&a, 0); /* pos */
        ARG_INT(&a, 1); /* span */
        D->attn.dims = 2, D->attn.kind = K_ATTN;
        D->attn.local[0] = (size_t)cl->t.att_lws, D->attn.local[1] = 1;
        D->attn.global[1] = (size_t)c->n_heads; /* global[0] is set per step */
        if ((rc = end(&a, "attention"))) return rc;

        if ((rc = begin(cl, &D->attn_out, "attn_out", &a))) return rc;
        int tpr = pick_tpr(cl, &D->wo, D->wo.rows, max_groups(cl));
        arg_weights(&a, &D->wo);
        ARG_INT(&a, D->wo.rows);
        ARG_INT(&a, D->wo.cols);
        ARG_INT(&a, tpr);
        ARG_MEM(&a, cl->part);
        ARG_INT(&a, c->head_dim);
        ARG_MEM(&a, cl->x);
        ARG_MEM(&a, cl->x2);
        D->attn_out.dyn = a.i;
        ARG_INT(&a, 1); /* n_split */
        shape_rows(cl, &D->attn_out, D->wo.rows, tpr, K_ATTN_OUT);
        if ((rc = end(&a, "attn_out"))) return rc;

        if ((rc = begin(cl, &D->gate_up, "gate_up", &a))) return rc;
        tpr = pick_tpr(cl, &D->gate, c->ffn_dim, max_groups(cl));
        arg_weights(&a, &D->gate);
        arg_weights(&a, &D->up);
        ARG_INT(&a, c->ffn_dim);
        ARG_INT(&a, c->dim);
        ARG_INT(&a, tpr);
        ARG_MEM(&a, cl->x2);
        ARG_MEM(&a, cl->vecs);
        ARG_INT(&a, ffn_norm);
        ARG_F32(&a, c->norm_eps);
        ARG_MEM(&a, cl->hb);
        shape_rows(cl, &D->gate_up, c->ffn_dim, tpr, K_GATE_UP);
        if ((rc = end(&a, "gate_up"))) return rc;

        if ((rc = bind_matvec(cl, &D->down_l, &D->down, cl->hb, -1, cl->x, cl->x2, 1, 0, K_DOWN))) return rc;

    }
    if (cl->persistent && (rc = bind_token(cl))) return rc;
    if ((rc = bind_matvec(cl, &cl->l_lm_head, &cl->lm_head, cl->x, (int)(m->final_norm - m->vectors), cl->logits,
                          cl->logits, 0, 1, K_LM_HEAD)))
        return rc;
    if ((rc = begin(cl, &cl->l_argmax, "argmax", &a))) return rc;
    ARG_MEM(&a, cl->best);
    ARG_INT(&a, (int)(cl->l_lm_head.global[0] / cl->l_lm_head.local[0])); /* the lm_head's groups */
    ARG_MEM(&a, cl->next);
    ARG_MEM(&a, cl->bar);
    cl->l_argmax.dims = 1, cl->l_argmax.kind = K_ARGMAX;
    cl->l_argmax.global[0] = cl->l_argmax.local[0] = (size_t)cl->t.mv_lws;
    return end(&a, "argmax");
}

/* What the kernels assume of the shapes (rows of codes are checked as they are uploaded); a model
 * outside them runs on the CPU. */
static int check_shapes(const struct tllm_cl *cl) {
    const struct tllm_config *c = &cl->m->cfg;
    if (c->head_dim > cl->t.max_head_dim || c->head_dim % 4 || c->n_heads % c->n_kv_heads || cl->t.att_lws < c->head_dim / 4)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: head_dim %d is not supported by the decode kernels (a multiple of 4, at most %d)",
                         c->head_dim, cl->t.max_head_dim);
    if (c->dim > cl->t.mv_local_x || c->n_heads * c->head_dim > cl->t.mv_local_x)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: hidden size %d is above the decode kernels' %d (MV_LOCAL_X)", c->dim,
                         cl->t.mv_local_x);
    return TLLM_OK;
}

/* The grid barrier's running count and flag back to zero. */
static cl_int clear_bar(struct tllm_cl *cl) {
    cl_int zero = 0;
    cl->bar_count = 0;
    return clEnqueueFillBuffer(cl->q, cl->bar, &zero, sizeof zero, 0, 2 * sizeof zero, 0, NULL, NULL);
}
static int reset_bar(struct tllm_cl *cl) {
    CL_TRY(clear_bar(cl));
    return TLLM_OK;
}

/* Persistent mode runs a step as one `token` launch and needs every work-group of its grid resident
 * at once, which OpenCL does not promise: the grid is PERSIST_GROUPS_PER_CU groups per compute unit
 * where the kernel's registers allow, and the mode is abandoned for good if a grid barrier ever times
 * out. On by default on GPUs (TLLM_CL_PERSISTENT=0 turns it off): NVIDIA's OpenCL spends 5-11 us of
 * host time on every launch, so 123 launches a token cost more than the GPU's work. Never on CPU
 * devices: they run work-groups a few at a time, and PoCL 3.1 takes many minutes to compile the
 * kernel. Needs the weight arena. */
static void pick_persistent(struct tllm_cl *cl) {
    const char *env = getenv("TLLM_CL_PERSISTENT");
    cl_device_type type = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    int want = (type & CL_DEVICE_TYPE_GPU) && !(env && !strcmp(env, "0"));
    cl->persistent = 0;
    if (!want || !cl->arena || cl->t.att_lws != cl->t.mv_lws) return;
    cl_int e;
    cl_kernel k = clCreateKernel(cl->prog, "token", &e);
    if (e != CL_SUCCESS) return;
    size_t max_wg = 0;
    clGetKernelWorkGroupInfo(k, cl->dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, NULL);
    clReleaseKernel(k);
    int per_cu = (int)(max_wg / (size_t)cl->t.mv_lws);
    if (per_cu < 1) return;
    if (per_cu > cl->t.persist_groups_per_cu) per_cu = cl->t.persist_groups_per_cu;
    cl->persist_groups = cl->n_cu * per_cu;
    cl->persistent = 1;
}

/* n floats rounded up to whole 128-byte lines, as `token` lays out its per-layer regions (LINE_PAD) */
static size_t line_pad(size_t n) { return (n + 31) & ~(size_t)31; }

/* Entries of the `times` buffer of TLLM_CL_PROFILE=phases (see PHASE_MARK in decode.cl): when group 0
 * passes each grid barrier, and when each group arrives at it. */
static size_t phase_times_len(const struct tllm_cl *cl) {
    return (4 + 5 * (size_t)cl->m->cfg.n_layers) * (1 + (size_t)cl->persist_groups);
}

/* FFN_FUSED, ATT_FUSED: every layer's o_proj and down_proj again, as blocks_times in decode.cl reads
 * them (BT_BYTES there): for each block of 32 inputs, every row's 16 bytes of codes, then the scales
 * [group][row] and the biases, so the blocks a work-group multiplies are contiguous. (The arena keeps
 * the row-major copies for the one-kernel-per-step path.) */
static size_t bt_bytes(const struct tllm_qweights *w) {
    size_t es = tllm_dtype_size(w->dtype);
    return ((size_t)w->rows * w->cols / 2 + 2 * (size_t)w->rows * (size_t)(w->cols / w->group_size) * es + 127) & ~(size_t)127;
}

/* w (4-bit, the format of every matrix: the host checked) in that layout, into t */
static void by_blocks(const struct tllm_qweights *w, unsigned char *t) {
    size_t es = tllm_dtype_size(w->dtype), rows = (size_t)w->rows, nb = (size_t)w->cols / 32;
    size_t ng = (size_t)(w->cols / w->group_size), cb = rows * nb * 16, gb = rows * ng * es;
    const unsigned char *q = w->w, *s = w->scales, *b = w->biases;
    for (size_t r = 0; r < rows; r++) {
        for (size_t k = 0; k < nb; k++) memcpy(t + (k * rows + r) * 16, q + (r * nb + k) * 16, 16);
        for (size_t g = 0; g < ng; g++) {
            memcpy(t + cb + (g * rows + r) * es, s + (r * ng + g) * es, es);
            memcpy(t + cb + gb + (g * rows + r) * es, b + (r * ng + g) * es, es);
        }
    }
}

static int upload_by_blocks(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    size_t o_bytes = bt_bytes(&m->layers[0].wo), per = o_bytes + bt_bytes(&m->layers[0].w_down);
    int rc = device_buffer(cl, &cl->by_blocks, per * (size_t)m->cfg.n_layers, "o_proj and down_proj by blocks");
    unsigned char *t = rc ? NULL : calloc(1, per);
    if (!rc && !t) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < m->cfg.n_layers && !rc; l++) {
        by_blocks(&m->layers[l].wo, t);
        by_blocks(&m->layers[l].w_down, t + o_bytes);
        cl_int e = clEnqueueWriteBuffer(cl->q, cl->by_blocks, CL_TRUE, per * (size_t)l, per, t, 0, NULL, NULL);
        if (e != CL_SUCCESS) rc = tllm_fail(TLLM_ERR_IO, "opencl: uploading o_proj and down_proj by blocks to %s: %s", cl->name, cl_err_name(e));
    }
    free(t);
    return rc;
}

/* The token kernel's descriptor table (see decode.cl) and its per-layer activations. */
static int token_buffers(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    const struct tllm_config *c = &m->cfg;
    int n = n_mats(m);
    size_t n_desc = 8 * ((size_t)n + (size_t)c->n_layers);
    cl_int *d = calloc(n_desc, sizeof *d);
    if (!d) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const struct tllm_qweights *w;
        struct cl_weights *cw;
        mat(cl, i, &w, &cw);
        cl_int *e = d + 8 * i;
        for (int j = 0; j < 3; j++) e[j] = (cl_int)(cw->off[j] / 16);
        int slots = i >= 2 && (i - 2) % 7 < 3 ? qkv_slots(c) : cw->rows; /* q, k, v: qkv's row pairs */
        e[3] = cw->bits, e[4] = cw->gs, e[5] = cw->dt, e[6] = pick_tpr(cl, cw, slots, (size_t)cl->persist_groups);
        if (cl->t.ffn_fused && i >= 2 && ((i - 2) % 7 == 4 || (i - 2) % 7 == 5))
            e[6] = cl->t.mv_lws / 32; /* gate, up: a group's rows of a sweep are one block of down_proj's inputs */
    }
    for (int l = 0; l < c->n_layers; l++) {
        const struct tllm_layer *L = &m->layers[l];
        cl_int *e = d + 8 * ((size_t)n + l);
        e[0] = (cl_int)(L->attn_norm - m->vectors), e[1] = (cl_int)(L->bq - m->vectors);
        e[2] = (cl_int)(L->bk - m->vectors), e[3] = (cl_int)(L->bv - m->vectors), e[4] = (cl_int)(L->ffn_norm - m->vectors);
    }
    int rc = upload(cl, &cl->desc, d, n_desc * sizeof *d, "weight table");
    free(d);
    size_t per_layer = 2 * line_pad((size_t)c->dim) + line_pad((size_t)c->n_heads * c->head_dim) + line_pad((size_t)c->ffn_dim);
    if (!rc) rc = device_buffer(cl, &cl->act, ((size_t)c->n_layers + 1) * per_layer * 4, "activations");
    if (!rc && (cl->t.ffn_fused || cl->t.att_fused)) {
        /* the fused phases' outputs are sums that start from zero (the token kernel zeroes them after use) */
        cl_int zero = 0;
        cl_int e = clEnqueueFillBuffer(cl->q, cl->act, &zero, sizeof zero, 0, ((size_t)c->n_layers + 1) * per_layer * 4, 0, NULL, NULL);
        if (e != CL_SUCCESS) rc = tllm_fail(TLLM_ERR_IO, "opencl: clearing the activations: %s", cl_err_name(e));
        size_t n_done = (size_t)c->n_layers * (size_t)c->n_heads * sizeof zero;
        if (!rc) rc = device_buffer(cl, &cl->done, n_done, "attention counts");
        if (!rc && (e = clEnqueueFillBuffer(cl->q, cl->done, &zero, sizeof zero, 0, n_done, 0, NULL, NULL)) != CL_SUCCESS)
            rc = tllm_fail(TLLM_ERR_IO, "opencl: clearing the attention counts: %s", cl_err_name(e));
        if (!rc) rc = upload_by_blocks(cl);
    }
    if (!rc) rc = device_buffer(cl, &cl->times, phase_times_len(cl) * sizeof(cl_ulong), "phase times");
    if (!rc && cl->phases && !(cl->times_host = malloc(phase_times_len(cl) * sizeof *cl->times_host)))
        rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    return rc;
}

/* res_host: pinned where the platform gives it, else res_own (slower, still right) */
static void pin_results(struct tllm_cl *cl) {
    cl_int e;
    size_t n = sizeof cl->res_own;
    cl->res_host = cl->res_own;
    cl->res_buf = clCreateBuffer(cl->cx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, n, NULL, &e);
    if (e != CL_SUCCESS) {
        cl->res_buf = NULL;
        return;
    }
    void *h = clEnqueueMapBuffer(cl->q, cl->res_buf, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0, NULL, NULL, &e);
    if (e == CL_SUCCESS && h) cl->res_host = h;
}

int tllm_cl_init(struct tllm_cl **out, const struct tllm_model *m, int n_ctx, int index) {
    *out = NULL;
    if (n_ctx < 1 || n_ctx > (1 << 24)) return tllm_fail(TLLM_ERR_ARG, "opencl: context of %d positions (1 to 16777216)", n_ctx);
    cl_device_id devs[MAX_DEVICES];
    cl_platform_id plats[MAX_DEVICES];
    int n = all_devices(devs, plats, MAX_DEVICES), pick = -1;
    if (n == 0) return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: no OpenCL platform or device found (is an ICD installed?)");
    if (index >= 0) {
        if (index >= n) return tllm_fail(TLLM_ERR_ARG, "opencl:%d: there are %d OpenCL devices (tllm devices lists them)", index, n);
        pick = index;
    } else {
        for (int i = 0; i < n && pick < 0; i++) {
            cl_device_type t = 0;
            clGetDeviceInfo(devs[i], CL_DEVICE_TYPE, sizeof t, &t, NULL);
            if (t & CL_DEVICE_TYPE_GPU) pick = i;
        }
        if (pick < 0 && index == -2) return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: no GPU among %d OpenCL devices", n);
        if (pick < 0) pick = 0;
    }
    const struct tllm_config *c = &m->cfg;
    struct tllm_cl *cl = calloc(1, sizeof *cl);
    if (!cl) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    cl->m = m;
    cl->dev = devs[pick];
    cl->n_ctx = n_ctx;
    cl->ctx_stride = (int)line_pad((size_t)n_ctx);
    char dname[128] = "", pname[128] = "";
    clGetDeviceInfo(cl->dev, CL_DEVICE_NAME, sizeof dname, dname, NULL);
    clGetPlatformInfo(plats[pick], CL_PLATFORM_NAME, sizeof pname, pname, NULL);
    snprintf(cl->name, sizeof cl->name, "%s (%s)", dname, pname);
    cl_uint cus = 1;
    clGetDeviceInfo(cl->dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL);
    cl->n_cu = cus ? (int)cus : 1;
    const char *prof = getenv("TLLM_CL_PROFILE");
    cl->host_times = prof && !strcmp(prof, "host");
    cl->phases = prof && !strcmp(prof, "phases");
    cl->profile = prof && *prof && strcmp(prof, "0") && !cl->host_times && !cl->phases;
    *out = cl; /* from here on, tllm_cl_free releases what was made */
    cl_int e;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plats[pick], 0};
    cl->cx = clCreateContext(props, 1, &cl->dev, NULL, NULL, &e);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: clCreateContext on %s: %s", cl->name, cl_err_name(e));
    cl->q = clCreateCommandQueue(cl->cx, cl->dev, cl->profile ? CL_QUEUE_PROFILING_ENABLE : 0, &e);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: clCreateCommandQueue: %s", cl_err_name(e));
    int rc = build_program(cl, 1);
    if (!rc) rc = read_tunables(cl);
    if (!rc) rc = check_shapes(cl);
    if (rc) return rc;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    cl->layers = calloc((size_t)c->n_layers, sizeof *cl->layers);
    if (!cl->layers) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    rc = upload_all_weights(cl);
    if (rc) return rc;
    size_t q_dim = (size_t)c->n_heads * c->head_dim;
    size_t n_vec = (size_t)c->n_layers * (2 * (size_t)c->dim + q_dim + 2 * kv_dim) + (size_t)c->dim;
    rc = upload(cl, &cl->vecs, m->vectors, n_vec * sizeof(float), "norm weights and biases");
    float inv_freq[128];
    for (int i = 0; i < c->head_dim / 2; i++)
        inv_freq[i] = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / (double)c->head_dim));
    size_t n_groups_max = (size_t)cl->n_cu * (size_t)cl->t.mv_groups_per_cu;
    if (!rc) rc = upload(cl, &cl->inv_freq, inv_freq, sizeof(float) * (size_t)(c->head_dim / 2), "RoPE table");
    if (!rc) rc = device_buffer(cl, &cl->x, (size_t)c->dim * 4, "activations");
    if (!rc) rc = device_buffer(cl, &cl->x2, (size_t)c->dim * 4, "activations");
    if (!rc) rc = device_buffer(cl, &cl->bar, 2 * sizeof(cl_int), "grid barrier");
    if (!rc) rc = reset_bar(cl);
    if (!rc) pick_persistent(cl);
    if (!rc && cl->persistent) rc = token_buffers(cl);
    if (!rc) rc = device_buffer(cl, &cl->qb, q_dim * 4, "activations");
    if (!rc) rc = device_buffer(cl, &cl->hb, (size_t)c->ffn_dim * 4, "activations");
    if (!rc) rc = device_buffer(cl, &cl->logits, (size_t)c->vocab_size * 4, "logits");
    /* the token kernel keeps each layer's partials apart */
    if (!rc) rc = device_buffer(cl, &cl->part, (size_t)(cl->persistent ? c->n_layers : 1) *
                                line_pad((size_t)c->n_heads * (size_t)cl->t.att_max_split * (size_t)(c->head_dim + 2)) * 4,
                                "attention partials");
    if (!rc) rc = device_buffer(cl, &cl->best, n_groups_max * 8, "argmax partials");
    if (!rc) rc = device_buffer(cl, &cl->next, 2 * sizeof(cl_int), "token id");
    if (!rc) pin_results(cl);
    if (!rc) rc = device_buffer(cl, &cl->kt, (size_t)c->n_layers * kv_dim * (size_t)cl->ctx_stride * 4, "KV cache");
    if (!rc) rc = device_buffer(cl, &cl->vc, (size_t)c->n_layers * kv_dim * (size_t)cl->ctx_stride * 4, "KV cache");
    if (!rc) rc = bind_all(cl);
    if (!rc && cl->profile) {
        measure_floor(cl);
        int per_step = tllm_cl_launches_per_token(cl);
        cl->events = calloc((size_t)per_step, sizeof *cl->events);
        cl->event_kind = calloc((size_t)per_step, sizeof *cl->event_kind);
        if (!cl->events || !cl->event_kind) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    return rc;
}

static void print_profile(const struct tllm_cl *cl) {
    if (!cl->prof_steps) return;
    double steps = cl->prof_steps, busy = 0;
    for (int k = 0; k < K_COUNT; k++) busy += cl->prof_ns[k];
    fprintf(stderr, "opencl profile, %s, %d steps (per token):\n", cl->name, cl->prof_steps);
    if (cl->persistent)
        fprintf(stderr, "  one `token` launch of %d work-groups x %d threads\n", cl->persist_groups, cl->t.mv_lws);
    if (cl->phases)
        fprintf(stderr, "  (phases: the work of the first and the last work-group to arrive at the grid barrier "
                        "that ends it; the rest is the barrier)\n");
    fprintf(stderr, "  %-10s %9s %10s %7s%s\n", "kernel", "launches", "us", "share", cl->phases ? "   first    last" : "");
    for (int k = 0; k < K_COUNT; k++) {
        if (!cl->prof_count[k]) continue;
        fprintf(stderr, "  %-10s %9.1f %10.1f %6.1f%%", kind_names[k], cl->prof_count[k] / steps,
                cl->prof_ns[k] / steps / 1e3, 100 * cl->prof_ns[k] / busy);
        if (cl->phases && k != K_ARGMAX)
            fprintf(stderr, " %7.1f %7.1f", cl->prof_first_ns[k] / steps / 1e3, cl->prof_last_ns[k] / steps / 1e3);
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "  kernels busy %.1f us, first start to last end %.1f us (gaps %.1f us), host wall %.1f us\n",
            busy / steps / 1e3, cl->prof_span_ns / steps / 1e3, (cl->prof_span_ns - busy) / steps / 1e3,
            cl->prof_wall_s / steps * 1e6);
    if (cl->profile)
        fprintf(stderr, "  an empty kernel: %.1f us, %.1f us between two back to back\n", cl->floor_ns / 1e3, cl->floor_gap_ns / 1e3);
}

/* TLLM_CL_PROFILE=phases: the step's barrier times into the per-kernel sums (each phase counted with
 * the grid barrier that ends it). */
static void collect_phases(struct tllm_cl *cl, double wall) {
    int L = cl->m->cfg.n_layers, n = 4 + 5 * L, G = cl->persist_groups;
    cl_ulong *t = cl->times_host;
    if (clEnqueueReadBuffer(cl->q, cl->times, CL_TRUE, 0, phase_times_len(cl) * sizeof *t, t, 0, NULL, NULL) != CL_SUCCESS)
        return;
    static const int layer_kind[5] = {K_QKV, K_ATTN, K_ATTN_OUT, K_GATE_UP, K_DOWN};
    for (int i = 0; i + 1 < n; i++) {
        int k = i == 0 ? K_EMBED : i <= 5 * L ? layer_kind[(i - 1) % 5] : i == 5 * L + 1 ? K_LM_HEAD : K_ARGMAX;
        cl->prof_ns[k] += (double)(t[i + 1] - t[i]);
        cl->prof_count[k]++;
        if (i + 1 >= n - 1) continue; /* the argmax phase ends with no grid barrier */
        const cl_ulong *arr = t + n + (size_t)(i + 1) * G; /* each group's arrival at the barrier ending phase i */
        cl_ulong first = arr[0], last = arr[0];
        for (int g = 1; g < G; g++) first = arr[g] < first ? arr[g] : first, last = arr[g] > last ? arr[g] : last;
        /* groups with no work in a phase can arrive before group 0 has passed the previous barrier */
        cl->prof_first_ns[k] += first > t[i] ? (double)(first - t[i]) : 0.0;
        cl->prof_last_ns[k] += last > t[i] ? (double)(last - t[i]) : 0.0;
    }
    cl->prof_span_ns += (double)(t[n - 1] - t[0]);
    cl->prof_wall_s += wall;
    cl->prof_steps++;
}

/* Waits for every pending step and forgets them (after an error, or to drop a guess) */
static void drop_pending(struct tllm_cl *cl) {
    if (cl->pend_n) clFinish(cl->q);
    for (; cl->pend_n; cl->pend_n--, cl->pend_head = (cl->pend_head + 1) % TLLM_CL_AHEAD)
        if (cl->pend[cl->pend_head].ev) clReleaseEvent(cl->pend[cl->pend_head].ev);
}

void tllm_cl_free(struct tllm_cl *cl) {
    if (!cl) return;
    drop_pending(cl);
    if (cl->res_buf && cl->res_host != cl->res_own) {
        clEnqueueUnmapMemObject(cl->q, cl->res_buf, cl->res_host, 0, NULL, NULL);
        clFinish(cl->q);
    }
    if (cl->profile || cl->phases) print_profile(cl);
    if (cl->host_times && cl->host_steps)
        fprintf(stderr, "opencl host, %s, %d steps: enqueue %.1f us, wait %.1f us per token\n", cl->name, cl->host_steps,
                cl->host_enqueue_s / cl->host_steps * 1e6, cl->host_wait_s / cl->host_steps * 1e6);
    free(cl->events);
    free(cl->event_kind);
    free(cl->times_host);
    release_weights(&cl->embed);
    release_weights(&cl->lm_head);
    struct cl_launch *ls[] = {&cl->l_embed, &cl->l_lm_head, &cl->l_argmax, &cl->l_token};
    for (int i = 0; i < 4; i++)
        if (ls[i]->k) clReleaseKernel(ls[i]->k);
    if (cl->layers)
        for (int l = 0; l < cl->m->cfg.n_layers; l++) {
            struct cl_layer *D = &cl->layers[l];
            struct cl_weights *ws[] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->gate, &D->up, &D->down};
            for (int i = 0; i < 7; i++) release_weights(ws[i]);
            struct cl_launch *lk[] = {&D->qkv, &D->attn, &D->attn_out, &D->gate_up, &D->down_l};
            for (int i = 0; i < 5; i++)
                if (lk[i]->k) clReleaseKernel(lk[i]->k);
        }
    free(cl->layers);
    cl_mem bufs[] = {cl->res_buf, cl->by_blocks, cl->done, cl->arena, cl->desc, cl->act, cl->times, cl->vecs, cl->inv_freq, cl->x, cl->x2, cl->bar, cl->qb, cl->hb, cl->logits, cl->part, cl->best, cl->next, cl->kt, cl->vc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) clReleaseMemObject(bufs[i]);
    if (cl->prog) clReleaseProgram(cl->prog);
    if (cl->q) clReleaseCommandQueue(cl->q);
    if (cl->cx) clReleaseContext(cl->cx);
    free(cl);
}

const char *tllm_cl_device_name(const struct tllm_cl *cl) { return cl->name; }

int tllm_cl_int8(const struct tllm_cl *cl) { return cl->int8; }
int tllm_cl_token_groups(const struct tllm_cl *cl) { return cl->persistent ? cl->persist_groups : 0; }

int tllm_cl_launches_per_token(const struct tllm_cl *cl) {
    return cl->persistent ? 1 : 1 + 5 * cl->m->cfg.n_layers + 2;
}

static cl_int launch(struct tllm_cl *cl, const struct cl_launch *L) {
    cl_event *ev = NULL;
    if (cl->profile) {
        cl->event_kind[cl->n_events] = L->kind;
        ev = &cl->events[cl->n_events++];
    }
    return clEnqueueNDRangeKernel(cl->q, L->k, (cl_uint)L->dims, NULL, L->global, L->local, 0, NULL, ev);
}

static cl_int set_int(const struct cl_launch *L, cl_uint i, int v) {
    cl_int x = v;
    return clSetKernelArg(L->k, L->dyn + i, sizeof x, &x);
}

static cl_int enqueue_step(struct tllm_cl *cl, int32_t id, int pos, int argmax) {
    const struct tllm_config *c = &cl->m->cfg;
    /* split-K attention: spans of whole ATT_LWS blocks, at most ATT_MAX_SPLIT of them per head */
    int n_pos = pos + 1, blocks = (n_pos + cl->t.att_lws - 1) / cl->t.att_lws;
    int n_split = blocks < cl->t.att_max_split ? blocks : cl->t.att_max_split;
    int span = (blocks + n_split - 1) / n_split * cl->t.att_lws;
    n_split = (n_pos + span - 1) / span;
    if (cl->persistent) {
        struct cl_launch *T = &cl->l_token;
        /* arrivals at the step's grid barriers (5 a layer, less one for each fusion) */
        long n_bar = (2L + (5L - cl->t.ffn_fused - cl->t.att_fused) * c->n_layers) * cl->persist_groups;
        cl_int e = CL_SUCCESS;
        if (cl->bar_count + n_bar > (1L << 30)) e = clear_bar(cl); /* the count restarts */
        int dyn[5] = {(int)cl->bar_count, id, pos, span, n_split};
        for (int i = 0; i < 5 && !e; i++) e = set_int(T, (cl_uint)i, dyn[i]);
        if (!e) e = launch(cl, T);
        cl->bar_count += n_bar;
        return e;
    }
    cl_int e = set_int(&cl->l_embed, 0, id);
    if (!e) e = launch(cl, &cl->l_embed);
    for (int l = 0; l < c->n_layers && !e; l++) {
        struct cl_layer *D = &cl->layers[l];
        D->attn.global[0] = (size_t)n_split * (size_t)cl->t.att_lws;
        if (!e) e = set_int(&D->qkv, 0, pos);
        if (!e) e = set_int(&D->attn, 0, pos);
        if (!e) e = set_int(&D->attn, 1, span);
        if (!e) e = set_int(&D->attn_out, 0, n_split);
        if (!e) e = launch(cl, &D->qkv);
        if (!e) e = launch(cl, &D->attn);
        if (!e) e = launch(cl, &D->attn_out);
        if (!e) e = launch(cl, &D->gate_up);
        if (!e) e = launch(cl, &D->down_l);
    }
    if (!e) e = launch(cl, &cl->l_lm_head);
    if (!e && argmax) e = launch(cl, &cl->l_argmax);
    return e;
}

/* After a step: add its kernels' device times to the profile. */
static void collect_profile(struct tllm_cl *cl, double wall) {
    cl_ulong first = 0, last = 0;
    for (int i = 0; i < cl->n_events; i++) {
        cl_ulong t0 = 0, t1 = 0;
        clGetEventProfilingInfo(cl->events[i], CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
        clGetEventProfilingInfo(cl->events[i], CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
        clReleaseEvent(cl->events[i]);
        cl->prof_ns[cl->event_kind[i]] += (double)(t1 - t0);
        cl->prof_count[cl->event_kind[i]]++;
        if (i == 0 || t0 < first) first = t0;
        if (t1 > last) last = t1;
    }
    if (cl->n_events) {
        cl->prof_span_ns += (double)(last - first);
        cl->prof_wall_s += wall;
        cl->prof_steps++;
    }
    cl->n_events = 0;
}

int tllm_cl_step(struct tllm_cl *cl, int32_t id, int pos, float *logits, int32_t *next) {
    if (pos < 0 || pos >= cl->n_ctx) return tllm_fail(TLLM_ERR_LIMIT, "opencl: position %d outside the cache of %d", pos, cl->n_ctx);
    if (cl->pend_n) return tllm_fail(TLLM_ERR_ARG, "opencl: a step while %d greedy steps are pending", cl->pend_n);
    double t0 = cl->profile || cl->host_times || cl->phases ? tllm_now() : 0;
    cl_int e = enqueue_step(cl, id, pos, next != NULL);
    double t1 = cl->host_times ? tllm_now() : 0;
    if (e) {
        if (cl->profile) collect_profile(cl, 0);
        return tllm_fail(TLLM_ERR_IO, "opencl: decode step on %s: %s (%d)", cl->name, cl_err_name(e), e);
    }
    cl_int res[2] = {0, 0}; /* the argmax, and whether a grid barrier gave up */
    if (next) e = clEnqueueReadBuffer(cl->q, cl->next, CL_TRUE, 0, sizeof res, res, 0, NULL, NULL);
    else if (cl->persistent) e = clEnqueueReadBuffer(cl->q, cl->bar, CL_FALSE, sizeof(cl_int), sizeof(cl_int), &res[1], 0, NULL, NULL);
    if (e == CL_SUCCESS && logits)
        e = clEnqueueReadBuffer(cl->q, cl->logits, CL_TRUE, 0, (size_t)cl->m->cfg.vocab_size * 4, logits, 0, NULL, NULL);
    if (e == CL_SUCCESS && !next) e = clFinish(cl->q);
    if (cl->profile) collect_profile(cl, tllm_now() - t0);
    if (cl->phases && cl->persistent && e == CL_SUCCESS) collect_phases(cl, tllm_now() - t0);
    if (cl->host_times) {
        cl->host_enqueue_s += t1 - t0;
        cl->host_wait_s += tllm_now() - t1;
        cl->host_steps++;
    }
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: reading the step's result from %s: %s (%d)", cl->name, cl_err_name(e), e);
    if (cl->persistent && res[1]) {
        /* the step's output is garbage, but everything it wrote is rewritten by a redo */
        fprintf(stderr, "tllm: opencl: the work-groups of the token kernel did not all run at once on %s; "
                        "using one launch per kernel from now on\n", cl->name);
        cl->persistent = 0;
        int rc = reset_bar(cl);
        return rc ? rc : tllm_cl_step(cl, id, pos, logits, next);
    }
    if (next) {
        if (res[0] < 0 || res[0] >= cl->m->cfg.vocab_size)
            return tllm_fail(TLLM_ERR_FORMAT, "opencl: no finite logit at position %d", pos);
        *next = res[0];
    }
    return TLLM_OK;
}

int tllm_cl_step_enqueue(struct tllm_cl *cl, int32_t id, int pos) {
    if (pos < 0 || pos >= cl->n_ctx) return tllm_fail(TLLM_ERR_LIMIT, "opencl: position %d outside the cache of %d", pos, cl->n_ctx);
    if (cl->pend_n == TLLM_CL_AHEAD) return tllm_fail(TLLM_ERR_LIMIT, "opencl: %d greedy steps pending already", cl->pend_n);
    int slot = (cl->pend_head + cl->pend_n) % TLLM_CL_AHEAD;
    struct cl_pending *p = &cl->pend[slot];
    *p = (struct cl_pending){.res = cl->res_host + 2 * slot, .id = id, .pos = pos};
    if (cl->profile || cl->host_times || cl->phases) { /* measured one step at a time: it runs now */
        int n = cl->pend_n, rc;
        cl->pend_n = 0; /* tllm_cl_step refuses to run past pending steps, and these are done */
        rc = tllm_cl_step(cl, id < 0 ? cl->last_next : id, pos, NULL, &p->res[0]);
        p->res[1] = 0;
        if (!rc) cl->last_next = p->res[0];
        cl->pend_n = n + !rc;
        return rc;
    }
    cl_int e = enqueue_step(cl, id, pos, 1);
    if (e == CL_SUCCESS) e = clEnqueueReadBuffer(cl->q, cl->next, CL_FALSE, 0, 2 * sizeof(cl_int), p->res, 0, NULL, &p->ev);
    if (e == CL_SUCCESS) e = clFlush(cl->q); /* the device starts on it while the host goes on */
    if (e != CL_SUCCESS) {
        if (p->ev) clReleaseEvent(p->ev);
        p->ev = NULL;
        return tllm_fail(TLLM_ERR_IO, "opencl: decode step on %s: %s (%d)", cl->name, cl_err_name(e), e);
    }
    cl->pend_n++;
    return TLLM_OK;
}

int tllm_cl_step_wait(struct tllm_cl *cl, int32_t *next) {
    if (!cl->pend_n) return tllm_fail(TLLM_ERR_ARG, "opencl: no greedy step pending");
    struct cl_pending *p = &cl->pend[cl->pend_head];
    cl_int e = p->ev ? clWaitForEvents(1, &p->ev) : CL_SUCCESS;
    if (p->ev && e == CL_SUCCESS) clGetEventInfo(p->ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof e, &e, NULL);
    if (p->ev) clReleaseEvent(p->ev);
    int32_t arg = p->res[0], id = p->id;
    int gave_up = p->res[1], pos = p->pos;
    cl->pend_head = (cl->pend_head + 1) % TLLM_CL_AHEAD, cl->pend_n--;
    if (e < 0) {
        drop_pending(cl);
        return tllm_fail(TLLM_ERR_IO, "opencl: decode step on %s: %s (%d)", cl->name, cl_err_name(e), e);
    }
    if (gave_up) {
        /* a grid barrier gave up: this step and the pending ones after it are garbage. Redo them one
         * kernel per launch (tllm_cl_step switches), in order: an id < 0 of the first is the last
         * argmax the host read; the later ones take theirs from the device again */
        int32_t ids[TLLM_CL_AHEAD];
        int at[TLLM_CL_AHEAD], n_rest = cl->pend_n;
        for (int i = 0; i < n_rest; i++) {
            const struct cl_pending *r = &cl->pend[(cl->pend_head + i) % TLLM_CL_AHEAD];
            ids[i] = r->id, at[i] = r->pos;
        }
        drop_pending(cl);
        int rc = tllm_cl_step(cl, id < 0 ? cl->last_next : id, pos, NULL, &arg);
        for (int i = 0; i < n_rest && !rc; i++) rc = tllm_cl_step_enqueue(cl, ids[i], at[i]);
        if (rc) return rc;
    }
    if (arg < 0 || arg >= cl->m->cfg.vocab_size) {
        drop_pending(cl);
        return tllm_fail(TLLM_ERR_FORMAT, "opencl: no finite logit at position %d", pos);
    }
    *next = cl->last_next = arg;
    return TLLM_OK;
}

int tllm_cl_pending(const struct tllm_cl *cl) { return cl->pend_n; }

/* The two caches as rectangles: keys have layers*kv_dim rows of positions, values `layers` rows of
 * positions*kv_dim floats, where a row holds ctx_stride positions on the device and n_ctx on the host. */
static int kv_copy(struct tllm_cl *cl, float *key_cache, float *value_cache, int p0, int p1, int up) {
    if (p1 <= p0) return TLLM_OK;
    const struct tllm_config *c = &cl->m->cfg;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim, L = (size_t)c->n_layers;
    size_t dk = (size_t)cl->ctx_stride * 4, hk = (size_t)cl->n_ctx * 4; /* row pitches: device, host */
    size_t ko[3] = {(size_t)p0 * 4, 0, 0}, kr[3] = {(size_t)(p1 - p0) * 4, L * kv_dim, 1};
    size_t vo[3] = {(size_t)p0 * kv_dim * 4, 0, 0}, vr[3] = {(size_t)(p1 - p0) * kv_dim * 4, L, 1};
    if (up) {
        CL_TRY(clEnqueueWriteBufferRect(cl->q, cl->kt, CL_FALSE, ko, ko, kr, dk, 0, hk, 0, key_cache, 0, NULL, NULL));
        CL_TRY(clEnqueueWriteBufferRect(cl->q, cl->vc, CL_TRUE, vo, vo, vr, dk * kv_dim, 0, hk * kv_dim, 0, value_cache, 0,
                                        NULL, NULL));
    } else {
        CL_TRY(clEnqueueReadBufferRect(cl->q, cl->kt, CL_FALSE, ko, ko, kr, dk, 0, hk, 0, key_cache, 0, NULL, NULL));
        CL_TRY(clEnqueueReadBufferRect(cl->q, cl->vc, CL_TRUE, vo, vo, vr, dk * kv_dim, 0, hk * kv_dim, 0, value_cache, 0,
                                       NULL, NULL));
    }
    return TLLM_OK;
}

int tllm_cl_kv_upload(struct tllm_cl *cl, const float *key_cache, const float *value_cache, int p0, int p1) {
    return kv_copy(cl, (float *)key_cache, (float *)value_cache, p0, p1, 1);
}

int tllm_cl_kv_download(struct tllm_cl *cl, float *key_cache, float *value_cache, int p0, int p1) {
    return kv_copy(cl, key_cache, value_cache, p0, p1, 0);
}
