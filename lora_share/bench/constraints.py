"""What structured output costs the C runtime (docs/structured-output.md), measured in one run (issue 59):

- a JSON schema's compile time, first (a cache miss) and cached (a hit), from ls_stats;
- the mask's time per constrained token (filled on the mask worker) and what the picks waited for it;
- per-row decode speed in a 4-row mixed-adapter batch with 2 rows constrained, against the same
  4 rows with none (the constrained rows and the free rows each, as ratios);
- the one-row path (parallel 1): a constrained request's decode speed against the same request free.

    make bench-serve                                         # per precision, with its checks
    make bench-structured                                    # alone, on the demo deployment
    lora-share bench-structured out/smollm2 [--new 64] [--repeats 5] [--out FILE]

Speeds are medians over the repeats, free and constrained runs interleaved. The constrained rows' schema
asks for a string of at least 2,000 characters, so they decode as many tokens as the free rows (nothing
ends early) through JSON's string states, with greedy picks (cache_prompt off).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import UserError
from ..inference import c_library as native
from ..inference.c_options import TOKEN_INFO_CALLBACK, set_request_options
from ..manifest import read_manifest
from .common import at_least, results_header, typed_command, write_whole

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "minLength": 2000},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["answer", "confidence"],
}
# A schema of the kind apps send, for the compile times.
FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city"],
        },
    },
    "required": ["name", "email", "age"],
}
QUESTION = "Why is the sky blue?"
CONSTRAINED_ROWS = {0, 1}
# Issue 59: constrained rows keep at least this share of their unconstrained speed, and so do the others.
ROW_SPEED_SHARE = 0.9


def delta(after: dict, before: dict, key: str) -> float:
    return after[key] - before[key]


def row_speed(rt, adapter: str, prompt: list[int], new: int, constrained: bool, barrier=None) -> float:
    """Tokens per second after the first token of one request (its decode speed)."""
    stamps: list[float] = []
    request = {"constraint": {"json_schema": SCHEMA}} if constrained else {}
    if barrier is not None:
        barrier.wait()

    def collect(info_pointer, _user):
        stamps.append(time.perf_counter())
        return 0

    # Free rows go on past EOS (a constrained one cannot end before its 2,000 characters).
    opts = native._generate_options(rt.lib, new, 0.0, 0, not constrained)
    opts.cache_prompt = 0
    keep = set_request_options(opts, **request)
    callback = TOKEN_INFO_CALLBACK(collect)
    opts.on_token_info = callback
    ids = (ctypes.c_int64 * len(prompt))(*prompt)
    err = native._Error()
    status = rt.lib.ls_generate_named(
        rt.handle, adapter.encode(), ids, len(prompt), ctypes.byref(opts), native.TOKEN_CALLBACK(), None, err
    )
    del keep
    if status != 0:
        native._raise(rt.lib, err)
    if len(stamps) != new:
        raise RuntimeError(f"{adapter}: {len(stamps)} tokens of {new}")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def mixed(rt, adapters, prompts, new, constrained_rows) -> tuple[list[float], float]:
    """Each row's decode speed, and the batch's mean decode step (ms) over the run."""
    barrier = threading.Barrier(len(adapters))
    before, start = rt.stats(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(adapters)) as pool:
        jobs = [
            pool.submit(row_speed, rt, a, p, new, i in constrained_rows, barrier)
            for i, (a, p) in enumerate(zip(adapters, prompts))
        ]
        speeds = [j.result() for j in jobs]
    seconds, steps = time.perf_counter() - start, delta(rt.stats(), before, "batch_steps")
    return speeds, seconds / steps * 1000


def measure(folder: Path, new: int = 64, repeats: int = 5) -> dict:
    """Every figure of the module docstring for one deployment folder (its first four adapters)."""
    adapters = read_manifest(Path(folder)).adapter_names[:4]
    out: dict = {"new_tokens": new, "repeats": repeats, "adapters": adapters}
    with native.open_dir(str(folder), parallel=4) as rt:
        tok = rt.tokenizer()
        prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": QUESTION}]), add_special=False)
        before = rt.stats()
        rt.check_options(adapters[0], constraint={"json_schema": FORM})
        first = rt.stats()
        rt.check_options(adapters[0], constraint={"json_schema": FORM})
        cached = rt.stats()
        out["compile_first_ms"] = round(delta(first, before, "constraint_compile_ms"), 2)
        out["compile_cached_us"] = round(delta(cached, first, "constraint_cache_hit_ms") * 1000, 2)

        prompts = [prompt] * len(adapters)
        mixed(rt, adapters, prompts, 8, CONSTRAINED_ROWS)  # warm: every adapter loaded, the schema compiled
        free, mix = [], []
        start = rt.stats()
        for _ in range(repeats):  # interleaved, so that a busy spell hits both
            free.append(mixed(rt, adapters, prompts, new, set()))
            mix.append(mixed(rt, adapters, prompts, new, CONSTRAINED_ROWS))
        end = rt.stats()
        masked = delta(end, start, "masked_tokens")
        out["masked_tokens"] = masked
        out["mask_fill_us_per_token"] = round(delta(end, start, "mask_ms") / masked * 1000, 2)
        out["mask_wait_us_per_token"] = round(delta(end, start, "mask_wait_ms") / masked * 1000, 2)
        out["step_ms_free"] = round(statistics.median(run[1] for run in free), 2)
        out["step_ms_mixed"] = round(statistics.median(run[1] for run in mix), 2)
        out["rows"] = [
            {
                "adapter": a,
                "constrained": i in CONSTRAINED_ROWS,
                "free_tokens_per_s": round(statistics.median(run[0][i] for run in free), 2),
                "mixed_tokens_per_s": round(statistics.median(run[0][i] for run in mix), 2),
            }
            for i, a in enumerate(adapters)
        ]
        for row in out["rows"]:
            row["ratio"] = round(row["mixed_tokens_per_s"] / row["free_tokens_per_s"], 3)

    with native.open_dir(str(folder)) as rt:
        row_speed(rt, adapters[0], prompt, 8, True)  # warm
        runs = [
            (row_speed(rt, adapters[0], prompt, new, False), row_speed(rt, adapters[0], prompt, new, True))
            for _ in range(repeats)
        ]
        alone_free = statistics.median(r[0] for r in runs)
        alone_constrained = statistics.median(r[1] for r in runs)
        out["one_row"] = {
            "adapter": adapters[0],
            "free_tokens_per_s": round(alone_free, 2),
            "constrained_tokens_per_s": round(alone_constrained, 2),
            "ratio": round(alone_constrained / alone_free, 3),
        }
    return out


def lines(m: dict) -> list[str]:
    """The figures as report lines (markdown list items)."""
    rows = "; ".join(
        f"{r['adapter']} ({'constrained' if r['constrained'] else 'free'}) {r['free_tokens_per_s']} -> "
        f"{r['mixed_tokens_per_s']} tok/s, ratio {r['ratio']}"
        for r in m["rows"]
    )
    one = m["one_row"]
    return [
        f"- schema compile: first {m['compile_first_ms']} ms, cached {m['compile_cached_us']} us",
        f"- mask per constrained token: {m['mask_fill_us_per_token']} us filled on the mask worker, "
        f"{m['mask_wait_us_per_token']} us waited after the step ({m['masked_tokens']} tokens)",
        f"- 4-row batch, 2 rows constrained vs none: step {m['step_ms_free']} -> {m['step_ms_mixed']} ms; rows: {rows}",
        f"- one-row path ({one['adapter']}): {one['free_tokens_per_s']} -> {one['constrained_tokens_per_s']} tok/s "
        f"constrained, ratio {one['ratio']}",
    ]


def checks(m: dict) -> list[tuple[str, float, str, bool]]:
    """Issue 59's mixed-batch line: (what, value, target, ok) for the constrained rows and the free rows."""
    out = []
    for constrained in (True, False):
        worst = min(r["ratio"] for r in m["rows"] if r["constrained"] == constrained)
        kind = "the constrained rows" if constrained else "the free rows"
        out.append(
            (
                f"4-row batch, 2 rows constrained: {kind}, decode speed / the same rows with none (worst row)",
                worst,
                f">= {ROW_SPEED_SHARE}",
                worst >= ROW_SPEED_SHARE,
            )
        )
    return out


def register(subparsers) -> None:
    """``lora-share bench-structured``: its flags and what it runs."""
    p = subparsers.add_parser(
        "bench-structured",
        help="what structured output costs the C runtime: schema compile time, mask time per token, "
        "constrained rows beside free ones in a 4-row mixed batch",
        epilog="examples:\n  lora-share bench-structured            # = make bench-structured: the demo deployment\n"
        "  lora-share bench-structured out/smollm2 --new 32 --repeats 3 --out -",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("deployment", nargs="?", default="out/smollm2", type=Path, help="build folder (default out/smollm2)")
    p.add_argument("--new", type=at_least(8), default=64, help="tokens decoded per row (default 64)")
    p.add_argument("--repeats", type=at_least(1), default=5, help="interleaved repeats, medians kept (default 5)")
    p.add_argument("--out", default="benchmarks/results/bench_structured.json", help="results JSON ('-': none)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Measures, prints the figures and the checks, writes the results file whole; 1 when a check fails."""
    if not (args.deployment / "manifest.json").is_file():
        raise UserError(
            f"{args.deployment}: no manifest.json: give a build folder (`make demo-outputs` writes out/smollm2)"
        )
    m = measure(args.deployment, args.new, args.repeats)
    print("\n".join(lines(m)))
    results = checks(m)
    for what, value, target, ok in results:
        print(f"{'PASS' if ok else 'FAIL'} {what}: {value} (target {target})")
    if args.out != "-":
        record = {
            **results_header(typed_command("bench-structured")),
            "deployment": str(args.deployment),
            **m,
            "checks": [{"what": w, "value": v, "target": t, "ok": ok} for w, v, t, ok in results],
        }
        write_whole(Path(args.out), json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if all(ok for *_, ok in results) else 1
