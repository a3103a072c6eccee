"""A runtime of one KV slot speculates by default (issue 60; docs/batching.md, "One slot"): the C library
opened with parallel 1 verifies drafts in decode_batch, one request at a time. Its answers are held to the
same build opened with speculation off (ls_options.speculation = 0: the one-row path, forward then decode,
itself held to build/runner and the eager model elsewhere): the same greedy tokens and, bit for bit, the
logits and logprobs each token was picked from, with drafts from a prediction all right, all wrong and
partly right, and from prompt lookup; sampled answers are the same draws of the same seed. The drafts
verified and kept are counted (ls_runtime_stats, a request's usage)."""

from __future__ import annotations

import numpy as np
import pytest
from batch_script import diag_generate
from conftest import TINY_FOUNDATION

from lora_share.inference import c_library as native

VOCAB = TINY_FOUNDATION["vocab_size"]

# (adapter, prompt, new tokens): base on a prompt that repeats itself (prompt lookup drafts), adapters of
# different ranks, a prompt longer than the prefill chunk, and one that runs to the end of the context
# (20 + 12 = 32), where drafts are cut to what is left of it.
REQUESTS = [
    ("base", [5, 9, 200, 5, 9, 200, 5, 9], 12),
    ("tiny_a", [7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8], 14),
    ("tiny_b", [5, 6], 16),
    ("tiny_c", list(range(30, 50)), 12),
]


@pytest.fixture(scope="module")
def library(runner_bin):
    return runner_bin.parent / "liblora_share.so"


@pytest.fixture(scope="module")
def one_row(tiny_build, library):
    """The reference: one slot, speculation off (the one-row path)."""
    with native.open_dir(tiny_build.out_dir, library=library, speculation=False) as rt:
        yield rt


@pytest.fixture(scope="module")
def one_slot(tiny_build, library):
    """One slot (the default), speculation on, every draft verified: how many pay for a step is timed
    (step_width.h), and these tests count drafts."""
    with native.open_dir(tiny_build.out_dir, library=library, speculation="every_draft") as rt:
        yield rt


def guess(kind: str | None, answer: list[int]) -> list[int] | None:
    """A prediction of ``answer``: ``right`` (the answer), ``wrong`` (its first token, then every id another:
    drafted from the start and rejected), ``part`` (right for its first half, then wrong)."""
    if kind is None:
        return None
    wrong = [(t + 1) % VOCAB for t in answer]
    cut = {"right": len(answer), "wrong": 1, "part": len(answer) // 2}[kind]
    return answer[:cut] + wrong[cut:]


def answer(rt, name, prompt, new, **request) -> tuple[dict, int, int]:
    """One request's first choice (tokens, logprobs, top logprobs) and the drafts it verified and kept."""
    before = rt.stats()
    choice = rt.generate_choices(name, prompt, new, logprobs=True, top_logprobs=5, **request)[0]
    after = rt.stats()
    return (
        choice,
        after["drafted_tokens"] - before["drafted_tokens"],
        after["accepted_tokens"] - before["accepted_tokens"],
    )


@pytest.mark.parametrize("kind", ["right", "wrong", "part"])
def test_predictions_change_no_greedy_answer(one_row, one_slot, kind):
    """Every request with a prediction of its answer: the tokens and logprobs of the one-row path; right
    drafts are all kept, wrong ones all rejected, partly right ones partly kept."""
    drafted = accepted = 0
    for name, prompt, new in REQUESTS:
        plain, none, _ = answer(one_row, name, prompt, new)
        assert none == 0
        got, d, a = answer(one_slot, name, prompt, new, prediction=guess(kind, plain["tokens"]))
        assert got == plain, (name, kind)
        drafted, accepted = drafted + d, accepted + a
    assert drafted > 0
    if kind == "right":
        assert accepted == drafted
    elif kind == "wrong":
        assert accepted < drafted
    else:
        assert 0 < accepted < drafted, (drafted, accepted)


def test_prompt_lookup_changes_no_logits(one_row, one_slot):
    """Without a prediction (drafts from prompt lookup alone, on prompts that repeat themselves): the logits
    rows the tokens were picked from are the one-row path's, bit for bit, and some drafts were kept."""
    before = one_slot.stats()
    for name, prompt, new in REQUESTS:
        handle = {rt: None if name == "base" else rt.adapter(name).handle for rt in (one_row, one_slot)}
        tokens, logits = diag_generate(one_row, handle[one_row], prompt, new, VOCAB)
        got_tokens, got_logits = diag_generate(one_slot, handle[one_slot], prompt, new, VOCAB)
        assert got_tokens == tokens, name
        assert np.array_equal(got_logits, logits), (name, float(np.abs(got_logits - logits).max()))
    after = one_slot.stats()
    assert after["accepted_tokens"] > before["accepted_tokens"]
    assert after["parallel"] == 1 and after["batch_steps"] > before["batch_steps"]


@pytest.mark.parametrize("seed", range(3))
def test_sampled_answers_are_the_same_draws(one_row, one_slot, seed):
    """temperature 0.9: the same seed gives the same answer with drafts (right, then partly right) as
    without (each token drawn from the same logits with the same generator)."""
    for name, prompt, new in REQUESTS:
        plain, _, _ = answer(one_row, name, prompt, new, temperature=0.9, seed=seed)
        for kind in ("right", "part"):
            got, _, _ = answer(
                one_slot, name, prompt, new, temperature=0.9, seed=seed, prediction=guess(kind, plain["tokens"])
            )
            assert got == plain, (name, kind, seed)


def test_requests_on_the_one_row_path_draft_nothing(one_row, one_slot):
    """A request with speculative off, and n choices (one after the other, from one prefill), run on the
    one-row path: the same answers, nothing drafted."""
    name, prompt, new = REQUESTS[1]
    plain, _, _ = answer(one_row, name, prompt, new)
    got, drafted, _ = answer(one_slot, name, prompt, new, speculative=False, prediction=plain["tokens"])
    assert (got, drafted) == (plain, 0)
    request = {"temperature": 0.9, "seed": 4, "n": 3}
    before = one_slot.stats()
    choices = one_slot.generate_choices(name, prompt, new, **request)
    assert choices == one_row.generate_choices(name, prompt, new, **request)
    after = one_slot.stats()
    assert len(choices) == 3 and after["drafted_tokens"] == before["drafted_tokens"]
    assert after["prompt_tokens_fed"] - before["prompt_tokens_fed"] == len(prompt)  # one prefill, counted once


def test_a_copy_prompt_is_drafted_and_counted(runner_bin, text_build):
    """lora_share.Runtime (one slot, every draft verified) on a chat whose prediction is its own answer: the
    text of Runtime(speculation=False), with drafts kept in its usage (accepted_prediction_tokens) and in
    the runtime's stats; a prediction right for half of it gives the same text too."""
    from lora_share import Runtime

    library = runner_bin.parent / "liblora_share.so"
    chat = [{"role": "user", "content": "Copy: the cat sat on the mat."}]  # within the context of 64
    body = {"max_tokens": 16, "ignore_eos": True}
    with Runtime(text_build.build.out_dir, library=library, speculation=False) as rt:
        plain = rt.create_chat_completion(chat, **body)
    text = plain["choices"][0]["message"]["content"]
    assert plain["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 0
    with Runtime(text_build.build.out_dir, library=library, speculation="every_draft") as rt:
        right = rt.create_chat_completion(chat, prediction={"type": "content", "content": text}, **body)
        half = text[: len(text) // 2] + " zebra quantum" * 8
        wrong = rt.create_chat_completion(chat, prediction={"type": "content", "content": half}, **body)
        stats = rt.stats()
    assert right["choices"][0]["message"]["content"] == wrong["choices"][0]["message"]["content"] == text
    kept = right["usage"]["completion_tokens_details"]["accepted_prediction_tokens"]
    assert kept > 0 and wrong["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] > 0
    assert stats["parallel"] == 1 and stats["drafted_tokens"] >= stats["accepted_tokens"] >= kept
