"""``lora_share::attend``: one layer's attention over the caller's KV cache, as one operator.

A program's ``decode`` method (model.py: one token per call) computes each layer's attention by this
operator instead of XNNPACK's products: XNNPACK takes each head's past keys and values as a product's
weight and packs them again on every call, which at ~1,000 positions cost more of a SmolLM2-135M
decode step than its weights' products (README, "Against llama.cpp"). The C++ runtime's kernel
(cpp_runner/runtime/attend_kernel.cpp) reads the cache where it lies, converts each key row once for
every query row that reads it, and splits long pasts over the threads.

Schema (batch 1, every tensor of the KV cache's dtype, float32 or float16)::

    attend(Tensor q, Tensor k_new, Tensor v_new, Tensor bias, Tensor[] keys, Tensor[] values) -> Tensor

- ``q`` ``[n_kv, R, hd]``: the query rows that read each key/value head (rotated and scaled);
- ``k_new``, ``v_new`` ``[n_kv, T, hd]``: this call's keys and values;
- ``bias`` ``[1, R, S + T]``: 0 where a row may see a slot, -inf where not;
- ``keys[h]``, ``values[h]`` ``[S, hd]``: head h's slab views (the past);
- returns ``[n_kv, R, hd]``: each row's softmax over its S + T scores, times the values, computed in
  float32 and rounded to the cache's dtype once.

The out variant ``attend.out`` is what ExecuTorch runs. This module defines both for PyTorch, with a
reference implementation that eager runs and torch.export traces.
"""

from __future__ import annotations

import torch

_SCHEMA = "(Tensor q, Tensor k_new, Tensor v_new, Tensor bias, Tensor[] keys, Tensor[] values)"

_lib = torch.library.Library("lora_share", "DEF")
_lib.define(f"attend{_SCHEMA} -> Tensor")
_lib.define(f"attend.out{_SCHEMA[:-1]}, *, Tensor(a!) out) -> Tensor(a!)")


def attend_reference(q, k_new, v_new, bias, keys, values) -> torch.Tensor:
    """The operator's definition in PyTorch, in float32 whatever the cache's dtype."""
    f32 = torch.float32
    past_k = torch.stack([k.to(f32) for k in keys])  # [n_kv, S, hd]
    past_v = torch.stack([v.to(f32) for v in values])
    k = torch.cat([past_k, k_new.to(f32)], dim=1)
    v = torch.cat([past_v, v_new.to(f32)], dim=1)
    probs = torch.softmax(torch.bmm(q.to(f32), k.transpose(1, 2)) + bias.to(f32), dim=-1)
    return torch.bmm(probs, v).to(q.dtype)


def _attend_out(q, k_new, v_new, bias, keys, values, *, out):
    out.resize_(q.shape).copy_(attend_reference(q, k_new, v_new, bias, keys, values))
    return out


def _attend_meta(q, k_new, v_new, bias, keys, values):
    return torch.empty_like(q)


def _attend_out_meta(q, k_new, v_new, bias, keys, values, *, out):
    return out


_lib.impl("attend", attend_reference, "CompositeExplicitAutograd")
_lib.impl("attend.out", _attend_out, "CompositeExplicitAutograd")
_lib.impl("attend", _attend_meta, "Meta")
_lib.impl("attend.out", _attend_out_meta, "Meta")


def attend(q, k_new, v_new, bias, keys, values) -> torch.Tensor:
    """``lora_share::attend`` (module docstring): what a program's decode method calls per layer."""
    return torch.ops.lora_share.attend(q, k_new, v_new, bias, list(keys), list(values))
