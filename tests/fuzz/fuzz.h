/* Shared by the fuzz targets: libFuzzer's entry point, and a scratch file for loaders that read
 * from a path (the real code path, open/stat/read included). */
#ifndef TLLM_FUZZ_H
#define TLLM_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Write data to this process's scratch file (under $TMPDIR) and return its path; aborts on I/O
 * failure (a harness problem, not a finding). */
const char *fuzz_scratch(const char *name, const uint8_t *data, size_t size);

#endif
