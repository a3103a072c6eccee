"""The C++ runner on damaged files: every one either runs (the damage missed what
matters, e.g. one weight bit) or ends in one ``error:`` line with exit code 1;
never a signal, a hang or a usage error.

Each damaged file is one runner process; rejected files end within a few
milliseconds (the runner's own checks run before ExecuTorch loads anything),
so 1,000 damaged .ptd and 1,000 damaged .pte files take about 8 s each.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from mutations import damaged

RUNS_PER_KIND = 1000
CRASH_GUARD = "the runner crashed"  # et_platform.cpp's message for SIGSEGV/SIGBUS/...


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ptd", "pte"])
def test_runner_rejects_damaged_files_cleanly(tiny_build, runner_bin, tmp_path, kind):
    good_pte, good_ptd = tiny_build.ptes["tiny_a"], tiny_build.ptd
    source = good_ptd if kind == "ptd" else good_pte
    bad = tmp_path / f"damaged.{kind}"
    outcomes: dict[str, dict[str, int]] = {}
    guarded = []
    t0 = time.perf_counter()
    for i, (mutation, blob) in enumerate(damaged(source.read_bytes(), kind, RUNS_PER_KIND, seed=99)):
        bad.write_bytes(blob)
        pte, ptd = (good_pte, bad) if kind == "ptd" else (bad, good_ptd)
        proc = subprocess.run(
            [str(runner_bin), "--pte", pte, "--ptd", ptd, "--tokens", "1,2", "--max-new-tokens", "2"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode in (0, 1), (i, mutation, proc.returncode, proc.stderr)
        if proc.returncode:
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (i, mutation, proc.stderr)
            if CRASH_GUARD in lines[0]:
                guarded.append(mutation)
        result = "ran" if proc.returncode == 0 else "rejected"
        outcomes.setdefault(mutation, {}).setdefault(result, 0)
        outcomes[mutation][result] += 1
    seconds = time.perf_counter() - t0
    print(
        f"\nrunner, {RUNS_PER_KIND} damaged .{kind} files in {seconds:.1f} s: {outcomes}; "
        f"caught only by the crash guard: {len(guarded)} {sorted(set(guarded))}"
    )
    assert "ran" not in outcomes.get("truncate", {}) and "ran" not in outcomes.get("wrong_magic", {})
