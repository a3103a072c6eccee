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
from pathlib import Path

import pytest

from conftest import REPO, TEXT_ADAPTER, run_cli
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
    peft = write_peft_lora(out.parent / "peft2", hf_config(vocab=400), r=4, alpha=8,
                           targets=["q_proj", "v_proj", "o_proj", "down_proj"], seed=7)
    r = run_cli("add", "--to", out, f"{SECOND}={peft}")
    assert r.returncode == 0, r.stderr
    return out


class Server:
    """A running lora-share-server on 127.0.0.1 and an ephemeral port."""

    def __init__(self, binary: Path, folder: Path, *extra):
        self.proc = subprocess.Popen([str(binary), "--dir", str(folder), "--port", "0", *map(str, extra)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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
        conn.request("POST", path, body=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json"})
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
            events.append(json.loads(line[len("data: "):]))
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
    r = subprocess.run([str(runner_bin), "--ptd", str(deployment / "foundation.ptd"),
                        "--pte", str(deployment / f"{adapter}.pte"), "--tokens", ",".join(map(str, ids)),
                        "--max-new-tokens", str(new), "--json"], capture_output=True, text=True, timeout=TIMEOUT)
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
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                             "total_tokens": len(ids) + len(tokens)}
    assert body["model"] == adapter and body["object"] == "text_completion"


def test_the_two_adapters_answer_differently(server):
    answers = [server.request("POST", "/v1/completions", {"model": a, "prompt": PROMPT, "max_tokens": 12})[1]
               for a in (TEXT_ADAPTER, SECOND)]
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
    status, body = server.request("POST", "/v1/chat/completions",
                                  {"model": TEXT_ADAPTER, "messages": messages, "max_tokens": 10})
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["tokens"] == tokens
    assert choice["message"] == {"role": "assistant", "content": text}
    assert body["usage"]["prompt_tokens"] == len(ids)
    events = server.stream("/v1/chat/completions", {"model": TEXT_ADAPTER, "messages": messages, "max_tokens": 10})
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == text
    assert events[-1]["object"] == "chat.completion.chunk"


def _good(server, tokens_expected):
    status, body = server.request("POST", "/v1/completions", {"model": SECOND, "prompt": [0, 17, 42, 99],
                                                               "max_tokens": 8})
    assert status == 200, body
    assert body["choices"][0]["tokens"] == tokens_expected


@pytest.fixture(scope="module")
def good_tokens(runner_bin, deployment, tokenizer, eos_ids):
    return runner_answer(runner_bin, deployment, SECOND, [0, 17, 42, 99], 8, tokenizer, eos_ids)[0]


@pytest.mark.parametrize("body, raw, status, words", [
    (None, b"{not json", 400, "not valid JSON"),
    (None, b"[1, 2]", 400, "JSON object"),
    ({"prompt": "hi"}, None, 400, "model is missing"),
    ({"model": "nope", "prompt": "hi"}, None, 404, "no adapter called 'nope'"),
    ({"model": SECOND, "prompt": "hi", "max_tokens": 10 ** 9}, None, 400, "context (max_seq_len)"),
    ({"model": SECOND, "prompt": "hi", "max_tokens": -3}, None, 400, "max_tokens"),
    ({"model": SECOND, "prompt": "hi", "max_tokens": "many"}, None, 400, "max_tokens must be an integer"),
    ({"model": SECOND, "prompt": "hi", "temperature": "hot"}, None, 400, "temperature"),
    ({"model": SECOND, "prompt": [1, 100000]}, None, 400, "vocab"),
    ({"model": SECOND, "prompt": {"a": 1}}, None, 400, "prompt must be"),
    ({"model": SECOND}, None, 400, "prompt is missing"),
    ({"model": SECOND, "prompt": "x" * (1 << 20)}, None, 400, "context (max_seq_len)"),
    ({"model": SECOND, "prompt": "hi", "n": 3}, None, 400, "n must be 1"),
    ({"model": SECOND, "prompt": "hi", "logprobs": 2}, None, 400, "logprobs are not served"),
    ({"model": SECOND, "prompt": "hi", "tools": [{"type": "function"}]}, None, 400, "tools"),
    ({"model": SECOND, "prompt": "hi", "best_of": 2}, None, 400, "best_of must be 1"),
    ({"model": SECOND, "prompt": "hi", "mirostat": 2}, None, 400, "unknown field 'mirostat'"),
    ({"model": SECOND, "prompt": "hi", "stream": True, "max_tokens": 10 ** 6}, None, 400, "context (max_seq_len)"),
])
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
    status, body = server.request("POST", "/v1/completions", {
        "model": SECOND, "prompt": [0, 17, 42, 99], "max_tokens": 8, "user": "u1", "n": 1, "logprobs": None,
        "stream_options": None, "metadata": {"k": "v"}})
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
    events = server.stream("/v1/completions", {"model": SECOND, "prompt": PROMPT, "ignore_eos": True,
                                               "stream_options": {"include_usage": True}})
    assert events[-1]["choices"] == [] and events[-1]["usage"] == body["usage"]
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == body["choices"][0]["text"]


def test_a_second_server_on_the_same_port_is_refused(server, server_bin, deployment, good_tokens):
    r = subprocess.run([str(server_bin), "--dir", str(deployment), "--host", server.host, "--port", str(server.port)],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode != 0, r.stderr
    assert f"port {server.port} is in use" in r.stderr, r.stderr
    for _ in range(4):  # every request reaches the first server (none is lost to a second listener)
        _good(server, good_tokens)
    assert server.proc.poll() is None


def test_client_leaving_mid_stream_does_not_stop_the_server(server, good_tokens):
    body = json.dumps({"model": TEXT_ADAPTER, "prompt": PROMPT, "max_tokens": 40, "stream": True}).encode()
    with socket.create_connection((server.host, server.port), timeout=TIMEOUT) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
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


@pytest.mark.parametrize("args, words", [
    (["--port", "http"], "--port must be a number"),
    (["--memory-budget", "lots"], "--memory-budget must be a size"),
    (["--bogus"], "unknown flag '--bogus'"),
])
def test_bad_flags_are_usage_errors(server_bin, deployment, args, words):
    r = subprocess.run([str(server_bin), "--dir", str(deployment), *args], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ")


def test_missing_folder_and_budget_too_small(server_bin, deployment, tmp_path):
    r = subprocess.run([str(server_bin), "--dir", str(tmp_path)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2 and "manifest.json: no such file" in r.stderr, r.stderr
    r = subprocess.run([str(server_bin), "--dir", str(deployment), "--port", "0", "--memory-budget", "1KiB"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2 and "budget" in r.stderr, r.stderr


def test_help_shows_usage(server_bin):
    r = subprocess.run([str(server_bin), "--help"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and "/v1/completions" in r.stdout and "--memory-budget" in r.stdout


def test_a_tokenizer_from_another_build_is_refused(server_bin, deployment, tmp_path):
    other = tmp_path / "out"
    shutil.copytree(deployment, other)
    tj = other / "tokenizer.json"
    tj.write_text(tj.read_text().replace('"<|eot_id|>"', '"<|eot_ix|>"'))
    r = subprocess.run([str(server_bin), "--dir", str(other), "--port", "0"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 2, r.stderr
    assert f"{tj} (sha256" in r.stderr and "is not the tokenizer" in r.stderr and "foundation.ptd" in r.stderr
