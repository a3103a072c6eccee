"""Issue 47's C++ scheduler (cpp_runner/runtime/batch/): KV slots that last and ls_generate from several
threads batched in one step.

The slot table is checked against lora_share/inference/batching.py's Slots (the Python reference of
docs/batching.md) on random request sequences, through lora_share_diag.h's ls_diag_slots_*.
"""

from __future__ import annotations

import ctypes
import random

import pytest

from conftest import REPO
from lora_share.inference.batching import Slots
from lora_share.model.decoder import ModelArgs

ARGS = ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=32, vocab_size=32, max_seq_len=24,
                 prefill_chunk=4)


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
            ("ls_diag_slots_hits", None, [P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)])]:
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
            full = diag_lib.ls_diag_slots_claim(table, adapters.index(adapter), _ids(prompt), len(prompt),
                                                ctypes.byref(slot), ctypes.byref(kept))
            assert (None if full else (slot.value, kept.value)) == expected
            if expected is None:
                continue
            answer = [rng.randrange(32) for _ in range(rng.randrange(0, 4))]
            fed = prompt[expected[1]:] + answer
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
