"""``lora_share::attend``: one layer's attention over the caller's KV cache, as one operator.

A program's ``decode`` method (model/decoder.py: one token per call) computes each layer's attention by this
operator instead of XNNPACK's products: XNNPACK takes each head's past keys and values as a product's
weight and packs them again on every call, which at ~1,000 positions cost more of a SmolLM2-135M
decode step than its weights' products (docs/bench-peers.md). The C++ runtime's kernel
(cpp_runner/runtime/kernels/attend_kernel.cpp) reads the cache where it lies, converts each key row once for
every query row that reads it, and splits long pasts over the threads.

Schema (batch 1, every tensor of the KV cache's dtype, float32 or float16)::

    attend(Tensor q, Tensor k_new, Tensor v_new, Tensor bias, Tensor[] keys, Tensor[] values) -> Tensor

- ``q`` ``[n_kv, R, hd]``: the query rows that read each key/value head (rotated and scaled);
- ``k_new``, ``v_new`` ``[n_kv, T, hd]``: this call's keys and values;
- ``bias`` ``[1, R, S + T]``: 0 where a row may see a slot, -inf where not;
- ``keys[h]``, ``values[h]`` ``[S, hd]``: head h's slab views (the past);
- returns ``[n_kv, R, hd]``: each row's softmax over its S + T scores, times the values, computed in
  float32 and rounded to the cache's dtype once.

``rope_attend`` is what the decode method calls: one token's whole attention step around ``attend``,
so the XNNPACK graph keeps none of the small operators between the projections and the output
projection (two per RoPE multiply-add, the views and transposes that lay heads out as rows, and the
casts to and from a float16 cache: about 24 of a layer's 78 XNNPACK operators at SmolLM2-135M's
shape, each a dispatch and a thread hand-off per token)::

    rope_attend(Tensor q, Tensor k, Tensor v, Tensor cos_q, Tensor sin_q, Tensor cos_k, Tensor sin_k,
                Tensor bias, Tensor[] keys, Tensor[] values) -> (Tensor, Tensor, Tensor)

- ``q`` ``[1, 1, n_heads * hd]``, ``k``, ``v`` ``[1, 1, n_kv * hd]``: one token's projections, float32;
- ``cos_q``, ``sin_q`` (scaled by the attention scale), ``cos_k``, ``sin_k``: ``[1, 1, hd]``, float32;
- ``bias``, ``keys``, ``values``: as for ``attend``, of the cache's dtype;
- returns the attention output ``[1, 1, n_heads * hd]`` (float32) and this token's keys and values
  ``[n_kv, 1, hd]`` in the cache's dtype (what the method returns for the cache).

Each step rounds as the graph it replaces: ``x * cos + rotate_half(x) * sin`` in float32 (three
roundings, no fused multiply-add), then to the cache's dtype; ``attend``; the output back to float32.

The out variants (``attend.out``, ``rope_attend.out``) are what ExecuTorch runs. This module defines
them for PyTorch, with reference implementations that eager runs and torch.export traces.
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


_ROPE_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor cos_q, Tensor sin_q, Tensor cos_k, Tensor sin_k, Tensor bias, "
    "Tensor[] keys, Tensor[] values)"
)
_lib.define(f"rope_attend{_ROPE_SCHEMA} -> (Tensor, Tensor, Tensor)")
_lib.define(
    f"rope_attend.out{_ROPE_SCHEMA[:-1]}, *, Tensor(a!) out, Tensor(b!) k_out, Tensor(c!) v_out) "
    "-> (Tensor(a!), Tensor(b!), Tensor(c!))"
)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of rows ``x`` ``[heads, hd]``: ``x * cos + rotate_half(x) * sin`` (Hugging Face's halves)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[:, half:], x[:, :half]], dim=1) * sin


def _rope_shapes(q, cos_q, keys) -> tuple[int, int, int]:
    """(head size, key/value heads, query heads) of a ``rope_attend`` call."""
    hd, n_kv = cos_q.shape[-1], len(keys)
    return hd, n_kv, q.numel() // hd


def rope_attend_reference(q, k, v, cos_q, sin_q, cos_k, sin_k, bias, keys, values):
    """``rope_attend`` in PyTorch (module docstring): (output, keys, values) of one token."""
    hd, n_kv, n_heads = _rope_shapes(q, cos_q, keys)
    kv = bias.dtype
    q_rows = rotate(q.reshape(n_heads, hd), cos_q.reshape(1, hd), sin_q.reshape(1, hd)).to(kv)
    k_rows = rotate(k.reshape(n_kv, hd), cos_k.reshape(1, hd), sin_k.reshape(1, hd)).to(kv).view(n_kv, 1, hd)
    v_rows = v.reshape(n_kv, 1, hd).to(kv)
    out = attend_reference(q_rows.view(n_kv, n_heads // n_kv, hd), k_rows, v_rows, bias, keys, values)
    return out.to(torch.float32).reshape(1, 1, n_heads * hd), k_rows, v_rows


def _rope_attend_out(q, k, v, cos_q, sin_q, cos_k, sin_k, bias, keys, values, *, out, k_out, v_out):
    results = rope_attend_reference(q, k, v, cos_q, sin_q, cos_k, sin_k, bias, keys, values)
    for dst, src in zip((out, k_out, v_out), results):
        dst.resize_(src.shape).copy_(src)
    return out, k_out, v_out


def _rope_attend_meta(q, k, v, cos_q, sin_q, cos_k, sin_k, bias, keys, values):
    hd, n_kv, n_heads = _rope_shapes(q, cos_q, keys)
    rows = q.new_empty((n_kv, 1, hd), dtype=bias.dtype)
    return q.new_empty((1, 1, n_heads * hd)), rows, torch.empty_like(rows)


def _rope_attend_out_meta(q, k, v, cos_q, sin_q, cos_k, sin_k, bias, keys, values, *, out, k_out, v_out):
    return out, k_out, v_out


_lib.impl("rope_attend", rope_attend_reference, "CompositeExplicitAutograd")
_lib.impl("rope_attend.out", _rope_attend_out, "CompositeExplicitAutograd")
_lib.impl("rope_attend", _rope_attend_meta, "Meta")
_lib.impl("rope_attend.out", _rope_attend_out_meta, "Meta")


def rope_attend(q, k, v, rope_q, rope_k, bias, keys, values):
    """``lora_share::rope_attend`` (module docstring): one decoded token's attention, from its q, k, v
    projections to the output projection's input; ``rope_q``, ``rope_k`` are (cos, sin) pairs.
    Returns (output, keys, values)."""
    return torch.ops.lora_share.rope_attend(q, k, v, *rope_q, *rope_k, bias, list(keys), list(values))


# rope_write_attend_rows: the batch method's attention (docs/batching.md). B rows, each of T entries: one
# sequence's tokens at consecutive positions (its last token, and drafts after it to be verified), in its own KV
# slot of the slot pools. Every entry's keys and values are written into its slot before any entry attends, so an
# entry sees the ones before it in its row exactly as one-token decode sees them in the cache.
_ROWS_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor cos_q, Tensor sin_q, Tensor cos_k, Tensor sin_k, Tensor bias, "
    "Tensor slots, Tensor dst, Tensor[] keys, Tensor[] values)"
)
_lib.define(f"rope_write_attend_rows{_ROWS_SCHEMA} -> (Tensor, Tensor, Tensor)")
_lib.define(
    f"rope_write_attend_rows.out{_ROWS_SCHEMA[:-1]}, *, Tensor(a!) out, Tensor(b!) k_out, Tensor(c!) v_out) "
    "-> (Tensor(a!), Tensor(b!), Tensor(c!))"
)


def rope_write_attend_rows_reference(q, k, v, cos_q, sin_q, cos_k, sin_k, bias, slots, dst, keys, values):
    """``rope_write_attend_rows`` in PyTorch. Shapes: q ``[B, T, n_heads * hd]``, k, v ``[B, T, n_kv * hd]``,
    cos/sin ``[B, T, hd]`` (float32); bias ``[B, T, S + 1]`` (entry (b, t)'s mask, shared by its query heads)
    and pools ``keys[h]``, ``values[h]`` ``[N, S, hd]`` of the cache's dtype; slots ``[B]`` and dst ``[B, T]``
    int64. First every entry's keys and values (as ``rope_attend`` computes them) go into row ``dst[b, t]`` of
    slot ``slots[b]`` of every pool (none where dst is outside 1..S-1: the sink row, or past the slab); then
    each entry is ``rope_attend`` over its slot. The pools are written in place, as the C++ kernel writes the
    runtime's. Returns out ``[B, T, n_heads * hd]`` and the entries' keys and values ``[B * T, n_kv, hd]``."""
    hd, n_kv = cos_q.shape[-1], len(keys)
    b_rows, t_rows, rows = q.shape[0], q.shape[1], keys[0].shape[1]
    rep = q.shape[-1] // hd // n_kv
    kv = bias.dtype
    flat = [x.reshape(b_rows * t_rows, 1, 1, x.shape[-1]) for x in (q, k, v, cos_q, sin_q, cos_k, sin_k)]
    q1, k1, v1, cq, sq, ck, sk = flat
    new_k = torch.stack(
        [rotate(k1[e].reshape(n_kv, hd), ck[e].reshape(1, hd), sk[e].reshape(1, hd)) for e in range(len(k1))]
    )
    new_k, new_v = new_k.to(kv), v1.reshape(-1, n_kv, hd).to(kv)
    for e, (slot, row) in enumerate(zip(slots.repeat_interleave(t_rows).tolist(), dst.reshape(-1).tolist())):
        if 0 < row < rows:
            for h in range(n_kv):
                keys[h][slot, row] = new_k[e, h]
                values[h][slot, row] = new_v[e, h]
    outs = []
    for e, slot in enumerate(slots.repeat_interleave(t_rows).tolist()):
        row_bias = bias.reshape(-1, bias.shape[-1])[e].expand(rep, bias.shape[-1]).unsqueeze(0)
        out, _, _ = rope_attend_reference(
            q1[e],
            k1[e],
            v1[e],
            cq[e],
            sq[e],
            ck[e],
            sk[e],
            row_bias,
            [p[slot] for p in keys],
            [p[slot] for p in values],
        )
        outs.append(out)
    return torch.cat(outs).reshape(q.shape), new_k, new_v


def _rope_write_attend_rows_out(
    q, k, v, cos_q, sin_q, cos_k, sin_k, bias, slots, dst, keys, values, *, out, k_out, v_out
):
    results = rope_write_attend_rows_reference(q, k, v, cos_q, sin_q, cos_k, sin_k, bias, slots, dst, keys, values)
    for target, src in zip((out, k_out, v_out), results):
        target.resize_(src.shape).copy_(src)
    return out, k_out, v_out


def _rope_write_attend_rows_meta(q, k, v, cos_q, sin_q, cos_k, sin_k, bias, slots, dst, keys, values):
    hd, n_kv = cos_q.shape[-1], len(keys)
    rows = q.new_empty((q.shape[0] * q.shape[1], n_kv, hd), dtype=bias.dtype)
    return torch.empty_like(q), rows, torch.empty_like(rows)


def _rope_write_attend_rows_out_meta(
    q, k, v, cos_q, sin_q, cos_k, sin_k, bias, slots, dst, keys, values, *, out, k_out, v_out
):
    return out, k_out, v_out


_lib.impl("rope_write_attend_rows", rope_write_attend_rows_reference, "CompositeExplicitAutograd")
_lib.impl("rope_write_attend_rows.out", _rope_write_attend_rows_out, "CompositeExplicitAutograd")
_lib.impl("rope_write_attend_rows", _rope_write_attend_rows_meta, "Meta")
_lib.impl("rope_write_attend_rows.out", _rope_write_attend_rows_out_meta, "Meta")


def rope_write_attend_rows(q, k, v, rope_q, rope_k, bias, slots, dst, keys, values):
    """``lora_share::rope_write_attend_rows``: one decode step of B rows of T entries each
    (``rope_write_attend_rows_reference``); ``rope_q``, ``rope_k`` are (cos, sin) pairs. Returns (output,
    keys, values)."""
    return torch.ops.lora_share.rope_write_attend_rows(
        q, k, v, *rope_q, *rope_k, bias, slots, dst, list(keys), list(values)
    )
