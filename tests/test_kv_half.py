"""A float16 KV cache (``foundation.kv_cache: float16``): half the cache's bytes, attention in float16.

References: the eager model with a float32 cache (what the program approximates) and with a float16
one (what it computes), the float32 build of the same foundation (the bytes it saves), and ExecuTorch's
Python runtime for the C++ runner.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import TINY_ADAPTERS, TINY_CHUNK, TINY_FOUNDATION, build_config, write_config
from test_cpp_runner import all_ptes, ids, run_runner

import lora_share
from lora_share.bench.scale_shapes import kv_cache_bytes
from lora_share.checkpoints.adapters import load_adapter
from lora_share.checkpoints.foundation import load_foundation
from lora_share.export.eager import eager_model
from lora_share.inference.generate import generate
from lora_share.inference.python_runtime import LoadedAdapter

pytestmark = pytest.mark.slow  # a float16-cache build of its own

PROMPT = [(7 * i + 5) % 256 for i in range(2 * TINY_CHUNK + 3)]  # three prefill calls
NEW = 8


@pytest.fixture(scope="module")
def half_build(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kv_half")
    cfg = write_config(
        folder,
        {"synthetic": TINY_FOUNDATION, "max_seq_len": 32, "prefill_chunk": TINY_CHUNK, "kv_cache": "float16"},
        TINY_ADAPTERS[:2],
    )
    return build_config(cfg)


def eager(config, name: str, kv_dtype: str):
    cfg = lora_share.validate(config)
    foundation = load_foundation(cfg.foundation)
    foundation.args = dataclasses.replace(foundation.args, kv_dtype=kv_dtype)
    adapter = next(a for a in cfg.adapters if a.name == name)
    model = eager_model(foundation, load_adapter(adapter, foundation.args))
    model.reset_cache()

    def step(tokens, pos):
        with torch.no_grad():
            return model.step(tokens, pos).float().numpy()

    return generate(step, PROMPT, NEW)


def test_cache_is_float16_and_half_the_bytes(half_build, tiny_build):
    args = half_build.manifest["foundation"]["args"]
    assert args["kv_dtype"] == "float16"
    assert half_build.manifest["export_settings"]["kv_cache"] == "float16"
    full = kv_cache_bytes(tiny_build.manifest["foundation"]["args"])
    assert kv_cache_bytes(args) * 2 == full
    adapter = LoadedAdapter(half_build.ptes["tiny_a"], half_build.ptd)
    assert {s.dtype for s in adapter.cache.slabs} == {torch.float16}
    assert sum(s.numel() * s.element_size() for s in adapter.cache.slabs) == kv_cache_bytes(args)


@pytest.mark.parametrize("name", ["tiny_a", "tiny_b"])
def test_program_matches_eager(half_build, name):
    """Chunked prefill and decode through the program: the eager model with a float16 cache closely
    (both round attention to float16), the float32 eager model within float16's precision, same
    greedy tokens."""
    got = lora_share.run(half_build.ptes[name], half_build.ptd, PROMPT, NEW)
    half, full = eager(half_build.config, name, "float16"), eager(half_build.config, name, "float32")
    scale = np.abs(full.logits).max()
    assert np.abs(got.logits - half.logits).max() <= 2e-3 * scale
    assert np.abs(got.logits - full.logits).max() <= 1e-2 * scale
    assert got.tokens == full.tokens
    # float16 really ran: the program's logits are not the float32 model's to float32's precision
    assert np.abs(got.logits - full.logits).max() > 1e-5 * scale


@pytest.mark.parametrize("mode", [[], ["--stock"]], ids=["shared", "stock"])
def test_cpp_runner_matches_python(runner_bin, half_build, tmp_path, mode):
    for name, pte in half_build.ptes.items():
        npy = tmp_path / f"{name}.npy"
        proc = run_runner(
            runner_bin,
            *all_ptes(half_build),
            "--ptd",
            half_build.ptd,
            "--tokens",
            ids(PROMPT),
            "--max-new-tokens",
            NEW,
            "--adapter",
            name,
            "--dump-logits",
            npy,
            *mode,
        )
        assert proc.returncode == 0, proc.stderr
        ref = lora_share.run(pte, half_build.ptd, PROMPT, NEW)
        assert [int(t) for t in proc.stdout.split()] == ref.tokens, name
        got = np.load(npy)
        # The prompt's logits come from forward in both runtimes: the same arithmetic. The runner then
        # decodes with the decode method, whose attention (lora_share::attend) reads the float16 cache
        # in float32 where forward's runs in XNNPACK's float16: within float16's precision.
        assert np.abs(got[0] - ref.logits[0]).max() <= 1e-4, name
        assert np.abs(got - ref.logits).max() <= 2e-3 * np.abs(ref.logits).max(), name


def test_runner_arena_holds_the_smaller_cache(runner_bin, half_build, tiny_build):
    """The runner's planned memory (KV cache + activations) shrinks by at least half the float32 cache."""

    def planned(build):
        proc = run_runner(
            runner_bin,
            "--pte",
            build.ptes["tiny_a"],
            "--ptd",
            build.ptd,
            "--tokens",
            "1",
            "--max-new-tokens",
            1,
            "--json",
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["loading"]["planned_bytes"]

    full = kv_cache_bytes(tiny_build.manifest["foundation"]["args"])
    assert planned(tiny_build) - planned(half_build) >= full // 2
