/* Loading a fixture's reference/reference.json and logits.f32, and comparing logits rows. */
#ifndef TLLM_TEST_REFERENCE_H
#define TLLM_TEST_REFERENCE_H

#include <stdint.h>

struct ref_fixture {
    int32_t *prompt_ids, *greedy_ids, *sequence;
    int n_prompt, n_greedy, n_seq;
    int *logits_rows;   /* positions with full logits */
    int n_logits_rows;
    int vocab;
    float *logits;      /* [n_logits_rows x vocab] */
    int32_t *top1;      /* [n_seq - 1] argmax at each position */
    float *margins;     /* [n_seq - 1] top1 - top2 */
    char *prompt_text;  /* NULL for small/ fixtures */
    char *greedy_text;
};

/* 0 on success; prints why on failure. */
int ref_load(const char *model_dir, struct ref_fixture *r);
/* The fixture and its model (packed: with the int8 packs, as the CLI loads a model without --exact);
 * 0 on success, else -1 with both freed and why printed. */
struct tllm_model;
int ref_load_model(const char *model_dir, int packed, struct ref_fixture *r, struct tllm_model **m);
void ref_free(struct ref_fixture *r);

/* Relative RMS error and max abs error relative to max|ref| of one row. */
void ref_compare_row(const float *ref, const float *got, int n, double *rel_rms, double *rel_max);

int argmax_f32(const float *x, int n);

#endif
