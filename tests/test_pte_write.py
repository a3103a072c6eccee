"""formats/pte_write.py: a template's program, byte for byte, with other named data.

- ExecuTorch's own reader finds, in a written file, the template's program (methods, delegate
  payloads, constants) and exactly the named data given, each entry at its alignment;
- lora-share's reader finds every entry at its byte range, and an adapter's file is sealed;
- writing is canonical: the same data gives the same bytes, from the program or from a file
  written from it, and leaving every adapter entry out gives back the program;
- a template whose entries to leave out do not own its last segments is refused by name, and a
  damaged template gets a FormatError, never another exception.
"""

from __future__ import annotations

import math
import random

import pytest
from mutations import damaged

from lora_share.deploy.adapter_pte import Program, read_record
from lora_share.errors import UserError
from lora_share.formats import FormatError, NotRewritable, read_pte
from lora_share.formats.meta import ADAPTER_KEY
from lora_share.formats.pte_write import SEGMENT_ALIGNMENT, Entry, Template
from lora_share.formats.seal import seal_status

OWN = ("own.blob", bytes(range(256)) * 3 + b"tail", 16)  # a stand-alone program's own named data


def adapter_keys(data: bytes) -> set[str]:
    meta = read_record(data, "adapter")
    return {ADAPTER_KEY, *(k for e in meta.lora for k in (e.a, e.b))}


def executorch_pte(template: bytes, named: list[tuple[str, bytes, int]], share: dict[str, str] | None = None) -> bytes:
    """``template``'s program serialized again by ExecuTorch's own writer, with ``named`` (key,
    bytes, alignment) as its named data, in that order; ``share`` maps a key to another key whose
    bytes (and so segment) it shares."""
    from executorch.exir._serialize._named_data_store import NamedDataStoreOutput
    from executorch.exir._serialize._program import PTEFile, deserialize_pte_binary, serialize_pte_binary
    from executorch.exir._serialize.data_serializer import DataEntry

    pte_file = deserialize_pte_binary(template)
    buffers, entries = [], {}
    for key, data, alignment in named:
        entries[key] = DataEntry(len(buffers), alignment, None)
        buffers.append(data)
    for key, other in (share or {}).items():
        entries[key] = DataEntry(entries[other].buffer_index, 1, None)
    named_data = NamedDataStoreOutput(buffers, entries, {}) if entries else None
    return bytes(
        serialize_pte_binary(
            PTEFile(pte_file.program, pte_file.mutable_data, named_data), extract_delegate_segments=True
        )
    )


@pytest.fixture(scope="module")
def files(tiny_build):
    """An adapter file of the tiny build, its adapter entries, and the same program as ExecuTorch
    writes it: alone, with its own blob, and with its own blob plus the adapter's entries (an
    adapter file of a stand-alone program as the old writer wrote it)."""
    adapter = tiny_build.ptes["tiny_a"].read_bytes()
    parsed = read_pte(adapter)
    mine = [(e.key, parsed.data(e.key), 16 if e.key == ADAPTER_KEY else 64) for e in parsed.named_data]
    return {
        "adapter": adapter,
        "keys": adapter_keys(adapter),
        "mine": mine,
        "program": executorch_pte(adapter, []),
        "own": executorch_pte(adapter, [OWN]),
        "own_and_adapter": executorch_pte(adapter, [OWN, *mine]),
    }


def new_entries() -> list[Entry]:
    rng = random.Random(7)
    return [
        Entry(f"k{i}", rng.randbytes(size), alignment)
        for i, (size, alignment) in enumerate([(1000, 64), (3, 1), (4096, 256), (77, 16), (640, 64)])
    ]


def test_executorch_reads_the_template_program_and_exactly_the_named_data(files):
    from executorch.exir._serialize._program import deserialize_pte_binary

    template = files["own_and_adapter"]
    out = Template(template, "template", files["keys"]).write(new_entries())
    theirs, ref = deserialize_pte_binary(out), deserialize_pte_binary(template)
    # Segments restored: delegate payloads inline again, constants and mutable data as buffers.
    assert theirs.program == ref.program and theirs.mutable_data == ref.mutable_data
    assert any(d.data for d in theirs.program.backend_delegate_data)
    named = theirs.named_data
    want = [OWN[:2]] + [(e.key, e.data) for e in new_entries()]
    assert [(k, bytes(named.buffers[e.buffer_index])) for k, e in named.pte_data.items()] == want
    pte = read_pte(out)
    alignment = {OWN[0]: OWN[2], **{e.key: e.alignment for e in new_entries()}}
    for e in pte.named_data:
        assert e.start % math.lcm(SEGMENT_ALIGNMENT, alignment[e.key]) == 0, e.key
    assert pte.header.segment_base_offset % SEGMENT_ALIGNMENT == 0


def test_lora_share_reads_every_entry_at_its_byte_range(files):
    before = read_pte(files["own"])
    out = Template(files["own"], "template").write(new_entries())
    pte = read_pte(out)
    assert [e.key for e in pte.named_data] == [OWN[0]] + [e.key for e in new_entries()]
    for e, new in zip(pte.named_data[1:], new_entries()):
        assert (out[e.start : e.end], e.size) == (new.data, len(new.data))
    assert pte.data(OWN[0]) == OWN[1] and pte.size == pte.named_data[-1].end
    assert pte.plans == before.plans and pte.constant_segment == before.constant_segment
    assert [out[d.start : d.end] for d in pte.delegates] == [files["own"][d.start : d.end] for d in before.delegates]
    assert [(c.start - before.header.segment_base_offset, c.layout) for c in before.constants] == [
        (c.start - pte.header.segment_base_offset, c.layout) for c in pte.constants
    ]


def test_an_adapter_written_again_is_its_own_bytes_and_sealed(files):
    """Program.write from an adapter file, with that file's record and tensors, gives the file."""
    data = files["adapter"]
    pte = read_pte(data)
    meta = read_record(data, "adapter")
    tensors = {e.key: pte.data(e.key) for e in pte.named_data if e.key != ADAPTER_KEY}
    program = Program(data, "adapter", frozenset(files["keys"]), meta.program_sha256)
    out = program.write(meta, tensors)
    assert out == data
    assert seal_status(read_pte(out)) == "sealed"
    assert [e.key for e in pte.named_data][-1] == ADAPTER_KEY and pte.size == pte.entry(ADAPTER_KEY).end
    assert all(e.start % 128 == 0 for e in pte.named_data)


def test_writing_is_canonical(files):
    """From the program as ExecuTorch writes it, from a file written from it, or from the old
    writer's adapter file: the same named data gives the same bytes, and none gives the program."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    entries = new_entries()
    first = Template(files["own"], "program").write(entries)
    again = Template(first, "written", {e.key for e in entries})
    assert Template(files["own"], "program").write(entries) == first == again.write(entries)
    bare = Template(files["own"], "program").write([])
    assert again.write([]) == bare
    assert Template(files["own_and_adapter"], "old adapter", files["keys"]).write([]) == bare
    theirs, ref = deserialize_pte_binary(bare), deserialize_pte_binary(files["own"])
    assert theirs.program == ref.program and list(theirs.named_data.pte_data) == [OWN[0]]
    # The program's identity: the same from the program and from any adapter file written from it.
    program = Program(files["program"], "program")
    adapter = program.write(read_record(files["adapter"], "a"), {e.key: e.data for e in entries})
    assert Program(adapter, "adapter", frozenset({ADAPTER_KEY, *(e.key for e in entries)})).sha256 == program.sha256


def test_entries_to_leave_out_must_own_the_last_segments(files):
    first = executorch_pte(files["adapter"], [*files["mine"], OWN])
    with pytest.raises(NotRewritable, match="not the last"):
        Template(first, "adapter first", files["keys"])
    shared = executorch_pte(files["adapter"], files["mine"], share={OWN[0]: files["mine"][0][0]})
    with pytest.raises(NotRewritable, match=f"named data '{OWN[0]}' refers to segment"):
        Template(shared, "shared segment", files["keys"])
    written = Template(files["program"], "program").write(new_entries())
    with pytest.raises(NotRewritable, match="segments"):
        Template(written, "written", {"k0"})
    with pytest.raises(ValueError, match="twice"):
        Template(files["own"], "program").write([Entry(OWN[0], b"x", 1)])


def test_damaged_templates_get_a_format_error(files):
    """500 damaged copies of an adapter file: each is written or refused with one FormatError."""
    outcomes = {}
    for mutation, blob in damaged(files["adapter"], "pte", 500, seed=99):
        try:
            Template(blob, "fuzz", files["keys"]).write(new_entries())
            result = "written"
        except FormatError as e:
            result = type(e).__name__
        except UserError as e:  # pragma: no cover - would mean an unnamed error
            pytest.fail(f"{mutation}: unnamed error {e}")
        outcomes.setdefault(mutation, {}).setdefault(result, 0)
        outcomes[mutation][result] += 1
    print(outcomes)
    assert "written" not in outcomes.get("truncate", {}) and "written" not in outcomes.get("wrong_magic", {})
