"""Speculative decoding's pieces outside the scheduler (issue 60), through the C library's diag entry points
(lora_share_diag.h), without a program: a request's drafter (cpp_runner/runtime/batch/drafter.h: prompt
lookup, its prediction, a length that adapts, its estimate of what it keeps), the scheduler's choice of how
wide a step that verifies drafts runs (step_width.h: what pays for every row's padding) and speculative
sampling's acceptance (drafts.h's
accept_sampled, Leviathan et al. 2023), whose gained tokens must be distributed as one-token sampling draws
them: a chi-square test over many seeds on a tiny model's distributions. The verification step itself is
held to one-token decode in tests/test_batch_engine.py and tests/test_families.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from conftest import REPO
from scipy.stats import chisquare

I64 = ctypes.POINTER(ctypes.c_int64)
F32 = ctypes.POINTER(ctypes.c_float)
F64 = ctypes.POINTER(ctypes.c_double)


@pytest.fixture(scope="module")
def lib(runner_bin):
    lib = ctypes.CDLL(str(REPO / "build" / "liblora_share.so"))
    lib.ls_diag_drafter_new.restype = ctypes.c_void_p
    lib.ls_diag_drafter_new.argtypes = [I64, ctypes.c_size_t, I64, ctypes.c_size_t, ctypes.c_size_t]
    lib.ls_diag_drafter_free.argtypes = [ctypes.c_void_p]
    lib.ls_diag_drafter_extend.argtypes = [ctypes.c_void_p, I64, ctypes.c_size_t]
    lib.ls_diag_drafter_propose.restype = ctypes.c_size_t
    lib.ls_diag_drafter_propose.argtypes = [ctypes.c_void_p, I64, ctypes.c_size_t]
    lib.ls_diag_drafter_feedback.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ls_diag_drafter_acceptance.restype = ctypes.c_double
    lib.ls_diag_drafter_acceptance.argtypes = [ctypes.c_void_p]
    lib.ls_diag_best_width.restype = ctypes.c_size_t
    lib.ls_diag_best_width.argtypes = [F64, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    lib.ls_diag_best_width.argtypes += [F64, ctypes.c_size_t]
    lib.ls_diag_accept_sampled.restype = ctypes.c_size_t
    lib.ls_diag_accept_sampled.argtypes = [I64, ctypes.c_size_t, F32, ctypes.c_int64, F32, ctypes.c_uint64, I64]
    return lib


def ints(values):
    return (ctypes.c_int64 * max(len(values), 1))(*values)


class Drafter:
    def __init__(self, lib, prompt, prediction=(), max_drafts=8):
        self.lib = lib
        self.handle = lib.ls_diag_drafter_new(ints(prompt), len(prompt), ints(prediction), len(prediction), max_drafts)
        assert self.handle

    def extend(self, tokens):
        self.lib.ls_diag_drafter_extend(self.handle, ints(tokens), len(tokens))

    def propose(self) -> list[int]:
        out = (ctypes.c_int64 * 16)()
        return list(out[: self.lib.ls_diag_drafter_propose(self.handle, out, 16)])

    def feedback(self, drafted, accepted):
        self.lib.ls_diag_drafter_feedback(self.handle, drafted, accepted)

    def acceptance(self) -> float:
        return self.lib.ls_diag_drafter_acceptance(self.handle)

    def close(self):
        self.lib.ls_diag_drafter_free(self.handle)


def run_answer(lib, prompt, answer, prediction=()) -> tuple[int, int, float]:
    """The drafter over a request whose greedy answer is ``answer``: each step drafts, keeps the drafts that
    match the answer (greedy acceptance), gains them and the next token. Returns (steps, rows of drafts,
    the drafter's acceptance at the end)."""
    drafter = Drafter(lib, prompt, prediction)
    drafter.extend(answer[:1])  # the first token comes from the prompt
    have, steps, drafting = 1, 0, 0
    while have < len(answer):
        drafts = drafter.propose()[: len(answer) - have - 1]
        kept = 0
        while kept < len(drafts) and drafts[kept] == answer[have + kept]:
            kept += 1
        drafter.feedback(len(drafts), kept)
        drafter.extend(answer[have : have + kept + 1])
        have += kept + 1
        steps += 1
        drafting += bool(drafts)
    acceptance = drafter.acceptance()
    drafter.close()
    return steps, drafting, acceptance


def test_prompt_lookup_drafts_what_followed_the_last_tokens(lib):
    """The latest earlier occurrence of the answer's last tokens (the longest of 4..2 that occurs), in the
    prompt or the answer: the tokens after it, up to max_drafts (8)."""
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 7, 8, 20, 21, 22, 23, 24]
    drafter = Drafter(lib, prompt)
    drafter.extend([40, 7, 8])  # "7 8" occurs twice: the later one (followed by 20..) is taken
    assert drafter.propose() == [20, 21, 22, 23, 24, 40, 7, 8]  # on into the answer
    drafter.extend([9])  # "7 8 9" is in the prompt once: the longer match wins over the later "8 ..."
    assert drafter.propose() == [10, 11, 12, 1, 2, 3, 7, 8]
    drafter.extend([99, 98])  # "99 98" and "98" alone occur nowhere
    assert drafter.propose() == []
    drafter.close()


def test_a_prediction_is_drafted_in_order(lib):
    """The prediction's start before the answer has two tokens, then the prediction after the occurrence of
    the answer's last tokens nearest to where the answer was in it (a phrase it repeats is not taken for
    the earlier one)."""
    prediction = [1, 2, 3, 4, 1, 2, 3, 5, 6, 7, 8, 9]
    drafter = Drafter(lib, [50, 51], prediction)
    drafter.extend([1])
    assert drafter.propose() == [2, 3, 4, 1, 2, 3, 5, 6]
    drafter.feedback(4, 4)  # the scheduler verified 4
    drafter.extend([2, 3, 4, 1, 2])
    assert drafter.propose() == [3, 5, 6, 7, 8, 9]  # "1 2" at 4, nearer than at 0
    drafter.close()
    other = Drafter(lib, [50, 51], prediction)
    other.extend([7])  # not the prediction's start: nothing to draft from it yet
    assert other.propose() == []
    other.close()


def test_it_proposes_all_it_finds_whatever_was_kept(lib):
    """Every proposal is as long as the lookup allows (max_drafts), after steps that kept all, some or none:
    how many are verified is the scheduler's choice (step_width.h), from the drafter's acceptance."""
    prompt = list(range(100, 140)) * 2  # any suffix of the first half is found, with 40 tokens after it
    drafter = Drafter(lib, prompt)
    drafter.extend([100, 101])
    lengths = []
    for kept in (8, 8, 3, 0, 0, 8):
        drafts = drafter.propose()
        lengths.append(len(drafts))
        drafter.feedback(len(drafts), kept)
    drafter.close()
    assert lengths == [8] * 6


def test_the_acceptance_estimate_follows_what_was_kept(lib):
    """From one half before any feedback; above 0.8 after two steps that kept all 8 drafts; below 0.25 after
    three that kept none; above 0.75 after three that kept all again; a step that kept 3 of 8 as 3 of 4
    tries (the first rejected one the fourth): steady at 0.75."""
    drafter = Drafter(lib, [1, 2, 3])
    assert drafter.acceptance() == 0.5
    drafter.feedback(8, 8)
    drafter.feedback(8, 8)
    assert drafter.acceptance() > 0.8
    for _ in range(3):
        drafter.feedback(4, 0)
    assert drafter.acceptance() < 0.25
    for _ in range(3):
        drafter.feedback(8, 8)
    assert drafter.acceptance() > 0.75
    for _ in range(20):
        drafter.feedback(8, 3)
    assert abs(drafter.acceptance() - 0.75) < 1e-3
    drafter.close()


# How wide a step that verifies drafts runs (step_width.h). Step costs in ms by positions (rows x width):
# flat (the weights' stream bounds every step), and as measured on 2 cores for SmolLM2-135M fp32
# (benchmarks/verify_step.py: flat to 6 positions, then about 2 ms a position), between its points on a line.
FLAT = {p: 20.0 for p in range(1, 37)}
_POINTS = [(1, 21.8), (2, 20.0), (3, 20.4), (4, 22.8), (5, 21.1), (6, 21.8), (8, 30.7), (9, 29.1), (10, 29.6)]
_POINTS += [(12, 31.9), (18, 40.4), (20, 42.7), (36, 71.7)]
MEASURED = dict(zip(range(1, 37), np.interp(range(1, 37), *zip(*_POINTS)).tolist()))


def best_width(lib, costs: dict[int, float], rows: list[tuple[int, float]], max_rows=4, max_width=9) -> int:
    """ls_diag_best_width over step costs by positions (``costs[rows x width]``: every shape of that many
    positions, as a device whose cost is its positions'; missing: never run) and rows of (drafts, acceptance)."""
    ms = (ctypes.c_double * (max_rows * max_width))(
        *[costs.get(r * w, 0.0) for r in range(1, max_rows + 1) for w in range(1, max_width + 1)]
    )
    drafts = (ctypes.c_size_t * max(len(rows), 1))(*[d for d, _ in rows])
    acceptance = (ctypes.c_double * max(len(rows), 1))(*[a for _, a in rows])
    return lib.ls_diag_best_width(ms, max_rows, max_width, drafts, acceptance, len(rows))


def simulated_rate(costs, rows, width, rng, trials=4000) -> float:
    """Tokens per ms of steps of ``width``, by drawing each row's drafts: kept in order while each draw
    keeps it (chance = its acceptance), the row's own next token always gained."""
    tokens = 0
    for drafts, acceptance in rows:
        tried = min(drafts, width - 1)
        kept = rng.random((trials, tried)) < acceptance
        tokens += trials + np.cumprod(kept, axis=1).sum() if tried else trials
    return tokens / trials / costs[len(rows) * width]


@pytest.mark.parametrize("costs", [FLAT, MEASURED], ids=["flat", "measured"])
@pytest.mark.parametrize(
    "rows",
    [[(8, 0.9)], [(8, 0.5)], [(8, 0.9)] * 4, [(8, 0.3)] * 4, [(8, 0.9), (0, 0.5), (0, 0.5), (0, 0.5)], [(2, 0.6)] * 3],
    ids=["copy", "half", "copy_x4", "free_x4", "one_of_4", "short_x3"],
)
def test_the_chosen_width_gains_the_most_tokens_per_ms(lib, costs, rows):
    """Every width measured: the chosen one gains within 3% of the most tokens per ms of any width, as a
    simulation of the drafts' acceptance counts them."""
    rng = np.random.default_rng(0)
    widest = max(d for d, _ in rows) + 1
    rates = {w: simulated_rate(costs, rows, w, rng) for w in range(1, widest + 1)}
    chosen = best_width(lib, costs, rows)
    assert 1 <= chosen <= widest
    assert rates[chosen] >= 0.97 * max(rates.values()), (chosen, rates)


def test_drafts_that_pay_alone_are_cut_in_a_batch(lib):
    """As measured, a copying row alone drafts through the flat part (drafts nearly free there); beside three
    rows without drafts it drafts less (their padding costs what its drafts gain); four free answers
    (acceptance 0.25) verify none; flat costs verify every draft."""
    alone = best_width(lib, MEASURED, [(8, 0.9)])
    assert alone >= 6
    assert best_width(lib, MEASURED, [(8, 0.9)] + [(0, 0.5)] * 3) < alone
    assert best_width(lib, MEASURED, [(8, 0.25)] * 4) == 1
    assert best_width(lib, FLAT, [(8, 0.25)] * 4) == 9


def test_a_width_not_yet_run_is_tried_when_it_may_pay(lib):
    """Only widths 1..5 run (flat): a copying row (0.95) tries a wider step, though the estimate from 5
    positions (in proportion past them) says it loses a little; once widths 6..9 are measured as dear
    (a compute-bound device), it stays at 5."""
    measured = {p: 20.0 for p in range(1, 6)}
    assert best_width(lib, measured, [(8, 0.95)]) > 5
    assert best_width(lib, {**measured, **{p: 40.0 for p in range(6, 10)}}, [(8, 0.95)]) == 5


def test_free_answers_are_known_by_their_acceptance_and_copied_answers_draft_long(lib):
    """A free answer (its tokens nowhere in the prompt, never repeated) never drafts; one whose lookups
    match every other step and are always wrong (pairs of the prompt's tokens, each pair from elsewhere)
    drafts in half its 63 steps, its acceptance falling under 0.1, so that four such rows as measured
    verify none (width 1); a copied answer, or one its prediction gives, gains over 4 tokens a step."""
    rng = np.random.default_rng(0)
    prompt = rng.permutation(1000)[:200].tolist()
    free = (1000 + rng.permutation(1000)[:64]).tolist()
    assert run_answer(lib, prompt, free) == (63, 0, 0.5)
    pairs = [prompt[i] for start in range(0, 200, 5) for i in (start, start + 1)][:64]
    steps, drafting, acceptance = run_answer(lib, prompt, pairs)
    assert steps == 63 and 25 <= drafting <= 35 and acceptance < 0.1, (steps, drafting, acceptance)
    assert best_width(lib, MEASURED, [(8, acceptance)] * 4) == 1
    steps, _, acceptance = run_answer(lib, prompt, prompt[10:90])
    assert 79 / steps > 4 and acceptance > 0.8, (steps, acceptance)
    steps, _, _ = run_answer(lib, [7, 7], free, prediction=free)  # the answer as predicted
    assert 63 / steps > 4, steps


# Speculative sampling: the tokens gained are distributed as one-token sampling's.


def accept_sampled(lib, tokens, probs, seed, draft_probs=None) -> list[int]:
    p = np.ascontiguousarray(probs, dtype=np.float32)
    q = None if draft_probs is None else np.ascontiguousarray(draft_probs, dtype=np.float32)
    out = (ctypes.c_int64 * len(tokens))()
    n = lib.ls_diag_accept_sampled(
        ints(tokens),
        len(tokens),
        p.ctypes.data_as(F32),
        p.shape[1],
        None if q is None else q.ctypes.data_as(F32),
        seed,
        out,
    )
    return list(out[:n])


@pytest.fixture(scope="module")
def tiny_distributions():
    """A tiny random model's next-token distributions after a prompt, after the prompt and the likeliest
    token, after that and its likeliest: p0, p1, p2 [256], and the tokens they lead to. At temperature 0.25:
    the random model's own distributions are nearly flat (none above 1%), a trained model's are not."""
    from test_decode_attention import LLAMA, random_model

    model = random_model(LLAMA)
    prompt, rows, tokens = [3, 14, 15, 92, 65], [], []
    with torch.no_grad():
        logits = model.step(prompt, 0)
        for pos in range(len(prompt), len(prompt) + 3):
            rows.append(torch.softmax(logits.double() / 0.25, -1).numpy())
            tokens.append(int(logits.argmax()))
            logits = model.step([tokens[-1]], pos)
    return np.stack(rows), tokens


def binned(counts: np.ndarray, p: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Observed and expected counts over the ids expected at least 10 times, the rest in one bin (if any)."""
    expected = p * total
    big = expected >= 10
    obs, exp = counts[big], expected[big]
    if (~big).any():
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
    return obs, exp * obs.sum() / exp.sum()


def gained_counts(lib, tokens_of, probs, draft_probs=None, seeds=20000):
    """Over ``seeds`` runs of accept_sampled on the row ``tokens_of(seed)``: the counts of the first token
    gained, and of the second when the first is the greedy path's (whose next distribution is probs[1])."""
    first, second = np.zeros(probs.shape[1]), np.zeros(probs.shape[1])
    for seed in range(seeds):
        tokens = tokens_of(seed)
        got = accept_sampled(lib, tokens, probs, seed, draft_probs)
        first[got[0]] += 1
        if got[0] == tokens[1] == tokens_of.path and len(got) > 1:
            second[got[1]] += 1
    return first, second


@pytest.mark.parametrize("drafts", ["likeliest", "unlikely", "draft model"])
def test_sampled_tokens_keep_the_distribution(lib, tiny_distributions, drafts):
    """20,000 seeds: the first token gained follows p0 whatever the drafts (certain ones, likely or not, or a
    draft model's, drawn from its q: kept with probability min(1, p/q), else drawn from the residual), and,
    when it is the greedy path's token, the next follows p1 (the distribution after it). Chi-square at
    p > 0.001 (the next test shows it rejects a wrong rule)."""
    probs, greedy = tiny_distributions
    vocab, q = probs.shape[1], None
    if drafts == "likeliest":

        def tokens_of(seed):
            return [1, greedy[0], greedy[1]]
    elif drafts == "unlikely":

        def tokens_of(seed):
            return [1, int(np.argsort(probs[0])[vocab // 2]), greedy[1]]
    else:  # a draft model's own distributions (flatter: the target's at 3x the temperature), drafts drawn from them
        q = np.stack([p ** (1 / 3) / (p ** (1 / 3)).sum() for p in probs[:2]])

        def tokens_of(seed):
            rng = np.random.default_rng(10**6 + seed)
            return [1, int(rng.choice(vocab, p=q[0])), int(rng.choice(vocab, p=q[1]))]

    tokens_of.path = greedy[0]
    first, second = gained_counts(lib, tokens_of, probs, q)
    assert chisquare(*binned(first, probs[0], int(first.sum()))).pvalue > 1e-3
    if second.sum() >= 500:
        assert chisquare(*binned(second, probs[1], int(second.sum()))).pvalue > 1e-3


def test_always_keeping_the_draft_fails_the_same_test(tiny_distributions):
    """The chi-square above on what a wrong rule gives (every draft kept: the first token is always d1)."""
    probs, greedy = tiny_distributions
    first = np.zeros(probs.shape[1])
    first[greedy[0]] = 20000
    assert chisquare(*binned(first, probs[0], 20000)).pvalue < 1e-6


def test_the_same_seed_gives_the_same_tokens(lib, tiny_distributions):
    probs, greedy = tiny_distributions
    tokens = [1, greedy[0], greedy[1]]
    runs = [[accept_sampled(lib, tokens, probs, seed) for seed in range(50)] for _ in range(2)]
    # the same seeds, the same tokens; other seeds, other tokens
    assert runs[0] == runs[1] and len({tuple(r) for r in runs[0]}) > 1
