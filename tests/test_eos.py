"""Generation from token ids stops at the build's EOS ids in every client, as transformers' generate does.

The build is ``eos_build``: text_build rebuilt with a generation_config.json whose eos is a token greedy
decoding reaches before EOS_NEW tokens, so the build records it (manifest.json's tokenizer section, beside
foundation.ptd). The reference is transformers + peft ``generate(..., eos_token_id=<the build's EOS ids>)``
greedy on the very checkpoint and adapter that were built: build/runner (--tokens and --serve lines),
`lora-share run --tokens`, the C library (lora_share/inference/c_library.py) and the server stop exactly where it
stops (the EOS emitted as the last token), and --ignore-eos / ignore_eos continue to max tokens, where
``generate(..., eos_token_id=[])`` ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import EOS_NEW, EOS_PROMPT, REPO, TEXT_ADAPTER, run_cli
from hf_files import hf_generate

from lora_share.inference import c_library as native

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TIMEOUT = 300


@pytest.fixture(scope="module")
def expected(eos_build, text_hf) -> dict:
    """The prompt's ids, transformers' greedy tokens stopping at the build's EOS ids, and without stopping."""
    tokenizer, model = text_hf
    ids = tokenizer(EOS_PROMPT)["input_ids"]
    eos_ids = eos_build.build.manifest["tokenizer"]["eos_token_ids"]
    stops = hf_generate(model, ids, EOS_NEW, eos=eos_ids)
    full = hf_generate(model, ids, EOS_NEW, eos=[])
    # The test means something only if generation really stops early, at the build's EOS.
    assert eos_build.eos in eos_ids and stops[-1] == eos_build.eos and len(stops) < EOS_NEW == len(full)
    assert full[: len(stops)] == stops
    return {"ids": ids, "stops": stops, "full": full, "eos_ids": eos_ids}


def runner(runner_bin, *args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(runner_bin), *map(str, args)], input=stdin, capture_output=True, text=True, timeout=TIMEOUT
    )


def files(eos_build) -> list:
    return ["--pte", eos_build.build.ptes[TEXT_ADAPTER], "--ptd", eos_build.build.ptd, "--max-new-tokens", EOS_NEW]


def csv(ids) -> str:
    return ",".join(map(str, ids))


@pytest.mark.parametrize("ignore", [False, True], ids=["stop", "ignore-eos"])
def test_runner_tokens(runner_bin, eos_build, expected, ignore):
    flags = ["--ignore-eos"] if ignore else []
    want = expected["full" if ignore else "stops"]
    r = runner(runner_bin, *files(eos_build), "--tokens", csv(expected["ids"]), "--json", *flags)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == want
    r = runner(runner_bin, *files(eos_build), "--tokens", csv(expected["ids"]), *flags)
    assert r.returncode == 0, r.stderr
    assert [int(t) for t in r.stdout.split()] == want


@pytest.mark.parametrize("ignore", [False, True], ids=["stop", "ignore-eos"])
def test_runner_serve_lines(runner_bin, eos_build, expected, ignore):
    ids = expected["ids"]
    stdin = f"{TEXT_ADAPTER}\t{csv(ids)}\n" + json.dumps({"adapter": TEXT_ADAPTER, "tokens": ids}) + "\n"
    r = runner(runner_bin, *files(eos_build), "--serve", *(["--ignore-eos"] if ignore else []), stdin=stdin)
    assert r.returncode == 0, r.stderr
    tab, by_json = [json.loads(line) for line in r.stdout.splitlines()]
    want = expected["full" if ignore else "stops"]
    assert tab["tokens"] == by_json["tokens"] == want


@pytest.mark.parametrize("ignore", [False, True], ids=["stop", "ignore-eos"])
def test_lora_share_run_tokens(eos_build, expected, ignore):
    r = run_cli(
        "run", *files(eos_build), "--tokens", csv(expected["ids"]), "--json", *(["--ignore-eos"] if ignore else [])
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == expected["full" if ignore else "stops"]


def test_c_api(runner_bin, eos_build, expected):
    library = REPO / "build" / "liblora_share.so"
    ids = expected["ids"]
    with native.open(eos_build.build.ptd, library=library) as rt:
        adapter = rt.load_adapter(eos_build.build.ptes[TEXT_ADAPTER])
        assert rt.generate(adapter, ids, EOS_NEW) == expected["stops"]
        assert rt.generate(adapter, ids, EOS_NEW, ignore_eos=True) == expected["full"]
    with native.open_dir(eos_build.build.out_dir, library=library) as rt:
        assert rt.generate(TEXT_ADAPTER, ids, EOS_NEW) == expected["stops"]
        assert rt.generate(TEXT_ADAPTER, ids, EOS_NEW, ignore_eos=True) == expected["full"]


def test_a_manifest_of_another_build_is_refused(runner_bin, eos_build, text_build, expected, tmp_path):
    """EOS ids are the manifest's beside the .ptd: one written for another foundation is refused by
    name, by the runner, `lora-share run` and ls_open (a load error); the runner's --ignore-eos reads none."""
    out = tmp_path / "out"
    shutil.copytree(eos_build.build.out_dir, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["foundation_fingerprint"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    args = ["--pte", out / f"{TEXT_ADAPTER}.pte", "--ptd", out / "foundation.ptd", "--tokens", csv(expected["ids"])]
    for r in (runner(runner_bin, *args), run_cli("run", *args)):
        assert r.returncode == 2, r.stderr
        assert (
            f"{out / 'manifest.json'}: its tokenizer section (the EOS ids) is for foundation 000000000000" in r.stderr
            and "foundation.ptd" in r.stderr
        )
    r = runner(runner_bin, *args, "--ignore-eos", "--max-new-tokens", EOS_NEW)
    assert r.returncode == 0 and [int(t) for t in r.stdout.split()] == expected["full"]
    with pytest.raises(native.NativeError) as failure:
        native.open(out / "foundation.ptd", library=REPO / "build" / "liblora_share.so")
    assert failure.value.status == "LS_ERR_LOAD" and "its tokenizer section (the EOS ids)" in failure.value.message


def test_server(runner_bin, eos_build, expected):
    from test_server import Server

    server = Server(REPO / "build" / "lora-share-server", eos_build.build.out_dir)
    try:
        body = {"model": TEXT_ADAPTER, "prompt": expected["ids"], "max_tokens": EOS_NEW}
        status, answer = server.request("POST", "/v1/completions", body)
        assert status == 200, answer
        choice = answer["choices"][0]
        # The EOS that stopped it is not part of the answer's tokens (OpenAI's "stop").
        assert (choice["tokens"], choice["finish_reason"]) == (expected["stops"][:-1], "stop")
        status, answer = server.request("POST", "/v1/completions", {**body, "ignore_eos": True})
        assert status == 200, answer
        choice = answer["choices"][0]
        assert (choice["tokens"], choice["finish_reason"]) == (expected["full"], "length")
        events = server.stream("/v1/completions", {**body, "ignore_eos": True})
        assert [t for e in events for t in e["choices"][0]["tokens"]] == expected["full"]
        status, answer = server.request("POST", "/v1/completions", {**body, "ignore_eos": "yes"})
        assert status == 400 and "ignore_eos must be true or false" in answer["error"]["message"]
    finally:
        server.stop()
