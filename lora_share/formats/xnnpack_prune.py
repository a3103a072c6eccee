"""Absent LoRA slots as dead code: a program variant that skips the slots an adapter leaves alone.

An envelope program (model/envelope.py) computes every slot's LoRA on every token. In ``forward`` and
``decode`` a slot is three XNNPACK nodes: ``h = FC(x, A)``, ``d = FC(h, B)``, ``out = Add(y, d)``,
where ``y`` is the foundation linear's output and ``A``, ``B`` are forward inputs. In
``decode_batch`` (rows of their own LoRA, docs/batching.md) it is five: ``xt = Transpose(x)``,
``h = BMM(A, xt)``, ``d = BMM(B, h)``, ``dt = Transpose(d)``, ``out = Add(y, dt)``. For a slot no
row uses, those nodes add a zero product, and at decode they cost about what the slot's linear
does (a few microseconds each, a threadpool hand-off among them).

This module finds the 4-byte words to rewrite in a copy of the program so that XNNPACK drops them
when it builds its runtime, with every byte in place (the same file layout, no re-serialization,
no export):

- the Add becomes a Copy of ``y`` into ``out`` (its type byte, and its id fields read with the
  Copy's layout: input ``y``, output ``out``, flags 0);
- every other node of the slot reads the slot's own ``A`` or ``B`` where it read the value the node
  before it made (the B product reads ``B`` where it read ``h``; in decode_batch the transpose of
  ``d`` reads ``B``, the B product ``B`` and the A product ``A`` where they read ``d``, ``h`` and
  ``xt``).

XNNPACK's ``xnn_subgraph_optimize`` (run by ``xnn_create_runtime``) then finds every value of the
chain without consumers in its one pass and removes the nodes that make them, and fuses the Copy
into the foundation linear where ``y`` is internal to the payload (the linear writes ``out``
itself); where it is not, the Copy moves one row per token. ``out`` keeps its id, so the rewrite
holds whether or not it leaves the payload. Each rewrite is 4 bytes of the payload's flatbuffer
(schema: ExecuTorch's backends/xnnpack/serialization/schema.fbs), a ``Patch``, so that the
unpatched program can be restored exactly (``apply(..., revert=True)``). A slot whose nodes do not
have that shape (a value with other readers or leaving the payload) is left as it is: the variant
is always correct, at worst not faster.

Two users: lora-share's runtime makes a variant for the slots a request (or every row of a batched
step) leaves alone, from the table of every slot's rewrites each adapter record carries
(``slot_patches``; deploy/adapter_pte.py), and ``lora_envelope.skip_absent`` writes an adapter's
file with the variant for its own absent slots (``skip_patches``).

Which payload input is which forward input: a delegate call's arguments are its inputs, then its
outputs, and argument k is the payload's value whose ``external_id`` is k (ExecuTorch's
XNNExecutor binds them in that order).
"""

from __future__ import annotations

import importlib.util
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import BadFlatbuffer
from .flatbuf import FlatBuffer
from .pte import _segments as program_segments
from .pte import read_header
from .xnnpack import HEADER_MAGIC

XNNPACK_ID = "XnnpackBackend"
# Slots in ExecuTorch's program.fbs and the XNNPACK payload's schema.fbs.
_P_PLANS = 1
_PLAN_NAME, _PLAN_INPUTS, _PLAN_CHAINS, _PLAN_DELEGATES = 0, 3, 5, 7
_CHAIN_INSTRUCTIONS = 2
_INSTR_TYPE, _INSTR_ARGS, _DELEGATE_CALL = 0, 1, 2
_DC_INDEX, _DC_ARGS = 0, 1
_DEL_ID, _DEL_PROCESSED, _REF_LOCATION, _REF_INDEX, _SEGMENT = 0, 1, 0, 1, 1
_G_NODES, _G_VALUES, _G_INPUTS, _G_OUTPUTS = 1, 2, 4, 5
_NODE_TYPE, _NODE_UNION = 0, 1
_VALUE_TYPE, _VALUE_UNION, _QUANTIZED_VALUE = 0, 1, 2
_TV_EXTERNAL_ID, _TV_ID_OUT = 4, 6
_NO_EXTERNAL = 0xFFFFFFFF


@dataclass(frozen=True)
class Patch:
    """One uint32 value id rewritten at ``offset`` bytes into program segment ``segment``."""

    segment: int
    offset: int
    old: int
    new: int


@lru_cache(maxsize=1)
def node_id_fields() -> dict[int, tuple[str, tuple[tuple[int, str], ...]]]:
    """XNodeUnion member (its type byte) -> (node type, ((slot, field), ...) of its value-id fields),
    read from the installed ExecuTorch's XNNPACK schema, so that the rewrite follows its layout."""
    spec = importlib.util.find_spec("executorch")
    roots = list(spec.submodule_search_locations or []) if spec else []
    path = next(
        (
            Path(r) / "backends/xnnpack/serialization/schema.fbs"
            for r in roots
            if (Path(r) / "backends/xnnpack/serialization/schema.fbs").is_file()
        ),
        None,
    )
    if path is None:
        raise RuntimeError(
            "ExecuTorch's XNNPACK schema (backends/xnnpack/serialization/schema.fbs) is not "
            "installed: reinstall the project (make setup)"
        )
    text = re.sub(r"//[^\n]*", "", path.read_text())
    tables = {
        m.group(1): [f.split(":")[0].strip() for f in m.group(2).split(";") if ":" in f]
        for m in re.finditer(r"table\s+(\w+)\s*\{(.*?)\}", text, re.S)
    }
    union = re.search(r"union\s+XNodeUnion\s*\{(.*?)\}", text, re.S).group(1)
    out = {}
    for i, member in enumerate(m.strip() for m in union.split(",") if m.strip()):
        name, _, table = (s.strip() for s in member.partition(":"))
        fields = tables[table or name]
        out[i + 1] = (name, tuple((slot, f) for slot, f in enumerate(fields) if f.endswith("_id")))
    return out


def _copy_type() -> int:
    """XNNCopy's type byte, and a check that it reads a 2x1 node's first three id fields as its own."""
    by_name = {name: (kind, fields) for kind, (name, fields) in node_id_fields().items()}
    kind, fields = by_name["XNNCopy"]
    if (
        [f for _, f in fields] != ["input_id", "output_id"]
        or [f for _, f in by_name["XNNAdd"][1]] != ["input1_id", "input2_id", "output_id"]
        or by_name["XNNAdd"][1][2][0] != 2
    ):
        raise RuntimeError(
            "this ExecuTorch's XNNPACK schema lays out Add or Copy differently than lora-share "
            "expects: set lora_envelope.skip_absent to false"
        )
    return kind


@dataclass
class _Node:
    type: str
    type_pos: int  # absolute position of the XNode's union type byte
    fields: dict[str, tuple[int, int]]  # value-id field -> (absolute position, id)

    def inputs(self):
        return [(pos, v) for f, (pos, v) in self.fields.items() if not f.startswith("output")]

    def get(self, field: str) -> int | None:
        return self.fields[field][1] if field in self.fields else None


class _Payload:
    """An XNNPACK payload's nodes and external values, read in place."""

    def __init__(self, data, what: str, start: int, size: int):
        if size < 30 or bytes(data[start + 4 : start + 8]) != HEADER_MAGIC:
            raise BadFlatbuffer(what, f"XNNPACK payload at byte {start} has no {HEADER_MAGIC!r} header")
        _, fb_off, fb_size = struct.unpack_from("<HII", data, start + 8)
        if fb_off + fb_size > size:
            raise BadFlatbuffer(what, f"XNNPACK payload at byte {start}: its flatbuffer runs past its end")
        self.data = data
        graph = FlatBuffer(
            data, f"{what} (XNNPACK payload at byte {start})", start + fb_off, start + fb_off + fb_size
        ).root("XNNGraph")
        fields = node_id_fields()
        self.nodes = []
        for xnode in graph.tables(_G_NODES, "XNode"):
            kind = xnode.u8(_NODE_TYPE)
            if kind not in fields:
                raise BadFlatbuffer(
                    what, f"XNNPACK payload at byte {start}: node type {kind} is not in this ExecuTorch's schema"
                )
            name, id_fields = fields[kind]
            table = xnode.table(_NODE_UNION, name)
            ids = {}
            for slot, field in id_fields:
                pos = table._field(slot, 4) if table is not None else None
                if pos is not None:
                    ids[field] = (pos, struct.unpack_from("<I", data, pos)[0])
            self.nodes.append(_Node(name, xnode._field(_NODE_TYPE, 1), ids))
        self.external = {}  # external id (delegate argument index) -> value id
        for xvalue in graph.tables(_G_VALUES, "XValue"):
            value = xvalue.table(_VALUE_UNION, "XValue")
            if value is not None and xvalue.u8(_VALUE_TYPE) == _QUANTIZED_VALUE:
                value = value.table(0, "XNNTensorValue")
            if value is None:
                continue
            ext = value.u32(_TV_EXTERNAL_ID, _NO_EXTERNAL)
            if ext != _NO_EXTERNAL:
                self.external[ext] = value.u32(_TV_ID_OUT)
        self.n_inputs = len(graph.scalars(_G_INPUTS, "I"))
        self.outputs = set(graph.scalars(_G_OUTPUTS, "I"))
        self._readers: dict[int, list[_Node]] = {}  # value id -> the nodes reading it, each once
        for node in self.nodes:
            for value in dict.fromkeys(v for _, v in node.inputs()):
                self._readers.setdefault(value, []).append(node)

    def readers(self, value: int) -> list[_Node]:
        return self._readers.get(value, [])

    def _only_reader(self, value: int | None, kind: str) -> _Node | None:
        """The one node reading ``value``, when it is of type ``kind`` and ``value`` stays inside the
        payload; else None."""
        readers = self.readers(value) if value is not None else []
        if len(readers) != 1 or readers[0].type != kind or value in self.outputs:
            return None
        return readers[0]

    def skip_slot(self, a: int, b: int) -> list[tuple[int, int, int]]:
        """(position, old, new) rewrites that make the slot whose A and B are values ``a``, ``b``
        dead code, or [] when its nodes do not have a shape this module knows (module docstring):
        forward's and decode's products, or decode_batch's."""
        return self._skip_linear_slot(a, b) or self._skip_rows_slot(a, b)

    def _skip_linear_slot(self, a: int, b: int) -> list[tuple[int, int, int]]:
        """``h = FC(x, A)``, ``d = FC(h, B)``, ``out = Add(y, d)``."""
        a_fc = [n for n in self.readers(a) if n.type == "XNNFullyConnected" and n.get("filter_id") == a]
        if len(a_fc) != 1:
            return []
        h = a_fc[0].get("output_id")
        b_fc = self._only_reader(h, "XNNFullyConnected")
        if b_fc is None or b_fc.get("input1_id") != h or b_fc.get("filter_id") != b:
            return []
        copy = self._add_as_copy(b_fc.get("output_id"))
        return copy and [*copy, (b_fc.fields["input1_id"][0], h, b)]

    def _skip_rows_slot(self, a: int, b: int) -> list[tuple[int, int, int]]:
        """decode_batch's ``xt = Transpose(x)``, ``h = BMM(A, xt)``, ``d = BMM(B, h)``,
        ``dt = Transpose(d)``, ``out = Add(y, dt)``. Each node of the chain then reads ``A`` or ``B``
        (3-D float32 inputs, as the values they replace), so that every value of the chain loses its
        reader at once: XNNPACK removes nodes without consumers in a single pass. ``xt`` may be read
        by other nodes too: then its transpose stays."""
        bmm = "XNNBatchMatrixMultiply"
        a_bmm = [n for n in self.readers(a) if n.type == bmm and n.get("input1_id") == a]
        if len(a_bmm) != 1:
            return []
        h = a_bmm[0].get("output_id")
        b_bmm = self._only_reader(h, bmm)
        if b_bmm is None or b_bmm.get("input1_id") != b or b_bmm.get("input2_id") != h:
            return []
        d = b_bmm.get("output_id")
        transpose = self._only_reader(d, "XNNStaticTranspose")
        if transpose is None or transpose.get("input_id") != d:
            return []
        copy = self._add_as_copy(transpose.get("output_id"))
        if not copy:
            return []
        rewrites = [*copy, (transpose.fields["input_id"][0], d, b), (b_bmm.fields["input2_id"][0], h, b)]
        xt = a_bmm[0].get("input2_id")
        if xt is not None and xt != a:
            rewrites.append((a_bmm[0].fields["input2_id"][0], xt, a))
        return rewrites

    def _add_as_copy(self, d: int | None) -> list[tuple[int, int, int]]:
        """The rewrites that turn the Add of ``y`` and the slot's product ``d`` into a Copy of ``y``
        (module docstring), or [] when ``d`` has other readers or that Add is not as expected."""
        add = self._only_reader(d, "XNNAdd")
        if add is None:
            return []
        y = add.get("input1_id") if add.get("input2_id") == d else add.get("input2_id")
        out = add.get("output_id")
        if (
            y is None
            or y == d
            or out is None
            or add.type_pos is None
            or any(f not in add.fields for f in ("input1_id", "input2_id"))
        ):
            return []
        type_word = struct.unpack_from("<I", self.data, add.type_pos)[0]  # the type byte is its low byte
        return [
            (add.type_pos, type_word, (type_word & ~0xFF) | _copy_type()),
            (add.fields["input1_id"][0], add.get("input1_id"), y),  # Copy's input_id
            (add.fields["input2_id"][0], add.get("input2_id"), out),  # Copy's output_id
            (add.fields["output_id"][0], out, 0),  # Copy's flags
        ]


def _segments(pte: bytes, what: str) -> list[tuple[int, int]]:
    """(absolute start, size) of each of the program's segments (pte.py's reader and its checks)."""
    root = FlatBuffer(pte, what).root("Program")
    return [(s.start, s.size) for s in program_segments(root, read_header(pte, what), what)]


# The methods that take LoRA inputs (model/decoder.py): forward, and decode and decode_batch where the
# program has them.
LORA_METHODS = ("forward", "decode", "decode_batch")


def skip_patches(pte: bytes, what: str, slots: list[int], n_slots: int) -> list[Patch]:
    """The patches that make LoRA slots ``slots`` (envelope indices, of ``n_slots``) dead code in
    ``pte``'s XNNPACK payloads, in every method that takes LoRA inputs (``LORA_METHODS``)."""
    table = slot_patches(pte, what, n_slots, slots)
    return [p for s in sorted(slots) for p in table[s]]


def slot_patches(pte: bytes, what: str, n_slots: int, slots: list[int] | None = None) -> dict[int, list[Patch]]:
    """Each LoRA slot's patches (envelope index -> its rewrites in every method that takes LoRA
    inputs, ``LORA_METHODS``; [] for a slot whose nodes have no shape this module knows), for
    ``slots`` (default: all ``n_slots``). The LoRA inputs come last, A and B per slot
    (model/decoder.py). Slots' rewrites never overlap: applying any set of slots' gives the variant
    that skips those."""
    root = FlatBuffer(pte, what).root("Program")
    plans = {p.string(_PLAN_NAME): p for p in root.tables(_P_PLANS, "ExecutionPlan")}
    if "forward" not in plans:
        raise BadFlatbuffer(what, "no forward method")
    slots = list(range(n_slots)) if slots is None else list(slots)
    if any(not 0 <= s < n_slots for s in slots):
        raise BadFlatbuffer(what, f"LoRA slots {slots} are not all among the envelope's {n_slots}")
    segments = _segments(pte, what)
    table: dict[int, list[Patch]] = {s: [] for s in slots}
    taken: set[int] = set()  # one rewrite per id field, whichever method reaches it first
    for name in LORA_METHODS:
        if name in plans:
            for slot, patch in _plan_patches(pte, what, plans[name], name, slots, n_slots, segments, taken):
                table[slot].append(patch)
    return table


def _plan_patches(
    pte: bytes,
    what: str,
    plan,
    name: str,
    slots: list[int],
    n_slots: int,
    segments: list[tuple[int, int]],
    taken: set[int],
) -> list[tuple[int, Patch]]:
    """``slot_patches`` of one method (``plan``, called ``name``): (slot, patch) pairs."""
    inputs = plan.scalars(_PLAN_INPUTS, "i")
    delegates = plan.tables(_PLAN_DELEGATES, "BackendDelegate")
    first = len(inputs) - 2 * n_slots
    if first < 0:
        raise BadFlatbuffer(what, f"{name} has {len(inputs)} inputs, too few for {n_slots} LoRA slots")
    # A's value -> (slot, B's value), as the program's values
    wanted = {inputs[first + 2 * s]: (s, inputs[first + 2 * s + 1]) for s in slots}
    patches = []
    for chain in plan.tables(_PLAN_CHAINS, "Chain"):
        for instr in chain.tables(_CHAIN_INSTRUCTIONS, "Instruction"):
            if instr.u8(_INSTR_TYPE) != _DELEGATE_CALL:
                continue
            call = instr.table(_INSTR_ARGS, "DelegateCall")
            args = call.scalars(_DC_ARGS, "i")
            index = call.i32(_DC_INDEX)
            if not any(v in wanted for v in args) or not 0 <= index < len(delegates):
                continue
            delegate = delegates[index]
            ref = delegate.table(_DEL_PROCESSED, "BackendDelegateDataReference")
            if delegate.string(_DEL_ID) != XNNPACK_ID or ref is None or ref.u8(_REF_LOCATION) != _SEGMENT:
                continue
            segment = ref.u32(_REF_INDEX)
            if segment >= len(segments):
                raise BadFlatbuffer(
                    what, f"delegate {index} points at segment {segment}, but there are {len(segments)}"
                )
            start, size = segments[segment]
            payload = _Payload(pte, what, start, size)
            arg_of = {v: k for k, v in enumerate(args[: payload.n_inputs])}
            for a_value, (slot, b_value) in wanted.items():
                if a_value in arg_of and b_value in arg_of:
                    a = payload.external.get(arg_of[a_value])
                    b = payload.external.get(arg_of[b_value])
                    rewrites = payload.skip_slot(a, b) if a is not None and b is not None else []
                    if rewrites and not taken & {pos for pos, _, _ in rewrites}:
                        taken |= {pos for pos, _, _ in rewrites}
                        patches += [(slot, Patch(segment, pos - start, old, new)) for pos, old, new in rewrites]
    return patches


def apply(pte: bytes, what: str, patches: list[Patch], revert: bool = False) -> bytes:
    """``pte`` with ``patches`` applied (or, ``revert``, undone); each must find the value it expects."""
    segments = _segments(pte, what)
    out = bytearray(pte)
    for p in patches:
        expect, write = (p.new, p.old) if revert else (p.old, p.new)
        if p.segment >= len(segments) or p.offset + 4 > segments[p.segment][1]:
            raise BadFlatbuffer(what, f"a program patch points past segment {p.segment}: the file is damaged")
        pos = segments[p.segment][0] + p.offset
        if struct.unpack_from("<I", out, pos)[0] != expect:
            raise BadFlatbuffer(
                what,
                f"segment {p.segment} holds another value at +{p.offset} than its record's "
                "program patch expects: the file is damaged",
            )
        struct.pack_into("<I", out, pos, write)
    return bytes(out)
