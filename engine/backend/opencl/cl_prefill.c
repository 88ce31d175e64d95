/* Many tokens through every layer on the device: a chunk of one sequence's prompt, or a step of many
 * sequences (cl_paged.c), as tiled GEMMs (kernels/opencl/gemm.cl) with the row-wise steps and flash
 * attention between them (kernels/opencl/prefill.cl), K and V written straight into the device cache
 * (or the block pool). The kernels and the buffers are made at the first step and grow with the
 * largest one. */
#include "engine/backend/opencl/cl_prefill.h"
#include "engine/backend/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"

static const char *const p_names[P_COUNT] = {"embed", "norm/quantize", "gemm q,k,v", "rope + cache", "flash attention",
                                             "gemm o_proj", "gemm gate,up", "swiglu", "gemm down_proj", "lm_head"};

static int wide(const struct tllm_config *c) {
    int w = c->dim > c->ffn_dim ? c->dim : c->ffn_dim;
    return c->n_heads * c->head_dim > w ? c->n_heads * c->head_dim : w;
}

const char *tllm_cl_prefill_refusal(const struct tllm_cl *cl) {
    const struct tllm_config *c = &cl->m->cfg;
    if (c->head_dim > PF_MAX_HEAD_DIM) return "head_dim above 128";
    if (c->dim % 32 || c->ffn_dim % 32 || (c->n_heads * c->head_dim) % 32)
        return "hidden, intermediate or attention size not a multiple of 32";
    return NULL;
}

int tllm_cl_prefill_auto(const struct tllm_cl *cl) {
    if (tllm_cl_prefill_refusal(cl)) return -1;
    cl_device_type type = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    return (type & CL_DEVICE_TYPE_GPU) != 0;
}

void tllm_cl_prefill_free(struct tllm_cl *cl) {
    struct cl_prefill *p = cl->pf;
    if (!p) return;
    if (cl->profile && p->chunks) {
        double total = 0;
        for (int k = 0; k < P_COUNT; k++) total += p->prof_ns[k];
        fprintf(stderr, "opencl prefill profile, %s: %ld chunks, %ld tokens, %.2f ms wall, %.2f ms in kernels, %ld launches a chunk\n",
                cl->name, p->chunks, p->tokens, p->prof_wall_s * 1e3, total / 1e6, (long)p->launches);
        for (int k = 0; k < P_COUNT; k++)
            if (p->prof_n[k])
                fprintf(stderr, "  %-16s %5ld launches %9.3f ms %5.1f%%\n", p_names[k], p->prof_n[k], p->prof_ns[k] / 1e6,
                        100.0 * p->prof_ns[k] / (total > 0 ? total : 1));
    }
    if (cl->host_times && p->host_steps) {
        double n = (double)p->host_steps;
        fprintf(stderr, "opencl steps' host time, %s: %ld steps, %.1f launches a step; per step %.1f us queueing (%.1f us of it "
                        "in clEnqueueNDRangeKernel), then %.1f us waiting\n",
                cl->name, p->host_steps, p->host_launches / n, p->host_queue_s / n * 1e6, p->host_enq_s / n * 1e6,
                p->host_wait_s / n * 1e6);
        for (int k = 0; k < P_COUNT; k++) /* what a launch of each kind costs the host */
            if (p->host_launches_kind[k])
                fprintf(stderr, "  %-16s %6.1f launches a step, %5.2f us each in clEnqueueNDRangeKernel\n", p_names[k],
                        p->host_launches_kind[k] / n, p->host_enq_kind_s[k] / p->host_launches_kind[k] * 1e6);
    }
    free(p->ev);
    free(p->ev_kind);
    tllm_cl_mm_release(&p->mm);
    cl_kernel ks[] = {p->reduce, p->embed,   p->norm,       p->swiglu, p->rope,
                      p->flash,  p->combine, p->paged_rope, p->argmax, p->argmax_allowed};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        if (ks[i]) clReleaseKernel(ks[i]);
    cl_mem bs[] = {p->spans, p->meta, p->amax, p->x,        p->mm.io,  p->qkv,  p->q,
                   p->att,   p->h,    p->mm.part, p->logits, p->allow, p->mask, p->counts};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        if (bs[i]) clReleaseMemObject(bs[i]);
    free(p);
    cl->pf = NULL;
}

/* The GEMMs take int8 inputs where the CPU's prompt path does (packed weights, i.e. not --exact) and
 * every matrix they multiply is affine 2/4/8-bit (as the device holds it) with groups of 16 or of whole
 * blocks of 32: in two levels (as
 * decode's matvecs: the reference's logits to about 2e-4), or in one where the model asks for fast
 * decode (--fast-decode: batch generation's and the server's default; 7-14% faster steps on an H200,
 * logits to about 2e-2). 0: float inputs. */
static int model_levels(const struct tllm_cl *cl) { return cl->m->decode_levels == 1 ? 1 : 2; }

static int int8_levels(const struct tllm_cl *cl) {
    if (!cl->mats[2].pack) return 0;
    for (int i = 1; i < tllm_cl_n_mats(cl->m); i++) {
        const struct tllm_qweights *w = &cl->mats[i];
        if (w->format != TLLM_WF_AFFINE || !(w->bits == 2 || w->bits == 4 || w->bits == 8) || (w->group_size % 32 && w->group_size != 16))
            return 0;
    }
    return model_levels(cl);
}

/* Whether a matrix the GEMMs multiply has groups of 16 */
static int model_g16(const struct tllm_cl *cl) {
    for (int i = 1; i < tllm_cl_n_mats(cl->m); i++)
        if (cl->mats[i].group_size == 16) return 1;
    return 0;
}

int tllm_cl_pf_make(struct tllm_cl *cl) {
    struct cl_prefill *p = calloc(1, sizeof *p);
    if (!p) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    cl->pf = p;
    int rc = tllm_cl_make_kernel(cl, &p->embed, "pf_embed");
    if (!rc) rc = tllm_cl_make_kernel(cl, &p->reduce, "gemm_reduce");
    if (!rc) rc = tllm_cl_make_kernel(cl, &p->norm, "pf_norm");
    if (!rc) rc = tllm_cl_make_kernel(cl, &p->swiglu, "pf_swiglu");
    if (!rc) rc = tllm_cl_make_kernel(cl, &p->rope, "pf_rope");
    if (!rc) rc = tllm_cl_make_kernel(cl, &p->paged_rope, "paged_rope");
    if (!rc) rc = tllm_cl_make_kernel(cl, &p->argmax, "rows_argmax");
    if (!rc) rc = tllm_cl_make_kernel(cl, &p->argmax_allowed, "rows_argmax_allowed");
    if (!rc && (tllm_cl_make_kernel(cl, &p->flash, "flash_prefill") || tllm_cl_make_kernel(cl, &p->combine, "flash_combine")))
        rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: flash_prefill is compiled only with -DHEAD_DIM (TLLM_CL_OPTS overrides it)");
    if (rc) return rc;
    cl_int v[15] = {0};
    if ((rc = tllm_cl_ints_of(cl, "prefill_tunables", v, 15))) return rc;
    p->tm = v[0], p->tn = v[1], p->gt = v[2], p->lws = v[3], p->fl_qb = v[4], p->fl_lws = v[5];
    if (p->gt < 1 || p->tm % p->gt || p->tn % p->gt || p->lws < 32 || (p->lws & (p->lws - 1)) || p->fl_qb < 1 || p->fl_lws < 1)
        return tllm_fail(TLLM_ERR_ARG, "TLLM_CL_OPTS: GEMM_T, GEMM_RM, GEMM_RN positive, PF_LWS a power of two >= 32");
    p->mma_tm = v[6], p->mma_tn = v[7], p->mma_lws = v[8];
    p->few_tn = v[9], p->fl_span = v[10], p->few_lws = v[11], p->fl_emit = v[12], p->few_u = v[13], p->mma_small = v[14];
    if (p->fl_span < 1 || p->few_u < 1) return tllm_fail(TLLM_ERR_ARG, "TLLM_CL_OPTS: FL_SPAN and FEW_U positive");
    p->mm.half = model_g16(cl);
    size_t n_counts = 1 + (size_t)cl->m->cfg.n_heads + 2 * (size_t)cl->m->cfg.n_kv_heads;
    cl_int *zeros = calloc(n_counts, sizeof *zeros), e = CL_OUT_OF_HOST_MEMORY;
    if (zeros) p->counts = clCreateBuffer(cl->cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n_counts * sizeof *zeros, zeros, &e);
    free(zeros);
    if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: gemm_few's counts: %s", tllm_cl_err_name(e));
    return tllm_cl_mm_kernel(cl, &p->mm, int8_levels(cl));
}

/* Room for steps of n tokens */
static int reserve(struct tllm_cl *cl, int n) {
    struct cl_prefill *p = cl->pf;
    const struct tllm_config *c = &cl->m->cfg;
    if (p->fixed_n && (p->room_n != p->fixed_n || p->room_split != p->mm.split)) /* a loop over every GEMM: once */
        p->room = tllm_cl_mm_fixed_room(cl, &p->mm), p->room_n = p->fixed_n, p->room_split = p->mm.split;
    size_t part_tok = PF_PART * (size_t)c->dim, fixed = p->fixed_n ? p->room : 0;
    part_tok = fixed > part_tok ? fixed : part_tok;
    if (n <= p->cap && part_tok * p->cap <= p->mm.part_floats) return TLLM_OK;
    n = n > p->cap ? n : p->cap;
    cl_mem *bs[] = {&p->amax, &p->x, &p->mm.io, &p->qkv, &p->q, &p->att, &p->h, &p->mm.part};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        if (*bs[i]) clReleaseMemObject(*bs[i]), *bs[i] = NULL;
    p->cap = 0;
    size_t N = (size_t)n, q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t sizes[] = {N * 4, N * c->dim * 4, tllm_cl_mm_io_layout(&p->mm, N, (size_t)wide(c)), N * (q_dim + 2 * kv_dim) * 4,
                      N * q_dim * 4, N * q_dim * 4, N * 2 * c->ffn_dim * 4, part_tok * N * 4};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) {
        int rc = tllm_cl_device_buffer(cl, bs[i], sizes[i], "prompt activations");
        if (rc) return rc;
    }
    p->cap = n;
    p->mm.part_floats = part_tok * N;
    return TLLM_OK;
}

/* TLLM_CL_PROFILE: the chunk's events, summed by kind */
static void collect(struct tllm_cl *cl, double wall) {
    struct cl_prefill *p = cl->pf;
    for (int i = 0; i < p->n_ev; i++) {
        cl_ulong a = 0, b = 0;
        clGetEventProfilingInfo(p->ev[i], CL_PROFILING_COMMAND_START, sizeof a, &a, NULL);
        clGetEventProfilingInfo(p->ev[i], CL_PROFILING_COMMAND_END, sizeof b, &b, NULL);
        p->prof_ns[p->ev_kind[i]] += (double)(b - a);
        p->prof_n[p->ev_kind[i]]++;
        clReleaseEvent(p->ev[i]);
    }
    p->launches = p->n_ev;
    p->n_ev = 0;
    p->chunks++;
    p->prof_wall_s += wall;
}

static cl_int norm(struct tllm_cl *cl, cl_mem x, int n, int cols, int norm_off, int left) {
    return tllm_cl_mm_input(cl, &cl->pf->mm, x, 0, -1, n, cols, norm_off, left);
}

/* flash_prefill over runs [g0, g0 + runs) (paged: the step's; else runs of the chunk from g0 = 0) in
 * n_span spans; spo_off >= 0: split rows leave their spans' sums in p->spans from span base. A
 * work-group takes as many spans as keep PF_SPAN_GROUPS of them a compute unit (the same sums). */
static cl_int flash(struct tllm_cl *cl, int l, const struct cl_tokens *tk, int g0, int runs, int spo_off, int base, int n_span) {
    struct cl_prefill *p = cl->pf;
    const struct tllm_config *c = &cl->m->cfg;
    const struct cl_pages *pg = tk->pages;
    int paged = pg != NULL;
    cl_mem kc = paged ? pg->kp : cl->kt, vc = paged ? pg->vp : cl->vc, sp = p->spans ? p->spans : p->att; /* (sp unread without split rows) */
    struct args f = {p->flash, 0, CL_SUCCESS};
    ARG_MEM(&f, p->q);
    ARG_MEM(&f, kc);
    ARG_MEM(&f, vc);
    ARG_INT(&f, l);
    ARG_INT(&f, c->n_heads);
    ARG_INT(&f, c->n_kv_heads);
    ARG_INT(&f, paged ? pg->n_blocks : cl->ctx_stride);
    ARG_INT(&f, tk->pos0);
    ARG_INT(&f, tk->n);
    ARG_INT(&f, paged);
    ARG_INT(&f, paged ? pg->kv_half : 0);
    ARG_MEM(&f, p->meta);
    ARG_INT(&f, paged ? pg->grp_off : 0);
    ARG_INT(&f, g0);
    size_t wgs = (size_t)runs * c->n_kv_heads * n_span, want = (size_t)PF_SPAN_GROUPS * cl->n_cu;
    int per_wg = wgs > want ? (int)(wgs / want) : 1;
    per_wg = per_wg < n_span ? per_wg : n_span;
    ARG_INT(&f, spo_off);
    ARG_INT(&f, per_wg);
    ARG_INT(&f, base);
    ARG_MEM(&f, sp);
    ARG_MEM(&f, p->att);
    return f.err ? f.err : tllm_cl_pf_run3(cl, p->flash, (size_t)runs * p->fl_lws, (size_t)c->n_kv_heads, (size_t)(n_span + per_wg - 1) / per_wg,
                                (size_t)p->fl_lws, 1, P_FLASH);
}

/* flash_combine over tokens [t_a, t_a + n): the rows split into spans joined, and with fl_emit every row
 * left as o_proj's input (pos_off < 0: a chunk of one sequence, no row split) */
static cl_int combine(struct tllm_cl *cl, int pos_off, int spo_off, int base, int t_a, int n) {
    struct cl_prefill *p = cl->pf;
    const struct tllm_config *c = &cl->m->cfg;
    struct args j = {p->combine, 0, CL_SUCCESS};
    cl_mem sp = p->spans ? p->spans : p->att; /* (unread where no row is split) */
    ARG_MEM(&j, sp);
    ARG_MEM(&j, p->meta);
    ARG_INT(&j, pos_off);
    ARG_INT(&j, spo_off);
    ARG_INT(&j, base);
    ARG_INT(&j, t_a);
    ARG_INT(&j, c->n_heads);
    ARG_MEM(&j, p->att);
    ARG_INT(&j, p->fl_emit);
    tllm_cl_arg_mm_input(&j, &p->mm);
    return j.err ? j.err : tllm_cl_pf_run2(cl, p->combine, (size_t)c->n_heads * c->head_dim, (size_t)n, PF_COMBINE_LWS, 1, P_FLASH);
}

/* RoPE on q (into p->q) and k, then k and v into the cache, for a step's tokens in layer l (q, k, v in
 * p->qkv, or in `left` slices with their biases at bias_off: tllm_cl_mm_run) */
static cl_int rope(struct tllm_cl *cl, int l, const struct cl_tokens *tk, int left, int bias_off) {
    struct cl_prefill *p = cl->pf;
    const struct tllm_config *c = &cl->m->cfg;
    struct args a = {tk->pages ? p->paged_rope : p->rope, 0, CL_SUCCESS};
    ARG_MEM(&a, p->qkv);
    ARG_MEM(&a, p->mm.part);
    ARG_INT(&a, left);
    ARG_INT(&a, tk->n);
    ARG_MEM(&a, cl->vecs);
    ARG_INT(&a, bias_off);
    if (tk->pages) {
        tllm_cl_arg_paged_rope(&a, cl, tk, l);
    } else {
        ARG_INT(&a, c->n_heads);
        ARG_INT(&a, c->n_kv_heads);
        ARG_INT(&a, c->head_dim);
        ARG_INT(&a, tk->pos0);
        ARG_MEM(&a, cl->inv_freq);
        ARG_INT(&a, l);
        ARG_INT(&a, cl->ctx_stride);
        ARG_MEM(&a, p->q);
        ARG_MEM(&a, cl->kt);
        ARG_MEM(&a, cl->vc);
    }
    size_t pairs = (size_t)(c->n_heads + 2 * c->n_kv_heads) * (c->head_dim / 2);
    return a.err ? a.err : tllm_cl_pf_run2(cl, a.k, pairs, (size_t)tk->n, 64, 1, P_ROPE);
}

/* RoPE, K and V into the cache, and attention of a step's tokens in layer l (q, k, v in p->qkv, or in
 * `left` slices with their biases at bias_off: tllm_cl_mm_run; -1: the q, k, v GEMM did the RoPE and the cache's
 * part, gemm_few_rope) */
static cl_int attention(struct tllm_cl *cl, int l, const struct cl_tokens *tk, int left, int bias_off) {
    struct cl_prefill *p = cl->pf;
    const struct tllm_config *c = &cl->m->cfg;
    const struct cl_pages *pg = tk->pages;
    int n = tk->n, paged = pg != NULL;
    cl_int e = left < 0 ? CL_SUCCESS : rope(cl, l, tk, left, bias_off);
    if (e) return e;
    int per = p->fl_qb / (c->n_heads / c->n_kv_heads); /* tokens of a run */
    if (!paged) {
        e = flash(cl, l, tk, 0, (int)(((size_t)n + per - 1) / per), -1, 0, 1);
        return e || !p->fl_emit ? e : combine(cl, -1, -1, 0, 0, n);
    }
    /* the runs in launches whose span sums fit span_floats (each launch at least one run) */
    const int32_t *spo = tk->meta + pg->spo_off, *grp = tk->meta + pg->grp_off;
    size_t row = (size_t)c->n_heads * (c->head_dim + 2); /* floats of a span of a token */
    for (int g0 = 0, g1; g0 < pg->n_grp && !e; g0 = g1) {
        int base = spo[grp[4 * g0]];
        for (g1 = g0 + 1; g1 < pg->n_grp && (size_t)(spo[grp[4 * g1] + grp[4 * g1 + 1]] - base) * row <= p->span_floats; g1++) {}
        int t_a = grp[4 * g0], t_b = grp[4 * (g1 - 1)] + grp[4 * (g1 - 1) + 1];
        size_t need = (size_t)(spo[t_b] - base) * row;
        if (need > p->cap_spans) {
            if (p->spans) clReleaseMemObject(p->spans), p->spans = NULL;
            p->cap_spans = 0;
            size_t most = p->span_floats, cap = 2 * need < most ? 2 * need : need > most ? need : most;
            if (tllm_cl_device_buffer(cl, &p->spans, cap * 4, "attention spans")) return CL_MEM_OBJECT_ALLOCATION_FAILURE;
            p->cap_spans = cap;
        }
        e = flash(cl, l, tk, g0, g1 - g0, pg->spo_off, base, pg->max_pos / p->fl_span + 1);
        if (!e && (need || p->fl_emit)) e = combine(cl, pg->pos_off, pg->spo_off, base, t_a, t_b - t_a);
    }
    return e;
}

/* Layer l for the step's tokens. *pending: slices of the last GEMM that adds into x (the layer
 * before's down_proj), summed into x by the first norm (-1: that GEMM did the norm: tllm_cl_mm_run); on return,
 * this layer's (0: none: the last layer leaves x whole for the outputs). Slices go to the next kernel wherever it can sum them, saving
 * gemm_reduce's launch (4 a layer when every GEMM splits). */
static cl_int layer(struct tllm_cl *cl, int l, const struct cl_tokens *tk, int *pending) {
    struct cl_prefill *p = cl->pf;
    const struct tllm_model *m = cl->m;
    const struct tllm_config *c = &m->cfg;
    const struct tllm_layer *L = &m->layers[l];
    struct cl_layer *D = &cl->layers[l];
    int n = tk->n, q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim, ld_qkv = q_dim + 2 * kv_dim;
    int bq = (int)(L->bq - m->vectors), left = 0, last = l + 1 == c->n_layers;
    cl_int e = *pending < 0 ? CL_SUCCESS : norm(cl, p->x, n, c->dim, (int)(L->attn_norm - m->vectors), *pending);
    const struct cl_weights *qkv[3] = {&D->wq, &D->wk, &D->wv}, *gate_up[2] = {&D->gate, &D->up};
    if (!e && tllm_cl_mm_stackable(&p->mm, qkv, 3) && L->bk == L->bq + q_dim && L->bv == L->bk + kv_dim) { /* one launch */
        struct pf_next rope_next = {PF_NEXT_ROPE, 0, tk, l};
        e = tllm_cl_mm_run(cl, &p->mm, qkv, 3, n, bq, p->qkv, 0, ld_qkv, 0, P_QKV, &left, &rope_next);
    } else if (!e) {
        e = tllm_cl_gemm(cl, &D->wq, n, bq, p->qkv, 0, ld_qkv, 0, P_QKV);
        if (!e) e = tllm_cl_gemm(cl, &D->wk, n, (int)(L->bk - m->vectors), p->qkv, q_dim, ld_qkv, 0, P_QKV);
        if (!e) e = tllm_cl_gemm(cl, &D->wv, n, (int)(L->bv - m->vectors), p->qkv, q_dim + kv_dim, ld_qkv, 0, P_QKV);
    }
    if (!e) e = attention(cl, l, tk, left, bq);
    if (!e && !p->fl_emit) e = norm(cl, p->att, n, q_dim, -1, 0); /* (else flash_combine left it as o_proj's input) */
    const struct cl_weights *wo = &D->wo;
    int ffn_norm = (int)(L->ffn_norm - m->vectors);
    struct pf_next norm_next = {PF_NEXT_NORM, ffn_norm, NULL, 0};
    if (!e) e = tllm_cl_mm_run(cl, &p->mm, &wo, 1, n, -1, p->x, 0, c->dim, 1, P_O, &left, &norm_next);
    if (!e && left >= 0) e = norm(cl, p->x, n, c->dim, ffn_norm, left);
    if (!e && tllm_cl_mm_stackable(&p->mm, gate_up, 2)) {
        e = tllm_cl_mm_run(cl, &p->mm, gate_up, 2, n, -1, p->h, 0, 2 * c->ffn_dim, 0, P_GATE_UP, &left, NULL);
    } else if (!e) {
        left = 0;
        e = tllm_cl_gemm(cl, &D->gate, n, -1, p->h, 0, 2 * c->ffn_dim, 0, P_GATE_UP);
        if (!e) e = tllm_cl_gemm(cl, &D->up, n, -1, p->h, c->ffn_dim, 2 * c->ffn_dim, 0, P_GATE_UP);
    }
    if (!e) {
        struct args a = {p->swiglu, 0, CL_SUCCESS};
        ARG_MEM(&a, p->h);
        ARG_INT(&a, c->ffn_dim);
        ARG_MEM(&a, p->mm.part);
        ARG_INT(&a, left);
        ARG_INT(&a, n);
        tllm_cl_arg_mm_input(&a, &p->mm);
        e = a.err ? a.err : tllm_cl_pf_run2(cl, p->swiglu, (size_t)c->ffn_dim, (size_t)n, (size_t)p->lws, 1, P_SWIGLU);
    }
    const struct cl_weights *down = &D->down;
    struct pf_next next_norm = {PF_NEXT_NORM, last ? -1 : (int)(m->layers[l + 1].attn_norm - m->vectors), NULL, 0};
    if (!e) e = tllm_cl_mm_run(cl, &p->mm, &down, 1, n, -1, p->x, 0, c->dim, 1, P_DOWN, last ? NULL : pending, last ? NULL : &next_norm);
    if (last) *pending = 0;
    return e;
}

/* The logits (or argmaxes) of the wanted tokens: in a chunk of one sequence with one wanted, the decode
 * path's lm_head (a matvec, with its argmax); else lm_head GEMMs over windows of PF_LOGIT_ROWS of the
 * wanted rows, each row's logits whatever window it lands in */
static cl_int outputs(struct tllm_cl *cl, const struct cl_tokens *tk) {
    struct cl_prefill *p = cl->pf;
    const struct tllm_config *c = &cl->m->cfg;
    size_t vocab = (size_t)c->vocab_size;
    cl_int e = CL_SUCCESS;
    if (tk->n_out == 1 && !tk->pages) {
        int t = tk->meta[tk->rows_off];
        e = clEnqueueCopyBuffer(cl->q, p->x, cl->x, (size_t)t * c->dim * 4, 0, (size_t)c->dim * 4, 0, NULL, NULL);
        if (!e) e = clEnqueueNDRangeKernel(cl->q, cl->l_lm_head.k, 1, NULL, cl->l_lm_head.global, cl->l_lm_head.local, 0, NULL, NULL);
        if (!e && tk->argmax) {
            cl_int res[2];
            e = clEnqueueNDRangeKernel(cl->q, cl->l_argmax.k, 1, NULL, cl->l_argmax.global, cl->l_argmax.local, 0, NULL, NULL);
            if (!e) e = clEnqueueReadBuffer(cl->q, cl->next, CL_TRUE, 0, sizeof res, res, 0, NULL, NULL);
            if (!e) tk->argmax[0] = res[0];
        }
        if (!e && tk->logits) e = clEnqueueReadBuffer(cl->q, cl->logits, CL_TRUE, 0, vocab * 4, tk->logits, 0, NULL, NULL);
        return e;
    }
    if (!p->logits) {
        p->logits = clCreateBuffer(cl->cx, CL_MEM_READ_WRITE, PF_LOGIT_ROWS * vocab * 4, NULL, &e);
        if (e != CL_SUCCESS) return e;
    }
    for (int w0 = 0; w0 < tk->n_out && !e; w0 += PF_LOGIT_ROWS) {
        int nw = tk->n_out - w0 < PF_LOGIT_ROWS ? tk->n_out - w0 : PF_LOGIT_ROWS;
        e = tllm_cl_mm_input(cl, &p->mm, p->x, 0, tk->rows_off + w0, nw, c->dim, (int)(cl->m->final_norm - cl->m->vectors), 0);
        if (!e) e = tllm_cl_gemm(cl, &cl->lm_head, nw, -1, p->logits, 0, c->vocab_size, 0, P_LM_HEAD);
        if (!e && tk->argmax) {
            cl_kernel k = tk->mask ? p->argmax_allowed : p->argmax;
            struct args a = {k, 0, CL_SUCCESS};
            ARG_MEM(&a, p->logits);
            ARG_INT(&a, c->vocab_size);
            ARG_INT(&a, cl->m->n_sample < c->vocab_size ? cl->m->n_sample : c->vocab_size);
            ARG_MEM(&a, p->amax);
            ARG_INT(&a, w0);
            if (tk->mask) {
                ARG_MEM(&a, p->allow);
                ARG_MEM(&a, p->mask);
                ARG_INT(&a, TLLM_MASK_WORDS(c->vocab_size));
            }
            e = a.err ? a.err : tllm_cl_pf_run2(cl, k, (size_t)cl->t.mv_lws, (size_t)nw, (size_t)cl->t.mv_lws, 1, P_LM_HEAD);
        }
        /* the rows wanted, in runs of consecutive rows (queued: the step's clFinish waits for them) */
        for (int j0 = 0, j1; tk->logits && j0 < nw && !e; j0 = j1) {
            int want = !tk->want_logits || tk->want_logits[w0 + j0];
            for (j1 = j0 + 1; j1 < nw && (!tk->want_logits || tk->want_logits[w0 + j1]) == want; j1++) {}
            if (want)
                e = clEnqueueReadBuffer(cl->q, p->logits, CL_FALSE, (size_t)j0 * vocab * 4, (size_t)(j1 - j0) * vocab * 4,
                                        tk->logits + (size_t)(w0 + j0) * vocab, 0, NULL, NULL);
        }
    }
    if (!e && tk->argmax) e = clEnqueueReadBuffer(cl->q, p->amax, CL_FALSE, 0, (size_t)tk->n_out * 4, tk->argmax, 0, NULL, NULL);
    return e;
}

int tllm_cl_flash_rows(struct tllm_cl *cl) {
    if (!cl->pf && tllm_cl_pf_make(cl)) return 0;
    return cl->pf->fl_qb;
}

int tllm_cl_flash_span(struct tllm_cl *cl) {
    if (!cl->pf && tllm_cl_pf_make(cl)) return 0;
    return cl->pf->fl_span;
}

/* A buffer of a step's data with room for n_ints 32-bit words (*cap: what it holds) */
static int room(struct tllm_cl *cl, cl_mem *b, size_t *cap, size_t n_ints, const char *what) {
    if (n_ints <= *cap) return TLLM_OK;
    if (*b) clReleaseMemObject(*b), *b = NULL;
    *cap = 0;
    size_t n = n_ints < 4096 ? 4096 : n_ints + n_ints / 2;
    int rc = tllm_cl_device_buffer(cl, b, n * 4, what);
    if (!rc) *cap = n;
    return rc;
}

/* The wanted rows' mask indexes and their bitsets onto the device (queued; the step's clFinish comes
 * before the caller's arrays change) */
static int upload_masks(struct tllm_cl *cl, const struct cl_tokens *tk) {
    struct cl_prefill *p = cl->pf;
    int n_masks = 0;
    for (int j = 0; j < tk->n_out; j++)
        if (tk->mask[j] >= n_masks) n_masks = tk->mask[j] + 1;
    size_t words = (size_t)n_masks * TLLM_MASK_WORDS(cl->m->cfg.vocab_size);
    int rc = room(cl, &p->mask, &p->cap_mask, (size_t)tk->n_out, "a step's masks");
    if (!rc) rc = room(cl, &p->allow, &p->cap_allow, words, "a step's allowed ids");
    if (rc) return rc;
    cl_int e = clEnqueueWriteBuffer(cl->q, p->mask, CL_FALSE, 0, (size_t)tk->n_out * 4, tk->mask, 0, NULL, NULL);
    if (!e && words) e = clEnqueueWriteBuffer(cl->q, p->allow, CL_FALSE, 0, words * 4, tk->allow, 0, NULL, NULL);
    return e ? tllm_fail(TLLM_ERR_IO, "opencl: a step's masks on %s: %s (%d)", cl->name, tllm_cl_err_name(e), e) : TLLM_OK;
}

/* A step's masks made on a thread of their own while this one queues the layers: NVIDIA's OpenCL takes
 * 4-6 us of the host's time a launch, so a step of ~270 launches keeps the host busy about as long as
 * the device, and masks made after the last launch (as before) added their whole time to the step
 * (H200, 0.5B, 64 sequences under a small object schema: 0.63-0.65 of free decode). The scheduler's
 * fill_masks touches only its own and the grammars' state, never the device's. */
struct mask_job {
    const struct cl_tokens *tk;
    const int32_t *mask;
    const uint32_t *allow;
    int rc;
    char msg[512]; /* the error message is the thread's own */
};

static void *mask_job_run(void *arg) {
    struct mask_job *j = arg;
    j->rc = j->tk->fill_masks(j->tk->user, &j->mask, &j->allow);
    if (j->rc) snprintf(j->msg, sizeof j->msg, "%s", tllm_errmsg());
    return NULL;
}

int tllm_cl_tokens(struct tllm_cl *cl, const struct cl_tokens *tk0) {
    struct cl_tokens t = *tk0; /* its masks may come once the layers are queued */
    const struct cl_tokens *tk = &t;
    const struct tllm_config *c = &cl->m->cfg;
    const char *why = tllm_cl_prefill_refusal(cl);
    if (why) return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: steps of many tokens cannot run on %s: %s", cl->name, why);
    int rc = cl->pf ? TLLM_OK : tllm_cl_pf_make(cl);
    if (rc) return rc;
    struct cl_prefill *p = cl->pf;
    int lv = p->mm.int8 ? model_levels(cl) : 0; /* the model's choice may change between steps */
    if (lv != p->mm.int8 && (rc = tllm_cl_mm_kernel(cl, &p->mm, lv))) return rc;
    p->mm.split = tllm_cl_split_asked();
    const char *sf = getenv("TLLM_CL_SPAN_FLOATS");
    p->span_floats = sf && atol(sf) > 0 ? (size_t)atol(sf) : PF_SPAN_FLOATS;
    p->fixed_n = tk->pages ? tk->pages->fixed_n : 0;
    if ((rc = reserve(cl, tk->n)) || (rc = room(cl, &p->meta, &p->cap_meta, (size_t)tk->n_meta, "a step's tables"))) return rc;
    if (tk->mask && tk->argmax && tk->n_out && (rc = upload_masks(cl, tk))) return rc;
    double t0 = cl->profile || cl->host_times ? tllm_now() : 0;
    struct mask_job job = {.tk = tk0};
    pthread_t helper;
    int masks_later = tk->fill_masks && tk->argmax && tk->n_out, helped = masks_later && !pthread_create(&helper, NULL, mask_job_run, &job);
    cl_int e = clEnqueueWriteBuffer(cl->q, p->meta, CL_FALSE, 0, (size_t)tk->n_meta * 4, tk->meta, 0, NULL, NULL);
    if (!e) {
        struct args a = {p->embed, 0, CL_SUCCESS};
        arg_weights(&a, &cl->embed);
        ARG_INT(&a, c->dim);
        ARG_MEM(&a, p->meta); /* the ids come first */
        ARG_INT(&a, tk->n);
        ARG_INT(&a, c->vocab_size);
        ARG_MEM(&a, p->x);
        e = a.err ? a.err : tllm_cl_pf_run2(cl, p->embed, (size_t)c->dim, (size_t)tk->n, 64, 1, P_EMBED);
    }
    int pending = 0;
    for (int l = 0; l < c->n_layers && !e; l++) e = layer(cl, l, tk, &pending);
    /* the device starts on the layers before the host waits for the masks, not once they are made */
    if (!e && masks_later) e = clFlush(cl->q);
    if (helped) { /* the masks, made meanwhile */
        pthread_join(helper, NULL);
        rc = job.rc ? tllm_fail(job.rc, "%s", job.msg) : TLLM_OK;
        t.mask = job.mask, t.allow = job.allow;
    }
    if (!e && masks_later) { /* the device runs the layers meanwhile */
        if (!rc && !helped) rc = tk->fill_masks(tk->user, &t.mask, &t.allow); /* no thread: made here */
        if (!e && !rc && t.mask) rc = upload_masks(cl, tk);
        if (rc) {
            clFinish(cl->q); /* nothing queued may outlive the step's buffers */
            p->fixed_n = 0;
            return rc;
        }
    }
    if (!e && tk->n_out) e = outputs(cl, tk);
    double t1 = cl->host_times ? tllm_now() : 0;
    if (!e) e = clFinish(cl->q); /* also: meta's host copy is read */
    if (cl->host_times) {
        p->host_queue_s += t1 - t0;
        p->host_wait_s += tllm_now() - t1;
        p->host_steps++;
    }
    p->fixed_n = 0;
    if (cl->profile) {
        p->tokens += tk->n;
        collect(cl, tllm_now() - t0);
    }
    if (e) return tllm_fail(TLLM_ERR_IO, "opencl: a step of %d tokens on %s: %s (%d)", tk->n, cl->name, tllm_cl_err_name(e), e);
    for (int j = 0; tk->argmax && j < tk->n_out; j++)
        if ((tk->argmax[j] < 0 || tk->argmax[j] >= c->vocab_size) && !(tk->mask && tk->mask[j] >= 0))
            return tllm_fail(TLLM_ERR_FORMAT, "opencl: no finite logit for token %d of the step", tk->meta[tk->rows_off + j]);
    return TLLM_OK;
}

int tllm_cl_prefill(struct tllm_cl *cl, const int32_t *ids, int n, int pos0, const int8_t *out, float *logits, int32_t *argmax) {
    if (cl->pend_n) return tllm_fail(TLLM_ERR_ARG, "opencl: a prompt step while %d greedy steps are pending", cl->pend_n);
    if (n < 1 || pos0 < 0 || pos0 > cl->n_ctx - n)
        return tllm_fail(TLLM_ERR_LIMIT, "opencl: positions %d to %d outside the cache of %d", pos0, pos0 + n, cl->n_ctx);
    int32_t *meta = malloc(2 * (size_t)n * sizeof *meta); /* the ids, then the wanted rows */
    if (!meta) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    memcpy(meta, ids, (size_t)n * sizeof *meta);
    int n_out = 0;
    for (int t = 0; out && (logits || argmax) && t < n; t++)
        if (out[t]) meta[n + n_out++] = t;
    struct cl_tokens tk = {.n = n, .meta = meta, .n_meta = n + n_out, .pos0 = pos0, .rows_off = n, .n_out = n_out,
                           .logits = logits, .argmax = argmax};
    int rc = tllm_cl_tokens(cl, &tk);
    free(meta);
    return rc;
}
