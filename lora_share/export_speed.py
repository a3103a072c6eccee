"""Keep an export's time to the work a lora-share program needs.

Lowering with ExecuTorch 1.5.1 (the version pinned in pyproject.toml) spends most of an export
re-tracing the graph with symbolic shapes, once per pass, at a cost that grows with every layer
(SmolLM2-135M's 30 layers took 507 s). Two of those re-tracings do nothing for our graphs:

- XNNPACK's partitioner asks for decomposition in two rounds so that it can re-check each op it
  keeps whole (linear, ...) after the first; when every such op of the graph already passes its
  check, the second round changes nothing. ``OneDecomposition`` runs that check up front and,
  when it holds, lets ExecuTorch take its single-round path; otherwise both rounds run as shipped.
- XNNPACK's preprocess runs seventeen passes over every delegated partition (a layer of ours
  has about seven), each a full re-trace, though nine of them rewrite ops no lora-share graph
  has: convolutions, batch norm, upsampling, PReLU, padding, max-pooling, the channels-last
  layout those need, and the fused scaled-dot-product attention pattern (our attention is
  explicit bmm and softmax). ``lean_xnnpack_passes`` skips those nine.

Both give the same program, byte for byte, as ExecuTorch's lowering as shipped: tests/test_export_speed.py
exports each family and precision both ways and compares the bytes.
"""

from __future__ import annotations

import contextlib

# XNNPACK delegate passes (executorch.backends.xnnpack._passes) that act only on ops lora-share's
# model (model.py) never emits.
SKIPPED_XNNPACK_PASSES = frozenset({
    "ConvertToUpsampleBilinear2d",   # upsampling
    "FuseBatchNormPass",             # batch norm after a convolution or linear
    "DecomposeBatchNorm",            # batch norm alone
    "Conv1dUnsqueezePass",           # 1-d convolutions
    "PReLUReshapePass",              # PReLU
    "InsertPadQDQPass",              # quantized padding
    "RemoveGetItemPass",             # max-pooling's (values, indices)
    "ChannelsLastTaggedReshapePass", # the NHWC layout convolutions and pooling run in
    "ConvertToSDPAPass",             # the fused attention pattern; ours is bmm, softmax, bmm
})


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


@contextlib.contextmanager
def lean_xnnpack_passes():
    """Within the block, XNNPACK's preprocess runs its passes less ``SKIPPED_XNNPACK_PASSES``."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    init = XNNPACKPassManager.__init__

    def lean_init(self, exported_program, passes=None):
        init(self, exported_program, passes)
        self.passes = [p for p in self.passes if p.__name__ not in SKIPPED_XNNPACK_PASSES]

    XNNPACKPassManager.__init__ = lean_init
    try:
        yield
    finally:
        XNNPACKPassManager.__init__ = init
