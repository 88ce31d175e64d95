"""python -m tllm.ray_batch: a prompt file through tllm on a Ray cluster (Ray Data, one model per actor).

    python -m tllm.ray_batch --input IN.jsonl --output OUT_DIR -m MODEL --actors N [-np 16] [-n 256]

Reads what ``tllm generate --prompts`` reads (text lines, or JSONL lines with "prompt" or "messages", an
"id" and per-line sampling) and writes the same records: each batch of rows as a file OUT_DIR/part-*.jsonl
as its actor finishes it, then OUT_DIR/output.jsonl with every line's record in input order.

Nothing lost, nothing twice: a part file is written atomically (temporary name, fsync, rename) and named by
its batch's ids, so when an actor dies Ray runs its batch again on a restarted actor (max_restarts and
max_task_retries unbounded) and that batch's file is written once, whole; the merge keeps one record per
id and checks that every line has one. Resumable: a run reads the records already in OUT_DIR and skips
their ids, so a run that was stopped (Ctrl-C, a lost cluster) is finished by running it again.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple


def read_lines(path: str) -> Tuple[List[Tuple[Any, str]], bool, List[Dict[str, Any]]]:
    """The file's lines as (id, line) with the format of the file (its first line decides, as the CLI's),
    and the records of lines refused here (a repeated id)."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [l.rstrip("\r") for l in lines]
    first = next((l.lstrip(" \t") for l in lines if l.strip(" \t")), "")
    jsonl = first.startswith("{")
    out, refused, seen = [], [], {}
    for no, line in enumerate(lines, 1):
        id_: Any = no
        if jsonl:
            try:
                v = json.loads(line)
                if isinstance(v, dict) and "id" in v:
                    id_ = v["id"]
            except json.JSONDecodeError:
                pass
        key = json.dumps(id_)
        if not isinstance(id_, (str, int, float)) or isinstance(id_, bool):
            refused.append({"id": no, "error": f'"id" must be a string or a number, not {key}'})
        elif key in seen:
            refused.append({"id": id_, "error": f"id {key} is also line {seen[key]}'s (ids must be unique in a prompt file)",
                            "line": no, "duplicate_of": seen[key]})
        else:
            seen[key] = no
            out.append((id_, line))
    return out, jsonl, refused


def done_records(out_dir: str) -> Dict[str, Dict[str, Any]]:
    """The records the part files hold, one per id (output.jsonl is made from them)."""
    done: Dict[str, Dict[str, Any]] = {}
    for p in sorted(glob.glob(os.path.join(out_dir, "part-*.jsonl"))):
        with open(p, encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn line cannot be in a file that was renamed into place; skip it anyway
                if isinstance(r, dict) and "id" in r:
                    done.setdefault(json.dumps(r["id"]), r)
    return done


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tllm.ray_batch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, help="the prompt file (text lines or JSONL)")
    ap.add_argument("--output", required=True, help="the output folder (made if missing; a rerun resumes)")
    ap.add_argument("-m", "--model", required=True, help="a model directory, .gguf file or hub-cache id, on every node")
    ap.add_argument("--actors", type=int, default=1, help="model replicas (Ray actors), one CPU each by default")
    ap.add_argument("--cpus-per-actor", type=float, default=1, help="Ray CPUs each actor takes (its tllm threads)")
    ap.add_argument("--batch-size", type=int, default=32, help="rows per batch (the unit written and retried)")
    ap.add_argument("-np", "--parallel", type=int, default=16, help="sequences at once in each actor")
    ap.add_argument("-n", "--max-tokens", type=int, default=256)
    ap.add_argument("--temp", "--temperature", dest="temperature", type=float)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--address", help="a Ray cluster to join (default: $RAY_ADDRESS, else a local one)")
    a = ap.parse_args(argv)

    import ray
    import tllm.ray as tray

    os.makedirs(a.output, exist_ok=True)
    lines, jsonl, refused = read_lines(a.input)
    if not lines and not refused:
        print(f"tllm.ray_batch: {a.input}: the prompt file is empty", file=sys.stderr)
        return 1
    done = done_records(a.output)
    todo = [(i, l) for i, l in lines if json.dumps(i) not in done]
    print(f"tllm.ray_batch: {len(lines)} lines, {len(lines) - len(todo)} already done, {len(todo)} to run "
          f"on {a.actors} actor(s)", file=sys.stderr)
    t0 = time.perf_counter()
    gen_tokens = 0
    if todo:
        if not ray.is_initialized():
            ray.init(address=a.address, **({} if a.address or os.environ.get("RAY_ADDRESS") else
                                              {"num_cpus": max(1, int(a.actors * a.cpus_per_actor))}),
                     log_to_driver=False)
        sampling = {k: v for k, v in (("temperature", a.temperature), ("top_p", a.top_p), ("top_k", a.top_k),
                                      ("seed", a.seed), ("max_tokens", a.max_tokens)) if v is not None}
        rows = [{"id": json.dumps(i), "line": l, "jsonl": jsonl} for i, l in todo]
        ds = ray.data.from_items(rows, override_num_blocks=max(1, (len(rows) + a.batch_size - 1) // a.batch_size))
        out = ds.map_batches(
            tray.Generator, batch_size=a.batch_size, concurrency=a.actors, num_cpus=a.cpus_per_actor,
            fn_constructor_kwargs=dict(model=os.path.abspath(a.model) if os.path.exists(a.model) else a.model,
                                       device=a.device, threads=max(1, int(a.cpus_per_actor)), parallel=a.parallel,
                                       out_dir=os.path.abspath(a.output), **sampling),
            # an actor that dies is restarted and its batch run again (the batch's file is written whole, once)
            max_restarts=-1, max_task_retries=-1)
        n_done = 0
        for b in out.iter_batches(batch_size=None):
            n_done += len(b["id"])
            gen_tokens += int(sum(b["completion_tokens"]))
            print(f"\r[{n_done}/{len(todo)}]", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    el = time.perf_counter() - t0
    # the merge: one record per line, in input order, and none missing
    done = done_records(a.output)
    missing = [i for i, _ in lines if json.dumps(i) not in done]
    if missing:
        print(f"tllm.ray_batch: {len(missing)} lines have no record (first: id {json.dumps(missing[0])}): run again "
              "to finish them", file=sys.stderr)
        return 1
    merged = [done[json.dumps(i)] for i, _ in lines] + refused
    tray.write_records(os.path.join(a.output, "output.jsonl"), merged)
    errors = sum(1 for r in merged if "error" in r)
    rate = f"{gen_tokens / el:.1f} tok/s, " if todo and el > 0 else ""
    print(f"tllm.ray_batch: {len(lines)} lines: {len(todo)} run, {len(lines) - len(todo)} already done, {errors} errors; "
          f"generated {gen_tokens} tokens in {el:.1f} s ({rate}{el / max(1, len(todo)) * 1e3:.1f} ms a row); "
          f"{os.path.join(a.output, 'output.jsonl')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
