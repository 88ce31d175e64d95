/* The GGUF parser and the ggml type mapping: any bytes as a whole file. Every tensor it accepts must lie
 * inside the input (read through to prove it); every matrix of a type tllm runs is mapped (small ones),
 * and the tokenizer built from the keys where there is one. */
#include <stdlib.h>

#include "engine/load/ggml_types.h"
#include "engine/load/gguf.h"
#include "engine/load/gguf_vocab.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tllm_gguf *g;
    if (tllm_gguf_parse_mem(data, size, "fuzz.gguf", &g) != 0) return 0;
    volatile uint8_t sink = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tllm_gguf_tensor *t = &g->tensors[i];
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) sink ^= p[k];
        struct tllm_qweights w;
        void *owned[2];
        if (t->n_dims == 2 && t->ne[0] * t->ne[1] <= (1 << 16) && tllm_ggml_bind(t->name, t->type, t->ne[1], t->ne[0], t->data, g->path, &w, owned) == 0)
            free(owned[0]), free(owned[1]);
    }
    for (int i = 0; i < g->n_kvs; i++) tllm_gguf_find_kv(g, g->kvs[i].key);
    struct tllm_tok *tok;
    if (tllm_gguf_tokenizer(g, &tok) == 0) tllm_tok_free(tok);
    tllm_gguf_close(g);
    (void)sink;
    return 0;
}
