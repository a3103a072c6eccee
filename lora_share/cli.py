"""The ``lora-share`` command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from .config import BASE_NAME
from .errors import UserError

EPILOG = """examples:
  lora-share validate configs/llama_adapters.yaml
  lora-share build configs/llama_adapters.yaml
  lora-share add --to out/llama_adapters path/to/peft_adapter_dir
  lora-share run --pte out/llama_adapters/counter.pte --ptd out/llama_adapters/foundation.ptd --prompt '1 2 3'
  lora-share inspect out/llama_adapters/counter.pte --ptd out/llama_adapters/foundation.ptd
  lora-share verify --pte out/llama_adapters/counter.pte --ptd out/llama_adapters/foundation.ptd
  lora-share eval out/smollm2 notes.txt
  lora-share bench configs/llama_adapters.yaml
  lora-share bench-scale
  lora-share bench-envelope
  lora-share bench-quality
  lora-share bench-peers
  lora-share bench-serve
  lora-share bench-structured
  lora-share bench-spec
"""
SHARED_HELP = (
    "the build's adapters_shared.ptd (built with dedup.shared_adapter_tensors: hoist), for an "
    "adapter that reads tensors it shares with other adapters from there"
)


def _cmd_validate(ns) -> int:
    from .config import load_config

    for path in ns.configs:
        cfg = load_config(path)
        what = "programs" if cfg.programs is not None else "adapters"
        names = ", ".join(a.name for a in getattr(cfg, what))
        print(f"{path}: OK ({len(getattr(cfg, what))} {what}: {names}; output {cfg.output_dir})")
    return 0


def _register_validate(subparsers) -> None:
    """``lora-share validate``'s flags."""
    v = subparsers.add_parser(
        "validate",
        help="check config files and report every error at once",
        epilog="example:\n  lora-share validate configs/*.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("configs", nargs="+", metavar="CONFIG")
    v.set_defaults(func=_cmd_validate)


def _cmd_build(ns) -> int:
    from . import build

    manifest = build(ns.config, quiet=ns.json)
    if ns.json:
        print(json.dumps(manifest, indent=2))
    return 0


def _register_build(subparsers) -> None:
    """``lora-share build``'s flags."""
    b = subparsers.add_parser(
        "build",
        help="export foundation.ptd + one .pte per adapter + manifest.json",
        epilog="example:\n  lora-share build configs/llama_adapters.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("config", metavar="CONFIG")
    b.add_argument("--json", action="store_true", help="print the manifest as JSON instead of progress")
    b.set_defaults(func=_cmd_build)


def _cmd_add(ns) -> int:
    from .deploy.builder import add
    from .manifest import PROGRAMS, deployment_kind

    if deployment_kind(ns.to) == PROGRAMS:
        return _add_programs(ns)
    if ns.model is not None:
        raise UserError("--model names a model of a PT2 archive: only for `add` to a build of programs")
    specs = []
    for spec in ns.adapters:
        name, sep, folder = spec.partition("=")
        if not sep:
            folder, name = spec, Path(spec.rstrip("/")).name
        specs.append((name, Path(folder)))
    manifest = add(ns.to, specs, quiet=ns.json)
    if ns.json:
        print(json.dumps(manifest, indent=2))
    return 0


def _register_add(subparsers) -> None:
    """``lora-share add``'s flags."""
    a = subparsers.add_parser(
        "add",
        help="add PEFT adapters to an existing build, as data for its program: no export, "
        "foundation.ptd and the shipped adapters untouched",
        epilog="examples:\n  lora-share add --to out/llama_adapters path/to/peft_adapter_dir\n"
        "  lora-share add --to out/llama_adapters support_bot=path/to/peft_dir",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument("--to", required=True, metavar="OUT_DIR", help="output folder of an earlier build")
    a.add_argument(
        "adapters",
        nargs="+",
        metavar="[NAME=]PEFT_DIR",
        help="PEFT folder (adapter_config.json + adapter_model.safetensors); NAME defaults to its name. "
        "To a build of programs: [NAME=]ARCHIVE.pt2",
    )
    a.add_argument("--model", help="to a build of programs: the model of a PT2 archive holding several")
    a.add_argument("--json", action="store_true", help="print the updated manifest as JSON instead of progress")
    a.set_defaults(func=_cmd_add)


def _add_programs(ns) -> int:
    from .config import name_problem
    from .manifest import ADAPTERS, PROGRAMS, kind_words
    from .programs.build import add_program

    specs = []
    for spec in ns.adapters:
        name, sep, archive = spec.partition("=")
        if not sep:
            archive, name = spec, Path(spec).stem
        if bad_name := name_problem(name):
            raise UserError(f"{archive}: program name {bad_name}; give another as NAME=ARCHIVE")
        if Path(archive).is_dir():
            raise UserError(
                f"{archive}: a folder (a PEFT adapter?), which `add` puts into {kind_words(ADAPTERS)}; "
                f"{ns.to} is {kind_words(PROGRAMS)}"
            )
        specs.append((name, Path(archive)))
    for name, archive in specs:
        manifest = add_program(ns.to, name, archive, ns.model, quiet=ns.json)
    if ns.json:
        print(json.dumps(manifest, indent=2))
    return 0


def _run_program(ns) -> int:
    from .programs.forward import run_files

    outputs = run_files(ns.pte, ns.ptd, [Path(p) for p in ns.input], ns.output and Path(ns.output))
    for i, o in enumerate(outputs):
        print(f"output {i}: {o.dtype}[{', '.join(map(str, o.shape))}]" + (f" -> {ns.output}" if ns.output else ""))
    return 0


def _cmd_run(ns) -> int:
    import numpy as np

    if ns.input:
        return _run_program(ns)

    from .inference.python_runtime import run

    if ns.tokens is not None:
        from .inference.generate import parse_tokens
        from .tokenizer.files import eos_ids_beside

        if ns.tokenizer is not None:
            raise UserError("--tokenizer is read only with --prompt or --chat, not with --tokens")
        tokens, stream = parse_tokens(ns.tokens), None
        stop_ids = () if ns.ignore_eos else eos_ids_beside(ns.ptd)
    else:
        from .tokenizer.files import bind_tokenizer
        from .tokenizer.text import TextStream, chat_prompt, encode_prompt

        bound = bind_tokenizer(ns.ptd, ns.tokenizer)
        tokens = chat_prompt(bound, ns.chat) if ns.chat is not None else encode_prompt(bound, ns.prompt)
        stop_ids = () if ns.ignore_eos else bound.eos_token_ids
        stream = TextStream(bound.tokenizer, None if ns.json else _write_stdout, bound.eos_token_ids)
    gen = run(
        ns.pte,
        ns.ptd,
        tokens,
        ns.max_new_tokens,
        ns.temperature,
        ns.seed,
        verify=not ns.no_verify,
        shared_ptd=ns.shared_ptd,
        stop_ids=stop_ids,
        on_token=stream and stream.push,
    )
    text = stream.finish() if stream else None
    if ns.dump_logits:
        _save_npy(Path(ns.dump_logits), gen.logits, np)
    if ns.json:
        print(
            json.dumps(
                {"tokens": gen.tokens, "prompt": tokens, **({"text": text} if stream else {}), "timings": gen.timings}
            )
        )
    else:
        if stream:
            _write_stdout("\n")
        else:
            print(",".join(map(str, gen.tokens)))
        t = gen.timings
        print(
            f"load {t['load_s'] * 1e3:.1f} ms, prefill {t['prefill_s'] * 1e3:.1f} ms, "
            f"decode {t['decode_s'] * 1e3:.1f} ms",
            file=sys.stderr,
        )
    return 0


def _register_run(subparsers) -> None:
    """``lora-share run``'s flags."""
    r = subparsers.add_parser(
        "run",
        help="generate with an adapter .pte over a foundation .ptd (Python runtime)",
        epilog="examples:\n  lora-share run --pte out/llama_adapters/counter.pte "
        "--ptd out/llama_adapters/foundation.ptd --tokens 1,17,42 --max-new-tokens 8\n"
        "  lora-share run --pte out/my_model/bot.pte --ptd out/my_model/foundation.ptd "
        "--prompt 'The capital of France is'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--pte", required=True, help="adapter program")
    r.add_argument("--ptd", required=True, help="foundation data file")
    r.add_argument("--shared-ptd", metavar="PATH", help=SHARED_HELP)
    prompt = r.add_mutually_exclusive_group(required=True)
    prompt.add_argument(
        "--tokens",
        help="comma-separated prompt token ids, e.g. 1,17,42; prints the generated ids, "
        "stopping after the build's end-of-sequence id (manifest.json beside --ptd)",
    )
    prompt.add_argument(
        "--prompt",
        metavar="TEXT",
        help="prompt text, encoded with the build's tokenizer (BOS "
        "added where the model's tokenizer adds it); streams the "
        "generated text, stopping at an end-of-sequence token",
    )
    prompt.add_argument(
        "--input",
        metavar="NPY",
        action="append",
        help="a program of PT2 archives: one .npy per forward input, in order (repeat the flag)",
    )
    prompt.add_argument(
        "--chat",
        metavar="TEXT",
        help="like --prompt, with TEXT as one user message in the checkpoint's chat template (needs transformers)",
    )
    r.add_argument("--output", metavar="PATH", help="with --input: forward's output as .npy (several: .npz)")
    r.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="for --prompt/--chat: the build folder with manifest.json and "
        "the tokenizer files (default: the --ptd's folder)",
    )
    r.add_argument("--max-new-tokens", type=int, default=16, help="most tokens to generate (default 16)")
    r.add_argument(
        "--ignore-eos", action="store_true", help="generate --max-new-tokens tokens even past an end-of-sequence id"
    )
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    r.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    r.add_argument(
        "--dump-logits",
        metavar="PATH",
        help=".npy float32 [steps, vocab]: row 0 at the last prompt position, row i after feeding generated token i",
    )
    r.add_argument(
        "--json",
        action="store_true",
        help='print {"tokens": [...], "prompt": [...], "timings": {...}}, plus "text" with --prompt/--chat',
    )
    r.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the check that the .pte was built for this .ptd (foundation fingerprint, keys)",
    )
    r.set_defaults(func=_cmd_run)


def _write_stdout(text: str) -> None:
    """Text as it is generated: UTF-8 whatever the locale, flushed so a reader sees it at once."""
    sys.stdout.buffer.write(text.encode())
    sys.stdout.buffer.flush()


def _save_npy(path: Path, array, np) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"--dump-logits {path}: cannot write: {e.strerror}") from None


def _cmd_inspect(ns) -> int:
    from .inference.inspection import inspect_file, render

    report = inspect_file(ns.file, ns.ptd, ns.shared_ptd)
    print(json.dumps(report, indent=2) if ns.json else render(report))
    return 0


def _register_inspect(subparsers) -> None:
    """``lora-share inspect``'s flags."""
    i = subparsers.add_parser(
        "inspect",
        help="show what a .ptd or .pte holds: keys, sizes, segments, fingerprints",
        epilog="examples:\n  lora-share inspect out/llama_adapters/foundation.ptd\n"
        "  lora-share inspect out/llama_adapters/counter.pte "
        "--ptd out/llama_adapters/foundation.ptd\n"
        "  lora-share inspect out/llama_adapters/counter.pte --json | jq .needs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument("file", metavar="FILE", help=".ptd or .pte (told apart by their magic bytes)")
    i.add_argument("--ptd", help="for a .pte: also check whether this .ptd has every key it needs")
    i.add_argument("--shared-ptd", metavar="PATH", help="for a .pte with --ptd: " + SHARED_HELP)
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    i.set_defaults(func=_cmd_inspect)


def _cmd_verify(ns) -> int:
    from .inference.verify import check_pair

    pairing = check_pair(ns.pte, ns.ptd, ns.shared_ptd)
    if ns.json:
        print(
            json.dumps(
                {
                    "compatible": pairing.ok,
                    "problems": pairing.problems,
                    "missing": pairing.missing,
                    "adapter_fingerprint": pairing.adapter and pairing.adapter.foundation_fingerprint,
                    "foundation_fingerprint": pairing.foundation and pairing.foundation.fingerprint,
                }
            )
        )
    elif pairing.ok:
        files = f"{ns.ptd} + {ns.shared_ptd}" if ns.shared_ptd else ns.ptd
        print(f"{ns.pte}: compatible with {files} (foundation {pairing.foundation.fingerprint})")
    for problem in [] if ns.json else pairing.problems:
        print(f"incompatible: {problem}", file=sys.stderr)
    return 0 if pairing.ok else 1


def _register_verify(subparsers) -> None:
    """``lora-share verify``'s flags."""
    vf = subparsers.add_parser(
        "verify",
        help="check that an adapter .pte fits a foundation .ptd (exit 0 yes, 1 no, 2 bad file)",
        epilog="example:\n  lora-share verify --pte out/llama_adapters/counter.pte "
        "--ptd out/llama_adapters/foundation.ptd",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    vf.add_argument("--pte", required=True, help="adapter program")
    vf.add_argument("--ptd", required=True, help="foundation data file")
    vf.add_argument("--shared-ptd", metavar="PATH", help=SHARED_HELP)
    vf.add_argument("--json", action="store_true", help='print {"compatible": ..., "problems": [...], ...}')
    vf.set_defaults(func=_cmd_verify)


def _cmd_eval(ns) -> int:
    from .evaluate import evaluate, render

    report = evaluate(ns.target, ns.text, ns.adapter, ns.max_tokens, ns.min_tokens, progress=not ns.quiet)
    print(json.dumps(report.to_json(), indent=2) if ns.json else render(report))
    return 0


def _register_eval(subparsers) -> None:
    """``lora-share eval``'s flags."""
    ev = subparsers.add_parser(
        "eval",
        help="perplexity and top-1 agreement with transformers float32 on a text, "
        "for the foundation alone and each adapter (Python runtime)",
        epilog="examples:\n  lora-share eval out/smollm2 notes.txt\n"
        "  lora-share eval configs/smollm2.yaml notes.txt --adapter base "
        "--max-tokens 2048 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument(
        "target",
        metavar="BUILD",
        help="output folder of `lora-share build`, or its config (built first, or kept as it is if nothing changed)",
    )
    ev.add_argument("text", metavar="TEXT_FILE", help="UTF-8 text, scored in windows of the build's max_seq_len tokens")
    ev.add_argument(
        "--adapter",
        action="append",
        metavar="NAME",
        help=f"an adapter of the build, or '{BASE_NAME}' for the foundation alone; repeatable "
        f"(default: {BASE_NAME} and every adapter)",
    )
    ev.add_argument("--max-tokens", type=int, metavar="N", help="score only the text's first N tokens")
    ev.add_argument(
        "--min-tokens", type=int, default=2, metavar="N", help="refuse a text of fewer tokens than N (default 2)"
    )
    ev.add_argument("--json", action="store_true", help="print the figures as JSON")
    ev.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ev.set_defaults(func=_cmd_eval)


def _cmd_schema(ns) -> int:
    from .config import config_json_schema

    print(json.dumps(config_json_schema(), indent=2))
    return 0


def _register_schema(subparsers) -> None:
    """``lora-share schema``'s flags (none)."""
    s = subparsers.add_parser("schema", help="print the config's JSON Schema")
    s.set_defaults(func=_cmd_schema)


def parser() -> argparse.ArgumentParser:
    """The ``lora-share`` parser: each subcommand registers its own flags (the benchmarks in their modules)."""
    from . import bench
    from .bench import budget, constraints, envelope, peers, quality, scale, serve, spec

    p = argparse.ArgumentParser(
        prog="lora-share",
        description="Share one foundation model's weights across many LoRA adapters on ExecuTorch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in (
        _register_validate,
        _register_build,
        _register_add,
        _register_run,
        _register_inspect,
        _register_verify,
        _register_eval,
        bench.register,
        scale.register,
        envelope.register,
        peers.register,
        serve.register,
        spec.register,
        budget.register,
        quality.register,
        constraints.register,
        _register_schema,
    ):
        register(sub)
    return p


# Import names that differ from their distribution's name.
_DISTRIBUTIONS = {"yaml": "pyyaml"}


def missing_requirement(command: str, error: ModuleNotFoundError) -> str | None:
    """What to install for a module ``command`` needs and this install lacks, from the installed
    package's own requirements: the wheel's (pyyaml, flatbuffers) or an extra's (``build``: torch,
    executorch, numpy...); None for a module that is no requirement (a bug, to be reported as one)."""
    from importlib.metadata import PackageNotFoundError, requires

    top = (error.name or "").split(".")[0]
    dist = _DISTRIBUTIONS.get(top, top).lower()
    try:
        requirements = requires("lora-share") or []
    except PackageNotFoundError:  # run from a checkout that is not installed
        requirements = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if re.split(r"[<>=!~\[ ]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-") != dist:
            continue
        extra = re.search(r"extra == ['\"]([^'\"]+)['\"]", marker)
        install = f"pip install 'lora_share[{extra.group(1)}]'" if extra else f"pip install '{spec.strip()}'"
        return f"lora-share {command} needs {dist}, which is not installed: {install}"
    return None


def main(argv=None) -> int:
    ns = parser().parse_args(argv)
    try:
        return ns.func(ns)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except ModuleNotFoundError as e:
        message = missing_requirement(ns.command, e)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: earlier outputs are untouched", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away, e.g. `lora-share inspect foundation.ptd | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
