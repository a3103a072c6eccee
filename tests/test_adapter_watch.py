"""Adapters added to (and removed from) a running lora-share-server are served without a restart.

`lora-share add --to DIR` rewrites DIR/manifest.json; the server polls it and registers each new adapter
(checked against the foundation). Here a copy of untied_build starts with its last adapter left out of
manifest.json; writing the full manifest back (a complete file renamed into place, as the writer does)
must make /v1/models list it within 2 s, and its answer must be build/runner's for the same ids. An
adapter whose file does not verify is refused, and the others keep serving. POST /v1/adapters serves a
.pte named by path, DELETE /v1/adapters/NAME removes one: a request streaming on it finishes, later ones
get 404 (that removal waits for a request in flight is checked with a paused callback in test_c_api).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

TIMEOUT = 300
NEW = 6
PROMPT = [1, 17, 42]


def write_manifest(folder, manifest: dict) -> None:
    tmp = folder / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, folder / "manifest.json")


class Server:
    def __init__(self, binary, folder):
        self.proc = subprocess.Popen(
            [str(binary), "--dir", str(folder), "--port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stderr.readline()
        assert line.startswith("listening on http://"), line + self.proc.stderr.read()
        self.host, port = line.split("http://", 1)[1].split()[0].rsplit(":", 1)
        self.port = int(port)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
        conn.request(
            method, path, body=None if body is None else json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        out = resp.status, json.loads(resp.read())
        conn.close()
        return out

    def models(self) -> list[str]:
        return [m["id"] for m in self.request("GET", "/v1/models")[1]["data"]]

    def complete(self, model: str) -> tuple[int, dict]:
        return self.request("POST", "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": NEW})

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=TIMEOUT)
        return self.proc.stderr.read()


def stream_events(server: Server, body: dict, on_first=None) -> list[dict]:
    """The parsed events of a streamed completion up to [DONE] (asserted); ``on_first()`` runs once the
    first event has arrived, while the rest is still being generated."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
    conn.request(
        "POST",
        "/v1/completions",
        body=json.dumps({**body, "stream": True}),
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    events = []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            conn.close()
            return events
        events.append(json.loads(line[len("data: ") :]))
        if len(events) == 1 and on_first is not None:
            on_first()
    pytest.fail(f"the stream ended without [DONE] after {events}")


def runner_tokens(runner_bin, build, name) -> list[int]:
    proc = subprocess.run(
        [
            str(runner_bin),
            "--ptd",
            str(build.ptd),
            "--pte",
            str(build.ptes[name]),
            "--tokens",
            ",".join(map(str, PROMPT)),
            "--max-new-tokens",
            str(NEW),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["tokens"]


def wait_until_listed(server: Server, name: str, within: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within:
        if name in server.models():
            return time.monotonic() - start
        time.sleep(0.05)
    pytest.fail(f"{name} not listed within {within} s: {server.models()}")


@pytest.fixture
def folder(untied_build, tmp_path):
    """A copy of untied_build whose manifest.json leaves its last adapter out; returns (folder, full manifest)."""
    target = tmp_path / "deploy"
    shutil.copytree(untied_build.out_dir, target)
    full = json.loads((target / "manifest.json").read_text())
    write_manifest(target, dict(full, adapters=full["adapters"][:-1]))
    return target, full


def test_an_added_adapter_is_served_within_2_s(runner_bin, untied_build, folder):
    target, full = folder
    new = full["adapters"][-1]["name"]
    server = Server(runner_bin.parent / "lora-share-server", target)
    try:
        assert new not in server.models()
        assert server.complete(new)[0] == 404
        write_manifest(target, full)
        wait_until_listed(server, new, within=2.0)
        status, body = server.complete(new)
        assert status == 200, body
        assert body["choices"][0]["tokens"] == runner_tokens(runner_bin, untied_build, new)
        old = full["adapters"][0]["name"]
        assert server.complete(old)[1]["choices"][0]["tokens"] == runner_tokens(runner_bin, untied_build, old)
    finally:
        log = server.stop()
    assert f"serving adapter {new}" in log


def test_an_adapter_that_does_not_verify_is_refused_and_the_others_serve(runner_bin, untied_build, folder):
    target, full = folder
    (target / "broken.pte").write_bytes(b"not a program" * 100)
    server = Server(runner_bin.parent / "lora-share-server", target)
    try:
        write_manifest(target, dict(full, adapters=full["adapters"][:-1] + [{"name": "broken", "file": "broken.pte"}]))
        time.sleep(1.5)
        assert "broken" not in server.models()
        assert server.complete("broken")[0] == 404
        old = full["adapters"][0]["name"]
        status, body = server.complete(old)
        assert status == 200 and body["choices"][0]["tokens"] == runner_tokens(runner_bin, untied_build, old)
    finally:
        log = server.stop()
    assert "refused adapter broken: LS_ERR_LOAD" in log and "broken.pte" in log


@pytest.mark.slow
def test_lora_share_add_into_a_served_folder(runner_bin, text_build, tmp_path):
    """The issue's case end to end: `lora-share add --to DIR` while lora-share-server serves DIR. The added
    adapter (text_build's PEFT folder under a new name) is listed within 2 s of add's exit and answers a
    chat completion as the adapter built with the folder does (the same PEFT weights)."""
    from conftest import TEXT_ADAPTER, run_cli

    target = tmp_path / "deploy"
    shutil.copytree(text_build.build.out_dir, target)
    server = Server(runner_bin.parent / "lora-share-server", target)
    chat = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": NEW}
    try:
        assert server.models().count("again") == 0
        proc = run_cli("add", "--to", target, f"again={text_build.peft}")
        assert proc.returncode == 0, proc.stderr
        wait_until_listed(server, "again", within=2.0)
        status, added = server.request("POST", "/v1/chat/completions", dict(chat, model="again"))
        assert status == 200, added
        built = server.request("POST", "/v1/chat/completions", dict(chat, model=TEXT_ADAPTER))[1]
        assert added["choices"][0]["message"] == built["choices"][0]["message"]
    finally:
        server.stop()


def test_post_serves_an_adapter_and_refuses_what_does_not_verify(runner_bin, untied_build, folder):
    """POST /v1/adapters {"path"}: a relative path is read in the served folder; the adapter is listed and
    answers as build/runner does as soon as the POST returns. A name served already, a damaged file, a
    foundation's file and a bad body are refused with a 4xx naming the problem; the others keep serving."""
    target, full = folder
    new, old = full["adapters"][-1], full["adapters"][0]["name"]
    (target / "broken.pte").write_bytes(b"not a program" * 100)
    server = Server(runner_bin.parent / "lora-share-server", target)
    try:
        status, body = server.request("POST", "/v1/adapters", {"path": new["file"]})
        assert status == 201 and body["id"] == new["name"], body
        assert new["name"] in server.models()
        status, body = server.complete(new["name"])
        assert status == 200 and body["choices"][0]["tokens"] == runner_tokens(runner_bin, untied_build, new["name"])

        status, body = server.request("POST", "/v1/adapters", {"path": str(target / new["file"])})
        assert status == 409 and "served already" in body["error"]["message"], body
        for path, words in [
            ("broken.pte", "broken.pte"),
            ("foundation.ptd", "foundation.ptd"),
            ("nope.pte", "nope.pte"),
        ]:
            status, body = server.request("POST", "/v1/adapters", {"path": path})
            assert status == 400 and words in body["error"]["message"], (path, body)
        for bad, words in [
            ({}, "path must be"),
            ({"path": 3}, "path must be"),
            ({"path": "x.pte", "name": "y"}, "unknown field 'name'"),
        ]:
            status, body = server.request("POST", "/v1/adapters", bad)
            assert status == 400 and words in body["error"]["message"], (bad, body)
        assert "broken" not in server.models() and server.complete("broken")[0] == 404
        status, body = server.complete(old)
        assert status == 200 and body["choices"][0]["tokens"] == runner_tokens(runner_bin, untied_build, old)
    finally:
        log = server.stop()
    assert f"serving adapter {new['name']} (POST /v1/adapters" in log


def test_delete_lets_the_stream_in_flight_finish_then_404(runner_bin, untied_build, folder):
    """DELETE /v1/adapters/NAME sent after a stream on NAME has sent its first event: the stream still
    ends with every token of the runner's answer and [DONE]; afterwards NAME is 404 and no longer listed,
    the folder watch does not bring it back, the others serve, and POST serves it again."""
    import threading

    target, full = folder
    write_manifest(target, full)
    name, other = full["adapters"][0]["name"], full["adapters"][1]["name"]
    server = Server(runner_bin.parent / "lora-share-server", target)
    deleted = []
    try:

        def delete():
            deleted.append(server.request("DELETE", f"/v1/adapters/{name}"))

        remover = threading.Thread(target=delete)
        events = stream_events(server, {"model": name, "prompt": PROMPT, "max_tokens": NEW}, on_first=remover.start)
        remover.join(timeout=TIMEOUT)
        assert [t for e in events for t in e["choices"][0]["tokens"]] == runner_tokens(runner_bin, untied_build, name)
        assert deleted and deleted[0][0] == 200 and deleted[0][1] == {"id": name, "object": "model", "deleted": True}
        assert name not in server.models() and server.complete(name)[0] == 404
        assert server.request("DELETE", f"/v1/adapters/{name}")[0] == 404
        assert server.request("DELETE", "/v1/adapters/base")[0] == 400
        write_manifest(target, dict(full, adapters=list(full["adapters"])))  # a new stamp: the watch sweeps
        time.sleep(1.5)
        assert name not in server.models()
        status, body = server.complete(other)
        assert status == 200 and body["choices"][0]["tokens"] == runner_tokens(runner_bin, untied_build, other)
        assert server.request("POST", "/v1/adapters", {"path": full["adapters"][0]["file"]})[0] == 201
        status, body = server.complete(name)
        assert status == 200 and body["choices"][0]["tokens"] == runner_tokens(runner_bin, untied_build, name)
    finally:
        log = server.stop()
    assert f"removed adapter {name} (DELETE /v1/adapters/{name})" in log
