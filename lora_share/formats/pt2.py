"""Read a PT2 archive's index without running code from it (torch-free).

A PT2 archive (``torch.export.save``; several models: ``torch.export.pt2_archive._package.package_pt2``)
is a zip with one top folder holding ``archive_format`` ("pt2"), ``archive_version``, per model
``models/<name>.json`` (the serialized ExportedProgram), ``data/weights/<name>_weights_config.json``
and ``data/constants/<name>_constants_config.json`` (FQN -> raw blob + tensor metadata), the blobs
themselves, and optional ``data/sample_inputs/<name>.pt``.

``open_archive`` checks all of it that can be checked without torch, before any blob is read:
the zip's members (formats/zip_members.py: no name twice, sizes that agree, no zip bomb), the
headers, every JSON member (its size and nesting bounded: formats/bounded_json.py), that every
tensor a config names is one the program's graph takes, with the graph's dtype and sizes (and that
the graph takes none the configs leave out), that its blob lies in its folder, exists and holds
exactly the bytes the tensor reaches (so a blob declaring more is refused unread), and that no
tensor's strides make its elements overlap (a stride-0 view of 2^40 rows from a 2 KB blob).
Pickled tensors, TorchBind and opaque objects and legacy pickled weight files are refused by name:
reading them would run code from the archive. Every problem is one ``FormatError`` naming the
archive and the member, with names and values cut short (``errors.clip``).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import clip
from . import bounded_json
from .errors import BadHeader, Damaged, FormatError, OffsetOutOfRange, UnsupportedVersion, WrongMagic
from .zip_members import check_members, check_starts_at_zero, read_member

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
SCALAR_TYPES_BY_CODE = {name: code for code, (name, _) in SCALAR_TYPES.items()}

# Bounds on what is read before it is parsed, far above what torch writes for any model: a config is
# about 300 bytes per tensor; a program's JSON a few KB per node (9 MB for a 1B-parameter decoder).
MAX_HEADER_BYTES = 64  # archive_format, archive_version, byteorder
MAX_CONFIG_BYTES = 64 << 20
MAX_PROGRAM_BYTES = 128 << 20
MAX_SAMPLE_BYTES = 256 << 20  # the sample inputs' torch.save zip
MAX_RANK = 16  # ExecuTorch's kTensorDimensionLimit
INT64_MAX = (1 << 63) - 1


class NeedsCode(FormatError):
    """The archive holds objects that only unpickling (running code from it) could read."""


@dataclass(frozen=True)
class Payload:
    """One parameter, buffer or constant tensor of a model: where its bytes are and how to view them."""

    fqn: str
    member: str  # the zip member holding the raw bytes
    config: str  # the config naming it (for messages), relative to the archive's top folder
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

    @property
    def span(self) -> int:
        """Bytes of its blob the view reaches: up to the last element's end (0 for an empty tensor)."""
        if 0 in self.sizes:
            return 0
        last = self.storage_offset + sum((n - 1) * s for n, s in zip(self.sizes, self.strides))
        return (last + 1) * SCALAR_TYPES_BY_NAME[self.dtype]

    @property
    def where(self) -> str:
        return f"{clip(self.config)}: {clip(repr(self.fqn))}"


@dataclass(frozen=True)
class ArchiveModel:
    """One model of an archive: its program's JSON, its tensors and (maybe) its sample inputs."""

    name: str
    program: str  # zip member of the serialized ExportedProgram
    payloads: tuple[Payload, ...]
    sample_inputs: str | None  # zip member, if the archive has them
    configs: tuple[str, str]  # zip members of its weights and constants configs


class Pt2Archive:
    """An open, checked PT2 archive. ``models``: name -> ArchiveModel, in the archive's order."""

    def __init__(self, path: Path, zf: zipfile.ZipFile, root: str, models: dict[str, ArchiveModel]):
        self.path, self.zip, self.root, self.models = path, zf, root, models

    def read(self, member: str, limit: int) -> bytearray:
        """A member's bytes (at most ``limit``), checked against the zip's sizes and CRC."""
        return read_member(str(self.path), self.zip, self.zip.getinfo(member), member[len(self.root) :], limit)

    def model(self, name: str | None) -> ArchiveModel:
        """The model ``name``; ``None``: the archive's only model."""
        if name is None:
            if len(self.models) != 1:
                raise FormatError(
                    str(self.path),
                    f"holds {len(self.models)} models ({clip(', '.join(self.models), 200)}): name one with 'model'",
                )
            return next(iter(self.models.values()))
        if name not in self.models:
            raise FormatError(
                str(self.path), f"has no model {clip(repr(name))}; it holds {clip(', '.join(self.models), 200)}"
            )
        return self.models[name]

    def close(self) -> None:
        self.zip.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_archive(path) -> Pt2Archive:
    """Open ``path`` and check its members, headers, configs and blob sizes (see the module docstring)."""
    path = Path(path)
    what = str(path)
    if not path.is_file():
        raise FormatError(what, "no such file (a PT2 archive: torch.export.save)")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise WrongMagic(
            what, f"not a zip file, or a truncated one ({clip(e)}): a PT2 archive is the zip torch.export.save writes"
        ) from None
    try:
        return _checked(path, zf)
    except BaseException:
        zf.close()
        raise


def _checked(path: Path, zf: zipfile.ZipFile) -> Pt2Archive:
    what = str(path)
    infos = zf.infolist()
    check_starts_at_zero(what, infos)
    check_members(what, infos)
    names = [i.filename for i in infos]
    roots = {n.split("/", 1)[0] for n in names}
    if len(roots) != 1 or not all("/" in n for n in names):
        raise BadHeader(what, "not a PT2 archive: its members are not all in one top folder")
    root = roots.pop() + "/"
    members = {n[len(root) :]: zf.getinfo(n) for n in names}

    def text(member: str) -> str:
        if member not in members:
            raise BadHeader(what, f"no {member}: not a PT2 archive (torch.export.save writes one)")
        try:
            return read_member(what, zf, members[member], member, MAX_HEADER_BYTES).decode().strip()
        except UnicodeDecodeError as e:
            raise Damaged(what, f"{member}: not text ({e.reason})") from None

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
            for folder in (WEIGHTS_DIR, CONSTANTS_DIR):
                if f"{folder}{name}.pt" in members:
                    raise NeedsCode(
                        what,
                        f"{folder}{clip(name)}.pt is a legacy pickled {folder.split('/')[1]} file: reading it would "
                        "run code from the archive, which lora-share refuses; export with torch.export.save",
                    )
            configs = tuple(_config_name(folder, name) for folder in (WEIGHTS_DIR, CONSTANTS_DIR))
            graph = graph_tensors(what, member, read_json(what, zf, members[member], member, MAX_PROGRAM_BYTES))
            payloads = _payloads(what, zf, root, members, name, WEIGHTS_DIR) + _payloads(
                what, zf, root, members, name, CONSTANTS_DIR
            )
            _check_against_graph(what, member, graph, payloads)
            _check_blob_sizes(what, members, payloads, root)
            sample = f"data/sample_inputs/{name}.pt"
            models[name] = ArchiveModel(
                name,
                root + member,
                tuple(payloads),
                root + sample if sample in members else None,
                tuple(root + c for c in configs),
            )
    if not models:
        raise BadHeader(what, "holds no model (no models/<name>.json): was it written by torch.export.save?")
    return Pt2Archive(path, zf, root, models)


def _config_name(folder: str, model: str) -> str:
    return f"{folder}{model}_{'weights' if folder == WEIGHTS_DIR else 'constants'}_config.json"


def read_json(what: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str, limit: int):
    """A JSON member, its size and nesting bounded (formats/bounded_json.py); one error otherwise."""
    data = read_member(what, zf, info, shown, limit)
    try:
        return bounded_json.loads(bytes(data))
    except ValueError as e:
        raise Damaged(what, f"{clip(shown)}: not readable JSON ({clip(e, 120)}); export it again") from None


def _payloads(what: str, zf: zipfile.ZipFile, root: str, members: dict, model: str, folder: str) -> list[Payload]:
    """The tensors a model's weights or constants config names, each checked on its own."""
    config = _config_name(folder, model)
    if config not in members:
        raise BadHeader(
            what, f"no {clip(config)} for model {clip(repr(model))}: the archive is incomplete; export it again"
        )
    parsed = read_json(what, zf, members[config], config, MAX_CONFIG_BYTES)
    entries = parsed.get("config") if isinstance(parsed, dict) else None
    if not isinstance(entries, dict):
        raise Damaged(what, f"{clip(config)}: not a readable config (no 'config' mapping); export it again")
    return [_payload(what, root, members, config, folder, fqn, meta) for fqn, meta in entries.items()]


def _payload(what: str, root: str, members: dict, config: str, folder: str, fqn: str, meta) -> Payload:
    where = f"{clip(config)}: {clip(repr(fqn))}"
    try:
        file = meta["path_name"]
        if not isinstance(file, str):
            raise TypeError("path_name is not a string")
        if "/" in file or "\\" in file or file in ("", ".", ".."):
            raise BadHeader(what, f"{where} names {clip(repr(file))}, a file outside the archive's {folder} folder")
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
                f"{where} is {kind} ({clip(file)}): reading it would run code from the archive, "
                "which lora-share refuses; export the model with plain tensors",
            )
        member = folder + file
        if member not in members:
            raise OffsetOutOfRange(
                what, f"{where}: its blob {clip(member)} is missing from the archive; export it again"
            )
        tm = meta["tensor_meta"]
        if not isinstance(tm["dtype"], int) or tm["dtype"] not in SCALAR_TYPES:
            raise FormatError(
                what,
                f"{where}: dtype code {clip(repr(tm['dtype']))} is not one lora-share reads "
                f"({', '.join(n for n, _ in SCALAR_TYPES.values())})",
            )
        dtype = SCALAR_TYPES[tm["dtype"]][0]
        if not isinstance(tm["sizes"], list) or not isinstance(tm["strides"], list):
            raise TypeError("sizes and strides are not lists")
        if len(tm["sizes"]) > MAX_RANK:
            raise FormatError(what, f"{where}: {len(tm['sizes'])} dimensions, more than ExecuTorch's {MAX_RANK}")
        sizes = tuple(_int(s) for s in tm["sizes"])
        strides = tuple(_int(s) for s in tm["strides"])
        offset = _int(tm["storage_offset"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise Damaged(what, f"{where}: not a readable entry ({clip(repr(e), 120)})") from None
    if len(sizes) != len(strides) or min((*sizes, *strides, offset, 0)) < 0:
        raise Damaged(
            what, f"{where}: sizes {clip(sizes)}, strides {clip(strides)} and offset {offset} do not describe a tensor"
        )
    payload = Payload(
        fqn,
        root + member,
        config,
        "weight" if folder == WEIGHTS_DIR else "constant",
        bool(meta.get("is_param")),
        dtype,
        sizes,
        strides,
        offset,
    )
    if _overlaps(sizes, strides):
        raise FormatError(
            what,
            f"{where}: sizes {clip(sizes)} with strides {clip(strides)} overlap ({payload.nbytes:,} bytes of "
            f"elements from {payload.span:,} bytes of blob: a stride-0 or expanded view), which lora-share "
            "would have to copy out whole; save the tensor .contiguous() (or .clone()) before exporting",
        )
    return payload


def graph_tensors(what: str, member: str, program) -> dict[str, tuple[str, int, tuple]]:
    """FQN -> (placeholder, dtype code, sizes) of each parameter, buffer and tensor constant the
    serialized ExportedProgram ``program`` (its parsed JSON) takes as an input."""
    kinds = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}
    try:
        graph = program["graph_module"]["graph"]["tensor_values"]
        out = {}
        for spec in program["graph_module"]["signature"]["input_specs"]:
            (kind, body), *_ = spec.items()
            if kind in kinds:
                meta = graph[body["arg"]["name"]]
                sizes = tuple(s.get("as_int") if isinstance(s, dict) else None for s in meta["sizes"])
                out[body[kinds[kind]]] = (body["arg"]["name"], meta["dtype"], sizes)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise Damaged(
            what, f"{clip(member)}: not a serialized ExportedProgram (no {clip(e, 60)}); export it again"
        ) from None
    return out


def _describe(dtype, sizes) -> str:
    name = (
        SCALAR_TYPES[dtype][0] if isinstance(dtype, int) and dtype in SCALAR_TYPES else f"dtype code {clip(dtype, 20)}"
    )
    return f"{name}[{clip(', '.join(map(str, sizes)), 60)}]"


def _check_against_graph(what: str, member: str, graph: dict, payloads: list[Payload]) -> None:
    """Every tensor the configs name is one the graph takes, with its dtype and sizes, and the graph
    takes no tensor they leave out: checked before any blob is read, so a blob is never read for a
    tensor the program does not have, or read as another dtype or shape than the program computes with."""
    named = set()
    for p in payloads:
        if p.fqn not in graph:
            raise FormatError(
                what, f"{p.where}: names a tensor the program ({clip(member)}) does not take; export it again"
            )
        arg, dtype, sizes = graph[p.fqn]
        code = SCALAR_TYPES_BY_CODE[p.dtype]
        if (code, p.sizes) != (dtype, sizes):
            raise FormatError(
                what,
                f"{p.where}: is {_describe(code, p.sizes)} but the graph's {clip(arg)} in {clip(member)} takes "
                f"{_describe(dtype, sizes)}: the archive's metadata disagree; export it again",
            )
        named.add(p.fqn)
    missing = [fqn for fqn in graph if fqn not in named]
    if missing:
        raise FormatError(
            what,
            f"{clip(member)} takes {clip(missing[0])} ({len(missing)} tensor(s) in all), which no config of "
            "the archive names: the archive is incomplete; export it again",
        )


def _overlaps(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether two indices of the view can reach one element: with its dimensions of more than one
    element ordered by stride, each stride must clear the whole extent of the ones inside it."""
    if 0 in sizes:
        return False
    extent = 1
    for stride, size in sorted((st, n) for n, st in zip(sizes, strides) if n > 1):
        if stride < extent:
            return True
        extent = stride * size
    return False


def _check_blob_sizes(what: str, members: dict, payloads: list[Payload], root: str) -> None:
    """Each blob holds exactly what its tensors reach: fewer bytes is a truncated archive, more is
    refused unread (torch.export.save writes a tensor's storage and nothing else)."""
    reach: dict[str, Payload] = {}
    for p in payloads:
        if p.member not in reach or p.span > reach[p.member].span:
            reach[p.member] = p
    for member, p in reach.items():
        have = members[member[len(root) :]].file_size
        if have < p.span:
            raise OffsetOutOfRange(
                what,
                f"{p.where}: its blob {clip(member[len(root) :])} holds {have:,} bytes, the tensor needs "
                f"{p.span:,}: the archive is truncated; export it again",
            )
        if have > p.span:
            raise OffsetOutOfRange(
                what,
                f"{p.where}: its blob {clip(member[len(root) :])} declares {have:,} bytes, the tensor needs "
                f"{p.span:,}: refused unread (a zip bomb, or a tensor saved as a view of a larger one: "
                "save it .clone()d before exporting)",
            )


def _int(v) -> int:
    """A serialized SymInt / int that must be a plain integer of int64's range."""
    if isinstance(v, dict):
        if "as_int" not in v:
            raise ValueError(f"{clip(v, 60)} is symbolic, not a number")
        v = v["as_int"]
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{clip(repr(v), 60)} is not an integer")
    if not -INT64_MAX <= v <= INT64_MAX:
        raise ValueError(f"{clip(v, 60)} is outside int64's range")
    return v


def archive_models(path) -> list[str]:
    """The model names ``path`` holds (for config validation); raises FormatError for a bad archive."""
    with open_archive(path) as archive:
        return list(archive.models)
