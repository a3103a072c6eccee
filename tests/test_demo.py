"""The synthetic deployment (configs/llama_adapters.yaml): its trained adapters write distinct, sensible text.

Its foundation is synthetic random weights; examples/demo/train_adapters.py trained
four PEFT adapters over it on toy tasks and a toy tokenizer. These tests build the config as shipped
(into a temporary folder) and check, by generating through build/runner and `lora-share run`, that
each adapter's reply to the demo prompt is real text (not one token repeated), that no two adapters
write the same text, and that each adapter does its task on prompts it was not trained on. The
expected replies are computed here from each task's plain-words rule, not read from the trainer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli

sys.path.insert(0, str(REPO / "examples" / "demo"))
import show  # noqa: E402  (examples/demo/show.py: what `make demo` prints)

TRAINED_ON = REPO / "examples" / "demo" / "adapters" / "trained_on.json"
WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split()
)


def _on_to_ten(n: int) -> list[int]:
    """n+1, n+2, ... up to and including the next multiple of ten."""
    return list(range(n + 1, (n // 10 + 1) * 10 + 1))


def expected(adapter: str, last: int) -> str:
    """What each adapter was taught to write after a prompt whose last number is ``last``."""
    if adapter == "counter":
        return " ".join(map(str, _on_to_ten(last)))
    if adapter == "countdown":
        return " ".join(map(str, range(last - 1, (last - 1) // 10 * 10 - 1, -1)))
    if adapter == "doubler":
        out = [2 * last]
        while out[-1] * 2 <= 100:
            out.append(out[-1] * 2)
        return " ".join(map(str, out))
    if adapter == "speller":
        return " ".join(WORDS[k] for k in _on_to_ten(last))
    raise AssertionError(f"no rule for adapter {adapter}")


# Prompts of other lengths and contents than the demo's; the last number picks the answer.
HELD_OUT = {
    "counter": ["40 17", "88 2 9 64"],
    "countdown": ["5 73", "16 16 16 48"],
    "doubler": ["99 7", "1 11"],
    "speller": ["30 12", "four 7 5"],
}


def _serve(runner: Path, out: Path, requests: list[dict]) -> list[dict]:
    """JSON answers of one `build/runner --serve` process holding every adapter of ``out``."""
    manifest = json.loads((out / "manifest.json").read_text())
    cmd = [str(runner), "--ptd", str(out / "foundation.ptd"), "--serve"]
    for a in manifest["adapters"]:
        cmd += ["--pte", str(out / a["file"])]
    done = subprocess.run(
        cmd, input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(requests) and not any("error" in a for a in answers), answers
    return answers


@pytest.mark.slow
def test_adapters_were_trained_on_this_foundation(demo_build):
    """The stored fingerprint is the built foundation's: retrain (train_adapters.py) if the config changed."""
    manifest = json.loads((demo_build / "manifest.json").read_text())
    assert json.loads(TRAINED_ON.read_text())["foundation_fingerprint"] == manifest["foundation"]["fingerprint"]


@pytest.mark.slow
def test_demo_prompt_gives_distinct_real_text(demo_build, runner_bin):
    """What `make demo` prints: every adapter writes several different tokens and its own text, none of
    them the foundation's alone ("base", asked first)."""
    answers = show.ask_all(demo_build, runner_bin, show.DEFAULT_PROMPT, 16)
    base, answers = answers[0], answers[1:]
    assert base["adapter"] == "base" and base["text"] not in [a["text"] for a in answers], base
    texts = {a["adapter"]: a["text"] for a in answers}
    assert set(texts) == set(HELD_OUT), texts
    for a in answers:
        assert len(set(a["tokens"])) > 1, f"{a['adapter']} repeats one token: {a['tokens']}"
        assert len(set(a["text"].split())) > 1, f"{a['adapter']}: {a['text']!r}"
    assert len(set(texts.values())) == len(texts), texts
    table = show.table(show.DEFAULT_PROMPT, [base, *answers])
    assert all(t in table for t in texts.values()) and "\nbase " in table
    last = int(show.DEFAULT_PROMPT.split()[-1])
    assert texts == {name: expected(name, last) for name in texts}


@pytest.mark.slow
def test_each_adapter_does_its_task_on_held_out_prompts(demo_build, runner_bin):
    requests = [{"adapter": name, "prompt": p, "max_new_tokens": 16} for name, ps in HELD_OUT.items() for p in ps]
    for r, answer in zip(requests, _serve(runner_bin, demo_build, requests)):
        assert answer["text"] == expected(r["adapter"], int(r["prompt"].split()[-1])), (r, answer)


@pytest.mark.slow
def test_python_runtime_agrees(demo_build):
    """`lora-share run --prompt` (ExecuTorch's Python runtime) writes the same reply as the runner."""
    for name in ("counter", "speller"):
        done = run_cli(
            "run",
            "--pte",
            demo_build / f"{name}.pte",
            "--ptd",
            demo_build / "foundation.ptd",
            "--prompt",
            show.DEFAULT_PROMPT,
            "--max-new-tokens",
            16,
            "--json",
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["text"] == expected(name, int(show.DEFAULT_PROMPT.split()[-1]))
