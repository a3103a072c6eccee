"""`lora-share bench-scale` end to end on its tiny shape: every step runs through the real runner,
the figures land in the results folder, the shared arena keeps each extra adapter within its bound,
and a second run reuses the builds instead of exporting again."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scale_run(tmp_path_factory, runner_bin):
    root = tmp_path_factory.mktemp("scale")
    args = [
        "bench-scale",
        "--shape",
        "tiny",
        "--counts",
        "1,2",
        "--repeats",
        "1",
        "--workdir",
        root / "work",
        "--runner",
        runner_bin,
        "--quiet",
    ]
    first = run_cli(*args, "--out", root / "first", timeout=1200)
    second = run_cli(*args, "--out", root / "second", timeout=1200)
    return root, first, second


def test_results_are_written_and_printed(scale_run):
    root, first, _ = scale_run
    assert first.returncode in (0, 1), first.stderr
    result = json.loads((root / "first" / "bench_scale_tiny.json").read_text())
    md = (root / "first" / "bench_scale_tiny.md").read_text()
    assert first.stdout.strip() == md.strip()
    assert [v["name"] for v in result["variants"]] == ["fp32", "8da4w", "fp32-all16", "8da4w-all16"]
    for v in result["variants"]:
        wide = v["name"].endswith("-all16")
        assert v["envelope"]["max_rank"] == (16 if wide else 8)
        assert len(v["envelope"]["targets"]) == (7 if wide else 2)
        assert [r["adapters"] for r in v["memory"]] == [1, 2]
        for row in v["memory"]:
            for mode in ("shared",) if wide else ("shared", "private", "processes"):
                assert row[mode]["served"]["pss_kb"] > 0 and row[mode]["after_load"]["pss_kb"] > 0
        assert v["speed"]["prefill_tokens_per_s"] > 0 and v["speed"]["decode_far_tokens_per_s"] > 0
        # The wide envelopes' files skip absent slots; the whole program is timed beside them.
        assert v["envelope"].get("skip_absent", False) is wide
        assert ("speed_whole_program" in v) is wide
        if wide:
            assert v["speed_whole_program"]["decode_near_tokens_per_s"] > 0
        assert v["export_s"] > 0 and v["build_peak_rss"] > 0
        # `lora-share add` on the wide envelopes: written as data over the deployment's program.
        assert [(a["adapter"], a["program"], a["produced"]) for a in v["adds"]] == (
            [("r4_qko", "reused", "written"), ("r16_all", "reused", "written")] if wide else []
        )
        assert all(0 < a["add_s"] < a["wall_s"] for a in v["adds"])
        args = result["shape"]
        # K and V, layers, kv heads, head dim, and each slab's sink row plus every position but the last
        assert v["kv_cache_bytes"] == 2 * 2 * 2 * 16 * args["context"] * 4
    # The large shape is built only; its fp32 foundation.ptd holds at least every fp32 weight once.
    big = {b["name"]: b for b in result["big"]["builds"]}
    assert set(big) == {"fp32", "8da4w"} and all(b["build_peak_rss"] > 0 for b in big.values())
    assert big["fp32"]["fp32_bytes"] <= big["fp32"]["ptd_bytes"] < big["fp32"]["fp32_bytes"] + 65536
    assert big["8da4w"]["ptd_bytes"] < big["fp32"]["ptd_bytes"]
    assert result["short_context"]["speed"]["decode_near_tokens_per_s"] > 0


def test_shared_arena_adds_only_the_adapters_own_bytes(scale_run):
    """The enforced memory checks hold on the tiny shape too (its bound is mostly the 0.5 MiB slack;
    test_runner_arena checks the arena sizes themselves)."""
    root, first, _ = scale_run
    result = json.loads((root / "first" / "bench_scale_tiny.json").read_text())
    memory = [c for c in result["checks"] if "PSS" in c["check"]]
    assert memory and all(c["ok"] for c in memory), memory
    # The exit status follows the enforced checks (the speed ratios can go either way on a tiny shape).
    failed = [c for c in result["checks"] if c["enforced"] and not c["ok"]]
    assert first.returncode == (1 if failed else 0)


def test_second_run_reuses_the_builds(scale_run):
    root, first, second = scale_run
    assert second.returncode in (0, 1), second.stderr
    one = json.loads((root / "first" / "bench_scale_tiny.json").read_text())
    two = json.loads((root / "second" / "bench_scale_tiny.json").read_text())
    for a, b in zip(one["variants"], two["variants"]):
        assert a["export_s"] == b["export_s"]  # the recorded export, not a new one
    builds = {k: v for k, v in two["steps_s"].items() if k.startswith("build")}
    first_builds = {k: v for k, v in one["steps_s"].items() if k.startswith("build")}
    assert sum(builds.values()) < 0.5 * sum(first_builds.values()), (first_builds, builds)
