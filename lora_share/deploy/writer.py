"""Writing a deployment folder: foundation.ptd, one .pte per adapter, adapters_shared.ptd,
the tokenizer files, manifest.json and config.resolved.yaml.

Everything is written into a staging folder that replaces the output folder only when the
whole build succeeded (``files.staged_dir``), so a failed or interrupted build leaves the
previous outputs as they were. Unchanged files of the previous outputs are hard-linked, never
rewritten: foundation.ptd when the foundation is the same, an adapter's .pte when the bytes it
would get are the bytes it has.

The program comes from ``ProgramSource``: the previous build's, when it was exported for the
same foundation, settings and envelope, or one new export (which also writes foundation.ptd).
Each adapter's .pte is that program plus the adapter's data (deploy/adapter_pte.py): written, not
exported.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..checkpoints.adapters import Adapter
from ..errors import UserError
from ..export.revision import EXPORTER_REVISION, FOUNDATION_TAG
from ..files import sha256_file, staged_dir
from ..formats import read_ptd
from ..formats.meta import SHARED_KEY
from ..formats.shared_ptd import SHARED_PTD, encode_shared_ptd
from ..manifest import (
    Manifest,
    adapter_entry,
    adapters_manifest,
    file_entry,
    foundation_section,
    lora_slot,
    program_section,
    with_quantization_error,
    write_manifest,
)
from ..model.envelope import Envelope
from .adapter_pte import Program
from .byte_report import byte_report, report_lines
from .records import adapter_meta

if TYPE_CHECKING:
    from ..checkpoints.foundation import Foundation  # torch's tensors: loaded only when a build needs it

PTD_NAME = f"{FOUNDATION_TAG}.ptd"


def log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def program_signature(fingerprint: str, settings: dict, envelope: Envelope) -> str:
    """What the exported program depends on: the foundation, the export settings, the exporter's
    revision and the envelope."""
    what = {
        "foundation": fingerprint,
        "export": settings,
        "exporter": EXPORTER_REVISION,
        "envelope": {k: v for k, v in envelope.to_dict().items() if k != "skip_absent"},
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Deployment:
    """What a build (or an add) writes, apart from its adapters."""

    out_dir: Path
    fingerprint: str
    settings: dict
    envelope: Envelope
    foundation_described: dict  # the manifest's foundation section beyond its file (manifest.describe_foundation)
    resolved_config: dict
    get_foundation: Callable[[], Foundation]  # for an export and for quantization errors; may load it
    tokenizer: Callable[[Path], dict] | None = None  # stages the tokenizer files, returns the manifest section
    hoist: bool = False  # dedup.shared_adapter_tensors: hoist
    measure_quantization: bool = True  # each written adapter's quantization error (quantized foundations)
    previous: Manifest | None = field(default=None)  # the manifest of the outputs being replaced
    # For ``add`` to a build with adapters_shared.ptd: the keys it holds (new adapters read exactly
    # those from it; it is not rewritten).
    shared_available: set[str] | None = None
    started: float = field(default_factory=time.perf_counter)  # when the build began (the manifest's build_s)


class ProgramSource:
    """The deployment's program, reused from the previous outputs or exported once."""

    def __init__(self, dep: Deployment, export: Callable[[Path], tuple[Program, Path]], quiet: bool):
        self.dep, self.export, self.quiet = dep, export, quiet
        self.signature = program_signature(dep.fingerprint, dep.settings, dep.envelope)
        self.how, self.seconds = "", 0.0

    def previous_program(self) -> Program | None:
        old = self.dep.previous
        if not old or old.program_signature != self.signature or not old.adapters:
            return None
        path = self.dep.out_dir / old.adapter_files[0]
        try:
            program = Program.from_adapter_file(path)
        except (OSError, ValueError, UserError):  # missing, damaged or unsealed: export again
            return None
        return program if program.sha256 == old.program_sha256 else None

    def get(self, stage: Path) -> Program:
        """The program; puts foundation.ptd into ``stage`` (hard-linked from the previous outputs
        when they had this foundation)."""
        t0 = time.perf_counter()
        program, reuse_ptd = self.previous_program(), self.dep.previous is not None
        if program is not None:
            self.how = "reused"
        else:
            log(
                f"  exporting the program: LoRA on {', '.join(self.dep.envelope.targets)} of "
                f"{len(self.dep.envelope.layers)} layer(s), ranks 1..{self.dep.envelope.max_rank}",
                self.quiet,
            )
            from ..export.memory import release_after_export

            program, ptd = self.export(stage / ".work")
            release_after_export()
            self.how = "exported"
            reuse_ptd = reuse_ptd and self.dep.previous.foundation_sha256 == sha256_file(ptd)
            if not reuse_ptd:
                os.replace(ptd, stage / PTD_NAME)
        if reuse_ptd:
            os.link(self.dep.out_dir / PTD_NAME, stage / PTD_NAME)
        self.seconds = time.perf_counter() - t0
        return program


def _hoisted_keys(adapters_keys: dict[str, set[str]], available: set[str] | None) -> set[str]:
    """Keys that go to adapters_shared.ptd: those two or more adapters have, or, for ``add``, those
    the existing file already holds (``available``)."""
    if available is not None:
        return {k for keys in adapters_keys.values() for k in keys} & available
    holders: dict[str, int] = {}
    for keys in adapters_keys.values():
        for k in keys:
            holders[k] = holders.get(k, 0) + 1
    return {k for k, n in holders.items() if n > 1}


def _shared_entry(path: Path) -> dict:
    ptd = read_ptd(path)
    tensors = [e for e in ptd.entries if e.key != SHARED_KEY]
    return file_entry(
        file=path.name,
        size=path.stat().st_size,
        sha256=sha256_file(path),
        tensors=len(tensors),
        tensor_bytes=sum(e.size for e in tensors),
    )


def _write_shared(stage: Path, dep: Deployment, tensors: dict[str, bytes] | None) -> Path:
    """adapters_shared.ptd in the staging folder: ``tensors`` written, or (None) the previous file
    hard-linked; also hard-linked when the previous one has the same bytes."""
    dest, old = stage / SHARED_PTD, dep.out_dir / SHARED_PTD
    old_sha = ((dep.previous and dep.previous.shared) or {}).get("sha256")
    data = encode_shared_ptd(tensors, dep.fingerprint) if tensors is not None else None
    if data is None or (old_sha == hashlib.sha256(data).hexdigest() and old.is_file() and sha256_file(old) == old_sha):
        os.link(old, dest)
    else:
        dest.write_bytes(data)
    return dest


def _stage_shared(stage: Path, dep: Deployment, metas: dict, keep: list[dict]) -> tuple[Path | None, set[str]]:
    """With hoisting: adapters_shared.ptd in ``stage`` and the keys it holds for the adapters
    (``metas``: new or rebuilt, ``keep``: previous entries); without: (None, no keys)."""
    if not dep.hoist:
        return None, set()
    keys = {name: {k for e in m.lora for k in (e.a, e.b)} for name, (m, _) in metas.items()}
    keys.update({e["name"]: {k for s in e["lora"] for k in (s["a"], s["b"])} for e in keep})
    hoisted = _hoisted_keys(keys, dep.shared_available)
    tensors = {k: raw for _, t in metas.values() for k, raw in t.items() if k in hoisted}
    return _write_shared(stage, dep, None if dep.shared_available is not None else tensors), hoisted


def _write_adapter(
    stage: Path,
    dep: Deployment,
    program: Program,
    adapter: Adapter,
    *,
    meta_and_tensors: tuple,
    hoisted: set[str],
    shared: Path | None,
    quiet: bool,
) -> dict:
    """``adapter``'s .pte in ``stage`` (hard-linked when the previous outputs have these bytes) and its
    manifest entry, with its quantization error on a quantized foundation."""
    meta, tensors = meta_and_tensors
    t0 = time.perf_counter()
    own = {k: raw for k, raw in tensors.items() if k not in hoisted}
    data = program.write(meta, own, skip_absent=dep.envelope.skip_absent)
    sha = hashlib.sha256(data).hexdigest()
    path = stage / f"{adapter.name}.pte"
    old = dep.previous.adapter(adapter.name) if dep.previous else None
    if old and old.get("sha256") == sha and (dep.out_dir / old["file"]).is_file():
        os.link(dep.out_dir / old["file"], path)
        how = "reused"
    else:
        path.write_bytes(data)
        how = "written"
    seconds = time.perf_counter() - t0
    entry = adapter_entry(
        name=adapter.name,
        file=path.name,
        size=len(data),
        sha256=sha,
        lora_bytes=meta.lora_bytes,
        produced=how,
        seconds=seconds,
        described=adapter.meta,
        lora=[
            lora_slot(
                layer=dep.envelope.slots[e.slot][0], target=dep.envelope.slots[e.slot][1], rank=e.rank, a=e.a, b=e.b
            )
            for e in meta.lora
        ],
        hoisted=sorted(set(tensors) & hoisted) if dep.hoist else None,
    )
    note = f", {len(entry['hoisted'])} tensor(s) in {SHARED_PTD}" if entry.get("hoisted") else ""
    log(f"        {how} in {seconds:.2f} s: {path.name} {mb(len(data))}{note}", quiet)
    if dep.settings.get("quantize") and dep.measure_quantization:
        from .quant_error import adapter_quantization_error, format_error  # torch, and only here

        err = (old or {}).get("quantization_error") if how == "reused" else None
        err = err or adapter_quantization_error(
            dep.get_foundation(), adapter, path, stage / PTD_NAME, shared if entry.get("hoisted") else None
        )
        entry = with_quantization_error(entry, err)
        log(f"        quantized foundation {format_error(err)}", quiet)
    return entry


def _assemble_manifest(
    stage: Path,
    dep: Deployment,
    *,
    source: ProgramSource,
    program: Program,
    tokenizer_section: dict | None,
    shared: Path | None,
    entries: list[dict],
) -> Manifest:
    """The manifest of the staged outputs, its byte report read back from the files."""
    ptd = stage / PTD_NAME
    return adapters_manifest(
        config=dep.resolved_config.get("source"),
        export_settings=dep.settings,
        exporter=EXPORTER_REVISION,
        foundation=foundation_section(
            file=ptd.name,
            size=ptd.stat().st_size,
            sha256=sha256_file(ptd),
            fingerprint=dep.fingerprint,
            described=dep.foundation_described,
        ),
        program=program_section(
            signature=source.signature,
            sha256=program.sha256,
            envelope=dep.envelope,
            produced=source.how,
            seconds=source.seconds,
        ),
        tokenizer=tokenizer_section,
        shared=_shared_entry(shared) if shared else None,
        adapters=entries,
        byte_report=byte_report(
            stage, PTD_NAME, {e["name"]: e["file"] for e in entries}, shared.name if shared else None
        ),
        build_s=round(time.perf_counter() - dep.started, 2),
    )


def write_outputs(
    dep: Deployment, program_source: ProgramSource, adapters: list[Adapter], keep: list[dict], *, quiet: bool
) -> Manifest:
    """Write every output of ``dep`` into a staging folder that replaces ``dep.out_dir`` at the end:
    the program and foundation.ptd, adapters_shared.ptd, the tokenizer files, ``adapters`` (new or
    rebuilt) and ``keep`` (previous manifest entries kept as they are), the resolved config and the
    manifest."""
    metas = {a.name: adapter_meta(a, dep.fingerprint, dep.envelope) for a in adapters}
    with staged_dir(dep.out_dir) as stage:
        program = program_source.get(stage)
        log(f"  program: {program_source.how} in {program_source.seconds:.1f} s (sha256 {program.sha256[:12]})", quiet)
        shared, hoisted = _stage_shared(stage, dep, metas, keep)
        tokenizer_section = dep.tokenizer(stage) if dep.tokenizer else None
        for entry in keep:
            os.link(dep.out_dir / entry["file"], stage / entry["file"])
        entries = list(keep)
        for i, adapter in enumerate(adapters, 1):
            meta = metas[adapter.name][0]
            log(
                f"  [{i}/{len(adapters)}] {adapter.name}: rank {meta.rank}, alpha {meta.alpha:g}, "
                f"targets {','.join(meta.targets)}",
                quiet,
            )
            entries.append(
                _write_adapter(
                    stage,
                    dep,
                    program,
                    adapter,
                    meta_and_tensors=metas[adapter.name],
                    hoisted=hoisted,
                    shared=shared,
                    quiet=quiet,
                )
            )
        if (stage / ".work").exists():
            shutil.rmtree(stage / ".work")
        manifest = _assemble_manifest(
            stage,
            dep,
            source=program_source,
            program=program,
            tokenizer_section=tokenizer_section,
            shared=shared,
            entries=entries,
        )
        for line in report_lines(manifest.byte_report):
            log(line, quiet)
        config_out = {k: v for k, v in dep.resolved_config.items() if k != "source"}
        (stage / "config.resolved.yaml").write_text(yaml.safe_dump(config_out, sort_keys=False))
        write_manifest(stage, manifest)
    total = sum(e["size"] for e in entries)
    shared_note = f", {SHARED_PTD} {mb(manifest.shared['size'])}" if shared else ""
    tokenizer_note = f"tokenizer ({len(tokenizer_section['files'])} files)" if tokenizer_section else "no tokenizer"
    log(
        f"  wrote {dep.out_dir}: foundation.ptd {mb(manifest.foundation_size)}{shared_note}, "
        f"{len(entries)} adapter .pte {mb(total)} in all, {tokenizer_note}, {manifest.build_s:.1f} s",
        quiet,
    )
    return manifest
