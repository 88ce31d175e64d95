#!/usr/bin/env python3
"""Write a Qwen2 GGUF file out as a Hugging Face checkpoint of float32 weights (gguf-py's dequantization,
exact): config.json, model.safetensors, tokenizer.json and tokenizer_config.json (the file's own
vocabulary and chat template). For `tllm quantize` into another layout, and for comparing a GGUF with its
requantizations (docs/performance.md's quality table). tllm itself runs the GGUF directly.
Needs numpy and gguf (pip install numpy gguf).
usage: gguf_to_hf.py FILE.gguf OUT_DIR"""
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
r = gguf.GGUFReader(src)
f = {k: v for k, v in r.fields.items()}


def val(key, default=None):
    return f[key].contents() if key in f else default


arch = val("general.architecture")
if arch != "qwen2":
    sys.exit(f"gguf_to_hf: {src}: general.architecture {arch!r}: only qwen2")
names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
         "output.weight": "lm_head.weight"}
per_layer = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}


def hf_name(n):
    if n in names:
        return names[n]
    _, layer, rest = n.split(".", 2)
    for k, v in per_layer.items():
        if rest == k or rest.startswith(k + "."):
            return f"model.layers.{layer}.{v}{rest[len(k):]}"
    sys.exit(f"gguf_to_hf: tensor {n!r} has no Hugging Face name")


header, chunks, offset = {}, [], 0
for t in r.tensors:
    a = np.ascontiguousarray(np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        [int(d) for d in reversed(t.shape)]))
    b = a.tobytes()
    header[hf_name(t.name)] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
    chunks.append(b)
    offset += len(b)
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((-len(h)) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as fo:
    fo.write(struct.pack("<Q", len(h)) + h)
    for b in chunks:
        fo.write(b)

emb = next(t for t in r.tensors if t.name == "token_embd.weight")
D, H = val("qwen2.embedding_length"), val("qwen2.attention.head_count")
cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": D,
       "num_hidden_layers": val("qwen2.block_count"), "num_attention_heads": H,
       "num_key_value_heads": val("qwen2.attention.head_count_kv", H),
       "intermediate_size": val("qwen2.feed_forward_length"), "vocab_size": int(emb.shape[1]),
       "max_position_embeddings": val("qwen2.context_length", 32768),
       "rms_norm_eps": float(val("qwen2.attention.layer_norm_rms_epsilon", 1e-6)),
       "rope_theta": float(val("qwen2.rope.freq_base", 10000.0)),
       "tie_word_embeddings": not any(t.name == "output.weight" for t in r.tensors),
       "bos_token_id": val("tokenizer.ggml.bos_token_id"), "eos_token_id": val("tokenizer.ggml.eos_token_id"),
       "torch_dtype": "float32"}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)

if "tokenizer.ggml.tokens" in f:
    if val("tokenizer.ggml.pre") not in ("qwen2", "deepseek-r1-qwen"):
        sys.exit(f"gguf_to_hf: tokenizer.ggml.pre {val('tokenizer.ggml.pre')!r}: only qwen2's is written")
    tokens, types = val("tokenizer.ggml.tokens"), val("tokenizer.ggml.token_type")
    vocab = {tok: i for i, (tok, ty) in enumerate(zip(tokens, types)) if ty == 1}
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": ty == 3} for i, (tok, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]
    regex = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tj = {"version": "1.0", "added_tokens": added, "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}, bl]},
          "decoder": bl, "model": {"type": "BPE", "vocab": vocab, "merges": [m.split(" ", 1) for m in val("tokenizer.ggml.merges")],
                                   "ignore_merges": False, "byte_fallback": False}}
    json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
    tc = {"model_max_length": cfg["max_position_embeddings"]}
    if "tokenizer.chat_template" in f:
        tc["chat_template"] = val("tokenizer.chat_template")
    json.dump(tc, open(os.path.join(out, "tokenizer_config.json"), "w"), ensure_ascii=False, indent=1)
print(f"gguf_to_hf: {out}: {len(header)} float32 tensors ({offset / 2**20:.0f} MiB)")
