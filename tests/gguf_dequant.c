/* For tests/gguf_types.py: every matrix of a GGUF file as tllm maps it (engine/load/ggml_types.c),
 * dequantized by the scalar reference (scale * code + bias, the value every kernel is checked against),
 * written as OUT_DIR/NAME.f32 (float32 rows). The Python side compares them with gguf-py's dequantize.
 * usage: gguf_dequant FILE.gguf OUT_DIR */
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "engine/load/ggml_types.h"
#include "engine/load/gguf.h"
#include "kernels/cpu/qmatmul.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gguf_dequant FILE.gguf OUT_DIR\n");
        return 2;
    }
    struct tllm_gguf *g;
    if (tllm_gguf_open(argv[1], &g)) {
        fprintf(stderr, "gguf_dequant: %s\n", tllm_errmsg());
        return 1;
    }
    int status = 0;
    for (int i = 0; i < g->n_tensors && !status; i++) {
        const struct tllm_gguf_tensor *t = &g->tensors[i];
        struct tllm_qweights w;
        void *owned[2];
        if (t->n_dims > 2 || tllm_ggml_bind(t->name, t->type, t->ne[1], t->ne[0], t->data, g->path, &w, owned)) {
            fprintf(stderr, "gguf_dequant: %s\n", tllm_errmsg());
            status = 1;
            break;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.f32", argv[2], t->name);
        FILE *f = fopen(path, "wb");
        float *row = malloc((size_t)w.cols * sizeof *row);
        if (!f || !row) status = 1;
        for (int r = 0; r < w.rows && !status; r++) {
            tllm_qw_dequant_row_ref(&w, r, row);
            if (fwrite(row, sizeof *row, (size_t)w.cols, f) != (size_t)w.cols) status = 1;
        }
        if (f && fclose(f)) status = 1;
        if (status) fprintf(stderr, "gguf_dequant: cannot write %s\n", path);
        free(row);
        free(owned[0]), free(owned[1]);
    }
    tllm_gguf_close(g);
    return status;
}
