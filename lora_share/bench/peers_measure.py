"""bench-peers' measurements: requests alternating between lora-share's runner and llama-server on the
same model and adapter (speed, first token, load, PSS, KV bytes), and the bare stream of the F32
weights (benchmarks/stream_bound.cpp) that fp32 decode is read against."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
from pathlib import Path

from ..manifest import Manifest
from . import processes
from .common import prompt_ids
from .llama_cpp import LlamaServer, compiler_flags, cpu_flags, parse_kv_bytes, sh
from .memory import BenchError
from .scale_shapes import kv_cache_bytes

CONTEXT = 2048

PROMPT_TOKENS = 1000

SHORT_PROMPT = 8

NEW_TOKENS = 32

# lora-share's KV cache in float16, as llama.cpp keeps its own by default (its f16 K and V).
KV_CACHE = "float16"

# Tokens timed per run of the bare stream (benchmarks/stream_bound.cpp), once before each fp32 pair.
STREAM_TOKENS = 30


def _median(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 2)


# The speed figures: (key, request kind, field of each answer).
SPEEDS = [
    ("decode_10_tokens_per_s", "short", "decode_tokens_per_s"),
    ("decode_1000_tokens_per_s", "long", "decode_tokens_per_s"),
    ("prefill_tokens_per_s", "long", "prefill_tokens_per_s"),
]

SPEED_KEYS = {key for key, _, _ in SPEEDS}


def summarize(samples: dict[str, list[dict]]) -> dict:
    """Medians of the speed samples: decode at ~10 (short prompt), prefill and decode at ~1,000 (long);
    under "samples", every request's figure in the order they ran (so the spread can be read)."""
    figures = {key: _median(samples[kind], field) for key, kind, field in SPEEDS}
    return {
        **figures,
        "first_token_ms": _median(samples["short"], "first_token_ms"),
        "samples": {key: [round(r[field], 2) for r in samples[kind]] for key, kind, field in SPEEDS},
    }


def pair_ratios(ours: dict, theirs: dict, key: str) -> list[float]:
    """lora-share / llama.cpp for each alternating pair of requests (the i-th of each side ran one after
    the other), or [] when either side kept no samples."""
    a, b = ours.get("samples", {}).get(key, []), theirs.get("samples", {}).get(key, [])
    return [x / y for x, y in zip(a, b) if y] if len(a) == len(b) else []


def runner_answer(answer: dict) -> dict:
    """A runner --serve answer in the fields llama-server's are read into."""
    decode_ms = answer["decode_ms"]
    steps = max(len(answer["tokens"]) - 1, 1)
    return {
        "prefill_tokens_per_s": answer["prefill_tokens_per_s"],
        "decode_tokens_per_s": answer["decode_tokens_per_s"],
        "prefill_ms": answer["prefill_ms"],
        "first_token_ms": answer["prefill_ms"] + decode_ms / steps,
    }


def kv_bytes_lora_share(manifest: Manifest) -> int:
    """lora-share's KV cache for one program, from the build's manifest."""
    return kv_cache_bytes(manifest.args)


def measure(
    runner: Path,
    builds: dict[str, dict],
    tools: dict,
    ggufs: dict,
    work: Path,
    repeats: int,
    stream: Path | None = None,
    log=print,
) -> dict:
    """Every figure, with requests alternating between lora-share's and llama.cpp's servers; with
    ``stream`` (stream_bound's binary), the bare stream run before each fp32 / F32 pair of requests."""
    vocab = 49152
    short, long = prompt_ids(SHORT_PROMPT, vocab), prompt_ids(PROMPT_TOKENS, vocab)
    rows = {}
    pairs = [("fp32", "f32"), ("8da4w", "q4_0")]
    extra = [("8da4w", "q4_1"), ("8da4w", "q8_0")]
    for ours, theirs in pairs + extra:
        b = builds[ours]
        log(f"measuring lora-share {ours} vs llama.cpp {theirs} ...")
        with (
            processes.Server(runner, b["ptes"][:1], b["ptd"], max_new_tokens=NEW_TOKENS) as s1,
            LlamaServer(
                tools["llama-server"],
                ggufs["models"][theirs],
                ggufs["loras"][:1],
                18423,
                work / f"server-{theirs}.log",
                context=CONTEXT,
            ) as l1,
        ):
            mem_ours, mem_theirs = s1.memory(), l1.memory()
            name = s1.names[0]
            s1.ask(name, short), l1.ask(0, short, NEW_TOKENS)
            samples = {"ours": {"short": [], "long": []}, "theirs": {"short": [], "long": []}}
            streamed = []
            for _ in range(repeats):
                if stream is not None and theirs == "f32":
                    streamed.append(bare_stream_ms(stream))
                for kind, prompt in (("short", short), ("long", long)):
                    samples["ours"][kind].append(runner_answer(s1.ask(name, prompt)[0]))
                    samples["theirs"][kind].append(l1.ask(0, prompt, NEW_TOKENS))
            kv_theirs = parse_kv_bytes(l1.log.read_text())
            load_theirs = l1.load_ms
        load_ours = processes.start_times(runner, b["ptd"], b["ptes"][:1], [], 3)
        # llama.cpp's from the second start on too (the model's file in the page cache, as ours is):
        # the median of three more llama-servers, each started and closed alone.
        warm_theirs = []
        for _ in range(3):
            with LlamaServer(
                tools["llama-server"],
                ggufs["models"][theirs],
                ggufs["loras"][:1],
                18423,
                work / f"server-{theirs}-start.log",
                context=CONTEXT,
            ) as again:
                warm_theirs.append(again.load_ms)
        row = {
            "lora_share": {
                "build": ours,
                **summarize(samples["ours"]),
                "load_first_ms": load_ours["first_ms"],
                "load_ms": load_ours["second_ms"],
                "pss_after_load_kb": mem_ours["pss_kb"],
                "kv_bytes": kv_bytes_lora_share(b["manifest"]),
            },
            "llama_cpp": {
                "model": theirs,
                **summarize(samples["theirs"]),
                "load_first_ms": round(load_theirs, 1),
                "load_ms": round(statistics.median(warm_theirs), 1),
                "pss_after_load_kb": mem_theirs["pss_kb"],
                "kv_bytes": kv_theirs,
            },
        }
        if streamed:
            row["bare_stream"] = {"median_ms": round(statistics.median(streamed), 3), "samples_ms": streamed}
        if (ours, theirs) in pairs:
            row["lora_share"]["pss_per_extra_adapter_kb"] = extra_adapter_ours(runner, b, short)
            row["llama_cpp"]["pss_per_extra_adapter_kb"] = extra_adapter_theirs(tools, ggufs, theirs, short, work)
        rows[f"{ours} vs {theirs}"] = row
    return rows


def extra_adapter_ours(runner: Path, b: dict, prompt: list[int]) -> float:
    """(PSS with N adapters served - with 1) / (N - 1): two runner --serve processes, alive at once.

    Measured side by side, not one after the other: PSS splits a shared library's pages among every
    process mapping it, so a process measured alone gains or loses tens of kB whenever some other
    process (a test's server, a benchmark's) starts or ends, more than a small adapter costs. Side by
    side, both see the same sharers, the pages they share with each other (libraries, foundation, the
    first adapter) split evenly, and the difference is what the N - 1 further adapters cost.
    """
    with (
        processes.Server(runner, b["ptes"][:1], b["ptd"]) as one,
        processes.Server(runner, b["ptes"], b["ptd"]) as all_,
    ):
        for server in (one, all_):
            server.warm(prompt)
        pss = [one.memory()["pss_kb"], all_.memory()["pss_kb"]]
    return round((pss[1] - pss[0]) / (len(b["ptes"]) - 1), 1)


def extra_adapter_theirs(tools: dict, ggufs: dict, model: str, prompt: list[int], work: Path) -> float:
    """The same for llama-server, two processes alive at once: N adapters via --lora, each request
    naming its adapter, against one."""
    loras, binary, gguf = ggufs["loras"], tools["llama-server"], ggufs["models"][model]
    with (
        LlamaServer(binary, gguf, loras[:1], 18424, work / "server-extra-1.log", context=CONTEXT) as one,
        LlamaServer(binary, gguf, loras, 18425, work / "server-extra-n.log", context=CONTEXT) as all_,
    ):
        for server in (one, all_):
            for i in range(server.n_loras):
                server.ask(i, prompt, 2)
        pss = [one.memory()["pss_kb"], all_.memory()["pss_kb"]]
    return round((pss[1] - pss[0]) / (len(loras) - 1), 1)


def stream_bound(work: Path) -> Path:
    """``benchmarks/stream_bound.cpp`` compiled for this CPU (``-march=native``, as llama.cpp is), kept in
    ``work`` under the sha256 of its source and the CPU's flags: the bare stream of the F32 weights."""
    src = Path(__file__).resolve().parents[2] / "benchmarks" / "stream_bound.cpp"
    if not src.is_file():
        raise BenchError(f"{src}: missing; bench-peers runs from a lora-share checkout")
    cpu = cpu_flags()
    binary = work / f"stream_bound-{hashlib.sha256(src.read_bytes() + cpu.encode()).hexdigest()[:12]}"
    if not binary.is_file():
        tmp = binary.with_name(binary.name + ".tmp")
        sh(
            [os.environ.get("CXX", "c++"), "-O3", "-march=native", *compiler_flags(cpu), "-pthread", src, "-o", tmp],
            work / "stream_bound.log",
        )
        os.replace(tmp, binary)
    return binary


def bare_stream_ms(binary: Path, tokens: int = STREAM_TOKENS) -> float:
    """One run of the bare stream: the median milliseconds of ``tokens`` tokens, each every F32 weight
    of SmolLM2-135M read once on 2 threads in XNNPACK's layout, a barrier after every linear, nothing
    else (no attention, norms, LoRA or sampling): what fp32 decode cannot beat in the same minute."""
    proc = subprocess.run([str(binary), "--json", "--tokens", str(tokens)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"{binary} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)["median_ms"]
