"""The packed-weights file (lora_share.h, PACKED WEIGHTS), on by default: the first start writes XNNPACK's
packed weights beside the deployment, later starts map them.

The reference for every answer is the same runtime packing in memory (``--no-packed-cache``): mapped
weights must give the same logits bit for bit. Each test works on its own copy of the tiny build, so the
file's absence, damage or folder is the test's own.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import numpy as np
import pytest

from lora_share.files import staged_dir
from lora_share.inference import c_library as native

PROMPT = "1,17,42"
NEW = 6
TIMEOUT = 120
NOTE = "lora-share: packed-weights cache:"


@pytest.fixture
def deployment(tiny_build, tmp_path):
    """A copy of the tiny build's files (no packed-weights file yet)."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ["foundation.ptd", "manifest.json", *(p.name for p in tiny_build.ptes.values())]:
        shutil.copy(tiny_build.out_dir / name, out / name)
    return out


def start(runner_bin, out, *flags, env=None):
    """One runner start on every adapter of ``out``: (its --json report, logits, stderr)."""
    args = [str(runner_bin), "--ptd", str(out / "foundation.ptd")]
    for pte in sorted(out.glob("*.pte")):
        args += ["--pte", str(pte)]
    logits = out.parent / "logits.npy"
    args += ["--tokens", PROMPT, "--max-new-tokens", str(NEW), "--dump-logits", str(logits), "--json", *flags]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), np.load(logits), proc.stderr


def test_first_start_writes_the_file_later_starts_map_it(runner_bin, deployment):
    _, reference, _ = start(runner_bin, deployment, "--no-packed-cache")
    assert not (deployment / ".packed").exists()  # off: nothing read or written
    # What an earlier build (another key) and a writer that died left: cleared once the file is written.
    (deployment / ".packed").mkdir()
    for stale in ("0123456789abcdef.bin", "0123456789abcdef.bin.tmp-999999999-0"):
        (deployment / ".packed" / stale).write_bytes(b"stale")
    cold, cold_logits, cold_err = start(runner_bin, deployment)
    warm, warm_logits, warm_err = start(runner_bin, deployment)
    files = list((deployment / ".packed").iterdir())
    assert [f.name for f in files] == [os.path.basename(cold["loading"]["packed_cache"])]  # nothing else left
    assert cold["loading"]["packed_cache_warm"] is False and warm["loading"]["packed_cache_warm"] is True
    assert warm["loading"]["packed_cache"] == cold["loading"]["packed_cache"] == str(files[0])
    # The file holds every program's packed weights, beyond the foundation's own bytes (XNNPACK's layout).
    assert files[0].stat().st_size > 0 and NOTE not in cold_err + warm_err
    assert np.array_equal(cold_logits, reference) and np.array_equal(warm_logits, reference)


def test_the_file_is_mapped_while_another_process_maps_it(runner_bin, deployment):
    """A server holding the file does not keep a second process from mapping it (XNNPACK locks a file it
    writes; the published file is only ever read)."""
    start(runner_bin, deployment)
    server = subprocess.Popen(
        [
            str(runner_bin),
            "--ptd",
            str(deployment / "foundation.ptd"),
            "--pte",
            str(next(deployment.glob("*.pte"))),
            "--serve",
            "--verbose",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        server.stdin.write('{"adapter": "tiny_a", "tokens": [1, 2]}\n')
        server.stdin.flush()
        assert server.stdout.readline()  # loaded and answered: it maps the file now
        report, _, err = start(runner_bin, deployment, "--verbose")
    finally:
        server.communicate(timeout=TIMEOUT)
    assert report["loading"]["packed_cache_warm"] is True
    assert "Loaded packed weight cache" in err  # XNNPACK's own line: mapped, not repacked


def _damage_truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _damage_key(path):
    """The file of another foundation: the fingerprint its key names is changed."""
    data = bytearray(path.read_bytes())
    at = data.rindex(b"\nfoundation ") + len(b"\nfoundation ")
    data[at] = ord("0") if data[at] != ord("0") else ord("1")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, reason", [(_damage_truncate, "truncated"), (_damage_key, "written for another foundation")]
)
def test_a_damaged_file_is_noted_and_written_again(runner_bin, deployment, damage, reason):
    cold, reference, _ = start(runner_bin, deployment)
    path = deployment / ".packed" / os.path.basename(cold["loading"]["packed_cache"])
    damage(path)
    again, logits, err = start(runner_bin, deployment)
    notes = [line for line in err.splitlines() if line.startswith(NOTE)]
    assert len(notes) == 1 and str(path) in notes[0] and reason in notes[0], err
    assert again["loading"]["packed_cache_warm"] is False and np.array_equal(logits, reference)
    warm, logits, err = start(runner_bin, deployment)  # written again: valid from now on
    assert warm["loading"]["packed_cache_warm"] is True and NOTE not in err
    assert np.array_equal(logits, reference)


def test_a_deployment_it_cannot_write_falls_back_to_the_cache_folder(runner_bin, deployment, tmp_path):
    # .packed taken by a file: not a folder anyone can write into (root ignores a read-only mode).
    (deployment / ".packed").write_text("")
    deployment.chmod(stat.S_IRUSR | stat.S_IXUSR)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    try:
        cold, reference, _ = start(runner_bin, deployment, env=env)
        warm, logits, _ = start(runner_bin, deployment, env=env)
    finally:
        deployment.chmod(stat.S_IRWXU)
    folder = tmp_path / "xdg" / "lora-share" / "packed"
    assert os.path.dirname(cold["loading"]["packed_cache"]) == str(folder)
    assert [warm["loading"]["packed_cache_warm"], cold["loading"]["packed_cache_warm"]] == [True, False]
    assert np.array_equal(logits, reference)


def test_a_named_folder_and_the_flags_errors(runner_bin, deployment, tmp_path):
    folder = tmp_path / "elsewhere" / "packed"
    report, _, _ = start(runner_bin, deployment, "--packed-cache", folder)
    assert os.path.dirname(report["loading"]["packed_cache"]) == str(folder)
    assert not (deployment / ".packed").exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    base = [
        str(runner_bin),
        "--ptd",
        str(deployment / "foundation.ptd"),
        "--pte",
        str(next(deployment.glob("*.pte"))),
        "--tokens",
        PROMPT,
    ]
    for flags, words in (
        (["--packed-cache", str(blocked / "sub")], [str(blocked / "sub"), "--no-packed-cache"]),
        (["--packed-cache", str(folder), "--no-packed-cache"], ["give one of them"]),
    ):
        proc = subprocess.run(base + flags, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("error: ") and all(w in proc.stderr for w in words), proc.stderr


def test_a_rebuild_keeps_the_packed_folder(tmp_path):
    """A build or `lora-share add` replaces the deployment folder whole (files.staged_dir): the
    packed-weights files move into the new one (each names what it is for, so a stale one is never read)."""
    final = tmp_path / "out"
    (final / ".packed").mkdir(parents=True)
    (final / ".packed" / "k.bin").write_bytes(b"packed")
    (final / "old.pte").write_bytes(b"old")
    with staged_dir(final) as stage:
        (stage / "new.pte").write_bytes(b"new")
    assert sorted(p.name for p in final.iterdir()) == [".packed", "new.pte"]
    assert (final / ".packed" / "k.bin").read_bytes() == b"packed"


def test_the_library_writes_it_on_first_use_by_default(runner_bin, deployment, tmp_path):
    """ls_open_dir (as the server and lora_share.Runtime open a deployment): the file appears with the
    first program loaded, and equal answers; packed_cache=False reads and writes none."""
    library = runner_bin.parent / "liblora_share.so"
    with native.open_dir(deployment, library=library, packed_cache=False) as rt:
        reference = rt.generate("tiny_b", [1, 17, 42], NEW)
    assert not (deployment / ".packed").exists()
    with native.open_dir(deployment, library=library) as rt:
        assert not (deployment / ".packed").exists()  # nothing loaded yet
        assert rt.generate("tiny_b", [1, 17, 42], NEW) == reference
    assert len(list((deployment / ".packed").glob("*.bin"))) == 1
    with native.open_dir(deployment, library=library, packed_cache=tmp_path / "mine") as rt:
        assert rt.generate("tiny_b", [1, 17, 42], NEW) == reference
    assert len(list((tmp_path / "mine").glob("*.bin"))) == 1
