/* OpenCL C 1.2 kernels for one decode step (engine/cl.c drives them). No extension is needed: f16
 * scales are read with vload_half, bf16 as the top half of a float, and reductions go through local
 * memory (NVIDIA's OpenCL has neither cl_khr_fp16 nor subgroups). Five launches per layer:
 * qkv (RMSNorm + q/k/v + bias + RoPE + cache write), attention, o_proj + residual,
 * RMSNorm + gate/up + SwiGLU, down + residual; then RMSNorm + lm_head, and argmax.
 * Tunables are defaults here and can be overridden with -D at build time. */

#ifndef MV_LWS
#define MV_LWS 256 /* work-group size of the matvec kernels */
#endif
#ifndef MV_TPR
#define MV_TPR 32 /* threads per row: a row's words are read by MV_TPR neighbours (coalesced) */
#endif
#ifndef ATT_LWS
#define ATT_LWS 256 /* work-group size of attention (one group per query head) */
#endif
#ifndef MAX_HEAD_DIM
#define MAX_HEAD_DIM 256
#endif

#ifndef MV_LOCAL_X
#define MV_LOCAL_X 8192 /* inputs up to this many floats are staged (normalized) in local memory */
#endif

#define MV_RPG (MV_LWS / MV_TPR) /* rows (or row pairs) per work-group */

/* Weight formats: bits 0 = dense of dtype dt, else MLX affine with scales/biases of dtype dt.
 * dt: 0 = f32, 1 = f16, 2 = bf16. */
inline float ld(__global const uchar *p, int dt, size_t i) {
    if (dt == 2) return as_float((uint)((__global const ushort *)p)[i] << 16);
    if (dt == 1) return vload_half(i, (__global const half *)p);
    return ((__global const float *)p)[i];
}

/* 1 / rms(x) * weight[j] applies to x[j]; computed by every work-group that needs it. */
inline float inv_rms(__global const float *x, int n, float eps, __local float *red) {
    int lid = get_local_id(0);
    float ss = 0.0f;
    for (int j = lid; j < n; j += MV_LWS) ss += x[j] * x[j];
    red[lid] = ss;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = MV_LWS / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return rsqrt(r / (float)n + eps);
}

/* xin = x * inv * normw (or x) into local memory, when it fits; returns whether it did. */
inline int stage_x(__global const float *x, int n, __global const float *normw, float inv, __local float *xs) {
    if (n > MV_LOCAL_X) return 0;
    for (int j = get_local_id(0); j < n; j += MV_LWS) xs[j] = normw ? x[j] * inv * normw[j] : x[j];
    barrier(CLK_LOCAL_MEM_FENCE);
    return 1;
}

/* The prologue of a matvec: 1/rms(x) when normw is given (else 1), and xin staged when it fits. */
inline float prologue(__global const float *x, int n, __global const float *normw, float eps, __local float *red,
                      __local float *xs, int *staged) {
    float inv = normw ? inv_rms(x, n, eps, red) : 1.0f;
    *staged = stage_x(x, n, normw, inv, xs);
    return inv;
}

/* This thread's share of row r . xin, where xin is xs (staged) or x[j] * (normw ? inv * normw[j] : 1). */
inline float row_part(__global const uchar *W, __global const uchar *S, __global const uchar *B, int r, int cols,
                      int bits, int gs, int dt, __global const float *x, __global const float *normw, float inv,
                      __local const float *xs, int staged, int lane) {
#define XIN(j) (staged ? xs[j] : normw ? x[j] * inv * normw[j] : x[j])
    float acc = 0.0f;
    if (bits == 0) {
        for (int j = lane; j < cols; j += MV_TPR) acc += ld(W, dt, (size_t)r * cols + j) * XIN(j);
        return acc;
    }
    const int per = 32 / bits, wpr = cols / per, ng = cols / gs;
    const uint mask = (1u << bits) - 1u;
    __global const uint *row = (__global const uint *)W + (size_t)r * wpr;
    for (int w = lane; w < wpr; w += MV_TPR) {
        uint word = row[w];
        int j0 = w * per, g = j0 / gs;
        float qx = 0.0f, sx = 0.0f;
        for (int e = 0; e < per; e++) {
            float xv = XIN(j0 + e);
            qx += (float)((word >> (e * bits)) & mask) * xv;
            sx += xv;
        }
        acc += ld(S, dt, (size_t)r * ng + g) * qx + ld(B, dt, (size_t)r * ng + g) * sx;
    }
    return acc;
#undef XIN
}

/* Sum of `v` over the MV_TPR threads of each row slot; the result is valid in lane 0. */
inline float row_reduce(float v, __local float *red) {
    int lid = get_local_id(0), lane = lid % MV_TPR;
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = MV_TPR / 2; s > 0; s >>= 1) {
        if (lane < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return red[lid];
}

#define WARGS(n) __global const uchar *W##n, __global const uchar *S##n, __global const uchar *B##n, int bits##n, int gs##n, int dt##n

/* x = embedding row `id` */
__kernel void embed(WARGS(0), int cols, int id, __global float *x) {
    int j = get_global_id(0);
    if (j >= cols) return;
    if (bits0 == 0) {
        x[j] = ld(W0, dt0, (size_t)id * cols + j);
        return;
    }
    int per = 32 / bits0, ng = cols / gs0;
    uint word = ((__global const uint *)W0)[(size_t)id * (cols / per) + j / per];
    float q = (float)((word >> ((j % per) * bits0)) & ((1u << bits0) - 1u));
    x[j] = ld(S0, dt0, (size_t)id * ng + j / gs0) * q + ld(B0, dt0, (size_t)id * ng + j / gs0);
}

/* y = W . norm(x) (mode 0) or y += W . x (mode 1, the residual add). */
__kernel void matvec(WARGS(0), int rows, int cols, __global const float *x, __global const float *vecs, int norm_off,
                     float eps, __global float *y, int mode) {
    __local float red[MV_LWS];
    int lid = get_local_id(0), r = get_group_id(0) * MV_RPG + lid / MV_TPR, lane = lid % MV_TPR;
    __global const float *normw = norm_off >= 0 ? vecs + norm_off : 0;
    __local float xs[MV_LOCAL_X];
    int staged;
    float inv = prologue(x, cols, normw, eps, red, xs, &staged);
    float part = r < rows ? row_part(W0, S0, B0, r, cols, bits0, gs0, dt0, x, normw, inv, xs, staged, lane) : 0.0f;
    float sum = row_reduce(part, red);
    if (lane == 0 && r < rows) {
        if (mode == 1) y[r] += sum;
        else y[r] = sum;
    }
}

/* h = silu(Wg . norm(x)) * (Wu . norm(x)) */
__kernel void gate_up(WARGS(0), WARGS(1), int rows, int cols, __global const float *x, __global const float *vecs,
                      int norm_off, float eps, __global float *h) {
    __local float red[MV_LWS];
    int lid = get_local_id(0), r = get_group_id(0) * MV_RPG + lid / MV_TPR, lane = lid % MV_TPR;
    __global const float *normw = vecs + norm_off;
    __local float xs[MV_LOCAL_X];
    int staged;
    float inv = prologue(x, cols, normw, eps, red, xs, &staged);
    float g = 0.0f, u = 0.0f;
    if (r < rows) {
        g = row_part(W0, S0, B0, r, cols, bits0, gs0, dt0, x, normw, inv, xs, staged, lane);
        u = row_part(W1, S1, B1, r, cols, bits1, gs1, dt1, x, normw, inv, xs, staged, lane);
    }
    g = row_reduce(g, red);
    u = row_reduce(u, red);
    if (lane == 0 && r < rows) h[r] = g / (1.0f + exp(-g)) * u;
}

/* q, k, v for one token at position pos: each row slot computes rows i and i + head_dim/2 of one head
 * of the concatenated [q | k | v] outputs, so RoPE's pairs stay in one slot. Adds the biases, rotates
 * q and k, writes q to `q` and k, v into the layer's cache (k transposed: [kv_head][dim][position]). */
__kernel void qkv(WARGS(0), WARGS(1), WARGS(2), int n_heads, int n_kv, int hd, int cols, __global const float *x,
                  __global const float *vecs, int norm_off, int bq_off, int bk_off, int bv_off, float eps,
                  __global const float *inv_freq, int pos, int n_ctx, __global float *q, __global float *kt,
                  __global float *vc, int layer) {
    __local float red[MV_LWS];
    int lid = get_local_id(0), lane = lid % MV_TPR;
    int half_d = hd / 2, unit = get_group_id(0) * MV_RPG + lid / MV_TPR;
    int n_units = (n_heads + 2 * n_kv) * half_d;
    int head = unit / half_d, i = unit % half_d; /* head over the concatenation q heads, k heads, v heads */
    __global const float *normw = vecs + norm_off;
    __local float xs[MV_LOCAL_X];
    int staged;
    float inv = prologue(x, cols, normw, eps, red, xs, &staged);
    float a = 0.0f, b = 0.0f;
    if (unit < n_units) {
        if (head < n_heads) {
            int r = head * hd + i;
            a = row_part(W0, S0, B0, r, cols, bits0, gs0, dt0, x, normw, inv, xs, staged, lane);
            b = row_part(W0, S0, B0, r + half_d, cols, bits0, gs0, dt0, x, normw, inv, xs, staged, lane);
        } else if (head < n_heads + n_kv) {
            int r = (head - n_heads) * hd + i;
            a = row_part(W1, S1, B1, r, cols, bits1, gs1, dt1, x, normw, inv, xs, staged, lane);
            b = row_part(W1, S1, B1, r + half_d, cols, bits1, gs1, dt1, x, normw, inv, xs, staged, lane);
        } else {
            int r = (head - n_heads - n_kv) * hd + i;
            a = row_part(W2, S2, B2, r, cols, bits2, gs2, dt2, x, normw, inv, xs, staged, lane);
            b = row_part(W2, S2, B2, r + half_d, cols, bits2, gs2, dt2, x, normw, inv, xs, staged, lane);
        }
    }
    a = row_reduce(a, red);
    b = row_reduce(b, red);
    if (lane != 0 || unit >= n_units) return;
    float angle = (float)pos * inv_freq[i], c = cos(angle), s = sin(angle);
    kt += (size_t)layer * n_kv * hd * n_ctx; /* this layer's cache */
    vc += (size_t)layer * n_kv * hd * n_ctx;
    if (head < n_heads) {
        int r = head * hd + i;
        a += vecs[bq_off + r], b += vecs[bq_off + r + half_d];
        q[r] = a * c - b * s;
        q[r + half_d] = b * c + a * s;
    } else if (head < n_heads + n_kv) {
        int r = (head - n_heads) * hd + i;
        a += vecs[bk_off + r], b += vecs[bk_off + r + half_d];
        kt[(size_t)r * n_ctx + pos] = a * c - b * s;
        kt[(size_t)(r + half_d) * n_ctx + pos] = b * c + a * s;
    } else {
        int kv_dim = n_kv * hd, r = (head - n_heads - n_kv) * hd + i;
        vc[(size_t)pos * kv_dim + r] = a + vecs[bv_off + r];
        vc[(size_t)pos * kv_dim + r + half_d] = b + vecs[bv_off + r + half_d];
    }
}

/* One work-group per query head: softmax(q . K^T / sqrt(d)) . V over positions 0..pos. */
__kernel void attention(__global const float *q, __global const float *kt, __global const float *vc, int layer,
                        __global float *scores, __global float *out, int pos, int n_ctx, int hd, int n_heads,
                        int n_kv) {
    __local float qs[MAX_HEAD_DIM];
    __local float red[ATT_LWS];
    int h = get_group_id(0), lid = get_local_id(0), g = h / (n_heads / n_kv), kv_dim = n_kv * hd;
    float scale = rsqrt((float)hd);
    kt += (size_t)layer * kv_dim * n_ctx;
    vc += (size_t)layer * kv_dim * n_ctx;
    for (int i = lid; i < hd; i += ATT_LWS) qs[i] = q[h * hd + i] * scale;
    barrier(CLK_LOCAL_MEM_FENCE);
    __global const float *k = kt + (size_t)g * hd * n_ctx;
    __global float *s = scores + (size_t)h * n_ctx;
    float mx = -INFINITY;
    for (int p = lid; p <= pos; p += ATT_LWS) {
        float d = 0.0f;
        for (int i = 0; i < hd; i++) d += qs[i] * k[(size_t)i * n_ctx + p];
        s[p] = d;
        mx = fmax(mx, d);
    }
    red[lid] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = ATT_LWS / 2; st > 0; st >>= 1) {
        if (lid < st) red[lid] = fmax(red[lid], red[lid + st]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    mx = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float sum = 0.0f;
    for (int p = lid; p <= pos; p += ATT_LWS) {
        float e = exp(s[p] - mx);
        s[p] = e;
        sum += e;
    }
    red[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = ATT_LWS / 2; st > 0; st >>= 1) {
        if (lid < st) red[lid] += red[lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float inv_sum = 1.0f / red[0];
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE); /* s[] from other threads is read below */
    int parts = ATT_LWS / hd, i = lid % hd, part = lid / hd;
    float acc = 0.0f;
    if (part < parts)
        for (int p = part; p <= pos; p += parts) acc += s[p] * vc[(size_t)p * kv_dim + g * hd + i];
    red[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < hd) {
        float t = 0.0f;
        for (int pp = 0; pp < parts; pp++) t += red[pp * hd + lid];
        out[h * hd + lid] = t * inv_sum;
    }
}

/* Index of the largest of n values (the first on ties): one work-group of MV_LWS threads. */
__kernel void argmax(__global const float *v, int n, __global int *out) {
    __local float best[MV_LWS];
    __local int at[MV_LWS];
    int lid = get_local_id(0);
    float b = -INFINITY;
    int ai = 0x7fffffff;
    for (int j = lid; j < n; j += MV_LWS)
        if (v[j] > b) b = v[j], ai = j;
    best[lid] = b, at[lid] = ai;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = MV_LWS / 2; s > 0; s >>= 1) {
        if (lid < s && (best[lid + s] > best[lid] || (best[lid + s] == best[lid] && at[lid + s] < at[lid])))
            best[lid] = best[lid + s], at[lid] = at[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) out[0] = at[0];
}
