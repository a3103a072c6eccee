"""The files the benchmark compares: a lora-share build, stand-alone programs, the bare foundation.

- lora-share: ``build_time.timed_build`` of N adapters (one recipe, seeds 100..),
  built from scratch for every N to time it; the largest build is kept and its
  first N adapters stand for the N-adapter deployment (the same seeds give the
  same bytes).
- stand-alone: the same models exported with every weight inside the .pte
  (``export_program(external=False)``): what shipping one self-contained model
  per adapter costs. The first is exported; the others are written from it by
  ``fastpath.substitute``, which gives the bytes a full export would (the
  benchmark's test checks this on a tiny model).
- base: the foundation without LoRA, exported against the same foundation.ptd;
  the export must reproduce that foundation.ptd byte for byte.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

BASE_NAME = "base"


def load_models(config: Path):
    """(Foundation, [Adapter]) of a build's config, as the build loaded them."""
    from ..adapters import load_adapter
    from ..config import load_config
    from ..foundation import load_foundation

    cfg = load_config(config)
    foundation = load_foundation(cfg.foundation)
    return foundation, [load_adapter(a, foundation.args) for a in cfg.adapters]


def base_record(fingerprint: str) -> bytes:
    """An adapter record for the bare foundation (rank 0, no targets), so the runner
    checks it against foundation.ptd like any adapter."""
    from ..formats.meta import AdapterMeta, encode_adapter

    return encode_adapter(AdapterMeta(name=BASE_NAME, foundation_fingerprint=fingerprint, rank=0, alpha=0.0,
                                      targets=[], layers=[], use_rslora=False, source_kind="none", source=""))


def export_base(foundation, folder: Path) -> tuple[Path, str, float]:
    """The bare foundation's program in ``folder/base.pte``: (path, sha256 of the .ptd it exported, seconds)."""
    from ..builder import foundation_fingerprint
    from ..eager import eager_model
    from ..export import FOUNDATION_TAG, export_program
    from ..formats.meta import ADAPTER_KEY, FOUNDATION_KEY, encode_foundation
    from ..records import foundation_meta

    fingerprint = foundation_fingerprint(foundation)
    named = {FOUNDATION_KEY: (encode_foundation(foundation_meta(foundation, fingerprint)), FOUNDATION_TAG),
             ADAPTER_KEY: (base_record(fingerprint), None)}
    exported = export_program(eager_model(foundation, None), folder / ".work", named)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{BASE_NAME}.pte"
    path.write_bytes(exported.pte)
    _rmtree(folder / ".work")
    return path, hashlib.sha256(exported.ptd).hexdigest(), exported.seconds


def export_standalone(foundation, adapters: list, folder: Path) -> list[dict]:
    """One self-contained .pte per adapter in ``folder`` (named like the adapter).

    Rows: {"path", "bytes", "produced": "exported" | "substituted", "seconds"}.
    """
    from ..eager import eager_model
    from ..export import export_program
    from ..fastpath import NotSubstitutable, substitute, tensor_keys

    folder.mkdir(parents=True, exist_ok=True)
    rows, template = [], None
    for adapter in adapters:
        t0 = time.perf_counter()
        pte, how = None, "exported"
        if template is not None:
            try:
                pte, how = substitute(template[0], template[1], adapter), "substituted"
            except NotSubstitutable:
                pte = None
        if pte is None:
            pte = export_program(eager_model(foundation, adapter), folder / ".work", external=False).pte
            _rmtree(folder / ".work")
            template = template or (pte, tensor_keys(adapter))
        path = folder / f"{adapter.name}.pte"
        path.write_bytes(pte)
        rows.append({"path": str(path), "bytes": len(pte), "produced": how,
                     "seconds": round(time.perf_counter() - t0, 3)})
    return rows


def disk_rows(counts: list[int], ptd: Path, ptes: list[Path], standalone: list[Path]) -> list[dict]:
    """Bytes on disk for N adapters: foundation.ptd + N .pte against N stand-alone .pte."""
    rows = []
    for n in counts:
        adapter_bytes = sum(p.stat().st_size for p in ptes[:n])
        shared = ptd.stat().st_size + adapter_bytes
        alone = sum(p.stat().st_size for p in standalone[:n])
        rows.append({"adapters": n, "shared_bytes": shared, "ptd_bytes": ptd.stat().st_size,
                     "adapter_pte_bytes": adapter_bytes, "standalone_bytes": alone,
                     "standalone_over_shared": round(alone / shared, 3)})
    return rows


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
