"""Hostile PT2 archives and .npy files, for the fuzz tests: each family is made from a healthy
archive (tests/pt2_models.py) by rewriting its zip, deterministically.

Every family is one way an archive from elsewhere could make a reader build the wrong model, run
out of memory or crash: a blob entry twice, a zip bomb, a tensor whose metadata disagrees with the
graph, sizes that overflow or alias, JSON nested deeper than any writer nests it, a key name of
megabytes, sample inputs of the wrong shape.
"""

from __future__ import annotations

import io
import json
import random
import struct
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np

GiB = 1 << 30


def rewrite(src: Path, dest: Path, change, extra=()) -> Path:
    """A copy of archive ``src`` with ``change(member, bytes) -> bytes | None`` (None drops it),
    then the (name, bytes) pairs of ``extra`` appended; every member stored, as torch writes them."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about a duplicate name: some families want one
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)
        for name, data in extra:
            zout.writestr(name, data)
    return dest


def _root(src: Path) -> str:
    with zipfile.ZipFile(src) as z:
        return z.namelist()[0].split("/", 1)[0] + "/"


def _edit_entry(fqn_index: int, edit):
    """A ``change`` that applies ``edit(fqn, entry) -> (fqn, entry)`` to one entry of the weights config."""

    def change(name: str, data: bytes) -> bytes:
        if not name.endswith("_weights_config.json"):
            return data
        config = json.loads(data)["config"]
        items = list(config.items())
        items[fqn_index] = edit(*items[fqn_index])
        return json.dumps({"config": dict(items)}).encode()

    return change


def _meta(entry: dict, **changes) -> dict:
    tm = dict(entry["tensor_meta"])
    for key, value in changes.items():
        tm[key] = [{"as_int": v} for v in value] if key in ("sizes", "strides") else value
    return {**entry, "tensor_meta": tm}


def duplicate_blob(src: Path, dest: Path) -> Path:
    """weight_0 a second time, later in the zip, holding other bytes of the same size."""
    member = _root(src) + "data/weights/weight_0"
    return rewrite(src, dest, lambda n, d: d, extra=[(member, duplicate_blob_bytes(src))])


def _patch_entry(data: bytearray, member: str, **fields) -> None:
    """Sets fields of ``member``'s local header and central-directory entry (a zip without zip64):
    method, crc, compressed, size."""
    local = {"method": 8, "crc": 14, "compressed": 18, "size": 22}
    central = {"method": 10, "crc": 16, "compressed": 20, "size": 24}
    name = member.encode()
    for magic, offsets, name_at in ((b"PK\x03\x04", local, 30), (b"PK\x01\x02", central, 46)):
        at = data.find(magic)
        while at >= 0 and data[at + name_at : at + name_at + len(name)] != name:
            at = data.find(magic, at + 4)
        for field, value in fields.items():
            struct.pack_into("<H" if field == "method" else "<I", data, at + offsets[field], value)


def zip_bomb(src: Path, dest: Path, size: int = GiB) -> Path:
    """weight_0 (864 bytes in conv.pt2) replaced by ``size`` zero bytes, deflated to about 1 KB per MiB.

    Built without deflating ``size`` bytes: after a full flush deflate starts afresh, so every MiB
    of zeros packs to the same bytes; the entry is written stored and its header patched to say
    deflated, with the real CRC and size."""
    member = _root(src) + "data/weights/weight_0"
    chunk = bytes(1 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    stream = block * (size // len(chunk)) + packer.flush()
    crc = 0
    for _ in range(size // len(chunk)):
        crc = zlib.crc32(chunk, crc)
    rewrite(src, dest, lambda n, d: stream if n == member else d)
    data = bytearray(dest.read_bytes())
    _patch_entry(data, member, method=zipfile.ZIP_DEFLATED, crc=crc, size=size)
    dest.write_bytes(bytes(data))
    return dest


def oversized_blob(src: Path, dest: Path) -> Path:
    """weight_0 stored with twice the bytes its tensor needs."""
    return rewrite(src, dest, lambda n, d: d + d if n.endswith("/weight_0") else d)


def size_lie(src: Path, dest: Path) -> Path:
    """weight_0's entry declares 16 bytes fewer than it holds, in both headers (its CRC the real one's)."""
    member = _root(src) + "data/weights/weight_0"
    rewrite(src, dest, lambda n, d: d)
    with zipfile.ZipFile(dest) as z:
        size = z.getinfo(member).file_size
    data = bytearray(dest.read_bytes())
    _patch_entry(data, member, size=size - 16)
    dest.write_bytes(bytes(data))
    return dest


def deflated_longer(src: Path, dest: Path) -> Path:
    """weight_0 deflated with 16 bytes more than its entry declares, its CRC that of the declared
    bytes and one more: zipfile alone stops at the declared size, and a reader that reads one byte
    past it to see the entry end finds the CRC right."""
    member = _root(src) + "data/weights/weight_0"
    with zipfile.ZipFile(src) as z:
        data = z.read(member)
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = packer.compress(data + bytes(16)) + packer.flush()
    rewrite(src, dest, lambda n, d: stream if n == member else d)
    patched = bytearray(dest.read_bytes())
    _patch_entry(patched, member, method=zipfile.ZIP_DEFLATED, crc=zlib.crc32(data + bytes(1)), size=len(data))
    dest.write_bytes(bytes(patched))
    return dest


def two_readers(src: Path, dest: Path) -> Path:
    """One file, two zips: Python's zipfile (which adjusts offsets for data before the zip) reads a
    copy whose weight_0 holds other bytes of the same size; torch's miniz reader (which does not)
    reads the healthy archive. Their members have the same names and sizes, so both central
    directories have one size, and the one end record serves both:

        [healthy locals | healthy CD | other locals | other CD | end record -> healthy CD]
    """
    healthy = rewrite(src, dest.with_suffix(".a"), lambda n, d: d).read_bytes()
    other = duplicate_blob_bytes(src)
    other_zip = rewrite(src, dest.with_suffix(".b"), lambda n, d: other if n.endswith("/weight_0") else d).read_bytes()
    end = healthy.rfind(b"PK\x05\x06")
    assert end == len(healthy) - 22 and other_zip.rfind(b"PK\x05\x06") == len(other_zip) - 22  # no comment, no zip64
    size_cd, offset_cd = struct.unpack_from("<II", healthy, end + 12)
    assert struct.unpack_from("<II", other_zip, len(other_zip) - 10) == (size_cd, offset_cd)
    dest.write_bytes(healthy[:end] + other_zip[:-22] + healthy[end:])
    dest.with_suffix(".a").unlink()
    dest.with_suffix(".b").unlink()
    return dest


def duplicate_blob_bytes(src: Path) -> bytes:
    """Other bytes for weight_0, of its size."""
    with zipfile.ZipFile(src) as z:
        size = z.getinfo(_root(src) + "data/weights/weight_0").file_size
    return np.arange(size // 4, dtype=np.float32).tobytes()


def dtype_mismatch(src: Path, dest: Path) -> Path:
    """weight_0 declared float64 (the graph says float32), its blob doubled to hold the bytes."""
    root = _root(src)

    def change(name: str, data: bytes) -> bytes:
        if name == root + "data/weights/weight_0":
            return data + data
        return _edit_entry(0, lambda fqn, e: (fqn, _meta(e, dtype=8)))(name, data)

    return rewrite(src, dest, change)


def shape_mismatch(src: Path, dest: Path) -> Path:
    """weight_0's first size one less than the graph's (strides kept: its blob still covers it)."""

    def edit(fqn, e):
        sizes = [s["as_int"] for s in e["tensor_meta"]["sizes"]]
        return fqn, _meta(e, sizes=[sizes[0] - 1, *sizes[1:]])

    return rewrite(src, dest, _edit_entry(0, edit))


def rank_mismatch(src: Path, dest: Path) -> Path:
    """weight_0 declared one-dimensional, with all its elements."""

    def edit(fqn, e):
        n = 1
        for s in e["tensor_meta"]["sizes"]:
            n *= s["as_int"]
        return fqn, _meta(e, sizes=[n], strides=[1])

    return rewrite(src, dest, _edit_entry(0, edit))


def stride_zero(src: Path, dest: Path, size: int = 1 << 40) -> Path:
    """weight_0's first size ``size`` with stride 0: a tiny blob viewed as ``size`` rows."""

    def edit(fqn, e):
        sizes = [s["as_int"] for s in e["tensor_meta"]["sizes"]]
        strides = [s["as_int"] for s in e["tensor_meta"]["strides"]]
        return fqn, _meta(e, sizes=[size, *sizes[1:]], strides=[0, *strides[1:]])

    return rewrite(src, dest, _edit_entry(0, edit))


def overflowing_sizes(src: Path, dest: Path) -> Path:
    """weight_0 with sizes whose product overflows 64 bits."""
    return rewrite(src, dest, _edit_entry(0, lambda fqn, e: (fqn, _meta(e, sizes=[1 << 62, 1 << 62], strides=[1, 1]))))


def deep_config(src: Path, dest: Path, depth: int = 100_000) -> Path:
    """The weights config nested ``depth`` lists deep."""
    deep = ("[" * depth + "]" * depth).encode()
    return rewrite(src, dest, lambda n, d: b'{"config": ' + deep + b"}" if n.endswith("_weights_config.json") else d)


def deep_program(src: Path, dest: Path, depth: int = 100_000) -> Path:
    """The program's JSON nested ``depth`` objects deep."""
    deep = ('{"a":' * depth + "1" + "}" * depth).encode()
    return rewrite(src, dest, lambda n, d: deep if "/models/" in n and n.endswith(".json") else d)


def long_key(src: Path, dest: Path, length: int = 50_000_000) -> Path:
    """weight_0's FQN ``length`` characters long (and so unknown to the graph)."""
    return rewrite(src, dest, _edit_entry(0, lambda fqn, e: ("k" * length, e)))


def sample_wrong_shape(src: Path, dest: Path) -> Path:
    """The sample inputs replaced by one tensor of another shape than the graph's input."""
    import torch

    buf = io.BytesIO()
    torch.save(((torch.zeros(2, 3, 5, 5),), {}), buf)
    return rewrite(src, dest, lambda n, d: buf.getvalue() if "/data/sample_inputs/" in n else d)


def legacy_weights(src: Path, dest: Path) -> Path:
    """A legacy ``data/weights/<model>.pt`` beside the config: torch's reader would unpickle it."""
    return rewrite(src, dest, lambda n, d: d, extra=[(_root(src) + "data/weights/model.pt", b"not read")])


def deep_sample(src: Path, dest: Path, depth: int = 200) -> Path:
    """Sample inputs nested ``depth`` tuples deep around the real input."""
    import torch

    with zipfile.ZipFile(src) as z:
        sample = torch.load(io.BytesIO(z.read(_root(src) + "data/sample_inputs/model.pt")), weights_only=True)
    nested = sample[0][0]
    for _ in range(depth):
        nested = (nested,)
    buf = io.BytesIO()
    torch.save(((nested,), {}), buf)
    return rewrite(src, dest, lambda n, d: buf.getvalue() if "/data/sample_inputs/" in n else d)


# name -> (make(src, dest) -> dest, a fragment of the one error it must get). Made from conv.pt2.
FAMILIES = {
    "duplicate_blob": (duplicate_blob, "data/weights/weight_0 is in the archive 2 times"),
    "two_readers": (two_readers, "bytes that are not its zip's"),
    "zip_bomb": (zip_bomb, "inflates 1,061,890 bytes to 1,073,741,824"),
    "oversized_blob": (oversized_blob, "declares 1,728 bytes, the tensor needs 864: refused unread"),
    "size_lie": (size_lie, "is stored in 864 bytes but declares 848"),
    "deflated_longer": (deflated_longer, "its zip entry declares 864 bytes but holds more"),
    "dtype": (dtype_mismatch, "is float64[8, 3, 3, 3] but the graph's p_body_0_weight"),
    "shape": (shape_mismatch, "is float32[7, 3, 3, 3] but the graph's p_body_0_weight"),
    "rank": (rank_mismatch, "is float32[216] but the graph's p_body_0_weight"),
    "stride_zero_2^40": (stride_zero, "with strides (0, 9, 3, 1) overlap"),
    "stride_zero_2^24": (lambda s, d: stride_zero(s, d, 1 << 24), "with strides (0, 9, 3, 1) overlap"),
    "overflow": (overflowing_sizes, "overlap"),
    "deep_config": (deep_config, "nested deeper than 64 levels"),
    "deep_program": (deep_program, "nested deeper than 64 levels"),
    "long_key": (long_key, "(50,000,002 characters): names a tensor the program"),
    "sample_shape": (
        sample_wrong_shape,
        "sample input 0 is float32[2, 3, 5, 5], the graph takes float32[1, 3, 12, 12]",
    ),
    "deep_sample": (deep_sample, "nested deeper than 16 levels"),
    "legacy_weights": (legacy_weights, "data/weights/model.pt is a legacy pickled weights file"),
}


def random_config_damage(src: Path, dest: Path, rng: random.Random) -> Path:
    """One entry of the weights config with one tensor_meta field set to a random hostile value."""
    values = [-1, 0, 1, 1 << 31, 1 << 40, 1 << 63, -(1 << 63), 2.5, "3", None, [], {}, {"as_int": -5}, True]

    def edit(fqn, e):
        tm = dict(e["tensor_meta"])
        field = rng.choice(["dtype", "sizes", "strides", "storage_offset"])
        if field in ("sizes", "strides") and tm[field] and rng.random() < 0.7:
            items = list(tm[field])
            items[rng.randrange(len(items))] = {"as_int": rng.choice(values)}
            tm[field] = items
        else:
            tm[field] = rng.choice(values)
        return fqn, {**e, "tensor_meta": tm}

    with zipfile.ZipFile(src) as z:
        config = json.loads(z.read(_root(src) + "data/weights/model_weights_config.json"))["config"]
    return rewrite(src, dest, _edit_entry(rng.randrange(len(config)), edit))
