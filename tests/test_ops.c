/* The fast attention, softmax exp and SwiGLU against their scalar references, on odd shapes: query
 * blocks that are not a multiple of the tiles, key counts with tails, head sizes of one vector. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "base/dtype.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_avx512.h"
#include "kernels/cpu/ops_ref.h"

#define TOL_ATTN 2e-6   /* max |fast - ref| / max |v|: outputs are convex combinations of value rows */
#define TOL_EXP 4e-7    /* relative error of the vectorized exp (2 float ulp is 2.4e-7) */
#define TOL_SWIGLU 1e-6 /* relative to |gate * up| + 1e-30 */

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

typedef void attn_fn(const float *, size_t, int, int, const float *, size_t, const float *, size_t, int, float *,
                     float *, size_t);

static void test_attention(const char *name, attn_fn *fn) {
    const int hds[] = {16, 48, 64, 128}, nqs[] = {1, 2, 3, 4, 5, 8, 9, 13, 16}, pos0s[] = {0, 1, 15, 16, 17, 40, 100};
    unsigned seed = 7;
    for (size_t a = 0; a < sizeof hds / sizeof *hds; a++)
        for (size_t b = 0; b < sizeof nqs / sizeof *nqs; b++)
            for (size_t c = 0; c < sizeof pos0s / sizeof *pos0s; c++) {
                int hd = hds[a], nq = nqs[b], pos0 = pos0s[c], L = pos0 + nq, n_ctx = L + 5;
                size_t q_stride = (size_t)hd + 3, v_stride = (size_t)hd + 16, out_stride = (size_t)hd + 1;
                float *q = malloc(nq * q_stride * sizeof(float)), *kt = malloc((size_t)hd * n_ctx * sizeof(float));
                float *v = malloc((size_t)n_ctx * v_stride * sizeof(float));
                float *s1 = malloc((size_t)nq * L * sizeof(float)), *s2 = malloc((size_t)nq * L * sizeof(float));
                float *o1 = calloc(nq * out_stride, sizeof(float)), *o2 = calloc(nq * out_stride, sizeof(float));
                for (size_t i = 0; i < nq * q_stride; i++) q[i] = 4.0f * frand(&seed); /* peaked softmaxes too */
                for (size_t i = 0; i < (size_t)hd * n_ctx; i++) kt[i] = frand(&seed);
                for (size_t i = 0; i < (size_t)n_ctx * v_stride; i++) v[i] = frand(&seed);
                fn(q, q_stride, nq, pos0, kt, (size_t)n_ctx, v, v_stride, hd, s1, o1, out_stride);
                tllm_attention_ref(q, q_stride, nq, pos0, kt, (size_t)n_ctx, v, v_stride, hd, s2, o2, out_stride);
                double worst = 0;
                for (int j = 0; j < nq; j++)
                    for (int i = 0; i < hd; i++) {
                        double e = fabs((double)o1[j * out_stride + i] - o2[j * out_stride + i]);
                        worst = e > worst || isnan(e) ? e : worst;
                    }
                CHECK(worst <= TOL_ATTN, "%s hd %d nq %d pos0 %d: max error %.3g", name, hd, nq, pos0, worst);
                free(q), free(kt), free(v), free(s1), free(s2), free(o1), free(o2);
            }
}

/* Attention over a GQA group read from KV blocks in place (f16 and float32 blocks in a shuffled
 * pool, unused slots NaN): within TOL_ATTN of the scalar oracle on a float copy of the same keys and
 * values, and each head's rows the same bits as that head alone (a query's result does not depend on
 * the queries that share its tiles). */
static void test_attention_blocks(void) {
    enum { B = 16 };
    const int hds[] = {16, 64, 128}, groups[] = {1, 2, 7}, nqs[] = {1, 3, 9, 16}, pos0s[] = {0, 5, 16, 40, 100};
    unsigned seed = 11;
    for (int f16 = 0; f16 <= 1; f16++)
        for (size_t a = 0; a < sizeof hds / sizeof *hds; a++)
            for (size_t g = 0; g < sizeof groups / sizeof *groups; g++)
                for (size_t b = 0; b < sizeof nqs / sizeof *nqs; b++)
                    for (size_t c = 0; c < sizeof pos0s / sizeof *pos0s; c++) {
                        const int hd = hds[a], group = groups[g], nq = nqs[b], pos0 = pos0s[c], len = pos0 + nq;
                        const int nblk = (len + B - 1) / B, pool = nblk + 3, es = f16 ? 2 : 4;
                        const size_t q_stride = (size_t)group * hd + 5, blk = (size_t)hd * B * es;
                        unsigned char *kpool = malloc(pool * blk), *vpool = malloc(pool * blk);
                        float *q = malloc(nq * q_stride * sizeof(float)), *out = malloc(nq * q_stride * sizeof(float));
                        float *ref = malloc(nq * q_stride * sizeof(float)), *kt = malloc((size_t)hd * len * sizeof(float));
                        float *v = malloc((size_t)len * hd * sizeof(float)), *s = malloc((size_t)16 * len * sizeof(float));
                        float *alone = malloc((size_t)nq * hd * sizeof(float));
                        const void **kb = malloc(nblk * sizeof *kb), **vb = malloc(nblk * sizeof *vb);
                        for (size_t i = 0; i < pool * blk / 2; i++) /* NaN in every slot not written below */
                            ((uint16_t *)kpool)[i] = ((uint16_t *)vpool)[i] = 0x7fff;
                        for (int i = 0; i < nblk; i++) /* block i in pool slot pool - 1 - i: backwards, gaps before */
                            kb[i] = kpool + (size_t)(pool - 1 - i) * blk, vb[i] = vpool + (size_t)(pool - 1 - i) * blk;
                        for (int p = 0; p < len; p++)
                            for (int d = 0; d < hd; d++) {
                                float kx = frand(&seed), vx = frand(&seed);
                                size_t ko = (size_t)d * B + p % B, vo = (size_t)(p % B) * hd + d;
                                if (f16) {
                                    uint16_t kh = tllm_f32_to_f16(kx), vh = tllm_f32_to_f16(vx);
                                    ((uint16_t *)kb[p / B])[ko] = kh, ((uint16_t *)vb[p / B])[vo] = vh;
                                    kx = tllm_f16_to_f32(kh), vx = tllm_f16_to_f32(vh);
                                } else {
                                    ((float *)kb[p / B])[ko] = kx, ((float *)vb[p / B])[vo] = vx;
                                }
                                kt[(size_t)d * len + p] = kx, v[(size_t)p * hd + d] = vx;
                            }
                        for (size_t i = 0; i < nq * q_stride; i++) q[i] = 4.0f * frand(&seed), out[i] = ref[i] = 0.0f;
                        tllm_attention_blocks_avx512(q, q_stride, nq, group, pos0, kb, vb, f16, hd, s, out, q_stride);
                        int same = 1;
                        double worst = 0;
                        for (int h = 0; h < group; h++) {
                            tllm_attention_blocks_avx512(q + (size_t)h * hd, q_stride, nq, 1, pos0, kb, vb, f16, hd, s, alone, hd);
                            tllm_attention_ref(q + (size_t)h * hd, q_stride, nq, pos0, kt, (size_t)len, v, (size_t)hd, hd, s,
                                               ref + (size_t)h * hd, q_stride);
                            for (int j = 0; j < nq; j++) {
                                same &= !memcmp(out + j * q_stride + (size_t)h * hd, alone + (size_t)j * hd, (size_t)hd * sizeof(float));
                                for (int i = 0; i < hd; i++) {
                                    double e = fabs((double)out[j * q_stride + (size_t)h * hd + i] - ref[j * q_stride + (size_t)h * hd + i]);
                                    worst = e > worst || isnan(e) ? e : worst;
                                }
                            }
                        }
                        CHECK(same, "attention from %s blocks, hd %d group %d nq %d pos0 %d: a head in its group != alone", f16 ? "f16" : "f32",
                              hd, group, nq, pos0);
                        CHECK(worst <= TOL_ATTN, "attention from %s blocks, hd %d group %d nq %d pos0 %d: max error %.3g", f16 ? "f16" : "f32",
                              hd, group, nq, pos0, worst);
                        free(kpool), free(vpool), free(q), free(out), free(ref), free(kt), free(v), free(s), free(alone);
                        free((void *)kb), free((void *)vb);
                    }
}

static void test_exp(void) {
    enum { N = 4099 };
    static float x[N], in[N];
    double worst = 0;
    for (int i = 0; i < N; i++) x[i] = in[i] = -103.0f + 191.0f * (float)i / (N - 1);
    tllm_exp_avx512(x, N);
    for (int i = 0; i < N; i++) {
        double ref = exp((double)in[i]);
        if (ref < 1.2e-38 || ref > 3.4e38) continue; /* subnormal or overflowing results: checked below */
        double e = fabs(x[i] - ref) / ref;
        worst = e > worst ? e : worst;
    }
    CHECK(worst <= TOL_EXP, "exp: relative error %.3g", worst);
    float ends[5] = {-200.0f, 100.0f, 0.0f, NAN, -INFINITY};
    tllm_exp_avx512(ends, 5);
    CHECK(ends[0] == 0.0f && isinf(ends[1]) && ends[2] == 1.0f && isnan(ends[3]) && ends[4] == 0.0f,
          "exp ends: %g %g %g %g %g", ends[0], ends[1], ends[2], ends[3], ends[4]);
}

static void test_swiglu(void) {
    enum { N = 1000 + 7 };
    static float g1[N], g2[N], up[N];
    unsigned seed = 3;
    for (int i = 0; i < N; i++) g1[i] = g2[i] = 30.0f * frand(&seed), up[i] = frand(&seed);
    tllm_swiglu_avx512(g1, up, N);
    tllm_swiglu_ref(g2, up, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double e = fabs((double)g1[i] - g2[i]) / (fabs((double)g2[i]) + 1e-30);
        worst = e > worst ? e : worst;
    }
    CHECK(worst <= TOL_SWIGLU, "swiglu: relative error %.3g", worst);
}

/* The first maximum, as the scalar loop finds it: ties, NaN, the tail, every length up to a few vectors */
static void test_argmax(void) {
    enum { N = 100 };
    float x[N];
    unsigned seed = 5;
    for (int n = 1; n <= N; n++)
        for (int trial = 0; trial < 4; trial++) {
            for (int i = 0; i < n; i++) x[i] = (float)(int)(8.0f * frand(&seed)); /* few values: many ties */
            if (trial == 1) x[n / 2] = NAN;
            if (trial == 2)
                for (int i = 0; i < n; i++) x[i] = NAN;
            if (trial == 3) x[n - 1] = 100.0f; /* the maximum in the tail */
            int want = tllm_argmax_ref(x, n), got = tllm_argmax_avx512(x, n);
            CHECK(got == want, "argmax n %d trial %d: %d, not %d", n, trial, got, want);
        }
}

/* The first maximum over the ids a bitset allows, as a loop over the allowed ids finds it: whole words
 * allowed (the fast path) and words partly allowed, ties, NaN, -inf, nothing allowed, lengths that end
 * mid-word */
static void test_argmax_allowed(void) {
    enum { N = 200 };
    float x[N];
    uint32_t bits[(N + 31) / 32];
    unsigned seed = 9;
    for (int n = 1; n <= N; n++)
        for (int trial = 0; trial < 6; trial++) {
            for (int i = 0; i < n; i++) x[i] = (float)(int)(8.0f * frand(&seed));
            if (trial == 1) x[n / 2] = NAN, x[0] = NAN;
            if (trial == 2)
                for (int i = 0; i < n; i++) x[i] = i % 3 ? -INFINITY : NAN;
            for (int w = 0; w < (N + 31) / 32; w++) {
                unsigned r = (unsigned)(frand(&seed) * 4.0f + 4.0f) % 4; /* all, none, random, one bit */
                seed = seed * 1664525u + 1013904223u; /* random bits straight from the generator */
                bits[w] = r == 0 ? 0xffffffffu : r == 1 ? 0 : r == 2 ? seed : 1u << (w % 32);
                if (trial == 5) bits[w] = 0;
            }
            int want = -1;
            for (int i = 0; i < n; i++)
                if ((bits[i / 32] >> (i % 32) & 1) && (x[i] > (want < 0 ? -INFINITY : x[want]) || (want < 0 && x[i] == -INFINITY)))
                    want = i;
            int ref = tllm_argmax_allowed_ref(x, n, bits), got = tllm_argmax_allowed(x, n, bits); /* AVX-512 where it runs */
            CHECK(ref == want, "argmax_allowed_ref n %d trial %d: %d, not %d", n, trial, ref, want);
            CHECK(got == want, "argmax_allowed n %d trial %d: %d, not %d", n, trial, got, want);
        }
}

/* The KV cache's AVX-512 row conversion = the scalar tllm_f32_to_f16, bit for bit: halfway cases both ways,
 * subnormals, overflow to infinity, infinities, NaNs with payloads, zeros of both signs, and every
 * f16 value widened and converted back; lengths that end mid-vector */
static void test_f32_to_f16_row(void) {
    enum { N = 65536 + 1000 };
    static float x[N];
    static uint16_t got[N + 1];
    unsigned seed = 7;
    for (int i = 0; i < 65536; i++) x[i] = tllm_f16_to_f32((uint16_t)i);
    for (int i = 65536; i < N; i++) {
        uint32_t u;
        switch (i % 8) {
        case 0: x[i] = 1e5f * frand(&seed); break;                   /* some overflow */
        case 1: x[i] = 1e-6f * frand(&seed); break;                  /* subnormal halves */
        case 2: { /* exactly halfway between two halves */
            uint32_t h = (uint32_t)(i * 37) & 0x7bff;
            float a = tllm_f16_to_f32((uint16_t)h), b = tllm_f16_to_f32((uint16_t)(h + 1));
            x[i] = (a + b) * 0.5f;
            break;
        }
        case 3: u = 0x7f800001u + (uint32_t)i * 977u % 0x7fffffu; memcpy(&x[i], &u, 4); break; /* NaN, payloads */
        case 4: u = 0xff800000u | ((uint32_t)i * 131u & 0x7fffffu) | 1u; memcpy(&x[i], &u, 4); break;
        case 5: x[i] = (i & 16) ? INFINITY : -INFINITY; break;
        case 6: x[i] = (i & 16) ? 0.0f : -0.0f; break;
        default: x[i] = 65504.0f + 16.0f * frand(&seed); break;     /* at the edge of the range */
        }
    }
    int bad = 0;
    for (int n = N; n > N - 20; n -= 3) {
        memset(got, 0xa5, sizeof got);
        tllm_f32_to_f16_row_avx512(x, got, n);
        for (int i = 0; i < n; i++) bad += got[i] != tllm_f32_to_f16(x[i]);
        bad += got[n] != 0xa5a5; /* nothing past the end */
    }
    CHECK(bad == 0, "f32 -> f16 rows: %d conversions differ from the scalar one", bad);
}

int main(void) {
    test_attention("portable", tllm_attention_portable);
    test_attention("dispatch", tllm_attention);
    test_argmax_allowed();
    if (tllm_cpu_has_avx512()) {
        test_attention_blocks();
        test_f32_to_f16_row();
        test_argmax();
        test_exp();
        test_swiglu();
    } else {
        printf("no AVX-512 here: its kernels are not tested\n");
    }
    return check_done();
}
