/* OpenCL C 1.2 kernels for one decode step (engine/backend/opencl/ drives them), in files joined into
 * one program in this order: common.cl (this: tunables, loads, reductions), weights.cl (inputs staged,
 * weight rows read and dotted), matvec.cl, attention.cl, token.cl (the one-launch step), then prompt
 * processing's gemm.cl and prefill.cl (the list is CMakeLists.txt's TLLM_CL_SOURCES). No extension is needed: f16
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
#define MV_TAIL 1 /* ... and up to this many more, a second round of reads (H200: down_proj in one sweep, +1.6%) */
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

/* -DQ_NF=n -DQ_B0 -DQ_G0 -DQ_D0 ... (up to 4 formats; the host adds them on GPUs for a model of several
 * formats, as GGUF's Q4_K_M mixes are, most weight bytes first): each format gets its own copy of the
 * row reads and dot products (load_row_at, row_dot_at, embed_one), with the format a
 * constant as Q_FIX makes it for one; Q_PICK calls AT(i) for the matrix's format i (the last unchecked:
 * every matrix has one of the n). Without it, a mix's every read divides by the run-time group size
 * and code width, and branches over every format (H200, 1.5B Q4_K_M: 355 tok/s, where a uniform Q4_K
 * file of the same shapes decodes at 843). */
#if defined(Q_NF) && !defined(Q_BITS)
#ifndef Q_B1
#define Q_B1 Q_B0
#define Q_G1 Q_G0
#define Q_D1 Q_D0
#endif
#ifndef Q_B2
#define Q_B2 Q_B1
#define Q_G2 Q_G1
#define Q_D2 Q_D1
#endif
#ifndef Q_B3
#define Q_B3 Q_B2
#define Q_G3 Q_G2
#define Q_D3 Q_D2
#endif
#define Q_IS(i, bits, gs, dt) ((bits) == Q_B##i && (gs) == Q_G##i && (dt) == Q_D##i)
#define Q_PICK(AT, bits, gs, dt)                     \
    if (Q_NF > 1 && Q_IS(0, bits, gs, dt)) return AT(0); \
    if (Q_NF > 2 && Q_IS(1, bits, gs, dt)) return AT(1); \
    if (Q_NF > 3 && Q_IS(2, bits, gs, dt)) return AT(2); \
    return AT(3)
#define Q_COPIES 1
#else
#define Q_COPIES 0
#endif

/* element i of p, of type t: 0 = f32, 1 = f16, 2 = bf16 */
inline float ld_typed(__global const uchar *p, int t, size_t i) {
    if (t == 2) return as_float((uint)((__global const ushort *)p)[i] << 16);
    if (t == 1) return vload_half(i, (__global const half *)p);
    return ((__global const float *)p)[i];
}

/* dt: 0 = f32, 1 = f16, 2 = bf16 (a dense matrix's values) */
inline float ld(__global const uchar *p, int dt, size_t i) {
#ifdef Q_DT
    dt = Q_DT;
#endif
    return ld_typed(p, dt, i);
}

/* Scale i of an affine matrix whose scales and biases are in form dt (struct cl_form in
 * engine/backend/opencl/cl_internal.h): bits 0-1 as ld's, or 3: two levels, per 8 groups a float16
 * factor then 8 int8s (10 bytes), multiplied back exactly (11 x 8 significant bits fit a float) */
inline float ld_s(__global const uchar *S, int dt, size_t i) {
#ifdef Q_DT
    dt = Q_DT;
#endif
    if ((dt & 3) == 3) {
        __global const uchar *b = S + (i >> 3) * 10;
        return vload_half(0, (__global const half *)b) * (float)((__global const char *)b)[2 + (i & 7)];
    }
    return ld_typed(S, dt & 3, i);
}

/* Bias i: B's, or where dt >> 3 is z > 0 (no biases kept: codes with a zero point) -2^z times scale i */
inline float ld_b(__global const uchar *S, __global const uchar *B, int dt, size_t i) {
#ifdef Q_DT
    dt = Q_DT;
#endif
    if (dt >> 3) return -(float)(1 << (dt >> 3)) * ld_s(S, dt, i);
    return ld_s(B, dt, i);
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

/* The max (is_max) or sum of v over the n work-items (a power of two <= 32) that share lid / n,
 * for each of them; every work-item of the group calls it (local memory and barriers, or shuffles
 * within a warp where the host enabled them); red: [get_local_size(0)] floats */
inline float lanes_reduce(float v, int n, __local float *red, int is_max) {
#if defined(SHFL_PTX)
    (void)red;
    for (int m = n / 2; m > 0; m >>= 1) {
        float o = shfl_xor(v, m);
        v = is_max ? fmax(v, o) : v + o;
    }
    return v;
#else
    int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (lid % n < s) red[lid] = is_max ? fmax(red[lid], red[lid + s]) : red[lid] + red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    v = red[lid & ~(n - 1)];
    barrier(CLK_LOCAL_MEM_FENCE);
    return v;
#endif
}

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

/* -DQ_INT8=1 (the host adds it for a model of 4- and 8-bit matrices whose CPU path also takes int8
 * activations, i.e. not --exact): the staged input is also quantized per block of 32 to two int8
 * levels, x ~ d (q1 + q2 / 128) (as accurate as float32 for practical purposes: the CPU decode path's
 * scheme), and a uint4 of 32 codes meets its block in 16 integer dot products of 4 bytes (dp4a) instead
 * of 32 int-to-float conversions, 32 local reads and 32 multiply-adds (H200: +6%; what is left of a
 * phase is mostly latency, not arithmetic). A uint4 of 8-bit codes is half a block: its bytes are put
 * in the input's order and meet it in 8 dp4a, its bias in the half's sum (XQ_HALVES, which the host sets
 * for models with 8-bit matrices, as GGUF's Q5_0, Q6_K and Q8_0 come, or 4-bit ones in groups of 16, as
 * Q3_K comes: each half of their block has its own scale and bias). */
#if defined(Q_INT8)
#if Q_INT8 && (!defined(Q_BITS) || Q_BITS == 4 || Q_BITS == 8)
#define XQ 1
#endif
#endif
#ifndef XQ
#define XQ 0
#endif
#ifndef XQ_HALVES
#if defined(Q_BITS) && Q_BITS == 8
#define XQ_HALVES 1
#else
#define XQ_HALVES 0
#endif
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
#if FUSE_FFN && XQ_FUSED && defined(SHFL_PTX) && MV_LWS % 32 == 0 && defined(Q_BITS) && Q_BITS == 4 && Q_GS >= 32 && \
    Q_DT <= 2 /* blocks_times: 4-bit codes, a plain scale and bias a block */
#define FFN_FUSED 1
#else
#define FFN_FUSED 0
#endif
#if FUSE_ATT && XQ_FUSED && defined(SHFL_PTX) && MV_LWS % 32 == 0 && ATT_LWS % 32 == 0 && defined(HEAD_DIM) && defined(Q_BITS) && Q_BITS == 4 && \
    Q_GS >= 32 && Q_DT <= 2
#if HEAD_DIM % 32 == 0 && HEAD_DIM <= 128 && HEAD_DIM <= ATT_LWS /* attention_warps runs (its output in local memory) */
#define ATT_FUSED 1
#endif
#endif
#ifndef ATT_FUSED
#define ATT_FUSED 0
#endif
#define ANY_FUSED (FFN_FUSED || ATT_FUSED)

#ifndef ROW_TAIL
/* The rest of a row past a thread's first QROW_N uint4s: 1, read QROW_N at a time (row_tail in
 * weights.cl, a call); 0, one by one. Long rests come from the fused FFN, which gives a row 8 threads
 * whatever its length (MODEL_DIM: the host's hidden size); elsewhere the host's threads a row leave at
 * most MV_TAIL. Chunked pays where that rest is none or QROW_N or more. H200 tg128, 4-bit g64, one by
 * one -> chunked: 0.5B (no rest) 1,606-1,620 -> 1,624-1,640; 1.5B (2 a thread) 815 -> 806; 3B (4)
 * 505 -> 528; 7B (10) 250 -> 277; the GGUF mixes (not fused): 1.5B 634 -> 615, 7B 191.5 -> 189.9 */
#if FFN_FUSED && defined(MODEL_DIM) && \
    ((MODEL_DIM * Q_BITS / 128 + 7) / 8 <= QROW_N || (MODEL_DIM * Q_BITS / 128 + 7) / 8 >= 2 * QROW_N)
#define ROW_TAIL 1
#else
#define ROW_TAIL 0
#endif
#endif

__kernel void tunables(__global int *out) {
    out[0] = MV_LWS, out[1] = MV_ITERS, out[2] = MV_GROUPS_PER_CU, out[3] = MV_LOCAL_X;
    out[4] = ATT_LWS, out[5] = ATT_MAX_SPLIT, out[6] = MAX_HEAD_DIM, out[7] = PERSIST_GROUPS_PER_CU;
    out[8] = QROW_N, out[9] = MV_TAIL, out[10] = FFN_FUSED, out[11] = ATT_FUSED;
}

