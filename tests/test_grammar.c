/* Constrained decoding (engine/grammar/): schemas and patterns accept and refuse the texts they
 * should, unsupported keywords are named, the token masks equal a brute-force check of every token,
 * and text sampled under a grammar from random logits parses and matches it.
 * usage: test_grammar TOKENIZER_DIR */
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/regex.h"
#include "engine/grammar/token_mask.h"
#include "engine/run/sampler.h"
#include "tests/check.h"
#include "tokenizer/tokenizer.h"

static struct tllm_grammar *schema(const char *text) {
    struct json_object *s = text ? json_tokener_parse(text) : NULL;
    struct tllm_grammar *g = NULL;
    if (tllm_schema_grammar(s, "schema", &g)) fprintf(stderr, "  (%s)\n", tllm_errmsg());
    json_object_put(s);
    return g;
}

struct scase {
    const char *schema;
    const char *yes[8];
    const char *no[8];
};

static const struct scase cases[] = {
    {NULL, /* json_object: any object */
     {"{}", "{\"a\": [1, 2.5, -3e2, true, null, \"x\"]}", "{\n  \"k\": {\"n\": {}}\n}", "{\"\\u00e9\\n\": \"\xc3\xa9\"}"},
     {"[]", "1", "{\"a\"}", "{\"a\": 01}", "{\"a\": 1,}", "{\"a\": \"\x01\"}", "{\"a\": \"\xc3\"}", "{}  "}},
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
     "\"required\":[\"name\"]}",
     {"{\"name\": \"Ann\", \"age\": 31}", "{\"name\":\"Bo\"}", "{ \"name\" : \"\" , \"age\" : -0 }"},
     {"{}", "{\"age\": 3}", "{\"age\": 3, \"name\": \"x\"}", "{\"name\": \"x\", \"age\": 3.5}", "{\"name\": \"x\", \"other\": 1}",
      "{\"name\": 1}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},\"c\":{\"type\":\"number\"}}}",
     {"{}", "{\"b\": null}", "{\"a\": true, \"c\": 1.25}", "{\"c\": 1e-3}"},
     {"{,\"b\": null}", "{\"a\": true,}", "{\"c\": 1.}", "{\"c\": .5}", "{\"b\": null, \"a\": false}"}},
    {"{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",3,null]},\"minItems\":1,\"maxItems\":3}",
     {"[\"red\"]", "[3, null, \"green\"]", "[ \"red\" ,3 ]"},
     {"[]", "[\"blue\"]", "[3, 3, 3, 3]", "[\"Red\"]"}},
    {"{\"const\":{\"x\":[1,\"/\"]}}", {"{\"x\":[1,\"/\"]}"}, {"{\"x\": [1, \"/\"]}", "{\"x\":[1,\"\\/\"]}"}},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]}",
     {"12", "\"ab\"", "\"\\n\"", "\"\xe2\x82\xac\""},
     {"\"abc\"", "1.5", "true"}},
    {"{\"type\":[\"string\",\"null\"],\"minLength\":2}", {"null", "\"ab\"", "\"abcdef\""}, {"\"a\"", "\"\"", "1"}},
    {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":305}",
     {"-12", "-1", "0", "9", "10", "99", "100", "305"},
     {"-13", "306", "400", "1000", "-0012", "012"}},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", {"1", "42", "9999999999999999"}, {"0", "-1", "-0"}},
    {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", {"0", "0.5", "1", "0.999"}, {"1.5", "-0.5", "2", "1.01"}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},"
     "{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\": 1, \"next\": null}", "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}"},
     {"{\"v\": 1}", "{\"v\": 1, \"next\": {\"v\": 2}}"}},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", {"{}", "{\"x\": 1, \"y\": 2}"}, {"{\"x\": \"1\"}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\"},\"required\":[\"a\"]}",
     {"{\"a\": 1}", "{\"a\": 1, \"zz\": \"s\"}"}, {"{\"zz\": \"s\"}", "{\"a\": 1, \"zz\": 2}"}},
    {"{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-28\"", "\"1999-12-31\"", "\"2000-04-30\""}, {"\"2024-13-01\"", "\"24-01-01\"", "\"2024-02-30\"", "\"2024-04-31\""}},
    {"{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123e4567\""}},
    {"{\"type\":\"object\",\"properties\":{}, \"additionalProperties\":false}", {"{}"}, {"{ }", "{\"a\": 1}"}},
};

struct pcase {
    const char *pattern;
    const char *yes[6]; /* the string's JSON text between the quotes */
    const char *no[6];
};

static const struct pcase patterns[] = {
    {"^[a-z]+$", {"abc", "z"}, {"", "aBc", "ab1"}},
    {"^\\d{3}-\\d{4}$", {"555-1234"}, {"5551234", "555-12345", "55-1234"}},
    {"^(cat|dog)s?$", {"cat", "dogs"}, {"cow", "cats!"}},
    {"ab", {"ab", "xxabyy", "ab"}, {"a", "ba"}},
    {"^a.c$", {"abc", "a\\\"c", "a\xc3\xa9" "c", "a\\\\c"}, {"ac", "a\\nc"}},
    {"^[^a-z]{2}$", {"AB", "1\xc3\xa9", "\\\"\\\\"}, {"aB", "A"}},
    {"^\\w+@\\w+\\.com$", {"me@site.com"}, {"me@site.org", "@site.com"}},
    {"^(?:[A-F0-9]{2}:){2}[A-F0-9]{2}$", {"0A:FF:12"}, {"0A:FF", "0a:ff:12"}},
    {"^x{2,}$", {"xx", "xxxxx"}, {"x"}},
    {"^a\\{b}$", {"a{b}"}, {"ab"}},
    {"^[\\s]+$", {" ", "\\t\\n"}, {"a"}},
    /* nested optional parts: each step expands each stack once, not along 2^40 paths (found by the fuzzer) */
    {"^()?x????????????????????????????????????????{2,5}[^\\s\\\"]$", {"x!", "xx!", "!", "x"}, {"", " ", "xxxxxx!"}},
};

static const char *const refused[][2] = {
    {"{\"type\":\"integer\",\"multipleOf\":3}", "'multipleOf' is not supported"},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=a)\"}}}", "properties.a: pattern: lookaround"},
    {"{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems' is not supported"},
    {"{\"not\":{\"type\":\"null\"}}", "'not' is not supported"},
    {"{\"type\":\"string\",\"pattern\":\"^(a)\\\\1$\"}", "backreferences"},
    {"{\"type\":\"number\",\"minimum\":0.5}", "'minimum' is supported only as an integer"},
    {"{\"$ref\":\"#/$defs/missing\"}", "points at nothing"},
    {"{\"$ref\":\"https://example.com/s.json\"}", "outside this document"},
    {"{\"type\":\"thing\"}", "unknown type 'thing'"},
    {"{\"type\":\"object\",\"required\":[\"a\"]}", "required property 'a' is not in properties"},
    {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", "tuples"},
    {"false", "accepts nothing"},
    {"{\"$ref\":\"#\"}", "left recursion"},
    {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer fits"},
};

/* g still holds: it starts a parse (a grammar freed under its holder is a use after free under ASan) */
static int usable(const struct tllm_grammar *g) {
    struct tllm_gram_state st = {0};
    int ok = tllm_gram_start(g, &st) == TLLM_OK && st.n_stacks > 0;
    tllm_gram_state_free(&st);
    return ok;
}

/* The grammar cache (server, batch files, the C API's batches): an equal key shares the grammar, the
 * newest TLLM_GRAMMAR_CACHE_SIZE keys stay, every reference is let go once */
static void check_grammar_cache(void) {
    struct tllm_grammar_cache c = {0};
    const char *key = "{\"type\":\"integer\"}";
    struct tllm_grammar *a, *b;
    CHECK(!tllm_schema_grammar_text(key, "a", &a) && !tllm_schema_grammar_text(key, "b", &b), "%s", tllm_errmsg());
    CHECK(!tllm_grammar_cache_find(&c, key), "an empty cache finds nothing");
    CHECK(tllm_grammar_cache_share(&c, key, a) == a, "the first of a key is kept as it is");
    struct tllm_grammar *b2 = tllm_grammar_cache_share(&c, key, b); /* b is let go: a is shared */
    CHECK(b2 == a, "an equal key takes the kept grammar");
    struct tllm_grammar *f = tllm_grammar_cache_find(&c, key);
    CHECK(f == a, "find gives the kept grammar");
    tllm_grammar_free(f);
    /* TLLM_GRAMMAR_CACHE_SIZE other keys: the first is let go, the newest stay */
    char other[64];
    for (int i = 0; i < TLLM_GRAMMAR_CACHE_SIZE; i++) {
        struct tllm_grammar *g;
        snprintf(other, sizeof other, "{\"type\":\"string\",\"maxLength\":%d}", i + 1);
        CHECK(!tllm_schema_grammar_text(other, "other", &g), "%s", tllm_errmsg());
        tllm_grammar_free(tllm_grammar_cache_share(&c, other, g));
    }
    CHECK(!tllm_grammar_cache_find(&c, key), "the oldest key is let go");
    f = tllm_grammar_cache_find(&c, other);
    CHECK(f && usable(f), "the newest key stays");
    tllm_grammar_free(f);
    CHECK(usable(a), "a grammar the cache let go lives on with its other holders");
    tllm_grammar_free(a); /* from the first share */
    tllm_grammar_free(b2);
    tllm_grammar_cache_free(&c);
    CHECK(!tllm_grammar_cache_find(&c, other) && c.next == 0, "a freed cache is empty");
}

static void check_schemas(void) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct tllm_grammar *g = schema(cases[i].schema);
        CHECK(g, "schema %zu did not compile", i);
        if (!g) continue;
        for (int k = 0; k < 8 && cases[i].yes[k]; k++)
            CHECK(tllm_gram_match(g, cases[i].yes[k], strlen(cases[i].yes[k])), "schema %zu refuses %s", i, cases[i].yes[k]);
        for (int k = 0; k < 8 && cases[i].no[k]; k++)
            CHECK(!tllm_gram_match(g, cases[i].no[k], strlen(cases[i].no[k])), "schema %zu accepts %s", i, cases[i].no[k]);
        tllm_grammar_free(g);
    }
    for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
        struct json_object *s = json_object_new_object();
        json_object_object_add(s, "type", json_object_new_string("string"));
        json_object_object_add(s, "pattern", json_object_new_string(patterns[i].pattern));
        struct tllm_grammar *g = NULL;
        int rc = tllm_schema_grammar(s, "p", &g);
        json_object_put(s);
        CHECK(!rc, "pattern %s: %s", patterns[i].pattern, tllm_errmsg());
        if (rc) continue;
        char text[128];
        for (int k = 0; k < 6 && patterns[i].yes[k]; k++) {
            snprintf(text, sizeof text, "\"%s\"", patterns[i].yes[k]);
            CHECK(tllm_gram_match(g, text, strlen(text)), "pattern %s refuses %s", patterns[i].pattern, text);
        }
        for (int k = 0; k < 6 && patterns[i].no[k]; k++) {
            snprintf(text, sizeof text, "\"%s\"", patterns[i].no[k]);
            CHECK(!tllm_gram_match(g, text, strlen(text)), "pattern %s accepts %s", patterns[i].pattern, text);
        }
        tllm_grammar_free(g);
    }
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        struct json_object *s = json_tokener_parse(refused[i][0]);
        struct tllm_grammar *g = NULL;
        int rc = tllm_schema_grammar(s, "response_format.json_schema.schema", &g);
        json_object_put(s);
        CHECK(rc && strstr(tllm_errmsg(), refused[i][1]) && !strncmp(tllm_errmsg(), "response_format.json_schema.schema: ", 36),
              "%s: got \"%s\", want \"%s\"", refused[i][0], rc ? tllm_errmsg() : "(compiled)", refused[i][1]);
        tllm_grammar_free(g);
    }
}

static uint64_t rng = 12345;
static double uniform(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static struct tllm_gram_state brute_a, brute_c;

/* Every token's bytes through the grammar from st, one by one: the mask's definition */
static int brute_allows(const struct tllm_grammar *g, const struct tllm_tok *tok, const struct tllm_gram_state *st,
                        int32_t id, const int32_t *eos, int n_eos) {
    for (int i = 0; i < n_eos; i++)
        if (id == eos[i]) return tllm_gram_accepting(st);
    size_t len;
    const char *b = tllm_tok_bytes(tok, id, &len);
    if (!b || !len || tllm_tok_is_special(tok, id)) return 0;
    struct tllm_gram_state a = brute_a, c = brute_c; /* kept: a brute force over 151k tokens a step */
    tllm_gram_state_copy(&a, st);
    int ok = 1;
    for (size_t k = 0; k < len && ok; k++) {
        tllm_gram_advance(g, &a, (unsigned char)b[k], &c);
        ok = c.n_stacks > 0;
        struct tllm_gram_state t = a;
        a = c, c = t;
    }
    brute_a = a, brute_c = c;
    return ok;
}

/* Random walks under each grammar: at every step the mask equals the brute force over the ids below
 * n_ids (0: the whole vocabulary; fewer: shorter tokens, so a walk crosses from where a counted string's
 * states share one mask to where each count has its own); then the walk takes a random allowed token.
 * max_computed > 0: the masks computed by each schema's walks together are at most that many. */
static void check_masks(const struct tllm_tok *tok, int brute_steps, int n_ids, const char *const *schemas, size_t n_schemas,
                        int max_computed) {
    if (n_ids <= 0) n_ids = tllm_tok_n_vocab(tok);
    int32_t eos[2] = {tllm_tok_find(tok, "<|im_end|>"), tllm_tok_find(tok, "<|endoftext|>")};
    struct tllm_vocab_index *vi = NULL;
    CHECK(!tllm_vocab_index_init(tok, n_ids, &vi), "vocab index: %s", tllm_errmsg());
    if (!vi) return;
    float *logits = malloc((size_t)n_ids * sizeof *logits);
    for (size_t si = 0; si < n_schemas; si++) {
        struct tllm_grammar *g = schema(schemas[si]);
        CHECK(g, "mask schema %zu", si);
        if (!g) continue;
        struct tllm_gmatch *first = NULL; /* the second walk shares the first's automaton and masks */
        tllm_gmatch_init(&first, g, vi, eos, 2, NULL);
        for (int walk = 0; walk < 2; walk++) {
            struct tllm_gmatch *m = NULL;
            tllm_gmatch_init(&m, g, vi, eos, 2, first);
            struct tllm_gram_state st = {0};
            tllm_gram_start(g, &st);
            int bad = 0;
            for (int step = 0; step < brute_steps; step++) {
                for (int i = 0; i < n_ids; i++) logits[i] = 0;
                int n_allowed = tllm_gmatch_mask(m, logits, n_ids), brute = 0;
                for (int32_t id = 0; id < n_ids; id++) {
                    int want = brute_allows(g, tok, &st, id, eos, 2), got = logits[id] == 0;
                    brute += want;
                    if (want != got && bad++ < 5)
                        CHECK(0, "schema %zu step %d: token %d: mask %d, brute force %d", si, step, id, got, want);
                }
                CHECK(n_allowed == brute, "schema %zu step %d: %d allowed, brute force %d", si, step, n_allowed, brute);
                if (!n_allowed) break;
                /* a random allowed token, EOS only when it is the one left */
                int pick = (int)(uniform() * n_allowed), id = -1;
                for (int32_t i = 0; i < n_ids && id < 0; i++)
                    if (logits[i] == 0 && pick-- == 0) id = i;
                if (id == eos[0] || id == eos[1]) break;
                CHECK(!tllm_gmatch_accept(m, id), "accept %d", id);
                size_t len;
                const char *b = tllm_tok_bytes(tok, id, &len);
                for (size_t k = 0; k < len; k++) {
                    struct tllm_gram_state nx = {0};
                    tllm_gram_advance(g, &st, (unsigned char)b[k], &nx);
                    tllm_gram_state_free(&st);
                    st = nx;
                }
            }
            tllm_gram_state_free(&st);
            tllm_gmatch_free(m);
        }
        long computed = 0, cached = 0;
        tllm_gmatch_counts(first, &computed, &cached);
        CHECK(max_computed <= 0 || computed <= max_computed, "schema %zu: %ld masks computed over %d steps (at most %d)", si,
              computed, 2 * brute_steps, max_computed);
        tllm_gmatch_free(first);
        tllm_grammar_free(g);
    }
    free(logits);
    tllm_vocab_index_free(vi);
}

/* tllm_gmatch_prepare (the walks of a step's new states on several threads) gives each sequence the
 * mask one walk at a time gives: sequences on two schemas' automata (and some in the same state) move
 * by random allowed tokens; at each step the prepared lists equal those of twins on automata that walk
 * one mask at a time */
static void check_prepare(const struct tllm_tok *tok) {
    enum { N = 7, STEPS = 10 };
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"n\":{\"type\":\"integer\"}},\"required\":[\"name\",\"n\"]}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":5}",
    };
    int n_ids = tllm_tok_n_vocab(tok);
    int32_t eos[2] = {tllm_tok_find(tok, "<|im_end|>"), tllm_tok_find(tok, "<|endoftext|>")};
    struct tllm_vocab_index *vi = NULL;
    CHECK(!tllm_vocab_index_init(tok, n_ids, &vi), "vocab index: %s", tllm_errmsg());
    struct tllm_grammar *g[2] = {schema(schemas[0]), schema(schemas[1])};
    if (!vi || !g[0] || !g[1]) goto out;
    struct tllm_gmatch *m[N] = {0}, *ref[N] = {0};
    for (int i = 0; i < N; i++) { /* 0, 2, 4, 6 on the first schema, the rest on the second */
        tllm_gmatch_init(&m[i], g[i % 2], vi, eos, 2, i >= 2 ? m[i - 2] : NULL);
        tllm_gmatch_init(&ref[i], g[i % 2], vi, eos, 2, i >= 2 ? ref[i - 2] : NULL);
    }
    int live = N, total = 0;
    for (int step = 0; step < STEPS && live; step++) {
        struct tllm_gmatch *on[N];
        int n_on = 0, walked = -1;
        for (int i = 0; i < N; i++)
            if (m[i]) on[n_on++] = m[i];
        CHECK(!tllm_gmatch_prepare(on, n_on, 3, &walked), "prepare: %s", tllm_errmsg());
        total += walked;
        if (step == 0) CHECK(walked == 2, "step 0: %d walks (the two schemas' starts)", walked);
        for (int i = 0; i < N; i++) {
            if (!m[i]) continue;
            long c0, c1, k0;
            tllm_gmatch_counts(m[i], &c0, &k0);
            int n1, a1, n2, a2;
            const int32_t *l1 = tllm_gmatch_list(m[i], &n1, &a1), *l2 = tllm_gmatch_list(ref[i], &n2, &a2);
            tllm_gmatch_counts(m[i], &c1, &k0);
            CHECK(c1 == c0, "step %d seq %d: a mask was walked after prepare", step, i);
            int same = l1 && l2 && n1 == n2 && a1 == a2 && !memcmp(l1, l2, (size_t)n1 * sizeof *l1);
            CHECK(same, "step %d seq %d: prepared list (%d, allows %d) != one walk at a time (%d, allows %d)", step, i, n1, a1, n2, a2);
            /* next: an allowed token picked at random (sequences i and i + 2 alike at even steps: a shared state) */
            int pick = -1, count = l1 ? (a1 ? n1 : n_ids - n1) : 0;
            int r = count ? (int)(uniform() * count) % count : 0;
            if (step % 2 == 0 && i >= 2) r = 0;
            if (count && a1) pick = l1[r];
            else if (count)
                for (int32_t id = 0, j = 0, left = r; id < n_ids && pick < 0; id++) {
                    if (j < n1 && l1[j] == id) j++;
                    else if (left-- == 0) pick = id;
                }
            if (pick < 0 || pick == eos[0] || pick == eos[1] || tllm_gmatch_accept(m[i], pick) || tllm_gmatch_accept(ref[i], pick)) {
                live--;
                tllm_gmatch_free(m[i]), tllm_gmatch_free(ref[i]);
                m[i] = ref[i] = NULL;
            }
        }
    }
    CHECK(total > 2, "%d walks prepared in all", total);
    fprintf(stderr, "prepare: %d walks over %d steps\n", total, STEPS);
    for (int i = 0; i < N; i++) tllm_gmatch_free(m[i]), tllm_gmatch_free(ref[i]);
out:
    tllm_grammar_free(g[0]);
    tllm_grammar_free(g[1]);
    tllm_vocab_index_free(vi);
}

/* Text sampled from random logits under a grammar, until EOS: it matches the grammar, and is JSON */
static void check_sampling(const struct tllm_tok *tok) {
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"code\":{\"enum\":[200,404]},\"who\":{\"type\":\"string\",\"maxLength\":4}},"
        "\"required\":[\"ok\",\"code\",\"who\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},\"minItems\":2,\"maxItems\":4}",
    };
    int n_ids = tllm_tok_n_vocab(tok);
    int32_t eos[1] = {tllm_tok_find(tok, "<|im_end|>")};
    struct tllm_vocab_index *vi = NULL;
    tllm_vocab_index_init(tok, n_ids, &vi);
    float *logits = malloc((size_t)n_ids * sizeof *logits), *masked = malloc((size_t)n_ids * sizeof *masked);
    for (size_t si = 0; si < sizeof schemas / sizeof *schemas; si++) {
        struct tllm_grammar *g = schema(schemas[si]);
        int finished = 0;
        long computed = 0, cached = 0;
        /* every seed shares one automaton: past TLLM_GMATCH_CACHE masks it starts over, keeping `keep` */
        struct tllm_gmatch *keep = NULL;
        if (g) tllm_gmatch_init(&keep, g, vi, eos, 1, NULL);
        for (int seed = 0; seed < 10 && g; seed++) {
            struct tllm_sampler_params p = tllm_sampler_defaults();
            p.temperature = 1.0f, p.seed = (uint64_t)seed;
            if (seed % 3 == 1) p.top_k = 40, p.top_p = 0.9f;
            if (seed % 3 == 2) p.min_p = 0.2f;
            /* s samples under the grammar (its lists); plain samples the same logits masked by hand with the
             * same seed: the same token every step */
            struct tllm_sampler s, plain;
            tllm_sampler_init(&s, &p, n_ids);
            tllm_sampler_init(&plain, &p, n_ids);
            struct tllm_gmatch *m = NULL, *ref = NULL;
            tllm_gmatch_init(&m, g, vi, eos, 1, keep);
            tllm_gmatch_init(&ref, g, vi, eos, 1, NULL);
            tllm_sampler_constrain(&s, m);
            char text[4096];
            size_t n = 0;
            int ended = 0, differ = 0;
            for (int step = 0; step < 200 && !ended; step++) {
                for (int i = 0; i < n_ids; i++) logits[i] = (float)(4 * uniform());
                memcpy(masked, logits, (size_t)n_ids * sizeof *masked);
                tllm_gmatch_mask(ref, masked, n_ids);
                int32_t id = tllm_sampler_sample(&s, logits), want = tllm_sampler_sample(&plain, masked);
                differ += id != want;
                if (id != want || tllm_gmatch_accept(ref, id)) break;
                if (id == eos[0]) ended = 1;
                else {
                    size_t len;
                    const char *b = tllm_tok_bytes(tok, id, &len);
                    if (n + len < sizeof text) memcpy(text + n, b, len), n += len;
                }
            }
            text[n] = 0;
            CHECK(!differ, "schema %zu seed %d: sampling under the grammar differs from sampling masked logits", si, seed);
            tllm_gmatch_counts(m, &computed, &cached);
            tllm_sampler_free(&s);
            tllm_sampler_free(&plain);
            tllm_gmatch_free(ref);
            if (!ended) continue;
            finished++;
            CHECK(tllm_gram_match(g, text, n), "schema %zu seed %d: %s does not match", si, seed, text);
            struct json_object *o = json_tokener_parse(text);
            CHECK(o, "schema %zu seed %d: %s is not JSON", si, seed, text);
            json_object_put(o);
        }
        CHECK(finished >= 5, "schema %zu: %d of 10 texts reached EOS in 200 tokens", si, finished);
        /* (test_grammar_small_cache keeps 8 masks: random texts rarely meet one of them again) */
        if (TLLM_GMATCH_CACHE >= 64)
            CHECK(cached > 0, "schema %zu: no mask found in the shared cache (%ld computed)", si, computed);
        tllm_gmatch_free(keep);
        tllm_grammar_free(g);
    }
    free(logits);
    free(masked);
    tllm_vocab_index_free(vi);
}

int main(int argc, char **argv) {
    check_schemas();
    check_grammar_cache();
    struct tllm_tok *tok = NULL;
    char path[4096];
    if (argc > 1) {
        snprintf(path, sizeof path, "%s/tokenizer.json", argv[1]);
        CHECK(!tllm_tok_load(path, &tok), "%s", tllm_errmsg());
    }
    if (tok) {
        const char *steps = getenv("TLLM_TEST_MASK_STEPS");
        static const char *const schemas[] = {
            NULL,
            "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"n\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":120},"
            "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a b\",\"\\u00e9t\\u00e9\",\"x\\\"y\"]},\"maxItems\":2}},\"required\":[\"name\",\"n\",\"tags\"]}",
            "{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]{1,5}( [0-9]+)?$\"}",
            /* counted strings: states deep in the count share a mask (tllm_gram_mask_key) */
            "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":300}},\"required\":[\"a\"]}",
            "{\"type\":\"string\",\"maxLength\":400}",
            "{\"type\":\"string\",\"minLength\":200,\"maxLength\":500}",
        };
        int n = steps ? atoi(steps) : 6;
        check_masks(tok, n, 0, schemas, sizeof schemas / sizeof *schemas, 0);
        /* inside a long counted string every count past the longest token's bytes has the same mask: the
         * start, the string's first state and (maxLength) the one past the opening quote, whatever the walk */
        check_masks(tok, 8, 0, schemas + 4, 2, 4);
        /* ids below 3000 (tokens of at most a dozen bytes): the walks cross into the counts that differ */
        static const char *const short_counts[] = {
            "{\"type\":\"string\",\"minLength\":40}",
            "{\"type\":\"string\",\"maxLength\":40}",
            "{\"type\":\"string\",\"minLength\":30,\"maxLength\":60}",
        };
        check_masks(tok, 40, 3000, short_counts, 3, 0);
        check_sampling(tok);
        check_prepare(tok);
        tllm_gram_state_free(&brute_a);
        tllm_gram_state_free(&brute_c);
        tllm_tok_free(tok);
    }
    return check_done();
}
