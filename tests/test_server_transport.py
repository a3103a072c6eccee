"""lora-share-server's connections (issue 58): slow and idle clients, memory after large bodies, signals.

The references are the clock, the bytes on the wire and the process itself: a request's answer is
compared with the same request's answer on a quiet server, PSS is read from /proc/PID/smaps_rollup,
exit statuses and times from the process. Counts and times are small and bounded (a few seconds a
test), so the module runs in CI and feeds the fuzz suite.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import TEXT_ADAPTER, TINY_FOUNDATION, build_config, write_config
from test_server import PROMPT, TIMEOUT, Server, deployment, server_bin  # noqa: F401 (fixtures)

COMPLETION = {"model": TEXT_ADAPTER, "prompt": PROMPT, "max_tokens": 8}


def raw_request(method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{length}{headers}\r\n".encode() + body


def completion_bytes(body: dict = COMPLETION) -> bytes:
    data = json.dumps(body).encode()
    return raw_request("POST", "/v1/completions", data, "Content-Type: application/json\r\n")


def read_response(s: socket.socket, data: bytes = b"") -> tuple[int, dict | None, bytes]:
    """One answer with a Content-Length body from `s` (its start maybe in `data`, read before): status,
    JSON body, bytes read after it."""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the body")
        rest += chunk
    body = json.loads(rest[:length]) if length else None
    return int(lines[0].split()[1]), body, rest[length:]


def ask(server: Server, data: bytes, timeout: float = TIMEOUT) -> tuple[int, dict | None]:
    with socket.create_connection((server.host, server.port), timeout=timeout) as s:
        s.sendall(data)
        status, body, _ = read_response(s)
        return status, body


def closed_by_server(s: socket.socket) -> bytes:
    """What the server still sent before closing `s` (b"" for a silent close)."""
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    return got


class SlowClients:
    """`count` connections, each sending `prefix` at once, then `data` one byte every `interval` seconds,
    until closed."""

    def __init__(self, server: Server, count: int, data: bytes, prefix: bytes = b"", interval: float = 1.0):
        self.sockets = [socket.create_connection((server.host, server.port), timeout=TIMEOUT) for _ in range(count)]
        for s in self.sockets:
            s.sendall(prefix)
        self.data, self.interval = data, interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self):
        for byte in self.data:
            for s in self.sockets:
                try:
                    s.send(bytes([byte]))
                except OSError:
                    pass
            if self.stopped.wait(self.interval):
                return

    def close(self):
        self.stopped.set()
        self.thread.join(timeout=TIMEOUT)
        for s in self.sockets:
            s.close()


@pytest.fixture(scope="module")
def server(server_bin, deployment):  # noqa: F811
    s = Server(server_bin, deployment, "--parallel", 4)
    yield s
    s.stop()
    assert s.proc.returncode == 0


@pytest.fixture(scope="module")
def quiet_answer(server) -> dict:
    status, body = ask(server, completion_bytes())
    assert status == 200, body
    return body["choices"][0]


@pytest.mark.parametrize("part", ["head", "body"])
def test_slow_clients_hold_no_thread(server, quiet_answer, part):
    """24 connections sending one byte a second (of a head, or of a body after a whole head) take
    no thread: /health answers within 2 s and a completion within 30 s, equal to its quiet answer."""
    head, body = completion_bytes().split(b"\r\n\r\n", 1)
    if part == "head":
        slow = SlowClients(server, 24, head + b"\r\n\r\n" + body)
    else:
        slow = SlowClients(server, 24, body, prefix=head + b"\r\n\r\n")
    try:
        time.sleep(1.5)  # every slow client has sent a byte or two
        start = time.monotonic()
        status, body = ask(server, raw_request("GET", "/health"), timeout=2)
        assert status == 200 and body == {"status": "ok"}
        assert time.monotonic() - start < 2
        start = time.monotonic()
        status, body = ask(server, completion_bytes(), timeout=30)
        assert status == 200, body
        assert time.monotonic() - start < 30
        assert body["choices"][0]["tokens"] == quiet_answer["tokens"]
    finally:
        slow.close()


@pytest.fixture(scope="module")
def strict_server(server_bin, deployment):  # noqa: F811
    """Deadlines of a second, so their ends come within a test."""
    s = Server(server_bin, deployment, "--header-timeout", 1, "--body-timeout", 1)
    yield s
    s.stop()
    assert s.proc.returncode == 0


@pytest.fixture(scope="module")
def capped_server(server_bin, deployment):  # noqa: F811
    """Few connections and a small --max-body, so their limits come within a test."""
    s = Server(server_bin, deployment, "--max-connections", 8, "--max-body", "1MiB")
    yield s
    s.stop()
    assert s.proc.returncode == 0


def test_a_head_sent_slowly_gets_408_at_its_deadline(strict_server):
    """A byte every 0.2 s, so no gap between bytes is long: the head's deadline is a total time."""
    with socket.create_connection((strict_server.host, strict_server.port), timeout=TIMEOUT) as s:
        start = time.monotonic()
        for byte in completion_bytes()[:20]:
            s.send(bytes([byte]))
            time.sleep(0.2)
            if time.monotonic() - start > 1.5:
                break
        status, body, _ = read_response(s)
        elapsed = time.monotonic() - start
    assert status == 408 and "--header-timeout (1 s)" in body["error"]["message"], body
    assert 0.9 < elapsed < 2.5


def test_a_body_sent_slowly_gets_408_at_its_deadline(strict_server):
    request = completion_bytes()
    head, body = request.split(b"\r\n\r\n", 1)
    with socket.create_connection((strict_server.host, strict_server.port), timeout=TIMEOUT) as s:
        s.sendall(head + b"\r\n\r\n")
        start = time.monotonic()
        for byte in body[:10]:
            s.send(bytes([byte]))
            time.sleep(0.2)
        status, answer, _ = read_response(s)
        elapsed = time.monotonic() - start
    assert status == 408 and "--body-timeout (1 s)" in answer["error"]["message"], answer
    assert 0.9 < elapsed < 2.5


def test_an_idle_connection_is_closed_silently(strict_server):
    with socket.create_connection((strict_server.host, strict_server.port), timeout=TIMEOUT) as s:
        start = time.monotonic()
        assert closed_by_server(s) == b""
        assert 0.9 < time.monotonic() - start < 2.5


def test_keep_alive_and_pipelined_requests_are_answered_in_order(capped_server):
    with socket.create_connection((capped_server.host, capped_server.port), timeout=TIMEOUT) as s:
        s.sendall(raw_request("GET", "/health"))
        assert read_response(s)[:2] == (200, {"status": "ok"})
        # Two requests in one write: the second waits for the first's answer.
        s.sendall(raw_request("GET", "/v1/models") + raw_request("GET", "/health"))
        status, models, rest = read_response(s)
        assert status == 200 and models["object"] == "list"
        assert read_response(s, rest) == (200, {"status": "ok"}, b"")


def test_more_connections_than_the_cap_close_the_oldest_idle_one(capped_server):
    idle = [socket.create_connection((capped_server.host, capped_server.port), timeout=TIMEOUT) for _ in range(8)]
    try:
        time.sleep(0.2)
        status, body = ask(capped_server, raw_request("GET", "/health"))
        assert status == 200
        # The first idle connection made room for it, silently; the newest are still open.
        assert closed_by_server(idle[0]) == b""
        idle[-1].sendall(raw_request("GET", "/health"))
        assert read_response(idle[-1])[0] == 200
    finally:
        for s in idle:
            s.close()


def test_more_connections_than_the_cap_refuse_the_slowest_sender(capped_server):
    slow = [socket.create_connection((capped_server.host, capped_server.port), timeout=TIMEOUT) for _ in range(8)]
    try:
        for s in slow:
            s.sendall(b"GET /he")
        time.sleep(0.2)
        assert ask(capped_server, raw_request("GET", "/health"))[0] == 200
        got = closed_by_server(slow[0])
        assert got.startswith(b"HTTP/1.1 503") and b"--max-connections" in got, got
    finally:
        for s in slow:
            s.close()


@pytest.mark.parametrize(
    "data, status, words",
    [
        (
            b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
            400,
            "both Content-Length and Transfer-Encoding",
        ),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400, "two Content"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "not a number of bytes"),
        (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "not served"),
        (b"GET /health HTTP/1.1\nHost: x\r\n\r\n", 400, "not ended by CRLF"),
        (b"GET /health HTTP/1.1\r\nX: " + b"y" * 40000 + b"\r\n\r\n", 431, "longer than 32 KiB"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n", 413, "--max-body"),
        (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "not a hexadecimal"),
        (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX", 400, "not followed by CRLF"),
    ],
)
def test_framing_that_could_be_read_two_ways_is_refused(capped_server, data, status, words):
    """Refused at once by the reading thread (the body over --max-body is never read)."""
    start = time.monotonic()
    got, body = ask(capped_server, data)
    assert got == status and words in body["error"]["message"], body
    assert time.monotonic() - start < 5  # well before the head's deadline (10 s)
    assert ask(capped_server, raw_request("GET", "/health"))[0] == 200


def test_chunked_and_expect_continue_bodies_are_answered_as_plain_ones(capped_server):
    data = json.dumps(COMPLETION).encode()
    _, plain = ask(capped_server, completion_bytes())
    chunked = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(data[i : i + 10]), data[i : i + 10]) for i in range(0, len(data), 10))
        + b"0\r\n\r\n"
    )
    status, body = ask(capped_server, chunked)
    assert status == 200 and body["choices"][0]["tokens"] == plain["choices"][0]["tokens"]
    with socket.create_connection((capped_server.host, capped_server.port), timeout=TIMEOUT) as s:
        s.sendall(
            raw_request("POST", "/v1/completions", b"", "Expect: 100-continue\r\n").replace(
                b"Content-Length: 0", b"Content-Length: %d" % len(data)
            )
        )
        assert s.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(data)
        status, body, rest = read_response(s)
    assert status == 200 and body["choices"][0]["tokens"] == plain["choices"][0]["tokens"] and rest == b""


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Pss in smaps_rollup")


@pytest.mark.slow  # ~9 s of 6 MB bodies: `make test`, not the edit loop
def test_memory_is_returned_after_large_hostile_bodies(server, quiet_answer):
    """Twelve 6 MB bodies of nested arrays, 4 at a time (millions of JSON values each): PSS comes back
    to within 64 MiB of its level before them, and the server answers as before."""
    before = pss_bytes(server.proc.pid)
    nest = "[" * 16 + "]" * 16
    value = ",".join([nest] * (6_000_000 // (len(nest) + 1) + 1))
    body = json.dumps({"model": TEXT_ADAPTER, "prompt": "x", "max_tokens": 1})[:-1] + f', "stop": [{value}]}}'
    data = raw_request("POST", "/v1/completions", body.encode(), "Content-Type: application/json\r\n")
    assert len(data) > 6_000_000
    statuses = []

    def send_three():
        for _ in range(3):
            statuses.append(ask(server, data)[0])

    threads = [threading.Thread(target=send_three) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    assert statuses == [400] * 12
    deadline = time.monotonic() + 10
    while pss_bytes(server.proc.pid) > before + (64 << 20) and time.monotonic() < deadline:
        time.sleep(0.2)
    after = pss_bytes(server.proc.pid)
    print(f"PSS {before >> 20} MiB before, {after >> 20} MiB after")
    assert after <= before + (64 << 20), f"PSS {before >> 20} MiB before, {after >> 20} MiB 10 s after"
    status, answer = ask(server, completion_bytes())
    assert status == 200 and answer["choices"][0]["tokens"] == quiet_answer["tokens"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--header-timeout", "0"], "--header-timeout must be a number of seconds"),
        (["--body-timeout", "soon"], "--body-timeout must be a number of seconds"),
        (["--drain-timeout", "-1"], "--drain-timeout must be a number of seconds"),
        (["--max-connections", "0"], "--max-connections must be a number from 1"),
        (["--max-connections", "65536"], "ulimit -n"),
    ],
)
def test_bad_transport_flags_are_usage_errors(server_bin, deployment, args, words):  # noqa: F811
    r = subprocess.run(
        ["prlimit", "--nofile=4096:4096", str(server_bin), "--dir", str(deployment), "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 2 and words in r.stderr, r.stderr


# Signals: streams long enough to be open when they come. A context of LONG + 24 on the tiny
# foundation, ids as the prompt (no tokenizer), ignore_eos, --parallel 1: each stream generates LONG
# tokens while the others wait for the slot.
LONG = 4000


@pytest.fixture(scope="module")
def long_context(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("long")
    cfg = write_config(
        folder,
        {"synthetic": TINY_FOUNDATION, "max_seq_len": LONG + 24},
        [{"name": "a", "synthetic": {"rank": 4, "alpha": 8, "target_modules": ["q_proj"], "seed": 1}}],
    )
    return build_config(cfg).out_dir


class StreamReader:
    """One streamed request of LONG tokens, read to the server's close on a thread of its own."""

    def __init__(self, server: Server):
        body = json.dumps({"model": "a", "prompt": [1, 2, 3], "max_tokens": LONG, "ignore_eos": True, "stream": True})
        self.sock = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
        self.sock.sendall(raw_request("POST", "/v1/completions", body.encode(), "Content-Type: application/json\r\n"))
        self.got = b""
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            while chunk := self.sock.recv(65536):
                self.got += chunk
                if b"data: {" in self.got:
                    self.started.set()
        except OSError:
            pass

    def finished(self) -> bool:
        """Whether the whole stream arrived: every event, [DONE] and the chunked answer's end."""
        self.thread.join(timeout=TIMEOUT)
        events = [line for line in self.got.split(b"\n") if line.startswith(b"data: {")]
        return len(events) == LONG + 1 and b"data: [DONE]" in self.got and self.got.endswith(b"0\r\n\r\n")


@contextlib.contextmanager
def draining_server(binary, folder, streams: int, *args):
    """A server with `streams` long streams asked of it, the first one begun; killed if the test fails."""
    server = Server(binary, folder, "--parallel", 1, *args)
    readers = []
    try:
        readers = [StreamReader(server) for _ in range(streams)]
        assert readers[0].started.wait(TIMEOUT), readers[0].got
        yield server, readers
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(timeout=TIMEOUT)
        for r in readers:
            r.sock.close()


@pytest.mark.slow  # exports a build of its own (long_context)
def test_health_answers_while_completions_fill_every_worker(server_bin, long_context):  # noqa: F811
    """20 long streams on one slot: every worker a completion may take is taken, /health still answers."""
    with draining_server(server_bin, long_context, 20) as (server, readers):
        start = time.monotonic()
        assert ask(server, raw_request("GET", "/health"), timeout=2) == (200, {"status": "ok"})
        assert time.monotonic() - start < 2
        # More completions were open than the workers (8 for --parallel 1) could all hold.
        assert sum(r.thread.is_alive() for r in readers) > 8


@pytest.mark.slow  # exports a build of its own (long_context)
def test_first_signal_drains_the_open_streams(server_bin, long_context):  # noqa: F811
    """The stream running and the two waiting for the slot are answered to their end, then exit 0."""
    with draining_server(server_bin, long_context, 3, "--drain-timeout", 60) as (server, readers):
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        with pytest.raises(ConnectionRefusedError):  # no new connections while draining
            socket.create_connection((server.host, server.port), timeout=TIMEOUT)
        assert all(r.finished() for r in readers), [r.got[-100:] for r in readers]
        assert server.proc.wait(timeout=TIMEOUT) == 0


@pytest.mark.slow  # exports a build of its own (long_context)
def test_second_signal_exits_at_once(server_bin, long_context):  # noqa: F811
    with draining_server(server_bin, long_context, 20, "--drain-timeout", 60) as (server, readers):
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert server.proc.poll() is None, "the drain of 20 streams ended in 0.2 s"
        start = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=5) == 128 + signal.SIGINT
        assert time.monotonic() - start < 5
        assert not all(r.finished() for r in readers), "every stream ended: nothing was cut"


@pytest.mark.slow  # exports a build of its own (long_context)
def test_drain_timeout_bounds_the_drain(server_bin, long_context):  # noqa: F811
    with draining_server(server_bin, long_context, 20, "--drain-timeout", 1) as (server, readers):
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=5) == 128 + signal.SIGTERM
        assert 0.9 < time.monotonic() - start < 3
        assert not all(r.finished() for r in readers), "every stream ended: nothing was cut"
