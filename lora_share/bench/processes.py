"""Driving the C++ runner for the benchmark: memory of live processes, load times, speed, switches.

Memory is read from ``/proc/PID/smaps_rollup`` and ``/proc/PID/status``, the
files (and fields) the runner's own ``--json`` memory report reads, but from
outside, so that N processes can be measured while all N are alive: PSS divides
the pages they share among them, so their sum is what they cost together. Each
process is measured after it has loaded and answered one request per program.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from .memory import BenchError, run_runner

FIELDS = {"Rss": "rss_kb", "Pss": "pss_kb", "Pss_Anon": "anon_kb", "Pss_File": "file_kb"}


def process_memory(pid: int) -> dict:
    """The runner's ``memory`` fields of a live process: rss_kb, pss_kb, anon_kb, file_kb, peak_rss_kb."""
    out = {}
    for path, wanted in ((f"/proc/{pid}/smaps_rollup", FIELDS), (f"/proc/{pid}/status", {"VmHWM": "peak_rss_kb"})):
        with open(path) as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in wanted:
                    out[wanted[name]] = int(rest.split()[0])
    return out


def sum_memory(rows: list[dict]) -> dict:
    return {k: sum(r[k] for r in rows) for k in rows[0]}


class Server:
    """``runner --serve`` over some programs; ``ask`` sends one request and waits for its answer."""

    def __init__(
        self, runner: Path, ptes: list[Path], ptd: Path | None = None, extra: list[str] = (), max_new_tokens: int = 1
    ):
        cmd = [str(runner)] + (["--ptd", str(ptd)] if ptd else [])
        for pte in ptes:
            cmd += ["--pte", str(pte)]
        # --ignore-eos: every request decodes max_new_tokens, so throughput is measured over the same
        # number of tokens whatever the model says (a build with a tokenizer has EOS ids).
        cmd += ["--serve", "--max-new-tokens", str(max_new_tokens), "--ignore-eos", *extra]
        self.cmd, self.names = cmd, [Path(p).stem for p in ptes]
        self._stderr = tempfile.NamedTemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 600.0) -> None:
        """Until the runner says every program is loaded (its ``ready:`` line on stderr)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.stderr_text()
            if "ready:" in text:
                return
            if self.proc.poll() is not None:
                raise BenchError(f"{' '.join(self.cmd)} exited ({self.proc.returncode}): {text.strip()}")
            time.sleep(0.02)
        self.close()
        raise BenchError(f"{' '.join(self.cmd)}: not ready after {timeout:.0f} s")

    def ask(self, name: str, tokens: list[int]) -> tuple[dict, float]:
        """(the answer, wall-clock seconds from sending the line to reading the answer)."""
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write(f"{name}\t{','.join(map(str, tokens))}\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        seconds = time.perf_counter() - t0
        if not line:
            raise BenchError(f"{' '.join(self.cmd)} exited ({self.proc.poll()}): {self.stderr_text().strip()}")
        answer = json.loads(line)
        if "error" in answer:
            raise BenchError(f"{' '.join(self.cmd)}: request for {name} failed: {answer['error']}")
        return answer, seconds

    def stderr_text(self) -> str:
        """What the runner wrote to stderr so far (read through a handle of our own: the runner
        writes through the file's shared offset, which seeking ours would move)."""
        with open(self._stderr.name) as f:
            return f.read()

    def warm(self, tokens: list[int]) -> None:
        """Load is over and every program has run once."""
        for name in self.names:
            self.ask(name, tokens)

    def memory(self) -> dict:
        return process_memory(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HttpServerProcess:
    """A server child process (lora-share-server, llama-server) whose output goes to the log file
    ``self._log``: its memory, its CPU time, and a stop that waits for it (SIGTERM, then SIGKILL after 30 s)."""

    proc: subprocess.Popen

    def memory(self) -> dict:
        return process_memory(self.proc.pid)

    def cpu_seconds(self) -> float:
        """The CPU time (user + system, every thread) the process has used: /proc/PID/stat's utime + stime."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def memory_one_process(runner: Path, ptes: list[Path], ptd: Path, extra: list[str], prompt: list[int]) -> dict:
    """One runner process with every program of ``ptes`` loaded (and run once)."""
    with Server(runner, ptes, ptd, extra) as server:
        server.warm(prompt)
        return server.memory()


def memory_processes(runner: Path, ptes: list[Path], prompt: list[int]) -> dict:
    """One runner process per self-contained program, all alive at once: summed, and per process."""
    with ExitStack() as stack:
        servers = [stack.enter_context(Server(runner, [pte])) for pte in ptes]
        for server in servers:
            server.warm(prompt)
        per = [server.memory() for server in servers]
    return {**sum_memory(per), "processes": len(per), "per_process": per}


def load_times(runner: Path, ptd: Path | None, ptes: list[Path], extra: list[str], repeats: int) -> dict:
    """Per-program load times (ms) from the runner's ``--json``, the median of ``repeats`` starts."""
    runs = [run_runner(runner, ptd, ptes, extra) for _ in range(repeats)]
    per = [statistics.median(r["adapters"][i]["load_ms"] for r in runs) for i in range(len(ptes))]
    return {
        "first_ms": round(per[0], 2),
        "further_ms": [round(x, 2) for x in per[1:]],
        "further_median_ms": round(statistics.median(per[1:]), 2) if len(per) > 1 else None,
        "session_ms": round(statistics.median(r["load_ms"] for r in runs), 2),
        "programs": len(ptes),
    }


def start_times(runner: Path, ptd: Path, ptes: list[Path], extra: list[str], repeats: int) -> dict:
    """Load time (ms, the runner's ``load_ms``) with default flags on the first start, which packs the
    weights and writes the packed-weights file, and from the second start on (the median of ``repeats``),
    which maps it. The file the runner reports is removed first so that the first start really is one."""
    first = run_runner(runner, ptd, ptes, extra)
    cache = first["loading"]["packed_cache"]
    if not cache:
        raise BenchError(f"{runner} used no packed-weights file with default flags (see its stderr)")
    Path(cache).unlink()
    cold = run_runner(runner, ptd, ptes, extra)
    warm = [run_runner(runner, ptd, ptes, extra) for _ in range(repeats)]
    if cold["loading"]["packed_cache_warm"] or not all(w["loading"]["packed_cache_warm"] for w in warm):
        raise BenchError(f"{runner}: the packed-weights file {cache} was not written once and then mapped")
    return {
        "first_ms": round(cold["load_ms"], 1),
        "second_ms": round(statistics.median(w["load_ms"] for w in warm), 1),
        "file": cache,
    }


def speeds(programs: dict[str, tuple[Server, str]], prompt: list[int], repeats: int) -> dict:
    """Median prefill and decode tokens/s per program: label -> (a server, the name it serves the program by).

    Requests go round-robin over every program, across servers, one at a time, so
    that the machine's noise hits them all alike.
    """
    for server, name in programs.values():  # the first request of a program touches its pages: not timed
        server.ask(name, prompt)
    samples = {label: [] for label in programs}
    for _ in range(repeats):
        for label, (server, name) in programs.items():
            samples[label].append(server.ask(name, prompt)[0])
    return {
        name: {
            "prefill_tokens_per_s": round(statistics.median(a["prefill_tokens_per_s"] for a in answers), 1),
            "decode_tokens_per_s": round(statistics.median(a["decode_tokens_per_s"] for a in answers), 1),
            "tokens": answers[0]["tokens"],
        }
        for name, answers in samples.items()
    }


def _quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def switch_times(server: Server, names: list[str], prompt: list[int], rounds: int, block: int = 8) -> dict:
    """Request latency (ms, median) when every request goes to the same adapter, alternates
    between two, or goes round-robin over all of ``names``. Blocks of the three patterns
    are interleaved (in a rotating order), so machine noise affects them alike; the
    interquartile range of same-adapter requests says how much noise there is.
    """
    patterns = {"same": [names[0]], "alternating": names[:2], "round_robin": names}
    order = list(patterns)
    wall = {p: [] for p in patterns}
    inside = {p: [] for p in patterns}
    for name in names:
        server.ask(name, prompt)
    for r in range(rounds):
        for pattern in order[r % 3 :] + order[: r % 3]:
            cycle = patterns[pattern]
            for i in range(block + 1):
                answer, seconds = server.ask(cycle[i % len(cycle)], prompt)
                if i == 0:
                    continue  # the first of a block follows another pattern's request
                wall[pattern].append(seconds * 1e3)
                inside[pattern].append(answer["prefill_ms"] + answer["decode_ms"])
    out = {
        p: {
            "request_ms": round(statistics.median(wall[p]), 3),
            "compute_ms": round(statistics.median(inside[p]), 3),
            "requests": len(wall[p]),
        }
        for p in patterns
    }
    lo, hi = _quartiles(wall["same"])
    out["same"]["iqr_ms"] = round(hi - lo, 3)
    for p in ("alternating", "round_robin"):
        out[p]["switch_overhead_ms"] = round(out[p]["request_ms"] - out["same"]["request_ms"], 3)
    return out
