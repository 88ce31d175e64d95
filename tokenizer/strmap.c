#include "tokenizer/strmap.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

uint64_t tllm_hash_bytes(const void *data, size_t len) { /* FNV-1a */
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

int tllm_strmap_init(struct tllm_strmap *m, size_t expected) {
    m->cap = 16;
    while (m->cap < expected * 2) m->cap *= 2;
    m->count = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? TLLM_OK : tllm_fail(TLLM_ERR_NOMEM, "out of memory");
}

void tllm_strmap_free(struct tllm_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

void tllm_strmap_put(struct tllm_strmap *m, const char *key, size_t len, int32_t value) {
    size_t i = tllm_hash_bytes(key, len) & (m->cap - 1);
    while (m->slots[i].key) {
        if (m->slots[i].len == len && memcmp(m->slots[i].key, key, len) == 0) {
            m->slots[i].value = value;
            return;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->slots[i] = (struct tllm_strmap_slot){key, (uint32_t)len, value};
    m->count++;
}

int32_t tllm_strmap_get(const struct tllm_strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    size_t i = tllm_hash_bytes(key, len) & (m->cap - 1);
    while (m->slots[i].key) {
        if (m->slots[i].len == len && memcmp(m->slots[i].key, key, len) == 0) return m->slots[i].value;
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}
