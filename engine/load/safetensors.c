#include "engine/load/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const struct tllm_tensor *)a)->name, ((const struct tllm_tensor *)b)->name);
}

static int64_t json_int_strict(struct json_object *o, int *ok) {
    *ok = json_object_is_type(o, json_type_int);
    if (!*ok) return 0;
    errno = 0;
    int64_t v = json_object_get_int64(o);
    if (errno != 0) *ok = 0; /* out of int64 range */
    return v;
}

/* Parse one header entry into *t, checking it against the data section [base, base+data_size). */
static int parse_entry(const struct tllm_st_file *f, const char *name, struct json_object *e,
                       const uint8_t *base, size_t data_size, struct tllm_tensor *t) {
    struct json_object *jd, *js, *jo;
    if (!json_object_is_type(e, json_type_object) || !json_object_object_get_ex(e, "dtype", &jd) ||
        !json_object_object_get_ex(e, "shape", &js) ||
        !json_object_object_get_ex(e, "data_offsets", &jo) ||
        !json_object_is_type(jd, json_type_string) || !json_object_is_type(js, json_type_array) ||
        !json_object_is_type(jo, json_type_array))
        return tllm_fail(TLLM_ERR_FORMAT,
                         "%s: tensor '%s': header entry needs dtype, shape and data_offsets", f->path,
                         name);
    t->name = name;
    t->file = f->path;
    t->dtype = tllm_dtype_parse(json_object_get_string(jd));
    if (t->dtype == TLLM_DT_INVALID)
        return tllm_fail(TLLM_ERR_UNSUPPORTED,
                         "%s: tensor '%s': dtype %s is not supported (U32, I32, U8, BF16, F16, F32 are)",
                         f->path, name, json_object_get_string(jd));
    size_t nd = json_object_array_length(js);
    if (nd > TLLM_ST_MAX_DIMS)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", f->path,
                         name, nd, TLLM_ST_MAX_DIMS);
    t->ndim = (int)nd;
    size_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        int ok;
        int64_t d = json_int_strict(json_object_array_get_idx(js, i), &ok);
        if (!ok || d < 0)
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': shape must be non-negative integers",
                             f->path, name);
        t->shape[i] = d;
        if (d != 0 && numel > SIZE_MAX / (size_t)d)
            return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': shape overflows", f->path, name);
        numel *= (size_t)d;
    }
    size_t esz = tllm_dtype_size(t->dtype);
    if (numel > SIZE_MAX / esz)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': shape overflows", f->path, name);
    t->nbytes = numel * esz;
    int ok0, ok1;
    if (json_object_array_length(jo) != 2)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end]",
                         f->path, name);
    int64_t b = json_int_strict(json_object_array_get_idx(jo, 0), &ok0);
    int64_t e_ = json_int_strict(json_object_array_get_idx(jo, 1), &ok1);
    if (!ok0 || !ok1 || b < 0 || e_ < b)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': bad data_offsets [%lld, %lld]", f->path,
                         name, (long long)b, (long long)e_);
    if ((uint64_t)e_ > data_size)
        return tllm_fail(TLLM_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%lld, %lld] run past the end of the data "
                         "(%zu bytes; file truncated?)",
                         f->path, name, (long long)b, (long long)e_, data_size);
    if ((uint64_t)(e_ - b) != t->nbytes)
        return tllm_fail(TLLM_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets span %lld bytes but %s x shape needs %zu",
                         f->path, name, (long long)(e_ - b), tllm_dtype_name(t->dtype), t->nbytes);
    t->data = base + b;
    return TLLM_OK;
}

struct key_span {
    const char *p; /* the key's text in the header, escapes as written */
    size_t len;
};

static int cmp_key(const void *x, const void *y) {
    const struct key_span *a = x, *b = y;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return memcmp(a->p, b->p, a->len);
}

/* The header's top-level keys as written (json-c keeps the last of duplicate keys and ends a key at
 * an escaped NUL, so both are looked for in the text): how many there are, and in *bad (a copy of the
 * key's text) a key with a NUL byte or a duplicate, looked for by sorting when json-c kept fewer keys
 * (n_parsed) than were written. Braces and brackets inside strings are skipped; the text is valid
 * JSON (json-c parsed it). */
static int scan_keys(const char *h, size_t n, int n_parsed, char **bad, int *nul) {
    int depth = 0, count = 0, cap = 0;
    struct key_span *keys = NULL;
    *bad = NULL, *nul = 0;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        else if (c == '"') {
            size_t start = ++i;
            int has_nul = 0;
            for (; i < n && h[i] != '"'; i++)
                if (h[i] == '\\') {
                    if (i + 5 < n && !memcmp(h + i + 1, "u0000", 5)) has_nul = 1;
                    i++;
                }
            size_t j = i + 1;
            while (j < n && (h[j] == ' ' || h[j] == '\n' || h[j] == '\r' || h[j] == '\t')) j++;
            if (depth != 1 || j >= n || h[j] != ':') continue; /* a value, or deeper down */
            if (count == cap) {
                cap = cap ? 2 * cap : 64;
                struct key_span *nk = realloc(keys, (size_t)cap * sizeof *keys);
                if (!nk) {
                    free(keys);
                    return -1;
                }
                keys = nk;
            }
            keys[count] = (struct key_span){h + start, i - start};
            count++;
            if (has_nul && !*bad) *bad = strndup(h + start, i - start), *nul = 1;
        }
    }
    if (!*bad && count != n_parsed && count > 1) { /* json-c kept fewer: some key is there twice; sorted, it is a neighbour */
        qsort(keys, (size_t)count, sizeof *keys, cmp_key);
        for (int a = 0; a + 1 < count && !*bad; a++)
            if (!cmp_key(&keys[a], &keys[a + 1])) *bad = strndup(keys[a].p, keys[a].len);
    }
    free(keys);
    return count;
}

struct span {
    uint64_t begin, end;
    const char *name;
};

static int cmp_span(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* The format's rule for the data section: every byte belongs to exactly one tensor (no overlap, no
 * hole that could hide data, nothing after the last tensor). */
static int check_layout(const struct tllm_st_file *f, const uint8_t *base, size_t data_size) {
    struct span *s = malloc(((size_t)f->n_tensors + 1) * sizeof *s);
    if (!s) return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", f->path);
    int n = 0;
    for (int i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].nbytes) {
            uint64_t b = (uint64_t)((const uint8_t *)f->tensors[i].data - base);
            s[n++] = (struct span){b, b + f->tensors[i].nbytes, f->tensors[i].name};
        }
    qsort(s, (size_t)n, sizeof *s, cmp_span);
    int rc = TLLM_OK;
    uint64_t at = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (s[i].begin < at)
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap (bytes %llu to %llu)", f->path,
                           s[i - 1].name, s[i].name, (unsigned long long)s[i].begin, (unsigned long long)at);
        else if (s[i].begin > at)
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: bytes %llu to %llu of the data belong to no tensor", f->path,
                           (unsigned long long)at, (unsigned long long)s[i].begin);
        at = s[i].end;
    }
    if (!rc && at != data_size)
        rc = tllm_fail(TLLM_ERR_FORMAT, "%s: bytes %llu to %zu of the data belong to no tensor", f->path,
                       (unsigned long long)at, data_size);
    free(s);
    return rc;
}

/* Give misaligned tensors an aligned heap copy so typed loads stay defined behaviour. */
static int align_tensors(struct tllm_st_file *f) {
    for (int i = 0; i < f->n_tensors; i++) {
        struct tllm_tensor *t = &f->tensors[i];
        size_t a = tllm_dtype_size(t->dtype);
        if (((uintptr_t)t->data % a) == 0 || t->nbytes == 0) continue;
        void **nc = realloc(f->copies, (size_t)(f->n_copies + 1) * sizeof *nc);
        if (!nc) return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", f->path);
        f->copies = nc;
        void *p = aligned_alloc(64, (t->nbytes + 63) & ~(size_t)63);
        if (!p) return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", f->path);
        memcpy(p, t->data, t->nbytes);
        f->copies[f->n_copies++] = p;
        t->data = p;
    }
    return TLLM_OK;
}

static int parse_header(struct tllm_st_file *f) {
    const uint8_t *m = f->map;
    if (f->map_size < 8)
        return tllm_fail(TLLM_ERR_FORMAT,
                         "%s: file is truncated (%zu bytes; a safetensors file starts with an 8-byte "
                         "header length)",
                         f->path, f->map_size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | m[i];
    if (hlen > f->map_size - 8)
        return tllm_fail(TLLM_ERR_FORMAT,
                         "%s: header length %llu runs past the end of the file (%zu bytes)", f->path,
                         (unsigned long long)hlen, f->map_size);
    if (hlen > TLLM_ST_MAX_HEADER)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: header length %llu exceeds the limit of %u bytes",
                         f->path, (unsigned long long)hlen, TLLM_ST_MAX_HEADER);
    if (hlen < 2) return tllm_fail(TLLM_ERR_FORMAT, "%s: header is empty", f->path);

    struct json_tokener *tok = json_tokener_new();
    if (!tok) return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", f->path);
    /* Strict, as the format's own (serde_json) reader: no single quotes, bare keys or trailing commas,
     * which scan_keys below would not see as keys. */
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    struct json_object *root = json_tokener_parse_ex(tok, (const char *)m + 8, (int)hlen);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        if (root) json_object_put(root);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: header is not valid JSON (%s)", f->path,
                         jerr == json_tokener_continue ? "unexpected end"
                                                       : json_tokener_error_desc(jerr));
    }
    for (size_t i = used; i < hlen; i++) /* padding after the object must be blanks */
        if (m[8 + i] != ' ' && m[8 + i] != '\0' && m[8 + i] != '\n') {
            json_object_put(root);
            return tllm_fail(TLLM_ERR_FORMAT, "%s: header has trailing bytes after its JSON",
                             f->path);
        }
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    }

    int n = json_object_object_length(root);
    f->tensors = calloc((size_t)n + 1, sizeof *f->tensors);
    if (!f->tensors) {
        json_object_put(root);
        return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", f->path);
    }
    const uint8_t *base = m + 8 + hlen;
    size_t data_size = f->map_size - 8 - (size_t)hlen;
    int rc = TLLM_OK;
    json_object_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        char *name = strdup(key);
        if (!name) { rc = tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", f->path); break; }
        f->tensors[f->n_tensors].name = name;
        f->n_tensors++;
        rc = parse_entry(f, name, val, base, data_size, &f->tensors[f->n_tensors - 1]);
        if (rc) break;
    }
    if (!rc) {
        char *bad;
        int nul, written = scan_keys((const char *)m + 8, (size_t)hlen, n, &bad, &nul);
        if (written < 0) rc = tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", f->path);
        else if (bad && nul) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: the key \"%s\" has a NUL byte", f->path, bad);
        else if (bad) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: the key \"%s\" appears twice in the header", f->path, bad);
        else if (written != n) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: the header has duplicate keys", f->path);
        free(bad);
    }
    json_object_put(root);
    if (!rc) rc = check_layout(f, base, data_size);
    if (rc) return rc;
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor);
    return align_tensors(f);
}

int tllm_st_open(const char *path, struct tllm_st_file **out) {
    *out = NULL;
    struct tllm_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", path);
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block: only regular files pass */
    if (fd < 0) {
        int rc = tllm_fail(TLLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        tllm_st_close(f);
        return rc;
    }
    struct stat st;
    int rc = TLLM_OK;
    if (fstat(fd, &st) != 0) {
        rc = tllm_fail(TLLM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = tllm_fail(TLLM_ERR_IO, "%s: not a regular file", path);
    } else if (st.st_size < 8) {
        f->map_size = (size_t)st.st_size;
        rc = tllm_fail(TLLM_ERR_FORMAT,
                       "%s: file is truncated (%zu bytes; a safetensors file starts with an 8-byte "
                       "header length)",
                       path, f->map_size);
    } else {
        f->map_size = (size_t)st.st_size;
        f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            rc = tllm_fail(TLLM_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
        }
    }
    close(fd);
    if (!rc) rc = parse_header(f);
    if (rc) {
        tllm_st_close(f);
        return rc;
    }
    *out = f;
    return TLLM_OK;
}

int tllm_st_parse_mem(const void *data, size_t size, const char *name, struct tllm_st_file **out) {
    *out = NULL;
    struct tllm_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name))) {
        free(f);
        return tllm_fail(TLLM_ERR_NOMEM, "%s: out of memory", name);
    }
    f->map = (void *)data;
    f->map_size = size;
    f->borrowed = 1;
    int rc = parse_header(f);
    if (rc) {
        tllm_st_close(f);
        return rc;
    }
    *out = f;
    return TLLM_OK;
}

void tllm_st_close(struct tllm_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_copies; i++) free(f->copies[i]);
    free(f->copies);
    if (f->map && !f->borrowed) munmap(f->map, f->map_size);
    free(f->path);
    free(f);
}

const struct tllm_tensor *tllm_st_find(const struct tllm_st_file *f, const char *name) {
    struct tllm_tensor key = {.name = name};
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof key, cmp_tensor);
}
