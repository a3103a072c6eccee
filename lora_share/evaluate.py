"""``lora-share eval``: how well a build predicts a text, against transformers in float32.

The text is encoded with the build's tokenizer (its ids without special tokens) and cut into
windows of the build's context (max_seq_len tokens; the last one may be shorter). Each window is fed
to the exported program through ExecuTorch's Python runtime (run/python_runtime.py) from position 0, one token
per forward call, since the program returns the logits of the last position it is fed: the logits
after token i predict token i + 1 (teacher forcing). The foundation alone ("base") is the same program
with every LoRA input a zero rank-1 pair, as the runners run it.

The reference is the build's own checkpoint (a Hugging Face folder or a GGUF file, which transformers
dequantizes itself) loaded by transformers in float32, with the adapter through peft (a PEFT folder as
it is; a synthetic adapter's weights regenerated from the build's config and set into peft's LoRA
layers), fed each whole window in one call. Reported per adapter: the build's perplexity over every
predicted token, the reference's on the same windows, the share of positions where both pick the same
top-1 token, and the largest logit difference.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import yaml

from .config import BASE_NAME
from .errors import UserError
from .manifest import ADAPTERS, Manifest, has_manifest, read_manifest

MIN_TOKENS = 2  # one predicted token


@dataclass
class Scores:
    """One adapter's figures over the text (``adapter`` is BASE_NAME for the foundation alone)."""

    adapter: str
    perplexity: float
    reference_perplexity: float
    top1_agreement: float  # share of predicted positions where the build's argmax is the reference's
    max_abs_logit_diff: float
    predicted: int  # tokens scored (every window's positions but its first)
    seconds: float  # the build's forward calls
    tokens_per_s: float

    @property
    def ratio(self) -> float:
        return self.perplexity / self.reference_perplexity


@dataclass
class Report:
    build: str
    quantize: dict | None
    text: dict  # path, sha256, characters, tokens, window, windows
    reference: str
    results: list[Scores] = field(default_factory=list)

    def to_json(self) -> dict:
        out = asdict(self)
        for row, scores in zip(out["results"], self.results):
            row["ratio"] = scores.ratio
        return out


def resolve_build(target: Path, quiet: bool = True) -> Path:
    """The build folder of ``target``: a folder with manifest.json, or a config (built, or reused when
    nothing changed, by ``lora-share build``)."""
    target = Path(target)
    if target.is_dir():
        if not has_manifest(target):
            raise UserError(f"{target}: no manifest.json: give the output folder of `lora-share build` or its config")
        return target
    if target.is_file() and target.suffix in (".yaml", ".yml"):
        from .config import load_config
        from .deploy.builder import build

        cfg = load_config(target)
        if not quiet:
            print(f"building {target} (kept as it is if nothing changed)", file=sys.stderr, flush=True)
        build(target, quiet=quiet)
        return Path(cfg.output_dir)
    raise UserError(f"{target}: no such build folder or config (.yaml)")


def read_text(path: Path) -> str:
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such text file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable UTF-8 text file ({e})") from None


def windows(ids: list[int], size: int) -> list[list[int]]:
    """``ids`` in consecutive windows of ``size`` tokens; a last window of one token predicts nothing
    and is left out."""
    return [ids[i : i + size] for i in range(0, len(ids), size) if len(ids) - i >= 2]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def target_nll(logits: np.ndarray, window: list[int]) -> np.ndarray:
    """Negative log-likelihood of each next token: row i of ``logits`` predicts ``window[i + 1]``."""
    lp = log_softmax(logits[: len(window) - 1])
    return -lp[np.arange(len(window) - 1), window[1:]]


class Subject:
    """One adapter of the build (or the foundation alone) in both runtimes."""

    def __init__(self, name: str, folder: Path, manifest: Manifest, reference):
        from .formats.shared_ptd import SHARED_PTD
        from .inference.python_runtime import LoadedAdapter

        if not manifest.adapters:
            raise UserError(f"{folder}: the build has no adapter file, so no program to run")
        entry = manifest.adapter(name) if name != BASE_NAME else manifest.adapters[0]
        shared = folder / SHARED_PTD
        self.name, self.where = name, f"{folder.name}/{name}"
        self.program = LoadedAdapter(
            folder / entry["file"],
            folder / "foundation.ptd",
            shared if shared.is_file() else None,
            lora=name != BASE_NAME,
        )
        self.reference = reference

    def logits(self, window: list[int]) -> np.ndarray:
        """The build's logits ``[len(window), vocab]``: row i after feeding token i at position i."""
        self.program.cache.clear()
        return np.stack([self.program.step([t], pos) for pos, t in enumerate(window)])


def _peft_reference(hf_model, entry: dict, config_entry: dict, args, folder: Path):
    """``hf_model`` with the adapter ``entry`` (the manifest's) through peft."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from .checkpoints.adapters import module_key, synthetic_adapter
    from .config import SyntheticAdapter
    from .files import sha256_file

    source = entry.get("source", {})
    if source.get("kind") == "peft":
        path = Path(source["path"])
        for name, digest in source.get("sha256", {}).items():
            if not (path / name).is_file() or sha256_file(path / name) != digest:
                raise UserError(
                    f"{path / name}: missing or changed since {folder} was built: rebuild it, "
                    "or evaluate the build against the adapter it was built from"
                )
        return PeftModel.from_pretrained(hf_model, str(path)).eval()
    if "synthetic" not in config_entry:
        raise UserError(
            f"{folder / 'config.resolved.yaml'}: adapter {entry['name']} is neither a PEFT folder nor "
            "synthetic: cannot load it in peft"
        )
    adapter = synthetic_adapter(entry["name"], SyntheticAdapter(**config_entry["synthetic"]), args)
    rank = adapter.meta["rank"]
    # The weights carry their scale in B already (checkpoints/adapters.py), so peft's scale is 1 (alpha = rank).
    model = get_peft_model(
        hf_model,
        LoraConfig(
            r=rank,
            lora_alpha=rank,
            lora_dropout=0.0,
            target_modules=adapter.meta["targets"],
            layers_to_transform=adapter.meta["layers"],
        ),
    )
    modules = dict(model.base_model.model.named_modules())
    import torch

    with torch.no_grad():
        for (layer, target), (a, b) in adapter.weights.items():
            module = modules[module_key(layer, target)]
            module.lora_A["default"].weight.copy_(torch.from_numpy(a))
            module.lora_B["default"].weight.copy_(torch.from_numpy(b))
    return model.eval()


class Reference:
    """The build's checkpoint in transformers, float32; ``logits(window, adapter)`` per position."""

    def __init__(self, folder: Path, manifest: Manifest):
        import torch
        from transformers import AutoModelForCausalLM

        checkpoint = manifest.export_settings.get("checkpoint")
        if checkpoint is None:
            raise UserError(
                f"{folder}: its foundation is synthetic: eval compares with transformers loading the "
                "build's checkpoint, so it needs a build from a checkpoint"
            )
        path = Path(checkpoint)
        if not path.exists():
            raise UserError(
                f"{path}: the build's checkpoint is missing: eval loads it in transformers as the reference"
            )
        kwargs = {"dtype": torch.float32}
        if path.suffix == ".gguf":
            self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
        self.model.eval()
        self.description = f"transformers float32, {path.name}"
        self.folder, self.manifest = folder, manifest
        self.adapted: dict = {}

    def with_adapter(self, name: str):
        """The transformers model for ``name`` (BASE_NAME: the checkpoint alone)."""
        if name == BASE_NAME:
            return self.model
        if name not in self.adapted:
            entry = self.manifest.adapter(name)
            resolved = yaml.safe_load((self.folder / "config.resolved.yaml").read_text())
            config_entry = next((a for a in resolved.get("adapters", []) if a["name"] == name), {})
            import copy

            # peft wraps the model it gets in place: each adapter gets its own copy.
            self.adapted[name] = _peft_reference(
                copy.deepcopy(self.model), entry, config_entry, self.manifest.model_args, self.folder
            )
        return self.adapted[name]

    def logits(self, window: list[int], name: str) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self.with_adapter(name)(input_ids=torch.tensor([window])).logits[0]
        return out.float().numpy()


def evaluate(
    target,
    text_path,
    adapters: list[str] | None = None,
    max_tokens: int | None = None,
    min_tokens: int = MIN_TOKENS,
    progress: bool = False,
) -> Report:
    """Perplexity and top-1 agreement with transformers float32 of the build ``target`` (folder or
    config) on the text in ``text_path``, for ``adapters`` (default: the foundation alone, then every
    adapter of the build). ``max_tokens`` cuts the text's ids; fewer than ``min_tokens`` is refused."""
    from .tokenizer.files import bind_tokenizer

    folder = resolve_build(Path(target), quiet=not progress)
    manifest = read_manifest(folder, ADAPTERS)
    names = manifest.adapter_names
    wanted = adapters or [BASE_NAME, *names]
    for name in wanted:
        if name != BASE_NAME and name not in names:
            raise UserError(
                f"--adapter {name}: {folder} has no such adapter (it has: {', '.join([BASE_NAME, *names])})"
            )
    text = read_text(text_path)
    bound = bind_tokenizer(folder / "foundation.ptd", folder)
    ids = bound.tokenizer.encode(text, add_special_tokens=False).ids
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if len(ids) < max(min_tokens, MIN_TOKENS):
        raise UserError(
            f"{text_path}: {len(ids)} tokens{' (after --max-tokens)' if max_tokens else ''}, but the "
            f"evaluation needs at least {max(min_tokens, MIN_TOKENS)}: give a longer text"
        )
    size = manifest.max_seq_len
    chunks = windows(ids, size)
    reference = Reference(folder, manifest)
    report = Report(
        str(folder),
        manifest.quantize,
        {
            "path": str(text_path),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "characters": len(text),
            "tokens": sum(len(w) for w in chunks),
            "window": size,
            "windows": len(chunks),
        },
        reference.description,
    )
    for name in wanted:
        report.results.append(_score(Subject(name, folder, manifest, reference), chunks, progress))
    return report


def _score(subject: Subject, chunks: list[list[int]], progress: bool) -> Scores:
    nll, ref_nll, agree, worst, n, seconds = 0.0, 0.0, 0, 0.0, 0, 0.0
    for i, window in enumerate(chunks):
        t0 = time.perf_counter()
        got = subject.logits(window)
        seconds += time.perf_counter() - t0
        want = subject.reference.logits(window, subject.name)
        m = len(window) - 1
        nll += float(target_nll(got, window).sum())
        ref_nll += float(target_nll(want, window).sum())
        agree += int((got[:m].argmax(-1) == want[:m].argmax(-1)).sum())
        worst = max(worst, float(np.abs(got[:m] - want[:m]).max()))
        n += m
        if progress:
            print(
                f"  {subject.where}: window {i + 1}/{len(chunks)}, perplexity so far {math.exp(nll / n):.3f} "
                f"(transformers {math.exp(ref_nll / n):.3f}), {n / seconds:.1f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
    return Scores(
        adapter=subject.name,
        perplexity=math.exp(nll / n),
        reference_perplexity=math.exp(ref_nll / n),
        top1_agreement=agree / n,
        max_abs_logit_diff=worst,
        predicted=n,
        seconds=seconds,
        tokens_per_s=sum(len(w) for w in chunks) / seconds,
    )


def render(report: Report) -> str:
    """The report as a plain-text table."""
    t = report.text
    q = report.quantize
    lines = [
        f"{report.build} ({'float32' if q is None else q.get('scheme')} foundation) on {t['path']}: "
        f"{t['tokens']} tokens in {t['windows']} windows of {t['window']}",
        f"reference: {report.reference}",
        f"{'adapter':<16} {'perplexity':>10} {'reference':>10} {'ratio':>7} {'top-1 agree':>11} "
        f"{'max |dlogit|':>12} {'tokens/s':>9}",
    ]
    for s in report.results:
        lines.append(
            f"{s.adapter:<16} {s.perplexity:>10.4f} {s.reference_perplexity:>10.4f} {s.ratio:>7.4f} "
            f"{100 * s.top1_agreement:>10.2f}% {s.max_abs_logit_diff:>12.2e} {s.tokens_per_s:>9.1f}"
        )
    return "\n".join(lines)
