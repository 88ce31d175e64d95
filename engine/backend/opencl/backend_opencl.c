/* The OpenCL device as a struct tllm_backend: the table over cl.h's calls. A step is one sequence's:
 * a generated token (the decode kernels), or a chunk of prompt tokens (the prefill GEMMs); or, bound
 * to a paged cache, tokens of many sequences (cl_paged.c). */
#include "engine/backend/opencl/opencl.h"

#include <stdlib.h>
#include <string.h>

#include "engine/backend/opencl/cl.h"
#include "base/error.h"

struct cl_backend {
    struct tllm_backend base;
    struct tllm_cl *cl;
    struct tllm_kv *kv; /* bound by use_kv: steps of many sequences */
};

static struct tllm_cl *cl_of(const struct tllm_backend *b) { return ((const struct cl_backend *)b)->cl; }

static int one_token(const struct tllm_batch *bt) {
    if (bt->n != 1) return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: a decode step takes one token, not %d", bt->n);
    return TLLM_OK;
}

/* A prompt step: one sequence's tokens at consecutive positions */
static int prompt_step(struct tllm_cl *cl, const struct tllm_batch *bt, float *logits, int32_t *argmax) {
    for (int t = 0; t < bt->n; t++) {
        if (bt->seq[t] != bt->seq[0]) return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: a step of several sequences");
        if (bt->pos[t] != bt->pos[0] + t) return tllm_fail(TLLM_ERR_ARG, "opencl: a prompt step's positions are not consecutive");
        if (bt->id[t] < 0) return tllm_fail(TLLM_ERR_ARG, "opencl: token id %d in a prompt step", bt->id[t]);
    }
    return tllm_cl_prefill(cl, bt->id, bt->n, bt->pos[0], bt->out, logits, argmax);
}

static int ocl_step(struct tllm_backend *b, const struct tllm_batch *bt, float *logits, int32_t *argmax) {
    if (((struct cl_backend *)b)->kv) return tllm_cl_batch(cl_of(b), bt, logits, argmax);
    if (bt->want_logits || bt->mask || bt->fill_masks) return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: per-row outputs of a step need the paged cache (use_kv)");
    if (bt->n > 1 || bt->n_gen == 0) return prompt_step(cl_of(b), bt, logits, argmax);
    int want = bt->out && bt->out[0];
    return tllm_cl_step(cl_of(b), bt->id[0], bt->pos[0], want ? logits : NULL, want ? argmax : NULL);
}

static int ocl_step_enqueue(struct tllm_backend *b, const struct tllm_batch *bt) {
    int rc = one_token(bt);
    return rc ? rc : tllm_cl_step_enqueue(cl_of(b), bt->id[0], bt->pos[0]);
}

static int ocl_step_wait(struct tllm_backend *b, int32_t *argmax) { return tllm_cl_step_wait(cl_of(b), argmax); }

static int ocl_pending(const struct tllm_backend *b) { return tllm_cl_pending(cl_of(b)); }

static int ocl_kv_upload(struct tllm_backend *b, const float *kt, const float *v, int p0, int p1) {
    return tllm_cl_kv_upload(cl_of(b), kt, v, p0, p1);
}

static int ocl_kv_download(struct tllm_backend *b, float *kt, float *v, int p0, int p1) {
    return tllm_cl_kv_download(cl_of(b), kt, v, p0, p1);
}

static int ocl_use_kv(struct tllm_backend *b, struct tllm_kv *kv) {
    struct cl_backend *cb = (struct cl_backend *)b;
    cb->kv = NULL;
    int rc = tllm_cl_use_kv(cb->cl, kv);
    if (!rc) cb->kv = kv;
    return rc;
}

static void ocl_describe(const struct tllm_backend *b, struct tllm_backend_info *info) {
    const struct tllm_cl *cl = cl_of(b);
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "OpenCL %s", tllm_cl_device_name(cl));
    info->launches_per_token = tllm_cl_launches_per_token(cl);
    info->groups = tllm_cl_token_groups(cl);
    info->int8 = tllm_cl_int8(cl);
    info->prefill = tllm_cl_prefill_auto(cl);
    info->weight_bytes = tllm_cl_step_weight_bytes(cl, &info->weights);
}

static int ocl_matmul(struct tllm_backend *b, const struct tllm_qweights *w, const float *x, int n, int int8, float *y, int reps,
                      double *secs) {
    return reps > 0 ? tllm_cl_matmul_bench(cl_of(b), w, x, n, int8, reps, secs) : tllm_cl_matmul(cl_of(b), w, x, n, int8, y);
}

static void ocl_free(struct tllm_backend *b) {
    tllm_cl_free(cl_of(b));
    free(b);
}

static const struct tllm_backend_ops cl_ops = {
    .step = ocl_step,
    .step_enqueue = ocl_step_enqueue,
    .step_wait = ocl_step_wait,
    .pending = ocl_pending,
    .kv_upload = ocl_kv_upload,
    .kv_download = ocl_kv_download,
    .use_kv = ocl_use_kv,
    .describe = ocl_describe,
    .matmul = ocl_matmul,
    .free = ocl_free,
};

int tllm_backend_opencl_init(struct tllm_backend **out, const struct tllm_model *m, int n_ctx, int index) {
    *out = NULL;
    struct cl_backend *b = calloc(1, sizeof *b);
    if (!b) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    int rc = tllm_cl_init(&b->cl, m, n_ctx, index);
    if (rc) {
        tllm_cl_free(b->cl);
        free(b);
        return rc;
    }
    b->base.ops = &cl_ops;
    *out = &b->base;
    return TLLM_OK;
}

int tllm_backend_opencl_list(FILE *out) { return tllm_cl_list(out); }
