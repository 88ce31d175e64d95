#!/usr/bin/env python3
"""Train tllm's demo model: a small Qwen2ForCausalLM that answers questions about manual pages.

Input: the dataset of scripts/man_dataset.py (train.jsonl, eval.jsonl: token ids of the Qwen2.5
tokenizer + the assistant spans that carry the loss). Output (--out): a bf16 Hugging Face checkpoint
(config.json, model.safetensors, generation_config.json) and train_log.json with the losses.

The model has the real Qwen2.5 vocabulary (151936, tied embeddings) and a small body, so that its
4-bit MLX-layout checkpoint is under 25 MB. Everything is seeded (data order, init, dropout-free
training); the number of steps is fixed by --epochs, not by the clock, so a run is repeatable.
It runs in a few minutes on one H100/H200 (bf16 autocast, fused AdamW, SDPA attention).

usage: python3 scripts/train_demo_model.py --data build/mandemo --out OUT [--epochs 12]
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

PAD_ID = 151643  # <|endoftext|>
IM_END = 151645


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            rows.append((r["ids"], r["spans"]))
    return rows


def batches(rows, tokens_per_batch, rng):
    """Length-bucketed batches of about tokens_per_batch padded tokens, in a seeded random order."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i][0]), rng.random()))
    out, cur, cur_max = [], [], 0
    for i in order:
        n = len(rows[i][0])
        if cur and max(cur_max, n) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(rows, idx, device):
    T = max(len(rows[i][0]) for i in idx)
    ids = torch.full((len(idx), T), PAD_ID, dtype=torch.long)
    labels = torch.full((len(idx), T), -100, dtype=torch.long)
    for b, i in enumerate(idx):
        seq, spans = rows[i]
        ids[b, : len(seq)] = torch.tensor(seq)
        for s, e in spans:  # position t predicts token t+1
            labels[b, s - 1 : e - 1] = torch.tensor(seq[s:e])
    return ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def loss_of(model, ids, labels):
    """Mean cross-entropy over the answer tokens; logits only where there is a label (the tied
    151936-row head is most of the compute)."""
    h = model.model(input_ids=ids).last_hidden_state
    mask = labels != -100
    logits = F.linear(h[mask], model.lm_head.weight)
    return F.cross_entropy(logits.float(), labels[mask], reduction="sum"), int(mask.sum())


@torch.no_grad()
def evaluate(model, rows, device, tokens_per_batch=65536):
    model.eval()
    tot, n = 0.0, 0
    for idx in batches(rows, tokens_per_batch, random.Random(0)):
        ids, labels = collate(rows, idx, device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            l, k = loss_of(model, ids, labels)
        tot += float(l)
        n += k
    model.train()
    return tot / max(n, 1)


@torch.no_grad()
def fake_quantize_(model, bits=4, group=64):
    """Round every linear and the embedding as `tllm quantize` (MLX affine, bf16 scales/biases) does,
    in place, so the 4-bit model's held-out loss can be reported next to the bf16 one."""
    n_bins = float((1 << bits) - 1)
    for name, p in model.named_parameters():
        if p.dim() != 2 or p.shape[1] % group:
            continue
        w = p.float().reshape(-1, group)
        mx, mn = w.max(1, keepdim=True).values, w.min(1, keepdim=True).values
        min_is_edge = mn.abs() > mx.abs()
        scale = torch.clamp((mx - mn) / n_bins, min=1e-7)
        scale = torch.where(min_is_edge, scale, -scale)
        edge = torch.where(min_is_edge, mn, mx)
        q0 = torch.round(edge / scale)
        nz = q0 != 0
        scale = torch.where(nz, edge / torch.where(nz, q0, torch.ones_like(q0)), scale)
        bias = torch.where(nz, edge, torch.zeros_like(edge))
        scale, bias = scale.bfloat16().float(), bias.bfloat16().float()
        q = torch.clamp(torch.round((w - bias) / scale), 0, n_bins)
        p.copy_((q * scale + bias).reshape(p.shape).to(p.dtype))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="build/mandemo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=float, default=12)
    ap.add_argument("--tokens-per-batch", type=int, default=32768)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--intermediate", type=int, default=768)
    args = ap.parse_args()

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    device = "cuda"

    train, held = load(os.path.join(args.data, "train.jsonl")), load(os.path.join(args.data, "eval.jsonl"))
    seen = random.Random(args.seed).sample(train, min(len(held), len(train)))
    ntok = sum(len(r[0]) for r in train)
    print(f"train: {len(train)} conversations, {ntok} tokens; held out: {len(held)} conversations", flush=True)

    cfg = Qwen2Config(vocab_size=151936, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=4096,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      bos_token_id=PAD_ID, eos_token_id=IM_END, hidden_act="silu", use_sliding_window=False,
                      sliding_window=None, max_window_layers=args.layers, attention_dropout=0.0,
                      initializer_range=0.02)
    cfg._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.1f}M parameters ({model.model.embed_tokens.weight.numel() / 1e6:.1f}M in "
          f"the tied embedding)", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    rng = random.Random(args.seed)
    steps_per_epoch = len(batches(train, args.tokens_per_batch, random.Random(0)))
    total = int(math.ceil(steps_per_epoch * args.epochs))
    warm = max(1, min(200, total // 20))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))))
    print(f"{total} steps ({steps_per_epoch} per epoch, ~{args.tokens_per_batch} tokens per batch)", flush=True)

    log = {"epochs": [], "args": vars(args), "params": n_params}
    t0, step, epoch = time.time(), 0, 0
    while step < total:
        epoch += 1
        tr, ntr = 0.0, 0
        for idx in batches(train, args.tokens_per_batch, rng):
            if step >= total:
                break
            ids, labels = collate(train, idx, device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                l, k = loss_of(model, ids, labels)
            (l / k).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            tr += float(l.detach())
            ntr += k
            step += 1
        e = {"epoch": epoch, "step": step, "train_loss": tr / max(ntr, 1), "heldout_loss": evaluate(model, held, device),
             "seconds": round(time.time() - t0, 1)}
        log["epochs"].append(e)
        print(json.dumps(e), flush=True)

    log["final"] = {"seen_loss": evaluate(model, seen, device), "heldout_loss": evaluate(model, held, device),
                    "train_seconds": round(time.time() - t0, 1),
                    "tokens_per_second": round(ntok * args.epochs / (time.time() - t0))}
    os.makedirs(args.out, exist_ok=True)
    model.config.torch_dtype = torch.bfloat16
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(bos_token_id=PAD_ID, eos_token_id=[IM_END, PAD_ID], pad_token_id=PAD_ID,
                     do_sample=False).save_pretrained(args.out)
    model.float()
    fake_quantize_(model)
    log["final"]["heldout_loss_4bit"] = evaluate(model, held, device)
    log["final"]["seen_loss_4bit"] = evaluate(model, seen, device)
    json.dump(log, open(os.path.join(args.out, "train_log.json"), "w"), indent=2)
    print("final: " + json.dumps(log["final"]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
