"""The build config: YAML validated into typed, nested dataclasses.

Every problem is collected (not just the first) and reported with the file, the
full key path and what to do; an unknown key gets a "did you mean". Relative
paths resolve against the YAML file's folder. ``config_json_schema()`` derives
the JSON Schema in ``schema/config.schema.json`` from the same dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigErrors, UserError
from .model.args import LORA_TARGETS
from .model.families import FAMILIES

# Adapter and program names: they become file stems (<name>.pte), URL path parts and model ids.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NAME_RULE = "letters, digits, '_', '.' or '-', starting with a letter or digit"
# The name the runners, the C API and the server give the foundation alone (no adapter).
BASE_NAME = "base"


def _f(help: str, default=dataclasses.MISSING, **meta):
    """A dataclass field with help text and schema constraints (minimum, choices)."""
    kw = {"metadata": {"help": help, **meta}}
    if default is not dataclasses.MISSING:
        if isinstance(default, (list, dict)):
            kw["default_factory"] = lambda d=default: type(d)(d)
        else:
            kw["default"] = default
    return field(**kw)


@dataclass
class SyntheticFoundation:
    """Deterministic demo weights for a llama-family foundation, or for Gemma 3's text model (no download)."""

    dim: int = _f("model width (hidden_size)", minimum=8)
    n_layers: int = _f("number of decoder layers", minimum=1)
    n_heads: int = _f("attention heads", minimum=1)
    n_kv_heads: int = _f("key/value heads (grouped-query attention)", minimum=1)
    hidden_dim: int = _f("SwiGLU width (intermediate_size)", minimum=1)
    vocab_size: int = _f("vocabulary size", minimum=2)
    tie_embeddings: bool = _f("share the input embedding with the output projection", True)
    seed: int = _f("random seed of the weights", 0, minimum=0)
    norm_eps: float = _f("RMSNorm epsilon", 1e-5)
    rope_theta: float = _f("RoPE base", 10000.0)
    model_type: str = _f(
        "the family the weights are for: llama, or gemma3_text (Gemma 3's text model: its norms, "
        "q/k norms and sliding layers, every sixth over the whole context)",
        "llama",
        choices=["llama", "gemma3_text"],
    )
    head_dim: int | None = _f("gemma3_text: head size (default dim / n_heads)", None, minimum=2)
    sliding_window: int = _f("gemma3_text: the sliding layers' window", 512, minimum=1)


QUANT_GROUP_MULTIPLE = 32  # XNNPACK's 4-bit blockwise kernels take groups of a multiple of 32 weights


@dataclass
class QuantizeConfig:
    """Quantize the shared foundation; LoRA A and B stay float32 in each adapter's .pte."""

    scheme: str = _f(
        "8da4w: every foundation linear gets int4 weights in groups, with int8 dynamic "
        "per-token activations (ExecuTorch's 8da4w, run by XNNPACK)",
        choices=["8da4w"],
    )
    group_size: int = _f(
        "int4 weights per scale: a multiple of 32 that divides every linear's input width",
        32,
        minimum=QUANT_GROUP_MULTIPLE,
    )
    embedding: str | None = _f(
        "int8: token embeddings as int8 with one scale per row; int4: in groups of "
        "group_size with a float16 scale each, about half int8's bytes, for a large vocabulary "
        "(Gemma 3's 262k) (default: float32)",
        None,
        choices=["int8", "int4"],
    )
    grid: str = _f(
        "each group's int4 grid: symmetric (one scale, zero at the grid's centre: ExecuTorch's "
        "8da4w) or asymmetric (a scale and a float offset per group, as llama.cpp's Q4_1: a Q4_1 "
        "GGUF's weights are kept exactly; the offsets add one small float32 linear per linear)",
        "symmetric",
        choices=["symmetric", "asymmetric"],
    )
    lm_head: str = _f(
        "the output projection's weights: int4 like every other linear, or int8 with one scale "
        "per row (keeps a Q8_0 or float embedding's precision in the logits; 2x its int4 bytes)",
        "int4",
        choices=["int4", "int8"],
    )


@dataclass
class FoundationConfig:
    """The shared base model: a Hugging Face checkpoint or synthetic weights."""

    checkpoint: Path | None = _f(
        f"Hugging Face model folder ({', '.join(FAMILIES)}): config.json + model.safetensors (or shards + "
        "index json); or a GGUF file (architectures llama, qwen2, qwen3, phi3, gemma3 (as gemma3_text); any "
        "quantization type the gguf "
        "package dequantizes)",
        None,
        path=True,
    )
    synthetic: SyntheticFoundation | None = _f("deterministic demo weights instead of a checkpoint", None)
    max_seq_len: int = _f(
        "the context: KV cache length, the longest prompt + generation the program accepts", 128, minimum=2
    )
    prefill_chunk: int = _f(
        "most prompt tokens one forward call takes; longer prompts are fed in chunks, so "
        "planned activation memory scales with chunk x context, not context squared "
        "(capped at max_seq_len)",
        128,
        minimum=2,
    )
    quantize: QuantizeConfig | None = _f("quantize the foundation (default: float32)", None)
    kv_cache: str = _f(
        "the KV cache's element type: float16 halves its bytes (llama.cpp's default) and runs "
        "attention in float16 (XNNPACK's float16 products accumulate in float32); float32 keeps "
        "attention exactly as the eager model computes it",
        "float32",
        choices=["float32", "float16"],
    )
    tokenizer: Path | None = _f(
        "folder with the model's tokenizer.json (+ tokenizer_config.json, generation_config.json, ...), copied "
        "beside foundation.ptd so `run --prompt` can encode text (default: the checkpoint folder's, if it has "
        "one; none for a synthetic foundation)",
        None,
        path=True,
    )


@dataclass
class SyntheticAdapter:
    """Deterministic demo LoRA weights."""

    rank: int = _f("LoRA rank r", minimum=1)
    alpha: float = _f("LoRA alpha (scale = alpha / rank)")
    target_modules: list[str] = _f("linears to adapt", choices=list(LORA_TARGETS))
    seed: int = _f("random seed of the weights", 0, minimum=0)
    layers: list[int] | None = _f("only these decoder layers (default: all)", None)


@dataclass
class AdapterConfig:
    """One LoRA adapter: a PEFT folder or synthetic weights."""

    name: str = _f("adapter name; the output is <name>.pte", pattern=NAME_RE.pattern)
    peft: Path | None = _f("PEFT folder: adapter_config.json + adapter_model.safetensors", None, path=True)
    synthetic: SyntheticAdapter | None = _f("deterministic demo LoRA weights instead of a PEFT folder", None)


@dataclass
class EnvelopeConfig:
    """The LoRA the deployment's one program accepts: every adapter inside it is added as data, with
    no export (an adapter outside it is refused, naming the key to widen)."""

    targets: list[str] | None = _f(
        "linears the program takes LoRA on, or 'all' (default: every linear some adapter of this config adapts)",
        None,
        choices=list(LORA_TARGETS),
        all_value=list(LORA_TARGETS),
    )
    max_rank: int | None = _f(
        "the largest LoRA rank it takes on each of them; any rank from 1 up fits "
        "(default: the largest rank of this config's adapters)",
        None,
        minimum=1,
    )
    layers: list[int] | None = _f("decoder layers it takes LoRA on, or 'all' (default: all)", None, all_value=None)
    skip_absent: bool = _f(
        "each adapter's file carries a variant of the program that skips the slots it "
        "leaves alone (derived when the file is written, no export): it decodes as through "
        "a program of its own recipe; a process holds one program instance per distinct "
        "set of slots instead of one in all",
        False,
    )


@dataclass
class ProgramConfig:
    """One exported model from a PT2 archive: its forward lowered to ExecuTorch, the tensors it shares
    with the deployment's other programs read from foundation.ptd."""

    name: str = _f("program name; the output is <name>.pte", pattern=NAME_RE.pattern)
    pt2: Path = _f("PT2 archive: torch.export.save's, or package_pt2's holding several models", path=True)
    model: str | None = _f("which model of the archive (default: its only one)", None)


HOIST = "hoist"


@dataclass
class DedupConfig:
    """What the build does with adapter tensors that have the same bytes in several adapters."""

    shared_adapter_tensors: str = _f(
        "'report': list them in the build's byte report, each .pte keeps its copy; 'hoist': store each "
        "once in adapters_shared.ptd, which every adapter using one then needs beside foundation.ptd",
        "report",
        choices=["report", HOIST],
    )


@dataclass
class BuildConfig:
    """What ``lora-share build`` reads."""

    foundation: FoundationConfig | None = _f("the shared base model (required unless the config lists programs)", None)
    adapters: list[AdapterConfig] | None = _f("LoRA adapters, one .pte each (required with a foundation)", None)
    programs: list[ProgramConfig] | None = _f(
        "exported models from PT2 archives instead of a foundation and adapters: one .pte each, every tensor "
        "two or more of them share stored once in foundation.ptd",
        None,
    )
    lora_envelope: EnvelopeConfig | None = _f(
        "the LoRA targets, layers and largest rank the deployment's program accepts (default: what this "
        "config's adapters need, on every layer)",
        None,
    )
    dedup: DedupConfig | None = _f("deduplication across adapters (default: report shared tensors)", None)
    output_dir: Path | None = _f("where outputs go (default: out/<config file stem>)", None, path=True)
    source: Path | None = field(default=None, metadata={"internal": True})


# ---------------------------------------------------------------------------
# Loading


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}s"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string", Path: "a path"}[tp]


class _Loader:
    """Walks YAML data against the dataclass tree, collecting every problem."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.problems: list[str] = []

    def problem(self, key: str, msg: str) -> None:
        self.problems.append(f"{key or '<top level>'}: {msg}")

    def value(self, tp, data, key: str, meta: dict):
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
            return None if data is None else self.value(inner, data, key, meta)
        if dataclasses.is_dataclass(tp):
            return self.dataclass(tp, data, key)
        if origin is list:
            if data == "all" and "all_value" in meta:
                return meta["all_value"]
            if not isinstance(data, list):
                self.problem(key, f"expected {_type_name(tp)}, got {data!r}")
                return None
            (item,) = typing.get_args(tp)
            return [self.value(item, v, f"{key}[{i}]", meta) for i, v in enumerate(data)]
        return self.scalar(tp, data, key, meta)

    def scalar(self, tp, data, key: str, meta: dict):
        ok = {
            bool: isinstance(data, bool),
            int: isinstance(data, int) and not isinstance(data, bool),
            float: isinstance(data, (int, float)) and not isinstance(data, bool),
            str: isinstance(data, str),
            Path: isinstance(data, str) and data != "",
        }[tp]
        if not ok:
            self.problem(key, f"expected {_type_name(tp)}, got {data!r}")
            return None
        if "minimum" in meta and data < meta["minimum"]:
            self.problem(key, f"must be at least {meta['minimum']}, got {data}")
        if "choices" in meta and data not in meta["choices"]:
            hint = difflib.get_close_matches(str(data), meta["choices"], n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            self.problem(key, f"{data!r} is not one of {', '.join(meta['choices'])}{did}")
        if "pattern" in meta and (problem := name_problem(data)):
            self.problem(key, problem)
        if tp is Path:
            p = Path(data).expanduser()
            return p if p.is_absolute() else (self.base_dir / p).resolve()
        return float(data) if tp is float else data

    def dataclass(self, cls, data, key: str):
        if not isinstance(data, dict):
            self.problem(key, f"expected a mapping, got {data!r}")
            return None
        fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
        for k in data:
            if k not in fields:
                hint = difflib.get_close_matches(str(k), list(fields), n=1)
                did = f"; did you mean {hint[0]!r}?" if hint else f"; known keys: {', '.join(fields)}"
                self.problem(_join(key, k), f"unknown key{did}")
        kwargs = {}
        hints = _hints(cls)
        for name, f in fields.items():
            sub = _join(key, name)
            if name in data:
                kwargs[name] = self.value(hints[name], data[name], sub, f.metadata)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                self.problem(sub, f"missing (required: {f.metadata['help']})")
                kwargs[name] = None
        return cls(**kwargs)


def _join(key: str, name) -> str:
    return f"{key}.{name}" if key else str(name)


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an adapter or a program (NAME_RULE), or None if it can."""
    if NAME_RE.fullmatch(name):
        return None
    return f"{name!r} must be {NAME_RULE} (names become file names and URL path parts)"


def _check_programs(programs: list[ProgramConfig], L: _Loader) -> None:
    """Names unique, each archive readable and holding the model named (or only one)."""
    from .formats.errors import FormatError
    from .formats.pt2 import archive_models

    if not programs:
        L.problem("programs", "list at least one program")
    seen: dict[str, int] = {}
    for i, p in enumerate(programs):
        if p is None:
            continue
        key = f"programs[{i}]"
        if p.name in seen:
            L.problem(f"{key}.name", f"{p.name!r} is already used by programs[{seen[p.name]}]")
        elif p.name is not None:
            seen[p.name] = i
        if p.pt2 is None:
            continue
        try:
            models = archive_models(p.pt2)
        except FormatError as e:
            L.problem(f"{key}.pt2", str(e))
            continue
        if p.model is None and len(models) > 1:
            L.problem(f"{key}.model", f"missing: {p.pt2} holds {len(models)} models ({', '.join(models)}); name one")
        elif p.model is not None and p.model not in models:
            L.problem(f"{key}.model", f"{p.pt2} has no model {p.model!r}; it holds {', '.join(models)}")


def _check_semantics(cfg: BuildConfig, L: _Loader) -> None:
    """Cross-field rules the types cannot express."""
    if cfg.programs is not None:
        _check_programs(cfg.programs, L)
        for key in ("foundation", "adapters", "lora_envelope", "dedup"):
            if getattr(cfg, key) is not None:
                L.problem(
                    key,
                    "a config of programs has no foundation, adapters, lora_envelope or dedup: "
                    "put those in a config of their own",
                )
        return
    for f in dataclasses.fields(BuildConfig):
        if f.name in ("foundation", "adapters") and getattr(cfg, f.name) is None:
            L.problem(f.name, f"missing (required: {f.metadata['help']})")
    fnd = cfg.foundation
    if fnd is not None:
        if (fnd.checkpoint is None) == (fnd.synthetic is None):
            L.problem("foundation", "give exactly one of 'checkpoint' or 'synthetic'")
        if fnd.checkpoint is not None and fnd.checkpoint.suffix == ".gguf":
            if not fnd.checkpoint.is_file():
                L.problem("foundation.checkpoint", f"{fnd.checkpoint}: no such file (a GGUF checkpoint)")
        elif fnd.checkpoint is not None and not fnd.checkpoint.is_dir():
            L.problem(
                "foundation.checkpoint",
                f"{fnd.checkpoint}: no such folder (a Hugging Face model folder, or a .gguf file)",
            )
        s = fnd.synthetic
        if s is not None and None not in (s.dim, s.n_heads, s.n_kv_heads):
            if s.n_heads and s.dim % s.n_heads and s.head_dim is None:
                L.problem("foundation.synthetic.dim", f"{s.dim} is not divisible by n_heads {s.n_heads}")
            if s.n_kv_heads and s.n_heads % s.n_kv_heads:
                L.problem("foundation.synthetic.n_kv_heads", f"n_heads {s.n_heads} is not a multiple of {s.n_kv_heads}")
            elif s.head_dim is not None and s.model_type == "llama":
                L.problem("foundation.synthetic.head_dim", "set only with model_type gemma3_text")
            elif (s.head_dim or s.dim // s.n_heads) % 2:
                L.problem(
                    "foundation.synthetic.head_dim" if s.head_dim else "foundation.synthetic.dim",
                    "the head size must be even for RoPE",
                )
        if fnd.tokenizer is not None:
            if not fnd.tokenizer.is_dir():
                L.problem("foundation.tokenizer", f"{fnd.tokenizer}: no such folder (a Hugging Face tokenizer folder)")
            elif not (fnd.tokenizer / "tokenizer.json").is_file():
                L.problem(
                    "foundation.tokenizer",
                    f"{fnd.tokenizer}: no tokenizer.json in this folder (a Hugging "
                    "Face tokenizer folder: tokenizer.json, tokenizer_config.json, ...)",
                )
        q = fnd.quantize
        if q is not None and isinstance(q.group_size, int) and q.group_size >= QUANT_GROUP_MULTIPLE:
            if q.group_size % QUANT_GROUP_MULTIPLE:
                L.problem(
                    "foundation.quantize.group_size",
                    f"{q.group_size} is not a multiple of {QUANT_GROUP_MULTIPLE} (XNNPACK's 4-bit kernels)",
                )
            elif s is not None:
                for key in ("dim", "hidden_dim"):
                    width = getattr(s, key)
                    if isinstance(width, int) and width % q.group_size:
                        L.problem(
                            "foundation.quantize.group_size",
                            f"{q.group_size} does not divide synthetic.{key} {width} (a linear's input width)",
                        )
    if cfg.adapters is not None:
        if not cfg.adapters:
            L.problem("adapters", "list at least one adapter")
        seen: dict[str, int] = {}
        for i, a in enumerate(cfg.adapters):
            if a is None:
                continue
            key = f"adapters[{i}]"
            if a.name == BASE_NAME:
                L.problem(
                    f"{key}.name",
                    f"{BASE_NAME!r} is the name of the foundation alone (no adapter) "
                    "in the runner, the C API and the server: pick another name",
                )
            elif a.name in seen:
                L.problem(f"{key}.name", f"{a.name!r} is already used by adapters[{seen[a.name]}]")
            elif a.name is not None:
                seen[a.name] = i
            if (a.peft is None) == (a.synthetic is None):
                L.problem(key, "give exactly one of 'peft' or 'synthetic'")
            if a.peft is not None and not a.peft.is_dir():
                L.problem(f"{key}.peft", f"{a.peft}: no such folder (a PEFT adapter folder)")
            if a.synthetic is not None and a.synthetic.target_modules == []:
                L.problem(f"{key}.synthetic.target_modules", "list at least one module")
    env = cfg.lora_envelope
    if env is not None:
        if env.targets == []:
            L.problem("lora_envelope.targets", "list at least one linear, or 'all'")
        if env.layers == []:
            L.problem("lora_envelope.layers", "list at least one layer, or 'all'")
        _check_adapters_in_envelope(cfg, env, L)
        n_layers = getattr(getattr(fnd, "synthetic", None), "n_layers", None)
        for layer in env.layers or []:
            if isinstance(layer, int) and (layer < 0 or (isinstance(n_layers, int) and layer >= n_layers)):
                L.problem(
                    "lora_envelope.layers",
                    f"layer {layer} does not exist"
                    + (f" (the foundation has {n_layers})" if isinstance(n_layers, int) else ""),
                )


def _adapter_shape(a) -> tuple[list[int], list[str] | None]:
    """An adapter's ranks and target modules as its config says them (PEFT's adapter_config.json: r,
    rank_pattern, target_modules), without reading its weights; ([], None) when unreadable (the
    build reports that)."""
    if a.synthetic is not None:
        return [a.synthetic.rank], a.synthetic.target_modules
    try:
        pc = json.loads((a.peft / "adapter_config.json").read_text())
    except (OSError, ValueError, TypeError):
        return [], None
    ranks = [pc.get("r")] + list((pc.get("rank_pattern") or {}).values())
    targets = pc.get("target_modules")
    return [r for r in ranks if isinstance(r, int)], targets if isinstance(targets, list) else None


def _check_adapters_in_envelope(cfg: BuildConfig, env, L) -> None:
    """Each adapter's ranks and targets against lora_envelope, before any export (build checks the
    weights themselves)."""
    for i, a in enumerate(cfg.adapters or []):
        ranks, targets = _adapter_shape(a)
        if env.max_rank is not None and ranks and max(ranks) > env.max_rank:
            L.problem(
                f"adapters[{i}]",
                f"{a.name}: rank {max(ranks)} is above lora_envelope.max_rank "
                f"({env.max_rank}): raise max_rank, or leave the adapter out",
            )
        if isinstance(env.targets, list) and targets is not None:
            outside = [t for t in targets if t not in env.targets]
            if outside:
                L.problem(
                    f"adapters[{i}]",
                    f"{a.name}: LoRA on {', '.join(outside)}, outside lora_envelope.targets "
                    f"[{', '.join(env.targets)}]: add them to targets, or leave the adapter out",
                )


def require_adapters(cfg: BuildConfig, what: str) -> None:
    """Refuse a config of programs where ``what`` needs a foundation and adapters."""
    if cfg.programs is not None:
        raise UserError(
            f"{cfg.source}: a config of programs (PT2 archives); {what} takes a config with a "
            "foundation and adapters (build this one with `lora-share build`)"
        )


def hoists_shared_tensors(cfg: BuildConfig) -> bool:
    """Whether the config asks for adapter tensors shared by several adapters in adapters_shared.ptd."""
    return cfg.dedup is not None and cfg.dedup.shared_adapter_tensors == HOIST


def load_config(path) -> BuildConfig:
    """Read and validate ``path``; raise ConfigErrors listing every problem."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such config file")
    import yaml  # the wheel's one requirement for a config; --help and inspect read none

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{path}:{where} not valid YAML: {getattr(e, 'problem', e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {e}") from None
    L = _Loader(path.resolve().parent)
    cfg = L.dataclass(BuildConfig, data if data is not None else {}, "")
    if cfg is not None:
        _check_semantics(cfg, L)
    if L.problems:
        raise ConfigErrors(path, L.problems)
    cfg.source = path.resolve()
    if cfg.output_dir is None:
        cfg.output_dir = (Path.cwd() / "out" / path.stem).resolve()
    return cfg


def export_settings(fnd: FoundationConfig) -> dict:
    """What of the foundation config shapes the exported files: everything but the tokenizer, so a
    changed tokenizer alone never re-exports the program (or changes its signature)."""
    return {k: v for k, v in config_to_dict(fnd).items() if k != "tokenizer"}


def foundation_from_dict(data: dict, where: str) -> FoundationConfig:
    """A FoundationConfig from plain data (as a manifest records it), validated like a config file."""
    L = _Loader(Path("/"))
    cfg = L.dataclass(FoundationConfig, data, "foundation")
    if L.problems:
        raise ConfigErrors(where, L.problems)
    return cfg


def config_to_dict(obj) -> Any:
    """Plain data (for the resolved config saved beside the outputs)."""
    if dataclasses.is_dataclass(obj):
        return {
            f.name: config_to_dict(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if getattr(obj, f.name) is not None and not f.metadata.get("internal")
        }
    if isinstance(obj, list):
        return [config_to_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


# ---------------------------------------------------------------------------
# JSON Schema


def _schema(tp, meta: dict) -> dict:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _schema(inner, meta)
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        fields = [f for f in dataclasses.fields(tp) if not f.metadata.get("internal")]
        out = {
            "type": "object",
            "description": (tp.__doc__ or "").strip(),
            "additionalProperties": False,
            "properties": {f.name: _schema(hints[f.name], f.metadata) for f in fields},
        }
        required = [
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if required:
            out["required"] = required
        return out
    if origin is list:
        item_meta = {k: v for k, v in meta.items() if k in ("choices", "minimum")}
        out = {"type": "array", "items": _schema(typing.get_args(tp)[0], item_meta)}
        if "all_value" in meta:
            out = {"anyOf": [out, {"const": "all"}]}
    else:
        out = {"type": {int: "integer", float: "number", bool: "boolean", str: "string", Path: "string"}[tp]}
        if "minimum" in meta:
            out["minimum"] = meta["minimum"]
        if "choices" in meta:
            out["enum"] = list(meta["choices"])
        if "pattern" in meta:
            out["pattern"] = meta["pattern"]
    if "help" in meta:
        out["description"] = meta["help"]
    return out


def config_json_schema() -> dict:
    """JSON Schema (draft 2020-12) of the config, derived from the dataclasses."""
    schema = _schema(BuildConfig, {})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "lora-share build config", **schema}
