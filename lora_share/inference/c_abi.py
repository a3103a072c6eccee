"""liblora_share's C ABI in ctypes (cpp_runner/include/lora_share.h): where the library is found, its
status names, its structs field for field and every function's signature. ``c_library`` builds the Python
objects (Runtime, Tokenizer, Request...) over these; nothing here adds behaviour."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .c_options import REQUEST_FIELDS

REPO = Path(__file__).resolve().parents[2]
# Inside an installed wheel (make wheel): the library and the runtime libraries it loads.
PACKAGED_LIBRARY = Path(__file__).resolve().parents[1] / "_native" / "liblora_share.so.0"
# In a checkout: what `make runner` builds.
DEFAULT_LIBRARY = REPO / "build" / "liblora_share.so"

MAX_PARALLEL = 32  # LS_MAX_PARALLEL: the most KV slots, the length of stats' batch_size_counts
STATUS_NAMES = [
    "LS_OK",
    "LS_ERR_ARGUMENT",
    "LS_ERR_NOT_FOUND",
    "LS_ERR_LOAD",
    "LS_ERR_REQUEST",
    "LS_ERR_RUN",
    "LS_ERR_BUDGET",
    "LS_ERR_BUSY",
]


class NativeError(Exception):
    """A failed library call: ``status`` is its ls_status name (``LS_ERR_LOAD``...), ``message`` its text."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class LsError(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * 1024)]


class LsOptions(ctypes.Structure):
    _fields_ = [
        ("shared_ptd", ctypes.c_char_p),
        ("verify", ctypes.c_int),
        ("budget_bytes", ctypes.c_uint64),
        ("adapter_overhead_bytes", ctypes.c_uint64),
        ("parallel", ctypes.c_int),
        ("packed_cache", ctypes.c_int),
        ("packed_cache_dir", ctypes.c_char_p),
        ("speculation", ctypes.c_int),
    ]


class LsGenerateOptions(ctypes.Structure):
    _fields_ = [
        ("max_new_tokens", ctypes.c_int64),
        ("temperature", ctypes.c_double),
        ("seed", ctypes.c_uint64),
        ("ignore_eos", ctypes.c_int),
        ("top_k", ctypes.c_int64),
        ("top_p", ctypes.c_double),
        ("min_p", ctypes.c_double),
        ("repeat_penalty", ctypes.c_double),
        ("presence_penalty", ctypes.c_double),
        ("frequency_penalty", ctypes.c_double),
        ("cache_prompt", ctypes.c_int),
        *REQUEST_FIELDS,
    ]


def generate_options(lib, max_new_tokens: int, temperature: float, seed: int, ignore_eos: bool) -> LsGenerateOptions:
    """ls_generate_options from ls_generate_options_init (every field not set here at its default: a
    positional struct would leave the later ones zero), with these four set."""
    opts = LsGenerateOptions()
    lib.ls_generate_options_init(ctypes.byref(opts))
    opts.max_new_tokens, opts.temperature, opts.seed, opts.ignore_eos = (
        max_new_tokens,
        temperature,
        seed,
        int(ignore_eos),
    )
    return opts


class LsStats(ctypes.Structure):
    _fields_ = [
        ("adapters_known", ctypes.c_uint32),
        ("adapters_resident", ctypes.c_uint32),
        ("loads", ctypes.c_uint64),
        ("evictions", ctypes.c_uint64),
        ("hits", ctypes.c_uint64),
        ("last_load_ms", ctypes.c_double),
        ("total_load_ms", ctypes.c_double),
        ("budget_bytes", ctypes.c_uint64),
        ("foundation_bytes", ctypes.c_uint64),
        ("program_bytes", ctypes.c_uint64),
        ("arena_bytes", ctypes.c_uint64),
        ("resident_adapter_bytes", ctypes.c_uint64),
        ("largest_adapter_bytes", ctypes.c_uint64),
        ("process_pss_bytes", ctypes.c_int64),
        ("parallel", ctypes.c_uint32),
        ("slots_in_use", ctypes.c_uint32),
        ("prefix_hits", ctypes.c_uint64),
        ("prefix_tokens", ctypes.c_uint64),
        ("batch_steps", ctypes.c_uint64),
        ("batch_size_counts", ctypes.c_uint64 * MAX_PARALLEL),
        ("slot_bytes", ctypes.c_uint64),
        ("prompt_tokens_fed", ctypes.c_uint64),
        ("constraint_compiles", ctypes.c_uint64),
        ("constraint_compile_ms", ctypes.c_double),
        ("constraint_cache_hits", ctypes.c_uint64),
        ("constraint_cache_hit_ms", ctypes.c_double),
        ("masked_tokens", ctypes.c_uint64),
        ("mask_ms", ctypes.c_double),
        ("mask_wait_ms", ctypes.c_double),
        ("slots_cleared", ctypes.c_uint64),
        ("drafted_tokens", ctypes.c_uint64),
        ("accepted_tokens", ctypes.c_uint64),
    ]


class LsChatMessage(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


class LsLoraTerm(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("scale", ctypes.c_double)]


class LsTextResult(ctypes.Structure):
    _fields_ = [
        ("prompt_tokens", ctypes.c_uint64),
        ("completion_tokens", ctypes.c_uint64),
        ("finish_reason", ctypes.c_int),
        ("accepted_prediction_tokens", ctypes.c_uint64),
        ("rejected_prediction_tokens", ctypes.c_uint64),
    ]


# ls_finish_reason, as OpenAI names them ("eos" and a stop string are both OpenAI's "stop")
FINISH_REASONS = ["length", "stop", "callback", "stop"]
REQUEST_KINDS = {"completion": 0, "chat": 1}  # ls_request_kind

TOKEN_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_void_p)
TEXT_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_char), ctypes.c_size_t, ctypes.c_void_p)
EVENT_CALLBACK = TEXT_CALLBACK  # ls_event_callback: the same shape, JSON text
_P = ctypes.c_void_p
_ERR = ctypes.POINTER(LsError)


def load_library(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """liblora_share.so from ``path``, $LORA_SHARE_LIB, the installed package (a wheel's) or a checkout's
    build/, with every function's signature declared."""
    path = Path(
        path or os.environ.get("LORA_SHARE_LIB") or (PACKAGED_LIBRARY if PACKAGED_LIBRARY.exists() else DEFAULT_LIBRARY)
    )
    if not path.exists():
        raise NativeError(
            "LS_ERR_LOAD",
            f"{path} does not exist: install the lora_share wheel (make wheel), "
            "or build the library in a checkout with `make runner`",
        )
    lib = ctypes.CDLL(str(path))
    signatures = {
        "ls_options_init": (None, [ctypes.POINTER(LsOptions)]),
        "ls_generate_options_init": (None, [ctypes.POINTER(LsGenerateOptions)]),
        "ls_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "ls_open": (_P, [ctypes.c_char_p, ctypes.POINTER(LsOptions), _ERR]),
        "ls_open_dir": (_P, [ctypes.c_char_p, ctypes.POINTER(LsOptions), _ERR]),
        "ls_close": (None, [_P]),
        "ls_load_adapter": (_P, [_P, ctypes.c_char_p, _ERR]),
        "ls_adapter_by_name": (_P, [_P, ctypes.c_char_p, _ERR]),
        "ls_remove_adapter": (ctypes.c_int, [_P, ctypes.c_char_p, _ERR]),
        "ls_adapter_at": (_P, [_P, ctypes.c_size_t, _ERR]),
        "ls_context_length": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), _ERR]),
        "ls_adapter_name": (ctypes.c_char_p, [_P]),
        "ls_adapter_resident": (ctypes.c_int, [_P]),
        "ls_adapter_mix": (_P, [_P, ctypes.POINTER(LsLoraTerm), ctypes.c_size_t, _ERR]),
        "ls_adapter_release": (ctypes.c_int, [_P, _ERR]),
        "ls_generate": (
            ctypes.c_int,
            [
                _P,
                _P,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_size_t,
                ctypes.POINTER(LsGenerateOptions),
                TOKEN_CALLBACK,
                ctypes.c_void_p,
                _ERR,
            ],
        ),
        "ls_generate_named": (
            ctypes.c_int,
            [
                _P,
                ctypes.c_char_p,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_size_t,
                ctypes.POINTER(LsGenerateOptions),
                TOKEN_CALLBACK,
                ctypes.c_void_p,
                _ERR,
            ],
        ),
        "ls_stats": (ctypes.c_int, [_P, ctypes.POINTER(LsStats), _ERR]),
        "ls_runtime_eos_ids": (
            ctypes.c_int,
            [_P, ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_size_t), _ERR],
        ),
        "ls_request_parse": (_P, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, _ERR]),
        "ls_request_prepare": (ctypes.c_int, [_P, _P, _ERR]),
        "ls_request_run": (ctypes.c_int, [_P, _P, EVENT_CALLBACK, ctypes.c_void_p, ctypes.POINTER(LsTextResult), _ERR]),
        "ls_request_free": (None, [_P]),
        "ls_request_model": (ctypes.c_char_p, [_P]),
        "ls_request_stream": (ctypes.c_int, [_P]),
        "ls_check_options": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(LsGenerateOptions), _ERR]),
        "ls_tokenizer_open": (_P, [ctypes.c_char_p, _ERR]),
        "ls_tokenizer_close": (None, [_P]),
        "ls_runtime_tokenizer": (_P, [_P, _ERR]),
        "ls_tokenize": (
            ctypes.c_int,
            [
                _P,
                ctypes.c_char_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_size_t,
                ctypes.POINTER(ctypes.c_size_t),
                _ERR,
            ],
        ),
        "ls_detokenizer_new": (_P, [_P, ctypes.c_int, _ERR]),
        "ls_detokenizer_free": (None, [_P]),
        "ls_detokenize": (
            ctypes.c_int,
            [
                _P,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.POINTER(ctypes.POINTER(ctypes.c_char)),
                ctypes.POINTER(ctypes.c_size_t),
                _ERR,
            ],
        ),
        "ls_apply_chat_template": (
            ctypes.c_int,
            [
                _P,
                ctypes.POINTER(LsChatMessage),
                ctypes.c_size_t,
                ctypes.c_char_p,
                ctypes.c_size_t,
                ctypes.POINTER(ctypes.c_size_t),
                _ERR,
            ],
        ),
        "ls_generate_text": (
            ctypes.c_int,
            [
                _P,
                ctypes.c_char_p,
                ctypes.c_char_p,
                ctypes.POINTER(LsGenerateOptions),
                TEXT_CALLBACK,
                ctypes.c_void_p,
                ctypes.POINTER(LsTextResult),
                _ERR,
            ],
        ),
        "ls_generate_chat": (
            ctypes.c_int,
            [
                _P,
                ctypes.c_char_p,
                ctypes.POINTER(LsChatMessage),
                ctypes.c_size_t,
                ctypes.POINTER(LsGenerateOptions),
                TEXT_CALLBACK,
                ctypes.c_void_p,
                ctypes.POINTER(LsTextResult),
                _ERR,
            ],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib
