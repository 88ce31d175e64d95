#!/usr/bin/env python3
"""Tools in tllm serve's chat completions: requests with tools, tool calls and tool results rendered by
the checkpoint's own template (the prompt's token count equals `tllm tokenize --chat` on the same
conversation), what is refused with a message naming the field, and, with the real model
(scripts/fetch_model.sh qwen2.5-coder-0.5b) and the official openai client, a tool round trip, the
streamed call reassembled, parallel_tool_calls and tool_choice none.
usage: server_tools.py TLLM DEMO_MODEL REAL_MODEL [VENV_PYTHON_SITE]"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402
import serve_util  # noqa: E402

TLLM, DEMO, REAL = sys.argv[1], sys.argv[2], sys.argv[3]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ROUND_TRIP = [
    {"role": "system", "content": "You help with the weather."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"},
]


def template_tokens(model, messages, tools):
    """the prompt's token count as tllm tokenize --chat renders it (arguments as objects, as the server passes them)"""
    msgs = json.loads(json.dumps(messages))
    for m in msgs:
        m["content"] = m["content"] or ""
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"messages": msgs, **({"tools": tools} if tools else {})}, f)
    r = subprocess.run([TLLM, "tokenize", "-m", model, "--chat", f.name, "--json"], capture_output=True, timeout=120)
    os.unlink(f.name)
    check(r.returncode == 0, "tokenize --chat: " + r.stderr.decode())
    return len(json.loads(r.stdout)["ids"]) if r.returncode == 0 else -1


srv = serve_util.Server(TLLM, DEMO, "-c", "2048")
for tools in ([WEATHER], None):
    st, r = srv.post("/v1/chat/completions", {"messages": ROUND_TRIP, "max_tokens": 1, "temperature": 0,
                                              **({"tools": tools} if tools else {})})
    check(st == 200 and r["usage"]["prompt_tokens"] == template_tokens(DEMO, ROUND_TRIP, tools),
          f"the prompt with tools={bool(tools)} is the template's rendering: {st} {r}")
st, r = srv.post("/v1/chat/completions", {"messages": ROUND_TRIP, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 1})
check(st == 200 and r["usage"]["prompt_tokens"] == template_tokens(DEMO, ROUND_TRIP, None),
      f"tool_choice none leaves the tools out of the prompt: {st} {r}")
bad = [
    ({"tools": {"x": 1}}, "tools", "'tools' must be a list"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "tool 0: 'type' must be \"function\""),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools", "non-empty string 'name'"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice 'required' needs 'tools'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tools", "no function named 'nope'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "must be {\"type\": \"function\""),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "'tool_choice' must be"),
    ({"tools": [{**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "object", "not": {}}}}],
      "tool_choice": "required"}, "tools", "tools[0].function.parameters: 'not' is not supported"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages", "message 0: tool call 0's arguments are not JSON"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages", "only the assistant makes tool calls"),
]
for extra, param, msg in bad:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **extra}
    st, r = srv.post("/v1/chat/completions", body)
    err = r.get("error", {}) if isinstance(r, dict) else {}
    check(st == 400 and err.get("param") == param and msg in err.get("message", ""), f"{extra}: {st} {r}")
srv.stop()

real = serve_util.real_model_client(TLLM, REAL, "the real model's round trip", "-c", "2048")
if real:
    srv, cl = real
    msgs = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = cl.chat.completions.create(model="m", messages=msgs, tools=[WEATHER], temperature=0, max_tokens=64)
    c = r.choices[0]
    calls = c.message.tool_calls or []
    check(c.finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather" and
          json.loads(calls[0].function.arguments) == {"city": "Paris"} and calls[0].id.startswith("call_"),
          f"a tool call: {c}")
    if calls:
        msgs += [c.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temp_c": 21, "sky": "clear"})}]
        r2 = cl.chat.completions.create(model="m", messages=msgs, tools=[WEATHER], temperature=0, max_tokens=64)
        check(r2.choices[0].finish_reason in ("stop", "tool_calls", "length"), f"the answer after the result: {r2}")
    s = cl.chat.completions.create(model="m", messages=msgs[:1], tools=[WEATHER], temperature=0, max_tokens=64, stream=True)
    got, fin, content = {}, None, ""
    for ch in s:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            g = got.setdefault(t.index, {"id": "", "name": "", "arguments": ""})
            g["id"] += t.id or ""
            g["name"] += (t.function.name or "") if t.function else ""
            g["arguments"] += (t.function.arguments or "") if t.function else ""
        fin = ch.choices[0].finish_reason or fin
    check(fin == "tool_calls" and list(got) == [0] and got[0]["name"] == "get_weather" and
          json.loads(got[0]["arguments"]) == {"city": "Paris"} and got[0]["id"].startswith("call_") and not content,
          f"the streamed call reassembles: {fin} {got} {content!r}")
    r = cl.chat.completions.create(model="m", messages=msgs[:1], tools=[WEATHER], tool_choice="none", temperature=0,
                                   max_tokens=32)
    check(r.choices[0].finish_reason != "tool_calls" and r.choices[0].message.tool_calls is None,
          f"tool_choice none: no call parsed: {r.choices[0]}")
    srv.stop()
finish("server_tools")
