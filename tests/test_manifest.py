"""manifest.json: every key a build writes is specified in schema/FORMAT.md, and every reader (the
Python one, `lora-share add`, build/runner, build/lora-share-server) refuses a manifest of another
format or version with the same message naming the file, what it found and what it reads."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from conftest import REPO, run_cli

from lora_share.errors import UserError
from lora_share.manifest import FORMAT, MANIFEST, VERSION, read_manifest, write_manifest

ROW = re.compile(r"^\s*\| `([^`]+)` \|", re.MULTILINE)


def documented_keys() -> set[str]:
    """The key paths FORMAT.md's manifest.json section lists (first column of its tables), with each
    ``<name>`` placeholder as ``<*>``."""
    text = (REPO / "schema" / "FORMAT.md").read_text()
    section = text[text.index("## manifest.json") :]
    section = section[: section.index("\n## ", 1)]
    return {re.sub(r"<[^>]+>", "<*>", key) for key in ROW.findall(section)}


def key_paths(value, prefix: str, maps: set[str]):
    """Every key path in ``value``, FORMAT.md's way: ``a.b``, ``a[].b``, ``<*>`` for a map's keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.<*>" if prefix in maps else f"{prefix}.{key}" if prefix else key
            yield path
            yield from key_paths(item, path, maps)
    elif isinstance(value, list):
        for item in value:
            yield from key_paths(item, f"{prefix}[]", maps)


def undocumented(manifest: dict, documented: set[str]) -> set[str]:
    """Keys of ``manifest`` FORMAT.md does not list, unless an object containing them is listed
    without any of its keys (specified as a whole, e.g. ``foundation.args``)."""
    maps = {key.split(".<*>")[0] for key in documented if "<*>" in key}

    def whole(path: str) -> bool:
        parts = path.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in documented and not any(k.startswith((parent + ".", parent + "[].")) for k in documented):
                return True
        return False

    def listed(path: str) -> bool:  # itself, or an object whose keys are listed
        return path in documented or any(k.startswith((path + ".", path + "[].")) for k in documented)

    return {p for p in key_paths(manifest, "", maps) if not listed(p) and not whole(p)}


def test_format_md_specifies_every_key_a_build_writes(tiny_build, hoisted_build, text_build, programs_build):
    documented = documented_keys()
    assert {
        "format",
        "version",
        "adapters[].lora[].a",
        "bytes.adapters.<*>.total",
        "tokenizer.files.<*>.sha256",
    } <= documented
    seen = set()
    for build in (tiny_build, hoisted_build, text_build.build, programs_build):
        manifest = json.loads((build.out_dir / MANIFEST).read_text())  # the file as written
        seen |= set(manifest)
        assert not undocumented(manifest, documented), build.out_dir
    # The builds cover every top-level key but a quantized foundation's (documented by hand).
    assert {"shared", "tokenizer", "bytes", "program", "adapters", "kind", "programs"} <= seen
    # The check can fail: a key the writer does not document is reported.
    manifest = json.loads((tiny_build.out_dir / MANIFEST).read_text())
    manifest["program"]["new_key"] = 1
    assert undocumented(manifest, documented) == {"program.new_key"}


def rewritten(build_dir, dest, **changes):
    """A copy of a build folder whose manifest.json has ``changes`` at its top level."""
    shutil.copytree(build_dir, dest)
    manifest = json.loads((dest / MANIFEST).read_text())
    manifest.update(changes)
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return dest


def version_message(path, found) -> str:
    return (
        f"{path}: written by another lora-share version (manifest version {found}; this one reads version "
        f"{VERSION} only): rebuild the deployment with this version's `lora-share build`"
    )


def test_python_reader_refuses_another_version_or_format(tiny_build, tmp_path):
    assert read_manifest(tiny_build.out_dir)["version"] == VERSION == 2
    newer = rewritten(tiny_build.out_dir, tmp_path / "newer", version=3)
    with pytest.raises(UserError) as e:
        read_manifest(newer)
    assert str(e.value) == version_message(newer / MANIFEST, 3)
    other = rewritten(tiny_build.out_dir, tmp_path / "other", format="something-else")
    with pytest.raises(
        UserError,
        match=re.escape(
            f"{other / MANIFEST}: not a lora-share manifest (format "
            f'"something-else"; this reader reads format "{FORMAT}" version 2)'
        ),
    ):
        read_manifest(other)
    r = run_cli("add", "--to", newer, f"x={tmp_path}")
    assert r.returncode == 2 and r.stderr.strip() == "error: " + version_message(newer / MANIFEST, 3), r.stderr


def test_runner_and_server_refuse_another_version(runner_bin, tiny_build, tmp_path):
    older = rewritten(tiny_build.out_dir, tmp_path / "older", version=1)
    expected = "error: " + version_message(older / MANIFEST, 1)
    r = subprocess.run(
        [
            str(runner_bin),
            "--ptd",
            str(older / "foundation.ptd"),
            "--pte",
            str(older / "tiny_a.pte"),
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip() == expected, r.stderr
    server = REPO / "build" / "lora-share-server"
    r = subprocess.run([str(server), "--dir", str(older), "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == expected, r.stderr
    # The same folder with its version restored runs.
    rewritten(older, tmp_path / "restored", version=VERSION)
    r = subprocess.run(
        [
            str(runner_bin),
            "--ptd",
            str(tmp_path / "restored" / "foundation.ptd"),
            "--pte",
            str(tmp_path / "restored" / "tiny_a.pte"),
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


def test_write_manifest_is_all_or_nothing(tmp_path):
    write_manifest(tmp_path, {"format": FORMAT, "version": VERSION, "adapters": []})
    before = (tmp_path / MANIFEST).read_text()
    assert json.loads(before) == {"format": FORMAT, "version": VERSION, "adapters": []}
    with pytest.raises(TypeError):  # not JSON: nothing may be half-written
        write_manifest(tmp_path, {"format": FORMAT, "version": VERSION, "adapters": {1, 2}})
    assert (tmp_path / MANIFEST).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST]


def test_format_md_names_the_exporter_revision_where_it_lives():
    """FORMAT.md's `exporter` row names the module that holds EXPORTER_REVISION and gives its value."""
    from lora_share.export import revision

    row = next(
        line for line in (REPO / "schema" / "FORMAT.md").read_text().splitlines() if line.startswith("| `exporter`")
    )
    module = re.search(r"`(lora_share/[a-z_/]+\.py)` `EXPORTER_REVISION`", row)
    assert module and (REPO / module.group(1)).read_text().count("EXPORTER_REVISION =") == 1, row
    assert row.rstrip(" |").endswith(f"`{revision.EXPORTER_REVISION}`"), row
