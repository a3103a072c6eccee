"""``lora-share inspect``: what is inside a .ptd or .pte, as JSON-ready data and as text."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ..errors import UserError
from ..formats import Ptd, Pte, read_ptd, read_pte
from ..formats.blob import file_kind, open_blob
from ..formats.records import adapter_record, foundation_record, shared_record
from ..formats.seal import seal_status
from .verify import check_pair


def _entry(key, segment, start, size, layout=None) -> dict:
    d = {"key": key, "segment": segment, "start": start, "size": size}
    if layout is not None:
        d.update(dtype=layout.dtype, shape=list(layout.sizes))
    return d


def _segments(segments, users: dict[int, list[str]]) -> list[dict]:
    return [
        {
            "index": s.index,
            "offset": s.offset,
            "start": s.start,
            "size": s.size,
            "alignment": s.alignment,
            "used_by": users.get(s.index, []),
        }
        for s in segments
    ]


def dedup_summary(entries: list[tuple[str, int, int]]) -> dict:
    """Bytes of (key, segment, size) entries: ``logical`` if each key had its own copy,
    ``stored`` as stored (one copy per segment), ``shared`` in segments more than one key uses."""
    by_segment: dict[int, list[tuple[str, int]]] = {}
    for key, seg, size in entries:
        by_segment.setdefault(seg, []).append((key, size))
    logical = sum(size for _, _, size in entries)
    stored = sum(items[0][1] for items in by_segment.values())
    shared = [
        {"segment": seg, "size": items[0][1], "keys": [k for k, _ in items]}
        for seg, items in sorted(by_segment.items())
        if len(items) > 1
    ]
    return {
        "keys": len(entries),
        "segments": len(by_segment),
        "logical_bytes": logical,
        "stored_bytes": stored,
        "shared_bytes": sum(s["size"] for s in shared),
        "duplicate_avoided_bytes": logical - stored,
        "shared_segments": shared,
    }


def ptd_report(ptd: Ptd) -> dict:
    """Everything ``inspect`` shows about a .ptd."""
    record, shared = foundation_record(ptd), shared_record(ptd)
    return {
        "file": ptd.what,
        "kind": "ptd",
        "size": ptd.size,
        "version": ptd.version,
        "header": asdict(ptd.header),
        "foundation": asdict(record) if record else None,
        "shared": asdict(shared) if shared else None,
        "segments": _segments(ptd.segments, ptd.keys_by_segment()),
        "named_data": [_entry(e.key, e.segment_index, e.start, e.size, e.layout) for e in ptd.entries],
        "dedup": dedup_summary([(e.key, e.segment_index, e.size) for e in ptd.entries]),
    }


def pte_report(pte: Pte, ptd_path=None, shared_path=None) -> dict:
    """Everything ``inspect`` shows about a .pte; with ``ptd_path`` (and ``shared_path``, an
    adapters_shared.ptd), whether those files have what it needs."""
    users: dict[int, list[str]] = {}
    for e in pte.named_data:
        users.setdefault(e.segment_index, []).append(e.key)
    for d in pte.delegates:
        if d.location == "segment":
            users.setdefault(d.data_index, []).append(f"delegate {d.plan}[{d.index}] {d.id}")
    if pte.constant_segment is not None:
        users.setdefault(pte.constant_segment, []).append("constant tensors")
    record = adapter_record(pte)
    own = {e.key for e in pte.named_data}
    report = {
        "file": pte.what,
        "kind": "pte",
        "size": pte.size,
        "version": pte.version,
        "methods": pte.plans,
        "header": asdict(pte.header),
        "adapter": asdict(record) if record else None,
        "seal": seal_status(pte),
        "segments": _segments(pte.segments, users),
        "named_data": [_entry(e.key, e.segment_index, e.start, e.size) for e in pte.named_data],
        "delegates": [
            {
                "plan": d.plan,
                "index": d.index,
                "id": d.id,
                "location": d.location,
                "data_index": d.data_index,
                "start": d.start,
                "size": d.size,
                "named_keys": [c.key for c in d.constants],
            }
            for d in pte.delegates
        ],
        "external_tensors": [
            {"plan": t.plan, "key": t.key, "dtype": t.layout.dtype, "shape": list(t.layout.sizes)}
            for t in pte.external_tensors
        ],
        "constant_tensors": [
            {"buffer": -seg, "sha256": k, "start": start, "size": size}
            for k, seg, start, size in pte.stored_tensors()
            if seg < 0
        ],
        "needs": pte.external_keys(),
        "dedup": dedup_summary([(e.key, e.segment_index, e.size) for e in pte.named_data]),
    }
    report["delegate_keys_in_file"] = sorted({c.key for d in pte.delegates for c in d.constants} & own)
    if ptd_path is not None:
        pairing = check_pair(pte.what, ptd_path, shared_path)
        report["ptd"] = {
            "file": pairing.ptd.what,
            "shared_file": str(shared_path) if shared_path else None,
            "has_all_keys": not pairing.missing,
            "missing": pairing.missing,
            "compatible": pairing.ok,
            "problems": pairing.problems,
        }
    return report


def _folder_refusal(folder: Path) -> str:
    """What to give instead of a folder (a build's output, most often): one of the files it holds."""
    files = sorted(
        (p.name for p in folder.iterdir() if p.suffix in (".ptd", ".pte")), key=lambda n: (n.endswith(".pte"), n)
    )
    if not files:
        return f"{folder}: is a folder, and holds no .ptd or .pte: inspect takes one .ptd or .pte file"
    shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "")
    return (
        f"{folder}: is a folder: inspect takes one of its files ({shown}), e.g. lora-share inspect {folder / files[0]}"
    )


def inspect_file(path, ptd_path=None, shared_path=None) -> dict:
    """The report for ``path`` (kind told by its magic); ``ptd_path`` and ``shared_path`` only apply to a .pte."""
    if Path(path).is_dir():
        raise UserError(_folder_refusal(Path(path)))
    blob, what = open_blob(path)
    if file_kind(blob, what) == "ptd":
        return ptd_report(read_ptd(path))
    return pte_report(read_pte(path), ptd_path, shared_path)


def _short(key: str) -> str:
    return key if len(key) <= 48 else key[:45] + "..."


def render(r: dict) -> str:
    """The report as text for a terminal."""
    h, out = r["header"], []
    if r["kind"] == "ptd":
        out.append(f"{r['file']}: ExecuTorch data file (.ptd), {r['size']:,} bytes, FlatTensor version {r['version']}")
        out.append(
            f"  header: {h['length']} bytes at 8; flatbuffer [0, {h['flatbuffer_offset'] + h['flatbuffer_size']}); "
            f"segment data at {h['segment_base_offset']} ({h['segment_data_size']:,} bytes)"
        )
        f, sh = r["foundation"], r["shared"]
        if sh:
            out.append(
                f"  lora-share shared adapter tensors: {sh['tensor_count']} tensors, {sh['tensor_bytes']:,} "
                f"bytes, for adapters of foundation {sh['foundation_fingerprint']}"
            )
        else:
            out.append(
                "  lora-share foundation: "
                + (
                    f"fingerprint {f['fingerprint']}, {f['tensor_count']} tensors, "
                    f"{f['parameter_count']:,} parameters, "
                    f"{'tied' if f['tied_embeddings'] else 'untied'} embeddings"
                    if f
                    else "none (not built by lora-share)"
                )
            )
    else:
        out.append(f"{r['file']}: ExecuTorch program (.pte), {r['size']:,} bytes, methods {', '.join(r['methods'])}")
        out.append(
            f"  header: {h['length']} bytes at 8; program [0, {h['program_size']}); "
            f"segment data at {h['segment_base_offset']} ({h['segment_data_size']:,} bytes)"
        )
        a = r["adapter"]
        out.append(
            "  lora-share adapter: "
            + (
                f"{a['name']}, rank {a['rank']}, alpha {a['alpha']:g}, targets {','.join(a['targets'])}, "
                f"layers {','.join(map(str, a['layers']))}, source {a['source_kind']} {a['source']}; "
                f"needs foundation {a['foundation_fingerprint']}"
                if a
                else "none (not built by lora-share)"
            )
        )
        if a and a["source_hashes"]:
            out += [f"    {name}: sha256 {sha}" for name, sha in a["source_hashes"].items()]
        if a and a["program_sha256"]:
            targets = sorted({t for _, t in a["envelope"]}, key=lambda t: [x for _, x in a["envelope"]].index(t))
            layers = len({layer for layer, _ in a["envelope"]})
            out.append(
                f"  program {a['program_sha256'][:16]}: LoRA envelope {', '.join(targets)} on {layers} layer(s), "
                f"ranks 1..{a['envelope_max_rank']} ({len(a['envelope'])} slots); this adapter has "
                f"{len(a['lora'])} of them"
            )
            if a.get("program_patches"):
                out.append(
                    f"    which skips the others: envelope program {a['envelope_program_sha256'][:16]} with "
                    f"{len(a['program_patches']) // 4} words rewritten (lora_envelope.skip_absent)"
                )
            elif a.get("slot_patches"):
                table = a["slot_patches"]
                slots = len({table[i] for i in range(0, len(table), 5)})
                out.append(
                    f"    slot table: {len(table) // 5} words, by which lora-share's runtime skips the slots a call "
                    f"leaves alone ({slots} of the {len(a['envelope'])} slots have theirs)"
                )
        out.append(
            f"  seal: {r['seal']}"
            + (f" (size {a['content_bytes']:,}, CRC-32 {a['content_crc32']:08x})" if r["seal"] == "sealed" else "")
        )
        ids = sorted({d["id"] for d in r["delegates"]})
        out.append(
            f"  delegates: {len(r['delegates'])} ({', '.join(ids) or 'none'}), referring to "
            f"{len({k for d in r['delegates'] for k in d['named_keys']})} named keys, "
            f"{len(r['delegate_keys_in_file'])} of them in this file"
        )
    align = min((s["alignment"] for s in r["segments"]), default=0)
    out.append(f"  segments: {len(r['segments'])}, every start offset aligned to {align} bytes")
    d = r["dedup"]
    out.append(
        f"  named data: {d['keys']} keys in {d['segments']} segments, {d['stored_bytes']:,} bytes stored; "
        f"{d['shared_bytes']:,} bytes shared by several keys, {d['duplicate_avoided_bytes']:,} duplicate bytes avoided"
    )
    for s in d["shared_segments"]:
        out.append(
            f"    segment {s['segment']} ({s['size']:,} bytes) is stored once for: "
            + ", ".join(_short(k) for k in s["keys"])
        )
    out.append(f"  {'KEY':<48} {'SIZE':>10} {'SEG':>4} {'START':>10}  DTYPE SHAPE")
    for e in r["named_data"]:
        shape = f"{e['dtype']} {e['shape']}" if "dtype" in e else "-"
        out.append(f"  {_short(e['key']):<48} {e['size']:>10,} {e['segment']:>4} {e['start']:>10}  {shape}")
    if r["kind"] == "pte":
        c = r["constant_tensors"]
        out.append(f"  constant tensors: {len(c)} buffers, {sum(t['size'] for t in c):,} bytes")
        out.append(
            f"  needs from a .ptd: {len(r['needs'])} keys ({len(r['external_tensors'])} tensors, "
            f"{len(r['needs']) - len({t['key'] for t in r['external_tensors']})} delegate constants)"
        )
        if "ptd" in r:
            p = r["ptd"]
            against = p["file"] + (f" + {p['shared_file']}" if p.get("shared_file") else "")
            out.append(
                f"  against {against}: "
                + (
                    "all present"
                    if p["has_all_keys"]
                    else f"{len(p['missing'])} missing: " + ", ".join(_short(k) for k in p["missing"][:5])
                )
            )
            out.append("  compatible: " + ("yes" if p["compatible"] else "no"))
            out += [f"    {problem}" for problem in p["problems"]]
    return "\n".join(out)
