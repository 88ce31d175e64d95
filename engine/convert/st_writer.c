#include "engine/convert/st_writer.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"

size_t tllm_st_spec_nbytes(const struct tllm_st_spec *s) {
    size_t n = tllm_dtype_size(s->dtype);
    for (int i = 0; i < s->ndim; i++) n *= (size_t)s->shape[i];
    return n;
}

int tllm_st_writer_open(struct tllm_st_writer *w, const char *path, const struct tllm_st_spec *specs, int n) {
    memset(w, 0, sizeof *w);
    size_t pl = strlen(path);
    w->path = strdup(path);
    w->tmp_path = malloc(pl + 8);
    if (!w->path || !w->tmp_path) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    snprintf(w->tmp_path, pl + 8, "%s.tmp", path);
    struct json_object *h = json_object_new_object(), *meta = json_object_new_object();
    json_object_object_add(meta, "format", json_object_new_string("mlx"));
    json_object_object_add(h, "__metadata__", meta);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        struct json_object *e = json_object_new_object(), *sh = json_object_new_array(), *o = json_object_new_array();
        for (int d = 0; d < specs[i].ndim; d++) json_object_array_add(sh, json_object_new_int64(specs[i].shape[d]));
        size_t nb = tllm_st_spec_nbytes(&specs[i]);
        json_object_array_add(o, json_object_new_int64((int64_t)off));
        json_object_array_add(o, json_object_new_int64((int64_t)(off + nb)));
        json_object_object_add(e, "dtype", json_object_new_string(tllm_dtype_name(specs[i].dtype)));
        json_object_object_add(e, "shape", sh);
        json_object_object_add(e, "data_offsets", o);
        json_object_object_add(h, specs[i].name, e);
        off += nb;
    }
    w->expected = off;
    const char *text = json_object_to_json_string_ext(h, JSON_C_TO_STRING_PLAIN);
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7; /* 8-byte aligned data */
    int rc = TLLM_OK;
    w->fp = fopen(w->tmp_path, "wb");
    if (!w->fp) {
        rc = tllm_fail(TLLM_ERR_IO, "%s: cannot create: %s", w->tmp_path, strerror(errno));
    } else {
        unsigned char hl[8];
        for (int i = 0; i < 8; i++) hl[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        if (fwrite(hl, 1, 8, w->fp) != 8 || fwrite(text, 1, len, w->fp) != len)
            rc = tllm_fail(TLLM_ERR_IO, "%s: write failed: %s", w->tmp_path, strerror(errno));
        for (size_t i = len; i < padded && !rc; i++)
            if (fputc(' ', w->fp) == EOF) rc = tllm_fail(TLLM_ERR_IO, "%s: write failed", w->tmp_path);
    }
    json_object_put(h);
    if (rc) tllm_st_writer_abort(w);
    return rc;
}

int tllm_st_writer_write(struct tllm_st_writer *w, const void *data, size_t n) {
    if (w->written + n > w->expected)
        return tllm_fail(TLLM_ERR_ARG, "%s: more data than the header declares", w->path);
    if (n && fwrite(data, 1, n, w->fp) != n)
        return tllm_fail(TLLM_ERR_IO, "%s: write failed: %s", w->tmp_path, strerror(errno));
    w->written += n;
    return TLLM_OK;
}

int tllm_st_writer_close(struct tllm_st_writer *w) {
    int rc = TLLM_OK;
    if (w->written != w->expected)
        rc = tllm_fail(TLLM_ERR_ARG, "%s: %zu of %zu data bytes written", w->path, w->written, w->expected);
    else if (fflush(w->fp) != 0 || fsync(fileno(w->fp)) != 0)
        rc = tllm_fail(TLLM_ERR_IO, "%s: write failed: %s", w->tmp_path, strerror(errno));
    if (rc) {
        tllm_st_writer_abort(w);
        return rc;
    }
    fclose(w->fp);
    w->fp = NULL;
    if (rename(w->tmp_path, w->path) != 0) {
        rc = tllm_fail(TLLM_ERR_IO, "%s: cannot rename into place: %s", w->path, strerror(errno));
        unlink(w->tmp_path);
    }
    free(w->path);
    free(w->tmp_path);
    memset(w, 0, sizeof *w);
    return rc;
}

void tllm_st_writer_abort(struct tllm_st_writer *w) {
    if (w->fp) fclose(w->fp);
    if (w->tmp_path) unlink(w->tmp_path);
    free(w->path);
    free(w->tmp_path);
    memset(w, 0, sizeof *w);
}
