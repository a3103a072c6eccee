"""``lora_share.Runtime``: a deployment folder served in-process by the C library, text in and out.

    from lora_share import Runtime
    rt = Runtime("out/smollm2")
    rt.adapters                                    # ["brief", "bullets", "json", "shout"]
    rt.create_chat_completion([{"role": "user", "content": "Why is the sky blue?"}], model="brief", stop=["."])
    for chunk in rt.create_completion("Once upon a time", model="json", max_tokens=32, stream=True):
        print(chunk["choices"][0]["text"], end="")
    rt.create_completion("Once upon a time", lora=[{"name": "brief", "scale": 0.5}, {"name": "json", "scale": 1.1}])

``create_completion`` and ``create_chat_completion`` send their arguments as the OpenAI JSON body
build/lora-share-server takes, through the same library calls (lora_share.h, REQUESTS: ls_request_parse,
ls_request_prepare, ls_request_run): every field the server takes is taken here, checked by the same
parser (a bad one raises ``NativeError`` with status ``LS_ERR_REQUEST`` and the server's message), and the
answer's choices and usage are the server's. ``adapter=`` is the older name of ``model=``. The build's
tokenizer and chat template are read by the library too. Nothing here needs torch: installed from the
wheel (``make wheel``), the library and the runtime libraries it loads come inside the package.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
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
    the deployment, else the user's cache folder), False (packed in memory at every start) or a folder.
    ``speculation`` False: no request verifies drafts (by default they do, with parallel 1 too: the same
    answers, faster where the answer copies its prompt or its ``prediction``, for the memory of the batched
    step, which one slot then loads: about 21 MiB more PSS on the SmolLM2-135M demo; docs/batching.md,
    "One slot"); ``"every_draft"``: each step verifies every draft found, not only as many as pay for the
    step on this machine (draft counts that timing cannot move)."""

    def __init__(
        self,
        path: str | os.PathLike,
        budget_bytes: int = 0,
        library: str | os.PathLike | None = None,
        parallel: int = 1,
        packed_cache: bool | str | os.PathLike = True,
        speculation: bool | str = True,
    ):
        self.path = os.fspath(path)
        self._rt = c_library.open_dir(
            self.path,
            budget_bytes=budget_bytes,
            library=library,
            parallel=parallel,
            packed_cache=packed_cache,
            speculation=speculation,
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

    def create_completion(
        self, prompt: str | list[int], model: str | None = None, adapter: str | None = None, **fields
    ) -> dict | Iterator[dict]:
        """A completion of ``prompt`` (text, encoded with the tokenizer's special tokens, or token ids):
        POST /v1/completions's body ``{"model", "prompt", **fields}`` (docs/server.md lists the fields:
        max_tokens, temperature, seed, top_p, stop, stream, lora, ...). A ``text_completion`` dict, or
        with ``stream=True`` an iterator of chunks. ``model`` (or ``adapter``): the adapter, "base" (the
        default) the foundation alone; no ``max_tokens``: up to the end of the context."""
        return self._request("completion", {"model": _model(model, adapter), "prompt": prompt, **fields})

    def create_chat_completion(
        self, messages: list[dict], model: str | None = None, adapter: str | None = None, **fields
    ) -> dict | Iterator[dict]:
        """A chat completion of ``[{"role", "content"}, ...]`` in the build's chat template:
        POST /v1/chat/completions's body ``{"model", "messages", **fields}``. A ``chat.completion`` dict,
        or with ``stream=True`` an iterator of ``chat.completion.chunk`` dicts, the first carrying
        ``delta.role``. ``model`` (or ``adapter``): as for ``create_completion``."""
        return self._request("chat", {"model": _model(model, adapter), "messages": messages, **fields})

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
        """``create_completion`` with llama-cpp-python's defaults (16 new tokens); ``max_tokens`` None:
        up to the end of the context. ``lora``: a mix of adapters, ``[{"name": adapter, "scale": number},
        ...]``, with ``adapter`` left "base"."""
        fields = {"temperature": temperature, "seed": seed, "stream": stream, "lora": lora}
        if max_tokens is not None:
            fields["max_tokens"] = max_tokens
        return self.create_completion(prompt, model=adapter, **fields)

    # --- one request -------------------------------------------------------------------------------

    def _request(self, kind: str, body: dict) -> dict | Iterator[dict]:
        request = self._rt.request(kind, _body_json(body))
        # Prepared now, so that a bad request raises here rather than at the first chunk of a stream.
        try:
            request.prepare()
            if request.stream:
                return _stream(request)  # which frees it once iterated to its end or closed
            events: list[str] = []
            request.run(events.append)
        except BaseException:
            request.free()
            raise
        request.free()
        return json.loads(events[0])


def _model(model: str | None, adapter: str | None) -> str:
    if model is not None and adapter is not None and model != adapter:
        raise TypeError(
            f"give the adapter once: model={model!r} and adapter={adapter!r} (adapter is model's older name)"
        )
    return model if model is not None else adapter if adapter is not None else BASE


def _body_json(body: dict) -> str:
    """The body as JSON text. JSON has no NaN or Infinity, so such a number is sent as its name (the
    library's parser then says which field wants a finite number); a value JSON cannot write at all is a
    TypeError naming its field."""
    try:
        return json.dumps(body, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(body), allow_nan=False)
    except TypeError as e:
        field = next((k for k, v in body.items() if not _encodes(v)), "?")
        raise TypeError(f"{field}: {e}") from None
    except RecursionError:
        raise NativeError(
            "LS_ERR_REQUEST",
            f"the request body nests arrays and objects more than {_MAX_DEPTH} levels deep: no field takes that",
        ) from None


_MAX_DEPTH = 64  # LS_REQUEST_MAX_DEPTH


def _encodes(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


def _finite(value, depth: int = 0):
    """``value`` with every non-finite float replaced by its name ("nan", "inf", "-inf")."""
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, depth + 1) for v in value]
    return value


def _stream(request: c_library.Request) -> Iterator[dict]:
    """Generation runs on a thread (the library calls back with each event); the caller's loop takes them
    from a queue. Leaving the loop early stops generation at the next token."""
    events: queue.Queue = queue.Queue()
    abandoned = threading.Event()
    done = object()

    def work() -> None:
        try:
            request.run(events.put, stop=abandoned.is_set)
            events.put((done, None))
        except NativeError as e:
            events.put((done, e))

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        while True:
            item = events.get()
            if isinstance(item, tuple) and item[0] is done:
                if item[1] is not None:
                    raise item[1]
                return
            yield json.loads(item)
    finally:
        abandoned.set()
        thread.join()
        request.free()
