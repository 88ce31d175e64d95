"""The C library (libtllm.so) and engine/tllm.h's declarations, for ctypes.

Every structure here mirrors one in engine/tllm.h field by field; the library is $TLLM_LIBRARY when set
(a build tree's build/libtllm.so), else the one installed beside this file.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int32, c_size_t,
                    c_uint64, c_void_p)


class SamplerParams(Structure):
    _fields_ = [("temperature", c_float), ("top_k", c_int), ("top_p", c_float), ("min_p", c_float),
                ("repeat_penalty", c_float), ("repeat_last_n", c_int), ("presence_penalty", c_float),
                ("frequency_penalty", c_float), ("seed", c_uint64)]


class EngineParams(Structure):
    _fields_ = [("threads", c_int), ("quantize_bits", c_int), ("group_size", c_int), ("exact", c_int),
                ("fast_decode", c_int), ("no_template", c_int), ("deterministic", c_int),
                ("chat_template", c_char_p)]


class SessionParams(Structure):
    _fields_ = [("n_ctx", c_int), ("device", c_char_p), ("kv_type", c_char_p)]


class GenerateParams(Structure):
    _fields_ = [("sampling", SamplerParams), ("max_tokens", c_int), ("stop", POINTER(c_char_p)), ("n_stop", c_int),
                ("skip_special", c_int), ("json_schema", c_char_p)]


class ChatMsg(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class Stats(Structure):
    _fields_ = [("n_prompt", c_int), ("n_reused", c_int), ("n_generated", c_int), ("prompt_secs", c_double),
                ("gen_secs", c_double), ("finish", c_int)]


class BatchItem(Structure):
    _fields_ = [("prompt", c_char_p), ("prompt_ids", POINTER(c_int32)), ("n_prompt_ids", c_size_t),
                ("msgs", POINTER(ChatMsg)), ("n_msgs", c_int), ("params", POINTER(GenerateParams)),
                ("chat_json", c_char_p)]


class BatchResult(Structure):
    _fields_ = [("status", c_int), ("error", c_char_p), ("text", c_void_p), ("len", c_size_t),
                ("ids", POINTER(c_int32)), ("n_ids", c_size_t), ("stats", Stats), ("tool_calls", c_char_p)]


class BatchParams(Structure):
    _fields_ = [("n_parallel", c_int), ("n_batch", c_int), ("kv_tokens", c_int)]


GEN_CB = CFUNCTYPE(c_int, c_void_p, c_size_t, c_void_p)  # text (not NUL-terminated), len, user
BATCH_CB = CFUNCTYPE(c_int, c_size_t, POINTER(BatchResult), c_void_p)

FINISH_NAMES = {0: "stop", 1: "length", 2: "length", 3: "interrupted", 4: "tool_calls"}


def _find_library() -> str:
    env = os.environ.get("TLLM_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtllm.so")
    if os.path.exists(here):
        return here
    raise ImportError("tllm: libtllm.so is neither in the package (pip install ./python builds it) "
                      "nor named by $TLLM_LIBRARY")


def _declare(lib: ctypes.CDLL) -> None:
    P, vp = POINTER, c_void_p
    sigs = {
        "tllm_version": (c_char_p, []),
        "tllm_errmsg": (c_char_p, []),
        "tllm_free": (None, [vp]),
        "tllm_sampler_defaults": (SamplerParams, []),
        "tllm_engine_open": (c_int, [c_char_p, P(EngineParams), P(vp)]),
        "tllm_engine_free": (None, [vp]),
        "tllm_engine_dir": (c_char_p, [vp]),
        "tllm_engine_vocab_size": (c_int, [vp]),
        "tllm_engine_max_context": (c_int, [vp]),
        "tllm_engine_has_tokenizer": (c_int, [vp]),
        "tllm_tokenize": (c_int, [vp, c_char_p, c_size_t, c_int, P(P(c_int32)), P(c_size_t)]),
        "tllm_detokenize": (c_int, [vp, P(c_int32), c_size_t, c_int, P(vp), P(c_size_t)]),
        "tllm_chat_apply": (c_int, [vp, P(ChatMsg), c_int, c_int, P(vp)]),
        "tllm_session_open": (c_int, [vp, P(SessionParams), P(vp)]),
        "tllm_session_free": (None, [vp]),
        "tllm_session_reset": (None, [vp]),
        "tllm_session_device": (c_char_p, [vp]),
        "tllm_session_n_ctx": (c_int, [vp]),
        "tllm_session_n_cached": (c_int, [vp]),
        "tllm_generate_params_default": (None, [vp, P(GenerateParams)]),
        "tllm_session_complete_ids": (c_int, [vp, P(c_int32), c_size_t, P(GenerateParams), GEN_CB, vp, P(vp),
                                              P(P(c_int32)), P(c_size_t), P(Stats)]),
        "tllm_session_chat_json": (c_int, [vp, c_char_p, P(GenerateParams), GEN_CB, vp, P(vp), P(vp), P(P(c_int32)),
                                           P(c_size_t), P(Stats)]),
        "tllm_session_logits": (c_int, [vp, P(c_int32), c_size_t, c_int, P(c_float)]),
        "tllm_session_generate_batch": (c_int, [vp, P(BatchItem), c_size_t, P(BatchParams), BATCH_CB, vp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


# ctypes.CDLL releases the GIL around every call: generation runs while other Python threads do
lib = ctypes.CDLL(_find_library())
_declare(lib)
