/* AVX-512 versions of the prefill's non-matmul hot loops (ops.h): causal attention as two small
 * register-tiled GEMMs around a vectorized softmax, and SwiGLU. libm's expf one element at a time
 * and one-query-at-a-time tiles made attention a fifth of pp512; here exp is 16 lanes at once and a
 * tile reuses each loaded key or value row for several queries.
 * Compiled for AVX-512 via target attributes and chosen at run time, so the binary runs anywhere;
 * ops.c keeps the portable versions, and tllm_attention_ref is the oracle the tests compare with. */
#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_avx512.h"
#include "kernels/cpu/ops_ref.h" /* where AVX-512 is not compiled */

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define INLINE static inline __attribute__((always_inline))

/* The tiles' loops over queries and vectors carry `#pragma GCC unroll`: without it GCC 12 at -O3 left
 * the accumulator arrays on the stack (a store and a load around every FMA), which made attention 1.8x
 * (prompts) to 2.2x (a generated token) slower than with the accumulators in registers. */
#define QK_QUERIES 8  /* queries per score tile: 8 x 2 vectors of 16 keys = 16 accumulators */
#define PV_QUERIES 8  /* queries per output tile: 8 x 32 lanes of head_dim (or 4 x 64) = 16 accumulators */
#ifndef PV_AHEAD
#define PV_AHEAD 1 /* blocks ahead that the value tiles prefetch (the score tiles prefetch the first) */
#endif
#define HD_MAX 256    /* head_dim bound of the transposed-query scratch (Qwen2: 64 or 128) */

/* e^x for 16 lanes: x = n ln2 + r with |r| <= ln2/2, e^r by its degree-7 Taylor polynomial
 * (truncation < 6e-9 relative), times 2^n by vscalefps, which gives 0 and inf at the ends.
 * Within 2 ulp of expf; NaN stays NaN (the clamps return their second operand on NaN). */
TGT INLINE __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x); /* ln2 in two parts: hi has 16 bits */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* acc + v * (*p broadcast), the broadcast embedded in the FMA's memory operand: GCC 12 loads it once
 * into a register for the FMAs that share it, and on Zen 4 that broadcast takes a vector pipe */
TGT INLINE __m512 fmadd_bcast(__m512 v, const float *p, __m512 acc) {
    __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*p));
    return acc;
}

static inline __mmask16 tail_mask(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* exp(s - max) over [0, n) in place, zeros over [n, n_zero); returns 1 / sum. */
TGT static float softmax_row(float *s, int n, int n_zero) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int p = 0; p < n; p += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, tail_mask(n - p), s + p));
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), sum = _mm512_setzero_ps();
    for (int p = 0; p < n; p += 16) {
        __mmask16 k = tail_mask(n - p);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + p), m));
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
        _mm512_mask_storeu_ps(s + p, k, e);
    }
    for (int p = n; p < n_zero; p++) s[p] = 0.0f;
    return 1.0f / _mm512_reduce_add_ps(sum);
}

/* Attention reads the KV cache's blocks in place (no float copy): 16 positions a block, keys
 * [head_dim][16] and values [16][head_dim] per KV head, f16 (widened as they are loaded) or float32.
 * The queries are a GQA group's: every query head of one KV head, for nq tokens, so each key and value
 * vector loaded serves all of them (a generated token's 7 heads in Qwen2.5-0.5B fill one tile). Each
 * query's sums run in one order whatever tile it shares, so its result does not depend on the other
 * queries (tests/test_ops.c: a group = its heads one at a time, bit for bit). */
#define KV_BLOCK 16

/* 16 keys or values from a block (m: lanes to read; the rest 0), widened from f16 if F16 */
TGT INLINE __m512 kv_load(const void *base, size_t off, __mmask16 m, const int F16) {
    if (F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)base + off));
    return _mm512_maskz_loadu_ps(m, (const float *)base + off);
}

/* Scores of NQ queries (qs: head_dim x QK_QUERIES, transposed and pre-scaled) against keys [p0, p0 + 16 NV)
 * of blocks kb (the last vector masked by m), stored to s (rows L apart) for the first nj queries */
TGT INLINE void qkb_tile(const float *qs, const void *const *kb, int p0, int hd, float *s, int L, int nj, const int NQ,
                         const int NV, __mmask16 m, const char *const *pf, const int F16) {
    __m512 acc[QK_QUERIES][4];
    #pragma GCC unroll 8
    for (int j = 0; j < QK_QUERIES; j++) /* all of them: GCC 12 cannot see that the stores stay within NQ x NV */
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++) acc[j][c] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i++) {
        __m512 kv[4];
        #pragma GCC unroll 4
        for (int c = 0; c < NV; c++) {
            kv[c] = kv_load(kb[p0 / KV_BLOCK + c], (size_t)i * KV_BLOCK, c == NV - 1 ? m : (__mmask16)0xffff, F16);
            if (pf[c]) _mm_prefetch(pf[c] + (size_t)i * KV_BLOCK * (F16 ? 2 : 4), _MM_HINT_T0);
        }
        #pragma GCC unroll 8
        for (int j = 0; j < NQ; j++)
            #pragma GCC unroll 4
            for (int c = 0; c < NV; c++) acc[j][c] = fmadd_bcast(kv[c], qs + i * QK_QUERIES + j, acc[j][c]);
    }
    #pragma GCC unroll 8
    for (int j = 0; j < NQ && j < nj; j++)
        #pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            _mm512_mask_storeu_ps(s + (size_t)j * L + p0 + 16 * c, c == NV - 1 ? m : (__mmask16)0xffff, acc[j][c]);
}

/* Block i of the keys, then of the values (i - nb), for prefetching a tile ahead: the cache's blocks are
 * scattered over the pool, so the hardware's stream prefetcher finds each one only after its first
 * misses (a cold cache's keys and values made attention 2.2x slower than a hot one's, VM) */
static inline const char *next_block(const void *const *kb, const void *const *vb, int i, int nb) {
    return i < nb ? (const char *)kb[i] : i < 2 * nb ? (const char *)vb[i - nb] : NULL;
}

TGT INLINE void qkb_block(const float *qs, const void *const *kb, const void *const *vb, int hd, float *s, int L, int nj,
                          int len, const int NQ, const int F16) {
    const int NV = NQ == 1 ? 4 : 2; /* one query: more keys per tile, for independent FMA chains */
    const int nb = (len + KV_BLOCK - 1) / KV_BLOCK;
    int p0 = 0;
    for (; p0 + 16 * NV <= len; p0 += 16 * NV) {
        const char *pf[4];
        #pragma GCC unroll 4
        for (int c = 0; c < NV; c++) pf[c] = next_block(kb, vb, p0 / KV_BLOCK + NV + c, nb);
        qkb_tile(qs, kb, p0, hd, s, L, nj, NQ, NV, 0xffff, pf, F16);
    }
    for (; p0 < len; p0 += 16) {
        const char *pf[1] = {next_block(kb, vb, p0 / KV_BLOCK + 1, nb)};
        qkb_tile(qs, kb, p0, hd, s, L, nj, NQ, 1, tail_mask(len - p0), pf, F16);
    }
}

/* Output lanes [i0, i0 + 16 NV) of NQ queries = sum_p s[j][p] v_p over p < len, times inv[j], into
 * each query's own row (outs) */
TGT INLINE void pvb_tile(const float *s, int L, const void *const *vb, int i0, int hd, int len, const float *inv,
                         float *const *outs, int nj, const int NQ, const int NV, const int F16) {
    __m512 acc[PV_QUERIES][4];
    #pragma GCC unroll 8
    for (int j = 0; j < PV_QUERIES; j++) /* all of them, as in qkb_tile */
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++) acc[j][c] = _mm512_setzero_ps();
    const int nb = (len + KV_BLOCK - 1) / KV_BLOCK;
    for (int p = 0; p < len; p++) {
        const void *blk = vb[p / KV_BLOCK];
        const size_t row = (size_t)(p % KV_BLOCK) * (size_t)hd + (size_t)i0;
        if (p / KV_BLOCK + PV_AHEAD < nb) { /* the same row PV_AHEAD blocks on (a row is 16 NV lanes) */
            for (int c = 0; c < (NV * 16 * (F16 ? 2 : 4) + 63) / 64; c++)
                _mm_prefetch((const char *)vb[p / KV_BLOCK + PV_AHEAD] + (row * (F16 ? 2 : 4)) + 64 * c, _MM_HINT_T0);
        }
        __m512 vv[4];
        #pragma GCC unroll 4
        for (int c = 0; c < NV; c++) vv[c] = kv_load(blk, row + 16 * (size_t)c, 0xffff, F16);
        #pragma GCC unroll 8
        for (int j = 0; j < NQ; j++)
            #pragma GCC unroll 4
            for (int c = 0; c < NV; c++) acc[j][c] = fmadd_bcast(vv[c], s + (size_t)(j < nj ? j : 0) * L + p, acc[j][c]);
    }
    #pragma GCC unroll 8
    for (int j = 0; j < NQ && j < nj; j++)
        #pragma GCC unroll 4
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(outs[j] + i0 + 16 * c, _mm512_mul_ps(acc[j][c], _mm512_set1_ps(inv[j])));
}

TGT INLINE void pvb_block(const float *s, int L, const void *const *vb, int hd, int len, const float *inv, float *const *outs,
                          int nj, const int NQ, const int F16) {
    const int NV = NQ <= 4 ? 4 : 2; /* 16 accumulators */
    int i0 = 0;
    for (; i0 + 16 * NV <= hd; i0 += 16 * NV) pvb_tile(s, L, vb, i0, hd, len, inv, outs, nj, NQ, NV, F16);
    for (; i0 < hd; i0 += 16) pvb_tile(s, L, vb, i0, hd, len, inv, outs, nj, NQ, 1, F16);
}

/* Scores, softmax and output of nj (<= NQ) queries u0.. of the group: one score pass over the keys and
 * one pass over the values for all of them (they read the values up to the last one's position; the
 * scores beyond each query's own are 0) */
TGT INLINE void group_tiles(const float *qs, const void *const *kb, const void *const *vb, int hd, float *scores, int L,
                            int nj, int len, int pos0, int u0, int group, float *inv, float *const *op, const int NQ,
                            const int F16) {
    qkb_block(qs, kb, vb, hd, scores, L, nj, len, NQ, F16);
    for (int j = 0; j < nj; j++) inv[j] = softmax_row(scores + (size_t)j * L, pos0 + (u0 + j) / group + 1, len);
    pvb_block(scores, L, vb, hd, len, inv, op, nj, NQ, F16);
}

TGT INLINE void attention_blocks(const float *q, size_t q_stride, int nq, int group, int pos0, const void *const *kb,
                                 const void *const *vb, int hd, float *scores, float *out, size_t out_stride, const int F16) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int nqh = nq * group; /* queries, token-major: query u is token u / group's head u % group */
    float qs[HD_MAX * QK_QUERIES] __attribute__((aligned(64))), inv[QK_QUERIES];
    for (int u0 = 0; u0 < nqh; u0 += QK_QUERIES) {
        const int nj = nqh - u0 < QK_QUERIES ? nqh - u0 : QK_QUERIES, len = pos0 + (u0 + nj - 1) / group + 1, L = len;
        const float *qp[QK_QUERIES];
        float *op[QK_QUERIES];
        for (int j = 0; j < QK_QUERIES; j++) {
            int u = u0 + (j < nj ? j : 0);
            qp[j] = q + (size_t)(u / group) * q_stride + (size_t)(u % group) * hd;
            op[j] = out + (size_t)(u / group) * out_stride + (size_t)(u % group) * hd;
        }
        for (int i = 0; i < hd; i++)
            for (int j = 0; j < QK_QUERIES; j++) qs[i * QK_QUERIES + j] = j < nj ? qp[j][i] * scale : 0.0f;
        /* tiles of exactly nj queries from 5 on: a generated token's group of 7 (Qwen2.5-0.5B, 7B) in a tile of 8
         * spent an eighth of its FMAs on a query that is not there */
        switch (nj) {
        case 1: group_tiles(qs, kb, vb, hd, scores, L, nj, len, pos0, u0, group, inv, op, 1, F16); break;
        case 2: case 3: case 4: group_tiles(qs, kb, vb, hd, scores, L, nj, len, pos0, u0, group, inv, op, 4, F16); break;
        case 5: group_tiles(qs, kb, vb, hd, scores, L, nj, len, pos0, u0, group, inv, op, 5, F16); break;
        case 6: group_tiles(qs, kb, vb, hd, scores, L, nj, len, pos0, u0, group, inv, op, 6, F16); break;
        case 7: group_tiles(qs, kb, vb, hd, scores, L, nj, len, pos0, u0, group, inv, op, 7, F16); break;
        default: group_tiles(qs, kb, vb, hd, scores, L, nj, len, pos0, u0, group, inv, op, 8, F16); break;
        }
    }
}

TGT void tllm_attention_blocks_avx512(const float *q, size_t q_stride, int nq, int group, int pos0, const void *const *kb,
                                      const void *const *vb, int f16, int hd, float *scores, float *out, size_t out_stride) {
    if (f16) attention_blocks(q, q_stride, nq, group, pos0, kb, vb, hd, scores, out, out_stride, 1);
    else attention_blocks(q, q_stride, nq, group, pos0, kb, vb, hd, scores, out, out_stride, 0);
}

TGT void tllm_swiglu_avx512(float *gate, const float *up, int n) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        __m512 g = _mm512_maskz_loadu_ps(k, gate + i), u = _mm512_maskz_loadu_ps(k, up + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 y = _mm512_div_ps(_mm512_mul_ps(g, u), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(gate + i, k, y);
    }
}

TGT void tllm_exp_avx512(float *x, int n) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

/* Each lane keeps the first maximum of its elements (strictly greater replaces, so NaN never does);
 * then the largest of the lanes' maxima, and of the lanes that hold it, the lowest index: the scalar
 * loop's answer. */
TGT int tllm_argmax_avx512(const float *x, int n) {
    __m512 mx = _mm512_set1_ps(x[0]);
    __m512i idx = _mm512_setzero_si512(), cur = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (int i = 0; i < n; i += 16, cur = _mm512_add_epi32(cur, step)) {
        __mmask16 k = tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __mmask16 gt = _mm512_mask_cmp_ps_mask(k, v, mx, _CMP_GT_OQ);
        mx = _mm512_mask_mov_ps(mx, gt, v);
        idx = _mm512_mask_mov_epi32(idx, gt, cur);
    }
    float best = _mm512_reduce_max_ps(mx);
    __mmask16 at = _mm512_cmp_ps_mask(mx, _mm512_set1_ps(best), _CMP_EQ_OQ);
    if (!at) return 0; /* every element NaN */
    return _mm512_mask_reduce_min_epi32(at, idx);
}

/* tllm_argmax_avx512 over the ids whose bit is set (16 lanes a half word, halves with none skipped).
 * Where no allowed id beats -inf (all -inf or NaN), the scalar loop's answer: its first allowed -inf,
 * or -1. A grammar's masked greedy rows on the CPU: 151,936 ids in cache, Zen 4: 19.6 us, the scalar
 * loop 52, tllm_argmax_avx512 20. */
TGT int tllm_argmax_allowed_avx512(const float *x, int n, const uint32_t *allow) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __m512i idx = _mm512_set1_epi32(-1), cur = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (int i = 0; i < n; i += 16, cur = _mm512_add_epi32(cur, step)) {
        __mmask16 k = (__mmask16)(allow[i >> 5] >> (i & 16)) & tail_mask(n - i);
        if (!k) continue;
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __mmask16 gt = _mm512_mask_cmp_ps_mask(k, v, mx, _CMP_GT_OQ);
        mx = _mm512_mask_mov_ps(mx, gt, v);
        idx = _mm512_mask_mov_epi32(idx, gt, cur);
    }
    __mmask16 set = _mm512_cmpge_epi32_mask(idx, _mm512_setzero_si512());
    if (!set) return tllm_argmax_allowed_ref(x, n, allow);
    float best = _mm512_mask_reduce_max_ps(set, mx);
    __mmask16 at = _mm512_mask_cmp_ps_mask(set, mx, _mm512_set1_ps(best), _CMP_EQ_OQ);
    return _mm512_mask_reduce_min_epi32(at, idx);
}

TGT void tllm_f32_to_f16_row_avx512(const float *src, uint16_t *dst, int n) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(k, src + i);
        __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        /* a NaN keeps its payload's top bits in hardware; the scalar conversion makes it 0x7e00 */
        __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        __m256i canon = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16((short)0x8000)), _mm256_set1_epi16(0x7e00));
        _mm256_mask_storeu_epi16(dst + i, k, _mm256_mask_mov_epi16(h, nan, canon));
    }
}

TGT void tllm_f16_to_f32_row_avx512(const uint16_t *src, float *dst, int n) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
}

int tllm_attention_avx512_ok(int head_dim) { return tllm_cpu_has_avx512() && head_dim % 16 == 0 && head_dim <= HD_MAX; }
#else
int tllm_attention_avx512_ok(int head_dim) { return (void)head_dim, 0; }
void tllm_attention_blocks_avx512(const float *q, size_t q_stride, int nq, int group, int pos0, const void *const *kb,
                                  const void *const *vb, int f16, int hd, float *scores, float *out, size_t out_stride) {
    (void)q, (void)q_stride, (void)nq, (void)group, (void)pos0, (void)kb, (void)vb, (void)f16, (void)hd, (void)scores, (void)out,
        (void)out_stride; /* never called: tllm_attention_avx512_ok is 0 */
}
void tllm_swiglu_avx512(float *gate, const float *up, int n) { tllm_swiglu_ref(gate, up, n); }
void tllm_exp_avx512(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = expf(x[i]);
}
void tllm_f16_to_f32_row_avx512(const uint16_t *src, float *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = tllm_f16_to_f32(src[i]);
}
void tllm_f32_to_f16_row_avx512(const float *src, uint16_t *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = tllm_f32_to_f16(src[i]);
}
int tllm_argmax_avx512(const float *x, int n) { return tllm_argmax_ref(x, n); }
int tllm_argmax_allowed_avx512(const float *x, int n, const uint32_t *allow) { return tllm_argmax_allowed_ref(x, n, allow); }
#endif
