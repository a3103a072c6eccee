"""A quantized foundation under float LoRA adapters.

``quantize_foundation_`` applies ``foundation.quantize`` (config.QuantizeConfig) to
an eager model, the way ExecuTorch's llama export does it for XNNPACK, with
torchao's ``quantize_``:

- 8da4w: every foundation linear (attention, MLP, lm_head) gets int4 weights
  with one scale per ``group_size`` inputs (symmetric, min/max "affine"
  qparams: deterministic, so every adapter's export writes the same
  foundation.ptd bytes) and int8 dynamic per-token activations. The scales are
  kept in bfloat16, which is how XNNPACK stores blockwise scales; with float32
  scales the eager model would not be the model the export runs (measured
  0.4 max logit difference on the tiny config, 8e-6 with bfloat16).
- grid asymmetric: each group keeps llama.cpp's Q4_1 grid, ``w = d * q + m`` with
  ``q`` in 0..15, written as XNNPACK's symmetric int4 ``d * (q - 8)`` plus a float
  offset ``m + 8 d`` per (output, group), which model.Linear adds with one small
  float32 linear over the group sums. A symmetric grid cannot hold a Q4_1 GGUF's
  weights: re-rounding them onto it doubled the rounding error (perplexity 1.64 x
  fp32 on the real model, ``make bench-quality``); this grid keeps them exactly
  (up to the bfloat16 rounding of ``d``).
- lm_head int8: the output projection as int8 with one scale per row (XNNPACK's
  per-channel 8-bit kernel), for an embedding stored at 8 bits or more.
- embedding int8: one int8 row per token with a float32 scale per row, run by
  ExecuTorch's ``quantized_decomposed::embedding_byte`` kernel; int4: a float16
  scale per ``group_size`` of a row, run by its ``embedding_4bit.dtype`` kernel
  (about half the bytes, for a large vocabulary such as Gemma 3's 262k).

LoRA A and B are never touched: they stay float32. How far quantization moves
the logits is measured by deploy/quant_error.py.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UserError


def is_quantized(t: torch.Tensor) -> bool:
    """True for a torchao quantized tensor (a subclass), False for a plain float tensor/Parameter."""
    return type(t) not in (torch.Tensor, nn.Parameter)


def _is_lora(fqn: str) -> bool:
    parts = fqn.split(".")
    return "lora_a" in parts or "lora_b" in parts


def foundation_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Every foundation linear (attention, MLP, lm_head) by name; never a LoRA A/B."""
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and not _is_lora(n)}


def asymmetric_groups(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` ``[out, in]`` on an asymmetric int4 grid per group of ``group`` inputs: the symmetric
    part ``d * (q - 8)`` (``q`` in 0..15, ``d`` = the group's range / 15 rounded to bfloat16, the
    precision XNNPACK keeps scales in) and the offsets ``[out, in / group]``, each the group's mean
    of ``w - d * (q - 8)`` (its least-squares offset; ``m + 8 d`` for a Q4_1 group)."""
    out_f, in_f = w.shape
    blocks = w.reshape(out_f, in_f // group, group)
    lo, hi = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    d = ((hi - lo) / 15).to(torch.bfloat16).to(w.dtype)
    flat = d == 0  # a constant group: its value is all offset
    q = torch.where(flat, 8.0, torch.round((blocks - lo) / torch.where(flat, 1.0, d)).clamp(0, 15))
    sym = (q - 8) * d
    return sym.reshape(out_f, in_f), (blocks - sym).mean(-1)


def _split_group_offsets_(linears: dict[str, nn.Module], group: int) -> None:
    """Give each linear its asymmetric grid (``asymmetric_groups``): the symmetric part as its weight,
    the offsets as ``Linear.set_group_offsets``. A tied lm_head gets its own weight here (the
    embedding keeps the table), as quantize_ gives it."""
    for lin in linears.values():
        sym, offsets = asymmetric_groups(lin.weight.detach().float(), group)
        lin.weight = nn.Parameter(sym, requires_grad=False)
        lin.set_group_offsets(offsets, group)


def quantize_foundation_(model: nn.Module, qcfg) -> nn.Module:
    """Quantize ``model``'s foundation in place as ``qcfg`` (config.QuantizeConfig) says."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_primitives import MappingType

    if qcfg.scheme != "8da4w":
        raise UserError(f"foundation.quantize.scheme: {qcfg.scheme!r} is not supported (supported: 8da4w)")
    linears = foundation_linears(model)
    for name, lin in linears.items():
        if lin.in_features % qcfg.group_size:
            raise UserError(
                f"foundation.quantize.group_size: {qcfg.group_size} does not divide the input width "
                f"{lin.in_features} of {name}; pick a group size that divides every linear's input"
            )
    int4 = {n for n in linears if not (n == "lm_head" and qcfg.lm_head == "int8")}
    with torch.no_grad():
        if qcfg.grid == "asymmetric":
            _split_group_offsets_({n: linears[n] for n in int4}, qcfg.group_size)
        # The tied lm_head gets its own weight; the embedding keeps (or quantizes) its own table.
        quantize_(
            model,
            Int8DynamicActivationIntxWeightConfig(
                weight_dtype=torch.int4,
                weight_granularity=PerGroup(qcfg.group_size),
                weight_scale_dtype=torch.bfloat16,
                # An asymmetric grid's d * (q - 8) spans exactly -8 d .. 7 d: this mapping's scale
                # max(|min| / 8, max / 7) is then d itself, so the int4 values are q - 8 exactly.
                weight_mapping_type=(
                    MappingType.SYMMETRIC_NO_CLIPPING_ERR if qcfg.grid == "asymmetric" else MappingType.SYMMETRIC
                ),
                intx_choose_qparams_algorithm="affine",
            ),
            filter_fn=lambda m, fqn: fqn in int4,
        )
        if qcfg.lm_head == "int8":
            quantize_(
                model,
                Int8DynamicActivationIntxWeightConfig(
                    weight_dtype=torch.int8, weight_granularity=PerAxis(0), intx_choose_qparams_algorithm="affine"
                ),
                filter_fn=lambda m, fqn: fqn == "lm_head",
            )
        if qcfg.embedding is not None:
            int4_rows = qcfg.embedding == "int4"
            quantize_(
                model,
                IntxWeightOnlyConfig(
                    weight_dtype=torch.int4 if int4_rows else torch.int8,
                    granularity=PerGroup(qcfg.group_size) if int4_rows else PerAxis(0),
                    # An int4 table has a scale per group, not per row: float16 halves
                    # them (21 MB of Gemma 3's 262k x 640 table), and embedding_4bit's
                    # dtype variant reads float16 scales into a float32 output.
                    scale_dtype=torch.float16 if int4_rows else None,
                    intx_choose_qparams_algorithm="affine",
                ),
                filter_fn=lambda m, fqn: isinstance(m, nn.Embedding),
            )
    leaked = [n for n, p in model.named_parameters() if _is_lora(n) and is_quantized(p)]
    if leaked:  # guards the filter above: the LoRA branch must stay float
        raise RuntimeError(f"LoRA tensors were quantized: {leaked[:3]}")
    return model
