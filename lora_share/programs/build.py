"""``lora-share build`` of a config with ``programs:``, and ``lora-share add --to`` of a program.

Every program's parameters, buffers and constants are hashed (sharing.py); a tensor whose bytes
occur in two or more programs goes to foundation.ptd once, under its key; each program is lowered
(lower.py) into its .pte with its other tensors inside. Each program with sample inputs in its
archive is run (forward.py) and compared with the archive's ExportedProgram as torch.export.load
reads it (reference.py, which first holds lora-share's own reading to it); the largest difference
goes into the manifest. Everything is written into a staging folder that replaces the output
folder only when all of it succeeded (``files.staged_dir``).

``add`` lowers a program from another archive against the existing foundation.ptd, which it
hard-links unchanged: the program reads from it the tensors it has in common with the shipped
programs, and keeps the rest in its own .pte.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..config import config_to_dict, load_config
from ..deploy.writer import PTD_NAME, log, mb
from ..errors import UserError
from ..files import sha256_file, staged_dir
from ..formats import read_ptd
from ..formats.errors import FormatError
from ..formats.pt2 import open_archive
from ..manifest import (
    MANIFEST,
    PROGRAMS,
    Manifest,
    file_entry,
    program_entry,
    programs_manifest,
    read_manifest,
    write_manifest,
)
from .archive import ArchiveProgram, load_program
from .forward import LoadedProgram
from .lower import lower
from .reference import checked_reference
from .sharing import program_keys, shared_keys, state_tensors, tensor_bytes

ALIGNMENT = 64  # a cache line, as XNNPACK's constants are aligned


@dataclass
class Source:
    """A program to build: its name, the archive and model it comes from, and the loaded program."""

    name: str
    pt2: Path
    model: str
    program: ArchiveProgram
    keys: dict[str, str]  # FQN -> content key of its tensors
    bytes_of: dict[str, int] | None = None  # FQN -> bytes (set by _prepare)
    tensor_bytes: int = 0


def _load(name: str, pt2: Path, model: str | None, where: str) -> Source:
    try:
        with open_archive(pt2) as archive:
            m = archive.model(model)
            program = load_program(archive, m)
    except FormatError as e:
        raise UserError(f"{where} ({name}): {e}") from None
    return Source(name, Path(pt2), m.name, program, program_keys(program.ep))


def _reference(src: Source):
    """The outputs on the archive's sample inputs (flat) of its program as torch.export.load reads
    it, checked equal to lora-share's reading (reference.py); None without sample inputs."""
    return checked_reference(src.pt2, src.model, src.program, f"{src.pt2} ({src.model}, program {src.name})")


def _max_diff(pte: Path, ptd: Path, src: Source, reference) -> float | None:
    """The largest absolute difference between the lowered program's outputs and ``reference``."""
    import numpy as np

    if reference is None:
        return None
    program = LoadedProgram(pte, ptd)
    outputs = program.run([t.numpy() for t in src.program.sample_inputs])
    if len(outputs) != len(reference):
        raise UserError(f"{pte.name}: returns {len(outputs)} tensors, the archive's program {len(reference)}")
    return max(
        (
            float(np.max(np.abs(o.astype(np.float64) - r.numpy().astype(np.float64)))) if o.size else 0.0
            for o, r in zip(outputs, reference)
        ),
        default=0.0,
    )


def encode_foundation_ptd(entries: dict[str, tuple[bytes, object]]) -> bytes:
    """foundation.ptd for ``entries``: key -> (bytes, formats.layout.TensorLayout or None), in key order."""
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.exir.scalar_type import ScalarType
    from executorch.exir.tensor_layout import TensorLayout
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    keys = sorted(entries)
    named = {}
    for i, k in enumerate(keys):
        layout = entries[k][1]
        named[k] = DataEntry(
            i,
            ALIGNMENT,
            None
            if layout is None
            else TensorLayout(ScalarType(layout.scalar_type), list(layout.sizes), list(layout.dim_order)),
        )
    payload = DataPayload(buffers=[entries[k][0] for k in keys], named_data=named)
    return bytes(FlatTensorSerializer().serialize(payload))


def _program_entry(src: Source, path: Path, data: bytes, lowered, diff: float | None) -> dict:
    ep = src.program.ep
    inputs = [
        n.meta.get("val")
        for n in ep.graph.nodes
        if n.op == "placeholder" and n.name in set(ep.graph_signature.user_inputs)
    ]
    return program_entry(
        name=src.name,
        file=path.name,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        archive=str(src.pt2),
        archive_sha256=sha256_file(src.pt2),
        model=src.model,
        tensors=len(src.keys),
        tensor_bytes=src.tensor_bytes,
        from_foundation=lowered.shared_fqns,
        from_foundation_bytes=sum(src.bytes_of[f] for f in lowered.shared_fqns),
        inputs=[(str(v.dtype).removeprefix("torch."), list(v.shape)) for v in inputs if v is not None],
        sample_max_abs_diff=diff,
    )


def _lower_all(sources: list[Source], shared: set[str], stage: Path, quiet: bool) -> tuple[dict, dict]:
    """Lower every program into ``stage``: (key -> (bytes, layout) it reads from foundation.ptd, name -> Lowered)."""
    external, lowered = {}, {}
    for i, src in enumerate(sources, 1):
        t0 = time.perf_counter()
        low = lower(src.program.ep, shared, stage / ".work" / src.name, f"{src.pt2} ({src.model})")
        for key, (data, layout) in low.external.items():
            if key not in external or external[key][1] is None:
                external[key] = (data, layout)
        (stage / f"{src.name}.pte").write_bytes(low.pte)
        lowered[src.name] = low
        log(
            f"  [{i}/{len(sources)}] {src.name}: {src.pt2.name} ({src.model}), {len(src.keys)} tensors, "
            f"{len(low.shared_fqns)} from {PTD_NAME}; {src.name}.pte {mb(len(low.pte))} in "
            f"{time.perf_counter() - t0:.1f} s",
            quiet,
        )
    return external, lowered


def _finish(
    stage: Path,
    sources: list[Source],
    lowered: dict,
    kept: list[dict],
    config,
    quiet: bool,
    t_start: float,
    references: dict,
) -> Manifest:
    """Check each new program against its archive, write the manifest; returns it."""
    ptd = stage / PTD_NAME
    entries = list(kept)
    for src in sources:
        path = stage / f"{src.name}.pte"
        diff = _max_diff(path, ptd, src, references[src.name])
        if diff is not None:
            log(f"  {src.name}: largest difference from the archive's program on its sample inputs {diff:.3g}", quiet)
        entries.append(_program_entry(src, path, path.read_bytes(), lowered[src.name], diff))
    found = read_ptd(ptd)
    data_bytes = sum(e.size for e in found.entries)
    manifest = programs_manifest(
        config=config,
        foundation=file_entry(
            file=PTD_NAME,
            size=ptd.stat().st_size,
            sha256=sha256_file(ptd),
            tensors=len(found.entries),
            tensor_bytes=data_bytes,
        ),
        programs=entries,
        build_s=time.perf_counter() - t_start,
    )
    write_manifest(stage, manifest)
    b = manifest.byte_report
    log(
        f"  bytes: {PTD_NAME} {mb(manifest.foundation_size)} ({len(found.entries)} shared tensors, "
        f"{mb(data_bytes)}), {len(entries)} .pte {mb(b['programs_bytes'])}: {mb(b['total_with_sharing'])} in all; "
        f"each program on its own {mb(b['total_without_sharing'])}, saved {mb(b['saved'])}",
        quiet,
    )
    return manifest


def _prepare(sources: list[Source]) -> dict:
    """Per-tensor sizes and reference outputs, taken before lowering (which renames the shared tensors)."""
    references = {}
    for src in sources:
        tensors = state_tensors(src.program.ep)
        src.bytes_of = {fqn: len(tensor_bytes(t)) for fqn, t in tensors.items()}
        src.tensor_bytes = sum(src.bytes_of.values())
        references[src.name] = _reference(src)
    return references


def build_programs(config_path, quiet: bool = False) -> Manifest:
    """Build every output of a config that lists ``programs``; returns the manifest (also written)."""
    t_start = time.perf_counter()
    cfg = load_config(config_path)
    log(f"lora-share build {cfg.source} -> {cfg.output_dir}: {len(cfg.programs)} program(s)", quiet)
    sources = [_load(p.name, p.pt2, p.model, f"{cfg.source}: programs[{i}]") for i, p in enumerate(cfg.programs)]
    shared = shared_keys({s.name: s.keys for s in sources})
    references = _prepare(sources)
    log(f"  {len(shared)} tensor(s) in two or more programs -> {PTD_NAME}", quiet)
    with staged_dir(cfg.output_dir) as stage:
        external, lowered = _lower_all(sources, shared, stage, quiet)
        (stage / PTD_NAME).write_bytes(encode_foundation_ptd(external))
        shutil.rmtree(stage / ".work", ignore_errors=True)
        resolved = config_to_dict(cfg)
        (stage / "config.resolved.yaml").write_text(
            yaml.safe_dump({k: v for k, v in resolved.items() if k != "source"}, sort_keys=False)
        )
        return _finish(stage, sources, lowered, [], str(cfg.source), quiet, t_start, references)


def add_program(out_dir, name: str, pt2: Path, model: str | None = None, quiet: bool = False) -> Manifest:
    """Add program ``name`` from ``pt2`` (its ``model``) to the deployment in ``out_dir``, against its
    foundation.ptd as it is; the shipped programs and foundation.ptd are kept byte for byte."""
    t_start = time.perf_counter()
    out_dir = Path(out_dir).resolve()
    previous = read_manifest(out_dir, PROGRAMS)
    ptd = out_dir / PTD_NAME
    if not ptd.is_file() or sha256_file(ptd) != previous.foundation_sha256:
        raise UserError(f"{ptd}: missing or not the file {out_dir / MANIFEST} describes")
    if previous.has_program(name):
        raise UserError(f"{out_dir}: already has a program named {name!r}; pick another name (NAME=ARCHIVE)")
    src = _load(name, pt2, model, str(pt2))
    # What the shipped programs read from foundation.ptd, by their tensors' content keys.
    available = {key for e in previous.programs for key in e["from_foundation"].values()}
    shared = set(src.keys.values()) & available
    references = _prepare([src])
    log(
        f"lora-share add -> {out_dir}: {name} from {pt2} ({src.model}), {len(shared)} tensor(s) from {PTD_NAME}, "
        f"kept as it is",
        quiet,
    )
    stored = {e.key for e in read_ptd(ptd).entries}
    with staged_dir(out_dir) as stage:
        for f in out_dir.iterdir():
            if f.is_file() and f.name != MANIFEST:
                os.link(f, stage / f.name)
        external, lowered = _lower_all([src], shared, stage, quiet)
        missing = sorted(set(external) - stored)
        if missing:
            raise UserError(
                f"{pt2}: {len(missing)} of the tensors it shares with the deployment are laid out for "
                f"another kind of operation than in {PTD_NAME} (key {missing[0][:12]}...): "
                "rebuild the deployment with this program in its config"
            )
        shutil.rmtree(stage / ".work", ignore_errors=True)
        return _finish(stage, [src], lowered, previous.programs, previous.config, quiet, t_start, references)
