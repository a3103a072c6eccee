"""lora_share.Runtime: a deployment served in-process by the C library, OpenAI-shaped answers.

The reference is build/lora-share-server on the same folder: the same request (every field the server
takes: sampling, stop, stream, text parts, the developer role) gives the same choices and usage, whole or
streamed, and the same refusal. A wheel (make wheel) installed into a fresh venv outside the
checkout, with no torch and no other package, answers the same (slow: it builds and installs the wheel).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, TEXT_ADAPTER, run_in_wheel_venv, token_usage
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
    assert token_usage(got["usage"]) == token_usage(server_answer["usage"])


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


REQUESTS = [
    ("chat", {"messages": CHAT, "max_tokens": NEW}),
    (
        "chat",
        {"messages": CHAT, "max_tokens": 12, "temperature": 1.2, "top_p": 0.9, "seed": 7, "presence_penalty": 0.3},
    ),
    ("completion", {"prompt": "The quick brown fox", "max_tokens": 12, "stop": [" the", "zz"], "top_k": 5}),
    ("completion", {"prompt": [0, 17, 42, 99], "max_tokens": 6, "ignore_eos": True, "repeat_penalty": 1.3}),
    (
        "chat",
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
            ],
            "max_tokens": 8,
            "stream_options": {"include_usage": True},
        },
    ),
]


@pytest.fixture(scope="module")
def server(runner_bin, text_build):
    from test_server import Server

    s = Server(runner_bin.parent / "lora-share-server", text_build.build.out_dir)
    yield s
    s.stop()


def _path(kind: str) -> str:
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def _call(runtime, kind: str, body: dict):
    if kind == "chat":
        return runtime.create_chat_completion(model=TEXT_ADAPTER, **body)
    return runtime.create_completion(model=TEXT_ADAPTER, **body)


@pytest.mark.parametrize("kind, body", REQUESTS, ids=range(len(REQUESTS)))
def test_the_same_request_gets_the_servers_answer(runtime, server, kind, body):
    status, want = server.request("POST", _path(kind), {"model": TEXT_ADAPTER, **body})
    assert status == 200, want
    got = _call(runtime, kind, body)
    assert got["choices"] == want["choices"] and token_usage(got["usage"]) == token_usage(want["usage"])
    assert (got["object"], got["model"]) == (want["object"], want["model"])
    streamed = list(_call(runtime, kind, {**body, "stream": True}))
    events = server.stream(_path(kind), {"model": TEXT_ADAPTER, **body})
    assert [c["choices"] for c in streamed] == [e["choices"] for e in events]
    usage = lambda u: u and token_usage(u)  # noqa: E731
    assert [usage(c.get("usage")) for c in streamed] == [usage(e.get("usage")) for e in events]


@pytest.mark.parametrize(
    "fields",
    [{"temperature": 5}, {"top_p": 2}, {"n": 33}, {"stop": ["a"] * 5}, {"mirostat": 2}, {"logprobs": "yes"}],
    ids=lambda f: next(iter(f)),
)
def test_a_bad_field_is_refused_as_the_server_refuses_it(runtime, server, fields):
    status, want = server.request("POST", "/v1/chat/completions", {"model": TEXT_ADAPTER, "messages": CHAT, **fields})
    assert status == 400
    with pytest.raises(NativeError) as failure:
        runtime.create_chat_completion(CHAT, model=TEXT_ADAPTER, **fields)
    assert failure.value.status == "LS_ERR_REQUEST" and failure.value.message == want["error"]["message"]


SCRIPT = """
import json, sys
import lora_share
from lora_share import Runtime
from lora_share.inference import c_abi
folder, adapter, messages = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rt = Runtime(folder)
out = {"package": lora_share.__file__, "library": str(c_abi.PACKAGED_LIBRARY),
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
    assert token_usage(out["answer"]["usage"]) == token_usage(server_answer["usage"])


def test_closing_the_runtime_frees_a_stream_never_read(runner_bin, text_build):
    """A streamed request holds its mix until its iterator ends; a runtime closed before that frees it
    first (freeing it after ls_close would release a mix the runtime has already freed)."""
    rt = Runtime(text_build.build.out_dir, library=runner_bin.parent / "liblora_share.so")
    lora = [{"name": TEXT_ADAPTER, "scale": 0.5}]
    unread = rt.create_completion("The quick brown fox", lora=lora, max_tokens=4, stream=True)
    assert rt.stats()["adapters_resident"] <= 1
    rt.close()
    del unread  # its request was freed by close: nothing left to release
    with Runtime(text_build.build.out_dir, library=runner_bin.parent / "liblora_share.so") as again:
        whole = again.create_completion("The quick brown fox", lora=lora, max_tokens=4)
        assert whole["model"] == "base" and whole["usage"]["completion_tokens"] <= 4
