#!/usr/bin/env python3
"""The house rules that a compiler does not check, over every C file of the tree:
- no include cycle, between files or between modules (x.c and x.h are one module), so that no two
  parts of the engine depend on each other around a circle;
- only the OpenCL backend (engine/backend/opencl/) includes CL/cl.h or calls a tllm_cl_* function;
- the public header engine/tllm.h includes nothing of the project's (it is installed alone);
- base/ (what the engine, the kernels and the tokenizer share) includes only base/ and engine/tllm.h.
usage: check_layout.py REPO_ROOT"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
DIRS = ["base", "engine", "kernels", "tokenizer", "server", "cli", "tests", "scripts"]
files = []
for d in DIRS:
    for dp, _, fs in os.walk(os.path.join(root, d)):
        files += [os.path.relpath(os.path.join(dp, f), root) for f in fs if f.endswith((".c", ".h"))]
files.sort()
known = set(files)
inc_re = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
fail = []
edges = {}
text = {}
for f in files:
    with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
        src = fh.read()
    text[f] = src
    deps = []
    for inc in inc_re.findall(src):
        for cand in (inc, os.path.normpath(os.path.join(os.path.dirname(f), inc))):
            if cand in known:
                deps.append(cand)
                break
    edges[f] = deps


def cycles(graph):
    """Every cycle found by a depth-first search (one per back edge), as lists of nodes."""
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


for c in cycles(edges):
    fail.append("include cycle: " + " -> ".join(c))
mod = lambda f: os.path.splitext(f)[0]
medges = {}
for f, deps in edges.items():
    medges.setdefault(mod(f), set()).update(mod(d) for d in deps if mod(d) != mod(f))
for c in cycles(medges):
    fail.append("module cycle: " + " -> ".join(c))

for f, src in text.items():
    if f.startswith("engine/backend/opencl/") or f.startswith("scripts/"):
        continue
    code = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    if re.search(r"#\s*include\s*<CL/", code):
        fail.append(f"{f}: includes CL/ outside engine/backend/opencl/")
    for name in sorted(set(re.findall(r"\btllm_cl_\w+\s*\(", code))):
        fail.append(f"{f}: calls {name.rstrip('( ')} outside engine/backend/opencl/")
# base/ is the bottom layer (the engine, the kernels and the tokenizer use it): it uses only itself and
# the public header's types
for f, deps in edges.items():
    if f.startswith("base/"):
        for d in deps:
            if not d.startswith("base/") and d != "engine/tllm.h":
                fail.append(f"{f}: includes {d} (base/ includes only base/ and engine/tllm.h)")
for inc in inc_re.findall(text.get("engine/tllm.h", "")):
    if "/" in inc or inc.endswith(".h") and not inc.startswith(("std", "stddef", "stdint")):
        fail.append(f"engine/tllm.h: includes {inc} (the public header must stand alone)")

for line in fail:
    print("FAIL:", line)
print(f"layout: {len(files)} files, {sum(map(len, edges.values()))} includes:", "ok" if not fail else f"{len(fail)} problems")
sys.exit(1 if fail else 0)
