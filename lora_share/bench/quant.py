"""Disk and memory of a float32 and a quantized (8da4w) foundation, each with N adapters.

    python -m lora_share.bench.quant --fp32 out/llama_adapters --quantized out/llama_8da4w \\
        [--adapters N] [--runner build/runner] [--json]

Both folders are outputs of ``lora-share build`` (e.g. configs/llama_adapters.yaml
and examples/llama_8da4w.yaml: the same synthetic weights, float32 and 8da4w).
For each it reports the bytes on disk (foundation.ptd, the first N .pte), the
export times and accuracy the manifest recorded, and the C++ runner's PSS right
after loading 1..N adapters into one process (``memory.measure``, shared
path: one mmapped foundation.ptd, XNNPACK weight cache on), with the per-adapter
bound of bench.memory (1.05 x its own LoRA bytes + 0.5 MiB).

``compare_foundations`` returns the numbers as one dict (for a ``make bench``
report); ``main`` prints them. Exit status: 0 if every increment is within its
bound, 1 if not, 2 on bad arguments or a runner failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import UserError
from ..manifest import read_manifest
from .memory import MIB, BenchError, measure


def foundation_report(out_dir, runner, adapters: int | None = None, mode: str = "shared") -> dict:
    """Disk, export time, accuracy and PSS of one build folder with its first ``adapters`` adapters."""
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    entries = manifest.adapters[:adapters] if adapters else manifest.adapters
    ptd = out_dir / manifest.foundation_file
    ptes = [out_dir / e["file"] for e in entries]
    for path in [ptd, *ptes]:
        if not path.is_file():
            raise BenchError(f"{path}: missing; rebuild {out_dir}")
    rows = measure(Path(runner), ptd, ptes, mode)
    return {
        "out_dir": str(out_dir),
        "quantize": manifest.quantize,
        "parameters": manifest.foundation.get("parameters"),
        "ptd_bytes": ptd.stat().st_size,
        "pte_bytes": {e["name"]: (out_dir / e["file"]).stat().st_size for e in entries},
        "disk_bytes": ptd.stat().st_size + sum(p.stat().st_size for p in ptes),
        "export_s": {e["name"]: e.get("seconds", e.get("export_s")) for e in entries},
        "produced": {e["name"]: e.get("produced", "exported") for e in entries},
        "build_s": manifest.build_s,
        "quantization_error": {e["name"]: e["quantization_error"] for e in entries if "quantization_error" in e},
        "memory": rows,
        "pss_first_bytes": rows[0]["pss_bytes"],
        "max_increment_bytes": max((r["increment_bytes"] for r in rows[1:]), default=None),
        "pass": all(r["ok"] is not False for r in rows),
    }


def compare_foundations(fp32_dir, quantized_dir, runner="build/runner", adapters: int | None = None) -> dict:
    """Both reports and the quantized/float32 ratios (disk and PSS with the first adapter loaded)."""
    fp32 = foundation_report(fp32_dir, runner, adapters)
    quant = foundation_report(quantized_dir, runner, adapters)
    return {
        "fp32": fp32,
        "quantized": quant,
        "ptd_ratio": round(quant["ptd_bytes"] / fp32["ptd_bytes"], 4),
        "disk_ratio": round(quant["disk_bytes"] / fp32["disk_bytes"], 4),
        "pss_first_ratio": round(quant["pss_first_bytes"] / fp32["pss_first_bytes"], 4),
        "pass": fp32["pass"] and quant["pass"],
    }


def _mib(n) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def format_report(result: dict) -> str:
    lines = []
    for label in ("fp32", "quantized"):
        r = result[label]
        q = r["quantize"]
        kind = (
            "float32"
            if not q
            else f"{q['scheme']} group {q.get('group_size')}, embedding {q.get('embedding', 'float32')}"
        )
        lines.append(f"{label}: {r['out_dir']} ({kind})")
        lines.append(
            f"  foundation.ptd {_mib(r['ptd_bytes'])} MiB; {len(r['pte_bytes'])} .pte "
            f"{_mib(sum(r['pte_bytes'].values()))} MiB; on disk {_mib(r['disk_bytes'])} MiB"
        )
        for name, size in r["pte_bytes"].items():
            err = r["quantization_error"].get(name)
            acc = (
                f", top-1 vs float {err['top1_agreement']:.1%}, rms logit diff {err['relative_rms']:.1%} of std"
                if err
                else ""
            )
            secs = r["export_s"][name]
            lines.append(
                f"    {name}: {_mib(size)} MiB, {r['produced'][name]} in "
                f"{'-' if secs is None else f'{secs:.1f}'} s{acc}"
            )
        for row in r["memory"]:
            inc = (
                ""
                if row["increment_bytes"] is None
                else f" (+{_mib(row['increment_bytes'])}, bound {_mib(row['bound_bytes'])}, "
                f"{'ok' if row['ok'] else 'FAIL'})"
            )
            lines.append(
                f"  {row['adapters']} adapter(s) loaded: PSS {_mib(row['pss_bytes'])} MiB{inc}, "
                f"load {row['load_ms']:.0f} ms"
            )
    lines.append(
        f"quantized / fp32: foundation.ptd {result['ptd_ratio']:.1%}, on disk {result['disk_ratio']:.1%}, "
        f"PSS with one adapter {result['pss_first_ratio']:.1%}"
    )
    lines.append("PASS" if result["pass"] else "FAIL: an adapter costs more than its bound")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lora_share.bench.quant", description=__doc__.split("\n")[0])
    p.add_argument("--fp32", required=True, type=Path, help="build folder with a float32 foundation")
    p.add_argument("--quantized", required=True, type=Path, help="build folder with a quantized foundation")
    p.add_argument("--adapters", type=int, default=None, help="use the first N adapters of each [all]")
    p.add_argument("--runner", type=Path, default=Path("build/runner"), help="the C++ runner [build/runner]")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    ns = p.parse_args(argv)
    if not ns.runner.is_file():
        print(f"error: {ns.runner}: no such file (make runner)", file=sys.stderr)
        return 2
    try:
        result = compare_foundations(ns.fp32, ns.quantized, ns.runner, ns.adapters)
    except (BenchError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if ns.json else format_report(result))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
