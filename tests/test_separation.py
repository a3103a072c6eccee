"""What lives where: foundation bytes only in foundation.ptd, adapter bytes only in their .pte.

Checked on the files as written, by searching for each tensor's raw bytes, so it
does not depend on any reader of the formats.
"""

from __future__ import annotations

import pytest

import lora_share
from lora_share.checkpoints.adapters import load_adapter
from lora_share.checkpoints.foundation import load_foundation

# The program itself (graph, XNNPACK payloads, KV-cache and op metadata) costs at most
# this much per decoder layer on top of the adapter's own LoRA bytes. Measured: ~24 KiB.
# The fixed part holds decode_batch with drafts (exporter revision 14) and the slot-rewrite table
# every adapter carries: the 2-layer 8da4w build of test_quantized measured 114,816 bytes of program.
PROGRAM_BYTES_PER_LAYER = 40 * 1024
PROGRAM_BYTES_FIXED = 40 * 1024


@pytest.fixture(scope="module")
def tensors(tiny_build):
    cfg = lora_share.validate(tiny_build.config)
    foundation = load_foundation(cfg.foundation)
    adapters = {a.name: load_adapter(a, foundation.args) for a in cfg.adapters}
    return foundation, adapters


def test_foundation_tensors_only_in_ptd(tiny_build, tensors):
    foundation, _ = tensors
    ptd = tiny_build.ptd.read_bytes()
    ptes = {n: p.read_bytes() for n, p in tiny_build.ptes.items()}
    for name, t in foundation.tensors.items():
        raw = t.numpy().tobytes()
        assert raw in ptd, f"{name} is not in foundation.ptd"
        for pte_name, pte in ptes.items():
            assert raw not in pte, f"foundation tensor {name} is inside {pte_name}.pte"


def test_adapter_tensors_only_in_their_pte(tiny_build, tensors):
    _, adapters = tensors
    ptd = tiny_build.ptd.read_bytes()
    ptes = {n: p.read_bytes() for n, p in tiny_build.ptes.items()}
    for name, adapter in adapters.items():
        for key, (a, b) in adapter.weights.items():
            for t in (a, b):
                raw = t.tobytes()
                assert raw in ptes[name], f"{name} {key} is not in {name}.pte"
                assert raw not in ptd, f"adapter tensor {name} {key} is inside foundation.ptd"
                for other, pte in ptes.items():
                    if other != name:
                        assert raw not in pte, f"{name} {key} leaked into {other}.pte"


def test_adapter_pte_size_bound(tiny_build, tensors):
    """A .pte is its LoRA bytes plus a program whose size grows with layers, not with weights."""
    foundation, adapters = tensors
    bound_extra = PROGRAM_BYTES_FIXED + PROGRAM_BYTES_PER_LAYER * foundation.args.n_layers
    for entry in tiny_build.manifest["adapters"]:
        size = (tiny_build.out_dir / entry["file"]).stat().st_size
        lora = sum(a.size * 4 + b.size * 4 for a, b in adapters[entry["name"]].weights.values())
        assert entry["lora_bytes"] == lora
        assert lora <= size <= lora + bound_extra, (entry["name"], size, lora)
