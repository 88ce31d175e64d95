#!/usr/bin/env python3
"""tllm generate / chat / bench / info from the outside, as users drive them.

usage: cli_frontends.py TLLM DATA_DIR [SHARED_FIXTURES_DIR]
A small random model with the real Qwen2.5 vocabulary and tokenizer is synthesized for the tests
that need text; the reference continuations of the shared fixtures are checked when present."""
import json, os, pty, select, shutil, signal, subprocess, sys, tempfile, time

TLLM, DATA = sys.argv[1], sys.argv[2]
SHARED = sys.argv[3] if len(sys.argv) > 3 else None
from checks import check, finish


def run(*args, input=None, timeout=120):
    return subprocess.run([TLLM, *args], input=input, capture_output=True, timeout=timeout)


tmp = tempfile.mkdtemp(prefix="tllm-frontends-")
try:
    # a tiny model with the full vocabulary, so text goes in and out
    cfg = json.load(open(os.path.join(DATA, "models/q4-g64/config.json")))
    cfg.update(vocab_size=151936, hidden_size=64, intermediate_size=128, num_attention_heads=2,
               num_key_value_heads=1, eos_token_id=151645)
    cfg.pop("quantization", None), cfg.pop("quantization_config", None)
    json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
    model = os.path.join(tmp, "model")
    r = run("synth", "--config", os.path.join(tmp, "config.json"), "--out", model, "--bits", "4",
            "--group-size", "32", "--seed", "5", "--tokenizer", os.path.join(DATA, "tokenizer"))
    check(r.returncode == 0, "synth: " + r.stderr.decode())
    # greedy, no penalty: deterministic
    greedy = ["-m", model, "--temp", "0", "--repeat-penalty", "1"]

    # the lm_head has 151936 rows, the tokenizer 151665 ids: a padding row is never sampled (nearly
    # uniform sampling over 3000 tokens would take one about 99.5% of the time) and generation goes on
    r = run("generate", "-m", model, "-p", "Hello", "-n", "3000", "-c", "3100", "--temp", "100", "--top-k", "0",
            "--top-p", "1", "--min-p", "0", "--seed", "7", "--json")
    check(r.returncode == 0, "sampling at --temp 100: " + r.stderr.decode()[-300:])
    if r.returncode == 0:
        ids = json.loads(r.stdout)["ids"]
        check(len(ids) == 3000 and max(ids) < 151665, "sampled %d ids, largest %d" % (len(ids), max(ids)))
    # greedy never takes a padding row either, on the CPU or a device: a copy of the model whose rows
    # 151700 and 151701 (past the tokenizer's 151665 ids) score +-65536 x sum(h), so one of them would win
    import struct
    pad = os.path.join(tmp, "padmodel")
    shutil.copytree(model, pad)
    st = os.path.join(pad, "model.safetensors")
    raw = bytearray(open(st, "rb").read())
    hlen = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    for name, val in (("scales", 0x0000), ("biases", None)):
        t = hdr["model.embed_tokens." + name]
        width = t["shape"][1] * 2  # bf16 per group
        for row, sign in ((151700, 0), (151701, 0x8000)):
            at = base + t["data_offsets"][0] + row * width
            word = val if val is not None else (0x4780 | sign)  # bf16 65536, positive then negative
            raw[at:at + width] = struct.pack("<H", word) * (width // 2)
    open(st, "wb").write(raw)
    outs = {}
    for dev in ("cpu", "opencl:0") if "opencl:0" in run("devices").stdout.decode() else ("cpu",):
        r = run("generate", "-m", pad, "-p", "Hello", "-n", "8", "--temp", "0", "--json", "--device", dev)
        ids = json.loads(r.stdout)["ids"] if r.returncode == 0 else []
        outs[dev] = ids
        check(r.returncode == 0 and len(ids) == 8 and max(ids) < 151665, "greedy with winning padding rows on %s: %s %s" %
              (dev, ids, r.stderr.decode()[-200:]))
    check(len(set(map(tuple, outs.values()))) == 1, "greedy ids differ between CPU and device: %s" % outs)
    # -t past the CPUs this process may use: said, lowered, and it runs
    r = run("generate", "-m", model, "-p", "Hello", "-n", "2", "-t", "1024")
    check(r.returncode == 0 and b"-t 1024: this process may use" in r.stderr, "-t 1024: " + r.stderr.decode()[-300:])

    def gen_json(*extra):
        r = run("generate", *greedy, "--json", *extra)
        check(r.returncode == 0, "generate %s: %s" % (extra, r.stderr.decode()))
        return json.loads(r.stdout) if r.returncode == 0 else {}

    # -- generate: --json has every field; streaming text equals the JSON text
    o = gen_json("-p", "Hello", "-n", "24")
    for k in ("ids", "text", "finish_reason", "prompt_tokens", "completion_tokens", "prompt_tps", "gen_tps",
              "load_secs", "peak_rss_bytes"):
        check(k in o, "--json lacks " + k)
    check(o.get("finish_reason") == "length" and len(o.get("ids", [])) == 24, "-n 24: %s" % o.get("finish_reason"))
    r = run("generate", *greedy, "-p", "Hello", "-n", "24")
    check(r.stdout.decode().rstrip("\n") == o.get("text"), "streamed text differs from --json text")
    check(b"tok/s" in r.stderr and b"peak memory" in r.stderr, "statistics on stderr")
    # seeded sampling reproducible; top-k 1 equals greedy
    s1 = run("generate", "-m", model, "-p", "Hello", "-n", "16", "--temp", "1", "--seed", "3", "--json")
    s2 = run("generate", "-m", model, "-p", "Hello", "-n", "16", "--temp", "1", "--seed", "3", "--json")
    check(json.loads(s1.stdout)["ids"] == json.loads(s2.stdout)["ids"], "same seed, different output")
    k1 = run("generate", "-m", model, "-p", "Hello", "-n", "24", "--temp", "1.3", "--top-k", "1",
             "--repeat-penalty", "1", "--json")
    check(json.loads(k1.stdout)["ids"] == o.get("ids"), "top-k 1 differs from greedy")

    # -- stop strings: one that spans two tokens ends generation before it, and is not printed
    ids = o.get("ids", [])
    pieces = [run("tokenize", "-m", model, "--decode", str(i)).stdout.decode("utf-8", "replace") for i in ids]
    full = o.get("text", "")
    span = None
    for i in range(2, len(pieces) - 1):
        a, b = pieces[i], pieces[i + 1]
        if len(a) >= 2 and len(b) >= 2 and "\ufffd" not in a + b:
            stop = a[-2:] + b[:2]
            if full.find(stop) == len("".join(pieces[:i])) + len(a) - 2:  # first occurrence is this one
                span = (stop, full[:full.find(stop)])
                break
    check(span is not None, "no stop string spanning two tokens found in %r" % full)
    if span:
        so = gen_json("-p", "Hello", "-n", "24", "--stop", span[0])
        check(so.get("text") == span[1] and so.get("finish_reason") == "stop",
              "stop %r: got %r (%s), want %r" % (span[0], so.get("text"), so.get("finish_reason"), span[1]))
        sr = run("generate", *greedy, "-p", "Hello", "-n", "24", "--stop", span[0])
        check(sr.stdout.decode().rstrip("\n") == span[1], "streamed text shows (part of) the stop string")
    # context full is reported, never written past
    co = gen_json("-p", "Hello", "-n", "-1", "-c", "12")
    # the last sampled token needs no cache slot: at most n_ctx + 1 tokens, n_ctx of them cached
    check(co.get("finish_reason") == "length" and co.get("prompt_tokens", 0) + len(co.get("ids", [])) == 13,
          "context-full finish: %s" % co)
    r = run("generate", *greedy, "-p", "Hello", "-n", "-1", "-c", "12")
    check(b"the context is full (12 tokens)" in r.stderr, "context full not reported: " + r.stderr.decode())
    # --prompt-ids on a checkpoint without tokenizer
    r = run("generate", "-m", os.path.join(DATA, "models/q4-g64"), "--prompt-ids", "3924,2072", "-n", "4", "--temp", "0")
    check(r.returncode == 0 and r.stdout.decode().count(",") == 3, "--prompt-ids: %r" % r.stdout)

    # -- batch: good and bad lines, every line answered, resume after an interruption loses nothing
    lines = [json.dumps({"id": "a", "prompt": "Hello", "max_tokens": 5}),
             "this is not json",
             json.dumps({"id": 7, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}),
             json.dumps({"id": "bad-type", "prompt": "x", "max_tokens": "many"}),
             json.dumps({"prompt": "Once", "max_tokens": 4, "stop": ["zzz"], "seed": 1}),
             json.dumps({"id": "empty", "prompt": ""}),
             json.dumps({"id": "b", "prompt": "Bye", "max_tokens": 2})]
    pfile, out = os.path.join(tmp, "prompts.jsonl"), os.path.join(tmp, "out.jsonl")
    open(pfile, "w").write("\n".join(lines) + "\n")
    r = run("generate", *greedy, "--prompts", pfile, "-o", out)
    check(r.returncode == 0, "batch: " + r.stderr.decode())
    recs = [json.loads(l) for l in open(out)]
    by_id = {json.dumps(x["id"]): x for x in recs}
    check(len(recs) == 7 and len(by_id) == 7, "batch: %d records for 7 lines" % len(recs))
    for good, n in (('"a"', 5), ("7", 3), ("5", 4), ('"b"', 2)):
        x = by_id.get(good, {})
        check("text" in x and x.get("completion_tokens", -1) <= n and "finish_reason" in x, "batch line %s: %s" % (good, x))
    for bad in ("2", '"bad-type"', '"empty"'):
        check("error" in by_id.get(bad, {}), "bad line %s not reported: %s" % (bad, by_id.get(bad)))
    # interrupted run: drop the last two records and leave a torn line; the re-run completes the file
    kept = open(out).read().splitlines()[:5]
    open(out, "w").write("\n".join(kept) + "\n" + '{"id": "b", "te')
    r = run("generate", *greedy, "--prompts", pfile, "-o", out)
    recs2 = [json.loads(l) for l in open(out)]  # written as prompts finish: compared by id
    check(sorted(json.dumps(x["id"]) for x in recs2) == sorted(by_id), "resume: ids %s" % [x["id"] for x in recs2])
    redone = {json.dumps(x["id"]): x for x in recs2[5:]}
    check(redone and all(redone[k].get("text") == by_id[k].get("text") for k in redone), "resumed lines differ")
    check(b"5 already done" in r.stderr, "resume did not skip the done ids: " + r.stderr.decode())
    # plain text prompt file: one line each, empty line reported
    open(pfile, "w").write("Hello\n\nBye\n")
    r = run("generate", *greedy, "-n", "3", "--prompts", pfile)
    recs = [json.loads(l) for l in r.stdout.decode().splitlines()]
    by_line = {x["id"]: x for x in recs}
    check(sorted(by_line) == [1, 2, 3] and "error" in by_line[2] and "text" in by_line[3], "plain prompts: %s" % recs)
    r = run("generate", "-m", model, "--prompts", os.devnull)
    check(r.returncode != 0 and b"the prompt file is empty" in r.stderr, "empty prompt file")

    # -- the OpenCL build on PoCL (when there is a device): the first run says it compiles, the driver's
    # compiler chatter stays out of stderr, and the next run neither compiles nor says so
    devs = run("devices").stdout.decode()
    if "opencl:0" in devs:
        cache, pocl = os.path.join(tmp, "clcache"), os.path.join(tmp, "poclcache")
        # a cold PoCL cache makes PoCL's LLVM compile, which leaks memory of its own: under the sanitizer
        # build LeakSanitizer would fail these two runs for it (tllm's leaks are checked by every other run)
        asan = os.environ.get("ASAN_OPTIONS", "")
        env_cl = dict(os.environ, TLLM_CL_CACHE=cache, POCL_CACHE_DIR=pocl, ASAN_OPTIONS=(asan + ":" if asan else "") + "detect_leaks=0")
        cmd = [TLLM, "generate", "-m", os.path.join(DATA, "models/q4-g64"), "--prompt-ids", "1,2", "-n", "2", "--device", "opencl:0"]
        r1 = subprocess.run(cmd, capture_output=True, env=env_cl, timeout=600)
        r2 = subprocess.run(cmd, capture_output=True, env=env_cl, timeout=600)
        e1, e2 = r1.stderr.decode(), r2.stderr.decode()
        check(r1.returncode == 0 and "tllm: opencl: compiling the kernels for" in e1, "first OpenCL run: " + e1)
        check("warning generated" not in e1 and "warning" not in e2, "compiler chatter on stderr: " + e1)
        check(r2.returncode == 0 and "compiling" not in e2 and r2.stdout == r1.stdout, "second OpenCL run: " + e2)
    else:
        print("no OpenCL device: the build note and cache are not checked")

    # -- chat through a pipe: one user turn, the reply, exit
    r = run("chat", *greedy, "-n", "8", input=b"Hello there")
    check(r.returncode == 0 and r.stdout.endswith(b"\n"), "chat pipe: %r %r" % (r.stdout, r.stderr))
    cj = os.path.join(tmp, "msgs.json")
    json.dump([{"role": "user", "content": "Hello there"}], open(cj, "w"))
    ref = json.loads(run("tokenize", "-m", model, "--chat", cj, "--json").stdout)["ids"]
    g = run("generate", *greedy, "--prompt-ids", ",".join(map(str, ref)), "-n", "8", "--json")
    check(r.stdout.decode()[:-1] == json.loads(g.stdout)["text"], "chat reply differs from the same chat via generate")

    # -- chat under a pseudo-terminal: commands, turns, Ctrl-C stopping a long reply, Ctrl-D
    env = dict(os.environ, HOME=tmp, TERM="dumb")

    class Pty:
        def __init__(self, *args, fsize=None):
            self.pid, self.fd = pty.fork()
            if self.pid == 0:
                if fsize is not None:  # files it writes may hold this many bytes (a full disk, in effect)
                    import resource
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
                os.execve(TLLM, [TLLM, "chat", *greedy, *args], env)
            self.buf = b""
            self.all = b""  # everything it printed

        def send(self, data):
            os.write(self.fd, data)

        def expect(self, pat, secs=120):
            end = time.time() + secs
            while time.time() < end:
                if pat in self.buf:
                    self.buf = self.buf[self.buf.index(pat) + len(pat):]
                    return True
                if select.select([self.fd], [], [], 0.2)[0]:
                    try:
                        data = os.read(self.fd, 65536)
                        self.buf += data
                        self.all += data
                    except OSError:
                        break
            return False

        def leave(self):  # Ctrl-D, draining the pty while it exits
            self.send(b"\x04")
            status, end = None, time.time() + 60
            while status is None and time.time() < end:
                if select.select([self.fd], [], [], 0.1)[0]:
                    try:
                        os.read(self.fd, 65536)
                    except OSError:
                        pass
                done, st = os.waitpid(self.pid, os.WNOHANG)
                status = st if done else None
            if status is None:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            os.close(self.fd)
            return status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

    c = Pty("-n", "16")
    check(c.expect(b"> "), "no prompt under a pty")
    c.send(b"/help\r")
    check(c.expect(b"/reset"), "/help")
    check(c.expect(b"> "), "no prompt after /help")
    c.send(b"Hello\r")
    check(c.expect(b"\n> "), "no prompt after a reply")
    c.send(b"/stats\r")
    check(c.expect(b"generated"), "/stats")
    c.send(b"/save " + os.path.join(tmp, "conv.json").encode() + b"\r")
    check(c.expect(b"saved 2 messages"), "/save")
    c.send(b"/reset\r")
    check(c.expect(b"new conversation"), "/reset")
    c.send(b"first line\\\r")  # a trailing backslash continues the message
    check(c.expect(b"... "), "multi-line continuation prompt")
    c.send(b"second line\r")
    check(c.expect(b"\n> "), "no prompt after a multi-line message")
    c.send(b"/load " + os.path.join(tmp, "conv.json").encode() + b"\r")
    check(c.expect(b"loaded 2 messages"), "/load")
    check(c.expect(b"> "), "no prompt after /load")
    check(c.leave(), "chat did not leave on Ctrl-D")
    check(os.path.exists(os.path.join(tmp, ".tllm_history")) and
          b"Hello" in open(os.path.join(tmp, ".tllm_history"), "rb").read(), "history file not kept")

    # /save over an earlier save when the disk fills: an error, and the earlier save still whole
    saved = open(os.path.join(tmp, "conv.json")).read()
    c = Pty("-n", "16", fsize=64)
    check(c.expect(b"> "), "no prompt under a pty")
    c.send(b"Hello again, a message long enough that its save needs more than sixty-four bytes\r")
    check(c.expect(b"\n> "), "no prompt after a reply")
    c.send(b"/save " + os.path.join(tmp, "conv.json").encode() + b"\r")
    check(c.expect(b"write failed"), "/save on a full disk: no error")
    check(c.expect(b"> "), "no prompt after a failed /save")
    check(c.leave(), "chat did not leave on Ctrl-D after a failed /save")
    check(open(os.path.join(tmp, "conv.json")).read() == saved, "a failed /save damaged the earlier save")

    # a small context: the reply reserve leaves room for history (not the whole context), and a
    # message that cannot fit is refused without dropping the conversation
    c = Pty("-c", "256", "-n", "8")
    check(c.expect(b"> "), "no prompt under a pty")
    for msg in (b"Hello", b"How are you", b"Fine thanks"):
        c.send(msg + b"\r")
        check(c.expect(b"\n> "), "no prompt after a reply at -c 256")
    c.send(b"word " * 400 + b"\r")
    check(c.expect(b"does not fit in the context"), "a message longer than the context was not refused")
    check(c.expect(b"> "), "no prompt after a refused message")
    c.send(b"/save " + os.path.join(tmp, "small.json").encode() + b"\r")
    check(c.expect(b"saved 6 messages"), "the history was not kept after a refused message")
    check(c.expect(b"> "), "no prompt after /save")
    check(c.leave(), "chat -c 256 did not leave on Ctrl-D")
    check(b"dropped" not in c.all, "history dropped at -c 256 with room to spare")
    r = run("chat", *greedy, "-c", "64", "-n", "4", input=b"word " * 400)
    check(r.returncode == 1 and b"does not fit" in r.stderr, "piped chat that fails: exit %d %r" % (r.returncode, r.stderr))

    # replies run until the context is full: 32768 positions take this tiny model many seconds (4096
    # took under one once decode got faster)
    c = Pty("-c", "32768")
    check(c.expect(b"> "), "no prompt under a pty")
    c.send(b"Tell me a very long story\r")
    time.sleep(0.5)
    c.send(b"\x03")  # Ctrl-C: stop the reply, stay in the program
    check(c.expect(b"[stopped]"), "Ctrl-C did not stop the reply")
    check(c.expect(b"> "), "no prompt after Ctrl-C")
    c.send(b"/stats\r")
    check(c.expect(b"interrupted"), "/stats after Ctrl-C")
    check(c.expect(b"> "), "no prompt after /stats")
    check(c.leave(), "chat did not leave on Ctrl-D after Ctrl-C")

    # -- bench: JSON parses and has llama-bench's fields; md and csv print
    r = run("bench", "-m", model, "-p", "16", "-n", "8", "-r", "2", "-t", "1,2", "-o", "json")
    check(r.returncode == 0, "bench: " + r.stderr.decode())
    b = json.loads(r.stdout) if r.returncode == 0 else []
    check(len(b) == 4, "bench: %d results for 2 tests x 2 thread counts" % len(b))
    for x in b:
        for k in ("n_prompt", "n_gen", "n_threads", "backend", "model_size", "model_n_params", "avg_ts",
                  "stddev_ts", "samples_ts", "avg_ns", "samples_ns"):
            check(k in x, "bench JSON lacks " + k)
        check(x.get("avg_ts", 0) > 0 and len(x.get("samples_ts", [])) == 2, "bench samples")
    check(any("effective_bandwidth_gbs" in x for x in b if x.get("n_gen")), "tg lacks the effective bandwidth")
    r = run("bench", "-m", model, "-p", "8", "-n", "4", "-r", "1", "-o", "csv")
    check(r.returncode == 0 and r.stdout.decode().count("\n") == 3, "bench csv")
    # -d: each test after that many tokens already in the context (llama-bench's n_depth)
    r = run("bench", "-m", model, "-p", "8", "-n", "4", "-d", "0,20", "-r", "1", "-o", "json")
    b = json.loads(r.stdout) if r.returncode == 0 else []
    check(sorted((x["n_prompt"], x["n_gen"], x["n_depth"]) for x in b) == [(0, 4, 0), (0, 4, 20), (8, 0, 0), (8, 0, 20)],
          "bench -d: " + r.stderr.decode())
    r = run("bench", "-m", model, "-n", "4", "-d", "100000", "-r", "1")
    check(r.returncode != 0 and b"max_position_embeddings" in r.stderr, "bench -d past the context")
    r = run("info", "-m", model)
    check(r.returncode == 0 and b"bytes per token" in r.stdout and b"KV cache" in r.stdout, "info")

    # -- the reference continuations, text in and text out (fixtures beside the checkout). --exact: the
    # default int8-activation prefill is about 2e-2 off in the logits and may pick the other of two
    # near-tied tokens; the exact path must reproduce transformers' greedy text.
    if SHARED and os.path.isdir(SHARED):
        for name in ("tiny-q4", "tiny-q8-untied", "tiny-bf16", "tiny-bf16-q4g32"):
            d = os.path.join(SHARED, name)
            ref = json.load(open(os.path.join(d, "reference/reference.json")))
            n = str(len(ref["greedy_ids"]))
            if ref.get("chat_messages"):
                msgs = ref["chat_messages"]
                r = run("chat", "-m", d, "--exact", "--temp", "0", "--repeat-penalty", "1", "-n", n, input=msgs[-1]["content"].encode())
                got = r.stdout.decode().rstrip("\n")
            else:
                r = run("generate", "-m", d, "--exact", "--temp", "0", "--repeat-penalty", "1", "-n", n, "--json", "-p", ref["prompt_text"])
                got = json.loads(r.stdout)["text"]
            check(got == ref["greedy_text"], "%s: %r != reference %r" % (name, got, ref["greedy_text"]))
    else:
        print("shared fixtures absent: reference continuations skipped")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

finish()
