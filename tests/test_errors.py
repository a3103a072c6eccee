"""Bad input gets one clear message and a non-zero exit, never a traceback; failed builds change nothing."""

from __future__ import annotations

import filecmp
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TINY_FOUNDATION, run_cli
from hf_files import hf_config, write_hf_llama, write_peft_lora

import lora_share


def _deploy(root: Path, adapters: list, foundation=None) -> Path:
    p = root / "deploy.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "output_dir": "out",
                "foundation": foundation or {"checkpoint": "llama", "max_seq_len": 16},
                "adapters": adapters,
            }
        )
    )
    return p


@pytest.fixture(scope="module")
def hf_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    write_hf_llama(root / "llama", hf_config(tied=False))
    return root


def _fails(config: Path, *expected: str):
    r = run_cli("build", config)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().splitlines()[-1] == errors[0], r.stderr
    for e in expected:
        assert e in r.stderr, r.stderr
    assert not (config.parent / "out").exists(), "a failed build must not write outputs"


@pytest.mark.parametrize(
    "field,value",
    [
        ("use_dora", True),
        ("modules_to_save", ["lm_head"]),
        ("bias", "all"),
        ("fan_in_fan_out", True),
        ("kasa_config", {}),
        ("monteclora_config", {}),
        ("use_bdlora", {"nblocks": 2}),
    ],
)
def test_unsupported_peft_feature(hf_root, field, value):
    write_peft_lora(hf_root / field, hf_config(tied=False), r=2, alpha=4, targets=["q_proj"], **{field: value})
    _fails(_deploy(hf_root, [{"name": "x", "peft": field}]), "adapter_config.json", field, "not supported")


def test_adapter_shapes_do_not_fit(hf_root):
    write_peft_lora(hf_root / "wide", hf_config(dim=96, heads=4, kv_heads=2), r=2, alpha=4, targets=["q_proj"])
    _fails(
        _deploy(hf_root, [{"name": "wide", "peft": "wide"}]),
        "adapter_model.safetensors",
        "model.layers.0.self_attn.q_proj",
        "do not fit the foundation",
    )


def test_adapter_for_layers_the_foundation_lacks(hf_root):
    write_peft_lora(hf_root / "deep", hf_config(layers=4), r=2, alpha=4, targets=["v_proj"])
    _fails(_deploy(hf_root, [{"name": "deep", "peft": "deep"}]), "layer 2", "the foundation has 2 layers")


def test_missing_adapter_weights(hf_root):
    folder = write_peft_lora(hf_root / "noweights", hf_config(tied=False), r=2, alpha=4, targets=["q_proj"])
    (folder / "adapter_model.safetensors").unlink()
    _fails(_deploy(hf_root, [{"name": "n", "peft": "noweights"}]), "adapter_model.safetensors is missing")


def test_truncated_checkpoint(tmp_path):
    base = write_hf_llama(tmp_path / "llama", hf_config())
    data = (base / "model.safetensors").read_bytes()
    (base / "model.safetensors").write_bytes(data[: len(data) // 2])
    write_peft_lora(tmp_path / "a", hf_config(), r=2, alpha=4, targets=["q_proj"])
    _fails(_deploy(tmp_path, [{"name": "a", "peft": "a"}]), "model.safetensors", "truncated")


def test_missing_checkpoint_folder(tmp_path):
    p = _deploy(
        tmp_path,
        [{"name": "a", "synthetic": {"rank": 2, "alpha": 2, "target_modules": ["q_proj"]}}],
        {"checkpoint": "missing_llama"},
    )
    r = run_cli("build", p)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "foundation.checkpoint" in r.stderr and "no such folder" in r.stderr


def test_unknown_key_in_build(tmp_path):
    p = _deploy(
        tmp_path,
        [{"name": "a", "synthetic": {"rank": 2, "alpha": 2, "target_modules": ["q_proj"], "sed": 3}}],
        {"synthetic": TINY_FOUNDATION},
    )
    r = run_cli("build", p)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "adapters[0].synthetic.sed: unknown key; did you mean 'seed'?" in r.stderr


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--tokens", "1,x"], "--tokens"),
        (["--tokens", "1,9999"], "outside the vocabulary"),
        (["--tokens", "1,2", "--max-new-tokens", "40"], "context (max_seq_len) is 32"),
    ],
)
def test_run_bad_flags(tiny_build, args, expected):
    pte = tiny_build.ptes["tiny_a"]
    r = run_cli("run", "--pte", pte, "--ptd", tiny_build.ptd, *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and expected in r.stderr, r.stderr


def test_run_missing_and_wrong_files(tiny_build, tmp_path):
    pte = tiny_build.ptes["tiny_a"]
    r = run_cli("run", "--pte", tmp_path / "nope.pte", "--ptd", tiny_build.ptd, "--tokens", "1")
    assert r.returncode == 2 and "nope.pte: no such file" in r.stderr
    r = run_cli("run", "--pte", pte, "--ptd", tiny_build.ptes["tiny_b"], "--tokens", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "could not load" in r.stderr


def _snapshot(folder: Path, into: Path) -> Path:
    shutil.copytree(folder, into)
    return into


def _same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    return not (cmp.left_only or cmp.right_only or filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)[1])


def _changed_foundation(config: Path, into: Path) -> None:
    """The same deployment over other foundation weights: every adapter must be exported again."""
    data = yaml.safe_load(config.read_text())
    data["foundation"]["synthetic"]["seed"] += 1
    into.write_text(yaml.safe_dump(data))


@pytest.mark.slow  # a build of its own
def test_failed_build_leaves_previous_outputs(tiny_build, tmp_path, monkeypatch):
    out = _snapshot(tiny_build.out_dir, tmp_path / "out")
    before = _snapshot(out, tmp_path / "before")
    cfg = tmp_path / "deploy.yaml"
    _changed_foundation(tiny_build.config, cfg)
    from lora_share.deploy.adapter_pte import Program

    calls = []
    real = Program.write

    def write_then_fail(self, *a, **k):  # after the export and the first adapter, in staging
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure writing the second adapter")
        return real(self, *a, **k)

    monkeypatch.setattr(Program, "write", write_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        lora_share.build(cfg, quiet=True)
    assert len(calls) == 2
    assert _same_tree(out, before)
    assert [p.name for p in tmp_path.iterdir() if "staging" in p.name] == []


@pytest.mark.slow  # a build of its own
def test_killed_build_leaves_previous_outputs(tiny_build, tmp_path):
    out = _snapshot(tiny_build.out_dir, tmp_path / "out")
    before = _snapshot(out, tmp_path / "before")
    cfg = tmp_path / "deploy.yaml"
    _changed_foundation(tiny_build.config, cfg)
    exe = Path(sys.executable).parent / "lora-share"
    proc = subprocess.Popen([str(exe), "build", str(cfg)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    seen = ""
    while time.time() < deadline:
        line = proc.stderr.readline()
        seen += line
        if "exported in" in line:  # the first adapter is written into staging; kill mid-build
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert "exported in" in seen
    assert _same_tree(out, before)
    # The next build clears the debris and replaces the outputs whole.
    manifest = lora_share.build(cfg, quiet=True)
    assert [p.name for p in tmp_path.iterdir() if "staging" in p.name or "previous" in p.name] == []
    assert json.loads((out / "manifest.json").read_text())["foundation"]["sha256"] == manifest["foundation"]["sha256"]
