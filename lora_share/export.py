"""Export one adapter over the foundation: XNNPACK-lowered .pte + foundation .ptd.

Foundation tensors are tagged for the external data file ``foundation.ptd``
(delegated weights through ExecuTorch's ``delegate_external_constants_pass_unlifted``,
the rest through ``ExecutorchBackendConfig(external_constants=...)``); LoRA
tensors are left untagged, so they stay inside the .pte, except those the build
hoists into ``adapters_shared.ptd`` (shared_data.py), tagged for that file. Only
standard ATen ops are used, so the program runs on the stand-alone C++ runtime.
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
from .model import LlamaLoRA, forward_inputs
from .shared_data import SHARED_PTD, SHARED_TAG

FOUNDATION_TAG = "foundation"  # -> foundation.ptd
# The revision of the exported graph. Part of every adapter's signature and of the check that
# keeps an earlier build's files: raise it whenever the model or the export passes change what
# a program computes or how, so that a rebuild exports again instead of reusing stale programs.
# 2: attention over the written prefix, prefill chunks, the KV cache updated in place.
EXPORTER_REVISION = 2


def example_inputs(chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """forward's example inputs for torch.export: a few tokens after two earlier positions (so that
    the two dynamic sizes, tokens and cache positions, differ and are not taken to be one)."""
    return forward_inputs(range(1, min(3, chunk) + 1), 2)


def is_adapter_tensor(name: str) -> bool:
    """LoRA parameter names contain ``lora_a``/``lora_b`` (graph names or dotted paths)."""
    return "lora_a" in name or "lora_b" in name


def _tag(node: torch.fx.Node) -> str | None:
    target = node.target if isinstance(node.target, str) else node.name
    return None if is_adapter_tensor(target) or is_adapter_tensor(node.name) else FOUNDATION_TAG


def _tagger(shared: frozenset[str]):
    """``_tag``, except that the LoRA parameters named in ``shared`` go to adapters_shared.ptd."""
    if not shared:
        return _tag
    by_node_name = {name.replace(".", "_") for name in shared}

    def tag(node: torch.fx.Node) -> str | None:
        target = node.target if isinstance(node.target, str) else None
        return SHARED_TAG if target in shared or node.name in by_node_name else _tag(node)
    return tag


def eager_model(foundation: Foundation, adapter: Adapter | None = None, quantized: bool = True) -> LlamaLoRA:
    """The PyTorch model with the adapter applied: the reference for every export.

    A foundation with ``quantize`` set is quantized (LoRA stays float) unless
    ``quantized=False``, which gives the float model it approximates.
    """
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
    if quantized and foundation.quantize is not None:
        from .quantize import quantize_foundation_

        quantize_foundation_(model, foundation.quantize)
    return model.eval()


def _tag_quantized_weights(gm: torch.fx.GraphModule):
    """Edge pass (before partitioning): send quantized foundation weights to foundation.ptd too.

    XNNPACK's serializer reads the external tag of a quantized weight (and of its
    scales) from the dequantize node it consumes, not from the weight, and the
    tag given to the weight before export does not survive the flattening of
    torchao's quantized tensors. So tag each weight placeholder feeding a
    dequantize node, and that node, with ``_tag`` of the weight (LoRA: none).
    """
    from executorch.exir.pass_base import PassResult

    changed = False
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        for user in node.users:
            if user.op == "call_function" and "dequantize" in str(user.target) and user.args[0] is node:
                tag = _tag(node)
                if tag is not None:
                    for n in (node, user):
                        n.meta.setdefault("custom", {})["delegate_constant_tag"] = tag
                    changed = True
    return PassResult(gm, changed)


@dataclass
class Exported:
    pte: bytes
    ptd: bytes
    seconds: float
    shared_ptd: bytes = b""  # the hoisted LoRA tensors this program reads (empty if none)


def export_program(model: LlamaLoRA, workdir: Path, named_data: dict[str, tuple[bytes, str | None]] | None = None,
                   external: bool = True, shared: frozenset[str] = frozenset()) -> Exported:
    """torch.export → XNNPACK → ExecuTorch; returns the .pte bytes and the foundation .ptd bytes.

    ``named_data`` adds blobs: key -> (bytes, FOUNDATION_TAG for the .ptd or None for the .pte).
    ``shared`` names LoRA parameters (``model.lora_param_name``) to keep out of the .pte, in
    the data file adapters_shared.ptd (``shared_ptd``).
    ``external=False`` tags nothing: a stand-alone .pte with every weight inside (``ptd`` is
    empty; the benchmark's baseline). Give it no FOUNDATION_TAG blobs and no ``shared``.
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted
    from torch.export import Dim

    from .quantize import is_quantized

    t0 = time.perf_counter()
    args = model.args
    # One forward call takes at most a prefill chunk of tokens: activations are planned for
    # chunk x context, not context x context (the runners feed longer prompts chunk by chunk).
    # The attended cache slots are a dynamic size of their own, up to the whole context.
    dynamic = ({1: Dim("seq", min=1, max=args.chunk)}, {0: Dim("cache", min=1, max=args.max_seq_len)})
    example = example_inputs(args.chunk)
    # Float exports take exactly the float path. An int8 embedding is torchao's dequantize +
    # embedding; ExecuTorch's quant fusion turns that into its quantized embedding_byte kernel.
    quantized = any(is_quantized(p) for p in model.parameters())
    fuse_quant = is_quantized(model.model.embed_tokens.weight)
    with torch.no_grad(), warnings.catch_warnings(), _quiet_logs():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, example, dynamic_shapes=dynamic, strict=False)
        unlifted = ep.module()
        tagger = _tagger(frozenset(shared)) if external else None
        if external:
            delegate_external_constants_pass_unlifted(unlifted, tagger)
        ep = torch.export.export(unlifted, example, dynamic_shapes=dynamic, strict=False)
        edge = to_edge_transform_and_lower(
            ep,
            transform_passes=[_tag_quantized_weights] if quantized and external else None,
            partitioner=[XnnpackPartitioner()],
            constant_methods={"get_max_seq_len": args.max_seq_len, "get_vocab_size": args.vocab_size,
                              "get_prefill_chunk": args.chunk},
        )
        for key, (data, tag) in (named_data or {}).items():
            edge._named_data_store.add_named_data(key, data, alignment=16, external_tag=tag)
        program = edge.to_executorch(
            # run_reinplace_pass: the KV cache update becomes an in-place index_put_; without it
            # every layer copies its whole cache (context x heads x head_dim) on every call.
            ExecutorchBackendConfig(external_constants=tagger if external else False,
                                    do_quant_fusion_and_const_prop=fuse_quant, run_reinplace_pass=True))
        workdir.mkdir(parents=True, exist_ok=True)
        program.write_tensor_data_to_file(str(workdir))
        pte = program.buffer
    written = sorted(p.name for p in workdir.iterdir())
    expected = sorted(([f"{FOUNDATION_TAG}.ptd"] if external else []) + ([SHARED_PTD] if shared else []))
    if written != expected:
        raise RuntimeError(f"export wrote {written}, expected {expected or 'nothing'}")
    ptd = (workdir / f"{FOUNDATION_TAG}.ptd").read_bytes() if external else b""
    shared_ptd = (workdir / SHARED_PTD).read_bytes() if shared else b""
    return Exported(pte, ptd, time.perf_counter() - t0, shared_ptd)


class _quiet_logs:
    """ExecuTorch logs every lowering step at INFO; keep the build's own output readable."""

    def __enter__(self):
        self.level = logging.root.level
        logging.root.setLevel(logging.WARNING)

    def __exit__(self, *exc):
        logging.root.setLevel(self.level)
