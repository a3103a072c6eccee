"""The cost of verifying drafts (issue 60): one batched step whose rows carry 1 + k tokens (a row's last token
and k drafts) against the plain decode step of one token a row, on a built deployment, through the C
library's ls_diag_time_steps (lora_share_diag.h). Rows of every size alternate, round after round, so the
ratios come from the same minutes; prints each size's median milliseconds a step and its ratio to one
token, per row count.

    .venv/bin/python benchmarks/verify_step.py out/smollm2 --adapter shout --rows 1 4 --tokens 1 2 3 5 9
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from pathlib import Path

from lora_share.inference import c_library as native


def time_steps(rt, adapter, prompt: list[int], rows: int, tokens: int, steps: int) -> list[float]:
    """ls_diag_time_steps: the milliseconds of each of ``steps`` steps of ``rows`` rows of ``tokens`` tokens."""
    lib = rt.lib
    lib.ls_diag_time_steps.restype = ctypes.c_int
    lib.ls_diag_time_steps.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    lib.ls_diag_time_steps.argtypes += [ctypes.c_size_t] * 4 + [ctypes.POINTER(ctypes.c_double)]
    lib.ls_diag_time_steps.argtypes += [ctypes.POINTER(native._Error)]
    ms, err = (ctypes.c_double * steps)(), native._Error()
    ids = (ctypes.c_int64 * len(prompt))(*prompt)
    if lib.ls_diag_time_steps(rt.handle, adapter, ids, len(prompt), rows, tokens, steps, ms, ctypes.byref(err)):
        native._raise(lib, err)
    return list(ms)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="a deployment folder (manifest.json, foundation.ptd, adapters)")
    parser.add_argument("--adapter", help="the adapter every row runs (default: the foundation alone)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4], help="rows (clients) of a step")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 5, 9], help="tokens a row carries")
    parser.add_argument("--prompt", type=int, default=100, help="tokens fed before the steps (the position)")
    parser.add_argument("--steps", type=int, default=10, help="steps timed per size per round")
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args(argv)
    manifest = json.loads((ns.build / "manifest.json").read_text())
    vocab = manifest["foundation"]["args"]["vocab_size"]
    prompt = [(7 * i + 3) % vocab for i in range(ns.prompt)]
    sizes = [(r, t) for r in ns.rows for t in sorted({1, *ns.tokens})]
    times: dict[tuple[int, int], list[float]] = {s: [] for s in sizes}
    with native.open(ns.build / "foundation.ptd", parallel=max(2, max(ns.rows))) as rt:
        for entry in manifest["adapters"]:
            rt.load_adapter(ns.build / entry["file"])
        adapter = rt.adapter(ns.adapter).handle if ns.adapter else None
        for size in sizes:  # a warm-up step each: XNNPACK plans each new shape once
            time_steps(rt, adapter, prompt, *size, steps=1)
        for _ in range(ns.rounds):
            for size in sizes:
                times[size] += time_steps(rt, adapter, prompt, *size, steps=ns.steps)
    print(f"{ns.build} ({ns.adapter or 'base'}), position {ns.prompt}, median ms a step over {ns.rounds} x {ns.steps}")
    print("rows  tokens/row  ms/step  x one token  ms per token")
    for rows, tokens in sizes:
        med, one = statistics.median(times[(rows, tokens)]), statistics.median(times[(rows, 1)])
        print(f"{rows:4d}  {tokens:10d}  {med:7.2f}  {med / one:11.2f}  {med / (rows * tokens):12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
