"""An adapter's .pte: the deployment's program plus the adapter's own LoRA tensors and record.

The program is exported once per foundation and LoRA envelope (export/program.py, model/envelope.py); it
holds no adapter's weights, because LoRA A and B are forward's inputs. An adapter's .pte is that
program with the adapter's tensors as the program's own named data (ExecuTorch's PteDataMap),
each under the sha256 of its bytes, and lora-share's adapter record (formats/meta.py), which
says which program the file carries and which key feeds which input. Writing one copies the
program's bytes and writes the named data (formats/pte_write.py), a fraction of a second, never
an export.

Stock ExecuTorch runs such a file alone: the program loads as usual, and the caller feeds the
LoRA inputs from the program's named data (the C++ runner's ``--stock``). lora-share's runtime
recognises the same program across adapter files by ``program_sha256`` and loads it once.

Every record also carries the program's table of rewrites that make each envelope slot's LoRA dead
code (formats/xnnpack_prune.py, ``slot_patches``): lora-share's runtime applies those of the slots a
call leaves alone to a copy of the program's XNNPACK payloads, so that a slot no adapter of the call
uses costs nothing, while every adapter still carries (and shares) the one program.

With ``lora_envelope.skip_absent`` an adapter's file carries that variant itself, for the slots it
leaves alone, and no table; its record names the variant by ``program_sha256`` and keeps the
rewrites, so the envelope program can be taken back from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from ..formats import read_pte
from ..formats.meta import ADAPTER_KEY, AdapterMeta, LoraTensors, encode_adapter
from ..formats.pte_write import Entry, Template
from ..formats.seal import seal_pte
from ..formats.xnnpack_prune import Patch, skip_patches, slot_patches
from ..formats.xnnpack_prune import apply as apply_patches

TENSOR_ALIGNMENT = 64  # bytes: a cache line, for the LoRA tensors the runtime reads in place
RECORD_ALIGNMENT = 16


class Program:
    """A deployment's exported program without any adapter's data, ready to be written with any.

    Writing an adapter's file rewrites only the program's named data (formats/pte_write.py): no
    ExecuTorch import, no deserialization; the program's bytes are copied as they are.
    """

    def __init__(self, pte: bytes, what: str, adapter_keys: frozenset[str] = frozenset(), sha256: str | None = None):
        """``pte``: the exported program, or an adapter file whose own entries are ``adapter_keys``
        (its record and LoRA tensors), which are left out. Any other named data the program has
        (a stand-alone program's weights) stays with it. ``sha256``: the program's, when known
        (from an intact adapter file's record); otherwise the sha256 of the .pte ``write`` lays out
        with no adapter data: the program's bytes, its own named data and nothing else, the same
        bytes whether ``pte`` is the exported program or any adapter file written from it."""
        self._template = Template(pte, what, adapter_keys)
        self.sha256 = sha256 or hashlib.sha256(self._template.write([])).hexdigest()
        self.what = what
        self.patches: tuple[Patch, ...] = ()  # set on a variant: its rewrites of the envelope program
        self._variants: dict[tuple[int, ...], Program] = {}
        self._slot_table: dict[int, list[int]] = {}  # envelope size -> slot_table()'s record values

    def slot_table(self, n_slots: int) -> list[int]:
        """The record's ``slot_patches`` for this program with ``n_slots`` envelope slots: every slot's
        rewrites (formats/xnnpack_prune.py), 5 uint32 each (slot, segment, offset, old, new)."""
        if n_slots not in self._slot_table:
            table = slot_patches(self._template.write([]), self.what, n_slots)
            self._slot_table[n_slots] = [
                v for slot in sorted(table) for p in table[slot] for v in (slot, p.segment, p.offset, p.old, p.new)
            ]
        return self._slot_table[n_slots]

    def skipping(self, absent: tuple[int, ...], n_slots: int) -> Program:
        """This program with the LoRA of envelope slots ``absent`` (of ``n_slots``) as dead code in its
        XNNPACK payloads (formats/xnnpack_prune.py); itself when there is nothing to skip. Kept per
        set of slots, so adapters with the same slots carry the same variant."""
        if absent not in self._variants:
            bare = self._template.write([])
            patches = tuple(skip_patches(bare, self.what, list(absent), n_slots)) if absent else ()
            if not patches:
                self._variants[absent] = self
            else:
                variant = Program(apply_patches(bare, self.what, list(patches)), self.what)
                variant.patches = patches
                self._variants[absent] = variant
        return self._variants[absent]

    @classmethod
    def from_adapter_file(cls, path: Path) -> Program:
        """The envelope program an adapter .pte of this format was written from. The file must match
        its seal (a CRC-32 over every byte but the record's, formats/seal.py): then its program is the
        one that was written with the record's program_sha256, which is taken without serializing it
        again; from a variant that skips absent slots, the record's rewrites are undone first and
        the program is the one its envelope_program_sha256 names."""
        from ..formats import read_pte
        from ..formats.records import adapter_record
        from ..formats.seal import check_seal

        data = Path(path).read_bytes()
        parsed = read_pte(data, str(path), plans=False)
        meta = adapter_record(parsed)
        if meta is None:
            raise ValueError(f"{path}: no lora-share adapter record ({ADAPTER_KEY})")
        check_seal(parsed)
        if not meta.content_bytes:
            raise ValueError(f"{path}: not sealed, so its program cannot be taken for the one its record names")
        keys = frozenset({ADAPTER_KEY, *(k for e in meta.lora for k in (e.a, e.b))})
        if meta.program_patches:  # a variant: the envelope program is these rewrites undone
            patches = meta.program_patches
            undo = [Patch(*patches[i : i + 4]) for i in range(0, len(patches), 4)]
            return cls(apply_patches(data, str(path), undo, revert=True), str(path), keys, meta.envelope_program_sha256)
        return cls(data, str(path), keys, meta.program_sha256)

    def write(
        self, meta: AdapterMeta, tensors: dict[str, bytes], skip_absent: bool = False, slot_table: bool = True
    ) -> bytes:
        """The sealed .pte of the adapter ``meta`` describes, with ``tensors`` (key -> bytes) as its
        named data (the keys its record names that are not in adapters_shared.ptd), then its record
        (last: no tensor ends the file, so a kernel that reads a few bytes past the end of its input,
        as XNNPACK may, stays inside the mapping). ``skip_absent``: the program it carries skips the
        envelope slots the adapter leaves alone (``skipping``). ``slot_table=False`` leaves the table
        of every slot's rewrites out (``slot_table``): the runtime then runs every slot, a benchmark's
        reference."""
        program = self
        if skip_absent:
            have = {e.slot for e in meta.lora}
            program = self.skipping(tuple(s for s in range(len(meta.envelope)) if s not in have), len(meta.envelope))
        variant = (
            {"slot_patches": self.slot_table(len(meta.envelope)) if slot_table else []}
            if program is self
            else {
                "envelope_program_sha256": self.sha256,
                "program_patches": [v for p in program.patches for v in (p.segment, p.offset, p.old, p.new)],
            }
        )
        record = encode_adapter(dataclasses.replace(meta, program_sha256=program.sha256, **variant))
        entries = [Entry(key, data, TENSOR_ALIGNMENT) for key, data in tensors.items()]
        return seal_pte(program._template.write([*entries, Entry(ADAPTER_KEY, record, RECORD_ALIGNMENT)]))


def read_record(data: bytes, what: str) -> AdapterMeta:
    """The adapter record of a .pte's bytes (a FormatError if it has none or it is damaged)."""
    from ..formats.errors import BadFlatbuffer
    from ..formats.records import adapter_record

    meta = adapter_record(read_pte(data, what, plans=False))
    if meta is None:
        raise BadFlatbuffer(what, f"no lora-share adapter record ({ADAPTER_KEY})")
    return meta


def tensor_key(data: bytes) -> str:
    """The key a LoRA tensor is stored under: the sha256 (hex) of its bytes."""
    return hashlib.sha256(data).hexdigest()


def lora_entries(adapter, envelope) -> tuple[list[LoraTensors], dict[str, bytes]]:
    """The record's slot entries for ``adapter`` in ``envelope`` and its tensors by key (equal
    tensors, such as Phi-3's A shared by q, k and v, are one key)."""
    index = {slot: i for i, slot in enumerate(envelope.slots)}
    entries, tensors = [], {}
    for slot, (a, b) in sorted(adapter.weights.items(), key=lambda kv: index[kv[0]]):
        keys = []
        for t in (a, b):
            raw = t.tobytes()  # a float32 numpy array (checkpoints/adapters.py), in C order
            keys.append(tensor_key(raw))
            tensors.setdefault(keys[-1], raw)
        entries.append(LoraTensors(index[slot], int(a.shape[0]), keys[0], keys[1]))
    return entries, tensors
