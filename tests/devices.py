"""Helpers for the device tests (test_arm64.py, test_dist.py): aarch64 programs run under qemu-aarch64,
the ELF facts a relocatable program must satisfy, a server asked one chat completion, the C example
built against an installed lora_share package.

The reference in those tests is always the x86 build (build/runner, build/lora-share-server) on the
same files; these helpers only run things.
"""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import subprocess
from pathlib import Path

from conftest import REPO

ARM64_DIR = REPO / "build-arm64"
AARCH64_TOOLCHAIN = REPO / "cpp_runner/cmake/aarch64-linux-gnu.cmake"
TIMEOUT = 600  # one emulated process: a tiny model runs in seconds, but the machine is shared
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


def command(binary: Path, *args, arch: str = "x86_64") -> list[str]:
    """The command line that runs `binary` on this x86-64 machine: as it is, or under qemu-aarch64 with
    the arm64 system libraries of Debian's multiarch folders (-L / : the guest's / is the host's)."""
    cmd = [str(binary), *map(str, args)]
    if arch == "aarch64":
        qemu = shutil.which("qemu-aarch64")
        assert qemu, "qemu-aarch64 is missing: run `make system-deps-arm64` (Debian's qemu-user)"
        cmd = [qemu, "-L", "/", *cmd]
    return cmd


def run(
    binary: Path, *args, arch: str = "x86_64", env: dict | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """`binary args` (under qemu for aarch64), asserted to exit 0."""
    proc = subprocess.run(
        command(binary, *args, arch=arch), input=stdin, capture_output=True, text=True, timeout=TIMEOUT, env=env
    )
    assert proc.returncode == 0, f"{binary} {args}: {proc.stderr}"
    return proc


def elf_machine(path: Path) -> str:
    """readelf's Machine field, e.g. 'AArch64' or 'Advanced Micro Devices X86-64'."""
    out = subprocess.run(["readelf", "-h", str(path)], capture_output=True, text=True, check=True).stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if "Machine:" in line)


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def dynamic_entries(path: Path, tag: str) -> list[str]:
    """The values of one dynamic-section tag (NEEDED, RUNPATH, RPATH) as readelf -d prints them; a
    RUNPATH's folders split on ':'."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    values = []
    for line in out.splitlines():
        if f"({tag})" in line:
            value = line.split("[", 1)[1].rsplit("]", 1)[0]
            values += value.split(":") if tag in ("RUNPATH", "RPATH") else [value]
    return values


def chat_once(server_cmd: list[str], folder: Path, model: str, max_tokens: int = 10, env: dict | None = None) -> dict:
    """Starts a server on 127.0.0.1 and an ephemeral port over `folder`, asks one chat completion of
    CHAT, stops it with SIGTERM (asserting a clean exit) and returns the response body."""
    proc = subprocess.Popen(
        [*server_cmd, "--dir", str(folder), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stderr.readline()  # "listening on http://127.0.0.1:PORT (...)", or an error
        assert line.startswith("listening on http://"), line + proc.stderr.read()
        host, port = line.split("http://", 1)[1].split()[0].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps({"model": model, "messages": CHAT, "max_tokens": max_tokens}),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert resp.status == 200, body
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, proc.stderr.read()
    return body


def build_c_app(prefix: Path, build_dir: Path, arch: str = "x86_64") -> Path:
    """examples/c_app configured with find_package(lora_share) against the package at `prefix` (cross
    compiled with the committed toolchain file for aarch64) and built; returns the program."""
    configure = ["cmake", "-S", str(REPO / "examples/c_app"), "-B", str(build_dir), f"-DCMAKE_PREFIX_PATH={prefix}"]
    if arch == "aarch64":
        configure.append(f"-DCMAKE_TOOLCHAIN_FILE={AARCH64_TOOLCHAIN}")
    for cmd in (configure, ["cmake", "--build", str(build_dir)]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return build_dir / "c_app"
