/* The backend registry: the devices there are, and the calls every backend shares. */
#include "engine/backend/registry.h"

#include <stdlib.h>
#include <string.h>

#include "engine/backend/opencl/opencl.h"
#include "base/error.h"

int tllm_device_index(const char *spec, int *index) {
    if (!spec || !strcmp(spec, "auto")) *index = -2;
    else if (!strcmp(spec, "cpu")) *index = -3;
    else if (!strcmp(spec, "opencl")) *index = -1;
    else if (!strncmp(spec, "opencl:", 7) && spec[7] >= '0' && spec[7] <= '9' && strlen(spec + 7) <= 4 &&
             strspn(spec + 7, "0123456789") == strlen(spec + 7))
        *index = atoi(spec + 7);
    else return tllm_fail(TLLM_ERR_ARG, "device '%s' is not cpu, opencl, opencl:N or auto", spec);
    return TLLM_OK;
}

int tllm_backend_device_init(struct tllm_backend **out, const struct tllm_model *m, int n_ctx, int index) {
    return tllm_backend_opencl_init(out, m, n_ctx, index);
}

int tllm_backend_list_devices(FILE *out) { return tllm_backend_opencl_list(out); }

void tllm_backend_free(struct tllm_backend *b) {
    if (b) b->ops->free(b);
}

void tllm_backend_describe(const struct tllm_backend *b, struct tllm_backend_info *info) { b->ops->describe(b, info); }
