"""The batch method (docs/batching.md): B rows, each its own adapter (or none), position and KV slot, in one
step. Reference: the same request alone, through forward (its prompt) and decode (one token a call), a
greedy loop per request. Every row of a mixed batch (base and adapters of different ranks and targets,
rows at different positions, joining and leaving) has the same greedy tokens and logits within 1e-4, for
each kind of model (GQA, Qwen3's q/k norms and biases, Gemma 3's sandwich norms and ring caches, a float16
KV cache, an 8da4w foundation): eagerly, and through ExecuTorch's Python runtime with the exported program
(its forward, decode and decode_batch methods, liblora_share's kernels). So do rows that carry drafts (a row's
last token and the tokens guessed after it, verified in one step and accepted greedily), whether the drafts
are right, wrong or partly right, through Gemma 3's window. The C++ engine's rows are held to the one-row C
path bit for bit in tests/test_batch_engine.py and tests/test_families.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass

import pytest
import torch
from conftest import REPO

from lora_share.model.decode_attention import rope_write_attend_rows, rope_write_attend_rows_reference
from lora_share.model.decoder import KVPools, LlamaLoRA, ModelArgs, forward_inputs, rows_inputs
from lora_share.model.envelope import Envelope

pytestmark = pytest.mark.slow  # an export of the batch method per kind of model

LLAMA = ModelArgs(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128, vocab_size=256, max_seq_len=40, prefill_chunk=8
)
CASES = {
    "llama": LLAMA,
    "qwen3": dataclasses.replace(
        LLAMA, model_type="qwen3", qk_norm=True, qkv_bias=True, head_dim=32, tie_embeddings=True
    ),
    "gemma3-ring": dataclasses.replace(
        LLAMA,
        model_type="gemma3",
        head_dim=32,
        norm_offset=1.0,
        sandwich_norms=True,
        activation="gelu_pytorch_tanh",
        attn_scale=0.2,
        sliding_window=6,
        sliding_layers=(0, 2),
        local_rope_theta=10000.0,
        n_layers=3,
        embed_scale=8.0,
    ),
    "kv-float16": dataclasses.replace(LLAMA, kv_dtype="float16", n_kv_heads=4),
    "8da4w": LLAMA,
}
ENVELOPE = Envelope.make(["q_proj", "v_proj", "o_proj", "down_proj"], range(3), max_rank=4)
TOL = 1e-4


@dataclass
class Adapter:
    name: str
    weights: dict  # (layer, target) -> (A [r, in], B [out, r])


@dataclass
class Request:
    adapter: Adapter | None
    prompt: list[int]
    new: int  # greedy tokens
    joins: int  # the batch step at which it arrives


def random_adapter(args: ModelArgs, envelope: Envelope, rank: int, targets, seed: int) -> Adapter:
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer, target in envelope.slots:
        if target in targets:
            out_f, in_f = args.linear_shape(target)
            weights[(layer, target)] = (
                torch.randn(rank, in_f, generator=gen) * 0.3,
                torch.randn(out_f, rank, generator=gen) * 0.3,
            )
    return Adapter(f"r{rank}", weights)


def model_of(case: str) -> tuple[LlamaLoRA, Envelope]:
    args = CASES[case]
    envelope = Envelope.make(ENVELOPE.targets, range(args.n_layers), ENVELOPE.max_rank)
    torch.manual_seed(0)
    model = LlamaLoRA(args, envelope.slots)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    if case == "8da4w":
        from lora_share.config import QuantizeConfig
        from lora_share.model.quantize import quantize_foundation_

        quantize_foundation_(model, QuantizeConfig("8da4w", embedding="int8"))
        model.fuse_projections()
    return model.eval(), envelope


def requests_of(args: ModelArgs, envelope: Envelope) -> list[Request]:
    """Base and three adapters (ranks 1, 2 and 4, on different linears), prompts of 3 to 13 tokens (past the
    chunk and Gemma 3's window), one joining late and one leaving early."""

    def prompt(n, seed):
        return [(seed * 31 + 7 * i) % args.vocab_size for i in range(n)]

    return [
        Request(None, prompt(5, 1), 10, 0),
        Request(random_adapter(args, envelope, 2, ("q_proj", "v_proj"), 1), prompt(13, 2), 9, 0),
        Request(random_adapter(args, envelope, 4, envelope.targets, 2), prompt(3, 3), 8, 3),
        Request(random_adapter(args, envelope, 1, ("down_proj", "o_proj"), 3), prompt(9, 4), 4, 1),
    ]


class Eager:
    """The model in PyTorch: forward on one slot, decode alone, decode_batch."""

    def __init__(self, model: LlamaLoRA):
        self.model = model

    def forward(self, inputs):
        return self.model(*inputs)

    def decode(self, inputs):
        with self.model.decoding():
            return self.model(*inputs)

    def decode_batch(self, inputs):
        with self.model.batching():
            return self.model(*inputs)


def prefill(run, pools: KVPools, slot: int, request: Request, lora) -> torch.Tensor:
    """The prompt fed in chunks through forward into ``slot``; the logits after it."""
    cache, chunk = pools.slot(slot), run.model.args.chunk if isinstance(run, Eager) else run.chunk
    for p in range(0, len(request.prompt), chunk):
        out = run.forward(forward_inputs(request.prompt[p : p + chunk], p, cache, lora))
        cache.write(p, out[1:])
    return torch.as_tensor(out[0]).reshape(-1)


def alone(run, args: ModelArgs, envelope: Envelope, request: Request) -> torch.Tensor:
    """The request by itself: forward over its prompt, then decode one token a call; logits ``[new, vocab]``."""
    pools, lora = KVPools(args, 1), envelope.inputs(request.adapter, args)
    rows = [prefill(run, pools, 0, request, lora)]
    for i in range(1, request.new):
        pos = len(request.prompt) + i - 1
        out = run.decode(forward_inputs([int(rows[-1].argmax())], pos, pools.slot(0), lora))
        pools.slot(0).write(pos, out[1:])
        rows.append(torch.as_tensor(out[0]).reshape(-1))
    return torch.stack(rows)


def batched(run, args: ModelArgs, envelope: Envelope, requests: list[Request], slots: int) -> list[torch.Tensor]:
    """Every request through one shared set of ``slots`` KV slots: at each step, the requests joining then
    are prefilled into free slots (the last ones, so rows and slots differ), then one decode_batch step runs
    every request still generating; a request leaves when it has its tokens. Logits per request."""
    pools, rows, active = KVPools(args, slots), [[] for _ in requests], {}
    free = list(range(slots))
    step = 0
    while step == 0 or active:
        for i, r in enumerate(requests):
            if r.joins == step:
                active[i] = free.pop()
                rows[i].append(prefill(run, pools, active[i], r, envelope.inputs(r.adapter, args)))
        going = [i for i in active if len(rows[i]) < requests[i].new]
        if going:
            tokens = [int(rows[i][-1].argmax()) for i in going]
            pos = [len(requests[i].prompt) + len(rows[i]) - 1 for i in going]
            lora = envelope.rows_inputs([requests[i].adapter for i in going], args)
            out = run.decode_batch(rows_inputs(tokens, pos, [active[i] for i in going], pools, lora))
            pools.write_rows([active[i] for i in going], pos, out[1:])
            for b, i in enumerate(going):
                rows[i].append(torch.as_tensor(out[0])[b])
        for i in [i for i in active if len(rows[i]) == requests[i].new]:
            free.append(active.pop(i))
        step += 1
    return [torch.stack(r) for r in rows]


def speculated(run, args: ModelArgs, envelope: Envelope, requests: list[Request], guesses, drafts: int):
    """``batched`` with drafts: every request joins at step 0 and, at each step, its row carries its last token
    and up to ``drafts`` tokens of its guess (``guesses[i]``, its answer as guessed) after the ones it has;
    the drafts are kept while each is the argmax after the one before (greedy acceptance), and the token
    after the last kept one is picked from its logits. Logits per request (one row per token it picked), and
    the drafts each verified and accepted."""
    slots = list(range(len(requests)))
    pools = KVPools(args, len(requests))
    rows, drafted, accepted = [[] for _ in requests], [0] * len(requests), [0] * len(requests)
    for i, r in enumerate(requests):
        rows[i].append(prefill(run, pools, slots[i], r, envelope.inputs(r.adapter, args)))
    while going := [i for i, r in enumerate(requests) if len(rows[i]) < r.new]:
        entries, pos = [], []
        for i in going:
            have, left = len(rows[i]), requests[i].new - len(rows[i])
            guess = list(guesses[i][have : have + min(drafts, left - 1)])
            entries.append([int(rows[i][-1].argmax())] + guess)
            drafted[i] += len(guess)
            pos.append(len(requests[i].prompt) + have - 1)
        steps = max(len(e) for e in entries)
        padded = [e + [e[-1]] * (steps - len(e)) for e in entries]
        lora = envelope.rows_inputs([requests[i].adapter for i in going], args)
        out = run.decode_batch(rows_inputs(padded, pos, [slots[i] for i in going], pools, lora))
        pools.write_rows([slots[i] for i in going], pos, out[1:])
        logits = torch.as_tensor(out[0]).view(len(going), steps, -1)
        for b, i in enumerate(going):
            for t in range(len(entries[b])):
                rows[i].append(logits[b, t])
                if t + 1 == len(entries[b]) or int(logits[b, t].argmax()) != entries[b][t + 1]:
                    break
                accepted[i] += 1
    return [torch.stack(r) for r in rows], drafted, accepted


def assert_rows_equal(got: list[torch.Tensor], want: list[torch.Tensor], tol: float) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"request {i}"
        assert g.argmax(-1).tolist() == w.argmax(-1).tolist(), f"request {i}: greedy tokens differ"
        torch.testing.assert_close(g, w, atol=tol, rtol=tol, msg=f"request {i}")


@pytest.mark.parametrize("case", CASES)
def test_each_row_of_a_batch_equals_its_request_alone(case):
    model, envelope = model_of(case)
    args, run = model.args, Eager(model)
    requests = requests_of(args, envelope)
    with torch.no_grad():
        want = [alone(run, args, envelope, r) for r in requests]
        got = batched(run, args, envelope, requests, slots=5)
    tol = 2e-3 if args.kv_dtype == "float16" else TOL
    assert_rows_equal(got, want, tol)


def guesses_of(want: list[torch.Tensor]) -> list[list[int]]:
    """Per request: its answer (all right), every token off by one (all wrong), or right but for every third
    token (partly right: a rejection, then right again)."""
    answers = [w.argmax(-1).tolist() for w in want]
    return [
        answers[0],
        [(t + 1) % 256 for t in answers[1]],
        [t if j % 3 else (t + 1) % 256 for j, t in enumerate(answers[2])],
        answers[3],
    ]


@pytest.mark.parametrize("case", CASES)
def test_rows_of_drafts_equal_each_request_alone(case):
    """Rows that carry drafts beside rows that do not (a row of fewer tokens is padded to the step's): every
    request's logits are its own alone, whatever its drafts; right drafts are all accepted, wrong ones none.
    Gemma 3's rows run past its window of 6 with up to 5 drafts a step (its ring's spare slots)."""
    model, envelope = model_of(case)
    args, run = model.args, Eager(model)
    requests = [dataclasses.replace(r, joins=0, new=12) for r in requests_of(args, envelope)]
    with torch.no_grad():
        want = [alone(run, args, envelope, r) for r in requests]
        guesses = guesses_of(want)
        guesses[3] = []  # no drafts: a row of one token beside rows of several
        got, drafted, accepted = speculated(run, args, envelope, requests, guesses, drafts=5)
    # Eager 8da4w: PyTorch's float products of the dequantized weights sum in an order that depends on the
    # rows, and the next layer's int8 activations round that up (the plain batched step of these requests
    # moves request 0's logits by 4e-3 too); the programs' XNNPACK products do not (the exported test below).
    tol = {"kv-float16": 2e-3, "8da4w": 1e-2}.get(case, TOL)
    assert_rows_equal(got, want, tol)
    assert accepted[0] == drafted[0] == 9 and drafted[1] > 0 == accepted[1] and 0 < accepted[2] < drafted[2]
    assert drafted[3] == 0


def test_rows_lora_pads_each_rank_to_the_largest():
    """Rank 1 and 4 rows on one slot: the rank-1 row's A/B zero-padded to 4, its own values in front."""
    args = LLAMA
    small = random_adapter(args, ENVELOPE, 1, ("q_proj",), 5)
    big = random_adapter(args, ENVELOPE, 4, ("q_proj",), 6)
    a, b = ENVELOPE.rows_inputs([small, big, None], args)[:2]
    a_small, b_small = small.weights[(0, "q_proj")]
    assert a.shape == (3, 4, args.dim) and b.shape == (3, args.linear_shape("q_proj")[0], 4)
    assert torch.equal(a[0, :1], torch.as_tensor(a_small)) and not a[0, 1:].any()
    assert torch.equal(b[0, :, :1], torch.as_tensor(b_small)) and not b[0, :, 1:].any()
    assert torch.equal(a[1], torch.as_tensor(big.weights[(0, "q_proj")][0])) and not a[2].any() and not b[2].any()


class Program:
    """The exported program through ExecuTorch's Python runtime, liblora_share's kernels registered."""

    def __init__(self, pte: bytes, ptd, chunk: int):
        import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed kernels)
        from executorch.runtime import Runtime

        ctypes.CDLL(str(REPO / "build" / "liblora_share.so"), mode=ctypes.RTLD_GLOBAL)
        self.pte = pte  # the program reads these bytes: keep them alive
        program = Runtime.get().load_program(pte, data_path=str(ptd))
        self.methods = {m: program.load_method(m) for m in ("forward", "decode", "decode_batch")}
        self.chunk = chunk

    def _run(self, method: str, inputs):
        return self.methods[method].execute([t.contiguous() for t in inputs])

    def forward(self, inputs):
        return self._run("forward", inputs)

    def decode(self, inputs):
        return self._run("decode", inputs)

    def decode_batch(self, inputs):
        return self._run("decode_batch", inputs)


@pytest.mark.parametrize("case", ["gemma3-ring", "8da4w"])
def test_the_exported_batch_method_equals_each_request_alone(case, runner_bin, tmp_path):
    """Through ExecuTorch: each request alone by the program's forward and decode methods, and all of them
    by decode_batch; the same tokens and logits within 1e-4. The batch method's foundation products are the
    same XNNPACK linears over B rows (8da4w quantizes each row's activations by itself)."""
    from lora_share.export.program import export_program

    model, envelope = model_of(case)
    exported = export_program(model, envelope, tmp_path, batch=True)
    run, args = Program(exported.pte, exported.ptd, model.args.chunk), model.args
    requests = requests_of(args, envelope)
    want = [alone(run, args, envelope, r) for r in requests]
    got = batched(run, args, envelope, requests, slots=5)
    assert_rows_equal(got, want, TOL)
    with torch.no_grad():  # and the program computes what the model does
        eager = batched(Eager(model), args, envelope, requests, slots=5)
    assert_rows_equal(got, eager, 1e-3 if case == "8da4w" else TOL)
    # Rows of drafts: the program's entries are decode's bit for bit (its rows are XNNPACK's linears over
    # every entry, its attention the kernel decode calls; each entry sees the ones before it in its slot).
    requests = [dataclasses.replace(r, joins=0, new=12) for r in requests]
    want = [alone(run, args, envelope, r) for r in requests]
    got, drafted, accepted = speculated(run, args, envelope, requests, guesses_of(want), drafts=8)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert accepted[0] == drafted[0] == 9 and drafted[1] > 0 == accepted[1] and 0 < accepted[2] < drafted[2]


class RowsOneCall(torch.nn.Module):
    """A program of one lora_share::rope_write_attend_rows call over ``heads`` key/value heads."""

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, q, k, v, cos_q, sin_q, cos_k, sin_k, bias, slots, dst, *pools):
        return rope_write_attend_rows(
            q, k, v, (cos_q, sin_q), (cos_k, sin_k), bias, slots, dst, pools[: self.heads], pools[self.heads :]
        )


def rows_call_inputs(heads, rep, hd, positions, slots, n_slots, rows, dtype, gen, window=None):
    """Random float32 projections and rotations for rows of entries at ``positions`` (one list per row, as
    long as the others), pools of ``n_slots`` random slots of ``rows`` rows, each entry's mask (its slot's
    rows 1..position visible; a window hides the older ones) and the slab row it writes (position + 1;
    nowhere past the slab)."""
    b, t = len(positions), len(positions[0])
    angle = torch.rand(b, t, hd // 2, generator=gen) * 6.0
    cos, sin = torch.cat([angle.cos()] * 2, dim=-1), torch.cat([angle.sin()] * 2, dim=-1)
    q, k, v = (torch.randn(b, t, n * hd, generator=gen) for n in (heads * rep, heads, heads))
    cached = torch.arange(rows) - 1
    query = torch.tensor(positions).unsqueeze(2)  # [B, T, 1]
    hidden = torch.cat([(cached >= query) | (cached < 0), torch.zeros(b, t, 1, dtype=torch.bool)], dim=2)
    if window is not None:
        hidden[..., :-1] |= cached <= query - window
    bias = torch.zeros(hidden.shape).masked_fill(hidden, float("-inf")).to(dtype)
    dst = torch.where(query.squeeze(2) + 1 < rows, query.squeeze(2) + 1, -1)
    pools = [(torch.randn(n_slots, rows, hd, generator=gen) * 0.5).to(dtype) for _ in range(2 * heads)]
    return (q, k, v, cos * hd**-0.5, sin * hd**-0.5, cos, sin, bias, torch.tensor(slots), dst, *pools)


def rows_call_program(heads, rep, hd, rows, dtype) -> bytes:
    """A RowsOneCall program whose inputs are used where they lie (as an export's: no planned memory for
    them), so that the pools the kernel writes are the caller's tensors."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass
    from torch.export import Dim

    ctypes.CDLL(str(REPO / "build" / "liblora_share.so"), mode=ctypes.RTLD_GLOBAL)
    example = rows_call_inputs(heads, rep, hd, [[3, 4, 5], [5, 6, 7]], [1, 0], 3, rows, dtype, torch.Generator())
    b, t, n = Dim("rows", min=1, max=8), Dim("tokens", min=1, max=9), Dim("slots", min=1, max=8)
    dynamic = ({0: b, 1: t},) * 8 + ({0: b}, {0: b, 1: t}, ({0: n},) * (2 * heads))
    ep = torch.export.export(RowsOneCall(heads), example, strict=False, dynamic_shapes=dynamic)
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_executorch(
        ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False))
    ).buffer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_rope_write_attend_rows_kernel_matches_the_reference(runner_bin, dtype):
    """The C++ kernel against rope_write_attend_rows_reference: rows of 1 to 4 entries at positions from 1 to
    past the threads' split, slots in any order, a window, an entry at the slab's last row (written nowhere).
    Its outputs, and the pools it writes before attending, as the reference's; the keys and values bit for
    bit."""
    from executorch.runtime import Runtime

    heads, rep, hd, rows = 2, 3, 64, 1200
    buffer = rows_call_program(heads, rep, hd, rows, dtype)  # the program reads it: keep it alive
    method = Runtime.get().load_program(buffer).load_method("forward")
    gen = torch.Generator().manual_seed(0)
    for positions, slots, window in (
        ([[1]], [0], None),
        ([[1100, 1101, 1102, 1103], [2, 3, 4, 5], [40, 41, 42, 43]], [2, 0, 3], None),
        ([[700, 701], [9, 10]], [1, 3], 100),
        ([[1197, 1198, 1199]], [1], None),  # the last entry's row would be 1200: outside the slab
    ):
        args = rows_call_inputs(heads, rep, hd, positions, slots, 4, rows, dtype, gen, window)
        mine = [p.clone() for p in args[10:]]
        got = method.execute(list(args[:10]) + mine)
        want = rope_write_attend_rows_reference(*args[:10], args[10 : 10 + heads], args[10 + heads :])
        assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), f"positions {positions}"
        assert all(torch.equal(m, w) for m, w in zip(mine, args[10:])), f"pools written, positions {positions}"
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(got[0], want[0], atol=tol, rtol=tol, msg=f"positions {positions}")


def test_rope_write_attend_rows_refuses_a_slot_outside_the_pools(runner_bin):
    from executorch.runtime import Runtime

    buffer = rows_call_program(1, 2, 32, 16, torch.float32)
    method = Runtime.get().load_program(buffer).load_method("forward")
    args = list(rows_call_inputs(1, 2, 32, [[3]], [0], 2, 16, torch.float32, torch.Generator().manual_seed(1)))
    assert method.execute(args)[0].shape == (1, 1, 64)  # slot 0 of 2: fine
    args[8] = torch.tensor([2])
    with pytest.raises(RuntimeError):
        method.execute(args)


# The scheduler (inference/batching.py): continuous batching over KV slots that last.


def scheduler_of(case: str, slots: int):
    from lora_share.inference.batching import Scheduler

    model, envelope = model_of(case)
    requests = requests_of(model.args, envelope)
    adapters = {r.adapter.name: r.adapter for r in requests if r.adapter is not None}
    return Scheduler(Eager(model), model.args, envelope, adapters, slots, keep_logits=True), requests


def alone_eager(scheduler, request: Request) -> torch.Tensor:
    with torch.no_grad():
        return alone(scheduler.methods, scheduler.args, scheduler.envelope, request)


def test_the_scheduler_answers_each_request_as_alone_with_fewer_slots_than_requests():
    scheduler, requests = scheduler_of("llama", slots=2)
    submitted = [scheduler.submit(r.adapter and r.adapter.name, r.prompt, r.new) for r in requests]
    with torch.no_grad():
        scheduler.run()
    assert_rows_equal([torch.stack(s.logits) for s in submitted], [alone_eager(scheduler, r) for r in requests], TOL)
    assert max(scheduler.batch_sizes) == 2 and not any(s.busy for s in scheduler.slots.state)


@pytest.mark.parametrize("case", ["llama", "gemma3-ring"])
def test_a_reused_prefix_equals_a_fresh_prefill(case):
    """A second turn on the same adapter continues in the slot the first left (its prompt and answer are
    the start of the second's prompt); on another adapter the same tokens are fed again."""
    scheduler, requests = scheduler_of(case, slots=2)
    first = requests[1]
    turn1 = scheduler.submit(first.adapter.name, first.prompt, 6)
    with torch.no_grad():
        scheduler.run()
    history = first.prompt + turn1.tokens[:-1]
    assert scheduler.slots.state[turn1.slot].tokens == history
    follow = dataclasses.replace(first, prompt=history + [turn1.tokens[-1], 17, 4], new=5)
    turn2 = scheduler.submit(first.adapter.name, follow.prompt, follow.new)
    other = dataclasses.replace(requests[2], prompt=follow.prompt, new=3)
    elsewhere = scheduler.submit(other.adapter.name, other.prompt, other.new)
    with torch.no_grad():
        scheduler.run()
    assert turn2.slot == turn1.slot and scheduler.slots.prefix_hits == 1
    assert scheduler.slots.reused_tokens == len(history)
    assert_rows_equal(
        [torch.stack(turn2.logits), torch.stack(elsewhere.logits)],
        [alone_eager(scheduler, follow), alone_eager(scheduler, other)],
        TOL,
    )


def test_a_client_hanging_up_leaves_the_others_unchanged():
    scheduler, requests = scheduler_of("llama", slots=4)
    heard = []

    def hang_up(token):
        heard.append(token)
        return len(heard) < 3

    submitted = [
        scheduler.submit(r.adapter and r.adapter.name, r.prompt, r.new, hang_up if i == 1 else None)
        for i, r in enumerate(requests)
    ]
    with torch.no_grad():
        scheduler.run()
    assert submitted[1].tokens == heard and len(heard) == 3
    kept = [i for i in range(len(requests)) if i != 1]
    assert_rows_equal(
        [torch.stack(submitted[i].logits) for i in kept], [alone_eager(scheduler, requests[i]) for i in kept], TOL
    )
    assert_rows_equal([torch.stack(submitted[1].logits)], [alone_eager(scheduler, requests[1])[:3]], TOL)


@pytest.mark.parametrize("case", ["llama", "gemma3-ring"])
def test_a_hostile_request_leaves_nothing_behind(case):
    """An adapter whose A and B are scaled by 1e20 (its products overflow to inf and NaN) between two runs of the
    same requests, on two slots so that the hostile request's slot is taken again: the answers are bit for
    bit the first ones, and its slot is cleared and forgotten (its next turn is no prefix hit)."""
    scheduler, requests = scheduler_of(case, slots=2)
    clean = requests[:2]
    weights = {key: (a * 1e20, b * 1e20) for key, (a, b) in requests[2].adapter.weights.items()}  # every linear
    scheduler.adapters["hostile"] = Adapter("hostile", weights)

    def run(adapter, prompt, new):
        submitted = scheduler.submit(adapter, prompt, new)
        with torch.no_grad():
            scheduler.run()
        return submitted

    def run_clean():
        submitted = [scheduler.submit(r.adapter and r.adapter.name, r.prompt, r.new) for r in clean]
        with torch.no_grad():
            scheduler.run()
        return [torch.stack(s.logits) for s in submitted]

    first = run_clean()
    hostile = run("hostile", clean[1].prompt, 4)
    assert scheduler.slots.cleared == 1  # its KV held inf or NaN
    run("hostile", clean[1].prompt + hostile.tokens[:-1] + [5], 2)
    assert scheduler.slots.prefix_hits == 0
    assert all(torch.equal(a, b) for a, b in zip(first, run_clean()))


def test_the_least_recently_used_slot_is_taken_first():
    scheduler, requests = scheduler_of("llama", slots=2)
    taken = []
    for r in requests[1:4]:  # three adapters one after the other, no prefix in common
        taken.append(scheduler.submit(r.adapter.name, r.prompt, 2))
        with torch.no_grad():
            scheduler.run()
    assert taken[2].slot == taken[0].slot != taken[1].slot
    assert scheduler.slots.prefix_hits == 0
