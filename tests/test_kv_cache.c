/* The paged KV cache's bookkeeping: blocks shared by prefix and counted, copied before a shared block
 * is written, findable after release until their memory is needed, all back when sequences close;
 * f16 storage round trips the device layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/run/kv_cache.h"
#include "tests/check.h"

#define B TLLM_KV_BLOCK

static int32_t ids[8 * B];

/* Write positions [p0, p1) of a sequence with a recognizable value, and commit them */
static void write(struct tllm_kv *kv, int seq, int p0, int p1, float tag, const int32_t *toks) {
    int n = p1 - p0, kv_dim = kv->n_kv_heads * kv->head_dim;
    float *kt = malloc((size_t)kv->n_layers * kv_dim * n * 4), *v = malloc((size_t)kv->n_layers * kv_dim * n * 4);
    for (size_t i = 0; i < (size_t)kv->n_layers * kv_dim * n; i++) kt[i] = v[i] = tag + (float)(i / n % 8) / 8; /* by row */
    CHECK(tllm_kv_seq_reserve(kv, seq, p1) == TLLM_OK, "reserve %d: %s", p1, tllm_errmsg());
    tllm_kv_seq_write(kv, seq, p0, p1, kt, v);
    CHECK(tllm_kv_seq_commit(kv, seq, toks + p0, n) == TLLM_OK, "commit");
    free(kt), free(v);
}

static float first_key(const struct tllm_kv *kv, int seq, int p) {
    int kv_dim = kv->n_kv_heads * kv->head_dim;
    float *kt = malloc((size_t)kv->n_layers * kv_dim * 4), *v = malloc((size_t)kv->n_layers * kv_dim * 4);
    tllm_kv_seq_read(kv, seq, p, p + 1, kt, v);
    float x = kt[0];
    free(kt), free(v);
    return x;
}

int main(void) {
    for (int i = 0; i < 8 * B; i++) ids[i] = 1000 + i;
    struct tllm_kv *kv;
    CHECK(tllm_kv_init(&kv, 2, 2, 16, 8 * B, TLLM_DT_F16, 3) == TLLM_OK, "init");
    CHECK(kv->n_blocks == 8 && tllm_kv_n_free(kv) == 8, "8 free blocks");

    int a, b, c, d;
    CHECK(tllm_kv_seq_open(kv, &a) == TLLM_OK, "open a");
    write(kv, a, 0, 2 * B + 8, 1.0f, ids); /* two full blocks and half of a third */
    CHECK(tllm_kv_n_free(kv) == 5, "a holds 3 blocks: %d free", tllm_kv_n_free(kv));
    CHECK(fabsf(first_key(kv, a, 5) - 1.0f) < 1e-3f, "f16 round trip");

    /* b begins like a: the two full blocks are shared, never the partial one, never the last token */
    CHECK(tllm_kv_seq_open(kv, &b) == TLLM_OK, "open b");
    CHECK(tllm_kv_seq_reuse(kv, b, ids, 2 * B + 8) == 2 * B, "b reuses two blocks");
    CHECK(kv->meta[kv->seqs[b].blocks[0]].ref == 2 && tllm_kv_n_free(kv) == 5, "shared, not copied");
    CHECK(tllm_kv_seq_open(kv, &c) == TLLM_OK && tllm_kv_seq_reuse(kv, c, ids, 2 * B) == B, "the last token is computed");
    tllm_kv_seq_close(kv, c);
    int32_t other[2 * B];
    memcpy(other, ids, sizeof other);
    other[B + 3] = 7;
    CHECK(tllm_kv_seq_open(kv, &c) == TLLM_OK && tllm_kv_seq_reuse(kv, c, other, 2 * B + 1) == B, "a block that differs ends the match");
    tllm_kv_seq_close(kv, c);
    int32_t shifted[3 * B];
    memcpy(shifted, ids + B, sizeof shifted); /* a's second block's tokens, but at position 0: another parent */
    CHECK(tllm_kv_seq_open(kv, &c) == TLLM_OK && tllm_kv_seq_reuse(kv, c, shifted, 2 * B) == 0, "a block is known by its parent too");
    tllm_kv_seq_close(kv, c);

    /* writing into a shared block copies it first */
    tllm_kv_seq_truncate(kv, b, B + 4);
    CHECK(tllm_kv_seq_blocks_needed(kv, b, B + 5) == 1, "copy on write needs a block");
    write(kv, b, B + 4, B + 6, 9.0f, ids);
    CHECK(kv->seqs[b].blocks[1] != kv->seqs[a].blocks[1], "b's second block is its own copy now");
    CHECK(fabsf(first_key(kv, a, B + 4) - 1.0f) < 1e-3f && fabsf(first_key(kv, b, B + 4) - 9.0f) < 1e-2f &&
              fabsf(first_key(kv, b, B + 3) - 1.0f) < 1e-3f, "a keeps its values, b has the copy and its own");

    /* released full blocks stay findable until their memory is needed */
    tllm_kv_seq_close(kv, a);
    tllm_kv_seq_close(kv, b);
    CHECK(tllm_kv_n_free(kv) == 8, "all back after close: %d free", tllm_kv_n_free(kv));
    CHECK(tllm_kv_seq_open(kv, &c) == TLLM_OK && tllm_kv_seq_reuse(kv, c, ids, 3 * B) == 2 * B, "found after release");
    tllm_kv_seq_close(kv, c);
    CHECK(tllm_kv_seq_open(kv, &d) == TLLM_OK, "open d");
    CHECK(tllm_kv_seq_reserve(kv, d, 9 * B) == TLLM_ERR_LIMIT && kv->seqs[d].n_blocks == 0, "too many blocks: refused, nothing taken");
    int32_t mine[8 * B];
    for (int i = 0; i < 8 * B; i++) mine[i] = 5000 + i;
    write(kv, d, 0, 8 * B, 3.0f, mine); /* other tokens, and every block: the cached ones are taken */
    CHECK(tllm_kv_n_free(kv) == 0, "d holds all");
    tllm_kv_seq_truncate(kv, d, 0);
    CHECK(tllm_kv_seq_open(kv, &c) == TLLM_OK && tllm_kv_seq_reuse(kv, c, ids, 3 * B) == 0, "evicted blocks are forgotten");
    tllm_kv_seq_close(kv, c);
    CHECK(tllm_kv_seq_open(kv, &c) == TLLM_OK && tllm_kv_seq_reuse(kv, c, mine, 8 * B) == 7 * B, "d's are found instead");
    tllm_kv_seq_close(kv, c);
    tllm_kv_seq_close(kv, d);

    /* sequence slots are limited */
    int s1, s2, s3, s4;
    CHECK(!tllm_kv_seq_open(kv, &s1) && !tllm_kv_seq_open(kv, &s2) && !tllm_kv_seq_open(kv, &s3), "three slots");
    CHECK(tllm_kv_seq_open(kv, &s4) == TLLM_ERR_LIMIT, "a fourth is refused");

    /* a step's tokens as backends take them: s1 holds 3 positions, s2 none; 2 blocks each reserved */
    write(kv, s1, 0, 3, 1.0f, ids);
    CHECK(tllm_kv_seq_reserve(kv, s1, 2 * B) == TLLM_OK && tllm_kv_seq_reserve(kv, s2, 2 * B) == TLLM_OK, "reserve");
    struct {
        const char *what;
        int n;
        int32_t id[4], pos[4], seq[4];
        int rc;
        const char *msg;
    } steps[] = {
        {"a decode token and a prompt chunk", 4, {1, 2, 3, 4}, {3, 0, 1, 2}, {s1, s2, s2, s2}, TLLM_OK, ""},
        {"a position past the cache's end", 1, {1}, {4}, {s1}, TLLM_ERR_ARG, "does not follow its cache (3 positions)"},
        {"a gap", 2, {1, 1}, {0, 2}, {s2, s2}, TLLM_ERR_ARG, "position 2 does not follow 0"},
        {"a sequence split in two", 3, {1, 1, 1}, {0, 3, 1}, {s2, s1, s2}, TLLM_ERR_ARG, "not together"},
        {"a sequence id past the slots", 1, {1}, {0}, {3}, TLLM_ERR_ARG, "not open"},
        {"no block reserved", 1, {1}, {0}, {s3}, TLLM_ERR_LIMIT, "no KV block reserved"},
        {"an id out of range", 1, {50}, {3}, {s1}, TLLM_ERR_ARG, "token id 50 is out of range [0, 50)"},
        {"the same again (marks of the last step do not count)", 1, {1}, {0}, {s2}, TLLM_OK, ""},
    };
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        int rc = tllm_kv_check_step(kv, steps[i].n, steps[i].id, steps[i].pos, steps[i].seq, 50);
        CHECK(rc == steps[i].rc && (rc == TLLM_OK || strstr(tllm_errmsg(), steps[i].msg)), "%s: %d %s", steps[i].what, rc,
              rc ? tllm_errmsg() : "");
    }
    tllm_kv_free(kv);

    enum tllm_dtype t;
    CHECK(tllm_kv_type_parse("f16", &t) == TLLM_OK && t == TLLM_DT_F16 && tllm_kv_type_parse("q8", &t) == TLLM_ERR_ARG,
          "kv type names");
    return check_done();
}
