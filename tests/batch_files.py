#!/usr/bin/env python3
"""Batch generation's files as a hostile user finds them: one writer per output file, ids unique
within a prompt file, -o never the prompt file nor someone else's file (unless --force), pipes and
devices as inputs and outputs (no hang, no scan of a stream, every write error in the exit status).

usage: batch_files.py TLLM_BINARY DEMO_MODEL"""
import fcntl
import json
import os
import subprocess
import sys
import tempfile

TLLM, DEMO = sys.argv[1], sys.argv[2]
T = tempfile.mkdtemp(prefix="tllm-batch-")
failures = []
GEN = ["generate", "-m", DEMO, "-n", "2", "--temp", "0", "-t", "2"]


def run(args, stdin=None, stdout=subprocess.PIPE, timeout=120):
    env = dict(os.environ)
    env.pop("TLLM_MODEL", None)
    try:
        return subprocess.run([TLLM] + args, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def check(name, cond, detail=""):
    if cond:
        print(f"ok   {name}")
    else:
        failures.append(name)
        print(f"FAIL {name}: {detail}")


def put(name, text):
    p = os.path.join(T, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def records(path):
    with open(path) as f:
        return [json.loads(l) for l in f]


def err(r):
    return r.stderr.decode("utf-8", "replace") if r else "(timed out)"


prompts = put("p.jsonl", '{"id": "a", "prompt": "ls"}\n{"id": "b", "prompt": "tar"}\n')

# one writer per output file: a second one is refused while the first holds the lock
out = os.path.join(T, "locked.jsonl")
with open(out, "a") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    r = run(GEN + ["--prompts", prompts, "-o", out])
check("a second writer of the same -o is refused", r and r.returncode == 1 and
      f"tllm: {out}: another tllm generate is writing to it" in err(r), err(r))
r = run(GEN + ["--prompts", prompts, "-o", out])
check("and runs once the lock is free", r and r.returncode == 0 and len(records(out)) == 2, err(r))

# ids: a line whose (default) id another line has is an error naming both lines, never skipped
p = put("dup.jsonl", '{"id": 2, "prompt": "ls"}\n{"prompt": "tar"}\n{"id": null, "prompt": "cat"}\n{"id": [1], "prompt": "cp"}\n')
out = os.path.join(T, "dup.out.jsonl")
r = run(GEN + ["--prompts", p, "-o", out])
recs = records(out) if os.path.exists(out) else []
got = [(x.get("id"), "error" in x, x.get("error", "")) for x in recs]
# records are written as prompts finish (several run at once), so they are found by id, not by order
check("a colliding id is an error record naming the other line", r and r.returncode == 0 and len(recs) == 4 and
      any(g[:2] == (2, False) for g in got) and any(g[:2] == (2, True) and "also line 1's" in g[2] for g in got),
      f"{got} {err(r)}")
check("a null or non-scalar id is an error record", len(recs) == 4 and
      any(g[0] is None and g[1] and "null" in g[2] for g in got) and
      any(g[0] == [1] and g[1] and '"id" must be' in g[2] for g in got), f"{got}")
r = run(GEN + ["--prompts", p, "-o", out])
check("a resume answers nothing twice", r and r.returncode == 0 and len(records(out)) == 4 and "4 already done" in err(r),
      f"{len(records(out))} records; {err(r)}")

# -o the prompt file itself: refused, the prompt file untouched
before = open(prompts, "rb").read()
r = run(GEN + ["--prompts", prompts, "-o", prompts])
check("-o the prompt file is refused", r and r.returncode == 1 and "is the prompt file itself" in err(r) and
      open(prompts, "rb").read() == before, err(r))
link = os.path.join(T, "link.jsonl")
os.symlink(prompts, link)
r = run(GEN + ["--prompts", prompts, "-o", link])
check("... also through a symlink", r and r.returncode == 1 and open(prompts, "rb").read() == before, err(r))

# someone else's file: refused (nothing cut off); with --force appended after it, its lines kept
other = put("notes.txt", "my notes\nlast line without newline")
r = run(GEN + ["--prompts", prompts, "-o", other])
check("-o an unrelated file is refused", r and r.returncode == 1 and "line 1 is not a tllm record" in err(r) and
      open(other).read() == "my notes\nlast line without newline", err(r))
r = run(GEN + ["--prompts", prompts, "-o", other, "--force"])
lines = open(other).read().split("\n")
check("--force appends after it and keeps every line", r and r.returncode == 0 and lines[:2] == ["my notes", "last line without newline"] and
      sorted(json.loads(l).get("id") for l in lines[2:] if l) == ["a", "b"], f"{lines} {err(r)}")

# streams and devices
if os.path.exists("/dev/full"):
    r = run(GEN + ["--prompts", prompts, "-o", "/dev/full"], timeout=60)
    check("-o /dev/full fails with the write error", r and r.returncode == 1 and
          "tllm: /dev/full: write failed: No space left on device" in err(r), err(r))
r = run(GEN + ["--prompts", prompts, "-o", "/dev/null"], timeout=60)
check("-o /dev/null writes straight through", r and r.returncode == 0 and "2 answered" in err(r), err(r))
r = run(GEN + ["--prompts", prompts, "-o", "/dev/stdout"], timeout=60)
outs = r.stdout.decode().splitlines() if r else []
check("-o /dev/stdout into a pipe", r and r.returncode == 0 and sorted(json.loads(l)["id"] for l in outs) == ["a", "b"], err(r))
with open(prompts, "rb") as f:
    data = f.read()
for spec in ("/dev/stdin", "-"):
    r = subprocess.run([TLLM] + GEN + ["--prompts", spec], input=data, capture_output=True, timeout=120)
    outs = r.stdout.decode().splitlines()
    check(f"--prompts {spec} from a pipe is read once", r.returncode == 0 and sorted(json.loads(l)["id"] for l in outs) == ["a", "b"] and
          "2 answered" in err(r), err(r))
r = run(GEN + ["--prompts", "/dev/zero"], timeout=60)
check("--prompts /dev/zero ends with a message", r and r.returncode == 1 and "has no end in sight" in err(r), err(r))

print("batch_files:", "FAILED " + ", ".join(failures) if failures else "ok")
sys.exit(1 if failures else 0)
