"""Speculative decoding in a runtime of one KV slot (parallel 1: build/runner's and lora_share.Runtime's
default; docs/batching.md, "One slot") against the same deployment with speculation off (the one-row path),
issue 60. Two runtimes of the deployment live in one process and every request is asked of both, the order
swapping from one request to the next, so that a busy spell of the machine hits both. Requests: bench-spec's
copy task (lora_share/bench/spec_corpus.py's proofreading, greedy, EOS honoured, up to 160 tokens) on base
and the given adapters, and its free questions (64 tokens, EOS ignored) on each adapter. Each request is
timed from its first token to its last (decode only). Prints, per task, both modes' tokens/s, their ratio,
the drafts verified and kept, and whether every text was the same.

    .venv/bin/python benchmarks/one_slot.py out/smollm2 --adapters brief bullets json shout --rounds 2

Memory is build/runner's (--json's loading.planned_bytes and memory.end), with and without
--no-speculation: docs/batching.md, "One slot".
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

from lora_share.bench.spec_corpus import PROOFREAD, PROOFREAD_INSTRUCTION, QUESTIONS
from lora_share.inference import c_library as native
from lora_share.inference.c_abi import generate_options


def decode(rt, adapter: str, prompt: list[int], new: int, ignore_eos: bool) -> tuple[list[int], float, int, int]:
    """One greedy request: its tokens, the seconds from its first token to its last, drafts verified, kept."""
    stamps, tokens = [], []

    def on_token(token, _user):
        stamps.append(time.perf_counter())
        tokens.append(token)
        return 0

    callback = native.TOKEN_CALLBACK(on_token)
    opts = generate_options(rt.lib, new, 0.0, 0, ignore_eos)
    drafted, accepted = ctypes.c_uint64(0), ctypes.c_uint64(0)
    opts.drafted, opts.accepted = ctypes.pointer(drafted), ctypes.pointer(accepted)
    ids, err = (ctypes.c_int64 * len(prompt))(*prompt), native._Error()
    status = rt.lib.ls_generate_named(
        rt.handle, adapter.encode(), ids, len(prompt), ctypes.byref(opts), callback, None, ctypes.byref(err)
    )
    if status != 0:
        native._raise(rt.lib, err)
    return tokens, stamps[-1] - stamps[0], drafted.value, accepted.value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="a deployment folder (lora-share build's output)")
    p.add_argument("--adapters", nargs="+", default=["brief", "bullets", "json", "shout"])
    p.add_argument("--texts", type=int, default=2, help="proofreading texts a round (default 2)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--library", default=None, help="liblora_share.so (default: the installed one)")
    ns = p.parse_args()
    runtimes = {mode: native.open_dir(ns.dir, library=ns.library, speculation=mode == "on") for mode in ("on", "off")}
    tok = runtimes["on"].tokenizer()

    def chat(text: str) -> list[int]:
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]), add_special=False)

    copies = [chat(f"{PROOFREAD_INSTRUCTION}\n\n{text}") for text in PROOFREAD[: ns.texts]]
    requests = [("copy", a, ids, 160, False) for a in ["base", *ns.adapters[:1]] for ids in copies]
    requests += [("free", a, chat(q), 64, True) for a, q in zip(ns.adapters, QUESTIONS)]
    seconds, tokens, drafts, same = {}, {}, {}, True
    for r in range(ns.rounds):
        for i, (task, adapter, prompt, new, ignore_eos) in enumerate(requests):
            answers = {}
            for mode in ("on", "off") if (r + i) % 2 == 0 else ("off", "on"):
                got, s, d, a = decode(runtimes[mode], adapter, prompt, new, ignore_eos)
                answers[mode] = got
                seconds[task, mode] = seconds.get((task, mode), 0.0) + s
                tokens[task, mode] = tokens.get((task, mode), 0) + len(got) - 1
                if mode == "on":
                    drafts[task] = [x + y for x, y in zip(drafts.get(task, [0, 0]), (d, a))]
            same = same and answers["on"] == answers["off"]
    for task in ("copy", "free"):
        on, off = (tokens[task, m] / seconds[task, m] for m in ("on", "off"))
        drafted, accepted = drafts[task]
        print(
            json.dumps(
                {
                    "task": task,
                    "speculation_tokens_per_s": round(on, 2),
                    "one_row_tokens_per_s": round(off, 2),
                    "ratio": round(on / off, 3),
                    "drafted": drafted,
                    "accepted": accepted,
                    "tokens": tokens[task, "on"],
                }
            )
        )
    print(json.dumps({"texts_equal": same}))
    for rt in runtimes.values():
        rt.close()


if __name__ == "__main__":
    main()
