"""One model of a PT2 archive as an ExportedProgram, read without unpickling anything.

The tensors are viewed from their raw blobs by the metadata of the weights and constants configs
(formats/pt2.py has checked both against the graph, and each blob's declared size against what its
tensors reach, before any blob is read here); the program is the archive's ExportedProgram JSON
(its depth bounded) read by torch's own deserializer; the sample inputs, if any, are read with
``torch.load(weights_only=True)`` (tensors and containers only: no code runs) from a torch.save zip
checked first (formats/zip_members.py), then held to the graph's user inputs: their structure,
count, dtypes and sizes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch

from ..errors import clip
from ..formats.errors import Damaged, FormatError, UnsupportedVersion
from ..formats.pt2 import MAX_PROGRAM_BYTES, MAX_SAMPLE_BYTES, ArchiveModel, NeedsCode, Payload, Pt2Archive, read_json
from ..formats.zip_members import check_nested_zip

MAX_SAMPLE_DEPTH = 16  # containers inside containers in the sample inputs: (args, kwargs) needs 2
MAX_SAMPLE_LEAVES = 4096


@dataclass
class ArchiveProgram:
    """A model of an archive, loaded."""

    name: str  # the model's name in the archive
    ep: torch.export.ExportedProgram
    sample_inputs: tuple | None  # forward's flat positional inputs, if the archive has them
    sample_args: tuple | None = None  # the same as (args, kwargs), to call ``ep.module()`` with


def _tensor(archive: Pt2Archive, p: Payload, blobs: dict[str, bytearray]) -> torch.Tensor:
    """``p`` viewed from its blob, read once; payloads naming one blob share its bytes, as they did
    when saved (each viewed with its own dtype)."""
    if p.member not in blobs:
        info = archive.zip.getinfo(p.member)
        blobs[p.member] = archive.read(p.member, info.file_size)  # its size was checked by open_archive
    dtype = getattr(torch, p.dtype)
    if 0 in p.sizes:
        return torch.empty(p.sizes, dtype=dtype)
    blob = blobs[p.member]
    flat = torch.frombuffer(blob, dtype=dtype, count=len(blob) // dtype.itemsize)
    return torch.as_strided(flat, p.sizes, p.strides, p.storage_offset)


def serialized_program(archive: Pt2Archive, model: ArchiveModel):
    """The model's program JSON as torch's schema dataclass (not yet deserialized into a graph)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import _dict_to_dataclass

    member = clip(model.program[len(archive.root) :])  # a zip name: up to 64 KiB
    info = archive.zip.getinfo(model.program)
    parsed = read_json(str(archive.path), archive.zip, info, member, MAX_PROGRAM_BYTES)
    try:
        return _dict_to_dataclass(schema.ExportedProgram, parsed)
    except Exception as e:  # any schema mismatch: the archive, not our code
        raise Damaged(
            str(archive.path), f"{member}: not a serialized ExportedProgram ({type(e).__name__}: {clip(e, 120)})"
        ) from None


def load_program(archive: Pt2Archive, model: ArchiveModel) -> ArchiveProgram:
    """``model`` of ``archive`` as an ExportedProgram (and its sample inputs)."""
    from torch._export.serde.serialize import ExportedProgramDeserializer, SerializeError

    what = str(archive.path)
    member = clip(model.program[len(archive.root) :])  # a zip name: up to 64 KiB
    serialized = serialized_program(archive, model)
    blobs: dict[str, bytearray] = {}
    state_dict, constants = {}, {}
    for p in model.payloads:
        t = _tensor(archive, p, blobs)
        if p.kind == "weight":
            state_dict[p.fqn] = torch.nn.Parameter(t, requires_grad=False) if p.is_param else t
        else:
            constants[p.fqn] = t
    try:
        ep = ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)
    except SerializeError as e:
        raise UnsupportedVersion(
            what, f"{member}: {clip(e, 200)}: export it with torch {torch.__version__.split('+')[0]}"
        ) from None
    except Exception as e:
        raise Damaged(what, f"{member}: cannot be deserialized ({type(e).__name__}: {clip(e, 200)})") from None
    sample = _sample_inputs(archive, model)
    flat = None
    if sample is not None:
        where = f"{what}: {clip(model.sample_inputs[len(archive.root) :])}"
        flat = check_sample_inputs(ep, sample, where)
        try:
            ep.example_inputs = sample  # torch holds their structure to forward's
        except (ValueError, TypeError, RuntimeError) as e:
            raise FormatError(where, f"not structured as forward's inputs ({clip(e, 160)}); export it again") from None
    return ArchiveProgram(model.name, ep, flat, sample)


def _sample_inputs(archive: Pt2Archive, model: ArchiveModel) -> tuple | None:
    """(args, kwargs) from the archive's sample inputs, or None when it has none."""
    if model.sample_inputs is None:
        return None
    member = clip(model.sample_inputs[len(archive.root) :])
    data = bytes(archive.read(model.sample_inputs, MAX_SAMPLE_BYTES))
    if not data:
        return None
    check_nested_zip(str(archive.path), member, data)
    try:
        sample = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:
        raise NeedsCode(
            str(archive.path),
            f"{member}: not plain tensors ({type(e).__name__}); reading it would run "
            "code from the archive, which lora-share refuses",
        ) from None
    if not (isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[0], tuple)) or not isinstance(
        sample[1], dict
    ):
        raise Damaged(str(archive.path), f"{member}: not the (args, kwargs) pair torch.export.save writes")
    return sample


def _leaves_bounded(sample, where: str) -> None:
    """The sample's containers nest at most MAX_SAMPLE_DEPTH deep around at most MAX_SAMPLE_LEAVES
    leaves (walked without recursion: torch's pytree recurses once per level)."""
    stack, leaves = [(sample, 0)], 0
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (tuple, list, dict)):
            if depth == MAX_SAMPLE_DEPTH:
                raise FormatError(where, f"nested deeper than {MAX_SAMPLE_DEPTH} levels: not forward's inputs")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
        else:
            leaves += 1
            if leaves > MAX_SAMPLE_LEAVES:
                raise FormatError(where, f"more than {MAX_SAMPLE_LEAVES} values: not forward's inputs")


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).removeprefix('torch.')}[{clip(', '.join(map(str, t.shape)), 60)}]"
    return clip(type(t).__name__, 40)


def check_sample_inputs(ep: torch.export.ExportedProgram, sample: tuple, where: str) -> tuple:
    """forward's flat inputs from ``sample``, held to the graph's user inputs: one per input, each a
    tensor of its dtype and rank, with its static sizes and its dynamic ones in their ranges."""
    from torch.export.graph_signature import InputKind, TensorArgument

    _leaves_bounded(sample, where)
    flat = tuple(torch.utils._pytree.tree_leaves(sample))
    specs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    if len(flat) != len(specs):
        raise FormatError(where, f"holds {len(flat)} value(s), the graph takes {len(specs)} input(s); export it again")
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for i, (value, spec) in enumerate(zip(flat, specs)):
        if not isinstance(spec.arg, TensorArgument):
            continue  # a constant the export specialized: the graph does not read it
        want = nodes[spec.arg.name].meta.get("val")
        if want is None:
            continue  # no shape recorded: torch checks the input when the program runs
        if not isinstance(value, torch.Tensor) or value.dtype != want.dtype or value.dim() != want.dim():
            raise FormatError(
                where, f"sample input {i} is {_describe(value)}, the graph takes {_describe(want)}; export it again"
            )
        for d, (n, size) in enumerate(zip(value.shape, want.shape)):
            if isinstance(size, int):
                ok = n == size
            else:
                r = ep.range_constraints.get(size.node.expr)
                ok = r is None or r.lower <= n <= r.upper
            if not ok:
                raise FormatError(
                    where,
                    f"sample input {i} is {_describe(value)}, the graph takes {_describe(want)} (dimension {d}); "
                    "export it again",
                )
    return flat
