/* The matvec-like kernels and their bodies (which `token` runs as phases): embed, matvec (the
 * lm_head), attn_out, gate_up (with down_proj fused in: FFN_FUSED), qkv with RoPE and the cache write. */

/* x[j] = element j of embedding row `id` */
inline float embed_one_f(WARGS(0), int cols, int id, int j) {
    Q_FIX(bits0, gs0, dt0);
    if (bits0 == 0) return ld(W0, dt0, (size_t)id * cols + j);
    int per = 32 / bits0, ng = cols / gs0;
    uint word = ((__global const uint *)W0)[(size_t)id * (cols / per) + j / per];
    float q = (float)((word >> ((j % per) * bits0)) & ((1u << bits0) - 1u));
    return ld_s(S0, dt0, (size_t)id * ng + j / gs0) * q + ld_b(S0, B0, dt0, (size_t)id * ng + j / gs0);
}

#if Q_COPIES
#define EMBED_ONE_AT(i) embed_one_f(W0, S0, B0, Q_B##i, Q_G##i, Q_D##i, cols, id, j)
inline float embed_one(WARGS(0), int cols, int id, int j) { Q_PICK(EMBED_ONE_AT, bits0, gs0, dt0); }
#undef EMBED_ONE_AT
#else
#define embed_one embed_one_f
#endif

/* The step's token: id, or with id < 0 the previous step's argmax, still on the device (the host
 * enqueues the next greedy step before it has read it back); clamped, so a bad one reads no wild row
 * (the host reports it when it reads that step's result). */
inline int step_token(int id, __global const int *prev, int vocab) { return clamp(id >= 0 ? id : prev[0], 0, vocab - 1); }

__kernel void embed(WARGS(0), int cols, __global float *x, __global const int *prev, int vocab, int id) {
    id = step_token(id, prev, vocab);
    int j = get_global_id(0);
    if (j < cols) x[j] = embed_one(WPASS(0), cols, id, j);
}

/* -DARGMAX_ROWS=n (the host adds it when the lm_head has padding rows past the tokenizer's ids): the
 * argmax looks only at rows below n; the logits of every row are still computed */
#ifdef ARGMAX_ROWS
#define ARGMAX_ROW_OK(r) ((r) < ARGMAX_ROWS)
#else
#define ARGMAX_ROW_OK(r) 1
#endif

/* The row loop shared by matvec-like kernels: y[r] = W . xs (+ res[r] when add). With best != 0 the
 * group also leaves the largest y[r] and its row (the first on ties) in best[group] for `argmax`. */
inline void rows_times_x(WARGS(0), int rows, int cols, int tpr, __local const float *xs, __local const float *xsum,
                         __global float *y, __global const float *res, int add, struct qrow first, __local float2 *red,
                         __global float2 *best) {
    int lid = get_local_id(0), lane = lid % tpr, rpg = MV_LWS / tpr;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int r0 = get_group_id(0) * rpg; r0 < rows; r0 += rpg * get_num_groups(0)) {
        int r = r0 + lid / tpr;
        float part = 0.0f, rv = add && lane == 0 && r < rows ? res[r] : 0.0f; /* read before the dot products */
#if MV_PIPE
        /* the next sweep's reads are in flight while this one's arithmetic runs */
        struct qrow next = load_row(WPASS(0), r + rpg * get_num_groups(0), rows, cols, lane, tpr);
#endif
        if (r < rows) part = row_dot(WPASS(0), r, cols, lane, tpr, first, xs, xsum);
#if MV_PIPE
        first = next;
#else
        first = load_row(WPASS(0), r + rpg * get_num_groups(0), rows, cols, lane, tpr); /* next sweep */
#endif
        float s = row_reduce2((float2)(part, 0.0f), red, tpr).x;
        if (lane == 0 && r < rows) {
            y[r] = add ? rv + s : s;
            if (s > bv && ARGMAX_ROW_OK(r)) bv = s, bi = r;
        }
    }
    if (!best) return;
    float2 b = wg_best((float2)(bv, as_float(bi)), red);
    if (lid == 0) best[get_group_id(0)] = b;
}

/* The chunks of an input too long to stage whole: MV_LOCAL_X rounded down to whole groups (of up to 128) */
#define CHUNK_X (MV_LOCAL_X / 128 * 128)

/* y[r] = W . x (+ res[r] when add) for an input longer than MV_LOCAL_X (down_proj of 7B-class models,
 * whose 18944 inputs do not fit local memory beside the rest): x is staged a chunk at a time (as int8
 * blocks where the kernels take them), and each chunk's share of a row is added to y[r] by the thread that
 * owns the row in every chunk (the groups take the same rows each time), so no other group reads it. */
inline void chunked_times_x(WARGS(0), int rows, int cols, int tpr, __global const float *x, __local float *xs,
                            __local float *xsum, __global float *y, __global const float *res, int add,
                            __local float *red, __local float2 *red2) {
    int lid = get_local_id(0), lane = lid % tpr, rpg = MV_LWS / tpr;
    for (int c0 = 0; c0 < cols; c0 += CHUNK_X) {
        int n = cols - c0 < CHUNK_X ? cols - c0 : CHUNK_X;
        stage(x + c0, n, 0, 0.0f, xs, xsum, red);
        for (int r0 = get_group_id(0) * rpg; r0 < rows; r0 += rpg * get_num_groups(0)) {
            int r = r0 + lid / tpr;
            struct qrow q = load_row_at(WPASS(0), r, rows, cols, c0, n, lane, tpr);
            float part = r < rows ? row_dot_at(WPASS(0), r, cols, c0, n, lane, tpr, q, xs, xsum) : 0.0f;
            float s = row_reduce2((float2)(part, 0.0f), red2, tpr).x;
            if (lane == 0 && r < rows) y[r] = (c0 ? y[r] : add ? res[r] : 0.0f) + s;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* every read of this chunk's xs before the next is staged */
    }
}

/* This thread's share of its row in sweep k of a matvec-like phase (nothing past `rows`) */
inline struct qrow sweep_row(WARGS(0), int rows, int cols, int tpr, int k) {
    int lid = get_local_id(0);
    return load_row(WPASS(0), (get_group_id(0) + k * get_num_groups(0)) * (MV_LWS / tpr) + lid / tpr, rows, cols,
                    lid % tpr, tpr);
}

/* The first reads of a matvec-like phase: sweep 0 */
inline struct qrow first_row(WARGS(0), int rows, int cols, int tpr) { return sweep_row(WPASS(0), rows, cols, tpr, 0); }

#if MV_DEEP
/* rows_times_x for the lm_head (staged input, no residual, the best row tracked) with the reads of
 * the next two sweeps in flight instead of one: its 151936 rows take tens of sweeps, and it reads at
 * about 1.6 TB/s of the H200's 4.8. Measured there: tg128 +1.2%, yet the lm_head's own phase time
 * did not visibly change, so what limits it is still open (docs/performance.md, session 9). */
inline void rows_best(WARGS(0), int rows, int cols, int tpr, __local const float *xs, __local const float *xsum,
                      __global float *y, struct qrow first, struct qrow second, __local float2 *red,
                      __global float2 *best) {
    int lid = get_local_id(0), lane = lid % tpr, rpg = MV_LWS / tpr, stride = rpg * get_num_groups(0);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int r = get_group_id(0) * rpg + lid / tpr; r - lid / tpr < rows; r += stride) {
        struct qrow third = load_row(WPASS(0), r + 2 * stride, rows, cols, lane, tpr);
        float part = r < rows ? row_dot(WPASS(0), r, cols, lane, tpr, first, xs, xsum) : 0.0f;
        first = second, second = third;
        float s = row_reduce2((float2)(part, 0.0f), red, tpr).x;
        if (lane == 0 && r < rows) {
            y[r] = s;
            if (s > bv && ARGMAX_ROW_OK(r)) bv = s, bi = r;
        }
    }
    float2 b = wg_best((float2)(bv, as_float(bi)), red);
    if (lid == 0) best[get_group_id(0)] = b;
}
#endif

/* y = W . norm(x) (norm_off >= 0) or W . x, plus res when add (the residual); track: leave each
 * group's largest y in best[] (the lm_head, for argmax). first: first_row's reads (of nothing when
 * cols > MV_LOCAL_X). */
inline void matvec_body(WARGS(0), int rows, int cols, int tpr, __global const float *x, __global const float *vecs,
                        int norm_off, float eps, __global float *y, __global const float *res, int add,
                        __global float2 *best, int track, struct qrow first, __local float *xs, __local float *xsum,
                        __local float *red, __local float2 *red2) {
    int staged = cols <= MV_LOCAL_X;
#if MV_DEEP
    if (track && staged && !add) {
        struct qrow second = sweep_row(WPASS(0), rows, cols, tpr, 1); /* before the staging */
        stage(x, cols, norm_off >= 0 ? vecs + norm_off : 0, eps, xs, xsum, red);
        rows_best(WPASS(0), rows, cols, tpr, xs, xsum, y, first, second, red2, best);
        return;
    }
#endif
    if (!staged) { /* (never normalized: only down_proj's input is this long) */
        chunked_times_x(WPASS(0), rows, cols, tpr, x, xs, xsum, y, res, add, red, red2);
        return;
    }
    stage(x, cols, norm_off >= 0 ? vecs + norm_off : 0, eps, xs, xsum, red);
    rows_times_x(WPASS(0), rows, cols, tpr, xs, xsum, y, res, add, first, red2, track ? best : 0);
}

__kernel void matvec(WARGS(0), int rows, int cols, int tpr, __global const float *x, __global const float *vecs,
                     int norm_off, float eps, __global float *y, __global const float *res, int add,
                     __global float2 *best, int track) {
    STAGE_LOCALS, red[MV_LWS];
    __local float2 red2[MV_LWS];
    struct qrow first = first_row(WPASS(0), cols <= MV_LOCAL_X ? rows : 0, cols, tpr);
    matvec_body(WPASS(0), rows, cols, tpr, x, vecs, norm_off, eps, y, res, add, best, track, first, xs, xsum, red, red2);
}

/* Element j of the attention output, combined from the split-K partials that `attention` left: per
 * head, ATT_MAX_SPLIT slots of (max, sum, acc[head_dim]). Read past L1 (volatile): att_fold reads the
 * partials of other groups within the same phase. */
inline float attn_combine(volatile __global const float *part, int hd, int n_split, int j) {
    volatile __global const float *p = part + (size_t)(j / hd) * ATT_MAX_SPLIT * (hd + 2);
    float m = p[0], den = p[1], num = p[2 + j % hd]; /* one pass: the three loads of a span together */
    for (int s = 1; s < n_split; s++) {
        float ms = p[s * (hd + 2)], ls = p[s * (hd + 2) + 1], as = p[s * (hd + 2) + 2 + j % hd];
        float m2 = fmax(m, ms), a = exp(m - m2), b = exp(ms - m2);
        den = den * a + ls * b, num = num * a + as * b, m = m2;
    }
    return num / den;
}

/* x_out = x + Wo . attention output (first: first_row's reads) */
inline void attn_out_body(WARGS(0), int rows, int cols, int tpr, __global const float *part, int hd,
                          __global const float *x, __global float *x_out, int n_split, struct qrow first,
                          __local float *xs, __local float *xsum, __local float *red, __local float2 *red2) {
    int lid = get_local_id(0);
#if XQ_FUSED
    int nw = cols / 8;
#pragma unroll
    for (int i = 0; i < SQ_IT; i++) {
        int c = lid + i * MV_LWS;
        if (i * MV_LWS >= nw) break; /* the same for the whole group */
        float y[8] = {0.0f};
        if (c < nw) {
#pragma unroll
            for (int e = 0; e < 8; e++) y[e] = attn_combine(part, hd, n_split, 8 * c + e);
        }
        quant_word(vload8(0, y), c, c < nw, xs, xsum, red);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#else
    (void)red;
#pragma unroll 4
    for (int j = lid; j < cols; j += MV_LWS) xs[XP(j)] = attn_combine(part, hd, n_split, j);
    barrier(CLK_LOCAL_MEM_FENCE);
    stage_done(xs, cols, xsum);
#endif
    rows_times_x(WPASS(0), rows, cols, tpr, xs, xsum, x_out, x, 1, first, red2, 0);
}

__kernel void attn_out(WARGS(0), int rows, int cols, int tpr, __global const float *part, int hd,
                       __global const float *x, __global float *x_out, int n_split) {
    STAGE_LOCALS, red[MV_LWS];
    __local float2 red2[MV_LWS];
    attn_out_body(WPASS(0), rows, cols, tpr, part, hd, x, x_out, n_split, first_row(WPASS(0), rows, cols, tpr), xs,
                  xsum, red, red2);
}

#if ANY_FUSED
/* Bytes of a [rows x cols] matrix in the layout blocks_times reads (the host writes it, cl.c): for each
 * block of 32 inputs, every row's uint4 of codes ([cols / 32][rows]), then the scales ([cols / Q_GS][rows])
 * and the biases, so a block's column of the matrix is contiguous; rounded up to whole lines. Per
 * layer: o_proj, then down_proj. */
#define BT_ES (Q_DT ? 2 : 4)                                           /* bytes of a scale or bias */
#define BT_CODES(rows, cols) ((size_t)(rows) * (cols) / 2)             /* where the scales start */
#define BT_GROUPS(rows, cols) ((size_t)(rows) * ((cols) / Q_GS) * BT_ES) /* bytes of the scales (and of the biases) */
#define BT_BYTES(rows, cols) ((BT_CODES(rows, cols) + 2 * BT_GROUPS(rows, cols) + 127) & ~(size_t)127)

inline void red_add(__global float *p, float v) { asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory"); }

/* Bytes [lo, hi) of p into L2 (PTX prefetch: no register waits for it), spread over the group */
inline void l2_range(__global const uchar *p, size_t lo, size_t hi) {
    for (size_t o = (lo & ~(size_t)127) + get_local_id(0) * 128; o < hi; o += MV_LWS * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}

/* Blocks b0 .. b0 + nbk - 1 of a matrix in the BT_BYTES layout into L2: what blocks_times will read */
inline void blocks_l2(__global const uchar *bt, int b0, int nbk, int rows, int cols) {
    size_t cb = BT_CODES(rows, cols), gb = BT_GROUPS(rows, cols);
    size_t g0 = (size_t)(b0 * 32 / Q_GS) * rows * BT_ES, g1 = (size_t)((b0 + nbk - 1) * 32 / Q_GS + 1) * rows * BT_ES;
    l2_range(bt, (size_t)b0 * rows * 16, (size_t)(b0 + nbk) * rows * 16);
    l2_range(bt + cb, g0, g1);
    l2_range(bt + cb + gb, g0, g1);
}

/* x_out[r] += the sum over k < nbk of block b0 + k bs of row r of W (inputs 32 b .. 32 b + 31) . block
 * s0 + k of xs (inputs staged and quantized), for every row r, by atomic adds, plus res[r] when res.
 * With it, a phase that produces some blocks of a matrix's inputs also does their share of the
 * product, and the grid barrier before the matrix is gone: no group needs all the inputs. The sums land in an order that varies from run to
 * run, so float rounding may differ in the last bits between runs. */
inline void blocks_times(__global const uchar *bt, int b0, int nbk, int bs, int s0, int rows, int cols,
                         __local float *xs, __local float *xsum, __global float *x_out, __global const float *res) {
    size_t cb = BT_CODES(rows, cols), gb = BT_GROUPS(rows, cols);
    for (int r = get_local_id(0); r < rows; r += MV_LWS) {
        float p = res ? res[r] : 0.0f;
#pragma unroll 8
        for (int k = 0; k < nbk; k++) {
            int b = b0 + k * bs;
            size_t g = (size_t)(b * 32 / Q_GS) * rows + r;
            struct qvec q;
            q.w = ((__global const uint4 *)bt)[(size_t)b * rows + r];
            q.s = ld(bt + cb, Q_DT, g), q.b = ld(bt + cb + gb, Q_DT, g);
            p += vec_dot(q, s0 + k, bt, bt, Q_BITS, Q_GS, Q_DT, 0, xs, xsum);
        }
        red_add(x_out + r, p);
    }
}
#endif

#if FFN_FUSED
/* FFN_FUSED: blocks b0, b0 + bs, ... (nbk <= 8 of them) of h, the inputs of down_proj, computed by
 * this group and left in hl[32 k ..], times their columns of down_proj into x_out (blocks_times). They
 * are quantized as staged inputs are (two int8 levels, quant_word), into the last 8 blocks of xs, which
 * the gate_up input (dim <= MV_LOCAL_X - 256, the host checks) never reaches. */
inline void down_blocks(__global const uchar *dt, int b0, int nbk, int bs, int dim, int ffn, __local float *hl,
                        __local float *xs, __local float *xsum, __local float *red, __global float *x_out,
                        __global const float *res) {
    int lid = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < 32) /* one warp: 4 lanes a block (their shuffles need the whole warp) */
        quant_word(lid < 4 * nbk ? vload8(lid, hl) : (float8)(0.0f), 4 * (XQ_NB - 8) + lid, lid < 4 * nbk, xs,
                   xsum, red);
    barrier(CLK_LOCAL_MEM_FENCE);
    blocks_times(dt, b0, nbk, bs, XQ_NB - 8, dim, ffn, xs, xsum, x_out, res);
}
#endif

/* h = silu(Wg . norm(x)) * (Wu . norm(x)); fg, fu: first_row's reads of both (with the same tpr).
 * With dt (FFN_FUSED, tpr = MV_LWS / 32: a sweep's rows are one block of h), h is not stored: the
 * group's blocks go through down_blocks, adding x + down_proj(h) into x_out. */
inline void gate_up_body(WARGS(0), WARGS(1), int rows, int cols, int tpr, __global const float *x,
                         __global const float *vecs, int norm_off, float eps, __global float *h, struct qrow fg,
                         struct qrow fu, __local float *xs, __local float *xsum, __local float *red,
                         __local float2 *red2, __global const uchar *dt, __global float *x_out) {
    int lid = get_local_id(0), lane = lid % tpr, rpg = MV_LWS / tpr, stride = rpg * get_num_groups(0);
    int r = get_group_id(0) * rpg + lid / tpr;
#if FFN_FUSED
    int nk = 0; /* blocks of h waiting for down_blocks */
    if (dt)
        for (int b = get_group_id(0); b < rows / 32; b += get_num_groups(0)) blocks_l2(dt, b, 1, cols, rows);
#endif
    stage(x, cols, vecs + norm_off, eps, xs, xsum, red);
    for (; r - lid / tpr < rows; r += stride) {
        float2 gu = (float2)(0.0f);
#if MV_PIPE
        struct qrow ng = load_row(WPASS(0), r + stride, rows, cols, lane, tpr),
                    nu = load_row(WPASS(1), r + stride, rows, cols, lane, tpr);
#endif
        if (r < rows) {
            gu.x = row_dot(WPASS(0), r, cols, lane, tpr, fg, xs, xsum);
            gu.y = row_dot(WPASS(1), r, cols, lane, tpr, fu, xs, xsum);
        }
#if MV_PIPE
        fg = ng, fu = nu;
#else
        fg = load_row(WPASS(0), r + stride, rows, cols, lane, tpr);
        fu = load_row(WPASS(1), r + stride, rows, cols, lane, tpr);
#endif
        gu = row_reduce2(gu, red2, tpr);
        float hv = gu.x / (1.0f + exp(-gu.x)) * gu.y;
#if FFN_FUSED
        if (dt) { /* this sweep's rows are block r0 / 32 of h; down_proj's share once all are done (or 8) */
            int r0 = r - lid / tpr, b0 = r0 / 32 - nk * get_num_groups(0);
            __local float *hl = (__local float *)red2;
            if (lane == 0) hl[32 * nk + lid / tpr] = hv;
            if (++nk == 8 || r0 + stride >= rows) { /* x, the residual, is added with block 0 */
                down_blocks(dt, b0, nk, get_num_groups(0), cols, rows, hl, xs, xsum, red, x_out, b0 == 0 ? x : 0);
                nk = 0;
            }
            continue;
        }
#endif
        if (lane == 0 && r < rows) h[r] = hv;
    }
}

__kernel void gate_up(WARGS(0), WARGS(1), int rows, int cols, int tpr, __global const float *x,
                      __global const float *vecs, int norm_off, float eps, __global float *h) {
    STAGE_LOCALS, red[MV_LWS];
    __local float2 red2[MV_LWS];
    gate_up_body(WPASS(0), WPASS(1), rows, cols, tpr, x, vecs, norm_off, eps, h, first_row(WPASS(0), rows, cols, tpr),
                 first_row(WPASS(1), rows, cols, tpr), xs, xsum, red, red2, 0, 0);
}

/* What rope_store needs besides the dot products of the pair (rows r, r + head_dim/2 of matrix
 * `which` of [q | k | v], i = r % (head_dim/2)): its two biases, cos and sin of its RoPE angle (read
 * and computed before the dot products, so none of it waits at the end of the phase) */
inline float4 rope_consts(int which, int r, int i, int pos, int hd, __global const float *vecs, int bq_off, int bk_off,
                          int bv_off, __global const float *inv_freq) {
    int off = which == 0 ? bq_off : which == 1 ? bk_off : bv_off;
    float angle = (float)pos * inv_freq[i];
    return (float4)(vecs[off + r], vecs[off + r + hd / 2], cos(angle), sin(angle));
}

/* Adds the biases to the pair's dot products ab, rotates q and k by RoPE, and stores q, or k and v
 * into the layer's cache; k4 = rope_consts. */
inline void rope_store(float2 ab, float4 k4, int which, int r, int pos, int n_kv, int hd, int n_ctx, __global float *q,
                       __global float *kt, __global float *vc) {
    int half_d = hd / 2;
    float a = ab.x + k4.x, b = ab.y + k4.y, c = k4.z, s = k4.w;
    if (which == 0) {
        q[r] = a * c - b * s;
        q[r + half_d] = b * c + a * s;
    } else if (which == 1) {
        kt[(size_t)r * n_ctx + pos] = a * c - b * s;
        kt[(size_t)(r + half_d) * n_ctx + pos] = b * c + a * s;
    } else {
        int kv_dim = n_kv * hd;
        vc[(size_t)pos * kv_dim + r] = a;
        vc[(size_t)pos * kv_dim + r + half_d] = b;
    }
}

/* The matrix of [q | k | v] that head (counted over the concatenation) belongs to, and its row i. */
#define QKV_PICK(which, r, head, i)                                                                     \
    int which = head < n_heads ? 0 : head < n_heads + n_kv ? 1 : 2;                                    \
    int r = (head - (which == 0 ? 0 : which == 1 ? n_heads : n_heads + n_kv)) * hd + i
/* The arguments (WPASS) of matrix `which` of q, k, v (0, 1, 2) */
#define QKV_W(which)                                                                                     \
    (which == 0 ? W0 : which == 1 ? W1 : W2), (which == 0 ? S0 : which == 1 ? S1 : S2),                   \
        (which == 0 ? B0 : which == 1 ? B1 : B2), (which == 0 ? bits0 : which == 1 ? bits1 : bits2),      \
        (which == 0 ? gs0 : which == 1 ? gs1 : gs2), (which == 0 ? dt0 : which == 1 ? dt1 : dt2)
/* rope_consts of unit u (zeros past the last unit) */
inline float4 qkv_consts(int u, int n_heads, int n_kv, int hd, int pos, __global const float *vecs, int bq_off,
                         int bk_off, int bv_off, __global const float *inv_freq) {
    int half_d = hd / 2;
    if (u >= (n_heads + 2 * n_kv) * half_d) return (float4)(0.0f);
    QKV_PICK(which, r, u / half_d, u % half_d);
    return rope_consts(which, r, u % half_d, pos, hd, vecs, bq_off, bk_off, bv_off, inv_freq);
}

/* The reads of a qkv unit's two rows (a RoPE pair) */
struct qrow2 {
    struct qrow a, b;
};

/* This thread's first reads of unit u's two rows, or `none` past the last unit */
inline struct qrow2 qkv_prefetch(WARGS(0), WARGS(1), WARGS(2), int n_heads, int n_kv, int hd, int cols, int tpr, int u,
                                 struct qrow2 none) {
    int half_d = hd / 2, lane = get_local_id(0) % tpr;
    if (u >= (n_heads + 2 * n_kv) * half_d) return none;
    QKV_PICK(which, r, u / half_d, u % half_d);
    struct qrow2 f;
    f.a = load_row(QKV_W(which), r, 1 << 30, cols, lane, tpr), f.b = load_row(QKV_W(which), r + half_d, 1 << 30, cols, lane, tpr);
    return f;
}

/* The first reads of the qkv phase (its first unit's two rows) */
inline struct qrow2 qkv_first(WARGS(0), WARGS(1), WARGS(2), int n_heads, int n_kv, int hd, int cols, int tpr) {
    struct qrow2 none;
    none.a = none.b = load_row(WPASS(0), 0, 0, cols, 0, tpr); /* zeros */
    return qkv_prefetch(WPASS(0), WPASS(1), WPASS(2), n_heads, n_kv, hd, cols, tpr,
                        get_group_id(0) * (MV_LWS / tpr) + get_local_id(0) / tpr, none);
}

#define QKV_ARGS                                                                                            \
    WARGS(0), WARGS(1), WARGS(2), int n_heads, int n_kv, int hd, int cols, int tpr, __global const float *x,   \
        __global const float *vecs, int norm_off, int bq_off, int bk_off, int bv_off, float eps,               \
        __global const float *inv_freq, int n_ctx, __global float *q, __global float *kt, __global float *vc, int layer
#define QKV_PASS                                                                                            \
    WPASS(0), WPASS(1), WPASS(2), n_heads, n_kv, hd, cols, tpr, x, vecs, norm_off, bq_off, bk_off, bv_off, eps, \
        inv_freq, n_ctx, q, kt, vc, layer

/* q, k, v for one token at position pos: each row slot computes rows i and i + head_dim/2 of one head
 * of the concatenated [q | k | v] outputs, so RoPE's pairs stay in one slot. Adds the biases, rotates
 * q and k, writes q to `q` and k, v into the layer's cache (k transposed: [kv_head][dim][position]). */
inline void qkv_body(QKV_ARGS, int pos, struct qrow2 f, __local float *xs, __local float *xsum, __local float *red,
                     __local float2 *red2) {
    int lid = get_local_id(0), lane = lid % tpr, rpg = MV_LWS / tpr, stride = rpg * get_num_groups(0);
    int half_d = hd / 2, n_units = (n_heads + 2 * n_kv) * half_d;
    kt += (size_t)layer * n_kv * hd * n_ctx; /* this layer's cache */
    vc += (size_t)layer * n_kv * hd * n_ctx;
    int unit = get_group_id(0) * rpg + lid / tpr;
/* qkv_consts of unit u for lane 0 of its slot (which stores it) */
#define QKV_CONSTS(u) \
    (lane == 0 ? qkv_consts(u, n_heads, n_kv, hd, pos, vecs, bq_off, bk_off, bv_off, inv_freq) : (float4)(0.0f))
    float4 k4 = QKV_CONSTS(unit);
    stage(x, cols, vecs + norm_off, eps, xs, xsum, red);
    for (; unit - lid / tpr < n_units; unit += stride) {
        int i = unit % half_d;
        QKV_PICK(which, r, unit / half_d, i);
        float2 ab = (float2)(0.0f);
        if (unit < n_units) {
            ab.x = row_dot(QKV_W(which), r, cols, lane, tpr, f.a, xs, xsum);
            ab.y = row_dot(QKV_W(which), r + half_d, cols, lane, tpr, f.b, xs, xsum);
        }
        f = qkv_prefetch(WPASS(0), WPASS(1), WPASS(2), n_heads, n_kv, hd, cols, tpr, unit + stride, f);
        float4 k4_next = QKV_CONSTS(unit + stride);
        ab = row_reduce2(ab, red2, tpr);
        if (lane == 0 && unit < n_units) rope_store(ab, k4, which, r, pos, n_kv, hd, n_ctx, q, kt, vc);
        k4 = k4_next;
    }
#undef QKV_CONSTS
}

__kernel void qkv(QKV_ARGS, int pos) {
    STAGE_LOCALS, red[MV_LWS];
    __local float2 red2[MV_LWS];
    qkv_body(QKV_PASS, pos, qkv_first(WPASS(0), WPASS(1), WPASS(2), n_heads, n_kv, hd, cols, tpr), xs, xsum, red, red2);
}

