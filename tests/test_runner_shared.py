"""The C++ runner on a build that hoists shared adapter tensors (``dedup.shared_adapter_tensors: hoist``).

``hoisted_build`` (tests/conftest.py, HOIST_ADAPTERS): h_a, h_b and h_c read some LoRA tensors
from adapters_shared.ptd instead of their own .pte; h_d shares nothing. The runner maps
foundation.ptd and adapters_shared.ptd once each and resolves every adapter against one map over
both (ExecuTorch's MergedDataMap). Its answers must equal ``lora-share run --shared-ptd`` on the
same files: greedy tokens exactly, logits to 1e-4, in every loading mode and with all four adapters
in one process. Errors are one ``error: ...`` line with exit code 1 (load) or 2 (usage), never a
signal.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from mutations import FILE_DAMAGE, damaged, write_damaged
from test_cpp_runner import NEW, PROMPT, TIMEOUT, assert_clean_error, ids, rewrite_ptd, run_runner

from lora_share.formats import read_ptd, read_pte

HOISTING = ["h_a", "h_b", "h_c"]  # the adapters that read from adapters_shared.ptd
MODES = {"shared": [], "no-cache": ["--no-weight-cache"], "stock": ["--stock"], "one-thread": ["--threads", "1"]}


def pte_args(build) -> list:
    args = []
    for path in build.ptes.values():
        args += ["--pte", path]
    return args


def data_args(build) -> list:
    return ["--ptd", build.ptd, "--shared-ptd", build.shared_ptd]


def hoisted_keys(build, name: str) -> set[str]:
    """The content keys adapter ``name`` reads from adapters_shared.ptd, as the manifest says."""
    entry = next(a for a in build.manifest["adapters"] if a["name"] == name)
    return set(entry["hoisted"])


def one_error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    assert_clean_error(proc, code)
    return proc.stderr.strip()


@pytest.fixture(scope="module")
def cli_reference(hoisted_build, tmp_path_factory):
    """name -> (tokens, logits) from ``lora-share run --shared-ptd`` (ExecuTorch's Python runtime)."""
    folder = tmp_path_factory.mktemp("reference")
    out = {}
    for name, pte in hoisted_build.ptes.items():
        npy = folder / f"{name}.npy"
        proc = run_cli(
            "run",
            "--pte",
            pte,
            *data_args(hoisted_build),
            "--tokens",
            ids(PROMPT),
            "--max-new-tokens",
            NEW,
            "--json",
            "--dump-logits",
            npy,
        )
        assert proc.returncode == 0, proc.stderr
        out[name] = (json.loads(proc.stdout)["tokens"], np.load(npy))
    return out


# --- what the other tests rely on -----------------------------------------------------


def test_build_hoists_tensors_out_of_the_programs(hoisted_build):
    """h_a..h_c really read tensors only adapters_shared.ptd has; h_d reads none."""
    shared, foundation = read_ptd(hoisted_build.shared_ptd), read_ptd(hoisted_build.ptd)
    for name, pte in hoisted_build.ptes.items():
        keys = hoisted_keys(hoisted_build, name)
        assert bool(keys) == (name in HOISTING), name
        own = {e.key for e in read_pte(pte).named_data}
        assert all(k in shared and k not in foundation and k not in own for k in keys), name


def test_hoisted_adapters_really_differ(cli_reference):
    """Otherwise the comparisons below could not tell adapters apart."""
    rows = [logits for _, logits in cli_reference.values()]
    assert all(np.abs(rows[i] - rows[j]).max() > 1e-4 for i in range(len(rows)) for j in range(i))


# --- answers --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))
def test_every_hoisted_adapter_matches_python(runner_bin, hoisted_build, cli_reference, tmp_path, mode):
    """All four adapters loaded in one process over the two data files; each answers as Python does."""
    for name in hoisted_build.ptes:
        npy = tmp_path / f"{name}.npy"
        proc = run_runner(
            runner_bin,
            *pte_args(hoisted_build),
            *data_args(hoisted_build),
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
        tokens, ref = cli_reference[name]
        assert [int(t) for t in proc.stdout.split()] == tokens, name
        logits = np.load(npy)
        assert logits.dtype == np.float32 and logits.shape == ref.shape, name
        assert np.abs(logits - ref).max() <= 1e-4, name


@pytest.mark.parametrize("mode", [MODES["shared"], MODES["stock"]], ids=["shared", "stock"])
def test_serve_answers_as_separate_processes(runner_bin, hoisted_build, mode):
    requests = [
        ("h_a", [1, 17, 42]),
        ("h_b", [1, 17, 42]),
        ("h_c", [5, 6]),
        ("h_d", [1, 17, 42, 9]),
        ("h_a", [5, 6]),
        ("h_c", [1, 17, 42]),
    ]
    for temperature in ("0", "0.8"):
        flags = ["--max-new-tokens", NEW, "--temperature", temperature, "--seed", 7, *mode]
        lines = "".join(f"{n}\t{ids(t)}\n" for n, t in requests)
        served = run_runner(
            runner_bin, *pte_args(hoisted_build), *data_args(hoisted_build), "--serve", *flags, input=lines
        )
        assert served.returncode == 0, served.stderr
        answers = [json.loads(line) for line in served.stdout.splitlines()]
        assert len(answers) == len(requests)
        for (name, prompt), answer in zip(requests, answers):
            alone = run_runner(
                runner_bin,
                "--pte",
                hoisted_build.ptes[name],
                *data_args(hoisted_build),
                "--tokens",
                ids(prompt),
                "--json",
                *flags,
            )
            assert alone.returncode == 0, alone.stderr
            assert answer["adapter"] == name
            assert answer["tokens"] == json.loads(alone.stdout)["tokens"], (name, prompt, temperature)


@pytest.mark.parametrize("mode", [MODES["shared"], MODES["stock"]], ids=["shared", "stock"])
def test_shared_ptd_is_harmless_to_other_adapters(runner_bin, tiny_build, hoisted_build, tmp_path, mode):
    """A shared file whose keys a program does not need (or holds itself) changes nothing."""
    for name, pte in tiny_build.ptes.items():
        runs = []
        for extra in ([], ["--shared-ptd", hoisted_build.shared_ptd]):
            npy = tmp_path / f"{name}{len(extra)}.npy"
            proc = run_runner(
                runner_bin,
                "--pte",
                pte,
                "--ptd",
                tiny_build.ptd,
                *extra,
                "--tokens",
                ids(PROMPT),
                "--max-new-tokens",
                NEW,
                "--dump-logits",
                npy,
                *mode,
            )
            assert proc.returncode == 0, proc.stderr
            runs.append((proc.stdout, np.load(npy)))
        assert runs[0][0] == runs[1][0], name
        assert np.array_equal(runs[0][1], runs[1][1]), name


# --- report and memory ----------------------------------------------------------------


def test_json_and_summary_name_the_shared_file(runner_bin, hoisted_build):
    base = [
        *pte_args(hoisted_build),
        "--ptd",
        hoisted_build.ptd,
        "--adapter",
        "h_d",
        "--tokens",
        ids(PROMPT),
        "--max-new-tokens",
        4,
    ]
    with_shared = run_runner(runner_bin, *base, "--shared-ptd", hoisted_build.shared_ptd, "--json")
    assert with_shared.returncode == 0, with_shared.stderr
    out = json.loads(with_shared.stdout)
    assert out["shared_ptd"] == str(hoisted_build.shared_ptd) and out["ptd"] == str(hoisted_build.ptd)
    assert [a["name"] for a in out["adapters"]] == list(hoisted_build.ptes)
    for when in ("after_load", "end"):
        assert all(out["memory"][when][k] > 0 for k in ("rss_kb", "pss_kb", "file_kb")), when

    # h_d needs nothing from the shared file, so it runs without it; the report says so.
    alone = run_runner(
        runner_bin,
        "--pte",
        hoisted_build.ptes["h_d"],
        "--ptd",
        hoisted_build.ptd,
        "--tokens",
        ids(PROMPT),
        "--max-new-tokens",
        4,
        "--json",
    )
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["shared_ptd"] is None

    text = run_runner(runner_bin, *base, "--shared-ptd", hoisted_build.shared_ptd)
    assert text.returncode == 0 and str(hoisted_build.shared_ptd) in text.stderr, text.stderr


def open_descriptors(runner_bin, build, mode) -> dict[str, int]:
    """Path -> how many descriptors a serving runner with every adapter loaded holds on it.

    MmapDataLoader keeps its file open for as long as it lives, so this counts the
    loaders (each mapping its file) that the process holds, without timing anything.
    """
    args = [
        str(runner_bin),
        *map(str, pte_args(build)),
        *map(str, data_args(build)),
        "--serve",
        "--max-new-tokens",
        "2",
        *mode,
    ]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("h_a\t1,2\n")
        proc.stdin.flush()
        answer = proc.stdout.readline()  # loading is over once the first answer is out
        counts: dict[str, int] = {}
        fd_dir = Path(f"/proc/{proc.pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            counts[target] = counts.get(target, 0) + 1
    finally:
        _, err = proc.communicate("", timeout=TIMEOUT)
    assert proc.returncode == 0 and json.loads(answer)["adapter"] == "h_a", err
    return counts


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_shared_file_is_mapped_once_for_all_adapters(runner_bin, hoisted_build):
    shared, foundation = str(hoisted_build.shared_ptd.resolve()), str(hoisted_build.ptd.resolve())
    n = len(hoisted_build.ptes)
    one_map = open_descriptors(runner_bin, hoisted_build, [])
    assert (one_map.get(shared), one_map.get(foundation)) == (1, 1), one_map
    # Stock ExecuTorch, for contrast: every Module opens foundation.ptd itself; the LoRA tensors are
    # inputs the runner reads (adapters_shared.ptd once), not data the programs resolve.
    per_module = open_descriptors(runner_bin, hoisted_build, ["--stock"])
    assert (per_module.get(shared), per_module.get(foundation)) == (1, n), per_module


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [MODES["shared"], MODES["stock"]], ids=["shared", "stock"])
def test_hoisted_adapter_without_shared_ptd_names_the_fix(runner_bin, hoisted_build, mode):
    for name in HOISTING:
        pte = hoisted_build.ptes[name]
        line = one_error_line(
            run_runner(runner_bin, "--pte", pte, "--ptd", hoisted_build.ptd, "--tokens", "1,2", *mode), 1
        )
        assert all(s in line for s in ("--shared-ptd", "adapters_shared.ptd", str(pte), str(hoisted_build.ptd)))
        assert any(key in line for key in hoisted_keys(hoisted_build, name)), line
    # Loaded with others, the one that lacks its tensors is named.
    line = one_error_line(
        run_runner(
            runner_bin,
            "--pte",
            hoisted_build.ptes["h_d"],
            "--pte",
            hoisted_build.ptes["h_b"],
            "--ptd",
            hoisted_build.ptd,
            "--tokens",
            "1,2",
            *mode,
        ),
        1,
    )
    assert str(hoisted_build.ptes["h_b"]) in line and "--shared-ptd" in line


def test_shared_ptd_without_ptd_is_a_usage_error(runner_bin, hoisted_build):
    line = one_error_line(
        run_runner(
            runner_bin, "--pte", hoisted_build.ptes["h_a"], "--shared-ptd", hoisted_build.shared_ptd, "--tokens", "1,2"
        ),
        2,
    )
    assert "--shared-ptd" in line and "--ptd" in line.replace("--shared-ptd", "")


def shrink_blob(src: Path, dst: Path, key: str) -> Path:
    """A copy of a .ptd whose entry ``key`` keeps only the first half of its bytes."""
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(src.read_bytes()))
    buffers = list(payload.buffers)
    index = payload.named_data[key].buffer_index
    buffers[index] = buffers[index][: len(buffers[index]) // 2]
    data = FlatTensorSerializer().serialize(DataPayload(buffers=buffers, named_data=payload.named_data))
    dst.write_bytes(bytes(data))
    return dst


DAMAGE = [*FILE_DAMAGE, "missing", "a-pte", "the-foundation", "without-tensors", "short-tensor"]


@pytest.mark.parametrize("mode", [MODES["shared"], MODES["stock"]], ids=["shared", "stock"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_bad_shared_ptd_gives_one_error_line(runner_bin, hoisted_build, tmp_path, damage, mode):
    good = hoisted_build.shared_ptd
    bad = tmp_path / "adapters_shared.ptd"  # "missing": nothing is written there
    if damage in FILE_DAMAGE:
        write_damaged(bad, good.read_bytes(), damage)
    elif damage == "a-pte":
        bad = hoisted_build.ptes["h_b"]
    elif damage == "the-foundation":
        bad = hoisted_build.ptd
    elif damage == "without-tensors":  # the record only, as if from a build whose adapters share nothing
        rewrite_ptd(good, bad, keep=lambda key: len(key) != 64)
    elif damage == "short-tensor":
        shrink_blob(good, bad, sorted(hoisted_keys(hoisted_build, "h_a"))[0])
    pte = hoisted_build.ptes["h_a"]
    line = one_error_line(
        run_runner(runner_bin, "--pte", pte, "--ptd", hoisted_build.ptd, "--shared-ptd", bad, "--tokens", "1,2", *mode),
        1,
    )
    assert str(bad) in line, line
    if damage == "without-tensors":  # both files searched are named
        assert str(pte) in line and str(hoisted_build.ptd) in line, line
    if damage == "short-tensor":
        assert str(pte) in line and "corrupt" in line, line


@pytest.mark.slow
def test_damaged_shared_ptd_never_crashes(runner_bin, hoisted_build, tmp_path):
    """As tests/test_fuzz_runner.py does for --ptd and --pte: each damaged copy runs or is one error line."""
    bad = tmp_path / "adapters_shared.ptd"
    outcomes: Counter = Counter()
    for i, (mutation, blob) in enumerate(damaged(hoisted_build.shared_ptd.read_bytes(), "ptd", 300, seed=7)):
        bad.write_bytes(blob)
        proc = run_runner(
            runner_bin,
            "--pte",
            hoisted_build.ptes["h_a"],
            "--ptd",
            hoisted_build.ptd,
            "--shared-ptd",
            bad,
            "--tokens",
            "1,2",
            "--max-new-tokens",
            2,
        )
        assert proc.returncode in (0, 1), (i, mutation, proc.returncode, proc.stderr)
        if proc.returncode:
            assert_clean_error(proc, 1)
            assert "crashed" not in proc.stderr, (i, mutation, proc.stderr)
        outcomes[mutation, "ran" if proc.returncode == 0 else "rejected"] += 1
    print(f"\nrunner, 300 damaged adapters_shared.ptd files: {dict(outcomes)}")
    assert outcomes["truncate", "ran"] == outcomes["wrong_magic", "ran"] == 0


def test_help_lists_shared_ptd(runner_bin):
    proc = run_runner(runner_bin, "--help")
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("--shared-ptd "))
    assert "hoist" in line and "[default: (none)]" in line


def test_threads_sets_the_pool_and_is_reported(runner_bin, hoisted_build):
    """--threads N: ExecuTorch's threadpool runs N threads (the report says how many); 0 keeps one per
    core; a negative count is a usage error naming the flag."""
    base = [
        "--pte",
        hoisted_build.ptes["h_d"],
        "--ptd",
        hoisted_build.ptd,
        "--tokens",
        ids(PROMPT),
        "--max-new-tokens",
        2,
        "--json",
    ]
    for flag, expected in ((["--threads", "1"], 1), (["--threads", "3"], 3), ([], None)):
        proc = run_runner(runner_bin, *base, *flag)
        assert proc.returncode == 0, proc.stderr
        threads = json.loads(proc.stdout)["loading"]["threads"]
        assert threads == expected if expected else threads >= 1, flag
    bad = run_runner(runner_bin, *base, "--threads", "-1")
    assert bad.returncode == 2 and "--threads" in one_error_line(bad, 2)
