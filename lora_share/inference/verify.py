"""Does an adapter .pte fit a foundation .ptd? ``lora-share verify`` and the check
``lora-share run`` makes before loading.

Both files are first read with the defensive readers (a malformed file is a
``FormatError``; a .pte that does not match its seal, formats/seal.py, is
``Damaged``). Then problems are collected:

- ``unsafe``: the .ptd holds a key the program reads in a form the runtime
  would misread (a tensor without a layout, a delegate constant shorter than
  the delegate reads). These are refused even with ``--no-verify``: the
  runtime does not check them itself.
- ``problems`` (which include the unsafe ones): the foundation fingerprint the
  adapter records must be the one the foundation records, every key the
  program needs from a .ptd must be there, and external tensors must have the
  dtype and shape the program expects.

The adapter's LoRA tensors are its program's inputs, named by its record
(formats/meta.py): every key must be in the .pte's own named data or in
adapters_shared.ptd, with the bytes its rank and its program's input sizes
imply (fewer would be read past: unsafe), and the record's envelope must be
the program's (its LoRA inputs, their number and largest sizes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UserError
from ..formats import Ptd, Pte, read_ptd, read_pte
from ..formats.meta import ADAPTER_KEY, FOUNDATION_KEY, SHARED_KEY, AdapterMeta, FoundationMeta
from ..formats.records import adapter_record, foundation_record, shared_record
from ..formats.seal import check_seal
from ..formats.shared_ptd import SHARED_PTD


class Incompatible(UserError):
    """An adapter .pte that was not built for this foundation .ptd."""


class DataFiles:
    """The .ptd files a program resolves its keys against, looked up as one (like ExecuTorch's
    MergedDataMap); ``holder(key)`` is the file that has it."""

    def __init__(self, files: list[Ptd]):
        self.files = files
        self.what = " + ".join(f.what for f in files)

    def __contains__(self, key: str) -> bool:
        return any(key in f for f in self.files)

    def holder(self, key: str) -> Ptd:
        return next(f for f in self.files if key in f)


@dataclass
class Pairing:
    """The result of checking one .pte against one .ptd; ``problems`` is empty for a compatible pair."""

    pte: Pte
    ptd: Ptd
    adapter: AdapterMeta | None
    foundation: FoundationMeta | None
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _layout_text(layout) -> str:
    return f"{layout.dtype}{list(layout.sizes)}"


def check_pair(pte_path, ptd_path, shared_path=None) -> Pairing:
    """Check ``pte_path`` against ``ptd_path`` (and ``shared_path``, an adapters_shared.ptd);
    raises FormatError if a file is malformed or damaged."""
    pte, ptd = read_pte(pte_path), read_ptd(ptd_path)
    check_seal(pte)
    shared = read_ptd(shared_path) if shared_path is not None else None
    data = DataFiles([ptd] + ([shared] if shared else []))
    pairing = Pairing(pte, ptd, adapter_record(pte), foundation_record(ptd))
    pairing.unsafe = _hazards(pte, data)
    pairing.problems += pairing.unsafe
    a, f = pairing.adapter, pairing.foundation
    if a is None:
        pairing.problems.append(
            f"{pte.what} has no lora-share adapter record ({ADAPTER_KEY}): "
            "it was not built by lora-share, or by an older version; rebuild it"
        )
    if f is None:
        pairing.problems.append(
            f"{ptd.what} has no lora-share foundation record ({FOUNDATION_KEY}): "
            "it was not built by lora-share, or by an older version; rebuild it"
        )
    if a is not None and f is not None and a.foundation_fingerprint != f.fingerprint:
        pairing.problems.append(
            f"{pte.what} was built for foundation {a.foundation_fingerprint}, but {ptd.what} is foundation "
            f"{f.fingerprint}: use the foundation.ptd built with this adapter, or rebuild the adapter"
        )
    if shared is not None:
        pairing.problems += _shared_problems(pairing.adapter, shared)
    pairing.missing = [k for k in pte.external_keys() if k not in data]
    if a is not None:
        lora_missing, lora_unsafe, lora_problems = _lora_problems(pte, a, shared)
        pairing.missing += lora_missing
        pairing.unsafe += lora_unsafe
        pairing.problems += lora_unsafe + lora_problems
    if pairing.missing:
        shown = ", ".join(k[:16] + ("..." if len(k) > 16 else "") for k in pairing.missing[:3])
        more = f" and {len(pairing.missing) - 3} more" if len(pairing.missing) > 3 else ""
        hint = (
            f"; it reads tensors shared with other adapters: give the build's {SHARED_PTD} (--shared-ptd)"
            if shared is None and a is not None and a.foundation_fingerprint == getattr(f, "fingerprint", None)
            else ""
        )
        pairing.problems.append(
            f"{data.what} lacks {len(pairing.missing)} key(s) that {pte.what} needs: {shown}{more}{hint}"
        )
    for t in _once_per_key(pte.external_tensors):
        if t.key in data and data.holder(t.key).entry(t.key).layout is not None:
            have = data.holder(t.key).entry(t.key).layout
            if (have.scalar_type, have.sizes) != (t.layout.scalar_type, t.layout.sizes):
                pairing.problems.append(
                    f"{ptd.what} holds {t.key} as {_layout_text(have)}, but {pte.what} expects {_layout_text(t.layout)}"
                )
    # A key several methods (forward, decode, decode_batch) read, or a delegate constant several
    # delegates read, is one problem, said once.
    pairing.problems, pairing.unsafe = list(dict.fromkeys(pairing.problems)), list(dict.fromkeys(pairing.unsafe))
    return pairing


def _once_per_key(tensors) -> list:
    """``tensors`` (external tensors of every method) with each key's first only."""
    first: dict = {}
    for t in tensors:
        first.setdefault(t.key, t)
    return list(first.values())


def _lora_problems(pte: Pte, a: AdapterMeta, shared: Ptd | None) -> tuple[list[str], list[str], list[str]]:
    """(LoRA keys found nowhere, unsafe problems, other problems) of an adapter's LoRA inputs."""
    if not a.program_sha256:
        return (
            [],
            [],
            [
                f"{pte.what} was built by an older lora-share (its LoRA weights are constants of its "
                "program, not inputs): rebuild it with this version"
            ],
        )
    inputs = pte.inputs.get("forward", [])
    n = len(a.envelope)
    lora_inputs = inputs[len(inputs) - 2 * n :] if 0 < 2 * n < len(inputs) else []
    if len(lora_inputs) != 2 * n or any(t is None or len(t.sizes) != 2 for t in lora_inputs):
        return (
            [],
            [
                f"{pte.what}: its record names {n} LoRA slots, which its program's {len(inputs)} inputs "
                "do not hold: the file is damaged"
            ],
            [],
        )
    missing, unsafe = [], []
    for e in a.lora:
        if e.slot >= n or not 1 <= e.rank <= a.envelope_max_rank:
            unsafe.append(
                f"{pte.what}: its record has rank {e.rank} on envelope slot {e.slot} (of {n}, ranks "
                f"1..{a.envelope_max_rank}): the file is damaged"
            )
            continue
        (_, in_f), (out_f, _) = lora_inputs[2 * e.slot].sizes, lora_inputs[2 * e.slot + 1].sizes
        for key, size in ((e.a, e.rank * in_f * 4), (e.b, out_f * e.rank * 4)):
            holder = pte if key in pte else (shared if shared is not None and key in shared else None)
            if holder is None:
                missing.append(key)
            elif holder.entry(key).size < size:
                unsafe.append(
                    f"{holder.what} holds {holder.entry(key).size} bytes for LoRA tensor {key[:16]}..., but "
                    f"{pte.what} reads {size}: the file is damaged"
                )
    return missing, unsafe, []


def _shared_problems(adapter: AdapterMeta | None, shared: Ptd) -> list[str]:
    record = shared_record(shared)
    if record is None:
        return [
            f"{shared.what} has no lora-share shared-tensors record ({SHARED_KEY}): it is not an "
            f"{SHARED_PTD} written by lora-share build"
        ]
    if adapter is not None and adapter.foundation_fingerprint != record.foundation_fingerprint:
        return [
            f"{shared.what} holds shared tensors of adapters for foundation {record.foundation_fingerprint}, "
            f"but {adapter.name}'s foundation is {adapter.foundation_fingerprint}: use the {SHARED_PTD} "
            "built with this adapter"
        ]
    return []


def _hazards(pte: Pte, data: DataFiles) -> list[str]:
    """What the runtime would read wrongly from these files without noticing."""
    out = []
    for t in _once_per_key(pte.external_tensors):
        if t.key in data and data.holder(t.key).entry(t.key).layout is None:
            out.append(
                f"{data.holder(t.key).what} holds {t.key} without a tensor layout, but {pte.what} reads it "
                "as a tensor: the file is damaged"
            )
    for d in pte.delegates:
        for c in d.constants:
            if c.key not in pte and c.key in data and data.holder(c.key).entry(c.key).size < c.size:
                holder = data.holder(c.key)
                out.append(
                    f"{holder.what} holds {holder.entry(c.key).size} bytes for {c.key}, but {pte.what} "
                    f"reads {c.size}: the file is damaged"
                )
    return out


def require_compatible(pte_path, ptd_path, verify: bool = True, shared_path=None) -> Pairing:
    """``check_pair``, raising ``Incompatible`` with the first problem if the files do not fit;
    with ``verify`` False only for the unsafe problems (a damaged file)."""
    pairing = check_pair(pte_path, ptd_path, shared_path)
    problems = pairing.problems if verify else pairing.unsafe
    if problems:
        extra = f" (and {len(problems) - 1} more problem(s); see lora-share verify)" if len(problems) > 1 else ""
        skip = "; --no-verify skips this check" if not pairing.unsafe else ""
        raise Incompatible(f"{problems[0]}{extra}{skip}")
    return pairing
