"""Small modules with one job each: no Python source file of the package is over 800 lines (the
project's limit; split a file that grows past it by job, as bench/peers*.py and bench/scale*.py are)."""

from __future__ import annotations

from conftest import REPO

MAX_LINES = 800


def test_no_package_module_is_over_800_lines():
    sizes = {p.relative_to(REPO): len(p.read_text().splitlines()) for p in (REPO / "lora_share").rglob("*.py")}
    assert len(sizes) > 50, "the package's modules were not found"
    over = {str(p): n for p, n in sizes.items() if n > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines: {over}"
