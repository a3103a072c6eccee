"""The build's byte report: what is stored once, what is shared, what a copy was avoided for.

Read back from the written files (not from what the exporter was asked to do):

- inside each file, named data that points at one segment is stored once (ExecuTorch's
  named-data store merges equal bytes: a tied embedding is one segment under its plain name and
  under XNNPACK's sha256 key; an adapter's LoRA tensors are keyed by the sha256 of their bytes,
  so Phi-3's A shared by q, k and v is one entry);
- across adapters, a LoRA tensor with the same bytes in several .pte files is reported with the
  adapters that carry it, and the bytes a shared file would save;
- with adapters_shared.ptd (dedup.shared_adapter_tensors: hoist), each tensor in it is reported
  with the adapters whose records name it, and the copies that saved.
"""

from __future__ import annotations

from pathlib import Path

from ..formats import read_ptd, read_pte
from ..formats.meta import ADAPTER_KEY, decode
from ..inference.inspection import dedup_summary
from ..manifest import across_adapters, adapter_bytes, byte_report_section, file_bytes, shared_bytes


def _figures(file: str, size: int, entries) -> dict:
    """A file's bytes as ``manifest.file_bytes`` takes them; ``entries`` are its named data's
    (key, segment index, size)."""
    summary = dedup_summary(entries)
    return {
        "file": file,
        "total": size,
        "stored": summary["stored_bytes"],
        "shared": summary["shared_bytes"],
        "duplicate_avoided": summary["duplicate_avoided_bytes"],
    }


def _lora_keys(pte) -> set[str]:
    """Every LoRA tensor key an adapter's record names (stored in its .pte or not)."""
    meta = decode(pte.data(ADAPTER_KEY), f"{pte.what}: {ADAPTER_KEY}").adapter
    return {k for e in meta.lora for k in (e.a, e.b)}


def _hoisted(file: str, shared, ptes: dict) -> dict:
    """What adapters_shared.ptd holds and which adapters read each of its tensors from it."""
    readers: dict[str, list[str]] = {}
    for name, pte in ptes.items():
        for key in sorted(k for k in _lora_keys(pte) if k not in pte):
            if key in shared:
                readers.setdefault(key, []).append(name)
    figures = _figures(file, shared.size, [(e.key, e.segment_index, e.size) for e in shared.entries])
    figures["duplicate_avoided"] = sum(shared.entry(k).size * (len(n) - 1) for k, n in readers.items())
    return shared_bytes(
        **figures,
        tensors=len(readers),
        tensor_bytes=sum(shared.entry(k).size for k in readers),
        readers={k: n for k, n in sorted(readers.items())},
    )


def byte_report(out_dir: Path, ptd_name: str, adapters: dict[str, str], shared_name: str | None = None) -> dict:
    """The manifest's ``bytes`` section for a build folder; ``adapters`` maps adapter name -> .pte file
    name; ``shared_name`` is its adapters_shared.ptd, if it has one."""
    ptd = read_ptd(Path(out_dir) / ptd_name)
    foundation = file_bytes(**_figures(ptd_name, ptd.size, [(e.key, e.segment_index, e.size) for e in ptd.entries]))
    holders: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    per_adapter = {}
    for name, file in adapters.items():
        pte = read_pte(Path(out_dir) / file, plans=False)
        stored = {e.key: e.size for e in pte.named_data if e.key != ADAPTER_KEY}
        for key, size in stored.items():
            holders.setdefault(key, []).append(name)
            sizes[key] = size
        per_adapter[name] = (pte, set(stored))
    in_several = {d: names for d, names in holders.items() if len(names) > 1}
    per_file = {
        name: adapter_bytes(
            **_figures(adapters[name], pte.size, [(e.key, e.segment_index, e.size) for e in pte.named_data]),
            shared_with_other_adapters=sum(sizes[d] for d in keys if d in in_several),
        )
        for name, (pte, keys) in per_adapter.items()
    }
    shared = None
    if shared_name is not None:
        ptes = {n: p for n, (p, _) in per_adapter.items()}
        shared = _hoisted(shared_name, read_ptd(Path(out_dir) / shared_name), ptes)
    return byte_report_section(
        foundation=foundation,
        adapters=per_file,
        across=across_adapters({d: (sizes[d], names) for d, names in in_several.items()}),
        shared=shared,
    )


def _kb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def report_lines(report: dict) -> list[str]:
    """The report as the lines the build prints."""
    f, across = report["foundation"], report["across_adapters"]
    lines = [
        f"  bytes: {_kb(report['total'])} in all; {f['file']} {_kb(f['total'])}: {_kb(f['shared'])} stored once "
        f"for several keys, {_kb(f['duplicate_avoided'])} of duplicates avoided"
    ]
    for a in report["adapters"].values():
        lines.append(
            f"    {a['file']}: {_kb(a['total'])}, {_kb(a['unique'])} unique tensor data, "
            f"{_kb(a['shared_with_other_adapters'])} also in other adapters"
        )
    if "shared" in report:
        sh = report["shared"]
        readers = sorted({n for names in sh["readers"].values() for n in names})
        lines.append(
            f"    {sh['file']}: {_kb(sh['total'])}, {sh['tensors']} tensor(s) ({_kb(sh['tensor_bytes'])}) "
            f"stored once for {', '.join(readers) or 'no adapter'}: {_kb(sh['duplicate_avoided'])} of "
            "copies avoided"
        )
    if across["tensors"]:
        lines.append(
            f"    {len(across['tensors'])} tensor(s) ({_kb(across['shared'])}) are in several adapters: "
            f"{_kb(across['duplicate'])} stored more than once"
        )
        for t in across["tensors"][:5]:
            lines.append(f"      {t['sha256'][:16]}... {_kb(t['size'])}: {', '.join(t['adapters'])}")
    return lines
