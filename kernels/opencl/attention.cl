/* Attention of one query token over the cache, split over spans of positions (split-K partials
 * combined by attn_out, or with ATT_FUSED by the group that leaves a head's last span). */

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

