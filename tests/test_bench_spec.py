"""`lora-share bench-spec`: its corpus as written, its checks on given figures, and its harness run for
real against two build/lora-share-servers (speculation on, --no-speculation) on a tiny deployment of
four adapters, the results file written with its header."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_bench_serve import four_adapters  # noqa: F401 (fixture)
from test_server import server_bin  # noqa: F401 (fixture)

from lora_share.bench import spec, spec_corpus
from lora_share.bench.common import HEADER_KEYS, results_header
from lora_share.bench.serve import LoraShareServer, Prompts


def test_corpus_has_its_twenty_prompts_a_task():
    for task, count in (("proofread", 20), ("rewrite", 20), ("extract", 20)):
        requests = spec_corpus.prompts(task)
        assert len(requests) == count and len({r["message"] for r in requests}) == count, task
    assert len(spec_corpus.prompts("free")) >= 8
    # Proofreading and rewriting predict the text as given (the message's text after the instruction).
    for task in ("proofread", "rewrite"):
        for r in spec_corpus.prompts(task):
            instruction, text = r["message"].split("\n\n", 1)
            assert r["prediction"] == text and instruction.endswith(":")
            assert 50 <= len(text.split()) <= 80, text
    assert all(r["prediction"] is None for r in spec_corpus.prompts("extract") + spec_corpus.prompts("free"))


def figures(ratio: float) -> dict:
    return {"decode_tokens_per_s": 100.0 * ratio, "over_no_speculation": ratio}


def result_with(copy: float, predicted: float, free: float, four: float, differ: list) -> dict:
    """A result of the shape run_spec writes, with the given ratios and texts that differ."""
    off = {"decode_tokens_per_s": 100.0}
    tasks = {
        "proofread": {
            spec.ONE_BASE: {spec.OFF: off, spec.ON: figures(copy), spec.PREDICTION: figures(predicted)},
            spec.ONE_ADAPTER: {spec.OFF: off, spec.ON: figures(copy), spec.PREDICTION: figures(predicted)},
            spec.FOUR: {spec.OFF: off, spec.ON: figures(four), spec.PREDICTION: figures(four)},
        },
        "free": {spec.FOUR: {spec.OFF: off, spec.ON: figures(free)}},
    }
    return {
        "settings": {"adapter": "brief"},
        "precisions": {
            "fp32": {"tasks": tasks, "texts": {"compared": 10, "differ": differ}},
            "8da4w": {"tasks": tasks, "texts": {"compared": 10, "differ": []}},
        },
    }


def test_checks_hold_the_done_when_lines_to_their_targets():
    passing = spec.checks(result_with(1.8, 1.8, 0.95, 1.4, []))
    assert len(passing) == 8 and all(c["pass"] for c in passing)
    # Just below each target: that line fails, and only that one.
    for changed, name in (
        ({"copy": 1.79}, "one client on"),
        ({"predicted": 1.79}, "as prediction"),
        ({"free": 0.949}, "free answers"),
        ({"four": 1.39}, "copy task, 4 clients"),
    ):
        given = {"copy": 1.8, "predicted": 1.8, "free": 0.95, "four": 1.4, **changed}
        failed = [c["check"] for c in spec.checks(result_with(**given, differ=[])) if not c["pass"]]
        assert failed and all(name in c for c in failed), (changed, failed)
        assert len(failed) == (2 if name in ("one client on", "as prediction") else 1)
    one_differs = spec.checks(result_with(2.0, 2.0, 1.0, 1.5, [{"task": "free"}]))
    texts = [c for c in one_differs if "text" in c["check"]]
    assert [(c["precision"], c["pass"], c["value"]) for c in texts] == [
        ("fp32", False, "9 of 10"),
        ("8da4w", True, "10 of 10"),
    ]


def test_llama_servers_scenario_is_summed_alone():
    """llama-server runs one scenario of one task: its figures and texts without the others'."""
    measured = spec.Measured()
    # Three tokens each: two decode tokens, in 2 s without speculation and in 1 s with it.
    for mode, times, text in ((spec.OFF, [0.0, 1.0, 2.0], "a b"), (spec.ON, [5.0, 5.5, 6.0], "a c")):
        answer = spec.http_streams.Streamed(text=text, token_times=times)
        measured.add(("proofread", spec.ONE_BASE, mode), spec.group_figures([answer], None, 0.0), [("base", text)])
    result = spec.collect(measured, {"proofread": {"modes": [spec.OFF, spec.ON]}})
    figures = result["tasks"]["proofread"]
    assert list(figures) == [spec.ONE_BASE]
    assert figures[spec.ONE_BASE][spec.OFF]["decode_tokens_per_s"] == 1.0
    assert figures[spec.ONE_BASE][spec.ON]["over_no_speculation"] == 2.0
    assert result["texts"]["compared"] == 1 and result["texts"]["differ"][0]["with"] == "a c"


def test_options_are_checked_before_any_work(tmp_path):
    missing = run_cli("bench-spec", "--server", tmp_path / "nowhere", "--workdir", tmp_path / "w")
    assert missing.returncode == 2 and "--server" in missing.stderr and "make runner" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "w").exists()
    few = run_cli("bench-spec", "--parallel", "2")
    assert few.returncode == 2 and "--parallel" in few.stderr and "below 4" in few.stderr
    wrong = run_cli("bench-spec", "--precisions", "fp32,fp16")
    assert wrong.returncode == 2 and "--precisions" in wrong.stderr and "fp32, 8da4w or both" in wrong.stderr


# The tiny build's context is 64 tokens of about one a character: short messages, few tokens.
TINY_TASKS = {
    "proofread": {"max_tokens": 8, "ignore_eos": False, "modes": [spec.OFF, spec.ON, spec.PREDICTION]},
    "free": {"max_tokens": 6, "ignore_eos": True, "modes": [spec.OFF, spec.ON]},
}
SETTINGS = {"requests": 2, "groups": 1, "parallel": 4, "quick": True, "precisions": ["fp32"]}


@pytest.fixture(scope="module")
def measured(server_bin, four_adapters, tmp_path_factory):  # noqa: F811
    """One precision's run of the harness over the tiny deployment. The copy task's prediction is the
    answer the --no-speculation server gave (the answer as guessed exactly), so its drafts are kept."""
    work = tmp_path_factory.mktemp("spec-work")
    adapters = [a["name"] for a in json.loads((four_adapters / "manifest.json").read_text())["adapters"]]
    prompts = Prompts(four_adapters)
    settings = {**SETTINGS, "adapter": adapters[1]}
    with (
        # Every draft verified: the counts below would otherwise hang on the step timings (step_width.h).
        LoraShareServer(server_bin, four_adapters, 4, work / "on.log", ("--every-draft",)) as on,
        LoraShareServer(server_bin, four_adapters, 4, work / "off.log", ("--no-speculation",)) as off,
    ):
        guessed = {}
        for message in ("ab ab", "cd cd"):
            ids = prompts.ids([("user", message)])
            answer = spec.http_streams.stream(off.address, spec.body("base", ids, TINY_TASKS["proofread"], None))
            guessed[message] = answer.text

        def corpus(task: str) -> list[dict]:
            return [{"message": m, "prediction": guessed[m]} for m in guessed]

        row = spec.run_precision(
            {spec.ON: on, spec.OFF: off}, adapters, prompts, settings, lambda s: None, TINY_TASKS, corpus
        )
        row["server_stats"] = {spec.ON: on.stats(), spec.OFF: off.stats()}
    return {"row": row, "settings": settings}


def test_every_request_is_compared_with_and_without_speculation(measured):
    row = measured["row"]
    # Per task: its scenarios' requests (1 client: 2, 4 clients: one group of 4) in each speculating mode.
    requests = {"proofread": 2 + 2 + 4, "free": 2 + 4}
    compared = sum(n * (len(TINY_TASKS[t]["modes"]) - 1) for t, n in requests.items())
    assert row["texts"]["compared"] == compared
    assert row["texts"]["differ"] == []


def test_the_servers_figures_are_read(measured):
    row = measured["row"]
    for task, scenarios in row["tasks"].items():
        assert set(scenarios) == set(spec.scenarios(task, ["a", "b", "c", "d"], "b"))
        for name, modes in scenarios.items():
            off = modes[spec.OFF]
            # --no-speculation drafts nothing, and each of its decode steps gives a row one token (and the
            # step that picks EOS none that counts: EOS ends free answers only at max_tokens).
            assert off["drafted"] == 0 and off["acceptance"] is None
            assert off["tokens_per_row_step"] == 1.0 if task == "free" else 0.5 <= off["tokens_per_row_step"] <= 1.0
            for mode, f in modes.items():
                assert f["decode_tokens_per_s"] > 0 and f["decode_tokens"] > 0, (task, name, mode)
                if mode != spec.OFF:
                    assert f["over_no_speculation"] == round(f["decode_tokens_per_s"] / off["decode_tokens_per_s"], 3)
                    gained = f["tokens_per_row_step"] / off["tokens_per_row_step"]
                    assert f["row_step_cost"] == pytest.approx(gained / f["over_no_speculation"], abs=1e-3)
                if mode != spec.OFF and f["cpu_ms_per_token"] and off["cpu_ms_per_token"]:
                    assert f["cpu_over_no_speculation"] == round(off["cpu_ms_per_token"] / f["cpu_ms_per_token"], 3)
                assert f["cpu_ms_per_token"] >= 0  # the servers' CPU time, in clock ticks: a short group may take none
    # The answer given as its own prediction: drafted, and every draft kept.
    predicted = row["tasks"]["proofread"][spec.ONE_BASE][spec.PREDICTION]
    assert predicted["drafted"] > 0 and predicted["acceptance"] == 1.0
    assert predicted["tokens_per_row_step"] > 1.0
    # The server's own totals count every draft the usage reported, the warm-up's group of 4 included.
    drafted = sum(
        f["drafted"] for scenarios in row["tasks"].values() for modes in scenarios.values() for f in modes.values()
    )
    assert row["server_stats"][spec.ON]["drafted_tokens"] == drafted + row["warm_up_drafted"][spec.ON]
    assert row["warm_up_drafted"][spec.OFF] == 0
    assert row["server_stats"][spec.OFF]["drafted_tokens"] == 0


def test_results_file_and_report(measured, tmp_path):
    result = {
        **results_header("lora-share bench-spec --quick"),
        "quick": True,
        "settings": measured["settings"],
        "precisions": {"fp32": measured["row"]},
        "llama_server": "not measured (--no-llama or --quick)",
    }
    result["checks"] = spec.checks(result)
    spec.write_results(tmp_path / "results", "bench_spec-quick", result)
    written = json.loads((tmp_path / "results" / "bench_spec-quick.json").read_text())
    assert list(written)[: len(HEADER_KEYS)] == list(HEADER_KEYS)
    assert written["precisions"]["fp32"]["texts"] == measured["row"]["texts"]
    md = (tmp_path / "results" / "bench_spec-quick.md").read_text()
    assert md == spec.report(result) and result["commit"] in md
    assert md.count("\n- PASS ") + md.count("\n- FAIL ") == len(result["checks"]) == 7
    assert "llama-server: not measured" in md
    rows = [line for line in md.splitlines() if line.startswith("| proofread |") or line.startswith("| free |")]
    assert len(rows) == 3 * 3 + 2 * 2
