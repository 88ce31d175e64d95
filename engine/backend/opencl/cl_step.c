/* Running steps: one decode step, greedy steps queued ahead with their results read asynchronously,
 * and copies of KV cache ranges between the host and the device. */
#include "engine/backend/opencl/cl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"

/* Waits for every pending step and forgets them (after an error, or to drop a guess) */
void tllm_cl_drop_pending(struct tllm_cl *cl) {
    if (cl->pend_n) clFinish(cl->q);
    for (; cl->pend_n; cl->pend_n--, cl->pend_head = (cl->pend_head + 1) % TLLM_CL_AHEAD)
        if (cl->pend[cl->pend_head].ev) clReleaseEvent(cl->pend[cl->pend_head].ev);
}

cl_int tllm_cl_launch_one(struct tllm_cl *cl, const struct cl_launch *L) {
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
        if (cl->bar_count + n_bar > (1L << 30)) e = tllm_cl_clear_bar(cl); /* the count restarts */
        int dyn[5] = {(int)cl->bar_count, id, pos, span, n_split};
        for (int i = 0; i < 5 && !e; i++) e = set_int(T, (cl_uint)i, dyn[i]);
        if (!e) e = tllm_cl_launch_one(cl, T);
        cl->bar_count += n_bar;
        return e;
    }
    cl_int e = set_int(&cl->l_embed, 0, id);
    if (!e) e = tllm_cl_launch_one(cl, &cl->l_embed);
    for (int l = 0; l < c->n_layers && !e; l++) {
        struct cl_layer *D = &cl->layers[l];
        D->attn.global[0] = (size_t)n_split * (size_t)cl->t.att_lws;
        if (!e) e = set_int(&D->qkv, 0, pos);
        if (!e) e = set_int(&D->attn, 0, pos);
        if (!e) e = set_int(&D->attn, 1, span);
        if (!e) e = set_int(&D->attn_out, 0, n_split);
        if (!e) e = tllm_cl_launch_one(cl, &D->qkv);
        if (!e) e = tllm_cl_launch_one(cl, &D->attn);
        if (!e) e = tllm_cl_launch_one(cl, &D->attn_out);
        if (!e) e = tllm_cl_launch_one(cl, &D->gate_up);
        if (!e) e = tllm_cl_launch_one(cl, &D->down_l);
    }
    if (!e) e = tllm_cl_launch_one(cl, &cl->l_lm_head);
    if (!e && argmax) e = tllm_cl_launch_one(cl, &cl->l_argmax);
    return e;
}

int tllm_cl_step(struct tllm_cl *cl, int32_t id, int pos, float *logits, int32_t *next) {
    if (pos < 0 || pos >= cl->n_ctx) return tllm_fail(TLLM_ERR_LIMIT, "opencl: position %d outside the cache of %d", pos, cl->n_ctx);
    if (cl->pend_n) return tllm_fail(TLLM_ERR_ARG, "opencl: a step while %d greedy steps are pending", cl->pend_n);
    double t0 = cl->profile || cl->host_times || cl->phases ? tllm_now() : 0;
    cl_int e = enqueue_step(cl, id, pos, next != NULL);
    double t1 = cl->host_times ? tllm_now() : 0;
    if (e) {
        if (cl->profile) tllm_cl_collect_profile(cl, 0);
        return tllm_fail(TLLM_ERR_IO, "opencl: decode step on %s: %s (%d)", cl->name, tllm_cl_err_name(e), e);
    }
    cl_int res[2] = {0, 0}; /* the argmax, and whether a grid barrier gave up */
    if (next) e = clEnqueueReadBuffer(cl->q, cl->next, CL_TRUE, 0, sizeof res, res, 0, NULL, NULL);
    else if (cl->persistent) e = clEnqueueReadBuffer(cl->q, cl->bar, CL_FALSE, sizeof(cl_int), sizeof(cl_int), &res[1], 0, NULL, NULL);
    if (e == CL_SUCCESS && logits)
        e = clEnqueueReadBuffer(cl->q, cl->logits, CL_TRUE, 0, (size_t)cl->m->cfg.vocab_size * 4, logits, 0, NULL, NULL);
    if (e == CL_SUCCESS && !next) e = clFinish(cl->q);
    if (cl->profile) tllm_cl_collect_profile(cl, tllm_now() - t0);
    if (cl->phases && cl->persistent && e == CL_SUCCESS) tllm_cl_collect_phases(cl, tllm_now() - t0);
    if (cl->host_times) {
        cl->host_enqueue_s += t1 - t0;
        cl->host_wait_s += tllm_now() - t1;
        cl->host_steps++;
    }
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: reading the step's result from %s: %s (%d)", cl->name, tllm_cl_err_name(e), e);
    if (cl->persistent && res[1]) {
        /* the step's output is garbage, but everything it wrote is rewritten by a redo */
        fprintf(stderr, "tllm: opencl: the work-groups of the token kernel did not all run at once on %s; "
                        "using one launch per kernel from now on\n", cl->name);
        cl->persistent = 0;
        int rc = tllm_cl_reset_bar(cl);
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
        return tllm_fail(TLLM_ERR_IO, "opencl: decode step on %s: %s (%d)", cl->name, tllm_cl_err_name(e), e);
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
        tllm_cl_drop_pending(cl);
        return tllm_fail(TLLM_ERR_IO, "opencl: decode step on %s: %s (%d)", cl->name, tllm_cl_err_name(e), e);
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
        tllm_cl_drop_pending(cl);
        int rc = tllm_cl_step(cl, id < 0 ? cl->last_next : id, pos, NULL, &arg);
        for (int i = 0; i < n_rest && !rc; i++) rc = tllm_cl_step_enqueue(cl, ids[i], at[i]);
        if (rc) return rc;
    }
    if (arg < 0 || arg >= cl->m->cfg.vocab_size) {
        tllm_cl_drop_pending(cl);
        return tllm_fail(TLLM_ERR_FORMAT, "opencl: no finite logit at position %d", pos);
    }
    *next = cl->last_next = arg;
    return TLLM_OK;
}

int tllm_cl_pending(const struct tllm_cl *cl) { return cl->pend_n; }

/* The two caches as rectangles: keys have layers*kv_dim rows of positions, values `layers` rows of
 * positions*kv_dim floats, where a row holds ctx_stride positions on the device and p1 - p0 on the
 * host (which holds just the range). */
static int kv_copy(struct tllm_cl *cl, float *key_cache, float *value_cache, int p0, int p1, int up) {
    if (p1 <= p0) return TLLM_OK;
    const struct tllm_config *c = &cl->m->cfg;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim, L = (size_t)c->n_layers;
    if (p0 < 0 || p1 > cl->n_ctx) return tllm_fail(TLLM_ERR_LIMIT, "opencl: positions %d to %d outside the cache of %d", p0, p1, cl->n_ctx);
    size_t dk = (size_t)cl->ctx_stride * 4, hk = (size_t)(p1 - p0) * 4; /* row pitches: device, host */
    size_t ko[3] = {(size_t)p0 * 4, 0, 0}, kr[3] = {(size_t)(p1 - p0) * 4, L * kv_dim, 1};
    size_t vo[3] = {(size_t)p0 * kv_dim * 4, 0, 0}, vr[3] = {(size_t)(p1 - p0) * kv_dim * 4, L, 1};
    size_t ho[3] = {0, 0, 0};
    if (up) {
        CL_TRY(clEnqueueWriteBufferRect(cl->q, cl->kt, CL_FALSE, ko, ho, kr, dk, 0, hk, 0, key_cache, 0, NULL, NULL));
        CL_TRY(clEnqueueWriteBufferRect(cl->q, cl->vc, CL_TRUE, vo, ho, vr, dk * kv_dim, 0, hk * kv_dim, 0, value_cache, 0,
                                        NULL, NULL));
    } else {
        CL_TRY(clEnqueueReadBufferRect(cl->q, cl->kt, CL_FALSE, ko, ho, kr, dk, 0, hk, 0, key_cache, 0, NULL, NULL));
        CL_TRY(clEnqueueReadBufferRect(cl->q, cl->vc, CL_TRUE, vo, ho, vr, dk * kv_dim, 0, hk * kv_dim, 0, value_cache, 0,
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
