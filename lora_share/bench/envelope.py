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

One row: decode tokens/s at position about 10 and about 1,000 through the runner at its defaults (one
KV slot: ``decode`` for steps without drafts, ``decode_batch`` for those that verify some), in one runner
process per build, requests interleaved across builds, in reversed order every other round, so the
machine's noise hits all alike (median of ``--repeats``).

The batched step (``decode_batch``, what the server runs): milliseconds of a step of ``BATCH_ROWS``
rows on the adapter, each on its KV slot at the same position, carrying one token (a plain decode
step) or one token and ``DRAFTS`` drafts (speculative decoding's check), through the C library's
ls_diag_time_steps in one runtime per build, in one process, interleaved likewise.

Checks (exit status 1 if one fails): the wide envelope at >= 0.95 x the exact one's speed, at ~10 and
at ~1,000, one row and in the batched step, with and without drafts.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import statistics
from contextlib import ExitStack
from pathlib import Path

from ..errors import UserError
from ..inference import c_abi
from . import processes
from .common import BenchFailed, Progress, header_line, prompt_ids, results_header, typed_command, write_whole
from .memory import BenchError
from .scale_builds import ADAPTER, Deployment, build_variant, variant_foundation
from .scale_shapes import DEFAULT_SHAPE, SHAPES

WIDE = {"targets": "all", "max_rank": 16}
WIDE_SPEED = 0.95  # decode through the wide envelope >= 0.95 x through the exact one
BATCH_ROWS = 4  # rows of the batched step, each on the adapter
DRAFTS = 4  # drafts a row carries in the timed speculative check
STEPS = 16  # batched steps timed a round, for each size
BATCH_WARM_PROMPT = 8  # prompt tokens of the untimed first step of each size
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


def _order(by_name: dict, round_: int) -> list[str]:
    """The builds in their order on even rounds, reversed on odd ones: a build measured first (or right after
    another's burst of work) in one round is measured last in the next."""
    names = list(by_name)
    return names if round_ % 2 == 0 else names[::-1]


def decode_speeds(runner: Path, deployments: list[Deployment], near: list[int], far: list[int], new: int, repeats: int):
    """name -> {"near": one-row decode tokens/s at ~len(near), "far": at ~len(far)}, medians over ``repeats``
    rounds."""
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
        for round_ in range(repeats):
            for where, prompt in (("near", near), ("far", far)):
                for name in _order(servers, round_):
                    server, adapter = servers[name]
                    samples[name][where].append(server.ask(adapter, prompt)[0]["decode_tokens_per_s"])
    return {name: {k: round(statistics.median(v), 2) for k, v in s.items()} for name, s in samples.items()}


class _Variants(ctypes.Structure):
    """ls_diag_variants (lora_share_diag.h): the program variants that skip absent LoRA slots."""

    _fields_ = [(k, ctypes.c_uint64) for k in ("made", "refused", "failed", "resident")]


def _time_steps(rt, adapter, prompt: list[int], rows: int, tokens: int, steps: int) -> list[float]:
    """ls_diag_time_steps: the milliseconds of each of ``steps`` batched steps of ``rows`` rows carrying
    ``tokens`` tokens each, after ``prompt`` was fed on every row's slot."""
    lib = rt.lib
    lib.ls_diag_time_steps.restype = ctypes.c_int
    lib.ls_diag_time_steps.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    lib.ls_diag_time_steps.argtypes += [ctypes.c_size_t] * 4 + [ctypes.POINTER(ctypes.c_double)]
    lib.ls_diag_time_steps.argtypes += [ctypes.POINTER(c_abi.LsError)]
    ms, err = (ctypes.c_double * steps)(), c_abi.LsError()
    ids = (ctypes.c_int64 * len(prompt))(*prompt)
    if lib.ls_diag_time_steps(rt.handle, adapter, ids, len(prompt), rows, tokens, steps, ms, ctypes.byref(err)):
        raise BenchError(f"ls_diag_time_steps: {err.message.decode(errors='replace')}")
    return list(ms)


def _slot_variants(rt) -> dict:
    """ls_diag_slot_variants: the variants the runtime made, refused, failed to make, and keeps."""
    lib = rt.lib
    lib.ls_diag_slot_variants.restype = ctypes.c_int
    lib.ls_diag_slot_variants.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Variants), ctypes.POINTER(c_abi.LsError)]
    out, err = _Variants(), c_abi.LsError()
    if lib.ls_diag_slot_variants(rt.handle, ctypes.byref(out), ctypes.byref(err)):
        raise BenchError(f"ls_diag_slot_variants: {err.message.decode(errors='replace')}")
    return {k: getattr(out, k) for k, _ in _Variants._fields_}


def step_times(library: Path, deployments: list[Deployment], near: list[int], far: list[int], repeats: int):
    """name -> {"near"/"far": {tokens a row: median ms of a batched step of BATCH_ROWS rows}, "variants":
    ls_diag_slot_variants at the end}, over ``repeats`` interleaved rounds of ``STEPS`` steps each."""
    from ..inference import c_library

    sizes = [(where, prompt, tokens) for where, prompt in (("near", near), ("far", far)) for tokens in (1, 1 + DRAFTS)]
    with ExitStack() as stack:
        runtimes = {}
        for d in deployments:
            rt = stack.enter_context(c_library.open(d.ptd, library=library, parallel=BATCH_ROWS))
            runtimes[d.name] = (rt, rt.load_adapter(d.ptes[0]).handle)
        for rt, adapter in runtimes.values():  # a step of each shape first: XNNPACK plans it, variants are made
            for _, prompt, tokens in sizes:
                _time_steps(rt, adapter, prompt[:BATCH_WARM_PROMPT], BATCH_ROWS, tokens, steps=1)
        samples = {name: {(where, tokens): [] for where, _, tokens in sizes} for name in runtimes}
        for round_ in range(repeats):
            for where, prompt, tokens in sizes:
                for name in _order(runtimes, round_):
                    rt, adapter = runtimes[name]
                    samples[name][(where, tokens)] += _time_steps(rt, adapter, prompt, BATCH_ROWS, tokens, STEPS)
        variants = {name: _slot_variants(rt) for name, (rt, _) in runtimes.items()}
    out = {}
    for name, s in samples.items():
        out[name] = {where: {} for where in ("near", "far")}
        for (where, tokens), ms in s.items():
            out[name][where][str(tokens)] = round(statistics.median(ms), 3)
        out[name]["variants"] = variants[name]
    return out


def _ratios(exact: dict, other: dict) -> dict:
    """``other``'s tokens/s over ``exact``'s, at each position."""
    return {k: round(other[k] / exact[k], 3) for k in ("near", "far")}


def run_envelope(
    command: str,
    shape_name: str,
    precisions: list[str],
    runner: Path,
    library: Path,
    workdir: Path,
    repeats: int,
    quiet: bool,
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
        with progress.step(f"speed_{precision}", f"{precision}: one-row decode speeds, {repeats} rounds"):
            speed = decode_speeds(runner, builds, near, far, shape.speed_new_tokens, repeats)
        with progress.step(f"steps_{precision}", f"{precision}: batched steps of {BATCH_ROWS} rows, {repeats} rounds"):
            steps = step_times(library, builds[:2], near, far, repeats)
        exact, wide, whole = (speed[b.name] for b in builds)
        batch_exact, batch_wide = (steps[b.name] for b in builds[:2])
        rows.append(
            {
                "precision": precision,
                "tokens_per_s": {b.name: speed[b.name] for b in builds},
                "wide_over_exact": _ratios(exact, wide),
                "whole_over_exact": _ratios(exact, whole),
                "batch_ms": {b.name: steps[b.name] for b in builds[:2]},
                "batch_wide_over_exact": {
                    tokens: {w: round(batch_exact[w][tokens] / batch_wide[w][tokens], 3) for w in ("near", "far")}
                    for tokens in batch_exact["near"]
                },
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
        "batch": {"rows": BATCH_ROWS, "drafts": DRAFTS, "steps_a_round": STEPS},
        "rows": rows,
        "steps_s": progress.steps,
    }


def checks(result: dict) -> list[dict]:
    out = []

    def check(what: str, ratio: float) -> None:
        out.append({"what": what, "measured": ratio, "limit": f">= {WIDE_SPEED}", "ok": ratio >= WIDE_SPEED})

    rows = result["batch"]["rows"]
    for row in result["rows"]:
        for key in ("near", "far"):
            where = f"at ~{result['positions'][key]}, all-linear rank-16 envelope / exact recipe"
            check(f"{row['precision']}: one-row decode {where}", row["wide_over_exact"][key])
            for tokens, ratios in row["batch_wide_over_exact"].items():
                carried = "1 token" if tokens == "1" else f"1 token + {int(tokens) - 1} drafts"
                check(f"{row['precision']}: batched step of {rows} rows x {carried} {where}", ratios[key])
    return out


def markdown(result: dict) -> str:
    p, b = result["positions"], result["batch"]
    lines = [
        "# bench-envelope",
        "",
        header_line(result),
        "",
        f"Shape {result['shape']}, context {result['context']}; one adapter (rank {ADAPTER['rank']} on "
        f"{', '.join(ADAPTER['target_modules'])}) through its exact-recipe program and through "
        "`lora_envelope: {targets: all, max_rank: 16}` (default settings), and the wide build's adapter with "
        "no slot table (`-whole`: every slot run). Medians of "
        f"{result['repeats']} interleaved rounds.",
        "",
        "One row (`build/runner` at its defaults), decode tokens/s:",
        "",
        f"| build | at ~{p['near']} | at ~{p['far']} |",
        "|---|---|---|",
    ]
    for row in result["rows"]:
        for name, s in row["tokens_per_s"].items():
            lines.append(f"| {name} | {s['near']:.1f} | {s['far']:.1f} |")
        for label, key in (("wide / exact", "wide_over_exact"), ("whole / exact", "whole_over_exact")):
            lines.append(f"| {row['precision']}: {label} | {row[key]['near']:.3f} | {row[key]['far']:.3f} |")
    lines += [
        "",
        f"The batched step (`decode_batch`), {b['rows']} rows on the adapter, ms a step ({b['steps_a_round']} "
        "steps a round); each row carries 1 token, or 1 and "
        f"{b['drafts']} drafts:",
        "",
        f"| build | 1 token at ~{p['near']} | +{b['drafts']} drafts at ~{p['near']} "
        f"| 1 token at ~{p['far']} | +{b['drafts']} drafts at ~{p['far']} | variants made |",
        "|---|---|---|---|---|---|",
    ]
    drafted = str(1 + b["drafts"])
    for row in result["rows"]:
        for name, s in row["batch_ms"].items():
            cells = [f"{s[w][t]:.2f}" for w in ("near", "far") for t in ("1", drafted)]
            lines.append(f"| {name} | {' | '.join(cells)} | {s['variants']['made']} |")
        r = row["batch_wide_over_exact"]
        cells = [f"{r[t][w]:.3f}" for w in ("near", "far") for t in ("1", drafted)]
        lines.append(f"| {row['precision']}: wide / exact (speed) | {' | '.join(cells)} | |")
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
    p.add_argument("--library", default="build/liblora_share.so", help="the C library (default build/liblora_share.so)")
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
    if not Path(ns.library).is_file():
        raise UserError(f"--library {ns.library}: no such file; run `make runner` first")
    suffix = "" if ns.shape == DEFAULT_SHAPE else f"_{ns.shape}"
    workdir = Path(ns.workdir or f"out/bench_envelope{suffix}").resolve()
    try:
        result = run_envelope(
            command, ns.shape, precisions, Path(ns.runner), Path(ns.library), workdir, ns.repeats, ns.quiet
        )
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
