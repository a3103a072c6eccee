"""The files the benchmark compares: a lora-share build, stand-alone programs, the bare foundation.

- lora-share: ``build_time.timed_build`` of N adapters (one recipe, seeds 100..),
  built from scratch for every N to time it; the largest build is kept and its
  first N adapters stand for the N-adapter deployment (the same seeds give the
  same bytes).
- stand-alone: the same models with every weight inside the .pte: the adapters'
  program exported once with its foundation weights inside
  (``export_program(external=False)``) and each adapter's data written into it:
  what shipping one self-contained model per adapter costs.
- base: the foundation alone, the runner's ``base`` (the deployment's program with
  every LoRA input zero), no file of its own.
"""

from __future__ import annotations

import time
from pathlib import Path


def load_models(config: Path):
    """(Foundation, [Adapter]) of a build's config, as the build loaded them."""
    from ..checkpoints.adapters import load_adapter
    from ..checkpoints.foundation import load_foundation
    from ..config import load_config

    cfg = load_config(config)
    foundation = load_foundation(cfg.foundation)
    return foundation, [load_adapter(a, foundation.args) for a in cfg.adapters]


def export_standalone(foundation, adapters: list, folder: Path) -> list[dict]:
    """One self-contained .pte per adapter in ``folder`` (named like the adapter): one export with
    every weight inside, then each adapter's data written into it.

    Rows: {"path", "bytes", "produced": "exported" | "written", "seconds"}.
    """
    from ..deploy.adapter_pte import Program
    from ..deploy.builder import foundation_fingerprint
    from ..deploy.records import adapter_meta
    from ..export.eager import eager_model
    from ..export.program import export_program
    from ..model.envelope import Envelope

    folder.mkdir(parents=True, exist_ok=True)
    envelope = Envelope.resolve(None, adapters, foundation.args)
    fingerprint = foundation_fingerprint(foundation)
    t0 = time.perf_counter()
    program = Program(
        export_program(eager_model(foundation, envelope=envelope), envelope, folder / ".work", external=False).pte,
        "the stand-alone program",
    )
    _rmtree(folder / ".work")
    rows, how = [], "exported"
    for adapter in adapters:
        pte = program.write(*adapter_meta(adapter, fingerprint, envelope))
        path = folder / f"{adapter.name}.pte"
        path.write_bytes(pte)
        rows.append(
            {"path": str(path), "bytes": len(pte), "produced": how, "seconds": round(time.perf_counter() - t0, 3)}
        )
        t0, how = time.perf_counter(), "written"
    return rows


def disk_rows(counts: list[int], ptd: Path, ptes: list[Path], standalone: list[Path]) -> list[dict]:
    """Bytes on disk for N adapters: foundation.ptd + N .pte against N stand-alone .pte."""
    rows = []
    for n in counts:
        adapter_bytes = sum(p.stat().st_size for p in ptes[:n])
        shared = ptd.stat().st_size + adapter_bytes
        alone = sum(p.stat().st_size for p in standalone[:n])
        rows.append(
            {
                "adapters": n,
                "shared_bytes": shared,
                "ptd_bytes": ptd.stat().st_size,
                "adapter_pte_bytes": adapter_bytes,
                "standalone_bytes": alone,
                "standalone_over_shared": round(alone / shared, 3),
            }
        )
    return rows


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
