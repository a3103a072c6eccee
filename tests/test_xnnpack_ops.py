"""xnnpack_ops: views, static slices and float casts inside XNNPACK, against the shipped partitioner.

Each tiny program is exported twice from the same module, with lora-share's ops and with ExecuTorch's
partitioner and serializer as shipped, then run on the same inputs through ExecuTorch's runtime.
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch

from lora_share.export import program as export_module
from lora_share.model.decoder import LlamaLoRA, ModelArgs, n_slabs
from lora_share.model.envelope import Envelope

pytestmark = pytest.mark.slow  # two exports per tiny program

LAYERS = 3


def tiny(kv_dtype: str) -> tuple[LlamaLoRA, Envelope]:
    args = ModelArgs(
        dim=64,
        n_layers=LAYERS,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=128,
        vocab_size=256,
        max_seq_len=32,
        prefill_chunk=8,
        kv_dtype=kv_dtype,
    )
    envelope = Envelope.make(["q_proj", "v_proj"], list(range(LAYERS)), 4)
    model = LlamaLoRA(args, envelope.slots)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones(p.shape) if "norm" in name else torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model, envelope


def export(model, envelope, folder, shipped: bool) -> bytes:
    with contextlib.ExitStack() as stack:
        if shipped:
            from executorch.exir.pass_base import PassResult

            mp = stack.enter_context(pytest.MonkeyPatch.context())
            mp.setattr(export_module, "partitioner_configs", lambda configs: configs)
            mp.setattr(export_module, "inferred_views", lambda gm: PassResult(gm, False))
            mp.setattr(export_module, "xnnpack_visitors", contextlib.nullcontext)
        return export_module.export_program(model, envelope, folder, external=False).pte


def plan_ops(pte: bytes) -> collections.Counter:
    """forward's instructions: delegate calls, and kernels by operator name."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte)
    program = getattr(program, "program", program)
    plan = next(p for p in program.execution_plan if p.name == "forward")
    ops = collections.Counter()
    for instruction in plan.chains[0].instructions:
        args = instruction.instr_args
        kind = type(args).__name__
        ops[plan.operators[args.op_index].name if kind == "KernelCall" else kind] += 1
    return ops


def run(pte: bytes, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    from executorch.runtime import Runtime

    return Runtime.get().load_program(pte).load_method("forward").execute(inputs)


@pytest.fixture(scope="module", params=["float32", "float16"])
def programs(request, tmp_path_factory):
    model, envelope = tiny(request.param)
    folder = tmp_path_factory.mktemp(f"xnnpack_ops_{request.param}")
    return (
        request.param,
        model,
        envelope,
        export(model, envelope, folder / "ours", shipped=False),
        export(model, envelope, folder / "shipped", shipped=True),
    )


def test_fewer_delegate_calls_and_no_views_between(programs):
    kv, _, _, ours, shipped = programs
    mine, theirs = plan_ops(ours), plan_ops(shipped)
    # A layer: one call up to the scores' softmax, one after the probabilities' two slices at the
    # dynamic past length; plus the output head. As shipped, views and slices split it further.
    assert mine["DelegateCall"] <= 2 * LAYERS + 1 < theirs["DelegateCall"]
    assert mine["aten::slice_copy"] == 2 * LAYERS < theirs["aten::slice_copy"]
    if kv == "float16":  # the casts of queries, keys, values and attention's output run inside XNNPACK
        assert mine["dim_order_ops::_to_dim_order_copy"] < theirs["dim_order_ops::_to_dim_order_copy"]


@pytest.mark.parametrize("past", [0, 5, 20])
def test_same_outputs_as_shipped(programs, past):
    """Bit for bit: the ops moved into XNNPACK move or round data exactly as the portable kernels do."""
    _, model, envelope, ours, shipped = programs
    g = torch.Generator().manual_seed(past)
    dtype = model.args.kv_torch_dtype
    slabs = [torch.randn(past + 1, model.args.hd, generator=g).to(dtype) for _ in range(n_slabs(model.args))]
    lora = [t.normal_(generator=g) * 0.1 for t in envelope.example_inputs(model.args)]
    tokens, pos = torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([past])
    a, b = run(ours, [tokens, pos, *slabs, *lora]), run(shipped, [tokens, pos, *slabs, *lora])
    assert len(a) == len(b) == 1 + 2 * LAYERS
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert a[1].dtype == dtype
