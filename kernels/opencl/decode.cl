/* OpenCL C 1.2 kernels for one decode step (engine/cl.c drives them). No extension is needed: f16
 * scales are read with vload_half, bf16 as the top half of a float, and reductions go through local
 * memory (NVIDIA's OpenCL has neither cl_khr_fp16 nor subgroups); on NVIDIA the host also enables
 * inline PTX for dp4a and warp shuffles (DP4A_PTX, SHFL_PTX), each with a portable fallback here.
 * Five launches per layer:
 *   qkv        RMSNorm + q/k/v + bias + RoPE + cache write
 *   attention  one work-group per (query head, span of positions): partial softmax . V (split-K)
 *   attn_out   the spans combined, o_proj, residual add
 *   gate_up    RMSNorm + gate/up + SwiGLU
 *   down       down_proj + residual add
 * then RMSNorm + lm_head (a `matvec`) and argmax: 5 x layers + 3 launches a token. On GPUs `token`
 * runs all of them as phases of one launch separated by grid barriers (the default there: NVIDIA's
 * OpenCL spends 5-11 us of host time per launch, more than most of these kernels take to run).
 *
 * Matvecs: `tpr` threads share a row (the host picks it from the row length and the grid), each
 * reading the row's codes 16 bytes (one uint4) at a time so a row's reads are coalesced; the input
 * vector is staged (normalized) in local memory with its sums over blocks of 16, so an affine group
 * costs s * sum(q x) + b * sum(x) with sum(x) looked up (or, for 4-bit models, as int8 blocks: XQ).
 * Work-groups loop over rows (grid stride) so the host can cap their number and the staging is
 * amortized on the 151936-row lm_head. A phase's first weight reads are issued before its input is
 * staged (in `token`, while the group waits at the grid barrier before it).
 * Tunables are defaults here and can be overridden with -D (TLLM_CL_OPTS); the host reads them back
 * with the `tunables` kernel. */

#ifndef MV_LWS
#define MV_LWS 256 /* work-group size of the matvec kernels (a power of two) */
#endif
#ifndef MV_ITERS
#define MV_ITERS 2 /* the host picks threads per row so each thread reads about this many uint4 of a row */
#endif
#ifndef MV_MAX_ITERS
#define MV_MAX_ITERS 4 /* uint4s of a row one thread can have in flight; the host lowers threads per row (down to
                        * this many uint4 each) where that saves a sweep of the rows (H200: 4 1240 tok/s, 2
                        * 1206; 5 1179 and 8 1000: more registers, then spills) */
#endif
#ifndef MV_TAIL
#define MV_TAIL 1 /* ... and up to this many more, read one after another (H200: down_proj in one sweep, +1.6%) */
#endif
#ifndef MV_PIPE
#define MV_PIPE 1 /* 1: a row loop issues the next sweep's weight reads before this sweep's arithmetic */
#endif
#ifndef MV_DEEP
#define MV_DEEP 1 /* the lm_head keeps the reads of its next two sweeps in flight, not one (rows_best) */
#endif
#ifndef MV_GROUPS_PER_CU
#define MV_GROUPS_PER_CU 16 /* cap on matvec work-groups per compute unit (the rest loop) */
#endif
#ifndef MV_LOCAL_X
#define MV_LOCAL_X 8192 /* inputs up to this many floats are staged in local memory */
#endif
#ifndef ATT_LWS
#define ATT_LWS 256 /* work-group size of attention = positions scored at once (a power of two) */
#endif
#ifndef ATT_MAX_SPLIT
#define ATT_MAX_SPLIT 32 /* work-groups per head at most (longer spans loop with an online softmax) */
#endif
#ifndef MAX_HEAD_DIM
#define MAX_HEAD_DIM 256 /* the largest head the host accepts (the kernels need hd % 4 == 0, ATT_LWS >= hd / 4) */
#endif

#ifndef PERSIST_GROUPS_PER_CU
#define PERSIST_GROUPS_PER_CU 2 /* work-groups per compute unit of the persistent `token` kernel */
#endif

/* the uint4 reads of a row a thread keeps (struct qrow) */
#define QROW_N (MV_MAX_ITERS > MV_ITERS ? MV_MAX_ITERS : MV_ITERS)

/* -DQ_BITS -DQ_GS -DQ_DT (the host adds them when every matrix of the model has one format): the
 * format is then a constant in every read, which removes the runtime divisions and the branches for
 * the other formats (and most of the code). */
#ifdef Q_BITS
#define Q_FIX(bits, gs, dt) (bits = Q_BITS, gs = Q_GS, dt = Q_DT)
#else
#define Q_FIX(bits, gs, dt) ((void)0)
#endif

/* dt: 0 = f32, 1 = f16, 2 = bf16 */
inline float ld(__global const uchar *p, int dt, size_t i) {
#ifdef Q_DT
    dt = Q_DT;
#endif
    if (dt == 2) return as_float((uint)((__global const ushort *)p)[i] << 16);
    if (dt == 1) return vload_half(i, (__global const half *)p);
    return ((__global const float *)p)[i];
}

/* SHFL_PTX (the host adds it on NVIDIA, whose warps are 32 threads): sums go through warp shuffles
 * (inline PTX) instead of local memory: a row of at most 32 lanes needs no work-group barrier, so the
 * next sweep's weight reads (MV_PIPE) stay in flight across it, and a work-group sum needs one
 * barrier instead of one per halving. */
#if defined(SHFL_PTX)
inline float shfl_xor(float v, int m) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(m));
    return r;
}

/* lane src's v, to every lane of the warp */
inline float shfl_idx(float v, int src) {
    float r;
    asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(src));
    return r;
}

/* wg_reduce of n >= 32 threads: within each warp, then across the n / 32 warps */
inline float wg_reduce_shfl(float v, __local float *red, int n, int is_max) {
    int lid = get_local_id(0);
    for (int m = 16; m > 0; m >>= 1) v = is_max ? fmax(v, shfl_xor(v, m)) : v + shfl_xor(v, m);
    if (lid % 32 == 0) red[lid / 32] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = red[0];
    for (int i = 1; i < n / 32; i++) r = is_max ? fmax(r, red[i]) : r + red[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#endif

/* Sum (is_max 0) or max (1) of one value per thread over a work-group of n threads (a power of two
 * >= 16); every thread gets the result. */
inline float wg_reduce(float v, __local float *red, int n, int is_max) {
#if defined(SHFL_PTX)
    if (n >= 32) return wg_reduce_shfl(v, red, n, is_max);
#endif
    int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s >= 16; s >>= 1) {
        if (lid < s) red[lid] = is_max ? fmax(red[lid], red[lid + s]) : red[lid] + red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = is_max ? -INFINITY : 0.0f;
    for (int i = 0; i < 16; i++) r = is_max ? fmax(r, red[i]) : r + red[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
inline float wg_sum(float v, __local float *red, int n) { return wg_reduce(v, red, n, 0); }
inline float wg_max(float v, __local float *red, int n) { return wg_reduce(v, red, n, 1); }

/* Staged inputs are padded by one float every 32 (element k at XP(k)): a thread reads the 32 inputs
 * of its uint4 of 4-bit codes, neighbours' inputs start 33 floats apart, and so fall in different
 * local-memory banks (unpadded, 32 floats apart, every lane of a row hit the same bank). */
#define XP(k) ((k) + ((k) >> 5))
#define XS_LEN (MV_LOCAL_X + MV_LOCAL_X / 32)

/* -DQ_INT8=1 (the host adds it for a 4-bit model whose CPU path also takes int8 activations, i.e.
 * not --exact): the staged input is also quantized per block of 32 to two int8 levels, x ~ d (q1 +
 * q2 / 128) (as accurate as float32 for practical purposes: the CPU decode path's scheme), and a
 * uint4 of 32 codes meets its block in 16 integer dot products of 4 bytes (dp4a) instead of 32
 * int-to-float conversions, 32 local reads and 32 multiply-adds (H200: +6%; what is left of a phase
 * is mostly latency, not arithmetic). */
#if defined(Q_INT8) && defined(Q_BITS)
#if Q_INT8 && Q_BITS == 4
#define XQ 1
#endif
#endif
#ifndef XQ
#define XQ 0
#endif
#define XQ_NB (MV_LOCAL_X / 32) /* blocks of 32 */
#ifndef STAGE_FUSED
#define STAGE_FUSED 1 /* XQ: a thread loads 8 inputs, normalizes and quantizes them (4 threads a block; without
                       * shuffles that takes two work-group barriers a word: 0 may suit such devices) */
#endif
#define XQ_FUSED (XQ && STAGE_FUSED)

#ifndef FUSE_FFN
#define FUSE_FFN 0 /* 1 (the host sets it on NVIDIA): `token` runs gate_up and down_proj as one phase (down_blocks) */
#endif
#ifndef FUSE_ATT
#define FUSE_ATT 0 /* 1 (the host sets it on NVIDIA): `token` runs attention and o_proj as one phase (att_fold) */
#endif
#if FUSE_FFN && XQ_FUSED && defined(SHFL_PTX) && MV_LWS % 32 == 0
#define FFN_FUSED 1
#else
#define FFN_FUSED 0
#endif
#if FUSE_ATT && XQ_FUSED && defined(SHFL_PTX) && MV_LWS % 32 == 0 && ATT_LWS % 32 == 0 && defined(HEAD_DIM)
#if HEAD_DIM % 32 == 0 && HEAD_DIM <= 128 && HEAD_DIM <= ATT_LWS /* attention_warps runs (its output in local memory) */
#define ATT_FUSED 1
#endif
#endif
#ifndef ATT_FUSED
#define ATT_FUSED 0
#endif
#define ANY_FUSED (FFN_FUSED || ATT_FUSED)

__kernel void tunables(__global int *out) {
    out[0] = MV_LWS, out[1] = MV_ITERS, out[2] = MV_GROUPS_PER_CU, out[3] = MV_LOCAL_X;
    out[4] = ATT_LWS, out[5] = ATT_MAX_SPLIT, out[6] = MAX_HEAD_DIM, out[7] = PERSIST_GROUPS_PER_CU;
    out[8] = QROW_N, out[9] = MV_TAIL, out[10] = FFN_FUSED, out[11] = ATT_FUSED;
}

/* Floats of the staged input: none when the int8 form is all the dot products read (XQ_FUSED) */
#define XS_FLOATS (XQ_FUSED ? 0 : XS_LEN)
/* xs's floats are followed by the quantized input (XQ): 4 x XQ_NB uint4, see quant_word (read as
 * uint4: every xs is declared 16-byte aligned, and XS_LEN floats are a multiple of 16 bytes) */
#define XS_ALLOC (XS_FLOATS + (XQ ? MV_LOCAL_X / 2 : 0))
/* A kernel's staging arrays (the start of a __local declaration list) */
#define STAGE_LOCALS __local float xs[XS_ALLOC] __attribute__((aligned(16))), xsum[MV_LOCAL_X / 16]

/* c + the dot product of 4 unsigned bytes of a and 4 signed bytes of b */
#if defined(DP4A_PTX)
inline int dp4a(uint a, uint b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#else
inline int dp4a(uint a, uint b, int c) {
    int4 x = convert_int4(as_uchar4(a)), y = convert_int4(as_char4(b));
    return c + x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
}
#endif

/* xsum[k] = sum of the staged inputs 16k .. 16k + 15 (never across a pad: 16k % 32 is 0 or 16) */
inline void block_sums(__local const float *xs, int n, __local float *xsum) {
    for (int k = get_local_id(0); k < n / 16; k += MV_LWS) {
        __local const float *p = xs + XP(16 * k);
        float a = 0.0f;
        for (int i = 0; i < 16; i++) a += p[i];
        xsum[k] = a;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* XQ: the staged input in blocks of 32 as two int8 levels, laid out for vec_dot: a word of 8 codes
 * splits into its even and odd nibbles (w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F), so each 8 inputs
 * are stored as their even 4 then their odd 4 bytes. For block k, xq[p * XQ_NB + k] holds words 2p,
 * 2p + 1 (p = 0, 1) of level one and (p = 2, 3) of level two; xsum[k] = d and xsum[XQ_NB + k] = the
 * sum of the block's quantized inputs (the bias term). */

/* Inputs 8c .. 8c + 7 (word c % 4 of block c / 4), scaled by 1 / d, as the four words that hold
 * them; s gets their sum in units of d. */
inline uint4 quant8(float8 y, float d, float id, float *s) {
    float x[8] = {y.s0, y.s1, y.s2, y.s3, y.s4, y.s5, y.s6, y.s7};
    uint a1 = 0, b1 = 0, a2 = 0, b2 = 0;
    int sum1 = 0, sum2 = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float f1 = rint(x[e] * id);
        int q1 = (int)f1, q2 = clamp((int)rint((x[e] - f1 * d) * id * 128.0f), -127, 127);
        sum1 += q1, sum2 += q2;
        uint sh = 8 * (e / 2);
        if (e % 2 == 0) a1 |= (uint)(q1 & 255) << sh, a2 |= (uint)(q2 & 255) << sh;
        else b1 |= (uint)(q1 & 255) << sh, b2 |= (uint)(q2 & 255) << sh;
    }
    *s = (float)sum1 + (float)sum2 / 128.0f; /* exact: at most 2^20 in units of 1/128 */
    return (uint4)(a1, b1, a2, b2);
}

/* Stores word c's four words where vec_dot reads them (c < n / 8). */
inline void store_quant(__local float *xs, int c, uint4 w) {
    __local uint *xq = (__local uint *)(xs + XS_FLOATS);
    int k = c / 4, wi = c % 4, at = 4 * ((wi / 2) * XQ_NB + k) + 2 * (wi % 2);
    xq[at] = w.x, xq[at + 1] = w.y;
    xq[at + 8 * XQ_NB] = w.z, xq[at + 8 * XQ_NB + 1] = w.w;
}

/* The max (is_max) or sum of v over the 4 threads 4m .. 4m + 3 of the work-group, which quantize one
 * block together; every thread of the group calls it (shuffles and barriers), red has MV_LWS floats. */
inline float quad_reduce(float v, __local float *red, int is_max) {
#if defined(SHFL_PTX)
    (void)red;
    for (int m = 1; m < 4; m <<= 1) {
        float o = shfl_xor(v, m);
        v = is_max ? fmax(v, o) : v + o;
    }
    return v;
#else
    int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    __local const float *r = red + (lid & ~3);
    v = is_max ? fmax(fmax(r[0], r[1]), fmax(r[2], r[3])) : (r[0] + r[1]) + (r[2] + r[3]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return v;
#endif
}

/* Thread lid quantizes word c = lid + it * MV_LWS (live: c < n / 8) of the input, y = its 8 values;
 * called by every thread of the group with the same it. */
inline void quant_word(float8 y, int c, int live, __local float *xs, __local float *xsum, __local float *red) {
    float4 a = fmax(fabs(y.lo), fabs(y.hi));
    float mx = quad_reduce(fmax(fmax(a.x, a.y), fmax(a.z, a.w)), red, 1);
    float d = mx / 127.0f, id = mx > 0.0f ? 127.0f / mx : 0.0f, s;
    uint4 w = quant8(y, d, id, &s);
    s = quad_reduce(s, red, 0);
    if (live) {
        store_quant(xs, c, w);
        if (c % 4 == 0) xsum[c / 4] = d, xsum[XQ_NB + c / 4] = d * s;
    }
}

/* The serial form (STAGE_FUSED 0): one thread per block quantizes the staged floats */
inline void block_quant(__local float *xs, int n, __local float *xsum) {
    for (int k = get_local_id(0); k < n / 32; k += MV_LWS) {
        __local const float *p = xs + XP(32 * k); /* 32 inputs with no pad inside */
        float mx = 0.0f;
        for (int i = 0; i < 32; i++) mx = fmax(mx, fabs(p[i]));
        float d = mx / 127.0f, id = mx > 0.0f ? 127.0f / mx : 0.0f, sum = 0.0f, s;
        for (int wi = 0; wi < 4; wi++) {
            float8 y = (float8)(p[8 * wi], p[8 * wi + 1], p[8 * wi + 2], p[8 * wi + 3], p[8 * wi + 4], p[8 * wi + 5],
                                p[8 * wi + 6], p[8 * wi + 7]);
            store_quant(xs, 4 * k + wi, quant8(y, d, id, &s));
            sum += s;
        }
        xsum[k] = d;
        xsum[XQ_NB + k] = d * sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* After xs is written: what the dot products need besides it (block sums, or the int8 form). */
inline void stage_done(__local float *xs, int n, __local float *xsum) {
#if XQ
    block_quant(xs, n, xsum);
#else
    block_sums(xs, n, xsum);
#endif
}

/* Words of 8 inputs one thread stages at most (XQ_FUSED) */
#define SQ_IT ((MV_LOCAL_X / 8 + MV_LWS - 1) / MV_LWS)

/* The matvec input in local memory: xs = x * inv_rms(x) * normw (or x), and xsum[k] = sum of xs
 * over [16k, 16k + 16) (or its int8 form). n <= MV_LOCAL_X and n % 16 == 0 (% 32 with XQ: the host
 * checks). */
inline void stage(__global const float *x, int n, __global const float *normw, float eps, __local float *xs,
                  __local float *xsum, __local float *red) {
    int lid = get_local_id(0);
#if XQ_FUSED
    /* every load of the thread issued at once: one memory latency for the whole prologue */
    float8 v[SQ_IT], w[SQ_IT];
    int nw = n / 8;
#pragma unroll
    for (int i = 0; i < SQ_IT; i++) {
        int c = lid + i * MV_LWS;
        v[i] = c < nw ? vload8(c, x) : (float8)(0.0f);
        w[i] = normw && c < nw ? vload8(c, normw) : (float8)(1.0f);
    }
    float inv = 1.0f;
    if (normw) {
        float8 ss = (float8)(0.0f);
#pragma unroll
        for (int i = 0; i < SQ_IT; i++) ss += v[i] * v[i];
        float4 s4 = ss.lo + ss.hi;
        inv = rsqrt(wg_sum((s4.x + s4.y) + (s4.z + s4.w), red, MV_LWS) / (float)n + eps);
    }
#pragma unroll
    for (int i = 0; i < SQ_IT; i++)
        if (i * MV_LWS < nw) quant_word(v[i] * inv * w[i], lid + i * MV_LWS, lid + i * MV_LWS < nw, xs, xsum, red);
    barrier(CLK_LOCAL_MEM_FENCE);
#else
    float inv = 1.0f;
    if (normw) {
        float ss = 0.0f;
        for (int j = lid; j < n; j += MV_LWS) ss += x[j] * x[j];
        inv = rsqrt(wg_sum(ss, red, MV_LWS) / (float)n + eps);
        for (int j = lid; j < n; j += MV_LWS) xs[XP(j)] = x[j] * inv * normw[j];
    } else {
        for (int j = lid; j < n; j += MV_LWS) xs[XP(j)] = x[j];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    stage_done(xs, n, xsum);
#endif
}

/* sum_e code_e * x[e] over one 32-bit word of codes (scalar local reads: see XP). (Converting codes
 * as as_float(0x4B000000 | c) - 2^23 instead of int-to-float measured no faster on the H200.) */
#define X4(x, o) (float4)((x)[o], (x)[(o) + 1], (x)[(o) + 2], (x)[(o) + 3])
#define CODES4(a, b, c, d) convert_float4((uint4)(a, b, c, d))
inline float dot_w4(uint w, __local const float *x) {
    return dot(CODES4(w & 15u, (w >> 4) & 15u, (w >> 8) & 15u, (w >> 12) & 15u), X4(x, 0)) +
           dot(CODES4((w >> 16) & 15u, (w >> 20) & 15u, (w >> 24) & 15u, w >> 28), X4(x, 4));
}
inline float dot_w8(uint w, __local const float *x) {
    return dot(CODES4(w & 255u, (w >> 8) & 255u, (w >> 16) & 255u, w >> 24), X4(x, 0));
}
inline float dot_w2(uint w, __local const float *x) {
    float r = 0.0f;
    for (int k = 0; k < 4; k++, w >>= 8)
        r += dot(CODES4(w & 3u, (w >> 2) & 3u, (w >> 4) & 3u, (w >> 6) & 3u), X4(x, 4 * k));
    return r;
}

/* One uint4 of codes with the scale and bias of its (first) group, loaded together so that all three
 * reads are in flight at once. */
struct qvec {
    uint4 w;
    float s, b;
};

inline struct qvec load_vec(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits,
                            int gs, int dt, int r, int cols, int v) {
    Q_FIX(bits, gs, dt);
    struct qvec q;
    int vpr = cols * bits / 128;
    size_t g = (size_t)r * (cols / gs) + v * (128 / bits) / gs;
    q.w = ((__global const uint4 *)W)[(size_t)r * vpr + v];
    q.s = ld(S, dt, g);
    q.b = ld(B, dt, g);
    return q;
}

/* This thread's share of row r: uint4s lane, lane + tpr, ... (up to QROW_N of them; the host picks
 * tpr so that is all of them but on very long rows), every read issued at once so a row costs one
 * memory latency, not one per uint4. Zeros past the matrix (rows) or the row. */
struct qrow {
    struct qvec v[QROW_N];
};

inline struct qrow load_row(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs,
                            int dt, int r, int rows, int cols, int lane, int tpr) {
    Q_FIX(bits, gs, dt);
    struct qrow q;
    int vpr = cols * bits / 128;
#pragma unroll
    for (int i = 0; i < QROW_N; i++) {
        int v = lane + i * tpr;
        q.v[i].w = (uint4)(0), q.v[i].s = q.v[i].b = 0.0f;
        if (bits && r < rows && v < vpr) q.v[i] = load_vec(W, S, B, bits, gs, dt, r, cols, v);
    }
    return q;
}

/* uint4 number v of row r (starting at group g0 = r * groups per row) . its inputs, with scales and biases */
inline float vec_dot(struct qvec q, int v, __global const uchar *S, __global const uchar *B, int bits, int gs, int dt,
                     size_t g0, __local const float *xs, __local const float *xsum) {
    Q_FIX(bits, gs, dt);
    int c = v * (128 / bits);
    uint4 w = q.w;
    __local const float *x = xs + XP(c); /* 4 and 8 bits: their 32 or 16 inputs have no pad inside */
    __local const float *sx = xsum + c / 16;
#if XQ
    if (bits == 4) { /* v is the input block: 32 codes a uint4 */
        __local const uint4 *xq = (__local const uint4 *)(xs + XS_FLOATS);
        uint4 a = xq[v], b = xq[XQ_NB + v], a2 = xq[2 * XQ_NB + v], b2 = xq[3 * XQ_NB + v];
        int s1 = 0, s2 = 0;
#define DOTW(wd, A1, B1, A2, B2)                                          \
    {                                                                     \
        uint lo = (wd) & 0x0F0F0F0Fu, hi = ((wd) >> 4) & 0x0F0F0F0Fu;      \
        s1 = dp4a(lo, A1, s1), s1 = dp4a(hi, B1, s1);                     \
        s2 = dp4a(lo, A2, s2), s2 = dp4a(hi, B2, s2);                     \
    }
        DOTW(w.x, a.x, a.y, a2.x, a2.y);
        DOTW(w.y, a.z, a.w, a2.z, a2.w);
        DOTW(w.z, b.x, b.y, b2.x, b2.y);
        DOTW(w.w, b.z, b.w, b2.z, b2.w);
#undef DOTW
        return q.s * xsum[v] * ((float)s1 + (float)s2 * (1.0f / 128.0f)) + q.b * xsum[XQ_NB + v];
    }
#endif
    if (bits == 4) {
        float d = dot_w4(w.x, x) + dot_w4(w.y, x + 8) + dot_w4(w.z, x + 16) + dot_w4(w.w, x + 24);
        return q.s * d + q.b * (sx[0] + sx[1]);
    }
    if (bits == 8) {
        float d = dot_w8(w.x, x) + dot_w8(w.y, x + 4) + dot_w8(w.z, x + 8) + dot_w8(w.w, x + 12);
        return q.s * d + q.b * sx[0];
    }
    /* 2 bits: 64 codes, two halves that may lie in different groups of 32 */
    __local const float *x1 = xs + XP(c + 32);
    float q0 = dot_w2(w.x, x) + dot_w2(w.y, x + 16), q1 = dot_w2(w.z, x1) + dot_w2(w.w, x1 + 16);
    float s1 = q.s, b1 = q.b;
    if ((c + 32) / gs != c / gs) {
        size_t gb = g0 + (c + 32) / gs;
        s1 = ld(S, dt, gb), b1 = ld(B, dt, gb);
    }
    return q.s * q0 + q.b * (sx[0] + sx[1]) + s1 * q1 + b1 * (sx[2] + sx[3]);
}

/* This thread's share of row r . xs, from the reads load_row issued (and any beyond QROW_N). */
inline float row_dot(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs,
                     int dt, int r, int cols, int lane, int tpr, struct qrow q, __local const float *xs,
                     __local const float *xsum) {
    Q_FIX(bits, gs, dt);
    float acc = 0.0f;
    if (bits == 0) {
        for (int j = lane; j < cols; j += tpr) acc += ld(W, dt, (size_t)r * cols + j) * xs[XP(j)];
        return acc;
    }
    const int vpr = cols * bits / 128;
    size_t g0 = (size_t)r * (cols / gs);
#pragma unroll
    for (int i = 0; i < QROW_N; i++) {
        int v = lane + i * tpr;
        if (v < vpr) acc += vec_dot(q.v[i], v, S, B, bits, gs, dt, g0, xs, xsum);
    }
    for (int v = lane + QROW_N * tpr; v < vpr; v += tpr)
        acc += vec_dot(load_vec(W, S, B, bits, gs, dt, r, cols, v), v, S, B, bits, gs, dt, g0, xs, xsum);
    return acc;
}

/* Inputs too long to stage (cols > MV_LOCAL_X: only down_proj of large models), read from global. */
inline float row_dot_global(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits,
                            int gs, int dt, int r, int cols, int lane, int tpr, __global const float *x) {
    Q_FIX(bits, gs, dt);
    float acc = 0.0f;
    if (bits == 0) {
        for (int j = lane; j < cols; j += tpr) acc += ld(W, dt, (size_t)r * cols + j) * x[j];
        return acc;
    }
    const int per = 32 / bits, wpr = cols / per, ng = cols / gs;
    const uint mask = (1u << bits) - 1u;
    __global const uint *row = (__global const uint *)W + (size_t)r * wpr;
    for (int w = lane; w < wpr; w += tpr) {
        uint word = row[w];
        int j0 = w * per;
        float qx = 0.0f, sx = 0.0f;
        for (int e = 0; e < per; e++) {
            float xv = x[j0 + e];
            qx += (float)((word >> (e * bits)) & mask) * xv;
            sx += xv;
        }
        size_t g = (size_t)r * ng + j0 / gs;
        acc += ld(S, dt, g) * qx + ld(B, dt, g) * sx;
    }
    return acc;
}

/* (value, row as int bits) pairs: b beats a when larger, or equal at an earlier row */
inline int beats(float2 b, float2 a) { return b.x > a.x || (b.x == a.x && as_int(b.y) < as_int(a.y)); }

/* The best of one pair per thread over the MV_LWS threads; valid in thread 0. */
inline float2 wg_best(float2 v, __local float2 *red) {
    int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = MV_LWS / 2; s > 0; s >>= 1) {
        if (lid < s && beats(red[lid + s], red[lid])) red[lid] = red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return red[0];
}

/* out[0] = the row of the largest of the n per-group bests (the first on ties), out[1] = whether a
 * grid barrier gave up; one work-group. */
inline void argmax_body(__global const float2 *best, int n, __global int *out, volatile __global const int *bar,
                        __local float2 *red) {
    float2 b = (float2)(-INFINITY, as_float(0x7fffffff));
    for (int j = get_local_id(0); j < n; j += MV_LWS)
        if (beats(best[j], b)) b = best[j];
    b = wg_best(b, red);
    if (get_local_id(0) == 0) out[0] = as_int(b.y), out[1] = bar[1];
}

/* Sums of the tpr lanes of each row slot (two values at once); valid in lane 0. Halved down to 8
 * lanes first: one lane adding 128 values from local memory is a 128-step dependent chain. */
inline float2 row_reduce2(float2 v, __local float2 *red, int tpr) {
#if defined(SHFL_PTX) && MV_LWS >= 32
    /* every thread of the work-group takes the same branches */
    for (int m = (tpr < 32 ? tpr : 32) / 2; m > 0; m >>= 1) v += (float2)(shfl_xor(v.x, m), shfl_xor(v.y, m));
    if (tpr <= 32) return v;
    /* longer rows: each warp's sum, then lane 0 adds the row's tpr / 32 of them */
    int wl = get_local_id(0);
    if (wl % 32 == 0) red[wl / 32] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float2 t = (float2)(0.0f);
    if (wl % tpr == 0)
        for (int i = 0; i < tpr / 32; i++) t += red[wl / 32 + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return t;
#endif
    int lid = get_local_id(0), lane = lid % tpr;
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    int n = tpr;
    for (; n > 8; n >>= 1) {
        if (lane < n / 2) red[lid] += red[lid + n / 2];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float2 s = (float2)(0.0f);
    if (lane == 0)
        for (int i = 0; i < n; i++) s += red[lid + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return s;
}

#define WARGS(n) __global const uchar *W##n, __global const uchar *S##n, __global const uchar *B##n, int bits##n, int gs##n, int dt##n
#define WPASS(n) W##n, S##n, B##n, bits##n, gs##n, dt##n

/* x[j] = element j of embedding row `id` */
inline float embed_one(WARGS(0), int cols, int id, int j) {
    Q_FIX(bits0, gs0, dt0);
    if (bits0 == 0) return ld(W0, dt0, (size_t)id * cols + j);
    int per = 32 / bits0, ng = cols / gs0;
    uint word = ((__global const uint *)W0)[(size_t)id * (cols / per) + j / per];
    float q = (float)((word >> ((j % per) * bits0)) & ((1u << bits0) - 1u));
    return ld(S0, dt0, (size_t)id * ng + j / gs0) * q + ld(B0, dt0, (size_t)id * ng + j / gs0);
}

/* The step's token: id, or with id < 0 the previous step's argmax, still on the device (the host
 * enqueues the next greedy step before it has read it back); clamped, so a bad one reads no wild row
 * (the host reports it when it reads that step's result). */
inline int step_token(int id, __global const int *prev, int vocab) { return clamp(id >= 0 ? id : prev[0], 0, vocab - 1); }

__kernel void embed(WARGS(0), int cols, __global float *x, __global const int *prev, int vocab, int id) {
    id = step_token(id, prev, vocab);
    int j = get_global_id(0);
    if (j < cols) x[j] = embed_one(WPASS(0), cols, id, j);
}

/* The row loop shared by matvec-like kernels: y[r] = W . xs (+ res[r] when add). With best != 0 the
 * group also leaves the largest y[r] and its row (the first on ties) in best[group] for `argmax`. */
inline void rows_times_x(WARGS(0), int rows, int cols, int tpr, __global const float *x, __local const float *xs,
                         __local const float *xsum, int staged, __global float *y, __global const float *res,
                         int add, struct qrow first, __local float2 *red, __global float2 *best) {
    int lid = get_local_id(0), lane = lid % tpr, rpg = MV_LWS / tpr;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int r0 = get_group_id(0) * rpg; r0 < rows; r0 += rpg * get_num_groups(0)) {
        int r = r0 + lid / tpr;
        float part = 0.0f, rv = add && lane == 0 && r < rows ? res[r] : 0.0f; /* read before the dot products */
#if MV_PIPE
        /* the next sweep's reads are in flight while this one's arithmetic runs */
        struct qrow next = load_row(WPASS(0), r + rpg * get_num_groups(0), staged ? rows : 0, cols, lane, tpr);
#endif
        if (r < rows) {
            if (staged) part = row_dot(WPASS(0), r, cols, lane, tpr, first, xs, xsum);
            else part = row_dot_global(WPASS(0), r, cols, lane, tpr, x);
        }
#if MV_PIPE
        first = next;
#else
        if (staged) first = load_row(WPASS(0), r + rpg * get_num_groups(0), rows, cols, lane, tpr); /* next sweep */
#endif
        float s = row_reduce2((float2)(part, 0.0f), red, tpr).x;
        if (lane == 0 && r < rows) {
            y[r] = add ? rv + s : s;
            if (s > bv) bv = s, bi = r;
        }
    }
    if (!best) return;
    float2 b = wg_best((float2)(bv, as_float(bi)), red);
    if (lid == 0) best[get_group_id(0)] = b;
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
            if (s > bv) bv = s, bi = r;
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
    if (staged) stage(x, cols, norm_off >= 0 ? vecs + norm_off : 0, eps, xs, xsum, red);
    rows_times_x(WPASS(0), rows, cols, tpr, x, xs, xsum, staged, y, res, add, first, red2, track ? best : 0);
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
    rows_times_x(WPASS(0), rows, cols, tpr, x, xs, xsum, 1, x_out, x, 1, first, red2, 0);
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

#if defined(SHFL_PTX)
/* acc[t] += sum over the warp's 32 positions c0 + j of lane j's e times V[c0 + j][lane + 32 t], t < dpl
 * (a constant where called, so x's indices are too): 32 values a lane read at once, then weighed,
 * because the compiler keeps loads after a shuffle's asm, one memory latency each. */
inline void v_weigh(__global const float *vp, int c0, int p1, int kv_dim, float e, float *acc, int dpl) {
    for (int j0 = 0; j0 < 32; j0 += 32 / dpl) {
        float x[32];
#pragma unroll
        for (int j = 0; j < 32; j++) x[j] = vp[(size_t)min(c0 + j0 + j / dpl, p1 - 1) * kv_dim + 32 * (j % dpl)];
#pragma unroll
        for (int j = 0; j < 32; j += dpl) {
            float ej = shfl_idx(e, j0 + j / dpl);
#pragma unroll
            for (int t = 0; t < dpl; t++) acc[t] += ej * x[j + t];
        }
    }
}

/* attention_body on NVIDIA for hd % 32 == 0, hd <= 128: each warp keeps its own online softmax over
 * 32 positions of every ATT_LWS block (max and sum by shuffles, no work-group barrier), and the warps
 * are combined once at the end. A lane scores one position with all its key reads in flight, then
 * owns hd / 32 dims of V, taking each position's weight from its lane by a shuffle: two memory
 * latencies a block where the work-group form has a chain of barriers and partly serial reads. */
inline void attention_warps(__global const float *q, __global const float *k, __global const float *v, int n_ctx,
                            int hd, int kv_dim, int p0, int p1, float scale, __global float *o, __local float *red,
                            __local float4 *acc_l, __local float *ol) {
    int lid = get_local_id(0), lane = lid % 32, w = lid / 32, dpl = hd / 32;
    float m = -INFINITY, l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c0 = p0 + 32 * w; c0 < p1; c0 += ATT_LWS) {
        int p = c0 + lane, pc = min(p, p1 - 1); /* rows past the span are read (clamped) but weigh 0 */
        __global const float *kp = k + pc;
        float4 d4 = (float4)(0.0f);
#pragma unroll 16
        for (int i = 0; i < hd; i += 4)
            d4 += vload4(0, q + i) * (float4)(kp[(size_t)i * n_ctx], kp[(size_t)(i + 1) * n_ctx],
                                              kp[(size_t)(i + 2) * n_ctx], kp[(size_t)(i + 3) * n_ctx]);
        float d = p < p1 ? ((d4.x + d4.y) + (d4.z + d4.w)) * scale : -INFINITY, mw = d;
        for (int s = 16; s > 0; s >>= 1) mw = fmax(mw, shfl_xor(mw, s));
        float m_new = fmax(m, mw), alpha = exp(m - m_new), e = exp(d - m_new), sum = e;
        for (int s = 16; s > 0; s >>= 1) sum += shfl_xor(sum, s);
        l = l * alpha + sum;
        m = m_new;
#pragma unroll
        for (int j = 0; j < 4; j++) acc[j] *= alpha;
        __global const float *vp = v + lane;
        if (dpl == 2) v_weigh(vp, c0, p1, kv_dim, e, acc, 2);
        else if (dpl == 1) v_weigh(vp, c0, p1, kv_dim, e, acc, 1);
        else v_weigh(vp, c0, p1, kv_dim, e, acc, 4);
    }
    __local float *al = (__local float *)acc_l; /* [warp][hd] */
#pragma unroll
    for (int t = 0; t < 4; t++)
        if (t < dpl) al[w * hd + lane + 32 * t] = acc[t];
    if (lane == 0) red[2 * w] = m, red[2 * w + 1] = l;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < hd) {
        float mx = -INFINITY, den = 0.0f, num = 0.0f;
        for (int i = 0; i < ATT_LWS / 32; i++) mx = fmax(mx, red[2 * i]);
        for (int i = 0; i < ATT_LWS / 32; i++) {
            float f = exp(red[2 * i] - mx); /* 0 for a warp that had no position */
            den += red[2 * i + 1] * f, num += al[i * hd + lid] * f;
        }
        o[2 + lid] = num;
        if (lid == 0) o[0] = mx, o[1] = den;
#if ATT_FUSED
        ol[lid] = num / den; /* the head's output when this is its only span (att_fold) */
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* red and acc_l are reused by the next (s, h) of a persistent group */
}
#endif

/* Work-group (s, h): query head h over positions [s * span, min((s + 1) * span, pos + 1)), scored
 * ATT_LWS at a time with an online softmax. Leaves (max, sum of exp, sum of exp * v[head_dim]) in
 * part[h][s] for attn_out to combine. hd % 4 == 0 and ATT_LWS >= hd / 4 (the host checks). */
inline void attention_body(__global const float *q, __global const float *kt, __global const float *vc,
                           __global float *part, int n_ctx, int hd, int n_heads, int n_kv, int layer, int pos, int span,
                           int s, int h, __local float *sl, __local float *red, __local float4 *acc_l) {
    int lid = get_local_id(0);
#ifdef HEAD_DIM
    hd = HEAD_DIM; /* the host compiles the model's in: one form of attention, not three (see cl.c) */
#endif
    int g = h / (n_heads / n_kv), kv_dim = n_kv * hd;
    int p0 = s * span, p1 = min(p0 + span, pos + 1);
    float scale = rsqrt((float)hd);
    kt += (size_t)layer * kv_dim * n_ctx;
    vc += (size_t)layer * kv_dim * n_ctx;
    q += h * hd; /* read by every thread (the same addresses: broadcast), together with its keys */
    __global const float *k = kt + (size_t)g * hd * n_ctx;
    __global const float *v = vc + (size_t)g * hd;
#if defined(SHFL_PTX) && ATT_LWS % 32 == 0
    if (hd % 32 == 0 && hd <= 128 && hd <= ATT_LWS) {
        attention_warps(q, k, v, n_ctx, hd, kv_dim, p0, p1, scale, part + ((size_t)h * ATT_MAX_SPLIT + s) * (hd + 2),
                        red, acc_l, sl);
        return;
    }
#endif
    int hd4 = hd / 4, parts = ATT_LWS / hd4, i4 = lid % hd4, pt = lid / hd4; /* V: (part, 4 dims) per thread */
    float m = -INFINITY, l = 0.0f;
    float4 acc = (float4)(0.0f);
    for (int c0 = p0; c0 < p1; c0 += ATT_LWS) {
        int p = c0 + lid, n = min(ATT_LWS, p1 - c0);
        float d = -INFINITY;
        if (p < p1) {
            /* hd % 4 == 0: four independent loads in flight per step, not one */
            float4 d4 = (float4)(0.0f);
            __global const float *kp = k + p;
#pragma unroll 8
            for (int i = 0; i < hd; i += 4)
                d4 += vload4(0, q + i) *
                      (float4)(kp[(size_t)i * n_ctx], kp[(size_t)(i + 1) * n_ctx], kp[(size_t)(i + 2) * n_ctx], kp[(size_t)(i + 3) * n_ctx]);
            d = (d4.x + d4.y + d4.z + d4.w) * scale; /* scaled once, not per key element */
        }
        float m_new = fmax(m, wg_max(d, red, ATT_LWS)), alpha = exp(m - m_new);
        float e = p < p1 ? exp(d - m_new) : 0.0f;
        sl[lid] = e;
        l = l * alpha + wg_sum(e, red, ATT_LWS); /* its barriers publish sl */
        acc *= alpha;
        if (pt < parts) {
            int pp = pt;
#pragma unroll 4
            for (; pp + parts < n; pp += 2 * parts) /* two rows of V in flight */
                acc += sl[pp] * vload4(i4, v + (size_t)(c0 + pp) * kv_dim) +
                       sl[pp + parts] * vload4(i4, v + (size_t)(c0 + pp + parts) * kv_dim);
            if (pp < n) acc += sl[pp] * vload4(i4, v + (size_t)(c0 + pp) * kv_dim);
        }
        m = m_new;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    acc_l[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    __global float *o = part + ((size_t)h * ATT_MAX_SPLIT + s) * (hd + 2);
    if (lid < hd4) {
        float4 t = (float4)(0.0f);
        for (int j = 0; j < parts; j++) t += acc_l[j * hd4 + lid];
        vstore4(t, lid, o + 2);
    }
    if (lid == 0) o[0] = m, o[1] = l;
    barrier(CLK_LOCAL_MEM_FENCE); /* acc_l is reused by the next (s, h) of a persistent group */
}

__kernel void attention(__global const float *q, __global const float *kt, __global const float *vc,
                        __global float *part, int n_ctx, int hd, int n_heads, int n_kv, int layer, int pos, int span) {
    __local float sl[ATT_LWS], red[ATT_LWS];
    __local float4 acc_l[ATT_LWS];
    attention_body(q, kt, vc, part, n_ctx, hd, n_heads, n_kv, layer, pos, span, get_group_id(0), get_group_id(1),
                   sl, red, acc_l);
}

#if ATT_FUSED
/* ATT_FUSED, after this group left all its partials (own: head h's output is in ol, the head's only
 * span and this group's only one): the group that leaves a head's last partial (a count per head,
 * done[h]) combines them and multiplies the head's output, HEAD_DIM / 32 blocks of o_proj's inputs,
 * by their columns of o_proj into x_out, plus res (the residual) for head 0 (blocks_times). So
 * attention and o_proj are one phase, with no grid barrier between them. */
inline void att_fold(volatile __global const float *part, int h, int n_split, __global int *done,
                     __global const uchar *ot, int dim, int q_dim, __global float *x_out, __global const float *res,
                     __local float *xs, __local float *xsum, __local float *red, __local int *last,
                     __local const float *ol, int own) {
    int lid = get_local_id(0), nbk = HEAD_DIM / 32;
    if (!own) {
        mem_fence(CLK_GLOBAL_MEM_FENCE); /* this group's partial, before the count says it is there */
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid == 0) {
            last[0] = atomic_inc(done + h) == n_split - 1;
            if (last[0]) done[h] = 0; /* for the next step */
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!last[0]) return;
        mem_fence(CLK_GLOBAL_MEM_FENCE);
    }
    if (lid < 32) { /* one warp: lanes 0 .. 4 nbk - 1 combine and quantize 8 outputs each */
        float y[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (lid < 4 * nbk)
#pragma unroll
            for (int e = 0; e < 8; e++)
                y[e] = own ? ol[8 * lid + e] : attn_combine(part, HEAD_DIM, n_split, h * HEAD_DIM + 8 * lid + e);
        quant_word(vload8(0, y), lid, lid < 4 * nbk, xs, xsum, red);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    blocks_times(ot, h * nbk, nbk, 1, 0, dim, q_dim, xs, xsum, x_out, h == 0 ? res : 0);
}
#endif

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
