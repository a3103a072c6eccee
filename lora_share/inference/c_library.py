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

from .c_abi import (
    EVENT_CALLBACK,
    FINISH_REASONS,
    REQUEST_KINDS,
    TEXT_CALLBACK,
    TOKEN_CALLBACK,
    NativeError,
    load_library,
)
from .c_abi import LsChatMessage as _ChatMessage
from .c_abi import LsError as _Error
from .c_abi import LsLoraTerm as _LoraTerm
from .c_abi import LsOptions as _Options
from .c_abi import LsStats as _Stats
from .c_abi import LsTextResult as _TextResult
from .c_abi import generate_options as _generate_options
from .c_options import ChoiceCollector, set_request_options

SPECULATION_EVERY_DRAFT = 2  # lora_share.h's LS_SPECULATION_EVERY_DRAFT


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
            "accepted_prediction_tokens": result.accepted_prediction_tokens,
            "rejected_prediction_tokens": result.rejected_prediction_tokens,
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
    speculation: bool | str = True,
) -> _Options:
    """ls_options; ``packed_cache``: True (the default folders), False (packed in memory) or a folder;
    ``speculation`` False: no request verifies drafts (lora_share.h, SPECULATION; on, parallel 1 included);
    ``"every_draft"``: each step verifies every draft found, not as many as pay for its width."""
    opts = _Options()
    lib.ls_options_init(ctypes.byref(opts))
    opts.shared_ptd, opts.verify, opts.budget_bytes = _path(shared_ptd), int(verify), budget_bytes
    opts.adapter_overhead_bytes, opts.parallel = adapter_overhead_bytes, parallel
    opts.packed_cache = int(packed_cache is not False)
    opts.packed_cache_dir = None if isinstance(packed_cache, bool) else _path(packed_cache)
    if speculation == "every_draft":
        opts.speculation = SPECULATION_EVERY_DRAFT
    elif isinstance(speculation, int):  # True, False, or ls_options' own values (the library checks them)
        opts.speculation = int(speculation)
    else:
        raise ValueError(f"speculation={speculation!r}: give True, False or 'every_draft'")
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
    speculation: bool | str = True,
) -> Runtime:
    """ls_open: the foundation at ``ptd``; adapters come with ``load_adapter``. ``parallel``: KV slots,
    requests from several threads batched at once (lora_share.h, THREADS); ``packed_cache``: the
    packed-weights file (lora_share.h, PACKED WEIGHTS): True, False (off) or its folder."""
    lib = load_library(library)
    err = _Error()
    opts = _options(lib, shared_ptd, verify, budget_bytes, adapter_overhead_bytes, parallel, packed_cache, speculation)
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
    speculation: bool | str = True,
) -> Runtime:
    """ls_open_dir: every adapter of a build folder's manifest.json, loaded on demand under ``budget_bytes``
    (``adapter_overhead_bytes``: the per-adapter constant of the accounting, 0 = the library's default;
    ``parallel``: KV slots, requests from several threads batched at once; ``packed_cache``: the
    packed-weights file, True, False (off) or its folder)."""
    lib = load_library(library)
    err = _Error()
    opts = _options(lib, None, verify, budget_bytes, adapter_overhead_bytes, parallel, packed_cache, speculation)
    h = lib.ls_open_dir(_path(folder), ctypes.byref(opts), ctypes.byref(err))
    if not h:
        _raise(lib, err)
    return Runtime(lib, h)
