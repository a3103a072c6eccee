"""The C++ runner (build/runner) against the Python runtime and its own contract.

Every adapter of one build is loaded into ONE runner process (the point of the
runner); answers must equal `lora_share.runtime.run` on the same files: greedy
tokens exactly, logits to 1e-4. Errors must be one `error: ...` line and exit
code 1 (load/run) or 2 (usage), never a signal or a hang.

Fixtures (tests/conftest.py): `runner_bin` (path of the built runner) and
`tiny_build` (`.ptd`, `.ptes` name -> path, at least two adapters).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

PROMPT = [1, 17, 42]
NEW = 8
TIMEOUT = 120  # seconds; a hang fails the test instead of the session


def run_runner(runner_bin, *args, input=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(runner_bin), *map(str, args)], capture_output=True, text=True, input=input, timeout=TIMEOUT, env=env
    )


def all_ptes(tiny_build) -> list[str]:
    args = []
    for path in tiny_build.ptes.values():
        args += ["--pte", path]
    return args


def ids(tokens) -> str:
    return ",".join(map(str, tokens))


def assert_clean_error(proc: subprocess.CompletedProcess, code: int) -> None:
    """One `error:` line, the expected exit code, no signal."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr


@pytest.fixture(scope="module")
def python_reference(tiny_build):
    """name -> Generation from ExecuTorch's Python runtime, greedy."""
    from lora_share.inference.python_runtime import run

    return {name: run(pte, tiny_build.ptd, PROMPT, NEW) for name, pte in tiny_build.ptes.items()}


@pytest.fixture(scope="module")
def vocab_and_len(runner_bin, tiny_build):
    first = next(iter(tiny_build.ptes.values()))
    proc = run_runner(
        runner_bin, "--pte", first, "--ptd", tiny_build.ptd, "--tokens", "1", "--max-new-tokens", 1, "--json"
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    return out["vocab_size"], out["max_seq_len"]


# --- answers --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [[], ["--no-weight-cache"], ["--stock"]], ids=["shared", "no-cache", "stock"])
def test_every_adapter_matches_python(runner_bin, tiny_build, python_reference, tmp_path, mode):
    assert len(tiny_build.ptes) >= 2
    for name in tiny_build.ptes:
        npy = tmp_path / f"{name}.npy"
        proc = run_runner(
            runner_bin,
            *all_ptes(tiny_build),
            "--ptd",
            tiny_build.ptd,
            "--tokens",
            ids(PROMPT),
            "--max-new-tokens",
            NEW,
            "--adapter",
            name,
            "--dump-logits",
            npy,
            *mode,
        )
        assert proc.returncode == 0, proc.stderr
        ref = python_reference[name]
        assert [int(t) for t in proc.stdout.split()] == ref.tokens, name
        logits = np.load(npy)
        assert logits.dtype == np.float32 and logits.shape == ref.logits.shape, name
        assert np.abs(logits - ref.logits).max() <= 1e-4, name


def test_adapters_really_differ(python_reference):
    """Otherwise the test above could not tell adapters apart."""
    rows = [g.logits for g in python_reference.values()]
    assert any(np.abs(rows[0] - r).max() > 1e-4 for r in rows[1:])


def test_serve_answers_as_separate_processes(runner_bin, tiny_build):
    a, b = list(tiny_build.ptes)[:2]
    requests = [(a, [1, 17, 42]), (b, [1, 17, 42]), (a, [5, 6]), (b, [1, 17, 42, 9]), (a, [1, 17, 42])]
    for temperature in ("0", "0.8"):
        flags = ["--max-new-tokens", NEW, "--temperature", temperature, "--seed", 7]
        lines = "".join(f"{n}\t{ids(t)}\n" for n, t in requests)
        served = run_runner(runner_bin, *all_ptes(tiny_build), "--ptd", tiny_build.ptd, "--serve", *flags, input=lines)
        assert served.returncode == 0, served.stderr
        answers = [json.loads(line) for line in served.stdout.splitlines()]
        assert len(answers) == len(requests)
        for (name, prompt), answer in zip(requests, answers):
            alone = run_runner(
                runner_bin,
                "--pte",
                tiny_build.ptes[name],
                "--ptd",
                tiny_build.ptd,
                "--tokens",
                ids(prompt),
                "--json",
                *flags,
            )
            assert alone.returncode == 0, alone.stderr
            assert answer["adapter"] == name
            assert answer["tokens"] == json.loads(alone.stdout)["tokens"], (name, prompt, temperature)
            for key in ("prefill_ms", "decode_ms", "prefill_tokens_per_s", "decode_tokens_per_s"):
                assert key in answer


def test_serve_bad_lines_get_error_and_serving_continues(runner_bin, tiny_build, vocab_and_len):
    vocab, max_len = vocab_and_len
    a = next(iter(tiny_build.ptes))
    lines = [
        "no-tab-here",
        "nosuchadapter\t1,2",
        f"{a}\t1,x",
        f"{a}\t",
        f"{a}\t{vocab}",
        f"{a}\t{ids(range(1, max_len + 1))}",
        f"{a}\t1,17,42",
    ]
    proc = run_runner(
        runner_bin,
        *all_ptes(tiny_build),
        "--ptd",
        tiny_build.ptd,
        "--serve",
        "--max-new-tokens",
        4,
        input="\n".join(lines) + "\n",
    )
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == len(lines)
    assert all(set(o) == {"error"} and o["error"] for o in out[:-1]), out
    assert out[-1]["adapter"] == a and len(out[-1]["tokens"]) == 4


def test_json_report(runner_bin, tiny_build):
    proc = run_runner(
        runner_bin,
        *all_ptes(tiny_build),
        "--ptd",
        tiny_build.ptd,
        "--tokens",
        ids(PROMPT),
        "--max-new-tokens",
        4,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["adapter"] == next(iter(tiny_build.ptes)) and len(out["tokens"]) == 4
    for key in ("load_ms", "prefill_ms", "decode_ms", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert isinstance(out[key], (int, float)), key
    for when in ("after_load", "end"):
        mem = out["memory"][when]
        for key in ("rss_kb", "pss_kb", "anon_kb", "file_kb"):
            assert isinstance(mem[key], int) and mem[key] > 0, (when, key)
        assert mem["pss_kb"] <= mem["rss_kb"]
    assert out["loading"]["mode"] == "shared" and out["loading"]["weight_cache"] is True
    assert out["loading"]["arena"] == "shared" and out["loading"]["planned_bytes"] > 0
    assert 1 <= out["prefill_chunk"] <= out["max_seq_len"]
    assert [a["name"] for a in out["adapters"]] == list(tiny_build.ptes)


def test_xnnpack_reshapes_only_when_an_input_changes_shape(runner_bin, tiny_build, tmp_path):
    """The library answers XNNPACK's per-call re-plan at once when no input changed shape
    (runtime/platform/xnnpack_reshape.h): a prompt over two prefill chunks (forward's inputs change shape
    between them) then decoded tokens give the same logits, bit for bit, as re-planning every call,
    with fewer re-plans run. Every draft verified: how many drafts pay for a step is timed, so the two
    runs could otherwise run different steps (and count different calls)."""
    first = next(iter(tiny_build.ptes.values()))
    probe = json.loads(
        run_runner(
            runner_bin, "--pte", first, "--ptd", tiny_build.ptd, "--tokens", "1", "--max-new-tokens", 1, "--json"
        ).stdout
    )
    prompt = [1 + i % 50 for i in range(probe["prefill_chunk"] + 3)]
    runs = {}
    for mode in ("skip", "every-call"):
        npy = tmp_path / f"{mode}.npy"
        proc = run_runner(
            runner_bin,
            "--pte",
            first,
            "--ptd",
            tiny_build.ptd,
            "--tokens",
            ids(prompt),
            "--max-new-tokens",
            NEW,
            "--ignore-eos",
            "--every-draft",
            "--dump-logits",
            npy,
            "--json",
            env={**os.environ, "LORA_SHARE_XNNPACK_RESHAPE": mode},
        )
        assert proc.returncode == 0, proc.stderr
        runs[mode] = (json.loads(proc.stdout)["xnnpack_reshapes"], np.load(npy))
    (skip, skip_logits), (every, every_logits) = runs["skip"], runs["every-call"]
    assert np.array_equal(skip_logits, every_logits)
    assert every["skipped"] == 0 and every["run"] == skip["run"] + skip["skipped"]
    # Every decoded token after the first re-plans nothing: one call per delegate each.
    assert skip["skipped"] >= NEW - 2 and skip["run"] < every["run"]


def test_help_lists_every_flag_with_default(runner_bin):
    proc = run_runner(runner_bin, "--help")
    assert proc.returncode == 0
    for flag in (
        "--pte",
        "--ptd",
        "--tokens",
        "--max-new-tokens",
        "--temperature",
        "--seed",
        "--adapter",
        "--serve",
        "--dump-logits",
        "--json",
        "--packed-cache",
        "--no-packed-cache",
        "--no-weight-cache",
        "--stock",
        "--private-arenas",
        "--threads",
        "--no-huge-pages",
    ):
        line = next(
            (ln for ln in proc.stdout.splitlines() if ln.strip().startswith(flag + " ") or ln.strip() == flag), None
        )
        assert line is not None and "[default:" in line, flag
    assert "[default: 16]" in proc.stdout


# --- errors ---------------------------------------------------------------------------


def rewrite_ptd(src: Path, dst: Path, keep=lambda key: True, shrink: bool = False) -> Path:
    """A foundation.ptd variant: some keys dropped, or named tensors with other shapes."""
    import dataclasses

    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(src.read_bytes()))
    buffers, named = list(payload.buffers), {}
    for key, entry in payload.named_data.items():
        if not keep(key):
            continue
        if shrink and entry.tensor_layout is not None:
            layout = entry.tensor_layout
            sizes = list(layout.sizes)
            sizes[0] = max(1, sizes[0] // 2)
            buffers.append(buffers[entry.buffer_index][: len(buffers[entry.buffer_index]) // 2])
            entry = DataEntry(
                buffer_index=len(buffers) - 1, alignment=16, tensor_layout=dataclasses.replace(layout, sizes=sizes)
            )
        named[key] = entry
    dst.write_bytes(bytes(FlatTensorSerializer().serialize(DataPayload(buffers=buffers, named_data=named))))
    return dst


def is_content_hash(key: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{64}", key) is not None


@pytest.mark.parametrize("mode", [[], ["--stock"]], ids=["shared", "stock"])
@pytest.mark.parametrize(
    "case",
    [
        "missing-pte",
        "missing-ptd",
        "pte-as-ptd",
        "ptd-as-pte",
        "ptd-without-xnnpack-weights",
        "ptd-without-named-weights",
        "ptd-other-shapes",
        "empty-ptd",
        "truncated-ptd",
    ],
)
def test_load_errors(runner_bin, tiny_build, tmp_path, case, mode):
    pte = next(iter(tiny_build.ptes.values()))
    ptd = tiny_build.ptd
    if case == "missing-pte":
        pte = tmp_path / "nope.pte"
    elif case == "missing-ptd":
        ptd = tmp_path / "nope.ptd"
    elif case == "pte-as-ptd":
        ptd = pte
    elif case == "ptd-as-pte":
        pte = ptd
    elif case == "ptd-without-xnnpack-weights":
        ptd = rewrite_ptd(ptd, tmp_path / "f.ptd", keep=lambda k: not is_content_hash(k))
    elif case == "ptd-without-named-weights":
        # Keeps lora-share's foundation record, so the fingerprint check passes and the load itself fails.
        ptd = rewrite_ptd(ptd, tmp_path / "f.ptd", keep=lambda k: is_content_hash(k) or k == "lora_share.foundation")
    elif case == "ptd-other-shapes":
        ptd = rewrite_ptd(ptd, tmp_path / "f.ptd", shrink=True)
    elif case == "empty-ptd":
        ptd = rewrite_ptd(ptd, tmp_path / "f.ptd", keep=lambda k: False)
    elif case == "truncated-ptd":
        ptd = tmp_path / "f.ptd"
        ptd.write_bytes(tiny_build.ptd.read_bytes()[:4096])
    proc = run_runner(runner_bin, "--pte", pte, "--ptd", ptd, "--tokens", "1,2", *mode)
    assert_clean_error(proc, 1)
    if case.startswith("ptd-without") and not mode:
        # The shared path names the missing weights and both files.
        assert "does not have" in proc.stderr and str(pte) in proc.stderr and str(ptd) in proc.stderr


@pytest.mark.parametrize(
    "case",
    [
        "bad-token",
        "unknown-flag",
        "unknown-adapter",
        "token-ge-vocab",
        "too-long",
        "zero-new-tokens",
        "negative-temperature",
        "no-ptd",
        "no-pte",
        "no-tokens",
        "missing-value",
        "same-stem-twice",
        "every-draft-and-no-speculation",
    ],
)
def test_usage_errors(runner_bin, tiny_build, vocab_and_len, case):
    vocab, max_len = vocab_and_len
    base = [*all_ptes(tiny_build), "--ptd", tiny_build.ptd]
    args = {
        "bad-token": [*base, "--tokens", "1,x"],
        "unknown-flag": [*base, "--tokens", "1", "--frobnicate"],
        "unknown-adapter": [*base, "--tokens", "1", "--adapter", "no_such_adapter"],
        "token-ge-vocab": [*base, "--tokens", f"1,{vocab}"],
        "too-long": [*base, "--tokens", "1,2,3", "--max-new-tokens", max_len - 1],
        "zero-new-tokens": [*base, "--tokens", "1", "--max-new-tokens", "0"],
        "negative-temperature": [*base, "--tokens", "1", "--temperature", "-1"],
        "no-ptd": [*all_ptes(tiny_build), "--tokens", "1"],
        "no-pte": ["--ptd", tiny_build.ptd, "--tokens", "1"],
        "no-tokens": base,
        "missing-value": [*base, "--tokens"],
        "same-stem-twice": [*base, "--pte", next(iter(tiny_build.ptes.values())), "--tokens", "1"],
        "every-draft-and-no-speculation": [*base, "--tokens", "1", "--every-draft", "--no-speculation"],
    }[case]
    assert_clean_error(run_runner(runner_bin, *args), 2)


def test_longest_request_that_fits_runs(runner_bin, tiny_build, vocab_and_len):
    """The bound in the too-long case above is exact, not off by one."""
    _, max_len = vocab_and_len
    proc = run_runner(
        runner_bin, *all_ptes(tiny_build), "--ptd", tiny_build.ptd, "--tokens", "1,2,3", "--max-new-tokens", max_len - 2
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split()) == max_len - 2
