"""Programs from PT2 archives: config checks, bad archives, what foundation.ptd and each .pte hold,
and every program's outputs against torch's own reading of its archive."""

from __future__ import annotations

import ctypes
import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli

from lora_share.config import load_config
from lora_share.errors import UserError
from lora_share.formats import read_ptd, read_pte
from lora_share.programs.build import add_program, build_programs


def _reference_program(archive: Path, model: str | None) -> torch.export.ExportedProgram:
    """The archive's ExportedProgram as torch itself loads it."""
    if model is None:
        return torch.export.load(archive)
    from torch.export.pt2_archive._package import load_pt2

    return load_pt2(archive).exported_programs[model]


def _expected(archive: Path, model: str | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(inputs, outputs) of the archive's program on its example inputs, by torch."""
    ep = _reference_program(archive, model)
    args, kwargs = ep.example_inputs
    with torch.no_grad():
        out = ep.module()(*args, **kwargs)
    return [t.numpy() for t in args], [t.numpy() for t in torch.utils._pytree.tree_leaves(out)]


def _sources(build) -> dict[str, tuple[Path, str | None]]:
    a = build.archives
    return {
        "base": (a.base, None),
        "separate": (a.tasks, "separate"),
        "merged": (a.tasks, "merged"),
        "conv": (a.conv, None),
        "lm": (a.lm, None),
    }


def _tensor_bytes(ep) -> dict[str, bytes]:
    """FQN -> bytes of every parameter, buffer and constant of ``ep``."""
    out = {}
    for name, t in [*ep.state_dict.items(), *ep.constants.items()]:
        out[name] = t.detach().contiguous().numpy().tobytes()
    return out


# ---------------------------------------------------------------------------------------------------------
# Config


def _config(tmp_path: Path, programs: str, **extra) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"output_dir: {tmp_path / 'out'}\nprograms:\n{programs}" + "".join(f"{k}: {v}\n" for k, v in extra.items())
    )
    return path


def test_config_names_what_an_archive_holds(pt2_archives, tmp_path):
    a = pt2_archives
    path = _config(
        tmp_path,
        f"  - {{name: x, pt2: {a.tasks}}}\n  - {{name: x, pt2: {a.tasks}, model: birds}}\n"
        f"  - {{name: y, pt2: {tmp_path / 'none.pt2'}}}\n",
    )
    with pytest.raises(UserError) as e:
        load_config(path)
    text = str(e.value)
    assert "programs[0].model: missing" in text and "separate, merged" in text
    assert "programs[1].name: 'x' is already used by programs[0]" in text
    assert "programs[1].model" in text and "no model 'birds'; it holds separate, merged" in text
    assert "programs[2].pt2" in text and "no such file" in text


def test_config_of_programs_alone(pt2_archives, tmp_path):
    path = _config(tmp_path, f"  - {{name: b, pt2: {pt2_archives.base}}}\n", foundation="{}")
    with pytest.raises(UserError, match="a config of programs has no foundation"):
        load_config(path)
    ok = _config(tmp_path, f"  - {{name: b, pt2: {pt2_archives.base}}}\n")
    result = run_cli("validate", ok)
    assert result.returncode == 0 and "1 programs: b" in result.stdout, result.stderr


# ---------------------------------------------------------------------------------------------------------
# Bad archives: one clear error each, nothing written


def _rewrite(src: Path, dest: Path, change) -> Path:
    """A copy of the archive ``src`` with ``change(member, bytes) -> bytes | None`` (None drops it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)
    return dest


def _weights_config(data: bytes, edit) -> bytes:
    config = json.loads(data)
    edit(next(iter(config["config"].values())))
    return json.dumps(config).encode()


BAD = {
    "not_a_zip": (lambda src, dest: dest.write_bytes(b"hello, not a zip" * 10) and dest, "not a zip file"),
    "format": (
        lambda src, dest: _rewrite(src, dest, lambda n, d: b"aoti" if n.endswith("/archive_format") else d),
        "archive_format is 'aoti', not 'pt2'",
    ),
    "version": (
        lambda src, dest: _rewrite(src, dest, lambda n, d: b"7" if n.endswith("/archive_version") else d),
        "archive_version '7': this lora-share reads version(s) 0",
    ),
    "truncated_blob": (
        lambda src, dest: _rewrite(src, dest, lambda n, d: d[:10] if n.endswith("/weight_0") else d),
        "holds 10 bytes, the tensor needs",
    ),
    "missing_blob": (
        lambda src, dest: _rewrite(src, dest, lambda n, d: None if n.endswith("/weight_1") else d),
        "is missing from the archive",
    ),
    "outside": (
        lambda src, dest: _rewrite(
            src,
            dest,
            lambda n, d: (
                _weights_config(d, lambda m: m.update(path_name="../../etc/passwd"))
                if n.endswith("_weights_config.json")
                else d
            ),
        ),
        "a file outside the archive's data/weights/ folder",
    ),
    "pickled": (
        lambda src, dest: _rewrite(
            src,
            dest,
            lambda n, d: (
                _weights_config(d, lambda m: m.update(use_pickle=True)) if n.endswith("_weights_config.json") else d
            ),
        ),
        "is a pickled tensor (weight_0): reading it would run code from the archive",
    ),
    "truncated_zip": (
        lambda src, dest: dest.write_bytes(src.read_bytes()[: src.stat().st_size // 2]) and dest,
        "not a zip file",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_archive_one_error(pt2_archives, tmp_path, kind):
    make, message = BAD[kind]
    bad = make(pt2_archives.conv, tmp_path / "bad.pt2")
    path = _config(tmp_path, f"  - {{name: a, pt2: {pt2_archives.conv}}}\n  - {{name: b, pt2: {bad}}}\n")
    with pytest.raises(UserError) as e:
        build_programs(path, quiet=True)
    assert message in str(e.value) and str(bad) in str(e.value)
    assert not (tmp_path / "out").exists()


def test_bad_archive_cli_exit(pt2_archives, tmp_path):
    bad = BAD["pickled"][0](pt2_archives.conv, tmp_path / "bad.pt2")
    result = run_cli("build", _config(tmp_path, f"  - {{name: b, pt2: {bad}}}\n"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "reading it would run code from the archive" in result.stderr
    assert not (tmp_path / "out").exists()


def test_unbounded_dynamic_shape_refused(tmp_path):
    model = torch.nn.Linear(4, 2)
    ep = torch.export.export(model, (torch.randn(3, 4),), dynamic_shapes=({0: torch.export.Dim("rows")},))
    torch.export.save(ep, tmp_path / "dyn.pt2")
    path = _config(tmp_path, f"  - {{name: d, pt2: {tmp_path / 'dyn.pt2'}}}\n")
    with pytest.raises(UserError, match=r"dyn.pt2 \(model\): a dynamic size \(\w+\) has no upper bound"):
        build_programs(path, quiet=True)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------
# The build


def test_foundation_holds_each_shared_tensor_once(programs_build):
    holders: dict[bytes, set[str]] = {}
    own: dict[str, int] = {}
    per_program = {}
    for name, (archive, model) in _sources(programs_build).items():
        per_program[name] = set(_tensor_bytes(_reference_program(archive, model)).values())
        for data in per_program[name]:
            holders.setdefault(data, set()).add(name)
    shared = {d for d, names in holders.items() if len(names) > 1}
    ptd = read_ptd(programs_build.out_dir / "foundation.ptd")
    assert sorted(e.key for e in ptd.entries) == sorted(hashlib.sha256(d).hexdigest() for d in shared) or sum(
        e.size for e in ptd.entries
    ) == sum(map(len, shared))
    assert sum(e.size for e in ptd.entries) == sum(map(len, shared))
    for name in per_program:
        own[name] = sum(len(d) for d in per_program[name] - shared)
        pte = programs_build.out_dir / f"{name}.pte"
        assert pte.stat().st_size <= own[name] + 64 * 1024, name
        assert set(read_pte(pte).external_keys()) <= {e.key for e in ptd.entries}
    assert own["conv"] and not read_pte(programs_build.out_dir / "conv.pte").external_keys()


def test_manifest_names_what_each_program_takes(programs_build):
    m = programs_build.manifest
    entries = {e["name"]: e for e in m["programs"]}
    assert set(entries) == {"base", "separate", "merged", "conv", "lm"}
    separate = entries["separate"]["from_foundation"]
    assert "blocks.0.linear1.base.weight" in separate and "blocks.0.linear1.lora_A" not in separate
    assert "head.weight" not in entries["merged"]["from_foundation"]
    for e in entries.values():
        assert e["sample_max_abs_diff"] is not None and e["sample_max_abs_diff"] <= 1e-5
        assert e["size"] == (programs_build.out_dir / e["file"]).stat().st_size


@pytest.mark.parametrize("name", ["base", "separate", "merged", "conv", "lm"])
def test_outputs_equal_the_archive_program(programs_build, tmp_path, name):
    from lora_share.programs.forward import run_files

    inputs, expected = _expected(*_sources(programs_build)[name])
    paths = []
    for i, x in enumerate(inputs):
        np.save(tmp_path / f"in{i}.npy", x)
        paths.append(tmp_path / f"in{i}.npy")
    out = programs_build.out_dir
    outputs = run_files(out / f"{name}.pte", out / "foundation.ptd", paths, None)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # The manifest's figure is this difference: the program against torch.export.load's own reading.
    diff = max(float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) for g, w in zip(outputs, expected))
    entry = next(e for e in programs_build.manifest["programs"] if e["name"] == name)
    assert entry["sample_max_abs_diff"] == pytest.approx(diff, rel=1e-9, abs=1e-12)


def test_run_cli_npy_in_npz_out(programs_build, tmp_path):
    inputs, expected = _expected(programs_build.archives.lm, None)
    np.save(tmp_path / "ids.npy", inputs[0])
    out = programs_build.out_dir
    result = run_cli(
        "run",
        "--pte",
        out / "lm.pte",
        "--ptd",
        out / "foundation.ptd",
        "--input",
        tmp_path / "ids.npy",
        "--output",
        tmp_path / "y.npz",
    )
    assert result.returncode == 0, result.stderr
    got = np.load(tmp_path / "y.npz")
    for i, want in enumerate(expected):
        np.testing.assert_allclose(got[f"output_{i}"], want, atol=1e-5, rtol=0)
    wrong = run_cli(
        "run",
        "--pte",
        out / "lm.pte",
        "--ptd",
        out / "foundation.ptd",
        "--input",
        tmp_path / "y.npz",
        "--output",
        tmp_path / "z.npz",
    )
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr and not (tmp_path / "z.npz").exists()


def test_add_program_keeps_the_foundation(programs_build, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(programs_build.out_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    manifest = add_program(out, "extra", programs_build.archives.extra, quiet=True)
    for name, data in before.items():
        if name != "manifest.json":
            assert (out / name).read_bytes() == data, name
    entry = manifest["programs"][-1]
    assert entry["name"] == "extra" and "blocks.1.linear2.lora_A" not in entry["from_foundation"]
    assert len(entry["from_foundation"]) >= 27
    ptd_keys = {e.key for e in read_ptd(out / "foundation.ptd").entries}
    assert set(read_pte(out / "extra.pte").external_keys()) <= ptd_keys
    inputs, expected = _expected(programs_build.archives.extra, None)
    from lora_share.programs.forward import LoadedProgram

    got = LoadedProgram(out / "extra.pte", out / "foundation.ptd").run(inputs)
    np.testing.assert_allclose(got[0], expected[0], atol=1e-5, rtol=0)
    with pytest.raises(UserError, match="already has a program named 'extra'"):
        add_program(out, "extra", programs_build.archives.extra, quiet=True)


def test_add_to_programs_tells_a_folder_and_a_bad_name_what_to_do(programs_build, tmp_path):
    """A folder (a PEFT adapter) given to a deployment of programs is told which kind of deployment takes
    it; a program name outside the safe set is refused with the rule; nothing is written either way."""
    out, folder = programs_build.out_dir, tmp_path / "peft"
    folder.mkdir()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    r = run_cli("add", "--to", out, f"x={folder}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (
        f"error: {folder}: a folder (a PEFT adapter?), which `add` puts into a deployment of adapters (built "
        "from a config with 'adapters:'; `add` takes PEFT folders); "
        f"{out} is a deployment of programs (built from a config with 'programs:'; `add` takes PT2 archives)"
    )
    r = run_cli("add", "--to", out, f"bad name={programs_build.archives.extra}")
    assert r.returncode == 2 and "program name 'bad name' must be letters, digits" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ---------------------------------------------------------------------------------------------------------
# build/runner and the C API (ls_load_program, ls_run_program)


def _runner(runner_bin, *args):
    import subprocess

    return subprocess.run([str(runner_bin), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_runner_outputs_equal_the_archive_program(programs_build, runner_bin, tmp_path):
    out = programs_build.out_dir
    every = [f"--pte={out / name}.pte" for name in _sources(programs_build)]
    for name, (archive, model) in _sources(programs_build).items():
        inputs, expected = _expected(archive, model)
        paths = []
        for i, x in enumerate(inputs):
            np.save(tmp_path / f"{name}{i}.npy", x)
            paths += ["--input", tmp_path / f"{name}{i}.npy"]
        dest = tmp_path / (f"{name}.npz" if len(expected) > 1 else f"{name}.npy")
        # Every program loaded in one process against one foundation.ptd; --adapter picks the one to run.
        result = _runner(
            runner_bin, *every, "--ptd", out / "foundation.ptd", "--adapter", name, *paths, "--output", dest
        )
        assert result.returncode == 0, result.stderr
        got = np.load(dest)
        got = [got[f"output_{i}"] for i in range(len(expected))] if len(expected) > 1 else [got]
        for g, want in zip(got, expected):
            assert g.dtype == want.dtype and g.shape == want.shape
            np.testing.assert_allclose(g, want, atol=1e-5, rtol=0)


def test_runner_bad_input_one_error(programs_build, runner_bin, tmp_path):
    out = programs_build.out_dir
    np.save(tmp_path / "f.npy", np.zeros((1, 8, 32), np.float32))
    np.savez(tmp_path / "two.npz", np.zeros(3))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "f.npy").read_bytes()[:200])
    cases = {
        "f.npy": "input 0: forward takes int64[1, 8], got float32[1, 8, 32]",
        "two.npz": "not a .npy file",
        "cut.npy": "truncated",
    }
    for file, message in cases.items():
        result = _runner(
            runner_bin,
            "--pte",
            out / "lm.pte",
            "--ptd",
            out / "foundation.ptd",
            "--input",
            tmp_path / file,
            "--output",
            tmp_path / "o.npz",
        )
        assert result.returncode == 2 and message in result.stderr, (file, result.stderr)
        assert not (tmp_path / "o.npz").exists()
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(out / "base.pte", lone)
    other = read_ptd(out / "foundation.ptd")
    assert other.entries  # base.pte needs them: against an empty data file it names what is missing
    from lora_share.programs.build import encode_foundation_ptd

    (lone / "foundation.ptd").write_bytes(encode_foundation_ptd({}))
    result = _runner(
        runner_bin, "--pte", lone / "base.pte", "--ptd", lone / "foundation.ptd", "--input", tmp_path / "f.npy"
    )
    assert result.returncode == 1 and "has no data for key" in result.stderr, result.stderr


def test_more_programs_cost_their_own_bytes(programs_build, runner_bin, tmp_path):
    """N programs in one runner: beyond the first, each costs at most its .pte (its program and its
    own tensors) + 1 MiB of PSS; the tensors they share are mapped and packed once."""
    import re

    out = programs_build.out_dir
    inputs, _ = _expected(programs_build.archives.base, None)
    np.save(tmp_path / "x.npy", inputs[0])
    names = ["base", "separate", "merged", "conv", "lm"]

    def pss(ptes):
        result = _runner(
            runner_bin,
            *[f"--pte={out / n}.pte" for n in ptes],
            "--ptd",
            out / "foundation.ptd",
            "--adapter",
            "base",
            "--input",
            tmp_path / "x.npy",
        )
        assert result.returncode == 0, result.stderr
        return float(re.search(r"process PSS ([\d.]+) MiB", result.stderr).group(1)) * (1 << 20)

    one, every = pss(names[:1]), pss(names)
    allowed = sum((out / f"{n}.pte").stat().st_size + (1 << 20) for n in names[1:])
    assert every - one <= allowed, (one, every, allowed)


def test_example_exports_archives_its_config_reads(tmp_path):
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[1] / "examples" / "pt2"
    shutil.copy(example / "vision.yaml", tmp_path)
    result = subprocess.run(
        [sys.executable, str(example / "export_models.py"), str(tmp_path / "models")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    cfg = load_config(tmp_path / "vision.yaml")
    assert [p.name for p in cfg.programs] == ["base", "birds", "cars"]
    assert np.load(tmp_path / "models" / "image.npy").shape == (1, 3, 32, 32)


class _Tensor(ctypes.Structure):
    """lora_share.h's ls_tensor."""

    _fields_ = [
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("sizes", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
    ]


ET_DTYPES = {np.dtype(np.float32): 6, np.dtype(np.int64): 4}


def _ls_tensor(a: np.ndarray, keep: list) -> _Tensor:
    sizes = (ctypes.c_int64 * a.ndim)(*a.shape)
    keep += [a, sizes]
    return _Tensor(ET_DTYPES[a.dtype], a.ndim, sizes, a.ctypes.data, a.nbytes)


def test_c_api_runs_programs_on_caller_tensors(programs_build, runner_bin):
    from conftest import REPO

    from lora_share.inference import c_library as native

    lib = native.load_library(REPO / "build" / "liblora_share.so")
    lib.ls_load_program.restype, lib.ls_load_program.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(native._Error)],
    )
    lib.ls_run_program.restype, lib.ls_run_program.argtypes = (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.POINTER(_Tensor),
            ctypes.c_size_t,
            ctypes.POINTER(_Tensor),
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(native._Error),
        ],
    )
    out, err = programs_build.out_dir, native._Error()
    runtime = lib.ls_open(str(out / "foundation.ptd").encode(), None, ctypes.byref(err))
    assert runtime, err.message
    try:
        programs = {
            n: lib.ls_load_program(runtime, str(out / f"{n}.pte").encode(), ctypes.byref(err))
            for n in ("separate", "lm")
        }
        assert all(programs.values()), err.message
        for name, handle in programs.items():
            inputs, expected = _expected(*_sources(programs_build)[name])
            keep: list = []
            array = (_Tensor * len(inputs))(*[_ls_tensor(np.ascontiguousarray(x), keep) for x in inputs])
            outputs, n = (_Tensor * 4)(), ctypes.c_size_t()
            status = lib.ls_run_program(handle, array, len(inputs), outputs, 4, ctypes.byref(n), ctypes.byref(err))
            assert status == 0 and n.value == len(expected), err.message
            for t, want in zip(outputs, expected):
                shape = tuple(t.sizes[i] for i in range(t.ndim))
                got = np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)), shape)
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        keep = []
        wrong = (_Tensor * 1)(_ls_tensor(np.zeros((1, 8), np.float32), keep))
        status = lib.ls_run_program(
            programs["lm"], wrong, 1, (_Tensor * 4)(), 4, ctypes.byref(ctypes.c_size_t()), ctypes.byref(err)
        )
        assert lib.ls_status_name(status) == b"LS_ERR_REQUEST"
        assert b"forward takes int64[1, 8], got float32[1, 8]" in err.message
    finally:
        lib.ls_close(runtime)


@pytest.mark.slow  # ~14 s: `make test`, not the edit loop (test_add_program_keeps_the_foundation is in it)
def test_add_cli_with_model(programs_build, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(programs_build.out_dir, out)
    ptd = (out / "foundation.ptd").read_bytes()
    result = run_cli("add", "--to", out, f"again={programs_build.archives.tasks}", "--model", "merged")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [e["name"] for e in manifest["programs"]][-1] == "again"
    assert (out / "foundation.ptd").read_bytes() == ptd and (out / "again.pte").is_file()
    missing = run_cli("add", "--to", out, f"x={programs_build.archives.tasks}", "--model", "birds")
    assert missing.returncode == 2 and "has no model 'birds'; it holds separate, merged" in missing.stderr
    assert "Traceback" not in missing.stderr and not (out / "x.pte").exists()


def test_adapter_commands_refuse_a_config_of_programs(pt2_archives, tmp_path):
    from lora_share.deploy.builder import build

    path = _config(tmp_path, f"  - {{name: b, pt2: {pt2_archives.base}}}\n")
    with pytest.raises(UserError, match="a config of programs"):
        build(path, quiet=True)
    result = run_cli("bench", path)
    assert result.returncode == 2 and "a config of programs" in result.stderr and "Traceback" not in result.stderr
