"""lora-share-server with many clients at once, against llama-server ``-np N`` with the same adapters (issue 47).

    make bench-serve                  # = lora-share bench-serve; writes benchmarks/results/serve-<date>.{json,md}
    lora-share bench-serve --quick    # a smoke run (fp32 only, 8 tokens, one repeat, 3 chat turns): minutes

The model is the real SmolLM2-135M-Instruct deployment of ``make demo`` (configs/smollm2.yaml: its four
trained adapters, a 512-token context), fp32 as the demo builds it and 8da4w (the same config with
bench-peers' 8da4w settings, built into ``--workdir``). llama.cpp is bench-peers' build (``--workdir``,
shared with it: built once), its F32 and Q4_0 GGUFs of the same model and the same four adapters converted
with convert_lora_to_gguf.py, every adapter loaded at scale 0 and switched on per request (``lora``).

Every request is the same on both sides: a chat message rendered with the build's chat template into
token ids (each request tagged with its own number at the start of its message, so no request continues
another's cached prompt beyond the shared system prompt), streamed from ``/v1/completions``, greedy, a
fixed ``max_tokens`` with EOS ignored. Clients are threads started together; each token's arrival is
timed. Measured, for each precision, repeated with the two servers alternating:

- 1, 2, 4 and 8 concurrent clients each on its own adapter (8 clients on 4 adapters: two per adapter),
  and 4 clients on one adapter: aggregate decode tokens/s, time to first token and the gap between
  tokens (p50, p95);
- the same texts: each scenario of several clients once more at once, then each of its requests alone, all
  with ``cache_prompt: false`` (llama-server's field: the whole prompt fed, no KV slot continued), the
  texts compared. With the prompt cache, the same request can answer differently from one ask to the
  next: a reused prefix's KV was computed in other chunks, and a quantized foundation amplifies those
  last-bit differences (llama.cpp documents the same for its cache_prompt); so the comparison that isolates
  batching turns it off. The timed answers are also asked again alone with the cache on, and that count
  reported beside it;
- an 8-turn chat (each turn's prompt the history so far plus a new message, EOS honoured): the first
  token's time at each turn;
- the server's PSS (/proc/PID/smaps_rollup) at ``--parallel N`` and at ``--parallel 1``, two servers
  alive at once after the same requests, against 3 x one slot's KV bytes (``/v1/stats``);
- structured output's cost (issue 59, ``lora_share.bench.constraints`` in process over the same build):
  schema compile first and cached, mask time per token, per-row decode speed with 2 of 4 rows constrained.

The checks are issue 47's and issue 59's "Done when" lines, printed as PASS/FAIL; the exit status is 1 if any fails.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from ..errors import UserError
from ..manifest import read_manifest
from . import constraints, http_streams, peers, processes
from .common import BenchFailed, at_least, header_line, results_header, typed_command, write_whole
from .llama_cpp import LLAMA_CPP_PYTHON, LlamaServer, llama_cpp, llama_ggufs, sh
from .memory import BenchError

QUESTIONS = [
    "Why is the sky blue?",
    "How do plants make food?",
    "What is a prime number?",
    "Why do we have seasons?",
    "How does a rainbow form?",
    "What causes tides?",
    "How do bees make honey?",
    "Why does ice float on water?",
]
CHAT = [
    "Hi! I want to learn to cook.",
    "What should I make first?",
    "What do I need to buy for that?",
    "How long does it take?",
    "Can I make it without an oven?",
    "What goes well with it as a side?",
    "How do I store the leftovers?",
    "Thanks! Any tip for next time?",
]
# Scenarios: name -> the adapter (index into the deployment's adapters) of each client.
SCENARIOS = {
    "1 client": [0],
    "2 clients, 2 adapters": [0, 1],
    "4 clients, 4 adapters": [0, 1, 2, 3],
    "8 clients, 4 adapters": [0, 1, 2, 3, 0, 1, 2, 3],
    "4 clients, 1 adapter": [0, 0, 0, 0],
}
ALONE, FOUR, EIGHT, SAME = "1 client", "4 clients, 4 adapters", "8 clients, 4 adapters", "4 clients, 1 adapter"
# The pairs measured: lora-share's build -> llama.cpp's GGUF (bench-peers' pairs).
PAIRS = {"fp32": "f32", "8da4w": "q4_0"}
# Issue 47's targets.
SPEEDUP = {"fp32": 2.5, "8da4w": 2.0}
SAME_ADAPTER_SHARE = 0.85
OVER_LLAMA = 2.0
GAP_OVER_ALONE = 4.0
TURN_8_OVER_1 = 2.0
PSS_SLACK = 1.05
FULL = {"max_tokens": 64, "repeats": 3, "turns": 8, "chat_tokens": 24, "precisions": ["fp32", "8da4w"]}
QUICK = {"max_tokens": 8, "repeats": 1, "turns": 3, "chat_tokens": 8, "precisions": ["fp32"]}
LLAMA_PORT = 18433


class LoraShareServer(processes.HttpServerProcess):
    """build/lora-share-server over one deployment folder on a free port, with ``extra`` flags (bench-spec's
    ``--no-speculation``); its stderr goes to ``log``."""

    def __init__(self, binary: Path, folder: Path, parallel: int, log: Path, extra: tuple[str, ...] = ()):
        self.log = log
        self._log = open(log, "w")
        cmd = [str(binary), "--dir", str(folder), "--port", "0", "--parallel", str(parallel), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if "listening on http://" in text:
                self.address = text.split("listening on http://", 1)[1].split()[0]
                return
            if self.proc.poll() is not None:
                self._log.close()
                raise BenchError(f"{' '.join(cmd)} exited ({self.proc.returncode}): {text.strip()}")
            time.sleep(0.05)
        self.close()
        raise BenchError(f"{' '.join(cmd)}: not listening after 300 s; see {log}")

    def body(
        self, adapter: str, index: int, ids: list[int], max_tokens: int, ignore_eos: bool, cache_prompt: bool = True
    ) -> dict:
        return {
            "model": adapter,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": ignore_eos,
            "cache_prompt": cache_prompt,
        }

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://{self.address}/v1/stats", timeout=60) as r:
            return json.loads(r.read())


class LlamaSide:
    """llama-server (bench-peers' LlamaServer) with every adapter at scale 0, the request's switched on."""

    def __init__(self, server: LlamaServer):
        self.server, self.address = server, server.url.split("://", 1)[1]

    def body(
        self, adapter: str, index: int, ids: list[int], max_tokens: int, ignore_eos: bool, cache_prompt: bool = True
    ) -> dict:
        lora = [{"id": i, "scale": 1.0 if i == index else 0.0} for i in range(self.server.n_loras)]
        return {
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": ignore_eos,
            "lora": lora,
            "cache_prompt": cache_prompt,
        }


def demo_builds(config: Path, work: Path, precisions: list[str], log=print) -> dict[str, dict]:
    """The demo deployment per precision: fp32 is the config's own output folder (``lora-share build``,
    which reuses it when nothing changed); 8da4w the same config with bench-peers' 8da4w settings, in
    ``work``. Each: its folder, manifest, adapter names and PEFT folders."""
    import yaml  # imported where used: `lora-share --help` runs with the bare wheel

    from ..config import load_config

    cfg = load_config(config)
    raw = yaml.safe_load(config.read_text())
    builds = {}
    for precision in precisions:
        if precision == "fp32":
            path, out = config, Path(cfg.output_dir)
        else:
            dest = work / f"serve-{precision}"
            dest.mkdir(parents=True, exist_ok=True)
            derived = {
                **raw,
                "output_dir": str(dest / "out"),
                "foundation": {
                    **raw["foundation"],
                    "checkpoint": str(cfg.foundation.checkpoint),
                    "quantize": peers.QUANTIZE,
                },
                "adapters": [{**a, "peft": str(c.peft)} for a, c in zip(raw["adapters"], cfg.adapters)],
            }
            path, out = dest / "config.yaml", dest / "out"
            path.write_text(yaml.safe_dump(derived, sort_keys=False))
        log(f"lora-share build {precision} ({path}) ...")
        sh([sys.executable, "-m", "lora_share.cli", "build", path], work / f"serve-build-{precision}.log")
        manifest = read_manifest(out)
        builds[precision] = {
            "dir": out,
            "manifest": manifest,
            "adapters": manifest.adapter_names,
            "pefts": [Path(c.peft) for c in cfg.adapters],
        }
    return builds


class Prompts:
    """Chat messages -> token ids with the build's tokenizer and chat template (the ids both servers get)."""

    def __init__(self, folder: Path):
        from ..tokenizer.chat_format import apply
        from ..tokenizer.files import bind_tokenizer

        self.bound = bind_tokenizer(folder / "foundation.ptd")
        self.format = read_manifest(folder).chat_format
        if self.format is None:
            raise BenchError(
                f"{folder}: its manifest has no chat format; bench-serve needs a build with a chat template"
            )
        self._apply = apply
        self.count = 0

    def ids(self, messages: list[tuple[str, str]]) -> list[int]:
        return self.bound.tokenizer.encode(self._apply(self.format, messages), add_special_tokens=False).ids

    def tagged(self, question: str) -> list[int]:
        """A new request's ids: the question with a number of its own at the start of the message."""
        self.count += 1
        return self.ids([("user", f"[{self.count}] {question}")])


def run_scenarios(
    sides: dict, builds_adapters: list[str], prompts: Prompts, settings: dict, log, questions: list[str] = QUESTIONS
) -> dict:
    """Every scenario ``settings['repeats']`` times, the sides alternating (which goes first swaps each
    repeat); then each concurrent request again alone on its side, the texts compared (``texts_cached``);
    then the texts without the prompt cache (``texts``, same_texts). Client c asks ``questions[c]`` (cycled)."""
    for server in sides.values():  # every adapter loaded (and packed weights written) before anything is timed
        for a, adapter in enumerate(builds_adapters):
            http_streams.stream(server.address, server.body(adapter, a, prompts.tagged(questions[0]), 1, True))
    figures = {side: {name: [] for name in SCENARIOS} for side in sides}
    asked = {side: [] for side in sides}  # (adapter index, ids, concurrent text)
    order = list(sides)
    for _ in range(settings["repeats"]):
        for name, clients in SCENARIOS.items():
            ids = [prompts.tagged(questions[c % len(questions)]) for c in range(len(clients))]
            for side in order:
                server = sides[side]
                bodies = [
                    server.body(builds_adapters[a], a, i, settings["max_tokens"], True) for a, i in zip(clients, ids)
                ]
                answers = http_streams.at_once(server.address, bodies)
                figures[side][name].append(http_streams.summary(answers))
                if len(clients) > 1:
                    asked[side] += [(a, i, ans.text) for a, i, ans in zip(clients, ids, answers)]
                log(f"  {side} {name}: {figures[side][name][-1]['aggregate_decode_tokens_per_s']} tokens/s")
        order.reverse()
    cached = {
        side: compare_alone(
            server,
            [
                (builds_adapters[a], server.body(builds_adapters[a], a, ids, settings["max_tokens"], True), text)
                for a, ids, text in asked[side]
            ],
        )
        for side, server in sides.items()
    }
    return {
        "scenarios": {side: {name: median_figures(rows) for name, rows in f.items()} for side, f in figures.items()},
        "samples": figures,
        "texts_cached": cached,
        "texts": {
            side: same_texts(server, builds_adapters, prompts, settings, questions) for side, server in sides.items()
        },
    }


def same_texts(server, builds_adapters: list[str], prompts: Prompts, settings: dict, questions: list[str]) -> dict:
    """Each scenario of several clients once at once, then each of its requests alone, every request with
    ``cache_prompt: false``: how many texts were compared and the ones that differ."""
    asked = []
    for clients in SCENARIOS.values():
        if len(clients) < 2:
            continue
        ids = [prompts.tagged(questions[c % len(questions)]) for c in range(len(clients))]
        bodies = [
            server.body(builds_adapters[a], a, i, settings["max_tokens"], True, cache_prompt=False)
            for a, i in zip(clients, ids)
        ]
        answers = http_streams.at_once(server.address, bodies)
        asked += [(builds_adapters[a], body, ans.text) for a, body, ans in zip(clients, bodies, answers)]
    return compare_alone(server, asked)


def compare_alone(server, asked: list[tuple[str, dict, str]]) -> dict:
    """Each (adapter, request body, concurrent text) asked again alone: how many texts were compared
    and the ones that differ."""
    differ = []
    for adapter, body, text in asked:
        alone = http_streams.stream(server.address, body).text
        if alone != text:
            differ.append({"adapter": adapter, "concurrent": text, "alone": alone})
    return {"compared": len(asked), "differ": differ}


def median_figures(rows: list[dict]) -> dict:
    """The median of each figure over the repeats, and every repeat's aggregate (so the spread can be read)."""
    out = {key: round(statistics.median(r[key] for r in rows), 2) for key in rows[0]}
    out["aggregate_samples"] = [r["aggregate_decode_tokens_per_s"] for r in rows]
    return out


def run_chat(sides: dict, adapter: str, prompts: Prompts, settings: dict, log, messages: list[str] = CHAT) -> dict:
    """An ``turns``-turn chat on one adapter per side and repeat: each turn's prompt is the history (that
    side's own answers) plus a new message; the first token's time per turn, median over repeats."""
    times = {side: [[] for _ in range(settings["turns"])] for side in sides}
    order = list(sides)
    for _ in range(settings["repeats"]):
        prompts.count += 1
        opening = f"[{prompts.count}] {messages[0]}"
        for side in order:
            server, history = sides[side], []
            for turn in range(settings["turns"]):
                history.append(("user", opening if turn == 0 else messages[turn % len(messages)]))
                answer = http_streams.stream(
                    server.address, server.body(adapter, 0, prompts.ids(history), settings["chat_tokens"], False)
                )
                history.append(("assistant", answer.text))
                times[side][turn].append(answer.first_token_ms)
            log(
                f"  {side} chat: first token {times[side][0][-1]:.0f} ms at turn 1, "
                f"{times[side][-1][-1]:.0f} ms at turn {settings['turns']}"
            )
        order.reverse()
    return {side: [round(statistics.median(t), 1) for t in per_turn] for side, per_turn in times.items()}


def measure_memory(
    binary: Path,
    folder: Path,
    parallel: int,
    adapters: list[str],
    prompts: Prompts,
    max_tokens: int,
    work: Path,
    questions: list[str] = QUESTIONS,
) -> dict:
    """PSS of two servers alive at once, at ``--parallel N`` and at 1, after the same four requests on four
    adapters (all slots of the first used), and one slot's KV bytes from the first's /v1/stats."""
    ids = [prompts.tagged(questions[c % len(questions)]) for c in range(len(SCENARIOS[FOUR]))]
    with (
        LoraShareServer(binary, folder, parallel, work / "serve-pss-n.log") as many,
        LoraShareServer(binary, folder, 1, work / "serve-pss-1.log") as one,
    ):
        for server in (many, one):
            http_streams.at_once(
                server.address, [server.body(adapters[a], a, i, max_tokens, True) for a, i in zip(SCENARIOS[FOUR], ids)]
            )
        pss = {"parallel_n_kb": many.memory()["pss_kb"], "parallel_1_kb": one.memory()["pss_kb"]}
        stats = many.stats()
    return {"parallel": parallel, **pss, "slot_bytes": stats.get("slot_bytes")}


def checks(precision: str, result: dict, llama: bool) -> list[dict]:
    """Issue 47's "Done when" lines for one precision."""
    ours = result["scenarios"]["lora_share"]
    agg = {name: ours[name]["aggregate_decode_tokens_per_s"] for name in SCENARIOS}
    out = []

    def check(what: str, value, target: str, ok: bool) -> None:
        out.append({"precision": precision, "check": what, "value": value, "target": target, "pass": bool(ok)})

    for what, value, target, ok in constraints.checks(result["constraints"]) if "constraints" in result else ():
        check(what, value, target, ok)

    speedup = agg[FOUR] / agg[ALONE] if agg[ALONE] else 0.0
    check(
        "4 clients on 4 adapters: aggregate decode / 1 client alone",
        round(speedup, 3),
        f">= {SPEEDUP[precision]}",
        speedup >= SPEEDUP[precision],
    )
    share = agg[FOUR] / agg[SAME] if agg[SAME] else 0.0
    check(
        "4 clients on 4 adapters / 4 clients on 1 adapter (aggregate decode)",
        round(share, 3),
        f">= {SAME_ADAPTER_SHARE}",
        share >= SAME_ADAPTER_SHARE,
    )
    if llama:
        theirs = result["scenarios"]["llama_server"][FOUR]["aggregate_decode_tokens_per_s"]
        ratio = agg[FOUR] / theirs if theirs else 0.0
        check(
            "4 clients on 4 adapters: aggregate decode / llama-server -np 4",
            round(ratio, 3),
            f">= {OVER_LLAMA}",
            ratio >= OVER_LLAMA,
        )
    texts = result["texts"]["lora_share"]
    check(
        "every concurrent answer's text equals the same request alone (cache_prompt off)",
        f"{texts['compared'] - len(texts['differ'])} of {texts['compared']}",
        "all",
        texts["compared"] > 0 and not texts["differ"],
    )
    gap = ours[EIGHT]["gap_ms_p95"] / ours[ALONE]["gap_ms_p50"] if ours[ALONE]["gap_ms_p50"] else float("inf")
    check(
        "8 clients on 4 adapters: p95 gap between tokens / median gap of 1 client alone",
        round(gap, 3),
        f"<= {GAP_OVER_ALONE}",
        gap <= GAP_OVER_ALONE,
    )
    turns = result["chat"]["lora_share"]
    ratio = turns[-1] / turns[0] if turns[0] else float("inf")
    check(
        f"{len(turns)}-turn chat: first token at turn {len(turns)} / turn 1",
        round(ratio, 3),
        f"<= {TURN_8_OVER_1}",
        ratio <= TURN_8_OVER_1,
    )
    mem = result["memory"]
    if not mem.get("slot_bytes"):
        check(
            f"PSS at --parallel {mem['parallel']} <= (PSS at --parallel 1 + {mem['parallel'] - 1} slots) x {PSS_SLACK}",
            f"/v1/stats reports no slot's bytes ({mem.get('slot_bytes')})",
            "measured",
            False,
        )
    else:
        bound = (mem["parallel_1_kb"] + (mem["parallel"] - 1) * mem["slot_bytes"] / 1024) * PSS_SLACK
        check(
            f"PSS at --parallel {mem['parallel']} <= (PSS at --parallel 1 + {mem['parallel'] - 1} x one slot's "
            f"KV bytes) x {PSS_SLACK}",
            f"{mem['parallel_n_kb']} kB vs {bound:.0f} kB",
            "<=",
            mem["parallel_n_kb"] <= bound,
        )
    return out


def report(result: dict) -> str:
    """The markdown: per precision a table of the scenarios (both sides), the chat, memory; then the checks."""
    s = result["settings"]
    lines = [
        "# bench-serve: many clients at once, SmolLM2-135M-Instruct demo deployment"
        f"{' (QUICK smoke run)' if result['quick'] else ''}",
        "",
        f"{header_line(result)} lora-share-server --parallel {s['parallel']}; llama-server -np "
        f"{s['parallel']} (llama-cpp-python {LLAMA_CPP_PYTHON}'s llama.cpp, 2 threads, every adapter "
        "loaded, the request's switched on by `lora`). Each client: "
        f"streamed /v1/completions, greedy, {s['max_tokens']} tokens, EOS ignored; median of {s['repeats']} "
        "repeats, the servers alternating. Aggregate decode = every client's tokens after its first over the "
        "time from the first first token to the last token.",
        "",
    ]
    for precision, row in result["precisions"].items():
        sides = row["scenarios"]
        lines += [
            f"## {precision}" + (f" (llama.cpp {PAIRS[precision].upper()})" if "llama_server" in sides else ""),
            "",
            "| clients | server | aggregate decode tokens/s | first token p50 / p95 (ms) | "
            "gap between tokens p50 / p95 (ms) |",
            "|---|---|---:|---:|---:|",
        ]
        for name in SCENARIOS:
            for side, figures in sides.items():
                f = figures[name]
                lines.append(
                    f"| {name} | {side.replace('_', '-')} | {f['aggregate_decode_tokens_per_s']} | "
                    f"{f['first_token_ms_p50']} / {f['first_token_ms_p95']} | "
                    f"{f['gap_ms_p50']} / {f['gap_ms_p95']} |"
                )
        turns = row["chat"]
        lines += [
            "",
            f"{len(next(iter(turns.values())))}-turn chat on {row['chat_adapter']}, first token (ms) per "
            "turn: "
            + "; ".join(f"{side.replace('_', '-')} {', '.join(map(str, t))}" for side, t in turns.items())
            + ".",
        ]
        for side, t in row["texts"].items():
            c = row.get("texts_cached", {}).get(side)
            lines.append(
                f"Concurrent answers equal to the same request alone (cache_prompt off), "
                f"{side.replace('_', '-')}: {t['compared'] - len(t['differ'])} of {t['compared']}"
                + (
                    f"; the timed answers asked again alone with the prompt cache on (a prefix hit): "
                    f"{c['compared'] - len(c['differ'])} of {c['compared']}"
                    if c
                    else ""
                )
                + "."
            )
        m = row["memory"]
        lines.append(
            f"PSS after four requests on four adapters: --parallel {m['parallel']} {m['parallel_n_kb']} kB, "
            f"--parallel 1 {m['parallel_1_kb']} kB; one slot's KV {m['slot_bytes']} bytes."
        )
        st = row.get("server_stats") or {}
        if "batch_size_counts" in st:
            lines.append(
                f"lora-share-server /v1/stats after the run: batch sizes {st['batch_size_counts']}, "
                f"prefix hits {st.get('prefix_hits')} ({st.get('prefix_tokens')} tokens), "
                f"requests {st.get('requests')}."
            )
        if "constraints" in row:
            lines += ["", "Structured output (issue 59, lora_share.bench.constraints, in-process C API):"]
            lines += constraints.lines(row["constraints"])
        lines.append("")
    lines += ["## Checks (issues 47 and 59)", ""]
    lines += [
        f"- {'PASS' if c['pass'] else 'FAIL'} [{c['precision']}] {c['check']}: {c['value']} (target {c['target']})"
        for c in result["checks"]
    ]
    return "\n".join(lines) + "\n"


def run_serve(
    server_bin: Path,
    config: Path,
    gguf: Path,
    work: Path,
    settings: dict,
    llama: bool,
    *,
    command: str,
    save=lambda result: None,
    log=print,
) -> dict:
    """Builds, servers, measurements; the result dict, its header naming ``command`` (also handed to
    ``save`` after each precision)."""
    builds = demo_builds(config, work, settings["precisions"], log)
    ggufs = None
    if llama:
        log("llama.cpp and its GGUFs (bench-peers' build) ...")
        tools = llama_cpp(work / "llama.cpp")
        hf = peers.hf_folder(gguf, work / "hf")
        (work / "gguf").mkdir(exist_ok=True)
        ggufs = llama_ggufs(tools, hf, gguf, builds[settings["precisions"][0]]["pefts"], work / "gguf")
    result = {
        **results_header(command),
        "quick": settings["quick"],
        "settings": settings,
        "precisions": {},
        "checks": [],
    }
    context = None
    for precision in settings["precisions"]:
        b = builds[precision]
        prompts = Prompts(b["dir"])
        context = b["manifest"].max_seq_len
        log(f"measuring {precision} ...")
        with LoraShareServer(server_bin, b["dir"], settings["parallel"], work / f"serve-{precision}.log") as ours:
            sides = {"lora_share": ours}
            llama_server = None
            if llama:
                llama_server = LlamaServer(
                    tools["llama-server"],
                    ggufs["models"][PAIRS[precision]],
                    ggufs["loras"],
                    LLAMA_PORT,
                    work / f"serve-llama-{precision}.log",
                    parallel=settings["parallel"],
                    context=context,
                )
                sides["llama_server"] = LlamaSide(llama_server)
            try:
                row = run_scenarios(sides, b["adapters"], prompts, settings, log)
                row["chat_adapter"] = b["adapters"][0]
                row["chat"] = run_chat(sides, b["adapters"][0], prompts, settings, log)
                row["server_stats"] = ours.stats()
            finally:
                if llama_server is not None:
                    llama_server.close()
        log(f"memory {precision} ...")
        row["memory"] = measure_memory(
            server_bin, b["dir"], settings["parallel"], b["adapters"], prompts, settings["max_tokens"], work
        )
        log(f"structured output {precision} ...")
        row["constraints"] = constraints.measure(b["dir"], settings["max_tokens"], settings["repeats"])
        result["precisions"][precision] = row
        result["checks"] += checks(precision, row, llama)
        save(result)
    return result


def run_from_args(ns, command: str) -> int:
    server_bin = Path(ns.server).resolve()
    if not server_bin.is_file():
        raise UserError(f"--server {ns.server}: no such file; build it with `make runner`")
    config = Path(ns.config)
    if not config.is_file():
        raise UserError(f"--config {ns.config}: no such file (the demo deployment's config, configs/smollm2.yaml)")
    gguf = Path(ns.gguf).resolve()
    if ns.llama and not gguf.is_file():
        raise UserError(f"--gguf {ns.gguf}: no such file; fetch it with `make model` (SmolLM2-135M-Instruct Q4_1)")
    work = Path(ns.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    settings = {**(QUICK if ns.quick else FULL), "quick": ns.quick, "parallel": ns.parallel}
    if ns.repeats is not None:
        settings["repeats"] = ns.repeats
    out = Path(ns.out)
    stem = f"serve-{datetime.now(timezone.utc).date().isoformat()}" + ("-quick" if ns.quick else "")

    def save(result: dict) -> None:
        out.mkdir(parents=True, exist_ok=True)
        write_whole(out / f"{stem}.json", json.dumps(result, indent=2, default=str) + "\n")
        write_whole(out / f"{stem}.md", report(result))

    try:
        result = run_serve(
            server_bin,
            config,
            gguf,
            work,
            settings,
            ns.llama,
            command=command,
            save=save,
            log=lambda s: print(s, file=sys.stderr, flush=True),
        )
    except BenchError as e:
        raise BenchFailed(str(e)) from None
    print(report(result))
    return 0 if all(c["pass"] for c in result["checks"]) else 1


def add_demo_and_llama_args(p) -> None:
    """The flags bench-serve and bench-spec share: the demo deployment, llama.cpp's model and work folder."""
    p.add_argument(
        "--no-llama",
        dest="llama",
        action="store_false",
        help="lora-share's side only (no llama.cpp build, no comparison)",
    )
    p.add_argument(
        "--config",
        default="configs/smollm2.yaml",
        help="the demo deployment's config (default configs/smollm2.yaml; built when missing)",
    )
    p.add_argument(
        "--gguf",
        default="models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        help="the model llama.cpp runs (default: the demo's SmolLM2-135M-Instruct Q4_1 GGUF)",
    )
    p.add_argument(
        "--workdir",
        default="out/peers",
        help="llama.cpp's build and GGUFs (shared by bench-peers, bench-serve and bench-spec) and the 8da4w "
        "build (default out/peers)",
    )


def register(subparsers) -> None:
    """``lora-share bench-serve``: its flags and what it runs."""
    import argparse

    p = subparsers.add_parser(
        "bench-serve",
        help="lora-share-server with 1-8 concurrent clients on different "
        "adapters vs llama-server -np N: aggregate tokens/s, first token, "
        "gaps, a multi-turn chat, PSS",
        epilog="examples:\n  lora-share bench-serve            # = make bench-serve; writes "
        "benchmarks/results/serve-<date>.{json,md}\n"
        "  lora-share bench-serve --quick    # a smoke run: fp32 only, 8 tokens, one "
        "repeat, 3 chat turns",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: fp32 only, 8 tokens a request, one repeat, "
        "3 chat turns (its results are named serve-<date>-quick)",
    )
    p.add_argument(
        "--parallel", type=at_least(1), default=4, help="lora-share-server --parallel and llama-server -np (default 4)"
    )
    p.add_argument(
        "--repeats",
        type=at_least(1),
        default=None,
        help=f"repeats of each scenario (default {FULL['repeats']}; --quick {QUICK['repeats']})",
    )
    add_demo_and_llama_args(p)
    p.add_argument("--server", default="build/lora-share-server", help="default build/lora-share-server")
    p.add_argument("--out", default="benchmarks/results", help="folder for serve-<date>.{json,md}")
    p.set_defaults(func=lambda ns: run_from_args(ns, typed_command("bench-serve")))
