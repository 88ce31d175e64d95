"""The Python bindings on the demo model and the small fixtures: greedy text equal to the CLI's, a batch
equal to its prompts one at a time, streaming, schemas, logits against transformers' reference, errors,
threads, and memory given back over many create/free cycles.

Run by tests/python_package.sh (the repository's test command), with TLLM_CLI naming the tllm binary
and TLLM_REPO the repository."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import tllm

REPO = os.environ.get("TLLM_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(REPO, "models", "tllm-man-demo")
SMALL = os.path.join(REPO, "tests", "data", "models", "q4-g64")
CLI = os.environ.get("TLLM_CLI", os.path.join(REPO, "build", "tllm"))
GREEDY = {"temperature": 0, "max_tokens": 16}
PROMPTS = ["The tar command", "What does grep do?", "Hello", "ls -l lists", "The find command searches"]


@pytest.fixture(scope="module")
def demo():
    with tllm.Model(DEMO, device="cpu", threads=2) as m:
        yield m


def cli_text(*args):
    out = subprocess.run([CLI, "generate", "-m", DEMO, "--device", "cpu", "-t", "2", *args], capture_output=True,
                         text=True, check=True, timeout=300)
    assert out.stdout.endswith("\n")
    return out.stdout[:-1]


def test_version():
    assert tllm.__version__.count(".") == 2
    with open(os.path.join(REPO, "engine", "tllm.h")) as f:
        assert f'#define TLLM_VERSION "{tllm.__version__}"' in f.read()


def test_greedy_equals_cli(demo):
    for p in PROMPTS[:3]:
        assert demo.generate(p, **GREEDY) == cli_text("-p", p, "-n", "16", "--temp", "0")
    msgs = [{"role": "user", "content": "What does grep do?"}]
    assert demo.chat(msgs, **GREEDY) == cli_text("-p", "What does grep do?", "--chat", "-n", "16", "--temp", "0")


def test_sampled_equals_cli(demo):
    got = demo.generate("The tar command", temperature=0.8, top_p=0.9, seed=7, max_tokens=16)
    assert got == cli_text("-p", "The tar command", "-n", "16", "--temp", "0.8", "--top-p", "0.9", "--seed", "7")


def test_details_and_cache(demo):
    a = demo.generate("The tar command", details=True, **GREEDY)
    assert isinstance(a, tllm.Completion) and a.finish_reason == "length" and a.completion_tokens == 16
    assert a.prompt_tokens == len(demo.tokenize("The tar command")) and len(a.token_ids) == 16
    assert demo.detokenize(a.token_ids) == a.text
    # the same prompt again: all but its last token come from the cache, and the text is the same
    b = demo.generate("The tar command", details=True, **GREEDY)
    assert b.text == a.text and b.cached_tokens == b.prompt_tokens - 1
    c = demo.generate("The tar command", details=True, stop=a.text[5:9], **GREEDY)
    assert c.finish_reason == "stop" and a.text.startswith(c.text) and len(c.text) <= 5


def test_batch_equals_one_at_a_time(demo):
    items = PROMPTS + [demo.tokenize("Hello, world"), [{"role": "user", "content": "What does tar do?"}],
                       {"prompt": "The cat command", "max_tokens": 4}]
    batch = demo.generate_batch(items, parallel=3, **GREEDY)
    assert len(batch) == len(items)
    for item, got in zip(items, batch):
        assert isinstance(got, tllm.Completion), got
        if isinstance(item, dict):
            alone = demo.generate(item["prompt"], temperature=0, max_tokens=4)
        elif item and isinstance(item[0], dict):
            alone = demo.chat(item, **GREEDY)
        else:
            alone = demo.generate(item, **GREEDY)
        assert got.text == alone
    # sampled with a seed: the same as alone too (each sequence has its own sampler)
    sampled = demo.generate_batch(PROMPTS, parallel=4, temperature=0.9, seed=3, max_tokens=12)
    for p, got in zip(PROMPTS, sampled):
        assert got.text == demo.generate(p, temperature=0.9, seed=3, max_tokens=12)


def test_batch_errors_are_values(demo):
    out = demo.generate_batch(["The tar command", "", {"prompt": "x", "json_schema": {"type": "integer", "multipleOf": 2}}],
                              **GREEDY)
    assert isinstance(out[0], tllm.Completion) and out[0].text
    assert isinstance(out[1], tllm.Error) and "empty" in str(out[1])
    assert isinstance(out[2], tllm.Error) and "multipleOf" in str(out[2])
    with pytest.raises(TypeError, match="unknown key"):
        demo.generate_batch([{"promt": "typo"}])
    assert demo.generate_batch([]) == []


def test_stream(demo):
    pieces = list(demo.generate("The tar command", stream=True, **GREEDY))
    assert len(pieces) > 1 and "".join(pieces) == demo.generate("The tar command", **GREEDY)
    # leaving the loop stops the generation; the model is usable at once
    it = demo.chat([{"role": "user", "content": "What does grep do?"}], stream=True, temperature=0, max_tokens=200)
    first = next(it)
    it.close()
    assert first and demo.generate("Hello", **GREEDY) == cli_text("-p", "Hello", "-n", "16", "--temp", "0")


def test_json_schema(demo):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["name", "n"], "additionalProperties": False}
    out = demo.chat([{"role": "user", "content": "Give a tool and a number as JSON."}], json_schema=schema,
                    temperature=0.7, seed=1, max_tokens=64)
    v = json.loads(out)
    assert set(v) == {"name", "n"} and 1 <= v["n"] <= 9 and len(v["name"]) <= 12
    with pytest.raises(tllm.Error, match="multipleOf"):
        demo.generate("x", json_schema='{"type": "integer", "multipleOf": 2}')


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_tools(demo):
    # tool_choice required: an assistant message with one call that follows the function's parameters
    msg = demo.chat(ASK, tools=[WEATHER], tool_choice="required", **GREEDY | {"max_tokens": 96})
    assert msg["role"] == "assistant" and msg["content"] == "" and len(msg["tool_calls"]) == 1, msg
    call = msg["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 12
    c = demo.chat(ASK, tools=[WEATHER], tool_choice="required", details=True, **GREEDY | {"max_tokens": 96})
    assert c.finish_reason == "tool_calls" and [x["function"] for x in c.tool_calls] == [call["function"]]
    # the round trip: the call and its result in the history render and answer (text, no call: tool_choice none)
    history = ASK + [msg, {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 21}'}]
    again = demo.chat(history, tools=[WEATHER], tool_choice="none", **GREEDY)
    assert again["role"] == "assistant" and "tool_calls" not in again and again["content"]
    # tool_choice none leaves the tools out: the plain chat's answer
    assert demo.chat(ASK, tools=[WEATHER], tool_choice="none", **GREEDY)["content"] == demo.chat(ASK, **GREEDY)
    # a batch gives the same calls, beside a bad request that fails alone
    outs = demo.generate_batch([{"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 96},
                                {"messages": ASK, "tools": [WEATHER], "tool_choice": "nope"},
                                {"messages": history, "tools": [WEATHER], "tool_choice": "none"}], **GREEDY)
    assert outs[0].finish_reason == "tool_calls" and [x["function"] for x in outs[0].tool_calls] == [call["function"]]
    assert c.token_ids and c.token_ids == outs[0].token_ids and c.completion_tokens == len(c.token_ids)
    assert isinstance(outs[1], tllm.Error) and "tool_choice" in str(outs[1])
    assert outs[2].text == again["content"] and outs[2].tool_calls is None
    with pytest.raises(TypeError, match="messages"):
        demo.generate_batch([{"prompt": "x", "tools": [WEATHER]}])
    # streamed: content deltas (never a call's markup), then the calls once, as the message has them
    deltas = list(demo.chat(ASK, tools=[WEATHER], tool_choice="required", stream=True, **GREEDY | {"max_tokens": 96}))
    assert deltas[-1].keys() == {"tool_calls"} and [x["function"] for x in deltas[-1]["tool_calls"]] == [call["function"]]
    assert "".join(d["content"] for d in deltas[:-1]) == msg["content"] == ""
    free = list(demo.chat(ASK, tools=[WEATHER], stream=True, **GREEDY))  # auto: the demo model answers in text
    text = demo.chat(ASK, tools=[WEATHER], **GREEDY)
    assert len(free) > 1 and all(d.keys() == {"content"} for d in free) and "tool_calls" not in text
    assert "".join(d["content"] for d in free) == text["content"] and "<tool_call>" not in text["content"]
    with pytest.raises(tllm.Error, match="tool_choice"):
        demo.chat(ASK, tools=[WEATHER], tool_choice="maybe")


def test_tools_real_model():
    """The real Qwen2.5-Coder-0.5B GGUF (scripts/fetch_model.sh) asked for Paris' weather with a tool
    offered: the call comes back from chat() and from generate_batch(), as `tllm serve` returns it."""
    path = os.path.join(REPO, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    if not os.path.exists(path):
        pytest.skip("the real model is not there (scripts/fetch_model.sh qwen2.5-coder-0.5b)")
    if os.environ.get("TLLM_TEST_SANITIZED"):
        pytest.skip("the real model under the sanitizers: the plain run checks it")
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    with tllm.Model(path, device="cpu", threads=2) as m:
        msg = m.chat(ask, tools=[weather], temperature=0, max_tokens=64)
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
        assert calls == [("get_weather", {"city": "Paris"})], msg
        out = m.generate_batch([{"messages": ask, "tools": [weather]}], temperature=0, max_tokens=64)[0]
        assert out.finish_reason == "tool_calls" and [c["function"] for c in out.tool_calls] == \
            [c["function"] for c in msg["tool_calls"]], out
        # streamed: no markup shown, the same call at the end
        deltas = list(m.chat(ask, tools=[weather], stream=True, temperature=0, max_tokens=64))
        shown = "".join(d.get("content", "") for d in deltas)
        assert "<tool_call>" not in shown and shown == msg["content"], deltas
        assert [c["function"] for c in deltas[-1]["tool_calls"]] == [c["function"] for c in msg["tool_calls"]]


def test_logits_match_reference():
    np = pytest.importorskip("numpy")
    ref_dir = os.path.join(SMALL, "reference")
    with open(os.path.join(ref_dir, "reference.json")) as f:
        ref = json.load(f)
    with tllm.Model(SMALL, device="cpu", exact=True, kv_type="f32") as m:
        seq = ref["sequence"] if "sequence" in ref else ref["prompt_ids"]
        got = m.logits(seq)
        assert got.shape == (len(seq), m.vocab_size) and got.dtype == np.float32
        rows = ref.get("logits_rows", [])
        want = np.fromfile(os.path.join(ref_dir, "logits.f32"), dtype=np.float32).reshape(len(rows), -1)
        for r, w in zip(rows, want):
            g = got[r][:w.shape[0]]
            assert np.sqrt(np.mean((g - w) ** 2)) / np.sqrt(np.mean(w ** 2)) <= 1e-4
        last = m.logits(seq, last_only=True)
        assert last.shape == (m.vocab_size,) and np.array_equal(last, got[-1])
        # the reference's greedy ids: argmax alone (the checkpoint's generation_config asks for penalties)
        plain = {"temperature": 0, "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0}
        assert m.generate(ref["prompt_ids"], max_tokens=16, details=True, **plain).token_ids == ref["greedy_ids"]
        # greedy's first token is the argmax of the prompt's last row
        first = m.generate(ref["prompt_ids"], max_tokens=1, details=True, **plain).token_ids[0]
        assert first == int(np.argmax(m.logits(ref["prompt_ids"], last_only=True)))
        with pytest.raises(tllm.Error, match="outside the vocabulary"):
            m.logits([m.vocab_size])


def test_tokens_and_template(demo):
    ids = demo.tokenize("Hello, world")
    assert demo.detokenize(ids) == "Hello, world"
    assert demo.tokenize("<|im_start|>") != demo.tokenize("<|im_start|>", special=False)
    text = demo.apply_chat_template([{"role": "user", "content": "hi"}])
    out = subprocess.run([CLI, "template", "-m", DEMO, "-"], input='[{"role": "user", "content": "hi"}]',
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout in (text, text + "\n")
    assert "hi" in text and demo.vocab_size > 0 and demo.n_ctx > 0 and demo.device == "CPU"


def test_errors():
    with pytest.raises(tllm.Error, match="/nonexistent/model"):
        tllm.Model("/nonexistent/model")
    with pytest.raises(tllm.Error, match="'gpu'"):
        tllm.Model(SMALL, device="gpu")
    with pytest.raises(tllm.Error, match="quantize_bits 3"):
        tllm.Model(SMALL, quantize_bits=3)
    m = tllm.Model(SMALL, device="cpu")
    with pytest.raises(tllm.Error, match="no tokenizer"):
        m.generate("text")
    with pytest.raises(TypeError, match="temprature"):
        m.generate([1, 2], temprature=0)
    with pytest.raises(tllm.Error, match="empty"):
        m.generate([])
    m.close()
    m.close()
    with pytest.raises(tllm.Error, match="closed"):
        m.generate([1, 2])
    assert "closed" in repr(m)


def test_gil_released_and_threads(demo):
    # a Python thread runs while tllm generates
    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    before = ticks[0]
    demo.generate("The tar command", temperature=0, max_tokens=64)
    during = ticks[0] - before
    stop.set()
    t.join()
    assert during > 5
    # calls from several threads take turns and give each one's own answer
    want = {p: demo.generate(p, **GREEDY) for p in PROMPTS}
    got = {}

    def run(p):
        got[p] = demo.generate(p, **GREEDY)

    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert got == want


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def test_no_growth_over_create_free_cycles():
    cycles = int(os.environ.get("TLLM_TEST_CYCLES", "1000"))

    def cycle():
        with tllm.Model(SMALL, device="cpu", n_ctx=64) as m:
            m.generate([1, 2, 3], temperature=0, max_tokens=2)
            m.generate_batch([[1, 2], [3, 4]], temperature=0, max_tokens=2)

    for _ in range(50):  # the allocator's arenas and Python's caches settle
        cycle()
    before = rss_kib()
    for _ in range(cycles):
        cycle()
    grown = rss_kib() - before
    assert grown < 2048, f"RSS grew {grown} KiB over {cycles} create/free cycles"


def test_garbage_collected_model_is_freed():
    # in a fresh interpreter (the module's demo model holds the thread pool here): once the collector has
    # freed a model, another may ask for any pool size
    code = f"""
import gc, tllm
m = tllm.Model({SMALL!r}, device="cpu", threads=2, n_ctx=64)
m.generate([1, 2], max_tokens=1)
del m
gc.collect()
with tllm.Model({SMALL!r}, device="cpu", threads=1) as m2:
    assert len(m2.generate([1, 2], temperature=0, max_tokens=2, details=True).token_ids) == 2
try:
    a, b = tllm.Model({SMALL!r}, device="cpu", threads=2), tllm.Model({SMALL!r}, device="cpu", threads=1)
except tllm.Error as e:
    assert "runs on 2" in str(e), e
else:
    raise AssertionError("a second pool size was accepted")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr
