"""Chat templates run by tllm's Jinja interpreter against transformers' apply_chat_template (jinja2):
every template of tests/data/chat/templates over every conversation of conversations.json, byte for byte,
and the same conversations failing in both (a template's raise, an undefined value, str + None).
The expected renderings (expected.json) were made by transformers; with transformers installed (the
test venv) each is also rendered again and compared, so the file cannot drift. Then: error messages
with the template's name, line and column; the limits that stop a hostile template; the model's own
template through -m (a GGUF's, a checkpoint's tokenizer_config.json).
usage: chat_templates.py TLLM REPO [SHARED_FIXTURES] [--regen]"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

args = [a for a in sys.argv[1:] if a != "--regen"]
regen = "--regen" in sys.argv
tllm, repo = args[0], args[1]
shared = args[2] if len(args) > 2 else None
data = os.path.join(repo, "tests", "data", "chat")
tdir = os.path.join(data, "templates")
templates = sorted(f for f in os.listdir(tdir) if f.endswith(".jinja"))
convs = json.load(open(os.path.join(data, "conversations.json")))
expected_path = os.path.join(data, "expected.json")
expected = {} if regen else json.load(open(expected_path))

try:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils.chat_template_utils import render_jinja_template
except ImportError as e:
    render_jinja_template = None
    print(f"note: transformers is not installed ({e}): comparing with the stored renderings only")
if regen and not render_jinja_template:
    sys.exit("--regen needs transformers")

tmp = tempfile.mkdtemp(prefix="tllm-chat-")


def conv_file(c):
    body = {k: v for k, v in c.items() if k != "name"}
    path = os.path.join(tmp, c["name"] + ".json")
    with open(path, "w") as f:
        json.dump(body, f)
    return path


def run_tllm(*a):
    p = subprocess.run([tllm, "template", *a], capture_output=True, timeout=120)
    return p.returncode, p.stdout.decode("utf-8", "surrogateescape"), p.stderr.decode("utf-8", "replace")


def reference(template_text, c):
    """transformers' rendering, or None when it raises"""
    try:
        out = render_jinja_template([c["messages"]], tools=c.get("tools"), chat_template=template_text,
                                    add_generation_prompt=c.get("add_generation_prompt", True))
        return out[0][0]
    except Exception:
        return None


n_rendered = n_errors = 0
for t in templates:
    text = open(os.path.join(tdir, t)).read()
    for c in convs:
        key = f"{t}|{c['name']}"
        rc, out, err = run_tllm("--chat-template", os.path.join(tdir, t), conv_file(c))
        got = out if rc == 0 else None
        if render_jinja_template:
            ref = reference(text, c)
            if regen:
                expected[key] = ref
            check(got == ref, f"{key}: tllm {'failed: ' + err.strip() if got is None else 'rendered'} where "
                              f"transformers {'failed' if ref is None else 'rendered'}"
                              + (f"\n--- tllm\n{got!r}\n--- transformers\n{ref!r}" if got is not None and ref is not None else ""))
        check(key in expected and got == expected[key], f"{key}: differs from expected.json")
        if got is None:
            n_errors += 1
            check(err.startswith("tllm: ") and f"{t}:" in err, f"{key}: the error names the template: {err.strip()}")
        else:
            n_rendered += 1
if regen:
    with open(expected_path, "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")
print(f"{len(templates)} templates x {len(convs)} conversations: {n_rendered} rendered, {n_errors} failing as in jinja2")

# random expressions against jinja2 (transformers' environment): operators, filters, tests, methods,
# slicing, undefined values, over values of every type; where jinja2 returns a lazy generator (select,
# map, unique, reverse, items...) the expression takes | list, as templates do
if render_jinja_template:
    import random
    rng = random.Random(20261127)
    V = {"s": "Hello, World! h\u00e9llo", "e": "", "n": 7, "m": -3, "f": 2.5, "z": 0, "t": True, "no": None,
         "l": [3, 1, "a", None, 2.0], "nums": [5, 2, 9, 2], "strs": ["b", "a", "C"],
         "d": {"k": "v", "x": 1, "nested": {"y": [1, 2]}}, "objs": [{"name": "a", "v": 1}, {"name": "b"}, {"name": "c", "v": None}]}
    ATOMS = ["s", "e", "n", "m", "f", "z", "t", "no", "l", "nums", "strs", "d", "objs", "undefined_x", "'lit'", "\"q'\"", "3",
             "-1", "0.5", "1e3", "true", "none", "[1, 'x']", "{'a': 1, 'b': [2]}", "(1, 2)", "''", "d.k", "d['x']", "d.nested.y",
             "objs[0].name", "l[1:3]", "s[::-1]", "s[-5:]", "l[-1]", "nums[10]"]
    BIN = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or"]
    FILTERS = ["length", "first", "last", "upper", "lower", "trim", "tojson", "string", "list", "reverse | list",
               "unique | list", "sort", "sort(reverse=true)", "join", "join(', ')", "default('D')", "default('D', true)",
               "int", "float", "abs", "capitalize", "title", "items | list", "tojson(indent=2)", "tojson(sort_keys=true)",
               "select('odd') | list", "reject('none') | list", "map('upper') | list", "selectattr('v') | list",
               "map(attribute='name') | list", "rejectattr('v', 'none') | list", "e", "replace('l', 'L')", "count"]
    TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "odd", "even",
             "divisibleby 3", "eq 7", "in [7, 'a']", "boolean", "true", "lower", "upper"]
    METHODS = ["s.split(', ')", "s.split()", "s.startswith('He')", "s.endswith(('!', 'o'))", "s.strip('Heo')", "s.lower()",
               "s.upper()", "s.replace('o', '0', 1)", "s.find('World')", "s.count('l')", "s.title()", "d.items() | list",
               "d.keys() | list", "d.get('k')", "d.get('zz', 3)", "'-'.join(strs)", "s.rsplit(' ', 1)", "e.strip()",
               "'  x '.lstrip()", "'a,b,,c'.split(',')", "s.isdigit()", "'12'.isdigit()"]

    def expr(depth=0):
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice(ATOMS)
        if r < 0.45:
            return rng.choice(METHODS)
        if r < 0.65:
            return f"({expr(depth + 1)} {rng.choice(BIN)} {expr(depth + 1)})"
        if r < 0.8:
            return f"({expr(depth + 1)} | {rng.choice(FILTERS)})"
        if r < 0.9:
            return f"({expr(depth + 1)} is {rng.choice(['', 'not '])}{rng.choice(TESTS)})"
        if r < 0.95:
            return f"(not {expr(depth + 1)})"
        return f"({expr(depth + 1)} if {expr(depth + 1)} else {expr(depth + 1)})"

    vars_path = os.path.join(tmp, "vars.json")
    with open(vars_path, "w") as f:
        json.dump({"messages": [], **V}, f)
    same = errors = 0
    N = 400
    for i in range(N):
        src = "{{ " + expr() + " }}"
        try:
            ref = render_jinja_template([[]], chat_template=src, add_generation_prompt=False, **V)[0][0]
        except Exception:
            ref = None
        if ref is not None and " object at 0x" in ref:
            continue  # a lazy object's repr (e.g. a filter's generator compared or tested, not listed)
        path = os.path.join(tmp, "expr.jinja")
        with open(path, "w") as f:
            f.write(src)
        rc, out, err = run_tllm("--chat-template", path, "--no-generation-prompt", vars_path)
        got = out if rc == 0 else None
        same += check(got == ref, f"{src}: tllm {got!r} {err.strip()}, jinja2 {ref!r}")
        errors += ref is None
    print(f"random expressions: {same} equal to jinja2 ({errors} failing in both)")

# errors: the template's name, line and column, one line
conv = conv_file(convs[0])
bad = {
    "{% if x %}never closed": "1:23: missing '{% endif %}'",
    "line one\n{{ 'unterminated }}": "2:4: unterminated string",
    "{% for %}{% endfor %}": "1:8: expected a variable name",
    "{% include 'other.jinja' %}": "1:4: unknown or unsupported tag 'include'",
    "{{ messages | no_such_filter }}": "1:13: no filter named 'no_such_filter'",
    "\n\n  {{ raise_exception('Only user and assistant roles are supported!') }}":
        "3:6: the template raised an error: Only user and assistant roles are supported!",
    "{{ messages[0].content.nope.deeper }}": "1:28: 'str' has no attribute 'nope'",
    "{% endif %}": "1:4: unexpected 'endif'",
    "{{ 1 +  }}": "1:9: expected an expression",
    "{{ (((( }}": "1:11: unclosed bracket",
    "{% set x = 1 / 0 %}": "1:14: division by zero",
}


def expect_failures(cases, stem, placed):
    """each template fails, its one-line message holding msg (after FILE: when placed)"""
    for i, (src, msg) in enumerate(cases.items()):
        path = os.path.join(tmp, f"{stem}{i}.jinja")
        with open(path, "w") as f:
            f.write(src)
        rc, out, err = run_tllm("--chat-template", path, conv)
        want = f"{stem}{i}.jinja:{msg}" if placed else msg
        check(rc != 0 and want in err and err.count("\n") == 1, f"{src[:80]!r}: wanted '{want}', got rc {rc} {err[:300]!r}")


expect_failures(bad, "bad", True)

# limits: each hostile template fails quickly with a message, never hangs or exhausts memory
hostile = {
    "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}": "ran longer than",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}": "limit",
    "{{ 'x' * 1000000000 }}": "too long",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}": "nested deeper",
    "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}": "nested too deeply",
    "{{ range(1000000000) | list }}": "range() of more than",
    "{{ 1 ** 1000000000000000000 }}{{ 3 ** 1000000000000000000 }}": "integer overflow",
    "{% set s = 'x' * 30000000 %}{% for i in range(100000) %}{{ s[5] }}{{ s.find('y') }}{% endfor %}": "ran longer than",
    "{% set ns = namespace(s='abcdefgh') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}": "longer than",
    "{% set ns = namespace(s='abcdefgh') %}{% for i in range(30) %}{% set ns.s = ns.s + ns.s %}{% endfor %}": "longer than",
}
expect_failures(hostile, "hostile", False)

# the model's own template: a GGUF's tokenizer.chat_template, a checkpoint's tokenizer_config.json
qwen25 = "qwen2.5.jinja"
models = [os.path.join(repo, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")]
if shared:
    models.append(os.path.join(shared, "qwen2.5-0.5b-instruct"))
for m in models:
    if not os.path.exists(m):
        print(f"note: {m} is absent: its template is not checked")
        continue
    for c in convs:
        rc, out, err = run_tllm("-m", m, conv_file(c))
        check((out if rc == 0 else None) == expected[f"{qwen25}|{c['name']}"],
              f"{os.path.basename(m)}|{c['name']}: differs from Qwen2.5's template")
finish("chat_templates")
