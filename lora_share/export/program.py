"""Export a deployment's program over the foundation: an XNNPACK-lowered .pte + foundation .ptd.

The program is the model with its envelope's LoRA slots as forward inputs (model/decoder.py,
model/envelope.py): it holds no adapter's weights, so one export serves every adapter inside the
envelope. Every constant it has is the foundation's, tagged for the external data file
``foundation.ptd`` (weights XNNPACK consumes through the delegate's constant tag, the rest
through ``ExecutorchBackendConfig(external_constants=...)``). Only standard ATen ops are used,
so the program runs on the stand-alone C++ runtime.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..model.decoder import (
    MAX_DRAFTS,
    KVCache,
    KVPools,
    LlamaLoRA,
    ModelArgs,
    forward_inputs,
    ring_size,
    ring_window,
    rows_inputs,
    slab_rows,
)
from ..model.envelope import Envelope
from ..model.quantize import is_quantized
from .memory import compact_dependencies, sharing_weights
from .revision import FOUNDATION_TAG
from .speed import OneDecomposition, lean_lowering
from .xnnpack_ops import inferred_views, partitioner_configs, xnnpack_visitors


def example_inputs(args: ModelArgs, envelope: Envelope, tokens: int = 3) -> tuple[torch.Tensor, ...]:
    """forward's example inputs for torch.export: a few tokens (``tokens``, at most a chunk) after four
    earlier positions, the slabs' views exactly the past (so that the two dynamic sizes, tokens and
    slab rows, differ and are not taken to be one), and the envelope's LoRA inputs."""
    return forward_inputs(
        range(1, min(tokens, args.chunk) + 1), 4, KVCache.for_model(args), envelope.example_inputs(args), block=1
    )


# The batch method's most rows, tokens per row (a row's last token and up to MAX_DRAFTS drafts) and KV
# slots (dynamic sizes; a runtime's --parallel stays within them). Its activations are planned for the
# most rows x tokens (SmolLM2-135M's logits alone: 28 MiB at 16 x 9), so rows are capped lower than
# slots, which are inputs and cost no planned memory.
MAX_BATCH_ROWS = 16
MAX_ROW_TOKENS = MAX_DRAFTS + 1
MAX_SLOTS = 64


def example_rows_inputs(args: ModelArgs, envelope: Envelope) -> tuple[torch.Tensor, ...]:
    """decode_batch's example inputs: two rows of three tokens (so that neither size is taken to be one,
    nor the two one size) at different positions in two of three slots, rank-2 LoRA rows as
    ``example_inputs``."""
    lora = [t.unsqueeze(0).expand(2, -1, -1).contiguous() for t in envelope.example_inputs(args)]
    return rows_inputs([[1, 2, 3], [4, 5, 6]], [3, 5], [2, 0], KVPools(args, 3), lora)


def constant_methods(args: ModelArgs) -> dict[str, int]:
    """The program's constant methods: what a runtime needs besides forward's inputs. A program whose
    sliding layers keep a ring (model.ring_size) also has ``get_ring_size``, M: its ring slabs are the
    inputs of M + 1 rows, and a runtime writes position p at row 1 + p % M of them; and
    ``get_sliding_window``, W (what the rings cover; a program exported before the rings' spare slots,
    EXPORTER_REVISION 13 and earlier, has only this, and M = W). Without them (every other program),
    every slab covers the context."""
    methods = {"get_max_seq_len": args.max_seq_len, "get_vocab_size": args.vocab_size, "get_prefill_chunk": args.chunk}
    if ring_size(args):
        methods["get_sliding_window"] = ring_window(args)
        methods["get_ring_size"] = ring_size(args)
    return methods


def _foundation_tag(node: torch.fx.Node) -> str | None:
    """Every constant of a program is the foundation's (LoRA weights are inputs, not constants), but for
    the scalars constant propagation makes (a quantized embedding's build): each method numbers its own
    ``_prop_tensor_constantN`` from 0, so in foundation.ptd, one namespace for all methods, decode's and
    decode_batch's would take each other's bytes under one name (ExecuTorch then refuses to load the
    method: a dtype or dims mismatch). Those stay in the method's own program."""
    return None if node.name.startswith("_prop_tensor_constant") else FOUNDATION_TAG


def _tag_foundation_constants(user_inputs: set[str]):
    """Edge pass (before partitioning): send every weight XNNPACK consumes to foundation.ptd.

    XNNPACK's serializer reads the external tag of a weight from its placeholder's
    ``custom.delegate_constant_tag``, and of a quantized weight (and its scales) from the
    dequantize node it feeds, so tag both. ``user_inputs`` (the graph signature's: tokens, cache
    slabs, LoRA weights) are not constants and keep no tag.
    """
    from executorch.exir.pass_base import PassResult

    def tag(gm: torch.fx.GraphModule):
        for node in gm.graph.nodes:
            if node.op != "placeholder" or node.name in user_inputs:
                continue
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = FOUNDATION_TAG
            for user in node.users:
                if user.op == "call_function" and "dequantize" in str(user.target) and user.args[0] is node:
                    user.meta.setdefault("custom", {})["delegate_constant_tag"] = FOUNDATION_TAG
        return PassResult(gm, True)

    return tag


def _embedding_output_float32(gm: torch.fx.GraphModule):
    """Edge pass: an int4 embedding's dequantize with float16 scales names its float32 output dtype.

    torch.export drops the default ``output_dtype``, and ExecuTorch's quant fusion then picks
    ``embedding_4bit``, whose kernel reads the scales in the output's dtype (float16 read as float32);
    with the dtype named it picks ``embedding_4bit.dtype``, which reads float16 scales into float32 rows.
    """
    from executorch.exir.pass_base import PassResult

    changed = False
    for node in gm.graph.nodes:
        if (
            node.op == "call_function"
            and "dequantize_affine" in str(node.target)
            and len(node.args) == 7
            and node.args[2].meta["val"].dtype == torch.float16
            and any("embedding" in str(u.target) for u in node.users)
        ):
            node.args = (*node.args, torch.float32)
            changed = True
    if changed:
        gm.recompile()
    return PassResult(gm, changed)


@dataclass
class Exported:
    pte: bytes
    ptd: Path | None  # foundation.ptd as written (None when the program holds its weights itself)
    seconds: float


def _partitioner(lean: bool):
    """XNNPACK's partitioner, where a linear whose weight is a graph input (attention's past keys,
    LoRA A and B) is taken with that weight as the delegate's input: XNNPACK packs it on every
    call into its one shared workspace instead of once per program. ``lean``: one round of
    decomposition where the second would change nothing (export/speed.py)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class InputWeightLinearConfig(LinearConfig):
        def _get_weight_deps(self, node, ep, precision):
            weight = node.args[1]
            if weight.op == "placeholder" and weight.name in ep.graph_signature.user_inputs:
                return True, []
            return super()._get_weight_deps(node, ep, precision)

    configs = partitioner_configs(
        [InputWeightLinearConfig if c is LinearConfig else c for c in ALL_PARTITIONER_CONFIGS]
    )

    class LeanXnnpackPartitioner(OneDecomposition, XnnpackPartitioner):
        pass

    return (LeanXnnpackPartitioner if lean else XnnpackPartitioner)(configs=configs)


def export_program(
    model: LlamaLoRA,
    envelope: Envelope,
    workdir: Path,
    named_data: dict[str, bytes] | None = None,
    external: bool = True,
    lean: bool = True,
    batch: bool = False,
) -> Exported:
    """torch.export → XNNPACK → ExecuTorch: the .pte bytes, and foundation.ptd written into ``workdir``.

    ``model`` takes LoRA on ``envelope``'s slots (``LlamaLoRA(args, envelope.slots)``).
    ``named_data`` adds blobs to foundation.ptd (its record). ``external=False`` tags nothing:
    a stand-alone .pte with every foundation weight inside and no .ptd (the benchmark's baseline).
    ``lean=False`` lowers exactly as ExecuTorch ships, skipping no re-tracing (export/speed.py) and
    with the partitioner's own dependency sets (export/memory.py): the reference the lean lowering's
    bytes are tested against. ``batch`` adds the ``decode_batch`` method (docs/batching.md): 1..MAX_ROW_TOKENS
    tokens for each of 1..MAX_BATCH_ROWS rows, each its own position, KV slot and LoRA, same weights.
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from torch.export import Dim

    if tuple(model.lora_slots) != envelope.slots:
        raise ValueError("the model's LoRA slots are not the envelope's")
    t0 = time.perf_counter()
    args = model.args
    # One forward call takes at most a prefill chunk of tokens: activations are planned for
    # chunk x context, not context x context (the runners feed longer prompts chunk by chunk).
    # The slabs' rows (the sink row, the positions before this call, and maybe a few more: model/decoder.py)
    # are a dynamic size of their own, up to the whole context; so is each LoRA slot's rank.
    # A sliding layer's ring (model.ring_window) is its window's size whatever the position.
    past = Dim("past", min=1, max=args.max_seq_len)
    full = args.max_seq_len
    dynamic = (
        {1: Dim("seq", min=1, max=args.chunk)},
        *({0: past} if rows == full else {} for rows in slab_rows(args)),
        *envelope.dynamic_shapes(),
    )
    # Float exports take exactly the float path. An int8 embedding is torchao's dequantize +
    # embedding; ExecuTorch's quant fusion turns that into its quantized embedding_byte kernel.
    fuse_quant = is_quantized(model.model.embed_tokens.weight)
    with torch.no_grad(), warnings.catch_warnings(), _quiet_logs():
        warnings.simplefilter("ignore")
        # forward: 1 to a chunk of tokens, attention by XNNPACK's products (prefill); decode: one token,
        # attention by lora_share::rope_attend (model.LlamaLoRA.decoding). Same inputs and weights.
        programs = {
            "forward": torch.export.export(
                model, example_inputs(args, envelope), dynamic_shapes=(dynamic[0], None, dynamic[1:]), strict=False
            )
        }
        with model.decoding():
            programs["decode"] = _without_unread_constants(
                torch.export.export(
                    model,
                    example_inputs(args, envelope, tokens=1),
                    dynamic_shapes=(None, None, dynamic[1:]),
                    strict=False,
                )
            )
        if batch:
            programs["decode_batch"] = _without_unread_constants(_export_rows(model, envelope))
        ep = programs["forward"]
        user_inputs = {name for p in programs.values() for name in p.graph_signature.user_inputs}
        weights = [*ep.state_dict.values(), *(c for c in ep.constants.values() if isinstance(c, torch.Tensor))]
        with sharing_weights(weights), xnnpack_visitors(), contextlib.ExitStack() as lowering:
            if lean:
                lowering.enter_context(lean_lowering())
                lowering.enter_context(compact_dependencies())
            edge = to_edge_transform_and_lower(
                programs,
                transform_passes=[
                    _embedding_output_float32,
                    inferred_views,
                    *([_tag_foundation_constants(user_inputs)] if external else []),
                ],
                partitioner=[_partitioner(lean)],
                # The graph is ours and passes the edge verifier; skipping it saves ~15% of the export.
                compile_config=EdgeCompileConfig(_check_ir_validity=False),
                constant_methods=constant_methods(args),
            )
            for key, data in (named_data or {}).items():
                edge._named_data_store.add_named_data(key, data, alignment=16, external_tag=FOUNDATION_TAG)
            program = edge.to_executorch(
                # alloc_graph_input=False: inputs get no planned memory, so the runtime hands forward
                # its KV cache and LoRA weights where they lie instead of copying them in on every call.
                ExecutorchBackendConfig(
                    external_constants=_foundation_tag if external else False,
                    do_quant_fusion_and_const_prop=fuse_quant,
                    memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
                )
            )
            workdir.mkdir(parents=True, exist_ok=True)
            program.write_tensor_data_to_file(str(workdir))
            pte = program.buffer
    written = sorted(p.name for p in workdir.iterdir())
    expected = [f"{FOUNDATION_TAG}.ptd"] if external else []
    if written != expected:
        raise RuntimeError(f"export wrote {written}, expected {expected or 'nothing'}")
    return Exported(pte, workdir / f"{FOUNDATION_TAG}.ptd" if external else None, time.perf_counter() - t0)


def _export_rows(model: LlamaLoRA, envelope: Envelope):
    """The decode_batch method traced: the rows, their tokens and the slots are dynamic sizes, and each LoRA
    slot's rank; a pool's rows are fixed (the whole context, or a ring)."""
    from torch.export import Dim

    rows, slots = Dim("rows", min=1, max=MAX_BATCH_ROWS), Dim("slots", min=1, max=MAX_SLOTS)
    tokens = Dim("row_tokens", min=1, max=MAX_ROW_TOKENS)
    pools = [{0: slots} for _ in slab_rows(model.args)]
    with model.batching():
        return torch.export.export(
            model,
            example_rows_inputs(model.args, envelope),
            strict=False,
            dynamic_shapes=({0: rows, 1: tokens}, {0: rows}, ({0: rows}, *pools, *envelope.rows_dynamic_shapes(rows))),
        )


def _without_unread_constants(ep):
    """``ep`` without the parameters, buffers and constants its graph never reads. torch.export lifts
    every buffer of the module, read or not: decode reads no ``rotate_half`` (rope_attend rotates on its
    own), and an unread tensor would still be written to foundation.ptd under its name."""
    from torch.export.graph_signature import InputKind

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    unread = [s for s in ep.graph_signature.input_specs if s.kind in kinds and not placeholders[s.arg.name].users]
    for spec in unread:
        ep.graph_signature.input_specs.remove(spec)
        (ep._state_dict if spec.target in ep.state_dict else ep._constants).pop(spec.target)
        ep.graph.erase_node(placeholders[spec.arg.name])
    ep.graph_module.recompile()
    return ep


class _quiet_logs:
    """ExecuTorch logs every lowering step at INFO; keep the build's own output readable."""

    def __enter__(self):
        self.level = logging.root.level
        logging.root.setLevel(logging.WARNING)

    def __exit__(self, *exc):
        logging.root.setLevel(self.level)
