"""Read ExecuTorch FlatTensor data files (.ptd) defensively.

Layout (little-endian; see schema/FORMAT.md)::

    [0:4]   uint32  flatbuffer root table offset
    [4:8]   "FT01"  flatbuffer file identifier
    [8:12]  "FH01"  FlatTensor header magic
    [12:16] uint32  header length (>= 40)
    [16:24] uint64  flatbuffer offset      \\  the runtime reads bytes
    [24:32] uint64  flatbuffer size        /   [0, offset + size) as the flatbuffer
    [32:40] uint64  segment base offset
    [40:48] uint64  segment data size
    ...     FlatTensor flatbuffer (version, segments, named_data)
    [segment base offset ...] segments, each at base + segment.offset

``read_ptd`` checks every number before it is used and raises one named
``FormatError`` for the first problem; a file it accepts can be sliced by the
absolute offsets it returns without further checks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .blob import KeyedEntries, open_blob
from .errors import BadFlatbuffer, BadHeader, OffsetOutOfRange, TruncatedHeader, UnsupportedVersion, WrongMagic
from .flatbuf import FlatBuffer, Table
from .layout import TensorLayout, alignment_of

FILE_IDENTIFIER = b"FT01"
HEADER_MAGIC = b"FH01"
HEADER_OFFSET = 8
MIN_HEADER_LENGTH = 40
MAX_VERSION = 0  # FlatTensorDataMap::kMaxSupportedSchemaVersion in executorch 1.5.1

# Slots (declaration order) in executorch/extension/flat_tensor/serialize/flat_tensor.fbs.
_FT_VERSION, _FT_SEGMENTS, _FT_NAMED_DATA = 0, 1, 2
_SEG_OFFSET, _SEG_SIZE = 0, 1
_ND_KEY, _ND_SEGMENT, _ND_LAYOUT = 0, 1, 2
_TL_SCALAR_TYPE, _TL_SIZES, _TL_DIM_ORDER = 0, 1, 2


@dataclass(frozen=True)
class PtdHeader:
    """The FlatTensor header at byte 8."""

    length: int
    flatbuffer_offset: int
    flatbuffer_size: int
    segment_base_offset: int
    segment_data_size: int

    @property
    def flatbuffer_end(self) -> int:
        """The runtime reads [0, flatbuffer_end) as the flatbuffer."""
        return self.flatbuffer_offset + self.flatbuffer_size


@dataclass(frozen=True)
class Segment:
    """One data segment: ``offset`` relative to the segment base, ``start``/``end`` absolute in the file."""

    index: int
    offset: int
    size: int
    start: int

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def alignment(self) -> int:
        return alignment_of(self.start)


@dataclass(frozen=True)
class PtdEntry:
    """One named_data entry: its key, segment and where its bytes are in the file."""

    key: str
    segment_index: int
    start: int
    size: int
    layout: TensorLayout | None
    key_span: tuple[int, int]  # absolute (position, length) of the key's bytes

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass
class Ptd(KeyedEntries):
    """A parsed .ptd. ``entries`` keep the file's order; ``data(key)`` returns a tensor's bytes."""

    what: str
    size: int
    header: PtdHeader
    version: int
    segments: list[Segment]
    entries: list[PtdEntry]
    blob: object = field(repr=False)

    def __post_init__(self):
        self._index(self.entries)

    def keys_by_segment(self) -> dict[int, list[str]]:
        """Segment index -> every key that points at it (more than one key = stored once, shared)."""
        out: dict[int, list[str]] = {}
        for e in self.entries:
            out.setdefault(e.segment_index, []).append(e.key)
        return out


def read_header(blob, what: str) -> PtdHeader:
    """Check magic and header of a .ptd held in ``blob``; return the header."""
    n = len(blob)
    if n >= 8 and bytes(blob[4:8]) != FILE_IDENTIFIER:
        found = bytes(blob[4:8])
        hint = " (that is an ExecuTorch program, .pte)" if found == b"ET12" else ""
        raise WrongMagic(
            what,
            f"not an ExecuTorch data file (.ptd): identifier {found!r} at byte 4, expected {FILE_IDENTIFIER!r}{hint}",
        )
    if n < HEADER_OFFSET + MIN_HEADER_LENGTH:
        raise TruncatedHeader(
            what,
            f"{n} bytes, shorter than the {HEADER_OFFSET + MIN_HEADER_LENGTH}-byte "
            ".ptd header: the file is truncated or empty",
        )
    if bytes(blob[8:12]) != HEADER_MAGIC:
        raise WrongMagic(
            what, f"no FlatTensor header: magic {bytes(blob[8:12])!r} at byte 8, expected {HEADER_MAGIC!r}"
        )
    length, fb_off, fb_size, seg_base, seg_size = struct.unpack_from("<IQQQQ", blob, 12)
    header = PtdHeader(length, fb_off, fb_size, seg_base, seg_size)
    if length < MIN_HEADER_LENGTH:
        raise BadHeader(what, f"header length {length} is below {MIN_HEADER_LENGTH}")
    if HEADER_OFFSET + length > fb_off + fb_size:
        raise BadHeader(
            what, f"header ({length} bytes at byte 8) runs past the flatbuffer's end {header.flatbuffer_end}"
        )
    if header.flatbuffer_end > n:
        raise OffsetOutOfRange(
            what,
            f"flatbuffer ends at byte {header.flatbuffer_end}, past the end of the "
            f"{n}-byte file: the file may be truncated",
        )
    if seg_base + seg_size > n:
        raise OffsetOutOfRange(
            what,
            f"segment data ends at byte {seg_base + seg_size}, past the end of the "
            f"{n}-byte file: the file may be truncated",
        )
    if seg_size and seg_base < header.flatbuffer_end:
        raise BadHeader(
            what, f"segment data at byte {seg_base} overlaps the flatbuffer (ends at {header.flatbuffer_end})"
        )
    return header


def _layout(table: Table | None) -> TensorLayout | None:
    if table is None:
        return None
    return TensorLayout(
        scalar_type=struct.unpack("<b", bytes([table.u8(_TL_SCALAR_TYPE)]))[0],
        sizes=tuple(table.scalars(_TL_SIZES, "i")),
        dim_order=tuple(table.scalars(_TL_DIM_ORDER, "B")),
    )


def read_ptd(source, what: str | None = None) -> Ptd:
    """Parse a .ptd (a path, or bytes) and check every offset, size and key in it.

    Raises a ``FormatError`` subclass naming the file and the first problem.
    """
    blob, what = open_blob(source, what)
    header = read_header(blob, what)
    fb = FlatBuffer(blob, what, 0, header.flatbuffer_end)
    root = fb.root("FlatTensor")
    version = root.u32(_FT_VERSION)
    if version > MAX_VERSION:
        raise UnsupportedVersion(what, f"FlatTensor schema version {version}; this reader knows up to {MAX_VERSION}")

    seg_end = header.segment_base_offset + header.segment_data_size
    segments = []
    for i, t in enumerate(root.tables(_FT_SEGMENTS, "DataSegment")):
        seg = Segment(i, t.u64(_SEG_OFFSET), t.u64(_SEG_SIZE), header.segment_base_offset + t.u64(_SEG_OFFSET))
        if seg.end > seg_end:
            raise OffsetOutOfRange(
                what,
                f"segment {i} ends at byte {seg.end}, past the segment data's end {seg_end}: the file may be truncated",
            )
        segments.append(seg)
    if root.vector(_FT_SEGMENTS, 4) is None or root.vector(_FT_NAMED_DATA, 4) is None:
        raise BadFlatbuffer(what, "FlatTensor has no segments or no named_data table")

    entries, seen = [], set()
    for i, t in enumerate(root.tables(_FT_NAMED_DATA, "NamedData")):
        key_span = t.string_span(_ND_KEY)
        key = t.string(_ND_KEY)
        if not key:
            raise BadFlatbuffer(what, f"named_data[{i}] has no key")
        if key in seen:
            raise BadFlatbuffer(what, f"key {key!r} appears twice")
        seen.add(key)
        index = t.u32(_ND_SEGMENT)
        if index >= len(segments):
            raise BadFlatbuffer(what, f"key {key!r} points at segment {index}, but there are {len(segments)}")
        seg = segments[index]
        layout = _layout(t.table(_ND_LAYOUT, "TensorLayout"))
        if layout is not None:
            problem = layout.problem()
            if problem is None and layout.nbytes > seg.size:
                problem = (
                    f"its layout {layout.dtype}{list(layout.sizes)} needs {layout.nbytes} bytes, "
                    f"its segment holds {seg.size}"
                )
            if problem:
                raise BadFlatbuffer(what, f"key {key!r}: {problem}")
        entries.append(
            PtdEntry(key=key, segment_index=index, start=seg.start, size=seg.size, layout=layout, key_span=key_span)
        )
    return Ptd(what=what, size=len(blob), header=header, version=version, segments=segments, entries=entries, blob=blob)
