"""The runtime bundles of `make dist` (dist/lora-share-runtime-<version>-linux-{x86_64,aarch64}.tar.gz),
each unpacked into an empty folder and used from there with no environment variables at all (the
aarch64 one under qemu-aarch64): a deployment runs, the server answers one chat completion, and the C
example builds against the unpacked find_package(lora_share). The reference is the x86 build in the
checkout (build/runner, build/lora-share-server) on the same files. No shipped binary may carry a
RUNPATH into the build machine: every folder is $ORIGIN-relative.
Selected by `make test-arm64` (-m dist); `make test` leaves them out.
"""

from __future__ import annotations

import json
import subprocess
import tarfile

import pytest
import tomllib
from conftest import REPO, TEXT_ADAPTER
from devices import build_c_app, chat_once, command, dynamic_entries, elf_machine, is_elf, run

pytestmark = pytest.mark.dist

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
MACHINE = {"x86_64": "Advanced Micro Devices X86-64", "aarch64": "AArch64"}
NEW = 8


@pytest.fixture(scope="module", params=["x86_64", "aarch64"])
def bundle(request, tmp_path_factory):
    """(arch, folder): the platform's archive, made by `make dist` if missing, unpacked into an empty folder."""
    arch = request.param
    name = f"lora-share-runtime-{VERSION}-linux-{arch}"
    archive = REPO / "dist" / f"{name}.tar.gz"
    if not archive.exists():
        subprocess.run(["make", "-C", str(REPO), "dist"], check=True, capture_output=True)
    target = tmp_path_factory.mktemp(f"unpacked-{arch}")
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="tar")
    assert [p.name for p in target.iterdir()] == [name]  # one top folder, named like the archive
    return arch, target / name


def test_layout(bundle):
    arch, root = bundle
    for path in (
        "bin/runner",
        "bin/lora-share-server",
        "lib/liblora_share.so",
        "include/lora_share.h",
        "lib/cmake/lora_share/lora_shareConfig.cmake",
        "README.md",
    ):
        assert (root / path).exists(), path
    for program in ("bin/runner", "bin/lora-share-server", "lib/liblora_share.so"):
        assert elf_machine(root / program) == MACHINE[arch], program
    # Every ExecuTorch library the library and the programs load is shipped beside liblora_share.
    needed = {
        n
        for p in ("bin/runner", "bin/lora-share-server", "lib/liblora_share.so")
        for n in dynamic_entries(root / p, "NEEDED")
    }
    executorch = {n for n in needed if n.startswith("libexecutorch")}
    assert "libexecutorch.so" in executorch and "libexecutorch_backend_xnnpack.so" in executorch
    for lib in executorch | {"liblora_share.so.0"}:
        assert (root / "lib" / lib).exists(), lib


def test_every_runpath_is_relative(bundle):
    _, root = bundle
    elves = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p)]
    assert len(elves) >= 5
    for elf in elves:
        folders = dynamic_entries(elf, "RUNPATH") + dynamic_entries(elf, "RPATH")
        assert all(f.startswith("$ORIGIN") for f in folders), (elf, folders)
        assert not any(str(REPO) in f or "site-packages" in f for f in folders), (elf, folders)
    for program in ("bin/runner", "bin/lora-share-server"):
        assert dynamic_entries(root / program, "RUNPATH") == ["$ORIGIN/../lib"], program


def test_ldd_resolves_inside_the_folder(bundle):
    arch, root = bundle
    if arch != "x86_64":
        pytest.skip("ldd runs the target's loader: x86-64 only (the aarch64 bundle runs below under qemu)")
    for program in ("bin/runner", "bin/lora-share-server", "lib/liblora_share.so"):
        out = subprocess.run(["ldd", str(root / program)], capture_output=True, text=True, env={}, check=True).stdout
        assert "not found" not in out, out
        for line in out.splitlines():
            if line.strip().startswith(("libexecutorch", "liblora_share")):
                assert f"=> {root}/bin/../lib/" in line or f"=> {root}/lib/" in line, line


def x86_tokens(runner_bin, build, adapter, prompt="1,17,42") -> list[int]:
    return json.loads(
        run(
            runner_bin,
            "--ptd",
            build.ptd,
            "--pte",
            build.ptes[adapter],
            "--tokens",
            prompt,
            "--max-new-tokens",
            NEW,
            "--json",
        ).stdout
    )["tokens"]


def test_runs_a_deployment_with_no_environment(bundle, runner_bin, untied_build):
    arch, root = bundle
    args = ["--ptd", untied_build.ptd, "--serve", "--max-new-tokens", NEW]
    for pte in untied_build.ptes.values():
        args += ["--pte", pte]
    lines = "".join(f"{name}\t1,17,42\n" for name in untied_build.ptes)
    answers = [
        json.loads(line) for line in run(root / "bin/runner", *args, arch=arch, env={}, stdin=lines).stdout.splitlines()
    ]
    assert [a["adapter"] for a in answers] == list(untied_build.ptes)
    for answer in answers:
        assert answer["tokens"] == x86_tokens(runner_bin, untied_build, answer["adapter"]), answer["adapter"]
    assert len({tuple(a["tokens"]) for a in answers}) == len(answers)  # each adapter its own answer


def test_serves_a_chat_completion_with_no_environment(bundle, text_build):
    arch, root = bundle
    folder = text_build.build.out_dir
    got = chat_once(command(root / "bin/lora-share-server", arch=arch), folder, TEXT_ADAPTER, env={})
    want = chat_once(command(REPO / "build/lora-share-server"), folder, TEXT_ADAPTER)
    assert got["choices"] == want["choices"] and want["choices"][0]["tokens"]


def test_c_example_builds_against_the_unpacked_package(bundle, runner_bin, untied_build, tmp_path):
    arch, root = bundle
    c_app = build_c_app(root, tmp_path / "c_app", arch=arch)
    assert elf_machine(c_app) == MACHINE[arch]
    name = "tiny_b"
    got = run(c_app, untied_build.ptd, untied_build.ptes[name], "1,17,42", NEW, arch=arch, env={}).stdout.split()
    assert [int(t) for t in got] == x86_tokens(runner_bin, untied_build, name)


def test_c_example_chats_in_text_with_no_environment(bundle, text_build, tmp_path):
    """The bundle's library carries the text calls: c_app --chat answers as the checkout's build does."""
    arch, root = bundle
    folder, question = text_build.build.out_dir, "Why is the sky blue?"
    c_app = build_c_app(root, tmp_path / "c_app", arch=arch)
    got = run(c_app, "--chat", folder, TEXT_ADAPTER, question, NEW, arch=arch, env={}).stdout
    local = build_c_app(REPO / "build/install", tmp_path / "c_app_local")
    assert got == run(local, "--chat", folder, TEXT_ADAPTER, question, NEW).stdout and got != "\n"
