/* Decode: ids -> bytes -> UTF-8 (invalid sequences become U+FFFD), whole or streamed. */
#include <string.h>

#include "base/error.h"
#include "tokenizer/tok_internal.h"

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* How many bytes of s form a valid prefix of a UTF-8 sequence, and how long that sequence must be. */
static int utf8_prefix(const unsigned char *s, size_t n, int *need) {
    unsigned c = s[0];
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return *need = 1, 1;
    if (c >= 0xC2 && c <= 0xDF) *need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        *need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        *need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return *need = 1, 0; /* not a lead byte */
    int k = 1;
    while (k < *need && (size_t)k < n) {
        unsigned b = s[k];
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
        k++;
    }
    return k;
}

int tllm_utf8_valid_len(const unsigned char *s, size_t n) {
    int need, k = utf8_prefix(s, n, &need);
    return k == need ? k : 0;
}

size_t tllm_utf8_valid_prefix(const void *s, size_t n) {
    const unsigned char *p = s;
    size_t i = 0;
    for (int k; i < n && (k = tllm_utf8_valid_len(p + i, n - i)) > 0;) i += (size_t)k;
    return i;
}

/* Append s[0..n) replacing invalid subsequences; returns how many trailing bytes were an incomplete
 * (still completable) character and were NOT appended when hold_tail is set. */
static int lossy(struct tllm_buf *out, const unsigned char *s, size_t n, int hold_tail, size_t *held) {
    size_t i = 0, run = 0; /* run: start of the current stretch of valid bytes */
    *held = 0;
    if (n == 0) return 0; /* s may be NULL (nothing decoded): no arithmetic on it */
    while (i < n) {
        int need, k = utf8_prefix(s + i, n - i, &need);
        if (k == need) {
            i += (size_t)k;
            continue;
        }
        if (tllm_buf_append(out, s + run, i - run)) return -1;
        if (hold_tail && k > 0 && i + (size_t)k == n) { /* incomplete at the end: may still complete */
            *held = n - i;
            return 0;
        }
        if (tllm_buf_append(out, REPLACEMENT, 3)) return -1;
        i += (size_t)(k > 0 ? k : 1);
        run = i;
    }
    return tllm_buf_append(out, s + run, n - run) ? -1 : 0;
}

int tllm_utf8_lossy_append(struct tllm_buf *out, const unsigned char *s, size_t n) {
    size_t held;
    return lossy(out, s, n, 0, &held) ? tllm_fail(TLLM_ERR_NOMEM, "out of memory") : TLLM_OK;
}

static int check_id(const struct tllm_tok *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab || !t->token_bytes[id])
        return tllm_fail(TLLM_ERR_ARG, "token id %d is not in the tokenizer's vocabulary (%d ids)", id, t->n_vocab);
    return TLLM_OK;
}

int tllm_tok_decode(const struct tllm_tok *t, const int32_t *ids, size_t n, int skip_special, struct tllm_buf *out) {
    struct tllm_buf raw = {0};
    int rc = TLLM_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        if ((rc = check_id(t, ids[i]))) break;
        if (skip_special && t->is_special[ids[i]]) continue;
        rc = tllm_buf_append(&raw, t->token_bytes[ids[i]], t->token_len[ids[i]]);
    }
    if (!rc) rc = tllm_utf8_lossy_append(out, (const unsigned char *)raw.data, raw.len);
    if (!rc && !out->data) rc = tllm_buf_append(out, "", 0);
    tllm_buf_free(&raw);
    return rc;
}

void tllm_tok_stream_init(struct tllm_tok_stream *s, const struct tllm_tok *t, int skip_special) {
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->skip_special = skip_special;
}

int tllm_tok_stream_push(struct tllm_tok_stream *s, int32_t id, struct tllm_buf *out) {
    const struct tllm_tok *t = s->tok;
    /* an id the tokenizer lacks (a padding row of the lm_head a device's argmax picked) has no text,
     * as in Hugging Face's decode: generation goes on */
    if (id < 0 || id >= t->n_vocab || !t->token_bytes[id]) return out->data ? TLLM_OK : tllm_buf_append(out, "", 0);
    if (s->skip_special && t->is_special[id]) return TLLM_OK;
    const unsigned char *tb = (const unsigned char *)t->token_bytes[id];
    size_t tl = t->token_len[id], used = 0, held;
    /* First complete the held-back character with the token's leading bytes (at most 3). */
    while (s->n_pending > 0 && used < tl) {
        s->pending[s->n_pending++] = tb[used++];
        int need, k = utf8_prefix(s->pending, (size_t)s->n_pending, &need);
        if (k == need || k < s->n_pending) { /* complete, or broken: emit what we have */
            if (lossy(out, s->pending, (size_t)s->n_pending, 1, &held)) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
            memmove(s->pending, s->pending + s->n_pending - held, held);
            s->n_pending = (int)held; /* a new character may have started: keep joining */
        }
    }
    if (lossy(out, tb + used, tl - used, 1, &held)) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    if (held) {
        memcpy(s->pending + s->n_pending, tb + tl - held, held);
        s->n_pending += (int)held;
    }
    if (!out->data) return tllm_buf_append(out, "", 0);
    return TLLM_OK;
}

int tllm_tok_stream_flush(struct tllm_tok_stream *s, struct tllm_buf *out) {
    int rc = tllm_utf8_lossy_append(out, s->pending, (size_t)s->n_pending);
    s->n_pending = 0;
    return rc;
}
