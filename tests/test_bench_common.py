"""bench/common.py: every benchmark's results start with one header (date, command, commit, dirty,
machine), checked against git itself, and no benchmark module reaches into another's private names."""

from __future__ import annotations

import ast
import subprocess
from datetime import datetime

from conftest import REPO

from lora_share.bench.common import HEADER_KEYS, header_line, results_header

BENCH = REPO / "lora_share" / "bench"
# The modules of the bench commands (bench, bench-scale, bench-budget, bench-quality, bench-peers,
# bench-serve) and of build_time's results.
WRITERS = ("run.py", "scale.py", "budget.py", "quality.py", "peers.py", "serve.py", "build_time.py")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_header_records_the_checkout_as_git_sees_it():
    header = results_header("lora-share bench-x --flag")
    assert tuple(header) == HEADER_KEYS
    assert header["command"] == "lora-share bench-x --flag"
    assert header["commit"] == git("rev-parse", "--short", "HEAD")
    assert header["dirty"] is bool(git("status", "--porcelain", "--untracked-files=no"))
    assert datetime.fromisoformat(header["date"]).tzinfo is not None
    assert header["machine"]["cpus"] >= 1 and header["machine"]["python"]
    line = header_line(header)
    assert f"commit {header['commit']}" in line and "`lora-share bench-x --flag`" in line
    assert ("with uncommitted changes" in line) is header["dirty"]


def test_every_bench_command_writes_the_header():
    """Each module that writes a results file builds it with results_header (named in a call)."""
    for name in WRITERS:
        tree = ast.parse((BENCH / name).read_text())
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "results_header" in calls, f"lora_share/bench/{name} writes results without results_header"


def test_no_bench_module_imports_another_ones_private_names():
    private = []
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                private += [f"{path.name}: from {node.module} import {a.name}" for a in node.names if a.name[0] == "_"]
    assert not private, private
