"""How far a quantized foundation moves an adapter's logits from the float model.

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

# The fixed synthetic prompt set: ACCURACY_PROMPTS prompts of up to ACCURACY_LEN
# uniform random token ids (seeded), fed one token at a time, so every position
# gives one next-token logits row to compare.
ACCURACY_PROMPTS = 8
ACCURACY_LEN = 16
ACCURACY_SEED = 0


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
    rows = [
        np.asarray(step([tok], pos), dtype=np.float32).reshape(-1)
        for prompt in prompts
        for pos, tok in enumerate(prompt)
    ]
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
    from ..inference.python_runtime import LoadedAdapter

    args = float_model.args
    prompts = accuracy_prompts(args.vocab_size, args.max_seq_len)
    # Each prompt starts again at position 0: both caches hold only its positions, not the context
    # (2 x 94 MB at SmolLM-135M's 2,048, on top of the build's peak).
    positions = max(len(p) for p in prompts)
    float_model.reset_cache(positions)
    with single_threaded():
        ref = teacher_forced_logits(eager_step(float_model), prompts)
    loaded = LoadedAdapter(pte, ptd, shared_ptd, positions=positions)
    got = teacher_forced_logits(loaded.step, prompts)
    return {"prompts": len(prompts), "prompt_len": len(prompts[0]), "seed": ACCURACY_SEED, **compare_logits(ref, got)}


def format_error(err: dict) -> str:
    return (
        f"vs float: top-1 agreement {err['top1_agreement']:.1%} over {err['positions']} positions, "
        f"max |logit diff| {err['max_abs_logit_diff']:.3g}, rms {err['rms_logit_diff']:.3g} "
        f"({err['relative_rms']:.1%} of the logit std {err['logit_std']:.3g})"
    )


def adapter_quantization_error(foundation, adapter, pte, ptd, shared_ptd=None) -> dict:
    """``quantization_error`` of one built adapter: its .pte over ``ptd`` (and ``shared_ptd``)
    against the float eager model (``eager.eager_model(..., quantized=False)``) with the same adapter."""
    from ..export.eager import eager_model

    return quantization_error(eager_model(foundation, adapter, quantized=False), pte, ptd, shared_ptd)
