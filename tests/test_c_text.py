"""Text through the C library (lora_share.h, TEXT), driven through lora_share/inference/c_library.py.

References: transformers (the checkpoint's own tokenizer renders the chat template; transformers + peft
greedy generation gives the answer of a text prompt, stopping at the build's EOS ids) and
build/lora-share-server (the chat answer to the same messages). A build without a tokenizer and bad
messages come back as an ls_status and a message.
"""

from __future__ import annotations

import os

import pytest
from conftest import EOS_NEW, EOS_PROMPT, TEXT_ADAPTER
from devices import CHAT, chat_once, command
from hf_files import hf_generate

from lora_share.inference import c_library as native

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    CHAT,
    [
        {"role": "system", "content": "  padded  "},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "café ☕ 中文"},
    ],
]


@pytest.fixture(scope="module")
def library(runner_bin):
    return runner_bin.parent / "liblora_share.so"


def test_chat_template_is_transformers(library, text_build, text_hf):
    tokenizer, _ = text_hf
    with native.open_dir(text_build.build.out_dir, library=library) as rt:
        tok = rt.tokenizer()
        for messages in CONVERSATIONS:
            want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert tok.apply_chat_template(messages) == want
            assert tok.encode(want, add_special=False) == tokenizer(want, add_special_tokens=False)["input_ids"]
        with pytest.raises(native.NativeError, match="LS_ERR_REQUEST.*role 'wizard'"):
            tok.apply_chat_template([{"role": "wizard", "content": "x"}])
    # The folder's tokenizer opened on its own is the same one.
    with native.open_tokenizer(text_build.build.out_dir, library=library) as tok:
        assert tok.apply_chat_template(CHAT) == tokenizer.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=True
        )


@pytest.mark.parametrize("ignore_eos", [False, True], ids=["stop", "ignore-eos"])
def test_generate_text_is_transformers_greedy(library, eos_build, text_hf, ignore_eos):
    """ls_generate_text on eos_build: the text transformers + peft generate greedily from the same prompt,
    stopping at the build's EOS (finish "stop", the EOS not text) or going on to max tokens."""
    tokenizer, model = text_hf
    ids = tokenizer(EOS_PROMPT)["input_ids"]
    eos_ids = [] if ignore_eos else eos_build.build.manifest["tokenizer"]["eos_token_ids"]
    want = hf_generate(model, ids, EOS_NEW, eos=eos_ids)
    stopped = not ignore_eos and want[-1] in eos_ids
    assert stopped != ignore_eos  # the build's EOS really ends it early
    pieces: list[str] = []
    with native.open_dir(eos_build.build.out_dir, library=library) as rt:
        text, result = rt.generate_text(TEXT_ADAPTER, EOS_PROMPT, EOS_NEW, ignore_eos=ignore_eos, on_text=pieces.append)
    tokens = want[:-1] if stopped else want
    assert text == tokenizer.decode(tokens, skip_special_tokens=True) == "".join(pieces)
    assert result == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(tokens),
        "finish_reason": "stop" if stopped else "length",
    }


def test_generate_chat_is_the_servers_answer(library, runner_bin, text_build):
    want = chat_once(
        command(runner_bin.parent / "lora-share-server"), text_build.build.out_dir, TEXT_ADAPTER, max_tokens=10
    )
    with native.open_dir(text_build.build.out_dir, library=library) as rt:
        text, result = rt.generate_text(TEXT_ADAPTER, CHAT, 10)
        # A callback that asks to stop after its first piece ends generation there.
        first, stopped = rt.generate_text(TEXT_ADAPTER, CHAT, 10, stop_after=1)
    choice = want["choices"][0]
    assert text == choice["message"]["content"] and text
    assert result["finish_reason"] == choice["finish_reason"]
    assert result["prompt_tokens"] == want["usage"]["prompt_tokens"]
    assert result["completion_tokens"] == want["usage"]["completion_tokens"]
    assert stopped["finish_reason"] == "callback" and text.startswith(first) and first


def test_a_build_without_tokenizer_says_so(library, tiny_build):
    with native.open_dir(tiny_build.out_dir, library=library) as rt:
        with pytest.raises(native.NativeError, match="LS_ERR_NOT_FOUND.*has no tokenizer"):
            rt.tokenizer()
        with pytest.raises(native.NativeError, match="LS_ERR_NOT_FOUND.*has no tokenizer"):
            rt.generate_text("tiny_a", "hello")
        assert rt.generate("tiny_a", [1, 2, 3], 2)  # ids still work


def test_unknown_adapter_and_empty_prompt(library, text_build):
    with native.open_dir(text_build.build.out_dir, library=library) as rt:
        with pytest.raises(native.NativeError, match=f"LS_ERR_NOT_FOUND.*nobody.*known: {TEXT_ADAPTER}"):
            rt.generate_text("nobody", "hello")
        with pytest.raises(native.NativeError, match="LS_ERR_REQUEST"):
            rt.generate_text(TEXT_ADAPTER, [{"role": "wizard", "content": "x"}])


def test_c_example_chats_in_text(library, text_build, tmp_path):
    """examples/c_app --chat (built against build/install) prints the library's streamed answer."""
    from conftest import REPO
    from devices import build_c_app, run

    c_app = build_c_app(REPO / "build/install", tmp_path / "c_app")
    question = "Why is the sky blue?"
    out = run(c_app, "--chat", text_build.build.out_dir, TEXT_ADAPTER, question, 12).stdout
    with native.open_dir(text_build.build.out_dir, library=library) as rt:
        text, _ = rt.generate_text(TEXT_ADAPTER, [{"role": "user", "content": question}], 12)
    assert out == text + "\n" and text


def test_a_default_system_prompt_is_rendered_as_transformers_does(library, text_build, tmp_path):
    """A template that writes a default system message when none comes first (SmolLM2's): the C
    library puts it first, and a system message of one's own replaces it, as transformers renders."""
    import json
    import shutil

    from test_chat_format import CHATML_DEFAULT_SYSTEM, tokenizer_with

    from lora_share.tokenizer.chat_format import resolve_chat_format

    folder, hf = tokenizer_with(tmp_path, CHATML_DEFAULT_SYSTEM)
    fmt = resolve_chat_format(folder)
    assert "default_system" in fmt
    out = tmp_path / "out"
    shutil.copytree(text_build.build.out_dir, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["chat_format"] = fmt
    (out / "manifest.json").write_text(json.dumps(manifest))
    with native.open_tokenizer(out, library=library) as tok:
        for messages in CONVERSATIONS:
            want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert tok.apply_chat_template(messages) == want
