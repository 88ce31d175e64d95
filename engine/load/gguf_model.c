/* A Qwen2 model from a GGUF file: the config from its qwen2.* keys, every weight bound by llama.cpp's
 * tensor names (token_embd, blk.N.attn_q, ..., output_norm, output) and mapped onto tllm's layouts by
 * ggml_types.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threadpool.h"
#include "engine/load/ggml_types.h"
#include "engine/load/gguf.h"
#include "engine/load/model.h"

static const struct tllm_gguf_tensor *find(const struct tllm_model *m, const char *name, int *rc) {
    const struct tllm_gguf_tensor *t = tllm_gguf_find_tensor(m->gguf, name);
    if (!t) *rc = tllm_fail(TLLM_ERR_FORMAT, "%s: missing tensor '%s'", m->gguf->path, name);
    return t;
}

/* One matrix to map: found and shape-checked first (in order, so the first bad tensor is the one named),
 * then converted on the thread pool (the conversion is most of a GGUF's load time) */
struct job {
    const struct tllm_gguf_tensor *t;
    struct tllm_qweights *w;
    void *owned[2];
    int rc;
    char err[512];
};

struct jobs {
    struct job *j;
    int n, cap;
    const char *path;
};

static int add_matrix(struct tllm_model *m, struct jobs *js, const char *name, int rows, int cols, struct tllm_qweights *w) {
    int rc = TLLM_OK;
    const struct tllm_gguf_tensor *t = find(m, name, &rc);
    if (rc) return rc;
    if (t->n_dims != 2 || t->ne[1] != rows || t->ne[0] != cols)
        return tllm_fail(TLLM_ERR_FORMAT,
                         "%s: tensor '%s' has ne [%lld, %lld] (%d dimensions) but the model's keys imply [%d, %d] "
                         "(%d inputs, %d outputs)", m->gguf->path, name, (long long)t->ne[0], (long long)t->ne[1],
                         t->n_dims, cols, rows, cols, rows);
    if (js->n == js->cap) {
        int cap = js->cap ? 2 * js->cap : 64;
        struct job *nj = realloc(js->j, (size_t)cap * sizeof *nj);
        if (!nj) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        js->j = nj, js->cap = cap;
    }
    js->j[js->n++] = (struct job){t, w, {NULL, NULL}, TLLM_OK, ""};
    return TLLM_OK;
}

static void convert_task(void *arg, int ith, int nth) {
    struct jobs *js = arg;
    for (int i = ith; i < js->n; i += nth) {
        struct job *j = &js->j[i];
        j->rc = tllm_ggml_bind(j->t->name, j->t->type, j->t->ne[1], j->t->ne[0], j->t->data, js->path, j->w, j->owned);
        if (j->rc) snprintf(j->err, sizeof j->err, "%s", tllm_errmsg()); /* this thread's message */
    }
}

/* Convert every job; the model owns what they made, whatever happened; the first failure is reported */
static int run_jobs(struct tllm_model *m, struct jobs *js) {
    js->path = m->gguf->path;
    tllm_parallel(convert_task, js);
    int rc = TLLM_OK;
    for (int i = 0; i < js->n; i++) {
        struct job *j = &js->j[i];
        for (int k = 0; k < 2; k++) {
            int r = j->owned[k] ? tllm_model_own(m, j->owned[k]) : TLLM_OK;
            if (r && !rc) rc = r;
        }
        if (j->rc && !rc) rc = tllm_fail(j->rc, "%s", j->err);
    }
    return rc;
}

static int bind_vector(struct tllm_model *m, const char *name, int len, float *dst) {
    int rc = TLLM_OK;
    const struct tllm_gguf_tensor *t = find(m, name, &rc);
    if (rc) return rc;
    if (t->n_dims != 1 || t->ne[0] != len)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, ne0 %lld, but the model's keys imply [%d]",
                         m->gguf->path, name, t->n_dims, (long long)t->ne[0], len);
    enum tllm_dtype dt = tllm_ggml_dense_dtype(t->type);
    if (dt == TLLM_DT_INVALID) {
        const struct tllm_ggml_type *ty = tllm_ggml_type(t->type);
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, expected F32, F16 or BF16", m->gguf->path, name,
                         ty ? ty->name : "?");
    }
    tllm_convert_to_f32(t->data, dt, dst, (size_t)len);
    for (int i = 0; i < len; i++)
        if (!isfinite(dst[i]))
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has a non-finite value (%g) at [%d]", m->gguf->path, name,
                             dst[i], i);
    return TLLM_OK;
}

/* The qwen2.* keys llama.cpp writes, checked as config.json is (config.c) */
static int read_config(struct tllm_gguf *g, struct tllm_config *c) {
    const char *arch = NULL, *rs = NULL;
    int rc = tllm_gguf_get_str(g, "general.architecture", &arch);
    if (!rc && !arch) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: missing key 'general.architecture'", g->path);
    if (!rc && strcmp(arch, "qwen2"))
        rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: general.architecture '%s' is not supported (tllm runs qwen2 models)", g->path,
                       arch);
    if (!rc) rc = tllm_gguf_get_str(g, "qwen2.rope.scaling.type", &rs);
    if (!rc && rs && strcmp(rs, "none"))
        rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: qwen2.rope.scaling.type '%s' is not supported", g->path, rs);
    if (rc) return rc;
    static const struct {
        const char *key;
        int64_t lo, hi;
        int optional;
    } ints[] = {
        {"qwen2.embedding_length", 1, 1 << 16, 0},     {"qwen2.block_count", 1, 1024, 0},
        {"qwen2.attention.head_count", 1, 1024, 0},    {"qwen2.attention.head_count_kv", 1, 1024, 1},
        {"qwen2.feed_forward_length", 1, 1 << 20, 0},  {"qwen2.context_length", 1, 1 << 24, 1},
        {"qwen2.attention.key_length", 2, 1024, 1},
    };
    int64_t v[7];
    for (int i = 0; i < 7 && !rc; i++) {
        int found;
        rc = tllm_gguf_get_int(g, ints[i].key, ints[i].lo, ints[i].hi, -1, &v[i], &found);
        if (!rc && !found && !ints[i].optional) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: missing key '%s'", g->path, ints[i].key);
    }
    if (rc) return rc;
    c->dim = (int)v[0], c->n_layers = (int)v[1], c->n_heads = (int)v[2];
    c->n_kv_heads = v[3] < 0 ? c->n_heads : (int)v[3];
    c->ffn_dim = (int)v[4];
    c->max_pos = v[5] < 0 ? 32768 : (int)v[5];
    c->head_dim = v[6] < 0 ? c->dim / c->n_heads : (int)v[6];
    if (c->n_heads % c->n_kv_heads)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: qwen2.attention.head_count (%d) is not a multiple of head_count_kv (%d)",
                         g->path, c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 || (v[6] < 0 && c->dim % c->n_heads))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: the head size must be even and divide qwen2.embedding_length", g->path);
    int64_t vv;
    if ((rc = tllm_gguf_get_int(g, "qwen2.attention.value_length", 2, 1024, c->head_dim, &vv, NULL))) return rc;
    if (vv != c->head_dim)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: qwen2.attention.value_length %lld differs from the key length %d", g->path,
                         (long long)vv, c->head_dim);
    double d;
    if ((rc = tllm_gguf_get_num(g, "qwen2.attention.layer_norm_rms_epsilon", 0, 1, 1e-6, &d, NULL))) return rc;
    c->norm_eps = (float)d;
    if ((rc = tllm_gguf_get_num(g, "qwen2.rope.freq_base", 1, 1e12, 10000.0, &d, NULL))) return rc;
    c->rope_theta = (float)d;
    int64_t bos, eos;
    if ((rc = tllm_gguf_get_int(g, "tokenizer.ggml.bos_token_id", 0, (1 << 24) - 1, -1, &bos, NULL)) ||
        (rc = tllm_gguf_get_int(g, "tokenizer.ggml.eos_token_id", 0, (1 << 24) - 1, -1, &eos, NULL)))
        return rc;
    c->bos_id = (int)bos, c->eos_id = (int)eos;
    /* vocab_size from the embedding (llama.cpp writes no key for it), tied when there is no output.weight */
    const struct tllm_gguf_tensor *emb = tllm_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return tllm_fail(TLLM_ERR_FORMAT, "%s: missing tensor 'token_embd.weight'", g->path);
    if (emb->n_dims != 2 || emb->ne[1] < 1 || emb->ne[1] > (1 << 24))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor 'token_embd.weight' is not a [dim, vocab] matrix", g->path);
    c->vocab_size = (int)emb->ne[1];
    c->tie_embeddings = tllm_gguf_find_tensor(g, "output.weight") == NULL;
    return TLLM_OK;
}

static int bind_layer(struct tllm_model *m, struct jobs *js, int l) {
    const struct tllm_config *c = &m->cfg;
    struct tllm_layer *L = &m->layers[l];
    const int q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    char n[96];
    int rc;
    static const char *const vnames[] = {"attn_norm.weight", "ffn_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias"};
    float *vdst[] = {L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv};
    const int vlen[] = {c->dim, c->dim, q_dim, kv_dim, kv_dim};
    for (int i = 0; i < 5; i++) {
        snprintf(n, sizeof n, "blk.%d.%s", l, vnames[i]);
        if ((rc = bind_vector(m, n, vlen[i], vdst[i]))) return rc;
    }
    static const char *const lnames[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    struct tllm_qweights *ldst[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    const int rows[] = {q_dim, kv_dim, kv_dim, c->dim, c->ffn_dim, c->ffn_dim, c->dim};
    const int cols[] = {c->dim, c->dim, c->dim, q_dim, c->dim, c->dim, c->ffn_dim};
    for (int i = 0; i < 7; i++) {
        snprintf(n, sizeof n, "blk.%d.%s.weight", l, lnames[i]);
        if ((rc = add_matrix(m, js, n, rows[i], cols[i], ldst[i]))) return rc;
    }
    return TLLM_OK;
}

int tllm_model_load_gguf(const char *path, struct tllm_model **out) {
    *out = NULL;
    struct tllm_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(path))) {
        free(m);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    int rc = tllm_gguf_open(path, &m->gguf);
    if (!rc) rc = read_config(m->gguf, &m->cfg);
    const struct tllm_config *c = &m->cfg;
    if (!rc) rc = tllm_model_alloc(m);
    struct jobs js = {0};
    if (!rc) rc = add_matrix(m, &js, "token_embd.weight", c->vocab_size, c->dim, &m->embed);
    for (int l = 0; !rc && l < c->n_layers; l++) rc = bind_layer(m, &js, l);
    if (!rc) rc = bind_vector(m, "output_norm.weight", c->dim, m->final_norm);
    if (!rc && !c->tie_embeddings) rc = add_matrix(m, &js, "output.weight", c->vocab_size, c->dim, &m->lm_head);
    if (!rc) rc = run_jobs(m, &js);
    free(js.j);
    if (!rc && c->tie_embeddings) m->lm_head = m->embed;
    if (!rc) {
        char extra[96];
        snprintf(extra, sizeof extra, "blk.%d.attn_norm.weight", c->n_layers);
        if (tllm_gguf_find_tensor(m->gguf, extra))
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' is past qwen2.block_count (%d)", path, extra, c->n_layers);
    }
    if (rc) {
        tllm_model_free(m);
        return rc;
    }
    m->n_sample = c->vocab_size;
    *out = m;
    return TLLM_OK;
}
