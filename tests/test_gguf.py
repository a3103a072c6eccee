"""GGUF foundations against transformers' own GGUF loading.

Each tiny GGUF here is written with the ``gguf`` package's writer the way llama.cpp's converter
writes a Hugging Face checkpoint (its tensor names, Q and K rows permuted for llama, dimensions
innermost first, F32 or Q8_0 blocks), from a tiny random Hugging Face model: a llama (untied, GQA),
a Phi-3 (fused qkv_proj and gate_up_proj, kept fused as attn_qkv and ffn_up, with LoRA on the
fused linears) and a Gemma 3 text model (llama.cpp's gemma3: its norm names, every norm weight
stored as 1 + w, a sliding window of 4 shorter than the prompt, one key/value head, tied), each
with a PEFT adapter. transformers then loads
the same .gguf itself (``from_pretrained(dir, gguf_file=...)``, dequantizing with the same package)
and is the reference: lora-share's eager model over the GGUF foundation, and a build of a config whose
checkpoint is the .gguf run through ExecuTorch, must give its logits within 1e-4, with a PEFT adapter
trained on the Hugging Face form applied unchanged (which fails if the permutation is not undone).
Then what is refused: an unsupported architecture, an unknown tensor, a missing metadata key, a
truncated file, what the phi3 family refuses (LongRoPE factors, partial rotary embeddings, a
sliding window shorter than the context) and what a Gemma 3 file may lack or add (its sliding
window, logit soft-capping), each with one message naming the file and the key.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, run_cli
from hf_files import hf_config, write_hf_llama, write_peft_lora

import lora_share
from lora_share.checkpoints.foundation import load_foundation
from lora_share.config import load_config
from lora_share.export.eager import eager_model

sys.path.insert(0, str(REPO / "examples" / "families"))
from tiny_checkpoints import SPECS, write_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow  # a build per architecture from its GGUF, against transformers' GGUF loading

gguf = pytest.importorskip("gguf")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
PROMPT = [3, 141, 59, 26, 5, 77, 2]
TOL = 1e-4
BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
}  # Phi-3's fused linears
# Gemma 3's names (gguf's MODEL_TENSORS[MODEL_ARCH.GEMMA3]): ffn_norm is the norm before the MLP there
GEMMA3_BLOCK = {
    **BLOCK,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (written out here, independently of lora-share)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str, arch: str = "llama") -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{(GEMMA3_BLOCK if arch == 'gemma3' else BLOCK)[module]}.{suffix}"


def write_gguf(
    hf_dir: Path,
    path: Path,
    qtype: str = "F32",
    arch: str = "llama",
    extra_tensor: str | None = None,
    drop_key: str | None = None,
    **edits,
) -> Path:
    """``hf_dir`` (config.json + model.safetensors) as llama.cpp's converter would write it (its
    LlamaModel, its Phi3MiniModel for arch phi3, its Gemma3Model for arch gemma3), with ``edits``
    replacing metadata values."""
    import json

    from safetensors.torch import load_file

    c = json.loads((hf_dir / "config.json").read_text())
    rope = c["rope_parameters"] if "rope_parameters" in c else {"rope_theta": c["rope_theta"]}
    w = gguf.GGUFWriter(str(path), arch)
    meta = {
        "block_count": c["num_hidden_layers"],
        "context_length": c["max_position_embeddings"],
        "embedding_length": c["hidden_size"],
        "feed_forward_length": c["intermediate_size"],
        "head_count": c["num_attention_heads"],
        "head_count_kv": c["num_key_value_heads"],
        "layer_norm_rms_eps": c["rms_norm_eps"],
        "vocab_size": c["vocab_size"],
        "rope_freq_base": rope.get("full_attention", rope)["rope_theta"],
    }
    if arch == "gemma3":  # Gemma3Model.set_gguf_parameters: no rotary count; the head size; the window
        meta.update(
            key_length=c["head_dim"],
            value_length=c["head_dim"],
            sliding_window=c["sliding_window"],
            rope_freq_base_swa=rope["sliding_attention"]["rope_theta"],
        )
    else:
        meta["rope_dimension_count"] = c["hidden_size"] // c["num_attention_heads"]
    if arch == "phi3":  # Phi3MiniModel.set_gguf_parameters: 0 for no window
        meta.update(
            sliding_window=c.get("sliding_window") or 0, rope_scaling_orig_ctx_len=c["original_max_position_embeddings"]
        )
    # gguf.SpecialVocab reads these from config.json when there is no tokenizer (transformers' Phi-3
    # defaults its pad_token_id to 32000 otherwise, outside this vocabulary)
    meta.update(
        {f"{k}_token_id": c[f"{k}_token_id"] for k in ("bos", "eos", "pad") if c.get(f"{k}_token_id") is not None}
    )
    for key, value in {**meta, **edits}.items():
        if key != drop_key:
            getattr(w, f"add_{key}")(value)
    for name, t in sorted(load_file(str(hf_dir / "model.safetensors")).items()):
        a = t.numpy().astype(np.float32)
        if arch == "llama" and ".q_proj." in name:
            a = permute(a, c["num_attention_heads"])
        elif arch == "llama" and ".k_proj." in name:
            a = permute(a, c["num_key_value_heads"])
        elif arch == "gemma3" and name.endswith("norm.weight"):  # Gemma3Model.modify_tensors: Gemma's 1 + w
            a = a + 1
        if qtype == "Q8_0" and a.ndim == 2:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gguf_name(name, arch), q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(gguf_name(name, arch), a)
    if extra_tensor:
        w.add_tensor(extra_tensor, np.ones(c["hidden_size"] // c["num_attention_heads"] // 2, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def transformers_logits(folder: Path, gguf_file: str | None = None, adapter: Path | None = None) -> torch.Tensor:
    """Last-position logits after PROMPT from transformers' model in ``folder`` (its own loading of
    ``gguf_file`` when given), with peft's ``adapter`` when given."""
    from transformers import AutoModelForCausalLM

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager", **kwargs
    )
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        return model.eval()(torch.tensor([PROMPT])).logits[0, -1]


def write_config(root: Path, checkpoint: Path, adapter: Path) -> Path:
    config = root / "deploy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "output_dir": "out",
                "foundation": {"checkpoint": str(checkpoint), "max_seq_len": 16, "prefill_chunk": 4},
                "adapters": [{"name": "a", "peft": str(adapter)}],
            }
        )
    )
    return config


FAMILY = {"llama": "llama", "phi3": "phi3", "gemma3": "gemma3_text"}
KV_HEADS = {"llama": 2, "phi3": 2, "gemma3": 1}


def gemma3_as_gguf_says(config: dict) -> dict:
    """The tiny Gemma 3 of tiny_checkpoints (window 4, shorter than the prompt: the ring is used; one
    key/value head; tied) with what a GGUF does not say set as transformers' GGUF loader assumes:
    6 layers with no layer_types (layers 0-4 slide, 5 does not), query_pre_attn_scalar 256, local
    RoPE base 10000."""
    rope = {**config["rope_parameters"], "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    config = {k: v for k, v in config.items() if k != "layer_types"}
    return {**config, "num_hidden_layers": 6, "query_pre_attn_scalar": 256, "rope_parameters": rope}


def _tiny_model(arch: str, root: Path) -> dict:
    """A tiny Hugging Face model of ``arch``, a PEFT adapter for it, and its GGUF forms (F32, Q8_0)."""
    if arch == "llama":  # untied, GQA
        config = hf_config(tied=False)
        hf = write_hf_llama(root / "hf", config, seed=3)
        write_peft_lora(
            root / "adapter", config, r=4, alpha=8, targets=["q_proj", "k_proj", "v_proj", "o_proj"], seed=5
        )
    else:  # by transformers' Phi3ForCausalLM / Gemma3ForCausalLM, the adapter by peft on every linear
        spec = SPECS[FAMILY[arch]]
        if arch == "gemma3":
            spec = replace(spec, config=gemma3_as_gguf_says(spec.config))
        write_checkpoint(replace(spec, adapters={"adapter": spec.adapters["a"]}), root)
        hf = root / "model"
    files = {q: write_gguf(hf, root / f"model-{q}.gguf", q, arch=arch) for q in ("F32", "Q8_0")}
    return {"root": root, "hf": hf, "adapter": root / "adapter", "gguf": files}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """arch -> its tiny model (``_tiny_model``), written once, on first use."""
    made: dict[str, dict] = {}

    def get(arch: str) -> dict:
        if arch not in made:
            made[arch] = _tiny_model(arch, tmp_path_factory.mktemp(f"gguf-{arch}"))
        return made[arch]

    return get


@pytest.fixture(scope="module")
def tiny(tiny_models):
    return tiny_models("llama")


@pytest.mark.parametrize("arch", ["llama", "phi3", "gemma3"])
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_eager_model_equals_transformers_gguf_loading(tiny_models, arch, qtype):
    tiny = tiny_models(arch)
    path = tiny["gguf"][qtype]
    (tiny["root"] / qtype).mkdir()
    cfg = load_config(write_config(tiny["root"] / qtype, path, tiny["adapter"]))
    foundation = load_foundation(cfg.foundation)
    assert foundation.source["kind"] == "gguf" and foundation.args.n_kv_heads == KV_HEADS[arch]
    assert foundation.args.model_type == FAMILY[arch]
    got = eager_model(foundation).step(PROMPT, 0)
    assert (got - transformers_logits(path.parent, path.name)).abs().max() <= TOL
    if qtype == "F32":  # F32 holds the Hugging Face weights exactly, Q and K rows back in their order
        assert (got - transformers_logits(tiny["hf"])).abs().max() <= TOL


@pytest.mark.parametrize("arch", ["llama", "phi3", "gemma3"])
def test_build_from_gguf_with_a_peft_adapter_equals_transformers_peft(tiny_models, arch):
    """A config whose checkpoint is the Q8_0 .gguf builds; its adapter, trained on the Hugging Face
    form (for Phi-3, LoRA on the fused qkv_proj and gate_up_proj), gives transformers + peft's
    logits over transformers' GGUF loading of the same file."""
    tiny = tiny_models(arch)
    root = tiny["root"] / "build"
    root.mkdir()
    config = write_config(root, tiny["gguf"]["Q8_0"], tiny["adapter"])
    manifest = lora_share.build(config, quiet=True)
    assert manifest["foundation"]["source"]["kind"] == "gguf"
    got = lora_share.run(root / "out" / "a.pte", root / "out" / "foundation.ptd", PROMPT, 1)
    ref = transformers_logits(tiny["root"], tiny["gguf"]["Q8_0"].name, tiny["adapter"])
    assert np.abs(got.logits[0] - ref.numpy()).max() <= TOL
    assert got.tokens[0] == int(ref.argmax())


def _refused(tiny, path: Path, *needles: str):
    root = path.parent / f"cfg-{path.stem}"
    root.mkdir()
    proc = run_cli("build", write_config(root, path, tiny["adapter"]))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and str(path) in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_unsupported_architecture_is_refused(tiny):
    path = write_gguf(tiny["hf"], tiny["root"] / "gemma2.gguf", arch="gemma2")
    _refused(tiny, path, "general.architecture", "gemma2")


def test_unknown_tensor_is_refused(tiny):
    path = write_gguf(tiny["hf"], tiny["root"] / "extra.gguf", extra_tensor="blk.0.attn_sinks.weight")
    _refused(tiny, path, "blk.0.attn_sinks.weight")


def test_missing_metadata_key_is_refused(tiny):
    path = write_gguf(tiny["hf"], tiny["root"] / "nokey.gguf", drop_key="feed_forward_length")
    _refused(tiny, path, "llama.feed_forward_length")


def test_truncated_file_is_refused(tiny):
    path = tiny["root"] / "cut.gguf"
    data = tiny["gguf"]["F32"].read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _refused(tiny, path, "truncated")


PHI3_REFUSED = {  # what the phi3 family refuses, as a Phi-3 GGUF says it: edits, then the words of the message
    "longrope": ({"extra_tensor": "rope_factors_long.weight"}, ["rope_factors_long.weight", "LongRoPE"]),
    "partial_rotary": ({"rope_dimension_count": 12}, ["phi3.rope.dimension_count", "12", "partial rotary"]),
    "short_sliding_window": ({"sliding_window": 8}, ["sliding_window", "8", "max_seq_len"]),
}

GEMMA3_REFUSED = {  # what a Gemma 3 GGUF may say that lora-share cannot read: edits, then the words of the message
    "no_sliding_window": ({"drop_key": "sliding_window"}, ["gemma3.attention.sliding_window", "missing"]),
    "logit_softcapping": ({"final_logit_softcapping": 30.0}, ["gemma3.final_logit_softcapping", "30"]),
}
REFUSED = {"phi3": PHI3_REFUSED, "gemma3": GEMMA3_REFUSED}


@pytest.mark.parametrize("arch,case", [(arch, case) for arch, cases in REFUSED.items() for case in cases])
def test_architecture_refusals(tiny_models, arch, case):
    tiny = tiny_models(arch)
    edits, needles = REFUSED[arch][case]
    path = write_gguf(tiny["hf"], tiny["root"] / f"{case}.gguf", arch=arch, **edits)
    _refused(tiny, path, *needles)
