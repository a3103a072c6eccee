"""Config validation: every shipped YAML validates; bad ones get every error, with key paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli

import lora_share
from lora_share.config import config_json_schema

# examples/families/*.yaml read tiny checkpoints that examples/families/tiny_checkpoints.py writes (not
# kept in the repository): tests/test_families.py writes them and builds each of those configs.
FAMILY_EXAMPLES = REPO / "examples" / "families"
# examples/pt2/vision.yaml reads the archives examples/pt2/export_models.py writes (not kept in the
# repository either): tests/test_programs.py writes them and validates it.
PT2_EXAMPLES = REPO / "examples" / "pt2"
SHIPPED = sorted(
    p
    for p in [*REPO.glob("configs/*.yaml"), *REPO.glob("examples/**/*.yaml")]
    if p.parent not in (FAMILY_EXAMPLES, PT2_EXAMPLES)
)


def test_configs_exist():
    assert any(p.name == "llama_adapters.yaml" for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_configs_validate(path):
    cfg = lora_share.validate(path)
    assert cfg.adapters


def _recipe(a) -> tuple[int, tuple]:
    """(rank, target modules) of a synthetic adapter or of a PEFT folder's adapter_config.json."""
    if a.synthetic is not None:
        return a.synthetic.rank, tuple(a.synthetic.target_modules)
    peft = json.loads((a.peft / "adapter_config.json").read_text())
    return peft["r"], tuple(sorted(peft["target_modules"]))


def test_default_config_meets_the_promise():
    """configs/llama_adapters.yaml: synthetic, >= 100 MB foundation, >= 3 adapters of different ranks and targets."""
    import math

    from lora_share.checkpoints.foundation import expected_shapes
    from lora_share.model.args import ModelArgs

    cfg = lora_share.validate(REPO / "configs/llama_adapters.yaml")
    s = cfg.foundation.synthetic
    assert s is not None
    args = ModelArgs(
        dim=s.dim,
        n_layers=s.n_layers,
        n_heads=s.n_heads,
        n_kv_heads=s.n_kv_heads,
        hidden_dim=s.hidden_dim,
        vocab_size=s.vocab_size,
        tie_embeddings=s.tie_embeddings,
    )
    assert sum(4 * math.prod(shape) for shape in expected_shapes(args).values()) >= 100e6
    assert len(cfg.adapters) >= 3
    assert len({_recipe(a)[0] for a in cfg.adapters}) >= 2
    assert len({_recipe(a)[1] for a in cfg.adapters}) >= 2


def test_schema_file_in_sync():
    on_disk = json.loads((REPO / "schema/config.schema.json").read_text())
    assert on_disk == config_json_schema(), "regenerate with: .venv/bin/lora-share schema > schema/config.schema.json"


def _write(tmp_path: Path, data: dict, name="bad.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


GOOD_FOUNDATION = {
    "synthetic": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 128, "vocab_size": 256}
}


def test_every_error_reported_at_once(tmp_path):
    p = _write(
        tmp_path,
        {
            "foundaton": {},
            "adapters": [
                {"name": "a", "synthetic": {"rank": 0, "alpha": 16, "target_modules": ["q_prj"]}},
                {"name": "a", "peft": "nowhere"},
            ],
        },
    )
    with pytest.raises(lora_share.ConfigErrors) as e:
        lora_share.validate(p)
    problems = e.value.problems
    text = str(e.value)
    assert str(p) in text
    assert "foundaton: unknown key; did you mean 'foundation'?" in problems
    assert any(s.startswith("foundation: missing") for s in problems)
    assert "adapters[0].synthetic.rank: must be at least 1, got 0" in problems
    assert any("adapters[0].synthetic.target_modules[0]" in s and "did you mean 'q_proj'" in s for s in problems)
    assert any(s.startswith("adapters[1].name") and "already used" in s for s in problems)
    assert any(s.startswith("adapters[1].peft") and "no such folder" in s for s in problems)
    assert len(problems) == 6


def test_dedup_mistakes_get_a_suggestion(tmp_path):
    adapters = [{"name": "a", "synthetic": {"rank": 2, "alpha": 4, "target_modules": ["q_proj"]}}]
    p = _write(
        tmp_path,
        {
            "foundation": GOOD_FOUNDATION,
            "adapters": adapters,
            "dedup": {"shared_adapter_tensors": "hoisted", "shared_tensor": "hoist"},
        },
    )
    with pytest.raises(lora_share.ConfigErrors) as e:
        lora_share.validate(p)
    assert sorted(e.value.problems) == [
        "dedup.shared_adapter_tensors: 'hoisted' is not one of report, hoist (did you mean 'hoist'?)",
        "dedup.shared_tensor: unknown key; did you mean 'shared_adapter_tensors'?",
    ]
    p = _write(
        tmp_path,
        {"foundation": GOOD_FOUNDATION, "adapters": adapters, "dedup": {"shared_adapter_tensors": "hoist"}},
        name="good.yaml",
    )
    assert lora_share.validate(p).dedup.shared_adapter_tensors == "hoist"


def test_paths_resolve_against_the_config_folder(tmp_path):
    (tmp_path / "sub" / "peft_a").mkdir(parents=True)
    p = _write(
        tmp_path / "sub",
        {"foundation": GOOD_FOUNDATION, "output_dir": "../built", "adapters": [{"name": "a", "peft": "peft_a"}]},
        "c.yaml",
    )
    cfg = lora_share.validate(p)
    assert cfg.adapters[0].peft == (tmp_path / "sub" / "peft_a").resolve()
    assert cfg.output_dir == (tmp_path / "built").resolve()


def test_validate_cli_reports_all_and_exits_2(tmp_path):
    p = _write(tmp_path, {"foundation": {**GOOD_FOUNDATION, "max_seq_len": "long"}, "adapters": [], "extra": 1})
    r = run_cli("validate", p)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "foundation.max_seq_len: expected an integer, got 'long'" in r.stderr
    assert "extra: unknown key" in r.stderr
    assert "adapters: list at least one adapter" in r.stderr


def test_validate_cli_ok():
    r = run_cli("validate", *SHIPPED)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(": OK") == len(SHIPPED)


def test_invalid_yaml_names_the_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("foundation:\n  synthetic: {dim: 64\nadapters: []\n")
    r = run_cli("validate", p)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(p) in r.stderr and "line" in r.stderr


def test_foundation_tokenizer_key(tmp_path):
    """foundation.tokenizer: a folder with tokenizer.json; anything else is an error naming the key and the folder."""
    adapters = [{"name": "a", "synthetic": {"rank": 2, "alpha": 4, "target_modules": ["q_proj"]}}]
    (tmp_path / "tok").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    p = _write(tmp_path, {"foundation": {**GOOD_FOUNDATION, "tokenizer": "tok"}, "adapters": adapters}, "good.yaml")
    assert lora_share.validate(p).foundation.tokenizer == (tmp_path / "tok").resolve()
    for value, expected in [
        ("empty", f"foundation.tokenizer: {(tmp_path / 'empty').resolve()}: no tokenizer.json in this folder"),
        ("nowhere", f"foundation.tokenizer: {(tmp_path / 'nowhere').resolve()}: no such folder"),
        (3, "foundation.tokenizer: expected a path, got 3"),
    ]:
        p = _write(tmp_path, {"foundation": {**GOOD_FOUNDATION, "tokenizer": value}, "adapters": adapters})
        with pytest.raises(lora_share.ConfigErrors) as e:
            lora_share.validate(p)
        assert len(e.value.problems) == 1 and e.value.problems[0].startswith(expected), e.value.problems
    r = run_cli("validate", p)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "foundation.tokenizer" in r.stderr


def test_validate_checks_adapters_against_the_envelope(tmp_path):
    """An adapter above lora_envelope.max_rank or on a linear outside its targets is reported by validate,
    every one at once, before any export (the PEFT folder's adapter_config.json as written)."""
    peft = tmp_path / "peft32"
    peft.mkdir()
    (peft / "adapter_config.json").write_text(json.dumps({"r": 32, "target_modules": ["q_proj", "up_proj"]}))
    p = _write(
        tmp_path,
        {
            "foundation": {
                "synthetic": {
                    "dim": 64,
                    "n_layers": 2,
                    "n_heads": 4,
                    "n_kv_heads": 2,
                    "hidden_dim": 128,
                    "vocab_size": 256,
                }
            },
            "lora_envelope": {"targets": ["q_proj", "v_proj"], "max_rank": 16},
            "adapters": [
                {"name": "big", "peft": str(peft)},
                {"name": "syn", "synthetic": {"rank": 20, "alpha": 8, "target_modules": ["q_proj"]}},
            ],
        },
    )
    with pytest.raises(lora_share.ConfigErrors) as e:
        lora_share.validate(p)
    problems = e.value.problems
    assert (
        "adapters[0]: big: rank 32 is above lora_envelope.max_rank (16): raise max_rank, or leave the adapter "
        "out" in problems
    )
    assert any(s.startswith("adapters[0]: big: LoRA on up_proj, outside lora_envelope.targets") for s in problems)
    assert any(s.startswith("adapters[1]: syn: rank 20 is above lora_envelope.max_rank (16)") for s in problems)
    r = run_cli("validate", p)
    assert r.returncode == 2 and "rank 32 is above lora_envelope.max_rank" in r.stderr


def _key_paths(cls, prefix: str = "") -> list[str]:
    """Every key a config can have, from config.py's dataclasses themselves (``a.b``; ``a[].b`` in lists)."""
    import dataclasses
    import typing

    hints, paths = typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        path = f"{prefix}{f.name}"
        paths.append(path)
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        inner = typing.get_args(args[0])
        for candidate, sub in ((args[0], path + "."), (inner[0] if inner else None, path + "[].")):
            if dataclasses.is_dataclass(candidate):
                paths += _key_paths(candidate, sub)
    return paths


def test_config_md_shows_every_key():
    """docs/config.md, the reference of every key, shows each key config.py reads (as `key:` in its "The
    keys" section), so a key added to the code without its documentation fails here."""
    from lora_share.config import BuildConfig

    text = (REPO / "docs" / "config.md").read_text()
    section = text[text.index("## The keys") : text.index("\n## ", text.index("## The keys") + 1)]
    paths = _key_paths(BuildConfig)
    assert {"foundation.tokenizer", "programs[].pt2", "foundation.synthetic.sliding_window"} <= set(paths)
    missing = [p for p in paths if f"{p.rsplit('.', 1)[-1].removesuffix('[]')}:" not in section]
    assert not missing, f"docs/config.md does not show: {missing}"


def test_names_outside_the_safe_set_are_refused_with_the_rule(tmp_path):
    """Adapter names become file stems and URL path parts: letters, digits, '_', '.', '-' only, a letter
    or digit first; every other name is refused with that rule, and a name that keeps it is taken."""
    bad = ["bad name", ".hidden", "a/b", "x:y", "tab\there", "end\n"]
    adapters = [
        {"name": n, "synthetic": {"rank": 2, "alpha": 4, "target_modules": ["q_proj"], "seed": i}}
        for i, n in enumerate([*bad, "ok.name-1_x"])
    ]
    synthetic = {"dim": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "hidden_dim": 32, "vocab_size": 32}
    p = _write(tmp_path, {"foundation": {"synthetic": synthetic}, "adapters": adapters})
    with pytest.raises(lora_share.ConfigErrors) as e:
        lora_share.validate(p)
    rule = "must be letters, digits, '_', '.' or '-', starting with a letter or digit"
    assert e.value.problems == [
        f"adapters[{i}].name: {n!r} {rule} (names become file names and URL path parts)" for i, n in enumerate(bad)
    ]
