/* Loading tokenizer.json: vocabulary, merges, added tokens, normalizer, pre-tokenizer, decoder. */
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/error.h"
#include "base/json_util.h"
#include "tokenizer/tok_internal.h"

#define BPE_CACHE_SIZE 65536 /* pieces; a direct-mapped cache, so a full one just overwrites */

static const char *type_of(struct json_object *o) {
    struct json_object *t;
    if (!o || !json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "type", &t) ||
        !json_object_is_type(t, json_type_string))
        return NULL;
    return json_object_get_string(t);
}

static struct json_object *get(struct json_object *o, const char *key) {
    struct json_object *v = NULL;
    if (!o || !json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) return NULL;
    return v;
}

/* Byte-level token text (UTF-8 of byte-level characters) -> the raw bytes it stands for. */
static int token_to_bytes(const char *s, size_t len, struct tllm_buf *out) {
    out->len = 0;
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0) { /* not UTF-8: keep the byte */
            if (tllm_buf_append(out, s + i, 1)) return -1;
            i++;
            continue;
        }
        int b = tllm_bytelevel_byte((uint32_t)cp);
        if (b < 0) { /* not a byte-level character: keep its UTF-8 as is */
            if (tllm_buf_append(out, s + i, (size_t)k)) return -1;
        } else {
            unsigned char c = (unsigned char)b;
            if (tllm_buf_append(out, &c, 1)) return -1;
        }
        i += (size_t)k;
    }
    return 0;
}

static int set_token(struct tllm_tok *t, int32_t id, const char *bytes, size_t len) {
    free(t->token_bytes[id]);
    t->token_bytes[id] = malloc(len + 1);
    if (!t->token_bytes[id]) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    memcpy(t->token_bytes[id], bytes, len);
    t->token_bytes[id][len] = '\0';
    t->token_len[id] = (uint32_t)len;
    if (len > t->max_token_len) t->max_token_len = (uint32_t)len;
    return TLLM_OK;
}

static int merge_put(struct tllm_tok *t, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = tllm_hash_bytes(&key, 8) & (t->merge_cap - 1);
    while (t->merges[i].key != UINT64_MAX) {
        if (t->merges[i].key == key) return TLLM_OK; /* a duplicate merge: the first (lowest rank) wins */
        i = (i + 1) & (t->merge_cap - 1);
    }
    t->merges[i] = (struct tllm_merge_entry){key, rank, merged};
    return TLLM_OK;
}

static int load_merges(struct tllm_tok *t, struct json_object *merges, const char *path) {
    size_t n = json_object_array_length(merges);
    t->merge_cap = 16;
    while (t->merge_cap < n * 2) t->merge_cap *= 2;
    t->merges = malloc(t->merge_cap * sizeof *t->merges);
    if (!t->merges) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < t->merge_cap; i++) t->merges[i].key = UINT64_MAX;
    struct tllm_buf ba = {0}, bb = {0}, joined = {0};
    int rc = TLLM_OK;
    for (size_t r = 0; r < n && !rc; r++) {
        struct json_object *m = json_object_array_get_idx(merges, r);
        const char *a, *b;
        size_t la, lb;
        if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2 &&
            json_object_is_type(json_object_array_get_idx(m, 0), json_type_string) &&
            json_object_is_type(json_object_array_get_idx(m, 1), json_type_string)) {
            a = json_object_get_string(json_object_array_get_idx(m, 0));
            la = (size_t)json_object_get_string_len(json_object_array_get_idx(m, 0));
            b = json_object_get_string(json_object_array_get_idx(m, 1));
            lb = (size_t)json_object_get_string_len(json_object_array_get_idx(m, 1));
        } else if (json_object_is_type(m, json_type_string)) { /* legacy "a b" */
            a = json_object_get_string(m);
            const char *sp = strchr(a + (a[0] != '\0'), ' ');
            if (!sp) {
                rc = tllm_fail(TLLM_ERR_FORMAT, "%s: merge %zu ('%s') is not two tokens", path, r, a);
                break;
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else {
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: merge %zu is neither [\"a\", \"b\"] nor \"a b\"", path, r);
            break;
        }
        /* the vocab is keyed by raw bytes: translate both halves out of the byte-level alphabet */
        if (token_to_bytes(a, la, &ba) < 0 || token_to_bytes(b, lb, &bb) < 0 || tllm_buf_append(&ba, "", 0) ||
            tllm_buf_append(&bb, "", 0)) {
            rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
            break;
        }
        joined.len = 0;
        if (tllm_buf_append(&joined, ba.data, ba.len) || tllm_buf_append(&joined, bb.data, bb.len)) {
            rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
            break;
        }
        int32_t ia = tllm_strmap_get(&t->vocab, ba.data, ba.len), ib = tllm_strmap_get(&t->vocab, bb.data, bb.len);
        int32_t im = tllm_strmap_get(&t->vocab, joined.data, joined.len);
        if (ia < 0 || ib < 0 || im < 0)
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: merge %zu ('%.*s' + '%.*s'): token not in the vocabulary",
                           path, r, (int)la, a, (int)lb, b);
        else
            rc = merge_put(t, ia, ib, (int32_t)r, im);
    }
    tllm_buf_free(&ba);
    tllm_buf_free(&bb);
    tllm_buf_free(&joined);
    return rc;
}

static int cmp_added(const void *x, const void *y) {
    const struct tllm_added_token *a = x, *b = y;
    return a->len < b->len ? 1 : a->len > b->len ? -1 : strcmp(a->content, b->content);
}

static int load_added(struct tllm_tok *t, struct json_object *arr, const char *path) {
    size_t n = arr ? json_object_array_length(arr) : 0;
    t->added = calloc(n + 1, sizeof *t->added);
    if (!t->added) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        struct json_object *e = json_object_array_get_idx(arr, i);
        struct json_object *jid = get(e, "id"), *jc = get(e, "content"), *js = get(e, "special");
        if (!jid || !jc || !json_object_is_type(jid, json_type_int) || !json_object_is_type(jc, json_type_string))
            return tllm_fail(TLLM_ERR_FORMAT, "%s: added_tokens[%zu] needs an integer id and a string content", path, i);
        int64_t id = json_object_get_int64(jid);
        size_t len = (size_t)json_object_get_string_len(jc);
        if (id < 0 || id >= t->n_vocab || len == 0)
            return tllm_fail(TLLM_ERR_FORMAT, "%s: added_tokens[%zu] has a bad id or empty content", path, i);
        struct tllm_added_token *a = &t->added[t->n_added++];
        a->id = (int32_t)id;
        a->len = len;
        a->special = js && json_object_get_boolean(js);
        if (!(a->content = malloc(len + 1))) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        memcpy(a->content, json_object_get_string(jc), len + 1);
        t->added_first[(unsigned char)a->content[0]] = 1;
        t->is_special[id] = (uint8_t)a->special;
        int rc = set_token(t, a->id, a->content, len);
        if (rc) return rc;
    }
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added); /* longest match first */
    return TLLM_OK;
}

typedef int (*node_loader)(struct tllm_tok *t, struct json_object *node, const char *path);

/* A {"type": "Sequence", KEY: [...]} node: load each element in order. */
static int load_sequence(struct tllm_tok *t, struct json_object *node, const char *key, node_loader load,
                         const char *path) {
    struct json_object *seq = get(node, key);
    size_t k = seq && json_object_is_type(seq, json_type_array) ? json_object_array_length(seq) : 0;
    for (size_t i = 0; i < k; i++) {
        int rc = load(t, json_object_array_get_idx(seq, i), path);
        if (rc) return rc;
    }
    return TLLM_OK;
}

static int load_normalizer(struct tllm_tok *t, struct json_object *n, const char *path) {
    const char *ty = type_of(n);
    if (!n) return TLLM_OK;
    if (ty && !strcmp(ty, "NFC")) {
        t->nfc = 1;
        return TLLM_OK;
    }
    if (ty && !strcmp(ty, "Sequence")) return load_sequence(t, n, "normalizers", load_normalizer, path);
    return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: normalizer type '%s' is not supported (NFC is)", path,
                     ty ? ty : "?");
}

static int compile_split(struct tllm_tok *t, struct json_object *p, const char *path) {
    struct json_object *pat = get(p, "pattern"), *beh = get(p, "behavior"), *inv = get(p, "invert");
    struct json_object *re = get(pat, "Regex"), *lit = get(pat, "String");
    if (t->split_re)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: more than one Split pre-tokenizer is not supported", path);
    if (!beh || strcmp(json_object_get_string(beh), "Isolated") != 0)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: Split behavior '%s' is not supported (Isolated is)", path,
                         beh ? json_object_get_string(beh) : "?");
    if (inv && json_object_get_boolean(inv))
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: an inverted Split is not supported", path);
    struct json_object *src = re ? re : lit;
    if (!src || !json_object_is_type(src, json_type_string))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: Split pre-tokenizer has no pattern", path);
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (re ? 0 : PCRE2_LITERAL);
    t->split_re = pcre2_compile((PCRE2_SPTR)json_object_get_string(src),
                                (PCRE2_SIZE)json_object_get_string_len(src), opts, &err, &off, NULL);
    if (!t->split_re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return tllm_fail(TLLM_ERR_FORMAT, "%s: the Split regex does not compile at offset %zu: %s", path,
                         (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(t->split_re, PCRE2_JIT_COMPLETE); /* the interpreter is used if JIT is unavailable */
    t->md = pcre2_match_data_create_from_pattern(t->split_re, NULL);
    t->mctx = pcre2_match_context_create(NULL);
    t->jit_stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
    if (!t->md || !t->mctx || !t->jit_stack) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    pcre2_jit_stack_assign(t->mctx, NULL, t->jit_stack);
    return TLLM_OK;
}

static int load_pretokenizer(struct tllm_tok *t, struct json_object *p, const char *path) {
    const char *ty = type_of(p);
    if (!p) return TLLM_OK;
    if (ty && !strcmp(ty, "Sequence")) return load_sequence(t, p, "pretokenizers", load_pretokenizer, path);
    if (ty && !strcmp(ty, "Split")) return compile_split(t, p, path);
    if (ty && !strcmp(ty, "ByteLevel")) {
        struct json_object *aps = get(p, "add_prefix_space"), *ur = get(p, "use_regex");
        if ((aps && json_object_get_boolean(aps)) || (ur && json_object_get_boolean(ur)))
            return tllm_fail(TLLM_ERR_UNSUPPORTED,
                             "%s: ByteLevel pre-tokenizer with add_prefix_space or use_regex is not "
                             "supported (Qwen2 style: a Split regex, then ByteLevel without them)",
                             path);
        return TLLM_OK;
    }
    return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported (Split, ByteLevel are)",
                     path, ty ? ty : "?");
}

static int load_json(struct tllm_tok *t, struct json_object *root, const char *path) {
    struct json_object *model = get(root, "model");
    const char *mt = type_of(model);
    if (!model) return tllm_fail(TLLM_ERR_FORMAT, "%s: missing \"model\"", path);
    if (mt && strcmp(mt, "BPE") != 0)
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (BPE is)", path, mt);
    struct json_object *im = get(model, "ignore_merges");
    t->ignore_merges = im && json_object_get_boolean(im);
    struct json_object *bf = get(model, "byte_fallback");
    if (bf && json_object_get_boolean(bf))
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: BPE byte_fallback is not supported", path);
    const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        struct json_object *v = get(model, affix[i]);
        if (v && json_object_is_type(v, json_type_string) && json_object_get_string_len(v) > 0)
            return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: BPE %s is not supported", path, affix[i]);
    }
    struct json_object *vocab = get(model, "vocab"), *merges = get(model, "merges");
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: missing model.vocab object", path);
    if (!merges || !json_object_is_type(merges, json_type_array))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: missing model.merges array", path);
    struct json_object *added = get(root, "added_tokens");
    if (added && !json_object_is_type(added, json_type_array))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: added_tokens must be an array", path);

    /* size the id space */
    int64_t max_id = -1;
    json_object_object_foreach(vocab, k0, v0) {
        (void)k0;
        if (!json_object_is_type(v0, json_type_int) || json_object_get_int64(v0) < 0 ||
            json_object_get_int64(v0) >= (1 << 24))
            return tllm_fail(TLLM_ERR_FORMAT, "%s: vocab entry '%s' has a bad id", path, k0);
        if (json_object_get_int64(v0) > max_id) max_id = json_object_get_int64(v0);
    }
    for (size_t i = 0; added && i < json_object_array_length(added); i++) {
        struct json_object *jid = get(json_object_array_get_idx(added, i), "id");
        if (jid && json_object_is_type(jid, json_type_int) && json_object_get_int64(jid) > max_id &&
            json_object_get_int64(jid) < (1 << 24))
            max_id = json_object_get_int64(jid);
    }
    t->n_vocab = (int)(max_id + 1);
    t->token_bytes = calloc((size_t)t->n_vocab + 1, sizeof *t->token_bytes);
    t->token_len = calloc((size_t)t->n_vocab + 1, sizeof *t->token_len);
    t->is_special = calloc((size_t)t->n_vocab + 1, 1);
    if (!t->token_bytes || !t->token_len || !t->is_special) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    int rc = tllm_strmap_init(&t->vocab, (size_t)json_object_object_length(vocab));
    if (rc) return rc;
    /* keys are borrowed from the JSON tree: keep the tree alive in the vocab's lifetime by copying */
    struct tllm_buf bytes = {0};
    json_object_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_object_get_int64(val);
        size_t klen = strlen(key);
        if (token_to_bytes(key, klen, &bytes) < 0 || set_token(t, id, bytes.data ? bytes.data : "", bytes.len)) {
            tllm_buf_free(&bytes);
            return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        }
    }
    tllm_buf_free(&bytes);
    /* the vocab map is keyed by raw bytes: BPE works on bytes, not on byte-level characters */
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->token_bytes[id]) tllm_strmap_put(&t->vocab, t->token_bytes[id], t->token_len[id], id);
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_id[b] = tllm_strmap_get(&t->vocab, (const char *)&c, 1);
        if (t->byte_id[b] < 0)
            return tllm_fail(TLLM_ERR_FORMAT, "%s: the vocabulary has no byte-level token for byte 0x%02x", path, b);
    }
    if ((rc = load_merges(t, merges, path))) return rc;
    if ((rc = load_added(t, added, path))) return rc;
    if ((rc = load_normalizer(t, get(root, "normalizer"), path))) return rc;
    if ((rc = load_pretokenizer(t, get(root, "pre_tokenizer"), path))) return rc;
    const char *dt = type_of(get(root, "decoder"));
    if (get(root, "decoder") && (!dt || strcmp(dt, "ByteLevel") != 0))
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: decoder type '%s' is not supported (ByteLevel is)", path,
                         dt ? dt : "?");
    t->cache_cap = BPE_CACHE_SIZE;
    t->cache = calloc(t->cache_cap, sizeof *t->cache);
    return t->cache ? TLLM_OK : tllm_fail(TLLM_ERR_NOMEM, "out of memory");
}

int tllm_tok_from_json(struct json_object *root, const char *path, struct tllm_tok **out) {
    *out = NULL;
    struct tllm_tok *t = calloc(1, sizeof *t);
    if (!t) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    int rc;
    if (!(t->path = strdup(path))) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    else rc = json_object_is_type(root, json_type_object) ? load_json(t, root, path)
                                                      : tllm_fail(TLLM_ERR_FORMAT, "%s: not a JSON object", path);
    if (rc) {
        tllm_tok_free(t);
        return rc;
    }
    *out = t;
    return TLLM_OK;
}

int tllm_tok_load(const char *path, struct tllm_tok **out) {
    *out = NULL;
    struct json_object *root;
    int rc = tllm_json_load_file(path, TLLM_TOK_MAX_FILE, &root);
    if (rc) return rc;
    rc = tllm_tok_from_json(root, path, out);
    json_object_put(root);
    return rc;
}

void tllm_tok_free(struct tllm_tok *t) {
    if (!t) return;
    free(t->path);
    for (int i = 0; t->token_bytes && i < t->n_vocab; i++) free(t->token_bytes[i]);
    free(t->token_bytes);
    free(t->token_len);
    free(t->is_special);
    tllm_strmap_free(&t->vocab);
    free(t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    if (t->md) pcre2_match_data_free(t->md);
    if (t->mctx) pcre2_match_context_free(t->mctx);
    if (t->jit_stack) pcre2_jit_stack_free(t->jit_stack);
    if (t->split_re) pcre2_code_free(t->split_re);
    for (size_t i = 0; t->cache && i < t->cache_cap; i++) {
        free(t->cache[i].word);
        free(t->cache[i].ids);
    }
    free(t->cache);
    free(t);
}

int tllm_tok_n_vocab(const struct tllm_tok *t) { return t->n_vocab; }

int32_t tllm_tok_find(const struct tllm_tok *t, const char *content) {
    for (int i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, content)) return t->added[i].id;
    return tllm_strmap_get(&t->vocab, content, strlen(content));
}

int tllm_tok_is_special(const struct tllm_tok *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->is_special[id];
}

const char *tllm_tok_bytes(const struct tllm_tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || !t->token_bytes[id]) return NULL;
    *len = t->token_len[id];
    return t->token_bytes[id];
}
