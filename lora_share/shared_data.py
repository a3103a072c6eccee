"""adapters_shared.ptd: LoRA tensors that several adapters have, stored once.

With ``dedup.shared_adapter_tensors: hoist`` a tensor whose bytes appear in two
or more adapters is exported as external data (tag ``SHARED_TAG``) instead of
into each adapter's .pte. XNNPACK names it by the sha256 of its bytes, so every
adapter that has it refers to the same key, and the build writes one
ExecuTorch FlatTensor file with one entry per key (plus lora-share's record).
At run time the program resolves its keys against foundation.ptd and this file
together: the C++ runner merges the two maps (ExecuTorch's MergedDataMap); the
Python runtime takes one data file, so ``merged_ptd`` writes both into one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .errors import UserError
from .formats.meta import SHARED_KEY, SharedMeta, encode_shared

SHARED_TAG = "adapters_shared"
SHARED_PTD = f"{SHARED_TAG}.ptd"
ALIGNMENT = 64  # a cache line: at least what any XNNPACK kernel asks of its weights


def plan_hoisting(keys: dict[str, dict[str, str]], available: set[str] | None = None) -> dict[str, list[str]]:
    """Which slots of which adapter go to the shared file.

    ``keys`` maps adapter name -> {slot: sha256 of its bytes} (fastpath.tensor_keys).
    Without ``available``, a tensor is hoisted when two or more adapters have it.
    With ``available`` (the keys an existing shared file already holds, for
    ``lora-share add``), exactly the tensors already there are hoisted.
    """
    if available is None:
        holders: dict[str, set[str]] = {}
        for name, slots in keys.items():
            for digest in slots.values():
                holders.setdefault(digest, set()).add(name)
        available = {d for d, names in holders.items() if len(names) > 1}
    return {name: sorted(s for s, d in slots.items() if d in available) for name, slots in keys.items()}


def encode_shared_ptd(tensors: dict[str, bytes], fingerprint: str) -> bytes:
    """The bytes of adapters_shared.ptd for ``tensors`` (sha256 hex -> bytes), in key order."""
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    for key, data in tensors.items():
        if hashlib.sha256(data).hexdigest() != key:
            raise ValueError(f"shared tensor {key[:12]}: its bytes do not hash to its key")
    record = encode_shared(SharedMeta(fingerprint, len(tensors), sum(map(len, tensors.values()))))
    keys = sorted(tensors)
    buffers = [tensors[k] for k in keys] + [record]
    named = {k: DataEntry(i, ALIGNMENT, None) for i, k in enumerate(keys)}
    named[SHARED_KEY] = DataEntry(len(keys), 16, None)
    return bytes(FlatTensorSerializer().serialize(DataPayload(buffers=buffers, named_data=named)))


def merged_ptd(paths: list[Path]) -> Path:
    """One temporary .ptd with every entry of ``paths`` (for a runtime that takes one data file).

    The caller deletes it. Keys must be distinct across the files (lora-share's are): a key
    in two of them is refused, as ExecuTorch's MergedDataMap refuses it.
    """
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    serializer = FlatTensorSerializer()
    buffers, named = [], {}
    holder: dict[str, Path] = {}
    for path in paths:
        payload = serializer.deserialize(Cord(Path(path).read_bytes()))
        for key, entry in payload.named_data.items():
            if key in named:
                raise UserError(f"{path}: key {key} is also in {holder[key]}; pass the foundation.ptd and "
                                "adapters_shared.ptd of one build")
            holder[key] = Path(path)
            named[key] = DataEntry(len(buffers) + entry.buffer_index, ALIGNMENT, entry.tensor_layout)
        buffers += payload.buffers
    fd, name = tempfile.mkstemp(prefix="lora-share-", suffix=".ptd")
    with os.fdopen(fd, "wb") as f:
        f.write(bytes(serializer.serialize(DataPayload(buffers=buffers, named_data=named))))
    return Path(name)
