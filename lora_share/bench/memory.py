"""Memory benchmark for the C++ runner: what does one more loaded adapter cost?

    python -m lora_share.bench.memory --ptd foundation.ptd --pte a.pte --pte b.pte \\
        --pte c.pte --pte d.pte [--runner build/runner] [--json]

For k = 1..N it starts the runner with the first k adapters loaded (one process
each, `--json --max-new-tokens 1`) and reads the process's PSS right after
loading (`memory.after_load.pss_kb`, from /proc/self/smaps_rollup). PSS divides
shared file pages among the processes mapping them, so it is what a loaded
adapter really costs. Three loading paths are measured side by side:

- shared:   the runner's own path. One mmapped foundation.ptd feeds every
            adapter, and XNNPACK's weight cache packs each foundation weight
            once for the whole process.
- no-cache: the same, with the weight cache off (`--no-weight-cache`): every
            adapter packs its own copy of the foundation's delegated weights.
- stock:    one `executorch::extension::Module(pte, ptd)` per adapter with the
            weight cache off (`--stock`), as ExecuTorch's examples load.

The bound checked on the shared path: adapter k adds at most 1.05 x its own
LoRA bytes (the tensors its .pte holds) + 0.5 MiB of PSS, the cost lora_share.h
accounts for it: every adapter of a deployment carries one program, loaded
once, and an adapter is its LoRA tensors mapped as the program's inputs. The
other paths are reported, not checked: no-cache repacks the foundation's
weights per program, stock loads a program (and packs its weights) per adapter.

The paths measured pack in memory (`--no-packed-cache`); it also times a cold
and a warm start with the packed-weights file, the runtime's default (the
first start packs and writes it, the second maps it).

Exit status: 0 if every shared-path increment is within its bound, 1 if not,
2 on bad arguments or a runner failure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1024 * 1024
SLACK_BYTES = MIB // 2
LORA_FACTOR = 1.05


def own_lora_bytes(pte: Path) -> int:
    """The bytes of the LoRA tensors ``pte`` holds itself (its record names them; those hoisted
    into adapters_shared.ptd are not its own)."""
    from ..formats import read_pte
    from ..formats.records import adapter_record

    parsed = read_pte(Path(pte).read_bytes(), str(pte))
    meta = adapter_record(parsed)
    if meta is None:
        raise BenchError(f"{pte}: not a lora-share adapter (no adapter record)")
    keys = {k for e in meta.lora for k in (e.a, e.b)}
    return sum(d.size for d in parsed.named_data if d.key in keys)


def adapter_bound_bytes(pte: Path) -> int:
    """The most PSS one more adapter may add: LORA_FACTOR x its own LoRA bytes + SLACK_BYTES."""
    return int(LORA_FACTOR * own_lora_bytes(pte) + SLACK_BYTES)


MODES = {
    # Packing in memory: the packed-weights file is timed on its own (packed_cache_starts).
    "shared": ["--no-packed-cache"],
    "no-cache": ["--no-weight-cache"],
    "stock": ["--stock"],
}


class BenchError(Exception):
    """The runner could not be started or failed; the message says why."""


def run_runner(runner: Path, ptd: Path | None, ptes: list[Path], extra: list[str]) -> dict:
    """The runner's ``--json`` report for one 1-token request; ``ptd=None`` for self-contained programs."""
    cmd = [str(runner)] + (["--ptd", str(ptd)] if ptd is not None else [])
    for pte in ptes:
        cmd += ["--pte", str(pte)]
    cmd += ["--tokens", "1", "--max-new-tokens", "1", "--json", *extra]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BenchError(f"could not run {runner}: {e}") from None
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def measure(runner: Path, ptd: Path, ptes: list[Path], mode: str) -> list[dict]:
    """One row per adapter count: PSS after load and the increment over k-1."""
    rows, previous = [], None
    for k in range(1, len(ptes) + 1):
        report = run_runner(runner, ptd, ptes[:k], MODES[mode])
        mem = report["memory"]["after_load"]
        pss = mem["pss_kb"] * 1024
        row = {
            "adapters": k,
            "pss_bytes": pss,
            "rss_bytes": mem["rss_kb"] * 1024,
            "anon_bytes": mem["anon_kb"] * 1024,
            "file_bytes": mem["file_kb"] * 1024,
            "load_ms": report["load_ms"],
            "increment_bytes": None if previous is None else pss - previous,
            "bound_bytes": None,
            "ok": None,
        }
        if previous is not None:
            row["bound_bytes"] = adapter_bound_bytes(ptes[k - 1])
            row["ok"] = row["increment_bytes"] <= row["bound_bytes"]
        rows.append(row)
        previous = pss
    return rows


def packed_cache_starts(runner: Path, ptd: Path, ptes: list[Path]) -> list[dict]:
    """A cold start (packs, writes the packed-weights file) then a warm one (maps it), the file in a
    fresh folder (``--packed-cache``) so that the first start is cold whatever ran before."""
    with tempfile.TemporaryDirectory(prefix="lora-share-bench-") as tmp:
        starts = []
        for label in ("cold", "warm"):
            report = run_runner(runner, ptd, ptes, ["--packed-cache", tmp])
            cache = Path(report["loading"]["packed_cache"])
            starts.append(
                {
                    "start": label,
                    "load_ms": report["load_ms"],
                    "adapter_load_ms": [a["load_ms"] for a in report["adapters"]],
                    "pss_bytes": report["memory"]["after_load"]["pss_kb"] * 1024,
                    "end_pss_bytes": report["memory"]["end"]["pss_kb"] * 1024,
                    "warm_reported": report["loading"]["packed_cache_warm"],
                    "cache_file_bytes": cache.stat().st_size,
                }
            )
        return starts


def _mib(n) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def format_report(result: dict) -> str:
    lines = [f"foundation {result['ptd']} ({_mib(result['ptd_bytes'])} MiB)"]
    for pte in result["ptes"]:
        lines.append(f"adapter    {pte['path']} ({_mib(pte['bytes'])} MiB)")
    lines.append("")
    header = f"{'adapters':>8} | {'shared PSS':>10} {'+MiB':>7} {'bound':>7} {'ok':>4}"
    for mode in MODES:
        if mode != "shared":
            header += f" | {mode + ' PSS':>12} {'+MiB':>7}"
    lines += [header, "-" * len(header)]
    modes = result["modes"]
    for i, row in enumerate(modes["shared"]):
        ok = "" if row["ok"] is None else ("pass" if row["ok"] else "FAIL")
        line = (
            f"{row['adapters']:>8} | {_mib(row['pss_bytes']):>10} {_mib(row['increment_bytes']):>7} "
            f"{_mib(row['bound_bytes']):>7} {ok:>4}"
        )
        for mode in MODES:
            if mode != "shared":
                other = modes[mode][i]
                line += f" | {_mib(other['pss_bytes']):>12} {_mib(other['increment_bytes']):>7}"
        lines.append(line)
    lines.append("")
    lines.append("bound: each further adapter adds at most 1.05 x its own LoRA bytes + 0.5 MiB of PSS (shared path)")
    lines.append("")
    n = len(result["ptes"])
    baseline = result["modes"]["shared"][-1]
    lines.append(f"--packed-cache with {n} adapters (PSS after load / after one token; the warm start maps packed")
    lines.append("weights from the file and faults them in on first use, so compare the second number):")
    lines.append(f"  {'none':>4} start: load {baseline['load_ms']:8.1f} ms, PSS {_mib(baseline['pss_bytes'])} MiB")
    for start in result["packed_cache"]:
        lines.append(
            f"  {start['start']:>4} start: load {start['load_ms']:8.1f} ms, PSS {_mib(start['pss_bytes'])} / "
            f"{_mib(start['end_pss_bytes'])} MiB, cache file {_mib(start['cache_file_bytes'])} MiB"
        )
    lines.append("")
    lines.append("PASS" if result["pass"] else "FAIL: an adapter costs more than its bound on the shared path")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lora_share.bench.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--ptd", required=True, type=Path, help="the shared foundation.ptd")
    parser.add_argument("--pte", required=True, type=Path, action="append", help="adapter .pte (repeat, 1..N)")
    parser.add_argument("--runner", type=Path, default=Path("build/runner"), help="the C++ runner [build/runner]")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    ns = parser.parse_args(argv)

    for path in [ns.runner, ns.ptd, *ns.pte]:
        if not path.is_file():
            print(f"error: {path}: no such file", file=sys.stderr)
            return 2
    try:
        result = {
            "ptd": str(ns.ptd),
            "ptd_bytes": ns.ptd.stat().st_size,
            "ptes": [{"path": str(p), "bytes": p.stat().st_size} for p in ns.pte],
            "modes": {mode: measure(ns.runner, ns.ptd, ns.pte, mode) for mode in MODES},
            "packed_cache": packed_cache_starts(ns.runner, ns.ptd, ns.pte),
        }
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["pass"] = all(row["ok"] is not False for row in result["modes"]["shared"])
    print(json.dumps(result, indent=2) if ns.json else format_report(result))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
