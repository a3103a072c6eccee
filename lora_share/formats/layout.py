"""Tensor layouts as ExecuTorch serializes them: scalar type, sizes, dim order."""

from __future__ import annotations

import math
from dataclasses import dataclass

# executorch_flatbuffer.ScalarType (schema/scalar_type.fbs) -> (name, bytes per element).
SCALAR_TYPES: dict[int, tuple[str, int]] = {
    0: ("uint8", 1),
    1: ("int8", 1),
    2: ("int16", 2),
    3: ("int32", 4),
    4: ("int64", 8),
    5: ("float16", 2),
    6: ("float32", 4),
    7: ("float64", 8),
    11: ("bool", 1),
    12: ("qint8", 1),
    13: ("quint8", 1),
    14: ("qint32", 4),
    15: ("bfloat16", 2),
    16: ("quint4x2", 1),
    17: ("quint2x4", 1),
    22: ("bits16", 2),
    23: ("float8_e5m2", 1),
    24: ("float8_e4m3fn", 1),
    25: ("float8_e5m2fnuz", 1),
    26: ("float8_e4m3fnuz", 1),
    27: ("uint16", 2),
    28: ("uint32", 4),
    29: ("uint64", 8),
}


@dataclass(frozen=True)
class TensorLayout:
    """What a named tensor is: ``dtype`` (torch-style name), ``sizes`` and ``dim_order``."""

    scalar_type: int
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return SCALAR_TYPES.get(self.scalar_type, (f"scalar_type_{self.scalar_type}", 0))[0]

    @property
    def nbytes(self) -> int:
        """Bytes of a contiguous tensor of this layout."""
        return math.prod(self.sizes) * SCALAR_TYPES[self.scalar_type][1]

    def problem(self) -> str | None:
        """Why this layout cannot describe real data, or None if it can."""
        if self.scalar_type not in SCALAR_TYPES:
            return f"unknown scalar type {self.scalar_type}"
        if any(s < 0 for s in self.sizes):
            return f"negative size in {list(self.sizes)}"
        if sorted(self.dim_order) != list(range(len(self.sizes))):
            return f"dim_order {list(self.dim_order)} is not a permutation of {len(self.sizes)} dims"
        return None


def alignment_of(offset: int, cap: int = 1 << 16) -> int:
    """The largest power of two (up to ``cap``) that divides ``offset``: how an absolute offset is aligned."""
    if offset == 0:
        return cap
    return min(offset & -offset, cap)
