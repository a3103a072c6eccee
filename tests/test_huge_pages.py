"""The runner collapses its packed weights into 2 MiB pages after loading (runtime/platform/huge_pages.cpp).

Decode streams every packed weight once per token; llama.cpp's memory-mapped GGUF sits in the page
cache's 2 MiB folios, lora-share's packed copy in heap pages. Checked on the demo deployment (111 MB
float32 foundation, packed by XNNPACK into ~110 MB of heap) against the same runner with
--no-huge-pages, by the kernel's own accounting (AnonHugePages in /proc/<pid>/smaps_rollup, reported as
huge_kb): most of the packed weights in huge pages, resident memory not grown, logits bit for bit equal.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import numpy as np
import pytest

from test_cpp_runner import run_runner

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """The bracketed mode of /sys/kernel/mm/transparent_hugepage/enabled, None if absent."""
    text = THP.read_text() if THP.exists() else ""
    found = re.search(r"\[(\w+)\]", text)
    return found.group(1) if found else None


def kernel_has_madv_collapse() -> bool:
    """MADV_COLLAPSE came with Linux 6.1."""
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return platform.system() == "Linux" and found is not None and (int(found[1]), int(found[2])) >= (6, 1)


def run(runner_bin: Path, out: Path, npy: Path, *flags: str) -> dict:
    done = run_runner(runner_bin, "--pte", out / "counter.pte", "--ptd", out / "foundation.ptd", "--tokens", "1,2,3",
                      "--max-new-tokens", 4, "--ignore-eos", "--json", "--dump-logits", npy, *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_packed_weights_in_huge_pages_change_no_logit(demo_build, runner_bin, tmp_path):
    small = run(runner_bin, demo_build, tmp_path / "4k.npy", "--no-huge-pages")
    huge = run(runner_bin, demo_build, tmp_path / "2m.npy")
    assert np.array_equal(np.load(tmp_path / "4k.npy"), np.load(tmp_path / "2m.npy"))
    assert small["tokens"] == huge["tokens"]
    before, after = small["memory"]["after_load"], huge["memory"]["after_load"]
    if thp_mode() == "madvise":  # nothing asks for huge pages but the runner
        assert before["huge_kb"] == 0, before
    if thp_mode() in ("madvise", "always") and kernel_has_madv_collapse():
        foundation_kb = (demo_build / "foundation.ptd").stat().st_size // 1024
        assert after["huge_kb"] >= foundation_kb // 2, (after, foundation_kb)
    # Only ranges already fully resident are collapsed: no page is added.
    assert after["rss_kb"] <= before["rss_kb"] + 4096, (before, after)
