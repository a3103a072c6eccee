"""A tiny deployment of six same-recipe adapters over a foundation of its own (seed 7, unlike
tiny_build's), built once per session: `lora-share build` exports their one program and writes
each adapter as its data, so it costs one export. Shared by test_c_api.py (as "an adapter from
another foundation") and test_budget.py (the budget pool)."""

from __future__ import annotations

from conftest import TINY_CHUNK, TINY_FOUNDATION, Build, build_config, write_config

BUDGET_ADAPTERS = [f"b{i}" for i in range(6)]

_built: dict[str, Build] = {}


def budget_build(tmp_path_factory) -> Build:
    """The deployment (built on first call, then reused)."""
    if "build" not in _built:
        folder = tmp_path_factory.mktemp("budget")
        adapters = [
            {"name": name, "synthetic": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "seed": 10 + i}}
            for i, name in enumerate(BUDGET_ADAPTERS)
        ]
        cfg = write_config(
            folder,
            {"synthetic": {**TINY_FOUNDATION, "seed": 7}, "max_seq_len": 32, "prefill_chunk": TINY_CHUNK},
            adapters,
        )
        _built["build"] = build_config(cfg)
    return _built["build"]
