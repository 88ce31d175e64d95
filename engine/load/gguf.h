/* One GGUF file (llama.cpp's format, versions 2 and 3), mapped read-only: its metadata (typed keys and
 * values) and its tensors, every offset and size checked against the file. Little-endian only.
 * Layout: "GGUF", version u32, tensor count u64, key count u64; the keys (string key, u32 type, value);
 * the tensor infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset); padding to
 * general.alignment (32 by default); the data, each tensor at its offset (a multiple of the alignment). */
#ifndef TLLM_GGUF_H
#define TLLM_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define TLLM_GGUF_MAX_DIMS 4

/* GGUF's value types */
enum tllm_gguf_vtype {
    TLLM_GV_U8 = 0, TLLM_GV_I8, TLLM_GV_U16, TLLM_GV_I16, TLLM_GV_U32, TLLM_GV_I32, TLLM_GV_F32, TLLM_GV_BOOL,
    TLLM_GV_STRING, TLLM_GV_ARRAY, TLLM_GV_U64, TLLM_GV_I64, TLLM_GV_F64, TLLM_GV_COUNT_
};

struct tllm_gguf_kv {
    char *key;
    enum tllm_gguf_vtype type;
    enum tllm_gguf_vtype elem;  /* arrays: the elements' type (never an array) */
    uint64_t n;                 /* arrays: element count; else 1 */
    const uint8_t *data;        /* the value (an array's first element) in the mapping */
    char *str;                  /* a string value, NUL-terminated copy (NULL for other types) */
    const uint64_t *str_off;    /* string arrays: [n] offset of each element's length prefix from data */
};

struct tllm_gguf_tensor {
    char *name;
    uint32_t type;              /* ggml type (engine/load/ggml_types.h) */
    int n_dims;
    int64_t ne[TLLM_GGUF_MAX_DIMS]; /* ne[0] varies fastest: a matrix is ne[1] rows of ne[0] */
    const void *data;           /* into the mapping, or an aligned copy (dense types on a small alignment) */
    size_t nbytes;
};

struct tllm_gguf {
    char *path;
    const uint8_t *map;
    size_t map_size;
    int borrowed;               /* map is the caller's (tllm_gguf_parse_mem) */
    uint32_t version;
    uint64_t alignment;
    struct tllm_gguf_kv *kvs;   /* in file order */
    int n_kvs;
    struct tllm_gguf_tensor *tensors; /* in file order */
    int n_tensors;
    void **copies;
    int n_copies;
    uint64_t **offs;            /* the string arrays' offset tables */
    int n_offs;
};

/* Map and validate `path`; on failure *out = NULL and tllm_errmsg() names the file and the key or
 * tensor at fault. */
int tllm_gguf_open(const char *path, struct tllm_gguf **out);
/* The same on an image already in memory (`name` stands for the file in messages; `data` must outlive
 * the result). For tests and the fuzzer. */
int tllm_gguf_parse_mem(const void *data, size_t size, const char *name, struct tllm_gguf **out);
void tllm_gguf_close(struct tllm_gguf *g);
/* 1 if the file at path starts with the GGUF magic */
int tllm_gguf_is_gguf(const char *path);

const struct tllm_gguf_kv *tllm_gguf_find_kv(const struct tllm_gguf *g, const char *key);
const struct tllm_gguf_tensor *tllm_gguf_find_tensor(const struct tllm_gguf *g, const char *name);

/* Typed getters: TLLM_OK with *v set (*found = 1), or *v = dflt when the key is absent (*found = 0, found
 * may be NULL); an error naming the key when it is there with another type or out of [lo, hi]. Integers
 * take any integer type. */
int tllm_gguf_get_int(const struct tllm_gguf *g, const char *key, int64_t lo, int64_t hi, int64_t dflt, int64_t *v,
                      int *found);
int tllm_gguf_get_num(const struct tllm_gguf *g, const char *key, double lo, double hi, double dflt, double *v,
                      int *found);
int tllm_gguf_get_bool(const struct tllm_gguf *g, const char *key, int dflt, int *v);
/* The string value of key (NULL when absent); an error when it is another type. */
int tllm_gguf_get_str(const struct tllm_gguf *g, const char *key, const char **v);
/* An array of `elem` (NULL when absent); an error when the key has another type. */
int tllm_gguf_get_arr(const struct tllm_gguf *g, const char *key, enum tllm_gguf_vtype elem,
                      const struct tllm_gguf_kv **kv);
/* Element i of a string array (not NUL-terminated; *len bytes) */
const char *tllm_gguf_arr_str(const struct tllm_gguf_kv *kv, uint64_t i, size_t *len);
/* Element i of an integer array as int64 */
int64_t tllm_gguf_arr_int(const struct tllm_gguf_kv *kv, uint64_t i);

const char *tllm_gguf_vtype_name(enum tllm_gguf_vtype t);

#endif
