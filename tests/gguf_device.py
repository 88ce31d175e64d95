"""GGUF files on the OpenCL device (PoCL in CI): a decode step of a small model of each tensor type
(scripts/synth_gguf.py's random weights at 512 wide, two layers) against the CPU.
  float  device decode (float activations) after the CPU's prompt: within 1e-5 of the CPU's float path.
         Groups of 16 (Q2_K, Q3_K, Q6_K) have a scale and bias per half of a 32-code word: a kernel that
         took one per word was off by 0.3-1.0 here.
  int8   device decode with int8 activations (the default for packed 4- and 8-bit codes: GGUF's Q5_0,
         Q6_K, Q8_0 come as 8-bit codes, Q3_K as 4-bit in groups of 16; for a mix of formats on a CPU
         device, asked for with -DQ_INT8=1) against the device's own float decode on the same cache:
         within 1e-3 (two int8 levels; measured <= 2e-4); said to be int8.
  copies the mix's decode with a copy of the weight reads per format (-DMIX_COPIES=1, a GPU's default)
         against one copy for all (-DMIX_COPIES=0), float and int8: within 1e-6 (the same sums; PoCL
         gives the same bits).
  compact the scales and biases in every compact form (-DCOMPACT_SCALES=2: two levels, no biases where
         they follow the scales; asked for, not a default) against the plain ones, in decode and in the
         device's prompt kernels (--prefill device, float and int8 inputs: with --prefill auto a CPU device
         ran the prompts on the CPU, and the check compared nothing of them), every type: within 1e-6 (the
         same values; PoCL gives the same bits).
  emit   Q3_K and Q6_K (groups of 16, int8 inputs): device prompt logits with o_proj's input left by
         flash_combine (FL_EMIT, the default) and by pf_norm (-DFL_EMIT=0): the same bits.
  chunks the mix with MV_LOCAL_X at 512, below down_proj's 1024 inputs: staged in two chunks (as a 7B's
         18944 are on a GPU), float within 1e-5 of the CPU and int8 within 1e-3 of the float decode.
Needs numpy (the test venv) for synth_gguf.py; skips (77) without it or without an OpenCL device.
usage: gguf_device.py TLLM REPO"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

try:
    import numpy as np
except ImportError as e:
    print(f"skipped: {e} (scripts/setup.sh makes the test venv with numpy)")
    sys.exit(77)

tllm, repo = sys.argv[1], sys.argv[2]
devices = subprocess.run([tllm, "devices"], capture_output=True, text=True).stdout
cpu_device = "opencl:0" in devices and "[CPU" in devices.split("opencl:0", 1)[1].split("\n", 1)[0]
if "opencl:0" not in devices:
    print("skipped: no OpenCL device")
    sys.exit(77)
if os.environ.get("TLLM_TEST_SANITIZED"):
    print("skipped: the device's driver under the sanitizers finds nothing the plain build does not")
    sys.exit(77)

CONFIG = ('{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 512, "intermediate_size": 1024, '
          '"num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 2048, '
          '"max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": false, '
          '"bos_token_id": 1, "eos_token_id": 2}')
IDS = "1,2,3,4,5,6,7,8"


def rel_rms(a, b):
    return float(np.sqrt(((a.astype(np.float64) - b) ** 2).mean() / (b.astype(np.float64) ** 2).mean()))


def logits(model, out, *extra, opts=None, ids=IDS, last=True):
    env = dict(os.environ)
    if opts:
        env["TLLM_CL_OPTS"] = opts
    r = subprocess.run([tllm, "logits", "-m", model, "--ids", ids, *(["--last"] if last else []), "-o", out, *extra],
                       capture_output=True, text=True, env=env, timeout=900)
    if r.returncode:
        print(f"tllm logits {' '.join(extra)}: exit {r.returncode}: {r.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return np.fromfile(out, np.float32)


with tempfile.TemporaryDirectory() as d:
    cfg = os.path.join(d, "config.json")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_0", "Q6_K", "Q8_0", "mix"):
        model = os.path.join(d, t + ".gguf")
        r = subprocess.run([sys.executable, os.path.join(repo, "scripts", "synth_gguf.py"), "--config", cfg, "--out", model,
                            "--seed", "1"] + ([] if t == "mix" else ["--type", t]), capture_output=True, text=True)
        if not check(r.returncode == 0, f"{t}: synth_gguf.py: {r.stderr[-300:]}"):
            continue
        out = os.path.join(d, t + ".f32")
        cpu = logits(model, out)
        dev = logits(model, out, "--device", "opencl", "--prefill", "cpu")
        if check(cpu is not None and dev is not None, f"{t}: float logits"):
            e = rel_rms(dev, cpu)
            print(f"  {t}: device float decode vs the CPU: relative RMS {e:.2e}")
            check(e <= 1e-5, f"{t}: device float decode vs the CPU: relative RMS {e:.3e} > 1e-5")
        # a mix on a CPU device (PoCL) takes int8 activations only when asked (its compile at real sizes is slow)
        ask = "-DQ_INT8=1" if t == "mix" and cpu_device else None
        xq = logits(model, out, "--int8", "--device", "opencl", "--prefill", "cpu", opts=ask)
        fl = logits(model, out, "--int8", "--device", "opencl", "--prefill", "cpu", opts="-DQ_INT8=0")
        if check(xq is not None and fl is not None, f"{t}: int8 logits"):
            e = rel_rms(xq, fl)
            print(f"  {t}: device int8 decode vs its float decode: relative RMS {e:.2e}")
            if t == "Q2_K":  # 2-bit codes have no int8 form: the same float decode both ways
                check(e == 0, f"{t}: device --int8 decode differs from its float decode ({e:.3e})")
            else:
                check(0 < e <= 1e-3, f"{t}: device int8 decode vs float: relative RMS {e:.3e} (0: not int8)")
        if t == "mix":  # a copy of the weight reads per format (the default on GPUs): the same sums
            for lv, base in (("float", dev), ("int8", xq)):
                more = ["--int8"] if lv == "int8" else []
                extra_opts = ("-DQ_INT8=1 " if lv == "int8" and cpu_device else "-DQ_INT8=0 " if lv == "float" else "")
                cp = logits(model, out, *more, "--device", "opencl", "--prefill", "cpu", opts=extra_opts + "-DMIX_COPIES=1")
                gen = logits(model, out, *more, "--device", "opencl", "--prefill", "cpu", opts=extra_opts + "-DMIX_COPIES=0")
                if check(cp is not None and gen is not None, f"mix: {lv} logits with and without a copy a format"):
                    e = rel_rms(cp, gen)
                    print(f"  mix: {lv} decode, a copy a format vs one for all: relative RMS {e:.2e}")
                    check(e <= 1e-6, f"mix: {lv} decode with a copy a format vs without: relative RMS {e:.3e} > 1e-6")
        if t == "mix" and cpu is not None:  # down_proj's 1024 inputs staged in two chunks (as 7B's 18944 are)
            chunk = "-DMV_LOCAL_X=512 "
            fc = logits(model, out, "--device", "opencl", "--prefill", "cpu", opts=chunk + "-DQ_INT8=0")
            ic = logits(model, out, "--int8", "--device", "opencl", "--prefill", "cpu",
                        opts=chunk + ("-DQ_INT8=1" if cpu_device else ""))
            if check(fc is not None and ic is not None and fl is not None, "mix: logits with down_proj's input in chunks"):
                e, e8 = rel_rms(fc, cpu), rel_rms(ic, fl)
                print(f"  mix, input in chunks: float decode vs the CPU {e:.2e}, int8 vs float {e8:.2e}")
                check(e <= 1e-5, f"mix: chunked float decode vs the CPU: relative RMS {e:.3e} > 1e-5")
                check(0 < e8 <= 1e-3, f"mix: chunked int8 decode vs float: relative RMS {e8:.3e}")
        # compact scales (asked for): the same values, so the same sums, in the
        # decode step (int8 where the device takes it) and in the prompt kernels
        for what, more in (("decode", ["--int8", "--prefill", "cpu"]), ("prompt", ["--prefill", "device"]),
                           ("int8 prompt", ["--int8", "--prefill", "device"])):
            base_opts = (ask + " ") if ask and what == "decode" else ""
            cs = logits(model, out, *more, "--device", "opencl", opts=base_opts + "-DCOMPACT_SCALES=2")
            ps = logits(model, out, *more, "--device", "opencl", opts=base_opts + "-DCOMPACT_SCALES=0")
            if check(cs is not None and ps is not None, f"{t}: {what} logits with and without compact scales"):
                e = rel_rms(cs, ps)
                print(f"  {t}: {what}, compact scales vs plain: relative RMS {e:.2e}")
                check(e <= 1e-6, f"{t}: {what} with compact scales vs plain: relative RMS {e:.3e} > 1e-6")
        if t in ("Q3_K", "Q6_K"):  # groups of 16 with int8 inputs: flash_combine's half-block sums (FL_EMIT)
            ids = ",".join(str(i) for i in range(1, 71))  # past a span (64 positions)
            got = [logits(model, out, "--int8", "--device", "opencl", "--prefill", "device", opts=opts, ids=ids, last=False)
                   for opts in (None, "-DFL_EMIT=0")]
            if check(got[0] is not None and got[1] is not None, f"{t}: device prompt logits with and without FL_EMIT"):
                same = bool(np.array_equal(got[0], got[1]))
                print(f"  {t}: device prompt, o_proj's input from flash_combine vs pf_norm: {'the same bits' if same else 'differ'}")
                check(same, f"{t}: o_proj's input from flash_combine differs from pf_norm's")
        if t != "Q2_K":  # 2-bit codes have no int8 form on the device
            env = dict(os.environ, **({"TLLM_CL_OPTS": ask} if ask else {}))
            b = subprocess.run([tllm, "bench", "-m", model, "--device", "opencl", "-p", "0", "-n", "2", "-r", "1"],
                               capture_output=True, text=True, timeout=900, env=env)
            check("int8 activations" in b.stdout + b.stderr, f"{t}: decode is not said to take int8 activations: {b.stderr[-300:]}")
finish("gguf_device")
