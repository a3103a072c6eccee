"""build/lora-share-server: OpenAI completions and chat completions over one deployment.

The reference is build/runner on the same files: a request's ids are what the `tokenizers`
library (or transformers' apply_chat_template) encodes, the runner generates from those ids, and
the expected text is the library's decode of the runner's tokens up to the first EOS. Hostile
requests (bad JSON, unknown model, huge max_tokens, a 1 MB prompt, a client that leaves
mid-stream) each get a clear HTTP error or a clean close, and the next good request is answered.
Every request has a timeout; every server is stopped by its fixture.
"""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, TEXT_ADAPTER, run_cli, token_usage
from hf_files import hf_config, write_peft_lora

SECOND = "second"
PROMPT = "The quick brown fox"
TIMEOUT = 60


@pytest.fixture(scope="session")
def server_bin(runner_bin) -> Path:
    """build/lora-share-server (built with the runner by `make runner`)."""
    binary = REPO / "build" / "lora-share-server"
    if not binary.exists():
        subprocess.run(["make", "-C", str(REPO), "runner"], check=True, capture_output=True)
    return binary


@pytest.fixture(scope="module")
def deployment(text_build, tmp_path_factory) -> Path:
    """text_build's output folder plus a second PEFT adapter of the same recipe (added in milliseconds)."""
    out = tmp_path_factory.mktemp("served") / "out"
    shutil.copytree(text_build.build.out_dir, out)
    peft = write_peft_lora(
        out.parent / "peft2",
        hf_config(vocab=400),
        r=4,
        alpha=8,
        targets=["q_proj", "v_proj", "o_proj", "down_proj"],
        seed=7,
    )
    r = run_cli("add", "--to", out, f"{SECOND}={peft}")
    assert r.returncode == 0, r.stderr
    return out


class Server:
    """A running lora-share-server on 127.0.0.1 and an ephemeral port."""

    def __init__(self, binary: Path, folder: Path, *extra):
        self.proc = subprocess.Popen(
            [str(binary), "--dir", str(folder), "--port", "0", *map(str, extra)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stderr.readline()  # "listening on http://127.0.0.1:PORT (...)", or an error
        if not line.startswith("listening on http://"):
            self.proc.wait(timeout=TIMEOUT)
            raise AssertionError(f"server did not start: {line}{self.proc.stderr.read()}")
        self.address = line.split("http://", 1)[1].split()[0]
        # The rest of stderr (one line per request) is drained, so the server never blocks on it.
        self.log: list[str] = []
        self._drain = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self._drain.start()
        self.host, port = self.address.rsplit(":", 1)
        self.port = int(port)

    def request(self, method: str, path: str, body=None, raw: bytes | None = None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        return resp.status, json.loads(payload) if payload else None

    def stream(self, path: str, body: dict) -> list[dict]:
        """The events of a streamed request, parsed, up to [DONE] (asserted)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
        conn.request(
            "POST", path, body=json.dumps({**body, "stream": True}), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")
        events, done = [], False
        for line in resp.read().decode().split("\n"):
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            events.append(json.loads(line[len("data: ") :]))
        conn.close()
        assert done, events
        return events

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._drain.join(timeout=TIMEOUT)


@pytest.fixture(scope="module")
def server(server_bin, deployment):
    s = Server(server_bin, deployment)
    yield s
    s.stop()
    assert s.proc.returncode == 0


@pytest.fixture(scope="module")
def tokenizer(deployment):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(deployment / "tokenizer.json"))


@pytest.fixture(scope="module")
def eos_ids(deployment) -> list[int]:
    return json.loads((deployment / "manifest.json").read_text())["tokenizer"]["eos_token_ids"]


def runner_answer(runner_bin, deployment, adapter, ids, new, tokenizer, eos_ids):
    """build/runner's tokens for `ids`, cut at the first EOS, and their text: what the server must say."""
    r = subprocess.run(
        [
            str(runner_bin),
            "--ptd",
            str(deployment / "foundation.ptd"),
            "--pte",
            str(deployment / f"{adapter}.pte"),
            "--tokens",
            ",".join(map(str, ids)),
            "--max-new-tokens",
            str(new),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr
    tokens = json.loads(r.stdout)["tokens"]
    stop = next((i for i, t in enumerate(tokens) if t in eos_ids), None)
    kept = tokens if stop is None else tokens[:stop]
    return kept, tokenizer.decode(kept, skip_special_tokens=True), "length" if stop is None else "stop"


def test_models_lists_the_deployments_adapters(server):
    status, body = server.request("GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == [TEXT_ADAPTER, SECOND, "base"]
    assert body["object"] == "list"


def test_binds_to_loopback_by_default(server):
    assert server.host == "127.0.0.1"


@pytest.mark.parametrize("adapter", [TEXT_ADAPTER, SECOND])
def test_completion_equals_the_runner(server, runner_bin, deployment, tokenizer, eos_ids, adapter):
    ids = tokenizer.encode(PROMPT).ids
    tokens, text, finish = runner_answer(runner_bin, deployment, adapter, ids, 12, tokenizer, eos_ids)
    status, body = server.request("POST", "/v1/completions", {"model": adapter, "prompt": PROMPT, "max_tokens": 12})
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["tokens"] == tokens
    assert choice["text"] == text
    assert choice["finish_reason"] == finish
    details = body["usage"].pop("completion_tokens_details")  # drafts kept and not: speculation's
    assert body["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(tokens),
        "total_tokens": len(ids) + len(tokens),
    }
    assert set(details) == {"accepted_prediction_tokens", "rejected_prediction_tokens"}
    assert body["model"] == adapter and body["object"] == "text_completion"


def test_the_two_adapters_answer_differently(server):
    answers = [
        server.request("POST", "/v1/completions", {"model": a, "prompt": PROMPT, "max_tokens": 12})[1]
        for a in (TEXT_ADAPTER, SECOND)
    ]
    assert answers[0]["choices"][0]["tokens"] != answers[1]["choices"][0]["tokens"]


@pytest.mark.parametrize("adapter", [TEXT_ADAPTER, SECOND])
def test_streamed_completion_equals_the_runner(server, runner_bin, deployment, tokenizer, eos_ids, adapter):
    ids = tokenizer.encode(PROMPT).ids
    tokens, text, finish = runner_answer(runner_bin, deployment, adapter, ids, 12, tokenizer, eos_ids)
    events = server.stream("/v1/completions", {"model": adapter, "prompt": PROMPT, "max_tokens": 12})
    streamed_tokens = [t for e in events for t in e["choices"][0]["tokens"]]
    assert streamed_tokens == tokens
    assert "".join(e["choices"][0]["text"] for e in events) == text
    assert events[-1]["choices"][0]["finish_reason"] == finish
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    # One event per token: the text arrives as it is generated.
    assert len(events) >= len(tokens)


def test_prompt_of_token_ids(server, runner_bin, deployment, tokenizer, eos_ids):
    ids = [0, 17, 42, 99]
    tokens, _, _ = runner_answer(runner_bin, deployment, SECOND, ids, 8, tokenizer, eos_ids)
    status, body = server.request("POST", "/v1/completions", {"model": SECOND, "prompt": ids, "max_tokens": 8})
    assert status == 200, body
    assert body["choices"][0]["tokens"] == tokens


def test_chat_completion_equals_the_chat_template(server, runner_bin, deployment, tokenizer, eos_ids, text_build):
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    hf = AutoTokenizer.from_pretrained(str(text_build.checkpoint))
    ids = list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    tokens, text, finish = runner_answer(runner_bin, deployment, TEXT_ADAPTER, ids, 10, tokenizer, eos_ids)
    status, body = server.request(
        "POST", "/v1/chat/completions", {"model": TEXT_ADAPTER, "messages": messages, "max_tokens": 10}
    )
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["tokens"] == tokens
    assert choice["message"] == {"role": "assistant", "content": text}
    assert body["usage"]["prompt_tokens"] == len(ids)
    events = server.stream("/v1/chat/completions", {"model": TEXT_ADAPTER, "messages": messages, "max_tokens": 10})
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == text
    assert events[-1]["object"] == "chat.completion.chunk"


def _good(server, tokens_expected):
    status, body = server.request(
        "POST", "/v1/completions", {"model": SECOND, "prompt": [0, 17, 42, 99], "max_tokens": 8}
    )
    assert status == 200, body
    assert body["choices"][0]["tokens"] == tokens_expected


@pytest.fixture(scope="module")
def good_tokens(runner_bin, deployment, tokenizer, eos_ids):
    return runner_answer(runner_bin, deployment, SECOND, [0, 17, 42, 99], 8, tokenizer, eos_ids)[0]


@pytest.mark.parametrize(
    "body, raw, status, words",
    [
        (None, b"{not json", 400, "not valid JSON"),
        (None, b"[1, 2]", 400, "JSON object"),
        ({"prompt": "hi"}, None, 400, "model is missing"),
        ({"model": "nope", "prompt": "hi"}, None, 404, "no adapter called 'nope'"),
        ({"model": SECOND, "prompt": "hi", "max_tokens": 10**9}, None, 400, "context (max_seq_len)"),
        ({"model": SECOND, "prompt": "hi", "max_tokens": -3}, None, 400, "max_tokens"),
        ({"model": SECOND, "prompt": "hi", "max_tokens": "many"}, None, 400, "max_tokens must be an integer"),
        ({"model": SECOND, "prompt": "hi", "temperature": "hot"}, None, 400, "temperature"),
        ({"model": SECOND, "prompt": [1, 100000]}, None, 400, "vocab"),
        ({"model": SECOND, "prompt": {"a": 1}}, None, 400, "prompt must be"),
        ({"model": SECOND}, None, 400, "prompt is missing"),
        ({"model": SECOND, "prompt": "x" * (1 << 20)}, None, 400, "context (max_seq_len)"),
        ({"model": SECOND, "prompt": "hi", "n": 33}, None, 400, "n must be between 1 and 32"),
        ({"model": SECOND, "prompt": "hi", "logprobs": 6}, None, 400, "logprobs must be between 0 and 5"),
        ({"model": SECOND, "prompt": "hi", "tools": [{"type": "function"}]}, None, 400, "tools"),
        ({"model": SECOND, "prompt": "hi", "best_of": 2}, None, 400, "best_of must be 1"),
        ({"model": SECOND, "prompt": "hi", "mirostat": 2}, None, 400, "unknown field 'mirostat'"),
        ({"model": SECOND, "prompt": "hi", "top_p": 1.5}, None, 400, "top_p must be a number between 0 and 1"),
        ({"model": SECOND, "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, None, 400, "up to 4"),
        ({"model": SECOND, "prompt": "hi", "stop": ""}, None, 400, "stop must be a non-empty string"),
        ({"model": SECOND, "prompt": "hi", "cache_prompt": "no"}, None, 400, "cache_prompt must be true or false"),
        ({"model": SECOND, "prompt": "hi", "stream": True, "max_tokens": 10**6}, None, 400, "context (max_seq_len)"),
    ],
)
def test_bad_requests_get_a_clear_error_and_serving_goes_on(server, good_tokens, body, raw, status, words):
    got, answer = server.request("POST", "/v1/completions", body, raw=raw)
    assert got == status, answer
    assert words in answer["error"]["message"], answer
    _good(server, good_tokens)


def test_body_over_the_limit_is_refused(server, good_tokens):
    got, body = server.request("POST", "/v1/completions", raw=b"{" + b" " * (9 << 20) + b"}")
    assert got == 413
    assert "--max-body" in body["error"]["message"]
    _good(server, good_tokens)


def test_fields_that_change_nothing_are_accepted(server, good_tokens):
    status, body = server.request(
        "POST",
        "/v1/completions",
        {
            "model": SECOND,
            "prompt": [0, 17, 42, 99],
            "max_tokens": 8,
            "user": "u1",
            "n": 1,
            "logprobs": None,
            "stream_options": None,
            "metadata": {"k": "v"},
        },
    )
    assert status == 200, body
    assert body["choices"][0]["tokens"] == good_tokens


def test_unknown_route_gets_a_json_404(server):
    status, body = server.request("GET", "/v1/nothing")
    assert status == 404
    assert "no route GET /v1/nothing" in body["error"]["message"] and body["error"]["code"] == 404


def test_no_max_tokens_runs_to_the_end_of_the_context(server, runner_bin, deployment, tokenizer):
    """ignore_eos, so the answer cannot end early: it is every position the context has left."""
    ids = tokenizer.encode(PROMPT).ids
    context = 64  # text_build's max_seq_len
    status, body = server.request("POST", "/v1/completions", {"model": SECOND, "prompt": PROMPT, "ignore_eos": True})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == context - len(ids) + 1
    assert body["choices"][0]["finish_reason"] == "length"
    # Streamed, with the usage chunk asked for: the same answer, usage last.
    events = server.stream(
        "/v1/completions",
        {"model": SECOND, "prompt": PROMPT, "ignore_eos": True, "stream_options": {"include_usage": True}},
    )
    assert events[-1]["choices"] == [] and token_usage(events[-1]["usage"]) == token_usage(body["usage"])
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == body["choices"][0]["text"]


def test_a_second_server_on_the_same_port_is_refused(server, server_bin, deployment, good_tokens):
    r = subprocess.run(
        [str(server_bin), "--dir", str(deployment), "--host", server.host, "--port", str(server.port)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode != 0, r.stderr
    assert f"port {server.port} is in use" in r.stderr, r.stderr
    for _ in range(4):  # every request reaches the first server (none is lost to a second listener)
        _good(server, good_tokens)
    assert server.proc.poll() is None


def test_client_leaving_mid_stream_does_not_stop_the_server(server, good_tokens):
    body = json.dumps({"model": TEXT_ADAPTER, "prompt": PROMPT, "max_tokens": 40, "stream": True}).encode()
    with socket.create_connection((server.host, server.port), timeout=TIMEOUT) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        first = s.recv(4096)  # headers and (usually) the first event, then hang up
        assert b"200" in first.split(b"\r\n", 1)[0]
    for _ in range(3):
        _good(server, good_tokens)
    assert server.proc.poll() is None


def test_stats_count_requests_and_each_request_is_logged(server):
    status, body = server.request("GET", "/v1/stats")
    assert status == 200
    assert body["adapters_known"] == 2 and body["adapters_resident"] >= 1
    assert body["loads"] >= 2 and body["hits"] >= 1
    served = [line for line in server.log if line.startswith("served ")]
    assert served and all("resident" in line and "loads" in line and "evictions" in line for line in served)


def test_stats_report_slots_batches_and_requests(server):
    """/v1/stats against a real server: the default 4 slots, a histogram of batch sizes 1..4 that adds up
    to the decode steps, and each answered completion counted once (two more after two requests,
    streamed or not)."""
    _, before = server.request("GET", "/v1/stats")
    server.request("POST", "/v1/completions", {"model": SECOND, "prompt": [0, 17, 42], "max_tokens": 3})
    server.stream("/v1/completions", {"model": TEXT_ADAPTER, "prompt": [0, 17, 42], "max_tokens": 3})
    status, after = server.request("GET", "/v1/stats")
    assert status == 200
    assert after["parallel"] == 4 and after["slots_in_use"] == 0
    assert isinstance(after["slot_bytes"], int)
    assert len(after["batch_size_counts"]) == 4 and sum(after["batch_size_counts"]) == after["batch_steps"]
    assert after["requests"] == before["requests"] + 2
    assert after["prefix_hits"] >= before["prefix_hits"] and after["prefix_tokens"] >= before["prefix_tokens"]


def test_cache_prompt_false_is_no_prefix_hit(server):
    """A request's ``cache_prompt: false`` (llama-server's field) feeds its whole prompt though a slot holds
    it: no prefix hit; the same request without it is one."""
    body = {"model": SECOND, "prompt": [5, 77, 31, 8, 2], "max_tokens": 3}
    assert server.request("POST", "/v1/completions", body)[0] == 200
    _, before = server.request("GET", "/v1/stats")
    assert server.request("POST", "/v1/completions", {**body, "cache_prompt": False})[0] == 200
    _, after = server.request("GET", "/v1/stats")
    assert after["prefix_hits"] == before["prefix_hits"]
    assert server.request("POST", "/v1/completions", body)[0] == 200
    assert server.request("GET", "/v1/stats")[1]["prefix_hits"] == before["prefix_hits"] + 1


def test_a_client_hanging_up_leaves_a_concurrent_stream_as_it_is_alone(server):
    """Two streams at once; one client hangs up after its first event: the other's greedy text is the
    same request's alone, and every slot is free again afterwards."""
    kept = {"model": TEXT_ADAPTER, "prompt": PROMPT, "max_tokens": 30, "ignore_eos": True}
    _, alone = server.request("POST", "/v1/completions", kept)
    got = {}
    streaming = threading.Thread(target=lambda: got.update(events=server.stream("/v1/completions", kept)))
    streaming.start()
    body = json.dumps(
        {"model": SECOND, "prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "stream": True}
    ).encode()
    with socket.create_connection((server.host, server.port), timeout=TIMEOUT) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        assert b"200" in s.recv(4096).split(b"\r\n", 1)[0]
    streaming.join(timeout=TIMEOUT)
    assert "".join(e["choices"][0]["text"] for e in got["events"]) == alone["choices"][0]["text"]
    assert [t for e in got["events"] for t in e["choices"][0]["tokens"]] == alone["choices"][0]["tokens"]
    # The hung-up request leaves at its next step, which may come after the other stream ended.
    deadline = time.monotonic() + TIMEOUT
    while server.request("GET", "/v1/stats")[1]["slots_in_use"] != 0:
        assert time.monotonic() < deadline, "a slot stayed in use after both requests ended"
        time.sleep(0.05)
    assert server.proc.poll() is None


@pytest.mark.parametrize(
    "args, words",
    [
        (["--port", "http"], "--port must be a number"),
        (["--memory-budget", "lots"], "--memory-budget must be a size"),
        (["--bogus"], "unknown flag '--bogus'"),
        (["--parallel", "0"], "--parallel must be a number from 1 to"),
        (["--parallel", "two"], "--parallel must be a number from 1 to"),
        (["--parallel"], "--parallel needs a value"),
        (["--every-draft", "--no-speculation"], "give one of them"),
    ],
)
def test_bad_flags_are_usage_errors(server_bin, deployment, args, words):
    r = subprocess.run(
        [str(server_bin), "--dir", str(deployment), *args], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ")


def test_missing_folder_and_budget_too_small(server_bin, deployment, tmp_path):
    r = subprocess.run([str(server_bin), "--dir", str(tmp_path)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2 and "manifest.json: no such file" in r.stderr, r.stderr
    r = subprocess.run(
        [str(server_bin), "--dir", str(deployment), "--port", "0", "--memory-budget", "1KiB"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 2 and "budget" in r.stderr, r.stderr


def test_help_shows_usage(server_bin):
    r = subprocess.run([str(server_bin), "--help"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and "/v1/completions" in r.stdout and "--memory-budget" in r.stdout


def test_a_tokenizer_from_another_build_is_refused(server_bin, deployment, tmp_path):
    other = tmp_path / "out"
    shutil.copytree(deployment, other)
    tj = other / "tokenizer.json"
    tj.write_text(tj.read_text().replace('"<|eot_id|>"', '"<|eot_ix|>"'))
    r = subprocess.run(
        [str(server_bin), "--dir", str(other), "--port", "0"], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert r.returncode == 2, r.stderr
    assert f"{tj} (sha256" in r.stderr and "is not the tokenizer" in r.stderr and "foundation.ptd" in r.stderr


def _text(server, body: dict, stream: bool = False):
    """(text, finish_reason, tokens) of a completion, whole or streamed."""
    if stream:
        events = server.stream("/v1/completions", body)
        return (
            "".join(e["choices"][0]["text"] for e in events),
            events[-1]["choices"][0]["finish_reason"],
            [t for e in events for t in e["choices"][0]["tokens"]],
        )
    status, answer = server.request("POST", "/v1/completions", body)
    assert status == 200, answer
    choice = answer["choices"][0]
    return choice["text"], choice["finish_reason"], choice["tokens"]


def test_a_stop_string_across_tokens_never_reaches_the_client(server, runner_bin, deployment, tokenizer, eos_ids):
    ids = tokenizer.encode(PROMPT).ids
    tokens, text, _ = runner_answer(runner_bin, deployment, TEXT_ADAPTER, ids, 24, tokenizer, eos_ids)
    # A stop string made of the end of one token's text and the start of the next one's.
    pieces = [tokenizer.decode(tokens[: i + 1], skip_special_tokens=True) for i in range(len(tokens))]
    k = next(
        i
        for i in range(1, len(pieces) - 1)
        if len(pieces[i]) > len(pieces[i - 1]) and len(pieces[i + 1]) > len(pieces[i])
    )
    stop = pieces[k][-1] + pieces[k + 1][len(pieces[k])]
    expected = text[: text.index(stop)]
    body = {"model": TEXT_ADAPTER, "prompt": PROMPT, "max_tokens": 24, "stop": [stop, "never said"]}
    for stream in (False, True):
        got, finish, _ = _text(server, body, stream)
        assert (got, finish) == (expected, "stop"), (stop, stream)
    # A stop string the answer never holds changes nothing.
    assert _text(server, {**body, "stop": "never said"})[:2] == (text, "length" if len(tokens) == 24 else "stop")


def test_filters_that_keep_one_token_are_greedy(server, runner_bin, deployment, tokenizer, eos_ids):
    tokens, _, _ = runner_answer(runner_bin, deployment, SECOND, tokenizer.encode(PROMPT).ids, 12, tokenizer, eos_ids)
    for keep_one in ({"top_k": 1}, {"top_p": 0}, {"min_p": 1}):
        body = {"model": SECOND, "prompt": PROMPT, "max_tokens": 12, "temperature": 2, "seed": 3, **keep_one}
        assert _text(server, body)[2] == tokens, keep_one


def test_the_same_seed_gives_the_same_text_streamed_or_not(server):
    body = {
        "model": SECOND,
        "prompt": PROMPT,
        "max_tokens": 16,
        "temperature": 1.5,
        "top_p": 0.95,
        "top_k": 50,
        "min_p": 0.01,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repeat_penalty": 1.1,
    }
    answers = {seed: _text(server, {**body, "seed": seed}) for seed in (1, 2, 3)}
    assert len({a[0] for a in answers.values()}) > 1  # the seed matters
    for seed, answer in answers.items():
        assert _text(server, {**body, "seed": seed}) == answer
        assert _text(server, {**body, "seed": seed}, stream=True) == answer


def test_penalties_equal_transformers(server, text_hf, tokenizer):
    """Greedy with transformers' repetition_penalty, and with OpenAI's presence/frequency penalties written
    here as a logits processor, on the eager PEFT model: the server's tokens."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class OpenAIPenalties(LogitsProcessor):
        def __init__(self, prompt_len, presence, frequency):
            self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

        def __call__(self, input_ids, scores):
            for t, c in zip(*torch.unique(input_ids[0, self.prompt_len :], return_counts=True)):
                scores[0, t] -= self.presence + c * self.frequency
            return scores

    _, model = text_hf
    ids = tokenizer.encode(PROMPT).ids
    cases = [
        ({"repeat_penalty": 1.8}, {"repetition_penalty": 1.8}),
        (
            {"presence_penalty": 1.5, "frequency_penalty": 0.7},
            {"logits_processor": LogitsProcessorList([OpenAIPenalties(len(ids), 1.5, 0.7)])},
        ),
    ]
    for ours, theirs in cases:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=16,
                pad_token_id=0,
                eos_token_id=[],
                **theirs,
            )
        expected = out[0, len(ids) :].tolist()
        got = _text(server, {"model": TEXT_ADAPTER, "prompt": PROMPT, "max_tokens": 16, "ignore_eos": True, **ours})
        assert got[2] == expected, ours
    plain = _text(server, {"model": TEXT_ADAPTER, "prompt": PROMPT, "max_tokens": 16, "ignore_eos": True})
    assert plain[2] != expected  # the penalties changed the answer: the comparison above checks them


DEEP = 100_000


@pytest.mark.parametrize(
    "field", ["max_tokens", "lora", "stream", "stop", "temperature", "n", "stream_options", "messages", "model"]
)
def test_a_body_nested_100000_deep_gets_a_400_and_the_server_answers_on(server, good_tokens, field):
    """Issue 58: a field's value nested 100,000 levels deep killed the server (its error path dumped the
    value recursively). The library reads a body with a depth bound before building it: a 400."""
    deep = "[" * DEEP + "1" + "]" * DEEP
    path = "/v1/chat/completions" if field == "messages" else "/v1/completions"
    body = '{"model": "' + SECOND + '", "prompt": "x", "' + field + '": ' + deep + "}"
    if field == "messages":
        body = '{"model": "' + SECOND + '", "messages": [{"role": "user", "content": ' + deep + "}]}"
    got, answer = server.request("POST", path, raw=body.encode())
    assert got == 400, answer
    assert "nests arrays and objects more than 64 levels deep" in answer["error"]["message"]
    _good(server, good_tokens)
    assert server.proc.poll() is None


def test_a_deep_body_of_objects_and_a_long_value_are_refused_shortly(server, good_tokens):
    deep = '{"a": ' * DEEP + "1" + "}" * DEEP
    got, answer = server.request(
        "POST", "/v1/completions", raw=('{"model": "base", "metadata": ' + deep + "}").encode()
    )
    assert got == 400 and "more than 64 levels deep" in answer["error"]["message"]
    got, answer = server.request("POST", "/v1/completions", {"model": SECOND, "prompt": "x", "seed": "9" * 500_000})
    assert got == 400 and answer["error"]["message"].startswith('seed must be an integer, got "999')
    assert len(answer["error"]["message"]) < 120
    _good(server, good_tokens)


def test_one_model_by_id(server):
    for name in (TEXT_ADAPTER, SECOND, "base"):
        status, body = server.request("GET", f"/v1/models/{name}")
        assert status == 200 and body == {"id": name, "object": "model", "created": 0, "owned_by": "lora-share"}
    status, body = server.request("GET", "/v1/models/nope")
    assert status == 404
    assert body["error"]["param"] == "model" and body["error"]["type"] == "invalid_request_error"
    assert "The model 'nope' does not exist" in body["error"]["message"]
