"""A real trained model end to end: Qwen2.5-Coder-0.5B-Instruct as llama.cpp's Q4_K_M GGUF
(scripts/fetch_model.sh qwen2.5-coder-0.5b; this test skips when it is absent).
  tokenizer  the file's own vocabulary gives tokenizer.json's ids on the whole tokenizer test corpus
  (a)  --exact logits of a ~100-token prompt against an independent float64 forward pass (numpy) over
       gguf-py's dequantization of the file: relative RMS <= 1e-4
  (b)  the default int8 path's logits within 1e-2 of it; greedy text equal for 16 tokens
  (c)  OpenCL (PoCL here) logits within 1e-3, float and int8 GEMMs, where a device is there
  (d)  perplexity of a real text (tests/data/text): int8 within 1% of --exact
  (e)  a chat answer to a coding question holds a `def`
  (f)  tllm serve -m FILE.gguf answers a chat rendered with the file's own template
  (g)  a batch file's chat line offering a tool gets the model's call back in "tool_calls", the call the
       server returns for the same request
(a) needs numpy and gguf (the test venv); the rest needs only tllm.
usage: real_model.py TLLM MODEL.gguf DATA_DIR"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

tllm, model, data = sys.argv[1], sys.argv[2], sys.argv[3]
if not os.path.exists(model):
    print(f"skipped: {model} is not there (scripts/fetch_model.sh qwen2.5-coder-0.5b fetches it)")
    sys.exit(77)
SANITIZED = bool(os.environ.get("TLLM_TEST_SANITIZED"))


def run(*args, timeout=1800, env=None):
    r = subprocess.run([tllm, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        print(f"tllm {' '.join(args[:3])}...: exit {r.returncode}: {r.stderr.strip()[-400:]}", file=sys.stderr)
    return r


def tokenize(model_arg, text):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    r = run("tokenize", "-m", model_arg, "--file", f.name)
    os.unlink(f.name)
    return json.loads(r.stdout) if r.returncode == 0 else None


def logits(ids, *extra):
    with tempfile.NamedTemporaryFile(suffix=".f32", delete=False) as f:
        out = f.name
    r = run("logits", "-m", model, "--ids", ",".join(map(str, ids)), "-o", out, *extra)
    raw = open(out, "rb").read() if r.returncode == 0 else None
    os.unlink(out)
    return raw


def rel_rms(a, b):
    import numpy as np
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


# ---- the tokenizer: the GGUF's vocabulary against tokenizer.json on the whole test corpus
tok_dir = os.path.join(data, "tokenizer")
corpus = [c["text"] for f in ("qwen2_tokenizer_integration.json", "tokenizer-edge-cases.json")
          for c in (lambda j: j["cases"] if isinstance(j, dict) else j)(json.load(open(os.path.join(tok_dir, f))))]
corpus += open(os.path.join(tok_dir, "ggml-vocab-qwen2.gguf.inp"), encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
    for t in corpus:
        f.write(json.dumps({"text": t}) + "\n")
    jl = f.name
a, b = run("tokenize", "-m", model, "--jsonl", jl), run("tokenize", "-m", tok_dir, "--jsonl", jl)
os.unlink(jl)
check(a.returncode == 0 and a.stdout == b.stdout and len(a.stdout.splitlines()) == len(corpus),
      f"the GGUF's tokenizer differs from tokenizer.json on the corpus ({len(corpus)} texts)")

# ---- a ~100-token real prompt
prompt = ("def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[len(arr) // 2]\n"
          "    left = [x for x in arr if x < pivot]\n    middle = [x for x in arr if x == pivot]\n"
          "    right = [x for x in arr if x > pivot]\n    return quicksort(left) + middle + quicksort(right)\n\n"
          "print(quicksort([3, 6, 8, 10, 1, 2, 1]))\n# The output is")
ids = tokenize(model, prompt)
check(ids is not None and 90 <= len(ids) <= 130, f"the prompt is {len(ids) if ids else None} tokens")

exact_raw, int8_raw = logits(ids, "--last"), logits(ids, "--last", "--int8")
try:
    import numpy as np
    have_np = True
except ImportError:
    have_np = False
    print("numpy is not there: the logits checks are skipped")

if have_np and exact_raw and int8_raw:
    exact, int8 = np.frombuffer(exact_raw, np.float32), np.frombuffer(int8_raw, np.float32)
    try:
        import gguf
        from gguf.quants import dequantize
    except ImportError:
        gguf = None
        print("gguf is not there: the float64 reference is skipped")
    if gguf is not None:
        # (a) an independent float64 Qwen2 forward pass on gguf-py's dequantization
        r = gguf.GGUFReader(model)
        W = {t.name: t for t in r.tensors}

        def w(name):
            t = W[name]
            return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(
                [int(d) for d in reversed(t.shape)])

        def key(k):
            return r.fields[k].contents()

        L, D = key("qwen2.block_count"), key("qwen2.embedding_length")
        H, KV = key("qwen2.attention.head_count"), key("qwen2.attention.head_count_kv")
        eps, theta, hd = key("qwen2.attention.layer_norm_rms_epsilon"), key("qwen2.rope.freq_base"), D // H
        n = len(ids)
        x = w("token_embd.weight")[ids]
        rms = lambda v, g: v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * g
        inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        rope = lambda v: v * cos[:, None, :] + np.concatenate([-v[..., hd // 2:], v[..., :hd // 2]], -1) * sin[:, None, :]
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(L):
            p = f"blk.{l}."
            h = rms(x, w(p + "attn_norm.weight"))
            q = (h @ w(p + "attn_q.weight").T + w(p + "attn_q.bias")).reshape(n, H, hd)
            k = (h @ w(p + "attn_k.weight").T + w(p + "attn_k.bias")).reshape(n, KV, hd)
            v = (h @ w(p + "attn_v.weight").T + w(p + "attn_v.bias")).reshape(n, KV, hd)
            q, k = rope(q), rope(k)
            k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", s, v).reshape(n, D)
            x = x + o @ w(p + "attn_output.weight").T
            h = rms(x, w(p + "ffn_norm.weight"))
            g = h @ w(p + "ffn_gate.weight").T
            x = x + ((g / (1 + np.exp(-g))) * (h @ w(p + "ffn_up.weight").T)) @ w(p + "ffn_down.weight").T
        last = rms(x[-1:], w("output_norm.weight"))
        out = w("output.weight") if "output.weight" in W else w("token_embd.weight")
        ref = (last @ out.T)[0]
        e = rel_rms(exact.astype(np.float64), ref)
        print(f"  (a) --exact vs the float64 reference: relative RMS {e:.2e}")
        check(e <= 1e-4, f"(a) --exact logits: relative RMS {e:.3e} > 1e-4")
        e8 = rel_rms(int8.astype(np.float64), ref)
        print(f"  (b) int8 vs the float64 reference: relative RMS {e8:.2e}")
        check(e8 <= 1e-2, f"(b) int8 logits: relative RMS {e8:.3e} > 1e-2")
    e8x = rel_rms(int8.astype(np.float64), exact.astype(np.float64))
    check(e8x <= 1e-2, f"(b) int8 vs --exact logits: relative RMS {e8x:.3e} > 1e-2")
    # (c) OpenCL, where a device is there
    dev = run("devices")
    if dev.returncode == 0 and "opencl:0" in dev.stdout and not SANITIZED:
        cl_raw = logits(ids, "--last", "--device", "opencl")
        check(cl_raw is not None, "(c) OpenCL logits failed")
        if cl_raw:
            ec = rel_rms(np.frombuffer(cl_raw, np.float32).astype(np.float64), exact.astype(np.float64))
            print(f"  (c) OpenCL vs --exact: relative RMS {ec:.2e}")
            check(ec <= 1e-3, f"(c) OpenCL logits: relative RMS {ec:.3e} > 1e-3")
        # and the device's int8 prompt GEMMs on the file's own mix (Q6_K's groups of 16 among them)
        cl8_raw = logits(ids, "--last", "--int8", "--device", "opencl")
        check(cl8_raw is not None, "(c) OpenCL int8 logits failed")
        if cl8_raw:
            e8 = rel_rms(np.frombuffer(cl8_raw, np.float32).astype(np.float64), exact.astype(np.float64))
            print(f"  (c) OpenCL int8 GEMMs vs --exact: relative RMS {e8:.2e}")
            check(e8 <= 1e-3, f"(c) OpenCL int8 logits: relative RMS {e8:.3e} > 1e-3")
    else:
        print("  (c) no OpenCL device (or a sanitized build): skipped")

# (b) greedy text: the default path and --exact agree on 16 tokens (not under the sanitizers: the float path's
# minutes there find nothing the rest does not)
if not SANITIZED:
    g1 = run("generate", "-m", model, "-p", prompt, "-n", "16", "--temp", "0")
    g2 = run("generate", "-m", model, "-p", prompt, "-n", "16", "--temp", "0", "--exact")
    check(g1.returncode == 0 and g1.stdout == g2.stdout and g1.stdout.strip(),
          f"(b) greedy text differs: {g1.stdout!r} vs {g2.stdout!r}")

# (d) perplexity of a real text: int8 within 1% of --exact
text = os.path.join(data, "text", "code.txt")
ppl = {}
for mode in () if SANITIZED else ("int8", "exact"):
    r = run("perplexity", "-m", model, "-f", text, "-c", "256", "--chunks", "3", *(["--exact"] if mode == "exact" else []))
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
    ppl[mode] = float(m.group(1)) if m else None
if not SANITIZED:
    print(f"  (d) perplexity of code.txt (3 x 256): int8 {ppl['int8']}, --exact {ppl['exact']}")
    check(ppl["int8"] and ppl["exact"] and abs(ppl["int8"] / ppl["exact"] - 1) <= 0.01 and ppl["exact"] < 20,
          f"(d) perplexity int8 {ppl['int8']} vs --exact {ppl['exact']}")

# (e) a chat answer to a coding question holds a def
q = "Write a Python function is_prime(n) that returns True when n is a prime number."
r = run("generate", "-m", model, "--chat", "-p", q, "-n", "120", "--temp", "0")
check(r.returncode == 0 and "def " in r.stdout, f"(e) the chat answer has no def: {r.stdout[:300]!r}")

# (g) a tool call from a batch file (the server's answer to the same chat is compared below)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "p.jsonl"), "w") as f:
        f.write(json.dumps({"id": "w", "messages": ASK, "tools": [WEATHER], "max_tokens": 64}) + "\n")
    r = run("generate", "-m", model, "--prompts", f.name, "-o", os.path.join(d, "o.jsonl"), "--temp", "0")
    rec = json.loads(open(os.path.join(d, "o.jsonl")).read()) if r.returncode == 0 else {}
calls = rec.get("tool_calls") or []
batch_call = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
check(rec.get("finish_reason") == "tool_calls" and batch_call == [("get_weather", {"city": "Paris"})],
      f"(g) the batch line's tool call: {rec}")

# (f) tllm serve -m FILE.gguf: a chat rendered with the file's own template
from serve_util import Server  # noqa: E402
srv = Server(tllm, model)
try:
    st, ans = srv.post("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "max_tokens": 64, "temperature": 0})
    m = ans["choices"][0]["message"] if st == 200 else {}
    srv_call = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []]
    check(srv_call == batch_call and m.get("content") is None and not rec.get("text"),
          f"(g) the server's call for the same chat: {ans} vs the batch's {rec}")
    st, ans = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": q}], "max_tokens": 120,
                                                 "temperature": 0})
    content = ans["choices"][0]["message"]["content"] if st == 200 else ""
    check(st == 200 and "def " in content, f"(f) serve: {st} {str(ans)[:300]}")
    check(st == 200 and ans["usage"]["prompt_tokens"] > 20, f"(f) the prompt was not the template's: {ans}")
finally:
    srv.p.terminate()
    srv.p.wait(timeout=60)
finish()
