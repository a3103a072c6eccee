"""The C++ batched decode step (cpp_runner/runtime/batch/batch_engine.h, issue 47) on the tiny build: every row
of a mixed batch (base and adapters of different ranks and targets, prompts chunked or not, rows at different
positions, joining and leaving, a slot used again by a later request) has the greedy tokens of the same request
alone through the one-row C path, and its logits within 1e-4; rows that verify drafts (issue 60), their logits
bit for bit. tests/test_families.py runs the same checks on every family's build (Gemma 3's rings included),
float32 and 8da4w."""

from __future__ import annotations

import pytest
from batch_script import Req, batch_script, check_drafts_equal_alone, check_rows_equal_alone
from conftest import REPO, TINY_CHUNK, TINY_FOUNDATION


@pytest.fixture(scope="module")
def library(runner_bin):
    return REPO / "build" / "liblora_share.so"


LONG = list(range(3, 3 + TINY_CHUNK + 4))  # fed in two chunks
SCRIPT = [
    Req(None, [1, 17, 42, 5, 9], slot=0, new=10),
    Req("tiny_a", LONG, slot=1, new=6),
    Req("tiny_b", [7, 8, 9], slot=2, new=8, joins=2),
    Req("tiny_c", [200, 3, 50, 51, 52, 9, 10, 11, 12], slot=3, new=5, joins=3),
    # tiny_a's slot once it has left (after step 5): its old rows are past this shorter prompt
    Req("tiny_b", [4, 4, 4], slot=1, new=7, joins=7),
]


def test_mixed_batch_rows_equal_each_request_alone(tiny_build, library):
    check_rows_equal_alone(tiny_build, SCRIPT, library, min_batch=4)


def test_rows_of_drafts_equal_each_request_alone(tiny_build, library):
    """Rows that verify drafts (their last token and up to 8 guessed tokens after it, one step) beside rows
    that do not, on other adapters and slots: every request's tokens and logits are its own alone bit for
    bit, whether its drafts are right (all accepted, fewer steps), wrong (none) or partly right; a request
    whose answer runs to the end of the context drafts up to its last position."""
    script = [
        Req(None, [1, 17, 42, 5, 9], slot=0, new=12),
        Req("tiny_a", LONG, slot=1, new=10),
        Req("tiny_b", [7, 8, 9], slot=2, new=14, joins=1),
        Req("tiny_c", list(range(40, 60)), slot=3, new=12),  # 20 + 12 = the context of 32
    ]
    check_drafts_equal_alone(tiny_build, script, ["right", "wrong", "part", "right"], library)
    check_drafts_equal_alone(tiny_build, script, ["part", None, "right", "wrong"], library)


@pytest.mark.parametrize("case", ["one slot", "shared slot", "slot out of range", "too many rows"])
def test_script_errors_are_messages(tiny_build, library, case):
    """A runtime without slots (one slot, no speculation: no decode_batch loaded), two live requests on one
    slot, a slot or a row past the engine's: one message naming the fix, the process alive."""
    script = {
        "one slot": SCRIPT[:1],
        "shared slot": [Req(None, [1], 0, 3), Req("tiny_a", [2], 0, 3)],
        "slot out of range": [Req(None, [1], 4, 2)],
        "too many rows": [Req(None, [1], s, 3) for s in range(3)],
    }[case]
    parallel = {"one slot": 1, "too many rows": 2}.get(case, 4)
    got = batch_script(tiny_build, script, library, parallel=parallel, speculation=case != "one slot")
    assert isinstance(got, str), case
    assert {
        "one slot": "several KV slots",
        "shared slot": "two live requests on KV slot 0",
        "slot out of range": "slot 4 is outside the engine's 4 KV slots",
        "too many rows": "more live requests than the engine's 2 rows",
    }[case] in got


def test_slots_are_counted_in_the_arena(tiny_build, library):
    """ls_stats' slot_bytes is one slot's KV (every layer's K and V slabs, a whole context of float32 rows,
    counted from the build's shape), and a runtime with 4 slots allocates 3 slots more of arena (which the
    memory budget counts) than one with 1."""
    from lora_share.inference import c_library as native

    f = TINY_FOUNDATION
    slot = (
        2
        * f["n_layers"]
        * f["n_kv_heads"]
        * tiny_build.manifest["foundation"]["args"]["max_seq_len"]
        * (f["dim"] // f["n_heads"])
        * 4
    )
    stats = {}
    for parallel in (1, 4):
        with native.open(tiny_build.ptd, library=library, parallel=parallel) as rt:
            rt.load_adapter(tiny_build.ptes["tiny_a"])
            stats[parallel] = rt.stats()
    assert stats[1]["slot_bytes"] == stats[4]["slot_bytes"] == slot
    assert stats[4]["arena_bytes"] - stats[1]["arena_bytes"] >= 3 * slot


def test_step_timing_runs_rows_of_drafts(tiny_build, library):
    """ls_diag_time_steps (what benchmarks/verify_step.py measures with): a time for every step, of rows of
    1 and 9 tokens; a row count past the engine's is refused with a message."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from verify_step import time_steps

    from lora_share.inference import c_library as native

    with native.open(tiny_build.ptd, library=library, parallel=2) as rt:
        rt.load_adapter(tiny_build.ptes["tiny_a"])
        for rows, tokens in ((1, 1), (2, 9)):
            ms = time_steps(rt, rt.adapter("tiny_a").handle, LONG, rows, tokens, steps=3)
            assert len(ms) == 3 and all(0 < t < 10_000 for t in ms)
        with pytest.raises(native.NativeError, match="3 rows; the engine runs 1..2"):
            time_steps(rt, None, LONG, 3, 2, steps=1)
