"""Streaming HTTP clients for bench-serve: each client one thread, one OpenAI-style streamed completion,
the arrival time of every token recorded, so time to first token, the gaps between tokens and the
aggregate throughput of clients running at once are read from the same clock.

Works against any server that streams ``/v1/completions`` as server-sent events (lora-share-server and
llama-server both do): each ``data:`` event's ``choices[0].text`` is one piece of the answer; an event
carries ``choices[0].tokens`` (lora-share) or is one token (llama-server sends one event per token).
The last ``usage`` (lora-share's, with ``stream_options.include_usage``) and ``timings`` (llama-server's)
an event carries are kept.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass, field

from .memory import BenchError

TIMEOUT = 600.0


@dataclass
class Streamed:
    """One streamed answer: its text and the perf_counter time of the request and of each token."""

    text: str = ""
    sent: float = 0.0
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None

    @property
    def first_token_ms(self) -> float:
        return (self.token_times[0] - self.sent) * 1e3

    @property
    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.token_times, self.token_times[1:])]


def stream(address: str, body: dict, timeout: float = TIMEOUT) -> Streamed:
    """POST ``body`` (``stream`` set) to ``address``'s /v1/completions and read the events to ``[DONE]``."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    out = Streamed()
    try:
        out.sent = time.perf_counter()
        conn.request(
            "POST",
            "/v1/completions",
            body=json.dumps({**body, "stream": True}),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchError(f"{address}/v1/completions answered {resp.status}: {resp.read()[:500]!r}")
        while True:
            line = resp.readline()
            if not line:
                raise BenchError(f"{address}/v1/completions: the stream ended without [DONE]")
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: ") :]
            if data == b"[DONE]":
                return out
            event = json.loads(data)
            if "error" in event:
                raise BenchError(f"{address}/v1/completions streamed an error: {event['error']}")
            out.usage = event.get("usage") or out.usage
            out.timings = event.get("timings") or out.timings
            for choice in event.get("choices") or []:
                text, tokens = choice.get("text") or "", choice.get("tokens")
                out.text += text
                count = len(tokens) if tokens is not None else (1 if text else 0)
                out.token_times += [now] * count
                out.finish_reason = choice.get("finish_reason") or out.finish_reason
    except OSError as e:
        raise BenchError(f"{address}/v1/completions: {e}") from None
    finally:
        conn.close()


def at_once(address: str, bodies: list[dict]) -> list[Streamed]:
    """Every body streamed by its own thread, all started together (a barrier): the answers in order."""
    answers: list[Streamed | None] = [None] * len(bodies)
    errors: list[BaseException] = []
    start = threading.Barrier(len(bodies))

    def client(i: int) -> None:
        try:
            start.wait()
            answers[i] = stream(address, bodies[i])
        except BaseException as e:  # handed to the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return answers


def aggregate_decode_tokens_per_s(answers: list[Streamed]) -> float:
    """Decode tokens (each answer's tokens after its first) over the time from the first first token to
    the last token: what the clients together received per second once generation was under way."""
    tokens = sum(len(a.token_times) - 1 for a in answers)
    span = max(a.token_times[-1] for a in answers) - min(a.token_times[0] for a in answers)
    return tokens / span if span > 0 else 0.0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(answers: list[Streamed]) -> dict:
    """A scenario's figures: aggregate decode tokens/s, first-token time and gap between tokens (p50, p95)."""
    gaps = [g for a in answers for g in a.gaps_ms]
    firsts = [a.first_token_ms for a in answers]
    return {
        "aggregate_decode_tokens_per_s": round(aggregate_decode_tokens_per_s(answers), 2),
        "first_token_ms_p50": round(statistics.median(firsts), 1),
        "first_token_ms_p95": round(percentile(firsts, 95), 1),
        "gap_ms_p50": round(percentile(gaps, 50), 2),
        "gap_ms_p95": round(percentile(gaps, 95), 2),
    }
