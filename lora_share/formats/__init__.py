"""The files lora-share writes: defensive readers, and the writers that assemble or patch them
(byte layouts: schema/FORMAT.md).

    from lora_share.formats import read_pte, read_ptd, FormatError

    ptd = read_ptd("out/tiny/foundation.ptd")      # any FormatError names the file and the problem
    ptd.header                                     # PtdHeader(length, flatbuffer_offset, flatbuffer_size, ...)
    ptd.segments                                   # [Segment(index, offset, size, start)]  start/end: absolute
    ptd.entries                                    # [PtdEntry(key, segment_index, start, size, layout, key_span)]
    ptd.data("model.norm.weight")                  # bytes

    pte = read_pte("out/tiny/tiny_a.pte")
    pte.header                                     # PteHeader(length, program_size, segment_base_offset, ...)
    pte.named_data                                 # [NamedData(key, segment_index, start, size, key_span)]
    pte.delegates                                  # [Delegate(plan, index, id, location, data_index, start, size,
                                                   #           constants=(ConstantRef(key, size, key_span), ...))]
    pte.external_tensors                           # [ExternalTensor(plan, key, layout)]
    pte.external_keys()                            # what it needs from a .ptd

Every ``start``/``size`` and ``key_span`` is an absolute byte range in the
file, checked to lie inside it, so a caller can read or patch those bytes
directly. ``lora_share.formats.meta`` reads and writes lora-share's own
metadata (schema/lora_share.fbs) stored as named data in both files, and
``lora_share.formats.records`` gives the record a parsed file holds (``adapter_record(pte)``,
``foundation_record(ptd)``, ``shared_record(ptd)``);
``lora_share.formats.seal.seal_pte(bytes)`` writes an adapter .pte's seal (size
and CRC-32 of everything but its record) into that record: call it last, after
any in-place edit of a .pte. ``lora_share.formats.pte_write.Template(bytes, what,
drop).write(entries)`` writes a .pte with a template's program, byte for byte,
and other named data.
"""

from .errors import (
    BadFlatbuffer,
    BadHeader,
    Damaged,
    FormatError,
    NotRewritable,
    OffsetOutOfRange,
    TruncatedHeader,
    UnsupportedVersion,
    WrongMagic,
)
from .layout import TensorLayout
from .ptd import Ptd, PtdEntry, PtdHeader, Segment, read_ptd
from .pte import Delegate, ExternalTensor, NamedData, Pte, PteHeader, read_pte
from .xnnpack import ConstantRef

__all__ = [
    "read_ptd",
    "read_pte",
    "Ptd",
    "PtdEntry",
    "PtdHeader",
    "Pte",
    "PteHeader",
    "Segment",
    "NamedData",
    "Delegate",
    "ConstantRef",
    "ExternalTensor",
    "TensorLayout",
    "FormatError",
    "WrongMagic",
    "TruncatedHeader",
    "BadHeader",
    "OffsetOutOfRange",
    "BadFlatbuffer",
    "UnsupportedVersion",
    "Damaged",
    "NotRewritable",
]
