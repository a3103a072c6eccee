"""The wheel `make wheel` writes, as a user installs it: `lora-share --help` runs with nothing else
installed; with the wheel's two requirements (pyyaml, flatbuffers) `validate`, `inspect` and `verify`
work too; every command that needs the export side says in one line which extra to install, with no
traceback."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import flatbuffers
import pytest
import yaml
from conftest import REPO

BUILD_EXTRA = "pip install 'lora_share[build]'"


def lora_share_cli(python: Path, *args, requirements: Path | None = None) -> subprocess.CompletedProcess:
    """The wheel venv's `lora-share` console script, outside the checkout, with no environment but PATH
    (and PYTHONPATH to ``requirements``: the wheel's requirements, as pip would install them)."""
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": str(requirements)} if requirements else {})}
    return subprocess.run(
        [str(python.parent / "lora-share"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=python.parent,
        env=env,
    )


@pytest.fixture(scope="module")
def requirements(tmp_path_factory) -> Path:
    """pyyaml and flatbuffers, the wheel's own requirements, copied from this interpreter's install (the
    tests run offline, so they are not fetched): what `pip install lora_share-*.whl` adds."""
    folder = tmp_path_factory.mktemp("wheel_requirements")
    for module in (yaml, flatbuffers):
        source = Path(module.__file__).parent
        shutil.copytree(source, folder / source.name)
    return folder


def test_wheel_requires_only_its_light_dependencies(wheel_python):
    proc = subprocess.run(
        [str(wheel_python), "-c", "from importlib.metadata import requires; print('\\n'.join(requires('lora-share')))"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=wheel_python.parent,  # not the checkout, whose lora_share.egg-info would answer instead
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    outright = sorted(r.split(">=")[0] for r in proc.stdout.splitlines() if ";" not in r)
    assert outright == ["flatbuffers", "pyyaml"], proc.stdout
    assert 'torch==2.13.0; extra == "build"' in proc.stdout and 'numpy>=1.26; extra == "build"' in proc.stdout


def test_help_runs_with_the_bare_wheel_and_the_rest_says_what_to_install(wheel_python, tiny_build):
    """Installed with --no-deps, nothing else: --help works; validate and inspect name the requirement
    they lack, in one line."""
    help_ = lora_share_cli(wheel_python, "--help")
    assert help_.returncode == 0 and help_.stdout.startswith("usage: lora-share"), help_.stderr
    for args, lacks in (
        (("validate", REPO / "configs" / "tiny.yaml"), "pyyaml"),
        (("inspect", tiny_build.ptd), "flatbuffers"),
    ):
        r = lora_share_cli(wheel_python, *args)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.strip().splitlines() == [
            f"error: lora-share {args[0]} needs {lacks}, which is not installed: pip install '{lacks}"
            + (">=6'" if lacks == "pyyaml" else ">=24'")
        ]


def test_validate_inspect_verify_work_from_the_wheel(wheel_python, requirements, tiny_build):
    config = REPO / "configs" / "tiny.yaml"
    r = lora_share_cli(wheel_python, "validate", config, requirements=requirements)
    assert r.returncode == 0 and r.stdout.strip() == (
        f"{config}: OK (2 adapters: tiny_a, tiny_b; output {(REPO / 'out' / 'tiny').resolve()})"
    ), r.stderr
    pte = tiny_build.ptes["tiny_a"]
    r = lora_share_cli(wheel_python, "inspect", pte, "--ptd", tiny_build.ptd, requirements=requirements)
    assert r.returncode == 0 and "compatible: yes" in r.stdout, r.stderr
    r = lora_share_cli(wheel_python, "verify", "--pte", pte, "--ptd", tiny_build.ptd, requirements=requirements)
    fingerprint = tiny_build.manifest["foundation"]["fingerprint"]
    assert (
        r.returncode == 0 and r.stdout.strip() == f"{pte}: compatible with {tiny_build.ptd} (foundation {fingerprint})"
    )


@pytest.mark.parametrize(
    "args",
    [
        ("build", "configs/tiny.yaml"),
        ("add", "--to", "OUT", "x=nowhere"),
        ("run", "--pte", "PTE", "--ptd", "PTD", "--tokens", "1,2"),
    ],
)
def test_commands_of_the_build_extra_say_so_in_one_line(wheel_python, requirements, tiny_build, args):
    given = {"configs/tiny.yaml": REPO / "configs" / "tiny.yaml", "OUT": tiny_build.out_dir}
    given |= {"PTE": tiny_build.ptes["tiny_a"], "PTD": tiny_build.ptd}
    r = lora_share_cli(wheel_python, *(given.get(a, a) for a in args), requirements=requirements)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith(f"error: lora-share {args[0]} needs ")
        and lines[0].endswith(BUILD_EXTRA)
    ), r.stderr
