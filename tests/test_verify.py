"""Fingerprints, dedup and the tools that read them: verify, inspect, run, the C++ runner.

Two builds: ``tiny_build`` (foundation X: tied embeddings) and ``untied_build``
(foundation Y: the same shapes with untied embeddings and other weights, and two
adapters generated from one seed so that they share their first LoRA tensors).
"""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from conftest import TINY_FOUNDATION, build_config, run_cli, write_config
from mutations import FILE_DAMAGE, write_damaged

from lora_share.formats import read_ptd
from lora_share.formats.meta import ADAPTER_KEY, FOUNDATION_KEY

SHARING_ADAPTERS = [
    {"name": "share_p", "synthetic": {"rank": 4, "alpha": 8, "target_modules": ["q_proj"], "seed": 11}},
    {"name": "share_q", "synthetic": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "seed": 11}},
]


@pytest.fixture(scope="module")
def untied_build(tmp_path_factory):
    foundation = {**TINY_FOUNDATION, "tie_embeddings": False, "seed": 7}
    cfg = write_config(
        tmp_path_factory.mktemp("untied"), {"synthetic": foundation, "max_seq_len": 32}, SHARING_ADAPTERS
    )
    return build_config(cfg)


def one_error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def runner(runner_bin, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(runner_bin), *map(str, args)], capture_output=True, text=True, timeout=120)


# --- dedup ----------------------------------------------------------------------------


@pytest.mark.slow  # this file's own untied build
def test_tied_embedding_is_stored_once(tiny_build, untied_build):
    embedding = TINY_FOUNDATION["vocab_size"] * TINY_FOUNDATION["dim"] * 4
    tied, untied = read_ptd(tiny_build.ptd), read_ptd(untied_build.ptd)
    shared = [keys for keys in tied.keys_by_segment().values() if len(keys) > 1]
    # The plain tensor key and XNNPACK's sha256 key point at one segment.
    assert len(shared) == 1 and tied.entry(shared[0][0]).size == embedding
    assert untied.keys_by_segment() and all(len(k) == 1 for k in untied.keys_by_segment().values())
    diff = untied.size - tied.size
    print(
        f"\nPTD sizes: tied {tied.size:,} bytes, untied {untied.size:,} bytes, difference {diff:,} "
        f"(one embedding: {embedding:,})"
    )
    assert embedding <= diff <= embedding + 4096
    report = tiny_build.manifest["bytes"]["foundation"]
    assert report["shared"] == embedding and report["duplicate_avoided"] == embedding
    assert report["total"] == tied.size


@pytest.mark.slow  # this file's own untied build
def test_tensors_shared_by_adapters_are_reported(untied_build):
    from lora_share.checkpoints.adapters import load_adapter
    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import load_config
    from lora_share.deploy.byte_report import report_lines

    cfg = load_config(untied_build.config)
    args = load_foundation(cfg.foundation).args
    digests = {}
    for acfg in cfg.adapters:  # the bytes XNNPACK stores: A and scale * B, float32
        weights = load_adapter(acfg, args).weights.values()
        digests[acfg.name] = {hashlib.sha256(t.tobytes()).hexdigest() for ab in weights for t in ab}
    common = digests["share_p"] & digests["share_q"]
    assert len(common) >= 2  # one seed: layer 0 q_proj A and B at least

    report = untied_build.manifest["bytes"]
    across = report["across_adapters"]
    lora_tensor = 4 * TINY_FOUNDATION["dim"] * 4  # rank 4 x dim, float32
    assert {t["sha256"] for t in across["tensors"]} == common
    assert all(t["adapters"] == ["share_p", "share_q"] and t["size"] == lora_tensor for t in across["tensors"])
    assert across["shared"] == across["duplicate"] == len(common) * lora_tensor
    for name in ("share_p", "share_q"):
        a = report["adapters"][name]
        assert a["shared_with_other_adapters"] == len(common) * lora_tensor
        assert a["unique"] == a["stored"] - a["shared"] - a["shared_with_other_adapters"] > 0
    assert any("in several adapters" in line for line in report_lines(report))
    assert report["total"] == sum(f.stat().st_size for f in [untied_build.ptd, *untied_build.ptes.values()])


# --- verify, run and the runner on a mismatched pair ----------------------------------


def test_verify_accepts_the_pair_it_was_built_with(tiny_build):
    for pte in tiny_build.ptes.values():
        proc = run_cli("verify", "--pte", pte, "--ptd", tiny_build.ptd)
        assert proc.returncode == 0 and "compatible" in proc.stdout, proc.stderr


@pytest.mark.slow  # this file's own untied build
def test_mismatch_is_refused_everywhere(tiny_build, untied_build, runner_bin):
    pte, ptd = tiny_build.ptes["tiny_a"], untied_build.ptd
    x, y = tiny_build.manifest["foundation"]["fingerprint"], untied_build.manifest["foundation"]["fingerprint"]

    verify = run_cli("verify", "--pte", pte, "--ptd", ptd)
    assert verify.returncode == 1 and verify.stdout == ""
    assert all(s in verify.stderr for s in (x, y, str(pte), str(ptd), "lacks"))
    as_json = json.loads(run_cli("verify", "--pte", pte, "--ptd", ptd, "--json").stdout)
    assert not as_json["compatible"] and (as_json["adapter_fingerprint"], as_json["foundation_fingerprint"]) == (x, y)

    line = one_error_line(run_cli("run", "--pte", pte, "--ptd", ptd, "--tokens", "1,2", "--max-new-tokens", 2), 2)
    assert all(s in line for s in (x, y, str(pte), str(ptd), "--no-verify"))
    for mode in ([], ["--stock"]):
        line = one_error_line(runner(runner_bin, "--pte", pte, "--ptd", ptd, "--tokens", "1,2", *mode), 1)
        assert all(s in line for s in (x, y, str(pte), str(ptd), "--no-verify"))


@pytest.fixture(scope="module")
def wider_build(tmp_path_factory):
    """The tiny foundation at twice its width: each norm weight and the RoPE tables (the tensors the
    methods read from foundation.ptd outside XNNPACK) have other shapes than tiny_build's."""
    foundation = {**TINY_FOUNDATION, "dim": 2 * TINY_FOUNDATION["dim"]}
    cfg = write_config(
        tmp_path_factory.mktemp("wider"), {"synthetic": foundation, "max_seq_len": 32}, SHARING_ADAPTERS[:1]
    )
    return build_config(cfg)


@pytest.mark.slow  # this file's own wider build
def test_verify_says_each_problem_once(tiny_build, wider_build):
    """Every method of the program (forward, decode, decode_batch) reads the same foundation keys: a
    key the .ptd holds in another shape is one problem, printed once, not once per method."""
    from lora_share.formats import read_pte

    pte, ptd = tiny_build.ptes["tiny_a"], wider_build.ptd
    verify = run_cli("verify", "--pte", pte, "--ptd", ptd)
    assert verify.returncode == 1, verify.stderr
    lines = verify.stderr.strip().splitlines()
    assert len(lines) == len(set(lines)), verify.stderr
    # The keys whose shape differs, from the two files as written.
    held = {e.key: list(e.layout.sizes) for e in read_ptd(ptd).entries if e.layout is not None}
    tensors = read_pte(pte).external_tensors
    wanted = {t.key: list(t.layout.sizes) for t in tensors}
    assert len(tensors) >= 3 * len(wanted)  # forward, decode and decode_batch each name every key
    differ = {k for k, sizes in wanted.items() if k in held and held[k] != sizes}
    assert len(differ) >= 5, differ  # the norms of both layers, the final norm, RoPE's cos and sin
    shape_lines = [line for line in lines if " as " in line and " expects " in line]
    assert sorted(line.split(" holds ")[1].split(" as ")[0] for line in shape_lines) == sorted(differ)


@pytest.mark.slow  # this file's own untied build
def test_no_verify_lets_the_load_fail_or_run(tiny_build, untied_build, runner_bin):
    pte, ptd = tiny_build.ptes["tiny_a"], untied_build.ptd
    line = one_error_line(run_cli("run", "--pte", pte, "--ptd", ptd, "--tokens", "1,2", "--no-verify"), 2)
    assert "could not load" in line
    for mode in ([], ["--stock"]):
        one_error_line(runner(runner_bin, "--pte", pte, "--ptd", ptd, "--tokens", "1,2", "--no-verify", *mode), 1)
    # Files from one build still run with the check off.
    ok = runner(runner_bin, "--pte", pte, "--ptd", tiny_build.ptd, "--tokens", "1,2", "--no-verify")
    assert ok.returncode == 0, ok.stderr


# --- inspect --------------------------------------------------------------------------


def test_inspect_reads_back_what_build_wrote(tiny_build):
    from lora_share.checkpoints.foundation import load_foundation
    from lora_share.config import load_config

    manifest = tiny_build.manifest
    proc = run_cli("inspect", tiny_build.ptd, "--json")
    assert proc.returncode == 0, proc.stderr
    ptd = json.loads(proc.stdout)
    assert ptd["kind"] == "ptd" and ptd["size"] == manifest["foundation"]["size"]
    assert ptd["foundation"]["fingerprint"] == manifest["foundation"]["fingerprint"]
    assert ptd["foundation"]["parameter_count"] == manifest["foundation"]["parameters"]
    assert ptd["dedup"]["duplicate_avoided_bytes"] == manifest["bytes"]["foundation"]["duplicate_avoided"]

    foundation = load_foundation(load_config(tiny_build.config).foundation)
    tensors = dict(foundation.tensors)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]  # tied
    data = read_ptd(tiny_build.ptd)
    compared = 0
    for e in ptd["named_data"]:
        raw = data.data(e["key"])
        if e["key"] in tensors:
            t = tensors[e["key"]]
            assert (e["dtype"], e["shape"]) == ("float32", list(t.shape)), e["key"]
            assert raw == t.contiguous().numpy().tobytes(), e["key"]
            compared += 1
        elif len(e["key"]) == 64:
            assert hashlib.sha256(raw).hexdigest() == e["key"]
    assert compared >= 6

    for entry in manifest["adapters"]:
        proc = run_cli("inspect", tiny_build.ptes[entry["name"]], "--ptd", tiny_build.ptd, "--json")
        assert proc.returncode == 0, proc.stderr
        pte = json.loads(proc.stdout)
        assert pte["size"] == entry["size"]
        assert pte["methods"] == [
            "decode",
            "decode_batch",
            "forward",
            "get_max_seq_len",
            "get_vocab_size",
            "get_prefill_chunk",
        ]
        a = pte["adapter"]
        assert (a["name"], a["rank"], a["alpha"], a["targets"], a["layers"], a["lora_bytes"]) == (
            entry["name"],
            entry["rank"],
            entry["alpha"],
            entry["targets"],
            entry["layers"],
            entry["lora_bytes"],
        )
        assert a["foundation_fingerprint"] == manifest["foundation"]["fingerprint"]
        # LoRA weights are forward's inputs: the .pte's own named data is its record and its LoRA
        # tensors, each under the sha256 of its bytes, as its record names them; XNNPACK's own
        # weights are all the foundation's.
        keys = {k for s in entry["lora"] for k in (s["a"], s["b"])}
        assert {e["key"] for e in pte["named_data"]} == {ADAPTER_KEY} | keys and pte["delegate_keys_in_file"] == []
        assert {(s["layer"], s["target"], s["rank"], s["a"], s["b"]) for s in entry["lora"]} == {
            (*a["envelope"][s["slot"]], s["rank"], s["a"], s["b"]) for s in a["lora"]
        }
        assert pte["ptd"] == {
            "file": str(tiny_build.ptd),
            "shared_file": None,
            "has_all_keys": True,
            "missing": [],
            "compatible": True,
            "problems": [],
        }
        assert FOUNDATION_KEY not in pte["needs"] and len(pte["needs"]) > len(pte["external_tensors"])


@pytest.mark.slow  # this file's own untied build
def test_inspect_text_and_other_ptd(tiny_build, untied_build):
    pte = tiny_build.ptes["tiny_a"]
    text = run_cli("inspect", pte, "--ptd", untied_build.ptd)
    assert text.returncode == 0, text.stderr
    assert "compatible: no" in text.stdout and "missing" in text.stdout
    assert tiny_build.manifest["foundation"]["fingerprint"] in text.stdout
    report = json.loads(run_cli("inspect", pte, "--ptd", untied_build.ptd, "--json").stdout)
    assert not report["ptd"]["has_all_keys"] and report["ptd"]["missing"]
    ptd_text = run_cli("inspect", untied_build.ptd).stdout
    assert "untied embeddings" in ptd_text and FOUNDATION_KEY in ptd_text


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_help_has_examples(command):
    proc = run_cli(command, "--help")
    assert proc.returncode == 0 and "example" in proc.stdout and f"lora-share {command} " in proc.stdout


# --- hostile files in every tool ------------------------------------------------------


@pytest.mark.parametrize("damage", FILE_DAMAGE)
@pytest.mark.parametrize("which", ["ptd", "pte"])
def test_damaged_files_give_one_error_line(tiny_build, runner_bin, tmp_path, damage, which):
    good_pte, good_ptd = tiny_build.ptes["tiny_a"], tiny_build.ptd
    bad = tmp_path / f"bad.{which}"
    write_damaged(bad, (good_ptd if which == "ptd" else good_pte).read_bytes(), damage)
    pte, ptd = (good_pte, bad) if which == "ptd" else (bad, good_ptd)
    assert str(bad) in one_error_line(run_cli("inspect", bad), 2)
    assert str(bad) in one_error_line(run_cli("verify", "--pte", pte, "--ptd", ptd), 2)
    assert str(bad) in one_error_line(run_cli("run", "--pte", pte, "--ptd", ptd, "--tokens", "1"), 2)
    assert str(bad) in one_error_line(runner(runner_bin, "--pte", pte, "--ptd", ptd, "--tokens", "1"), 1)


def test_flipped_lora_weight_is_refused(tiny_build, runner_bin, tmp_path):
    """The .pte's seal covers its LoRA weights: one flipped bit is refused before loading."""
    from lora_share.formats import read_pte

    src = tiny_build.ptes["tiny_a"]
    data = bytearray(src.read_bytes())
    weight = max(read_pte(src).constants, key=lambda c: c.layout.nbytes)  # a LoRA weight
    data[weight.start + 3] ^= 0x10
    bad = tmp_path / "tiny_a.pte"
    bad.write_bytes(bytes(data))
    for proc, code in (
        (run_cli("verify", "--pte", bad, "--ptd", tiny_build.ptd), 2),
        (run_cli("run", "--pte", bad, "--ptd", tiny_build.ptd, "--tokens", "1", "--no-verify"), 2),
        (runner(runner_bin, "--pte", bad, "--ptd", tiny_build.ptd, "--tokens", "1", "--no-verify"), 1),
    ):
        assert "damaged" in one_error_line(proc, code)
    assert "damaged" in run_cli("inspect", bad).stdout
