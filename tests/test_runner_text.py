"""build/runner with text: --prompt encodes with the build's tokenizer (C++, cpp_runner/tokenizer),
streams the reply as text and stops at EOS; --serve takes JSON lines; a tokenizer that is not the
build's is refused naming both files, and a build without one says so.

References: transformers' AutoTokenizer and LlamaForCausalLM + peft's PeftModel `generate` on the very
checkpoint and adapter folders that were built (greedy, 16 tokens), the tokenizers library's decode,
and `lora-share run --prompt` (the Python runtime) on the same build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TEXT_ADAPTER, run_cli
from hf_files import hf_generate
from tokenizer_files import sentencepiece_bpe

from lora_share.files import sha256_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PROMPT = "The quick brown fox jumps over the lazy dog."  # > 16 tokens: prefilled in two chunks
NEW = 16
NO_TOKENIZER = (
    "has no tokenizer (the build's checkpoint had none): pass --tokens ids, or add foundation.tokenizer "
    "to the config and rebuild"
)


def runner(runner_bin, *args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(runner_bin), *map(str, args)], input=stdin, capture_output=True, text=True, timeout=300)


def base_args(build_dir: Path, *extra) -> list:
    return [
        "--pte",
        build_dir / f"{TEXT_ADAPTER}.pte",
        "--ptd",
        build_dir / "foundation.ptd",
        "--max-new-tokens",
        NEW,
        *extra,
    ]


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.split("\n") if line]


@pytest.fixture(scope="module")
def reference(text_build, text_hf) -> dict:
    """What transformers + peft say for PROMPT: prompt ids, generated ids, decoded text."""
    tokenizer, model = text_hf
    ids = tokenizer(PROMPT)["input_ids"]
    tokens = hf_generate(model, ids, NEW)
    return {"prompt": ids, "tokens": tokens, "text": tokenizer.decode(tokens, skip_special_tokens=True)}


def copy_build(text_build, dest: Path) -> Path:
    shutil.copytree(text_build.build.out_dir, dest)
    return dest


def test_prompt_matches_transformers_peft_and_python(runner_bin, text_build, reference):
    out = text_build.build.out_dir
    r = runner(runner_bin, *base_args(out, "--prompt", PROMPT, "--json"))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert len(reference["prompt"]) > 16 and got["prompt_tokens"] == len(reference["prompt"])
    assert got["tokens"] == reference["tokens"]
    assert got["text"] == reference["text"] and got["text"]
    # The Python runtime on the same build agrees id for id and character for character.
    py = run_cli("run", *base_args(out, "--prompt", PROMPT, "--json"))
    assert py.returncode == 0, py.stderr
    py = json.loads(py.stdout)
    assert (py["prompt"], py["tokens"], py["text"]) == (reference["prompt"], got["tokens"], got["text"])
    # Without --json the text is streamed to stdout, then a newline; nothing else.
    r = runner(runner_bin, *base_args(out, "--prompt", PROMPT))
    assert r.returncode == 0, r.stderr
    assert r.stdout == got["text"] + "\n"


def test_generation_stops_at_the_manifest_eos(runner_bin, text_build, reference, text_hf, tmp_path):
    """EOS ids come from manifest.json's tokenizer section: one that greedy decoding reaches (a plain
    word piece) stops generation there; the token is returned but is not text."""
    greedy = reference["tokens"]
    eos = max(set(greedy[: NEW - 1]), key=greedy.index)  # reached for the first time last, before NEW
    out = copy_build(text_build, tmp_path / "out")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["eos_token_ids"] = [eos]
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = runner(runner_bin, *base_args(out, "--prompt", PROMPT, "--json"))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    tokenizer, model = text_hf
    want = hf_generate(model, reference["prompt"], NEW, eos=[eos])
    assert got["tokens"] == want == greedy[: greedy.index(eos) + 1] and len(want) < NEW
    assert got["text"] == tokenizer.decode(want[:-1], skip_special_tokens=True)
    r = runner(runner_bin, *base_args(out, "--prompt", PROMPT))
    assert r.returncode == 0 and r.stdout == got["text"] + "\n"


def test_serve_json_lines(runner_bin, text_build, reference, text_hf):
    tokenizer, model = text_hf
    ids = reference["prompt"]
    no_stop = hf_generate(model, ids, NEW, eos=[])[:4]  # tokens in, tokens out: no EOS stop
    requests = [
        {"adapter": TEXT_ADAPTER, "prompt": PROMPT},
        {"adapter": TEXT_ADAPTER, "tokens": ids, "max_new_tokens": 4},
        "{not json",
        {"adapter": "nope", "prompt": "hi"},
        {"adapter": TEXT_ADAPTER, "prompt": "hi", "tokens": [1]},
        {"adapter": TEXT_ADAPTER},
        {"adapter": TEXT_ADAPTER, "prompt": "hi", "max_tokens": 3},
        {"adapter": TEXT_ADAPTER, "prompt": "hi", "max_new_tokens": 0},
        {"adapter": TEXT_ADAPTER, "prompt": 5},
        {"adapter": TEXT_ADAPTER, "tokens": [0, 99999]},
        {"prompt": "hi"},
        f"{TEXT_ADAPTER}\t{','.join(map(str, ids))}",  # the TAB format still works
        {"adapter": TEXT_ADAPTER, "prompt": PROMPT, "temperature": 0, "seed": 3},  # serving went on
    ]
    stdin = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    r = runner(
        runner_bin,
        "--pte",
        text_build.pte,
        "--ptd",
        text_build.build.ptd,
        "--max-new-tokens",
        NEW,
        "--serve",
        stdin=stdin,
    )
    assert r.returncode == 0, r.stderr
    answers = json_lines(r.stdout)
    assert len(answers) == len(requests)
    first, by_ids, *bad, tab, last = answers
    assert (first["tokens"], first["text"]) == (reference["tokens"], reference["text"])
    assert (by_ids["tokens"], by_ids["text"]) == (no_stop, tokenizer.decode(no_stop, skip_special_tokens=True))
    assert tab["tokens"] == hf_generate(model, ids, NEW, eos=[]) and "text" not in tab
    assert last == {**first, **{k: last[k] for k in last if k.endswith(("_ms", "_per_s"))}}
    assert [set(b) for b in bad] == [{"error"}] * len(bad)
    messages = [b["error"] for b in bad]
    assert messages[0].startswith("not a JSON object")
    assert "\"adapter\": no adapter called 'nope' (known: chat" in messages[1]
    assert 'exactly one of "prompt"' in messages[2] and 'exactly one of "prompt"' in messages[3]
    assert 'unknown key "max_tokens"' in messages[4]
    assert '"max_new_tokens" must be between 1 and 2147483647, got 0' in messages[5]
    assert '"prompt": expected a string' in messages[6]
    assert "99999" in messages[7]
    assert '"adapter"' in messages[8]


def test_serve_without_tokenizer_answers_ids_and_refuses_text(runner_bin, tiny_build):
    name = next(iter(tiny_build.ptes))
    stdin = (
        json.dumps({"adapter": name, "prompt": "hi"}) + "\n" + json.dumps({"adapter": name, "tokens": [1, 2]}) + "\n"
    )
    r = runner(
        runner_bin,
        "--pte",
        tiny_build.ptes[name],
        "--ptd",
        tiny_build.ptd,
        "--max-new-tokens",
        2,
        "--serve",
        stdin=stdin,
    )
    assert r.returncode == 0, r.stderr
    refused, answered = json_lines(r.stdout)
    assert refused == {"error": f"{tiny_build.out_dir} {NO_TOKENIZER}"}
    assert len(answered["tokens"]) == 2 and "text" not in answered


def test_a_build_without_tokenizer_says_so(runner_bin, tiny_build):
    name = next(iter(tiny_build.ptes))
    r = runner(runner_bin, "--pte", tiny_build.ptes[name], "--ptd", tiny_build.ptd, "--prompt", "hello")
    assert r.returncode == 2
    assert r.stderr == f"error: {tiny_build.out_dir} {NO_TOKENIZER}\n"


def test_a_tokenizer_from_another_build_is_refused(runner_bin, text_build, tmp_path):
    out = copy_build(text_build, tmp_path / "out")
    sentencepiece_bpe(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "tokenizer.json", out / "tokenizer.json")
    listed = text_build.build.manifest["tokenizer"]["files"]["tokenizer.json"]["sha256"]
    want = (
        f"error: {out / 'tokenizer.json'} (sha256 {sha256_file(out / 'tokenizer.json')[:12]}…) is not the "
        f"tokenizer {out / 'foundation.ptd'} was built with (manifest.json lists {listed[:12]}…): "
        "copy tokenizer.json from the same build\n"
    )
    r = runner(runner_bin, *base_args(out, "--prompt", "hi"))
    assert r.returncode == 2 and r.stderr == want
    # The same words as the Python runtime.
    py = run_cli("run", *base_args(out, "--prompt", "hi"))
    assert py.returncode == 2 and py.stderr == want
    # --serve refuses it before loading anything, rather than answering with the wrong tokenizer.
    r = runner(runner_bin, "--pte", out / f"{TEXT_ADAPTER}.pte", "--ptd", out / "foundation.ptd", "--serve", stdin="")
    assert r.returncode == 2 and r.stderr == want
    # --tokenizer DIR: the original build's foundation.ptd, the tampered folder's tokenizer.
    r = runner(runner_bin, *base_args(text_build.build.out_dir, "--prompt", "hi", "--tokenizer", out))
    assert r.returncode == 2
    assert f"{out / 'tokenizer.json'} (sha256" in r.stderr and f"{text_build.build.ptd} was built with" in r.stderr


def test_a_foundation_from_another_build_is_refused(runner_bin, text_build, tiny_build, tmp_path):
    out = copy_build(text_build, tmp_path / "swapped")
    shutil.copy(tiny_build.ptd, out / "foundation.ptd")
    r = runner(runner_bin, *base_args(out, "--prompt", "hi"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"{out / 'manifest.json'} describes foundation " in r.stderr
    assert f", not {out / 'foundation.ptd'} (foundation " in r.stderr
    manifest = json.loads((copy_build(text_build, tmp_path / "edited") / "manifest.json").read_text())
    manifest["tokenizer"]["foundation_fingerprint"] = "f" * 64
    (tmp_path / "edited" / "manifest.json").write_text(json.dumps(manifest))
    r = runner(runner_bin, *base_args(tmp_path / "edited", "--prompt", "hi"))
    assert r.returncode == 2
    assert "manifest.json: its tokenizer section is for foundation ffffffffffff…" in r.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tokens", "1,2", "--prompt", "hi"], "--tokens and --prompt are mutually exclusive"),
        ([], "give the prompt as --tokens IDS"),
        (["--tokens", "1,2", "--tokenizer", "x"], "--tokenizer is read only with --prompt or --serve"),
        (["--prompt", "hi", "--serve"], "--prompt is not used with --serve"),
    ],
)
def test_usage_errors(runner_bin, text_build, args, message):
    r = runner(runner_bin, "--pte", text_build.pte, "--ptd", text_build.build.ptd, *args)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert message in r.stderr


def test_prompt_needs_the_ptd(runner_bin, text_build):
    r = runner(runner_bin, "--pte", text_build.pte, "--prompt", "hi")
    assert r.returncode == 2 and "--prompt needs the build's foundation.ptd (--ptd)" in r.stderr


def test_chat_answers_as_lora_share_run_chat(runner_bin, text_build):
    """build/runner --chat (the manifest's chat format) and `lora-share run --chat` (transformers'
    apply_chat_template): the same prompt length, tokens and text."""
    message = "Hello, how are you today?"
    ours = runner(runner_bin, *base_args(text_build.build.out_dir, "--chat", message, "--json"))
    assert ours.returncode == 0, ours.stderr
    theirs = run_cli("run", *base_args(text_build.build.out_dir, "--chat", message, "--json"))
    assert theirs.returncode == 0, theirs.stderr
    got, want = json.loads(ours.stdout), json.loads(theirs.stdout)
    assert (got["prompt_tokens"], got["tokens"], got["text"]) == (len(want["prompt"]), want["tokens"], want["text"])
    both = runner(runner_bin, *base_args(text_build.build.out_dir, "--chat", message, "--prompt", "x"))
    assert both.returncode == 2 and "pick one" in both.stderr


def test_serve_messages_answer_as_chat(runner_bin, text_build):
    """A --serve line with "messages" (system + user) is rendered with the build's chat template: the
    answer of `lora-share run` on the prompt transformers' apply_chat_template makes of them."""
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    hf = AutoTokenizer.from_pretrained(str(text_build.checkpoint))
    ids = list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    want = run_cli(
        "run",
        *base_args(text_build.build.out_dir, "--tokens", ",".join(map(str, ids)), "--json", "--max-new-tokens", 8),
    )  # the tiny context holds 52 + 8
    assert want.returncode == 0, want.stderr
    stdin = (
        json.dumps({"adapter": TEXT_ADAPTER, "messages": messages, "max_new_tokens": 8})
        + "\n"
        + json.dumps({"adapter": TEXT_ADAPTER, "messages": [{"role": "wizard", "content": "x"}]})
        + "\n"
    )
    r = runner(runner_bin, *base_args(text_build.build.out_dir, "--serve"), stdin=stdin)
    assert r.returncode == 0, r.stderr
    got, bad = json_lines(r.stdout)
    assert got["tokens"] == json.loads(want.stdout)["tokens"], got
    assert "role 'wizard'" in bad["error"]


def test_serve_openai_lines_answer_as_the_server(runner_bin, text_build):
    """A --serve line with "model" is the server's body, read by the same schema: the answer's choices
    and usage equal lora_share.Runtime's (the server's calls, in-process), whole or one chunk a line;
    a refused field says what the server says. Both verify every draft: how many drafts pay for a step
    is timed on the machine, so the usage's draft counts would otherwise hang on load."""
    from lora_share import NativeError, Runtime

    chat = {"model": TEXT_ADAPTER, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "top_k": 3}
    completion = {"model": TEXT_ADAPTER, "prompt": PROMPT, "max_tokens": 5, "stop": ["zz"], "seed": 2}
    bad = {"model": TEXT_ADAPTER, "prompt": "x", "temperature": 5}
    lines = [chat, {**chat, "stream": True}, completion, bad]
    r = runner(
        runner_bin,
        *base_args(text_build.build.out_dir, "--serve", "--every-draft"),
        stdin="".join(json.dumps(line) + "\n" for line in lines),
    )
    assert r.returncode == 0, r.stderr
    whole, *rest = json_lines(r.stdout)
    chunks, (done, refused) = rest[:-2], rest[-2:]
    library = runner_bin.parent / "liblora_share.so"
    with Runtime(text_build.build.out_dir, library=library, speculation="every_draft") as rt:
        want = rt.create_chat_completion(**chat)
        want_chunks = list(rt.create_chat_completion(**chat, stream=True))
        want_done = rt.create_completion(**completion)
        with pytest.raises(NativeError) as failure:
            rt.create_completion(**bad)
    assert whole["object"] == "chat.completion"
    assert (whole["choices"], whole["usage"]) == (want["choices"], want["usage"])
    assert [c["choices"] for c in chunks] == [c["choices"] for c in want_chunks]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (done["choices"], done["usage"]) == (want_done["choices"], want_done["usage"])
    assert refused == {"error": failure.value.message}
    assert failure.value.message == "temperature must be a number between 0 and 2, got 5"
