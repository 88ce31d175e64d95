#include "engine/load/config.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/error.h"
#include "engine/base/json_util.h"

int tllm_quant_supported(int bits, int group_size) {
    return (bits == 2 || bits == 4 || bits == 8) &&
           (group_size == 32 || group_size == 64 || group_size == 128);
}

static int parse_spec(struct json_object *o, const char *what, struct tllm_quant_spec *s,
                      const char *path) {
    int64_t bits, gs;
    int rc = tllm_json_int(o, "bits", 1, 16, 0, 0, &bits, path);
    if (!rc) rc = tllm_json_int(o, "group_size", 1, 1 << 20, 0, 0, &gs, path);
    if (rc) {
        tllm_errctx("%s", what);
        return rc;
    }
    if (!tllm_quant_supported((int)bits, (int)gs))
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: %s: bits=%lld group_size=%lld is not supported (bits 2, 4, 8; group "
                         "size 32, 64, 128)",
                         path, what, (long long)bits, (long long)gs);
    s->bits = (int)bits;
    s->group_size = (int)gs;
    return TLLM_OK;
}

static int parse_quantization(struct json_object *q, struct tllm_config *c, const char *path) {
    if (!json_object_is_type(q, json_type_object))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: \"quantization\" must be an object", path);
    const char *mode;
    int rc = tllm_json_str(q, "mode", &mode, path);
    if (rc) return rc;
    if (mode && strcmp(mode, "affine") != 0)
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: quantization mode '%s' is not supported (only 'affine')", path, mode);
    rc = parse_spec(q, "quantization", &c->quant, path);
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
            rc = parse_spec(val, key, &ov->spec, path);
            if (rc) return rc;
        } else {
            continue; /* unknown scalar keys (e.g. future options) are ignored */
        }
        if (!(ov->module = strdup(key))) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        c->n_overrides++;
    }
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
