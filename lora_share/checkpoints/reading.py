"""Reading checkpoint files without torch: JSON configs, and safetensors files as numpy float32
(``lora-share add`` reads a PEFT adapter with these, so it never imports torch).

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the tensors' bytes. numpy has no bfloat16, so bfloat16 is widened
by hand: its 16 bits are the top half of the float32 with the same value (what torch's
``.to(torch.float32)`` computes), so every dtype read here becomes float32 exactly as torch makes it.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np

from ..errors import UserError

# safetensors dtype -> (numpy dtype of the stored bytes, bytes per element); BF16 is widened below.
_FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def read_json(path: Path, what: str) -> dict:
    """The JSON file at ``path`` (``what`` it is, for the message), with a clear error if it is
    missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: missing ({what})") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not readable JSON ({what}): {e}") from None


def read_float32_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file of float tensors (float64, float32, float16, bfloat16), as a
    float32 numpy array of its own; a clear error for a truncated or malformed file or another dtype."""

    def bad(why: str):
        raise UserError(f"{path}: not a readable safetensors file ({why}); the file may be truncated")

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) < 8:
        bad("shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        bad(f"its header of {n} bytes runs past the end of the file's {len(data)} bytes")
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError as e:
        bad(f"its header is not JSON: {e}")
    if not isinstance(header, dict):
        bad("its header is not a JSON object")
    body = memoryview(data)[8 + n :]
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            bad(f"tensor {key!r} has no dtype, shape and data_offsets")
        if dtype not in _FLOAT_DTYPES:
            raise UserError(
                f"{path}: tensor {key!r} is {dtype}; LoRA weights are read as float64, float32, float16 or bfloat16"
            )
        stored = np.dtype(_FLOAT_DTYPES[dtype])
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= len(body)):
            bad(f"tensor {key!r} lies at bytes [{start}, {end}) of a {len(body)}-byte body")
        if end - start != math.prod(shape) * stored.itemsize:
            bad(f"tensor {key!r} has {end - start} bytes for shape {shape} of {dtype}")
        raw = np.frombuffer(body[start:end], dtype=stored).reshape(shape)
        out[key] = (raw.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else raw.astype(np.float32)
    return out
