"""`lora-share eval`: perplexity and top-1 agreement of a build on a text, against transformers float32.

Checked on text_build (a tiny Hugging Face llama with a byte-level BPE tokenizer and one PEFT adapter):
the build's perplexity, read through ExecuTorch one token per call, equals the perplexity the test
computes itself from transformers + peft on the same windows within 1e-3 relative, and its top-1
tokens agree everywhere; the same for a synthetic adapter (which eval sets into peft's LoRA layers),
whose reference here is the eager PyTorch model with lora-share's own adapter. Bad input gets one
line and a non-zero exit. `lora-share bench-quality` runs end to end on the tiny build (slow).
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import TEXT_ADAPTER, build_config, run_cli, write_config

from lora_share.evaluate import evaluate, windows

pytestmark = pytest.mark.slow  # perplexity through ExecuTorch one token per call, and bench-quality end to end

TEXT = (
    "Python is an easy to learn, powerful programming language. It has efficient high-level data "
    "structures and a simple but effective approach to object-oriented programming. Python's elegant "
    "syntax and dynamic typing, together with its interpreted nature, make it an ideal language for "
    "scripting and rapid application development in many areas on most platforms. "
) * 2
MAX_TOKENS = 200  # several windows of text_build's 64, the last one shorter


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("quality") / "text.txt"
    path.write_text(TEXT)
    return path


def own_perplexity(logits_of, ids: list[int], size: int) -> float:
    """exp(mean NLL) over every window's next tokens, from ``logits_of(window) -> [len, vocab]``."""
    nll, n = 0.0, 0
    for w in windows(ids, size):
        lp = torch.log_softmax(logits_of(w).double(), dim=-1)
        nll -= float(lp[torch.arange(len(w) - 1), torch.tensor(w[1:])].sum())
        n += len(w) - 1
    return math.exp(nll / n)


def text_ids(build, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(build.out_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def test_eval_equals_transformers_and_peft(text_build, text_hf, text_file):
    build = text_build.build
    report = evaluate(build.out_dir, text_file, max_tokens=MAX_TOKENS)
    ids = text_ids(build, TEXT)[:MAX_TOKENS]
    size = build.manifest["foundation"]["args"]["max_seq_len"]
    assert report.text["tokens"] == MAX_TOKENS and report.text["windows"] == math.ceil(MAX_TOKENS / size)
    _, peft_model = text_hf

    def hf(window, adapter: bool):
        with torch.no_grad():
            if adapter:
                return peft_model(input_ids=torch.tensor([window])).logits[0]
            with peft_model.disable_adapter():
                return peft_model(input_ids=torch.tensor([window])).logits[0]

    by_name = {s.adapter: s for s in report.results}
    assert list(by_name) == ["base", TEXT_ADAPTER]
    for name, adapter in (("base", False), (TEXT_ADAPTER, True)):
        want = own_perplexity(lambda w, adapter=adapter: hf(w, adapter), ids, size)
        s = by_name[name]
        assert s.predicted == MAX_TOKENS - report.text["windows"]
        assert s.perplexity == pytest.approx(want, rel=1e-3), name
        assert s.reference_perplexity == pytest.approx(want, rel=1e-5), name
        assert s.top1_agreement == 1.0 and s.max_abs_logit_diff < 1e-3, name
    # The adapter changes the predictions, so the two rows measure different models.
    assert abs(by_name[TEXT_ADAPTER].perplexity / by_name["base"].perplexity - 1) > 1e-3


def test_synthetic_adapter_reference(text_build, text_file, tmp_path):
    """A synthetic adapter over the same checkpoint: eval's reference (transformers, the adapter's
    weights set into peft) equals the eager model with lora-share's adapter, and the build agrees."""
    from lora_share.checkpoints.adapters import load_adapter
    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import load_config
    from lora_share.export.eager import eager_model

    synthetic = {"rank": 4, "alpha": 8, "target_modules": ["k_proj", "up_proj"], "seed": 3, "layers": [1]}
    cfg_path = write_config(
        tmp_path,
        {"checkpoint": str(text_build.checkpoint), "max_seq_len": 64},
        [{"name": "syn", "synthetic": synthetic}],
    )
    build = build_config(cfg_path)
    report = evaluate(cfg_path, text_file, adapters=["syn"], max_tokens=100)
    cfg = load_config(cfg_path)
    foundation = load_foundation(cfg.foundation)
    model = eager_model(foundation, load_adapter(cfg.adapters[0], foundation.args))

    def eager(window):
        model.reset_cache()
        with torch.no_grad():
            return torch.stack([model.step([t], pos) for pos, t in enumerate(window)])

    want = own_perplexity(eager, text_ids(build, TEXT)[:100], 64)
    (s,) = report.results
    assert s.adapter == "syn" and s.top1_agreement == 1.0
    assert s.reference_perplexity == pytest.approx(want, rel=1e-4)
    assert s.perplexity == pytest.approx(want, rel=1e-3)


def test_eval_json(text_build, text_file):
    proc = run_cli("eval", text_build.build.out_dir, text_file, "--adapter", "base", "--max-tokens", "70", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (row,) = out["results"]
    assert row["adapter"] == "base" and row["predicted"] == 70 - 2 and out["text"]["windows"] == 2
    assert np.isfinite(row["perplexity"]) and row["ratio"] == pytest.approx(
        row["perplexity"] / row["reference_perplexity"]
    )


@pytest.mark.parametrize("case", ["no_build", "short_text", "unknown_adapter", "no_text"])
def test_bad_input(text_build, text_file, tmp_path, case):
    out_dir = text_build.build.out_dir
    args, words = {
        "no_build": ((tmp_path / "nowhere", text_file), "no such build folder"),
        "short_text": ((out_dir, text_file, "--min-tokens", "100000"), "give a longer text"),
        "unknown_adapter": ((out_dir, text_file, "--adapter", "nope"), "no such adapter"),
        "no_text": ((out_dir, tmp_path / "missing.txt"), "no such text file"),
    }[case]
    proc = run_cli("eval", *args)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and words in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_bench_quality_on_a_tiny_build(text_build, tmp_path):
    """`lora-share bench-quality` end to end on text_build's config (its PEFT adapter), fp32 and 8da4w,
    with a folder of .rst.txt files for text: both builds measured, the files taken whole in name order,
    the check's ratio is the two perplexities', results written as JSON and Markdown."""
    sources = tmp_path / "sources"
    sources.mkdir()
    for i in range(4):
        (sources / f"{i}.rst.txt").write_text(TEXT[i * 40 :])
    out = tmp_path / "results" / "q.json"
    proc = run_cli(
        "bench-quality",
        "--config",
        text_build.build.config,
        "--work",
        tmp_path / "work",
        "--sources",
        sources,
        "--tokens",
        "100",
        "--out",
        out,
        timeout=1800,
    )
    assert proc.returncode in (0, 1), proc.stderr
    results = json.loads(out.read_text())
    assert set(results["variants"]) == {"fp32", "8da4w"}
    assert results["text"]["tokens"] == 2 * 64  # the fewest windows of 64 that score 100 tokens
    assert results["text"]["files"][0] == "0.rst.txt"
    for check in results["checks"]:
        rows = {
            v: next(r for r in results["variants"][v]["results"] if r["adapter"] == check["adapter"])
            for v in ("fp32", "8da4w")
        }
        assert check["ratio"] == pytest.approx(rows["8da4w"]["perplexity"] / rows["fp32"]["perplexity"])
        assert rows["fp32"]["top1_agreement"] == 1.0
    assert [c["adapter"] for c in results["checks"]] == ["base", TEXT_ADAPTER]
    assert (proc.returncode == 0) == all(c["ok"] for c in results["checks"])
    assert "8da4w / fp32 perplexity" in out.with_suffix(".md").read_text()
    assert results["kept"] == []

    # A fresh machine (nothing kept in --work) takes every measurement from the results file, whose
    # recorded keys (the builds' sha256s, the adapter, the text) still hold: the builds are deterministic.
    shutil.rmtree(tmp_path / "work" / "measured")
    fresh = run_cli(
        "bench-quality",
        "--config",
        text_build.build.config,
        "--work",
        tmp_path / "work",
        "--sources",
        sources,
        "--tokens",
        "100",
        "--out",
        out,
        timeout=1800,
    )
    assert fresh.returncode == proc.returncode, fresh.stderr
    assert sorted(json.loads(out.read_text())["kept"]) == sorted(
        f"{v}/{a}" for v in ("fp32", "8da4w") for a in ("base", TEXT_ADAPTER)
    )
    assert not (tmp_path / "work" / "measured").exists()  # nothing was measured

    # A re-run measures again only what neither --work nor the results file holds with the same key.
    saved = json.loads(out.read_text())
    saved["keys"][f"fp32/{TEXT_ADAPTER}"]["adapter_sha256"] = "0" * 64
    out.write_text(json.dumps(saved))
    again = run_cli(
        "bench-quality",
        "--config",
        text_build.build.config,
        "--work",
        tmp_path / "work",
        "--sources",
        sources,
        "--tokens",
        "100",
        "--out",
        out,
        timeout=1800,
    )
    assert again.returncode == proc.returncode, again.stderr
    rerun = json.loads(out.read_text())
    assert sorted(rerun["kept"]) == ["8da4w/base", f"8da4w/{TEXT_ADAPTER}", "fp32/base"]
    assert [(c["adapter"], c["fp32_perplexity"], c["8da4w_perplexity"]) for c in rerun["checks"]] == [
        (c["adapter"], pytest.approx(c["fp32_perplexity"], rel=1e-5), c["8da4w_perplexity"]) for c in results["checks"]
    ]
    assert rerun["complete"]
