"""tllm from Python: a small, fast inference engine in C for Qwen2 / Qwen2.5 models.

    import tllm
    with tllm.Model("Qwen/Qwen2.5-0.5B-Instruct") as m:        # a directory, a GGUF file or a hub-cache id
        print(m.chat([{"role": "user", "content": "What does tar do?"}], max_tokens=64))
        msg = m.chat(history, tools=[...])    # an assistant message, with "tool_calls" when it called
        for piece in m.generate("def fib(n):", stream=True):
            print(piece, end="", flush=True)
        outs = m.generate_batch(["The tar command", "The grep command"], parallel=16, max_tokens=32)

Bindings over the public C API (engine/tllm.h) through ctypes: nothing is implemented twice. Sampling
parameters are named as in the OpenAI API and the CLI. Generation runs with the GIL released; the engines
of a process share its CPU thread pool, so calls into tllm take turns (a process-wide lock).
"""
from __future__ import annotations

import array
import ctypes
import json
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._lib import lib

__version__: str = lib.tllm_version().decode()
__all__ = ["Model", "Error", "Completion", "__version__"]

Message = Dict[str, str]
Prompt = Union[str, Sequence[int], Sequence[Message], Dict[str, Any]]

# the engines share the process's CPU thread pool: one call into tllm at a time
_lock = threading.RLock()

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n",
             "presence_penalty", "frequency_penalty")
_GEN_KEYS = set(_SAMPLING) | {"max_tokens", "stop", "json_schema", "skip_special"}
# what a chat may carry beside its messages, as OpenAI's request does (tllm_session_chat_json)
_CHAT_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")


def _plain_messages(messages: Sequence[Any]) -> bool:
    """Messages the template takes as (role, content) pairs; others (tool calls, tool results, content
    parts) go as OpenAI's request."""
    return all(isinstance(m, dict) and set(m) <= {"role", "content"} and isinstance(m.get("content"), str)
               for m in messages)


def _chat_request(messages: Sequence[Any], extra: Dict[str, Any]) -> bytes:
    req = {"messages": list(messages)}
    req.update({k: v for k, v in extra.items() if v is not None})
    return json.dumps(req, ensure_ascii=False).encode()


class Error(Exception):
    """A failure in tllm: the message is tllm_errmsg()'s text; status is the C status code."""

    def __init__(self, message: str, status: int = 4):
        super().__init__(message)
        self.message = message
        self.status = status


def _check(rc: int) -> None:
    if rc:
        raise Error(lib.tllm_errmsg().decode("utf-8", "replace"), rc)


@dataclass
class Completion:
    """One generated answer and what it took."""
    text: str
    token_ids: List[int] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop", "length", "interrupted" or "tool_calls"
    prompt_tokens: int = 0
    cached_tokens: int = 0       # of the prompt, found in the KV cache rather than computed
    completion_tokens: int = 0
    prompt_secs: float = 0.0
    gen_secs: float = 0.0
    # the calls the answer made (a chat with tools), as OpenAI's message.tool_calls: [{"id", "type":
    # "function", "function": {"name", "arguments" (JSON text)}}]; text is then what was around them
    tool_calls: Optional[List[Dict[str, Any]]] = None

    def message(self) -> Dict[str, Any]:
        """The answer as an assistant message, to append to the conversation."""
        m: Dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            m["tool_calls"] = self.tool_calls
        return m


def _completion(text: str, ids: List[int], st: _lib.Stats, calls: Optional[bytes] = None) -> Completion:
    return Completion(text=text, token_ids=ids, finish_reason=_lib.FINISH_NAMES.get(st.finish, "stop"),
                      prompt_tokens=st.n_prompt, cached_tokens=st.n_reused, completion_tokens=st.n_generated,
                      prompt_secs=st.prompt_secs, gen_secs=st.gen_secs,
                      tool_calls=json.loads(calls.decode()) if calls else None)


class _Params:
    """A tllm_generate_params and the C strings it points to (kept alive with it)."""

    def __init__(self, model: "Model", kw: Dict[str, Any]):
        model._open()
        unknown = set(kw) - _GEN_KEYS
        if unknown:
            raise TypeError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        p = _lib.GenerateParams()
        lib.tllm_generate_params_default(model._engine, ctypes.byref(p))
        for k in _SAMPLING:
            v = kw.get(k)
            if v is not None:
                setattr(p.sampling, k, v)
        if kw.get("max_tokens") is not None:
            p.max_tokens = int(kw["max_tokens"])
        if kw.get("skip_special") is not None:
            p.skip_special = int(bool(kw["skip_special"]))
        stop = kw.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        self._stop = (ctypes.c_char_p * len(stop))(*[s.encode() for s in stop]) if stop else None
        if self._stop is not None:
            p.stop, p.n_stop = ctypes.cast(self._stop, ctypes.POINTER(ctypes.c_char_p)), len(stop)
        schema = kw.get("json_schema")
        if schema is not None:
            self._schema = (schema if isinstance(schema, str) else json.dumps(schema)).encode()
            p.json_schema = self._schema
        self.c = p


class Model:
    """A loaded model (weights, tokenizer, chat template) and one sequence's KV cache.

    model: a checkpoint directory, a GGUF file, a Hugging Face repo id found in the local hub cache, or
    None ($TLLM_MODEL, else the bundled demo model). device: "auto" (a GPU through OpenCL when there is
    one, else the CPU), "cpu", "opencl" or "opencl:N". threads: CPU threads (0: the physical cores). n_ctx:
    the context a sequence may reach (0: min(the model's, 4096)). The other options are tllm_engine_params'.
    Free it with close(), a with block, or the garbage collector.
    """

    def __init__(self, model: Optional[Union[str, os.PathLike]] = None, *, device: str = "auto", threads: int = 0,
                 n_ctx: int = 0, kv_type: Optional[str] = None, quantize_bits: int = 0, group_size: int = 0,
                 exact: bool = False, fast_decode: bool = False, deterministic: bool = False,
                 chat_template: Optional[str] = None, no_template: bool = False):
        self._engine = self._session = None
        if model is None and not os.environ.get("TLLM_MODEL"):
            demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "tllm-man-demo")
            model = demo if os.path.isdir(demo) else None
        ep = _lib.EngineParams(threads=threads, quantize_bits=quantize_bits, group_size=group_size, exact=int(exact),
                               fast_decode=int(fast_decode), no_template=int(no_template),
                               deterministic=int(deterministic),
                               chat_template=os.fsencode(chat_template) if chat_template else None)
        sp = _lib.SessionParams(n_ctx=n_ctx, device=device.encode() if device else None,
                                kv_type=kv_type.encode() if kv_type else None)
        engine, session = ctypes.c_void_p(), ctypes.c_void_p()
        with _lock:
            _check(lib.tllm_engine_open(os.fsencode(model) if model is not None else None, ctypes.byref(ep),
                                        ctypes.byref(engine)))
            self._engine = engine
            rc = lib.tllm_session_open(engine, ctypes.byref(sp), ctypes.byref(session))
            if rc:
                msg = lib.tllm_errmsg().decode("utf-8", "replace")
                self.close()
                raise Error(msg, rc)
            self._session = session

    # ---- lifetime ----
    def close(self) -> None:
        """Free the session and the engine now (idempotent)."""
        with _lock:
            if self._session:
                lib.tllm_session_free(self._session)
                self._session = None
            if self._engine:
                lib.tllm_engine_free(self._engine)
                self._engine = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_engine", None) is not None and _lock is not None:
            self.close()

    def _open(self) -> None:
        if not self._session:
            raise Error("the model is closed", 4)

    # ---- what it is ----
    @property
    def path(self) -> str:
        self._open()
        return lib.tllm_engine_dir(self._engine).decode()

    @property
    def vocab_size(self) -> int:
        self._open()
        return lib.tllm_engine_vocab_size(self._engine)

    @property
    def n_ctx(self) -> int:
        self._open()
        return lib.tllm_session_n_ctx(self._session)

    @property
    def device(self) -> str:
        self._open()
        return lib.tllm_session_device(self._session).decode()

    def __repr__(self) -> str:
        if not self._session:
            return "<tllm.Model (closed)>"
        return f"<tllm.Model {self.path!r} on {self.device}, n_ctx {self.n_ctx}>"

    # ---- text ----
    def tokenize(self, text: str, *, special: bool = True) -> List[int]:
        """Token ids of text (special tokens such as <|im_start|> parsed when special)."""
        self._open()
        b = text.encode()
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        with _lock:
            _check(lib.tllm_tokenize(self._engine, b, len(b), int(special), ctypes.byref(ids), ctypes.byref(n)))
        try:
            return ids[:n.value]
        finally:
            lib.tllm_free(ids)

    def detokenize(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """The text of ids."""
        self._open()
        arr = (ctypes.c_int32 * len(ids))(*ids)
        text, n = ctypes.c_void_p(), ctypes.c_size_t()
        with _lock:
            _check(lib.tllm_detokenize(self._engine, arr, len(ids), int(skip_special), ctypes.byref(text),
                                       ctypes.byref(n)))
        try:
            return ctypes.string_at(text, n.value).decode("utf-8", "replace")
        finally:
            lib.tllm_free(text)

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        """The messages rendered with the checkpoint's chat template (as the model is prompted in chat)."""
        self._open()
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        arr = (_lib.ChatMsg * len(keep))(*[_lib.ChatMsg(r, c) for r, c in keep])
        text = ctypes.c_void_p()
        with _lock:
            _check(lib.tllm_chat_apply(self._engine, arr, len(keep), int(add_generation_prompt), ctypes.byref(text)))
        try:
            return ctypes.string_at(text).decode("utf-8", "replace")
        finally:
            lib.tllm_free(text)

    # ---- generation ----
    def _prompt_ids(self, prompt: Union[str, Sequence[int]]) -> List[int]:
        return self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)

    def _complete(self, ids: List[int], params: _Params, on_text: Optional[Any]) -> Completion:
        """One completion on the session (on_text(str) -> bool stop, called with each piece)."""
        arr = (ctypes.c_int32 * len(ids))(*ids)
        return self._session_call(lib.tllm_session_complete_ids, (arr, len(ids), ctypes.byref(params.c)), on_text, False)

    def _session_call(self, fn: Any, args: Tuple[Any, ...], on_text: Optional[Any], with_calls: bool) -> Completion:
        """fn(session, *args, piece callback, NULL, &text, [&tool_calls,] &ids, &n_ids, &stats): a completion
        or a chat of the C API, with on_text(str) -> bool stop called with each piece; what on_text raises
        (KeyboardInterrupt too) stops the reply and is raised once the call returns."""
        text, calls, st = ctypes.c_void_p(), ctypes.c_void_p(), _lib.Stats()
        out_ids, n_ids = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        raised: List[BaseException] = []

        def piece(ptr: int, n: int, user: int) -> int:
            try:
                return int(bool(on_text(ctypes.string_at(ptr, n).decode("utf-8", "replace"))))
            except BaseException as e:  # noqa: BLE001
                raised.append(e)
                return 1

        cb = _lib.GEN_CB(piece) if on_text else _lib.GEN_CB()
        outs = [ctypes.byref(text)] + ([ctypes.byref(calls)] if with_calls else [])
        outs += [ctypes.byref(out_ids), ctypes.byref(n_ids), ctypes.byref(st)]
        self._open()
        with _lock:
            _check(fn(self._session, *args, cb, None, *outs))
        try:
            result = _completion(ctypes.string_at(text).decode("utf-8", "replace"), out_ids[:n_ids.value], st,
                                 ctypes.string_at(calls) if calls.value else None)
        finally:
            lib.tllm_free(text)
            lib.tllm_free(calls)
            lib.tllm_free(out_ids)
        if raised:
            raise raised[0]
        return result

    def _stream(self, complete: Any, last: Optional[Any] = None) -> Iterator[Any]:
        """The pieces of a completion (complete(on_text)) as they come: it runs on a thread of its own (the
        GIL released); leaving the loop early stops it. last(completion), if given, makes the last item
        (None: no more)."""
        q: "queue.Queue[Any]" = queue.Queue()
        stop = threading.Event()
        done = object()

        def run() -> None:
            try:
                result = complete(lambda t: (q.put(t), stop.is_set())[1])
                end = last(result) if last else None
                if end is not None:
                    q.put(end)
                q.put(done)
            except BaseException as e:  # noqa: BLE001
                q.put(e)

        t = threading.Thread(target=run, name="tllm-generate", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            t.join()

    def generate(self, prompt: Union[str, Sequence[int]], *, stream: bool = False, details: bool = False,
                 **sampling: Any) -> Any:
        """Generate after prompt (text, special tokens parsed, or token ids).

        Sampling: max_tokens (256), temperature, top_p, top_k, min_p, seed, stop (a string or a list),
        presence_penalty, frequency_penalty, repeat_penalty, repeat_last_n, json_schema (a dict or its JSON
        text: the answer follows it), skip_special; unset ones are the checkpoint's generation_config.json.
        Returns the text; with details=True a Completion; with stream=True an iterator of text pieces.
        A prompt that repeats the beginning of the previous call's sequence computes only the rest.
        """
        ids = self._prompt_ids(prompt)
        params = _Params(self, sampling)
        if stream:
            return self._stream(lambda on_text: self._complete(ids, params, on_text))
        c = self._complete(ids, params, None)
        return c if details else c.text

    def chat(self, messages: Sequence[Dict[str, Any]], *, stream: bool = False, details: bool = False,
             tools: Optional[Sequence[Dict[str, Any]]] = None, tool_choice: Any = None,
             parallel_tool_calls: Optional[bool] = None, response_format: Optional[Dict[str, Any]] = None,
             **sampling: Any) -> Any:
        """A chat turn: messages ({"role", "content"}) rendered with the chat template and completed, as
        generate(); a conversation that resends its history computes only the new turn.

        Agents: tools, tool_choice ("auto", "none", "required" or {"type": "function", "function": {"name":
        ...}}), parallel_tool_calls and response_format are OpenAI's, and messages may hold assistant
        "tool_calls" and "tool" results; the request is read as `tllm serve` reads it. With tools offered
        the answer is an assistant message ({"role", "content", "tool_calls" when it called}: append it
        to messages), or with details=True a Completion whose tool_calls holds the calls. stream=True with
        tools yields the message in deltas, as OpenAI's stream does: {"content": piece} as the answer's
        content comes (a call's markup is never shown: text that may begin one waits for the answer's end),
        then {"tool_calls": [...]} once, at the end, when it called.
        """
        extra = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls,
                 "response_format": response_format}
        if all(v is None for v in extra.values()) and _plain_messages(messages):
            return self.generate(self.tokenize(self.apply_chat_template(messages)), stream=stream, details=details,
                                 **sampling)
        request, params = _chat_request(messages, extra), _Params(self, sampling)
        if stream and tools:
            return (d if isinstance(d, dict) else {"content": d}
                    for d in self._stream(lambda on_text: self._chat_json(request, params, on_text),
                                          lambda c: {"tool_calls": c.tool_calls} if c.tool_calls else None))
        if stream:
            return self._stream(lambda on_text: self._chat_json(request, params, on_text))
        c = self._chat_json(request, params, None)
        return c if details else c.message() if tools else c.text

    def _chat_json(self, request: bytes, params: _Params, on_text: Optional[Any]) -> Completion:
        """One chat given as OpenAI's request (tllm_session_chat_json)."""
        return self._session_call(lib.tllm_session_chat_json, (request, ctypes.byref(params.c)), on_text, True)

    def generate_batch(self, prompts: Sequence[Prompt], *, parallel: int = 0, n_batch: int = 0, kv_tokens: int = 0,
                       **sampling: Any) -> List[Union[Completion, Error]]:
        """Many prompts at once through the continuous batcher (a paged KV cache shared by `parallel`
        sequences; 0: 16 on the CPU, 64 on a GPU). Each prompt is text, token ids, a list of chat messages,
        or a dict as a line of `tllm generate --prompts` ({"prompt": ...} or {"messages": [...]}, with its
        own sampling keys, and a chat's "tools", "tool_choice", "parallel_tool_calls", "response_format"
        as chat() takes them). Returns a Completion per prompt in input order (tool_calls holding a chat's
        calls), or the Error that prompt met (the others run). A sequence's tokens do not depend on what
        runs beside it, so each equals the prompt generated alone.
        """
        self._open()
        n = len(prompts)
        keep: List[Any] = []  # the C strings and arrays the items point to
        items = (_lib.BatchItem * n)()
        base = _Params(self, sampling)
        keep.append(base)
        for i, pr in enumerate(prompts):
            it, params, chat = items[i], base, {}
            if isinstance(pr, dict):
                own = {k: v for k, v in pr.items() if k in _GEN_KEYS}
                extra = set(pr) - _GEN_KEYS - set(_CHAT_KEYS) - {"prompt", "messages", "id"}
                if extra:
                    raise TypeError(f"prompt {i}: unknown key(s): {', '.join(sorted(extra))}")
                chat = {k: pr[k] for k in _CHAT_KEYS if pr.get(k) is not None}
                if chat and "messages" not in pr:
                    raise TypeError(f"prompt {i}: {', '.join(sorted(chat))} belong to a chat: give \"messages\"")
                if own:
                    params = _Params(self, {**sampling, **own})
                    keep.append(params)
                pr = pr["messages"] if "messages" in pr else pr.get("prompt", "")
            if not isinstance(pr, str) and len(pr) and isinstance(pr[0], dict) and (chat or not _plain_messages(pr)):
                b = _chat_request(pr, chat)
                keep.append(b)
                it.chat_json = b
            elif isinstance(pr, str):
                b = pr.encode()
                keep.append(b)
                it.prompt = b
            elif len(pr) and isinstance(pr[0], dict):
                msgs = (_lib.ChatMsg * len(pr))(*[_lib.ChatMsg(m["role"].encode(), m["content"].encode()) for m in pr])
                keep.append(msgs)
                it.msgs, it.n_msgs = msgs, len(pr)
            else:
                arr = (ctypes.c_int32 * len(pr))(*pr)
                keep.append(arr)
                it.prompt_ids, it.n_prompt_ids = arr, len(pr)
            it.params = ctypes.pointer(params.c)
        results: List[Any] = [None] * n
        raised: List[BaseException] = []

        def on_item(i: int, rp: Any, user: int) -> int:
            try:
                r = rp.contents
                if r.status:
                    results[i] = Error((r.error or b"").decode("utf-8", "replace"), r.status)
                else:
                    text = ctypes.string_at(r.text, r.len).decode("utf-8", "replace")
                    results[i] = _completion(text, r.ids[:r.n_ids], r.stats, r.tool_calls)
                return 0
            except BaseException as e:  # noqa: BLE001 (Ctrl-C: the run stops, then it is raised)
                raised.append(e)
                return 1

        cb = _lib.BATCH_CB(on_item)
        bp = _lib.BatchParams(n_parallel=parallel, n_batch=n_batch, kv_tokens=kv_tokens)
        with _lock:
            _check(lib.tllm_session_generate_batch(self._session, items, n, ctypes.byref(bp), cb, None))
        if raised:
            raise raised[0]
        return results

    # ---- raw logits ----
    def logits(self, ids: Sequence[int], *, last_only: bool = False) -> Any:
        """The logits after each of ids: row p is the next token's distribution after ids[:p+1]
        (n x vocab_size float32; only the last row, vocab_size, with last_only). A numpy array when numpy
        is installed, else a list of array('f') rows (or one row)."""
        self._open()
        n, vocab = len(ids), self.vocab_size
        rows = 1 if last_only else n
        arr = (ctypes.c_int32 * n)(*ids)
        try:
            import numpy as np
        except ImportError:
            np = None
        if np is not None:
            out = np.empty((rows, vocab), dtype=np.float32)
            ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        else:
            buf = (ctypes.c_float * (rows * vocab))()
            ptr = buf
        with _lock:
            _check(lib.tllm_session_logits(self._session, arr, n, int(last_only), ptr))
        if np is not None:
            return out[0] if last_only else out
        flat = array.array("f", bytes(buf))
        got = [flat[r * vocab:(r + 1) * vocab] for r in range(rows)]
        return got[0] if last_only else got
