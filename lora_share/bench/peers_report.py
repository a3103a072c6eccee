"""bench-peers' verdicts and page: the issues' targets checked on the measured rows, and the Markdown
written beside the JSON (one table per pair, the bare stream, perplexity, the checks)."""

from __future__ import annotations

import statistics

from .common import header_line
from .llama_cpp import LLAMA_CPP_PYTHON
from .peers_measure import NEW_TOKENS, PROMPT_TOKENS, SHORT_PROMPT, SPEED_KEYS, STREAM_TOKENS, pair_ratios

TARGET_SPEED = 1.1

# Issue 49: from the second start on, lora-share's load (mapping its packed-weights file) against llama.cpp's.
LOAD_RATIO = 0.25

MAX_PPL_RATIO = 1.03

CHECKS = [
    ("decode_10_tokens_per_s", "decode tokens/s at ~10", "ratio", TARGET_SPEED),
    ("decode_1000_tokens_per_s", "decode tokens/s at ~1,000", "ratio", TARGET_SPEED),
    ("prefill_tokens_per_s", f"prefill tokens/s of {PROMPT_TOKENS}", "ratio", TARGET_SPEED),
    ("load_ms", "load (second start)", "at_most", LOAD_RATIO),
    ("kv_bytes", "KV bytes at context 2048", "le", None),
    ("pss_per_extra_adapter_kb", "PSS per extra adapter (kB)", "le", None),
]

ROWS = [
    ("decode_10_tokens_per_s", "decode tokens/s, position ~10"),
    ("decode_1000_tokens_per_s", "decode tokens/s, position ~1,000"),
    ("prefill_tokens_per_s", f"prefill tokens/s, {PROMPT_TOKENS} tokens"),
    ("first_token_ms", f"time to first token (ms), {SHORT_PROMPT}-token prompt"),
    ("load_first_ms", "load time (ms), first start (lora-share: packs, writes the packed-weights file)"),
    (
        "load_ms",
        "load time (ms), from the second start on (lora-share: maps the packed-weights file; "
        "llama.cpp: its median of three more starts)",
    ),
    ("pss_after_load_kb", "PSS after load (kB)"),
    ("pss_per_extra_adapter_kb", "PSS per extra adapter (kB)"),
    ("kv_bytes", "KV bytes, context 2048"),
]


def checks(rows: dict) -> list[dict]:
    """The issues' targets, per pair: speed ratios >= 1.1, load from the second start <= 0.25 x llama.cpp's,
    KV bytes and PSS per extra adapter <= llama.cpp's."""
    out = []
    for pair, row in rows.items():
        ours, theirs = row["lora_share"], row["llama_cpp"]
        for key, what, kind, bound in CHECKS:
            if ours.get(key) is None or theirs.get(key) is None:
                continue
            if kind == "ratio":
                value = ours[key] / theirs[key]
                out.append(
                    {
                        "pair": pair,
                        "check": f"{what}: lora-share / llama.cpp",
                        "value": round(value, 3),
                        "target": f">= {bound}",
                        "pass": value >= bound,
                    }
                )
            elif kind == "at_most":
                value = ours[key] / theirs[key]
                out.append(
                    {
                        "pair": pair,
                        "check": f"{what}: lora-share / llama.cpp",
                        "value": round(value, 3),
                        "target": f"<= {bound}",
                        "pass": value <= bound,
                    }
                )
            else:
                out.append(
                    {
                        "pair": pair,
                        "check": f"{what}: lora-share <= llama.cpp",
                        "value": f"{ours[key]} vs {theirs[key]}",
                        "target": "<=",
                        "pass": ours[key] <= theirs[key],
                    }
                )
    return out


def report(result: dict) -> str:
    """The markdown: one table per pair (lora-share, llama.cpp, ratio), then the checks."""
    lines = [
        "# bench-peers: lora-share vs llama.cpp, SmolLM2-135M-Instruct, one rank-8 q/v adapter applied",
        "",
        f"{header_line(result)} lora-share's KV cache {result.get('kv_cache', 'float32')}. "
        f"llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON}'s sdist; "
        f"2 threads each; median of {result['repeats']} alternating requests; {NEW_TOKENS} new tokens per request."
        f"{'' if result.get('complete', True) else ' INCOMPLETE: perplexity still running.'}",
        "",
    ]
    for row in result["rows"].values():
        ours, theirs = row["lora_share"], row["llama_cpp"]
        lines += [
            f"## lora-share {ours['build']} vs llama.cpp {theirs['model']}",
            "",
            "| | lora-share | llama.cpp | ratio |",
            "|---|---:|---:|---:|",
        ]
        for key, what in ROWS:
            a, b = ours.get(key), theirs.get(key)
            if a is None and b is None:
                continue
            ratio = f"{a / b:.2f}" if a is not None and b else "n/a"
            lines.append(f"| {what} | {a} | {b} | {ratio} |")
        spread = [(what, pair_ratios(ours, theirs, key)) for key, what in ROWS if key in SPEED_KEYS]
        if all(r for _, r in spread):
            lines += [
                "",
                "Ratio of each alternating pair of requests, lowest-highest: "
                + "; ".join(f"{what} {min(r):.2f}-{max(r):.2f}" for what, r in spread)
                + ".",
            ]
        lines.append("")
    for row in result["rows"].values():
        if row.get("bare_stream"):
            lines += stream_report(row)
    ppl = result.get("perplexity")
    if ppl:
        ours, theirs = ppl["lora_share"], ppl["llama_cpp"]
        lines += [
            f"## Perplexity, foundation alone, {ppl['tokens']} tokens of held-out text, context {ppl['context']}",
            "",
            "lora-share: `lora-share eval`, from `make bench-quality` (every token of each window); "
            "llama.cpp: `llama-perplexity` on the same text (the second half of each window). Each side's "
            "ratio is to its own float32.",
            "",
            "| | perplexity | / own float32 |",
            "|---|---:|---:|",
        ]
        for name, value in ours.items():
            lines.append(f"| lora-share {name} | {value:.3f} | {value / ours['fp32']:.4f} |")
        for name, value in theirs.items():
            lines.append(f"| llama.cpp {name.upper()} | {value:.3f} | {value / theirs['f32']:.4f} |")
        lines.append("")
    lines += ["## Checks", ""]
    for c in result["checks"]:
        lines.append(
            f"- {'PASS' if c['pass'] else 'FAIL'} [{c['pair']}] {c['check']}: {c['value']} (target {c['target']})"
        )
    return "\n".join(lines) + "\n"


def stream_shares(row: dict, side: str) -> list[float]:
    """Each fp32 decode at ~10 as a share of the bare stream run just before it: the stream's
    milliseconds per token over the request's (1.0 = as fast as reading the weights and nothing else)."""
    ms = row["bare_stream"]["samples_ms"]
    rates = row[side].get("samples", {}).get("decode_10_tokens_per_s", [])
    return [m * r / 1000 for m, r in zip(ms, rates)] if len(ms) == len(rates) else []


def stream_report(row: dict) -> list[str]:
    """The fp32 section: the bare stream's time and each side's decode at ~10 as a share of it."""
    stream = row["bare_stream"]
    ms = stream["median_ms"]
    lines = [
        "## fp32 decode and the bare stream",
        "",
        f"`benchmarks/stream_bound.cpp`, run before each pair of fp32 requests ({STREAM_TOKENS} tokens a run): "
        "every F32 weight read once per token on 2 threads in XNNPACK's packed layout, a barrier after each "
        "linear, nothing else (no attention, norms, LoRA or sampling). Median "
        f"{ms:.2f} ms a token ({1000 / ms:.1f} tokens/s; runs {min(stream['samples_ms']):.2f}-"
        f"{max(stream['samples_ms']):.2f} ms).",
    ]
    shares = {side: stream_shares(row, side) for side in ("lora_share", "llama_cpp")}
    if all(shares.values()):
        ours, theirs = (statistics.median(shares[side]) for side in ("lora_share", "llama_cpp"))
        lines[-1] += (
            f" Decode at ~10 as a share of the stream run just before it, median (range): lora-share "
            f"{ours:.0%} ({min(shares['lora_share']):.0%}-{max(shares['lora_share']):.0%}), llama.cpp "
            f"{theirs:.0%} ({min(shares['llama_cpp']):.0%}-{max(shares['llama_cpp']):.0%})."
        )
    return lines + [""]


def perplexity_checks(ppl: dict) -> list[dict]:
    """8da4w perplexity <= 1.03 x lora-share fp32, and no further from float32 than llama.cpp's Q4_0."""
    ours, theirs = ppl["lora_share"], ppl["llama_cpp"]
    q, q4_0 = ours["8da4w"] / ours["fp32"], theirs["q4_0"] / theirs["f32"]
    return [
        {
            "pair": "8da4w vs fp32",
            "check": "perplexity: lora-share 8da4w / lora-share fp32",
            "value": round(q, 4),
            "target": f"<= {MAX_PPL_RATIO}",
            "pass": q <= MAX_PPL_RATIO,
        },
        {
            "pair": "8da4w vs q4_0",
            "check": "perplexity / own float32: lora-share 8da4w <= llama.cpp Q4_0",
            "value": f"{q:.4f} vs {q4_0:.4f}",
            "target": "<=",
            "pass": q <= q4_0,
        },
    ]
