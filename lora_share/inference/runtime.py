"""``lora_share.Runtime``: a deployment folder served in-process by the C library, text in and out.

    from lora_share import Runtime
    rt = Runtime("out/smollm2")
    rt.adapters                                    # ["brief", "json", ...]
    rt.create_chat_completion([{"role": "user", "content": "Why is the sky blue?"}], adapter="brief")
    for chunk in rt.generate("Once upon a time", adapter="json", max_tokens=32, stream=True):
        print(chunk["choices"][0]["text"], end="")
    rt.generate("Once upon a time", lora=[{"name": "brief", "scale": 0.5}, {"name": "json", "scale": 1.1}])

Every call goes to liblora_share (lora_share.h: ls_open_dir, ls_generate_text, ls_generate_chat, ls_stats),
so the answers are the server's and build/runner's; the build's tokenizer and chat template are read by the
library too. Results are OpenAI-shaped dicts as llama-cpp-python returns them. Nothing here needs torch:
installed from the wheel (``make wheel``), the library and the runtime libraries it loads come inside the
package. A failing call raises ``NativeError`` carrying the library's status and message.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator

from . import c_library
from .c_library import NativeError

BASE = "base"  # the foundation alone (LS_BASE_NAME)


class Runtime:
    """A deployment folder written by ``lora-share build``: every adapter its manifest lists, loaded on
    first use (under ``budget_bytes``, 0 = no budget), one foundation shared by all. ``library``: a
    liblora_share.so to use instead of the installed one. ``parallel``: KV slots; calls from that many
    threads at once run in one batch (lora_share.h, THREADS), 1: one at a time. ``packed_cache``:
    XNNPACK's packed weights kept in a file between starts (lora_share.h, PACKED WEIGHTS): True (beside
    the deployment, else the user's cache folder), False (packed in memory at every start) or a folder."""

    def __init__(
        self,
        path: str | os.PathLike,
        budget_bytes: int = 0,
        library: str | os.PathLike | None = None,
        parallel: int = 1,
        packed_cache: bool | str | os.PathLike = True,
    ):
        self.path = os.fspath(path)
        self._rt = c_library.open_dir(
            self.path, budget_bytes=budget_bytes, library=library, parallel=parallel, packed_cache=packed_cache
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Unloads everything; the object is unusable afterwards."""
        self._rt.close()

    @property
    def adapters(self) -> list[str]:
        """The adapters' names, in the manifest's order ("base", the foundation alone, is not listed)."""
        lib, err = self._rt.lib, c_library._Error()
        names = []
        for i in range(self._rt.stats()["adapters_known"]):
            handle = lib.ls_adapter_at(self._rt.handle, i, c_library.ctypes.byref(err))
            if not handle:
                c_library._raise(lib, err)
            names.append(lib.ls_adapter_name(handle).decode())
        return names

    def stats(self) -> dict:
        """ls_stats: adapters known and resident, loads, evictions, accounted memory, the process's PSS."""
        return self._rt.stats()

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """The build's tokenizer (ls_tokenize)."""
        return self._rt.tokenizer().encode(text, add_special)

    def detokenize(self, ids: list[int], skip_special: bool = True) -> str:
        return self._rt.tokenizer().decode(ids, skip_special)

    def generate(
        self,
        prompt: str,
        adapter: str = BASE,
        max_tokens: int | None = 16,
        temperature: float = 0.0,
        seed: int = 0,
        stream: bool = False,
        lora: list[dict] | None = None,
    ) -> dict | Iterator[dict]:
        """A text completion (the prompt encoded with the tokenizer's special tokens), as
        llama-cpp-python's ``create_completion``: a ``text_completion`` dict, or with ``stream`` an
        iterator of chunks. ``max_tokens`` None: up to the end of the context. ``lora``: a mix of
        adapters instead of one, ``[{"name": adapter, "scale": number}, ...]`` (ls_adapter_mix: as peft's
        ``add_weighted_adapter(combination_type="cat")``), with ``adapter`` left "base"."""
        return self._complete(prompt, adapter, max_tokens, temperature, seed, stream, chat=False, lora=lora)

    def create_chat_completion(
        self,
        messages: list[dict],
        adapter: str = BASE,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        stream: bool = False,
        lora: list[dict] | None = None,
    ) -> dict | Iterator[dict]:
        """A chat completion of ``[{"role", "content"}, ...]`` in the build's chat template, as
        llama-cpp-python's ``create_chat_completion``: a ``chat.completion`` dict, or with ``stream`` an
        iterator of ``chat.completion.chunk`` dicts. ``max_tokens`` None: up to the end of the context.
        ``lora``: a mix of adapters, as for ``generate``."""
        return self._complete(messages, adapter, max_tokens, temperature, seed, stream, chat=True, lora=lora)

    # --- one request -------------------------------------------------------------------------------

    def _max_new(self, prompt, adapter: str, max_tokens: int | None) -> int:
        """max_tokens, or what the context leaves after the prompt (as the server does without one)."""
        if max_tokens is not None:
            return max_tokens
        lib, err, n = self._rt.lib, c_library._Error(), c_library.ctypes.c_int64(0)
        if (
            lib.ls_context_length(
                self._rt.handle, adapter.encode(), c_library.ctypes.byref(n), c_library.ctypes.byref(err)
            )
            != 0
        ):
            c_library._raise(lib, err)
        tokenizer = self._rt.tokenizer()
        if isinstance(prompt, str):
            used = len(tokenizer.encode(prompt, True))
        else:
            used = len(tokenizer.encode(tokenizer.apply_chat_template(prompt), False))
        return max(n.value - used + 1, 1)

    def _complete(
        self, prompt, adapter: str, max_tokens, temperature, seed, stream: bool, chat: bool, lora: list[dict] | None
    ):
        shape = _Shape(chat, adapter)
        if lora is not None and adapter != BASE:
            raise ValueError(
                f"lora mixes adapters on the foundation alone: leave adapter '{BASE}', got adapter={adapter!r}"
            )
        # Checked now, so that a bad request raises here rather than at the first chunk of a stream.
        with self._running(adapter, lora) as name:
            max_new = self._max_new(prompt, name, max_tokens)
            if not stream:
                text, result = self._rt.generate_text(name, prompt, max_new, temperature=temperature, seed=seed)
                return shape.whole(text, result)
        return self._stream(prompt, adapter, lora, max_new, temperature, seed, shape)

    @contextlib.contextmanager
    def _running(self, adapter: str, lora: list[dict] | None) -> Iterator[str]:
        """The name the library runs: ``adapter``, or the mix of ``lora`` (ls_adapter_mix), held meanwhile."""
        if lora is None:
            yield adapter
            return
        mix = self._rt.mix(lora)
        try:
            yield mix.name
        finally:
            mix.release()

    def _stream(self, prompt, adapter, lora, max_new, temperature, seed, shape: _Shape) -> Iterator[dict]:
        with self._running(adapter, lora) as name:
            yield from self._stream_named(prompt, name, max_new, temperature, seed, shape)

    def _stream_named(self, prompt, adapter, max_new, temperature, seed, shape: _Shape) -> Iterator[dict]:
        """Generation runs on a thread (the library calls back with each piece); the caller's loop takes
        the pieces from a queue. Leaving the loop early stops generation at the next piece."""
        pieces: queue.Queue = queue.Queue()
        abandoned = threading.Event()
        done = object()

        def on_text(piece: str) -> None:
            pieces.put(piece)

        def work() -> None:
            try:
                _, result = self._rt.generate_text(
                    adapter, prompt, max_new, temperature=temperature, seed=seed, on_text=on_text, stop=abandoned.is_set
                )
                pieces.put((done, result))
            except NativeError as e:
                pieces.put((done, e))

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            if shape.chat:
                yield shape.chunk({"role": "assistant", "content": ""}, None)
            while True:
                item = pieces.get()
                if isinstance(item, tuple) and item[0] is done:
                    if isinstance(item[1], NativeError):
                        raise item[1]
                    yield shape.last(item[1])
                    return
                yield shape.chunk({"content": item} if shape.chat else item, None)
        finally:
            abandoned.set()
            thread.join()


class _Shape:
    """The OpenAI dicts of one request, as llama-cpp-python shapes them."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, kind: str, choice: dict) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    @staticmethod
    def _usage(result: dict) -> dict:
        return {
            "prompt_tokens": result["prompt_tokens"],
            "completion_tokens": result["completion_tokens"],
            "total_tokens": result["prompt_tokens"] + result["completion_tokens"],
        }

    @staticmethod
    def _finish(result: dict) -> str:
        return "stop" if result["finish_reason"] == "stop" else "length"

    def whole(self, text: str, result: dict) -> dict:
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": self._finish(result),
            }
            out = self._envelope("chat.completion", choice)
        else:
            out = self._envelope(
                "text_completion", {"text": text, "index": 0, "logprobs": None, "finish_reason": self._finish(result)}
            )
        out["usage"] = self._usage(result)
        return out

    def chunk(self, delta, finish_reason: str | None) -> dict:
        if self.chat:
            return self._envelope(
                "chat.completion.chunk", {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            )
        return self._envelope(
            "text_completion", {"text": delta, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        )

    def last(self, result: dict) -> dict:
        out = self.chunk({} if self.chat else "", self._finish(result))
        out["usage"] = self._usage(result)
        return out
