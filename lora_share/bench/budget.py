"""Adapters on demand under a memory budget: `lora-share bench-budget [CONFIG]`.

Builds the config's foundation with N adapters of one recipe (build_time.RECIPE, a seed each: one
export, each adapter written as data, so the build stays fast) into WORK/out, kept and reused while the
config is unchanged. Then, each in a fresh process through the C library (lora_share/inference/c_library.py):

- budget: ``ls_open_dir`` with a budget that holds K adapters (foundation + arena + K x the largest
  adapter's accounted cost, lora_share.h); one request for every adapter in turn, then a mixed
  stream (80 % of requests go to K/2 hot adapters, the rest spread over all N), one request at a
  time. Each request's latency is recorded with whether its adapter was resident; PSS is read
  after every request and compared with the budget (PSS growth over the process before opening);
- all: the same requests with no budget, so all N end up loaded.

The tokens of every request must be equal in both runs (an evicted and reloaded adapter answers as
before). Results: a table on stdout and OUT (JSON). Exit 1 if PSS ever exceeded the budget or an
answer differed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..manifest import MANIFEST, read_manifest
from .build_time import resolve_foundation, write_config
from .common import results_header, typed_command, write_whole

PROMPT = list(range(1, 17))
NEW_TOKENS = 8


class BudgetBenchError(Exception):
    """A benchmark step failed; the message says which and why."""


def pss_bytes() -> int:
    """This process's PSS (smaps_rollup)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return -1


def deployment(config: Path, work: Path, n: int, quiet: bool = True) -> Path:
    """WORK/out with N same-recipe adapters over CONFIG's foundation, rebuilt only when the config changed."""
    import yaml  # imported where used: `lora-share --help` runs with the bare wheel

    from ..deploy.builder import build

    work.mkdir(parents=True, exist_ok=True)
    # Requests are token ids: the foundation's tokenizer (a path relative to CONFIG) is left out.
    foundation = {k: v for k, v in resolve_foundation(config).items() if k != "tokenizer"}
    wanted = yaml.safe_dump(
        {"output_dir": "out", "foundation": foundation, "adapters": [f"a{i:02d}" for i in range(n)]}
    )
    stamp, out = work / "config.stamp", work / "out"
    if stamp.exists() and stamp.read_text() == wanted and (out / MANIFEST).exists():
        return out
    build(write_config(work, foundation, n), quiet=quiet)
    stamp.write_text(wanted)
    return out


def stream(names: list[str], resident: int, requests: int, seed: int = 0) -> list[str]:
    """Every adapter once, then ``requests`` more: 80 % to ``max(1, resident // 2)`` hot ones, the rest uniform."""
    rng = random.Random(seed)
    hot = names[: max(1, resident // 2)]
    mixed = [rng.choice(hot) if rng.random() < 0.8 else rng.choice(names) for _ in range(requests)]
    return list(names) + mixed


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def measure(folder: Path, resident: int, requests: int, library: str | None) -> dict:
    """In this process: serve the stream (resident > 0: under a budget for that many; 0: no budget)."""
    from ..inference import c_library as native

    with native.open_dir(folder, library=library) as probe:
        sizes = probe.stats()
        names = read_manifest(folder).adapter_names[: sizes["adapters_known"]]
    budget = (
        sizes["foundation_bytes"]
        + sizes["program_bytes"]
        + sizes["arena_bytes"]
        + resident * sizes["largest_adapter_bytes"]
        if resident
        else 0
    )
    baseline = pss_bytes()
    rows, answers = [], []
    t_open = time.perf_counter()
    with native.open_dir(folder, budget_bytes=budget, library=library) as rt:
        open_ms = (time.perf_counter() - t_open) * 1e3
        order = stream(names, resident or len(names), requests)
        for i, name in enumerate(order):
            before = rt.stats()["loads"]
            t0 = time.perf_counter()
            answers.append(rt.generate(name, PROMPT, NEW_TOKENS))
            ms = (time.perf_counter() - t0) * 1e3
            s = rt.stats()
            rows.append(
                {
                    "adapter": name,
                    "ms": ms,
                    "loaded": s["loads"] > before,
                    "load_ms": s["last_load_ms"] if s["loads"] > before else None,
                    "resident": s["adapters_resident"],
                    "pss_growth": pss_bytes() - baseline,
                    "mixed": i >= len(names),
                }
            )
        final = rt.stats()
    mixed = [r for r in rows if r["mixed"]]
    mixed_s = sum(r["ms"] for r in mixed) / 1e3
    hit = [r["ms"] for r in mixed if not r["loaded"]]
    cold = [r["ms"] for r in rows if r["loaded"] and r is not rows[0]]  # the first also packs the foundation
    loads = [r["load_ms"] for r in rows if r["load_ms"] is not None and r is not rows[0]]
    return {
        "resident_target": resident,
        "budget_bytes": budget,
        "adapters": len(names),
        "requests": len(rows),
        "foundation_bytes": sizes["foundation_bytes"],
        "program_bytes": sizes["program_bytes"],
        "arena_bytes": sizes["arena_bytes"],
        "adapter_bytes": sizes["largest_adapter_bytes"],
        "open_ms": open_ms,
        "baseline_pss_bytes": baseline,
        "max_pss_growth": max(r["pss_growth"] for r in rows),
        "final_pss_growth": rows[-1]["pss_growth"],
        "max_resident": max(r["resident"] for r in rows),
        "loads": final["loads"],
        "evictions": final["evictions"],
        "hits": final["hits"],
        "first_request_ms": rows[0]["ms"],
        # With no budget, the first pass loads one adapter per request: what each further one costs.
        "pss_per_further_adapter": (rows[len(names) - 1]["pss_growth"] - rows[0]["pss_growth"]) / (len(names) - 1)
        if len(names) > 1
        else None,
        "resident_ms": {"p50": percentile(hit, 50), "p99": percentile(hit, 99), "n": len(hit)},
        "cold_ms": {"p50": percentile(cold, 50), "p99": percentile(cold, 99), "n": len(cold)},
        "load_ms": {"p50": percentile(loads, 50), "p99": percentile(loads, 99), "n": len(loads)},
        "mixed_requests_per_s": len(mixed) / mixed_s if mixed_s > 0 else None,
        "mixed_loads": sum(r["loaded"] for r in mixed),
        "answers": answers,
    }


def measure_in_child(folder: Path, resident: int, requests: int, library: str | None) -> dict:
    """``measure`` in a fresh interpreter, so that PSS is this run's alone."""
    cmd = [sys.executable, "-m", "lora_share.bench.budget", "--measure", str(folder), str(resident), str(requests)]
    env = dict(os.environ, **({"LORA_SHARE_LIB": library} if library else {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise BudgetBenchError(
            f"measuring with {resident or 'all'} resident failed: "
            f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}"
        )
    return json.loads(proc.stdout)


def _mib(b) -> str:
    return f"{b / 2**20:.1f} MiB"


def _ms(x) -> str:
    return "–" if x is None else f"{x:.1f} ms"


def report(result: dict) -> tuple[str, bool]:
    """The printed table, and whether every check passed."""
    b, a = result["budget"], result["all"]
    ok = result["pss_within_budget"] and result["answers_equal"]
    lines = [
        f"{b['adapters']} adapters, budget {_mib(b['budget_bytes'])} = foundation {_mib(b['foundation_bytes'])}"
        f" + program {_mib(b['program_bytes'])} + arena {_mib(b['arena_bytes'])}"
        f" + {b['resident_target']} x adapter {_mib(b['adapter_bytes'])}",
        f"{b['requests']} requests ({b['adapters']} one each, then {b['requests'] - b['adapters']} mixed), "
        f"{len(PROMPT)} prompt tokens + {NEW_TOKENS} new each",
        "",
        f"| | budget for {b['resident_target']} | all {a['adapters']} loaded |",
        "|---|---:|---:|",
        f"| PSS growth, most | {_mib(b['max_pss_growth'])} | {_mib(a['max_pss_growth'])} |",
        f"| PSS growth, end | {_mib(b['final_pss_growth'])} | {_mib(a['final_pss_growth'])} |",
        f"| resident adapters, most | {b['max_resident']} | {a['max_resident']} |",
        f"| loads / evictions | {b['loads']} / {b['evictions']} | {a['loads']} / {a['evictions']} |",
        f"| request, adapter resident: p50 / p99 | {_ms(b['resident_ms']['p50'])} / {_ms(b['resident_ms']['p99'])}"
        f" | {_ms(a['resident_ms']['p50'])} / {_ms(a['resident_ms']['p99'])} |",
        f"| request, adapter loaded first: p50 / p99 | {_ms(b['cold_ms']['p50'])} / {_ms(b['cold_ms']['p99'])}"
        f" | {_ms(a['cold_ms']['p50'])} / {_ms(a['cold_ms']['p99'])} |",
        f"| of which the load: p50 / p99 | {_ms(b['load_ms']['p50'])} / {_ms(b['load_ms']['p99'])}"
        f" | {_ms(a['load_ms']['p50'])} / {_ms(a['load_ms']['p99'])} |",
        f"| mixed stream: requests/s (loads in it) | {b['mixed_requests_per_s']:.2f} ({b['mixed_loads']})"
        f" | {a['mixed_requests_per_s']:.2f} ({a['mixed_loads']}) |",
        f"| first request (packs the foundation) | {_ms(b['first_request_ms'])} | {_ms(a['first_request_ms'])} |",
        "",
        f"PSS per further adapter, all loaded: {_mib(a['pss_per_further_adapter'])} measured, "
        f"{_mib(b['adapter_bytes'])} accounted (1.05 x own LoRA bytes + overhead)",
        f"PSS within the budget: {'yes' if result['pss_within_budget'] else 'NO'} "
        f"(most {_mib(b['max_pss_growth'])} of {_mib(b['budget_bytes'])}); every adapter answered, "
        f"answers equal to all-loaded: {'yes' if result['answers_equal'] else 'NO'}",
    ]
    return "\n".join(lines), ok


def run(
    config: Path,
    work: Path,
    n: int,
    resident: int,
    requests: int,
    out: Path | None,
    library: str | None = None,
    quiet: bool = True,
    folder: Path | None = None,
    *,
    command: str,
) -> tuple[dict, bool]:
    """Build (or reuse) the deployment, or take ``folder`` (an existing build) as it is, measure both ways,
    write OUT (its header naming ``command``); (result, every check passed)."""
    if folder is not None:
        try:
            n = len(read_manifest(folder).adapters)
        except UserError as e:  # a measurement that cannot run: exit 1, as every failure of this bench
            raise BudgetBenchError(str(e)) from None
    if resident < 1 or n < resident:
        raise BudgetBenchError(f"--resident must be between 1 and the number of adapters ({n})")
    folder = folder or deployment(config, work, n, quiet)
    budget = measure_in_child(folder, resident, requests, library)
    everything = measure_in_child(folder, 0, requests, library)
    answers_equal = budget.pop("answers") == everything.pop("answers")
    result = {
        **results_header(command),
        "budget": budget,
        "all": everything,
        "answers_equal": answers_equal,
        "pss_within_budget": budget["max_pss_growth"] <= budget["budget_bytes"],
        "config": str(config),
    }
    text, ok = report(result)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_whole(out, json.dumps(result, indent=1) + "\n")
    print(text)
    return result, ok


def register(subparsers) -> None:
    """``lora-share bench-budget``: its flags and what it runs."""
    p = subparsers.add_parser(
        "bench-budget",
        help="many adapters served on demand under a memory budget (C "
        "library): PSS against the budget, resident vs cold request "
        "latency, requests/s",
        epilog="examples:\n  lora-share bench-budget      # = make bench-budget: 32 adapters of "
        "the synthetic config, a budget for 4\n"
        "  lora-share bench-budget configs/tiny.yaml --adapters 6 --resident 2 "
        "--requests 30",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "config",
        nargs="?",
        default="configs/llama_adapters.yaml",
        help="config whose foundation the adapters share (default configs/llama_adapters.yaml)",
    )
    p.add_argument("--adapters", type=int, default=32, help="adapters in the deployment (default 32)")
    p.add_argument("--resident", type=int, default=4, help="adapters the budget holds (default 4)")
    p.add_argument("--requests", type=int, default=200, help="mixed requests after one per adapter (default 200)")
    p.add_argument(
        "--work", default="out/bench_budget", help="where the deployment is built and kept (default out/bench_budget)"
    )
    p.add_argument(
        "--deployment",
        metavar="DIR",
        help="measure this build folder as it is instead of building one (CONFIG and --adapters are then unused)",
    )
    p.add_argument("--out", default="benchmarks/results/bench_budget.json", help="results JSON ('-': none)")
    p.add_argument("--verbose", action="store_true", help="show the build's progress")
    p.set_defaults(func=run_from_args)


def run_from_args(ns) -> int:
    """``lora-share bench-budget`` with its parsed flags: 0 if every check passed, 1 if not or on an error."""
    from ..inference.c_library import NativeError

    if ns.deployment is None and not Path(ns.config).is_file():
        raise UserError(f"{ns.config}: no such config file")
    try:
        _, ok = run(
            Path(ns.config),
            Path(ns.work),
            ns.adapters,
            ns.resident,
            ns.requests,
            None if ns.out == "-" else Path(ns.out),
            quiet=not ns.verbose,
            folder=None if ns.deployment is None else Path(ns.deployment),
            command=typed_command("bench-budget"),
        )
    except (BudgetBenchError, NativeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0 if ok else 1


def _child_main(argv: list[str]) -> int:
    folder, resident, requests = Path(argv[0]), int(argv[1]), int(argv[2])
    print(json.dumps(measure(folder, resident, requests, os.environ.get("LORA_SHARE_LIB"))))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--measure":
        sys.exit(_child_main(sys.argv[2:]))
    print("usage: lora-share bench-budget [CONFIG]  (this module's --measure mode is internal)", file=sys.stderr)
    sys.exit(2)
