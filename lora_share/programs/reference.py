"""The archive's program as torch's own reader loads it: the reference a build is held to.

lora-share reads an archive with Python's zipfile and views its blobs itself (archive.py); torch's
``torch.export.load`` reads it with its miniz-based reader. Two readers of one zip can disagree
(a member named twice: zipfile takes the last copy, miniz the first), and then a build would lower
another model than the archive's own, and compare it with itself. So each program with sample
inputs is also loaded the way ``torch.export.load`` loads it (torch's ``_load_state_dict`` and
``_load_constants`` over its ``PT2ArchiveReader``, torch's deserializer) and run on them; the
build is refused unless both readings give the same outputs, and ``sample_max_abs_diff`` is
measured against torch's.

Nothing in it unpickles: torch's reader is only given an archive formats/pt2.py has checked (no
pickled payloads, no legacy weight files), after checking that it sees the same configs and
program bytes and the same blob sizes as lora-share did; the sample inputs handed to torch's
deserializer are the ones archive.py read with ``weights_only=True``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UserError, clip
from ..formats.pt2 import MAX_CONFIG_BYTES, MAX_PROGRAM_BYTES, open_archive
from .archive import ArchiveProgram, serialized_program


def _run(ep: torch.export.ExportedProgram, sample_args: tuple) -> list[torch.Tensor]:
    args, kwargs = sample_args
    with torch.no_grad():
        out = ep.module()(*args, **kwargs)
    return [t.detach() for t in torch.utils._pytree.tree_leaves(out)]


def _torch_reading(path: Path, model: str, sample_args: tuple, what: str) -> list[torch.Tensor]:
    """The outputs of ``model`` loaded by torch's own archive reader, on ``sample_args``."""
    from torch._export.serde.serialize import ExportedProgramDeserializer
    from torch.export.pt2_archive._package import PT2ArchiveReader, _load_constants, _load_state_dict

    with open_archive(path) as archive, PT2ArchiveReader(str(path)) as reader:
        m = archive.model(model)
        limits = [(m.program, MAX_PROGRAM_BYTES)] + [(c, MAX_CONFIG_BYTES) for c in m.configs]
        for member, limit in limits:
            name = member[len(archive.root) :]
            if reader.read_bytes(name) != bytes(archive.read(member, limit)):
                raise UserError(f"{what}: torch's reader sees other bytes in {clip(name)}: the zip is ambiguous")
        for member in {p.member for p in m.payloads}:
            name = member[len(archive.root) :]
            if reader.archive_file.get_record_size(name) != archive.zip.getinfo(member).file_size:
                raise UserError(f"{what}: torch's reader sees another size for {clip(name)}: the zip is ambiguous")
        serialized = serialized_program(archive, m)
        state_dict, constants = _load_state_dict(reader, model), _load_constants(reader, model)
    ep = ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, sample_args)
    return _run(ep, sample_args)


def _largest_difference(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    """The largest absolute difference (inf for another shape or dtype; NaN equals NaN)."""
    if len(ours) != len(theirs):
        return float("inf")
    worst = 0.0
    for a, b in zip(ours, theirs):
        if a.shape != b.shape or a.dtype != b.dtype:
            return float("inf")
        if a.numel() and not torch.equal(a, b):
            a64, b64 = a.double(), b.double()
            both_nan = a64.isnan() & b64.isnan()
            diff = (a64 - b64).abs().masked_fill(both_nan, 0).nan_to_num(float("inf"))
            worst = max(worst, float(diff.max()))
    return worst


def checked_reference(path: Path, model: str, program: ArchiveProgram, what: str) -> list[torch.Tensor] | None:
    """torch's reading's outputs on the archive's sample inputs (None without them), once lora-share's
    reading is known to give the same; else one UserError naming the archive."""
    if program.sample_args is None:
        return None
    try:
        ours = _run(program.ep, program.sample_args)
    except Exception as e:  # the graph is the archive's: name it, not our stack
        raise UserError(
            f"{what}: the archive's program fails on its own sample inputs ({type(e).__name__}: "
            f"{clip(str(e).splitlines()[0] if str(e) else '', 160)}); export it again"
        ) from None
    try:
        theirs = _torch_reading(path, model, program.sample_args, what)
    except UserError:
        raise
    except Exception as e:
        raise UserError(
            f"{what}: torch's own reader cannot load or run it ({type(e).__name__}: "
            f"{clip(str(e).splitlines()[0] if str(e) else '', 160)}); export it again"
        ) from None
    diff = _largest_difference(ours, theirs)
    if diff != 0.0:
        raise UserError(
            f"{what}: lora-share's reading of the archive and torch.export.load's give different outputs on its "
            f"sample inputs (largest difference {diff:.3g}): the archive holds two models at once; export it again"
        )
    return theirs
