"""Ops XNNPACK runs that ExecuTorch 1.5.1's partitioner leaves outside it at our dynamic shapes.

Every op the partitioner refuses runs on ExecuTorch's portable kernels and cuts the delegate in
two: one more delegate call per token, each re-shaping its XNNPACK runtime for the call's sizes.
At the model's dynamic sizes (tokens per call, slab rows: model/decoder.py) it refuses three kinds that
XNNPACK itself takes, and lora-share's lowering hands them over:

- a view whose new shape has a symbolic size: XNNPACK's reshape infers one size (its 0, PyTorch's
  -1); ``inferred_views`` writes the one symbolic size as -1, which ExecuTorch's reshape serializer
  already passes on as 0 (its partitioner accepts one inferred size). A view of a graph input stays
  outside: there it costs nothing (``et_view``), inside XNNPACK it would copy the input.
- a static slice (constant bounds on one dimension) of a tensor with a dynamic size elsewhere:
  XNNPACK's static slice reads an offset of 0 with a size of 0 as that whole dimension, whatever
  its size at run time (``SliceConfig``, ``SliceVisitor``);
- a float32 <-> float16 cast (XNNPACK's convert node; ``CastConfig``, ``CastVisitor``): attention
  over a float16 KV cache (``foundation.kv_cache``) casts this call's queries, keys and values in
  and its output back, never the cache.

A decoder layer was about six delegate calls with views and slices between them; with these it is
two (the slices of attention's probabilities at the dynamic slab length stay outside). Each kind is
exact: the float32 programs give the same logits bit for bit (tests/test_xnnpack_ops.py).
"""

from __future__ import annotations

import contextlib
from typing import cast

import torch

SLICE_TARGET = "aten.slice_copy.Tensor"
COPY_TARGET = "aten._to_copy.default"


def inferred_views(gm: torch.fx.GraphModule):
    """Edge pass (before partitioning): a view_copy with exactly one symbolic size gets -1 there."""
    from executorch.exir.pass_base import PassResult

    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or "view_copy" not in str(node.target) or node.args[0].op == "placeholder":
            continue
        shape = list(node.args[1])
        symbolic = [i for i, size in enumerate(shape) if not isinstance(size, int)]
        if len(symbolic) == 1 and -1 not in shape:
            shape[symbolic[0]] = -1
            node.args = (node.args[0], shape)
            changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return PassResult(gm, changed)


def static_slice(node: torch.fx.Node) -> tuple[int, int, int] | None:
    """(dimension, start, length) of a slice_copy with constant bounds within a constant-sized
    dimension, stride 1; None for any other."""
    val = node.args[0].meta["val"]
    dim = cast(int, node.args[1]) % val.dim()
    size = val.shape[dim]
    start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
    end = node.args[3] if len(node.args) > 3 and node.args[3] is not None else size
    stride = node.args[4] if len(node.args) > 4 else 1
    if not all(isinstance(v, int) for v in (size, start, end)) or stride != 1:
        return None
    start, end = start + size if start < 0 else start, min(end + size if end < 0 else end, size)
    return (dim, start, end - start) if 0 <= start < end else None


def partitioner_configs(configs: list) -> list:
    """XNNPACK's partitioner configs with the slice and copy configs replaced by ours."""
    from executorch.backends.xnnpack.partition.config.generic_node_configs import SliceCopyConfig, ToDimOrderCopyConfig

    class SliceConfig(SliceCopyConfig):
        """A static slice, whatever the other dimensions' sizes."""

        def check_constraints(self, node, ep) -> bool:
            return (
                self.check_common_constraints(node, ep)
                and "XNN_NHWC_NODE" not in node.meta
                and static_slice(node) is not None
            )

    class CastConfig(ToDimOrderCopyConfig):
        """A copy that keeps the dim order and casts float32 <-> float16 (or keeps the dtype)."""

        def check_constraints(self, node, ep) -> bool:
            if not self.check_common_constraints(node, ep):
                return False
            dtypes = {node.args[0].meta["val"].dtype, node.meta["val"].dtype}
            order = node.kwargs.get("dim_order")
            return (len(dtypes) == 1 or dtypes == {torch.float32, torch.float16}) and (
                order is None or list(order) == list(range(node.meta["val"].dim()))
            )

    ours = {SliceCopyConfig: SliceConfig, ToDimOrderCopyConfig: CastConfig}
    return [ours.get(c, c) for c in configs]


@contextlib.contextmanager
def xnnpack_visitors():
    """Within the block, XNNPACK's serializer writes our slices and casts (``partitioner_configs``)."""
    from executorch.backends.xnnpack.operators import node_visitor as nv
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import XNNConvert, XNNStaticSlice, XNode

    registry = nv._node_visitor_dict
    shipped = {SLICE_TARGET: registry[SLICE_TARGET], COPY_TARGET: registry[COPY_TARGET]}

    class SliceVisitor(nv.NodeVisitor):
        target = SLICE_TARGET

        def define_node(self, node, xnn_graph, vals_to_ids, debug_handle) -> None:
            self.define_nodes_tensor_inputs_outputs(node, xnn_graph, vals_to_ids)
            dim, start, length = static_slice(node)
            n = node.args[0].meta["val"].dim()
            offsets, sizes = [0] * n, [0] * n  # size 0 at offset 0: the whole dimension, as it is at run time
            offsets[dim], sizes[dim] = start, length
            xnn_graph.xnodes.append(
                XNode(
                    xnode_union=XNNStaticSlice(
                        num_dims=n,
                        offsets=offsets,
                        sizes=sizes,
                        input_id=vals_to_ids[node.args[0]],
                        output_id=vals_to_ids[node],
                        flags=0,
                    ),
                    debug_handle=debug_handle,
                )
            )

    class CastVisitor(nv.NodeVisitor):
        target = COPY_TARGET

        def __init__(self, *args) -> None:
            super().__init__(*args)
            self.memory_format = shipped[COPY_TARGET](*args)  # a copy that keeps the dtype, as shipped

        def define_node(self, node, xnn_graph, vals_to_ids, debug_handle) -> None:
            if node.args[0].meta["val"].dtype == node.meta["val"].dtype:
                return self.memory_format.define_node(node, xnn_graph, vals_to_ids, debug_handle)
            self.define_nodes_tensor_inputs_outputs(node, xnn_graph, vals_to_ids)
            xnn_graph.xnodes.append(
                XNode(
                    xnode_union=XNNConvert(input_id=vals_to_ids[node.args[0]], output_id=vals_to_ids[node], flags=0),
                    debug_handle=debug_handle,
                )
            )

    registry.update({SLICE_TARGET: SliceVisitor, COPY_TARGET: CastVisitor})
    try:
        yield
    finally:
        registry.update(shipped)
