#include "engine/load/config.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"
#include "base/json_util.h"

int tllm_quant_supported(int bits, int group_size) {
    return bits >= 1 && bits <= 8 && bits != 7 && (group_size == 32 || group_size == 64 || group_size == 128);
}

int tllm_quant_mode_supported(enum tllm_qmode mode, int bits, int group_size) {
    switch (mode) {
    case TLLM_QM_AFFINE: return tllm_quant_supported(bits, group_size);
    case TLLM_QM_MXFP4: return bits == 4 && group_size == 32;
    case TLLM_QM_NVFP4: return bits == 4 && group_size == 16;
    case TLLM_QM_MXFP8: return bits == 8 && group_size == 32;
    }
    return 0;
}

static const char *const qmode_names[] = {"affine", "mxfp4", "nvfp4", "mxfp8"};

const char *tllm_qmode_name(enum tllm_qmode mode) {
    return (unsigned)mode < 4 ? qmode_names[mode] : "?";
}

int tllm_qmode_parse(const char *s) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, qmode_names[i])) return i;
    return -1;
}

/* mlx.core.quantize's defaults when bits or group_size is left out */
static const int mode_bits[] = {4, 4, 4, 8}, mode_group[] = {64, 32, 16, 32};

void tllm_qmode_defaults(enum tllm_qmode mode, int *bits, int *group_size) {
    *bits = mode_bits[mode];
    *group_size = mode_group[mode];
}

static int parse_spec(struct json_object *o, const char *what, enum tllm_qmode dflt_mode, struct tllm_quant_spec *s,
                      const char *path) {
    const char *mode_s = NULL;
    int rc = tllm_json_str(o, "mode", &mode_s, path);
    int mode = mode_s ? tllm_qmode_parse(mode_s) : (int)dflt_mode;
    if (!rc && mode < 0)
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: %s: quantization mode '%s' is not supported (affine, mxfp4, nvfp4, mxfp8 are)", path,
                         what, mode_s);
    int64_t bits = 0, gs = 0;
    if (!rc) rc = tllm_json_int(o, "bits", 1, 16, 1, mode_bits[mode], &bits, path);
    if (!rc) rc = tllm_json_int(o, "group_size", 1, 1 << 20, 1, mode_group[mode], &gs, path);
    if (rc) {
        tllm_errctx("%s", what);
        return rc;
    }
    if (!tllm_quant_mode_supported((enum tllm_qmode)mode, (int)bits, (int)gs))
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: %s: bits=%lld group_size=%lld is not supported for mode %s (affine: bits 1-6 or 8, group "
                         "size 32, 64, 128; mxfp4: 4 and 32; nvfp4: 4 and 16; mxfp8: 8 and 32)",
                         path, what, (long long)bits, (long long)gs, qmode_names[mode]);
    s->bits = (int)bits;
    s->group_size = (int)gs;
    s->mode = (enum tllm_qmode)mode;
    return TLLM_OK;
}

/* GPTQ and AWQ (transformers' quantization_config): one spec for every quantized module */
static int parse_gptq_awq(struct json_object *q, const char *method, struct tllm_config *c, const char *path) {
    int64_t bits, gs;
    int rc = tllm_json_int(q, "bits", 1, 16, 0, 0, &bits, path);
    if (!rc) rc = tllm_json_int(q, "group_size", -1, 1 << 20, 1, 128, &gs, path);
    if (rc) {
        tllm_errctx("quantization_config");
        return rc;
    }
    if (!strcmp(method, "gptq")) {
        c->qmethod = TLLM_QMETHOD_GPTQ;
        if (bits != 2 && bits != 4 && bits != 8)
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: quantization_config: GPTQ with bits=%lld is not supported (2, 4, 8 are)",
                             path, (long long)bits);
        const char *fmt = NULL;
        rc = tllm_json_bool(q, "desc_act", 1, 0, &c->gptq_desc_act, path);
        if (!rc) rc = tllm_json_str(q, "checkpoint_format", &fmt, path);
        if (rc) return rc;
        if (fmt && strcmp(fmt, "gptq") && strcmp(fmt, "gptq_v2"))
            return tllm_fail(TLLM_ERR_UNSUPPORTED,
                             "%s: quantization_config: GPTQ checkpoint_format '%s' is not supported (gptq, gptq_v2 are)", path, fmt);
        c->gptq_zero_offset = !fmt || !strcmp(fmt, "gptq");
    } else {
        c->qmethod = TLLM_QMETHOD_AWQ;
        const char *version = NULL;
        int zero_point = 1;
        rc = tllm_json_str(q, "version", &version, path);
        if (!rc) rc = tllm_json_bool(q, "zero_point", 1, 1, &zero_point, path);
        if (rc) return rc;
        if (bits != 4)
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: quantization_config: AWQ with bits=%lld is not supported (4 is)", path,
                             (long long)bits);
        if (version && strcasecmp(version, "gemm"))
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: quantization_config: AWQ version '%s' is not supported (gemm is)", path,
                             version);
        if (!zero_point)
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: quantization_config: AWQ without zero points is not supported", path);
    }
    if (gs != -1 && (gs < 32 || gs % 32))
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: quantization_config: %s group_size %lld is not supported (-1 or a multiple of 32 are)", path,
                         method, (long long)gs);
    c->quant = (struct tllm_quant_spec){(int)bits, gs == -1 ? 0 : (int)gs, TLLM_QM_AFFINE};
    return TLLM_OK;
}

static int parse_quantization(struct json_object *q, struct tllm_config *c, const char *path) {
    if (!json_object_is_type(q, json_type_object))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: \"quantization\" must be an object", path);
    const char *method = NULL;
    int rc = tllm_json_str(q, "quant_method", &method, path);
    if (rc) return rc;
    if (method && (!strcmp(method, "gptq") || !strcmp(method, "awq"))) return parse_gptq_awq(q, method, c, path);
    if (method && strcmp(method, "mlx"))
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: quantization_config: quant_method '%s' is not supported (mlx, gptq, awq are)", path, method);
    rc = parse_spec(q, "quantization", TLLM_QM_AFFINE, &c->quant, path);
    if (rc) return rc;
    int n = json_object_object_length(q);
    c->overrides = calloc((size_t)n + 1, sizeof *c->overrides);
    if (!c->overrides) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    json_object_object_foreach(q, key, val) {
        if (!strcmp(key, "bits") || !strcmp(key, "group_size") || !strcmp(key, "mode")) continue;
        struct tllm_quant_override *ov = &c->overrides[c->n_overrides];
        if (json_object_is_type(val, json_type_boolean) && !json_object_get_boolean(val)) {
            ov->spec.bits = 0; /* mlx-lm writes `false` for a module left unquantized */
        } else if (json_object_is_type(val, json_type_object)) {
            /* an override without a mode is affine, as mlx.nn.quantize passes the dict to to_quantized */
            rc = parse_spec(val, key, TLLM_QM_AFFINE, &ov->spec, path);
            if (rc) return rc;
        } else {
            continue; /* unknown scalar keys (e.g. future options) are ignored */
        }
        if (!(ov->module = strdup(key))) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        c->n_overrides++;
    }
    return TLLM_OK;
}

/* Qwen2's sliding window as transformers reads it: layers from max_window_layers on (or those that
 * layer_types calls "sliding_attention") attend to the sliding_window positions before each query
 * (key j seen by query i when i - j < window) if use_sliding_window. Within a context of at most the
 * window that is full attention, so the context is capped there and the model stays exact. */
static int sliding_window(const struct json_object *root, struct tllm_config *c, const char *path) {
    int use = 0;
    int64_t window = 0, from = 0;
    struct json_object *lt;
    int rc = tllm_json_bool(root, "use_sliding_window", 1, 0, &use, path);
    if (!rc) rc = tllm_json_int(root, "sliding_window", 1, INT32_MAX, 1, 0, &window, path);
    if (!rc) rc = tllm_json_int(root, "max_window_layers", 0, INT32_MAX, 1, 28, &from, path);
    if (rc || !use || !window) return rc;
    int windowed = from < c->n_layers;
    if (json_object_object_get_ex(root, "layer_types", &lt) && json_object_is_type(lt, json_type_array)) {
        windowed = 0;
        for (size_t i = 0; i < json_object_array_length(lt); i++) {
            const char *t = json_object_get_string(json_object_array_get_idx(lt, i));
            windowed |= t && !strcmp(t, "sliding_attention");
        }
    }
    if (!windowed) return TLLM_OK;
    c->sliding_window = (int)window;
    if (c->max_pos > window) c->max_pos = (int)window;
    return TLLM_OK;
}

int tllm_config_load(const char *path, struct tllm_config *c) {
    memset(c, 0, sizeof *c);
    struct json_object *root;
    int rc = tllm_json_load_file(path, TLLM_CONFIG_MAX_BYTES, &root);
    if (rc) return rc;
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const char *mt = NULL;
    rc = tllm_json_str(root, "model_type", &mt, path);
    if (!rc && !mt) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: missing \"model_type\"", path);
    if (!rc && strcmp(mt, "qwen2") != 0)
        rc = tllm_fail(TLLM_ERR_UNSUPPORTED,
                       "%s: model_type '%s' is not supported (tllm runs qwen2 models)", path, mt);
    const char *act = NULL;
    if (!rc) rc = tllm_json_str(root, "hidden_act", &act, path);
    if (!rc && act && strcmp(act, "silu") != 0)
        rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (only silu)",
                       path, act);
    struct json_object *rs;
    if (!rc && json_object_object_get_ex(root, "rope_scaling", &rs) &&
        !json_object_is_type(rs, json_type_null))
        rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: rope_scaling is not supported", path);

    int64_t v[8];
    static const struct {
        const char *key;
        int64_t lo, hi;
        int optional;
        int64_t dflt; /* -1: num_key_value_heads defaults to num_attention_heads */
    } ints[] = {
        {"hidden_size", 1, 1 << 16, 0, 0},
        {"num_hidden_layers", 1, 1024, 0, 0},
        {"num_attention_heads", 1, 1024, 0, 0},
        {"num_key_value_heads", 1, 1024, 1, -1},
        {"intermediate_size", 1, 1 << 20, 0, 0},
        {"vocab_size", 1, 1 << 24, 0, 0},
        {"max_position_embeddings", 1, 1 << 24, 1, 32768},
    };
    for (int i = 0; i < 7 && !rc; i++)
        rc = tllm_json_int(root, ints[i].key, ints[i].lo, ints[i].hi, ints[i].optional,
                           ints[i].dflt, &v[i], path);
    if (!rc) {
        c->dim = (int)v[0];
        c->n_layers = (int)v[1];
        c->n_heads = (int)v[2];
        c->n_kv_heads = v[3] < 0 ? c->n_heads : (int)v[3];
        c->ffn_dim = (int)v[4];
        c->vocab_size = (int)v[5];
        c->max_pos = (int)v[6];
        rc = tllm_json_int(root, "head_dim", 2, 1024, 1, c->dim / c->n_heads, &v[7], path);
        c->head_dim = (int)v[7];
    }
    if (!rc && c->n_heads % c->n_kv_heads != 0)
        rc = tllm_fail(TLLM_ERR_FORMAT,
                       "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                       path, c->n_heads, c->n_kv_heads);
    if (!rc && (c->head_dim % 2 != 0 || (!json_object_object_get_ex(root, "head_dim", NULL) &&
                                         c->dim % c->n_heads != 0)))
        rc = tllm_fail(TLLM_ERR_FORMAT, "%s: head_dim must be even and divide hidden_size", path);
    if (!rc) rc = sliding_window(root, c, path);
    double d = 0;
    if (!rc) rc = tllm_json_num(root, "rms_norm_eps", 0, 1, 1, 1e-6, &d, path);
    c->norm_eps = (float)d;
    if (!rc) rc = tllm_json_num(root, "rope_theta", 1, 1e12, 1, 10000.0, &d, path);
    /* transformers >= 5 writes {"rope_parameters": {"rope_theta": ..., "rope_type": "default"}} */
    struct json_object *rp;
    if (!rc && json_object_object_get_ex(root, "rope_parameters", &rp) && !json_object_is_type(rp, json_type_null)) {
        const char *rt = NULL;
        if (!json_object_is_type(rp, json_type_object))
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: \"rope_parameters\" is not an object", path);
        if (!rc) rc = tllm_json_str(rp, "rope_type", &rt, path);
        if (!rc && rt && strcmp(rt, "default") != 0)
            rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: rope_parameters.rope_type '%s' is not supported (only default)",
                           path, rt);
        if (!rc) rc = tllm_json_num(rp, "rope_theta", 1, 1e12, 1, d, &d, path);
    }
    c->rope_theta = (float)d;
    if (!rc) rc = tllm_json_bool(root, "tie_word_embeddings", 1, 0, &c->tie_embeddings, path);
    int64_t bos = -1, eos = -1;
    if (!rc) rc = tllm_json_int(root, "bos_token_id", 0, 1 << 24, 1, -1, &bos, path);
    struct json_object *eo;
    if (!rc && json_object_object_get_ex(root, "eos_token_id", &eo) &&
        json_object_is_type(eo, json_type_int))
        eos = json_object_get_int64(eo);
    c->bos_id = (int)bos;
    c->eos_id = eos >= 0 && eos < (1 << 24) ? (int)eos : -1;

    struct json_object *q = NULL;
    if (!rc && (json_object_object_get_ex(root, "quantization", &q) ||
                json_object_object_get_ex(root, "quantization_config", &q)) &&
        !json_object_is_type(q, json_type_null))
        rc = parse_quantization(q, c, path);
    json_object_put(root);
    if (rc) tllm_config_free(c);
    return rc;
}

void tllm_config_free(struct tllm_config *c) {
    for (int i = 0; i < c->n_overrides; i++) free(c->overrides[i].module);
    free(c->overrides);
    c->overrides = NULL;
    c->n_overrides = 0;
}

struct tllm_quant_spec tllm_config_quant_for(const struct tllm_config *c, const char *module) {
    for (int i = 0; i < c->n_overrides; i++)
        if (strcmp(c->overrides[i].module, module) == 0) return c->overrides[i].spec;
    return c->quant;
}
