"""llama.cpp, for the benchmarks that compare with it (bench-peers, bench-serve): built once from a pinned
release on PyPI, its GGUF files made from the same model and adapters, llama-server driven over HTTP,
its logs read.

The ``llama-cpp-python==LLAMA_CPP_PYTHON`` sdist vendors llama.cpp's source (and its
convert_hf_to_gguf.py / convert_lora_to_gguf.py); llama-server, llama-quantize and llama-perplexity are
built from it with CMake for this CPU (no CUDA, no curl).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

from . import processes
from .memory import BenchError

LLAMA_CPP_PYTHON = "0.3.36"

LLAMA_TOOLS = ("llama-server", "llama-quantize", "llama-perplexity")


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
    ``parallel`` slots (-np), each of ``context`` tokens (llama-server splits -c among its slots); ``extra``
    flags appended (bench-spec's ``--spec-type ngram-simple``)."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        loras: list[Path],
        port: int,
        log: Path,
        *,
        context: int,
        parallel: int = 1,
        extra: tuple[str, ...] = (),
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
            *extra,
        ]  # verbosity 4: the library's own lines (adapters loaded, KV buffer size)
        for lora in loras:
            cmd += ["--lora", lora]
        self.url, self.log, self.n_loras = f"http://127.0.0.1:{port}", log, len(loras)
        self.address = f"127.0.0.1:{port}"  # host:port, as http_streams takes it
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


def parse_perplexity(log: str) -> float:
    """llama-perplexity's result line, ``Final estimate: PPL = 13.1234 +/- 0.12345``."""
    m = re.search(r"Final estimate: PPL = ([\d.]+)", log)
    if not m:
        raise BenchError("llama-perplexity printed no 'Final estimate: PPL = ...' line")
    return float(m.group(1))
