/* Many tokens on the device: the row-wise steps between the GEMMs (kernels/opencl/gemm.cl) for a step's
 * n_tok tokens (a chunk of one sequence at positions pos0 .. pos0 + n_tok - 1, or tokens of many
 * sequences: kernels/opencl/paged.cl), activations [n_tok][width] row-major.
 * engine/backend/opencl/cl_prefill.c runs a layer as
 *   pf_norm (attn_norm) -> gemm q, k, v (one launch) -> pf_rope or paged_rope (K and V into the cache)
 *   -> flash_prefill -> flash_combine (rows split into spans joined; every row as o_proj's input, quantized:
 *   FL_EMIT, else pf_norm with no weight does that) -> gemm o_proj (+= x) ->
 *   pf_norm (ffn_norm) -> gemm gate, up (one launch) -> pf_swiglu -> gemm down_proj (+= x)
 * where a GEMM splits K, the kernel after it sums the slices (gemm_in), the norms adding o_proj's and
 * down_proj's to the residual.
 * A GEMM's input is either float rows (xf) or int8 blocks of 32 (xq, with the block's scale xd and
 * sum xs) in one level, d = max|x| / 127, as the CPU quantizes prompt tokens, or in two (emit_lane). */

#ifndef PF_LWS
#define PF_LWS 256 /* work-group of the row-wise kernels: one a token */
#endif
#define FL_LWS 256 /* flash_prefill's work-group: 16 x 16 work-items */
#ifndef FL_QB
#define FL_QB 32 /* queries of a flash_prefill work-group (a multiple of 16; H100, Qwen2.5-0.5B: 32 gave pp2048
                  * 38.9-39.1k tok/s, 64 gave 37.1k) */
#endif
#ifndef FL_KB
#define FL_KB 64 /* keys it stages at a time (a multiple of 16; H100: 64 gave pp2048 41.2-41.5k, 32 39.4-39.5k) */
#endif
#ifndef FL_SPAN
#define FL_SPAN 64 /* positions of a span (a multiple of FL_KB): steps of many sequences split each row's
                    * keys into spans from position 0, one work-group a span (flash_combine joins them) */
#endif

#ifndef FL_EMIT
#define FL_EMIT 1 /* flash_combine leaves the attention output as o_proj's input (quantized where the GEMMs
                   * take int8), saving pf_norm's launch a layer */
#endif
#if !defined(HEAD_DIM) || HEAD_DIM % 32
#undef FL_EMIT
#define FL_EMIT 0 /* a block of 32 would span two heads */
#endif
#define FL_COMBINE_LWS 64 /* flash_combine's work-group: two blocks of 32 of one token's row (emit_lane's) */

__kernel void prefill_tunables(__global int *out) {
    out[0] = GEMM_TM, out[1] = GEMM_TN, out[2] = GEMM_T, out[3] = PF_LWS, out[4] = FL_QB, out[5] = FL_LWS;
#if defined(MMA_PTX) || defined(MMA_EMU)
    out[6] = MMA_TM, out[7] = MMA_TN, out[8] = MMA_LWS; /* gemm_q8_mma's */
#else
    out[6] = out[7] = out[8] = 0;
#endif
    out[9] = FEW_TN; /* gemm_few's largest step */
    out[10] = FL_SPAN, out[11] = FEW_LWS, out[12] = FL_EMIT, out[13] = FEW_U;
#if defined(MMA_PTX) || defined(MMA_EMU)
    out[14] = 1; /* gemm_q8_mma_t16* and _t32* (tiles of 16 and 32 tokens) */
#else
    out[14] = 0;
#endif
}

/* Where pf_norm, pf_swiglu and flash_combine leave a GEMM's input: one buffer (io) at byte offsets,
 * floats (xf) or int8 codes (xq) at one, block scales, block sums and half-block sums at the others (one
 * buffer argument, not five: see WOFF in weights.cl); MM_OUT_OPEN makes the pointers */
#define MM_OUT_ARGS int int8, __global uchar *io, ulong x_o, ulong xd_o, ulong xs_o, int g16, ulong xh_o
#define MM_OUT_OPEN                                                                                         \
    __global float *xf = (__global float *)(io + x_o), *xd = (__global float *)(io + xd_o);                 \
    __global float *xs = (__global float *)(io + xs_o), *xh = (__global float *)(io + xh_o);                \
    __global char *xq = (__global char *)(io + x_o)

/* Element j of token t (the work-item's), v, as a GEMM's input: a float (int8 0), or quantized with the 31
 * work-items beside it (its block of 32) in int8 levels of one or two (int8 1 or 2; the host's choice,
 * uniform). Level one is q = rint(v / d), d = max|x| / 127; level two q2 = rint((v - q d) 128 / d)
 * (|q2| <= 64), so v ~ (d / 128) (128 q + q2), as decode's matvecs quantize (quant8). Token t's row of
 * xq is its cols codes of level one, then (two levels) its cols of level two; xs = d (sum q + sum q2 / 128),
 * and with g16 (some weights have groups of 16) xh the same per half block. live: j < cols (a block
 * is all live or not); every work-item of the group calls it. */
inline void emit_lane(float v, int t, int j, int cols, int live, int int8, __global float *xf, __global char *xq,
                      __global float *xd, __global float *xs, int g16, __global float *xh, __local float *red) {
    if (!int8) {
        if (live) xf[(size_t)t * cols + j] = v;
        return;
    }
    float amax = lanes_reduce(fabs(v), 32, red, 1);
    float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f, q = rint(v * id);
    float sum = lanes_reduce(q, 32, red, 0); /* exact: integers below 2^12 */
    float hs = g16 ? lanes_reduce(q, 16, red, 0) : 0.0f;
    float q2 = int8 == 2 ? clamp(rint(fma(-q, d, v) * id * 128.0f), -127.0f, 127.0f) : 0.0f; /* fma: the same bits unfused or not */
    if (int8 == 2) sum += lanes_reduce(q2, 32, red, 0) / 128.0f; /* exact: units of 1/128 below 2^19 */
    if (int8 == 2 && g16) hs += lanes_reduce(q2, 16, red, 0) / 128.0f;
    if (!live) return;
    __global char *row = xq + (size_t)t * int8 * cols;
    row[j] = (char)(int)q;
    if (int8 == 2) row[cols + j] = (char)(int)q2;
    if (j % 32 == 0) xd[(size_t)t * (cols / 32) + j / 32] = d, xs[(size_t)t * (cols / 32) + j / 32] = d * sum;
    if (g16 && j % 16 == 0) xh[(size_t)t * (cols / 16) + j / 16] = d * hs;
}

__kernel void pf_embed(WARGS(0), int cols, __global const int *ids, int n_tok, int vocab, __global float *x) {
    int j = get_global_id(0), t = get_global_id(1);
    if (j < cols && t < n_tok) x[(size_t)t * cols + j] = embed_one(WPASS(0), cols, clamp(ids[t], 0, vocab - 1), j);
}

/* pf_norm's work on token t's row of x (row: that row; t counts the slices' rows): n_split > 1: the GEMM
 * that adds into x left its sums in slices, added to the row first (gemm_reduce's arithmetic) and the
 * row written back; then RMS-normalized with weight vecs[norm_off ..] (norm_off < 0: as it is), as row
 * t of a GEMM's input (cols % 32 == 0). Every work-item of the group calls it, the first PF_LWS doing the
 * work (gemm_few_norm's group may be larger: the same arithmetic); red: [get_local_size(0)] floats.
 * norm_row_l2 reads row and part past L1 (volatile): in gemm_few_norm other work-groups of the launch
 * wrote them. */
#define NORM_ROW_FN(name, Q, slices)                                                                       \
    inline void name(Q __global float *row, Q __global const float *part, int n_split, int n_tok, int t, int cols, \
                     __global const float *vecs, int norm_off, float eps, int int8, __global float *xf,        \
                     __global char *xq, __global float *xd, __global float *xs, int g16, __global float *xh,   \
                     __local float *red) {                                                                 \
        int lid = get_local_id(0), active = lid < PF_LWS;                                                  \
        for (int j = lid; active && n_split > 1 && j < cols; j += PF_LWS)                                  \
            row[j] += slices(part, n_split, n_tok, cols, t, j);                                            \
        float inv = 1.0f;                                                                                  \
        if (norm_off >= 0) {                                                                               \
            float ss = 0.0f;                                                                               \
            for (int j = lid; active && j < cols; j += PF_LWS) ss += row[j] * row[j];                      \
            inv = 1.0f / sqrt(wg_sum(ss, red, PF_LWS) / (float)cols + eps); /* as the CPU's tllm_rmsnorm */ \
        }                                                                                                  \
        for (int j0 = 0; j0 < cols; j0 += PF_LWS) {                                                        \
            int j = j0 + lid, live = active && j < cols;                                                   \
            float v = live ? (norm_off >= 0 ? vecs[norm_off + j] * (row[j] * inv) : row[j]) : 0.0f;        \
            emit_lane(v, t, j, cols, live, int8, xf, xq, xd, xs, g16, xh, red);                            \
        }                                                                                                  \
    }
NORM_ROW_FN(norm_row, , gemm_slices)
NORM_ROW_FN(norm_row_l2, volatile, gemm_slices_l2)

/* Row t_off + t of x (t: the work-group; rows_off >= 0: row meta[rows_off + t]) through norm_row */
__kernel __attribute__((reqd_work_group_size(PF_LWS, 1, 1))) void
pf_norm(__global float *x, int t_off, __global const int *meta, int rows_off, int cols, __global const float *vecs,
        int norm_off, float eps, __global const float *part, int n_split, int n_tok, MM_OUT_ARGS) {
    __local float red[PF_LWS];
    MM_OUT_OPEN;
    int t = get_group_id(0);
    __global float *row = x + (size_t)(rows_off >= 0 ? meta[rows_off + t] : t_off + t) * cols;
    norm_row(row, part, n_split, n_tok, t, cols, vecs, norm_off, eps, int8, xf, xq, xd, xs, g16, xh, red);
}

/* h = [gate | up] ([n_tok][2 ffn], or its slices: gemm_in): silu(gate) * up as down_proj's input; one
 * work-item an element */
__kernel __attribute__((reqd_work_group_size(PF_LWS, 1, 1))) void
pf_swiglu(__global const float *h, int ffn, __global const float *part, int n_split, int n_tok, MM_OUT_ARGS) {
    __local float red[PF_LWS];
    MM_OUT_OPEN;
    int j = get_global_id(0), t = get_global_id(1), live = j < ffn;
    float g = live ? gemm_in(h, part, n_split, n_tok, 2 * ffn, t, j) : 0.0f;
    float u = live ? gemm_in(h, part, n_split, n_tok, 2 * ffn, t, ffn + j) : 0.0f;
    float v = live ? g / (1.0f + exp(-g)) * u : 0.0f;
    emit_lane(v, t, j, ffn, live, int8, xf, xq, xd, xs, g16, xh, red);
}

/* RoPE on q (into q) and k, then k and v into the layer's cache at their positions, as decode's qkv
 * stores them (rope_store). One work-item per RoPE pair (or pair of values). */
__kernel void pf_rope(QKV_IN_ARGS, int n_heads, int n_kv, int hd, int pos0, __global const float *inv_freq, int layer,
                      int ctx_stride, __global float *q, __global float *kt, __global float *vc) {
    int u = get_global_id(0), t = get_global_id(1), half_d = hd / 2;
    if (u >= (n_heads + 2 * n_kv) * half_d) return;
    int i = u % half_d, q_dim = n_heads * hd, kv_dim = n_kv * hd, pos = pos0 + t;
    QKV_PICK(which, r, u / half_d, i);
    float angle = (float)pos * inv_freq[i];
    size_t base = (size_t)layer * kv_dim * ctx_stride;
    rope_store(QKV_PAIR(t, (u / half_d) * hd + i, half_d, q_dim + 2 * kv_dim), (float4)(0.0f, 0.0f, cos(angle), sin(angle)),
               which, r, pos, n_kv, hd, ctx_stride, q + (size_t)t * q_dim, kt + base, vc + base);
}

#ifdef HEAD_DIM
#define FL_QA (FL_QB / 16)    /* query rows a work-item scores and sums for */
#define FL_KA (FL_KB / 16)    /* keys of a staged tile it scores */
#define FL_DA (HEAD_DIM / 16) /* output elements of each of its rows */
#if FL_QB % 16 || FL_KB % 16 || HEAD_DIM % 16
#error "flash_prefill: FL_QB, FL_KB and HEAD_DIM must be multiples of 16"
#endif
#if FL_SPAN % FL_KB
#error "flash_prefill: FL_SPAN must be a multiple of FL_KB"
#endif
#ifndef FL_ROW_SKIP
#define FL_ROW_SKIP 1 /* a group whose rows fit in the first 16 (a decode token's heads) skips the others' work */
#endif

/* A staged tile's scores: work-item (qi, ki)'s rows qi + 16 a (a < NA) against keys ki + 16 b */
#define FL_SCORES(NA)                                                                                    \
    for (int d = 0; d < HEAD_DIM; d++) {                                                                 \
        float qv[FL_QA], kv[FL_KA];                                                                      \
        for (int a = 0; a < (NA); a++) qv[a] = Qs[qi + 16 * a][d];                                       \
        for (int b = 0; b < FL_KA; b++) kv[b] = KV[ki + 16 * b][d];                                      \
        for (int a = 0; a < (NA); a++)                                                                   \
            for (int b = 0; b < FL_KA; b++) sc[a][b] = fma(qv[a], kv[b], sc[a][b]);                     \
    }
/* ... and the staged values weighted into the rows' outputs ki + 16 c */
#define FL_WEIGHTED(NA)                                                                                  \
    for (int k = 0; k < FL_KB; k++) {                                                                    \
        float pv[FL_QA], vv[FL_DA];                                                                      \
        for (int a = 0; a < (NA); a++) pv[a] = P[qi + 16 * a][k];                                        \
        for (int c = 0; c < FL_DA; c++) vv[c] = KV[k][ki + 16 * c];                                      \
        for (int a = 0; a < (NA); a++)                                                                   \
            for (int c = 0; c < FL_DA; c++) acc[a][c] = fma(pv[a], vv[c], acc[a][c]);                    \
    }

/* Element d of the key (or value) at position p of KV head g in a layer's cache: the one sequence's
 * (paged == 0: keys [kv_dim][ctx_stride] transposed, values [ctx_stride][kv_dim], float) or, paged, a
 * sequence's of the block pool (tab: its block table; kernels/opencl/paged.cl says the layout). */
#define FL_KEY(p, d)                                                                                              \
    (paged ? kv_get(kc, kv_block(layer, tab[(p) / KV_BLOCK], ctx_stride, g, n_kv, HEAD_DIM) + (size_t)(d) * KV_BLOCK + \
                            (p) % KV_BLOCK, kv_half)                                                                 \
           : kc[(size_t)(layer * kv_dim + g * HEAD_DIM + (d)) * ctx_stride + (p)])
#define FL_VALUE(p, d)                                                                                            \
    (paged ? kv_get(vc, kv_block(layer, tab[(p) / KV_BLOCK], ctx_stride, g, n_kv, HEAD_DIM) + (size_t)((p) % KV_BLOCK) * \
                            HEAD_DIM + (d), kv_half)                                                                 \
           : vc[(size_t)layer * kv_dim * ctx_stride + (size_t)(p) * kv_dim + g * HEAD_DIM + (d)])

/* Causal attention of a run of one sequence's queries over its cache (positions 0 .. each query's
 * own), one work-group per (run of tokens, KV head): its FL_QB rows are (token, query head of the KV
 * head's group) pairs, so the staged keys and values serve every head that shares them (GQA). Keys are
 * staged FL_KB positions at a time. Work-item (qi, ki) = (lid / 16, lid % 16) owns rows qi + 16 a: it
 * scores keys ki + 16 b of each staged tile against them (FL_QA x FL_KA dot products: each local read
 * serves several of them), keeps the rows' running max and sum (an online softmax, reduced over the 16
 * work-items of a qi), and accumulates their output elements ki + 16 c from the weighted values. A
 * row's arithmetic does not depend on the other rows of its group or on where the group ends (keys
 * past a row's own position weigh exactly 0), so a token gets the same bits in any step.
 * The runs: paged == 0, tokens [t0, t0 + FL_QB / gq) of the n_tok of a chunk at positions pos0 + t;
 * paged, meta[grp_off + 4 (grp0 + i) ..] = (first token, tokens, first position, offset of the block table).
 * spo_off >= 0 (steps of many sequences): a row's keys are split into spans of FL_SPAN positions from 0,
 * work-group z of get_num_groups(2) taking span z of every row of its run (so a decode token's keys are
 * read by several work-groups at once; per_wg > 1: spans z per_wg .. one after another, where the grid has
 * work-groups enough without them). A row whose position lies in span 0 is finished here as before;
 * a later row leaves its span's output sums, max and sum of weights at part + ((meta[spo_off + t] -
 * part_base + z) n_heads + head) (HEAD_DIM + 2), for flash_combine. A row's spans depend on its own
 * position only, so its bits still do not depend on the step it comes in. */
__kernel __attribute__((reqd_work_group_size(FL_LWS, 1, 1))) void
flash_prefill(__global const float *q, __global const float *kc, __global const float *vc, int layer, int n_heads,
              int n_kv, int ctx_stride, int pos0, int n_tok, int paged, int kv_half, __global const int *meta, int grp_off,
              int grp0, int spo_off, int per_wg, int part_base, __global float *part, __global float *out) {
    const int kv_dim = n_kv * HEAD_DIM, q_dim = n_heads * HEAD_DIM, gq = n_heads / n_kv, tpg = FL_QB / gq;
    __local float Qs[FL_QB][HEAD_DIM + 1], KV[FL_KB][HEAD_DIM + 1], P[FL_QB][FL_KB + 1], red[FL_LWS];
    int lid = get_local_id(0), qi = lid / 16, ki = lid % 16, g = get_group_id(1);
    int t0 = get_group_id(0) * tpg, nq = min(tpg, n_tok - t0);
    __global const int *tab = meta;
    if (paged) {
        __global const int *grp = meta + grp_off + 4 * (grp0 + get_group_id(0));
        t0 = grp[0], nq = grp[1], pos0 = grp[2] - t0, tab = meta + grp[3];
    }
    int last = pos0 + t0 + nq - 1, rows = nq * gq, na = FL_ROW_SKIP && rows <= 16 ? 1 : FL_QA; /* row blocks with work */
    int z0 = get_group_id(2) * per_wg; /* this group's first span */
    if (spo_off >= 0 && z0 * FL_SPAN > last) return; /* no row of the run reaches it */
    float scale = rsqrt((float)HEAD_DIM), m_row[FL_QA], l_row[FL_QA], acc[FL_QA][FL_DA];
    for (int i = lid; i < FL_QB * HEAD_DIM; i += FL_LWS) {
        int r = i / HEAD_DIM, d = i % HEAD_DIM;
        Qs[r][d] = r < rows ? q[(size_t)(t0 + r / gq) * q_dim + (g * gq + r % gq) * HEAD_DIM + d] * scale : 0.0f;
    }
    for (int z = z0; z < z0 + per_wg; z++) { /* each span from scratch: its sums do not depend on per_wg */
        int p_begin = spo_off >= 0 ? z * FL_SPAN : 0, p_end = spo_off >= 0 ? min(last + 1, p_begin + FL_SPAN) : last + 1;
        if (p_begin > last) break;
        for (int a = 0; a < FL_QA; a++) {
            m_row[a] = -INFINITY, l_row[a] = 0.0f;
            for (int c = 0; c < FL_DA; c++) acc[a][c] = 0.0f;
        }
        for (int p0 = p_begin; p0 < p_end; p0 += FL_KB) {
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int i = lid; i < FL_KB * HEAD_DIM; i += FL_LWS) {
                int d = i / FL_KB, k = i % FL_KB;
                KV[k][d] = p0 + k <= last ? FL_KEY(p0 + k, d) : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            float sc[FL_QA][FL_KA];
            for (int a = 0; a < FL_QA; a++)
                for (int b = 0; b < FL_KA; b++) sc[a][b] = 0.0f;
            if (na == FL_QA) FL_SCORES(FL_QA) else FL_SCORES(1)
            float alpha[FL_QA];
            for (int a = 0; a < FL_QA; a++) {
                if (a >= na) break; /* (a bound the compiler knows keeps the rows' arrays in registers) */
                int r = qi + 16 * a;
                float mx = -INFINITY;
                for (int b = 0; b < FL_KA; b++) {
                    if (p0 + ki + 16 * b > pos0 + t0 + r / gq) sc[a][b] = -INFINITY; /* causal */
                    mx = fmax(mx, sc[a][b]);
                }
                float m_new = fmax(m_row[a], lanes_reduce(mx, 16, red, 1)), sum = 0.0f;
                alpha[a] = m_new == -INFINITY ? 1.0f : exp(m_row[a] - m_new);
                for (int b = 0; b < FL_KA; b++) {
                    float pe = m_new == -INFINITY ? 0.0f : exp(sc[a][b] - m_new);
                    P[r][ki + 16 * b] = pe;
                    sum += pe;
                }
                l_row[a] = l_row[a] * alpha[a] + lanes_reduce(sum, 16, red, 0), m_row[a] = m_new;
            }
            barrier(CLK_LOCAL_MEM_FENCE); /* the keys are read: their tile takes the values */
            for (int i = lid; i < FL_KB * HEAD_DIM; i += FL_LWS) {
                int k = i / HEAD_DIM, d = i % HEAD_DIM;
                KV[k][d] = p0 + k <= last ? FL_VALUE(p0 + k, d) : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int a = 0; a < FL_QA && a < na; a++)
                for (int c = 0; c < FL_DA; c++) acc[a][c] *= alpha[a];
            if (na == FL_QA) FL_WEIGHTED(FL_QA) else FL_WEIGHTED(1)
        }
        for (int a = 0; a < FL_QA && a < na; a++) {
            int r = qi + 16 * a, t = t0 + r / gq, h = g * gq + r % gq, pos = pos0 + t;
            if (r >= rows || pos < p_begin) continue;
            if (spo_off < 0 || pos < FL_SPAN) { /* the row's only span */
                for (int c = 0; c < FL_DA; c++) out[(size_t)t * q_dim + h * HEAD_DIM + ki + 16 * c] = acc[a][c] / l_row[a];
                continue;
            }
            __global float *pp = part + ((size_t)(meta[spo_off + t] - part_base + z) * n_heads + h) * (HEAD_DIM + 2);
            for (int c = 0; c < FL_DA; c++) pp[ki + 16 * c] = acc[a][c];
            if (ki == 0) pp[HEAD_DIM] = m_row[a], pp[HEAD_DIM + 1] = l_row[a];
        }
    }
}

/* The rows flash_prefill split into spans (position >= FL_SPAN), tokens t_first + get_global_id(1) of
 * a step: output element d of head h = sum_z acc_z[d] e^(m_z - m) / sum_z l_z e^(m_z - m), m the largest
 * m_z, the spans z = 0 .. position / FL_SPAN added in order. One work-item an element.
 * emit (FL_EMIT): every row of the tokens, split or finished by flash_prefill (pos_off < 0: none split, a
 * chunk of one sequence), goes on as o_proj's input (emit_lane, as pf_norm would leave it), saving
 * pf_norm's launch a layer. (Not in flash_prefill's epilogue: its work-items hold a row in another shape,
 * and PoCL 3.1 ran code after that kernel's loops of barriers for work-items whose conditions there were
 * false.) */
__kernel __attribute__((reqd_work_group_size(FL_COMBINE_LWS, 1, 1))) void
flash_combine(__global const float *part, __global const int *meta, int pos_off, int spo_off, int part_base, int t_first,
              int n_heads, __global float *out, int emit, MM_OUT_ARGS) {
    __local float red[FL_COMBINE_LWS];
    MM_OUT_OPEN;
    int e = get_global_id(0), t = t_first + get_global_id(1), h = e / HEAD_DIM, d = e % HEAD_DIM, live = h < n_heads;
    int n_sp = pos_off >= 0 ? meta[pos_off + t] / FL_SPAN + 1 : 1;
    if (n_sp == 1 && !(FL_EMIT && emit)) return; /* flash_prefill finished it (all of the work-group: one token) */
    __global float *y = out + (size_t)t * n_heads * HEAD_DIM + h * HEAD_DIM + d;
    float v = 0.0f;
    if (live && n_sp == 1) {
        v = *y;
    } else if (live) {
        __global const float *pp = part + ((size_t)(meta[spo_off + t] - part_base) * n_heads + h) * (HEAD_DIM + 2);
        size_t stride = (size_t)n_heads * (HEAD_DIM + 2);
        float m = -INFINITY;
        for (int z = 0; z < n_sp; z++) m = fmax(m, pp[z * stride + HEAD_DIM]);
        float l = 0.0f, a = 0.0f;
        for (int z = 0; z < n_sp; z++) {
            float w = exp(pp[z * stride + HEAD_DIM] - m);
            l = fma(pp[z * stride + HEAD_DIM + 1], w, l), a = fma(pp[z * stride + d], w, a);
        }
        v = a / l;
    }
#if FL_EMIT
    if (emit) {
        emit_lane(v, t, e, n_heads * HEAD_DIM, live, int8, xf, xq, xd, xs, g16, xh, red);
        return;
    }
#endif
    if (live) *y = v;
}
#endif
