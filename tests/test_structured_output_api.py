"""Structured output, logprobs, logit_bias and n through every door (docs/structured-output.md,
docs/server.md): build/lora-share-server driven by the official `openai` client, and lora_share.Runtime,
which sends the same body through the same library calls.

References: the `jsonschema` library judges every JSON answer, pydantic parses the client's `parse`
helper, transformers + peft (the eager model) give the log-probabilities, and the same request alone is
what a row of a mixed batch and each of n choices must equal. The tiny text model is random: its answers
are whatever it likes inside the mask, so validity is the mask's doing; the schemas bound every string
and number so that an answer ends within the context.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import numpy as np
import pytest
from conftest import TEXT_ADAPTER
from test_server import TIMEOUT, Server, server_bin  # noqa: F401 (fixtures)
from test_structured_output import eager_log_softmax, library  # noqa: F401 (fixtures)

from lora_share import Runtime

pytestmark = pytest.mark.slow  # its own export (a 1024-token context), a server and transformers

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

PARALLEL = 4
MESSAGES = [{"role": "user", "content": "The fox and the dog, in JSON."}]
FORM = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "word": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "count", "word", "ok"],
    "additionalProperties": False,
}
STRICT = {"type": "json_schema", "json_schema": {"name": "form", "schema": FORM, "strict": True}}


class Form(pydantic.BaseModel):
    answer: Literal["yes", "no", "maybe"]
    count: int = pydantic.Field(ge=0, le=99)
    word: str = pydantic.Field(max_length=6)
    ok: bool


@pytest.fixture(scope="module")
def server(server_bin, long_text_build):  # noqa: F811
    s = Server(server_bin, long_text_build.out_dir, "--parallel", PARALLEL)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.address}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def runtime(library, long_text_build):  # noqa: F811
    with Runtime(long_text_build.out_dir, library=library) as rt:
        yield rt


def post(server, body: dict, path: str = "/v1/chat/completions") -> tuple[int, dict]:
    """The server's status and JSON answer, the raw body as sent (ids in "tokens" included)."""
    request = urllib.request.Request(
        f"http://{server.address}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_json_schema_strict_answers_validate(client):
    for model in (TEXT_ADAPTER, "base"):
        for seed in range(3):
            r = client.chat.completions.create(
                model=model, messages=MESSAGES, response_format=STRICT, temperature=1.0, seed=seed
            )
            assert r.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(r.choices[0].message.content), FORM)


def test_json_object_answers_parse(client, runtime):
    # The random model would write one string forever: a bias towards closing it keeps the object short.
    quote, brace = (runtime.tokenize(c, add_special=False)[0] for c in ('"', "}"))
    r = client.chat.completions.create(
        model=TEXT_ADAPTER,
        messages=MESSAGES,
        response_format={"type": "json_object"},
        logit_bias={str(quote): 100, str(brace): 50},
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_llama_server_fields_constrain_too(server):
    for field in ({"json_schema": FORM}, {"grammar": 'root ::= "yes" | "no"'}):
        status, r = post(server, {"model": TEXT_ADAPTER, "messages": MESSAGES, **field})
        assert status == 200, r
        text = r["choices"][0]["message"]["content"]
        if "json_schema" in field:
            jsonschema.validate(json.loads(text), FORM)
        else:
            assert text in ("yes", "no")


def test_the_clients_parse_helper_returns_the_object(client):
    r = client.chat.completions.parse(model=TEXT_ADAPTER, messages=MESSAGES, response_format=Form)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Form)
    assert parsed == Form.model_validate_json(r.choices[0].message.content)


def test_logprobs_are_the_eager_models_log_softmax(server, runtime, text_hf):
    """Chat's logprobs.content: each token's logprob and its top 5 equal log_softmax of transformers' logits
    within 1e-4, the likeliest first, and under greedy decoding each chosen token is the top one; the
    streamed chunks carry the same entries."""
    body = {"model": TEXT_ADAPTER, "messages": MESSAGES, "max_tokens": 8, "logprobs": True, "top_logprobs": 5}
    status, r = post(server, {**body, "ignore_eos": True})
    assert status == 200, r
    choice = r["choices"][0]
    tokens, content = choice["tokens"], choice["logprobs"]["content"]
    assert len(content) == len(tokens) == 8
    prompt = runtime.tokenize(runtime._rt.tokenizer().apply_chat_template(MESSAGES), add_special=False)
    reference = eager_log_softmax(text_hf, prompt, tokens)
    for i, (token, entry) in enumerate(zip(tokens, content)):
        assert abs(entry["logprob"] - reference[i, token]) < 1e-4, i
        assert bytes(entry["bytes"]).decode(errors="replace") == entry["token"]
        assert entry["bytes"] == list(runtime._rt.tokenizer().decode([token], False).encode())
        want = np.argsort(-reference[i], kind="stable")[:5]
        np.testing.assert_allclose([t["logprob"] for t in entry["top_logprobs"]], reference[i, want], atol=1e-4)
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the likeliest
    streamed = []
    for chunk in openai.OpenAI(
        base_url=f"http://{server.address}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    ).chat.completions.create(stream=True, extra_body={"ignore_eos": True}, **body):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += [e.model_dump() for e in chunk.choices[0].logprobs.content]
    assert streamed == content


def test_logit_bias_of_minus_100_removes_a_token(server):
    body = {"model": TEXT_ADAPTER, "messages": MESSAGES, "max_tokens": 12, "ignore_eos": True}
    _, free = post(server, body)
    banned = free["choices"][0]["tokens"][0]
    _, biased = post(server, {**body, "logit_bias": {str(banned): -100}})
    assert banned not in biased["choices"][0]["tokens"]
    assert len(biased["choices"][0]["tokens"]) == 12


def test_n_choices_are_each_the_request_alone_with_its_seed(client):
    body = dict(model=TEXT_ADAPTER, messages=MESSAGES, max_tokens=10, temperature=1.5)
    r = client.chat.completions.create(n=3, seed=11, **body)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for i, choice in enumerate(r.choices):
        alone = client.chat.completions.create(seed=11 + i, **body).choices[0]
        assert (choice.message.content, choice.finish_reason) == (alone.message.content, alone.finish_reason)
    assert r.usage.completion_tokens >= 3
    # Streamed, each chunk names its choice.
    texts = ["", "", ""]
    for chunk in client.chat.completions.create(n=3, seed=11, stream=True, **body):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in r.choices]


def test_a_constrained_row_of_a_mixed_batch_is_the_request_alone(server):
    bodies = [
        {"model": TEXT_ADAPTER, "response_format": STRICT},
        {"model": "base", "grammar": 'root ::= "the fox" | "the dog" | "a cat"'},
        {"model": TEXT_ADAPTER, "max_tokens": 24},
        {"model": "base", "max_tokens": 24},
    ]
    bodies = [{**b, "messages": MESSAGES, "temperature": 1.0, "seed": 3, "cache_prompt": False} for b in bodies]
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        together = list(pool.map(lambda b: post(server, b), bodies))
    for body, (status, r) in zip(bodies, together):
        assert status == 200, r
        assert r["choices"][0] == post(server, body)[1]["choices"][0], body["model"]


@pytest.mark.parametrize(
    "body, field",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/no"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nothing"}}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"json_schema": {"type": "object", "not": {}}}, "json_schema"),
        ({"grammar": "root ::= ("}, "grammar"),
        ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"1000000": 5}}, "logit_bias"),
        ({"logit_bias": {"7": 101}}, "logit_bias"),
        ({"n": 33}, "n"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    ],
)
def test_each_refusal_is_a_400_naming_the_field(server, runtime, body, field):
    status, r = post(server, {"model": TEXT_ADAPTER, "messages": MESSAGES, **body})
    assert status == 400, r
    assert field in r["error"]["message"]
    with pytest.raises(Exception, match=field.replace(".", r"\.").replace("$", r"\$")) as raised:
        runtime.create_chat_completion(MESSAGES, model=TEXT_ADAPTER, **body)
    assert raised.value.args[0] == r["error"]["message"] or r["error"]["message"] in str(raised.value)


def test_the_runtime_answers_as_the_server(server, runtime):
    fields = {"response_format": STRICT, "temperature": 1.0, "seed": 5, "logprobs": True, "top_logprobs": 2}
    _, served = post(server, {"model": TEXT_ADAPTER, "messages": MESSAGES, **fields})
    answer = runtime.create_chat_completion(MESSAGES, model=TEXT_ADAPTER, **fields)
    jsonschema.validate(json.loads(answer["choices"][0]["message"]["content"]), FORM)
    # The server batches (--parallel 4), the runtime runs one row: logprobs equal to float rounding.
    ours, theirs = answer["choices"][0], served["choices"][0]
    assert ours["message"] == theirs["message"] and ours["tokens"] == theirs["tokens"]
    assert ours["finish_reason"] == theirs["finish_reason"] == "stop"
    for a, b in zip(ours["logprobs"]["content"], theirs["logprobs"]["content"], strict=True):
        assert (a["token"], a["bytes"]) == (b["token"], b["bytes"])
        assert math.isclose(a["logprob"], b["logprob"], abs_tol=1e-4)
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
DIGIT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "pick", "parameters": DIGIT}},
]
SCHEMAS = {"get_weather": WEATHER, "pick": DIGIT}


def tools_prompt(tools) -> str:
    """docs/structured-output.md's generic format, written out here from the doc."""
    listed = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            # The body's objects are read with their keys sorted: the parameters come out so.
            "parameters": json.loads(json.dumps(t["function"].get("parameters", {}), sort_keys=True)),
        }
        for t in tools
    ]
    return (
        "You can call these functions:\n"
        + json.dumps(listed, separators=(",", ":"))
        + '\nTo call one, answer with only a JSON object {"name": the function\'s name, "arguments": its arguments}.'
    )


def test_a_named_tool_choice_is_a_valid_call_and_its_result_is_answered(client, runtime):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=TEXT_ADAPTER, messages=MESSAGES, tools=TOOLS, tool_choice=named)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    # The prompt is the documented generic format in the build's chat template.
    rendered = [{"role": "system", "content": tools_prompt(TOOLS)}, *MESSAGES]
    prompt = runtime.tokenize(runtime._rt.tokenizer().apply_chat_template(rendered), add_special=False)
    assert r.usage.prompt_tokens == len(prompt)
    # The call and its result sent back: answered, and rendered as documented.
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21"},
    ]
    answer = client.chat.completions.create(
        model=TEXT_ADAPTER, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert answer.choices[0].finish_reason in ("stop", "length") and isinstance(answer.choices[0].message.content, str)
    arguments = json.dumps(json.loads(call.function.arguments), separators=(",", ":"))
    rendered = [
        *MESSAGES,
        {"role": "assistant", "content": '{"name":"get_weather","arguments":' + arguments + "}"},
        {"role": "user", "content": f"Result of get_weather ({call.id}): sunny, 21"},
    ]
    prompt = runtime.tokenize(runtime._rt.tokenizer().apply_chat_template(rendered), add_special=False)
    assert answer.usage.prompt_tokens == len(prompt)


def test_required_with_two_tools_calls_one_of_them(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model=TEXT_ADAPTER, messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed
        )
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_streamed_call_is_the_whole_ones(client):
    kwargs = dict(model=TEXT_ADAPTER, messages=MESSAGES, tools=TOOLS, tool_choice="required", seed=2, temperature=1.0)
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    calls, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in calls] == [(whole.function.name, whole.function.arguments)]


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]}, "tools[0].function.parameters"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)
def test_bad_tools_are_a_400_naming_the_field(server, fields, words):
    status, r = post(server, {"model": TEXT_ADAPTER, "messages": MESSAGES, **fields})
    assert status == 400, r
    assert words in r["error"]["message"]
