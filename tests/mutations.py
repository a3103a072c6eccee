"""Realistic damage to .ptd/.pte files, for the fuzz tests: truncation at a random
offset, bit flips in the header, in the flatbuffer and in lora-share's record,
and wrong magic. Deterministic for a given seed. Plus ``write_damaged``: the few
named damages the error tests give every tool."""

from __future__ import annotations

import random
from pathlib import Path

from lora_share.formats import read_ptd, read_pte
from lora_share.formats.meta import ADAPTER_KEY, FOUNDATION_KEY, SHARED_KEY

KINDS = ("truncate", "header_flip", "flatbuffer_flips", "wrong_magic", "record_flips")
# Relative frequency of each kind.
WEIGHTS = (25, 15, 35, 10, 15)


def regions(data: bytes, kind: str) -> dict[str, tuple[int, int]]:
    """Byte ranges of a healthy file's header, flatbuffer and lora-share record (without its zero padding)."""
    if kind == "ptd":
        f = read_ptd(data)
        rec = f.entry(FOUNDATION_KEY if FOUNDATION_KEY in f else SHARED_KEY)  # foundation or adapters_shared
        where = {"header": (0, 48), "flatbuffer": (48, f.header.flatbuffer_end)}
    else:
        p = read_pte(data)
        rec = p.entry(ADAPTER_KEY)
        where = {"header": (0, 40), "flatbuffer": (40, p.header.program_size)}
    where["record"] = (rec.start, rec.start + len(data[rec.start : rec.end].rstrip(b"\0")))
    return where


def _flip(buf: bytearray, rng: random.Random, lo: int, hi: int, count: int) -> None:
    for _ in range(count):
        at = rng.randrange(lo, hi)
        buf[at] ^= 1 << rng.randrange(8)


def mutate(data: bytes, where: dict[str, tuple[int, int]], rng: random.Random) -> tuple[str, bytes]:
    """(kind, damaged copy of ``data``)."""
    kind = rng.choices(KINDS, WEIGHTS)[0]
    if kind == "truncate":
        return kind, data[: rng.randrange(0, len(data))]
    buf = bytearray(data)
    if kind == "wrong_magic":
        at = rng.choice((4, 8))
        buf[at : at + 4] = rng.choice((b"ET12", b"FT01", b"eh00", b"FH01", b"\0\0\0\0", bytes(rng.randbytes(4))))
        if buf == bytearray(data):
            buf[at] ^= 0x20
    elif kind == "header_flip":
        _flip(buf, rng, *where["header"], 1)
    elif kind == "flatbuffer_flips":
        _flip(buf, rng, *where["flatbuffer"], rng.randint(1, 8))
    else:
        _flip(buf, rng, *where["record"], rng.randint(1, 4))
    return kind, bytes(buf)


def damaged(data: bytes, kind: str, count: int, seed: int):
    """``count`` damaged copies of a healthy .ptd/.pte: yields (mutation kind, bytes)."""
    rng = random.Random(seed)
    where = regions(data, kind)
    for _ in range(count):
        yield mutate(data, where, rng)


FILE_DAMAGE = ("truncated", "wrong-magic", "flipped", "empty", "folder")


def write_damaged(path: Path, data: bytes, damage: str) -> None:
    """Puts ``data`` with one of FILE_DAMAGE at ``path`` (a folder: an empty directory in its place)."""
    if damage == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
    elif damage == "wrong-magic":
        path.write_bytes(data[:4] + b"ZZ99" + data[8:])
    elif damage == "flipped":  # the root table offset
        path.write_bytes(bytes([data[0] ^ 0x80]) + data[1:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "folder":
        path.mkdir()
    else:
        raise ValueError(f"unknown damage {damage!r}")
