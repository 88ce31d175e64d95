/* GPTQ and AWQ weights converted to the affine layout on load (the formats: engine/load/model.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/load/model.h"

/* AWQ's nibble order: output k of a word of 8 is in nibble awq_slot[k] */
static const int awq_slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static int int_tensor(const struct tllm_model *m, const char *name, int64_t d0, int64_t d1, const struct tllm_tensor **t) {
    int rc = tllm_model_tensor(m, name, 0, d1 < 0 ? 1 : 2, d0, d1, t);
    if (rc) return rc;
    if ((*t)->dtype != TLLM_DT_I32 && (*t)->dtype != TLLM_DT_U32)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected I32 (packed codes)", (*t)->file, name,
                         tllm_dtype_name((*t)->dtype));
    return TLLM_OK;
}

/* The columns in group order when g_idx is not simply i / gs (act-order): perm[j] = the input of stored
 * column j, a stable sort by group. Each group must hold exactly gs inputs. *perm stays NULL when the
 * order is the plain one. */
static int group_order(const struct tllm_model *m, const struct tllm_tensor *tg, int cols, int gs, int32_t **perm) {
    const int32_t *g_idx = tg->data;
    const int ng = cols / gs;
    *perm = NULL;
    int plain = 1;
    for (int i = 0; i < cols; i++) {
        if (g_idx[i] < 0 || g_idx[i] >= ng)
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': group index %d at [%d] is outside [0, %d)", tg->file, tg->name,
                             (int)g_idx[i], i, ng);
        plain &= g_idx[i] == i / gs;
    }
    if (plain) return TLLM_OK;
    int *fill = calloc((size_t)ng, sizeof *fill);
    int32_t *p = malloc((size_t)cols * sizeof *p);
    if (!fill || !p) {
        free(fill);
        free(p);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < cols; i++) fill[g_idx[i]]++;
    int rc = TLLM_OK;
    for (int g = 0; g < ng && !rc; g++)
        if (fill[g] != gs)
            rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: tensor '%s': group %d has %d inputs, not the group size %d", tg->file,
                           tg->name, g, fill[g], gs);
    for (int g = 0; g < ng; g++) fill[g] = 0;
    for (int i = 0; i < cols && !rc; i++) p[g_idx[i] * gs + fill[g_idx[i]]++] = i;
    free(fill);
    if (rc) {
        free(p);
        return rc;
    }
    if ((rc = tllm_model_own((struct tllm_model *)m, p))) return rc;
    *perm = p;
    return TLLM_OK;
}

int tllm_bind_gptq_awq(struct tllm_model *m, const char *module, struct tllm_qweights *w) {
    const struct tllm_config *c = &m->cfg;
    const int rows = w->rows, cols = w->cols, gptq = c->qmethod == TLLM_QMETHOD_GPTQ;
    char name[256];
    if (c->qmethod == TLLM_QMETHOD_MLX || c->quant.bits == 0)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s.qweight' is GPTQ/AWQ-packed but config.json's quantization_config "
                                          "has no quant_method gptq or awq", m->dir, module);
    const int bits = c->quant.bits, per = 32 / bits, gs = c->quant.group_size ? c->quant.group_size : cols;
    if (cols % gs || gs % 32 || rows % per || cols % per)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: %s: a %d x %d matrix in groups of %d (%d-bit) is not supported", m->dir,
                         module, rows, cols, gs, bits);
    const int ng = cols / gs;
    const struct tllm_tensor *tq, *tz, *ts, *tg = NULL;
    int rc;
    snprintf(name, sizeof name, "%s.qweight", module);
    if ((rc = gptq ? int_tensor(m, name, cols / per, rows, &tq) : int_tensor(m, name, cols, rows / per, &tq))) return rc;
    snprintf(name, sizeof name, "%s.qzeros", module);
    if ((rc = int_tensor(m, name, ng, rows / per, &tz))) return rc;
    snprintf(name, sizeof name, "%s.scales", module);
    if ((rc = tllm_model_tensor(m, name, 1, 2, ng, rows, &ts)) || (rc = tllm_tensor_check_finite(ts, ng, rows))) return rc;
    int32_t *perm = NULL;
    snprintf(name, sizeof name, "%s.g_idx", module);
    if (gptq && tllm_ckpt_find(m->ckpt, name)) {
        if ((rc = int_tensor(m, name, cols, -1, &tg))) return rc;
        if ((rc = group_order(m, tg, cols, gs, &perm))) return rc;
    }
    uint32_t *codes = calloc((size_t)rows * cols / per, sizeof *codes);
    float *sb = malloc(2 * (size_t)rows * ng * sizeof *sb); /* scales [rows x ng], then biases */
    if (!codes || !sb) {
        free(codes);
        free(sb);
        return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory converting %s", m->dir, module);
    }
    const uint32_t *q = tq->data, *z = tz->data, mask = (1u << bits) - 1;
    const int zero_offset = gptq && c->gptq_zero_offset;
    for (int r = 0; r < rows; r++) {
        uint32_t *dst = codes + (size_t)r * (cols / per);
        for (int j = 0; j < cols; j++) {
            int i = perm ? perm[j] : j; /* the input of stored column j */
            uint32_t v = gptq ? q[(size_t)(i / per) * rows + r] >> ((i % per) * bits)
                              : q[(size_t)i * (rows / 8) + r / 8] >> (awq_slot[r % 8] * 4);
            dst[j / per] |= (v & mask) << ((j % per) * bits);
        }
        for (int g = 0; g < ng; g++) {
            uint32_t zw = z[(size_t)g * (rows / per) + r / per];
            int zero = (int)((zw >> ((gptq ? r % per : awq_slot[r % 8]) * bits)) & mask) + zero_offset;
            float s = tllm_load_f32(ts->data, ts->dtype, (size_t)g * rows + r);
            sb[(size_t)r * ng + g] = s;
            sb[(size_t)rows * ng + (size_t)r * ng + g] = -s * (float)zero;
        }
    }
    if ((rc = tllm_model_own(m, codes))) {
        free(sb);
        return rc;
    }
    if ((rc = tllm_model_own(m, sb))) return rc;
    w->format = TLLM_WF_AFFINE;
    w->dtype = TLLM_DT_F32;
    w->bits = bits;
    w->group_size = gs;
    w->w = codes;
    w->scales = sb;
    w->biases = sb + (size_t)rows * ng;
    w->perm = perm;
    w->name = tq->name;
    return TLLM_OK;
}
