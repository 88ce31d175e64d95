#!/usr/bin/env python3
"""The bundled demo model and model resolution, through the tllm binary.

- With no -m, generate / bench / chat run the bundled demo model and say so in one line.
- Its greedy answers about pages it was trained on hold the page's key words; for pages held out of
  training (scripts/man_dataset.py's 5%) it cannot know the content, so the test asks only that it
  answers in the trained form, naming the command (the model card says this).
- -m owner/name is found in a Hugging Face hub cache ($HF_HOME), refs/main -> snapshots/<commit>;
  TLLM_MODEL is used when -m is absent; a missing repo id fails with one line naming the cache path.

usage: demo_model.py TLLM_BINARY REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

TLLM, ROOT = sys.argv[1], sys.argv[2]
DEMO = os.path.abspath(os.path.join(ROOT, "models", "tllm-man-demo"))
failures = []

# (question, words the greedy answer must contain, case-insensitive)
SEEN = [
    ("What does grep do?", ["grep", "pattern"]),
    ("What does tar do?", ["tar", "archiv"]),
    ("What is sed?", ["sed", "stream editor"]),
    ("How do I compare files line by line?", ["diff"]),
    ("What does ls -l do?", ["long listing"]),
    ("What does find do?", ["find", "search", "director"]),
]
HELD_OUT = [  # in build/mandemo/heldout.txt: never in training
    ("What does cp do?", ["cp"]),
    ("What does less do?", ["less"]),
    ("What does git-checkout do?", ["git-checkout"]),
]


def run(args, env=None, stdin=None):
    e = dict(os.environ)
    e.pop("TLLM_MODEL", None)
    e.update(env or {})
    return subprocess.run([TLLM] + args, capture_output=True, text=True, env=e, input=stdin, timeout=600)


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def answers():
    for q, words in SEEN + HELD_OUT:
        r = run(["generate", "--chat", "-p", q, "-n", "96", "--temp", "0", "-t", "2"])
        check(r.returncode == 0, f"{q}: exit {r.returncode}: {r.stderr.strip()}")
        # the first stderr line says which model runs
        first = r.stderr.splitlines()[0] if r.stderr else ""
        check("bundled demo model" in first and "tllm-man-demo" in first, f"{q}: no line naming the demo model: {first!r}")
        ans = r.stdout.strip()
        print(f"  {q!r} -> {ans.splitlines()[0] if ans else ''!r}")
        for w in words:
            check(w.lower() in ans.lower(), f"{q}: answer lacks {w!r}: {ans!r}")
        held = (q, words) in HELD_OUT
        if held:  # the trained form: "name - what it does."
            check(" - " in ans.splitlines()[0] if ans else False, f"{q}: not in the NAME-line form: {ans!r}")


def chat_and_bench():
    r = run(["chat", "-n", "64", "--temp", "0"], stdin="What does grep do?\n")
    check(r.returncode == 0 and "pattern" in r.stdout, f"chat without -m: exit {r.returncode}, {r.stdout!r} {r.stderr!r}")
    r = run(["bench", "-p", "16", "-n", "8", "-r", "1", "-t", "1", "-o", "json"])
    rows = json.loads(r.stdout) if r.returncode == 0 else []
    check(any(row.get("n_gen") == 8 for row in rows),
          f"bench without -m: exit {r.returncode}: {r.stdout[:200]!r} {r.stderr.strip()!r}")


def resolution():
    with tempfile.TemporaryDirectory() as home:
        hub = os.path.join(home, "hub")
        repo = os.path.join(hub, "models--tllm--man-demo")
        commit = "0123456789abcdef0123456789abcdef01234567"
        snap = os.path.join(repo, "snapshots", commit)
        os.makedirs(snap)
        os.makedirs(os.path.join(repo, "refs"))
        with open(os.path.join(repo, "refs", "main"), "w") as f:
            f.write(commit)
        for name in os.listdir(DEMO):  # the hub cache holds symlinks into blobs/
            os.symlink(os.path.join(DEMO, name), os.path.join(snap, name))
        env = {"HF_HOME": home, "HF_HUB_CACHE": ""}

        r = run(["info", "-m", "tllm/man-demo"], env)
        check(r.returncode == 0 and snap in r.stdout, f"-m owner/name from HF_HOME: {r.returncode} {r.stdout[:300]!r} {r.stderr!r}")
        r = run(["info", "-m", f"tllm/man-demo@{commit}"], env)
        check(r.returncode == 0 and snap in r.stdout, f"-m owner/name@commit: {r.returncode} {r.stderr!r}")
        r = run(["info"], dict(env, TLLM_MODEL="tllm/man-demo"))
        check(r.returncode == 0 and snap in r.stdout and "from TLLM_MODEL" in r.stderr,
              f"TLLM_MODEL=owner/name: {r.returncode} {r.stderr!r}")
        r = run(["info"], {"TLLM_MODEL": DEMO})
        check(r.returncode == 0 and "bundled demo" not in r.stderr, f"TLLM_MODEL=DIR: {r.returncode} {r.stderr!r}")

        r = run(["info", "-m", "Qwen/Qwen2.5-0.5B-Instruct"], env)
        want = f"tllm: Qwen/Qwen2.5-0.5B-Instruct: not a directory, and not in the Hugging Face cache (no {hub}/models--Qwen--Qwen2.5-0.5B-Instruct"
        check(r.returncode == 1 and r.stderr.startswith(want) and r.stderr.count("\n") == 1,
              f"missing repo id: {r.returncode} {r.stderr!r}")
        os.unlink(os.path.join(repo, "refs", "main"))
        os.makedirs(os.path.join(repo, "snapshots", "fedcba"))
        r = run(["info", "-m", "tllm/man-demo"], env)
        check(r.returncode == 1 and "more than one snapshot and no refs/main" in r.stderr, f"two snapshots: {r.stderr!r}")
        r = run(["info", "-m", "tllm/man-demo@nope"], env)
        check(r.returncode == 1 and "revision 'nope'" in r.stderr, f"bad revision: {r.stderr!r}")
        r = run(["info", "-m", "no/such/dir"], env)
        check(r.returncode == 1 and "no/such/dir: cannot open model directory" in r.stderr, f"bad path: {r.stderr!r}")


answers()
chat_and_bench()
resolution()
print("demo_model:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
sys.exit(1 if failures else 0)
