/* OpenCL decode backend: the whole per-token forward pass on an OpenCL 1.2 device (kernels/opencl/).
 * Weights are uploaded once; the KV cache lives on the device and is synced with the CPU context's
 * cache by position ranges, so prefill (CPU threads) and decode (device) can alternate. */
#ifndef TLLM_CL_H
#define TLLM_CL_H

#include <stdint.h>
#include <stdio.h>

#include "engine/load/model.h"

struct tllm_cl;

/* List every OpenCL platform and device, numbered as --device opencl:N counts them. Returns the count
 * (0 when no platform or no ICD loader is found). */
int tllm_cl_list(FILE *out);

/* Pick a device: index >= 0 for opencl:N, -1 for the first GPU (else the first device), -2 for a GPU
 * only (auto). Uploads the model's weights and makes a device KV cache of n_ctx positions.
 * Fails with a message naming what went wrong: TLLM_ERR_UNSUPPORTED when there is nothing to run on
 * (no platform, or no GPU for -2), other codes for a build failure or too little device memory. */
int tllm_cl_init(struct tllm_cl **out, const struct tllm_model *m, int n_ctx, int index);
void tllm_cl_free(struct tllm_cl *cl);
/* "NVIDIA H200 (NVIDIA CUDA)" */
const char *tllm_cl_device_name(const struct tllm_cl *cl);

/* One decode step for token `id` at position pos (the device cache holds positions [0, pos)).
 * logits != NULL: copied back [vocab]; next != NULL: argmax on the device. */
int tllm_cl_step(struct tllm_cl *cl, int32_t id, int pos, float *logits, int32_t *next);

/* Prompt processing: tokens ids[0 .. n) at positions pos0 .. pos0 + n - 1 through every layer (tiled
 * GEMMs, flash attention), their K and V into the device cache (which must hold [0, pos0)). For each
 * token that out marks (NULL: none), in order, logits != NULL receives [vocab] floats; argmax != NULL
 * (one token marked at most) its argmax. */
int tllm_cl_prefill(struct tllm_cl *cl, const int32_t *ids, int n, int pos0, const int8_t *out, float *logits, int32_t *argmax);
/* Steps of many sequences: from now on the K/V of kv's sequences live in a pool of kv's blocks on the
 * device (kv keeps the tables; its copies on write are logged for the device: tllm_kv_set_remote);
 * NULL ends that, the pool freed. The caller keeps kv, and binds NULL before freeing it. */
struct tllm_kv;
int tllm_cl_use_kv(struct tllm_cl *cl, struct tllm_kv *kv);
/* One step of tokens of kv's sequences, as the CPU backend's (engine/backend/backend.h: each sequence's
 * tokens together, from where its cache ends, positions reserved; per row logits, argmax, or a masked
 * argmax): K/V into the pool; for each token bt->out marks, in order, logits[vocab] and/or its argmax. */
struct tllm_batch;
int tllm_cl_batch(struct tllm_cl *cl, const struct tllm_batch *bt, float *logits, int32_t *argmax);
/* 1 if prompts run faster here than on the CPU threads (a GPU; what --prefill auto takes), 0 if they
 * can run here but slower (a CPU device), -1 if they cannot (tllm_cl_prefill says why) */
int tllm_cl_prefill_auto(const struct tllm_cl *cl);

/* For tests: y[n][rows] = W x for the n rows of x ([n][cols]) through prefill's GEMM kernels (int8:
 * x quantized on the device in blocks of 32, as prompt activations are; else float32), with split-K
 * as the device's size or TLLM_CL_SPLIT asks. W: dense, or 2/4/8-bit affine, in the model's format
 * where all of the model's matrices share one (then it is compiled into the kernels). */
int tllm_cl_matmul(struct tllm_cl *cl, const struct tllm_qweights *w, const float *x, int n, int int8, float *y);
/* tllm bench-gemm: the same GEMM (its input quantized once) reps times after a warm-up; *secs: the
 * wall time of the reps, launches included */
int tllm_cl_matmul_bench(struct tllm_cl *cl, const struct tllm_qweights *w, const float *x, int n, int int8, int reps, double *secs);

/* Greedy decoding a step ahead: tllm_cl_step_enqueue queues the step for token `id` at pos with the
 * argmax on the device and returns at once; id < 0 stands for the previous step's argmax, which the
 * host need not have read yet (so the device goes from one step to the next without waiting for the
 * host). tllm_cl_step_wait returns the argmax of the oldest queued step. At most TLLM_CL_AHEAD queued;
 * tllm_cl_step refuses to run while any is. */
#define TLLM_CL_AHEAD 4
int tllm_cl_step_enqueue(struct tllm_cl *cl, int32_t id, int pos);
int tllm_cl_step_wait(struct tllm_cl *cl, int32_t *next);
int tllm_cl_pending(const struct tllm_cl *cl);

/* Copy cache positions [p0, p1) host -> device or device -> host; the host layout is the CPU
 * context's (keys [layer][kv_head][dim][n_ctx], values [layer][n_ctx][kv_dim]). */
int tllm_cl_kv_upload(struct tllm_cl *cl, const float *key_cache, const float *value_cache, int p0, int p1);
int tllm_cl_kv_download(struct tllm_cl *cl, float *key_cache, float *value_cache, int p0, int p1);

/* 1 if the device's matvecs take int8 activations (a packed 4-bit model; not --exact). */
int tllm_cl_int8(const struct tllm_cl *cl);
/* Work-groups of the one-launch `token` kernel (0 when a step is one launch per kernel) */
int tllm_cl_token_groups(const struct tllm_cl *cl);
/* Bytes of weights a decode step reads on the device (every matrix but the embedding, as held there:
 * codes, scales, biases), and *weights the weights they hold */
size_t tllm_cl_step_weight_bytes(const struct tllm_cl *cl, size_t *weights);

/* Kernel launches of one decode step (for reports). */
int tllm_cl_launches_per_token(const struct tllm_cl *cl);

#endif
