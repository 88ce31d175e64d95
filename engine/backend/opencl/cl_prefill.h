/* The state of a step of many tokens on the device (cl_prefill.c: the layers; cl_gemm.c: its GEMMs' launches),
 * shared by those two files only. */
#ifndef TLLM_CL_PREFILL_H
#define TLLM_CL_PREFILL_H

#include "engine/backend/opencl/cl_internal.h"

#define PF_LOGIT_ROWS 64 /* tokens whose logits one lm_head GEMM computes (several tokens' logits or argmaxes) */
#define PF_MMA_SMALL 2 /* gemm_q8_mma's small tiles: of 16 and 32 tokens (small_tn in cl_gemm.c) */
#define PF_PART 8 /* split-K: the slices' buffer holds PF_PART x tokens x hidden size floats */
#ifndef PF_FEW1_LAYER_MIB
/* Where gemm_q8_mma's tiles of 16 tokens are there, gemm_few takes steps of one token only in models whose
 * layer holds at most this many MiB of weights, and steps of two in those of at most PF_FEW2_LAYER_MIB:
 * above, the tiles read the weights faster than gemm_few saves in launches (its fused norm and RoPE). H100,
 * bench -np, S_TG tok/s, gemm_few against the tiles: 0.5B (8 MiB a layer) 374-422 / 360-363 at B=1, 735-752 /
 * 704-750 at 2; 1.5B (25 MiB) 268-271 / 255-258, 465-471 / 516-519; 7B (125 MiB) 111 / 119-120, 169-170 /
 * 235-239. Per layer the tiles gain ~0.26 us a MiB at B=1 and gemm_few's launches save ~13 us: even at
 * ~50 MiB; at B=2 ~1.0 us a MiB against ~12 us: even at ~12 MiB */
#define PF_FEW1_LAYER_MIB 48
#endif
#ifndef PF_FEW2_LAYER_MIB
#define PF_FEW2_LAYER_MIB 12
#endif
#ifndef PF_SPLIT_MIN_STEPS
#define PF_SPLIT_MIN_STEPS 2 /* split-K: staging steps of 64 inputs a slice at least (H100, batched decode of 64
                              * sequences: 2 gave 12.2-12.8k tok/s, 4 12.5k, 8 10.8-11.2k, 16 10.6-10.7k) */
#endif
#define PF_COMBINE_LWS 64 /* flash_combine's work-group (FL_COMBINE_LWS) */
#define PF_MAX_HEAD_DIM 128 /* flash_prefill's local memory at larger heads is above NVIDIA's 48 KiB */
#ifndef PF_SPAN_GROUPS
#define PF_SPAN_GROUPS 4 /* flash_prefill's work-groups a compute unit, past which one takes several spans
                          * (H200, 1.5B, 256 sequences: a work-group a span cost 4% of the step) */
#endif
#ifndef PF_SPAN_FLOATS
#define PF_SPAN_FLOATS (16 << 20) /* flash_prefill's span sums a launch at most (64 MiB): a step's runs go in
                                   * as many launches as they need (TLLM_CL_SPAN_FLOATS: tests) */
#endif

/* What comes after a GEMM that gemm_few's launch may do itself (tllm_cl_mm_run) */
struct pf_next {
    enum { PF_NEXT_NORM, PF_NEXT_ROPE } what; /* pf_norm (y the residual), paged_rope (q, k, v stacked) */
    int norm_off;                             /* NORM: the weight's offset in vecs (-1: none) */
    const struct cl_tokens *tk;               /* ROPE: the step (paged) and layer */
    int layer;
};

/* What a chunk's launches do, for TLLM_CL_PROFILE */
enum { P_EMBED, P_NORM, P_QKV, P_ROPE, P_FLASH, P_O, P_GATE_UP, P_SWIGLU, P_DOWN, P_LM_HEAD, P_COUNT };

/* A GEMM kernel and its input, as pf_norm and pf_swiglu leave it */
struct pf_mm {
    cl_kernel k;
    cl_kernel k16;       /* the same for weights in groups of 16 (int8 inputs; gemm_q8_g16 ...) */
    cl_kernel ks[PF_MMA_SMALL], ks16[PF_MMA_SMALL]; /* gemm_q8_mma's in tiles of 16 and of 32 tokens, for steps
                                                     * of at most that many (the same bits; NULL: none, or
                                                     * TLLM_CL_NO_MMA_S, or for 32 TLLM_CL_NO_MMA_32) */
    cl_kernel few;       /* gemm_few for steps of at most few_n tokens (int8 inputs; NULL: none, or TLLM_CL_NO_FEW) */
    int few_n;           /* the largest step gemm_few takes (tllm_cl_mm_kernel: few_steps) */
    cl_kernel few_norm;  /* the same, then pf_norm's work by its last work-group (gemm_few_norm; NULL: none, or
                          * TLLM_CL_NO_FEW_NORM) */
    cl_kernel few_rope;  /* gemm_few of q, k and v, then paged_rope's work head by head (gemm_few_rope; NULL: none,
                          * or TLLM_CL_NO_FEW_ROPE) */
    int int8;            /* int8 blocks in this many levels (gemm_q8: 1 or 2), else 0: floats (gemm_f) */
    int half;            /* int8 inputs also leave each half block's sum (xh): some weights have groups of 16 */
    int mma;             /* gemm_q8_mma on NVIDIA's tensor cores: 1-D work-groups of gt threads */
    int tm, tn, gt;      /* its tile: rows, tokens, threads along a side (mma: all of them) */
    /* one buffer (a buffer argument, not four: WOFF in kernels/opencl/weights.cl) at byte offsets: [tokens][cols]
     * floats or int8 (in), per block of 32 d (xd) and sum (xs), [tokens][cols / 16] with half: per half block d
     * x its sum (xh; else xs again) */
    cl_mem io;
    size_t o_in, o_xd, o_xs, o_xh;
    cl_mem part;         /* split-K slices of the sums */
    size_t part_floats;  /* part's size */
    int split;           /* TLLM_CL_SPLIT (tests): slices wherever there are the steps; 0: the device's choice */
};

struct cl_prefill {
    int cap; /* tokens the buffers hold */
    struct pf_mm mm;
    int tm, tn, gt, lws, fl_qb, fl_lws; /* the kernels' tunables (prefill_tunables) */
    int mma_tm, mma_tn, mma_lws;        /* gemm_q8_mma's (0: not compiled in) */
    int mma_small;                      /* gemm_q8_mma_t16* and _t32* compiled in */
    int few_tn, few_lws, few_u;         /* gemm_few's largest step, work-group and units a thread (FEW_TN, FEW_LWS, FEW_U) */
    int fl_span;                        /* flash_prefill's span in steps of many sequences (FL_SPAN) */
    int fl_emit;                        /* flash_combine leaves every row as o_proj's input (FL_EMIT) */
    cl_kernel reduce, embed, norm, swiglu, rope, flash, combine, paged_rope, argmax, argmax_allowed;
    cl_mem spans;               /* [cap_spans] flash_prefill's sums of the spans of split rows */
    size_t cap_spans, span_floats; /* its size; the most a launch may use (PF_SPAN_FLOATS) */
    cl_mem allow, mask;         /* a step's bitsets of allowed ids and each wanted row's (struct cl_tokens) */
    size_t cap_allow, cap_mask; /* their sizes in 32-bit words */
    cl_mem meta;                /* [cap_meta] a step's ids and tables (struct cl_tokens) */
    size_t cap_meta;
    cl_mem amax;                /* [cap] the argmax of each wanted row */
    cl_mem counts;              /* [1 + heads] gemm_few_norm's count of finished work-groups, then gemm_few_rope's rows
                                 * done of each head of q, k, v (all 0 between launches) */
    int fixed_n;                /* > 0: split-K as for a step of this many tokens, whatever its size (cl_paged.c) */
    size_t room;                /* tllm_cl_mm_fixed_room's answer for fixed_n = room_n and split = room_split (0: none yet) */
    int room_n, room_split;
    cl_mem x;                   /* [cap][dim] the residual stream */
    cl_mem qkv, q, att;         /* [cap][q_dim + 2 kv_dim], [cap][q_dim] (RoPE'd), [cap][q_dim] */
    cl_mem h;                   /* [cap][2 ffn]: gate | up */
    cl_mem logits;              /* [PF_LOGIT_ROWS][vocab], made when every token's logits are asked */
    /* TLLM_CL_PROFILE: device time and launches by kind, over all chunks (printed by tllm_cl_prefill_free) */
    double prof_ns[P_COUNT], prof_wall_s;
    long prof_n[P_COUNT], chunks, tokens;
    cl_event *ev;
    int *ev_kind, n_ev, cap_ev, launches; /* launches: the last chunk's */
    /* TLLM_CL_PROFILE=host: a step's host time queueing (of it, in clEnqueueNDRangeKernel) and waiting */
    double host_queue_s, host_enq_s, host_wait_s, host_enq_kind_s[P_COUNT];
    long host_steps, host_launches, host_launches_kind[P_COUNT];
};

/* cl_prefill.c */
int tllm_cl_pf_make(struct tllm_cl *cl); /* the kernels and the small buffers, at the first step (cl->pf) */

/* cl_gemm.c (each function says what it does where it is defined) */
int tllm_cl_split_asked(void);
int tllm_cl_mm_kernel(struct tllm_cl *cl, struct pf_mm *mm, int int8);
void tllm_cl_mm_release(struct pf_mm *mm);
size_t tllm_cl_mm_fixed_room(const struct tllm_cl *cl, const struct pf_mm *mm);
size_t tllm_cl_mm_io_layout(struct pf_mm *mm, size_t n, size_t cols);
cl_int tllm_cl_pf_run3(struct tllm_cl *cl, cl_kernel k, size_t g0, size_t g1, size_t g2, size_t l0, size_t l1, int kind);
cl_int tllm_cl_pf_run2(struct tllm_cl *cl, cl_kernel k, size_t g0, size_t g1, size_t l0, size_t l1, int kind);
void tllm_cl_arg_paged_rope(struct args *a, struct tllm_cl *cl, const struct cl_tokens *tk, int l);
cl_int tllm_cl_mm_run(struct tllm_cl *cl, const struct pf_mm *mm, const struct cl_weights *const *ws, int n_w, int n, int bias_off,
                      cl_mem y, int y_off, int ldy, int add, int kind, int *left, const struct pf_next *next);
cl_int tllm_cl_gemm(struct tllm_cl *cl, const struct cl_weights *w, int n, int bias_off, cl_mem y, int y_off, int ldy, int add,
                    int kind);
int tllm_cl_mm_stackable(const struct pf_mm *mm, const struct cl_weights *const *ws, int n_w);
void tllm_cl_arg_mm_input(struct args *a, const struct pf_mm *mm);
cl_int tllm_cl_mm_input(struct tllm_cl *cl, const struct pf_mm *mm, cl_mem x, int t_off, int rows_off, int n, int cols,
                        int norm_off, int left);

#endif
