"""Structured output, logit_bias, logprobs and n in the C runtime (lora_share.h, STRUCTURED OUTPUT;
docs/structured-output.md), driven through lora_share/inference/c_library.py.

References: the `jsonschema` library judges every JSON answer against its schema (tests/schema_corpus.py,
200+ schemas), Python's `re` judges regex answers, transformers + peft (the eager model) give the
log-probabilities, and the same request run alone (parallel 1) is what each row of a batch must equal.
The tiny text model is random: its answers are whatever it likes inside the mask, so validity is the
mask's doing. It mostly repeats its last token, 15-30 nats ahead of the rest: sampled HOT (temperature
20) its answers vary, and a logit_bias on what closes a string, an object, an array, an e-mail's local
part, and on EOS (allowed only where the grammar ends) keeps them short.
"""

from __future__ import annotations

import json
import math
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import numpy as np
import pytest
from conftest import TEXT_ADAPTER
from schema_corpus import corpus

from lora_share.inference import c_library as native

pytestmark = pytest.mark.slow  # its own export (a 512-token context) and 225 schemas' answers

PROMPT_TEXT = "Answer in JSON: the fox and the dog."
MAX_NEW = 490  # with the prompt, within the context
PARALLEL = 4
HOT = 20.0


@pytest.fixture(scope="module")
def library(runner_bin):
    return runner_bin.parent / "liblora_share.so"


@pytest.fixture(scope="module")
def alone(library, long_text_build):
    with native.open_dir(long_text_build.out_dir, library=library) as rt:
        yield rt


@pytest.fixture(scope="module")
def batched(library, long_text_build):
    with native.open_dir(long_text_build.out_dir, parallel=PARALLEL, library=library) as rt:
        yield rt


@pytest.fixture(scope="module")
def vocab(alone, long_text_build):
    """The prompt's ids, the EOS ids, and a bias that favours closing what is open."""
    tok = alone.tokenizer()
    eos = set(long_text_build.manifest["tokenizer"]["eos_token_ids"])
    closers = {}
    for text, bias in [('"', 100.0), ("}", 50.0), ("]", 50.0), (",", 20.0), ("@", 60.0)]:
        (token,) = tok.encode(text, add_special=False)
        closers[token] = bias
    closers.update({e: 100.0 for e in eos})
    return {"prompt": tok.encode(PROMPT_TEXT), "eos": eos, "closing_bias": closers, "tokenizer": tok}


def answer_text(vocab, tokens):
    """The answer without its final EOS (which must be there: the grammar ended it), as text."""
    assert tokens and tokens[-1] in vocab["eos"], f"the answer did not end: {tokens}"
    assert not set(tokens[:-1]) & vocab["eos"]
    return vocab["tokenizer"].decode(tokens[:-1])


def constrained(rt, vocab, constraint, seed=0, adapter=TEXT_ADAPTER, **extra):
    (choice,) = rt.generate_choices(
        adapter,
        vocab["prompt"],
        MAX_NEW,
        temperature=HOT,
        seed=seed,
        constraint=constraint,
        logit_bias=vocab["closing_bias"],
        **extra,
    )
    return choice


def test_every_answer_validates_against_its_schema(alone, vocab):
    """200+ schemas, each compiled once, one sampled answer each: every answer is JSON that validates."""
    schemas = corpus()
    assert len(schemas) >= 200
    failures = []
    for i, schema in enumerate(schemas):
        choice = constrained(alone, vocab, {"json_schema": schema}, seed=i)
        text = answer_text(vocab, choice["tokens"])
        try:
            jsonschema.validate(json.loads(text), schema, cls=jsonschema.Draft202012Validator)
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"schema {i} {json.dumps(schema)}: {text!r}: {e}")
    assert not failures, "\n".join(failures[:5])
    stats = alone.stats()
    # Each distinct schema compiled once (the generated part repeats a few).
    assert stats["constraint_compiles"] >= len({json.dumps(s, sort_keys=True) for s in schemas})
    assert stats["masked_tokens"] > 0


def eager_log_softmax(text_hf, ids: list[int], answer: list[int]) -> np.ndarray:
    """transformers + peft: log_softmax of the logits that picked each token of ``answer`` after ``ids``."""
    import torch

    _, model = text_hf
    with torch.no_grad():
        logits = model(torch.tensor([ids + answer[:-1]])).logits[0, len(ids) - 1 :]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


@pytest.mark.parametrize("runtime", ["alone", "batched"])
def test_logprobs_are_the_eager_models_log_softmax(request, vocab, text_hf, runtime):
    """Each token's logprob and its top 5 equal log_softmax of transformers' logits within 1e-4, and under
    greedy decoding the picked token is the top one."""
    rt = request.getfixturevalue(runtime)
    (choice,) = rt.generate_choices(TEXT_ADAPTER, vocab["prompt"], 8, logprobs=True, top_logprobs=5)
    reference = eager_log_softmax(text_hf, vocab["prompt"], choice["tokens"])
    for i, (token, logprob, top) in enumerate(zip(choice["tokens"], choice["logprobs"], choice["top_logprobs"])):
        assert abs(logprob - reference[i, token]) < 1e-4, i
        want = np.argsort(-reference[i], kind="stable")[:5]
        assert [t for t, _ in top] == want.tolist(), i
        np.testing.assert_allclose([lp for _, lp in top], reference[i, want], atol=1e-4, rtol=0)
        assert top[0][0] == token  # greedy: the likeliest


def test_logprobs_are_the_raw_models_under_a_constraint(alone, vocab, text_hf):
    """With a constraint and a bias the picked tokens change, their logprobs stay the model's raw ones."""
    choice = constrained(alone, vocab, {"regex": "[a-z]{4}"}, logprobs=True, top_logprobs=3)
    reference = eager_log_softmax(text_hf, vocab["prompt"], choice["tokens"])
    for i, (token, logprob) in enumerate(zip(choice["tokens"], choice["logprobs"])):
        assert abs(logprob - reference[i, token]) < 1e-4, i
    assert re.fullmatch("[a-z]{4}", answer_text(vocab, choice["tokens"]))


def run_concurrently(jobs):
    barrier = threading.Barrier(len(jobs))

    def run(job):
        barrier.wait()
        return job()

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(run, jobs))


# Two constrained rows (different kinds, one on the adapter, one on the base) beside two free rows.
MIXED = [
    (TEXT_ADAPTER, {"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}),
    ("base", {"choices": ["the fox", "the dog", "a cat"]}),
    (TEXT_ADAPTER, None),
    ("base", None),
]


def test_each_constrained_row_of_a_mixed_batch_is_the_request_alone(alone, batched, vocab):
    def ask(rt, adapter, constraint, seed):
        (choice,) = rt.generate_choices(
            adapter,
            vocab["prompt"],
            MAX_NEW if constraint else 40,
            temperature=HOT,
            seed=seed,
            constraint=constraint,
            logit_bias=vocab["closing_bias"] if constraint else None,
            logprobs=True,
            cache_prompt=False,
        )
        return choice

    expected = [ask(alone, adapter, constraint, seed) for seed, (adapter, constraint) in enumerate(MIXED)]
    before = batched.stats()
    got = run_concurrently([lambda s=seed, r=row: ask(batched, *r, s) for seed, row in enumerate(MIXED)])
    after = batched.stats()
    for (adapter, constraint), g, e in zip(MIXED, got, expected):
        assert g["tokens"] == e["tokens"], (adapter, constraint)
        np.testing.assert_allclose(g["logprobs"], e["logprobs"], atol=1e-4, rtol=0)
    assert sum(after["batch_size_counts"][1:]) > sum(before["batch_size_counts"][1:])  # rows ran together
    assert after["masked_tokens"] > before["masked_tokens"]
    json.loads(answer_text(vocab, got[0]["tokens"]))
    assert answer_text(vocab, got[1]["tokens"]) in MIXED[1][1]["choices"]


# Each refused with the status and a message that names what is wrong.
BAD_CONSTRAINTS = [
    ({"json_schema": "{not json"}, "LS_ERR_REQUEST", "JSON schema constraint: not valid JSON"),
    ({"json_schema": "[1, 2]"}, "LS_ERR_REQUEST", "a schema is a JSON object"),
    ({"json_schema": {"$ref": "#/$defs/missing"}}, "LS_ERR_REQUEST", "missing"),
    ({"json_schema": {"$ref": "https://example.com/s.json"}}, "LS_ERR_REQUEST", "would not enforce"),
    ({"json_schema": {"type": "array", "uniqueItems": True}}, "LS_ERR_REQUEST", "'uniqueItems' at /"),
    (
        {"json_schema": {"type": "object", "properties": {"a": {"not": {"type": "null"}}}}},
        "LS_ERR_REQUEST",
        "'not' at /properties/a",
    ),
    ({"json_schema": {"if": {"type": "string"}, "then": {"maxLength": 2}}}, "LS_ERR_REQUEST", "'if'"),
    ({"json_schema": {"type": "number", "multipleOf": 0.5}}, "LS_ERR_REQUEST", "multipleOf"),
    ({"json_schema": {"type": "integer", "minimum": 5, "maximum": 1}}, "LS_ERR_REQUEST", "minimum"),
    ({"json_schema": {"type": "wizard"}}, "LS_ERR_REQUEST", "wizard"),
    ({"json_schema": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}}, "LS_ERR_REQUEST", "would not enforce"),
    ({"grammar": "root ::= "}, "LS_ERR_REQUEST", "grammar constraint"),
    ({"grammar": 'start ::= "a"'}, "LS_ERR_REQUEST", "root"),
    ({"grammar": ""}, "LS_ERR_REQUEST", "the text is empty"),
    ({"regex": "(a"}, "LS_ERR_REQUEST", "regex constraint"),
    ({"choices": []}, "LS_ERR_REQUEST", "the list of choices is empty"),
    ({"choices": ["a", ""]}, "LS_ERR_REQUEST", "choices[1] is empty"),
]


@pytest.mark.parametrize("constraint, status, message", BAD_CONSTRAINTS, ids=lambda v: str(v)[:40])
def test_a_bad_constraint_is_refused(alone, batched, vocab, constraint, status, message):
    for rt in (alone, batched):
        with pytest.raises(native.NativeError) as check:
            rt.check_options(TEXT_ADAPTER, constraint=constraint)
        assert check.value.status == status and message in check.value.message, check.value.message
        with pytest.raises(native.NativeError) as run:
            rt.generate_choices(TEXT_ADAPTER, vocab["prompt"], 4, constraint=constraint)
        assert (run.value.status, run.value.message) == (check.value.status, check.value.message)


BAD_OPTIONS = [
    ({"logprobs": True, "top_logprobs": 21}, "LS_ERR_ARGUMENT", "top_logprobs is 21: give 0 to 20"),
    ({"top_logprobs": 2}, "LS_ERR_ARGUMENT", "top_logprobs needs logprobs"),
    ({"logit_bias": {5: 101.0}}, "LS_ERR_ARGUMENT", "logit_bias_values[0] must be in [-100, 100]"),
    ({"logit_bias": {5: 1.0, 400: 1.0}}, "LS_ERR_REQUEST", "logit_bias_ids[1]: id 400 is outside the vocabulary"),
    ({"n": 0}, "LS_ERR_ARGUMENT", "n is 0"),
    ({"n": 33}, "LS_ERR_ARGUMENT", "n is 33"),
]


@pytest.mark.parametrize("options, status, message", BAD_OPTIONS, ids=lambda v: str(v)[:40])
def test_bad_request_options_are_refused(alone, options, status, message):
    with pytest.raises(native.NativeError) as e:
        alone.check_options(TEXT_ADAPTER, **options)
    assert e.value.status == status and message in e.value.message, e.value.message


def test_a_constraint_with_ignore_eos_is_refused(alone):
    with pytest.raises(native.NativeError, match="LS_ERR_ARGUMENT: ignore_eos with a constraint"):
        alone.check_options(TEXT_ADAPTER, ignore_eos=True, constraint={"json_object": True})


def test_logit_bias_minus_100_removes_a_token(alone, vocab):
    """The greedy answer's first token, banned: the answer never holds it, and its first token is then the
    second likeliest of the raw distribution."""
    (free,) = alone.generate_choices(TEXT_ADAPTER, vocab["prompt"], 12, logprobs=True, top_logprobs=2)
    banned = free["tokens"][0]
    (choice,) = alone.generate_choices(
        TEXT_ADAPTER, vocab["prompt"], 12, logit_bias={banned: -100.0}, logprobs=True, top_logprobs=2
    )
    assert banned not in choice["tokens"]
    assert choice["tokens"][0] == free["top_logprobs"][0][1][0]
    # Sampled too: never drawn in 48 tokens, however the seed falls.
    for seed in range(4):
        (sampled,) = alone.generate_choices(
            TEXT_ADAPTER, vocab["prompt"], 12, temperature=HOT, seed=seed, logit_bias={banned: -100.0}
        )
        assert banned not in sampled["tokens"]


@pytest.mark.parametrize("runtime", ["alone", "batched"])
def test_n_choices_share_one_prefill_and_each_is_its_own_request(request, vocab, runtime):
    """n = 3 feeds the prompt once (prompt_tokens_fed), and choice i is the request alone with seed + i
    (its own sampler, and its own constraint state)."""
    rt = request.getfixturevalue(runtime)
    ask = dict(temperature=HOT, constraint={"regex": "[a-z ]{3,12}"}, logprobs=True, cache_prompt=False)
    before = rt.stats()["prompt_tokens_fed"]
    choices = rt.generate_choices(TEXT_ADAPTER, vocab["prompt"], 16, seed=7, n=3, **ask)
    assert rt.stats()["prompt_tokens_fed"] - before == len(vocab["prompt"])
    assert len(choices) == 3
    for i, choice in enumerate(choices):
        (single,) = rt.generate_choices(TEXT_ADAPTER, vocab["prompt"], 16, seed=7 + i, **ask)
        assert choice["tokens"] == single["tokens"], i
        np.testing.assert_allclose(choice["logprobs"], single["logprobs"], atol=1e-4, rtol=0)
        assert re.fullmatch("[a-z ]{3,12}", answer_text(vocab, choice["tokens"]))
    assert len({tuple(c["tokens"]) for c in choices}) > 1  # three draws, not one repeated


def test_n_above_the_batch_rows_is_refused(batched, vocab):
    with pytest.raises(native.NativeError, match="LS_ERR_REQUEST: n is 5: the batch runs at most 4 rows"):
        batched.generate_choices(TEXT_ADAPTER, vocab["prompt"], 4, n=5)


def test_eos_comes_exactly_where_the_grammar_can_end(alone, vocab):
    """EOS pushed as hard as a bias can (+100): it still waits for a whole choice, then ends at once."""
    eos_first = {e: 100.0 for e in vocab["eos"]}
    for choices, want in [(["the fox", "a dog"], {"the fox", "a dog"}), (["a", "ab"], {"a"})]:
        (choice,) = alone.generate_choices(
            TEXT_ADAPTER, vocab["prompt"], 16, temperature=HOT, constraint={"choices": choices}, logit_bias=eos_first
        )
        assert answer_text(vocab, choice["tokens"]) in want
    # Banned instead: a grammar that can go on forever goes on to max_new_tokens.
    (choice,) = alone.generate_choices(
        TEXT_ADAPTER, vocab["prompt"], 10, constraint={"regex": "[a-z]+"}, logit_bias={e: -100.0 for e in vocab["eos"]}
    )
    assert len(choice["tokens"]) == 10 and not set(choice["tokens"]) & vocab["eos"]


GRAMMAR = """root ::= sum
sum ::= num ("+" num)*
num ::= [1-9] [0-9]?
"""


@pytest.mark.parametrize(
    "constraint, judge",
    [
        ({"regex": "(yes|no), [0-9]{2}"}, lambda t: re.fullmatch("(yes|no), [0-9]{2}", t)),
        ({"grammar": GRAMMAR}, lambda t: re.fullmatch(r"[1-9][0-9]?(\+[1-9][0-9]?)*", t)),
        ({"choices": ['say "hi"', "back\\slash", "new\nline", "café"]}, None),
        ({"json_object": True}, lambda t: isinstance(json.loads(t), dict)),
    ],
    ids=["regex", "grammar", "choices", "json_object"],
)
def test_each_kind_of_constraint_holds(alone, vocab, constraint, judge):
    for seed in range(6):
        text = answer_text(vocab, constrained(alone, vocab, constraint, seed=seed)["tokens"])
        assert judge(text) if judge else text in constraint["choices"], text


def test_a_schema_compiles_once(alone, vocab):
    schema = {"type": "object", "properties": {"once": {"type": "boolean"}}, "required": ["once"]}
    before = alone.stats()
    alone.check_options(TEXT_ADAPTER, constraint={"json_schema": schema})
    middle = alone.stats()
    constrained(alone, vocab, {"json_schema": json.dumps(schema)})
    after = alone.stats()
    assert middle["constraint_compiles"] == before["constraint_compiles"] + 1
    assert after["constraint_compiles"] == middle["constraint_compiles"]
    assert after["constraint_cache_hits"] == middle["constraint_cache_hits"] + 1
    assert after["constraint_compile_ms"] > before["constraint_compile_ms"]
    assert after["mask_ms"] > middle["mask_ms"] and not math.isnan(after["mask_wait_ms"])
