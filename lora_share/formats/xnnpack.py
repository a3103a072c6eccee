"""The part of an XNNPACK delegate payload lora-share relies on: which named
data keys its constants refer to.

A payload (XNNPACK's own format, little-endian) is::

    [0:4]   unused (zero)
    [4:8]   "XH00"  header magic
    [8:10]  uint16  header length (30)
    [10:14] uint32  flatbuffer offset      (relative to the payload start)
    [14:18] uint32  flatbuffer size
    [18:22] uint32  constant data offset
    [22:30] uint64  constant data size

and the flatbuffer (identifier "XN01", root XNNGraph) lists ``constant_data``,
each either an offset into the payload's constant data or a ``named_key``: the
sha256 hex of the weight's bytes, looked up in the program's named data or in
the external .ptd.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import BadFlatbuffer
from .flatbuf import FlatBuffer

HEADER_MAGIC = b"XH00"
FILE_IDENTIFIER = b"XN01"
_GRAPH_CONSTANT_DATA = 8  # XNNGraph slot in backends/xnnpack/serialization/schema.fbs
_CONST_OFFSET, _CONST_SIZE, _CONST_NAMED_KEY = 0, 1, 2


@dataclass(frozen=True)
class ConstantRef:
    """A delegate constant stored under a named key; ``key_span`` is the key's absolute (position, length)."""

    key: str
    size: int
    key_span: tuple[int, int]


def named_constants(blob, what: str, start: int, size: int) -> list[ConstantRef]:
    """Named constants of the XNNPACK payload at ``blob[start:start + size]``."""
    if size >= 8 and bytes(blob[start + 4 : start + 8]) == FILE_IDENTIFIER:
        fb_start, fb_size = start, size
    else:
        if size < 30 or bytes(blob[start + 4 : start + 8]) != HEADER_MAGIC:
            raise BadFlatbuffer(what, f"XNNPACK payload at byte {start} has no {HEADER_MAGIC!r} header")
        length, fb_off, fb_size = struct.unpack_from("<HII", blob, start + 8)
        if length < 30 or fb_off < length or fb_off + fb_size > size:
            raise BadFlatbuffer(
                what,
                f"XNNPACK payload at byte {start}: flatbuffer [{fb_off}, {fb_off + fb_size}) "
                f"is outside the {size}-byte payload",
            )
        fb_start = start + fb_off
    fb = FlatBuffer(blob, f"{what} (XNNPACK payload at byte {start})", fb_start, fb_start + fb_size)
    if fb.identifier() != FILE_IDENTIFIER:
        raise BadFlatbuffer(
            what, f"XNNPACK payload at byte {start}: identifier {fb.identifier()!r}, expected {FILE_IDENTIFIER!r}"
        )
    refs = []
    for t in fb.root("XNNGraph").tables(_GRAPH_CONSTANT_DATA, "ConstantDataOffset"):
        key = t.string(_CONST_NAMED_KEY)
        if key:
            refs.append(ConstantRef(key, t.u64(_CONST_SIZE), t.string_span(_CONST_NAMED_KEY)))
    return refs
