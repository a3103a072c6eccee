"""``lora-share build`` and ``lora-share add``: foundation.ptd + one .pte per adapter + manifest.json.

Everything is read and checked before anything is written (deploy/writer.py writes, all or nothing).
The deployment's program is exported once per foundation and LoRA envelope (model/envelope.py); every
adapter inside the envelope is data for it: its .pte is written in a fraction of a second, with no
export. ``build`` reuses the previous outputs' program and foundation.ptd when the foundation,
export settings and envelope are unchanged; ``add`` never exports: an adapter outside the
deployment's envelope is refused, naming the ``lora_envelope`` key to widen.

The checkpoint's tokenizer files (tokenizer/files.py) are copied beside foundation.ptd and listed
in the manifest's ``tokenizer`` section; ``add`` hard-links them and keeps that section as it was.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..checkpoints.adapters import load_adapter, load_peft
from ..config import (
    BASE_NAME,
    config_to_dict,
    export_settings,
    foundation_from_dict,
    hoists_shared_tensors,
    load_config,
    name_problem,
    require_adapters,
)
from ..errors import ConfigErrors, UserError
from ..export.revision import EXPORTER_REVISION
from ..files import sha256_file
from ..formats import read_ptd
from ..formats.meta import FOUNDATION_KEY, SHARED_KEY, encode_foundation
from ..formats.shared_ptd import SHARED_PTD
from ..manifest import ADAPTERS, MANIFEST, PROGRAMS, Manifest, describe_foundation, kind_words, read_manifest
from ..model.envelope import Envelope
from ..tokenizer.files import TokenizerSource, find_tokenizer, section_for_build, shipped_files, stage_files
from .adapter_pte import Program
from .records import foundation_meta
from .writer import PTD_NAME, Deployment, ProgramSource, log, write_outputs

if TYPE_CHECKING:  # the foundation's weights, the eager model and the export need torch: only build imports them
    from ..checkpoints.foundation import Foundation


def foundation_fingerprint(foundation: Foundation) -> str:
    """Content fingerprint: sha256 over (name, dtype, shape, bytes) of every tensor, sorted by name.

    It depends only on the weights, not on how any file lays them out; a quantized
    foundation (other weights in foundation.ptd) also hashes its quantization settings.
    """
    h = hashlib.sha256()
    for name in sorted(foundation.tensors):
        t = foundation.tensors[name].contiguous()
        h.update(f"{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        h.update(memoryview(t.numpy()).cast("B"))
    if foundation.quantize is not None:
        h.update(f"quantize\0{json.dumps(config_to_dict(foundation.quantize), sort_keys=True)}".encode())
    return h.hexdigest()


def _previous_outputs(out_dir: Path, fingerprint: str, settings: dict) -> Manifest | None:
    """The earlier build in ``out_dir`` if its foundation.ptd can be kept as it is."""
    try:
        manifest = read_manifest(out_dir, ADAPTERS)
    except UserError:
        return None
    ptd = out_dir / PTD_NAME
    if (
        manifest.fingerprint != fingerprint
        or manifest.export_settings != settings
        or manifest.exporter != EXPORTER_REVISION
        or not ptd.is_file()
    ):
        return None
    if ptd.stat().st_size != manifest.foundation_size or sha256_file(ptd) != manifest.foundation_sha256:
        return None
    return manifest


def _exporter(dep: Deployment):
    """Exports ``dep``'s program into a work folder: (the program, the foundation.ptd it wrote)."""

    def export(workdir: Path) -> tuple[Program, Path]:
        from ..export.eager import eager_model
        from ..export.program import export_program

        foundation = dep.get_foundation()
        record = encode_foundation(foundation_meta(foundation, dep.fingerprint))
        model = eager_model(foundation, envelope=dep.envelope)
        # decode_batch too: a runtime with several KV slots (--parallel) batches requests with it.
        exported = export_program(model, dep.envelope, workdir, {FOUNDATION_KEY: record}, batch=True)
        return Program(exported.pte, "the exported program"), exported.ptd

    return export


def build(config_path, quiet: bool = False) -> Manifest:
    """Build every output of ``config_path``; returns the manifest (also written to disk)."""
    from ..checkpoints.foundation import load_foundation

    t_start = time.perf_counter()
    cfg = load_config(config_path)
    require_adapters(cfg, "this command")
    log(f"lora-share build {cfg.source} -> {cfg.output_dir}", quiet)
    foundation = load_foundation(cfg.foundation)
    n_params = sum(t.numel() for t in foundation.tensors.values())
    log(
        f"  foundation: {foundation.source['kind']}, {foundation.args.n_layers} layers, dim {foundation.args.dim}, "
        f"{n_params / 1e6:.1f} M parameters",
        quiet,
    )
    adapters = []
    for i, acfg in enumerate(cfg.adapters):
        try:
            adapters.append(load_adapter(acfg, foundation.args))
        except UserError as e:
            raise UserError(f"{cfg.source}: adapters[{i}] ({acfg.name}): {e}") from None
    envelope = Envelope.resolve(cfg.lora_envelope, adapters, foundation.args)
    envelope.require_fits(adapters, f"widen lora_envelope in {cfg.source} and rebuild")
    tokenizer = find_tokenizer(cfg.foundation, foundation.args.vocab_size)
    log(_tokenizer_line(tokenizer, cfg.foundation.checkpoint), quiet)
    settings = export_settings(cfg.foundation)
    fingerprint = foundation_fingerprint(foundation)
    previous = _previous_outputs(cfg.output_dir, fingerprint, settings)
    if previous:
        log(f"  foundation unchanged since the last build: keeping {PTD_NAME}", quiet)
    described = describe_foundation(
        parameters=n_params,
        args=foundation.args,
        source=foundation.source,
        quantize=config_to_dict(cfg.foundation.quantize) if cfg.foundation.quantize is not None else None,
    )

    def copy_tokenizer(stage: Path) -> dict:
        return section_for_build(tokenizer, stage_files(stage, tokenizer.files, link=False), fingerprint)

    dep = Deployment(
        out_dir=cfg.output_dir,
        fingerprint=fingerprint,
        settings=settings,
        envelope=envelope,
        foundation_described=described,
        resolved_config={"source": str(cfg.source), **config_to_dict(cfg)},
        get_foundation=lambda: foundation,
        tokenizer=copy_tokenizer if tokenizer else None,
        hoist=hoists_shared_tensors(cfg),
        previous=previous,
        started=t_start,
    )
    return write_outputs(dep, ProgramSource(dep, _exporter(dep), quiet), adapters, [], quiet=quiet)


def _tokenizer_line(tokenizer: TokenizerSource | None, checkpoint: Path | None) -> str:
    if tokenizer is None:
        where = f"no tokenizer.json in {checkpoint}" if checkpoint else "a synthetic foundation"
        return f"  tokenizer: none ({where}; set foundation.tokenizer to ship one): run takes token ids only"
    eos = ",".join(map(str, tokenizer.eos_token_ids)) or "none"
    chat = ", chat template" if tokenizer.chat_template else ""
    return (
        f"  tokenizer: {', '.join(tokenizer.files)} from {tokenizer.folder} "
        f"(eos ids {eos}, bos id {tokenizer.bos_token_id}{chat})"
    )


def add(out_dir, peft_dirs: list[tuple[str, Path]], quiet: bool = False) -> Manifest:
    """Add PEFT adapters to an existing build: each is written as data for the deployment's program
    (no export; foundation.ptd and the shipped adapters are kept as they are). An adapter outside
    the deployment's LoRA envelope is refused, naming the key to widen."""
    t_start = time.perf_counter()
    out_dir = Path(out_dir).resolve()
    previous = read_manifest(out_dir, ADAPTERS)
    ptd = out_dir / PTD_NAME
    if not ptd.is_file() or ptd.stat().st_size != previous.foundation_size:
        raise UserError(f"{ptd}: missing or not the file {out_dir / MANIFEST} describes")
    envelope = previous.envelope
    adapters = _load_new_adapters(out_dir, peft_dirs, set(previous.adapter_names), previous.model_args)
    # The folder being added to is the one to rebuild: its own resolved config, its output_dir set to
    # it (a copied deployment's config still names the folder it was built in).
    envelope.require_fits(
        adapters,
        f"{out_dir} was built with this envelope: to widen it, rebuild that folder: "
        f"edit lora_envelope in {out_dir / 'config.resolved.yaml'} (and output_dir to "
        f"{out_dir}), then lora-share build it",
    )
    log(f"lora-share add -> {out_dir}: {len(adapters)} adapter(s), keeping {PTD_NAME} and the program", quiet)

    resolved = yaml.safe_load((out_dir / "config.resolved.yaml").read_text())
    resolved["adapters"] = resolved.get("adapters", []) + [
        {"name": n, "peft": str(Path(f).resolve())} for n, f in peft_dirs
    ]
    resolved["source"] = previous.config
    tokenizer_files = shipped_files(out_dir, previous)

    def keep_tokenizer(stage: Path) -> dict:  # hard-linked as they are; the section kept word for word
        stage_files(stage, tokenizer_files, link=True)
        return previous.tokenizer

    def no_export(workdir: Path):
        raise UserError(
            f"{out_dir}: its adapter files do not carry the program {previous.program_sha256[:12]} "
            "the manifest names: rebuild the deployment with `lora-share build`"
        )

    dep = Deployment(
        out_dir=out_dir,
        fingerprint=previous.fingerprint,
        settings=previous.export_settings,
        envelope=envelope,
        foundation_described=previous.foundation_description,
        resolved_config=resolved,
        get_foundation=functools.cache(lambda: _reload_foundation(previous)),
        tokenizer=keep_tokenizer if previous.tokenizer else None,
        hoist=previous.shared is not None,
        measure_quantization=False,
        previous=previous,
        shared_available=_existing_shared_keys(out_dir, previous),
        started=t_start,
    )
    return write_outputs(dep, ProgramSource(dep, no_export, quiet), adapters, previous.adapters, quiet=quiet)


def _load_new_adapters(out_dir: Path, peft_dirs: list[tuple[str, Path]], existing: set[str], args) -> list:
    """The PEFT adapters ``add`` was given, each checked and read; every problem of every adapter is
    reported at once (a name that breaks the rule, is in use or is the reserved base name, a PT2
    archive or another file, a missing folder, an unreadable adapter)."""
    adapters, problems = [], []
    for name, folder in peft_dirs:
        folder = Path(folder)
        if bad_name := name_problem(name):
            problems.append(f"{folder}: adapter name {bad_name}; give another as NAME=DIR")
        elif name in existing:
            problems.append(f"{out_dir}: already has an adapter named {name!r}; pick another name (NAME=DIR)")
        elif name == BASE_NAME:
            problems.append(
                f"{folder}: {BASE_NAME!r} is the name of the foundation alone (no adapter) in the "
                "runner, the C API and the server; pick another name (NAME=DIR)"
            )
        elif folder.is_file() and folder.suffix == ".pt2":
            problems.append(
                f"{folder}: a PT2 archive, which `add` puts into {kind_words(PROGRAMS)}; {out_dir} is "
                f"{kind_words(ADAPTERS)}"
            )
        elif folder.is_file():
            problems.append(
                f"{folder}: a file, not a PEFT adapter folder (a folder with adapter_config.json and "
                "adapter_model.safetensors)"
            )
        elif not folder.is_dir():
            problems.append(f"{folder}: no such folder (a PEFT adapter folder)")
        else:
            try:
                adapters.append(load_peft(name, Path(folder), args))
            except UserError as e:
                problems.append(str(e))
        existing.add(name)
    if len(problems) == 1:
        raise UserError(problems[0])
    if problems:
        raise ConfigErrors(f"lora-share add --to {out_dir}", problems)
    return adapters


def _existing_shared_keys(out_dir: Path, previous: Manifest) -> set[str] | None:
    """For ``add`` to a build with adapters_shared.ptd: the keys it holds (new adapters read those
    from it, and it stays as it is)."""
    if previous.shared is None:
        return None
    path = out_dir / SHARED_PTD
    if not path.is_file() or sha256_file(path) != previous.shared["sha256"]:
        raise UserError(f"{path}: missing or not the file {out_dir / MANIFEST} describes")
    return {e.key for e in read_ptd(path).entries} - {SHARED_KEY}


def _reload_foundation(manifest: Manifest) -> Foundation:
    """The foundation a manifest was built from, checked against its fingerprint."""
    from ..checkpoints.foundation import load_foundation

    settings = manifest.export_settings
    foundation = load_foundation(foundation_from_dict(settings, "manifest export_settings"))
    if foundation_fingerprint(foundation) != manifest.fingerprint:
        raise UserError(
            f"the foundation at {settings.get('checkpoint', 'synthetic')} no longer has the fingerprint recorded in "
            f"the manifest: rebuild"
        )
    return foundation
