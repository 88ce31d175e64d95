/* gemm_few_norm: gemm_few (gemm_few.cl) for a GEMM that adds into the residual x (o_proj, down_proj), whose
 * last work-group to finish (few_blocks_done with one block of all the rows) then does what pf_norm
 * (prefill.cl) would do next: the step's tokens' rows of
 * x (the slices added where the GEMM split K), RMS-normalized and quantized as the next GEMM's input. A
 * step of a few tokens costs what its launches cost (an H100's driver takes the host 4 us for an empty
 * kernel, 6 for a pf_norm: tllm-cl-floor, TLLM_CL_PROFILE=host), and this saves pf_norm's, two a layer.
 * The arithmetic is pf_norm's (norm_row_l2 on PF_LWS of the group's work-items), so a token's bits do not
 * depend on which kernel normalized it.
 * The input the next GEMM reads goes where this one's came from (io at xq_o ...): every work-group has
 * read its input before it counts itself done, and the last one reads no more of it. */

#if PF_LWS <= FEW_LWS /* (else the host does without it) */

/* y is x ([n_tok][rows], ldy = rows, y_off 0, add): norm_off, eps as pf_norm takes them; int8, g16 the next
 * GEMM's input as MM_OUT_ARGS describes it; done: [0] the rows done (0 between launches) */
#define GEMM_FEW_NORM_KERNEL(name, lv)                                                                      \
    __kernel __attribute__((reqd_work_group_size(FEW_LWS, 1, 1))) void name(                                \
        GEMM_Q8_KARGS, int unit, int tr, volatile __global int *done, int norm_off, float eps, int int8, int g16) { \
        __local float T[FEW_CHUNK * FEW_TN];                                                                \
        __local int mine[1 + FEW_BLOCKS_MAX];                                                               \
        GEMM_Q8_OPEN;                                                                                       \
        gemm_few_body(GEMM_Q8_PASS, lv, unit, tr, T);                                                       \
        int r0 = get_group_id(0) * tr;                                                                      \
        if (!few_blocks_done(done, rows, r0, min(rows, r0 + tr), mine)) return;                             \
        __global uchar *out = (__global uchar *)io;                                                         \
        __global float *xf = (__global float *)(out + xq_o), *xd_w = (__global float *)(out + xd_o);        \
        __global float *xs_w = (__global float *)(out + xs_o), *xh_w = (__global float *)(out + xh_o);      \
        int n_split = get_num_groups(2);                                                                    \
        for (int t = 0; t < n_tok; t++)                                                                     \
            norm_row_l2(y + (size_t)t * ldy, part, n_split, n_tok, t, rows, vecs, norm_off, eps, int8, xf,  \
                     (__global char *)xf, xd_w, xs_w, g16, xh_w, T);                                        \
    }
GEMM_FEW_NORM_KERNEL(gemm_few_norm, 1)
GEMM_FEW_NORM_KERNEL(gemm_few_norm_2, 2)
#endif
