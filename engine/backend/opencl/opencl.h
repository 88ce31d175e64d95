/* The OpenCL backend's entry points, for the backend registry (engine/backend/backend.c): the rest
 * of the engine reaches it only through struct tllm_backend. */
#ifndef TLLM_BACKEND_OPENCL_H
#define TLLM_BACKEND_OPENCL_H

#include <stdio.h>

#include "engine/backend/backend.h"

/* As tllm_backend_device_init and tllm_backend_list_devices */
int tllm_backend_opencl_init(struct tllm_backend **out, const struct tllm_model *m, int n_ctx, int index);
int tllm_backend_opencl_list(FILE *out);

#endif
