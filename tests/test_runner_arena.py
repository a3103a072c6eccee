"""build/runner: prompts longer than a prefill chunk, one planned-memory arena for every program, and
requests that would pass the context.

`tiny_build` (conftest) has a context of 32 and a prefill chunk of TINY_CHUNK tokens, so the long
prompts here take several forward calls. Its adapters differ in rank and targets, so their programs'
planned memory differs too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY_CHUNK
from test_cpp_runner import assert_clean_error, ids, run_runner

import lora_share
from lora_share.checkpoints.adapters import load_adapter
from lora_share.checkpoints.foundation import load_foundation
from lora_share.export.eager import eager_model

CONTEXT = 32
LONG = [(5 * i + 3) % 256 for i in range(2 * TINY_CHUNK + 5)]  # three calls: chunk, chunk, 5
NEW = 6
ARENAS = {"shared": [], "private": ["--private-arenas"]}


def prompt(n: int, salt: int) -> list[int]:
    return [(11 * i + salt) % 256 for i in range(n)]


@pytest.fixture(scope="module")
def eager(tiny_build):
    """Adapter name -> the eager PyTorch model: the independent reference."""
    cfg = lora_share.validate(tiny_build.config)
    foundation = load_foundation(cfg.foundation)
    return {a.name: eager_model(foundation, load_adapter(a, foundation.args)) for a in cfg.adapters}


def eager_last_logits(model, tokens: list[int]) -> np.ndarray:
    """The eager model given all of `tokens` in one call from position 0 (no chunks)."""
    model.reset_cache()
    with torch.no_grad():
        return model.step(tokens, 0).numpy()


def runner(runner_bin, tiny_build, names, *flags, input=None):
    ptes = [arg for name in names for arg in ("--pte", tiny_build.ptes[name])]
    return run_runner(runner_bin, "--ptd", tiny_build.ptd, *ptes, *flags, input=input)


# --- chunked prefill ------------------------------------------------------------------


@pytest.mark.parametrize("mode", [*ARENAS.values(), ["--stock"]], ids=[*ARENAS, "stock"])
def test_long_prompt_is_chunked_and_exact(runner_bin, tiny_build, eager, tmp_path, mode):
    npy = tmp_path / "logits.npy"
    proc = runner(
        runner_bin,
        tiny_build,
        ["tiny_b"],
        "--tokens",
        ids(LONG),
        "--max-new-tokens",
        NEW,
        "--dump-logits",
        npy,
        "--json",
        *mode,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["prefill_chunk"] == TINY_CHUNK and out["max_seq_len"] == CONTEXT
    assert out["prompt_tokens"] == len(LONG) > 2 * TINY_CHUNK
    rows = np.load(npy)
    assert rows.shape == (NEW, 256)
    # Row 0: the last call of the prefill; row i: after feeding generated token i. Each equals the
    # eager model given the whole sequence at once, and greedy picks the largest logit of each row.
    tokens = out["tokens"]
    for i in range(NEW):
        want = eager_last_logits(eager["tiny_b"], LONG + tokens[:i])
        assert np.abs(rows[i] - want).max() <= 1e-4, i
        assert tokens[i] == int(np.argmax(rows[i])), i


def test_long_prompt_matches_the_python_runtime(runner_bin, tiny_build, tmp_path):
    from lora_share.inference.python_runtime import run

    npy = tmp_path / "logits.npy"
    proc = runner(
        runner_bin,
        tiny_build,
        list(tiny_build.ptes),
        "--adapter",
        "tiny_a",
        "--tokens",
        ids(LONG),
        "--max-new-tokens",
        NEW,
        "--dump-logits",
        npy,
    )
    assert proc.returncode == 0, proc.stderr
    ref = run(tiny_build.ptes["tiny_a"], tiny_build.ptd, LONG, NEW)
    assert [int(t) for t in proc.stdout.split()] == ref.tokens
    assert np.abs(np.load(npy) - ref.logits).max() <= 1e-4
    # The text summary says how the prompt was fed.
    assert f"prefill: {len(LONG)} tokens in 3 call(s) of at most {TINY_CHUNK}" in proc.stderr


# --- one arena ------------------------------------------------------------------------


@pytest.mark.parametrize("arena", list(ARENAS.values()), ids=list(ARENAS))
def test_a_b_a_served_from_one_process_equal_separate_processes(runner_bin, tiny_build, arena):
    """b's prompt is longer than a's second one, and so is a's first: a program that read cache slots
    its request did not write (b's, in a shared arena, or its own from before) would answer otherwise."""
    requests = [("tiny_a", prompt(20, 1)), ("tiny_b", prompt(25, 2)), ("tiny_a", prompt(11, 3))]
    assert all(len(p) > TINY_CHUNK for _, p in requests)
    lines = "".join(f"{name}\t{ids(p)}\n" for name, p in requests)
    proc = runner(runner_bin, tiny_build, ["tiny_a", "tiny_b"], "--serve", "--max-new-tokens", NEW, *arena, input=lines)
    assert proc.returncode == 0, proc.stderr
    served = [json.loads(line)["tokens"] for line in proc.stdout.splitlines()]
    alone = []
    for name, p in requests:
        one = runner(runner_bin, tiny_build, [name], "--tokens", ids(p), "--max-new-tokens", NEW, "--json")
        assert one.returncode == 0, one.stderr
        alone.append(json.loads(one.stdout)["tokens"])
    assert served == alone
    assert len({tuple(t) for t in served}) == len(requests)  # the answers really differ


def loading(runner_bin, tiny_build, names, *flags) -> dict:
    proc = runner(runner_bin, tiny_build, names, "--tokens", "1", "--max-new-tokens", 1, "--json", *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["loading"]


def test_one_arena_is_sized_to_the_largest_program(runner_bin, tiny_build, hoisted_build):
    """Adapters of one deployment share one program (one arena however they are asked for); programs
    of two deployments over the same foundation (other envelopes) share one arena sized to the larger."""
    loads = {
        "tiny_a": tiny_build.ptes["tiny_a"],
        "tiny_b": tiny_build.ptes["tiny_b"],
        "h_d": hoisted_build.ptes["h_d"],
    }  # h_d's program has another envelope; it reads nothing shared

    def planned(names, *flags):
        # Without speculation: its decode_batch method (loaded at one slot too) is planned for 16 rows of 9
        # tokens, a size the two envelopes share, and it would hide the difference between their arenas.
        ptes = [arg for n in names for arg in ("--pte", loads[n])]
        args = ("--tokens", "1", "--max-new-tokens", 1, "--json", "--no-speculation", *flags)
        proc = run_runner(runner_bin, "--ptd", tiny_build.ptd, *ptes, *args)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["loading"]

    one_program = planned(["tiny_a", "tiny_b"], "--private-arenas")
    assert one_program["planned_bytes"] == planned(["tiny_a"])["planned_bytes"] > 0
    each = {n: planned([n], "--private-arenas")["planned_bytes"] for n in ("tiny_a", "h_d")}
    assert each["tiny_a"] != each["h_d"]
    shared, private = planned(["tiny_a", "h_d"]), planned(["tiny_a", "h_d"], "--private-arenas")
    assert (shared["arena"], private["arena"]) == ("shared", "private")
    assert shared["planned_bytes"] == max(each.values())
    assert private["planned_bytes"] == sum(each.values())
    stock = loading(runner_bin, tiny_build, ["tiny_a", "tiny_b"], "--stock")
    assert (stock["arena"], stock["planned_bytes"]) == ("module", 0)


def test_private_arenas_and_stock_do_not_combine(runner_bin, tiny_build):
    proc = runner(runner_bin, tiny_build, ["tiny_a"], "--tokens", "1", "--stock", "--private-arenas")
    assert_clean_error(proc, 2)
    assert "--private-arenas" in proc.stderr


def test_help_says_what_is_kept_between_requests(runner_bin):
    proc = run_runner(runner_bin, "--help")
    assert proc.returncode == 0
    serve = next(line for line in proc.stdout.splitlines() if line.strip().startswith("--serve "))
    assert "position 0" in serve and "kept or read" in serve
    assert "--private-arenas" in proc.stdout and "starts at position 0" in proc.stdout


# --- the context ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", [[], ["--stock"]], ids=["shared", "stock"])
def test_request_past_the_context_is_refused(runner_bin, tiny_build, mode):
    proc = runner(runner_bin, tiny_build, ["tiny_a"], "--tokens", ids(prompt(30, 1)), "--max-new-tokens", 4, *mode)
    assert_clean_error(proc, 2)
    assert (
        "error: 30 prompt tokens + 4 new tokens need 33 positions, but the program's context "
        f"(max_seq_len) is {CONTEXT}: shorten the request"
    ) in proc.stderr


def test_serve_refuses_a_request_past_the_context_and_goes_on(runner_bin, tiny_build):
    lines = f"tiny_a\t{ids(prompt(CONTEXT, 1))}\ntiny_a\t{ids(prompt(CONTEXT - 1, 1))}\n"
    proc = runner(runner_bin, tiny_build, ["tiny_a"], "--serve", "--max-new-tokens", 2, input=lines)
    assert proc.returncode == 0, proc.stderr
    first, second = map(json.loads, proc.stdout.splitlines())
    assert first == {
        "error": f"{CONTEXT} prompt tokens + 2 new tokens need {CONTEXT + 1} positions, but the "
        f"program's context (max_seq_len) is {CONTEXT}: shorten the request"
    }
    assert second["adapter"] == "tiny_a" and len(second["tokens"]) == 2  # the context's last slot is used


class _InputPosContract(torch.nn.Module):
    """forward(tokens, input_pos [1]) -> logits, with no get_prefill_chunk: before prefill chunks."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8)

    def forward(self, tokens, input_pos):
        return self.head(self.embed(tokens)[:, -1, :]) + input_pos


class _CachePositionsContract(_InputPosContract):
    """forward(tokens, cache_positions [P + T]) -> logits, the KV cache inside the program: before
    the runtime owned it (EXPORTER_REVISION 2)."""

    def forward(self, tokens, cache_positions):
        return self.head(self.embed(tokens)[:, -1, :]) + cache_positions.sum()


class _PositionFromCacheContract(_InputPosContract):
    """forward(tokens, slab [P + 1, hd], ...) -> (logits, new rows): the runtime's KV cache, the
    position read off its length (EXPORTER_REVISION 3 to 7)."""

    def forward(self, tokens, slab):
        return self.head(self.embed(tokens)[:, -1, :]) + slab.sum(), slab[:1].unsqueeze(0)


@pytest.mark.parametrize(
    "contract,second,methods",
    [
        (_InputPosContract, [0], {}),
        (_CachePositionsContract, [0, 1], {"get_prefill_chunk": 2}),
        (_PositionFromCacheContract, [[0.0, 0.0, 0.0, 0.0]] * 3, {"get_prefill_chunk": 2}),
    ],
    ids=["input_pos", "cache_positions", "position_from_cache"],
)
def test_a_program_of_an_earlier_contract_is_refused(runner_bin, tiny_build, tmp_path, contract, second, methods):
    """A program exported for an earlier forward contract cannot be fed the runtime's KV cache: both
    loading paths of the runner and `lora-share run` refuse it with the fix, not a failed forward later."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(contract(), (torch.tensor([[1, 2]]), torch.tensor(second)))
    old = tmp_path / "old.pte"
    old.write_bytes(
        to_edge_transform_and_lower(
            ep,
            partitioner=[XnnpackPartitioner()],
            constant_methods={"get_max_seq_len": 16, "get_vocab_size": 8, **methods},
        )
        .to_executorch()
        .buffer
    )
    for mode in ([], ["--stock"]):
        proc = run_runner(runner_bin, "--pte", old, "--tokens", "1,2", *mode)
        assert_clean_error(proc, 1)
        assert "built by an older lora-share" in proc.stderr and "rebuild it" in proc.stderr
    from lora_share.errors import UserError
    from lora_share.inference.python_runtime import LoadedAdapter

    with pytest.raises(UserError, match="built by an older lora-share.*rebuild it"):
        LoadedAdapter(old, tiny_build.ptd)  # any data file: the program is refused for its inputs
