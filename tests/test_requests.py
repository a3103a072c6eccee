"""The one request schema (lora_share.h, REQUESTS: ls_request_parse / _prepare / _run), driven through
lora_share/inference/c_library.py: the same calls build/lora-share-server, build/runner --serve and
lora_share.Runtime make.

References: the body as written (each refusal names the field it is about and quotes a short prefix of
the value), the JSON bounds (a body nested exactly LS_REQUEST_MAX_DEPTH levels is read, one more is
refused, 100,000 levels in any field get the same refusal without a crash), the build's manifest.json
(its EOS ids), the tokenizers library (the prompt's token count) and the whole response (the streamed
chunks add up to it).
"""

from __future__ import annotations

import json

import pytest
from conftest import TEXT_ADAPTER

from lora_share.inference import c_library as native

MAX_DEPTH = 64  # LS_REQUEST_MAX_DEPTH
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def runtime(runner_bin, text_build):
    # Every draft verified, so that two answers to one request count the same drafts (how many pay for
    # a step is otherwise timed on the machine).
    library = runner_bin.parent / "liblora_share.so"
    with native.open_dir(text_build.build.out_dir, library=library, speculation="every_draft") as rt:
        yield rt


def nested(depth: int, leaf=1) -> str:
    """A JSON value `depth` arrays deep, as text (json.dumps would recurse past Python's limit)."""
    return "[" * depth + json.dumps(leaf) + "]" * depth


def raw_object(**fields: str) -> str:
    """A JSON object whose values are JSON texts as given (values too deep for json.dumps)."""
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in fields.items()) + "}"


def refusal(runtime, kind: str, body: str) -> str:
    with pytest.raises(native.NativeError) as failure:
        runtime.request(kind, body)
    assert failure.value.status == "LS_ERR_REQUEST"
    return failure.value.message


def answer(runtime, kind: str, body: dict, stop=None) -> tuple[list[dict], dict]:
    with runtime.request(kind, json.dumps(body)) as request:
        request.prepare()
        events: list[str] = []
        result = request.run(events.append, stop=stop)
    return [json.loads(e) for e in events], result


@pytest.mark.parametrize(
    "field", ["max_tokens", "lora", "stream", "stop", "temperature", "n", "stream_options", "metadata", "prompt"]
)
def test_a_field_nested_100000_deep_is_refused_while_read(runtime, field):
    fields = {"model": '"base"', "prompt": '"x"'}
    fields[field] = nested(100_000)  # prompt's own value too
    body = raw_object(**fields)
    message = refusal(runtime, "completion", body)
    assert message == (
        f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep: no field takes that"
    )


def test_the_depth_bound_is_exact(runtime):
    """The body's object is level 1: metadata (accepted whatever it holds) nested to level 64 is read,
    to level 65 refused."""
    fits = raw_object(model='"base"', prompt="[1, 2]", max_tokens="1", metadata=nested(MAX_DEPTH - 1))
    events, _ = answer(runtime, "completion", json.loads(fits))
    assert events[0]["object"] == "text_completion"
    over = raw_object(model='"base"', prompt="[1, 2]", metadata=nested(MAX_DEPTH))
    assert "more than 64 levels deep" in refusal(runtime, "completion", over)
    deep_message = raw_object(
        model='"base"', messages="[" + raw_object(role='"user"', content=nested(100_000, "x")) + "]"
    )
    assert "more than 64 levels deep" in refusal(runtime, "chat", deep_message)


@pytest.mark.parametrize(
    "kind, body, words",
    [
        ("completion", "{not json", "the request body is not valid JSON (at byte 3)"),
        ("completion", "[1, 2]", "the request body must be a JSON object, got [1, 2]"),
        ("completion", {"prompt": "hi"}, "model is missing"),
        ("completion", {"model": "base"}, "prompt is missing"),
        ("chat", {"model": "base"}, "messages is missing"),
        ("completion", {"model": "base", "prompt": "hi", "max_tokens": 0}, "max_tokens must be between 1 and"),
        ("completion", {"model": "base", "prompt": "hi", "max_tokens": 2**64 - 1}, "max_tokens must be between 1 and"),
        ("completion", {"model": "base", "prompt": "hi", "max_tokens": 1.5}, "max_tokens must be an integer, got 1.5"),
        ("completion", {"model": "base", "prompt": "hi", "temperature": 5}, "temperature must be a number between 0"),
        ("completion", {"model": "base", "prompt": "hi", "top_p": -0.1}, "top_p must be a number between 0 and 1"),
        ("completion", {"model": "base", "prompt": "hi", "seed": -1}, "seed must be between 0 and"),
        ("completion", {"model": "base", "prompt": "hi", "stop": [""]}, "stop must be a non-empty string"),
        ("completion", {"model": "base", "prompt": "hi", "stream": 1}, "stream must be true or false, got 1"),
        ("completion", {"model": "base", "prompt": [1, -2]}, "prompt must be a string or an array of token ids"),
        ("completion", {"model": "", "prompt": "hi"}, "model must be the name of an adapter"),
        ("completion", {"model": "base", "prompt": "hi", "n": 40}, "n must be between 1 and 32, got 40"),
        ("completion", {"model": "base", "prompt": "hi", "logit_bias": {"x": 5}}, "logit_bias has the key 'x'"),
        ("completion", {"model": "base", "prompt": "hi", "prediction": {}}, 'prediction must be {"type": "content"'),
        (
            "completion",
            {"model": "base", "prompt": "hi", "prediction": {"type": "content", "content": 3}},
            "prediction.content",
        ),
        (
            "chat",
            {"model": "base", "messages": CHAT, "prediction": {"type": "content", "content": "x", "id": 1}},
            "prediction has an unknown field 'id'",
        ),
        ("chat", {"model": "base", "messages": CHAT, "speculative": "no"}, "speculative must be true or false"),
        ("chat", {"model": "base", "messages": CHAT, "tools": [{}]}, 'tools[0] must be {"type": "function"'),
        ("chat", {"model": "base", "messages": CHAT, "tool_choice": "auto"}, "tool_choice needs tools"),
        ("chat", {"model": "base", "messages": CHAT, "top_logprobs": 3}, "top_logprobs needs logprobs: true"),
        (
            "chat",
            {"model": "base", "messages": CHAT, "response_format": {"type": "xml"}},
            "response_format.type must be text, json_object or json_schema",
        ),
        ("chat", {"model": "base", "messages": CHAT, "prompt": "x"}, "unknown field 'prompt' for /v1/chat/completions"),
        ("completion", {"model": "base", "prompt": "x", "messages": CHAT}, "unknown field 'messages'"),
        ("chat", {"model": "base", "messages": [{"role": "user"}]}, "messages[0].content is missing"),
        ("chat", {"model": "base", "messages": [{"content": "x"}]}, 'messages[0] needs a string "role"'),
        (
            "chat",
            {"model": "base", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            'messages[0].content[0]: parts of type "image_url" are not served',
        ),
        (
            "chat",
            {"model": "base", "messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]},
            "messages[0] has the key 'tool_calls': tool_calls belong to assistant messages",
        ),
        (
            "completion",
            {"model": "chat", "prompt": "x", "lora": [{"name": "chat", "scale": 1}]},
            "model must be 'base'",
        ),
        ("completion", {"model": "base", "prompt": "x", "lora": [{"name": "chat"}]}, "lora[0].scale must be a finite"),
        (
            "completion",
            {"model": "base", "prompt": "x", "lora": [{"name": "chat", "scale": 1}, {"name": "chat", "scale": -1e30}]},
            "lora[1].scale must be within [-100, 100] (1 is the adapter as trained), got -1e+30",
        ),
        (
            "completion",
            '{"model": "base", "prompt": "x", "lora": [{"name": "chat", "scale": 1e999}]}',
            "not valid JSON",
        ),
    ],
)
def test_each_problem_is_refused_naming_its_field(runtime, kind, body, words):
    message = refusal(runtime, kind, body if isinstance(body, str) else json.dumps(body))
    assert words in message, message


def test_a_long_value_is_quoted_by_a_short_prefix(runtime):
    message = refusal(runtime, "completion", json.dumps({"model": "base", "prompt": "x", "temperature": "t" * 100_000}))
    assert message.startswith('temperature must be a number between 0 and 2, got "tttt') and message.endswith("…")
    assert len(message) < 120
    wide = refusal(runtime, "completion", json.dumps({"model": "base", "prompt": "x", "stop": list(range(10_000))}))
    assert wide.startswith("stop must be a non-empty string or an array of up to 4, got [0, 1, 2") and len(wide) < 150


def test_fields_that_change_nothing_and_null_values_are_accepted(runtime):
    body = {
        "model": "base",
        "prompt": [1, 2, 3],
        "max_tokens": 2,
        "user": "u",
        "metadata": {"k": "v"},
        "n": 1,
        "logprobs": False,
        "tools": None,
        "response_format": {"type": "text"},
        "seed": None,
    }
    events, result = answer(runtime, "completion", body)
    assert result["completion_tokens"] == len(events[0]["choices"][0]["tokens"]) <= 2


def test_prepare_resolves_the_model_the_prompt_and_the_context(runtime, tiny_build, runner_bin, text_build):
    from tokenizers import Tokenizer

    with runtime.request("completion", json.dumps({"model": "nope", "prompt": "hi"})) as request:
        with pytest.raises(
            native.NativeError, match=r"LS_ERR_NOT_FOUND: model: no adapter called 'nope' \(known: chat"
        ):
            request.prepare()
    with runtime.request("completion", json.dumps({"model": TEXT_ADAPTER, "prompt": "hi", "max_tokens": 10**6})) as r:
        with pytest.raises(native.NativeError, match=r"LS_ERR_REQUEST.*context \(max_seq_len\)"):
            r.prepare()
    text = "The quick brown fox"
    events, result = answer(runtime, "completion", {"model": TEXT_ADAPTER, "prompt": text, "max_tokens": 3})
    ids = Tokenizer.from_file(str(text_build.build.out_dir / "tokenizer.json")).encode(text).ids
    assert result["prompt_tokens"] == events[0]["usage"]["prompt_tokens"] == len(ids)
    with native.open_dir(tiny_build.out_dir, library=runner_bin.parent / "liblora_share.so") as bare:
        name = next(iter(tiny_build.ptes))
        with bare.request("completion", json.dumps({"model": name, "prompt": "hi"})) as r:
            with pytest.raises(native.NativeError, match="LS_ERR_REQUEST: prompt is text, and .* has no tokenizer"):
                r.prepare()
        events, _ = answer(bare, "completion", {"model": name, "prompt": [1, 2], "max_tokens": 2})
        assert events[0]["choices"][0]["text"] == "" and len(events[0]["choices"][0]["tokens"]) == 2


def test_streamed_chunks_add_up_to_the_whole_response(runtime):
    body = {"model": TEXT_ADAPTER, "messages": CHAT, "max_tokens": 12, "ignore_eos": True}
    (whole,), _ = answer(runtime, "chat", body)
    chunks, result = answer(runtime, "chat", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert text == whole["choices"][0]["message"]["content"]
    assert [t for c in chunks[:-1] for t in c["choices"][0]["tokens"]] == whole["choices"][0]["tokens"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert result == {
        "prompt_tokens": whole["usage"]["prompt_tokens"],
        "completion_tokens": 12,
        "finish_reason": "length",
        # The same drafts, streamed or not (one slot speculates: prompt lookup over the chat).
        "accepted_prediction_tokens": whole["usage"]["completion_tokens_details"]["accepted_prediction_tokens"],
        "rejected_prediction_tokens": whole["usage"]["completion_tokens_details"]["rejected_prediction_tokens"],
    }


def test_an_event_callback_asking_to_stop_ends_generation(runtime):
    seen: list[str] = []
    body = {"model": TEXT_ADAPTER, "prompt": "The quick", "max_tokens": 20, "ignore_eos": True, "stream": True}
    _, result = answer(runtime, "completion", body, stop=lambda: len(seen.append(1) or seen) >= 3)
    assert result["finish_reason"] == "callback" and result["completion_tokens"] == 3


def test_a_request_is_prepared_and_run_once(runtime):
    with runtime.request("completion", json.dumps({"model": "base", "prompt": [1, 2], "max_tokens": 1})) as r:
        with pytest.raises(native.NativeError, match="LS_ERR_ARGUMENT.*after ls_request_prepare"):
            r.run(lambda e: None)
        r.prepare()
        with pytest.raises(native.NativeError, match="LS_ERR_ARGUMENT.*prepared already"):
            r.prepare()
        r.run(lambda e: None)
        with pytest.raises(native.NativeError, match="LS_ERR_ARGUMENT.*runs once"):
            r.run(lambda e: None)


def test_eos_ids_are_the_manifests(runtime, text_build):
    assert runtime.eos_ids() == text_build.build.manifest["tokenizer"]["eos_token_ids"]


def test_predictions_change_no_answer_and_are_counted(runner_bin, text_build):
    """Speculation in the batch (parallel 2): the same chat answered without it ("speculative": false), with
    its own answer as the prediction (drafts kept: accepted_prediction_tokens in usage and in the result),
    and with a prediction right for its first half only; the text is the same every time."""
    library = runner_bin.parent / "liblora_share.so"
    body = {"model": TEXT_ADAPTER, "messages": CHAT, "max_tokens": 24, "ignore_eos": True, "cache_prompt": False}
    # Every draft verified: how many pay for a step is timed (step_width.h), and this test counts drafts.
    with native.open_dir(text_build.build.out_dir, library=library, parallel=2, speculation="every_draft") as rt:
        (plain,), result = answer(rt, "chat", {**body, "speculative": False})
        text = plain["choices"][0]["message"]["content"]
        assert plain["usage"]["completion_tokens_details"] == {
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        }
        (right,), result = answer(rt, "chat", {**body, "prediction": {"type": "content", "content": text}})
        assert right["choices"][0]["message"]["content"] == text
        details = right["usage"]["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] > 0
        assert result["accepted_prediction_tokens"] == details["accepted_prediction_tokens"]
        half = len(text) // 2
        wrong_text = text[:half] + " zebra quantum" * 8  # its start as answered, then what it is not
        (wrong,), _ = answer(rt, "chat", {**body, "prediction": {"type": "content", "content": wrong_text}})
        assert wrong["choices"][0]["message"]["content"] == text
        stats = rt.stats()
    # The runtime's totals hold the request's (rejected drafts: tests/test_families.py, at the token level).
    assert stats["drafted_tokens"] >= stats["accepted_tokens"] >= details["accepted_prediction_tokens"]
