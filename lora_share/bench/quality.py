"""The quality benchmark: perplexity and top-1 agreement with transformers float32 of the real
SmolLM2-135M-Instruct, with a float32 and an 8da4w foundation, each alone ("base") and with an adapter.

    make bench-quality          # = lora-share bench-quality; writes benchmarks/results/bench_quality.{json,md}
    lora-share bench-quality --peft examples/smollm2/adapters/x   # a trained PEFT adapter instead

The deployment is ``--config`` (default benchmarks/quality/smollm2.yaml), built as written (fp32) and with
``foundation.quantize`` = ``VARIANTS["8da4w"]`` into ``--work``/fp32 and ``--work``/8da4w; `lora-share build`
keeps each unchanged build as it is, so later runs export nothing. ``--peft`` replaces the config's
adapters with one PEFT folder.

The text is held out from everything lora-share does: the reST sources of the Python 3.11 tutorial from
Debian's python3.11-doc package (PSF-2.0), /usr/share/doc/python3.11/html/_sources/tutorial/*.rst.txt,
whole files in name order until the text has enough tokens, then cut to whole windows of the build's
context: the fewest windows that score at least ``--tokens`` tokens. Each (foundation, adapter) pair is
then measured by `lora-share eval` (evaluate.py) on that text in a process of its own, ``--jobs`` (2) at
a time; the results files are rewritten after each measurement ("complete": false until the last). Each
measurement is also kept in ``--work``/measured with what it depends on (the sha256 of the foundation,
program, tokenizer and adapter, and of the text), and the results JSON records each measurement's
key: a re-run, here or on a fresh machine from the committed results, measures only what changed or is
missing.

The check printed at the end (exit status 1 if it fails): the 8da4w foundation's perplexity is at most
``--max-ratio`` (1.03) x the float32 foundation's, alone and with the adapter.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from ..config import BASE_NAME
from ..errors import UserError
from ..manifest import read_manifest
from .common import header_line, results_header, typed_command, write_whole

DOC_PACKAGE = "python3.11-doc"
DOC_SOURCES = Path("/usr/share/doc/python3.11/html/_sources/tutorial")
DOC_PATTERN = "*.rst.txt"
# The 8da4w foundation on the grid of the model's own file: its GGUF is Q4_1 (groups of 32 with a scale
# and a minimum) with a Q8_0 embedding, so the int4 groups are asymmetric (Q4_1's weights kept exactly),
# the tied output projection and the embedding int8. ExecuTorch's default symmetric grid re-rounds
# every Q4_1 weight: 1.64 x fp32 perplexity on this text (docs/bench-quality.md).
VARIANTS = {
    "fp32": None,
    "8da4w": {"scheme": "8da4w", "group_size": 32, "grid": "asymmetric", "lm_head": "int8", "embedding": "int8"},
}
MAX_RATIO = 1.03


def register(subparsers) -> None:
    """``lora-share bench-quality``: its flags and what it runs."""
    p = subparsers.add_parser(
        "bench-quality",
        help="perplexity and top-1 agreement with transformers float32 of the "
        "real SmolLM2-135M-Instruct, fp32 and 8da4w foundations, alone and "
        "with an adapter, on the Python tutorial (Debian's python3.11-doc)",
        epilog="examples:\n  lora-share bench-quality      # = make bench-quality; writes "
        "benchmarks/results/bench_quality.{json,md}\n"
        "  lora-share bench-quality --peft path/to/peft_dir --out /tmp/quality.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=lambda ns: run_from_args(ns, typed_command("bench-quality")))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default="benchmarks/quality/smollm2.yaml",
        help="the deployment: a checkpoint foundation (float32) and its adapter "
        "(default benchmarks/quality/smollm2.yaml)",
    )
    p.add_argument("--peft", metavar="DIR", help="measure this PEFT adapter folder instead of the config's adapters")
    p.add_argument(
        "--work", default="out/bench_quality", help="where the builds are made and kept (default out/bench_quality)"
    )
    p.add_argument(
        "--sources",
        default=str(DOC_SOURCES),
        help=f"folder of the text's files ({DOC_PATTERN}, in name order; default {DOC_SOURCES}, "
        f"from Debian's {DOC_PACKAGE})",
    )
    p.add_argument("--tokens", type=int, default=20000, help="tokens scored at least (default 20000)")
    p.add_argument(
        "--max-ratio",
        type=float,
        default=MAX_RATIO,
        help=f"most 8da4w perplexity / fp32 perplexity that passes (default {MAX_RATIO})",
    )
    p.add_argument("--jobs", type=int, default=2, help="measurements run at once, one process each (default 2)")
    p.add_argument(
        "--out",
        default="benchmarks/results/bench_quality.json",
        help="results JSON, with a Markdown table beside it ('-': none)",
    )


def variant_config(config: Path, work: Path, variant: str, peft: Path | None) -> Path:
    """``config`` as the ``variant`` build in ``work``: its own output folder, paths made absolute (as
    written, symbolic links kept: the build's export settings, which decide its reuse, hold them), the
    foundation quantized as the variant says, the adapters replaced by ``peft`` if given."""
    import yaml  # imported where used: `lora-share --help` runs with the bare wheel

    try:
        cfg = yaml.safe_load(config.read_text())
    except FileNotFoundError:
        raise UserError(f"{config}: no such config file") from None
    fnd = cfg.get("foundation") or {}
    for key in ("checkpoint", "tokenizer"):
        if key in fnd:
            fnd[key] = os.path.abspath(config.parent / fnd[key])
    for adapter in cfg.get("adapters") or []:
        if "peft" in adapter:
            adapter["peft"] = os.path.abspath(config.parent / adapter["peft"])
    fnd.pop("quantize", None)
    if VARIANTS[variant] is not None:
        fnd["quantize"] = VARIANTS[variant]
    if peft is not None:
        if not (peft / "adapter_config.json").is_file():
            raise UserError(f"--peft {peft}: not a PEFT adapter folder (no adapter_config.json)")
        cfg["adapters"] = [{"name": peft.resolve().name, "peft": str(peft.resolve())}]
    cfg["output_dir"] = str((work / variant).resolve())
    path = work / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def held_out_text(sources: Path, tokenizer_json: Path, tokens: int, window: int) -> tuple[str, list[str], int]:
    """The text (whole files of ``sources`` in name order until it encodes to enough tokens), the
    files, and how many of its tokens make the fewest whole windows that score ``tokens``."""
    from tokenizers import Tokenizer

    files = sorted(sources.glob(DOC_PATTERN))
    if not files:
        raise UserError(
            f"{sources}: no {DOC_PATTERN} files: install Debian's {DOC_PACKAGE} "
            f"(apt-get install {DOC_PACKAGE}; `make bench-quality` does), or give --sources"
        )
    windows = math.ceil(tokens / (window - 1))
    needed = windows * window
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    text, used = "", []
    for f in files:
        text += f.read_text(encoding="utf-8")
        used.append(f.name)
        if len(tokenizer.encode(text, add_special_tokens=False).ids) >= needed:
            return text, used, needed
    raise UserError(f"{sources}: its {DOC_PATTERN} files make fewer than {needed} tokens")


def run(ns, command: str) -> tuple[dict, bool]:
    """Build, measure and check; writes the results (their header naming ``command``) after each
    measurement (``"complete": false`` until the last); returns them and whether the check passed."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    work = Path(ns.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    builds, build_s = {}, {}
    for variant in VARIANTS:
        cfg = variant_config(Path(ns.config), work, variant, Path(ns.peft) if ns.peft else None)
        print(f"== building {variant}: {cfg} (kept as it is if nothing changed)", file=sys.stderr, flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "lora_share.cli", "build", str(cfg)])
        if proc.returncode != 0:
            raise UserError(f"building {cfg} failed (above)")
        builds[variant] = work / variant
        build_s[variant] = round(time.perf_counter() - start, 1)
    manifest = read_manifest(builds["fp32"])
    window = manifest.max_seq_len
    text, files, n_tokens = held_out_text(Path(ns.sources), builds["fp32"] / "tokenizer.json", ns.tokens, window)
    text_path = work / "text.txt"
    text_path.write_text(text, encoding="utf-8")
    adapters = [BASE_NAME, *manifest.adapter_names]
    # The quantized foundation's measurement is the shorter: it goes first, so that with two jobs both
    # foundations' base figures (the check) come before the adapters'.
    jobs = [(variant, adapter) for adapter in adapters for variant in reversed(VARIANTS)]
    results = {
        **results_header(command),
        "config": str(ns.config),
        "adapter": ns.peft or "the config's",
        "text": {
            "package": DOC_PACKAGE,
            "version": _package_version(DOC_PACKAGE),
            "license": "PSF-2.0",
            "sources": str(ns.sources),
            "files": files,
            "tokens": n_tokens,
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        },
        "build_s": build_s,
        "jobs": ns.jobs,
        "variants": {},
        "checks": [],
        "complete": False,
    }
    done: dict[tuple[str, str], dict] = {}
    keys = {job: _measurement_key(builds[job[0]], job[1], results["text"]["sha256"], n_tokens) for job in jobs}
    previous = _read_results(ns.out)
    for job in jobs:
        kept = _kept_measurement(work, job, keys[job]) or _kept_in_results(previous, job, keys[job])
        if kept is not None:
            print(
                f"== {job[1]} on {job[0]}: kept from an earlier run (same build, adapter and text)",
                file=sys.stderr,
                flush=True,
            )
            done[job] = kept
    results["kept"] = [f"{v}/{a}" for v, a in done]
    _collect(results, done, jobs, keys, ns.max_ratio)
    results["seconds"], results["complete"] = round(time.perf_counter() - t0, 1), len(done) == len(jobs)
    _save(results, ns.out)

    def measure(variant: str, adapter: str) -> dict:
        cmd = [
            sys.executable,
            "-m",
            "lora_share.cli",
            "eval",
            str(builds[variant]),
            str(text_path),
            "--adapter",
            adapter,
            "--max-tokens",
            str(n_tokens),
            "--min-tokens",
            str(ns.tokens),
            "--json",
        ]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise UserError(f"measuring {adapter} on the {variant} foundation failed (above): {' '.join(cmd)}")
        measured = json.loads(proc.stdout)
        _measurement_path(work, (variant, adapter)).parent.mkdir(exist_ok=True)
        write_whole(
            _measurement_path(work, (variant, adapter)),
            json.dumps({"key": keys[(variant, adapter)], "measured": measured}, indent=2) + "\n",
        )
        return measured

    with ThreadPoolExecutor(max_workers=ns.jobs) as pool:
        futures = {pool.submit(measure, *job): job for job in jobs if job not in done}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            _collect(results, done, jobs, keys, ns.max_ratio)
            results["seconds"] = round(time.perf_counter() - t0, 1)
            results["complete"] = len(done) == len(jobs)
            _save(results, ns.out)
    return results, all(c["ok"] for c in results["checks"])


def _measurement_key(build: Path, adapter: str, text_sha256: str, tokens: int) -> dict:
    """What a measurement depends on, as the build's manifest records it (the foundation's, the program's,
    the tokenizer's and the adapter's sha256) and the text. A measurement with the same key is the same
    measurement."""
    manifest = read_manifest(build)
    entry = manifest.adapter(adapter)
    return {
        "foundation": manifest.foundation_sha256,
        "program": manifest.program_sha256,
        "tokenizer": manifest.tokenizer_files["tokenizer.json"]["sha256"],
        "adapter": adapter,
        "adapter_sha256": entry["sha256"] if entry else None,
        "text_sha256": text_sha256,
        "tokens": tokens,
    }


def _measurement_path(work: Path, job: tuple[str, str]) -> Path:
    return work / "measured" / f"{job[0]}.{job[1]}.json"


def _kept_measurement(work: Path, job: tuple[str, str], key: dict) -> dict | None:
    """An earlier run's measurement of ``job`` if its key is ``key`` (measurements of the real model take
    up to an hour each; a re-run measures only what changed or is missing)."""
    path = _measurement_path(work, job)
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved["measured"] if isinstance(saved, dict) and saved.get("key") == key else None


def _read_results(out: str) -> dict:
    """The results file an earlier run wrote at ``out`` (empty if none or unreadable)."""
    try:
        saved = json.loads(Path(out).read_text()) if out != "-" else {}
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _kept_in_results(previous: dict, job: tuple[str, str], key: dict) -> dict | None:
    """``job``'s measurement from an earlier results file whose recorded key for it is ``key``: the
    committed results carry their keys, so a fresh machine whose builds come out the same (the same
    sha256 for foundation, program, tokenizer and adapter) measures only what changed."""
    variant, adapter = job
    report = (previous.get("variants") or {}).get(variant)
    if (previous.get("keys") or {}).get(f"{variant}/{adapter}") != key or not isinstance(report, dict):
        return None
    rows = [r for r in report.get("results", []) if r.get("adapter") == adapter]
    if len(rows) != 1:
        return None
    return {**{k: v for k, v in report.items() if k != "results"}, "results": rows}


def _collect(results: dict, done: dict, jobs: list, keys: dict, max_ratio: float) -> None:
    """The finished measurements into ``results``: each foundation's report, in the jobs' adapter order,
    each one's key (what it depends on), and the check of every adapter measured on both foundations."""
    results["keys"] = {f"{v}/{a}": keys[(v, a)] for v, a in jobs if (v, a) in done}
    results["variants"] = {}
    for variant in VARIANTS:
        rows = [done[(v, a)] for v, a in jobs if v == variant and (v, a) in done]
        if rows:
            results["variants"][variant] = {**rows[0], "results": [r for row in rows for r in row["results"]]}
    results["checks"] = []
    for variant, adapter in jobs:
        if variant != "fp32" or (variant, adapter) not in done or ("8da4w", adapter) not in done:
            continue
        fp32, q = done[("fp32", adapter)]["results"][0], done[("8da4w", adapter)]["results"][0]
        ratio = q["perplexity"] / fp32["perplexity"]
        results["checks"].append(
            {
                "adapter": adapter,
                "fp32_perplexity": fp32["perplexity"],
                "8da4w_perplexity": q["perplexity"],
                "ratio": ratio,
                "limit": max_ratio,
                "ok": ratio <= max_ratio,
            }
        )


def _save(results: dict, out: str) -> None:
    if out == "-":
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(results, indent=2) + "\n")
    write_whole(path.with_suffix(".md"), markdown(results))


def _package_version(name: str) -> str:
    try:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True, timeout=30)
        return proc.stdout.strip() if proc.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def markdown(results: dict) -> str:
    """The results as the Markdown page written beside the JSON."""
    t = results["text"]
    lines = [
        "# Quality: perplexity and top-1 agreement with transformers float32",
        "",
        f"{header_line(results)} {results['seconds'] / 60:.0f} min with {results['jobs']} measurements at once"
        f"{'; kept from an earlier run: ' + ', '.join(results['kept']) if results.get('kept') else ''}; builds "
        f"{', '.join(f'{k} {v:.0f} s' for k, v in results['build_s'].items())}"
        f"{'' if results['complete'] else '; INCOMPLETE, measurements still running'}.",
        "",
        f"Text: {len(t['files'])} files of the Python 3.11 tutorial's reST sources ({', '.join(t['files'])}) from "
        f"Debian's {t['package']} {t['version']} ({t['license']}), cut to {t['tokens']} tokens (sha256 of the "
        f"text {t['sha256'][:12]}), scored in windows of the context, one token per forward call.",
        "",
        "| foundation | adapter | perplexity | transformers fp32 | ratio | top-1 agreement | max abs logit diff"
        " | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, report in results["variants"].items():
        for r in report["results"]:
            lines.append(
                f"| {variant} | {r['adapter']} | {r['perplexity']:.4f} | {r['reference_perplexity']:.4f} | "
                f"{r['ratio']:.4f} | {100 * r['top1_agreement']:.2f}% | {r['max_abs_logit_diff']:.2e} | "
                f"{r['tokens_per_s']:.1f} |"
            )
    lines += ["", "| check | measured | limit | |", "|---|---|---|---|"]
    for c in results["checks"]:
        lines.append(
            f"| 8da4w / fp32 perplexity, {c['adapter']} | {c['ratio']:.4f} | <= {c['limit']} | "
            f"{'ok' if c['ok'] else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n"


def run_from_args(ns, command: str) -> int:
    from ..evaluate import Report, Scores, render

    results, ok = run(ns, command)
    for report in results["variants"].values():
        rows = [Scores(**{k: v for k, v in r.items() if k != "ratio"}) for r in report["results"]]
        print(render(Report(report["build"], report["quantize"], report["text"], report["reference"], rows)))
    for c in results["checks"]:
        print(
            f"8da4w perplexity / fp32 perplexity ({c['adapter']}): {c['ratio']:.4f} <= {c['limit']}: "
            f"{'ok' if c['ok'] else 'FAIL'}"
        )
    if ns.out != "-":
        print(f"results: {ns.out}, {Path(ns.out).with_suffix('.md')}")
    return 0 if ok else 1
