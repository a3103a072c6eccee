"""Ask every adapter of a build the same prompt through one `build/runner --serve` process; print a table.

    .venv/bin/python examples/demo/show.py out/llama_adapters [--prompt "1 2 3"] [--runner build/runner]

One runner process loads every adapter .pte of the build against its one foundation.ptd and
answers one JSON request per adapter (`{"adapter": ..., "prompt": ..., "max_new_tokens": ...}`),
first "base", the foundation alone (no LoRA), for comparison; the build's tokenizer
(foundation.tokenizer in the config) encodes the prompt and decodes the replies, and each reply stops
at the tokenizer's end-of-sequence token.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DEFAULT_PROMPT = "1 2 3"

# What each demo adapter learned (examples/demo/train_adapters.py trains them).
LEARNED = {
    "base": "nothing: the random foundation alone",
    "counter": "counts on by one to the next ten",
    "countdown": "counts down by one to the ten below",
    "doubler": "doubles while the result stays within 100",
    "speller": "counts on in words to the next ten",
}


def ask_all(out: Path, runner: Path, prompt: str, max_new_tokens: int) -> list[dict]:
    """One JSON answer for "base" (the foundation alone), then one per adapter of the build at ``out``
    (manifest order), from one runner process."""
    if not (out / "manifest.json").is_file():
        raise SystemExit(f"error: {out}: no manifest.json (build it: lora-share build configs/llama_adapters.yaml)")
    if not runner.is_file():
        raise SystemExit(f"error: {runner}: no such runner (build it with `make runner`)")
    manifest = json.loads((out / "manifest.json").read_text())
    names = ["base", *(a["name"] for a in manifest["adapters"])]
    cmd = [str(runner), "--ptd", str(out / "foundation.ptd"), "--serve"]
    for a in manifest["adapters"]:
        cmd += ["--pte", str(out / a["file"])]
    requests = "".join(json.dumps({"adapter": n, "prompt": prompt, "max_new_tokens": max_new_tokens}) + "\n"
                       for n in names)
    done = subprocess.run(cmd, input=requests, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {runner} --serve failed (exit {done.returncode}): {done.stderr.strip()}")
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    for name, answer in zip(names, answers):
        if "error" in answer:
            raise SystemExit(f"error: adapter {name}: {answer['error']}")
    return [{"adapter": n, **a} for n, a in zip(names, answers)]


def table(prompt: str, answers: list[dict]) -> str:
    """The answers side by side: adapter, what it learned, its text."""
    rows = [("adapter", "learned to", f"reply to {prompt!r}")]
    rows += [(a["adapter"], LEARNED.get(a["adapter"], "?"), a["text"]) for a in answers]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="a lora-share build folder (foundation.ptd, manifest.json, adapters)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--runner", type=Path, default=Path("build/runner"))
    p.add_argument("--max-new-tokens", type=int, default=16)
    ns = p.parse_args(argv)
    print(table(ns.prompt, ask_all(ns.out, ns.runner, ns.prompt, ns.max_new_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
