"""Named errors for unreadable files: one class per way a file can be wrong.

All are ``UserError`` (the CLI prints one ``error: ...`` line and exits 2) and
every message starts with the file it is about.
"""

from __future__ import annotations

from ..errors import UserError


class FormatError(UserError):
    """A file that is not a well-formed file of the expected kind."""

    def __init__(self, what: str, message: str):
        self.what = what
        super().__init__(f"{what}: {message}")


class WrongMagic(FormatError):
    """The magic bytes that name the file kind are not there: a different kind of file."""


class TruncatedHeader(FormatError):
    """The file ends before its fixed-size header does."""


class BadHeader(FormatError):
    """The fixed-size header holds values no writer produces (a length, or regions that overlap)."""


class OffsetOutOfRange(FormatError):
    """A header or table points past the end of the file: the file may be truncated."""


class BadFlatbuffer(FormatError):
    """The flatbuffer part is malformed: an offset, length or field that cannot be right."""


class Damaged(FormatError):
    """Well-formed, but not the bytes that were written: the size or checksum in its seal differs."""


class NotRewritable(FormatError):
    """A well-formed .pte whose named data cannot be replaced without moving its other segments."""


class UnsupportedVersion(FormatError):
    """A well-formed file of a version this lora-share does not read."""
