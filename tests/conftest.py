"""Session fixtures: tiny exports built once and shared by every test that needs them."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

import lanes  # noqa: E402  (tests/lanes.py, beside this file)


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The users of the big session builds marked slow, the groups heaviest first: tests/lanes.py."""
    lanes.mark_and_order(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's setup, call and teardown time, added to its file's (on xdist's controller too)."""
    lanes.add_time(report)


def pytest_terminal_summary(terminalreporter) -> None:
    """The slowest files of the run, their tests' time summed: tests/lanes.py."""
    lanes.report_files(terminalreporter)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown when it is not loaded (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup: whole groups of tests/lanes.py per worker."""
    if config.getvalue("dist") == "loadgroup":
        return lanes.GroupScheduling(config, log)
    return None


def built_once(tmp_path_factory, name: str, make: Callable[[Path], object]):
    """``make(folder)``'s result, built once per run however many xdist workers ask for it.

    Under xdist the first worker to ask builds into a folder beside every worker's base temp folder,
    under a lock, and leaves the result pickled there; a worker asking later (or while it is built:
    it waits, which is never longer than building it itself) reads that. Without xdist, a folder of
    this session. The results are Paths and dicts (Build and its kind): the files are shared, so no
    test may modify them (copy the folder first)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return make(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent
    folder, result = root / name, root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.is_file():
            folder.mkdir()
            built = make(folder)
            result.with_suffix(".tmp").write_bytes(pickle.dumps(built))
            result.with_suffix(".tmp").rename(result)
        return pickle.loads(result.read_bytes())


TINY_FOUNDATION = {
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "hidden_dim": 128,
    "vocab_size": 256,
    "tie_embeddings": True,
    "seed": 0,
}
TINY_CHUNK = 8  # tiny_build's prefill chunk: prompts longer than this are fed in several calls
TINY_ADAPTERS = [
    {"name": "tiny_a", "synthetic": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "seed": 1}},
    {
        "name": "tiny_b",
        "synthetic": {"rank": 8, "alpha": 16, "target_modules": ["o_proj", "gate_proj", "down_proj"], "seed": 2},
    },
    {
        "name": "tiny_c",
        "synthetic": {"rank": 2, "alpha": 2, "target_modules": ["k_proj", "up_proj"], "seed": 3, "layers": [1]},
    },
]
# Adapters that share tensors, built with dedup.shared_adapter_tensors: hoist. The synthetic
# weights come from one generator per adapter, slot by slot, and B carries alpha/rank, so:
HOIST_ADAPTERS = [
    {"name": "h_a", "synthetic": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "seed": 1}},
    # same A tensors as h_a (alpha only scales B): every A is shared, every B its own
    {"name": "h_b", "synthetic": {"rank": 4, "alpha": 4, "target_modules": ["q_proj", "v_proj"], "seed": 1}},
    # h_a's layer 0 exactly: all of its tensors are shared
    {
        "name": "h_c",
        "synthetic": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "seed": 1, "layers": [0]},
    },
    # shares nothing: keeps every tensor in its .pte
    {"name": "h_d", "synthetic": {"rank": 8, "alpha": 16, "target_modules": ["o_proj"], "seed": 2}},
]


@dataclass
class Build:
    config: Path
    out_dir: Path
    manifest: dict

    @property
    def ptd(self) -> Path:
        return self.out_dir / "foundation.ptd"

    @property
    def ptes(self) -> dict[str, Path]:
        return {a["name"]: self.out_dir / a["file"] for a in self.manifest["adapters"]}

    @property
    def shared_ptd(self) -> Path:
        """adapters_shared.ptd (built only with dedup.shared_adapter_tensors: hoist)."""
        return self.out_dir / "adapters_shared.ptd"


def write_config(folder: Path, foundation: dict, adapters: list, name: str = "deploy", **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"output_dir": "out", "foundation": foundation, "adapters": adapters, **extra}))
    return path


def build_config(path: Path) -> Build:
    import lora_share

    manifest = lora_share.build(path, quiet=True)
    return Build(path, path.parent / "out", manifest)


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory) -> Build:
    """Three synthetic adapters (different ranks, targets, layer subsets) over a tied tiny foundation,
    with a context of 32 and forward calls of at most TINY_CHUNK tokens (longer prompts are chunked)."""
    foundation = {"synthetic": TINY_FOUNDATION, "max_seq_len": 32, "prefill_chunk": TINY_CHUNK}
    return built_once(
        tmp_path_factory, "tiny", lambda folder: build_config(write_config(folder, foundation, TINY_ADAPTERS))
    )


@pytest.fixture(scope="session")
def hoisted_build(tmp_path_factory) -> Build:
    """HOIST_ADAPTERS over the tiny foundation, shared tensors hoisted into adapters_shared.ptd."""
    foundation, dedup = {"synthetic": TINY_FOUNDATION, "max_seq_len": 32}, {"shared_adapter_tensors": "hoist"}
    return built_once(
        tmp_path_factory,
        "hoisted",
        lambda folder: build_config(write_config(folder, foundation, HOIST_ADAPTERS, dedup=dedup)),
    )


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory) -> Path:
    """configs/llama_adapters.yaml as shipped (111 MB float32 foundation, four trained adapters), built
    into a temporary folder; returns the output folder."""
    import lora_share

    config = REPO / "configs" / "llama_adapters.yaml"
    folder = tmp_path_factory.mktemp("demo")
    data = yaml.safe_load(config.read_text())
    data["output_dir"] = str(folder / "out")
    data["foundation"]["tokenizer"] = str((config.parent / data["foundation"]["tokenizer"]).resolve())
    for a in data["adapters"]:
        a["peft"] = str((config.parent / a["peft"]).resolve())
    cfg = folder / "llama_adapters.yaml"
    cfg.write_text(yaml.safe_dump(data))
    lora_share.build(cfg, quiet=True)
    return folder / "out"


# The real model: SmolLM2-135M-Instruct's Q4_1 GGUF (`make model`), as configs/smollm2.yaml builds it.
SMOLLM2_GGUF = REPO / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CONFIG = REPO / "configs" / "smollm2.yaml"


@pytest.fixture(scope="session")
def smollm2_build(tmp_path_factory) -> Build:
    """configs/smollm2.yaml as shipped (the 538 MB float32 foundation, the four demo adapters), built
    once per run into a temporary folder: minutes of export, so every real-model test shares it (and
    tests/lanes.py keeps its users on one worker). Do not modify the files: copy the output folder first."""
    if not SMOLLM2_GGUF.is_file():
        pytest.fail(f"{SMOLLM2_GGUF} is missing: `make model` fetches it (make test runs it first)")
    root = tmp_path_factory.mktemp("smollm2")
    config = yaml.safe_load(SMOLLM2_CONFIG.read_text())
    config["output_dir"] = str(root / "out")
    config["foundation"]["checkpoint"] = str(SMOLLM2_GGUF)
    for a in config["adapters"]:
        a["peft"] = str((SMOLLM2_CONFIG.parent / a["peft"]).resolve())
    (root / "smollm2.yaml").write_text(yaml.safe_dump(config))
    return build_config(root / "smollm2.yaml")


@pytest.fixture(scope="session")
def hf_smollm2():
    """The independent reference for smollm2_build: transformers' own GGUF loading of the same file, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def runner_bin() -> Path:
    """The C++ runner, built by `make runner` if it is not built yet."""
    binary = REPO / "build" / "runner"
    if not binary.exists() or os.environ.get("LORA_SHARE_REBUILD_RUNNER"):
        subprocess.run(["make", "-C", str(REPO), "runner"], check=True, capture_output=True)
    return binary


def token_usage(usage: dict) -> dict:
    """An answer's usage without ``completion_tokens_details``: those count the drafts the answering runtime
    checked (docs/server.md), and how many drafts pay for a step is timed on the machine (step_width.h), so
    two doors give the same text and counts but not always the same drafts (unless both verify every draft)."""
    return {k: v for k, v in usage.items() if k != "completion_tokens_details"}


def run_cli(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """The real `lora-share` command, as a user types it."""
    exe = Path(sys.executable).parent / "lora-share"
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)


@dataclass
class TextBuild:
    """A build whose checkpoint ships a tokenizer: see the ``text_build`` fixture."""

    build: Build
    checkpoint: Path  # the Hugging Face llama folder, tokenizer files included
    peft: Path  # the PEFT LoRA folder built as TEXT_ADAPTER

    @property
    def pte(self) -> Path:
        return self.build.ptes[TEXT_ADAPTER]


TEXT_ADAPTER = "chat"


@pytest.fixture(scope="session")
def text_build(tmp_path_factory) -> TextBuild:
    """A tiny Hugging Face llama checkpoint WITH a tokenizer, plus one PEFT adapter, built once.

    The checkpoint folder (``.checkpoint``) holds config.json + model.safetensors (hf_files.hf_config
    with vocab_size 400, tied embeddings) and the byte-level BPE tokenizer of
    tokenizer_files.byte_level_bpe (vocab 400: tokenizer.json, tokenizer_config.json with a chat
    template, generation_config.json with eos ids [1, 2], BOS 0 prepended), so transformers'
    AutoTokenizer / LlamaForCausalLM and peft's PeftModel load ``.checkpoint`` and ``.peft`` as they are.
    The build (``.build``, output folder ``.build.out_dir``) takes the tokenizer from the checkpoint
    folder by default: tokenizer files beside foundation.ptd, manifest.json's ``tokenizer`` section.
    One adapter, TEXT_ADAPTER ("chat", ``.pte``): LoRA r=4 on q/v/o/down_proj. max_seq_len 64,
    prefill_chunk 16 (text prompts longer than 16 tokens are fed in chunks). Do not modify the files:
    copy the output folder first.
    """
    return built_once(tmp_path_factory, "text", make_text_build)


def make_text_build(root: Path) -> TextBuild:
    from hf_files import hf_config, write_hf_llama, write_peft_lora
    from tokenizer_files import byte_level_bpe

    base_cfg = hf_config(vocab=400)
    checkpoint = write_hf_llama(root / "llama", base_cfg, seed=5)
    byte_level_bpe(checkpoint, vocab_size=400)
    peft = write_peft_lora(
        root / "peft", base_cfg, r=4, alpha=8, targets=["q_proj", "v_proj", "o_proj", "down_proj"], seed=6
    )
    cfg = write_config(
        root, {"checkpoint": "llama", "max_seq_len": 64, "prefill_chunk": 16}, [{"name": TEXT_ADAPTER, "peft": "peft"}]
    )
    return TextBuild(build_config(cfg), checkpoint, peft)


LONG_CONTEXT = 1024  # room for nested JSON answers of a byte-level vocabulary of 400


@pytest.fixture(scope="session")
def long_text_build(text_build, tmp_path_factory) -> Build:
    """text_build with a context of LONG_CONTEXT (the same checkpoint, tokenizer and adapter): the
    structured-output tests' answers. Do not modify the files: copy the output folder first."""
    import shutil

    def make(root: Path) -> Build:
        shutil.copytree(text_build.build.out_dir, root / "out")  # the adapter's files are reused
        cfg = yaml.safe_load(text_build.build.config.read_text())
        cfg["foundation"].update(checkpoint=str(text_build.checkpoint), max_seq_len=LONG_CONTEXT)
        cfg["adapters"] = [{"name": TEXT_ADAPTER, "peft": str(text_build.peft)}]
        (root / "deploy.yaml").write_text(yaml.safe_dump(cfg))
        return build_config(root / "deploy.yaml")

    return built_once(tmp_path_factory, "long_text", make)


# Longer than text_build's prefill chunk (16), so the prompt is fed in two calls.
EOS_PROMPT = "The quick brown fox jumps over the lazy dog."
EOS_NEW = 16


@dataclass
class EosBuild:
    """A build whose generation_config.json names an EOS greedy decoding reaches: see ``eos_build``."""

    eos: int  # the EOS id the build's generation_config.json names
    greedy: list[int]  # transformers' greedy EOS_NEW tokens after EOS_PROMPT, no EOS stop
    build: Build


@pytest.fixture(scope="session")
def eos_build(text_build, request, tmp_path_factory) -> EosBuild:
    """text_build rebuilt with foundation.tokenizer: the same tokenizer, but generation_config.json's
    eos is the token greedy decoding of EOS_PROMPT reaches last for the first time (a plain word piece),
    so generation stops before EOS_NEW tokens. The build records its EOS ids (manifest.json's tokenizer
    section) as for any checkpoint. Do not modify the files: copy the output folder first."""
    return built_once(tmp_path_factory, "eos", lambda root: make_eos_build(root, text_build, request))


def make_eos_build(root: Path, text_build: TextBuild, request) -> EosBuild:
    import shutil

    from hf_files import hf_generate

    tokenizer, model = request.getfixturevalue("text_hf")  # only where it is built
    greedy = hf_generate(model, tokenizer(EOS_PROMPT)["input_ids"], EOS_NEW, eos=[])
    eos = max(set(greedy[: EOS_NEW - 1]), key=greedy.index)  # generation then stops before EOS_NEW
    tok_dir = root / "tokenizer"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(text_build.checkpoint / name, tok_dir / name)
    (tok_dir / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": eos}))
    shutil.copytree(text_build.build.out_dir, root / "out")  # the same output folder: the adapter is reused
    cfg = yaml.safe_load(text_build.build.config.read_text())
    cfg["foundation"].update(checkpoint=str(text_build.checkpoint), tokenizer="tokenizer")
    cfg["adapters"] = [{"name": TEXT_ADAPTER, "peft": str(text_build.peft)}]
    (root / "deploy.yaml").write_text(yaml.safe_dump(cfg))
    return EosBuild(eos, greedy, build_config(root / "deploy.yaml"))


@pytest.fixture(scope="session")
def text_hf(text_build):
    """The independent reference for text_build: transformers' tokenizer of its checkpoint and the
    PEFT-wrapped LlamaForCausalLM of its checkpoint + adapter (eager attention, float32)."""
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(text_build.checkpoint))
    model = LlamaForCausalLM.from_pretrained(
        str(text_build.checkpoint), torch_dtype=torch.float32, attn_implementation="eager"
    )
    return tokenizer, PeftModel.from_pretrained(model, str(text_build.peft)).eval()


# Untied: tied, the tiny synthetic foundation's greedy choice repeats the last prompt token whatever the
# adapter, so comparing greedy tokens between two runtimes (test_arm64, test_dist) would check nothing.
TINY_UNTIED = dict(TINY_FOUNDATION, tie_embeddings=False)


@pytest.fixture(scope="session")
def untied_build(tmp_path_factory) -> Build:
    """TINY_ADAPTERS over the tiny foundation with an output projection of its own (TINY_UNTIED):
    greedy tokens that differ from step to step and from adapter to adapter."""
    foundation = {"synthetic": TINY_UNTIED, "max_seq_len": 32}
    return built_once(
        tmp_path_factory, "untied", lambda folder: build_config(write_config(folder, foundation, TINY_ADAPTERS))
    )


@dataclass
class ProgramsBuild:
    """A deployment of programs from PT2 archives (tests/pt2_models.py): see ``programs_build``."""

    archives: object  # pt2_models.Archives
    out_dir: Path
    manifest: dict


@pytest.fixture(scope="session")
def pt2_archives(tmp_path_factory):
    """The PT2 archives of tests/pt2_models.py, written once."""
    from pt2_models import write_archives

    return built_once(tmp_path_factory, "pt2", write_archives)


@pytest.fixture(scope="session")
def programs_build(pt2_archives, tmp_path_factory) -> ProgramsBuild:
    """Five programs from four archives (one of them holding two models) built into one deployment."""
    from pt2_models import PROGRAMS_YAML

    from lora_share.programs.build import build_programs

    def make(folder: Path) -> ProgramsBuild:
        config = folder / "programs.yaml"
        config.write_text(PROGRAMS_YAML.format(out=folder / "out", a=pt2_archives))
        return ProgramsBuild(pt2_archives, folder / "out", build_programs(config, quiet=True))

    return built_once(tmp_path_factory, "programs", make)


@pytest.fixture(scope="session")
def wheel_python(runner_bin, tmp_path_factory) -> Path:
    """The python of a fresh venv outside the checkout holding only the wheel `make wheel` writes
    (dist/lora_share-<version>-*linux*.whl, installed with --no-deps: no torch, no other package)."""
    import venv

    proc = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "wheel"], capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheel = Path([line for line in proc.stdout.splitlines() if line.endswith(".whl")][-1])
    wheel = wheel if wheel.is_absolute() else REPO / wheel
    assert wheel.parent == REPO / "dist" and wheel.name.startswith("lora_share-") and "linux" in wheel.name
    env_dir = tmp_path_factory.mktemp("wheel") / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    assert sys.prefix != str(env_dir)
    return python


def run_in_wheel_venv(python: Path, script: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    """`script` run by the wheel's venv python (wheel_python) from `cwd`, with no environment but PATH."""
    return subprocess.run(
        [str(python), "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
    )
