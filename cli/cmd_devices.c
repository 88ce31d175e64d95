/* tllm devices: the OpenCL platforms and devices, numbered as --device opencl:N counts them. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/backend/registry.h"

int cmd_devices(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        puts("usage: tllm devices\nLists OpenCL devices for --device opencl:N (the CPU path is always there as --device cpu).");
        return 0;
    }
    if (argc > 1) cli_die("devices: unknown option '%s'", argv[1]);
    printf("cpu  the CPU threads (always available)\n");
    if (tllm_backend_list_devices(stdout) == 0) printf("(no OpenCL platform found: install an ICD, e.g. pocl-opencl-icd or the GPU driver's)\n");
    return 0;
}
