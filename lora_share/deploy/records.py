"""The lora-share records a build stores inside its files (schema/lora_share.fbs):
the foundation's fingerprint in foundation.ptd and, in each adapter .pte, the
adapter's metadata, the fingerprint of the foundation it needs, its program's
envelope and the keys of its LoRA tensors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..checkpoints.adapters import Adapter
from ..formats.meta import AdapterMeta, FoundationMeta
from ..model.envelope import Envelope
from .adapter_pte import lora_entries

if TYPE_CHECKING:
    from ..checkpoints.foundation import Foundation  # its tensors are torch's: only a build has one


def foundation_meta(foundation: Foundation, fingerprint: str) -> FoundationMeta:
    """The foundation record for ``foundation`` (``fingerprint`` from builder.foundation_fingerprint)."""
    tensors = foundation.tensors.values()
    return FoundationMeta(
        fingerprint=fingerprint,
        tensor_count=len(foundation.tensors),
        parameter_count=sum(t.numel() for t in tensors),
        tensor_bytes=sum(t.numel() * t.element_size() for t in tensors),
        tied_embeddings=bool(foundation.args.tie_embeddings),
    )


def source_label(source: dict) -> str:
    """What an adapter record says it was made from: the PEFT folder's name (its files are pinned by
    their sha256 beside it; the full path stays in manifest.json, so a .pte's bytes do not depend on
    where it was built), or ``seed=N`` for synthetic weights."""
    if source.get("kind") == "peft":
        return Path(source.get("path", "")).name
    return f"seed={source.get('seed', '')}"


def adapter_meta(adapter: Adapter, fingerprint: str, envelope: Envelope) -> tuple[AdapterMeta, dict[str, bytes]]:
    """The adapter record (its own metadata, the foundation fingerprint and the program envelope it
    was built for, the key of each LoRA tensor) and its LoRA tensors by key."""
    m, source = adapter.meta, adapter.meta.get("source", {})
    kind = source.get("kind", "")
    lora, tensors = lora_entries(adapter, envelope)
    meta = AdapterMeta(
        name=adapter.name,
        foundation_fingerprint=fingerprint,
        rank=int(m["rank"]),
        alpha=float(m["alpha"]),
        targets=list(m["targets"]),
        layers=[int(x) for x in m.get("layers", [])],
        use_rslora=bool(m.get("use_rslora", False)),
        source_kind=kind,
        source=source_label(source),
        source_hashes=dict(source.get("sha256", {})),
        lora_bytes=sum(a.nbytes + b.nbytes for a, b in adapter.weights.values()),
        envelope_max_rank=envelope.max_rank,
        envelope=list(envelope.slots),
        lora=lora,
    )
    return meta, tensors
