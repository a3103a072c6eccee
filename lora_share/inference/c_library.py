"""A thin ctypes binding over the C library (cpp_runner/include/lora_share.h).

It adds nothing to the C API's behaviour: every call goes straight to liblora_share.so, so tests and
benchmarks drive the same code an application links. A failing call raises ``NativeError`` carrying
the library's status name and message.

    with native.open_dir("out/x", budget_bytes=...) as rt:
        tokens = rt.generate("support_bot", [1, 17, 42], max_new_tokens=8)
        print(rt.stats()["loads"])
"""

from __future__ import annotations

import ctypes
import os
import weakref
from pathlib import Path

from .c_options import REQUEST_FIELDS, ChoiceCollector, set_request_options

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


class _Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * 1024)]


class _Options(ctypes.Structure):
    _fields_ = [
        ("shared_ptd", ctypes.c_char_p),
        ("verify", ctypes.c_int),
        ("budget_bytes", ctypes.c_uint64),
        ("adapter_overhead_bytes", ctypes.c_uint64),
        ("parallel", ctypes.c_int),
        ("packed_cache", ctypes.c_int),
        ("packed_cache_dir", ctypes.c_char_p),
    ]


class _GenerateOptions(ctypes.Structure):
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


def _generate_options(lib, max_new_tokens: int, temperature: float, seed: int, ignore_eos: bool) -> _GenerateOptions:
    """ls_generate_options from ls_generate_options_init (every field not set here at its default: a
    positional struct would leave the later ones zero), with these four set."""
    opts = _GenerateOptions()
    lib.ls_generate_options_init(ctypes.byref(opts))
    opts.max_new_tokens, opts.temperature, opts.seed, opts.ignore_eos = (
        max_new_tokens,
        temperature,
        seed,
        int(ignore_eos),
    )
    return opts


class _Stats(ctypes.Structure):
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
    ]


class _ChatMessage(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


class _LoraTerm(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("scale", ctypes.c_double)]


class _TextResult(ctypes.Structure):
    _fields_ = [
        ("prompt_tokens", ctypes.c_uint64),
        ("completion_tokens", ctypes.c_uint64),
        ("finish_reason", ctypes.c_int),
    ]


# ls_finish_reason, as OpenAI names them ("eos" and a stop string are both OpenAI's "stop")
FINISH_REASONS = ["length", "stop", "callback", "stop"]
REQUEST_KINDS = {"completion": 0, "chat": 1}  # ls_request_kind

TOKEN_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_void_p)
TEXT_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_char), ctypes.c_size_t, ctypes.c_void_p)
EVENT_CALLBACK = TEXT_CALLBACK  # ls_event_callback: the same shape, JSON text
_P = ctypes.c_void_p
_ERR = ctypes.POINTER(_Error)


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
        "ls_options_init": (None, [ctypes.POINTER(_Options)]),
        "ls_generate_options_init": (None, [ctypes.POINTER(_GenerateOptions)]),
        "ls_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "ls_open": (_P, [ctypes.c_char_p, ctypes.POINTER(_Options), _ERR]),
        "ls_open_dir": (_P, [ctypes.c_char_p, ctypes.POINTER(_Options), _ERR]),
        "ls_close": (None, [_P]),
        "ls_load_adapter": (_P, [_P, ctypes.c_char_p, _ERR]),
        "ls_adapter_by_name": (_P, [_P, ctypes.c_char_p, _ERR]),
        "ls_remove_adapter": (ctypes.c_int, [_P, ctypes.c_char_p, _ERR]),
        "ls_adapter_at": (_P, [_P, ctypes.c_size_t, _ERR]),
        "ls_context_length": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), _ERR]),
        "ls_adapter_name": (ctypes.c_char_p, [_P]),
        "ls_adapter_resident": (ctypes.c_int, [_P]),
        "ls_adapter_mix": (_P, [_P, ctypes.POINTER(_LoraTerm), ctypes.c_size_t, _ERR]),
        "ls_adapter_release": (ctypes.c_int, [_P, _ERR]),
        "ls_generate": (
            ctypes.c_int,
            [
                _P,
                _P,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_size_t,
                ctypes.POINTER(_GenerateOptions),
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
                ctypes.POINTER(_GenerateOptions),
                TOKEN_CALLBACK,
                ctypes.c_void_p,
                _ERR,
            ],
        ),
        "ls_stats": (ctypes.c_int, [_P, ctypes.POINTER(_Stats), _ERR]),
        "ls_runtime_eos_ids": (
            ctypes.c_int,
            [_P, ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_size_t), _ERR],
        ),
        "ls_request_parse": (_P, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, _ERR]),
        "ls_request_prepare": (ctypes.c_int, [_P, _P, _ERR]),
        "ls_request_run": (ctypes.c_int, [_P, _P, EVENT_CALLBACK, ctypes.c_void_p, ctypes.POINTER(_TextResult), _ERR]),
        "ls_request_free": (None, [_P]),
        "ls_request_model": (ctypes.c_char_p, [_P]),
        "ls_request_stream": (ctypes.c_int, [_P]),
        "ls_check_options": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(_GenerateOptions), _ERR]),
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
                ctypes.POINTER(_ChatMessage),
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
                ctypes.POINTER(_GenerateOptions),
                TEXT_CALLBACK,
                ctypes.c_void_p,
                ctypes.POINTER(_TextResult),
                _ERR,
            ],
        ),
        "ls_generate_chat": (
            ctypes.c_int,
            [
                _P,
                ctypes.c_char_p,
                ctypes.POINTER(_ChatMessage),
                ctypes.c_size_t,
                ctypes.POINTER(_GenerateOptions),
                TEXT_CALLBACK,
                ctypes.c_void_p,
                ctypes.POINTER(_TextResult),
                _ERR,
            ],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _raise(lib, err: _Error) -> None:
    raise NativeError(lib.ls_status_name(err.code).decode(), err.message.decode("utf-8", "replace"))


def _path(p) -> bytes | None:
    return None if p is None else os.fsencode(p)


def _messages(messages: list[dict]):
    """OpenAI-shaped messages as an ls_chat_message array (and the bytes it points to, kept alive)."""
    array = (_ChatMessage * len(messages))()
    for i, m in enumerate(messages):
        array[i].role, array[i].content = m["role"].encode(), m["content"].encode()
    return array


class Tokenizer:
    """An ls_tokenizer: a build's (``open_tokenizer``) or a runtime's (``Runtime.tokenizer``, owned by it)."""

    def __init__(self, lib: ctypes.CDLL, handle: int, owned: bool):
        self.lib, self.handle, self.owned = lib, handle, owned

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.owned and self.handle:
            self.lib.ls_tokenizer_close(self.handle)
        self.handle = None

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """ls_tokenize: sized by a first call with no buffer, then filled."""
        data, n, err = text.encode(), ctypes.c_size_t(0), _Error()
        if (
            self.lib.ls_tokenize(
                self.handle, data, len(data), int(add_special), None, 0, ctypes.byref(n), ctypes.byref(err)
            )
            != 0
        ):
            _raise(self.lib, err)
        ids = (ctypes.c_int64 * max(n.value, 1))()
        if (
            self.lib.ls_tokenize(
                self.handle, data, len(data), int(add_special), ids, n.value, ctypes.byref(n), ctypes.byref(err)
            )
            != 0
        ):
            _raise(self.lib, err)
        return list(ids[: n.value])

    def stream(self, skip_special: bool = True) -> Detokenizer:
        err = _Error()
        h = self.lib.ls_detokenizer_new(self.handle, int(skip_special), ctypes.byref(err))
        if not h:
            _raise(self.lib, err)
        return Detokenizer(self.lib, h)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        with self.stream(skip_special) as d:
            return d.push(ids, flush=True)

    def apply_chat_template(self, messages: list[dict]) -> str:
        """ls_apply_chat_template: the prompt text of ``[{"role", "content"}, ...]``."""
        array, n, err = _messages(messages), ctypes.c_size_t(0), _Error()
        if (
            self.lib.ls_apply_chat_template(
                self.handle, array, len(messages), None, 0, ctypes.byref(n), ctypes.byref(err)
            )
            != 0
        ):
            _raise(self.lib, err)
        buffer = ctypes.create_string_buffer(n.value + 1)
        if (
            self.lib.ls_apply_chat_template(
                self.handle, array, len(messages), buffer, n.value + 1, ctypes.byref(n), ctypes.byref(err)
            )
            != 0
        ):
            _raise(self.lib, err)
        return buffer.raw[: n.value].decode()


class Detokenizer:
    """An ls_detokenizer: ``push(ids)`` returns the text those ids complete (whole characters only)."""

    def __init__(self, lib: ctypes.CDLL, handle: int):
        self.lib, self.handle = lib, handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.handle:
            self.lib.ls_detokenizer_free(self.handle)
            self.handle = None

    def push(self, ids: list[int], flush: bool = False) -> str:
        array = (ctypes.c_int64 * max(len(ids), 1))(*ids)
        text, n, err = ctypes.POINTER(ctypes.c_char)(), ctypes.c_size_t(0), _Error()
        if (
            self.lib.ls_detokenize(
                self.handle, array, len(ids), int(flush), ctypes.byref(text), ctypes.byref(n), ctypes.byref(err)
            )
            != 0
        ):
            _raise(self.lib, err)
        return ctypes.string_at(text, n.value).decode()


def open_tokenizer(path, library=None) -> Tokenizer:
    """ls_tokenizer_open: a build folder's tokenizer (checked against its foundation) or a tokenizer.json."""
    lib = load_library(library)
    err = _Error()
    h = lib.ls_tokenizer_open(_path(path), ctypes.byref(err))
    if not h:
        _raise(lib, err)
    return Tokenizer(lib, h, owned=True)


class Adapter:
    """A handle the runtime returned: valid while the runtime is open."""

    def __init__(self, runtime: Runtime, handle: int):
        self.runtime, self.handle = runtime, handle

    @property
    def name(self) -> str:
        return self.runtime.lib.ls_adapter_name(self.handle).decode()

    @property
    def resident(self) -> bool:
        return bool(self.runtime.lib.ls_adapter_resident(self.handle))

    def release(self) -> None:
        """ls_adapter_release: drops one hold of a mix (Runtime.mix); the handle is invalid after the last."""
        err = _Error()
        if self.runtime.lib.ls_adapter_release(self.handle, ctypes.byref(err)) != 0:
            _raise(self.runtime.lib, err)


class Request:
    """An ls_request: an OpenAI body read by the library's one request schema (lora_share.h, REQUESTS),
    prepared against the runtime that made it (``Runtime.request``). Free it (or use ``with``)."""

    def __init__(self, runtime: Runtime, handle: int):
        self.runtime, self.handle = runtime, handle
        self.running = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def free(self) -> None:
        """ls_request_free (its mix released); the runtime's close frees what is left."""
        if self.handle and self.runtime.handle:
            self.runtime.lib.ls_request_free(self.handle)
        self.handle = None

    @property
    def stream(self) -> bool:
        return bool(self.runtime.lib.ls_request_stream(self.handle))

    def prepare(self) -> None:
        """ls_request_prepare: the model, the mix, the prompt and the context checked; raises on a bad request."""
        err = _Error()
        if self.runtime.lib.ls_request_prepare(self.runtime.handle, self.handle, ctypes.byref(err)) != 0:
            _raise(self.runtime.lib, err)

    def run(self, on_event, stop=None) -> dict:
        """ls_request_run: ``on_event(json_text)`` gets each OpenAI event; ``stop()`` returning True ends
        generation at the next token. Returns the ls_text_result as a dict."""

        def on_json(data, length, _user):
            on_event(ctypes.string_at(data, length).decode())
            return 1 if stop is not None and stop() else 0

        callback = EVENT_CALLBACK(on_json)
        result, err = _TextResult(), _Error()
        lib = self.runtime.lib
        self.running = True
        try:
            status = lib.ls_request_run(
                self.runtime.handle, self.handle, callback, None, ctypes.byref(result), ctypes.byref(err)
            )
        finally:
            self.running = False
        if status != 0:
            _raise(lib, err)
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "finish_reason": FINISH_REASONS[result.finish_reason],
        }


class Runtime:
    """An open ls_runtime. Use ``open``/``open_dir``; close it (or use ``with``)."""

    def __init__(self, lib: ctypes.CDLL, handle: int):
        self.lib, self.handle = lib, handle
        self._requests: weakref.WeakSet[Request] = weakref.WeakSet()  # freed before the runtime closes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.handle:
            for request in list(self._requests):  # a stream never iterated still holds one
                if not request.running:
                    request.free()
            self.lib.ls_close(self.handle)
            self.handle = None

    def load_adapter(self, pte) -> Adapter:
        err = _Error()
        h = self.lib.ls_load_adapter(self.handle, _path(pte), ctypes.byref(err))
        if not h:
            _raise(self.lib, err)
        return Adapter(self, h)

    def remove_adapter(self, name: str) -> None:
        """ls_remove_adapter: new requests on ``name`` are refused at once; returns once those in flight
        on it have finished and it is unloaded."""
        err = _Error()
        if self.lib.ls_remove_adapter(self.handle, name.encode(), ctypes.byref(err)) != 0:
            _raise(self.lib, err)

    def mix(self, lora: list[dict]) -> Adapter:
        """ls_adapter_mix: ``[{"name": adapter, "scale": factor}, ...]`` as one adapter, held until its
        ``release()`` (the same terms while held: the same mix, held once more)."""
        terms = (_LoraTerm * len(lora))()
        for i, term in enumerate(lora):
            if not (
                isinstance(term, dict)
                and set(term) == {"name", "scale"}
                and isinstance(term["name"], str)
                and isinstance(term["scale"], (int, float))
                and not isinstance(term["scale"], bool)
            ):
                raise TypeError(f"lora[{i}] must be {{'name': adapter, 'scale': number}}, got {term!r}")
            terms[i].name, terms[i].scale = term["name"].encode(), term["scale"]
        err = _Error()
        h = self.lib.ls_adapter_mix(self.handle, terms, len(lora), ctypes.byref(err))
        if not h:
            _raise(self.lib, err)
        return Adapter(self, h)

    def adapter(self, name: str) -> Adapter:
        err = _Error()
        h = self.lib.ls_adapter_by_name(self.handle, name.encode(), ctypes.byref(err))
        if not h:
            _raise(self.lib, err)
        return Adapter(self, h)

    def generate(
        self,
        adapter: Adapter | str | None,
        prompt: list[int],
        max_new_tokens: int = 16,
        temperature: float = 0.0,
        seed: int = 0,
        stop_after: int | None = None,
        ignore_eos: bool = False,
    ) -> list[int]:
        """The generated ids. ``adapter`` a handle, a name (ls_generate_named; "base" is the foundation
        alone) or None (the foundation alone, a NULL handle); ``stop_after`` makes the callback return
        nonzero after that many tokens; ``ignore_eos`` goes on past the build's EOS ids."""
        out: list[int] = []

        def on_token(token, _user):
            out.append(token)
            return 1 if stop_after is not None and len(out) >= stop_after else 0

        callback = TOKEN_CALLBACK(on_token)
        ids = (ctypes.c_int64 * len(prompt))(*prompt)
        opts = _generate_options(self.lib, max_new_tokens, temperature, seed, ignore_eos)
        err = _Error()
        if isinstance(adapter, str):
            status = self.lib.ls_generate_named(
                self.handle, adapter.encode(), ids, len(prompt), ctypes.byref(opts), callback, None, ctypes.byref(err)
            )
        else:
            handle = None if adapter is None else adapter.handle
            status = self.lib.ls_generate(
                self.handle, handle, ids, len(prompt), ctypes.byref(opts), callback, None, ctypes.byref(err)
            )
        if status != 0:
            _raise(self.lib, err)
        return out

    def generate_choices(
        self,
        adapter: str,
        prompt: list[int],
        max_new_tokens: int = 16,
        temperature: float = 0.0,
        seed: int = 0,
        **request,
    ) -> list[dict]:
        """ls_generate_named with the request options of lora_share.h's STRUCTURED OUTPUT (``request``:
        ``constraint``, ``logit_bias``, ``logprobs``, ``top_logprobs``, ``n``; c_options.set_request_options
        says how each is given) and ``cache_prompt``; each token comes through on_token_info. Returns one
        dict per choice: ``tokens``, ``logprobs``, ``top_logprobs`` (c_options.ChoiceCollector)."""
        opts = _generate_options(self.lib, max_new_tokens, temperature, seed, False)
        opts.cache_prompt = int(request.pop("cache_prompt", True))
        keep = set_request_options(opts, **request)
        collector = ChoiceCollector(opts.n)
        opts.on_token_info = collector.callback
        ids = (ctypes.c_int64 * len(prompt))(*prompt)
        err = _Error()
        status = self.lib.ls_generate_named(
            self.handle,
            adapter.encode(),
            ids,
            len(prompt),
            ctypes.byref(opts),
            TOKEN_CALLBACK(),
            None,
            ctypes.byref(err),
        )
        del keep
        if status != 0:
            _raise(self.lib, err)
        return collector.choices

    def check_options(self, adapter: str, ignore_eos: bool = False, **request) -> None:
        """ls_check_options: raises what ls_generate_named would for these options (the constraint compiled
        into the runtime's cache)."""
        opts = _generate_options(self.lib, 16, 0.0, 0, ignore_eos)
        keep = set_request_options(opts, **request)
        err = _Error()
        status = self.lib.ls_check_options(self.handle, adapter.encode(), ctypes.byref(opts), ctypes.byref(err))
        del keep
        if status != 0:
            _raise(self.lib, err)

    def tokenizer(self) -> Tokenizer:
        """ls_runtime_tokenizer: the build's, owned by the runtime."""
        err = _Error()
        h = self.lib.ls_runtime_tokenizer(self.handle, ctypes.byref(err))
        if not h:
            _raise(self.lib, err)
        return Tokenizer(self.lib, h, owned=False)

    def generate_text(
        self,
        adapter: str,
        prompt: str | list[dict],
        max_new_tokens: int = 16,
        temperature: float = 0.0,
        seed: int = 0,
        ignore_eos: bool = False,
        on_text=None,
        stop_after: int | None = None,
        stop=None,
    ) -> tuple[str, dict]:
        """ls_generate_text (``prompt`` a string) or ls_generate_chat (a list of messages) for the adapter
        called ``adapter`` ("base": the foundation alone): the text, and the ls_text_result as a dict
        (``finish_reason`` "length", "stop" or "callback"). ``on_text(piece)`` gets each piece as it comes;
        ``stop_after`` makes the callback ask to stop after that many pieces, ``stop()`` returning True
        at the next piece."""
        pieces: list[str] = []

        def on_piece(data, length, _user):
            piece = ctypes.string_at(data, length).decode()
            pieces.append(piece)
            if on_text is not None:
                on_text(piece)
            return 1 if (stop_after is not None and len(pieces) >= stop_after) or (stop and stop()) else 0

        callback = TEXT_CALLBACK(on_piece)
        opts = _generate_options(self.lib, max_new_tokens, temperature, seed, ignore_eos)
        result, err = _TextResult(), _Error()
        if isinstance(prompt, str):
            status = self.lib.ls_generate_text(
                self.handle,
                adapter.encode(),
                prompt.encode(),
                ctypes.byref(opts),
                callback,
                None,
                ctypes.byref(result),
                ctypes.byref(err),
            )
        else:
            array = _messages(prompt)
            status = self.lib.ls_generate_chat(
                self.handle,
                adapter.encode(),
                array,
                len(prompt),
                ctypes.byref(opts),
                callback,
                None,
                ctypes.byref(result),
                ctypes.byref(err),
            )
        if status != 0:
            _raise(self.lib, err)
        return "".join(pieces), {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "finish_reason": FINISH_REASONS[result.finish_reason],
        }

    def request(self, kind: str, body: str) -> Request:
        """ls_request_parse: ``body`` (an OpenAI JSON body) of ``kind`` "completion" or "chat"."""
        data, err = body.encode(), _Error()
        h = self.lib.ls_request_parse(REQUEST_KINDS[kind], data, len(data), ctypes.byref(err))
        if not h:
            _raise(self.lib, err)
        request = Request(self, h)
        self._requests.add(request)
        return request

    def eos_ids(self) -> list[int]:
        """ls_runtime_eos_ids: the build's end-of-sequence ids."""
        ids, n, err = ctypes.POINTER(ctypes.c_int64)(), ctypes.c_size_t(0), _Error()
        if self.lib.ls_runtime_eos_ids(self.handle, ctypes.byref(ids), ctypes.byref(n), ctypes.byref(err)) != 0:
            _raise(self.lib, err)
        return [ids[i] for i in range(n.value)]

    def stats(self) -> dict:
        """ls_stats as a dict of its fields (``batch_size_counts`` a list: [b - 1] counts steps of b rows)."""
        stats, err = _Stats(), _Error()
        if self.lib.ls_stats(self.handle, ctypes.byref(stats), ctypes.byref(err)) != 0:
            _raise(self.lib, err)
        out = {name: getattr(stats, name) for name, _ in _Stats._fields_}
        out["batch_size_counts"] = list(stats.batch_size_counts)
        return out


def _options(
    lib,
    shared_ptd=None,
    verify: bool = True,
    budget_bytes: int = 0,
    adapter_overhead_bytes: int = 0,
    parallel: int = 1,
    packed_cache=True,
) -> _Options:
    """ls_options; ``packed_cache``: True (the default folders), False (packed in memory) or a folder."""
    opts = _Options()
    lib.ls_options_init(ctypes.byref(opts))
    opts.shared_ptd, opts.verify, opts.budget_bytes = _path(shared_ptd), int(verify), budget_bytes
    opts.adapter_overhead_bytes, opts.parallel = adapter_overhead_bytes, parallel
    opts.packed_cache = int(packed_cache is not False)
    opts.packed_cache_dir = None if isinstance(packed_cache, bool) else _path(packed_cache)
    return opts


def open(
    ptd,
    shared_ptd=None,
    verify: bool = True,
    budget_bytes: int = 0,
    adapter_overhead_bytes: int = 0,  # noqa: A001
    library=None,
    parallel: int = 1,
    packed_cache=True,
) -> Runtime:
    """ls_open: the foundation at ``ptd``; adapters come with ``load_adapter``. ``parallel``: KV slots,
    requests from several threads batched at once (lora_share.h, THREADS); ``packed_cache``: the
    packed-weights file (lora_share.h, PACKED WEIGHTS): True, False (off) or its folder."""
    lib = load_library(library)
    err = _Error()
    opts = _options(lib, shared_ptd, verify, budget_bytes, adapter_overhead_bytes, parallel, packed_cache)
    h = lib.ls_open(_path(ptd), ctypes.byref(opts), ctypes.byref(err))
    if not h:
        _raise(lib, err)
    return Runtime(lib, h)


def open_dir(
    folder,
    budget_bytes: int = 0,
    verify: bool = True,
    adapter_overhead_bytes: int = 0,
    library=None,
    parallel: int = 1,
    packed_cache=True,
) -> Runtime:
    """ls_open_dir: every adapter of a build folder's manifest.json, loaded on demand under ``budget_bytes``
    (``adapter_overhead_bytes``: the per-adapter constant of the accounting, 0 = the library's default;
    ``parallel``: KV slots, requests from several threads batched at once; ``packed_cache``: the
    packed-weights file, True, False (off) or its folder)."""
    lib = load_library(library)
    err = _Error()
    opts = _options(lib, None, verify, budget_bytes, adapter_overhead_bytes, parallel, packed_cache)
    h = lib.ls_open_dir(_path(folder), ctypes.byref(opts), ctypes.byref(err))
    if not h:
        _raise(lib, err)
    return Runtime(lib, h)
