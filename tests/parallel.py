#!/usr/bin/env python3
"""Many sequences at once (tllm generate --prompts -np N): a sequence's tokens do not depend on what
runs beside it, a shared prefix is computed once, every KV block comes back, a prompt too long for the
cache is an error record while the others go on, and a killed run resumes with every id exactly once.

usage: parallel.py TLLM_BINARY TESTS_DATA_DIR DEMO_MODEL"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

TLLM, DATA, DEMO = sys.argv[1], sys.argv[2], sys.argv[3]
T = tempfile.mkdtemp(prefix="tllm-parallel-")
failures = []
MARGIN_MIN = 1e-3  # as test_model_reference.c: a near-tie may legitimately go the other way


def check(name, cond, detail=""):
    if cond:
        print(f"ok   {name}")
    else:
        failures.append(name)
        print(f"FAIL {name}: {detail}")


def run(args, timeout=300):
    env = dict(os.environ)
    env.pop("TLLM_MODEL", None)
    if "--device" in args:  # as tests/cli_frontends.py says: PoCL's in-process LLVM compile leaks, and LeakSanitizer's
        # tracer can crash on the dynamic TLS it loads; tllm's own device paths are leak-checked by test_cl_batch
        asan = env.get("ASAN_OPTIONS", "")
        env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "detect_leaks=0"
    return subprocess.run([TLLM] + args, capture_output=True, text=True, env=env, timeout=timeout)


def put(name, lines):
    p = os.path.join(T, name)
    with open(p, "w") as f:
        f.write("".join(json.dumps(l) + "\n" for l in lines))
    return p


def records(path):
    with open(path) as f:
        return [json.loads(l) for l in f]


def answers(path):
    """id -> what was generated (ids, or text), finish reason, error"""
    return {r["id"]: (r.get("ids"), r.get("text"), r.get("finish_reason"), r.get("error")) for r in records(path)}


def generate(model, prompts, np, extra=(), name=None):
    out = os.path.join(T, name or f"out-{os.getpid()}-{time.monotonic_ns()}.jsonl")
    r = run(["generate", "-m", model, "--prompts", prompts, "-o", out, "-np", str(np), "--temp", "0", "-t", "2"] +
            list(extra))
    return r, out


def stats(r):
    m = re.search(r"prompt tokens computed (\d+), reused (\d+) \(cached prefixes\), generated (\d+)", r.stderr)
    return tuple(int(x) for x in m.groups()) if m else None


# 1. A dozen prompts on every small fixture: -np 1 and -np 8 give the same tokens, on the default path
#    (int8 activations, f16 KV) and with --exact; with --exact, f32 KV and no repetition penalty the
#    fixture's own prompt continues as transformers computed it.
for m in sorted(os.listdir(os.path.join(DATA, "models"))):
    d = os.path.join(DATA, "models", m)
    ref = json.load(open(os.path.join(d, "reference", "reference.json")))
    p = ref["prompt_ids"]
    lines = [{"id": "ref", "prompt": p}] + [{"id": f"v{k}", "prompt": p[: 4 + k] + p[-k:]} for k in range(1, 12)]
    prompts = put(f"{m}.jsonl", lines)
    n = str(len(ref["greedy_ids"]))
    for path, extra in (("default", []), ("precise-decode", ["--precise-decode"]),
                        ("exact", ["--exact", "--kv-type", "f32", "--repeat-penalty", "1"])):
        r1, o1 = generate(d, prompts, 1, ["-n", n] + extra)
        r8, o8 = generate(d, prompts, 8, ["-n", n] + extra)
        ok = r1.returncode == 0 and r8.returncode == 0
        a1, a8 = (answers(o1), answers(o8)) if ok else ({}, {})
        check(f"{m} {path}: -np 1 and -np 8 give the same tokens", ok and len(a1) == 12 and a1 == a8,
              f"{r1.stderr[-300:]} {r8.stderr[-300:]} {[k for k in a1 if a1[k] != a8.get(k)]}")
        if path == "exact" and ok:
            got, want = a8["ref"][0], ref["greedy_ids"]
            k = 0
            while k < len(want) and k < len(got) and got[k] == want[k]:
                k += 1
            tie = k < len(want) and ref["margins"][len(p) - 1 + k] <= MARGIN_MIN
            check(f"{m}: the reference continuation (with 7 others beside it)", k == len(want) or tie,
                  f"{got} != {want}")

# 2. Prompts sharing a long prefix: it is computed once; the answers equal those of separate runs.
q4 = os.path.join(DATA, "models", "q4-g64")
base = [(7 * i + 3) % 4000 + 10 for i in range(100)]
lines = [{"id": i, "prompt": base + [100 + i, 200 + i, 300 + i]} for i in range(8)]
prompts = put("shared.jsonl", lines)
r, o = generate(q4, prompts, 8, ["-n", "8"])
st = stats(r)
total = sum(len(l["prompt"]) for l in lines)
shared = len(base) // 16 * 16  # whole blocks of the common prefix
check("a shared prefix is computed once", r.returncode == 0 and st is not None and st[0] == total - 7 * shared and
      st[1] == 7 * shared, f"computed/reused/generated {st}, want {total - 7 * shared}/{7 * shared}; {r.stderr[-300:]}")
together = answers(o) if r.returncode == 0 else {}
alone = {}
for l in lines:
    ra, oa = generate(q4, put(f"alone{l['id']}.jsonl", [l]), 1, ["-n", "8"])
    if ra.returncode == 0:
        alone.update(answers(oa))
check("... and the answers equal separate runs'", together and together == alone,
      f"{[k for k in together if together[k] != alone.get(k)]}")

# 3. A prompt too long for the KV cache: an error record; the others go on; every block comes back
#    (the CLI itself fails a run that ends with a block still held).
lines = [{"id": "short1", "prompt": base[:20]}, {"id": "long", "prompt": base + base}, {"id": "short2", "prompt": base[:30]}]
r, o = generate(q4, put("long.jsonl", lines), 4, ["-n", "8", "-c", "96"])
a = answers(o) if r.returncode == 0 else {}
check("a prompt too long for the cache is an error record, the others are answered",
      r.returncode == 0 and a.get("long", (0, 0, 0, None))[3] is not None and "does not fit" in a["long"][3] and
      a.get("short1", (0,))[0] and a.get("short2", (0,))[0], f"{a} {r.stderr[-300:]}")
#    a cache that holds only a few sequences' worth: requests wait for blocks, all are answered
lines = [{"id": i, "prompt": base[i:i + 40]} for i in range(12)]
r, o = generate(q4, put("tight.jsonl", lines), 8, ["-n", "24", "-c", "160"])
check("a small cache: requests wait for blocks and all are answered", r.returncode == 0 and len(answers(o)) == 12 and
      all(v[0] for v in answers(o).values()), r.stderr[-300:])

# 4. SIGINT, then SIGKILL, in the middle of a -np 8 run; the same command again: every id exactly once,
#    every line whole.
lines = [{"id": f"k{i}", "prompt": f"how do I use command number {i}?"} for i in range(40)]
prompts = put("kill.jsonl", lines)
out = os.path.join(T, "kill.out.jsonl")
cmd = [TLLM, "generate", "-m", DEMO, "--prompts", prompts, "-o", out, "-np", "8", "-n", "48", "--chat", "-t", "2"]
for sig in (signal.SIGINT, signal.SIGKILL):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and (not os.path.exists(out) or len(open(out).read().splitlines()) < 4):
        time.sleep(0.02)
    proc.send_signal(sig)
    _, e = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        check("SIGINT ends a -np 8 run with every KV block back", proc.returncode == 130 and "still held" not in e, e[-300:])
r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
with open(out) as f:
    raw = f.read().splitlines()
ids = []
for l in raw:
    try:
        ids.append(json.loads(l)["id"])
    except ValueError:
        ids.append(None)
check("after SIGKILL the same command answers every id exactly once, nothing torn",
      r.returncode == 0 and sorted(ids, key=str) == sorted((l["id"] for l in lines), key=str), f"{ids} {r.stderr[-300:]}")

# 5. On an OpenCL device (PoCL in CI; skipped without one): many sequences' steps run there (the cache's
#    blocks on the device). -np 1 and -np 8 give the same tokens; with --exact and an f32 cache they are
#    the CPU's and the reference's; a shared prefix is computed once there too; --precise-decode: -np 8 = -np 1.
if "\nopencl:" in run(["devices"]).stdout:
    dev = ["--device", "opencl"]
    for m in ("q4-g64", "gqa7-hd64-sharded", "bf16"):
        d = os.path.join(DATA, "models", m)
        ref = json.load(open(os.path.join(d, "reference", "reference.json")))
        prompts, n = os.path.join(T, f"{m}.jsonl"), str(len(ref["greedy_ids"]))
        for path, extra in (("default", []), ("exact", ["--exact", "--kv-type", "f32", "--repeat-penalty", "1"])):
            r1, o1 = generate(d, prompts, 1, ["-n", n] + extra + dev)
            r8, o8 = generate(d, prompts, 8, ["-n", n] + extra + dev)
            ok = r1.returncode == 0 and r8.returncode == 0 and "run on the CPU" not in r8.stderr
            a1, a8 = (answers(o1), answers(o8)) if ok else ({}, {})
            check(f"opencl {m} {path}: -np 1 and -np 8 give the same tokens", ok and len(a1) == 12 and a1 == a8,
                  f"{r1.stderr[-300:]} {r8.stderr[-300:]} {[k for k in a1 if a1[k] != a8.get(k)]}")
            if path == "exact" and ok:
                rc, oc = generate(d, prompts, 8, ["-n", n] + extra)
                ac = answers(oc) if rc.returncode == 0 else {}
                same = [k for k in ac if ac[k] == a8.get(k)]
                check(f"opencl {m} exact: the CPU's tokens", len(same) == 12, f"{[k for k in ac if ac[k] != a8.get(k)]}")
    r, o = generate(q4, prompts_shared := put("shared-cl.jsonl", [{"id": i, "prompt": base + [100 + i, 200 + i, 300 + i]}
                                                                 for i in range(8)]), 8, ["-n", "8"] + dev)
    st = stats(r)
    r1, o1 = generate(q4, prompts_shared, 1, ["-n", "8"] + dev)
    check("opencl: a shared prefix is computed once; the answers are -np 1's",
          r.returncode == 0 and r1.returncode == 0 and st is not None and st[0] == total - 7 * shared and
          answers(o) == answers(o1), f"{st} {r.stderr[-300:]} {r1.stderr[-300:]}")
    r, o = generate(q4, prompts_shared, 8, ["-n", "8", "--precise-decode"] + dev)
    r1, o1 = generate(q4, prompts_shared, 1, ["-n", "8", "--precise-decode"] + dev)
    check("opencl: --precise-decode (two int8 levels in every step): -np 8 = -np 1",
          r.returncode == 0 and r1.returncode == 0 and len(answers(o)) == 8 and answers(o) == answers(o1),
          f"{r.stderr[-300:]} {r1.stderr[-300:]}")
else:
    print("skip opencl: no OpenCL device")

print("parallel:", "FAILED " + ", ".join(failures) if failures else "ok")
sys.exit(1 if failures else 0)
