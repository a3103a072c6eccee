"""The benchmark run: build the variants, measure them with the C++ runner, write the results.

    lora-share bench configs/llama_adapters.yaml [--counts 1,2,4,8] [--out benchmarks/results]
    python -m lora_share.bench --config configs/tiny.yaml --counts 1,2 --out /tmp/bench

One line per step with its time goes to stderr; the headline table to stdout.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ..config import BASE_NAME
from ..errors import UserError
from . import processes, report, variants
from .build_time import RECIPE, resolve_foundation, timed_build, write_config
from .common import BenchFailed, Progress, prompt_ids, results_header
from .memory import BenchError, packed_cache_starts

DEFAULT_COUNTS = [1, 2, 4, 8]
LOAD_REPEATS = 3
SPEED_REPEATS = 5
SWITCH_ROUNDS = 9


def _checked_counts(config: Path, counts: list[int], runner: Path, build_counts: list[int] | None) -> list[int]:
    """The build counts to time, once the arguments are checked (a UserError naming the flag otherwise)."""
    if not counts or sorted(set(counts)) != counts or counts[0] < 1:
        raise UserError(f"--counts {','.join(map(str, counts))}: give increasing adapter counts >= 1, e.g. 1,2,4,8")
    build_counts = sorted({counts[0], counts[-1]} if build_counts is None else set(build_counts) | {counts[-1]})
    if build_counts[0] < 1 or build_counts[-1] > counts[-1]:
        raise UserError(f"--build-counts: adapter counts must be between 1 and {counts[-1]} (the largest of --counts)")
    if not config.is_file():
        raise UserError(f"{config}: no such config file")
    from ..config import load_config, require_adapters

    require_adapters(load_config(config), "the benchmark")
    if not runner.is_file():
        raise UserError(f"{runner}: no such runner (build it with `make runner`)")
    return build_counts


def _memory_row(runner: Path, n: int, ptes: list[Path], ptd: Path, standalone: list[Path], prompt: list[int]) -> dict:
    """PSS with the first ``n`` adapters: in one lora-share process, as ``n`` stand-alone processes, stock."""
    shared = processes.memory_one_process(runner, ptes[:n], ptd, [], prompt)
    alone = processes.memory_processes(runner, standalone[:n], prompt)
    stock = processes.memory_one_process(runner, ptes[:n], ptd, ["--stock"], prompt)
    return {
        "adapters": n,
        "shared": shared,
        "standalone": alone,
        "stock": stock,
        "standalone_over_shared": round(alone["pss_kb"] / shared["pss_kb"], 3),
        "stock_over_shared": round(stock["pss_kb"] / shared["pss_kb"], 3),
    }


def _load_times(runner: Path, ptd: Path, ptes: list[Path], standalone: list[Path]) -> dict:
    """Start-up times: lora-share, stock, one stand-alone program, and with a packed-weights cache file."""
    load = {
        "repeats": LOAD_REPEATS,
        "shared": processes.load_times(runner, ptd, ptes, ["--no-packed-cache"], LOAD_REPEATS),
        "stock": processes.load_times(runner, ptd, ptes, ["--stock"], LOAD_REPEATS),
        "standalone": processes.load_times(runner, None, standalone[:1], [], LOAD_REPEATS),
    }
    for start in packed_cache_starts(runner, ptd, ptes):
        per = start["adapter_load_ms"]
        load[f"packed_{start['start']}"] = {
            "first_ms": round(per[0], 2),
            "further_ms": [round(x, 2) for x in per[1:]],
            "further_median_ms": round(statistics.median(per[1:]), 2) if len(per) > 1 else None,
            "session_ms": round(start["load_ms"], 2),
            "programs": len(per),
            "cache_file_bytes": start["cache_file_bytes"],
            "warm_reported": start["warm_reported"],
        }
    return load


def _speed(runner: Path, ptd: Path, ptes: list[Path], standalone: Path, prompt: list[int], new_tokens: int) -> dict:
    """Prefill and decode speed of the bare foundation and every adapter in one process, and of one
    stand-alone program; ``tokens_match``: that program generates what its adapter does."""
    names = [p.stem for p in ptes]
    with (
        processes.Server(runner, ptes, ptd, max_new_tokens=new_tokens) as server,
        processes.Server(runner, [standalone], max_new_tokens=new_tokens) as alone_server,
    ):
        # "base": the foundation alone, through the deployment's program with every LoRA input zero.
        programs = {n: (server, n) for n in [BASE_NAME, *names]}
        programs["standalone"] = (alone_server, standalone.stem)
        programs = processes.speeds(programs, prompt, SPEED_REPEATS)
    alone = programs.pop("standalone")
    adapter_rows = [programs[n] for n in names]
    return {
        "prompt_tokens": len(prompt),
        "new_tokens": new_tokens,
        "repeats": SPEED_REPEATS,
        "programs": programs,
        "standalone": {"name": standalone.stem, **alone},
        "adapters_median": {
            k: round(statistics.median(r[k] for r in adapter_rows), 1)
            for k in ("prefill_tokens_per_s", "decode_tokens_per_s")
        },
        "tokens_match": alone["tokens"] == programs[standalone.stem]["tokens"],
    }


def _switch(runner: Path, ptd: Path, ptes: list[Path], prompt: list[int]) -> dict:
    """Times of switching adapters between requests in one --serve process."""
    with processes.Server(runner, ptes, ptd, max_new_tokens=1) as server:
        switch = processes.switch_times(server, [p.stem for p in ptes], prompt, SWITCH_ROUNDS)
    return {**switch, "prompt_tokens": len(prompt)}


def run_bench(
    config: Path,
    counts: list[int],
    runner: Path,
    workdir: Path,
    quiet: bool = False,
    build_counts: list[int] | None = None,
    *,
    command: str,
) -> dict:
    """Every measurement of the benchmark, with the variants made in ``workdir``; returns the result dict,
    its header (bench/common.py) naming ``command``.

    ``build_counts`` (default: the first and the last of ``counts``) are the adapter counts whose
    build is timed from scratch; each costs one export, the most expensive step of the benchmark.
    """
    config, runner = Path(config), Path(runner)
    build_counts = _checked_counts(config, counts, runner, build_counts)
    progress = Progress(quiet)
    n_max = counts[-1]
    foundation_cfg = resolve_foundation(config)

    # 1. The models, loaded once for the stand-alone programs.
    with progress.step("load_models", "loading the foundation"):
        top_dir = workdir / "builds" / f"n{n_max}"
        top_dir.mkdir(parents=True, exist_ok=True)
        foundation, adapters = variants.load_models(write_config(top_dir, foundation_cfg, n_max))

    # 2. lora-share builds from scratch, timed; the largest (N = the last count) is the deployment measured.
    build_rows = []
    for n in build_counts:
        with progress.step(f"build_{n}", f"lora-share build of {n} adapter(s) from scratch"):
            row, manifest = timed_build(workdir / "builds" / f"n{n}", foundation_cfg, n)
        build_rows.append(row)
    ptd, ptes = top_dir / "out" / "foundation.ptd", [top_dir / "out" / f for f in manifest.adapter_files]

    # 3. Stand-alone programs: one export with the weights inside, each adapter's data written into it.
    with progress.step("standalone", f"{n_max} stand-alone program(s) (weights inside)"):
        standalone_rows = variants.export_standalone(foundation, adapters, workdir / "standalone")
    standalone = [Path(r["path"]) for r in standalone_rows]
    disk = variants.disk_rows(counts, ptd, ptes, standalone)

    args = manifest.args
    vocab, max_len = args["vocab_size"], args["max_seq_len"]

    # 4. Memory for every N: one process, N processes, stock.
    memory = []
    for n in counts:
        with progress.step(
            f"memory_{n}", f"memory with {n} adapter(s): lora-share, {n} stand-alone process(es), stock"
        ):
            memory.append(_memory_row(runner, n, ptes, ptd, standalone, prompt_ids(3, vocab)))

    # 5. Load times.
    with progress.step("load", f"load times ({LOAD_REPEATS} starts each)"):
        load = _load_times(runner, ptd, ptes, standalone)

    # 6. Speed: the bare foundation and every adapter in one process, and one stand-alone program.
    prompt_len = min(32, max_len // 2)
    new_tokens = min(32, max_len - prompt_len + 1)
    with progress.step("speed", f"speed: prefill {prompt_len} + decode {new_tokens} tokens, {len(ptes) + 2} programs"):
        speed = _speed(runner, ptd, ptes, standalone[0], prompt_ids(prompt_len, vocab), new_tokens)
    tokens_match = speed.pop("tokens_match")

    # 7. Switching adapters between requests.
    with progress.step("switch", "adapter switch in --serve"):
        switch = _switch(runner, ptd, ptes, prompt_ids(min(8, max_len), vocab))

    return {
        "format": "lora-share-bench",
        "version": 1,
        **results_header(command),
        "config": str(config),
        "counts": counts,
        "recipe": RECIPE,
        "foundation": {
            "parameters": manifest.foundation["parameters"],
            "ptd_bytes": manifest.foundation_size,
            "sha256": manifest.foundation_sha256,
            "fingerprint": manifest.fingerprint,
            "args": args,
        },
        "adapter_pte_bytes": round(statistics.median(p.stat().st_size for p in ptes)),
        "disk": disk,
        "memory": memory,
        "load": load,
        "speed": speed,
        "switch": switch,
        "build": build_rows,
        "build_ratio": round(build_rows[-1]["seconds"] / build_rows[0]["seconds"], 3),
        "standalone_files": [{k: v for k, v in r.items() if k != "path"} for r in standalone_rows],
        "checks": {"standalone_tokens_match": tokens_match},
        "steps_s": progress.steps,
        "total_s": round(time.perf_counter() - progress.t0, 1),
    }


def main(argv=None, prog: str = "python -m lora_share.bench") -> int:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(p, config_option=True)
    ns = p.parse_args(argv)
    return run_from_args(ns, f"{prog} " + " ".join(map(shlex.quote, argv if argv is not None else sys.argv[1:])))


def add_arguments(p: argparse.ArgumentParser, config_option: bool) -> None:
    if config_option:
        p.add_argument(
            "--config",
            default="configs/llama_adapters.yaml",
            help="foundation to build on (default configs/llama_adapters.yaml)",
        )
    else:
        p.add_argument(
            "config",
            metavar="CONFIG",
            help="config whose foundation is benchmarked (its adapters are "
            "not used: every N uses one recipe, seeds differ)",
        )
    p.add_argument(
        "--counts",
        default=",".join(map(str, DEFAULT_COUNTS)),
        help="adapter counts, increasing, comma-separated (default 1,2,4,8)",
    )
    p.add_argument(
        "--build-counts",
        metavar="COUNTS",
        help="adapter counts whose build is timed from scratch, one export each (default: the first "
        "and the last of --counts)",
    )
    p.add_argument("--out", default="benchmarks/results", help="where the results go (default benchmarks/results)")
    p.add_argument("--runner", default="build/runner", help="the C++ runner (default build/runner)")
    p.add_argument("--workdir", help="keep the built files here (default: a temporary folder, removed at the end)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run_from_args(ns, command: str) -> int:
    counts, build_counts = _ints(ns.counts, "--counts"), ns.build_counts and _ints(ns.build_counts, "--build-counts")
    with _kept(Path(ns.workdir)) if ns.workdir else tempfile.TemporaryDirectory(prefix="lora-share-bench-") as wd:
        try:
            result = run_bench(
                Path(ns.config),
                counts,
                Path(ns.runner),
                Path(wd),
                quiet=ns.quiet,
                build_counts=build_counts or None,
                command=command,
            )
        except BenchError as e:
            raise BenchFailed(str(e)) from None
    written = report.write_results(result, Path(ns.out))
    print(report.headline_table(result))
    if not ns.quiet:
        print(f"wrote {', '.join(str(p) for p in written)} in {result['total_s'] / 60:.1f} min", file=sys.stderr)
    return 0


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None


@contextmanager
def _kept(path: Path):
    path.mkdir(parents=True, exist_ok=True)
    yield str(path)


if __name__ == "__main__":
    sys.exit(main())
