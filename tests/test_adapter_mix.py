"""Adapters mixed per request (ls_adapter_mix, the server's "lora" field, Runtime(..., lora=...)).

The reference is peft: the same checkpoint and PEFT folders loaded by transformers + peft and combined
with ``add_weighted_adapter(adapters, weights, combination_type="cat")``. The deployment is text_build's
output folder plus two PEFT adapters of other ranks and targets, added with ``lora-share add`` (data
only, no export): "terse" r=3 on q/v_proj and "lively" r=1 on v/down_proj, so their mix sums rank 4 on
v_proj, the envelope's max rank, while "chat" (r=4 on q/v/o/down_proj) with "terse" sums 7 on q_proj.
"""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from batch_script import diag_generate
from conftest import TEXT_ADAPTER, run_cli, token_usage
from hf_files import hf_config, hf_generate, write_peft_lora
from test_server import Server, server_bin  # noqa: F401 (a fixture)

from lora_share.inference import c_library
from lora_share.inference.c_library import NativeError

PROMPT = [0, 17, 230, 41, 99, 5, 301, 12, 77, 150, 3, 8, 260, 44, 19, 2, 101, 33]  # > the chunk of 16
NEW = 6
MIXES = [[("terse", 0.5), ("lively", 1.1)], [("lively", -0.7), ("terse", 1.1)]]


@pytest.fixture(scope="module")
def mix_build(text_build, tmp_path_factory):
    """The output folder, and the PEFT folders of its adapters by name."""
    out = tmp_path_factory.mktemp("mix") / "out"
    shutil.copytree(text_build.build.out_dir, out)
    cfg = hf_config(vocab=400)
    peft = {
        "terse": write_peft_lora(out.parent / "terse", cfg, r=3, alpha=6, targets=["q_proj", "v_proj"], seed=11),
        "lively": write_peft_lora(out.parent / "lively", cfg, r=1, alpha=4, targets=["v_proj", "down_proj"], seed=12),
    }
    r = run_cli("add", "--to", out, *[f"{n}={p}" for n, p in peft.items()])
    assert r.returncode == 0, r.stderr
    return out, {TEXT_ADAPTER: text_build.peft, **peft}


@pytest.fixture(scope="module")
def peft_mixes(text_build, mix_build):
    """transformers + peft with "terse" and "lively" loaded and each of MIXES added by
    add_weighted_adapter(..., combination_type="cat"), as adapters "mix0", "mix1"."""
    import torch
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    _, peft = mix_build
    model = LlamaForCausalLM.from_pretrained(
        str(text_build.checkpoint), torch_dtype=torch.float32, attn_implementation="eager"
    )
    model = PeftModel.from_pretrained(model, str(peft["terse"]), adapter_name="terse")
    model.load_adapter(str(peft["lively"]), adapter_name="lively")
    for i, mix in enumerate(MIXES):
        model.add_weighted_adapter([n for n, _ in mix], [s for _, s in mix], f"mix{i}", combination_type="cat")
    return model.eval()


def peft_logits(model, adapter: str, tokens: list[int]) -> np.ndarray:
    import torch

    model.set_adapter(adapter)
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy()


@pytest.fixture(scope="module")
def runtime(mix_build):
    rt = c_library.open_dir(mix_build[0])
    yield rt
    rt.close()


def library_logits(rt, adapter) -> tuple[list[int], np.ndarray]:
    """ls_diag_generate on a handle: NEW greedy tokens after PROMPT (no EOS stop) and their logits rows."""
    tokens, logits = diag_generate(rt, adapter.handle, PROMPT, NEW, 400)
    assert len(logits) == NEW
    return tokens, logits


@pytest.mark.parametrize("which", range(len(MIXES)))
def test_mix_matches_peft_cat(runtime, peft_mixes, which):
    mix = runtime.mix([{"name": n, "scale": s} for n, s in MIXES[which]])
    assert mix.name == "+".join(f"{n}*{s}" for n, s in MIXES[which])
    tokens, got = library_logits(runtime, mix)
    # One forward over prompt + generated tokens gives every row the library produced.
    ref = peft_logits(peft_mixes, f"mix{which}", PROMPT + tokens[:-1])[len(PROMPT) - 1 :]
    assert np.abs(got - ref).max() <= 1e-4
    assert tokens == [int(i) for i in ref.argmax(-1)]
    # Not the terms alone: the mix is what changed the logits.
    for name, _ in MIXES[which]:
        assert np.abs(library_logits(runtime, runtime.adapter(name))[1] - got).max() > 1e-3
    mix.release()


def test_one_term_at_scale_one_is_the_adapter(runtime):
    alone = library_logits(runtime, runtime.adapter("terse"))
    mix = runtime.mix([{"name": "terse", "scale": 1.0}])
    mixed = library_logits(runtime, mix)
    mix.release()
    assert mixed[0] == alone[0]
    assert np.array_equal(mixed[1], alone[1])


def test_mix_beyond_the_envelope_names_slot_sum_and_bound(runtime):
    with pytest.raises(NativeError) as e:
        runtime.mix([{"name": TEXT_ADAPTER, "scale": 1.0}, {"name": "terse", "scale": 0.5}])
    assert e.value.status == "LS_ERR_REQUEST"
    assert "q_proj in layer 0" in e.value.message
    assert "sums rank 7" in e.value.message and "(chat 4 + terse 3)" in e.value.message
    assert "max rank 4" in e.value.message


def test_bad_terms_are_refused(runtime):
    for terms, status, words in [
        ([{"name": "nope", "scale": 1.0}], "LS_ERR_NOT_FOUND", "no adapter named 'nope'"),
        ([{"name": "base", "scale": 1.0}], "LS_ERR_NOT_FOUND", "'base', the foundation alone"),
        ([], "LS_ERR_ARGUMENT", "at least one term"),
        ([{"name": "terse", "scale": float("nan")}], "LS_ERR_REQUEST", "term 0 ('terse'): the scale nan is outside"),
        ([{"name": "terse", "scale": float("inf")}], "LS_ERR_REQUEST", "the scale inf is outside [-100, 100]"),
    ]:
        with pytest.raises(NativeError) as e:
            runtime.mix(terms)
        assert e.value.status == status and words in e.value.message, (terms, e.value)
    with pytest.raises(TypeError, match=r"lora\[0\]"):
        runtime.mix([{"name": "terse"}])


@pytest.mark.parametrize("scale", [1e30, -1e30, 3.4e38, 100.5, -101])
def test_a_scale_outside_the_range_is_refused(runtime, scale):
    """lora_share.h, LS_MAX_LORA_SCALE: |scale| <= 100; the message names the term, its value and the range."""
    with pytest.raises(NativeError) as e:
        runtime.mix([{"name": "terse", "scale": 0.5}, {"name": "lively", "scale": scale}])
    assert e.value.status == "LS_ERR_REQUEST"
    assert f"term 1 ('lively'): the scale {scale:g} is outside [-100, 100]" in e.value.message


def test_the_range_bounds_are_accepted(runtime):
    for scale in (100, -100):
        runtime.mix([{"name": "terse", "scale": scale}]).release()


def test_same_terms_share_a_mix_until_the_last_release(runtime):
    terms = [{"name": "terse", "scale": 0.25}, {"name": "lively", "scale": 2.0}]
    first, second = runtime.mix(terms), runtime.mix(terms)
    assert first.handle == second.handle and first.name == "terse*0.25+lively*2"
    assert runtime.stats()["adapters_known"] == 3  # a mix is not one of the adapters
    first.release()
    assert runtime.adapter(first.name).handle == second.handle  # still held once
    second.release()
    with pytest.raises(NativeError, match="LS_ERR_NOT_FOUND"):
        runtime.adapter("terse*0.25+lively*2")
    with pytest.raises(NativeError, match="LS_ERR_ARGUMENT: adapter 'terse' is no mix"):
        runtime.adapter("terse").release()


def test_a_mix_is_counted_while_composed_and_freed_at_its_last_release(runtime, mix_build):
    """The budget counts a composed mix as an adapter of its terms' LoRA bytes (1.05 x + 512 KiB)."""
    from safetensors.numpy import load_file

    _, peft = mix_build
    lora_bytes = sum(
        t.nbytes for n in ("terse", "lively") for t in load_file(str(peft[n] / "adapter_model.safetensors")).values()
    )
    before = runtime.stats()["resident_adapter_bytes"]
    mix = runtime.mix([{"name": "terse", "scale": 0.3}, {"name": "lively", "scale": 0.9}])
    assert runtime.stats()["resident_adapter_bytes"] == before  # composed on first use
    runtime.generate(mix, PROMPT[:4], max_new_tokens=1)
    assert runtime.stats()["resident_adapter_bytes"] - before == lora_bytes + lora_bytes // 20 + (512 << 10)
    mix.release()
    assert runtime.stats()["resident_adapter_bytes"] == before


def test_a_mix_is_no_adapter_to_remove_and_outlives_a_removed_term(mix_build):
    with c_library.open_dir(mix_build[0]) as rt:
        mix = rt.mix([{"name": "terse", "scale": 0.5}, {"name": "lively", "scale": 1.0}])
        before = rt.generate(mix, PROMPT[:8], max_new_tokens=4, ignore_eos=True)
        with pytest.raises(NativeError, match=r"LS_ERR_ARGUMENT: 'terse\*0.5\+lively\*1' is a mix"):
            rt.remove_adapter(mix.name)
        rt.remove_adapter("lively")
        assert rt.generate(mix, PROMPT[:8], max_new_tokens=4, ignore_eos=True) == before  # its own copy
        mix.release()
        with pytest.raises(NativeError, match="LS_ERR_NOT_FOUND"):
            rt.mix([{"name": "lively", "scale": 1.0}])


@pytest.fixture(scope="module")
def server(server_bin, mix_build):  # noqa: F811
    s = Server(server_bin, mix_build[0])
    yield s
    s.stop()
    assert s.proc.returncode == 0


def test_server_lora_field_matches_peft(server, peft_mixes):
    lora = [{"name": n, "scale": s} for n, s in MIXES[1]]
    status, body = server.request(
        "POST",
        "/v1/completions",
        {"model": "base", "prompt": PROMPT, "max_tokens": NEW, "ignore_eos": True, "lora": lora},
    )
    assert status == 200, body
    peft_mixes.set_adapter("mix1")
    assert body["choices"][0]["tokens"] == hf_generate(peft_mixes, PROMPT, NEW, eos=[])


def test_server_and_runtime_answer_a_mixed_chat_alike(server, mix_build):
    from lora_share import Runtime

    lora = [{"name": n, "scale": s} for n, s in MIXES[0]]
    messages = [{"role": "user", "content": "Mix two adapters, please."}]
    status, body = server.request(
        "POST", "/v1/chat/completions", {"model": "base", "messages": messages, "max_tokens": 8, "lora": lora}
    )
    assert status == 200, body
    with Runtime(mix_build[0]) as rt:
        ours = rt.create_chat_completion(messages, max_tokens=8, lora=lora)
        streamed = "".join(
            c["choices"][0]["delta"].get("content", "")
            for c in rt.create_chat_completion(messages, max_tokens=8, lora=lora, stream=True)
        )
        with pytest.raises(NativeError, match="with lora, model must be 'base'"):
            rt.generate("x", adapter="terse", lora=lora)
    text = body["choices"][0]["message"]["content"]
    assert ours["choices"][0]["message"]["content"] == text == streamed
    assert token_usage(ours["usage"]) == token_usage(body["usage"])


@pytest.mark.parametrize(
    "lora, words",
    [
        ({"name": "terse", "scale": 1}, "lora must be a non-empty array"),
        ([], "lora must be a non-empty array"),
        ([{"id": 0, "scale": 0.5}], "lora[0] has the key 'id'"),
        ([{"name": "terse"}], "lora[0].scale must be a finite number, got nothing"),
        ([{"name": "terse", "scale": "big"}], "lora[0].scale must be a finite number"),
        ([{"name": "terse", "scale": 1}, {"name": "nope", "scale": 1}], "lora[1].name: no adapter called 'nope'"),
        ([{"name": TEXT_ADAPTER, "scale": 1}, {"name": "terse", "scale": 1}], "sums rank 7 on q_proj in layer 0"),
        (
            [{"name": "terse", "scale": 1e30}],
            "lora[0].scale must be within [-100, 100] (1 is the adapter as trained), got 1e+30",
        ),
        (
            [{"name": "terse", "scale": 0.5}, {"name": "lively", "scale": -1e30}],
            "lora[1].scale must be within [-100, 100]",
        ),
        (
            [{"name": "terse", "scale": 3.4e38}],
            "lora[0].scale must be within [-100, 100] (1 is the adapter as trained), got 3.4e+38",
        ),
        (
            [{"name": "terse", "scale": 100.5}],
            "lora[0].scale must be within [-100, 100] (1 is the adapter as trained), got 100.5",
        ),
    ],
)
def test_server_refuses_a_bad_lora_field(server, lora, words):
    status, body = server.request(
        "POST",
        "/v1/chat/completions",
        {"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "lora": lora},
    )
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error" and words in body["error"]["message"], body


@pytest.mark.parametrize("number", ["1e999", "-1e999"])
def test_server_refuses_a_non_finite_scale(server, number):
    """JSON has no infinity or NaN, and a number beyond float64 is refused by the parser as the body's
    mistake: no non-finite scale reaches a mix through the server (the library refuses one by name)."""
    body = {"model": "base", "prompt": "hi", "max_tokens": 2, "lora": [{"name": "terse", "scale": "SCALE"}]}
    status, answer = server.request("POST", "/v1/completions", raw=json.dumps(body).replace('"SCALE"', number).encode())
    assert status == 400 and "not valid JSON" in answer["error"]["message"], answer
    assert server.request("GET", "/health")[0] == 200


def test_server_lora_needs_model_base(server):
    status, body = server.request(
        "POST",
        "/v1/completions",
        {"model": "terse", "prompt": "hi", "max_tokens": 2, "lora": [{"name": "lively", "scale": 1}]},
    )
    assert status == 400 and "with lora, model must be 'base'" in body["error"]["message"], body


# --- No request reaches another over the server (issue 58) ----------------------------------------------------

# Unrelated greedy requests: the foundation, each adapter, and both mixes, on prompts of several lengths.
CLEAN = [
    {"model": "base", "prompt": PROMPT},
    {"model": TEXT_ADAPTER, "prompt": PROMPT[:7]},
    {"model": "terse", "prompt": PROMPT[3:]},
    {"model": "lively", "prompt": [5, 6]},
    *(
        {"model": "base", "prompt": PROMPT[i:], "lora": [{"name": n, "scale": s} for n, s in mix]}
        for i, mix in enumerate(MIXES)
    ),
]
# Hostile requests the server runs: a mix's scale at the bound, an adapter whose products overflow.
HOSTILE = [
    {"model": "hostile", "prompt": PROMPT},
    {
        "model": "base",
        "prompt": PROMPT[:9],
        "lora": [{"name": "terse", "scale": 100}, {"name": "lively", "scale": -100}],
    },
    {"model": "base", "prompt": [4, 4, 4], "lora": [{"name": "hostile", "scale": 100}]},
]
PARALLEL = 4  # as the demo deployment is served


@pytest.fixture(scope="module")
def hostile_build(mix_build, tmp_path_factory):
    """mix_build's folder with one adapter more, "hostile": terse's PEFT folder with every A and B times 1e30.
    Its weights are finite and its scale is 1; its products overflow to inf and NaN: no bound on a mix's
    scales stops it, so what it computes must stay its own (its KV slot cleared)."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("hostile") / "out"
    shutil.copytree(mix_build[0], out)
    bad = shutil.copytree(mix_build[1]["terse"], out.parent / "hostile")
    weights = bad / "adapter_model.safetensors"
    save_file({key: t * 1e30 for key, t in load_file(weights).items()}, weights)
    r = run_cli("add", "--to", out, f"hostile={bad}")
    assert r.returncode == 0, r.stderr
    return out


def complete(server, body) -> tuple[int, dict]:
    return server.request("POST", "/v1/completions", {**body, "max_tokens": NEW, "ignore_eos": True, "temperature": 0})


def all_at_once(server, bodies) -> list[tuple[int, dict]]:
    barrier = threading.Barrier(len(bodies))
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: (barrier.wait(), complete(server, b))[1], bodies))


def tokens_of(answers) -> list[list[int]]:
    assert all(status == 200 for status, _ in answers), answers
    return [body["choices"][0]["tokens"] for _, body in answers]


def test_hostile_lora_requests_change_no_later_answer(server_bin, hostile_build):  # noqa: F811
    """The reference: each CLEAN request alone on a fresh server. Then, on another fresh server of 4 slots:
    scales of ±1e30 and 3.4e38 refused by name, the HOSTILE requests run (their answers, nonsense or a
    4xx, are theirs) alongside a CLEAN one, then every CLEAN request at once: the reference's tokens each time."""
    reference = Server(server_bin, hostile_build, "--parallel", PARALLEL)
    try:
        alone = [tokens_of([complete(reference, body)])[0] for body in CLEAN]
    finally:
        reference.stop()
    server = Server(server_bin, hostile_build, "--parallel", PARALLEL)
    try:
        for scale in (1e30, -1e30, 3.4e38):
            status, body = complete(
                server, {"model": "base", "prompt": PROMPT, "lora": [{"name": "terse", "scale": scale}]}
            )
            assert status == 400 and body["error"]["message"].startswith("lora[0].scale must be within"), body
        answers = all_at_once(server, HOSTILE + CLEAN[:1])
        # The hostile ones answer nonsense, or a 400 when their logits leave nothing to pick; a 4xx is theirs.
        assert all(status in (200, 400) for status, _ in answers[: len(HOSTILE)]), answers
        during = tokens_of(answers[len(HOSTILE) :])
        assert tokens_of(all_at_once(server, CLEAN)) == alone
        assert during == alone[:1]
        status, stats = server.request("GET", "/v1/stats")
        assert stats["slots_cleared"] >= 2, stats  # the hostile adapter's slots held inf or NaN
    finally:
        server.stop()
