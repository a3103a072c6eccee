"""Batched decode through the C library (ls_diag_batch_script, lora_share_diag.h) against the same requests
alone through the one-row C path (ls_diag_generate on a runtime of one KV slot, speculation off), with and
without drafts
(rows that verify a guess of their answer): shared by tests/test_batch_engine.py (the tiny build) and
tests/test_families.py (every family's build, fp32 and 8da4w); and
``diag_generate``, one request with its logits rows, for tests/test_scheduler.py and test_adapter_mix.py."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace

import numpy as np

from lora_share.inference import c_library as native

TOL = 1e-4


class _Request(ctypes.Structure):
    _fields_ = [
        ("adapter", ctypes.c_void_p),
        ("prompt", ctypes.POINTER(ctypes.c_int64)),
        ("n_prompt", ctypes.c_size_t),
        ("slot", ctypes.c_size_t),
        ("max_new_tokens", ctypes.c_int64),
        ("joins", ctypes.c_int64),
        ("tokens", ctypes.POINTER(ctypes.c_int64)),
        ("logits", ctypes.POINTER(ctypes.c_float)),
        ("max_batch", ctypes.c_size_t),
        ("prediction", ctypes.POINTER(ctypes.c_int64)),
        ("n_prediction", ctypes.c_size_t),
        ("max_drafts", ctypes.c_int64),
        ("drafted", ctypes.c_int64),
        ("accepted", ctypes.c_int64),
        ("steps", ctypes.c_int64),
    ]


class _GenOptions(ctypes.Structure):
    _fields_ = [
        ("logits", ctypes.POINTER(ctypes.c_float)),
        ("stop_ids", ctypes.POINTER(ctypes.c_int64)),
        ("n_stop_ids", ctypes.c_size_t),
        ("stop_ids_given", ctypes.c_int),
        ("prompt_label", ctypes.c_char_p),
    ]


class _DiagGeneration(ctypes.Structure):
    _fields_ = [
        ("tokens", ctypes.c_size_t),
        ("logits_rows", ctypes.c_int64),
        ("prefill_ms", ctypes.c_double),
        ("decode_ms", ctypes.c_double),
        ("prefill_tokens_per_s", ctypes.c_double),
        ("decode_tokens_per_s", ctypes.c_double),
    ]


class Variants(ctypes.Structure):
    """ls_diag_variants: the program variants that skip absent LoRA slots (lora_share_diag.h)."""

    _fields_ = [
        ("made", ctypes.c_uint64),
        ("refused", ctypes.c_uint64),
        ("failed", ctypes.c_uint64),
        ("resident", ctypes.c_uint64),
    ]


def slot_variants(rt: native.Runtime) -> Variants:
    """ls_diag_slot_variants on ``rt``."""
    lib = rt.lib
    lib.ls_diag_slot_variants.restype = ctypes.c_int
    lib.ls_diag_slot_variants.argtypes = [ctypes.c_void_p, ctypes.POINTER(Variants), ctypes.POINTER(native._Error)]
    out, err = Variants(), native._Error()
    if lib.ls_diag_slot_variants(rt.handle, ctypes.byref(out), ctypes.byref(err)) != 0:
        native._raise(lib, err)
    return out


@dataclass
class Req:
    adapter: str | None  # None: base
    prompt: list[int]
    slot: int
    new: int
    joins: int = 0
    prediction: list[int] | None = None  # drafts from this guess of its answer (ls_diag_batch_request)
    max_drafts: int = 0


@dataclass
class Result:
    tokens: list[int]
    logits: np.ndarray  # [new, vocab]
    max_batch: int = 1
    drafted: int = 0
    accepted: int = 0
    steps: int = 0


def _bind(lib):
    lib.ls_diag_batch_script.restype = ctypes.c_int
    lib.ls_diag_batch_script.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Request), ctypes.c_size_t, ctypes.c_void_p]
    lib.ls_diag_generate.restype = ctypes.c_int
    lib.ls_diag_generate.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.POINTER(_GenOptions),
        native.TOKEN_CALLBACK,
        ctypes.c_void_p,
        ctypes.POINTER(_DiagGeneration),
        ctypes.POINTER(native._Error),
    ]
    lib.ls_diag_last_message.restype = ctypes.c_char_p


def _open(build, library, parallel: int, speculation: bool = True) -> native.Runtime:
    rt = native.open(
        build.ptd,
        library=library,
        parallel=parallel,
        shared_ptd=build.shared_ptd if build.shared_ptd.exists() else None,
        speculation=speculation,
    )
    for pte in build.ptes.values():
        rt.load_adapter(pte)
    return rt


def diag_generate(
    rt: native.Runtime,
    adapter,
    prompt: list[int],
    new: int,
    vocab: int,
    stop_after: int | None = None,
    cache_prompt: bool = True,
) -> tuple[list[int], np.ndarray]:
    """ls_diag_generate, greedy, no end-of-sequence stop, on the adapter handle ``adapter`` (None: base): the
    tokens the callback saw and the logits row each was picked from. ``stop_after``: the callback asks to stop
    (a caller hanging up) once it has seen that many tokens; ``cache_prompt`` False: no prefix reuse."""
    lib = rt.lib
    _bind(lib)
    seen: list[int] = []

    def on_token(token, _user):
        seen.append(token)
        return 1 if stop_after is not None and len(seen) >= stop_after else 0

    logits = np.zeros((new, vocab), dtype=np.float32)
    diag = _GenOptions(logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), None, 0, 1, None)  # no stop ids
    opts = native._generate_options(lib, new, 0.0, 0, True)
    opts.cache_prompt = int(cache_prompt)
    callback = native.TOKEN_CALLBACK(on_token)
    out, err = _DiagGeneration(), native._Error()
    if (
        lib.ls_diag_generate(
            rt.handle,
            adapter,
            _ints(prompt),
            len(prompt),
            ctypes.byref(opts),
            ctypes.byref(diag),
            callback,
            None,
            ctypes.byref(out),
            ctypes.byref(err),
        )
        != 0
    ):
        native._raise(lib, err)
    assert out.tokens == len(seen)
    return seen, logits[: out.logits_rows]


def _handle(rt: native.Runtime, name: str | None):
    return None if name is None else rt.adapter(name).handle


def _ints(values):
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def batch_script(
    build, requests: list[Req], library, parallel: int = 4, speculation: bool = True, variants: list | None = None
) -> list[Result] | str:
    """``requests`` through ls_diag_batch_script on a runtime with ``parallel`` slots: each one's greedy tokens,
    logits and the most rows it decoded with; or the library's error message. ``variants``: gets the runtime's
    slot_variants at the end."""
    rt = _open(build, library, parallel, speculation)
    try:
        lib = rt.lib
        _bind(lib)
        vocab = build.manifest["foundation"]["args"]["vocab_size"]
        keep, array = [], (_Request * len(requests))()
        for r, c in zip(requests, array):
            prompt, tokens = _ints(r.prompt), (ctypes.c_int64 * r.new)()
            logits = (ctypes.c_float * (r.new * vocab))()
            keep += [prompt, tokens, logits]
            c.adapter, c.prompt, c.n_prompt, c.slot = _handle(rt, r.adapter), prompt, len(r.prompt), r.slot
            c.max_new_tokens, c.joins, c.tokens, c.logits = r.new, r.joins, tokens, logits
            if r.prediction is not None:
                prediction = _ints(r.prediction)
                keep.append(prediction)
                c.prediction, c.n_prediction = prediction, len(r.prediction)
            c.max_drafts = r.max_drafts
        if lib.ls_diag_batch_script(rt.handle, array, len(requests), None) != 0:
            return lib.ls_diag_last_message().decode()
        if variants is not None:
            variants.append(slot_variants(rt))
        return [
            Result(
                list(c.tokens[: r.new]),
                np.ctypeslib.as_array(c.logits, (r.new * vocab,)).reshape(r.new, vocab).copy(),
                c.max_batch,
                c.drafted,
                c.accepted,
                c.steps,
            )
            for r, c in zip(requests, array)
        ]
    finally:
        rt.close()


def alone(build, requests: list[Req], library, variants: list | None = None) -> list[Result]:
    """Each request alone through the one-row path (one KV slot without speculation; forward then decode), no
    stop ids. ``variants``: gets the runtime's slot_variants at the end."""
    rt = _open(build, library, 1, speculation=False)
    try:
        vocab = build.manifest["foundation"]["args"]["vocab_size"]
        out = []
        for r in requests:
            tokens, logits = diag_generate(rt, _handle(rt, r.adapter), r.prompt, r.new, vocab)
            out.append(Result(tokens, logits))
        if variants is not None:
            variants.append(slot_variants(rt))
        return out
    finally:
        rt.close()


def check_rows_equal_alone(build, requests: list[Req], library, min_batch: int) -> None:
    """Every request of the mixed batch has the greedy tokens of the same request alone and its logits
    within TOL; some decode step really ran ``min_batch`` rows."""
    got, ref = batch_script(build, requests, library), alone(build, requests, library)
    assert not isinstance(got, str), got
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.tokens == r.tokens, (i, requests[i])
        assert np.abs(g.logits - r.logits).max() <= TOL, (i, requests[i], np.abs(g.logits - r.logits).max())
    assert max(g.max_batch for g in got) >= min_batch


def guess(answer: list[int], kind: str | None, vocab: int) -> list[int] | None:
    """A request's answer as guessed: ``right`` (the answer), ``wrong`` (every token off by one), ``part``
    (right but for every third token: drafts rejected, then right again), None (no drafts)."""
    if kind is None:
        return None
    if kind == "right":
        return list(answer)
    if kind == "wrong":
        return [(t + 1) % vocab for t in answer]
    return [t if j % 3 else (t + 1) % vocab for j, t in enumerate(answer)]


def check_drafts_equal_alone(build, requests: list[Req], kinds: list[str | None], library, max_drafts: int = 8):
    """Each request alone through the one-row C path, then all of them through the batch script drafting from
    its guess of kind ``kinds[i]`` (``guess``): every request's tokens and logits bit for bit its own alone;
    right drafts all accepted, wrong ones none, partly right ones some. Returns the script's results."""
    vocab = build.manifest["foundation"]["args"]["vocab_size"]
    ref = alone(build, requests, library)
    drafting = [
        replace(r, prediction=guess(w.tokens, kind, vocab), max_drafts=max_drafts if kind else 0)
        for r, w, kind in zip(requests, ref, kinds)
    ]
    got = batch_script(build, drafting, library)
    assert not isinstance(got, str), got
    for i, (g, w, kind) in enumerate(zip(got, ref, kinds)):
        assert g.tokens == w.tokens, (i, kind)
        assert np.array_equal(g.logits, w.logits), (i, kind, float(np.abs(g.logits - w.logits).max()))
        if kind == "right":
            assert g.accepted == g.drafted > 0 and g.steps < requests[i].new - 1, (i, g)
        elif kind == "wrong":
            assert g.drafted > 0 == g.accepted, (i, g)
        elif kind == "part":
            assert 0 < g.accepted < g.drafted, (i, g)
        else:
            assert g.drafted == 0, (i, g)
    return got
