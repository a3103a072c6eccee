"""Text in and out: the checkpoint's tokenizer ships with the build, `lora-share run --prompt/--chat`
gives what transformers + peft give, and a tokenizer that is not the build's is refused.

The references are independent: transformers' AutoTokenizer, LlamaForCausalLM + peft's PeftModel
`generate` on the very checkpoint and adapter folders that were built, the `tokenizers` library's
decode, and hashlib over the files as written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEXT_ADAPTER, run_cli, write_config
from hf_files import hf_config, hf_generate, write_hf_llama, write_peft_lora
from tokenizer_files import byte_level_bpe, sentencepiece_bpe

from lora_share.errors import UserError
from lora_share.files import sha256_file
from lora_share.formats import read_ptd
from lora_share.formats.records import foundation_record
from lora_share.tokenizer.files import BoundTokenizer, bind_tokenizer, load_tokenizer
from lora_share.tokenizer.text import REPLACEMENT, TextStream, encode_prompt

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Longer than the build's prefill chunk (16), so the prompt is fed in two calls.
PROMPT = "The quick brown fox jumps over the lazy dog."
NEW = 16
NO_TOKENIZER = (
    "has no tokenizer (the build's checkpoint had none): pass --tokens ids, or add foundation.tokenizer "
    "to the config and rebuild"
)
# Text that byte-level BPE splits inside characters (emoji, CJK) and with runs of whitespace.
HARD_TEXT = "Emoji 😀👍🏽 and 中文文本, “quotes” — café\n\n  tabs\tend 👨‍👩‍👧"


def _json_run(*args) -> dict:
    r = run_cli("run", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _run_args(text_build, *extra) -> list:
    return ["--pte", text_build.pte, "--ptd", text_build.build.ptd, "--max-new-tokens", NEW, *extra]


def _copy_build(text_build, dest: Path) -> Path:
    shutil.copytree(text_build.build.out_dir, dest)
    return dest


# ---------------------------------------------------------------------------
# The build


def test_manifest_lists_the_tokenizer_files_as_written(text_build):
    manifest, out = text_build.build.manifest, text_build.build.out_dir
    section = manifest["tokenizer"]
    assert json.loads((out / "manifest.json").read_text())["tokenizer"] == section
    assert set(section["files"]) == {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}
    for name, entry in section["files"].items():
        data = (out / name).read_bytes()
        assert data == (text_build.checkpoint / name).read_bytes()  # copied verbatim
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    fingerprint = foundation_record(read_ptd(text_build.build.ptd)).fingerprint
    assert section["foundation_fingerprint"] == manifest["foundation"]["fingerprint"] == fingerprint
    tokenizer = load_tokenizer(out / "tokenizer.json")
    # generation_config.json's eos ids, and tokenizer_config.json's eos_token (already among them)
    assert section["eos_token_ids"] == [tokenizer.token_to_id("<|end_of_text|>"), tokenizer.token_to_id("<|eot_id|>")]
    assert section["bos_token_id"] == tokenizer.token_to_id("<|begin_of_text|>")
    assert section["chat_template"] is True
    assert "tokenizer" not in manifest["export_settings"]  # a new tokenizer alone never re-exports an adapter


def test_a_tokenizer_that_does_not_fit_the_model_is_a_build_error(text_build, tmp_path):
    small = hf_config(vocab=320)  # the tokenizer has ids up to 399
    write_hf_llama(tmp_path / "llama", small)
    write_peft_lora(tmp_path / "peft", small, r=2, alpha=4, targets=["q_proj"])
    cfg = write_config(
        tmp_path, {"checkpoint": "llama", "tokenizer": str(text_build.checkpoint)}, [{"name": "a", "peft": "peft"}]
    )
    r = run_cli("build", cfg)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (
        f"{text_build.checkpoint / 'tokenizer.json'}: has token id 399, but the model's vocabulary is 320" in r.stderr
    )
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------
# run --prompt / --chat against transformers + peft


def test_prompt_matches_transformers_and_peft(text_build, text_hf):
    tokenizer, model = text_hf
    got = _json_run(*_run_args(text_build, "--prompt", PROMPT))
    ids = tokenizer(PROMPT)["input_ids"]
    assert len(ids) > 16 and got["prompt"] == ids
    want = hf_generate(model, ids, NEW)
    assert got["tokens"] == want
    assert got["text"] == tokenizer.decode(want, skip_special_tokens=True)
    assert set(got) >= {"tokens", "prompt", "text", "timings"}
    # Without --json the text is streamed to stdout, then a newline; nothing else.
    r = run_cli("run", *_run_args(text_build, "--prompt", PROMPT))
    assert r.returncode == 0, r.stderr
    assert r.stdout == got["text"] + "\n"


def test_chat_matches_apply_chat_template(text_build, text_hf):
    tokenizer, model = text_hf
    message = "Hello, how are you today?"
    got = _json_run(*_run_args(text_build, "--chat", message))
    want_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
    )
    want_ids = want_ids["input_ids"] if not isinstance(want_ids, list) else want_ids  # transformers 5: a BatchEncoding
    assert got["prompt"] == list(want_ids)
    assert got["tokens"] == hf_generate(model, got["prompt"], NEW)


def test_generation_stops_at_eos(eos_build, text_hf):
    eos, greedy, build = eos_build.eos, eos_build.greedy, eos_build.build
    tokenizer, model = text_hf
    assert build.manifest["adapters"][0]["produced"] == "reused"
    eos_ids = build.manifest["tokenizer"]["eos_token_ids"]
    assert eos_ids == [eos, tokenizer.convert_tokens_to_ids("<|end_of_text|>")]
    got = _json_run("--pte", build.ptes[TEXT_ADAPTER], "--ptd", build.ptd, "--max-new-tokens", NEW, "--prompt", PROMPT)
    want = hf_generate(model, tokenizer(PROMPT)["input_ids"], NEW, eos=eos_ids)
    assert got["tokens"] == want == greedy[: greedy.index(eos) + 1]
    assert len(want) < NEW and want[-1] == eos
    # The EOS token is not text, even when it is an ordinary word piece.
    assert got["text"] == tokenizer.decode(want[:-1], skip_special_tokens=True)
    r = run_cli(
        "run", "--pte", build.ptes[TEXT_ADAPTER], "--ptd", build.ptd, "--max-new-tokens", NEW, "--prompt", PROMPT
    )
    assert r.returncode == 0 and r.stdout == got["text"] + "\n"


# ---------------------------------------------------------------------------
# Streaming and encoding, against the tokenizers and transformers libraries


@pytest.fixture(scope="module", params=["byte_level_bpe", "sentencepiece_bpe"])
def tokenizer_dir(request, tmp_path_factory):
    write = {"byte_level_bpe": byte_level_bpe, "sentencepiece_bpe": sentencepiece_bpe}[request.param]
    return write(tmp_path_factory.mktemp(request.param), vocab_size=400)


def test_stream_never_writes_half_a_character(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir / "tokenizer.json")
    ids = tokenizer.encode(HARD_TEXT, add_special_tokens=True).ids
    eos = tokenizer.token_to_id("<|end_of_text|>") or tokenizer.token_to_id("</s>")
    ids = ids[:5] + [eos] + ids[5:]  # a special token in the middle is not text
    pieces = []
    stream = TextStream(tokenizer, pieces.append)
    for i in ids:
        stream.push(i)
    assert all(REPLACEMENT not in p for p in pieces)
    assert len(pieces) < len(ids)  # some ids ended inside a character and were held back
    assert "".join(pieces) == stream.finish() == tokenizer.decode(ids, skip_special_tokens=True)
    assert stream.finish().strip() == HARD_TEXT.strip()


def test_stream_leaves_out_stop_ids_and_flushes_what_is_held(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir / "tokenizer.json")
    ids = tokenizer.encode("😀", add_special_tokens=False).ids
    word = tokenizer.encode("fox", add_special_tokens=False).ids
    assert len(ids) > 1  # the emoji is several byte tokens
    pieces = []
    stream = TextStream(tokenizer, pieces.append, stop_ids=word)
    for i in word + ids[:-1]:  # the emoji's last byte never comes
        stream.push(i)
    assert all(REPLACEMENT not in p and "fox" not in p for p in pieces)
    text = stream.finish()  # the end writes what is held, as decode gives it
    assert text == tokenizer.decode(ids[:-1], skip_special_tokens=True) and text.endswith(REPLACEMENT)
    assert "".join(pieces) == text


def test_prompt_ids_are_autotokenizer_ids(tokenizer_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    bound = BoundTokenizer(tokenizer_dir, load_tokenizer(tokenizer_dir / "tokenizer.json"), [], None, True)
    for text in [PROMPT, HARD_TEXT, " leading space", "x"]:
        assert encode_prompt(bound, text) == reference(text)["input_ids"], text


# ---------------------------------------------------------------------------
# The binding check


@pytest.fixture(scope="module")
def plain_build(tiny_build, tmp_path_factory):
    """tiny_build (a synthetic foundation: no tokenizer) built again with the real `lora-share build`
    command into a copy of its output folder, so every file is reused and nothing is exported."""
    root = tmp_path_factory.mktemp("plain")
    shutil.copytree(tiny_build.out_dir, root / "out")
    shutil.copy(tiny_build.config, root / "deploy.yaml")  # output_dir: out, next to the config
    r = run_cli("build", root / "deploy.yaml")
    assert r.returncode == 0, r.stderr
    return r, root / "out"


def test_a_build_without_tokenizer_says_so(plain_build):
    r, out = plain_build
    assert "tokenizer: none (a synthetic foundation" in r.stderr
    assert "in all, no tokenizer," in r.stderr
    assert "tokenizer" not in json.loads((out / "manifest.json").read_text())
    assert not (out / "tokenizer.json").exists()
    for flag in ("--prompt", "--chat"):
        r = run_cli("run", "--pte", out / "tiny_a.pte", "--ptd", out / "foundation.ptd", flag, "hello")
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr == f"error: {out} {NO_TOKENIZER}\n"


def test_a_tokenizer_from_another_build_is_refused(text_build, tmp_path):
    out = _copy_build(text_build, tmp_path / "out")
    sentencepiece_bpe(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "tokenizer.json", out / "tokenizer.json")
    listed = text_build.build.manifest["tokenizer"]["files"]["tokenizer.json"]["sha256"]
    want = (
        f"error: {out / 'tokenizer.json'} (sha256 {sha256_file(out / 'tokenizer.json')[:12]}…) is not the "
        f"tokenizer {out / 'foundation.ptd'} was built with (manifest.json lists {listed[:12]}…): "
        "copy tokenizer.json from the same build\n"
    )
    r = run_cli("run", "--pte", out / f"{TEXT_ADAPTER}.pte", "--ptd", out / "foundation.ptd", "--prompt", "hi")
    assert r.returncode == 2 and r.stderr == want
    # --tokenizer DIR: the original build's foundation.ptd, the tampered folder's tokenizer
    r = run_cli("run", *_run_args(text_build, "--prompt", "hi", "--tokenizer", out))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{out / 'tokenizer.json'} (sha256" in r.stderr and f"{text_build.build.ptd} was built with" in r.stderr
    # --tokenizer with the build's own folder is accepted
    assert (
        _json_run(*_run_args(text_build, "--prompt", "hi", "--tokenizer", text_build.build.out_dir))["text"] is not None
    )


def test_a_manifest_or_foundation_from_another_build_is_refused(text_build, plain_build, tmp_path):
    ptd = text_build.build.ptd
    out = _copy_build(text_build, tmp_path / "out")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["foundation_fingerprint"] = "f" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        UserError,
        match=re.escape(f"manifest.json: its tokenizer section is for foundation ffffffffffff…, not {ptd} (foundation"),
    ):
        bind_tokenizer(ptd, out)
    # foundation.ptd of another build beside this build's manifest and tokenizer
    other = _copy_build(text_build, tmp_path / "swapped")
    shutil.copy(plain_build[1] / "foundation.ptd", other / "foundation.ptd")
    with pytest.raises(
        UserError,
        match=rf"{re.escape(str(other / 'manifest.json'))} describes foundation .*, not "
        rf"{re.escape(str(other / 'foundation.ptd'))} \(foundation",
    ):
        bind_tokenizer(other / "foundation.ptd")
    (other / "tokenizer.json").unlink()
    shutil.copy(ptd, other / "foundation.ptd")
    with pytest.raises(UserError, match=r"tokenizer.json: missing, but .* copy tokenizer.json from the same build"):
        bind_tokenizer(other / "foundation.ptd")


def test_usage_errors(text_build):
    r = run_cli("run", "--pte", text_build.pte, "--ptd", text_build.build.ptd)
    assert r.returncode == 2 and "one of the arguments --tokens --prompt --input --chat is required" in r.stderr
    r = run_cli("run", *_run_args(text_build, "--prompt", "hi", "--tokens", "1,2"))
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    r = run_cli("run", *_run_args(text_build, "--tokens", "1,2", "--tokenizer", text_build.build.out_dir))
    assert r.returncode == 2 and "--tokenizer is read only with --prompt or --chat" in r.stderr


# ---------------------------------------------------------------------------
# lora-share add


def test_add_leaves_the_tokenizer_untouched(text_build, tmp_path):
    out = _copy_build(text_build, tmp_path / "out")
    names = list(text_build.build.manifest["tokenizer"]["files"])
    before = {n: os.stat(out / n) for n in names}
    base_cfg = hf_config(vocab=400)
    write_peft_lora(
        tmp_path / "more", base_cfg, r=4, alpha=8, targets=["q_proj", "v_proj", "o_proj", "down_proj"], seed=9
    )
    r = run_cli("add", "--to", out, f"more={tmp_path / 'more'}")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["adapters"][-1]["produced"] == "written"
    assert manifest["tokenizer"] == text_build.build.manifest["tokenizer"]
    for n in names:
        after = os.stat(out / n)
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
            before[n].st_ino,
            before[n].st_mtime_ns,
            before[n].st_size,
        )
    assert _json_run("--pte", out / "more.pte", "--ptd", out / "foundation.ptd", "--prompt", "hi")["text"] is not None


# ---------------------------------------------------------------------------
# transformers is needed by --chat only


def test_only_chat_needs_transformers(text_build, tmp_path):
    """With `import transformers` failing, --prompt still runs and --chat says what to install."""
    shim = tmp_path / "shim" / "transformers"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('transformers is not installed (test shim)')\n")
    env = {**os.environ, "PYTHONPATH": str(shim.parent)}
    exe = Path(sys.executable).parent / "lora-share"

    def run(*args):
        return subprocess.run(
            [str(exe), "run", *map(str, _run_args(text_build, *args))],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )

    r = run("--prompt", PROMPT)
    assert r.returncode == 0, r.stderr
    r = run("--chat", "hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (
        "--chat renders the model's chat template with transformers, which is not installed: "
        "pip install 'lora-share[chat]'" in r.stderr
    )


def test_chat_without_a_template_is_refused(text_build):
    from lora_share.tokenizer.text import chat_prompt

    folder = text_build.build.out_dir
    bound = BoundTokenizer(folder, load_tokenizer(folder / "tokenizer.json"), [1], 0, chat_template=False)
    with pytest.raises(UserError, match=re.escape(f"{folder / 'tokenizer_config.json'}: has no chat_template")):
        chat_prompt(bound, "hi")
