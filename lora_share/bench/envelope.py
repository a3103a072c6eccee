"""The wide-envelope benchmark: what a deployment built for any adapter costs the adapter it serves.

    make bench-envelope                   # = lora-share bench-envelope; writes benchmarks/results/bench_envelope.*
    lora-share bench-envelope --shape tiny --out /tmp/envelope   # the same steps on a tiny shape

Two builds of one synthetic foundation (bench-scale's shapes) with the same rank-8 q/v adapter: one
whose LoRA envelope is exactly that recipe (the default), one built with
``lora_envelope: {targets: all, max_rank: 16}`` and default settings otherwise (no ``skip_absent``:
the adapter's file carries the whole envelope program, and lora-share's runtime skips the slots the
adapter leaves alone, cpp_runner/runtime/program_variants.h). The wide build's adapter is also
written again without its record's slot table (``-whole``: the runtime then runs every slot), the
reference for what skipping saves.

Decode tokens/s at position about 10 and about 1,000, in one runner process per build, requests
interleaved across builds so the machine's noise hits all alike (median of ``--repeats``).

Checks (exit status 1 if one fails): decode through the wide envelope at >= 0.95 x through the exact
one, at ~10 and at ~1,000.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from contextlib import ExitStack
from pathlib import Path

from ..errors import UserError
from . import processes
from .common import BenchFailed, Progress, header_line, prompt_ids, results_header, typed_command, write_whole
from .memory import BenchError
from .scale_builds import ADAPTER, Deployment, build_variant, variant_foundation
from .scale_shapes import DEFAULT_SHAPE, SHAPES

WIDE = {"targets": "all", "max_rank": 16}
WIDE_SPEED = 0.95  # decode through the wide envelope >= 0.95 x through the exact one
PRECISIONS = ("fp32", "8da4w")


def whole_copy(d: Deployment, folder: Path) -> Deployment:
    """``d``'s first adapter written again without its record's slot table, into ``folder`` beside a link
    to ``d``'s foundation.ptd: the runtime runs every envelope slot for it."""
    from ..deploy.adapter_pte import Program, read_record
    from ..formats import read_pte

    data = d.ptes[0].read_bytes()
    meta = read_record(data, str(d.ptes[0]))
    keys = {k for e in meta.lora for k in (e.a, e.b)}
    tensors = {
        n.key: data[n.start : n.end] for n in read_pte(data, str(d.ptes[0]), plans=False).named_data if n.key in keys
    }
    meta = dataclasses.replace(meta, slot_patches=[], content_bytes=0, content_crc32=0)
    folder.mkdir(parents=True, exist_ok=True)
    pte, ptd = folder / d.ptes[0].name, folder / "foundation.ptd"
    pte.write_bytes(Program.from_adapter_file(d.ptes[0]).write(meta, tensors, slot_table=False))
    if not ptd.exists():
        os.link(d.ptd, ptd)
    return dataclasses.replace(d, name=f"{d.name}-whole", ptd=ptd, ptes=[pte], out=folder)


def decode_speeds(runner: Path, deployments: list[Deployment], near: list[int], far: list[int], new: int, repeats: int):
    """name -> {"near": decode tokens/s at ~len(near), "far": at ~len(far)}, medians over ``repeats`` rounds."""
    with ExitStack() as stack:
        servers = {
            d.name: (
                stack.enter_context(processes.Server(runner, d.ptes[:1], d.ptd, max_new_tokens=new)),
                d.ptes[0].stem,
            )
            for d in deployments
        }
        for server, adapter in servers.values():  # the first request touches every page: not timed
            server.ask(adapter, near)
        samples = {name: {"near": [], "far": []} for name in servers}
        for _ in range(repeats):
            for where, prompt in (("near", near), ("far", far)):
                for name, (server, adapter) in servers.items():
                    samples[name][where].append(server.ask(adapter, prompt)[0]["decode_tokens_per_s"])
    return {name: {k: round(statistics.median(v), 2) for k, v in s.items()} for name, s in samples.items()}


def run_envelope(
    command: str, shape_name: str, precisions: list[str], runner: Path, workdir: Path, repeats: int, quiet: bool
):
    shape = SHAPES[shape_name]
    progress = Progress(quiet)
    vocab = shape.foundation["vocab_size"]
    near, far = prompt_ids(shape.near_start, vocab), prompt_ids(shape.prompt_tokens, vocab)
    rows = []
    for precision in precisions:
        foundation = variant_foundation(shape, precision, shape.context)
        builds = []
        for name, envelope in ((precision, None), (f"{precision}-wide", WIDE)):
            with progress.step(f"build_{name}", f"{name}: build (reused when unchanged)"):
                builds.append(build_variant(workdir / name, name, foundation, 1, envelope))
        builds.append(whole_copy(builds[1], workdir / f"{precision}-wide-whole"))
        with progress.step(f"speed_{precision}", f"{precision}: decode speeds, {repeats} rounds"):
            speed = decode_speeds(runner, builds, near, far, shape.speed_new_tokens, repeats)
        exact, wide, whole = (speed[b.name] for b in builds)
        rows.append(
            {
                "precision": precision,
                "tokens_per_s": {b.name: speed[b.name] for b in builds},
                "wide_over_exact": {k: round(wide[k] / exact[k], 3) for k in ("near", "far")},
                "whole_over_exact": {k: round(whole[k] / exact[k], 3) for k in ("near", "far")},
            }
        )
    return {
        **results_header(command),
        "shape": shape_name,
        "foundation": shape.foundation,
        "context": shape.context,
        "positions": {"near": len(near), "far": len(far)},
        "adapter": ADAPTER,
        "wide_envelope": WIDE,
        "repeats": repeats,
        "rows": rows,
        "steps_s": progress.steps,
    }


def checks(result: dict) -> list[dict]:
    out = []
    for row in result["rows"]:
        for key in ("near", "far"):
            where = result["positions"][key]
            ratio = row["wide_over_exact"][key]
            out.append(
                {
                    "what": f"{row['precision']}: decode at ~{where}, all-linear rank-16 envelope / exact recipe",
                    "measured": ratio,
                    "limit": f">= {WIDE_SPEED}",
                    "ok": ratio >= WIDE_SPEED,
                }
            )
    return out


def markdown(result: dict) -> str:
    p = result["positions"]
    lines = [
        "# bench-envelope",
        "",
        header_line(result),
        "",
        f"Shape {result['shape']}, context {result['context']}; one adapter (rank {ADAPTER['rank']} on "
        f"{', '.join(ADAPTER['target_modules'])}) through its exact-recipe program and through "
        f"`lora_envelope: {{targets: all, max_rank: 16}}` (default settings), and the wide build's adapter with "
        f"no slot table (`-whole`: every slot run). Decode tokens/s, median of {result['repeats']} interleaved rounds.",
        "",
        f"| build | decode at ~{p['near']} | decode at ~{p['far']} |",
        "|---|---|---|",
    ]
    for row in result["rows"]:
        for name, s in row["tokens_per_s"].items():
            lines.append(f"| {name} | {s['near']:.1f} | {s['far']:.1f} |")
        for label, key in (("wide / exact", "wide_over_exact"), ("whole / exact", "whole_over_exact")):
            lines.append(f"| {row['precision']}: {label} | {row[key]['near']:.3f} | {row[key]['far']:.3f} |")
    lines += ["", "| check | measured | limit | |", "|---|---|---|---|"]
    lines += [
        f"| {c['what']} | {c['measured']} | {c['limit']} | {'ok' if c['ok'] else 'FAIL'} |" for c in checks(result)
    ]
    return "\n".join(lines) + "\n"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench-envelope",
        help="decode through an all-linear rank-16 envelope vs the exact-recipe program, for a q/v rank-8 adapter",
        epilog="examples:\n  lora-share bench-envelope            # = make bench-envelope; writes "
        "benchmarks/results/bench_envelope.{json,md}\n"
        "  lora-share bench-envelope --shape tiny --out /tmp/envelope   # every step on a tiny shape",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--shape", choices=list(SHAPES), default=DEFAULT_SHAPE, help=f"default {DEFAULT_SHAPE}")
    p.add_argument("--precisions", default="fp32", help=f"comma-separated, of {', '.join(PRECISIONS)} (default fp32)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved speed rounds, medians (default 5)")
    p.add_argument("--workdir", help="where the builds are kept and reused (default out/bench_envelope[_SHAPE])")
    p.add_argument("--out", default="benchmarks/results", help="results folder (default benchmarks/results)")
    p.add_argument("--runner", default="build/runner", help="the C++ runner (default build/runner)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=lambda ns: run_from_args(ns, typed_command("bench-envelope")))


def run_from_args(ns, command: str) -> int:
    precisions = [v.strip() for v in ns.precisions.split(",") if v.strip()]
    if not precisions or any(v not in PRECISIONS for v in precisions):
        raise UserError(f"--precisions {ns.precisions!r}: choose from {', '.join(PRECISIONS)}")
    if ns.repeats < 1:
        raise UserError("--repeats must be at least 1")
    if not Path(ns.runner).is_file():
        raise UserError(f"--runner {ns.runner}: no such file; run `make runner` first")
    suffix = "" if ns.shape == DEFAULT_SHAPE else f"_{ns.shape}"
    workdir = Path(ns.workdir or f"out/bench_envelope{suffix}").resolve()
    try:
        result = run_envelope(command, ns.shape, precisions, Path(ns.runner), workdir, ns.repeats, ns.quiet)
    except BenchError as e:
        raise BenchFailed(str(e)) from None
    result["checks"] = checks(result)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench_envelope{suffix}"
    write_whole(out / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    write_whole(out / f"{stem}.md", text)
    print(text)
    return 0 if all(c["ok"] for c in result["checks"]) else 1
