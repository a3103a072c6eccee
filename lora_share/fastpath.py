"""The fast path: a new adapter's .pte from an exported one with the same graph signature.

Adapters with the same ranks on the same (layer, target) slots lower to the same
program; only the LoRA tensors differ. They are constant tensors of the program,
stored in its constant segment and handed to the XNNPACK delegate as inputs
(export.py), so a template .pte becomes another adapter's .pte by:

1. writing the new tensor bytes over the template's, in every constant buffer
   whose bytes are the template slot's (same size: same shape and dtype);
2. writing the adapter's metadata record over the template's (records are padded
   to a fixed size, so it fits unless it grew past a padding step).

A slot hoisted into adapters_shared.ptd (shared_data.py) stays an XNNPACK weight,
named in the delegate payload by the sha256 of its bytes, with no data in the
.pte: only its key changes, in the delegate payloads (both keys are 64 hex
characters, so no offset moves). Which slots are hoisted is part of the
signature, so template and adapter agree on it. A LoRA tensor that XNNPACK
keeps as its own weight (one no linear reads) is the program's named data under
such a key: both its bytes and its key are substituted.

Slots whose tensors have equal bytes may share storage (Phi-3's fused LoRA does
this by design: one A under q_proj, k_proj and v_proj, adapters.py). Each
template tensor then becomes one new tensor, which is exact when the adapter
groups its slots as the template does (same bytes in the same slots);
otherwise the programs differ and it is refused.

``formats.read_pte`` (the defensive flatbuffers reader) gives the exact byte
ranges: each constant buffer, each named-data entry and its key, and every key
an XNNPACK payload names; afterwards no trace of a template key may remain.
Anything the substitution cannot express exactly is refused, and the caller
exports instead.
"""

from __future__ import annotations

import hashlib
import json

from .adapters import Adapter
from .export import EXPORTER_REVISION
from .formats import read_pte
from .model import lora_param_name


class NotSubstitutable(Exception):
    """The template cannot be turned into this adapter exactly; export it instead."""


def slot_name(layer: int, target: str, which: str) -> str:
    return f"layers.{layer}.{target}.lora_{which}"


def slot_param_name(slot: str) -> str:
    """The model parameter a slot name stands for (``model.lora_param_name``)."""
    _, layer, target, lora = slot.split(".")
    return lora_param_name(int(layer), target, lora.removeprefix("lora_"))


def slot_tensors(adapter: Adapter) -> dict[str, bytes]:
    """Slot name -> the raw bytes of its tensor."""
    out = {}
    for (layer, target), (a, b) in adapter.weights.items():
        out[slot_name(layer, target, "a")], out[slot_name(layer, target, "b")] = _raw(a), _raw(b)
    return out


def tensor_keys(adapter: Adapter) -> dict[str, str]:
    """Slot name -> sha256 of the tensor's bytes: the key XNNPACK stores it under."""
    out = {}
    for (layer, target), (a, b) in sorted(adapter.weights.items()):
        for which, t in (("a", a), ("b", b)):
            out[slot_name(layer, target, which)] = hashlib.sha256(_raw(t)).hexdigest()
    return out


def signature(adapter: Adapter, foundation_fingerprint: str, export_settings: dict,
              hoisted: list[str] | tuple = ()) -> str:
    """What the exported program depends on: ranks per slot, the foundation, the export
    settings, the exporter's revision and which slots live in adapters_shared.ptd."""
    ranks = sorted((layer, target, a.shape[0]) for (layer, target), (a, _) in adapter.weights.items())
    what = {"ranks": ranks, "foundation": foundation_fingerprint, "export": export_settings,
            "exporter": EXPORTER_REVISION}
    if hoisted:
        what["hoisted"] = sorted(hoisted)
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _raw(t) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


def substitute(template_pte: bytes, template_keys: dict[str, str], adapter: Adapter,
               blobs: dict[str, bytes] | None = None, hoisted: list[str] | tuple = ()) -> bytes:
    """The .pte of ``adapter`` made from a template exported with ``template_keys``.

    ``blobs`` are the adapter's own named data under fixed keys (its metadata
    record): each replaces the template's in place, so it must have the same size.
    ``hoisted`` slots are external in both (adapters_shared.ptd): only their keys change.
    """
    new_keys = tensor_keys(adapter)
    if sorted(new_keys) != sorted(template_keys):
        raise NotSubstitutable("different LoRA slots")
    # Slots with equal bytes share a key (stored once): each template key must become one new key,
    # and no two template keys the same one, i.e. the adapter groups its slots as the template does.
    groups: dict[str, list[str]] = {}  # template key -> its slots
    renames: dict[str, str] = {}  # template key -> new key
    for slot, old in sorted(template_keys.items()):
        groups.setdefault(old, []).append(slot)
        if renames.setdefault(old, new_keys[slot]) != new_keys[slot]:
            raise NotSubstitutable(f"{slot}: slots with equal bytes in the template differ in the adapter")
    if len(set(renames.values())) != len(renames):
        raise NotSubstitutable("slots with different bytes in the template have equal bytes in the adapter")
    tensors = slot_tensors(adapter)
    layout = read_pte(template_pte, "template .pte")
    out = bytearray(template_pte)
    spans: dict[str, list[tuple[int, int]]] = {}  # key -> every (position, length) its text occupies
    for e in layout.named_data:
        spans.setdefault(e.key, []).append(e.key_span)
    for d in layout.delegates:
        for c in d.constants:
            spans.setdefault(c.key, []).append(c.key_span)
    constant_starts: dict[str, set[tuple[int, int]]] = {}  # sha256 -> (start, length) of each buffer
    for c in layout.constants:
        data = bytes(out[c.start:c.end])
        constant_starts.setdefault(hashlib.sha256(data).hexdigest(), set()).add((c.start, len(data)))
    if any(k in layout for k in set(new_keys.values()) - set(template_keys.values())):
        raise NotSubstitutable("a new tensor's key is already in the template")
    external = set(hoisted)
    for old, slots in groups.items():
        slot, new = slots[0], renames[old].encode()
        if len({s in external for s in slots}) != 1:
            raise NotSubstitutable(f"{slot}: slots with equal bytes are not all in the same file")
        if slot in external:
            if old in layout or not spans.get(old):
                raise NotSubstitutable(f"template does not read {slot} from a data file")
        elif old not in layout:  # a constant of the program, handed to its delegate as an input
            starts = constant_starts.get(old, set())
            if not starts or any(length != len(tensors[slot]) for _, length in starts):
                raise NotSubstitutable(f"template has no data for {slot}")
            for start, length in starts:
                out[start:start + length] = tensors[slot]
            continue  # a constant has no key to rename
        else:
            entry, data = layout.entry(old), tensors[slot]
            if entry.size != len(data) or hashlib.sha256(out[entry.start:entry.end]).hexdigest() != old:
                raise NotSubstitutable(f"template data for {slot} is not where its key says")
            if len(spans[old]) < 2:
                raise NotSubstitutable(f"no delegate payload refers to {slot}")
            out[entry.start:entry.end] = data
        for position, length in spans[old]:
            if length != len(new):
                raise NotSubstitutable(f"key of {slot} is not a sha256 hex digest")
            out[position:position + length] = new
    for key, data in (blobs or {}).items():
        if key not in layout:
            raise NotSubstitutable(f"template has no named data {key!r}")
        entry = layout.entry(key)
        if entry.size != len(data):
            raise NotSubstitutable(f"{key!r} is {len(data)} bytes, the template's {entry.size}")
        out[entry.start:entry.end] = data
    leftover = [k for k in set(template_keys.values()) - set(new_keys.values()) if k.encode() in out]
    if leftover:
        raise NotSubstitutable(f"template key {leftover[0][:12]} is still referenced outside the known places")
    return bytes(out)
