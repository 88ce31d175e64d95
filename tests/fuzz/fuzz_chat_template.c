/* The chat-template loader and renderer: input = template text, then NUL-separated role/content
 * pairs. A template rendered as ChatML (the fallback for one the interpreter refuses) must hold every
 * message's content; a Jinja template may drop any. */
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/chat.h"

#define MAX_MSGS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = '\0';
    char *parts[1 + 2 * MAX_MSGS];
    int np = 0;
    for (char *p = s; np < 1 + 2 * MAX_MSGS;) {
        parts[np++] = p;
        size_t l = strlen(p);
        if (p + l >= s + size) break;
        p += l + 1;
    }
    struct tllm_chat_template t = {0};
    if (tllm_chat_template_parse(parts[0], &t, "fuzz") == 0) {
        struct tllm_chat_msg m[MAX_MSGS];
        int n = 0;
        for (int i = 1; i + 1 < np; i += 2) m[n++] = (struct tllm_chat_msg){parts[i], parts[i + 1]};
        struct tllm_buf out = {0};
        if (tllm_chat_render(&t, m, n, (int)(size & 1), &out) == 0 && t.kind == TLLM_CHAT_CHATML)
            for (int i = 0; i < n; i++)
                if (!strstr(out.data ? out.data : "", m[i].content)) abort();
        tllm_buf_free(&out);
        tllm_chat_template_free(&t);
    }
    free(s);
    return 0;
}
