"""``lora-share run``: an adapter .pte against a foundation .ptd (and, for adapters built with
shared tensors hoisted, adapters_shared.ptd) through ExecuTorch's Python runtime.

The program's external weights resolve against foundation.ptd; its LoRA inputs are the
adapter's tensors, read from the .pte's named data (or adapters_shared.ptd) by the keys its
record names, with a zero rank-1 pair for each envelope slot the adapter leaves alone."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np

from ..errors import UserError
from .generate import Generation, check_request, generate


def _require_file(path: Path, flag: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{flag} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{flag} {path}: not readable")
    return path


class _native_stderr:
    """Capture what the C++ runtime writes to fd 2 while loading (cpuinfo chatter on
    success; the reason on failure, which is then put into our one-line error)."""

    def __enter__(self):
        import tempfile

        self.file = tempfile.TemporaryFile(mode="w+b")
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)

    def lines(self) -> list[str]:
        self.file.seek(0)
        text = self.file.read().decode(errors="replace")
        return [ln.split("] ", 1)[-1].strip() for ln in text.splitlines() if ln.strip()]


def _explain(failure: Exception, native: list[str]) -> str:
    """The runtime's own reason, in words a user can act on."""
    import re

    for line in native:
        m = re.search(r"constant data for key (\w+)", line)
        if m:
            return (
                f"the .ptd has no data for key {m.group(1)[:16]}... that the .pte needs: "
                "was this adapter built against a different foundation?"
            )
    relevant = [ln for ln in native if ("Failed" in ln or "rror" in ln) and "midr" not in ln]
    return "; ".join(relevant) or str(failure)


class LoadedAdapter:
    """One adapter program loaded against a foundation data file (and a shared-tensors file).

    With ``lora=False`` it runs the foundation alone ("base"): every LoRA input a zero rank-1 pair.
    ``positions``: the most positions it will be fed (default: the program's context), which sizes
    its KV cache."""

    def __init__(
        self, pte: Path, ptd: Path, shared_ptd: Path | None = None, lora: bool = True, positions: int | None = None
    ):
        import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed kernels: int8 embeddings)
        import torch  # noqa: F401  (registers tensor types the runtime returns)
        from executorch.runtime import Runtime

        self.pte, self.ptd = _require_file(pte, "--pte"), _require_file(ptd, "--ptd")
        shared = _require_file(shared_ptd, "--shared-ptd") if shared_ptd else None
        t0 = time.perf_counter()
        with _native_stderr() as log:
            try:
                program = Runtime.get().load_program(str(self.pte), data_path=str(self.ptd))
                self.forward = program.load_method("forward")
                self.max_seq_len = int(program.load_method("get_max_seq_len").execute([])[0])
                self.vocab_size = int(program.load_method("get_vocab_size").execute([])[0])
                if "get_prefill_chunk" not in program.method_names:
                    raise UserError(
                        f"{self.pte}: built by an older lora-share (its forward takes input_pos, "
                        "not cache_positions): rebuild it with this version"
                    )
                self.prefill_chunk = int(program.load_method("get_prefill_chunk").execute([])[0])
                # The positions a ring holds: get_ring_size, or (exporter revision 13 and earlier) the window.
                ring_method = next(
                    (m for m in ("get_ring_size", "get_sliding_window") if m in program.method_names), None
                )
                self.ring = int(program.load_method(ring_method).execute([])[0]) if ring_method else 0
                meta = program.metadata("forward")
                failure = None
            except RuntimeError as e:
                failure = e
        if failure is not None:
            raise UserError(f"could not load {self.pte} with {self.ptd}: {_explain(failure, log.lines())}")
        record = _record(self.pte)
        # The cache first: a program of an earlier contract is refused for its inputs, with the fix.
        self.cache = _runtime_cache(
            meta, 2 * len(record.envelope) if record else 0, self.max_seq_len, self.ring, self.pte, positions
        )
        if record is not None and not lora:
            record = dataclasses.replace(record, lora=[])
        self.lora = lora_inputs(self.pte, record, shared, meta) if record else []
        self.load_s = time.perf_counter() - t0

    def step(self, tokens: list[int], pos: int) -> np.ndarray:
        from ..model.decoder import forward_inputs

        out = self.forward.execute(list(forward_inputs(tokens, pos, self.cache, self.lora)))
        self.cache.write(pos, out[1:])
        return out[0].reshape(-1).numpy().astype(np.float32)


# A KV cache's element types by ExecuTorch's ScalarType (Half 5, Float 6), as a method's tensor
# metadata reports them.
_ET_KV_DTYPES = {6: "float32", 5: "float16"}


def _record(pte: Path):
    """The adapter record of ``pte``, or None for a program lora-share did not write."""
    from ..formats import read_pte
    from ..formats.records import adapter_record

    return adapter_record(read_pte(pte))


def lora_inputs(pte: Path, record, shared_ptd: Path | None, meta) -> list:
    """forward's LoRA inputs for the adapter in ``pte`` (``record``: its adapter record): A, B per
    envelope slot, read from its named data (or ``shared_ptd``) by key; a zero rank-1 pair where it
    has no LoRA. ``meta`` is forward's method metadata: the envelope's inputs are its last ones."""
    import torch

    from ..formats import read_ptd, read_pte

    data = Path(pte).read_bytes()
    n, first = len(record.envelope), meta.num_inputs() - 2 * len(record.envelope)
    if first < 3:
        raise UserError(f"{pte}: its record names {n} LoRA slots, but forward takes {meta.num_inputs()} inputs")
    own, files = read_pte(data, str(pte)), [read_ptd(shared_ptd)] if shared_ptd else []

    def tensor(key: str, rows: int, cols: int, what: str):
        holder = own if key in own else next((f for f in files if key in f), None)
        if holder is None:
            hint = (
                "" if files else "; it reads tensors shared with other adapters: give the build's adapters_shared.ptd"
            )
            raise UserError(f"{pte}: no data for the {what} (key {key[:16]}...){hint}")
        raw = holder.data(key)
        if len(raw) != rows * cols * 4:
            raise UserError(
                f"{holder.what}: {key[:16]}... is {len(raw)} bytes, but {pte}'s {what} is "
                f"[{rows}, {cols}] float32: the file is damaged"
            )
        return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(rows, cols)

    shapes = []
    for i in range(n):
        a, b = meta.input_tensor_meta(first + 2 * i).sizes(), meta.input_tensor_meta(first + 2 * i + 1).sizes()
        shapes.append((b[0], a[1], a[0]))  # out, in, the program's largest rank
    out = []
    by_slot = {e.slot: e for e in record.lora}
    for i, (out_f, in_f, max_rank) in enumerate(shapes):
        e = by_slot.get(i)
        if e is None:
            out += [torch.zeros(1, in_f), torch.zeros(out_f, 1)]
            continue
        layer, target = record.envelope[i]
        if not 1 <= e.rank <= max_rank:
            raise UserError(f"{pte}: rank {e.rank} on {target} of layer {layer}, but its program takes 1..{max_rank}")
        out += [
            tensor(e.a, e.rank, in_f, f"LoRA A of {target} in layer {layer}"),
            tensor(e.b, out_f, e.rank, f"LoRA B of {target} in layer {layer}"),
        ]
    return out


def _runtime_cache(meta, n_lora: int, max_seq_len: int, ring: int, pte: Path, positions: int | None = None):
    """The KV cache forward reads in place (model/decoder.py): one slab per input between the position and
    the LoRA inputs; with a sliding window ``ring`` (W), the slab inputs of W + 1 rows are rings."""
    from ..model.decoder import KV_DTYPES, KVCache, capped_rows

    def is_slab(i: int) -> bool:
        info = meta.input_tensor_meta(i) if i < meta.num_inputs() else None
        return info is not None and info.dtype() in _ET_KV_DTYPES and len(info.sizes()) == 2

    slabs = meta.num_inputs() - 2 - n_lora
    if is_slab(1):
        raise UserError(
            f"{pte}: built by an older lora-share (its forward reads the position off the KV "
            "cache's length, not an input): rebuild it with this version"
        )
    if slabs < 1 or not is_slab(2):
        raise UserError(
            f"{pte}: built by an older lora-share (its forward takes cache positions, not the "
            "runtime's KV cache): rebuild it with this version"
        )
    first = meta.input_tensor_meta(2)
    rows = [
        ring + 1 if ring and meta.input_tensor_meta(2 + j).sizes()[0] == ring + 1 else max_seq_len for j in range(slabs)
    ]
    return KVCache(capped_rows(rows, ring, positions), first.sizes()[1], ring, KV_DTYPES[_ET_KV_DTYPES[first.dtype()]])


def run(
    pte,
    ptd,
    tokens,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    seed: int = 0,
    verify: bool = True,
    shared_ptd=None,
    stop_ids=(),
    on_token=None,
) -> Generation:
    """Generate ``max_new_tokens`` ids after ``tokens``; returns tokens, logits rows and timings.

    Generation stops early after a token in ``stop_ids``; ``on_token`` sees each token as it comes.

    The files are checked with the defensive readers first (and refused if damaged);
    ``verify`` also requires that the .pte was built for this .ptd (same foundation
    fingerprint, every key present in ``ptd`` or ``shared_ptd``).
    """
    from ..formats import FormatError
    from .verify import require_compatible

    _require_file(pte, "--pte"), _require_file(ptd, "--ptd")
    if shared_ptd is not None:
        _require_file(shared_ptd, "--shared-ptd")
    try:
        require_compatible(pte, ptd, verify, shared_ptd)
    except FormatError as e:
        raise UserError(f"could not load {pte} with {ptd}: {e}") from None
    adapter = LoadedAdapter(Path(pte), Path(ptd), Path(shared_ptd) if shared_ptd is not None else None)
    check_request(tokens, max_new_tokens, adapter.vocab_size, adapter.max_seq_len)
    gen = generate(adapter.step, tokens, max_new_tokens, temperature, seed, adapter.prefill_chunk, stop_ids, on_token)
    gen.timings["load_s"] = adapter.load_s
    return gen
