"""Every model family against transformers + peft: Llama 3.2, Qwen2, Qwen3, Mistral, Gemma, Gemma 3, Phi-3.

Each family's shipped config, examples/families/<family>.yaml, is built as it is, over the tiny
checkpoint and PEFT adapters that examples/families/tiny_checkpoints.py writes with the family's
own transformers class and peft's ``get_peft_model`` (into a temporary copy of the layout the
config expects). Every adapter is compared with transformers + peft (eager, float32; an
independent greedy loop of full forwards): 12 greedy tokens equal and the last-position logits
of every step within 1e-4, through ExecuTorch's Python runtime and through the C++ runner.

Gemma 3's tiny checkpoint has a window of 4 (the prompt is 5 tokens, generation crosses it), so its
sliding layers' KV slabs are rings of the window in both runtimes.

Also: one program per family build (every adapter written as its data; Phi-3's fused LoRA puts
one A under q, k and v, stored once), `lora-share add` and dedup hoisting on Phi-3, an 8da4w
foundation of Qwen2 against the float reference, llama's attention_bias and mlp_bias, and every
refused config.json field through the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, Build, build_config, run_cli, write_config

import lora_share
from lora_share.inference import c_library

EXAMPLES = REPO / "examples" / "families"
sys.path.insert(0, str(EXAMPLES))
from tiny_checkpoints import SPECS, write_checkpoint, write_family  # noqa: E402

pytestmark = pytest.mark.slow  # seven family builds and their transformers references, and more exports

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PROMPT = [3, 141, 59, 26, 5]
NEW = 12
TOL = 1e-4


@dataclass
class Reference:
    tokens: list[int]
    logits: np.ndarray  # [NEW, vocab]: row i predicts token i


def hf_greedy(model_dir: Path, adapter_dir: Path) -> Reference:
    """NEW greedy tokens after PROMPT from transformers' model class for ``model_dir`` with peft's LoRA,
    one full forward per token (no cache), float32, eager attention."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    seq, rows = list(PROMPT), []
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(torch.tensor([seq])).logits[0, -1]
            rows.append(logits.numpy())
            seq.append(int(logits.argmax()))
    return Reference(seq[len(PROMPT) :], np.stack(rows))


def runner_generate(
    runner_bin: Path, ptes: list[Path], ptd: Path, adapter: str, npy: Path, *flags: str
) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and logits rows from build/runner, every one of ``ptes`` loaded in one process
    over ``ptd``, ``adapter`` answering."""
    loads = [arg for pte in ptes for arg in ("--pte", str(pte))]
    proc = subprocess.run(
        [
            str(runner_bin),
            *loads,
            "--ptd",
            str(ptd),
            *flags,
            "--adapter",
            adapter,
            "--tokens",
            ",".join(map(str, PROMPT)),
            "--max-new-tokens",
            str(NEW),
            "--json",
            "--dump-logits",
            str(npy),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["tokens"], np.load(npy)


@dataclass
class FamilyBuild:
    inputs: Path  # the checkpoint in inputs/model, each adapter in inputs/<name>
    build: Build
    references: dict[str, Reference]


def build_example(family: str, root: Path) -> FamilyBuild:
    """examples/families/<family>.yaml copied under ``root``, its inputs written where it expects
    them, built, and the transformers + peft reference of every adapter."""
    config = root / "examples" / "families" / f"{family}.yaml"
    config.parent.mkdir(parents=True)
    shutil.copy(EXAMPLES / config.name, config)
    inputs = write_family(family, root / "out" / "families" / family)
    manifest = lora_share.build(config, quiet=True)
    build = Build(config, lora_share.validate(config).output_dir, manifest)
    references = {name: hf_greedy(inputs / "model", inputs / name) for name in build.ptes}
    return FamilyBuild(inputs, build, references)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """family -> its FamilyBuild, built once, on first use."""
    built: dict[str, FamilyBuild] = {}

    def get(family: str) -> FamilyBuild:
        if family not in built:
            built[family] = build_example(family, tmp_path_factory.mktemp(family))
        return built[family]

    return get


def test_every_family_has_an_example():
    """One example (and so one comparison below) per supported family, and no other example."""
    from lora_share.model.families import FAMILIES

    assert sorted(p.stem for p in EXAMPLES.glob("*.yaml")) == sorted(SPECS) == sorted(FAMILIES)


@pytest.mark.parametrize("family", list(SPECS))
def test_run_matches_transformers_peft(families, family):
    fb = families(family)
    assert fb.build.manifest["foundation"]["args"]["model_type"] == family
    for name, pte in fb.build.ptes.items():
        got = lora_share.run(pte, fb.build.ptd, PROMPT, NEW)
        ref = fb.references[name]
        assert got.tokens == ref.tokens, name
        assert got.logits.shape == ref.logits.shape
        assert np.abs(got.logits - ref.logits).max() <= TOL, name


@pytest.mark.parametrize("family", list(SPECS))
def test_runner_matches_transformers_peft(families, family, runner_bin, tmp_path):
    """Every adapter of the family loaded into one runner process over the one foundation.ptd."""
    fb = families(family)
    for name in fb.build.ptes:
        tokens, logits = runner_generate(
            runner_bin, list(fb.build.ptes.values()), fb.build.ptd, name, tmp_path / f"{name}.npy"
        )
        ref = fb.references[name]
        assert tokens == ref.tokens, name
        assert logits.shape == ref.logits.shape and np.abs(logits - ref.logits).max() <= TOL, name


def test_adapters_change_the_output(families):
    """Otherwise the comparisons above could not tell an adapter that was dropped."""
    from transformers import AutoModelForCausalLM

    for family in SPECS:
        fb = families(family)
        base = AutoModelForCausalLM.from_pretrained(str(fb.inputs / "model"), dtype=torch.float32).eval()
        with torch.no_grad():
            plain = base(torch.tensor([PROMPT])).logits[0, -1].numpy()
        for name, ref in fb.references.items():
            assert np.abs(ref.logits[0] - plain).max() > 0.1, (family, name)


@pytest.mark.parametrize("family", list(SPECS))
def test_one_program_per_family_build(families, family):
    """Every adapter of a family's build is data for one exported program (and matched transformers +
    peft above)."""
    fb = families(family)
    assert fb.build.manifest["program"]["produced"] == "exported"
    assert {a["produced"] for a in fb.build.manifest["adapters"]} == {"written"}


def _lora_keys(adapter) -> dict[tuple[int, str, str], str]:
    import hashlib

    return {
        (layer, target, which): hashlib.sha256(t.tobytes()).hexdigest()
        for (layer, target), pair in adapter.weights.items()
        for which, t in zip("ab", pair)
    }


def test_fused_lora_shares_one_a(families):
    """Phi-3's LoRA on qkv_proj is one A for q, k and v (and on gate_up_proj one for gate and up):
    stored once in the .pte, under one key the record names for each of those slots."""
    from lora_share.checkpoints.adapters import load_peft
    from lora_share.deploy.adapter_pte import read_record
    from lora_share.formats import read_pte
    from lora_share.formats.meta import ADAPTER_KEY

    fb = families("phi3")
    keys = _lora_keys(load_peft("b", fb.inputs / "b", fb.build.manifest.model_args))
    for layer in (0, 1):
        assert (
            keys[(layer, "q_proj", "a")]
            == keys[(layer, "k_proj", "a")]
            == keys[(layer, "v_proj", "a")]
            != keys[(layer, "q_proj", "b")]
        )
        assert keys[(layer, "gate_proj", "a")] == keys[(layer, "up_proj", "a")]
    pte = fb.build.ptes["b"]
    stored = {e.key for e in read_pte(pte).named_data} - {ADAPTER_KEY}
    assert stored == set(keys.values()) and len(stored) < len(keys)
    record = read_record(pte.read_bytes(), str(pte))
    named = {(*record.envelope[e.slot], w): k for e in record.lora for w, k in (("a", e.a), ("b", e.b))}
    assert named == keys


def test_add_to_a_phi3_build(families, tmp_path):
    """`lora-share add` reads the family from the manifest: a Phi-3 PEFT folder (fused names) added to
    a copy of the build is written as data, leaves foundation.ptd as it was and answers as transformers."""
    fb = families("phi3")
    out = tmp_path / "out"
    shutil.copytree(fb.build.out_dir, out)
    r = run_cli("add", "--to", out, f"c={fb.inputs / 'b'}")  # b's weights under another name
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["adapters"][-1]["name"] == "c" and manifest["adapters"][-1]["produced"] == "written"
    assert (out / "foundation.ptd").read_bytes() == fb.build.ptd.read_bytes()
    got = lora_share.run(out / "c.pte", out / "foundation.ptd", PROMPT, NEW)
    ref = fb.references["b"]
    assert got.tokens == ref.tokens and np.abs(got.logits - ref.logits).max() <= TOL


def test_add_to_a_gemma3_build(families, tmp_path):
    """`lora-share add` of a Gemma 3 PEFT folder is written as data and answers as transformers + peft,
    through the ring KV cache of its sliding layers."""
    fb = families("gemma3_text")
    out = tmp_path / "out"
    shutil.copytree(fb.build.out_dir, out)
    r = run_cli("add", "--to", out, f"c={fb.inputs / 'a'}")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["adapters"][-1]["name"] == "c" and manifest["adapters"][-1]["produced"] == "written"
    got = lora_share.run(out / "c.pte", out / "foundation.ptd", PROMPT, NEW)
    ref = fb.references["a"]
    assert got.tokens == ref.tokens and np.abs(got.logits - ref.logits).max() <= TOL


def test_gemma3_ring_cache(families):
    """The sliding layers' slabs are rings in the exported program and the Python runtime, of the window and
    a row's most drafts (so that drafts written ahead never overwrite a position the window reads) after
    the sink row; the full-attention layer's cover the context (the sink row, then every position but the
    last, which no call reads)."""
    from lora_share.inference.python_runtime import LoadedAdapter

    fb = families("gemma3_text")
    args = fb.build.manifest["foundation"]["args"]
    assert list(args["sliding_layers"]) == [0, 2] and args["sliding_window"] == 4 and args["max_seq_len"] == 32
    adapter = LoadedAdapter(fb.build.ptes["a"], fb.build.ptd)
    from lora_share.model.decoder import MAX_DRAFTS

    ring = 4 + MAX_DRAFTS  # the window and a row's most drafts
    assert adapter.ring == ring
    rows = [slab.shape[0] for slab in adapter.cache.slabs]  # one KV head: layer 0 K, V, layer 1 K, V, ...
    assert rows == [ring + 1, ring + 1, 32, 32, ring + 1, ring + 1]


def _eager_greedy_logits(inputs: Path, args_edit=None, chunk: int | None = None) -> tuple[np.ndarray, Reference]:
    """The eager model's logits of every step of the reference's greedy continuation, the prompt fed in
    chunks of ``chunk`` tokens (all at once by default), ``args_edit`` applied to its ModelArgs."""
    from lora_share.checkpoints.adapters import load_peft
    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import FoundationConfig
    from lora_share.export.eager import eager_model

    foundation = load_foundation(FoundationConfig(checkpoint=inputs / "model", max_seq_len=32))
    if args_edit:
        foundation.args = replace(foundation.args, **args_edit)
    model = eager_model(foundation, load_peft("a", inputs / "a", foundation.args))
    ref = hf_greedy(inputs / "model", inputs / "a")
    rows, pos, feed = [], 0, PROMPT
    with torch.no_grad():
        for token in ref.tokens:
            step = chunk or len(feed)
            for i in range(0, len(feed), step):
                logits = model.step(feed[i : i + step], pos)
                pos += len(feed[i : i + step])
            rows.append(logits.numpy())
            feed = [token]
    return np.stack(rows), ref


def test_gemma3_window_and_local_rope_matter(tmp_path):
    """The comparisons above can tell a lost window or local RoPE base: without either, the eager model
    is far from transformers; with both, chunked prefill (chunks of 2 and 3 through the ring) is exact."""
    inputs = write_family("gemma3_text", tmp_path)
    for chunk in (2, 3):
        got, ref = _eager_greedy_logits(inputs, chunk=chunk)
        assert np.abs(got - ref.logits).max() <= TOL
    for edit in ({"sliding_window": 64}, {"local_rope_theta": 1000000.0}):
        got, ref = _eager_greedy_logits(inputs, edit)
        assert np.abs(got - ref.logits).max() > 0.05, edit


def test_gemma3_every_layer_sliding(tmp_path):
    """With no full-attention layer (the past length cannot be read off one) the sliding layers keep
    whole-context slabs, masked to the window: still transformers' numbers. transformers 4's config
    keys (rope_local_base_freq, the sliding pattern without layer_types) are read as transformers does."""
    from lora_share.model.decoder import ring_window

    spec = SPECS["gemma3_text"]
    config = {k: v for k, v in spec.config.items() if k not in ("layer_types", "rope_parameters")}
    config.update(num_hidden_layers=2, rope_theta=1000000.0, rope_local_base_freq=100.0)
    inputs = write_checkpoint(replace(spec, config=config), tmp_path)
    data = json.loads((inputs / "model" / "config.json").read_text())
    data.pop("layer_types"), data.pop("rope_parameters")  # as a transformers 4 config.json has neither
    data.update(rope_theta=1000000.0, rope_local_base_freq=100.0, sliding_window_pattern=6)
    (inputs / "model" / "config.json").write_text(json.dumps(data))
    got, ref = _eager_greedy_logits(inputs)
    from lora_share.checkpoints.foundation import hf_model_args

    args = hf_model_args(inputs / "model" / "config.json", 32)
    assert args.sliding_layers == (0, 1) and args.local_rope_theta == 100.0 and ring_window(args) == 0
    assert np.abs(got - ref.logits).max() <= TOL


@pytest.fixture(scope="module")
def phi3_hoisted(families, tmp_path_factory) -> Build:
    """Phi-3 adapter b twice with dedup.shared_adapter_tensors: hoist: every tensor (A once per fused
    linear) goes to adapters_shared.ptd, and both read every slot from there."""
    fb = families("phi3")
    folder = tmp_path_factory.mktemp("phi3_hoisted")
    adapters = [{"name": n, "peft": str(fb.inputs / "b")} for n in ("b", "b_twin")]
    return build_config(
        write_config(
            folder,
            {"checkpoint": str(fb.inputs / "model"), "max_seq_len": 32},
            adapters,
            dedup={"shared_adapter_tensors": "hoist"},
        )
    )


def test_hoisting_fused_lora(families, phi3_hoisted):
    from lora_share.formats import read_ptd
    from lora_share.formats.meta import SHARED_KEY

    build, ref = phi3_hoisted, families("phi3").references["b"]
    entries = {a["name"]: a for a in build.manifest["adapters"]}
    keys = {k for s in entries["b"]["lora"] for k in (s["a"], s["b"])}
    assert entries["b"]["hoisted"] == entries["b_twin"]["hoisted"] == sorted(keys)
    stored = [e.key for e in read_ptd(build.shared_ptd).entries if e.key != SHARED_KEY]
    assert sorted(stored) == sorted(keys)
    for name, pte in build.ptes.items():
        got = lora_share.run(pte, build.ptd, PROMPT, NEW, shared_ptd=build.shared_ptd)
        assert got.tokens == ref.tokens and np.abs(got.logits - ref.logits).max() <= TOL, name


def test_hoisting_fused_lora_runner(families, phi3_hoisted, runner_bin, tmp_path):
    build, ref = phi3_hoisted, families("phi3").references["b"]
    tokens, logits = runner_generate(
        runner_bin,
        list(build.ptes.values()),
        build.ptd,
        "b_twin",
        tmp_path / "t.npy",
        "--shared-ptd",
        str(build.shared_ptd),
    )
    assert tokens == ref.tokens and np.abs(logits - ref.logits).max() <= TOL


QUANTIZE = {"scheme": "8da4w", "group_size": 32, "embedding": "int8"}


@pytest.fixture(scope="module")
def qwen2_8da4w(families, tmp_path_factory) -> Build:
    """The Qwen2 example's checkpoint and adapter a over an 8da4w foundation."""
    fb = families("qwen2")
    folder = tmp_path_factory.mktemp("qwen2_8da4w")
    return build_config(
        write_config(
            folder,
            {"checkpoint": str(fb.inputs / "model"), "max_seq_len": 32, "quantize": QUANTIZE},
            [{"name": "a", "peft": str(fb.inputs / "a")}],
        )
    )


def test_quantized_foundation(families, qwen2_8da4w):
    """Qwen2 (biased q/k/v linears) over an 8da4w foundation runs its eager quantized model and stays
    close to the float transformers + peft model, on the teacher-forced prompt set of
    tests/test_quantized.py (8 prompts x 16 positions).

    Against its eager quantized model, as there: most positions to float precision, and int8 rounding
    flips a small fraction of the quantization error. Against the float model: measured 24% of the
    logit std (rms), top-1 agreement 62% (no token dominates this model's untied logits, so small
    noise moves the argmax; chance is 0.3%); a broken quantization (a lost bias, wrong scales) gives
    100% or more. The bounds, 35% and 50%, leave room for other machines.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lora_share.checkpoints.adapters import load_peft
    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import FoundationConfig, QuantizeConfig
    from lora_share.deploy.quant_error import (
        accuracy_prompts,
        compare_logits,
        eager_step,
        single_threaded,
        teacher_forced_logits,
    )
    from lora_share.export.eager import eager_model
    from lora_share.inference.python_runtime import LoadedAdapter

    fb, build = families("qwen2"), qwen2_8da4w
    assert build.ptd.stat().st_size < fb.build.ptd.stat().st_size / 2
    prompts = accuracy_prompts(SPECS["qwen2"].config["vocab_size"], 32)
    got = teacher_forced_logits(LoadedAdapter(build.ptes["a"], build.ptd).step, prompts)
    foundation = load_foundation(
        FoundationConfig(checkpoint=fb.inputs / "model", max_seq_len=32, quantize=QuantizeConfig(**QUANTIZE))
    )
    with single_threaded():
        want = teacher_forced_logits(
            eager_step(eager_model(foundation, load_peft("a", fb.inputs / "a", foundation.args))), prompts
        )
    base = AutoModelForCausalLM.from_pretrained(str(fb.inputs / "model"), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(fb.inputs / "a")).eval()
    with torch.no_grad():
        ref = np.concatenate([model(torch.tensor([p])).logits[0].numpy() for p in prompts])
    assert np.median(np.abs(got - want).max(axis=1)) <= 1e-3
    assert np.sqrt(np.mean((got - want) ** 2)) <= 0.1 * np.sqrt(np.mean((want - ref) ** 2))
    err = compare_logits(ref, got)
    assert err["relative_rms"] <= 0.35 and err["top1_agreement"] >= 0.5, err


def test_quantized_foundation_runner(qwen2_8da4w, runner_bin, tmp_path):
    """The C++ runner (with the wheel's quantized kernels) answers as the Python runtime does."""
    build = qwen2_8da4w
    python = lora_share.run(build.ptes["a"], build.ptd, PROMPT, NEW)
    tokens, logits = runner_generate(runner_bin, [build.ptes["a"]], build.ptd, "a", tmp_path / "a.npy")
    assert tokens == python.tokens
    assert np.abs(logits - python.logits).max() <= TOL


def _mixed_script(build: Build) -> list:
    """Base and each adapter of ``build`` on their own slots, at different positions, joining at different
    steps; slot 0 used again once base has left."""
    from batch_script import Req

    names = list(build.ptes)
    return [
        Req(None, PROMPT, slot=0, new=6),
        Req(names[0], list(range(7, 19)), slot=1, new=8),
        Req(names[-1], [5, 6], slot=2, new=9, joins=1),
        Req(names[0], [9, 9, 9], slot=0, new=5, joins=8),
    ]


@pytest.mark.parametrize("family", list(SPECS))
def test_batched_rows_equal_each_request_alone(families, family, runner_bin):
    """The C++ batched decode step (tests/test_batch_engine.py) on every family's build: each row of a mixed
    batch answers as the same request alone through the one-row C path (Gemma 3: ring slabs wrapping)."""
    from batch_script import check_rows_equal_alone

    check_rows_equal_alone(
        families(family).build, _mixed_script(families(family).build), REPO / "build" / "liblora_share.so", min_batch=3
    )


def test_batched_rows_8da4w(qwen2_8da4w, runner_bin):
    """The same on an 8da4w foundation with an int8 embedding (its quantized embedding's constants kept per
    method, export/program.py): base and adapter rows of one batch against each request alone."""
    from batch_script import Req, check_rows_equal_alone

    script = [
        Req(None, PROMPT, slot=0, new=6),
        Req("a", list(range(7, 19)), slot=1, new=8),
        Req("a", [5, 6], slot=2, new=9, joins=1),
    ]
    check_rows_equal_alone(qwen2_8da4w, script, REPO / "build" / "liblora_share.so", min_batch=3)


def test_llama_biases(tmp_path):
    """llama's attention_bias (q/k/v/o) and mlp_bias (gate/up/down), in the eager model every export
    is checked against, match transformers + peft (the export of a biased linear: Qwen2, above)."""
    from lora_share.checkpoints.adapters import load_peft
    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import FoundationConfig
    from lora_share.export.eager import eager_model

    spec = replace(SPECS["llama"], config={**SPECS["llama"].config, "attention_bias": True, "mlp_bias": True})
    inputs = write_checkpoint(spec, tmp_path)
    foundation = load_foundation(FoundationConfig(checkpoint=inputs / "model", max_seq_len=32))
    assert foundation.args.qkv_bias and foundation.args.o_bias and foundation.args.mlp_bias
    assert "model.layers.1.mlp.down_proj.bias" in foundation.tensors
    ref = hf_greedy(inputs / "model", inputs / "a")
    model = eager_model(foundation, load_peft("a", inputs / "a", foundation.args))
    rows, pos, feed = [], 0, PROMPT
    with torch.no_grad():
        for token in ref.tokens:
            rows.append(model.step(feed, pos).numpy())
            pos, feed = pos + len(feed), [token]
    assert [int(r.argmax()) for r in rows] == ref.tokens
    assert np.abs(np.stack(rows) - ref.logits).max() <= TOL


# --- refused config.json fields --------------------------------------------------------------------

_DELETE = object()
_LONGROPE = {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
REFUSED = {
    # case: (family whose config.json is edited, the edits, the field named, its value as shown)
    "unknown_model_type": ("llama", {"model_type": "falcon"}, "model_type", "'falcon'"),
    "gemma2": ("gemma", {"model_type": "gemma2"}, "model_type", "'gemma2'"),
    "gemma3_multimodal": ("gemma", {"model_type": "gemma3"}, "model_type", "'gemma3'"),
    "gemma3_layer_types": ("gemma3_text", {"layer_types": ["sliding_attention"]}, "layer_types", "['sliding"),
    "gemma3_local_rope_scaled": (
        "gemma3_text",
        {
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "sliding_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
            }
        },
        "rope_parameters",
        "'linear'",
    ),
    "mistral_sliding_window": ("mistral", {"sliding_window": 16}, "sliding_window", "16"),
    "qwen2_sliding_window": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0, "layer_types": _DELETE},
        "sliding_window",
        "16",
    ),
    "rope_scaling_yarn": ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling", "'yarn'"),
    "rope_parameters_linear": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
        "rope_parameters",
        "'linear'",
    ),
    "rope_scaling_dynamic": (
        "mistral",
        {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
        "rope_scaling",
        "'dynamic'",
    ),
    "phi3_longrope": ("phi3", {"rope_scaling": _LONGROPE}, "rope_scaling", "'longrope'"),
    "phi3_partial_rotary_factor": (
        "phi3",
        {"rope_parameters": _DELETE, "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
        "partial_rotary_factor",
        "0.75",
    ),
    "attn_logit_softcapping": ("gemma", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping", "50.0"),
    "final_logit_softcapping": ("qwen3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping", "30.0"),
    "hidden_act": ("llama", {"hidden_act": "relu"}, "hidden_act", "'relu'"),
}


def _family_config(family: str, folder: Path, edits: dict) -> Path:
    """The config.json transformers writes for ``family``'s tiny checkpoint, edited (no weights)."""
    import transformers

    spec = SPECS[family]
    getattr(transformers, spec.model_class).config_class(**spec.config).save_pretrained(folder)
    path = folder / "config.json"
    data = json.loads(path.read_text())
    for key, value in edits.items():
        if value is _DELETE:
            del data[key]
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_field(case, tmp_path):
    family, edits, field, value = REFUSED[case]
    config_json = _family_config(family, tmp_path / "model", edits)
    config = write_config(
        tmp_path,
        {"checkpoint": "model", "max_seq_len": 32},
        [{"name": "a", "synthetic": {"rank": 2, "alpha": 4, "target_modules": ["q_proj"]}}],
    )
    r = run_cli("build", config)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().splitlines()[-1] == errors[0], r.stderr
    assert errors[0].startswith(f"error: {config_json}: {field}: {value}"), errors[0]
    assert not (tmp_path / "out").exists()


def test_synthetic_gemma3_at_the_270m_shape():
    """bench-scale's gemma3-270m shape: a synthetic foundation with Gemma 3's switches, 268 M parameters
    (the real model's count), and a KV cache at context 2,048 of 3 full-context layers and 15 rings of
    512 + 8 spare (issue 25's bound: 27 MiB + 1 MiB, against 72 MiB with every layer over the context)."""
    from lora_share.bench.scale_shapes import SHAPES, fp32_foundation_bytes, full_kv_cache_bytes, kv_cache_bytes
    from lora_share.checkpoints.foundation import synthetic_args
    from lora_share.config import SyntheticFoundation
    from lora_share.manifest import describe_foundation
    from lora_share.model.decoder import MAX_DRAFTS

    shape = SHAPES["gemma3-270m"].foundation
    args = synthetic_args(SyntheticFoundation(**shape), 2048)
    assert args.model_type == "gemma3_text" and args.sandwich_norms and args.qk_norm and args.norm_offset == 1.0
    assert args.sliding_layers == tuple(i for i in range(18) if i % 6 != 5) and args.sliding_window == 512
    assert args.attn_scale == 256**-0.5 and args.local_rope_theta == 10000.0
    assert 268_000_000 < fp32_foundation_bytes(shape) / 4 < 268_200_000
    row = 256 * 4  # one position of one slab: head_dim floats
    d = describe_foundation(parameters=0, args=args, source={}, quantize=None)["args"]  # as the manifest records it
    # A ring holds the window, MAX_DRAFTS spare positions (a batch row's drafts) and the sink.
    assert kv_cache_bytes(d) == row * 2 * (3 * 2048 + 15 * (512 + MAX_DRAFTS + 1)) <= 28 * 1024 * 1024
    assert full_kv_cache_bytes(d) == row * 2 * 18 * 2048


def _drafts_script(build: Build) -> list:
    """Base and each adapter of ``build`` on their own slots, one joining late, one running to the end of the
    context (20 + 12 = 32); long enough to cross Gemma 3's window of 4 several times."""
    from batch_script import Req

    names = list(build.ptes)
    return [
        Req(None, PROMPT, slot=0, new=12),
        Req(names[0], list(range(7, 19)), slot=1, new=14),
        Req(names[-1], [5, 6], slot=2, new=16, joins=1),
        Req(names[0], list(range(30, 50)), slot=3, new=12),
    ]


# Each request's drafts in two runs: all right, all wrong, partly right, none (batch_script.guess).
DRAFT_KINDS = (["right", "wrong", "part", "right"], ["part", None, "right", "wrong"])


def _check_drafts(build: Build) -> None:
    from batch_script import check_drafts_equal_alone

    for kinds in DRAFT_KINDS:
        check_drafts_equal_alone(build, _drafts_script(build), kinds, REPO / "build" / "liblora_share.so")


@pytest.mark.parametrize("family", list(SPECS))
def test_rows_of_drafts_equal_each_request_alone(families, family, runner_bin):
    """Speculative decoding's check (issue 60) on every family's float32 build: rows that carry their last
    token and up to 8 drafts, beside rows of other adapters, give the logits of the same request alone
    through the one-row C path bit for bit, whether the drafts are right, wrong or partly right, up to the
    end of the context, and through Gemma 3's window (its rings' spare slots)."""
    _check_drafts(families(family).build)


@pytest.fixture(scope="module")
def families_8da4w(families, tmp_path_factory, request):
    """family -> its checkpoint and adapters over an 8da4w foundation (Qwen2's: qwen2_8da4w), built once."""
    built: dict[str, Build] = {}

    def get(family: str) -> Build:
        if family == "qwen2":
            return request.getfixturevalue("qwen2_8da4w")
        if family not in built:
            fb = families(family)
            folder = tmp_path_factory.mktemp(f"{family}_8da4w")
            adapters = [{"name": name, "peft": str(fb.inputs / name)} for name in fb.build.ptes]
            foundation = {"checkpoint": str(fb.inputs / "model"), "max_seq_len": 32, "quantize": QUANTIZE}
            built[family] = build_config(write_config(folder, foundation, adapters))
        return built[family]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("family", list(SPECS))
def test_rows_of_drafts_equal_each_request_alone_8da4w(families_8da4w, family, runner_bin):
    """The same on every family over an 8da4w foundation (int8 embedding): each entry's activations are
    quantized on their own, as one-token decode's are, so the verified logits are decode's bit for bit."""
    _check_drafts(families_8da4w(family))


# --- No request reaches another (issue 58) -------------------------------------------------------------

HOSTILE = 1e30  # every LoRA weight of the hostile adapter times this: finite weights whose products overflow


def with_hostile_adapter(build: Build, peft: Path, folder: Path) -> Build:
    """A copy of ``build`` with one adapter more, "hostile": the PEFT folder ``peft`` with every A and B times
    1e30, added with lora-share add. Its weights are finite; x A^T B^T is inf (and NaN after it) on every
    slot: an adapter from elsewhere that no bound on a mix's scales stops, so what it computes must stay
    its own."""
    from safetensors.torch import load_file, save_file

    from lora_share.deploy.builder import add

    out, bad = folder / "out", folder / "hostile"
    shutil.copytree(build.out_dir, out, ignore=shutil.ignore_patterns(".packed"))
    shutil.copytree(peft, bad)
    weights = bad / "adapter_model.safetensors"
    save_file({key: t * HOSTILE for key, t in load_file(weights).items()}, weights)
    return Build(build.config, out, add(out, [("hostile", bad)], quiet=True))


def assert_isolated(build: Build, parallel: int) -> None:
    """Base and every adapter of ``build`` asked at once (a batch as wide as the runtime's slots, so that a
    slot the hostile request used is taken again; cache_prompt off, so each answer is its own whatever ran
    before), then the hostile adapter, then the same batch: bit for bit the first answers. The hostile
    request's KV slot is cleared and its conversation is not continued from it. Then the batch with the
    hostile request in it: the others' answers as before (each row of a step is its own)."""
    from batch_script import diag_generate

    from lora_share.inference import c_library as native

    vocab = build.manifest["foundation"]["args"]["vocab_size"]
    clean = [name for name in build.ptes if name != "hostile"]
    prompts = [PROMPT, list(range(7, 19)), [5, 6], [9, 9, 9]]
    asks = list(zip([None, *clean], prompts))
    with native.open_dir(build.out_dir, parallel=parallel, library=REPO / "build" / "liblora_share.so") as rt:
        handle = {name: None if name is None else rt.adapter(name).handle for name, _ in asks}

        def ask(name, prompt, new=6, cache_prompt=False):
            return diag_generate(rt, handle[name], prompt, new, vocab, cache_prompt=cache_prompt)

        def batch(*extra):
            jobs = [lambda n=n, p=p: ask(n, p) for n, p in asks] + list(extra)
            barrier = threading.Barrier(len(jobs))
            with ThreadPoolExecutor(len(jobs)) as pool:
                return list(pool.map(lambda job: (barrier.wait(), job())[1], jobs))

        def ask_hostile(prompt, new=6):
            """Its own answer is NaN logits, or LS_ERR_REQUEST when they leave no token to pick."""
            try:
                tokens, logits = ask("hostile", prompt, new, cache_prompt=True)
            except native.NativeError as e:
                assert e.status == "LS_ERR_REQUEST" and "not numbers (NaN)" in e.message, e
                return []
            assert not np.isfinite(logits).all()
            return tokens[:-1]

        first = batch()
        handle["hostile"] = rt.adapter("hostile").handle
        fed = ask_hostile(PROMPT)
        s = rt.stats()
        assert s["slots_cleared"] == (1 if parallel > 1 else 0)
        ask_hostile(PROMPT + fed + [4], new=2)  # its next turn: no prefix hit
        assert rt.stats()["prefix_hits"] == s["prefix_hits"]
        again = batch()
        during = batch(lambda: ask_hostile([4, 4, 4]))[: len(asks)]
    for (name, _), a, b, c in zip(asks, first, again, during):
        assert a[0] == b[0] and np.array_equal(a[1], b[1]), name
        assert a[0] == c[0] and np.abs(a[1] - c[1]).max() <= TOL, name


@pytest.mark.parametrize("parallel", [1, 0], ids=["one_slot", "batched"])
@pytest.mark.parametrize("family", list(SPECS))
def test_a_hostile_request_changes_no_other_answer(families, family, parallel, tmp_path):
    fb = families(family)
    build = with_hostile_adapter(fb.build, fb.inputs / next(iter(fb.build.ptes)), tmp_path)
    assert_isolated(build, parallel or len(fb.build.ptes) + 1)


def test_a_hostile_request_changes_no_other_answer_8da4w(families, qwen2_8da4w, tmp_path):
    """The same over the 8da4w foundation (activations quantized per row: a NaN row is its own)."""
    build = with_hostile_adapter(qwen2_8da4w, families("qwen2").inputs / "a", tmp_path)
    assert_isolated(build, len(qwen2_8da4w.ptes) + 1)


def _scheduler_requests(build: Build) -> list:
    """(adapter, prompt, new) run at once: base, a prompt that repeats itself (prompt lookup drafts), one that
    runs to the end of the context (20 + 12 = 32), Gemma 3's window (4) crossed by each."""
    names = list(build.ptes)
    return [
        ("base", PROMPT, 12),
        (names[0], [7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8], 14),
        (names[-1], [5, 6], 16),
        (names[0], list(range(30, 50)), 12),
    ]


def _guess(kind: str | None, answer: list[int]) -> list[int] | None:
    """A prediction of ``answer``: all right, all wrong (every id another), or right for its first half."""
    if kind is None:
        return None
    wrong = [t - 1 if t > 0 else 1 for t in answer]
    return {"right": answer, "wrong": wrong, "part": answer[: len(answer) // 2] + wrong[len(answer) // 2 :]}[kind]


def _run_batch(rt, requests, predictions, temperature=0.0, seed=0) -> list[list[int]]:
    from test_scheduler import concurrently

    def one(name, prompt, new, prediction):
        return rt.generate_choices(
            name, prompt, new, temperature=temperature, seed=seed, prediction=prediction, cache_prompt=False
        )[0]["tokens"]

    return concurrently([lambda r=r, p=p: one(*r, p) for r, p in zip(requests, predictions)])


def _check_scheduler_speculation(build: Build, parallel: int = 4) -> None:
    """The scheduler with speculation (every draft verified, so that the counts below do not hang on timing;
    ``parallel`` 1: one slot, one request at a time) against
    the same runtime without (one slot: the one-row path): every answer of four concurrent requests the
    same, greedy with predictions all right, all wrong, partly right and none (prompt lookup), and sampled
    with the same seed (each token drawn as one-token decode draws it); drafts were verified and some kept."""
    library = REPO / "build" / "liblora_share.so"
    requests = _scheduler_requests(build)
    with c_library.open_dir(build.out_dir, parallel=parallel, library=library, speculation=False) as rt:
        plain = _run_batch(rt, requests, [None] * 4)
        sampled = [_run_batch(rt, requests, [None] * 4, temperature=0.9, seed=s) for s in range(2)]
        assert rt.stats()["drafted_tokens"] == 0
    with c_library.open_dir(build.out_dir, parallel=parallel, library=library, speculation="every_draft") as rt:
        for kinds in (["right", "wrong", "part", "right"], ["part", None, "right", "wrong"], [None] * 4):
            predictions = [_guess(k, answer) for k, answer in zip(kinds, plain)]
            assert _run_batch(rt, requests, predictions) == plain, kinds
        for s in range(2):
            predictions = [_guess(k, a) for k, a in zip(["right", None, "part", "wrong"], sampled[s])]
            assert _run_batch(rt, requests, predictions, temperature=0.9, seed=s) == sampled[s]
        stats = rt.stats()
    assert 0 < stats["accepted_tokens"] < stats["drafted_tokens"]


@pytest.mark.parametrize("parallel", [4, 1], ids=["batched", "one_slot"])
@pytest.mark.parametrize("family", list(SPECS))
def test_speculation_in_the_scheduler_changes_no_answer(families, family, parallel):
    """Issue 60's scheduler on every family's float32 build (_check_scheduler_speculation)."""
    _check_scheduler_speculation(families(family).build, parallel)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [4, 1], ids=["batched", "one_slot"])
@pytest.mark.parametrize("family", list(SPECS))
def test_speculation_in_the_scheduler_changes_no_answer_8da4w(families_8da4w, family, parallel):
    """The same over every family's 8da4w foundation."""
    _check_scheduler_speculation(families_8da4w(family), parallel)
