"""``lora_share::attend`` (model/decode_attention.py) and the decode method that calls it.

References: the model's own attention (XNNPACK's products in forward, run eagerly) for the decode
method's eager form, and ``attend_reference`` (plain PyTorch in float32) for the C++ kernel, which runs
here through ExecuTorch's Python runtime in a one-operator program. The runner's decode against the
eager model is checked by every runner test that generates (test_cpp_runner, test_kv_half,
test_families: float32, float16 and ring caches).
"""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch
from conftest import REPO

from lora_share.model.decode_attention import attend, attend_reference, rope_attend, rope_attend_reference
from lora_share.model.decoder import LlamaLoRA, ModelArgs

LLAMA = ModelArgs(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128, vocab_size=256, max_seq_len=48, prefill_chunk=8
)
GEMMA3 = dataclasses.replace(
    LLAMA,
    model_type="gemma3",
    head_dim=32,
    norm_offset=1.0,
    sandwich_norms=True,
    activation="gelu_pytorch_tanh",
    attn_scale=0.2,
    sliding_window=6,
    sliding_layers=(0,),
    local_rope_theta=10000.0,
    n_layers=3,
)
CASES = {
    "llama": LLAMA,
    "llama-kv-float16": dataclasses.replace(LLAMA, kv_dtype="float16"),
    "gemma3-ring": GEMMA3,
    "mha": dataclasses.replace(LLAMA, n_kv_heads=4),
}


def random_model(args: ModelArgs) -> LlamaLoRA:
    torch.manual_seed(0)
    model = LlamaLoRA(args)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model.eval()


@pytest.mark.parametrize("case", CASES)
def test_decode_method_computes_what_forward_does(case):
    """Decode, eagerly (attend_reference per layer), against forward, one token at a time past a prompt
    fed in chunks, through a sliding window's ring and past it: the same logits."""
    args = CASES[case]
    forward, decode = random_model(args), random_model(args)
    prompt, tol = [(5 * i + 3) % args.vocab_size for i in range(11)], 2e-2 if args.kv_dtype == "float16" else 1e-5
    with torch.no_grad():
        for m in (forward, decode):
            m.reset_cache()
            for p in range(0, len(prompt), args.chunk):
                m.step(prompt[p : p + args.chunk], p)
        token = prompt[-1]
        for pos in range(len(prompt), len(prompt) + 20):
            want = forward.step([token], pos)
            with decode.decoding():
                got = decode.step([token], pos)
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            token = int(want.argmax())


def test_decoding_is_undone_after_an_error():
    model = random_model(LLAMA)
    with pytest.raises(RuntimeError), model.decoding():
        raise RuntimeError("stop")
    assert model.fused_attention is False


class OneCall(torch.nn.Module):
    """A program of one lora_share::attend call over ``heads`` key/value heads."""

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, q, k_new, v_new, bias, *slabs):
        return attend(q, k_new, v_new, bias, slabs[: self.heads], slabs[self.heads :])


@pytest.fixture(scope="module")
def kernel_runtime(runner_bin):
    """ExecuTorch's Python runtime with liblora_share's kernels registered (the library registers
    lora_share::attend.out when it loads; the runtime shares its operator registry)."""
    from executorch.runtime import Runtime

    ctypes.CDLL(str(REPO / "build" / "liblora_share.so"), mode=ctypes.RTLD_GLOBAL)
    return Runtime.get()


def program_of(module: torch.nn.Module, example: tuple, dynamic_shapes=None) -> bytes:
    """``module`` exported, to edge and to an ExecuTorch program (no delegate: its custom op runs as is)."""
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(module, example, strict=False, dynamic_shapes=dynamic_shapes)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch().buffer


def one_call_program(heads: int, rows: int, new: int, hd: int, dtype: torch.dtype, max_past: int) -> bytes:
    from torch.export import Dim

    past = Dim("past", min=1, max=max_past)
    example = inputs(heads, rows, new, hd, 5, dtype, torch.Generator().manual_seed(0))
    return program_of(OneCall(heads), example, (None, None, None, {2: past + new}, ({0: past},) * (2 * heads)))


def inputs(heads, rows, new, hd, past, dtype, gen, window: int | None = None):
    """Random queries, keys and values; a causal mask over ``past`` cached and ``new`` fresh keys, for
    ``rows`` query rows (``rows // new`` query heads per key/value head), optionally a sliding window."""

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.5).to(dtype)

    rep = rows // new
    query = (torch.arange(new) + past).repeat(rep).unsqueeze(1)  # each row's position
    key = torch.cat([torch.arange(past) - 1, torch.arange(new) + past]).unsqueeze(0)  # slot 0: the sink
    hidden = (key > query) | (key < 0)
    if window is not None:
        hidden |= key <= query - window
    bias = torch.zeros(hidden.shape).masked_fill(hidden, float("-inf")).unsqueeze(0).to(dtype)
    return (
        rand(heads, rows, hd),
        rand(heads, new, hd),
        rand(heads, new, hd),
        bias,
        *(rand(past, hd) for _ in range(2 * heads)),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("heads,rows,new,hd", [(2, 2, 1, 64), (3, 3, 1, 64), (1, 4, 2, 40), (2, 1, 1, 256)])
def test_kernel_matches_the_reference(kernel_runtime, heads, rows, new, hd, dtype):
    """The C++ kernel, at pasts from one row to past the threads' split, with and without a window."""
    program = kernel_runtime.load_program(one_call_program(heads, rows, new, hd, dtype, 1500))
    method = program.load_method("forward")
    gen = torch.Generator().manual_seed(1)
    for past, window in ((1, None), (2, None), (33, None), (200, 17), (1500, None), (1024, 300)):
        args = inputs(heads, rows, new, hd, past, dtype, gen, window)
        got = method.execute(list(args))[0]
        want = attend_reference(*args[:4], args[4 : 4 + heads], args[4 + heads :])
        assert got.dtype == dtype and got.shape == want.shape
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol, msg=f"past {past}")


class RopeOneCall(torch.nn.Module):
    """A program of one lora_share::rope_attend call over ``heads`` key/value heads."""

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, q, k, v, cos_q, sin_q, cos_k, sin_k, bias, *slabs):
        return rope_attend(q, k, v, (cos_q, sin_q), (cos_k, sin_k), bias, slabs[: self.heads], slabs[self.heads :])


def rope_inputs(heads, rep, hd, past, dtype, gen, window: int | None = None):
    """One token's float32 q, k, v and rotations; a float32 or float16 cache of ``past`` rows."""
    _, _, _, bias, *slabs = inputs(heads, rep, 1, hd, past, dtype, gen, window)
    angle = torch.rand(hd // 2, generator=gen) * 6.0
    cos, sin = torch.cat([angle.cos()] * 2).view(1, 1, hd), torch.cat([angle.sin()] * 2).view(1, 1, hd)
    scale = hd**-0.5
    q, k, v = (torch.randn(1, 1, n * hd, generator=gen) for n in (heads * rep, heads, heads))
    return (q, k, v, cos * scale, sin * scale, cos, sin, bias, *slabs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("heads,rep,hd", [(3, 3, 64), (1, 4, 40), (2, 1, 256)])
def test_rope_attend_kernel_matches_the_reference(kernel_runtime, heads, rep, hd, dtype):
    """The decode method's operator: this token's keys and values bit for bit (the same roundings as
    the reference's float32 ops), its output as attend's."""
    from torch.export import Dim

    past = Dim("past", min=1, max=1500)
    example = rope_inputs(heads, rep, hd, 5, dtype, torch.Generator().manual_seed(0))
    buffer = program_of(RopeOneCall(heads), example, (None,) * 7 + ({2: past + 1}, ({0: past},) * (2 * heads)))
    method = kernel_runtime.load_program(buffer).load_method("forward")
    gen = torch.Generator().manual_seed(3)
    for past_rows, window in ((1, None), (40, None), (700, 100), (1500, None)):
        args = rope_inputs(heads, rep, hd, past_rows, dtype, gen, window)
        got = method.execute(list(args))
        want = rope_attend_reference(*args[:8], args[8 : 8 + heads], args[8 + heads :])
        assert [g.dtype for g in got] == [torch.float32, dtype, dtype]
        assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), f"past {past_rows}"
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(got[0], want[0], atol=tol, rtol=tol, msg=f"past {past_rows}")


def test_rope_attend_refuses_mismatched_inputs(kernel_runtime):
    """A cos of another head size than the cache's: an error from the kernel, not a wrong read."""
    example = rope_inputs(2, 2, 64, 5, torch.float32, torch.Generator().manual_seed(4))
    method = kernel_runtime.load_program(program_of(RopeOneCall(2), example)).load_method("forward")
    args = list(example)
    args[3] = args[3][..., :32].contiguous()  # cos_q of half the head size
    with pytest.raises(RuntimeError):
        method.execute(args)


def test_kernel_refuses_mismatched_inputs(kernel_runtime):
    """Keys of another length than the bias says: an error from the kernel, not a wrong read."""
    program = kernel_runtime.load_program(one_call_program(2, 2, 1, 64, torch.float32, 64))
    method = program.load_method("forward")
    args = list(inputs(2, 2, 1, 64, 10, torch.float32, torch.Generator().manual_seed(2)))
    args[4] = args[4][:9]  # head 0's keys one row short
    with pytest.raises(RuntimeError):
        method.execute(args)


def test_the_program_decodes_with_one_call_per_layer(tiny_build):
    """A built program has both methods, with the same inputs; decode calls the kernel once per layer
    (prefill's forward never does)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(tiny_build.ptes["tiny_a"].read_bytes())
    plans = {p.name: p for p in getattr(program, "program", program).execution_plan}

    def calls(plan) -> int:
        ops = [
            plan.operators[i.instr_args.op_index].name
            for i in plan.chains[0].instructions
            if type(i.instr_args).__name__ == "KernelCall"
        ]
        return ops.count("lora_share::rope_attend")

    layers = tiny_build.manifest["foundation"]["args"]["n_layers"]
    assert (calls(plans["decode"]), calls(plans["forward"])) == (layers, 0)
    assert len(plans["decode"].inputs) == len(plans["forward"].inputs)


# portable (~15 s; the loops aarch64 runs) is in `make test`, not in the edit loop.
@pytest.mark.parametrize("isa", ["avx2", pytest.param("portable", marks=pytest.mark.slow)])
def test_every_instruction_set_path_matches_the_reference(runner_bin, isa):
    """The kernel's other inner loops (an x86 without AVX-512; ``portable`` is what aarch64 runs),
    forced by LORA_SHARE_ATTEND_ISA, through the reference test in a process of their own (the
    library picks its loops once, when it loads)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LORA_SHARE_ATTEND_ISA": isa}
    chosen = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "lib.ls_diag_attend_isa.restype = ctypes.c_char_p; print(lib.ls_diag_attend_isa().decode())",
            str(REPO / "build" / "liblora_share.so"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert chosen.stdout.strip() == isa, (chosen.stdout, chosen.stderr)  # the forced loops are the ones run
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            "kernel_matches_the_reference",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-2000:]


def test_decode_names_no_tensor_it_does_not_read(tiny_build):
    """torch.export lifts every buffer, read or not; the decode method reads no ``rotate_half``
    (rope_attend rotates on its own), so the program must not name it: a named, unread tensor is
    still written to foundation.ptd and loaded with the method. Every foundation tensor decode names,
    forward names too (same weights)."""
    from lora_share.inference.inspection import inspect_file

    report = inspect_file(tiny_build.ptes["tiny_a"])
    named = {}
    for t in report["external_tensors"]:
        named.setdefault(t["plan"], set()).add(t["key"])
    assert not {k for k in named["decode"] if "rotate_half" in k}
    assert named["decode"] <= named["forward"] | {k for k in named["decode"] if k.startswith("_prop_tensor_constant")}


def test_unread_constants_are_dropped_from_an_export():
    """``_without_unread_constants`` on a module with a read and an unread buffer and parameter."""
    from lora_share.export.program import _without_unread_constants

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Parameter(torch.ones(3))
            self.unused = torch.nn.Parameter(torch.ones(3))
            self.register_buffer("kept", torch.full((3,), 2.0))
            self.register_buffer("dropped", torch.zeros(3), persistent=False)

        def forward(self, x):
            return x * self.used + self.kept

    ep = _without_unread_constants(torch.export.export(Module(), (torch.ones(3),), strict=False))
    assert [s.target for s in ep.graph_signature.input_specs] == ["used", "kept", None]  # None: x
    assert list(ep.state_dict) == ["used", "kept"] and not ep.constants
    assert torch.equal(ep.module()(torch.ones(3)), torch.full((3,), 3.0))
