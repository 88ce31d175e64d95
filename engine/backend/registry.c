/* The backend registry: the devices there are, and the calls every backend shares. */
#include "engine/backend/registry.h"

#include "engine/backend/opencl/opencl.h"

int tllm_backend_device_init(struct tllm_backend **out, const struct tllm_model *m, int n_ctx, int index) {
    return tllm_backend_opencl_init(out, m, n_ctx, index);
}

int tllm_backend_list_devices(FILE *out) { return tllm_backend_opencl_list(out); }

void tllm_backend_free(struct tllm_backend *b) {
    if (b) b->ops->free(b);
}

void tllm_backend_describe(const struct tllm_backend *b, struct tllm_backend_info *info) { b->ops->describe(b, info); }
