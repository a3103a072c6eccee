"""dedup.shared_adapter_tensors: hoist — tensors several adapters have, stored once in adapters_shared.ptd.

References: the adapters' own tensors (regenerated from the config), the bytes of
every written file, and the eager PyTorch model.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest
import torch
import yaml
from conftest import HOIST_ADAPTERS, TINY_FOUNDATION, build_config, run_cli, write_config
from hf_files import hf_config, write_peft_lora
from safetensors.torch import load_file, save_file
from test_exactness import eager_generation

import lora_share
from lora_share.checkpoints.adapters import load_adapter, load_peft
from lora_share.checkpoints.foundation import load_foundation
from lora_share.export.eager import eager_model
from lora_share.files import sha256_file
from lora_share.formats import read_ptd, read_pte
from lora_share.formats.meta import ADAPTER_KEY, SHARED_KEY
from lora_share.formats.shared_ptd import encode_shared_ptd
from lora_share.manifest import read_manifest

PROMPT, NEW = [1, 17, 42, 7], 6
TINY_HF = hf_config(dim=64, layers=2, heads=4, kv_heads=2, hidden=128, vocab=256)


def _adapters(build):
    cfg = lora_share.validate(build.config)
    foundation = load_foundation(cfg.foundation)
    return foundation, {a.name: load_adapter(a, foundation.args) for a in cfg.adapters}


@pytest.fixture(scope="module")
def hoisted(hoisted_build):
    return (hoisted_build, *_adapters(hoisted_build))


def _tensors(adapter) -> dict[tuple, bytes]:
    """(layer, target, 'a' or 'b') -> the raw float32 bytes of that LoRA matrix."""
    return {
        (layer, target, which): t.tobytes()
        for (layer, target), pair in adapter.weights.items()
        for which, t in zip("ab", pair)
    }


def _keys(adapter) -> dict[tuple, str]:
    """(layer, target, 'a' or 'b') -> the sha256 of its bytes: the key its record names it by."""
    return {slot: hashlib.sha256(data).hexdigest() for slot, data in _tensors(adapter).items()}


def _holders(adapters) -> dict[str, set[str]]:
    """sha256 of each tensor's bytes -> the adapters that have it."""
    out: dict[str, set[str]] = {}
    for name, adapter in adapters.items():
        for digest in _keys(adapter).values():
            out.setdefault(digest, set()).add(name)
    return out


def test_each_shared_tensor_is_stored_once(hoisted):
    build, foundation, adapters = hoisted
    files = {p.name: p.read_bytes() for p in [build.ptd, build.shared_ptd, *build.ptes.values()]}
    holders = _holders(adapters)
    assert sum(len(n) > 1 for n in holders.values()) == 6  # 4 A's of h_a/h_b/h_c + h_a/h_c's 2 layer-0 B's
    for name, adapter in adapters.items():
        keys = _keys(adapter)
        for slot, data in _tensors(adapter).items():
            where = {f: blob.count(data) for f, blob in files.items() if data in blob}
            if len(holders[keys[slot]]) > 1:
                assert where == {"adapters_shared.ptd": 1}, (name, slot)
            else:
                assert where == {f"{name}.pte": 1}, (name, slot)
    embedding = foundation.tensors["model.embed_tokens.weight"].numpy().tobytes()
    assert [f for f, blob in files.items() if embedding in blob] == ["foundation.ptd"]


def test_manifest_and_byte_report_describe_the_files(hoisted):
    build, _, adapters = hoisted
    m = build.manifest
    shared = read_ptd(build.shared_ptd)
    tensor_entries = [e for e in shared.entries if e.key != SHARED_KEY]
    assert m["shared"] == {
        "file": "adapters_shared.ptd",
        "size": build.shared_ptd.stat().st_size,
        "sha256": sha256_file(build.shared_ptd),
        "tensors": 6,
        "tensor_bytes": sum(e.size for e in tensor_entries),
    }
    for e in tensor_entries:  # stored under the sha256 of its bytes: the key the records name it by
        assert hashlib.sha256(shared.data(e.key)).hexdigest() == e.key
    hoisted_keys = {a["name"]: a["hoisted"] for a in m["adapters"]}
    holders = _holders(adapters)
    for name, adapter in adapters.items():
        assert hoisted_keys[name] == sorted({d for d in _keys(adapter).values() if len(holders[d]) > 1})
    assert [len(hoisted_keys[n]) for n in ("h_a", "h_b", "h_c", "h_d")] == [6, 4, 4, 0]
    report = m["bytes"]["shared"]
    readers = {d: sorted(n) for d, n in holders.items() if len(n) > 1}
    assert report["readers"] == dict(sorted(readers.items()))
    assert report["duplicate_avoided"] == sum(shared.entry(d).size * (len(n) - 1) for d, n in readers.items())
    assert m["bytes"]["across_adapters"]["tensors"] == []  # nothing is left in two .pte files
    assert m["bytes"]["total"] == sum(p.stat().st_size for p in [build.ptd, build.shared_ptd, *build.ptes.values()])


@pytest.mark.parametrize("name", [a["name"] for a in HOIST_ADAPTERS])
def test_hoisted_adapters_match_eager(hoisted, name):
    build, foundation, adapters = hoisted
    got = lora_share.run(build.ptes[name], build.ptd, PROMPT, NEW, shared_ptd=build.shared_ptd)
    want = eager_generation(eager_model(foundation, adapters[name]), PROMPT, NEW)
    assert np.abs(got.logits - want.logits).max() <= 1e-4
    assert got.tokens == want.tokens


def test_hoisting_leaves_the_foundation_as_it_is(hoisted_build, tiny_build):
    """Same foundation, other adapters: foundation.ptd byte for byte; every foundation weight stays there."""
    assert hoisted_build.ptd.read_bytes() == tiny_build.ptd.read_bytes()
    assert not tiny_build.shared_ptd.exists() and "shared" not in tiny_build.manifest
    assert all("hoisted" not in a for a in tiny_build.manifest["adapters"])


def test_run_and_verify_ask_for_the_shared_file(hoisted, tmp_path):
    build, _, _ = hoisted
    pte, ptd, shared = build.ptes["h_c"], build.ptd, build.shared_ptd
    r = run_cli("run", "--pte", pte, "--ptd", ptd, "--tokens", "1,2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "lacks 4 key(s)" in r.stderr and "--shared-ptd" in r.stderr
    assert run_cli("verify", "--pte", pte, "--ptd", ptd).returncode == 1
    r = run_cli("verify", "--pte", pte, "--ptd", ptd, "--shared-ptd", shared)
    assert r.returncode == 0 and f"compatible with {ptd} + {shared}" in r.stdout
    # the same tensors, recorded for another foundation
    other = tmp_path / "other_shared.ptd"
    data = read_ptd(shared)
    other.write_bytes(
        encode_shared_ptd({e.key: data.data(e.key) for e in data.entries if e.key != SHARED_KEY}, "0" * 64)
    )
    r = run_cli("verify", "--pte", pte, "--ptd", ptd, "--shared-ptd", other)
    assert r.returncode == 1 and "foundation " + "0" * 64 in r.stderr and "h_c's foundation" in r.stderr
    # a truncated shared file: one clear error, nothing run
    cut = tmp_path / "cut.ptd"
    cut.write_bytes(shared.read_bytes()[:300])
    r = run_cli("run", "--pte", pte, "--ptd", ptd, "--shared-ptd", cut, "--tokens", "1,2")
    assert r.returncode == 2 and "Traceback" not in r.stderr and str(cut) in r.stderr
    # the foundation given as the shared file, checks skipped: the LoRA tensors are found nowhere
    r = run_cli("run", "--pte", pte, "--ptd", ptd, "--shared-ptd", ptd, "--tokens", "1,2", "--no-verify")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no data for the LoRA A" in r.stderr
    r = run_cli("inspect", pte, "--ptd", ptd, "--shared-ptd", shared, "--json")
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["ptd"]["compatible"] is True
    r = run_cli("inspect", shared)
    assert r.returncode == 0 and "shared adapter tensors: 6 tensors" in r.stdout


@pytest.fixture(scope="module")
def rebuilt(hoisted_build, tmp_path_factory):
    """The hoisted build, rebuilt in place with one more adapter sharing layer 0 of h_d."""
    root = tmp_path_factory.mktemp("rebuild")
    shutil.copytree(hoisted_build.out_dir, root / "out")
    before = {p.name: os.stat(p).st_ino for p in (root / "out").iterdir()}
    h_e = {"name": "h_e", "synthetic": {"rank": 8, "alpha": 16, "target_modules": ["o_proj"], "seed": 2, "layers": [0]}}
    cfg = write_config(
        root,
        {"synthetic": TINY_FOUNDATION, "max_seq_len": 32},
        HOIST_ADAPTERS + [h_e],
        dedup={"shared_adapter_tensors": "hoist"},
    )
    return build_config(cfg), before


@pytest.mark.slow  # a rebuild that exports
def test_rebuild_moves_newly_shared_tensors(rebuilt):
    build, before = rebuilt
    foundation, adapters = _adapters(build)
    how = {a["name"]: a["produced"] for a in build.manifest["adapters"]}
    # h_a..h_c read the same tensors from the shared file as before: kept as they are; h_d's layer-0
    # o_proj is now shared with h_e, so it is written again (no export: the program is reused)
    assert build.manifest["program"]["produced"] == "reused"
    assert how == {"h_a": "reused", "h_b": "reused", "h_c": "reused", "h_d": "written", "h_e": "written"}
    for name in ("h_a", "h_b", "h_c", "foundation.ptd"):
        file = name if name.endswith(".ptd") else f"{name}.pte"
        assert os.stat(build.out_dir / file).st_ino == before[file]
    assert build.manifest["shared"]["tensors"] == 8
    assert {a["name"]: len(a["hoisted"]) for a in build.manifest["adapters"]}["h_d"] == 2
    for name in ("h_a", "h_d", "h_e"):
        got = lora_share.run(build.ptes[name], build.ptd, PROMPT, NEW, shared_ptd=build.shared_ptd)
        want = eager_generation(eager_model(foundation, adapters[name]), PROMPT, NEW)
        assert np.abs(got.logits - want.logits).max() <= 1e-4 and got.tokens == want.tokens


@pytest.fixture(scope="module")
def added(hoisted, tmp_path_factory):
    """`lora-share add` of a PEFT adapter whose A matrices are h_a's (so in adapters_shared.ptd)."""
    build, _, adapters = hoisted
    root = tmp_path_factory.mktemp("add_shared")
    out = root / "out"
    shutil.copytree(build.out_dir, out)
    before = {p.name: (sha256_file(p), os.stat(p).st_ino) for p in out.iterdir() if p.suffix in (".ptd", ".pte")}
    peft = write_peft_lora(root / "peft_x", TINY_HF, r=4, alpha=4, targets=["q_proj", "v_proj"], seed=31)
    tensors = load_file(str(peft / "adapter_model.safetensors"))
    for (layer, target), (a, _) in adapters["h_a"].weights.items():
        tensors[f"base_model.model.model.layers.{layer}.self_attn.{target}.lora_A.weight"] = torch.from_numpy(a.copy())
    save_file(tensors, str(peft / "adapter_model.safetensors"), metadata={"format": "pt"})
    r = run_cli("add", "--to", out, f"x={peft}")
    assert r.returncode == 0, r.stderr
    return out, before, peft


def test_add_reads_existing_shared_tensors_and_touches_nothing(added, hoisted):
    out, before, peft = added
    build, foundation, _ = hoisted
    for name, (sha, inode) in before.items():
        assert (sha256_file(out / name), os.stat(out / name).st_ino) == (sha, inode), name
    entry = next(a for a in read_manifest(out)["adapters"] if a["name"] == "x")
    # its four A matrices are h_a's, already in the shared file: read from there, not copied
    assert entry["produced"] == "written" and len(entry["hoisted"]) == 4
    adapter = load_peft("x", peft, foundation.args)
    got = lora_share.run(out / "x.pte", out / "foundation.ptd", PROMPT, NEW, shared_ptd=out / "adapters_shared.ptd")
    want = eager_generation(eager_model(foundation, adapter), PROMPT, NEW)
    assert np.abs(got.logits - want.logits).max() <= 1e-4 and got.tokens == want.tokens
    # its own named data is exactly its four B matrices (and its record)
    keys = _keys(adapter)
    own = {e.key for e in read_pte(out / "x.pte").named_data} - {ADAPTER_KEY}
    assert own == {d for (_, _, which), d in keys.items() if which == "b"}
    assert set(entry["hoisted"]) == {d for (_, _, which), d in keys.items() if which == "a"}
