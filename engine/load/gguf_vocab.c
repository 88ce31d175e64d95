/* A GGUF file's tokenizer: llama.cpp's tokenizer.ggml.* keys written back in tokenizer.json's terms and
 * loaded by the tokenizer like any tokenizer.json. tokens are in the byte-level alphabet as in
 * tokenizer.json; token_type 1 (normal) tokens form the BPE vocabulary, 3 (control) and 4 (user-defined)
 * are added tokens, special and not special, as convert_hf_to_gguf.py wrote them from added_tokens;
 * 5 (unused: Qwen's padding rows past its 151,665 ids) are left out. `pre` names the pre-tokenizer:
 * qwen2's (and deepseek-r1-qwen's, the same) is Qwen2's Split regex, ByteLevel, NFC. */
#include "engine/load/gguf_vocab.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define TT_NORMAL 1
#define TT_CONTROL 3
#define TT_USER_DEFINED 4
#define TT_UNUSED 5

static const char qwen2_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static struct json_object *typed(const char *type) {
    struct json_object *o = json_object_new_object();
    if (o) json_object_object_add(o, "type", json_object_new_string(type));
    return o;
}

/* tokenizer.json's normalizer, pre_tokenizer and decoder for Qwen2 */
static int add_qwen2_pipeline(struct json_object *root) {
    struct json_object *split = typed("Split"), *pat = json_object_new_object(), *bl = typed("ByteLevel");
    struct json_object *seq = typed("Sequence"), *list = json_object_new_array();
    if (!split || !pat || !bl || !seq || !list) {
        json_object_put(split), json_object_put(pat), json_object_put(bl), json_object_put(seq), json_object_put(list);
        return -1;
    }
    json_object_object_add(pat, "Regex", json_object_new_string(qwen2_regex));
    json_object_object_add(split, "pattern", pat);
    json_object_object_add(split, "behavior", json_object_new_string("Isolated"));
    json_object_array_add(list, split);
    json_object_array_add(list, bl);
    json_object_object_add(seq, "pretokenizers", list);
    json_object_object_add(root, "pre_tokenizer", seq);
    json_object_object_add(root, "normalizer", typed("NFC"));
    json_object_object_add(root, "decoder", typed("ByteLevel"));
    return 0;
}

int tllm_gguf_tokenizer(const struct tllm_gguf *g, struct tllm_tok **out) {
    *out = NULL;
    const struct tllm_gguf_kv *tokens, *types, *merges;
    const char *model = NULL, *pre = NULL;
    int rc = tllm_gguf_get_arr(g, "tokenizer.ggml.tokens", TLLM_GV_STRING, &tokens);
    if (!rc) rc = tllm_gguf_get_arr(g, "tokenizer.ggml.token_type", TLLM_GV_I32, &types);
    if (!rc) rc = tllm_gguf_get_arr(g, "tokenizer.ggml.merges", TLLM_GV_STRING, &merges);
    if (!rc) rc = tllm_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (!rc) rc = tllm_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    if (rc || !tokens) return rc; /* no vocabulary: a model without a tokenizer */
    if (!model || strcmp(model, "gpt2"))
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%s' is not supported (gpt2, byte-level BPE, is)",
                         g->path, model ? model : "(missing)");
    if (!pre || (strcmp(pre, "qwen2") && strcmp(pre, "deepseek-r1-qwen")))
        return tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%s' is not supported (qwen2 is)", g->path,
                         pre ? pre : "(missing)");
    if (!merges) return tllm_fail(TLLM_ERR_FORMAT, "%s: missing key 'tokenizer.ggml.merges'", g->path);
    if (types && types->n != tokens->n)
        return tllm_fail(TLLM_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries, tokenizer.ggml.tokens %llu", g->path,
                         (unsigned long long)types->n, (unsigned long long)tokens->n);
    if (tokens->n > (1u << 24))
        return tllm_fail(TLLM_ERR_FORMAT, "%s: %llu tokens (at most %u)", g->path, (unsigned long long)tokens->n, 1u << 24);
    struct json_object *root = json_object_new_object(), *bpe = typed("BPE"), *vocab = json_object_new_object();
    struct json_object *mlist = json_object_new_array_ext((int)merges->n), *added = json_object_new_array();
    int nomem = !root || !bpe || !vocab || !mlist || !added;
    if (!nomem) {
        json_object_object_add(bpe, "vocab", vocab);
        json_object_object_add(bpe, "merges", mlist);
        json_object_object_add(root, "model", bpe);
        json_object_object_add(root, "added_tokens", added);
        nomem = add_qwen2_pipeline(root);
    } else {
        json_object_put(bpe), json_object_put(vocab), json_object_put(mlist), json_object_put(added);
    }
    for (uint64_t i = 0; i < tokens->n && !nomem && !rc; i++) {
        size_t len;
        const char *s = tllm_gguf_arr_str(tokens, i, &len);
        int64_t ty = types ? tllm_gguf_arr_int(types, i) : TT_NORMAL;
        if (ty == TT_UNUSED) continue;
        if (len == 0 || memchr(s, 0, len)) {
            rc = tllm_fail(TLLM_ERR_FORMAT, "%s: token %llu is empty or holds a NUL byte", g->path, (unsigned long long)i);
            break;
        }
        struct json_object *id = json_object_new_int64((int64_t)i);
        if (ty == TT_CONTROL || ty == TT_USER_DEFINED) {
            struct json_object *a = json_object_new_object();
            if (!a || !id) {
                json_object_put(a), json_object_put(id);
                nomem = 1;
                break;
            }
            json_object_object_add(a, "id", id);
            json_object_object_add(a, "content", json_object_new_string_len(s, (int)len));
            json_object_object_add(a, "special", json_object_new_boolean(ty == TT_CONTROL));
            json_object_array_add(added, a);
        } else {
            char *key = strndup(s, len);
            if (!key || !id) {
                free(key), json_object_put(id);
                nomem = 1;
                break;
            }
            if (json_object_object_get_ex(vocab, key, NULL))
                rc = tllm_fail(TLLM_ERR_FORMAT, "%s: token %llu ('%s') is in tokenizer.ggml.tokens twice", g->path,
                               (unsigned long long)i, key);
            json_object_object_add(vocab, key, id);
            free(key);
        }
    }
    for (uint64_t i = 0; i < merges->n && !nomem && !rc; i++) {
        size_t len;
        const char *s = tllm_gguf_arr_str(merges, i, &len);
        struct json_object *m = json_object_new_string_len(s, (int)len);
        if (!m || memchr(s, 0, len)) {
            json_object_put(m);
            if (m) rc = tllm_fail(TLLM_ERR_FORMAT, "%s: merge %llu holds a NUL byte", g->path, (unsigned long long)i);
            else nomem = 1;
            break;
        }
        json_object_array_add(mlist, m);
    }
    if (nomem && !rc) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    if (!rc) rc = tllm_tok_from_json(root, g->path, out);
    json_object_put(root);
    return rc;
}

int tllm_gguf_chat_template(const struct tllm_gguf *g, struct tllm_chat_template *tpl) {
    const char *text = NULL;
    memset(tpl, 0, sizeof *tpl);
    int rc = tllm_gguf_get_str(g, "tokenizer.chat_template", &text);
    if (rc || !text) return rc;
    /* the special tokens a template may use, as tokenizer_config.json names them */
    static const struct { const char *key, *name; } ids[] = {
        {"tokenizer.ggml.bos_token_id", "bos_token"}, {"tokenizer.ggml.eos_token_id", "eos_token"},
        {"tokenizer.ggml.unknown_token_id", "unk_token"}, {"tokenizer.ggml.padding_token_id", "pad_token"}};
    const struct tllm_gguf_kv *tokens = NULL;
    rc = tllm_gguf_get_arr(g, "tokenizer.ggml.tokens", TLLM_GV_STRING, &tokens);
    for (size_t i = 0; !rc && tokens && i < sizeof ids / sizeof ids[0]; i++) {
        int64_t id;
        int found = 0;
        rc = tllm_gguf_get_int(g, ids[i].key, 0, (int64_t)tokens->n - 1, -1, &id, &found);
        if (rc || !found) continue;
        size_t len;
        const char *s = tllm_gguf_arr_str(tokens, (uint64_t)id, &len);
        char *z = strndup(s, len);
        rc = z ? tllm_chat_template_set_token(tpl, ids[i].name, z) : tllm_fail(TLLM_ERR_NOMEM, "out of memory");
        free(z);
    }
    if (!rc) rc = tllm_chat_template_parse_keep(text, tpl, g->path);
    if (rc) tllm_chat_template_free(tpl);
    return rc;
}

int tllm_gguf_file_tokenizer(const char *path, struct tllm_tok **tok, struct tllm_chat_template *tpl) {
    struct tllm_gguf *g;
    if (tok) *tok = NULL;
    if (tpl) memset(tpl, 0, sizeof *tpl);
    int rc = tllm_gguf_open(path, &g);
    if (rc) return rc;
    if (tok) rc = tllm_gguf_tokenizer(g, tok);
    if (!rc && tok && !*tok) rc = tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: the file has no tokenizer (tokenizer.ggml.tokens)", path);
    if (!rc && tpl) rc = tllm_gguf_chat_template(g, tpl);
    tllm_gguf_close(g);
    if (rc && tok) tllm_tok_free(*tok), *tok = NULL;
    return rc;
}
