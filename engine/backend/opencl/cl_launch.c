/* Every kernel of a step made once with its arguments bound, the launch shapes (threads per row,
 * groups, sweeps), and the one-launch `token` kernel's descriptor table, barrier and activations. */
#include "engine/backend/opencl/cl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"

/* Sweeps that `groups` work-groups of MV_LWS threads take over `rows` row slots of tpr threads */
static size_t cl_sweeps(const struct tllm_cl *cl, int rows, int tpr, size_t groups) {
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
           cl_sweeps(cl, rows, tpr / 2, groups) < cl_sweeps(cl, rows, tpr, groups))
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
static int bind_begin(struct tllm_cl *cl, struct cl_launch *L, const char *name, struct args *a) {
    int rc = tllm_cl_make_kernel(cl, &L->k, name);
    *a = (struct args){L->k, 0, CL_SUCCESS};
    return rc;
}
static int bind_end(struct args *a, const char *name) {
    if (a->err != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: arguments of %s: %s", name, tllm_cl_err_name(a->err));
    return TLLM_OK;
}

static int bind_matvec(struct tllm_cl *cl, struct cl_launch *L, const struct cl_weights *w, cl_mem x, int norm_off,
                       cl_mem y, cl_mem res, int add, int track, int kind) {
    struct args a;
    int rc = bind_begin(cl, L, "matvec", &a), tpr = pick_tpr(cl, w, w->rows, max_groups(cl));
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
    return bind_end(&a, "matvec");
}

/* The arguments of the qkv kernel before the position (QKV_ARGS in kernels/opencl/matvec.cl). */
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
    int rc = bind_begin(cl, &cl->l_token, "token", &a);
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
    return bind_end(&a, "token");
}

/* Every kernel of a step, made once with its static arguments. */
int tllm_cl_bind_all(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    const struct tllm_config *c = &m->cfg;
    struct args a;
    int rc = bind_begin(cl, &cl->l_embed, "embed", &a);
    if (rc) return rc;
    arg_weights(&a, &cl->embed);
    ARG_INT(&a, c->dim);
    ARG_MEM(&a, cl->x);
    ARG_MEM(&a, cl->next);
    ARG_INT(&a, c->vocab_size);
    cl->l_embed.dyn = a.i;
    cl->l_embed.dims = 1, cl->l_embed.kind = K_EMBED, cl->l_embed.local[0] = 64;
    cl->l_embed.global[0] = ((size_t)c->dim + 63) / 64 * 64;
    if ((rc = bind_end(&a, "embed"))) return rc;
    int tpr_qkv = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const struct tllm_layer *Lm = &m->layers[l];
        struct cl_layer *D = &cl->layers[l];
        int ffn_norm = (int)(Lm->ffn_norm - m->vectors);
        if ((rc = bind_begin(cl, &D->qkv, "qkv", &a))) return rc;
        tpr_qkv = pick_tpr(cl, &D->wq, qkv_slots(c), max_groups(cl));
        qkv_args(cl, &a, l, tpr_qkv);
        D->qkv.dyn = a.i;
        ARG_INT(&a, 0); /* pos */
        shape_rows(cl, &D->qkv, qkv_slots(c), tpr_qkv, K_QKV);
        if ((rc = bind_end(&a, "qkv"))) return rc;

        if ((rc = bind_begin(cl, &D->attn, "attention", &a))) return rc;
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
        if ((rc = bind_end(&a, "attention"))) return rc;

        if ((rc = bind_begin(cl, &D->attn_out, "attn_out", &a))) return rc;
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
        if ((rc = bind_end(&a, "attn_out"))) return rc;

        if ((rc = bind_begin(cl, &D->gate_up, "gate_up", &a))) return rc;
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
        if ((rc = bind_end(&a, "gate_up"))) return rc;

        if ((rc = bind_matvec(cl, &D->down_l, &D->down, cl->hb, -1, cl->x, cl->x2, 1, 0, K_DOWN))) return rc;

    }
    if (cl->persistent && (rc = bind_token(cl))) return rc;
    if ((rc = bind_matvec(cl, &cl->l_lm_head, &cl->lm_head, cl->x, (int)(m->final_norm - m->vectors), cl->logits,
                          cl->logits, 0, 1, K_LM_HEAD)))
        return rc;
    if ((rc = bind_begin(cl, &cl->l_argmax, "argmax", &a))) return rc;
    ARG_MEM(&a, cl->best);
    ARG_INT(&a, (int)(cl->l_lm_head.global[0] / cl->l_lm_head.local[0])); /* the lm_head's groups */
    ARG_MEM(&a, cl->next);
    ARG_MEM(&a, cl->bar);
    cl->l_argmax.dims = 1, cl->l_argmax.kind = K_ARGMAX;
    cl->l_argmax.global[0] = cl->l_argmax.local[0] = (size_t)cl->t.mv_lws;
    return bind_end(&a, "argmax");
}

/* What the kernels assume of the shapes (rows of codes are checked as they are uploaded); a model
 * outside them runs on the CPU. */
int tllm_cl_check_shapes(const struct tllm_cl *cl) {
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
cl_int tllm_cl_clear_bar(struct tllm_cl *cl) {
    cl_int zero = 0;
    cl->bar_count = 0;
    return clEnqueueFillBuffer(cl->q, cl->bar, &zero, sizeof zero, 0, 2 * sizeof zero, 0, NULL, NULL);
}
int tllm_cl_reset_bar(struct tllm_cl *cl) {
    CL_TRY(tllm_cl_clear_bar(cl));
    return TLLM_OK;
}

/* Persistent mode runs a step as one `token` launch and needs every work-group of its grid resident
 * at once, which OpenCL does not promise: the grid is PERSIST_GROUPS_PER_CU groups per compute unit
 * where the kernel's registers allow, and the mode is abandoned for good if a grid barrier ever times
 * out. On by default on GPUs (TLLM_CL_PERSISTENT=0 turns it off): NVIDIA's OpenCL spends 5-11 us of
 * host time on every launch, so 123 launches a token cost more than the GPU's work. Never on CPU
 * devices: they run work-groups a few at a time, and PoCL 3.1 takes many minutes to compile the
 * kernel. Needs the weight arena. */
void tllm_cl_pick_persistent(struct tllm_cl *cl) {
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

/* Entries of the `times` buffer of TLLM_CL_PROFILE=phases (see PHASE_MARK in kernels/opencl/token.cl): when group 0
 * passes each grid barrier, and when each group arrives at it. */
size_t tllm_cl_phase_times_len(const struct tllm_cl *cl) {
    return (4 + 5 * (size_t)cl->m->cfg.n_layers) * (1 + (size_t)cl->persist_groups);
}

/* The token kernel's descriptor table (see kernels/opencl/token.cl) and its per-layer activations. */
int tllm_cl_token_buffers(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    const struct tllm_config *c = &m->cfg;
    int n = tllm_cl_n_mats(m);
    size_t n_desc = 8 * ((size_t)n + (size_t)c->n_layers);
    cl_int *d = calloc(n_desc, sizeof *d);
    if (!d) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const struct tllm_qweights *w;
        struct cl_weights *cw;
        tllm_cl_mat(cl, i, &w, &cw);
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
    int rc = tllm_cl_upload(cl, &cl->desc, d, n_desc * sizeof *d, "weight table");
    free(d);
    size_t per_layer = 2 * line_pad((size_t)c->dim) + line_pad((size_t)c->n_heads * c->head_dim) + line_pad((size_t)c->ffn_dim);
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->act, ((size_t)c->n_layers + 1) * per_layer * 4, "activations");
    if (!rc && (cl->t.ffn_fused || cl->t.att_fused)) {
        /* the fused phases' outputs are sums that start from zero (the token kernel zeroes them after use) */
        cl_int zero = 0;
        cl_int e = clEnqueueFillBuffer(cl->q, cl->act, &zero, sizeof zero, 0, ((size_t)c->n_layers + 1) * per_layer * 4, 0, NULL, NULL);
        if (e != CL_SUCCESS) rc = tllm_fail(TLLM_ERR_IO, "opencl: clearing the activations: %s", tllm_cl_err_name(e));
        size_t n_done = (size_t)c->n_layers * (size_t)c->n_heads * sizeof zero;
        if (!rc) rc = tllm_cl_device_buffer(cl, &cl->done, n_done, "attention counts");
        if (!rc && (e = clEnqueueFillBuffer(cl->q, cl->done, &zero, sizeof zero, 0, n_done, 0, NULL, NULL)) != CL_SUCCESS)
            rc = tllm_fail(TLLM_ERR_IO, "opencl: clearing the attention counts: %s", tllm_cl_err_name(e));
        if (!rc) rc = tllm_cl_upload_by_blocks(cl);
    }
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->times, tllm_cl_phase_times_len(cl) * sizeof(cl_ulong), "phase times");
    if (!rc && cl->phases && !(cl->times_host = malloc(tllm_cl_phase_times_len(cl) * sizeof *cl->times_host)))
        rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    return rc;
}

/* res_host: pinned where the platform gives it, else res_own (slower, still right) */
void tllm_cl_pin_results(struct tllm_cl *cl) {
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
