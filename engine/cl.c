/* OpenCL host side of the decode backend. Every call is checked and failures name the call and the
 * OpenCL error; the program's build log goes to stderr when it does not compile. */
#define CL_TARGET_OPENCL_VERSION 120
#include "cl.h"

#include <CL/cl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

extern const char tllm_cl_source_decode[]; /* kernels/decode.cl, embedded at build time */

#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

struct cl_weights {
    cl_mem w, s, b; /* codes (or dense values), scales, biases (NULL when dense) */
    int rows, cols, bits, gs, dt;
};

struct cl_layer {
    struct cl_weights wq, wk, wv, wo, gate, up, down;
    int attn_norm, ffn_norm, bq, bk, bv; /* float offsets into `vecs` */
};

struct tllm_cl {
    const struct tllm_model *m;
    char name[256];
    cl_device_id dev;
    cl_context cx;
    cl_command_queue q;
    cl_program prog;
    cl_kernel k_embed, k_qkv, k_attn, k_matvec, k_gate_up, k_argmax;
    size_t mv_lws, mv_rpg, att_lws;
    struct cl_weights embed, lm_head;
    struct cl_layer *layers;
    int final_norm;
    cl_mem vecs;       /* every norm weight and bias (the model's `vectors`) */
    cl_mem inv_freq;   /* [head_dim/2] RoPE frequencies */
    cl_mem x, qb, att, hb, logits, scores, next;
    cl_mem kt, vc;     /* [layers x kv_dim x n_ctx], [layers x n_ctx x kv_dim] */
    int n_ctx;
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

static int build_program(struct tllm_cl *cl) {
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
    char opts[512];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 %s", extra ? extra : "");
    e = clBuildProgram(cl->prog, 1, &cl->dev, opts, NULL, NULL);
    if (e != CL_SUCCESS) {
        size_t n = 0;
        clGetProgramBuildInfo(cl->prog, cl->dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
        char *log = malloc(n + 1);
        if (log && clGetProgramBuildInfo(cl->prog, cl->dev, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS) {
            log[n] = 0;
            fprintf(stderr, "opencl build log for %s:\n%s\n", cl->name, log);
        }
        free(log);
        return tllm_fail(TLLM_ERR_IO, "opencl: kernels/decode.cl does not build on %s: %s (log above)", cl->name,
                         cl_err_name(e));
    }
    struct { cl_kernel *k; const char *name; } ks[] = {
        {&cl->k_embed, "embed"}, {&cl->k_qkv, "qkv"}, {&cl->k_attn, "attention"},
        {&cl->k_matvec, "matvec"}, {&cl->k_gate_up, "gate_up"}, {&cl->k_argmax, "argmax"},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        *ks[i].k = clCreateKernel(cl->prog, ks[i].name, &e);
        if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: kernel %s: %s", ks[i].name, cl_err_name(e));
    }
    return TLLM_OK;
}

static int dt_code(enum tllm_dtype d) { return d == TLLM_DT_BF16 ? 2 : d == TLLM_DT_F16 ? 1 : 0; }

static int upload(struct tllm_cl *cl, cl_mem *out, const void *p, size_t n, const char *what) {
    cl_int e;
    *out = clCreateBuffer(cl->cx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n ? n : 4, (void *)p, &e);
    if (e != CL_SUCCESS)
        return tllm_fail(TLLM_ERR_NOMEM, "opencl: uploading %s (%zu bytes) to %s: %s", what, n, cl->name, cl_err_name(e));
    return TLLM_OK;
}

static int upload_weights(struct tllm_cl *cl, const struct tllm_qweights *w, struct cl_weights *cw) {
    cw->rows = w->rows, cw->cols = w->cols, cw->dt = dt_code(w->dtype);
    if (w->format == TLLM_WF_DENSE) {
        cw->bits = 0, cw->gs = 0;
        int rc = upload(cl, &cw->w, w->w, (size_t)w->rows * w->cols * tllm_dtype_size(w->dtype), w->name);
        if (!rc) rc = upload(cl, &cw->s, w->w, 4, w->name); /* placeholders: kernels never read them */
        if (!rc) rc = upload(cl, &cw->b, w->w, 4, w->name);
        return rc;
    }
    cw->bits = w->bits, cw->gs = w->group_size;
    size_t ng = (size_t)w->rows * (size_t)(w->cols / w->group_size);
    int rc = upload(cl, &cw->w, w->w, (size_t)w->rows * w->cols / 8 * w->bits, w->name);
    if (!rc) rc = upload(cl, &cw->s, w->scales, ng * tllm_dtype_size(w->dtype), w->name);
    if (!rc) rc = upload(cl, &cw->b, w->biases, ng * tllm_dtype_size(w->dtype), w->name);
    return rc;
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

int tllm_cl_init(struct tllm_cl **out, const struct tllm_model *m, int n_ctx, int index) {
    *out = NULL;
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
    if (c->head_dim > 256 || c->head_dim % 2 || c->n_heads % c->n_kv_heads)
        return tllm_fail(TLLM_ERR_ARG, "opencl: head_dim %d is not supported by the decode kernels (at most 256)", c->head_dim);
    struct tllm_cl *cl = calloc(1, sizeof *cl);
    if (!cl) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    cl->m = m;
    cl->dev = devs[pick];
    cl->n_ctx = n_ctx;
    char dname[128] = "", pname[128] = "";
    clGetDeviceInfo(cl->dev, CL_DEVICE_NAME, sizeof dname, dname, NULL);
    clGetPlatformInfo(plats[pick], CL_PLATFORM_NAME, sizeof pname, pname, NULL);
    snprintf(cl->name, sizeof cl->name, "%s (%s)", dname, pname);
    *out = cl; /* from here on, tllm_cl_free releases what was made */
    cl_int e;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plats[pick], 0};
    cl->cx = clCreateContext(props, 1, &cl->dev, NULL, NULL, &e);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: clCreateContext on %s: %s", cl->name, cl_err_name(e));
    cl->q = clCreateCommandQueue(cl->cx, cl->dev, 0, &e);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: clCreateCommandQueue: %s", cl_err_name(e));
    int rc = build_program(cl);
    if (rc) return rc;
    /* work-group sizes must match the kernels' compiled MV_LWS / ATT_LWS; read them back from a probe */
    cl->mv_lws = 256, cl->att_lws = 256, cl->mv_rpg = 256 / 32;
    const char *opts = getenv("TLLM_CL_OPTS");
    if (opts) {
        const char *p;
        if ((p = strstr(opts, "-DMV_LWS="))) cl->mv_lws = (size_t)atoi(p + 9);
        if ((p = strstr(opts, "-DATT_LWS="))) cl->att_lws = (size_t)atoi(p + 10);
        size_t tpr = 32;
        if ((p = strstr(opts, "-DMV_TPR="))) tpr = (size_t)atoi(p + 9);
        if (!tpr || cl->mv_lws % tpr) return tllm_fail(TLLM_ERR_ARG, "TLLM_CL_OPTS: MV_LWS must be a multiple of MV_TPR");
        cl->mv_rpg = cl->mv_lws / tpr;
    }
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    rc = upload_weights(cl, &m->embed, &cl->embed);
    if (!rc) rc = upload_weights(cl, &m->lm_head, &cl->lm_head);
    cl->layers = calloc((size_t)c->n_layers, sizeof *cl->layers);
    if (!cl->layers) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const struct tllm_layer *L = &m->layers[l];
        struct cl_layer *D = &cl->layers[l];
        rc = upload_weights(cl, &L->wq, &D->wq);
        if (!rc) rc = upload_weights(cl, &L->wk, &D->wk);
        if (!rc) rc = upload_weights(cl, &L->wv, &D->wv);
        if (!rc) rc = upload_weights(cl, &L->wo, &D->wo);
        if (!rc) rc = upload_weights(cl, &L->w_gate, &D->gate);
        if (!rc) rc = upload_weights(cl, &L->w_up, &D->up);
        if (!rc) rc = upload_weights(cl, &L->w_down, &D->down);
        D->attn_norm = (int)(L->attn_norm - m->vectors), D->ffn_norm = (int)(L->ffn_norm - m->vectors);
        D->bq = (int)(L->bq - m->vectors), D->bk = (int)(L->bk - m->vectors), D->bv = (int)(L->bv - m->vectors);
    }
    if (rc) return rc;
    cl->final_norm = (int)(m->final_norm - m->vectors);
    size_t q_dim = (size_t)c->n_heads * c->head_dim;
    size_t n_vec = (size_t)c->n_layers * (2 * (size_t)c->dim + q_dim + 2 * kv_dim) + (size_t)c->dim;
    rc = upload(cl, &cl->vecs, m->vectors, n_vec * sizeof(float), "norm weights and biases");
    float inv_freq[128];
    for (int i = 0; i < c->head_dim / 2; i++)
        inv_freq[i] = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / (double)c->head_dim));
    if (!rc) rc = upload(cl, &cl->inv_freq, inv_freq, sizeof(float) * (size_t)(c->head_dim / 2), "RoPE table");
    if (!rc) rc = device_buffer(cl, &cl->x, (size_t)c->dim * 4, "activations");
    if (!rc) rc = device_buffer(cl, &cl->qb, q_dim * 4, "activations");
    if (!rc) rc = device_buffer(cl, &cl->att, q_dim * 4, "activations");
    if (!rc) rc = device_buffer(cl, &cl->hb, (size_t)c->ffn_dim * 4, "activations");
    if (!rc) rc = device_buffer(cl, &cl->logits, (size_t)c->vocab_size * 4, "logits");
    if (!rc) rc = device_buffer(cl, &cl->scores, (size_t)c->n_heads * n_ctx * 4, "attention scores");
    if (!rc) rc = device_buffer(cl, &cl->next, 4, "token id");
    if (!rc) rc = device_buffer(cl, &cl->kt, (size_t)c->n_layers * kv_dim * n_ctx * 4, "KV cache");
    if (!rc) rc = device_buffer(cl, &cl->vc, (size_t)c->n_layers * kv_dim * n_ctx * 4, "KV cache");
    return rc;
}

void tllm_cl_free(struct tllm_cl *cl) {
    if (!cl) return;
    release_weights(&cl->embed);
    release_weights(&cl->lm_head);
    if (cl->layers)
        for (int l = 0; l < cl->m->cfg.n_layers; l++) {
            struct cl_layer *D = &cl->layers[l];
            struct cl_weights *ws[] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->gate, &D->up, &D->down};
            for (int i = 0; i < 7; i++) release_weights(ws[i]);
        }
    free(cl->layers);
    cl_mem bufs[] = {cl->vecs, cl->inv_freq, cl->x, cl->qb, cl->att, cl->hb, cl->logits, cl->scores, cl->next, cl->kt, cl->vc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) clReleaseMemObject(bufs[i]);
    cl_kernel ks[] = {cl->k_embed, cl->k_qkv, cl->k_attn, cl->k_matvec, cl->k_gate_up, cl->k_argmax};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        if (ks[i]) clReleaseKernel(ks[i]);
    if (cl->prog) clReleaseProgram(cl->prog);
    if (cl->q) clReleaseCommandQueue(cl->q);
    if (cl->cx) clReleaseContext(cl->cx);
    free(cl);
}

const char *tllm_cl_device_name(const struct tllm_cl *cl) { return cl->name; }

int tllm_cl_launches_per_token(const struct tllm_cl *cl) { return 1 + 5 * cl->m->cfg.n_layers + 2; }

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

static cl_int launch(struct tllm_cl *cl, struct args *a, size_t global, size_t local) {
    if (a->err != CL_SUCCESS) return a->err;
    size_t g = (global + local - 1) / local * local;
    return clEnqueueNDRangeKernel(cl->q, a->k, 1, NULL, &g, &local, 0, NULL, NULL);
}

static cl_int run_matvec(struct tllm_cl *cl, const struct cl_weights *w, cl_mem x, int norm_off, cl_mem y, int mode) {
    struct args a = {cl->k_matvec, 0, CL_SUCCESS};
    arg_weights(&a, w);
    ARG_INT(&a, w->rows);
    ARG_INT(&a, w->cols);
    ARG_MEM(&a, x);
    ARG_MEM(&a, cl->vecs);
    ARG_INT(&a, norm_off);
    ARG_F32(&a, cl->m->cfg.norm_eps);
    ARG_MEM(&a, y);
    ARG_INT(&a, mode);
    return launch(cl, &a, (size_t)(w->rows + cl->mv_rpg - 1) / cl->mv_rpg * cl->mv_lws, cl->mv_lws);
}

static cl_int enqueue_step(struct tllm_cl *cl, int32_t id, int pos) {
    const struct tllm_config *c = &cl->m->cfg;
    cl_int e;
    struct args a = {cl->k_embed, 0, CL_SUCCESS};
    arg_weights(&a, &cl->embed);
    ARG_INT(&a, c->dim);
    ARG_INT(&a, id);
    ARG_MEM(&a, cl->x);
    if ((e = launch(cl, &a, (size_t)c->dim, 64))) return e;
    for (int l = 0; l < c->n_layers; l++) {
        const struct cl_layer *D = &cl->layers[l];
        a = (struct args){cl->k_qkv, 0, CL_SUCCESS};
        arg_weights(&a, &D->wq);
        arg_weights(&a, &D->wk);
        arg_weights(&a, &D->wv);
        ARG_INT(&a, c->n_heads);
        ARG_INT(&a, c->n_kv_heads);
        ARG_INT(&a, c->head_dim);
        ARG_INT(&a, c->dim);
        ARG_MEM(&a, cl->x);
        ARG_MEM(&a, cl->vecs);
        ARG_INT(&a, D->attn_norm);
        ARG_INT(&a, D->bq);
        ARG_INT(&a, D->bk);
        ARG_INT(&a, D->bv);
        ARG_F32(&a, c->norm_eps);
        ARG_MEM(&a, cl->inv_freq);
        ARG_INT(&a, pos);
        ARG_INT(&a, cl->n_ctx);
        ARG_MEM(&a, cl->qb);
        ARG_MEM(&a, cl->kt);
        ARG_MEM(&a, cl->vc);
        ARG_INT(&a, l);
        size_t units = (size_t)(c->n_heads + 2 * c->n_kv_heads) * (size_t)(c->head_dim / 2);
        e = launch(cl, &a, (units + cl->mv_rpg - 1) / cl->mv_rpg * cl->mv_lws, cl->mv_lws);
        if (!e) {
            a = (struct args){cl->k_attn, 0, CL_SUCCESS};
            ARG_MEM(&a, cl->qb);
            ARG_MEM(&a, cl->kt);
            ARG_MEM(&a, cl->vc);
            ARG_INT(&a, l);
            ARG_MEM(&a, cl->scores);
            ARG_MEM(&a, cl->att);
            ARG_INT(&a, pos);
            ARG_INT(&a, cl->n_ctx);
            ARG_INT(&a, c->head_dim);
            ARG_INT(&a, c->n_heads);
            ARG_INT(&a, c->n_kv_heads);
            e = launch(cl, &a, (size_t)c->n_heads * cl->att_lws, cl->att_lws);
        }
        if (e) return e;
        if ((e = run_matvec(cl, &D->wo, cl->att, -1, cl->x, 1))) return e;
        a = (struct args){cl->k_gate_up, 0, CL_SUCCESS};
        arg_weights(&a, &D->gate);
        arg_weights(&a, &D->up);
        ARG_INT(&a, c->ffn_dim);
        ARG_INT(&a, c->dim);
        ARG_MEM(&a, cl->x);
        ARG_MEM(&a, cl->vecs);
        ARG_INT(&a, D->ffn_norm);
        ARG_F32(&a, c->norm_eps);
        ARG_MEM(&a, cl->hb);
        if ((e = launch(cl, &a, (size_t)(c->ffn_dim + cl->mv_rpg - 1) / cl->mv_rpg * cl->mv_lws, cl->mv_lws))) return e;
        if ((e = run_matvec(cl, &D->down, cl->hb, -1, cl->x, 1))) return e;
    }
    return run_matvec(cl, &cl->lm_head, cl->x, cl->final_norm, cl->logits, 0);
}

int tllm_cl_step(struct tllm_cl *cl, int32_t id, int pos, float *logits, int32_t *next) {
    if (pos < 0 || pos >= cl->n_ctx) return tllm_fail(TLLM_ERR_LIMIT, "opencl: position %d outside the cache of %d", pos, cl->n_ctx);
    cl_int e = enqueue_step(cl, id, pos);
    if (e) return tllm_fail(TLLM_ERR_IO, "opencl: decode step on %s: %s (%d)", cl->name, cl_err_name(e), e);
    if (next) {
        struct args a = {cl->k_argmax, 0, CL_SUCCESS};
        ARG_MEM(&a, cl->logits);
        ARG_INT(&a, cl->m->cfg.vocab_size);
        ARG_MEM(&a, cl->next);
        if ((e = launch(cl, &a, cl->mv_lws, cl->mv_lws)))
            return tllm_fail(TLLM_ERR_IO, "opencl: argmax: %s", cl_err_name(e));
        cl_int v = 0;
        CL_TRY(clEnqueueReadBuffer(cl->q, cl->next, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL));
        *next = v;
    }
    if (logits)
        CL_TRY(clEnqueueReadBuffer(cl->q, cl->logits, CL_TRUE, 0, (size_t)cl->m->cfg.vocab_size * 4, logits, 0, NULL, NULL));
    if (!next && !logits) CL_TRY(clFinish(cl->q));
    return TLLM_OK;
}

/* The two caches as rectangles: keys have layers*kv_dim rows of n_ctx positions; values have `layers`
 * rows of n_ctx*kv_dim floats. */
static int kv_copy(struct tllm_cl *cl, float *key_cache, float *value_cache, int p0, int p1, int up) {
    if (p1 <= p0) return TLLM_OK;
    const struct tllm_config *c = &cl->m->cfg;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim, L = (size_t)c->n_layers, nc = (size_t)cl->n_ctx;
    size_t ko[3] = {(size_t)p0 * 4, 0, 0}, kr[3] = {(size_t)(p1 - p0) * 4, L * kv_dim, 1};
    size_t vo[3] = {(size_t)p0 * kv_dim * 4, 0, 0}, vr[3] = {(size_t)(p1 - p0) * kv_dim * 4, L, 1};
    if (up) {
        CL_TRY(clEnqueueWriteBufferRect(cl->q, cl->kt, CL_FALSE, ko, ko, kr, nc * 4, 0, nc * 4, 0, key_cache, 0, NULL, NULL));
        CL_TRY(clEnqueueWriteBufferRect(cl->q, cl->vc, CL_TRUE, vo, vo, vr, nc * kv_dim * 4, 0, nc * kv_dim * 4, 0,
                                        value_cache, 0, NULL, NULL));
    } else {
        CL_TRY(clEnqueueReadBufferRect(cl->q, cl->kt, CL_FALSE, ko, ko, kr, nc * 4, 0, nc * 4, 0, key_cache, 0, NULL, NULL));
        CL_TRY(clEnqueueReadBufferRect(cl->q, cl->vc, CL_TRUE, vo, vo, vr, nc * kv_dim * 4, 0, nc * kv_dim * 4, 0,
                                       value_cache, 0, NULL, NULL));
    }
    return TLLM_OK;
}

int tllm_cl_kv_upload(struct tllm_cl *cl, const float *key_cache, const float *value_cache, int p0, int p1) {
    return kv_copy(cl, (float *)key_cache, (float *)value_cache, p0, p1, 1);
}

int tllm_cl_kv_download(struct tllm_cl *cl, float *key_cache, float *value_cache, int p0, int p1) {
    return kv_copy(cl, key_cache, value_cache, p0, p1, 0);
}
