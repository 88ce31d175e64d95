/* tllm info: what a checkpoint is and what it costs to run. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/load/checkpoint.h"
#include "engine/load/gguf_vocab.h"
#include "tokenizer/chat.h"
#include "kernels/cpu/cpu_features.h"
#include "base/error.h"
#include "engine/load/ggml_types.h"
#include "engine/load/gguf.h"
#include "engine/load/model.h"

static void describe(const struct tllm_qweights *w, char *buf, size_t n) {
    static const char *const scale_kind[] = {"", "", "E8M0", "E4M3", "E8M0"};
    if (w->format == TLLM_WF_DENSE) snprintf(buf, n, "%s", tllm_dtype_name(w->dtype));
    else if (w->format == TLLM_WF_AFFINE)
        snprintf(buf, n, "affine %d-bit g%d (%s scales and biases)%s", w->bits, w->group_size, tllm_dtype_name(w->dtype),
                 w->perm ? ", act-order" : "");
    else snprintf(buf, n, "%s (%s scale per %d)", tllm_wformat_name(w->format), scale_kind[w->format], w->group_size);
}

/* Each distinct format of the model's linears and how many use it */
static void list_formats(const struct tllm_model *m) {
    char seen[16][96];
    int count[16] = {0}, n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct tllm_layer *L = &m->layers[l];
        const struct tllm_qweights *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            char buf[96];
            describe(ws[i], buf, sizeof buf);
            int k = 0;
            while (k < n && strcmp(seen[k], buf)) k++;
            if (k == n && n < 16) memcpy(seen[n++], buf, sizeof buf);
            if (k < 16) count[k]++;
        }
    }
    for (int k = 0; k < n; k++) printf("%s%d x %s\n", k ? "                 " : "linears          ", count[k], seen[k]);
}

/* A GGUF file: its name, and each tensor type with its count and bits per weight as stored */
static void gguf_summary(const struct tllm_gguf *g) {
    const char *name = NULL;
    tllm_gguf_get_str(g, "general.name", &name);
    printf("file             GGUF v%u%s%s%s\n", g->version, name ? " \"" : "", name ? name : "", name ? "\"" : "");
    int count[64] = {0};
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].type < 64) count[g->tensors[i].type]++;
    for (uint32_t ty = 0, k = 0; ty < 64; ty++) {
        const struct tllm_ggml_type *d = tllm_ggml_type(ty);
        if (!count[ty] || !d) continue;
        printf("%s%d x %s (%.4g bits per weight)\n", k++ ? "                 " : "tensor types     ", count[ty], d->name,
               8.0 * d->bytes / d->block);
    }
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
    int n_tensors = m->gguf ? m->gguf->n_tensors : 0, n_files = m->ckpt ? m->ckpt->n_files : 1;
    for (int f = 0; m->ckpt && f < m->ckpt->n_files; f++) n_tensors += m->ckpt->files[f]->n_tensors;
    size_t weight_bytes = tllm_model_file_bytes(m);
    char buf[96];
    printf("model            %s\n", m->dir);
    if (m->gguf) gguf_summary(m->gguf);
    printf("architecture     qwen2: %d layers, hidden %d, heads %d (KV %d, GQA %d:1), head_dim %d, ffn %d, vocab %d\n",
           c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->n_heads / c->n_kv_heads, c->head_dim, c->ffn_dim,
           c->vocab_size);
    printf("                 rope_theta %g, rms_norm_eps %g, max positions %d%s, %s embeddings\n", c->rope_theta,
           c->norm_eps, c->max_pos, c->sliding_window ? " (the sliding window)" : "",
           c->tie_embeddings ? "tied" : "separate lm_head");
    static const char *const methods[] = {"mlx", "GPTQ", "AWQ"};
    if (m->gguf) printf("quantization     ggml blocks, mapped exactly onto tllm's layouts (below)\n");
    else if (!c->quant.bits) printf("quantization     none (dense)\n");
    else if (c->qmethod == TLLM_QMETHOD_MLX)
        printf("quantization     mlx %s %d-bit g%d%s\n", tllm_qmode_name(c->quant.mode), c->quant.bits, c->quant.group_size,
               c->n_overrides ? ", per-module overrides below" : "");
    else
        printf("quantization     %s %d-bit g%d%s (converted to affine on load)\n", methods[c->qmethod], c->quant.bits,
               c->quant.group_size ? c->quant.group_size : -1, c->gptq_desc_act ? " act-order" : "");
    for (int i = 0; i < c->n_overrides; i++) {
        const struct tllm_quant_spec *o = &c->overrides[i].spec;
        if (o->bits) printf("                 %s: %s %d-bit g%d\n", c->overrides[i].module, tllm_qmode_name(o->mode), o->bits, o->group_size);
        else printf("                 %s: unquantized\n", c->overrides[i].module);
    }
    list_formats(m);
    describe(&m->embed, buf, sizeof buf);
    printf("embedding        %s\n", buf);
    if (!c->tie_embeddings) {
        describe(&m->lm_head, buf, sizeof buf);
        printf("lm_head          %s\n", buf);
    }
    printf("tensors          %d in %d file%s\n", n_tensors, n_files, n_files > 1 ? "s" : "");
    printf("parameters       %.1f M\n", (double)tllm_model_n_params(m) / 1e6);
    printf("weight bytes     %zu (%.1f MiB)%s\n", weight_bytes, (double)weight_bytes / (1 << 20), m->gguf ? " in the file" : "");
    size_t bpt = tllm_model_bytes_per_token(m, 0);
    printf("bytes per token  %zu (%.1f MiB read per decoded token; %.2f bits per weight)\n", bpt, (double)bpt / (1 << 20),
           tllm_model_bits_per_weight(m, 0));
    size_t kv = (size_t)2 * c->n_layers * c->n_kv_heads * c->head_dim * sizeof(float);
    printf("KV cache         %zu bytes per token (float32; %.1f MiB for 4096 tokens)\n", kv, (double)kv * 4096 / (1 << 20));
    printf("CPU kernels      %s (TLLM_CPU=ref|avx2|avxvnni|avx512|amx picks another this CPU runs)\n", tllm_cpu_path());
    /* and what the CPU's int8 path reads (kernels/cpu/qpack.h: the compact forms where this CPU's kernel reads them) */
    if (tllm_model_pack(m)) {
        printf("CPU int8 path    cannot pack: %s\n", tllm_errmsg());
    } else {
        bpt = tllm_model_bytes_per_token(m, 1);
        printf("CPU int8 path    %.1f MiB read per decoded token (%.2f bits per weight, the linears as packed)\n",
               (double)bpt / (1 << 20), tllm_model_bits_per_weight(m, 1));
    }
    /* the chat template, as chat and serve will run it (a broken one is reported, not fatal here) */
    struct tllm_chat_template tpl;
    char *cfg = m->gguf ? NULL : tllm_path_join(m->dir, "tokenizer_config.json");
    int trc = m->gguf ? tllm_gguf_chat_template(m->gguf, &tpl)
                      : cfg && access(cfg, R_OK) == 0 ? tllm_chat_template_load(cfg, &tpl) : (memset(&tpl, 0, sizeof tpl), 0);
    free(cfg);
    if (trc) printf("chat template    cannot be run: %s\n", tllm_errmsg());
    else if (tpl.kind == TLLM_CHAT_JINJA) printf("chat template    Jinja, run as written (tllm template shows a rendering)\n");
    else if (tpl.kind == TLLM_CHAT_CHATML) printf("chat template    rendered as ChatML: the interpreter refused it: %s\n", tpl.parse_error);
    else printf("chat template    none (prompts are plain text)\n");
    tllm_chat_template_free(&tpl);
    tllm_model_free(m);
    return 0;
}
