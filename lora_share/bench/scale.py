"""The scale benchmark: SmolLM-135M's shape at a 2,048-token context, where planned memory and
attention cost show (the synthetic config's 28 M parameters and 128 tokens hide both).

    make bench-scale                      # = lora-share bench-scale; writes benchmarks/results/bench_scale.*
    lora-share bench-scale --shape tiny --out /tmp/scale   # the same steps on a tiny shape, in a minute

Builds of one synthetic foundation, made once in ``--workdir`` and reused by later runs while nothing
changed (``lora-share build`` keeps unchanged outputs; the export time and peak RSS of the build that
exported are kept beside it), each in a child process whose peak RSS is read: fp32 and 8da4w
foundations at the full context with 8 rank-8 q/v adapters, once with a LoRA envelope of exactly
their recipe (the default) and once with every linear up to rank 16 (``-all16``), one export each and
every adapter written as data (the -all16 ones with ``lora_envelope.skip_absent``: each file's program
skips the slots its adapter leaves alone); fp32 at a 128-token context with one adapter, the yardstick for what
the long context costs a decoded token; and the large shape (Llama-3.2-1B's: 1.24 B parameters) in
fp32 and 8da4w, built only, for the build's time and peak RSS.

Memory, for N = 1, 2, 4, 8 adapters of each full-context build: PSS right after load and after every
adapter has served one request of 1,000 prompt tokens + 64 new ones: one runner process with one
planned-memory arena for all programs (lora-share's default); for the exact envelopes also one process
with an arena per program (``--private-arenas``) and N runner processes with one adapter each (summed).

`lora-share add`, on a copy of each -all16 deployment: a rank-4 adapter on q, k and o, and a rank-16
adapter on all seven linears (PEFT folders), one process each, timed.

Speed, in one process per build, requests interleaved across builds so the machine's noise hits all
alike (median of ``--repeats``): prefill tokens/s of the 1,000-token prompt, decode tokens/s at
position about 10 and about 1,000; load time of the first and of a further adapter. Each -all16
deployment's first adapter is timed twice in those rounds: as built (skipping its absent slots) and
written again with the whole envelope program (``<name>-whole``, reported, not enforced).

The checks printed at the end (exit status 1 if an enforced check fails; the absolute speed targets
hold on an otherwise idle machine and are printed, not enforced):
- every adapter after the first adds at most 1.05 x its own LoRA bytes + 0.5 MiB of PSS (exact
  envelope), 2 x + 1 MiB (all-linear rank-16 envelope), shared arena, all served;
- one adapter's PSS after its request minus after load is at most its KV cache's bytes + 32 MiB;
- each `lora-share add` takes at most 2 s inside the command and exports nothing;
- decode through the all-linear rank-16 envelope at >= 0.9 x through the exact one, at ~10 and ~1,000;
- a build's peak RSS is at most 2.5 x the fp32 foundation's bytes + 1 GB, the large shape's builds too;
- fp32 decode at position ~1,000 runs at >= 0.8 x the speed at ~10 (reported for the others), and
  decode at ~10 with the full context at >= 0.8 x the 128-token context's;
- targets: fp32 decode at ~10 >= 35 tokens/s, prefill of 1,000 tokens >= 300 tokens/s.

Modules: scale_shapes.py the shapes and the bytes they imply, scale_builds.py the deployments (built,
reused, added to), scale_report.py the checks and the page; this one measures and puts it together.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from ..errors import UserError
from . import processes
from .common import BenchFailed, Progress, prompt_ids, results_header, typed_command
from .memory import BenchError, adapter_bound_bytes
from .scale_builds import (
    ADAPTER,
    ADDED,
    VARIANTS,
    WIDE_ENVELOPE,
    Deployment,
    build_variant,
    time_adds,
    variant_foundation,
    whole_program_copy,
)
from .scale_report import checks, markdown, write_results
from .scale_shapes import DEFAULT_SHAPE, SHAPES, Shape, fp32_foundation_bytes, full_kv_cache_bytes, kv_cache_bytes


def memory_rows(
    runner: Path, d: Deployment, counts: list[int], prompt: list[int], new_tokens: int, all_setups: bool = True
) -> list[dict]:
    """PSS (kB) after load and after every adapter served ``prompt``, for each N and set-up (only the
    shared arena unless ``all_setups``)."""
    rows = []
    for n in counts:
        ptes = d.ptes[:n]
        row = {"adapters": n}
        for mode, extra in (("shared", []), ("private", ["--private-arenas"]))[: 2 if all_setups else 1]:
            with processes.Server(runner, ptes, d.ptd, extra, max_new_tokens=new_tokens) as server:
                loaded = server.memory()
                server.warm(prompt)  # every program serves one request
                row[mode] = {"after_load": loaded, "served": server.memory()}
        if not all_setups:
            rows.append(row)
            continue
        with ExitStack() as stack:
            servers = [
                stack.enter_context(processes.Server(runner, [p], d.ptd, max_new_tokens=new_tokens)) for p in ptes
            ]
            loaded = processes.sum_memory([s.memory() for s in servers])
            for server in servers:
                server.warm(prompt)
            row["processes"] = {"after_load": loaded, "served": processes.sum_memory([s.memory() for s in servers])}
        rows.append(row)
    return rows


def speed_rows(runner: Path, deployments: list[Deployment], short: Deployment, shape: Shape, repeats: int) -> dict:
    """Median prefill and decode speeds per deployment; every request of a round goes to each in turn."""
    vocab = shape.foundation["vocab_size"]
    near, far = prompt_ids(shape.near_start, vocab), prompt_ids(shape.prompt_tokens, vocab)
    with ExitStack() as stack:
        servers = {
            d.name: stack.enter_context(
                processes.Server(runner, d.ptes[:1], d.ptd, max_new_tokens=shape.speed_new_tokens)
            )
            for d in [*deployments, short]
        }
        first = {d.name: d.ptes[0].stem for d in [*deployments, short]}
        for name, server in servers.items():  # the first request touches every page: not timed
            server.ask(first[name], near)
        samples = {name: {"near": [], "far": []} for name in servers}
        for _ in range(repeats):
            for name, server in servers.items():
                samples[name]["near"].append(server.ask(first[name], near)[0])
                if name != short.name:
                    samples[name]["far"].append(server.ask(first[name], far)[0])

    def median(answers, key):
        return round(statistics.median(a[key] for a in answers), 1)

    out = {}
    for name, s in samples.items():
        out[name] = {"decode_near_tokens_per_s": median(s["near"], "decode_tokens_per_s")}
        if s["far"]:
            out[name].update(
                {
                    "prefill_tokens_per_s": median(s["far"], "prefill_tokens_per_s"),
                    "decode_far_tokens_per_s": median(s["far"], "decode_tokens_per_s"),
                }
            )
    return out


def run_scale(
    shape_name: str,
    variants: list[str],
    counts: list[int],
    runner: Path,
    workdir: Path,
    repeats: int,
    quiet: bool = False,
    *,
    command: str,
) -> dict:
    """Build (or reuse) the deployments, measure them, return the result dict (its header naming ``command``)."""
    shape = SHAPES[shape_name]
    if not runner.is_file():
        raise UserError(f"{runner}: no such runner (build it with `make runner`)")
    progress = Progress(quiet)
    deployments = []
    for variant in variants:
        wide = variant.endswith("-all16")
        with progress.step(f"build_{variant}", f"{variant}: build of {counts[-1]} adapters, context {shape.context}"):
            deployments.append(
                build_variant(
                    workdir / variant,
                    variant,
                    variant_foundation(shape, variant, shape.context),
                    counts[-1],
                    WIDE_ENVELOPE if wide else None,
                )
            )
    with progress.step("build_short", f"fp32: build of 1 adapter, context {shape.short_context}"):
        short = build_variant(
            workdir / f"fp32_ctx{shape.short_context}",
            f"fp32_ctx{shape.short_context}",
            variant_foundation(shape, "fp32", shape.short_context),
            1,
        )
    big = []
    for variant in ("fp32", "8da4w") if shape.big else ():
        with progress.step(f"build_big_{variant}", f"{variant}: build of the large shape, context {shape.big_context}"):
            d = build_variant(
                workdir / f"big_{variant}", variant, variant_foundation(shape, variant, shape.big_context, shape.big), 1
            )
        big.append(
            {
                "name": variant,
                "ptd_bytes": d.manifest.foundation_size,
                "export_s": d.export_s,
                "build_peak_rss": d.build_peak_rss,
                "fp32_bytes": fp32_foundation_bytes(shape.big),
            }
        )
    prompt = prompt_ids(shape.prompt_tokens, shape.foundation["vocab_size"])
    result_variants = []
    for d in deployments:
        wide = d.name.endswith("-all16")
        with progress.step(f"memory_{d.name}", f"{d.name}: memory for {counts} adapters"):
            memory = memory_rows(runner, d, counts, prompt, shape.new_tokens, all_setups=not wide)
        with progress.step(f"load_{d.name}", f"{d.name}: load times"):
            load = processes.load_times(runner, d.ptd, d.ptes[:2], [], repeats)
        adds = []
        if wide:
            with progress.step(f"add_{d.name}", f"{d.name}: lora-share add of {', '.join(ADDED)}"):
                adds = time_adds(d, workdir / f"add_{d.name}")
        args = d.manifest.args
        result_variants.append(
            {
                "name": d.name,
                "envelope": d.manifest.program["envelope"],
                "ptd_bytes": d.manifest.foundation_size,
                "pte_bytes": max(p.stat().st_size for p in d.ptes),
                "kv_cache_bytes": kv_cache_bytes(args),
                "full_kv_cache_bytes": full_kv_cache_bytes(args),
                "lora_bytes": max(a["lora_bytes"] for a in d.manifest.adapters),
                "adapter_bound_bytes": max(adapter_bound_bytes(p) for p in d.ptes[1:] or d.ptes),
                "export_s": d.export_s,
                "build_peak_rss": d.build_peak_rss,
                "fp32_bytes": fp32_foundation_bytes(shape.foundation),
                "memory": memory,
                "load": load,
                "adds": adds,
            }
        )
    wholes = [
        whole_program_copy(d, workdir / f"{d.name}-whole") for d in deployments if d.manifest.envelope.skip_absent
    ]
    timed = [*deployments, *wholes]
    with progress.step("speed", f"speed: {repeats} rounds over {len(timed) + 1} programs"):
        speed = speed_rows(runner, timed, short, shape, repeats)
    for v in result_variants:
        v["speed"] = speed[v["name"]]
        if f"{v['name']}-whole" in speed:
            v["speed_whole_program"] = speed[f"{v['name']}-whole"]
    result = {
        "format": "lora-share-bench-scale",
        "version": 2,
        **results_header(command),
        "shape": {"name": shape_name, **shape.__dict__},
        "counts": counts,
        "repeats": repeats,
        "adapter": ADAPTER,
        "variants": result_variants,
        "short_context": {"name": short.name, "export_s": short.export_s, "speed": speed[short.name]},
        "big": {"foundation": shape.big, "context": shape.big_context, "builds": big} if shape.big else None,
        "steps_s": progress.steps,
    }
    result["checks"] = checks(result)
    result["total_s"] = round(time.perf_counter() - progress.t0, 1)
    return result


def register(subparsers) -> None:
    """``lora-share bench-scale``: its flags and what it runs."""
    p = subparsers.add_parser(
        "bench-scale",
        help="memory and speed at SmolLM-135M's shape with a 2,048-token "
        "context: shared arena vs private arenas vs one process per adapter",
        epilog="examples:\n  lora-share bench-scale                 # = make bench-scale; about "
        "75 min the first time (6 exports), 15 min after; writes "
        "benchmarks/results/bench_scale.{json,md}\n"
        "  lora-share bench-scale --shape tiny --out /tmp/scale   # every step on a "
        "tiny shape",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=lambda ns: run_from_args(ns, typed_command("bench-scale")))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shape",
        choices=list(SHAPES),
        default=DEFAULT_SHAPE,
        help=f"the foundation's shape and request sizes (default {DEFAULT_SHAPE}; tiny for a smoke run)",
    )
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"deployments to measure (default: all of {', '.join(VARIANTS)})"
    )
    p.add_argument("--counts", default="1,2,4,8", help="adapter counts, increasing (default 1,2,4,8)")
    p.add_argument("--repeats", type=int, default=3, help="speed rounds and load starts, medians (default 3)")
    p.add_argument("--workdir", help="where the builds are kept and reused (default out/bench_scale[_SHAPE])")
    p.add_argument(
        "--out",
        default="benchmarks/results",
        help="results folder (default benchmarks/results): bench_scale.{json,md}, or "
        "bench_scale_SHAPE.{json,md} for another shape than the default",
    )
    p.add_argument("--runner", default="build/runner", help="the C++ runner (default build/runner)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run_from_args(ns, command: str) -> int:
    variants = [v.strip() for v in ns.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise UserError(f"--variants {ns.variants!r}: choose from {', '.join(VARIANTS)}")
    try:
        counts = [int(c) for c in ns.counts.split(",") if c.strip()]
    except ValueError:
        raise UserError(f"--counts {ns.counts!r}: expected comma-separated integers, e.g. 1,2,4,8") from None
    if not counts or counts != sorted(set(counts)) or counts[0] != 1:
        raise UserError(f"--counts {ns.counts!r}: give increasing adapter counts starting at 1, e.g. 1,2,4,8")
    if ns.repeats < 1:
        raise UserError("--repeats must be at least 1")
    suffix = "" if ns.shape == DEFAULT_SHAPE else f"_{ns.shape}"
    workdir = Path(ns.workdir or f"out/bench_scale{suffix}").resolve()
    try:
        result = run_scale(
            ns.shape,
            variants,
            counts,
            runner=Path(ns.runner),
            workdir=workdir,
            repeats=ns.repeats,
            quiet=ns.quiet,
            command=command,
        )
    except BenchError as e:
        raise BenchFailed(str(e)) from None
    written = write_results(result, Path(ns.out))
    print(markdown(result))
    if not ns.quiet:
        print(f"wrote {', '.join(map(str, written))} in {result['total_s'] / 60:.1f} min", file=sys.stderr)
    return 0 if all(c["ok"] for c in result["checks"] if c["enforced"]) else 1
