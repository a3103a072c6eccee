"""GGUF checkpoints (llama.cpp's file format) as foundations: weights dequantized to float32, the
model config from the file's metadata.

A GGUF file names its tensors llama.cpp's way (``blk.3.attn_q.weight``) and stores every matrix
row-major with its dimensions listed innermost first. ``read_gguf`` turns it into what a Hugging
Face checkpoint holds: a ``config.json``-like dict (so ``families.model_args`` applies the same
switches and refusals) and tensors under Hugging Face names. llama.cpp's converter permutes the
rows of a llama model's query and key projections (its RoPE pairs dimensions i and i + 1, Hugging
Face's i and i + head_dim/2); they are permuted back, so PEFT adapters trained on the Hugging Face
model apply unchanged. Phi-3 is written unpermuted (llama.cpp rotates it NeoX-style, as Hugging Face
does) with Hugging Face's fused linears (``attn_qkv`` is ``qkv_proj``, ``ffn_up`` holds gate and up,
``gate_up_proj``), which the phi3 family splits at load time. Gemma 3 (llama.cpp's ``gemma3``, the
text model of any Gemma 3 file) is written unpermuted too, with its four norms per layer under their
own names (``ffn_norm`` is the norm before the MLP there) and every norm weight stored as 1 + w
(llama.cpp's RMSNorm multiplies by the stored weight, Gemma's by 1 + w): 1 is taken off again, as
transformers does, and the gemma3_text family adds it back. Reading and dequantizing is the
``gguf`` package's (llama.cpp's own Python reader; numpy dequantization of every quantization type
it knows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..files import sha256_file
from ..model.args import ModelArgs
from ..model.families import model_args

# GGUF architecture -> Hugging Face model_type, for the families lora-share supports. llama covers
# SmolLM and Llama 2/3; llama.cpp writes Mistral models as llama too; phi3 is Phi-3 (and Phi-4-mini,
# whose partial rotary embeddings are refused); gemma3 is Gemma 3's text model (transformers reads it as
# gemma3_text too).
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma3": "gemma3_text"}
# llama.cpp permutes Q and K rows for these (convert_hf_to_gguf.py, LlamaModel.permute).
_PERMUTED = {"llama"}

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# convert_hf_to_gguf.py's Phi3MiniModel keeps Hugging Face's fused linears under these names.
_FUSED_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
# convert_hf_to_gguf.py's Gemma3Model (gguf's MODEL_TENSORS[MODEL_ARCH.GEMMA3]): the norms around
# attention and the MLP; ffn_norm is the one before the MLP.
_GEMMA3_BLOCK = {
    **_BLOCK,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCKS = {"phi3": _FUSED_BLOCK, "gemma3": _GEMMA3_BLOCK}
# Gemma3Model.modify_tensors stores every "*norm.weight" as 1 + w (transformers' Gemma2TensorProcessor,
# which it uses for gemma3, subtracts 1 from the same tensors).
_NORM_PLUS_ONE = {"gemma3"}


def hf_name(name: str, arch: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name of architecture ``arch``, or None for one
    lora-share does not know."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    block = _BLOCKS.get(arch, _BLOCK)
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in block:
        return f"model.layers.{parts[1]}.{block[parts[2]]}.{parts[3]}"
    return None


def unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The rows of a query or key projection (weight or bias) in Hugging Face's order, from
    llama.cpp's: the inverse of convert_hf_to_gguf.py's ``permute``."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _reader(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file (foundation.checkpoint: a .gguf file)") from None
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise UserError(f"{path}: not a readable GGUF file ({e}); the file may be truncated") from None


def _value(reader, key: str):
    """A metadata value (scalar, string or array), or None if the file does not have the key."""
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def hf_config(reader, path: Path) -> dict:
    """The Hugging Face ``config.json`` fields the decoder needs, from the file's metadata."""
    arch = _value(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise UserError(
            f"{path}: general.architecture is {arch!r}, which lora-share does not read "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )

    def need(key: str):
        value = _value(reader, f"{arch}.{key}")
        if value is None:
            raise UserError(f"{path}: metadata key {arch}.{key} is missing")
        return value

    scaling = _value(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise UserError(f"{path}: {arch}.rope.scaling.type is {scaling!r}: only plain RoPE is read from GGUF")
    factors = next((t.name for t in reader.tensors if t.name.startswith("rope_factors_")), None)
    if factors is not None:  # llama.cpp's converter writes no scaling type for Phi-3's LongRoPE, only these
        raise UserError(
            f"{path}: tensor {factors}: LongRoPE (the 128k-context Phi-3 models) is not supported; "
            "only plain RoPE is read from GGUF"
        )
    softcap = _value(reader, f"{arch}.final_logit_softcapping")
    if softcap:
        raise UserError(
            f"{path}: {arch}.final_logit_softcapping is {softcap}: soft-capping of the output logits "
            "is not supported by lora-share"
        )
    heads = int(need("attention.head_count"))
    config = {
        "model_type": ARCHITECTURES[arch],
        "hidden_size": int(need("embedding_length")),
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_value(reader, f"{arch}.attention.head_count_kv") or heads),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_value(reader, f"{arch}.rope.freq_base") or _ROPE_THETA.get(arch, 10000.0)),
        "max_position_embeddings": int(_value(reader, f"{arch}.context_length") or 2048),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "hidden_act": "silu",
    }
    tokens = _value(reader, "tokenizer.ggml.tokens")
    vocab = _value(reader, f"{arch}.vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        vocab = next(t.shape[1] for t in reader.tensors if t.name == "token_embd.weight")
    config["vocab_size"] = int(vocab)
    key_length = _value(reader, f"{arch}.attention.key_length")
    if key_length is not None:
        config["head_dim"] = int(key_length)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rotary = _value(reader, f"{arch}.rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        raise UserError(
            f"{path}: {arch}.rope.dimension_count is {rotary}, not the head size {head_dim}: partial "
            "rotary embeddings are not supported"
        )
    window = _value(reader, f"{arch}.attention.sliding_window")
    if window:  # 0 means none (Phi-4); the family refuses a window shorter than the context
        config["sliding_window"] = int(window)
    if ARCHITECTURES[arch] == "qwen2":
        config["attention_bias"] = True
    if arch == "gemma3":
        config.update(_gemma3_config(reader, path, need))
    return config


# rope.freq_base when the file lacks it: Gemma3TextConfig's default (convert_hf_to_gguf.py's too).
_ROPE_THETA = {"gemma3": 1_000_000.0}


def _gemma3_config(reader, path: Path, need) -> dict:
    """What the gemma3_text family reads beyond the common keys. llama.cpp requires the sliding
    window (gemma3.attention.sliding_window); the rest is not in the metadata, and the values are
    transformers' GGUF loader's (Gemma3TextConfig's defaults), which are llama.cpp's too for the
    Gemma 3 models of head size 256 (270M to 12B): sliding layers every layer but each sixth (no
    layer_types: the family's pattern of 6), query_pre_attn_scalar 256 (llama.cpp scales by
    head_dim ** -0.5, except for the 27B), a local RoPE base of 10000 unless the file has
    rope.freq_base_swa (newer converters write it), and tanh GELU."""
    local = _value(reader, "gemma3.rope.freq_base_swa")
    return {
        "sliding_window": int(need("attention.sliding_window")),
        "query_pre_attn_scalar": 256,
        "rope_local_base_freq": float(local) if local is not None else 10_000.0,
        "hidden_activation": "gelu_pytorch_tanh",
    }


def _dequantized(tensor, path: Path) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except (NotImplementedError, ValueError) as e:
        kind = GGMLQuantizationType(tensor.tensor_type).name
        raise UserError(
            f"{path}: tensor {tensor.name} has type {kind}, which lora-share cannot dequantize ({e})"
        ) from None
    shape = [int(d) for d in reversed(tensor.shape)]  # GGUF lists the innermost dimension first
    return torch.from_numpy(
        np.array(values, dtype=np.float32).reshape(shape)
    )  # a copy: the reader maps the file read-only


def read_gguf(path: Path, max_seq_len: int) -> tuple[ModelArgs, dict[str, torch.Tensor], dict]:
    """The model args, the tensors under Hugging Face names (float32) and the source record of a
    GGUF checkpoint."""
    path = Path(path)
    reader = _reader(path)
    config = hf_config(reader, path)
    args = model_args(config, path, max_seq_len)
    arch = _value(reader, "general.architecture")
    permuted = arch in _PERMUTED
    plus_one = arch in _NORM_PLUS_ONE
    raw: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name, arch)
        if name is None:
            raise UserError(f"{path}: tensor {tensor.name!r} is not one lora-share knows for a {args.model_type} model")
        t = _dequantized(tensor, path)
        if permuted and ".q_proj." in name:
            t = unpermute(t, args.n_heads)
        elif permuted and ".k_proj." in name:
            t = unpermute(t, args.n_kv_heads)
        elif plus_one and tensor.name.endswith("norm.weight"):
            t = t - 1
        raw[name] = t
    return args, raw, {"kind": "gguf", "path": str(path), "sha256": {path.name: sha256_file(path)}}


def gguf_tokenizer_folder(path: Path) -> Path | None:
    """A Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json with the chat template,
    generation_config.json with the EOS id) made from the GGUF's tokenizer metadata by transformers,
    cached by the file's sha256 under ``$XDG_CACHE_HOME/lora-share/gguf`` (default ~/.cache); None
    when the file has no tokenizer."""
    import json
    import os
    import shutil
    import tempfile

    path = Path(path)
    reader = _reader(path)
    if _value(reader, "tokenizer.ggml.model") is None:
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lora-share" / "gguf"
    folder = cache / sha256_file(path)[:32]
    if (folder / "tokenizer.json").is_file():
        return folder
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError(
            f"{path}: reading its tokenizer needs transformers (pip install 'lora-share[chat]'), "
            "or set foundation.tokenizer to a folder with tokenizer.json"
        ) from None
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".tmp-"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        tokenizer.save_pretrained(str(tmp))
        ids = {key: _value(reader, f"tokenizer.ggml.{key}") for key in ("eos_token_id", "bos_token_id")}
        (tmp / "generation_config.json").write_text(json.dumps({k: int(v) for k, v in ids.items() if v is not None}))
        os.replace(tmp, folder)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(
            f"{path}: its tokenizer could not be read ({e}); set foundation.tokenizer to a folder with tokenizer.json"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
