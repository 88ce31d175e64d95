/* OpenCL host side of the decode backend: the device state's lifetime. Every call is checked and
 * failures name the call and the OpenCL error; the program's build log goes to stderr when it does
 * not compile. */
#include "engine/backend/opencl/cl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"

int tllm_cl_init(struct tllm_cl **out, const struct tllm_model *m, int n_ctx, int index) {
    *out = NULL;
    if (n_ctx < 1 || n_ctx > (1 << 24)) return tllm_fail(TLLM_ERR_ARG, "opencl: context of %d positions (1 to 16777216)", n_ctx);
    cl_device_id devs[MAX_DEVICES];
    cl_platform_id plats[MAX_DEVICES];
    int n = tllm_cl_all_devices(devs, plats, MAX_DEVICES), pick = -1;
    if (n == 0) return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: no OpenCL platform or device found (is an ICD installed?)");
    if (index >= 0) {
        if (index >= n) return tllm_fail(TLLM_ERR_ARG, "opencl:%d: there %s %d OpenCL device%s (tllm devices lists them)", index,
                                            n == 1 ? "is" : "are", n, n == 1 ? "" : "s");
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
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: clCreateContext on %s: %s", cl->name, tllm_cl_err_name(e));
    cl->q = clCreateCommandQueue(cl->cx, cl->dev, cl->profile ? CL_QUEUE_PROFILING_ENABLE : 0, &e);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: clCreateCommandQueue: %s", tllm_cl_err_name(e));
    int rc = tllm_cl_device_mats(cl);
    if (!rc) rc = tllm_cl_build_program(cl, 1);
    if (!rc) rc = tllm_cl_read_tunables(cl);
    if (!rc) rc = tllm_cl_check_shapes(cl);
    if (rc) return rc;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    cl->layers = calloc((size_t)c->n_layers, sizeof *cl->layers);
    if (!cl->layers) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    rc = tllm_cl_upload_all_weights(cl);
    if (rc) return rc;
    size_t q_dim = (size_t)c->n_heads * c->head_dim;
    size_t n_vec = (size_t)c->n_layers * (2 * (size_t)c->dim + q_dim + 2 * kv_dim) + (size_t)c->dim;
    rc = tllm_cl_upload(cl, &cl->vecs, m->vectors, n_vec * sizeof(float), "norm weights and biases");
    float inv_freq[128];
    for (int i = 0; i < c->head_dim / 2; i++)
        inv_freq[i] = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / (double)c->head_dim));
    size_t n_groups_max = (size_t)cl->n_cu * (size_t)cl->t.mv_groups_per_cu;
    if (!rc) rc = tllm_cl_upload(cl, &cl->inv_freq, inv_freq, sizeof(float) * (size_t)(c->head_dim / 2), "RoPE table");
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->x, (size_t)c->dim * 4, "activations");
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->x2, (size_t)c->dim * 4, "activations");
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->bar, 2 * sizeof(cl_int), "grid barrier");
    if (!rc) rc = tllm_cl_reset_bar(cl);
    if (!rc) tllm_cl_pick_persistent(cl);
    if (!rc && cl->persistent) rc = tllm_cl_token_buffers(cl);
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->qb, q_dim * 4, "activations");
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->hb, (size_t)c->ffn_dim * 4, "activations");
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->logits, (size_t)c->vocab_size * 4, "logits");
    /* the token kernel keeps each layer's partials apart */
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->part, (size_t)(cl->persistent ? c->n_layers : 1) *
                                line_pad((size_t)c->n_heads * (size_t)cl->t.att_max_split * (size_t)(c->head_dim + 2)) * 4,
                                "attention partials");
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->best, n_groups_max * 8, "argmax partials");
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->next, 2 * sizeof(cl_int), "token id");
    if (!rc) tllm_cl_pin_results(cl);
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->kt, (size_t)c->n_layers * kv_dim * (size_t)cl->ctx_stride * 4, "KV cache");
    if (!rc) rc = tllm_cl_device_buffer(cl, &cl->vc, (size_t)c->n_layers * kv_dim * (size_t)cl->ctx_stride * 4, "KV cache");
    if (!rc) rc = tllm_cl_bind_all(cl);
    if (!rc && cl->profile) {
        tllm_cl_measure_floor(cl);
        int per_step = tllm_cl_launches_per_token(cl);
        cl->events = calloc((size_t)per_step, sizeof *cl->events);
        cl->event_kind = calloc((size_t)per_step, sizeof *cl->event_kind);
        if (!cl->events || !cl->event_kind) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    return rc;
}

void tllm_cl_free(struct tllm_cl *cl) {
    if (!cl) return;
    tllm_cl_drop_pending(cl);
    if (cl->res_buf && cl->res_host != cl->res_own) {
        clEnqueueUnmapMemObject(cl->q, cl->res_buf, cl->res_host, 0, NULL, NULL);
        clFinish(cl->q);
    }
    if (cl->profile || cl->phases) tllm_cl_print_profile(cl);
    if (cl->host_times && cl->host_steps)
        fprintf(stderr, "opencl host, %s, %d steps: enqueue %.1f us, wait %.1f us per token\n", cl->name, cl->host_steps,
                cl->host_enqueue_s / cl->host_steps * 1e6, cl->host_wait_s / cl->host_steps * 1e6);
    tllm_cl_paged_free(cl);
    tllm_cl_prefill_free(cl);
    free(cl->events);
    free(cl->event_kind);
    free(cl->times_host);
    tllm_cl_release_weights(&cl->embed);
    tllm_cl_release_weights(&cl->lm_head);
    struct cl_launch *ls[] = {&cl->l_embed, &cl->l_lm_head, &cl->l_argmax, &cl->l_token};
    for (int i = 0; i < 4; i++)
        if (ls[i]->k) clReleaseKernel(ls[i]->k);
    if (cl->layers)
        for (int l = 0; l < cl->m->cfg.n_layers; l++) {
            struct cl_layer *D = &cl->layers[l];
            struct cl_weights *ws[] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->gate, &D->up, &D->down};
            for (int i = 0; i < 7; i++) tllm_cl_release_weights(ws[i]);
            struct cl_launch *lk[] = {&D->qkv, &D->attn, &D->attn_out, &D->gate_up, &D->down_l};
            for (int i = 0; i < 5; i++)
                if (lk[i]->k) clReleaseKernel(lk[i]->k);
        }
    free(cl->layers);
    for (int i = 0; i < cl->n_conv; i++) free(cl->conv[i]);
    free(cl->conv);
    free(cl->mats);
    free(cl->forms);
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
