"""Writers for Hugging Face llama folders and PEFT LoRA folders, as those libraries save them.

Tests write their own checkpoints with these (no downloads), then compare
lora-share's exports against transformers + peft loading the very same files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def hf_config(dim=64, layers=2, heads=4, kv_heads=2, hidden=160, vocab=320, tied=True, **extra) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": hidden,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        **extra,
    }


def linear_shapes(c: dict) -> dict[str, tuple[int, int]]:
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    q, kv, d, h = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["hidden_size"], c["intermediate_size"]
    return {
        "q_proj": (q, d),
        "k_proj": (kv, d),
        "v_proj": (kv, d),
        "o_proj": (d, q),
        "gate_proj": (h, d),
        "up_proj": (h, d),
        "down_proj": (d, h),
    }


def write_hf_llama(folder: Path, config: dict, seed: int = 0, shards: int = 1) -> Path:
    """config.json + model.safetensors (or `shards` files + model.safetensors.index.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    d, v = config["hidden_size"], config["vocab_size"]
    t = {
        "model.embed_tokens.weight": torch.randn(v, d, generator=g),
        "model.norm.weight": 1 + 0.1 * torch.randn(d, generator=g),
    }
    for i in range(config["num_hidden_layers"]):
        for name, (o, n) in linear_shapes(config).items():
            block = "self_attn" if name in ATTN else "mlp"
            t[f"model.layers.{i}.{block}.{name}.weight"] = torch.randn(o, n, generator=g) / n**0.5
        for norm in ("input_layernorm", "post_attention_layernorm"):
            t[f"model.layers.{i}.{norm}.weight"] = 1 + 0.1 * torch.randn(d, generator=g)
    if not config["tie_word_embeddings"]:
        t["lm_head.weight"] = torch.randn(v, d, generator=g) / d**0.5
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    names = sorted(t)
    if shards == 1:
        save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: t[n] for n in names[s::shards]}
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def write_peft_lora(
    folder: Path,
    base_config: dict,
    *,
    r: int,
    alpha: float,
    targets: list[str],
    seed: int = 1,
    rank_pattern: dict | None = None,
    alpha_pattern: dict | None = None,
    use_rslora=False,
    layers: list[int] | None = None,
    **extra_config,
) -> Path:
    """adapter_config.json + adapter_model.safetensors with PEFT's key names."""
    import re

    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(base_config["num_hidden_layers"]):
        if layers is not None and i not in layers:
            continue
        for name, (o, n) in linear_shapes(base_config).items():
            if name not in targets:
                continue
            module = f"model.layers.{i}.{'self_attn' if name in ATTN else 'mlp'}.{name}"
            rank = next((v for p, v in (rank_pattern or {}).items() if re.match(rf"(.*\.)?({p})$", module)), r)
            tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, n, generator=g) / n**0.5
            tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(o, rank, generator=g) * 0.2
    cfg = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": r,
        "lora_alpha": alpha,
        "target_modules": targets,
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": use_rslora,
        "use_dora": False,
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "rank_pattern": rank_pattern or {},
        "alpha_pattern": alpha_pattern or {},
        "layers_to_transform": layers,
        "inference_mode": True,
        **extra_config,
    }
    (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder


def hf_peft_logits(base: Path, adapter: Path | None, tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] from transformers' LlamaForCausalLM with peft's LoRA applied."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32, attn_implementation="eager")
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def hf_generate(model, ids: list[int], new: int, eos: list[int] | None = None) -> list[int]:
    """Greedy transformers (+ peft) generation of ``new`` tokens after ``ids``; stops at the
    checkpoint's generation_config eos ids, or at ``eos`` when given ([] = never)."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=new,
            pad_token_id=0,
            **({"eos_token_id": eos} if eos is not None else {}),
        )
    return out[0, len(ids) :].tolist()
