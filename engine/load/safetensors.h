/* One safetensors file, mapped read-only; tensors point into the mapping. */
#ifndef TLLM_SAFETENSORS_H
#define TLLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#define TLLM_ST_MAX_DIMS 8
/* A header larger than this is refused: real ones are a few hundred KiB. */
#define TLLM_ST_MAX_HEADER (64u << 20)

struct tllm_tensor {
    const char *name;
    const char *file;            /* path of the file it lives in (owned by the file) */
    enum tllm_dtype dtype;
    int ndim;
    int64_t shape[TLLM_ST_MAX_DIMS];
    size_t nbytes;               /* product(shape) * dtype size, checked against data_offsets */
    const void *data;            /* into the mapping, or an aligned copy if the file's was misaligned */
};

struct tllm_st_file {
    char *path;
    void *map;                   /* whole file, PROT_READ */
    size_t map_size;
    struct tllm_tensor *tensors; /* sorted by name */
    int n_tensors;
    void **copies;               /* aligned copies of misaligned tensors */
    int n_copies;
    int borrowed;                /* map is the caller's memory (tllm_st_parse_mem), not an mmap */
};

/* Map and validate `path`. On failure returns a status, *out = NULL, and tllm_errmsg()
 * names the file and, where there is one, the tensor. */
int tllm_st_open(const char *path, struct tllm_st_file **out);
void tllm_st_close(struct tllm_st_file *f);
/* Validate a safetensors image already in memory (`name` stands for the file in messages); the
 * tensors point into `data`, which must outlive the result. For tests and the fuzzer. */
int tllm_st_parse_mem(const void *data, size_t size, const char *name, struct tllm_st_file **out);

/* Binary search by name; NULL if absent. */
const struct tllm_tensor *tllm_st_find(const struct tllm_st_file *f, const char *name);

#endif
