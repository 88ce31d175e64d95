/* Quantizing weights: a whole checkpoint to disk (tllm quantize), or a loaded model in memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/quantize.h"
#include "engine/convert/convert.h"
#include "engine/convert/convert_util.h"
#include "base/error.h"
#include "engine/load/gguf.h"
#include "base/json_util.h"
#include "engine/convert/st_writer.h"

/* One side of a mixed recipe: a number of bits (affine, in groups of group_size) or a float mode's name
 * (its own bits and group); 0 when it is neither or not a supported combination */
static int recipe_side(const char *tok, size_t len, int group_size, struct tllm_quant_spec *s) {
    char buf[16];
    if (len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, tok, len);
    buf[len] = 0;
    char *end;
    long bits = strtol(buf, &end, 10);
    if (!*end) *s = (struct tllm_quant_spec){(int)bits, group_size, TLLM_QM_AFFINE};
    else {
        int m = tllm_qmode_parse(buf);
        if (m <= TLLM_QM_AFFINE) return 0;
        s->mode = (enum tllm_qmode)m;
        tllm_qmode_defaults(s->mode, &s->bits, &s->group_size);
    }
    return tllm_quant_mode_supported(s->mode, s->bits, s->group_size);
}

int tllm_mixed_recipe_spec(const char *recipe, const char *module, int n_layers, int group_size,
                           struct tllm_quant_spec *spec) {
    struct tllm_quant_spec lo, hi;
    const char *a = strncmp(recipe, "mixed_", 6) ? NULL : recipe + 6, *b = a ? strchr(a, '_') : NULL;
    if (!b || !recipe_side(a, (size_t)(b - a), group_size, &lo) || !recipe_side(b + 1, strlen(b + 1), group_size, &hi) ||
        lo.bits >= hi.bits)
        return tllm_fail(TLLM_ERR_ARG,
                         "mixed recipe '%s' is not of the form mixed_LOW_HIGH with LOW and HIGH affine bits (1-6, 8) or "
                         "modes (mxfp4, nvfp4, mxfp8), LOW the fewer bits (e.g. mixed_2_4, mixed_4_8, mixed_mxfp4_mxfp8)",
                         recipe);
    /* As mlx-lm's mixed recipes: v_proj and down_proj get more bits in the first and last eighth of
     * the layers and every third layer between; so does the lm_head. */
    int layer = -1;
    sscanf(module, "model.layers.%d.", &layer);
    int n8 = n_layers / 8;
    int more = layer >= 0 && (layer < n8 || layer >= 7 * n_layers / 8 || (layer - n8) % 3 == 2);
    size_t len = strlen(module);
    int sensitive = (len >= 6 && !strcmp(module + len - 6, "v_proj")) ||
                    (len >= 9 && !strcmp(module + len - 9, "down_proj"));
    *spec = (sensitive && more) || !strcmp(module, "lm_head") ? hi : lo;
    return TLLM_OK;
}

static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(const struct tllm_tensor *const *)a)->name, (*(const struct tllm_tensor *const *)b)->name);
}

/* A 2-D float ".weight" that is not a norm: a Linear or the Embedding, which MLX quantizes. */
static int is_quantizable(const struct tllm_tensor *t) {
    size_t len = strlen(t->name);
    return t->ndim == 2 && t->dtype != TLLM_DT_U32 && len > 7 && !strcmp(t->name + len - 7, ".weight") &&
           !strstr(t->name, "norm");
}

static void progress(int on, size_t done, size_t total, const char *what) {
    if (!on) return;
    int width = 30, fill = total ? (int)((double)done / (double)total * width) : width;
    fprintf(stderr, "\rquantizing [%.*s%*s] %3d%% %-48.48s", fill, "==============================", width - fill,
            "", total ? (int)(100.0 * (double)done / (double)total) : 100, what);
    if (done == total) fputc('\n', stderr);
}

/* A tensor written unchanged (norms, biases, and weights left unquantized). */
static void copy_spec(struct tllm_st_spec *sp, const struct tllm_tensor *t) {
    memset(sp, 0, sizeof *sp);
    snprintf(sp->name, sizeof sp->name, "%s", t->name);
    sp->dtype = t->dtype;
    sp->ndim = t->ndim < 2 ? t->ndim : 2;
    for (int d = 0; d < sp->ndim; d++) sp->shape[d] = t->shape[d];
}

struct item {
    const struct tllm_tensor *src;
    char module[192];
    struct tllm_quant_spec spec; /* bits 0: copied as is */
    enum tllm_dtype sb_dtype;    /* scales/biases dtype when quantized */
};

/* A float matrix quantized into three new heap buffers (codes, scales, biases), MLX-style. */
struct quantized {
    uint32_t *q;
    char *scales, *biases;
    size_t q_bytes, sb_bytes;
};

static int quantize_matrix(const void *src, enum tllm_dtype sdt, int rows, int cols, struct tllm_quant_spec s,
                           enum tllm_dtype sbt, struct quantized *out, const char *name) {
    static const enum tllm_wformat formats[] = {TLLM_WF_AFFINE, TLLM_WF_MXFP4, TLLM_WF_NVFP4, TLLM_WF_MXFP8};
    const int affine = s.mode == TLLM_QM_AFFINE;
    size_t words = (size_t)cols * s.bits / 32, ng = (size_t)cols / s.group_size, esz = affine ? tllm_dtype_size(sbt) : 1;
    out->q_bytes = (size_t)rows * words * 4;
    out->sb_bytes = (size_t)rows * ng * esz;
    out->q = malloc(out->q_bytes);
    out->scales = malloc(out->sb_bytes);
    out->biases = affine ? malloc(out->sb_bytes) : NULL;
    float *rowbuf = malloc((size_t)cols * sizeof(float));
    if (!out->q || !out->scales || (affine && !out->biases) || !rowbuf) {
        free(out->q);
        free(out->scales);
        free(out->biases);
        free(rowbuf);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory quantizing %s", name);
    }
    for (int r = 0; r < rows; r++) {
        tllm_convert_to_f32((const char *)src + (size_t)r * cols * tllm_dtype_size(sdt), sdt, rowbuf, (size_t)cols);
        if (affine)
            tllm_quantize_row_affine(rowbuf, cols, s.bits, s.group_size, sbt, out->q + r * words, out->scales + r * ng * esz,
                                     out->biases + r * ng * esz);
        else
            tllm_quantize_row_fp(rowbuf, cols, formats[s.mode], sdt, out->q + r * words, (uint8_t *)out->scales + r * ng);
    }
    free(rowbuf);
    return TLLM_OK;
}

int tllm_quantize_checkpoint(const char *in_dir, const char *out_dir, const struct tllm_quantize_opts *o) {
    if (!tllm_quant_mode_supported(o->mode, o->bits, o->group_size))
        return tllm_fail(TLLM_ERR_ARG,
                         "bits=%d group_size=%d is not supported for mode %s (affine: bits 1-6 or 8; group size 32, 64, "
                         "128; mxfp4: 4 and 32; nvfp4: 4 and 16; mxfp8: 8 and 32)",
                         o->bits, o->group_size, tllm_qmode_name(o->mode));
    if (o->mixed && o->mode != TLLM_QM_AFFINE)
        return tllm_fail(TLLM_ERR_ARG, "--mixed names each side's mode (e.g. mixed_mxfp4_mxfp8); it takes no --mode %s",
                         tllm_qmode_name(o->mode));
    struct tllm_config cfg;
    char *cfg_path = tllm_path_join(in_dir, "config.json");
    int rc = tllm_gguf_is_gguf(in_dir)
                 ? tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: a GGUF file runs as it is (-m FILE.gguf); to requantize it, write it "
                                                   "out as a float32 checkpoint first (scripts/gguf_to_hf.py)", in_dir)
                 : tllm_model_dir_check(in_dir);
    if (!rc) rc = tllm_config_load(cfg_path, &cfg);
    if (rc) {
        free(cfg_path);
        return rc;
    }
    /* the spec most modules get, written as config.json's default: a recipe's LOW side, else the options' */
    struct tllm_quant_spec dflt = {o->bits, o->group_size, o->mode};
    if (o->mixed) rc = tllm_mixed_recipe_spec(o->mixed, "", cfg.n_layers, o->group_size, &dflt);
    struct tllm_ckpt *ck = NULL;
    const struct tllm_tensor **ts = NULL;
    struct item *items = NULL;
    struct tllm_st_spec *specs = NULL;
    const char **ov_names = NULL;
    struct tllm_quant_spec *ov_specs = NULL;
    struct json_object *jcfg = NULL;
    int n = 0, n_specs = 0, n_ov = 0;
    if (!rc && cfg.quant.bits) rc = tllm_fail(TLLM_ERR_ARG, "%s: is already quantized", in_dir);
    if (!rc) rc = tllm_ckpt_open(in_dir, &ck);
    if (!rc) {
        for (int f = 0; f < ck->n_files; f++) n += ck->files[f]->n_tensors;
        ts = calloc((size_t)n + 1, sizeof *ts);
        items = calloc((size_t)n + 1, sizeof *items);
        specs = calloc((size_t)n * 3 + 1, sizeof *specs);
        ov_names = calloc((size_t)n + 1, sizeof *ov_names);
        ov_specs = calloc((size_t)n + 1, sizeof *ov_specs);
        if (!ts || !items || !specs || !ov_names || !ov_specs) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        int k = 0;
        for (int f = 0; f < ck->n_files; f++)
            for (int i = 0; i < ck->files[f]->n_tensors; i++) ts[k++] = &ck->files[f]->tensors[i];
        qsort(ts, (size_t)n, sizeof *ts, cmp_tensor_ptr);
    }
    size_t total = 0, done = 0;
    for (int i = 0; i < n && !rc; i++) {
        struct item *it = &items[i];
        const struct tllm_tensor *t = ts[i];
        it->src = t;
        total += t->nbytes;
        if (t->dtype == TLLM_DT_U32) {
            rc = tllm_fail(TLLM_ERR_ARG, "%s: tensor '%s' is U32: the checkpoint is already quantized", t->file, t->name);
            break;
        }
        if (!is_quantizable(t)) {
            copy_spec(&specs[n_specs++], t);
            continue;
        }
        snprintf(it->module, sizeof it->module, "%.*s", (int)(strlen(t->name) - 7), t->name);
        it->spec = dflt;
        if (o->mixed && (rc = tllm_mixed_recipe_spec(o->mixed, it->module, cfg.n_layers, o->group_size, &it->spec)))
            break;
        int64_t rows = t->shape[0], cols = t->shape[1];
        if (cols % it->spec.group_size != 0) {
            fprintf(stderr, "tllm: %s: row length %lld is not a multiple of the group size %d: left unquantized\n",
                    t->name, (long long)cols, it->spec.group_size);
            it->spec.bits = 0;
        }
        if (it->spec.bits != dflt.bits || (it->spec.bits && (it->spec.mode != dflt.mode || it->spec.group_size != dflt.group_size))) {
            ov_names[n_ov] = it->module;
            ov_specs[n_ov++] = it->spec;
        }
        if (it->spec.bits == 0) {
            copy_spec(&specs[n_specs++], t);
            continue;
        }
        /* the float modes' scales are E8M0 / E4M3 bytes, and they have no biases */
        it->sb_dtype = it->spec.mode != TLLM_QM_AFFINE ? TLLM_DT_U8 : o->sb_dtype != TLLM_DT_INVALID ? o->sb_dtype : t->dtype;
        static const char *const sfx[] = {"weight", "scales", "biases"};
        for (int s = 0; s < (it->spec.mode == TLLM_QM_AFFINE ? 3 : 2); s++) {
            struct tllm_st_spec *sp = &specs[n_specs++];
            snprintf(sp->name, sizeof sp->name, "%s.%s", it->module, sfx[s]);
            sp->dtype = s == 0 ? TLLM_DT_U32 : it->sb_dtype;
            sp->ndim = 2;
            sp->shape[0] = rows;
            sp->shape[1] = s == 0 ? cols * it->spec.bits / 32 : cols / it->spec.group_size;
        }
    }
    if (!rc) rc = tllm_prepare_out_dir(out_dir, o->force);
    if (!rc) rc = tllm_json_load_file(cfg_path, TLLM_CONFIG_MAX_BYTES, &jcfg);
    if (!rc) {
        tllm_config_set_quantization(jcfg, &dflt, ov_names, ov_specs, n_ov);
        rc = tllm_write_json(out_dir, "config.json", jcfg);
    }
    if (!rc) rc = tllm_copy_aux_files(in_dir, out_dir);
    char *st_path = rc ? NULL : tllm_path_join(out_dir, "model.safetensors");
    struct tllm_st_writer w;
    if (!rc) rc = tllm_st_writer_open(&w, st_path, specs, n_specs);
    for (int i = 0; i < n && !rc; i++) {
        const struct item *it = &items[i];
        const struct tllm_tensor *t = it->src;
        progress(o->progress, done, total, t->name);
        if (it->spec.bits == 0) {
            rc = tllm_st_writer_write(&w, t->data, t->nbytes);
        } else {
            struct quantized qz;
            rc = quantize_matrix(t->data, t->dtype, (int)t->shape[0], (int)t->shape[1], it->spec, it->sb_dtype, &qz,
                                 t->name);
            if (!rc) {
                rc = tllm_st_writer_write(&w, qz.q, qz.q_bytes);
                if (!rc) rc = tllm_st_writer_write(&w, qz.scales, qz.sb_bytes);
                if (!rc && qz.biases) rc = tllm_st_writer_write(&w, qz.biases, qz.sb_bytes);
                free(qz.q);
                free(qz.scales);
                free(qz.biases);
            }
        }
        done += t->nbytes;
        if (rc) tllm_st_writer_abort(&w);
    }
    if (!rc) {
        progress(o->progress, total, total, "done");
        rc = tllm_st_writer_close(&w);
    }
    free(st_path);
    if (jcfg) json_object_put(jcfg);
    free(ts);
    free(items);
    free(specs);
    free(ov_names);
    free(ov_specs);
    tllm_ckpt_close(ck);
    tllm_config_free(&cfg);
    free(cfg_path);
    return rc;
}

static int quantize_in_place(struct tllm_model *m, struct tllm_qweights *w, int bits, int gs) {
    if (w->format != TLLM_WF_DENSE || w->cols % gs != 0) return TLLM_OK;
    struct quantized qz; /* scales and biases in the source dtype, as MLX stores them */
    int rc = quantize_matrix(w->w, w->dtype, w->rows, w->cols, (struct tllm_quant_spec){bits, gs, TLLM_QM_AFFINE}, w->dtype, &qz,
                             w->name);
    if (rc) return rc;
    void *bufs[3] = {qz.q, qz.scales, qz.biases};
    for (int i = 0; i < 3; i++)
        if ((rc = tllm_model_own(m, bufs[i]))) { /* tllm_model_own freed bufs[i]; the rest are not owned yet */
            for (int j = i + 1; j < 3; j++) free(bufs[j]);
            return rc;
        }
    w->format = TLLM_WF_AFFINE;
    w->bits = bits;
    w->group_size = gs;
    w->w = qz.q;
    w->scales = qz.scales;
    w->biases = qz.biases;
    return TLLM_OK;
}

int tllm_model_quantize(struct tllm_model *m, int bits, int gs) {
    if (!tllm_quant_supported(bits, gs))
        return tllm_fail(TLLM_ERR_ARG, "--quantize %d with group size %d is not supported (bits 1-6 or 8; group size 32, 64, 128)", bits, gs);
    int rc = quantize_in_place(m, &m->embed, bits, gs);
    for (int l = 0; l < m->cfg.n_layers && !rc; l++) {
        struct tllm_layer *L = &m->layers[l];
        struct tllm_qweights *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7 && !rc; i++) rc = quantize_in_place(m, ws[i], bits, gs);
    }
    if (rc) return rc;
    if (m->cfg.tie_embeddings) m->lm_head = m->embed;
    else rc = quantize_in_place(m, &m->lm_head, bits, gs);
    return rc;
}
