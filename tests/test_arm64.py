"""The aarch64 build (`make arm64`: build-arm64/) run under qemu-aarch64 on deployments built here by the
x86 `lora-share`, against the x86 build (build/runner, build/lora-share-server) on the same files.

XNNPACK runs its NEON kernels under emulation, so the float sums are not in the x86 order: logits must
agree within LOGITS_TOL and the greedy tokens exactly, for every adapter of a tiny fp32 and two tiny
8da4w deployments (symmetric, and asymmetric with an int8 output projection). Then text in and out
through the tokenizer, --serve with two adapters, the C example cross-built against build-arm64/install,
and one chat completion from the aarch64 server.
Selected by `make test-arm64` (-m arm64); `make test` leaves them out.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from conftest import REPO, TEXT_ADAPTER, TINY_ADAPTERS, TINY_FOUNDATION, TINY_UNTIED, build_config, write_config
from devices import ARM64_DIR, build_c_app, chat_once, command, elf_machine, run

pytestmark = pytest.mark.arm64

LOGITS_TOL = 1e-4
PROMPT = [1, 17, 42, 7, 99]
NEW = 8
TEXT = "The quick brown fox jumps over the lazy dog."
# The untied tiny foundation (TINY_UNTIED: greedy tokens that tell adapters apart) in fp32 and
# quantized: 8da4w linears (4-bit weights in groups of 32, 8-bit dynamic activations) and an int8
# embedding run XNNPACK's quantized kernels, another code path on NEON than on AVX; the asymmetric grid
# with an int8 output projection is the real model's form (a Q4_1 GGUF, make bench-quality).
QUANTIZED = {
    "8da4w": {"scheme": "8da4w", "group_size": 32, "embedding": "int8"},
    "8da4w-asymmetric": {
        "scheme": "8da4w",
        "group_size": 32,
        "embedding": "int8",
        "grid": "asymmetric",
        "lm_head": "int8",
    },
}


@pytest.fixture(scope="session")
def arm64_bin():
    """build-arm64/, built by `make arm64` if its runner is not built yet."""
    if not (ARM64_DIR / "runner").exists():
        subprocess.run(["make", "-C", str(REPO), "arm64"], check=True, capture_output=True)
    return ARM64_DIR


@pytest.fixture(scope="module", params=["fp32", *QUANTIZED])
def deployment(request, untied_build, tmp_path_factory):
    """TINY_ADAPTERS over the untied tiny foundation, fp32 or quantized, built by the x86 lora-share."""
    if request.param == "fp32":
        return untied_build
    foundation = {"synthetic": TINY_UNTIED, "max_seq_len": 32, "quantize": QUANTIZED[request.param]}
    return build_config(write_config(tmp_path_factory.mktemp(request.param), foundation, TINY_ADAPTERS))


def test_every_program_is_aarch64(arm64_bin):
    for name in ("runner", "lora-share-server", "tokenize", "liblora_share.so"):
        assert elf_machine(arm64_bin / name) == "AArch64", name


def generate(binary, build, adapter, folder, arch):
    """(tokens, logits rows) of one greedy run of `adapter` on PROMPT."""
    npy = folder / f"{adapter}-{arch}.npy"
    proc = run(
        binary,
        "--ptd",
        build.ptd,
        "--pte",
        build.ptes[adapter],
        "--tokens",
        ",".join(map(str, PROMPT)),
        "--max-new-tokens",
        NEW,
        "--json",
        "--dump-logits",
        npy,
        arch=arch,
    )
    return json.loads(proc.stdout)["tokens"], np.load(npy)


def test_logits_and_tokens_equal_the_x86_runners(arm64_bin, runner_bin, deployment, tmp_path):
    rows, greedy = {}, set()
    for adapter in deployment.ptes:
        x86_tokens, x86_logits = generate(runner_bin, deployment, adapter, tmp_path, "x86_64")
        arm_tokens, arm_logits = generate(arm64_bin / "runner", deployment, adapter, tmp_path, "aarch64")
        assert arm_tokens == x86_tokens, adapter
        assert arm_logits.shape == x86_logits.shape == (NEW, TINY_FOUNDATION["vocab_size"])
        diff = float(np.abs(arm_logits - x86_logits).max())
        assert diff <= LOGITS_TOL, (adapter, diff)
        rows[adapter] = x86_logits
        greedy.add(tuple(x86_tokens))
    assert len(greedy) == len(deployment.ptes) and all(len(set(t)) > 1 for t in greedy)  # tokens that tell
    # The adapters change the logits far beyond the tolerance, so a runtime that dropped one would fail.
    first, *others = rows.values()
    assert all(np.abs(first - other).max() > 100 * LOGITS_TOL for other in others)


def test_text_in_text_out(arm64_bin, runner_bin, text_build):
    out = text_build.build.out_dir
    args = ("--pte", text_build.pte, "--ptd", out / "foundation.ptd", "--prompt", TEXT, "--max-new-tokens", 16)
    x86 = json.loads(run(runner_bin, *args, "--json").stdout)
    arm = json.loads(run(arm64_bin / "runner", *args, "--json", arch="aarch64").stdout)
    assert x86["text"]
    assert (arm["prompt_tokens"], arm["tokens"], arm["text"]) == (x86["prompt_tokens"], x86["tokens"], x86["text"])
    # Streamed as text, without --json: the same characters.
    assert run(arm64_bin / "runner", *args, arch="aarch64").stdout == x86["text"] + "\n"
    # The tokenizer tool: encode and decode as the x86 one does.
    lines = json.dumps({"encode": TEXT}) + "\n" + json.dumps({"decode": x86["tokens"]}) + "\n"
    tokenizer = out / "tokenizer.json"
    assert (
        run(arm64_bin / "tokenize", "--tokenizer", tokenizer, arch="aarch64", stdin=lines).stdout
        == run(REPO / "build/tokenize", "--tokenizer", tokenizer, stdin=lines).stdout
    )


def test_serve_with_two_adapters(arm64_bin, runner_bin, untied_build):
    a, b = list(untied_build.ptes)[:2]
    lines = "".join(f"{name}\t{ids}\n" for name, ids in [(a, "1,17,42"), (b, "1,17,42"), (a, "5,6"), (b, "9")])
    args = (
        "--ptd",
        untied_build.ptd,
        "--pte",
        untied_build.ptes[a],
        "--pte",
        untied_build.ptes[b],
        "--serve",
        "--max-new-tokens",
        NEW,
    )
    answers = {
        arch: [json.loads(line) for line in run(binary, *args, arch=arch, stdin=lines).stdout.splitlines()]
        for arch, binary in (("x86_64", runner_bin), ("aarch64", arm64_bin / "runner"))
    }
    assert len(answers["aarch64"]) == len(answers["x86_64"]) == 4
    for arm, x86 in zip(answers["aarch64"], answers["x86_64"]):
        assert (arm["adapter"], arm["tokens"]) == (x86["adapter"], x86["tokens"])
    assert answers["x86_64"][0]["tokens"] != answers["x86_64"][1]["tokens"]  # two adapters, two answers


def test_c_example(arm64_bin, runner_bin, untied_build, tmp_path):
    c_app = build_c_app(arm64_bin / "install", tmp_path / "c_app", arch="aarch64")
    assert elf_machine(c_app) == "AArch64"
    for name, pte in untied_build.ptes.items():
        arm = run(c_app, untied_build.ptd, pte, "1,17,42", NEW, arch="aarch64").stdout.split()
        x86 = json.loads(
            run(
                runner_bin,
                "--ptd",
                untied_build.ptd,
                "--pte",
                pte,
                "--tokens",
                "1,17,42",
                "--max-new-tokens",
                NEW,
                "--json",
            ).stdout
        )["tokens"]
        assert [int(t) for t in arm] == x86, name


def test_server_chat_completion(arm64_bin, text_build):
    folder = text_build.build.out_dir
    # Every draft verified: how many pay for a step is timed, and under qemu a step costs another shape.
    arm = chat_once(command(arm64_bin / "lora-share-server", "--every-draft", arch="aarch64"), folder, TEXT_ADAPTER)
    x86 = chat_once(command(REPO / "build/lora-share-server", "--every-draft"), folder, TEXT_ADAPTER)
    assert arm["choices"] == x86["choices"] and x86["choices"][0]["tokens"]
    assert arm["usage"] == x86["usage"]
