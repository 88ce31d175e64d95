/* Growable byte and id arrays. Appends return TLLM_OK or TLLM_ERR_NOMEM. */
#ifndef TLLM_BUF_H
#define TLLM_BUF_H

#include <stddef.h>
#include <stdint.h>

struct tllm_buf {
    char *data; /* always NUL-terminated once anything was appended */
    size_t len, cap;
};

struct tllm_ids {
    int32_t *data;
    size_t len, cap;
};

int tllm_buf_append(struct tllm_buf *b, const void *data, size_t n);
int tllm_buf_puts(struct tllm_buf *b, const char *s);
void tllm_buf_free(struct tllm_buf *b);

int tllm_ids_push(struct tllm_ids *a, int32_t id);
int tllm_ids_append(struct tllm_ids *a, const int32_t *ids, size_t n);
void tllm_ids_free(struct tllm_ids *a);

#endif
