"""The README starts the project on its first screen, and its links and figures hold.

Checked against the files themselves: the README's length and where its first command is, every
relative link of the README and of docs/*.md against the files in the checkout, and each line of the
README's table of measured results against the Makefile's targets, the CLI's subcommands, the
repository's history (the commit it names must exist, when the checkout has its history) and the
results file it links (which must record that commit, written by that command).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_LINES = 300
FIRST_SCREEN = 30
# [text](target) in Markdown, the target up to a space, ')' or '#'
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def _lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_readme_is_at_most_300_lines():
    assert len(_lines()) <= MAX_LINES, f"README.md has {len(_lines())} lines; move detail into docs/"


def test_first_command_is_on_the_first_screen():
    lines = _lines()
    fence = next(i for i, line in enumerate(lines) if line.startswith("```"))
    first_command = lines[fence + 1]
    assert fence + 1 < FIRST_SCREEN, f"the first command is on line {fence + 2}, past line {FIRST_SCREEN}"
    assert first_command.split()[:2] == ["make", "demo"], first_command
    assert any(line.split()[:2] == ["make", "test"] for line in lines[fence + 1 : FIRST_SCREEN])


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for target, _anchor in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                    continue
                if not (page.parent / target).exists():
                    broken.append(f"{page.relative_to(REPO)}:{n}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_readme_links_docs_pages():
    linked = {Path(t).name for t, _ in LINK.findall(README.read_text(encoding="utf-8")) if t.startswith("docs/")}
    assert linked, "README.md links no page of docs/"


def _results_rows() -> list[list[str]]:
    """The cells of each row of the README's first table under '## Measured'."""
    lines = _lines()
    start = lines.index("## Measured")
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[1:]  # the header row names the columns


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", text, flags=re.M))


def _has_history() -> bool:
    probe = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
    )
    return probe.returncode == 0 and probe.stdout.strip() == "false"


def test_each_measured_figure_names_its_command_and_commit():
    rows = _results_rows()
    assert rows, "README.md has no table of measured results under '## Measured'"
    targets = _make_targets()
    history = _has_history()
    for cells in rows:
        row = " | ".join(cells)
        commands = re.findall(r"`make ([a-z0-9-]+)`", row)
        assert commands, f"no `make TARGET` command in: {row}"
        for target in commands:
            assert target in targets, f"`make {target}` is not a Makefile target: {row}"
        commits = COMMIT.findall(cells[-1])
        assert commits, f"no commit in the last cell of: {row}"
        if history:
            for commit in commits:
                found = subprocess.run(
                    ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
                )
                assert found.returncode == 0, f"commit {commit} is not in this repository's history: {row}"


def test_each_measured_row_names_the_commit_its_results_file_records():
    """Each row's commit links to a results file in benchmarks/results/ whose header (bench/common.py)
    records that very commit, and, where it records its command, the row's `make` target ran it."""
    for cells in _results_rows():
        row = " | ".join(cells)
        links = [(text, target) for text, target in re.findall(r"\[([^\]]+)\]\(([^)]+)\)", cells[-1])]
        assert len(links) == 1, f"the last cell should be [commit](benchmarks/results/FILE.json): {row}"
        commit, target = links[0]
        assert target.startswith("benchmarks/results/") and target.endswith(".json"), row
        results = json.loads((REPO / target).read_text(encoding="utf-8"))
        assert results["commit"] == commit, f"{target} records commit {results['commit']}, the row names {commit}"
        command = re.search(r"`make ([a-z0-9-]+)`", row).group(1)
        if "command" in results:
            assert results["command"].split()[:2] == ["lora-share", command], (target, results["command"], row)
