#!/usr/bin/env python3
"""Structured output: answers constrained to a JSON schema parse and validate.
- 20 schemas x 50 sampled seeds through tllm serve (response_format json_schema, 16 requests at once,
  the demo model at temperature 1): every answer ends by itself ("stop"), parses, and validates under
  the schema (python jsonschema, with format checks); each answer is the same when asked alone
  (batch invariance);
- refusals name the keyword and the field; json_object; ignore_eos with a schema refused;
- tllm generate --prompts with a "response_format" per line and --json-schema for the others;
- with the real model (scripts/fetch_model.sh qwen2.5-coder-0.5b) and the official openai client: a
  pydantic-style schema ($defs, $ref, enum) answered, and tool_choice required / named give calls whose
  arguments follow the function's parameters.
usage: structured_output.py TLLM DEMO_MODEL REAL_MODEL"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402
import serve_util  # noqa: E402

TLLM, DEMO, REAL = sys.argv[1], sys.argv[2], sys.argv[3]
SEEDS = int(os.environ.get("TLLM_TEST_SCHEMA_SEEDS", "50"))

try:
    import jsonschema
except ImportError as e:
    jsonschema = None
    print(f"note: jsonschema is not installed ({e}): answers are checked to parse, not validated")


def validate(schema, value):
    """'' when value follows schema, else why not"""
    if jsonschema is None:
        return ""
    v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errs = list(v.iter_errors(value))
    return "; ".join(e.message for e in errs[:3])


PT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99},
                                       "y": {"type": "integer", "minimum": -99, "maximum": 99}},
      "required": ["x", "y"], "additionalProperties": False}
# Every string, array and number bounded: the grammar itself ends each answer, whatever the model says
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    {"type": "boolean"},
    {"enum": ["red", "green", "blue", 1, None]},
    {"type": "object", "properties": {"ok": {"const": True}, "code": {"type": "integer", "exclusiveMinimum": 99,
                                                                       "exclusiveMaximum": 600}},
     "required": ["ok", "code"], "additionalProperties": False},
    {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "uuid"},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 3}, {"type": "null"}]},
    {"type": ["number", "null"], "minimum": 0, "maximum": 100},
    {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                                                  "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"}},
                 "required": ["id", "email"], "additionalProperties": False},
        "roles": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3}},
     "required": ["user", "roles"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"},
                                      "c": {"type": "null"}}, "additionalProperties": False},
    {"$defs": {"pt": PT}, "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"type": "string", "minLength": 3, "maxLength": 6},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 4},
                                                                "v": {"type": "number", "minimum": 0, "maximum": 1}},
                                "required": ["k", "v"], "additionalProperties": False}, "maxItems": 3},
    {"type": "object", "properties": {"t": {"type": "string", "format": "time"}}, "required": ["t"],
     "additionalProperties": False},
    {"type": "object", "properties": {"dt": {"type": "string", "format": "date-time"}}, "required": ["dt"],
     "additionalProperties": False},
    {"type": "integer", "minimum": -1000, "maximum": -10},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "pattern": "^#[a-z]{1,6}$"},
                                               "minItems": 2, "maxItems": 2}},
     "required": ["tags"], "additionalProperties": False},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["kind", "side"], "additionalProperties": False}]},
]
assert len(SCHEMAS) == 20


def body(i, seed):
    return {"messages": [{"role": "user", "content": "Answer in JSON."}], "temperature": 1.0, "seed": seed,
            "max_tokens": 400, "response_format": {"type": "json_schema",
                                                   "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i], "strict": True}}}


srv = serve_util.Server(TLLM, DEMO, "-np", "16", "-c", "1024")
jobs = [(i, seed) for i in range(len(SCHEMAS)) for seed in range(SEEDS)]  # schema after schema: 16 at once share masks
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    answers = dict(zip(jobs, ex.map(lambda j: srv.post("/v1/chat/completions", body(*j)), jobs)))
bad = 0
for (i, seed), (st, r) in answers.items():
    why = ""
    if st != 200:
        why = f"status {st}: {r}"
    else:
        c = r["choices"][0]
        text = c["message"]["content"]
        if c["finish_reason"] != "stop":
            why = f"finish_reason {c['finish_reason']}: {text!r}"
        else:
            try:
                why = validate(SCHEMAS[i], json.loads(text))
            except ValueError as e:
                why = f"not JSON ({e}): {text!r}"
    if why:
        bad += 1
        if bad <= 10:
            check(False, f"schema {i} seed {seed}: {why}")
check(bad == 0, f"{bad} of {len(answers)} answers do not follow their schema")
# the same request alone: the same answer (a sequence's tokens do not depend on its neighbours)
same = 0
for i, seed in jobs[::len(jobs) // 20]:
    st, r = srv.post("/v1/chat/completions", body(i, seed))
    same += st == 200 and r["choices"][0]["message"]["content"] == answers[(i, seed)][1]["choices"][0]["message"]["content"]
check(same == 20, f"{same} of 20 answers equal alone and among 16")

refused = [
    ({"type": "json_schema", "json_schema": {"schema": {"type": "integer", "multipleOf": 3}}}, "response_format",
     "response_format.json_schema.schema: 'multipleOf' is not supported"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}}},
     "response_format", "properties.a: pattern: lookaround"),
    ({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/none"}}}, "response_format", "points at nothing"),
    ({"type": "json_schema"}, "response_format", "'json_schema' must be an object"),
    ({"type": "xml"}, "response_format", "is not one of text, json_object, json_schema"),
]
for rf, param, msg in refused:
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": rf})
    err = r.get("error", {}) if isinstance(r, dict) else {}
    check(st == 400 and err.get("param") == param and msg in err.get("message", ""), f"{rf}: {st} {r}")
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}
for extra, param, msg in (
        ({"tools": [TOOL], "response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}},
         "response_format", "response_format.json_schema.schema: 'not' is not supported"),
        ({"tools": [{**TOOL, "function": {"name": "f", "parameters": {"type": "object", "if": {}}}}],
          "response_format": {"type": "json_object"}}, "tools", "tools[0].function.parameters: 'if' is not supported")):
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], **extra})
    err = r.get("error", {}) if isinstance(r, dict) else {}
    check(st == 400 and err.get("param") == param and msg in err.get("message", ""), f"tools and a format: {st} {r}")
# tools offered (auto) with a format: each answer is a call or JSON in the format
calls = fmt = 0
for seed in range(12):
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL], "seed": seed,
                                              "temperature": 1, "max_tokens": 300, "response_format": {
                                                  "type": "json_schema", "json_schema": {"schema": SCHEMAS[0]}}})
    c = r["choices"][0] if st == 200 else {}
    if c.get("finish_reason") == "tool_calls":
        calls += all(t["function"]["name"] == "f" and not validate(TOOL["function"]["parameters"], json.loads(t["function"]["arguments"]))
                     for t in c["message"]["tool_calls"])
    elif c.get("finish_reason") == "stop":
        try:
            fmt += not validate(SCHEMAS[0], json.loads(c["message"]["content"]))
        except ValueError:
            pass
check(calls + fmt == 12, f"tools with a format: {calls} calls and {fmt} answers in the format of 12")
st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "ignore_eos": True,
                                          "response_format": {"type": "json_object"}})
check(st == 400 and r.get("error", {}).get("param") == "ignore_eos", f"ignore_eos with a schema: {st} {r}")
st, r = srv.post("/v1/completions", {"prompt": "JSON:", "seed": 3, "temperature": 1, "max_tokens": 300,
                                     "response_format": {"type": "json_object"}})
ok = st == 200
if ok:
    try:
        ok = isinstance(json.loads(r["choices"][0]["text"]), dict) or r["choices"][0]["finish_reason"] == "length"
    except ValueError:
        ok = r["choices"][0]["finish_reason"] == "length"
check(ok, f"json_object on /v1/completions: an object (or cut by max_tokens): {st} {r}")
srv.stop()

# batch files: a line's own response_format, --json-schema for the others, a bad schema as an error record
with tempfile.TemporaryDirectory() as d:
    lines = [{"id": "own", "prompt": "A:", "seed": 1, "temperature": 1,
              "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMAS[1]}}},
             {"id": "cli", "prompt": "B:", "seed": 2, "temperature": 1},
             {"id": "third", "prompt": "E:", "seed": 4, "temperature": 1,
              "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMAS[2]}}},
             {"id": "own2", "prompt": "D:", "seed": 3, "temperature": 1,
              "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMAS[1]}}},
             {"id": "bad", "prompt": "C:", "response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}}]
    with open(os.path.join(d, "in.jsonl"), "w") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    r = subprocess.run([TLLM, "generate", "-m", DEMO, "-t", "2", "--prompts", os.path.join(d, "in.jsonl"), "-n", "400",
                        "--json-schema", json.dumps(SCHEMAS[0]), "-o", os.path.join(d, "out.jsonl")],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, TLLM_GRAMMAR_STATS="1"))
    check(r.returncode == 0, f"generate --prompts: {r.stderr}")
    # one automaton per schema: the two lines on SCHEMAS[1] share one (their masks) though another schema's
    # line comes between them; SCHEMAS[2]'s and --json-schema's are the others
    automata = [x for x in r.stderr.splitlines() if x.startswith("grammar: ")]
    check(len(automata) == 3, f"lines with one response_format share its automaton: {automata}")
    recs = {}
    if os.path.exists(os.path.join(d, "out.jsonl")):
        recs = {x["id"]: x for x in map(json.loads, open(os.path.join(d, "out.jsonl")))}
    for key, schema in (("own", SCHEMAS[1]), ("cli", SCHEMAS[0]), ("third", SCHEMAS[2]), ("own2", SCHEMAS[1])):
        rec = recs.get(key, {})
        try:
            why = validate(schema, json.loads(rec.get("text", "")))
        except ValueError as e:
            why = str(e)
        check(rec.get("finish_reason") == "stop" and not why, f"batch line {key}: {rec} {why}")
    check("'not' is not supported" in recs.get("bad", {}).get("error", ""), f"batch line with a bad schema: {recs.get('bad')}")
    r = subprocess.run([TLLM, "generate", "-m", DEMO, "-p", "x", "--json-schema", '{"type": "integer", "maximum": 1.5}'],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "--json-schema: 'maximum' is supported only as an integer" in r.stderr,
          f"generate --json-schema with a bad schema: {r.returncode} {r.stderr}")

real = serve_util.real_model_client(TLLM, REAL, "the real model's structured answers", "-c", "4096")
if real:
    srv, cl = real
    # the shape pydantic's model_json_schema() gives (what client.beta.chat.completions.parse sends)
    book = {"$defs": {"Author": {"properties": {"name": {"title": "Name", "type": "string"},
                                                "born": {"title": "Born", "type": "integer"}},
                                 "required": ["name", "born"], "title": "Author", "type": "object",
                                 "additionalProperties": False},
                      "Genre": {"enum": ["fiction", "science", "history"], "title": "Genre", "type": "string"}},
            "properties": {"title": {"title": "Title", "type": "string"}, "author": {"$ref": "#/$defs/Author"},
                           "genre": {"$ref": "#/$defs/Genre"},
                           "year": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Year"}},
            "required": ["title", "author", "genre", "year"], "title": "Book", "type": "object", "additionalProperties": False}
    r = cl.chat.completions.create(model="m", temperature=0, max_tokens=200, messages=[
        {"role": "user", "content": "Describe the book 'A Brief History of Time' as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "Book", "schema": book, "strict": True}})
    text = r.choices[0].message.content
    try:
        why = validate(book, json.loads(text))
    except ValueError as e:
        why = str(e)
    check(r.choices[0].finish_reason == "stop" and not why, f"a pydantic-style schema: {text!r} {why}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
             {"type": "function", "function": {"name": "get_time", "parameters": {
                 "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"], "additionalProperties": False}}}]
    msgs = [{"role": "user", "content": "Hello! How are you today?"}]  # nothing that asks for a tool
    for choice, want in (("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")):
        r = cl.chat.completions.create(model="m", messages=msgs, tools=tools, tool_choice=choice, temperature=0, max_tokens=100)
        c = r.choices[0]
        calls = c.message.tool_calls or []
        ok = c.finish_reason == "tool_calls" and len(calls) >= 1
        for call in calls:
            fn = next((t["function"] for t in tools if t["function"]["name"] == call.function.name), None)
            try:
                ok = ok and fn is not None and (want is None or call.function.name == want) and \
                    not validate(fn["parameters"], json.loads(call.function.arguments))
            except ValueError:
                ok = False
        check(ok, f"tool_choice {choice}: a call that follows the parameters: {c}")
    srv.stop()
finish("structured_output")
