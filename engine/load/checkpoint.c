#include "engine/load/checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/json_util.h"

char *tllm_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static int add_file(struct tllm_ckpt *c, const char *name, const char *listed_in) {
    char *path = tllm_path_join(c->dir, name);
    if (!path) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    struct tllm_st_file *f;
    int rc = tllm_st_open(path, &f);
    if (rc) {
        if (listed_in && rc == TLLM_ERR_IO) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", tllm_errmsg());
            rc = tllm_fail(rc, "%s (shard listed in %s)", msg, listed_in);
        }
        free(path);
        return rc;
    }
    free(path);
    c->files[c->n_files++] = f;
    for (int i = 0; i < f->n_tensors; i++) {
        c->total_bytes += f->tensors[i].nbytes;
        for (int j = 0; j < c->n_files - 1; j++)
            if (tllm_st_find(c->files[j], f->tensors[i].name))
                return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' also appears in %s", f->path,
                                 f->tensors[i].name, c->files[j]->path);
    }
    return TLLM_OK;
}

/* A shard name from the index must be a plain file name inside the model directory. */
static int valid_shard_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static int open_sharded(struct tllm_ckpt *c, const char *index_path) {
    struct json_object *root, *wm;
    int rc = tllm_json_load_file(index_path, TLLM_INDEX_MAX_BYTES, &root);
    if (rc) return rc;
    if (!json_object_is_type(root, json_type_object) ||
        !json_object_object_get_ex(root, "weight_map", &wm) ||
        !json_object_is_type(wm, json_type_object)) {
        json_object_put(root);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: missing \"weight_map\" object", index_path);
    }
    /* Unique shard names, in first-seen order. */
    const char **names = calloc(TLLM_MAX_SHARDS, sizeof *names);
    int n = 0;
    if (!names) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    json_object_object_foreach(wm, tname, val) {
        if (rc) break;
        if (!json_object_is_type(val, json_type_string) ||
            !valid_shard_name(json_object_get_string(val))) {
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' maps to an invalid shard file name",
                           index_path, tname);
            break;
        }
        const char *s = json_object_get_string(val);
        int k = 0;
        while (k < n && strcmp(names[k], s) != 0) k++;
        if (k == n) {
            if (n == TLLM_MAX_SHARDS) {
                rc = tllm_fail(TLLM_ERR_LIMIT, "%s: more than %d shards", index_path,
                               TLLM_MAX_SHARDS);
                break;
            }
            names[n++] = s;
        }
    }
    if (!rc && n == 0) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: weight_map is empty", index_path);
    if (!rc && !(c->files = calloc((size_t)n, sizeof *c->files)))
        rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) rc = add_file(c, names[i], "model.safetensors.index.json");
    /* Every tensor must be in the shard the index names. */
    json_object_object_foreach(wm, tname2, val2) {
        if (rc) break;
        const struct tllm_tensor *t = tllm_ckpt_find(c, tname2);
        const char *want = json_object_get_string(val2);
        size_t wl = strlen(want), fl = t ? strlen(t->file) : 0;
        if (!t || fl < wl || strcmp(t->file + fl - wl, want) != 0)
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' is not in %s as the index says",
                           index_path, tname2, want);
    }
    free(names);
    json_object_put(root);
    return rc;
}

int tllm_path_present(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 || errno != ENOENT;
}

int tllm_model_dir_check(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return tllm_fail(TLLM_ERR_IO, "%s: cannot open model directory: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return tllm_fail(TLLM_ERR_IO,
                         "%s: not a directory (a model is a directory with config.json and "
                         "safetensors files)",
                         dir);
    return TLLM_OK;
}

int tllm_ckpt_open(const char *dir, struct tllm_ckpt **out) {
    *out = NULL;
    int rc0 = tllm_model_dir_check(dir);
    if (rc0) return rc0;
    struct tllm_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    char *index = tllm_path_join(dir, "model.safetensors.index.json");
    char *single = tllm_path_join(dir, "model.safetensors");
    int rc = TLLM_OK;
    if (!index || !single) {
        rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    } else if (tllm_path_present(index)) {
        rc = open_sharded(c, index);
    } else if (tllm_path_present(single)) {
        if (!(c->files = calloc(1, sizeof *c->files)))
            rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        else
            rc = add_file(c, "model.safetensors", NULL);
    } else {
        rc = tllm_fail(TLLM_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json",
                       dir);
    }
    free(index);
    free(single);
    if (rc) {
        tllm_ckpt_close(c);
        return rc;
    }
    *out = c;
    return TLLM_OK;
}

void tllm_ckpt_close(struct tllm_ckpt *c) {
    if (!c) return;
    for (int i = 0; i < c->n_files; i++) tllm_st_close(c->files[i]);
    free(c->files);
    free(c->dir);
    free(c);
}

const struct tllm_tensor *tllm_ckpt_find(const struct tllm_ckpt *c, const char *name) {
    for (int i = 0; i < c->n_files; i++) {
        const struct tllm_tensor *t = tllm_st_find(c->files[i], name);
        if (t) return t;
    }
    return NULL;
}
