#!/usr/bin/env python3
"""Write a GGUF file of random weights at a real Qwen2 model's shapes (configs/*.json), with the tensor
types llama.cpp's Q4_K_M gives that model: the GGUF counterpart of `tllm synth`, for benchmarks of GGUF
files as loaded (their speed does not depend on the values). Needs numpy only (the format is written
here with struct: header, keys, tensor infos, aligned data).

Q4_K_M's types, as llama-quantize picks them: Q4_K for every matrix, except attn_v and ffn_down in the
"more bits" layers (the first and last eighth and every third between) and output: Q6_K; token_embd
Q4_K. A matrix whose rows are not whole 256-element super-blocks falls back: Q4_K to Q5_0, Q6_K to Q8_0
(Qwen2.5-0.5B's 896-wide rows: its real Q4_K_M file holds 133 Q5_0, 13 Q8_0, 12 Q6_K, 12 Q4_K).
--type T writes every matrix as T instead (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K F16).

usage: synth_gguf.py --config configs/qwen2.5-0.5b-instruct.json --out FILE.gguf [--type T] [--seed N]"""
import argparse
import json
import struct

import numpy as np

TYPES = {  # ggml type: (id, block, bytes, offsets of its float16 scale fields)
    "F32": (0, 1, 4, ()), "F16": (1, 1, 2, ()), "Q4_0": (2, 32, 18, (0,)), "Q4_1": (3, 32, 20, (0, 2)),
    "Q5_0": (6, 32, 22, (0,)), "Q5_1": (7, 32, 24, (0, 2)), "Q8_0": (8, 32, 34, (0,)), "Q2_K": (10, 256, 84, (80, 82)),
    "Q3_K": (11, 256, 110, (108,)), "Q4_K": (12, 256, 144, (0, 2)), "Q5_K": (13, 256, 176, (0, 2)),
    "Q6_K": (14, 256, 210, (208,)),
}
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q5_K": "Q5_1"}


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    fmt = {4: "<I", 6: "<f", 7: "<?"}
    out = s(key) + struct.pack("<I", vtype)
    return out + (s(value) if vtype == 8 else struct.pack(fmt[vtype], value))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", default=None, choices=sorted(TYPES))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    c = json.load(open(a.config))
    rng = np.random.default_rng(a.seed)
    D, L, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    KV, F, V = c.get("num_key_value_heads", H), c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim", D // H)
    tied = c.get("tie_word_embeddings", False)
    more = lambda i: i < L // 8 or i >= 7 * L // 8 or (i - L // 8) % 3 == 2

    tensors = []  # (name, type, ne0, ne1) ; ne1 = 0 for vectors

    def mat(name, t, cols, rows):
        t = a.type or t
        if TYPES[t][1] > 1 and cols % TYPES[t][1]:
            t = FALLBACK.get(t, t)
        tensors.append((name, t, cols, rows))

    mat("token_embd.weight", "Q4_K", D, V)
    for i in range(L):
        p = f"blk.{i}."
        for n, d in (("attn_norm.weight", D), ("ffn_norm.weight", D), ("attn_q.bias", H * hd), ("attn_k.bias", KV * hd),
                     ("attn_v.bias", KV * hd)):
            tensors.append((p + n, "F32", d, 0))
        mat(p + "attn_q.weight", "Q4_K", D, H * hd)
        mat(p + "attn_k.weight", "Q4_K", D, KV * hd)
        mat(p + "attn_v.weight", "Q6_K" if more(i) else "Q4_K", D, KV * hd)
        mat(p + "attn_output.weight", "Q4_K", H * hd, D)
        mat(p + "ffn_gate.weight", "Q4_K", D, F)
        mat(p + "ffn_up.weight", "Q4_K", D, F)
        mat(p + "ffn_down.weight", "Q6_K" if more(i) else "Q4_K", F, D)
    tensors.append(("output_norm.weight", "F32", D, 0))
    if not tied:
        mat("output.weight", "Q6_K", D, V)

    keys = [kv("general.architecture", 8, "qwen2"), kv("general.name", 8, "tllm synth " + a.config),
            kv("qwen2.block_count", 4, L), kv("qwen2.context_length", 4, c.get("max_position_embeddings", 32768)),
            kv("qwen2.embedding_length", 4, D), kv("qwen2.feed_forward_length", 4, F),
            kv("qwen2.attention.head_count", 4, H), kv("qwen2.attention.head_count_kv", 4, KV),
            kv("qwen2.rope.freq_base", 6, float(c.get("rope_theta", 1e6))),
            kv("qwen2.attention.layer_norm_rms_epsilon", 6, float(c.get("rms_norm_eps", 1e-6)))]
    align = 32
    infos, offset, sizes = [], 0, []
    for name, t, ne0, ne1 in tensors:
        tid, block, size, _ = TYPES[t]
        dims = [ne0] if ne1 == 0 else [ne0, ne1]
        nbytes = (ne0 * max(ne1, 1)) // block * size
        infos.append(s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) +
                     struct.pack("<IQ", tid, offset))
        sizes.append(nbytes)
        offset += (nbytes + align - 1) // align * align
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(keys)) + b"".join(keys) + b"".join(infos)
    with open(a.out, "wb") as f:
        f.write(head + b"\0" * ((-len(head)) % align))
        for (name, t, ne0, ne1), nbytes in zip(tensors, sizes):
            tid, block, size, scales = TYPES[t]
            if t == "F32":
                v = np.ones(ne0, np.float32) if name.endswith("norm.weight") else np.zeros(ne0, np.float32)
                raw = v.tobytes()
            elif t == "F16":
                raw = (rng.standard_normal(ne0 * ne1) * 0.02).astype(np.float16).tobytes()
            else:
                blocks = rng.integers(0, 256, (nbytes // size, size), dtype=np.uint8)
                for o in scales:  # small finite scales: the forward pass stays finite
                    blocks[:, o:o + 2] = (rng.uniform(2e-4, 1e-3, (nbytes // size, 1))).astype(np.float16).view(np.uint8)
                raw = blocks.tobytes()
            f.write(raw + b"\0" * ((-nbytes) % align))
    counts = {}
    for _, t, _, ne1 in tensors:
        counts[t] = counts.get(t, 0) + 1
    print(f"synth_gguf: {a.out}: {len(tensors)} tensors " + ", ".join(f"{n} {t}" for t, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
