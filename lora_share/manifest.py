"""manifest.json, the index of a deployment folder: its keys, writing it, reading it back.

This module alone opens the file and alone spells its sections: the builders of a deployment of
adapters (deploy/writer.py, deploy/byte_report.py, tokenizer/files.py) and of one of programs
(programs/build.py) put each section together with the functions below, and every reader gets a
``Manifest``: the JSON object as written, with typed accessors for what readers look up (the C++
reader, cpp_runner/formats/manifest.cpp, checks the same ``format`` and ``version``). Each key is
specified in schema/FORMAT.md, "manifest.json". A reader accepts exactly one ``version``: the
version changes when a key changes meaning or one a reader needs goes away (keys that are only
added leave it as it is, and readers ignore keys they do not know), so a manifest of any other
version, older or newer, is refused naming the file, the version found and the one read here.
Torch-free: light commands read it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from .errors import UserError
from .model.args import ModelArgs
from .model.envelope import Envelope

MANIFEST = "manifest.json"
FORMAT = "lora-share-manifest"
# 2: a "program" section (its envelope and sha256); adapters carry their LoRA keys, not a signature.
VERSION = 2
# A deployment's kind: "kind" in the file for programs; a deployment of adapters has no "kind" key
# (it was the only kind when the key came).
ADAPTERS = "adapters"
PROGRAMS = "programs"
_KIND_WORDS = {
    ADAPTERS: "a deployment of adapters (built from a config with 'adapters:'; `add` takes PEFT folders)",
    PROGRAMS: "a deployment of programs (built from a config with 'programs:'; `add` takes PT2 archives)",
}


class Manifest(dict):
    """A manifest: the JSON object as the file holds it (``json.dumps`` writes it back unchanged),
    with typed accessors for what readers look up."""

    @property
    def kind(self) -> str:
        return self.get("kind", ADAPTERS)

    @property
    def config(self) -> str | None:
        return self.get("config")

    @property
    def build_s(self) -> float:
        return self["build_s"]

    # The foundation.
    @property
    def foundation(self) -> dict:
        return self["foundation"]

    @property
    def foundation_file(self) -> str:
        return self["foundation"]["file"]

    @property
    def foundation_size(self) -> int:
        return self["foundation"]["size"]

    @property
    def foundation_sha256(self) -> str:
        return self["foundation"]["sha256"]

    @property
    def fingerprint(self) -> str | None:
        return (self.get("foundation") or {}).get("fingerprint")

    @property
    def foundation_description(self) -> dict:
        """What ``foundation_section`` takes as ``described``: its keys beyond the file's."""
        return {k: v for k, v in self["foundation"].items() if k not in _FILE_KEYS}

    @property
    def args(self) -> dict:
        """The foundation's shape as recorded (``ModelArgs``' fields plus ``head_dim``)."""
        return self["foundation"]["args"]

    @property
    def model_args(self) -> ModelArgs:
        return ModelArgs(**self.args)

    @property
    def max_seq_len(self) -> int:
        return int(self.args["max_seq_len"])

    @property
    def quantize(self) -> dict | None:
        return self["foundation"].get("quantize")

    @property
    def export_settings(self) -> dict:
        return self["export_settings"]

    @property
    def exporter(self) -> int | None:
        return self.get("exporter")

    # The program every adapter carries.
    @property
    def program(self) -> dict:
        return self["program"]

    @property
    def program_sha256(self) -> str:
        return self["program"]["sha256"]

    @property
    def program_signature(self) -> str | None:
        return self.get("program", {}).get("signature")

    @property
    def envelope(self) -> Envelope:
        return Envelope.from_dict(self["program"]["envelope"])

    # The adapters, the shared file, the tokenizer.
    @property
    def adapters(self) -> list[dict]:
        return self["adapters"]

    @property
    def adapter_names(self) -> list[str]:
        return [a["name"] for a in self["adapters"]]

    @property
    def adapter_files(self) -> list[str]:
        return [a["file"] for a in self["adapters"]]

    def adapter(self, name: str) -> dict | None:
        return next((a for a in self.get("adapters", []) if a["name"] == name), None)

    @property
    def shared(self) -> dict | None:
        """adapters_shared.ptd's entry (``dedup.shared_adapter_tensors: hoist``), or None."""
        return self.get("shared")

    @property
    def tokenizer(self) -> dict | None:
        """The tokenizer section; None without one (or with something else than an object there)."""
        section = self.get("tokenizer")
        return section if isinstance(section, dict) else None

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """The foundation the tokenizer section was written for."""
        return (self.tokenizer or {}).get("foundation_fingerprint")

    @property
    def tokenizer_files(self) -> dict[str, dict]:
        """File name -> its ``sha256`` and ``size``; none without a tokenizer."""
        return (self.tokenizer or {}).get("files") or {}

    @property
    def eos_token_ids(self) -> list[int]:
        return list((self.tokenizer or {}).get("eos_token_ids") or [])

    @property
    def bos_token_id(self) -> int | None:
        return (self.tokenizer or {}).get("bos_token_id")

    @property
    def has_chat_template(self) -> bool:
        return bool((self.tokenizer or {}).get("chat_template"))

    @property
    def chat_format(self) -> dict | None:
        return (self.tokenizer or {}).get("chat_format")

    @property
    def byte_report(self) -> dict:
        return self["bytes"]

    # A deployment of programs.
    @property
    def programs(self) -> list[dict]:
        return self["programs"]

    def has_program(self, name: str) -> bool:
        return any(p["name"] == name for p in self.get("programs", []))


# ---------------------------------------------------------------------------
# Writing: each section with its keys in the order the file lists them.

_FILE_KEYS = ("file", "size", "sha256", "fingerprint")


def adapters_manifest(
    *,
    config: str | None,
    export_settings: dict,
    exporter: int,
    foundation: dict,
    program: dict,
    tokenizer: dict | None,
    shared: dict | None,
    adapters: list[dict],
    byte_report: dict,
    build_s: float,
) -> Manifest:
    """The manifest of a deployment of adapters; ``tokenizer`` and ``shared`` appear only when the
    build has them."""
    return Manifest(
        {
            "format": FORMAT,
            "version": VERSION,
            "config": config,
            "export_settings": export_settings,
            "exporter": exporter,
            "foundation": foundation,
            "program": program,
            **({"tokenizer": tokenizer} if tokenizer else {}),
            **({"shared": shared} if shared else {}),
            "adapters": adapters,
            "bytes": byte_report,
            "build_s": build_s,
        }
    )


def describe_foundation(*, parameters: int, args: ModelArgs, source: dict, quantize: dict | None) -> dict:
    """The foundation section's keys beyond its file's: ``args`` with ``head_dim`` always set,
    ``quantize`` only when quantized."""
    return {
        "parameters": parameters,
        "args": {**asdict(args), "head_dim": args.hd},
        "source": source,
        **({"quantize": quantize} if quantize else {}),
    }


def foundation_section(*, file: str, size: int, sha256: str, fingerprint: str, described: dict) -> dict:
    """``foundation``: foundation.ptd and what it holds (``described``: ``describe_foundation``'s,
    or ``Manifest.foundation_description`` kept by ``add``)."""
    return {"file": file, "size": size, "sha256": sha256, "fingerprint": fingerprint, **described}


def program_section(*, signature: str, sha256: str, envelope: Envelope, produced: str, seconds: float) -> dict:
    return {
        "signature": signature,
        "sha256": sha256,
        "envelope": envelope.to_dict(),
        "produced": produced,
        "seconds": round(seconds, 2),
    }


def file_entry(*, file: str, size: int, sha256: str, tensors: int, tensor_bytes: int) -> dict:
    """A data file and its tensors: ``shared`` (adapters_shared.ptd), a deployment of programs'
    ``foundation``."""
    return {"file": file, "size": size, "sha256": sha256, "tensors": tensors, "tensor_bytes": tensor_bytes}


def lora_slot(*, layer: int, target: str, rank: int, a: str, b: str) -> dict:
    return {"layer": layer, "target": target, "rank": rank, "a": a, "b": b}


def adapter_entry(
    *,
    name: str,
    file: str,
    size: int,
    sha256: str,
    lora_bytes: int,
    produced: str,
    seconds: float,
    described: dict,
    lora: list[dict],
    hoisted: list[str] | None,
) -> dict:
    """``adapters[]``: an adapter's .pte; ``described`` is where it came from and its shape
    (checkpoints/adapters.py's ``Adapter.meta``); ``hoisted`` only with hoist. A quantized build
    sets ``quantization_error`` after it (``with_quantization_error``)."""
    return {
        "name": name,
        "file": file,
        "size": size,
        "sha256": sha256,
        "lora_bytes": lora_bytes,
        "produced": produced,
        "seconds": round(seconds, 3),
        **described,
        "lora": lora,
        **({"hoisted": hoisted} if hoisted is not None else {}),
    }


def with_quantization_error(entry: dict, error: dict) -> dict:
    return {**entry, "quantization_error": error}


def tokenizer_section(
    *,
    files: dict[str, dict],
    foundation_fingerprint: str,
    eos_token_ids: list[int],
    bos_token_id: int | None,
    chat_template: bool,
    chat_format: dict | None,
) -> dict:
    """``tokenizer``: ``files`` maps file name -> ``tokenizer_file(...)``; ``chat_format`` only when
    the template can be written as plain text pieces."""
    return {
        "files": files,
        "foundation_fingerprint": foundation_fingerprint,
        "eos_token_ids": eos_token_ids,
        "bos_token_id": bos_token_id,
        "chat_template": chat_template,
        **({"chat_format": chat_format} if chat_format is not None else {}),
    }


def tokenizer_file(*, sha256: str, size: int) -> dict:
    return {"sha256": sha256, "size": size}


# The byte report (``bytes``), figures from deploy/byte_report.py.


def file_bytes(*, file: str, total: int, stored: int, shared: int, duplicate_avoided: int) -> dict:
    """``bytes.foundation``: a file's bytes, stored once per segment."""
    return {
        "file": file,
        "total": total,
        "stored": stored,
        "shared": shared,
        "unique": stored - shared,
        "duplicate_avoided": duplicate_avoided,
    }


def adapter_bytes(*, shared_with_other_adapters: int, **figures) -> dict:
    """``bytes.adapters.<name>``: ``file_bytes``' keys, and what other .pte files also hold."""
    entry = file_bytes(**figures)
    entry["unique"] -= shared_with_other_adapters
    return {**entry, "shared_with_other_adapters": shared_with_other_adapters}


def shared_bytes(*, tensors: int, tensor_bytes: int, readers: dict[str, list[str]], **figures) -> dict:
    """``bytes.shared``: adapters_shared.ptd's bytes; ``duplicate_avoided`` counts the copies the
    adapters reading its tensors would otherwise hold."""
    return {**file_bytes(**figures), "tensors": tensors, "tensor_bytes": tensor_bytes, "readers": readers}


def across_adapters(tensors: dict[str, tuple[int, list[str]]]) -> dict:
    """``bytes.across_adapters``: ``tensors`` maps a tensor's key -> (its size, the adapters whose .pte
    holds it), for tensors in two or more."""
    return {
        "shared": sum(size for size, _ in tensors.values()),
        "duplicate": sum(size * (len(names) - 1) for size, names in tensors.values()),
        "tensors": [{"sha256": k, "size": size, "adapters": names} for k, (size, names) in sorted(tensors.items())],
    }


def byte_report_section(*, foundation: dict, adapters: dict[str, dict], across: dict, shared: dict | None) -> dict:
    report = {"foundation": foundation, "adapters": adapters, "across_adapters": across}
    report["total"] = foundation["total"] + sum(a["total"] for a in adapters.values())
    if shared is not None:
        report["shared"] = shared
        report["total"] += shared["total"]
    return report


# A deployment of programs.


def programs_manifest(*, config: str | None, foundation: dict, programs: list[dict], build_s: float) -> Manifest:
    """The manifest of a deployment of programs; ``foundation`` is foundation.ptd's ``file_entry``."""
    programs_size = sum(p["size"] for p in programs)
    # Each program on its own: its .pte with the tensors it reads from foundation.ptd inside.
    without = sum(p["size"] + p["from_foundation_bytes"] for p in programs)
    with_sharing = foundation["size"] + programs_size
    return Manifest(
        {
            "format": FORMAT,
            "version": VERSION,
            "kind": PROGRAMS,
            "config": config,
            "foundation": foundation,
            "programs": programs,
            "bytes": {
                "foundation_tensor_bytes": foundation["tensor_bytes"],
                "programs_bytes": programs_size,
                "total_without_sharing": without,
                "total_with_sharing": with_sharing,
                "saved": without - with_sharing,
            },
            "build_s": round(build_s, 2),
        }
    )


def program_entry(
    *,
    name: str,
    file: str,
    size: int,
    sha256: str,
    archive: str,
    archive_sha256: str,
    model: str | None,
    tensors: int,
    tensor_bytes: int,
    from_foundation: dict[str, str],
    from_foundation_bytes: int,
    inputs: list[tuple[str, list[int]]],
    sample_max_abs_diff: float | None,
) -> dict:
    """``programs[]``: a program's .pte; ``inputs`` are its user inputs' (dtype name, shape)."""
    return {
        "name": name,
        "file": file,
        "size": size,
        "sha256": sha256,
        "archive": archive,
        "archive_sha256": archive_sha256,
        "model": model,
        "tensors": tensors,
        "tensor_bytes": tensor_bytes,
        "from_foundation": dict(sorted(from_foundation.items())),
        "from_foundation_bytes": from_foundation_bytes,
        "inputs": [{"dtype": dtype, "shape": shape} for dtype, shape in inputs],
        "sample_max_abs_diff": sample_max_abs_diff,
    }


def write_manifest(folder: Path, manifest: dict) -> Path:
    """Write ``folder``/manifest.json whole or not at all (a temporary file renamed over it)."""
    path = Path(folder) / MANIFEST
    partial = path.with_name(f".{MANIFEST}.{os.getpid()}.partial")
    try:
        partial.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------------------
# Reading


def _found(manifest: dict, key: str) -> str:
    return json.dumps(manifest[key]) if key in manifest else "none"


def check_manifest(manifest, path: Path) -> Manifest:
    """``manifest`` (parsed from ``path``) if it is a lora-share manifest of this version; otherwise a
    UserError naming the file, what it holds and what this reader reads."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = _found(manifest, "format") if isinstance(manifest, dict) else "none (not a JSON object)"
        raise UserError(
            f"{path}: not a lora-share manifest (format {found}; this reader reads format "
            f"{json.dumps(FORMAT)} version {VERSION}): give the manifest.json of a lora-share build"
        )
    if manifest.get("version") != VERSION:
        raise UserError(
            f"{path}: written by another lora-share version (manifest version {_found(manifest, 'version')}; "
            f"this one reads version {VERSION} only): rebuild the deployment with this "
            "version's `lora-share build`"
        )
    return Manifest(manifest)


def read_manifest_file(path: Path) -> Manifest:
    """A manifest.json at ``path``, parsed and checked (``check_manifest``); a missing file is the
    caller's to look for first."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(
            f"{path}: not a readable manifest ({e}): use the manifest.json its build wrote, "
            "or rebuild with `lora-share build`"
        ) from None
    return check_manifest(data, path)


def has_manifest(folder: Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def read_manifest(folder: Path, kind: str | None = None) -> Manifest:
    """The manifest of the deployment folder ``folder``, checked (``check_manifest``); with ``kind``,
    a deployment of another kind is refused, naming both kinds in words."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise UserError(f"{path}: missing: is {folder} the output folder of a lora-share build?")
    manifest = read_manifest_file(path)
    if kind is not None and manifest.kind != kind:
        raise UserError(f"{folder} is {kind_words(manifest.kind)}; this needs {kind_words(kind)}")
    return manifest


def kind_words(kind: str) -> str:
    """A deployment's kind in words: what it is built from and what `lora-share add` takes."""
    return _KIND_WORDS[kind]


def deployment_kind(folder: Path) -> str | None:
    """``ADAPTERS`` or ``PROGRAMS`` for a readable manifest in ``folder``; None otherwise (the reader
    that needs it reports why)."""
    try:
        return read_manifest(folder).kind
    except UserError:
        return None
