#include "engine/convert/convert_util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/load/checkpoint.h"
#include "base/error.h"

int tllm_prepare_out_dir(const char *dir, int force) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return tllm_fail(TLLM_ERR_IO, "%s: exists and is not a directory", dir);
        DIR *d = opendir(dir);
        if (!d) return tllm_fail(TLLM_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
        int empty = 1;
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
        closedir(d);
        if (!empty && !force)
            return tllm_fail(TLLM_ERR_IO, "%s: already exists and is not empty (use --force to overwrite)", dir);
        return TLLM_OK;
    }
    if (mkdir(dir, 0755) != 0) return tllm_fail(TLLM_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    return TLLM_OK;
}

static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return tllm_fail(TLLM_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return tllm_fail(TLLM_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int rc = TLLM_OK;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = tllm_fail(TLLM_ERR_IO, "%s: write failed", dst);
    if (ferror(in)) rc = tllm_fail(TLLM_ERR_IO, "%s: read error", src);
    fclose(in);
    if (fclose(out) != 0 && !rc) rc = tllm_fail(TLLM_ERR_IO, "%s: write failed", dst);
    return rc;
}

int tllm_copy_aux_files(const char *from, const char *to) {
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                        "special_tokens_map.json", "vocab.json", "merges.txt",
                                        "added_tokens.json", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *src = tllm_path_join(from, names[i]), *dst = tllm_path_join(to, names[i]);
        int rc = TLLM_OK;
        if (!src || !dst) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        else if (access(src, R_OK) == 0) rc = copy_file(src, dst);
        free(src);
        free(dst);
        if (rc) return rc;
    }
    return TLLM_OK;
}

/* A spec as config.json writes it; the mode only when not affine (mlx reads a missing mode as affine) */
static struct json_object *spec_json(const struct tllm_quant_spec *s) {
    struct json_object *o = json_object_new_object();
    json_object_object_add(o, "group_size", json_object_new_int(s->group_size));
    json_object_object_add(o, "bits", json_object_new_int(s->bits));
    if (s->mode != TLLM_QM_AFFINE) json_object_object_add(o, "mode", json_object_new_string(tllm_qmode_name(s->mode)));
    return o;
}

void tllm_config_set_quantization(struct json_object *cfg, const struct tllm_quant_spec *dflt, const char *const *modules,
                                  const struct tllm_quant_spec *specs, int n) {
    for (int copy = 0; copy < 2; copy++) {
        struct json_object *q = spec_json(dflt);
        for (int i = 0; i < n; i++)
            json_object_object_add(q, modules[i], specs[i].bits ? spec_json(&specs[i]) : json_object_new_boolean(0));
        json_object_object_add(cfg, copy ? "quantization_config" : "quantization", q);
    }
}

int tllm_write_json(const char *dir, const char *name, struct json_object *o) {
    char *path = tllm_path_join(dir, name);
    if (!path) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    int rc = TLLM_OK;
    if (!tmp) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    else {
        snprintf(tmp, n, "%s.tmp", path);
        if (json_object_to_file_ext(tmp, o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED) != 0 ||
            rename(tmp, path) != 0) {
            rc = tllm_fail(TLLM_ERR_IO, "%s: cannot write", path);
            unlink(tmp);
        }
    }
    free(tmp);
    free(path);
    return rc;
}
