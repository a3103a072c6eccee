"""A deployment's LoRA envelope: the (layer, linear) slots its one program takes LoRA on, and the
largest rank it takes there.

LoRA A and B are forward inputs (model/decoder.py), so one exported program serves every adapter that
fits its envelope: any rank from 1 to ``max_rank`` on any subset of its slots, with any alpha,
rslora, rank/alpha patterns. Adding such an adapter writes data, never exports. Each slot is
two inputs, ``A [r, in]`` then ``B [out, r]``, whose rank is a dynamic size of its own; a slot
the adapter leaves alone gets a zero rank-1 pair, which adds exactly nothing.

The build's envelope is ``lora_envelope`` from the config, or by default every linear some
adapter of the config adapts, on every layer, at the config's largest rank. An adapter outside
it is refused, naming the key to widen (``lora-share add`` never re-exports).

With ``skip_absent`` (``lora_envelope.skip_absent``), an adapter that leaves slots alone ships a
variant of the program in which those slots' LoRA nodes are dead code that XNNPACK drops
(formats/xnnpack_prune.py): derived when its file is written, byte for byte in place, no export.
It then decodes as through a program of its own recipe; adapters with the same slots share one
variant in a process, and each distinct set of slots is one more program instance there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UserError
from .args import LORA_TARGETS, ModelArgs

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Envelope:
    """``slots`` in program input order (by layer, then ``LORA_TARGETS`` order); ``max_rank`` on each."""

    slots: tuple[tuple[int, str], ...]
    max_rank: int
    skip_absent: bool = False  # adapters' files carry a program variant without their absent slots

    @classmethod
    def make(cls, targets, layers, max_rank: int, skip_absent: bool = False) -> Envelope:
        targets = sorted(set(targets), key=LORA_TARGETS.index)
        return cls(
            tuple((layer, t) for layer in sorted(set(layers)) for t in targets), int(max_rank), bool(skip_absent)
        )

    @classmethod
    def resolve(cls, cfg, adapters, args: ModelArgs) -> Envelope:
        """The build's envelope: ``cfg`` (config.EnvelopeConfig, or None) with its unset keys
        filled from ``adapters`` (targets: those they adapt; rank: their largest; layers: all)."""
        targets = getattr(cfg, "targets", None) or sorted(
            {t for a in adapters for _, t in a.weights}, key=LORA_TARGETS.index
        )
        layers = getattr(cfg, "layers", None) or range(args.n_layers)
        max_rank = getattr(cfg, "max_rank", None) or max(
            (a_.shape[0] for a in adapters for a_, _ in a.weights.values()), default=1
        )
        return cls.make(targets, layers, max_rank, bool(getattr(cfg, "skip_absent", False)))

    @property
    def targets(self) -> list[str]:
        return sorted({t for _, t in self.slots}, key=LORA_TARGETS.index)

    @property
    def layers(self) -> list[int]:
        return sorted({layer for layer, _ in self.slots})

    def to_dict(self) -> dict:
        """As the manifest records it (``skip_absent`` only when set: it changes the adapters'
        files, not the exported program, so a program signature leaves it out)."""
        out = {"targets": self.targets, "layers": self.layers, "max_rank": self.max_rank}
        return {**out, "skip_absent": True} if self.skip_absent else out

    @classmethod
    def from_dict(cls, d: dict) -> Envelope:
        return cls.make(d["targets"], d["layers"], d["max_rank"], d.get("skip_absent", False))

    def describe(self) -> str:
        """What the envelope takes, in words: its linears, layers and largest rank."""
        return f"LoRA on {', '.join(self.targets)} of layers {_ranges(self.layers)}, rank up to {self.max_rank}"

    def misfits(self, adapter) -> list[str]:
        """What of ``adapter`` lies outside the envelope, in words, each with the ``lora_envelope`` key
        to widen: linears it does not take, layers it does not cover, ranks above its largest."""
        targets, layers = set(self.targets), set(self.layers)
        off_target: dict[str, set[int]] = {}
        off_layer: dict[int, set[str]] = {}
        over: dict[int, set[str]] = {}
        for (layer, target), (a, _) in adapter.weights.items():
            if target not in targets:
                off_target.setdefault(target, set()).add(layer)
            elif layer not in layers:
                off_layer.setdefault(layer, set()).add(target)
            elif a.shape[0] > self.max_rank:
                over.setdefault(a.shape[0], set()).add(target)
        problems = []
        if off_target:
            names = sorted(off_target, key=LORA_TARGETS.index)
            where = _ranges(sorted(set().union(*off_target.values())))
            problems.append(
                f"it has LoRA on {', '.join(names)} (layers {where}), which the envelope does not take: "
                "add them to lora_envelope.targets"
            )
        if off_layer:
            names = sorted(set().union(*off_layer.values()), key=LORA_TARGETS.index)
            problems.append(
                f"it has LoRA on layers {_ranges(sorted(off_layer))} (of {', '.join(names)}), which the envelope "
                "does not cover: add them to lora_envelope.layers"
            )
        if over:
            names = sorted(set().union(*over.values()), key=LORA_TARGETS.index)
            problems.append(
                f"its rank is {max(over)} (on {', '.join(names)}), above the envelope's largest, "
                f"{self.max_rank}: raise lora_envelope.max_rank"
            )
        return problems

    def require_fits(self, adapters, remedy: str) -> None:
        """Refuse unless every one of ``adapters`` fits, saying in words what the envelope takes and,
        for each adapter outside it, what lies outside and the key to widen; then ``remedy``: what to
        do, and where (the config, the deployment folder)."""
        lines = [
            f"adapter {adapter.name}: outside the deployment's LoRA envelope ({self.describe()}): "
            + "; ".join(problems)
            for adapter in adapters
            if (problems := self.misfits(adapter))
        ]
        if lines:
            raise UserError(
                "; ".join(lines) + f"; {remedy} (an envelope is exported once; adapters inside it are "
                "added without an export)"
            )

    def shapes(self, args: ModelArgs) -> list[tuple[int, int]]:
        """(out_features, in_features) of each slot's linear, in input order."""
        return [args.linear_shape(t) for _, t in self.slots]

    def inputs(self, adapter, args: ModelArgs) -> list[torch.Tensor]:
        """forward's LoRA inputs for ``adapter`` (None: no adapter): A, B per slot (the adapter's
        arrays, not copies); a zero rank-1 pair where the adapter has no LoRA."""
        import torch

        weights = adapter.weights if adapter is not None else {}
        out = []
        for slot, (out_f, in_f) in zip(self.slots, self.shapes(args)):
            if slot in weights:
                out += [torch.as_tensor(t) for t in weights[slot]]  # numpy (checkpoints/adapters.py): no copy
            else:
                out += [torch.zeros(1, in_f), torch.zeros(out_f, 1)]
        return out

    def rows_inputs(self, adapters, args: ModelArgs) -> list[torch.Tensor]:
        """The batch method's LoRA inputs (docs/batching.md) for one row per entry of ``adapters`` (None:
        no adapter): per slot ``A [B, r, in]`` and ``B [B, out, r]``, r the rows' largest rank there;
        a smaller rank is zero-padded, which adds exactly nothing."""
        import torch
        import torch.nn.functional as F

        rows = [self.inputs(adapter, args) for adapter in adapters]
        out = []
        for i in range(len(self.slots)):
            r = max(row[2 * i].shape[0] for row in rows)
            out.append(torch.stack([F.pad(row[2 * i], (0, 0, 0, r - row[2 * i].shape[0])) for row in rows]))
            out.append(torch.stack([F.pad(row[2 * i + 1], (0, r - row[2 * i].shape[0])) for row in rows]))
        return out

    def example_inputs(self, args: ModelArgs) -> list[torch.Tensor]:
        """LoRA inputs for torch.export: rank 2 (not 1, which export would take to be a constant)
        unless the envelope's rank is 1."""
        import torch

        r = min(2, self.max_rank)
        return [t for out_f, in_f in self.shapes(args) for t in (torch.zeros(r, in_f), torch.zeros(out_f, r))]

    def dynamic_shapes(self) -> list[dict]:
        """torch.export's dynamic sizes of the LoRA inputs: each slot's rank, 1..max_rank, its own."""
        from torch.export import Dim

        if self.max_rank == 1:
            return [{} for _ in range(2 * len(self.slots))]
        out = []
        for i in range(len(self.slots)):
            r = Dim(f"lora_rank_{i}", min=1, max=self.max_rank)
            out += [{0: r}, {1: r}]
        return out

    def rows_dynamic_shapes(self, batch) -> list[dict]:
        """torch.export's dynamic sizes of the batch method's LoRA inputs: the rows (``batch``, a Dim) and
        each slot's rank."""
        out = []
        for a, b in zip(*[iter(self.dynamic_shapes())] * 2):  # A's rank is its dim 0, B's its dim 1
            out += [{0: batch, **({1: a[0]} if a else {})}, {0: batch, **({2: b[1]} if b else {})}]
        return out


def _ranges(values: list[int]) -> str:
    """``0-3, 6`` for [0, 1, 2, 3, 6]."""
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(parts)
