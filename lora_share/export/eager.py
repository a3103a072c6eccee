"""The eager PyTorch model of a foundation: the module torch.export traces, and, with an adapter's
LoRA inputs bound, the reference every export is checked against."""

from __future__ import annotations

from ..checkpoints.adapters import Adapter
from ..checkpoints.foundation import Foundation
from ..model.decoder import LlamaLoRA
from ..model.envelope import Envelope
from ..model.quantize import quantize_foundation_


def adapter_envelope(adapter: Adapter) -> Envelope:
    """The envelope of exactly ``adapter``'s recipe: its linears on its layers at its largest rank."""
    return Envelope.make(
        {t for _, t in adapter.weights},
        {layer for layer, _ in adapter.weights},
        max(a.shape[0] for a, _ in adapter.weights.values()),
    )


def eager_model(
    foundation: Foundation, adapter: Adapter | None = None, quantized: bool = True, envelope: Envelope | None = None
) -> LlamaLoRA:
    """The PyTorch model taking LoRA on ``envelope`` (default: ``adapter``'s own recipe, or none), with
    ``adapter``'s LoRA inputs bound for ``step``.

    The model's parameters are the foundation's tensors themselves, not copies. A foundation with
    ``quantize`` set is quantized (LoRA stays float) unless ``quantized=False``, which gives the
    float model it approximates.
    """
    if envelope is None:
        envelope = adapter_envelope(adapter) if adapter is not None else Envelope((), 1)
    model = LlamaLoRA(foundation.args, envelope.slots)
    missing, unexpected = model.load_state_dict(foundation.tensors, strict=False, assign=True)
    if foundation.args.tie_embeddings:  # assign replaced the embedding: tie the output projection to it again
        model.lm_head.weight = model.model.embed_tokens.weight
        missing = [n for n in missing if n != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(
            f"foundation tensors do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    model.requires_grad_(False)
    model.bind(tuple(envelope.inputs(adapter, foundation.args)))
    if quantized and foundation.quantize is not None:
        quantize_foundation_(model, foundation.quantize)
        model.fuse_projections()  # one int4 product per input: measured 1.17x decode at 6 layers
    return model.eval()
