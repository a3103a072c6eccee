"""Export one adapter over the foundation: XNNPACK-lowered .pte + foundation .ptd.

Foundation tensors are tagged for the external data file ``foundation.ptd``
(delegated weights through ExecuTorch's ``delegate_external_constants_pass_unlifted``,
the rest through ``ExecutorchBackendConfig(external_constants=...)``); LoRA
tensors are left untagged, so they stay inside the .pte. Only standard ATen ops
are used, so the program runs on the stand-alone C++ runtime.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .adapters import Adapter
from .foundation import Foundation
from .model import LlamaLoRA

FOUNDATION_TAG = "foundation"  # -> foundation.ptd
EXAMPLE_PROMPT = (torch.tensor([[1, 2, 3]], dtype=torch.int64), torch.tensor([0], dtype=torch.int64))


def is_adapter_tensor(name: str) -> bool:
    """LoRA parameter names contain ``lora_a``/``lora_b`` (graph names or dotted paths)."""
    return "lora_a" in name or "lora_b" in name


def _tag(node: torch.fx.Node) -> str | None:
    target = node.target if isinstance(node.target, str) else node.name
    return None if is_adapter_tensor(target) or is_adapter_tensor(node.name) else FOUNDATION_TAG


def eager_model(foundation: Foundation, adapter: Adapter | None = None) -> LlamaLoRA:
    """The PyTorch model with the adapter applied: the reference for every export."""
    model = LlamaLoRA(foundation.args, adapter.spec if adapter else None)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter_tensor(name):
                continue
            p.copy_(foundation.tensors[name])
        for (layer, target), (a, b) in (adapter.weights.items() if adapter else ()):
            block = model.model.layers[layer]
            lin = getattr(block.self_attn if hasattr(block.self_attn, target) else block.mlp, target)
            lin.lora_a.weight.copy_(a)
            lin.lora_b.weight.copy_(b)
    model.requires_grad_(False)
    return model.eval()


@dataclass
class Exported:
    pte: bytes
    ptd: bytes
    seconds: float


def export_program(model: LlamaLoRA, workdir: Path) -> Exported:
    """torch.export → XNNPACK → ExecuTorch; returns the .pte bytes and the foundation .ptd bytes."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted
    from torch.export import Dim

    t0 = time.perf_counter()
    args = model.args
    dynamic = ({1: Dim("seq", min=1, max=args.max_seq_len)}, None)
    with torch.no_grad(), warnings.catch_warnings(), _quiet_logs():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, EXAMPLE_PROMPT, dynamic_shapes=dynamic, strict=False)
        unlifted = ep.module()
        delegate_external_constants_pass_unlifted(unlifted, _tag)
        ep = torch.export.export(unlifted, EXAMPLE_PROMPT, dynamic_shapes=dynamic, strict=False)
        edge = to_edge_transform_and_lower(
            ep,
            partitioner=[XnnpackPartitioner()],
            constant_methods={"get_max_seq_len": args.max_seq_len, "get_vocab_size": args.vocab_size},
        )
        program = edge.to_executorch(ExecutorchBackendConfig(external_constants=_tag))
        workdir.mkdir(parents=True, exist_ok=True)
        program.write_tensor_data_to_file(str(workdir))
        pte = program.buffer
    written = sorted(p.name for p in workdir.iterdir())
    if written != [f"{FOUNDATION_TAG}.ptd"]:
        raise RuntimeError(f"export wrote {written}, expected only {FOUNDATION_TAG}.ptd")
    ptd = (workdir / f"{FOUNDATION_TAG}.ptd").read_bytes()
    return Exported(pte, ptd, time.perf_counter() - t0)


class _quiet_logs:
    """ExecuTorch logs every lowering step at INFO; keep the build's own output readable."""

    def __enter__(self):
        self.level = logging.root.level
        logging.root.setLevel(logging.WARNING)

    def __exit__(self, *exc):
        logging.root.setLevel(self.level)
