/* gemm_few_swiglu: gemm_few (gemm_few.cl) for the gate and up matrices stacked (h's rows [0, ffn) gate's,
 * [ffn, 2 ffn) up's), which then does pf_swiglu's work (prefill.cl) itself, a block of 32 at a time: the
 * work-group that computes the last of a block's 64 rows (32 of gate, 32 of up, in every split-K slice)
 * makes silu(gate) * up of that block for the step's tokens, quantized as down_proj's input. A step of a
 * few tokens costs what its launches cost the host (gemm_few_norm.cl), and this saves pf_swiglu's, one a
 * layer; unlike gemm_few_norm's single last work-group, the blocks are made while the rest of the launch
 * still runs. The arithmetic is pf_swiglu's (silu_mul, emit_lane on 32 work-items a block), so a token's
 * bits do not depend on which kernel made its input.
 * down_proj's input goes to a place of io (oq ...) other than the one this launch reads its input from: a
 * block may be done while other work-groups still read theirs. */

#if FEW_LWS % 32 == 0 /* (else the host does without it) */

/* y is h ([n_tok][2 ffn], ldy = rows = 2 ffn, y_off 0, no bias, not add); count: [0] gemm_few_norm's, [1 + b]
 * block b's (few_blocks_done in gemm_few.cl); int8, g16 and oq, od, os, oh: down_proj's input as MM_OUT_ARGS
 * describes it */
#define GEMM_FEW_SWIGLU_KERNEL(name, lv)                                                                      \
    __kernel __attribute__((reqd_work_group_size(FEW_LWS, 1, 1))) void name(                                  \
        GEMM_Q8_KARGS, int unit, int tr, volatile __global int *count, int int8, int g16, ulong oq, ulong od,   \
        ulong os, ulong oh) {                                                                                 \
        __local float T[FEW_CHUNK * FEW_TN];                                                                  \
        __local int mine[1 + FEW_BLOCKS_MAX];                                                                 \
        GEMM_Q8_OPEN;                                                                                         \
        gemm_few_body(GEMM_Q8_PASS, lv, unit, tr, T);                                                         \
        int ffn = rows / 2, r0 = get_group_id(0) * tr;                                                        \
        int nb = few_blocks_done(count + 1, rows, ffn, 32, r0, min(rows, r0 + tr), mine);                    \
        __global uchar *out = (__global uchar *)io;                                                           \
        __global float *xf = (__global float *)(out + oq), *xd_w = (__global float *)(out + od);              \
        __global float *xs_w = (__global float *)(out + os), *xh_w = (__global float *)(out + oh);            \
        int n_split = get_num_groups(2), lid = get_local_id(0), pairs = nb * n_tok;                           \
        for (int p0 = 0; p0 < pairs; p0 += FEW_LWS / 32) { /* a (block, token) each 32 work-items */          \
            int pi = p0 + lid / 32, live = pi < pairs;                                                        \
            int t = live ? pi % n_tok : 0, j = (live ? 32 * mine[1 + pi / n_tok] : 0) + lid % 32;             \
            float g = live ? gemm_in_l2(y, part, n_split, n_tok, rows, t, j) : 0.0f;                          \
            float u = live ? gemm_in_l2(y, part, n_split, n_tok, rows, t, ffn + j) : 0.0f;                    \
            emit_lane(live ? silu_mul(g, u) : 0.0f, t, j, ffn, live, int8, xf, (__global char *)xf, xd_w,     \
                      xs_w, g16, xh_w, T);                                                                    \
        }                                                                                                     \
    }
GEMM_FEW_SWIGLU_KERNEL(gemm_few_swiglu, 1)
GEMM_FEW_SWIGLU_KERNEL(gemm_few_swiglu_2, 2)
#endif
