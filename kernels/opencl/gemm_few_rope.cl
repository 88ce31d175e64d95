/* gemm_few_rope: gemm_few (gemm_few.cl) for q, k and v stacked in a step of paged sequences, which then does
 * paged_rope's work (paged.cl) itself, a head at a time: the work-group that computes the last of a
 * head's rows (in every split-K slice) rotates that head's pairs for the step's tokens and stores k and v
 * into the pool, while the rest of the launch still runs. This saves paged_rope's launch, one a layer, whose
 * few microseconds of work cost the GPU 8-9 (H100, 0.5B) in a step that waits for its kernels one after
 * another. The arithmetic is paged_rope's (paged_rope_pair), so a token's bits do not depend on which
 * kernel rotated it. */

/* y is qkv ([n_tok][q_dim + 2 kv_dim], ldy = rows, y_off 0, biases at bias_off, not add); count: [0]
 * gemm_few_norm's, [1 + head] the heads' of the stack (few_blocks_done in gemm_few.cl; heads of q, then of k,
 * then of v); then paged_rope's arguments */
#define GEMM_FEW_ROPE_KERNEL(name, lv)                                                                        \
    __kernel __attribute__((reqd_work_group_size(FEW_LWS, 1, 1))) void name(                                  \
        GEMM_Q8_KARGS, int unit, int tr, volatile __global int *count, PAGED_ROPE_ARGS) {                     \
        __local float T[FEW_CHUNK * FEW_TN];                                                                  \
        __local int mine[1 + FEW_BLOCKS_MAX];                                                                 \
        GEMM_Q8_OPEN;                                                                                         \
        gemm_few_body(GEMM_Q8_PASS, lv, unit, tr, T);                                                         \
        int r0 = get_group_id(0) * tr, half_d = hd / 2;                                                       \
        int nb = few_blocks_done(count + 1, hd, r0, min(rows, r0 + tr), mine);                                  \
        int n_split = get_num_groups(2), items = nb * half_d * n_tok;                                         \
        for (int i = get_local_id(0); i < items; i += FEW_LWS) { /* (head, token, pair) */                    \
            int head = mine[1 + i / (half_d * n_tok)], t = i / half_d % n_tok, c = i % half_d;                \
            int e = head * hd + c;                                                                            \
            float2 a = (float2)(gemm_in_bias_l2(y, part, n_split, n_tok, rows, t, e, vecs, bias_off),         \
                                gemm_in_bias_l2(y, part, n_split, n_tok, rows, t, e + half_d, vecs, bias_off)); \
            paged_rope_pair(a, head * half_d + c, t, PAGED_ROPE_PASS);                                        \
        }                                                                                                     \
    }
GEMM_FEW_ROPE_KERNEL(gemm_few_rope, 1)
GEMM_FEW_ROPE_KERNEL(gemm_few_rope_2, 2)
