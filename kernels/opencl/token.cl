/* The persistent `token` kernel: a whole decode step in one launch, its phases separated by grid
 * barriers; and the argmax over the lm_head's per-group bests. */

#ifndef SPIN_LIMIT
#define SPIN_LIMIT (1 << 20) /* polls of a grid barrier before it gives up (about a second) */
#endif

/* Every work-group of a persistent launch waits here until all have arrived: `target` is the count
 * of arrivals that means so (the host keeps the running count). When waiting takes too long, the
 * work-groups are not all running at once; bar[1] is raised, every later barrier falls through, and
 * the host redoes the step one kernel per launch. In two halves: between them a group may issue
 * reads that do not depend on the other groups (the next phase's weights). Not before the arrival:
 * its memory fence waits for the thread's reads in flight, which would delay the arrival by a
 * memory latency (H200 tg128: 1095 tok/s with the reads before the arrival, 1157 with none, 1244
 * with them between the halves). */
inline void grid_arrive(volatile __global int *bar) {
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        mem_fence(CLK_GLOBAL_MEM_FENCE);
        atomic_inc(bar);
    }
}

inline void grid_wait(volatile __global int *bar, int target) {
    if (get_local_id(0) == 0) {
        for (int spins = 0; atomic_add(bar, 0) < target; spins++)
            if (spins > SPIN_LIMIT || bar[1]) {
                bar[1] = 1;
                break;
            }
        mem_fence(CLK_GLOBAL_MEM_FENCE);
    }
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
}

/* TLLM_CL_PROFILE=phases on NVIDIA: the time each grid barrier of `token` is passed (by group 0:
 * times[i], i < 4 + 5 x layers) and each group's arrival at it (times[4 + 5 x layers + i x groups +
 * group]), read from the GPU's nanosecond timer with inline PTX (not OpenCL C; compiled only when
 * asked for). */
#ifdef PHASE_TIMES
#define GLOBALTIMER(t) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t))
#define PHASE_MARK(i)                                                                     \
    if (get_group_id(0) == 0 && get_local_id(0) == 0) {                                    \
        ulong t_;                                                                          \
        GLOBALTIMER(t_);                                                                   \
        times[i] = t_;                                                                     \
    }
#define ARRIVE_MARK(i)                                                                    \
    if (get_local_id(0) == 0) {                                                            \
        ulong t_;                                                                          \
        GLOBALTIMER(t_);                                                                   \
        times[4 + 5 * n_layers + (i) * G + get_group_id(0)] = t_;                         \
    }
#else
#define PHASE_MARK(i)
#define ARRIVE_MARK(i)
#endif

#if ATT_LWS == MV_LWS
/* The end of a phase of `token`: all groups meet, and (profiling) group 0 notes the time. */
#define PHASE_END() NEXT_PHASE((void)0)

/* Matrix `idx` of the descriptor table: its codes, scales and biases inside the weight arena (offsets
 * in units of 16 bytes), format and threads per row. */
#define MAT(n, idx)                                                                                          \
    __global const int *d##n = desc + 8 * (idx);                                                             \
    __global const uchar *W##n = arena + (size_t)d##n[0] * 16, *S##n = arena + (size_t)d##n[1] * 16,         \
                         *B##n = arena + (size_t)d##n[2] * 16;                                               \
    int bits##n = d##n[3], gs##n = d##n[4], dt##n = d##n[5], tpr##n = d##n[6]

#ifndef PHASE_PREFETCH
#define PHASE_PREFETCH 1 /* a phase's first weight reads are issued while waiting at the grid barrier before it */
#endif
/* The end of a phase whose successor's first weight reads are the statements `pre` (no commas outside
 * parentheses: NVIDIA's OpenCL has no variadic macros): issued while the group waits at the grid
 * barrier (they do not depend on it), so their memory latency overlaps the wait. */
#if PHASE_PREFETCH
#define NEXT_PHASE(pre)                    \
    grid_arrive(bar);                      \
    ARRIVE_MARK(nb + 1);                   \
    { pre; }                               \
    grid_wait(bar, bar_base + ++nw * G), ++nb; \
    PHASE_MARK(nb)
#else
#define NEXT_PHASE(pre)                    \
    grid_arrive(bar);                      \
    ARRIVE_MARK(nb + 1);                   \
    grid_wait(bar, bar_base + ++nw * G), ++nb; \
    PHASE_MARK(nb);                        \
    { pre; }
#endif
/* A phase boundary with no grid barrier (FFN_FUSED: down_proj is done within gate_up's phase,
 * ATT_FUSED: o_proj within attention's): the profile's marks only, so phases keep their numbers */
#define SKIP_PHASE()   \
    ARRIVE_MARK(nb + 1); \
    ++nb;              \
    PHASE_MARK(nb)

/* first_row of matrix idx of the table, with tpr threads a row */
inline struct qrow table_first_row(__global const uchar *arena, __global const int *desc, int idx, int rows, int cols,
                                   int tpr) {
    MAT(0, idx);
    return first_row(WPASS(0), rows, cols, tpr);
}

/* qkv_first of the q, k, v matrices m, m + 1, m + 2 of the table */
inline struct qrow2 table_qkv_first(__global const uchar *arena, __global const int *desc, int m, int n_heads, int n_kv,
                                    int hd, int cols) {
    MAT(0, m);
    MAT(1, m + 1);
    MAT(2, m + 2);
    return qkv_first(WPASS(0), WPASS(1), WPASS(2), n_heads, n_kv, hd, cols, tpr0);
}

/* n floats rounded up to whole 128-byte lines. The compute units' caches are not coherent: a line
 * that held the end of one activation and the start of another, cached by a read of the first, could
 * later serve a compute unit stale values of the second, written meanwhile by another (H200: wrong
 * logits with ATT_MAX_SPLIT 1 or 2, whose per-layer partials were not whole lines). So every region
 * of `act` and `part` starts on a line (the buffers themselves are aligned far more). The KV cache's
 * rows are whole lines too (the host rounds its positions per row, n_ctx, up to a multiple of 32):
 * otherwise, in a cache under 64 positions, the previous layer's reads of its last key row could
 * cache the line that holds this layer's first row and its new position. */
#define LINE_PAD(n) (((size_t)(n) + 31) & ~(size_t)31)

/* A whole decode step in one launch (GPUs): embedding, every layer's five steps above, the lm_head and
 * the argmax, as phases separated by grid barriers, run by a grid small enough that all its
 * work-groups are resident at once (the host never uses it on CPU devices). Weights come from one arena
 * through the descriptor table: desc[8 * m ...] for matrix m (0 embed, 1 lm_head, 2 + 7 * layer +
 * q, k, v, o, gate, up, down), then 8 ints per layer (attn_norm, bq, bk, bv, ffn_norm offsets in vecs).
 * Every activation a phase writes has its own place per layer in `act` (and `part`), so nothing is
 * read in one phase and rewritten in a later one of the same launch: no core can hold a stale copy
 * in a cache that is not coherent between compute units. (With FFN_FUSED or ATT_FUSED, x2 and the next
 * layer's x are sums of atomic adds made at L2, starting from zero; the lm_head phase zeroes them for
 * the next step after their last read, and nothing reads them again in this launch.) */
__kernel void token(__global const uchar *arena, __global const int *desc, __global const float *vecs,
                    __global const float *inv_freq, __global float *act, __global float *part, __global float *kt,
                    __global float *vc, __global float *logits, __global float2 *best, __global int *next,
                    __global int *bar, __global const uchar *by_blocks, __global int *done, int n_layers, int dim,
                    int ffn, int n_heads, int n_kv, int hd, int vocab, int n_ctx, int final_norm, float eps, __global ulong *times, int bar_base, int id, int pos,
                    int span, int n_split) {
    STAGE_LOCALS, red[MV_LWS], sl[ATT_LWS];
    __local float2 red2[MV_LWS];
    __local float4 acc_l[ATT_LWS];
    __local int last[1];
    int G = get_num_groups(0), nb = 0, nw = 0, q_dim = n_heads * hd; /* nb phases, nw grid barriers passed */
    /* per layer: x, x2 (after attention), q, h, each starting on a line (LINE_PAD) */
    size_t per_layer = 2 * LINE_PAD(dim) + LINE_PAD(q_dim) + LINE_PAD(ffn);
    size_t part_layer = LINE_PAD((size_t)n_heads * ATT_MAX_SPLIT * (hd + 2));
    struct qrow2 f; /* the next phase's first weight reads (NEXT_PHASE): f.a only, or f.a and f.b */
    PHASE_MARK(0);
    {
        MAT(0, 0);
        id = step_token(id, next, vocab); /* group 0 writes next only after the last grid barrier */
        for (int j = get_global_id(0); j < dim; j += get_global_size(0)) act[j] = embed_one(WPASS(0), dim, id, j);
    }
    NEXT_PHASE(f = table_qkv_first(arena, desc, 2, n_heads, n_kv, hd, dim));
    for (int l = 0; l < n_layers; l++) {
        __global float *x = act + l * per_layer, *x2 = x + LINE_PAD(dim), *q = x2 + LINE_PAD(dim), *hb = q + LINE_PAD(q_dim);
        __global float *x_next = act + (l + 1) * per_layer, *pl = part + l * part_layer;
        __global const int *lv = desc + 8 * (2 + 7 * n_layers + l);
        int m = 2 + 7 * l;
#if ANY_FUSED
        /* this layer's o_proj and down_proj by blocks (FFN_FUSED, ATT_FUSED) */
        __global const uchar *o_t = by_blocks + l * (BT_BYTES(dim, q_dim) + BT_BYTES(dim, ffn));
        __global const uchar *down_t = o_t + BT_BYTES(dim, q_dim);
#endif
        {
            MAT(0, m);
            MAT(1, m + 1);
            MAT(2, m + 2);
            qkv_body(WPASS(0), WPASS(1), WPASS(2), n_heads, n_kv, hd, dim, tpr0, x, vecs, lv[0], lv[1], lv[2], lv[3],
                     eps, inv_freq, n_ctx, q, kt, vc, l, pos, f, xs, xsum, red, red2);
        }
#if ATT_FUSED /* x2 (zeroed by the previous step) gets x + o_proj(attention) by atomic adds */
        NEXT_PHASE(if (get_group_id(0) < n_heads) /* its columns of o_proj, for the fold */
                       blocks_l2(o_t, get_group_id(0) * (HEAD_DIM / 32), HEAD_DIM / 32, dim, q_dim));
        for (int w = get_group_id(0); w < n_split * n_heads; w += G)
            attention_body(q, kt, vc, pl, n_ctx, hd, n_heads, n_kv, l, pos, span, w % n_split, w / n_split, sl,
                           red, acc_l);
        for (int w = get_group_id(0); w < n_split * n_heads; w += G) /* after all of the group's partials */
            att_fold(pl, w / n_split, n_split, done + l * n_heads, o_t, dim, q_dim, x2, x, xs, xsum, red, last, sl,
                     n_split == 1 && n_heads <= G);
        SKIP_PHASE();
#else
        PHASE_END();
        for (int w = get_group_id(0); w < n_split * n_heads; w += G)
            attention_body(q, kt, vc, pl, n_ctx, hd, n_heads, n_kv, l, pos, span, w % n_split, w / n_split, sl,
                           red, acc_l);
        NEXT_PHASE(f.a = table_first_row(arena, desc, m + 3, dim, q_dim, desc[8 * (m + 3) + 6]));
        {
            MAT(3, m + 3);
            attn_out_body(WPASS(3), dim, q_dim, tpr3, pl, hd, x, x2, n_split, f.a, xs, xsum, red, red2);
        }
#endif
        NEXT_PHASE(int t = desc[8 * (m + 4) + 6]; /* up is read with gate's tpr */
                   f.a = table_first_row(arena, desc, m + 4, ffn, dim, t);
                   f.b = table_first_row(arena, desc, m + 5, ffn, dim, t));
        {
            MAT(4, m + 4);
            MAT(5, m + 5);
#if FFN_FUSED /* x_next (zeroed by the previous step) gets x2 + down_proj(h) by atomic adds */
            gate_up_body(WPASS(4), WPASS(5), ffn, dim, tpr4, x2, vecs, lv[4], eps, hb, f.a, f.b, xs, xsum, red, red2,
                         down_t, x_next);
        }
        SKIP_PHASE();
#else
            gate_up_body(WPASS(4), WPASS(5), ffn, dim, tpr4, x2, vecs, lv[4], eps, hb, f.a, f.b, xs, xsum, red, red2,
                         0, 0);
        }
        NEXT_PHASE(f.a = table_first_row(arena, desc, m + 6, ffn <= MV_LOCAL_X ? dim : 0, ffn, desc[8 * (m + 6) + 6]));
        {
            MAT(6, m + 6);
            matvec_body(WPASS(6), dim, ffn, tpr6, hb, vecs, -1, eps, x_next, x2, 1, 0, 0, f.a, xs, xsum, red, red2);
        }
#endif
        NEXT_PHASE(if (l + 1 < n_layers) f = table_qkv_first(arena, desc, m + 7, n_heads, n_kv, hd, dim);
                   else f.a = table_first_row(arena, desc, 1, dim <= MV_LOCAL_X ? vocab : 0, dim, desc[8 + 6]));
    }
    {
        MAT(1, 1);
#if ANY_FUSED /* the next step's sums start from zero: x2 of every layer, x but the last (read here) */
        for (size_t j = get_global_id(0); j < (size_t)(2 * n_layers) * dim; j += get_global_size(0)) {
            size_t l = j / (2 * dim), i = j % (2 * dim); /* [0, dim): x2 of layer l, [dim, 2 dim): x of l + 1 */
            if (ATT_FUSED && i < dim) act[l * per_layer + LINE_PAD(dim) + i] = 0.0f;
            if (FFN_FUSED && i >= dim && l + 1 < n_layers) act[(l + 1) * per_layer + i - dim] = 0.0f;
        }
#endif
        matvec_body(WPASS(1), vocab, dim, tpr1, act + n_layers * per_layer, vecs, final_norm, eps, logits, logits, 0,
                    best, 1, f.a, xs, xsum, red, red2);
    }
    PHASE_END();
    if (get_group_id(0) == 0) {
#if FFN_FUSED
        for (int j = get_local_id(0); j < dim; j += MV_LWS) act[n_layers * per_layer + j] = 0.0f;
#endif
        argmax_body(best, G, next, bar, red2);
        PHASE_MARK(nb + 1);
    }
}
#endif

/* The row of the largest of the n per-group bests the lm_head left (the first on ties): one
 * work-group of MV_LWS threads. */
__kernel void argmax(__global const float2 *best, int n, __global int *out, __global const int *bar) {
    __local float2 red[MV_LWS];
    argmax_body(best, n, out, bar, red);
}
