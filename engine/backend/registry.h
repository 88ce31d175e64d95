/* The backends there are: which device a --device index names, the list of devices, and the calls
 * every backend shares. */
#ifndef TLLM_BACKEND_REGISTRY_H
#define TLLM_BACKEND_REGISTRY_H

#include <stdio.h>

#include "engine/backend/backend.h"

/* "cpu", "auto" (or NULL), "opencl", "opencl:N" as tllm_backend_device_init's index: -3 (the CPU),
 * -2, -1, N; anything else fails with a message */
int tllm_device_index(const char *spec, int *index);

/* A device: index >= 0 for opencl:N, -1 for the first GPU (else the first device), -2 for a GPU only
 * (auto). Uploads the model's weights and makes a device KV cache of n_ctx positions. Fails with a
 * message: TLLM_ERR_UNSUPPORTED when there is nothing to run on (no platform, or no GPU for -2). */
int tllm_backend_device_init(struct tllm_backend **out, const struct tllm_model *m, int n_ctx, int index);

/* Every device, numbered as --device opencl:N counts them; returns the count (0: none, or no loader). */
int tllm_backend_list_devices(FILE *out);

/* NULL is fine */
void tllm_backend_free(struct tllm_backend *b);
void tllm_backend_describe(const struct tllm_backend *b, struct tllm_backend_info *info);

#endif
