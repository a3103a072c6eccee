"""The checkpoint's tokenizer in a build: found, checked against the model, copied beside
foundation.ptd, listed in manifest.json, and bound back to that foundation at run time.

A build ships the files the Hugging Face tokenizer is made of (``TOKENIZER_FILES``, those present)
so that ``lora-share run --prompt`` and the C++ runner encode and decode text with exactly the
tokenizer the model was trained with. manifest.json's ``tokenizer`` section lists each with its
sha256 and size, the end-of-sequence and beginning-of-sequence ids, whether there is a chat
template, and the foundation fingerprint it belongs to. At run time ``bind_tokenizer`` refuses a
tokenizer folder that is not the one the given foundation.ptd was built with.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..config import FoundationConfig
from ..errors import UserError
from ..files import sha256_file
from ..manifest import MANIFEST, Manifest, read_manifest_file, tokenizer_file, tokenizer_section
from .chat_format import resolve_chat_format

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
# chat_template.jinja: where transformers >= 4.50 saves the chat template instead of tokenizer_config.json.
TOKENIZER_FILES = (
    TOKENIZER_JSON,
    TOKENIZER_CONFIG,
    "tokenizer.model",
    "special_tokens_map.json",
    GENERATION_CONFIG,
    "chat_template.jinja",
)
NO_TOKENIZER_HINT = "pass --tokens ids, or add foundation.tokenizer to the config and rebuild"


@dataclass
class TokenizerSource:
    """A tokenizer folder found for a build, checked against the model's vocabulary."""

    folder: Path
    files: dict[str, Path]  # file name -> where it is now
    eos_token_ids: list[int]
    bos_token_id: int | None
    chat_template: bool


def load_tokenizer(path: Path):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json, or a UserError naming the file."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception for a malformed file
        raise UserError(f"{path}: not a tokenizer.json the tokenizers library can load ({e})") from None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken mapping."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _config_token_id(tokenizer, config: dict, key: str, path: Path) -> int | None:
    """The id of tokenizer_config.json's ``key`` token (bos_token, eos_token), if it names one."""
    text = _token_text(config.get(key))
    if text is None:
        return None
    token_id = tokenizer.token_to_id(text)
    if token_id is None:
        raise UserError(f"{path}: {key} {text!r} is not in the vocabulary of {path.parent / TOKENIZER_JSON}")
    return token_id


def _generation_ids(config: dict, key: str, path: Path) -> list[int]:
    """generation_config.json's ``key`` (an id, a list of ids, or absent) as a list."""
    value = config.get(key)
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise UserError(f"{path}: {key} must be a token id or a list of token ids, got {value!r}")
    return values


def tokenizer_folder(fnd: FoundationConfig) -> Path | None:
    """Where a build takes its tokenizer from: ``foundation.tokenizer``, else a GGUF checkpoint's own
    (gguf_checkpoint.gguf_tokenizer_folder), else the checkpoint folder when it has a tokenizer.json,
    else none (a synthetic foundation has no tokenizer)."""
    if fnd.tokenizer is not None:
        return fnd.tokenizer
    if fnd.checkpoint is not None and fnd.checkpoint.suffix == ".gguf":
        from ..checkpoints.gguf import gguf_tokenizer_folder  # torch: a build's import, not add's

        return gguf_tokenizer_folder(fnd.checkpoint)
    if fnd.checkpoint is not None and (fnd.checkpoint / TOKENIZER_JSON).is_file():
        return fnd.checkpoint
    return None


def find_tokenizer(fnd: FoundationConfig, vocab_size: int) -> TokenizerSource | None:
    """The build's tokenizer, checked to fit a model of ``vocab_size`` ids; None if it has none."""
    folder = tokenizer_folder(fnd)
    if folder is None:
        return None
    files = {name: folder / name for name in TOKENIZER_FILES if (folder / name).is_file()}
    tokenizer_json = files[TOKENIZER_JSON]  # config validation made sure it is there
    tokenizer = load_tokenizer(tokenizer_json)
    top = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if top >= vocab_size:
        raise UserError(
            f"{tokenizer_json}: has token id {top}, but the model's vocabulary is {vocab_size} ids "
            f"(0..{vocab_size - 1}): this is not the tokenizer of this model"
        )
    tok_cfg_path, gen_cfg_path = folder / TOKENIZER_CONFIG, folder / GENERATION_CONFIG
    tok_cfg = _read_json(tok_cfg_path) if TOKENIZER_CONFIG in files else {}
    gen_cfg = _read_json(gen_cfg_path) if GENERATION_CONFIG in files else {}
    eos = _generation_ids(gen_cfg, "eos_token_id", gen_cfg_path)
    config_eos = _config_token_id(tokenizer, tok_cfg, "eos_token", tok_cfg_path)
    if config_eos is not None and config_eos not in eos:
        eos.append(config_eos)
    bos = _config_token_id(tokenizer, tok_cfg, "bos_token", tok_cfg_path)
    if bos is None:
        bos = next(iter(_generation_ids(gen_cfg, "bos_token_id", gen_cfg_path)), None)
    for token_id in eos + ([bos] if bos is not None else []):
        if not 0 <= token_id < vocab_size:
            raise UserError(
                f"{gen_cfg_path}: token id {token_id} is outside the model's vocabulary (0..{vocab_size - 1})"
            )
    chat = bool(tok_cfg.get("chat_template")) or "chat_template.jinja" in files
    return TokenizerSource(folder, files, eos, bos, chat)


def stage_files(stage: Path, files: dict[str, Path], link: bool) -> dict[str, dict]:
    """Copy (or, for files of the same build, hard-link) ``files`` into the staging folder; their
    manifest entries, hashed from the staged copies. The staging folder replaces the output folder
    in one rename, so no reader ever sees a half-written tokenizer."""
    entries = {}
    for name, source in files.items():
        dest = stage / name
        if link:
            os.link(source, dest)
        else:
            shutil.copyfile(source, dest)
        entries[name] = tokenizer_file(sha256=sha256_file(dest), size=dest.stat().st_size)
    return entries


def section_for_build(source: TokenizerSource, entries: dict[str, dict], fingerprint: str) -> dict:
    """manifest.json's ``tokenizer`` section for a build; ``entries`` are ``stage_files``'."""
    return tokenizer_section(
        files=entries,
        foundation_fingerprint=fingerprint,
        eos_token_ids=source.eos_token_ids,
        bos_token_id=source.bos_token_id,
        chat_template=source.chat_template,
        # The template as plain text pieces, for runtimes without Jinja (the C++ server), when it can be.
        chat_format=resolve_chat_format(source.folder) if source.chat_template else None,
    )


def shipped_files(out_dir: Path, manifest: Manifest) -> dict[str, Path]:
    """The tokenizer files an existing build lists (``lora-share add`` keeps them as they are),
    each checked against its manifest entry."""
    files = {}
    for name, entry in manifest.tokenizer_files.items():
        path = out_dir / name
        if not path.is_file() or sha256_file(path) != entry["sha256"]:
            raise UserError(f"{path}: missing or not the file {out_dir / MANIFEST} describes")
        files[name] = path
    return files


# ---------------------------------------------------------------------------
# Run time


@dataclass
class BoundTokenizer:
    """A tokenizer checked to belong to the foundation.ptd it will run with."""

    folder: Path
    tokenizer: object  # tokenizers.Tokenizer
    eos_token_ids: list[int]
    bos_token_id: int | None
    chat_template: bool


def _short(digest: str) -> str:
    return f"{digest[:12]}…"


def _ptd_fingerprint(ptd: Path, required: bool = True) -> str | None:
    """The foundation fingerprint recorded inside ``ptd``; without a record, None unless ``required``."""
    from ..formats import FormatError, read_ptd
    from ..formats.records import foundation_record

    try:
        record = foundation_record(read_ptd(ptd))
    except FormatError as e:
        raise UserError(f"--ptd {ptd}: {e}") from None
    if record is None and not required:
        return None
    if record is None:
        raise UserError(
            f"{ptd} has no lora-share foundation record, so no tokenizer can be bound to it: "
            "rebuild it with lora-share build, or pass --tokens ids"
        )
    return record.fingerprint


def eos_ids_beside(ptd) -> list[int]:
    """The end-of-sequence ids of the build ``ptd`` came from, for generation from token ids.

    They are the tokenizer section of the manifest.json beside ``ptd`` (where every client, the C++
    runner and library included, reads them): none without a manifest or a tokenizer in the build
    (nothing stops early). A tokenizer section for another foundation is refused naming both files.
    """
    ptd = Path(ptd)
    manifest_path = ptd.parent / MANIFEST
    if not ptd.is_file() or not manifest_path.is_file():
        return []  # a missing .ptd is the runtime's to report, with its flag
    manifest = read_manifest_file(manifest_path)
    if manifest.tokenizer is None:
        return []
    fingerprint = _ptd_fingerprint(ptd, required=False)
    if fingerprint is None:
        return []
    if manifest.tokenizer_fingerprint != fingerprint:
        raise UserError(
            f"{manifest_path}: its tokenizer section (the EOS ids) is for foundation "
            f"{_short(str(manifest.tokenizer_fingerprint))}, not {ptd} (foundation "
            f"{_short(fingerprint)}): copy manifest.json from the same build"
        )
    return [int(i) for i in manifest.eos_token_ids]


def bind_tokenizer(ptd, folder=None) -> BoundTokenizer:
    """The tokenizer of the build ``ptd`` came from, in ``folder`` (default: the .ptd's folder).

    Refuses, naming both files, a manifest.json or tokenizer file that is not from the build of
    ``ptd``: the manifest's foundation fingerprint and its tokenizer section's must both be the one
    recorded inside the .ptd, and every listed file present must have the listed sha256.
    """
    ptd = Path(ptd)
    if not ptd.is_file():
        raise UserError(f"--ptd {ptd}: no such file")
    folder = Path(folder) if folder is not None else ptd.parent
    manifest_path = folder / MANIFEST
    no_tokenizer = UserError(f"{folder} has no tokenizer (the build's checkpoint had none): {NO_TOKENIZER_HINT}")
    if not manifest_path.is_file():
        raise no_tokenizer
    manifest = read_manifest_file(manifest_path)
    if manifest.tokenizer is None:
        raise no_tokenizer
    fingerprint = _ptd_fingerprint(ptd)
    listed = manifest.fingerprint
    if listed != fingerprint:
        raise UserError(
            f"{manifest_path} describes foundation {_short(str(listed))}, not {ptd} (foundation "
            f"{_short(fingerprint)}): use the manifest.json and tokenizer files of {ptd.name}'s own build"
        )
    if manifest.tokenizer_fingerprint != fingerprint:
        raise UserError(
            f"{manifest_path}: its tokenizer section is for foundation "
            f"{_short(str(manifest.tokenizer_fingerprint))}, not {ptd} (foundation "
            f"{_short(fingerprint)}): copy the tokenizer files and manifest.json from the same build"
        )
    files = manifest.tokenizer_files
    if TOKENIZER_JSON not in files or not (folder / TOKENIZER_JSON).is_file():
        raise UserError(
            f"{folder / TOKENIZER_JSON}: missing, but {ptd}'s build has it (listed in "
            f"{manifest_path}): copy {TOKENIZER_JSON} from the same build"
        )
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            continue
        actual = sha256_file(path)
        if actual != entry.get("sha256"):
            raise UserError(
                f"{path} (sha256 {_short(actual)}) is not the tokenizer {ptd} was built with "
                f"({MANIFEST} lists {_short(str(entry.get('sha256')))}): copy {name} from the same build"
            )
    return BoundTokenizer(
        folder,
        load_tokenizer(folder / TOKENIZER_JSON),
        manifest.eos_token_ids,
        manifest.bos_token_id,
        manifest.has_chat_template,
    )
