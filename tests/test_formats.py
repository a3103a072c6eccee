"""lora_share.formats: the defensive .ptd/.pte readers and lora-share's own records.

- the readers agree with ExecuTorch's own deserializers on real build outputs;
- the metadata writer produces golden bytes, and flatc (ExecuTorch's, 24.3.25)
  reads them with schema/lora_share.fbs, and our reader reads what flatc writes;
- every adapter a build writes is sealed, and any change outside its record breaks the seal;
- each kind of damage gets its named error;
- 1,000 damaged files of each kind are each accepted or rejected with a
  FormatError, in-process, with no other exception, no hang, no big allocation.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest
from mutations import damaged

from lora_share.errors import UserError
from lora_share.formats import (
    BadFlatbuffer,
    Damaged,
    FormatError,
    OffsetOutOfRange,
    TruncatedHeader,
    WrongMagic,
    read_ptd,
    read_pte,
)
from lora_share.formats.meta import (
    FOUNDATION_KEY,
    AdapterMeta,
    FoundationMeta,
    LoraTensors,
    SharedMeta,
    decode,
    encode_adapter,
    encode_foundation,
    encode_shared,
)
from lora_share.formats.records import adapter_record, foundation_record
from lora_share.formats.seal import check_seal, seal_pte, seal_status

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "schema" / "lora_share.fbs"

FOUNDATION = FoundationMeta("0123456789abcdef" * 4, 20, 90432, 361728, True)
ADAPTER = AdapterMeta(
    "tiny_a",
    "fedcba9876543210" * 4,
    4,
    8.0,
    ["q_proj", "v_proj"],
    [0, 1],
    False,
    "peft",
    "/data/adapters/a",
    {"adapter_config.json": "11" * 32, "adapter_model.safetensors": "22" * 32},
    7168,
    63232,
    0xFD4EF17C,
    "33" * 32,
    8,
    [(0, "q_proj"), (0, "v_proj"), (1, "q_proj")],
    [LoraTensors(0, 4, "44" * 32, "55" * 32), LoraTensors(2, 2, "44" * 32, "66" * 32)],
)
SHARED = SharedMeta("0123456789abcdef" * 4, 6, 5632)
# encode_*(above) with the zero padding stripped; any change to these bytes is a format change.
GOLDEN_FOUNDATION = (
    "140000004c534d310000000008000e000800040008000000180000000200000000000e0020001c0018001000080007000e000000"
    "00000001008505000000000040610100000000001400000004000000400000003031323334353637383961626364656630313233"
    "3435363738396162636465663031323334353637383961626364656630313233343536373839616263646566"
)
GOLDEN_ADAPTER = (
    "140000004c534d3100000a000e000800000004000a000000300000000200000000002600540050004c00480040003c0038000000"
    "340030002c0020001800140010000c00080004002600000040010000a402000008000000ec0000007cf14efd00f7000000000000"
    "001c00000000000000000000d80200002400000038000000940000009c0000000000000000002040040000002c00000070000000"
    "100000002f646174612f61646170746572732f610000000004000000706566740000000040000000666564636261393837363534"
    "33323130666564636261393837363534333231306665646362613938373635343332313066656463626139383736353433323130"
    "000000000600000074696e795f61000002000000000000000100000002000000140000000400000006000000765f70726f6a0000"
    "06000000715f70726f6a000040000000333333333333333333333333333333333333333333333333333333333333333333333333"
    "333333333333333333333333333333333333333333333333333333330000000002000000c4000000100000000c00140010000c00"
    "080004000c0000001000000054000000020000000200000040000000363636363636363636363636363636363636363636363636"
    "36363636363636363636363636363636363636363636363636363636363636363636363636363636000000004000000034343434"
    "34343434343434343434343434343434343434343434343434343434343434343434343434343434343434343434343434343434"
    "3434343434343434000000000c00100000000c00080004000c0000000c0000005000000004000000400000003535353535353535"
    "35353535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353535"
    "35353535000000004000000034343434343434343434343434343434343434343434343434343434343434343434343434343434"
    "343434343434343434343434343434343434343434343434000000000300000040000000200000000400000038ffffff08000000"
    "0100000006000000715f70726f6a0000ecffffff0400000006000000765f70726f6a000008000800000004000800000004000000"
    "06000000715f70726f6a00000200000084000000040000008cffffff080000004c00000040000000323232323232323232323232"
    "32323232323232323232323232323232323232323232323232323232323232323232323232323232323232323232323232323232"
    "0000000019000000616461707465725f6d6f64656c2e7361666574656e736f727300000008000c00080004000800000008000000"
    "4c000000400000003131313131313131313131313131313131313131313131313131313131313131313131313131313131313131"
    "31313131313131313131313131313131313131310000000013000000616461707465725f636f6e6669672e6a736f6e"
)
GOLDEN_SHARED = (
    "140000004c534d310c000e0008000000000004000c000000140000000200000000000a00140010000c0004000a00000000160000"
    "00000000060000000400000040000000303132333435363738396162636465663031323334353637383961626364656630313233"
    "34353637383961626364656630313233343536373839616263646566"
)


def flatc() -> Path:
    import executorch.exir

    return Path(executorch.exir.__file__).parents[1] / "data" / "bin" / "flatc"


# --- readers against ExecuTorch's own -------------------------------------------------


def test_ptd_reader_matches_executorch(tiny_build):
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    ptd = read_ptd(tiny_build.ptd)
    theirs = FlatTensorSerializer().deserialize(Cord(tiny_build.ptd.read_bytes()))
    assert [e.key for e in ptd.entries] == list(theirs.named_data)
    for e in ptd.entries:
        entry = theirs.named_data[e.key]
        assert ptd.data(e.key) == bytes(theirs.buffers[entry.buffer_index]), e.key
        if entry.tensor_layout is None:
            assert e.layout is None
        else:
            assert list(e.layout.sizes) == list(entry.tensor_layout.sizes)
            assert e.layout.scalar_type == int(entry.tensor_layout.scalar_type)
    assert all(s.start % 128 == 0 for s in ptd.segments)


def test_pte_reader_matches_executorch(tiny_build):
    from executorch.exir._serialize._program import deserialize_pte_binary

    path = next(iter(tiny_build.ptes.values()))
    pte = read_pte(path)
    theirs = deserialize_pte_binary(path.read_bytes())
    program = theirs.program
    assert pte.plans == [p.name for p in program.execution_plan]
    named = theirs.named_data
    assert sorted(e.key for e in pte.named_data) == sorted(named.pte_data)
    for e in pte.named_data:
        assert pte.data(e.key) == bytes(named.buffers[named.pte_data[e.key].buffer_index]), e.key
    for plan in program.execution_plan:  # forward, decode and decode_batch delegate; the constant methods do not
        ours = [d for d in pte.delegates if d.plan == plan.name]
        assert len(ours) == len(plan.delegates), plan.name
        for d, theirs_d in zip(ours, plan.delegates):
            payload = program.backend_delegate_data[theirs_d.processed.index].data
            assert d.id == theirs_d.id and bytes(pte.blob[d.start : d.end]) == bytes(payload)
    assert {d.plan for d in pte.delegates} == {"forward", "decode", "decode_batch"}
    # XNNPACK names constants by the sha256 of their bytes.
    for d in pte.delegates:
        for c in d.constants:
            assert bytes(pte.blob[c.key_span[0] : c.key_span[0] + c.key_span[1]]).decode() == c.key
            if c.key in pte:
                assert hashlib.sha256(pte.data(c.key)).hexdigest() == c.key


def test_pte_needs_exactly_what_the_ptd_has(tiny_build):
    ptd = read_ptd(tiny_build.ptd)
    needed = set()
    for path in tiny_build.ptes.values():
        pte = read_pte(path)
        assert all(k in ptd for k in pte.external_keys()), path
        needed |= set(pte.external_keys())
    assert needed | {FOUNDATION_KEY} == {e.key for e in ptd.entries}


# --- lora-share's records -------------------------------------------------------------


def test_records_golden_bytes():
    f, a, s = encode_foundation(FOUNDATION), encode_adapter(ADAPTER), encode_shared(SHARED)
    assert f == bytes.fromhex(GOLDEN_FOUNDATION).ljust(256, b"\0")
    assert a == bytes.fromhex(GOLDEN_ADAPTER).ljust(2048, b"\0")
    assert s == bytes.fromhex(GOLDEN_SHARED).ljust(256, b"\0")
    assert decode(f, "f").foundation == FOUNDATION and decode(a, "a").adapter == ADAPTER
    assert decode(s, "s").shared == SHARED and decode(s, "s").adapter is None


def test_records_agree_with_the_schema(tmp_path):
    """flatc reads our bytes with schema/lora_share.fbs, and we read flatc's."""
    expected = {
        "f": {
            "format_version": 2,
            "foundation": {
                "fingerprint": FOUNDATION.fingerprint,
                "tensor_count": 20,
                "parameter_count": 90432,
                "tensor_bytes": 361728,
                "tied_embeddings": True,
            },
        },
        "a": {
            "format_version": 2,
            "adapter": {
                "name": "tiny_a",
                "foundation_fingerprint": ADAPTER.foundation_fingerprint,
                "rank": 4,
                "alpha": 8.0,
                "targets": ["q_proj", "v_proj"],
                "layers": [0, 1],
                "use_rslora": False,
                "source_kind": "peft",
                "source": "/data/adapters/a",
                "lora_bytes": 7168,
                "source_hashes": [
                    {"file": "adapter_config.json", "sha256": "11" * 32},
                    {"file": "adapter_model.safetensors", "sha256": "22" * 32},
                ],
                "content_bytes": 63232,
                "content_crc32": 0xFD4EF17C,
                "program_sha256": "33" * 32,
                "envelope_max_rank": 8,
                "envelope": [
                    {"layer": 0, "target": "q_proj"},
                    {"layer": 0, "target": "v_proj"},
                    {"layer": 1, "target": "q_proj"},
                ],
                "lora": [
                    {"slot": 0, "rank": 4, "a": "44" * 32, "b": "55" * 32},
                    {"slot": 2, "rank": 2, "a": "44" * 32, "b": "66" * 32},
                ],
            },
        },
        "s": {
            "format_version": 2,
            "shared": {
                "foundation_fingerprint": SHARED.foundation_fingerprint,
                "tensor_count": 6,
                "tensor_bytes": 5632,
            },
        },
    }
    for name, blob in (
        ("f", encode_foundation(FOUNDATION)),
        ("a", encode_adapter(ADAPTER)),
        ("s", encode_shared(SHARED)),
    ):
        (tmp_path / f"{name}.lsm").write_bytes(blob)
        subprocess.run(
            [
                flatc(),
                "--json",
                "--raw-binary",
                "--strict-json",
                "--defaults-json",
                "-o",
                tmp_path,
                SCHEMA,
                "--",
                tmp_path / f"{name}.lsm",
            ],
            check=True,
            capture_output=True,
        )
        assert json.loads((tmp_path / f"{name}.json").read_text()) == expected[name]
        # ... and the other way round: flatc builds the binary from JSON, we decode it.
        (tmp_path / "in").mkdir(exist_ok=True)
        src = tmp_path / "in" / f"{name}.json"
        src.write_text(json.dumps(expected[name]))
        subprocess.run([flatc(), "--binary", "-o", tmp_path / "in", SCHEMA, src], check=True, capture_output=True)
        decoded = decode((tmp_path / "in" / f"{name}.lsm").read_bytes(), name)
        assert decoded.foundation == (FOUNDATION if name == "f" else None)
        assert decoded.adapter == (ADAPTER if name == "a" else None)
        assert decoded.shared == (SHARED if name == "s" else None)


def test_build_writes_the_records(tiny_build):
    ptd_record = foundation_record(read_ptd(tiny_build.ptd))
    fnd = tiny_build.manifest["foundation"]
    assert ptd_record.fingerprint == fnd["fingerprint"] and ptd_record.parameter_count == fnd["parameters"]
    assert ptd_record.tied_embeddings
    for entry in tiny_build.manifest["adapters"]:
        a = adapter_record(read_pte(tiny_build.ptes[entry["name"]]))
        assert a.foundation_fingerprint == fnd["fingerprint"]
        assert (a.name, a.rank, a.alpha, a.targets, a.layers) == (
            entry["name"],
            entry["rank"],
            entry["alpha"],
            entry["targets"],
            entry["layers"],
        )


def test_build_seals_every_adapter(tiny_build):
    for path in tiny_build.ptes.values():
        data = path.read_bytes()
        pte = read_pte(data)
        assert seal_status(pte) == "sealed" and seal_pte(data) == data  # sealing is idempotent
        weight = max(pte.constants, key=lambda c: c.layout.nbytes)  # a LoRA weight
        in_weight, in_padding = bytearray(data), bytearray(data)
        in_weight[weight.start + weight.layout.nbytes // 2] ^= 0x04
        in_padding[pte.header.segment_base_offset - 1] ^= 0x80  # between the program and the segments
        for damaged_copy in (bytes(in_weight), bytes(in_padding), data + b"\0"):
            with pytest.raises(Damaged, match="damaged"):
                check_seal(read_pte(damaged_copy))


# --- named errors ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ptd", "pte"])
def test_each_damage_has_its_error(tiny_build, kind):
    path = tiny_build.ptd if kind == "ptd" else next(iter(tiny_build.ptes.values()))
    read = read_ptd if kind == "ptd" else read_pte
    data = path.read_bytes()
    other = (next(iter(tiny_build.ptes.values())) if kind == "ptd" else tiny_build.ptd).read_bytes()
    cases = [
        (b"", TruncatedHeader, "truncated"),
        (data[:20], TruncatedHeader, "truncated"),
        (data[: len(data) - 1], OffsetOutOfRange, "may be truncated"),
        (data[:4096], OffsetOutOfRange, "may be truncated"),
        (other, WrongMagic, "that is an ExecuTorch"),
        (data[:8] + b"XXXX" + data[12:], WrongMagic, "magic"),
        (b"\xff\xff\x00\x00" + data[4:], BadFlatbuffer, "malformed flatbuffer"),
    ]
    for blob, error, words in cases:
        with pytest.raises(error, match=words):
            read(blob, what="x")


# --- fuzz -----------------------------------------------------------------------------


# The .pte's thousand (its seal checked each time, ~18 s) run in `make test`, not in the edit loop.
@pytest.mark.parametrize("kind", ["ptd", pytest.param("pte", marks=pytest.mark.slow)])
def test_damaged_files_are_rejected_cleanly(tiny_build, kind):
    """1,000 damaged copies: each parses (its record decodes, a .pte matches its seal) or raises one FormatError."""
    path = tiny_build.ptd if kind == "ptd" else tiny_build.ptes[next(iter(tiny_build.ptes))]
    read = read_ptd if kind == "ptd" else read_pte

    def record(parsed):
        if kind == "pte":
            check_seal(parsed)
        return foundation_record(parsed) if kind == "ptd" else adapter_record(parsed)

    outcomes: dict[str, dict[str, int]] = {}
    t0, slowest = time.perf_counter(), 0.0
    tracemalloc.start()
    for mutation, blob in damaged(path.read_bytes(), kind, 1000, seed=1234):
        t = time.perf_counter()
        try:
            record(read(blob, what="fuzz"))
            result = "accepted"
        except FormatError as e:
            result = type(e).__name__
        except UserError as e:  # pragma: no cover - would mean an unnamed error
            pytest.fail(f"{mutation}: unnamed error {e}")
        slowest = max(slowest, time.perf_counter() - t)
        outcomes.setdefault(mutation, {}).setdefault(result, 0)
        outcomes[mutation][result] += 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"\n{kind}: 1000 damaged files in {time.perf_counter() - t0:.1f} s, slowest {slowest * 1e3:.0f} ms, "
        f"peak {peak / 1e6:.1f} MB: {outcomes}"
    )
    assert "accepted" not in outcomes.get("truncate", {}) and "accepted" not in outcomes.get("wrong_magic", {})
    assert sum(n for o in outcomes.values() for r, n in o.items() if r != "accepted") >= 500
    assert slowest < 1.0 and peak < 8 * len(path.read_bytes()) + (16 << 20)


def test_sealing_never_changes_a_record_size():
    """The seal's fields are written even when zero, so sealing rewrites a record at its size whatever
    its length (an omitted zero once grew a 60-slot record past its 2048-byte padding): records of
    every size over more than two padding blocks, in 4-byte steps of the name's length."""
    import dataclasses

    for slots in range(1, 31):
        lora = [LoraTensors(i, 8, f"{i:064x}", f"{i + 1:064x}") for i in range(slots)]
        envelope = [(i // 2, ("q_proj", "v_proj")[i % 2]) for i in range(slots)]
        for name_len in range(1, 160, 4):
            meta = dataclasses.replace(
                ADAPTER, name="n" * name_len, envelope=envelope, lora=lora, content_bytes=0, content_crc32=0
            )
            sealed = dataclasses.replace(meta, content_bytes=123456789, content_crc32=0xFFFFFFFF)
            assert len(encode_adapter(meta)) == len(encode_adapter(sealed)), (slots, name_len)
    assert decode(encode_adapter(meta), "t").adapter.content_bytes == 0
