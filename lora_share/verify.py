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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .errors import UserError
from .formats import Ptd, Pte, read_ptd, read_pte
from .formats.meta import ADAPTER_KEY, FOUNDATION_KEY, AdapterMeta, FoundationMeta, decode
from .formats.seal import check_seal


class Incompatible(UserError):
    """An adapter .pte that was not built for this foundation .ptd."""


def adapter_record(pte: Pte) -> Optional[AdapterMeta]:
    """The adapter record stored in ``pte``, or None if it has none."""
    return decode(pte.data(ADAPTER_KEY), f"{pte.what}: {ADAPTER_KEY}").adapter if ADAPTER_KEY in pte else None


def foundation_record(ptd: Ptd) -> Optional[FoundationMeta]:
    """The foundation record stored in ``ptd``, or None if it has none."""
    return decode(ptd.data(FOUNDATION_KEY), f"{ptd.what}: {FOUNDATION_KEY}").foundation if FOUNDATION_KEY in ptd else None


@dataclass
class Pairing:
    """The result of checking one .pte against one .ptd; ``problems`` is empty for a compatible pair."""

    pte: Pte
    ptd: Ptd
    adapter: Optional[AdapterMeta]
    foundation: Optional[FoundationMeta]
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _layout_text(layout) -> str:
    return f"{layout.dtype}{list(layout.sizes)}"


def check_pair(pte_path, ptd_path) -> Pairing:
    """Check ``pte_path`` against ``ptd_path``; raises FormatError if either file is malformed or damaged."""
    pte, ptd = read_pte(pte_path), read_ptd(ptd_path)
    check_seal(pte)
    pairing = Pairing(pte, ptd, adapter_record(pte), foundation_record(ptd))
    pairing.unsafe = _hazards(pte, ptd)
    pairing.problems += pairing.unsafe
    a, f = pairing.adapter, pairing.foundation
    if a is None:
        pairing.problems.append(f"{pte.what} has no lora-share adapter record ({ADAPTER_KEY}): "
                                "it was not built by lora-share, or by an older version; rebuild it")
    if f is None:
        pairing.problems.append(f"{ptd.what} has no lora-share foundation record ({FOUNDATION_KEY}): "
                                "it was not built by lora-share, or by an older version; rebuild it")
    if a is not None and f is not None and a.foundation_fingerprint != f.fingerprint:
        pairing.problems.append(
            f"{pte.what} was built for foundation {a.foundation_fingerprint}, but {ptd.what} is foundation "
            f"{f.fingerprint}: use the foundation.ptd built with this adapter, or rebuild the adapter")
    pairing.missing = [k for k in pte.external_keys() if k not in ptd]
    if pairing.missing:
        shown = ", ".join(k[:16] + ("..." if len(k) > 16 else "") for k in pairing.missing[:3])
        more = f" and {len(pairing.missing) - 3} more" if len(pairing.missing) > 3 else ""
        pairing.problems.append(f"{ptd.what} lacks {len(pairing.missing)} key(s) that {pte.what} needs: {shown}{more}")
    for t in pte.external_tensors:
        if t.key in ptd and ptd.entry(t.key).layout is not None:
            have = ptd.entry(t.key).layout
            if (have.scalar_type, have.sizes) != (t.layout.scalar_type, t.layout.sizes):
                pairing.problems.append(f"{ptd.what} holds {t.key} as {_layout_text(have)}, but {pte.what} "
                                        f"expects {_layout_text(t.layout)}")
    return pairing


def _hazards(pte: Pte, ptd: Ptd) -> list[str]:
    """What the runtime would read wrongly from this pair without noticing."""
    out = []
    for t in pte.external_tensors:
        if t.key in ptd and ptd.entry(t.key).layout is None:
            out.append(f"{ptd.what} holds {t.key} without a tensor layout, but {pte.what} reads it as a tensor: "
                       "the file is damaged")
    for d in pte.delegates:
        for c in d.constants:
            if c.key not in pte and c.key in ptd and ptd.entry(c.key).size < c.size:
                out.append(f"{ptd.what} holds {ptd.entry(c.key).size} bytes for {c.key}, but {pte.what} reads "
                           f"{c.size}: the file is damaged")
    return out


def require_compatible(pte_path, ptd_path, verify: bool = True) -> Pairing:
    """``check_pair``, raising ``Incompatible`` with the first problem if the pair does not fit;
    with ``verify`` False only for the unsafe problems (a damaged file)."""
    pairing = check_pair(pte_path, ptd_path)
    problems = pairing.problems if verify else pairing.unsafe
    if problems:
        extra = f" (and {len(problems) - 1} more problem(s); see lora-share verify)" if len(problems) > 1 else ""
        skip = "; --no-verify skips this check" if not pairing.unsafe else ""
        raise Incompatible(f"{problems[0]}{extra}{skip}")
    return pairing

