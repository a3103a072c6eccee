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

from .model import KVCache, LlamaLoRA, ModelArgs, forward_inputs, n_slabs
from .quantize import is_quantized
from .shared_data import SHARED_PTD, SHARED_TAG

FOUNDATION_TAG = "foundation"  # -> foundation.ptd
# The revision of the exported graph. Part of every adapter's signature and of the check that
# keeps an earlier build's files: raise it whenever the model or the export passes change what
# a program computes or how, so that a rebuild exports again instead of reusing stale programs.
# 2: attention over the written prefix, prefill chunks, the KV cache updated in place.
# 3: the KV cache belongs to the runtime and is handed to forward in place, one slab per layer, K/V
#    and key/value head; past keys and LoRA weights are the delegate's inputs (model.py, _partitioner).
EXPORTER_REVISION = 3


def example_inputs(args: ModelArgs) -> tuple[torch.Tensor, ...]:
    """forward's example inputs for torch.export: a few tokens after four earlier positions (so that
    the two dynamic sizes, tokens and cache prefix, differ and are not taken to be one)."""
    return forward_inputs(range(1, min(3, args.chunk) + 1), 4, KVCache.for_model(args))


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


def _partitioner(hoisted: frozenset[str]):
    """XNNPACK's partitioner, where a linear whose weight is a graph input (attention's past keys) or
    a LoRA parameter is taken with that weight as the delegate's input: XNNPACK packs it on every
    call into its shared workspace instead of once into a copy every loaded adapter keeps (a rank-8
    A packs to twice its bytes: the kernels' tile is 16 rows). ``hoisted`` LoRA parameters (read from
    adapters_shared.ptd) stay the delegate's weights, named by their sha256 like the foundation's."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class InputWeightLinearConfig(LinearConfig):
        def _get_weight_deps(self, node, ep, precision):
            weight = node.args[1]
            param = ep.graph_signature.inputs_to_parameters.get(weight.name, "")
            if weight.op == "placeholder" and (weight.name in ep.graph_signature.user_inputs or (
                    is_adapter_tensor(param) and param not in hoisted)):
                return True, []
            return super()._get_weight_deps(node, ep, precision)

    configs = [InputWeightLinearConfig if c is LinearConfig else c for c in ALL_PARTITIONER_CONFIGS]
    return XnnpackPartitioner(configs=configs)


def export_program(model: LlamaLoRA, workdir: Path, named_data: dict[str, tuple[bytes, str | None]] | None = None,
                   external: bool = True, shared: frozenset[str] = frozenset()) -> Exported:
    """torch.export → XNNPACK → ExecuTorch; returns the .pte bytes and the foundation .ptd bytes.

    ``named_data`` adds blobs: key -> (bytes, FOUNDATION_TAG for the .ptd or None for the .pte).
    ``shared`` names LoRA parameters (``model.lora_param_name``) to keep out of the .pte, in
    the data file adapters_shared.ptd (``shared_ptd``).
    ``external=False`` tags nothing: a stand-alone .pte with every weight inside (``ptd`` is
    empty; the benchmark's baseline). Give it no FOUNDATION_TAG blobs and no ``shared``.
    """
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted
    from torch.export import Dim

    t0 = time.perf_counter()
    args = model.args
    # One forward call takes at most a prefill chunk of tokens: activations are planned for
    # chunk x context, not context x context (the runners feed longer prompts chunk by chunk).
    # The cache prefix (the sink row and the positions before this call) is a dynamic size of its
    # own, up to the whole context.
    past = Dim("past", min=1, max=args.max_seq_len)
    dynamic = ({1: Dim("seq", min=1, max=args.chunk)}, tuple({0: past} for _ in range(n_slabs(args))))
    example = example_inputs(args)
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
        # The unlifted module's forward takes the slabs one by one, not as *slabs.
        flat = (dynamic[0], *dynamic[1])
        ep = torch.export.export(unlifted, example, dynamic_shapes=flat, strict=False)
        edge = to_edge_transform_and_lower(
            ep,
            transform_passes=[_tag_quantized_weights] if quantized and external else None,
            partitioner=[_partitioner(frozenset(shared))],
            constant_methods={"get_max_seq_len": args.max_seq_len, "get_vocab_size": args.vocab_size,
                              "get_prefill_chunk": args.chunk},
        )
        for key, (data, tag) in (named_data or {}).items():
            edge._named_data_store.add_named_data(key, data, alignment=16, external_tag=tag)
        program = edge.to_executorch(
            # alloc_graph_input=False: inputs get no planned memory, so the runtime hands forward
            # its KV cache where it lies instead of copying every slab's prefix in on every call.
            ExecutorchBackendConfig(external_constants=tagger if external else False,
                                    do_quant_fusion_and_const_prop=fuse_quant,
                                    memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False)))
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
