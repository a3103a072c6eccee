"""Many conversations at once over one program (docs/batching.md): KV slots that last and continuous
batching, the contract the C++ runtime's scheduler follows.

``Slots`` owns N KV slots (``KVPools``) and what each holds: the adapter whose KV it is and the tokens
fed into it. A slot keeps both after its request; a request on the same adapter whose tokens begin with
a slot's tokens continues there (a prefix hit), otherwise it takes the least recently used free slot.
Nothing else of a request stays: the rows past the prefix a claim keeps are zeroed (forward reads them,
masked, and a masked inf or NaN row is NaN), and a slot whose KV holds inf or NaN when its request ends
is zeroed and forgotten.

``Scheduler.step`` is one turn of the loop: requests that arrived take a free slot and their LoRA row;
one prompt chunk of one admitting request runs through ``forward`` (so a long prompt delays the others
by one chunk a step); then one ``decode_batch`` call steps every request that is generating. Each
request's tokens go to its ``on_token``, whose False (a caller that hung up) ends it at that step.
Greedy decoding, as ``generate`` (inference/generate.py): the first token is picked after the prompt's
last position, token i after feeding token i - 1.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..model.decoder import KVPools, ModelArgs, forward_inputs, rows_inputs
from ..model.envelope import Envelope
from .generate import check_request


class Methods(Protocol):
    """The program's methods, each taking its input list and returning its outputs."""

    def forward(self, inputs) -> Sequence: ...

    def decode_batch(self, inputs) -> Sequence: ...


@dataclass
class SlotState:
    adapter: str | None = None  # whose KV the slot holds (None: the foundation alone)
    tokens: list[int] = field(default_factory=list)  # the tokens whose KV it holds, from position 0
    last_used: int = -1
    busy: bool = False


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class Slots:
    """N KV slots and what each holds. ``ring`` (Gemma 3's sliding window, 0 without): a ring keeps only
    the last W positions, so a slot continues only from the end of what it holds."""

    def __init__(self, args: ModelArgs, n: int):
        self.pools = KVPools(args, n)
        self.state = [SlotState() for _ in range(n)]
        self.ring = self.pools.ring
        self._clock = itertools.count()
        self.prefix_hits = 0
        self.reused_tokens = 0
        self.cleared = 0  # slots zeroed and forgotten for an inf or NaN

    def claim(self, adapter: str | None, tokens: Sequence[int]) -> tuple[int, int] | None:
        """A free slot for ``tokens`` on ``adapter`` and how many of them it already holds (at most all but
        the last, which must be fed for its logits); None when every slot is busy. The free slot holding
        the longest prefix on the same adapter, else the least recently used."""
        free = [i for i, s in enumerate(self.state) if not s.busy]
        if not free:
            return None
        best, kept = None, 0
        for i in free:
            s = self.state[i]
            k = min(common_prefix(s.tokens, tokens), len(tokens) - 1) if s.adapter == adapter else 0
            if self.ring and k < len(s.tokens):  # a ring's older rows are overwritten: only its end continues
                k = 0
            if k > kept:
                best, kept = i, k
        if best is None:
            best = min(free, key=lambda i: self.state[i].last_used)
        else:
            self.prefix_hits += 1
            self.reused_tokens += kept
        s = self.state[best]
        self._clear(best, kept, len(s.tokens))
        s.adapter, s.tokens, s.busy = adapter, list(tokens[:kept]), True
        s.last_used = next(self._clock)
        return best, kept

    def release(self, slot: int) -> None:
        """The request in ``slot`` ended: the slot keeps its tokens and KV for a later request, unless that
        KV holds inf or NaN: then it is zeroed and holds no tokens (never continued)."""
        if not all(bool(torch.isfinite(pool[slot]).all()) for pool in self.pools.pools):
            self._clear(slot, 0, len(self.state[slot].tokens))
            self.state[slot].tokens = []
            self.cleared += 1
        self.state[slot].busy = False
        self.state[slot].last_used = next(self._clock)

    def _clear(self, slot: int, start: int, end: int) -> None:
        """Zeroes the rows of positions start..end-1 in every slab of ``slot``: position p at row p + 1, in a
        ring slab (W + 1 rows) at row 1 + p % W."""
        for pool in self.pools.pools:
            rows = pool.shape[1]
            ring = self.ring and rows == self.ring + 1
            index = sorted({1 + p % self.ring if ring else p + 1 for p in range(start, end)} - {rows})
            pool[slot, index] = 0


@dataclass
class Request:
    adapter: str | None
    prompt: list[int]
    max_new_tokens: int
    on_token: Callable[[int], bool] | None = None  # False: the caller is gone, end the request
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    slot: int | None = None
    fed: int = 0  # prompt tokens whose KV is in the slot
    done: bool = False

    @property
    def decoding(self) -> bool:
        return self.slot is not None and self.fed == len(self.prompt) and not self.done


class Scheduler:
    """Continuous batching of requests on any adapters over ``methods`` (module docstring). ``adapters``
    maps a name to its LoRA weights (``Envelope.inputs``' adapter); a request names one, or None."""

    def __init__(
        self,
        methods: Methods,
        args: ModelArgs,
        envelope: Envelope,
        adapters: dict,
        slots: int,
        keep_logits: bool = False,
    ):
        self.methods, self.args, self.envelope, self.adapters = methods, args, envelope, adapters
        self.slots = Slots(args, slots)
        self.keep_logits = keep_logits
        self.waiting: list[Request] = []
        self.active: list[Request] = []
        self.batch_sizes: dict[int, int] = {}

    def submit(
        self,
        adapter: str | None,
        prompt: Sequence[int],
        max_new_tokens: int,
        on_token: Callable[[int], bool] | None = None,
    ) -> Request:
        check_request(prompt, max_new_tokens, self.args.vocab_size, self.args.max_seq_len)
        request = Request(adapter, list(prompt), max_new_tokens, on_token)
        self.waiting.append(request)
        return request

    def idle(self) -> bool:
        return not self.waiting and not self.active

    def run(self) -> None:
        """Step until every request has ended."""
        while not self.idle():
            self.step()

    def step(self) -> None:
        while self.waiting:
            claimed = self.slots.claim(self.waiting[0].adapter, self.waiting[0].prompt)
            if claimed is None:
                break
            request = self.waiting.pop(0)
            request.slot, request.fed = claimed
            self.active.append(request)
        admitting = next((r for r in self.active if r.fed < len(r.prompt)), None)
        if admitting is not None:
            self._prefill_chunk(admitting)
        rows = [r for r in self.active if r.decoding and r.tokens]
        if rows:
            self._decode(rows)
        for request in [r for r in self.active if r.done]:
            self.active.remove(request)
            self.slots.release(request.slot)

    def _lora(self, request: Request):
        return self.adapters[request.adapter] if request.adapter is not None else None

    def _prefill_chunk(self, request: Request) -> None:
        start = request.fed
        chunk = request.prompt[start : start + self.args.chunk]
        cache = self.slots.pools.slot(request.slot)
        out = self.methods.forward(
            forward_inputs(chunk, start, cache, self.envelope.inputs(self._lora(request), self.args))
        )
        cache.write(start, out[1:])
        request.fed += len(chunk)
        self.slots.state[request.slot].tokens += chunk
        if request.fed == len(request.prompt):
            self._deliver(request, torch.as_tensor(out[0]).reshape(-1))

    def _decode(self, rows: list[Request]) -> None:
        tokens = [r.tokens[-1] for r in rows]
        pos = [len(r.prompt) + len(r.tokens) - 1 for r in rows]
        slots = [r.slot for r in rows]
        lora = self.envelope.rows_inputs([self._lora(r) for r in rows], self.args)
        out = self.methods.decode_batch(rows_inputs(tokens, pos, slots, self.slots.pools, lora))
        self.slots.pools.write_rows(slots, pos, out[1:])
        self.batch_sizes[len(rows)] = self.batch_sizes.get(len(rows), 0) + 1
        logits = torch.as_tensor(out[0])
        for b, request in enumerate(rows):
            self.slots.state[request.slot].tokens.append(tokens[b])
            self._deliver(request, logits[b])

    def _deliver(self, request: Request, logits: torch.Tensor) -> None:
        token = int(logits.argmax())
        request.tokens.append(token)
        if self.keep_logits:
            request.logits.append(logits.clone())
        wanted = request.on_token(token) if request.on_token is not None else True
        request.done = wanted is False or len(request.tokens) == request.max_new_tokens
