"""How the suite is split into lanes and spread over both cores.

Lanes: `make test-fast` runs the tests not marked ``slow`` (tiny models, shared session builds);
`make test` runs everything. A test is marked ``slow`` in its file when it exports a model of its own
or a bigger one, or takes more than a few seconds on its own; a test that uses one of BIG is marked
here.

Workers: both lanes run under pytest-xdist, ``--dist loadgroup`` with GroupScheduling as its
scheduler: a worker runs whole groups. A test file is one group (its module fixtures are built once),
and the files that name the same fixture of BIG are one group together, so that fixture is built once
per run, not once per worker. The groups run heaviest first (HEAVY_FIRST), so the longest one starts
at once and the other worker fills in around it. (xdist's own loadgroup reads ``xdist_group`` marks
from a node id that pytest 9 no longer lets a plugin rewrite, so the groups are made here.)
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parent
# Session fixtures of tests/conftest.py that take a minute or more to build (the real model and its
# transformers reference, the demo deployment's 111 MB foundation, the wheel and its venv): their users
# are slow, and run on one worker (`make wheel` also writes into the checkout: two workers must not
# run it at once).
BIG = ("smollm2_build", "hf_smollm2", "demo_build", "wheel_python")
# Groups holding one of these start first, in this order: the real model's build and its tests are
# the longest chain of the suite.
HEAVY_FIRST = ("smollm2_build", "demo_build", "wheel_python")


def _find(parent: dict[str, str], key: str) -> str:
    while parent.setdefault(key, key) != key:
        parent[key] = parent[parent[key]]
        key = parent[key]
    return key


@functools.cache
def _groups() -> tuple[dict[str, str], dict[str, int]]:
    """(test file as in a node id -> its group, group -> its rank in HEAVY_FIRST). Files are joined
    when their source names the same fixture of BIG; read from the files, so the controller (which
    collects nothing) and every worker agree."""
    parent: dict[str, str] = {}
    files = [f"{TESTS.name}/{path.name}" for path in sorted(TESTS.glob("test_*.py"))]
    for file in files:
        text = (TESTS.parent / file).read_text()
        for name in BIG:
            if re.search(rf"\b{name}\b", text):
                parent[_find(parent, file)] = _find(parent, name)
    rank = {_find(parent, name): i for i, name in reversed(list(enumerate(HEAVY_FIRST)))}
    return {file: _find(parent, file) for file in files}, rank


def group_of(nodeid: str) -> str:
    file = nodeid.split("::")[0]
    return _groups()[0].get(file, file)


def mark_and_order(items: list[pytest.Item]) -> None:
    """Mark the users of BIG slow, and order the items group by group, heaviest first (the order
    each worker reports its collection in, and so the order GroupScheduling hands the groups out)."""
    for item in items:
        if set(item.fixturenames) & set(BIG):
            item.add_marker(pytest.mark.slow)
    rank = _groups()[1]
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(group_of(item.nodeid), index)
    items.sort(key=lambda item: (rank.get(group_of(item.nodeid), len(HEAVY_FIRST)), first[group_of(item.nodeid)]))


FILE_SECONDS: dict[str, float] = {}  # test file -> seconds its tests took (setup + call + teardown)
SLOWEST_FILES = 15


def add_time(report: pytest.TestReport) -> None:
    file = report.nodeid.split("::")[0]
    FILE_SECONDS[file] = FILE_SECONDS.get(file, 0.0) + report.duration


def report_files(terminalreporter) -> None:
    """The slowest files and their seconds: where the wall time of a lane goes (a session fixture's
    build counts in the first test that asked for it)."""
    if not FILE_SECONDS:
        return
    terminalreporter.write_sep("=", f"slowest {SLOWEST_FILES} files (seconds of their tests, summed)")
    for file, seconds in sorted(FILE_SECONDS.items(), key=lambda kv: -kv[1])[:SLOWEST_FILES]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {file}  (group {group_of(file)})")
    terminalreporter.write_line(f"{sum(FILE_SECONDS.values()):8.1f}s  in all, over every worker")


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling (a worker takes a whole scope, then the next free one), with our groups
    as the scopes, in collection order (run with --no-loadscope-reorder)."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
