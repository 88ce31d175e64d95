/* Steps of many sequences at once (engine/backend/opencl/cl_paged.c): each token of a step has its own
 * sequence and position, and K/V live in a pool of blocks the sequences share, laid out as the host's
 * cache (engine/run/kv_cache.h): per layer and block, per KV head, keys transposed [head_dim][KV_BLOCK]
 * and values [KV_BLOCK][head_dim], as half (kv_half) or float. A step's small tables come in one int
 * buffer, `meta`: ids, positions, slots (block x KV_BLOCK + position % KV_BLOCK), the attention runs
 * (flash_prefill in kernels/opencl/prefill.cl), the block tables, the rows whose logits are wanted. */

#define KV_BLOCK 16 /* positions a block holds: TLLM_KV_BLOCK */

/* The first element of KV head g's keys (or values) in block b of a layer */
inline size_t kv_block(int layer, int b, int n_blocks, int g, int n_kv, int hd) {
    return (((size_t)layer * n_blocks + b) * n_kv + g) * (size_t)hd * KV_BLOCK;
}

inline float kv_get(__global const float *p, size_t i, int kv_half) {
    return kv_half ? vload_half(i, (__global const half *)p) : p[i];
}

inline void kv_put(__global float *p, size_t i, float v, int kv_half) {
    if (kv_half) vstore_half(v, i, (__global half *)p); /* round to nearest even, as tllm_f32_to_f16 */
    else p[i] = v;
}

/* paged_rope's work on RoPE pair (or pair of values) u of token t, a (its two elements of qkv): RoPE on q
 * (into q) and k at the token's position (meta[pos_off + t]), then k and v into the pool at its slot
 * (meta[slot_off + t]); the rotation pf_rope's and decode's (rope_store). Also gemm_few_rope's epilogue
 * (kernels/opencl/gemm_few_rope.cl): one function, the same bits. */
inline void paged_rope_pair(float2 a, int u, int t, int n_heads, int n_kv, int hd, __global const int *meta, int pos_off,
                            int slot_off, __global const float *inv_freq, int layer, int n_blocks, int kv_half,
                            __global float *q, __global float *kp, __global float *vp) {
    int half_d = hd / 2, i = u % half_d, q_dim = n_heads * hd, pos = meta[pos_off + t], slot = meta[slot_off + t];
    QKV_PICK(which, r, u / half_d, i);
    float angle = (float)pos * inv_freq[i], c = cos(angle), s = sin(angle), x0 = a.x, x1 = a.y;
    if (which == 0) {
        q[(size_t)t * q_dim + r] = x0 * c - x1 * s;
        q[(size_t)t * q_dim + r + half_d] = x1 * c + x0 * s;
        return;
    }
    size_t base = kv_block(layer, slot / KV_BLOCK, n_blocks, r / hd, n_kv, hd);
    int o = slot % KV_BLOCK;
    if (which == 1) {
        kv_put(kp, base + (size_t)i * KV_BLOCK + o, x0 * c - x1 * s, kv_half);
        kv_put(kp, base + (size_t)(i + half_d) * KV_BLOCK + o, x1 * c + x0 * s, kv_half);
    } else {
        kv_put(vp, base + (size_t)o * hd + i, x0, kv_half);
        kv_put(vp, base + (size_t)o * hd + i + half_d, x1, kv_half);
    }
}

/* The arguments of paged_rope_pair after a and u, t (gemm_few_rope's too) */
#define PAGED_ROPE_ARGS                                                                                          \
    int n_heads, int n_kv, int hd, __global const int *meta, int pos_off, int slot_off, __global const float *inv_freq, \
        int layer, int n_blocks, int kv_half, __global float *q, __global float *kp, __global float *vp
#define PAGED_ROPE_PASS n_heads, n_kv, hd, meta, pos_off, slot_off, inv_freq, layer, n_blocks, kv_half, q, kp, vp

/* qkv (QKV_IN_ARGS: kernels/opencl/prefill.cl) through paged_rope_pair, one work-item per RoPE pair (or
 * pair of values) */
__kernel void paged_rope(QKV_IN_ARGS, PAGED_ROPE_ARGS) {
    int u = get_global_id(0), t = get_global_id(1), half_d = hd / 2;
    if (u >= (n_heads + 2 * n_kv) * half_d) return;
    int i = u % half_d, ld = (n_heads + 2 * n_kv) * hd;
    paged_rope_pair(QKV_PAIR(t, (u / half_d) * hd + i, half_d, ld), u, t, PAGED_ROPE_PASS);
}

#ifndef ARGMAX_UNROLL
#define ARGMAX_UNROLL 4 /* float4s a thread reads before it compares any. One float at a time (a memory
                         * latency each, a work-group a row: too few to hide it), H200, 64 rows of 151,936:
                         * lm_head + argmax 0.25 ms a step, with grammar masks 0.49; so, 0.22 and 0.23 */
#endif

/* value x of id j competes with the best so far where its bit (of the low nibble of w) allows it */
#define ARGMAX_TRY(x, j, w, k)                                       \
    if (((w) >> (k)) & 1u) {                                         \
        float2 v_ = (float2)((x), as_float((j) + (k)));              \
        if (beats(v_, b)) b = v_;                                    \
    }

/* This thread's best (value, id) of row[0, n_cand) among the ids bits allows (every id where !masked):
 * float4s lid, lid + MV_LWS, ... ARGMAX_UNROLL at a time, the last n_cand % 4 ids one each. The
 * result (the largest, the first on ties, never NaN) is the same in any order of comparisons. */
inline float2 row_best(__global const float *row, int n_cand, __global const uint *bits, int masked) {
    float2 b = (float2)(-INFINITY, as_float(0x7fffffff));
    int n4 = n_cand / 4, lid = get_local_id(0);
    for (int j0 = lid; j0 < n4; j0 += ARGMAX_UNROLL * MV_LWS) {
        float4 x[ARGMAX_UNROLL];
        uint w[ARGMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; u++) {
            int j = j0 + u * MV_LWS;
            x[u] = j < n4 ? vload4(j, row) : (float4)(0.0f);
            w[u] = j >= n4 ? 0u : masked ? bits[j >> 3] >> ((j & 7) * 4) : 15u; /* ids 4j .. 4j + 3 */
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; u++) {
            int j = 4 * (j0 + u * MV_LWS);
            ARGMAX_TRY(x[u].s0, j, w[u], 0)
            ARGMAX_TRY(x[u].s1, j, w[u], 1)
            ARGMAX_TRY(x[u].s2, j, w[u], 2)
            ARGMAX_TRY(x[u].s3, j, w[u], 3)
        }
    }
    for (int j = 4 * n4 + lid; j < n_cand; j += MV_LWS) {
        uint w = !masked || (bits[j >> 5] >> (j & 31) & 1u);
        ARGMAX_TRY(row[j], j, w, 0)
    }
    return b;
}
#undef ARGMAX_TRY

/* out[out_off + t] = the column of the largest of the first n_cand of row t of logits ([n][ld]), the
 * first on ties (as tllm_argmax); INT_MAX when the row has only NaNs. One work-group of MV_LWS a row. */
__kernel __attribute__((reqd_work_group_size(MV_LWS, 1, 1))) void
rows_argmax(__global const float *logits, int ld, int n_cand, __global int *out, int out_off) {
    __local float2 red[MV_LWS];
    int t = get_group_id(1);
    float2 b = wg_best(row_best(logits + (size_t)t * ld, n_cand, (__global const uint *)logits, 0), red);
    if (get_local_id(0) == 0) out[out_off + t] = as_int(b.y);
}

/* rows_argmax over the ids a grammar allows: row t's bitset is allow + mask[out_off + t] * words (bit j
 * of word j / 32 set: id j may come), or none (every id) where that is < 0. INT_MAX when no id is
 * allowed. */
__kernel __attribute__((reqd_work_group_size(MV_LWS, 1, 1))) void
rows_argmax_allowed(__global const float *logits, int ld, int n_cand, __global int *out, int out_off, __global const uint *allow,
                    __global const int *mask, int words) {
    __local float2 red[MV_LWS];
    int t = get_group_id(1), m = mask[out_off + t];
    __global const uint *bits = allow + (size_t)(m < 0 ? 0 : m) * words;
    float2 b = wg_best(row_best(logits + (size_t)t * ld, n_cand, bits, m >= 0), red);
    if (get_local_id(0) == 0) out[out_off + t] = as_int(b.y);
}
