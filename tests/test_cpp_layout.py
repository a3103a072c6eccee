"""The C++ tree's boundaries: build/runner (cli/) and build/lora-share-server (server/) are
clients of the library's public C API (include/lora_share.h, include/lora_share_diag.h) and
never of its private runtime/ headers; they take text only through that API (issue 57: one
text path), so neither includes a tokenizer header nor links the tokenizer library.

Checked several ways, each able to fail on its own: the clients' sources include no runtime/
header, no tokenizer/ header and no ExecuTorch header; the build gives the runner and the server
no include path to runtime/ or tokenizer/ (a probe that includes such a header with their compile
flags does not compile, while one with the headers they may use does) and no tokenizer library on
their link lines; liblora_share.so exports its C API and no C++ symbol of its own; manifest.json is
read by formats/manifest.cpp alone.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CPP = REPO / "cpp_runner"
CLIENTS = {"runner": CPP / "cli", "lora-share-server": CPP / "server"}
PUBLIC_HEADERS = {"lora_share.h", "lora_share_diag.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def client_sources():
    for folder in CLIENTS.values():
        yield from sorted(p for p in folder.iterdir() if p.suffix in (".h", ".cpp"))


def test_clients_include_no_runtime_or_tokenizer_header():
    runtime = {p.name for p in (CPP / "runtime").rglob("*") if p.is_file()}
    tokenizer = {p.name for p in (CPP / "tokenizer").rglob("*.h")}
    include_dir = {p.name for p in (CPP / "include").iterdir()}
    assert include_dir == PUBLIC_HEADERS, include_dir
    sources = list(client_sources())
    assert any(p.name == "main.cpp" for p in sources) and any(p.name == "server_main.cpp" for p in sources)
    offences = []
    for source in sources:
        for kind, name in INCLUDE.findall(source.read_text()):
            resolved = (source.parent / name).resolve()
            if kind == '"' and (Path(name).name in runtime or CPP / "runtime" in resolved.parents):
                offences.append(f"{source.relative_to(REPO)}: {name}")
            if kind == '"' and (Path(name).name in tokenizer or CPP / "tokenizer" in resolved.parents):
                offences.append(f"{source.relative_to(REPO)}: {name} (a tokenizer header)")
            if name.startswith("executorch/"):
                offences.append(f"{source.relative_to(REPO)}: <{name}>")
    assert not offences, "clients must use include/lora_share.h (and lora_share_diag.h) only: " + ", ".join(offences)


def test_manifest_json_has_one_cpp_reader():
    """formats/manifest.cpp alone reads manifest.json: of the sources that parse JSON from a file, the
    other one is the tokenizer's (tokenizer.json), and it never names manifest.json."""
    file_parsers = sorted(
        source.relative_to(CPP).as_posix()
        for source in CPP.rglob("*.cpp")
        if "json::parse(" in source.read_text() and "ifstream" in source.read_text()
    )
    assert file_parsers == ["formats/manifest.cpp", "tokenizer/tokenizer.cpp"], file_parsers
    assert "manifest" not in (CPP / "tokenizer" / "tokenizer.cpp").read_text()


def test_no_source_at_cpp_runner_root():
    assert sorted(p.name for p in CPP.iterdir() if p.is_file()) == ["CMakeLists.txt"]


def compile_flags(target_dir: Path) -> list[str]:
    """The flags CMake compiles a target's sources with (Unix Makefiles, as `make runner` uses)."""
    flags = (target_dir / "flags.make").read_text()
    values = dict(re.findall(r"^(CXX_\w+) = ?(.*)$", flags, re.MULTILINE))
    return shlex.split(values["CXX_DEFINES"]) + shlex.split(values["CXX_INCLUDES"]) + shlex.split(values["CXX_FLAGS"])


@pytest.mark.parametrize("target", sorted(CLIENTS))
def test_build_gives_clients_no_runtime_include_path(runner_bin, target, tmp_path):
    build = REPO / "build" / "cmake"
    target_dir = (
        (build / "CMakeFiles" / "runner.dir")
        if target == "runner"
        else (build / "server" / "CMakeFiles" / "lora-share-server.dir")
    )
    flags = compile_flags(target_dir)
    assert not any("cpp_runner/runtime" in f or "cpp_runner/tokenizer" in f for f in flags), flags
    link = (target_dir / "link.txt").read_text()
    assert "lora_share_tokenizer" not in link and "tokenizer" not in Path(link.split()[-1]).name, link

    def compiles(code: str) -> subprocess.CompletedProcess:
        probe = tmp_path / "probe.cpp"
        probe.write_text(code)
        return subprocess.run(["c++", *flags, "-fsyntax-only", str(probe)], capture_output=True, text=True)

    allowed = compiles(
        '#include "lora_share.h"\n#include "lora_share_diag.h"\n#include "file_check.h"\n'
        '#include "flag_table.h"\n#include "status.h"\nint main() { return LS_OK; }\n'
    )
    assert allowed.returncode == 0, allowed.stderr
    for private in ("adapter_pool.h", "adapter_on_foundation.h", "generate.h", "binding.h", "tokenizer.h"):
        refused = compiles(f'#include "{private}"\nint main() {{ return 0; }}\n')
        assert refused.returncode != 0 and private in refused.stderr, refused.stderr


def test_library_exports_its_c_api_only(runner_bin):
    library = runner_bin.parent / "liblora_share.so"
    symbols = subprocess.run(
        ["nm", "-DC", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    ours = [line for line in symbols.splitlines() if "lora_share::" in line or "xgrammar::" in line]
    assert not ours, ours[:5]
    exported = set(re.findall(r"\b(ls_\w+)\b", symbols))
    header = (CPP / "include" / "lora_share.h").read_text() + (CPP / "include" / "lora_share_diag.h").read_text()
    declared = set(re.findall(r"LS_API\s+[\w\s*]+?\b(ls_\w+)\s*\(", header))
    assert declared and declared <= exported, declared - exported
