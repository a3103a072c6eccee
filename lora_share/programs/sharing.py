"""Which tensors several programs share: every parameter, buffer and constant hashed by its bytes.

A tensor's key is the sha256 hex of its contiguous bytes: the key XNNPACK itself gives a float32
weight in a .ptd, and the name lower.py gives a shared tensor, so one tensor is stored once in
foundation.ptd whatever it is called in each program.
"""

from __future__ import annotations

import hashlib

import torch
from torch.export.graph_signature import InputKind

STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements, contiguous, as bytes."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def content_key(t: torch.Tensor) -> str:
    """The sha256 hex of ``t``'s bytes."""
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def state_tensors(ep: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """The program's parameters, buffers and constant tensors its graph reads, by target (FQN);
    buffers the program mutates are state, not weights, and are left out."""
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    out = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind in STATE_KINDS and spec.target not in mutated:
            t = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
            if isinstance(t, torch.Tensor) and t.numel():
                out[spec.target] = t
    return out


def program_keys(ep: torch.export.ExportedProgram) -> dict[str, str]:
    """FQN -> content key of every tensor ``state_tensors`` returns."""
    return {fqn: content_key(t) for fqn, t in state_tensors(ep).items()}


def shared_keys(programs: dict[str, dict[str, str]]) -> set[str]:
    """The keys that occur in two or more programs (``programs``: name -> FQN -> key)."""
    holders: dict[str, set[str]] = {}
    for name, keys in programs.items():
        for key in keys.values():
            holders.setdefault(key, set()).add(name)
    return {k for k, names in holders.items() if len(names) > 1}
