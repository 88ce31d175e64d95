/* What the OpenCL backend's files share: the device state (struct tllm_cl), the weights' and the
 * launches' descriptions, and the helpers one file makes for another. Only engine/backend/opencl/
 * includes it (and CL/cl.h). */
#ifndef TLLM_CL_INTERNAL_H
#define TLLM_CL_INTERNAL_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/backend/opencl/cl.h"

#define CL_MV_LOCAL_X 8192 /* kernels/opencl/common.cl's default MV_LOCAL_X */
#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

struct cl_weights {
    cl_mem w, s, b; /* codes (or dense values), scales, biases: sub-buffers of base */
    cl_mem base;    /* the arena, or (no arena) a buffer of the matrix's own, which the GEMMs read at off */
    int own_base;
    int rows, cols, bits, gs, dt;
    size_t off[3], len[3]; /* where w, s, b lie in base (s and b alias w when dense) */
};

/* The scales and biases of an affine matrix as the device reads them (`ld_s`, `ld_b` in
 * kernels/opencl/common.cl), the same values to the bit as the model's. dt, bits 0-1: 0 float32, 1
 * float16, 2 bf16, CL_DT_TWO_LEVEL (3): per 8 groups a float16 factor, then 8 int8s (10 bytes; k-quants'
 * d * sc); bits 3 and up: z > 0 when no biases are kept, each being -2^z times its scale (Q4_0, Q5_0,
 * Q6_K, Q8_0: codes with a zero point). */
#define CL_DT_TWO_LEVEL 3
#define CL_DT_SYM_SHIFT 3
struct cl_form {
    int dt;
    const void *s, *b; /* b NULL: symmetric */
    size_t s_len, b_len;
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

struct cl_layer {
    struct cl_weights wq, wk, wv, wo, gate, up, down;
    struct cl_launch qkv, attn, attn_out, gate_up, down_l;
};

/* Compile-time tunables of kernels/opencl/, read back from the device with the `tunables` kernel
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
    struct tllm_qweights *mats; /* [n_mats] the matrices as the device holds them (tllm_cl_device_mats) */
    struct cl_form *forms;      /* [n_mats] their scales and biases as the device holds them */
    int fixed_formats;          /* the program has the model's formats compiled in (-DQ_BITS, -DQ_NF) */
    void **conv;                /* [n_conv] buffers of the converted ones */
    int n_conv;
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
     * (the caches of the compute units are not coherent: see LINE_PAD in kernels/opencl/token.cl) */
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
    int int8; /* the matvecs take int8 activations (XQ in kernels/opencl/common.cl) */
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
    struct cl_prefill *pf; /* prompt processing's kernels and buffers (cl_prefill.c), made at its first chunk */
    struct cl_paged *pg;   /* the block pool of many sequences' steps (cl_paged.c), when a host cache is bound */
};

#define CL_TRY(call)                                                                                            \
    do {                                                                                                        \
        cl_int e_ = (call);                                                                                     \
        if (e_ != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: %s failed: %s (%d)", #call, tllm_cl_err_name(e_), e_); \
    } while (0)

/* Kernel arguments in order, the first error kept; a weight takes 6 (W, S, B, bits, gs, dt). */
struct args {
    cl_kernel k;
    cl_uint i;
    cl_int err;
};
static inline void bind_arg(struct args *a, size_t size, const void *v) {
    cl_int e = clSetKernelArg(a->k, a->i++, size, v);
    if (e != CL_SUCCESS && a->err == CL_SUCCESS) a->err = e;
}
#define ARG_MEM(a, m) bind_arg(a, sizeof(cl_mem), &(m))
#define ARG_INT(a, v) do { cl_int v_ = (v); bind_arg(a, sizeof v_, &v_); } while (0)
#define ARG_F32(a, v) do { cl_float v_ = (v); bind_arg(a, sizeof v_, &v_); } while (0)
#define ARG_U64(a, v) do { cl_ulong v_ = (v); bind_arg(a, sizeof v_, &v_); } while (0)
static inline void arg_weights(struct args *a, const struct cl_weights *w) {
    ARG_MEM(a, w->w);
    ARG_MEM(a, w->s);
    ARG_MEM(a, w->b);
    ARG_INT(a, w->bits);
    ARG_INT(a, w->gs);
    ARG_INT(a, w->dt);
}
/* The same as offsets into w->base (WOFF in kernels/opencl/weights.cl), which the caller passes once */
static inline void arg_woff(struct args *a, const struct cl_weights *w) {
    ARG_U64(a, w->off[0]);
    ARG_U64(a, w->off[1]);
    ARG_U64(a, w->off[2]);
    ARG_INT(a, w->bits);
    ARG_INT(a, w->gs);
    ARG_INT(a, w->dt);
}

/* n floats rounded up to whole 128-byte lines, as `token` lays out its per-layer regions (LINE_PAD) */
static inline size_t line_pad(size_t n) { return (n + 31) & ~(size_t)31; }

/* cl_cache.c: the built program on disk; cache_path returns 0 when there is no cache */
int tllm_cl_cache_path(const struct tllm_cl *cl, const char *const *src, int n_src, const char *opts, char *out, size_t cap);
int tllm_cl_cache_load(struct tllm_cl *cl, const char *path, const char *opts);
/* 1 if the program was built before (its binary, or the mark of a build that kept none) */
int tllm_cl_cache_seen(const char *path);
/* binary: keep the program's binary at path; else only the mark that it was built */
void tllm_cl_cache_store(const struct tllm_cl *cl, const char *path, int binary);

/* cl_device.c */
const char *tllm_cl_err_name(cl_int e);
int tllm_cl_all_devices(cl_device_id *devs, cl_platform_id *plats_of, int max);
int tllm_cl_build_program(struct tllm_cl *cl, int int8_ok);
int tllm_cl_make_kernel(struct tllm_cl *cl, cl_kernel *k, const char *name);
void tllm_cl_measure_floor(struct tllm_cl *cl);
int tllm_cl_read_tunables(struct tllm_cl *cl);
/* v[0 .. n) from a one-work-item kernel that writes n ints (the tunables kernels) */
int tllm_cl_ints_of(struct tllm_cl *cl, const char *kernel, cl_int *v, int n);

/* cl_weights.c */
int tllm_cl_dt_code(enum tllm_dtype d);
int tllm_cl_n_mats(const struct tllm_model *m);
const struct tllm_qweights *tllm_cl_model_mat(const struct tllm_model *m, int i);
int tllm_cl_upload(struct tllm_cl *cl, cl_mem *out, const void *p, size_t n, const char *what);
void tllm_cl_mat(struct tllm_cl *cl, int i, const struct tllm_qweights **w, struct cl_weights **cw);
/* cl->mats: every matrix in a form the device kernels read (converted where the model's is another),
 * or an error naming one they cannot take; before the program is built (it compiles the formats in). */
int tllm_cl_device_mats(struct tllm_cl *cl);
int tllm_cl_upload_all_weights(struct tllm_cl *cl);
void tllm_cl_release_weights(struct cl_weights *cw);
/* w in buffers of its own (not the arena) */
int tllm_cl_weights_own(struct tllm_cl *cl, const struct tllm_qweights *w, struct cl_weights *cw);
int tllm_cl_device_buffer(struct tllm_cl *cl, cl_mem *out, size_t n, const char *what);
void tllm_cl_by_blocks(const struct tllm_qweights *w, unsigned char *t);
int tllm_cl_upload_by_blocks(struct tllm_cl *cl);

/* cl_launch.c */
int tllm_cl_bind_all(struct tllm_cl *cl);
int tllm_cl_check_shapes(const struct tllm_cl *cl);
cl_int tllm_cl_clear_bar(struct tllm_cl *cl);
int tllm_cl_reset_bar(struct tllm_cl *cl);
void tllm_cl_pick_persistent(struct tllm_cl *cl);
size_t tllm_cl_phase_times_len(const struct tllm_cl *cl);
int tllm_cl_token_buffers(struct tllm_cl *cl);
void tllm_cl_pin_results(struct tllm_cl *cl);

/* cl_prefill.c */
/* NULL when prompts can be processed here, else why not (the model's shapes) */
const char *tllm_cl_prefill_refusal(const struct tllm_cl *cl);
void tllm_cl_prefill_free(struct tllm_cl *cl);
/* Where a step of many sequences keeps K and V: the block pool (cl_paged.c) and the offsets in the
 * step's meta of what kernels/opencl/paged.cl reads */
struct cl_pages {
    cl_mem kp, vp;   /* keys, values: [layers][n_blocks][n_kv][...] as engine/run/kv_cache.h */
    int n_blocks, kv_half;
    int pos_off, slot_off; /* each token's position, and slot (block x 16 + position % 16) */
    int grp_off, n_grp;    /* the attention runs: (first token, tokens, first position, block table offset) */
    int fixed_n;           /* split-K as for steps of this many tokens, whatever a step's size */
    int spo_off;           /* [n + 1]: before each token, the spans of the tokens before it that flash_prefill splits */
    int max_pos;           /* the step's last position */
};
/* A step's tokens through every layer (tllm_cl_tokens): a chunk of the one sequence's cache from pos0
 * (pages NULL), or tokens of many sequences in the pool. meta: the ids at [0, n), then what the pages
 * and the wanted rows point at, uploaded with one write. For the n_out tokens meta[rows_off ..] names,
 * in order: logits != NULL receives [vocab] floats each, argmax != NULL an id each. */
struct cl_tokens {
    int n, n_meta, pos0;
    const int32_t *meta;
    const struct cl_pages *pages;
    int rows_off, n_out;
    float *logits;
    int32_t *argmax;
    /* [n_out] or NULL, as struct tllm_batch's: which rows' logits come back when argmax is asked too;
     * each row's bitset of allowed ids in allow (-1: none) */
    const int8_t *want_logits;
    const int32_t *mask;
    const uint32_t *allow;
    int (*fill_masks)(void *user, const int32_t **mask, const uint32_t **allow); /* struct tllm_batch's */
    void *user;
};
int tllm_cl_tokens(struct tllm_cl *cl, const struct cl_tokens *tk);
/* Query rows of a flash_prefill work-group (a run's tokens x the heads of a KV head); 0 when the
 * kernels could not be made (the message says why) */
int tllm_cl_flash_rows(struct tllm_cl *cl);
/* Positions of a span of flash_prefill in steps of many sequences (FL_SPAN); 0 when it cannot run */
int tllm_cl_flash_span(struct tllm_cl *cl);

/* cl_paged.c */
void tllm_cl_paged_free(struct tllm_cl *cl);

/* cl_profile.c */
void tllm_cl_print_profile(const struct tllm_cl *cl);
void tllm_cl_collect_phases(struct tllm_cl *cl, double wall);
void tllm_cl_collect_profile(struct tllm_cl *cl, double wall);

/* cl_step.c */
void tllm_cl_drop_pending(struct tllm_cl *cl);
cl_int tllm_cl_launch_one(struct tllm_cl *cl, const struct cl_launch *L);

#endif
