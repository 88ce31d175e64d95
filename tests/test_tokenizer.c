/* The tokenizer against Hugging Face: llama.cpp's vectors, transformers' integration strings, edge
 * cases, chat templates, legacy merges, and hostile input. */
#include <json-c/json.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

#include "tests/check.h"
#include "base/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

static char dir[1024];

static char *slurp(const char *name, size_t *n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return check_slurp(path, n);
}

static int ids_equal(const struct tllm_ids *got, const int32_t *want, size_t n) {
    if (got->len != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (got->data[i] != want[i]) return 0;
    return 1;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

/* encode(text) == want; returns 1 on match. */
static int expect_encode(struct tllm_tok *t, const char *text, size_t len, int special, const int32_t *want,
                         size_t nwant, const char *what) {
    struct tllm_ids got = {0};
    int rc = tllm_tok_encode(t, text, len, special, &got);
    int ok = rc == TLLM_OK && ids_equal(&got, want, nwant);
    CHECK(ok, "%s: encoding of '%.60s' differs (rc %d %s)", what, text, rc, tllm_errmsg());
    if (!ok) {
        print_ids("want", want, nwant);
        print_ids("got ", got.data, got.len);
    }
    tllm_ids_free(&got);
    return ok;
}

static int32_t *json_ids(struct json_object *a, size_t *n) {
    *n = json_object_array_length(a);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = json_object_get_int(json_object_array_get_idx(a, i));
    return v;
}

static void test_ggml_vectors(struct tllm_tok *t, const char *label) {
    size_t ni, no;
    char *inp = slurp("ggml-vocab-qwen2.gguf.inp", &ni), *out = slurp("ggml-vocab-qwen2.gguf.out", &no);
    CHECK(inp && out, "missing ggml vectors");
    if (!inp || !out) return;
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char *p = inp, *line = out;
    int count = 0, ok = 0;
    for (;;) {
        char *e = strstr(p, sep);
        if (!e) break;
        char *nl = strchr(line, '\n');
        if (!nl) break;
        *nl = '\0';
        int32_t want[512];
        size_t nw = 0;
        for (char *q = line; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int32_t)v;
            q = end;
        }
        ok += expect_encode(t, p, (size_t)(e - p), 0, want, nw, label);
        count++;
        *nl = '\n';
        line = nl + 1;
        p = e + sizeof sep - 1;
    }
    CHECK(count == 43, "expected 43 llama.cpp vectors, read %d", count);
    printf("  %s: llama.cpp vectors %d/%d exact\n", label, ok, count);
    free(inp);
    free(out);
}

static void test_json_cases(struct tllm_tok *t, const char *file, const char *label, int roundtrip) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct json_object *root = json_object_from_file(path), *cases = root;
    CHECK(root != NULL, "cannot read %s", path);
    if (!root) return;
    if (json_object_is_type(root, json_type_object)) json_object_object_get_ex(root, "cases", &cases);
    size_t n = json_object_array_length(cases);
    int ok = 0;
    for (size_t i = 0; i < n; i++) {
        struct json_object *c = json_object_array_get_idx(cases, i), *jt, *ji;
        json_object_object_get_ex(c, "text", &jt);
        json_object_object_get_ex(c, "ids", &ji);
        const char *text = json_object_get_string(jt);
        size_t len = (size_t)json_object_get_string_len(jt), nw;
        int32_t *want = json_ids(ji, &nw);
        ok += expect_encode(t, text, len, 1, want, nw, label);
        if (roundtrip) { /* decode(encode(s)) == NFC(s) */
            struct tllm_buf dec = {0};
            CHECK(tllm_tok_decode(t, want, nw, 0, &dec) == TLLM_OK, "decode: %s", tllm_errmsg());
            utf8proc_uint8_t *nfc = NULL;
            utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            CHECK(k >= 0 && dec.len == (size_t)k && memcmp(dec.data, nfc, (size_t)k) == 0,
                  "%s: decode(encode('%.40s')) != NFC", label, text);
            free(nfc);
            tllm_buf_free(&dec);
        }
        free(want);
    }
    printf("  %s: %s %d/%zu exact\n", label, file, ok, n);
    json_object_put(root);
}

/* A server renders one template from many threads at once: the renders are the same as one alone, and
 * the template's special tokens (bos_token, eos_token ...) are still held exactly once after them (json-c's
 * reference counts are not atomic: a render that took references to them lost counts, which leaked them
 * or freed them under another thread) */
struct render_job {
    const struct tllm_chat_template *tpl;
    const struct tllm_chat_msg *msgs;
    int n, differ;
    const char *want;
};

static void *render_many(void *arg) {
    struct render_job *r = arg;
    for (int i = 0; i < 4000; i++) {
        struct tllm_buf b = {0};
        if (tllm_chat_render(r->tpl, r->msgs, r->n, 1, &b) || !b.data || strcmp(b.data, r->want)) r->differ++;
        tllm_buf_free(&b);
    }
    return NULL;
}

static void test_chat_threads(struct tllm_chat_template *tpl, const struct tllm_chat_msg *msgs, int n, const char *want) {
    enum { NT = 4 };
    pthread_t th[NT];
    struct render_job jobs[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (struct render_job){tpl, msgs, n, 0, want};
        CHECK(pthread_create(&th[i], NULL, render_many, &jobs[i]) == 0, "pthread_create");
    }
    int differ = 0;
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL), differ += jobs[i].differ;
    CHECK(differ == 0, "%d of %d renders from %d threads differ from one alone", differ, NT * 4000, NT);
    CHECK(tpl->specials && json_object_object_length(tpl->specials) > 0, "the template has special tokens");
    /* held once: taken out of the template (it lets go of its reference), the last put frees it. The
     * template is freed next, so emptying it changes nothing after. */
    char *keys[16];
    int nk = 0, held_once = 1;
    json_object_object_foreach(tpl->specials, k, v) {
        (void)v;
        if (nk < 16) keys[nk++] = strdup(k);
    }
    for (int i = 0; i < nk; i++) {
        struct json_object *tok = NULL;
        json_object_object_get_ex(tpl->specials, keys[i], &tok);
        struct json_object *mine = json_object_get(tok);
        json_object_object_del(tpl->specials, keys[i]);
        held_once &= json_object_put(mine) == 1;
        free(keys[i]);
    }
    CHECK(held_once, "the template's special tokens are held as before the threads");
}

static void test_chat(struct tllm_tok *t) {
    char path[1200];
    struct tllm_chat_template tpl;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    CHECK(tllm_chat_template_load(path, &tpl) == TLLM_OK, "template: %s", tllm_errmsg());
    CHECK(tpl.kind == TLLM_CHAT_JINJA, "the template is not run as Jinja");
    snprintf(path, sizeof path, "%s/chat-template-cases.json", dir);
    struct json_object *root = json_object_from_file(path), *cases;
    json_object_object_get_ex(root, "cases", &cases);
    int ok = 0;
    size_t nc = json_object_array_length(cases);
    for (size_t i = 0; i < nc; i++) {
        struct json_object *c = json_object_array_get_idx(cases, i), *jm, *jt, *ji, *jg;
        json_object_object_get_ex(c, "messages", &jm);
        json_object_object_get_ex(c, "text", &jt);
        json_object_object_get_ex(c, "ids", &ji);
        json_object_object_get_ex(c, "add_generation_prompt", &jg);
        int nm = (int)json_object_array_length(jm);
        struct tllm_chat_msg msgs[16];
        for (int k = 0; k < nm && k < 16; k++) {
            struct json_object *m = json_object_array_get_idx(jm, (size_t)k), *r, *ct;
            json_object_object_get_ex(m, "role", &r);
            json_object_object_get_ex(m, "content", &ct);
            msgs[k] = (struct tllm_chat_msg){json_object_get_string(r), json_object_get_string(ct)};
        }
        struct tllm_buf text = {0};
        CHECK(tllm_chat_render(&tpl, msgs, nm, json_object_get_boolean(jg), &text) == TLLM_OK, "render");
        int same = text.data && !strcmp(text.data, json_object_get_string(jt));
        CHECK(same, "chat case %zu renders '%s'", i, text.data);
        size_t nw;
        int32_t *want = json_ids(ji, &nw);
        ok += same && expect_encode(t, text.data, text.len, 1, want, nw, "chat");
        free(want);
        tllm_buf_free(&text);
    }
    printf("  chat-template-cases %d/%zu exact\n", ok, nc);
    json_object_put(root);

    /* a multi-turn conversation follows the template's loop */
    struct tllm_chat_msg conv[] = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
    struct tllm_buf b = {0};
    tllm_chat_render(&tpl, conv, 3, 1, &b);
    CHECK(b.data && !strcmp(b.data, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                                    "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                                    "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
          "multi-turn render: %s", b.data);
    test_chat_threads(&tpl, conv, 3, b.data);
    tllm_buf_free(&b);
    tllm_chat_template_free(&tpl);

    /* Qwen2's template (different default system prompt, same shape) */
    const char *qwen2 = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                        "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
                        "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
                        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    struct tllm_chat_msg one[] = {{"user", "Hi"}};
    CHECK(tllm_chat_template_parse(qwen2, &tpl, "qwen2") == TLLM_OK && tpl.kind == TLLM_CHAT_JINJA, "Qwen2: %s",
          tllm_errmsg());
    tllm_chat_render(&tpl, one, 1, 1, &b);
    CHECK(b.data && !strcmp(b.data, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                                    "Hi<|im_end|>\n<|im_start|>assistant\n"),
          "Qwen2 render: %s", b.data);
    tllm_buf_free(&b);
    tllm_chat_template_free(&tpl);
    /* not ChatML: run all the same */
    const char *llama = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}";
    CHECK(tllm_chat_template_parse(llama, &tpl, "llama") == TLLM_OK && tllm_chat_render(&tpl, one, 1, 1, &b) == TLLM_OK &&
              !strcmp(b.data, "[INST] Hi [/INST]"),
          "a non-ChatML template: %s", b.data ? b.data : tllm_errmsg());
    tllm_buf_free(&b);
    tllm_chat_template_free(&tpl);
    /* ChatML the interpreter refuses (an include): rendered as ChatML, the reason kept */
    const char *refused = "{% include 'x' %}{{ '<|im_start|>system\\nDefault prompt.<|im_end|>\\n' }}"
                          "{{ '<|im_start|>' + m + '<|im_end|>' }}";
    CHECK(tllm_chat_template_parse(refused, &tpl, "refused") == TLLM_OK && tpl.kind == TLLM_CHAT_CHATML &&
              tpl.default_system && !strcmp(tpl.default_system, "Default prompt.") && tpl.parse_error &&
              strstr(tpl.parse_error, "refused:1:4: unknown or unsupported tag 'include'"),
          "ChatML fallback: %s", tpl.parse_error ? tpl.parse_error : tllm_errmsg());
    tllm_chat_template_free(&tpl);
    /* neither: an error naming the place */
    CHECK(tllm_chat_template_parse("{% if x %}[INST]", &tpl, "bad") == TLLM_ERR_UNSUPPORTED &&
              strstr(tllm_errmsg(), "bad:1:17: missing '{% endif %}'"),
          "an unparsable template: %s", tllm_errmsg());
    tllm_chat_template_free(&tpl);
}

static void test_stream(struct tllm_tok *t) {
    /* emoji and CJK characters split across byte-level tokens */
    const char *text = "Hello 🤗 世界! 🧑‍🚀 naïve café — \xF0\x9F\x98\x80";
    struct tllm_ids ids = {0};
    tllm_tok_encode(t, text, strlen(text), 1, &ids);
    struct tllm_tok_stream s;
    tllm_tok_stream_init(&s, t, 0);
    struct tllm_buf all = {0};
    int split_held = 0, chunks_valid = 1;
    for (size_t i = 0; i < ids.len; i++) {
        struct tllm_buf chunk = {0};
        CHECK(tllm_tok_stream_push(&s, ids.data[i], &chunk) == TLLM_OK, "push");
        if (s.n_pending) split_held++;
        if (tllm_utf8_valid_prefix(chunk.data, chunk.len) != chunk.len) chunks_valid = 0;
        tllm_buf_append(&all, chunk.data, chunk.len);
        tllm_buf_free(&chunk);
    }
    tllm_tok_stream_flush(&s, &all);
    CHECK(chunks_valid, "a streamed chunk was not complete UTF-8");
    CHECK(split_held > 0, "no character was split across tokens: the test does not exercise holding back");
    CHECK(all.data && !strcmp(all.data, text), "streamed text differs: '%s'", all.data);
    /* skip_special */
    int32_t with_special[] = {151644, 872, 198, 9707, 151645};
    struct tllm_buf d = {0};
    tllm_tok_decode(t, with_special, 5, 1, &d);
    CHECK(d.data && !strcmp(d.data, "user\nHello"), "skip_special decode: '%s'", d.data);
    tllm_buf_free(&d);
    tllm_tok_decode(t, with_special, 5, 0, &d);
    CHECK(d.data && !strcmp(d.data, "<|im_start|>user\nHello<|im_end|>"), "decode: '%s'", d.data);
    tllm_buf_free(&d);
    int32_t bad = 999999;
    CHECK(tllm_tok_decode(t, &bad, 1, 0, &d) == TLLM_ERR_ARG, "out-of-range id accepted");
    tllm_buf_free(&d);
    tllm_buf_free(&all);
    tllm_ids_free(&ids);
}

static void test_hostile(struct tllm_tok *t) {
    struct tllm_ids ids = {0};
    struct tllm_buf d = {0};
    /* empty */
    CHECK(tllm_tok_encode(t, "", 0, 1, &ids) == TLLM_OK && ids.len == 0, "empty string");
    /* invalid UTF-8 round-trips byte for byte through byte-level tokens */
    const char inv[] = "ok \xff\xfe bad \xc3\x28 lone \xe2\x82 end\x80";
    CHECK(tllm_tok_encode(t, inv, sizeof inv - 1, 1, &ids) == TLLM_OK, "invalid UTF-8: %s", tllm_errmsg());
    struct tllm_buf raw = {0};
    for (size_t i = 0; i < ids.len; i++) {
        size_t n;
        const char *b = tllm_tok_bytes(t, ids.data[i], &n);
        tllm_buf_append(&raw, b, n);
    }
    CHECK(raw.len == sizeof inv - 1 && !memcmp(raw.data, inv, raw.len), "invalid UTF-8 bytes not preserved");
    tllm_tok_decode(t, ids.data, ids.len, 0, &d);
    CHECK(d.data && strstr(d.data, "\xEF\xBF\xBD") && strstr(d.data, "ok ") && strstr(d.data, " end"),
          "decode of invalid bytes: '%s'", d.data);
    tllm_buf_free(&raw);
    tllm_buf_free(&d);
    /* NUL bytes are text like any other */
    ids.len = 0;
    const char nul[] = "a\0b\0\0c";
    CHECK(tllm_tok_encode(t, nul, 6, 1, &ids) == TLLM_OK && ids.len > 0, "NUL bytes");
    tllm_tok_decode(t, ids.data, ids.len, 0, &d);
    CHECK(d.len == 6 && !memcmp(d.data, nul, 6), "NUL bytes do not round-trip");
    tllm_buf_free(&d);
    /* 1 MB of one character, of spaces, of a multi-byte character: bounded time, exact round trip */
    const char *fills[] = {"a", " ", "é", "1"};
    for (int f = 0; f < 4; f++) {
        size_t unit = strlen(fills[f]), n = (1u << 20) / unit * unit;
        char *big = malloc(n + 1);
        for (size_t i = 0; i < n; i += unit) memcpy(big + i, fills[f], unit);
        ids.len = 0;
        clock_t c0 = clock();
        int rc = tllm_tok_encode(t, big, n, 1, &ids);
        double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
        CHECK(rc == TLLM_OK, "1 MB of '%s': %s", fills[f], tllm_errmsg());
        tllm_tok_decode(t, ids.data, ids.len, 0, &d);
        CHECK(d.len == n && !memcmp(d.data, big, n), "1 MB of '%s' does not round-trip", fills[f]);
        if (f == 3) /* the split regex isolates every digit (\p{N}) */
            CHECK(ids.len == n, "1 MB of digits: %zu tokens", ids.len);
        else
            CHECK(ids.len < n, "1 MB of '%s': no merges happened", fills[f]);
        printf("  1 MB of '%s': %zu tokens in %.2f s\n", fills[f], ids.len, secs);
        tllm_buf_free(&d);
        free(big);
    }
    tllm_ids_free(&ids);
}

/* Encoding with a token budget (a server's prompt against its context): the same ids as without one
 * while they fit, for every budget around a text's length; past it, the refusal, with the work cut
 * short: a piece too long for the ids left is refused before it is merged (out holds nothing of it). */
static void test_budget(struct tllm_tok *t) {
    const char *texts[] = {"Hello, world! This is <|im_start|>a test\n\n  with   spaces and digits 12345.",
                           "\xff\xfe invalid bytes \xc3 then text", "<|im_end|><|im_end|>"};
    for (int k = 0; k < 3; k++) {
        struct tllm_ids full = {0}, ids = {0};
        size_t n = strlen(texts[k]);
        CHECK(tllm_tok_encode(t, texts[k], n, 1, &full) == TLLM_OK, "encode: %s", tllm_errmsg());
        for (size_t max = 0; max <= full.len + 1; max++) {
            int over = -1;
            ids.len = 0;
            int rc = tllm_tok_encode_max(t, texts[k], n, 1, max, &ids, &over);
            if (max >= full.len)
                CHECK(rc == TLLM_OK && !over && ids_equal(&ids, full.data, full.len), "text %d, budget %zu: %s", k, max,
                      tllm_errmsg());
            else
                CHECK(rc == TLLM_ERR_LIMIT && over && ids.len <= max && strstr(tllm_errmsg(), "more than"),
                      "text %d, budget %zu of %zu: rc %d, %zu ids", k, max, full.len, rc, ids.len);
        }
        tllm_ids_free(&full);
        tllm_ids_free(&ids);
    }
    /* a 4 MB word (the longest token is 128 bytes: 32,768 tokens at least) against 4,096: no merge at all */
    size_t n = 4u << 20;
    char *word = malloc(n);
    memset(word, 'a', n);
    struct tllm_ids ids = {0};
    int over = 0;
    CHECK(tllm_tok_encode_max(t, word, n, 1, 4096, &ids, &over) == TLLM_ERR_LIMIT && over && ids.len == 0,
          "a 4 MB word under a budget of 4096: %zu ids", ids.len);
    /* after the budget the encoder is unbounded again */
    ids.len = 0;
    CHECK(tllm_tok_encode(t, word, 5000, 1, &ids) == TLLM_OK && ids.len > 0, "an encode after a budgeted one");
    /* a regex or other failure is not a budget refusal */
    over = 1;
    ids.len = 0;
    CHECK(tllm_tok_encode_max(t, "ok", 2, 1, 10, &ids, &over) == TLLM_OK && !over, "a short text with room");
    tllm_ids_free(&ids);
    free(word);
}

/* Write a copy of tokenizer.json with merges in the legacy "a b" form. */
static int write_legacy(const char *out) {
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct json_object *root = json_object_from_file(path), *model, *merges;
    if (!root) return -1;
    json_object_object_get_ex(root, "model", &model);
    json_object_object_get_ex(model, "merges", &merges);
    struct json_object *legacy = json_object_new_array();
    for (size_t i = 0; i < json_object_array_length(merges); i++) {
        struct json_object *m = json_object_array_get_idx(merges, i);
        const char *a = json_object_get_string(json_object_array_get_idx(m, 0));
        const char *b = json_object_get_string(json_object_array_get_idx(m, 1));
        size_t la = strlen(a), lb = strlen(b);
        char *s = malloc(la + lb + 2);
        memcpy(s, a, la);
        s[la] = ' ';
        memcpy(s + la + 1, b, lb + 1);
        json_object_array_add(legacy, json_object_new_string(s));
        free(s);
    }
    json_object_object_add(model, "merges", legacy);
    int rc = json_object_to_file_ext(out, root, JSON_C_TO_STRING_PLAIN);
    json_object_put(root);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_tokenizer DATA_DIR\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct tllm_tok *t;
    clock_t c0 = clock();
    int rc = tllm_tok_load(path, &t);
    CHECK(rc == TLLM_OK, "load: %s", tllm_errmsg());
    if (rc) return check_done();
    printf("loaded %s: %d ids in %.2f s\n", path, tllm_tok_n_vocab(t), (double)(clock() - c0) / CLOCKS_PER_SEC);
    CHECK(tllm_tok_n_vocab(t) == 151665, "n_vocab %d", tllm_tok_n_vocab(t));
    CHECK(tllm_tok_find(t, "<|im_end|>") == 151645, "find <|im_end|>");
    test_ggml_vectors(t, "pair merges");
    test_json_cases(t, "qwen2_tokenizer_integration.json", "pair merges", 1);
    test_json_cases(t, "tokenizer-edge-cases.json", "pair merges", 1);
    test_chat(t);
    test_stream(t);
    test_hostile(t);
    test_budget(t);
    /* special-token parsing off: the text of a special token is encoded as plain text */
    struct tllm_ids ids = {0};
    tllm_tok_encode(t, "<|im_end|>", 10, 0, &ids);
    CHECK(ids.len > 1 && ids.data[0] != 151645, "special token parsed with parsing off");
    tllm_ids_free(&ids);
    tllm_tok_free(t);

    char legacy[] = "/tmp/tllm-legacy-merges-XXXXXX";
    int fd = mkstemp(legacy);
    CHECK(fd >= 0 && write_legacy(legacy) == 0, "writing legacy merges");
    if (fd >= 0) close(fd);
    CHECK(tllm_tok_load(legacy, &t) == TLLM_OK, "legacy load: %s", tllm_errmsg());
    test_ggml_vectors(t, "legacy merges");
    test_json_cases(t, "qwen2_tokenizer_integration.json", "legacy merges", 0);
    test_json_cases(t, "tokenizer-edge-cases.json", "legacy merges", 0);
    tllm_tok_free(t);
    unlink(legacy);
    return check_done();
}
