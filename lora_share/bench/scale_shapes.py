"""bench-scale's shapes: the synthetic foundations it builds (SmolLM-135M's, Gemma-3-270M's, a tiny one)
with the request sizes measured on each, and the bytes a shape implies (its fp32 weights, its KV cache)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Shape:
    """A synthetic foundation and the request sizes measured on it."""

    foundation: dict
    context: int
    short_context: int
    prefill_chunk: int
    prompt_tokens: int
    new_tokens: int
    speed_new_tokens: int  # decode steps timed per speed request (+1)
    near_start: int  # prompt length of the "position about 10" request
    big: dict | None = None  # a larger foundation only built (fp32, 8da4w), for the build's time and peak RSS
    big_context: int = 512
    quantize: dict = field(default_factory=lambda: {"scheme": "8da4w"})  # the 8da4w variants' foundation.quantize


DEFAULT_SHAPE = "smollm-135m"

SHAPES = {
    DEFAULT_SHAPE: Shape(
        foundation={
            "dim": 576,
            "n_layers": 30,
            "n_heads": 9,
            "n_kv_heads": 3,
            "hidden_dim": 1536,
            "vocab_size": 49152,
            "tie_embeddings": True,
            "seed": 0,
        },
        context=2048,
        short_context=128,
        prefill_chunk=128,
        prompt_tokens=1000,
        new_tokens=64,
        speed_new_tokens=33,
        near_start=10,
        # Llama-3.2-1B's shape (synthetic weights): 1.24 B parameters, 4.9 GB in fp32.
        big={
            "dim": 2048,
            "n_layers": 16,
            "n_heads": 32,
            "n_kv_heads": 8,
            "hidden_dim": 8192,
            "vocab_size": 128256,
            "tie_embeddings": True,
            "seed": 0,
        },
    ),
    # Gemma-3-270M's shape (synthetic weights): 18 layers, every sixth over the whole context and the
    # others over a 512-token window (their KV cache a ring of it), head_dim 256, one KV head, a
    # 262,144-token tied vocabulary (168 M of its 268 M parameters).
    "gemma3-270m": Shape(
        foundation={
            "model_type": "gemma3_text",
            "dim": 640,
            "n_layers": 18,
            "n_heads": 4,
            "n_kv_heads": 1,
            "head_dim": 256,
            "hidden_dim": 2048,
            "vocab_size": 262144,
            "tie_embeddings": True,
            "sliding_window": 512,
            "norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "seed": 0,
        },
        context=2048,
        short_context=128,
        prefill_chunk=128,
        prompt_tokens=1000,
        new_tokens=64,
        speed_new_tokens=33,
        near_start=10,
        # The 262k table at 4 bits (groups of 32) and the tied output projection int4 (its own copy):
        # with an int8 table the foundation would be ~330 MB, above the 260 MB of the real Q4_K_M GGUF.
        quantize={"scheme": "8da4w", "group_size": 32, "embedding": "int4"},
    ),
    "tiny": Shape(
        foundation={
            "dim": 64,
            "n_layers": 2,
            "n_heads": 4,
            "n_kv_heads": 2,
            "hidden_dim": 128,
            "vocab_size": 256,
            "tie_embeddings": True,
            "seed": 0,
        },
        context=64,
        short_context=24,
        prefill_chunk=8,
        prompt_tokens=40,
        new_tokens=8,
        speed_new_tokens=5,
        near_start=4,
        big={
            "dim": 96,
            "n_layers": 3,
            "n_heads": 4,
            "n_kv_heads": 2,
            "hidden_dim": 192,
            "vocab_size": 512,
            "tie_embeddings": True,
            "seed": 0,
        },
        big_context=32,
    ),
}


def _synthetic_args(synthetic: dict, context: int):
    """The ModelArgs of a synthetic foundation (its family's switches included)."""
    from ..checkpoints.foundation import synthetic_args
    from ..config import SyntheticFoundation

    return synthetic_args(SyntheticFoundation(**synthetic), context)


def fp32_foundation_bytes(synthetic: dict) -> int:
    """Bytes of a synthetic foundation's weights in float32 (model/decoder.py's parameter shapes)."""
    from ..checkpoints.foundation import expected_shapes

    return 4 * sum(math.prod(shape) for shape in expected_shapes(_synthetic_args(synthetic, 8)).values())


def kv_cache_bytes(args: dict) -> int:
    """Bytes of the runtime's KV cache for one program (model/decoder.py): keys and values of every layer
    and key/value head, each slab's sink row and every context position but the last; a sliding layer's slabs
    are rings of its window (model.slab_rows); 4 bytes a value, 2 in a float16 cache."""
    from ..model.decoder import ModelArgs, slab_rows

    model_args = ModelArgs(**args)
    return sum(slab_rows(model_args)) * args["head_dim"] * model_args.kv_torch_dtype.itemsize


def full_kv_cache_bytes(args: dict) -> int:
    """The same cache with every layer over the whole context (no rings): the yardstick for the rings."""
    from ..model.args import ModelArgs

    value_bytes = ModelArgs(**args).kv_torch_dtype.itemsize
    return 2 * args["n_layers"] * args["n_kv_heads"] * args["head_dim"] * args["max_seq_len"] * value_bytes
