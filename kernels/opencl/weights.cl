/* Inputs and weights: a matvec's input staged in local memory (normalized; as int8 blocks with their
 * sums for 4-bit models), a thread's share of a weight row read as uint4s with its scales and biases,
 * their dot products, and the row and work-group reductions (kernels/opencl/common.cl comes before). */

/* Floats of the staged input: none when the int8 form is all the dot products read (XQ_FUSED) */
#define XS_FLOATS (XQ_FUSED ? 0 : XS_LEN)
/* xs's floats are followed by the quantized input (XQ): 4 x XQ_NB uint4, see quant_word (read as
 * uint4: every xs is declared 16-byte aligned, and XS_LEN floats are a multiple of 16 bytes) */
#define XS_ALLOC (XS_FLOATS + (XQ ? MV_LOCAL_X / 2 : 0))
/* xsum: a float per 16 inputs (block sums), or with XQ d and d x the sum of the codes per block, then
 * (XQ_HALVES) d x the sum per half block */
#define XSUM_LEN (MV_LOCAL_X / 16 + (XQ_HALVES ? MV_LOCAL_X / 16 : 0))
/* A kernel's staging arrays (the start of a __local declaration list) */
#define STAGE_LOCALS __local float xs[XS_ALLOC] __attribute__((aligned(16))), xsum[XSUM_LEN]

/* Bytes 0, 2 of a then 0, 2 of b (even_bytes), and 1, 3 of each (odd_bytes): 8 codes of 8 bits in the
 * even/odd order of the int8 input words (XQ) */
#if defined(DP4A_PTX)
inline uint even_bytes(uint a, uint b) {
    uint d;
    asm("prmt.b32 %0, %1, %2, 0x6420;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
inline uint odd_bytes(uint a, uint b) {
    uint d;
    asm("prmt.b32 %0, %1, %2, 0x7531;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
#else
inline uint even_bytes(uint a, uint b) { return (a & 0xFFu) | ((a >> 8) & 0xFF00u) | ((b & 0xFFu) << 16) | ((b << 8) & 0xFF000000u); }
inline uint odd_bytes(uint a, uint b) { return ((a >> 8) & 0xFFu) | ((a >> 16) & 0xFF00u) | ((b << 8) & 0xFF0000u) | (b & 0xFF000000u); }
#endif

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
 * sum of the block's quantized inputs (the bias term); with XQ_HALVES, xsum[2 XQ_NB + 2k + h] that of
 * its half h (inputs 16h .. 16h + 15, words 2h and 2h + 1). */

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
inline float quad_reduce(float v, __local float *red, int is_max) { return lanes_reduce(v, 4, red, is_max); }

/* Thread lid quantizes word c = lid + it * MV_LWS (live: c < n / 8) of the input, y = its 8 values;
 * called by every thread of the group with the same it. */
inline void quant_word(float8 y, int c, int live, __local float *xs, __local float *xsum, __local float *red) {
    float4 a = fmax(fabs(y.lo), fabs(y.hi));
    float mx = quad_reduce(fmax(fmax(a.x, a.y), fmax(a.z, a.w)), red, 1);
    float d = mx / 127.0f, id = mx > 0.0f ? 127.0f / mx : 0.0f, s;
    uint4 w = quant8(y, d, id, &s);
#if XQ_HALVES
    /* the half's sum and the block's (exact in any order: multiples of 1/128 below 2^20) */
#if defined(SHFL_PTX)
    float sh = s + shfl_xor(s, 1);
    s = sh + shfl_xor(sh, 2);
#else /* one exchange through local memory (barriers are what a CPU device's compiler pays for) */
    int lid = get_local_id(0), l0 = lid & ~3;
    red[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    float sh = red[lid & ~1] + red[(lid & ~1) + 1];
    s = (red[l0] + red[l0 + 1]) + (red[l0 + 2] + red[l0 + 3]);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
#else
    s = quad_reduce(s, red, 0);
#endif
    if (live) {
        store_quant(xs, c, w);
        if (c % 4 == 0) xsum[c / 4] = d, xsum[XQ_NB + c / 4] = d * s;
#if XQ_HALVES
        if (c % 2 == 0) xsum[2 * XQ_NB + c / 2] = d * sh;
#endif
    }
}

/* The serial form (STAGE_FUSED 0): one thread per block quantizes the staged floats */
inline void block_quant(__local float *xs, int n, __local float *xsum) {
    for (int k = get_local_id(0); k < n / 32; k += MV_LWS) {
        __local const float *p = xs + XP(32 * k); /* 32 inputs with no pad inside */
        float mx = 0.0f;
        for (int i = 0; i < 32; i++) mx = fmax(mx, fabs(p[i]));
        float d = mx / 127.0f, id = mx > 0.0f ? 127.0f / mx : 0.0f, sum = 0.0f, hs[2] = {0.0f, 0.0f}, s;
        for (int wi = 0; wi < 4; wi++) {
            float8 y = (float8)(p[8 * wi], p[8 * wi + 1], p[8 * wi + 2], p[8 * wi + 3], p[8 * wi + 4], p[8 * wi + 5],
                                p[8 * wi + 6], p[8 * wi + 7]);
            store_quant(xs, 4 * k + wi, quant8(y, d, id, &s));
            sum += s, hs[wi / 2] += s;
        }
#if XQ_HALVES
        xsum[2 * XQ_NB + 2 * k] = d * hs[0], xsum[2 * XQ_NB + 2 * k + 1] = d * hs[1];
#else
        (void)hs;
#endif
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

/* uint4 v of row r counted from column c0 (0, or a multiple of 128: chunked_times_x) */
inline struct qvec load_vec(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits,
                            int gs, int dt, int r, int cols, int c0, int v) {
    Q_FIX(bits, gs, dt);
    struct qvec q;
    int vpr = cols * bits / 128;
    size_t g = (size_t)r * (cols / gs) + (c0 + v * (128 / bits)) / gs;
    q.w = ((__global const uint4 *)W)[(size_t)r * vpr + c0 * bits / 128 + v];
    q.s = ld_s(S, dt, g);
    q.b = ld_b(S, B, dt, g);
    return q;
}

/* This thread's share of row r: uint4s lane, lane + tpr, ... (up to QROW_N of them; the host picks
 * tpr so that is all of them but on very long rows), every read issued at once so a row costs one
 * memory latency, not one per uint4. Zeros past the matrix (rows) or the row. */
struct qrow {
    struct qvec v[QROW_N];
};

inline struct qrow load_row_f(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs,
                              int dt, int r, int rows, int cols, int c0, int n, int lane, int tpr) {
    Q_FIX(bits, gs, dt);
    struct qrow q;
    int vpr = n * bits / 128; /* of columns [c0, c0 + n) */
#pragma unroll
    for (int i = 0; i < QROW_N; i++) {
        int v = lane + i * tpr;
        q.v[i].w = (uint4)(0), q.v[i].s = q.v[i].b = 0.0f;
        if (bits && r < rows && v < vpr) q.v[i] = load_vec(W, S, B, bits, gs, dt, r, cols, c0, v);
    }
    return q;
}

/* load_row_f with the matrix's format a constant (Q_COPIES), or load_row_f itself: columns [c0, c0 + n)
 * of the row (load_row_at), or all of them (load_row) */
#if Q_COPIES
#define LOAD_ROW_AT(i) load_row_f(W, S, B, Q_B##i, Q_G##i, Q_D##i, r, rows, cols, c0, n, lane, tpr)
inline struct qrow load_row_at(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs,
                               int dt, int r, int rows, int cols, int c0, int n, int lane, int tpr) {
    Q_PICK(LOAD_ROW_AT, bits, gs, dt);
}
#undef LOAD_ROW_AT
#else
#define load_row_at load_row_f
#endif
inline struct qrow load_row(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs,
                            int dt, int r, int rows, int cols, int lane, int tpr) {
    return load_row_at(W, S, B, bits, gs, dt, r, rows, cols, 0, cols, lane, tpr);
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
#if XQ_HALVES
        if (gs < 32) { /* groups of 16: the second half (codes 16 .. 31) has its own scale and bias */
            int h1 = s1, h2 = s2;
            s1 = s2 = 0;
            DOTW(w.z, b.x, b.y, b2.x, b2.y);
            DOTW(w.w, b.z, b.w, b2.z, b2.w);
            size_t gb = g0 + (c + 16) / gs;
            return xsum[v] * (q.s * ((float)h1 + (float)h2 * (1.0f / 128.0f)) +
                              ld_s(S, dt, gb) * ((float)s1 + (float)s2 * (1.0f / 128.0f))) +
                   q.b * xsum[2 * XQ_NB + 2 * v] + ld_b(S, B, dt, gb) * xsum[2 * XQ_NB + 2 * v + 1];
        }
#endif
        DOTW(w.z, b.x, b.y, b2.x, b2.y);
        DOTW(w.w, b.z, b.w, b2.z, b2.w);
#undef DOTW
        return q.s * xsum[v] * ((float)s1 + (float)s2 * (1.0f / 128.0f)) + q.b * xsum[XQ_NB + v];
    }
#if XQ_HALVES
    if (bits == 8) { /* v is half v % 2 of input block v / 2: 16 codes a uint4 */
        __local const uint4 *xq = (__local const uint4 *)(xs + XS_FLOATS);
        int k = v >> 1, h = v & 1;
        uint4 a = xq[h * XQ_NB + k], a2 = xq[(2 + h) * XQ_NB + k];
        uint e0 = even_bytes(w.x, w.y), o0 = odd_bytes(w.x, w.y), e1 = even_bytes(w.z, w.w), o1 = odd_bytes(w.z, w.w);
        int s1 = dp4a(e0, a.x, 0), s2 = dp4a(e0, a2.x, 0);
        s1 = dp4a(o0, a.y, s1), s2 = dp4a(o0, a2.y, s2);
        s1 = dp4a(e1, a.z, s1), s2 = dp4a(e1, a2.z, s2);
        s1 = dp4a(o1, a.w, s1), s2 = dp4a(o1, a2.w, s2);
        return q.s * xsum[k] * ((float)s1 + (float)s2 * (1.0f / 128.0f)) + q.b * xsum[2 * XQ_NB + v];
    }
#endif
#endif
    if (bits == 4) {
        if (gs < 32) { /* groups of 16 (Q3_K): the second half has its own scale and bias */
            size_t gb = g0 + (c + 16) / gs;
            return q.s * (dot_w4(w.x, x) + dot_w4(w.y, x + 8)) + q.b * sx[0] +
                   ld_s(S, dt, gb) * (dot_w4(w.z, x + 16) + dot_w4(w.w, x + 24)) + ld_b(S, B, dt, gb) * sx[1];
        }
        float d = dot_w4(w.x, x) + dot_w4(w.y, x + 8) + dot_w4(w.z, x + 16) + dot_w4(w.w, x + 24);
        return q.s * d + q.b * (sx[0] + sx[1]);
    }
    if (bits == 8) {
        float d = dot_w8(w.x, x) + dot_w8(w.y, x + 4) + dot_w8(w.z, x + 8) + dot_w8(w.w, x + 12);
        return q.s * d + q.b * sx[0];
    }
    /* 2 bits: 64 codes, two halves that may lie in different groups of 32, or a word of 16 a group (Q2_K) */
    __local const float *x1 = xs + XP(c + 32);
    if (gs < 32) {
        size_t g = g0 + c / 16;
        return q.s * dot_w2(w.x, x) + q.b * sx[0] + ld_s(S, dt, g + 1) * dot_w2(w.y, x + 16) + ld_b(S, B, dt, g + 1) * sx[1] +
               ld_s(S, dt, g + 2) * dot_w2(w.z, x1) + ld_b(S, B, dt, g + 2) * sx[2] + ld_s(S, dt, g + 3) * dot_w2(w.w, x1 + 16) +
               ld_b(S, B, dt, g + 3) * sx[3];
    }
    float q0 = dot_w2(w.x, x) + dot_w2(w.y, x + 16), q1 = dot_w2(w.z, x1) + dot_w2(w.w, x1 + 16);
    float s1 = q.s, b1 = q.b;
    if ((c + 32) / gs != c / gs) {
        size_t gb = g0 + (c + 32) / gs;
        s1 = ld_s(S, dt, gb), b1 = ld_b(S, B, dt, gb);
    }
    return q.s * q0 + q.b * (sx[0] + sx[1]) + s1 * q1 + b1 * (sx[2] + sx[3]);
}

/* acc plus q (a thread's uint4s lane, lane + tpr, ... of a row, as load_row_f read them) . their
 * inputs, in that order */
inline float qrow_dot(struct qrow q, int lane, int tpr, int vpr, __global const uchar *S, __global const uchar *B,
                      int bits, int gs, int dt, size_t g0, __local const float *xs, __local const float *xsum, float acc) {
#pragma unroll
    for (int i = 0; i < QROW_N; i++) {
        int v = lane + i * tpr;
        if (v < vpr) acc += vec_dot(q.v[i], v, S, B, bits, gs, dt, g0, xs, xsum);
    }
    return acc;
}

#if ROW_TAIL
/* acc plus the rest of a long row after its first QROW_N uint4s a thread (FFN_FUSED gives a row 8
 * threads whatever its length: 7B's 3584 inputs are 14 uint4s a thread), QROW_N uint4s at a time, all
 * read before the first is used; the same order of sums as one by one. Read one by one, each uint4
 * cost a memory latency (H200 tg128, 4-bit g64: 7B 249-250 -> 277.5 tok/s, 3B 505 -> 528). */
inline float row_tail_f(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs,
                        int dt, int r, int cols, int c0, int n, int lane, int tpr, size_t g0, __local const float *xs,
                        __local const float *xsum, float acc) {
    Q_FIX(bits, gs, dt);
    const int vpr = n * bits / 128;
    for (int v0 = lane + QROW_N * tpr; v0 < vpr; v0 += QROW_N * tpr)
        acc = qrow_dot(load_row_f(W, S, B, bits, gs, dt, r, r + 1, cols, c0, n, v0, tpr), v0, tpr, vpr, S, B, bits, gs, dt,
                       g0, xs, xsum, acc);
    return acc;
}

/* row_tail_f not inlined: one copy (a format), not one at every row_dot. The `token` kernel slows
 * down as its code grows: inlined at every call site, the 0.5B went from 1,616 to 1,380 tok/s. Used
 * where ROW_TAIL (kernels/opencl/common.cl) says. */
#define ROW_TAIL_PARAMS                                                                                              \
    __global const uchar *W, __global const uchar *S, __global const uchar *B, int r, int cols, int c0, int n,       \
        int lane, int tpr, size_t g0, __local const float *xs, __local const float *xsum, float acc
#define ROW_TAIL_ARGS r, cols, c0, n, lane, tpr, g0, xs, xsum, acc
#if Q_COPIES
#define ROW_TAIL_COPY(i)                                                                                             \
    __attribute__((noinline)) float row_tail_##i(ROW_TAIL_PARAMS) {                                              \
        return row_tail_f(W, S, B, Q_B##i, Q_G##i, Q_D##i, ROW_TAIL_ARGS);                                            \
    }
ROW_TAIL_COPY(0)
ROW_TAIL_COPY(1)
ROW_TAIL_COPY(2)
ROW_TAIL_COPY(3)
#define ROW_TAIL_AT(i) row_tail_##i(W, S, B, ROW_TAIL_ARGS)
inline float row_tail(int bits, int gs, int dt, ROW_TAIL_PARAMS) { Q_PICK(ROW_TAIL_AT, bits, gs, dt); }
#undef ROW_TAIL_AT
#else
__attribute__((noinline)) float row_tail(int bits, int gs, int dt, ROW_TAIL_PARAMS) {
    return row_tail_f(W, S, B, bits, gs, dt, ROW_TAIL_ARGS);
}
#endif
#endif

/* This thread's share of row r . xs, from the reads load_row issued (and any beyond QROW_N). */
inline float row_dot_f(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs,
                       int dt, int r, int cols, int c0, int n, int lane, int tpr, struct qrow q, __local const float *xs,
                       __local const float *xsum) {
    Q_FIX(bits, gs, dt);
    float acc = 0.0f;
    if (bits == 0) {
        for (int j = lane; j < n; j += tpr) acc += ld(W, dt, (size_t)r * cols + c0 + j) * xs[XP(j)];
        return acc;
    }
    const int vpr = n * bits / 128; /* of columns [c0, c0 + n), staged in xs from 0 */
    size_t g0 = (size_t)r * (cols / gs) + c0 / gs;
    acc = qrow_dot(q, lane, tpr, vpr, S, B, bits, gs, dt, g0, xs, xsum, acc);
#if ROW_TAIL
    if (lane + QROW_N * tpr < vpr) acc = row_tail(bits, gs, dt, W, S, B, r, cols, c0, n, lane, tpr, g0, xs, xsum, acc);
#else
    for (int v = lane + QROW_N * tpr; v < vpr; v += tpr)
        acc += vec_dot(load_vec(W, S, B, bits, gs, dt, r, cols, c0, v), v, S, B, bits, gs, dt, g0, xs, xsum);
#endif
    return acc;
}

#if Q_COPIES
#define ROW_DOT_AT(i) row_dot_f(W, S, B, Q_B##i, Q_G##i, Q_D##i, r, cols, c0, n, lane, tpr, q, xs, xsum)
inline float row_dot_at(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs, int dt,
                        int r, int cols, int c0, int n, int lane, int tpr, struct qrow q, __local const float *xs,
                        __local const float *xsum) {
    Q_PICK(ROW_DOT_AT, bits, gs, dt);
}
#undef ROW_DOT_AT
#else
#define row_dot_at row_dot_f
#endif
inline float row_dot(__global const uchar *W, __global const uchar *S, __global const uchar *B, int bits, int gs, int dt,
                     int r, int cols, int lane, int tpr, struct qrow q, __local const float *xs, __local const float *xsum) {
    return row_dot_at(W, S, B, bits, gs, dt, r, cols, 0, cols, lane, tpr, q, xs, xsum);
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
/* A launch's weights as byte offsets into one buffer (the arena, or the matrix's own), WAT making the
 * pointers WARGS names: one buffer argument rather than nine for a GEMM of three stacked matrices.
 * (NVIDIA's OpenCL spends the host 0.25-0.4 us on a buffer argument, scripts/cl_floor.c; measured end
 * to end, the eight fewer made no difference to a step: docs/performance.md, sessions 42-43.) */
#define WOFF(n) ulong wo##n, ulong so##n, ulong bo##n, int bits##n, int gs##n, int dt##n
#define WAT(A, n) __global const uchar *W##n = (A) + wo##n, *S##n = (A) + so##n, *B##n = (A) + bo##n

