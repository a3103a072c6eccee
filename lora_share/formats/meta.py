"""lora-share's own metadata (schema/lora_share.fbs), written with the
``flatbuffers`` package's Builder and read back with the bounds-checked reader.

The foundation's record is stored in foundation.ptd under ``FOUNDATION_KEY``;
an adapter's in its .pte under ``ADAPTER_KEY``; the shared adapter tensors'
in adapters_shared.ptd under ``SHARED_KEY``. Encoded records are padded with
zeros to a multiple of ``FOUNDATION_PAD`` / ``ADAPTER_PAD`` / ``SHARED_PAD`` bytes.

An adapter record also says which program its file carries (``program_sha256``), the
program's LoRA envelope (its slots in input order and their largest rank) and, for each
slot the adapter has, its rank and the keys of its A and B: the sha256 of their bytes, a
named-data key of the .pte, or of adapters_shared.ptd for a tensor the build hoisted there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import flatbuffers

from .errors import BadFlatbuffer, UnsupportedVersion
from .flatbuf import FlatBuffer, Table

FOUNDATION_KEY = "lora_share.foundation"
ADAPTER_KEY = "lora_share.adapter"
SHARED_KEY = "lora_share.shared"
FILE_IDENTIFIER = b"LSM1"
# 2: adapter records carry the program's envelope and the adapter's LoRA tensor keys (adapters as data).
FORMAT_VERSION = 2
FOUNDATION_PAD = 256
ADAPTER_PAD = 1024
SHARED_PAD = 256

# Slots, in declaration order of schema/lora_share.fbs.
_M_VERSION, _M_FOUNDATION, _M_ADAPTER, _M_SHARED = 0, 1, 2, 3
_F_FINGERPRINT, _F_TENSORS, _F_PARAMS, _F_BYTES, _F_TIED = 0, 1, 2, 3, 4
(
    _A_NAME,
    _A_FINGERPRINT,
    _A_RANK,
    _A_ALPHA,
    _A_TARGETS,
    _A_LAYERS,
    _A_RSLORA,
    _A_KIND,
    _A_SOURCE,
    _A_HASHES,
    _A_LORA_BYTES,
    _A_CONTENT_BYTES,
    _A_CONTENT_CRC,
    _A_PROGRAM,
    _A_MAX_RANK,
    _A_ENVELOPE,
    _A_LORA,
    _A_ENVELOPE_PROGRAM,
    _A_PATCHES,
    _A_SLOT_PATCHES,
) = range(20)
_H_FILE, _H_SHA = 0, 1
_E_LAYER, _E_TARGET = 0, 1
_L_SLOT, _L_RANK, _L_A, _L_B = 0, 1, 2, 3
_S_FINGERPRINT, _S_TENSORS, _S_BYTES = 0, 1, 2


@dataclass
class FoundationMeta:
    """The foundation record: its layout-independent fingerprint and sizes."""

    fingerprint: str
    tensor_count: int
    parameter_count: int
    tensor_bytes: int
    tied_embeddings: bool


@dataclass
class LoraTensors:
    """One envelope slot of an adapter: its rank and the keys of A [rank, in] and B [out, rank]."""

    slot: int
    rank: int
    a: str
    b: str


@dataclass
class AdapterMeta:
    """An adapter record: who it is and which foundation (by fingerprint) it needs."""

    name: str
    foundation_fingerprint: str
    rank: int
    alpha: float
    targets: list[str]
    layers: list[int]
    use_rslora: bool
    source_kind: str
    source: str
    source_hashes: dict[str, str] = field(default_factory=dict)
    lora_bytes: int = 0
    content_bytes: int = 0  # the seal (formats.seal): file size and CRC-32 of the rest of the file
    content_crc32: int = 0
    program_sha256: str = ""  # the program this file carries (adapter_pte.Program.sha256)
    envelope_max_rank: int = 0
    envelope: list[tuple[int, str]] = field(default_factory=list)  # (layer, linear) per slot, in input order
    lora: list[LoraTensors] = field(default_factory=list)  # the slots the adapter has, by envelope index
    # When the file's program skips the slots the adapter leaves alone (xnnpack_prune): the program
    # it was derived from, and 4 uint32 per rewrite (segment, offset, original value, value written).
    envelope_program_sha256: str = ""
    program_patches: list[int] = field(default_factory=list)
    # Every envelope slot's rewrites that make its LoRA dead code in the program this file carries, for
    # a runtime to skip the slots a call leaves alone (xnnpack_prune.slot_patches): 5 uint32 per
    # rewrite (slot, segment, offset, original value, value written).
    slot_patches: list[int] = field(default_factory=list)


@dataclass
class SharedMeta:
    """The record of adapters_shared.ptd: LoRA tensors several adapters share, for which foundation."""

    foundation_fingerprint: str
    tensor_count: int
    tensor_bytes: int


@dataclass
class Metadata:
    """One decoded record: exactly one of ``foundation`` / ``adapter`` / ``shared`` is set in files
    lora-share writes."""

    format_version: int
    foundation: FoundationMeta | None = None
    adapter: AdapterMeta | None = None
    shared: SharedMeta | None = None


def _pad(data: bytes, pad: int) -> bytes:
    return data + b"\0" * (-len(data) % pad)


def _strings(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _finish(b: flatbuffers.Builder, slot: int, table: int, pad: int) -> bytes:
    b.StartObject(4)
    b.PrependUint32Slot(_M_VERSION, FORMAT_VERSION, 0)
    b.PrependUOffsetTRelativeSlot(slot, table, 0)
    b.Finish(b.EndObject(), file_identifier=FILE_IDENTIFIER)
    return _pad(bytes(b.Output()), pad)


def encode_foundation(m: FoundationMeta) -> bytes:
    """The foundation record as stored under ``FOUNDATION_KEY``."""
    b = flatbuffers.Builder(256)
    fp = b.CreateString(m.fingerprint)
    b.StartObject(5)
    b.PrependUOffsetTRelativeSlot(_F_FINGERPRINT, fp, 0)
    b.PrependUint32Slot(_F_TENSORS, m.tensor_count, 0)
    b.PrependUint64Slot(_F_PARAMS, m.parameter_count, 0)
    b.PrependUint64Slot(_F_BYTES, m.tensor_bytes, 0)
    b.PrependBoolSlot(_F_TIED, m.tied_embeddings, False)
    return _finish(b, _M_FOUNDATION, b.EndObject(), FOUNDATION_PAD)


def encode_adapter(m: AdapterMeta) -> bytes:
    """The adapter record as stored under ``ADAPTER_KEY``."""
    b = flatbuffers.Builder(512)
    hashes = []
    for file, sha in sorted(m.source_hashes.items()):
        f, s = b.CreateString(file), b.CreateString(sha)
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(_H_FILE, f, 0)
        b.PrependUOffsetTRelativeSlot(_H_SHA, s, 0)
        hashes.append(b.EndObject())
    hashes_vec = _strings(b, hashes)
    envelope = []
    for layer, target in m.envelope:
        t = b.CreateString(target)
        b.StartObject(2)
        b.PrependUint32Slot(_E_LAYER, layer, 0)
        b.PrependUOffsetTRelativeSlot(_E_TARGET, t, 0)
        envelope.append(b.EndObject())
    envelope_vec = _strings(b, envelope)
    lora = []
    for entry in m.lora:
        a, b_key = b.CreateString(entry.a), b.CreateString(entry.b)
        b.StartObject(4)
        b.PrependUint32Slot(_L_SLOT, entry.slot, 0)
        b.PrependUint32Slot(_L_RANK, entry.rank, 0)
        b.PrependUOffsetTRelativeSlot(_L_A, a, 0)
        b.PrependUOffsetTRelativeSlot(_L_B, b_key, 0)
        lora.append(b.EndObject())
    lora_vec = _strings(b, lora)
    program = b.CreateString(m.program_sha256)
    envelope_program = b.CreateString(m.envelope_program_sha256) if m.envelope_program_sha256 else None
    patches = _uint32s(b, m.program_patches)
    slot_patches = _uint32s(b, m.slot_patches)
    targets = _strings(b, [b.CreateString(t) for t in m.targets])
    b.StartVector(4, len(m.layers), 4)
    for layer in reversed(m.layers):
        b.PrependUint32(layer)
    layers = b.EndVector()
    name, fp, kind, source = (b.CreateString(s) for s in (m.name, m.foundation_fingerprint, m.source_kind, m.source))
    b.StartObject(20)
    b.PrependUOffsetTRelativeSlot(_A_NAME, name, 0)
    b.PrependUOffsetTRelativeSlot(_A_FINGERPRINT, fp, 0)
    b.PrependUint32Slot(_A_RANK, m.rank, 0)
    b.PrependFloat64Slot(_A_ALPHA, m.alpha, 0.0)
    b.PrependUOffsetTRelativeSlot(_A_TARGETS, targets, 0)
    b.PrependUOffsetTRelativeSlot(_A_LAYERS, layers, 0)
    b.PrependBoolSlot(_A_RSLORA, m.use_rslora, False)
    b.PrependUOffsetTRelativeSlot(_A_KIND, kind, 0)
    b.PrependUOffsetTRelativeSlot(_A_SOURCE, source, 0)
    b.PrependUOffsetTRelativeSlot(_A_HASHES, hashes_vec, 0)
    b.PrependUint64Slot(_A_LORA_BYTES, m.lora_bytes, 0)
    # The seal's fields are always written, zero or not: sealing then rewrites the record at its
    # size, whatever the values (an omitted default would grow the record by 12 bytes, past its
    # padding when it sits near a multiple of ADAPTER_PAD).
    b.ForceDefaults(True)
    b.PrependUint64Slot(_A_CONTENT_BYTES, m.content_bytes, 0)
    b.PrependUint32Slot(_A_CONTENT_CRC, m.content_crc32, 0)
    b.ForceDefaults(False)
    b.PrependUOffsetTRelativeSlot(_A_PROGRAM, program, 0)
    b.PrependUint32Slot(_A_MAX_RANK, m.envelope_max_rank, 0)
    b.PrependUOffsetTRelativeSlot(_A_ENVELOPE, envelope_vec, 0)
    b.PrependUOffsetTRelativeSlot(_A_LORA, lora_vec, 0)
    if envelope_program is not None:
        b.PrependUOffsetTRelativeSlot(_A_ENVELOPE_PROGRAM, envelope_program, 0)
    if patches is not None:
        b.PrependUOffsetTRelativeSlot(_A_PATCHES, patches, 0)
    if slot_patches is not None:
        b.PrependUOffsetTRelativeSlot(_A_SLOT_PATCHES, slot_patches, 0)
    return _finish(b, _M_ADAPTER, b.EndObject(), ADAPTER_PAD)


def _uint32s(b: flatbuffers.Builder, values: list[int]) -> int | None:
    """A vector of uint32, or None (the field left out) when ``values`` is empty."""
    if not values:
        return None
    b.StartVector(4, len(values), 4)
    for value in reversed(values):
        b.PrependUint32(value)
    return b.EndVector()


def encode_shared(m: SharedMeta) -> bytes:
    """The shared-tensors record as stored under ``SHARED_KEY``."""
    b = flatbuffers.Builder(128)
    fp = b.CreateString(m.foundation_fingerprint)
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(_S_FINGERPRINT, fp, 0)
    b.PrependUint32Slot(_S_TENSORS, m.tensor_count, 0)
    b.PrependUint64Slot(_S_BYTES, m.tensor_bytes, 0)
    return _finish(b, _M_SHARED, b.EndObject(), SHARED_PAD)


def decode(data: bytes, what: str) -> Metadata:
    """Decode a record (either kind); ``what`` names where it came from in errors."""
    fb = FlatBuffer(data, what)
    if fb.identifier() != FILE_IDENTIFIER:
        raise BadFlatbuffer(
            what, f"lora-share metadata has identifier {fb.identifier()!r}, expected {FILE_IDENTIFIER!r}"
        )
    root = fb.root("Metadata")
    version = root.u32(_M_VERSION)
    if version != FORMAT_VERSION:
        raise UnsupportedVersion(what, f"lora-share metadata version {version}; this lora-share reads {FORMAT_VERSION}")
    out = Metadata(version)
    f = root.table(_M_FOUNDATION, "Foundation")
    if f is not None:
        out.foundation = FoundationMeta(
            _text(f, _F_FINGERPRINT), f.u32(_F_TENSORS), f.u64(_F_PARAMS), f.u64(_F_BYTES), bool(f.u8(_F_TIED))
        )
    a = root.table(_M_ADAPTER, "Adapter")
    if a is not None:
        hashes = {_text(h, _H_FILE): _text(h, _H_SHA) for h in a.tables(_A_HASHES, "SourceHash")}
        out.adapter = AdapterMeta(
            name=_text(a, _A_NAME),
            foundation_fingerprint=_text(a, _A_FINGERPRINT),
            rank=a.u32(_A_RANK),
            alpha=a.f64(_A_ALPHA),
            targets=a.strings(_A_TARGETS),
            layers=a.scalars(_A_LAYERS, "I"),
            use_rslora=bool(a.u8(_A_RSLORA)),
            source_kind=_text(a, _A_KIND),
            source=_text(a, _A_SOURCE),
            source_hashes=hashes,
            lora_bytes=a.u64(_A_LORA_BYTES),
            content_bytes=a.u64(_A_CONTENT_BYTES),
            content_crc32=a.u32(_A_CONTENT_CRC),
            program_sha256=_text(a, _A_PROGRAM),
            envelope_max_rank=a.u32(_A_MAX_RANK),
            envelope=[(e.u32(_E_LAYER), _text(e, _E_TARGET)) for e in a.tables(_A_ENVELOPE, "EnvelopeSlot")],
            lora=[
                LoraTensors(t.u32(_L_SLOT), t.u32(_L_RANK), _text(t, _L_A), _text(t, _L_B))
                for t in a.tables(_A_LORA, "LoraTensors")
            ],
            envelope_program_sha256=_text(a, _A_ENVELOPE_PROGRAM),
            program_patches=a.scalars(_A_PATCHES, "I"),
            slot_patches=a.scalars(_A_SLOT_PATCHES, "I"),
        )
        for key, values, per in (
            ("program patch", out.adapter.program_patches, 4),
            ("slot patch", out.adapter.slot_patches, 5),
        ):
            if len(values) % per:
                raise BadFlatbuffer(
                    what, f"adapter record: {len(values)} {key} values, not a multiple of {per}: the record is damaged"
                )
    s = root.table(_M_SHARED, "Shared")
    if s is not None:
        out.shared = SharedMeta(_text(s, _S_FINGERPRINT), s.u32(_S_TENSORS), s.u64(_S_BYTES))
    return out


def _text(t: Table, slot: int) -> str:
    return t.string(slot) or ""
