/* Encode: added tokens split out -> valid UTF-8 runs -> NFC -> regex split -> byte-level BPE. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/clock.h"
#include "base/error.h"
#include "tokenizer/tok_internal.h"

/* The split regex comes from the tokenizer file, so it may backtrack without end (a{0,3000}a{0,3000}b
 * on 6,000 characters ran 34 s). One match may take REGEX_STEPS_BASE + REGEX_STEPS_PER_BYTE x the
 * bytes left (PCRE2's match limit, and its depth limit alike), and one encode REGEX_SECS_BASE +
 * REGEX_SECS_PER_MIB x its size in MiB of time, far above what a real tokenizer needs (Qwen2's runs
 * at 13-60 MB/s). */
#ifndef REGEX_STEPS_BASE
#define REGEX_STEPS_BASE 100000u
#endif
#ifndef REGEX_STEPS_PER_BYTE
#define REGEX_STEPS_PER_BYTE 64u
#endif
#ifndef REGEX_SECS_BASE
#define REGEX_SECS_BASE 1.0
#endif
#ifndef REGEX_SECS_PER_MIB
#define REGEX_SECS_PER_MIB 1.0
#endif
#define REGEX_CLOCK_EVERY 256 /* matches between looks at the clock */

static int over_budget(struct tllm_tok *t) {
    t->over_budget = 1;
    return tllm_fail(TLLM_ERR_LIMIT, "the text is more than %zu tokens", t->max_ids);
}

/* BPE of one piece, unless the ids left cannot hold it (each token is max_token_len bytes at most) */
static int piece(struct tllm_tok *t, const unsigned char *s, size_t n, struct tllm_ids *out) {
    if (t->max_ids != SIZE_MAX && t->max_token_len &&
        (out->len > t->max_ids || (n + t->max_token_len - 1) / t->max_token_len > t->max_ids - out->len))
        return over_budget(t);
    int rc = tllm_bpe_word(t, s, n, out);
    if (!rc && out->len > t->max_ids) {
        out->len = t->max_ids; /* what is past the budget is not kept */
        return over_budget(t);
    }
    return rc;
}

/* One run of valid UTF-8: normalize, split with the pre-tokenizer regex, BPE each piece. */
static int encode_run(struct tllm_tok *t, const unsigned char *s, size_t n, struct tllm_ids *out) {
    unsigned char *norm = NULL;
    if (t->nfc) {
        int ascii = 1;
        for (size_t i = 0; i < n && ascii; i++) ascii = s[i] < 0x80;
        if (!ascii) { /* ASCII is already NFC */
            utf8proc_ssize_t k = utf8proc_map(s, (utf8proc_ssize_t)n, &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (k < 0) return tllm_fail(TLLM_ERR_ARG, "NFC normalization failed: %s", utf8proc_errmsg(k));
            s = norm;
            n = (size_t)k;
        }
    }
    int rc = TLLM_OK;
    if (!t->split_re) {
        rc = piece(t, s, n, out);
    } else {
        size_t prev = 0, off = 0;
        unsigned calls = 0;
        while (off <= n && !rc) {
            uint64_t steps = REGEX_STEPS_BASE + (uint64_t)REGEX_STEPS_PER_BYTE * (n - off);
            uint32_t limit = steps > UINT32_MAX ? UINT32_MAX : (uint32_t)steps;
            pcre2_set_match_limit(t->mctx, limit);
            pcre2_set_depth_limit(t->mctx, limit);
            int m = pcre2_match(t->split_re, s, n, off, PCRE2_NO_UTF_CHECK, t->md, t->mctx);
            if (m == PCRE2_ERROR_NOMATCH) break;
            if (m < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(m, msg, sizeof msg);
                rc = tllm_fail(TLLM_ERR_LIMIT, "%s: the pre-tokenizer's split regex gave up at byte %zu of a %zu-byte run: %s",
                               t->path, off, n, (char *)msg);
                break;
            }
            if (++calls % REGEX_CLOCK_EVERY == 0 && tllm_now() > t->deadline) {
                rc = tllm_fail(TLLM_ERR_LIMIT, "%s: the pre-tokenizer's split regex is too slow on this input (over its time "
                               "budget at byte %zu of a %zu-byte run: a pattern that backtracks?)", t->path, off, n);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
            size_t ms = ov[0], me = ov[1];
            if (ms > prev) rc = piece(t, s + prev, ms - prev, out); /* unmatched gap: its own piece */
            if (!rc) rc = piece(t, s + ms, me - ms, out);
            prev = me;
            if (me == ms) { /* an empty match: step over one character */
                if (me >= n) break;
                me += (size_t)tllm_utf8_valid_len(s + me, n - me);
            }
            off = me;
        }
        if (!rc && prev < n) rc = piece(t, s + prev, n - prev, out);
    }
    free(norm);
    return rc;
}

/* Text with no added tokens in it. Invalid UTF-8 bytes are encoded one byte-level token each. */
static int encode_plain(struct tllm_tok *t, const unsigned char *s, size_t n, struct tllm_ids *out) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        int k;
        while (j < n && (k = tllm_utf8_valid_len(s + j, n - j)) > 0) j += (size_t)k;
        if (j > i) {
            int rc = encode_run(t, s + i, j - i, out);
            if (rc) return rc;
        }
        if (j < n) {
            if (out->len >= t->max_ids) return over_budget(t);
            int rc = tllm_ids_push(out, t->byte_id[s[j]]);
            if (rc) return rc;
            j++;
        }
        i = j;
    }
    return TLLM_OK;
}

/* The added token matching at s (longest first), or NULL. */
static const struct tllm_added_token *added_at(const struct tllm_tok *t, const unsigned char *s, size_t n,
                                               int parse_special) {
    if (!t->added_first[s[0]]) return NULL;
    for (int i = 0; i < t->n_added; i++) {
        const struct tllm_added_token *a = &t->added[i];
        if (a->special && !parse_special) continue;
        if (a->len <= n && memcmp(s, a->content, a->len) == 0) return a;
    }
    return NULL;
}

static int encode(struct tllm_tok *t, const char *text, size_t len, int parse_special, struct tllm_ids *out) {
    const unsigned char *s = (const unsigned char *)text;
    t->deadline = tllm_now() + REGEX_SECS_BASE + REGEX_SECS_PER_MIB * (double)len / (1 << 20);
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        const struct tllm_added_token *a = added_at(t, s + i, len - i, parse_special);
        if (!a) {
            i++;
            continue;
        }
        int rc = encode_plain(t, s + start, i - start, out);
        if (!rc && out->len >= t->max_ids) rc = over_budget(t);
        if (!rc) rc = tllm_ids_push(out, a->id);
        if (rc) return rc;
        i += a->len;
        start = i;
    }
    return encode_plain(t, s + start, len - start, out);
}

int tllm_tok_encode(struct tllm_tok *t, const char *text, size_t len, int parse_special, struct tllm_ids *out) {
    t->max_ids = SIZE_MAX;
    return encode(t, text, len, parse_special, out);
}

int tllm_tok_encode_max(struct tllm_tok *t, const char *text, size_t len, int parse_special, size_t max_ids,
                        struct tllm_ids *out, int *too_long) {
    t->max_ids = max_ids, t->over_budget = 0;
    int rc = encode(t, text, len, parse_special, out);
    *too_long = rc && t->over_budget;
    t->max_ids = SIZE_MAX;
    return rc;
}
