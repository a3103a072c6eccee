"""Keep an export's time to the work a lora-share program needs.

Lowering with ExecuTorch 1.5.1 (the version pinned in pyproject.toml) spends most of an export
re-tracing the graph with symbolic shapes, once per pass, at a cost that grows with every layer
(SmolLM2-135M's 30 layers took 507 s). Two kinds of those re-tracings do nothing for our graphs:

- XNNPACK's partitioner asks for decomposition in two rounds so that it can re-check each op it
  keeps whole (linear, ...) after the first; when every such op of the graph already passes its
  check, the second round changes nothing. ``OneDecomposition`` runs that check up front and,
  when it holds, lets ExecuTorch take its single-round path; otherwise both rounds run as shipped.
- XNNPACK's preprocess runs seventeen passes over every delegated partition (a layer of ours
  has about six), each a full re-trace, though twelve of them rewrite what no lora-share graph
  has: convolutions, batch norm, upsampling, PReLU, padding, max-pooling, the channels-last
  layout those need, the fused scaled-dot-product attention pattern (our attention is explicit
  bmm and softmax), activations fused into a linear (ours are silu and gelu), back-to-back
  copies, ops on constants alone. ``lean_lowering`` skips those. (It keeps the pass that splits
  a concatenation of more inputs than XNNPACK takes: attention joins one block of scores per
  key/value head, eight at Llama-3.2-1B's shape.)

And one cost is quadratic: after cutting out each partition ExecuTorch re-sorts the whole program
by copying it (``_sort_in_place`` gives the same order without the copy).

All three give the same program, byte for byte, as ExecuTorch's lowering as shipped: tests/test_export_speed.py
exports each family and precision both ways and compares the bytes.
"""

from __future__ import annotations

import contextlib

# XNNPACK delegate passes (executorch.backends.xnnpack._passes) that find nothing to rewrite in the
# graphs lora-share's model (model/decoder.py) gives, in every family and precision (tests/test_export_speed.py).
SKIPPED_XNNPACK_PASSES = frozenset(
    {
        "ConvertToUpsampleBilinear2d",  # upsampling
        "FuseBatchNormPass",  # batch norm after a convolution or linear
        "DecomposeBatchNorm",  # batch norm alone
        "Conv1dUnsqueezePass",  # 1-d convolutions
        "PReLUReshapePass",  # PReLU
        "InsertPadQDQPass",  # quantized padding
        "RemoveGetItemPass",  # max-pooling's (values, indices)
        "ChannelsLastTaggedReshapePass",  # the NHWC layout convolutions and pooling run in
        "ConvertToSDPAPass",  # the fused attention pattern; ours is bmm, softmax, bmm
        "FuseActivationPass",  # relu / hardtanh after a linear: our activations are silu and gelu
        "RemoveRedundantCopyPass",  # back-to-back copies
        "ConstPropPass",  # ops on constants alone
    }
)


class OneDecomposition:
    """Mixin for XNNPACK's partitioner: one round of decomposition when no kept op needs the second.

    ExecuTorch takes its single-round path when ``ops_to_not_decompose`` gives no per-node check;
    this gives none when every kept op the graph holds passes the check. (Shipped, the check also
    sees kept ops that the first round creates from others; lora-share's model has none such,
    which the byte comparison in the tests confirms.)
    """

    def ops_to_not_decompose(self, ep):
        ops, check = super().ops_to_not_decompose(ep)
        if check is not None:
            kept = set(ops)
            if all(check(node) for node in ep.graph.nodes if node.op == "call_function" and node.target in kept):
                return ops, None
        return ops, check


def _sort_in_place(gm):
    """torch.fx's ``legalize_graph`` without its copy: the same order, the nodes moved where they are.

    ExecuTorch sorts the whole program after cutting out each delegated partition (about six a
    layer), and ``legalize_graph`` copies every node into a new graph and recompiles the module's
    Python code each time: quadratic in the layers (about a minute of SmolLM2-135M's export). This
    computes legalize_graph's order (Kahn's algorithm, its queue, the same prioritized ops first) and
    moves the nodes into it; the code is regenerated once, when the lowered program is built.
    """
    import collections
    import operator

    import torch

    prioritized = {
        operator.add,
        operator.mul,
        operator.sub,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.le,
        operator.lt,
        operator.ge,
        operator.gt,
        operator.eq,
        operator.ne,
        torch.ops.aten.sym_constrain_range.default,
        torch.ops.aten.sym_constrain_range_for_size.default,
        torch.ops.aten._assert_async.msg,
        torch.ops.aten.scalar_tensor.default,
        torch.ops.aten._assert_scalar.default,
    }
    nodes = list(gm.graph.nodes)
    indeg = dict.fromkeys(nodes, 0)
    for node in nodes:
        for user in node.users:
            indeg[user] += 1
    queue = collections.deque(node for node in nodes if indeg[node] == 0)
    order = []
    while queue:
        cur = queue.popleft()
        order.append(cur)
        for user in cur.users:
            indeg[user] -= 1
            if indeg[user] == 0:
                if user.op == "call_function" and user.target in prioritized:
                    queue.appendleft(user)
                else:
                    queue.append(user)
    if len(order) < len(nodes):
        raise RuntimeError(f"the graph has cycles: {[n for n in nodes if indeg[n] != 0]}")
    cursor = gm.graph._root
    for node in order:
        if node.prev is not cursor:
            cursor.append(node)
        cursor = node
    # A copy lists each node's users in the order they were created, the sorted order: the next sort
    # walks them in that order, so keep it.
    position = {node: i for i, node in enumerate(order)}
    for node in order:
        users = sorted(node.users, key=position.__getitem__)
        if list(node.users) != users:
            node.users.clear()
            node.users.update(dict.fromkeys(users))
    return gm


@contextlib.contextmanager
def lean_lowering():
    """Within the block, XNNPACK's preprocess runs its passes less ``SKIPPED_XNNPACK_PASSES``, and
    ExecuTorch sorts the program after each partition in place (``_sort_in_place``)."""
    import executorch.exir.lowered_backend_module as lowered
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    init, legalize = XNNPACKPassManager.__init__, lowered.legalize_graph

    def lean_init(self, exported_program, passes=None):
        init(self, exported_program, passes)
        self.passes = [p for p in self.passes if p.__name__ not in SKIPPED_XNNPACK_PASSES]

    XNNPACKPassManager.__init__, lowered.legalize_graph = lean_init, _sort_in_place
    try:
        yield
    finally:
        XNNPACKPassManager.__init__, lowered.legalize_graph = init, legalize
