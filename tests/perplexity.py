#!/usr/bin/env python3
"""tllm perplexity against the same numbers computed here from `tllm logits` (float32 activations and
cache, every position's logits): llama-perplexity's chunks and Hugging Face's sliding windows, the
running estimates, the final value and its standard error; and its errors.

usage: perplexity.py TLLM DEMO_MODEL"""
import array, json, math, os, re, subprocess, sys, tempfile

TLLM, DEMO = sys.argv[1], sys.argv[2]
from checks import check, finish


def run(*args):
    return subprocess.run([TLLM, *args], capture_output=True, timeout=300)


TEXT = ("The ls command lists the files of a directory. With -l it shows their permissions, owners, sizes and "
        "times; with -a it also shows the files whose names begin with a dot. The cp command copies files, and "
        "mv moves or renames them; rm removes them for good.")
tmp = tempfile.mkdtemp(prefix="tllm-ppl-")
path = os.path.join(tmp, "text.txt")
open(path, "w").write(TEXT)
ids = json.loads(run("tokenize", "-m", DEMO, "--no-special", "--json", TEXT).stdout)["ids"]
n = len(ids)
out = os.path.join(tmp, "logits.f32")
r = run("logits", "-m", DEMO, "--ids", ",".join(map(str, ids)), "-o", out)
check(r.returncode == 0, "logits: " + r.stderr.decode()[-300:])
vocab = 151936
flat = array.array("f")
flat.frombytes(open(out, "rb").read())
check(len(flat) == n * vocab, "logits size")


def nll(pos):
    """-log p(ids[pos + 1] | ids[..pos]) from the row of position pos."""
    row = flat[pos * vocab:(pos + 1) * vocab]
    mx = max(row)
    return math.log(sum(math.exp(v - mx) for v in row)) + mx - row[ids[pos + 1]]


cache = {}


def score(pairs):
    """The running estimates and the final (ppl, err) over windows of scored positions. Note: a window
    starting at 0 gives the same logits as the full sequence's prefix (causal attention)."""
    vals, running = [], []
    for w in pairs:
        for pos in w:
            if pos not in cache:
                cache[pos] = nll(pos)
            vals.append(cache[pos])
        running.append(math.exp(sum(vals) / len(vals)))
    mean = sum(vals) / len(vals)
    var = sum(v * v for v in vals) / len(vals) - mean * mean
    return running, math.exp(mean), math.exp(mean) * math.sqrt(var / (len(vals) - 1))


def parse(stdout):
    m = re.search(rb"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", stdout)
    est = [float(x) for x in re.findall(rb"\[\d+\]([\d.]+),", stdout)]
    return est, (float(m.group(1)), float(m.group(2))) if m else (None, None)


def close(a, b, rel=1e-6):
    """Equal but for the print's rounding (4 and 5 decimals) where both sides sum the same float32 logits
    in double; `rel` where they do not."""
    return a is not None and abs(a - b) <= rel * abs(b) + 1e-4


# llama-perplexity's chunks: windows of c side by side, each scoring its second half. Only the first
# window's logits equal the full sequence's (later windows start afresh), so one window is compared
# exactly here and the count of windows checked beside it.
c = n // 2 * 2
r = run("perplexity", "-m", DEMO, "-f", path, "-c", str(c), "--exact", "--kv-type", "f32", "-t", "2")
check(r.returncode == 0, "perplexity: " + r.stderr.decode()[-300:])
est, (ppl, err) = parse(r.stdout)
want_run, want_ppl, want_err = score([range(c // 2, c - 1)])  # llama-perplexity's: after the middle token
check(len(est) == 1 and close(ppl, want_ppl) and close(err, want_err),
      "chunks: %s %s %s, want %s %s" % (est, ppl, err, want_ppl, want_err))

# Hugging Face's sliding windows: windows of c, s apart; window w's logits differ from the full
# sequence's once it starts past 0, so compare with one window of the whole text and stride >= n
r = run("perplexity", "-m", DEMO, "-f", path, "-c", str(n), "--stride", str(n), "--exact", "--kv-type", "f32", "-t", "2")
est, (ppl, err) = parse(r.stdout)
_, want_ppl, want_err = score([range(0, n - 1)])
check(r.returncode == 0 and close(ppl, want_ppl) and close(err, want_err),
      "one sliding window: %s %s, want %s %s" % (ppl, err, want_ppl, want_err))
# several windows: their count, and a running estimate per window
r = run("perplexity", "-m", DEMO, "-f", path, "-c", "16", "--stride", "8", "-t", "2")
est, (ppl, err) = parse(r.stdout)
check(r.returncode == 0 and len(est) == (n - 16 + 7) // 8 + 1 and ppl == est[-1] and ppl > 1,
      "sliding windows: %d estimates for %d tokens: %s" % (len(est), n, r.stdout[-200:]))
# the int8 default is close to the float path (the cost of int8 activations, measured here)
r8 = run("perplexity", "-m", DEMO, "-f", path, "-c", str(c), "-t", "2")
p8 = parse(r8.stdout)[1][0]
check(r8.returncode == 0 and close(p8, want_run[0], 5e-2), "int8 activations: %s against %s" % (p8, want_run[0]))
print("perplexity: float %.4f, int8 %.4f (%.2f%%)" % (want_run[0], p8 or 0, 100 * ((p8 or 0) / want_run[0] - 1)))

# on an OpenCL device (PoCL in CI): the scored predictions are device decode steps, float32 activations;
# the same chunk's estimate as the CPU's within the device's float error (skipped without a device)
rd = run("perplexity", "-m", DEMO, "-f", path, "-c", str(c), "--exact", "--device", "opencl", "-t", "2")
if b"running on the CPU" in rd.stderr:
    print("perplexity: no OpenCL device, the device case skipped")
else:
    pd = parse(rd.stdout)[1][0]
    check(rd.returncode == 0 and close(pd, want_run[0], 1e-3),
          "--device opencl: %s against %s: %s" % (pd, want_run[0], rd.stderr[-300:]))
    print("perplexity: device %.4f against the CPU's %.4f" % (pd or 0, want_run[0]))

# errors: one line each
for args, want in ((["-f", path, "-c", "4096"], "fewer than one window of 4096"),
                   (["-f", os.path.join(tmp, "none.txt")], "none.txt"),
                   (["-f", path, "-c", "8", "--stride", "9"], "--stride 9: longer than the window (-c 8)"),
                   ([], "-f TEXT is required")):
    r = run("perplexity", "-m", DEMO, *args)
    check(r.returncode == 1 and want.encode() in r.stderr, "%s: %s" % (args, r.stderr.decode()[-200:]))
finish("perplexity")
