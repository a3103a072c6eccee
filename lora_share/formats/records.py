"""lora-share's records (formats/meta.py) as stored in a file: the foundation record in a
foundation.ptd, the adapter record in an adapter .pte, the shared-tensors record in an
adapters_shared.ptd. Each accessor takes a parsed file and gives its record, or None if it has none."""

from __future__ import annotations

from .meta import ADAPTER_KEY, FOUNDATION_KEY, SHARED_KEY, AdapterMeta, FoundationMeta, SharedMeta, decode
from .ptd import Ptd
from .pte import Pte


def adapter_record(pte: Pte) -> AdapterMeta | None:
    """The adapter record stored in ``pte``, or None if it has none."""
    return decode(pte.data(ADAPTER_KEY), f"{pte.what}: {ADAPTER_KEY}").adapter if ADAPTER_KEY in pte else None


def foundation_record(ptd: Ptd) -> FoundationMeta | None:
    """The foundation record stored in ``ptd``, or None if it has none."""
    return (
        decode(ptd.data(FOUNDATION_KEY), f"{ptd.what}: {FOUNDATION_KEY}").foundation if FOUNDATION_KEY in ptd else None
    )


def shared_record(ptd: Ptd) -> SharedMeta | None:
    """The shared-tensors record stored in ``ptd`` (an adapters_shared.ptd), or None if it has none."""
    return decode(ptd.data(SHARED_KEY), f"{ptd.what}: {SHARED_KEY}").shared if SHARED_KEY in ptd else None
