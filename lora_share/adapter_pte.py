"""An adapter's .pte: the deployment's program plus the adapter's own LoRA tensors and record.

The program is exported once per foundation and LoRA envelope (export.py, envelope.py); it
holds no adapter's weights, because LoRA A and B are forward's inputs. An adapter's .pte is that
program with the adapter's tensors as the program's own named data (ExecuTorch's PteDataMap),
each under the sha256 of its bytes, and lora-share's adapter record (formats/meta.py), which
says which program the file carries and which key feeds which input. Writing one is
serialization with ExecuTorch's own .pte writer, a fraction of a second, never an export.

Stock ExecuTorch runs such a file alone: the program loads as usual, and the caller feeds the
LoRA inputs from the program's named data (the C++ runner's ``--stock``). lora-share's runtime
recognises the same program across adapter files by ``program_sha256`` and loads it once.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from .formats import read_pte
from .formats.meta import ADAPTER_KEY, AdapterMeta, LoraTensors, encode_adapter
from .formats.seal import seal_pte

TENSOR_ALIGNMENT = 64  # bytes: a cache line, for the LoRA tensors the runtime reads in place


def _serializer():
    """ExecuTorch's .pte serializer module, without importing ExecuTorch's compiler.

    ``executorch.exir``'s package ``__init__`` imports the whole compiler (capture, passes, the edge
    dialect's op tables): 5-6 s on this machine, for a serializer that needs none of it, and most of
    ``lora-share add``'s time. When the package is not imported yet, its submodules are imported
    under a bare package module, which is then dropped: a later ``import executorch.exir`` runs its
    ``__init__`` as usual and finds the same submodules.
    """
    import importlib
    import importlib.util
    import sys
    import types

    name = "executorch.exir._serialize._program"
    if "executorch.exir" in sys.modules:
        return importlib.import_module(name)
    spec = importlib.util.find_spec("executorch.exir")
    bare = types.ModuleType("executorch.exir")
    bare.__path__, bare.__spec__ = list(spec.submodule_search_locations), spec
    sys.modules["executorch.exir"] = bare
    try:
        return importlib.import_module(name)
    finally:
        if sys.modules.get("executorch.exir") is bare:
            del sys.modules["executorch.exir"]


class Program:
    """A deployment's exported program without any adapter's data, ready to be written with any."""

    def __init__(self, pte: bytes, what: str, adapter_keys: frozenset[str] = frozenset(), sha256: str | None = None):
        """``pte``: the exported program, or an adapter file whose own entries are ``adapter_keys``
        (its record and LoRA tensors), which are left out. Any other named data the program has
        (a stand-alone program's weights) stays with it. ``sha256``: the program's, when known
        (from an intact adapter file's record); otherwise it is computed by serializing the program."""
        self._file = _serializer().deserialize_pte_binary(pte)
        named = self._file.named_data
        self._own = [] if named is None else [
            (key, named.buffers[e.buffer_index], e) for key, e in named.pte_data.items() if key not in adapter_keys]
        self._file.named_data = self._named_data({}, None) if self._own else None
        self.sha256 = sha256 or hashlib.sha256(self._serialize(self._file)).hexdigest()
        self.what = what

    def _named_data(self, tensors: dict[str, bytes], record: bytes | None):
        """The program's own named data, then ``tensors`` and ``record`` (the record last: no tensor
        ends the file, so a kernel that reads a few bytes past the end of its input, as XNNPACK
        may, stays inside the mapping)."""
        serializer = _serializer()
        NamedDataStoreOutput, DataEntry = serializer.NamedDataStoreOutput, serializer.DataEntry

        buffers, entries = [], {}
        for key, data, entry in self._own:
            entries[key] = DataEntry(len(buffers), entry.alignment, entry.tensor_layout)
            buffers.append(data)
        for key, data in tensors.items():
            entries[key] = DataEntry(len(buffers), TENSOR_ALIGNMENT, None)
            buffers.append(data)
        if record is not None:
            entries[ADAPTER_KEY] = DataEntry(len(buffers), 16, None)
            buffers.append(record)
        return NamedDataStoreOutput(buffers=buffers, pte_data=entries, external_data={})

    @staticmethod
    def _serialize(pte_file) -> bytes:
        return bytes(_serializer().serialize_pte_binary(pte_file, extract_delegate_segments=True))

    @classmethod
    def from_adapter_file(cls, path: Path) -> "Program":
        """The program an adapter .pte of this format carries. The file must match its seal (a CRC-32
        over every byte but the record's, formats/seal.py): then its program is the one that was
        written with the record's program_sha256, which is taken without serializing it again."""
        from .formats import read_pte
        from .formats.seal import check_seal
        from .verify import adapter_record

        data = Path(path).read_bytes()
        parsed = read_pte(data, str(path), plans=False)
        meta = adapter_record(parsed)
        if meta is None:
            raise ValueError(f"{path}: no lora-share adapter record ({ADAPTER_KEY})")
        check_seal(parsed)
        if not meta.content_bytes:
            raise ValueError(f"{path}: not sealed, so its program cannot be taken for the one its record names")
        keys = frozenset({ADAPTER_KEY, *(k for e in meta.lora for k in (e.a, e.b))})
        return cls(data, str(path), keys, meta.program_sha256)

    def write(self, meta: AdapterMeta, tensors: dict[str, bytes]) -> bytes:
        """The sealed .pte of the adapter ``meta`` describes, with ``tensors`` (key -> bytes) as its
        named data (the keys its record names that are not in adapters_shared.ptd)."""
        record = encode_adapter(dataclasses.replace(meta, program_sha256=self.sha256))
        out = self._serialize(_serializer().PTEFile(program=self._file.program, mutable_data=self._file.mutable_data,
                                      named_data=self._named_data(tensors, record)))
        return seal_pte(out)


def read_record(data: bytes, what: str) -> AdapterMeta:
    """The adapter record of a .pte's bytes (a FormatError if it has none or it is damaged)."""
    from .formats.errors import BadFlatbuffer
    from .verify import adapter_record

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
            raw = t.detach().contiguous().numpy().tobytes()
            keys.append(tensor_key(raw))
            tensors.setdefault(keys[-1], raw)
        entries.append(LoraTensors(index[slot], int(a.shape[0]), keys[0], keys[1]))
    return entries, tensors
