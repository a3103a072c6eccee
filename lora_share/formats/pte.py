"""Read ExecuTorch programs (.pte) defensively: the parts lora-share relies on.

Layout (little-endian; see schema/FORMAT.md)::

    [0:4]   uint32  flatbuffer root table offset
    [4:8]   "ET12"  flatbuffer file identifier
    [8:12]  "eh00"  extended header magic
    [12:16] uint32  extended header length (>= 24; 32 with segment data size)
    [16:24] uint64  program size: the flatbuffer is [0, program size)
    [24:32] uint64  segment base offset
    [32:40] uint64  segment data size
    ...     Program flatbuffer
    [segment base offset ...] segments (named data, delegate payloads, constants)

``read_pte`` returns absolute byte ranges for everything a tool may want to read
or patch in place: segments, named data (and where each key's bytes are),
delegate payloads (inline or in a segment) and the named keys each XNNPACK
payload refers to, plus the tensors the program expects in an external .ptd.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from .blob import KeyedEntries, open_blob
from .errors import BadFlatbuffer, BadHeader, OffsetOutOfRange, TruncatedHeader, UnsupportedVersion, WrongMagic
from .flatbuf import FlatBuffer, Table
from .layout import TensorLayout
from .ptd import Segment
from .xnnpack import ConstantRef, named_constants

FILE_IDENTIFIER = b"ET12"
HEADER_MAGIC = b"eh00"
MIN_HEADER_LENGTH = 24
MAX_VERSION = 0
XNNPACK_ID = "XnnpackBackend"

# Slots (declaration order) in executorch/schema/program.fbs.
_P_VERSION, _P_PLANS, _P_DELEGATE_DATA, _P_SEGMENTS, _P_CONSTANT_SEGMENT, _P_NAMED_DATA = 0, 1, 3, 4, 5, 7
_PLAN_NAME, _PLAN_VALUES, _PLAN_INPUTS, _PLAN_DELEGATES = 0, 2, 3, 7
_EVALUE_TYPE, _EVALUE_VAL = 0, 1
_KERNEL_TYPE_TENSOR = 5
_T_SCALAR_TYPE, _T_SIZES, _T_DIM_ORDER, _T_BUFFER, _T_EXTRA = 0, 2, 3, 5, 9
_EXTRA_FQN, _EXTRA_LOCATION = 1, 2
_LOCATION_EXTERNAL = 1
_DEL_ID, _DEL_PROCESSED = 0, 1
_REF_LOCATION, _REF_INDEX = 0, 1
_INLINE, _SEGMENT = 0, 1
_SEG_OFFSET, _SEG_SIZE = 0, 1
_SUB_SEGMENT, _SUB_OFFSETS = 0, 1
_ND_KEY, _ND_SEGMENT = 0, 1


@dataclass(frozen=True)
class PteHeader:
    """The extended header at byte 8."""

    length: int
    program_size: int
    segment_base_offset: int
    segment_data_size: int


@dataclass(frozen=True)
class NamedData:
    """One entry of the program's own named data: ``start``/``size`` is its absolute byte range."""

    key: str
    segment_index: int
    start: int
    size: int
    key_span: tuple[int, int]  # absolute (position, length) of the key's bytes

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class Delegate:
    """One lowered subgraph: backend ``id``, where its payload is, and the named keys it refers to."""

    plan: str
    index: int
    id: str
    location: str  # "inline" (backend_delegate_data[data_index]) or "segment" (segments[data_index])
    data_index: int
    start: int
    size: int
    constants: tuple[ConstantRef, ...]

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class ExternalTensor:
    """A non-delegated tensor whose data the program expects in an external .ptd under ``key``."""

    plan: str
    key: str
    layout: TensorLayout


@dataclass(frozen=True)
class ConstantTensor:
    """A tensor whose data is in the program's constant segment, at ``start`` .. ``start + nbytes``."""

    plan: str
    buffer: int
    start: int
    layout: TensorLayout

    @property
    def end(self) -> int:
        return self.start + self.layout.nbytes


@dataclass
class Pte(KeyedEntries):
    """A parsed .pte."""

    what: str
    size: int
    header: PteHeader
    version: int
    plans: list[str]
    segments: list[Segment]
    named_data: list[NamedData]
    delegates: list[Delegate]
    external_tensors: list[ExternalTensor]
    constant_segment: int | None
    blob: object = field(repr=False)
    constants: list[ConstantTensor] = field(default_factory=list)
    inputs: dict[str, list[TensorLayout | None]] = field(default_factory=dict)  # per method, None: not a tensor

    def __post_init__(self):
        self._index(self.named_data)

    def stored_tensors(self) -> list[tuple[str, int, int, int]]:
        """(sha256 or key, storage, start, size) of every tensor stored in this file: named data under
        its key (storage: its segment's index), and the constant segment's buffers under the sha256 of
        their bytes (storage: minus the buffer's index, counted once however many tensors point at it)."""
        out = [(e.key, e.segment_index, e.start, e.size) for e in self.named_data]
        seen = set()
        for c in self.constants:
            if c.buffer not in seen:
                seen.add(c.buffer)
                digest = hashlib.sha256(bytes(self.blob[c.start : c.end])).hexdigest()
                out.append((digest, -c.buffer, c.start, c.layout.nbytes))
        return out

    def external_keys(self) -> list[str]:
        """Keys this program must find in an external .ptd: delegate constants it does not
        carry itself, and external tensors; sorted, each once."""
        keys = {c.key for d in self.delegates for c in d.constants if c.key not in self._by_key}
        keys |= {t.key for t in self.external_tensors}
        return sorted(keys)


def read_header(blob, what: str) -> PteHeader:
    """Check magic and extended header of a .pte held in ``blob``; return the header."""
    n = len(blob)
    if n >= 8 and bytes(blob[4:8]) != FILE_IDENTIFIER:
        found = bytes(blob[4:8])
        hint = " (that is an ExecuTorch data file, .ptd)" if found == b"FT01" else ""
        raise WrongMagic(
            what,
            f"not an ExecuTorch program (.pte): identifier {found!r} at byte 4, expected {FILE_IDENTIFIER!r}{hint}",
        )
    if n < 8 + MIN_HEADER_LENGTH:
        raise TruncatedHeader(
            what,
            f"{n} bytes, shorter than the {8 + MIN_HEADER_LENGTH}-byte .pte header: the file is truncated or empty",
        )
    if bytes(blob[8:12]) != HEADER_MAGIC:
        raise WrongMagic(what, f"no extended header: magic {bytes(blob[8:12])!r} at byte 8, expected {HEADER_MAGIC!r}")
    length, program_size, base = struct.unpack_from("<IQQ", blob, 12)
    if length < MIN_HEADER_LENGTH:
        raise BadHeader(what, f"extended header length {length} is below {MIN_HEADER_LENGTH}")
    if length >= 32 and n < 40:
        raise TruncatedHeader(what, f"{n} bytes, shorter than its {8 + length}-byte header: the file is truncated")
    seg_size = struct.unpack_from("<Q", blob, 32)[0] if length >= 32 else max(n - base, 0)
    if 8 + length > program_size:
        raise BadHeader(what, f"extended header ({length} bytes) runs past the program's end {program_size}")
    if program_size > n:
        raise OffsetOutOfRange(
            what,
            f"program flatbuffer ends at byte {program_size}, past the end of the "
            f"{n}-byte file: the file may be truncated",
        )
    if base + seg_size > n:
        raise OffsetOutOfRange(
            what,
            f"segment data ends at byte {base + seg_size}, past the end of the "
            f"{n}-byte file: the file may be truncated",
        )
    if seg_size and base < program_size:
        raise BadHeader(what, f"segment data at byte {base} overlaps the program (ends at {program_size})")
    return PteHeader(length, program_size, base, seg_size)


def _segments(root: Table, header: PteHeader, what: str) -> list[Segment]:
    seg_end = header.segment_base_offset + header.segment_data_size
    out = []
    for i, t in enumerate(root.tables(_P_SEGMENTS, "DataSegment")):
        seg = Segment(i, t.u64(_SEG_OFFSET), t.u64(_SEG_SIZE), header.segment_base_offset + t.u64(_SEG_OFFSET))
        if seg.end > seg_end:
            raise OffsetOutOfRange(
                what,
                f"segment {i} ends at byte {seg.end}, past the segment data's end {seg_end}: the file may be truncated",
            )
        out.append(seg)
    return out


def _named_data(root: Table, segments: list[Segment], what: str) -> list[NamedData]:
    out, seen = [], set()
    for i, t in enumerate(root.tables(_P_NAMED_DATA, "NamedData")):
        key = t.string(_ND_KEY)
        if not key:
            raise BadFlatbuffer(what, f"named_data[{i}] has no key")
        if key in seen:
            raise BadFlatbuffer(what, f"named data key {key!r} appears twice")
        seen.add(key)
        index = t.u32(_ND_SEGMENT)
        if index >= len(segments):
            raise BadFlatbuffer(what, f"named data {key!r} points at segment {index}, but there are {len(segments)}")
        out.append(NamedData(key, index, segments[index].start, segments[index].size, t.string_span(_ND_KEY)))
    return out


def _delegates(root: Table, plan: Table, plan_name: str, segments, blob, what: str) -> list[Delegate]:
    inline = root.tables(_P_DELEGATE_DATA, "BackendDelegateInlineData")
    out = []
    for i, d in enumerate(plan.tables(_PLAN_DELEGATES, "BackendDelegate")):
        ref = d.table(_DEL_PROCESSED, "BackendDelegateDataReference")
        if ref is None:
            raise BadFlatbuffer(what, f"{plan_name}: delegate {i} has no payload reference")
        location, index = ref.u8(_REF_LOCATION), ref.u32(_REF_INDEX)
        if location == _INLINE and index < len(inline):
            span = inline[index].vector(0, 1) or (inline[index].pos, 0)
        elif location == _SEGMENT and index < len(segments):
            span = (segments[index].start, segments[index].size)
        else:
            raise BadFlatbuffer(
                what, f"{plan_name}: delegate {i} points at missing payload {index} (location {location})"
            )
        backend = d.string(_DEL_ID) or ""
        consts = named_constants(blob, what, *span) if backend == XNNPACK_ID else []
        out.append(
            Delegate(
                plan=plan_name,
                index=i,
                id=backend,
                location="inline" if location == _INLINE else "segment",
                data_index=index,
                start=span[0],
                size=span[1],
                constants=tuple(consts),
            )
        )
    return out


def _tensors(plan: Table):
    for v in plan.tables(_PLAN_VALUES, "EValue"):
        if v.u8(_EVALUE_TYPE) == _KERNEL_TYPE_TENSOR and (t := v.table(_EVALUE_VAL, "Tensor")) is not None:
            yield t


def _inputs(plan: Table, plan_name: str, what: str) -> list[TensorLayout | None]:
    """The layout (upper-bound sizes) of each input of ``plan``; None for an input that is not a tensor."""
    values = plan.tables(_PLAN_VALUES, "EValue")
    out = []
    for index in plan.scalars(_PLAN_INPUTS, "i"):
        if not 0 <= index < len(values):
            raise BadFlatbuffer(what, f"{plan_name}: an input points at value {index}, but there are {len(values)}")
        v = values[index]
        t = v.table(_EVALUE_VAL, "Tensor") if v.u8(_EVALUE_TYPE) == _KERNEL_TYPE_TENSOR else None
        out.append(_layout(t) if t is not None else None)
    return out


def _layout(t: Table) -> TensorLayout:
    return TensorLayout(
        struct.unpack("<b", bytes([t.u8(_T_SCALAR_TYPE)]))[0],
        tuple(t.scalars(_T_SIZES, "i")),
        tuple(t.scalars(_T_DIM_ORDER, "B")),
    )


def _is_external(t: Table) -> bool:
    extra = t.table(_T_EXTRA, "ExtraTensorInfo")
    return extra is not None and extra.u8(_EXTRA_LOCATION) == _LOCATION_EXTERNAL


def _external_tensors(plan: Table, plan_name: str, what: str) -> list[ExternalTensor]:
    out = []
    for t in _tensors(plan):
        if not _is_external(t):
            continue
        key = t.table(_T_EXTRA, "ExtraTensorInfo").string(_EXTRA_FQN)
        if not key:
            raise BadFlatbuffer(what, f"{plan_name}: an external tensor has no name")
        out.append(ExternalTensor(plan_name, key, _layout(t)))
    return out


def _constant_tensors(
    plan: Table, plan_name: str, segment: Segment, offsets: list[int], what: str
) -> list[ConstantTensor]:
    """Tensors of ``plan`` with data in the constant segment (buffer 0 is the empty placeholder)."""
    out = []
    for t in _tensors(plan):
        index = t.u32(_T_BUFFER)
        if index == 0 or _is_external(t):
            continue
        if index >= len(offsets):
            raise BadFlatbuffer(
                what, f"{plan_name}: a tensor points at constant buffer {index}, but there are {len(offsets)}"
            )
        layout = _layout(t)
        if layout.problem():
            raise BadFlatbuffer(what, f"{plan_name}: constant buffer {index}: {layout.problem()}")
        c = ConstantTensor(plan_name, index, segment.start + offsets[index], layout)
        if offsets[index] > segment.size or c.end > segment.end:
            raise OffsetOutOfRange(
                what,
                f"{plan_name}: constant buffer {index} ends at byte {c.end}, past its "
                f"segment's end ({segment.end}): the file may be truncated",
            )
        out.append(c)
    return out


def read_pte(source, what: str | None = None, plans: bool = True) -> Pte:
    """Parse a .pte (a path, or bytes) and check every offset, size and key lora-share reads.

    ``plans=False`` reads the header, segments and named data only (their checks included), not the
    methods' tensors, inputs and delegates: what a reader of the adapter record and the stored
    tensors needs, in a fraction of the time for a large program.
    Raises a ``FormatError`` subclass naming the file and the first problem.
    """
    blob, what = open_blob(source, what)
    header = read_header(blob, what)
    fb = FlatBuffer(blob, what, 0, header.program_size)
    root = fb.root("Program")
    version = root.u32(_P_VERSION)
    if version > MAX_VERSION:
        raise UnsupportedVersion(what, f"Program schema version {version}; this reader knows up to {MAX_VERSION}")
    segments = _segments(root, header, what)
    named = _named_data(root, segments, what)
    const = root.table(_P_CONSTANT_SEGMENT, "SubsegmentOffsets")
    const_index = const.u32(_SUB_SEGMENT) if const is not None and const.vector(_SUB_OFFSETS, 8) else None
    if const_index is not None and const_index >= len(segments):
        raise BadFlatbuffer(what, f"constant segment {const_index} does not exist ({len(segments)} segments)")
    offsets = const.scalars(_SUB_OFFSETS, "Q") if const_index is not None else []
    read_plans = plans
    plans, delegates, external, constants, inputs = [], [], [], [], {}
    tables = root.tables(_P_PLANS, "ExecutionPlan")
    for p in tables if read_plans else ():
        name = p.string(_PLAN_NAME) or ""
        plans.append(name)
        inputs[name] = _inputs(p, name, what)
        delegates += _delegates(root, p, name, segments, blob, what)
        external += _external_tensors(p, name, what)
        if const_index is not None:
            constants += _constant_tensors(p, name, segments[const_index], offsets, what)
    if not tables:
        raise BadFlatbuffer(what, "the program has no methods")
    return Pte(
        what=what,
        size=len(blob),
        header=header,
        version=version,
        plans=plans,
        segments=segments,
        named_data=named,
        delegates=delegates,
        external_tensors=external,
        constant_segment=const_index,
        blob=blob,
        constants=constants,
        inputs=inputs,
    )
