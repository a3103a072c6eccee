"""What every benchmark shares: the header its results file starts with (when, the command, the commit,
whether the tree had uncommitted changes, the machine), its progress lines with their times, the
results written whole or not at all, and the synthetic prompts.

Every bench command (bench, bench-scale, bench-envelope, bench-budget, bench-quality, bench-peers, bench-serve) puts
``results_header`` first in its results, so a figure in the README can be traced to the commit and
machine that measured it (tests/test_readme.py checks each "Measured" row against its file).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..errors import UserError

HEADER_KEYS = ("date", "command", "commit", "dirty", "machine")


def git(*args: str) -> str:
    """``git ARGS`` in this package's checkout: its output, or "" outside one (an installed wheel)."""
    try:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=30)
        return proc.stdout.strip() if proc.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine() -> dict:
    """The machine and the software the figures were measured with."""
    cpu, mem_kb = platform.processor() or platform.machine(), 0
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            mem_kb = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration):
        pass
    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1024**2, 1),
        "torch": _version("torch"),
        "executorch": _version("executorch"),
    }


def results_header(command: str) -> dict:
    """The keys every results file starts with (``HEADER_KEYS``): now, ``command`` as typed, the commit
    ("unknown" outside a checkout), whether tracked files had uncommitted changes, ``machine()``."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "commit": git("rev-parse", "--short", "HEAD") or "unknown",
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": machine(),
    }


def header_line(result: dict) -> str:
    """The header as the first line of a results page: date, commit (marked when dirty), CPU, command."""
    m = result["machine"]
    dirty = " with uncommitted changes" if result["dirty"] else ""
    return (
        f"{result['date']}, commit {result['commit']}{dirty}, {m.get('cpu', 'unknown CPU')}, "
        f"{m.get('cpus', '?')} CPUs. Command: `{result['command']}`."
    )


def typed_command(name: str) -> str:
    """``lora-share NAME ...`` as it was typed, for a benchmark's results."""
    return f"lora-share {name} " + " ".join(sys.argv[2:])


def at_least(low: int):
    """An argparse type: a whole number, ``low`` or more."""

    def parse(text: str) -> int:
        import argparse

        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return parse


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary file renamed over it)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def prompt_ids(n: int, vocab: int) -> list[int]:
    """``n`` token ids spread over a vocabulary of ``vocab``: the synthetic benchmarks' prompt."""
    return [(7 * i + 1) % vocab for i in range(n)]


class BenchFailed(UserError):
    """A measurement failed (the runner's own message is in it): exit 1."""

    exit_code = 1


class Progress:
    """Progress lines on stderr with the seconds since the start; ``step`` also records each step's time."""

    def __init__(self, quiet: bool):
        self.t0, self.quiet, self.steps = time.perf_counter(), quiet, {}

    @contextmanager
    def step(self, key: str, what: str):
        start = time.perf_counter()
        self.say(f"{what} ...")
        yield
        seconds = time.perf_counter() - start
        self.steps[key] = round(seconds, 2)
        self.say(f"  {what}: {seconds:.1f} s")

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:6.1f} s] {msg}", file=sys.stderr, flush=True)
