"""A llama-family decoder with a KV cache and LoRA, written for export.

One decoder serves every supported model family: ``ModelArgs`` carries the switches
a family turns on (biases, q/k norms, Gemma's norm offset, embedding scale and
activation, Gemma 3's sandwich norms, attention scale and sliding layers); model/families.py maps each
Hugging Face ``model_type`` onto them.

The module tree mirrors Hugging Face's ``LlamaForCausalLM`` so that foundation
parameter names are Hugging Face's own (``model.layers.0.self_attn.q_proj.weight``).
LoRA weights are not parameters: they are forward's inputs (below). Only standard
ATen ops are used, so the exported program runs on the stand-alone ExecuTorch runtime.

The KV cache belongs to the caller (the runner, ``lora-share run``, ``KVCache`` here), not to
the program: one buffer of ``n_slabs`` slabs of ``kv_dtype`` (float32, or float16: half the bytes,
attention then runs in float16; ``ModelArgs.kv_dtype``), one per (layer, key or value, key/value head)
in that order (layer 0's keys of heads 0, 1, .., then its values, then layer 1's ...), each
``[max_seq_len, head_dim]``. Row 0 of a slab is a sink that stays zero and is masked (it
keeps an input from being empty at position 0); position p lives at row p + 1, except the last
position's (no later call reads it, so it is not kept). A sliding layer
(Gemma 3) whose window W is shorter than the context keeps a ring instead (``ring_window``): M = W +
MAX_DRAFTS slots after the sink (``ring_size``), ``[M + 1, head_dim]``, position p at row 1 + p % M, passed
whole on every call; the program masks each slot by the position it holds, which it computes from P.

``forward(tokens [1, T] int64, pos [1] int64, *slabs) -> (logits [1, vocab], *new_rows)`` feeds T
tokens at positions P .. P+T-1 (P = ``pos``) and returns the logits at the last one. Slab input j is
slab j's first S rows, ``[S, head_dim]``, for any S with P + 1 <= S <= its rows (a ring: all its
``M + 1``): the program masks rows P + 1 and later, so they may hold anything finite. The export
leaves inputs out of planned memory, so the runtime hands the program its cache in place, without a
copy. The runtimes pass S = P + 1 rounded up to a multiple of ``KV_ROW_BLOCK`` (``kv_view_rows``):
XNNPACK re-plans a delegate's memory whenever an input grows, so a length that grew at every token
cost every decoded token that re-plan (4-5% of an 8da4w token at SmolLM2-135M's shape); llama.cpp
pads its KV view the same way.
``new_rows`` has one ``[n_kv_heads, T, head_dim]`` tensor per (layer, key or value): this call's
keys or values for that group's slabs, head by head, which the caller writes at rows P + 1 .. P + T
(of a ring: at 1 + p % M, in order). ``1 <= T <= prefill_chunk`` and ``P + T <= max_seq_len``; longer
prompts are fed in chunks. ``forward_inputs`` and ``KVCache.write`` implement the caller's side.

``decode``, the program's second method, is forward for T = 1 (same inputs, outputs and weights) with
each layer's attention, from the q, k, v projections to o_proj's input (RoPE, the heads' layout, the
casts to and from the cache's dtype, scores, softmax, weighted values), computed by one
``lora_share::rope_attend`` call (model/decode_attention.py), which reads the cache where it lies, where
forward's products take the past as XNNPACK weights and pack them again on every call. The C++
runtime decodes with it; prompts, and the Python runtime, take forward (``LlamaLoRA.decoding`` traces
it).

``decode_batch`` (``LlamaLoRA.batching``; exported on request, docs/batching.md) decodes B rows, each at its own
position, in its own slot of the KV pools (``KVPools``: N caches, laid out per slab), with its own LoRA rows;
each row carries T entries (T the same for every row of a call, 1 to MAX_DRAFTS + 1): its last token and the
drafts after it, which one call verifies; the foundation's products run once over the B x T entries.

LoRA weights are inputs too, so one program serves every adapter of its envelope (model/envelope.py):
after the slabs come two inputs per envelope slot (layer, linear), in the envelope's order,
``A [r, in]`` and ``B [out, r]`` (the LoRA scale folded into B) with ``1 <= r <= max_rank``.
An adapter without LoRA on a slot passes a zero rank-1 pair there (exactly nothing added).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from .args import KV_DTYPE_NAMES, ModelArgs
from .decode_attention import rope_attend, rope_write_attend_rows
from .quantize import is_quantized

# The runtimes pass each slab's rows in blocks of this many (module docstring, ``kv_view_rows``); the
# C++ runtime's kKvRowBlock is the same.
KV_ROW_BLOCK = 32

# The most drafts a row of the batch method verifies after its last token (speculative decoding,
# docs/batching.md): each row of ``decode_batch`` carries up to MAX_DRAFTS + 1 entries. A ring keeps
# MAX_DRAFTS slots more than its window (``ring_size``), so that the drafts written ahead of a row never
# overwrite a position that an entry of the step, or the next step after a rejection, still reads.
MAX_DRAFTS = 8

_GELU_BETA = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation (Hugging Face's ``gelu_pytorch_tanh``), written out as ATen's CPU kernel
    computes it. Not ``F.gelu(x, approximate="tanh")``: ExecuTorch's XNNPACK lowering runs every
    ``gelu`` as the exact (erf) GELU whatever its ``approximate`` says (2.5e-4 off in the logits of
    the tiny Gemma test); tanh, mul and add it runs as they are."""
    return 0.5 * x * (1.0 + torch.tanh(_GELU_BETA * (x + 0.044715 * (x * x * x))))


# The KV cache's element type by its config name (``ModelArgs.kv_dtype``).
KV_DTYPES = {name: getattr(torch, name) for name in KV_DTYPE_NAMES}

# The MLP's activation by Hugging Face's name for it (``hidden_act``): one for each of args.ACTIVATION_NAMES.
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": gelu_tanh}


def rope_inv_freq(args: ModelArgs, local: bool = False) -> torch.Tensor:
    """Inverse RoPE frequencies as Hugging Face computes them (incl. llama3 scaling); ``local``: the
    sliding layers' (Gemma 3: base ``local_rope_theta``, never scaled)."""
    hd = args.hd
    theta = args.local_rope_theta if local else args.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaling = {} if local else dict(args.rope_scaling or {})
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
    with the linears around it instead of splitting it in two; ``eps`` is that linear's bias (one
    graph node fewer: every node costs memory in every loaded adapter). With an ``offset``
    (Gemma: 1) the weight is applied as ``offset + weight``, as the checkpoint stores it."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.ones(dim))
        self.register_buffer("mean_row", torch.full((1, dim), 1.0 / dim), persistent=False)
        self.register_buffer("eps_bias", torch.full((1,), eps), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var_eps = F.linear(x * x, self.mean_row, self.eps_bias)
        weight = self.weight + self.offset if self.offset else self.weight
        return weight * (x * torch.rsqrt(var_eps))


class Linear(nn.Linear):
    """A foundation linear, with LoRA when the call passes it: ``x W^T (+ bias) + (x A^T) B^T``.

    An ``nn.Linear`` (weight named ``weight``, as Hugging Face names it) so that torchao's
    ``quantize_`` can replace the weight with a quantized tensor. A and B are forward inputs
    (module docstring), never parameters: they stay float, whatever the foundation is. Bias-free
    unless ``bias`` (Qwen2's q/k/v, ``attention_bias``, ``mlp_bias``).

    An asymmetric int4 foundation (model/quantize.py) adds ``offsets``, one float per (output, group of
    inputs): ``x W^T + g offsets^T``, where ``g`` (``group_sums``) sums each group of inputs.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_parameter("offsets", None)
        self.register_buffer("group_ones", None, persistent=False)

    def reset_parameters(self) -> None:
        """No random init: every foundation weight is copied in from the checkpoint."""

    def set_group_offsets(self, offsets: torch.Tensor, group: int) -> None:
        """Add ``offsets`` ``[out, in / group]`` to every weight of its group of ``group`` inputs."""
        self.offsets = nn.Parameter(offsets, requires_grad=False)
        self.group_ones = torch.ones(1, group)

    def group_sums(self, x: torch.Tensor) -> torch.Tensor | None:
        """``x`` ``[..., in]`` summed over each group of inputs, ``[..., in / group]``; None without
        offsets. Each group is a row of ``x`` viewed ``[-1, group]``, summed by a linear against a row
        of ones, which XNNPACK runs inside the delegate (it has no sum); once per input, with q/k/v and
        gate/up fused (``fused_linear``), 1.13x faster decode than a ``[in / group, in]`` matrix of ones
        and zeros per linear (6 layers of SmolLM-135M's shape, same logits bit for bit)."""
        if self.offsets is None:
            return None
        group = self.group_ones.shape[1]
        sums = F.linear(x.reshape(-1, group), self.group_ones)
        return sums.view(*x.shape[:-1], self.in_features // group)

    def forward(self, x: torch.Tensor, lora: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.offsets is not None:
            y = y + F.linear(self.group_sums(x), self.offsets)
        return add_lora(y, x, lora)


def add_lora(y: torch.Tensor, x: torch.Tensor, lora: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """``y + (x A^T) B^T`` for ``lora`` = (A, B); ``y`` without. The batch method's LoRA inputs are one
    pair per row, ``A [B, r, in]`` and ``B [B, out, r]`` (``LlamaLoRA.batching``): row b of ``x``
    ``[B, 1, in]`` gets ``(B_b (A_b x_b^T))^T``, the LoRA matrices the first operand of each product.
    XNNPACK packs a product's second operand at every call (it is not a constant): so it packs the
    rows' activations (one column each), not every row's A and B at every step."""
    if lora is None:
        return y
    if lora[0].dim() == 3:
        return y + torch.bmm(lora[1], torch.bmm(lora[0], x.transpose(1, 2))).transpose(1, 2)
    return y + F.linear(F.linear(x, lora[0]), lora[1])


def fused_linear(parts: list[Linear]) -> Linear:
    """One linear computing ``parts`` (linears of one input) side by side: their outputs concatenated.
    Each part's rows are kept as they are, quantized ones too (torchao's int4/int8 tensors concatenate
    their int data, scales and zero points; an asymmetric grid's offsets its rows), so the fused linear
    gives each part's output exactly: one product, one activation quantization and one offsets product
    for the input instead of one per part."""
    first = parts[0]
    fused = Linear(first.in_features, sum(p.out_features for p in parts), bias=first.bias is not None)
    weights = [p.weight for p in parts]
    if not is_quantized(weights[0]):
        weight = torch.cat([w.detach() for w in weights])
    else:  # a torchao quantized tensor: aten.cat is not implemented for it
        cls = type(weights[0])
        data = [torch.cat([getattr(w, n) for w in weights]) for n in cls.tensor_data_names]
        weight = cls(*data, *(getattr(weights[0], n) for n in cls.tensor_attribute_names))
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if first.bias is not None:
        fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
    if first.offsets is not None:
        fused.set_group_offsets(torch.cat([p.offsets.detach() for p in parts]), first.group_ones.shape[1])
    return fused


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
    """Grouped-query attention over the caller's KV cache (batch 1).

    Each key/value head has its own slabs (module docstring), so its rows are one
    contiguous input that the products read where it lies; a cache laid out per layer would put
    the heads side by side and need a copy to separate them. Each head's past keys are the weight
    of a linear (``q K^T``): XNNPACK packs a weight that is an input with its fast row-wise packer,
    and the product is as wide as the past. The ``rep`` query heads that read one key/value head
    are ``rep * T`` rows of that product: no copy of the cache per query head. The heads' past
    scores and this call's own scores go under one softmax per layer, so a layer has one softmax
    and one pair of probability slices, not one per head (every graph node costs memory in every
    loaded adapter). Of the layouts measured at SmolLM-135M's shape, this one slows least with
    position (docs/decoding.md, "What was tried before the kept layout").
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = args.n_heads, args.n_kv_heads, args.hd
        for t in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out_f, in_f = args.linear_shape(t)
            setattr(self, t, Linear(in_f, out_f, args.has_bias(t)))
        self.qk_norm = args.qk_norm
        if args.qk_norm:  # Qwen3: each head's query and key RMS-normalised over head_dim before RoPE
            self.q_norm = RMSNorm(self.hd, args.norm_eps, args.norm_offset)
            self.k_norm = RMSNorm(self.hd, args.norm_eps, args.norm_offset)
        self.register_buffer("rotate_half", rotate_half_matrix(self.hd), persistent=False)
        self.kv_dtype = args.kv_torch_dtype
        self.qkv_proj: Linear | None = None  # after fuse(): q, k and v as one linear

    def fuse(self) -> None:
        """Compute q, k and v by one linear (``fused_linear``); LoRA stays per linear."""
        self.qkv_proj = fused_linear([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def _project(self, x, lora):
        """q, k and v of ``x`` ``[1, T, dim]``, each with its LoRA: ``[1, T, heads * head_dim]``."""
        if self.qkv_proj is not None:
            qkv, nq, nk = self.qkv_proj(x), self.n_heads * self.hd, self.n_kv * self.hd
            return (
                add_lora(qkv[..., :nq], x, lora.get("q_proj")),
                add_lora(qkv[..., nq : nq + nk], x, lora.get("k_proj")),
                add_lora(qkv[..., nq + nk :], x, lora.get("v_proj")),
            )
        return (
            self.q_proj(x, lora.get("q_proj")),
            self.k_proj(x, lora.get("k_proj")),
            self.v_proj(x, lora.get("v_proj")),
        )

    def rope(self, x, cos, sin):
        return x * cos + F.linear(x, self.rotate_half) * sin

    def _to_kv(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the KV cache's element type: attention's products and softmax run in it (XNNPACK's
        float16 kernels accumulate in float32); the casts are of this call's rows only, never the cache."""
        return x if self.kv_dtype == torch.float32 else x.to(self.kv_dtype)

    def forward(self, x, rope_q, rope_k, bias, keys, values, lora, fused: bool = False, slots=None):
        """``rope_q``, ``rope_k``: (cos, sin) ``[T, 1, head_dim]`` for queries (already scaled by
        ``1 / sqrt(head_dim)``) and keys. ``keys``, ``values``: each key/value head's slab input,
        ``[S, head_dim]`` (S > P: module docstring). ``bias`` ``[1, rep * T, S + T]`` is 0 where a query row may see a
        slot, -inf where not. ``lora``: this layer's (A, B) by linear name, for the linears the
        envelope has. ``fused`` (the decode method's; T = 1): everything between the projections and
        o_proj by one ``lora_share::rope_attend`` call (model/decode_attention.py). Returns the output and
        this call's keys and values, ``[n_kv, T, head_dim]`` each.

        With ``slots`` (the batch method's: the rows' slots ``[B]`` and the slab row of each entry's keys and
        values ``[B, T]``): ``x`` is ``[B, T, dim]``, T entries per row, ``keys`` and ``values`` the slot pools
        ``[N, S, head_dim]``, ``bias`` ``[B, T, S + 1]`` and the rotations ``[B, T, head_dim]``; one
        ``lora_share::rope_write_attend_rows`` call; keys and values ``[B * T, n_kv, head_dim]``."""
        if slots is not None:
            return self._forward_rows(x, rope_q, rope_k, bias, keys, values, lora, slots)
        _, t, _ = x.shape
        n_kv, rep, hd = self.n_kv, self.n_heads // self.n_kv, self.hd
        past, rows = keys[0].shape[0], rep * t
        # permute_copy, not permute + reshape: the result is contiguous, so no extra copy node.
        permute = torch.ops.aten.permute_copy.default
        q, k, v = self._project(x, lora)
        if fused:
            if t != 1:
                raise ValueError(f"the decode method takes one token per call, not {t}")
            if self.qk_norm:
                q = self.q_norm(q.view(1, t, self.n_heads, hd)).view(1, t, self.n_heads * hd)
                k = self.k_norm(k.view(1, t, n_kv, hd)).view(1, t, n_kv * hd)
            out, k, v = rope_attend(q, k, v, rope_q, rope_k, bias, keys, values)
            return self.o_proj(out, lora.get("o_proj")), k, v
        q = q.view(1, t, self.n_heads, hd)
        q = self.rope(self.q_norm(q) if self.qk_norm else q, *rope_q)
        k = k.view(1, t, n_kv, hd)
        k = permute(self.rope(self.k_norm(k) if self.qk_norm else k, *rope_k).view(t, n_kv, hd), [1, 0, 2])
        k = self._to_kv(k)
        v = self._to_kv(permute(v.view(t, n_kv, hd), [1, 0, 2]))
        # Query rows [n_kv, rep * T, hd], ordered (query head within its group, position), as the
        # rows of ``bias``.
        q_rows = self._to_kv(permute(q.view(t, n_kv, rep, hd), [1, 2, 0, 3]).view(n_kv, rows, hd))
        past_s = torch.cat([F.linear(q_rows[h : h + 1], keys[h]) for h in range(n_kv)], dim=0)
        new_s = torch.bmm(q_rows, permute(k, [0, 2, 1]))  # [n_kv, rows, T]
        probs = torch.softmax(torch.cat([past_s, new_s], dim=2) + bias, dim=-1)
        p_past, p_new = probs[:, :, :past], probs[:, :, past:]
        out = torch.bmm(p_new, v) + torch.cat(
            [torch.bmm(p_past[h : h + 1], values[h].view(1, past, hd)) for h in range(n_kv)], dim=0
        )
        return self._output(out, t, lora), k, v

    def _forward_rows(self, x, rope_q, rope_k, bias, keys, values, lora, slots):
        (b, t, _), hd = x.shape, self.hd
        q, k, v = self._project(x, lora)
        if self.qk_norm:
            q = self.q_norm(q.view(b, t, self.n_heads, hd)).view(b, t, self.n_heads * hd)
            k = self.k_norm(k.view(b, t, self.n_kv, hd)).view(b, t, self.n_kv * hd)
        out, k, v = rope_write_attend_rows(q, k, v, rope_q, rope_k, bias, *slots, keys, values)
        return self.o_proj(out, lora.get("o_proj")), k, v

    def _output(self, out: torch.Tensor, t: int, lora) -> torch.Tensor:
        """o_proj of attention's rows ``[n_kv, rep * T, head_dim]`` (in the cache's dtype), back in
        position order and float32: ``[1, T, dim]``."""
        rep, hd = self.n_heads // self.n_kv, self.hd
        out = torch.ops.aten.permute_copy.default(out.view(self.n_kv, rep, t, hd), [2, 0, 1, 3])
        out = out.view(1, t, self.n_heads * hd)
        out = out if self.kv_dtype == torch.float32 else out.to(torch.float32)
        return self.o_proj(out, lora.get("o_proj"))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        for t in ("gate_proj", "up_proj", "down_proj"):
            out_f, in_f = args.linear_shape(t)
            setattr(self, t, Linear(in_f, out_f, args.has_bias(t)))
        self.act = ACTIVATIONS[args.activation]
        self.gate_up_proj: Linear | None = None  # after fuse(): gate and up as one linear

    def fuse(self) -> None:
        """Compute gate and up by one linear (``fused_linear``); LoRA stays per linear."""
        self.gate_up_proj = fused_linear([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x, lora):
        if self.gate_up_proj is not None:
            both, h = self.gate_up_proj(x), self.gate_up_proj.out_features // 2
            gate, up = (
                add_lora(both[..., :h], x, lora.get("gate_proj")),
                add_lora(both[..., h:], x, lora.get("up_proj")),
            )
        else:
            gate, up = self.gate_proj(x, lora.get("gate_proj")), self.up_proj(x, lora.get("up_proj"))
        return self.down_proj(self.act(gate) * up, lora.get("down_proj"))


class DecoderLayer(nn.Module):
    """Pre-norm: ``h = x + attn(norm(x))``, ``h + mlp(norm(h))``. With ``sandwich_norms`` (Gemma 3)
    each output is normalised too: ``h = x + post_attention_norm(attn(input_norm(x)))``,
    ``h + post_feedforward_norm(mlp(pre_feedforward_norm(h)))``, under Hugging Face's names."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
        self.mlp = MLP(args)
        self.sandwich = args.sandwich_norms
        if args.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
            self.post_feedforward_layernorm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)

    def forward(self, x, rope_q, rope_k, bias, keys, values, lora, fused: bool = False, slots=None):
        a, k, v = self.self_attn(self.input_layernorm(x), rope_q, rope_k, bias, keys, values, lora, fused, slots)
        if self.sandwich:
            h = x + self.post_attention_layernorm(a)
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h), lora)), k, v
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h), lora), k, v


class Embedding(nn.Embedding):
    """An ``nn.Embedding`` without random init: the table is the checkpoint's (eager.eager_model assigns
    it), so the untouched allocation costs no memory until then."""

    def reset_parameters(self) -> None:
        """No random init."""


class Backbone(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)


def n_slabs(args: ModelArgs) -> int:
    """KV cache slabs of a model: one per (layer, key or value, key/value head)."""
    return 2 * args.n_layers * args.n_kv_heads


def ring_window(args: ModelArgs) -> int:
    """The window W of the sliding layers whose slabs are rings (``ring_size``), or 0 when every slab
    covers the context."""
    return args.sliding_window if ring_size(args) else 0


def ring_size(args: ModelArgs) -> int:
    """The positions M a sliding layer's ring holds, or 0 when every slab covers the context.

    A sliding layer never reads a position W or more before the one it computes, so its slabs are a
    ring of M slots after the sink (``[M + 1, head_dim]``), position p at row 1 + p % M, instead of
    ``[max_seq_len, head_dim]``. M = W + MAX_DRAFTS: the batch method writes a row's drafts (up to
    MAX_DRAFTS positions past its last token) before it attends, and a draft at p + d overwrites the
    position p + d - M, which no entry at p or later reads (it is W or more before p). Only when M + 1
    is shorter than the context (so a ring's M + 1 rows tell it from the other slabs, whose inputs have
    at most max_seq_len rows), and when some layer attends over the whole context: the program counts
    its key slots from that layer's slabs."""
    w = args.sliding_window
    if not args.sliding_layers or w is None or len(args.sliding_layers) == args.n_layers:
        return 0
    return 0 if w + MAX_DRAFTS + 1 >= args.max_seq_len else w + MAX_DRAFTS


def slab_rows(args: ModelArgs) -> list[int]:
    """Rows of each KV slab, in slab order: ``max_seq_len`` (the sink, then every position but the
    last, which no call reads), or ``M + 1`` for a sliding layer's ring (``ring_size``)."""
    ring, per_layer = ring_size(args), 2 * args.n_kv_heads
    return [
        ring + 1 if ring and j // per_layer in args.sliding_layers else args.max_seq_len for j in range(n_slabs(args))
    ]


def capped_rows(rows: list[int], ring: int, positions: int | None) -> list[int]:
    """Slab rows for a caller that feeds at most ``positions`` positions (None: all of ``rows``): the
    slabs over the whole context shortened to ``positions + 1`` rows, rings (of ``ring`` positions: M)
    kept whole. A short slab never has a ring's M + 1 rows, which is how a ring is told apart."""
    if positions is None:
        return list(rows)
    cap = positions + 1 + (1 if ring and positions + 1 == ring + 1 else 0)
    return [r if ring and r == ring + 1 else min(r, cap) for r in rows]


class KVCache:
    """The caller's KV cache (module docstring): one slab per (layer, key or value, key/value head),
    ``[max_seq_len, head_dim]``, or a ring of ``[M + 1, head_dim]`` for a sliding layer (``ring``: M,
    ``ring_size``)."""

    def __init__(self, rows: list[int], head_dim: int, ring: int = 0, dtype: torch.dtype = torch.float32):
        self.slabs = [torch.zeros(n, head_dim, dtype=dtype) for n in rows]
        self.ring = ring

    @classmethod
    def for_model(cls, args: ModelArgs, positions: int | None = None) -> KVCache:
        """The cache ``args``' program reads; with ``positions``, only big enough for that many
        (``capped_rows``)."""
        ring = ring_size(args)
        return cls(capped_rows(slab_rows(args), ring, positions), args.hd, ring, args.kv_torch_dtype)

    def prefixes(self, pos: int, block: int = KV_ROW_BLOCK) -> list[torch.Tensor]:
        """forward's slab inputs for a call at position ``pos``: each slab's first ``kv_view_rows`` rows
        (``block`` 1: exactly ``pos + 1``); a ring whole."""
        return [slab if self._is_ring(slab) else slab[: kv_view_rows(pos, slab.shape[0], block)] for slab in self.slabs]

    def _is_ring(self, slab: torch.Tensor) -> bool:
        return self.ring > 0 and slab.shape[0] == self.ring + 1

    def write(self, pos: int, new_rows) -> None:
        """Store forward's new rows (one ``[n_kv_heads, T, head_dim]`` per layer and key or value, the
        slabs in order) at positions ``pos`` .. ``pos + T - 1``: row p + 1, or 1 + p % M of a ring."""
        heads = len(self.slabs) // len(new_rows)
        for g, rows in enumerate(new_rows):
            rows = torch.as_tensor(rows)
            for h in range(heads):
                slab = self.slabs[g * heads + h]
                if self._is_ring(slab):
                    for i in range(rows.shape[1]):  # in order: a later position overwrites an earlier one
                        slab[1 + (pos + i) % self.ring] = rows[h, i]
                else:  # the context's last position has no row: no later call reads it
                    kept = min(rows.shape[1], slab.shape[0] - pos - 1)
                    slab[pos + 1 : pos + 1 + kept] = rows[h, :kept]

    def clear(self) -> None:
        for slab in self.slabs:
            slab.zero_()

    @classmethod
    def of_slabs(cls, slabs: list[torch.Tensor], ring: int) -> KVCache:
        """A cache over existing slabs (views: writes land in them)."""
        cache = cls.__new__(cls)
        cache.slabs, cache.ring = list(slabs), ring
        return cache


class KVPools:
    """The batch method's KV cache (docs/batching.md): ``slots`` whole caches side by side, laid out per
    slab: pool j is ``[slots, rows_j, head_dim]`` (``slab_rows``), slot n's slab j is ``pool[n]``, one
    contiguous ``KVCache`` slab, so forward takes a slot's slabs in place (``slot``)."""

    def __init__(self, args: ModelArgs, slots: int):
        self.ring, self.max_seq_len = ring_size(args), args.max_seq_len
        self.pools = [torch.zeros(slots, rows, args.hd, dtype=args.kv_torch_dtype) for rows in slab_rows(args)]

    def slot(self, n: int) -> KVCache:
        """Slot ``n`` as a ``KVCache`` whose slabs are views of the pools."""
        return KVCache.of_slabs([pool[n] for pool in self.pools], self.ring)

    def write_rows(self, slots, pos, new_rows) -> None:
        """Store the batch method's new rows (one ``[B * T, n_kv, head_dim]`` per layer and key or value):
        row b's T entries at positions ``pos[b]``, ``pos[b] + 1``, .. of slot ``slots[b]``, but for entries
        past the context (a step's padding), which the method writes nowhere either. The C++ kernel has
        written them already; ExecuTorch's Python runtime may have handed it copies of the pools."""
        rows = [torch.as_tensor(r) for r in new_rows]
        steps = rows[0].shape[0] // len(slots)
        for b, (slot, p) in enumerate(zip(slots, pos)):
            kept = min(steps, self.max_seq_len - p)
            mine = [r[b * steps : b * steps + kept].transpose(0, 1) for r in rows]  # [n_kv, kept, head_dim]
            self.slot(slot).write(p, mine)


def kv_view_rows(pos: int, rows: int, block: int = KV_ROW_BLOCK) -> int:
    """Rows of a slab (of ``rows``) that a call at position ``pos`` is given: ``pos + 1`` (the sink and
    the past) rounded up to a multiple of ``block``, at most ``rows``. The length then changes once
    every ``block`` positions, not at every token (module docstring)."""
    return min(-(-(pos + 1) // block) * block, rows)


def forward_inputs(tokens, pos: int, cache: KVCache, lora=(), block: int = KV_ROW_BLOCK) -> tuple[torch.Tensor, ...]:
    """``forward``'s inputs for ``tokens`` (ids) fed at positions ``pos``, ``pos + 1``, ..., with the
    LoRA inputs ``lora`` (``envelope.Envelope.inputs``: A, B per slot); the slabs' views in blocks of
    ``block`` rows (``kv_view_rows``)."""
    return (
        torch.tensor([list(tokens)], dtype=torch.int64),
        torch.tensor([pos], dtype=torch.int64),
        *cache.prefixes(pos, block),
        *lora,
    )


def rows_inputs(tokens, pos, slots, pools: KVPools, lora=()) -> tuple[torch.Tensor, ...]:
    """The batch method's inputs: row b feeds ``tokens[b]`` (a token, or a list of T tokens, the same T for
    every row) at positions ``pos[b]``, ``pos[b] + 1``, .. from KV slot ``slots[b]``; ``lora`` the rows'
    LoRA inputs (``envelope.Envelope.rows_inputs``)."""

    def ints(values):
        return torch.tensor(list(values), dtype=torch.int64)

    entries = [list(t) if isinstance(t, (list, tuple)) else [t] for t in tokens]
    return (torch.tensor(entries, dtype=torch.int64), ints(pos), ints(slots), *pools.pools, *lora)


class LlamaLoRA(nn.Module):
    """Llama decoder whose forward takes LoRA on ``lora_slots`` ((layer, linear) pairs, in input
    order) as inputs. See module docstring. ``step`` runs it eagerly with the inputs ``bind`` set."""

    def __init__(self, args: ModelArgs, lora_slots=()):
        super().__init__()
        self.args = args
        self.lora_slots = tuple(lora_slots)
        self.model = Backbone(args)
        self.lm_head = Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for name, local in (("rope", False), ("rope_local", True)) if args.sliding_layers else (("rope", False),):
            freqs = torch.outer(torch.arange(args.max_seq_len).float(), rope_inv_freq(args, local))
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer(f"{name}_cos", emb.cos(), persistent=False)
            self.register_buffer(f"{name}_sin", emb.sin(), persistent=False)
        self.ring = ring_size(args)
        # The slots' count is read from the first slab of a layer over the whole context.
        first_full = next(i for i in range(args.n_layers) if not self.ring or i not in args.sliding_layers)
        self.full_slab = 2 * args.n_kv_heads * first_full
        self._cache: KVCache | None = None
        self._lora: tuple[torch.Tensor, ...] = ()
        # True while tracing the decode method: attention by lora_share::rope_attend (``decoding``).
        self.fused_attention = False
        # True while tracing the batch method (``batching``).
        self.batch_rows = False

    def _rope(self, name: str, positions: torch.Tensor, scale: float):
        """(queries' (cos, sin), keys' (cos, sin)) ``[T, 1, hd]``: one rotation per position, for every
        head; the queries' carry the attention scale, so no layer scales its queries on its own."""
        cos = getattr(self, f"{name}_cos")[positions].unsqueeze(1)
        sin = getattr(self, f"{name}_sin")[positions].unsqueeze(1)
        return (cos * scale, sin * scale), (cos, sin)

    def _bias(self, hidden: torch.Tensor) -> torch.Tensor:
        """-inf where a query row may not see a key slot (``hidden``: True there), 0 elsewhere, already
        repeated for the query heads that share a key/value head, so each layer adds it with a
        broadcast over its leading dimension only."""
        rep = self.args.n_heads // self.args.n_kv_heads
        bias = torch.zeros(hidden.shape, dtype=self.args.kv_torch_dtype)
        return bias.masked_fill(hidden, float("-inf")).repeat(rep, 1).unsqueeze(0)

    def _lora_by_layer(self, lora) -> list[dict]:
        """Each layer's LoRA inputs (A, B) by linear name."""
        per_layer: list[dict] = [{} for _ in self.model.layers]
        for i, (layer, target) in enumerate(self.lora_slots):
            per_layer[layer][target] = (lora[2 * i], lora[2 * i + 1])
        return per_layer

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(tokens)
        if self.args.embed_scale != 1.0:  # Gemma: sqrt(dim), rounded to float32 as Hugging Face does
            h = h * self.args.embed_scale
        return h

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.batch_rows:
            return self._forward_rows(tokens, pos, inputs[0], *inputs[1:])
        args = self.args
        slabs, lora = inputs[: n_slabs(args)], inputs[n_slabs(args) :]
        per_layer = self._lora_by_layer(lora)
        t = tokens.shape[1]
        positions = torch.arange(t) + pos
        scale = args.attn_scale if args.attn_scale is not None else 1.0 / math.sqrt(args.hd)
        rope = {False: self._rope("rope", positions, scale)}
        # Each key slot's position, or -1 where it holds none: slot s of a slab over the context holds
        # position s - 1 if that is before this call's (the sink and rows P + 1.. none), this call's keys
        # follow the slab's rows. Hidden: a key after the query's position or none; once per call for all
        # layers of a kind. A sliding layer also hides the positions W or more before the query's
        # (transformers: key > query - W).
        cached = torch.arange(slabs[self.full_slab].shape[0]) - 1
        query = positions.unsqueeze(1)
        key = torch.cat([torch.where(cached < pos, cached, -1), positions]).unsqueeze(0)
        bias = {False: self._bias((key > query) | (key < 0))}
        if args.sliding_layers:
            rope[True] = self._rope("rope_local", positions, scale)
            window = args.sliding_window
            if self.ring:
                # Ring slot s (1..M) holds the latest position before this call that is s - 1 modulo M,
                # or none yet (negative); the sink none. The remainder's operand is kept non-negative:
                # ExecuTorch's int64 remainder takes C's sign, not Python's.
                s = torch.arange(1, self.ring + 1)
                ring = (pos - 1) - torch.remainder((pos + self.ring) - s, self.ring)
                key = torch.cat([torch.full((1,), -1), ring, positions]).unsqueeze(0)
            bias[True] = self._bias((key > query) | (key < 0) | (key <= query - window))
        h = self._embed(tokens)
        n_kv, new_rows = args.n_kv_heads, []
        for i, layer in enumerate(self.model.layers):
            mine = slabs[2 * n_kv * i : 2 * n_kv * (i + 1)]
            local = i in args.sliding_layers
            h, k, v = layer(h, *rope[local], bias[local], mine[:n_kv], mine[n_kv:], per_layer[i], self.fused_attention)
            new_rows += [k, v]
        # The last position's row. Decode has one: a view, which XNNPACK takes, where forward's select
        # runs outside it and would split the last layer from the lm_head.
        h = self.model.norm(h.view(1, args.dim) if self.fused_attention else h[:, -1, :])
        return (self.lm_head(h), *new_rows)

    def _forward_rows(self, tokens, pos, slots, *inputs) -> tuple[torch.Tensor, ...]:
        """The batch method (``batching``): ``tokens`` ``[B, T]`` (row b's entries at positions ``pos[b]``,
        ``pos[b] + 1``, ..), ``pos`` and ``slots`` ``[B]``, the slot pools (``KVPools``), the rows' LoRA
        inputs; logits ``[B * T, vocab]`` (entry (b, t) at b * T + t) and each layer's keys and values
        ``[B * T, n_kv, head_dim]``. Each entry is masked as forward masks one token at its position. An
        entry past the context (a row padded to the step's T near its end) is computed at the last
        position and writes nothing: its logits mean nothing."""
        args = self.args
        pools, lora = inputs[: n_slabs(args)], inputs[n_slabs(args) :]
        per_layer = self._lora_by_layer(lora)
        scale = args.attn_scale if args.attn_scale is not None else 1.0 / math.sqrt(args.hd)
        positions = pos.unsqueeze(1) + torch.arange(tokens.shape[1])  # [B, T]
        inside = positions < args.max_seq_len
        query = positions.clamp(max=args.max_seq_len - 1).unsqueeze(2)  # [B, T, 1]
        rope = {False: self._rope_rows("rope", query.squeeze(2), scale)}
        # Key slots as forward's (its comment), per entry: [B, T, S + 1], the last the entry's own key. The
        # slab row each entry's keys and values go to (-1: none) is the kernel's to write before any attends.
        cached = torch.arange(pools[self.full_slab].shape[1]) - 1
        key = torch.cat([torch.where(cached < query, cached, -1), query], dim=2)
        bias = {False: self._row_bias((key > query) | (key < 0))}
        dst = {False: torch.where(inside, positions + 1, -1)}
        if args.sliding_layers:
            rope[True] = self._rope_rows("rope_local", query.squeeze(2), scale)
            window = args.sliding_window
            if self.ring:
                s = torch.arange(1, self.ring + 1)
                ring = (query - 1) - torch.remainder((query + self.ring) - s, self.ring)
                key = torch.cat([torch.full_like(query, -1), ring, query], dim=2)
                dst[True] = torch.where(inside, 1 + torch.remainder(positions, self.ring), -1)
            else:
                dst[True] = dst[False]
            bias[True] = self._row_bias((key > query) | (key < 0) | (key <= query - window))
        h = self._embed(tokens)
        n_kv, new_rows = args.n_kv_heads, []
        for i, layer in enumerate(self.model.layers):
            mine = pools[2 * n_kv * i : 2 * n_kv * (i + 1)]
            local = i in args.sliding_layers
            h, k, v = layer(
                h, *rope[local], bias[local], mine[:n_kv], mine[n_kv:], per_layer[i], slots=(slots, dst[local])
            )
            new_rows += [k, v]
        return (self.lm_head(self.model.norm(h.view(-1, args.dim))), *new_rows)

    def _rope_rows(self, name: str, positions: torch.Tensor, scale: float):
        """``_rope`` for the batch method's entries ``positions`` ``[B, T]``: (cos, sin) pairs ``[B, T, hd]``."""
        cos, sin = getattr(self, f"{name}_cos")[positions], getattr(self, f"{name}_sin")[positions]
        return (cos * scale, sin * scale), (cos, sin)

    def _row_bias(self, hidden: torch.Tensor) -> torch.Tensor:
        """-inf where an entry may not see a key slot (``hidden`` ``[B, T, S + 1]``: True there), 0
        elsewhere; shared by the entry's query heads."""
        return torch.zeros_like(hidden, dtype=self.args.kv_torch_dtype).masked_fill(hidden, float("-inf"))

    @contextlib.contextmanager
    def batching(self):
        """Within: ``forward`` is the program's ``decode_batch`` method (docs/batching.md): B rows of T tokens
        each, ``forward(tokens [B, T], pos [B], slots [B], *pools, *lora)`` (``rows_inputs``), each row at its
        own positions, in its own KV slot, with its own LoRA (``A [B, r, in]``, ``B [B, out, r]`` per envelope
        slot). The foundation's products run once over the entries; same parameters as forward."""
        self.batch_rows = True
        try:
            yield self
        finally:
            self.batch_rows = False

    @contextlib.contextmanager
    def decoding(self):
        """Within: ``forward`` is the program's ``decode`` method (module docstring), each layer's
        attention one ``lora_share::rope_attend`` call. Same inputs, outputs and parameters as forward, so
        the two methods share every weight."""
        self.fused_attention = True
        try:
            yield self
        finally:
            self.fused_attention = False

    def fuse_projections(self) -> LlamaLoRA:
        """Every layer's q, k and v, and gate and up, as one linear each (``fused_linear``): same outputs,
        fewer ops per layer. For a quantized foundation, after quantizing (the fused weights are the
        quantized ones side by side, so no float copy is made)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def bind(self, lora: tuple[torch.Tensor, ...]) -> LlamaLoRA:
        """Use these LoRA inputs (two per slot, ``envelope.Envelope.inputs``) in ``step``."""
        if len(lora) != 2 * len(self.lora_slots):
            raise ValueError(f"{len(lora)} LoRA inputs for {len(self.lora_slots)} slots")
        self._lora = tuple(lora)
        return self

    def step(self, tokens, pos: int) -> torch.Tensor:
        """Eager: feed ``tokens`` (ids) at positions ``pos``.. through the model's own KV cache
        and the bound LoRA inputs (the export contract, run in PyTorch); the logits ``[vocab]``
        after the last one."""
        if self._cache is None:
            self.reset_cache()
        out = self(*forward_inputs(tokens, pos, self._cache, self._lora))
        self._cache.write(pos, out[1:])
        return out[0].reshape(-1)

    def reset_cache(self, positions: int | None = None) -> None:
        """Empty the KV cache ``step`` uses; with ``positions``, a new one for at most that many
        positions (a short check need not hold the whole context)."""
        if positions is not None or self._cache is None:
            self._cache = KVCache.for_model(self.args, positions)
        else:
            self._cache.clear()
