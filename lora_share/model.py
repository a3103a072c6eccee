"""A llama-family decoder with a KV cache and LoRA, written for export.

The module tree mirrors Hugging Face's ``LlamaForCausalLM`` so that foundation
parameter names are Hugging Face's own (``model.layers.0.self_attn.q_proj.weight``)
and LoRA parameters sit beside them (``...q_proj.lora_a.weight``). Only standard
ATen ops are used, so the exported program runs on the stand-alone ExecuTorch
runtime: the KV cache is a mutable buffer updated with ``index_copy_`` and
attention is a masked matmul/softmax over the whole cache.

``forward(tokens [1, T] int64, input_pos [1] int64) -> logits [1, vocab]``
returns the logits at the last of the T positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_param_name(layer: int, target: str, which: str) -> str:
    """The dotted name of LoRA matrix ``which`` ('a' or 'b') of ``target`` in decoder layer ``layer``."""
    block = "self_attn" if LORA_TARGETS.index(target) < 4 else "mlp"
    return f"model.layers.{layer}.{block}.{target}.lora_{which}.weight"


@dataclass(frozen=True)
class ModelArgs:
    """Shape of the foundation model (Hugging Face llama config, flattened)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    vocab_size: int
    head_dim: int | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Mapping | None = None
    tie_embeddings: bool = False
    max_seq_len: int = 128

    @property
    def hd(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    def linear_shape(self, target: str) -> tuple[int, int]:
        """(out_features, in_features) of the linear named ``target``."""
        q, kv = self.n_heads * self.hd, self.n_kv_heads * self.hd
        return {
            "q_proj": (q, self.dim),
            "k_proj": (kv, self.dim),
            "v_proj": (kv, self.dim),
            "o_proj": (self.dim, q),
            "gate_proj": (self.hidden_dim, self.dim),
            "up_proj": (self.hidden_dim, self.dim),
            "down_proj": (self.dim, self.hidden_dim),
        }[target]


@dataclass(frozen=True)
class LoraSpec:
    """Where LoRA goes: ``ranks[(layer, target)] = r``. Scale is folded into B."""

    ranks: Mapping[tuple[int, str], int] = field(default_factory=dict)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse RoPE frequencies as Hugging Face computes them (incl. llama3 scaling)."""
    hd = args.hd
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaling = dict(args.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv_freq
    # "llama3" (validated upstream): smooth interpolation between low and high frequencies.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class Linear(nn.Linear):
    """A bias-free linear with optional LoRA: ``x W^T + (x A^T) B^T`` (scale folded into B).

    An ``nn.Linear`` (weight named ``weight``, as Hugging Face names it) so that
    torchao's ``quantize_`` can replace the foundation weight with a quantized
    tensor; ``lora_a``/``lora_b`` are child linears that stay float.
    """

    def __init__(self, in_f: int, out_f: int, rank: int = 0):
        super().__init__(in_f, out_f, bias=False)
        if rank:
            self.lora_a = nn.Linear(in_f, rank, bias=False)
            self.lora_b = nn.Linear(rank, out_f, bias=False)
        self.rank = rank

    def reset_parameters(self) -> None:
        """No random init: every foundation weight is copied in from the checkpoint."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.rank:
            y = y + self.lora_b(self.lora_a(x))
        return y


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, lora: LoraSpec):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = args.n_heads, args.n_kv_heads, args.hd
        for t in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out_f, in_f = args.linear_shape(t)
            setattr(self, t, Linear(in_f, out_f, lora.ranks.get((layer, t), 0)))
        cache = (1, self.n_kv, args.max_seq_len, self.hd)
        self.register_buffer("k_cache", torch.zeros(cache), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache), persistent=False)

    def forward(self, x, cos, sin, positions, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self.k_cache.index_copy_(2, positions, k)
        self.v_cache.index_copy_(2, positions, v)
        rep = self.n_heads // self.n_kv
        keys = self.k_cache.repeat_interleave(rep, dim=1)
        values = self.v_cache.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, keys.transpose(2, 3)) / math.sqrt(self.hd)
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), values)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, lora: LoraSpec):
        super().__init__()
        for t in ("gate_proj", "up_proj", "down_proj"):
            out_f, in_f = args.linear_shape(t)
            setattr(self, t, Linear(in_f, out_f, lora.ranks.get((layer, t), 0)))

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, lora: LoraSpec):
        super().__init__()
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.self_attn = Attention(args, layer, lora)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = MLP(args, layer, lora)

    def forward(self, x, cos, sin, positions, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    def __init__(self, args: ModelArgs, lora: LoraSpec):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(DecoderLayer(args, i, lora) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)


class LlamaLoRA(nn.Module):
    """Llama decoder with KV cache; LoRA where ``lora`` says. See module docstring."""

    def __init__(self, args: ModelArgs, lora: LoraSpec | None = None):
        super().__init__()
        self.args = args
        self.model = Backbone(args, lora or LoraSpec())
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        freqs = torch.outer(torch.arange(args.max_seq_len).float(), rope_inv_freq(args))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)
        self.register_buffer("cache_slots", torch.arange(args.max_seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        positions = input_pos + torch.arange(t, dtype=torch.int64)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        # True where a query position must not see a cache slot (future or unwritten).
        mask = self.cache_slots.unsqueeze(0) > positions.unsqueeze(1)
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h, cos, sin, positions, mask)
        h = self.model.norm(h[:, -1, :])
        return self.lm_head(h)

    def reset_cache(self) -> None:
        for layer in self.model.layers:
            layer.self_attn.k_cache.zero_()
            layer.self_attn.v_cache.zero_()
