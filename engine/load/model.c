#include "engine/load/model.h"

#include <dirent.h>
#include <stdio.h>
#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/qpack.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "engine/load/gguf.h"

static void fmt_shape(char *buf, size_t n, const struct tllm_tensor *t) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

int tllm_model_own(struct tllm_model *m, void *p) {
    void **no = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *no);
    if (!no) {
        free(p);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    m->owned = no;
    m->owned[m->n_owned++] = p;
    return TLLM_OK;
}

int tllm_model_alloc(struct tllm_model *m) {
    const struct tllm_config *c = &m->cfg;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t per_layer = 2 * (size_t)c->dim + q_dim + 2 * kv_dim;
    m->vectors = malloc(((size_t)c->n_layers * per_layer + (size_t)c->dim) * sizeof(float));
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->vectors || !m->layers) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    float *v = m->vectors;
    for (int l = 0; l < c->n_layers; l++) {
        struct tllm_layer *L = &m->layers[l];
        L->attn_norm = v, v += c->dim;
        L->ffn_norm = v, v += c->dim;
        L->bq = v, v += q_dim;
        L->bk = v, v += kv_dim;
        L->bv = v, v += kv_dim;
    }
    m->final_norm = v;
    return TLLM_OK;
}

int tllm_model_tensor(const struct tllm_model *m, const char *name, int float_only, int ndim,
                       int64_t d0, int64_t d1, const struct tllm_tensor **out) {
    const struct tllm_tensor *t = tllm_ckpt_find(m->ckpt, name);
    *out = t;
    if (!t) return tllm_fail(TLLM_ERR_FORMAT, "%s: missing tensor '%s'", m->dir, name);
    if (float_only && !tllm_dtype_is_float(t->dtype))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                         t->file, name, tllm_dtype_name(t->dtype));
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        char got[128];
        fmt_shape(got, sizeof got, t);
        if (ndim == 2)
            return tllm_fail(TLLM_ERR_FORMAT,
                             "%s: tensor '%s' has shape %s but config.json implies [%lld, %lld]",
                             t->file, name, got, (long long)d0, (long long)d1);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has shape %s but config.json implies [%lld]",
                         t->file, name, got, (long long)d0);
    }
    return TLLM_OK;
}

int tllm_tensor_check_finite(const struct tllm_tensor *t, int rows, int cols) {
    for (size_t i = 0, n = (size_t)rows * (size_t)cols; i < n; i++) {
        float v = tllm_load_f32(t->data, t->dtype, i);
        if (!isfinite(v))
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has a non-finite value (%g) at [%zu, %zu]", t->file,
                             t->name, v, i / (size_t)cols, i % (size_t)cols);
    }
    return TLLM_OK;
}

static int bind_vector(struct tllm_model *m, const char *name, int len, float *dst) {
    const struct tllm_tensor *t;
    int rc = tllm_model_tensor(m, name, 1, 1, len, 0, &t);
    if (rc) return rc;
    tllm_convert_to_f32(t->data, t->dtype, dst, (size_t)len);
    return tllm_tensor_check_finite(t, 1, len);
}

/* E8M0 255 and E4M3 S.1111.111 are NaN: a row of them would silently turn logits into NaN */
static int check_scale_bytes(const struct tllm_tensor *t, int rows, int cols, enum tllm_wformat f) {
    const uint8_t *s = t->data;
    for (size_t i = 0, n = (size_t)rows * (size_t)cols; i < n; i++)
        if (f == TLLM_WF_NVFP4 ? (s[i] & 0x7f) == 0x7f : s[i] == 255)
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has a NaN scale (byte 0x%02x) at [%zu, %zu]", t->file,
                             t->name, s[i], i / (size_t)cols, i % (size_t)cols);
    return TLLM_OK;
}

static int bind_linear(struct tllm_model *m, const char *module, int rows, int cols,
                       struct tllm_qweights *w) {
    char name[256];
    const struct tllm_tensor *tw, *ts, *tb;
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    snprintf(name, sizeof name, "%s.qweight", module);
    if (tllm_ckpt_find(m->ckpt, name)) return tllm_bind_gptq_awq(m, module, w);
    snprintf(name, sizeof name, "%s.scales", module);
    if (!tllm_ckpt_find(m->ckpt, name)) { /* dense */
        snprintf(name, sizeof name, "%s.weight", module);
        int rc = tllm_model_tensor(m, name, 1, 2, rows, cols, &tw);
        if (rc) return rc;
        w->format = TLLM_WF_DENSE;
        w->dtype = tw->dtype;
        w->w = tw->data;
        w->name = tw->name;
        return TLLM_OK;
    }
    struct tllm_quant_spec q = tllm_config_quant_for(&m->cfg, module);
    if (q.bits == 0 || m->cfg.qmethod != TLLM_QMETHOD_MLX)
        return tllm_fail(TLLM_ERR_FORMAT,
                         "%s: tensor '%s' is quantized but config.json gives no mlx quantization for it",
                         m->dir, name);
    if (cols % q.group_size != 0) /* then rows are whole words: groups are multiples of 16 codes */
        return tllm_fail(TLLM_ERR_FORMAT, "%s: %s: group size %d does not divide the row length %d",
                         m->dir, module, q.group_size, cols);
    static const enum tllm_wformat formats[] = {TLLM_WF_AFFINE, TLLM_WF_MXFP4, TLLM_WF_NVFP4, TLLM_WF_MXFP8};
    const enum tllm_wformat f = formats[q.mode];
    int rc;
    if (f == TLLM_WF_AFFINE) {
        if ((rc = tllm_model_tensor(m, name, 1, 2, rows, cols / q.group_size, &ts))) return rc;
        snprintf(name, sizeof name, "%s.biases", module);
        if ((rc = tllm_model_tensor(m, name, 1, 2, rows, cols / q.group_size, &tb))) return rc;
        if (tb->dtype != ts->dtype)
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has dtype %s but its scales are %s",
                             tb->file, name, tllm_dtype_name(tb->dtype), tllm_dtype_name(ts->dtype));
        /* A NaN or infinite scale/bias would silently turn whole rows of logits into NaN: refuse the file.
         * (Scales and biases are 1/16 of a 4-bit checkpoint; dense weights are not scanned.) */
        if ((rc = tllm_tensor_check_finite(ts, rows, cols / q.group_size)) || (rc = tllm_tensor_check_finite(tb, rows, cols / q.group_size)))
            return rc;
        w->biases = tb->data;
    } else {
        ts = tllm_ckpt_find(m->ckpt, name);
        if (ts->dtype != TLLM_DT_U8)
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected U8 (%s scales)", ts->file, name,
                             tllm_dtype_name(ts->dtype), tllm_qmode_name(q.mode));
        if ((rc = tllm_model_tensor(m, name, 0, 2, rows, cols / q.group_size, &ts))) return rc;
        if ((rc = check_scale_bytes(ts, rows, cols / q.group_size, f))) return rc;
        snprintf(name, sizeof name, "%s.biases", module);
        if (tllm_ckpt_find(m->ckpt, name))
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': %s weights have no biases (is the mode in config.json right?)",
                             m->dir, name, tllm_qmode_name(q.mode));
    }
    snprintf(name, sizeof name, "%s.weight", module);
    if ((rc = tllm_model_tensor(m, name, 0, 2, rows, (int64_t)cols * q.bits / 32, &tw))) return rc;
    if (tw->dtype != TLLM_DT_U32)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected U32 (packed codes)",
                         tw->file, name, tllm_dtype_name(tw->dtype));
    w->format = f;
    w->dtype = ts->dtype;
    w->bits = q.bits;
    w->group_size = q.group_size;
    w->w = tw->data;
    w->scales = ts->data;
    w->name = tw->name;
    return TLLM_OK;
}

static int bind_layer(struct tllm_model *m, int l) {
    const struct tllm_config *c = &m->cfg;
    struct tllm_layer *L = &m->layers[l];
    int q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    char p[128], n[192];
    int rc;
    snprintf(p, sizeof p, "model.layers.%d.", l);
    static const char *const vnames[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
                                         "self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                         "self_attn.v_proj.bias"};
    float *vdst[] = {L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv};
    int vlen[] = {c->dim, c->dim, q_dim, kv_dim, kv_dim};
    for (int i = 0; i < 5; i++) {
        snprintf(n, sizeof n, "%s%s", p, vnames[i]);
        if ((rc = bind_vector(m, n, vlen[i], vdst[i]))) return rc;
    }
    static const char *const lnames[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                         "mlp.down_proj"};
    struct tllm_qweights *ldst[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    int rows[] = {q_dim, kv_dim, kv_dim, c->dim, c->ffn_dim, c->ffn_dim, c->dim};
    int cols[] = {c->dim, c->dim, c->dim, q_dim, c->dim, c->dim, c->ffn_dim};
    for (int i = 0; i < 7; i++) {
        snprintf(n, sizeof n, "%s%s", p, lnames[i]);
        if ((rc = bind_linear(m, n, rows[i], cols[i], ldst[i]))) return rc;
    }
    return TLLM_OK;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int tllm_model_gguf_path(const char *path, char **file) {
    *file = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return TLLM_OK; /* the loader says what is wrong */
    if (S_ISREG(st.st_mode)) {
        if (!tllm_gguf_is_gguf(path) && !ends_with(path, ".gguf")) return TLLM_OK;
        return (*file = strdup(path)) ? TLLM_OK : tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    char *cfg = tllm_path_join(path, "config.json");
    if (!cfg) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    int has_cfg = tllm_path_present(cfg);
    free(cfg);
    DIR *d = has_cfg || !S_ISDIR(st.st_mode) ? NULL : opendir(path);
    if (!d) return TLLM_OK;
    int rc = TLLM_OK;
    struct dirent *e;
    while ((e = readdir(d)) && !rc) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".gguf")) continue;
        if (*file) {
            rc = tllm_fail(TLLM_ERR_ARG, "%s: holds more than one GGUF file and no config.json: name the file to run", path);
            free(*file);
            *file = NULL;
        } else if (!(*file = tllm_path_join(path, e->d_name))) {
            rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        }
    }
    closedir(d);
    return rc;
}

int tllm_model_load(const char *dir, struct tllm_model **out) {
    *out = NULL;
    char *gguf;
    int grc = tllm_model_gguf_path(dir, &gguf);
    if (grc) return grc;
    if (gguf) {
        grc = tllm_model_load_gguf(gguf, out);
        free(gguf);
        return grc;
    }
    struct tllm_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    int rc = tllm_model_dir_check(dir);
    if (rc) {
        free(m->dir);
        free(m);
        return rc;
    }
    char *cfg_path = tllm_path_join(dir, "config.json");
    rc = cfg_path ? tllm_config_load(cfg_path, &m->cfg) : tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    free(cfg_path);
    if (!rc) rc = tllm_ckpt_open(dir, &m->ckpt);
    const struct tllm_config *c = &m->cfg;
    if (!rc) rc = tllm_model_alloc(m);
    if (!rc) rc = bind_linear(m, "model.embed_tokens", c->vocab_size, c->dim, &m->embed);
    for (int l = 0; !rc && l < c->n_layers; l++) rc = bind_layer(m, l);
    if (!rc) rc = bind_vector(m, "model.norm.weight", c->dim, m->final_norm);
    if (!rc) {
        if (c->tie_embeddings)
            m->lm_head = m->embed;
        else
            rc = bind_linear(m, "lm_head", c->vocab_size, c->dim, &m->lm_head);
    }
    if (rc) {
        tllm_model_free(m);
        return rc;
    }
    m->n_sample = c->vocab_size;
    *out = m;
    return TLLM_OK;
}

void tllm_model_free(struct tllm_model *m) {
    if (!m) return;
    tllm_ckpt_close(m->ckpt);
    tllm_gguf_close(m->gguf);
    tllm_config_free(&m->cfg);
    free(m->layers);
    free(m->vectors);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    for (int i = 0; i < m->n_packs; i++) tllm_qpack_free(&m->packs[i]);
    free(m->packs);
    free(m->dir);
    free(m);
}

struct pack_args {
    struct tllm_qweights **ws;
    struct tllm_qpack *packs;
    int n, failed; /* index + 1 of a matrix that did not fit in memory */
};

static void pack_task(void *arg, int ith, int nth) {
    struct pack_args *a = arg;
    for (int i = ith; i < a->n; i += nth)
        if (tllm_qpack_init(&a->packs[i], a->ws[i])) a->failed = i + 1; /* the message is this thread's */
}

int tllm_model_pack(struct tllm_model *m) {
    if (m->n_packs) return TLLM_OK;
    const struct tllm_config *c = &m->cfg;
    int cap = 7 * c->n_layers + 1, n = 0;
    struct tllm_qweights **ws = malloc((size_t)cap * sizeof *ws);
    struct tllm_qpack *packs = calloc((size_t)cap, sizeof *packs);
    if (!ws || !packs) {
        free(ws);
        free(packs);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    for (int l = 0; l < c->n_layers; l++) {
        struct tllm_layer *L = &m->layers[l];
        struct tllm_qweights *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            if (tllm_qpack_supported(lw[i])) ws[n++] = lw[i];
    }
    if (tllm_qpack_supported(&m->lm_head)) ws[n++] = &m->lm_head;
    struct pack_args a = {ws, packs, n, 0};
    tllm_parallel(pack_task, &a);
    m->packs = packs;
    m->n_packs = n; /* freed with the model even when one failed */
    int rc = TLLM_OK;
    if (a.failed)
        rc = tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory packing weights for int8 activations", ws[a.failed - 1]->name);
    else
        for (int i = 0; i < n; i++) ws[i]->pack = &packs[i];
    free(ws);
    return rc;
}

size_t tllm_model_file_bytes(const struct tllm_model *m) {
    if (m->ckpt) return m->ckpt->total_bytes;
    size_t b = 0;
    for (int i = 0; m->gguf && i < m->gguf->n_tensors; i++) b += m->gguf->tensors[i].nbytes;
    return b;
}

/* Bytes of w one decoded token reads: as packed for the CPU's int8 path (packed, where it is), else as stored */
static size_t read_bytes(const struct tllm_qweights *w, int packed) {
    return packed && w->pack ? tllm_qpack_nbytes(w->pack) : tllm_qw_nbytes(w);
}

size_t tllm_model_bytes_per_token(const struct tllm_model *m, int packed) {
    size_t b = read_bytes(&m->lm_head, packed) + tllm_qw_nbytes(&m->embed) / (size_t)m->cfg.vocab_size;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct tllm_layer *L = &m->layers[l];
        b += read_bytes(&L->wq, packed) + read_bytes(&L->wk, packed) + read_bytes(&L->wv, packed) + read_bytes(&L->wo, packed) +
             read_bytes(&L->w_gate, packed) + read_bytes(&L->w_up, packed) + read_bytes(&L->w_down, packed);
    }
    return b;
}

double tllm_model_bits_per_weight(const struct tllm_model *m, int packed) {
    double bits = 8.0 * (double)read_bytes(&m->lm_head, packed), n = (double)m->lm_head.rows * m->lm_head.cols;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct tllm_layer *L = &m->layers[l];
        const struct tllm_qweights *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) bits += 8.0 * (double)read_bytes(ws[i], packed), n += (double)ws[i]->rows * ws[i]->cols;
    }
    return bits / n;
}

size_t tllm_model_n_params(const struct tllm_model *m) {
    const struct tllm_config *c = &m->cfg;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t per_layer = 2 * (size_t)c->dim + (q_dim + 2 * kv_dim) * ((size_t)c->dim + 1) +
                       q_dim * (size_t)c->dim + 3 * (size_t)c->dim * (size_t)c->ffn_dim;
    size_t n = (size_t)c->n_layers * per_layer + (size_t)c->dim + (size_t)c->vocab_size * c->dim;
    if (!c->tie_embeddings) n += (size_t)c->vocab_size * c->dim;
    return n;
}
