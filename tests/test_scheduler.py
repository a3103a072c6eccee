"""Issue 47's C++ scheduler (cpp_runner/runtime/batch/): KV slots that last and ls_generate from several
threads batched in one step.

The slot table is checked against lora_share/inference/batching.py's Slots (the Python reference of
docs/batching.md) on random request sequences, through lora_share_diag.h's ls_diag_slots_*. Requests run
from several threads at once on a runtime with several slots are checked against the same requests run
alone on a runtime without batching (one at a time, from position 0; itself checked against build/runner
and the eager model elsewhere): the same greedy tokens, logits within 1e-4.
"""

from __future__ import annotations

import ctypes
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from batch_script import diag_generate
from conftest import TINY_FOUNDATION

from lora_share.inference import c_abi
from lora_share.inference import c_library as native
from lora_share.inference.batching import Slots
from lora_share.model.decoder import ModelArgs

ARGS = ModelArgs(
    dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=32, vocab_size=32, max_seq_len=24, prefill_chunk=4
)


@pytest.fixture(scope="module")
def diag_lib(runner_bin):
    lib = ctypes.CDLL(str(runner_bin.parent / "liblora_share.so"))
    P, size = ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
    ids = ctypes.POINTER(ctypes.c_int64)
    for name, restype, argtypes in [
        ("ls_diag_slots_new", P, [ctypes.c_size_t, ctypes.c_int]),
        ("ls_diag_slots_free", None, [P]),
        ("ls_diag_slots_claim", ctypes.c_int, [P, ctypes.c_uint64, ids, ctypes.c_size_t, size, size]),
        ("ls_diag_slots_fed", None, [P, ctypes.c_size_t, ids, ctypes.c_size_t]),
        ("ls_diag_slots_release", None, [P, ctypes.c_size_t]),
        ("ls_diag_slots_hits", None, [P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _ids(tokens):
    return (ctypes.c_int64 * max(len(tokens), 1))(*tokens)


@pytest.mark.parametrize("ring", [False, True], ids=["full", "ring"])
@pytest.mark.parametrize("seed", range(4))
def test_slot_table_claims_as_the_python_slots(diag_lib, ring, seed):
    """Random arrivals on three adapters (and base), prompts that often extend an earlier conversation,
    answers fed after the prompt, releases in any order: every claim (slot, tokens kept, or none free) and
    the hit counters equal the reference's."""
    rng = random.Random(seed)
    n = 3
    reference = Slots(ARGS, n)
    reference.ring = 6 if ring else 0  # only claim() reads it: a ring of 6 positions
    table = diag_lib.ls_diag_slots_new(n, int(ring))
    adapters = [None, "a", "b", "c"]
    history: list[tuple[str | None, list[int]]] = []
    busy: list[int] = []
    try:
        for _ in range(200):
            if busy and (rng.random() < 0.4 or len(busy) == n):
                slot = busy.pop(rng.randrange(len(busy)))
                reference.release(slot)
                diag_lib.ls_diag_slots_release(table, slot)
                continue
            if history and rng.random() < 0.6:  # a later turn: an earlier conversation, cut and extended
                adapter, past = rng.choice(history)
                cut = len(past) if rng.random() < 0.5 else rng.randrange(len(past) + 1)
                prompt = past[:cut] + [rng.randrange(32) for _ in range(rng.randrange(1, 4))]
            else:
                adapter, prompt = rng.choice(adapters), [rng.randrange(32) for _ in range(rng.randrange(1, 6))]
            expected = reference.claim(adapter, prompt)
            slot, kept = ctypes.c_size_t(), ctypes.c_size_t()
            full = diag_lib.ls_diag_slots_claim(
                table, adapters.index(adapter), _ids(prompt), len(prompt), ctypes.byref(slot), ctypes.byref(kept)
            )
            assert (None if full else (slot.value, kept.value)) == expected
            if expected is None:
                continue
            answer = [rng.randrange(32) for _ in range(rng.randrange(0, 4))]
            fed = prompt[expected[1] :] + answer
            reference.state[slot.value].tokens += fed
            diag_lib.ls_diag_slots_fed(table, slot.value, _ids(fed), len(fed))
            history.append((adapter, prompt + answer))
            busy.append(slot.value)
        hits, tokens = ctypes.c_uint64(), ctypes.c_uint64()
        diag_lib.ls_diag_slots_hits(table, ctypes.byref(hits), ctypes.byref(tokens))
        assert (hits.value, tokens.value) == (reference.prefix_hits, reference.reused_tokens)
        assert reference.prefix_hits >= 2  # the sequence did exercise prefix reuse
    finally:
        diag_lib.ls_diag_slots_free(table)


# --- ls_generate from several threads on one runtime (parallel > 1) ------------------------------------

PARALLEL = 4
NEW = 12
TOL = 1e-4
VOCAB = TINY_FOUNDATION["vocab_size"]


def generate_with_logits(
    rt, name: str, prompt: list[int], new: int = NEW, stop_after: int | None = None, cache_prompt: bool = True
):
    """ls_diag_generate on ``name`` ("base": a NULL adapter): the tokens the callback saw and the logits row
    each was picked from."""
    handle = None if name == "base" else rt.adapter(name).handle
    return diag_generate(rt, handle, prompt, new, VOCAB, stop_after, cache_prompt)


def concurrently(jobs):
    """Runs every job (a callable) on its own thread, all released at once; their results in order."""
    barrier = threading.Barrier(len(jobs))

    def run(job):
        barrier.wait()
        return job()

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(run, jobs))


@pytest.fixture(scope="module")
def alone(runner_bin, tiny_build):
    """The reference: the runtime without batching (parallel 1, speculation off: the one-row path), every
    request alone from position 0."""
    with native.open_dir(tiny_build.out_dir, library=runner_bin.parent / "liblora_share.so", speculation=False) as rt:
        yield rt


@pytest.fixture(scope="module")
def batched(runner_bin, tiny_build):
    with native.open_dir(tiny_build.out_dir, parallel=PARALLEL, library=runner_bin.parent / "liblora_share.so") as rt:
        yield rt


# Base and three adapters of different ranks and targets; prompts of different lengths (one longer than
# the prefill chunk, fed in two chunks while the others decode), so rows sit at different positions.
REQUESTS = [("base", [5, 9, 200]), ("tiny_a", [1, 17, 42, 7, 99]), ("tiny_b", list(range(30, 42))), ("tiny_c", [3])]


def assert_same(got, expected, what):
    tokens, logits = got
    assert tokens == expected[0], what
    np.testing.assert_allclose(logits, expected[1], atol=TOL, rtol=0, err_msg=what)


def test_concurrent_requests_each_equal_the_request_alone(alone, batched):
    expected = [generate_with_logits(alone, name, prompt) for name, prompt in REQUESTS]
    before = batched.stats()
    got = concurrently([lambda n=name, p=prompt: generate_with_logits(batched, n, p) for name, prompt in REQUESTS])
    for (name, _), g, e in zip(REQUESTS, got, expected):
        assert_same(g, e, name)
    after = batched.stats()
    steps = [a - b for a, b in zip(after["batch_size_counts"], before["batch_size_counts"])]
    assert after["parallel"] == PARALLEL and after["slots_in_use"] == 0
    assert sum(steps[1:]) > 0, steps  # some steps ran several rows
    assert sum(steps) == after["batch_steps"] - before["batch_steps"]


def test_a_caller_hanging_up_leaves_the_others_unchanged(alone, batched):
    expected = [generate_with_logits(alone, name, prompt) for name, prompt in REQUESTS]
    got = concurrently(
        [
            lambda n=name, p=prompt, i=i: generate_with_logits(batched, n, p, stop_after=2 if i == 1 else None)
            for i, (name, prompt) in enumerate(REQUESTS)
        ]
    )
    for i, ((name, _), g, e) in enumerate(zip(REQUESTS, got, expected)):
        if i == 1:  # stopped after its second token: those two are the request's own
            assert_same(g, (e[0][:2], e[1][:2]), name)
        else:
            assert_same(g, e, name)


def test_a_prompt_extending_a_slot_continues_there(alone, batched):
    """A second turn (the first prompt, its answer, a new message) on the same adapter: a prefix hit that
    skips the first turn's tokens, with the answer of a fresh prefill."""
    first = [1, 17, 42, 7, 99]
    answer, _ = generate_with_logits(batched, "tiny_a", first, new=6)
    second = first + answer + [11, 12]
    before = batched.stats()
    got = generate_with_logits(batched, "tiny_a", second, new=8)
    after = batched.stats()
    assert after["prefix_hits"] == before["prefix_hits"] + 1
    # The slot holds the first prompt and the answer's tokens that were fed (all but the last).
    assert after["prefix_tokens"] - before["prefix_tokens"] == len(first) + len(answer) - 1
    assert_same(got, generate_with_logits(alone, "tiny_a", second, new=8), "second turn")


def test_cache_prompt_off_feeds_the_whole_prompt(batched):
    """cache_prompt = 0: a prompt a slot holds is fed again from position 0 (no prefix hit), and the answer
    is bit for bit the first one's, whatever ran in between; on by default, the same prompt is a hit."""
    prompt = [3, 141, 59, 26, 53]  # starts unlike every other test's prompt: the first run is fresh
    hits = batched.stats()["prefix_hits"]
    first = generate_with_logits(batched, "tiny_b", prompt, new=6)
    assert batched.stats()["prefix_hits"] == hits
    generate_with_logits(batched, "tiny_a", [1, 2, 3], new=4)  # another request between
    hits = batched.stats()["prefix_hits"]
    again = generate_with_logits(batched, "tiny_b", prompt, new=6, cache_prompt=False)
    assert batched.stats()["prefix_hits"] == hits
    assert again[0] == first[0] and np.array_equal(again[1], first[1])
    generate_with_logits(batched, "tiny_b", prompt, new=6)
    assert batched.stats()["prefix_hits"] == hits + 1


def test_slots_are_counted_in_the_memory_budget(alone, batched, runner_bin, tiny_build):
    """One slot is every layer's K and V for the whole context (float32); the arena holds PARALLEL of them
    (3 more than a runtime of one slot); a budget of the accounted total serves PARALLEL requests at once."""
    f = TINY_FOUNDATION
    slot = 2 * f["n_layers"] * f["n_kv_heads"] * 32 * (f["dim"] // f["n_heads"]) * 4  # context 32
    s = batched.stats()
    assert s["slot_bytes"] == slot
    assert s["arena_bytes"] - alone.stats()["arena_bytes"] >= (PARALLEL - 1) * slot
    budget = s["foundation_bytes"] + s["program_bytes"] + s["arena_bytes"] + 4 * s["largest_adapter_bytes"]
    with native.open_dir(
        tiny_build.out_dir, parallel=PARALLEL, budget_bytes=budget, library=runner_bin.parent / "liblora_share.so"
    ) as rt:
        got = concurrently([lambda n=name, p=prompt: generate_with_logits(rt, n, p) for name, prompt in REQUESTS])
        used = rt.stats()
    assert [g[0] for g in got] == [generate_with_logits(alone, n, p)[0] for n, p in REQUESTS]
    assert (
        used["foundation_bytes"] + used["program_bytes"] + used["arena_bytes"] + used["resident_adapter_bytes"]
        <= budget
    )


def test_python_runtime_from_several_threads(runner_bin, text_build):
    """lora_share.Runtime(parallel=N) from N threads, text in and out, chat and completion, base and the
    adapter: each answer is the one a runtime without batching gives (greedy)."""
    from lora_share import Runtime

    library = runner_bin.parent / "liblora_share.so"
    asks = [
        ("base", "The quick brown fox"),
        ("chat", "Once upon a time there was"),
        ("chat", [{"role": "user", "content": "Why is the sky blue?"}]),
    ]

    def ask(rt, adapter, prompt):
        if isinstance(prompt, str):
            return rt.generate(prompt, adapter=adapter, max_tokens=10)["choices"][0]["text"]
        return rt.create_chat_completion(prompt, adapter=adapter, max_tokens=10)["choices"][0]["message"]["content"]

    with Runtime(text_build.build.out_dir, library=library) as rt:
        expected = [ask(rt, a, p) for a, p in asks]
    with Runtime(text_build.build.out_dir, library=library, parallel=len(asks)) as rt:
        got = concurrently([lambda a=a, p=p: ask(rt, a, p) for a, p in asks])
    assert got == expected


def test_calling_the_runtime_from_a_batched_callback_is_refused(batched):
    """The callback runs on the caller's thread while the runtime's lock is released (the batch goes on):
    a call back into the runtime is still LS_ERR_BUSY, as without batching."""
    lib, seen = batched.lib, []

    def reenter(token, _user):
        stats, err = native._Stats(), native._Error()
        seen.append(lib.ls_stats(batched.handle, ctypes.byref(stats), ctypes.byref(err)))
        lib.ls_close(batched.handle)  # refused too: it returns without closing
        return 0

    err = native._Error()
    ids = (ctypes.c_int64 * 3)(1, 17, 42)
    assert (
        lib.ls_generate_named(
            batched.handle, b"tiny_a", ids, 3, None, native.TOKEN_CALLBACK(reenter), None, ctypes.byref(err)
        )
        == 0
    )
    assert seen and set(seen) == {c_abi.STATUS_NAMES.index("LS_ERR_BUSY")}
    assert batched.generate("tiny_b", [1, 2, 3], 2)  # still serving
