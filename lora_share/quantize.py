"""A quantized foundation under float LoRA adapters, and how far it moves the logits.

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

LoRA A and B (the ``lora_a``/``lora_b`` children of each linear) are never
touched: they stay float32 and live in the adapter's .pte.

``quantization_error`` measures an exported adapter against the float eager
model with the same adapter on a fixed synthetic prompt set (the numbers the
build prints and records in manifest.json). On the synthetic foundations
(weights N(0, 1/fan_in)) the rms logit difference is ~18.5% of the logit std
with 2 layers and ~30% with 8 (examples/llama_8da4w.yaml), top-1 agreement
97-100%: each int4 linear adds ~8% noise and depth compounds it.

The export matches its own eager quantized model to float precision except
where a dynamically quantized activation sits within float noise of an int8
rounding boundary: XNNPACK and torchao may then round it to neighbouring steps
(see tests/test_quantized.py for what that costs and how it is bounded).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .errors import UserError

# The fixed synthetic prompt set: ACCURACY_PROMPTS prompts of up to ACCURACY_LEN
# uniform random token ids (seeded), fed one token at a time, so every position
# gives one next-token logits row to compare.
ACCURACY_PROMPTS = 8
ACCURACY_LEN = 16
ACCURACY_SEED = 0


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


def accuracy_prompts(vocab_size: int, max_seq_len: int) -> list[list[int]]:
    """The fixed synthetic prompt set (same ids for every build with this vocabulary and length)."""
    gen = torch.Generator().manual_seed(ACCURACY_SEED)
    length = min(ACCURACY_LEN, max_seq_len)
    return [torch.randint(0, vocab_size, (length,), generator=gen).tolist() for _ in range(ACCURACY_PROMPTS)]


def teacher_forced_logits(step, prompts: list[list[int]]) -> np.ndarray:
    """[positions, vocab]: ``step([token], pos)`` at every position of every prompt.

    Each prompt restarts at position 0; the model's mask hides cache slots at or
    beyond the current position, so no reset is needed between prompts.
    """
    rows = [np.asarray(step([tok], pos), dtype=np.float32).reshape(-1)
            for prompt in prompts for pos, tok in enumerate(prompt)]
    return np.stack(rows)


class single_threaded:
    """torch on one thread for a while. The eager references run many tiny steps; with
    torch's default threads on a busy 2-core machine each step was 6-10x slower (measured)."""

    def __enter__(self):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.threads)


def eager_step(model: nn.Module):
    def step(tokens, pos):
        with torch.no_grad():
            return model.step(tokens, pos).numpy()

    return step


def compare_logits(ref: np.ndarray, got: np.ndarray) -> dict:
    """How far ``got`` is from the float reference ``ref`` (both [positions, vocab])."""
    diff = got.astype(np.float64) - ref.astype(np.float64)
    centred = ref.astype(np.float64) - ref.mean(axis=1, keepdims=True)
    rms_diff = math.sqrt(float(np.mean(diff**2)))
    logit_std = math.sqrt(float(np.mean(centred**2)))
    return {
        "positions": int(ref.shape[0]),
        "top1_agreement": round(float(np.mean(ref.argmax(axis=1) == got.argmax(axis=1))), 4),
        "max_abs_logit_diff": round(float(np.abs(diff).max()), 4),
        "rms_logit_diff": round(rms_diff, 4),
        "logit_std": round(logit_std, 4),
        "relative_rms": round(rms_diff / logit_std, 4) if logit_std else None,
    }


def quantization_error(float_model: nn.Module, pte, ptd, shared_ptd=None) -> dict:
    """The exported adapter (``pte`` over ``ptd`` and ``shared_ptd``, ExecuTorch's Python runtime)
    against ``float_model`` (the float eager model with the same adapter) on the fixed prompt set."""
    from .runtime import LoadedAdapter

    args = float_model.args
    prompts = accuracy_prompts(args.vocab_size, args.max_seq_len)
    with single_threaded():
        ref = teacher_forced_logits(eager_step(float_model), prompts)
    loaded = LoadedAdapter(pte, ptd, shared_ptd)
    got = teacher_forced_logits(loaded.step, prompts)
    return {"prompts": len(prompts), "prompt_len": len(prompts[0]), "seed": ACCURACY_SEED,
            **compare_logits(ref, got)}


def format_error(err: dict) -> str:
    return (f"vs float: top-1 agreement {err['top1_agreement']:.1%} over {err['positions']} positions, "
            f"max |logit diff| {err['max_abs_logit_diff']:.3g}, rms {err['rms_logit_diff']:.3g} "
            f"({err['relative_rms']:.1%} of the logit std {err['logit_std']:.3g})")


def adapter_quantization_error(foundation, adapter, pte, ptd, shared_ptd=None) -> dict:
    """``quantization_error`` of one built adapter: its .pte over ``ptd`` (and ``shared_ptd``)
    against the float eager model (``export.eager_model(..., quantized=False)``) with the same adapter."""
    from .export import eager_model

    return quantization_error(eager_model(foundation, adapter, quantized=False), pte, ptd, shared_ptd)
