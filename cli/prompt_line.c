#include "cli/prompt_line.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_util.h"
#include "engine/grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

int cli_check_utf8(const char *what, const char *s, size_t n, char *err, size_t cap) {
    size_t ok = tllm_utf8_valid_prefix(s, n);
    if (ok == n) return 0;
    snprintf(err, cap, "%s is not valid UTF-8 (byte %zu; is the file in another encoding?)", what, ok + 1);
    return -1;
}

/* A JSONL line's per-line options (OpenAI names) over the defaults. */
static void options(struct json_object *o, struct cli_prompt_line *pl) {
    struct json_object *v;
    static const char *const num_keys[] = {"temperature", "top_p", "min_p"};
    static const double num_hi[] = {100, 1, 1};
    float *num_dst[] = {&pl->sp.temperature, &pl->sp.top_p, &pl->sp.min_p};
    for (int k = 0; k < 3 && !pl->err[0]; k++) {
        if (!json_object_object_get_ex(o, num_keys[k], &v)) continue;
        double d = json_object_get_double(v);
        if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
            snprintf(pl->err, sizeof pl->err, "\"%s\" must be a number", num_keys[k]);
        else if (!(d >= 0 && d <= num_hi[k]))
            snprintf(pl->err, sizeof pl->err, "\"%s\" must be in [0, %g]", num_keys[k], num_hi[k]);
        else *num_dst[k] = (float)d;
    }
    static const char *const int_keys[] = {"max_tokens", "top_k", "seed"};
    static const int64_t int_hi[] = {1 << 24, 1 << 24, INT64_MAX};
    for (int k = 0; k < 3 && !pl->err[0]; k++) {
        if (!json_object_object_get_ex(o, int_keys[k], &v)) continue;
        int64_t x = json_object_get_int64(v);
        if (!json_object_is_type(v, json_type_int) || x < (k == 0 ? -1 : 0) || x > int_hi[k])
            snprintf(pl->err, sizeof pl->err, "\"%s\" must be an integer in [%d, %lld]", int_keys[k], k == 0 ? -1 : 0,
                     (long long)int_hi[k]);
        else if (k == 0) pl->max_new = (int)x;
        else if (k == 1) pl->sp.top_k = (int)x;
        else pl->sp.seed = (uint64_t)x;
    }
    /* a chat's response_format is read with its tools (prompt_of): an answer may be a call or the format */
    int chat = json_object_object_get_ex(o, "messages", NULL);
    if (!pl->err[0] && !chat && json_object_object_get_ex(o, "response_format", &v)) {
        if (tllm_response_format_grammar(v, "\"response_format\"", &pl->grammar))
            snprintf(pl->err, sizeof pl->err, "%s", tllm_errmsg());
        else if (pl->grammar && !(pl->grammar_key = strdup(json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN))))
            snprintf(pl->err, sizeof pl->err, "out of memory");
    }
    /* tools offered to a plain prompt would be left out of it: a call is a chat's answer */
    if (!pl->err[0] && !chat && json_object_object_get_ex(o, "tools", &v) &&
        !json_object_is_type(v, json_type_null) &&
        !(json_object_is_type(v, json_type_array) && json_object_array_length(v) == 0))
        snprintf(pl->err, sizeof pl->err, "\"tools\" are offered in a chat: give \"messages\", not \"prompt\"");
    if (pl->err[0] || !json_object_object_get_ex(o, "stop", &v)) return;
    static const char bad_stop[] = "\"stop\" must be a non-empty string or a list of them";
    if (json_object_is_type(v, json_type_string) && json_object_get_string_len(v) > 0) {
        if (pl->n_stop < CLI_MAX_STOP) pl->stop[pl->n_stop++] = json_object_get_string(v);
    } else if (json_object_is_type(v, json_type_array)) {
        for (size_t k = 0; k < json_object_array_length(v) && pl->n_stop < CLI_MAX_STOP; k++) {
            struct json_object *e = json_object_array_get_idx(v, k);
            if (!json_object_is_type(e, json_type_string) || !json_object_get_string_len(e)) {
                snprintf(pl->err, sizeof pl->err, "%s", bad_stop);
                return;
            }
            pl->stop[pl->n_stop++] = json_object_get_string(e);
        }
    } else {
        snprintf(pl->err, sizeof pl->err, "%s", bad_stop);
    }
}

static void prompt_of(struct json_object *o, struct cli_prompt_line *pl) {
    struct json_object *msgs = NULL, *pr = NULL;
    json_object_object_get_ex(o, "messages", &msgs);
    json_object_object_get_ex(o, "prompt", &pr);
    if (msgs) { /* as the server reads a chat, so a line and a request with the same fields get the same answer */
        const char *param;
        if (oai_chat_parse(&pl->chat, o, pl->err, sizeof pl->err, &param)) return;
        pl->grammar = pl->chat.grammar, pl->chat.grammar = NULL;
        pl->grammar_key = pl->chat.grammar_key, pl->chat.grammar_key = NULL;
    } else if (pr && json_object_is_type(pr, json_type_string)) {
        pl->text = json_object_get_string(pr);
        pl->text_len = (size_t)json_object_get_string_len(pr);
        if (pl->text_len == 0) snprintf(pl->err, sizeof pl->err, "the prompt is empty");
    } else if (pr && json_object_is_type(pr, json_type_array)) { /* token ids, as OpenAI's completions take */
        int n = (int)json_object_array_length(pr);
        if (n == 0) {
            snprintf(pl->err, sizeof pl->err, "the prompt is empty");
            return;
        }
        if (!(pl->ids = malloc((size_t)n * sizeof *pl->ids))) {
            snprintf(pl->err, sizeof pl->err, "out of memory");
            return;
        }
        for (int k = 0; k < n && !pl->err[0]; k++) {
            struct json_object *e = json_object_array_get_idx(pr, (size_t)k);
            int64_t v = json_object_is_type(e, json_type_int) ? json_object_get_int64(e) : -1;
            if (v < 0 || v > INT32_MAX) snprintf(pl->err, sizeof pl->err, "\"prompt\" item %d is not a token id", k);
            pl->ids[k] = (int32_t)v;
        }
        pl->n_ids = n;
    } else if (pr) {
        snprintf(pl->err, sizeof pl->err, "\"prompt\" must be a string or a list of token ids");
    } else {
        snprintf(pl->err, sizeof pl->err, "expected a string \"prompt\" or a \"messages\" list");
    }
}

void cli_prompt_line_parse(struct cli_prompt_line *pl, const char *line, size_t n, int jsonl, long lineno,
                           const struct tllm_sampler_params *base, const char *const *stop, int n_stop,
                           int max_new) {
    memset(pl, 0, sizeof *pl);
    pl->id = json_object_new_int64(lineno);
    pl->sp = *base;
    pl->max_new = max_new;
    for (int i = 0; i < n_stop && i < CLI_MAX_STOP; i++) pl->stop[pl->n_stop++] = stop[i];
    if (!jsonl) {
        pl->text = line;
        pl->text_len = n;
        if (n == 0) snprintf(pl->err, sizeof pl->err, "the prompt is empty");
        else cli_check_utf8("the prompt", line, n, pl->err, sizeof pl->err);
        return;
    }
    /* json-c takes invalid UTF-8 inside strings as is: check the line first, so a line in another
     * encoding is named as such rather than failing later in the tokenizer's output */
    if (cli_check_utf8("the line", line, n, pl->err, sizeof pl->err)) return;
    struct json_object *v;
    if (tllm_json_parse(line, n, &pl->obj, "line") || !json_object_is_type(pl->obj, json_type_object)) {
        snprintf(pl->err, sizeof pl->err, "not a JSON object");
        return;
    }
    if (json_object_object_get_ex(pl->obj, "id", &v)) {
        json_object_put(pl->id);
        pl->id = json_object_get(v);
    }
    options(pl->obj, pl);
    if (!pl->err[0]) prompt_of(pl->obj, pl);
}

void cli_prompt_line_free(struct cli_prompt_line *pl) {
    json_object_put(pl->id);
    json_object_put(pl->obj);
    oai_request_free(&pl->chat);
    free(pl->ids);
    tllm_grammar_free(pl->grammar);
    free(pl->grammar_key);
    memset(pl, 0, sizeof *pl);
}
