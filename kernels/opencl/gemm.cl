/* Tiled GEMMs for prompt processing: Y[t][r] = sum_k W[r][k] X[t][k] (+ bias[r]) (+ Y[t][r]) for a
 * chunk of tokens at once (engine/backend/opencl/cl_prefill.c drives them). A work-group of GEMM_T x
 * GEMM_T threads computes a tile of GEMM_TM rows x GEMM_TN tokens, each thread GEMM_RM x GEMM_RN of
 * it (rows tx + GEMM_T i, so a warp's stores of one token are consecutive rows); the weights and the
 * activations of GEMM_TK inputs at a time are staged in local memory, rows padded by one word so the
 * threads of a warp read different banks.
 *   gemm_q8: int8 activations (per block of 32: codes, scale d and the block's sum d * sum q, as the
 *            CPU's packed kernels take them), affine codes of 2, 4 or 8 bits unpacked to bytes when
 *            staged, 4 products at a time by dp4a; per block the integer sums are scaled by the row's
 *            group scale and d, and the group bias meets the block sum. Groups of 32 or more.
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

/* Codes k .. k + 3 of row r as 4 bytes (k % 4 == 0, bits 2, 4 or 8: they never straddle a word) */
inline uint codes4(__global const uchar *W, int bits, size_t row_words, int r, int k) {
    int bit = k * bits;
    uint v = ((__global const uint *)W)[(size_t)r * row_words + (bit >> 5)] >> (bit & 31);
    if (bits == 8) return v;
    if (bits == 4) return (v & 0xfu) | ((v & 0xf0u) << 4) | ((v & 0xf00u) << 8) | ((v & 0xf000u) << 12);
    return (v & 0x3u) | ((v & 0xcu) << 6) | ((v & 0x30u) << 12) | ((v & 0xc0u) << 18);
}

/* The epilogue: bias, residual (add: y already holds it), store at y + y_off + t ldy + r */
#define GEMM_STORE(acc)                                                                                 \
    for (int i = 0; i < GEMM_RM; i++)                                                                   \
        for (int j = 0; j < GEMM_RN; j++) {                                                             \
            int r = r0 + tx + GEMM_T * i, t = t0 + ty + GEMM_T * j;                                     \
            if (r >= rows || t >= n_tok) continue;                                                      \
            __global float *p = y + y_off + (size_t)t * ldy + r;                                                \
            float v = acc[i][j] + (bias_off >= 0 ? vecs[bias_off + r] : 0.0f);                         \
            *p = add ? *p + v : v;                                                                      \
        }

__kernel __attribute__((reqd_work_group_size(GEMM_T, GEMM_T, 1))) void
gemm_q8(WARGS(0), int rows, int cols, int n_tok, __global const char *xq, __global const float *xd,
        __global const float *xsum, __global const float *vecs, int bias_off, __global float *y, int y_off, int ldy,
        int add) {
    Q_FIX(bits0, gs0, dt0);
    __local uint As[GEMM_TM][GEMM_KW + 1], Bs[GEMM_TN][GEMM_KW + 1];
    __local float Asc[2][GEMM_TM], Abi[2][GEMM_TM], Bd[2][GEMM_TN], Bsum[2][GEMM_TN];
    int tx = get_local_id(0), ty = get_local_id(1), lid = ty * GEMM_T + tx;
    int r0 = get_group_id(0) * GEMM_TM, t0 = get_group_id(1) * GEMM_TN;
    size_t row_words = (size_t)cols * bits0 / 32;
    int ng = cols / gs0, nb = cols / 32;
    float acc[GEMM_RM][GEMM_RN];
    for (int i = 0; i < GEMM_RM; i++)
        for (int j = 0; j < GEMM_RN; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < cols; k0 += GEMM_TK) {
        for (int i = lid; i < GEMM_TM * GEMM_KW; i += GEMM_LWS) {
            int r = i / GEMM_KW, kw = i % GEMM_KW, k = k0 + 4 * kw;
            As[r][kw] = r0 + r < rows && k < cols ? codes4(W0, bits0, row_words, r0 + r, k) : 0u;
        }
        for (int i = lid; i < GEMM_TN * GEMM_KW; i += GEMM_LWS) {
            int t = i / GEMM_KW, kw = i % GEMM_KW, k = k0 + 4 * kw;
            Bs[t][kw] = t0 + t < n_tok && k < cols ? ((__global const uint *)(xq + (size_t)(t0 + t) * cols))[k / 4] : 0u;
        }
        for (int i = lid; i < 2 * GEMM_TM; i += GEMM_LWS) {
            int b = i / GEMM_TM, r = i % GEMM_TM, k = k0 + 32 * b, ok = r0 + r < rows && k < cols;
            size_t g = (size_t)(r0 + r) * ng + k / gs0;
            Asc[b][r] = ok ? ld(S0, dt0, g) : 0.0f;
            Abi[b][r] = ok ? ld(B0, dt0, g) : 0.0f;
        }
        for (int i = lid; i < 2 * GEMM_TN; i += GEMM_LWS) {
            int b = i / GEMM_TN, t = i % GEMM_TN, k = k0 + 32 * b, ok = t0 + t < n_tok && k < cols;
            Bd[b][t] = ok ? xd[(size_t)(t0 + t) * nb + k / 32] : 0.0f;
            Bsum[b][t] = ok ? xsum[(size_t)(t0 + t) * nb + k / 32] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (int b = 0; b < 2; b++) {
            int ia[GEMM_RM][GEMM_RN];
            for (int i = 0; i < GEMM_RM; i++)
                for (int j = 0; j < GEMM_RN; j++) ia[i][j] = 0;
#pragma unroll
            for (int kw = 8 * b; kw < 8 * b + 8; kw++) {
                uint a[GEMM_RM], v[GEMM_RN];
                for (int i = 0; i < GEMM_RM; i++) a[i] = As[tx + GEMM_T * i][kw];
                for (int j = 0; j < GEMM_RN; j++) v[j] = Bs[ty + GEMM_T * j][kw];
                for (int i = 0; i < GEMM_RM; i++)
                    for (int j = 0; j < GEMM_RN; j++) ia[i][j] = dp4a(a[i], v[j], ia[i][j]);
            }
            for (int i = 0; i < GEMM_RM; i++) {
                float s = Asc[b][tx + GEMM_T * i], o = Abi[b][tx + GEMM_T * i];
                for (int j = 0; j < GEMM_RN; j++)
                    acc[i][j] += s * (Bd[b][ty + GEMM_T * j] * (float)ia[i][j]) + o * Bsum[b][ty + GEMM_T * j];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    GEMM_STORE(acc);
}

/* Element k of row r of W as a float (dense, or affine codes) */
inline float w_at(WARGS(0), int cols, int r, int k) {
    Q_FIX(bits0, gs0, dt0);
    if (bits0 == 0) return ld(W0, dt0, (size_t)r * cols + k);
    int per = 32 / bits0;
    uint word = ((__global const uint *)W0)[(size_t)r * (cols / per) + k / per];
    float q = (float)((word >> ((k % per) * bits0)) & ((1u << bits0) - 1u));
    size_t g = (size_t)r * (cols / gs0) + k / gs0;
    return ld(S0, dt0, g) * q + ld(B0, dt0, g);
}

__kernel __attribute__((reqd_work_group_size(GEMM_T, GEMM_T, 1))) void
gemm_f(WARGS(0), int rows, int cols, int n_tok, __global const float *x, __global const float *vecs, int bias_off,
       __global float *y, int y_off, int ldy, int add) {
    __local float As[GEMM_TM][GEMM_FK + 1], Bs[GEMM_TN][GEMM_FK + 1];
    int tx = get_local_id(0), ty = get_local_id(1), lid = ty * GEMM_T + tx;
    int r0 = get_group_id(0) * GEMM_TM, t0 = get_group_id(1) * GEMM_TN;
    float acc[GEMM_RM][GEMM_RN];
    for (int i = 0; i < GEMM_RM; i++)
        for (int j = 0; j < GEMM_RN; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < cols; k0 += GEMM_FK) {
        for (int i = lid; i < GEMM_TM * GEMM_FK; i += GEMM_LWS) {
            int r = i / GEMM_FK, k = k0 + i % GEMM_FK;
            As[r][i % GEMM_FK] = r0 + r < rows && k < cols ? w_at(WPASS(0), cols, r0 + r, k) : 0.0f;
        }
        for (int i = lid; i < GEMM_TN * GEMM_FK; i += GEMM_LWS) {
            int t = i / GEMM_FK, k = k0 + i % GEMM_FK;
            Bs[t][i % GEMM_FK] = t0 + t < n_tok && k < cols ? x[(size_t)(t0 + t) * cols + k] : 0.0f;
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
