"""The benchmark's outputs: bench.json, bench.md (tables) and two PNG plots (matplotlib, optional)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MIB = 1024 * 1024


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _mib_kb(kb: int) -> str:
    return f"{kb / 1024:.1f} MiB"


def _x(r: float) -> str:
    return f"{r:.2f}×"


def _ms(v) -> str:
    return "–" if v is None else f"{v:.1f} ms"


def _signed_ms(v: float, noise: float) -> str:
    text = f"{v:+.2f} ms" if round(v, 2) != 0 else "±0.00 ms"
    return f"{text} (noise)" if abs(v) < noise else text


def switch_noise_ms(switch: dict) -> float:
    """Two standard errors of a difference of two medians, from the spread of same-adapter latencies:
    switch costs smaller than this cannot be told from the machine's noise."""
    same = switch["same"]
    sigma = same["iqr_ms"] / 1.349  # the IQR of a normal distribution is 1.349 sigma
    return 2 * (2**0.5) * 1.253 * sigma / same["requests"] ** 0.5


def headline_table(result: dict) -> str:
    """The table for the README: disk and memory for every N, ratios from this run."""
    lines = [
        "| adapters | disk: lora-share (foundation.ptd + N .pte) | disk: N stand-alone .pte | × | "
        "PSS: lora-share, 1 process | PSS: N stand-alone processes | × | PSS: stock, 1 `Module` per adapter | × |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d, m in zip(result["disk"], result["memory"]):
        lines.append(
            f"| {d['adapters']} | {_mb(d['shared_bytes'])} | {_mb(d['standalone_bytes'])} | "
            f"{_x(d['standalone_over_shared'])} | {_mib_kb(m['shared']['pss_kb'])} | "
            f"{_mib_kb(m['standalone']['pss_kb'])} | {_x(m['standalone_over_shared'])} | "
            f"{_mib_kb(m['stock']['pss_kb'])} | {_x(m['stock_over_shared'])} |"
        )
    return "\n".join(lines)


def _per_adapter_note(result: dict) -> str:
    mem, disk = result["memory"], result["disk"]
    first, last = mem[0], mem[-1]
    text = ""
    if last["adapters"] > first["adapters"]:
        per = (last["shared"]["pss_kb"] - first["shared"]["pss_kb"]) / (last["adapters"] - first["adapters"]) / 1024
        alone = last["standalone"]["pss_kb"] / last["adapters"] / 1024
        text = (
            f"Each further adapter adds {per:.1f} MiB to the lora-share process (its LoRA weights, KV cache "
            f"and activation buffers, once it has served a request); each stand-alone process costs "
            f"{alone:.1f} MiB. "
        )
    extra = disk[0]["standalone_bytes"] - disk[0]["shared_bytes"]
    if result["foundation"]["args"].get("tie_embeddings") and extra > 0:
        text += (
            f"A stand-alone .pte is {extra / 1e6:.1f} MB larger than foundation.ptd + the adapter's .pte: "
            "it keeps the tied embedding twice (the embedding lookup's constant and XNNPACK's copy for the "
            "output projection), where foundation.ptd stores the identical bytes once."
        )
    return text


def _intro(result: dict) -> list[str]:
    """The title, how and where the run was made, and what was measured."""
    mach, fnd = result["machine"], result["foundation"]
    dirty = " with uncommitted changes" if result["dirty"] else ""
    return [
        "# lora-share benchmark",
        "",
        f"`{result['command']}`, {result['date']}, commit {result['commit']}{dirty}; {result['total_s'] / 60:.1f} min.",
        f"Machine: {mach['cpu']}, {mach['cpus']} cores, {mach['memory_gib']:.0f} GiB RAM; {mach['platform']}; "
        f"Python {mach['python']}, torch {mach['torch']}, executorch {mach['executorch']}.",
        f"Foundation: {fnd['parameters'] / 1e6:.1f} M parameters, foundation.ptd {_mb(fnd['ptd_bytes'])}. "
        f"Adapters: rank {result['recipe']['rank']} on {', '.join(result['recipe']['target_modules'])}, "
        f"a different seed each, {_mb(result['adapter_pte_bytes'])} per .pte. "
        "Every ratio (×) compares two numbers taken in this run: the alternative over lora-share.",
    ]


def _disk_and_memory(result: dict) -> list[str]:
    out = [
        "",
        "## Disk and memory",
        "",
        headline_table(result),
        "",
        "Stand-alone: the same model exported with every weight inside the .pte (what shipping one "
        "self-contained or merged model per adapter costs), one runner process each, all running at once; "
        "PSS summed over them. Stock: one process, one `executorch::extension::Module(pte, ptd)` per adapter, "
        "XNNPACK weight cache off (`--stock`). PSS and RSS are read from /proc after each process loaded and "
        "answered one request per adapter.",
        "",
        _per_adapter_note(result),
        "",
        "| adapters | RSS: lora-share | RSS: N stand-alone processes | RSS: stock |",
        "|---:|---:|---:|---:|",
    ]
    for m in result["memory"]:
        out.append(
            f"| {m['adapters']} | {_mib_kb(m['shared']['rss_kb'])} | {_mib_kb(m['standalone']['rss_kb'])} | "
            f"{_mib_kb(m['stock']['rss_kb'])} |"
        )
    return out


def _load_time(result: dict) -> list[str]:
    ld = result["load"]
    out = [
        "",
        f"## Load time ({result['counts'][-1]} adapters, median of {ld['repeats']} starts)",
        "",
        "| loading | first adapter | each further adapter (median) | all, with file checks |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("shared", "lora-share, packing in memory (`--no-packed-cache`)"),
        ("packed_cold", "lora-share, first start (packs, writes the packed-weights file)"),
        ("packed_warm", "lora-share, later starts (map the packed-weights file)"),
        ("stock", "stock `Module` per adapter"),
        ("standalone", "one stand-alone program"),
    ):
        row = ld[key]
        out.append(f"| {label} | {_ms(row['first_ms'])} | {_ms(row['further_median_ms'])} | {_ms(row['session_ms'])} |")
    return out


def _speed(result: dict) -> list[str]:
    sp = result["speed"]
    out = [
        "",
        f"## Speed (prompt {sp['prompt_tokens']} tokens, {sp['new_tokens']} new tokens, median of "
        f"{sp['repeats']} requests, one `--serve` process)",
        "",
        "| program | prefill tokens/s | decode tokens/s | decode vs foundation |",
        "|---|---:|---:|---:|",
    ]
    base = sp["programs"]["base"]
    for name, row in sp["programs"].items():
        label = "foundation without LoRA (same foundation.ptd)" if name == "base" else f"adapter {name}"
        out.append(
            f"| {label} | {row['prefill_tokens_per_s']:.0f} | {row['decode_tokens_per_s']:.0f} | "
            f"{_x(row['decode_tokens_per_s'] / base['decode_tokens_per_s'])} |"
        )
    med = sp["adapters_median"]
    out.append(
        f"| the {result['counts'][-1]} adapters, median | {med['prefill_tokens_per_s']:.0f} | "
        f"{med['decode_tokens_per_s']:.0f} | {_x(med['decode_tokens_per_s'] / base['decode_tokens_per_s'])} |"
    )
    alone = sp["standalone"]
    out.append(
        f"| stand-alone {alone['name']} (own process) | {alone['prefill_tokens_per_s']:.0f} | "
        f"{alone['decode_tokens_per_s']:.0f} | {_x(alone['decode_tokens_per_s'] / base['decode_tokens_per_s'])} |"
    )
    return out


def _adapter_switch(result: dict) -> list[str]:
    sw, n = result["switch"], result["counts"][-1]
    noise = switch_noise_ms(sw)
    return [
        "",
        f"## Adapter switch (`--serve` with {n} adapters, prompt {sw['prompt_tokens']} tokens, 1 new token)",
        "",
        "| requests | latency (median) | of which compute | switch cost |",
        "|---|---:|---:|---:|",
        f"| all to one adapter | {sw['same']['request_ms']:.2f} ms | {sw['same']['compute_ms']:.2f} ms | – |",
        f"| alternating between two adapters | {sw['alternating']['request_ms']:.2f} ms | "
        f"{sw['alternating']['compute_ms']:.2f} ms | {_signed_ms(sw['alternating']['switch_overhead_ms'], noise)} |",
        f"| round-robin over {n} adapters | {sw['round_robin']['request_ms']:.2f} ms | "
        f"{sw['round_robin']['compute_ms']:.2f} ms | {_signed_ms(sw['round_robin']['switch_overhead_ms'], noise)} |",
        "",
        f"Switch cost: the latency over that of requests that all go to one adapter. On this machine those "
        f"vary by {sw['same']['iqr_ms']:.1f} ms (interquartile range), so differences within ±{noise:.1f} ms "
        f"are noise (two standard errors). Every adapter stays loaded, so a switch only runs another method. "
        f"With stand-alone programs, serving another adapter means another process (its memory above) or "
        f"loading its program: {_ms(result['load']['standalone']['session_ms'])}.",
    ]


def _build_time(result: dict) -> list[str]:
    out = [
        "",
        "## Build time (from scratch, in one process, after a warm-up export)",
        "",
        "| adapters | seconds | programs exported | adapters written | × 1 adapter |",
        "|---:|---:|---:|---:|---:|",
    ]
    one = result["build"][0]["seconds"]
    for b in result["build"]:
        out.append(
            f"| {b['adapters']} | {b['seconds']:.1f} | {b['exported']} | {b['written']} | {_x(b['seconds'] / one)} |"
        )
    return out


def markdown(result: dict) -> str:
    """The whole report: one section per measurement, then the checks."""
    matched = result["checks"]["standalone_tokens_match"]
    checks = [
        "",
        f"Checks: stand-alone and lora-share programs generate the same tokens: {'yes' if matched else 'NO'}.",
        "",
    ]
    sections = (_intro, _disk_and_memory, _load_time, _speed, _adapter_switch, _build_time)
    return "\n".join([line for section in sections for line in section(result)] + checks)


def plots(result: dict, out_dir: Path) -> list[Path]:
    """memory.png and disk.png against N; [] (and a note on stderr) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return []
    counts, n = result["counts"], result["counts"][-1]
    mem, disk = result["memory"], result["disk"]
    shared = [m["shared"]["pss_kb"] / 1024 for m in mem]
    alone = [m["standalone"]["pss_kb"] / 1024 for m in mem]
    stock = [m["stock"]["pss_kb"] / 1024 for m in mem]
    series = [
        (
            f"N stand-alone processes: {alone[-1]:.0f} MiB at N={n} ({alone[-1] / shared[-1]:.1f}× lora-share)",
            alone,
            "tab:red",
            "s",
        ),
        (
            f"stock, 1 process, 1 Module per adapter: {stock[-1]:.0f} MiB ({stock[-1] / shared[-1]:.1f}×)",
            stock,
            "tab:orange",
            "^",
        ),
        (f"lora-share, 1 process: {shared[-1]:.0f} MiB at N={n}", shared, "tab:blue", "o"),
    ]
    foot = _footer(result)
    written = [out_dir / "bench_memory.png", out_dir / "bench_disk.png"]
    _line_plot(
        plt,
        counts,
        series,
        ylabel="memory (PSS, MiB)",
        title="Memory to serve N adapters",
        path=written[0],
        footer=foot,
    )
    ours = [d["shared_bytes"] / 1e6 for d in disk]
    theirs = [d["standalone_bytes"] / 1e6 for d in disk]
    series = [
        (
            f"N stand-alone .pte: {theirs[-1]:.0f} MB at N={n} ({theirs[-1] / ours[-1]:.1f}× lora-share)",
            theirs,
            "tab:red",
            "s",
        ),
        (f"lora-share, foundation.ptd + N .pte: {ours[-1]:.0f} MB at N={n}", ours, "tab:blue", "o"),
    ]
    _line_plot(plt, counts, series, ylabel="on disk (MB)", title="Disk for N adapters", path=written[1], footer=foot)
    return written


def _footer(result: dict) -> str:
    m = result["machine"]
    return (
        f"lora-share bench, commit {result['commit']}{'+' if result['dirty'] else ''}, {result['date'][:10]}; "
        f"{m['cpu']}, {m['cpus']} cores"
    )


def _line_plot(plt, counts, series, ylabel, title, path: Path, footer: str) -> None:
    """Lines against N; the lowest series (lora-share) is labelled at every point, the others in the legend."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for i, (label, ys, color, marker) in enumerate(series):
        ax.plot(counts, ys, marker=marker, color=color, label=label, linewidth=2)
        if i == len(series) - 1:
            for x, y in zip(counts, ys):
                ax.annotate(
                    f"{y:.0f}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(0, -15),
                    ha="center",
                    fontsize=8,
                    color=color,
                )
    ax.set_xticks(counts)
    ax.set_xlabel("adapters (N)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0, top=max(max(ys) for _, ys, _, _ in series) * 1.15)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8.5)
    fig.text(0.99, 0.01, footer, ha="right", va="bottom", fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)


def write_results(result: dict, out_dir: Path) -> list[Path]:
    """bench.json, bench.md and the plots in ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("bench.json", json.dumps(result, indent=2) + "\n"), ("bench.md", markdown(result))):
        path = out_dir / name
        tmp = path.with_name(name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        written.append(path)
    return written + plots(result, out_dir)
