"""Write a .pte with other named data: a template's program, byte for byte, plus new entries.

An ExecuTorch program (.pte) is a ``Program`` flatbuffer, an extended header inserted after
its file identifier, then segments (formats/pte.py, schema/FORMAT.md). Only two of the
Program's fields say where named data is: ``segments`` and ``named_data``. Everything else
stays as it is, so ``Template.write`` builds a new flatbuffer with the ``flatbuffers`` Builder that

- holds the template's program region (below) verbatim, as a ubyte vector created first: the
  Builder lays a buffer out back to front, so the region ends the buffer, and it starts at the
  same position modulo 8 (the largest alignment of a field in it; modulo ``FLATBUFFER_ALIGNMENT``
  when it holds bytes of a force_align(16) vector, which lora-share's programs keep in segments)
  as in the template, so every relative offset inside it stays valid and every aligned field
  aligned (ExecuTorch's own writer puts a program's vectors at either phase modulo 16, depending
  on what follows them);
- writes a new root table: the template's version; ``execution_plan``, ``constant_buffer`` and
  ``backend_delegate_data`` pointing into the region; ``constant_segment`` and
  ``mutable_data_segments`` written again with the template's values (a segment index and a few
  offsets each: ExecuTorch's writer puts them below its ``segments`` vector, which embedding them
  would drag into the region); and new ``segments`` and ``named_data`` vectors;

then inserts the extended header as ExecuTorch's ``_insert_flatbuffer_header`` does and appends
the template's kept segments (delegate payloads, constants, its own named data: the bytes
from the segment base to the last kept segment's end, verbatim, at the offsets they had) and the
new entries, each at an offset that is a multiple of ``lcm(SEGMENT_ALIGNMENT, its alignment)``,
as ExecuTorch's ``serialize_pte_binary`` places segments, from a segment base aligned to every
new entry's alignment as well.

The program region is the template's flatbuffer from the lowest of the three vectors it
points into, rounded down to that alignment (the bytes below the vector zeroed), to the
flatbuffer's end, zero-padded to a multiple of ``FLATBUFFER_ALIGNMENT``. Flatbuffer offsets to tables,
vectors and strings are unsigned and point forward, and a Builder writes a table's vtable just below the table (above
its parent) or reuses one written earlier (higher), so the region holds everything those
vectors reach. In a file this module wrote, the region is exactly the embedded vector: writing
from an adapter file gives the same bytes as writing from the program it was written from,
whatever named data either had.

Segment indices in the kept fields and kept named data do not move, so the entries left out
must own the template's last segments (lora-share's files put an adapter's entries last); any
other template is refused with ``NotRewritable``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import flatbuffers

from .errors import BadFlatbuffer, NotRewritable, UnsupportedVersion
from .flatbuf import FlatBuffer, Table
from .pte import (
    _DEL_PROCESSED,
    _PLAN_DELEGATES,
    _REF_INDEX,
    _REF_LOCATION,
    _SEGMENT,
    _SUB_OFFSETS,
    _SUB_SEGMENT,
    FILE_IDENTIFIER,
    HEADER_MAGIC,
    PteHeader,
    read_pte,
)

SEGMENT_ALIGNMENT = 128  # serialize_pte_binary's default segment alignment
FLATBUFFER_ALIGNMENT = 16  # the largest force_align in program.fbs: ExecuTorch pads its header to it
HEADER_LENGTH = 32  # the extended header with the segment data size (a multiple of FLATBUFFER_ALIGNMENT)

# program.fbs's Program, fields in declaration order (the slot is the index).
PROGRAM_FIELDS = (
    "version",
    "execution_plan",
    "constant_buffer",
    "backend_delegate_data",
    "segments",
    "constant_segment",
    "mutable_data_segments",
    "named_data",
)
_VERSION, _PLANS, _SEGMENTS, _CONSTANT_SEGMENT, _MUTABLE, _NAMED = 0, 1, 4, 5, 6, 7
_EMBEDDED = (1, 2, 3)  # vectors pointed at in the embedded program region
_CONSTANT_BUFFERS, _INLINE_DELEGATES = 2, 3  # Buffer and BackendDelegateInlineData: one ubyte vector each
_INNER_ALIGNMENT = 8  # the largest alignment of program.fbs's fields but its force_align(16) vectors
_DS_OFFSET, _DS_SIZE = 0, 1  # DataSegment
_ND_KEY, _ND_SEGMENT = 0, 1  # NamedData


@dataclass(frozen=True)
class Entry:
    """One named-data entry to write: its key, bytes, and the alignment its segment needs."""

    key: str
    data: bytes
    alignment: int


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


class Template:
    """A .pte's program and own named data, ready to be written with other named data.

    ``drop``: keys of the template's named data to leave out (absent keys are ignored); their
    segments must be the template's last ones, and nothing kept may refer to them.
    Raises a ``FormatError`` naming ``what`` for a template that is malformed or cannot be rewritten.
    """

    def __init__(self, pte: bytes, what: str, drop: Iterable[str] = ()):
        pte = bytes(pte)
        parsed = read_pte(pte, what, plans=False)
        self._pte, self.what = pte, what
        header = self._header = parsed.header
        root = FlatBuffer(pte, what, 0, header.program_size).root("Program")
        unknown = [s for s in range(len(PROGRAM_FIELDS), (root.vt_size - 4) // 2) if root.has(s)]
        if unknown:  # a newer schema's field, which a rewrite would lose
            raise UnsupportedVersion(
                what,
                f"its Program has field slot(s) {unknown}, past the {len(PROGRAM_FIELDS)} "
                "fields of the program.fbs this writer knows",
            )
        self._version = root.u32(_VERSION)
        self._constant = self._subsegments(root.table(_CONSTANT_SEGMENT, "SubsegmentOffsets"))
        self._mutable = (
            [self._subsegments(t) for t in root.tables(_MUTABLE, "SubsegmentOffsets")] if root.has(_MUTABLE) else None
        )
        drop = set(drop)
        self.kept = [e for e in parsed.named_data if e.key not in drop]
        dropped = {e.segment_index for e in parsed.named_data if e.key in drop}
        n = len(parsed.segments)
        self._n_kept = n - len(dropped)
        if dropped != set(range(self._n_kept, n)):
            raise NotRewritable(
                what,
                f"the named data to leave out is in segments {sorted(dropped)}, not the last "
                f"{len(dropped)} of its {n}: its other segments would have to move",
            )
        late = [
            (name, i) for name, i in self._segment_references(root.tables(_PLANS, "ExecutionPlan")) if i >= self._n_kept
        ]
        if late:
            name, i = late[0]
            raise NotRewritable(
                what,
                f"{name} refers to segment {i}, one of the last {len(dropped)} that hold the named data to leave out",
            )
        self._segments = [(s.offset, s.size) for s in parsed.segments[: self._n_kept]]
        self._region, self._fields = self._program_region(pte, root, header)

    @staticmethod
    def _subsegments(table: Table | None) -> tuple[int, list[int] | None] | None:
        """A SubsegmentOffsets' (segment index, offsets); None where the table or its vector is absent."""
        if table is None:
            return None
        return table.u32(_SUB_SEGMENT), table.scalars(_SUB_OFFSETS, "Q") if table.has(_SUB_OFFSETS) else None

    def _segment_references(self, plans: list[Table]):
        """(what, segment index) of everything in the program that names a segment."""
        for e in self.kept:
            yield f"named data {e.key!r}", e.segment_index
        if self._constant is not None and self._constant[1]:
            yield "the constant segment", self._constant[0]
        for i, (index, _) in enumerate(self._mutable or []):
            yield f"mutable data segment {i}", index
        for plan in plans:
            for j, d in enumerate(plan.tables(_PLAN_DELEGATES, "BackendDelegate")):
                ref = d.table(_DEL_PROCESSED, "BackendDelegateDataReference")
                if ref is not None and ref.u8(_REF_LOCATION) == _SEGMENT:
                    yield f"delegate {j}'s payload", ref.u32(_REF_INDEX)

    def _program_region(self, pte: bytes, root: Table, header: PteHeader) -> tuple[bytes, dict[int, int]]:
        """The program region (module docstring) and, per kept field present, its position in it."""
        targets, low = {}, header.program_size
        for slot in _EMBEDDED:
            if (vector := root.vector(slot, 4)) is not None:  # checked to lie inside the flatbuffer
                targets[slot] = vector[0] - 4  # its length
                low = min(low, targets[slot])
        phase = _INNER_ALIGNMENT if not self._inline_data(root) else FLATBUFFER_ALIGNMENT
        start = low - low % phase
        if start < 8 + header.length:
            raise BadFlatbuffer(self.what, f"the program's fields reach byte {low}, inside its header")
        # The bytes below the lowest vector belong to no kept field: zeros, whatever the template had there.
        region = bytes(low - start) + pte[low : header.program_size]
        region += bytes(-len(region) % FLATBUFFER_ALIGNMENT)
        return region, {slot: t - start for slot, t in targets.items()}

    @staticmethod
    def _inline_data(root: Table) -> bool:
        """Whether the region holds bytes of a force_align(16) vector (a constant buffer's storage, a
        delegate's inline payload): then it keeps the template's phase modulo 16. lora-share's programs
        keep both in segments, so their region keeps the phase of its 8-byte fields only, the same
        whichever file it is read from (module docstring)."""
        buffers = root.tables(_CONSTANT_BUFFERS, "Buffer")
        inline = root.tables(_INLINE_DELEGATES, "BackendDelegateInlineData")
        return any((v := t.vector(0, 1)) is not None and v[1] > 0 for t in [*buffers, *inline])

    def write(self, entries: Sequence[Entry]) -> bytes:
        """The .pte of the template's program with its kept named data, then ``entries`` in order,
        each in a segment of its own."""
        keys = [e.key for e in self.kept] + [e.key for e in entries]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise ValueError(f"{self.what}: named data key {dup!r} would appear twice")
        kept_end = max((offset + size for offset, size in self._segments), default=0)
        at = self._header.segment_base_offset
        data, segments, end = [self._pte[at : at + kept_end]], list(self._segments), kept_end
        for e in entries:
            offset = _aligned(end, math.lcm(SEGMENT_ALIGNMENT, e.alignment))
            data += [bytes(offset - end), e.data]
            segments.append((offset, len(e.data)))
            end = offset + len(e.data)
        flatbuffer = self._flatbuffer(
            segments,
            [(e.key, e.segment_index) for e in self.kept] + [(e.key, self._n_kept + i) for i, e in enumerate(entries)],
        )
        # The header goes after the file identifier, as ExecuTorch inserts it: only the root offset crosses it.
        program_size = HEADER_LENGTH + len(flatbuffer)
        # Segment offsets are relative to the base: it is aligned for every new entry too, so each
        # entry's absolute position is (ExecuTorch aligns the base to its segment alignment only).
        base = _aligned(program_size, math.lcm(SEGMENT_ALIGNMENT, *(e.alignment for e in entries)))
        root = struct.unpack_from("<I", flatbuffer)[0] + HEADER_LENGTH
        header = HEADER_MAGIC + struct.pack("<IQQQ", HEADER_LENGTH, program_size, base, end)
        return b"".join(
            [struct.pack("<I", root), flatbuffer[4:8], header, flatbuffer[8:], bytes(base - program_size), *data]
        )

    def _flatbuffer(self, segments: list[tuple[int, int]], named: list[tuple[str, int]]) -> bytes:
        """The Program flatbuffer (no extended header): the region, then the new tables and root."""
        b = flatbuffers.Builder(len(self._region) + 128 * (len(segments) + len(named)) + 256)
        b.StartVector(1, len(self._region), FLATBUFFER_ALIGNMENT)
        b.head -= len(self._region)
        b.Bytes[b.head : b.head + len(self._region)] = self._region
        start = b.Offset()  # Builder offsets count back from the buffer's end: this is the region's start
        b.EndVector()
        names = [b.CreateString(key) for key, _ in named]
        tables = []
        for name, (_, index) in zip(names, named):
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(_ND_KEY, name, None)
            b.PrependUint32Slot(_ND_SEGMENT, index, 0)
            tables.append(b.EndObject())
        named_vector = self._vector(b, tables)
        tables = []
        for offset, size in segments:
            b.StartObject(2)
            b.PrependUint64Slot(_DS_OFFSET, offset, 0)
            b.PrependUint64Slot(_DS_SIZE, size, 0)
            tables.append(b.EndObject())
        segments_vector = self._vector(b, tables)
        constant = self._subsegments_table(b, self._constant)
        mutable = (
            None if self._mutable is None else self._vector(b, [self._subsegments_table(b, m) for m in self._mutable])
        )
        b.StartObject(len(PROGRAM_FIELDS))
        b.PrependUint32Slot(_VERSION, self._version, 0)
        for slot, at in self._fields.items():
            b.PrependUOffsetTRelativeSlot(slot, start - at, None)
        b.PrependUOffsetTRelativeSlot(_SEGMENTS, segments_vector, None)
        b.PrependUOffsetTRelativeSlot(_CONSTANT_SEGMENT, constant, None)  # None: absent, as in the template
        b.PrependUOffsetTRelativeSlot(_MUTABLE, mutable, None)
        b.PrependUOffsetTRelativeSlot(_NAMED, named_vector, None)
        b.Finish(b.EndObject(), file_identifier=FILE_IDENTIFIER)
        return bytes(b.Output())

    @staticmethod
    def _subsegments_table(b: flatbuffers.Builder, value: tuple[int, list[int] | None] | None) -> int | None:
        if value is None:
            return None
        index, offsets = value
        vector = None
        if offsets is not None:
            b.StartVector(8, len(offsets), 8)
            for o in reversed(offsets):
                b.PrependUint64(o)
            vector = b.EndVector()
        b.StartObject(2)
        b.PrependUint32Slot(_SUB_SEGMENT, index, 0)
        b.PrependUOffsetTRelativeSlot(_SUB_OFFSETS, vector, None)  # absent if it was
        return b.EndObject()

    @staticmethod
    def _vector(b: flatbuffers.Builder, tables: list[int]) -> int:
        b.StartVector(4, len(tables), 4)
        for t in reversed(tables):
            b.PrependUOffsetTRelative(t)
        return b.EndVector()
