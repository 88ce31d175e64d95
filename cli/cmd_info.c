/* tllm info: what a checkpoint is and what it costs to run. */
#include <string.h>

#include "cli/cli.h"
#include "kernels/cpu/cpu_features.h"
#include "engine/base/error.h"
#include "engine/load/model.h"

static void describe(const struct tllm_qweights *w, char *buf, size_t n) {
    if (w->format == TLLM_WF_DENSE) snprintf(buf, n, "%s", tllm_dtype_name(w->dtype));
    else snprintf(buf, n, "%d-bit g%d (%s scales)", w->bits, w->group_size, tllm_dtype_name(w->dtype));
}

int cmd_info(int argc, char **argv) {
    if (tllm_cpu_select()) cli_die_lib(); /* the path it names is said below */
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) dir = cli_value(argc, argv, &i);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            puts("usage: tllm info [-m MODEL]");
            return 0;
        } else cli_die("info: unknown option '%s'", argv[i]);
    }
    dir = cli_model_dir(dir);
    struct tllm_model *m;
    if (tllm_model_load(dir, &m)) cli_die_lib();
    const struct tllm_config *c = &m->cfg;
    int n_tensors = 0;
    for (int f = 0; f < m->ckpt->n_files; f++) n_tensors += m->ckpt->files[f]->n_tensors;
    char buf[96];
    printf("model            %s\n", dir);
    printf("architecture     qwen2: %d layers, hidden %d, heads %d (KV %d, GQA %d:1), head_dim %d, ffn %d, vocab %d\n",
           c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->n_heads / c->n_kv_heads, c->head_dim, c->ffn_dim,
           c->vocab_size);
    printf("                 rope_theta %g, rms_norm_eps %g, max positions %d, %s embeddings\n", c->rope_theta,
           c->norm_eps, c->max_pos, c->tie_embeddings ? "tied" : "separate lm_head");
    describe(&m->layers[0].wq, buf, sizeof buf);
    printf("quantization     %s\n", c->quant.bits ? buf : "none (dense)");
    for (int i = 0; i < c->n_overrides; i++) {
        if (c->overrides[i].spec.bits) printf("                 %s: %d-bit g%d\n", c->overrides[i].module,
                                              c->overrides[i].spec.bits, c->overrides[i].spec.group_size);
        else printf("                 %s: unquantized\n", c->overrides[i].module);
    }
    describe(&m->embed, buf, sizeof buf);
    printf("embedding        %s\n", buf);
    if (!c->tie_embeddings) {
        describe(&m->lm_head, buf, sizeof buf);
        printf("lm_head          %s\n", buf);
    }
    printf("tensors          %d in %d file%s\n", n_tensors, m->ckpt->n_files, m->ckpt->n_files > 1 ? "s" : "");
    printf("parameters       %.1f M\n", (double)tllm_model_n_params(m) / 1e6);
    printf("weight bytes     %zu (%.1f MiB)\n", m->ckpt->total_bytes, (double)m->ckpt->total_bytes / (1 << 20));
    size_t bpt = tllm_model_bytes_per_token(m);
    printf("bytes per token  %zu (%.1f MiB read per decoded token)\n", bpt, (double)bpt / (1 << 20));
    size_t kv = (size_t)2 * c->n_layers * c->n_kv_heads * c->head_dim * sizeof(float);
    printf("KV cache         %zu bytes per token (float32; %.1f MiB for 4096 tokens)\n", kv, (double)kv * 4096 / (1 << 20));
    printf("CPU kernels      %s (TLLM_CPU=ref|avx2|avx512 picks another this CPU runs)\n", tllm_cpu_path());
    tllm_model_free(m);
    return 0;
}
