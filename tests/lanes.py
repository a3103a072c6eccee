"""How the suite is split into lanes and spread over both cores.

Lanes: `make test-fast` runs the tests not marked ``slow`` (tiny models, shared session builds);
`make test` runs everything. A test is marked ``slow`` in its file when it exports a model of its own
or a bigger one, or takes more than a few seconds on its own; a test that uses one of BIG is marked
here.

Workers: both lanes run under pytest-xdist with ``--dist loadgroup``. Every test gets an xdist group,
so a worker runs whole groups: a test file is one group (its module fixtures are built once), and
files that use the same fixture of BIG are one group together, so that fixture is built once per run,
not once per worker. Groups run heaviest first (HEAVY_FIRST), so the longest one starts at once and
the other worker fills in around it.
"""

from __future__ import annotations

import pytest

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


def assign_groups(items: list[pytest.Item]) -> None:
    """Mark the users of BIG slow, every item with its xdist group, and order the items group by group,
    heaviest first."""
    parent: dict[str, str] = {}
    files = {item: item.nodeid.split("::")[0] for item in items}
    for item in items:
        for name in set(item.fixturenames) & set(BIG):
            item.add_marker(pytest.mark.slow)
            parent[_find(parent, files[item])] = _find(parent, name)
    groups = {item: _find(parent, files[item]) for item in items}
    for item, group in groups.items():
        item.add_marker(pytest.mark.xdist_group(group.replace("/", "_").replace(".", "_")))
    rank = {_find(parent, name): i for i, name in reversed(list(enumerate(HEAVY_FIRST)))}
    first = {}
    for index, item in enumerate(items):
        first.setdefault(groups[item], index)
    items.sort(key=lambda item: (rank.get(groups[item], len(HEAVY_FIRST)), first[groups[item]]))
