"""Keep an export's peak memory near one copy of the foundation.

Lowering with ExecuTorch 1.5.1 (the version pinned in pyproject.toml) copies every foundation
weight more often than it needs to, which put a 1B-parameter build past 24 GB:

- ``to_edge_transform_and_lower`` deep-copies the exported program, state dict included, before
  its first passes; the original stays alive in the caller for the whole lowering;
- its backend step deep-copies every delegated partition before XNNPACK preprocesses it, those of
  all methods at once: a quantized foundation's int8 values and scales (plain tensors inside the
  lowering, unwrapped from torchao's weight subclass) once more per method, 3.6 GB of the 8da4w
  build's 14.1 GB peak at Llama-3.2-1B's shape with forward, decode and decode_batch;
- XNNPACK's serializer hands each weight's bytes to the named-data store as a ``bytes`` copy, and
  the store keeps it until the .ptd is written;
- XNNPACK's partitioner (and torch.fx's, which it extends) keeps, for every node, the set of all
  nodes downstream of it, and XNNPACK's also the set of all upstream: quadratic in the graph's
  size (1.2 GB of sets for SmolLM-135M's 30 layers, six times its 8-bit foundation).

``compact_dependencies`` keeps the same two relations as one bit per node pair instead.
``release_after_export`` hands what the lowering left behind back to the system before the build
goes on to write and check the adapters.
``sharing_weights`` undoes these copies for the tensors it is given, for the length of the lowering:
a deep copy of one of them, or of any tensor on its memory, is the tensor itself (the passes that
follow build new tensors, they do not write into constants), and a named-data entry whose bytes
equal one of them is stored as a view of that tensor's memory instead of a copy (``TensorBytes``:
the store takes ``bytes`` or its own file-backed buffers, which is what the view presents itself as).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import sys

import torch


def release_after_export() -> None:
    """Drop what the export left reachable, collect it and return freed heap pages to the system.

    Measured on the 8da4w build at SmolLM-135M's shape (30 layers, all-linear envelope, 8 adapters):
    the build's RSS stayed near 2.0 GB after the export while each adapter's quantization error was
    measured on top of it, for a peak of 2.57 GB. After the export, 88 fx graph modules and the
    quantized model's weights (at 6 layers: 8 tensors over 8 MiB, 621 MiB) were still reachable
    from module globals: torch.export's ``_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT`` (fake tensor id
    -> graph node, cleared only by the next export) and the XNNPACK partitioner configs' loggers
    (a ``WhyNoPartition`` per config module, each keeping the last node it was told about, and
    through it the whole lowered program). The graphs hold reference cycles too, and glibc keeps
    freed heap pages.
    """
    from torch.fx.experimental import proxy_tensor

    getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", {}).clear()
    try:
        from executorch.exir.backend.utils import WhyNoPartition
    except ImportError:
        WhyNoPartition = None
    if WhyNoPartition is not None:
        for name, module in list(sys.modules.items()):
            if name.startswith("executorch.") and module is not None:
                for value in list(vars(module).values()):
                    if isinstance(value, WhyNoPartition):
                        value.node = None
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _tensor_bytes_class():
    from executorch.exir._serialize._cord import FileBackedData

    class TensorBytes(FileBackedData):
        """A tensor's bytes for the named-data store, read from the tensor's memory when written:
        no copy is held (FileBackedData's interface, with the tensor in place of a file)."""

        def __init__(self, view: memoryview, sha256: bytes):
            self._view, self._size, self._sha256, self._finalizer = view, len(view), sha256, None

        def prefix(self, size: int) -> bytes:
            return bytes(self._view[:size])

        def to_bytes(self) -> bytes:
            return bytes(self._view)

        def write_to_file(self, outfile) -> None:
            outfile.write(self._view)

    return TensorBytes


@contextlib.contextmanager
def sharing_weights(tensors):
    """Within the block, ExecuTorch's lowering shares ``tensors`` (plain CPU tensors) instead of copying them."""
    from executorch.exir._serialize._named_data_store import NamedDataStore

    tensor_bytes = _tensor_bytes_class()
    tensors = list(tensors)
    # Any tensor on a given weight's memory (an 8da4w weight's int8 values, its scales) is shared by deepcopy.
    storages = {ptr for t in tensors for ptr in _storage_pointers(t)} - {0}
    # Only tensors that are their whole storage: XNNPACK's serializer reads a weight's storage, not its view.
    tensors = [
        t
        for t in tensors
        if type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.is_contiguous()
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.nbytes
    ]
    by_digest = {}
    for t in tensors:
        # reshape first: a 0-dim tensor (a scalar constant) has no last dimension to view as bytes.
        raw = t.detach().reshape(-1).view(torch.uint8).numpy() if t.numel() else None
        if raw is not None:
            digest = hashlib.sha256(raw)
            by_digest.setdefault(digest.hexdigest(), (memoryview(raw).toreadonly(), digest.digest()))
    tensor_deepcopy, parameter_deepcopy = torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__
    add_named_data = NamedDataStore.add_named_data

    def shared(original):
        def deepcopy(self, memo):
            if _plain_storage(self) in storages:
                memo[id(self)] = self
                return self
            return original(self, memo)

        return deepcopy

    def add_shared(self, key, data, *args, **kwargs):
        found = by_digest.get(key)
        if found is not None and isinstance(data, bytes) and len(data) == len(found[0]):
            data = tensor_bytes(*found)  # XNNPACK names a weight by the sha256 of its bytes: the same bytes
        return add_named_data(self, key, data, *args, **kwargs)

    torch.Tensor.__deepcopy__ = shared(tensor_deepcopy)
    torch.nn.Parameter.__deepcopy__ = shared(parameter_deepcopy)
    NamedDataStore.add_named_data = add_shared
    try:
        yield
    finally:
        torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__ = tensor_deepcopy, parameter_deepcopy
        NamedDataStore.add_named_data = add_named_data


def _plain_storage(t: torch.Tensor) -> int | None:
    """The address of a plain CPU tensor's storage (a fake or meta tensor, or a subclass, has none)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type != "cpu":
        return None
    return t.untyped_storage().data_ptr()


def _storage_pointers(t) -> list[int]:
    """The storages ``t`` holds: its own, or those of the tensors a traceable subclass wraps (an 8da4w
    weight, torchao's IntxUnpackedToInt8Tensor: int8 values, scales and zero points)."""
    if not isinstance(t, torch.Tensor):
        return []
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(type(t), "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return [ptr for name in names for ptr in _storage_pointers(getattr(t, name))]
    ptr = _plain_storage(t)
    return [] if ptr is None else [ptr]


class _NodeBits:
    """A set of graph nodes as the bits of an int (bit i: the graph's i-th node): what the
    partitioner's cycle check reads (iteration, membership, size) at one bit per node."""

    __slots__ = ("bits", "index", "nodes")

    def __init__(self, bits: int, index: dict, nodes: list):
        self.bits, self.index, self.nodes = bits, index, nodes

    def __iter__(self):
        import numpy as np

        if not self.bits:
            return iter(())
        raw = np.frombuffer(self.bits.to_bytes((self.bits.bit_length() + 7) // 8, "little"), dtype=np.uint8)
        return (self.nodes[i] for i in np.flatnonzero(np.unpackbits(raw, bitorder="little")))

    def __contains__(self, node) -> bool:
        i = self.index.get(node)
        return i is not None and bool(self.bits >> i & 1)

    def __len__(self) -> int:
        return self.bits.bit_count()


class _CompactDependencyViewer:
    """ExecuTorch's ``group_partitioner._DependencyViewer`` and torch.fx's ``partitioner._DependencyViewer``
    (the transitive closures of every node's users and inputs, built in the same order), with each
    closure held as bits."""

    def __init__(self, graph_module):
        nodes = list(graph_module.graph.nodes)
        index = {node: i for i, node in enumerate(nodes)}
        down, up = [0] * len(nodes), [0] * len(nodes)
        for i in range(len(nodes) - 1, -1, -1):
            for user in nodes[i].users:
                j = index[user]
                down[i] |= (1 << j) | down[j]
        for i, node in enumerate(nodes):
            for source in node.all_input_nodes:
                j = index[source]
                up[i] |= (1 << j) | up[j]
        self._down, self._up, self._index, self._nodes = down, up, index, nodes

    def _bits(self, closures: list[int], node) -> _NodeBits:
        i = self._index.get(node)
        return _NodeBits(0 if i is None else closures[i], self._index, self._nodes)

    def downstreams_of(self, node) -> _NodeBits:
        return self._bits(self._down, node)

    def upstreams_of(self, node) -> _NodeBits:
        return self._bits(self._up, node)


@contextlib.contextmanager
def compact_dependencies():
    """Within the block, XNNPACK's partitioner keeps its dependency closures as bits (same partitions)."""
    from executorch.exir.backend.canonical_partitioners import group_partitioner
    from torch.fx.passes.infra import partitioner

    modules = (group_partitioner, partitioner)
    originals = [m._DependencyViewer for m in modules]
    for m in modules:
        m._DependencyViewer = _CompactDependencyViewer
    try:
        yield
    finally:
        for m, original in zip(modules, originals):
            m._DependencyViewer = original
