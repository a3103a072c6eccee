"""Exported programs (PTE + shared PTD through the ExecuTorch runtime) against the eager model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lora_share
from lora_share.checkpoints.adapters import load_adapter
from lora_share.checkpoints.foundation import load_foundation
from lora_share.export.eager import eager_model
from lora_share.inference.generate import generate

PROMPT = [1, 17, 42, 7, 99]
NEW = 10


def eager_generation(model, prompt, n):
    model.reset_cache()

    def step(tokens, pos):
        with torch.no_grad():
            return model.step(tokens, pos).numpy()

    return generate(step, prompt, n)


@pytest.fixture(scope="module")
def tiny_models(tiny_build):
    cfg = lora_share.validate(tiny_build.config)
    foundation = load_foundation(cfg.foundation)
    return foundation, {a.name: eager_model(foundation, load_adapter(a, foundation.args)) for a in cfg.adapters}


@pytest.mark.parametrize("name", ["tiny_a", "tiny_b", "tiny_c"])
def test_pte_matches_eager(tiny_build, tiny_models, name):
    _, models = tiny_models
    got = lora_share.run(tiny_build.ptes[name], tiny_build.ptd, PROMPT, NEW)
    want = eager_generation(models[name], PROMPT, NEW)
    assert got.logits.shape == (NEW, 256)
    assert np.abs(got.logits - want.logits).max() <= 1e-4
    assert got.tokens == want.tokens


@pytest.mark.parametrize("name", ["tiny_a", "tiny_b"])
def test_chunked_prefill_matches_eager(tiny_build, tiny_models, name):
    """A prompt of almost three prefill chunks, fed chunk by chunk to the program, against the eager
    model given the whole prompt in one call: same logits, same greedy tokens, up to the context's end."""
    from conftest import TINY_CHUNK

    _, models = tiny_models
    prompt = [(5 * i + 3) % 256 for i in range(3 * TINY_CHUNK - 2)]
    new = 32 - len(prompt) + 1  # the last position used is the context's last slot
    got = lora_share.run(tiny_build.ptes[name], tiny_build.ptd, prompt, new)
    want = eager_generation(models[name], prompt, new)
    assert np.abs(got.logits - want.logits).max() <= 1e-4
    assert got.tokens == want.tokens


def test_request_past_the_context_is_refused(tiny_build):
    with pytest.raises(
        lora_share.UserError, match=r"need 33 positions, but the program's context \(max_seq_len\) is 32"
    ):
        lora_share.run(tiny_build.ptes["tiny_a"], tiny_build.ptd, list(range(1, 31)), 4)


def test_adapters_change_the_output(tiny_build, tiny_models):
    """Guards against a LoRA path that silently does nothing: every adapter moves the logits."""
    foundation, models = tiny_models
    base = eager_generation(eager_model(foundation), PROMPT, 1).logits[0]
    rows = {n: lora_share.run(p, tiny_build.ptd, PROMPT, 1).logits[0] for n, p in tiny_build.ptes.items()}
    for name, row in rows.items():
        assert np.abs(row - base).max() > 1e-2, name
    assert np.abs(rows["tiny_a"] - rows["tiny_b"]).max() > 1e-2


def test_one_foundation_for_all_adapters(tiny_build):
    # .packed: the packed-weights file a runtime that ran on the build wrote (lora_share.h, PACKED WEIGHTS)
    files = sorted(p.name for p in tiny_build.out_dir.iterdir() if p.name != ".packed")
    assert files == [
        "config.resolved.yaml",
        "foundation.ptd",
        "manifest.json",
        "tiny_a.pte",
        "tiny_b.pte",
        "tiny_c.pte",
    ]
    m = tiny_build.manifest
    assert m["foundation"]["size"] == tiny_build.ptd.stat().st_size
    from lora_share.files import sha256_file

    assert m["foundation"]["sha256"] == sha256_file(tiny_build.ptd)
    for entry in m["adapters"]:
        path = tiny_build.out_dir / entry["file"]
        assert entry["size"] == path.stat().st_size and entry["sha256"] == sha256_file(path)
    assert [a["rank"] for a in m["adapters"]] == [4, 8, 2]
    assert m["adapters"][2]["layers"] == [1] and m["adapters"][2]["targets"] == ["k_proj", "up_proj"]


@pytest.mark.parametrize("name", ["tiny_a", "tiny_b"])
def test_rows_after_the_position_are_masked(tiny_build, tiny_models, name):
    """forward at position P reads slab views of any length above P (model.kv_view_rows): the program
    masks rows P + 1 and later, so views of exactly P + 1 rows and whole slabs whose rows after P hold
    large garbage give the same logits and new rows."""
    from lora_share.inference.python_runtime import LoadedAdapter
    from lora_share.model.decoder import forward_inputs

    adapter = LoadedAdapter(tiny_build.ptes[name], tiny_build.ptd)
    adapter.step(PROMPT, 0)
    pos, g = len(PROMPT), torch.Generator().manual_seed(3)
    exact = adapter.forward.execute(list(forward_inputs([5, 6], pos, adapter.cache, adapter.lora, block=1)))
    for slab in adapter.cache.slabs:
        slab[pos + 1 :] = (torch.rand(slab[pos + 1 :].shape, generator=g) * 2000 - 1000).to(slab.dtype)
    whole = adapter.forward.execute(list(forward_inputs([5, 6], pos, adapter.cache, adapter.lora, block=10**6)))
    assert adapter.cache.slabs[0].shape[0] > pos + 1 + 2
    for a, b in zip(exact, whole):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5, rtol=1e-6)  # sums of other lengths
    eager = tiny_models[1][name]
    eager.reset_cache()
    eager.step(PROMPT, 0)
    ref = eager(*forward_inputs([5, 6], pos, eager._cache, eager._lora, block=1))[0]
    assert np.abs(ref.detach().numpy() - exact[0].numpy()).max() <= 1e-4
