#include "base/buf.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static int grow(void **data, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return TLLM_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        nc *= 2;
    }
    void *p = realloc(*data, nc * elem);
    if (!p) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    *data = p;
    *cap = nc;
    return TLLM_OK;
}

int tllm_buf_append(struct tllm_buf *b, const void *data, size_t n) {
    int rc = grow((void **)&b->data, &b->cap, b->len + n + 1, 1);
    if (rc) return rc;
    if (n) memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return TLLM_OK;
}

int tllm_buf_puts(struct tllm_buf *b, const char *s) { return tllm_buf_append(b, s, strlen(s)); }

void tllm_buf_free(struct tllm_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

int tllm_ids_push(struct tllm_ids *a, int32_t id) { return tllm_ids_append(a, &id, 1); }

int tllm_ids_append(struct tllm_ids *a, const int32_t *ids, size_t n) {
    int rc = grow((void **)&a->data, &a->cap, a->len + n, sizeof *a->data);
    if (rc) return rc;
    if (n) memcpy(a->data + a->len, ids, n * sizeof *ids);
    a->len += n;
    return TLLM_OK;
}

void tllm_ids_free(struct tllm_ids *a) {
    free(a->data);
    memset(a, 0, sizeof *a);
}
