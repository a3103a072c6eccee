"""The seal of an adapter .pte: its size and the CRC-32 of every byte outside its
own lora-share record, stored in that record.

The record's segment lies outside the Program flatbuffer and has a fixed,
padded size, so sealing rewrites only the record's bytes: no offset moves. A
flipped bit or a truncation anywhere else in the file (program, delegate
payloads, LoRA weights, padding) no longer matches the seal. Readers that check
it: ``lora_share.verify`` and the C++ runner (cpp_runner/formats/file_check.cpp).
"""

from __future__ import annotations

import dataclasses
import zlib

from .errors import BadFlatbuffer, Damaged
from .meta import ADAPTER_KEY, decode, encode_adapter
from .pte import Pte, read_pte


def content_crc32(blob, start: int, end: int) -> int:
    """CRC-32 of ``blob`` without bytes [start, end)."""
    return zlib.crc32(blob[end:], zlib.crc32(blob[:start]))


def seal_pte(data: bytes) -> bytes:
    """``data`` (a .pte with an adapter record) with the seal written into its record."""
    pte = read_pte(data, what="<pte to seal>", plans=False)
    entry = pte.entry(ADAPTER_KEY)
    meta = decode(pte.data(ADAPTER_KEY), "<pte to seal>").adapter
    sealed = dataclasses.replace(
        meta, content_bytes=len(data), content_crc32=content_crc32(data, entry.start, entry.end)
    )
    record = encode_adapter(sealed)
    if len(record) != entry.size:
        raise BadFlatbuffer("<pte to seal>", f"the sealed record is {len(record)} bytes, its segment {entry.size}")
    return data[: entry.start] + record + data[entry.end :]


def _record(pte: Pte):
    if ADAPTER_KEY not in pte:
        return None
    meta = decode(pte.data(ADAPTER_KEY), f"{pte.what}: {ADAPTER_KEY}").adapter
    return meta if meta is not None and meta.content_bytes else None


def seal_status(pte: Pte) -> str:
    """'sealed' (and intact), 'unsealed' (no seal, or no record), or why the file does not match its seal."""
    meta = _record(pte)
    if meta is None:
        return "unsealed"
    if meta.content_bytes != pte.size:
        return f"the file is {pte.size} bytes, but was written with {meta.content_bytes}: it is damaged"
    entry = pte.entry(ADAPTER_KEY)
    if content_crc32(pte.blob, entry.start, entry.end) != meta.content_crc32:
        return "the file does not match the checksum it was written with: it is damaged"
    return "sealed"


def check_seal(pte: Pte) -> None:
    """Raise ``Damaged`` if ``pte`` has a seal it does not match."""
    status = seal_status(pte)
    if status not in ("sealed", "unsealed"):
        raise Damaged(pte.what, status)
