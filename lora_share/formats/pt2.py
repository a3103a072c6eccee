"""Read a PT2 archive's index without running code from it (torch-free).

A PT2 archive (``torch.export.save``; several models: ``torch.export.pt2_archive._package.package_pt2``)
is a zip with one top folder holding ``archive_format`` ("pt2"), ``archive_version``, per model
``models/<name>.json`` (the serialized ExportedProgram), ``data/weights/<name>_weights_config.json``
and ``data/constants/<name>_constants_config.json`` (FQN -> raw blob + tensor metadata), the blobs
themselves, and optional ``data/sample_inputs/<name>.pt``.

``open_archive`` checks all of it that can be checked without torch: the headers, every config's
JSON, that every blob a config names lies in its folder, exists and holds the bytes its metadata
needs. Pickled tensors, TorchBind and opaque objects are refused by name: reading them would run
code from the archive. Every problem is one ``FormatError`` naming the archive and the member.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import BadHeader, Damaged, FormatError, OffsetOutOfRange, UnsupportedVersion, WrongMagic

ARCHIVE_FORMAT = "pt2"
ARCHIVE_VERSIONS = ("0",)  # torch.export.pt2_archive.constants.ARCHIVE_VERSION_VALUE in torch 2.13
WEIGHTS_DIR, CONSTANTS_DIR = "data/weights/", "data/constants/"
# torch._export.serde.schema.ScalarType -> (name, bytes per element): the dtypes a blob may hold.
SCALAR_TYPES = {
    1: ("uint8", 1),
    2: ("int8", 1),
    3: ("int16", 2),
    4: ("int32", 4),
    5: ("int64", 8),
    6: ("float16", 2),
    7: ("float32", 4),
    8: ("float64", 8),
    12: ("bool", 1),
    13: ("bfloat16", 2),
}
SCALAR_TYPES_BY_NAME = dict(SCALAR_TYPES.values())


class NeedsCode(FormatError):
    """The archive holds objects that only unpickling (running code from it) could read."""


@dataclass(frozen=True)
class Payload:
    """One parameter, buffer or constant tensor of a model: where its bytes are and how to view them."""

    fqn: str
    member: str  # the zip member holding the raw bytes
    kind: str  # "weight" (parameter or buffer) or "constant"
    is_param: bool
    dtype: str
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    storage_offset: int

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor itself (its elements, contiguous)."""
        n = SCALAR_TYPES_BY_NAME[self.dtype]
        for s in self.sizes:
            n *= s
        return n


@dataclass(frozen=True)
class ArchiveModel:
    """One model of an archive: its program's JSON, its tensors and (maybe) its sample inputs."""

    name: str
    program: str  # zip member of the serialized ExportedProgram
    payloads: tuple[Payload, ...]
    sample_inputs: str | None  # zip member, if the archive has them


class Pt2Archive:
    """An open, checked PT2 archive. ``models``: name -> ArchiveModel, in the archive's order."""

    def __init__(self, path: Path, zf: zipfile.ZipFile, root: str, models: dict[str, ArchiveModel]):
        self.path, self.zip, self.root, self.models = path, zf, root, models

    def read(self, member: str) -> bytes:
        """A member's bytes, checked against the zip's CRC."""
        try:
            return self.zip.read(member)
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise Damaged(
                str(self.path), f"{member}: cannot be read ({e}): the archive is truncated or damaged; export it again"
            ) from None

    def model(self, name: str | None) -> ArchiveModel:
        """The model ``name``; ``None``: the archive's only model."""
        if name is None:
            if len(self.models) != 1:
                raise FormatError(
                    str(self.path), f"holds {len(self.models)} models ({', '.join(self.models)}): name one with 'model'"
                )
            return next(iter(self.models.values()))
        if name not in self.models:
            raise FormatError(str(self.path), f"has no model {name!r}; it holds {', '.join(self.models)}")
        return self.models[name]

    def close(self) -> None:
        self.zip.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_archive(path) -> Pt2Archive:
    """Open ``path`` and check its headers, configs and blobs (see the module docstring)."""
    path = Path(path)
    what = str(path)
    if not path.is_file():
        raise FormatError(what, "no such file (a PT2 archive: torch.export.save)")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise WrongMagic(
            what, f"not a zip file, or a truncated one ({e}): a PT2 archive is the zip torch.export.save writes"
        ) from None
    try:
        return _checked(path, zf)
    except BaseException:
        zf.close()
        raise


def _checked(path: Path, zf: zipfile.ZipFile) -> Pt2Archive:
    what = str(path)
    names = zf.namelist()
    roots = {n.split("/", 1)[0] for n in names}
    if len(roots) != 1 or not all("/" in n for n in names):
        raise BadHeader(what, "not a PT2 archive: its members are not all in one top folder")
    root = roots.pop() + "/"
    members = {n[len(root) :]: zf.getinfo(n) for n in names}

    def text(member: str) -> str:
        if member not in members:
            raise BadHeader(what, f"no {member}: not a PT2 archive (torch.export.save writes one)")
        try:
            return zf.read(root + member).decode().strip()
        except (zipfile.BadZipFile, OSError, EOFError, UnicodeDecodeError) as e:
            raise Damaged(what, f"{member}: cannot be read ({e})") from None

    if (fmt := text("archive_format")) != ARCHIVE_FORMAT:
        raise BadHeader(
            what,
            f"archive_format is {fmt[:40]!r}, not {ARCHIVE_FORMAT!r}: not a torch.export archive "
            "(an AOTInductor-only or other package)",
        )
    version = text("archive_version") if "archive_version" in members else "0"
    if version not in ARCHIVE_VERSIONS:
        raise UnsupportedVersion(
            what,
            f"archive_version {version[:40]!r}: this lora-share reads version(s) "
            f"{', '.join(ARCHIVE_VERSIONS)} (torch 2.13's); export with that torch",
        )
    byteorder = text("byteorder") if "byteorder" in members else "little"
    if byteorder != "little":
        raise BadHeader(what, f"byteorder is {byteorder[:20]!r}: only little-endian archives are read")
    models = {}
    for member in members:
        if member.startswith("models/") and member.endswith(".json"):
            name = member[len("models/") : -len(".json")]
            payloads = _payloads(what, zf, root, members, name, WEIGHTS_DIR) + _payloads(
                what, zf, root, members, name, CONSTANTS_DIR
            )
            sample = f"data/sample_inputs/{name}.pt"
            models[name] = ArchiveModel(
                name, root + member, tuple(payloads), root + sample if sample in members else None
            )
    if not models:
        raise BadHeader(what, "holds no model (no models/<name>.json): was it written by torch.export.save?")
    return Pt2Archive(path, zf, root, models)


def _payloads(what: str, zf: zipfile.ZipFile, root: str, members: dict, model: str, folder: str) -> list[Payload]:
    """The tensors a model's weights or constants config names, each checked against its blob."""
    config = f"{folder}{model}_{'weights' if folder == WEIGHTS_DIR else 'constants'}_config.json"
    if config not in members:
        raise BadHeader(what, f"no {config} for model {model!r}: the archive is incomplete; export it again")
    try:
        entries = json.loads(zf.read(root + config))["config"]
        if not isinstance(entries, dict):
            raise ValueError("'config' is not a mapping")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError, TypeError) as e:
        raise Damaged(what, f"{config}: not a readable config ({e})") from None
    out = []
    for fqn, meta in entries.items():
        where = f"{config}: {fqn!r}"
        try:
            file = meta["path_name"]
            if not isinstance(file, str):
                raise TypeError("path_name is not a string")
            if "/" in file or "\\" in file or file in ("", ".", ".."):
                raise BadHeader(what, f"{where} names {file!r}, a file outside the archive's {folder} folder")
            if meta.get("use_pickle") or file.startswith(("custom_obj_", "opaque_obj_")):
                kind = (
                    "a TorchBind object"
                    if file.startswith("custom_obj_")
                    else "an opaque pickled object"
                    if file.startswith("opaque_obj_")
                    else "a pickled tensor"
                )
                raise NeedsCode(
                    what,
                    f"{where} is {kind} ({file}): reading it would run code from the archive, "
                    "which lora-share refuses; export the model with plain tensors",
                )
            member = folder + file
            if member not in members:
                raise OffsetOutOfRange(what, f"{where}: its blob {member} is missing from the archive; export it again")
            tm = meta["tensor_meta"]
            if tm["dtype"] not in SCALAR_TYPES:
                raise FormatError(
                    what,
                    f"{where}: dtype code {tm['dtype']} is not one lora-share reads "
                    f"({', '.join(n for n, _ in SCALAR_TYPES.values())})",
                )
            dtype, size = SCALAR_TYPES[tm["dtype"]]
            sizes = tuple(_int(s) for s in tm["sizes"])
            strides = tuple(_int(s) for s in tm["strides"])
            offset = _int(tm["storage_offset"])
        except (KeyError, TypeError, ValueError) as e:
            raise Damaged(what, f"{where}: not a readable entry ({e!r})") from None
        if len(sizes) != len(strides) or min((*sizes, *strides, offset, 0)) < 0:
            raise Damaged(
                what, f"{where}: sizes {sizes}, strides {strides} and offset {offset} do not describe a tensor"
            )
        needed = 0 if 0 in sizes else (offset + sum((n - 1) * s for n, s in zip(sizes, strides)) + 1) * size
        have = members[member].file_size
        if have < needed:
            raise OffsetOutOfRange(
                what,
                f"{where}: its blob {member} holds {have} bytes, the tensor needs {needed}: "
                "the archive is truncated; export it again",
            )
        out.append(
            Payload(
                fqn,
                root + member,
                "weight" if folder == WEIGHTS_DIR else "constant",
                bool(meta.get("is_param")),
                dtype,
                sizes,
                strides,
                offset,
            )
        )
    return out


def _int(v) -> int:
    """A serialized SymInt / int that must be a plain integer."""
    if isinstance(v, dict):
        if "as_int" not in v:
            raise ValueError(f"{v} is symbolic, not a number")
        v = v["as_int"]
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{v!r} is not an integer")
    return v


def archive_models(path) -> list[str]:
    """The model names ``path`` holds (for config validation); raises FormatError for a bad archive."""
    with open_archive(path) as archive:
        return list(archive.models)
