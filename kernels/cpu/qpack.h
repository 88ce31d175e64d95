/* The CPU's integer-activation layout: affine weights re-packed once at load time so that 64 bytes
 * feed one 16-lane int8 dot product (VNNI vpdpbusd, or the portable loop standing in for it), and
 * activations quantized to int8 per block of 32 (llama.cpp's Q8_1 idea). Using
 *     sum_j (s q_j + b) x_j = s sum_j q_j x_j + b sum_j x_j
 * the codes meet the int8 activations in integer dot products, each block is scaled once, and the
 * bias needs only the float sum of the block.
 *
 * Layout: rows in blocks of 16 (the last block zero-padded). A block's codes are 64-byte chunks, in
 * column order; a chunk covers 16 rows x 4*(8/bits) columns: byte 4i+j holds, in its bits
 * [bits*m, bits*m + bits), the code of row i at column 4m + j of the chunk. So the m-th unpacked
 * 64-byte vector has 4 consecutive codes of each of the 16 rows: one lane of a dot product per row.
 * Scales and biases are [block][group][16] in the source dtype.
 *
 * 5- and 6-bit codes (GGUF's Q5_0/Q5_1/Q5_K/Q6_K, mlx's 5- and 6-bit modes) as bit planes where the
 * kernel that runs reads them (tllm_qpack_forms_native: AVX-512 and AMX): each activation sub-block of S columns (32, or
 * 16 for groups of 16) is its codes' low four bits in the 4-bit layout (S/8 chunks), then one plane per
 * higher bit h (bit 4 + h): for each of the sub-block's S/4 unpacked vectors v (columns 4v .. 4v + 3), a
 * 64-bit little-endian word whose bit 4i + j is bit 4 + h of the code of row i, column 4v + j, i.e. of
 * byte 4i + j of that vector. So a sub-block takes 16 S bits / 8 bytes (5 or 6 chunks for S = 32, 3 for
 * 6-bit S = 16), and AVX-512 adds a plane to an unpacked vector with one masked byte add. Elsewhere
 * (AVX2, NEON) they stay 8-bit codes: 9 or 12 bits a weight with their scales, not 6 or 10 (AVX2 has no
 * mask registers; its expansion of the planes cost more than the bytes saved, on a Xeon pinned to 2 cores).
 *
 * Two-level scales (`super`, where the x86 kernels run): float32 scales and biases that are exactly a
 * float16 per superblock of 256 columns times an int8 per group (GGUF's k-quants: Q4_K's d * sc and
 * -dmin * m, Q6_K's d * sc and -32 d * sc) are kept as that: scales and biases are int8
 * [block][group][16], scales2 and biases2 float16 [block][superblock][16], and a kernel multiplies them
 * back in float32, where the product is exact (at most 19 significant bits): the same values, so the
 * same results, from 8.25 bits a group instead of 32. And where every bias is the same power-of-two
 * multiple of its scale (`sym`: symmetric codes), the biases are not kept at all. With both, a GGUF file's
 * Q5_0, Q6_K and Q8_0 matrices are read at the file's own bits a weight (5.5, 6.5625, 8.5), Q4_K at 4.625. */
#ifndef TLLM_QPACK_H
#define TLLM_QPACK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/qweights.h"

#define TLLM_QPACK_ROWS 16  /* rows per block: one 32-bit lane each in a 512-bit vector */
#define TLLM_XQ_BLOCK 32    /* activation elements per int8 scale */

struct tllm_qpack {
    int rows, cols, bits, group_size; /* bits: the pack's code width, 2, 4 or 8; or 5, 6 as planes (above) */
    int lut;                 /* 1: 4-bit E2M1 codes read through tllm_e2m1_u8 (kernels/cpu/mxfp.h) as
                              * u = 2 x value + 12, w = s (u - 12): one scale a group (half the format's), no biases */
    enum tllm_dtype dtype;   /* of scales and biases */
    int n_blocks;            /* ceil(rows / 16) */
    size_t block_bytes;      /* codes per row block: 16 * cols * bits / 8 */
    uint8_t *codes;          /* [n_blocks x block_bytes], 64-byte aligned */
    void *scales;            /* [n_blocks x cols/group_size x 16] */
    void *biases;            /* [n_blocks x cols/group_size x 16]; NULL with lut */
    float sym;               /* where every bias is exactly sym x its scale (GGUF's Q4_0, Q5_0, Q8_0, Q6_K: -2^(bits-1)),
                              * the biases are not kept (NULL) and the kernels take sym x scale; 0: kept */
    int super;               /* two-level scales: groups a superblock (scales, biases are then int8); 0: none */
    uint16_t *scales2, *biases2; /* super: float16 [n_blocks x cols/group_size/super x 16] */
};

/* Offsets of group g of row block b's 16 scales (or biases), and of its superblock's 16 float16 factors */
static inline size_t tllm_qpack_param_off(const struct tllm_qpack *p, int b, int g) {
    return ((size_t)b * (size_t)(p->cols / p->group_size) + (size_t)g) * 16;
}
static inline size_t tllm_qpack_super_off(const struct tllm_qpack *p, int b, int g) {
    return ((size_t)b * (size_t)(p->cols / p->group_size / p->super) + (size_t)(g / p->super)) * 16;
}

/* Activations of n tokens, quantized per block of 32: x ~ d * q with d = max|x| / 127, or with a
 * second level, x ~ d * (q + q2 / 128): the residual, quantized again. One level is llama.cpp's Q8_1
 * (about 0.5% error per matmul); two levels cost a second vpdpbusd per product and are as good as
 * float32 for practical purposes, and cost twice the integer work: free for one generated token (decode
 * waits on memory), 1.4x the time of a step of many. A token's levels follow its role (generated
 * tokens have two unless --fast-decode), never the size of the step it lands in, so its results do
 * not depend on what else the step holds. */
struct tllm_xq {
    int n, cols;     /* cols % 32 == 0 */
    int8_t *q;       /* [n x cols] */
    int8_t *q2;      /* [n2 x cols] second level of the first n2 tokens */
    float *d;        /* [n x cols/32] scale of each block (d / 128 with two levels) */
    float *sum;      /* [n x cols/32] sum of each block's quantized x (the bias term) */
    int n2;          /* tokens [0, n2) have two levels */
    float *sum16;    /* [n x cols/16] the same sums per half block, for packs with groups of 16 (nvfp4);
                      * NULL when no such pack reads this input */
};

/* Tokens [t0, t1) of x as an activation set of their own (their second levels where they have them):
 * a kernel's results for a token do not depend on what else is in the set, so callers split tokens freely */
static inline struct tllm_xq tllm_xq_view(const struct tllm_xq *x, int t0, int t1) {
    const size_t nb = (size_t)(x->cols / TLLM_XQ_BLOCK);
    struct tllm_xq v = {t1 - t0, x->cols, x->q + (size_t)t0 * (size_t)x->cols, x->q2 ? x->q2 + (size_t)t0 * (size_t)x->cols : NULL,
                        x->d + (size_t)t0 * nb, x->sum + (size_t)t0 * nb, x->n2 > t0 ? (x->n2 < t1 ? x->n2 : t1) - t0 : 0,
                        x->sum16 ? x->sum16 + (size_t)t0 * (size_t)(x->cols / 16) : NULL};
    return v;
}

/* Which tile family runs p: 0, 1, 2 for 2-, 4-, 8-bit codes, 3 for 4-bit codes through the E2M1 table,
 * 4 and 5 for 5- and 6-bit codes as a 4-bit layout and planes */
enum { TLLM_QPACK_KINDS = 6 };
static inline int tllm_qpack_kind(const struct tllm_qpack *p) {
    return p->lut ? 3 : p->bits == 2 ? 0 : p->bits == 4 ? 1 : p->bits == 8 ? 2 : p->bits == 5 ? 4 : 5;
}
/* 1 if p holds 5- or 6-bit codes as planes */
static inline int tllm_qpack_planes(const struct tllm_qpack *p) { return p->bits == 5 || p->bits == 6; }

/* A group of a pack is bpg activation sub-blocks of subcols columns: whole blocks of 32, or (groups of
 * 16) half a block, whose bias term then takes the half block's sum. */
static inline int tllm_qpack_subcols(const struct tllm_qpack *p) {
    return p->group_size < TLLM_XQ_BLOCK ? p->group_size : TLLM_XQ_BLOCK;
}
static inline int tllm_qpack_subblocks(const struct tllm_qpack *p) {
    return p->group_size < TLLM_XQ_BLOCK ? 1 : p->group_size / TLLM_XQ_BLOCK;
}
/* The bias term's x sum of the sub-block starting at column col0 (block kb) of token t0 + t; xs is
 * x->sum from token t0 on. */
static inline float tllm_xq_group_sum(const struct tllm_xq *x, const float *xs, int t0, int t, int nb, int kb, int group_size,
                                      int col0) {
    if (group_size < TLLM_XQ_BLOCK) return x->sum16[(size_t)(t0 + t) * (size_t)(x->cols / 16) + (size_t)(col0 / 16)];
    return xs[(size_t)t * nb + kb];
}

/* 1 if w can be packed: affine (any bits: 1 and 3 take 2 and 4 bits in the pack, 5 and 6 take 8) or
 * mxfp4 / nvfp4 (4-bit E2M1 codes read through tllm_e2m1_u8, the E8M0 / E4M3 scale halved as a bf16
 * scale, no biases), groups of whole activation blocks or (nvfp4, and affine groups of 16 from GGUF's
 * Q2_K / Q3_K / Q6_K) halves of them. The pack keeps w's
 * stored column order: where w->perm is set, the caller quantizes the activations in that order.
 * mxfp8's E4M3 codes do not fit the integer form: it takes the float kernels. */
int tllm_qpack_supported(const struct tllm_qweights *w);
/* The compact forms of a pack (above): 5- and 6-bit codes as planes; two-level scales and symmetric
 * codes' biases left out */
enum { TLLM_QPACK_PLANES = 1, TLLM_QPACK_SCALES = 2 };
/* Pack w (rows [0, rows)); returns TLLM_OK or TLLM_ERR_NOMEM. In the compact forms that the kernel
 * tllm_qpack_matmul runs reads itself (tllm_qpack_forms_native, qpack_matmul.c); _as chooses them, where
 * the weights allow them (every kernel reads every form; those without one of their own through the
 * portable kernel). */
int tllm_qpack_init(struct tllm_qpack *p, const struct tllm_qweights *w);
int tllm_qpack_init_as(struct tllm_qpack *p, const struct tllm_qweights *w, int forms);
int tllm_qpack_forms_native(void);
void tllm_qpack_free(struct tllm_qpack *p);
size_t tllm_qpack_nbytes(const struct tllm_qpack *p);

/* Quantize tokens [t0, t1) of x [n x cols] into xq (buffers sized by the caller; two levels when
 * xq->q2 is set; half-block sums when xq->sum16 is). tllm_xq_quantize picks the AVX-512 version where
 * the CPU has it (the same bits); _ref is the portable one. */
void tllm_xq_quantize(struct tllm_xq *xq, const float *x, int t0, int t1);
void tllm_xq_quantize_ref(struct tllm_xq *xq, const float *x, int t0, int t1);

/* y[t x rows] for row blocks [b0, b1) and all tokens: the integer-activation matmul.
 * tllm_qpack_matmul picks the fastest kernel; _ref is the portable one (and the NEON slot's model). */
void tllm_qpack_matmul(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1);
void tllm_qpack_matmul_ref(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1);

/* What the SIMD kernels share: a tile function computes row block b for tokens [t0, t0 + k), k and the
 * activation levels fixed in it; a kernel is a table of them, run over blocks and tokens here. */
typedef void tllm_qpack_tile_fn(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b, int t0);
struct tllm_qpack_tiles {
    tllm_qpack_tile_fn *const *fns[2]; /* [levels - 1][tokens - 1] */
    int per[2];                        /* tokens a tile at most, by levels */
    int blocks;                        /* row blocks whose codes stay in cache while every token tile passes */
};
/* Row blocks [b0, b1) for every token of x (the first x->n2 with two levels) through a kernel's tiles */
void tllm_qpack_run_tiles(const struct tllm_qpack *p, const struct tllm_xq *x, float *y, int b0, int b1,
                          const struct tllm_qpack_tiles *t);


#endif
