#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

const char *fuzz_scratch(const char *name, const uint8_t *data, size_t size) {
    static char path[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/tllm-fuzz-%d-%s", tmp && *tmp ? tmp : "/tmp", (int)getpid(), name);
    FILE *fp = fopen(path, "wb");
    if (!fp || (size && fwrite(data, 1, size, fp) != size) || fclose(fp) != 0) {
        perror(path);
        abort();
    }
    return path;
}
