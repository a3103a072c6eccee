"""`lora-share bench` in miniature: N = 1, 2 on a one-layer foundation, checked for its fields and the
direction of every comparison; plus the pieces it rests on (stand-alone export, adapters written as data,
--ptd optional)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # `lora-share bench` end to end: its own exports

MINI_FOUNDATION = {
    "dim": 32,
    "n_layers": 1,
    "n_heads": 2,
    "n_kv_heads": 1,
    "hidden_dim": 64,
    "vocab_size": 64,
    "tie_embeddings": True,
    "seed": 0,
}


@pytest.fixture(scope="module")
def bench(tmp_path_factory, runner_bin):
    folder = tmp_path_factory.mktemp("bench")
    config = folder / "mini.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "foundation": {"synthetic": MINI_FOUNDATION, "max_seq_len": 16},
                "adapters": [{"name": "unused", "synthetic": {"rank": 2, "alpha": 2, "target_modules": ["q_proj"]}}],
            }
        )
    )
    proc = run_cli(
        "bench",
        config,
        "--counts",
        "1,2",
        "--out",
        folder / "results",
        "--workdir",
        folder / "work",
        "--runner",
        runner_bin,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    return folder, json.loads((folder / "results" / "bench.json").read_text()), proc


def test_results_fields_and_directions(bench):
    folder, r, proc = bench
    for key in ("machine", "commit", "date", "disk", "memory", "load", "speed", "switch", "build", "checks"):
        assert key in r, key
    assert r["counts"] == [1, 2] and r["machine"]["cpus"] >= 1 and r["commit"]
    disk = {d["adapters"]: d for d in r["disk"]}
    mem = {m["adapters"]: m for m in r["memory"]}
    # Two adapters: one foundation.ptd + 2 small .pte beat 2 self-contained programs, on disk and in memory.
    assert disk[2]["shared_bytes"] < disk[2]["standalone_bytes"]
    assert disk[2]["standalone_over_shared"] > disk[1]["standalone_over_shared"]
    assert mem[2]["shared"]["pss_kb"] < mem[2]["standalone"]["pss_kb"]
    assert mem[2]["standalone_over_shared"] > 1 and mem[2]["standalone"]["processes"] == 2
    assert mem[2]["shared"]["rss_kb"] < mem[2]["standalone"]["rss_kb"]
    for m in r["memory"]:
        for variant in ("shared", "standalone", "stock"):
            assert 0 < m[variant]["pss_kb"] <= m[variant]["rss_kb"], (m["adapters"], variant)
    # Load: a further adapter reuses the packed foundation; the warm packed cache really was warm.
    load = r["load"]
    assert load["shared"]["first_ms"] > 0 and len(load["shared"]["further_ms"]) == 1
    assert load["packed_warm"]["warm_reported"] is True and load["packed_cold"]["cache_file_bytes"] > 0
    # Speed for the bare foundation and each adapter; switches measured for all three patterns.
    assert set(r["speed"]["programs"]) == {"base", "a00", "a01"}
    for row in [*r["speed"]["programs"].values(), r["speed"]["standalone"]]:
        assert row["prefill_tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0
    for pattern in ("same", "alternating", "round_robin"):
        assert r["switch"][pattern]["request_ms"] > 0
    # Builds from scratch: one program export each, every adapter written as its data, in either variant.
    assert [(b["adapters"], b["exported"], b["written"]) for b in r["build"]] == [(1, 1, 1), (2, 1, 2)]
    assert [s["produced"] for s in r["standalone_files"]] == ["exported", "written"]
    assert r["checks"] == {"standalone_tokens_match": True}
    # Progress on stderr, the headline table on stdout.
    assert "lora-share build of 2 adapter(s) from scratch" in proc.stderr
    assert proc.stdout.startswith("| adapters |")


def test_markdown_and_plots(bench):
    folder, r, _ = bench
    md = (folder / "results" / "bench.md").read_text()
    assert r["commit"] in md and "| 2 |" in md and "Build time" in md and "Adapter switch" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib (the `bench` extra) is not installed: no plots")
    for name in ("bench_memory.png", "bench_disk.png"):
        assert (folder / "results" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_standalone_programs_hold_every_weight(bench):
    """The stand-alone programs carry every foundation weight (no key from a .ptd) and share one program."""
    from lora_share.deploy.adapter_pte import read_record
    from lora_share.formats import read_pte

    folder, _, _ = bench
    files = [folder / "work" / "standalone" / f"{n}.pte" for n in ("a00", "a01")]
    assert all(read_pte(f).external_keys() == [] for f in files)
    records = [read_record(f.read_bytes(), str(f)) for f in files]
    assert records[0].program_sha256 == records[1].program_sha256 and records[0].lora != records[1].lora


def test_runner_without_ptd(bench, runner_bin):
    """A self-contained program runs without --ptd (as its lora-share twin does with it); a lora-share
    adapter without --ptd is refused with the fix."""
    folder, _, _ = bench
    work = folder / "work"
    alone = subprocess.run(
        [runner_bin, "--pte", work / "standalone" / "a00.pte", "--tokens", "1,2,3", "--max-new-tokens", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert alone.returncode == 0, alone.stderr
    shared = subprocess.run(
        [
            runner_bin,
            "--pte",
            work / "builds" / "n2" / "out" / "a00.pte",
            "--ptd",
            work / "builds" / "n2" / "out" / "foundation.ptd",
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shared.returncode == 0 and alone.stdout == shared.stdout
    refused = subprocess.run(
        [runner_bin, "--pte", work / "builds" / "n2" / "out" / "a00.pte", "--tokens", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "give its foundation.ptd with --ptd" in refused.stderr


def test_bad_counts_is_a_usage_error(tmp_path):
    proc = run_cli("bench", REPO / "configs" / "tiny.yaml", "--counts", "2,1", "--out", tmp_path)
    assert proc.returncode != 0 and "--counts 2,1" in proc.stderr and "Traceback" not in proc.stderr


def test_benchmark_configs_keep_the_foundations_paths(tmp_path):
    """The benchmarks write the config's foundation into configs of their own, in other folders: its
    relative paths (the default config's tokenizer, a checkpoint) must still name the same folders."""
    from lora_share.bench.build_time import resolve_foundation

    (tmp_path / "tok").mkdir()
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "deploy.yaml"
    config.write_text(
        yaml.safe_dump(
            {"foundation": {"checkpoint": "../model", "tokenizer": "../tok", "max_seq_len": 16}, "adapters": []}
        )
    )
    foundation = resolve_foundation(config)
    assert foundation["tokenizer"] == str(tmp_path / "tok")
    assert foundation["checkpoint"] == str(tmp_path / "model")
    assert foundation["max_seq_len"] == 16
