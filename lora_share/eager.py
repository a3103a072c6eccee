"""The eager PyTorch model of a foundation with an adapter applied: the reference every export is
checked against, and the module torch.export traces."""

from __future__ import annotations

import torch

from .adapters import Adapter
from .export import is_adapter_tensor
from .foundation import Foundation
from .model import LlamaLoRA
from .quantize import quantize_foundation_

def eager_model(foundation: Foundation, adapter: Adapter | None = None, quantized: bool = True) -> LlamaLoRA:
    """The PyTorch model with the adapter applied: the reference for every export.

    A foundation with ``quantize`` set is quantized (LoRA stays float) unless
    ``quantized=False``, which gives the float model it approximates.
    """
    model = LlamaLoRA(foundation.args, adapter.spec if adapter else None)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter_tensor(name):
                continue
            p.copy_(foundation.tensors[name])
        for (layer, target), (a, b) in (adapter.weights.items() if adapter else ()):
            block = model.model.layers[layer]
            lin = getattr(block.self_attn if hasattr(block.self_attn, target) else block.mlp, target)
            lin.lora_a.weight.copy_(a)
            lin.lora_b.weight.copy_(b)
    model.requires_grad_(False)
    if quantized and foundation.quantize is not None:
        quantize_foundation_(model, foundation.quantize)
    return model.eval()
