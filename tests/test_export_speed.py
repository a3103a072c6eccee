"""The lean lowering (export/speed.py) gives the program ExecuTorch's lowering as shipped gives, byte for
byte, for each kind of graph lora-share exports: llama's at float32 (with eight key/value heads) and
8da4w (ExecuTorch's int4 grid, an int4 embedding table), Gemma 3's (sliding rings, q/k norms, gelu),
Phi-3's (fused q/k/v and gate/up) at 8da4w on llama.cpp's Q4_1 grid with an int8 table and output
projection."""

from __future__ import annotations

import dataclasses
import hashlib
import sys

import pytest
from conftest import REPO, TINY_FOUNDATION, write_config

sys.path.insert(0, str(REPO / "examples" / "families"))
from tiny_checkpoints import SPECS, write_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow  # each kind of graph exported twice, lean and as shipped

# LoRA inputs on an attention projection and an MLP one (each fused in Phi-3), and one layer where the
# foundation is ours to shape: each node costs re-tracing time, and one of each kind is what counts.
TARGETS = ["v_proj", "up_proj"]
ONE_LAYER = {**TINY_FOUNDATION, "n_layers": 1}


def _foundation(case: str, folder) -> dict:
    if case == "llama fp32":  # eight key/value heads, as Llama-3.2-1B: more blocks to join than XNNPACK's cat takes
        return {"synthetic": {**ONE_LAYER, "n_heads": 8, "n_kv_heads": 8}, "max_seq_len": 32}
    if case == "llama 8da4w":  # ExecuTorch's grid, an int4 table, an int4 output projection of its own
        return {
            "synthetic": {**ONE_LAYER, "tie_embeddings": False},
            "max_seq_len": 32,
            "quantize": {"scheme": "8da4w", "group_size": 32, "embedding": "int4"},
        }
    family, _, precision = case.partition(" ")
    spec = dataclasses.replace(SPECS[{"gemma3": "gemma3_text"}.get(family, family)], adapters={})
    if family != "gemma3":  # Gemma 3 keeps its layers: sliding and global ones differ
        spec = dataclasses.replace(spec, config={**spec.config, "num_hidden_layers": 1})
    foundation = {"checkpoint": str(write_checkpoint(spec, folder / "inputs") / "model"), "max_seq_len": 32}
    if precision:  # llama.cpp's Q4_1 grid, int8 table and output (bench-peers' build)
        foundation["quantize"] = {
            "scheme": "8da4w",
            "group_size": 32,
            "embedding": "int8",
            "grid": "asymmetric",
            "lm_head": "int8",
        }
    return foundation


def _export_both_ways(case: str, folder) -> dict[bool, tuple[str, str]]:
    """lean -> the sha256 of the exported .pte and of its foundation.ptd."""
    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import load_config
    from lora_share.export.eager import eager_model
    from lora_share.export.program import export_program
    from lora_share.model.envelope import Envelope

    adapter = {
        "name": "a",
        "synthetic": {"rank": 2, "alpha": 4, "target_modules": ["v_proj"]},
    }  # the envelope is what counts
    config = write_config(
        folder, _foundation(case, folder), [adapter], lora_envelope={"targets": TARGETS, "max_rank": 4}
    )
    cfg = load_config(config)
    foundation = load_foundation(cfg.foundation)
    envelope = Envelope.resolve(cfg.lora_envelope, [], foundation.args)
    model = eager_model(foundation, envelope=envelope)
    out = {}
    for lean in (True, False):
        exported = export_program(model, envelope, folder / f"lean_{lean}", lean=lean)
        out[lean] = hashlib.sha256(exported.pte).hexdigest(), hashlib.sha256(exported.ptd.read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("case", ["llama fp32", "llama 8da4w", "gemma3", "phi3 8da4w"])
def test_lean_lowering_gives_the_shipped_program(case, tmp_path):
    digests = _export_both_ways(case, tmp_path)
    assert digests[True] == digests[False]


def test_compact_dependencies_hold_executorch_sets(tmp_path):
    """The partitioner's dependency closures held as bits (export/memory.py) are ExecuTorch's and
    torch.fx's sets, node for node, on the exported graph of a tiny program."""
    import torch
    from executorch.exir.backend.canonical_partitioners import group_partitioner
    from torch.fx.passes.infra import partitioner

    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import load_config
    from lora_share.export.eager import eager_model
    from lora_share.export.memory import _CompactDependencyViewer
    from lora_share.export.program import example_inputs
    from lora_share.model.envelope import Envelope

    adapter = {
        "name": "a",
        "synthetic": {"rank": 2, "alpha": 4, "target_modules": ["v_proj"]},
    }  # inside the envelope, which validate checks
    cfg = load_config(
        write_config(
            tmp_path,
            {"synthetic": ONE_LAYER, "max_seq_len": 32},
            [adapter],
            lora_envelope={"targets": TARGETS, "max_rank": 4},
        )
    )
    foundation = load_foundation(cfg.foundation)
    envelope = Envelope.resolve(cfg.lora_envelope, [], foundation.args)
    model = eager_model(foundation, envelope=envelope)
    gm = torch.export.export(model, example_inputs(foundation.args, envelope), strict=False).graph_module

    compact = _CompactDependencyViewer(gm)
    theirs, torch_fx = group_partitioner._DependencyViewer(gm), partitioner._DependencyViewer(gm)
    nodes = list(gm.graph.nodes)
    for node in nodes:
        down = compact.downstreams_of(node)
        assert set(down) == theirs.downstreams_of(node) == torch_fx.downstreams_of(node)
        assert len(down) == len(theirs.downstreams_of(node))
        assert all(n in down for n in theirs.downstreams_of(node))
        assert set(compact.upstreams_of(node)) == theirs.upstreams_of(node)
    assert max(len(compact.downstreams_of(n)) for n in nodes) > len(nodes) // 2  # not trivially small closures


def test_sharing_weights_takes_scalar_constants():
    """A 0-dim constant (a scalar a graph may carry) is shared like any weight: deepcopy keeps the
    tensor itself, and the named-data store gets the tensor's own bytes under their sha256, not a copy."""
    import copy

    import torch
    from executorch.exir._serialize._named_data_store import NamedDataStore

    from lora_share.export.memory import sharing_weights

    scalar, row = torch.tensor(1.5), torch.arange(4, dtype=torch.float32)
    with sharing_weights([scalar, row]):
        assert copy.deepcopy(scalar) is scalar and copy.deepcopy(row) is row
        store = NamedDataStore()
        for t in (scalar, row):
            raw = t.numpy().tobytes()
            store.add_named_data(hashlib.sha256(raw).hexdigest(), raw)
        stored = [store.get_named_data_store_output().buffers[i] for i in range(2)]
    assert [b.to_bytes() for b in stored] == [scalar.numpy().tobytes(), row.numpy().tobytes()]
    assert all(not isinstance(b, bytes) for b in stored)  # read from the tensors, not copied
    assert copy.deepcopy(scalar) is not scalar  # the block's sharing ends with it
