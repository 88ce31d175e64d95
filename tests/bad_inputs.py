#!/usr/bin/env python3
"""The bad-input suite: every kind of bad input the engine reads gets exactly one line on stderr that
names the problem and the file, the exit status says whether the command could proceed, nothing
crashes, and no output file is left looking complete.

Each case builds its bad input in a temporary folder (from tests/data and the bundled demo model),
runs the tllm binary and compares stderr with the exact expected line ({T} stands for the temporary
folder, {D} for tests/data, {M} for the demo model). Under the ASan build the same runs prove there
is no memory error or leak on these paths.

usage: bad_inputs.py TLLM_BINARY TESTS_DATA DEMO_MODEL [--print]   (--print: show what each case gives)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

TLLM, DATA, DEMO = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
PRINT = "--print" in sys.argv
T = tempfile.mkdtemp(prefix="tllm-bad-")
failures = []


def copy_model(name, src=None):
    dst = os.path.join(T, name)
    shutil.copytree(src or os.path.join(DATA, "models", "q4-g64"), dst)
    return dst


def edit_config(d, fn):
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    fn(c)
    json.dump(c, open(p, "w"))


def header(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8 : 8 + n]), 8 + n


def patch_tensor(d, tensor, at, data):
    """Overwrite bytes [at, at + len(data)) of a tensor's data in d/model.safetensors."""
    st = os.path.join(d, "model.safetensors")
    h, base = header(st)
    off = base + h[tensor]["data_offsets"][0] + at
    b = bytearray(open(st, "rb").read())
    b[off : off + len(data)] = data
    put(st, bytes(b), "wb")


def put(path, data, mode="w"):
    with open(path, mode) as f:
        f.write(data)
    return path


def run(args, stdin=None, timeout=300, extra_env=None):
    env = dict(os.environ)
    env.pop("TLLM_MODEL", None)
    env.update(extra_env or {})
    return subprocess.run([TLLM] + args, capture_output=True, env=env, input=stdin, timeout=timeout)


def case(name, args, want_rc, want_err, no_file=None, stdout_has=None, extra_env=None):
    r = run(args, extra_env=extra_env)
    err = r.stderr.decode("utf-8", "replace")
    want = want_err.format(T=T, D=DATA, M=DEMO)
    lines = [l for l in err.splitlines() if l]
    if PRINT:
        print(f"{name}: rc={r.returncode}\n    {err.strip()}")
    problems = []
    if r.returncode != want_rc:
        problems.append(f"exit {r.returncode}, want {want_rc}")
    if r.returncode < 0 or r.returncode >= 128:
        problems.append("crashed")
    if want not in lines:
        problems.append(f"stderr {err!r} lacks the line {want!r}")
    if len([l for l in lines if l.startswith("tllm: ") and l != want]) > 0 and want_rc != 0:
        problems.append(f"more than the one error line: {err!r}")
    if no_file and os.path.exists(no_file.format(T=T)):
        problems.append(f"left {no_file.format(T=T)} behind")
    if stdout_has and stdout_has not in r.stdout.decode("utf-8", "replace"):
        problems.append(f"stdout {r.stdout[:300]!r} lacks {stdout_has!r}")
    if problems:
        failures.append(name)
        print(f"FAIL {name}: " + "; ".join(problems))
    else:
        print(f"ok   {name}: {want}")


IDS = ["--prompt-ids", "1,2,3", "-n", "2"]

# ---- checkpoint files ----
d = copy_model("truncated")
st = os.path.join(d, "model.safetensors")
b = open(st, "rb").read()
put(st, b[: len(b) // 2], "wb")
case("truncated file", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/truncated/model.safetensors: tensor 'model.embed_tokens.weight': data_offsets [0, 262144] run past the end of the data (256320 bytes; file truncated?)")

d = copy_model("zero")
put(os.path.join(d, "model.safetensors"), b"", "wb")
case("zero-length file", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/zero/model.safetensors: file is truncated (0 bytes; a safetensors file starts with an 8-byte header length)")

d = copy_model("dir-not-file")
os.unlink(os.path.join(d, "model.safetensors"))
os.mkdir(os.path.join(d, "model.safetensors"))
case("directory instead of file", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/dir-not-file/model.safetensors: not a regular file")

case("file instead of directory", ["generate", "-m", os.path.join(DATA, "models", "q4-g64", "config.json")] + IDS, 1,
     "tllm: {D}/models/q4-g64/config.json: not a directory (a model is a directory with config.json and safetensors files)")

d = copy_model("missing-shard", os.path.join(DATA, "models", "gqa7-hd64-sharded"))
os.unlink(os.path.join(d, "model-00002-of-00003.safetensors"))
case("shard listed in the index but missing", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/missing-shard/model-00002-of-00003.safetensors: cannot open: No such file or directory (shard listed in model.safetensors.index.json)")

# ---- where prompts run ----
case("--prefill with no device", ["generate", "-m", os.path.join(DATA, "models", "q4-g64"), "--device", "cpu", "--prefill", "device"] + IDS, 1,
     "tllm: --prefill device: no device is in use (--device opencl)")
case("--prefill of an unknown place", ["generate", "-m", os.path.join(DATA, "models", "q4-g64"), "--prefill", "gpu"] + IDS, 1,
     "tllm: --prefill: 'gpu' is not auto, cpu or device")

d = copy_model("shape")
edit_config(d, lambda c: c.update(intermediate_size=256))
case("tensor shape disagrees with config", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/shape/model.safetensors: tensor 'model.layers.0.mlp.gate_proj.scales' has shape [384, 2] but config.json implies [256, 2]")

d = copy_model("nan-scales")
patch_tensor(d, "model.layers.1.self_attn.o_proj.scales", 2 * 5, struct.pack("<H", 0x7FC0))  # [2, 1]: bf16 NaN
case("NaN in scales", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/nan-scales/model.safetensors: tensor 'model.layers.1.self_attn.o_proj.scales' has a non-finite value (nan) at [2, 1]")

# the other quantized formats: malformed scales, modes and GPTQ/AWQ fields
d = copy_model("mxfp4-nan", os.path.join(DATA, "models", "mxfp4"))
patch_tensor(d, "model.layers.0.mlp.up_proj.scales", 2 * 3 + 1, b"\xff")  # [3, 1] of [128, 2]: E8M0 NaN
case("mxfp4 NaN scale", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/mxfp4-nan/model.safetensors: tensor 'model.layers.0.mlp.up_proj.scales' has a NaN scale (byte 0xff) at [3, 1]")

d = copy_model("mode-on-affine")
edit_config(d, lambda c: c.update(quantization={"group_size": 64, "bits": 4, "mode": "mxfp4"}))
case("mode disagrees with the tensors", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/mode-on-affine/config.json: quantization: bits=4 group_size=64 is not supported for mode mxfp4 (affine: bits 1-6 or 8, group size 32, 64, 128; mxfp4: 4 and 32; nvfp4: 4 and 16; mxfp8: 8 and 32)")

d = copy_model("mode-on-affine-32", os.path.join(DATA, "models", "bf16-as-q4-g32"))
edit_config(d, lambda c: c.update(quantization={"group_size": 32, "bits": 4, "mode": "mxfp4"}))
case("mxfp4 config on affine tensors", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/mode-on-affine-32/model.safetensors: tensor 'model.embed_tokens.scales' has dtype BF16, expected U8 (mxfp4 scales)")

d = copy_model("mode-unknown")
edit_config(d, lambda c: c.update(quantization={"group_size": 64, "bits": 4, "mode": "fp3"}))
case("unknown mode", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/mode-unknown/config.json: quantization: quantization mode 'fp3' is not supported (affine, mxfp4, nvfp4, mxfp8 are)")

d = copy_model("gptq-gidx", os.path.join(DATA, "models", "gptq-int8-act-order"))
patch_tensor(d, "model.layers.1.mlp.down_proj.g_idx", 4 * 7, struct.pack("<i", 9))
case("GPTQ group index out of range", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/gptq-gidx/model.safetensors: tensor 'model.layers.1.mlp.down_proj.g_idx': group index 9 at [7] is outside [0, 4)")

d = copy_model("gptq-method", os.path.join(DATA, "models", "gptq-int4"))
edit_config(d, lambda c: c["quantization_config"].update(quant_method="exl2"))
case("unknown quant_method", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/gptq-method/config.json: quantization_config: quant_method 'exl2' is not supported (mlx, gptq, awq are)")

d = copy_model("gptq-bits", os.path.join(DATA, "models", "gptq-int4"))
edit_config(d, lambda c: c["quantization_config"].update(bits=3))
case("GPTQ 3-bit", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/gptq-bits/config.json: quantization_config: GPTQ with bits=3 is not supported (2, 4, 8 are)")

d = copy_model("awq-gemv", os.path.join(DATA, "models", "awq-int4"))
edit_config(d, lambda c: c["quantization_config"].update(version="gemv"))
case("AWQ GEMV", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/awq-gemv/config.json: quantization_config: AWQ version 'gemv' is not supported (gemm is)")

d = copy_model("gptq-shape", os.path.join(DATA, "models", "gptq-int4"))
edit_config(d, lambda c: c["quantization_config"].update(group_size=64))
case("GPTQ group size disagrees with qzeros", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/gptq-shape/model.safetensors: tensor 'model.layers.0.self_attn.q_proj.qzeros' has shape [2, 8] but config.json implies [1, 8]")

d = copy_model("group", os.path.join(DATA, "models", "gqa7-hd64-sharded"))
edit_config(d, lambda c: c.update(quantization={"group_size": 128, "bits": 4}, quantization_config={"group_size": 128, "bits": 4}))
case("group size not dividing the row", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/group: model.embed_tokens: group size 128 does not divide the row length 448")

d = copy_model("bits7")
edit_config(d, lambda c: c.update(quantization={"group_size": 64, "bits": 7}))
case("bits=7", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/bits7/config.json: quantization: bits=7 group_size=64 is not supported for mode affine (affine: bits 1-6 or 8, group size 32, 64, 128; mxfp4: 4 and 32; nvfp4: 4 and 16; mxfp8: 8 and 32)")

d = copy_model("config-json")
put(os.path.join(d, "config.json"), '{"model_type": "qwen2", "hidden_size": ')
case("config.json not JSON", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/config-json/config.json: invalid JSON (unexpected end of input)")

d = copy_model("big-vocab")
shutil.copy(os.path.join(DATA, "tokenizer", "tokenizer.json"), d)
case("tokenizer vocabulary larger than the model's", ["generate", "-m", d, "-p", "hi"], 1,
     "tllm: {T}/big-vocab/tokenizer.json: the tokenizer has 151665 ids but the model's vocabulary is 4096")

d = copy_model("tok-json")
put(os.path.join(d, "tokenizer.json"), '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}}')
case("tokenizer.json without the byte-level alphabet", ["generate", "-m", d, "-p", "hi"], 1,
     "tllm: {T}/tok-json/tokenizer.json: the vocabulary has no byte-level token for byte 0x00")

# ---- command line ----
case("prompt longer than the context", ["generate", "-m", DEMO, "-c", "16", "-p", "What does grep do? " * 8], 1,
     "tllm: the prompt (41 tokens) does not fit in the context (16 tokens, 16 free)")
case("-c past the model's positions", ["generate", "-m", DEMO, "-c", "8192", "-p", "x"], 1,
     "tllm: -c 8192: longer than the model's max_position_embeddings (4096)")
heldout = os.path.join(DEMO, "heldout.txt")
case("perplexity: a window too short to score a token", ["perplexity", "-m", DEMO, "-f", heldout, "-c", "2"], 1,
     "tllm: -c 2: a window of fewer than 3 tokens scores none (each window scores the tokens after its middle one; "
     "--stride S scores from the second)")
# a sliding window that tllm does not run, as transformers reads it (layers from max_window_layers on,
# unless layer_types names them): the context is capped at it, so what runs is exact
def windowed(name, **kw):
    d = copy_model(name, DEMO)
    edit_config(d, lambda c: (c.pop("layer_types"), c.update(kw)))
    return d


d = windowed("sliding", use_sliding_window=True, sliding_window=8, max_window_layers=5)
case("sliding window: -c past it", ["generate", "-m", d, "-c", "16", "-p", "x"], 1,
     "tllm: -c 16: longer than the model's sliding window, which tllm does not run past (8)")
case("sliding window: a prompt past it", ["generate", "-m", d, "--chat", "-p", "What does tar do?", "-n", "20"], 1,
     "tllm: the prompt (38 tokens) does not fit in the context (8 tokens, 8 free)")
d = windowed("sliding-types", use_sliding_window=True, sliding_window=8,
             layer_types=["full_attention"] * 5 + ["sliding_attention"])
case("sliding window named by layer_types", ["generate", "-m", d, "-c", "9", "-p", "x"], 1,
     "tllm: -c 9: longer than the model's sliding window, which tllm does not run past (8)")
for name, kw in [("sliding-off", dict(use_sliding_window=False, sliding_window=8, max_window_layers=0)),
                 ("sliding-no-layer", dict(use_sliding_window=True, sliding_window=8, max_window_layers=6)),
                 ("sliding-full-types", dict(use_sliding_window=True, sliding_window=8,
                                             layer_types=["full_attention"] * 6))]:
    r = run(["info", "-m", windowed(name, **kw)])
    ok = r.returncode == 0 and b"max positions 4096," in r.stdout
    print(("ok   " if ok else "FAIL ") + "no window in use (%s): full context" % name)
    if not ok:
        failures.append(name)
long = put(os.path.join(T, "long.txt"), "What does tar do?\n" + "x" * (17 << 20) + "\n")
case("prompt line past the limit", ["generate", "-m", DEMO, "--prompts", long, "-n", "2", "-o", os.path.join(T, "long.out")], 0,
     "tllm: {T}/long.txt:2: the line is longer than 16777216 bytes")
case("-n negative", ["generate", "-m", DEMO, "-p", "x", "-n", "-5"], 1, "tllm: -n: -5 is out of range [-1, 16777216]")
case("-t 0", ["generate", "-m", DEMO, "-p", "x", "-t", "0"], 1, "tllm: -t: 0 is out of range [1, 1024]")
case("-c not a number", ["chat", "-m", DEMO, "-c", "4k"], 1, "tllm: -c: '4k' is not an integer")
case("unknown flag", ["generate", "-m", DEMO, "-p", "x", "--tempp", "0"], 1,
     "tllm: generate: unknown option '--tempp' (see tllm generate --help)")
case("unknown command", ["srve"], 1, "tllm: unknown command 'srve' (tllm --help lists them)")
case("serve: a port out of range", ["serve", "-m", DEMO, "--port", "70000"], 1, "tllm: --port: 70000 is out of range [0, 65535]")
case("serve: no key file", ["serve", "-m", DEMO, "--api-key-file", os.path.join(T, "nokey")], 1,
     "tllm: --api-key-file {T}/nokey: No such file or directory")
case("serve: unknown flag", ["serve", "--bogus"], 1, "tllm: serve: unknown option '--bogus' (see tllm serve --help)")
case("TLLM_CPU not a path", ["generate", "-m", DEMO, "-p", "x", "-n", "1"], 1,
     "tllm: TLLM_CPU=sse9: not a kernel path (auto, ref, avx2, avxvnni, avx512, amx)", extra_env={"TLLM_CPU": "sse9"})
case("TLLM_CPU not built", ["info", "-m", DEMO], 1, "tllm: TLLM_CPU=neon: this build has no neon kernels (auto, ref, avx2, avxvnni, avx512, amx)",
     extra_env={"TLLM_CPU": "neon"})
case("invalid UTF-8 in -p", ["generate", "-m", DEMO, "-p", b"caf\xe9".decode("utf-8", "surrogateescape")], 1,
     "tllm: -p: the prompt is not valid UTF-8 (byte 4; is the file in another encoding?)")

empty = put(os.path.join(T, "empty.txt"), "")
case("empty prompt file", ["generate", "-m", DEMO, "--prompts", empty, "-o", os.path.join(T, "empty.out.jsonl")], 1,
     "tllm: {T}/empty.txt: the prompt file is empty", no_file="{T}/empty.out.jsonl")
case("missing prompt file", ["generate", "-m", DEMO, "--prompts", os.path.join(T, "nope.txt")], 1,
     "tllm: {T}/nope.txt: cannot open: No such file or directory")

lines = put(os.path.join(T, "lines.jsonl"),
            '{"id": "ok", "prompt": "What does grep do?", "max_tokens": 4}\n'
            '{"id": "types", "prompt": "x", "max_tokens": "many"}\n'
            '{"id": "temp", "prompt": "x", "temperature": -1}\n'
            '{"id": "msgs", "messages": [{"role": "user", "content": 7}]}\n'
            '[1, 2]\n')
put(lines, b'{"id": "latin1", "prompt": "caf\xe9"}\n', "ab")
out = os.path.join(T, "lines.out.jsonl")
case("JSONL line with wrong types", ["generate", "-m", DEMO, "--prompts", lines, "-o", out], 0,
     'tllm: {T}/lines.jsonl:2: "max_tokens" must be an integer in [-1, 16777216]')
recs = [json.loads(l) for l in open(out)] if os.path.exists(out) else []
want = {"ok": None, "types": '"max_tokens" must be an integer in [-1, 16777216]',
        "temp": '"temperature" must be in [0, 100]', "msgs": "a message's 'content' must be a string or a list of text parts",
        5: "not a JSON object", 6: "the line is not valid UTF-8 (byte 32; is the file in another encoding?)"}
got = {r["id"]: r.get("error") for r in recs}
if got != want:
    failures.append("JSONL records")
    print(f"FAIL JSONL records: {got} != {want}")
else:
    print("ok   JSONL records: one per line, the bad ones with their error")

case("logits -o with a bad model leaves no file", ["logits", "-m", os.path.join(T, "zero"), "--ids", "1", "-o", os.path.join(T, "l.f32")], 1,
     "tllm: {T}/zero/model.safetensors: file is truncated (0 bytes; a safetensors file starts with an 8-byte header length)",
     no_file="{T}/l.f32")
d = copy_model("bf16-truncated", os.path.join(DATA, "models", "bf16"))
st = os.path.join(d, "model.safetensors")
b = open(st, "rb").read()
put(st, b[: len(b) - 1000], "wb")
case("quantize a truncated checkpoint leaves no output", ["quantize", d, os.path.join(T, "q-out")], 1,
     "tllm: {T}/bf16-truncated/model.safetensors: tensor 'model.layers.1.self_attn.v_proj.weight': data_offsets [668672, 672768] run past the end of the data (671896 bytes; file truncated?)",
     no_file="{T}/q-out/model.safetensors")

# ---- safetensors layouts the format forbids: every data byte in exactly one tensor, keys unique ----
def st_raw(name, header_text, data):
    d = copy_model(name)
    h = header_text.encode()
    h += b" " * (-len(h) % 8)
    put(os.path.join(d, "model.safetensors"), struct.pack("<Q", len(h)) + h + data, "wb")
    return d

F32 = '"dtype": "F32", "shape": [2], "data_offsets": '
d = st_raw("st-overlap", '{"a": {' + F32 + '[0, 8]}, "b": {' + F32 + '[4, 12]}}', bytes(12))
case("safetensors: overlapping tensors", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/st-overlap/model.safetensors: tensors 'a' and 'b' overlap (bytes 4 to 8)")
d = st_raw("st-hole", '{"a": {' + F32 + '[0, 8]}, "b": {' + F32 + '[12, 20]}}', bytes(20))
case("safetensors: bytes that belong to no tensor", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/st-hole/model.safetensors: bytes 8 to 12 of the data belong to no tensor")
d = st_raw("st-tail", '{"a": {' + F32 + '[0, 8]}}', bytes(16))
case("safetensors: data after the last tensor", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/st-tail/model.safetensors: bytes 8 to 16 of the data belong to no tensor")
d = st_raw("st-dup", '{"a": {' + F32 + '[0, 8]}, "a": {' + F32 + '[8, 16]}}', bytes(16))
case("safetensors: a key twice", ["generate", "-m", d] + IDS, 1,
     'tllm: {T}/st-dup/model.safetensors: the key "a" appears twice in the header')
d = st_raw("st-nul", '{"a\\u0000b": {' + F32 + '[0, 8]}}', bytes(8))
case("safetensors: a NUL in a key", ["generate", "-m", d] + IDS, 1,
     'tllm: {T}/st-nul/model.safetensors: the key "a\\u0000b" has a NUL byte')

# ---- GGUF files: the header's counts, keys and offsets checked against the file ----
def gstr(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_raw(name, kvs, tensors=(), data=b"", version=3, magic=b"GGUF"):
    """kvs: (key, type, packed value bytes); tensors: (name, dims, ggml type, offset)"""
    body = magic + struct.pack("<IQQ", version, len(tensors), len(kvs))
    body += b"".join(gstr(k) + struct.pack("<I", t) + v for k, t, v in kvs)
    body += b"".join(gstr(n) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims) +
                     struct.pack("<IQ", ty, off) for n, dims, ty, off in tensors)
    body += b"\0" * (-len(body) % 32)
    return put(os.path.join(T, name), body + data, "wb")


ARCH = ("general.architecture", 8, gstr("qwen2"))
g = gguf_raw("g-magic.gguf", [ARCH], magic=b"GGML")
case("gguf: no magic", ["generate", "-m", g] + IDS, 1, 'tllm: {T}/g-magic.gguf: not a GGUF file (no "GGUF" magic)')
g = gguf_raw("g-v1.gguf", [ARCH], version=1)
case("gguf: version 1", ["generate", "-m", g] + IDS, 1,
     "tllm: {T}/g-v1.gguf: GGUF version 1 is not supported (2 and 3 are; llama.cpp's gguf-py can rewrite it)")
g = gguf_raw("g-dup.gguf", [ARCH, ARCH])
case("gguf: a key twice", ["generate", "-m", g] + IDS, 1, "tllm: {T}/g-dup.gguf: key 'general.architecture' appears twice")
g = gguf_raw("g-arch.gguf", [("general.architecture", 8, gstr("llama"))])
case("gguf: another architecture", ["generate", "-m", g] + IDS, 1,
     "tllm: {T}/g-arch.gguf: general.architecture 'llama' is not supported (tllm runs qwen2 models)")
g = gguf_raw("g-align.gguf", [ARCH], [("a", [8], 0, 4)], bytes(64))
case("gguf: a misaligned tensor", ["generate", "-m", g] + IDS, 1,
     "tllm: {T}/g-align.gguf: tensor 'a': offset 4 is not a multiple of the alignment 32")
g = gguf_raw("g-past.gguf", [ARCH], [("a", [1024], 0, 0)], bytes(64))
case("gguf: a tensor past the end", ["generate", "-m", g] + IDS, 1,
     "tllm: {T}/g-past.gguf: tensor 'a': bytes 0 to 4096 of the data, which has 64 (truncated file?)")
g = gguf_raw("g-type.gguf", [ARCH], [("a", [32], 77, 0)], bytes(64))
case("gguf: an unknown tensor type", ["generate", "-m", g] + IDS, 1,
     "tllm: {T}/g-type.gguf: tensor 'a' has ggml type 77, which tllm does not know")
g = gguf_raw("g-cut.gguf", [ARCH, ("qwen2.block_count", 4, struct.pack("<I", 2))])
put(g, open(g, "rb").read()[:100], "wb")  # in qwen2.block_count's value (bytes 98 to 102)
case("gguf: a truncated header", ["generate", "-m", g] + IDS, 1,
     "tllm: {T}/g-cut.gguf: truncated or corrupt header: qwen2.block_count runs past the end of the file (byte 98 of 100)")
g = gguf_raw("g-keys.gguf", [ARCH])
case("gguf: a missing key", ["generate", "-m", g] + IDS, 1, "tllm: {T}/g-keys.gguf: missing key 'qwen2.embedding_length'")
case("gguf: tllm quantize points to the float32 route", ["quantize", g, os.path.join(T, "gq-out")], 1,
     "tllm: {T}/g-keys.gguf: a GGUF file runs as it is (-m FILE.gguf); to requantize it, write it out as a float32 "
     "checkpoint first (scripts/gguf_to_hf.py)", no_file="{T}/gq-out/model.safetensors")
two = os.path.join(T, "two-gguf")
os.makedirs(two)
for n in ("a.gguf", "b.gguf"):
    shutil.copy(g, os.path.join(two, n))
case("gguf: a directory of two", ["generate", "-m", two] + IDS, 1,
     "tllm: {T}/two-gguf: holds more than one GGUF file and no config.json: name the file to run")

# ---- special files where the model's files should be: never a hang, a message naming the file ----
for name in ["config.json", "model.safetensors", "generation_config.json"]:
    d = copy_model("fifo-" + name.split(".")[0])
    os.remove(os.path.join(d, name))
    os.mkfifo(os.path.join(d, name))
    case(f"a FIFO as {name}", ["generate", "-m", d] + IDS, 1, "tllm: {T}/fifo-" + name.split(".")[0] + "/" + name + ": not a regular file")
d = copy_model("fifo-tokenizer", DEMO)
os.remove(os.path.join(d, "tokenizer.json"))
os.mkfifo(os.path.join(d, "tokenizer.json"))
case("a FIFO as tokenizer.json", ["generate", "-m", d, "-p", "x", "-n", "2"], 1, "tllm: {T}/fifo-tokenizer/tokenizer.json: not a regular file")
d = copy_model("symlink-loop")
os.remove(os.path.join(d, "model.safetensors"))
os.symlink("model.safetensors", os.path.join(d, "model.safetensors"))
case("model.safetensors a symlink to itself", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/symlink-loop/model.safetensors: cannot open: Too many levels of symbolic links")
d = copy_model("symlink-dangling")
os.remove(os.path.join(d, "model.safetensors"))
os.symlink("nowhere.safetensors", os.path.join(d, "model.safetensors"))
case("model.safetensors a dangling symlink", ["generate", "-m", d] + IDS, 1,
     "tllm: {T}/symlink-dangling/model.safetensors: cannot open: No such file or directory")
d = copy_model("genconfig-value")
put(os.path.join(d, "generation_config.json"), '{"temperature": "hot", "top_k": 5}')
case("generation_config.json with a bad value (and no leak: ASan)", ["generate", "-m", d] + IDS, 1,
     'tllm: {T}/genconfig-value/generation_config.json: "temperature" must be a number')

# ---- output files: through a symlink to where it points; a device is written to, never replaced ----
target = os.path.join(T, "target.f32")
link = os.path.join(T, "link.f32")
os.symlink("target.f32", link)
r = run(["logits", "-m", os.path.join(DATA, "models", "q4-g64"), "--ids", "1,2", "--last", "-o", link])
if r.returncode != 0 or not os.path.islink(link) or not os.path.isfile(target) or os.path.getsize(target) == 0:
    failures.append("logits -o a symlink")
    print(f"FAIL logits -o a symlink: rc {r.returncode}, link kept {os.path.islink(link)}, {r.stderr.decode()!r}")
else:
    print("ok   logits -o a symlink: the link stays, the file it points to gets the logits")
if os.geteuid() == 0:  # a null device of our own (as root the old code replaced such nodes with a file)
    import stat as st_
    node = os.path.join(T, "null")
    os.mknod(node, 0o666 | st_.S_IFCHR, os.makedev(1, 3))
    r = run(["logits", "-m", os.path.join(DATA, "models", "q4-g64"), "--ids", "1,2", "-o", node])
    if r.returncode != 0 or not st_.S_ISCHR(os.stat(node).st_mode):
        failures.append("logits -o a device")
        print(f"FAIL logits -o a device: rc {r.returncode}, still a device: {st_.S_ISCHR(os.stat(node).st_mode)}")
    else:
        print("ok   logits -o a device: written to, still a device")

# ---- the tokenizer on hostile input: a split regex that backtracks, one enormous word ----
tokdir = os.path.join(T, "backtrack")
os.makedirs(tokdir)
tj = json.load(open(os.path.join(DATA, "tokenizer", "tokenizer.json")))
tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a{0,3000}a{0,3000}b|."
json.dump(tj, open(os.path.join(tokdir, "tokenizer.json"), "w"))
put(os.path.join(T, "a6000.txt"), "a" * 6000)
try:
    r = run(["tokenize", "-m", tokdir, "--file", os.path.join(T, "a6000.txt")], timeout=30)
    e = r.stderr.decode()
    ok = r.returncode == 1 and e.startswith(f"tllm: {tokdir}/tokenizer.json: the pre-tokenizer's split regex is too slow")
except subprocess.TimeoutExpired:
    ok, e = False, "still running after 30 s"
if ok:
    print("ok   a split regex that backtracks: stopped, the file named")
else:
    failures.append("backtracking split regex")
    print(f"FAIL backtracking split regex: {e!r}")
if not os.environ.get("TLLM_TEST_SANITIZED"):  # the sanitizers' own memory would blur the measure
    word = put(os.path.join(T, "word.txt"), "a" * (8 << 20))
    p = subprocess.Popen([TLLM, "tokenize", "-m", os.path.join(DATA, "tokenizer"), "--file", word],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    peak_mb = usage.ru_maxrss / 1024
    if os.waitstatus_to_exitcode(status) != 0 or peak_mb > 250:
        failures.append("tokenize one 8 MiB word")
        print(f"FAIL tokenize one 8 MiB word: exit {os.waitstatus_to_exitcode(status)}, peak {peak_mb:.0f} MB (before: 390)")
    else:
        print(f"ok   tokenize one 8 MiB word: peak {peak_mb:.0f} MB")

# output that cannot be written is a failure (the streamed text's fwrite errors are remembered by stdio)
if os.path.exists("/dev/full"):
    env = dict(os.environ)
    env.pop("TLLM_MODEL", None)
    with open("/dev/full", "w") as full:
        r = subprocess.run([TLLM, "generate", "-m", DEMO, "-p", "x", "-n", "4"], stdout=full, stderr=subprocess.PIPE, env=env, timeout=300)
    want = "tllm: writing standard output: No space left on device"
    if r.returncode != 1 or want not in r.stderr.decode().splitlines():
        failures.append("stdout on a full disk")
        print(f"FAIL stdout on a full disk: exit {r.returncode}, stderr {r.stderr.decode()!r}")
    else:
        print(f"ok   stdout on a full disk: {want}")

shutil.rmtree(T, ignore_errors=True)
print("bad_inputs:", "FAILED " + ", ".join(failures) if failures else "ok")
sys.exit(1 if failures else 0)
