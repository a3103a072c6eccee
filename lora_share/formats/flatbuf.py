"""A bounds-checked flatbuffer reader.

The ``flatbuffers`` package (and the code flatc generates for Python) trusts
every offset in the buffer; a corrupt file then raises whatever Python error
the bad offset happens to cause, or walks a vector whose length field says four
billion. Here every position is checked against the buffer's bounds before it
is read, vector lengths are checked against the bytes that are really there
(so no loop or allocation is larger than the file), and every failure is one
``BadFlatbuffer`` naming the file and the field.

Positions are absolute offsets into the underlying bytes, so a flatbuffer
embedded in a larger file (a .ptd's header region, a delegate payload) reports
offsets a caller can use on the whole file.
"""

from __future__ import annotations

import struct

from .errors import BadFlatbuffer

_U8, _U16, _U32, _I32, _U64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<i", "<Q"))


class FlatBuffer:
    """One flatbuffer occupying ``data[start:end]``; ``what`` names it in errors."""

    def __init__(self, data, what: str, start: int = 0, end: int | None = None):
        self.data = data
        self.what = what
        self.start = start
        self.end = len(data) if end is None else end
        if not 0 <= self.start <= self.end <= len(data):
            raise BadFlatbuffer(what, f"flatbuffer range [{start}, {end}) is outside the file")
        if self.end - self.start < 8:
            raise BadFlatbuffer(what, f"flatbuffer is {self.end - self.start} bytes, too short to hold a root table")

    def fail(self, message: str) -> BadFlatbuffer:
        return BadFlatbuffer(self.what, f"malformed flatbuffer: {message}")

    def need(self, pos: int, size: int, field: str) -> None:
        """Raise unless ``size`` bytes at ``pos`` lie inside the flatbuffer."""
        if pos < self.start or size < 0 or pos + size > self.end:
            raise self.fail(f"{field} at byte {pos} (+{size}) is outside [{self.start}, {self.end})")

    def _read(self, s: struct.Struct, pos: int, field: str) -> int:
        self.need(pos, s.size, field)
        return s.unpack_from(self.data, pos)[0]

    def u8(self, pos: int, field: str = "byte") -> int:
        return self._read(_U8, pos, field)

    def u16(self, pos: int, field: str = "uint16") -> int:
        return self._read(_U16, pos, field)

    def u32(self, pos: int, field: str = "uint32") -> int:
        return self._read(_U32, pos, field)

    def i32(self, pos: int, field: str = "int32") -> int:
        return self._read(_I32, pos, field)

    def u64(self, pos: int, field: str = "uint64") -> int:
        return self._read(_U64, pos, field)

    def identifier(self) -> bytes:
        """The 4-byte file identifier after the root offset."""
        return bytes(self.data[self.start + 4 : self.start + 8])

    def root(self, name: str) -> Table:
        """The root table; ``name`` is its schema type, for error messages."""
        return Table(self, self.start + self.u32(self.start, f"{name} root offset"), name)


class Table:
    """One flatbuffer table: fields are looked up by their slot (declaration index in the schema)."""

    def __init__(self, fb: FlatBuffer, pos: int, name: str):
        self.fb, self.pos, self.name = fb, pos, name
        vtable = pos - fb.i32(pos, f"{name} vtable offset")
        vt_size = fb.u16(vtable, f"{name} vtable size")
        self.size = fb.u16(vtable + 2, f"{name} table size")
        if vt_size < 4 or vt_size % 2:
            raise fb.fail(f"{name} vtable size {vt_size} at byte {vtable} is not an even number >= 4")
        if self.size < 4:
            raise fb.fail(f"{name} table size {self.size} at byte {pos} is below 4")
        fb.need(vtable, vt_size, f"{name} vtable")
        fb.need(pos, self.size, f"{name} table")
        self.vtable, self.vt_size = vtable, vt_size

    def _field(self, slot: int, size: int) -> int | None:
        """Absolute position of field ``slot`` (``size`` bytes inline), or None if absent."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vt_size:
            return None
        offset = self.fb.u16(self.vtable + entry)
        if offset == 0:
            return None
        if offset + size > self.size:
            raise self.fb.fail(f"{self.name} field {slot} at +{offset} runs past its table ({self.size} bytes)")
        return self.pos + offset

    def _scalar(self, s: struct.Struct, slot: int, default: int) -> int:
        pos = self._field(slot, s.size)
        return default if pos is None else s.unpack_from(self.fb.data, pos)[0]

    def u8(self, slot: int, default: int = 0) -> int:
        return self._scalar(_U8, slot, default)

    def u32(self, slot: int, default: int = 0) -> int:
        return self._scalar(_U32, slot, default)

    def i32(self, slot: int, default: int = 0) -> int:
        return self._scalar(_I32, slot, default)

    def u64(self, slot: int, default: int = 0) -> int:
        return self._scalar(_U64, slot, default)

    def f64(self, slot: int, default: float = 0.0) -> float:
        pos = self._field(slot, 8)
        return default if pos is None else struct.unpack_from("<d", self.fb.data, pos)[0]

    def has(self, slot: int) -> bool:
        """Whether field ``slot`` is present (its vtable entry is not 0), whatever its type."""
        entry = 4 + 2 * slot
        return entry + 2 <= self.vt_size and self.fb.u16(self.vtable + entry) != 0

    def _target(self, slot: int) -> int | None:
        pos = self._field(slot, 4)
        if pos is None:
            return None
        return pos + self.fb.u32(pos, f"{self.name} field {slot} offset")

    def table(self, slot: int, name: str) -> Table | None:
        """Sub-table at ``slot`` (schema type ``name``), or None."""
        target = self._target(slot)
        return None if target is None else Table(self.fb, target, name)

    def vector(self, slot: int, elem_size: int) -> tuple[int, int] | None:
        """(absolute position of element 0, element count) of a vector field, or None."""
        target = self._target(slot)
        if target is None:
            return None
        count = self.fb.u32(target, f"{self.name} field {slot} vector length")
        self.fb.need(target + 4, count * elem_size, f"{self.name} field {slot} vector of {count}")
        return target + 4, count

    def string_span(self, slot: int) -> tuple[int, int] | None:
        """(absolute position, byte length) of a string field, or None."""
        return self.vector(slot, 1)

    def string(self, slot: int) -> str | None:
        """A string field as text, or None."""
        span = self.string_span(slot)
        if span is None:
            return None
        try:
            return bytes(self.fb.data[span[0] : span[0] + span[1]]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fb.fail(f"{self.name} field {slot} is not UTF-8 text") from None

    def tables(self, slot: int, name: str) -> list[Table]:
        """A vector of tables (empty if absent)."""
        vec = self.vector(slot, 4)
        if vec is None:
            return []
        start, count = vec
        return [Table(self.fb, start + 4 * i + self.fb.u32(start + 4 * i), name) for i in range(count)]

    def scalars(self, slot: int, fmt: str) -> list:
        """A vector of scalars of struct format ``fmt`` (e.g. "i", "B", "Q"); empty if absent."""
        size = struct.calcsize("<" + fmt)
        vec = self.vector(slot, size)
        if vec is None:
            return []
        start, count = vec
        return list(struct.unpack_from(f"<{count}{fmt}", self.fb.data, start))

    def strings(self, slot: int) -> list[str]:
        """A vector of strings (empty if absent)."""
        vec = self.vector(slot, 4)
        if vec is None:
            return []
        start, count = vec
        out = []
        for i in range(count):
            at = start + 4 * i + self.fb.u32(start + 4 * i)
            n = self.fb.u32(at, f"{self.name} field {slot} string length")
            self.fb.need(at + 4, n, f"{self.name} field {slot} string")
            try:
                out.append(bytes(self.fb.data[at + 4 : at + 4 + n]).decode("utf-8"))
            except UnicodeDecodeError:
                raise self.fb.fail(f"{self.name} field {slot} item {i} is not UTF-8 text") from None
        return out
