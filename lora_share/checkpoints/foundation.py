"""The foundation model's weights: a Hugging Face checkpoint or synthetic demo weights.

Tensors keep Hugging Face's llama names (``model.layers.0.mlp.up_proj.weight``), whatever
the family (model/families.py maps each onto them: Phi-3's fused projections are split) and are
converted to float32. With tied embeddings there is no ``lm_head.weight``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..config import FoundationConfig, QuantizeConfig, SyntheticFoundation
from ..errors import UserError
from ..files import sha256_file
from ..model.args import ModelArgs
from ..model.decoder import LlamaLoRA
from ..model.families import model_args, to_decoder_names
from .gguf import read_gguf
from .reading import read_json

# Checkpoint keys that carry no weights (recomputed buffers some exporters save).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class Foundation:
    args: ModelArgs
    tensors: dict[str, torch.Tensor]  # float32, as loaded; quantization happens on the eager model
    source: dict
    quantize: QuantizeConfig | None = None  # config.QuantizeConfig, or None for a float32 foundation

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        return expected_shapes(self.args)


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Foundation parameter names and shapes for ``args`` (Hugging Face naming)."""
    with torch.device("meta"):
        m = LlamaLoRA(args)
    return {n: tuple(p.shape) for n, p in m.named_parameters()}


def load_foundation(cfg: FoundationConfig, where: str = "foundation") -> Foundation:
    """Load the foundation described by ``cfg`` (validated config)."""
    if cfg.synthetic is not None:
        foundation = synthetic_foundation(cfg.synthetic, cfg.max_seq_len)
    elif Path(cfg.checkpoint).suffix == ".gguf":
        args, raw, source = read_gguf(cfg.checkpoint, cfg.max_seq_len)
        foundation = Foundation(args, decoder_tensors(raw, args, cfg.checkpoint, "its metadata"), source)
    else:
        foundation = load_hf_checkpoint(cfg.checkpoint, cfg.max_seq_len)
    foundation.args = replace(foundation.args, prefill_chunk=cfg.prefill_chunk, kv_dtype=cfg.kv_cache)
    foundation.quantize = cfg.quantize
    return foundation


def synthetic_args(s: SyntheticFoundation, max_seq_len: int) -> ModelArgs:
    """The ModelArgs of a synthetic foundation: llama's, or its family's switches (model/families.py) read from
    the config.json its checkpoint would have."""
    if s.model_type == "llama":
        return ModelArgs(
            dim=s.dim,
            n_layers=s.n_layers,
            n_heads=s.n_heads,
            n_kv_heads=s.n_kv_heads,
            hidden_dim=s.hidden_dim,
            vocab_size=s.vocab_size,
            norm_eps=s.norm_eps,
            rope_theta=s.rope_theta,
            tie_embeddings=s.tie_embeddings,
            max_seq_len=max_seq_len,
        )
    return model_args(
        {
            "model_type": s.model_type,
            "hidden_size": s.dim,
            "num_hidden_layers": s.n_layers,
            "num_attention_heads": s.n_heads,
            "num_key_value_heads": s.n_kv_heads,
            "head_dim": s.head_dim or s.dim // s.n_heads,
            "intermediate_size": s.hidden_dim,
            "vocab_size": s.vocab_size,
            "rms_norm_eps": s.norm_eps,
            "rope_theta": s.rope_theta,
            "tie_word_embeddings": s.tie_embeddings,
            "sliding_window": s.sliding_window,
        },
        Path("foundation.synthetic"),
        max_seq_len,
    )


def synthetic_foundation(s: SyntheticFoundation, max_seq_len: int) -> Foundation:
    """Deterministic weights: the same config always gives the same bytes.

    Scales are chosen so logits are well separated (greedy decoding is stable
    under float rounding): embeddings ~N(0,1), linears ~N(0, 1/fan_in), norms ~1.
    """
    args = synthetic_args(s, max_seq_len)
    gen = torch.Generator().manual_seed(s.seed)
    tensors = {}
    for name, shape in sorted(expected_shapes(args).items()):
        t = torch.randn(shape, generator=gen)  # scaled in place: no second tensor of its size
        if name.endswith("norm.weight"):
            t.mul_(0.1).add_(1.0 - args.norm_offset)  # applied as about 1 either way
        elif name != "model.embed_tokens.weight":
            t.div_(shape[1] ** 0.5)
        tensors[name] = t
    return Foundation(args, tensors, {"kind": "synthetic", **asdict(s)})


def hf_model_args(config_path: Path, max_seq_len: int) -> ModelArgs:
    """ModelArgs from a Hugging Face ``config.json``, with its family's switches (model/families.py); refuses
    what changes the math and isn't supported, naming the file, the field and its value."""
    return model_args(read_json(config_path, "the Hugging Face model config"), config_path, max_seq_len)


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "the safetensors shard index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"{index}: weight_map: missing or not a mapping")
        files = sorted({folder / f for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise UserError(f"{index}: names shard {f.name}, which is missing from {folder}")
        return files
    single = folder / "model.safetensors"
    if not single.is_file():
        raise UserError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    return [single]


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, with a clear error for a bad file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e}); the file may be truncated") from None


def decoder_tensors(raw: dict[str, torch.Tensor], args: ModelArgs, where: Path, config: str) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors (Hugging Face names) as the decoder's, float32: every expected name with
    its shape, nothing unexpected; ``config`` names what implied the shapes, for the messages."""
    raw = to_decoder_names(raw, args, where)
    tensors = {}
    for name, shape in expected_shapes(args).items():
        if name not in raw:
            raise UserError(f"{where}: tensor {name!r} is missing from the checkpoint (expected shape {list(shape)})")
        t = raw.pop(name)
        if tuple(t.shape) != shape:
            raise UserError(f"{where}: tensor {name!r} has shape {list(t.shape)}, {config} implies {list(shape)}")
        tensors[name] = t.to(torch.float32).contiguous()
    if args.tie_embeddings:
        raw.pop("lm_head.weight", None)  # some exporters save the tied copy too
    extra = [k for k in raw if not k.endswith(_IGNORED_SUFFIXES)]
    if extra:
        raise UserError(f"{where}: unexpected tensors for a {args.model_type} model: {', '.join(sorted(extra)[:5])}")
    return tensors


def load_hf_checkpoint(folder: Path, max_seq_len: int) -> Foundation:
    """Load a Hugging Face model folder (any family of model/families.py) and check every tensor's name and shape."""
    folder = Path(folder)
    args = hf_model_args(folder / "config.json", max_seq_len)
    raw: dict[str, torch.Tensor] = {}
    files = _weight_files(folder)
    for f in files:
        raw.update(read_safetensors(f))
    tensors = decoder_tensors(raw, args, folder, "config.json")
    hashes = {f.name: sha256_file(f) for f in files}
    return Foundation(args, tensors, {"kind": "checkpoint", "path": str(folder), "sha256": hashes})
