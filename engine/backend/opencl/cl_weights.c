/* The weights on the device: every matrix uploaded once, into one arena buffer where the device allows
 * it, and the fused phases' second copy of o_proj and down_proj laid out by blocks of inputs. */
#include "engine/backend/opencl/cl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"

int tllm_cl_dt_code(enum tllm_dtype d) { return d == TLLM_DT_BF16 ? 2 : d == TLLM_DT_F16 ? 1 : 0; }

/* Every matrix of the model, in the descriptor table's order: embed, lm_head, then q k v o gate up
 * down of each layer. */
int tllm_cl_n_mats(const struct tllm_model *m) { return 2 + 7 * m->cfg.n_layers; }
const struct tllm_qweights *tllm_cl_model_mat(const struct tllm_model *m, int i) {
    if (i < 2) return i ? &m->lm_head : &m->embed;
    const struct tllm_layer *L = &m->layers[(i - 2) / 7];
    const struct tllm_qweights *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return ws[(i - 2) % 7];
}

/* A buffer the device's converted weights own (freed with cl) */
static void *conv_alloc(struct tllm_cl *cl, size_t n) {
    void **nc = realloc(cl->conv, (size_t)(cl->n_conv + 1) * sizeof *nc);
    if (!nc) return NULL;
    cl->conv = nc;
    void *p = calloc(1, n ? n : 1);
    if (p) cl->conv[cl->n_conv++] = p;
    return p;
}

/* w in a form the device kernels read (affine 2/4/8-bit or dense), values unchanged: affine 1/3 and 5/6-bit
 * codes widened to 2/4 and 8 bits; E2M1 codes (mxfp4, nvfp4) as 8-bit tllm_e2m1_u8 (2 x value + 12) with
 * scale s/2 and bias -6 s (float32); mxfp8 as dense bf16 (E4M3 times a power of two has 4 significant
 * bits: exact). Dense, 2/4/8-bit affine: w itself. GPTQ act-order (a column permutation) has no device
 * form yet. */
static int device_form(struct tllm_cl *cl, const struct tllm_qweights *w, struct tllm_qweights *out) {
    *out = *w;
    if (w->perm)
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "opencl: %s: GPTQ act-order weights are not supported by the device kernels yet; run it on the CPU",
                         w->name);
    if (w->format == TLLM_WF_DENSE || (w->format == TLLM_WF_AFFINE && (w->bits == 2 || w->bits == 4 || w->bits == 8)))
        return TLLM_OK;
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols, ng = rows * (cols / (size_t)w->group_size);
    if (w->format == TLLM_WF_MXFP8) {
        uint16_t *d = conv_alloc(cl, rows * cols * 2);
        if (!d) return tllm_fail(TLLM_ERR_NOMEM, "opencl: out of memory converting %s", w->name);
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < cols; j++) {
                float s = tllm_qw_scale(w, (int)r, (int)(j / (size_t)w->group_size));
                d[r * cols + j] = tllm_f32_to_bf16(s * tllm_e4m3_to_f32((uint8_t)tllm_qw_code(w, (int)r, (int)j)));
            }
        out->format = TLLM_WF_DENSE, out->dtype = TLLM_DT_BF16, out->w = d, out->scales = out->biases = NULL;
        out->bits = out->group_size = 0;
        return TLLM_OK;
    }
    const int fp4 = w->format != TLLM_WF_AFFINE, bits = fp4 ? 8 : w->bits <= 2 ? 2 : w->bits <= 4 ? 4 : 8, per = 32 / bits;
    uint32_t *q = conv_alloc(cl, rows * cols / (size_t)per * 4);
    float *sb = fp4 ? conv_alloc(cl, 2 * ng * sizeof(float)) : NULL;
    if (!q || (fp4 && !sb)) return tllm_fail(TLLM_ERR_NOMEM, "opencl: out of memory converting %s", w->name);
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < cols; j++) {
            uint32_t c = tllm_qw_code(w, (int)r, (int)j);
            if (fp4) c = tllm_e2m1_u8[c];
            q[(r * cols + j) / (size_t)per] |= c << ((j % (size_t)per) * (size_t)bits);
        }
    if (fp4) {
        const size_t gpr = cols / (size_t)w->group_size;
        for (size_t r = 0; r < rows; r++)
            for (size_t g = 0; g < gpr; g++) {
                float sc = 0.5f * tllm_qw_scale(w, (int)r, (int)g);
                sb[r * gpr + g] = sc, sb[ng + r * gpr + g] = -(float)TLLM_E2M1_OFFSET * sc;
            }
        out->format = TLLM_WF_AFFINE, out->dtype = TLLM_DT_F32, out->scales = sb, out->biases = sb + ng;
    }
    out->bits = bits, out->w = q;
    return TLLM_OK;
}

/* The plain form of w's scales and biases (as the model holds them) */
static struct cl_form plain_form(const struct tllm_qweights *w) {
    struct cl_form f = {.dt = tllm_cl_dt_code(w->dtype), .s = w->scales, .b = w->biases};
    if (w->format != TLLM_WF_DENSE) f.s_len = f.b_len = (size_t)w->rows * (size_t)(w->cols / w->group_size) * tllm_dtype_size(w->dtype);
    return f;
}

/* z > 0 if every bias of w is exactly -2^z times its scale (codes with a zero point), else 0 */
static int symmetric_shift(const struct tllm_qweights *w, size_t ng) {
    size_t i = 0;
    while (i < ng && tllm_load_f32(w->scales, w->dtype, i) == 0.0f) i++;
    if (i == ng) return 0;
    float r = -tllm_load_f32(w->biases, w->dtype, i) / tllm_load_f32(w->scales, w->dtype, i);
    int z = 1;
    while (z < 8 && (float)(1 << z) != r) z++;
    if ((float)(1 << z) != r) return 0;
    for (i = 0; i < ng; i++)
        if (tllm_load_f32(w->biases, w->dtype, i) != -(float)(1 << z) * tllm_load_f32(w->scales, w->dtype, i)) return 0;
    return z;
}

/* n float32 values (n % 8 == 0) as CL_DT_TWO_LEVEL blocks into out (n / 8 x 10 bytes); 0 if a block does not factor */
static int two_level(const float *v, size_t n, unsigned char *out) {
    for (size_t b = 0; b < n / 8; b++) {
        uint16_t d;
        int8_t q[8];
        if (!tllm_f16_i8_factor(v + 8 * b, 1, 8, &d, q)) return 0;
        memcpy(out + 10 * b, &d, 2), memcpy(out + 10 * b + 2, q, 8);
    }
    return 1;
}

/* f (w's plain form) as the device's most compact form that holds the same values (struct cl_form):
 * biases dropped where they follow the scales, float32 in two levels where each 8 groups' values are a
 * float16 times int8s. GGUF's k-quants: Q4_K 6 -> 4.6 bits a weight on the device, Q6_K (as 8-bit
 * codes) 12 -> 8.6. */
static int compact_form(struct tllm_cl *cl, const struct tllm_qweights *w, int two_levels, struct cl_form *f) {
    if (w->format != TLLM_WF_AFFINE || !w->scales || !w->biases) return TLLM_OK;
    const size_t ng = (size_t)w->rows * (size_t)(w->cols / w->group_size);
    int z = symmetric_shift(w, ng);
    if (z) f->dt |= z << CL_DT_SYM_SHIFT, f->b = NULL, f->b_len = 0;
    if (!two_levels || w->dtype != TLLM_DT_F32 || ng % 8) return TLLM_OK;
    unsigned char *s2 = conv_alloc(cl, ng / 8 * 10), *b2 = z ? NULL : conv_alloc(cl, ng / 8 * 10);
    if (!s2 || (!z && !b2)) return tllm_fail(TLLM_ERR_NOMEM, "opencl: out of memory converting %s", w->name);
    if (!two_level(w->scales, ng, s2) || (!z && !two_level(w->biases, ng, b2))) return TLLM_OK; /* kept (freed with cl) */
    f->dt = (f->dt & ~3) | CL_DT_TWO_LEVEL, f->s = s2, f->s_len = ng / 8 * 10;
    if (!z) f->b = b2, f->b_len = ng / 8 * 10;
    return TLLM_OK;
}

int tllm_cl_device_mats(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    int n = tllm_cl_n_mats(m);
    if (!(cl->mats = calloc((size_t)n, sizeof *cl->mats)) || !(cl->forms = calloc((size_t)n, sizeof *cl->forms)))
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    /* -DCOMPACT_SCALES=n in TLLM_CL_OPTS: 0 plain scales and biases (the default), 1 no biases where they
     * follow the scales, 2 also two levels (compact_form). Not by default: two levels cost the H200 more
     * than the bytes they save (1.5B Q4_K_M tg128 642-647 -> 535-538 tok/s, 7B 191 -> 131, for 24-25% fewer
     * bytes; each scale is two small reads where a float32 is one), PoCL 12% (its work is the arithmetic);
     * 1 alone is mixed (1.5B +1.3%, 7B -4.9%) */
    const char *extra = getenv("TLLM_CL_OPTS"), *asked = extra ? strstr(extra, "COMPACT_SCALES=") : NULL;
    int compact = asked ? atoi(asked + strlen("COMPACT_SCALES=")) : 0;
    for (int i = 0; i < n; i++) {
        const struct tllm_qweights *w = tllm_cl_model_mat(m, i);
        if (i == 1 && w->w == m->embed.w) { /* tied: the embedding's device form */
            cl->mats[1] = cl->mats[0], cl->forms[1] = cl->forms[0];
            continue;
        }
        int rc = device_form(cl, w, &cl->mats[i]);
        cl->forms[i] = plain_form(&cl->mats[i]);
        if (!rc && compact) rc = compact_form(cl, &cl->mats[i], compact >= 2, &cl->forms[i]);
        if (rc) return rc;
    }
    return TLLM_OK;
}

int tllm_cl_upload(struct tllm_cl *cl, cl_mem *out, const void *p, size_t n, const char *what) {
    cl_int e;
    *out = clCreateBuffer(cl->cx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n ? n : 4, (void *)p, &e);
    if (e != CL_SUCCESS)
        return tllm_fail(TLLM_ERR_NOMEM, "opencl: uploading %s (%zu bytes) to %s: %s", what, n, cl->name, tllm_cl_err_name(e));
    return TLLM_OK;
}

/* The 16-byte row check, format, shape and piece sizes of w, whose scales and biases are f */
static int weight_lens(const struct tllm_qweights *w, const struct cl_form *f, struct cl_weights *cw) {
    cw->rows = w->rows, cw->cols = w->cols, cw->dt = f->dt;
    if (w->format == TLLM_WF_DENSE) {
        cw->bits = 0, cw->gs = 0;
        cw->len[0] = (size_t)w->rows * w->cols * tllm_dtype_size(w->dtype), cw->len[1] = cw->len[2] = 4;
    } else {
        if ((size_t)w->cols * (size_t)w->bits % 128) /* the kernels read rows 16 bytes at a time */
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "opencl: %s: rows of %d %d-bit codes are not a whole number of 16 bytes",
                             w->name, w->cols, w->bits);
        cw->bits = w->bits, cw->gs = w->group_size;
        cw->len[0] = (size_t)w->rows * w->cols / 8 * w->bits;
        cw->len[1] = f->s_len, cw->len[2] = f->b ? f->b_len : 4; /* symmetric: a placeholder */
    }
    return TLLM_OK;
}

/* weight_lens, and w's pieces placed in the arena (tied matrices share). */
static int plan_weights(struct tllm_cl *cl, const struct tllm_qweights *w, const struct cl_form *f, struct cl_weights *cw,
                        const struct tllm_qweights *same, const struct cl_weights *same_cw) {
    int rc = weight_lens(w, f, cw);
    if (rc) return rc;
    if (same && same->w == w->w && same->scales == w->scales && same->biases == w->biases) { /* tied: one copy */
        memcpy(cw->off, same_cw->off, sizeof cw->off);
        return TLLM_OK;
    }
    for (int i = 0; i < 3; i++) {
        if ((w->format == TLLM_WF_DENSE && i) || (i == 2 && !f->b)) { /* placeholders */
            cw->off[i] = cw->off[w->format == TLLM_WF_DENSE ? 0 : 1];
            continue;
        }
        cw->off[i] = (cl->arena_size + cl->arena_align - 1) / cl->arena_align * cl->arena_align;
        cl->arena_size = cw->off[i] + cw->len[i];
    }
    return TLLM_OK;
}

static int arena_write(struct tllm_cl *cl, const struct tllm_qweights *w, const struct cl_form *f, const struct cl_weights *cw) {
    const void *src[3] = {w->w, f->s, f->b};
    for (int i = 0; i < (cw->bits ? f->b ? 3 : 2 : 1); i++) {
        cl_int e = clEnqueueWriteBuffer(cl->q, cl->arena, CL_FALSE, cw->off[i], cw->len[i], src[i], 0, NULL, NULL);
        if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: uploading %s to %s: %s", w->name, cl->name, tllm_cl_err_name(e));
    }
    return TLLM_OK;
}

/* The kernels' view of cw: sub-buffers of the arena, or (no arena) of a buffer of its own. */
static int views(struct tllm_cl *cl, const struct tllm_qweights *w, const struct cl_form *f, struct cl_weights *cw);
static int weights_own(struct tllm_cl *cl, const struct tllm_qweights *w, const struct cl_form *f, struct cl_weights *cw);

static int weight_buffers(struct tllm_cl *cl, const struct tllm_qweights *w, const struct cl_form *f, struct cl_weights *cw) {
    if (!cl->arena) return weights_own(cl, w, f, cw);
    cw->base = cl->arena, cw->own_base = 0;
    return views(cl, w, f, cw);
}

/* cw's w, s and b as views of its base at off (dense: s and b are w again; no biases: b is s again) */
static int views(struct tllm_cl *cl, const struct tllm_qweights *w, const struct cl_form *f, struct cl_weights *cw) {
    cl_mem *out[3] = {&cw->w, &cw->s, &cw->b};
    for (int i = 0; i < 3; i++) {
        if (i && (!cw->bits || (i == 2 && !f->b))) { /* placeholders: the view before in their place (never read as
                                                       * such). Not a second view over the same bytes: NVIDIA's
                                                       * driver crashed at exit after kernels had taken two
                                                       * overlapping ones */
            *out[i] = *out[i - 1];
            CL_TRY(clRetainMemObject(*out[i]));
            continue;
        }
        cl_buffer_region r = {cw->off[i], cw->len[i]};
        cl_int e;
        *out[i] = clCreateSubBuffer(cw->base, CL_MEM_READ_ONLY, CL_BUFFER_CREATE_TYPE_REGION, &r, &e);
        if (e != CL_SUCCESS) return tllm_fail(TLLM_ERR_IO, "opencl: a view of %s on %s: %s", w->name, cl->name, tllm_cl_err_name(e));
    }
    return TLLM_OK;
}

/* One buffer of w's own holding its codes, scales and biases, as the arena would (plan_weights) */
static int weights_own(struct tllm_cl *cl, const struct tllm_qweights *w, const struct cl_form *f, struct cl_weights *cw) {
    memset(cw, 0, sizeof *cw);
    int rc = weight_lens(w, f, cw);
    if (rc) return rc;
    const void *src[3] = {w->w, cw->bits ? f->s : NULL, cw->bits ? f->b : NULL};
    size_t size = 0;
    for (int i = 0; i < 3; i++) {
        if (i && !src[i]) { /* placeholders (the codes are always there) */
            cw->off[i] = cw->off[i - 1];
            continue;
        }
        cw->off[i] = (size + cl->arena_align - 1) / cl->arena_align * cl->arena_align;
        size = cw->off[i] + cw->len[i];
    }
    cl_int e;
    cw->base = clCreateBuffer(cl->cx, CL_MEM_READ_ONLY, size, NULL, &e);
    if (e != CL_SUCCESS)
        return tllm_fail(TLLM_ERR_NOMEM, "opencl: uploading %s (%zu bytes) to %s: %s", w->name, size, cl->name, tllm_cl_err_name(e));
    cw->own_base = 1;
    for (int i = 0; i < 3; i++)
        if (src[i] && (e = clEnqueueWriteBuffer(cl->q, cw->base, CL_TRUE, cw->off[i], cw->len[i], src[i], 0, NULL, NULL)))
            return tllm_fail(TLLM_ERR_IO, "opencl: uploading %s to %s: %s", w->name, cl->name, tllm_cl_err_name(e));
    return views(cl, w, f, cw);
}

int tllm_cl_weights_own(struct tllm_cl *cl, const struct tllm_qweights *w, struct cl_weights *cw) {
    struct cl_form f = plain_form(w);
    return weights_own(cl, w, &f, cw);
}

/* Matrix i of the model, and its device copy, in the descriptor table's order. */
void tllm_cl_mat(struct tllm_cl *cl, int i, const struct tllm_qweights **w, struct cl_weights **cw) {
    *w = &cl->mats[i];
    if (i < 2) {
        *cw = i ? &cl->lm_head : &cl->embed;
        return;
    }
    struct cl_layer *D = &cl->layers[(i - 2) / 7];
    struct cl_weights *cws[7] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->gate, &D->up, &D->down};
    *cw = cws[(i - 2) % 7];
}

/* Uploads every weight once: into one arena buffer where the device allows a buffer that large (and
 * offsets fit the table's 16-byte units), else one buffer per matrix (no persistent kernel then). */
int tllm_cl_upload_all_weights(struct tllm_cl *cl) {
    cl_uint align_bits = 0;
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(cl->dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    clGetDeviceInfo(cl->dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    cl->arena_align = align_bits / 8 > 16 ? align_bits / 8 : 16; /* sub-buffers must start on this */
    int n = tllm_cl_n_mats(cl->m);
    for (int i = 0; i < n; i++) {
        const struct tllm_qweights *w;
        struct cl_weights *cw;
        tllm_cl_mat(cl, i, &w, &cw);
        int rc = plan_weights(cl, w, &cl->forms[i], cw, i == 1 ? &cl->mats[0] : NULL, &cl->embed);
        if (rc) return rc;
    }
    const char *arena = getenv("TLLM_CL_ARENA"); /* 0: a buffer per matrix, as when the arena is too large (tests) */
    if (cl->arena_size <= max_alloc && cl->arena_size / 16 < 0x7fffffff && !(arena && !strcmp(arena, "0"))) {
        cl_int e;
        cl->arena = clCreateBuffer(cl->cx, CL_MEM_READ_ONLY, cl->arena_size, NULL, &e);
        if (e != CL_SUCCESS) cl->arena = NULL; /* too large at once after all: a buffer per matrix */
    }
    for (int i = 0; i < n; i++) {
        const struct tllm_qweights *w;
        struct cl_weights *cw;
        tllm_cl_mat(cl, i, &w, &cw);
        int rc = cl->arena ? arena_write(cl, w, &cl->forms[i], cw) : TLLM_OK;
        if (!rc) rc = weight_buffers(cl, w, &cl->forms[i], cw);
        if (rc) return rc;
    }
    CL_TRY(clFinish(cl->q)); /* the writes read the model's mapped memory */
    return TLLM_OK;
}

size_t tllm_cl_step_weight_bytes(const struct tllm_cl *cl, size_t *weights) {
    size_t bytes = 0;
    *weights = 0;
    for (int i = 1; i < tllm_cl_n_mats(cl->m); i++) {
        const struct tllm_qweights *w = &cl->mats[i];
        const struct cl_form *f = &cl->forms[i];
        *weights += (size_t)w->rows * (size_t)w->cols;
        if (w->format == TLLM_WF_DENSE) bytes += (size_t)w->rows * w->cols * tllm_dtype_size(w->dtype);
        else bytes += (size_t)w->rows * w->cols / 8 * w->bits + f->s_len + (f->b ? f->b_len : 0);
    }
    return bytes;
}

void tllm_cl_release_weights(struct cl_weights *cw) {
    if (cw->w) clReleaseMemObject(cw->w);
    if (cw->s) clReleaseMemObject(cw->s);
    if (cw->b) clReleaseMemObject(cw->b);
    if (cw->own_base && cw->base) clReleaseMemObject(cw->base);
}

int tllm_cl_device_buffer(struct tllm_cl *cl, cl_mem *out, size_t n, const char *what) {
    cl_int e;
    *out = clCreateBuffer(cl->cx, CL_MEM_READ_WRITE, n, NULL, &e);
    if (e != CL_SUCCESS)
        return tllm_fail(TLLM_ERR_NOMEM, "opencl: %s (%zu bytes) on %s: %s", what, n, cl->name, tllm_cl_err_name(e));
    return TLLM_OK;
}

/* FFN_FUSED, ATT_FUSED: every layer's o_proj and down_proj again, as blocks_times in kernels/opencl/matvec.cl reads
 * them (BT_BYTES there): for each block of 32 inputs, every row's 16 bytes of codes, then the scales
 * [group][row] and the biases, so the blocks a work-group multiplies are contiguous. (The arena keeps
 * the row-major copies for the one-kernel-per-step path.) */
static size_t bt_bytes(const struct tllm_qweights *w) {
    size_t es = tllm_dtype_size(w->dtype);
    return ((size_t)w->rows * w->cols / 2 + 2 * (size_t)w->rows * (size_t)(w->cols / w->group_size) * es + 127) & ~(size_t)127;
}

/* w (4-bit, the format of every matrix: the host checked) in that layout, into t */
void tllm_cl_by_blocks(const struct tllm_qweights *w, unsigned char *t) {
    size_t es = tllm_dtype_size(w->dtype), rows = (size_t)w->rows, nb = (size_t)w->cols / 32;
    size_t ng = (size_t)(w->cols / w->group_size), cb = rows * nb * 16, gb = rows * ng * es;
    const unsigned char *q = w->w, *s = w->scales, *b = w->biases;
    for (size_t r = 0; r < rows; r++) {
        for (size_t k = 0; k < nb; k++) memcpy(t + (k * rows + r) * 16, q + (r * nb + k) * 16, 16);
        for (size_t g = 0; g < ng; g++) {
            memcpy(t + cb + (g * rows + r) * es, s + (r * ng + g) * es, es);
            memcpy(t + cb + gb + (g * rows + r) * es, b + (r * ng + g) * es, es);
        }
    }
}

int tllm_cl_upload_by_blocks(struct tllm_cl *cl) {
    const struct tllm_model *m = cl->m;
    const struct tllm_qweights *wo0 = &cl->mats[2 + 3], *down0 = &cl->mats[2 + 6]; /* the device forms */
    size_t o_bytes = bt_bytes(wo0), per = o_bytes + bt_bytes(down0);
    int rc = tllm_cl_device_buffer(cl, &cl->by_blocks, per * (size_t)m->cfg.n_layers, "o_proj and down_proj by blocks");
    unsigned char *t = rc ? NULL : calloc(1, per);
    if (!rc && !t) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < m->cfg.n_layers && !rc; l++) {
        tllm_cl_by_blocks(&cl->mats[2 + 7 * l + 3], t);
        tllm_cl_by_blocks(&cl->mats[2 + 7 * l + 6], t + o_bytes);
        cl_int e = clEnqueueWriteBuffer(cl->q, cl->by_blocks, CL_TRUE, per * (size_t)l, per, t, 0, NULL, NULL);
        if (e != CL_SUCCESS) rc = tllm_fail(TLLM_ERR_IO, "opencl: uploading o_proj and down_proj by blocks to %s: %s", cl->name, tllm_cl_err_name(e));
    }
    free(t);
    return rc;
}
