"""Tiny checkpoints of every model family, with PEFT adapters, for the configs in this folder.

    .venv/bin/python examples/families/tiny_checkpoints.py           # every family -> out/families/<family>/
    .venv/bin/python examples/families/tiny_checkpoints.py phi3      # one family
    .venv/bin/lora-share build examples/families/phi3.yaml

Each checkpoint is written by the family's own transformers class (``Qwen2ForCausalLM``,
``Phi3ForCausalLM``, ...) with random weights, scaled so that the logits are far from ties
(embeddings ~N(0, 1), linears ~N(0, 1/fan_in)), with every norm and bias moved away from its
initial value; each adapter is made by peft's ``get_peft_model`` on several linears, with
A and B random (PEFT starts B at zero, which would change nothing). Both are saved with
``save_pretrained``, as a training run saves them. tests/test_families.py writes these very
files, builds each family's config and compares the outputs with transformers + peft.

Needs transformers and peft (installed by ``make setup`` with the test tools).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "out" / "families"

# Every family's checkpoint: 2 layers, width 64, grouped-query attention, a 300-token vocabulary.
_TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 300,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Spec:
    """One family's tiny checkpoint and its adapters."""

    model_class: str  # the transformers class that writes the checkpoint
    config: dict  # the arguments of its config class
    adapters: dict  # adapter name -> the arguments of peft's LoraConfig
    seed: int
    embedding_std: float = 1.0  # Gemma scales embeddings by sqrt(hidden_size): 1/sqrt(hidden_size) here


SPECS = {
    # Llama 3.2's layout: tied embeddings, explicit head_dim, llama3-scaled RoPE (theta and the
    # original context are small here so that the scaling changes frequencies the positions use).
    "llama": Spec(
        "LlamaForCausalLM",
        {
            **_TINY,
            "head_dim": 16,
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
        {
            "a": {
                "r": 4,
                "lora_alpha": 8,
                "target_modules": _ALL,
                "use_rslora": True,
                "exclude_modules": ["model.layers.0.mlp.down_proj"],
            }
        },
        seed=10,
        embedding_std=0.3,
    ),
    # Qwen2.5's layout: q/k/v biases, untied. Two adapters of one recipe, one program.
    "qwen2": Spec(
        "Qwen2ForCausalLM",
        {**_TINY, "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
        {
            name: {
                "r": 4,
                "lora_alpha": 8,
                "target_modules": _ALL,
                "rank_pattern": {"v_proj": 2},
                "alpha_pattern": {"o_proj": 3},
            }
            for name in ("a", "b")
        },
        seed=20,
    ),
    # Qwen3's layout: RMSNorm on each query and key head, head_dim 32 (not hidden_size / heads), tied.
    "qwen3": Spec(
        "Qwen3ForCausalLM",
        {**_TINY, "head_dim": 32, "tie_word_embeddings": True},
        {"a": {"r": 4, "lora_alpha": 16, "target_modules": r".*\.(q_proj|k_proj|v_proj|o_proj|down_proj)"}},
        seed=30,
        embedding_std=0.3,
    ),
    # Mistral: explicit head_dim; a sliding window no shorter than the context (max_seq_len 32).
    "mistral": Spec(
        "MistralForCausalLM",
        {**_TINY, "head_dim": 32, "sliding_window": 32, "tie_word_embeddings": False},
        {
            "a": {
                "r": 8,
                "lora_alpha": 16,
                "target_modules": ["q_proj", "v_proj", "gate_proj", "down_proj"],
                "layers_to_transform": [1],
            }
        },
        seed=40,
    ),
    # Gemma: (1 + w) RMSNorm, embeddings times sqrt(96), GeGLU (gelu_pytorch_tanh), one key/value head
    # of 32 (head_dim explicit), tied embeddings.
    "gemma": Spec(
        "GemmaForCausalLM",
        {
            **_TINY,
            "hidden_size": 96,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "hidden_act": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
        },
        {"a": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "exclude_modules": ["up_proj"]}},
        seed=50,
        embedding_std=0.3 * 96**-0.5,
    ),
    # Gemma 3's text model: q/k norms, four norms per layer, query_pre_attn_scalar, sliding layers with
    # their own RoPE base and a window of 4 (tests/test_families.py's prompt is longer, and generation
    # crosses it), the second layer over the whole context; one key/value head, tied embeddings;
    # LoRA on all seven linears.
    "gemma3_text": Spec(
        "Gemma3ForCausalLM",
        {
            **_TINY,
            "hidden_size": 96,
            "num_hidden_layers": 3,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "query_pre_attn_scalar": 24,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        },
        {"a": {"r": 4, "lora_alpha": 8, "target_modules": _ALL}},
        seed=70,
        embedding_std=0.3 * 96**-0.5,
    ),
    # Phi-3's layout: fused qkv_proj and gate_up_proj, untied, LoRA on the fused linears. Two
    # adapters of one recipe, one program (each one's A is shared by q, k and v).
    "phi3": Spec(
        "Phi3ForCausalLM",
        {**_TINY, "tie_word_embeddings": False, "sliding_window": 48},
        {
            name: {
                "r": 4,
                "lora_alpha": 8,
                "target_modules": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
                "rank_pattern": {"qkv_proj": 8},
                "alpha_pattern": {"gate_up_proj": 4},
            }
            for name in ("a", "b")
        },
        seed=61,
    ),
}


def _randomize(model: torch.nn.Module, spec: Spec, gen: torch.Generator) -> None:
    """Weights far from ties; norms and biases moved off their initial values. The token
    embeddings enter the residual stream at about the size of each layer's output (else the
    input token dominates and greedy decoding repeats it); an untied lm_head gives logits
    with a standard deviation of about 4."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.add_(0.1 * noise)  # ones, or zeros where the norm applies 1 + w (Gemma)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            elif name == "model.embed_tokens.weight":
                p.copy_(noise * spec.embedding_std)
            elif name == "lm_head.weight":
                p.copy_(noise * 4 / math.sqrt(p.shape[1]))
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))


def _lora_weights(model: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if ".lora_A." in name:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            elif ".lora_B." in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def write_family(family: str, folder: Path) -> Path:
    """``folder/model`` (the checkpoint) and ``folder/<name>`` for each adapter of ``SPECS[family]``."""
    return write_checkpoint(SPECS[family], folder)


def write_checkpoint(spec: Spec, folder: Path) -> Path:
    """``folder/model`` (the checkpoint) and ``folder/<name>`` for each adapter of ``spec``."""
    import transformers
    from peft import LoraConfig, get_peft_model

    model_class = getattr(transformers, spec.model_class)
    gen = torch.Generator().manual_seed(spec.seed)
    base = model_class(model_class.config_class(**spec.config))
    _randomize(base, spec, gen)
    base.save_pretrained(folder / "model")
    for name, lora in spec.adapters.items():
        model = model_class(base.config)  # a fresh copy: get_peft_model changes the model it wraps
        model.load_state_dict(base.state_dict())
        peft_model = get_peft_model(model, LoraConfig(**lora))
        _lora_weights(peft_model, gen)
        peft_model.save_pretrained(folder / name)
    return folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Write a tiny checkpoint and PEFT adapters of each model family.")
    p.add_argument("families", nargs="*", metavar="FAMILY", help=f"which ({', '.join(SPECS)}; default: all)")
    p.add_argument("--out", type=Path, default=OUT, help=f"where (default: {OUT.relative_to(REPO)}/<family>)")
    ns = p.parse_args(argv)
    unknown = sorted(set(ns.families) - set(SPECS))
    if unknown:
        p.error(f"unknown family {unknown[0]!r} (known: {', '.join(SPECS)})")
    for family in ns.families or SPECS:
        folder = write_family(family, ns.out / family)
        print(f"{family}: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
