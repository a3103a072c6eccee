"""One model of a PT2 archive as an ExportedProgram, read without unpickling anything.

The tensors are viewed from their raw blobs by the metadata of the weights and constants configs
(formats/pt2.py has checked both); the program is the archive's ExportedProgram JSON read by
torch's own deserializer; the sample inputs, if any, are read with ``torch.load(weights_only=True)``
(tensors and containers only: no code runs).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch

from ..formats.errors import Damaged, UnsupportedVersion
from ..formats.pt2 import ArchiveModel, NeedsCode, Payload, Pt2Archive


@dataclass
class ArchiveProgram:
    """A model of an archive, loaded."""

    name: str  # the model's name in the archive
    ep: torch.export.ExportedProgram
    sample_inputs: tuple | None  # forward's flat positional inputs, if the archive has them
    sample_args: tuple | None = None  # the same as (args, kwargs), to call ``ep.module()`` with


def _tensor(archive: Pt2Archive, p: Payload, blobs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``p`` viewed from its blob; payloads naming one blob share its storage, as they did when saved."""
    dtype = getattr(torch, p.dtype)
    if p.member not in blobs:
        raw = archive.read(p.member)
        size = torch.empty((), dtype=dtype).element_size()
        blobs[p.member] = (
            torch.frombuffer(bytearray(raw), dtype=dtype, count=len(raw) // size)
            if len(raw) >= size
            else torch.empty(0, dtype=dtype)
        )
    if 0 in p.sizes:
        return torch.empty(p.sizes, dtype=dtype)
    return torch.as_strided(blobs[p.member], p.sizes, p.strides, p.storage_offset)


def load_program(archive: Pt2Archive, model: ArchiveModel) -> ArchiveProgram:
    """``model`` of ``archive`` as an ExportedProgram (and its sample inputs)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, SerializeError, _bytes_to_dataclass

    what = str(archive.path)
    blobs: dict[str, torch.Tensor] = {}
    state_dict, constants = {}, {}
    for p in model.payloads:
        t = _tensor(archive, p, blobs)
        if p.kind == "weight":
            state_dict[p.fqn] = torch.nn.Parameter(t, requires_grad=False) if p.is_param else t
        else:
            constants[p.fqn] = t
    sample = _sample_inputs(archive, model)
    member = model.program[len(archive.root) :]
    try:
        serialized = _bytes_to_dataclass(schema.ExportedProgram, archive.read(model.program))
    except Exception as e:  # any malformed JSON or schema mismatch: the archive, not our code
        raise Damaged(what, f"{member}: not a serialized ExportedProgram ({type(e).__name__}: {e})") from None
    try:
        ep = ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, sample)
    except SerializeError as e:
        raise UnsupportedVersion(
            what, f"{member}: {e}: export it with torch {torch.__version__.split('+')[0]}"
        ) from None
    except Exception as e:
        raise Damaged(what, f"{member}: cannot be deserialized ({type(e).__name__}: {e})") from None
    flat = None
    if sample is not None:
        args, kwargs = sample
        flat = tuple(torch.utils._pytree.tree_leaves((args, kwargs)))
    return ArchiveProgram(model.name, ep, flat, sample)


def _sample_inputs(archive: Pt2Archive, model: ArchiveModel) -> tuple | None:
    """(args, kwargs) from the archive's sample inputs, or None when it has none."""
    if model.sample_inputs is None:
        return None
    data = archive.read(model.sample_inputs)
    if not data:
        return None
    member = model.sample_inputs[len(archive.root) :]
    try:
        sample = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:
        raise NeedsCode(
            str(archive.path),
            f"{member}: not plain tensors ({type(e).__name__}); reading it would run "
            "code from the archive, which lora-share refuses",
        ) from None
    if not (isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict)):
        raise Damaged(str(archive.path), f"{member}: not the (args, kwargs) pair torch.export.save writes")
    return sample
