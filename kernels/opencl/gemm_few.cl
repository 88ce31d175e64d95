/* gemm_few: gemm_q8's product (kernels/opencl/gemm.cl) for a step of at most FEW_TN tokens — a decode
 * step of a few sequences, the lm_head of a few rows — read as a matvec reads its matrix. The tiled
 * GEMMs give such a step a tile of 64 tokens: 1/64 of their work counts, and their 64-row tiles keep
 * too few bytes in flight to read the weights near the memory's speed. Here the threads of a
 * work-group take the units (the GEMMs' terms: blocks of 32 inputs, `unit` 0; staging steps of 64 in
 * one group where the GEMM on the device sums by step, 1; half blocks for weight groups of 16, 2) of
 * `tr` rows of one split-K slice, consecutive threads the
 * consecutive units of a row (so a warp's weight reads are consecutive bytes): each computes its
 * unit's term for every token (gemm_term, gemm_term2: the integer sums are exact in any order), and
 * the terms are added in the GEMM's order, from 0, one thread a (row, token). A token's output is
 * therefore the GEMM's to the bit, and a sequence's logits do not depend on the size of its step. */

#ifndef FEW_TN
#define FEW_TN 2 /* tokens a step at most. The per-token work grows faster here than in the tiled GEMMs: on the
                  * H200 (bench -np, 128 + 128 tokens) 1 and 2 tokens gain (0.5B: 323 vs 285 tok/s at 1, 625 vs
                  * 573 at 2; 7B: 92 vs 72 and 142 vs 144), 4 and 8 lose (7B: 191 vs 286, 231 vs 569 at 8) */
#endif
#ifndef FEW_LWS
#define FEW_LWS 256 /* threads of a work-group (FEW_LWS / FEW_TN rows at most; CPU devices: PF_LWS's 32, for
                     * gemm_few_norm's epilogue) */
#endif
#ifndef FEW_U
#define FEW_U 1 /* units a thread reads at once, all before their terms are computed: the bytes a work-group has in
                 * flight (a work-group takes FEW_U x FEW_LWS units at a time; the same sums in the same order) */
#endif
#define FEW_CHUNK (FEW_U * FEW_LWS) /* units a work-group computes at a time */

/* The integer sums of token t's block at input kb with the block's codes c[] (4 a uint, as bytes) */
inline int few_dot(uint8 c, __global const char *xq, int cols, int lv, int t, int kb) {
    __global const char *x = xq + (size_t)t * lv * cols + kb;
    uint8 a = vload8(0, (__global const uint *)x);
    int ia = dp4a(c.s0, a.s0, 0);
    ia = dp4a(c.s1, a.s1, ia), ia = dp4a(c.s2, a.s2, ia), ia = dp4a(c.s3, a.s3, ia);
    ia = dp4a(c.s4, a.s4, ia), ia = dp4a(c.s5, a.s5, ia), ia = dp4a(c.s6, a.s6, ia), ia = dp4a(c.s7, a.s7, ia);
    if (lv == 2) {
        uint8 b = vload8(0, (__global const uint *)(x + cols));
        int i2 = dp4a(c.s0, b.s0, 0);
        i2 = dp4a(c.s1, b.s1, i2), i2 = dp4a(c.s2, b.s2, i2), i2 = dp4a(c.s3, b.s3, i2);
        i2 = dp4a(c.s4, b.s4, i2), i2 = dp4a(c.s5, b.s5, i2), i2 = dp4a(c.s6, b.s6, i2), i2 = dp4a(c.s7, b.s7, i2);
        ia = ia * 128 + i2;
    }
    return ia;
}

/* The same for the half block of 16 inputs at k with its codes c[] */
inline int few_dot16(uint4 c, __global const char *xq, int cols, int lv, int t, int k) {
    __global const char *x = xq + (size_t)t * lv * cols + k;
    uint4 a = vload4(0, (__global const uint *)x);
    int ia = dp4a(c.s0, a.s0, 0);
    ia = dp4a(c.s1, a.s1, ia), ia = dp4a(c.s2, a.s2, ia), ia = dp4a(c.s3, a.s3, ia);
    if (lv == 2) {
        uint4 b = vload4(0, (__global const uint *)(x + cols));
        int i2 = dp4a(c.s0, b.s0, 0);
        i2 = dp4a(c.s1, b.s1, i2), i2 = dp4a(c.s2, b.s2, i2), i2 = dp4a(c.s3, b.s3, i2);
        ia = ia * 128 + i2;
    }
    return ia;
}

/* Row wr's 32 codes of the block at input kb as bytes, 4 a uint (bits words: one load of 8, 16 or 32 bytes) */
inline uint8 few_codes(__global const uchar *W, int bits, size_t row_words, int wr, int kb) {
    __global const uint *p = (__global const uint *)W + (size_t)wr * row_words + (size_t)kb * bits / 32;
    if (bits == 8) return vload8(0, p);
    if (bits == 4) {
        uint4 v = vload4(0, p);
        return (uint8)(unpack4(v.x, 4), unpack4(v.x >> 16, 4), unpack4(v.y, 4), unpack4(v.y >> 16, 4), unpack4(v.z, 4),
                       unpack4(v.z >> 16, 4), unpack4(v.w, 4), unpack4(v.w >> 16, 4));
    }
    uint2 v = vload2(0, p);
    return (uint8)(unpack4(v.x, 2), unpack4(v.x >> 8, 2), unpack4(v.x >> 16, 2), unpack4(v.x >> 24, 2), unpack4(v.y, 2),
                   unpack4(v.y >> 8, 2), unpack4(v.y >> 16, 2), unpack4(v.y >> 24, 2));
}

/* What a thread reads for one unit (gemm_few_body): its weights' scale and bias, its codes (a step: two
 * blocks'), where its inputs start, and whether its blocks are inside the slice */
struct few_unit {
    float s, o;
    uint8 c0w, c1w;
    int ku, kb0, ok0, ok1, hf, live;
};

inline struct few_unit few_load(WARGS(0), WARGS(1), WARGS(2), int rows_a, int rows_ab, int rows, int cols, int k_begin, int k_end,
                                int unit, int units, int pairs, int r0, int i) {
    Q_FIX(bits0, gs0, dt0);
    int step = unit == 1, per = unit == 1 ? 1 : unit == 2 ? 4 : 2, ng = cols / gs0;
    size_t row_words = (size_t)cols * bits0 / 32;
    int rl = i / units, u = i % units, r = r0 + rl;
    struct few_unit f;
    f.live = i < pairs && r < rows;
    f.ok0 = f.ok1 = 0, f.ku = f.kb0 = f.hf = 0, f.s = f.o = 0.0f, f.c0w = f.c1w = (uint8)(0u);
    if (!f.live) return f;
    /* the row's matrix in the stack (GEMM_PICK's choice, a row at a time) */
    __global const uchar *W = W0, *S = S0, *B = B0;
    int wr = r;
    if (r >= rows_ab) W = W2, S = S2, B = B2, wr = r - rows_ab;
    else if (r >= rows_a) W = W1, S = S1, B = B1, wr = r - rows_a;
    /* the unit's inputs from ku: its blocks kb0 and (a step's) kb1, or (groups of 16) half hf of
     * block kb0; a block past k_end adds nothing, as in the GEMMs */
    f.ku = k_begin + u / per * GEMM_TK + GEMM_TK / per * (u % per), f.kb0 = f.ku & ~31, f.hf = f.ku % 32 / 16;
    int kb1 = f.kb0 + 32;
    f.ok0 = f.kb0 < k_end, f.ok1 = step && kb1 < k_end;
    size_t g = (size_t)wr * ng + f.ku / gs0;
    f.s = f.ok0 ? ld_s(S, dt0, g) : 0.0f, f.o = f.ok0 ? ld_b(S, B, dt0, g) : 0.0f;
    f.c0w = f.ok0 ? few_codes(W, bits0, row_words, wr, f.kb0) : (uint8)(0u);
    f.c1w = f.ok1 ? few_codes(W, bits0, row_words, wr, kb1) : (uint8)(0u);
    return f;
}

/* Unit f's term for token t */
inline float few_term(struct few_unit f, int unit, const int lv, int t, int cols, __global const char *xq,
                      __global const float *xd, __global const float *xsum, __global const float *xh) {
    int nb = cols / 32;
    size_t xb = (size_t)t * nb + f.kb0 / 32;
    float d0 = f.ok0 ? xd[xb] * (lv == 2 ? 1.0f / 128.0f : 1.0f) : 0.0f;
    if (unit == 2) {
        int p = f.ok0 ? few_dot16(f.hf ? f.c0w.hi : f.c0w.lo, xq, cols, lv, t, f.ku) : 0;
        return gemm_term(f.s, f.o, d0, p, f.ok0 ? xh[(size_t)t * (cols / 16) + f.ku / 16] : 0.0f);
    }
    int p = f.ok0 ? few_dot(f.c0w, xq, cols, lv, t, f.kb0) : 0;
    float m0 = f.ok0 ? xsum[xb] : 0.0f;
    if (unit != 1) return gemm_term(f.s, f.o, d0, p, m0);
    int q = f.ok1 ? few_dot(f.c1w, xq, cols, lv, t, f.kb0 + 32) : 0;
    float d1 = f.ok1 ? xd[xb + 1] * (lv == 2 ? 1.0f / 128.0f : 1.0f) : 0.0f, m1 = f.ok1 ? xsum[xb + 1] : 0.0f;
    return gemm_term2(f.s, f.o, d0, p, d1, q, m0 + m1);
}

inline void gemm_few_body(GEMM_Q8_ARGS, const int lv, int unit, int tr, __local float *T) {
    Q_FIX(bits0, gs0, dt0);
    int lid = get_local_id(0), r0 = get_group_id(0) * tr, per = unit == 1 ? 1 : unit == 2 ? 4 : 2;
    GEMM_K_RANGE(k_begin, k_end);
    int units = (k_end - k_begin + GEMM_TK - 1) / GEMM_TK * per, pairs = tr * units;
    int sr = lid / FEW_TN, st = lid % FEW_TN; /* the (row, token) this thread adds up */
    float acc = 0.0f;
    for (int c0 = 0; c0 < pairs; c0 += FEW_CHUNK) {
        struct few_unit f[FEW_U];
#pragma unroll
        for (int v = 0; v < FEW_U; v++) /* every read first */
            f[v] = few_load(WPASS(0), WPASS(1), WPASS(2), rows_a, rows_ab, rows, cols, k_begin, k_end, unit, units, pairs, r0,
                            c0 + v * FEW_LWS + lid);
#pragma unroll
        for (int v = 0; v < FEW_U; v++) {
            if (!f[v].live) continue;
#pragma unroll
            for (int t = 0; t < FEW_TN; t++)
                if (t < n_tok) T[t * FEW_CHUNK + v * FEW_LWS + lid] = few_term(f[v], unit, lv, t, cols, xq, xd, xsum, xh);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (sr < tr) { /* this chunk's units of row sr, in order */
            int a = max(c0, sr * units) - c0, z = min(c0 + FEW_CHUNK, (sr + 1) * units) - c0;
            __local const float *Tt = T + st * FEW_CHUNK;
#pragma unroll 8
            for (int j = a; j < z; j++) acc += Tt[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    int r = r0 + sr;
    if (sr < tr && r < rows && st < n_tok) gemm_put(acc, r, st, rows, vecs, bias_off, y, y_off, ldy, add, part, n_tok);
}

/* For an epilogue done a block of rows at a time (gemm_few_rope: a head; gemm_few_norm: one block of all the
 * rows, so the launch's last work-group): the blocks of `bs` (>= 16) rows
 * whose last rows this work-group computed (rows [ra, rb), slice get_group_id(2)), in mine[1 ..]
 * (FEW_BLOCKS_MAX at most), their count in mine[0] (and returned). count[b]: rows of block b done so far in
 * this launch over every slice, set back to 0 by the group that finds the block whole, for the next launch.
 * Each work-item's stores are fenced before the rows are counted (the threadfence pattern); the caller
 * then reads the blocks' outputs past L1 (gemm_in_bias_l2, norm_row_l2). */
#define FEW_BLOCKS_MAX (FEW_LWS / FEW_TN / 16 + 2) /* blocks of 16 rows or more that FEW_LWS / FEW_TN rows touch */
inline int few_blocks_done(volatile __global int *count, int bs, int ra, int rb, __local int *mine) {
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        int n = 0, whole = bs * (int)get_num_groups(2);
        for (int r = ra, end; r < rb; r = end) {
            int b = r / bs, c;
            end = min(rb, bs * (b + 1)), c = end - r;
            if (atomic_add(count + b, c) == whole - c) count[b] = 0, mine[++n] = b;
        }
        mine[0] = n;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int n = mine[0];
    if (n) mem_fence(CLK_GLOBAL_MEM_FENCE);
    return n;
}

__kernel __attribute__((reqd_work_group_size(FEW_LWS, 1, 1))) void gemm_few(GEMM_Q8_KARGS, int unit, int tr) {
    __local float T[FEW_CHUNK * FEW_TN];
    GEMM_Q8_OPEN;
    gemm_few_body(GEMM_Q8_PASS, 1, unit, tr, T);
}

__kernel __attribute__((reqd_work_group_size(FEW_LWS, 1, 1))) void gemm_few_2(GEMM_Q8_KARGS, int unit, int tr) {
    __local float T[FEW_CHUNK * FEW_TN];
    GEMM_Q8_OPEN;
    gemm_few_body(GEMM_Q8_PASS, 2, unit, tr, T);
}
