"""Writes the lora_share wheel with the C library inside (make wheel).

    python cpp_runner/bundle/native_wheel.py LIB_DIR OUT_DIR

LIB_DIR is the lib/ folder of the bundle install (cmake --install ... --component bundle): liblora_share.so.0
with RUNPATH $ORIGIN and the ExecuTorch runtime libraries it loads. They go into lora_share/_native/ beside the
Python package (lora_share/inference/c_library.py looks there first), so lora_share.Runtime runs after
`pip install` with no checkout and no build. The wheel is tagged for this platform
(lora_share-<version>-py3-none-linux_<arch>.whl). It requires outright the few light dependencies
pyproject.toml's [tool.lora-share.wheel] names (pyyaml, flatbuffers: validate, inspect, verify); the
project's others are behind the extra `build` (the export side: torch, executorch...): the runtime needs
none of them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
import sysconfig
import zipfile
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()


def _metadata(project: dict, outright: list[str]) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
        f"Requires-Python: {project['requires-python']}",
    ]
    unknown = set(outright) - {_name(dep) for dep in project["dependencies"]}
    if unknown:
        sys.exit(f"pyproject.toml: [tool.lora-share.wheel] requires {sorted(unknown)}, not dependencies of the project")
    lines += [f"Requires-Dist: {dep}" for dep in project["dependencies"] if _name(dep) in outright]
    lines.append("Provides-Extra: build")
    lines += [
        f'Requires-Dist: {dep}; extra == "build"' for dep in project["dependencies"] if _name(dep) not in outright
    ]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    return "\n".join(lines) + "\n"


def _files(lib_dir: Path) -> dict[str, bytes]:
    """Archive name -> bytes: the package's modules, then the libraries (symlinks resolved: a wheel has none,
    and each library is stored under the name its users ask the loader for)."""
    files = {}
    for path in sorted((REPO / "lora_share").rglob("*.py")):
        files[path.relative_to(REPO).as_posix()] = path.read_bytes()
    library = lib_dir / "liblora_share.so.0"
    if not library.exists():
        sys.exit(f"{library} is missing: run `make runner` and install the bundle component first")
    files["lora_share/_native/liblora_share.so.0"] = library.resolve().read_bytes()
    for path in sorted(lib_dir.glob("libexecutorch*.so")):
        files[f"lora_share/_native/{path.name}"] = path.read_bytes()
    return files


def write_wheel(lib_dir: Path, out_dir: Path) -> Path:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project, outright = pyproject["project"], pyproject["tool"]["lora-share"]["wheel"]["requires"]
    name, version = project["name"].replace("-", "_"), project["version"]
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    tag = f"py3-none-{platform}"
    info = f"{name}-{version}.dist-info"
    files = _files(lib_dir)
    scripts = "".join(f"{k} = {v}\n" for k, v in project.get("scripts", {}).items())
    files[f"{info}/METADATA"] = _metadata(project, outright).encode()
    files[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: lora-share make wheel\nRoot-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    files[f"{info}/entry_points.txt"] = f"[console_scripts]\n{scripts}".encode()
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{info}/RECORD,,\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}-{version}-{tag}.whl"
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as wheel:
        for n, data in files.items():
            entry = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            executable = n.endswith(".so") or n.endswith(".so.0")
            entry.external_attr = (0o755 if executable else 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, data)
        wheel.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), record)
    os.replace(tmp, target)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(write_wheel(Path(sys.argv[1]), Path(sys.argv[2])))
