"""python -m tllm.ray_batch on a local 2-CPU Ray cluster with 2 actors: 200 prompts give the records of
`tllm generate --prompts` on the same file; an actor killed mid-run (SIGKILL) costs neither a lost nor a
duplicated row; a run resumes from what an earlier one wrote. Skipped without Ray (or under the
sanitizers, whose runtime Ray's own processes would inherit)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

if os.environ.get("TLLM_TEST_SANITIZED"):
    pytest.skip("Ray's processes would inherit the sanitizers' preloaded runtime", allow_module_level=True)
pytest.importorskip("ray")
pytest.importorskip("ray.data")

REPO = os.environ.get("TLLM_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(REPO, "models", "tllm-man-demo")
CLI = os.environ.get("TLLM_CLI", os.path.join(REPO, "build", "tllm"))
N_TOKENS = "24"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ray")
    words = "the tar grep find sed awk file line print match pattern directory archive list".split()
    path = d / "prompts.jsonl"
    with open(path, "w") as f:
        for i in range(200):
            line = {"id": f"p{i}", "prompt": " ".join(words[(i * 7 + k) % len(words)] for k in range(3 + i % 9))}
            if i % 50 == 7:
                line = {"id": f"p{i}", "messages": [{"role": "user", "content": f"What does {words[i % 14]} do?"}],
                        "max_tokens": 12}
            f.write(json.dumps(line) + "\n")
        f.write(json.dumps({"id": "p3", "prompt": "a repeated id"}) + "\n")
        f.write(json.dumps({"id": "empty", "prompt": ""}) + "\n")
    want = d / "cli.jsonl"
    subprocess.run([CLI, "generate", "-m", DEMO, "--device", "cpu", "-t", "1", "--prompts", str(path), "-o", str(want),
                    "-n", N_TOKENS, "--temp", "0", "-np", "16"], check=True, capture_output=True, timeout=900)
    recs = {}
    for line in open(want):
        r = json.loads(line)
        recs.setdefault(json.dumps(r["id"]), []).append(r)
    return path, recs


def run_batch(inp, out, *extra, kill_after_parts=None):
    """The job as a user runs it; with kill_after_parts, an actor is SIGKILLed once that many batches are
    written (and the job still running). Returns (its stderr, whether an actor was killed)."""
    cmd = [sys.executable, "-m", "tllm.ray_batch", "--input", str(inp), "--output", str(out), "-m", DEMO,
           "--actors", "2", "--batch-size", "8", "-n", N_TOKENS, "--temp", "0", *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = False
    while kill_after_parts is not None and not killed and p.poll() is None:
        parts = [f for f in os.listdir(out) if f.startswith("part-") and f.endswith(".jsonl")] if os.path.isdir(out) else []
        if len(parts) >= kill_after_parts:
            for pid in actor_pids():
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
        time.sleep(0.05)
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err
    return err, killed


def actor_pids():
    """The processes of tllm's Ray Data actors (Ray names them after the class they run)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"MapWorker" in cmd and b"Generator" in cmd:
            pids.append(int(d))
    return pids


def check_output(out, want):
    recs = [json.loads(l) for l in open(os.path.join(out, "output.jsonl"))]
    by_id = {}
    for r in recs:
        by_id.setdefault(json.dumps(r["id"]), []).append(r)
    assert set(by_id) == set(want), set(by_id) ^ set(want)
    for key, rs in by_id.items():
        w = want[key]
        assert len(rs) == len(w), f"id {key}: {len(rs)} records, the CLI wrote {len(w)}"
        for r, c in zip(sorted(rs, key=lambda x: "error" in x), sorted(w, key=lambda x: "error" in x)):
            if "error" in c:
                assert "error" in r and (("empty" in c["error"]) == ("empty" in r["error"])), (r, c)
                continue
            assert r["text"] == c["text"], f"id {key}: {r['text']!r} != {c['text']!r}"
            for k in ("prompt_tokens", "completion_tokens", "finish_reason"):
                assert r[k] == c[k], (key, k, r[k], c[k])
    return recs


def test_a_row_offering_tools():
    from tllm.ray import line_item
    tools = [{"type": "function", "function": {"name": "f"}}]
    item = line_item({"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": "required"})
    assert item["tools"] == tools and item["tool_choice"] == "required"
    with pytest.raises(ValueError, match='"tools" are offered in a chat'):
        line_item({"prompt": "hi", "tools": tools})


def test_ray_batch_equals_cli_with_an_actor_killed(prompts, tmp_path):
    inp, want = prompts
    out = tmp_path / "out"
    err, killed = run_batch(inp, out, kill_after_parts=3)
    assert killed, "the job ended before an actor could be killed:\n" + err
    check_output(out, want)
    # every batch's file once: no row in two part files
    seen = {}
    for f in os.listdir(out):
        if f.startswith("part-") and f.endswith(".jsonl"):
            for line in open(out / f):
                key = json.dumps(json.loads(line)["id"])
                assert key not in seen, f"id {key} in {f} and {seen[key]}"
                seen[key] = f


def test_ray_batch_resumes(prompts, tmp_path):
    inp, want = prompts
    out = tmp_path / "out"
    run_batch(inp, out)
    parts = sorted(f for f in os.listdir(out) if f.startswith("part-"))
    for f in parts[::3]:  # as if the run had stopped before these batches
        os.remove(out / f)
    os.remove(out / "output.jsonl")
    err, _ = run_batch(inp, out)
    assert "already done" in err and " 0 to run" not in err, err
    check_output(out, want)
    err, _ = run_batch(inp, out)  # all done: nothing runs, the output is made again
    assert " 0 to run" in err, err
    check_output(out, want)
