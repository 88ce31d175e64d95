/* The GEMMs of a step of many tokens on the device (cl_prefill.c runs the layers): which kernel takes a step
 * (the tiled GEMMs of kernels/opencl/gemm.cl, gemm_few and its fused epilogues for steps of a few tokens),
 * how K is split, where the input lies, the launches themselves (timed for TLLM_CL_PROFILE); and
 * tllm_cl_matmul, one GEMM on its own for the tests and `tllm bench-gemm`. */
#include "engine/backend/opencl/cl_prefill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"

/* TLLM_CL_SPLIT, read once a call (tests change it between calls) */
int tllm_cl_split_asked(void) {
    const char *s = getenv("TLLM_CL_SPLIT");
    return s ? atoi(s) : 0;
}

/* The tokens of gemm_q8_mma's small tiles (gemm_q8_mma_t16*, _t32*: kernels/opencl/gemm.cl), smallest first */
static const int small_tn[PF_MMA_SMALL] = {16, 32};

/* mm's kernels released (each NULL after; its buffers are the caller's) */
void tllm_cl_mm_release(struct pf_mm *mm) {
    cl_kernel *ks[] = {&mm->k, &mm->k16, &mm->few, &mm->few_norm, &mm->few_rope};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        if (*ks[i]) clReleaseKernel(*ks[i]), *ks[i] = NULL;
    for (int i = 0; i < PF_MMA_SMALL; i++) {
        if (mm->ks[i]) clReleaseKernel(mm->ks[i]), mm->ks[i] = NULL;
        if (mm->ks16[i]) clReleaseKernel(mm->ks16[i]), mm->ks16[i] = NULL;
    }
}

/* The largest step of tokens gemm_few takes (TLLM_CL_FEW_TN=N asks for N): its own largest (FEW_TN), but
 * where the tiles of 16 tokens are there, none or one in models with large layers (PF_FEW1_LAYER_MIB) */
static int few_steps(const struct tllm_cl *cl, const struct pf_mm *mm) {
    int n = cl->pf->few_tn;
    const char *s = getenv("TLLM_CL_FEW_TN");
    if (s) {
        int asked = atoi(s);
        return asked < 0 ? 0 : asked < n ? asked : n;
    }
    if (!mm->ks[0] || !cl->mats || tllm_cl_n_mats(cl->m) < 9) return n;
    size_t layer = 0; /* layer 0's seven matrices as the device holds them */
    for (int k = 2; k < 9; k++) layer += tllm_qw_nbytes(&cl->mats[k]);
    if (layer > ((size_t)PF_FEW1_LAYER_MIB << 20)) return 0;
    return layer > ((size_t)PF_FEW2_LAYER_MIB << 20) && n > 1 ? 1 : n;
}

/* mm's kernel for int8 (in int8 levels) or float inputs (on NVIDIA, int8 on the tensor cores unless TLLM_CL_NO_MMA) */
int tllm_cl_mm_kernel(struct tllm_cl *cl, struct pf_mm *mm, int int8) {
    const struct cl_prefill *p = cl->pf;
    mm->int8 = int8, mm->mma = int8 && p->mma_tm > 0 && !getenv("TLLM_CL_NO_MMA");
    mm->tm = mm->mma ? p->mma_tm : p->tm, mm->tn = mm->mma ? p->mma_tn : p->tn, mm->gt = mm->mma ? p->mma_lws : p->gt;
    const char *name = mm->mma ? (int8 == 2 ? "gemm_q8_mma_2" : "gemm_q8_mma") : int8 == 2 ? "gemm_q8_2" : int8 ? "gemm_q8" : "gemm_f";
    tllm_cl_mm_release(mm);
    int rc = tllm_cl_make_kernel(cl, &mm->k, name);
    if (!rc && int8 && mm->half) {
        char n16[32];
        snprintf(n16, sizeof n16, "%s_g16", name);
        rc = tllm_cl_make_kernel(cl, &mm->k16, n16);
    }
    for (int i = 0; !rc && mm->mma && p->mma_small && !getenv("TLLM_CL_NO_MMA_S") && i < PF_MMA_SMALL; i++) {
        if (small_tn[i] == 32 && getenv("TLLM_CL_NO_MMA_32")) continue;
        char ns[40];
        snprintf(ns, sizeof ns, "gemm_q8_mma_t%d%s", small_tn[i], int8 == 2 ? "_2" : "");
        rc = tllm_cl_make_kernel(cl, &mm->ks[i], ns);
        if (!rc && mm->half) rc = tllm_cl_make_kernel(cl, &mm->ks16[i], strcat(ns, "_g16"));
    }
    mm->few_n = int8 && !getenv("TLLM_CL_NO_FEW") ? few_steps(cl, mm) : 0;
    if (!rc && mm->few_n > 0) rc = tllm_cl_make_kernel(cl, &mm->few, int8 == 2 ? "gemm_few_2" : "gemm_few");
    if (!rc && mm->few && p->counts && p->lws <= p->few_lws && !getenv("TLLM_CL_NO_FEW_NORM"))
        rc = tllm_cl_make_kernel(cl, &mm->few_norm, int8 == 2 ? "gemm_few_norm_2" : "gemm_few_norm");
    if (!rc && mm->few && p->counts && !getenv("TLLM_CL_NO_FEW_ROPE"))
        rc = tllm_cl_make_kernel(cl, &mm->few_rope, int8 == 2 ? "gemm_few_rope_2" : "gemm_few_rope");
    return rc;
}

/* Split-K slices for a GEMM of rows x cols over n tokens: enough for two work-groups per compute unit,
 * each slice at least PF_SPLIT_MIN_STEPS staging steps, as many as the slices' buffer holds (1: none; TLLM_CL_SPLIT=N
 * asks for N, TLLM_CL_SPLIT=1 for none). With fixed_n, as for fixed_n tokens whatever n is (and the
 * buffer made to hold them: tllm_cl_mm_fixed_room): a token's sums are then added in the same order in any step. */
static int splits(const struct tllm_cl *cl, const struct pf_mm *mm, int rows, int cols, size_t n) {
    int fixed = cl->pf->fixed_n;
    size_t tiles = ((size_t)rows + mm->tm - 1) / mm->tm * (((fixed ? (size_t)fixed : n) + mm->tn - 1) / mm->tn);
    size_t want = (2 * (size_t)cl->n_cu + tiles - 1) / tiles, steps = ((size_t)cols + 63) / 64;
    size_t room = fixed ? SIZE_MAX : mm->part_floats / (n * (size_t)rows);
    size_t s = want < steps / PF_SPLIT_MIN_STEPS ? want : steps / PF_SPLIT_MIN_STEPS;
    if (mm->split > 0) s = (size_t)mm->split < steps ? (size_t)mm->split : steps;
    s = s < room ? s : room;
    return s > 1 ? (int)s : 1;
}

/* Floats a token's slices take in the GEMM that splits most (fixed_n set) */
size_t tllm_cl_mm_fixed_room(const struct tllm_cl *cl, const struct pf_mm *mm) {
    const size_t n = 1; /* any: the split does not depend on it */
    size_t most = 0;
    for (int l = 0; l < cl->m->cfg.n_layers; l++) {
        const struct cl_layer *D = &cl->layers[l];
        const struct cl_weights *ws[] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->gate, &D->up, &D->down};
        int rows[9], cols[9]; /* each matrix, and the stacks layer() may launch */
        for (int i = 0; i < 7; i++) rows[i] = ws[i]->rows, cols[i] = ws[i]->cols;
        rows[7] = D->wq.rows + D->wk.rows + D->wv.rows, cols[7] = D->wq.cols;
        rows[8] = D->gate.rows + D->up.rows, cols[8] = D->gate.cols;
        for (int i = 0; i < 9; i++) {
            int sp = splits(cl, mm, rows[i], cols[i], n);
            if (sp > 1 && (size_t)sp * rows[i] > most) most = (size_t)sp * rows[i];
        }
    }
    int sp = splits(cl, mm, cl->lm_head.rows, cl->lm_head.cols, n);
    if (sp > 1 && (size_t)sp * cl->lm_head.rows > most) most = (size_t)sp * cl->lm_head.rows;
    return most;
}

/* Lays out mm's input buffer for n tokens of cols inputs (mm->o_*); its size in bytes */
size_t tllm_cl_mm_io_layout(struct pf_mm *mm, size_t n, size_t cols) {
    size_t at = 0, lens[4] = {n * cols * 4, n * cols / 32 * 4, n * cols / 32 * 4, mm->half ? n * cols / 16 * 4 : 0};
    size_t *offs[4] = {&mm->o_in, &mm->o_xd, &mm->o_xs, &mm->o_xh};
    for (int i = 0; i < 4; i++) {
        *offs[i] = at;
        at = (at + lens[i] + 255) / 256 * 256; /* each part on its own lines */
    }
    if (!mm->half) mm->o_xh = mm->o_xs; /* (unread) */
    return at;
}

static size_t round_up(size_t a, size_t b) { return (a + b - 1) / b * b; }

/* A launch over [g0 x g1 x g2] work-items in groups of [l0 x l1 x 1] (g0, g1 rounded up) */
cl_int tllm_cl_pf_run3(struct tllm_cl *cl, cl_kernel k, size_t g0, size_t g1, size_t g2, size_t l0, size_t l1, int kind) {
    struct cl_prefill *p = cl->pf;
    size_t g[3] = {round_up(g0, l0), round_up(g1, l1), g2}, l[3] = {l0, l1, 1};
    cl_event *ev = NULL;
    if (cl->profile) {
        if (p->n_ev == p->cap_ev) {
            int cap = p->cap_ev ? 2 * p->cap_ev : 512;
            cl_event *ne = realloc(p->ev, (size_t)cap * sizeof *ne);
            int *nk = ne ? realloc(p->ev_kind, (size_t)cap * sizeof *nk) : NULL;
            if (ne) p->ev = ne;
            if (!nk) return CL_OUT_OF_HOST_MEMORY;
            p->ev_kind = nk, p->cap_ev = cap;
        }
        p->ev_kind[p->n_ev] = kind;
        ev = &p->ev[p->n_ev++];
    }
    if (!cl->host_times) return clEnqueueNDRangeKernel(cl->q, k, 3, NULL, g, l, 0, NULL, ev);
    double t0 = tllm_now();
    cl_int e = clEnqueueNDRangeKernel(cl->q, k, 3, NULL, g, l, 0, NULL, ev);
    double dt = tllm_now() - t0;
    p->host_enq_s += dt, p->host_enq_kind_s[kind] += dt;
    p->host_launches++, p->host_launches_kind[kind]++;
    return e;
}

cl_int tllm_cl_pf_run2(struct tllm_cl *cl, cl_kernel k, size_t g0, size_t g1, size_t l0, size_t l1, int kind) {
    return tllm_cl_pf_run3(cl, k, g0, g1, 1, l0, l1, kind);
}

/* paged_rope's arguments after qkv's (PAGED_ROPE_ARGS in kernels/opencl/paged.cl): the step's tables, layer l's
 * pool */
void tllm_cl_arg_paged_rope(struct args *a, struct tllm_cl *cl, const struct cl_tokens *tk, int l) {
    const struct tllm_config *c = &cl->m->cfg;
    const struct cl_pages *pg = tk->pages;
    ARG_INT(a, c->n_heads);
    ARG_INT(a, c->n_kv_heads);
    ARG_INT(a, c->head_dim);
    ARG_MEM(a, cl->pf->meta);
    ARG_INT(a, pg->pos_off);
    ARG_INT(a, pg->slot_off);
    ARG_MEM(a, cl->inv_freq);
    ARG_INT(a, l);
    ARG_INT(a, pg->n_blocks);
    ARG_INT(a, pg->kv_half);
    ARG_MEM(a, cl->pf->q);
    ARG_MEM(a, pg->kp);
    ARG_MEM(a, pg->vp);
}

/* y[t][y_off + r] (+)= W . input[t] (+ bias) for n tokens (the input: mm's, as the last pf_norm or
 * pf_swiglu left it); W: the n_w (1 to 3) matrices of ws stacked by rows (tllm_cl_mm_stackable). left != NULL
 * (y_off 0, ldy the rows): split-K's slices may be left in mm->part for the next kernel to sum
 * (gemm_in in kernels/opencl/gemm.cl), *left their count (0: y holds the result). next (left != NULL;
 * NULL: none): what comes after, done by this launch where gemm_few takes the step, *left then -1: a norm
 * (y the residual, add; steps of one token), norm(y, norm_off, *left), by gemm_few_norm's last work-group
 * (y whole, and normalized as mm's input); paged_rope's work (q, k, v of a paged step; y = qkv) by
 * gemm_few_rope */
cl_int tllm_cl_mm_run(struct tllm_cl *cl, const struct pf_mm *mm, const struct cl_weights *const *ws, int n_w, int n, int bias_off,
                     cl_mem y, int y_off, int ldy, int add, int kind, int *left, const struct pf_next *next) {
    struct cl_prefill *p = cl->pf;
    const struct cl_weights *w = ws[0];
    int rows_a = ws[0]->rows, rows_ab = rows_a + (n_w > 1 ? ws[1]->rows : 0), rows = rows_ab + (n_w > 2 ? ws[2]->rows : 0);
    int g16 = mm->int8 && w->gs == 16;
    /* a step of few tokens in gemm_q8_mma's smallest tiles that hold it (the split and the sums as in its
     * large ones) */
    cl_kernel ks = NULL;
    size_t tn = (size_t)mm->tn;
    for (int i = PF_MMA_SMALL - 1; i >= 0; i--)
        if ((g16 ? mm->ks16[i] : mm->ks[i]) && n <= small_tn[i]) ks = g16 ? mm->ks16[i] : mm->ks[i], tn = (size_t)small_tn[i];
    size_t groups_r = ((size_t)rows + mm->tm - 1) / mm->tm, groups_t = ((size_t)n + tn - 1) / tn;
    int n_split = splits(cl, mm, rows, w->cols, (size_t)n);
    int steps = (w->cols + 63) / 64, k_len = (steps + n_split - 1) / n_split * 64;
    n_split = (w->cols + k_len - 1) / k_len;
    int few = mm->few && n <= mm->few_n; /* gemm_few: the same sums, read as a matvec reads */
    int at_y = few && next && left && y_off == 0 && ldy == rows; /* (the epilogues read y as [n][rows]) */
    /* the norm by one work-group: one token's row (H100, 7B, two sequences: 169 tok/s with pf_norm's launch, 155
     * with the norm of both rows in gemm_few_norm) */
    int fuse_norm = at_y && mm->few_norm && next->what == PF_NEXT_NORM && add && n == 1;
    int fuse_rope = at_y && mm->few_rope && next->what == PF_NEXT_ROPE && !add && n_w == 3 && next->tk->pages;
    int fuse = fuse_norm || fuse_rope;
    cl_kernel k = fuse_norm ? mm->few_norm : fuse_rope ? mm->few_rope : few ? mm->few : ks ? ks : g16 ? mm->k16 : mm->k;
    struct args a = {k, 0, CL_SUCCESS};
    ARG_MEM(&a, w->base); /* every matrix of a stack's (tllm_cl_mm_stackable) */
    arg_woff(&a, w);
    arg_woff(&a, ws[n_w > 1]);
    arg_woff(&a, ws[n_w > 2 ? 2 : 0]);
    ARG_INT(&a, rows_a);
    ARG_INT(&a, rows_ab);
    ARG_INT(&a, rows);
    ARG_INT(&a, w->cols);
    ARG_INT(&a, n);
    ARG_MEM(&a, mm->io);
    ARG_U64(&a, mm->o_in);
    if (mm->int8) {
        ARG_U64(&a, mm->o_xd);
        ARG_U64(&a, mm->o_xs);
        ARG_U64(&a, mm->o_xh);
    }
    ARG_MEM(&a, cl->vecs);
    ARG_INT(&a, bias_off);
    ARG_MEM(&a, y);
    ARG_INT(&a, y_off);
    ARG_INT(&a, ldy);
    ARG_INT(&a, add);
    ARG_MEM(&a, mm->part);
    ARG_INT(&a, k_len);
    cl_int e;
    if (few) {
        /* the terms the GEMMs add: a half block (groups of 16), a step of two blocks (gemm_q8_mma's groups
         * of 64 or more), or a block */
        int unit = g16 ? 2 : mm->mma && w->gs % 64 == 0 ? 1 : 0;
        int units = k_len / 64 * (unit == 2 ? 4 : unit ? 1 : 2), tr = p->few_u * p->few_lws / units; /* rows a work-group */
        tr = tr < 1 ? 1 : tr > p->few_lws / p->few_tn ? p->few_lws / p->few_tn : tr;
        ARG_INT(&a, unit);
        ARG_INT(&a, tr);
        if (fuse) ARG_MEM(&a, p->counts);
        if (fuse_norm) {
            ARG_INT(&a, next->norm_off);
            ARG_F32(&a, cl->m->cfg.norm_eps);
            ARG_INT(&a, mm->int8);
            ARG_INT(&a, mm->half);
        } else if (fuse_rope) {
            tllm_cl_arg_paged_rope(&a, cl, next->tk, next->layer);
        }
        e = a.err ? a.err : tllm_cl_pf_run3(cl, k, ((size_t)rows + tr - 1) / tr * p->few_lws, 1, (size_t)n_split, (size_t)p->few_lws, 1, kind);
    } else if (a.err) {
        e = a.err;
    } else {
        e = mm->mma ? tllm_cl_pf_run3(cl, k, groups_r * mm->gt, groups_t, (size_t)n_split, mm->gt, 1, kind)
                    : tllm_cl_pf_run3(cl, k, groups_r * mm->gt, groups_t * mm->gt, (size_t)n_split, mm->gt, mm->gt, kind);
    }
    if (left) *left = fuse ? -1 : 0;
    if (e || fuse || n_split == 1) return e;
    if (left) return *left = n_split, CL_SUCCESS;
    struct args r = {p->reduce, 0, CL_SUCCESS};
    ARG_MEM(&r, mm->part);
    ARG_INT(&r, n_split);
    ARG_INT(&r, rows);
    ARG_INT(&r, n);
    ARG_MEM(&r, cl->vecs);
    ARG_INT(&r, bias_off);
    ARG_MEM(&r, y);
    ARG_INT(&r, y_off);
    ARG_INT(&r, ldy);
    ARG_INT(&r, add);
    return r.err ? r.err : tllm_cl_pf_run2(cl, p->reduce, (size_t)rows, (size_t)n, 64, 1, kind);
}

cl_int tllm_cl_gemm(struct tllm_cl *cl, const struct cl_weights *w, int n, int bias_off, cl_mem y, int y_off, int ldy, int add,
                   int kind) {
    return tllm_cl_mm_run(cl, &cl->pf->mm, &w, 1, n, bias_off, y, y_off, ldy, add, kind, NULL, NULL);
}

/* Whether matrices can be one GEMM launch (tllm_cl_mm_run): one buffer, one format, and each but the last whole
 * tiles of rows */
int tllm_cl_mm_stackable(const struct pf_mm *mm, const struct cl_weights *const *ws, int n_w) {
    for (int i = 0; i < n_w; i++)
        if (ws[i]->base != ws[0]->base || ws[i]->bits != ws[0]->bits || ws[i]->gs != ws[0]->gs || ws[i]->dt != ws[0]->dt ||
            ws[i]->cols != ws[0]->cols || (i + 1 < n_w && ws[i]->rows % mm->tm))
            return 0;
    return 1;
}

/* The last arguments of pf_norm and pf_swiglu: where they leave mm's input */
void tllm_cl_arg_mm_input(struct args *a, const struct pf_mm *mm) {
    ARG_INT(a, mm->int8);
    ARG_MEM(a, mm->io);
    ARG_U64(a, mm->o_in); /* floats or int8 */
    ARG_U64(a, mm->o_xd);
    ARG_U64(a, mm->o_xs);
    ARG_INT(a, mm->half);
    ARG_U64(a, mm->o_xh);
}

/* mm's input: rows [t_off, t_off + n) of x ([n][cols]), or (rows_off >= 0) rows meta[rows_off ..] of it,
 * normalized by the weight at norm_off (< 0: none); left > 1: first x += the slices a GEMM left (tllm_cl_mm_run) */
cl_int tllm_cl_mm_input(struct tllm_cl *cl, const struct pf_mm *mm, cl_mem x, int t_off, int rows_off, int n, int cols,
                       int norm_off, int left) {
    struct cl_prefill *p = cl->pf;
    struct args a = {p->norm, 0, CL_SUCCESS};
    ARG_MEM(&a, x);
    ARG_INT(&a, t_off);
    ARG_MEM(&a, p->meta);
    ARG_INT(&a, rows_off);
    ARG_INT(&a, cols);
    ARG_MEM(&a, cl->vecs);
    ARG_INT(&a, norm_off);
    ARG_F32(&a, cl->m->cfg.norm_eps);
    ARG_MEM(&a, p->mm.part);
    ARG_INT(&a, left);
    ARG_INT(&a, n);
    tllm_cl_arg_mm_input(&a, mm);
    if (a.err) return a.err;
    return tllm_cl_pf_run2(cl, p->norm, (size_t)n * p->lws, 1, (size_t)p->lws, 1, P_NORM);
}

static int same_format(const struct tllm_qweights *a, int a_dt, const struct tllm_qweights *b, int b_dt) {
    return a->format == b->format && a->bits == b->bits && a->group_size == b->group_size && a_dt == b_dt;
}

/* Whether the kernels read w's format (its scales plain): the program has none compiled in, or w's
 * is one of the model's (-DQ_BITS: its only one; -DQ_NF: one of the copies) */
static int reads_format(const struct tllm_cl *cl, const struct tllm_qweights *w) {
    if (!cl->fixed_formats) return 1;
    for (int i = 0; i < tllm_cl_n_mats(cl->m); i++)
        if (same_format(&cl->mats[i], cl->forms[i].dt, w, tllm_cl_dt_code(w->dtype))) return 1;
    return 0;
}

/* tllm_cl_matmul, or with reps > 0 the GEMM alone reps times (its input quantized once) and *secs
 * the wall time of those launches */
static int matmul(struct tllm_cl *cl, const struct tllm_qweights *w, const float *x, int n, int int8, float *y, int reps,
                  double *secs) {
    int affine = w->format == TLLM_WF_AFFINE && (w->bits == 2 || w->bits == 4 || w->bits == 8);
    if (!(affine || w->format == TLLM_WF_DENSE) || w->cols % 32 || n < 1)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl matmul: %s is not dense or 2/4/8-bit affine with a multiple of 32 columns", w->name);
    if (int8 < 0 || int8 > 2) return tllm_fail(TLLM_ERR_ARG, "opencl matmul: %d int8 levels (0 to 2)", int8);
    if (int8 && (!affine || (w->group_size % 32 && w->group_size != 16)))
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl matmul: int8 inputs need affine groups of 16 or a multiple of 32 (%s)", w->name);
    if (!reads_format(cl, w))
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl matmul: the program has the model's weight formats compiled in, not %s's",
                         w->name);
    int rc = cl->pf ? TLLM_OK : tllm_cl_pf_make(cl);
    if (rc) return rc;
    size_t N = (size_t)n, cols = (size_t)w->cols, rows = (size_t)w->rows;
    struct pf_mm mm = {.part_floats = 4 * N * rows, .split = tllm_cl_split_asked(), .half = w->group_size == 16};
    struct cl_weights cw = {0};
    const struct cl_weights *cwp = &cw;
    cl_mem xb = NULL, yb = NULL;
    rc = tllm_cl_mm_kernel(cl, &mm, int8);
    if (!rc) rc = tllm_cl_upload(cl, &xb, x, N * cols * 4, "matmul input");
    if (!rc) rc = tllm_cl_device_buffer(cl, &mm.io, tllm_cl_mm_io_layout(&mm, N, cols), "matmul input");
    if (!rc) rc = tllm_cl_device_buffer(cl, &mm.part, mm.part_floats * 4, "matmul slices");
    if (!rc) rc = tllm_cl_device_buffer(cl, &yb, N * rows * 4, "matmul output");
    if (!rc) rc = tllm_cl_weights_own(cl, w, &cw);
    if (!rc) {
        cl_int e = tllm_cl_mm_input(cl, &mm, xb, 0, -1, n, w->cols, -1, 0);
        if (reps > 0) {
            if (!e) e = tllm_cl_mm_run(cl, &mm, &cwp, 1, n, -1, yb, 0, w->rows, 0, P_O, NULL, NULL); /* warm-up */
            if (!e) e = clFinish(cl->q);
            double t0 = tllm_now();
            for (int i = 0; i < reps && !e; i++) e = tllm_cl_mm_run(cl, &mm, &cwp, 1, n, -1, yb, 0, w->rows, 0, P_O, NULL, NULL);
            if (!e) e = clFinish(cl->q);
            *secs = tllm_now() - t0;
        } else {
            if (!e) e = tllm_cl_mm_run(cl, &mm, &cwp, 1, n, -1, yb, 0, w->rows, 0, P_O, NULL, NULL);
            if (!e) e = clEnqueueReadBuffer(cl->q, yb, CL_TRUE, 0, N * rows * 4, y, 0, NULL, NULL);
        }
        if (e) rc = tllm_fail(TLLM_ERR_IO, "opencl matmul on %s: %s (%d)", cl->name, tllm_cl_err_name(e), e);
    }
    tllm_cl_release_weights(&cw);
    cl_mem bs[] = {xb, yb, mm.io, mm.part};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        if (bs[i]) clReleaseMemObject(bs[i]);
    tllm_cl_mm_release(&mm);
    return rc;
}

int tllm_cl_matmul(struct tllm_cl *cl, const struct tllm_qweights *w, const float *x, int n, int int8, float *y) {
    return matmul(cl, w, x, n, int8, y, 0, NULL);
}

int tllm_cl_matmul_bench(struct tllm_cl *cl, const struct tllm_qweights *w, const float *x, int n, int int8, int reps, double *secs) {
    if (reps < 1) return tllm_fail(TLLM_ERR_ARG, "opencl matmul bench: %d repetitions", reps);
    return matmul(cl, w, x, n, int8, NULL, reps, secs);
}
