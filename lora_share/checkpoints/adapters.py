"""LoRA adapters: PEFT folders or synthetic weights, checked against the foundation.

An adapter becomes ``{(layer, target): (A [r, in], B [out, r])}``, float32 numpy arrays, with the
LoRA scale folded into B, so the exported graph is ``x W^T + (x A^T) B^T`` and its shape depends
only on ranks and targets. A PEFT LoRA on a fused linear (Phi-3's ``qkv_proj``, ``gate_up_proj``)
is LoRA on each linear it holds, with the same A and B split by rows: ``x A^T B^T`` restricted to
those rows. Reading a PEFT folder takes numpy, not torch (checkpoints/reading.py): an adapter is
data for the deployment's program, and ``lora-share add`` never imports torch."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import AdapterConfig, SyntheticAdapter
from ..errors import UserError
from ..files import sha256_file
from ..model.args import LORA_TARGETS, ModelArgs
from ..model.families import ATTN, hf_linears
from .reading import read_float32_safetensors, read_json

# PEFT LoraConfig fields that change the math and that lora-share does not implement,
# with the value that means "off". Anything else set on them is refused, never ignored.
_UNSUPPORTED = {
    "use_dora": (False, None),
    "modules_to_save": (None, []),
    "bias": ("none",),
    "fan_in_fan_out": (False, None),
    "lora_bias": (False, None),
    "layer_replication": (None, []),
    "target_parameters": (None, []),
    "trainable_token_indices": (None, [], {}),
    "use_qalora": (False, None),
    "megatron_config": (None,),
    "alora_invocation_tokens": (None, []),
    "arrow_config": (None,),
    "kasa_config": (None,),
    "monteclora_config": (None,),
    "use_bdlora": (None,),
}


def module_key(layer: int, target: str) -> str:
    """The Hugging Face module name PEFT matches its patterns against."""
    return f"model.layers.{layer}.{'self_attn' if target in ATTN else 'mlp'}.{target}"


@dataclass
class Adapter:
    name: str
    weights: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]  # (A, scale * B), float32, C-contiguous
    meta: dict = field(default_factory=dict)


def load_adapter(cfg: AdapterConfig, args: ModelArgs) -> Adapter:
    if cfg.synthetic is not None:
        return synthetic_adapter(cfg.name, cfg.synthetic, args)
    return load_peft(cfg.name, Path(cfg.peft), args)


def synthetic_adapter(name: str, s: SyntheticAdapter, args: ModelArgs) -> Adapter:
    """Deterministic LoRA weights with a visible effect (PEFT's zero-init B would have none)."""
    import torch  # the weights are torch's random numbers for the seed

    layers = s.layers if s.layers is not None else list(range(args.n_layers))
    for layer in layers:
        if not 0 <= layer < args.n_layers:
            raise UserError(
                f"adapter {name}: synthetic.layers: layer {layer} does not exist (model has {args.n_layers})"
            )
    gen = torch.Generator().manual_seed(s.seed)
    scale = s.alpha / s.rank
    weights = {}
    for layer in sorted(layers):
        for target in sorted(set(s.target_modules), key=LORA_TARGETS.index):
            out_f, in_f = args.linear_shape(target)
            a = torch.randn(s.rank, in_f, generator=gen) / in_f**0.5
            b = torch.randn(out_f, s.rank, generator=gen) * (0.5 / s.rank)
            weights[(layer, target)] = (a.numpy(), (b * scale).numpy())
    meta = {
        "source": {"kind": "synthetic", "seed": s.seed},
        "rank": s.rank,
        "alpha": s.alpha,
        "targets": sorted(set(s.target_modules), key=LORA_TARGETS.index),
        "layers": sorted(layers),
        "use_rslora": False,
    }
    return Adapter(name, weights, meta)


def _pattern_value(patterns: dict, key: str, default):
    """PEFT's rank_pattern/alpha_pattern lookup: first pattern matching the end of the key."""
    for pat, value in patterns.items():
        if re.match(rf"(.*\.)?({pat})$", key):
            return value
    return default


def _targeted(cfg: dict, key: str, layer: int) -> bool:
    """Whether PEFT would wrap module ``key`` given target_modules/exclude_modules/layers_to_transform."""
    excl = cfg.get("exclude_modules")
    if excl:
        if isinstance(excl, str) and re.fullmatch(excl, key):
            return False
        if isinstance(excl, list) and (key in excl or any(key.endswith("." + e) for e in excl)):
            return False
    tm = cfg.get("target_modules")
    if isinstance(tm, str):
        return re.fullmatch(tm, key) is not None
    if not any(key == t or key.endswith("." + t) for t in tm or []):
        return False
    layers = cfg.get("layers_to_transform")
    if layers is None or layers == []:
        return True
    return layer in ([layers] if isinstance(layers, int) else layers)


_KEY_RE = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$"
)


def load_peft(name: str, folder: Path, args: ModelArgs) -> Adapter:
    """Load a PEFT LoRA folder, honouring r, lora_alpha, target_modules, use_rslora,
    rank_pattern and alpha_pattern; refuse whatever else changes the math."""
    cfg_path = folder / "adapter_config.json"
    cfg = read_json(cfg_path, "the PEFT adapter config")

    def bad(key, msg):
        raise UserError(f"{cfg_path}: {key}: {msg}")

    if cfg.get("peft_type", "LORA") != "LORA":
        bad("peft_type", f"{cfg['peft_type']!r} is not supported; only LORA adapters are")
    for key, off in _UNSUPPORTED.items():
        if key in cfg and cfg[key] not in off:
            bad(
                key,
                f"{json.dumps(cfg[key])} changes the adapter's math and is not supported by lora-share; "
                f"retrain without it (supported: {json.dumps(off[0])})",
            )
    if cfg.get("layers_pattern") not in (None, "", "layers", ["layers"]):
        bad("layers_pattern", f"{cfg['layers_pattern']!r} is not supported (every family's layers are 'layers')")
    if not isinstance(cfg.get("r"), int) or cfg["r"] < 1:
        bad("r", "missing or not a positive integer")
    if not cfg.get("target_modules"):
        bad("target_modules", "missing")
    r_default, alpha_default = cfg["r"], cfg.get("lora_alpha", 8)
    rank_pattern, alpha_pattern = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    rslora = bool(cfg.get("use_rslora", False))

    weights_path = folder / "adapter_model.safetensors"
    if not weights_path.is_file():
        raise UserError(f"{folder}: adapter_model.safetensors is missing (only safetensors adapters are read)")
    raw = read_float32_safetensors(weights_path)
    linears = {lin.name: lin for lin in hf_linears(args)}  # as the foundation's family names them
    names = ", ".join(linears)
    found: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, t in raw.items():
        m = _KEY_RE.match(key)
        if not m:
            raise UserError(
                f"{weights_path}: tensor {key!r} is not a LoRA A/B weight of a {args.model_type} linear "
                f"({names}); embeddings, lm_head and extra modules are not supported"
            )
        layer, block, module, ab = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if module not in linears or linears[module].block != block:
            raise UserError(
                f"{weights_path}: tensor {key!r} targets an unknown module {block}.{module} "
                f"(a {args.model_type} model's linears: {names})"
            )
        if layer >= args.n_layers:
            raise UserError(
                f"{weights_path}: tensor {key!r} is for layer {layer}, but the foundation has {args.n_layers} layers"
            )
        found.setdefault((layer, module), {})[ab] = t

    weights = {}
    for layer in range(args.n_layers):
        for lin in linears.values():
            key = f"model.layers.{layer}.{lin.block}.{lin.name}"
            wanted, have = _targeted(cfg, key, layer), (layer, lin.name) in found
            if have and not wanted:
                raise UserError(
                    f"{weights_path}: has LoRA weights for {key}, which adapter_config.json does not target"
                )
            if wanted and not have:
                raise UserError(f"{weights_path}: no LoRA weights for {key}, which adapter_config.json targets")
            if not have:
                continue
            pair = found[(layer, lin.name)]
            if set(pair) != {"A", "B"}:
                raise UserError(f"{weights_path}: {key} has lora_{''.join(pair)} but not both lora_A and lora_B")
            r = _pattern_value(rank_pattern, key, r_default)
            alpha = _pattern_value(alpha_pattern, key, alpha_default)
            out_f, in_f = lin.out_features, lin.in_features
            a, b = pair["A"], pair["B"]
            if tuple(a.shape) != (r, in_f) or tuple(b.shape) != (out_f, r):
                raise UserError(
                    f"{weights_path}: {key}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit the "
                    f"foundation (expected [{r}, {in_f}] and [{out_f}, {r}] for rank {r}): was this adapter "
                    "trained on another model?"
                )
            scale = alpha / math.sqrt(r) if rslora else alpha / r
            b = b * scale  # in float32, as torch multiplies a float32 tensor by a Python float
            for target, start, end in lin.parts:  # one part, or the linears a fused one holds
                weights[(layer, target)] = (a, np.ascontiguousarray(b[start:end]))
    if not weights:
        raise UserError(f"{weights_path}: no LoRA weights found")
    targets = sorted({t for _, t in weights}, key=LORA_TARGETS.index)
    meta = {
        "source": {
            "kind": "peft",
            "path": str(folder),
            "sha256": {p.name: sha256_file(p) for p in (cfg_path, weights_path)},
        },
        "rank": r_default,
        "alpha": alpha_default,
        "targets": targets,
        "layers": sorted({layer for layer, _ in weights}),
        "use_rslora": rslora,
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
    }
    return Adapter(name, weights, meta)
