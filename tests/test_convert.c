/* Model tools: the quantizer is bit-identical to MLX on a whole checkpoint, quantize-on-load gives
 * the same model, mixed recipes and synthetic checkpoints load and run, bad inputs are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"
#include "engine/run/context.h"
#include "engine/convert/convert.h"
#include "base/error.h"

static char tmp[256];

/* "a/b" in one of a few rotating buffers (so a result can be an argument of the next call). */
static char *path2(const char *a, const char *b) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    char joined[1024];
    snprintf(joined, sizeof joined, "%s/%s", a, b);
    memcpy(buf[k], joined, sizeof joined);
    return buf[k];
}

/* Logits of a few ids through a model (the last row). */
static float *run(struct tllm_model *m) {
    static const int32_t ids[] = {5, 17, 300, 2047, 9};
    struct tllm_ctx ctx;
    float *out = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    CHECK(tllm_ctx_init(&ctx, m, 16, 0) == TLLM_OK, "ctx");
    CHECK(tllm_ctx_forward(&ctx, ids, 5, out, TLLM_LOGITS_LAST) == TLLM_OK, "forward: %s", tllm_errmsg());
    tllm_ctx_free(&ctx);
    return out;
}

static void same_tensors(const char *a_dir, const char *b_dir) {
    struct tllm_ckpt *a, *b;
    CHECK(tllm_ckpt_open(a_dir, &a) == TLLM_OK && tllm_ckpt_open(b_dir, &b) == TLLM_OK, "open: %s", tllm_errmsg());
    int n = 0, bad = 0;
    for (int f = 0; f < b->n_files; f++)
        for (int i = 0; i < b->files[f]->n_tensors; i++) {
            const struct tllm_tensor *tb = &b->files[f]->tensors[i], *ta = tllm_ckpt_find(a, tb->name);
            n++;
            if (!ta || ta->dtype != tb->dtype || ta->nbytes != tb->nbytes || memcmp(ta->data, tb->data, ta->nbytes)) {
                bad++;
                fprintf(stderr, "  tensor %s differs\n", tb->name);
            }
        }
    int na = 0;
    for (int f = 0; f < a->n_files; f++) na += a->files[f]->n_tensors;
    CHECK(bad == 0 && n == na, "%d of %d tensors differ (%d vs %d tensors)", bad, n, na, n);
    printf("  %d tensors byte-identical to %s\n", n, b_dir);
    tllm_ckpt_close(a);
    tllm_ckpt_close(b);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_convert MODELS_DIR CONFIGS_DIR\n");
        return 2;
    }
    const char *models = argv[1];
    snprintf(tmp, sizeof tmp, "/tmp/tllm-convert-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    struct tllm_quantize_opts q = {.bits = 4, .group_size = 32, .sb_dtype = TLLM_DT_INVALID};

    /* 1. bf16 -> 4-bit group 32 equals MLX's quantization of the same weights, byte for byte */
    char *out = path2(tmp, "q4g32");
    CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), out, &q) == TLLM_OK, "quantize: %s", tllm_errmsg());
    same_tensors(out, path2(models, "bf16-as-q4-g32"));
    struct tllm_model *mq, *mref, *mload;
    CHECK(tllm_model_load(out, &mq) == TLLM_OK, "load quantized: %s", tllm_errmsg());
    CHECK(tllm_model_load(path2(models, "bf16-as-q4-g32"), &mref) == TLLM_OK, "load ref");
    /* 2. quantize on load gives the same weights */
    CHECK(tllm_model_load(path2(models, "bf16"), &mload) == TLLM_OK, "load bf16");
    CHECK(tllm_model_quantize(mload, 4, 32) == TLLM_OK, "quantize on load: %s", tllm_errmsg());
    CHECK(mload->layers[0].wq.format == TLLM_WF_AFFINE && mload->lm_head.format == TLLM_WF_AFFINE, "not quantized");
    float *a = run(mq), *b = run(mref), *c = run(mload);
    int va = mref->cfg.vocab_size;
    CHECK(memcmp(a, b, (size_t)va * 4) == 0, "quantized checkpoint's logits differ from the MLX-quantized one");
    CHECK(memcmp(c, b, (size_t)va * 4) == 0, "quantize-on-load logits differ from the MLX-quantized checkpoint");
    free(a); free(b); free(c);
    tllm_model_free(mq);
    tllm_model_free(mref);
    tllm_model_free(mload);

    /* 2b. the float modes equal mlx.core.quantize's checkpoints of the same weights (tests/data/models/mxfp4,
     * nvfp4, mxfp8, made by mlx), byte for byte, and their config names the mode */
    static const struct {
        enum tllm_qmode mode;
        int bits, gs;
        const char *ref;
    } fp[] = {{TLLM_QM_MXFP4, 4, 32, "mxfp4"}, {TLLM_QM_NVFP4, 4, 16, "nvfp4"}, {TLLM_QM_MXFP8, 8, 32, "mxfp8"}};
    for (int i = 0; i < 3; i++) {
        q = (struct tllm_quantize_opts){.mode = fp[i].mode, .bits = fp[i].bits, .group_size = fp[i].gs, .sb_dtype = TLLM_DT_INVALID};
        char *o = path2(tmp, fp[i].ref);
        CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), o, &q) == TLLM_OK, "quantize %s: %s", fp[i].ref, tllm_errmsg());
        same_tensors(o, path2(models, fp[i].ref));
        struct tllm_model *mf;
        CHECK(tllm_model_load(o, &mf) == TLLM_OK, "load %s: %s", fp[i].ref, tllm_errmsg());
        if (mf) CHECK(mf->cfg.quant.mode == fp[i].mode && mf->layers[1].w_down.format != TLLM_WF_AFFINE, "%s: mode not written", fp[i].ref);
        tllm_model_free(mf);
    }
    q = (struct tllm_quantize_opts){.mode = TLLM_QM_NVFP4, .bits = 4, .group_size = 32, .sb_dtype = TLLM_DT_INVALID};
    CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), path2(tmp, "nv32"), &q) == TLLM_ERR_ARG &&
              strstr(tllm_errmsg(), "bits=4 group_size=32 is not supported for mode nvfp4"),
          "nvfp4 group 32: %s", tllm_errmsg());

    /* 3. a mixed recipe writes per-module overrides that the loader follows */
    q = (struct tllm_quantize_opts){.bits = 4, .group_size = 64, .mixed = "mixed_4_8", .sb_dtype = TLLM_DT_F16};
    out = path2(tmp, "mixed");
    CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), out, &q) == TLLM_OK, "mixed: %s", tllm_errmsg());
    CHECK(tllm_model_load(out, &mq) == TLLM_OK, "load mixed: %s", tllm_errmsg());
    /* 2 layers: layer 1 is in the last eighth, so its v_proj and down_proj get 8 bits; layer 0 does not */
    CHECK(mq->layers[1].wv.bits == 8 && mq->layers[1].w_down.bits == 8 && mq->layers[1].wq.bits == 4 &&
              mq->layers[0].wv.bits == 4 && mq->layers[0].w_down.bits == 4 && mq->layers[0].wq.dtype == TLLM_DT_F16,
          "mixed bits: layer 1 v %d down %d q %d, layer 0 v %d", mq->layers[1].wv.bits, mq->layers[1].w_down.bits,
          mq->layers[1].wq.bits, mq->layers[0].wv.bits);
    free(run(mq));
    tllm_model_free(mq);

    /* 3b. a recipe across modes: mxfp4 with mxfp8 where mlx-lm's recipes put more bits */
    q = (struct tllm_quantize_opts){.bits = 4, .group_size = 64, .mixed = "mixed_mxfp4_mxfp8", .sb_dtype = TLLM_DT_INVALID};
    out = path2(tmp, "mixed-modes");
    CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), out, &q) == TLLM_OK, "mixed modes: %s", tllm_errmsg());
    CHECK(tllm_model_load(out, &mq) == TLLM_OK, "load mixed modes: %s", tllm_errmsg());
    if (mq) {
        CHECK(mq->layers[1].wv.format == TLLM_WF_MXFP8 && mq->layers[1].w_down.format == TLLM_WF_MXFP8 &&
                  mq->layers[1].wq.format == TLLM_WF_MXFP4 && mq->layers[0].wv.format == TLLM_WF_MXFP4 &&
                  mq->embed.format == TLLM_WF_MXFP4,
              "mixed modes: layer 1 v %s down %s q %s, layer 0 v %s", tllm_wformat_name(mq->layers[1].wv.format),
              tllm_wformat_name(mq->layers[1].w_down.format), tllm_wformat_name(mq->layers[1].wq.format),
              tllm_wformat_name(mq->layers[0].wv.format));
        free(run(mq));
        tllm_model_free(mq);
    }
    struct tllm_quant_spec ms;
    CHECK(tllm_mixed_recipe_spec("mixed_nvfp4_6", "lm_head", 2, 64, &ms) == TLLM_OK && ms.mode == TLLM_QM_AFFINE && ms.bits == 6,
          "mixed_nvfp4_6: the lm_head gets affine 6-bit");
    CHECK(tllm_mixed_recipe_spec("mixed_nvfp4_6", "model.layers.0.self_attn.q_proj", 2, 64, &ms) == TLLM_OK &&
              ms.mode == TLLM_QM_NVFP4 && ms.group_size == 16,
          "mixed_nvfp4_6: q_proj gets nvfp4");
    CHECK(tllm_mixed_recipe_spec("mixed_fp3_8", "lm_head", 2, 64, &ms) == TLLM_ERR_ARG, "unknown mode in a recipe accepted");

    /* 4. a group size that does not divide a row: that tensor stays unquantized, the rest quantize */
    q = (struct tllm_quantize_opts){.bits = 8, .group_size = 128, .sb_dtype = TLLM_DT_INVALID};
    out = path2(tmp, "g128");
    CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), out, &q) == TLLM_OK, "g128: %s", tllm_errmsg());
    CHECK(tllm_model_load(out, &mq) == TLLM_OK, "load g128: %s", tllm_errmsg());
    CHECK(mq->layers[0].wq.format == TLLM_WF_DENSE && mq->layers[0].w_down.format == TLLM_WF_AFFINE,
          "hidden 64 rows stay dense, down_proj (128 cols) quantizes");
    free(run(mq));
    tllm_model_free(mq);

    /* 5. refusals */
    q = (struct tllm_quantize_opts){.bits = 4, .group_size = 32, .sb_dtype = TLLM_DT_INVALID};
    CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), path2(tmp, "q4g32"), &q) == TLLM_ERR_IO &&
              strstr(tllm_errmsg(), "already exists and is not empty (use --force"),
          "existing OUT_DIR: %s", tllm_errmsg());
    q.force = 1;
    CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), path2(tmp, "q4g32"), &q) == TLLM_OK, "--force: %s", tllm_errmsg());
    CHECK(tllm_quantize_checkpoint(path2(models, "q4-g64"), path2(tmp, "x"), &q) == TLLM_ERR_ARG &&
              strstr(tllm_errmsg(), "already quantized"),
          "quantized input: %s", tllm_errmsg());
    CHECK(tllm_quantize_checkpoint("/nonexistent", path2(tmp, "y"), &q) == TLLM_ERR_IO &&
              strstr(tllm_errmsg(), "/nonexistent: cannot open model directory"),
          "missing input: %s", tllm_errmsg());
    q.bits = 7;
    CHECK(tllm_quantize_checkpoint(path2(models, "bf16"), path2(tmp, "z"), &q) == TLLM_ERR_ARG &&
              strstr(tllm_errmsg(), "bits=7 group_size=32 is not supported"),
          "bits 7: %s", tllm_errmsg());
    struct tllm_quant_spec sp;
    CHECK(tllm_mixed_recipe_spec("mixed_8_4", "lm_head", 2, 64, &sp) == TLLM_ERR_ARG, "bad recipe accepted");

    /* 6. synthetic checkpoints at a config's shapes load and run, quantized and dense */
    int bits_list[] = {4, 2, 8, 0};
    for (int i = 0; i < 4; i++) {
        struct tllm_synth_opts so = {.bits = bits_list[i], .group_size = 64, .seed = 7};
        char name[32];
        snprintf(name, sizeof name, "synth%d", bits_list[i]);
        out = path2(tmp, name);
        CHECK(tllm_synth_checkpoint(path2(path2(models, "q4-g64"), "config.json"), out, &so) == TLLM_OK, "synth: %s",
              tllm_errmsg());
        CHECK(tllm_model_load(out, &mq) == TLLM_OK, "load synth %d: %s", bits_list[i], tllm_errmsg());
        if (!mq) continue;
        float *l = run(mq);
        int finite = 1;
        for (int k = 0; k < mq->cfg.vocab_size; k++) finite &= isfinite(l[k]);
        CHECK(finite, "synth %d: logits not finite", bits_list[i]);
        CHECK(mq->embed.format == (bits_list[i] ? TLLM_WF_AFFINE : TLLM_WF_DENSE), "synth %d format", bits_list[i]);
        free(l);
        tllm_model_free(mq);
    }
    struct tllm_synth_opts so = {.bits = 4, .group_size = 64};
    CHECK(tllm_synth_checkpoint(path2(argv[2], "nonexistent.json"), path2(tmp, "s"), &so) == TLLM_ERR_IO, "missing config");
    /* every preset in configs/ parses */
    const char *presets[] = {"qwen2-0.5b.json", "qwen2.5-0.5b-instruct.json", "qwen2.5-1.5b-instruct.json",
                             "qwen2-7b-instruct.json"};
    for (int i = 0; i < 4; i++) {
        struct tllm_config cfg;
        CHECK(tllm_config_load(path2(argv[2], presets[i]), &cfg) == TLLM_OK, "preset %s: %s", presets[i], tllm_errmsg());
        tllm_config_free(&cfg);
    }

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_done();
}
