/* What the forward pass needs from a device: the table every backend fills (as ggml-backend's).
 * The CPU backend (engine/backend/cpu/) runs the Qwen2 forward pass on the thread pool over the
 * host's paged KV cache (engine/run/kv_cache.h); a device backend (engine/backend/opencl/) runs steps
 * of one sequence (a generated token, or a chunk of prompt tokens) on its own copy of the weights and
 * of the cache, which the context keeps in step with the host's by ranges of positions, or, bound to
 * a paged cache (use_kv), steps of many sequences with their blocks on the device.
 * The context (engine/run/context.c) and the generation loop talk to backends only through this. */
#ifndef TLLM_BACKEND_H
#define TLLM_BACKEND_H

#include <stdint.h>
#include <stdio.h>

struct tllm_model;
struct tllm_kv;
struct tllm_qweights;

/* The tokens of one step. Each carries its sequence and its position in it, so that one step mixes
 * prefill chunks of some sequences with generated tokens of others. A sequence's tokens are together
 * and at consecutive positions from where its cache ends (the CPU backend, and a device bound to
 * the cache by use_kv; otherwise a device takes one sequence). The first n_gen tokens are generated ones (one per sequence, decoding): a token's
 * arithmetic follows its role (kernels/cpu/qpack.h), never what else is in the step. */
struct tllm_batch {
    int n;              /* tokens in the step */
    const int32_t *id;  /* [n] token ids; id < 0 (greedy steps on a device only): the previous step's argmax */
    const int32_t *pos; /* [n] each token's position in its sequence */
    const int32_t *seq; /* [n] each token's sequence (its id in the KV cache) */
    const int8_t *out;  /* [n] 1 where the token's logits (or argmax) are wanted, NULL for none */
    int n_gen;          /* tokens [0, n_gen) are generated tokens */
    /* Optional, per out row (the tokens out marks, in order). With both logits and argmax asked:
     * want_logits[j] 1 where row j's logits are wanted (written at logits + j x vocab), 0 where its
     * argmax is enough (NULL: every row's logits); every row's argmax is written. mask[j] >= 0: row j's
     * argmax is over the ids whose bit is set in allow + mask[j] x TLLM_MASK_WORDS(vocab) (a grammar's
     * tokens, picked where the logits are: 4 bytes a row back from a device, not the row); an id
     * outside [0, vocab) when no allowed id has a logit above -inf. */
    const int8_t *want_logits;
    const int32_t *mask;
    const uint32_t *allow;
    /* Optional, in place of mask and allow: gives them (NULL for none) once the step's layers are
     * queued and before its outputs are taken, so that a device computes while the host makes the
     * masks (a grammar's walks over the vocabulary: ~1-3 ms for a state not met before). A status:
     * the step fails with it. */
    int (*fill_masks)(void *user, const int32_t **mask, const uint32_t **allow);
    void *user;
};

/* 32-bit words of a bitset of n ids (bit i of word i / 32: id i) */
#define TLLM_MASK_WORDS(n) (((n) + 31) / 32)

/* For reports (tllm bench, tllm info) */
struct tllm_backend_info {
    char name[300];         /* "CPU" or "OpenCL NVIDIA H200 (NVIDIA CUDA)" */
    int launches_per_token; /* kernel launches of one decode step (0 on the CPU) */
    int groups;             /* work-groups of a one-launch step (0: not one launch) */
    int int8;               /* matmuls take int8 activations */
    size_t weight_bytes;    /* weights a decode step reads, as held there (0 on the CPU) */
    size_t weights;         /* ... the weights they hold */
    int prefill;            /* prompt steps: 1 run here and faster than on the CPU (a GPU), 0 run here but
                             * slower (a CPU device), -1 not here (single tokens only) */
};

struct tllm_backend;

struct tllm_backend_ops {
    /* One step: the batch's tokens go through every layer and their K/V into the cache. For each
     * token that batch->out marks, in order: logits != NULL receives [vocab] floats, argmax != NULL
     * one id. Fails with a message and the cache unchanged past what the step was to write. */
    int (*step)(struct tllm_backend *b, const struct tllm_batch *batch, float *logits, int32_t *argmax);
    /* Optional (NULL where a step is synchronous): queue a greedy step of one token, whose argmax is
     * kept on the device (so an id < 0 in the next one takes it), and return at once; step_wait gives
     * the argmax of the oldest queued step; pending counts them (the context keeps at most TLLM_GREEDY_AHEAD queued). */
    int (*step_enqueue)(struct tllm_backend *b, const struct tllm_batch *batch);
    int (*step_wait)(struct tllm_backend *b, int32_t *argmax);
    int (*pending)(const struct tllm_backend *b);
    /* Device backends: copy cache positions [p0, p1) from the host, or back to it, as float32 in
     * kt [n_layers x kv_dim x (p1 - p0)] (keys transposed) and v [n_layers x (p1 - p0) x kv_dim]. */
    int (*kv_upload)(struct tllm_backend *b, const float *kt, const float *v, int p0, int p1);
    int (*kv_download)(struct tllm_backend *b, float *kt, float *v, int p0, int p1);
    /* Optional (a device that runs many sequences at once): from now on steps take tokens of kv's
     * sequences, as the CPU backend's do, their K/V in a pool of kv's blocks on the device (kv keeps the
     * tables and reference counts; its own blocks are not written). NULL: back to the device's own
     * cache of one sequence. The caller keeps kv and binds NULL before freeing it. */
    int (*use_kv)(struct tllm_backend *b, struct tllm_kv *kv);
    void (*describe)(const struct tllm_backend *b, struct tllm_backend_info *info);
    /* Optional (tests, tllm bench-gemm): y[n][rows] = W x[n][cols] through the device's prompt GEMM
     * (int8 1 or 2: x quantized there per block of 32 in that many int8 levels, as prompt activations
     * are; 0: float inputs), or with reps > 0 that GEMM alone reps times after a warm-up, *secs their
     * wall time (y unused). */
    int (*matmul)(struct tllm_backend *b, const struct tllm_qweights *w, const float *x, int n, int int8, float *y, int reps,
                  double *secs);
    void (*free)(struct tllm_backend *b);
};

struct tllm_backend {
    const struct tllm_backend_ops *ops;
};

/* The CPU: uploads nothing (the weights are mapped); steps of up to n_batch tokens of the sequences of
 * kv (which the caller keeps, reserves positions in and commits to). */
int tllm_backend_cpu_init(struct tllm_backend **out, const struct tllm_model *m, struct tllm_kv *kv, int n_batch);

#endif
