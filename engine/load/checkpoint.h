/* A model directory's weights: model.safetensors, or the shards named by
 * model.safetensors.index.json, all mapped read-only and searchable by tensor name. */
#ifndef TLLM_CHECKPOINT_H
#define TLLM_CHECKPOINT_H

#include "engine/load/safetensors.h"

#define TLLM_INDEX_MAX_BYTES (64u << 20)
#define TLLM_MAX_SHARDS 4096

struct tllm_ckpt {
    char *dir;
    struct tllm_st_file **files;
    int n_files;
    size_t total_bytes; /* sum of tensor bytes */
};

int tllm_ckpt_open(const char *dir, struct tllm_ckpt **out);
void tllm_ckpt_close(struct tllm_ckpt *c);
const struct tllm_tensor *tllm_ckpt_find(const struct tllm_ckpt *c, const char *name);

/* TLLM_OK if `dir` exists and is a directory; else an error naming it. */
int tllm_model_dir_check(const char *dir);

/* "dir/name" in a fresh heap string (NULL on OOM). */
char *tllm_path_join(const char *dir, const char *name);
/* 1 unless nothing is there by that name: a dangling or looping symlink, or a name that cannot be
 * looked at, counts as present, so opening it says what is wrong instead of "no such file". */
int tllm_path_present(const char *path);

#endif
