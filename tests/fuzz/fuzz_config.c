/* config.json: any bytes as the file. */
#include "engine/load/config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tllm_config c;
    if (tllm_config_load(fuzz_scratch("config.json", data, size), &c) == 0) tllm_config_free(&c);
    return 0;
}
