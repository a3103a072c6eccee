"""Token generation shared by every backend that exposes ``step(tokens, pos) -> logits``.

The contract (the same in ``lora-share run`` and the C++ runner):
a prompt longer than the program's prefill chunk is fed in successive calls of
at most ``chunk`` tokens at positions 0, chunk, 2 * chunk, ...;
row 0 of the logits is taken at the last prompt position; row i (i >= 1) after
feeding generated token i. ``max_new_tokens`` tokens come out, so the logits
have ``max_new_tokens`` rows and the last position used is
``len(prompt) + max_new_tokens - 2``.
Generation stops early after a token in ``stop_ids`` (an end-of-sequence id), which is
the last token returned, as transformers' ``generate`` returns it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError


@dataclass
class Generation:
    tokens: list[int]
    logits: np.ndarray  # float32 [steps, vocab]
    timings: dict = field(default_factory=dict)


def parse_tokens(text: str, flag: str = "--tokens") -> list[int]:
    """Parse ``"1,17,42"`` into ids, or raise a UserError naming the flag."""
    try:
        ids = [int(t) for t in text.split(",") if t.strip() != ""]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated integer token ids, e.g. 1,17,42") from None
    if not ids:
        raise UserError(f"{flag}: give at least one token id, e.g. 1,17,42")
    return ids


def check_request(prompt: Sequence[int], max_new_tokens: int, vocab: int, max_seq_len: int) -> None:
    """Refuse prompts the exported program cannot take, before running anything."""
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise UserError(f"--tokens: id {bad[0]} is outside the vocabulary [0, {vocab})")
    if max_new_tokens < 1:
        raise UserError("--max-new-tokens must be at least 1")
    needed = len(prompt) + max_new_tokens - 1
    if needed > max_seq_len:
        raise UserError(
            f"{len(prompt)} prompt tokens + {max_new_tokens} new tokens need {needed} positions, "
            f"but the program's context (max_seq_len) is {max_seq_len}: shorten the request"
        )


def prefill(step: Callable[[list[int], int], np.ndarray], prompt: Sequence[int], chunk: int | None) -> np.ndarray:
    """Feed ``prompt`` from position 0 in calls of at most ``chunk`` tokens; the last call's logits."""
    prompt = list(prompt)
    size = chunk or len(prompt)
    logits = None
    for start in range(0, len(prompt), size):
        logits = step(prompt[start : start + size], start)
    return logits


def pick(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """Greedy (temperature 0) or softmax sampling at ``temperature``."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(len(p), p=p / p.sum()))


def generate(
    step: Callable[[list[int], int], np.ndarray],
    prompt: Sequence[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    chunk: int | None = None,
    stop_ids: Collection[int] = (),
    on_token: Callable[[int], None] | None = None,
) -> Generation:
    """Run prefill (in calls of at most ``chunk`` tokens) then decode with ``step``; collect tokens and logits.

    Stops after ``max_new_tokens`` tokens or after a token in ``stop_ids``; ``on_token`` is called
    with each token as soon as it is picked (to stream text while the next one is computed).
    """
    import time

    rng = np.random.default_rng(seed)
    rows, out = [], []
    t0 = time.perf_counter()
    logits = prefill(step, prompt, chunk)
    t1 = time.perf_counter()
    pos = len(prompt)
    for i in range(max_new_tokens):
        rows.append(logits)
        out.append(pick(logits, temperature, rng))
        if on_token is not None:
            on_token(out[-1])
        if out[-1] in stop_ids:
            break
        if i + 1 < max_new_tokens:
            logits = step([out[-1]], pos)
            pos += 1
    t2 = time.perf_counter()
    decode_steps = len(out) - 1
    timings = {
        "prefill_s": t1 - t0,
        "decode_s": t2 - t1,
        "prefill_tokens_per_s": len(prompt) / (t1 - t0) if t1 > t0 else None,
        "decode_tokens_per_s": decode_steps / (t2 - t1) if decode_steps and t2 > t1 else None,
    }
    return Generation(out, np.stack(rows).astype(np.float32), timings)
