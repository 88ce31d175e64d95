"""Batch generation on Ray Data: one tllm model per actor, loaded once, a batch of rows in, records out.

    import ray, tllm.ray
    ds = ray.data.read_json("prompts.jsonl")   # rows: "prompt" or "messages" (with "tools"), optional "id"
    out = ds.map_batches(tllm.ray.Generator, fn_constructor_kwargs={"model": "DIR"}, concurrency=4,
                         batch_size=64, num_cpus=1)

Imported only when Ray is installed (``import tllm`` does not import it). Records are those of
``tllm generate --prompts -o`` (python -m tllm.ray_batch writes them as files, resumably).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Optional

import ray  # noqa: F401 (this module is Ray's integration: it needs Ray)

import tllm

# the sampling keys a prompt line may carry (tllm generate --prompts')
LINE_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop")


def line_item(row: Dict[str, Any]) -> Dict[str, Any]:
    """A prompt line's row as a generate_batch item (raises ValueError naming what is wrong)."""
    item: Dict[str, Any] = {k: _plain(row[k]) for k in LINE_KEYS if row.get(k) is not None}
    msgs, prompt = _plain(row.get("messages")), _plain(row.get("prompt"))
    if msgs is not None:
        if not isinstance(msgs, list) or not msgs:
            raise ValueError('"messages" must be a non-empty list')
        item["messages"] = msgs
    elif prompt is not None:
        if isinstance(prompt, str) and not prompt:
            raise ValueError("the prompt is empty")
        item["prompt"] = prompt
    else:
        raise ValueError('the line has neither "prompt" nor "messages"')
    chat = {k: _plain(row[k]) for k in ("tools", "tool_choice", "parallel_tool_calls") if _plain(row.get(k)) is not None}
    if chat and msgs is None:  # as tllm generate --prompts says it
        raise ValueError('"tools" are offered in a chat: give "messages"')
    item.update(chat)
    rf = _plain(row.get("response_format"))
    if rf is not None and msgs is not None:  # read with the rest of the chat, as the server reads it
        item["response_format"] = rf
    elif rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":
            item["json_schema"] = rf.get("schema", {})
        elif kind == "json_schema":
            item["json_schema"] = (rf.get("json_schema") or {}).get("schema", {})
        elif kind != "text":
            raise ValueError('"response_format": "type" must be "text", "json_object" or "json_schema"')
    return item


def parse_line(line: str, jsonl: bool) -> Dict[str, Any]:
    """A prompt file's line as a row: a JSON object (JSONL files), else the prompt's text."""
    if not jsonl:
        return {"prompt": line}
    try:
        v = json.loads(line)
    except json.JSONDecodeError:
        v = None
    if not isinstance(v, dict):
        raise ValueError("not a JSON object")
    return v


def _plain(v: Any) -> Any:
    """A cell as plain Python (Ray hands numpy scalars and arrays, or JSON text for nested columns)."""
    if v is None:
        return None
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, float) and v != v:  # a missing cell in a column others fill
        return None
    return v


def record(id_: Any, out: Any) -> Dict[str, Any]:
    """The output record of one line, as tllm generate --prompts writes it."""
    if isinstance(out, tllm.Error):
        return {"id": id_, "error": str(out)}
    rec = {"id": id_, "text": out.text, "prompt_tokens": out.prompt_tokens,
           "completion_tokens": out.completion_tokens, "finish_reason": out.finish_reason,
           "prompt_secs": out.prompt_secs, "gen_secs": out.gen_secs,
           "prompt_tps": out.prompt_tokens / out.prompt_secs if out.prompt_secs > 0 else 0,
           "gen_tps": out.completion_tokens / out.gen_secs if out.gen_secs > 0 else 0}
    if out.tool_calls:
        rec["tool_calls"] = out.tool_calls
    return rec


class Generator:
    """A callable class for ``Dataset.map_batches``: the model is loaded once per actor.

    Rows are prompt lines ("id", "prompt" or "messages", per-row sampling keys, "response_format");
    ``sampling`` are the defaults (OpenAI names). Each batch of rows runs through the continuous
    batcher (``parallel`` sequences at once). Returns the columns "id" and "record" (the output record as
    JSON text), plus "completion_tokens" for counting. With ``out_dir`` each batch's records are also
    written there as one file, atomically, named by the batch's ids: a batch retried after its actor
    died writes the same file again (never a second copy), so a run's files hold each row once.
    """

    def __init__(self, model: str, *, device: str = "cpu", threads: int = 0, parallel: int = 16,
                 fast_decode: bool = True, out_dir: Optional[str] = None, **sampling: Any):
        self.model = tllm.Model(model, device=device, threads=threads, fast_decode=fast_decode)
        self.parallel, self.sampling, self.out_dir = parallel, sampling, out_dir

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, List[Any]]:
        cols = list(batch)
        n = len(batch[cols[0]]) if cols else 0
        rows = [{c: batch[c][i] for c in cols} for i in range(n)]
        ids: List[Any] = []
        items, where, errors = [], [], {}
        for i, r in enumerate(rows):
            try:
                if "line" in r:  # a prompt file's line as it was read (python -m tllm.ray_batch)
                    ids.append(json.loads(r["id"]))
                    r = parse_line(str(r["line"]), bool(r["jsonl"]))
                else:
                    ids.append(_plain(r.get("id")))
                items.append(line_item(r))
                where.append(i)
            except ValueError as e:
                errors[i] = tllm.Error(str(e))
        outs: List[Any] = [None] * n
        for i, o in zip(where, self.model.generate_batch(items, parallel=self.parallel, **self.sampling)):
            outs[i] = o
        for i, e in errors.items():
            outs[i] = e
        recs = [record(ids[i], outs[i]) for i in range(n)]
        if self.out_dir is not None and n:
            write_part(self.out_dir, recs)
        return {"id": [json.dumps(i) for i in ids], "record": [json.dumps(r, ensure_ascii=False) for r in recs],
                "completion_tokens": [r.get("completion_tokens", 0) for r in recs]}


def part_name(recs: List[Dict[str, Any]]) -> str:
    """A batch's file: named by its ids, so the same batch done twice is the same file."""
    h = hashlib.sha1("\n".join(json.dumps(r["id"]) for r in recs).encode()).hexdigest()[:20]
    return f"part-{h}.jsonl"


def write_part(out_dir: str, recs: List[Dict[str, Any]]) -> str:
    """A batch's records as its part file in out_dir."""
    return write_records(os.path.join(out_dir, part_name(recs)), recs)


def write_records(path: str, recs: List[Dict[str, Any]]) -> str:
    """Records as one JSONL file, atomically (a temporary name, fsync, rename): a reader sees all or none."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
