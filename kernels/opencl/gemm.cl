/* Tiled GEMMs for prompt processing: Y[t][r] = sum_k W[r][k] X[t][k] (+ bias[r]) (+ Y[t][r]) for a
 * chunk of tokens at once (engine/backend/opencl/cl_prefill.c drives them). A work-group of GEMM_T x
 * GEMM_T threads computes a tile of GEMM_TM rows x GEMM_TN tokens, each thread GEMM_RM x GEMM_RN of
 * it (rows tx + GEMM_T i, so a warp's stores of one token are consecutive rows); the weights and the
 * activations of GEMM_TK inputs at a time are staged in local memory, rows padded by one word so the
 * threads of a warp read different banks.
 *   gemm_q8: int8 activations (per block of 32: codes, scale d and the block's sum, as the CPU's
 *            packed kernels take them), in one level or two (lv; emit_lane in prefill.cl: a token's
 *            row of codes is followed by its row of level two), affine codes of 2, 4 or 8 bits
 *            unpacked to bytes when staged, 4 products at a time by dp4a; per block the integer sums
 *            (two levels: 128 x level one's + level two's, still exact in 32 bits) are scaled by the
 *            row's group scale and d (d / 128), and the group bias meets the block sum. Groups of 32
 *            or more; groups of 16 (GGUF's K-quants, nvfp4: gemm_q8_g16, ...) take a term a half block,
 *            with the half block's input sum (xh).
 *   gemm_f:  float activations (--exact, dense weights, groups of 16): weights widened when staged.
 * Tunables are #ifndef defaults (-D overrides them; the host reads them back with prefill_tunables). */

#ifndef GEMM_T
#define GEMM_T 16 /* threads along each side of a work-group (GEMM_T x GEMM_T) */
#endif
#ifndef GEMM_RM
#define GEMM_RM 4 /* rows of the tile a thread computes */
#endif
#ifndef GEMM_RN
#define GEMM_RN 4 /* tokens of the tile a thread computes */
#endif
#define GEMM_TM (GEMM_T * GEMM_RM) /* rows of a work-group's tile */
#define GEMM_TN (GEMM_T * GEMM_RN) /* tokens of a work-group's tile */
#define GEMM_LWS (GEMM_T * GEMM_T)
#define GEMM_TK 64                 /* inputs staged at a time (gemm_q8: two blocks of 32) */
#define GEMM_KW (GEMM_TK / 4)      /* words of 4 bytes along them */
#define GEMM_FK 32                 /* inputs staged at a time by gemm_f */

/* The 4 codes in the low 4 x bits bits of v as 4 bytes */
inline uint unpack4(uint v, int bits) {
    if (bits == 8) return v;
    if (bits == 4) return (v & 0xfu) | ((v & 0xf0u) << 4) | ((v & 0xf00u) << 8) | ((v & 0xf000u) << 12);
    return (v & 0x3u) | ((v & 0xcu) << 6) | ((v & 0x30u) << 12) | ((v & 0xc0u) << 18);
}

/* Codes k .. k + 3 of row r as 4 bytes (k % 4 == 0, bits 2, 4 or 8: they never straddle a word) */
inline uint codes4(__global const uchar *W, int bits, size_t row_words, int r, int k) {
    int bit = k * bits;
    return unpack4(((__global const uint *)W)[(size_t)r * row_words + (bit >> 5)] >> (bit & 31), bits);
}

/* A unit's share of an output's sum: a block of 32 inputs (gemm_term: the integer dot product ia of its
 * codes and the input's, the row's group scale s and bias o, the input's scale d and code sum m), or a
 * staging step of two blocks in one weight group (gemm_term2, gemm_q8_mma's groups of 64 or more). Every
 * kernel that computes these sums (the GEMMs here, gemm_few in gemm_few.cl) adds the same terms in the
 * same order from 0, so a token's output has the same bits whichever kernel its step took; the fma()s
 * are written out so that no compiler contracts the products its own way. */
inline float gemm_term(float s, float o, float d, int ia, float m) { return fma(s, d * (float)ia, o * m); }
inline float gemm_term2(float s, float o, float d0, int p, float d1, int q, float m) {
    return fma(s, fma(d0, (float)p, d1 * (float)q), o * m);
}

/* Split-K (the host's choice where a GEMM has too few tiles to fill the device): work-group z of
 * get_num_groups(2) takes inputs [z k_len, (z + 1) k_len) and leaves its sums in part[z][t][r];
 * gemm_reduce adds the slices in order (so the result does not depend on timing), then the bias and
 * the residual. Unsplit, the epilogue does that itself. */
#define GEMM_K_RANGE(k_begin, k_end)                                                                    \
    int k_begin = get_group_id(2) * k_len, k_end = min(cols, k_begin + k_len)
/* y[t][y_off + r] (+)= v + bias[r] */
inline void gemm_out(float v, int r, int t, __global const float *vecs, int bias_off, __global float *y, int y_off, int ldy,
                     int add) {
    __global float *p = y + y_off + (size_t)t * ldy + r;
    v += bias_off >= 0 ? vecs[bias_off + r] : 0.0f;
    *p = add ? *p + v : v;
}

inline void gemm_put(float acc, int r, int t, int rows, __global const float *vecs, int bias_off, __global float *y,
                     int y_off, int ldy, int add, __global float *part, int n_tok) {
    if (get_num_groups(2) > 1) part[((size_t)get_group_id(2) * n_tok + t) * rows + r] = acc;
    else gemm_out(acc, r, t, vecs, bias_off, y, y_off, ldy, add);
}

/* The epilogue of the GEMM_T x GEMM_T kernels */
#define GEMM_STORE(acc)                                                                                 \
    for (int i = 0; i < GEMM_RM; i++)                                                                   \
        for (int j = 0; j < GEMM_RN; j++) {                                                             \
            int r = r0 + tx + GEMM_T * i, t = t0 + ty + GEMM_T * j;                                     \
            if (r < rows && t < n_tok) gemm_put(acc[i][j], r, t, rows, vecs, bias_off, y, y_off, ldy, add, part, n_tok); \
        }

#define GEMM_SPLIT_ARGS __global float *part, int k_len

/* Up to three matrices of one format stacked by rows (q, k, v; gate, up), one launch for all: rows
 * [0, rows_a) are W0's, [rows_a, rows_ab) W1's, [rows_ab, rows) W2's, each boundary on a tile's edge.
 * GEMM_PICK makes W0, S0, B0 the tile's matrix, wr0 the tile's first row in it and wrows its rows;
 * the output rows stay counted over the stack. */
#define GEMM_STACK_ARGS WARGS(1), WARGS(2), int rows_a, int rows_ab
/* The stack as a kernel takes it: one buffer A at byte offsets (WOFF), GEMM_STACK_OPEN making the pointers */
#define GEMM_STACK_KARGS __global const uchar *A, WOFF(0), WOFF(1), WOFF(2), int rows_a, int rows_ab
#define GEMM_STACK_OPEN                                                                                 \
    WAT(A, 0);                                                                                          \
    WAT(A, 1);                                                                                          \
    WAT(A, 2)
#define GEMM_PICK(r0, wr0, wrows)                                                                       \
    int wr0 = r0, wrows = rows_a;                                                                       \
    if (r0 >= rows_ab) W0 = W2, S0 = S2, B0 = B2, wr0 = r0 - rows_ab, wrows = rows - rows_ab;          \
    else if (r0 >= rows_a) W0 = W1, S0 = S1, B0 = B1, wr0 = r0 - rows_a, wrows = rows_ab - rows_a

/* The slices of output (t, r) added in order; gemm_slices_l2 reads them past L1 (volatile), for a kernel
 * whose other work-groups wrote them (gemm_few_norm) */
#define GEMM_SLICES_FN(name, Q)                                                                         \
    inline float name(Q __global const float *part, int n_split, int n_tok, int rows, int t, int r) {   \
        float v = 0.0f;                                                                                 \
        for (int z = 0; z < n_split; z++) v += part[((size_t)z * n_tok + t) * rows + r];                \
        return v;                                                                                       \
    }
GEMM_SLICES_FN(gemm_slices, )
GEMM_SLICES_FN(gemm_slices_l2, volatile)

__kernel void gemm_reduce(__global const float *part, int n_split, int rows, int n_tok, __global const float *vecs,
                          int bias_off, __global float *y, int y_off, int ldy, int add) {
    int r = get_global_id(0), t = get_global_id(1);
    if (r >= rows || t >= n_tok) return;
    gemm_out(gemm_slices(part, n_split, n_tok, rows, t, r), r, t, vecs, bias_off, y, y_off, ldy, add);
}

/* Output (t, r) of a GEMM of `rows` rows, as the kernel after it reads it: from y ([n_tok][rows], where
 * the GEMM or gemm_reduce left it), or (n_split > 1) summed from the slices the host left for it, the same
 * arithmetic as gemm_reduce's (which that launch then saves). gemm_in: a GEMM without biases;
 * gemm_in_bias: with vecs[bias_off + r] (bias_off >= 0), which the GEMM adds itself when it does not split;
 * gemm_in_l2, gemm_in_bias_l2: the same past L1 (volatile), for a kernel whose other work-groups wrote y or
 * the slices (gemm_few_rope) */
#define GEMM_IN_FNS(in, in_bias, Q, slices)                                                                 \
    inline float in(Q __global const float *y, __global const float *part, int n_split, int n_tok, int rows, int t, \
                    int r) {                                                                                \
        return n_split <= 1 ? y[(size_t)t * rows + r] : slices(part, n_split, n_tok, rows, t, r);           \
    }                                                                                                       \
    inline float in_bias(Q __global const float *y, __global const float *part, int n_split, int n_tok, int rows, int t, \
                         int r, __global const float *vecs, int bias_off) {                                 \
        float v = in(y, part, n_split, n_tok, rows, t, r);                                                  \
        return n_split > 1 && bias_off >= 0 ? v + vecs[bias_off + r] : v;                                  \
    }
GEMM_IN_FNS(gemm_in, gemm_in_bias, , gemm_slices)
GEMM_IN_FNS(gemm_in_l2, gemm_in_bias_l2, volatile, gemm_slices_l2)

/* The qkv arguments of pf_rope and paged_rope (kernels/opencl/prefill.cl, paged.cl): [q | k | v]
 * ([n_tok][q_dim + 2 kv_dim], biases added), or its slices with the biases at vecs[bias_off ..] (gemm_in_bias) */
#define QKV_IN_ARGS                                                                                         \
    __global const float *qkv, __global const float *part, int n_split, int n_tok, __global const float *vecs, int bias_off
/* Elements c and c + half_d of token t's row (a RoPE pair, or a pair of values) */
#define QKV_PAIR(t, c, half_d, ld)                                                                          \
    (float2)(gemm_in_bias(qkv, part, n_split, n_tok, ld, t, c, vecs, bias_off),                             \
             gemm_in_bias(qkv, part, n_split, n_tok, ld, t, (c) + (half_d), vecs, bias_off))

/* gemm_q8's and gemm_q8_mma's arguments, and the same passed on */
#define GEMM_Q8_ARGS                                                                                        \
    WARGS(0), GEMM_STACK_ARGS, int rows, int cols, int n_tok, __global const char *xq, __global const float *xd, \
        __global const float *xsum, __global const float *xh, __global const float *vecs, int bias_off,         \
        __global float *y, int y_off, int ldy, int add, GEMM_SPLIT_ARGS
#define GEMM_Q8_PASS                                                                                        \
    WPASS(0), WPASS(1), WPASS(2), rows_a, rows_ab, rows, cols, n_tok, xq, xd, xsum, xh, vecs, bias_off, y, y_off, ldy, \
        add, part, k_len
/* ... as a kernel takes them: the weights in one buffer (WOFF), the input's int8 codes, block scales, block
 * sums and half-block sums in another (io) at byte offsets; GEMM_Q8_OPEN makes the pointers */
#define GEMM_Q8_KARGS                                                                                       \
    GEMM_STACK_KARGS, int rows, int cols, int n_tok, __global const uchar *io, ulong xq_o, ulong xd_o, ulong xs_o, \
        ulong xh_o, __global const float *vecs, int bias_off, __global float *y, int y_off, int ldy, int add,      \
        GEMM_SPLIT_ARGS
#define GEMM_Q8_OPEN                                                                                        \
    GEMM_STACK_OPEN;                                                                                        \
    __global const char *xq = (__global const char *)(io + xq_o);                                           \
    __global const float *xd = (__global const float *)(io + xd_o), *xsum = (__global const float *)(io + xs_o), \
                         *xh = (__global const float *)(io + xh_o)

/* The body of gemm_q8 (lv levels: 1 or 2; nh terms a block of 32: 1, or 2 for weight groups of 16, a
 * term a half block with its own scale, bias and input sum (xh); constants in each kernel, so the
 * one-level kernel keeps its registers and local memory) over local tiles the kernel declares (Bs2:
 * level two's; Asc, Abi, Bsum: 2 nh a staging step) */
inline void gemm_q8_tiles(GEMM_Q8_ARGS, const int lv, const int nh, __local uint (*As)[GEMM_KW + 1], __local uint (*Bs)[GEMM_KW + 1],
                          __local uint (*Bs2)[GEMM_KW + 1], __local float (*Asc)[GEMM_TM], __local float (*Abi)[GEMM_TM],
                          __local float (*Bd)[GEMM_TN], __local float (*Bsum)[GEMM_TN]) {
    Q_FIX(bits0, gs0, dt0);
    int tx = get_local_id(0), ty = get_local_id(1), lid = ty * GEMM_T + tx;
    int r0 = get_group_id(0) * GEMM_TM, t0 = get_group_id(1) * GEMM_TN;
    GEMM_PICK(r0, wr0, wrows);
    size_t row_words = (size_t)cols * bits0 / 32;
    int ng = cols / gs0, nb = cols / 32, hk = 32 / nh; /* inputs of a term */
    float acc[GEMM_RM][GEMM_RN];
    for (int i = 0; i < GEMM_RM; i++)
        for (int j = 0; j < GEMM_RN; j++) acc[i][j] = 0.0f;
    GEMM_K_RANGE(k_begin, k_end);
    for (int k0 = k_begin; k0 < k_end; k0 += GEMM_TK) {
        for (int i = lid; i < GEMM_TM * GEMM_KW; i += GEMM_LWS) {
            int r = i / GEMM_KW, kw = i % GEMM_KW, k = k0 + 4 * kw;
            As[r][kw] = wr0 + r < wrows && k < k_end ? codes4(W0, bits0, row_words, wr0 + r, k) : 0u;
        }
        for (int i = lid; i < GEMM_TN * GEMM_KW; i += GEMM_LWS) {
            int t = i / GEMM_KW, kw = i % GEMM_KW, k = k0 + 4 * kw, ok = t0 + t < n_tok && k < k_end;
            __global const uint *xr = (__global const uint *)(xq + (size_t)(t0 + t) * lv * cols);
            Bs[t][kw] = ok ? xr[k / 4] : 0u;
            if (lv == 2) Bs2[t][kw] = ok ? xr[(cols + k) / 4] : 0u;
        }
        for (int i = lid; i < 2 * nh * GEMM_TM; i += GEMM_LWS) {
            int h = i / GEMM_TM, r = i % GEMM_TM, k = k0 + hk * h, ok = wr0 + r < wrows && k < k_end;
            size_t g = (size_t)(wr0 + r) * ng + k / gs0;
            Asc[h][r] = ok ? ld_s(S0, dt0, g) : 0.0f;
            Abi[h][r] = ok ? ld_b(S0, B0, dt0, g) : 0.0f;
        }
        for (int i = lid; i < 2 * GEMM_TN; i += GEMM_LWS) {
            int b = i / GEMM_TN, t = i % GEMM_TN, k = k0 + 32 * b, ok = t0 + t < n_tok && k < k_end;
            Bd[b][t] = ok ? xd[(size_t)(t0 + t) * nb + k / 32] * (lv == 2 ? 1.0f / 128.0f : 1.0f) : 0.0f;
        }
        for (int i = lid; i < 2 * nh * GEMM_TN; i += GEMM_LWS) {
            int h = i / GEMM_TN, t = i % GEMM_TN, k = k0 + hk * h, ok = t0 + t < n_tok && k < k_end;
            Bsum[h][t] = ok ? (nh == 2 ? xh[(size_t)(t0 + t) * (cols / 16) + k / 16] : xsum[(size_t)(t0 + t) * nb + k / 32]) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (int h = 0; h < 2 * nh; h++) { /* the step's terms: blocks, or half blocks */
            int b = h / nh, ia[GEMM_RM][GEMM_RN];
            for (int i = 0; i < GEMM_RM; i++)
                for (int j = 0; j < GEMM_RN; j++) ia[i][j] = 0;
            for (int l = 0; l < lv; l++) { /* level two: 128 x level one's sums + its own */
                __local uint(*X)[GEMM_KW + 1] = l ? Bs2 : Bs;
                for (int i = 0; l && i < GEMM_RM; i++)
                    for (int j = 0; j < GEMM_RN; j++) ia[i][j] *= 128;
#pragma unroll
                for (int kw = 8 / nh * h; kw < 8 / nh * (h + 1); kw++) {
                    uint a[GEMM_RM], v[GEMM_RN];
                    for (int i = 0; i < GEMM_RM; i++) a[i] = As[tx + GEMM_T * i][kw];
                    for (int j = 0; j < GEMM_RN; j++) v[j] = X[ty + GEMM_T * j][kw];
                    for (int i = 0; i < GEMM_RM; i++)
                        for (int j = 0; j < GEMM_RN; j++) ia[i][j] = dp4a(a[i], v[j], ia[i][j]);
                }
            }
            for (int i = 0; i < GEMM_RM; i++) {
                float s = Asc[h][tx + GEMM_T * i], o = Abi[h][tx + GEMM_T * i];
                for (int j = 0; j < GEMM_RN; j++)
                    acc[i][j] += gemm_term(s, o, Bd[b][ty + GEMM_T * j], ia[i][j], Bsum[h][ty + GEMM_T * j]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    GEMM_STORE(acc);
}

#define GEMM_Q8_LOCALS(n2, nh)                                                                              \
    __local uint As[GEMM_TM][GEMM_KW + 1], Bs[GEMM_TN][GEMM_KW + 1], Bs2[n2][GEMM_KW + 1];                 \
    __local float Asc[2 * (nh)][GEMM_TM], Abi[2 * (nh)][GEMM_TM], Bd[2][GEMM_TN], Bsum[2 * (nh)][GEMM_TN]
/* gemm_q8 in lv levels, for weights in groups of 32 or more (nh 1) or of 16 (nh 2) */
#define GEMM_Q8_KERNEL(name, lv, nh)                                                                        \
    __kernel __attribute__((reqd_work_group_size(GEMM_T, GEMM_T, 1))) void name(GEMM_Q8_KARGS) {             \
        GEMM_Q8_LOCALS((lv) == 2 ? GEMM_TN : 1, nh);                                                         \
        GEMM_Q8_OPEN;                                                                                        \
        gemm_q8_tiles(GEMM_Q8_PASS, lv, nh, As, Bs, Bs2, Asc, Abi, Bd, Bsum);                               \
    }
GEMM_Q8_KERNEL(gemm_q8, 1, 1)
GEMM_Q8_KERNEL(gemm_q8_2, 2, 1)
GEMM_Q8_KERNEL(gemm_q8_g16, 1, 2)
GEMM_Q8_KERNEL(gemm_q8_2_g16, 2, 2)

/* Element k of row r of W as a float (dense, or affine codes) */
inline float w_at(WARGS(0), int cols, int r, int k) {
    Q_FIX(bits0, gs0, dt0);
    if (bits0 == 0) return ld(W0, dt0, (size_t)r * cols + k);
    int per = 32 / bits0;
    uint word = ((__global const uint *)W0)[(size_t)r * (cols / per) + k / per];
    float q = (float)((word >> ((k % per) * bits0)) & ((1u << bits0) - 1u));
    size_t g = (size_t)r * (cols / gs0) + k / gs0;
    return ld_s(S0, dt0, g) * q + ld_b(S0, B0, dt0, g);
}

__kernel __attribute__((reqd_work_group_size(GEMM_T, GEMM_T, 1))) void
gemm_f(GEMM_STACK_KARGS, int rows, int cols, int n_tok, __global const uchar *io, ulong x_o, __global const float *vecs,
       int bias_off, __global float *y, int y_off, int ldy, int add, GEMM_SPLIT_ARGS) {
    __local float As[GEMM_TM][GEMM_FK + 1], Bs[GEMM_TN][GEMM_FK + 1];
    GEMM_STACK_OPEN;
    __global const float *x = (__global const float *)(io + x_o);
    int tx = get_local_id(0), ty = get_local_id(1), lid = ty * GEMM_T + tx;
    int r0 = get_group_id(0) * GEMM_TM, t0 = get_group_id(1) * GEMM_TN;
    GEMM_PICK(r0, wr0, wrows);
    float acc[GEMM_RM][GEMM_RN];
    for (int i = 0; i < GEMM_RM; i++)
        for (int j = 0; j < GEMM_RN; j++) acc[i][j] = 0.0f;
    GEMM_K_RANGE(k_begin, k_end);
    for (int k0 = k_begin; k0 < k_end; k0 += GEMM_FK) {
        for (int i = lid; i < GEMM_TM * GEMM_FK; i += GEMM_LWS) {
            int r = i / GEMM_FK, k = k0 + i % GEMM_FK;
            As[r][i % GEMM_FK] = wr0 + r < wrows && k < k_end ? w_at(WPASS(0), cols, wr0 + r, k) : 0.0f;
        }
        for (int i = lid; i < GEMM_TN * GEMM_FK; i += GEMM_LWS) {
            int t = i / GEMM_FK, k = k0 + i % GEMM_FK;
            Bs[t][i % GEMM_FK] = t0 + t < n_tok && k < k_end ? x[(size_t)(t0 + t) * cols + k] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll 8
        for (int k = 0; k < GEMM_FK; k++) {
            float a[GEMM_RM], v[GEMM_RN];
            for (int i = 0; i < GEMM_RM; i++) a[i] = As[tx + GEMM_T * i][k];
            for (int j = 0; j < GEMM_RN; j++) v[j] = Bs[ty + GEMM_T * j][k];
            for (int i = 0; i < GEMM_RM; i++)
                for (int j = 0; j < GEMM_RN; j++) acc[i][j] = fma(a[i], v[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    GEMM_STORE(acc);
}

#if defined(MMA_PTX) || defined(MMA_EMU)
/* gemm_q8 on NVIDIA's int8 tensor cores (the host adds -DMMA_PTX there): the same tiles of 64 rows x
 * 64 tokens and the same sums, by `mma.sync.m16n8k32` (inline PTX; sm_80 and later) instead of dp4a.
 * Four warps, each 32 rows x 32 tokens of the tile: two 16-row by four 8-token fragments a block of
 * 32 inputs. Fragments as PTX lays them out for m16n8k32 with 8-bit operands (lane = 4 g + c):
 *   A (16 x 32, row-major): rows g and g + 8, bytes 4c .. 4c + 3 and 16 + 4c .. 16 + 4c + 3
 *   B (32 x 8, column-major): token g, bytes 4c .. 4c + 3 and 16 + 4c .. 16 + 4c + 3
 *   C (16 x 8, int32): rows g and g + 8, tokens 2c and 2c + 1
 * Staged rows are GEMM_KW + 4 words apart, so the 8 rows x 4 words a fragment load touches fall in
 * 32 different banks. -DMMA_EMU (any device; tests) computes the mma in plain OpenCL instead, so a CPU
 * device (PoCL, in CI) runs these kernels' tiles, staging and bookkeeping. */
#define MMA_TM 64
#define MMA_TN 64 /* the tile's tokens; gemm_q8_mma_t16* and _t32* take 16 and 32 (steps of at most that many) */
#define MMA_LWS 128
#define MMA_KS (GEMM_KW + 4) /* words between staged rows */
/* Staging steps (GEMM_TK inputs each) a tile of 16 or 32 tokens reads at once, between one pair of barriers
 * (a 64-token tile: 1): a small tile's work a step is small, so more of its reads are put in flight at once.
 * H100, Qwen2-7B, steps of 1 and 16 tokens: 2 +1-5%, 4 -4% (docs/performance.md, Steps of a few sequences).
 * (MMA_DEEP_32 4 would pass 48 KB of local memory with two levels and groups of 16.) */
#ifndef MMA_DEEP_16
#define MMA_DEEP_16 2
#endif
#ifndef MMA_DEEP_32
#define MMA_DEEP_32 1
#endif
#define MMA_DEEP_MAX (MMA_DEEP_16 > MMA_DEEP_32 ? MMA_DEEP_16 : MMA_DEEP_32)
#define MMA_DEEP(tn) ((tn) == 16 ? MMA_DEEP_16 : (tn) == 32 ? MMA_DEEP_32 : 1)

#ifndef MMA_ASM_QUAL
#define MMA_ASM_QUAL volatile /* empty: the compiler may move the mma instructions among the others */
#endif

#if defined(MMA_PTX)
#define MMA_EMU_WORDS 1
inline int4 mma_u8s8(uint a0, uint a1, uint a2, uint a3, uint b0, uint b1, int4 c, __local uint *emu) {
    int4 d;
    asm MMA_ASM_QUAL("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};"
                 : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c.x), "r"(c.y), "r"(c.z), "r"(c.w));
    return d;
}
#else
#define MMA_EMU_WORDS (MMA_LWS * 6) /* each work-item's fragments, for the rest of its warp of 32 to read */
/* The same integers as mma.sync's: the warp's fragments through local memory. Every work-item of the group
 * calls it (it holds barriers), as every call in gemm_q8_mma_tiles is. */
inline int4 mma_u8s8(uint a0, uint a1, uint a2, uint a3, uint b0, uint b1, int4 c, __local uint *emu) {
    int lid = get_local_id(0), lane = lid % 32, g = lane / 4, cq = lane % 4;
    __local uint *w = emu + (lid - lane) * 6;
    w[6 * lane] = a0, w[6 * lane + 1] = a1, w[6 * lane + 2] = a2, w[6 * lane + 3] = a3, w[6 * lane + 4] = b0, w[6 * lane + 5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    int s[4] = {c.x, c.y, c.z, c.w};
    for (int e = 0; e < 4; e++) {
        int hi = e / 2, tok = 2 * cq + e % 2; /* row g + 8 hi, token tok */
        for (int kw = 0; kw < 8; kw++) {
            uint av = w[6 * (4 * g + kw % 4) + (kw < 4 ? 0 : 2) + hi], bv = w[6 * (4 * tok + kw % 4) + 4 + (kw >= 4)];
            for (int q = 0; q < 4; q++) s[e] += (int)((av >> (8 * q)) & 0xffu) * (int)(char)((bv >> (8 * q)) & 0xffu);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return (int4)(s[0], s[1], s[2], s[3]);
}
#endif

/* A thread's share of one staging step, read from global memory a step ahead (the loads of step
 * k + 1 are in flight while step k multiplies): its words of codes as stored (bits of them: a tile's
 * rows hold 2 x bits words a step), of activations, and one scale, bias, d and block sum */
/* Words w .. w + 3 of row r's codes in the step at k0: one 16-byte load where the row's words allow
 * it (rows of whole 16 bytes) and all four lie before k_end, else a word at a time, 0 past k_end */
inline uint4 mma_codes(__global const uchar *W, size_t row_words, int bits, int r, int k0, int w, int k_end) {
    __global const uint *p = (__global const uint *)W + (size_t)r * row_words + (size_t)k0 * bits / 32 + w;
    int per = 32 / bits;
    if (row_words % 4 == 0 && k0 + (w + 4) * per <= k_end) return *(__global const uint4 *)p;
    return (uint4)(k0 + w * per < k_end ? p[0] : 0u, k0 + (w + 1) * per < k_end ? p[1] : 0u,
                   k0 + (w + 2) * per < k_end ? p[2] : 0u, k0 + (w + 3) * per < k_end ? p[3] : 0u);
}

#define MMA_XV (MMA_TN * GEMM_KW / 4 / MMA_LWS) /* a thread's uint4s of a step's activations (a level), at most */
struct mma_stage {
    uint4 a[2];
    uint4 x[MMA_XV], x2[MMA_XV];
    float s[2], o[2], d, m[2]; /* [half block] with weight groups of 16 (nh 2), else [0] */
};

inline struct mma_stage mma_load(WARGS(0), int rows, int cols, int n_tok, __global const char *xq, __global const float *xd,
                                 __global const float *xsum, __global const float *xh, int lv, const int nh, const int tn, int r0,
                                 int t0, int k0, int k_end) {
    Q_FIX(bits0, gs0, dt0);
    struct mma_stage st;
    int lid = get_local_id(0), wpr = 2 * bits0; /* words of a row a step */
    const int aj = (MMA_TM * wpr / 4 + MMA_LWS - 1) / MMA_LWS, xv = (tn * GEMM_KW / 4 + MMA_LWS - 1) / MMA_LWS;
    size_t row_words = (size_t)cols * bits0 / 32;
    for (int j = 0; j < aj; j++) { /* the tile's rows' words, 4 at a time (8-bit codes: 2 x 4 a thread) */
        int i = lid + j * MMA_LWS, r = i / (wpr / 4), w = 4 * (i % (wpr / 4));
        st.a[j] = i < MMA_TM * wpr / 4 && r0 + r < rows ? mma_codes(W0, row_words, bits0, r0 + r, k0, w, k_end) : (uint4)(0u);
    }
    for (int j = 0; j < xv; j++) { /* 16 bytes a load: rows of cols % 32 == 0 bytes keep them aligned */
        int i = lid + j * MMA_LWS, t = i / (GEMM_KW / 4), k = k0 + 16 * (i % (GEMM_KW / 4));
        int ok = t < tn && t0 + t < n_tok && k < k_end;
        __global const uint4 *xr = (__global const uint4 *)(xq + (size_t)(t0 + t) * lv * cols);
        st.x[j] = ok ? xr[k / 16] : (uint4)(0u);
        st.x2[j] = ok && lv == 2 ? xr[(cols + k) / 16] : (uint4)(0u);
    }
    int b = lid / MMA_TM, r = lid % MMA_TM, k = k0 + 32 * b, ok = r0 + r < rows && k < k_end; /* MMA_LWS == 2 MMA_TM */
    for (int h = 0; h < nh; h++) {
        size_t gi = (size_t)(r0 + r) * (cols / gs0) + (k + 16 * h) / gs0;
        st.s[h] = ok ? ld_s(S0, dt0, gi) : 0.0f, st.o[h] = ok ? ld_b(S0, B0, dt0, gi) : 0.0f;
    }
    ok = r < tn && t0 + r < n_tok && k < k_end;
    st.d = ok ? xd[(size_t)(t0 + r) * (cols / 32) + k / 32] * (lv == 2 ? 1.0f / 128.0f : 1.0f) : 0.0f;
    if (nh == 2) st.m[0] = ok ? xh[(size_t)(t0 + r) * (cols / 16) + k / 16] : 0.0f, st.m[1] = ok ? xh[(size_t)(t0 + r) * (cols / 16) + k / 16 + 1] : 0.0f;
    else st.m[0] = ok ? xsum[(size_t)(t0 + r) * (cols / 32) + k / 32] : 0.0f;
    return st;
}

/* Where a staging step lies in local memory: the buffers of step s of a stage (mma_at) */
struct mma_local {
    __local uint *As, *Bs, *Bs2;
    __local float (*Asc)[MMA_TM], (*Abi)[MMA_TM], (*Bd)[MMA_TN], (*Bsum)[MMA_TN];
};
inline struct mma_local mma_at(struct mma_local L, int s, const int tn, const int nh) {
    struct mma_local o = {L.As + s * MMA_TM * MMA_KS, L.Bs + s * tn * MMA_KS, L.Bs2 + s * tn * MMA_KS, L.Asc + s * 2 * nh,
                          L.Abi + s * 2 * nh, L.Bd + s * 2, L.Bsum + s * 2 * nh};
    return o;
}

/* A thread's share of a staging step into local memory */
inline void mma_store(const struct mma_stage *st, struct mma_local L, int bits0, int lv, const int nh, const int tn) {
    int lid = get_local_id(0), wpr = 2 * bits0, per = 32 / bits0;
    const int aj = (MMA_TM * wpr / 4 + MMA_LWS - 1) / MMA_LWS, xv = (tn * GEMM_KW / 4 + MMA_LWS - 1) / MMA_LWS;
    for (int j = 0; j < aj; j++) {
        int i = lid + j * MMA_LWS, r = i / (wpr / 4), w = 4 * (i % (wpr / 4));
        uint a4[4] = {st->a[j].x, st->a[j].y, st->a[j].z, st->a[j].w};
        if (i < MMA_TM * wpr / 4)
            for (int e = 0; e < 4; e++)
                for (int q = 0; q < per / 4; q++) L.As[r * MMA_KS + (w + e) * (per / 4) + q] = unpack4(a4[e] >> (4 * bits0 * q), bits0);
    }
    for (int j = 0; j < xv; j++) {
        int i = lid + j * MMA_LWS, at = (i / (GEMM_KW / 4)) * MMA_KS + 4 * (i % (GEMM_KW / 4));
        if (i >= tn * GEMM_KW / 4) break;
        *(__local uint4 *)(L.Bs + at) = st->x[j];
        if (lv == 2) *(__local uint4 *)(L.Bs2 + at) = st->x2[j];
    }
    for (int h = 0; h < nh; h++) {
        L.Asc[nh * (lid / MMA_TM) + h][lid % MMA_TM] = st->s[h], L.Abi[nh * (lid / MMA_TM) + h][lid % MMA_TM] = st->o[h];
        if (lid % MMA_TM < tn) L.Bsum[nh * (lid / MMA_TM) + h][lid % MMA_TM] = st->m[h];
    }
    if (lid % MMA_TM < tn) L.Bd[lid / MMA_TM][lid % MMA_TM] = st->d;
}

/* The body of gemm_q8_mma (lv and nh as gemm_q8_tiles'; tn: the tile's tokens, 64, 32 or 16). Each warp
 * takes mi fragments of 16 rows by mj of 8 tokens: 32 x 32 of a 64-token tile (2 x 2 warps), 32 x 16 of a
 * 32-token one (2 x 2), 16 x 16 of a 16-token one (4 x 1): a step of few tokens does only its tiles' work.
 * A stage is MMA_DEEP(tn) staging steps, read from global memory a stage ahead (the loads of stage k + 1
 * are in flight while stage k multiplies), each step's terms added in turn. A (row, token)'s terms and
 * their order are the same in each: so are its bits. */
inline void gemm_q8_mma_tiles(GEMM_Q8_ARGS, const int lv, const int nh, const int tn, struct mma_local L, __local uint *emu) {
    Q_FIX(bits0, gs0, dt0);
    const int mi = tn >= 32 ? 2 : 1, mj = tn == 64 ? 4 : 2, warps_r = MMA_TM / (16 * mi), deep = MMA_DEEP(tn);
    int lid = get_local_id(0), lane = lid % 32, warp = lid / 32, g = lane / 4, c = lane % 4;
    int wr = (warp % warps_r) * 16 * mi, wt = (warp / warps_r) * 8 * mj; /* the warp's rows and tokens in the tile */
    int r0 = get_group_id(0) * MMA_TM, t0 = get_group_id(1) * tn;
    GEMM_PICK(r0, wr0, wrows);
    float acc[2][4][4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    GEMM_K_RANGE(k_begin, k_end);
    struct mma_stage st[MMA_DEEP_MAX];
#pragma unroll
    for (int s = 0; s < deep; s++)
        st[s] = mma_load(WPASS(0), wrows, cols, n_tok, xq, xd, xsum, xh, lv, nh, tn, wr0, t0, k_begin + s * GEMM_TK, k_end);
    for (int k_st = k_begin; k_st < k_end; k_st += deep * GEMM_TK) {
#pragma unroll
        for (int s = 0; s < deep; s++)
            if (k_st + s * GEMM_TK < k_end) mma_store(&st[s], mma_at(L, s, tn, nh), bits0, lv, nh, tn);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k_st + deep * GEMM_TK < k_end)
#pragma unroll
            for (int s = 0; s < deep; s++)
                st[s] = mma_load(WPASS(0), wrows, cols, n_tok, xq, xd, xsum, xh, lv, nh, tn, wr0, t0,
                                 k_st + (deep + s) * GEMM_TK, k_end);
#pragma unroll
        for (int s = 0; s < deep; s++) {
            if (k_st + s * GEMM_TK >= k_end) break; /* (uniform: the steps of a split's last stage) */
            struct mma_local S = mma_at(L, s, tn, nh);
            __local uint *As = S.As, *Bs = S.Bs, *Bs2 = S.Bs2;
            __local float(*Asc)[MMA_TM] = S.Asc, (*Abi)[MMA_TM] = S.Abi, (*Bd)[MMA_TN] = S.Bd, (*Bsum)[MMA_TN] = S.Bsum;
            uint a[2][2][4], v[2][4][2], v2[2][4][2]; /* [block of 32][fragment] */
#pragma unroll
            for (int b = 0; b < 2; b++) {
                int kw = 8 * b + c;
                for (int i = 0; i < mi; i++) {
                    int r = wr + 16 * i + g;
                    a[b][i][0] = As[r * MMA_KS + kw], a[b][i][1] = As[(r + 8) * MMA_KS + kw];
                    a[b][i][2] = As[r * MMA_KS + kw + 4], a[b][i][3] = As[(r + 8) * MMA_KS + kw + 4];
                }
                for (int j = 0; j < mj; j++) {
                    int t = wt + 8 * j + g;
                    v[b][j][0] = Bs[t * MMA_KS + kw], v[b][j][1] = Bs[t * MMA_KS + kw + 4];
                    v2[b][j][0] = lv == 2 ? Bs2[t * MMA_KS + kw] : 0u, v2[b][j][1] = lv == 2 ? Bs2[t * MMA_KS + kw + 4] : 0u;
                }
            }
            /* both blocks of the step in one weight group (groups of 64 or more): one scale and bias for
             * the two, so the float epilogue runs once a step, not once a block */
            int one_group = gs0 % GEMM_TK == 0;
            for (int i = 0; i < mi; i++) {
                int r = wr + 16 * i + g;
                for (int j = 0; j < mj; j++) {
                    int t = wt + 8 * j + 2 * c;
                    int4 p = mma_u8s8(a[0][i][0], a[0][i][1], a[0][i][2], a[0][i][3], v[0][j][0], v[0][j][1], (int4)(0), emu);
                    int4 q = mma_u8s8(a[1][i][0], a[1][i][1], a[1][i][2], a[1][i][3], v[1][j][0], v[1][j][1], (int4)(0), emu);
                    if (lv == 2) { /* 128 x level one's sums + level two's (not chained: the four in flight at once) */
                        int4 p2 = mma_u8s8(a[0][i][0], a[0][i][1], a[0][i][2], a[0][i][3], v2[0][j][0], v2[0][j][1], (int4)(0), emu);
                        int4 q2 = mma_u8s8(a[1][i][0], a[1][i][1], a[1][i][2], a[1][i][3], v2[1][j][0], v2[1][j][1], (int4)(0), emu);
                        p = p * 128 + p2, q = q * 128 + q2;
                    }
                    float x0 = Bd[0][t], x1 = Bd[0][t + 1], y0 = Bd[1][t], y1 = Bd[1][t + 1];
                    if (nh == 2) { /* groups of 16: a block's first half (its codes' other half zeroed), then the rest */
                        for (int b = 0; b < 2; b++) {
                            int4 d = b ? q : p;
                            int4 lo = mma_u8s8(a[b][i][0], a[b][i][1], 0u, 0u, v[b][j][0], v[b][j][1], (int4)(0), emu);
                            if (lv == 2)
                                lo = lo * 128 + mma_u8s8(a[b][i][0], a[b][i][1], 0u, 0u, v2[b][j][0], v2[b][j][1], (int4)(0), emu);
                            float d0 = b ? y0 : x0, d1 = b ? y1 : x1;
                            for (int hh = 0; hh < 2; hh++) {
                                int4 e = hh ? d - lo : lo;
                                int h = 2 * b + hh;
                                float m0 = Bsum[h][t], m1 = Bsum[h][t + 1];
                                float s0 = Asc[h][r], o0 = Abi[h][r], s1 = Asc[h][r + 8], o1 = Abi[h][r + 8];
                                acc[i][j][0] += gemm_term(s0, o0, d0, e.x, m0);
                                acc[i][j][1] += gemm_term(s0, o0, d1, e.y, m1);
                                acc[i][j][2] += gemm_term(s1, o1, d0, e.z, m0);
                                acc[i][j][3] += gemm_term(s1, o1, d1, e.w, m1);
                            }
                        }
                    } else if (one_group) {
                        float s0 = Asc[0][r], o0 = Abi[0][r], s1 = Asc[0][r + 8], o1 = Abi[0][r + 8];
                        float m0 = Bsum[0][t] + Bsum[1][t], m1 = Bsum[0][t + 1] + Bsum[1][t + 1];
                        acc[i][j][0] += gemm_term2(s0, o0, x0, p.x, y0, q.x, m0);
                        acc[i][j][1] += gemm_term2(s0, o0, x1, p.y, y1, q.y, m1);
                        acc[i][j][2] += gemm_term2(s1, o1, x0, p.z, y0, q.z, m0);
                        acc[i][j][3] += gemm_term2(s1, o1, x1, p.w, y1, q.w, m1);
                    } else {
                        for (int b = 0; b < 2; b++) {
                            int4 d = b ? q : p;
                            float d0 = b ? y0 : x0, d1 = b ? y1 : x1, m0 = Bsum[b][t], m1 = Bsum[b][t + 1];
                            float s0 = Asc[b][r], o0 = Abi[b][r], s1 = Asc[b][r + 8], o1 = Abi[b][r + 8];
                            acc[i][j][0] += gemm_term(s0, o0, d0, d.x, m0);
                            acc[i][j][1] += gemm_term(s0, o0, d1, d.y, m1);
                            acc[i][j][2] += gemm_term(s1, o1, d0, d.z, m0);
                            acc[i][j][3] += gemm_term(s1, o1, d1, d.w, m1);
                        }
                    }
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < mj; j++)
            for (int e = 0; e < 4; e++) {
                int r = r0 + wr + 16 * i + g + 8 * (e / 2), t = t0 + wt + 8 * j + 2 * c + e % 2;
                if (r < rows && t < n_tok) gemm_put(acc[i][j][e], r, t, rows, vecs, bias_off, y, y_off, ldy, add, part, n_tok);
            }
}

/* A kernel's local memory: MMA_DEEP(tn) staging steps of a tile of tn tokens */
#define MMA_LOCALS(tn, lv, nh)                                                                              \
    __local uint As[MMA_DEEP(tn) * MMA_TM * MMA_KS], Bs[MMA_DEEP(tn) * (tn) * MMA_KS] __attribute__((aligned(16))), \
        Bs2[(lv) == 2 ? MMA_DEEP(tn) * (tn) * MMA_KS : 4] __attribute__((aligned(16))), Emu[MMA_EMU_WORDS];   \
    __local float Asc[MMA_DEEP(tn) * 2 * (nh)][MMA_TM], Abi[MMA_DEEP(tn) * 2 * (nh)][MMA_TM],               \
        Bd[MMA_DEEP(tn) * 2][MMA_TN], Bsum[MMA_DEEP(tn) * 2 * (nh)][MMA_TN];                               \
    struct mma_local L = {As, Bs, Bs2, Asc, Abi, Bd, Bsum}
#define MMA_KERNEL(name, lv, nh, tn)                                                                        \
    __kernel __attribute__((reqd_work_group_size(MMA_LWS, 1, 1))) void name(GEMM_Q8_KARGS) {                \
        MMA_LOCALS(tn, lv, nh);                                                                              \
        GEMM_Q8_OPEN;                                                                                        \
        gemm_q8_mma_tiles(GEMM_Q8_PASS, lv, nh, tn, L, Emu);                                                \
    }
MMA_KERNEL(gemm_q8_mma, 1, 1, MMA_TN)
MMA_KERNEL(gemm_q8_mma_2, 2, 1, MMA_TN)
MMA_KERNEL(gemm_q8_mma_g16, 1, 2, MMA_TN)
MMA_KERNEL(gemm_q8_mma_2_g16, 2, 2, MMA_TN)
MMA_KERNEL(gemm_q8_mma_t16, 1, 1, 16) /* steps of at most 16 tokens */
MMA_KERNEL(gemm_q8_mma_t16_2, 2, 1, 16)
MMA_KERNEL(gemm_q8_mma_t16_g16, 1, 2, 16)
MMA_KERNEL(gemm_q8_mma_t16_2_g16, 2, 2, 16)
MMA_KERNEL(gemm_q8_mma_t32, 1, 1, 32) /* of at most 32 */
MMA_KERNEL(gemm_q8_mma_t32_2, 2, 1, 32)
MMA_KERNEL(gemm_q8_mma_t32_g16, 1, 2, 32)
MMA_KERNEL(gemm_q8_mma_t32_2_g16, 2, 2, 32)
#endif
