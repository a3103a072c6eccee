"""The members of a zip made elsewhere, checked and read with bounds.

A zip can name one member twice (readers disagree on which copy counts: Python's zipfile takes the
last, torch's miniz reader the first), hold a second zip after bytes that one reader skips and the
other does not, declare sizes its entries do not hold, or inflate a few KB into gigabytes.
``check_starts_at_zero`` and ``check_members`` refuse all of that from the central directory alone,
before any member is read; ``read_member`` streams one member into a buffer of its declared size,
refusing it unread when that is over the caller's bound, and checks the entry holds exactly that
many bytes; ``check_nested_zip`` holds a torch.save zip inside a member to the same rules.
"""

from __future__ import annotations

import copy
import io
import zipfile
import zlib
from collections import Counter

from ..errors import clip
from .errors import BadHeader, Damaged, OffsetOutOfRange

READ_CHUNK = 1 << 20
COMPRESSIONS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}  # what torch's reader reads
# Deflate packs real weights and JSON at most about 20:1; only long runs of one byte value go far
# past that (1032:1 at most). torch writes every member stored, so this only meets re-zipped archives.
MAX_INFLATE = 100
INFLATE_SLACK = 1 << 20  # small members (a config of zeros, a mask) may pack tighter


def check_starts_at_zero(what: str, infos: list[zipfile.ZipInfo]) -> None:
    """Nothing before the first member: zipfile shifts every offset past such bytes, torch's reader
    does not, so a file can hold one zip for each (programs/reference.py is the second guard)."""
    first = min((i.header_offset for i in infos), default=0)
    if first:
        raise BadHeader(
            what,
            f"starts with {first:,} bytes that are not its zip's: zipfile skips them, torch's reader does not, "
            "so the two would read different members (a file with two zips in it); export it again",
        )


def check_members(what: str, infos: list[zipfile.ZipInfo]) -> None:
    """No name twice, no encryption, only compressions torch reads, stored entries' two sizes equal,
    no member inflating past MAX_INFLATE:1. ``what`` names the file in messages."""
    twice = [(n, c) for n, c in Counter(i.filename for i in infos).items() if c > 1]
    if twice:
        name, count = twice[0]
        raise BadHeader(
            what,
            f"{clip(name)} is in the archive {count} times ({len(twice)} name(s) repeated): readers disagree "
            "on which copy counts (torch.export.load reads the first), so what it holds is ambiguous; "
            "export it again",
        )
    for i in infos:
        if i.flag_bits & 0x1:
            raise BadHeader(what, f"{clip(i.filename)} is encrypted: torch writes plain members; export it again")
        if i.compress_type not in COMPRESSIONS:
            raise BadHeader(
                what,
                f"{clip(i.filename)} is compressed with zip method {i.compress_type}: torch reads stored or "
                "deflated members only; export it again",
            )
        if i.compress_type == zipfile.ZIP_DEFLATED and i.file_size > MAX_INFLATE * i.compress_size + INFLATE_SLACK:
            raise BadHeader(
                what,
                f"{clip(i.filename)} inflates {i.compress_size:,} bytes to {i.file_size:,}, more than "
                f"{MAX_INFLATE}:1: refused unread (a zip bomb; torch.export.save stores every member uncompressed)",
            )
        if i.compress_type == zipfile.ZIP_STORED and i.compress_size != i.file_size:
            raise Damaged(
                what,
                f"{clip(i.filename)} is stored in {i.compress_size:,} bytes but declares {i.file_size:,}: "
                "the archive is damaged or forged; export it again",
            )


def read_member(what: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str, limit: int) -> bytearray:
    """``info``'s bytes, streamed into a buffer of its declared size; refused unread when that is
    over ``limit``. The entry is opened as if it declared one byte more, so an entry that really
    holds more than it declares shows it (zipfile would stop at the declared size), and one that
    holds less ends early: either way the sizes disagree, and nothing past ``limit`` is ever held.
    ``shown`` names the member in messages."""
    if info.file_size > limit:
        raise OffsetOutOfRange(
            what,
            f"{clip(shown)} declares {info.file_size:,} bytes, more than the {limit:,} it can hold: "
            "refused unread (a zip bomb, or a damaged archive); export it again",
        )
    buf = bytearray(info.file_size)
    view, got = memoryview(buf), 0
    probe = copy.copy(info)
    probe.file_size += 1
    try:
        with zf.open(probe) as f:
            while got < len(buf):
                n = f.readinto(view[got : got + READ_CHUNK])
                if not n:
                    break
                got += n
            more = f.read(1) if got == len(buf) else b""
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError, NotImplementedError) as e:
        # ValueError: a local header whose name is not the UTF-8 its flag says; NotImplementedError:
        # encryption or patch data flags
        raise Damaged(
            what,
            f"{clip(shown)}: cannot be read ({clip(e, 120)}): the archive is truncated or damaged; export it again",
        ) from None
    if got != len(buf) or more:
        raise Damaged(
            what,
            f"{clip(shown)}: its zip entry declares {len(buf):,} bytes but holds "
            f"{'more' if more else f'{got:,}'}: the archive is damaged or forged; export it again",
        )
    return buf


def check_nested_zip(what: str, shown: str, data: bytes) -> None:
    """``data`` (a member that is itself a torch.save zip, read by torch's own reader) holds only
    stored entries, none twice: each entry then holds the bytes it declares, all within ``data``,
    so loading it allocates no more than ``data``'s size."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            infos = inner.infolist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise Damaged(what, f"{clip(shown)}: not torch.save's zip format ({clip(e)}); export it again") from None
    check_starts_at_zero(f"{what}: {clip(shown)}", infos)
    check_members(f"{what}: {clip(shown)}", infos)
    packed = [i for i in infos if i.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise BadHeader(what, f"{clip(shown)}: {clip(packed[0].filename)} is compressed; torch.save stores every entry")
    if sum(i.file_size for i in infos) > len(data):
        raise Damaged(what, f"{clip(shown)}: its entries declare more bytes than it holds; export it again")
