"""lora_share.Runtime: a deployment served in-process by the C library, OpenAI-shaped answers.

The reference is build/lora-share-server on the same folder: the chat answer, its finish reason and its
usage must be equal, whole or streamed. A wheel (make wheel) installed into a fresh venv outside the
checkout, with no torch and no other package, answers the same (slow: it builds and installs the wheel).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, TEXT_ADAPTER, run_in_wheel_venv
from devices import CHAT, chat_once, command

from lora_share import NativeError, Runtime

NEW = 10


@pytest.fixture(scope="module")
def server_answer(runner_bin, text_build) -> dict:
    return chat_once(
        command(runner_bin.parent / "lora-share-server"), text_build.build.out_dir, TEXT_ADAPTER, max_tokens=NEW
    )


@pytest.fixture(scope="module")
def runtime(runner_bin, text_build):
    with Runtime(text_build.build.out_dir, library=runner_bin.parent / "liblora_share.so") as rt:
        yield rt


def test_chat_completion_is_the_servers(runtime, server_answer):
    got = runtime.create_chat_completion(CHAT, adapter=TEXT_ADAPTER, max_tokens=NEW)
    want = server_answer["choices"][0]
    assert got["object"] == "chat.completion" and got["model"] == TEXT_ADAPTER
    assert got["choices"][0]["message"] == want["message"] and want["message"]["content"]
    assert got["choices"][0]["finish_reason"] == want["finish_reason"]
    assert got["usage"] == server_answer["usage"]


def test_streamed_chat_adds_up_to_the_whole(runtime, server_answer):
    chunks = list(runtime.create_chat_completion(CHAT, adapter=TEXT_ADAPTER, max_tokens=NEW, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == server_answer["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == server_answer["choices"][0]["finish_reason"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)


def test_generate_text_and_leaving_a_stream_early(runtime):
    whole = runtime.generate("The quick brown fox", adapter=TEXT_ADAPTER, max_tokens=8)
    assert whole["object"] == "text_completion" and whole["usage"]["completion_tokens"] <= 8
    pieces = runtime.generate("The quick brown fox", adapter=TEXT_ADAPTER, max_tokens=8, stream=True)
    first = next(pieces)
    pieces.close()  # the generation thread stops at its next piece; the runtime serves on
    assert whole["choices"][0]["text"].startswith(first["choices"][0]["text"])
    assert runtime.generate("The quick brown fox", adapter=TEXT_ADAPTER, max_tokens=8)["choices"] == whole["choices"]


def test_adapters_stats_and_errors(runtime):
    assert runtime.adapters == [TEXT_ADAPTER]
    assert runtime.stats()["adapters_known"] == 1
    with pytest.raises(NativeError, match="LS_ERR_NOT_FOUND.*nobody") as info:
        runtime.create_chat_completion(CHAT, adapter="nobody")
    assert info.value.status == "LS_ERR_NOT_FOUND"
    with pytest.raises(NativeError, match="LS_ERR_REQUEST.*role 'wizard'"):
        runtime.create_chat_completion([{"role": "wizard", "content": "x"}], adapter=TEXT_ADAPTER, max_tokens=2)
    with pytest.raises(NativeError, match="LS_ERR_LOAD.*manifest.json"):
        Runtime(REPO / "no-such-folder")


SCRIPT = """
import json, sys
import lora_share
from lora_share import Runtime
from lora_share.inference import c_library
folder, adapter, messages = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rt = Runtime(folder)
out = {"package": lora_share.__file__, "library": str(c_library.PACKAGED_LIBRARY),
       "adapters": rt.adapters, "answer": rt.create_chat_completion(messages, adapter=adapter, max_tokens=%d),
       "torch": "torch" in sys.modules}
try:
    Runtime(folder + "/nope")
except lora_share.NativeError as e:
    out["error"] = e.status
print(json.dumps(out))
""".replace("%d", str(NEW))


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_answers_as_the_server(wheel_python, text_build, server_answer, tmp_path):
    run = run_in_wheel_venv(
        wheel_python, SCRIPT, text_build.build.out_dir, TEXT_ADAPTER, json.dumps(CHAT), cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    env_dir = wheel_python.parent.parent
    assert Path(out["package"]).is_relative_to(env_dir) and Path(out["library"]).is_relative_to(env_dir)
    assert not out["torch"] and out["adapters"] == [TEXT_ADAPTER] and out["error"] == "LS_ERR_LOAD"
    assert out["answer"]["choices"][0]["message"] == server_answer["choices"][0]["message"]
    assert out["answer"]["usage"] == server_answer["usage"]
