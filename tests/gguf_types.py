"""Every ggml tensor type tllm runs, mapped onto its layouts, against gguf-py's own dequantize, bit for bit
(a zero's sign aside).
Random blocks: quantized by gguf-py's quantizers where it has them (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 MXFP4, F16
BF16), random bytes with finite float16 scales where it has none (the K-quants, NVFP4). A GGUF file of them
is written with gguf-py's GGUFWriter, tllm's mapping dequantized by tests/gguf_dequant, and compared.
Also: types tllm does not run are refused naming the tensor and the type.
Needs numpy and gguf (the test venv, scripts/setup.sh); skips (77) without them.
usage: gguf_types.py GGUF_DEQUANT TLLM"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize
except ImportError as e:
    print(f"skipped: {e} (scripts/setup.sh makes the test venv with numpy and gguf)")
    sys.exit(77)

dequant_bin, tllm = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(7)
QUANTIZABLE = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4, T.F16, T.BF16, T.F32}


def random_f16(n, lo=-12, hi=2):
    """finite float16 values of random sign and magnitude 2^lo..2^hi, subnormals included"""
    v = rng.standard_normal(n) * np.exp2(rng.uniform(lo, hi, n))
    return v.astype(np.float16)


def random_blocks(qtype, rows, cols):
    """raw bytes [rows, cols / block * type_size] of qtype"""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    f16 = lambda k: random_f16(nb * k).view(np.uint8).reshape(nb, 2 * k)
    if qtype == T.Q2_K:    # scales[16] qs[64] d dmin
        raw[:, 80:84] = f16(2)
    elif qtype == T.Q3_K:  # hmask[32] qs[64] scales[12] d
        raw[:, 108:110] = f16(1)
    elif qtype in (T.Q4_K, T.Q5_K):  # d dmin scales[12] ...
        raw[:, 0:4] = f16(2)
    elif qtype == T.Q6_K:  # ql[128] qh[64] scales[16] d
        raw[:, 208:210] = f16(1)
    elif qtype == T.NVFP4:  # 4 UE4M3 scales, bit 7 and 0x7f (read as 0) included
        raw[:5, 0] = [0x7F, 0xFF, 0x80, 0x00, 0x01]
    return raw.reshape(rows, cols // block * size)


def tensor(qtype, rows, cols, scale=1.0):
    if qtype in QUANTIZABLE:
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qtype == T.F32:
            return x
        return quantize(x, qtype)
    return random_blocks(qtype, rows, cols)


def write_gguf(path, tensors):
    w = gguf.GGUFWriter(path, "qwen2")
    for name, (qtype, data, rows, cols) in tensors.items():
        if qtype in (T.F32, T.F16):
            w.add_tensor(name, data)
        else:  # bytes [rows, cols / block * type size]
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


cases = {}
for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
              T.MXFP4, T.NVFP4]:
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    cols = max(block, 256) * 2
    cases[f"t.{qtype.name}"] = (qtype, tensor(qtype, 7, cols), 7, cols)
# scales whose products float16 cannot hold (-8 d past 65504): the float32 form
cases["t.Q4_0.big"] = (T.Q4_0, tensor(T.Q4_0, 3, 64, scale=60000.0), 3, 64)
cases["t.Q8_0.tiny"] = (T.Q8_0, tensor(T.Q8_0, 3, 64, scale=1e-6), 3, 64)

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "types.gguf")
    write_gguf(path, cases)
    r = subprocess.run([dequant_bin, path, tmp], capture_output=True, text=True)
    check(r.returncode == 0, f"gguf_dequant failed: {r.stderr.strip()}")
    if r.returncode == 0:
        for name, (qtype, data, rows, cols) in cases.items():
            want = data if qtype == T.F32 else dequantize(data, qtype)
            want = np.asarray(want, dtype=np.float32).reshape(rows, cols)
            got = np.fromfile(os.path.join(tmp, name + ".f32"), dtype=np.float32).reshape(rows, cols)
            # bit for bit, except a zero's sign: s q + b gives +0 where ggml's d (q - 8) gives -0 (equal values:
            # no product or sum they enter differs)
            differ = (got.view(np.uint32) != want.view(np.uint32)) & ~((got == 0) & (want == 0))
            bad = np.argwhere(differ)
            same = len(bad) == 0
            where = f" first at {tuple(bad[0])}: {got[tuple(bad[0])]!r} != {want[tuple(bad[0])]!r}" if len(bad) else ""
            check(same, f"{name}: tllm's mapping != gguf.quants.dequantize ({len(bad)} of {rows * cols} differ){where}")
            print(f"  {name}: {rows} x {cols} {'bit for bit' if same else 'DIFFERS'}")

    # a type tllm does not run: refused naming the tensor and the type
    bad_path = os.path.join(tmp, "iq.gguf")
    w = gguf.GGUFWriter(bad_path, "qwen2")
    w.add_tensor("blk.0.ffn_up.weight", rng.integers(0, 256, (4, 66), dtype=np.uint8), raw_dtype=T.IQ2_XXS)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    r = subprocess.run([dequant_bin, bad_path, tmp], capture_output=True, text=True)
    check(r.returncode != 0 and "blk.0.ffn_up.weight" in r.stderr and "IQ2_XXS" in r.stderr,
          f"an IQ2_XXS tensor: expected a refusal naming it, got {r.returncode}: {r.stderr.strip()}")
    # and by the model loader, in one line
    r = subprocess.run([tllm, "info", "-m", bad_path], capture_output=True, text=True)
    check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, f"tllm info on a bad GGUF: {r.stderr!r}")

finish()
