/* A string -> int32 hash map (open addressing), built once and then only read. */
#ifndef TLLM_STRMAP_H
#define TLLM_STRMAP_H

#include <stddef.h>
#include <stdint.h>

struct tllm_strmap_slot {
    const char *key; /* borrowed; must outlive the map */
    uint32_t len;
    int32_t value;
};

struct tllm_strmap {
    struct tllm_strmap_slot *slots;
    size_t cap; /* power of two */
    size_t count;
};

int tllm_strmap_init(struct tllm_strmap *m, size_t expected);
void tllm_strmap_free(struct tllm_strmap *m);
/* Insert or overwrite. */
void tllm_strmap_put(struct tllm_strmap *m, const char *key, size_t len, int32_t value);
/* The value, or -1. */
int32_t tllm_strmap_get(const struct tllm_strmap *m, const char *key, size_t len);

uint64_t tllm_hash_bytes(const void *data, size_t len);

#endif
