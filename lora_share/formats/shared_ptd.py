"""adapters_shared.ptd: LoRA tensors that several adapters have, stored once.

With ``dedup.shared_adapter_tensors: hoist`` a tensor whose bytes appear in two or more
adapters is written once to this ExecuTorch FlatTensor file, under the sha256 of its bytes
(the key every adapter's record names it by), instead of into each adapter's .pte. At run
time a LoRA key that is not in the adapter's own .pte is read from this file.
"""

from __future__ import annotations

import hashlib

from .meta import SHARED_KEY, SharedMeta, encode_shared

SHARED_PTD = "adapters_shared.ptd"
ALIGNMENT = 64  # a cache line, for the tensors the runtime reads in place


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
