#include "engine/load/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "engine/load/ggml_types.h"

#define MAX_KEY 65536         /* bytes of a key or tensor name */
#define MAX_COUNT (1u << 24)  /* keys, tensors */

static const char *const vtype_names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array",
                                          "u64", "i64", "f64"};
static const size_t vtype_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *tllm_gguf_vtype_name(enum tllm_gguf_vtype t) { return (unsigned)t < TLLM_GV_COUNT_ ? vtype_names[t] : "?"; }

/* A cursor over the header: every read is bounds-checked, the first failure is kept. */
struct rd {
    const uint8_t *p;
    size_t size, at;
    const char *path;
    int rc;
};

static int rd_fail(struct rd *r, const char *what) {
    if (!r->rc)
        r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: truncated or corrupt header: %s runs past the end of the file (byte %zu of %zu)",
                          r->path, what, r->at, r->size);
    return r->rc;
}

static const uint8_t *rd_take(struct rd *r, uint64_t n, const char *what) {
    if (r->rc) return NULL;
    if (n > r->size - r->at) {
        rd_fail(r, what);
        return NULL;
    }
    const uint8_t *p = r->p + r->at;
    r->at += (size_t)n;
    return p;
}

static uint32_t rd_u32(struct rd *r, const char *what) {
    const uint8_t *p = rd_take(r, 4, what);
    uint32_t v = 0;
    if (p) memcpy(&v, p, 4);
    return v;
}

static uint64_t rd_u64(struct rd *r, const char *what) {
    const uint8_t *p = rd_take(r, 8, what);
    uint64_t v = 0;
    if (p) memcpy(&v, p, 8);
    return v;
}

/* A string: u64 length, bytes. *len bytes at the result (not NUL-terminated). */
static const char *rd_str(struct rd *r, size_t *len, const char *what) {
    uint64_t n = rd_u64(r, what);
    const uint8_t *p = rd_take(r, n, what);
    *len = p ? (size_t)n : 0;
    return (const char *)p;
}

static char *dup_name(struct rd *r, const char *s, size_t len, const char *what) {
    if (r->rc) return NULL;
    if (len == 0 || len > MAX_KEY || memchr(s, 0, len)) {
        r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: %s at byte %zu is empty, longer than %d bytes or holds a NUL", r->path, what,
                          r->at - len, MAX_KEY);
        return NULL;
    }
    char *d = strndup(s, len);
    if (!d) r->rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    return d;
}

/* Skip one value of type t (the array's elements, where t is an array), filling kv's view of it. */
static void read_value(struct rd *r, struct tllm_gguf *g, struct tllm_gguf_kv *kv) {
    if ((unsigned)kv->type >= TLLM_GV_COUNT_) {
        r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' has value type %u, not a GGUF type", r->path, kv->key,
                          (unsigned)kv->type);
        return;
    }
    kv->n = 1;
    enum tllm_gguf_vtype t = kv->type;
    if (t == TLLM_GV_ARRAY) {
        uint32_t et = rd_u32(r, kv->key);
        kv->n = rd_u64(r, kv->key);
        if (r->rc) return;
        if (et >= TLLM_GV_COUNT_ || et == TLLM_GV_ARRAY) {
            r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' is an array of type %u (%s), which tllm does not read", r->path,
                              kv->key, et, et == TLLM_GV_ARRAY ? "nested arrays" : "not a GGUF type");
            return;
        }
        kv->elem = (enum tllm_gguf_vtype)et;
        t = kv->elem;
    }
    kv->data = r->p + r->at;
    if (t != TLLM_GV_STRING) {
        if (kv->n > (r->size - r->at) / vtype_size[t]) {
            rd_fail(r, kv->key);
            return;
        }
        if (t == TLLM_GV_BOOL)
            for (uint64_t i = 0; i < kv->n; i++)
                if (kv->data[i] > 1) {
                    r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s': a bool of value %u", r->path, kv->key, kv->data[i]);
                    return;
                }
        r->at += (size_t)kv->n * vtype_size[t];
        return;
    }
    if (kv->type != TLLM_GV_ARRAY) {
        size_t len;
        const char *s = rd_str(r, &len, kv->key);
        if (r->rc) return;
        if (!(kv->str = strndup(s, len))) r->rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        return;
    }
    if (kv->n > (r->size - r->at) / 8) { /* each string takes 8 bytes at least */
        rd_fail(r, kv->key);
        return;
    }
    uint64_t *off = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *off);
    uint64_t **no = realloc(g->offs, (size_t)(g->n_offs + 1) * sizeof *no);
    if (!off || !no) {
        free(off);
        if (no) g->offs = no;
        r->rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        return;
    }
    g->offs = no;
    g->offs[g->n_offs++] = off;
    for (uint64_t i = 0; i < kv->n && !r->rc; i++) {
        off[i] = (uint64_t)(r->p + r->at - kv->data);
        size_t len;
        rd_str(r, &len, kv->key);
    }
    kv->str_off = off;
}

static int cmp_span(const void *a, const void *b) {
    const struct tllm_gguf_tensor *x = *(const struct tllm_gguf_tensor *const *)a, *y = *(const struct tllm_gguf_tensor *const *)b;
    const uint8_t *p = x->data, *q = y->data;
    return p < q ? -1 : p > q;
}

/* Tensors must not share bytes (each is read as its own) */
static int check_overlap(struct tllm_gguf *g) {
    const struct tllm_gguf_tensor **s = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *s);
    if (!s) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < g->n_tensors; i++) s[i] = &g->tensors[i];
    qsort(s, (size_t)g->n_tensors, sizeof *s, cmp_span);
    int rc = TLLM_OK;
    for (int i = 1; i < g->n_tensors && !rc; i++)
        if (s[i - 1]->nbytes && (const uint8_t *)s[i - 1]->data + s[i - 1]->nbytes > (const uint8_t *)s[i]->data)
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", g->path, s[i - 1]->name, s[i]->name);
    free(s);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* No key and no tensor name twice (sorted, a repeat is a neighbour: linear in the file's size) */
static int check_unique(struct tllm_gguf *g) {
    int n = g->n_kvs > g->n_tensors ? g->n_kvs : g->n_tensors;
    char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    if (!names) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    int rc = TLLM_OK;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        int k = pass ? g->n_tensors : g->n_kvs;
        for (int i = 0; i < k; i++) names[i] = pass ? g->tensors[i].name : g->kvs[i].key;
        qsort(names, (size_t)k, sizeof *names, cmp_str);
        for (int i = 1; i < k && !rc; i++)
            if (!strcmp(names[i - 1], names[i]))
                rc = tllm_fail(TLLM_ERR_FORMAT, "%s: %s '%s' appears twice", g->path, pass ? "tensor" : "key", names[i]);
    }
    free(names);
    return rc;
}

static int read_tensor(struct rd *r, struct tllm_gguf *g, struct tllm_gguf_tensor *t, uint64_t *offset) {
    size_t len;
    const char *s = rd_str(r, &len, "a tensor name");
    if (!(t->name = dup_name(r, s, len, "a tensor name"))) return r->rc;
    uint32_t nd = rd_u32(r, t->name);
    if (!r->rc && (nd < 1 || nd > TLLM_GGUF_MAX_DIMS))
        return r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (1 to %d)", g->path, t->name, nd,
                                 TLLM_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t numel = 1;
    for (uint32_t i = 0; i < nd && !r->rc; i++) {
        uint64_t d = rd_u64(r, t->name);
        if (!r->rc && (d == 0 || d > INT64_MAX || (numel > 0 && d > (UINT64_MAX >> 1) / numel)))
            return r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': dimension %u is %llu (zero or too large)", g->path,
                                     t->name, i, (unsigned long long)d);
        t->ne[i] = (int64_t)d;
        numel *= d;
    }
    for (int i = (int)nd; i < TLLM_GGUF_MAX_DIMS; i++) t->ne[i] = 1;
    t->type = rd_u32(r, t->name);
    *offset = rd_u64(r, t->name);
    if (r->rc) return r->rc;
    const struct tllm_ggml_type *ty = tllm_ggml_type(t->type);
    if (!ty)
        return r->rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: tensor '%s' has ggml type %u, which tllm does not know", g->path,
                                 t->name, t->type);
    if (t->ne[0] % ty->block)
        return r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': a row of %lld is not whole %s blocks of %d", g->path,
                                 t->name, (long long)t->ne[0], ty->name, ty->block);
    uint64_t blocks = numel / (uint64_t)ty->block;
    if (blocks > SIZE_MAX / (uint64_t)ty->bytes)
        return r->rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s' is too large", g->path, t->name);
    t->nbytes = (size_t)(blocks * (uint64_t)ty->bytes);
    return TLLM_OK;
}

static int parse(struct tllm_gguf *g) {
    struct rd r = {g->map, g->map_size, 0, g->path, 0};
    const uint8_t *magic = rd_take(&r, 4, "the magic");
    if (!magic || memcmp(magic, "GGUF", 4))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: not a GGUF file (no \"GGUF\" magic)", g->path);
    g->version = rd_u32(&r, "the version");
    if (r.rc) return r.rc;
    if (g->version == 1)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (2 and 3 are; llama.cpp's "
                                               "gguf-py can rewrite it)", g->path);
    if (g->version != 2 && g->version != 3)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are%s)", g->path, g->version,
                         (g->version & 0xffff) == 0 ? "; this looks like a big-endian file" : "");
    uint64_t n_tensors = rd_u64(&r, "the tensor count"), n_kvs = rd_u64(&r, "the key count");
    if (r.rc) return r.rc;
    if (n_tensors > MAX_COUNT || n_kvs > MAX_COUNT)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: %llu tensors and %llu keys: more than tllm reads (%u)", g->path,
                         (unsigned long long)n_tensors, (unsigned long long)n_kvs, MAX_COUNT);
    /* a key takes 14 bytes at least, a tensor's info 33: counts the file cannot hold are refused before
     * anything is allocated for them */
    if (n_kvs > g->map_size / 14 || n_tensors > g->map_size / 33)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: truncated or corrupt header: %llu keys and %llu tensors cannot fit in %zu bytes",
                         g->path, (unsigned long long)n_kvs, (unsigned long long)n_tensors, g->map_size);
    g->kvs = calloc((size_t)n_kvs + 1, sizeof *g->kvs);
    g->tensors = calloc((size_t)n_tensors + 1, sizeof *g->tensors);
    uint64_t *offsets = calloc((size_t)n_tensors + 1, sizeof *offsets);
    if (!g->kvs || !g->tensors || !offsets) {
        free(offsets);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    for (uint64_t i = 0; i < n_kvs && !r.rc; i++) {
        struct tllm_gguf_kv *kv = &g->kvs[g->n_kvs];
        size_t len;
        const char *s = rd_str(&r, &len, "a key");
        if (!(kv->key = dup_name(&r, s, len, "a key"))) break;
        g->n_kvs++;
        kv->type = (enum tllm_gguf_vtype)rd_u32(&r, kv->key);
        if (!r.rc) read_value(&r, g, kv);
    }
    int64_t al = 32;
    if (!r.rc) r.rc = check_unique(g); /* the keys (no tensors yet) */
    if (!r.rc && (r.rc = tllm_gguf_get_int(g, "general.alignment", 1, 1 << 30, 32, &al, NULL)) == TLLM_OK &&
        (al & (al - 1)))
        r.rc = tllm_fail(TLLM_ERR_FORMAT, "%s: general.alignment %lld is not a power of two", g->path, (long long)al);
    g->alignment = (uint64_t)al;
    for (uint64_t i = 0; i < n_tensors && !r.rc; i++) {
        struct tllm_gguf_tensor *t = &g->tensors[g->n_tensors];
        if (read_tensor(&r, g, t, &offsets[i])) {
            if (t->name) g->n_tensors++; /* freed with the rest */
            break;
        }
        g->n_tensors++;
    }
    if (!r.rc) r.rc = check_unique(g);
    if (r.rc) {
        free(offsets);
        return r.rc;
    }
    size_t data_at = (r.at + (size_t)g->alignment - 1) / (size_t)g->alignment * (size_t)g->alignment;
    if (n_tensors && data_at > g->map_size) {
        free(offsets);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: truncated: the file ends before its tensor data", g->path);
    }
    size_t data_size = g->map_size - (data_at < g->map_size ? data_at : g->map_size);
    int rc = TLLM_OK;
    for (int i = 0; i < g->n_tensors && !rc; i++) {
        struct tllm_gguf_tensor *t = &g->tensors[i];
        if (offsets[i] % g->alignment)
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': offset %llu is not a multiple of the alignment %llu", g->path,
                           t->name, (unsigned long long)offsets[i], (unsigned long long)g->alignment);
        else if (offsets[i] > data_size || t->nbytes > data_size - offsets[i])
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: tensor '%s': bytes %llu to %llu of the data, which has %zu (truncated file?)",
                           g->path, t->name, (unsigned long long)offsets[i],
                           (unsigned long long)(offsets[i] + (uint64_t)t->nbytes), data_size);
        else
            t->data = g->map + data_at + offsets[i];
    }
    free(offsets);
    if (!rc) rc = check_overlap(g);
    /* dense tensors are read as typed arrays: a small alignment may leave them misaligned */
    for (int i = 0; i < g->n_tensors && !rc; i++) {
        struct tllm_gguf_tensor *t = &g->tensors[i];
        const struct tllm_ggml_type *ty = tllm_ggml_type(t->type);
        if (ty->block != 1 || (uintptr_t)t->data % (uintptr_t)ty->bytes == 0) continue;
        void **nc = realloc(g->copies, (size_t)(g->n_copies + 1) * sizeof *nc);
        void *p = nc ? aligned_alloc(64, (t->nbytes + 63) & ~(size_t)63) : NULL;
        if (nc) g->copies = nc;
        if (!p) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        memcpy(p, t->data, t->nbytes);
        g->copies[g->n_copies++] = p;
        t->data = p;
    }
    return rc;
}

int tllm_gguf_parse_mem(const void *data, size_t size, const char *name, struct tllm_gguf **out) {
    *out = NULL;
    struct tllm_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(name))) {
        free(g);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    g->map = data, g->map_size = size, g->borrowed = 1;
    int rc = parse(g);
    if (rc) {
        tllm_gguf_close(g);
        return rc;
    }
    *out = g;
    return TLLM_OK;
}

int tllm_gguf_open(const char *path, struct tllm_gguf **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tllm_fail(TLLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tllm_fail(TLLM_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: %lld bytes: too short for a GGUF file", path, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED) return tllm_fail(TLLM_ERR_IO, "%s: cannot map: %s", path, strerror(err));
    struct tllm_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        munmap(map, (size_t)st.st_size);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    g->map = map, g->map_size = (size_t)st.st_size;
    int rc = parse(g);
    if (rc) {
        tllm_gguf_close(g);
        return rc;
    }
    *out = g;
    return TLLM_OK;
}

void tllm_gguf_close(struct tllm_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_kvs; i++) free(g->kvs[i].key), free(g->kvs[i].str);
    free(g->kvs);
    for (int i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->tensors);
    for (int i = 0; i < g->n_copies; i++) free(g->copies[i]);
    free(g->copies);
    for (int i = 0; i < g->n_offs; i++) free(g->offs[i]);
    free(g->offs);
    if (g->map && !g->borrowed) munmap((void *)g->map, g->map_size);
    free(g->path);
    free(g);
}

int tllm_gguf_is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    int yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    return yes;
}

const struct tllm_gguf_kv *tllm_gguf_find_kv(const struct tllm_gguf *g, const char *key) {
    for (int i = 0; i < g->n_kvs; i++)
        if (!strcmp(g->kvs[i].key, key)) return &g->kvs[i];
    return NULL;
}

const struct tllm_gguf_tensor *tllm_gguf_find_tensor(const struct tllm_gguf *g, const char *name) {
    for (int i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static int is_int_type(enum tllm_gguf_vtype t) {
    return t <= TLLM_GV_I32 || t == TLLM_GV_U64 || t == TLLM_GV_I64;
}

/* Element i of an integer-typed value at p; *big set when a u64 exceeds INT64_MAX */
static int64_t load_int(const uint8_t *p, enum tllm_gguf_vtype t, uint64_t i, int *big) {
    union {
        uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; uint64_t u64; int64_t i64;
    } v;
    memcpy(&v, p + i * vtype_size[t], vtype_size[t]);
    if (big) *big = 0;
    switch (t) {
    case TLLM_GV_U8: return v.u8;
    case TLLM_GV_I8: return v.i8;
    case TLLM_GV_U16: return v.u16;
    case TLLM_GV_I16: return v.i16;
    case TLLM_GV_U32: return v.u32;
    case TLLM_GV_I32: return v.i32;
    case TLLM_GV_U64:
        if (big) *big = v.u64 > INT64_MAX;
        return v.u64 > INT64_MAX ? INT64_MAX : (int64_t)v.u64;
    case TLLM_GV_I64: return v.i64;
    default: return 0;
    }
}

int64_t tllm_gguf_arr_int(const struct tllm_gguf_kv *kv, uint64_t i) { return load_int(kv->data, kv->elem, i, NULL); }

int tllm_gguf_get_int(const struct tllm_gguf *g, const char *key, int64_t lo, int64_t hi, int64_t dflt, int64_t *v,
                      int *found) {
    const struct tllm_gguf_kv *kv = tllm_gguf_find_kv(g, key);
    *v = dflt;
    if (found) *found = kv != NULL;
    if (!kv) return TLLM_OK;
    if (!is_int_type(kv->type))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' is a %s, expected an integer", g->path, key,
                         tllm_gguf_vtype_name(kv->type));
    int big;
    int64_t x = load_int(kv->data, kv->type, 0, &big);
    if (big || x < lo || x > hi)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' is %lld%s, outside [%lld, %lld]", g->path, key, (long long)x,
                         big ? " or more" : "", (long long)lo, (long long)hi);
    *v = x;
    return TLLM_OK;
}

int tllm_gguf_get_num(const struct tllm_gguf *g, const char *key, double lo, double hi, double dflt, double *v,
                      int *found) {
    const struct tllm_gguf_kv *kv = tllm_gguf_find_kv(g, key);
    *v = dflt;
    if (found) *found = kv != NULL;
    if (!kv) return TLLM_OK;
    double x;
    if (kv->type == TLLM_GV_F32) {
        float f;
        memcpy(&f, kv->data, 4);
        x = f;
    } else if (kv->type == TLLM_GV_F64) {
        memcpy(&x, kv->data, 8);
    } else if (is_int_type(kv->type)) {
        x = (double)load_int(kv->data, kv->type, 0, NULL);
    } else {
        return tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' is a %s, expected a number", g->path, key,
                         tllm_gguf_vtype_name(kv->type));
    }
    if (!(x >= lo && x <= hi)) /* NaN too */
        return tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' is %g, outside [%g, %g]", g->path, key, x, lo, hi);
    *v = x;
    return TLLM_OK;
}

int tllm_gguf_get_bool(const struct tllm_gguf *g, const char *key, int dflt, int *v) {
    const struct tllm_gguf_kv *kv = tllm_gguf_find_kv(g, key);
    *v = dflt;
    if (!kv) return TLLM_OK;
    if (kv->type != TLLM_GV_BOOL)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' is a %s, expected a bool", g->path, key,
                         tllm_gguf_vtype_name(kv->type));
    *v = kv->data[0];
    return TLLM_OK;
}

int tllm_gguf_get_str(const struct tllm_gguf *g, const char *key, const char **v) {
    const struct tllm_gguf_kv *kv = tllm_gguf_find_kv(g, key);
    *v = NULL;
    if (!kv) return TLLM_OK;
    if (kv->type != TLLM_GV_STRING)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' is a %s, expected a string", g->path, key,
                         tllm_gguf_vtype_name(kv->type));
    *v = kv->str;
    return TLLM_OK;
}

int tllm_gguf_get_arr(const struct tllm_gguf *g, const char *key, enum tllm_gguf_vtype elem,
                      const struct tllm_gguf_kv **out) {
    const struct tllm_gguf_kv *kv = tllm_gguf_find_kv(g, key);
    *out = NULL;
    if (!kv) return TLLM_OK;
    int ok = kv->type == TLLM_GV_ARRAY &&
             (kv->elem == elem || (is_int_type(elem) && is_int_type(kv->elem)));
    if (!ok)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: key '%s' is a %s%s%s, expected an array of %s", g->path, key,
                         tllm_gguf_vtype_name(kv->type), kv->type == TLLM_GV_ARRAY ? " of " : "",
                         kv->type == TLLM_GV_ARRAY ? tllm_gguf_vtype_name(kv->elem) : "", tllm_gguf_vtype_name(elem));
    *out = kv;
    return TLLM_OK;
}

const char *tllm_gguf_arr_str(const struct tllm_gguf_kv *kv, uint64_t i, size_t *len) {
    uint64_t n;
    const uint8_t *p = kv->data + kv->str_off[i];
    memcpy(&n, p, 8);
    *len = (size_t)n;
    return (const char *)p + 8;
}
