"""The light commands import no torch: `import lora_share.cli` and the config, and `lora-share add`,
`inspect`, `verify`, `validate` and `schema` run without it (torch's import alone is seconds of an
`add` that writes in a fraction of one). `add` reads PEFT weights with numpy, widening bfloat16 by
hand: the LoRA tensors it writes are, byte for byte, the float32 values torch computes."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import TINY_FOUNDATION
from hf_files import hf_config, write_peft_lora
from safetensors.torch import load_file, save_file

from lora_share.formats import read_pte
from lora_share.formats.records import adapter_record

# Runs the CLI in a fresh interpreter, then names the heavy modules it imported.
CLI_THEN_MODULES = """import sys
import lora_share.cli
code = lora_share.cli.main(sys.argv[1:])
print("heavy modules:", sorted(m for m in ("torch", "executorch", "transformers") if m in sys.modules), file=sys.stderr)
sys.exit(code)
"""
TINY_HF = hf_config(
    dim=TINY_FOUNDATION["dim"],
    layers=TINY_FOUNDATION["n_layers"],
    heads=TINY_FOUNDATION["n_heads"],
    kv_heads=TINY_FOUNDATION["n_kv_heads"],
    hidden=TINY_FOUNDATION["hidden_dim"],
    vocab=TINY_FOUNDATION["vocab_size"],
)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# PEFT adapters inside tiny_build's envelope (every linear, ranks up to 8), each stored in another dtype.
ADDED = {
    "f32": (torch.float32, dict(r=8, alpha=16, targets=ALL, seed=41)),
    "bf16": (torch.bfloat16, dict(r=8, alpha=24, targets=ALL, seed=42)),
    "f16_rslora": (torch.float16, dict(r=4, alpha=3, targets=["q_proj", "down_proj"], use_rslora=True, seed=43)),
}


def run_light(*args, cwd=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-c", CLI_THEN_MODULES, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )
    assert "heavy modules: []" in proc.stderr, proc.stderr
    return proc


def test_cli_and_config_import_no_torch():
    code = (
        "import sys, lora_share, lora_share.cli, lora_share.config; "
        "print(sorted(m for m in sys.modules if m == 'torch'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_every_subcommand_registers_its_flags_without_torch():
    """Each subcommand's parser, the benchmarks' from their own modules, formats its help without torch."""
    code = (
        "import sys, lora_share.cli\n"
        "sub = next(a for a in lora_share.cli.parser()._actions if a.dest == 'command')\n"
        "for name, p in sub.choices.items():\n"
        "    assert p.format_help().startswith('usage: lora-share ' + name), name\n"
        "print(' '.join(sub.choices), 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "validate",
        "build",
        "add",
        "run",
        "inspect",
        "verify",
        "eval",
        "bench",
        "bench-scale",
        "bench-envelope",
        "bench-peers",
        "bench-serve",
        "bench-spec",
        "bench-budget",
        "bench-quality",
        "bench-structured",
        "schema",
        "False",
    ]


def test_validate_schema_inspect_verify_run_without_torch(tiny_build):
    assert run_light("validate", tiny_build.config).returncode == 0
    assert json.loads(run_light("schema").stdout)["type"] == "object"
    pte, ptd = tiny_build.ptes["tiny_a"], tiny_build.ptd
    assert "compatible: yes" in run_light("inspect", pte, "--ptd", ptd).stdout
    assert run_light("verify", "--pte", pte, "--ptd", ptd).returncode == 0


def test_inspect_of_a_build_folder_names_its_files_and_one_that_runs(tiny_build):
    """A newcomer's first try, `lora-share inspect out/tiny`: one line naming the folder's own files and a
    command that works, no traceback."""
    proc = run_light("inspect", tiny_build.out_dir)
    lines = proc.stderr.strip().splitlines()[:-1]  # the last line is run_light's list of heavy modules
    assert proc.returncode == 2 and proc.stdout == "" and len(lines) == 1, proc.stderr
    files = ["foundation.ptd", *sorted(p.name for p in tiny_build.out_dir.glob("*.pte"))]
    assert f"inspect takes one of its files ({', '.join(files)})" in lines[0], lines[0]
    suggested = lines[0].split("e.g. lora-share ")[1].split()
    assert suggested == ["inspect", str(tiny_build.out_dir / "foundation.ptd")]
    assert "lora-share foundation: fingerprint" in run_light(*suggested).stdout


@pytest.fixture(scope="module")
def added(tiny_build, tmp_path_factory):
    """ADDED written as PEFT folders in their dtypes, then `lora-share add` of all three to a copy of tiny_build."""
    root = tmp_path_factory.mktemp("light_add")
    out = root / "out"
    shutil.copytree(tiny_build.out_dir, out)
    for name, (dtype, spec) in ADDED.items():
        folder = write_peft_lora(root / name, TINY_HF, **spec)
        weights = folder / "adapter_model.safetensors"
        save_file({k: t.to(dtype) for k, t in load_file(str(weights)).items()}, str(weights), metadata={"format": "pt"})
    proc = run_light("add", "--to", out, *[f"{n}={root / n}" for n in ADDED])
    assert proc.returncode == 0, proc.stderr
    return root, out


@pytest.mark.parametrize("name", list(ADDED))
def test_add_writes_the_float32_bytes_torch_computes(added, name):
    """Each LoRA tensor in the added .pte is torch's: A widened to float32, B widened and times the scale."""
    root, out = added
    dtype, spec = ADDED[name]
    scale = spec["alpha"] / (math.sqrt(spec["r"]) if spec.get("use_rslora") else spec["r"])
    peft = load_file(str(root / name / "adapter_model.safetensors"))
    assert {t.dtype for t in peft.values()} == {dtype}
    pte = read_pte(out / f"{name}.pte")
    record = adapter_record(pte)
    assert len(record.lora) == len(spec["targets"]) * TINY_FOUNDATION["n_layers"]
    for entry in record.lora:
        layer, target = record.envelope[entry.slot]
        module = f"base_model.model.model.layers.{layer}.{'self_attn' if target in ALL[:4] else 'mlp'}.{target}"
        a = peft[f"{module}.lora_A.weight"].to(torch.float32)
        b = peft[f"{module}.lora_B.weight"].to(torch.float32) * scale
        assert pte.data(entry.a) == a.contiguous().numpy().tobytes(), (name, layer, target, "A")
        assert pte.data(entry.b) == b.contiguous().numpy().tobytes(), (name, layer, target, "B")
