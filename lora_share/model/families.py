"""Model families: each Hugging Face ``model_type`` lora-share exports, as switches of the one decoder.

There is one decoder (model/decoder.py). A family is data (``FAMILIES``): which ``ModelArgs``
switches its config.json turns on, transformers' defaults for the keys a config.json
may omit, and how its checkpoint and PEFT adapters name the linears.

- llama (Llama 2, 3, 3.1, 3.2, SmolLM, ...): the decoder as it is; ``attention_bias``
  and ``mlp_bias`` add biases; RoPE default or llama3-scaled.
- qwen2 (Qwen2, Qwen2.5): biases on q/k/v.
- qwen3 (dense Qwen3): RMSNorm over head_dim on queries and keys, explicit head_dim.
- mistral: explicit head_dim; a sliding window must cover the context.
- gemma (Gemma 1): RMSNorm weight applied as 1 + w, embeddings times sqrt(hidden_size),
  GeGLU with gelu_pytorch_tanh, tied embeddings, explicit head_dim.
- gemma3_text (Gemma 3's text model, Gemma3ForCausalLM: 270M, 1B): Gemma 1's switches, plus
  RMSNorm over head_dim on queries and keys, a norm after attention and around the MLP
  (``sandwich_norms``), the attention scale ``query_pre_attn_scalar ** -0.5``, and sliding-window
  layers (``layer_types``, else every layer but each sixth) with their own RoPE base
  (``rope_local_base_freq``, or transformers 5's ``rope_parameters.sliding_attention``).
- phi3 (Phi-3 with plain RoPE): fused ``qkv_proj`` and ``gate_up_proj``, split by rows at
  load time (``to_decoder_names``), and a PEFT LoRA on a fused linear becomes LoRA on
  each part with the same A and B split by rows (``hf_linears``).

``model_args`` reads a config.json into ``ModelArgs``. Whatever would change the math
and is not implemented (another model_type, Gemma 2, multimodal Gemma 3, a sliding window shorter
than the context outside Gemma 3, RoPE scaling other than llama3, partial rotary embeddings, logit soft-capping,
another activation) is refused with one message naming the file, the field and its value.
Both config.json formats are read: transformers 4's ``rope_theta`` + ``rope_scaling`` and
transformers 5's ``rope_parameters``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from .args import ACTIVATION_NAMES, LORA_TARGETS, ModelArgs

if TYPE_CHECKING:
    import torch

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` maps onto the decoder."""

    models: str  # which models, for the message that lists the families
    defaults: Mapping[str, object]  # transformers' defaults for keys its config.json may omit
    qkv_bias: bool = False  # q/k/v always have a bias (Qwen2)
    bias_keys: tuple[str, ...] = ()  # config keys that add biases: attention_bias (q/k/v/o), mlp_bias (MLP)
    qk_norm: bool = False  # RMSNorm over head_dim on queries and keys before RoPE (Qwen3)
    norm_offset: float = 0.0  # RMSNorm weight applied as offset + w (Gemma: 1)
    scale_embeddings: bool = False  # embeddings times sqrt(hidden_size), rounded to float32 (Gemma)
    act_keys: tuple[str, ...] = ("hidden_act",)  # where the MLP activation is named: the first one set
    act_aliases: Mapping[str, str] = field(default_factory=dict)  # activation names read as another
    fused: bool = False  # q/k/v in one qkv_proj, gate/up in one gate_up_proj (Phi-3)
    # Where sliding_window applies: "none" (never), "all" (every layer, when set), "qwen" (when
    # use_sliding_window, on the layers layer_types or max_window_layers make sliding): refused when
    # shorter than the context; "gemma3": on the layers layer_types (else the pattern) makes sliding,
    # computed, each with the local RoPE base.
    sliding: str = "none"
    sandwich_norms: bool = False  # norms after attention and MLP, and one before the MLP (Gemma 3)


_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "head_dim": None}
_QWEN_WINDOW = {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}

FAMILIES: dict[str, Family] = {
    "llama": Family("Llama 2, 3, 3.1, 3.2, SmolLM", _DEFAULTS, bias_keys=("attention_bias", "mlp_bias")),
    "qwen2": Family("Qwen2, Qwen2.5", {**_DEFAULTS, **_QWEN_WINDOW}, qkv_bias=True, sliding="qwen"),
    "qwen3": Family(
        "dense Qwen3",
        {**_DEFAULTS, **_QWEN_WINDOW, "head_dim": 128},
        bias_keys=("attention_bias",),
        qk_norm=True,
        sliding="qwen",
    ),
    "mistral": Family("Mistral", {**_DEFAULTS, "sliding_window": 4096}, sliding="all"),
    "gemma": Family(
        "Gemma 1",
        {**_DEFAULTS, "tie_word_embeddings": True, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh"},
        bias_keys=("attention_bias",),
        norm_offset=1.0,
        scale_embeddings=True,
        # transformers 4 read hidden_activation when set; both read the legacy "gelu" as tanh GELU
        act_keys=("hidden_activation", "hidden_act"),
        act_aliases={"gelu": "gelu_pytorch_tanh"},
    ),
    "gemma3_text": Family(
        "Gemma 3 text (Gemma3ForCausalLM)",
        {
            **_DEFAULTS,
            "tie_word_embeddings": True,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "query_pre_attn_scalar": 256,
            "sliding_window": 4096,
        },
        bias_keys=("attention_bias",),
        qk_norm=True,
        norm_offset=1.0,
        scale_embeddings=True,
        act_keys=("hidden_activation",),
        sliding="gemma3",
        sandwich_norms=True,
    ),
    "phi3": Family("Phi-3", {**_DEFAULTS, "rms_norm_eps": 1e-5, "sliding_window": None}, fused=True, sliding="all"),
}

# Families refused by name: what they need that the decoder does not have.
REFUSED = {
    "gemma2": "soft-caps attention and output logits, which lora-share's decoder does not",
    "gemma3": "is the multimodal Gemma 3 (text_config and a vision tower); lora-share takes Gemma 3's text "
    "model, model_type 'gemma3_text' (Gemma3ForCausalLM checkpoints: 270M, 1B)",
}

# Config keys that change the math when set (not null or false), on any family.
_UNSUPPORTED_WHEN_SET = {
    "attn_logit_softcapping": "soft-capping of attention scores",
    "final_logit_softcapping": "soft-capping of the output logits",
    "use_bidirectional_attention": "bidirectional attention",
}


def model_args(config: dict, where: Path, max_seq_len: int) -> ModelArgs:
    """ModelArgs from a Hugging Face config.json (``config``, read from ``where``), with the switches
    of its family; refuses what changes the math and is not supported, naming file, field and value."""

    def bad(key, msg):
        raise UserError(f"{where}: {key}: {msg}")

    kind = config.get("model_type", "llama")
    supported = "; ".join(f"{name} ({f.models})" for name, f in FAMILIES.items())
    if kind in REFUSED:
        bad("model_type", f"{kind!r} is not supported: it {REFUSED[kind]} (supported: {supported})")
    if kind not in FAMILIES:
        bad("model_type", f"{kind!r} is not supported (supported: {supported})")
    family = FAMILIES[kind]
    c = {**family.defaults, **config}
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not _positive_int(c.get(key)):
            bad(key, "missing or not a positive integer")
    for key in ("num_key_value_heads", "head_dim", "sliding_window"):
        if c.get(key) is not None and not _positive_int(c[key]):
            bad(key, f"{c[key]!r} is not a positive integer")
    if not _number(c["rms_norm_eps"]):
        bad("rms_norm_eps", f"{c['rms_norm_eps']!r} is not a number")
    for key, what in _UNSUPPORTED_WHEN_SET.items():
        if c.get(key) not in (None, False):
            bad(key, f"{c[key]!r}: {what} is not supported by lora-share")
    dim, n_heads = c["hidden_size"], c["num_attention_heads"]
    n_kv = c.get("num_key_value_heads") or n_heads
    head_dim = c.get("head_dim") or dim // n_heads
    if n_heads % n_kv:
        bad("num_key_value_heads", f"{n_kv} does not divide num_attention_heads {n_heads}")
    if head_dim % 2:
        bad("head_dim", f"{head_dim} is odd; RoPE needs an even head size")
    _check_window(c, family, max_seq_len, bad)
    theta, scaling = _rope(c, bad)
    local = _gemma3_layers(c, bad) if family.sliding == "gemma3" else {}
    biased = {key for key in family.bias_keys if c.get(key)}
    return ModelArgs(
        dim=dim,
        n_layers=c["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=n_kv,
        hidden_dim=c["intermediate_size"],
        vocab_size=c["vocab_size"],
        head_dim=c.get("head_dim"),
        norm_eps=float(c["rms_norm_eps"]),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=bool(c["tie_word_embeddings"]),
        max_seq_len=max_seq_len,
        model_type=kind,
        qkv_bias=family.qkv_bias or "attention_bias" in biased,
        o_bias="attention_bias" in biased,
        mlp_bias="mlp_bias" in biased,
        qk_norm=family.qk_norm,
        norm_offset=family.norm_offset,
        embed_scale=_float32(dim**0.5) if family.scale_embeddings else 1.0,
        activation=_activation(c, family, bad),
        sandwich_norms=family.sandwich_norms,
        **local,
    )


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _float32(x: float) -> float:
    """``x`` rounded to the nearest float32, as torch rounds it (no torch import for a config)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _activation(c: dict, family: Family, bad) -> str:
    key = next((k for k in family.act_keys if c.get(k) is not None), "hidden_act")
    act = family.act_aliases.get(c.get(key), c.get(key))
    if act not in ACTIVATION_NAMES:
        bad(key, f"{c[key]!r} is not supported (supported: {', '.join(ACTIVATION_NAMES)})")
    return act


def _check_window(c: dict, family: Family, max_seq_len: int, bad) -> None:
    """Refuse a sliding window that is shorter than the context on any layer it applies to: each
    position attends to the last ``sliding_window`` positions, so a window of at least max_seq_len
    is full attention, which is what the decoder computes."""
    window = c.get("sliding_window")
    if family.sliding in ("none", "gemma3") or window is None:  # Gemma 3 computes its windows
        return
    if family.sliding == "qwen":
        if not c.get("use_sliding_window"):
            return
        first = c["max_window_layers"]  # the first sliding layer, unless layer_types says which
        if not c.get("layer_types") and not (isinstance(first, int) and not isinstance(first, bool)):
            bad("max_window_layers", f"{first!r} is not an integer")
        types = c.get("layer_types") or [
            "sliding_attention" if i >= first else "full_attention" for i in range(c["num_hidden_layers"])
        ]
        if "sliding_attention" not in types:
            return
    if window < max_seq_len:
        bad(
            "sliding_window",
            f"{window} is shorter than the context (foundation.max_seq_len {max_seq_len}) and "
            f"sliding-window attention is not supported; set max_seq_len to at most {window}",
        )


def _gemma3_layers(c: dict, bad) -> dict:
    """Gemma 3's ModelArgs beyond Gemma 1's: which layers slide (``layer_types``, else every layer but
    each ``sliding_window_pattern``-th, 6), their window and RoPE base, and the attention scale."""
    n = c["num_hidden_layers"]
    types = c.get("layer_types")
    if types is None:
        pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
        if not _positive_int(pattern):
            bad("sliding_window_pattern", f"{pattern!r} is not a positive integer")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        bad("layer_types", f"{types!r} is not a list of {n} 'sliding_attention' / 'full_attention'")
    if c.get("sliding_window") is None:
        bad("sliding_window", "missing: Gemma 3's sliding layers need their window")
    scalar = c["query_pre_attn_scalar"]
    if not _number(scalar) or scalar <= 0:
        bad("query_pre_attn_scalar", f"{scalar!r} is not a positive number")
    params = c.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("sliding_attention"), dict):
        # transformers 5: one RoPE parameter set per layer type (read by _rope for the full layers).
        local = {**c, "rope_scaling": None, "rope_parameters": params["sliding_attention"]}
    else:
        local = {"rope_theta": c["rope_local_base_freq"]}
    theta, scaling = _rope(local, bad)
    if scaling is not None:
        bad("rope_parameters", "scaled RoPE on the sliding layers is not supported")
    return {
        "sliding_window": c["sliding_window"],
        "local_rope_theta": theta,
        "attn_scale": float(scalar) ** -0.5,
        "sliding_layers": tuple(i for i, kind in enumerate(types) if kind == "sliding_attention"),
    }


def _rope(c: dict, bad) -> tuple[float, dict | None]:
    """(rope_theta, llama3 scaling or None) from either config.json format; refuses the other kinds.
    Of transformers 5's parameters per layer type (Gemma 3), the full-attention layers'."""
    key = "rope_scaling" if c.get("rope_scaling") else "rope_parameters"
    params = c.get(key) or {}  # transformers 5 reads rope_scaling first, as this does
    if not isinstance(params, dict):
        bad(key, f"{params!r} is not a mapping")
    if c.get("model_type") == "gemma3_text" and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    if any(isinstance(v, dict) for v in params.values()):
        bad(key, f"{params!r}: RoPE parameters per layer type are not supported")
    theta = params.get("rope_theta", c.get("rope_theta", 10000.0))
    if not _number(theta) or theta <= 0:
        bad(f"{key}.rope_theta" if "rope_theta" in params else "rope_theta", f"{theta!r} is not a positive number")
    partial = params.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        bad("partial_rotary_factor", f"{partial!r}: partial rotary embeddings are not supported (supported: 1.0)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        bad(key, f"{kind!r} is not supported (supported RoPE types: default, llama3)")
    # transformers takes original_max_position_embeddings from the top level first, then from the
    # RoPE parameters, then max_position_embeddings.
    values = {name: params.get(name) for name in ("factor", "low_freq_factor", "high_freq_factor")}
    original = params.get("original_max_position_embeddings", c.get("max_position_embeddings"))
    values["original_max_position_embeddings"] = c.get("original_max_position_embeddings", original)
    missing = [name for name, v in values.items() if not _number(v)]
    if missing:
        bad(key, f"'llama3' scaling needs {', '.join(missing)} (numbers)")
    return float(theta), {"rope_type": "llama3", **values}


@dataclass(frozen=True)
class HFLinear:
    """One linear as a family's checkpoint and PEFT adapters name it, and the decoder linears it holds."""

    name: str  # q_proj ... down_proj, or Phi-3's fused qkv_proj / gate_up_proj
    block: str  # self_attn or mlp
    parts: tuple[tuple[str, int, int], ...]  # (decoder linear, first row, end row) of its output
    in_features: int

    @property
    def out_features(self) -> int:
        return self.parts[-1][2]


def hf_linears(args: ModelArgs) -> tuple[HFLinear, ...]:
    """The linears of one decoder layer as ``args``' family names them (Phi-3 fuses q/k/v and gate/up)."""

    def plain(target: str) -> HFLinear:
        out_f, in_f = args.linear_shape(target)
        return HFLinear(target, "self_attn" if target in ATTN else "mlp", ((target, 0, out_f),), in_f)

    if not FAMILIES[args.model_type].fused:
        return tuple(plain(t) for t in LORA_TARGETS)
    q, kv, h = args.linear_shape("q_proj")[0], args.linear_shape("k_proj")[0], args.hidden_dim
    return (
        HFLinear(
            "qkv_proj", "self_attn", (("q_proj", 0, q), ("k_proj", q, q + kv), ("v_proj", q + kv, q + 2 * kv)), args.dim
        ),
        plain("o_proj"),
        HFLinear("gate_up_proj", "mlp", (("gate_proj", 0, h), ("up_proj", h, 2 * h)), args.dim),
        plain("down_proj"),
    )


def to_decoder_names(tensors: dict[str, torch.Tensor], args: ModelArgs, where: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the decoder's (Hugging Face llama) names: each fused weight
    (Phi-3's ``qkv_proj``, ``gate_up_proj``) split by rows into the linears it holds."""
    out = dict(tensors)
    for lin in hf_linears(args):
        if len(lin.parts) == 1:
            continue
        for layer in range(args.n_layers):
            name = f"model.layers.{layer}.{lin.block}.{lin.name}.weight"
            shape = [lin.out_features, lin.in_features]
            if name not in out:
                raise UserError(f"{where}: tensor {name!r} is missing from the checkpoint (expected shape {shape})")
            t = out.pop(name)
            if list(t.shape) != shape:
                raise UserError(f"{where}: tensor {name!r} has shape {list(t.shape)}, config.json implies {shape}")
            for target, start, end in lin.parts:  # own memory: XNNPACK serializes a weight's whole storage
                out[f"model.layers.{layer}.{lin.block}.{target}.weight"] = t[start:end].clone()
    return out
