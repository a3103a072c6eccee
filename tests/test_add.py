"""Adding adapters to an existing build, and the fast path that makes it take well under a second."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import lora_share
from conftest import TINY_FOUNDATION, build_config, run_cli, write_config
from hf_files import hf_config, write_peft_lora
from lora_share.adapters import load_peft
from lora_share.eager import eager_model
from lora_share.files import sha256_file
from lora_share.foundation import synthetic_foundation
from lora_share.config import SyntheticFoundation
from test_exactness import eager_generation

PROMPT, NEW = [5, 6, 7], 6
QV4 = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
# The tiny foundation as a Hugging Face config, so PEFT files can be written for it.
TINY_HF = hf_config(dim=64, layers=2, heads=4, kv_heads=2, hidden=128, vocab=256)


@pytest.fixture(scope="module")
def same_sig_build(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fast")
    adapters = [
        {"name": "s1", "synthetic": {**QV4, "seed": 11}},
        {"name": "s2", "synthetic": {**QV4, "seed": 12}},
        {"name": "s3", "synthetic": {**QV4, "alpha": 2, "seed": 13}},  # alpha is folded into B: same graph
        {"name": "m", "synthetic": {"rank": 2, "alpha": 4, "target_modules": ["up_proj"], "seed": 14}},
    ]
    return build_config(write_config(folder, {"synthetic": TINY_FOUNDATION, "max_seq_len": 32}, adapters))


def _foundation():
    return synthetic_foundation(SyntheticFoundation(**TINY_FOUNDATION), 32)


def test_same_signature_is_substituted(same_sig_build):
    how = {a["name"]: a["produced"] for a in same_sig_build.manifest["adapters"]}
    assert how == {"s1": "exported", "s2": "substituted", "s3": "substituted", "m": "exported"}
    sigs = {a["name"]: a["signature"] for a in same_sig_build.manifest["adapters"]}
    assert sigs["s1"] == sigs["s2"] == sigs["s3"] != sigs["m"]


def test_substituted_pte_equals_full_export(same_sig_build, tmp_path):
    """The fast path is byte-identical to exporting the adapter on its own."""
    alone = build_config(write_config(tmp_path, {"synthetic": TINY_FOUNDATION, "max_seq_len": 32},
                                      [{"name": "s2", "synthetic": {**QV4, "seed": 12}}]))
    assert alone.manifest["adapters"][0]["produced"] == "exported"
    assert alone.ptes["s2"].read_bytes() == same_sig_build.ptes["s2"].read_bytes()
    assert alone.ptd.read_bytes() == same_sig_build.ptd.read_bytes()


@pytest.fixture(scope="module")
def added(same_sig_build, tmp_path_factory):
    """A copy of the build, then `lora-share add` with one same-signature and one new-signature PEFT adapter."""
    root = tmp_path_factory.mktemp("add")
    out = root / "out"
    shutil.copytree(same_sig_build.out_dir, out)
    ptd = out / "foundation.ptd"
    before = {"sha": sha256_file(ptd), "stat": os.stat(ptd), "ptes": {p.name: p.read_bytes() for p in out.glob("*.pte")}}
    write_peft_lora(root / "fast_peft", TINY_HF, r=4, alpha=32, targets=["q_proj", "v_proj"], seed=21)
    write_peft_lora(root / "new_peft", TINY_HF, r=3, alpha=6, targets=["k_proj", "down_proj"], seed=22)
    r = run_cli("add", "--to", out, f"fast={root / 'fast_peft'}", root / "new_peft")
    assert r.returncode == 0, r.stderr
    return root, out, before


def test_add_leaves_foundation_untouched(added):
    _, out, before = added
    ptd = out / "foundation.ptd"
    after = os.stat(ptd)
    assert sha256_file(ptd) == before["sha"]
    assert (after.st_mtime_ns, after.st_ino, after.st_size) == (
        before["stat"].st_mtime_ns, before["stat"].st_ino, before["stat"].st_size)
    for name, data in before["ptes"].items():
        assert (out / name).read_bytes() == data


def test_add_records_and_runs_new_adapters(added):
    root, out, _ = added
    manifest = lora_share.builder.read_manifest(out) if hasattr(lora_share, "builder") else None
    from lora_share.builder import read_manifest

    manifest = read_manifest(out)
    how = {a["name"]: a["produced"] for a in manifest["adapters"]}
    assert how["fast"] == "substituted" and how["new_peft"] == "exported"
    assert [a["name"] for a in manifest["adapters"]] == ["s1", "s2", "s3", "m", "fast", "new_peft"]
    foundation = _foundation()
    for name, folder in (("fast", root / "fast_peft"), ("new_peft", root / "new_peft")):
        entry = next(a for a in manifest["adapters"] if a["name"] == name)
        assert entry["sha256"] == sha256_file(out / entry["file"])
        got = lora_share.run(out / entry["file"], out / "foundation.ptd", PROMPT, NEW)
        want = eager_generation(eager_model(foundation, load_peft(name, folder, foundation.args)), PROMPT, NEW)
        assert np.abs(got.logits - want.logits).max() <= 1e-4
        assert got.tokens == want.tokens


@pytest.mark.parametrize("name", ["s2", "s3"])
def test_substituted_adapters_match_eager(same_sig_build, name):
    cfg = lora_share.validate(same_sig_build.config)
    foundation = _foundation()
    from lora_share.adapters import load_adapter

    acfg = next(a for a in cfg.adapters if a.name == name)
    want = eager_generation(eager_model(foundation, load_adapter(acfg, foundation.args)), PROMPT, NEW)
    got = lora_share.run(same_sig_build.ptes[name], same_sig_build.ptd, PROMPT, NEW)
    assert np.abs(got.logits - want.logits).max() <= 1e-4 and got.tokens == want.tokens


def test_add_refuses_an_adapter_that_does_not_fit(added):
    root, out, _ = added
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_peft_lora(root / "wide", hf_config(dim=96, heads=4, kv_heads=2), r=2, alpha=4, targets=["q_proj"])
    r = run_cli("add", "--to", out, root / "wide")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "do not fit the foundation" in r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_add_refuses_a_taken_name_and_a_missing_build(added, tmp_path):
    root, out, _ = added
    r = run_cli("add", "--to", out, f"s1={root / 'fast_peft'}")
    assert r.returncode == 2 and "already has an adapter named 's1'" in r.stderr
    r = run_cli("add", "--to", tmp_path, root / "fast_peft")
    assert r.returncode == 2 and "manifest.json: missing" in r.stderr
