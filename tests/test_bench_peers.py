"""`lora-share bench-peers` without llama.cpp: its options, lora-share's side measured for real on the tiny
build (the same functions the benchmark calls), the checks and the report from those figures, and the
parsing of llama-server's log."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, TINY_FOUNDATION, run_cli

from lora_share.bench import llama_cpp, memory, peers, peers_measure, peers_report, processes
from lora_share.bench.common import results_header

# Captured from the llama-server this benchmark builds (llama-cpp-python 0.3.36's llama.cpp, -lv 4) with
# SmolLM2-135M-Instruct F32, -c 2048 -np 1 and one --lora (the second line repeated for a second file).
SERVER_LOG = """\
0.00.498.972 I llama_adapter_lora_init: loading lora adapter from 'gguf/a1.gguf' ...
0.00.498.990 I llama_adapter_lora_init: loading lora adapter from 'gguf/a2.gguf' ...
0.00.501.729 I llama_kv_cache:        CPU KV buffer size =    45.00 MiB
"""


def test_options_are_checked_before_any_work(tmp_path):
    few = run_cli("bench-peers", "--adapters", "1", "--workdir", tmp_path)
    assert few.returncode == 2 and "--adapters" in few.stderr and "below 2" in few.stderr
    missing = run_cli(
        "bench-peers",
        "--gguf",
        tmp_path / "none.gguf",
        "--workdir",
        tmp_path / "w",
        "--runner",
        REPO / "pyproject.toml",
    )
    assert missing.returncode == 2 and "--gguf" in missing.stderr and "none.gguf" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "w" / "llama.cpp").exists()


def test_server_log_is_parsed():
    assert llama_cpp.parse_kv_bytes(SERVER_LOG) == 45 * 2**20
    assert llama_cpp.parse_loras(SERVER_LOG) == ["gguf/a1.gguf", "gguf/a2.gguf"]
    assert llama_cpp.parse_kv_bytes("no cache line") is None


@pytest.fixture(scope="module")
def ours(tiny_build, runner_bin):
    """lora-share's figures for the tiny build, measured by the benchmark's own functions."""
    b = {"ptd": tiny_build.ptd, "ptes": list(tiny_build.ptes.values()), "manifest": tiny_build.manifest}
    short, long = [1, 2, 3], list(range(1, 21))
    samples = {"short": [], "long": []}
    with processes.Server(runner_bin, b["ptes"][:1], b["ptd"], max_new_tokens=4) as server:
        name = server.names[0]
        for _ in range(3):
            samples["short"].append(peers_measure.runner_answer(server.ask(name, short)[0]))
            samples["long"].append(peers_measure.runner_answer(server.ask(name, long)[0]))
    load = processes.start_times(runner_bin, b["ptd"], b["ptes"][:1], [], 1)
    return {
        "build": "fp32",
        **peers_measure.summarize(samples),
        "kv_bytes": peers_measure.kv_bytes_lora_share(b["manifest"]),
        "pss_per_extra_adapter_kb": peers_measure.extra_adapter_ours(runner_bin, b, short),
        "load_first_ms": load["first_ms"],
        "load_ms": load["second_ms"],
    }


def test_lora_share_side_is_measured(ours, tiny_build):
    f = TINY_FOUNDATION
    assert ours["kv_bytes"] == 2 * f["n_layers"] * f["n_kv_heads"] * (f["dim"] // f["n_heads"]) * 32 * 4
    for key in (
        "decode_10_tokens_per_s",
        "decode_1000_tokens_per_s",
        "prefill_tokens_per_s",
        "first_token_ms",
        "load_first_ms",
        "load_ms",
    ):
        assert ours[key] > 0, key
    # tiny_b and tiny_c cost pages of their own: at most their files and their methods' memory. Not > 0: a
    # tiny adapter's pages are fewer kB than PSS's share of the pages two processes map drifts by (-7 kB once).
    biggest_kb = max(p.stat().st_size for p in tiny_build.ptes.values()) / 1024
    assert -64 < ours["pss_per_extra_adapter_kb"] < 2 * biggest_kb + 256


def test_checks_and_report(ours):
    theirs = {
        "model": "f32",
        "decode_10_tokens_per_s": ours["decode_10_tokens_per_s"] / 2,  # ratio 2: passes
        "decode_1000_tokens_per_s": ours["decode_1000_tokens_per_s"],  # ratio 1: below 1.1, fails
        "prefill_tokens_per_s": ours["prefill_tokens_per_s"] / 1.1 * 1.001,  # just under 1.1: fails
        "kv_bytes": ours["kv_bytes"] // 2,  # half of ours: fails
        "pss_per_extra_adapter_kb": ours["pss_per_extra_adapter_kb"],  # equal: passes
        "load_first_ms": ours["load_first_ms"],
        "load_ms": ours["load_ms"] * 5,
    }  # ours 0.2x theirs: passes
    result = {
        **results_header("lora-share bench-peers"),
        "repeats": 3,
        "adapters": 3,
        "rows": {"fp32 vs f32": {"lora_share": ours, "llama_cpp": theirs}},
    }
    result["checks"] = peers_report.checks(result["rows"])
    verdict = {c["check"].split(":")[0]: c["pass"] for c in result["checks"]}
    assert verdict == {
        "decode tokens/s at ~10": True,
        "decode tokens/s at ~1,000": False,
        "prefill tokens/s of 1000": False,
        "load (second start)": True,
        "KV bytes at context 2048": False,
        "PSS per extra adapter (kB)": True,
    }
    assert result["checks"][0]["value"] == pytest.approx(2.0, abs=0.01)
    md = peers_report.report(result)
    assert md.count("PASS") == 3 and md.count("FAIL") == 3
    assert "PASS [fp32 vs f32] load (second start): lora-share / llama.cpp: 0.2 (target <= 0.25)" in md
    assert "| decode tokens/s, position ~10 | " in md and "| 2.00 |" in md
    json.dumps(result, default=str)


def test_llama_answer_counts_decode_steps_as_the_runner_does():
    """llama-server's timings (the fields server-common.cpp's server_slot_stats::to_json writes; made-up
    values): 32 tokens predicted in 310 ms are 31 decode steps of 10 ms after the prompt's 50 ms, so the
    first token after one step lands at 60 ms, as the runner's prefill + decode_ms / (tokens - 1)."""
    answer = {
        "content": "x",
        "timings": {
            "prompt_n": 8,
            "prompt_ms": 50.0,
            "prompt_per_second": 160.0,
            "predicted_n": 32,
            "predicted_ms": 310.0,
            "predicted_per_second": 100.0,
        },
    }
    got = llama_cpp.llama_answer(answer)
    assert got["first_token_ms"] == pytest.approx(60.0) and got["decode_tokens_per_s"] == 100.0
    ours = peers_measure.runner_answer(
        {
            "prefill_ms": 50.0,
            "decode_ms": 310.0,
            "tokens": list(range(32)),
            "prefill_tokens_per_s": 160.0,
            "decode_tokens_per_s": 100.0,
        }
    )
    assert ours["first_token_ms"] == pytest.approx(got["first_token_ms"])


def test_samples_give_each_pairs_ratio():
    """Every request's figure is kept in order, and the report states the lowest and highest ratio of
    the alternating pairs beside the ratio of the medians."""

    def answers(decode, prefill):
        return [
            {"decode_tokens_per_s": d, "prefill_tokens_per_s": p, "first_token_ms": 10.0}
            for d, p in zip(decode, prefill)
        ]

    ours = {
        "build": "fp32",
        **peers_measure.summarize(
            {"short": answers([30, 33, 36], [1, 1, 1]), "long": answers([20, 22, 24], [500, 600, 700])}
        ),
    }
    theirs = {
        "model": "f32",
        **peers_measure.summarize(
            {"short": answers([30, 30, 40], [1, 1, 1]), "long": answers([20, 20, 20], [500, 500, 500])}
        ),
    }
    assert ours["decode_10_tokens_per_s"] == 33 and ours["samples"]["decode_10_tokens_per_s"] == [30, 33, 36]
    assert peers_measure.pair_ratios(ours, theirs, "decode_10_tokens_per_s") == pytest.approx([1.0, 1.1, 0.9])
    assert peers_measure.pair_ratios(ours, {"model": "f32"}, "decode_10_tokens_per_s") == []
    md = peers_report.report(
        {
            **results_header("x"),
            "repeats": 3,
            "rows": {"fp32 vs f32": {"lora_share": ours, "llama_cpp": theirs}},
            "checks": [],
        }
    )
    assert (
        "lowest-highest: decode tokens/s, position ~10 0.90-1.10; decode tokens/s, position ~1,000 1.00-1.20; "
        "prefill tokens/s, 1000 tokens 1.00-1.40."
    ) in md


def test_bare_stream_is_compiled_once_and_measures_real_time(tmp_path):
    """stream_bound.cpp builds for this CPU into the work folder, is reused by its source's and CPU's
    hash, and times real streaming: 538 MB a token cannot take less than 1 ms (538 GB/s) here."""
    binary = peers_measure.stream_bound(tmp_path)
    assert binary.is_file() and binary.parent == tmp_path
    built = binary.stat().st_mtime_ns
    assert peers_measure.stream_bound(tmp_path) == binary and binary.stat().st_mtime_ns == built
    assert 1.0 < peers_measure.bare_stream_ms(binary, tokens=2) < 10_000


def test_fp32_decode_is_reported_as_a_share_of_the_bare_stream():
    """Each request's decode at ~10 is read against the stream run just before it (stream ms x tokens/s
    / 1000), and the report gives both sides' median share and what 1.1 x llama.cpp would be."""
    row = {
        "bare_stream": {"median_ms": 11.0, "samples_ms": [10.0, 11.0, 12.0]},
        "lora_share": {"build": "fp32", "samples": {"decode_10_tokens_per_s": [90.0, 80.0, 80.0]}},
        "llama_cpp": {"model": "f32", "samples": {"decode_10_tokens_per_s": [80.0, 80.0, 75.0]}},
    }
    assert peers_report.stream_shares(row, "lora_share") == pytest.approx([0.90, 0.88, 0.96])
    assert peers_report.stream_shares(row, "llama_cpp") == pytest.approx([0.80, 0.88, 0.90])
    md = "\n".join(peers_report.stream_report(row))
    assert "Median 11.00 ms a token (90.9 tokens/s; runs 10.00-12.00 ms)" in md
    assert "lora-share 90% (88%-96%), llama.cpp 88% (80%-90%)." in md
    assert peers_report.stream_shares({**row, "llama_cpp": {"model": "f32"}}, "llama_cpp") == []


# llama-perplexity's progress and result lines, in the formats its source prints them
# (tools/perplexity/perplexity.cpp of llama-cpp-python 0.3.36's llama.cpp: "[%d]%.4lf," per chunk, then
# "Final estimate: PPL = %.4lf +/- %.5lf"); the values are made up.
PERPLEXITY_LOG = """\
[1]10.2779,[2]11.6551,[3]12.0013,[4]11.6927,[5]11.7045,
Final estimate: PPL = 11.7045 +/- 0.20416
"""


def test_perplexity_is_parsed_and_checked():
    assert llama_cpp.parse_perplexity(PERPLEXITY_LOG) == pytest.approx(11.7045)
    with pytest.raises(memory.BenchError, match="Final estimate"):
        llama_cpp.parse_perplexity("no result")
    ppl = {
        "tokens": 20480,
        "context": 512,
        "lora_share": {"fp32": 10.0, "8da4w": 10.25},
        "llama_cpp": {"f32": 11.0, "q4_0": 12.1, "q4_1": 11.2, "q8_0": 11.01},
    }
    verdict = [c["pass"] for c in peers_report.perplexity_checks(ppl)]
    assert verdict == [True, True]  # 1.025 <= 1.03; 1.025 <= Q4_0's 1.1
    ppl["lora_share"]["8da4w"] = 12.5  # 1.25: over 1.03 and over Q4_0's 1.1
    assert [c["pass"] for c in peers_report.perplexity_checks(ppl)] == [False, False]
    md = peers_report.report(
        {
            **results_header("x"),
            "repeats": 1,
            "rows": {},
            "perplexity": ppl,
            "checks": peers_report.perplexity_checks(ppl),
        }
    )
    assert "| lora-share 8da4w | 12.500 | 1.2500 |" in md and "| llama.cpp Q4_0 | 12.100 | 1.1000 |" in md


def test_perplexity_takes_lora_shares_side_from_bench_quality(tmp_path):
    """lora-share's perplexities are bench-quality's base rows, for the text it measured: a missing
    results file, other 8da4w settings or a changed text are refused by name; llama-perplexity's runs
    are kept in logs and read back."""
    text = tmp_path / "text.txt"
    text.write_text("held-out text")
    import hashlib

    digest = hashlib.sha256(text.read_bytes()).hexdigest()
    info = {"path": str(text), "sha256": digest, "tokens": 20480, "window": 512}
    quality = tmp_path / "bench_quality.json"
    with pytest.raises(memory.BenchError, match="run `make bench-quality` first"):
        peers.perplexity({}, {"models": {}}, quality, tmp_path)
    results = {
        "variants": {
            "fp32": {"quantize": None, "text": info, "results": [{"adapter": "base", "perplexity": 12.9}]},
            "8da4w": {
                "quantize": {**peers.QUANTIZE, "grid": "symmetric"},
                "text": info,
                "results": [{"adapter": "base", "perplexity": 13.1}],
            },
        }
    }
    quality.write_text(json.dumps(results))
    with pytest.raises(memory.BenchError, match="not this bench's"):
        peers.perplexity({}, {"models": {}}, quality, tmp_path)
    results["variants"]["8da4w"]["quantize"] = peers.QUANTIZE
    quality.write_text(json.dumps(results))
    (tmp_path / "perplexity-f32-c512.log").write_text(PERPLEXITY_LOG)  # a kept llama-perplexity run
    ppl = peers.perplexity({}, {"models": {"f32": tmp_path / "model-f32.gguf"}}, quality, tmp_path)
    assert ppl == {
        "tokens": 20480,
        "context": 512,
        "text_sha256": digest,
        "lora_share": {"fp32": 12.9, "8da4w": 13.1},
        "llama_cpp": {"f32": pytest.approx(11.7045)},
    }
    text.write_text("another text")
    with pytest.raises(memory.BenchError, match="not the text"):
        peers.perplexity({}, {"models": {}}, quality, tmp_path)


def test_llama_cpp_is_built_without_amx_where_the_cpu_lists_it():
    """A VM can list AMX without enabling it: llama.cpp's AMX kernels then die on SIGILL (Q4_0 here)."""
    amx = "flags\t\t: fpu avx2 avx512f amx_bf16 avx512_fp16 amx_tile amx_int8\n"
    assert {"-mno-amx-tile", "-mno-amx-int8"} <= set(llama_cpp.compiler_flags(amx))
    assert llama_cpp.compiler_flags("flags\t\t: fpu avx2 avx512f\n") == []


def test_llama_cpp_step_starts_in_a_fresh_workdir(tmp_path, monkeypatch):
    """On a new machine out/peers does not exist: the first step (the sdist's download, here a command that
    fails at once) must fail with its own message and log, not on the log file's missing folder."""
    monkeypatch.setattr(llama_cpp.sys, "executable", "false")
    with pytest.raises(memory.BenchError, match="failed"):
        llama_cpp.llama_cpp(tmp_path / "out" / "peers" / "llama.cpp")
    assert (tmp_path / "out" / "peers" / "llama.cpp" / "pip.log").is_file()
