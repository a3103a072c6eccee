"""manifest.json, the index of a deployment folder: its keys, writing it, reading it back.

Every reader and writer of the file goes through this module (the C++ reader,
cpp_runner/formats/manifest.cpp, checks the same ``format`` and ``version``). Each key is
specified in schema/FORMAT.md, "manifest.json". A reader accepts exactly one ``version``:
the version changes when a key changes meaning or one a reader needs goes away (keys that are
only added leave it as it is, and readers ignore keys they do not know), so a manifest of
any other version, older or newer, is refused naming the file, the version found and the one
read here. Torch-free: light commands read it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import UserError

MANIFEST = "manifest.json"
FORMAT = "lora-share-manifest"
# 2: a "program" section (its envelope and sha256); adapters carry their LoRA keys, not a signature.
VERSION = 2


def compose(
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
) -> dict:
    """A manifest with its keys in the order the file lists them; ``tokenizer`` and ``shared``
    appear only when the build has them."""
    return {
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


def _found(manifest: dict, key: str) -> str:
    return json.dumps(manifest[key]) if key in manifest else "none"


def check_manifest(manifest, path: Path) -> dict:
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
    return manifest


def read_manifest_file(path: Path) -> dict:
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


def read_manifest(folder: Path) -> dict:
    """The manifest of the deployment folder ``folder``, checked (``check_manifest``)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise UserError(f"{path}: missing: is {folder} the output folder of a lora-share build?")
    return read_manifest_file(path)
