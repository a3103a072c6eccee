"""`lora-share bench-serve` without llama.cpp: its options, and the harness (concurrent streaming clients,
the texts compared alone, the chat, the PSS pair, the checks and the report) run for real against
build/lora-share-server on a tiny deployment of four adapters."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
from conftest import run_cli
from hf_files import hf_config, write_peft_lora
from test_server import server_bin  # noqa: F401 (fixture)

from lora_share.bench import http_streams, serve
from lora_share.bench.common import results_header

pytestmark = pytest.mark.slow  # `lora-share bench-serve` end to end

TOKENS = 4
SETTINGS = {"max_tokens": TOKENS, "repeats": 1, "turns": 2, "chat_tokens": 2, "parallel": 2}
# Short: the tiny build's context is 64 tokens, and its byte-level tokenizer spends about one a character.
QUESTIONS = ["hi", "yo", "ok"]


def test_options_are_checked_before_any_work(tmp_path):
    missing = run_cli("bench-serve", "--server", tmp_path / "nowhere", "--workdir", tmp_path / "w")
    assert missing.returncode == 2 and "--server" in missing.stderr and "make runner" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "w").exists()
    zero = run_cli("bench-serve", "--parallel", "0")
    assert zero.returncode == 2 and "--parallel" in zero.stderr and "below 1" in zero.stderr


def test_percentile_is_numpys():
    values = [random.Random(3).uniform(0, 50) for _ in range(37)]
    for q in (0, 50, 95, 100):
        assert http_streams.percentile(values, q) == pytest.approx(np.percentile(values, q))


@pytest.fixture(scope="module")
def four_adapters(text_build, tmp_path_factory):
    """text_build's output folder with three more PEFT adapters (`lora-share add`): four to spread clients over."""
    out = tmp_path_factory.mktemp("serve") / "out"
    shutil.copytree(text_build.build.out_dir, out)
    for seed in (11, 12, 13):
        peft = write_peft_lora(
            out.parent / f"peft{seed}", hf_config(vocab=400), r=4, alpha=8, targets=["q_proj", "v_proj"], seed=seed
        )
        r = run_cli("add", "--to", out, f"a{seed}={peft}")
        assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def measured(server_bin, four_adapters, tmp_path_factory):  # noqa: F811
    """One pass of the harness, lora-share's side only, as bench-serve runs it per precision."""
    work = tmp_path_factory.mktemp("serve-work")
    adapters = [a["name"] for a in json.loads((four_adapters / "manifest.json").read_text())["adapters"]]
    prompts = serve.Prompts(four_adapters)
    with serve.LoraShareServer(server_bin, four_adapters, SETTINGS["parallel"], work / "server.log") as ours:
        sides = {"lora_share": ours}
        alone = http_streams.stream(ours.address, ours.body(adapters[1], 1, prompts.tagged("hi"), TOKENS, True))
        together = http_streams.at_once(
            ours.address, [ours.body(a, i, prompts.tagged("hi"), TOKENS, True) for i, a in enumerate(adapters)]
        )
        row = serve.run_scenarios(sides, adapters, prompts, SETTINGS, log=lambda s: None, questions=QUESTIONS)
        row["chat"] = serve.run_chat(sides, adapters[0], prompts, SETTINGS, log=lambda s: None, messages=QUESTIONS)
        row["server_stats"] = ours.stats()
    row["memory"] = serve.measure_memory(
        server_bin, four_adapters, SETTINGS["parallel"], adapters, prompts, TOKENS, work, questions=QUESTIONS
    )
    return {"row": row, "alone": alone, "together": together, "adapters": adapters}


def test_every_client_streams_its_tokens(measured):
    assert len(measured["alone"].token_times) == TOKENS and measured["alone"].first_token_ms > 0
    for answer in measured["together"]:
        assert len(answer.token_times) == TOKENS and len(answer.gaps_ms) == TOKENS - 1
    # run_scenarios asked every concurrent request again alone, with the prompt cache (the timed answers)
    # and without it (each scenario once more): the texts, request by request.
    several = sum(len(c) for c in serve.SCENARIOS.values() if len(c) > 1)
    for key in ("texts", "texts_cached"):
        texts = measured["row"][key]["lora_share"]
        assert texts["compared"] == several, key
        assert texts["differ"] == [], key


def test_scenarios_chat_and_memory_are_measured(measured):
    row = measured["row"]
    assert set(row["scenarios"]["lora_share"]) == set(serve.SCENARIOS)
    for figures in row["scenarios"]["lora_share"].values():
        assert figures["aggregate_decode_tokens_per_s"] > 0 and figures["gap_ms_p95"] >= figures["gap_ms_p50"] > 0
    assert len(row["chat"]["lora_share"]) == SETTINGS["turns"] and min(row["chat"]["lora_share"]) > 0
    memory = row["memory"]
    assert memory["parallel"] == SETTINGS["parallel"] and memory["parallel_1_kb"] > 0 and memory["parallel_n_kb"] > 0
    assert isinstance(memory["slot_bytes"], int)
    assert row["server_stats"]["requests"] >= sum(len(c) for c in serve.SCENARIOS.values())


def test_checks_and_report(measured):
    row = {**measured["row"], "chat_adapter": measured["adapters"][0]}
    checks = serve.checks("fp32", row, llama=False)
    assert len(checks) == 6 and all(isinstance(c["pass"], bool) for c in checks)
    text = next(c for c in checks if "text equals" in c["check"])
    assert text["pass"] and text["value"] == f"{text['value'].split()[0]} of {text['value'].split()[0]}"
    result = {
        "quick": True,
        "settings": {**SETTINGS, "parallel": 2},
        **results_header("lora-share bench-serve --quick"),
        "precisions": {"fp32": row},
        "checks": checks,
    }
    md = serve.report(result)
    assert md.count("\n- PASS ") + md.count("\n- FAIL ") == len(checks)
    assert all(f"| {name} | lora-share |" in md for name in serve.SCENARIOS)
