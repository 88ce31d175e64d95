#!/usr/bin/env python3
"""Batch generation's files as a hostile user finds them: one writer per output file, ids unique
within a prompt file, -o never the prompt file nor someone else's file (unless --force), a resumed run
loses no line, pipes and devices as inputs and outputs (no hang, no scan of a stream, every write error
in the exit status).

usage: batch_files.py TLLM_BINARY DEMO_MODEL"""
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

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

# tools in a chat line: rendered by the template as the server renders them (the prompt's tokens are
# `tokenize --chat`'s), the model's call read back into "tool_calls" as the server returns it
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
ROUND_TRIP = ASK + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
lines = [{"id": "required", "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 200},
         {"id": "named", "messages": ASK, "tools": [WEATHER], "max_tokens": 200,
          "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
         {"id": "auto", "messages": ASK, "tools": [WEATHER], "max_tokens": 1},
         {"id": "none", "messages": ASK, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 1},
         {"id": "trip", "messages": ROUND_TRIP, "tools": [WEATHER], "max_tokens": 1},
         {"id": "prompt", "prompt": "ls", "tools": [WEATHER]},
         {"id": "empty", "prompt": "ls", "tools": []},
         {"id": "no tools", "messages": ASK, "tool_choice": "required"},
         {"id": "bad call", "messages": [{"role": "assistant", "content": "", "tool_calls": [
             {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}]
p = put("tools.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
out = os.path.join(T, "tools.out.jsonl")
r = run(GEN + ["--prompts", p, "-o", out])
recs = {x.get("id"): x for x in records(out)} if os.path.exists(out) else {}
check("a line with tools runs", r and r.returncode == 0 and len(recs) == len(lines), f"{recs} {err(r)}")


def chat_tokens(messages, tools):
    """the prompt's token count as `tllm tokenize --chat` renders the conversation"""
    msgs = json.loads(json.dumps(messages))
    for m in msgs:
        m["content"] = m["content"] or ""
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    f = put("chat.json", json.dumps({"messages": msgs, **({"tools": tools} if tools else {})}))
    t = run(["tokenize", "-m", DEMO, "--chat", f, "--json"])
    return len(json.loads(t.stdout)["ids"]) if t and t.returncode == 0 else -1


for rid, msgs, tools in (("auto", ASK, [WEATHER]), ("none", ASK, None), ("trip", ROUND_TRIP, [WEATHER])):
    n = chat_tokens(msgs, tools)
    check(f"line {rid!r}: the prompt is the template's rendering (tools {'in' if tools else 'left out'})",
          n > 0 and recs.get(rid, {}).get("prompt_tokens") == n, f"{n} {recs.get(rid)}")
for rid in ("required", "named"):
    x = recs.get(rid, {})
    calls = x.get("tool_calls") or []
    args = None
    try:
        args = json.loads(calls[0]["function"]["arguments"]) if len(calls) == 1 else None
    except (ValueError, KeyError):
        pass
    check(f"tool_choice {rid}: the answer is a call read back as the server returns it",
          x.get("finish_reason") == "tool_calls" and len(calls) == 1 and calls[0]["type"] == "function" and
          calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "get_weather" and
          isinstance(args, dict) and list(args) == ["city"] and isinstance(args["city"], str) and
          len(args["city"]) <= 12 and x.get("text") == "", f"{x}")
check("\"tools\" with a prompt, not messages, is an error record; an empty list is none",
      '"messages", not "prompt"' in recs.get("prompt", {}).get("error", "") and "error" not in recs.get("empty", {"error": 1}),
      f"{recs.get('prompt')} {recs.get('empty')}")
check("tool_choice required without tools, and a call whose arguments are not JSON, are error records",
      "tool_choice 'required' needs 'tools'" in recs.get("no tools", {}).get("error", "") and
      "tool call 0's arguments are not JSON" in recs.get("bad call", {}).get("error", ""), f"{recs.get('no tools')} {recs.get('bad call')}")

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

# a last line without its newline is cut only when it is the start of a record of ours after records of
# ours: a foreign one (a key written with printf, through a symlink) is refused, and kept with --force
key = put("api.key", "sk-supersecret")
link = os.path.join(T, "out.link")
os.symlink(key, link)
r = run(GEN + ["--prompts", prompts, "-o", link])
check("a one-line file without a newline is refused, not emptied", r and r.returncode == 1 and
      "line 1 is not a tllm record" in err(r) and open(key).read() == "sk-supersecret", f"{open(key).read()!r} {err(r)}")
r = run(GEN + ["--prompts", prompts, "-o", link, "--force"])
lines = open(key).read().split("\n")
check("... with --force it is kept, the records on lines of their own", r and r.returncode == 0 and
      lines[0] == "sk-supersecret" and sorted(json.loads(l)["id"] for l in lines[1:] if l) == ["a", "b"], f"{lines} {err(r)}")
ours = '{"id":"a","text":" x","prompt_tokens":1,"completion_tokens":1,"finish_reason":"length"}\n'
for name, tail, want_rc, kept in [("a foreign last line after records", "not ours", 1, True),
                                  ("a torn record of ours", '{"id":"b","te', 0, False),
                                  ("a torn record, cut inside its id", '{ "i', 0, False),
                                  ("a whole record without its newline", ours.strip().replace('"a"', '"b"'), 0, True)]:
    out = put("tail.jsonl", ours + tail)
    r = run(GEN + ["--prompts", prompts, "-o", out])
    text = open(out).read()
    ok = r and r.returncode == want_rc
    if want_rc:  # refused, nothing cut
        ok = ok and text == ours + tail and "line 2 is not a tllm record" in err(r)
    else:  # every id once; the tail kept (and done) when it was a whole record, else cut
        ids = sorted(json.loads(l)["id"] for l in text.splitlines())
        ok = ok and ids == ["a", "b"] and (tail in text.splitlines()) == kept and ("2 already done" if kept else "1 already done") in err(r)
    check(name + (": kept" if kept else ": cut"), ok, f"{text!r} {err(r)}")

# a repeated id interrupted before its first line is answered: the resumed run answers that line (the
# repeat's error record does not count as an answer for the id)
q4 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "models", "q4-g64")  # no EOS: a long answer
p = put("dupint.jsonl", '{"id": "dup", "prompt": [1, 2, 3], "max_tokens": 20000}\n{"id": "dup", "prompt": [4]}\n')
out = os.path.join(T, "dupint.out")
cmd = [TLLM, "generate", "-m", q4, "--prompts", p, "-o", out, "-np", "1", "--temp", "0", "-t", "2", "-c", "20100"]
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
deadline = time.time() + 60
while time.time() < deadline and not (os.path.exists(out) and "error" in open(out).read()):
    time.sleep(0.02)
proc.send_signal(signal.SIGINT)
_, e = proc.communicate(timeout=60)
first = records(out)
check("(the run was interrupted with only the repeat's error written)", proc.returncode == 130 and len(first) == 1 and
      "error" in first[0], f"{first} {e.decode()[-300:]}")
open(p, "w").write('{"id": "dup", "prompt": [1, 2, 3], "max_tokens": 8}\n{"id": "dup", "prompt": [4]}\n')
r = run(cmd[1:])
recs = records(out)
check("a resumed run answers the first line of a repeated id, and refuses the repeat once", r and r.returncode == 0 and
      len(recs) == 2 and sum("error" in x for x in recs) == 1 and sum(len(x.get("ids", [])) == 8 for x in recs) == 1 and
      "1 answered, 1 already done" in err(r), f"{recs} {err(r)}")

# a UTF-8 byte order mark (Windows editors) before the first line: JSONL stays JSONL, text loses it
p = put("bom.jsonl", '\ufeff{"id": "a", "prompt": "ls"}\n{"id": "b", "prompt": "tar"}\n')
plain = put("nobom.jsonl", '{"id": "a", "prompt": "ls"}\n{"id": "b", "prompt": "tar"}\n')
r, r0 = run(GEN + ["--prompts", p]), run(GEN + ["--prompts", plain])
got = sorted((x["id"], x.get("prompt_tokens")) for x in map(json.loads, r.stdout.decode().splitlines())) if r else []
want = sorted((x["id"], x.get("prompt_tokens")) for x in map(json.loads, r0.stdout.decode().splitlines())) if r0 else None
check("a JSONL prompt file after a byte order mark", r and r.returncode == 0 and got == want and [g[0] for g in got] == ["a", "b"],
      f"{got} vs {want} {err(r)}")
p, plain = put("bom.txt", "\ufeffWhat does ls do?\n"), put("nobom.txt", "What does ls do?\n")
r, r0 = run(GEN + ["--prompts", p]), run(GEN + ["--prompts", plain])
check("a text prompt file after a byte order mark: the mark is not in the prompt",
      r and r0 and r.returncode == 0 and json.loads(r.stdout)["prompt_tokens"] == json.loads(r0.stdout)["prompt_tokens"] and
      json.loads(r.stdout)["text"] == json.loads(r0.stdout)["text"], err(r))

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
