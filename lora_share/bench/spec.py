"""Speculative decoding's speed on the demo deployment, against the same server with ``--no-speculation``
(issue 60): ``lora-share bench-spec`` (``make bench-spec``).

    make bench-spec                  # writes benchmarks/results/bench_spec.{json,md}
    lora-share bench-spec --quick    # a smoke run (fp32 only, 2 requests a task, no llama.cpp): minutes

Per precision (fp32, the demo's out/smollm2; 8da4w, bench-serve's build of the same config in
``--workdir``) two lora-share-servers are alive at once, the default (speculation on) and one started with
``--no-speculation``, and every request is asked of both, the order swapping from one request (or group
of four) to the next, so a busy spell of the machine hits both. The requests are bench-spec's corpus
(lora_share/bench/spec_corpus.py): proofreading (the copy task), rewriting in the past tense, extracting
fields to JSON, free questions. Each is a chat message rendered with the build's template into token
ids, streamed from ``/v1/completions``, greedy, ``cache_prompt: false`` (the whole prompt fed, so no
answer depends on what was cached before it), EOS honoured with a ``max_tokens`` that holds the answer
(free answers: 64 tokens, EOS ignored). Scenarios:

- every task on ``base`` by 1 client, and by 4 clients at once on the 4 adapters; the copy task also by
  1 client on one trained adapter (``--adapter``);
- modes: no speculation (the ``--no-speculation`` server), speculation (prompt lookup), and for
  proofreading and rewriting speculation with the text as the request's ``prediction``.

Measured per scenario and mode: decode tokens/s (each group's tokens after its first over the time from
its first first token to its last token, summed over the groups), the acceptance rate (accepted over
drafted, from ``usage.completion_tokens_details``), tokens per row per step (``/v1/stats``' batch steps
and their rows), the ratio to no speculation; and every text against the same request without
speculation. llama-server (bench-serve's llama.cpp build) runs the 1-client copy task with and without
its own n-gram speculation (``--spec-type ngram-simple``) on the F32 and Q4_0 GGUFs, its figures beside
ours. The checks are issue 60's "Done when" lines, printed as PASS/FAIL; the exit status is 1 if any fails.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

from ..config import BASE_NAME
from ..errors import UserError
from . import http_streams, peers, spec_corpus
from .common import BenchFailed, at_least, header_line, results_header, typed_command, write_whole
from .llama_cpp import LlamaServer, llama_cpp, llama_ggufs
from .memory import BenchError
from .serve import PAIRS, LoraShareServer, Prompts, add_demo_and_llama_args, demo_builds

OFF, ON, PREDICTION = "no speculation", "speculation", "speculation + prediction"
# Each task: the most tokens an answer gets, whether EOS ends it, and its modes.
TASKS = {
    "proofread": {"max_tokens": 192, "ignore_eos": False, "modes": [OFF, ON, PREDICTION]},
    "rewrite": {"max_tokens": 192, "ignore_eos": False, "modes": [OFF, ON, PREDICTION]},
    "extract": {"max_tokens": 96, "ignore_eos": False, "modes": [OFF, ON]},
    "free": {"max_tokens": 64, "ignore_eos": True, "modes": [OFF, ON]},
}
ONE_BASE, ONE_ADAPTER, FOUR = "1 client, base", "1 client, adapter", "4 clients, 4 adapters"
# 4 groups of 4: a group's speed depends on its four texts (how much each adapter copies, how long the longest
# answer runs alone), so 2 groups (8 requests) gave 1.29x to 1.49x on the copy task at one commit.
FULL = {"requests": 8, "groups": 4, "precisions": ["fp32", "8da4w"]}
QUICK = {"requests": 2, "groups": 1, "precisions": ["fp32"]}
# llama-server's own n-gram speculation: the last 3 tokens looked up in the context, up to 16 proposed.
LLAMA_SPEC = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-draft-n-max", "16")
# Issue 60's "Done when" targets (fp32): speculation's tokens/s over --no-speculation's.
COPY_ONE_CLIENT = 1.8
COPY_FOUR_CLIENTS = 1.4
FREE_FOUR_CLIENTS = 0.95


def scenarios(task: str, adapters: list[str], adapter: str) -> dict[str, list[str]]:
    """A task's scenarios: name -> the model each client asks (4 clients: the first 4 adapters)."""
    out = {ONE_BASE: [BASE_NAME]}
    if task == "proofread":
        out[ONE_ADAPTER] = [adapter]
    out[FOUR] = [adapters[c % len(adapters)] for c in range(4)]
    return out


def body(model: str, ids: list[int], task: dict, prediction: str | None) -> dict:
    """A lora-share request of ``task`` (a TASKS entry): greedy, the whole prompt fed, usage streamed
    (its draft counts); ``prediction`` the request's, if any."""
    out = {
        "model": model,
        "prompt": ids,
        "max_tokens": task["max_tokens"],
        "temperature": 0,
        "ignore_eos": task["ignore_eos"],
        "cache_prompt": False,
        "stream_options": {"include_usage": True},
    }
    if prediction is not None:
        out["prediction"] = {"type": "content", "content": prediction}
    return out


def tokens_of(answer: http_streams.Streamed) -> int:
    """An answer's tokens: its usage's count (lora-share), llama-server's timings', else the events'."""
    if answer.usage and "completion_tokens" in answer.usage:
        return answer.usage["completion_tokens"]
    if answer.timings and "predicted_n" in answer.timings:
        return answer.timings["predicted_n"]
    return len(answer.token_times)


def row_steps(stats: dict) -> int:
    """Rows run by decode steps so far: steps of b rows count b (``batch_size_counts[b - 1]``)."""
    return sum((b + 1) * n for b, n in enumerate(stats["batch_size_counts"]))


def group_figures(answers: list[http_streams.Streamed], steps: int | None, cpu: float) -> dict:
    """One group of answers asked at once: decode tokens and their time span, draft counts, row steps,
    the server's CPU seconds."""
    timed = [a for a in answers if len(a.token_times) >= 1]
    details = [(a.usage or {}).get("completion_tokens_details") or {} for a in answers]
    timings = [a.timings or {} for a in answers]
    return {
        "tokens": sum(max(tokens_of(a) - 1, 0) for a in answers),
        "seconds": max(a.token_times[-1] for a in timed) - min(a.token_times[0] for a in timed) if timed else 0.0,
        "accepted": sum(d.get("accepted_prediction_tokens", 0) for d in details)
        + sum(t.get("draft_n_accepted", 0) for t in timings),
        "rejected": sum(d.get("rejected_prediction_tokens", 0) for d in details)
        + sum(t.get("draft_n", 0) - t.get("draft_n_accepted", 0) for t in timings),
        "row_steps": steps,
        "cpu_seconds": cpu,
    }


def summarise(groups: list[dict]) -> dict:
    """A scenario's figures in one mode over its groups."""
    tokens, seconds = sum(g["tokens"] for g in groups), sum(g["seconds"] for g in groups)
    accepted, rejected = sum(g["accepted"] for g in groups), sum(g["rejected"] for g in groups)
    steps = [g["row_steps"] for g in groups]
    cpu = sum(g["cpu_seconds"] for g in groups)
    out = {
        "decode_tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else 0.0,
        "decode_tokens": tokens,
        "drafted": accepted + rejected,
        "accepted": accepted,
        "acceptance": round(accepted / (accepted + rejected), 3) if accepted + rejected else None,
        "cpu_ms_per_token": round(1e3 * cpu / tokens, 2) if tokens else None,
        "groups_tokens_per_s": [round(g["tokens"] / g["seconds"], 2) if g["seconds"] > 0 else 0.0 for g in groups],
    }
    if None not in steps and sum(steps):
        out["tokens_per_row_step"] = round(tokens / sum(steps), 3)
    return out


class Measured:
    """Everything one precision's run asked and got: per (task, scenario, mode) its groups' figures and
    its texts in order (text i of every mode is the same request)."""

    def __init__(self):
        self.groups: dict = {}
        self.texts: dict = {}

    def add(self, key: tuple, figures: dict, texts: list[tuple[str, str]]) -> None:
        self.groups.setdefault(key, []).append(figures)
        self.texts.setdefault(key, []).extend(texts)


def ask(server, bodies: list[dict]) -> tuple[list[http_streams.Streamed], int | None, float]:
    """Every body at once: the answers, the rows the server's decode steps ran meanwhile (lora-share's
    /v1/stats) and the CPU time the server used."""
    before = server.stats() if hasattr(server, "stats") else None
    cpu = server.cpu_seconds()
    answers = http_streams.at_once(server.address, bodies)
    cpu = server.cpu_seconds() - cpu
    steps = row_steps(server.stats()) - row_steps(before) if before is not None else None
    return answers, steps, cpu


def run_precision(
    servers: dict,
    adapters: list[str],
    prompts: Prompts,
    settings: dict,
    log,
    tasks: dict = TASKS,
    corpus=spec_corpus.prompts,
) -> dict:
    """Every task's scenarios on the two servers (``servers[ON]`` speculating, ``servers[OFF]`` not), the
    modes' order swapping from one group of requests to the next; the figures, ratios and texts compared.
    ``corpus(task)`` gives a task's requests (``spec_corpus.prompts``)."""
    adapter = settings["adapter"]
    warm_up_drafted = {}
    for mode, server in servers.items():  # every adapter loaded (and packed weights written) before anything is timed
        for model in [BASE_NAME, *adapters]:
            http_streams.stream(
                server.address, body(model, prompts.ids([("user", "Hi")]), {**TASKS["free"], "max_tokens": 1}, None)
            )
        # As a server that has served a while: the scheduler learns what each shape of step costs from the
        # steps it runs (docs/batching.md, "In the scheduler"), so one untimed group of 4 copy requests on
        # the 4 adapters (the task's last requests, none of them timed) runs first on both servers.
        copy, warm = tasks.get("proofread", TASKS["proofread"]), corpus("proofread")[-4:]
        answers, _, _ = ask(
            server, [body(m, prompts.ids([("user", p["message"])]), copy, None) for m, p in zip(adapters, warm)]
        )
        warm_up = group_figures(answers, None, 0.0)
        warm_up_drafted[mode] = warm_up["accepted"] + warm_up["rejected"]
    measured = Measured()
    flip = False
    for task, spec in tasks.items():
        requests = corpus(task)
        for name, clients in scenarios(task, adapters, adapter).items():
            count = settings["requests"] if len(clients) == 1 else settings["groups"] * len(clients)
            picked = [requests[i % len(requests)] for i in range(count)]
            for start in range(0, count, len(clients)):
                group = [(model, picked[start + c]) for c, model in enumerate(clients)]
                for mode in reversed(spec["modes"]) if flip else spec["modes"]:
                    server = servers[OFF if mode == OFF else ON]
                    bodies = [
                        body(
                            m,
                            prompts.ids([("user", p["message"])]),
                            spec,
                            p["prediction"] if mode == PREDICTION else None,
                        )
                        for m, p in group
                    ]
                    answers, steps, cpu = ask(server, bodies)
                    measured.add(
                        (task, name, mode),
                        group_figures(answers, steps, cpu),
                        [(m, a.text) for (m, _), a in zip(group, answers)],
                    )
                flip = not flip
            figures = {mode: summarise(measured.groups[(task, name, mode)]) for mode in spec["modes"]}
            log(
                f"  {task}, {name}: "
                + "; ".join(f"{mode} {f['decode_tokens_per_s']} tokens/s" for mode, f in figures.items())
            )
    return {**collect(measured, tasks), "warm_up_drafted": warm_up_drafted}


def collect(measured: Measured, tasks: dict) -> dict:
    """The measured groups as figures per task/scenario/mode (with the ratio to no speculation) and the
    texts of each speculating mode compared with no speculation's, request by request."""
    out: dict = {"tasks": {}, "texts": {"compared": 0, "differ": []}}
    for task, spec in tasks.items():
        out["tasks"][task] = {}
        measured_names = dict.fromkeys(name for (t, name, _) in measured.groups if t == task)  # in order
        for name in measured_names:
            figures = {mode: summarise(measured.groups[(task, name, mode)]) for mode in spec["modes"]}
            off = figures[OFF]["decode_tokens_per_s"]
            for mode in spec["modes"][1:]:
                f = figures[mode]
                f["over_no_speculation"] = round(f["decode_tokens_per_s"] / off, 3) if off else 0.0
                if f["over_no_speculation"] and "tokens_per_row_step" in f and "tokens_per_row_step" in figures[OFF]:
                    # What a row-step cost against one without speculation: the tokens it gained over the speed.
                    gained = f["tokens_per_row_step"] / figures[OFF]["tokens_per_row_step"]
                    f["row_step_cost"] = round(gained / f["over_no_speculation"], 3)
                if f["cpu_ms_per_token"] and figures[OFF]["cpu_ms_per_token"]:
                    # The same ratio in the server's CPU time: what a busy machine's other work does not move.
                    f["cpu_over_no_speculation"] = round(figures[OFF]["cpu_ms_per_token"] / f["cpu_ms_per_token"], 3)
                reference = measured.texts[(task, name, OFF)]
                for i, ((model, text), (_, other)) in enumerate(zip(reference, measured.texts[(task, name, mode)])):
                    out["texts"]["compared"] += 1
                    if text != other:
                        out["texts"]["differ"].append(
                            {
                                "task": task,
                                "scenario": name,
                                "mode": mode,
                                "model": model,
                                "request": i,
                                "without": text,
                                "with": other,
                            }
                        )
            out["tasks"][task][name] = figures
    return out


def llama_body(ids: list[int], task: str) -> dict:
    """A llama-server request of ``task`` as ours (no usage, no prediction: it has neither)."""
    t = TASKS[task]
    return {
        "prompt": ids,
        "max_tokens": t["max_tokens"],
        "temperature": 0,
        "ignore_eos": t["ignore_eos"],
        "cache_prompt": False,
    }


def free_port() -> int:
    """A port free now (llama-server takes a fixed one; two run at once here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_llama(
    tools: dict, gguf: Path, prompts: Prompts, settings: dict, context: int, work: Path, tag: str, log
) -> dict:
    """llama-server with and without its n-gram speculation on the 1-client copy task on base, the two
    alive at once and alternating as ours: tokens/s, acceptance (its timings' draft counts), the ratio,
    its texts compared."""
    measured = Measured()
    servers = {}
    try:
        for mode, extra in ((OFF, ()), (ON, LLAMA_SPEC)):
            servers[mode] = LlamaServer(
                tools["llama-server"],
                gguf,
                [],
                free_port(),
                work / f"spec-llama-{tag}-{mode.split()[0]}.log",
                context=context,
                extra=extra,
            )
        corpus = spec_corpus.prompts("proofread")
        modes = [OFF, ON]
        for i in range(settings["requests"]):
            ids = prompts.ids([("user", corpus[i % len(corpus)]["message"])])
            for mode in reversed(modes) if i % 2 else modes:
                answers, steps, cpu = ask(servers[mode], [llama_body(ids, "proofread")])
                measured.add(
                    ("proofread", ONE_BASE, mode), group_figures(answers, steps, cpu), [(BASE_NAME, answers[0].text)]
                )
    finally:
        for server in servers.values():
            server.close()
    result = collect(measured, {"proofread": {"modes": modes}})
    figures = result["tasks"]["proofread"][ONE_BASE]
    log(f"  llama-server {tag}: " + "; ".join(f"{m} {f['decode_tokens_per_s']} tokens/s" for m, f in figures.items()))
    return {"gguf": gguf.name, "flags": " ".join(LLAMA_SPEC), "figures": figures, "texts": result["texts"]}


def run_spec(
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
    """Builds, servers, measurements: the result dict, its header naming ``command`` (handed to ``save``
    after each precision and after llama-server's figures)."""
    builds = demo_builds(config, work, settings["precisions"], log)
    for b in builds.values():
        if settings["adapter"] not in b["adapters"]:
            raise UserError(
                f"--adapter {settings['adapter']}: not an adapter of {b['dir']} (it has {', '.join(b['adapters'])})"
            )
    result = {**results_header(command), "quick": settings["quick"], "settings": settings, "precisions": {}}
    for precision in settings["precisions"]:
        b = builds[precision]
        log(f"measuring {precision} ...")
        with (
            LoraShareServer(server_bin, b["dir"], settings["parallel"], work / f"spec-{precision}-on.log") as on,
            LoraShareServer(
                server_bin, b["dir"], settings["parallel"], work / f"spec-{precision}-off.log", ("--no-speculation",)
            ) as off,
        ):
            row = run_precision({ON: on, OFF: off}, b["adapters"], Prompts(b["dir"]), settings, log)
            row["server_stats"] = {ON: on.stats(), OFF: off.stats()}
        result["precisions"][precision] = row
        result["checks"] = checks(result)
        save(result)
    # llama.cpp after lora-share's side: its build (minutes, the first time) then delays no measurement.
    result["llama_server"] = "not measured (--no-llama or --quick)"
    if llama:
        try:
            log("llama.cpp and its GGUFs (bench-peers' build) ...")
            tools = llama_cpp(work / "llama.cpp")
            hf = peers.hf_folder(gguf, work / "hf")
            (work / "gguf").mkdir(exist_ok=True)
            ggufs = llama_ggufs(tools, hf, gguf, [], work / "gguf")
            for precision, row in result["precisions"].items():
                b = builds[precision]
                log(f"llama-server {PAIRS[precision].upper()} ...")
                row["llama_server"] = run_llama(
                    tools,
                    ggufs["models"][PAIRS[precision]],
                    Prompts(b["dir"]),
                    settings,
                    b["manifest"].max_seq_len,
                    work,
                    PAIRS[precision],
                    log,
                )
            result["llama_server"] = "measured"
        except BenchError as e:
            result["llama_server"] = f"not measured: {e}"
    save(result)
    return result


def checks(result: dict) -> list[dict]:
    """Issue 60's "Done when" lines on what was measured: the speed ratios on fp32, texts on every precision."""
    out = []

    def check(precision: str, what: str, value, target: str, ok: bool) -> None:
        out.append({"precision": precision, "check": what, "value": value, "target": target, "pass": bool(ok)})

    fp32 = result["precisions"].get("fp32")
    if fp32 is not None:
        tasks, adapter = fp32["tasks"], result["settings"]["adapter"]
        for name, who in ((ONE_BASE, BASE_NAME), (ONE_ADAPTER, adapter)):
            for mode, what in ((ON, ""), (PREDICTION, ", the paragraph as prediction")):
                ratio = tasks["proofread"][name][mode]["over_no_speculation"]
                check(
                    "fp32",
                    f"copy task, one client on {who}{what}: tokens/s over --no-speculation",
                    ratio,
                    f">= {COPY_ONE_CLIENT}",
                    ratio >= COPY_ONE_CLIENT,
                )
        ratio = tasks["free"][FOUR][ON]["over_no_speculation"]
        check(
            "fp32",
            f"free answers, 4 questions on 4 adapters at once, {TASKS['free']['max_tokens']} tokens each: "
            "aggregate tokens/s over --no-speculation",
            ratio,
            f">= {FREE_FOUR_CLIENTS}",
            ratio >= FREE_FOUR_CLIENTS,
        )
        ratio = tasks["proofread"][FOUR][ON]["over_no_speculation"]
        check(
            "fp32",
            "copy task, 4 clients at once on 4 adapters: aggregate tokens/s over --no-speculation",
            ratio,
            f">= {COPY_FOUR_CLIENTS}",
            ratio >= COPY_FOUR_CLIENTS,
        )
    for precision, row in result["precisions"].items():
        texts = row["texts"]
        check(
            precision,
            "every text equal with and without speculation",
            f"{texts['compared'] - len(texts['differ'])} of {texts['compared']}",
            "all",
            texts["compared"] > 0 and not texts["differ"],
        )
    return out


def figures_row(task: str, name: str, mode: str, f: dict, who: str = "lora-share") -> str:
    accept = "" if f["acceptance"] is None else f"{f['acceptance']:.0%} ({f['accepted']} of {f['drafted']})"
    return (
        f"| {task} | {name} | {who} | {mode} | {f['decode_tokens_per_s']} | {f.get('over_no_speculation', '')} | "
        f"{accept} | {f.get('tokens_per_row_step', '')} | {f.get('row_step_cost', '')} | "
        f"{f.get('cpu_ms_per_token', '')} | {f.get('cpu_over_no_speculation', '')} |"
    )


def report(result: dict) -> str:
    """The markdown: per precision a table of every task, scenario and mode, llama-server's beside it,
    the texts that differ; then the checks."""
    s = result["settings"]
    lines = [
        "# bench-spec: speculative decoding on the SmolLM2-135M-Instruct demo deployment"
        f"{' (QUICK smoke run)' if result['quick'] else ''}",
        "",
        f"{header_line(result)} Two lora-share-servers --parallel {s['parallel']} alive at once, the default "
        "(speculation on) and --no-speculation, every request asked of both in alternating order, after one "
        "untimed group of 4 proofreading requests on each (the scheduler's step costs learned). Each "
        "request: bench-spec's corpus (lora_share/bench/spec_corpus.py) as a chat message, streamed "
        "/v1/completions, greedy, cache_prompt off; EOS honoured (proofread and rewrite 192 tokens at most, "
        f"extract 96), free answers 64 tokens with EOS ignored. 1 client: {s['requests']} requests a "
        f"scenario; 4 clients: {s['groups']} groups of 4 at once on the 4 adapters. Decode tokens/s = tokens "
        "after each answer's first over the time from the group's first first token to its last token. "
        "Acceptance = drafts kept / drafted (usage.completion_tokens_details; llama-server's timings). "
        "Tokens per row-step = decode tokens / the rows of the server's decode steps (/v1/stats); "
        "row-step cost = a row-step's time over one without speculation (the tokens per row-step gained "
        "over the speed gained); server CPU ms a token = the server process's CPU time (prompts included) over "
        "its decode tokens, and its ratio no speculation's over the mode's: the speed-up as the machine's "
        "other load cannot move it.",
        "",
    ]
    for precision, row in result["precisions"].items():
        lines += [
            f"## {precision}",
            "",
            "| task | clients | server | mode | decode tokens/s | over no speculation | acceptance | "
            "tokens per row-step | row-step cost | server CPU ms a token | CPU over no speculation |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for task, scen in row["tasks"].items():
            for name, modes in scen.items():
                label = f"1 client, {s['adapter']}" if name == ONE_ADAPTER else name
                lines += [figures_row(task, label, mode, f) for mode, f in modes.items()]
        llama = row.get("llama_server")
        if llama:
            lines += [
                figures_row("proofread", ONE_BASE, mode, f, f"llama-server {llama['gguf']}")
                for mode, f in llama["figures"].items()
            ]
        texts = row["texts"]
        lines += [
            "",
            f"Texts equal with and without speculation: {texts['compared'] - len(texts['differ'])} of "
            f"{texts['compared']}.",
        ]
        if llama:
            t = llama["texts"]
            lines.append(
                f"llama-server's speculation (`{llama['flags']}`): texts equal with and without it "
                f"{t['compared'] - len(t['differ'])} of {t['compared']}."
            )
        for d in texts["differ"]:
            lines += [
                "",
                f"Differs: {d['task']}, {d['scenario']}, {d['model']}, request {d['request']}, {d['mode']}:",
                f"- without: {d['without']!r}",
                f"- with: {d['with']!r}",
            ]
        lines.append("")
    if result.get("llama_server", "measured") != "measured":
        lines += [f"llama-server: {result['llama_server']}.", ""]
    lines += ["## Checks (issue 60)", ""]
    lines += [
        f"- {'PASS' if c['pass'] else 'FAIL'} [{c['precision']}] {c['check']}: {c['value']} (target {c['target']})"
        for c in result.get("checks", [])
    ]
    return "\n".join(lines) + "\n"


def write_results(out: Path, stem: str, result: dict) -> None:
    """``stem``.json (the result, its header first) and ``stem``.md (the report) in ``out``, each whole."""
    out.mkdir(parents=True, exist_ok=True)
    write_whole(out / f"{stem}.json", json.dumps(result, indent=2, default=str) + "\n")
    write_whole(out / f"{stem}.md", report(result))


def run_from_args(ns, command: str) -> int:
    server_bin = Path(ns.server).resolve()
    if not server_bin.is_file():
        raise UserError(f"--server {ns.server}: no such file; build it with `make runner`")
    config = Path(ns.config)
    if not config.is_file():
        raise UserError(f"--config {ns.config}: no such file (the demo deployment's config, configs/smollm2.yaml)")
    llama = ns.llama and not ns.quick
    gguf = Path(ns.gguf).resolve()
    if llama and not gguf.is_file():
        raise UserError(f"--gguf {ns.gguf}: no such file; fetch it with `make model` (SmolLM2-135M-Instruct Q4_1)")
    work = Path(ns.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    settings = {**(QUICK if ns.quick else FULL), "quick": ns.quick, "parallel": ns.parallel, "adapter": ns.adapter}
    if ns.precisions is not None:
        settings["precisions"] = ns.precisions
    out = Path(ns.out)
    # Named after what they hold: bench_spec[-quick][-<precisions>] when --precisions narrows the default.
    stem = "bench_spec" + ("-quick" if ns.quick else "")
    if ns.precisions is not None and ns.precisions != (QUICK if ns.quick else FULL)["precisions"]:
        stem += "-" + "-".join(ns.precisions)

    try:
        result = run_spec(
            server_bin,
            config,
            gguf,
            work,
            settings,
            llama,
            command=command,
            save=lambda result: write_results(out, stem, result),
            log=lambda s: print(s, file=sys.stderr, flush=True),
        )
    except BenchError as e:
        raise BenchFailed(str(e)) from None
    print(report(result))
    return 0 if all(c["pass"] for c in result["checks"]) else 1


def precision_list(text: str) -> list[str]:
    """An argparse type: a comma-separated list from fp32 and 8da4w."""
    import argparse

    names = [n.strip() for n in text.split(",") if n.strip()]
    wrong = [n for n in names if n not in PAIRS]
    if not names or wrong:
        raise argparse.ArgumentTypeError(f"{text!r}: give fp32, 8da4w or both, comma-separated")
    return names


def register(subparsers) -> None:
    """``lora-share bench-spec``: its flags and what it runs."""
    import argparse

    p = subparsers.add_parser(
        "bench-spec",
        help="speculative decoding on the demo deployment against --no-speculation: proofread, rewrite, "
        "extract, free answers; 1 and 4 clients, fp32 and 8da4w, with prediction; llama-server's n-gram "
        "speculation beside it",
        epilog="examples:\n  lora-share bench-spec            # = make bench-spec; writes "
        "benchmarks/results/bench_spec.{json,md}\n"
        "  lora-share bench-spec --quick    # a smoke run: fp32 only, 2 requests a task, no llama.cpp",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: fp32 only, 2 requests a task and 1 group of 4, no llama.cpp "
        "(its results are named bench_spec-quick)",
    )
    p.add_argument("--parallel", type=at_least(4), default=4, help="lora-share-server --parallel (default 4)")
    p.add_argument("--adapter", default="brief", help="the adapter of the 1-client copy task (default brief)")
    p.add_argument(
        "--precisions",
        type=precision_list,
        default=None,
        help="the builds measured, comma-separated from fp32 and 8da4w (default both; --quick fp32); "
        "results named bench_spec-<precisions> when fewer than the default",
    )
    add_demo_and_llama_args(p)
    p.add_argument("--server", default="build/lora-share-server", help="default build/lora-share-server")
    p.add_argument("--out", default="benchmarks/results", help="folder for bench_spec.{json,md}")
    p.set_defaults(func=lambda ns: run_from_args(ns, typed_command("bench-spec")))
