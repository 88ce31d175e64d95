/* The safetensors header and offsets validator: any bytes as a whole file. Every tensor it accepts
 * must lie inside the input, and is read through to prove it. */
#include "engine/load/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tllm_st_file *f;
    if (tllm_st_parse_mem(data, size, "fuzz.safetensors", &f) != 0) return 0;
    volatile uint8_t sink = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const uint8_t *p = f->tensors[i].data;
        for (size_t k = 0; k < f->tensors[i].nbytes; k++) sink ^= p[k];
        tllm_st_find(f, f->tensors[i].name);
    }
    tllm_st_close(f);
    (void)sink;
    return 0;
}
