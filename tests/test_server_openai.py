"""build/lora-share-server driven by the official `openai` Python client, as an app would: the
request shapes, errors and streaming the client expects (tests/test_server.py checks the answers
themselves against build/runner and transformers)."""

from __future__ import annotations

import pytest
from conftest import TEXT_ADAPTER, token_usage
from test_server import SECOND, TIMEOUT, Server, deployment, server_bin  # noqa: F401 (fixtures)

openai = pytest.importorskip("openai")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def client(server_bin, deployment):  # noqa: F811
    s = Server(server_bin, deployment)
    yield openai.OpenAI(base_url=f"http://{s.address}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    s.stop()


def _streamed(client, **kwargs) -> tuple[str, str]:
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def test_models_list_names_every_adapter_and_base(client):
    assert [m.id for m in client.models.list()] == [TEXT_ADAPTER, SECOND, "base"]


def test_system_and_user_chat_without_max_tokens(client):
    r = client.chat.completions.create(model=TEXT_ADAPTER, messages=MESSAGES)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    # No max_tokens: until EOS or the end of the context (64), not OpenAI's completions default of 16.
    assert choice.finish_reason == "stop" or r.usage.prompt_tokens + r.usage.completion_tokens == 64 + 1


def test_stop_sampling_and_streaming(client):
    short = [{"role": "user", "content": "Hi"}]  # room for a longer answer in the tiny context
    whole = client.chat.completions.create(model=SECOND, messages=short, max_tokens=30, extra_body={"ignore_eos": True})
    text = whole.choices[0].message.content
    assert _streamed(client, model=SECOND, messages=short, max_tokens=30, extra_body={"ignore_eos": True}) == (
        text,
        whole.choices[0].finish_reason,
    )
    # stop, on a completion whose text the tiny model makes of plain words
    plain = client.completions.create(model=TEXT_ADAPTER, prompt="The quick brown fox", max_tokens=24).choices[0]
    stop = plain.text.strip()[len(plain.text.strip()) // 2]  # a character the answer holds
    r = client.completions.create(model=TEXT_ADAPTER, prompt="The quick brown fox", max_tokens=24, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].text
    assert plain.text.startswith(r.choices[0].text)
    sampled = dict(
        model=SECOND,
        messages=MESSAGES,
        max_tokens=12,
        temperature=1.2,
        top_p=0.9,
        seed=7,
        presence_penalty=0.3,
        frequency_penalty=0.3,
    )
    first = client.chat.completions.create(**sampled).choices[0].message.content
    assert client.chat.completions.create(**sampled).choices[0].message.content == first
    assert _streamed(client, **sampled)[0] == first


def test_errors_are_the_clients_exceptions(client):
    with pytest.raises(openai.NotFoundError, match="no adapter called 'nope'"):
        client.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="n must be between 1 and 32"):
        client.chat.completions.create(model=SECOND, messages=MESSAGES, n=33)
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.function\.parameters"):
        client.chat.completions.create(
            model=SECOND, messages=MESSAGES, tools=[{"type": "function", "function": {"name": "f", "parameters": 5}}]
        )
    # Fields that change nothing are accepted.
    r = client.chat.completions.create(model=SECOND, messages=MESSAGES, max_tokens=4, user="u", stream_options=None)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_model_is_retrieved_by_id(client):
    assert client.models.retrieve(TEXT_ADAPTER).id == TEXT_ADAPTER
    assert client.models.retrieve("base").id == "base"
    with pytest.raises(openai.NotFoundError, match="The model 'nope' does not exist"):
        client.models.retrieve("nope")


def test_text_parts_and_the_developer_role(client):
    """Content as a list of text parts is the parts joined with newlines; the developer role is the
    system role: the answers equal those of the plain messages."""
    plain = [{"role": "system", "content": "Be brief.\nVery."}, {"role": "user", "content": "Hello there"}]
    parts = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Very."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello there"}]},
    ]
    want = client.chat.completions.create(model=SECOND, messages=plain, max_tokens=8)
    got = client.chat.completions.create(model=SECOND, messages=parts, max_tokens=8)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert token_usage(got.usage.model_dump()) == token_usage(want.usage.model_dump())
    other = client.chat.completions.create(model=SECOND, messages=plain[1:], max_tokens=8)
    assert other.usage.prompt_tokens != want.usage.prompt_tokens  # the system message is in the prompt


def test_the_first_streamed_chunk_says_the_role(client):
    chunks = list(client.chat.completions.create(model=SECOND, messages=MESSAGES, max_tokens=4, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
