"""bench-scale's deployments: each variant built once in a child process (its peak RSS read) and reused
while nothing changed, the whole-envelope copy of a skip_absent adapter, and `lora-share add` timed."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..manifest import Manifest, read_manifest
from .memory import BenchError
from .scale_shapes import Shape

ADAPTER = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}

# <foundation>[-all16]: the adapters' own recipe as the program's LoRA envelope (the default), or every
# linear at rank 16, an envelope that takes other recipes too (ADDED) with no export.
VARIANTS = ("fp32", "8da4w", "fp32-all16", "8da4w-all16")

# Each adapter's file skips the slots it leaves alone (lora_envelope.skip_absent); its first adapter is also
# timed through the whole envelope program (``<name>-whole``, reported), in the same rounds.
WIDE_ENVELOPE = {"targets": "all", "max_rank": 16, "skip_absent": True}

# Added to each -all16 deployment with `lora-share add`, timed: other ranks, other targets.
ADDED = {
    "r4_qko": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "o_proj"], "seed": 101},
    "r16_all": {
        "rank": 16,
        "alpha": 32,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "seed": 102,
    },
}


def variant_foundation(shape: Shape, variant: str, context: int, synthetic: dict | None = None) -> dict:
    out = {"synthetic": synthetic or shape.foundation, "max_seq_len": context, "prefill_chunk": shape.prefill_chunk}
    if variant.split("-")[0] == "8da4w":
        out["quantize"] = dict(shape.quantize)
    return out


@dataclass
class Deployment:
    name: str
    ptd: Path
    ptes: list[Path]
    manifest: Manifest
    export_s: float  # seconds of the one export the build needed (kept from the run that made it)
    build_peak_rss: int  # bytes: peak RSS of that build's process (kept likewise)
    out: Path


def _build_process(config: Path) -> int:
    """``lora-share build config`` in a child process; its peak RSS in bytes (os.wait4's ru_maxrss)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lora_share.cli", "build", str(config), "--json"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise BenchError(f"lora-share build {config} failed:\n{err.read().decode(errors='replace')[-2000:]}")
    return usage.ru_maxrss * 1024


def build_variant(folder: Path, name: str, foundation: dict, adapters: int, envelope: dict | None = None) -> Deployment:
    """Build (or reuse, when nothing changed) one deployment in ``folder``, in a child process."""
    import yaml  # imported where used: `lora-share --help` runs with the bare wheel

    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "output_dir": "out",
                "foundation": foundation,
                **({"lora_envelope": envelope} if envelope else {}),
                "adapters": [{"name": f"a{i + 1}", "synthetic": {**ADAPTER, "seed": i + 1}} for i in range(adapters)],
            },
            sort_keys=False,
        )
    )
    peak = _build_process(config)
    out, record = folder / "out", folder / "export_time.json"
    manifest = read_manifest(out)
    if manifest.program["produced"] == "exported":
        record.write_text(
            json.dumps(
                {
                    "export_s": manifest.program["seconds"],
                    "build_peak_rss": peak,
                    "signature": manifest.program_signature,
                }
            )
        )
    saved = json.loads(record.read_text()) if record.is_file() else {}
    return Deployment(
        name=name,
        ptd=out / "foundation.ptd",
        ptes=[out / f for f in manifest.adapter_files],
        manifest=manifest,
        export_s=saved.get("export_s", float("nan")),
        build_peak_rss=saved.get("build_peak_rss", 0),
        out=out,
    )


def whole_program_copy(d: Deployment, folder: Path) -> Deployment:
    """``d``'s first adapter written again with the whole envelope program (no slot skipped) into
    ``folder``, beside a link to ``d``'s foundation.ptd: what skipping absent slots saves, timed in
    the same run."""
    from ..deploy.adapter_pte import Program, read_record
    from ..formats import read_pte

    data = d.ptes[0].read_bytes()
    meta = read_record(data, str(d.ptes[0]))
    keys = {k for e in meta.lora for k in (e.a, e.b)}
    tensors = {
        n.key: data[n.start : n.end] for n in read_pte(data, str(d.ptes[0]), plans=False).named_data if n.key in keys
    }
    whole = dataclasses.replace(
        meta, envelope_program_sha256="", program_patches=[], slot_patches=[], content_bytes=0, content_crc32=0
    )
    folder.mkdir(parents=True, exist_ok=True)
    pte, ptd = folder / d.ptes[0].name, folder / "foundation.ptd"
    # No slot table either: the runtime runs every slot (cpp_runner/runtime/program_variants.h).
    pte.write_bytes(Program.from_adapter_file(d.ptes[0]).write(whole, tensors, slot_table=False))
    if not ptd.exists():
        os.link(d.ptd, ptd)
    return dataclasses.replace(d, name=f"{d.name}-whole", ptd=ptd, ptes=[pte], out=folder)


def time_adds(d: Deployment, scratch: Path) -> list[dict]:
    """``lora-share add`` of each ADDED adapter (a PEFT folder) to a copy of ``d``, one process each:
    its wall time, the seconds inside ``add`` (without Python's start), and what it produced."""
    import shutil
    import subprocess

    from ..checkpoints.adapters import synthetic_adapter
    from ..config import SyntheticAdapter
    from .build_time import write_peft_folder

    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(d.out, scratch / "out", copy_function=os.link)  # add never writes into shipped files
    args = d.manifest.model_args
    rows = []
    for name, spec in ADDED.items():
        folder = write_peft_folder(synthetic_adapter(name, SyntheticAdapter(**spec), args), scratch / name)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "lora_share.cli", "add", "--to", str(scratch / "out"), f"{name}={folder}", "--json"],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise BenchError(f"lora-share add {name} to {d.name}: {proc.stderr.strip()[-2000:]}")
        manifest = read_manifest(scratch / "out")
        entry = manifest.adapter(name)
        rows.append(
            {
                "adapter": name,
                **{k: spec[k] for k in ("rank", "target_modules")},
                "wall_s": round(wall, 2),
                "add_s": manifest.build_s,
                "program": manifest.program["produced"],
                "produced": entry["produced"],
                "pte_bytes": entry["size"],
                "lora_bytes": entry["lora_bytes"],
            }
        )
    return rows
