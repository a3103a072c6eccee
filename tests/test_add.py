"""Adapters as data: one program per deployment's LoRA envelope, exported once; `lora-share add`
writes any adapter inside it (any rank up to the envelope's, any subset of its linears, alpha,
rslora, rank and alpha patterns, layer subsets) without an export, and each equals transformers +
peft through both runners. An adapter outside the envelope is refused, naming the key to widen."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import yaml
from conftest import build_config, run_cli
from hf_files import hf_config, hf_peft_logits, write_hf_llama, write_peft_lora

import lora_share
from lora_share.files import sha256_file
from lora_share.formats import read_pte
from lora_share.formats.records import adapter_record
from lora_share.manifest import read_manifest

pytestmark = pytest.mark.slow  # three envelope builds of its own

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PROMPT, NEW = [3, 141, 59, 26, 5], 6
BASE = hf_config(tied=True)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# What `lora-share add` gets: every way an adapter can sit inside an all-linear rank-8 envelope.
ADDED = {
    "rank1_q": dict(r=1, alpha=2, targets=["q_proj"], seed=21),
    "all8_rslora": dict(r=8, alpha=4, targets=ALL, use_rslora=True, seed=22),
    "patterns": dict(
        r=4,
        alpha=16,
        targets=["q_proj", "k_proj", "o_proj", "gate_proj", "up_proj"],
        rank_pattern={"k_proj": 2, "model.layers.1.mlp.up_proj": 8},
        alpha_pattern={"o_proj": 3},
        seed=23,
    ),
    "layer1_kd": dict(r=3, alpha=6, targets=["k_proj", "down_proj"], layers=[1], seed=24),
}


def write_deployment(root, envelope: dict | None, adapters: dict[str, dict]):
    """A tiny Hugging Face llama, PEFT adapters for it and a config over both, under ``root``."""
    base = write_hf_llama(root / "llama", BASE)
    for name, spec in adapters.items():
        write_peft_lora(root / name, BASE, **spec)
    config = {
        "output_dir": "out",
        "foundation": {"checkpoint": "llama", "max_seq_len": 24, "prefill_chunk": 4},
        "adapters": [{"name": n, "peft": n} for n in adapters],
    }
    if envelope is not None:
        config["lora_envelope"] = envelope
    (root / "deploy.yaml").write_text(yaml.safe_dump(config))
    return base, root / "deploy.yaml"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """An all-linear rank-8 envelope built with one q/v adapter, then `lora-share add` of ADDED in one call."""
    root = tmp_path_factory.mktemp("envelope")
    base, config = write_deployment(
        root, {"targets": "all", "max_rank": 8}, {"first": dict(r=4, alpha=8, targets=["q_proj", "v_proj"], seed=20)}
    )
    build = build_config(config)
    out = root / "added"
    shutil.copytree(build.out_dir, out)
    for name, spec in ADDED.items():
        write_peft_lora(root / name, BASE, **spec)
    ptd = out / "foundation.ptd"
    before = {"stat": os.stat(ptd), "first": (out / "first.pte").read_bytes()}
    t0 = time.perf_counter()
    r = run_cli("add", "--to", out, *[f"{n}={root / n}" for n in ADDED])
    assert r.returncode == 0, r.stderr
    return {
        "root": root,
        "base": base,
        "build": build,
        "out": out,
        "before": before,
        "add_s": time.perf_counter() - t0,
        "manifest": read_manifest(out),
    }


def test_build_exports_the_program_once(deployment):
    m = deployment["build"].manifest
    assert m["program"]["produced"] == "exported"
    assert m["program"]["envelope"] == {"targets": ALL, "layers": [0, 1], "max_rank": 8}
    assert [a["produced"] for a in m["adapters"]] == ["written"]


def test_add_writes_data_and_exports_nothing(deployment):
    m, out = deployment["manifest"], deployment["out"]
    assert m["program"]["produced"] == "reused"
    assert m["program"]["sha256"] == deployment["build"].manifest["program"]["sha256"]
    assert {a["name"]: a["produced"] for a in m["adapters"]} == {"first": "written", **{n: "written" for n in ADDED}}
    # foundation.ptd and the shipped adapter are the same files, untouched.
    after = os.stat(out / "foundation.ptd")
    assert (after.st_ino, after.st_mtime_ns) == (
        deployment["before"]["stat"].st_ino,
        deployment["before"]["stat"].st_mtime_ns,
    )
    assert (out / "first.pte").read_bytes() == deployment["before"]["first"]
    for a in m["adapters"]:
        assert a["sha256"] == sha256_file(out / a["file"])
    # Each new .pte holds its own LoRA bytes plus the shared program: far less than one export's output.
    program_bytes = (out / "first.pte").stat().st_size - m["adapters"][0]["lora_bytes"]
    for a in m["adapters"][1:]:
        assert a["size"] <= program_bytes + a["lora_bytes"] + 64 * 1024


def test_an_adapter_file_does_not_depend_on_where_it_was_built(deployment, tmp_path):
    """The same PEFT folder added from another place gives the same .pte, byte for byte: its record
    names the folder, not its path (which manifest.json keeps), so a build's hashes, and the
    measurements keyed by them, carry over to another checkout."""
    moved = tmp_path / "elsewhere" / "rank1_q"
    shutil.copytree(deployment["root"] / "rank1_q", moved)
    out = tmp_path / "out"
    shutil.copytree(deployment["build"].out_dir, out)
    r = run_cli("add", "--to", out, f"rank1_q={moved}")
    assert r.returncode == 0, r.stderr
    assert (out / "rank1_q.pte").read_bytes() == (deployment["out"] / "rank1_q.pte").read_bytes()
    record = adapter_record(read_pte(out / "rank1_q.pte"))
    assert record.source == "rank1_q" and record.source_kind == "peft"
    entry = next(a for a in read_manifest(out)["adapters"] if a["name"] == "rank1_q")
    assert entry["source"]["path"] == str(moved)


@pytest.mark.parametrize("name", ["first", *ADDED])
def test_added_adapter_matches_transformers_peft(deployment, name):
    out = deployment["out"]
    got = lora_share.run(out / f"{name}.pte", out / "foundation.ptd", PROMPT, NEW)
    ref = hf_peft_logits(deployment["base"], deployment["root"] / name, PROMPT + got.tokens[:-1])[len(PROMPT) - 1 :]
    assert np.abs(got.logits - ref.numpy()).max() <= 1e-4
    assert got.tokens == [int(i) for i in ref.argmax(-1)]


def test_added_adapters_in_one_runner_match_transformers_peft(deployment, runner_bin, tmp_path):
    """build/runner with every adapter loaded in one process (one program), each answering in turn."""
    from test_families import runner_generate

    out = deployment["out"]
    ptes = [out / f"{n}.pte" for n in ["first", *ADDED]]
    for name in ["first", *ADDED]:
        tokens, logits = runner_generate(
            runner_bin, ptes, out / "foundation.ptd", name, tmp_path / f"{name}.npy", "--max-new-tokens", str(NEW)
        )
        ref = hf_peft_logits(deployment["base"], deployment["root"] / name, PROMPT + tokens[:-1])[len(PROMPT) - 1 :]
        assert tokens == [int(i) for i in ref.argmax(-1)], name
        assert np.abs(logits[: len(tokens)] - ref.numpy()).max() <= 1e-4, name


def test_serve_through_one_program_equals_separate_processes(deployment, runner_bin):
    """a, b, a (and more) served by one runner process, one program bound to each adapter's tensors in
    turn, give each adapter's tokens from a process of its own; so does stock ExecuTorch (--stock:
    one Module per adapter file, its LoRA inputs fed from the file's named data). Sampled hot: the
    tiny adapters' greedy answers coincide, their samples do not."""
    out = deployment["out"]
    names = ["rank1_q", "all8_rslora", "rank1_q", "patterns", "first", "all8_rslora"]
    ptes = [arg for n in dict.fromkeys(names) for arg in ("--pte", str(out / f"{n}.pte"))]
    common = ["--ptd", str(out / "foundation.ptd"), "--max-new-tokens", str(NEW), "--temperature", "10", "--seed", "5"]
    lines = "".join(f"{n}\t{','.join(map(str, PROMPT))}\n" for n in names)
    for mode in ([], ["--stock"]):
        served = subprocess.run(
            [str(runner_bin), *ptes, *common, *mode, "--serve"],
            input=lines,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert served.returncode == 0, served.stderr
        answers = [json.loads(line) for line in served.stdout.splitlines()]
        assert [a["adapter"] for a in answers] == names
        for name, answer in zip(names, answers):
            alone = subprocess.run(
                [
                    str(runner_bin),
                    "--pte",
                    str(out / f"{name}.pte"),
                    *common,
                    *mode,
                    "--tokens",
                    ",".join(map(str, PROMPT)),
                    "--json",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert alone.returncode == 0, alone.stderr
            assert answer["tokens"] == json.loads(alone.stdout)["tokens"], (name, mode)
    assert len({tuple(a["tokens"]) for a in answers}) > 2, "the adapters should answer differently"


def test_rebuild_reuses_program_and_files(deployment, tmp_path):
    """A second build of an unchanged config keeps foundation.ptd, the program and every .pte."""
    build = deployment["build"]
    inodes = {p.name: p.stat().st_ino for p in build.out_dir.glob("*.pt[ed]")}
    again = lora_share.build(build.config, quiet=True)
    assert again["program"]["produced"] == "reused"
    assert [a["produced"] for a in again["adapters"]] == ["reused"]
    assert {p.name: p.stat().st_ino for p in build.out_dir.glob("*.pt[ed]")} == inodes


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """A deployment whose envelope is exactly q/v at rank 4."""
    root = tmp_path_factory.mktemp("narrow")
    _, config = write_deployment(root, None, {"qv": dict(r=4, alpha=8, targets=["q_proj", "v_proj"], seed=30)})
    return root, build_config(config)


@pytest.mark.parametrize(
    "spec,key",
    [
        (
            dict(r=8, alpha=8, targets=["q_proj"], seed=31),
            "its rank is 8 (on q_proj), above the envelope's largest, 4: raise lora_envelope.max_rank",
        ),
        (
            dict(r=2, alpha=8, targets=["k_proj"], seed=32),
            "it has LoRA on k_proj (layers 0-1), which the envelope does not take: add them to lora_envelope.targets",
        ),
    ],
)
def test_add_outside_the_envelope_is_refused_by_key(narrow, spec, key):
    root, build = narrow
    write_peft_lora(root / "wide", BASE, **spec)
    before = {p.name: p.read_bytes() for p in build.out_dir.iterdir() if p.is_file()}
    r = run_cli("add", "--to", build.out_dir, root / "wide")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    envelope = "outside the deployment's LoRA envelope (LoRA on q_proj, v_proj of layers 0-1, rank up to 4)"
    assert envelope in r.stderr and key in r.stderr
    # The folder being added to is the one named, with its own resolved config, not the original config.
    assert f"{build.out_dir} was built with this envelope" in r.stderr
    assert f"edit lora_envelope in {build.out_dir / 'config.resolved.yaml'}" in r.stderr
    assert {p.name: p.read_bytes() for p in build.out_dir.iterdir() if p.is_file()} == before


def test_add_reports_every_adapter_outside_the_envelope(narrow):
    root, build = narrow
    write_peft_lora(root / "wide_rank", BASE, r=8, alpha=8, targets=["q_proj"], seed=35)
    write_peft_lora(root / "wide_target", BASE, r=2, alpha=8, targets=["k_proj"], seed=36)
    r = run_cli("add", "--to", build.out_dir, root / "wide_rank", root / "wide_target")
    assert r.returncode == 2, r.stderr
    assert "adapter wide_rank: outside" in r.stderr and "raise lora_envelope.max_rank" in r.stderr
    assert "adapter wide_target: outside" in r.stderr and "add them to lora_envelope.targets" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_envelope_refusal_names_what_is_inside_and_what_is_not_in_words(narrow):
    """An adapter on every linear against a q/v envelope: the refusal says what the envelope takes and
    which linears (on which layers) and which rank lie outside it, not one slot and a count of the rest."""
    root, build = narrow
    write_peft_lora(root / "everywhere", BASE, r=6, alpha=8, targets=ALL, seed=37)
    r = run_cli("add", "--to", build.out_dir, root / "everywhere")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert (
        "adapter everywhere: outside the deployment's LoRA envelope (LoRA on q_proj, v_proj of layers 0-1, "
        "rank up to 4): it has LoRA on k_proj, o_proj, gate_proj, up_proj, down_proj (layers 0-1), which the "
        "envelope does not take: add them to lora_envelope.targets; its rank is 6 (on q_proj, v_proj), above "
        "the envelope's largest, 4: raise lora_envelope.max_rank;"
    ) in r.stderr
    assert "more)" not in r.stderr and "[" not in r.stderr.split(";")[0]


def test_build_refuses_an_adapter_outside_its_explicit_envelope(tmp_path):
    _, config = write_deployment(
        tmp_path,
        {"targets": ["q_proj"], "max_rank": 2},
        {"big": dict(r=4, alpha=8, targets=["q_proj", "v_proj"], seed=33)},
    )
    r = run_cli("build", config)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    # Found by the config's validation, before any export: both misfits at once.
    assert "big: rank 4 is above lora_envelope.max_rank (2)" in r.stderr
    assert "big: LoRA on v_proj, outside lora_envelope.targets [q_proj]" in r.stderr
    assert not (tmp_path / "out").exists()


def test_envelope_keys_are_validated(tmp_path):
    _, config = write_deployment(
        tmp_path,
        {"targets": ["q_prj"], "max_rank": 0, "layers": [5]},
        {"a": dict(r=2, alpha=4, targets=["q_proj"], seed=34)},
    )
    with pytest.raises(lora_share.errors.ConfigErrors) as e:
        lora_share.validate(config)
    problems = "\n".join(e.value.problems)
    assert "lora_envelope.targets[0]: 'q_prj' is not one of" in problems and "did you mean 'q_proj'" in problems
    assert "lora_envelope.max_rank: must be at least 1, got 0" in problems


def test_add_refuses_a_taken_name_and_a_missing_build(deployment, tmp_path):
    root, out = deployment["root"], deployment["out"]
    r = run_cli("add", "--to", out, f"first={root / 'rank1_q'}")
    assert r.returncode == 2 and "already has an adapter named 'first'" in r.stderr
    r = run_cli("add", "--to", tmp_path, root / "rank1_q")
    assert r.returncode == 2 and "manifest.json: missing" in r.stderr


def test_add_refuses_an_adapter_for_another_model(deployment):
    root, out = deployment["root"], deployment["out"]
    write_peft_lora(root / "other", hf_config(dim=96, heads=4, kv_heads=2), r=2, alpha=4, targets=["q_proj"])
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = run_cli("add", "--to", out, root / "other")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "do not fit the foundation" in r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert json.loads((out / "manifest.json").read_text()) == deployment["manifest"]


def test_add_reports_every_bad_adapter_at_once(deployment, tmp_path):
    """Two bad adapters in one add (a name already taken, a folder that is not there) and one that
    does not fit the foundation: all three named in one refusal, and nothing written."""
    root, out = deployment["root"], deployment["out"]
    write_peft_lora(root / "other2", hf_config(dim=96, heads=4, kv_heads=2), r=2, alpha=4, targets=["q_proj"])
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = run_cli(
        "add", "--to", out, f"first={root / 'rank1_q'}", f"nowhere={tmp_path / 'missing'}", f"other2={root / 'other2'}"
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "3 error(s)" in r.stderr, r.stderr
    assert "already has an adapter named 'first'" in r.stderr
    assert f"{tmp_path / 'missing'}: no such folder" in r.stderr
    assert "do not fit the foundation" in r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_add_tells_a_pt2_archive_which_deployment_takes_it(deployment, tmp_path):
    """A PT2 archive given to a deployment of adapters: the refusal says what the archive is, which kind
    of deployment takes it and which kind this one is; a plain file is told it is no PEFT folder."""
    out = deployment["out"]
    archive, other = tmp_path / "model.pt2", tmp_path / "notes.txt"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: the kind is refused before the archive is read
    other.write_text("x")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = run_cli("add", "--to", out, f"x={archive}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (
        f"error: {archive}: a PT2 archive, which `add` puts into a deployment of programs (built from a config "
        "with 'programs:'; `add` takes PT2 archives); "
        f"{out} is a deployment of adapters (built from a config with 'adapters:'; `add` takes PEFT folders)"
    )
    r = run_cli("add", "--to", out, f"y={other}")
    assert r.returncode == 2 and f"{other}: a file, not a PEFT adapter folder" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("name", ["bad name", ".hidden", "a/b", "x;rm", "base\n"])
def test_add_refuses_a_name_outside_the_safe_set(deployment, name):
    """Names become file stems and URL path parts: only letters, digits, '_', '.' and '-' (a letter or
    digit first), refused with that rule; a folder whose own name breaks it needs NAME=DIR."""
    root, out = deployment["root"], deployment["out"]
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = run_cli("add", "--to", out, f"{name}={root / 'rank1_q'}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"adapter name {name!r} must be letters, digits, '_', '.' or '-', starting with a letter or digit" in (
        r.stderr
    )
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    spaced = root / "my adapter"
    if not spaced.exists():
        shutil.copytree(root / "rank1_q", spaced)
    r = run_cli("add", "--to", out, spaced)
    assert r.returncode == 2 and "adapter name 'my adapter' must be" in r.stderr and "NAME=DIR" in r.stderr


@pytest.fixture(scope="module")
def skipping(deployment):
    """The envelope deployment rebuilt with lora_envelope.skip_absent (its program reused), then
    ADDED put in with `lora-share add`: every file carries the program minus its absent slots."""
    root, build = deployment["root"], deployment["build"]
    config = yaml.safe_load(build.config.read_text())
    config["output_dir"] = "skip_out"
    config["lora_envelope"]["skip_absent"] = True
    (root / "skip.yaml").write_text(yaml.safe_dump(config))
    shutil.copytree(build.out_dir, root / "skip_out")
    built = lora_share.build(root / "skip.yaml", quiet=True)
    r = run_cli("add", "--to", root / "skip_out", *[f"{n}={root / n}" for n in ADDED])
    assert r.returncode == 0, r.stderr
    return {"out": root / "skip_out", "built": built, "manifest": read_manifest(root / "skip_out")}


def test_skip_absent_reuses_the_program_and_rewrites_every_absent_slot(deployment, skipping):
    from lora_share.deploy.adapter_pte import read_record

    program = deployment["build"].manifest["program"]["sha256"]
    for m in (skipping["built"], skipping["manifest"]):
        assert m["program"]["produced"] == "reused" and m["program"]["sha256"] == program
        assert m["program"]["envelope"]["skip_absent"] is True
    variants = {}
    for a in skipping["manifest"]["adapters"]:
        record = read_record((skipping["out"] / a["file"]).read_bytes(), a["file"])
        absent = len(record.envelope) - len(record.lora)
        if absent == 0:  # all8_rslora: the envelope program itself
            assert (record.program_sha256, record.program_patches) == (program, [])
            continue
        # Five rewrites per absent slot in forward and in decode, seven in decode_batch: each slot's
        # nodes were found in the three lowered methods. The file's program already skips them: no table.
        assert record.envelope_program_sha256 == program and record.program_sha256 != program
        assert len(record.program_patches) == 4 * (5 + 5 + 7) * absent, a["name"]
        assert record.slot_patches == []
        variants[frozenset(e.slot for e in record.lora)] = record.program_sha256
    assert len(set(variants.values())) == len(variants) == len(ADDED)  # one variant per set of slots
    shown = run_cli("inspect", skipping["out"] / "rank1_q.pte")
    assert (
        shown.returncode == 0
        and f"which skips the others: envelope program {program[:16]} with 204 words" in shown.stdout
    ), shown.stdout


def test_skip_absent_variant_gives_the_envelope_program_back(deployment, skipping):
    from lora_share.deploy.adapter_pte import Program

    plain = Program.from_adapter_file(deployment["out"] / "first.pte")
    variant = Program.from_adapter_file(skipping["out"] / "first.pte")
    assert variant.sha256 == plain.sha256
    assert variant._template.write([]) == plain._template.write([])


def test_skip_absent_answers_as_the_envelope_program(deployment, skipping, runner_bin):
    """Every adapter gives the same logits through its variant as through the whole envelope program
    (Python runtime), and the same sampled tokens through the C++ runner serving all of them in one
    process, and through stock ExecuTorch (--stock)."""
    names = ["rank1_q", "all8_rslora", "rank1_q", "patterns", "first", "layer1_kd"]
    for name in dict.fromkeys(names):
        plain = lora_share.run(deployment["out"] / f"{name}.pte", deployment["out"] / "foundation.ptd", PROMPT, NEW)
        got = lora_share.run(skipping["out"] / f"{name}.pte", skipping["out"] / "foundation.ptd", PROMPT, NEW)
        assert got.tokens == plain.tokens and np.abs(got.logits - plain.logits).max() <= 1e-5, name
    lines = "".join(f"{n}\t{','.join(map(str, PROMPT))}\n" for n in names)
    for mode in ([], ["--stock"]):
        answers = []
        for out in (deployment["out"], skipping["out"]):
            ptes = [arg for n in dict.fromkeys(names) for arg in ("--pte", str(out / f"{n}.pte"))]
            served = subprocess.run(
                [
                    str(runner_bin),
                    *ptes,
                    "--ptd",
                    str(out / "foundation.ptd"),
                    "--max-new-tokens",
                    str(NEW),
                    "--temperature",
                    "10",
                    "--seed",
                    "5",
                    *mode,
                    "--serve",
                ],
                input=lines,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert served.returncode == 0, served.stderr
            answers.append([json.loads(line)["tokens"] for line in served.stdout.splitlines()])
        assert answers[0] == answers[1] and len(answers[0]) == len(names), mode


def test_program_patches_round_trip_and_refuse_a_damaged_file(deployment, skipping):
    from lora_share.deploy.adapter_pte import read_record
    from lora_share.formats.errors import FormatError
    from lora_share.formats.xnnpack_prune import Patch, apply

    data = (skipping["out"] / "rank1_q.pte").read_bytes()
    flat = read_record(data, "rank1_q").program_patches
    patches = [Patch(*flat[i : i + 4]) for i in range(0, len(flat), 4)]
    reverted = apply(data, "rank1_q", patches, revert=True)
    assert reverted != data and apply(reverted, "rank1_q", patches) == data
    with pytest.raises(FormatError, match="another value"):
        apply(data, "rank1_q", patches)  # already applied: the values it expects are not there
    with pytest.raises(FormatError, match="past segment"):
        apply(data, "rank1_q", [Patch(patches[0].segment, 1 << 30, 0, 0)])
