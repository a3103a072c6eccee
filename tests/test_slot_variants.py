"""A wide LoRA envelope costs nothing an adapter does not use (issue 60): every adapter record carries the
program's table of rewrites that make each envelope slot's LoRA dead code (lora_share/formats/xnnpack_prune.py),
and lora-share's runtime runs each call on a variant of the program without the slots the call leaves alone
(cpp_runner/runtime/program_variants.h): one request's adapter, or every row of a batched step.

The reference is the whole program: the tiny build's adapters (tiny_a on q/v, tiny_b on o/gate/down, tiny_c on
k/up of layer 1, in an envelope of all seven linears) written again without the table, which the runtime then runs
whole. Every answer must be the same bit for bit, one request at a time and in mixed batches, and the variants
must really have been made (ls_diag_slot_variants)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from batch_script import Req, alone, batch_script, guess
from conftest import REPO, TINY_ADAPTERS, TINY_CHUNK, TINY_FOUNDATION, Build, build_config, write_config
from test_batching import Program as ExportedProgram

from lora_share.deploy.adapter_pte import RECORD_ALIGNMENT, TENSOR_ALIGNMENT, Program, read_record
from lora_share.formats import read_pte
from lora_share.formats.meta import ADAPTER_KEY, encode_adapter
from lora_share.formats.pte_write import Entry
from lora_share.formats.seal import seal_pte
from lora_share.formats.xnnpack_prune import LORA_METHODS, apply, slot_patches

LONG = list(range(3, 3 + TINY_CHUNK + 4))  # fed in two chunks
# base and every adapter, joining and leaving, so that steps run different sets of slots
SCRIPT = [
    Req("tiny_a", [1, 17, 42, 5, 9], slot=0, new=9),
    Req("tiny_b", LONG, slot=1, new=6, joins=1),
    Req(None, [7, 8, 9], slot=2, new=5, joins=3),
    Req("tiny_c", [200, 3, 50, 51, 9], slot=3, new=7, joins=2),
    Req("tiny_a", [4, 4, 4], slot=1, new=6, joins=8),
]


@pytest.fixture(scope="module")
def library(runner_bin):
    return REPO / "build" / "liblora_share.so"


def _tensors(data: bytes, meta, what: str) -> dict[str, bytes]:
    keys = {k for e in meta.lora for k in (e.a, e.b)}
    return {n.key: data[n.start : n.end] for n in read_pte(data, what, plans=False).named_data if n.key in keys}


def _copy(build: Build, folder: Path, write) -> Build:
    """``build`` with each adapter file written again by ``write(program, meta, tensors)``, beside a link to
    its foundation.ptd."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, pte in build.ptes.items():
        data = pte.read_bytes()
        meta = read_record(data, name)
        (folder / pte.name).write_bytes(write(Program.from_adapter_file(pte), meta, _tensors(data, meta, name)))
    if not (folder / "foundation.ptd").exists():
        os.link(build.ptd, folder / "foundation.ptd")
    return dataclasses.replace(build, out_dir=folder)


@pytest.fixture(scope="module")
def whole(tiny_build, tmp_path_factory) -> Build:
    """The tiny build's adapters without the slot table: the runtime runs every slot."""
    return _copy(tiny_build, tmp_path_factory.mktemp("whole"), lambda p, m, t: p.write(m, t, slot_table=False))


def test_every_record_carries_the_programs_slot_table(tiny_build):
    """Each record's slot_patches is every slot's rewrites in the program it carries, found in forward and
    decode (five each) and decode_batch (seven), the same table in every adapter of the build."""
    tables = []
    for name, pte in tiny_build.ptes.items():
        data = pte.read_bytes()
        meta = read_record(data, name)
        table = slot_patches(data, name, len(meta.envelope))
        assert all(len(p) == 5 + 5 + 7 for p in table.values()) and len(table) == len(meta.envelope) == 14
        assert meta.slot_patches == [
            v for s in sorted(table) for p in table[s] for v in (s, p.segment, p.offset, p.old, p.new)
        ]
        tables.append(meta.slot_patches)
    assert all(t == tables[0] for t in tables)
    assert LORA_METHODS == ("forward", "decode", "decode_batch")


def test_the_variant_program_computes_what_the_whole_one_does(tiny_build, runner_bin):
    """Independently of the C++ runtime: the program with the rewrites of every slot neither tiny_a nor tiny_b
    has applied gives, through ExecuTorch's Python runtime, the whole program's outputs bit for bit: forward
    (a chunk) and decode for tiny_a, and decode_batch for a row of each."""
    from lora_share.inference.python_runtime import lora_inputs
    from lora_share.model.decoder import KVCache, KVPools, forward_inputs, rows_inputs

    args = tiny_build.manifest.model_args
    data = {n: tiny_build.ptes[n].read_bytes() for n in ("tiny_a", "tiny_b")}
    records = {n: read_record(d, n) for n, d in data.items()}
    n_slots = len(records["tiny_a"].envelope)
    used = {e.slot for r in records.values() for e in r.lora}
    table = slot_patches(data["tiny_a"], "tiny_a", n_slots)
    skipped = [p for s in range(n_slots) if s not in used for p in table[s]]
    assert skipped and len(used) < n_slots
    outputs = []
    for pte in (data["tiny_a"], apply(data["tiny_a"], "tiny_a", skipped)):
        program = ExportedProgram(pte, tiny_build.ptd, TINY_CHUNK)
        meta = program.methods["forward"].metadata
        lora = {n: lora_inputs(tiny_build.ptes[n], records[n], None, meta) for n in data}
        torch.manual_seed(0)
        cache, pools = KVCache.for_model(args), KVPools(args, 3)
        for t in [*cache.slabs, *pools.pools]:
            t.normal_()
        rows = [_rows_lora([lora["tiny_a"], lora["tiny_b"]], i) for i in range(n_slots)]
        outputs.append(
            [
                program.forward(forward_inputs([1, 2, 3], 4, cache, lora["tiny_a"])),
                program.decode(forward_inputs([7], 4, cache, lora["tiny_a"])),
                program.decode_batch(rows_inputs([5, 17], [3, 6], [1, 2], pools, [t for r in rows for t in r])),
            ]
        )
    for method, whole, variant in zip(("forward", "decode", "decode_batch"), *outputs):
        assert all(torch.equal(a, b) for a, b in zip(whole, variant)), method


def _rows_lora(rows: list, slot: int) -> list[torch.Tensor]:
    """decode_batch's A [B, r, in] and B [B, out, r] of one envelope slot from the rows' one-row inputs, each
    rank zero-padded to the largest."""
    import torch.nn.functional as F

    a, b = [row[2 * slot] for row in rows], [row[2 * slot + 1] for row in rows]
    r = max(t.shape[0] for t in a)
    return [
        torch.stack([F.pad(t, (0, 0, 0, r - t.shape[0])) for t in a]),
        torch.stack([F.pad(t, (0, r - t.shape[1])) for t in b]),
    ]


def test_batched_and_alone_answers_equal_the_whole_program_bit_for_bit(tiny_build, whole, library):
    """The C++ runtime on the tiny build (one request at a time, and the mixed batch of SCRIPT, whose steps run
    different sets of slots as rows join and leave) gives the tokens and logits of the whole program exactly,
    and made its variants (none for the whole program's files, which carry no table)."""
    for run in (batch_script, alone):
        got_variants, ref_variants = [], []
        got = run(tiny_build, SCRIPT, library, variants=got_variants)
        ref = run(whole, SCRIPT, library, variants=ref_variants)
        assert not isinstance(got, str) and not isinstance(ref, str), (got, ref)
        for i, (g, r) in enumerate(zip(got, ref)):
            assert g.tokens == r.tokens and np.array_equal(g.logits, r.logits), (run.__name__, i)
        (v,), (w,) = got_variants, ref_variants
        assert v.made >= (1 if run is batch_script else 4) and v.failed == v.refused == 0, run.__name__
        assert (w.made, w.failed, w.resident) == (0, 0, 0)
    assert max(g.max_batch for g in batch_script(tiny_build, SCRIPT, library)) >= 3


def test_batches_with_drafts_equal_the_whole_program_bit_for_bit(tiny_build, whole, library):
    """Rows that verify drafts (decode_batch with a row's last token and up to 8 guessed ones) beside plain
    rows, as rows join and leave: the tokens and logits of the whole program exactly, through variants."""
    vocab = tiny_build.manifest["foundation"]["args"]["vocab_size"]
    ref_alone = alone(whole, SCRIPT, library)
    drafting = [
        dataclasses.replace(r, prediction=guess(a.tokens, kind, vocab), max_drafts=8 if kind else 0)
        for r, a, kind in zip(SCRIPT, ref_alone, ("part", "right", None, "wrong", "part"))
    ]
    got_variants = []
    got = batch_script(tiny_build, drafting, library, variants=got_variants)
    ref = batch_script(whole, drafting, library)
    assert not isinstance(got, str) and not isinstance(ref, str), (got, ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.tokens == r.tokens and np.array_equal(g.logits, r.logits), i
        assert (g.drafted, g.accepted) == (r.drafted, r.accepted), i
    assert sum(g.drafted for g in got) > 0 and got_variants[0].made >= 1 and got_variants[0].failed == 0


@pytest.fixture(scope="module")
def exact_a(tmp_path_factory) -> Build:
    """tiny_a alone, its LoRA envelope exactly its recipe (q and v at its rank): the same foundation and
    adapter weights as in the tiny build, whose envelope is every linear at rank 8."""
    folder = tmp_path_factory.mktemp("exact_a")
    foundation = {"synthetic": TINY_FOUNDATION, "max_seq_len": 32, "prefill_chunk": TINY_CHUNK}
    return build_config(write_config(folder, foundation, [a for a in TINY_ADAPTERS if a["name"] == "tiny_a"]))


def test_the_wide_envelope_answers_as_the_exact_recipe_program(tiny_build, exact_a, library):
    """tiny_a (q and v at rank 4) through the tiny build's envelope of every linear at rank 8, at default
    settings, gives what its exact-recipe program gives: the same tokens and logits, alone and in batches of
    its own rows, with and without drafts. The skipped slots add nothing, and its rank is its own."""
    records = {n: read_record(b.ptes["tiny_a"].read_bytes(), n) for n, b in (("wide", tiny_build), ("exact", exact_a))}
    assert len(records["wide"].envelope) == 14 and len(records["exact"].envelope) == 4
    assert records["wide"].envelope_max_rank == 8 and records["exact"].envelope_max_rank == 4
    vocab = tiny_build.manifest["foundation"]["args"]["vocab_size"]
    script = [
        Req("tiny_a", [1, 17, 42, 5, 9], slot=0, new=9),
        Req("tiny_a", LONG, slot=1, new=6, joins=1),
        Req("tiny_a", [7, 8, 9], slot=2, new=5, joins=3),
    ]
    ref_alone = alone(exact_a, script, library)
    wide_variants = []
    got_alone = alone(tiny_build, script, library, variants=wide_variants)
    drafting = [
        dataclasses.replace(r, prediction=guess(a.tokens, kind, vocab), max_drafts=8)
        for r, a, kind in zip(script, ref_alone, ("part", "right", "wrong"))
    ]
    runs = [(ref_alone, got_alone)]
    for requests in (script, drafting):
        runs.append((batch_script(exact_a, requests, library), batch_script(tiny_build, requests, library)))
    for ref, got in runs:
        assert not isinstance(got, str) and not isinstance(ref, str), (got, ref)
        for i, (g, r) in enumerate(zip(got, ref)):
            assert g.tokens == r.tokens and np.array_equal(g.logits, r.logits), (i, np.abs(g.logits - r.logits).max())
    assert wide_variants[0].made >= 2 and wide_variants[0].failed == 0


def test_a_table_that_is_not_the_programs_leaves_the_whole_program_running(tiny_build, whole, library, tmp_path):
    """A record whose table expects other values than the program holds (a damaged or foreign record): the
    variant is not made (counted as failed) and every answer is still the whole program's."""

    def damaged(program, meta, tensors):
        table = list(program.slot_table(len(meta.envelope)))
        for i in range(3, len(table), 5):
            table[i] ^= 1  # every rewrite's expected value
        record = encode_adapter(dataclasses.replace(meta, slot_patches=table, content_bytes=0, content_crc32=0))
        entries = [Entry(k, v, TENSOR_ALIGNMENT) for k, v in tensors.items()] + [
            Entry(ADAPTER_KEY, record, RECORD_ALIGNMENT)
        ]
        return seal_pte(program._template.write(entries))

    bad = _copy(tiny_build, tmp_path / "damaged", damaged)
    script = SCRIPT[:2]
    got_variants = []
    got = alone(bad, script, library, variants=got_variants)
    ref = alone(whole, script, library)
    for g, r in zip(got, ref):
        assert g.tokens == r.tokens and np.array_equal(g.logits, r.logits)
    assert got_variants[0].made == 0 and got_variants[0].failed >= 1
