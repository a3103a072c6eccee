"""The bytes of a file to parse: memory-mapped, so reading a header of a
multi-gigabyte foundation.ptd costs no allocation and no read of the rest."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from ..errors import UserError
from .errors import TruncatedHeader, WrongMagic


def open_blob(source, what: str | None = None) -> tuple[object, str]:
    """(read-only bytes-like, name for messages) for a path, or for bytes already in memory."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source) if isinstance(source, memoryview) else source, what or "<bytes>"
    path = Path(source)
    what = what or str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return b"", what
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), what
    except FileNotFoundError:
        raise UserError(f"{what}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{what}: is a folder, not a file") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{what}: cannot read: {getattr(e, 'strerror', None) or e}") from None


KINDS = {b"ET12": "pte", b"FT01": "ptd"}  # flatbuffer file identifier at byte 4 -> file kind


def file_kind(blob, what: str) -> str:
    """'pte' or 'ptd', by the flatbuffer file identifier at byte 4."""
    ident = bytes(blob[4:8]) if len(blob) >= 8 else b""
    if ident in KINDS:
        return KINDS[ident]
    if len(blob) < 8:
        raise TruncatedHeader(what, f"{len(blob)} bytes: too short to be a .pte or .ptd (truncated or empty)")
    raise WrongMagic(what, f"identifier {ident!r} at byte 4 is neither b'ET12' (.pte) nor b'FT01' (.ptd)")


class KeyedEntries:
    """Lookup by key for a parsed file whose entries carry ``key``, ``start`` and ``end``
    (absolute byte offsets into ``self.blob``). Call ``_index(entries)`` once after parsing."""

    def _index(self, entries) -> None:
        self._by_key = {e.key: e for e in entries}

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def entry(self, key: str):
        """The entry named ``key``; KeyError if there is none."""
        return self._by_key[key]

    def data(self, key: str) -> bytes:
        """A copy of the bytes stored under ``key``."""
        e = self._by_key[key]
        return bytes(self.blob[e.start : e.end])
