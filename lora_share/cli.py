"""The ``lora-share`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .errors import UserError

EPILOG = """examples:
  lora-share validate configs/llama_adapters.yaml
  lora-share build configs/llama_adapters.yaml
  lora-share run --pte out/llama_adapters/adapter_a.pte --ptd out/llama_adapters/foundation.ptd --tokens 1,17,42
"""


def _cmd_validate(ns) -> int:
    from .config import load_config

    for path in ns.configs:
        cfg = load_config(path)
        names = ", ".join(a.name for a in cfg.adapters)
        print(f"{path}: OK ({len(cfg.adapters)} adapters: {names}; output {cfg.output_dir})")
    return 0


def _cmd_build(ns) -> int:
    from .builder import build

    manifest = build(ns.config, quiet=ns.json)
    if ns.json:
        print(json.dumps(manifest, indent=2))
    return 0


def _cmd_run(ns) -> int:
    import numpy as np

    from .generate import parse_tokens
    from .runtime import run

    tokens = parse_tokens(ns.tokens)
    gen = run(ns.pte, ns.ptd, tokens, ns.max_new_tokens, ns.temperature, ns.seed)
    if ns.dump_logits:
        _save_npy(Path(ns.dump_logits), gen.logits, np)
    if ns.json:
        print(json.dumps({"tokens": gen.tokens, "prompt": tokens, "timings": gen.timings}))
    else:
        print(",".join(map(str, gen.tokens)))
        t = gen.timings
        print(f"load {t['load_s'] * 1e3:.1f} ms, prefill {t['prefill_s'] * 1e3:.1f} ms, "
              f"decode {t['decode_s'] * 1e3:.1f} ms", file=sys.stderr)
    return 0


def _save_npy(path: Path, array, np) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"--dump-logits {path}: cannot write: {e.strerror}") from None


def _cmd_schema(ns) -> int:
    from .config import config_json_schema

    print(json.dumps(config_json_schema(), indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lora-share",
        description="Share one foundation model's weights across many LoRA adapters on ExecuTorch.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check config files and report every error at once",
                       epilog="example:\n  lora-share validate configs/*.yaml",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("configs", nargs="+", metavar="CONFIG")
    v.set_defaults(func=_cmd_validate)

    b = sub.add_parser("build", help="export foundation.ptd + one .pte per adapter + manifest.json",
                       epilog="example:\n  lora-share build configs/llama_adapters.yaml",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("config", metavar="CONFIG")
    b.add_argument("--json", action="store_true", help="print the manifest as JSON instead of progress")
    b.set_defaults(func=_cmd_build)

    r = sub.add_parser("run", help="generate with an adapter .pte over a foundation .ptd (Python runtime)",
                       epilog="example:\n  lora-share run --pte out/llama_adapters/adapter_a.pte "
                              "--ptd out/llama_adapters/foundation.ptd --tokens 1,17,42 --max-new-tokens 8",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--pte", required=True, help="adapter program")
    r.add_argument("--ptd", required=True, help="foundation data file")
    r.add_argument("--tokens", required=True, help="comma-separated prompt token ids, e.g. 1,17,42")
    r.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate (default 16)")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    r.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    r.add_argument("--dump-logits", metavar="PATH", help=".npy float32 [steps, vocab]: row 0 at the last prompt "
                                                         "position, row i after feeding generated token i")
    r.add_argument("--json", action="store_true", help='print {"tokens": [...], "timings": {...}}')
    r.set_defaults(func=_cmd_run)

    s = sub.add_parser("schema", help="print the config's JSON Schema")
    s.set_defaults(func=_cmd_schema)
    return p


def main(argv=None) -> int:
    ns = parser().parse_args(argv)
    try:
        return ns.func(ns)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted: earlier outputs are untouched", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
