"""``lora-share build``: one YAML → foundation.ptd + one .pte per adapter + manifest.json.

Everything is read and checked before anything is exported, and all outputs are
written into a staging folder that replaces the output folder only when the
whole build succeeded, so a failed or interrupted build leaves the previous
outputs as they were.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from .adapters import load_adapter
from .config import config_to_dict, load_config
from .errors import UserError
from .export import FOUNDATION_TAG, eager_model, export_program
from .files import sha256_file, staged_dir
from .foundation import Foundation, load_foundation

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "lora-share-manifest"
MANIFEST_VERSION = 1


def foundation_fingerprint(foundation: Foundation) -> str:
    """Content fingerprint: sha256 over (name, dtype, shape, bytes) of every tensor, sorted by name.

    It depends only on the weights, not on how any file lays them out.
    """
    h = hashlib.sha256()
    for name in sorted(foundation.tensors):
        t = foundation.tensors[name].contiguous()
        h.update(f"{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


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

    entries, ptd_sha = [], None
    with staged_dir(cfg.output_dir) as stage:
        work = stage / ".work"
        for i, adapter in enumerate(adapters, 1):
            meta = adapter.meta
            _log(f"  [{i}/{len(adapters)}] {adapter.name}: rank {meta['rank']}, alpha {meta['alpha']}, "
                 f"targets {','.join(meta['targets'])} ... exporting", quiet)
            exported = export_program(eager_model(foundation, adapter), work / adapter.name)
            sha = hashlib.sha256(exported.ptd).hexdigest()
            if ptd_sha is None:
                ptd_sha = sha
                (stage / f"{FOUNDATION_TAG}.ptd").write_bytes(exported.ptd)
            elif sha != ptd_sha:
                raise RuntimeError(
                    f"adapter {adapter.name}: its export produced different foundation bytes "
                    f"(sha256 {sha[:12]} vs {ptd_sha[:12]}); refusing to write a foundation.ptd it cannot share"
                )
            pte_path = stage / f"{adapter.name}.pte"
            pte_path.write_bytes(exported.pte)
            lora_bytes = sum(a.numel() * 4 + b.numel() * 4 for a, b in adapter.weights.values())
            entries.append({
                "name": adapter.name, "file": pte_path.name, "size": len(exported.pte),
                "sha256": hashlib.sha256(exported.pte).hexdigest(), "lora_bytes": lora_bytes,
                "export_s": round(exported.seconds, 2), **meta,
            })
            _log(f"        done in {exported.seconds:.1f} s: {pte_path.name} {_mb(len(exported.pte))}", quiet)
            _rmtree(work / adapter.name)
        work.rmdir()
        ptd = stage / f"{FOUNDATION_TAG}.ptd"
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "config": str(cfg.source),
            "foundation": {
                "file": ptd.name, "size": ptd.stat().st_size, "sha256": sha256_file(ptd),
                "fingerprint": foundation_fingerprint(foundation),
                "parameters": n_params, "args": _args_dict(foundation), "source": foundation.source,
            },
            "adapters": entries,
            "build_s": round(time.perf_counter() - t_start, 2),
        }
        (stage / "config.resolved.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(e["size"] for e in entries)
    _log(f"  wrote {cfg.output_dir}: foundation.ptd {_mb(manifest['foundation']['size'])}, "
         f"{len(entries)} adapter .pte {_mb(total)} in all, {manifest['build_s']:.1f} s", quiet)
    return manifest


def _args_dict(foundation: Foundation) -> dict:
    d = asdict(foundation.args)
    d["head_dim"] = foundation.args.hd
    return d


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
