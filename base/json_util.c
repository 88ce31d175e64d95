#include "base/json_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"

int tllm_read_file(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    /* O_NONBLOCK: a FIFO in the file's place must not block the open; only regular files are read */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return tllm_fail(TLLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    FILE *fp = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !(fp = fdopen(fd, "rb"))) {
        close(fd);
        return tllm_fail(TLLM_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        fclose(fp);
        return tllm_fail(TLLM_ERR_LIMIT, "%s: %lld bytes is over the limit of %zu", path,
                         (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(fp);
        return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, n, fp);
    int err = ferror(fp);
    fclose(fp);
    if (err || got != n) {
        free(buf);
        return tllm_fail(TLLM_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return TLLM_OK;
}

int tllm_json_parse(const char *text, size_t len, struct json_object **out, const char *what) {
    *out = NULL;
    if (len > INT32_MAX) return tllm_fail(TLLM_ERR_LIMIT, "%s: too large", what);
    struct json_tokener *tok = json_tokener_new();
    if (!tok) return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", what);
    struct json_object *root = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (jerr == json_tokener_success) {
        for (size_t i = end; i < len; i++)
            if (text[i] != ' ' && text[i] != '\n' && text[i] != '\r' && text[i] != '\t') {
                jerr = json_tokener_error_parse_unexpected;
                break;
            }
    }
    if (!root || jerr != json_tokener_success) {
        if (root) json_object_put(root);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: invalid JSON (%s)", what,
                         jerr == json_tokener_continue || jerr == json_tokener_success
                             ? "unexpected end of input"
                             : json_tokener_error_desc(jerr));
    }
    *out = root;
    return TLLM_OK;
}

int tllm_json_load_file(const char *path, size_t max_bytes, struct json_object **out) {
    char *text;
    size_t len = 0;
    *out = NULL;
    int rc = tllm_read_file(path, max_bytes, &text, &len);
    if (rc) return rc;
    rc = tllm_json_parse(text, len, out, path);
    free(text);
    return rc;
}

static struct json_object *field(const struct json_object *obj, const char *key) {
    struct json_object *v = NULL;
    if (!json_object_object_get_ex(obj, key, &v)) return NULL;
    return json_object_is_type(v, json_type_null) ? NULL : v;
}

int tllm_json_int(const struct json_object *obj, const char *key, int64_t lo, int64_t hi, int optional,
                  int64_t dflt, int64_t *out, const char *file) {
    struct json_object *v = field(obj, key);
    if (!v) {
        if (optional) {
            *out = dflt;
            return TLLM_OK;
        }
        return tllm_fail(TLLM_ERR_FORMAT, "%s: missing \"%s\"", file, key);
    }
    int64_t x;
    if (json_object_is_type(v, json_type_int)) {
        errno = 0;
        x = json_object_get_int64(v);
        if (errno) x = INT64_MAX;
    } else if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (d != floor(d) || !(fabs(d) < 9e18))
            return tllm_fail(TLLM_ERR_FORMAT, "%s: \"%s\" must be an integer", file, key);
        x = (int64_t)d;
    } else {
        return tllm_fail(TLLM_ERR_FORMAT, "%s: \"%s\" must be an integer", file, key);
    }
    if (x < lo || x > hi)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: \"%s\" = %lld is out of range [%lld, %lld]", file, key,
                         (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return TLLM_OK;
}

int tllm_json_num(const struct json_object *obj, const char *key, double lo, double hi, int optional,
                  double dflt, double *out, const char *file) {
    struct json_object *v = field(obj, key);
    if (!v) {
        if (optional) {
            *out = dflt;
            return TLLM_OK;
        }
        return tllm_fail(TLLM_ERR_FORMAT, "%s: missing \"%s\"", file, key);
    }
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: \"%s\" must be a number", file, key);
    double x = json_object_get_double(v);
    if (!(x >= lo && x <= hi))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: \"%s\" = %g is out of range [%g, %g]", file, key, x,
                         lo, hi);
    *out = x;
    return TLLM_OK;
}

int tllm_json_bool(const struct json_object *obj, const char *key, int optional, int dflt, int *out,
                   const char *file) {
    struct json_object *v = field(obj, key);
    if (!v) {
        if (optional) {
            *out = dflt;
            return TLLM_OK;
        }
        return tllm_fail(TLLM_ERR_FORMAT, "%s: missing \"%s\"", file, key);
    }
    if (!json_object_is_type(v, json_type_boolean))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: \"%s\" must be true or false", file, key);
    *out = json_object_get_boolean(v);
    return TLLM_OK;
}

int tllm_json_str(const struct json_object *obj, const char *key, const char **out, const char *file) {
    struct json_object *v = field(obj, key);
    *out = NULL;
    if (!v) return TLLM_OK;
    if (!json_object_is_type(v, json_type_string))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: \"%s\" must be a string", file, key);
    *out = json_object_get_string(v);
    return TLLM_OK;
}
