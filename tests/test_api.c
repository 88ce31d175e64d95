/* The public API (engine/tllm.h) as a program embedding tllm uses it: greedy ids equal the
 * transformers reference, a prompt that repeats a cached one computes only what is new and gives the
 * same text, stop strings, interruption, tokenize/detokenize, chat rendering, and bad arguments as
 * statuses with messages.
 * usage: test_api FIXTURE_DIR DEMO_MODEL_DIR */
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tllm.h"
#include "tests/check.h"
#include "tests/reference.h"

/* greedy ids of the API against the fixture's reference (a checkpoint without a tokenizer) */
static void test_reference_ids(const char *dir) {
    struct ref_fixture r;
    struct tllm_engine *e;
    struct tllm_session *s;
    if (ref_load(dir, &r)) {
        CHECK(0, "%s: no reference", dir);
        return;
    }
    struct tllm_engine_params ep = {.threads = 2, .exact = 1};
    CHECK(tllm_engine_open(dir, &ep, &e) == TLLM_OK, "open %s: %s", dir, tllm_errmsg());
    CHECK(!tllm_engine_has_tokenizer(e), "the fixture has no tokenizer");
    struct tllm_session_params sp = {.n_ctx = 64, .device = "cpu"};
    CHECK(tllm_session_open(e, &sp, &s) == TLLM_OK, "session: %s", tllm_errmsg());
    struct tllm_generate_params p;
    tllm_generate_params_default(e, &p);
    p.sampling = tllm_sampler_defaults();
    p.max_tokens = r.n_greedy;
    int32_t *ids;
    size_t n;
    struct tllm_stats st;
    CHECK(tllm_session_complete_ids(s, r.prompt_ids, (size_t)r.n_prompt, &p, NULL, NULL, NULL, &ids, &n, &st) == TLLM_OK,
          "complete_ids: %s", tllm_errmsg());
    CHECK(n == (size_t)r.n_greedy && !memcmp(ids, r.greedy_ids, n * sizeof *ids), "greedy ids differ from the reference");
    CHECK(st.n_prompt == r.n_prompt && st.n_reused == 0 && st.n_generated == r.n_greedy &&
              st.finish == TLLM_FINISH_LENGTH, "stats: prompt %d reused %d generated %d finish %s", st.n_prompt,
          st.n_reused, st.n_generated, tllm_finish_name(st.finish));
    /* the prompt followed by what was generated: all but the last generated token is in the cache */
    int32_t *longer = malloc((size_t)(r.n_prompt + r.n_greedy) * sizeof *longer);
    memcpy(longer, r.prompt_ids, (size_t)r.n_prompt * sizeof *longer);
    memcpy(longer + r.n_prompt, ids, n * sizeof *ids);
    tllm_free(ids);
    p.max_tokens = 1;
    CHECK(tllm_session_complete_ids(s, longer, (size_t)(r.n_prompt + r.n_greedy), &p, NULL, NULL, NULL, NULL, NULL, &st) ==
              TLLM_OK, "complete_ids (continued): %s", tllm_errmsg());
    CHECK(st.n_reused == r.n_prompt + r.n_greedy - 1, "a continued prompt reused %d of %d cached tokens", st.n_reused,
          r.n_prompt + r.n_greedy - 1);
    free(longer);
    /* raw logits: the reference's rows (float32 activations and cache: transformers' numbers), and the
     * last row alone equal to the last of all */
    tllm_session_free(s);
    struct tllm_session_params sp32 = {.n_ctx = 64, .device = "cpu", .kv_type = "f32"};
    CHECK(tllm_session_open(e, &sp32, &s) == TLLM_OK, "session: %s", tllm_errmsg());
    int vocab = tllm_engine_vocab_size(e);
    float *all = malloc((size_t)r.n_seq * (size_t)vocab * sizeof *all), *last = malloc((size_t)vocab * sizeof *last);
    CHECK(tllm_session_logits(s, r.sequence, (size_t)r.n_seq, 0, all) == TLLM_OK, "logits: %s", tllm_errmsg());
    CHECK(tllm_session_n_cached(s) == r.n_seq, "the cache holds the %d ids after logits (%d)", r.n_seq, tllm_session_n_cached(s));
    for (int i = 0; i < r.n_logits_rows; i++) {
        double rms, mx;
        ref_compare_row(r.logits + (size_t)i * (size_t)r.vocab, all + (size_t)r.logits_rows[i] * (size_t)vocab, r.vocab, &rms, &mx);
        CHECK(rms <= 1e-4, "logits row %d: relative RMS %.2e against the reference", r.logits_rows[i], rms);
    }
    CHECK(tllm_session_logits(s, r.sequence, (size_t)r.n_seq, 1, last) == TLLM_OK, "last logits: %s", tllm_errmsg());
    CHECK(!memcmp(last, all + (size_t)(r.n_seq - 1) * (size_t)vocab, (size_t)vocab * sizeof *last),
          "the last row alone differs from the last of all rows");
    int32_t bad_id = vocab;
    CHECK(tllm_session_logits(s, &bad_id, 1, 1, last) == TLLM_ERR_ARG && strstr(tllm_errmsg(), "outside the vocabulary"),
          "an id past the vocabulary: %s", tllm_errmsg());
    free(all);
    free(last);
    tllm_session_free(s);
    tllm_engine_free(e);
    ref_free(&r);
}

/* What a batch callback saw, by item */
/* The model on 2 threads and a session on the CPU */
static void open_on_cpu(const char *dir, struct tllm_engine **e, struct tllm_session **s) {
    struct tllm_engine_params ep = {.threads = 2};
    CHECK(tllm_engine_open(dir, &ep, e) == TLLM_OK, "open %s: %s", dir, tllm_errmsg());
    struct tllm_session_params sp = {.device = "cpu"};
    CHECK(tllm_session_open(*e, &sp, s) == TLLM_OK, "session: %s", tllm_errmsg());
}

struct batch_seen {
    int n_calls[8], status[8], finish[8], stop_at;
    char *text[8], error[8][160];
    int calls;
};

static int on_item(size_t i, const struct tllm_batch_result *r, void *user) {
    struct batch_seen *b = user;
    if (i >= 8) return 1;
    b->n_calls[i]++, b->status[i] = r->status, b->finish[i] = (int)r->stats.finish;
    free(b->text[i]);
    b->text[i] = strdup(r->text);
    CHECK(strlen(r->text) == r->len, "item %zu: text length %zu, len %zu", i, strlen(r->text), r->len);
    snprintf(b->error[i], sizeof b->error[i], "%s", r->error);
    return ++b->calls == b->stop_at;
}

/* many prompts through the continuous batcher: each item reported once, its text equal to the same
 * prompt completed alone, bad items failing alone, and a stop reporting the rest as interrupted */
static void test_batch(const char *demo) {
    struct tllm_engine *e;
    struct tllm_session *s;
    open_on_cpu(demo, &e, &s);
    struct tllm_session_params sp = {.device = "cpu"};
    struct tllm_generate_params p, pj;
    tllm_generate_params_default(e, &p);
    p.sampling = tllm_sampler_defaults();
    p.max_tokens = 12;
    pj = p;
    pj.json_schema = "{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}, \"required\": [\"n\"]}";
    struct tllm_generate_params pbad = p;
    pbad.json_schema = "{\"type\": \"integer\", \"multipleOf\": 2}";
    struct tllm_chat_msg msg = {"user", "What does grep do?"};
    int32_t ids[] = {9707, 11, 1879}; /* "Hello, world" in Qwen's vocabulary */
    struct tllm_batch_item items[] = {
        {.prompt = "The tar command", .params = &p},
        {.msgs = &msg, .n_msgs = 1, .params = &p},
        {.prompt = "", .params = &p},
        {.prompt_ids = ids, .n_prompt_ids = 3, .params = &p},
        {.msgs = &msg, .n_msgs = 1, .params = &pj},
        {.prompt = "x", .params = &pbad},
    };
    enum { N = sizeof items / sizeof items[0] };
    struct batch_seen b = {.stop_at = -1};
    struct tllm_batch_params bp = {.n_parallel = 3};
    CHECK(tllm_session_generate_batch(s, items, N, &bp, on_item, &b) == TLLM_OK, "generate_batch: %s", tllm_errmsg());
    for (int i = 0; i < N; i++) CHECK(b.n_calls[i] == 1, "item %d reported %d times", i, b.n_calls[i]);
    CHECK(b.status[2] == TLLM_ERR_ARG && strstr(b.error[2], "empty"), "the empty prompt: %d %s", b.status[2], b.error[2]);
    CHECK(b.status[5] == TLLM_ERR_UNSUPPORTED && strstr(b.error[5], "multipleOf"), "the bad schema: %d %s", b.status[5], b.error[5]);
    struct json_object *o = b.text[4] ? json_tokener_parse(b.text[4]) : NULL;
    CHECK(b.status[4] == TLLM_OK && o && json_object_is_type(o, json_type_object), "the schema's answer: '%s'", b.text[4]);
    json_object_put(o);
    /* each text equals its prompt completed alone (the session's single-sequence path) */
    for (int i = 0; i < 4; i++) {
        if (i == 2) continue;
        char *alone = NULL;
        int rc = items[i].prompt ? tllm_session_complete(s, items[i].prompt, &p, NULL, NULL, &alone, NULL)
                 : items[i].msgs ? tllm_session_chat(s, &msg, 1, &p, NULL, NULL, &alone, NULL)
                                 : tllm_session_complete_ids(s, ids, 3, &p, NULL, NULL, &alone, NULL, NULL, NULL);
        CHECK(rc == TLLM_OK && b.status[i] == TLLM_OK && b.text[i] && alone && !strcmp(alone, b.text[i]),
              "item %d: batch '%s', alone '%s'", i, b.text[i] ? b.text[i] : "", alone ? alone : "");
        tllm_free(alone);
    }
    for (int i = 0; i < N; i++) free(b.text[i]);
    /* the callback stops the run after the first answer: every item is still reported, once */
    struct batch_seen c = {.stop_at = 1};
    struct tllm_batch_item many[8];
    for (int i = 0; i < 8; i++) many[i] = (struct tllm_batch_item){.prompt = "The tar command", .params = &p};
    bp.n_parallel = 2;
    CHECK(tllm_session_generate_batch(s, many, 8, &bp, on_item, &c) == TLLM_OK, "a stopped batch: %s", tllm_errmsg());
    int interrupted = 0;
    for (int i = 0; i < 8; i++) {
        CHECK(c.n_calls[i] == 1, "stopped: item %d reported %d times", i, c.n_calls[i]);
        interrupted += c.finish[i] == TLLM_FINISH_INTERRUPTED;
        free(c.text[i]);
    }
    CHECK(interrupted >= 6, "a stop after the first answer left %d of 8 interrupted", interrupted);
    bp.n_parallel = -1;
    CHECK(tllm_session_generate_batch(s, many, 8, &bp, on_item, &c) == TLLM_ERR_ARG, "negative n_parallel");
    /* a second engine shares the process's thread pool (and runs alone once the first is freed); one
     * asking for another pool size is refused */
    char *t1 = NULL, *t2 = NULL;
    CHECK(tllm_session_complete(s, "The tar command", &p, NULL, NULL, &t1, NULL) == TLLM_OK, "complete: %s", tllm_errmsg());
    tllm_session_free(s);
    struct tllm_engine *e2 = NULL, *e3 = NULL;
    struct tllm_engine_params ep0 = {0}, ep1 = {.threads = 1};
    CHECK(tllm_engine_open(demo, &ep1, &e3) == TLLM_ERR_ARG && !e3 && strstr(tllm_errmsg(), "runs on 2"),
          "an engine asking for another pool size: %s", tllm_errmsg());
    CHECK(tllm_engine_open(demo, &ep0, &e2) == TLLM_OK, "a second engine: %s", tllm_errmsg());
    tllm_engine_free(e);
    struct tllm_session *s2 = NULL;
    CHECK(tllm_session_open(e2, &sp, &s2) == TLLM_OK && tllm_session_complete(s2, "The tar command", &p, NULL, NULL, &t2, NULL) == TLLM_OK,
          "the second engine after the first is freed: %s", tllm_errmsg());
    CHECK(t1 && t2 && !strcmp(t1, t2), "the second engine's text '%s', the first's '%s'", t2 ? t2 : "", t1 ? t1 : "");
    tllm_free(t1);
    tllm_free(t2);
    tllm_session_free(s2);
    tllm_engine_free(e2);
}

struct pieces {
    int n, stop_after;
};

static int count_pieces(const char *text, size_t len, void *user) {
    (void)text, (void)len;
    struct pieces *c = user;
    return ++c->n >= c->stop_after;
}

static void test_text(const char *demo) {
    struct tllm_engine *e;
    struct tllm_session *s;
    struct tllm_engine_params ep = {.threads = 2};
    if (tllm_engine_open(demo, &ep, &e) != TLLM_OK) {
        CHECK(0, "open %s: %s", demo, tllm_errmsg());
        return;
    }
    CHECK(!strcmp(tllm_engine_dir(e), demo) && tllm_engine_has_tokenizer(e), "engine dir / tokenizer");
    struct tllm_session_params sp = {.n_ctx = 256, .device = "cpu"};
    CHECK(tllm_session_open(e, &sp, &s) == TLLM_OK, "session: %s", tllm_errmsg());
    CHECK(!strcmp(tllm_session_device(s), "CPU") && tllm_session_n_ctx(s) == 256, "session device / n_ctx");

    /* tokens and back, special tokens parsed or not */
    const char *t = "<|im_start|>user\nWhat does ls do? \xc3\xa9\xe4\xb8\xad";
    int32_t *ids, *ids_plain;
    size_t n, n_plain, len;
    char *back;
    CHECK(tllm_tokenize(e, t, strlen(t), 1, &ids, &n) == TLLM_OK && tllm_tokenize(e, t, strlen(t), 0, &ids_plain, &n_plain) == TLLM_OK,
          "tokenize: %s", tllm_errmsg());
    CHECK(n < n_plain, "special tokens parsed: %zu ids, as text: %zu", n, n_plain);
    CHECK(tllm_detokenize(e, ids, n, 0, &back, &len) == TLLM_OK && len == strlen(t) && !strcmp(back, t),
          "detokenize gives the text back");
    tllm_free(back);
    tllm_free(ids);
    tllm_free(ids_plain);

    /* the chat template, and a chat turn equal to completing its rendering */
    struct tllm_chat_msg msg = {"user", "What does tar do?"};
    char *rendered, *reply, *again;
    CHECK(tllm_chat_apply(e, &msg, 1, 1, &rendered) == TLLM_OK && strstr(rendered, "<|im_start|>user\nWhat does tar do?<|im_end|>") &&
              strstr(rendered, "<|im_start|>assistant\n"), "chat_apply: %s", tllm_errmsg());
    struct tllm_generate_params p;
    tllm_generate_params_default(e, &p);
    p.sampling.temperature = 0;
    p.max_tokens = 12;
    struct tllm_stats st, st2;
    CHECK(tllm_session_chat(s, &msg, 1, &p, NULL, NULL, &reply, &st) == TLLM_OK, "chat: %s", tllm_errmsg());
    CHECK(st.n_generated > 0 && strlen(reply) > 0 && st.n_reused == 0, "a reply (%d tokens)", st.n_generated);
    tllm_session_reset(s);
    CHECK(tllm_session_n_cached(s) == 0, "reset empties the cache");
    CHECK(tllm_session_complete(s, rendered, &p, NULL, NULL, &again, &st2) == TLLM_OK && !strcmp(again, reply),
          "completing the rendered chat gives the chat's reply: '%s' vs '%s'", again, reply);
    tllm_free(again);
    /* the same prompt again: all but one token from the cache, the same greedy text */
    CHECK(tllm_session_complete(s, rendered, &p, NULL, NULL, &again, &st2) == TLLM_OK, "again: %s", tllm_errmsg());
    CHECK(st2.n_reused == st2.n_prompt - 1 && !strcmp(again, reply), "repeated prompt: reused %d of %d, '%s' vs '%s'",
          st2.n_reused, st2.n_prompt, again, reply);
    tllm_free(again);

    /* a stop string: the text ends before it */
    if (strlen(reply) > 4) {
        char stop[3] = {reply[2], reply[3], 0};
        const char *stops[1] = {stop};
        p.stop = stops;
        p.n_stop = 1;
        CHECK(tllm_session_complete(s, rendered, &p, NULL, NULL, &again, &st2) == TLLM_OK && st2.finish == TLLM_FINISH_STOP &&
                  !strstr(again, stop) && !strncmp(again, reply, strlen(again)),
              "stop string '%s': '%s' (%s)", stop, again, tllm_finish_name(st2.finish));
        tllm_free(again);
        p.stop = NULL, p.n_stop = 0;
    }
    /* a JSON schema: the answer is JSON that follows it; a keyword tllm cannot follow is named */
    p.json_schema = "{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 9}},"
                    " \"required\": [\"n\"], \"additionalProperties\": false}";
    p.max_tokens = 64;
    CHECK(tllm_session_complete(s, rendered, &p, NULL, NULL, &again, &st2) == TLLM_OK && st2.finish == TLLM_FINISH_STOP,
          "json_schema: %s (%s)", tllm_errmsg(), tllm_finish_name(st2.finish));
    {
        struct json_object *o = again ? json_tokener_parse(again) : NULL, *nv = NULL;
        CHECK(o && json_object_object_length(o) == 1 && json_object_object_get_ex(o, "n", &nv) &&
                  json_object_is_type(nv, json_type_int) && json_object_get_int(nv) >= 1 && json_object_get_int(nv) <= 9,
              "json_schema answer: '%s'", again ? again : "(none)");
        json_object_put(o);
    }
    tllm_free(again);
    p.json_schema = "{\"type\": \"integer\", \"multipleOf\": 2}";
    CHECK(tllm_session_complete(s, rendered, &p, NULL, NULL, &again, &st2) == TLLM_ERR_UNSUPPORTED && !again &&
              strstr(tllm_errmsg(), "json_schema: 'multipleOf' is not supported"), "an unsupported keyword: %s", tllm_errmsg());
    p.json_schema = NULL, p.max_tokens = 12;
    /* the callback stops the reply */
    struct pieces c = {0, 2};
    CHECK(tllm_session_complete(s, rendered, &p, count_pieces, &c, NULL, &st2) == TLLM_OK &&
              st2.finish == TLLM_FINISH_INTERRUPTED && c.n == 2, "interrupted after %d pieces (%s)", c.n,
          tllm_finish_name(st2.finish));
    tllm_free(reply);
    tllm_free(rendered);

    /* bad arguments: statuses and messages, nothing exits */
    struct tllm_session *bad = NULL;
    struct tllm_session_params dev = {.device = "gpu"};
    CHECK(tllm_session_open(e, &dev, &bad) == TLLM_ERR_ARG && strstr(tllm_errmsg(), "'gpu'") && !bad, "bad device: %s",
          tllm_errmsg());
    struct tllm_session_params big = {.n_ctx = 1 << 30};
    CHECK(tllm_session_open(e, &big, &bad) == TLLM_ERR_ARG && strstr(tllm_errmsg(), "max_position_embeddings"),
          "n_ctx too large: %s", tllm_errmsg());
    struct tllm_session_params q8 = {.kv_type = "q8"};
    CHECK(tllm_session_open(e, &q8, &bad) == TLLM_ERR_ARG && strstr(tllm_errmsg(), "'q8'") && !bad, "bad KV type: %s",
          tllm_errmsg());
    struct tllm_session_params f32 = {.kv_type = "f32"};
    CHECK(tllm_session_open(e, &f32, &bad) == TLLM_OK && bad, "an f32 KV cache: %s", tllm_errmsg());
    tllm_session_free(bad);
    CHECK(tllm_session_complete(s, "", &p, NULL, NULL, NULL, NULL) == TLLM_ERR_ARG, "empty prompt");
    struct tllm_chat_msg odd = {"narrator", "x"};
    CHECK(tllm_session_chat(s, &odd, 1, &p, NULL, NULL, NULL, NULL) == TLLM_ERR_ARG && strstr(tllm_errmsg(), "narrator"),
          "bad role: %s", tllm_errmsg());
    tllm_session_free(s);
    tllm_engine_free(e);

    struct tllm_engine *none = NULL;
    CHECK(tllm_engine_open("/nonexistent/model", NULL, &none) != TLLM_OK && strstr(tllm_errmsg(), "/nonexistent/model") && !none,
          "missing model: %s", tllm_errmsg());
    struct tllm_engine_params q3 = {.quantize_bits = 3};
    CHECK(tllm_engine_open(demo, &q3, &none) == TLLM_ERR_ARG && !none, "quantize_bits 3: %s", tllm_errmsg());
}

/* A call's function name and arguments as one string ("get_weather {\"city\": ...}"), ids left out (fresh each
 * answer); "" when calls is not a one-call array */
static void one_call(const char *calls, char *out, size_t cap) {
    struct json_object *a = calls ? json_tokener_parse(calls) : NULL, *f, *name, *args, *type;
    out[0] = 0;
    if (a && json_object_is_type(a, json_type_array) && json_object_array_length(a) == 1 &&
        json_object_object_get_ex(json_object_array_get_idx(a, 0), "type", &type) &&
        !strcmp(json_object_get_string(type), "function") &&
        json_object_object_get_ex(json_object_array_get_idx(a, 0), "function", &f) &&
        json_object_object_get_ex(f, "name", &name) && json_object_object_get_ex(f, "arguments", &args) &&
        json_object_is_type(args, json_type_string))
        snprintf(out, cap, "%s %s", json_object_get_string(name), json_object_get_string(args));
    json_object_put(a);
}

struct chat_seen {
    int n, status[4], finish[4];
    char call[4][256], text[4][256];
};

static int on_chat_item(size_t i, const struct tllm_batch_result *r, void *user) {
    struct chat_seen *c = user;
    if (i >= 4) return 1;
    c->n++, c->status[i] = r->status, c->finish[i] = (int)r->stats.finish;
    one_call(r->tool_calls, c->call[i], sizeof c->call[i]);
    snprintf(c->text[i], sizeof c->text[i], "%s", r->status ? r->error : r->text);
    return 0;
}

/* chats given as OpenAI's request: tools rendered into the prompt, tool_choice "required" answered with a call
 * that follows the function's parameters, the same call from a batch, and bad requests named */
/* What a chat's callback saw */
struct streamed {
    char text[4096];
    size_t len;
    int calls;
};
static int collect_piece(const char *t, size_t n, void *user) {
    struct streamed *sd = user;
    sd->calls++;
    if (sd->len + n < sizeof sd->text) memcpy(sd->text + sd->len, t, n), sd->len += n, sd->text[sd->len] = '\0';
    return 0;
}

static void test_chat_json(const char *demo) {
    struct tllm_engine *e;
    struct tllm_session *s;
    open_on_cpu(demo, &e, &s);
    struct tllm_generate_params p;
    tllm_generate_params_default(e, &p);
    p.sampling = tllm_sampler_defaults();
    p.max_tokens = 96;
#define ASK "\"messages\": [{\"role\": \"user\", \"content\": \"What is the weather in Paris?\"}]"
#define WEATHER                                                                                                   \
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "    \
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}}, \"required\": [\"city\"], " \
    "\"additionalProperties\": false}}}]"
    const char *required = "{" ASK ", " WEATHER ", \"tool_choice\": \"required\"}";
    char *text = NULL, *calls = NULL, call[256];
    struct tllm_stats st;
    CHECK(tllm_session_chat_json(s, required, &p, NULL, NULL, &text, &calls, NULL, NULL, &st) == TLLM_OK, "required: %s", tllm_errmsg());
    one_call(calls, call, sizeof call);
    struct json_object *args = call[0] ? json_tokener_parse(strchr(call, ' ') + 1) : NULL, *city = NULL;
    CHECK(!strncmp(call, "get_weather ", 12) && args && json_object_object_length(args) == 1 &&
              json_object_object_get_ex(args, "city", &city) && json_object_is_type(city, json_type_string) &&
              st.finish == TLLM_FINISH_TOOL_CALLS && text && !strcmp(tllm_finish_name(st.finish), "tool_calls"),
          "tool_choice required: calls %s, text '%s', finish %s", calls ? calls : "(none)", text ? text : "",
          tllm_finish_name(st.finish));
    json_object_put(args);
    tllm_free(text);
    tllm_free(calls);

    /* streamed with tools offered: the callback sees the content only, never a call's markup, and all of it
     * (the same text as returned), whether the answer called (required) or not (auto, on the demo model) */
    const char *streams[] = {required, "{" ASK ", " WEATHER "}"};
    for (int k = 0; k < 2; k++) {
        struct streamed sd = {{0}, 0, 0};
        CHECK(tllm_session_chat_json(s, streams[k], &p, collect_piece, &sd, &text, &calls, NULL, NULL, &st) == TLLM_OK,
              "streamed: %s", tllm_errmsg());
        CHECK(text && !strcmp(sd.text, text) && !strstr(sd.text, "<tool_call>") && (k == 0) == (calls != NULL),
              "streamed %s: the callback saw '%s', the answer's content is '%s' (calls %s)", k ? "auto" : "required", sd.text,
              text ? text : "", calls ? calls : "none");
        if (k == 1) CHECK(sd.calls > 1 && sd.len > 0, "streamed auto: %d pieces", sd.calls);
        tllm_free(text);
        tllm_free(calls);
    }

    /* tool_choice none: the tools are left out, so the answer is the plain chat's */
    char *plain = NULL;
    struct tllm_chat_msg msg = {"user", "What is the weather in Paris?"};
    p.max_tokens = 12;
    CHECK(tllm_session_chat(s, &msg, 1, &p, NULL, NULL, &plain, NULL) == TLLM_OK, "chat: %s", tllm_errmsg());
    const char *none = "{" ASK ", " WEATHER ", \"tool_choice\": \"none\"}";
    CHECK(tllm_session_chat_json(s, none, &p, NULL, NULL, &text, &calls, NULL, NULL, &st) == TLLM_OK && !calls && plain && text &&
              !strcmp(text, plain),
          "tool_choice none: '%s' (calls %s), the plain chat '%s'", text ? text : "", calls ? calls : "none", plain ? plain : "");
    tllm_free(text);

    /* the same requests in a batch: the same call, the same text, beside a bad request that fails alone */
    p.max_tokens = 96;
    struct tllm_generate_params pj = p;
    pj.json_schema = "{\"type\": \"integer\"}";
    struct tllm_generate_params p12 = p;
    p12.max_tokens = 12;
    struct tllm_batch_item items[] = {
        {.chat_json = required, .params = &p},
        {.chat_json = none, .params = &p12},
        {.chat_json = "{\"messages\": 7}", .params = &p},
        {.chat_json = required, .params = &pj},
    };
    struct chat_seen c = {0};
    CHECK(tllm_session_generate_batch(s, items, 4, NULL, on_chat_item, &c) == TLLM_OK && c.n == 4, "batch: %s", tllm_errmsg());
    CHECK(c.status[0] == TLLM_OK && !strcmp(c.call[0], call) && c.finish[0] == TLLM_FINISH_TOOL_CALLS && !c.text[0][0],
          "batch required: '%s' (alone '%s'), text '%s'", c.call[0], call, c.text[0]);
    CHECK(c.status[1] == TLLM_OK && !c.call[1][0] && plain && !strcmp(c.text[1], plain), "batch none: '%s'", c.text[1]);
    CHECK(c.status[2] == TLLM_ERR_ARG && strstr(c.text[2], "messages"), "a bad request fails alone: %d %s", c.status[2],
          c.text[2]);
    CHECK(c.status[3] == TLLM_ERR_ARG && strstr(c.text[3], "json_schema"), "json_schema beside tool_choice: %s", c.text[3]);
    tllm_free(plain);

    /* bad requests: statuses and messages naming what is wrong */
    CHECK(tllm_session_chat_json(s, "{\"messages\": [", &p, NULL, NULL, &text, &calls, NULL, NULL, NULL) == TLLM_ERR_ARG && !text &&
              !calls && strstr(tllm_errmsg(), "chat request"),
          "not JSON: %s", tllm_errmsg());
    CHECK(tllm_session_chat_json(s, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"maybe\"}",
                                 &p, NULL, NULL, &text, &calls, NULL, NULL, NULL) == TLLM_ERR_ARG && strstr(tllm_errmsg(), "tool_choice"),
          "a bad tool_choice: %s", tllm_errmsg());
    tllm_session_free(s);
    tllm_engine_free(e);
#undef ASK
#undef WEATHER
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_api FIXTURE_DIR DEMO_MODEL_DIR\n");
        return 2;
    }
    test_reference_ids(argv[1]);
    test_text(argv[2]);
    test_batch(argv[2]);
    test_chat_json(argv[2]);
    return check_done();
}
