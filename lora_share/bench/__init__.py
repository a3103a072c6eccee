"""``lora-share bench``: lora-share, stand-alone programs and ExecuTorch's stock loading, side by side.

One run on this machine builds the config's foundation with N = 1, 2, 4, 8
adapters (one recipe, a different seed each) and measures, for every N:

- disk: foundation.ptd + N adapter .pte against N stand-alone .pte files with
  every weight inside (``export_program(external=False)``: one export, with
  every adapter's data written into it);
- memory (PSS and RSS from /proc): one runner process serving N adapters,
  N concurrent runner processes with one stand-alone program each, and one
  process loading N adapters the stock way (one ``Module`` each, no weight cache);
- load time of the first and each further adapter, with and without the
  packed-weight cache; prefill and decode speed of the bare foundation and of
  each adapter; the cost of switching adapters between requests in ``--serve``;
- build time of N adapters from scratch.

Results go to ``benchmarks/results/`` as ``bench.json``, ``bench.md`` and two
PNG plots. Modules: ``variants`` makes the files, ``processes`` drives the C++
runner, ``report`` writes the results, ``run`` puts it together.
"""

import argparse

from .common import typed_command
from .run import add_arguments, main, run_bench, run_from_args  # noqa: F401


def register(subparsers) -> None:
    """``lora-share bench``: its flags and what it runs."""
    p = subparsers.add_parser(
        "bench",
        help="measure disk, memory, load time, speed and build time against stand-alone "
        "and stock ExecuTorch, for 1, 2, 4, 8 adapters",
        epilog="examples:\n  lora-share bench configs/llama_adapters.yaml       "
        "# about 4 min on 2 idle cores (38 on busy ones); writes "
        "benchmarks/results/bench.{json,md} + PNG plots\n"
        "  lora-share bench configs/tiny.yaml --counts 1,2 --out /tmp/bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p, config_option=False)
    p.set_defaults(func=lambda ns: run_from_args(ns, typed_command("bench")))
