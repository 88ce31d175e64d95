/* Synthetic checkpoints: random weights at a real model's shapes, written straight in MLX's
 * quantized layout, so benchmarks run at the true sizes without real weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/load/checkpoint.h"
#include "engine/convert/convert.h"
#include "engine/convert/convert_util.h"
#include "base/error.h"
#include "base/json_util.h"
#include "engine/convert/st_writer.h"

static uint64_t next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static float uniform(uint64_t *s) { return (float)(next(s) >> 40) / 16777216.0f; } /* [0, 1) */

#define WEIGHT_RANGE 0.035f /* dequantized weights uniform in +-this: std 0.02, as initializers use */

/* Fill n bytes of a tensor of kind `kind` with random data. */
enum fill { FILL_CODES, FILL_SCALES, FILL_BIASES, FILL_DENSE, FILL_ONES, FILL_SMALL };

static void fill(void *buf, size_t n_elems, enum fill kind, int bits, uint64_t *s) {
    uint16_t *h = buf;
    float levels = (float)((1 << bits) - 1);
    for (size_t i = 0; i < n_elems; i++) {
        switch (kind) {
        case FILL_CODES: ((uint32_t *)buf)[i] = (uint32_t)(next(s) >> 32); break;
        case FILL_SCALES: h[i] = tllm_f32_to_bf16(2.0f * WEIGHT_RANGE / levels * (0.75f + 0.5f * uniform(s))); break;
        case FILL_BIASES: h[i] = tllm_f32_to_bf16(-WEIGHT_RANGE * (0.75f + 0.5f * uniform(s))); break;
        case FILL_DENSE: h[i] = tllm_f32_to_bf16(WEIGHT_RANGE * (2.0f * uniform(s) - 1.0f)); break;
        case FILL_ONES: h[i] = tllm_f32_to_bf16(0.9f + 0.2f * uniform(s)); break;
        case FILL_SMALL: h[i] = tllm_f32_to_bf16(0.1f * (2.0f * uniform(s) - 1.0f)); break;
        }
    }
}

struct synth_tensor {
    struct tllm_st_spec spec;
    enum fill kind;
};

static void add_vec(struct synth_tensor *t, int *n, const char *name, int len, enum fill kind) {
    struct synth_tensor *x = &t[(*n)++];
    x->spec = (struct tllm_st_spec){.dtype = TLLM_DT_BF16, .ndim = 1, .shape = {len}};
    snprintf(x->spec.name, sizeof x->spec.name, "%s", name);
    x->kind = kind;
}

static void add_linear(struct synth_tensor *t, int *n, const char *module, int rows, int cols, int bits, int gs) {
    if (bits == 0) {
        struct synth_tensor *x = &t[(*n)++];
        x->spec = (struct tllm_st_spec){.dtype = TLLM_DT_BF16, .ndim = 2, .shape = {rows, cols}};
        snprintf(x->spec.name, sizeof x->spec.name, "%s.weight", module);
        x->kind = FILL_DENSE;
        return;
    }
    static const char *const sfx[] = {"weight", "scales", "biases"};
    static const enum fill kinds[] = {FILL_CODES, FILL_SCALES, FILL_BIASES};
    for (int s = 0; s < 3; s++) {
        struct synth_tensor *x = &t[(*n)++];
        x->spec = (struct tllm_st_spec){.dtype = s ? TLLM_DT_BF16 : TLLM_DT_U32, .ndim = 2,
                                        .shape = {rows, s ? cols / gs : cols * bits / 32}};
        snprintf(x->spec.name, sizeof x->spec.name, "%s.%s", module, sfx[s]);
        x->kind = kinds[s];
    }
}

int tllm_synth_checkpoint(const char *config_path, const char *out_dir, const struct tllm_synth_opts *o) {
    if (o->bits != 0 && !tllm_quant_supported(o->bits, o->group_size))
        return tllm_fail(TLLM_ERR_ARG, "bits=%d group_size=%d is not supported (bits 0 for bf16, 2, 4, 8; group size "
                         "32, 64, 128)", o->bits, o->group_size);
    struct tllm_config c;
    int rc = tllm_config_load(config_path, &c);
    if (rc) return rc;
    if (o->bits && (c.dim % o->group_size || c.ffn_dim % o->group_size || (c.n_heads * c.head_dim) % o->group_size)) {
        tllm_config_free(&c);
        return tllm_fail(TLLM_ERR_ARG, "%s: the model's dimensions are not multiples of the group size %d",
                         config_path, o->group_size);
    }
    int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
    int cap = 4 + c.n_layers * 32, n = 0;
    struct synth_tensor *t = calloc((size_t)cap, sizeof *t);
    struct json_object *jcfg = NULL;
    char *st_path = NULL;
    if (!t) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    if (!rc) {
        char name[192];
        add_linear(t, &n, "model.embed_tokens", c.vocab_size, c.dim, o->bits, o->group_size);
        for (int l = 0; l < c.n_layers; l++) {
            static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                              "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
            int rows[] = {q_dim, kv_dim, kv_dim, c.dim, c.ffn_dim, c.ffn_dim, c.dim};
            int cols[] = {c.dim, c.dim, c.dim, q_dim, c.dim, c.dim, c.ffn_dim};
            for (int i = 0; i < 7; i++) {
                snprintf(name, sizeof name, "model.layers.%d.%s", l, lin[i]);
                add_linear(t, &n, name, rows[i], cols[i], o->bits, o->group_size);
            }
            static const char *const bias[] = {"q_proj", "k_proj", "v_proj"};
            int blen[] = {q_dim, kv_dim, kv_dim};
            for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.bias", l, bias[i]);
                add_vec(t, &n, name, blen[i], FILL_SMALL);
            }
            snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
            add_vec(t, &n, name, c.dim, FILL_ONES);
            snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
            add_vec(t, &n, name, c.dim, FILL_ONES);
        }
        add_vec(t, &n, "model.norm.weight", c.dim, FILL_ONES);
        if (!c.tie_embeddings) add_linear(t, &n, "lm_head", c.vocab_size, c.dim, o->bits, o->group_size);
    }
    if (!rc) rc = tllm_prepare_out_dir(out_dir, o->force);
    if (!rc) rc = tllm_json_load_file(config_path, TLLM_CONFIG_MAX_BYTES, &jcfg);
    if (!rc) {
        json_object_object_del(jcfg, "quantization");
        json_object_object_del(jcfg, "quantization_config");
        if (o->bits) tllm_config_set_quantization(jcfg, &(struct tllm_quant_spec){o->bits, o->group_size, TLLM_QM_AFFINE}, NULL, NULL, 0);
        rc = tllm_write_json(out_dir, "config.json", jcfg);
    }
    if (!rc && o->tokenizer_dir) rc = tllm_copy_aux_files(o->tokenizer_dir, out_dir);
    if (!rc && !(st_path = tllm_path_join(out_dir, "model.safetensors"))) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    struct tllm_st_writer w;
    struct tllm_st_spec *specs = rc ? NULL : calloc((size_t)n, sizeof *specs);
    if (!rc && !specs) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) specs[i] = t[i].spec;
    if (!rc) rc = tllm_st_writer_open(&w, st_path, specs, n);
    uint64_t state = o->seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    enum { CHUNK = 1 << 20 };
    void *buf = rc ? NULL : malloc(CHUNK * 4);
    if (!rc && !buf) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        size_t esz = tllm_dtype_size(t[i].spec.dtype), elems = tllm_st_spec_nbytes(&t[i].spec) / esz;
        for (size_t done = 0; done < elems && !rc; done += CHUNK) {
            size_t k = elems - done < CHUNK ? elems - done : CHUNK;
            fill(buf, k, t[i].kind, o->bits, &state);
            rc = tllm_st_writer_write(&w, buf, k * esz);
        }
        if (rc) tllm_st_writer_abort(&w);
    }
    if (!rc) rc = tllm_st_writer_close(&w);
    free(buf);
    free(specs);
    free(st_path);
    if (jcfg) json_object_put(jcfg);
    free(t);
    tllm_config_free(&c);
    return rc;
}
