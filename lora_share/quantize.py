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
- embedding int8: one int8 row per token with a float32 scale per row, run by
  ExecuTorch's ``quantized_decomposed::embedding_byte`` kernel.

LoRA A and B are never touched: they stay float32. How far quantization moves
the logits is measured by quant_error.py.
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import UserError



def is_quantized(t: torch.Tensor) -> bool:
    """True for a torchao quantized tensor (a subclass), False for a plain float tensor/Parameter."""
    return type(t) not in (torch.Tensor, nn.Parameter)


def _is_lora(fqn: str) -> bool:
    parts = fqn.split(".")
    return "lora_a" in parts or "lora_b" in parts


def foundation_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Every foundation linear (attention, MLP, lm_head) by name; never a LoRA A/B."""
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and not _is_lora(n)}


def quantize_foundation_(model: nn.Module, qcfg) -> nn.Module:
    """Quantize ``model``'s foundation in place as ``qcfg`` (config.QuantizeConfig) says."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    if qcfg.scheme != "8da4w":
        raise UserError(f"foundation.quantize.scheme: {qcfg.scheme!r} is not supported (supported: 8da4w)")
    linears = foundation_linears(model)
    for name, lin in linears.items():
        if lin.in_features % qcfg.group_size:
            raise UserError(f"foundation.quantize.group_size: {qcfg.group_size} does not divide the input width "
                            f"{lin.in_features} of {name}; pick a group size that divides every linear's input")
    with torch.no_grad():
        # The tied lm_head gets its own int4 weight; the embedding keeps (or int8-quantizes) its own.
        quantize_(
            model,
            Int8DynamicActivationIntxWeightConfig(
                weight_dtype=torch.int4,
                weight_granularity=PerGroup(qcfg.group_size),
                weight_scale_dtype=torch.bfloat16,
                intx_choose_qparams_algorithm="affine",
            ),
            filter_fn=lambda m, fqn: fqn in linears,
        )
        if qcfg.embedding == "int8":
            quantize_(
                model,
                IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0),
                                     intx_choose_qparams_algorithm="affine"),
                filter_fn=lambda m, fqn: isinstance(m, nn.Embedding),
            )
    leaked = [n for n, p in model.named_parameters() if _is_lora(n) and is_quantized(p)]
    if leaked:  # guards the filter above: the LoRA branch must stay float
        raise RuntimeError(f"LoRA tensors were quantized: {leaked[:3]}")
    return model
