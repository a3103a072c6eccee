"""Build-time benchmark: 1, 4 and 16 adapters, and adding one adapter to an existing build.

    python -m lora_share.bench.build_time [--config configs/llama_adapters.yaml] [--counts 1,4,16]
                                     [--out benchmarks/results/build_time.json]

Every build uses the config's foundation and adapters of one recipe (rank 8 on
q_proj and v_proj, a different seed each), as a team training many adapters the
same way would. Each count is built from scratch in a fresh folder, in this one
process, so the ratios compare like with like. Then one more adapter is added to
the 1-adapter build twice: as a PEFT folder through ``lora-share add``, and
through an incremental ``lora-share build`` of the config with one more entry.

Targets (from the issue): 16 adapters build in at most 2x the time of 1; adding
one adapter takes at most 5 % of a full one-adapter build. Exit status 1 if a
target is missed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from .common import results_header

RECIPE = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
WARMUP_FOUNDATION = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "hidden_dim": 64, "vocab_size": 64}


def write_config(folder: Path, foundation: dict, n: int, first_seed: int = 100) -> Path:
    import yaml  # imported where used: `lora-share --help` runs with the bare wheel

    adapters = [{"name": f"a{i:02d}", "synthetic": {**RECIPE, "seed": first_seed + i}} for i in range(n)]
    path = folder / "deploy.yaml"
    path.write_text(yaml.safe_dump({"output_dir": "out", "foundation": foundation, "adapters": adapters}))
    return path


def write_peft_folder(adapter, folder: Path) -> Path:
    """Save a loaded adapter as a PEFT folder (scale folded into B, so alpha = r)."""
    from safetensors.numpy import save_file

    from ..checkpoints.adapters import module_key

    folder.mkdir(parents=True, exist_ok=True)
    tensors, targets = {}, sorted({t for _, t in adapter.weights})
    rank = next(iter(adapter.weights.values()))[0].shape[0]
    for (layer, target), (a, b) in adapter.weights.items():
        key = f"base_model.model.{module_key(layer, target)}"
        tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a, b
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": targets, "bias": "none"})
    )
    return folder


def resolve_foundation(config: Path) -> dict:
    """The config's ``foundation`` section with every path in it (checkpoint, tokenizer) made absolute:
    the benchmarks write it into configs of their own, in other folders."""
    from dataclasses import fields

    import yaml  # imported where used: `lora-share --help` runs with the bare wheel

    from ..config import FoundationConfig

    foundation = yaml.safe_load(config.read_text())["foundation"]
    base = config.resolve().parent
    for f in fields(FoundationConfig):
        if f.metadata.get("path") and foundation.get(f.name) is not None:
            foundation[f.name] = str((base / foundation[f.name]).resolve())
    return foundation


def warm_up(folder: Path) -> None:
    """The first export in a process pays one-off import and tracing costs; pay them
    on a tiny model first so the 1-adapter baseline is not inflated by them."""
    from ..deploy.builder import build

    folder.mkdir(parents=True, exist_ok=True)
    build(write_config(folder, {"synthetic": WARMUP_FOUNDATION, "max_seq_len": 8}, 1), quiet=True)


def timed_build(folder: Path, foundation: dict, n: int, quiet: bool = True) -> tuple[dict, dict]:
    """Build ``n`` adapters of RECIPE from scratch in ``folder`` (outputs in ``folder/out``):
    (row for the table, manifest)."""
    from ..deploy.builder import build

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    manifest = build(write_config(folder, foundation, n), quiet=quiet)
    seconds = time.perf_counter() - t0
    how = [a["produced"] for a in manifest["adapters"]]
    return {
        "adapters": n,
        "seconds": round(seconds, 2),
        "exported": int(manifest["program"]["produced"] == "exported"),
        "written": how.count("written"),
    }, manifest


def measure(config: Path, counts: list[int], command: str, quiet: bool = True) -> dict:
    """Run every build of the benchmark; returns the figures as a dict, its header naming ``command``."""
    from ..checkpoints.adapters import synthetic_adapter
    from ..config import SyntheticAdapter
    from ..deploy.builder import add, build
    from ..manifest import read_manifest

    foundation = resolve_foundation(config)
    rows, one_dir = [], None
    with tempfile.TemporaryDirectory(prefix="lora-share-bench-") as tmp:
        warm_up(Path(tmp) / "warmup")
        for n in counts:
            folder = Path(tmp) / f"n{n}"
            print(f"building {n} adapter(s) ...", file=sys.stderr, flush=True)
            row, _ = timed_build(folder, foundation, n, quiet)
            rows.append(row)
            print(f"  {n:3d} adapters: {row['seconds']:7.1f} s", file=sys.stderr)
            if n == counts[0]:
                one_dir = folder
        args = read_manifest(one_dir / "out").model_args
        new = synthetic_adapter("added", SyntheticAdapter(**RECIPE, seed=999), args)
        peft = write_peft_folder(new, Path(tmp) / "added_peft")
        t0 = time.perf_counter()
        add(one_dir / "out", [("added", peft)], quiet=quiet)
        add_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        build(write_config(one_dir, foundation, counts[0] + 1), quiet=quiet)
        incremental_s = time.perf_counter() - t0
    one = rows[0]["seconds"]
    return {
        **results_header(command),
        "config": str(config),
        "recipe": RECIPE,
        "builds": rows,
        "add_one_s": round(add_s, 3),
        "incremental_build_one_more_s": round(incremental_s, 3),
        "ratios": {
            f"build_{rows[-1]['adapters']}_over_{rows[0]['adapters']}": round(rows[-1]["seconds"] / one, 3),
            "add_over_build_1": round(add_s / one, 4),
            "incremental_over_build_1": round(incremental_s / one, 4),
        },
    }


def report(result: dict) -> tuple[str, bool]:
    """The printed table and whether the targets hold."""
    lines = ["adapters | build s | programs exported | adapters written | x build of 1", "-" * 70]
    one = result["builds"][0]["seconds"]
    for r in result["builds"]:
        lines.append(
            f"{r['adapters']:8d} | {r['seconds']:7.1f} | {r['exported']:17d} | {r['written']:16d} | "
            f"{r['seconds'] / one:6.2f}"
        )
    ratios = result["ratios"]
    key = next(k for k in ratios if k.startswith("build_"))
    ok_many = ratios[key] <= 2.0
    ok_add = ratios["add_over_build_1"] <= 0.05 and ratios["incremental_over_build_1"] <= 0.05
    lines += [
        "",
        f"add one adapter (lora-share add, PEFT folder):   {result['add_one_s']:.2f} s = "
        f"{100 * ratios['add_over_build_1']:.1f} % of a 1-adapter build",
        f"add one adapter (incremental lora-share build):  {result['incremental_build_one_more_s']:.2f} s = "
        f"{100 * ratios['incremental_over_build_1']:.1f} % of a 1-adapter build",
        f"target: {key.replace('_', ' ')} <= 2x: {'pass' if ok_many else 'FAIL'} ({ratios[key]:.2f}x); "
        f"adding <= 5 %: {'pass' if ok_add else 'FAIL'}",
    ]
    return "\n".join(lines), ok_many and ok_add


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lora_share.bench.build_time",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default="configs/llama_adapters.yaml", help="foundation to build on")
    p.add_argument("--counts", default="1,4,16", help="adapter counts, comma-separated (first is the baseline)")
    p.add_argument("--out", default="benchmarks/results/build_time.json", help="where the JSON goes")
    ns = p.parse_args(argv)
    counts = [int(c) for c in ns.counts.split(",")]
    typed = " ".join(map(shlex.quote, argv if argv is not None else sys.argv[1:]))
    result = measure(Path(ns.config), counts, f"python -m lora_share.bench.build_time {typed}".strip())
    text, ok = report(result)
    print(text)
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
