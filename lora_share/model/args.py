"""The foundation's shape and its family's switches (``ModelArgs``), and the names of the linears
LoRA may adapt: the model's description without its code, so the config, the checkpoint readers
and ``lora-share add`` read it without importing torch (model/decoder.py is the model itself)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# The MLP activations the decoder implements (model/decoder.py's ACTIVATIONS), by Hugging Face's names.
ACTIVATION_NAMES = ("silu", "gelu_pytorch_tanh")


# The KV cache's element types by their config names, which are also torch's dtype names.
KV_DTYPE_NAMES = ("float32", "float16")


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
    model_type: str = "llama"  # the Hugging Face family (model/families.py), which sets the switches below
    qkv_bias: bool = False  # q_proj, k_proj, v_proj have a bias (Qwen2; attention_bias)
    o_bias: bool = False  # o_proj has a bias (attention_bias)
    mlp_bias: bool = False  # gate_proj, up_proj, down_proj have a bias (llama's mlp_bias)
    qk_norm: bool = False  # RMSNorm over head_dim on queries and keys, before RoPE (Qwen3)
    norm_offset: float = 0.0  # every RMSNorm weight is applied as norm_offset + weight (Gemma: 1)
    embed_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(dim) in float32)
    activation: str = "silu"  # the MLP's activation, one of ACTIVATION_NAMES (Gemma: gelu_pytorch_tanh)
    sandwich_norms: bool = False  # Gemma 3: attention and MLP outputs normalised too, the MLP input by its own norm
    attn_scale: float | None = (
        None  # attention's score scale (Gemma 3: query_pre_attn_scalar ** -0.5); None: 1/sqrt(head_dim)
    )
    sliding_window: int | None = None  # the sliding layers' window: a query sees its own and the window - 1 before
    sliding_layers: tuple[int, ...] = ()  # which layers attend over the window only (Gemma 3)
    local_rope_theta: float | None = None  # the sliding layers' RoPE base (Gemma 3's rope_local_base_freq)
    kv_dtype: str = "float32"  # the KV cache's element type, one of KV_DTYPE_NAMES: float16 runs attention in float16

    @property
    def kv_torch_dtype(self):
        """The KV cache's element type, and attention's, as a torch dtype (imports torch)."""
        import torch

        if self.kv_dtype not in KV_DTYPE_NAMES:
            raise ValueError(f"kv_dtype {self.kv_dtype!r} is not one of {', '.join(KV_DTYPE_NAMES)}")
        return getattr(torch, self.kv_dtype)

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
