"""On-demand adapters under a memory budget (ls_open_dir), through the C library.

Six same-recipe adapters (tests/budget_build.py), equal in size, served with a budget for exactly two:
every adapter answers with build/runner's tokens, resident adapters never exceed two, and the loads,
evictions and hits are the ones an independent LRU model of the request sequence predicts. Under
concurrency (several KV slots, requests and loads from several threads at once) the accounted bytes,
read from another thread all along, never exceed the budget, and every answer is the one given
without a budget; the same through lora-share-server's --memory-budget and /v1/stats. Then the
benchmark (`lora-share bench-budget`) runs end to end on the same deployment.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from batch_script import diag_generate
from budget_build import BUDGET_ADAPTERS, budget_build
from conftest import TINY_FOUNDATION, run_cli
from test_server import Server, server_bin  # noqa: F401 (a fixture)

from lora_share.formats import read_pte
from lora_share.inference import c_library as native

pytestmark = pytest.mark.slow  # its own six-adapter build, and bench-budget end to end

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # longer than the prefill chunk: two forward calls
NEW = 6
# Sampled hot, with a seed: the tiny adapters' greedy answers coincide (they repeat the last token),
# their samples do not, and the library and the runner draw from one generator, so sampled ids are
# exact too.
SAMPLING = {"temperature": 10.0, "seed": 3}
# Hits and misses mixed, returns to evicted adapters, every adapter at least once.
SEQUENCE = ["b0", "b1", "b0", "b2", "b1", "b3", "b3", "b4", "b5", "b0", "b5", "b2", "b4", "b1"]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    return budget_build(tmp_path_factory)


@pytest.fixture(scope="module")
def runner_answers(runner_bin, deployment) -> dict[str, list[int]]:
    """build/runner with all six loaded, asked for each adapter."""
    out = {}
    ptes = [arg for pte in deployment.ptes.values() for arg in ("--pte", str(pte))]
    for name in BUDGET_ADAPTERS:
        proc = subprocess.run(
            [
                str(runner_bin),
                "--ptd",
                str(deployment.ptd),
                *ptes,
                "--adapter",
                name,
                "--tokens",
                ",".join(map(str, PROMPT)),
                "--max-new-tokens",
                str(NEW),
                "--temperature",
                str(SAMPLING["temperature"]),
                "--seed",
                str(SAMPLING["seed"]),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        out[name] = [int(t) for t in proc.stdout.split()]
    assert len({tuple(v) for v in out.values()}) > 1, "the adapters should not all answer alike"
    return out


def lru_model(sequence: list[str], capacity: int) -> list[tuple[int, int, int, tuple[str, ...]]]:
    """(loads, evictions, hits, resident set) after each request, for an LRU cache of ``capacity``."""
    cache: OrderedDict[str, None] = OrderedDict()
    loads = evictions = hits = 0
    states = []
    for name in sequence:
        if name in cache:
            hits += 1
            cache.move_to_end(name)
        else:
            if len(cache) == capacity:
                cache.popitem(last=False)
                evictions += 1
            cache[name] = None
            loads += 1
        states.append((loads, evictions, hits, tuple(sorted(cache))))
    return states


def budget_for(folder, adapters: int, library) -> int:
    with native.open_dir(folder, library=library) as probe:
        s = probe.stats()
    assert s["adapters_known"] == len(BUDGET_ADAPTERS) and s["adapters_resident"] == 0
    return s["foundation_bytes"] + s["program_bytes"] + s["arena_bytes"] + adapters * s["largest_adapter_bytes"]


def test_budget_for_two_serves_all_six_in_lru_order(deployment, runner_answers, runner_bin):
    library = runner_bin.parent / "liblora_share.so"
    budget = budget_for(deployment.out_dir, 2, library)
    expected = lru_model(SEQUENCE, 2)
    with native.open_dir(deployment.out_dir, budget_bytes=budget, library=library) as rt:
        handles = {name: rt.adapter(name) for name in BUDGET_ADAPTERS}
        for name, (loads, evictions, hits, resident) in zip(SEQUENCE, expected):
            assert rt.generate(name, PROMPT, NEW, **SAMPLING) == runner_answers[name], name
            s = rt.stats()
            assert (s["loads"], s["evictions"], s["hits"]) == (loads, evictions, hits), name
            assert s["adapters_resident"] == len(resident) <= 2
            assert tuple(sorted(n for n, h in handles.items() if h.resident)) == resident
            assert (
                s["resident_adapter_bytes"] + s["foundation_bytes"] + s["program_bytes"] + s["arena_bytes"]
            ) <= budget
            assert s["last_load_ms"] > 0
        assert set(SEQUENCE) == set(BUDGET_ADAPTERS)


def test_accounted_adapter_cost_is_the_documented_rule(deployment, runner_bin):
    """lora_share.h: an adapter is 1.05 x its own LoRA bytes + the overhead (512 KiB unless set); its
    program 1.2 x the .pte without the adapter's data + 4 MiB per method (forward and decode, and decode_batch
    when one slot speculates, the default); the foundation its file + 8 MiB."""
    library = runner_bin.parent / "liblora_share.so"
    entries = deployment.manifest["adapters"]
    assert len({e["lora_bytes"] for e in entries}) == 1 and not any(e.get("hoisted") for e in entries)
    own = entries[0]["lora_bytes"]
    pte = read_pte(deployment.ptes[entries[0]["name"]].read_bytes())
    program = pte.size - sum(d.size for d in pte.named_data)  # its own data: LoRA tensors and record
    assert sum(d.size for d in pte.named_data) > own
    ptd = deployment.ptd.stat().st_size
    for overhead, expected, speculation in ((0, 512 << 10, True), (1 << 20, 1 << 20, False)):
        with native.open_dir(
            deployment.out_dir, adapter_overhead_bytes=overhead, library=library, speculation=speculation
        ) as rt:
            s = rt.stats()
        assert s["largest_adapter_bytes"] == own + own // 20 + expected
        methods = 3 if speculation else 2
        assert s["program_bytes"] == program + program // 5 + methods * (4 << 20)
        assert s["foundation_bytes"] == ptd + (8 << 20) and s["arena_bytes"] > 0  # + the runtime's state


def test_a_budget_one_byte_short_holds_one_fewer(deployment, runner_bin):
    library = runner_bin.parent / "liblora_share.so"
    budget = budget_for(deployment.out_dir, 3, library) - 1
    with native.open_dir(deployment.out_dir, budget_bytes=budget, library=library) as rt:
        for name in SEQUENCE:
            rt.generate(name, PROMPT, 1)
            assert rt.stats()["adapters_resident"] <= 2
        assert rt.stats()["evictions"] == lru_model(SEQUENCE, 2)[-1][1]


def test_without_a_budget_nothing_is_evicted(deployment, runner_bin):
    with native.open_dir(deployment.out_dir, library=runner_bin.parent / "liblora_share.so") as rt:
        for name in SEQUENCE:
            rt.generate(name, PROMPT, 1)
        s = rt.stats()
    assert (s["adapters_resident"], s["loads"], s["evictions"]) == (6, 6, 0)


# --- Under concurrency: requests and loads from several threads at once (issue 58) ----------------------

PARALLEL = 4
CONCURRENT = BUDGET_ADAPTERS[:4]  # four requests at once on four adapters, under a budget for two


def accounted(s: dict) -> int:
    return s["foundation_bytes"] + s["program_bytes"] + s["arena_bytes"] + s["resident_adapter_bytes"]


class Watch:
    """Reads ls_stats from its own thread until stopped: the largest accounted total and resident count seen."""

    def __init__(self, rt):
        self.rt, self.most, self.most_resident, self.reads = rt, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        while not self._stop.is_set():
            s = self.rt.stats()
            self.most, self.reads = max(self.most, accounted(s)), self.reads + 1
            self.most_resident = max(self.most_resident, s["adapters_resident"])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def at_once(jobs):
    """Every job (a callable) on its own thread, released together; their results in order."""
    barrier = threading.Barrier(len(jobs))

    def run(job):
        barrier.wait()
        return job()

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(run, jobs))


def ask(rt, adapter) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and their logits rows (the adapters' greedy tokens coincide; their logits do not)."""
    return diag_generate(rt, adapter.handle, PROMPT, NEW, TINY_FOUNDATION["vocab_size"])


@pytest.fixture(scope="module")
def unbudgeted(deployment, runner_bin):
    """Each CONCURRENT adapter's answer on a runtime of PARALLEL slots without a budget, one at a time; and
    the budget for the foundation, its program, the arena of PARALLEL slots and two adapters."""
    with native.open_dir(deployment.out_dir, parallel=PARALLEL, library=runner_bin.parent / "liblora_share.so") as rt:
        answers = {name: ask(rt, rt.adapter(name)) for name in CONCURRENT}
        s = rt.stats()
    return answers, s["foundation_bytes"] + s["program_bytes"] + s["arena_bytes"] + 2 * s["largest_adapter_bytes"]


def assert_answers(got: dict, expected: dict) -> None:
    for name, (tokens, logits) in got.items():
        assert tokens == expected[name][0], name
        np.testing.assert_allclose(logits, expected[name][1], atol=1e-4, rtol=0, err_msg=name)


def test_four_requests_on_four_adapters_under_a_budget_for_two(deployment, runner_bin, unbudgeted):
    """The two requests that do not fit wait for a running one to end (its adapter is then evicted) instead
    of loading beside them: the accounted total never exceeds the budget, the answers are the unbudgeted."""
    expected, budget = unbudgeted
    library = runner_bin.parent / "liblora_share.so"
    with native.open_dir(deployment.out_dir, budget_bytes=budget, parallel=PARALLEL, library=library) as rt:
        handles = [rt.adapter(name) for name in CONCURRENT]
        with Watch(rt) as watch:
            got = at_once([lambda h=h: ask(rt, h) for h in handles])
        s = rt.stats()
    assert_answers(dict(zip(CONCURRENT, got)), expected)
    assert watch.reads > 1 and watch.most <= budget and accounted(s) <= budget, (watch.most, accounted(s), budget)
    assert watch.most_resident <= 2 and s["loads"] == 4 and s["evictions"] >= 2


def test_adapters_loaded_from_threads_at_once_keep_the_budget(deployment, runner_bin, unbudgeted):
    """ls_load_adapter from four threads at once on a runtime of the foundation alone, each thread then
    asking its adapter: a load whose room running requests hold registers the adapter, which loads when its
    request gets room; the accounted total never exceeds the budget."""
    expected, budget = unbudgeted
    library = runner_bin.parent / "liblora_share.so"
    with native.open(deployment.ptd, budget_bytes=budget, parallel=PARALLEL, library=library) as rt:

        def load_and_ask(name):
            return ask(rt, rt.load_adapter(deployment.ptes[name]))

        with Watch(rt) as watch:
            got = at_once([lambda n=name: load_and_ask(n) for name in CONCURRENT])
        s = rt.stats()
    assert_answers(dict(zip(CONCURRENT, got)), expected)
    assert watch.most <= budget and accounted(s) <= budget and watch.most_resident <= 2
    assert s["adapters_known"] == 4


class StatsWatch:
    """GET /v1/stats from its own thread until stopped: the largest accounted total and resident count seen."""

    def __init__(self, server):
        self.server, self.most, self.most_resident, self.reads = server, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        while not self._stop.is_set():
            status, s = self.server.request("GET", "/v1/stats")
            assert status == 200, s
            self.most, self.reads = max(self.most, accounted(s)), self.reads + 1
            self.most_resident = max(self.most_resident, s["adapters_resident"])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def serve_completion(server, name) -> list[int]:
    # Greedy with a repeat penalty: the tiny adapters all repeat the last token, and the penalty leaves the
    # choice to the next tokens, where they differ.
    body = {"model": name, "prompt": PROMPT, "max_tokens": NEW, "ignore_eos": True, "repeat_penalty": 2.0}
    status, answer = server.request("POST", "/v1/completions", body)
    assert status == 200, answer
    return answer["choices"][0]["tokens"]


def test_server_four_requests_on_four_adapters_under_a_budget_for_two(deployment, server_bin):  # noqa: F811
    """lora-share-server --parallel 4: each CONCURRENT adapter asked alone without a budget (the reference, and
    the budget: the foundation, its program, the slots and two adapters, from /v1/stats), then all four at once
    under --memory-budget: the same tokens, and /v1/stats read all along never above the budget."""
    free = Server(server_bin, deployment.out_dir, "--parallel", PARALLEL)
    try:
        expected = [serve_completion(free, name) for name in CONCURRENT]
        _, s = free.request("GET", "/v1/stats")
    finally:
        free.stop()
    assert len({tuple(t) for t in expected}) > 1, "the adapters should not all answer alike"
    one_adapter = s["resident_adapter_bytes"] // s["adapters_resident"]  # same recipe, same size
    budget = s["foundation_bytes"] + s["program_bytes"] + s["arena_bytes"] + 2 * one_adapter
    server = Server(server_bin, deployment.out_dir, "--parallel", PARALLEL, "--memory-budget", budget)
    try:
        with StatsWatch(server) as watch:
            got = at_once([lambda n=name: serve_completion(server, n) for name in CONCURRENT])
        _, s = server.request("GET", "/v1/stats")
    finally:
        server.stop()
    assert got == expected
    assert s["budget_bytes"] == budget and s["loads"] == 4 and s["evictions"] >= 2, s
    assert watch.reads > 1 and watch.most <= budget and accounted(s) <= budget, (watch.most, accounted(s), budget)
    assert watch.most_resident <= 2


def test_bench_budget_runs_end_to_end(deployment, runner_bin, tmp_path):
    out = tmp_path / "bench_budget.json"
    proc = run_cli(
        "bench-budget", "--deployment", deployment.out_dir, "--resident", "2", "--requests", "12", "--out", out
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PSS within the budget: yes" in proc.stdout and "p50 / p99" in proc.stdout
    result = json.loads(out.read_text())
    b, a = result["budget"], result["all"]
    assert result["answers_equal"] and result["pss_within_budget"]
    assert b["max_resident"] <= 2 and b["evictions"] > 0 and a["max_resident"] == 6 and a["evictions"] == 0
    assert 0 < b["max_pss_growth"] <= b["budget_bytes"]
    assert b["requests"] == 6 + 12 and b["load_ms"]["p50"] > 0


def test_bench_budget_refuses_a_folder_without_manifest(tmp_path):
    proc = run_cli("bench-budget", "--deployment", tmp_path, "--out", "-")
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "manifest.json" in proc.stderr
    assert "Traceback" not in proc.stderr
