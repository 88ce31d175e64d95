/* Writing a safetensors file: the header is written first from the tensor list, then each
 * tensor's bytes in order. The file appears under its name only once complete. */
#ifndef TLLM_ST_WRITER_H
#define TLLM_ST_WRITER_H

#include <stdio.h>

#include "engine/load/safetensors.h"

struct tllm_st_spec {
    char name[192];
    enum tllm_dtype dtype;
    int ndim;
    int64_t shape[2];
};

struct tllm_st_writer {
    char *path, *tmp_path;
    FILE *fp;
    size_t expected, written; /* data bytes */
};

/* Create PATH.tmp and write the header for `n` tensors ("format": "mlx" metadata). */
int tllm_st_writer_open(struct tllm_st_writer *w, const char *path, const struct tllm_st_spec *specs, int n);
/* Append data bytes (the tensors' bytes back to back, in spec order). */
int tllm_st_writer_write(struct tllm_st_writer *w, const void *data, size_t n);
/* Check every byte was written, close, and rename into place. */
int tllm_st_writer_close(struct tllm_st_writer *w);
/* Remove the temporary file (after an error). */
void tllm_st_writer_abort(struct tllm_st_writer *w);

size_t tllm_st_spec_nbytes(const struct tllm_st_spec *s);

#endif
