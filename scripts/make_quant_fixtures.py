#!/usr/bin/env python3
"""Make the quantized-format fixtures in tests/data (not run by the tests; the output is committed).

  python3 scripts/make_quant_fixtures.py tests/data

Needs, in a virtual environment: mlx[cpu] (the real mlx.core.quantize / dequantize), numpy,
torch and transformers (the reference logits). From tests/data/models/bf16 (random weights, made by
transformers) it writes:

  mlx-quantize-modes.safetensors  source matrices, mlx.core.quantize's output and mlx.core.dequantize's
                                  (float32) for affine 1/3/5/6 bits and mxfp4 / nvfp4 / mxfp8
  models/<name>/                  checkpoints in each format with reference/reference.json and
                                  reference/logits.f32, the layout of the other small fixtures

The mlx models are quantized by mlx.core.quantize per module, as mlx-lm does (embedding included,
config.json "quantization" with "mode" and per-module overrides). The GPTQ and AWQ models are
quantized by round-to-nearest per group (the packing is what the loader must get right, not the
rounding search) and packed as their published code does: GPTQ (AutoGPTQ / GPTQModel "gptq" format)
packs codes along the input, zero points along the output, stored minus one; act-order's g_idx gives
each input its group. AWQ (AutoAWQ GEMM) packs along the output in the nibble order 0 2 4 6 1 3 5 7.
References: transformers Qwen2ForCausalLM, float32, eager attention, on the dequantized weights.
"""
import json
import os
import shutil
import sys

import mlx.core as mx
import numpy as np

SRC = "models/bf16"


def load_src(data):
    return mx.load(os.path.join(data, SRC, "model.safetensors"))


def mlx_quantize(w, mode, bits, gs):
    """mlx.core.quantize's arrays, and mlx.core.dequantize's float32 values (affine scales and biases
    widened first, so the values are scale * q + bias exactly as tllm computes them)."""
    q = mx.quantize(w, group_size=gs, bits=bits, mode=mode)
    if mode == "affine":
        d = mx.dequantize(q[0], q[1].astype(mx.float32), q[2].astype(mx.float32), group_size=gs, bits=bits, mode=mode,
                          dtype=mx.float32)
    else:
        d = mx.dequantize(q[0], q[1], group_size=gs, bits=bits, mode=mode, dtype=mx.float32)
    return q, d


def quant_vectors(data):
    rng = np.random.default_rng(7)
    out = {}
    dts = [mx.bfloat16, mx.float16, mx.float32]
    cases = [("affine", b, g) for b in (1, 3, 5, 6) for g in (32, 64, 128)]
    cases += [(m, b, g) for m, b, g in (("mxfp4", 4, 32), ("nvfp4", 4, 16), ("mxfp8", 8, 32)) for _ in range(3)]
    for i, (mode, bits, gs) in enumerate(cases):
        dt = dts[i % 3]
        x = rng.standard_normal((8, 256)).astype(np.float32) * 0.05
        x[0, :16] = 0.0                      # an all-zero group
        x[1, 5] = 3.0                        # an outlier
        x[2, :] *= 1e-6                      # tiny values (subnormal scales)
        x[3, 40:48] = 448.0 * 2              # beyond fp8's range before the scale
        src = mx.array(x).astype(dt)
        name = f"{mode}_b{bits}_g{gs}_{str(dt).split('.')[-1]}"
        q, deq = mlx_quantize(src, mode, bits, gs)
        out[name + ".source"] = src
        out[name + ".weight"] = q[0]
        out[name + ".scales"] = q[1]
        if mode == "affine":
            out[name + ".biases"] = q[2]
        out[name + ".dequant"] = deq
    mx.save_safetensors(os.path.join(data, "mlx-quantize-modes.safetensors"), out)
    print("mlx-quantize-modes.safetensors:", len(cases), "cases")


LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def modules(cfg):
    ms = ["model.embed_tokens"]
    for l in range(cfg["num_hidden_layers"]):
        ms += [f"model.layers.{l}.{n}" for n in LINEARS]
    return ms


def mlx_model(src, cfg, default, overrides):
    """default / overrides: (mode, bits, group) or False. Returns (tensors, dequantized float32, quantization)."""
    tensors, deq = dict(src), {k: np.array(v.astype(mx.float32)) for k, v in src.items()}
    quant = {"group_size": default[2], "bits": default[1], "mode": default[0]}
    for m in modules(cfg):
        spec = overrides.get(m, default)
        if m in overrides:
            quant[m] = False if spec is False else {"group_size": spec[2], "bits": spec[1], "mode": spec[0]}
        if spec is False:
            continue
        mode, bits, gs = spec
        w = src[m + ".weight"]
        q, d = mlx_quantize(w, mode, bits, gs)
        del tensors[m + ".weight"]
        tensors[m + ".weight"], tensors[m + ".scales"] = q[0], q[1]
        if mode == "affine":
            tensors[m + ".biases"] = q[2]
        deq[m + ".weight"] = np.array(d)
    return tensors, deq, quant


def rtn(w, gs, bits, g_idx):
    """Round-to-nearest asymmetric per group (groups by g_idx): codes [out, in], scales f16 [ng, out], zeros [ng, out]."""
    out_f, in_f = w.shape
    ng = in_f // gs
    scales = np.zeros((ng, out_f), np.float16)
    zeros = np.zeros((ng, out_f), np.int64)
    codes = np.zeros((out_f, in_f), np.int64)
    qmax = 2 ** bits - 1
    for g in range(ng):
        cols = np.nonzero(g_idx == g)[0]
        wg = w[:, cols]
        lo, hi = np.minimum(wg.min(1), 0), np.maximum(wg.max(1), 0)
        s = ((hi - lo) / qmax).astype(np.float16)
        s[s == 0] = np.float16(1e-4)
        z = np.clip(np.round(-lo / s.astype(np.float32)), 0, qmax).astype(np.int64)
        codes[:, cols] = np.clip(np.round(wg / s.astype(np.float32)[:, None]) + z[:, None], 0, qmax)
        scales[g], zeros[g] = s, z
    deq = np.zeros_like(w)
    for i in range(in_f):
        g = g_idx[i]
        deq[:, i] = scales[g].astype(np.float32) * (codes[:, i] - zeros[g]).astype(np.float32)
    return codes, scales, zeros, deq


def pack_along(vals, bits, axis):
    """Pack non-negative ints along `axis`, lowest bits first, 32/bits to an int32."""
    per = 32 // bits
    v = np.moveaxis(vals.astype(np.uint32), axis, 0)
    v = v.reshape(v.shape[0] // per, per, *v.shape[1:])
    out = np.zeros((v.shape[0], *v.shape[2:]), np.uint32)
    for j in range(per):
        out |= v[:, j] << np.uint32(bits * j)
    return np.moveaxis(out, 0, axis).view(np.int32)


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack_awq(vals):
    """[rows, out] 4-bit values packed along out, word nibble j holding output AWQ_ORDER[j] of its 8."""
    r, o = vals.shape
    v = vals.astype(np.uint32).reshape(r, o // 8, 8)
    out = np.zeros((r, o // 8), np.uint32)
    for j in range(8):
        out |= v[:, :, AWQ_ORDER[j]] << np.uint32(4 * j)
    return out.view(np.int32)


def int_model(src, cfg, method, bits, gs, act_order, seed=3):
    rng = np.random.default_rng(seed)
    tensors, deq = dict(src), {k: np.array(v.astype(mx.float32)) for k, v in src.items()}
    for m in modules(cfg)[1:]:  # GPTQ and AWQ leave the embedding (and lm_head) unquantized
        w = deq[m + ".weight"]
        in_f = w.shape[1]
        if act_order:
            order = rng.permutation(in_f)
            g_idx = np.zeros(in_f, np.int64)
            g_idx[order] = np.arange(in_f) // gs
        else:
            g_idx = np.arange(in_f) // gs
        codes, scales, zeros, d = rtn(w, gs, bits, g_idx)
        del tensors[m + ".weight"]
        if method == "gptq":
            tensors[m + ".qweight"] = mx.array(pack_along(codes.T, bits, 0))
            tensors[m + ".qzeros"] = mx.array(pack_along(zeros - 1, bits, 1))  # the "gptq" format's minus one
            tensors[m + ".g_idx"] = mx.array(g_idx.astype(np.int32))
        else:
            tensors[m + ".qweight"] = mx.array(pack_awq(codes.T))
            tensors[m + ".qzeros"] = mx.array(pack_awq(zeros))
        tensors[m + ".scales"] = mx.array(scales)
        deq[m + ".weight"] = d
    if method == "gptq":
        qc = {"quant_method": "gptq", "bits": bits, "group_size": gs, "desc_act": act_order, "sym": False,
              "static_groups": False, "true_sequential": True, "damp_percent": 0.01, "checkpoint_format": "gptq"}
    else:
        qc = {"quant_method": "awq", "bits": bits, "group_size": gs, "version": "gemm", "zero_point": True,
              "modules_to_not_convert": None}
    return tensors, deq, qc


def reference(data, name, cfg, deq, ref_src):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    hf = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    hf["torch_dtype"] = "float32"
    conf = Qwen2Config(**hf)
    conf._attn_implementation = "eager"
    model = Qwen2ForCausalLM(conf).eval()
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in deq.items()}
    if cfg.get("tie_word_embeddings", True):
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    prompt = ref_src["prompt_ids"]
    n_gen = len(ref_src["greedy_ids"])
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(ids, max_new_tokens=n_gen, do_sample=False, min_new_tokens=n_gen, eos_token_id=None,
                             pad_token_id=0)
        seq = out[0].tolist()
        logits = model(torch.tensor([seq])).logits[0].float().numpy()
    greedy = seq[len(prompt):]
    rows = [r for r in ref_src["logits_rows"] if r < len(seq) - 1]
    top16, top16_logits, margins = [], [], []
    for p in range(len(seq) - 1):
        o = np.argsort(-logits[p], kind="stable")[:16]
        top16.append([int(i) for i in o])
        top16_logits.append([float(logits[p][i]) for i in o])
        margins.append(float(logits[p][o[0]] - logits[p][o[1]]))
    tf_agrees = all(int(np.argmax(logits[p])) == seq[p + 1] for p in range(len(prompt) - 1, len(seq) - 1))
    d = os.path.join(data, "models", name, "reference")
    os.makedirs(d, exist_ok=True)
    logits[rows].astype("<f4").tofile(os.path.join(d, "logits.f32"))
    ref = {"description": "Hugging Face transformers Qwen2ForCausalLM, float32, eager attention, on the dequantized "
                          "weights of this checkpoint (scripts/make_quant_fixtures.py)",
           "prompt_text": None, "prompt_ids": prompt, "greedy_ids": greedy, "greedy_text": None, "sequence": seq,
           "logits_file": "logits.f32", "logits_rows": rows, "logits_shape": [len(rows), cfg["vocab_size"]],
           "logits_positions": ref_src["logits_positions"], "top16": top16, "top16_logits": top16_logits,
           "margins": margins, "teacher_forced_greedy_agrees": tf_agrees, "chat_messages": None}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)


def write_model(data, name, cfg, tensors, deq, ref_src, fmt_meta):
    d = os.path.join(data, "models", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shutil.copy(os.path.join(data, SRC, "generation_config.json"), d)
    mx.save_safetensors(os.path.join(d, "model.safetensors"), tensors, metadata={"format": fmt_meta})
    reference(data, name, cfg, deq, ref_src)
    print(name, "written")


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
    quant_vectors(data)
    src = load_src(data)
    with open(os.path.join(data, SRC, "config.json")) as f:
        base = json.load(f)
    with open(os.path.join(data, SRC, "reference", "reference.json")) as f:
        ref_src = json.load(f)
    L0, L1 = "model.layers.0.", "model.layers.1."
    mlx_cases = {
        # affine at the widths whose codes straddle words, and 1 bit
        "affine-3-5-6": (("affine", 3, 32), {L0 + "mlp.down_proj": ("affine", 5, 64), L1 + "self_attn.q_proj": ("affine", 6, 32),
                                             L1 + "mlp.up_proj": ("affine", 6, 64), L1 + "self_attn.v_proj": ("affine", 1, 32)}),
        "mxfp4": (("mxfp4", 4, 32), {}),
        "nvfp4": (("nvfp4", 4, 16), {}),
        "mxfp8": (("mxfp8", 8, 32), {}),
        # modes mixed per module, one left unquantized
        "mixed-modes": (("mxfp4", 4, 32), {L0 + "self_attn.k_proj": ("nvfp4", 4, 16), L0 + "mlp.down_proj": ("mxfp8", 8, 32),
                                           L1 + "mlp.gate_proj": ("affine", 5, 32), L1 + "self_attn.o_proj": False,
                                           "model.embed_tokens": ("affine", 8, 64)}),
    }
    for name, (default, ov) in mlx_cases.items():
        tensors, deq, quant = mlx_model(src, base, default, ov)
        cfg = dict(base, quantization=quant, quantization_config=quant)
        write_model(data, name, cfg, tensors, deq, ref_src, "mlx")
    int_cases = {
        "gptq-int4": ("gptq", 4, 32, False),
        "gptq-int8-act-order": ("gptq", 8, 32, True),
        "gptq-int4-act-order": ("gptq", 4, 64, True),
        "awq-int4": ("awq", 4, 32, False),
    }
    for name, (method, bits, gs, act) in int_cases.items():
        tensors, deq, qc = int_model(src, base, method, bits, gs, act)
        cfg = dict(base, quantization_config=qc)
        write_model(data, name, cfg, tensors, deq, ref_src, "pt")


if __name__ == "__main__":
    main()
