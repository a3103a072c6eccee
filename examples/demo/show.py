"""Ask every adapter of a build the same prompt through one `build/runner --serve` process; print a table.

    .venv/bin/python examples/demo/show.py out/llama_adapters [--prompt "1 2 3"] [--runner build/runner]
    .venv/bin/python examples/demo/show.py out/smollm2 --chat "Why is the sky blue?" \
        [--server build/lora-share-server --server-adapter json]

One runner process loads every adapter .pte of the build against its one foundation.ptd and
answers one JSON request per adapter (`{"adapter": ..., "prompt": ..., "max_new_tokens": ...}`),
first "base", the foundation alone (no LoRA), for comparison; the build's tokenizer encodes the
prompt and decodes the replies, and each reply stops at the build's end-of-sequence tokens. With
`--chat`, the question is put in the build's chat template first (transformers' apply_chat_template
on the build's tokenizer files) and sent as token ids. With `--server`, the build is then served by
the OpenAI-compatible server and one adapter is asked the question as a chat completion.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
from pathlib import Path

DEFAULT_PROMPT = "1 2 3"

# What each demo adapter learned (examples/demo/train_adapters.py trains the toy ones,
# examples/smollm2/train_adapters.py the real model's).
LEARNED = {
    "base": "nothing: the foundation alone",
    "shout": "answers in capital letters",
    "brief": "answers in one short sentence",
    "json": "answers as a JSON object",
    "bullets": "answers as a list",
    "counter": "counts on by one to the next ten",
    "countdown": "counts down by one to the ten below",
    "doubler": "doubles while the result stays within 100",
    "speller": "counts on in words to the next ten",
}


def chat_ids(out: Path, question: str) -> list[int]:
    """``question`` as one user turn in the build's chat template, ready for the answer, as token ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def ask_all(out: Path, runner: Path, prompt: str, max_new_tokens: int, chat: bool = False) -> list[dict]:
    """One JSON answer for "base" (the foundation alone), then one per adapter of the build at ``out``
    (manifest order), from one runner process; ``chat`` puts the prompt in the chat template."""
    if not (out / "manifest.json").is_file():
        raise SystemExit(f"error: {out}: no manifest.json (build it: lora-share build configs/llama_adapters.yaml)")
    if not runner.is_file():
        raise SystemExit(f"error: {runner}: no such runner (build it with `make runner`)")
    manifest = json.loads((out / "manifest.json").read_text())
    names = ["base", *(a["name"] for a in manifest["adapters"])]
    cmd = [str(runner), "--ptd", str(out / "foundation.ptd"), "--serve"]
    for a in manifest["adapters"]:
        cmd += ["--pte", str(out / a["file"])]
    asked = {"tokens": chat_ids(out, prompt)} if chat else {"prompt": prompt}
    requests = "".join(json.dumps({"adapter": n, **asked, "max_new_tokens": max_new_tokens}) + "\n" for n in names)
    done = subprocess.run(cmd, input=requests, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {runner} --serve failed (exit {done.returncode}): {done.stderr.strip()}")
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    for name, answer in zip(names, answers):
        if "error" in answer:
            raise SystemExit(f"error: adapter {name}: {answer['error']}")
    return [{"adapter": n, **a} for n, a in zip(names, answers)]


def table(prompt: str, answers: list[dict]) -> str:
    """The answers side by side: adapter, what it learned, its text (a reply of several lines goes on
    under its first, indented)."""
    rows = [("adapter", "learned to", f"reply to {prompt!r}")]
    rows += [(a["adapter"], LEARNED.get(a["adapter"], "?"), a["text"].strip()) for a in answers]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    indent = " " * (widths[0] + widths[1] + 4)
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  " + r[2].replace("\n", "\n" + indent) for r in rows]
    lines.insert(1, "-" * min(100, max(len(line) for part in lines for line in part.splitlines())))
    return "\n".join(lines)


def ask_server(out: Path, server: Path, adapter: str, question: str, max_tokens: int) -> str:
    """The reply of ``adapter`` to ``question`` as one chat completion from build/lora-share-server
    serving ``out`` (started on a free port, stopped after)."""
    if not server.is_file():
        raise SystemExit(f"error: {server}: no such server (build it with `make runner`)")
    proc = subprocess.Popen(
        [str(server), "--dir", str(out), "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stderr.readline()  # "listening on http://127.0.0.1:PORT (...)", or an error
        if not line.startswith("listening on http://"):
            raise SystemExit(f"error: {server} did not start: {line.strip()} {proc.stderr.read().strip()}")
        host, port = line.split("http://", 1)[1].split()[0].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        body = {"model": adapter, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens}
        conn.request(
            "POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        reply = json.loads(conn.getresponse().read())
        if "error" in reply:
            raise SystemExit(f"error: the server answered: {reply['error']}")
        return reply["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="a lora-share build folder (foundation.ptd, manifest.json, adapters)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--runner", type=Path, default=Path("build/runner"))
    p.add_argument("--chat", metavar="QUESTION", help="ask QUESTION in the build's chat template instead")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--server", type=Path, help="then ask build/lora-share-server one chat completion")
    p.add_argument("--server-adapter", help="the adapter the server is asked (default: the build's first)")
    ns = p.parse_args(argv)
    prompt = ns.chat or ns.prompt
    answers = ask_all(ns.out, ns.runner, prompt, ns.max_new_tokens, chat=ns.chat is not None)
    print(f"--- build/runner --serve (C++): one process, one foundation.ptd, every adapter asked {prompt!r}:")
    print(table(prompt, answers))
    if ns.server:
        adapter = ns.server_adapter or answers[1]["adapter"]
        print(f"--- build/lora-share-server: POST /v1/chat/completions, model {adapter!r}, {prompt!r}:")
        print(ask_server(ns.out, ns.server, adapter, prompt, ns.max_new_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
