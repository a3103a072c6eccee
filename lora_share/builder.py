"""``lora-share build`` and ``lora-share add``: foundation.ptd + one .pte per adapter + manifest.json.

Everything is read and checked before anything is exported, and all outputs are
written into a staging folder that replaces the output folder only when the
whole build succeeded, so a failed or interrupted build leaves the previous
outputs as they were.

Each adapter's .pte comes the cheapest exact way:
- reused: an earlier build of the same folder made it from the same tensors over
  the same foundation (hard-linked, untouched);
- substituted: another adapter with the same graph signature was exported, so its
  .pte is rewritten with this adapter's tensors (``fastpath``), byte-identical to
  a full export;
- exported: torch.export + XNNPACK lowering, once per signature.
When the foundation is unchanged, foundation.ptd is hard-linked from the
previous outputs: neither rewritten nor touched.

With ``dedup.shared_adapter_tensors: hoist`` the tensors two or more adapters
have are written once to adapters_shared.ptd (shared_data.py) and left out of
their .pte files; which slots an adapter reads from there is part of its
signature. ``lora-share add`` never rewrites a shipped file: a new adapter
reads from adapters_shared.ptd exactly the tensors already in it.

The checkpoint's tokenizer files (tokenizer_files.py) are copied beside
foundation.ptd and listed in the manifest's ``tokenizer`` section; ``add``
hard-links them and keeps that section as it was.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import yaml

from .adapters import Adapter, load_adapter, load_peft
from .config import config_to_dict, export_settings, foundation_from_dict, hoists_shared_tensors, load_config
from .errors import UserError
from .eager import eager_model
from .export import EXPORTER_REVISION, FOUNDATION_TAG, export_program
from .fastpath import NotSubstitutable, signature, slot_param_name, slot_tensors, substitute, tensor_keys
from .files import sha256_file, staged_dir
from .foundation import Foundation, load_foundation
from .model import ModelArgs
from .formats import read_ptd
from .formats.meta import ADAPTER_KEY, SHARED_KEY, encode_adapter
from .quant_error import adapter_quantization_error, format_error
from .dedup import byte_report, report_lines
from .formats.seal import seal_pte
from .records import adapter_meta, export_named_data
from .shared_data import SHARED_PTD, encode_shared_ptd, plan_hoisting
from .tokenizer_files import TokenizerSource, find_tokenizer, manifest_section, shipped_files, stage_files

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "lora-share-manifest"
MANIFEST_VERSION = 1
PTD_NAME = f"{FOUNDATION_TAG}.ptd"


def foundation_fingerprint(foundation: Foundation) -> str:
    """Content fingerprint: sha256 over (name, dtype, shape, bytes) of every tensor, sorted by name.

    It depends only on the weights, not on how any file lays them out; a quantized
    foundation (other weights in foundation.ptd) also hashes its quantization settings.
    """
    h = hashlib.sha256()
    for name in sorted(foundation.tensors):
        t = foundation.tensors[name].contiguous()
        h.update(f"{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        h.update(t.numpy().tobytes())
    if foundation.quantize is not None:
        h.update(f"quantize\0{json.dumps(config_to_dict(foundation.quantize), sort_keys=True)}".encode())
    return h.hexdigest()


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def read_manifest(out_dir: Path) -> dict:
    """The manifest of an existing build, checked against the foundation.ptd beside it."""
    path = Path(out_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: missing: is {out_dir} the output folder of a lora-share build?") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable manifest ({e})") from None
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise UserError(f"{path}: not a lora-share manifest of version {MANIFEST_VERSION}")
    return manifest


def _previous_outputs(out_dir: Path, fingerprint: str, settings: dict) -> dict | None:
    """The earlier build in ``out_dir`` if its foundation.ptd can be kept as it is."""
    try:
        manifest = read_manifest(out_dir)
    except UserError:
        return None
    fnd = manifest["foundation"]
    ptd = out_dir / PTD_NAME
    if (fnd.get("fingerprint") != fingerprint or manifest.get("export_settings") != settings
            or manifest.get("exporter") != EXPORTER_REVISION or not ptd.is_file()):
        return None
    if ptd.stat().st_size != fnd["size"] or sha256_file(ptd) != fnd["sha256"]:
        return None
    return manifest


@dataclass
class _Sharing:
    """What goes to adapters_shared.ptd (dedup.shared_adapter_tensors: hoist)."""

    plan: dict[str, list[str]]  # adapter name -> its slots read from the shared file
    file: bytes | None  # the file to write; None: keep the previous build's as it is


def _plan_sharing(adapters: list[Adapter], fingerprint: str) -> _Sharing:
    """Hoist every tensor that two or more of ``adapters`` have."""
    keys = {a.name: tensor_keys(a) for a in adapters}
    plan = plan_hoisting(keys)
    tensors = {}
    for adapter in adapters:
        raw = slot_tensors(adapter)
        tensors.update({keys[adapter.name][slot]: raw[slot] for slot in plan[adapter.name]})
    return _Sharing(plan, encode_shared_ptd(tensors, fingerprint))


def _check_exported_shared(name: str, exported_ptd: bytes, shared: bytes) -> None:
    """The export's own adapters_shared.ptd must hold nothing the build's lacks or holds differently."""
    ours = read_ptd(shared, SHARED_PTD)
    for e in read_ptd(exported_ptd, f"{name}'s exported {SHARED_PTD}").entries:
        if e.key not in ours or ours.data(e.key) != exported_ptd[e.start:e.end]:
            raise RuntimeError(f"adapter {name}: its export reads shared tensor {e.key[:12]} that {SHARED_PTD} "
                               "does not hold as exported")


class _Producer:
    """Makes adapter .pte bytes the cheapest exact way (see module docstring)."""

    def __init__(self, out_dir: Path, previous: dict | None, get_foundation: Callable[[], Foundation],
                 fingerprint: str, settings: dict, workdir: Path, shared_file: Path | None):
        self.out_dir, self.get_foundation, self.workdir = out_dir, get_foundation, workdir
        self.shared_file = shared_file
        self.fingerprint, self.settings = fingerprint, settings
        self.previous = {a["name"]: a for a in (previous or {}).get("adapters", [])}
        self.templates: dict[str, tuple[Callable[[], bytes], dict]] = {}
        for entry in self.previous.values():
            path = out_dir / entry["file"]
            self.templates.setdefault(entry["signature"], (lambda p=path: p.read_bytes(), entry["tensor_keys"]))
        self.ptd: bytes | None = None  # set by the first export when there is no previous foundation.ptd
        self.ptd_sha = (previous or {}).get("foundation", {}).get("sha256")

    def produce(self, adapter: Adapter, hoisted: list[str], sig: str, keys: dict[str, str]
                ) -> tuple[bytes | Path, str, float]:
        """(.pte bytes or an existing file to keep, how, seconds); ``hoisted`` slots are read
        from adapters_shared.ptd; ``sig`` and ``keys`` are the adapter's signature and tensor keys."""
        t0 = time.perf_counter()
        old = self.previous.get(adapter.name)
        if old and old["signature"] == sig and old["tensor_keys"] == keys:
            return self.out_dir / old["file"], "reused", time.perf_counter() - t0
        if sig in self.templates:
            template, template_keys = self.templates[sig]
            try:
                record = {ADAPTER_KEY: encode_adapter(adapter_meta(adapter, self.fingerprint))}
                pte = substitute(template(), template_keys, adapter, record, hoisted)
                return pte, "substituted", time.perf_counter() - t0
            except NotSubstitutable:
                pass
        foundation = self.get_foundation()
        exported = export_program(eager_model(foundation, adapter), self.workdir / adapter.name,
                                  export_named_data(foundation, adapter, self.fingerprint),
                                  shared=frozenset(map(slot_param_name, hoisted)))
        if hoisted:
            _check_exported_shared(adapter.name, exported.shared_ptd, self.shared_file.read_bytes())
        sha = hashlib.sha256(exported.ptd).hexdigest()
        if self.ptd_sha is None:
            self.ptd, self.ptd_sha = exported.ptd, sha
        elif sha != self.ptd_sha:
            raise RuntimeError(
                f"adapter {adapter.name}: its export produced different foundation bytes "
                f"(sha256 {sha[:12]} vs {self.ptd_sha[:12]}); refusing to write a foundation.ptd it cannot share"
            )
        pte = exported.pte
        self.templates.setdefault(sig, (lambda: pte, keys))
        return pte, "exported", time.perf_counter() - t0


def _link_or_write(dest: Path, content: bytes | Path) -> None:
    if isinstance(content, Path):
        os.link(content, dest)  # same file system: the staging folder is a sibling
    else:
        dest.write_bytes(seal_pte(content))  # size + CRC-32 into its record (formats/seal.py)


def _write_shared(stage: Path, out_dir: Path, sharing: _Sharing, previous: dict | None) -> Path:
    """adapters_shared.ptd in the staging folder: hard-linked when the previous one has the same bytes."""
    dest, old = stage / SHARED_PTD, out_dir / SHARED_PTD
    old_sha = ((previous or {}).get("shared") or {}).get("sha256")
    if sharing.file is None or (old_sha == hashlib.sha256(sharing.file).hexdigest() and old.is_file()
                                and sha256_file(old) == old_sha):
        os.link(old, dest)
    else:
        dest.write_bytes(sharing.file)
    return dest


def _shared_entry(path: Path) -> dict:
    ptd = read_ptd(path)
    tensors = [e for e in ptd.entries if e.key != SHARED_KEY]
    return {"file": path.name, "size": path.stat().st_size, "sha256": sha256_file(path),
            "tensors": len(tensors), "tensor_bytes": sum(e.size for e in tensors)}


def _write_outputs(out_dir: Path, adapters: list[Adapter], keep: list[dict], previous: dict | None,
                   get_foundation: Callable[[], Foundation], fingerprint: str, settings: dict,
                   foundation_entry: dict, resolved_config: dict, quiet: bool, t_start: float,
                   sharing: _Sharing | None = None, tokenizer: Callable[[Path], dict] | None = None) -> dict:
    """Write every output into a staging folder that replaces ``out_dir`` at the end; ``tokenizer``
    puts the tokenizer files into the staging folder and returns the manifest's tokenizer section."""
    entries = []
    with staged_dir(out_dir) as stage:
        shared = _write_shared(stage, out_dir, sharing, previous) if sharing else None
        tokenizer_section = tokenizer(stage) if tokenizer else None
        producer = _Producer(out_dir, previous, get_foundation, fingerprint, settings, stage / ".work", shared)
        if previous:
            os.link(out_dir / PTD_NAME, stage / PTD_NAME)
        for entry in keep:
            os.link(out_dir / entry["file"], stage / entry["file"])
            entries.append(entry)
        for i, adapter in enumerate(adapters, 1):
            meta = adapter.meta
            _log(f"  [{i}/{len(adapters)}] {adapter.name}: rank {meta['rank']}, alpha {meta['alpha']}, "
                 f"targets {','.join(meta['targets'])}", quiet)
            hoisted = sharing.plan[adapter.name] if sharing else []
            sig, keys = signature(adapter, fingerprint, settings, hoisted), tensor_keys(adapter)
            content, how, seconds = producer.produce(adapter, hoisted, sig, keys)
            if producer.ptd is not None and not (stage / PTD_NAME).exists():
                (stage / PTD_NAME).write_bytes(producer.ptd)
            pte_path = stage / f"{adapter.name}.pte"
            _link_or_write(pte_path, content)
            lora_bytes = sum(a.numel() * 4 + b.numel() * 4 for a, b in adapter.weights.values())
            entries.append({
                "name": adapter.name, "file": pte_path.name, "size": pte_path.stat().st_size,
                "sha256": sha256_file(pte_path), "lora_bytes": lora_bytes, "produced": how,
                "seconds": round(seconds, 3), "signature": sig,
                **meta, "tensor_keys": keys, **({"hoisted": hoisted} if sharing else {}),
            })
            shared_note = f", {len(hoisted)} tensor(s) in {SHARED_PTD}" if hoisted else ""
            _log(f"        {how} in {seconds:.2f} s: {pte_path.name} {_mb(pte_path.stat().st_size)}{shared_note}",
                 quiet)
            if settings.get("quantize"):  # how far the quantized foundation moves this adapter's logits
                old = (previous or {}).get("adapters", [])
                err = next((a.get("quantization_error") for a in old if how == "reused" and a["name"] == adapter.name),
                           None) or adapter_quantization_error(
                    get_foundation(), adapter, pte_path, stage / PTD_NAME, shared if hoisted else None)
                entries[-1]["quantization_error"] = err
                _log(f"        quantized foundation {format_error(err)}", quiet)
        if (stage / ".work").exists():
            import shutil

            shutil.rmtree(stage / ".work")
        ptd = stage / PTD_NAME
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "config": resolved_config.get("source"),
            "export_settings": settings,
            "exporter": EXPORTER_REVISION,
            "foundation": {"file": ptd.name, "size": ptd.stat().st_size, "sha256": sha256_file(ptd),
                           "fingerprint": fingerprint, **foundation_entry},
            **({"tokenizer": tokenizer_section} if tokenizer_section else {}),
            **({"shared": _shared_entry(shared)} if shared else {}),
            "adapters": entries,
            "bytes": byte_report(stage, PTD_NAME, {e["name"]: e["file"] for e in entries},
                                 {e["name"]: set(e["tensor_keys"].values()) for e in entries},
                                 shared.name if shared else None),
            "build_s": round(time.perf_counter() - t_start, 2),
        }
        for line in report_lines(manifest["bytes"]):
            _log(line, quiet)
        config_out = {k: v for k, v in resolved_config.items() if k != "source"}
        (stage / "config.resolved.yaml").write_text(yaml.safe_dump(config_out, sort_keys=False))
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(e["size"] for e in entries)
    shared_note = f", {SHARED_PTD} {_mb(manifest['shared']['size'])}" if shared else ""
    tokenizer_note = f"tokenizer ({len(tokenizer_section['files'])} files)" if tokenizer_section else "no tokenizer"
    _log(f"  wrote {out_dir}: foundation.ptd {_mb(manifest['foundation']['size'])}{shared_note}, "
         f"{len(entries)} adapter .pte {_mb(total)} in all, {tokenizer_note}, {manifest['build_s']:.1f} s", quiet)
    return manifest


def _args_dict(args: ModelArgs) -> dict:
    d = asdict(args)
    d["head_dim"] = args.hd
    return d


def build(config_path, quiet: bool = False) -> dict:
    """Build every output of ``config_path``; returns the manifest (also written to disk)."""
    t_start = time.perf_counter()
    cfg = load_config(config_path)
    _log(f"lora-share build {cfg.source} -> {cfg.output_dir}", quiet)
    foundation = load_foundation(cfg.foundation)
    n_params = sum(t.numel() for t in foundation.tensors.values())
    _log(f"  foundation: {foundation.source['kind']}, {foundation.args.n_layers} layers, dim {foundation.args.dim}, "
         f"{n_params / 1e6:.1f} M parameters", quiet)
    adapters = []
    for i, acfg in enumerate(cfg.adapters):
        try:
            adapters.append(load_adapter(acfg, foundation.args))
        except UserError as e:
            raise UserError(f"{cfg.source}: adapters[{i}] ({acfg.name}): {e}") from None
    tokenizer = find_tokenizer(cfg.foundation, foundation.args.vocab_size)
    _log(_tokenizer_line(tokenizer, cfg.foundation.checkpoint), quiet)
    settings = export_settings(cfg.foundation)
    fingerprint = foundation_fingerprint(foundation)
    previous = _previous_outputs(cfg.output_dir, fingerprint, settings)
    if previous:
        _log(f"  foundation unchanged since the last build: keeping {PTD_NAME}", quiet)
    entry = {"parameters": n_params, "args": _args_dict(foundation.args), "source": foundation.source}
    if cfg.foundation.quantize is not None:
        entry["quantize"] = config_to_dict(cfg.foundation.quantize)
    resolved = {"source": str(cfg.source), **config_to_dict(cfg)}
    sharing = _plan_sharing(adapters, fingerprint) if hoists_shared_tensors(cfg) else None

    def copy_tokenizer(stage: Path) -> dict:
        return manifest_section(tokenizer, stage_files(stage, tokenizer.files, link=False), fingerprint)

    return _write_outputs(cfg.output_dir, adapters, [], previous, lambda: foundation, fingerprint, settings,
                          entry, resolved, quiet, t_start, sharing, copy_tokenizer if tokenizer else None)


def _tokenizer_line(tokenizer: TokenizerSource | None, checkpoint: Path | None) -> str:
    if tokenizer is None:
        where = f"no tokenizer.json in {checkpoint}" if checkpoint else "a synthetic foundation"
        return f"  tokenizer: none ({where}; set foundation.tokenizer to ship one): run takes token ids only"
    eos = ",".join(map(str, tokenizer.eos_token_ids)) or "none"
    chat = ", chat template" if tokenizer.chat_template else ""
    return (f"  tokenizer: {', '.join(tokenizer.files)} from {tokenizer.folder} "
            f"(eos ids {eos}, bos id {tokenizer.bos_token_id}{chat})")


def add(out_dir, peft_dirs: list[tuple[str, Path]], quiet: bool = False) -> dict:
    """Add PEFT adapters to an existing build without touching its foundation.ptd.

    Adapters whose graph signature matches one already built are substituted in
    well under a second; others are exported against the foundation the manifest
    describes (reloaded and checked against the recorded fingerprint).
    """
    t_start = time.perf_counter()
    out_dir = Path(out_dir).resolve()
    previous = read_manifest(out_dir)
    ptd = out_dir / PTD_NAME
    fnd = previous["foundation"]
    if not ptd.is_file() or ptd.stat().st_size != fnd["size"]:
        raise UserError(f"{ptd}: missing or not the file {out_dir / MANIFEST} describes")
    args = manifest_model_args(previous)
    existing = {a["name"] for a in previous["adapters"]}
    adapters = []
    for name, folder in peft_dirs:
        if name in existing:
            raise UserError(f"{out_dir}: already has an adapter named {name!r}; pick another name (NAME=DIR)")
        if not Path(folder).is_dir():
            raise UserError(f"{folder}: no such folder (a PEFT adapter folder)")
        adapters.append(load_peft(name, Path(folder), args))
        existing.add(name)
    _log(f"lora-share add -> {out_dir}: {len(adapters)} adapter(s), keeping {PTD_NAME}", quiet)

    @functools.cache
    def get_foundation() -> Foundation:  # reloaded at most once, and only if an export needs it
        return _reload_foundation(previous)

    resolved = yaml.safe_load((out_dir / "config.resolved.yaml").read_text())
    resolved["adapters"] = resolved.get("adapters", []) + [{"name": n, "peft": str(Path(f).resolve())}
                                                           for n, f in peft_dirs]
    resolved["source"] = previous.get("config")
    entry = {k: v for k, v in fnd.items() if k not in ("file", "size", "sha256", "fingerprint")}
    tokenizer_files = shipped_files(out_dir, previous)

    def keep_tokenizer(stage: Path) -> dict:  # hard-linked as they are; the section kept word for word
        stage_files(stage, tokenizer_files, link=True)
        return previous["tokenizer"]

    return _write_outputs(out_dir, adapters, previous["adapters"], previous, get_foundation, fnd["fingerprint"],
                          previous["export_settings"], entry, resolved, quiet, t_start,
                          _existing_sharing(out_dir, previous, adapters),
                          keep_tokenizer if "tokenizer" in previous else None)


def _existing_sharing(out_dir: Path, previous: dict, adapters: list[Adapter]) -> _Sharing | None:
    """For ``add`` to a build with adapters_shared.ptd: new adapters read the tensors it already
    holds from it, and it stays as it is (so do the shipped adapters that read from it)."""
    if "shared" not in previous:
        return None
    path = out_dir / SHARED_PTD
    if not path.is_file() or sha256_file(path) != previous["shared"]["sha256"]:
        raise UserError(f"{path}: missing or not the file {out_dir / MANIFEST} describes")
    available = {e.key for e in read_ptd(path).entries} - {SHARED_KEY}
    return _Sharing(plan_hoisting({a.name: tensor_keys(a) for a in adapters}, available), None)


def manifest_model_args(manifest: dict) -> ModelArgs:
    """The foundation's shape as a manifest records it."""
    return ModelArgs(**manifest["foundation"]["args"])


def _reload_foundation(manifest: dict) -> Foundation:
    """The foundation a manifest was built from, checked against its fingerprint."""
    settings = manifest["export_settings"]
    foundation = load_foundation(foundation_from_dict(settings, "manifest export_settings"))
    if foundation_fingerprint(foundation) != manifest["foundation"]["fingerprint"]:
        raise UserError(
            f"the foundation at {settings.get('checkpoint', 'synthetic')} no longer has the fingerprint recorded in "
            f"the manifest; this adapter needs a full export against the original foundation: rebuild"
        )
    return foundation
