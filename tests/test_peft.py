"""Hugging Face + PEFT files written by the test, exported by lora-share, checked against transformers + peft."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml
from conftest import build_config
from hf_files import hf_config, hf_peft_logits, write_hf_llama, write_peft_lora

import lora_share

pytestmark = pytest.mark.slow  # a build of its own per PEFT variant

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PROMPT = [3, 141, 59, 26, 5]
NEW = 8


@pytest.fixture(scope="module")
def peft_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("peft")
    base_cfg = hf_config(tied=True)
    base = write_hf_llama(root / "llama", base_cfg, shards=2)
    adapters = {
        # rsLoRA: scale alpha / sqrt(r) instead of alpha / r.
        "rslora": write_peft_lora(
            root / "rslora", base_cfg, r=4, alpha=8, targets=["q_proj", "v_proj", "down_proj"], use_rslora=True, seed=1
        ),
        # Per-module ranks and alphas, on a subset of layers.
        "patterns": write_peft_lora(
            root / "patterns",
            base_cfg,
            r=4,
            alpha=16,
            targets=["q_proj", "k_proj", "o_proj", "gate_proj", "up_proj"],
            rank_pattern={"k_proj": 2, "model.layers.1.mlp.up_proj": 8},
            alpha_pattern={"o_proj": 3},
            seed=2,
        ),
        "layer0": write_peft_lora(
            root / "layer0", base_cfg, r=2, alpha=4, targets=["v_proj", "up_proj"], layers=[0], seed=3
        ),
    }
    (root / "deploy.yaml").write_text(
        yaml.safe_dump(
            {
                "output_dir": "out",
                "foundation": {"checkpoint": "llama", "max_seq_len": 24},
                "adapters": [{"name": n, "peft": n} for n in adapters],
            }
        )
    )
    return base, adapters, build_config(root / "deploy.yaml")


@pytest.mark.parametrize("name", ["rslora", "patterns", "layer0"])
def test_matches_transformers_and_peft(peft_build, name):
    base, adapters, build = peft_build
    got = lora_share.run(build.ptes[name], build.ptd, PROMPT, NEW)
    # One full forward over prompt + generated tokens gives every row the runtime produced.
    seq = PROMPT + got.tokens[:-1]
    ref = hf_peft_logits(base, adapters[name], seq)[len(PROMPT) - 1 :].numpy()
    assert got.logits.shape == ref.shape
    assert np.abs(got.logits - ref).max() <= 1e-4
    assert got.tokens == [int(i) for i in ref.argmax(-1)]


def test_manifest_records_peft_sources(peft_build):
    _, adapters, build = peft_build
    by_name = {a["name"]: a for a in build.manifest["adapters"]}
    assert by_name["rslora"]["use_rslora"] is True
    assert by_name["patterns"]["rank_pattern"] == {"k_proj": 2, "model.layers.1.mlp.up_proj": 8}
    assert by_name["layer0"]["layers"] == [0]
    assert set(by_name["rslora"]["source"]["sha256"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert build.manifest["foundation"]["source"]["kind"] == "checkpoint"
    assert build.manifest["foundation"]["args"]["tie_embeddings"] is True
