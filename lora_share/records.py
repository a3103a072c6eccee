"""The lora-share records a build stores inside its files (schema/lora_share.fbs):
the foundation's fingerprint in foundation.ptd and, in each adapter .pte, the
adapter's metadata with the fingerprint of the foundation it needs."""

from __future__ import annotations

from .adapters import Adapter
from .export import FOUNDATION_TAG
from .formats.meta import ADAPTER_KEY, FOUNDATION_KEY, AdapterMeta, FoundationMeta, encode_adapter, encode_foundation
from .foundation import Foundation


def foundation_meta(foundation: Foundation, fingerprint: str) -> FoundationMeta:
    """The foundation record for ``foundation`` (``fingerprint`` from builder.foundation_fingerprint)."""
    tensors = foundation.tensors.values()
    return FoundationMeta(
        fingerprint=fingerprint, tensor_count=len(foundation.tensors),
        parameter_count=sum(t.numel() for t in tensors),
        tensor_bytes=sum(t.numel() * t.element_size() for t in tensors),
        tied_embeddings=bool(foundation.args.tie_embeddings),
    )


def adapter_meta(adapter: Adapter, fingerprint: str) -> AdapterMeta:
    """The adapter record: its own metadata and the foundation fingerprint it was exported against."""
    m, source = adapter.meta, adapter.meta.get("source", {})
    kind = source.get("kind", "")
    return AdapterMeta(
        name=adapter.name, foundation_fingerprint=fingerprint, rank=int(m["rank"]), alpha=float(m["alpha"]),
        targets=list(m["targets"]), layers=[int(x) for x in m.get("layers", [])],
        use_rslora=bool(m.get("use_rslora", False)), source_kind=kind,
        source=source.get("path", "") if kind == "peft" else f"seed={source.get('seed', '')}",
        source_hashes=dict(source.get("sha256", {})),
        lora_bytes=sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in adapter.weights.values()),
    )


def export_named_data(foundation: Foundation, adapter: Adapter, fingerprint: str) -> dict:
    """The ``named_data`` argument of export.export_program: the foundation record into the .ptd
    (the same bytes for every adapter, so the .ptd stays shared) and the adapter record into the .pte."""
    return {
        FOUNDATION_KEY: (encode_foundation(foundation_meta(foundation, fingerprint)), FOUNDATION_TAG),
        ADAPTER_KEY: (encode_adapter(adapter_meta(adapter, fingerprint)), None),
    }
