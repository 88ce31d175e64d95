/* The weights on the device: every matrix uploaded once, into one arena buffer where the device allows
 * it, and the fused phases' second copy of o_proj and down_proj laid out by blocks of inputs. */
#include "engine/backend/opencl/cl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/clock.h"
#include "engine/base/error.h"

int tllm_cl_dt_code(enum tllm_dtype d) { return d == TLLM_DT_BF16 ? 2 : d == TLLM_DT_F16 ? 1 : 0; }

/* Every matrix of the model, in the descriptor table's order: embed, lm_head, then q k v o gate up
 * down of each layer. */
int tllm_cl_n_mats(const struct tllm_model *m) { return 2 + 7 * m->cfg.n_layers; }
const struct tllm_qweights *tllm_cl_model_mat(const struct tllm_model *m, int i) {
    if (i < 2) return i ? &m->lm_head : &m->embed;
    const struct tllm_layer *L = &m->layers[(i - 2) / 7];
    const struct tllm_qweights *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return ws[(i - 2) % 7];
}

int tllm_cl_check_formats(const struct tllm_model *m) {
    for (int i = 0; i < tllm_cl_n_mats(m); i++) {
        const struct tllm_qweights *w = tllm_cl_model_mat(m, i);
        int ok = w->format == TLLM_WF_DENSE || (w->format == TLLM_WF_AFFINE && (w->bits == 2 || w->bits == 4 || w->bits == 8));
        if (!ok || w->perm)
            return tllm_fail(TLLM_ERR_UNSUPPORTED,
                             "opencl: %s: %s %d-bit weights%s are not supported by the device kernels yet (affine 2/4/8-bit "
                             "and dense are); run it on the CPU",
                             w->name, tllm_wformat_name(w->format), w->bits, w->perm ? " in act-order" : "");
    }
    return TLLM_OK;
}

int tllm_cl_upload(struct tllm_cl *cl, cl_mem *out, const void *p, size_t n, const char *what) {
    cl_int e;
    *out = clCreateBuffer(cl->cx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n ? n : 4, (void *)p, &e);
    if (e != CL_SUCCESS)
        return tllm_fail(TLLM_ERR_NOMEM, "opencl: uploading %s (%zu bytes) to %s: %s", what, n, cl->name, tllm_cl_err_name(e));
    return TLLM_OK;
}

/* The 16-byte row check, format and shape of w; its pieces placed in the arena (tied matrices share). */
static int plan_weights(struct tllm_cl *cl, const struct tllm_qweights *w, struct cl_weights *cw, const struct tllm_qweights *same,
                        const struct cl_weights *same_cw) {
    cw->rows = w->rows, cw->cols = w->cols, cw->dt = tllm_cl_dt_code(w->dtype);
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
        if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: uploading %s to %s: %s", w->name, cl->name, tllm_cl_err_name(e));
    }
    return TLLM_OK;
}

/* The kernels' view of cw: sub-buffers of the arena, or (no arena) buffers of their own. */
static int weight_buffers(struct tllm_cl *cl, const struct tllm_qweights *w, struct cl_weights *cw) {
    if (!cl->arena) {
        int rc = tllm_cl_upload(cl, &cw->w, w->w, cw->len[0], w->name);
        if (!rc) rc = tllm_cl_upload(cl, &cw->s, cw->bits ? w->scales : w->w, cw->len[1], w->name); /* dense: placeholders */
        if (!rc) rc = tllm_cl_upload(cl, &cw->b, cw->bits ? w->biases : w->w, cw->len[2], w->name);
        return rc;
    }
    cl_mem *out[3] = {&cw->w, &cw->s, &cw->b};
    for (int i = 0; i < 3; i++) {
        cl_buffer_region r = {cw->off[i], cw->len[i]};
        cl_int e;
        *out[i] = clCreateSubBuffer(cl->arena, CL_MEM_READ_ONLY, CL_BUFFER_CREATE_TYPE_REGION, &r, &e);
        if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: a view of %s on %s: %s", w->name, cl->name, tllm_cl_err_name(e));
    }
    return TLLM_OK;
}

/* Matrix i of the model, and its device copy, in the descriptor table's order. */
void tllm_cl_mat(struct tllm_cl *cl, int i, const struct tllm_qweights **w, struct cl_weights **cw) {
    *w = tllm_cl_model_mat(cl->m, i);
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
int tllm_cl_upload_all_weights(struct tllm_cl *cl) {
    cl_uint align_bits = 0;
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    clGetDeviceInfo(cl->dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    cl->arena_align = align_bits / 8 > 16 ? align_bits / 8 : 16; /* sub-buffers must start on this */
    int n = tllm_cl_n_mats(cl->m);
    for (int i = 0; i < n; i++) {
        const struct tllm_qweights *w;
        struct cl_weights *cw;
        tllm_cl_mat(cl, i, &w, &cw);
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
        tllm_cl_mat(cl, i, &w, &cw);
        int rc = cl->arena ? arena_write(cl, w, cw) : TLLM_OK;
        if (!rc) rc = weight_buffers(cl, w, cw);
        if (rc) return rc;
    }
    CL_TRY(clFinish(cl->q)); /* the writes read the model's mapped memory */
    return TLLM_OK;
}

void tllm_cl_release_weights(struct cl_weights *cw) {
    if (cw->w) clReleaseMemObject(cw->w);
    if (cw->s) clReleaseMemObject(cw->s);
    if (cw->b) clReleaseMemObject(cw->b);
}

int tllm_cl_device_buffer(struct tllm_cl *cl, cl_mem *out, size_t n, const char *what) {
    cl_int e;
    *out = clCreateBuffer(cl->cx, CL_MEM_READ_WRITE, n, NULL, &e);
    if (e != CL_SUCCESS)
        return tllm_fail(TLLM_ERR_NOMEM, "opencl: %s (%zu bytes) on %s: %s", what, n, cl->name, tllm_cl_err_name(e));
    return TLLM_OK;
}

/* FFN_FUSED, ATT_FUSED: every layer's o_proj and down_proj again, as blocks_times in kernels/opencl/matvec.cl reads
 * them (BT_BYTES there): for each block of 32 inputs, every row's 16 bytes of codes, then the scales
 * [group][row] and the biases, so the blocks a work-group multiplies are contiguous. (The arena keeps
 * the row-major copies for the one-kernel-per-step path.) */
static size_t bt_bytes(const struct tllm_qweights *w) {
    size_t es = tllm_dtype_size(w->dtype);
    return ((size_t)w->rows * w->cols / 2 + 2 * (size_t)w->rows * (size_t)(w->cols / w->group_size) * es + 127) & ~(size_t)127;
}

/* w (4-bit, the format of every matrix: the host checked) in that layout, into t */
void tllm_cl_by_blocks(const struct tllm_qweights *w, unsigned char *t) {
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

int tllm_cl_upload_by_blocks(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    size_t o_bytes = bt_bytes(&m->layers[0].wo), per = o_bytes + bt_bytes(&m->layers[0].w_down);
    int rc = tllm_cl_device_buffer(cl, &cl->by_blocks, per * (size_t)m->cfg.n_layers, "o_proj and down_proj by blocks");
    unsigned char *t = rc ? NULL : calloc(1, per);
    if (!rc && !t) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < m->cfg.n_layers && !rc; l++) {
        tllm_cl_by_blocks(&m->layers[l].wo, t);
        tllm_cl_by_blocks(&m->layers[l].w_down, t + o_bytes);
        cl_int e = clEnqueueWriteBuffer(cl->q, cl->by_blocks, CL_TRUE, per * (size_t)l, per, t, 0, NULL, NULL);
        if (e != CL_SUCCESS) rc = tllm_fail(TLLM_ERR_IO, "opencl: uploading o_proj and down_proj by blocks to %s: %s", cl->name, tllm_cl_err_name(e));
    }
    free(t);
    return rc;
}
