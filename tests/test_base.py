"""The foundation alone ("base"): every LoRA input a zero rank-1 pair, through the program the loaded
adapters carry, in build/runner (--adapter base, a --serve line's adapter), the C library (a NULL
adapter handle, or the name "base") and the server (model "base").

The reference is the eager PyTorch model with no adapter (lora_share.eager.eager_model(foundation,
None)) generating greedily; base's tokens also differ from an adapter's on the same prompt. A config
naming an adapter "base" is refused by `lora-share validate`.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from conftest import EOS_PROMPT, REPO, TEXT_ADAPTER, TINY_ADAPTERS, TINY_FOUNDATION, run_cli, write_config

import lora_share
from lora_share.checkpoints.adapters import load_adapter
from lora_share.checkpoints.foundation import load_foundation
from lora_share.export.eager import eager_model
from lora_share.inference import c_library as native
from lora_share.inference.generate import generate

NEW = 12
TIMEOUT = 300


def eager_tokens(model, stop_ids, prompt, new=NEW) -> list[int]:
    """Greedy generation of the eager model, step by step (lora_share.generate's loop), stopping after
    one of the build's EOS ids as every runtime does."""
    model.reset_cache()

    def step(tokens, pos):
        with torch.no_grad():
            return model.step(tokens, pos).numpy()

    return generate(step, prompt, new, stop_ids=stop_ids).tokens


@pytest.fixture(scope="module")
def build(text_build):
    """text_build (a Hugging Face llama and one PEFT adapter): a model whose greedy tokens vary, so an
    adapter's visibly differ from the foundation's."""
    return text_build.build


@pytest.fixture(scope="module")
def prompt(build) -> list[int]:
    """EOS_PROMPT's ids (more than the build's prefill chunk): text the tiny model answers variedly."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(build.out_dir / "tokenizer.json")).encode(EOS_PROMPT).ids


@pytest.fixture(scope="module")
def want(build, prompt) -> dict:
    """Eager greedy tokens: the foundation alone ("base") and the adapter."""
    cfg = lora_share.validate(build.config)
    foundation = load_foundation(cfg.foundation)
    eos = build.manifest["tokenizer"]["eos_token_ids"]
    out = {"base": eager_tokens(eager_model(foundation, None), eos, prompt)}
    for a in cfg.adapters:
        out[a.name] = eager_tokens(eager_model(foundation, load_adapter(a, foundation.args)), eos, prompt)
    assert out[TEXT_ADAPTER] != out["base"], out  # else the test shows nothing
    return out


def runner(runner_bin, build, *args, stdin=None) -> subprocess.CompletedProcess:
    ptes = [arg for pte in build.ptes.values() for arg in ("--pte", pte)]
    return subprocess.run(
        [str(runner_bin), "--ptd", str(build.ptd), *map(str, ptes), *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def csv(ids) -> str:
    return ",".join(map(str, ids))


def test_runner_adapter_base(runner_bin, build, want, prompt):
    r = runner(runner_bin, build, "--adapter", "base", "--tokens", csv(prompt), "--max-new-tokens", NEW, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == want["base"]


def test_runner_serve_base_beside_adapters(runner_bin, build, want, prompt):
    """One process answers base and every adapter, in any order: each as its own eager model."""
    names = ["base", *build.ptes, "base"]
    stdin = "".join(f"{name}\t{csv(prompt)}\n" for name in names)
    r = runner(runner_bin, build, "--serve", "--max-new-tokens", NEW, stdin=stdin)
    assert r.returncode == 0, r.stderr
    answers = [json.loads(line)["tokens"] for line in r.stdout.splitlines()]
    assert answers == [want[name] for name in names]


def test_runner_base_refusals(runner_bin, build, tmp_path):
    r = runner(runner_bin, build, "--adapter", "base", "--tokens", "1,2", "--stock")
    assert r.returncode == 2 and "drop --stock" in r.stderr
    named_base = tmp_path / "base.pte"
    named_base.write_bytes(build.ptes[TEXT_ADAPTER].read_bytes())
    r = runner(runner_bin, build, "--pte", named_base, "--tokens", "1,2")
    assert r.returncode == 2 and "reserved for the foundation alone" in r.stderr and str(named_base) in r.stderr


def test_c_api_null_adapter_and_name(runner_bin, build, want, prompt):
    library = REPO / "build" / "liblora_share.so"
    with native.open(build.ptd, library=library) as rt:
        with pytest.raises(native.NativeError) as failure:
            rt.generate(None, prompt, NEW)  # no adapter known yet: no program to run the foundation through
        assert failure.value.status == "LS_ERR_REQUEST" and "load at least one adapter" in str(failure.value)
        a = rt.load_adapter(build.ptes[TEXT_ADAPTER])
        assert rt.generate(None, prompt, NEW) == want["base"]
        assert rt.generate(a, prompt, NEW) == want[TEXT_ADAPTER]
        assert rt.generate("base", prompt, NEW) == want["base"]
    # A deployment folder (nothing loaded yet): base runs through the first adapter's program.
    with native.open_dir(build.out_dir, library=library) as rt:
        assert rt.generate("base", prompt, NEW) == want["base"]
        assert rt.generate(TEXT_ADAPTER, prompt, NEW) == want[TEXT_ADAPTER]
        assert rt.generate(None, prompt, NEW) == want["base"]


def test_server_model_base(runner_bin, build, want, prompt):
    from test_server import Server

    server = Server(REPO / "build" / "lora-share-server", build.out_dir)
    try:
        for model in ("base", TEXT_ADAPTER, "base"):
            status, answer = server.request(
                "POST", "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": NEW}
            )
            assert status == 200, answer
            assert answer["choices"][0]["tokens"] == want[model], model
    finally:
        server.stop()


def test_validate_refuses_an_adapter_named_base(tmp_path):
    cfg = write_config(
        tmp_path, {"synthetic": TINY_FOUNDATION}, [TINY_ADAPTERS[0], {**TINY_ADAPTERS[1], "name": "base"}]
    )
    r = run_cli("validate", cfg)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if "adapters[1].name" in line]
    assert len(lines) == 1 and "'base'" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_add_refuses_an_adapter_named_base(build, text_build):
    """Nothing is written before the refusal, so the shared build folder is safe to name."""
    r = run_cli("add", "--to", build.out_dir, f"base={text_build.peft}")
    assert r.returncode == 2, r.stderr
    assert "'base' is the name of the foundation alone" in r.stderr and "Traceback" not in r.stderr
