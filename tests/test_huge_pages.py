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


def kernel_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return platform.system() == "Linux" and found is not None and (int(found[1]), int(found[2])) >= (major, minor)


def kernel_has_madv_collapse() -> bool:
    """MADV_COLLAPSE came with Linux 6.1."""
    return kernel_at_least(6, 1)


def file_system(path: Path) -> str:
    """The type of the file system ``path`` is on (the longest mount point above it in /proc/mounts)."""
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if (
            len(fields) > 2
            and str(path.resolve()).startswith(fields[1].rstrip("/") + "/")
            and len(fields[1]) > len(best)
        ):
            best, kind = fields[1], fields[2]
    return kind


def page_cache_has_large_folios(path: Path) -> bool:
    """Whether the page cache can hold ``path``'s file in 2 MiB folios: xfs since Linux 5.18, ext4 since 6.16."""
    fs = file_system(path)
    return (fs == "xfs" and kernel_at_least(5, 18)) or (fs == "ext4" and kernel_at_least(6, 16))


def file_pmd_kb(pid: int) -> int:
    """FilePmdMapped of a live process: its file pages mapped in 2 MiB pages."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("FilePmdMapped:"):
            return int(line.split()[1])
    return 0


def run(runner_bin: Path, out: Path, npy: Path, *flags: str) -> dict:
    done = run_runner(
        runner_bin,
        "--pte",
        out / "counter.pte",
        "--ptd",
        out / "foundation.ptd",
        "--tokens",
        "1,2,3",
        "--max-new-tokens",
        4,
        "--ignore-eos",
        "--json",
        "--dump-logits",
        npy,
        *flags,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_packed_weights_in_huge_pages_change_no_logit(demo_build, runner_bin, tmp_path):
    # Packed in memory (the heap's pages are what this collapses), not mapped from the packed-weights file.
    small = run(runner_bin, demo_build, tmp_path / "4k.npy", "--no-huge-pages", "--no-packed-cache")
    huge = run(runner_bin, demo_build, tmp_path / "2m.npy", "--no-packed-cache")
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


@pytest.mark.slow
def test_packed_weights_file_mapped_in_huge_pages(demo_build, runner_bin, tmp_path):
    """The packed-weights file (runtime/platform/packed_cache.h), written by one process, is mapped by the next
    in 2 MiB pages, as llama.cpp's GGUF is: its writer reads it back into 2 MiB page-cache folios
    (settle_file_in_huge_folios, huge_pages.h). In 4 KiB pages decode ran 25% slower than packed in memory."""
    from lora_share.bench.processes import Server

    cache = tmp_path / "packed"
    first = run(runner_bin, demo_build, tmp_path / "first.npy", "--packed-cache", str(cache))
    files = list(cache.glob("*.bin"))
    assert len(files) == 1, files
    with Server(
        runner_bin, [demo_build / "counter.pte"], demo_build / "foundation.ptd", extra=["--packed-cache", str(cache)]
    ) as later:
        later.warm([1, 2, 3])
        mapped_kb = file_pmd_kb(later.proc.pid)
    if thp_mode() in ("madvise", "always") and page_cache_has_large_folios(cache):
        assert mapped_kb >= files[0].stat().st_size // 1024 // 2, (mapped_kb, files[0].stat().st_size)
    again = run(runner_bin, demo_build, tmp_path / "again.npy", "--packed-cache", str(cache))
    assert again["tokens"] == first["tokens"]
    assert np.array_equal(np.load(tmp_path / "first.npy"), np.load(tmp_path / "again.npy"))
