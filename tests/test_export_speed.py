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


def _model(case: str, folder):
    """(eager model, envelope) of ``case``'s foundation in an envelope of TARGETS."""
    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import load_config
    from lora_share.export.eager import eager_model
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
    return eager_model(foundation, envelope=envelope), envelope


def _digests(exported) -> tuple[str, str]:
    return hashlib.sha256(exported.pte).hexdigest(), hashlib.sha256(exported.ptd.read_bytes()).hexdigest()


def _export_both_ways(case: str, folder) -> dict[bool, tuple[str, str]]:
    """lean -> the sha256 of the exported .pte and of its foundation.ptd."""
    from lora_share.export.program import export_program

    model, envelope = _model(case, folder)
    return {
        lean: _digests(export_program(model, envelope, folder / f"lean_{lean}", lean=lean)) for lean in (True, False)
    }


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


def test_partitions_of_every_method_hold_the_quantized_weights_not_copies(tmp_path, monkeypatch):
    """ExecuTorch deep-copies every delegated partition of every method before XNNPACK preprocesses any
    (export/memory.py): an 8da4w weight's int8 values are there plain tensors, which the lowering now keeps
    on the model's own memory in forward, decode and decode_batch alike; and the program and
    foundation.ptd are those of the lowering that copies them, byte for byte."""
    import copy

    import torch
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from lora_share.export import memory
    from lora_share.export.program import export_program
    from lora_share.model.quantize import foundation_linears

    model, envelope = _model("llama 8da4w", tmp_path)
    weight = model.model.layers[0].mlp.down_proj.weight
    qdata = weight.qdata  # torchao's IntxUnpackedToInt8Tensor: int8 values, scales, zero points
    assert qdata.dtype == torch.int8 and qdata.data_ptr() != 0
    with memory.sharing_weights([weight]):
        assert copy.deepcopy(qdata) is qdata and copy.deepcopy(qdata[1:]).data_ptr() == qdata[1:].data_ptr()
    assert copy.deepcopy(qdata).data_ptr() != qdata.data_ptr()  # the block's sharing ends with it

    linears_int8 = {lin.weight.qdata.untyped_storage().data_ptr() for lin in foundation_linears(model).values()}
    model_memory = {ptr for t in (*model.parameters(), *model.buffers()) for ptr in memory._storage_pointers(t)}
    seen = {}  # method's partition -> the storages of its int8 constants
    original = XnnpackBackend.copy_exported_program_for_preprocess.__func__

    def recording(cls, program, compile_specs):
        copied = original(cls, program, compile_specs)
        int8 = [t for t in (*copied.state_dict.values(), *copied.constants.values()) if t.dtype == torch.int8]
        seen[len(seen)] = {t.untyped_storage().data_ptr() for t in int8}
        return copied

    monkeypatch.setattr(XnnpackBackend, "copy_exported_program_for_preprocess", classmethod(recording))
    shared = _digests(export_program(model, envelope, tmp_path / "shared", batch=True))
    partitions_int8 = set().union(*seen.values())
    assert len(linears_int8) >= 5 and linears_int8 <= partitions_int8 <= model_memory

    seen.clear()
    monkeypatch.setattr(memory, "_plain_storage", lambda t: None)  # ExecuTorch's own copies
    copied = _digests(export_program(model, envelope, tmp_path / "copied", batch=True))
    assert set().union(*seen.values()).isdisjoint(model_memory)  # the copies this lowering no longer makes
    assert copied == shared
