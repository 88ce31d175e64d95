#include "tests/reference.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/load/model.h"

static int32_t *int_array(struct json_object *a, int *n) {
    *n = (int)json_object_array_length(a);
    int32_t *v = malloc((size_t)(*n + 1) * sizeof *v);
    for (int i = 0; i < *n; i++) v[i] = json_object_get_int(json_object_array_get_idx(a, i));
    return v;
}

static char *opt_str(struct json_object *o, const char *key) {
    struct json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string)) return NULL;
    return strdup(json_object_get_string(v));
}

int ref_load(const char *dir, struct ref_fixture *r) {
    memset(r, 0, sizeof *r);
    char path[1024];
    snprintf(path, sizeof path, "%s/reference/reference.json", dir);
    struct json_object *root = json_object_from_file(path);
    if (!root) {
        fprintf(stderr, "cannot read %s\n", path);
        return -1;
    }
    struct json_object *v;
    json_object_object_get_ex(root, "prompt_ids", &v);
    r->prompt_ids = int_array(v, &r->n_prompt);
    json_object_object_get_ex(root, "greedy_ids", &v);
    r->greedy_ids = int_array(v, &r->n_greedy);
    json_object_object_get_ex(root, "sequence", &v);
    r->sequence = int_array(v, &r->n_seq);
    json_object_object_get_ex(root, "logits_rows", &v);
    r->logits_rows = (int *)int_array(v, &r->n_logits_rows);
    json_object_object_get_ex(root, "logits_shape", &v);
    r->vocab = json_object_get_int(json_object_array_get_idx(v, 1));
    json_object_object_get_ex(root, "top16", &v);
    int np = (int)json_object_array_length(v);
    r->top1 = malloc((size_t)np * sizeof *r->top1);
    for (int i = 0; i < np; i++)
        r->top1[i] = json_object_get_int(json_object_array_get_idx(json_object_array_get_idx(v, i), 0));
    json_object_object_get_ex(root, "margins", &v);
    r->margins = malloc((size_t)np * sizeof *r->margins);
    for (int i = 0; i < np; i++)
        r->margins[i] = (float)json_object_get_double(json_object_array_get_idx(v, i));
    r->prompt_text = opt_str(root, "prompt_text");
    r->greedy_text = opt_str(root, "greedy_text");
    json_object_put(root);

    snprintf(path, sizeof path, "%s/reference/logits.f32", dir);
    FILE *fp = fopen(path, "rb");
    size_t n = (size_t)r->n_logits_rows * (size_t)r->vocab;
    r->logits = malloc(n * sizeof(float));
    if (!fp || fread(r->logits, sizeof(float), n, fp) != n) {
        fprintf(stderr, "cannot read %s\n", path);
        if (fp) fclose(fp);
        ref_free(r);
        return -1;
    }
    fclose(fp);
    return 0;
}

void ref_free(struct ref_fixture *r) {
    free(r->prompt_ids);
    free(r->greedy_ids);
    free(r->sequence);
    free(r->logits_rows);
    free(r->logits);
    free(r->top1);
    free(r->margins);
    free(r->prompt_text);
    free(r->greedy_text);
    memset(r, 0, sizeof *r);
}

void ref_compare_row(const float *ref, const float *got, int n, double *rel_rms, double *rel_max) {
    double num = 0, den = 0, mx = 0, mref = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > mx || d != d) mx = d != d ? INFINITY : fabs(d);
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
    }
    *rel_rms = den > 0 ? sqrt(num / den) : sqrt(num);
    *rel_max = mref > 0 ? mx / mref : mx;
}

int argmax_f32(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int ref_load_model(const char *dir, int packed, struct ref_fixture *r, struct tllm_model **m) {
    *m = NULL;
    if (ref_load(dir, r) != 0) return -1;
    if (tllm_model_load(dir, m) != TLLM_OK || (packed && tllm_model_pack(*m) != TLLM_OK)) {
        fprintf(stderr, "%s: cannot load: %s\n", dir, tllm_errmsg());
        tllm_model_free(*m);
        *m = NULL;
        ref_free(r);
        return -1;
    }
    return 0;
}
