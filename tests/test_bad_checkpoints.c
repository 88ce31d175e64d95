/* Malformed checkpoints: each is refused with a clear message naming the file (and tensor), and
 * nothing crashes (this suite also runs under ASan/UBSan). */
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"
#include "engine/load/config.h"
#include "base/error.h"
#include "engine/load/model.h"

static char tmpdir[256];
static const char *good; /* a good q4-g64 model directory */

static void spit(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    fwrite(data, 1, n, fp);
    fclose(fp);
}

/* A fresh model dir: a copy of the good one, named `name`. Returns its path (static buffer). */
static const char *fresh(const char *name) {
    static char dir[512];
    char src[512], dst[600];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        size_t n;
        snprintf(src, sizeof src, "%s/%s", good, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        char *b = check_slurp(src, &n);
        spit(dst, b, n);
        free(b);
    }
    return dir;
}

/* Rewrite the safetensors header of dir/model.safetensors through `mutate`, keeping the data. */
static void mutate_header(const char *dir, void (*mutate)(struct json_object *)) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t n;
    char *b = check_slurp(path, &n);
    uint64_t hlen;
    memcpy(&hlen, b, 8);
    struct json_object *h = json_tokener_parse(b + 8);
    mutate(h);
    const char *s = json_object_to_json_string_ext(h, JSON_C_TO_STRING_PLAIN);
    size_t sl = strlen(s), padded = (sl + 7) & ~(size_t)7;
    FILE *fp = fopen(path, "wb");
    uint64_t nl = padded;
    fwrite(&nl, 8, 1, fp);
    fwrite(s, 1, sl, fp);
    for (size_t i = sl; i < padded; i++) fputc(' ', fp);
    fwrite(b + 8 + hlen, 1, n - 8 - hlen, fp);
    fclose(fp);
    json_object_put(h);
    free(b);
}

static void set_config(const char *dir, const char *key, struct json_object *val) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct json_object *c = json_object_from_file(path);
    json_object_object_add(c, key, val);
    json_object_to_file(path, c);
    json_object_put(c);
}

/* Load must fail with `status` and a message containing every one of the given substrings. */
static void expect_fail(const char *what, const char *dir, int status, const char *sub1,
                        const char *sub2) {
    struct tllm_model *m = NULL;
    tllm_clear_error();
    int rc = tllm_model_load(dir, &m);
    const char *msg = tllm_errmsg();
    CHECK(rc == status, "%s: status %d, expected %d (%s)", what, rc, status, msg);
    CHECK(m == NULL, "%s: model returned on failure", what);
    CHECK(strstr(msg, sub1) != NULL, "%s: message '%s' lacks '%s'", what, msg, sub1);
    if (sub2) CHECK(strstr(msg, sub2) != NULL, "%s: message '%s' lacks '%s'", what, msg, sub2);
    CHECK(strchr(msg, '\n') == NULL, "%s: message is not one line", what);
    printf("  %-28s -> %s\n", what, msg);
    tllm_model_free(m);
}

/* the norm's entry under another name: its bytes still belong to a tensor (a header that left them
 * to none would be refused for that first), but no tensor is called model.norm.weight */
static void drop_norm(struct json_object *h) {
    struct json_object *e;
    json_object_object_get_ex(h, "model.norm.weight", &e);
    json_object_object_add(h, "model.norm.weight.renamed", json_object_get(e));
    json_object_object_del(h, "model.norm.weight");
}
static void offsets_out_of_range(struct json_object *h) {
    struct json_object *e, *o;
    json_object_object_get_ex(h, "model.norm.weight", &e);
    json_object_object_get_ex(e, "data_offsets", &o);
    json_object_array_put_idx(o, 0, json_object_new_int64(1LL << 40));
    json_object_array_put_idx(o, 1, json_object_new_int64((1LL << 40) + 256));
}
static void offsets_wrong_size(struct json_object *h) {
    struct json_object *e, *o;
    json_object_object_get_ex(h, "model.norm.weight", &e);
    json_object_object_get_ex(e, "data_offsets", &o);
    int64_t b = json_object_get_int64(json_object_array_get_idx(o, 0));
    json_object_array_put_idx(o, 1, json_object_new_int64(b + 100));
}
static void dtype_f64(struct json_object *h) {
    struct json_object *e;
    json_object_object_get_ex(h, "model.norm.weight", &e);
    json_object_object_add(e, "dtype", json_object_new_string("F64"));
}
static void dtype_u32_norm(struct json_object *h) {
    struct json_object *e, *s;
    json_object_object_get_ex(h, "model.norm.weight", &e);
    json_object_object_add(e, "dtype", json_object_new_string("U32"));
    json_object_object_get_ex(e, "shape", &s);
    json_object_array_put_idx(s, 0, json_object_new_int(64)); /* same byte size as 128 x BF16 */
}
static void negative_shape(struct json_object *h) {
    struct json_object *e, *s;
    json_object_object_get_ex(h, "model.norm.weight", &e);
    json_object_object_get_ex(e, "shape", &s);
    json_object_array_put_idx(s, 0, json_object_new_int(-128));
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_bad_checkpoints Q4_MODEL_DIR SHARDED_MODEL_DIR\n");
        return 2;
    }
    good = argv[1];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tllm-badckpt-XXXXXX");
    if (!mkdtemp(tmpdir)) return 2;
    char path[700];
    const char *d;
    size_t n;

    d = fresh("truncated");
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    char *b = check_slurp(path, &n);
    spit(path, b, n / 2);
    free(b);
    expect_fail("truncated file", d, TLLM_ERR_FORMAT, "model.safetensors: tensor '",
                "run past the end of the data");

    d = fresh("zero-length");
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    spit(path, "", 0);
    expect_fail("zero-length file", d, TLLM_ERR_FORMAT, "model.safetensors", "file is truncated (0 bytes");

    d = fresh("header-past-eof");
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    b = check_slurp(path, &n);
    uint64_t big = (uint64_t)n; /* header length = whole file: runs past the end */
    memcpy(b, &big, 8);
    spit(path, b, n);
    free(b);
    expect_fail("header length past EOF", d, TLLM_ERR_FORMAT, "model.safetensors: header length",
                "runs past the end of the file");

    d = fresh("header-bad-json");
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    b = check_slurp(path, &n);
    b[8] = '[';
    b[9] = '}';
    spit(path, b, n);
    free(b);
    expect_fail("header bad JSON", d, TLLM_ERR_FORMAT, "model.safetensors: header is not valid JSON", NULL);

    d = fresh("offsets-out-of-range");
    mutate_header(d, offsets_out_of_range);
    expect_fail("offsets out of range", d, TLLM_ERR_FORMAT, "tensor 'model.norm.weight'",
                "run past the end of the data");

    d = fresh("offsets-wrong-size");
    mutate_header(d, offsets_wrong_size);
    expect_fail("offsets disagree with shape", d, TLLM_ERR_FORMAT, "tensor 'model.norm.weight'",
                "data_offsets span 100 bytes but BF16 x shape needs 256");

    d = fresh("dtype-f64");
    mutate_header(d, dtype_f64);
    expect_fail("unsupported dtype", d, TLLM_ERR_UNSUPPORTED, "tensor 'model.norm.weight'",
                "dtype F64 is not supported");

    d = fresh("dtype-wrong");
    mutate_header(d, dtype_u32_norm);
    expect_fail("wrong dtype", d, TLLM_ERR_FORMAT, "tensor 'model.norm.weight' has dtype U32", NULL);

    d = fresh("negative-shape");
    mutate_header(d, negative_shape);
    expect_fail("negative shape", d, TLLM_ERR_FORMAT, "tensor 'model.norm.weight'",
                "shape must be non-negative");

    d = fresh("missing-tensor");
    mutate_header(d, drop_norm);
    expect_fail("missing tensor", d, TLLM_ERR_FORMAT, "missing tensor 'model.norm.weight'", NULL);

    d = fresh("wrong-shape");
    set_config(d, "intermediate_size", json_object_new_int(256));
    expect_fail("shape disagrees with config", d, TLLM_ERR_FORMAT,
                "tensor 'model.layers.0.mlp.gate_proj.scales' has shape [384, 2]",
                "but config.json implies [256, 2]");

    d = fresh("wrong-bits");
    snprintf(path, sizeof path, "%s/config.json", d);
    {
        struct json_object *c = json_object_from_file(path), *q;
        json_object_object_get_ex(c, "quantization", &q);
        json_object_object_add(q, "bits", json_object_new_int(8));
        json_object_object_del(c, "quantization_config");
        json_object_to_file(path, c);
        json_object_put(c);
    }
    expect_fail("bits disagree with tensors", d, TLLM_ERR_FORMAT, "model.embed_tokens.weight' has shape [4096, 16]",
                "implies [4096, 32]");

    d = fresh("bits7");
    snprintf(path, sizeof path, "%s/config.json", d);
    {
        struct json_object *c = json_object_from_file(path), *q;
        json_object_object_get_ex(c, "quantization", &q);
        json_object_object_add(q, "bits", json_object_new_int(7));
        json_object_to_file(path, c);
        json_object_put(c);
    }
    expect_fail("bits=7", d, TLLM_ERR_UNSUPPORTED, "config.json: quantization: bits=7 group_size=64 is not supported", NULL);

    d = fresh("bad-config-json");
    snprintf(path, sizeof path, "%s/config.json", d);
    spit(path, "{\"model_type\": \"qwen2\", ", 24);
    expect_fail("bad config JSON", d, TLLM_ERR_FORMAT, "config.json: invalid JSON", NULL);

    d = fresh("model-type");
    set_config(d, "model_type", json_object_new_string("llama"));
    expect_fail("unknown model_type", d, TLLM_ERR_UNSUPPORTED, "config.json: model_type 'llama' is not supported", NULL);

    d = fresh("missing-key");
    snprintf(path, sizeof path, "%s/config.json", d);
    {
        struct json_object *c = json_object_from_file(path);
        json_object_object_del(c, "hidden_size");
        json_object_to_file(path, c);
        json_object_put(c);
    }
    expect_fail("missing config key", d, TLLM_ERR_FORMAT, "config.json: missing \"hidden_size\"", NULL);

    /* transformers >= 5 moves rope_theta into rope_parameters: read there, other rope types refused */
    d = fresh("rope-params");
    {
        struct json_object *rp = json_object_new_object();
        json_object_object_add(rp, "rope_theta", json_object_new_double(500000.0));
        json_object_object_add(rp, "rope_type", json_object_new_string("default"));
        set_config(d, "rope_parameters", rp);
        struct tllm_config cfg;
        snprintf(path, sizeof path, "%s/config.json", d);
        CHECK(tllm_config_load(path, &cfg) == TLLM_OK, "rope_parameters: %s", tllm_errmsg());
        CHECK(cfg.rope_theta == 500000.0f, "rope_parameters: rope_theta %g, expected 500000", cfg.rope_theta);
        tllm_config_free(&cfg);
        rp = json_object_new_object();
        json_object_object_add(rp, "rope_theta", json_object_new_double(500000.0));
        json_object_object_add(rp, "rope_type", json_object_new_string("yarn"));
        set_config(d, "rope_parameters", rp);
    }
    expect_fail("rope_type yarn", d, TLLM_ERR_UNSUPPORTED, "config.json: rope_parameters.rope_type 'yarn' is not supported",
                NULL);

    d = fresh("heads");
    set_config(d, "num_key_value_heads", json_object_new_int(3));
    expect_fail("heads not a multiple", d, TLLM_ERR_FORMAT, "not a multiple of num_key_value_heads", NULL);

    d = fresh("dir-not-file");
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    unlink(path);
    mkdir(path, 0755);
    expect_fail("directory instead of file", d, TLLM_ERR_IO, "model.safetensors: not a regular file", NULL);

    d = fresh("no-weights");
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    rmdir(path);
    unlink(path);
    expect_fail("no weights", d, TLLM_ERR_IO, "no model.safetensors or model.safetensors.index.json", NULL);

    expect_fail("missing directory", "/nonexistent/model", TLLM_ERR_IO,
                "/nonexistent/model: cannot open model directory: No such file", NULL);
    snprintf(path, sizeof path, "%s/config.json", good);
    expect_fail("file instead of directory", path, TLLM_ERR_IO, "config.json: not a directory", NULL);

    /* sharded: a shard the index lists is missing */
    snprintf(path, sizeof path, "%s/sharded", tmpdir);
    mkdir(path, 0755);
    const char *sh[] = {"config.json", "model.safetensors.index.json", "model-00001-of-00003.safetensors",
                        "model-00003-of-00003.safetensors"};
    for (int i = 0; i < 4; i++) {
        char src[800], dst[800];
        snprintf(src, sizeof src, "%s/%s", argv[2], sh[i]);
        snprintf(dst, sizeof dst, "%s/%s", path, sh[i]);
        b = check_slurp(src, &n);
        spit(dst, b, n);
        free(b);
    }
    expect_fail("missing shard", path, TLLM_ERR_IO, "model-00002-of-00003.safetensors: cannot open",
                "listed in model.safetensors.index.json");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_done();
}
