"""A llama-family decoder with a KV cache and LoRA, written for export.

One decoder serves every supported model family: ``ModelArgs`` carries the switches
a family turns on (biases, q/k norms, Gemma's norm offset, embedding scale and
activation); families.py maps each Hugging Face ``model_type`` onto them.

The module tree mirrors Hugging Face's ``LlamaForCausalLM`` so that foundation
parameter names are Hugging Face's own (``model.layers.0.self_attn.q_proj.weight``)
and LoRA parameters sit beside them (``...q_proj.lora_a.weight``). Only standard
ATen ops are used, so the exported program runs on the stand-alone ExecuTorch
runtime: the KV cache is a mutable buffer updated in place (``index_copy_``), and
attention reads the written prefix of the cache only, so a decoded token costs
what its position needs, not the whole context.

``forward(tokens [1, T] int64, cache_positions [P + T] int64) -> logits [1, vocab]``
feeds T tokens at positions P .. P+T-1 and returns the logits at the last one.
``cache_positions`` is ``0, 1, ..., P+T-1`` (``forward_inputs`` builds both): the
cache slots this call attends, its own tokens' positions last. Its *length* bounds
attention as a dynamic input dimension, which XNNPACK plans for and runs (a length
computed inside the graph, from a position value, would be an unbacked size that
XNNPACK refuses, leaving attention to slow single-threaded kernels).
``1 <= T <= prefill_chunk`` and ``P + T <= max_seq_len``; longer prompts are fed in chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GELU_BETA = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation (Hugging Face's ``gelu_pytorch_tanh``), written out as ATen's CPU kernel
    computes it. Not ``F.gelu(x, approximate="tanh")``: ExecuTorch's XNNPACK lowering runs every
    ``gelu`` as the exact (erf) GELU whatever its ``approximate`` says (2.5e-4 off in the logits of
    the tiny Gemma test); tanh, mul and add it runs as they are."""
    return 0.5 * x * (1.0 + torch.tanh(_GELU_BETA * (x + 0.044715 * (x * x * x))))


# The MLP's activation by Hugging Face's name for it (``hidden_act``).
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": gelu_tanh}


def lora_param_name(layer: int, target: str, which: str) -> str:
    """The dotted name of LoRA matrix ``which`` ('a' or 'b') of ``target`` in decoder layer ``layer``."""
    block = "self_attn" if LORA_TARGETS.index(target) < 4 else "mlp"
    return f"model.layers.{layer}.{block}.{target}.lora_{which}.weight"


@dataclass(frozen=True)
class ModelArgs:
    """Shape of the foundation model (Hugging Face config, flattened) and its family's switches.

    The switches default to llama's, so a llama model is built exactly as without them.
    """

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
    prefill_chunk: int | None = None  # most tokens one forward call takes (None: max_seq_len)
    model_type: str = "llama"  # the Hugging Face family (families.py), which sets the switches below
    qkv_bias: bool = False  # q_proj, k_proj, v_proj have a bias (Qwen2; attention_bias)
    o_bias: bool = False  # o_proj has a bias (attention_bias)
    mlp_bias: bool = False  # gate_proj, up_proj, down_proj have a bias (llama's mlp_bias)
    qk_norm: bool = False  # RMSNorm over head_dim on queries and keys, before RoPE (Qwen3)
    norm_offset: float = 0.0  # every RMSNorm weight is applied as norm_offset + weight (Gemma: 1)
    embed_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(dim) in float32)
    activation: str = "silu"  # the MLP's activation, a key of ACTIVATIONS (Gemma: gelu_pytorch_tanh)

    @property
    def chunk(self) -> int:
        """Tokens one forward call takes at most: the prefill chunk, never more than the context."""
        return min(self.prefill_chunk or self.max_seq_len, self.max_seq_len)

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

    def has_bias(self, target: str) -> bool:
        """Whether the linear named ``target`` has a bias."""
        if target in ("q_proj", "k_proj", "v_proj"):
            return self.qkv_bias
        return self.o_bias if target == "o_proj" else self.mlp_bias


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
    """``weight * x / sqrt(mean(x^2) + eps)``. The mean is a linear against a row of ``1 / dim``:
    XNNPACK takes that (its mean takes only 4-D tensors), so the norm stays inside the delegate
    with the linears around it instead of splitting it in two. With an ``offset`` (Gemma: 1)
    the weight is applied as ``offset + weight``, as the checkpoint stores it."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.ones(dim))
        self.register_buffer("mean_row", torch.full((1, dim), 1.0 / dim), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = F.linear(x * x, self.mean_row)
        weight = self.weight + self.offset if self.offset else self.weight
        return weight * (x * torch.rsqrt(var + self.eps))


class Linear(nn.Linear):
    """A linear with optional LoRA: ``x W^T (+ bias) + (x A^T) B^T`` (scale folded into B).

    An ``nn.Linear`` (weight named ``weight``, as Hugging Face names it) so that
    torchao's ``quantize_`` can replace the foundation weight with a quantized
    tensor; ``lora_a``/``lora_b`` are child linears that stay float. Bias-free
    unless ``bias`` (Qwen2's q/k/v, ``attention_bias``, ``mlp_bias``).
    """

    def __init__(self, in_f: int, out_f: int, rank: int = 0, bias: bool = False):
        super().__init__(in_f, out_f, bias=bias)
        if rank:
            self.lora_a = nn.Linear(in_f, rank, bias=False)
            self.lora_b = nn.Linear(rank, out_f, bias=False)
        self.rank = rank

    def reset_parameters(self) -> None:
        """No random init: every foundation weight is copied in from the checkpoint."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.rank:
            y = y + self.lora_b(self.lora_a(x))
        return y


def rotate_half_matrix(hd: int) -> torch.Tensor:
    """``W`` with ``F.linear(x, W) == cat(-x[..., hd/2:], x[..., :hd/2])`` exactly (entries 0 and ±1):
    Hugging Face's ``rotate_half`` as a linear, which XNNPACK runs, instead of slices it does not take
    on dynamic shapes (each would split the delegate and cost a copy)."""
    half = hd // 2
    w = torch.zeros(hd, hd)
    idx = torch.arange(half)
    w[idx, idx + half] = -1.0
    w[idx + half, idx] = 1.0
    return w


class Attention(nn.Module):
    """Grouped-query attention over the written prefix of a KV cache (batch 1).

    Keys are cached transposed, ``[1, n_kv, head_dim, S + 1]``, so the keys of the first
    ``length`` slots are one prefix slice already laid out as the second operand of
    ``scores = q @ K^T``; values are ``[1, n_kv, S + 1, head_dim]`` (S = max_seq_len; the
    spare slot keeps a prefix of S slots from being the whole buffer, a case torch.export
    specialises). The ``rep`` query heads that read one key/value head are ``rep * T`` rows
    of one product: no copy of the cache per query head. Of the layouts measured at
    SmolLM-135M's shape (this one; keys first in the product, which XNNPACK does not
    repack; both), this one decoded fastest at every position (README, "Measured").
    """

    def __init__(self, args: ModelArgs, layer: int, lora: LoraSpec):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = args.n_heads, args.n_kv_heads, args.hd
        for t in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out_f, in_f = args.linear_shape(t)
            setattr(self, t, Linear(in_f, out_f, lora.ranks.get((layer, t), 0), args.has_bias(t)))
        self.qk_norm = args.qk_norm
        if args.qk_norm:  # Qwen3: each head's query and key RMS-normalised over head_dim before RoPE
            self.q_norm = RMSNorm(self.hd, args.norm_eps, args.norm_offset)
            self.k_norm = RMSNorm(self.hd, args.norm_eps, args.norm_offset)
        slots = args.max_seq_len + 1
        self.register_buffer("k_cache", torch.zeros(1, self.n_kv, self.hd, slots), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, self.n_kv, slots, self.hd), persistent=False)
        self.register_buffer("rotate_half", rotate_half_matrix(self.hd), persistent=False)

    def rope(self, x, cos, sin):
        return x * cos + F.linear(x, self.rotate_half) * sin

    def forward(self, x, cos, sin, positions, bias, length):
        """``length`` (a symbolic int) cache slots are attended: every slot written so far.
        ``bias`` ``[1, rep * T, length]`` is 0 where a query row may see a slot, -inf where not."""
        _, t, _ = x.shape
        n_kv, rep, hd = self.n_kv, self.n_heads // self.n_kv, self.hd
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [t, 1, hd]: one rotation per position
        q = self.q_proj(x).view(1, t, self.n_heads, hd)
        q = self.rope(self.q_norm(q) if self.qk_norm else q, cos, sin) * (1.0 / math.sqrt(hd))
        k = self.k_proj(x).view(1, t, n_kv, hd)
        k = self.rope(self.k_norm(k) if self.qk_norm else k, cos, sin)
        v = self.v_proj(x).view(1, t, n_kv, hd)
        self.k_cache.index_copy_(3, positions, k.permute(0, 2, 3, 1))
        self.v_cache.index_copy_(2, positions, v.transpose(1, 2))
        keys_t = self.k_cache.narrow(3, 0, length).view(n_kv, hd, length)
        values = self.v_cache.narrow(2, 0, length).view(n_kv, length, hd)
        # Rows ordered (query head within its group, position), as the rows of ``bias``.
        q = q.view(1, t, n_kv, rep, hd).permute(0, 2, 3, 1, 4).reshape(n_kv, rep * t, hd)
        probs = torch.softmax(torch.bmm(q, keys_t) + bias, dim=-1)
        out = torch.bmm(probs, values).view(n_kv, rep, t, hd).permute(2, 0, 1, 3)
        return self.o_proj(out.reshape(1, t, self.n_heads * hd))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, lora: LoraSpec):
        super().__init__()
        for t in ("gate_proj", "up_proj", "down_proj"):
            out_f, in_f = args.linear_shape(t)
            setattr(self, t, Linear(in_f, out_f, lora.ranks.get((layer, t), 0), args.has_bias(t)))
        self.act = ACTIVATIONS[args.activation]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, lora: LoraSpec):
        super().__init__()
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
        self.self_attn = Attention(args, layer, lora)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
        self.mlp = MLP(args, layer, lora)

    def forward(self, x, cos, sin, positions, bias, length):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, bias, length)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    def __init__(self, args: ModelArgs, lora: LoraSpec):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(DecoderLayer(args, i, lora) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)


def forward_inputs(tokens, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward``'s inputs for ``tokens`` (ids) fed at positions ``pos``, ``pos + 1``, ..."""
    return (torch.tensor([list(tokens)], dtype=torch.int64),
            torch.arange(pos + len(tokens), dtype=torch.int64))


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

    def forward(self, tokens: torch.Tensor, cache_positions: torch.Tensor) -> torch.Tensor:
        t, length = tokens.shape[1], cache_positions.shape[0]
        torch._check(length >= t)
        positions = cache_positions.narrow(0, length - t, t)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        # -inf where a query position must not see a slot (a later one in this chunk), once per
        # call for every layer, and already repeated for the query heads that share a key/value
        # head, so each layer adds it with a broadcast over its leading dimension only.
        mask = cache_positions.unsqueeze(0) > positions.unsqueeze(1)
        rep = self.args.n_heads // self.args.n_kv_heads
        bias = torch.zeros(mask.shape).masked_fill(mask, float("-inf")).repeat(rep, 1).unsqueeze(0)
        h = self.model.embed_tokens(tokens)
        if self.args.embed_scale != 1.0:  # Gemma: sqrt(dim), rounded to float32 as Hugging Face does
            h = h * self.args.embed_scale
        for layer in self.model.layers:
            h = layer(h, cos, sin, positions, bias, length)
        h = self.model.norm(h[:, -1, :])
        return self.lm_head(h)

    def reset_cache(self) -> None:
        for layer in self.model.layers:
            layer.self_attn.k_cache.zero_()
            layer.self_attn.v_cache.zero_()
