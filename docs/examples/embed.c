/* A program that embeds tllm through its C API: load a model, chat one turn with the reply streamed,
 * tokenize and detokenize, print the statistics; then an agent's turn (OpenAI's request with a tool).
 *
 *     cc embed.c $(pkg-config --cflags --libs tllm) -o embed
 *     ./embed [MODEL] ["question"]      (MODEL: a directory or owner/name; default $TLLM_MODEL or the demo)
 */
#include <stdio.h>
#include <string.h>

#include <tllm.h>

static int print_piece(const char *text, size_t len, void *user) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop the reply here */
}

static int fail(const char *what) {
    fprintf(stderr, "embed: %s: %s\n", what, tllm_errmsg());
    return 1;
}

int main(int argc, char **argv) {
    const char *model = argc > 1 && *argv[1] ? argv[1] : NULL;
    const char *question = argc > 2 ? argv[2] : "What does ls -l do?";
    struct tllm_engine *e;
    struct tllm_session *s;
    struct tllm_engine_params ep = {.threads = 2};
    if (tllm_engine_open(model, &ep, &e)) return fail("open");
    struct tllm_session_params sp = {.n_ctx = 512, .device = "cpu"};
    if (tllm_session_open(e, &sp, &s)) {
        tllm_engine_free(e);
        return fail("session");
    }
    printf("model %s on %s, vocabulary %d, tllm %s\n", tllm_engine_dir(e), tllm_session_device(s),
           tllm_engine_vocab_size(e), TLLM_VERSION);

    /* tokens and back */
    int32_t *ids;
    size_t n_ids, len;
    char *text;
    if (tllm_tokenize(e, question, strlen(question), 0, &ids, &n_ids)) return fail("tokenize");
    if (tllm_detokenize(e, ids, n_ids, 0, &text, &len)) return fail("detokenize");
    printf("%zu tokens, round trip %s\n", n_ids, len == strlen(question) && !memcmp(text, question, len) ? "ok" : "DIFFERS");
    tllm_free(ids);
    tllm_free(text);

    /* one chat turn, greedy, at most 8 tokens */
    struct tllm_generate_params gp;
    tllm_generate_params_default(e, &gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = 8;
    struct tllm_chat_msg msg = {"user", question};
    struct tllm_stats st;
    char *reply;
    printf("> %s\n", question);
    if (tllm_session_chat(s, &msg, 1, &gp, print_piece, NULL, &reply, &st)) return fail("chat");
    printf("\n%d prompt tokens, %d generated, finish %s, reply %zu bytes\n", st.n_prompt, st.n_generated,
           tllm_finish_name(st.finish), strlen(reply));
    tllm_free(reply);
    int generated = st.n_generated;

    /* an agent's turn: the chat as OpenAI's request body, with a tool the answer must call */
    const char *request =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What is the weather in Paris?\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
        " \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 20}}, \"required\": [\"city\"]}}}],"
        " \"tool_choice\": \"required\"}";
    char *calls;
    gp.max_tokens = 64;
    if (tllm_session_chat_json(s, request, &gp, NULL, NULL, &reply, &calls, NULL, NULL, &st)) return fail("chat_json");
    printf("tool calls %s, finish %s\n", calls ? calls : "(none)", tllm_finish_name(st.finish));
    tllm_free(reply);
    tllm_free(calls);

    tllm_session_free(s);
    tllm_engine_free(e);
    return generated > 0 ? 0 : 1;
}
